// What a core's run did that its timing depends on, reduced to two hashes built in execution
// order: `flow` over the pcs the scalar unit executed (its control flow, hence its issue slots),
// `cost` over each executed pipe instruction's cost (sim/exec/exec.h: plan()) apart from GM
// addresses. Two runs of a program with equal fingerprints and GM accesses that differ only by
// an address translation the L2 cannot tell apart (sim/replay/launch_replay.h) take the same
// cycles. Shared by the recording (sim/replay/core_recording.h) and the replay (verifying).
#pragma once

#include <cstdint>
#include <cstring>

#include "sim/chip/l2_tags.h"
#include "sim/exec/exec.h"

namespace npusim {

struct CoreFingerprint {
  uint64_t flow = 0x243f6a8885a308d3ull, cost = 0x13198a2e03707344ull;
  bool operator==(const CoreFingerprint& o) const { return flow == o.flow && cost == o.cost; }
  bool operator!=(const CoreFingerprint& o) const { return !(*this == o); }

  static uint64_t mix(uint64_t h, uint64_t v) {
    h = (h ^ v) * 0x9fb21c651e98df25ull;
    return h ^ (h >> 31);
  }
  void add_pc(uint32_t pc) { flow = mix(flow, pc); }
  void add_cost(uint32_t pc, const ExecCost& c) {
    uint64_t rate, request_rate, issue;
    std::memcpy(&rate, &c.gm_core_rate, sizeof rate);
    std::memcpy(&request_rate, &c.gm_request_rate, sizeof request_rate);
    // (the bursts behind gm_issue_cycles depend on GM addresses modulo 512: a translated
    // replay whose addresses cut other bursts differs here and is simulated)
    std::memcpy(&issue, &c.gm_issue_cycles, sizeof issue);
    cost = mix(cost, pc);
    cost = mix(cost, c.cycles);
    cost = mix(cost, c.bank_conflict_cycles);
    cost = mix(cost, (static_cast<uint64_t>(c.path_src) << 8) | static_cast<uint64_t>(c.path_dst));
    cost = mix(cost, c.bytes);
    cost = mix(cost, c.macs);
    cost = mix(cost, c.vector_repeats);
    cost = mix(cost, rate);
    cost = mix(cost, request_rate);
    cost = mix(cost, issue);
    cost = mix(cost, c.gm.size());
    for (const GmAccess& a : c.gm)
      cost = mix(cost, a.bytes * 8 + static_cast<uint64_t>(a.l2) * 2 + (a.write ? 1 : 0));
  }
};

// The L2's outcomes for the GM ranges of a launch, hashed in the order the memory system looked
// them up: equal for two launches iff (up to collisions) every range hit and missed the same
// bytes and lines, so the memory system timed their transfers the same (and counted the same
// BYPASS lines: a bypassing range moved within a line may cover another number of them).
inline constexpr uint64_t kL2FingerprintSeed = 0xa4093822299f31d0ull;
inline uint64_t l2_fingerprint(uint64_t h, const L2Outcome& o) {
  h = CoreFingerprint::mix(h, o.hit_bytes);
  h = CoreFingerprint::mix(h, o.miss_bytes);
  h = CoreFingerprint::mix(h, o.hit_lines);
  h = CoreFingerprint::mix(h, o.absorbed_bytes);
  h = CoreFingerprint::mix(h, o.writeback_bytes);
  h = CoreFingerprint::mix(h, o.fill_bytes);
  h = CoreFingerprint::mix(h, o.bypass_lines);
  return CoreFingerprint::mix(h, o.miss_lines);
}

}  // namespace npusim
