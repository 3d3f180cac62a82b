"""A decoder's weight products at decode shapes (docs/llm.md, "Products at decode shapes").

- A batched product whose weight every batch entry shares (keras' EinsumDense `bqm,muh->bquh`,
  keras-hub's attention projections, as TensorFlow lowers it: BatchMatMulV2 of x [b, q, m] by
  the weight [m, u*h]) is one product over b * q rows (adapter/compiler/ops/matmul.cpp,
  fold_shared_b_batch): the values those of numpy, and the kernel reads the weight from GM
  once, where b products of q rows read it b times (the cost that made llama-7b's batch-16
  decode step 4.2 x its roofline). The bound on the bytes is derived from the operands: every
  byte of the weight once plus x once per column tile of the output, which is at most the
  weight's bytes for these shapes (x has 16 rows, the weight 128 columns per row of x).
- A 2-D Transpose read only by a MatMul is folded into it (adapter/tf/plugin/graph_fusion.h,
  rewrite 14): Keras' tied ReversibleEmbedding (Llama 3.2 1B's vocabulary projection) then
  reads the table as stored; no Transpose launch, the values those of numpy; a Transpose also
  read elsewhere stays.

Tolerance against numpy (float64 of the rounded operands): bf16 products round y once after an
f32 accumulation: |y - y_ref| <= 2^-8 * sum_k |x_k w_k| + tiny (a bf16 half-ulp, relative);
f32 MatMuls run with fp16 operands (allow_fp32_to_fp16): 2 * 2^-11 * sum_k |x_k w_k|.
"""
import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


def _bf16(a):
    """float32 values rounded to bfloat16 (round to nearest even), as float64."""
    b = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def _gm_read_bytes(record):
    """Bytes the launch's cores read from GM (every gm_to_* data path)."""
    return sum(v for k, v in record["counters"].items()
               if k.split(".")[-1].startswith("gm_to_") and ".bytes." in k)


@pytest.mark.parametrize("batch,q", [(16, 1), (3, 5)])
def test_einsum_dense_shared_weight_is_one_product(npusim, tf, batch, q):
    m, u, h = 256, 4, 32
    rng = np.random.default_rng(0)
    x = _bf16(rng.normal(0, 1, (batch, q, m)))
    w = _bf16(rng.normal(0, 0.05, (m, u, h)))
    layer = keras.layers.EinsumDense("bqm,muh->bquh", (None, u, h), dtype="bfloat16")
    with tf.device("/NPU:0"):
        layer.build((batch, q, m))
        layer.kernel.assign(w.astype(np.float32))
        call = tf.function(layer)
        xt = tf.constant(x, tf.bfloat16)
        call(xt)  # traced and compiled; the weight's reads are counted on the second call
        npusim.clear_launch_records()
        y = call(xt).numpy().astype(np.float64)
    records = npusim.launch_records(with_counters="flat")
    want = np.einsum("bqm,muh->bquh", x, w)
    bound = 2.0 ** -8 * np.einsum("bqm,muh->bquh", np.abs(x), np.abs(w)) + 1e-6
    assert np.all(np.abs(y - want) <= bound), float(np.max(np.abs(y - want) - bound))
    products = [r for r in records if r["op_type"] in ("BatchMatMulV2", "Einsum", "MatMul")]
    assert products, [r["op_type"] for r in records]
    w_bytes = w.size * 2
    read = sum(_gm_read_bytes(r) for r in products)
    print(f"\nEinsumDense x [{batch}, {q}, {m}] by a {w_bytes}-byte weight: {read} bytes read "
          f"from GM in {len(products)} launch(es)")
    # Once: the weight plus x per column tile (at most the weight's bytes here); b products
    # would read the weight b times (16 and 3).
    assert read <= 2 * w_bytes, (read, w_bytes)


def _transposed_product(tf, dtype, share):
    def f(x, w):
        wt = tf.transpose(w)
        y = tf.matmul(x, wt)
        return (y, wt * 2.0) if share else (y,)

    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, (4, 64)).astype(np.float32)
    w = rng.normal(0, 0.1, (96, 64)).astype(np.float32)
    if dtype == "bfloat16":
        x, w = _bf16(x).astype(np.float32), _bf16(w).astype(np.float32)
    return f, x, w


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_transpose_folded_into_matmul(npusim, tf, dtype):
    f, x, w = _transposed_product(tf, dtype, share=False)
    with tf.device("/NPU:0"):
        xt, wt = tf.constant(x, dtype), tf.constant(w, dtype)
        call = tf.function(f)
        npusim.clear_launch_records()
        (y,) = call(xt, wt)
        y = tf.cast(y, tf.float32).numpy().astype(np.float64)
    ops = [r["op_type"] for r in npusim.launch_records()]
    assert "Transpose" not in ops and "MatMul" in ops, ops
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    ulp = 2.0 ** -8 if dtype == "bfloat16" else 2 * 2.0 ** -11
    bound = ulp * (np.abs(x64) @ np.abs(w64).T) + 1e-6
    assert np.all(np.abs(y - x64 @ w64.T) <= bound)


def test_transpose_read_elsewhere_stays(npusim, tf):
    f, x, w = _transposed_product(tf, "bfloat16", share=True)
    with tf.device("/NPU:0"):
        npusim.clear_launch_records()
        y, w2 = tf.function(f)(tf.constant(x, tf.bfloat16), tf.constant(w, tf.bfloat16))
    ops = [r["op_type"] for r in npusim.launch_records()]
    assert "Transpose" in ops, ops
    np.testing.assert_array_equal(tf.cast(w2, tf.float32).numpy(), 2.0 * w.T)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    bound = 2.0 ** -8 * (np.abs(x64) @ np.abs(w64).T) + 1e-6
    assert np.all(np.abs(tf.cast(y, tf.float32).numpy() - x64 @ w64.T) <= bound)


def test_tied_reversible_embedding_reads_the_table_as_stored(npusim, tf):
    """Keras' ReversibleEmbedding with tied weights, reverse (the vocabulary projection):
    matmul(x, transpose(embeddings)) runs as one MatMul with transpose_b, no Transpose."""
    vocab, dim = 320, 64
    rng = np.random.default_rng(2)
    table = _bf16(rng.normal(0, 0.1, (vocab, dim)))
    x = _bf16(rng.normal(0, 1, (2, 3, dim)))
    layer = keras.layers.ReversibleEmbedding(vocab, dim, tie_weights=True, dtype="bfloat16")
    with tf.device("/NPU:0"):
        layer.build((2, 3))
        layer.embeddings.assign(table.astype(np.float32))
        call = tf.function(lambda t: layer(t, reverse=True))
        npusim.clear_launch_records()
        y = tf.cast(call(tf.constant(x, tf.bfloat16)), tf.float32).numpy().astype(np.float64)
    ops = [r["op_type"] for r in npusim.launch_records()]
    assert "Transpose" not in ops, ops
    bound = 2.0 ** -8 * (np.abs(x) @ np.abs(table).T) + 1e-6
    assert np.all(np.abs(y - x @ table.T) <= bound)
