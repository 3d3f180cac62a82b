// The fused optimizer updates of TF1 and tf-keras' legacy optimizers on the NPU:
// ResourceApplyGradientDescent, ResourceApplyMomentum, ResourceApplyAdam,
// ResourceApplyKerasMomentum (types f32, f16, bf16), written on TensorFlow's C++ kernel API like
// kernels_resource_variables.cpp (which says why).
//
// TensorFlow registers these ops for the CPU and GPU only, and a resource input pins an op to its
// variable's device, so without an NPU kernel an NPU variable's update fails at placement, soft
// placement or not. The arithmetic is the compiler's (adapter/compiler/ops/optimizer.cpp,
// docs/compiler.md): the op's inputs with each resource replaced by its variable's tensor, and
// the new values of the variables as outputs (var; var, accum; var, m, v).
// ResourceApplyKerasMomentum (tf-keras' legacy SGD with momentum), which the compiler has no op
// for, is composed of the compiler's binary ops in TensorFlow's functor order (keras_momentum).
//
// Compute follows TensorFlow's training_ops.cc: look up the variables, lock them in address
// order (always, whatever use_locking says: the variables get new buffers, which must not race
// with another update), check they are initialized and of type T, check the shapes (TensorFlow's
// messages), allocate a new buffer per variable, run the compiled update on the op's stream, and
// make the new buffers the variables' tensors. New buffers rather than in-place updates: a
// tensor read from a variable before the step keeps its value (TensorFlow's copy-on-write
// semantics). On any error no variable changes.
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "adapter/tf/plugin/graph_fusion.h"
#include "adapter/tf/plugin/kernel_families.h"
#include "adapter/tf/plugin/tf_cc_kernel_util.h"

namespace npusim::tf {
namespace {

bool g_variable_update_registered = false;

using namespace cc;  // NOLINT: tfc, LockedVariables, update_tensor, ...

// One fused update op: its resource inputs (the first inputs, in order), the input of the
// variables' shape, whether it has use_nesterov, and whether it is composed of binary ops
// (else it is one compiled op of the same name). Every other input is a scalar.
struct ApplyOpDef {
  const char* op;
  std::vector<const char*> variables;
  int grad_input;
  bool has_nesterov;
  bool composed = false;
};

const std::vector<ApplyOpDef>& apply_ops() {
  static const std::vector<ApplyOpDef> ops = {
      {"ResourceApplyGradientDescent", {"var"}, 2, false},
      {"ResourceApplyMomentum", {"var", "accum"}, 3, true},
      {"ResourceApplyAdam", {"var", "m", "v"}, 9, true},
      {"ResourceApplyKerasMomentum", {"var", "accum"}, 3, true, true},
  };
  return ops;
}

// ResourceApplyKerasMomentum (inputs var, accum, lr, grad, momentum; outputs var', accum') as
// the compiler's binary ops, each rounding to T like TensorFlow's Eigen functor
// (training_ops.cc, ApplyKerasMomentum), whose expression order it follows:
//   accum' = accum * momentum - grad * lr
//   var'   = var + accum'                                   (use_nesterov = false)
//   var'   = var + (accum' * momentum - grad * lr)          (use_nesterov = true)
// The scalars broadcast (binary ops broadcast as numpy). Temporaries come from TensorFlow's
// allocator; outputs never alias inputs.
absl::Status keras_momentum(tfc::OpKernelContext* ctx, const tfc::Tensor& like, bool nesterov,
                            const std::vector<UpdateTensor>& in,
                            const std::vector<UpdateTensor>& out) {
  const UpdateTensor &var = in[0], &accum = in[1], &lr = in[2], &grad = in[3],
                     &momentum = in[4];
  tfc::Tensor temps[3];
  for (tfc::Tensor& t : temps) {
    absl::Status st = allocate_like(ctx, like, &t);
    if (!st.ok()) return st;
  }
  const UpdateTensor scaled = update_tensor(temps[0]), step = update_tensor(temps[1]),
                     nesterov_step = update_tensor(temps[2]);
  auto binary = [&](const char* op, const UpdateTensor& a, const UpdateTensor& b,
                    const UpdateTensor& o) {
    // TF_OpKernelContext is TensorFlow's OpKernelContext behind a C name (kernels.cc).
    return to_absl(run_compiled_update(reinterpret_cast<TF_OpKernelContext*>(ctx), op, {},
                                       {a, b}, {o}));
  };
  absl::Status st = binary("Mul", accum, momentum, scaled);
  if (st.ok()) st = binary("Mul", grad, lr, step);
  if (st.ok()) st = binary("Sub", scaled, step, out[1]);
  if (!st.ok()) return st;
  if (!nesterov) return binary("AddV2", var, out[1], out[0]);
  st = binary("Mul", out[1], momentum, scaled);
  if (st.ok()) st = binary("Sub", scaled, step, nesterov_step);
  if (st.ok()) st = binary("AddV2", var, nesterov_step, out[0]);
  return st;
}

const ApplyOpDef* find_apply_op(const std::string& type) {
  for (const ApplyOpDef& d : apply_ops())
    if (type == d.op) return &d;
  return nullptr;
}

// A variable update kernel: its compute() runs the update (GuardedOpKernel).
class UpdateKernel : public GuardedOpKernel {
 public:
  using GuardedOpKernel::GuardedOpKernel;

