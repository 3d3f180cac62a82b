"""Concurrent steps of a TF graph (NPUSIM_GRAPH_CONCURRENT=1; docs/graph_engine.md, "Concurrent
steps of a TF graph"), each case a child process with the switch and one without:

- two independent branches of one NpuGraph, a MatMul on the cube cores and a Relu on the vector
  cores, joined by a MatMul: the outputs are bit for bit those of the run in order; with the
  switch the two launches start on one cycle and the graph's launches span fewer cycles than in
  order;
- a long MatMul off a chain of two vector launches (a Relu, then a Softmax reading it), as a
  filter gradient beside a layer's batch-norm gradients: the same outputs; with the switch the
  MatMul and the Relu start together and the Softmax starts after the Relu's end while the
  MatMul still runs (streams: groups that are barriers would hold the Softmax until the MatMul's
  end);
- a chain (each op reads the one before): the same outputs, the same kernels one after another,
  each in its cycles in order (a launch of a group starts with the L2 it would have in order,
  on tiny a cold one: docs/chip_model.md "Concurrent launches", "The L2 of each launch";
  nothing runs beside the chain);
- a fault (the watchdog at one instruction): the graph's error names the node of a faulting
  launch; the two independent launches ran from one start, the MatMul that waits for them did
  not run.
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

    xb = rng.uniform(-1, 1, (512, 1024)).astype(np.float16)
    wb = rng.uniform(-1, 1, (1024, 512)).astype(np.float16)

    def beside_chain(x, w, z):  # a long MatMul beside a short chain of two vector launches
        long = tf.matmul(x, w, name="long_matmul")
        chain = tf.nn.softmax(tf.nn.relu(z[:16], name="chain_relu"), name="chain_softmax")
        return tf.matmul(chain, long[:256], name="join")  # one graph: the two meet

    out = {}
    for name, fn, args in (("branches", branches, (x, w, z)), ("chain", chain, (x, w, z)),
                           ("beside_chain", beside_chain, (xb, wb, z))):
        f = tf.function(fn)
        with tf.device("/NPU:0"):
            f(*args)  # compiles; the second run is measured
            npusim.clear_launch_records()
            y = np.concatenate([t.numpy().ravel() for t in tf.nest.flatten(f(*args))])
        recs = npusim.launch_records()
        first = min(r["start_cycle"] for r in recs)  # starts relative to the first launch's
        spans = {}  # per node: its launches' first start and last end
        for r in recs:
            begin, end = r["start_cycle"] - first, r["start_cycle"] + r["cycles"] - first
            b, e = spans.get(r["op_name"], (begin, end))
            spans[r["op_name"]] = (min(b, begin), max(e, end))
        out[name] = {
            "spans": spans,
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


def test_a_launch_off_a_chain_runs_beside_both_of_its_launches(runs):
    off, on = runs
    assert on["beside_chain"]["output"] == off["beside_chain"]["output"]
    spans = on["beside_chain"]["spans"]
    assert {"long_matmul", "chain_relu", "chain_softmax", "join"} <= set(spans), spans
    matmul, relu, softmax = spans["long_matmul"], spans["chain_relu"], spans["chain_softmax"]
    assert softmax[0] >= relu[1], spans  # the chain keeps its order
    # The MatMul overlaps the Relu and the Softmax: it began before the Relu ended and ended
    # after the Softmax began (a barrier group would start the Softmax after the MatMul's end).
    assert matmul[0] < relu[1], spans
    assert matmul[1] > softmax[0], spans
    assert on["beside_chain"]["span"] < off["beside_chain"]["span"], (on["beside_chain"],
                                                                      off["beside_chain"])


def test_a_chain_stays_in_order(runs):
    off, on = runs
    assert on["chain"]["output"] == off["chain"]["output"]
    # The same kernels in the same order, each beginning after the one before has ended
    # (starts are whole cycles rounded down, durations rounded up: one cycle of slack).
    assert [l[:2] for l in on["chain"]["launches"]] == [l[:2] for l in off["chain"]["launches"]]
    launches = on["chain"]["launches"]
    for before, after in zip(launches, launches[1:]):
        assert after[2] + 1 >= before[2] + before[3], launches
    # Each launch's own cycles are those in order: none finds its predecessor's lines in the L2.
    assert [l[3] for l in launches] == [l[3] for l in off["chain"]["launches"]], (
        launches, off["chain"]["launches"])


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
    out["faulted"] = sorted([r["op_name"], r["start_cycle"], r["error"]] for r in recs
                            if not r["ok"])
    print("RESULT" + json.dumps(out))
    """)


def test_a_fault_is_the_graphs_error_naming_a_node():
    result = child_result(FAULT, extra_env={"NPUSIM_GRAPH_CONCURRENT": "1"})
    kind, message = result["error"]
    assert kind == "InternalError", result
    assert "NpuGraph" in message and ("of node 'the_matmul' (MatMul)" in message or
                                      "of node 'the_relu' (Relu)" in message), message
    # The two independent launches ran from one start and faulted; the MatMul reading both
    # did not run.
    starts = {name: start for name, start, _ in result["faulted"]}
    assert starts["the_matmul"] == starts["the_relu"], result
    joined = [error for name, _, error in result["faulted"]
              if name not in ("the_matmul", "the_relu")]
    assert len(joined) == 1 and "did not run" in joined[0], result
