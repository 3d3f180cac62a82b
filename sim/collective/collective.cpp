#include "sim/collective/collective.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <set>

#include <fmt/format.h>

#include "common/error.h"
#include "common/numeric.h"

namespace npusim {
namespace {

using isa::Dtype;
using Bytes = std::vector<uint8_t>;

// One block moving in a step: elements [src_off, src_off + len) of rank src's buffer to
// [dst_off, ...) of rank dst's, reduced into what is there or written over it. to_out: into
// the destination's output buffer (all_to_all) instead of its working buffer.
struct Move {
  int src = 0, dst = 0;
  uint64_t src_off = 0, dst_off = 0, len = 0;
  bool reduce = false;
  bool to_out = false;
};
using Step = std::vector<Move>;

struct Plan {
  std::string name;
  std::vector<Step> steps;
};

// Blocks of the working buffer: block i is [off[i], off[i] + len[i]) elements.
struct Blocks {
  std::vector<uint64_t> off, len;
  uint64_t span(int first, int last) const {  // elements of blocks [first, last)
    return off[last - 1] + len[last - 1] - off[first];
  }
};

Blocks even_blocks(uint64_t total, int n) {  // total split into n blocks, the first larger
  Blocks b;
  uint64_t at = 0;
  for (int i = 0; i < n; ++i) {
    const uint64_t len = total / n + (static_cast<uint64_t>(i) < total % n ? 1 : 0);
    b.off.push_back(at);
    b.len.push_back(len);
    at += len;
  }
  return b;
}

int mod(int a, int n) { return ((a % n) + n) % n; }

// Every rank's block j goes to rank j (reduced there): afterwards rank j holds block j.
Step mesh_reduce_scatter(const Blocks& b, int n) {
  Step s;
  for (int r = 0; r < n; ++r)
    for (int j = 0; j < n; ++j)
      if (j != r) s.push_back({r, j, b.off[j], b.off[j], b.len[j], true});
  return s;
}
// Rank j's block j goes to every other rank.
Step mesh_all_gather(const Blocks& b, int n) {
  Step s;
  for (int j = 0; j < n; ++j)
    for (int r = 0; r < n; ++r)
      if (r != j) s.push_back({j, r, b.off[j], b.off[j], b.len[j], false});
  return s;
}
// n-1 steps; in step s rank r passes its partial block (r - s - 1) to rank r + 1, which reduces
// it into its own: afterwards rank r holds the whole reduction of block r.
std::vector<Step> ring_reduce_scatter(const Blocks& b, int n) {
  std::vector<Step> steps(static_cast<size_t>(n - 1));
  for (int s = 0; s < n - 1; ++s)
    for (int r = 0; r < n; ++r) {
      const int blk = mod(r - s - 1, n);
      steps[s].push_back({r, (r + 1) % n, b.off[blk], b.off[blk], b.len[blk], true});
    }
  return steps;
}
// n-1 steps; rank r starts with block r; in step s it passes block (r - s) to rank r + 1.
std::vector<Step> ring_all_gather(const Blocks& b, int n) {
  std::vector<Step> steps(static_cast<size_t>(n - 1));
  for (int s = 0; s < n - 1; ++s)
    for (int r = 0; r < n; ++r) {
      const int blk = mod(r - s, n);
      steps[s].push_back({r, (r + 1) % n, b.off[blk], b.off[blk], b.len[blk], false});
    }
  return steps;
}
// Recursive halving (n a power of two): at distance d = n/2, ..., 1 each rank keeps the half of
// its block range on its side of bit d and sends the other half to rank r ^ d, which reduces
// it. Afterwards rank r holds block r.
std::vector<Step> hd_reduce_scatter(const Blocks& b, int n) {
  std::vector<Step> steps;
  std::vector<std::pair<int, int>> range(static_cast<size_t>(n), {0, n});
  for (int d = n / 2; d >= 1; d /= 2) {
    Step s;
    for (int r = 0; r < n; ++r) {
      auto& [lo, hi] = range[r];
      const int mid = (lo + hi) / 2;
      const bool upper = (r & d) != 0;
      const int send_lo = upper ? lo : mid, send_hi = upper ? mid : hi;
      s.push_back({r, r ^ d, b.off[send_lo], b.off[send_lo], b.span(send_lo, send_hi), true});
      range[r] = upper ? std::pair{mid, hi} : std::pair{lo, mid};
    }
    steps.push_back(std::move(s));
  }
  return steps;
}
// Recursive doubling: at distance d = 1, ..., n/2 each rank sends the blocks it holds (from
// block r on, 2d-aligned) to rank r ^ d.
std::vector<Step> hd_all_gather(const Blocks& b, int n) {
  std::vector<Step> steps;
  for (int d = 1; d < n; d *= 2) {
    Step s;
    for (int r = 0; r < n; ++r) {
      const int lo = r & ~(d - 1);
      s.push_back({r, r ^ d, b.off[lo], b.off[lo], b.span(lo, lo + d), false});
    }
    steps.push_back(std::move(s));
  }
  return steps;
}
// The root sends block j to rank j.
Step scatter(const Blocks& b, int n, int root) {
  Step s;
  for (int j = 0; j < n; ++j)
    if (j != root) s.push_back({root, j, b.off[j], b.off[j], b.len[j], false});
  return s;
}

void append(std::vector<Step>& to, std::vector<Step> steps) {
  for (Step& s : steps) to.push_back(std::move(s));
}

// The communicator by server: ranks[s][l] is the l-th rank in the s-th server it spans.
struct ServerGroups {
  std::vector<std::vector<int>> ranks;
};

ServerGroups server_groups(const SystemConfig& cfg, const std::vector<int>& chips) {
  ServerGroups g;
  std::vector<int> servers;
  for (size_t r = 0; r < chips.size(); ++r) {
    const int server = cfg.server_of(chips[r]);
    auto it = std::find(servers.begin(), servers.end(), server);
    if (it == servers.end()) {
      servers.push_back(server);
      g.ranks.emplace_back();
      it = servers.end() - 1;
    }
    g.ranks[static_cast<size_t>(it - servers.begin())].push_back(static_cast<int>(r));
  }
  return g;
}

// Block i of `b` split into `parts` nearly equal blocks (offsets in the whole buffer).
Blocks split_block(const Blocks& b, int i, int parts) {
  Blocks sub = even_blocks(b.len[i], parts);
  for (uint64_t& off : sub.off) off += b.off[i];
  return sub;
}

// Steps written for ranks 0..k-1, run by members[0..k-1].
std::vector<Step> on_members(std::vector<Step> steps, const std::vector<int>& members) {
  for (Step& step : steps)
    for (Move& m : step) m.src = members[m.src], m.dst = members[m.dst];
  return steps;
}

// Runs `steps` alongside what `into` already holds: its step k joins into's step k.
void alongside(std::vector<Step>& into, std::vector<Step> steps) {
  if (into.size() < steps.size()) into.resize(steps.size());
  for (size_t k = 0; k < steps.size(); ++k)
    into[k].insert(into[k].end(), steps[k].begin(), steps[k].end());
}

// HCCL's hierarchical all-reduce over servers of full-mesh chips: level 0 reduce-scatters
// inside every server (mesh: rank l of a server ends with block l of its server's sum); level 1
// all-reduces block l between the l-th ranks of all servers (ring or halving-doubling over
// their NICs, every l at once); level 0 all-gathers inside every server again.
std::vector<Step> hierarchical_all_reduce(const Blocks& b, const ServerGroups& g,
                                          CollectiveAlgo level1) {
  const int per = static_cast<int>(g.ranks[0].size());
  const int servers = static_cast<int>(g.ranks.size());
  std::vector<Step> steps(1);
  for (const std::vector<int>& server : g.ranks)
    alongside(steps, on_members({mesh_reduce_scatter(b, per)}, server));
  std::vector<Step> across;
  for (int l = 0; l < per; ++l) {
    std::vector<int> members;
    for (const std::vector<int>& server : g.ranks) members.push_back(server[l]);
    const Blocks sub = split_block(b, l, servers);
    std::vector<Step> level = level1 == CollectiveAlgo::mesh_halving_doubling
                                  ? hd_reduce_scatter(sub, servers)
                                  : ring_reduce_scatter(sub, servers);
    append(level, level1 == CollectiveAlgo::mesh_halving_doubling ? hd_all_gather(sub, servers)
                                                                  : ring_all_gather(sub, servers));
    alongside(across, on_members(std::move(level), members));
  }
  append(steps, std::move(across));
  std::vector<Step> gather(1);
  for (const std::vector<int>& server : g.ranks)
    alongside(gather, on_members({mesh_all_gather(b, per)}, server));
  append(steps, std::move(gather));
  return steps;
}

// The chosen algorithm's steps for the call.
Plan make_plan(const CollectiveCall& c, CollectiveAlgo algo, int n, const ServerGroups& groups) {
  Plan p;
  p.name = collective_algo_name(algo);
  if (n == 1) return p;
  const bool by_rank_blocks =
      c.kind != CollectiveKind::all_reduce && c.kind != CollectiveKind::broadcast;
  const Blocks b = by_rank_blocks ? even_blocks(c.count * n, n) : even_blocks(c.count, n);
  auto rs = [&] {
    if (algo == CollectiveAlgo::mesh) return std::vector<Step>{mesh_reduce_scatter(b, n)};
    if (algo == CollectiveAlgo::ring) return ring_reduce_scatter(b, n);
    return hd_reduce_scatter(b, n);
  };
  auto ag = [&] {
    if (algo == CollectiveAlgo::mesh) return std::vector<Step>{mesh_all_gather(b, n)};
    if (algo == CollectiveAlgo::ring) return ring_all_gather(b, n);
    return hd_all_gather(b, n);
  };
  const bool hierarchical =
      algo == CollectiveAlgo::mesh_ring || algo == CollectiveAlgo::mesh_halving_doubling;
  switch (c.kind) {
    case CollectiveKind::all_reduce:
      if (hierarchical) {
        p.steps = hierarchical_all_reduce(
            even_blocks(c.count, static_cast<int>(groups.ranks[0].size())), groups, algo);
        break;
      }
      p.steps = rs();
      append(p.steps, ag());
      break;
    case CollectiveKind::reduce_scatter: p.steps = rs(); break;
    case CollectiveKind::all_gather: p.steps = ag(); break;
    case CollectiveKind::broadcast:
      p.steps.push_back(scatter(b, n, c.root));
      append(p.steps, ag());
      break;
    case CollectiveKind::all_to_all:
      p.name = "pairwise";
      for (int s = 1; s < n; ++s) {
        Step step;
        for (int r = 0; r < n; ++r) {
          const int q = (r + s) % n;
          step.push_back({r, q, q * c.count, r * c.count, c.count, false, true});
        }
        p.steps.push_back(std::move(step));
      }
      break;
    case CollectiveKind::send_recv:
      p.name = "direct";
      p.steps.push_back({{0, 1, 0, 0, c.count, false}});
      break;
  }
  return p;
}

bool reduces(CollectiveKind k) {
  return k == CollectiveKind::all_reduce || k == CollectiveKind::reduce_scatter;
}

// HCCL's SDMA inline reduce on 910B-class chips: sum, max and min of fp32, fp16, bf16, int32,
// int16 and int8 (HCCL device_capacity.cc, IsSupportSDMAReduce).
bool inline_reducible(Dtype t, ReduceOp op) {
  const bool type_ok = t == Dtype::F32 || t == Dtype::F16 || t == Dtype::BF16 || t == Dtype::S32 ||
                       t == Dtype::S16 || t == Dtype::S8;
  return type_ok && op != ReduceOp::prod;
}

template <typename T>
T apply_op(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::sum: return static_cast<T>(a + b);
    case ReduceOp::prod: return static_cast<T>(a * b);
    case ReduceOp::max: return std::max(a, b);
    case ReduceOp::min: return std::min(a, b);
  }
  return a;
}

template <typename T>
void reduce_native(ReduceOp op, uint8_t* dst, const uint8_t* src, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, dst + i * sizeof(T), sizeof(T));
    std::memcpy(&b, src + i * sizeof(T), sizeof(T));
    const T r = apply_op(op, a, b);
    std::memcpy(dst + i * sizeof(T), &r, sizeof(T));
  }
}

