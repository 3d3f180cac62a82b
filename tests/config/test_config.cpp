// Chip configurations: every preset loads and matches the reference figures
// (../shared/reference/ascend-architecture.md), overrides and `extends` change exactly the
// keys they name, every error names the file and the key, and the resolved dump reads back to an
// equal config.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>

#include <yaml-cpp/yaml.h>

#include "common/error.h"
#include "sim/config/chip_config.h"
#include "tests/common/test_chip.h"

using namespace npusim;
using isa::Buf;
using isa::CoreKind;
using isa::Pipe;
namespace fs = std::filesystem;

namespace {

// A fresh directory for the files one test writes, removed with everything in it at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "npusim_cfg_XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path operator/(const std::string& name) const { return path / name; }
};

std::string write_file(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
  return path.string();
}

// Runs f, which must throw ConfigError, and returns the message.
template <typename F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError thrown");
  return "";
}

// Peak dense fp16 rate: cube cores x m*k*n MACs x 2 FLOP x clock.
double peak_fp16_flops(const ChipConfig& c) {
  const CoreKindConfig* cube = c.core_kind(c.split ? CoreKind::AIC : CoreKind::AICORE);
  REQUIRE(cube != nullptr);
  return cube->count * double(c.cube_m * c.cube_k * c.cube_n) * 2 * c.clock_mhz * 1e6;
}

// Field-by-field equality of two configs (source_file excepted: it says where each came from).
void check_same(const ChipConfig& a, const ChipConfig& b) {
  CHECK(a.name == b.name);
  CHECK(a.clock_mhz == b.clock_mhz);
  CHECK(a.split == b.split);
  REQUIRE(a.core_kinds.size() == b.core_kinds.size());
  for (size_t i = 0; i < a.core_kinds.size(); ++i) {
    CHECK(a.core_kinds[i].kind == b.core_kinds[i].kind);
    CHECK(a.core_kinds[i].count == b.core_kinds[i].count);
    CHECK(a.core_kinds[i].pipes == b.core_kinds[i].pipes);
    CHECK(a.core_kinds[i].buffer_bytes == b.core_kinds[i].buffer_bytes);
  }
  CHECK(a.aiv_per_aic == b.aiv_per_aic);
  CHECK(a.align_bytes == b.align_bytes);
  CHECK(a.ub_banks == b.ub_banks);
  CHECK(a.ub_bank_groups == b.ub_bank_groups);
  CHECK(a.ub_bank_width_bytes == b.ub_bank_width_bytes);
  CHECK(a.cube_m == b.cube_m);
  CHECK(a.cube_k == b.cube_k);
  CHECK(a.cube_n == b.cube_n);
  CHECK(a.cube_int8_k == b.cube_int8_k);
  CHECK(a.cube_fp32_rate_divisor == b.cube_fp32_rate_divisor);
  CHECK(a.cube_bf16 == b.cube_bf16);
  CHECK(a.cube_latency_cycles == b.cube_latency_cycles);
  CHECK(a.vector_bytes_per_cycle == b.vector_bytes_per_cycle);
  CHECK(a.vector_latency_cycles == b.vector_latency_cycles);
  CHECK(a.vector_reduce_factor == b.vector_reduce_factor);
  CHECK(a.vector_transcendental_factor == b.vector_transcendental_factor);
  CHECK(a.vector_add_relu_conv == b.vector_add_relu_conv);
  CHECK(a.vector_multiply_accumulate == b.vector_multiply_accumulate);
  CHECK(a.vector_bf16_arithmetic == b.vector_bf16_arithmetic);
  CHECK(a.vector_bf16_conversion == b.vector_bf16_conversion);
  CHECK(a.scalar_cycles_per_insn == b.scalar_cycles_per_insn);
  CHECK(a.issue_queue_depth == b.issue_queue_depth);
  CHECK(a.path_bytes_per_cycle == b.path_bytes_per_cycle);
  CHECK(a.path_latency_cycles == b.path_latency_cycles);
  CHECK(a.hbm_bytes == b.hbm_bytes);
  CHECK(a.hbm_gbps == b.hbm_gbps);
  CHECK(a.hbm_efficiency == b.hbm_efficiency);
  CHECK(a.hbm_turnaround_loss == b.hbm_turnaround_loss);
  CHECK(a.l2_bytes == b.l2_bytes);
  CHECK(a.l2_gbps == b.l2_gbps);
  CHECK(a.l2_line_bytes == b.l2_line_bytes);
  CHECK(a.l2_ways == b.l2_ways);
  CHECK(a.hbm_latency_cycles == b.hbm_latency_cycles);
  CHECK(a.l2_latency_cycles == b.l2_latency_cycles);
  CHECK(a.l2_read_bytes_per_cycle == b.l2_read_bytes_per_cycle);
  CHECK(a.l2_write_bytes_per_cycle == b.l2_write_bytes_per_cycle);
  CHECK(a.l2_ub_write_bytes_per_cycle == b.l2_ub_write_bytes_per_cycle);
  CHECK(a.l2_keep_across_launches == b.l2_keep_across_launches);
  CHECK(a.l2_keep_within_graph_run == b.l2_keep_within_graph_run);
  CHECK(a.l2_write_back == b.l2_write_back);
  CHECK(a.l2_write_back_waits == b.l2_write_back_waits);
  CHECK(a.l2_line_read_bytes_per_cycle == b.l2_line_read_bytes_per_cycle);
  CHECK(a.l2_read_granule_bytes == b.l2_read_granule_bytes);
  CHECK(a.hdc_gbps == b.hdc_gbps);
  CHECK(a.hdc_latency_us == b.hdc_latency_us);
  CHECK(a.task_dispatch_us == b.task_dispatch_us);
  CHECK(a.task_block_start_cycles == b.task_block_start_cycles);
  CHECK(a.task_done_us == b.task_done_us);
  CHECK(a.host_op_dispatch_us == b.host_op_dispatch_us);
  CHECK(a.host_graph_dispatch_us == b.host_graph_dispatch_us);
  CHECK(a.ai_cpu_cores == b.ai_cpu_cores);
  CHECK(a.ai_cpu_clock_mhz == b.ai_cpu_clock_mhz);
  CHECK(a.ai_cpu_task_us == b.ai_cpu_task_us);
  CHECK(a.ai_cpu_gen_mask_cycles_per_128_bits == b.ai_cpu_gen_mask_cycles_per_128_bits);
  CHECK(a.flag_ids == b.flag_ids);
  CHECK(a.cross_core_flag_ids == b.cross_core_flag_ids);
  CHECK(a.cross_core_max_pending == b.cross_core_max_pending);
  CHECK(a.set_flag_holds_pipe == b.set_flag_holds_pipe);
}

