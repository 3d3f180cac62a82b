// Timing-only replay by translation (sim/replay/launch_replay.h, record_translation and
// translated_writes; sim/replay/address_flow.h): a timing-only simulator replays a launch whose
// tensors moved to blocks laid out as the recorded launch's, without walking its program, and
// every launch then has exactly the cycles and counters of simulating it; with relocation
// (relocated_writes), also a launch at other offsets in its blocks that cannot evict an L2
// line, or that may evict but whose lines all move to other sets alike. A functional simulator
// replays such a launch by walking its blocks at its own arguments, the translation standing in
// for the check. Each mode runs in a forked child (SystemC elaborates one chip per process).
#include <catch2/catch.hpp>

#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>

#include "common/numeric.h"
#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "sim/replay/address_flow.h"
#include "tests/common/child_process.h"
#include "tests/sim/replay_kernels.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using nlohmann::json;

namespace {

// The runtime's allocator as the launch sees it (KernelLaunch::gm_blocks): block start -> bytes.
using Blocks = std::map<uint64_t, uint64_t>;
GmBlockLookup lookup(const Blocks* blocks) {
  return [blocks](uint64_t addr, uint64_t* start, uint64_t* bytes) {
    auto it = blocks->upper_bound(addr);
    if (it == blocks->begin()) return false;
    --it;
    if (addr >= it->first + it->second) return false;
    *start = it->first;
    *bytes = it->second;
    return true;
  };
}

// y = s * x over 128 fp16, s a scalar tensor the scalar unit loads (an optimizer's learning
// rate): the loaded value reaches only the vector unit's scalar operand.
const char* kScale = R"(
.arg x, f16[128]
.arg s, f32[1]
.arg y, f16[128]
.section aiv
    ldarg x1, x
    ldarg x2, s
    ldarg x3, y
    ld x5, x2
    movi x6, 0
    movi x7, 1024
    copy_gm2ub x6, x1, 1, 8, 0, 0
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    vmuls.f16 x7, x6, x5, 1, 1, 1, 8, 8
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    copy_ub2gm x3, x7, 1, 8, 0, 0
    add x4, x3, 256
    st x5, x4
    end
)";

// A mix kernel whose vector cores exchange data through GM: per block, each vector core
// scales its half of x's 2 KiB slice by 2 (the fp32 bits of 2.0) into y, signals the cube core from
// MTE3 (after its store landed) and waits; the cube core, having loaded the slice into L1, waits
// for both and lets them go; each then loads the other's half of y, scales it again and stores it
// into z (y's block past its two slices). z is thus what the other core wrote: a replay that ran a
// core's effects before the other's (the cores apart, in either order) would read y as filled.
const char* kExchange = R"(
.arg x, f16[2048]
.arg s, f32[1]
.arg y, f16[4096]
.section aic
    ldarg x1, x
    get_block_id x2
    mul x4, x2, 2048
    add x1, x1, x4
    movi x6, 0
    copy_gm2l1 x6, x1, 1, 64, 0, 0
    cc_wait s, 1
    cc_wait s, 1
    cc_set s, 2, 0
    end
.section aiv
    ldarg x1, x
    ldarg x3, y
    get_block_id x2
    get_subblock_id x5
    mul x4, x2, 2048
    mul x9, x5, 1024
    add x10, x4, x9
    add x1, x1, x10
    add x11, x3, x10
    movi x12, 1024
    sub x12, x12, x9
    add x12, x12, x4
    add x12, x3, x12
    add x13, x3, 4096
    add x13, x13, x10
    movi x6, 0
    movi x7, 1024
    movi x8, 1073741824
    copy_gm2ub x6, x1, 1, 32, 0, 0
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    vmuls.f16 x7, x6, x8, 4, 1, 1, 8, 8
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    copy_ub2gm x11, x7, 1, 32, 0, 0
    cc_set mte3, 2, 1
    cc_wait s, 0
    copy_gm2ub x6, x12, 1, 32, 0, 0
    set_flag mte2, v, 1
    wait_flag mte2, v, 1
    vmuls.f16 x7, x6, x8, 4, 1, 1, 8, 8
    set_flag v, mte3, 1
    wait_flag v, mte3, 1
    copy_ub2gm x13, x7, 1, 32, 0, 0
    end
)";

// Reads x (nx bytes), then y (ny bytes), then x again into the UB, in 16 KiB transfers on one
// vector core: whether the second pass over x hits depends on which of x's lines y evicted, so
// on the L2 sets x's and y's lines share.
const char* kReread = R"(
.arg x, u8[nx]
.arg y, u8[ny]
.arg nx
.arg ny
.section aiv
    ldarg x1, x
    ldarg x2, y
    ldarg x3, nx
    ldarg x4, ny
    movi x20, 0
    movi x13, 512
    movi x9, 0
first:
    add x14, x1, x9
    copy_gm2ub x20, x14, 1, x13, 0, 0
    add x9, x9, 16384
    blt x9, x3, first
    movi x9, 0
other:
    add x14, x2, x9
    copy_gm2ub x20, x14, 1, x13, 0, 0
    add x9, x9, 16384
    blt x9, x4, other
    movi x9, 0
again:
    add x14, x1, x9
    copy_gm2ub x20, x14, 1, x13, 0, 0
    add x9, x9, 16384
    blt x9, x3, again
    end
)";

enum class Mode { simulate, translate, relocate, check };

