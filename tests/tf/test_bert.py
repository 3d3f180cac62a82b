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
  every LayerNorm as one LayerNorm launch (12);
- nezha-tiny (NEZHA's relative positions): the first attention layer's context against numpy's
  formula on the CPU and the NPU, the relative table's rows and its dense gradient against
  numpy, and two training steps on the NPU tracking the CPU.
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
    relative = name in bert.NEZHA  # a [33, head_dim] table per layer, no absolute positions
    positions = 0 if relative else (seq_positions or d["max_positions"]) * h
    embeddings = v * h + bert.TYPE_VOCAB * h + positions + 2 * h
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    if relative:
        layer += (2 * bert.MAX_RELATIVE_POSITION + 1) * (h // d["heads"])
    masked_lm = (h * h + h) + 2 * h + v  # transform Dense, LayerNorm, output bias (tied)
    pooler_nsp = (h * h + h) + (h * 2 + 2)
    return embeddings + d["layers"] * layer + masked_lm + pooler_nsp


@pytest.mark.parametrize("name", ["bert-tiny", "bert_large", "nezha-tiny"])
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


NEZHA_TINY = "nezha-tiny"


def numpy_relative_attention(x, weights, heads, max_distance):
    """The context [B x S, H] of one attention layer with NEZHA's relative positions, float64:
    R[i, j] = table[clip(j - i, -M, M) + M], scores (q_i . k_j + q_i . R[i, j]) / sqrt(d),
    softmax over j (the mask all ones: nothing added), context_i = sum_j p_ij (v_j + R[i, j])."""
    wq, bq, wk, bk, wv, bv, table = (w.astype(np.float64) for w in weights)
    b, s, h = x.shape
    d = h // heads

    def split(t):  # [B, S, H] -> [B, heads, S, d]
        return t.reshape(b, s, heads, d).transpose(0, 2, 1, 3)

    q, k, v = split(x @ wq + bq), split(x @ wk + bk), split(x @ wv + bv)
    distance = np.arange(s)[None, :] - np.arange(s)[:, None]
    r = table[np.clip(distance, -max_distance, max_distance) + max_distance]  # [S, S, d]
    scores = (np.einsum("bnid,bnjd->bnij", q, k) + np.einsum("bnid,ijd->bnij", q, r))
    scores /= np.sqrt(d)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    context = np.einsum("bnij,bnjd->bnid", p, v) + np.einsum("bnij,ijd->bnid", p, r)
    return context.transpose(0, 2, 1, 3).reshape(b * s, h)


@pytest.mark.parametrize("device", ["/CPU:0", "/NPU:0"])
def test_relative_attention_matches_numpy(npusim, tf, device):
    """nezha-tiny's first attention layer (dropout off, inference) on `device`: its context,
    the input of layer_0_attention_output, against numpy's formula from the layer's input (the
    embeddings' LayerNorm output, read from the model) and its weights. The sequence, 32, is
    longer than the clip distance 16, so clipped rows are read. The NPU rounds the cube's
    operands to fp16 (the tiny chip's default precision): 1e-2 relative. The table is set to
    N(0, 0.5) values (its initial 0.02 moves the context by ~6 %) so that the relative terms
    weigh well above the tolerance."""
    del npusim
    x, _ = models.synthetic_data(NEZHA_TINY, 2, seed=5)
    rng = np.random.default_rng(6)
    with tf.device(device):
        model = bert.build(NEZHA_TINY, bert.dims(NEZHA_TINY)["seq"], dropout=0.0)
        table = model.get_layer("layer_0_relative_positions").table
        table.assign(rng.normal(0.0, 0.5, table.shape).astype(np.float32))
        probe = keras.Model(model.inputs, [
            model.get_layer("embeddings_layer_norm").output,
            model.get_layer("layer_0_attention_output").input])
        embedded, context = (t.numpy() for t in probe(x, training=False))
    weights = [w.numpy() for label in ("query", "key", "value")
               for w in model.get_layer("layer_0_" + label).weights]
    weights.append(table.numpy())
    expected = numpy_relative_attention(embedded, weights, bert.dims(NEZHA_TINY)["heads"],
                                        bert.MAX_RELATIVE_POSITION)
    plain = numpy_relative_attention(embedded, weights[:-1] + [0 * weights[-1]],  # R = 0
                                     bert.dims(NEZHA_TINY)["heads"], bert.MAX_RELATIVE_POSITION)
    error = np.linalg.norm(context - expected) / np.linalg.norm(expected)
    print(f"\n{device}: relative error {error:.2e}, the relative terms' weight "
          f"{np.linalg.norm(expected - plain) / np.linalg.norm(expected):.2f}")
    tol = 1e-5 if device == "/CPU:0" else 1e-2
    assert error < tol, error
    # ... and well inside the relative positions' own contribution.
    assert np.linalg.norm(expected - plain) / np.linalg.norm(expected) > 10 * tol


def test_nezha_tiny_trains_on_npu_tracking_cpu(npusim, tf):
    """Two training steps of nezha-tiny (dropout on) on the NPU against TensorFlow on the CPU
    from the same weights and dropout seeds, as test_trains_on_npu_tracking_cpu; the step's
    launches all succeed and the relative positions' gathers and batch matmuls are among
    them."""
    x, y = models.synthetic_data(NEZHA_TINY, 4, seed=1)
    losses = {}
    for device in ("/CPU:0", "/NPU:0"):
        with tf.device(device):
            model = models.build(NEZHA_TINY, seed=0)
            model.compile(optimizer=bert.lamb_optimizer(1e-3, loss_scale=8.0),
                          loss=models.loss(NEZHA_TINY), jit_compile=False)
            npusim.clear_launch_records()
            losses[device] = [float(model.train_on_batch(x, y, return_dict=True)["loss"])
                              for _ in range(2)]
    records = npusim.launch_records()
    print(f"\nnezha-tiny: loss NPU {losses['/NPU:0']}\n            loss CPU {losses['/CPU:0']}")
    assert records and all(r["ok"] for r in records)
    np.testing.assert_allclose(losses["/NPU:0"], losses["/CPU:0"], rtol=1e-3)
    assert losses["/NPU:0"][1] < losses["/NPU:0"][0]
    names = " ".join(r["op_name"] for r in records)
    assert "relative_positions" in names
    # Per layer: 2 forward products for q.R and p.R beside the plain 2, and their gradients.
    layers = bert.dims(NEZHA_TINY)["layers"]
    assert len(_op_types(records)["BatchMatMulV2"]) == 12 * layers


def test_relative_positions_table_gradient_is_dense(tf):
    """The relative positions' rows and their table's gradient on the CPU against numpy: the
    output is table[clip(j - i, -M, M) + M] at [i, j] and the gradient of sum(output * c) is
    c's [i, j] vectors added into their table rows (np.add.at, what a gather's gradient
    sums); the gradient is a dense tensor, not IndexedSlices (the optimizer would densify
    those once per consumer, docs/validation.md "NEZHA's relative positions")."""
    seq, depth, m = 12, 8, bert.MAX_RELATIVE_POSITION  # seq < M: some rows never used
    layer = bert._RelativePositions(seq, depth, "glorot_uniform")  # pylint: disable=protected-access
    with tf.device("/CPU:0"):
        anchor = tf.zeros((1, seq))
        layer.build(anchor.shape)
        rng = np.random.default_rng(3)
        table = rng.standard_normal((2 * m + 1, depth)).astype(np.float32)
        layer.table.assign(table)
        c = rng.standard_normal((seq, seq, depth)).astype(np.float32)
        with tf.GradientTape() as tape:
            out = layer(anchor)
            loss = tf.reduce_sum(out * c)
        grad = tape.gradient(loss, layer.table.value)
    distance = np.arange(seq)[None, :] - np.arange(seq)[:, None]
    rows = np.clip(distance, -m, m) + m
    np.testing.assert_allclose(out.numpy(), table[rows], rtol=1e-6)
    expected = np.zeros_like(table)
    np.add.at(expected, rows.reshape(-1), c.reshape(-1, depth))
    assert isinstance(grad, tf.Tensor) and not isinstance(grad, tf.IndexedSlices)
    np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-5, atol=1e-5)
