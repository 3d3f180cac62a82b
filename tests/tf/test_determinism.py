"""The same script gives the same report (docs/tf_plugin.md, "Device memory"): a Keras fit run
twice, each time in a fresh process, writes op_summary.csv files whose every task has the same
cycles and counters, and identical op_statistic.csv files.

Tasks are matched by TF node name, kernel and occurrence, not by position: TensorFlow's executor
may issue ops that do not depend on each other in another order from run to run, which moves
their Task IDs and start times but nothing a task measures. The total (the last task's end) is
compared too (from the first task's start), and the number of tasks.

The second test overflows the L2 (a 128 KiB, 2-way L2 on the tiny chip): a launch's conflict
misses then depend on where its tensors lie relative to each other, and the allocator's
placement follows TensorFlow's allocation order, which changes from run to run. Here the second
process places the tensors elsewhere for certain: it keeps three tensors on the NPU before
training. The L2 model files a launch's lines by allocation (sim/chip/l2_placement.h), so the
report does not change.

The third test runs a training step node by node in which several MatMuls read one activation:
each step's launch list (kernel by TF node) is the same at every step and in two processes. The
casts of an activation's f16 copy used to be kept or not depending on the addresses TensorFlow's
allocation order gave it and on which executor thread reached the derived-tensor cache first.
"""

import csv
import collections
import json
import os
import sys

import pytest

pytest.importorskip("tensorflow")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import run_child  # noqa: E402  pylint: disable=wrong-import-position

CHILD = r'''
import numpy as np
import npusim
import tensorflow as tf
tf.keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.standard_normal((96, 200)).astype(np.float32)
y = rng.integers(0, 10, 96).astype(np.int32)
model = tf.keras.Sequential([tf.keras.Input((200,)), tf.keras.layers.Dense(72, "relu"),
                             tf.keras.layers.Dropout(0.2), tf.keras.layers.Dense(10, "softmax")])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
with npusim.profile({report!r}):
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
print("WEIGHTS", float(sum(np.abs(w).sum() for w in model.get_weights())))
'''

# Columns that place a task on the timeline (they follow the executor's issue order).
POSITION_COLUMNS = {"Task ID", "Task Start Time(us)", "Task Wait Time(us)", "task_start_cycles",
                    "task_wait_cycles"}


# A residual CNN (two branches the executor may run in either order) trained for 4 steps.
CHILD_RESIDUAL = r'''
import numpy as np
import npusim
import tensorflow as tf
tf.keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 16, 16, 8)).astype(np.float32)
y = rng.integers(0, 10, 64).astype(np.int32)
L = tf.keras.layers
inp = tf.keras.Input((16, 16, 8))
h = L.ReLU()(L.BatchNormalization()(L.Conv2D(32, 3, padding="same")(inp)))
a = L.BatchNormalization()(L.Conv2D(32, 3, padding="same")(h))
b = L.Conv2D(32, 1)(h)
h = L.GlobalAveragePooling2D()(L.ReLU()(L.Add()([a, b])))
model = tf.keras.Model(inp, L.Dense(10, "softmax")(h))
{pad}
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
with npusim.profile({report!r}):
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
print("WEIGHTS", float(sum(np.abs(w).sum() for w in model.get_weights())))
'''
# Tensors kept on the NPU before training: every later tensor lands elsewhere.
PAD = "with tf.device('/NPU:0'): pad = [tf.ones([n]) for n in (300, 3000, 30000)]"
# An L2 the residual CNN's launches overflow (the tiny chip's is 8 MiB, 16-way).
SMALL_L2 = {"NPUSIM_CHIP_OVERRIDES": "memory.l2.bytes=128 KiB;memory.l2.ways=2"}