// 16-bit floats: each operation in fp32, rounded to the type (round to nearest even).
template <float (*to_f32)(uint16_t), uint16_t (*from_f32)(float)>
void reduce_half(ReduceOp op, uint8_t* dst, const uint8_t* src, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t a, b;
    std::memcpy(&a, dst + 2 * i, 2);
    std::memcpy(&b, src + 2 * i, 2);
    const uint16_t r = from_f32(apply_op(op, to_f32(a), to_f32(b)));
    std::memcpy(dst + 2 * i, &r, 2);
  }
}

// dst[i] = op(dst[i], src[i]) for n elements of type t.
void reduce_into(Dtype t, ReduceOp op, uint8_t* dst, const uint8_t* src, uint64_t n) {
  switch (t) {
    case Dtype::F32: return reduce_native<float>(op, dst, src, n);
    case Dtype::S32: return reduce_native<int32_t>(op, dst, src, n);
    case Dtype::S16: return reduce_native<int16_t>(op, dst, src, n);
    case Dtype::S8: return reduce_native<int8_t>(op, dst, src, n);
    case Dtype::F16: return reduce_half<f16_to_f32, f32_to_f16>(op, dst, src, n);
    case Dtype::BF16: return reduce_half<bf16_to_f32, f32_to_bf16>(op, dst, src, n);
    default:
      throw Error(
          fmt::format("collective: cannot reduce {} (reducible types: f32, f16, bf16, "
                      "s32, s16, s8)",
                      isa::dtype_name(t)));
  }
}

