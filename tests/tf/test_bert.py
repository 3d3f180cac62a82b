"""models/bert.py: BERT pre-training as MindSpore's r0.5 benchmark trains BERT-Large, and its Lamb.

- the parameter count of both configurations against a count derived from the published
  shapes (embeddings, 24 encoder layers of 4 H x H and 2 H x FFN Dense layers, the heads);
- the optimizer's update over two steps against numpy's MindSpore Lamb with the loss scale,
  the per-gradient clipping and the weight decay (CPU);
- a few training steps of `bert-tiny` on the NPU (tiny chip, dropout on): the loss tracks
  TensorFlow on the CPU from the same weights and dropout seeds, and the launch records show
  what the graph engine fused: every Dense as one MatMulBiasAdd, the attention as its two
  BatchMatMulV2 and a Softmax, every GELU as one Gelu (its gradient from x alone), the
  variable updates as FusedVariableUpdate, every LayerNorm with its gradient as LayerNormV3,
  LayerNormXBackpropV2 and LayerNormBetaGammaBackpropV2 (graph_fusion.h 12b); in inference
  every LayerNorm as one LayerNorm launch (12).
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import models  # noqa: E402  pylint: disable=wrong-import-position
from models import bert  # noqa: E402  pylint: disable=wrong-import-position

TINY = "bert-tiny"


def derived_parameters(name, seq_positions=None):
    """Trainable parameters of the pre-training network from its published shapes."""
    d = bert.dims(name)
    h, f, v = d["hidden"], d["intermediate"], d["vocab"]
    embeddings = v * h + bert.TYPE_VOCAB * h + (seq_positions or d["max_positions"]) * h + 2 * h
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    masked_lm = (h * h + h) + 2 * h + v  # transform Dense, LayerNorm, output bias (tied)
    pooler_nsp = (h * h + h) + (h * 2 + 2)
    return embeddings + d["layers"] * layer + masked_lm + pooler_nsp


@pytest.mark.parametrize("name", ["bert-tiny", "bert_large"])
def test_parameter_count_matches_published_shapes(tf, name):
    with tf.device("/CPU:0"):
        model = models.build(name, seed=0)
    count = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert count == derived_parameters(name)
    if name == "bert_large":
        # 24 layers, hidden 1024, FFN 4096, vocabulary 21128: ~0.33 B parameters (BERT-Large's
        # 340 M at vocabulary 30522 less 9,394 x 1,024 embedding rows).
        assert 325e6 < count < 335e6, count
        assert bert.dims(name)["layers"] == 24 and bert.dims(name)["heads"] == 16
    mlm, nsp = model.output_shape
    assert mlm == (None, bert.dims(name)["predictions"], bert.dims(name)["vocab"])
    assert nsp == (None, 2)


def numpy_lamb(w, grads, lr, wd, scale, clip, eps, betas, decayed):
    """The documented update (models/bert.py lamb_optimizer) in float64."""
    w = w.astype(np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    b1, b2 = betas
    for t, g in enumerate(grads, start=1):
        g = g / scale
        n = np.linalg.norm(g)
        g = g * clip / max(n, clip)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        u = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        if decayed:
            u = u + wd * w
        wn, un = np.linalg.norm(w), np.linalg.norm(u)
        r = min(max(wn / un, 0.0), 10.0) if wn > 0 and n > 0 else 1.0
        w = w - lr * r * u
    return w


def test_lamb_matches_mindspore_update(tf):
    """Two apply_gradients steps on a kernel (decayed) and a bias (not decayed), one gradient
    past the clip norm and one under it, against numpy; scale_loss multiplies."""
    lr, wd, scale, clip, eps, betas = 0.05, 0.01, 64.0, 1.0, 1e-6, (0.9, 0.999)
    rng = np.random.default_rng(2)
    w0 = {"kernel": rng.standard_normal((3, 4)).astype(np.float32),
          "bias": rng.standard_normal(4).astype(np.float32)}
    grads = [{k: (rng.standard_normal(v.shape) * scale * s).astype(np.float32)
              for k, v in w0.items()} for s in (3.0, 0.05)]
    with tf.device("/CPU:0"):
        opt = bert.lamb_optimizer(lr, wd, scale, clip, eps, betas)
        variables = {k: keras.Variable(v, name=k) for k, v in w0.items()}
        for g in grads:
            opt.apply_gradients([(tf.constant(g[k]), variables[k]) for k in w0])
        assert float(opt.scale_loss(tf.constant(2.0))) == 2.0 * scale
    for k, w in w0.items():
        expected = numpy_lamb(w, [g[k] for g in grads], lr, wd, scale, clip, eps, betas,
                              decayed=(k == "kernel"))
        np.testing.assert_allclose(variables[k].numpy(), expected, rtol=1e-5, atol=1e-6)


def _train(tf, device, x, y, steps):
    """`steps` training steps of bert-tiny on `device` from seed 0 (same weights and dropout
    seeds on both devices). Loss scale 8 and lr 1e-3, not the published 65536 and 3e-5: the
    published scale is the dynamic scale's start, which MindSpore lowers on overflow; a fixed
    65536 overflows float16 on this batch's gradients."""
    with tf.device(device):
        model = models.build(TINY, seed=0)
        model.compile(optimizer=bert.lamb_optimizer(1e-3, loss_scale=8.0),
                      loss=models.loss(TINY), jit_compile=False)
        return [float(model.train_on_batch(x, y, return_dict=True)["loss"])
                for _ in range(steps)]


