// The chain of vector adds the tests of the L2 a concurrent group's launches start with use
// (test_sim_concurrent_l2_state*.cpp): A (z = x + y) on aiv0-1, B (w = z + y) after A on the
// same cores, reading A's operand y and its output z.
#pragma once

#include <string>
#include <vector>

#include "isa/assembler.h"
#include "tests/sim/sim_test_util.h"

namespace npusim::test::l2_chain {

inline const isa::Program& vadd() {
  static const isa::Program p = isa::assemble_file(source_dir() + "/kernels/vadd_f16.s");
  return p;
}

// x, y: A's operands, z = x + y (A), w = z + y (B), v: a third output: kN fp16 each, each in
// its own lines.
constexpr uint64_t kN = 32768;
constexpr uint64_t kBytes = kN * 2;
constexpr uint64_t kX = 0x1000000, kY = 0x1100000, kZ = 0x1200000, kW = 0x1300000;
constexpr uint64_t kV = 0x1400000;
inline const std::vector<std::string> kPair = {"aiv0", "aiv1"};

inline KernelLaunch in_run(KernelLaunch l, uint64_t run) {
  l.l2_run = run;
  return l;
}

inline ConcurrentLaunch in_run(ConcurrentLaunch l, uint64_t run) {
  l.launch.l2_run = run;
  return l;
}

// A and B alone (Simulator::run), of graph run `run` (0: none).
inline KernelLaunch launch_a(uint64_t run = 0) {
  return in_run(kernel_launch(vadd(), {kX, kY, kZ, kN}, 2), run);
}
inline KernelLaunch launch_b(uint64_t run = 0) {
  return in_run(kernel_launch(vadd(), {kZ, kY, kW, kN}, 2), run);
}

// The group: A on aiv0-1, B after A on the same cores, both of graph run `run` (0: none).
inline ConcurrentResult chain(Simulator& sim, uint64_t run) {
  return sim.run_concurrent(
      {in_run(concurrent_launch(vadd(), {kX, kY, kZ, kN}, 2, kPair), run),
       in_run(concurrent_launch(vadd(), {kZ, kY, kW, kN}, 2, kPair, {0}), run)});
}

}  // namespace npusim::test::l2_chain
