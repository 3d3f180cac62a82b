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
the device behind a copy gate) spans the same cycles in every process; a graph with control flow
on two NPUs is left unordered and named in the fusion log.
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


# A tf.function on the NPU with or without a lowered cond (its exp on a second NPU with
# two_npus); NPUSIM_FUSION_LOG names a graph the launch order leaves as the executor issues it.
COND_CHILD = r'''
import npusim
import tensorflow as tf

@tf.function
def step(x, p):
    with tf.device("/NPU:0"):
        y = x * 2.0
        if {with_cond}:
            y = tf.cond(p, lambda: y + 1.0, lambda: y - 1.0)
    with tf.device("/NPU:1" if {two_npus} else "/NPU:0"):
        return tf.exp(y) * 3.0

with tf.device("/NPU:0"):
    x = tf.ones([4, 4])
print("VALUE", float(step(x, tf.constant(True))[0, 0]))
'''


@pytest.mark.parametrize("with_cond,two_npus", [(True, False), (False, False), (True, True)])
def test_a_graph_left_unordered_is_named_in_the_fusion_log(with_cond, two_npus):
    # A graph with control flow on one NPU is ordered within its frames and liveness classes
    # (launch_order.h, "Control flow"); one with control flow on two NPUs is left unordered.
    extra_env = {"NPUSIM_FUSION_LOG": "1", **({"NPUSIM_SYSTEM": "tiny-x8"} if two_npus else {})}
    proc = run_child(COND_CHILD.format(with_cond=with_cond, two_npus=two_npus), timeout=300,
                     extra_env=extra_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    skipped = [l for l in proc.stderr.splitlines() if "launch order not applied" in l]
    ordered = [l for l in proc.stderr.splitlines() if "npusim: launch order in" in l]
    assert "VALUE" in proc.stdout
    if with_cond and two_npus:
        assert skipped and "control flow on several NPUs" in skipped[0], proc.stderr[-2000:]
    else:
        assert not skipped and (ordered or not with_cond), proc.stderr[-2000:]


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
print("RNN" + json.dumps({"span": span, "ops": [r["op_name"] for r in recs]}))
'''


def test_a_recurrent_training_step_spans_the_same_cycles_in_every_process():
    # Was: the graph with control flow got no launch order, its launches' order moved from run to
    # run; then, with it, the copy of the embedding's int32 arithmetic onto the device landed
    # before or after the step's first kernel (copy gates, launch_order.h): the Keras LSTM step
    # of benchmarks/rnn_train_step.py spanned 8,099.2 or 8,104.2 us (2026-12-06).
    runs = []
    for _ in range(3):
        proc = run_child(RNN_CHILD, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        line = [l for l in proc.stdout.splitlines() if l.startswith("RNN")][-1]
        runs.append(json.loads(line[3:]))
    assert len(runs[0]["ops"]) > 50
    assert all(r == runs[0] for r in runs[1:]), [r["span"] for r in runs]
