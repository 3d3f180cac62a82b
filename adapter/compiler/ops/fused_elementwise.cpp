// FusedElementwise (contract in ops/fused_elementwise.h): one streaming kernel (ops/elementwise)
// whose tile computation is every step's own tile work (binary_tile_work / unary_tile_work) in
// order. UB temporaries: one tile of T per intermediate result (steps 0..k-2; the last step
// writes the output tile), then each step's own temporaries; the prologue is every step's
// prologue. A step reads its operands from the input tiles (streamed, resident or gathered as
// for any streamed op) or from earlier steps' result tiles, so the values of a tile never leave
// the UB between steps.
#include "adapter/compiler/ops/fused_elementwise.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "adapter/compiler/ops/cast.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/registry.h"
#include "common/int_math.h"

namespace npusim::compiler::ops {

using isa::Dtype;

namespace {

// An operand of a step: input `index` or the result of step `index`.
struct Operand {
  bool step = false;
  size_t index = 0;
};

struct Step {
  std::vector<Operand> operands;
  StreamSpec work;        // temps, prologue, compute of the step's op
  size_t first_temp = 0;  // its temps' position in the fused kernel's temps
  bool cast = false;      // a Cast step (fused_elementwise.h)
  bool select = false;    // a SelectV2 step: operand 0 is a bool input (fused_elementwise.h)
};

// The step's tile work at `type` and its number of operands; 0 if not fusible. (Cast is
// parsed by parse_step: its work depends on its operand's type.) `bf16_arithmetic`: the chip's
// ChipConfig::vector_bf16_arithmetic.
size_t tile_work(const std::string& tf_op, Dtype type, bool bf16_arithmetic, StreamSpec& work) {
  if (tf_op == kSelectStep) return select_tile_work(type, work) ? 3 : 0;
  if (binary_tile_work(tf_op, type, bf16_arithmetic, work)) return 2;
  if (unary_tile_work(tf_op, type, bf16_arithmetic, work)) return 1;
  return static_cast<size_t>(activation_tile_work(tf_op, type, work));
}

// Parses step k, "<TfOp> <operand>[ <operand>]" (single spaces), over op.inputs; T = `dt`.
Step parse_step(const OpDesc& op, size_t k, const std::string& text, DataType dt,
                bool bf16_arithmetic) {
  const size_t n_inputs = op.inputs.size();
  const Dtype type = device_dtype(dt);
  auto invalid = [&](const std::string& what) {
    op.invalid(fmt::format("step {} '{}': {}", k, text, what));
  };
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string w; std::getline(in, w, ' ');) words.push_back(w);
  if (!text.empty() && text.back() == ' ') words.emplace_back();
  if (words.size() < 2)
    invalid("expected '<TfOp> <operand>[ <operand>]', operands i<n> (input) or s<j> (step)");
  for (const std::string& w : words)
    if (w.empty()) invalid("empty word (words are separated by one space)");
  Step s;
  s.cast = words[0] == kCastStep;
  s.select = words[0] == kSelectStep;
  const size_t arity = s.cast ? 1 : tile_work(words[0], type, bf16_arithmetic, s.work);
  if (arity == 0)
    op.fail(
        fmt::format("step {} '{}': {} is not a fusible element-wise op (one of the float ops "
                    "of the binary and unary families with a float result, ReluGrad or "
                    "SelectV2)",
                    k, text, words[0]));
  if (words.size() - 1 != arity)
    invalid(fmt::format("{} takes {} operand{}, {} given", words[0], arity, arity > 1 ? "s" : "",
                        words.size() - 1));
  for (size_t w = 1; w < words.size(); ++w) {
    const std::string& name = words[w];
    const bool digits = name.size() >= 2 && name.size() <= 10 &&
                        std::all_of(name.begin() + 1, name.end(), [](char c) {
                          return std::isdigit(static_cast<unsigned char>(c));
                        });
    if (!digits || (name[0] != 'i' && name[0] != 's'))
      invalid(fmt::format("operand '{}' is neither i<n> (input n) nor s<j> (step j)", name));
    Operand o{name[0] == 's', std::stoul(name.substr(1))};
    if (o.step && o.index >= k)
      invalid(k == 0 ? fmt::format("operand {} is not an earlier step (step 0 has none)", name)
                     : fmt::format("operand {} is not an earlier step (s0..s{})", name, k - 1));
    if (!o.step && o.index >= n_inputs)
      invalid(fmt::format("operand {} is out of range ({} input{})", name, n_inputs,
                          n_inputs == 1 ? "" : "s"));
    s.operands.push_back(o);
  }
  if (s.select && (s.operands[0].step || op.inputs[s.operands[0].index].dtype != DataType::BOOL))
    invalid("SelectV2's condition (its first operand) is a bool input i<n>");
  if (s.cast) {
    // Cast i<n>: input n, of a float type other than T, converted to T with TF's Cast
    // rounding (round to nearest even), the cast kernel's own vconv (ops/cast.cpp).
    if (s.operands[0].step)
      invalid("Cast reads an input (i<n>): the steps' results are of type T already");
    const DataType src = op.inputs[s.operands[0].index].dtype;
    if (!fusible_cast(src, dt))
      op.fail(
          fmt::format("step {} '{}': Cast {} -> {} is not a fusible cast (float32 to or from "
                      "float16 / bfloat16)",
                      k, text, data_type_name(src), data_type_name(dt)));
    s.work = cast_spec(src, dt, false, {1});
  }
  return s;
}

}  // namespace

