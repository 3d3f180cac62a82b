"""MobileNetV2's inference fusions (adapter/tf/plugin/graph_fusion.h rewrites 1, 1b and 2,
docs/tf_plugin.md "Inference fusions"): ReLU6 in the batch norm's pass (relu6), the
ZeroPadding2D before a strided depthwise convolution absorbed into the convolution's padding
(EXPLICIT), the depthwise convolution with its batch norm (DepthwiseConv2dBatchNormInference),
and the f16 hand-offs between the fused convolutions.

A MobileNetV2 inverted-residual block (1x1 expansion + BN + ReLU6, ZeroPadding2D, 3x3
depthwise of stride 2 + BN + ReLU6, 1x1 projection + BN) runs with training=False in a
tf.function on the NPU (tiny chip):

- the output matches TensorFlow on the CPU within the precision mode's bound (three
  convolutions on the path, each rounding its operands to fp16: ~2u = 1e-3 relative per layer,
  tests/tf/test_fusion.py's 1e-2 of the tensor's norm);
- ReLU6 clamps at 0 and at 6 (a block whose output is the clamped tensor: values at exactly 0
  and 6 where the CPU has them);
- the launch records have no Relu6 and no Pad launches, the two clamps run in the batch norms'
  passes (BatchNormInferenceRelu6 kernels), and the same block with NPUSIM_FUSION=0 (a child
  process) launches at least the Relu6 and Pad passes more;
- the only cast is x's: each fused convolution hands its output to the next in f16, bit for
  bit what the reader's cast gives (the same block with the intermediate also fetched);
- what must not fuse stays as it was and still matches the CPU: a ReLU6 whose input is also a
  model output, a Pad whose output is also a model output, a Pad along channels, a ReLU6 in
  float16 (Keras' mixed_float16 BatchNormalization casts back to half before it), and a
  training step (GradientTape: the gradients read the Pad's output and the ReLU6's input).
"""

import json
import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import INFERENCE_HELPERS, chip_config, run_child  # noqa: E402  pylint: disable=wrong-import-position

RTOL = 1e-2

# Builds the model and input (also run in the child, so both processes see the same graph).
MODEL_CODE = INFERENCE_HELPERS + r'''
def build_block(outputs=("out",), wide=True):
    """MobileNetV2's stride-2 block (keras.applications' layer order); `outputs` names the
    model's outputs: out, expanded (the expansion's ReLU6), expanded_bn (its input), padded,
    dw (the depthwise convolution's ReLU6).
    wide: batch-norm parameters and input that put many pre-activations beyond 6."""
    keras.utils.set_random_seed(21)
    inp = keras.Input((8, 8, 8))
    h = keras.layers.Conv2D(32, 1, use_bias=False)(inp)
    expanded_bn = keras.layers.BatchNormalization(epsilon=1e-3, momentum=0.999)(h)
    expanded = keras.layers.ReLU(6.0)(expanded_bn)
    padded = keras.layers.ZeroPadding2D(((0, 1), (0, 1)))(expanded)
    h = keras.layers.DepthwiseConv2D(3, strides=2, padding="valid", use_bias=False)(padded)
    h = keras.layers.BatchNormalization(epsilon=1e-3, momentum=0.999)(h)
    dw = keras.layers.ReLU(6.0)(h)
    h = keras.layers.Conv2D(8, 1, use_bias=False)(dw)
    out = keras.layers.BatchNormalization(epsilon=1e-3, momentum=0.999)(h)
    named = {"out": out, "expanded": expanded, "expanded_bn": expanded_bn, "padded": padded,
             "dw": dw}
    model = keras.Model(inp, [named[o] for o in outputs])
    if wide:  # the ReLU6s clamp at 6 as well as at 0
        set_batch_norms(model, 5, gamma=(1.0, 4.0), beta=(-1.0, 4.0))
    else:
        set_batch_norms(model, 5)
    x = ((2 if wide else 1) * np.random.default_rng(6).standard_normal((2, 8, 8, 8))).astype(
        np.float32)
    return model, x
'''

CHILD_CODE = MODEL_CODE + r'''
import json
import npusim
import tensorflow as tf
model, x = build_block()
with tf.device("/NPU:0"):
    f = tf.function(lambda t: model(t, training=False))
    xt = tf.constant(x)
    f(xt).numpy()
    n0 = len(npusim.launch_records())
    f(xt).numpy()
    recs = npusim.launch_records()[n0:]
print("RESULT " + json.dumps({"launches": len(recs),
                              "op_types": sorted({r["op_type"] for r in recs})}))
'''

exec(MODEL_CODE)  # pylint: disable=exec-used


