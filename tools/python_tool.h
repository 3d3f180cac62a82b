// Subcommands implemented by a Python script of the source tree (npusim sweep, npusim validate).
#pragma once

#include <string>
#include <vector>

namespace npusim::cli {

// Replaces this process (exec) with `PYTHON <source dir>/SCRIPT ARGS... --npusim <this binary>`,
// PYTHON being the one the report plots use (prof::find_report_python; else python3 on PATH).
// Returns only by throwing Error naming COMMAND when the script cannot be started.
[[noreturn]] void exec_python_tool(const std::string& command, const std::string& script,
                                   std::vector<std::string> args);

}  // namespace npusim::cli