 protected:
  // New buffers like `var` for the new values of n variables, and their UpdateTensors.
  static absl::Status allocate_new_values(tfc::OpKernelContext* ctx, const tfc::Tensor& var, int n,
                                          std::vector<tfc::Tensor>* updated,
                                          std::vector<UpdateTensor>* outputs) {
    updated->resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      absl::Status st = allocate_like(ctx, var, &(*updated)[i]);
      if (!st.ok()) return st;
      outputs->push_back(update_tensor((*updated)[i]));
    }
    return absl::OkStatus();
  }

  // Variable i (named `what` in messages) is initialized, of type `dtype` and of variable
  // `first`'s shape.
  absl::Status check_variable(const LockedVariables& vars, int i, const std::string& what,
                              tfc::DataType dtype, int first = 0) const {
    const tfc::Tensor* t = vars[i]->tensor();
    if (!vars[i]->is_initialized)
      return absl::FailedPreconditionError(
          absl::StrCat("Attempting to use uninitialized variables: ", what, " of ", name()));
    if (t->dtype() != dtype)
      return absl::InvalidArgumentError(absl::StrCat(name(), ": ", what, " is ",
                                                     tfc::DataTypeString(t->dtype()),
                                                     ", the op's T is ", tfc::DataTypeString(dtype)));
    if (!t->shape().IsSameSize(vars[first]->tensor()->shape()))
      return absl::InvalidArgumentError(absl::StrCat(
          "var and ", what, " do not have the same shape",
          vars[first]->tensor()->shape().DebugString(), " ", t->shape().DebugString()));
    return absl::OkStatus();
  }
};

class ResourceApplyOp : public UpdateKernel {
 public:
  explicit ResourceApplyOp(tfc::OpKernelConstruction* c)
      : UpdateKernel(c), m_def(*find_apply_op(c->def().op())) {  // registered for these only
    OP_REQUIRES_OK(c, c->GetAttr("T", &m_dtype));
    if (m_def.has_nesterov) OP_REQUIRES_OK(c, c->GetAttr("use_nesterov", &m_nesterov));
  }

 private:
  absl::Status compute(tfc::OpKernelContext* ctx) override {
    const int n = static_cast<int>(m_def.variables.size());
    LockedVariables vars;
    absl::Status st = vars.lock(ctx, n);
    if (!st.ok()) return st;
    for (int i = 0; i < n; ++i) {
      st = check_variable(vars, i, m_def.variables[i], m_dtype);
      if (!st.ok()) return st;
    }
    const tfc::Tensor& var = *vars[0]->tensor();
    std::vector<UpdateTensor> inputs;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      if (i < n) {
        inputs.push_back(update_tensor(*vars[i]->tensor()));
        continue;
      }
      const tfc::Tensor& in = ctx->input(i);
      if (i == m_def.grad_input) {
        if (!var.shape().IsSameSize(in.shape()))
          return absl::InvalidArgumentError(
              absl::StrCat("var and grad do not have the same shape", var.shape().DebugString(),
                           " ", in.shape().DebugString()));
      } else if (!tfc::TensorShapeUtils::IsScalar(in.shape())) {
        return absl::InvalidArgumentError(absl::StrCat(
            name(), ": input ", i, " is not a scalar: ", in.shape().DebugString()));
      }
      inputs.push_back(update_tensor(in));
    }