// A timing-only tiny chip runs a sequence of launches whose tensors move between blocks (the
// TensorFlow allocator of a training step), in `mode`: simulate every launch; replay by
// translation only (SimOptions::replay off, as the TF plugin sets it for timing-only runs),
// without relocation (translate) or with it (relocate, SimOptions::replay_relocate); or replay
// with relocation, then also simulate and throw on any difference (Replay::check).
// functional: a functional simulator instead, replays walking the program (Replay::on), every
// launch's inputs filled with data and its output's bytes kept (out[name + "_out"]).
// page_rotation: the L2's rotated set index (memory.l2.page_rotation).
json workload(Mode mode, bool functional = false, uint64_t memo_bytes = 0,
              bool page_rotation = false) {
  unsetenv("NPUSIM_REPLAY");
  unsetenv("NPUSIM_REPLAY_TRANSLATED");
  unsetenv("NPUSIM_REPLAY_RELOCATE");
  unsetenv("NPUSIM_REPLAY_LOG");
  SimOptions opts;
  opts.functional = functional;
  opts.replay = mode == Mode::check                    ? SimOptions::Replay::check
                : functional && mode != Mode::simulate ? SimOptions::Replay::on
                                                       : SimOptions::Replay::off;
  opts.replay_translated = mode != Mode::simulate;
  opts.replay_relocate = mode == Mode::relocate || mode == Mode::check;
  if (memo_bytes) opts.replay_memo_bytes = memo_bytes;
  // With relocation, each launch's line of the replay log (SimOptions::replay_log) too.
  const std::string replay_log = (std::filesystem::temp_directory_path() /
                                  ("npusim_replay_log_" + std::to_string(getpid()) + ".tsv"))
                                     .string();
  if (mode == Mode::relocate) {
    std::filesystem::remove(replay_log);
    opts.replay_log = replay_log;
  }
  std::ifstream replay_lines;
  ChipConfig cfg = load_chip_config("tiny");
  cfg.l2_page_rotation = page_rotation;
  Simulator sim(cfg, opts);
  const isa::Program vadd = isa::assemble_file(test::source_dir() + "/kernels/vadd_f16.s");
  const isa::Program gemm = isa::assemble_file(test::source_dir() + "/kernels/gemm_f16.s");
  const isa::Program scale = isa::assemble(kScale, "scale.s");
  const isa::Program handoff = isa::assemble(test::kHandoff, "handoff.s");
  const isa::Program exchange = isa::assemble(kExchange, "exchange.s");
  const isa::Program reread = isa::assemble(kReread, "reread.s");
  const isa::Program pick = isa::assemble(test::kPick, "pick.s");
  Blocks blocks;
  json out;
  auto run = [&](const std::string& name, const isa::Program& p, std::vector<uint64_t> args,
                 int block_dim) {
    KernelLaunch l;
    l.program = &p;
    l.args = std::move(args);
    l.block_dim = block_dim;
    l.gm_blocks = lookup(&blocks);
    // Every block's bytes a pattern of the block's address (the same in every mode).
    if (functional)
      for (const auto& [start, bytes] : blocks) {
        std::vector<uint16_t> v(bytes / 2);
        for (size_t i = 0; i < v.size(); ++i)
          v[i] = f32_to_f16(static_cast<float>((i * 7 + start / 512) % 61) * 0.125f - 3.0f);
        test::write_gm(sim, start, v);
      }
    const KernelResult r = sim.run(l);
    // The output (the third argument, if an address) to the end of its block.
    auto it = blocks.upper_bound(l.args[2]);
    if (functional && it != blocks.begin() && (--it)->first + it->second > l.args[2]) {
      out[name + "_out"] =
          test::read_gm<uint16_t>(sim, l.args[2], (it->first + it->second - l.args[2]) / 2);
    }
    out[name] = {{"ok", r.ok},
                 {"error", r.error},
                 {"cycles", r.cycles},
                 {"start", r.start_cycle},
                 {"counters", r.counters},
                 {"replayed", r.replayed},
                 {"now", sim.now_cycles()}};
    if (mode != Mode::relocate) return;
    if (!replay_lines.is_open()) replay_lines.open(replay_log);
    replay_lines.clear();  // past the end of the last line read
    std::string line;
    std::getline(replay_lines, line);
    out["replay_log"][name] = line;
  };
  // Three fp16 vectors of n elements, each in a block of its own at `base` (block i at
  // base + i * stride), x and z one block when in_place.
  const uint64_t n = 20000, vbytes = 40960;
  auto vadd_at = [&](const std::string& name, uint64_t base, uint64_t stride, bool in_place,
                     uint64_t z_bytes = 40960) {
    blocks.clear();
    blocks[base] = vbytes;
    blocks[base + stride] = vbytes;
    if (!in_place) blocks[base + 2 * stride] = z_bytes;
    const uint64_t z = in_place ? base : base + 2 * stride;
    run(name, vadd, {base, base + stride, z, n}, 3);
  };
  vadd_at("vadd", 0x1000000, 0x100000, false);
  vadd_at("vadd_again", 0x1000000, 0x100000, false);           // same addresses
  vadd_at("vadd_moved", 0x2345000, 0x31000, false);            // other blocks, same layout
  vadd_at("vadd_z_block", 0x3000000, 0x100000, false, 49152);  // z's block larger: other key
  // In place: x and z one block, at the offsets and sizes of vadd's: the stores hit the lines
  // the loads brought in, so the recording of vadd must not time it.
  vadd_at("vadd_in_place", 0x4000000, 0x100000, true);
  vadd_at("vadd_in_place_moved", 0x5000000, 0x80000, true);
  // x at offset 512 in its block: another L2 layout, another key; relocation replays it (the
  // launch fits the L2 at any placement, x keeps its offset modulo the 512-byte line).
  blocks.clear();
  blocks[0x6000000] = vbytes + 512;
  blocks[0x6100000] = vbytes;
  blocks[0x6200000] = vbytes;
  run("vadd_offset", vadd, {0x6000200, 0x6100000, 0x6200000, n}, 3);
  // x at offset 256: its ranges split into lines differently; never relocated.
  blocks.clear();
  blocks[0x6800000] = vbytes + 512;
  blocks[0x6900000] = vbytes;
  blocks[0x6a00000] = vbytes;
  run("vadd_offset_256", vadd, {0x6800100, 0x6900000, 0x6a00000, n}, 3);
  // x and z in one block, on lines of their own: relocated from vadd (no line shared, then or
  // now), unlike vadd_in_place, whose z shares x's lines.
  blocks.clear();
  blocks[0x7000000] = 0x20000;
  blocks[0x7100000] = vbytes;
  run("vadd_in_place_near", vadd, {0x7000000, 0x7100000, 0x7010000, n}, 3);
  // A launch whose tensors overflow the 8 MiB L2 (4 MiB each): its evictions follow the layout.
  const uint64_t big = 2 * 1024 * 1024, bbytes = 2 * big;
  for (const auto& [name, base] :
       {std::pair<std::string, uint64_t>{"vadd_big", 0x10000000}, {"vadd_big_moved", 0x20a00000}}) {
    blocks = {{base, bbytes}, {base + 0x1000000, bbytes}, {base + 0x3000000, bbytes}};
    run(name, vadd, {base, base + 0x1000000, base + 0x3000000, big}, 3);
  }
  // The same at offset 512 of a larger block: it may evict, but filed by block all three
  // tensors' lines move by one line, so each set's lines move to the next set together
  // (relocated). With y's block a way (512 KiB) larger, z's lines move by a way, to the same
  // sets (relocated).
  blocks = {{0x30000000, bbytes + 512}, {0x31000000, bbytes}, {0x33000000, bbytes}};
  run("vadd_big_offset", vadd, {0x30000200, 0x31000000, 0x33000000, big}, 3);
  blocks = {{0x38000000, bbytes}, {0x39000000, bbytes + 0x80000}, {0x3b000000, bbytes}};
  run("vadd_big_way", vadd, {0x38000000, 0x39000000, 0x3b000000, big}, 3);
  // x and y in one block, back to back as vadd_big's blocks were filed, at offset 512 of a
  // block one line larger: the block is filed where x's was, so x, y and z (filed after it) all
  // move by one set (relocated from a recording whose blocks lay apart). Then at offset 0 of a
  // block of the two tensors' size: every line where vadd_big's lay (relocated).
  blocks = {{0x26000000, 2 * bbytes + 512}, {0x27000000, bbytes}};
  run("vadd_big_shared_offset", vadd, {0x26000200, 0x26000200 + bbytes, 0x27000000, big}, 3);
  blocks = {{0x24000000, 2 * bbytes}, {0x25000000, bbytes}};
  run("vadd_big_shared", vadd, {0x24000000, 0x24000000 + bbytes, 0x25000000, big}, 3);
  // x of 3.5 ways (3,584 lines: 4 in sets 0-511, 3 in the others) in a block of 4 ways, y of
  // 12.5 ways filed after it (13 lines in sets 0-511): those sets receive 17 lines and the
  // second pass over x misses there. x at offset 512 of a block one line larger moves both by
  // one set (relocated); x's block half a way larger moves y's 13-line sets onto x's 3-line
  // ones, so nothing is evicted (simulated, and it really times differently).
  const uint64_t nx = 0x1c0000, ny = 0x640000;
  blocks = {{0x3c000000, 0x200000}, {0x3c400000, ny}};
  run("reread", reread, {0x3c000000, 0x3c400000, nx, ny}, 1);
  blocks = {{0x3d000000, 0x200000 + 512}, {0x3d400000, ny}};
  run("reread_sets_moved", reread, {0x3d000200, 0x3d400000, nx, ny}, 1);
  blocks = {{0x3e000000, 0x240000}, {0x3e400000, ny}};
  run("reread_skewed", reread, {0x3e000000, 0x3e400000, nx, ny}, 1);
  // x's block a way (a page of the L2's page rotation) larger: y is filed a way further, in
  // the same sets (relocated), and with the rotation on the same rotated pages of its block.
  blocks = {{0x3f000000, 0x280000}, {0x3f400000, ny}};
  run("reread_way", reread, {0x3f000000, 0x3f400000, nx, ny}, 1);
  // Tensors of 5 x 1024 + 1 lines each (the tiny L2: 1024 sets of 16 ways): at some placement
  // each puts 6 lines in one set, 18 > 16 ways, but filed back to back (the L2's filing by
  // block) the three take 15,363 of the L2's 16,384 lines and evict none. Relocated at offset 512
  // of larger blocks that still fit so; not where x's block grows past the L2's lines.
  const uint64_t packed = (5 * 1024 + 1) * 256, pbytes = 2 * packed;
  blocks = {{0x34000000, pbytes}, {0x34400000, pbytes}, {0x34800000, pbytes}};
  run("vadd_packed", vadd, {0x34000000, 0x34400000, 0x34800000, packed}, 3);
  blocks = {{0x34c00000, pbytes + 512}, {0x35000000, pbytes}, {0x35400000, pbytes}};
  run("vadd_packed_offset", vadd, {0x34c00200, 0x35000000, 0x35400000, packed}, 3);
  blocks = {{0x35800000, pbytes + 0x100000}, {0x35c00000, pbytes}, {0x36000000, pbytes}};
  run("vadd_packed_large_block", vadd, {0x35800200, 0x35c00000, 0x36000000, packed}, 3);
  // The cube kernel, moved.
  for (const auto& [name, base] :
       {std::pair<std::string, uint64_t>{"gemm", 0x8000000}, {"gemm_moved", 0x9300000}}) {
    blocks = {{base, 0x80000}, {base + 0x100000, 0x80000}, {base + 0x200000, 0x80000}};
    run(name, gemm, {base, base + 0x100000, base + 0x200000, 256, 256, 512}, 2);
  }
  // ld and st (the stored value is data; y's block holds the 8 bytes st writes past y).
  for (const auto& [name, base] :
       {std::pair<std::string, uint64_t>{"scale", 0xa000000}, {"scale_moved", 0xa765000}}) {
    blocks = {{base, 512}, {base + 0x1000, 512}, {base + 0x2000, 512}};
    run(name, scale, {base, base + 0x1000, base + 0x2000}, 1);
  }
  // The gather steered by its loads: moved with the same idx bytes (replayed by translation in a
  // timing-only simulator), moved with other ones (simulated: it copies other rows, and more),
  // again with those (its own key), then at the first addresses with them (its own recording
  // loaded other bytes; pick_other's times it). A functional run fills idx with its pattern.
  for (const auto& [name, base, count] :
       {std::tuple<std::string, uint64_t, int64_t>{"pick", 0xd000000, 2},
        {"pick_moved", 0xd340000, 2},
        {"pick_other", 0xd800000, 5},
        {"pick_other_again", 0xd800000, 5},
        {"pick_back", 0xd000000, 5}}) {
    blocks = {{base, 8192}, {base + 0x10000, 512}, {base + 0x20000, 512}};
    test::write_gm(sim, base + 0x10000, std::vector<int64_t>{count, 3});
    run(name, pick, {base, base + 0x10000, base + 0x20000}, 1);
  }
  // The mix kernel with cross-core flags, moved; then with y at another offset in its block
  // (relocated).
  for (const auto& [name, base, y_offset] :
       {std::tuple<std::string, uint64_t, uint64_t>{"handoff", 0xb000000, 0},
        {"handoff_moved", 0xb340000, 0},
        {"handoff_offset", 0xb800000, 1024}}) {
    blocks = {{base, 4096}, {base + 0x10000, 512}, {base + 0x20000, 4096 + y_offset}};
    run(name, handoff, {base, base + 0x10000, base + 0x20000 + y_offset}, 2);
  }
  // The vector cores exchanging halves of y, moved; then with y at another offset.
  for (const auto& [name, base, y_offset] :
       {std::tuple<std::string, uint64_t, uint64_t>{"exchange", 0xc000000, 0},
        {"exchange_moved", 0xc340000, 0},
        {"exchange_offset", 0xc800000, 1024}}) {
    blocks = {{base, 4096}, {base + 0x10000, 512}, {base + 0x20000, 8192 + y_offset}};
    run(name, exchange, {base, base + 0x10000, base + 0x20000 + y_offset}, 2);
  }
  // Both again at their first addresses, twice: a functional simulator's first replay under
  // the launch's own key keeps its effects (PreparedLaunch), the second runs those in the
  // recorded order across the cores without walking the program.
  for (const char* again : {"_again", "_again2"}) {
    blocks = {{0xb000000, 4096}, {0xb010000, 512}, {0xb020000, 4096}};
    run(std::string("handoff") + again, handoff, {0xb000000, 0xb010000, 0xb020000}, 2);
    blocks = {{0xc000000, 4096}, {0xc010000, 512}, {0xc020000, 8192}};
    run(std::string("exchange") + again, exchange, {0xc000000, 0xc010000, 0xc020000}, 2);
  }
  out["totals"] = sim.counters();
  out["now"] = sim.now_cycles();
  if (mode == Mode::relocate) std::filesystem::remove(replay_log);
  return out;
}

