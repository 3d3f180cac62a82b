"""Rewrite 12b (adapter/tf/plugin/graph_fusion.h): keras' LayerNormalization in training, its
forward and TensorFlow's autodiff of it, as LayerNormV3, LayerNormXBackpropV2 and
LayerNormBetaGammaBackpropV2 (kernels: adapter/compiler/ops/norm.cpp).

One training step's gradients (x, gamma, beta) of a loss through a LayerNormalization on the NPU
against TF on the CPU from the same values:
- "layer": one node of each fused op runs, and no Mean, RsqrtGrad or Tile;
- "x_read_twice": x also feeds the loss directly, so x's AddN sums another gradient: still
  fused (the AddN adds the fused pd_x to it);
- "mean_read_twice": the layer written out with its mean also in the loss (the mean has a reader
  outside the pattern): nothing fuses, and the gradients still match.

Tolerance: the fused kernels and TF's CPU kernels compute in f32 and add the rows' H = 64 terms
(and the columns' 10) in different orders: each result is within (H + 16) 2^-24 of the sum of
its terms' magnitudes apart, a few 1e-6 relative; 2e-5 of each gradient's largest element is
allowed.
"""

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

FUSED = ("LayerNormV3", "LayerNormXBackpropV2", "LayerNormBetaGammaBackpropV2")


def _step(tf, case, x, w, layer):
    """The loss sum(w * LayerNormalization(x)) [+ extras] and its gradients wrt x, gamma and
    beta (the loss fetched too, so that the forward's output is computed, as in a training step,
    where the next layer reads it)."""

    @tf.function
    def grads(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            if case == "mean_read_twice":
                mean, var = tf.nn.moments(v, axes=[-1], keepdims=True)
                inv = tf.math.rsqrt(var + 1e-7) * layer.gamma
                y = v * inv + (-mean * inv + layer.beta)
                loss = tf.reduce_sum(w * y) + tf.reduce_sum(mean * mean)
            else:
                loss = tf.reduce_sum(w * layer(v))
                if case == "x_read_twice":
                    loss += tf.reduce_sum(v * v)
        return [loss] + tape.gradient(loss, [v, layer.gamma, layer.beta])

    return [g.numpy() for g in grads(tf.constant(x))]


@pytest.mark.parametrize("case", ["layer", "x_read_twice", "mean_read_twice"])
def test_layer_norm_training_fuses_with_its_gradient(npusim, tf, case):
    rng = np.random.default_rng(12)
    x = rng.normal(0.5, 2, (2, 5, 64)).astype(np.float32)
    w = rng.normal(0, 1, x.shape).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, 64).astype(np.float32)
    beta = rng.uniform(-0.5, 0.5, 64).astype(np.float32)
    results = {}
    for device in ("/CPU:0", "/NPU:0"):
        with tf.device(device):
            layer = keras.layers.LayerNormalization(epsilon=1e-7)
            layer.build(x.shape)
            layer.gamma.assign(gamma)
            layer.beta.assign(beta)
            npusim.clear_launch_records()
            results[device] = _step(tf, case, x, tf.constant(w), layer)
    records = npusim.launch_records()
    types = [r["op_type"] for r in records]
    for got, want, name in zip(results["/NPU:0"], results["/CPU:0"],
                               ("loss", "dx", "dgamma", "dbeta")):
        err = np.abs(got.astype(np.float64) - want).max()
        assert err <= 2e-5 * np.abs(want).max(), (name, err)
    fused = 0 if case == "mean_read_twice" else 1
    for op in FUSED:  # one node each (LayerNormBetaGammaBackpropV2: two launches)
        assert len({r["op_name"] for r in records if r["op_type"] == op}) == fused, (op, types)
    if fused:
        assert not {"Mean", "RsqrtGrad", "Tile"} & set(types), types


# Under allow_mix_precision (adapter/tf/plugin/mixed_precision.h) the fused ops turn float16
# through T (x, dy, y, pd_x) while gamma and beta stay float32 (Tgamma), as CANN's LayerNorm
# takes them: no Cast of the parameters to float16. A Dense (float16 by the trustlist) then a
# LayerNormalization, one step's gradients in a child (the precision mode is read once per
# process) against TF on the CPU in float32. Tolerance: the NPU rounds the Dense output, y, the
# incoming gradient and pd_x to float16 (u = 2^-11 each) where the CPU keeps float32, and the
# Dense's operands for the cube; each gradient is a sum of such terms: 1e-2 of its largest
# element (tests/tf/test_fusion.py's 1e-2 of the norm for fp16 operands) is allowed.
MIXED_CHILD = r'''
import json
import numpy as np
import npusim
import tensorflow as tf
import keras

keras.utils.set_random_seed(3)
rng = np.random.default_rng(3)
dense = keras.layers.Dense(64)
ln = keras.layers.LayerNormalization(epsilon=1e-7, name="ln")
with tf.device("/NPU:0"):  # the variables on the NPU, as a model trained there has them
    dense.build((None, 48))
    ln.build((None, 64))
ln.gamma.assign(rng.uniform(0.5, 1.5, 64).astype(np.float32))
ln.beta.assign(rng.uniform(-0.5, 0.5, 64).astype(np.float32))
x = tf.constant(rng.standard_normal((32, 48)).astype(np.float32))
w = tf.constant(rng.standard_normal((32, 64)).astype(np.float32))

def grads(v):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * ln(dense(v)))
    return [loss] + tape.gradient(loss, [ln.gamma, ln.beta, dense.kernel])

with tf.device("/NPU:0"):
    f = tf.function(grads)
    f(x)
    # New parameter values, as after an optimizer step: a float16 copy of a variable is derived
    # once per value (docs/tf_plugin.md), so only a changed variable shows its Cast launch.
    for v in (ln.gamma, ln.beta, dense.kernel):
        v.assign(v * 1.25)
    n0 = len(npusim.launch_records())
    got = [t.numpy().tolist() for t in f(x)]
    recs = [[r["op_type"], r["op_name"], r["kernel"]] for r in npusim.launch_records()[n0:]]
with tf.device("/CPU:0"):
    want = [t.numpy().tolist() for t in grads(x)]
print("RESULT " + json.dumps({"got": got, "want": want, "records": recs}))
'''


def test_mixed_precision_keeps_gamma_and_beta_float32():
    import os  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from conftest import child_result  # pylint: disable=import-outside-toplevel

    res = child_result(MIXED_CHILD, extra_env={"NPUSIM_PRECISION_MODE": "allow_mix_precision",
                                               "TF_ENABLE_ONEDNN_OPTS": "0"})
    kernels = {(t, k) for t, _, k in res["records"]}
    assert ("LayerNormV3", "LayerNormV3_f16") in kernels, res["records"]
    assert ("LayerNormXBackpropV2", "LayerNormXBackpropV2_f16") in kernels, res["records"]
    # no launch casts the layer norm's parameters (its variables' reads, in the scope "ln_1"),
    # while the Dense's kernel, read by the float16 cube, is cast
    casts = [n.split("/")[0] for t, n, _ in res["records"] if t == "Cast"]
    assert not [n for n in casts if n.startswith("ln")], res["records"]
    assert [n for n in casts if n.startswith("dense")], res["records"]
    for got, want in zip(res["got"], res["want"]):
        got, want = np.asarray(got), np.asarray(want)
        assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max(), (got, want)