bool fusible_elementwise(const std::string& tf_op) {
  StreamSpec work;
  return binary_tile_work(tf_op, Dtype::F32, true, work) ||
         unary_tile_work(tf_op, Dtype::F32, true, work);
}

bool fusible_cast(DataType src, DataType dst) {
  return data_type_is_float(src) && data_type_is_float(dst) &&
         (src == DataType::F32) != (dst == DataType::F32);
}

namespace {

// T: the attribute where given (an input read by Cast steps may be of another type), else
// input 0's type (the op has at least one input).
DataType steps_type(const OpDesc& op) {
  const std::optional<DataType> t = op.attr_type("T");
  return t ? *t : op.inputs[0].dtype;
}

// How a stream of steps uses the UB and splits its work.
struct StepsSchedule {
  // Per-tile intermediate results share UB tiles: a result's tile is free again after the last
  // step reading it, and a step never writes a tile one of its operands is in (each result its
  // own tile otherwise). Fewer result tiles, larger tiles.
  bool share_result_tiles = false;
  // StreamSpec::stagger_first_tiles.
  bool stagger_first_tiles = false;
};

// FusedVariableUpdate's schedule (docs/compiler.md "Fused element-wise chains"): an optimizer's
// update streams every variable and its gradient once, HBM-bound, so the tiles are as large as
// the UB allows and the blocks' loads are staggered.
constexpr StepsSchedule kUpdateSchedule{true, true};
// FusedElementwise's and AddN's schedule: a chain streams each of its inputs once and writes its
// output once, a few vector instructions per element, so a large one is HBM-bound as an update
// is (the ResNet-50 step's residual gradient sums: three f16 reads, one write, AddV2 and
// ReluGrad) and its blocks' first tiles are staggered too (StreamSpec::stagger_first_tiles takes
// it only where it can pay). Each per-tile result keeps a tile of its own.
constexpr StepsSchedule kChainSchedule{false, true};

// The stream of `texts` (fused_elementwise.h's steps) over op.inputs: output j is the result of
// step output_steps[j] (distinct steps, each of the inputs' broadcast shape). Steps that are
// outputs write their output tile, the others a UB temporary; a later step reads either.
// `bf16_arithmetic`: the chip's ChipConfig::vector_bf16_arithmetic.
StreamSpec fused_steps_spec(const OpDesc& op, const std::vector<std::string>& texts,
                            const std::vector<size_t>& output_steps, bool bf16_arithmetic,
                            const StepsSchedule& schedule = {}) {
  if (op.inputs.empty()) op.invalid("takes at least 1 input, 0 given");
  const DataType dt = steps_type(op);
  if (!data_type_is_float(dt))
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16)", data_type_name(dt)));
  if (texts.empty()) op.invalid("attribute 'steps' is missing or empty");
  std::vector<int64_t> shape = op.inputs[0].shape;
  for (size_t n = 1; n < op.inputs.size(); ++n) {
    const TensorDesc& in = op.inputs[n];
    auto b = broadcast_shapes(shape, in.shape);
    if (!b)
      op.invalid(fmt::format("input {} of shape {} does not broadcast to {}", n,
                             shape_str(in.shape), shape_str(shape)));
    shape = *b;
  }