json run_in_child(Mode mode, bool functional = false, uint64_t memo_bytes = 0,
                  bool page_rotation = false) {
  return json::parse(test::run_in_child([mode, functional, memo_bytes, page_rotation] {
    return workload(mode, functional, memo_bytes, page_rotation).dump();
  }));
}

// Every launch of `run` (results, cycles, counters, simulated time, outputs) as in `sim`, every
// simulated launch ok.
void check_same_as_simulated(const json& sim, const json& run) {
  for (const auto& [name, value] : sim.items()) {
    INFO(name);
    if (value.is_object() && value.contains("replayed")) {
      INFO(value["error"].get<std::string>());
      CHECK(value["ok"] == true);
      json a = value, b = run[name];
      a.erase("replayed");
      b.erase("replayed");
      CHECK(a == b);
    } else {
      CHECK(value == run[name]);
    }
  }
}

}  // namespace

// The workloads every replay mode replays: the same launch again, or at blocks laid out alike.
const char* const kReplayedAlike[] = {"vadd_again",       "vadd_moved",     "vadd_in_place_moved",
                                      "vadd_big_moved",   "gemm_moved",     "scale_moved",
                                      "handoff_moved",    "exchange_moved", "pick_moved",
                                      "pick_other_again", "pick_back"};

TEST_CASE("with the L2's page rotation a timing-only replay by translation is exact too") {
  // The rotation counts a block's pages from the block's first filed line (L2Tags::set_in), so
  // a block filed elsewhere has its lines' sets renamed as under modulo indexing: launches
  // replay by translation and relocation, and every mode gives what simulating gives (the
  // check mode also simulates each replayed launch and throws on any difference).
  const json sim = run_in_child(Mode::simulate, false, 0, true);
  const json translated = run_in_child(Mode::translate, false, 0, true);
  const json relocated = run_in_child(Mode::relocate, false, 0, true);
  const json check = run_in_child(Mode::check, false, 0, true);
  for (const json* run : {&translated, &relocated, &check}) check_same_as_simulated(sim, *run);
  // Replayed as without the rotation: the same launch, at blocks laid out alike (filed at the
  // same L2 addresses), and relocated where the lines keep their places in their blocks.
  for (const char* k : kReplayedAlike) {
    INFO(k);
    CHECK(translated[k]["replayed"] == true);
    CHECK(relocated[k]["replayed"] == true);
    CHECK(check[k]["replayed"] == true);
  }
  // Relocated: fits the L2 at any placement (vadd_offset ...), or may evict with z's block
  // filed a whole way (a page) further (vadd_big_way), which absolute pages would rotate
  // otherwise: it times as vadd_big.
  for (const char* k : {"vadd_z_block", "vadd_offset", "vadd_in_place_near", "vadd_big_way",
                        "handoff_offset", "exchange_offset"}) {
    INFO(k);
    CHECK(relocated[k]["replayed"] == true);
    CHECK(check[k]["replayed"] == true);
  }
  CHECK(sim["vadd_big_way"]["counters"] == sim["vadd_big"]["counters"]);
  // y's block filed a page further: its lines keep their sets (pages counted from its start),
  // so the second pass over x meets the same evictions as reread's, which it relocates from.
  // (Pages counted from line 0 would rotate y's partial last page elsewhere.)
  CHECK(relocated["reread_way"]["replayed"] == true);
  CHECK(sim["reread_way"]["counters"] == sim["reread"]["counters"]);
  CHECK(test::counter(sim["reread"]["counters"], "chip.l2.hits") > 0);
  CHECK(test::counter(sim["reread"]["counters"], "chip.l2.misses") > (0x1c0000 + 0x640000) / 512);
  // Not where a tensor of several pages moves to other lines of its block (its lines would
  // meet other pages' offsets): x one line further in its block, y behind x in a shared block.
  const json& log = relocated["replay_log"];
  for (const char* k :
       {"vadd_big_offset", "vadd_big_shared", "vadd_big_shared_offset", "reread_sets_moved"}) {
    INFO(k);
    CHECK(relocated[k]["replayed"] == false);
    CHECK(log.value(k, "").find("to other lines of its block's rotated L2 pages") !=
          std::string::npos);
  }
}