def rel_error(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def run_npu(npusim, tf, model, x, training=False):
    """The model's outputs on the NPU (second run of its tf.function) and that run's launch
    records."""
    return npu_second_run(npusim, tf, model, x, training)  # pylint: disable=undefined-variable


def run_cpu(tf, model, x, training=False):
    with tf.device("/CPU:0"):
        want = model(tf.constant(x), training=training)
    return [np.asarray(w) for w in (want if isinstance(want, (list, tuple)) else [want])]


@pytest.fixture(scope="module")
def block(npusim, tf):
    model, x = build_block()  # pylint: disable=undefined-variable
    want = run_cpu(tf, model, x)[0]
    got, recs = run_npu(npusim, tf, model, x)
    return {"want": want, "got": got[0], "records": recs}


def test_block_matches_cpu(block):
    assert block["got"].shape == block["want"].shape == (2, 4, 4, 8)
    assert rel_error(block["got"], block["want"]) < RTOL


def _clamp_in_conv_epilogue():
    """Where C leaves L0C through the UB (no l0c->gm path: the 910, 310P), the batch norm, its
    ReLU6 and the f16 hand-off run in the convolution's own kernel (ops/conv2d.cpp
    batch_norm_in_epilogue; test_coupled_chip_runs_the_batch_norms_in_the_convolutions_epilogue),
    not in a batch-norm pass of their own."""
    return "l0c->gm" not in chip_config()["paths"]


def test_relu6_and_pad_leave_no_launches_of_their_own(block):
    recs = block["records"]
    types = {r["op_type"] for r in recs}
    for gone in ("Relu6", "Pad", "PadV2", "Conv2D", "Rsqrt", "Mul", "Sub", "AddV2"):
        assert gone not in types, f"{gone} was not fused: {sorted(types)}"
    assert types == {"Conv2DBatchNormInference", "DepthwiseConv2dBatchNormInference"}, types
    clamps = {r["op_type"]: r["kernel"] for r in recs
              if r["kernel"].startswith("BatchNormInferenceRelu6")}
    if _clamp_in_conv_epilogue():
        assert not clamps, clamps
        assert {"Conv2DBatchNormInferenceRelu6_f16",
                "DepthwiseConv2dBatchNormInferenceRelu6_f16"} <= {r["kernel"] for r in recs}, recs
        return
    # the expansion's and the depthwise convolution's, each handing its result to the next
    # convolution in fp16 (the cube's f32 result in, f16 out)
    assert clamps == {"Conv2DBatchNormInference": "BatchNormInferenceRelu6_f32_f16",
                      "DepthwiseConv2dBatchNormInference": "BatchNormInferenceRelu6_f32_f16"}, clamps
    # the fused nodes keep the ReLU6 layers' names
    assert all("re_lu" in r["op_name"] for r in recs
               if r["kernel"].startswith("BatchNormInferenceRelu6")), recs


@pytest.mark.parametrize("fetched", ["expanded", "dw"])
def test_fp16_handoffs_between_the_fused_convolutions(npusim, tf, block, fetched):
    """Each fused convolution whose only reader is the next one writes f16 (its batch norm's
    pass rounds the f32 result once, RNE: the rounding the reader's input cast applies), so the
    block's only cast is x's. Fetching an intermediate as well keeps it f32 and brings its
    reader's cast back; the output is the same bits."""
    model, x = build_block(outputs=("out", fetched))  # pylint: disable=undefined-variable
    got, recs = run_npu(npusim, tf, model, x)
    np.testing.assert_array_equal(got[0], block["got"])
    casts = lambda records: sorted(r["op_type"] for r in records if r["kernel"].startswith("Cast"))
    assert casts(block["records"]) == ["Conv2DBatchNormInference"]  # x's
    reader = "DepthwiseConv2dBatchNormInference" if fetched == "expanded" else "Conv2DBatchNormInference"
    assert casts(recs) == sorted(["Conv2DBatchNormInference", reader])


def test_fewer_launches_than_with_fusion_off(block):
    proc = run_child("import os\nos.environ['NPUSIM_FUSION'] = '0'\n" + CHILD_CODE, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    off = json.loads(line[len("RESULT "):])
    assert {"Relu6", "Pad"} <= set(off["op_types"]), off["op_types"]
    # at least the two Relu6 passes and the Pad's copy
    assert off["launches"] - len(block["records"]) >= 3, (off, len(block["records"]))


def test_relu6_clamps_at_zero_and_six(npusim, tf):
    model, x = build_block(outputs=("expanded",))  # pylint: disable=undefined-variable
    want = run_cpu(tf, model, x)[0]
    got, recs = run_npu(npusim, tf, model, x)
    got = got[0]
    assert (want == 6).any() and (want == 0).any()  # the test exercises both clamps
    assert rel_error(got, want) < RTOL
    np.testing.assert_array_equal(got == 6, want == 6)
    assert got.max() == 6 and got.min() == 0
    assert "Relu6" not in {r["op_type"] for r in recs}


@pytest.mark.parametrize("second, kept, fused", [
    ("expanded_bn", "Relu6", "Pad"),  # the expansion's ReLU6 reads a model output
    ("padded", "Pad", "Relu6"),       # the Pad is a model output
])
def test_a_chain_node_read_as_a_model_output_is_kept(npusim, tf, second, kept, fused):
    model, x = build_block(outputs=("out", second))  # pylint: disable=undefined-variable
    want = run_cpu(tf, model, x)
    got, recs = run_npu(npusim, tf, model, x)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert rel_error(g, w) < RTOL
    types = [r["op_type"] for r in recs]
    # one kept (the expansion's ReLU6: the depthwise batch norm's is fused either way)
    assert types.count(kept) == 1 and fused not in types, sorted(set(types))


def test_pad_along_channels_or_before_same_padding_is_kept(npusim, tf):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 6, 6, 4)).astype(np.float32)
    w6 = rng.standard_normal((3, 3, 6, 8)).astype(np.float32)
    w4 = rng.standard_normal((3, 3, 4, 8)).astype(np.float32)

    def channels(t):
        return tf.nn.conv2d(tf.pad(t, [[0, 0], [1, 1], [1, 1], [1, 1]]), w6, 1, "VALID")

    def same(t):
        return tf.nn.conv2d(tf.pad(t, [[0, 0], [1, 0], [0, 1], [0, 0]]), w4, 1, "SAME")

    def absorbed(t):
        return tf.nn.conv2d(tf.pad(t, [[0, 0], [2, 0], [0, 1], [0, 0]]), w4, 2, "VALID")

    for fn, pad_kept in ((channels, True), (same, True), (absorbed, False)):
        with tf.device("/CPU:0"):
            want = fn(tf.constant(x)).numpy()
        with tf.device("/NPU:0"):
            f = tf.function(fn)
            f(tf.constant(x))
            n0 = len(npusim.launch_records())
            got = f(tf.constant(x)).numpy()
            recs = npusim.launch_records()[n0:]
        assert got.shape == want.shape, fn.__name__
        assert rel_error(got, want) < RTOL, fn.__name__
        assert ("Pad" in {r["op_type"] for r in recs}) == pad_kept, (fn.__name__, recs)