def _op_types(records):
    """{op type: set of op names}: one TensorFlow op may run as several launches (its
    operands' casts to fp16 under the precision mode, its own kernel)."""
    types = {}
    for r in records:
        types.setdefault(r["op_type"], set()).add(r["op_name"])
    return types


def dense_layers(name):
    """Dense layers of the network: 6 per encoder layer, the masked LM's transform, the
    pooler and the next-sentence classifier."""
    return 6 * bert.dims(name)["layers"] + 3


@pytest.fixture(scope="module")
def trained(npusim, tf):
    """Two steps, batch 4, on the CPU and on the NPU; the NPU's launch records of the
    second."""
    x, y = models.synthetic_data(TINY, 4, seed=1)
    loss_cpu = _train(tf, "/CPU:0", x, y, 2)
    with tf.device("/NPU:0"):
        model = models.build(TINY, seed=0)
        model.compile(optimizer=bert.lamb_optimizer(1e-3, loss_scale=8.0),
                      loss=models.loss(TINY), jit_compile=False)
        loss_npu = [float(model.train_on_batch(x, y, return_dict=True)["loss"])]
        npusim.clear_launch_records()
        loss_npu.append(float(model.train_on_batch(x, y, return_dict=True)["loss"]))
    return loss_cpu, loss_npu, npusim.launch_records()


def test_trains_on_npu_tracking_cpu(trained):
    """The NPU's losses within 1e-3 relative of the CPU's: the tiny chip's default precision
    rounds the cube's operands to fp16 (2^-11 relative each, a few layers deep; seen: 5e-6),
    dropout draws the same masks on both devices (stateless random), and both fall."""
    loss_cpu, loss_npu, records = trained
    print(f"\nbert-tiny: loss NPU {loss_npu}\n           loss CPU {loss_cpu}")
    assert all(r["ok"] for r in records)
    assert all(np.isfinite(loss_npu))
    np.testing.assert_allclose(loss_npu, loss_cpu, rtol=1e-3)
    assert loss_cpu[1] < loss_cpu[0] and loss_npu[1] < loss_npu[0]


def test_training_fuses_dense_attention_and_updates(trained):
    _, _, records = trained
    types = _op_types(records)
    layers = bert.dims(TINY)["layers"]
    # Every Dense's forward MatMul carries its bias (graph_fusion.h rewrite 3b): no BiasAdd.
    assert len(types.get("MatMulBiasAdd", ())) == dense_layers(TINY), sorted(types)
    assert "BiasAdd" not in types
    # Attention: scores and context as batched products, one Softmax per layer forward, its
    # gradient by the Softmax's own formula (no fused attention in training, as on CANN then).
    assert len(types["Softmax"]) == layers
    assert len(types["BatchMatMulV2"]) == 2 * layers + 4 * layers  # forward, 2 x 2 backward
    # The optimizer: every assign of m, v and w inside FusedVariableUpdate launches.
    assert "FusedVariableUpdate" in types
    assert not [r for r in records if r["op_type"].startswith(("Assign", "ResourceApply"))]


def test_training_fuses_gelu(trained):
    """Every GELU forward is one Gelu launch (rewrite 11b): its gradient is computed from x
    alone (models/bert.py, MindSpore's GeluGrad), so nothing else reads the composition's
    steps; and the gradient's own steps run fused (no TanhGrad, no Pow)."""
    _, _, records = trained
    types = _op_types(records)
    assert len(types.get("Gelu", ())) == bert.dims(TINY)["layers"] + 1, sorted(types)
    assert not [n for n in types.get("TanhGrad", ()) if "pooler" not in n], types["TanhGrad"]
    assert "Pow" not in types, types["Pow"]


def test_training_fuses_layer_norm(trained):
    """Every LayerNormalization (2 per layer, the embeddings' and the masked LM's) runs as
    LayerNormV3 forward and LayerNormXBackpropV2 + LayerNormBetaGammaBackpropV2 backward
    (rewrite 12b), and none of its unfused steps is left: no Mean, SquaredDifference, Rsqrt or
    RsqrtGrad launches."""
    _, _, records = trained
    types = _op_types(records)
    norms = 2 * bert.dims(TINY)["layers"] + 2
    for op in ("LayerNormV3", "LayerNormXBackpropV2", "LayerNormBetaGammaBackpropV2"):
        assert len(types.get(op, ())) == norms, (op, sorted(types))
    for op in ("Mean", "SquaredDifference", "Rsqrt", "RsqrtGrad"):
        assert op not in types, (op, types[op])


def test_inference_fuses_layer_norm_and_gelu(npusim, tf):
    """Forward only: every LayerNormalization becomes one LayerNorm launch and every GELU one
    Gelu (rewrites 12 and 11b), and the outputs match the CPU's."""
    x, _ = models.synthetic_data(TINY, 2, seed=3)
    with tf.device("/CPU:0"):
        cpu = models.build(TINY, seed=0)
        expected = [t.numpy() for t in cpu(x, training=False)]
    with tf.device("/NPU:0"):
        npu = models.build(TINY, seed=0)
        npu.set_weights(cpu.get_weights())
        forward = tf.function(lambda t: npu(t, training=False))
        forward(x)
        npusim.clear_launch_records()
        out = forward(x)
    types = _op_types(npusim.launch_records())
    layers = bert.dims(TINY)["layers"]
    assert len(types.get("LayerNorm", ())) == 2 * layers + 2  # + embeddings, masked LM
    assert len(types.get("Gelu", ())) == layers + 1  # + masked LM transform
    for a, e in zip(out, expected):
        assert np.linalg.norm(a.numpy() - e) / np.linalg.norm(e) < 1e-2