TEST_CASE("a timing-only replay by translation gives exactly what simulating gives") {
  const json sim = run_in_child(Mode::simulate);
  const json translated = run_in_child(Mode::translate);
  const json relocated = run_in_child(Mode::relocate);
  const json check = run_in_child(Mode::check);  // throws on any difference
  for (const json* run : {&translated, &relocated, &check}) check_same_as_simulated(sim, *run);
  for (const auto& [name, value] : sim.items())
    if (value.is_object() && value.contains("replayed")) CHECK(value["replayed"] == false);
  // Replayed: the same launch, and the same launch at blocks laid out alike, also one that
  // overflows the L2 and the cube kernel; not where a block's size, an argument's offset in
  // its block or the sharing of blocks differ.
  for (const char* k : kReplayedAlike) {
    INFO(k);
    CHECK(translated[k]["replayed"] == true);
    CHECK(relocated[k]["replayed"] == true);
    CHECK(check[k]["replayed"] == true);
  }
  for (const char* k : {"vadd",
                        "vadd_z_block",
                        "vadd_in_place",
                        "vadd_offset",
                        "vadd_offset_256",
                        "vadd_in_place_near",
                        "vadd_big",
                        "vadd_big_offset",
                        "vadd_big_way",
                        "vadd_big_shared_offset",
                        "vadd_big_shared",
                        "reread",
                        "reread_sets_moved",
                        "reread_skewed",
                        "gemm",
                        "scale",
                        "handoff",
                        "handoff_offset",
                        "exchange",
                        "exchange_offset",
                        "pick",
                        "pick_other"}) {
    INFO(k);
    CHECK(translated[k]["replayed"] == false);
  }
  for (const json* run : {&relocated, &check}) {
    CHECK((*run)["pick"]["replayed"] == false);
    CHECK((*run)["pick_other"]["replayed"] == false);
  }
  // The gather's timing follows its loads: with other idx bytes it copies 6 rows, not 3.
  CHECK(sim["pick_other"]["cycles"] > sim["pick"]["cycles"]);
  CHECK(sim["pick_moved"]["counters"] == sim["pick"]["counters"]);
  CHECK(sim["pick_back"]["counters"] == sim["pick_other"]["counters"]);
  // Relocation also replays a launch at another offset in its block (a multiple of the line),
  // in a block of another size, or sharing a block on lines of its own, and one that may evict
  // whose tensors' lines all move by the same number of sets; not where it could evict with
  // lines moved to other sets unlike, an offset moved by part of a line, or arguments that
  // share lines then or now.
  for (const char* k :
       {"vadd_z_block", "vadd_offset", "vadd_in_place_near", "vadd_packed_offset",
        "vadd_big_offset", "vadd_big_way", "vadd_big_shared", "vadd_big_shared_offset",
        "reread_sets_moved", "handoff_offset", "exchange_offset"}) {
    INFO(k);
    CHECK(relocated[k]["replayed"] == true);
    CHECK(check[k]["replayed"] == true);
  }
  for (const char* k :
       {"vadd", "vadd_in_place", "vadd_offset_256", "vadd_big", "reread", "reread_skewed",
        "vadd_packed", "vadd_packed_large_block", "gemm", "scale", "handoff", "exchange"}) {
    INFO(k);
    CHECK(relocated[k]["replayed"] == false);
  }
  // The in-place launch really times differently (its stores hit the loaded lines).
  CHECK(sim["vadd_in_place"]["counters"] != sim["vadd"]["counters"]);
  // So does the skewed reread (y's lines meet x's in other sets: fewer misses), so a replay
  // from reread's recording would be wrong; the one whose sets move alike times as reread.
  CHECK(test::counter(sim["reread_skewed"]["counters"], "chip.l2.misses") <
        test::counter(sim["reread"]["counters"], "chip.l2.misses"));
  CHECK(sim["reread_sets_moved"]["counters"] == sim["reread"]["counters"]);
  CHECK(sim["vadd_big_way"]["counters"] == sim["vadd_big"]["counters"]);
  CHECK(sim["vadd_big_shared"]["counters"] == sim["vadd_big"]["counters"]);
  CHECK(sim["vadd_big_shared_offset"]["counters"] == sim["vadd_big"]["counters"]);
  // The mix kernel's vector cores really wait on the cube core (the flags move its timing).
  CHECK(test::counter(sim["handoff"]["counters"], "chip.aiv0.s.stall.cross_core_wait") > 0);

  // The replay log names how each launch was replayed, or why it was simulated: kernel,
  // blocks, cycles (checked), host CPU time, then the verdict.
  const json& log = relocated["replay_log"];
  const auto verdict = [&](const char* k) {
    INFO(k);
    std::vector<std::string> fields;
    std::string line = log.value(k, "");
    for (size_t at = 0; fields.size() < 4 && (at = line.find('\t')) != std::string::npos;
         line.erase(0, at + 1))
      fields.push_back(line.substr(0, at));
    REQUIRE(fields.size() == 4);
    CHECK(fields[2] == std::to_string(relocated[k]["cycles"].get<uint64_t>()));
    return line;
  };
  CHECK(verdict("vadd") ==
        "simulated\tno recording of its program, untyped arguments and block count; recorded, "
        "relocatable");
  CHECK(verdict("vadd_again") == "replayed\ttranslated, its own key");
  CHECK(verdict("vadd_moved") == "replayed\ttranslated, other addresses in blocks laid out alike");
  CHECK(verdict("vadd_offset") == "replayed\trelocated");
  CHECK(verdict("vadd_offset_256") ==
        "simulated\tother block layout: argument 0 at another offset modulo the L2 line (256 "
        "against 0); recorded, relocatable");
  CHECK(verdict("vadd_in_place") ==
        "simulated\tother block layout: arguments 0 and 2 share L2 lines differently; "
        "recorded, relocatable");
  CHECK(verdict("vadd_big") ==
        "simulated\tno recording of its program, untyped arguments and block count; recorded, "
        "may evict (24 L2 ways of 16), relocatable where its sets move alike");
  CHECK(verdict("vadd_big_offset") == "replayed\trelocated, its L2 sets moved alike");
  CHECK(verdict("vadd_big_way") == "replayed\trelocated, its L2 sets moved alike");
  CHECK(verdict("vadd_big_shared_offset") == "replayed\trelocated, its L2 sets moved alike");
  CHECK(verdict("reread_sets_moved") == "replayed\trelocated, its L2 sets moved alike");
  CHECK(verdict("reread_skewed") ==
        "simulated\tother block layout: may evict: its spans need 17 L2 ways of 16 at some "
        "placement, and arguments 0 and 1 move by other numbers of L2 sets (0 and 512); "
        "recorded, may evict (17 L2 ways of 16), relocatable where its sets move alike");
  CHECK(verdict("vadd_packed") ==
        "simulated\tno recording of its program, untyped arguments and block count; recorded, "
        "relocatable");
  CHECK(verdict("vadd_packed_offset") == "replayed\trelocated");
  CHECK(verdict("vadd_packed_large_block") ==
        "simulated\tother block layout: may evict: its blocks may put 18 lines in an L2 set of "
        "16 ways, "
        "and arguments 0 and 1 move by other numbers of L2 sets (1 and 0); recorded, may evict "
        "(18 L2 ways of 16), relocatable where its sets move alike");
  CHECK(verdict("gemm_moved") == "replayed\ttranslated, other addresses in blocks laid out alike");
  CHECK(verdict("handoff") ==
        "simulated\tno recording of its program, untyped arguments and block count; recorded, "
        "relocatable");
  CHECK(verdict("handoff_moved") ==
        "replayed\ttranslated, other addresses in blocks laid out alike");
  CHECK(verdict("handoff_offset") == "replayed\trelocated");
  CHECK(verdict("pick") ==
        "simulated\tno recording of its program, untyped arguments and block count; recorded, "
        "relocatable");
  CHECK(verdict("pick_moved") ==
        "replayed\ttranslated, other addresses in blocks laid out alike, its loads read as "
        "recorded");
  CHECK(verdict("pick_other") ==
        "simulated\tits recordings loaded other bytes: argument 1 holds other bytes where the "
        "recorded launch loaded (16 at offset 0); recorded, relocatable");
  CHECK(verdict("pick_other_again") ==
        "replayed\ttranslated, its own key, its loads read as recorded");
  CHECK(verdict("pick_back") ==
        "replayed\ttranslated, other addresses in blocks laid out alike, its loads read as "
        "recorded");
}

