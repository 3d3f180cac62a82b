"""The canonical launch order (adapter/tf/plugin/launch_order.h; docs/multichip.md, "Launch
order"), on by default: a single-chip training step of the models of models/ launches the same
kernels in the same order, each at the same start cycle, in every process, and the order costs
nothing against the order TensorFlow's executor chose (NPUSIM_LAUNCH_ORDER=0): the same kernels
with the same cycles, the same span.

Without the order the MLP's launches moved from run to run: TensorFlow copies its int32 labels
onto the NPU when an executor thread gets to it, and on a single chip that copy sits on the
compute timeline between whichever kernels the driver had been given (the dropout's seed
arithmetic moved by one copy's time, 9,251 cycles on tiny, in 2 of 2 runs, 2026-12-04). The
chain's input gate makes every kernel of the step wait for that copy. A Keras LSTM step (control
flow, chained within frames and liveness classes; the embedding's int32 arithmetic copied onto
the device behind a copy gate, the backward loop's int32 list elements copied to the host
behind read-back gates) launches at the same cycles in every process; so does a function of
conds and a loop on one NPU, and on two NPUs each chip launches in one order.
"""

import collections
import json
import os
import sys

import pytest

pytest.importorskip("tensorflow")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import ROOT, run_child  # noqa: E402  pylint: disable=wrong-import-position

# Two training steps of a model of models/ (batch 2, Adam) on one tiny NPU; prints every launch.
CHILD = r'''
import json, sys
sys.path.insert(0, {root!r})
import npusim
import keras
import models
x, y = models.synthetic_data({name!r}, batch=2, seed=1)
model = models.build({name!r}, seed=3)
model.compile(optimizer="adam", loss=models.loss({name!r}))
for _ in range(2):
    model.train_on_batch(x, y)
print("LAUNCHES" + json.dumps([(r["op_name"], r["kernel"], r["start_cycle"], r["cycles"])
                               for r in npusim.launch_records()]))
'''


def launches(name, order=None):
    """[(op name, kernel, start cycle, cycles)] of CHILD's run of model `name` in a fresh
    process, with NPUSIM_LAUNCH_ORDER=`order` (None: the default)."""
    extra_env = {} if order is None else {"NPUSIM_LAUNCH_ORDER": order}
    proc = run_child(CHILD.format(root=ROOT, name=name), timeout=600, extra_env=extra_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("LAUNCHES")][-1]
    return [tuple(r) for r in json.loads(line[len("LAUNCHES"):])]


def span(records):
    return max(s + c for _, _, s, c in records) - min(s for _, _, s, _ in records)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_a_training_step_launches_at_the_same_cycles_in_every_process(name):
    runs = [launches(name) for _ in range(3)]
    assert len(runs[0]) > 30
    for k, other in enumerate(runs[1:], start=2):
        first_diff = next((i for i, (a, b) in enumerate(zip(runs[0], other)) if a != b), None)
        assert other == runs[0], (f"run {k}: {len(other)} launches vs {len(runs[0])}, first "
                                  f"unlike run 1's: #{first_diff}")


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_the_launch_order_costs_no_launch_and_no_cycle(name):
    """Against the executor's order: the same kernels with the same cycles (which node of a
    shared input casts it may differ) and the same span from the first launch's start to the
    last one's end."""
    on, off = launches(name), launches(name, order="0")

    def kernels(records):
        return collections.Counter((kernel, cycles) for _, kernel, _, cycles in records)

    assert kernels(on) == kernels(off)
    assert span(on) == span(off)


# A tf.function with control flow on one NPU or two: two conds on different predicates and a
# node after them on NPU:0, a cond and a loop on NPU:1 (or NPU:0), called three times with the
# predicates True/True, False/False, True/False. Prints each call's result's largest difference
# from numpy and every launch (op name, chip, start cycle, cycles).
CF_CHILD = r'''
import json
import numpy as np
import npusim
import tensorflow as tf

def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))

@tf.function
def step(x, p, q):
    with tf.device("/NPU:0"):
        a = tf.tanh(x * 0.5)
        b = tf.cond(p, lambda: tf.sigmoid(a * 2.0) * 3.0, lambda: tf.tanh(a - 1.0) * 0.5)
        c = tf.cond(q, lambda: tf.exp(x * 0.1) + 1.0, lambda: tf.sigmoid(x) - 1.0)
    with tf.device("/NPU:1" if {two_npus} else "/NPU:0"):
        d = tf.tanh(x * 1.5) * 2.0
        e = tf.cond(q, lambda: tf.sigmoid(d) * 3.0, lambda: tf.exp(d) * 0.5)
        _, y = tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, tf.tanh(y * 1.1) + 0.1),
                             (tf.constant(0), e))
    with tf.device("/NPU:0"):
        return b + c + tf.identity(y)

xv = np.random.default_rng(0).uniform(-1, 1, (16, 32)).astype(np.float32)
with tf.device("/NPU:0"):
    x = tf.constant(xv)
errors = []
for p, q in [(True, True), (False, False), (True, False)]:
    got = step(x, tf.constant(p), tf.constant(q)).numpy()
    a = np.tanh(xv * 0.5)
    b = sigmoid(a * 2.0) * 3.0 if p else np.tanh(a - 1.0) * 0.5
    c = np.exp(xv * 0.1) + 1.0 if q else sigmoid(xv) - 1.0
    d = np.tanh(xv * 1.5) * 2.0
    y = sigmoid(d) * 3.0 if q else np.exp(d) * 0.5
    for _ in range(3):
        y = np.tanh(y * 1.1) + 0.1
    errors.append(float(np.max(np.abs(got - (b + c + y)))))
print("CF" + json.dumps({{"errors": errors, "launches": [
    (r["op_name"], r["chip"], r["start_cycle"], r["cycles"])
    for chip in range(2 if {two_npus} else 1) for r in npusim.launch_records(chip=chip)]}}))
'''


