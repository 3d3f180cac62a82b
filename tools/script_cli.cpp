#include "tools/script_cli.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <iostream>
#include <vector>

#include "adapter/profiler/report_writer.h"
#include "common/error.h"
#include "tools/kernel_io.h"

namespace npusim::cli {
namespace {

std::string this_executable() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("cannot find this executable's path (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

CLI::App* add_script_subcommand(CLI::App& app, const std::string& name,
                                const std::string& description) {
  CLI::App* sub = app.add_subcommand(name, description);
  sub->prefix_command();  // every argument, options included, goes to the script
  sub->set_help_flag();   // so does --help (argparse prints the script's usage)
  sub->allow_extras();
  return sub;
}

int run_script_subcommand(CLI::App* sub, const std::string& script_rel) {
  const std::string script = source_dir() + "/" + script_rel;
  std::string python = prof::find_report_python(source_dir());
  if (python.empty()) python = "python3";
  std::vector<std::string> args = {python, script, "--npusim", this_executable()};
  for (const std::string& a : sub->remaining()) args.push_back(a);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  execvp(argv[0], argv.data());
  throw Error(
      fmt::format("{}: cannot run '{} {}': {} (set NPUSIM_PYTHON or create .venv with "
                  "scripts/setup.sh)",
                  sub->get_name(), python, script, std::strerror(errno)));
}

}  // namespace npusim::cli