// In a functional simulator, translation stands in for the check of a launch at other
// addresses (or under its own key, with ld): the replay walks its blocks at its own arguments.
TEST_CASE("a functional replay by translation gives exactly what simulating gives") {
  const json sim = run_in_child(Mode::simulate, true);
  const json relocated = run_in_child(Mode::relocate, true);
  const json check = run_in_child(Mode::check, true);  // throws on any difference
  for (const json* run : {&relocated, &check}) check_same_as_simulated(sim, *run);
  // The outputs were computed (vadd: x + y of the patterns), not left as filled.
  CHECK(sim["vadd_moved_out"] != sim["vadd_out"]);
  const json& log = relocated["replay_log"];
  const auto verdict = [&](const char* k) {
    std::string line = log.value(k, "");
    for (int field = 0; field < 4 && !line.empty(); ++field)
      line.erase(0, line.find('\t') == std::string::npos ? line.size() : line.find('\t') + 1);
    return line;
  };
  for (const char* k : {"vadd_moved", "vadd_in_place_moved", "gemm_moved", "scale_moved"}) {
    INFO(k);
    CHECK(verdict(k) == "replayed\ttranslated, other addresses in blocks laid out alike");
    CHECK(check[k]["replayed"] == true);
  }
  CHECK(verdict("vadd_again") == "replayed\ttranslated, its own key");
  CHECK(verdict("vadd_offset") == "replayed\trelocated");
  // Programs with cross-core flags replay too, their effects in the recorded order across the
  // cores (RecordedLaunch::effect_cores).
  for (const char* k : {"handoff_moved", "exchange_moved"}) {
    INFO(k);
    CHECK(verdict(k) == "replayed\ttranslated, other addresses in blocks laid out alike");
    CHECK(check[k]["replayed"] == true);
  }
  for (const char* k : {"handoff_offset", "exchange_offset"}) {
    INFO(k);
    CHECK(verdict(k) == "replayed\trelocated");
    CHECK(check[k]["replayed"] == true);
  }
  for (const char* k : {"handoff_again", "exchange_again", "handoff_again2", "exchange_again2"}) {
    INFO(k);
    CHECK(verdict(k) == "replayed\ttranslated, its own key");
    CHECK(check[k]["replayed"] == true);
  }
  for (const char* k : {"handoff", "exchange"}) {
    INFO(k);
    CHECK(verdict(k) ==
          "simulated\tno recording of its program, untyped arguments and block count; recorded, "
          "relocatable");
    CHECK(relocated[k]["replayed"] == false);
  }
  // The exchange's z holds what the other vector core wrote into y: 4 x of the other half of
  // the slice (the filled pattern, scaled twice; exact in fp16), simulated and replayed.
  for (const auto& [k, x_base] : {std::pair<std::string, uint64_t>{"exchange", 0xc000000},
                                  {"exchange_moved", 0xc340000},
                                  {"exchange_offset", 0xc800000},
                                  {"exchange_again2", 0xc000000}}) {
    INFO(k);
    const auto x = [&](size_t i) {
      return static_cast<float>((i * 7 + x_base / 512) % 61) * 0.125f - 3.0f;
    };
    std::vector<uint16_t> want(4096);
    for (size_t b = 0; b < 2; ++b)
      for (size_t half = 0; half < 2; ++half)
        for (size_t j = 0; j < 512; ++j) {
          want[b * 1024 + half * 512 + j] = f32_to_f16(2.0f * x(b * 1024 + half * 512 + j));
          want[2048 + b * 1024 + half * 512 + j] =
              f32_to_f16(4.0f * x(b * 1024 + (1 - half) * 512 + j));
        }
    for (const json* run : {&sim, &relocated, &check}) {
      const std::vector<uint16_t> got = (*run)[k + "_out"].get<std::vector<uint16_t>>();
      REQUIRE(got.size() >= want.size());
      CHECK(std::vector<uint16_t>(got.begin(), got.begin() + 4096) == want);
    }
  }
}