  const Dtype type = device_dtype(dt);
  std::vector<Step> steps;
  for (size_t k = 0; k < texts.size(); ++k)
    steps.push_back(parse_step(op, k, texts[k], dt, bf16_arithmetic));
  // The inputs have type T, but for those read by Cast steps only (their own float type) and
  // the bool conditions of SelectV2 steps (read as such only).
  for (size_t n = 0; n < op.inputs.size(); ++n) {
    if (op.inputs[n].dtype == dt) continue;
    const bool condition = op.inputs[n].dtype == DataType::BOOL;
    for (size_t k = 0; k < steps.size(); ++k)
      for (size_t j = 0; j < steps[k].operands.size(); ++j) {
        const Operand& o = steps[k].operands[j];
        if (o.step || o.index != n) continue;
        if (condition ? !(steps[k].select && j == 0) : !steps[k].cast)
          op.invalid(fmt::format(
              "input {} is {}, T {}: step {} '{}' reads it (an input of another type than T is "
              "read by Cast steps only, a bool input as SelectV2's condition only)",
              n, data_type_name(op.inputs[n].dtype), data_type_name(dt), k, texts[k]));
      }
    if (condition && op.inputs[n].shape != shape)
      op.fail(
          fmt::format("input {} (a SelectV2 condition) is {}, not the output's shape {}: a "
                      "1-byte input is streamed, never broadcast",
                      n, op.inputs[n].str(), shape_str(shape)));
  }
  // Where each step's result lives: output j (>= 0) or an intermediate temporary (-1).
  std::vector<int> output_of(steps.size(), -1);
  for (size_t j = 0; j < output_steps.size(); ++j) {
    const size_t k = output_steps[j];
    if (k >= steps.size())
      op.invalid(fmt::format("output {} is step {}, beyond the {} steps", j, k, steps.size()));
    if (output_of[k] >= 0)
      op.invalid(fmt::format("outputs {} and {} are both step {}", output_of[k], j, k));
    output_of[k] = static_cast<int>(j);
  }

