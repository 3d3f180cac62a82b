#include "adapter/compiler/compiler.h"

#include <fmt/format.h>

#include <cstdlib>
#include <new>
#include <stdexcept>
#include <variant>

#include "adapter/compiler/ops/registry.h"

namespace npusim::compiler {

namespace {

struct ModeName {
  PrecisionMode mode;
  const char* name;
};
constexpr ModeName kModeNames[] = {
    {PrecisionMode::kKeepFp32, "must_keep_origin_dtype"},
    {PrecisionMode::kAllowFp32ToFp16, "allow_fp32_to_fp16"},
    {PrecisionMode::kAllowMixPrecision, "allow_mix_precision"},
};

}  // namespace

const char* precision_mode_name(PrecisionMode m) {
  for (const ModeName& n : kModeNames)
    if (n.mode == m) return n.name;
  return "?";
}

std::optional<PrecisionMode> precision_mode_from_name(const std::string& s) {
  for (const ModeName& n : kModeNames)
    if (s == n.name) return n.mode;
  return std::nullopt;
}

std::vector<uint64_t> Launch::bind(const std::vector<uint64_t>& inputs,
                                   const std::vector<uint64_t>& outputs, uint64_t workspace,
                                   const std::vector<uint64_t>& derived) const {
  std::vector<uint64_t> v;
  v.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgRef& a = args[i];
    const std::string& name = kernel.program.arg_names.at(i);
    auto pick = [&](const std::vector<uint64_t>& list, const char* what) {
      if (a.index < 0 || static_cast<size_t>(a.index) >= list.size())
        throw Error(fmt::format("kernel {}: argument {} is {} {}, but {} were given",
                                kernel.program.name, name, what, a.index, list.size()));
      return list[static_cast<size_t>(a.index)];
    };
    switch (a.kind) {
      case ArgRef::Kind::kInput: v.push_back(pick(inputs, "input")); break;
      case ArgRef::Kind::kOutput: v.push_back(pick(outputs, "output")); break;
      case ArgRef::Kind::kWorkspace: v.push_back(workspace + a.value); break;
      case ArgRef::Kind::kScalar: v.push_back(a.value); break;
      case ArgRef::Kind::kDerived: {
        const uint64_t own = static_cast<size_t>(a.index) < derived.size() && a.index >= 0
                                 ? derived[static_cast<size_t>(a.index)]
                                 : 0;
        v.push_back((own ? own : workspace + a.value) + a.inner);
        break;
      }
    }
  }
  return v;
}

const std::vector<std::string>& lowering_switches() {
  // One name a line, in order.
  // clang-format off
  static const std::vector<std::string> names = {
      "NPUSIM_ASSEMBLE_BATCHED_PIECES",
      "NPUSIM_BN_RAGGED_CHANNELS",
      "NPUSIM_CONV_PIXEL_LOADS",
      "NPUSIM_CONV_PLAN_RANK",
      "NPUSIM_CONV_ROW_VIEW",
      "NPUSIM_CONV_STAGGERED_LOADS",
      "NPUSIM_CONV_WEIGHT_RUNS",
      "NPUSIM_CONV_STRIDED_INPUT_GRAD",
      "NPUSIM_CONV_STRIDED_PIXELS",
      "NPUSIM_CONV_STRIDE_PACK",
      "NPUSIM_DEPTHWISE_GROUPS_PER_STEP",
      "NPUSIM_DEPTHWISE_TILE_ORDER",
      "NPUSIM_FILTER_GRAD_FOLD_ESTIMATE",
      "NPUSIM_FILTER_GRAD_ISSUE_CHOICE",
      "NPUSIM_FILTER_GRAD_PLAN_RANK",
      "NPUSIM_FILTER_GRAD_ROW_VIEW",
      "NPUSIM_FILTER_GRAD_STRIDED_PIXELS",
      "NPUSIM_FILTER_GRAD_POINTWISE",
      "NPUSIM_FUSION_ADD_RELU_CAST",
      "NPUSIM_FUSION_CHANNEL_EPILOGUE",
      "NPUSIM_FUSION_CONV_BN_REDUCE_TILES",
      "NPUSIM_FUSION_GROUPED_CONV_PACK",
      "NPUSIM_L2_STREAM_POLICY",
      "NPUSIM_MASKED_SUM_F16_MASK",
      "NPUSIM_MASKED_SUM_WINDOWS",
      "NPUSIM_MATMUL_BURST_CHUNKS",
      "NPUSIM_MATMUL_COLUMN_TILE_BURSTS",
      "NPUSIM_MATMUL_CORE_SPLIT",
      "NPUSIM_MATMUL_STAGGERED_TILES",
      "NPUSIM_MATMUL_UNIT_FLAG",
      "NPUSIM_MIX_ONE_TO_ONE",
      "NPUSIM_SIGMOID_ALTERNATE_BUFFERS",
      "NPUSIM_SOFTMAX_RAGGED_RESIDENT",
      "NPUSIM_SOFTMAX_ROW_BROADCAST",
      "NPUSIM_SOFTMAX_SINGLE_BUFFER",
      "NPUSIM_STAGGERED_SHARED_READS",
      "NPUSIM_STAGGER_PARTIAL_TILES",
      "NPUSIM_TRANSPOSE_CANN",
      "NPUSIM_TRANSPOSE_ROW_GATHER",
      "NPUSIM_VECTOR_MULTIPLY_ACCUMULATE",
  };
  // clang-format on
  return names;
}