TEST_CASE("a functional replay in order across the cores holds its effects within a bound") {
  // With a memo of 32 KiB a replay in the recorded order may hold 1 KiB of effects, 4 of them
  // (~240 bytes each): the cross-core kernels (more effects) are simulated, with their output,
  // cycles and counters; the others still replay.
  const json sim = run_in_child(Mode::simulate, true);
  const json small = run_in_child(Mode::relocate, true, 32 * 1024);
  check_same_as_simulated(sim, small);
  const json& log = small["replay_log"];
  for (const char* k : {"handoff_moved", "exchange_moved", "handoff_again2"}) {
    INFO(k);
    const std::string line = log.value(k, "");
    INFO(line);
    CHECK(line.find("simulated\tits effects in order would take 0 MiB (more than 0 MiB)") !=
          std::string::npos);
    CHECK(small[k]["replayed"] == false);
  }
  CHECK(small["vadd_moved"]["replayed"] == true);
}

namespace {

AddressFlow flow_of(const std::string& body,
                    const std::string& args = ".arg x, f16[64]\n.arg y, f16[64]\n.arg n\n") {
  return analyze_address_flow(isa::assemble(args + ".section aiv\n" + body, "flow.s"));
}

// Each (program body, reason): the analysis refuses the program and names the reason.
void check_not_followed(const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& [code, why] : cases) {
    INFO(code);
    const AddressFlow f = flow_of(code);
    CHECK_FALSE(f.ok);
    CHECK_THAT(f.why, Catch::Matchers::Contains(why));
  }
}

}  // namespace

TEST_CASE("the address flow follows tensor addresses to the GM operands") {
  const AddressFlow vadd =
      analyze_address_flow(isa::assemble_file(test::source_dir() + "/kernels/vadd_f16.s"));
  INFO(vadd.why);
  REQUIRE(vadd.ok);
  // Every copy_gm2ub reads x (0) or y (1), every copy_ub2gm writes z (2).
  const isa::Program p = isa::assemble_file(test::source_dir() + "/kernels/vadd_f16.s");
  int loads = 0, stores = 0;
  for (size_t pc = 0; pc < p.sections[0].code.size(); ++pc) {
    const isa::Opcode op = p.sections[0].code[pc].op;
    const int k = vadd.gm_arg[0][pc];
    if (op == isa::Opcode::op_copy_gm2ub) {
      CHECK((k == 0 || k == 1));
      ++loads;
    } else if (op == isa::Opcode::op_copy_ub2gm) {
      CHECK(k == 2);
      ++stores;
    } else {
      CHECK(k == -1);
    }
  }
  CHECK(loads > 0);
  CHECK(stores > 0);
  CHECK(analyze_address_flow(isa::assemble_file(test::source_dir() + "/kernels/gemm_f16.s")).ok);
  CHECK_FALSE(vadd.cross_core);
  // Cross-core flags take immediates only: followed, and noted.
  const AddressFlow handoff = analyze_address_flow(isa::assemble(test::kHandoff, "handoff.s"));
  INFO(handoff.why);
  CHECK(handoff.ok);
  CHECK(handoff.cross_core);

  // A pointer advanced in a loop, an untyped length in the branch: follows.
  const AddressFlow loop = flow_of(
      "  ldarg x1, x\n  ldarg x2, n\n  movi x3, 0\nl:\n  copy_gm2ub x3, x1, 1, 1, 0, 0\n"
      "  add x1, x1, 32\n  sub x2, x2, 1\n  bne x2, 0, l\n  end\n");
  INFO(loop.why);
  CHECK(loop.ok);
  // Not followed, with the reason: an address in a branch, in a UB operand, scaled, mixed from
  // two tensors at a join, a GM operand from no argument, ld.
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"  ldarg x1, x\n  bne x1, 0, l\nl:\n  end\n", "bne reads tensor argument 0"},
      {"  ldarg x1, x\n  copy_gm2ub x1, x1, 1, 1, 0, 0\n  end\n",
       "copy_gm2ub reads tensor argument 0 in xdst"},
      {"  ldarg x1, x\n  shl x1, x1, 1\n  movi x3, 0\n  copy_gm2ub x3, x1, 1, 1, 0, 0\n  end\n",
       "the GM operand xsrc holds a value mixed from tensor addresses"},
      {"  ldarg x1, x\n  ldarg x2, n\n  beq x2, 0, l\n  ldarg x1, y\nl:\n  movi x3, 0\n"
       "  copy_gm2ub x3, x1, 1, 1, 0, 0\n  end\n",
       "the GM operand xsrc holds a value mixed from tensor addresses"},
      {"  movi x1, 4096\n  movi x3, 0\n  copy_gm2ub x3, x1, 1, 1, 0, 0\n  end\n",
       "the GM operand xsrc holds a value not derived from an argument"},
      {"  ldarg x1, x\n  ld x2, x1\n  bne x2, 0, l\nl:\n  end\n", "bne reads a loaded value in xa"},
      {"  ldarg x1, x\n  ld x2, x1\n  movi x3, 7\n  div x3, x3, x2\n  end\n",
       "div divides by a loaded value"},
      {"  ldarg x1, x\n  ld x2, x1\n  add x1, x1, x2\n  ld x3, x1\n  end\n",
       "the GM operand xaddr holds a value mixed from tensor addresses"},
  };
  check_not_followed(bad);
  // Steered: the last three, whose loaded values steer them, move with their tensors among
  // launches that load the same bytes (a loaded value taken as Fixed); the others do not (no
  // ld), and neither does a loaded value mixed with a tensor address in a branch. The gather
  // of the workload above loads, branches and addresses x with them.
  for (size_t i = 0; i < bad.size(); ++i) {
    INFO(bad[i].first);
    CHECK(flow_of(bad[i].first).steered == (i + 3 >= bad.size()));
  }
  const AddressFlow mixed = flow_of(
      "  ldarg x1, x\n  ld x2, x1\n  add x2, x2, x1\n"
      "  bne x2, 0, l\nl:\n  end\n");
  CHECK_FALSE(mixed.ok);
  CHECK_FALSE(mixed.steered);
  const AddressFlow pick = analyze_address_flow(isa::assemble(test::kPick, "pick.s"));
  INFO(pick.why);
  CHECK_FALSE(pick.ok);
  CHECK(pick.steered);
  CHECK_THAT(pick.why, Catch::Matchers::Contains("the GM operand xsrc holds a value mixed"));
}