    std::vector<tfc::Tensor> updated;
    std::vector<UpdateTensor> outputs;
    st = allocate_new_values(ctx, var, n, &updated, &outputs);
    if (!st.ok()) return st;
    if (var.NumElements() > 0) {
      if (m_def.composed) {
        st = keras_momentum(ctx, var, m_nesterov, inputs, outputs);
      } else {
        std::vector<std::pair<std::string, bool>> attrs;
        if (m_def.has_nesterov) attrs.emplace_back("use_nesterov", m_nesterov);
        // TF_OpKernelContext is TensorFlow's OpKernelContext behind a C name (kernels.cc).
        st = to_absl(run_compiled_update(reinterpret_cast<TF_OpKernelContext*>(ctx), m_def.op,
                                         attrs, inputs, outputs));
      }
      if (!st.ok()) return st;
    }
    for (int i = 0; i < n; ++i) *vars[i]->tensor() = updated[i];
    return absl::OkStatus();
  }

  const ApplyOpDef& m_def;
  tfc::DataType m_dtype = tfc::DT_INVALID;
  bool m_nesterov = false;
};

// FusedVariableUpdate(resources: M * resource, inputs: Tin; steps, updates, members): the
// graph fusion's form of an optimizer's AssignAdd / AssignSub / Assign VariableOps with the
// chains feeding them (graph_fusion.h, rewrites 5 and 5b; the compiler's contract in
// adapter/compiler/ops/fused_elementwise.h). Compute as ResourceApplyOp's: the variables locked,
// checked (initialized, of type T, one shape per member, distinct), a new buffer per variable,
// the compiled launches writing every new value, the buffers made the variables' tensors; on
// any error no variable changes. The inputs must broadcast to the variables' shape (the
// compiler checks). With members > 1 (rewrite 5b: one update of several variables' chains, as
// CANN's multi-tensor kernels), member g's variables are M / members consecutive resources.
class FusedVariableUpdateOp : public UpdateKernel {
 public:
  explicit FusedVariableUpdateOp(tfc::OpKernelConstruction* c) : UpdateKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("T", &m_dtype));
    OP_REQUIRES_OK(c, c->GetAttr("M", &m_variables));
    OP_REQUIRES_OK(c, c->GetAttr("steps", &m_steps));
    OP_REQUIRES_OK(c, c->GetAttr("updates", &m_updates));
    if (c->HasAttr("members")) OP_REQUIRES_OK(c, c->GetAttr("members", &m_members));
    if (c->HasAttr("_npusim_members"))
      OP_REQUIRES_OK(c, c->GetAttr("_npusim_members", &m_member_names));
    if (c->HasAttr("_npusim_report_type"))
      OP_REQUIRES_OK(c, c->GetAttr("_npusim_report_type", &m_report_type));
    OP_REQUIRES(c, m_members >= 1 && m_variables % m_members == 0,
                absl::InvalidArgumentError(absl::StrCat(
                    c->def().name(), ": members = ", m_members, " does not divide M = ",
                    m_variables)));
  }

 private:
  absl::Status compute(tfc::OpKernelContext* ctx) override {
    const int n = static_cast<int>(m_variables);
    LockedVariables vars;
    absl::Status st = vars.lock(ctx, n);
    if (!st.ok()) return st;
    const tfc::Tensor& var = *vars[0]->tensor();
    const int per_member = n / static_cast<int>(m_members);
    for (int i = 0; i < n; ++i) {
      const std::string what =
          m_members > 1 ? absl::StrCat("variable ", i, " (", member_name(i / per_member), ")")
                        : absl::StrCat("variable ", i);
      st = check_variable(vars, i, what, m_dtype, i / per_member * per_member);
      if (!st.ok()) return st;
      for (int j = 0; j < i; ++j)
        if (vars[j] == vars[i])
          return absl::InvalidArgumentError(
              absl::StrCat(name(), ": variables ", j, " and ", i, " are the same variable"));
    }
    std::vector<UpdateTensor> inputs;
    for (int i = 0; i < ctx->num_inputs(); ++i)
      inputs.push_back(update_tensor(i < n ? *vars[i]->tensor() : ctx->input(i)));
    std::vector<tfc::Tensor> updated;
    std::vector<UpdateTensor> outputs;
    int64_t elements = 0;
    updated.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {  // each like its own variable (members differ in shape)
      st = allocate_like(ctx, *vars[i]->tensor(), &updated[static_cast<size_t>(i)]);
      if (!st.ok()) return st;
      outputs.push_back(update_tensor(updated[static_cast<size_t>(i)]));
      elements += vars[i]->tensor()->NumElements();
    }
    (void)var;
    if (elements > 0) {
      UpdateAttrs attrs;
      attrs.ints = {{"M", m_variables}};
      if (m_members > 1) attrs.ints.emplace_back("members", m_members);
      attrs.int_lists = {{"updates", m_updates}};
      attrs.string_lists = {{"steps", m_steps}};
      attrs.members = m_member_names;
      attrs.report_type = m_report_type;
      // TF_OpKernelContext is TensorFlow's OpKernelContext behind a C name (kernels.cc).
      st = to_absl(run_compiled_update(reinterpret_cast<TF_OpKernelContext*>(ctx),
                                       "FusedVariableUpdate", {}, inputs, outputs, attrs));
      if (!st.ok()) return st;
    }
    for (int i = 0; i < n; ++i) *vars[i]->tensor() = updated[i];
    return absl::OkStatus();
  }

  // "member g" and, where the graph pass recorded it, the member's original node name.
  std::string member_name(int g) const {
    const std::string index = absl::StrCat("member ", g);
    return static_cast<size_t>(g) < m_member_names.size()
               ? absl::StrCat(index, ", node '", m_member_names[static_cast<size_t>(g)], "'")
               : index;
  }

  tfc::DataType m_dtype = tfc::DT_INVALID;
  int64_t m_variables = 0;
  int64_t m_members = 1;
  std::vector<std::string> m_member_names;  // `_npusim_members`: the original nodes' names
  std::string m_report_type;  // `_npusim_report_type`: reports' op type (empty: the op's)
  std::vector<std::string> m_steps;
  std::vector<int64_t> m_updates;
};

