// `npusim demo`: the main job on a built-in default. Runs the hand-written kernels in kernels/
// (a double-buffered fp16 GEMM on every cube core, a vector add on every vector core) on a chip,
// checks their results against a host reference and prints the counter summary.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace npusim::cli {

struct DemoOptions {
  std::string chip = "910b";
  std::vector<std::string> overrides;
  std::string counters_path, trace_path;
  std::string report_dir;  // write the report folder (docs/reports.md), the two kernels as two ops
  bool timing_only = false;
  // Then run the two kernels again at once (Simulator::run_concurrent: the GEMM on the cube
  // cores beside the vector add on the vector cores) and print alone / sequence / concurrent
  // cycles; functional: their outputs must equal the lone runs'.
  bool concurrent = false;
};

// Returns the process exit code (0 when both kernels ran and matched the reference).
int run_demo(const DemoOptions& o, std::ostream& out);

}  // namespace npusim::cli
