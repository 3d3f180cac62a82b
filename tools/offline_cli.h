// `npusim compile` and `npusim infer`: offline models, as Ascend's ATC and its runner
// (docs/graph_engine.md).
//   npusim compile SAVED_MODEL_DIR|GRAPH.json --chip 910b [--input-shape x:1,224,224,3] -o m.om
//   npusim infer m.om --input x.npy --output y.npy [--loop N] [--report-dir DIR]
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "sim/simulator.h"

namespace npusim::cli {

struct CompileOptions {
  std::string model;   // a SavedModel folder, or a graph.json in the engine's format
  std::string output;  // the .om to write
  std::string chip = "910b";
  std::vector<std::string> overrides;
  std::vector<std::string> input_shapes;  // NAME:D0,D1,... (the frontend's --input-shape)
  std::string signature = "serving_default";
  std::string precision = "allow_fp32_to_fp16";
  bool fusion = true;
  bool estimate = true;     // simulate one inference (timing only) for the estimated time
  std::string report_path;  // write the compile report as JSON
};

struct InferOptions {
  std::string model;
  std::vector<std::string> inputs;   // [NAME=]FILE.npy, in the model's input order
  std::vector<std::string> outputs;  // [NAME=]FILE.npy
  std::string chip;                  // if given, must be the model's chip
  std::vector<std::string> overrides;
  int loop = 1;
  std::string report_dir;
  std::string json_path;    // figures as JSON (benchmarks read it)
  bool concurrent = false;  // independent tasks at once (graph::OfflineRunner::set_concurrent)
  uint64_t max_insns_per_block = SimOptions{}.max_insns_per_block;
};

// The subcommands' options (registered by tools/npusim.cpp).
void add_compile_options(CLI::App* app, CompileOptions& o);
void add_infer_options(CLI::App* app, InferOptions& o, const char* watchdog_help);

// Both return the exit code; they throw npusim::Error for bad input.
int run_compile(const CompileOptions& o, std::ostream& out);
int run_infer(const InferOptions& o, std::ostream& out);

}  // namespace npusim::cli
