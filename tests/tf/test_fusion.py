"""The plugin's inference fusions (adapter/tf/plugin/graph_fusion.h, docs/tf_plugin.md
"Inference fusions"): a Keras Conv2D + BatchNormalization + ReLU block with a residual
Add + ReLU, called with training=False in a tf.function on the NPU.

- the NPU output matches TensorFlow on the CPU (same weights) within the precision mode's
  tolerance: allow_fp32_to_fp16 rounds each convolution's operands to fp16 (relative error
  <= u = 2^-11 each, fp32 accumulation), so a layer carries about 2u ~ 1e-3 relative error at
  worst; the block has 2 convolutions on its longest path, and the fused batch norm adds only
  f32 rounding: the shallow-model bound of tests/tf/test_models.py, 1e-2 of the whole tensor's
  norm;
- the launch records show Conv2DBatchNormInference launches (each convolution with its batch
  norm folded in, the second with the residual Add and the ReLU after it: rewrite 2b)
  carrying the fused node's name (the chain's last node: the Relu), and fewer launches than the same model run with NPUSIM_FUSION=0 (a child process: the
  switch is read once per process);
- the batch norm's fold and the folded filter are computed once and kept while the filter and
  the batch norm's variables are unchanged; assigning any of them (the filter, gamma, the
  moving variance) gives the output TensorFlow on the CPU computes with the new values;
- training=True (batch statistics; Keras' moments path) still matches the CPU, moving
  statistics included.
"""

import json
import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import chip_config, run_child  # noqa: E402  pylint: disable=wrong-import-position


def _bn_conv_kernels(relu, residual, y_type):
    """The launches a Conv2DBatchNormInference names after what it writes (ops/conv2d.cpp),
    its casts aside: with a bias table (an l1->bt path: tiny, 910b) the cube starts from the
    batch norm's shift, FIXPIPE applies the ReLU (Conv2DBias[Relu]) unless a residual follows
    (AddResidual[Relu], a vector launch); without one, where C leaves L0C through the UB (the
    910, 310P: no l0c->gm path either), the epilogue in the UB adds the shift, the residual and
    the ReLU (Conv2DBatchNormInference[Add][Relu])."""
    act = "Relu" if relu else ""
    if "l1->bt" not in chip_config()["paths"]:
        return [f"Conv2DBatchNormInference{'Add' if residual else ''}{act}_{y_type}"]
    if residual:
        return [f"Conv2DBias_{y_type}", f"AddResidual{act}_{y_type}"]
    return [f"Conv2DBias{act}_{y_type}"]

RTOL = 1e-2