// Writes the dump to a file and loads it back.
ChipConfig reload_dump(const ChipConfig& c) {
  TempDir dir;
  return load_chip_config(write_file(dir / "resolved.yaml", dump_chip_config_yaml(c)));
}

const std::vector<std::string> kPresets = {"310p", "910", "910b", "tiny", "tiny_coupled"};

}  // namespace

TEST_CASE("the preset directory holds exactly the known presets") {
  CHECK(list_chip_presets() == kPresets);
}

TEST_CASE("every preset loads and is self-consistent") {
  for (const auto& name : kPresets) {
    INFO("preset " << name);
    ChipConfig c = load_chip_config(name);
    CHECK(c.name == name);
    CHECK(c.source_file == (fs::path(chip_config_dir()) / (name + ".yaml")).string());
    CHECK(c.core_kinds.size() == (c.split ? 2u : 1u));
    for (const auto& k : c.core_kinds) {
      CHECK(k.count > 0);
      CHECK(k.has(Pipe::S));
      for (const auto& [buf, bytes] : k.buffer_bytes) {
        REQUIRE(c.align_bytes.count(buf));
        CHECK(bytes % c.align_bytes.at(buf) == 0);
      }
    }
    // Every path joins GM or buffers of one core kind.
    for (const auto& [path, rate] : c.path_bytes_per_cycle) {
      CHECK(rate > 0);
      bool ok = false;
      for (const auto& k : c.core_kinds)
        ok |= (path.first == Buf::GM || k.has(path.first)) &&
              (path.second == Buf::GM || k.has(path.second));
      CHECK(ok);
    }
    CHECK(c.l2_bytes <= c.hbm_bytes);
    CHECK(c.issue_queue_depth >= 1);
    // Mix groups: on split chips each cube core with aiv_per_aic vector cores; none on coupled.
    if (c.split)
      CHECK(c.aiv_per_aic * c.core_kind(CoreKind::AIC)->count ==
            c.core_kind(CoreKind::AIV)->count);
    else
      CHECK(c.aiv_per_aic == 0);
  }
}

TEST_CASE("910b: split 24 aic + 48 aiv at 1850 MHz, 363.7 TFLOPS fp16") {
  ChipConfig c = load_chip_config("910b");
  REQUIRE(c.split);
  const CoreKindConfig* aic = c.core_kind(CoreKind::AIC);
  const CoreKindConfig* aiv = c.core_kind(CoreKind::AIV);
  REQUIRE(aic);
  REQUIRE(aiv);
  CHECK(aic->count == 24);
  CHECK(aiv->count == 48);
  CHECK(c.aiv_per_aic == 2);
  CHECK(aic->pipes == std::vector<Pipe>{Pipe::S, Pipe::MTE1, Pipe::MTE2, Pipe::M, Pipe::FIX});
  CHECK(aiv->pipes == std::vector<Pipe>{Pipe::S, Pipe::MTE2, Pipe::MTE3, Pipe::V});
  CHECK(aic->buffer_bytes == std::map<Buf, uint64_t>{{Buf::L1, 512 * 1024},
                                                     {Buf::L0A, 64 * 1024},
                                                     {Buf::L0B, 64 * 1024},
                                                     {Buf::L0C, 128 * 1024},
                                                     {Buf::BT, 1024},
                                                     {Buf::FB, 7 * 1024}});
  CHECK(aiv->buffer_bytes == std::map<Buf, uint64_t>{{Buf::UB, 192 * 1024}});
  // UB: 48 banks x 128 rows x 32 B = 192 KiB (reference, D S2).
  CHECK(uint64_t(c.ub_banks) * 128 * c.ub_bank_width_bytes == aiv->capacity(Buf::UB));
  // Reference: 24 x 4096 MAC x 2 x 1.85 GHz = 363.7 TFLOPS.
  CHECK(peak_fp16_flops(c) == Approx(363.7e12).epsilon(0.001));
  // int8: 2x the fp16 rate (16x32x16).
  CHECK(c.cube_int8_k == 2 * c.cube_k);
  // Legal 910B paths (reference, D S1) and no L1<->UB path between the split cores.
  for (auto [s, d] : {std::pair{Buf::GM, Buf::UB}, {Buf::UB, Buf::GM}, {Buf::GM, Buf::L1},
                      {Buf::L1, Buf::L0A}, {Buf::L1, Buf::L0B}, {Buf::L1, Buf::BT},
                      {Buf::L1, Buf::FB}, {Buf::L0C, Buf::GM}, {Buf::L0C, Buf::L1}})
    CHECK(c.has_path(s, d));
  CHECK_FALSE(c.has_path(Buf::UB, Buf::L1));
  CHECK_FALSE(c.has_path(Buf::L1, Buf::UB));
  CHECK(c.path_rate(Buf::GM, Buf::L1) == 32);
  CHECK(c.path_rate(Buf::L1, Buf::L0A) == 512);
  CHECK(c.path_rate(Buf::L1, Buf::L0B) == 256);
  CHECK(c.path_rate(Buf::UB, Buf::GM) == 64);
  CHECK(c.hbm_bytes == 64ull << 30);
  CHECK(c.l2_bytes == 192ull << 20);
  // 1800 GB/s at 1850 MHz = 1800e9 / 1850e6 bytes per cycle.
  CHECK(c.hbm_bytes_per_cycle() == Approx(1800e9 / 1850e6));
  CHECK(c.flag_ids == 8);
  CHECK(c.cross_core_flag_ids == 11);
  CHECK(c.cross_core_max_pending == 15);
}

