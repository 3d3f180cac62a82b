#include "tools/report_cli.h"

#include <fmt/format.h>

#include "tools/kernel_io.h"

namespace npusim::cli {

prof::TensorDesc tensor_desc(const NpyArray& a, isa::Dtype arg_dtype) {
  prof::TensorDesc t;
  t.shape = a.shape;
  if (arg_dtype != isa::Dtype::NONE) {
    t.dtype = prof::msprof_dtype(arg_dtype);
  } else if (auto d = isa_dtype_of_npy(a.dtype)) {
    t.dtype = prof::msprof_dtype(*d);
  } else {
    t.dtype = a.dtype == "f8" ? "DT_DOUBLE" : a.dtype == "b1" ? "DT_BOOL" : "UNDEFINED";
  }
  return t;
}

prof::OpRecord op_record(const isa::Program& prog, const ChipConfig& cfg, int block_dim,
                         const KernelResult& r) {
  prof::OpRecord op;
  op.op_name = prog.name;
  op.op_type = prog.name;
  op.task_type = prof::task_type_of(prog, cfg);
  op.block_dim = block_dim;
  op.mix_block_dim = prof::mix_block_dim_of(prog, cfg, block_dim);
  op.start_cycle = r.start_cycle;
  op.cycles = r.cycles;
  op.counters = r.counter_delta;
  return op;
}

void write_cli_report(const std::string& dir, const prof::ReportInput& in, std::ostream& out) {
  const std::vector<std::string> files = prof::write_report(dir, in);
  out << fmt::format("report: {} files in {}\n", files.size(), dir);
  const std::string script = source_dir() + "/tools/npusim_report_plots.py";
  const std::string python = prof::find_report_python(source_dir());
  const prof::PlotResult plots = prof::run_plot_script(dir, python, script);
  if (plots.ok) {
    out << plots.output;
    return;
  }
  std::string why = plots.output;
  while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
  out << fmt::format("report: no plots ({})\n  make them with: <python with matplotlib> {} {}\n",
                     why.empty() ? "the plot script failed" : why, script, dir);
}

}  // namespace npusim::cli