// GraphVariables (dense_update.h) on TensorFlow's C++ API: LockedVariables plus the new
// buffers, made the variables' tensors by publish().
class LockedGraphVariables : public GraphVariables {
 public:
  absl::Status lock(tfc::OpKernelContext* ctx, int first, int n) {
    absl::Status st = m_vars.lock(ctx, first, n);
    if (!st.ok()) return st;
    m_new.resize(static_cast<size_t>(n));
    m_has_new.assign(static_cast<size_t>(n), 0);
    for (int k = 0; k < n; ++k) {
      if (!m_vars[k]->is_initialized)
        return absl::FailedPreconditionError(absl::StrCat(
            "Attempting to use uninitialized variables: input ", first + k));
      for (int j = 0; j < k; ++j)
        if (m_vars[j] == m_vars[k])
          return absl::InvalidArgumentError(
              absl::StrCat("inputs ", first + j, " and ", first + k, " are the same variable"));
    }
    return absl::OkStatus();
  }
  UpdateTensor value(int k) const override { return update_tensor(*m_vars[k]->tensor()); }
  DenseUpdateStatus allocate_new_value(TF_OpKernelContext* tf_ctx, int k,
                                       uint64_t* address) override {
    // TF_OpKernelContext is TensorFlow's OpKernelContext behind a C name (kernels.cc).
    auto* ctx = reinterpret_cast<tfc::OpKernelContext*>(tf_ctx);
    tfc::Tensor& t = m_new[static_cast<size_t>(k)];
    const absl::Status st = allocate_like(ctx, *m_vars[k]->tensor(), &t);
    if (!st.ok()) return {static_cast<TF_Code>(st.code()), std::string(st.message())};
    m_has_new[static_cast<size_t>(k)] = 1;
    *address = device_address(t);
    return {};
  }
  DenseUpdateStatus own_buffer(TF_OpKernelContext* tf_ctx, int k) override {
    tfc::Tensor* var = m_vars[k]->tensor();
    if (var->RefCountIsOne()) return {};
    // TF_OpKernelContext is TensorFlow's OpKernelContext behind a C name (kernels.cc).
    auto* ctx = reinterpret_cast<tfc::OpKernelContext*>(tf_ctx);
    tfc::Tensor fresh;
    const absl::Status st = allocate_like(ctx, *var, &fresh);
    if (!st.ok()) return {static_cast<TF_Code>(st.code()), std::string(st.message())};
    const DenseUpdateStatus copied =
        copy_on_device(tf_ctx, static_cast<TF_DataType>(var->dtype()), var->NumElements(),
                       device_address(*var), device_address(fresh));
    if (copied.ok()) *var = fresh;
    return copied;
  }
  void publish() override {
    for (size_t k = 0; k < m_new.size(); ++k)
      if (m_has_new[k]) *m_vars[k]->tensor() = m_new[k];
  }