TEST_CASE("the address flow follows comparisons of one tensor's addresses") {
  // Two pointers into x compared by their difference (a fixed offset) or directly (both move
  // by x's displacement: the outcome stays), a pointer against x's end: followed. So is a loop
  // that keeps its last pointer, set to x before it (the element-wise gather's row reuse,
  // adapter/compiler/ops/elementwise.cpp).
  const std::vector<std::string> good = {
      "  ldarg x1, x\n  mov x2, x1\n  add x1, x1, 64\n  sub x3, x1, x2\n  bne x3, 0, l\nl:\n"
      "  end\n",
      "  ldarg x1, x\n  mov x2, x1\n  add x2, x2, 128\nl:\n  movi x5, 0\n"
      "  copy_gm2ub x5, x1, 1, 1, 0, 0\n  add x1, x1, 32\n  blt x1, x2, l\n  end\n",
      "  ldarg x1, x\n  ldarg x4, n\n  mov x2, x1\nl:\n  bne x1, x2, s\n  movi x5, 0\n"
      "  copy_gm2ub x5, x1, 1, 1, 0, 0\n  mov x2, x1\ns:\n  add x1, x1, 32\n  sub x4, x4, 1\n"
      "  bne x4, 0, l\n  end\n",
  };
  for (const std::string& code : good) {
    INFO(code);
    const AddressFlow f = flow_of(code);
    INFO(f.why);
    CHECK(f.ok);
  }
  // Not followed: two tensors' addresses compared or subtracted, one's added to itself, and
  // the loop above without the last pointer set first (a register starts at 0 in every launch:
  // the first comparison would be of x's address with 0).
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"  ldarg x1, x\n  ldarg x2, y\n  sub x3, x1, x2\n  bne x3, 0, l\nl:\n  end\n",
       "bne reads a value mixed from tensor addresses in xa"},
      {"  ldarg x1, x\n  ldarg x2, y\n  beq x1, x2, l\nl:\n  end\n",
       "beq reads tensor argument 0 in xa"},
      {"  ldarg x1, x\n  add x3, x1, x1\n  bne x3, 0, l\nl:\n  end\n",
       "bne reads a value mixed from tensor addresses in xa"},
      {"  ldarg x1, x\n  ldarg x4, n\nl:\n  bne x1, x2, s\n  movi x5, 0\n"
       "  copy_gm2ub x5, x1, 1, 1, 0, 0\n  mov x2, x1\ns:\n  add x1, x1, 32\n  sub x4, x4, 1\n"
       "  bne x4, 0, l\n  end\n",
       "bne reads tensor argument 0 in xa"},
  };
  check_not_followed(bad);
}

namespace {

// y = 2 * x over 128 fp16 (256 bytes in one transfer each way): placed 16 bytes short of the
// end of its planned buffer, x's load reads 16 bytes past it (a tail load, as a kernel whose
// last tile runs past its tensor's end does).
const char* kTail = R"(
.arg x, f16[128]
.arg y, f16[128]
.section aiv
    ldarg x1, x
    ldarg x3, y
    movi x5, 1073741824
    movi x6, 0
    movi x7, 1024
    copy_gm2ub x6, x1, 1, 8, 0, 0
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    vmuls.f16 x7, x6, x5, 1, 1, 1, 8, 8
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    copy_ub2gm x3, x7, 1, 8, 0, 0
    end
)";

// y's bytes at x's address: x (a line) reads the second line y's load (a line, from 128 bytes
// before it) filled, wherever the cold L2 files the two.
const char* kTwoLoads = R"(
.arg x, f16[128]
.arg y, f16[128]
.section aiv
    ldarg x1, x
    ldarg x3, y
    movi x6, 0
    movi x7, 1024
    copy_gm2ub x6, x3, 1, 16, 0, 0
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    copy_gm2ub x7, x1, 1, 16, 0, 0
    set_flag mte2, v, 1
    wait_flag mte2, v, 1
    end
)";

// One launch of a program in an allocator's blocks and a static memory plan's buffers
// (KernelLaunch::planned_blocks: the cold L2 files an address in one that starts on a line by
// that buffer).
struct PlannedLaunch {
  std::string name;
  Blocks blocks;
  PlannedBlocks planned;
  std::vector<uint64_t> args;
};

// Timing-only launches of `source` (one block each) on the tiny chip, in `mode`, as `launches`
// lay them out; per launch its results and, in the translating modes, the replay log's verdict
// (out["replay_log"][name]).
json planned_workload(Mode mode, const char* source, const std::vector<PlannedLaunch>& launches) {
  unsetenv("NPUSIM_REPLAY");
  unsetenv("NPUSIM_REPLAY_TRANSLATED");
  unsetenv("NPUSIM_REPLAY_RELOCATE");
  unsetenv("NPUSIM_REPLAY_LOG");
  SimOptions opts;
  opts.functional = false;
  opts.replay = mode == Mode::check ? SimOptions::Replay::check : SimOptions::Replay::off;
  opts.replay_translated = mode != Mode::simulate;
  opts.replay_relocate = mode == Mode::relocate || mode == Mode::check;
  const std::string replay_log = (std::filesystem::temp_directory_path() /
                                  ("npusim_planned_log_" + std::to_string(getpid()) + ".tsv"))
                                     .string();
  std::filesystem::remove(replay_log);
  if (mode != Mode::simulate) opts.replay_log = replay_log;
  std::ifstream replay_lines;
  Simulator sim(load_chip_config("tiny"), opts);
  const isa::Program program = isa::assemble(source, "planned.s");
  json out;
  for (const PlannedLaunch& p : launches) {
    KernelLaunch l;
    l.program = &program;
    l.args = p.args;
    l.block_dim = 1;
    l.gm_blocks = lookup(&p.blocks);
    l.planned_blocks = p.planned;
    const KernelResult r = sim.run(l);
    out[p.name] = {{"ok", r.ok},
                   {"error", r.error},
                   {"cycles", r.cycles},
                   {"start", r.start_cycle},
                   {"counters", r.counters},
                   {"replayed", r.replayed},
                   {"now", sim.now_cycles()}};
    if (mode == Mode::simulate) continue;
    if (!replay_lines.is_open()) replay_lines.open(replay_log);
    replay_lines.clear();
    std::string text;
    std::getline(replay_lines, text);
    // The verdict: the fields after kernel, blocks, cycles and CPU time.
    for (int f = 0; f < 4 && text.find('\t') != std::string::npos; ++f)
      text.erase(0, text.find('\t') + 1);
    out["replay_log"][p.name] = text;
  }
  out["totals"] = sim.counters();
  std::filesystem::remove(replay_log);
  return out;
}

const uint64_t kTinyLine = 512;  // the tiny chip's L2 line: planned buffers start on one

