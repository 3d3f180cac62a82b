// `npusim op`: compile one TensorFlow op with the kernel compiler (no TensorFlow needed) and run
// it on a chip: per-launch figures, the op's roofline bound, compile and wall time.
//   npusim op MatMul --input f16:4096x4096 --input f16:4096x4096 --chip 910b --timing-only
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "sim/simulator.h"

namespace npusim::cli {

struct OpOptions {
  std::string op;                      // TF op type, e.g. "MatMul"
  // Per input: DTYPE:SHAPE (random data, e.g. "f32:8x3"; "s32:" is a scalar) or a .npy file.
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;    // .npy files the op's outputs are written to, in order
  std::vector<std::string> attrs;      // NAME=VALUE (int, float, true/false, [1,2], or a string)
  std::string chip = "910b";
  std::vector<std::string> overrides;
  std::string precision = "allow_fp32_to_fp16";
  bool timing_only = false;
  bool listing = false;                // print each launch's generated assembly
  std::string report_dir;
  std::string json_path;               // write the figures as JSON (benchmarks read it)
  std::string trace_path;              // write a Chrome-trace timeline of all launches
  // Ops run before the op on the same chip, each "OP:SPEC[,SPEC...]" (its inputs as DTYPE:SHAPE,
  // random data), e.g. "ZerosLike:f32:50331648": what a benchmark harness ran just before the
  // measured op (a cache flush). Their launches are simulated but not counted in the op's
  // figures, JSON or report; they matter only through the state they leave, i.e. the L2 when
  // the chip keeps it across launches (memory.l2.keep_across_launches, write_back).
  std::vector<std::string> before;
  // --host-loop N: the op called N times back to back by an eager host loop, as a benchmark that
  // times N framework calls between two device synchronizes (e.g. a torch.mm loop): each call's
  // host issue costs host.op_dispatch_us, the host runs ahead of the device, and the loop's time
  // (first issue to last launch's end) and its time per call are printed and in the JSON's
  // "host_loop". The op's other figures, launches and report are of the loop's first call.
  // --host-warmup W: W calls before the loop (the device synchronised after them), not counted.
  // With the L2 cold at every launch the calls are alike and only the first is simulated; with
  // memory.l2.keep_across_launches every warm-up and call runs.
  int host_loop = 0;
  int host_warmup = 0;
  uint64_t max_insns_per_block = SimOptions{}.max_insns_per_block;  // the watchdog
};

// Returns the exit code. Throws npusim::Error for bad options (unknown op, bad spec, ...).
int run_op(const OpOptions& o, std::ostream& out);

}  // namespace npusim::cli