bool power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

CollectiveAlgo choose_algo(const SystemSimulator& sys, const CollectiveCall& c,
                           const ServerGroups& g) {
  const SystemConfig& cfg = sys.config();
  const int n = static_cast<int>(c.chips.size());
  const std::string what = fmt::format("collective {}: algorithm {}", collective_name(c.kind),
                                       collective_algo_name(c.algo));
  const bool mesh_servers = cfg.topology == SystemTopology::full_mesh;
  const bool regular = std::all_of(g.ranks.begin(), g.ranks.end(), [&](const auto& server) {
    return server.size() == g.ranks[0].size();
  });
  CollectiveAlgo a = c.algo;
  if (a == CollectiveAlgo::automatic) {
    if (g.ranks.size() == 1)
      a = mesh_servers ? CollectiveAlgo::mesh : CollectiveAlgo::ring;
    else
      a = c.kind == CollectiveKind::all_reduce && mesh_servers && regular
              ? CollectiveAlgo::mesh_ring
              : CollectiveAlgo::ring;
  }
  if (a == CollectiveAlgo::mesh && !(mesh_servers && g.ranks.size() == 1))
    throw Error(what +
                " needs its chips inside one server joined by a full mesh; use ring, "
                "halving_doubling or (all_reduce across servers) mesh_ring");
  if (a == CollectiveAlgo::mesh_ring || a == CollectiveAlgo::mesh_halving_doubling) {
    if (c.kind != CollectiveKind::all_reduce)
      throw Error(what + " is hierarchical all_reduce only; use ring or halving_doubling");
    if (!mesh_servers || !regular || g.ranks.size() < 2)
      throw Error(
          fmt::format("{} needs chips in 2 or more full-mesh servers, as many in each "
                      "(got {} servers); use ring",
                      what, g.ranks.size()));
    if (a == CollectiveAlgo::mesh_halving_doubling &&
        !power_of_two(static_cast<int>(g.ranks.size())))
      throw Error(fmt::format("{} needs a power-of-two number of servers, got {}; use mesh_ring",
                              what, g.ranks.size()));
  }
  if (a == CollectiveAlgo::halving_doubling && !power_of_two(n))
    throw Error(fmt::format("{} needs a power-of-two number of chips, got {}; use ring", what, n));
  return a;
}

