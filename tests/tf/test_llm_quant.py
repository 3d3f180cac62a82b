"""Weight-only int8 quantised MatMul (adapter/tf/plugin/graph_fusion.h, rewrite 13): Keras'
weight-only int8 quantisation (models.llm.quantize: Int8QuantizationConfig without an
activation quantizer) of Dense and EinsumDense layers becomes CANN's WeightQuantBatchMatmulV2
(the weight read as int8 and dequantised on chip, adapter/compiler/ops/quant_matmul.cpp).

- A quantised Dense and EinsumDense (bfloat16: Keras refuses int8 quantisation with a float16
  compute dtype) on the NPU against numpy with the dequantised weights, x @ (w_int8 / s) in
  float64: one WeightQuantBatchMatmulV2 launch per layer, no MatMul.
- llama-tiny (bfloat16) quantised: its greedy tokens on the NPU are those of the same quantised
  model on TensorFlow's CPU, with the precondition of tests/tf/test_llm.py (the CPU's two best
  logits further apart than twice the largest logit difference) per token, every projection
  fused.

Tolerance against numpy: the kernel dequantises to bf16 (round(w * (1 / s)), the reciprocal
rounded to bf16 too: 2 half-ulps) and rounds y once to bf16 after an f32 accumulation; x is
exact in bf16. |y - y_ref| <= 3 * 2^-8 * sum_k |x_k w_k / s| covers both roundings of each
weight and the output's (2^-8 = a bf16 half-ulp, relative).
"""
import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
pytest.importorskip("keras_hub")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from models import llm  # noqa: E402  pylint: disable=wrong-import-position

from test_llm import _gm_write_bytes  # noqa: E402  pylint: disable=wrong-import-position


def _quantized(layer, x_shape):
    layer.build(x_shape)
    rng = np.random.default_rng(0)
    layer.kernel.assign(rng.normal(0, 0.05, layer.kernel.shape).astype(np.float32))
    layer.quantize(config=keras.quantizers.Int8QuantizationConfig(activation_quantizer=None))
    return layer


def _bf16(a):
    """float32 values rounded to bfloat16 (round to nearest even), as float64."""
    b = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("kind", ["Dense", "EinsumDense"])
def test_quantized_layer_matches_numpy(npusim, tf, kind):
    with tf.device("/NPU:0"):
        if kind == "Dense":
            layer = _quantized(keras.layers.Dense(96, use_bias=False, dtype="bfloat16"),
                               (2, 5, 64))
        else:  # keras-hub's query projection: "bqm,muh->bquh"
            layer = _quantized(keras.layers.EinsumDense("bqm,muh->bquh", (None, 4, 32),
                                                        dtype="bfloat16"), (2, 5, 64))
    w = np.asarray(layer._kernel.numpy(), np.float64)  # pylint: disable=protected-access
    s = np.asarray(tf.cast(layer.kernel_scale, tf.float32).numpy(), np.float64)
    assert layer._kernel.dtype == "int8"  # pylint: disable=protected-access
    x = _bf16(np.random.default_rng(1).uniform(-2, 2, (2, 5, 64)))
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        got = tf.function(layer)(tf.constant(x, tf.bfloat16))
        got = tf.cast(got, tf.float32).numpy().astype(np.float64)
    kinds = [r["op_type"] for r in npusim.launch_records()]
    wd = w.reshape(64, -1) / s.reshape(1, -1)  # the dequantised weight, per output column
    want = (x.reshape(-1, 64) @ wd).reshape(got.shape)
    bound = 3 * 2.0 ** -8 * (np.abs(x.reshape(-1, 64)) @ np.abs(wd)).reshape(got.shape)
    print(f"\n{kind}: launches {kinds}, largest error {np.abs(got - want).max():.2e}")
    assert kinds.count("WeightQuantBatchMatmulV2") == 1, kinds
    assert "MatMul" not in kinds and "BatchMatMulV2" not in kinds, kinds
    assert np.all(np.abs(got - want) <= bound)


