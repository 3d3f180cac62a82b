"""Decoder-only language models of models/llm.py (keras-hub GPT-2, Llama, Gemma at their tiny
test sizes) on the NPU against TensorFlow on the CPU with the same weights: greedy generation
with the KV cache, prefill logits, a few training steps, and the runner's generate figures.

Tolerances. The chip runs allow_fp32_to_fp16 (tests/tf/test_models.py derives its bounds):
every MatMul / Einsum rounds both operands to fp16 (relative error u = 2^-11 each) and
accumulates in fp32. The tiny decoders have at most 9 cube ops in a chain (per layer Q/K/V
projection, scores, weighted values, output projection, two feed-forward products; the
vocabulary projection): 10 such ops at worst-case 2u give 1e-2; the bound, 2e-2 relative over
the logits tensor, doubles it for the softmax and normalisations between them (seen: 6-8e-4).
Greedy tokens are compared exactly: an argmax flips only where the CPU's two best logits are
closer than the NPU's error; the test measures both (at every position the CPU decoded) and
states the precondition, so a near-tie would show as such, not as a mismatch. Training: the
loss within the same 2e-2 relative of the CPU's at every step.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
pytest.importorskip("keras_hub")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import models  # noqa: E402  pylint: disable=wrong-import-position
from models import llm  # noqa: E402  pylint: disable=wrong-import-position

from conftest import child_env  # noqa: E402  pylint: disable=wrong-import-position

TINY = ["gpt2-tiny", "llama-tiny", "gemma-tiny"]
LOGITS_RTOL = 2e-2
# Ops the decoders' graphs put on the CPU before the NPU had kernels for them: none may be left.
DECODER_OPS = {"XlaDynamicUpdateSlice", "Sin", "Cos"}


def build_pair(tf, name):
    """The model on the CPU and on the NPU, the NPU copy given the CPU copy's weights."""
    with tf.device("/CPU:0"):
        cpu = models.build(name, seed=0)
    with tf.device("/NPU:0"):
        npu = models.build(name, seed=0)
        npu.set_weights(cpu.get_weights())
    return cpu, npu


def rel_error(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


@pytest.mark.parametrize("name", TINY)
def test_greedy_generation_matches_cpu(npusim, tf, name):
    batch, prompt_len, gen_len = 2, 8, 5
    prompt = llm.prompt_tokens(name, batch, prompt_len, seed=1)
    cpu, npu = build_pair(tf, name)
    with tf.device("/CPU:0"):
        want, want_logits = llm.GreedyDecoder(cpu, batch, prompt_len, gen_len).generate(
            prompt, return_logits=True)
    npusim.clear_launch_records()
    npusim.clear_cpu_fallback_ops()
    with tf.device("/NPU:0"):
        got, got_logits = llm.GreedyDecoder(npu, batch, prompt_len, gen_len).generate(
            prompt, return_logits=True)
    records = npusim.launch_records()
    fallbacks = npusim.cpu_fallback_ops()
    # The precondition (module docstring), over the steps up to the first token that differs
    # (both devices decoded the same sequence until then): if every logit differs by at most
    # d, a lead of the CPU's best logit over its second of more than 2 d cannot flip.
    same = (got == want).all(axis=0)
    steps = gen_len if same.all() else int(np.argmin(same)) + 1
    d = float(np.abs(got_logits[:, :steps] - want_logits[:, :steps]).max())
    top2 = np.sort(want_logits[:, :steps], axis=-1)[..., -2:]
    margin = float((top2[..., 1] - top2[..., 0]).min())
    print(f"\n{name}: NPU {got.tolist()} CPU {want.tolist()}, smallest top-2 margin {margin:.2e}"
          f", largest logit difference {d:.2e}, {len(records)} launches, CPU fallbacks "
          f"{fallbacks}")
    assert all(r["ok"] for r in records)
    assert any(r["kernel"].startswith("XlaDynamicUpdateSlice") for r in records)
    # The KV-cache writes and the decode attention read the position from device memory, so
    # they join the step's whole-graph (NpuGraph) runs instead of being dispatched one by one.
    position_ops = [r for r in records
                    if r["op_type"] in ("XlaDynamicUpdateSlice", "IncreFlashAttention")]
    outside = [r["op_name"] for r in position_ops if not r["graph_run"]]
    assert position_ops and not outside, outside
    assert not DECODER_OPS & set(fallbacks), fallbacks
    assert margin > 2 * d, "precondition: the CPU's two best logits are too close to compare"
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", TINY)
def test_prefill_logits_match_cpu(npusim, tf, name):
    prompt = llm.prompt_tokens(name, 2, 12, seed=2)
    cpu, npu = build_pair(tf, name)

    def prefill_logits(lm):
        cache = np.zeros(llm.cache_shape(lm.backbone, 2, 16), np.float32)
        return tf.function(lambda t, c: lm.call_with_cache(t, c, 0)[0])(prompt, cache)

    with tf.device("/CPU:0"):
        want = prefill_logits(cpu).numpy()
    with tf.device("/NPU:0"):
        got = prefill_logits(npu)
    assert got.device.endswith("device:NPU:0"), got.device
    err = rel_error(got.numpy(), want)
    print(f"\n{name}: prefill logits relative error {err:.2e}")
    assert err <= LOGITS_RTOL


def test_training_loss_falls_and_tracks_cpu(npusim, tf):
    """Four Adam steps (lr 1e-2) of next-token prediction on one batch of llama-tiny: the
    NPU's loss falls at every step and stays within 2e-2 relative of the CPU's."""
    name = "llama-tiny"
    x, y = models.synthetic_data(name, 4, 16, seed=3)
    cpu, npu = build_pair(tf, name)

    def train(model):
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=models.loss(name),
                      jit_compile=False)
        return [float(model.train_on_batch(x, y, return_dict=True)["loss"]) for _ in range(4)]

    with tf.device("/CPU:0"):
        loss_cpu = train(cpu)
    npusim.clear_launch_records()
    npusim.clear_cpu_fallback_ops()
    with tf.device("/NPU:0"):
        loss_npu = train(npu)
    records = npusim.launch_records()
    assert not npusim.cpu_fallback_ops(), npusim.cpu_fallback_ops()
    print(f"\n{name}: loss NPU {loss_npu}\n     loss CPU {loss_cpu}")
    assert all(r["ok"] for r in records)
    assert any(r["kernel"].startswith("MatMul") for r in records)
    assert all(b < a for a, b in zip(loss_npu, loss_npu[1:])), loss_npu
    np.testing.assert_allclose(loss_npu, loss_cpu, rtol=LOGITS_RTOL)