 private:
  LockedVariables m_vars;
  std::vector<tfc::Tensor> m_new;
  // Whether variable k has a new buffer (m_new[k]); not: not updated by this run, or updated in
  // place. (A default tensor counts as initialized: it has 0 elements.)
  std::vector<char> m_has_new;
};

}  // namespace

bool fused_variable_update_registered() { return g_variable_update_registered; }

DenseUpdateStatus GraphVariables::lock(TF_OpKernelContext* ctx, int first, int n,
                                       std::unique_ptr<GraphVariables>* out) {
  try {
    auto vars = std::make_unique<LockedGraphVariables>();
    // TF_OpKernelContext is TensorFlow's OpKernelContext behind a C name (kernels.cc).
    const absl::Status st =
        vars->lock(reinterpret_cast<tfc::OpKernelContext*>(ctx), first, n);
    if (!st.ok()) return {static_cast<TF_Code>(st.code()), std::string(st.message())};
    *out = std::move(vars);
    return {};
  } catch (const std::exception& e) {
    return {TF_INTERNAL, e.what()};
  }
}

rt::Status register_optimizer_kernels(const std::vector<TableKernelDef>& compiler_ops) {
  return rt::guard("registering the NPU's fused optimizer kernels", [&] {
    // ResourceApplyKerasMomentum: the types of ResourceApplyMomentum, which it stands in for.
    const TableKernelDef* momentum = nullptr;
    for (const TableKernelDef& d : compiler_ops)
      if (d.op == "ResourceApplyMomentum") momentum = &d;
    if (!momentum)
      return rt::Status(rt::StatusCode::internal, "the op table has no ResourceApplyMomentum");
    std::vector<TableKernelDef> defs = compiler_ops;
    defs.push_back({"ResourceApplyKerasMomentum", momentum->type_constraints, {}});
    for (const TableKernelDef& d : defs) {
      tfc::KernelDefBuilder builder(d.op.c_str());
      builder.Device("NPU");
      for (const auto& [attr, types] : d.type_constraints) {
        std::vector<tfc::DataType> allowed;
        for (TF_DataType t : types) allowed.push_back(static_cast<tfc::DataType>(t));
        builder.TypeConstraint(attr.c_str(), allowed);
      }
      if (d.op == "FusedVariableUpdate") {
        // Registered only where kernels_fused.cpp registered its op definition.
        if (!fused_ops_registered()) continue;
        builder.HostMemory("resources");
        register_npu_kernel<FusedVariableUpdateOp>(builder, d.op);
        g_variable_update_registered = true;
        continue;
      }
      const ApplyOpDef* apply = find_apply_op(d.op);
      if (!apply)
        return rt::Status(rt::StatusCode::internal, d.op + " is no fused optimizer update");
      // The row's host-memory inputs, then the variables' resource handles.
      for (const std::string& arg : d.host_memory) builder.HostMemory(arg.c_str());
      for (const char* v : apply->variables) builder.HostMemory(v);
      register_npu_kernel<ResourceApplyOp>(builder, d.op);
    }
    return rt::ok_status();
  });
}

}  // namespace npusim::tf