TEST_CASE("910 and 310p: coupled cores near their published peak rates") {
  ChipConfig c910 = load_chip_config("910");
  CHECK_FALSE(c910.split);
  REQUIRE(c910.core_kind(CoreKind::AICORE));
  CHECK(c910.core_kind(CoreKind::AICORE)->count == 32);
  // Reference: 256 TFLOPS fp16 (D S7); the clock is the estimate derived from it.
  CHECK(peak_fp16_flops(c910) == Approx(256e12).epsilon(0.03));
  CHECK(c910.flag_ids == 4);
  CHECK(c910.cube_fp32_rate_divisor == 0);

  ChipConfig c310 = load_chip_config("310p");
  CHECK_FALSE(c310.split);
  REQUIRE(c310.core_kind(CoreKind::AICORE));
  CHECK(c310.core_kind(CoreKind::AICORE)->count == 8);
  // Reference: ~70 TFLOPS fp16 (E).
  CHECK(peak_fp16_flops(c310) == Approx(70e12).epsilon(0.02));
  for (const ChipConfig* c : {&c910, &c310}) {
    INFO(c->name);
    const CoreKindConfig& k = *c->core_kind(CoreKind::AICORE);
    CHECK(k.capacity(Buf::L1) == 1u << 20);
    CHECK(k.capacity(Buf::L0C) == 256u << 10);
    CHECK(k.capacity(Buf::UB) == 256u << 10);
    CHECK_FALSE(k.has(Buf::BT));
    CHECK(c->has_path(Buf::L0C, Buf::UB));  // L0C leaves through the UB (D S2)
    CHECK_FALSE(c->has_path(Buf::L0C, Buf::GM));
    CHECK(c->cross_core_flag_ids == 0);
  }
}

TEST_CASE("tiny: the 910b core with few cores and small memories") {
  ChipConfig t = load_chip_config("tiny");
  ChipConfig b = load_chip_config("910b");
  CHECK(t.name == "tiny");
  CHECK(t.core_kind(CoreKind::AIC)->count == 2);
  CHECK(t.core_kind(CoreKind::AIV)->count == 4);
  CHECK(t.hbm_bytes == 1ull << 30);
  CHECK(t.l2_bytes == 8ull << 20);
  // Everything else is the 910b's: make the differing fields equal and compare all.
  t.name = b.name;
  t.core_kinds[0].count = b.core_kinds[0].count;
  t.core_kinds[1].count = b.core_kinds[1].count;
  t.hbm_bytes = b.hbm_bytes;
  t.l2_bytes = b.l2_bytes;
  // The tests' memory timing: the peak HBM rate with no read/write turnaround loss, a
  // write-through L2 cold at every launch, one L2 write port for every writer and concurrent
  // reads of one line not serialised (910b models silicon's sustained rate, its turnarounds,
  // write-back L2, the UB's own L2 write rate and same-line serialisation).
  CHECK_FALSE(t.l2_keep_within_graph_run);
  CHECK_FALSE(b.l2_keep_within_graph_run);
  CHECK(t.hbm_efficiency == 1.0);
  CHECK(t.hbm_turnaround_loss == 0.0);
  CHECK_FALSE(t.l2_write_back);
  CHECK(t.l2_ub_write_bytes_per_cycle == 0.0);
  CHECK(b.hbm_turnaround_loss > 0.0);
  CHECK(b.l2_ub_write_bytes_per_cycle == 64);
  CHECK(t.l2_line_read_bytes_per_cycle == 0.0);
  CHECK(b.l2_line_read_bytes_per_cycle > 0.0);
  t.hbm_efficiency = b.hbm_efficiency;
  t.hbm_turnaround_loss = b.hbm_turnaround_loss;
  t.l2_write_back = b.l2_write_back;
  t.l2_ub_write_bytes_per_cycle = b.l2_ub_write_bytes_per_cycle;
  t.l2_line_read_bytes_per_cycle = b.l2_line_read_bytes_per_cycle;
  check_same(t, b);
}

