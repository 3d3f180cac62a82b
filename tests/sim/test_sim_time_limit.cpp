// A launch that would run simulated time past SystemC's range (on a chip at the slowest rates
// the config accepts) is stopped with an error before kSimTimeLimitPs, instead of wrapping
// around or hanging; later launches run in the time that remains. Its own executable: it
// spends nearly all of this Simulator's simulated time.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/error.h"
#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "sim/core/core_env.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::launch;

TEST_CASE("a launch reaching the end of simulated time faults, and the simulator says why") {
  // GM -> UB at 2^-20 bytes per cycle (the slowest accepted), hits and misses alike.
  const std::string slowest = "9.5367431640625e-07";
  Simulator sim(load_chip_config("tiny", {"paths.gm->ub.bytes_per_cycle=" + slowest,
                                          "memory.l2.core_read_bytes_per_cycle=" + slowest}),
                SimOptions{});
  // An endless loop of 192 KiB copies: each takes 192 KiB x 2^20 = 2^37.6 cycles (2^47.6 ps),
  // so simulated time passes 2^63 ps after ~40,000 copies, long before the watchdog.
  const isa::Program p = isa::assemble(R"(
.arg src
.section aiv
    ldarg x1, src
    movi x2, 0
spin:
    copy_gm2ub x2, x1, 1, 6144, 0, 0
    jmp spin
    end
)", "slow.s");
  KernelResult r = launch(sim, p, {0x100000}, 1);
  CHECK_FALSE(r.ok);
  CHECK_THAT(r.error, Catch::Contains("simulated time would pass 9223372036854775808 ps") &&
                          Catch::Contains("2^64 ps"));
  // Time stopped within one copy of the limit (it did not wrap or run on).
  const uint64_t copy_cycles = uint64_t{192 * 1024} << 20;
  CHECK(sim.now_cycles() <= kSimTimeLimitPs / 1000);
  CHECK(sim.now_cycles() + 2 * copy_cycles > kSimTimeLimitPs / 1000);
  // A short launch and a copy still run in the time that remains.
  const isa::Program end = isa::assemble(".section aiv\n    end\n", "end.s");
  CHECK(launch(sim, end, {}, 1).ok);
  const std::vector<uint8_t> bytes(64, 1);
  CHECK_NOTHROW(sim.copy_host_to_device(0x100000, bytes.data(), bytes.size()));
}