void check_call(SystemSimulator& sys, const CollectiveCall& c) {
  const std::string what = fmt::format("collective {}", collective_name(c.kind));
  const int n = static_cast<int>(c.chips.size());
  if (n == 0) throw Error(what + ": no chips in the communicator");
  if (n > sys.chips())
    throw Error(fmt::format("{}: {} chips in the communicator, but system '{}' has {}", what, n,
                            sys.config().name, sys.chips()));
  std::set<int> seen;
  for (int chip : c.chips) {
    sys.gm(chip);  // throws naming a chip that does not exist
    if (!seen.insert(chip).second)
      throw Error(fmt::format("{}: chip {} appears twice in the communicator", what, chip));
  }
  if (c.send.size() != c.chips.size() || c.recv.size() != c.chips.size())
    throw Error(fmt::format("{}: {} send and {} receive buffers for {} chips; one each per chip",
                            what, c.send.size(), c.recv.size(), n));
  if (!c.rank_counts.empty() && c.rank_counts.size() != c.chips.size())
    throw Error(fmt::format("{}: {} element counts for {} chips", what, c.rank_counts.size(), n));
  for (int r = 0; r < static_cast<int>(c.rank_counts.size()); ++r)
    if (c.rank_counts[r] != c.count)
      throw Error(
          fmt::format("{}: rank {} (chip {}) has {} elements, the call says {} (rank 0 has "
                      "{}): every rank must bring the same size",
                      what, r, c.chips[r], c.rank_counts[r], c.count, c.rank_counts[0]));
  if (c.kind == CollectiveKind::send_recv && n != 2)
    throw Error(fmt::format("{}: needs 2 chips (rank 0 sends to rank 1), got {}", what, n));
  if (c.root < 0 || c.root >= n)
    throw Error(fmt::format("{}: root {} is not a rank (0 to {})", what, c.root, n - 1));
  if (isa::dtype_size(c.dtype) <= 0) throw Error(fmt::format("{}: no element type given", what));
  const uint64_t sb = collective_send_bytes(c), rb = collective_recv_bytes(c);
  const bool pieces = !c.send_pieces.empty() || !c.recv_pieces.empty();
  if (pieces && c.kind != CollectiveKind::all_reduce && c.kind != CollectiveKind::broadcast)
    throw Error(what + ": buffers in pieces are for all_reduce and broadcast only");
  for (const auto* list : {&c.send_pieces, &c.recv_pieces})
    if (!list->empty() && list->size() != c.chips.size())
      throw Error(
          fmt::format("{}: {} piece lists for {} chips; one per chip", what, list->size(), n));
  for (int r = 0; r < n; ++r) {
    DeviceMemory& g = sys.gm(c.chips[r]);
    auto check = [&](const char* name, uint64_t addr, uint64_t bytes) {
      if (!g.in_bounds(addr, bytes))
        throw Error(
            fmt::format("{}: rank {} (chip {}): {} buffer [{:#x}, {:#x}) is outside its "
                        "device memory of {} bytes",
                        what, r, c.chips[r], name, addr, addr + bytes, g.capacity()));
    };
    for (auto [name, addr, bytes, list] : {std::tuple{"send", c.send[r], sb, &c.send_pieces},
                                           {"receive", c.recv[r], rb, &c.recv_pieces}}) {
      if (list->empty() || (*list)[static_cast<size_t>(r)].empty()) {
        check(name, addr, bytes);
        continue;
      }
      uint64_t total = 0;
      for (const CollectivePiece& p : (*list)[static_cast<size_t>(r)]) {
        check(name, p.addr, p.bytes);
        total += p.bytes;
      }
      if (total != bytes)
        throw Error(
            fmt::format("{}: rank {} (chip {}): the {} pieces hold {} bytes, the buffer "
                        "is {}",
                        what, r, c.chips[r], name, total, bytes));
    }
  }
}