std::string kernel_cache_key(const OpDesc& op, const ChipConfig& cfg, PrecisionMode precision) {
  std::string key = fmt::format("{}|{}|{}", op.key(), precision_mode_name(precision), cfg.name);
  for (const std::string& name : lowering_switches())
    if (const char* v = std::getenv(name.c_str())) key += fmt::format("|{}={}", name, v);
  return key;
}

std::vector<std::string> supported_ops() {
  std::vector<std::string> names;
  for (const ops::OpEntry& e : ops::op_table()) names.emplace_back(e.tf_op);
  return names;
}

namespace {

// On a chip without bf16 conversion (vector.bf16_conversion false: the 910 and 310P, whose Cast
// tables list no bf16) no kernel can take or give bf16: refuses an op with a bf16 input, expected
// output or type attribute (T, DstT, dtype, ...).
void refuse_bf16(const OpDesc& op, const ChipConfig& cfg) {
  bool bf16 = false;
  for (const std::vector<TensorDesc>* list : {&op.inputs, &op.outputs})
    for (const TensorDesc& t : *list) bf16 = bf16 || t.dtype == DataType::BF16;
  for (const auto& [name, value] : op.attrs)
    if (const auto* s = std::get_if<std::string>(&value))
      bf16 = bf16 || *s == data_type_name(DataType::BF16);
  if (bf16)
    op.fail(
        fmt::format("dtype bf16 is not supported on chip {}: its vector unit has no bf16, "
                    "not even conversions (vector.bf16_conversion is false in {})",
                    cfg.name, cfg.source_file));
}

}  // namespace

CompiledKernel compile(const OpDesc& op, const ChipConfig& cfg, PrecisionMode precision) {
  const ops::OpEntry* entry = nullptr;
  for (const ops::OpEntry& e : ops::op_table())
    if (op.type == e.tf_op) entry = &e;
  if (!entry)
    op.fail(fmt::format("op {} is not supported by the kernel compiler (supported: {})", op.type,
                        fmt::join(supported_ops(), ", ")));
  for (const TensorDesc& t : op.inputs) op.check_size(t, "input");
  if (!cfg.vector_bf16_conversion) refuse_bf16(op, cfg);
  CompiledKernel k;
  try {
    k = entry->compile(ops::CompileContext{op, cfg, precision});
  } catch (const std::bad_alloc&) {
    throw CompileMemoryError(op.str() + ": the host ran out of memory compiling it");
  } catch (const std::length_error& e) {
    throw CompileMemoryError(
        fmt::format("{}: the host ran out of memory compiling it ({})", op.str(), e.what()));
  }
  // Outputs whose shapes come from attributes or host inputs (BroadcastTo's shape, Fill's dims,
  // Pad's paddings...) keep the inputs' rule; the families check them first where they build
  // the shape by arithmetic that could itself wrap (Tile's multiples).
  for (const TensorDesc& t : k.outputs) op.check_size(t, "output");
  k.key = op.key() + "|" + precision_mode_name(precision);
  k.precision = precision;
  if (!op.outputs.empty() && op.outputs != k.outputs) {
    std::string want, got;
    for (const TensorDesc& t : op.outputs) want += (want.empty() ? "" : ", ") + t.str();
    for (const TensorDesc& t : k.outputs) got += (got.empty() ? "" : ", ") + t.str();
    op.fail(fmt::format("the caller expects outputs ({}) but the op produces ({})", want, got));
  }
  return k;
}

}  // namespace npusim::compiler
