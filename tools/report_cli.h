// --report-dir of `npusim run` and `npusim demo`: the report folder of adapter/profiler plus the
// plots, made by tools/npusim_report_plots.py with the project's Python (docs/reports.md).
#pragma once

#include <ostream>
#include <string>

#include "adapter/profiler/report_writer.h"
#include "common/npy.h"
#include "isa/isa.h"
#include "sim/simulator.h"

namespace npusim::cli {

// The tensor of a kernel argument as the report lists it: the array's shape; the argument's
// element type if it is typed, else the array's.
prof::TensorDesc tensor_desc(const NpyArray& a, isa::Dtype arg_dtype);

// An OpRecord of a launch of `prog`: name and type are the kernel's name, task type and mix
// block dim from the chip, timing and counters from the result; no tensors, waits or
// instructions yet.
prof::OpRecord op_record(const isa::Program& prog, const ChipConfig& cfg, int block_dim,
                         const KernelResult& r);

// Writes the report (prof::write_report) and, if a Python is found (prof::find_report_python),
// runs the plot script; prints to `out` where the report is and how to make the plots if they
// could not be made. Throws npusim::Error if the report cannot be written (failed plots are not
// an error: the message says why).
void write_cli_report(const std::string& dir, const prof::ReportInput& in, std::ostream& out);

}  // namespace npusim::cli
