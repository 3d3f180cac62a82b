// The compiler's two kinds of refusal (op_desc.h): an op whose inputs or attributes break the
// op's own contract throws InvalidOpError (TensorFlow's InvalidArgumentError, the same on every
// device); a valid op the compiler or the chip cannot do throws a plain CompileError
// (UnimplementedError). Each message starts with the op's signature.
#include <catch2/catch.hpp>

#include <string>

#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::AttrValue;

namespace {

enum class Refusal { kInvalid, kUnsupported };

// Compiles op and checks it is refused the given way, the message naming the op.
void check_refusal(const OpDesc& op, Refusal want) {
  INFO(op.str());
  const CompileRefusal r = compile_refusal(op);
  INFO(r.message);
  CHECK(r.invalid == (want == Refusal::kInvalid));
}

TensorDesc f32(std::vector<int64_t> shape) { return {DataType::F32, std::move(shape)}; }

}  // namespace

TEST_CASE("invalid ops are InvalidOpError") {
  using V = std::vector<int64_t>;
  const Refusal k = Refusal::kInvalid;
  check_refusal(make_op("MatMul", {f32({2, 3}), f32({4, 5})}), k);          // inner dims
  check_refusal(make_op("MatMul", {f32({}), f32({})}), k);                  // scalars
  check_refusal(make_op("BatchMatMulV2", {f32({2, 2, 3}), f32({2, 4, 5})}), k);
  check_refusal(make_op("BatchMatMulV2", {f32({2, 2, 3}), f32({3, 3, 5})}), k);
  check_refusal(make_op("AddV2", {f32({2, 3}), f32({4, 3})}), k);           // broadcast
  check_refusal(make_op("AddV2", {{DataType::S64, {2}}, {DataType::S64, {3}}}), k);
  check_refusal(make_op("Sum", {f32({2, 3})}, {{"axes", AttrValue(V{2})}}), k);
  check_refusal(make_op("Transpose", {f32({2, 3})}, {{"perm", AttrValue(V{0, 0})}}), k);
  check_refusal(make_op("Transpose", {f32({2, 3})}, {{"perm", AttrValue(V{0, 1, 2})}}), k);
  check_refusal(make_op("Conv2D", {f32({1, 5, 5, 3}), f32({3, 3, 4, 2})},
                        {{"strides", AttrValue(V{1, 1, 1, 1})},
                         {"padding", AttrValue(std::string("VALID"))}}),
                k);
  check_refusal(make_op("ConcatV2", {f32({2, 3}), f32({3, 4})}, {{"axis", AttrValue(int64_t{0})}}),
                k);
  check_refusal(make_op("Slice", {f32({2, 3})},
                        {{"begin", AttrValue(V{0, 1})}, {"size", AttrValue(V{2, 3})}}),
                k);
  check_refusal(make_op("Softmax", {f32({})}), k);
  check_refusal(make_op("GatherV2", {f32({2, 3}), {DataType::S32, {1}}},
                        {{"axis", AttrValue(int64_t{2})}}),
                k);
  check_refusal(make_op("Neg", {f32({2, -1})}), k);  // a negative dimension
  // Dimensions whose product passes 2^63 bytes (before the check: BNTrainingReduce's pixel
  // count wrapped negative and its channel-sum planner divided by zero, SIGFPE).
  const TensorDesc huge{DataType::F16, {3037000500, 3037000500, 1, 16}};
  check_refusal(make_op("BNTrainingReduce", {huge}), k);
  check_refusal(make_op("BiasAddGrad", {huge}), k);
  check_refusal(make_op("Cast", {huge}, {{"DstT", AttrValue(std::string("f32"))}}), k);
  check_refusal(make_op("Neg", {f32({0, int64_t{1} << 62, 4})}), k);
  // Shapes from attributes (TF's host Const inputs) keep the same rule, before the family
  // builds anything on them: before the check BroadcastTo to f32[2^31,2^31] (2^64 bytes)
  // compiled, its output's byte count wrapped to 0 and the launch faulted outside device memory.
  const V two31 = {int64_t{1} << 31, int64_t{1} << 31};
  check_refusal(make_op("BroadcastTo", {f32({1})}, {{"shape", AttrValue(two31)}}), k);
  check_refusal(make_op("Fill", {f32({})}, {{"dims", AttrValue(two31)}}), k);
  // Tile's multiples times the dims wrap int64 (2^40 x 2^40) or pass 2^63 bytes (2^31 x 2^31).
  check_refusal(make_op("Tile", {f32({int64_t{1} << 40})},
                        {{"multiples", AttrValue(V{int64_t{1} << 40})}}),
                k);
  check_refusal(make_op("Tile", {f32({1, 1})}, {{"multiples", AttrValue(two31)}}), k);
  // Paddings whose sum with the dim wraps int64.
  check_refusal(make_op("Pad", {f32({2})},
                        {{"paddings", AttrValue(V{int64_t{1} << 62, int64_t{1} << 62})}}),
                k);
  // Just under the limit the same ops compile (the shapes are valid; allocating them is the
  // caller's business, and fails there naming the op: tests/tf/test_errors.py).
  const V two30 = {int64_t{1} << 30, int64_t{1} << 30};  // f32: 2^62 bytes
  CHECK_NOTHROW(compiler::compile(make_op("BroadcastTo", {f32({1})}, {{"shape", AttrValue(two30)}}),
                                  test_sim().config()));
  CHECK_NOTHROW(compiler::compile(make_op("Fill", {f32({})}, {{"dims", AttrValue(two30)}}),
                                  test_sim().config()));
}

TEST_CASE("ops the compiler cannot do are plain CompileErrors") {
  using V = std::vector<int64_t>;
  const Refusal k = Refusal::kUnsupported;
  check_refusal(make_op("Zeta", {f32({2}), f32({2})}), k);         // no kernel for the op
  check_refusal(make_op("Sigmoid", {{DataType::S32, {4}}}), k);    // a dtype it has no kernel for
  check_refusal(make_op("Conv2D", {f32({1, 5, 5, 3}), f32({3, 3, 3, 2})},
                        {{"strides", AttrValue(V{1, 1, 1, 1})},
                         {"padding", AttrValue(std::string("VALID"))},
                         {"data_format", AttrValue(std::string("NCHW"))}}),
                k);
}