# Builds the model and input (also run in the child, so both processes see the same graph).
MODEL_CODE = r'''
import numpy as np
import keras

def build_block():
    keras.utils.set_random_seed(7)
    inp = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(16, 3, padding="same")(inp)
    h = keras.layers.BatchNormalization()(h)
    a = keras.layers.Activation("relu")(h)
    h = keras.layers.Conv2D(16, 3, padding="same")(a)
    # axis=3 as keras.applications' ResNet-50: Keras reshapes the parameters to [1, 1, 1, C]
    h = keras.layers.BatchNormalization(axis=3, epsilon=1.001e-5)(h)
    h = keras.layers.Add()([h, a])
    out = keras.layers.Activation("relu")(h)
    model = keras.Model(inp, out)
    rng = np.random.default_rng(5)
    for layer in model.layers:  # non-trivial moving statistics and affine parameters
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.gamma.shape[0]
            layer.gamma.assign(rng.uniform(0.5, 1.5, c).astype(np.float32))
            layer.beta.assign(rng.uniform(-0.5, 0.5, c).astype(np.float32))
            layer.moving_mean.assign(rng.uniform(-0.3, 0.3, c).astype(np.float32))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, c).astype(np.float32))
    x = rng.standard_normal((2, 8, 8, 3)).astype(np.float32)
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


@pytest.fixture(scope="module")
def inference(npusim, tf):
    model, x = build_block()  # pylint: disable=undefined-variable
    with tf.device("/CPU:0"):
        want = model(tf.constant(x), training=False).numpy()
    with tf.device("/NPU:0"):
        f = tf.function(lambda t: model(t, training=False))
        xt = tf.constant(x)
        f(xt).numpy()  # trace, optimize (fusion), compile
        n0 = len(npusim.launch_records())
        got = f(xt).numpy()
        recs = npusim.launch_records()[n0:]
    return {"want": want, "got": got, "records": recs}


def test_fused_inference_matches_cpu(inference):
    assert inference["got"].shape == inference["want"].shape
    assert rel_error(inference["got"], inference["want"]) < RTOL
    assert (inference["got"] >= 0).all()


def test_launch_records_show_fused_ops_under_the_relu_names(inference):
    recs = inference["records"]
    by_type = {}
    for r in recs:
        by_type.setdefault(r["op_type"], []).append(r)
    assert set(by_type) == {"Conv2DBatchNormInference"}, sorted(by_type)
    # Two convolutions with their batch norms (the first with its Relu, the second with the
    # residual Add and the Relu after it), on this second run: the activation cast and the
    # convolution each (the batch norm's fold and the folded filter were kept from the first
    # run), and on chips with a bias table the second's residual add with its ReLU as one
    # vector launch (FIXPIPE writes conv + shift, the add follows): _bn_conv_kernels.
    conv = by_type["Conv2DBatchNormInference"]
    assert len({r["op_name"] for r in conv}) == 2
    kernels = sorted(r["kernel"] for r in conv)
    assert kernels == sorted(["Cast_f32_f16", "Cast_f32_f16"] +
                             _bn_conv_kernels(True, False, "f32") +
                             _bn_conv_kernels(True, True, "f32")), kernels
    # the chains' last nodes (the Relus) kept their names
    assert all(r["op_name"].endswith("/Relu") for r in conv), [r["op_name"] for r in conv]
    for unfused in ("Conv2D", "BatchNormInference", "Rsqrt", "Sub", "Mul", "BiasAdd", "Relu",
                    "AddV2", "AddRelu"):
        assert unfused not in by_type, f"{unfused} was not fused: {sorted(by_type)}"


def test_folded_filter_follows_assignments(npusim, tf):
    """The folded filter f16(W * gamma / sqrt(var + eps)) is derived from three variables: it is
    computed on the first run, left out while none changes, and computed again after an
    assignment to any of them (the output then matches the CPU with the new values)."""
    model_cpu, x = build_block()  # pylint: disable=undefined-variable
    model_npu, _ = build_block()  # pylint: disable=undefined-variable
    conv = [l for l in model_npu.layers if isinstance(l, keras.layers.Conv2D)][1]
    bn = [l for l in model_npu.layers if isinstance(l, keras.layers.BatchNormalization)][1]
    conv_c = [l for l in model_cpu.layers if isinstance(l, keras.layers.Conv2D)][1]
    bn_c = [l for l in model_cpu.layers if isinstance(l, keras.layers.BatchNormalization)][1]
    xt = tf.constant(x)
    with tf.device("/NPU:0"):
        f = tf.function(lambda t: model_npu(t, training=False))

    def run_both():
        with tf.device("/CPU:0"):
            want = model_cpu(xt, training=False).numpy()
        with tf.device("/NPU:0"):
            n0 = len(npusim.launch_records())
            got = f(xt).numpy()
            recs = npusim.launch_records()[n0:]
        assert rel_error(got, want) < RTOL
        return (sum(r["kernel"] == "BatchNormInferenceFold" for r in recs),
                sum(r["kernel"].startswith("FoldFilter") for r in recs))

    assert run_both() == (2, 2)  # both batch norms and filters folded on the first run
    assert run_both() == (0, 0)  # kept
    # (Here both writes give the variable a new buffer, a new source address; a write in place
    # is caught by the sources' write epochs: tests/runtime launch_derived with several sources.)
    rng = np.random.default_rng(9)
    # (batch-norm folds, filter folds) run after a write: that convolution's only
    for var_npu, var_cpu, lo, hi, runs in (
            (bn.moving_variance, bn_c.moving_variance, 0.1, 1.0, (1, 1)),
            (bn.gamma, bn_c.gamma, -1.0, 1.0, (1, 1)),
            (bn.beta, bn_c.beta, -1.0, 1.0, (1, 0)),  # shift only: the filter is kept
            (conv.kernel, conv_c.kernel, -0.2, 0.2, (0, 1))):
        for write in ("assign_add", "assign"):
            v = rng.uniform(lo, hi, var_npu.shape).astype(np.float32)
            with tf.device("/NPU:0"):  # on the tf.Variable itself (Keras may assign anew)
                getattr(var_npu.value, write)(tf.constant(v))
            getattr(var_cpu, write)(v)
            assert run_both() == runs, (var_npu.path, write)
            assert run_both() == (0, 0)


def test_fewer_launches_than_with_fusion_off(inference):
    proc = run_child("import os\nos.environ['NPUSIM_FUSION'] = '0'\n" + CHILD_CODE, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    off = json.loads(line[len("RESULT "):])
    assert "BatchNormInference" not in off["op_types"] and "AddRelu" not in off["op_types"]
    assert "Conv2DBatchNormInference" not in off["op_types"]
    assert {"Rsqrt", "Mul", "Sub", "Relu", "BiasAdd"} <= set(off["op_types"])
    # Per batch norm: BiasAdd, AddV2, Rsqrt, 3 Mul, Sub, AddV2 (and Relu) -> 2 launches;
    # the residual AddV2 + Relu -> 1.
    assert len(inference["records"]) < off["launches"]
    assert off["launches"] - len(inference["records"]) >= 2 * (8 - 2) + 1


def test_training_mode_is_unaffected(npusim, tf):
    model_cpu, x = build_block()  # pylint: disable=undefined-variable
    model_npu, _ = build_block()  # pylint: disable=undefined-variable
    with tf.device("/CPU:0"):
        want = model_cpu(tf.constant(x), training=True).numpy()
    with tf.device("/NPU:0"):
        f = tf.function(lambda t: model_npu(t, training=True))
        got = f(tf.constant(x)).numpy()
    assert rel_error(got, want) < RTOL
    for lc, ln in zip(model_cpu.layers, model_npu.layers):
        if isinstance(lc, keras.layers.BatchNormalization):
            for vc, vn in ((lc.moving_mean, ln.moving_mean),
                           (lc.moving_variance, ln.moving_variance)):
                np.testing.assert_allclose(vn.numpy(), vc.numpy(), rtol=RTOL, atol=1e-3)


def test_a_chain_node_that_is_also_an_output_is_kept(npusim, tf):
    """The batch norm's result is a second model output: add_1 has another consumer, so the
    Relu is not folded into it (add_1 becomes the fused node under its own name, the Relu
    stays), and both outputs match the CPU."""
    keras.utils.set_random_seed(11)
    inp = keras.Input((6, 6, 4))
    bn = keras.layers.BatchNormalization()(keras.layers.Conv2D(8, 3, padding="same")(inp))
    model = keras.Model(inp, [bn, keras.layers.Activation("relu")(bn)])
    x = np.random.default_rng(2).standard_normal((1, 6, 6, 4)).astype(np.float32)
    with tf.device("/CPU:0"):
        want = [t.numpy() for t in model(tf.constant(x), training=False)]
    with tf.device("/NPU:0"):
        f = tf.function(lambda t: model(t, training=False))
        xt = tf.constant(x)
        f(xt)
        n0 = len(npusim.launch_records())
        got = [t.numpy() for t in f(xt)]
        recs = npusim.launch_records()[n0:]
    for g, w in zip(got, want):
        assert rel_error(g, w) < RTOL
    types = {r["op_type"] for r in recs}
    assert "Conv2DBatchNormInference" in types and "Relu" in types, sorted(types)
    bn_names = {r["op_name"] for r in recs if r["op_type"] == "Conv2DBatchNormInference"}
    assert bn_names and all(n.endswith("batchnorm/add_1") for n in bn_names), bn_names


def test_fp16_handoff_between_convolutions(npusim, tf):
    """Conv -> BN -> ReLU -> Conv -> BN: the first fused convolution's only consumer is the
    second, so it hands its output over in fp16 (FIXPIPE rounds it; the second convolution runs
    no cast of its input). The rounding is the cast's, so the result is bit for bit the one of
    the same model whose intermediate is also a model output (then kept in f32 and cast by the
    consumer), and matches the CPU."""
    keras.utils.set_random_seed(13)
    inp = keras.Input((10, 10, 6))
    h = keras.layers.Conv2D(24, 3, padding="same")(inp)
    h = keras.layers.BatchNormalization()(h)
    mid = keras.layers.Activation("relu")(h)
    h = keras.layers.Conv2D(16, 1, use_bias=False)(mid)
    out = keras.layers.BatchNormalization(axis=3)(h)
    chain = keras.Model(inp, out)
    both = keras.Model(inp, [out, mid])  # the same layers: mid is fetched too
    x = np.random.default_rng(4).standard_normal((2, 10, 10, 6)).astype(np.float32)
    with tf.device("/CPU:0"):
        want = chain(tf.constant(x), training=False).numpy()
    results = {}
    for name, model in (("chain", chain), ("both", both)):
        with tf.device("/NPU:0"):
            f = tf.function(lambda t, m=model: m(t, training=False))
            xt = tf.constant(x)
            f(xt)
            n0 = len(npusim.launch_records())
            got = f(xt)
            recs = npusim.launch_records()[n0:]
        results[name] = (np.asarray(got[0] if name == "both" else got),
                         sum(r["kernel"].startswith("Cast_") for r in recs),
                         sorted(r["kernel"] for r in recs if r["kernel"].startswith("Conv2D")))
    assert results["chain"][1] == 1, results  # x's cast only
    assert results["both"][1] == 2, results   # x's and mid's
    # The kernels are named by what they write: the first convolution's output is f16 only in
    # the chain.
    assert results["chain"][2] == sorted(_bn_conv_kernels(True, False, "f16") +
                                         _bn_conv_kernels(False, False, "f32")), results
    assert results["both"][2] == sorted(_bn_conv_kernels(True, False, "f32") +
                                        _bn_conv_kernels(False, False, "f32")), results
    np.testing.assert_array_equal(results["chain"][0], results["both"][0])
    assert rel_error(results["chain"][0], want) < RTOL
