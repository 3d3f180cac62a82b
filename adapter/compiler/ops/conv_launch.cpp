// The convolution family's launch helpers (ops/conv.h): workspace slices, strided copies and
// channel padding by vector launches.
#include <fmt/format.h>

#include "adapter/compiler/ops/cast.h"
#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/elementwise.h"
#include "common/int_math.h"

namespace npusim::compiler::ops {

uint64_t workspace_align(uint64_t bytes) { return round_up(bytes, 512); }

ArgRef workspace_take(CompiledKernel& k, uint64_t bytes) {
  ArgRef r{ArgRef::Kind::kWorkspace, 0, k.workspace_bytes};
  k.workspace_bytes += workspace_align(device_buffer_bytes(bytes));
  return r;
}

Launch with_args(Launch l, std::vector<ArgRef> args) {
  l.args = std::move(args);
  return l;
}

void append_strided_copy(CompiledKernel& k, const OpDesc& op, const ArgRef& src, const ArgRef& dst,
                         int64_t rows, int64_t cols, int64_t pitch, DataType from, DataType to,
                         const ChipConfig& cfg) {
  if (rows * cols == 0) return;
  StreamSpec spec = cast_spec(from, to, false, {rows, cols});
  if (pitch != cols && rows > 1) {
    spec.inputs[0].view = BroadcastView{{rows, cols}, {pitch, 1}};
    spec.inputs[0].shape = {rows, pitch};
  }
  Launch l = build_stream_kernel(op.str(), spec, cfg);
  l.summary = fmt::format("{} x {} (pitch {}) {} -> dense {} ({})", rows, cols, pitch,
                          data_type_name(from), data_type_name(to), l.summary);
  k.launches.push_back(with_args(std::move(l), {src, dst}));
}

void append_channel_pad(CompiledKernel& k, const OpDesc& op, const ArgRef& src, const ArgRef& dst,
                        int64_t pixels, int64_t c, int64_t cp, DataType dt, const ChipConfig& cfg) {
  StreamSpec spec = cast_spec(dt, dt, false, {pixels, cp});
  spec.inputs[0].view = BroadcastView{{pixels, cp}, {c, 1}};
  spec.inputs[0].shape = {pixels, c};
  Launch l = build_stream_kernel(op.str(), spec, cfg);
  l.summary = fmt::format("channels {} -> {} ({})", c, cp, l.summary);
  k.launches.push_back(with_args(std::move(l), {src, dst}));
}

}  // namespace npusim::compiler::ops