// The ranks' buffers while the collective runs.
struct Buffers {
  std::vector<Bytes> work, out;
};

// Rank r's pieces in `list` (CollectiveCall::send_pieces / recv_pieces), or null if it has one
// plain buffer.
const std::vector<CollectivePiece>* pieces_of(const std::vector<std::vector<CollectivePiece>>& list,
                                              int r) {
  if (list.size() <= static_cast<size_t>(r) || list[static_cast<size_t>(r)].empty()) return nullptr;
  return &list[static_cast<size_t>(r)];
}

Buffers load_inputs(SystemSimulator& sys, const CollectiveCall& c) {
  const int n = static_cast<int>(c.chips.size());
  const uint64_t es = static_cast<uint64_t>(isa::dtype_size(c.dtype));
  const uint64_t sb = collective_send_bytes(c);
  Buffers b;
  b.work.resize(n);
  for (int r = 0; r < n; ++r) {
    DeviceMemory& g = sys.gm(c.chips[r]);
    Bytes in(sb);
    const bool has_input = c.kind != CollectiveKind::broadcast || r == c.root;
    if (sb && has_input && !(c.kind == CollectiveKind::send_recv && r != 0)) {
      if (const auto* pieces = pieces_of(c.send_pieces, r)) {
        uint64_t at = 0;
        for (const CollectivePiece& p : *pieces) {
          g.read(p.addr, in.data() + at, p.bytes);
          at += p.bytes;
        }
      } else {
        g.read(c.send[r], in.data(), sb);
      }
    }
    switch (c.kind) {
      case CollectiveKind::all_gather:
        b.work[r].assign(sb * n, 0);
        std::copy(in.begin(), in.end(), b.work[r].begin() + static_cast<long>(sb * r));
        break;
      case CollectiveKind::all_to_all:
        b.out.resize(n);
        b.out[r].assign(sb, 0);
        std::copy_n(in.begin() + static_cast<long>(r * c.count * es), c.count * es,
                    b.out[r].begin() + static_cast<long>(r * c.count * es));
        b.work[r] = std::move(in);
        break;
      default: b.work[r] = std::move(in);
    }
  }
  return b;
}