def control_flow_runs(two_npus, processes=3):
    """CF_CHILD's output ({"errors", "launches"}) of `processes` fresh processes, and the
    fusion log's lines of the first."""
    extra_env = {"NPUSIM_FUSION_LOG": "1", **({"NPUSIM_SYSTEM": "tiny-x8"} if two_npus else {})}
    runs, log = [], []
    for k in range(processes):
        proc = run_child(CF_CHILD.format(two_npus=two_npus), timeout=300, extra_env=extra_env)
        assert proc.returncode == 0, proc.stderr[-4000:]
        line = [l for l in proc.stdout.splitlines() if l.startswith("CF")][-1]
        runs.append(json.loads(line[2:]))
        if k == 0:
            log = [l for l in proc.stderr.splitlines() if "npusim: launch order" in l]
    return runs, log


def test_a_graph_with_control_flow_on_one_npu_launches_the_same_in_every_process():
    # Each NPU's nodes are chained per frame (launch_order.h, "Control flow"); a node waits for
    # a node of another cond's branch or of the branch not taken through a ControlTrigger join.
    runs, log = control_flow_runs(two_npus=False)
    assert any("launch order in" in l for l in log), log
    assert max(max(r["errors"]) for r in runs) < 2e-3
    assert len(runs[0]["launches"]) > 20
    for k, run in enumerate(runs[1:], start=2):
        first = next((i for i, (a, b) in enumerate(zip(runs[0]["launches"], run["launches"]))
                      if a != b), None)
        assert run["launches"] == runs[0]["launches"], f"process {k}: first unlike #{first}"


def test_a_graph_with_control_flow_on_two_npus_launches_in_one_order():
    # Was: a graph with control flow on several NPUs was left as TensorFlow's executor issued
    # it; each chip's launches came in a different order from process to process (4 of 4
    # processes, 2026-12-06). Now each chip's nodes are chained per frame. The start cycles may
    # still differ: on a system the host clock stands at the read-back the host last observed
    # (docs/runtime.md, "The host clock"), and the cond predicates' copies to the host are read
    # by executor threads in an order of their own.
    runs, log = control_flow_runs(two_npus=True)
    assert any("launch order in" in l for l in log), log
    assert max(max(r["errors"]) for r in runs) < 2e-3

    def per_chip(run):
        chips = sorted({chip for _, chip, _, _ in run["launches"]})
        return {c: [(n, cycles) for n, chip, _, cycles in run["launches"] if chip == c]
                for c in chips}

    first = per_chip(runs[0])
    assert sorted(first) == [0, 1] and all(len(v) > 5 for v in first.values())
    for run in runs[1:]:
        assert per_chip(run) == first


# A Keras LSTM training step (Embedding, LSTM, Dense; SGD) on one NPU: its loop runs as graphs
# under control flow, and the embedding's int32 index arithmetic (host-memory outputs on the
# NPU) feeds a graph that reads it in device memory. Prints the second step's launches and span
# (the first launch's host dispatch to the last launch's end) in cycles.
RNN_CHILD = r'''
import json
import numpy as np
import npusim
import keras
from keras import layers
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
ids = rng.integers(0, 1000, (2, 12)).astype(np.int32)
labels = rng.integers(0, 10, (2,)).astype(np.int32)
model = keras.Sequential([keras.Input((12,), dtype="int32"), layers.Embedding(1000, 16),
                          layers.LSTM(16), layers.Dense(10)])
model.compile(keras.optimizers.SGD(0.1),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.train_on_batch(ids, labels)
npusim.clear_launch_records()
model.train_on_batch(ids, labels)
recs = npusim.launch_records()
span = (max(r["start_cycle"] + r["cycles"] for r in recs)
        - min(r["start_cycle"] - r["host_dispatch_cycles"] for r in recs))
print("RNN" + json.dumps({"span": span, "ops": [(r["op_name"], r["start_cycle"], r["cycles"])
                                                for r in recs]}))
'''


def test_a_recurrent_training_step_launches_at_the_same_cycles_in_every_process():
    # Was: the graph with control flow got no launch order, its launches' order moved from run to
    # run; then, with it, the copy of the embedding's int32 arithmetic onto the device landed
    # before or after the step's first kernel (copy gates, launch_order.h): the Keras LSTM step
    # of benchmarks/rnn_train_step.py spanned 8,099.2 or 8,104.2 us (2026-12-06). Then the span
    # repeated, but the backward loop's copies to the host (the popped int32 list elements that
    # TensorListReserve and TensorListSetItem read in host memory) landed between different
    # kernels: 15 to 19 of its 1,875 launches started elsewhere in 3 of 3 processes (read-back
    # gates, launch_order.h).
    runs = []
    for _ in range(3):
        proc = run_child(RNN_CHILD, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        line = [l for l in proc.stdout.splitlines() if l.startswith("RNN")][-1]
        runs.append(json.loads(line[3:]))
    assert len(runs[0]["ops"]) > 50
    for k, run in enumerate(runs[1:], start=2):
        moved = [i for i, (a, b) in enumerate(zip(runs[0]["ops"], run["ops"])) if a != b]
        assert run == runs[0], (f"process {k}: span {run['span']} vs {runs[0]['span']}, "
                                f"{len(moved)} launches moved, first #{moved[:1]}")