TEST_CASE("command-line overrides replace one key each") {
  const ChipConfig base = load_chip_config("910b");
  SECTION("scalar") {
    ChipConfig c = load_chip_config("910b", {"clock_mhz=1000", "cube.bf16=false"});
    CHECK(c.clock_mhz == 1000);
    CHECK_FALSE(c.cube_bf16);
    CHECK(c.cube_m == base.cube_m);
  }
  SECTION("size with a unit, and later overrides win") {
    ChipConfig c = load_chip_config("910b", {"memory.l2.bytes=16 MiB", "memory.l2.bytes=32MiB"});
    CHECK(c.l2_bytes == 32ull << 20);
  }
  SECTION("list") {
    ChipConfig c = load_chip_config("910b", {"cores.aiv.pipes=[v, s, mte2, mte3]"});
    CHECK(c.core_kind(CoreKind::AIV)->pipes ==
          std::vector<Pipe>{Pipe::S, Pipe::MTE2, Pipe::MTE3, Pipe::V});
  }
  SECTION("a map, a nested key, and deleting a key with ~") {
    ChipConfig c = load_chip_config(
        "910b", {"paths.gm->l1={bytes_per_cycle: 64, latency_cycles: 3}",
                 "paths.gm->ub.latency_cycles=7", "paths.l1->fb=~", "cores.aic.buffers.fb=~",
                 "alignment.fb=~"});
    CHECK(c.path_rate(Buf::GM, Buf::L1) == 64);
    CHECK(c.path_latency(Buf::GM, Buf::L1) == 3);
    CHECK(c.path_rate(Buf::GM, Buf::UB) == base.path_rate(Buf::GM, Buf::UB));
    CHECK(c.path_latency(Buf::GM, Buf::UB) == 7);
    CHECK_FALSE(c.has_path(Buf::L1, Buf::FB));
    CHECK_FALSE(c.core_kind(CoreKind::AIC)->has(Buf::FB));
  }
}

TEST_CASE("a user file extends a preset and changes a few keys") {
  TempDir dir;
  std::string file = write_file(dir / "my_chip.yaml",
                                "extends: 910b\n"
                                "clock_mhz: 1500\n"
                                "cores:\n"
                                "  aic: {count: 20}\n"
                                "  aiv: {count: 40}\n"
                                "paths:\n"
                                "  l0c->l1: ~\n");
  ChipConfig c = load_chip_config(file);
  ChipConfig b = load_chip_config("910b");
  CHECK(c.name == "my_chip");  // the name is the file's own, not the base's
  CHECK(c.source_file == file);
  CHECK(c.clock_mhz == 1500);
  CHECK(c.core_kind(CoreKind::AIC)->count == 20);
  CHECK(c.core_kind(CoreKind::AIV)->count == 40);
  CHECK(c.core_kind(CoreKind::AIC)->buffer_bytes == b.core_kind(CoreKind::AIC)->buffer_bytes);
  CHECK_FALSE(c.has_path(Buf::L0C, Buf::L1));
  CHECK(c.path_bytes_per_cycle.size() == b.path_bytes_per_cycle.size() - 1);
  CHECK(c.hbm_bytes == b.hbm_bytes);

  // A file extending a file by relative path, plus overrides on top.
  std::string second = write_file(dir / "second.yaml",
                                  "extends: my_chip.yaml\nname: second\nhdc: {gbps: 16}\n");
  ChipConfig s = load_chip_config(second, {"hdc.latency_us=1.5"});
  CHECK(s.name == "second");
  CHECK(s.clock_mhz == 1500);
  CHECK(s.hdc_gbps == 16);
  CHECK(s.hdc_latency_us == 1.5);
}

TEST_CASE("chip_config_dir follows NPUSIM_CONFIG_DIR") {
  const char* old = std::getenv("NPUSIM_CONFIG_DIR");
  const std::string saved = old ? old : "";
  const std::string real_dir = chip_config_dir();
  TempDir dir;
  fs::copy_file(fs::path(real_dir) / "910b.yaml", dir / "mine.yaml");
  setenv("NPUSIM_CONFIG_DIR", dir.path.c_str(), 1);
  CHECK(chip_config_dir() == dir.path.string());
  CHECK(list_chip_presets() == std::vector<std::string>{"mine"});
  CHECK(load_chip_config("mine").name == "910b");  // the file says name: 910b
  if (old)
    setenv("NPUSIM_CONFIG_DIR", saved.c_str(), 1);
  else
    unsetenv("NPUSIM_CONFIG_DIR");
}