def fit_report(directory, child=CHILD, extra_env=None, pad=""):
    proc = run_child(child.format(report=str(directory), pad=pad), timeout=600,
                     extra_env=extra_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    weights = [l for l in proc.stdout.splitlines() if l.startswith("WEIGHTS")]
    with open(directory / "op_summary.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    with open(directory / "op_statistic.csv", encoding="utf-8") as f:
        statistic = f.read()
    return weights, rows, statistic


def by_task_identity(rows):
    tasks = collections.defaultdict(list)
    for row in rows:
        tasks[(row["Op Name"], row["kernel"])].append(
            {k: v for k, v in row.items() if k not in POSITION_COLUMNS})
    return tasks


def timeline_length(rows):
    """From the first task's start to the last one's end: the device's cycles before the profile
    (a process that did more before it) are not part of the report."""
    return (max(int(r["task_start_cycles"]) + int(r["task_duration_cycles"]) for r in rows) -
            min(int(r["task_start_cycles"]) for r in rows))


def assert_same_report(tmp_path, child=CHILD, extra_env=None, pad_b=""):
    weights_a, rows_a, statistic_a = fit_report(tmp_path / "a", child, extra_env)
    weights_b, rows_b, statistic_b = fit_report(tmp_path / "b", child, extra_env, pad_b)
    assert weights_a == weights_b and weights_a  # the same training, bit for bit
    assert len(rows_a) == len(rows_b) > 100
    tasks_a, tasks_b = by_task_identity(rows_a), by_task_identity(rows_b)
    assert tasks_a.keys() == tasks_b.keys()
    differing = [(key, i, {c: (ra[c], rb[c]) for c in ra if ra[c] != rb[c]})
                 for key in tasks_a
                 for i, (ra, rb) in enumerate(zip(tasks_a[key], tasks_b[key])) if ra != rb]
    assert [len(tasks_a[k]) for k in tasks_a] == [len(tasks_b[k]) for k in tasks_a]
    assert not differing, f"{len(differing)} tasks differ, e.g. {differing[:3]}"
    assert statistic_a == statistic_b
    assert timeline_length(rows_a) == timeline_length(rows_b)


def test_keras_fit_twice_gives_the_same_report(tmp_path):
    assert_same_report(tmp_path)


def test_keras_fit_overflowing_the_l2_gives_the_same_report_wherever_its_tensors_lie(tmp_path):
    assert_same_report(tmp_path, CHILD_RESIDUAL, SMALL_L2, pad_b=PAD)


# The L2 kept from launch to launch within each graph run (memory.l2.keep_within_graph_run) on
# the same overflowed, write-back L2: a run's lines are filed by block with one placement for
# the whole run (sim/chip/l2_placement.h), in the order the run first touches its blocks, so the
# report does not depend on where the allocator put the tensors either. Kept at device
# addresses (keep_across_launches) the same pair of processes gives differing reports
# (docs/chip_model.md, "L2 state between launches").
KEPT_IN_RUN = {"NPUSIM_CHIP_OVERRIDES": "memory.l2.bytes=128 KiB;memory.l2.ways=2;"
                                        "memory.l2.write_back=true;"
                                        "memory.l2.keep_within_graph_run=true"}


def test_l2_kept_within_graph_runs_gives_the_same_report_wherever_its_tensors_lie(tmp_path):
    assert_same_report(tmp_path, CHILD_RESIDUAL, KEPT_IN_RUN, pad_b=PAD)
    # The key took effect: the run's launches hit on lines earlier launches of the run left
    # (a cold L2 at every launch gives other counters).
    with open(tmp_path / "a" / "op_summary.csv", newline="", encoding="utf-8") as f:
        kept = list(csv.DictReader(f))
    _, cold, _ = fit_report(tmp_path / "c", CHILD_RESIDUAL,
                            {"NPUSIM_CHIP_OVERRIDES": "memory.l2.bytes=128 KiB;memory.l2.ways=2;"
                                                      "memory.l2.write_back=true"})
    assert by_task_identity(kept) != by_task_identity(cold)


# A step run node by node (graph_mode=False) where six MatMuls read one activation `h` (each
# casts it to fp16) and the weights change every step; prints every step's launches.
CHILD_SHARED_ACTIVATION = r'''
import json
import numpy as np
import npusim
npusim.configure(graph_mode=False)
import tensorflow as tf
rng = np.random.default_rng(0)
x = tf.constant(rng.standard_normal((32, 64)).astype(np.float32))
w0 = tf.Variable(rng.standard_normal((64, 64)).astype(np.float32) * 0.1)
ws = [tf.Variable(rng.standard_normal((64, 32)).astype(np.float32) * 0.1) for _ in range(6)]
opt = tf.keras.optimizers.SGD(0.01)

@tf.function
def step(x):
    with tf.GradientTape() as tape:
        h = tf.nn.relu(tf.matmul(x * 2.0, w0))
        loss = tf.add_n([tf.reduce_sum(tf.matmul(h, w) ** 2) for w in ws])
    variables = [w0] + ws
    opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss

steps = []
for _ in range(7):
    npusim.clear_launch_records()
    step(x).numpy()
    steps.append(sorted([r["op_name"], r["kernel"], r["cycles"]] for r in npusim.launch_records()))
print("STEPS" + json.dumps(steps))
'''


def test_node_by_node_step_launches_the_same_kernels_every_step_and_every_run():
    runs = []
    for _ in range(2):
        proc = run_child(CHILD_SHARED_ACTIVATION, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs.append(json.loads([l for l in proc.stdout.splitlines()
                                if l.startswith("STEPS")][-1][len("STEPS"):]))
    for steps in runs:
        # The first step's launches may differ (its first-run work, e.g. the weights' first
        # casts); every later step is the same step.
        counts = [len(s) for s in steps]
        assert all(s == steps[1] for s in steps[2:]), f"launches per step {counts}"
        # The six MatMuls reading `h` (MatMul_1 .. MatMul_6) each cast it and their weight, which
        # the step before changed: nothing derived from an activation is kept.
        casts = collections.Counter(op for op, kernel, _ in steps[1]
                                    if kernel.startswith("Cast_f32_f16"))
        assert [casts[f"MatMul_{k}"] for k in range(1, 7)] == [2] * 6, casts
    assert runs[0] == runs[1], f"{[len(s) for s in runs[0]]} vs {[len(s) for s in runs[1]]}"