  StreamSpec spec;
  spec.kernel_name = fmt::format("{}_{}", op.type, data_type_name(dt));
  spec.inputs = stream_inputs(op.inputs, shape);
  spec.out_type = type;
  spec.more_out_types.assign(output_steps.size() - 1, type);
  spec.out_shape = shape;
  spec.stagger_first_tiles = schedule.stagger_first_tiles;
  // Uniform steps: intermediate results whose operands are all broadcast scalars (splat inputs)
  // or uniform steps hold one value at every position, so they are computed once, over a whole
  // tile, before the tile loop (StreamSpec::resident_compute) instead of in every tile: Keras'
  // Adam computes its step size lr * sqrt(1 - b2^t) / (1 - b1^t) from scalars inside the
  // variable's update chain. Steps that are outputs always run per tile.
  std::vector<bool> uniform(steps.size(), false);
  bool any_uniform = false;
  for (size_t k = 0; k < steps.size(); ++k) {
    if (output_of[k] >= 0) continue;
    uniform[k] =
        std::all_of(steps[k].operands.begin(), steps[k].operands.end(), [&](const Operand& o) {
          if (o.step) return static_cast<bool>(uniform[o.index]);
          const BroadcastView& v = spec.inputs[o.index].view;
          return v.splat() && !v.identity();
        });
    any_uniform = any_uniform || uniform[k];
  }
  // The intermediate results' tiles. Uniform results are read by every tile and keep their own;
  // with share_result_tiles a per-tile result takes a free shared tile (or a new one) and gives
  // it back after its last reader, each step's own tile taken before its operands' are given
  // back.
  std::vector<size_t> last_reader(steps.size());
  for (size_t k = 0; k < steps.size(); ++k) {
    last_reader[k] = k;
    for (const Operand& o : steps[k].operands)
      if (o.step) last_reader[o.index] = k;
  }
  // The uniform results a per-tile step reads (StreamSpec::resident_results: copied over the
  // tile); the others, and the uniform steps' own temporaries, are only used by the resident work
  // over its first kResidentPart elements when there is such a copy.
  std::vector<bool> read_per_tile(steps.size(), false);
  for (size_t k = 0; k < steps.size(); ++k)
    for (const Operand& o : steps[k].operands)
      if (o.step && uniform[o.index] && !uniform[k]) read_per_tile[o.index] = true;
  const bool part_only =
      schedule.share_result_tiles &&
      std::find(read_per_tile.begin(), read_per_tile.end(), true) != read_per_tile.end();
  // The splat inputs only uniform steps read: their buffers hold the first elements too.
  if (part_only)
    for (size_t n = 0; n < spec.inputs.size(); ++n) {
      bool by_uniform = false, per_tile = false;
      for (size_t k = 0; k < steps.size(); ++k)
        for (const Operand& o : steps[k].operands)
          if (!o.step && o.index == n) (uniform[k] ? by_uniform : per_tile) = true;
      spec.inputs[n].part_only = by_uniform && !per_tile;
    }
  // A temporary of `bytes_per_element` (plus fixed bytes) used by the resident work only.
  const auto part_temp = [&](std::string name, double bytes_per_element, uint64_t fixed) {
    const double part = static_cast<double>(kResidentPart) * bytes_per_element;
    return TempSpec{std::move(name), 0, static_cast<uint64_t>(std::ceil(part)) + fixed};
  };
  std::vector<size_t> result_temp(steps.size(), 0);  // of the steps that are no output
  std::vector<size_t> free_tiles;                    // shared result tiles free at this step
  for (size_t k = 0; k < steps.size(); ++k) {
    if (output_of[k] >= 0) continue;
    const bool shared = schedule.share_result_tiles && !uniform[k];
    if (part_only && uniform[k] && !read_per_tile[k]) {
      result_temp[k] = spec.temps.size();
      spec.temps.push_back(
          part_temp(fmt::format("s{} result (first elements)", k), isa::dtype_size(type), 0));
    } else if (shared && !free_tiles.empty()) {
      result_temp[k] = free_tiles.back();
      free_tiles.pop_back();
    } else {
      result_temp[k] = spec.temps.size();
      spec.temps.push_back(TempSpec{
          shared ? fmt::format("result tile {}", spec.temps.size()) : fmt::format("s{} result", k),
          double(isa::dtype_size(type))});
    }
    if (!shared) continue;
    // Given back: the shared tiles of the results step k reads last (k's own if nothing reads it).
    for (size_t r = 0; r <= k; ++r) {
      if (output_of[r] >= 0 || uniform[r] || last_reader[r] != k) continue;
      const bool read =
          r == k || std::any_of(steps[k].operands.begin(), steps[k].operands.end(),
                                [&](const Operand& o) { return o.step && o.index == r; });
      if (read) free_tiles.push_back(result_temp[r]);
    }
  }
  for (size_t k = 0; k < steps.size(); ++k) {
    steps[k].first_temp = spec.temps.size();
    for (const TempSpec& t : steps[k].work.temps)
      spec.temps.push_back(
          part_only && uniform[k]
              ? part_temp(fmt::format("s{} {} (first elements)", k, t.name), t.bytes_per_element,
                          t.fixed_bytes)
              : TempSpec{fmt::format("s{} {}", k, t.name), t.bytes_per_element, t.fixed_bytes});
  }
  // A step's slice of the fused kernel's temps.
  auto own_temps = [](const Step& s, const std::vector<uint64_t>& temp) {
    auto first = temp.begin() + static_cast<std::ptrdiff_t>(s.first_temp);
    return std::vector<uint64_t>(first, first + static_cast<std::ptrdiff_t>(s.work.temps.size()));
  };
  spec.prologue = [steps, own_temps](KernelBuilder& b, const std::vector<uint64_t>& temp) {
    for (const Step& s : steps)
      if (s.work.prologue) s.work.prologue(b, own_temps(s, temp));
  };
  // Emits the steps with uniform[k] == `once` over the tile operands t.
  auto emit_steps = [steps, own_temps, texts, uniform, output_of, result_temp](
                        bool once, KernelBuilder& b, const TileOperands& t) {
    auto result = [&](size_t k) {
      return output_of[k] >= 0 ? t.outs[static_cast<size_t>(output_of[k])] : t.temp[result_temp[k]];
    };
    for (size_t k = 0; k < steps.size(); ++k) {
      if (uniform[k] != once) continue;
      const Step& s = steps[k];
      KernelBuilder::Origin origin(b, fmt::format("step {}: {}", k, texts[k]));
      TileOperands st;
      for (const Operand& o : s.operands) st.in.push_back(o.step ? result(o.index) : t.in[o.index]);
      st.out = result(k);
      st.outs = {st.out};
      st.temp = own_temps(s, t.temp);
      st.count = t.count;
      st.tile_elems = t.tile_elems;
      s.work.compute(b, st);
    }
  };
  spec.compute = [emit_steps](KernelBuilder& b, const TileOperands& t) { emit_steps(false, b, t); };
  if (any_uniform) {
    spec.resident_compute = [emit_steps](KernelBuilder& b, const TileOperands& t) {
      emit_steps(true, b, t);
    };
    // Each uniform result holds one value: computed over kResidentPart elements, then copied
    // over the tile where a per-tile step reads it (outputs are never uniform).
    for (size_t k = 0; k < steps.size(); ++k)
      if (uniform[k] && read_per_tile[k])
        spec.resident_results.emplace_back(result_temp[k], isa::dtype_size(type));
  }
  return spec;
}

// The broadcast shape of op's inputs, or the first incompatible input's error.
std::vector<int64_t> inputs_shape(const OpDesc& op) {
  std::vector<int64_t> shape = op.inputs.empty() ? std::vector<int64_t>{} : op.inputs[0].shape;
  for (size_t n = 1; n < op.inputs.size(); ++n) {
    auto b = broadcast_shapes(shape, op.inputs[n].shape);
    if (!b)
      op.invalid(fmt::format("input {} of shape {} does not broadcast to {}", n,
                             shape_str(op.inputs[n].shape), shape_str(shape)));
    shape = *b;
  }
  return shape;
}

