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