TEST_CASE("errors name the file and the key") {
  TempDir dir;
  const std::string preset_file = (fs::path(chip_config_dir()) / "910b.yaml").string();
  auto contains = [](const std::string& msg, std::initializer_list<const char*> parts) {
    INFO(msg);
    for (const char* p : parts) CHECK(msg.find(p) != std::string::npos);
  };

  SECTION("unknown preset lists the available ones") {
    contains(config_error([] { load_chip_config("910c"); }), {"910c", "310p, 910, 910b, tiny"});
    contains(config_error([&] { load_chip_config((dir / "absent.yaml").string()); }),
             {"absent.yaml", "not found", "910b"});
    // A name longer than the OS allows (NAME_MAX, 255 on Linux) is a config error too, not a
    // filesystem exception (found by fuzz_config; corpus file chip_name_too_long).
    const std::string long_name(300, 'x');
    contains(config_error([&] { load_chip_config(long_name); }), {"unknown chip", "xxxx"});
    contains(config_error([&] { load_chip_config((dir / (long_name + ".yaml")).string()); }),
             {"not found", "xxxx"});
  }
  SECTION("YAML syntax error: file and line") {
    std::string f = write_file(dir / "bad.yaml", "name: x\nclock_mhz: 1000\ncores: [a, b\n");
    contains(config_error([&] { load_chip_config(f); }), {"bad.yaml:", "YAML syntax error"});
    std::string g = write_file(dir / "dup.yaml", "extends: 910b\nclock_mhz: 1\nclock_mhz: 2\n");
    contains(config_error([&] { load_chip_config(g); }), {"dup.yaml:3", "'clock_mhz'", "twice"});
  }
  SECTION("unknown key: file, line, full key and the nearest known key") {
    std::string f = write_file(dir / "typo.yaml", "extends: 910b\nmemory:\n  l2:\n    wayz: 8\n");
    contains(config_error([&] { load_chip_config(f); }),
             {"typo.yaml:4", "unknown key 'memory.l2.wayz'", "did you mean 'memory.l2.ways'"});
    std::string g = write_file(dir / "typo2.yaml", "extends: 910b\nclock_mz: 1000\n");
    contains(config_error([&] { load_chip_config(g); }),
             {"typo2.yaml:2", "'clock_mz'", "did you mean 'clock_mhz'"});
    std::string h = write_file(dir / "typo3.yaml", "extends: 910b\ncube: 16\n");
    contains(config_error([&] { load_chip_config(h); }), {"typo3.yaml:2", "'cube'", "map"});
  }
  SECTION("override of a key that does not exist") {
    contains(config_error([] { load_chip_config("910b", {"cube.mm=4"}); }),
             {"910b.yaml", "cube.mm=4", "does not exist", "did you mean 'cube.m'"});
    contains(config_error([] { load_chip_config("910b", {"clock_mhz"}); }),
             {"910b.yaml", "'clock_mhz'", "dotted.key=value"});
  }
  SECTION("missing required key") {
    contains(config_error([] { load_chip_config("910b", {"memory.hbm.gbps=~"}); }),
             {preset_file.c_str(), "missing required key 'memory.hbm.gbps'"});
    std::string f = write_file(dir / "nosync.yaml", "extends: 910b\nsync: ~\n");
    contains(config_error([&] { load_chip_config(f); }),
             {"nosync.yaml", "missing required key 'sync.flag_ids'"});
  }
  SECTION("wrong type, negative and zero values") {
    contains(config_error([] { load_chip_config("910b", {"clock_mhz=fast"}); }),
             {"910b.yaml", "override 'clock_mhz=fast'", "key 'clock_mhz'", "number"});
    contains(config_error([] { load_chip_config("910b", {"cube.latency_cycles=-1"}); }),
             {"key 'cube.latency_cycles'", "'-1'"});
    contains(config_error([] { load_chip_config("910b", {"cores.aic.count=0"}); }),
             {"key 'cores.aic.count'", "'0'"});
    contains(config_error([] { load_chip_config("910b", {"cores.aic.count=2.5"}); }),
             {"key 'cores.aic.count'", "integer"});
    contains(config_error([] { load_chip_config("910b", {"memory.hbm.bytes=64 GB"}); }),
             {"key 'memory.hbm.bytes'", "KiB"});
    contains(config_error([] { load_chip_config("910b", {"cube.bf16=2"}); }),
             {"key 'cube.bf16'", "true or false"});
    contains(config_error([] { load_chip_config("910b", {"cores.aic.pipes=[s, mte9]"}); }),
             {"key 'cores.aic.pipes'", "mte9"});
    contains(config_error([] { load_chip_config("910b", {"cores.aic.pipes=s"}); }),
             {"key 'cores.aic.pipes'", "list"});
    std::string f = write_file(dir / "neg.yaml", "extends: tiny\nhdc:\n  gbps: -64\n");
    contains(config_error([&] { load_chip_config(f); }), {"neg.yaml:3", "key 'hdc.gbps'"});
  }
  SECTION("inconsistent values") {
    contains(config_error([] { load_chip_config("910b", {"cores.aiv=~"}); }),
             {"910b.yaml", "cores.aiv", "split"});
    contains(config_error([] { load_chip_config("910b", {"organisation=coupled"}); }),
             {"key 'cores.aic'", "coupled"});
    contains(config_error([] { load_chip_config("tiny", {"memory.l2.bytes=2 GiB"}); }),
             {"override 'memory.l2.bytes=2 GiB'", "key 'memory.l2.bytes'", "larger"});
    contains(config_error([] { load_chip_config("910b", {"issue_queue_depth=0"}); }),
             {"key 'issue_queue_depth'"});
    contains(config_error([] { load_chip_config("910b", {"cores.aiv.count=40"}); }),
             {"key 'cores.aiv.count'", "24 x 2"});
    contains(config_error([] { load_chip_config("910b", {"alignment.l0a=500"}); }),
             {"key 'alignment.l0a'", "power of two"});
    contains(config_error([] { load_chip_config("910b", {"cores.aic.buffers.l0c=~"}); }),
             {"key 'cores.aic.pipes'", "'m' needs buffer 'l0c'"});
    contains(config_error([] { load_chip_config("910", {"sync.flag_ids=17"}); }),
             {"910.yaml", "key 'sync.flag_ids'", "17"});
    std::string f = write_file(dir / "bt.yaml",
                               "extends: 310p\npaths:\n  l1->bt: {bytes_per_cycle: 64, "
                               "latency_cycles: 1}\n");
    contains(config_error([&] { load_chip_config(f); }),
             {"bt.yaml:3", "key 'paths.l1->bt'", "'bt'", "no core kind"});
    std::string g = write_file(dir / "ubl1.yaml",
                               "extends: 910b\npaths:\n  ub->l1: {bytes_per_cycle: 128, "
                               "latency_cycles: 1}\n");
    contains(config_error([&] { load_chip_config(g); }),
             {"ubl1.yaml:3", "key 'paths.ub->l1'", "no core kind has both"});
  }
  SECTION("an extends cycle") {
    write_file(dir / "a.yaml", "extends: b.yaml\n");
    std::string b = write_file(dir / "b.yaml", "extends: a.yaml\n");
    contains(config_error([&] { load_chip_config(b); }), {"b.yaml", "cycle"});
  }
}

