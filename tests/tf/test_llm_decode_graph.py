"""A decoder's decode step as one task list (docs/llm.md, "One task list per decode step";
adapter/tf/plugin/npu_graph.h, npu_graph_view_op).

keras' Dense over a 3-D input computes `Tensordot`: Reshape, MatMul, Reshape. TensorFlow runs
the Reshapes (and ExpandDims, Squeeze) on the host without a launch, but a node that is no
compiled op ended an NpuGraph set, so every feed-forward product and what lay between them ran
node by node and cut the step into several task lists. Now a set holds them as placements.

The bound N on a decode step's task lists is derived from the step's graph: its computing ops
(all but arguments, constants, variable reads, Identity and NoOp) form N connected pieces
through data edges, and each piece of ops that all run on the NPU as compiled ops or views is
one set, one task list. Asserted: every launch of each decode step belongs to a whole-graph run
(none dispatched node by node) and the step's runs are at most N; the decode attention is fused
(IncreFlashAttention), also for a Llama with as many KV heads as query heads (MHA, Llama 2 7B's
form); the greedy tokens are TensorFlow's on the CPU (the precondition on the CPU's top-2
margin as tests/tf/test_llm.py).
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

# After llama-tiny's greedy generation (batch 1; tests/tf/llm_child.py): per decode step the
# graph runs of its launches; the step's graph's connected pieces.
STEPS = r'''
steps = []
for a, b in zip(marks, marks[1:]):
    runs = [r["graph_run"] for r in recs[a:b]]
    steps.append({"launches": len(runs), "node_by_node": runs.count(0),
                  "graph_runs": len(set(runs) - {0}),
                  "ops": sorted({r["op_type"] for r in recs[a:b]})})
# The step's graph as traced: its computing ops' connected pieces (data edges).
graph = dec.step.get_concrete_function(
    tf.TensorSpec([batch], tf.int32), tf.TensorSpec(dec.cache_shape, npu.compute_dtype),
    tf.TensorSpec([], tf.int32)).graph.as_graph_def()
skip = {"Placeholder", "Const", "ReadVariableOp", "Identity", "NoOp"}
nodes = {n.name: n for n in graph.node if n.op not in skip}
parent = {n: n for n in nodes}
def find(x):
    while parent[x] != x:
        x = parent[x]
    return x
for n in nodes.values():
    for i in n.input:
        src = i.split(":")[0]
        if not i.startswith("^") and src in nodes:
            parent[find(src)] = find(n.name)
extra = {"steps": steps, "pieces": len({find(n) for n in nodes}),
         "fallback": npusim.cpu_fallback_ops()}
'''


# llama-tiny: grouped-query heads (keras-hub repeats K / V); llama-tiny-mha: as many KV heads as
# query heads (Llama 2 7B's form: a repeat by 1, which grappler reduces to Reshape(ExpandDims)).
@pytest.mark.parametrize("name", ["llama-tiny", "llama-tiny-mha"])
def test_decode_step_is_one_task_list(name):
    r = child_result(greedy_generation(name, 1, STEPS), timeout=600)
    assert r["ok"] and not r["fallback"], r["fallback"]
    print(f"\n{name}: decode steps {[{k: v for k, v in s.items() if k != 'ops'} for s in r['steps']]}, "
          f"pieces of the step's graph {r['pieces']}")
    assert len(r["steps"]) == 2
    for step in r["steps"]:
        assert step["launches"] > 0
        assert step["node_by_node"] == 0, step
        assert step["graph_runs"] <= r["pieces"], step
        # The decode attention fused (rewrite 9), not its Softmax and products.
        assert "IncreFlashAttention" in step["ops"] and "Softmax" not in step["ops"], step
    assert_cpu_tokens(r)


def test_views_inside_a_graph_against_cpu(npusim, tf):
    """Reshape, ExpandDims and Squeeze between compiled ops, a view read outside the graph
    (left outside as TensorFlow's own Reshape), a view of a view, a view of a graph input, a
    -1 in a Reshape's shape: the same values as TensorFlow's CPU kernels, in one graph run."""

    def f(x, w):
        h = tf.reshape(x, [-1, 8]) * 2.0              # a view of an input
        m = tf.matmul(h, w)                           # [4, 8] @ [8, 8]
        r = tf.reshape(m, [2, 2, 8])                  # Tensordot's output Reshape
        e = tf.expand_dims(r + 1.0, 1)                # [2, 1, 2, 8]
        s = tf.squeeze(tf.reshape(e, [2, 1, 16]), 1)  # a view of a view
        y = tf.nn.relu(s) + tf.reduce_sum(r, axis=-1, keepdims=True)[:, 0]
        return y, r                                   # r is read outside the graph

    x = (np.arange(32, dtype=np.float32).reshape(2, 2, 8) - 16.0) / 5.0
    w = (np.arange(64, dtype=np.float32).reshape(8, 8) % 7 - 3.0) / 4.0
    with tf.device("/CPU:0"):
        want = [t.numpy() for t in tf.function(f)(x, w)]
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        got = [t.numpy() for t in tf.function(f)(x, w)]
    records = npusim.launch_records()
    for g, v in zip(got, want):
        assert g.shape == v.shape
        np.testing.assert_allclose(g, v, rtol=2e-3, atol=2e-3)  # the MatMul's fp16 operands
    runs = {r["graph_run"] for r in records}
    assert len(runs) == 1 and 0 not in runs, [(r["op_type"], r["graph_run"]) for r in records]
