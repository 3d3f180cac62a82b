// `npusim validate`: published measurements of Ascend silicon reproduced on the chip presets
// (tools/npusim_validate.py does the work; docs/validation.md).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace npusim::cli {

struct ValidateOptions {
  std::string cases, json;
  std::vector<std::string> only, sets;
  bool list = false;
};

// Registers the subcommand and its options on APP.
CLI::App* add_validate_command(CLI::App& app, ValidateOptions& o);

// Hands over to tools/npusim_validate.py; returns only by throwing Error.
[[noreturn]] void run_validate(const ValidateOptions& o);

}  // namespace npusim::cli