TEST_CASE("the dump reads back to an equal config") {
  for (const auto& name : kPresets) {
    INFO("preset " << name);
    ChipConfig c = load_chip_config(name);
    check_same(reload_dump(c), c);
  }
  SECTION("with overrides applied") {
    ChipConfig c = load_chip_config(
        "910b", {"clock_mhz=1234.5", "hdc.latency_us=0.25", "memory.hbm.bytes=3000000000",
                 "paths.l1->l0a.bytes_per_cycle=333.3"});
    ChipConfig r = reload_dump(c);
    check_same(r, c);
    CHECK(r.hbm_bytes == 3000000000ull);
    CHECK(r.path_rate(Buf::L1, Buf::L0A) == 333.3);
  }
  SECTION("the HBM efficiency: dumped only when set, and read back") {
    CHECK(dump_chip_config_yaml(load_chip_config("tiny")).find("efficiency") == std::string::npos);
    ChipConfig c = load_chip_config("tiny", {"memory.hbm.efficiency=0.625"});
    CHECK(c.hbm_sustained_bytes_per_cycle() == Approx(c.hbm_bytes_per_cycle() * 0.625));
    ChipConfig r = reload_dump(c);
    check_same(r, c);
    CHECK(r.hbm_efficiency == 0.625);
  }
  SECTION("the HBM turnaround loss and the UB's L2 write rate: dumped only when set") {
    const std::string tiny = dump_chip_config_yaml(load_chip_config("tiny"));
    CHECK(tiny.find("turnaround_loss") == std::string::npos);
    CHECK(tiny.find("ub_write_bytes_per_cycle") == std::string::npos);
    ChipConfig c = load_chip_config(
        "tiny", {"memory.hbm.turnaround_loss=0.25", "memory.l2.ub_write_bytes_per_cycle=48"});
    ChipConfig r = reload_dump(c);
    check_same(r, c);
    CHECK(r.hbm_turnaround_loss == 0.25);
    CHECK(r.l2_ub_write_bytes_per_cycle == 48);
  }
  SECTION("the L2 kept within a graph run: dumped only when set (compiled caches keep their key)") {
    // The tiny chips keep it off, as the training presets do; the 310p keeps it on.
    CHECK(dump_chip_config_yaml(load_chip_config("tiny")).find("keep_within_graph_run") ==
          std::string::npos);
    CHECK(load_chip_config("310p").l2_keep_within_graph_run);
    for (const char* preset : {"910", "910b"})
      CHECK_FALSE(load_chip_config(preset).l2_keep_within_graph_run);
    ChipConfig c = load_chip_config("tiny", {"memory.l2.keep_within_graph_run=true"});
    ChipConfig r = reload_dump(c);
    check_same(r, c);
    CHECK(r.l2_keep_within_graph_run);
    CHECK_FALSE(r.l2_keep_across_launches);
  }
  SECTION("the L2's read granules: 0 in the presets, dumped only when set, a power of two at "
          "most the line") {
    for (const auto& name : kPresets) CHECK(load_chip_config(name).l2_read_granule_bytes == 0);
    CHECK(dump_chip_config_yaml(load_chip_config("910b")).find("read_granule_bytes") ==
          std::string::npos);
    ChipConfig c = load_chip_config("tiny", {"memory.l2.read_granule_bytes=128"});
    ChipConfig r = reload_dump(c);
    check_same(r, c);
    CHECK(r.l2_read_granule_bytes == 128);
    const std::string not_pow2 =
        config_error([] { load_chip_config("tiny", {"memory.l2.read_granule_bytes=96"}); });
    CHECK(not_pow2.find("memory.l2.read_granule_bytes") != std::string::npos);
    CHECK(not_pow2.find("power of two, got 96") != std::string::npos);
    const std::string too_big = config_error([] {
      load_chip_config("tiny", {"memory.l2.line_bytes=256", "memory.l2.read_granule_bytes=512"});
    });
    CHECK(too_big.find("memory.l2.read_granule_bytes") != std::string::npos);
  }
  SECTION("bf16 arithmetic on the vector unit: false on the presets (Ascend C's type tables), "
          "dumped only when false") {
    for (const auto& name : kPresets) CHECK_FALSE(load_chip_config(name).vector_bf16_arithmetic);
    ChipConfig c = load_chip_config("tiny", {"vector.bf16_arithmetic=true"});
    CHECK(c.vector_bf16_arithmetic);
    CHECK(dump_chip_config_yaml(c).find("bf16_arithmetic") == std::string::npos);
    check_same(reload_dump(c), c);
    CHECK(dump_chip_config_yaml(load_chip_config("910b")).find("bf16_arithmetic: false") !=
          std::string::npos);
  }
  SECTION("bf16 conversion on the vector unit: none on the 910 and 310P (and tiny_coupled, which "
          "extends the 310P), dumped only when false") {
    for (const char* name : {"910", "310p", "tiny_coupled"}) {
      ChipConfig c = load_chip_config(name);
      CHECK_FALSE(c.vector_bf16_conversion);
      CHECK(dump_chip_config_yaml(c).find("bf16_conversion: false") != std::string::npos);
      check_same(reload_dump(c), c);
    }
    for (const char* name : {"910b", "tiny"}) {
      ChipConfig c = load_chip_config(name);
      CHECK(c.vector_bf16_conversion);
      CHECK(dump_chip_config_yaml(c).find("bf16_conversion") == std::string::npos);
    }
  }
  SECTION("the unit-test chip built in code") {
    ChipConfig c = test::coupled_test_chip();
    check_same(reload_dump(c), c);
  }
}