CompiledKernel fused_steps_kernel(const CompileContext& ctx, const std::vector<std::string>& texts,
                                  const std::vector<size_t>& output_steps,
                                  const StepsSchedule& schedule = {}) {
  // Bool inputs (SelectV2 conditions) of another shape than the output's are first expanded to
  // it by a copy kernel, as the SelectV2 op's own kernel expands them (ops/select.cpp).
  const std::vector<int64_t> shape = inputs_shape(ctx.op);
  std::vector<size_t> expanded;
  for (size_t n = 0; n < ctx.op.inputs.size(); ++n)
    if (ctx.op.inputs[n].dtype == DataType::BOOL && ctx.op.inputs[n].shape != shape)
      expanded.push_back(n);
  if (expanded.empty()) {
    const StreamSpec spec =
        fused_steps_spec(ctx.op, texts, output_steps, ctx.cfg.vector_bf16_arithmetic, schedule);
    const TensorDesc out{steps_type(ctx.op), spec.out_shape};
    CompiledKernel k = stream_kernel(ctx, out, spec);
    k.outputs.assign(output_steps.size(), out);
    return k;
  }
  OpDesc streamed = ctx.op;
  for (size_t n : expanded) streamed.inputs[n].shape = shape;
  const StreamSpec spec =
      fused_steps_spec(streamed, texts, output_steps, ctx.cfg.vector_bf16_arithmetic, schedule);
  const TensorDesc out{steps_type(ctx.op), spec.out_shape};
  LaunchPlan plan(std::vector<TensorDesc>(output_steps.size(), out));
  if (out.num_elements() == 0) return std::move(plan).finish();
  std::vector<ArgRef> args;
  for (size_t n = 0; n < ctx.op.inputs.size(); ++n)
    args.push_back(LaunchPlan::input(static_cast<int>(n)));
  for (size_t n : expanded)
    args[n] = append_broadcast_copy(plan, ctx, ctx.op.inputs[n], shape, args[n]);
  for (size_t j = 0; j < output_steps.size(); ++j)
    args.push_back(LaunchPlan::output(static_cast<int>(j)));
  plan.add(build_stream_kernel(ctx.op.str(), spec, ctx.cfg), args);
  return std::move(plan).finish();
}

// AddN of `inputs` (at least 2, one shape and type) as one stream kernel of AddV2 steps, left
// to right: acc = x0 + x1, acc = acc + x2, ... (TensorFlow's order, each partial sum rounded to
// T).
CompiledKernel add_n_kernel(const CompileContext& ctx, const std::vector<TensorDesc>& inputs) {
  std::vector<std::string> steps = {"AddV2 i0 i1"};
  for (size_t n = 2; n < inputs.size(); ++n)
    steps.push_back(fmt::format("AddV2 s{} i{}", n - 2, n));
  OpDesc sum = ctx.op;
  sum.inputs = inputs;
  return fused_steps_kernel(CompileContext{sum, ctx.cfg, ctx.precision}, steps, {steps.size() - 1},
                            kChainSchedule);
}

// `build()`'s kernel, or empty where the builder refused it for the chip's resources (a plain
// CompileError: scalar registers, UB, kernel arguments), its message in `refusal` if given. An
// invalid op (InvalidOpError) or the host's memory (CompileMemoryError) propagates.
template <class Build>
std::optional<CompiledKernel> build_if_fits(Build&& build, std::string* refusal = nullptr) {
  try {
    return build();
  } catch (const InvalidOpError&) {
    throw;
  } catch (const CompileMemoryError&) {
    throw;
  } catch (const CompileError& e) {
    if (refusal) *refusal = e.what();
    return std::nullopt;
  }
}

}  // namespace

