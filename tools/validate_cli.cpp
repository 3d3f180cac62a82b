#include "tools/validate_cli.h"

#include "tools/python_tool.h"

namespace npusim::cli {

CLI::App* add_validate_command(CLI::App& app, ValidateOptions& o) {
  auto* c = app.add_subcommand(
      "validate", "reproduce published measurements of Ascend silicon (docs/validation.md)");
  c->add_option("--cases", o.cases, "case file (default: validation/cases.yaml)");
  c->add_option("--only", o.only, "run only this case id (repeat for several)");
  c->add_option("--json", o.json, "write the rows and the mean absolute errors as JSON");
  c->add_option("--set", o.sets,
                "override a chip key in every case: dotted.key=value (a global calibration)");
  c->add_flag("--list", o.list, "list the cases; run nothing");
  return c;
}

void run_validate(const ValidateOptions& o) {
  std::vector<std::string> args;
  if (!o.cases.empty()) args.insert(args.end(), {"--cases", o.cases});
  for (const auto& id : o.only) args.insert(args.end(), {"--only", id});
  for (const auto& kv : o.sets) args.insert(args.end(), {"--set", kv});
  if (!o.json.empty()) args.insert(args.end(), {"--json", o.json});
  if (o.list) args.push_back("--list");
  exec_python_tool("validate", "tools/npusim_validate.py", std::move(args));
}

}  // namespace npusim::cli