void store_outputs(SystemSimulator& sys, const CollectiveCall& c, const Buffers& b) {
  const int n = static_cast<int>(c.chips.size());
  const uint64_t rb = collective_recv_bytes(c);
  for (int r = 0; r < n; ++r) {
    if (c.kind == CollectiveKind::send_recv && r != 1) continue;
    const Bytes& from = c.kind == CollectiveKind::all_to_all ? b.out[r] : b.work[r];
    const uint64_t at = c.kind == CollectiveKind::reduce_scatter ? rb * r : 0;
    if (!rb) continue;
    if (const auto* pieces = pieces_of(c.recv_pieces, r)) {
      uint64_t off = at;
      for (const CollectivePiece& p : *pieces) {
        sys.gm(c.chips[r]).write(p.addr, from.data() + off, p.bytes);
        off += p.bytes;
      }
    } else {
      sys.gm(c.chips[r]).write(c.recv[r], from.data() + at, rb);
    }
  }
}

// Moves (and reduces) the step's blocks between the buffers; every source is read first.
void apply_step(const CollectiveCall& c, const Step& step, Buffers& b) {
  const uint64_t es = static_cast<uint64_t>(isa::dtype_size(c.dtype));
  std::vector<Bytes> data;
  for (const Move& m : step) {
    const auto from = b.work[m.src].begin() + static_cast<long>(m.src_off * es);
    data.emplace_back(from, from + static_cast<long>(m.len * es));
  }
  for (size_t i = 0; i < step.size(); ++i) {
    const Move& m = step[i];
    uint8_t* to = (m.to_out ? b.out : b.work)[m.dst].data() + m.dst_off * es;
    if (m.reduce)
      reduce_into(c.dtype, c.op, to, data[i].data(), m.len);
    else
      std::memcpy(to, data[i].data(), data[i].size());
  }
}