TEST_CASE("docs/configs.md documents every key of the schema") {
  // ctest sets NPUSIM_SOURCE_DIR; run by hand, the presets' directory is <source>/configs/chips.
  const char* src = std::getenv("NPUSIM_SOURCE_DIR");
  fs::path root = src ? fs::path(src) : fs::path(chip_config_dir()).parent_path().parent_path();
  fs::path docs = root / "docs" / "configs.md";
  std::ifstream in(docs);
  REQUIRE(in);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Collect every dotted key of the resolved 910b and 910 (split and coupled) in schema form.
  std::set<std::string> keys;
  std::function<void(const YAML::Node&, const std::string&)> walk = [&](const YAML::Node& n,
                                                                        const std::string& pre) {
    for (const auto& kv : n) {
      std::string k = kv.first.Scalar();
      if (pre == "cores") k = "<kind>";
      if (pre == "cores.<kind>.buffers" || pre == "alignment") k = "<buf>";
      if (pre == "paths") k = "<src>-><dst>";
      std::string full = pre.empty() ? k : pre + "." + k;
      if (kv.second.IsMap())
        walk(kv.second, full);
      else
        keys.insert(full);
    }
  };
  walk(YAML::Load(dump_chip_config_yaml(load_chip_config("910b"))), "");
  walk(YAML::Load(dump_chip_config_yaml(load_chip_config("910"))), "");
  CHECK(keys.size() > 30);
  for (const auto& k : keys) {
    INFO("key " << k);
    CHECK(text.find("`" + k + "`") != std::string::npos);
  }
}

