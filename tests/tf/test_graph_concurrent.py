"""Concurrent steps of a TF graph (NPUSIM_GRAPH_CONCURRENT=1; docs/graph_engine.md, "Concurrent
steps of a TF graph"), each case a child process with the switch and one without:

- two independent branches of one NpuGraph, a MatMul on the cube cores and a Relu on the vector
  cores, joined by a MatMul: the outputs are bit for bit those of the run in order; with the
  switch the two launches start on one cycle (one group) and the graph's launches span fewer
  cycles than in order;
- a chain (each op reads the one before): the same outputs, the same launches with the same
  cycles each, one after another;
- a fault in a group (the watchdog at one instruction): the graph's error names the node of a
  faulting member; both members ran from one start.
"""

import textwrap

import pytest

pytest.importorskip("tensorflow")

from conftest import child_result  # noqa: E402  pylint: disable=wrong-import-position

CODE = textwrap.dedent("""
    import json
    import numpy as np
    import npusim
    import tensorflow as tf

    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (256, 256)).astype(np.float16)
    w = rng.uniform(-1, 1, (256, 256)).astype(np.float16)
    z = rng.uniform(-1, 1, (256, 256)).astype(np.float16)

    def branches(x, w, z):  # joined by a MatMul, so no fusion takes the Relu into the join
        return tf.matmul(tf.matmul(x, w), tf.nn.relu(z))

    def chain(x, w, z):
        return tf.matmul(tf.nn.relu(tf.matmul(x, w)), w) + z

    out = {}
    for name, fn in (("branches", branches), ("chain", chain)):
        f = tf.function(fn)
        with tf.device("/NPU:0"):
            f(x, w, z)  # compiles; the second run is measured
            npusim.clear_launch_records()
            y = f(x, w, z).numpy()
        recs = npusim.launch_records()
        first = min(r["start_cycle"] for r in recs)  # starts relative to the first launch's
        out[name] = {
            "output": y.view(np.uint16).tolist(),
            "launches": [[r["op_type"], r["kernel"], r["start_cycle"] - first, r["cycles"]]
                         for r in recs],
            "span": max(r["start_cycle"] + r["cycles"] for r in recs) - first,
        }
    print("RESULT" + json.dumps(out))
    """)


@pytest.fixture(scope="module")
def runs():
    return child_result(CODE), child_result(CODE, extra_env={"NPUSIM_GRAPH_CONCURRENT": "1"})


def test_independent_branches_run_at_once_with_the_same_outputs(runs):
    off, on = runs
    assert on["branches"]["output"] == off["branches"]["output"]
    # The first MatMul and the Relu: one start with the switch, one after the other without.
    on_starts = [[op, start] for op, _, start, _ in on["branches"]["launches"]]
    off_starts = [[op, start] for op, _, start, _ in off["branches"]["launches"]]
    assert sorted(op for op, _ in on_starts) == ["MatMul", "MatMul", "Relu"], on_starts
    relu_on = [start for op, start in on_starts if op == "Relu"][0]
    assert [op for op, start in on_starts if start == relu_on] in (["MatMul", "Relu"],
                                                                   ["Relu", "MatMul"]), on_starts
    assert len({start for _, start in off_starts}) == 3, off_starts
    assert on["branches"]["span"] < off["branches"]["span"], (on["branches"], off["branches"])


def test_a_chain_stays_in_order_with_the_same_cycles(runs):
    off, on = runs
    assert on["chain"]["output"] == off["chain"]["output"]
    assert on["chain"]["launches"] == off["chain"]["launches"]
    starts = [start for _, _, start, _ in on["chain"]["launches"]]
    assert len(set(starts)) == len(starts)


FAULT = textwrap.dedent("""
    import json, os
    import numpy as np
    import npusim
    os.environ["NPUSIM_MAX_INSNS_PER_BLOCK"] = "1"  # every launch faults at its first block
    import tensorflow as tf

    @tf.function
    def f(x, w, z):
        return tf.matmul(tf.matmul(x, w, name="the_matmul"), tf.nn.relu(z, name="the_relu"))

    a = tf.constant(np.ones((16, 16), np.float16))
    out = {}
    try:
        f(a, a, a).numpy()
    except tf.errors.OpError as e:
        out["error"] = [type(e).__name__, e.message]
    recs = npusim.launch_records()
    out["faulted"] = sorted([r["op_type"], r["start_cycle"]] for r in recs if not r["ok"])
    print("RESULT" + json.dumps(out))
    """)


def test_a_fault_in_a_group_is_the_graphs_error_naming_a_node():
    result = child_result(FAULT, extra_env={"NPUSIM_GRAPH_CONCURRENT": "1"})
    kind, message = result["error"]
    assert kind == "InternalError", result
    assert "NpuGraph" in message and ("of node 'the_matmul' (MatMul)" in message or
                                      "of node 'the_relu' (Relu)" in message), message
    # Both members of the group ran, from one start, and faulted.
    relu_start = [start for op, start in result["faulted"] if op == "Relu"]
    assert len(relu_start) == 1, result
    assert sorted(op for op, start in result["faulted"] if start == relu_start[0]) == [
        "MatMul", "Relu"], result