// A vector reduce kernel of `bytes` on one chip (HCCL's reduce when the DMA cannot do it): its
// launch, then the larger of the vector cores' time (every AI vector core, one vector unit's
// bytes per cycle each) and HBM's (two operands read, the result written).
uint64_t vector_reduce_cycles(const SystemConfig& cfg, uint64_t bytes) {
  const ChipConfig& chip = cfg.chip;
  int vector_cores = 0;
  for (const CoreKindConfig& k : chip.core_kinds)
    if (k.has(isa::Pipe::V)) vector_cores += k.count;
  const double vec = static_cast<double>(bytes) /
                     (static_cast<double>(vector_cores) * chip.vector_bytes_per_cycle);
  const double mem = 3.0 * static_cast<double>(bytes) / chip.hbm_sustained_bytes_per_cycle();
  return static_cast<uint64_t>(
      std::ceil(cfg.reduce_kernel_launch_us * chip.clock_mhz + std::max(vec, mem)));
}

}  // namespace

namespace {

const char* const kKindNames[] = {"all_reduce", "all_gather", "reduce_scatter",
                                  "broadcast",  "all_to_all", "send_recv"};
const char* const kOpNames[] = {"sum", "prod", "max", "min"};
const char* const kAlgoNames[] = {
    "auto", "mesh", "ring", "halving_doubling", "mesh_ring", "mesh_halving_doubling"};

template <typename E, size_t N>
E from_name(const std::string& s, const char* what, const char* const (&names)[N]) {
  std::string valid;
  for (size_t i = 0; i < N; ++i) {
    if (s == names[i]) return static_cast<E>(i);
    valid += (i ? ", " : "") + std::string(names[i]);
  }
  throw Error(fmt::format("unknown {} '{}'; expected one of: {}", what, s, valid));
}

}  // namespace

const char* collective_name(CollectiveKind k) { return kKindNames[static_cast<int>(k)]; }
const char* reduce_op_name(ReduceOp op) { return kOpNames[static_cast<int>(op)]; }
const char* collective_algo_name(CollectiveAlgo a) { return kAlgoNames[static_cast<int>(a)]; }

CollectiveKind collective_from_name(const std::string& s) {
  return from_name<CollectiveKind>(s, "collective", kKindNames);
}
ReduceOp reduce_op_from_name(const std::string& s) {
  return from_name<ReduceOp>(s, "reduction", kOpNames);
}
CollectiveAlgo collective_algo_from_name(const std::string& s) {
  if (s == "hd") return CollectiveAlgo::halving_doubling;
  if (s == "mesh_hd") return CollectiveAlgo::mesh_halving_doubling;
  return from_name<CollectiveAlgo>(s, "algorithm", kAlgoNames);
}

namespace {
// Element i of an array of T in `bytes`.
template <typename T>
void store_at(std::vector<uint8_t>& bytes, uint64_t i, T value) {
  std::memcpy(&bytes[i * sizeof(T)], &value, sizeof(T));
}
}  // namespace

std::vector<uint8_t> exact_reduction_inputs(Dtype t, ReduceOp op, uint64_t n, uint32_t seed) {
  static const float kProd[] = {1, -1, 2, -2, 0.5f, -0.5f};
  const bool integer = !isa::dtype_is_float(t);
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (float& x : v)
    x = op == ReduceOp::prod ? kProd[rng() % (integer ? 4 : 6)] : float(int(rng() % 17) - 8);
  std::vector<uint8_t> out(n * static_cast<uint64_t>(std::max(isa::dtype_size(t), 0)));
  for (uint64_t i = 0; i < n; ++i) {
    switch (t) {
      case Dtype::F32: store_at(out, i, v[i]); break;
      case Dtype::F16: store_at(out, i, f32_to_f16(v[i])); break;
      case Dtype::BF16: store_at(out, i, f32_to_bf16(v[i])); break;
      case Dtype::S32: store_at(out, i, static_cast<int32_t>(v[i])); break;
      case Dtype::S16: store_at(out, i, static_cast<int16_t>(v[i])); break;
      case Dtype::S8: store_at(out, i, static_cast<int8_t>(v[i])); break;
      default:
        throw Error(fmt::format("exact_reduction_inputs: no {} (f32, f16, bf16, s32, s16, s8)",
                                isa::dtype_name(t)));
    }
  }
  return out;
}