def test_float16_relu6_is_kept(npusim, tf):
    """Under Keras' mixed_float16 the batch norm computes in float32 and casts back to half:
    the ReLU6 then reads a Cast, not the batch norm's chain, and stays a launch of its own."""
    keras.utils.set_random_seed(3)
    inp = keras.Input((6, 6, 8))
    h = keras.layers.Conv2D(16, 1, use_bias=False, dtype="mixed_float16")(inp)
    h = keras.layers.BatchNormalization(dtype="mixed_float16")(h)
    out = keras.layers.ReLU(6.0, dtype="mixed_float16")(h)
    model = keras.Model(inp, out)
    set_batch_norms(model, 4)  # pylint: disable=undefined-variable
    x = np.random.default_rng(1).standard_normal((1, 6, 6, 8)).astype(np.float32)
    want = run_cpu(tf, model, x)[0]
    got, recs = run_npu(npusim, tf, model, x)
    assert got[0].dtype == np.float16
    assert rel_error(got[0], want) < RTOL
    relu6 = [r for r in recs if r["op_type"] == "Relu6"]
    assert len(relu6) == 1 and relu6[0]["kernel"].endswith("f16"), relu6
    assert not any(r["kernel"].startswith("BatchNormInferenceRelu6") for r in recs)


def test_training_step_keeps_pad_and_relu6(npusim, tf):
    """Under a GradientTape the depthwise filter's gradient reads the Pad's output and each
    Relu6Grad the ReLU6's input: neither is removable, the gradients match the CPU. (The
    batch norms' narrow parameters: a pre-activation within fp16 rounding of a clamp flips its
    gradient's mask, a jump no rounding bound covers; few lie near 6 here.)"""
    model_cpu, x = build_block(wide=False)  # pylint: disable=undefined-variable
    model_npu, _ = build_block(wide=False)  # pylint: disable=undefined-variable

    def grads(model):
        def step(t):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(t, training=False) ** 2)
            return tape.gradient(loss, model.trainable_variables)
        return step

    with tf.device("/CPU:0"):
        want = [g.numpy() for g in grads(model_cpu)(tf.constant(x))]
    with tf.device("/NPU:0"):
        f = tf.function(grads(model_npu))
        f(tf.constant(x))
        n0 = len(npusim.launch_records())
        got = [g.numpy() for g in f(tf.constant(x))]
        recs = npusim.launch_records()[n0:]
    # the backward pass puts about twice the forward's fp16-rounded products on each path
    for g, w in zip(got, want):
        assert rel_error(g, w) < 2 * RTOL, [(v.path, rel_error(a, b)) for v, a, b in zip(model_npu.trainable_variables, got, want)]
    types = {r["op_type"] for r in recs}
    assert {"Pad", "Relu6"} <= types, sorted(types)


