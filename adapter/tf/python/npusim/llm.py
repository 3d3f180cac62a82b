"""The decoder-model ops the plugin adds (CANN's op types), callable from Python.

TensorFlow generates no `tf.raw_ops` wrappers for ops a plugin defines, so these functions
build the op directly: eagerly (TensorFlow's generic op execution) or, inside `tf.function`,
as a graph node. They run on the NPU only (the ops have no CPU kernel): call them under
`tf.device("/NPU:0")` or let soft placement put them there.

    import npusim.llm as llm
    o = llm.flash_attention(q, k, v, sparse_mode=3)          # prefill, causal
    o = llm.incre_flash_attention(q, k_cache, v_cache, 17)    # one decode step, 17 valid keys
    y = llm.rms_norm(x, gamma, epsilon=1e-6)
    y = llm.layer_norm(x, gamma, beta, epsilon=1e-5)
    y = llm.swiglu(gate, up)
    y = llm.geglu(gate, up)                                   # gelu(gate) * up, tanh form
    y = llm.gelu(x)                                           # tanh form (CANN's Gelu)
    y = llm.rotary_embedding(x, cos, sin)

Layouts, numerics and limits: docs/compiler.md, "Decoder-model kernels".
"""

import tensorflow as tf
from tensorflow.python.eager import context, execute
from tensorflow.python.framework import op_def_library

__all__ = ["flash_attention", "prompt_flash_attention", "incre_flash_attention", "rms_norm",
           "layer_norm", "rotary_embedding", "swiglu", "geglu", "gelu", "update_variable_slice"]


# Every attribute is given: graph construction does not fill in the defaults of ops a plugin
# defines. Heads come from the shapes (0), layout BSND.
_ATTENTION_ATTRS = {"input_layout": "BSND", "num_heads": 0, "num_key_value_heads": 0}


def _run(op, inputs, attrs, type_attrs=None):
    """One output of plugin op `op` on `inputs` (dict name -> tensor, in the op's order) with
    attributes `attrs` (dict; "T" is taken from the first input; type_attrs: dict of further
    type attributes -> the input name whose dtype they are, which graph mode infers itself)."""
    tensors = [tf.convert_to_tensor(t) for t in inputs.values()]
    dtype = tensors[0].dtype
    if context.executing_eagerly():
        flat = ["T", dtype.as_datatype_enum]
        by_name = dict(zip(inputs.keys(), tensors))
        for name, source in (type_attrs or {}).items():
            flat += [name, by_name[source].dtype.as_datatype_enum]
        for name, value in attrs.items():
            flat += [name, value]
        return execute.execute(op, 1, inputs=tensors, attrs=tuple(flat),
                               ctx=context.context())[0]
    kwargs = dict(zip(inputs.keys(), tensors))
    kwargs.update(attrs)
    node = op_def_library._apply_op_helper(op, **kwargs)[2]  # (structure, stateful, op, ...)
    return node.outputs[0]


def flash_attention(query, key, value, scale=0.0, sparse_mode=0, op="FlashAttentionScore"):
    """softmax(query key^T * scale + mask) value; query [B, Sq, N, D], key and value
    [B, Skv, Nkv, D] (BSND), f16 or bf16; scale 0: 1/sqrt(D); sparse_mode 0 no mask, 2 causal
    (query i sees keys <= i), 3 causal right-down (query i sees keys <= i + Skv - Sq)."""
    return _run(op, {"query": query, "key": key, "value": value},
                dict(_ATTENTION_ATTRS, scale_value=float(scale), sparse_mode=int(sparse_mode)))


def prompt_flash_attention(query, key, value, scale=0.0, sparse_mode=0):
    """flash_attention as CANN's prefill op type PromptFlashAttention."""
    return flash_attention(query, key, value, scale, sparse_mode, op="PromptFlashAttention")


def incre_flash_attention(query, key, value, actual_seq_length, scale=0.0):
    """One decode step: query [B, 1, N, D] against the first actual_seq_length positions of the
    KV cache key, value [B, L, Nkv, D]."""
    with tf.device("/CPU:0"):  # built on the host; TensorFlow copies it to the kernel
        batch = tf.shape(query, out_type=tf.int64)[0]
        lengths = tf.fill([batch], tf.cast(actual_seq_length, tf.int64))
    return _run("IncreFlashAttention",
                {"query": query, "key": key, "value": value, "actual_seq_lengths": lengths},
                dict(_ATTENTION_ATTRS, scale_value=float(scale)))


def rms_norm(x, gamma, epsilon=1e-6):
    """x * rsqrt(mean(x^2 over the last axis) + epsilon) * gamma."""
    return _run("RmsNorm", {"x": x, "gamma": gamma}, {"epsilon": float(epsilon)})


def rotary_embedding(x, cos, sin):
    """x * cos + rotate_half(x) * sin (keras-hub's half-split layout), x [B, S, N, D], cos and
    sin [S, D] or [1, S, 1, D]."""
    return _run("RotaryPositionEmbedding", {"x": x, "cos": cos, "sin": sin}, {"mode": 0})


def swiglu(gate, up):
    """silu(gate) * up (Llama's feed-forward)."""
    return _run("SwiGlu", {"gate": gate, "up": up}, {})


def layer_norm(x, gamma, beta, epsilon=1e-5):
    """(x - mean) * rsqrt(variance + epsilon) * gamma + beta over the last axis (CANN's
    LayerNorm; y only). gamma and beta [H] of one dtype, x's or float32 (computed in f32)."""
    return _run("LayerNorm", {"x": x, "gamma": gamma, "beta": beta}, {"epsilon": float(epsilon)},
                type_attrs={"Tgamma": "gamma"})


def geglu(gate, up, approximate=1):
    """gelu(gate) * up (Gemma's feed-forward); approximate 1: gelu's tanh form, 0: its erf form
    (CANN's GeGlu attribute)."""
    return _run("GeGlu", {"gate": gate, "up": up}, {"approximate": int(approximate)})


def gelu(x, approximate=1):
    """gelu(x): approximate 1 the tanh form (CANN's Gelu, tf.nn.gelu(approximate=True)), 0 the
    erf form."""
    return _run("Gelu", {"x": x}, {"approximate": int(approximate)})


def update_variable_slice(variable, update, indices):
    """Writes `update` into the resource variable `variable` (on the NPU) at the start
    `indices` ([rank] int32 or int64), in place: XlaDynamicUpdateSlice's result (each start
    clamped to [0, variable dim - update dim]) without copying the variable, only the update's
    bytes move (a KV cache held in a variable per layer gets the new token's row). The plugin's
    op ResourceDynamicUpdateSlice (adapter/tf/plugin/kernels_resource_variables.cpp: one launch
    per contiguous run of the update, each run whole 32-byte blocks). Eagerly it runs now and
    returns None; inside tf.function it returns the op (automatic control dependencies order it
    with the function's other reads and writes of the variable)."""
    handle = variable.handle
    update = tf.convert_to_tensor(update, dtype=variable.dtype)
    with tf.device("/CPU:0"):  # the kernel reads the starts in host memory
        indices = tf.convert_to_tensor(indices)
    if indices.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"indices must be int32 or int64, not {indices.dtype.name}")
    if context.executing_eagerly():
        execute.execute("ResourceDynamicUpdateSlice", 0, inputs=[handle, update, indices],
                        attrs=("T", update.dtype.as_datatype_enum,
                               "Tindices", indices.dtype.as_datatype_enum),
                        ctx=context.context())
        return None
    return op_def_library._apply_op_helper("ResourceDynamicUpdateSlice", resource=handle,
                                           update=update, indices=indices)[2]