uint64_t collective_send_bytes(const CollectiveCall& c) {
  const uint64_t es = static_cast<uint64_t>(std::max(isa::dtype_size(c.dtype), 0));
  const uint64_t n = c.chips.size();
  const bool whole =
      c.kind == CollectiveKind::reduce_scatter || c.kind == CollectiveKind::all_to_all;
  return c.count * es * (whole ? n : 1);
}

uint64_t collective_recv_bytes(const CollectiveCall& c) {
  const uint64_t es = static_cast<uint64_t>(std::max(isa::dtype_size(c.dtype), 0));
  const uint64_t n = c.chips.size();
  const bool whole = c.kind == CollectiveKind::all_gather || c.kind == CollectiveKind::all_to_all;
  return c.count * es * (whole ? n : 1);
}

CollectiveResult run_collective(SystemSimulator& sys, const CollectiveCall& c) {
  check_call(sys, c);
  const bool reducing = reduces(c.kind);
  if (reducing) {
    Bytes probe(static_cast<size_t>(isa::dtype_size(c.dtype)) * 2);
    reduce_into(c.dtype, c.op, probe.data(), probe.data() + probe.size() / 2, 1);  // type check
  }
  const int n = static_cast<int>(c.chips.size());
  const ServerGroups groups = server_groups(sys.config(), c.chips);
  const CollectiveAlgo algo = choose_algo(sys, c, groups);
  const Plan plan = make_plan(c, algo, n, groups);
  const uint64_t es = static_cast<uint64_t>(isa::dtype_size(c.dtype));
  CollectiveResult res;
  res.algorithm = plan.name;
  res.inline_reduce = reducing && inline_reducible(c.dtype, c.op);
  res.start_cycle = sys.now_cycles();
  Buffers bufs;
  if (sys.functional()) bufs = load_inputs(sys, c);
  for (const Step& step : plan.steps) {
    std::vector<SystemSimulator::LinkTransfer> transfers;
    std::vector<uint64_t> reduced(static_cast<size_t>(n));
    for (const Move& m : step) {
      transfers.push_back({c.chips[m.src], c.chips[m.dst], m.len * es});
      res.link_bytes += m.len * es;
      if (m.reduce) reduced[m.dst] += m.len * es;
    }
    const PeerCopyResult moved = sys.transfer(transfers);
    CollectiveStep record;
    record.start_cycle = moved.start_cycle;
    for (size_t i = 0; i < transfers.size(); ++i)
      record.transfers.push_back(
          {transfers[i].src, transfers[i].dst, transfers[i].bytes, moved.copy_cycles[i]});
    if (sys.functional()) apply_step(c, step, bufs);
    if (reducing && !res.inline_reduce) {
      uint64_t most = 0;
      for (uint64_t bytes : reduced)
        if (bytes) most = std::max(most, vector_reduce_cycles(sys.config(), bytes));
      sys.advance(most);
      res.reduce_cycles += most;
      record.reduce_cycles = most;
    }
    record.cycles = sys.now_cycles() - record.start_cycle;
    res.step_records.push_back(std::move(record));
    ++res.steps;
  }
  if (sys.functional()) store_outputs(sys, c, bufs);
  res.cycles = sys.now_cycles() - res.start_cycle;
  res.time_us = sys.config().chip.cycles_to_us(static_cast<double>(res.cycles));
  return res;
}

}  // namespace npusim