MIX_CHILD_CODE = MODEL_CODE + r'''
import json
import numpy as np
import npusim
import tensorflow as tf
model, x = build_block()
with tf.device("/CPU:0"):
    want = model(tf.constant(x), training=False).numpy()
with tf.device("/NPU:0"):
    f = tf.function(lambda t: model(t, training=False))
    f(tf.constant(x))
    n0 = len(npusim.launch_records())
    got = f(tf.constant(x)).numpy()
    recs = npusim.launch_records()[n0:]
err = float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))
print("RESULT " + json.dumps({"err": err, "dtype": str(got.dtype),
                              "kernels": [[r["op_type"], r["kernel"]] for r in recs]}))
'''


def test_allow_mix_precision_runs_the_fused_convolutions_in_float16():
    """Under allow_mix_precision the mixed precision pass puts the fused convolutions on their
    product's trustlist and runs them in float16 through Tx / Tout (filter and batch norm stay
    float32): every activation between them is f16, the only casts are x's on the way in and
    the result's on the way out, and the output matches the CPU (the same roundings as the
    default mode's hand-offs, plus the output's own f16 rounding)."""
    proc = run_child(MIX_CHILD_CODE, timeout=300,
                     extra_env={"NPUSIM_PRECISION_MODE": "allow_mix_precision"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    res = json.loads(line[len("RESULT "):])
    assert res["dtype"] == "float32" and res["err"] < RTOL, res
    kernels = [tuple(k) for k in res["kernels"]]
    casts = sorted(k for t, k in kernels if k.startswith("Cast"))
    assert casts == ["Cast_f16_f32", "Cast_f32_f16"], kernels
    passes = sorted(k for t, k in kernels if k.startswith("BatchNormInference"))
    if _clamp_in_conv_epilogue():
        assert not passes, kernels
        assert ("Conv2DBatchNormInference", "Conv2DBatchNormInference_f16") in kernels, kernels
        return
    # expansion and depthwise: ReLU6 in the batch norm's pass, the cube's f32 result in, f16
    # out; the projection (no clamp, the tiny chip has a bias table): FIXPIPE writes f16
    assert passes == ["BatchNormInferenceRelu6_f32_f16"] * 2, kernels
    assert ("Conv2DBatchNormInference", "Conv2DBias_f16") in kernels, kernels


COUPLED_CODE = MODEL_CODE + r'''
import json
import npusim
import tensorflow as tf
model, x = build_block()
with tf.device("/CPU:0"):
    want = np.asarray(model(tf.constant(x), training=False), np.float64)
with tf.device("/NPU:0"):
    f = tf.function(lambda t: model(t, training=False))
    xt = tf.constant(x)
    f(xt).numpy()
    n0 = len(npusim.launch_records())
    got = np.asarray(f(xt), np.float64)
    recs = npusim.launch_records()[n0:]
print("RESULT " + json.dumps({
    "rel_error": float(np.linalg.norm(got - want) / np.linalg.norm(want)),
    "kernels": sorted({r["kernel"] for r in recs})}))
'''


def test_coupled_chip_runs_the_batch_norms_in_the_convolutions_epilogue():
    """On a coupled chip (tiny_coupled: the 310P's core, no bias table) the fused convolutions'
    batch norm, ReLU6 and f16 hand-off run on each tile in the UB, in the convolution's own
    kernel (docs/compiler.md): no batch-norm pass of their own, and the block still matches the
    CPU."""
    proc = run_child(COUPLED_CODE, timeout=300, extra_env={"NPUSIM_CHIP": "tiny_coupled"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT "):])
    assert result["rel_error"] < RTOL, result
    kernels = result["kernels"]
    assert "Conv2DBatchNormInferenceRelu6_f16" in kernels, kernels  # the expansion
    assert "DepthwiseConv2dBatchNormInferenceRelu6_f16" in kernels, kernels
    assert not [k for k in kernels
                if k.startswith("BatchNormInference") and k != "BatchNormInferenceFold"], kernels
