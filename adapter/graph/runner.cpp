#include "adapter/graph/runner.h"

#include <array>
#include <atomic>

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "adapter/graph/graph.h"
#include "common/error.h"
#include "sim/config/core_taker.h"
#include "sim/verifier/verifier.h"

namespace npusim::graph {
namespace {

// Device memory below this stays unused (the buffer contract keeps address 0's neighbourhood
// free; the command line's arena starts here too).
constexpr uint64_t kFirstAddress = 0x10000;
constexpr uint64_t kRegionAlign = 4096;

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// The config text without comment lines (they name the file it was loaded from).
std::string config_keys(const std::string& yaml) {
  std::istringstream in(yaml);
  std::string line, out;
  while (std::getline(in, line))
    if (line.rfind('#', 0) != 0) out += line + "\n";
  return out;
}

}  // namespace

ChipConfig model_chip(const OmModel& m) {
  char path[] = "/tmp/npusim-om-chip-XXXXXX.yaml";
  const int fd = mkstemps(path, 5);
  if (fd < 0) throw Error("cannot create a temporary file for the model's chip config");
  close(fd);
  {
    std::ofstream out(path);
    out << m.chip_yaml;
  }
  try {
    ChipConfig cfg = load_chip_config(path);
    std::remove(path);
    return cfg;
  } catch (...) {
    std::remove(path);
    throw;
  }
}

void check_model_chip(const OmModel& m, const ChipConfig& cfg, const std::string& source) {
  if (cfg.name != m.chip_name)
    throw Error(
        fmt::format("{} was compiled for chip '{}', not '{}' (compile it again with "
                    "--chip {})",
                    source, m.chip_name, cfg.name, cfg.name));
  if (config_keys(dump_chip_config_yaml(cfg)) != config_keys(m.chip_yaml))
    throw Error(
        fmt::format("{} was compiled for another configuration of chip '{}' (a key "
                    "differs: compare `npusim config` with the model's)",
                    source, cfg.name));
}

OfflineRunner::OfflineRunner(const OmModel& m, Simulator& sim, const std::string& source,
                             RegionBases bases)
    : m_model(m), m_sim(sim), m_source(source) {
  check_model_chip(m, sim.config(), source);
  for (const isa::Program& p : m.kernels) isa::verify_or_throw(p, sim.config());
  if (bases.constant == 0 && bases.activation == 0)
    bases = {kFirstAddress, align_up(kFirstAddress + m.constants.size(), kRegionAlign)};
  if (bases.constant % kRegionAlign != 0 || bases.activation % kRegionAlign != 0 ||
      bases.constant < kFirstAddress || bases.activation < kFirstAddress)
    throw Error(
        fmt::format("{}: region bases {:#x} (constants), {:#x} (activations): each a "
                    "multiple of {} from {:#x} on",
                    source, bases.constant, bases.activation, kRegionAlign, kFirstAddress));
  if (!m.constants.empty() && m.activation_bytes > 0 &&
      bases.constant < bases.activation + m.activation_bytes &&
      bases.activation < bases.constant + m.constants.size())
    throw Error(fmt::format(
        "{}: the constant region at {:#x} ({} bytes) overlaps the activation "
        "region at {:#x} ({} bytes)",
        source, bases.constant, m.constants.size(), bases.activation, m.activation_bytes));
  m_constant_base = bases.constant;
  m_activation_base = bases.activation;
  m_end = std::max(m_constant_base + m.constants.size(), m_activation_base + m.activation_bytes);
  m_regions = [regions = std::array{std::pair{m_constant_base, uint64_t{m.constants.size()}},
                                    std::pair{m_activation_base, m.activation_bytes}}](
                  uint64_t addr, uint64_t* start, uint64_t* bytes) {
    for (const auto& [base, size] : regions)
      if (addr - base < size) {
        *start = base;
        *bytes = size;
        return true;
      }
    return false;
  };
  const uint64_t capacity = sim.gm().capacity();
  if (m_end + compiler::kDeviceBufferAlign > capacity)
    throw Error(fmt::format(
        "{}: needs {} bytes of device memory (constants {}, activations {}), "
        "chip {} has {}",
        source, m_end, m.constants.size(), m.activation_bytes, sim.config().name, capacity));
  if (!m.constants.empty())
    sim.copy_host_to_device(m_constant_base, m.constants.data(), m.constants.size());
  for (const Task& t : m.init_tasks) launch(t);
}

uint64_t OfflineRunner::address(Region r, uint64_t offset) const {
  return (r == Region::kConstant ? m_constant_base : m_activation_base) + offset;
}

namespace {

// A buffer's byte range, the two regions apart.
struct Extent {
  Region region;
  uint64_t begin, end;
  bool overlaps(const Extent& o) const {
    return region == o.region && begin < o.end && o.begin < end;
  }
};

}  // namespace

TaskGroups concurrent_groups(const OmModel& m, const ChipConfig& cfg) {
  TaskGroups out;
  CoreTaker cores(cfg);
  std::vector<Extent> reads, writes;  // the current group's
  bool open = false;                  // the current group takes more tasks
  const auto close = [&] {
    cores.clear();
    reads.clear();
    writes.clear();
  };
  const auto start = [&] {
    out.groups.emplace_back();
    out.cores.emplace_back();
  };
  for (size_t i = 0; i < m.tasks.size(); ++i) {
    const Task& t = m.tasks[i];
    const isa::Program& p = m.kernels.at(size_t(t.kernel));
    if (t.buffers.empty() || !cores.fits_alone(p, t.block_dim)) {  // a group alone
      close();
      start();
      out.groups.back().push_back(i);
      out.cores.back().emplace_back();  // Simulator::run: every core
      open = false;
      continue;
    }
    std::vector<Extent> r, w;
    for (const TaskBuffer& b : t.buffers)
      (b.written ? w : r).push_back({b.region, b.offset, b.offset + b.bytes});
    const auto any_overlap = [](const std::vector<Extent>& a, const std::vector<Extent>& b) {
      for (const Extent& x : a)
        for (const Extent& y : b)
          if (x.overlaps(y)) return true;
      return false;
    };
    std::vector<std::string> names;
    const bool joins = open && !any_overlap(w, reads) && !any_overlap(w, writes) &&
                       !any_overlap(r, writes) && cores.take(p, t.block_dim, &names);
    if (!joins) {
      close();
      start();
      cores.take(p, t.block_dim, &names);  // fits alone: checked above
      open = true;
    }
    out.groups.back().push_back(i);
    out.cores.back().push_back(std::move(names));
    reads.insert(reads.end(), r.begin(), r.end());
    writes.insert(writes.end(), w.begin(), w.end());
  }
  return out;
}

void OfflineRunner::set_concurrent(bool on) {
  m_concurrent = on;
  if (on && m_groups.groups.empty()) m_groups = concurrent_groups(m_model, m_sim.config());
}

KernelLaunch OfflineRunner::kernel_launch(const Task& t, uint64_t run) const {
  KernelLaunch kl;
  kl.l2_run = run;
  // The regions are the model's allocations: its lines are filed by region, not at their
  // device addresses.
  kl.gm_blocks = m_regions;
  for (const TaskBuffer& b : t.buffers)
    kl.planned_blocks.emplace_back(address(b.region, b.offset), b.bytes);
  kl.program = &m_model.kernels[t.kernel];
  kl.block_dim = t.block_dim;
  kl.counter_tree = m_counter_trees;
  for (const ArgValue& a : t.args)
    kl.args.push_back(a.scalar ? a.value : address(a.region, a.value));
  return kl;
}

void OfflineRunner::task_fault(const Task& t, const KernelResult& r) const {
  throw Error(fmt::format("{}: node '{}' ({}), kernel {}: {}", m_source, t.node, t.op_type,
                          m_model.kernels[size_t(t.kernel)].name, r.error));
}

KernelResult OfflineRunner::launch(const Task& t, uint64_t run) {
  KernelResult r = m_sim.run(kernel_launch(t, run));
  m_replayed += r.replayed;
  if (!r.ok) task_fault(t, r);
  return r;
}

std::vector<NpyArray> OfflineRunner::run(const std::vector<NpyArray>& inputs,
                                         const std::vector<std::string>& labels,
                                         std::vector<TaskRun>* runs) {
  if (inputs.size() != m_model.inputs.size())
    throw Error(fmt::format("{} takes {} input(s), {} given", m_source, m_model.inputs.size(),
                            inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const IoBinding& b = m_model.inputs[i];
    const NpyArray& a = inputs[i];
    if (a.dtype != npy_descr(b.desc.dtype) || a.shape != b.desc.shape)
      throw Error(fmt::format("input '{}' ({}): expected {} (numpy {}{}), got numpy {}{}", b.name,
                              labels.at(i), b.desc.str(), npy_descr(b.desc.dtype),
                              compiler::shape_str(b.desc.shape), a.dtype,
                              compiler::shape_str(a.shape)));
    if (!a.data.empty())
      m_sim.copy_host_to_device(address(b.region, b.offset), a.data.data(), a.data.size());
  }
  // The model's tasks are one graph run (memory.l2.keep_within_graph_run keeps the L2 through
  // them); the init tasks, at construction, are none.
  static std::atomic<uint64_t> last_run{0};
  const uint64_t run = ++last_run;
  if (!m_concurrent) {
    for (size_t i = 0; i < m_model.tasks.size(); ++i) {
      const Task& t = m_model.tasks[i];
      KernelResult r = launch(t, run);
      if (runs) runs->push_back({&t, std::move(r), i});
    }
  } else {
    for (size_t g = 0; g < m_groups.groups.size(); ++g) {
      const std::vector<size_t>& group = m_groups.groups[g];
      if (group.size() == 1) {
        const Task& t = m_model.tasks[group[0]];
        KernelResult r = launch(t, run);
        if (runs) runs->push_back({&t, std::move(r), g});
        continue;
      }
      std::vector<ConcurrentLaunch> launches;
      for (size_t j = 0; j < group.size(); ++j)
        launches.push_back({kernel_launch(m_model.tasks[group[j]], run), m_groups.cores[g][j]});
      ConcurrentResult cr = m_sim.run_concurrent(launches);
      for (size_t j = 0; j < group.size(); ++j)
        if (!cr.launches[j].ok) task_fault(m_model.tasks[group[j]], cr.launches[j]);
      if (runs)
        for (size_t j = 0; j < group.size(); ++j)
          runs->push_back({&m_model.tasks[group[j]], std::move(cr.launches[j]), g});
    }
  }
  std::vector<NpyArray> outputs;
  for (const IoBinding& b : m_model.outputs) {
    NpyArray a;
    a.dtype = npy_descr(b.desc.dtype);
    a.shape = b.desc.shape;
    a.data.resize(b.desc.bytes());
    if (!a.data.empty())
      m_sim.copy_device_to_host(a.data.data(), address(b.region, b.offset), a.data.size());
    outputs.push_back(std::move(a));
  }
  return outputs;
}

}  // namespace npusim::graph
