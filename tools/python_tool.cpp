#include "tools/python_tool.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <iostream>

#include "adapter/profiler/report_writer.h"
#include "common/error.h"
#include "tools/kernel_io.h"

namespace npusim::cli {
namespace {

std::string this_executable(const std::string& command) {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error(command + ": cannot find this executable's path (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

void exec_python_tool(const std::string& command, const std::string& script,
                      std::vector<std::string> args) {
  const std::string path = source_dir() + "/" + script;
  std::string python = prof::find_report_python(source_dir());
  if (python.empty()) python = "python3";
  args.insert(args.begin(), {python, path});
  args.insert(args.end(), {"--npusim", this_executable(command)});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  execvp(argv[0], argv.data());
  throw Error(
      fmt::format("{}: cannot run '{} {}': {} (set NPUSIM_PYTHON or create .venv "
                  "with scripts/setup.sh)",
                  command, python, path, std::strerror(errno)));
}

}  // namespace npusim::cli
