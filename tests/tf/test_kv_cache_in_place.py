"""The KV cache written in place inside whole-graph (NpuGraph) runs (docs/llm.md, "KV cache in
place"; adapter/tf/plugin/npu_graph_kernel.cpp, place_in_place): a slice contiguous in its input
is read there, and a concatenation's producers write their pieces into its output, so neither
launches.

keras-hub's decode step per layer i slices the cache `cache[:, i]`, splits it into K and V
(`[:, 0]`, `[:, 1]`), writes the new row into each (XlaDynamicUpdateSlice), stacks K and V and
then the layers. With batch 1 the three slices per layer are contiguous and the stacks take
their inputs in place: per decode step at least 3 x layers StridedSlice launches fewer (other
contiguous slices of the step, such as the token's `[:, None]`, go too) and exactly `layers` + 1
Pack launches fewer (each layer's stack of K and V, and the stack of the layers, whose inputs
the same run writes now that the step is one NpuGraph run: tests/tf/test_llm_decode_graph.py),
derived from that structure; the rest of the step's launches the same, and every value bit for bit the
same as with NPUSIM_GRAPH_IN_PLACE=0, which runs every copy. The tokens equal TensorFlow's on the
CPU (the precondition on the CPU's top-2 margin as tests/tf/test_llm.py).
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")
pytest.importorskip("keras_hub")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import child_result  # noqa: E402  pylint: disable=wrong-import-position
from llm_child import assert_cpu_tokens, greedy_generation  # noqa: E402  pylint: disable=wrong-import-position

# After llama-tiny's greedy generation (tests/tf/llm_child.py): the op types of the decode
# steps' launches.
STEP_OPS = r'''
step = {}
for r in recs[marks[0]:]:
    # A weight's fp16 copy for a MatMul run node by node is kept between runs or cast again,
    # as the plugin's kept-copy cache has it (it varies between runs): not counted.
    if r["op_type"] == "MatMul" and r["kernel"].startswith("Cast_"):
        continue
    step[r["op_type"]] = step.get(r["op_type"], 0) + 1
extra = {"step_ops": step, "layers": npu.backbone.num_layers}
'''


def _generate(batch, in_place):
    return child_result(greedy_generation("llama-tiny", batch, STEP_OPS), timeout=600,
                        extra_env=None if in_place else {"NPUSIM_GRAPH_IN_PLACE": "0"})


def test_llama_decode_step_updates_the_cache_in_place():
    on, off = _generate(1, True), _generate(1, False)
    assert on["ok"] and off["ok"]
    layers, steps = on["layers"], 2
    # Values: every bit as with the copies; the tokens the CPU's.
    np.testing.assert_array_equal(np.array(on["logits"]), np.array(off["logits"]))
    assert_cpu_tokens(on)
    # Launches of the two decode steps: the copies gone, the cache writes kept.
    on_ops, off_ops = on["step_ops"], off["step_ops"]
    print(f"\ndecode steps, in place: {on_ops}\ncopies: {off_ops}")
    assert off_ops.get("StridedSlice", 0) - on_ops.get("StridedSlice", 0) >= steps * 3 * layers
    assert off_ops.get("Pack", 0) - on_ops.get("Pack", 0) == steps * (layers + 1)
    assert on_ops["XlaDynamicUpdateSlice"] == off_ops["XlaDynamicUpdateSlice"] == steps * 2 * layers
    # A BroadcastTo whose output is its input's bytes (the rotary tables' broadcast over size-1
    # dimensions: a contiguous view) is placed too, now that its reader runs in the same graph.
    assert on_ops.get("BroadcastTo", 0) <= off_ops.get("BroadcastTo", 0)
    rest = lambda ops: {k: v for k, v in ops.items()
                        if k not in ("StridedSlice", "Pack", "BroadcastTo")}
    assert rest(on_ops) == rest(off_ops)


def test_batch_two_cache_slices_are_copied():
    """With batch 2 a layer's slice of the cache and the stacks' pieces are not contiguous
    (each batch entry's rows lie apart): the cache's copies run as before (only the token's
    `[:, None]`, one slice per step, is read in place), the values as with
    NPUSIM_GRAPH_IN_PLACE=0."""
    on, off = _generate(2, True), _generate(2, False)
    assert on["ok"] and off["ok"]
    np.testing.assert_array_equal(np.array(on["logits"]), np.array(off["logits"]))
    on_ops, off_ops = on["step_ops"], off["step_ops"]
    assert on_ops["Pack"] == off_ops["Pack"], (on_ops, off_ops)
    assert off_ops["StridedSlice"] - on_ops["StridedSlice"] <= 2, (on_ops, off_ops)


def test_in_place_rules_against_cpu(npusim, tf):
    """Pieces read by other ops too, an input stacked twice, pieces that are not whole 32-byte
    blocks, a slice of a stacked output: the same bits as TensorFlow's CPU kernels, and a
    Pack launched exactly where the rules leave one."""

    def f(x):
        a = x * 2.0                    # [1, 4, 32] f32: 512 bytes
        b = x + 1.0
        s = tf.stack([a, b])           # in place: a and b are written into s
        t = tf.stack([a, a + 0.0])     # a is inside s already: copied
        u = s[1] * 3.0                 # a slice of s, read in place (b's bytes)
        y0, y1 = x[0, 0, :3] * 2.0, x[0, 1, :3] * 2.0
        p = tf.stack([y0, y1])         # pieces of 12 bytes: a producer's tail write would
        return s, t, u + a, p          # reach the next piece: copied

    x = np.arange(128, dtype=np.float32).reshape(1, 4, 32) / 7.0
    with tf.device("/CPU:0"):
        want = [w.numpy() for w in tf.function(f)(x)]
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        got = [g.numpy() for g in tf.function(f)(x)]
    records = npusim.launch_records()
    ops = [r["op_type"] for r in records]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert any(r["graph_run"] for r in records), ops
    assert ops.count("Pack") == 2, ops