namespace {

// A chain that begins with an AddN's steps ("AddV2 i0 i1", "AddV2 s0 i2", ..., "AddV2 s(p-2)
// ip": the graph pass's rewrite 16, a residual gradient sum before its ReluGrad) over more
// inputs than one kernel takes: that sum as the AddN op (which splits a wide sum into launches,
// compile_add_n) into a workspace tensor of type T, then the rest of the chain reading it as
// input 0. The sum is rounded to T in the UB as in the workspace, so the bits are the one
// kernel's. Empty where the chain is not of that form (inputs 0..p of type T and one shape, read
// by the AddN's steps only, and the later steps reading the sum, not its partial sums).
std::optional<CompiledKernel> split_add_n_prefix(const CompileContext& ctx,
                                                 const std::vector<std::string>& texts) {
  const OpDesc& op = ctx.op;
  const DataType dt = steps_type(op);
  size_t p = 0;  // the AddN's steps: 0 .. p-1, over inputs 0 .. p
  while (p < texts.size() && p + 1 < op.inputs.size() &&
         texts[p] ==
             (p == 0 ? std::string("AddV2 i0 i1") : fmt::format("AddV2 s{} i{}", p - 1, p + 1)))
    ++p;
  if (p < 2 || p == texts.size()) return std::nullopt;
  for (size_t n = 0; n <= p; ++n)
    if (op.inputs[n].dtype != dt || op.inputs[n].shape != op.inputs[0].shape) return std::nullopt;
  // The rest of the chain over [sum, inputs p+1 ..]: i<k> (k > p) is i<k-p>, s<p-1> is i0,
  // s<j> (j >= p) is s<j-p>.
  std::vector<std::string> rest;
  for (size_t k = p; k < texts.size(); ++k) {
    std::istringstream words(texts[k]);
    std::string word, text;
    words >> text;
    while (words >> word) {
      const size_t i = std::stoul(word.substr(1));
      if (word[0] == 'i' && i <= p) return std::nullopt;     // an AddN input read again
      if (word[0] == 's' && i + 1 < p) return std::nullopt;  // a partial sum
      text += word[0] == 'i' ? fmt::format(" i{}", i - p)
                             : (i + 1 == p ? std::string(" i0") : fmt::format(" s{}", i - p));
    }
    rest.push_back(std::move(text));
  }
  OpDesc sum;
  sum.type = "AddN";
  sum.inputs.assign(op.inputs.begin(), op.inputs.begin() + static_cast<std::ptrdiff_t>(p + 1));
  const CompiledKernel sum_kernel = compile_add_n(CompileContext{sum, ctx.cfg, ctx.precision});
  OpDesc tail = op;
  tail.inputs.erase(tail.inputs.begin() + 1,
                    tail.inputs.begin() + static_cast<std::ptrdiff_t>(p + 1));
  tail.inputs[0] = TensorDesc{dt, op.inputs[0].shape};
  tail.attrs["steps"] = rest;
  const CompiledKernel tail_kernel = fused_steps_kernel(
      CompileContext{tail, ctx.cfg, ctx.precision}, rest, {rest.size() - 1}, kChainSchedule);
  LaunchPlan plan(tail_kernel.outputs);
  const ArgRef sum_buffer = plan.workspace(tail.inputs[0].bytes());
  std::vector<ArgRef> ins;
  for (size_t n = 0; n <= p; ++n) ins.push_back(LaunchPlan::input(static_cast<int>(n)));
  plan.add(sum_kernel, ins, {sum_buffer}, "the AddN steps");
  ins = {sum_buffer};
  for (size_t n = p + 1; n < op.inputs.size(); ++n)
    ins.push_back(LaunchPlan::input(static_cast<int>(n)));
  plan.add(tail_kernel, ins, {LaunchPlan::output(0)}, "the steps after the AddN");
  return std::move(plan).finish();
}

}  // namespace

CompiledKernel compile_fused_elementwise(const CompileContext& ctx) {
  const std::vector<std::string> texts = ctx.op.attr_strings("steps");
  std::string refusal;
  if (std::optional<CompiledKernel> k = build_if_fits(
          [&] {
            return fused_steps_kernel(ctx, texts, {texts.empty() ? 0 : texts.size() - 1},
                                      kChainSchedule);
          },
          &refusal))
    return std::move(*k);
  // One kernel does not take the chain (its inputs' addresses, its UB): a wide AddN at its head
  // goes first, on its own; any other chain fails as its one kernel did.
  if (std::optional<CompiledKernel> split = split_add_n_prefix(ctx, texts))
    return std::move(*split);
  throw CompileError(refusal);
}

