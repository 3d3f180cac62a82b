// Subcommands implemented by a Python script of the source tree (`npusim sweep`, `npusim explore`,
// `npusim validate`):
// npusim parses nothing after the subcommand's name and hands every argument over (exec) to
// the script, run with the Python the report plots use (prof::find_report_python; else python3
// on PATH), with `--npusim <this binary>` so that every point runs the binary that was invoked.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace npusim::cli {

// Adds subcommand `name` to `app`; the script (relative to the source tree) gets its arguments.
// `npusim NAME --help` prints the script's own help.
CLI::App* add_script_subcommand(CLI::App& app, const std::string& name,
                                const std::string& description);

// Runs the script of a parsed script subcommand; returns only if it cannot (throws Error).
int run_script_subcommand(CLI::App* sub, const std::string& script);

}  // namespace npusim::cli