def test_runner_generate_figures(tmp_path):
    """`python -m models.run --mode generate` on the tiny chip: TTFT and TPOT are the prefill's
    and the decode steps' device timelines, tokens/s follows from them as documented."""
    out = tmp_path / "gen.json"
    proc = subprocess.run(
        [sys.executable, "-m", "models.run", "--model", "llama-tiny", "--mode", "generate",
         "--prompt-len", "6", "--gen-len", "3", "--batch", "2", "--chip", "tiny", "--json",
         str(out), "--quiet"], cwd=ROOT, env=child_env(), capture_output=True, text=True,
        timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    r = json.loads(out.read_text())
    assert r["ok"] and r["device"] == "NPU" and r["chip"] == "tiny"
    assert np.array(r["tokens"]).shape == (2, 3)
    assert len(r["decode_step_us"]) == 2
    assert r["ttft_us"] > 0 and r["tpot_us"] == pytest.approx(np.mean(r["decode_step_us"]))
    # A step's timeline covers its launches: never shorter than their sum.
    assert all(s >= k for s, k in zip(r["decode_step_us"], r["decode_kernel_us"]))
    assert r["decode_tokens_per_s"] == pytest.approx(2 / (r["tpot_us"] / 1e6))
    assert r["tokens_per_s"] == pytest.approx(2 * 3 / ((r["ttft_us"] + 2 * r["tpot_us"]) / 1e6))
    assert r["prefill_kernels"] > 0 and r["decode_kernels_per_step"] > 0
    # A Llama on the NPU: the resident cache, written in place, is the default decoder.
    assert r["resident_cache"] is True
    # Launches replayed from the warm-up's (which the wall times then do not simulate): counts
    # within the steps' launches; the first prefill's wall time is part of the warm-up's.
    assert 0 <= r["prefill_replayed"] <= r["prefill_kernels"]
    assert 0 <= r["decode_replayed_per_step"] <= r["decode_kernels_per_step"]
    assert 0 < r["warmup_wall_s_prefill"] <= r["warmup_wall_s"]
    # (batch, layers, key and value, max_len, kv heads, head_dim), from the config (no model is
    # built here: this process must not import TensorFlow before npusim), in fp16: a float32
    # model's resident cache under allow_fp32_to_fp16 (--kv-cache-dtype auto).
    cfg = llm.CONFIGS["llama-tiny"][1]
    shape = (2, cfg["num_layers"], 2, 9, cfg["num_key_value_heads"],
             cfg["hidden_dim"] // cfg["num_query_heads"])
    assert r["precision_mode"] == "allow_fp32_to_fp16" and r["kv_cache_dtype"] == "float16"
    assert r["kv_cache_bytes"] == 2 * int(np.prod(shape))
    # The roofline at the peak HBM rate and at the sustained one (memory.hbm.efficiency).
    import yaml  # pylint: disable=import-outside-toplevel
    hbm = {}
    for chip in ("910b", "tiny"):  # tiny.yaml extends 910b.yaml: its keys override
        with open(os.path.join(ROOT, "configs", "chips", chip + ".yaml"), encoding="utf-8") as f:
            hbm.update(yaml.safe_load(f)["memory"]["hbm"])
    assert r["decode_roofline_us"] == pytest.approx(
        (r["weight_bytes"] + r["kv_cache_bytes"]) / (hbm["gbps"] * 1e3))
    assert r["decode_roofline_sustained_us"] == pytest.approx(
        r["decode_roofline_us"] / hbm.get("efficiency", 1.0))


def test_unmaterialized_weights_are_zeros_from_the_chip(npusim, tf):
    """llm.unmaterialized_weights(): every variable built inside is zeros made by a Fill kernel on
    the NPU (no initializer, no random numbers, nothing copied from the host); outside, Keras'
    initializers are back."""
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        lm = llm.build_causal_lm("llama-tiny", zero_weights=True)
        kernels = {r["kernel"] for r in npusim.launch_records()}
        dense = keras.layers.Dense(8)
        dense.build((None, 4))
    assert all(not np.any(w.numpy()) for w in lm.weights)
    assert all(w.value.device.endswith("device:NPU:0") for w in lm.weights)
    assert any(k.startswith("Fill") for k in kernels), kernels
    assert not any("Random" in k for k in kernels), kernels
    assert np.any(dense.kernel.numpy())


# Gemma's prompt is longer: a layer's cache (one KV head of 16) must outweigh what else a
# step's data movement writes, the logits and its query projection's kernel transposed
# (4 x 64 x 16 f32: 16 KB per step in the copying decoder; the resident one holds it laid out).
@pytest.mark.parametrize("name,batch,prompt_len", [
    ("llama-tiny", 1, 24), ("llama-tiny-mha", 2, 24), ("gpt2-tiny", 1, 24),
    ("gemma-tiny", 2, 136)])
def test_resident_cache_decoder_writes_only_the_new_rows(npusim, tf, name, batch, prompt_len):
    """ResidentCacheDecoder: the CPU's greedy tokens, and a decode step that writes the new
    token's key and value rows into the per-layer cache variables and copies no cache: its
    in-place updates write exactly layers x 2 x batch x kv_heads x head_dim elements per step
    (from the model's configuration) and no data-movement launch of the step writes as many
    bytes as one layer's key cache, while the copying decoder's (GreedyDecoder) write at least
    the whole cache per step; the updates join the step's one whole-graph run, one launch
    each (docs/llm.md, "The update inside the step's graph run"). Each family's own step:
    GPT-2, Llama (GQA and MHA) and Gemma. (Compute launches are not bounded: products and
    attention write split-K partials to workspace; a float32 model's attention converts the
    cache to fp16 under allow_fp32_to_fp16, in both decoders.)"""
    gen_len = 4
    prompt, npu, want, shape = cpu_generation(tf, name, batch, prompt_len, gen_len)
    _, layers, _, max_len, kv_heads, head_dim = shape
    itemsize = np.dtype(npu.compute_dtype).itemsize
    layer_cache = batch * max_len * kv_heads * head_dim * itemsize
    logits = batch * llm.vocabulary_size(name) * 4
    assert layer_cache > logits, "precondition: a layer's cache outweighs the logits"
    rows = layers * 2 * batch * kv_heads * head_dim * itemsize

    def step_writes(decoder):
        tokens, _, steps = generate_steps(npusim, tf, decoder, prompt)
        return tokens, steps

    def moved(records):
        return [r for r in records if r["op_type"] in DATA_MOVEMENT]

    got, steps = step_writes(llm.ResidentCacheDecoder(npu, batch, prompt_len, gen_len))
    _, copying = step_writes(llm.GreedyDecoder(npu, batch, prompt_len, gen_len))
    for records in steps:
        updates = [r for r in records if r["op_name"].startswith("ResourceDynamicUpdateSlice")]
        assert sum(_gm_write_bytes(r) for r in updates) == rows
        largest = max(_gm_write_bytes(r) for r in moved(records))
        assert largest < layer_cache, [(r["op_name"], _gm_write_bytes(r)) for r in records]
        # The updates join the step's whole-graph run (one task list per step), one launch
        # each (a tile per batch entry's row).
        assert len(updates) == layers * 2, [r["op_name"] for r in updates]
        runs = {r["graph_run"] for r in records}
        assert len(runs) == 1 and 0 not in runs, sorted((r["graph_run"], r["op_name"])
                                                        for r in records)
    copied = sum(_gm_write_bytes(r) for r in moved(copying[-1]))
    assert copied >= 2 * layers * layer_cache
    print(f"\n{name} batch {batch}: {got.tolist()}; a step writes {rows} bytes of new rows, "
          f"{sum(_gm_write_bytes(r) for r in moved(steps[-1]))} bytes by data movement, "
          f"{sum(_gm_write_bytes(r) for r in steps[-1])} in all (copying decoder: {copied}, "
          f"{sum(_gm_write_bytes(r) for r in copying[-1])})")
    np.testing.assert_array_equal(got, want)


def cpu_generation(tf, name, batch, prompt_len, gen_len):
    """A random prompt (seed 1), the model on the NPU with the CPU copy's weights, the CPU's
    greedy tokens (keras-hub's own step) and the cache's shape."""
    prompt = llm.prompt_tokens(name, batch, prompt_len, seed=1)
    cpu, npu = build_pair(tf, name)
    with tf.device("/CPU:0"):
        want = llm.GreedyDecoder(cpu, batch, prompt_len, gen_len).generate(prompt)
    return prompt, npu, want, llm.cache_shape(npu.backbone, batch, prompt_len + gen_len)


def generate_steps(npusim, tf, decoder, prompt, prepare=None):
    """decoder.generate(prompt) on the NPU -> (tokens, logits, the launch records of each decode
    step with flat counters); prepare(), if given, runs first on the NPU."""
    steps = []

    def on_token(i):
        if i:
            steps.append(npusim.launch_records(with_counters="flat"))
        npusim.clear_launch_records()

    with tf.device("/NPU:0"):
        if prepare:
            prepare()
        tokens, logits = decoder.generate(prompt, on_token=on_token, return_logits=True)
    assert all(r["ok"] for s in steps for r in s)
    return tokens, logits, steps


# Launches that move data (no arithmetic): a cache copy would be one of them.
DATA_MOVEMENT = {"XlaDynamicUpdateSlice", "StridedSlice", "Slice", "Pack", "ConcatV2", "Unpack",
                 "Split", "SplitV", "Tile", "BroadcastTo", "Transpose", "Pad"}


def _gm_write_bytes(record):
    return sum(v for k, v in record["counters"].items()
               if ".bytes." in k and k.endswith("_to_gm"))


def test_resident_cache_decoder_refuses_other_families(tf):
    """A decoder whose layers it does not compute (OPT's) is refused by name, not run wrong."""
    import keras_hub  # pylint: disable=import-outside-toplevel

    with tf.device("/CPU:0"):
        backbone = keras_hub.models.OPTBackbone(vocabulary_size=64, num_layers=1, num_heads=2,
                                                hidden_dim=16, intermediate_dim=32,
                                                max_sequence_length=16)
        lm = keras_hub.models.OPTCausalLM(backbone=backbone, preprocessor=None)
    with pytest.raises(ValueError, match="not OPTBackbone"):
        llm.ResidentCacheDecoder(lm, 1, 4, 2)


@pytest.mark.parametrize("name,batch", [("llama-tiny", 1), ("gpt2-tiny", 1), ("gemma-tiny", 2)])
def test_float16_cache_of_a_float32_model(npusim, tf, name, batch):
    """A float32 model's resident cache held in float16 (ResidentCacheDecoder cache_dtype,
    models.run --kv-cache-dtype auto on the NPU under allow_fp32_to_fp16): the fused attention
    reads the fp16 variables as they are, so a decode step no longer casts each layer's whole
    key and value cache to fp16 (the `<attention>/npusim_{k,v}_fp16` Casts of rewrite 9, one
    per layer and K / V with a float32 cache); the new rows are cast instead, so the step's
    Cast launches write exactly 2 x layers x (a layer's fp16 cache - its new rows) bytes fewer
    (from the model's configuration), and no launch more. The attention saw fp16 K / V
    before too, so the logits of every step are the float32 cache's bit for bit, and the
    greedy tokens the CPU's."""
    prompt_len, gen_len = 24, 4
    prompt, npu, want, shape = cpu_generation(tf, name, batch, prompt_len, gen_len)
    _, layers, _, max_len, kv_heads, head_dim = shape
    layer_cache16 = batch * max_len * kv_heads * head_dim * 2
    rows16 = batch * kv_heads * head_dim * 2

    def run(cache_dtype):
        dec = llm.ResidentCacheDecoder(npu, batch, prompt_len, gen_len, cache_dtype=cache_dtype)
        out = generate_steps(npusim, tf, dec, prompt)
        assert {v.dtype.name for v in dec.keys + dec.values} == {cache_dtype}
        return out

    def cache_casts(records):
        return [r for r in records if r["op_name"].endswith(("/npusim_k_fp16", "/npusim_v_fp16"))]

    def cast_writes(records):
        return sum(_gm_write_bytes(r) for r in records if r["op_type"] == "Cast")

    # A first generation keeps the weights' fp16 copies (derived-tensor cache), which the
    # first steps of a process would otherwise still make: the two runs compared are alike.
    run("float16")
    _, l32, s32 = run("float32")
    t16, l16, s16 = run("float16")
    np.testing.assert_array_equal(l16, l32)
    np.testing.assert_array_equal(t16, want)
    for a, b in zip(s32, s16):
        assert len(cache_casts(a)) == 2 * layers and not cache_casts(b)
        assert len(b) == len(a)
        assert cast_writes(a) - cast_writes(b) == 2 * layers * (layer_cache16 - rows16)
    print(f"\n{name}: a step's Cast launches write {cast_writes(s32[-1])} bytes with a float32 "
          f"cache, {cast_writes(s16[-1])} with a float16 one")


def test_gemma_projections_read_their_kernels_laid_out_once(npusim, tf):
    """Gemma's query / key / value EinsumDense ("btd,ndh->btnh", "bsd,kdh->bskh") multiply by
    their [n, d, h] kernels transposed to [d, n, h]: with keras-hub's layers a Transpose launch
    per projection and step. ResidentCacheDecoder holds the three kernels laid out [d, n, h]
    once (_kernels_dnh): a decode step then has no Transpose, and from the second step on no
    cast of those kernels either: 2 x 3 x layers launches fewer; logits bit for bit those of
    the layers' own calls (the same product on the same values); greedy tokens the CPU's.
    Batch 2, float32 under allow_fp32_to_fp16, tiny chip."""
    name, batch, prompt_len, gen_len = "gemma-tiny", 2, 16, 4
    prompt, npu, want, shape = cpu_generation(tf, name, batch, prompt_len, gen_len)
    layers = shape[1]

    def run(laid_out):
        dec = llm.ResidentCacheDecoder(npu, batch, prompt_len, gen_len)

        def prepare():  # the decoder's variables, then (the layers' own calls) no laid-out kernel
            dec._make_cache()  # pylint: disable=protected-access
            if not laid_out:
                dec._kernels_dnh.clear()  # pylint: disable=protected-access

        return generate_steps(npusim, tf, dec, prompt, prepare)

    run(True)  # the weights' fp16 copies kept, as in tests above: the runs compared are alike
    _, l_plain, s_plain = run(False)
    tokens, l_laid, s_laid = run(True)
    np.testing.assert_array_equal(l_laid, l_plain)
    np.testing.assert_array_equal(tokens, want)
    for i, (plain, laid) in enumerate(zip(s_plain, s_laid)):
        transposes = [r for r in plain if r["op_type"] == "Transpose"]
        assert len(transposes) == 3 * layers, [r["op_name"] for r in transposes]
        assert not [r["op_name"] for r in laid if r["op_type"] == "Transpose"]
        # The first step casts the laid-out kernels to fp16 once; later steps read the copies
        # the plugin keeps (docs/tf_plugin.md "Weights kept in fp16"), where keras-hub's layers
        # cast their new transposed tensors every step.
        casts = [sum(r["kernel"].startswith("Cast") for r in s) for s in (plain, laid)]
        assert casts[0] - casts[1] == (0 if i == 0 else 3 * layers), casts
        assert len(plain) - len(laid) == 3 * layers + casts[0] - casts[1]