// The ranges of docs/configs.md, from the facts it states: simulated time is a uint64 count of
// picoseconds with 1000 ps a cycle; device addresses are 48 bits; a buffer holds at most 2^32
// bytes; a transfer of a whole buffer (or, over the host link, of the whole address space) must
// end within 2^52 cycles; latencies and per-instruction cycles at most 2^20; cost factors 2^10;
// mmad shapes 12 bits; a vector repeat 256 bytes; the clock's period at least 1 ps.
TEST_CASE("every numeric key is range-checked where it is loaded") {
  struct Case {
    std::vector<std::string> overrides;  // on tiny (1850 MHz, 1 GiB HBM, 8 MiB L2)
    const char* key;                     // the key the error names, "" if the config loads
  };
  const double slowest = std::ldexp(1.0, 32 - 52);  // bytes per cycle
  auto text = [](double v) {
    std::ostringstream o;
    o.precision(17);
    o << v;
    return o.str();
  };
  const std::string slowest_hbm_gbps = text(slowest * 1850 / 1e3 * 1.001);
  const std::string too_slow_hbm_gbps = text(slowest * 1850 / 1e3 * 0.999);
  const std::vector<Case> cases = {
      // Sizes against the 48-bit device address space (the issue's reproducers first).
      {{"memory.hbm.bytes=18446744073709551615"}, "memory.hbm.bytes"},
      {{"memory.hbm.bytes=1152921504606846976"}, "memory.hbm.bytes"},  // 2^60
      {{"memory.hbm.bytes=281474976710657"}, "memory.hbm.bytes"},      // 2^48 + 1
      {{"memory.hbm.bytes=256 TiB"}, ""},                              // 2^48
      {{"cores.aic.buffers.l1=8 GiB"}, "cores.aic.buffers.l1"},
      {{"cores.aic.buffers.l1=4 GiB"}, ""},
      {{"memory.hbm.bytes=8 GiB", "memory.l2.bytes=4 GiB"}, "memory.l2.bytes"},  // 2^23 lines
      {{"memory.hbm.bytes=8 GiB", "memory.l2.bytes=2 GiB"}, ""},                 // 2^22 lines
      {{"memory.l2.ways=4194305"}, "memory.l2.ways"},
      {{"memory.l2.line_bytes=2147483648"}, "memory.l2.line_bytes"},
      // Rates: the issue's reproducers, then the bounds.
      {{"memory.hbm.gbps=1e-300"}, "memory.hbm.gbps"},
      {{"memory.hbm.gbps=" + too_slow_hbm_gbps}, "memory.hbm.gbps"},
      {{"memory.hbm.gbps=" + slowest_hbm_gbps}, ""},
      {{"memory.hbm.efficiency=0"}, "memory.hbm.efficiency"},
      {{"memory.hbm.efficiency=1.01"}, "memory.hbm.efficiency"},
      {{"memory.hbm.efficiency=x"}, "memory.hbm.efficiency"},
      {{"memory.hbm.gbps=" + slowest_hbm_gbps, "memory.hbm.efficiency=0.5"},
       "memory.hbm.efficiency"},  // sustained below the slowest rate
      {{"memory.hbm.efficiency=1"}, ""},
      {{"memory.l2.gbps=1e-300"}, "memory.l2.gbps"},
      {{"memory.l2.core_read_bytes_per_cycle=1e-300"}, "memory.l2.core_read_bytes_per_cycle"},
      {{"memory.l2.core_write_bytes_per_cycle=1e-300"}, "memory.l2.core_write_bytes_per_cycle"},
      {{"paths.gm->ub.bytes_per_cycle=1e-300"}, "paths.gm->ub.bytes_per_cycle"},
      {{"paths.l1->l0a.bytes_per_cycle=1e-300"}, "paths.l1->l0a.bytes_per_cycle"},
      {{"paths.gm->ub.bytes_per_cycle=9e-7"}, "paths.gm->ub.bytes_per_cycle"},  // < 2^-20
      {{"paths.gm->ub.bytes_per_cycle=1e-6"}, ""},
      {{"paths.gm->ub.bytes_per_cycle=1e300"}, "paths.gm->ub.bytes_per_cycle"},
      {{"hdc.gbps=1e-300"}, "hdc.gbps"},
      {{"hdc.gbps=0.1"}, "hdc.gbps"},  // 0.054 bytes per cycle < 1/16
      {{"hdc.gbps=0.2"}, ""},
      {{"hdc.latency_us=1e300"}, "hdc.latency_us"},
      {{"hdc.latency_us=600"}, "hdc.latency_us"},  // 1.1e6 cycles > 2^20
      {{"hdc.latency_us=500"}, ""},
      // Task and host overheads: per launch at most 2^32 cycles; a block start at most 2^20.
      {{"task.dispatch_us=-1"}, "task.dispatch_us"},
      {{"task.dispatch_us=2400000"}, "task.dispatch_us"},  // 4.4e9 cycles > 2^32
      {{"task.dispatch_us=2000000"}, ""},
      {{"task.done_us=nan"}, "task.done_us"},
      {{"task.block_start_cycles=1048577"}, "task.block_start_cycles"},
      {{"task.block_start_cycles=0.5"}, "task.block_start_cycles"},
      {{"task.block_start_cycles=0"}, ""},
      {{"host.op_dispatch_us=x"}, "host.op_dispatch_us"},
      {{"host.graph_dispatch_us=-0.5"}, "host.graph_dispatch_us"},
      // The clock: a period of at least 1 ps; a slow clock fails through the rates it converts.
      {{"clock_mhz=1e300"}, "clock_mhz"},
      {{"clock_mhz=1e20"}, "clock_mhz"},
      {{"clock_mhz=1000001"}, "clock_mhz"},
      {{"clock_mhz=1000000", "hdc.latency_us=1"}, ""},
      {{"clock_mhz=1e-300"}, "memory.hbm.gbps"},
      // Latencies and per-instruction cycles: at most 2^20.
      {{"cube.latency_cycles=1048577"}, "cube.latency_cycles"},
      {{"cube.latency_cycles=1048576"}, ""},
      {{"vector.latency_cycles=1048577"}, "vector.latency_cycles"},
      {{"memory.hbm.latency_cycles=1048577"}, "memory.hbm.latency_cycles"},
      {{"memory.l2.latency_cycles=1048577"}, "memory.l2.latency_cycles"},
      {{"paths.gm->l1.latency_cycles=1048577"}, "paths.gm->l1.latency_cycles"},
      {{"scalar.cycles_per_insn=1048577"}, "scalar.cycles_per_insn"},
      // Cost factors at most 2^10; cube dimensions 2^12; the vector unit 256 bytes a cycle.
      {{"vector.reduce_factor=1025"}, "vector.reduce_factor"},
      {{"vector.reduce_factor=1024"}, ""},
      {{"vector.transcendental_factor=1025"}, "vector.transcendental_factor"},
      {{"cube.fp32_rate_divisor=1025"}, "cube.fp32_rate_divisor"},
      {{"cube.m=4097"}, "cube.m"},
      {{"cube.m=4096"}, ""},
      {{"cube.k=4097"}, "cube.k"},
      {{"cube.n=4097"}, "cube.n"},
      {{"cube.int8_k=4097"}, "cube.int8_k"},
      {{"vector.bytes_per_cycle=257"}, "vector.bytes_per_cycle"},
      {{"vector.bytes_per_cycle=256"}, ""},
      // Counts.
      {{"cores.aic.count=1025"}, "cores.aic.count"},
      {{"cores.aic.count=400", "cores.aiv.count=800"}, "cores"},  // 1200 cores in all
      {{"cores.aic.count=300", "cores.aiv.count=600"}, ""},
      {{"cores.aiv.per_aic=1025"}, "cores.aiv.per_aic"},
      {{"issue_queue_depth=4097"}, "issue_queue_depth"},
      {{"issue_queue_depth=4096"}, ""},
      {{"ub_banking.banks=4097"}, "ub_banking.banks"},
      {{"ub_banking.bank_groups=4097"}, "ub_banking.bank_groups"},
      {{"ub_banking.bank_width_bytes=65537"}, "ub_banking.bank_width_bytes"},
      {{"alignment.gm=2147483648"}, "alignment.gm"},
      {{"sync.cross_core_max_pending=65537"}, "sync.cross_core_max_pending"},
      {{"sync.cross_core_max_pending=65536"}, ""},
  };
  for (const Case& c : cases) {
    std::string what;
    for (const auto& o : c.overrides) what += o + " ";
    INFO("overrides: " << what);
    if (!*c.key) {
      CHECK_NOTHROW(load_chip_config("tiny", c.overrides));
      continue;
    }
    const std::string msg = config_error([&] { load_chip_config("tiny", c.overrides); });
    INFO(msg);
    // Where it was set (the override, or for a value checked against another key, the preset
    // file), the key and the allowed range.
    CHECK(msg.find(".yaml") != std::string::npos);
    CHECK(msg.find(std::string("key '") + c.key + "'") != std::string::npos);
    const bool range = msg.find(" to ") != std::string::npos ||
                       msg.find("in [") != std::string::npos ||
                       msg.find("in (") != std::string::npos ||
                       msg.find("at most") != std::string::npos;
    CHECK(range);
  }
}

TEST_CASE("the presets and moderate overrides still load within the ranges") {
  for (const auto& name : kPresets) CHECK_NOTHROW(load_chip_config(name));
  // Slow and fast variants a design sweep might try.
  CHECK_NOTHROW(load_chip_config("910b", {"clock_mhz=100", "memory.hbm.gbps=1",
                                          "paths.gm->l1.bytes_per_cycle=0.5",
                                          "memory.l2.core_read_bytes_per_cycle=1024",
                                          "memory.hbm.bytes=1 TiB", "hdc.latency_us=100"}));
  CHECK_NOTHROW(load_chip_config("910b", {"clock_mhz=5000", "memory.hbm.gbps=100000",
                                          "cube.latency_cycles=10000", "cube.m=32"}));
}