CompiledKernel compile_add_n(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.empty()) op.invalid("takes at least 1 input, 0 given");
  for (size_t n = 1; n < op.inputs.size(); ++n)
    if (op.inputs[n].shape != op.inputs[0].shape)
      op.invalid(fmt::format("input {} is {}, input 0 {}: AddN's inputs have one shape", n,
                             shape_str(op.inputs[n].shape), shape_str(op.inputs[0].shape)));
  if (auto n = op.attr_int("N", -1); n >= 0 && static_cast<size_t>(n) != op.inputs.size())
    op.invalid(fmt::format("attribute N = {} does not count the {} inputs", n, op.inputs.size()));
  // N = 1 is a copy: x0 + 0 would turn -0 into +0, so the copy is the layout family's
  // BroadcastTo to the input's own shape (a bit-exact move).
  if (op.inputs.size() == 1) {
    OpDesc copy;
    copy.type = "BroadcastTo";
    copy.inputs = op.inputs;
    copy.attrs["shape"] = op.inputs[0].shape;
    return compile_layout(CompileContext{copy, ctx.cfg, ctx.precision});
  }
  const size_t n_inputs = op.inputs.size();
  const TensorDesc out = op.inputs[0];
  // One launch where its kernel fits (every AddN up to a few dozen inputs: the kernel as it
  // has always been); else the wide form below.
  const size_t one_launch_max = static_cast<size_t>(KernelBuilder::max_args()) - 1;
  bool one_launch_fails = false;
  if (n_inputs <= one_launch_max || out.num_elements() == 0) {
    if (std::optional<CompiledKernel> one =
            build_if_fits([&] { return add_n_kernel(ctx, op.inputs); }))
      return std::move(*one);
    one_launch_fails = true;
  }
  // Wide AddN: the inputs in groups, one launch per group, each launch continuing the running
  // sum. Launch 0 sums x0 .. x(G-1); launch g > 0 sums the running sum of the launches before
  // and the next G-1 inputs, in that order, so the sum stays left to right (((x0 + x1) + x2)
  // + ...), each partial sum rounded to T: the running sum is stored in T between launches,
  // the same rounding it takes in the UB, so the result is the one-launch kernel's bit for
  // bit. G is the most inputs one launch's kernel takes: its arguments (G plus the output:
  // KernelBuilder::max_args()), the stream kernel's scalar registers (an address per input)
  // and its UB (a double-buffered tile per input, a tile per partial sum); the builder is the
  // judge of the last two, so G is the largest group whose kernel it builds (fewer inputs
  // never need more registers or UB). The running sum alternates between the output and one
  // workspace slice of the output's size (no launch reads the buffer it writes), placed so the
  // last launch writes the output. Launches run in stream order: each reads a complete sum.
  auto group_kernel = [&](size_t g) { return add_n_kernel(ctx, std::vector<TensorDesc>(g, out)); };
  auto fits = [&](size_t g, std::string* refusal = nullptr) {
    return build_if_fits([&] { return group_kernel(g); }, refusal).has_value();
  };
  size_t lo = 2, hi = std::min(n_inputs, one_launch_max);
  if (one_launch_fails) hi = n_inputs - 1;  // N itself did not build
  // Not even two inputs fit one kernel: the chip cannot sum this shape at all.
  if (std::string refusal; !fits(lo, &refusal))
    op.fail(fmt::format("no launch sums even 2 of its {} inputs: {}", n_inputs, refusal));
  while (lo < hi) {  // the largest group that builds, in [lo, hi]
    const size_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  const size_t group = lo;
  const size_t launches = 1 + ceil_div(n_inputs - group, group - 1);
  LaunchPlan plan({out});
  const ArgRef running = plan.workspace(out.bytes());
  // Where launch l writes its sum: the output for the last launch, the buffer before it
  // alternating.
  auto sum_of = [&](size_t l) {
    return (launches - 1 - l) % 2 == 0 ? LaunchPlan::output(0) : running;
  };
  const CompiledKernel full = group_kernel(group);
  size_t next = 0;  // the first input not yet summed
  for (size_t l = 0; l < launches; ++l) {
    std::vector<ArgRef> ins;
    if (l > 0) ins.push_back(sum_of(l - 1));
    while (ins.size() < group && next < n_inputs)
      ins.push_back(LaunchPlan::input(static_cast<int>(next++)));
    const std::string what =
        fmt::format("AddN inputs {}..{} of {}", next - ins.size() + (l > 0), next - 1, n_inputs);
    if (ins.size() == group)
      plan.add(full, ins, {sum_of(l)}, what);
    else
      plan.add(group_kernel(ins.size()), ins, {sum_of(l)}, what);
  }
  return std::move(plan).finish();
}

namespace {

// Checks one update (member) of FusedVariableUpdate: its m variables (inputs 0..m-1 of `op`)
// have one shape, which the steps' result has; returns the steps' output steps.
std::vector<size_t> update_output_steps(const OpDesc& op, int64_t m,
                                        const std::vector<int64_t>& updates,
                                        const std::string& where) {
  const std::vector<int64_t>& var = op.inputs[0].shape;
  for (int64_t j = 1; j < m; ++j)
    if (op.inputs[static_cast<size_t>(j)].shape != var)
      op.invalid(fmt::format("{}variable {} is {}, variable 0 {}: the variables have one shape",
                             where, j, shape_str(op.inputs[static_cast<size_t>(j)].shape),
                             shape_str(var)));
  std::vector<size_t> output_steps;
  for (int64_t u : updates) {
    if (u < 0) op.invalid(fmt::format("update step {} is negative", u));
    output_steps.push_back(static_cast<size_t>(u));
  }
  return output_steps;
}

// Whether a member's update may be a segment of a multi-tensor launch: every input of the
// variables' shape or a single element (updates with other broadcasts keep a launch of their
// own).
bool multi_tensor_segment(const OpDesc& member) {
  const TensorDesc& var = member.inputs[0];
  return std::all_of(member.inputs.begin(), member.inputs.end(), [&](const TensorDesc& t) {
    return t.shape == var.shape || t.num_elements() == 1;
  });
}

}  // namespace

