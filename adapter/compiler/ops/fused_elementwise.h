// FusedElementwise: a chain (a DAG) of element-wise ops compiled as ONE streaming kernel
// (ops/elementwise.h) that keeps every intermediate in the UB, as CANN's graph engine fuses
// element-wise chains into one vector kernel. The TF plugin's graph pass (graph_fusion.h)
// rewrites NPU chains of fusible ops into this op.
//
// The op (TF op and compiler op "FusedElementwise"):
//   inputs   N tensors of type T (float, half or bfloat16), numpy-broadcastable to the output;
//            an input read only by Cast steps may be of another float type (below);
//   attr T   the steps' type (default: input 0's); every step's result has type T;
//   attr steps  list(string), in evaluation order; step k is "<TfOp> <operand>[ <operand>]",
//            each operand "i<n>" (input n) or "s<j>" (the result of step j < k), e.g.
//            {"Sub i0 i1", "Mul s0 i2"} computes (i0 - i1) * i2; the ops: fusible_elementwise's
//            below and ReluGrad (<gradients> <features>, which the graph pass puts after the sum
//            of a residual branch's gradients: its AddN as AddV2 steps); "Cast i<n>" converts input
//            n from its type to T as TF's Cast (Truncate false: round to nearest even) with the
//            cast kernel's vconv, so a cast folded into the chain gives the Cast op's bits
//            (pairs: fusible_cast below; the graph pass folds the casts feeding a chain or an
//            optimizer update, as CANN folds casts into their consumers); "SelectV2 i<c> <t> <e>"
//            picks t where bool input c is true, else e, with the SelectV2 kernel's instructions
//            (an input of type bool is read as such a condition only; one of another shape than
//            the output's is first expanded by a copy launch, as SelectV2's own kernel does:
//            Keras' dropout and its gradient, where(mask, x * scale, 0));
//   output   one tensor: the last step's result, of the inputs' broadcast shape.
// Every step is evaluated at every output position (a step on broadcast operands repeats its
// value), with the same vector instructions, temporaries and roundings as the op's own kernel,
// so the fused result is bit-identical to running the ops one by one.
// One launch; a chain whose kernel does not build (too many inputs for its registers or UB)
// and that begins with an AddN's steps over inputs 0..p runs them first as the AddN op
// (compile_add_n below) into a workspace tensor, then the rest of the chain: the same bits.
//
// FusedVariableUpdate (TF op and compiler op): such a chain computing the new values of M
// variables in one kernel, as CANN's graph engine turns an optimizer's update chain into one
// ApplyAdam-like op. The graph pass makes it from an optimizer's AssignAdd / AssignSub /
// Assign VariableOps and the chains feeding them (graph_fusion.h, rewrite 5).
//   inputs   the M variables' current values (one shape, type T), then the other inputs, of
//            type T or (read by Cast steps only) another float type, every input broadcastable
//            to the variables' shape;
//   attr M   the number of variables; attr T, steps as FusedElementwise's (operand i<j>, j < M,
//            is variable j's value before the update);
//   attr updates  list(int), M entries: variable j's new value is the result of step
//            updates[j] (distinct steps; a later step reading it reads the new value, as a
//            ReadVariableOp after the assignment does);
//   outputs  M tensors of the variables' shape, the new values (the plugin's kernel makes them
//            the variables' buffers, like the fused optimizer ops: ops/optimizer.cpp).
// Steps that are outputs are written straight to their output tile; the others stay in the UB.
#pragma once

#include <string>

#include "adapter/compiler/op_desc.h"

namespace npusim::compiler {
struct CompiledKernel;  // adapter/compiler/compiler.h
}

namespace npusim::compiler::ops {

struct CompileContext;  // ops/registry.h

// AddN (TF op and compiler op; the op table's row names it): N inputs of one shape and float
// type T, their sum as one such streaming kernel of N-1 AddV2 steps, left to right (x0 + x1,
// then + x2, ...), each partial sum rounded to T as TensorFlow's kernel rounds it; N = 1 is a
// copy (the layout family's BroadcastTo to the input's own shape). One launch where its kernel
// fits the chip (its arguments, scalar registers and UB); past that, groups of inputs in
// launches continuing a running sum, in the same order and with the same bits (the .cpp).
CompiledKernel compile_add_n(const CompileContext& ctx);

// Whether `tf_op` may be a step of FusedElementwise for inputs and output of one float type T
// (the element-wise ops of ops/binary.cpp and ops/unary.cpp whose result has their inputs' type).
bool fusible_elementwise(const std::string& tf_op);

// The step that casts an input to T ("Cast i<n>").
inline constexpr const char* kCastStep = "Cast";
// The step that selects by a bool input ("SelectV2 i<c> <t> <e>").
inline constexpr const char* kSelectStep = "SelectV2";

// Whether a Cast step may convert an input of type `src` to T = `dst`: float32 to or from
// float16 / bfloat16 (one vconv each way). Other pairs (float16 <-> bfloat16, integers, the
// same type) are not steps: such a Cast keeps its own launch.
bool fusible_cast(DataType src, DataType dst);

}  // namespace npusim::compiler::ops