// Launches of kTail whose x lies in a buffer a static memory plan placed in an arena, its
// load's tail in the next planned buffer.
json tail_workload(Mode mode) {
  const uint64_t line = kTinyLine;
  std::vector<PlannedLaunch> launches;
  // An arena at `arena` of 8 lines planning x's buffer (one line), the next one (`next_bytes`)
  // and y's (two lines); x 16 bytes short of a 256-byte load before its buffer's end. y at `y`
  // (default: its planned buffer), in the arena or in a block of its own of `y_bytes`.
  auto run = [&](const std::string& name, uint64_t arena, uint64_t next_bytes, uint64_t y = 0,
                 uint64_t y_bytes = 0) {
    PlannedLaunch l{name, {}, {}, {}};
    l.blocks[arena] = 8 * line;
    if (y == 0) y = arena + 4 * line;
    if (y >= arena + 8 * line) l.blocks[y] = y_bytes;
    l.args = {arena + line - 240, y};
    l.planned = {{arena, line}, {arena + line, next_bytes}, {arena + 4 * line, 2 * line}};
    launches.push_back(std::move(l));
  };
  const uint64_t a = 0x1000000, b = 0x2000000;
  run("tail", a, line);
  run("tail_again", a, line);                           // the same launch
  run("tail_y_moved", a, line, a + 0x10000, 2 * line);  // y in a block of its own, x as was
  run("tail_arena_moved", b, line);                     // the whole arena elsewhere: x moved
  run("tail_next_larger", a, 2 * line);  // the bytes past x in a buffer of another size
  // y in the buffer the tail reads (a line): then y elsewhere in a block of a line, the tail's
  // buffer no argument's.
  run("tail_into_y", a, line, a + line);
  run("tail_into_y_again", a, line, a + line);
  run("tail_into_y_moved", a, line, a + 0x20000, line);
  return planned_workload(mode, kTail, launches);
}

// Launches of kTwoLoads whose blocks overlap: x in a planned buffer (a line) of an arena of 8
// lines, y in the arena's unplanned part (its block the arena), its load from 128 bytes before
// the arena's fifth line. Keyed by blocks and offsets alone both lie alike wherever x's buffer
// is in the arena, but the cold L2 files x's buffer inside the arena y touched first: x's line
// is y's second where the buffer is the arena's fifth line, another line elsewhere.
json overlap_workload(Mode mode) {
  const uint64_t line = kTinyLine;
  std::vector<PlannedLaunch> launches;
  // x's buffer at line `x_line` of the arena at `arena`.
  auto run = [&](const std::string& name, uint64_t arena, uint64_t x_line) {
    const uint64_t x = arena + x_line * line;
    launches.push_back({name, {{arena, 8 * line}}, {{x, line}}, {x, arena + 4 * line - 128}});
  };
  const uint64_t a = 0x1000000, b = 0x2000000;
  run("apart", a, 1);
  run("apart_again", a, 1);
  run("apart_arena_moved", b, 1);  // the whole arena elsewhere, x's buffer where it was in it
  run("x_in_y_line", a, 4);        // x's buffer in y's second line: x hits
  run("x_in_y_line_again", a, 4);
  run("x_in_y_line_arena_moved", b, 4);
  run("apart_after", b, 6);  // apart again, x's buffer elsewhere in the arena
  return planned_workload(mode, kTwoLoads, launches);
}

// `workload`'s runs in every mode (by Mode), each translating mode's checked equal to simulating
// launch by launch (the check mode also throws on any difference).
std::map<Mode, json> planned_runs(json (*workload)(Mode)) {
  std::map<Mode, json> runs;
  for (Mode mode : {Mode::simulate, Mode::translate, Mode::relocate, Mode::check})
    runs[mode] =
        json::parse(test::run_in_child([workload, mode] { return workload(mode).dump(); }));
  for (Mode mode : {Mode::translate, Mode::relocate, Mode::check}) {
    json a = runs[mode];
    a.erase("replay_log");
    check_same_as_simulated(runs[Mode::simulate], a);
  }
  return runs;
}

// Which of `run`'s launches were replayed and which simulated.
void check_replayed(const json& run, std::initializer_list<const char*> replayed,
                    std::initializer_list<const char*> simulated) {
  for (const char* k : replayed) {
    INFO(k);
    CHECK(run[k]["replayed"] == true);
  }
  for (const char* k : simulated) {
    INFO(k);
    CHECK(run[k]["replayed"] == false);
  }
}

}  // namespace

TEST_CASE("a launch reading past its planned buffer replays where the arena lies as recorded") {
  std::map<Mode, json> runs = planned_runs(tail_workload);
  const json &translated = runs[Mode::translate], &check = runs[Mode::check];
  // Replayed by translation where x and the buffers its tail reads lie as recorded (y anywhere
  // in a block laid out alike); simulated where x moved, the tail's buffer differs, or an
  // argument's block is the tail's buffer then and not now. (The check mode's walking replay
  // may also replay those after a check by walking them: not asserted.)
  for (Mode mode : {Mode::translate, Mode::relocate})
    check_replayed(
        runs[mode], {"tail_again", "tail_y_moved", "tail_into_y_again"},
        {"tail", "tail_arena_moved", "tail_next_larger", "tail_into_y", "tail_into_y_moved"});
  const json& log = translated["replay_log"];
  CHECK(log["tail"] ==
        "simulated\tno recording of its program, untyped arguments and block count; recorded, 1 "
        "argument(s) pinned at their addresses (a GM range past its argument's block)");
  CHECK(log["tail_again"] == "replayed\ttranslated, its own key");
  CHECK(log["tail_y_moved"] == "replayed\ttranslated, other addresses in blocks laid out alike");
  CHECK(log["tail_arena_moved"].get<std::string>().rfind(
            "simulated\tin blocks laid out alike: its ranges past an argument's block differ: "
            "argument 0 moved",
            0) == 0);
  CHECK(log["tail_next_larger"].get<std::string>().find("lie in another block") !=
        std::string::npos);
  CHECK(log["tail_into_y_moved"].get<std::string>().find(
            "argument 1 lies beside the block at 0x1000200 that a range past an argument's block "
            "reads, in it in the recording") != std::string::npos);
  check_replayed(check, {"tail_again", "tail_y_moved", "tail_into_y_again"}, {});
}

TEST_CASE("a launch whose arguments' blocks overlap replays only where they lie as recorded") {
  std::map<Mode, json> runs = planned_runs(overlap_workload);
  // The workload tells the two layouts apart: x hits y's line in one, misses in the other.
  CHECK(runs[Mode::simulate]["apart"]["counters"] !=
        runs[Mode::simulate]["x_in_y_line"]["counters"]);
  // Replayed where the overlapping blocks lie at their recorded addresses; simulated where x's
  // buffer lies elsewhere in y's block, or the arena moved (its blocks keyed by address).
  for (Mode mode : {Mode::translate, Mode::relocate})
    check_replayed(
        runs[mode], {"apart_again", "x_in_y_line_again"},
        {"apart", "apart_arena_moved", "x_in_y_line", "x_in_y_line_arena_moved", "apart_after"});
  CHECK(runs[Mode::translate]["replay_log"]["apart"] ==
        "simulated\tno recording of its program, untyped arguments and block count; recorded, "
        "its overlapping blocks keyed by address");
}