CompiledKernel compile_fused_variable_update(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const int64_t m = op.attr_int("M", -1);
  const int64_t members = op.attr_int("members", 1);
  const std::vector<int64_t> updates = op.attr_ints("updates");
  if (m < 1 || static_cast<size_t>(m) > op.inputs.size())
    op.invalid(fmt::format("attribute M = {} must count the variables among the {} inputs", m,
                           op.inputs.size()));
  if (members < 1 || m % members != 0 || (op.inputs.size() - static_cast<size_t>(m)) % members)
    op.invalid(
        fmt::format("attribute members = {} must divide the M = {} variables and the {} "
                    "other inputs",
                    members, m, op.inputs.size() - static_cast<size_t>(m)));
  const int64_t per_m = m / members;  // variables per member
  if (updates.size() != static_cast<size_t>(per_m))
    op.invalid(
        fmt::format("attribute 'updates' has {} entries, one per variable of a member "
                    "(M / members = {})",
                    updates.size(), per_m));
  const std::vector<std::string> steps = op.attr_strings("steps");
  if (members == 1) {
    const std::vector<size_t> output_steps = update_output_steps(op, m, updates, "");
    const std::vector<int64_t>& var = op.inputs[0].shape;
    CompiledKernel k = fused_steps_kernel(ctx, steps, output_steps, kUpdateSchedule);
    if (!k.outputs.empty() && k.outputs[0].shape != var)
      op.invalid(fmt::format("the steps' result {} is not the variables' shape {}",
                             shape_str(k.outputs[0].shape), shape_str(var)));
    return k;
  }

  // Multi-tensor form: member g's inputs are variables g*per_m .. and other inputs
  // m + g*per_n ..; its outputs are g*per_m ...
  const size_t per_n = (op.inputs.size() - static_cast<size_t>(m)) / static_cast<size_t>(members);
  std::vector<OpDesc> member_ops;
  std::vector<std::vector<int>> member_inputs;  // op input index of each member input
  for (int64_t g = 0; g < members; ++g) {
    OpDesc sub = op;
    sub.inputs.clear();
    std::vector<int> index;
    for (int64_t j = 0; j < per_m; ++j) index.push_back(static_cast<int>(g * per_m + j));
    for (size_t k = 0; k < per_n; ++k)
      index.push_back(
          static_cast<int>(static_cast<size_t>(m) + static_cast<size_t>(g) * per_n + k));
    for (int i : index) sub.inputs.push_back(op.inputs[static_cast<size_t>(i)]);
    member_ops.push_back(std::move(sub));
    member_inputs.push_back(std::move(index));
  }
  CompiledKernel k;
  std::vector<MultiTensorSegment> segments;
  for (int64_t g = 0; g < members; ++g) {
    const OpDesc& sub = member_ops[static_cast<size_t>(g)];
    const std::string where = fmt::format("member {}: ", g);
    StreamSpec spec;
    try {  // the member's own errors, named as the member's
      const std::vector<size_t> output_steps = update_output_steps(sub, per_m, updates, "");
      spec = fused_steps_spec(sub, steps, output_steps, ctx.cfg.vector_bf16_arithmetic,
                              kUpdateSchedule);
    } catch (const InvalidOpError& e) {
      op.invalid(where + e.what());
    } catch (const CompileError& e) {
      op.fail(where + e.what());
    }
    const TensorDesc out{sub.inputs[0].dtype, spec.out_shape};
    if (spec.out_shape != sub.inputs[0].shape)
      op.invalid(fmt::format("{}the steps' result {} is not the variables' shape {}", where,
                             shape_str(spec.out_shape), shape_str(sub.inputs[0].shape)));
    for (int64_t j = 0; j < per_m; ++j) k.outputs.push_back(out);
    if (out.num_elements() == 0) continue;
    if (multi_tensor_segment(sub)) {
      uint64_t bytes = static_cast<uint64_t>(per_m) * out.bytes();
      for (const TensorDesc& t : sub.inputs)
        if (t.shape == out.shape) bytes += t.bytes();
      segments.push_back(MultiTensorSegment{std::move(spec), static_cast<size_t>(g), bytes});
      continue;
    }
    Launch own = build_stream_kernel(op.str(), spec, ctx.cfg);
    for (ArgRef& a : own.args) {
      if (a.kind == ArgRef::Kind::kInput)
        a.index = member_inputs[static_cast<size_t>(g)][static_cast<size_t>(a.index)];
      else if (a.kind == ArgRef::Kind::kOutput)
        a.index += static_cast<int>(g * per_m);
    }
    k.launches.push_back(std::move(own));
  }
  for (Launch& l : multi_tensor_launches(
           op.str(), segments, member_ops[0].inputs.size(), static_cast<size_t>(per_m),
           [&](size_t g, size_t i) { return member_inputs[g][i]; },
           [&](size_t g, size_t j) { return static_cast<int>(g * static_cast<size_t>(per_m) + j); },
           ctx.cfg))
    k.launches.push_back(std::move(l));
  return k;
}

}  // namespace npusim::compiler::ops
