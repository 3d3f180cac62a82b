// `npusim collective`: one collective alone on a system of chips, over a range of sizes, printed
// as the bus-bandwidth curve in the nccl-tests convention (size, count, type, redop, root, time,
// algbw, busbw per size; docs/multichip.md).
//   npusim collective all_reduce --system 910b-x8 --bytes 1M..1G --algo ring
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace npusim::cli {

struct CollectiveOptions {
  std::string collective;              // all_reduce, all_gather, ...
  std::string system = "910b-x8";      // preset or YAML file
  std::vector<std::string> overrides;  // system keys, or chip.<key> for the chip's
  std::string bytes = "1M..1G";        // SIZE or MIN..MAX (B, K, M, G suffixes: powers of 2)
  int factor = 2;                      // MIN, MIN x factor, ... up to MAX
  int chips = 0;                       // the first N chips; 0: all of the system
  std::string algo = "auto";
  std::string dtype = "f32";
  std::string op = "sum";
  int root = 0;
  // Move and reduce real data: inputs from exact_reduction_inputs (any reduction order gives
  // the same result, so outputs can be checked bit for bit).
  bool functional = false;
  std::string dump_dir;  // --functional: the last size's buffers as .npy
  std::string out_dir;   // results.csv, system.yaml and chip.yaml
  // The msprof-style report of every size's collective (docs/reports.md, "Communication (HCCL)
  // tasks"): op_summary.csv HCCL rows, trace.json lanes and flows, summary.txt, system.yaml.
  std::string report_dir;
};

// Adds the subcommand to `app`, filling `o` when it parses.
CLI::App* add_collective_command(CLI::App& app, CollectiveOptions& o);
// Returns the exit code. Throws npusim::Error for bad options or configs.
int run_collective_command(const CollectiveOptions& o, std::ostream& out);

}  // namespace npusim::cli