@pytest.mark.parametrize("decoder", ["GreedyDecoder", "ResidentCacheDecoder"])
def test_quantized_decoder_tokens_match_cpu(npusim, tf, decoder):
    """The int8 model's greedy tokens on the NPU against the CPU's (keras-hub's own step there),
    with keras-hub's copied cache and with the resident one (models.run's default on the NPU);
    every projection runs as WeightQuantBatchMatmulV2 in either."""
    name, batch, prompt_len, gen_len = "llama-tiny", 2, 8, 5
    keras.utils.set_random_seed(0)
    with tf.device("/CPU:0"):
        cpu = llm.quantize(llm.build_causal_lm(name, dtype="bfloat16"), "int8")
    with tf.device("/NPU:0"):
        npu = llm.quantize(llm.build_causal_lm(name, dtype="bfloat16"), "int8")
        npu.set_weights(cpu.get_weights())
    assert any(v.dtype == "int8" for v in npu.weights)
    prompt = llm.prompt_tokens(name, batch, prompt_len, seed=1)
    with tf.device("/CPU:0"):
        want, want_logits = llm.GreedyDecoder(cpu, batch, prompt_len, gen_len).generate(
            prompt, return_logits=True)
    npusim.clear_launch_records()
    npusim.clear_cpu_fallback_ops()
    with tf.device("/NPU:0"):
        gen = getattr(llm, decoder)(npu, batch, prompt_len, gen_len)
        got, got_logits = gen.generate(prompt, return_logits=True)
    records = npusim.launch_records()
    kinds = [r["op_type"] for r in records]
    # The precondition of tests/tf/test_llm.py per batch entry and step: a token whose CPU
    # top-2 margin exceeds twice the largest logit difference d cannot flip on rounding; bf16
    # logits often tie within d, so each entry is compared up to its first step that could flip
    # (after it the sequences may legitimately part), and at least 3 of its 5 tokens must be.
    d = float(np.abs(got_logits.astype(np.float64) - want_logits).max())
    top2 = np.sort(want_logits.astype(np.float64), axis=-1)[..., -2:]
    margins = top2[..., 1] - top2[..., 0]  # (batch, gen_len)
    decided = margins > 2 * d
    compared = [int(np.argmin(row)) if not row.all() else gen_len for row in decided]
    print(f"\n{name} int8 ({decoder}): NPU {got.tolist()} CPU {want.tolist()}, largest logit "
          f"difference {d:.2e}, margins {np.round(margins, 4).tolist()}, tokens compared "
          f"{compared}, "
          f"{len(records)} launches, {kinds.count('WeightQuantBatchMatmulV2')} "
          "WeightQuantBatchMatmulV2")
    assert all(r["ok"] for r in records)
    if decoder == "ResidentCacheDecoder":  # the cache in the model's compute dtype, as served
        assert {v.dtype for v in gen.keys + gen.values} == {tf.bfloat16}
    assert not npusim.cpu_fallback_ops(), npusim.cpu_fallback_ops()
    # Per call: 2 layers x 7 projections and the vocabulary projection; a prefill and 4 steps.
    assert kinds.count("WeightQuantBatchMatmulV2") == 15 * gen_len, kinds.count(
        "WeightQuantBatchMatmulV2")
    assert "MatMul" not in kinds and "BatchMatMulV2" not in kinds
    assert min(compared) >= 3, "precondition: the CPU's two best logits are too close to compare"
    for b, n in enumerate(compared):
        np.testing.assert_array_equal(got[b, :n], want[b, :n])


def test_resident_decoder_transposes_a_tied_int8_table_once(npusim, tf):
    """A tied int8 embedding (gemma-tiny's): keras-hub's step transposes the [vocabulary,
    hidden] int8 table for the vocabulary projection every call; ResidentCacheDecoder
    transposes it once, with its cache, and its decode steps write no table-sized transpose.
    The logits are the copying step's bit for bit (the same int8 product and scales)."""
    name, batch, prompt_len, gen_len = "gemma-tiny", 2, 8, 3
    keras.utils.set_random_seed(0)
    with tf.device("/NPU:0"):
        lm = llm.quantize(llm.build_causal_lm(name, dtype="bfloat16"), "int8")
    embedding = lm.backbone.token_embedding
    assert embedding.tie_weights and embedding.quantization_mode == "int8"
    table = int(np.prod(embedding.embeddings.shape))  # int8: one byte each
    prompt = llm.prompt_tokens(name, batch, prompt_len, seed=1)

    def generate(decoder):
        steps = []

        def on_token(i):
            steps.append(npusim.launch_records(with_counters="flat"))
            npusim.clear_launch_records()

        npusim.clear_launch_records()
        with tf.device("/NPU:0"):
            _, logits = decoder.generate(prompt, on_token=on_token, return_logits=True)
        assert all(r["ok"] for s in steps for r in s)
        # per call: the Transpose launches writing at least the table's bytes
        return logits, [sum(1 for r in s if r["op_type"] == "Transpose" and
                            _gm_write_bytes(r) >= table) for s in steps]

    want, copying = generate(llm.GreedyDecoder(lm, batch, prompt_len, gen_len))
    resident = llm.ResidentCacheDecoder(lm, batch, prompt_len, gen_len)
    got, transposes = generate(resident)
    assert all(n >= 1 for n in copying), copying  # precondition: keras-hub's step transposes
    assert transposes[1:] == [0] * (gen_len - 1), transposes
    assert resident.vocab_kernel.dtype == tf.int8
    assert tuple(resident.vocab_kernel.shape) == tuple(reversed(embedding.embeddings.shape))
    np.testing.assert_array_equal(got, want)
