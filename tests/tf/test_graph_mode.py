"""Whole-graph execution of tf.function graphs (adapter/tf/plugin/npu_graph.h): connected sets
of NPU nodes become NpuGraph nodes, each run as one task list per step.

- the MLP and the CNN of models/ trained three steps with Adam give the same losses and weights
  as node-by-node execution (NPUSIM_GRAPH=0, a child process each), with the same launches under
  the same node names, op types and per-node dispatches (what reports group by) but for the
  fp16 casts of tensors several cube ops read, which a graph computes once, in fewer task
  lists (TF kernel invocations that launch: launch records' graph_run, else dispatch), each
  paying the host dispatch once; at least one graph runs several nodes; the static memory
  plan's peak is at most the sum of its buffers, its arenas are allocated once and kept, and
  they hold less than TensorFlow's allocator peak of the same step node by node; summary.txt
  shows the allocator's peak and the plans' arenas; the CNN with its graphs' launches as
  streams (NPUSIM_GRAPH_CONCURRENT=1) too, its losses and weights bit for bit those of the graphs
  in order and its plan no larger than theirs;
  the optimizer's variable updates (FusedVariableUpdate) run inside the graphs' task lists,
  none as a task list of its own (node by node each is one);
- the MLP trained with Keras' accuracy metric: its argmax's sign-bit test (Bitcast to int32,
  BitwiseAnd) and the metrics' `total / count` DivNoNans (reads after the metric updates) run
  inside the step's one NpuGraph run, the step's one task list, the losses, accuracies, weights
  and metric variables bit for bit those of node by node; same-size Bitcasts are views inside a
  graph, a Bitcast that changes the element size stays outside;
- reads after an update: variables read after their updates read the update steps' new values
  in the same NpuGraph run (numpy's values and node by node's bits over three steps), a read
  before an update its old value, and a read that also waits for a CPU node reading the run's
  result stays after the run;
- the CNN's training step: one task list a step (grappler's constant-folded ShapeN Consts,
  ordered after the forward's MaxPool, no longer split it), losses and weights bit for bit
  those of node by node; a Const ordered after a member (a control input) and read by a later
  node, as a host input or as a data input, does not keep that node out of the set;
- arenas: kept across runs, freed when the input shapes change, one per concurrent run;
- variable updates inside graphs: a kernel fault in a graph that updates variables (the
  watchdog at one instruction faults its first launch; the updates were queued after it) is
  the op's error naming the node and the chip, and leaves every variable as it was; two tf.functions
  updating the same two variables in opposite orders, run from two threads at once, neither
  deadlock nor lose an update (the sums are exact);
- npusim.configure(graph_mode=False) gives no graph runs and a host dispatch per node;
- a kernel that faults inside a graph (the watchdog set to one instruction) is the op's error,
  naming the node that faulted;
- a graph with a CPU fallback in the middle still runs and computes numpy's results: the nodes
  before and after the CPU node are not one graph; an intermediate fetched from the function is
  an output of its graph;
- a gradient ordered by control edges (SquaredDifference's: its Sub and its 2.0 after the
  incoming gradient) joins the step's one set (the edges are tried again while sets merge, the
  Const's control input dropped): one task list, the CPU's values;
- a fused node the same optimizer call made (a Conv2DBiasAdd, whose default attributes are not
  yet in its NodeDef) at a set's edge: the set is made in that first call (the plugin before
  left it to the next call, where it was clustered apart from the sets of the first: ConvNeXt's
  and EfficientNet's training steps ran as several task lists), one task list, the CPU's values.
"""

import json

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from conftest import run_child  # noqa: E402  pylint: disable=wrong-import-position

# Trains `name` three steps (Adam); per step the launch records' figures.
TRAIN = r"""
import json
import os
import numpy as np
import npusim
import tensorflow as tf
import keras
import models

name, report_dir = %r, %r
keras.utils.set_random_seed(0)
x, y = models.synthetic_data(name, batch=8, seed=1)
model = models.build(name, seed=3)
model.compile(optimizer="adam", loss=models.loss(name))
out = {"losses": [], "steps": []}
for step in range(3):
    npusim.clear_launch_records()
    # The allocator's peak during the step, above what was in use before it.
    tf.config.experimental.reset_memory_stats("NPU:0")
    before = tf.config.experimental.get_memory_info("NPU:0")["current"]
    if step == 2:
        with npusim.profile(report_dir, plots=False):
            out["losses"].append(float(model.train_on_batch(x, y)))
        with open(os.path.join(report_dir, "summary.txt")) as f:
            out["summary"] = f.read()
    else:
        out["losses"].append(float(model.train_on_batch(x, y)))
    out["step_peak_above_start"] = tf.config.experimental.get_memory_info("NPU:0")["peak"] - before
    recs = npusim.launch_records()
    # A task list: the launches of one graph run, or of one op dispatched on its own.
    task_lists = {}
    for r in recs:
        key = ("graph", r["graph_run"]) if r["graph_run"] else ("op", r["dispatch"])
        task_lists.setdefault(key, set()).add(r["op_name"])
    out["steps"].append({
        "launches": sorted([r["op_name"], r["op_type"], r["kernel"]] for r in recs),
        "dispatches": len({r["dispatch"] for r in recs}),
        "task_lists": len(task_lists),
        "largest_task_list": max(len(v) for v in task_lists.values()),
        "host_dispatches": sum(r["host_dispatch_cycles"] > 0 for r in recs),
        "host_dispatch_cycles": sum(r["host_dispatch_cycles"] for r in recs),
        "update_launches": sum(r["op_type"] == "FusedVariableUpdate" for r in recs),
        "update_launches_alone": sum(r["op_type"] == "FusedVariableUpdate" and not r["graph_run"]
                                     for r in recs),
        "end_cycle": max(r["start_cycle"] + r["cycles"] for r in recs),
        "start_cycle": min(r["start_cycle"] - r["host_dispatch_cycles"] for r in recs),
    })
out["weights"] = [w.numpy().tolist() for w in model.weights]
out["graph_plans"] = npusim.device_info().get("graph_plans")
print("NPUSIM_RESULT " + json.dumps(out))
"""


def _result(proc):
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.split("NPUSIM_RESULT ", 1)[1])


@pytest.mark.parametrize("name,concurrent", [("mlp", False), ("cnn", False), ("cnn", True)])
def test_training_tracks_node_by_node_in_fewer_dispatches(name, concurrent, tmp_path):
    # concurrent: the graphs' launches as streams (NPUSIM_GRAPH_CONCURRENT=1), whose memory
    # plan keeps the in-order plan's peak (its reuse becomes dependences between the streams).
    graph = _result(run_child(TRAIN % (name, str(tmp_path / "graph")), timeout=600,
                              extra_env={"NPUSIM_GRAPH_CONCURRENT": "1"} if concurrent else None))
    nodes = _result(run_child(TRAIN % (name, str(tmp_path / "nodes")), timeout=600,
                              extra_env={"NPUSIM_GRAPH": "0"}))
    if concurrent:
        in_order = _result(run_child(TRAIN % (name, str(tmp_path / "in_order")), timeout=600))
        # The same losses and weights bit for bit as the graphs run in order, in a plan no
        # larger than theirs.
        assert graph["losses"] == in_order["losses"]
        assert graph["weights"] == in_order["weights"]
        assert (0 < graph["graph_plans"]["max_arena_bytes"]
                <= in_order["graph_plans"]["max_arena_bytes"]), (graph, in_order)
    # The same kernels on the same inputs: the same numbers.
    np.testing.assert_allclose(graph["losses"], nodes["losses"], rtol=1e-6)
    for g, n in zip(graph["weights"], nodes["weights"]):
        np.testing.assert_allclose(np.array(g), np.array(n), rtol=1e-6, atol=1e-7)
    last_g, last_n = graph["steps"][-1], nodes["steps"][-1]
    # The same launches under the same node names and op types (op runs as before in reports),
    # but for the casts a graph shares: whole graphs keep every fusion of node-by-node
    # execution, the optimizer-update and duplicate-node rewrites (graph_fusion.h 5 and 6)
    # included. (Equal constants are duplicates too: node by node TensorFlow's own CSE after
    # grappler merged Adam's `1.0`s and the `iterations + 1` reading them, which inside an
    # NpuGraph it cannot.) Inside a graph a tensor two cube ops read (a MatMul's input in the
    # forward and in the weight gradient, the gradient both MatMuls of a layer's backward read,
    # a convolution's) is cast to fp16 once: node by node each op casts it.
    from collections import Counter  # pylint: disable=import-outside-toplevel

    graph_launches = Counter(map(tuple, last_g["launches"]))
    node_launches = Counter(map(tuple, last_n["launches"]))
    assert not graph_launches - node_launches, graph_launches - node_launches
    shared = node_launches - graph_launches
    assert shared, "no cast shared"
    assert all(kernel == "Cast_f32_f16" for _, _, kernel in shared), shared
    # Node by node every op is its own task list and pays its host dispatch; whole graphs run
    # fewer task lists, some covering several nodes, and pay once per task list.
    assert last_n["largest_task_list"] == 1
    assert last_n["task_lists"] == last_n["host_dispatches"] == last_n["dispatches"]
    assert last_g["largest_task_list"] >= 2
    assert last_g["task_lists"] < last_n["task_lists"]
    assert last_g["host_dispatches"] == last_g["task_lists"]
    assert last_g["host_dispatch_cycles"] < last_n["host_dispatch_cycles"]
    # The optimizer's updates: node by node each is a task list of its own; whole graphs run
    # them inside their task lists, none alone (one task list per NpuGraph, none per update).
    assert last_n["update_launches"] == last_n["update_launches_alone"] > 0, last_n
    assert last_g["update_launches"] == last_n["update_launches"], last_g
    assert last_g["update_launches_alone"] == 0, last_g
    plans = graph["graph_plans"]
    assert plans["plans"] >= 1, plans
    assert 0 < plans["max_arena_bytes"] <= plans["max_unplanned_bytes"], plans
    assert nodes["graph_plans"]["plans"] == 0
    # The arenas are kept across steps: one device allocation per graph and input signature.
    assert plans["arena_allocations"] == plans["arenas_held"] <= plans["plans"], plans
    # The static plans' device memory for the step (every graph's arena) is below what
    # TensorFlow's allocator needed for the same step's tensors node by node (its peak above
    # the bytes in use before the step: intermediates, gradients, workspaces).
    assert 0 < plans["arena_bytes_held"] < nodes["step_peak_above_start"], (plans, nodes)
    # summary.txt shows both: the window's allocator peak and the plans' arenas.
    memory = graph["summary"].split("Device memory:", 1)[1]
    assert "TensorFlow's allocator (the runtime's): peak" in memory, memory
    assert f"{plans['plans']} plans, {plans['arenas_held']} arenas held now" in memory, memory
    assert "whole-graph static memory plans: none" in nodes["summary"], nodes["summary"]



# The CNN of models/ trained three steps (Adam): per step the task lists (graph runs, and ops
# dispatched on their own) and the launches outside any graph run; the losses and weights bits.
CNN_STEP = r"""
import json
import npusim
import keras
import models

keras.utils.set_random_seed(0)
x, y = models.synthetic_data("cnn", batch=8, seed=1)
model = models.build("cnn", seed=3)
model.compile(optimizer="adam", loss=models.loss("cnn"))
"""

# Three training steps of the compiled `model` on (x, y), each step's losses, task lists (NpuGraph
# runs and kernel calls of their own), op types launched outside a run and the runs holding the
# convolution backprops; then the weights.
TRAIN_3_STEPS_RECORDED = r"""
out = {"losses": [], "task_lists": [], "alone": [], "backprops_in_runs": []}
for step in range(3):
    npusim.clear_launch_records()
    out["losses"].append(float(model.train_on_batch(x, y)))
    recs = npusim.launch_records()
    out["task_lists"].append(len({("graph", r["graph_run"]) if r["graph_run"] else
                                  ("op", r["dispatch"]) for r in recs}))
    out["alone"].append(sorted(r["op_type"] for r in recs if not r["graph_run"]))
    out["backprops_in_runs"].append(sorted({r["graph_run"] for r in recs
                                            if r["op_type"].startswith("Conv2DBackprop")}))
out["weights"] = [w.numpy().tobytes().hex() for w in model.weights]
print("NPUSIM_RESULT " + json.dumps(out))
"""
CNN_STEP += TRAIN_3_STEPS_RECORDED


def test_cnn_training_step_is_one_task_list():
    graph = _result(run_child(CNN_STEP, timeout=600))
    nodes = _result(run_child(CNN_STEP, timeout=600, extra_env={"NPUSIM_GRAPH": "0"}))
    # The same losses and weights, bit for bit, as node by node.
    assert graph["losses"] == nodes["losses"], (graph["losses"], nodes["losses"])
    assert graph["weights"] == nodes["weights"]
    # Grappler's constant-folded ShapeN Consts (the convolution backprops' sizes, host inputs
    # copied into the set) keep a control input from the forward's MaxPool; that path through
    # them no longer splits the step: the forward, the backprops and the updates are one
    # NpuGraph run, the step's one task list (the plugin before ran two) from the second step
    # on (the first also initializes the optimizer's variables).
    assert nodes["task_lists"][-1] > 1, nodes["task_lists"]
    assert graph["task_lists"][1:] == [1, 1], graph["task_lists"]
    assert graph["alone"][1:] == [[], []], graph["alone"]
    assert all(len(runs) == 1 and runs[0] for runs in graph["backprops_in_runs"]), graph


# A residual block as ResNet-50's (convolutions with BatchNormalization, the shortcut's add and
# ReLU, no MaxPool) trained with Adam under the mixed precision mode of the ResNet-50 figures.
RESIDUAL_STEP = r"""
import json
import numpy as np
import npusim
import keras

keras.utils.set_random_seed(0)
rng = np.random.default_rng(1)
x = rng.standard_normal((8, 12, 12, 3)).astype(np.float32)
y = rng.integers(0, 4, size=(8,)).astype(np.int32)
inputs = keras.Input((12, 12, 3))
h = keras.layers.Conv2D(8, 3, padding="same")(inputs)
h = keras.layers.ReLU()(keras.layers.BatchNormalization()(h))
r = keras.layers.Conv2D(8, 3, padding="same")(h)
r = keras.layers.BatchNormalization()(r)
h = keras.layers.ReLU()(keras.layers.Add()([h, r]))
h = keras.layers.GlobalAveragePooling2D()(h)
model = keras.Model(inputs, keras.layers.Dense(4)(h))
model.compile(optimizer="adam",
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
"""
RESIDUAL_STEP += TRAIN_3_STEPS_RECORDED


def test_residual_training_step_is_one_task_list():
    env = {"NPUSIM_PRECISION_MODE": "allow_mix_precision"}
    graph = _result(run_child(RESIDUAL_STEP, timeout=600, extra_env=env))
    nodes = _result(run_child(RESIDUAL_STEP, timeout=600, extra_env={**env, "NPUSIM_GRAPH": "0"}))
    assert graph["losses"] == nodes["losses"], (graph["losses"], nodes["losses"])
    assert graph["weights"] == nodes["weights"]
    # The backprops' constant-folded ShapeN Consts keep control inputs from the forward's batch
    # norms and ReLUs (ResNet-50's structure, no MaxPool); read as host inputs only they keep no
    # path between the forward and the backward, so from the second step on the step is one
    # task list, the int64 iteration counter's add inside it (the plugin before the Consts were
    # copied into the sets ran two).
    assert nodes["task_lists"][-1] > 1, nodes["task_lists"]
    assert graph["task_lists"][1:] == [1, 1], graph["task_lists"]
    assert graph["alone"][1:] == [[], []], graph["alone"]
    assert all(len(runs) == 1 and runs[0] for runs in graph["backprops_in_runs"][1:]), graph


# The MLP trained with Keras' accuracy metric: its argmax tests each probability's sign bit
# (Bitcast to int32, BitwiseAnd with INT32_MIN, Less than 0) to order -0.0 below +0.0.
ACCURACY = r"""
import json
import numpy as np
import npusim
import tensorflow as tf
import keras
import models

keras.utils.set_random_seed(0)
x, y = models.synthetic_data("mlp", batch=8, seed=1)
model = models.build("mlp", seed=3)
model.compile(optimizer="adam", loss=models.loss("mlp"), metrics=["accuracy"])
out = {"results": [], "graph_runs": [], "bitwise": [], "div_no_nan": [], "alone": []}
for step in range(3):
    npusim.clear_launch_records()
    out["results"].append([float(v) for v in model.train_on_batch(x, y)])
    recs = npusim.launch_records()
    out["graph_runs"].append(len({r["graph_run"] for r in recs if r["graph_run"]}))
    out["bitwise"].append(sorted({bool(r["graph_run"]) for r in recs
                                  if r["op_type"] == "BitwiseAnd"}))
    out["div_no_nan"].append(sorted(bool(r["graph_run"]) for r in recs
                                    if r["op_type"] == "DivNoNan"))
    out["alone"].append(sorted(r["op_type"] for r in recs if not r["graph_run"]))
out["weights"] = [w.numpy().tobytes().hex() for w in model.weights]
out["metric_variables"] = [v.numpy().tobytes().hex() for v in model.metrics_variables]
out["fallbacks"] = npusim.cpu_fallback_ops()
print("NPUSIM_RESULT " + json.dumps(out))
"""


def test_mlp_with_accuracy_metric_is_one_graph_run_per_step():
    graph = _result(run_child(ACCURACY, timeout=600))
    nodes = _result(run_child(ACCURACY, timeout=600, extra_env={"NPUSIM_GRAPH": "0"}))
    # The same losses, accuracies and weights, bit for bit, as node by node.
    assert graph["results"] == nodes["results"], (graph["results"], nodes["results"])
    assert graph["weights"] == nodes["weights"]
    assert graph["metric_variables"] == nodes["metric_variables"]
    assert "BitwiseAnd" not in graph["fallbacks"], graph["fallbacks"]
    # Node by node the BitwiseAnd runs on the chip as a kernel call of its own; whole graph it
    # and the Bitcast before it are inside the step's one NpuGraph run, which no longer splits
    # at them. So are the metrics' `total / count` DivNoNans: they read the metric variables
    # after the metric updates (FusedVariableUpdates of the set), the update steps' new values.
    assert all(b == [False] for b in nodes["bitwise"]), nodes["bitwise"]
    assert all(b == [True] for b in graph["bitwise"]), graph["bitwise"]
    assert all(d == [False, False] for d in nodes["div_no_nan"]), nodes["div_no_nan"]
    assert all(d == [True, True] for d in graph["div_no_nan"]), graph["div_no_nan"]
    assert all(n == 1 for n in graph["graph_runs"]), graph["graph_runs"]
    # One task list a step: nothing launches outside the NpuGraph run after the first step.
    assert graph["alone"][1:] == [[], []], graph["alone"]


# Reads after an update inside one task list: `total` and `count` updated (FusedVariableUpdates),
# then read (a metric's `total / count`); a read of `total` before its update; a read after the
# update that also waits for a CPU node reading the set's result (it must stay after the
# NpuGraph node); `count` read after its update and returned (a read read outside the set).
READ_AFTER_UPDATE = r"""
import json
import numpy as np
import npusim
import tensorflow as tf

with tf.device("/NPU:0"):
    total = tf.Variable(np.linspace(-1.0, 1.0, 12).astype(np.float32).reshape(3, 4))
    count = tf.Variable(np.full((3, 4), 2.0, np.float32))
with tf.device("/CPU:0"):
    seen = tf.Variable(0.0)

@tf.function
def step(x):
    before = tf.multiply(total.read_value(), 2.0, name="before")
    total.assign_add(tf.multiply(x, 3.0, name="scaled"))
    count.assign_add(tf.abs(x, name="weight"))
    mean = tf.math.divide_no_nan(total.read_value(), count.read_value(), name="mean")
    with tf.device("/CPU:0"):
        noted = seen.assign(tf.reduce_sum(mean))
    with tf.control_dependencies([noted]):
        late = tf.add(total.read_value(), 1.0, name="late")
    return before, mean, late, count.read_value()

rng = np.random.default_rng(5)
out = {"steps": [], "div_no_nan_runs": [], "update_runs": [], "task_lists": []}
for i in range(3):
    x = tf.constant(rng.uniform(-2.0, 2.0, (3, 4)).astype(np.float32))
    npusim.clear_launch_records()
    got = step(x)
    recs = npusim.launch_records()
    out["steps"].append([x.numpy().tolist()] + [t.numpy().tobytes().hex() for t in got])
    out["div_no_nan_runs"].append([r["graph_run"] for r in recs if r["op_type"] == "DivNoNan"])
    out["update_runs"].append([r["graph_run"] for r in recs
                               if r["op_type"] == "FusedVariableUpdate"])
    out["task_lists"].append(len({("graph", r["graph_run"]) if r["graph_run"] else
                                  ("op", r["dispatch"]) for r in recs}))
out["seen"] = float(seen.numpy())
print("NPUSIM_RESULT " + json.dumps(out))
"""


def test_reads_after_an_update_are_inside_its_task_list():
    graph = _result(run_child(READ_AFTER_UPDATE, timeout=300))
    nodes = _result(run_child(READ_AFTER_UPDATE, timeout=300, extra_env={"NPUSIM_GRAPH": "0"}))
    # Bit for bit node by node's, every step.
    assert graph["steps"] == nodes["steps"]
    assert graph["seen"] == nodes["seen"]
    # And numpy's: the read before sees the old value, the reads after the new ones.
    total = np.linspace(-1.0, 1.0, 12).astype(np.float32).reshape(3, 4)
    count = np.full((3, 4), 2.0, np.float32)
    for x, *outs in graph["steps"]:
        x = np.array(x, np.float32)
        before, mean, late, count_read = (np.frombuffer(bytes.fromhex(h), np.float32).reshape(3, 4)
                                          for h in outs)
        np.testing.assert_array_equal(before, total * np.float32(2.0))
        total = total + x * np.float32(3.0)
        count = count + np.abs(x)
        np.testing.assert_allclose(mean, total / count, rtol=1e-6)
        np.testing.assert_array_equal(late, total + np.float32(1.0))
        np.testing.assert_array_equal(count_read, count)
    # The updates and the DivNoNan reading their new values are steps of one NpuGraph run.
    for div, upd in zip(graph["div_no_nan_runs"], graph["update_runs"]):
        assert len(div) == 1 and div[0] and len(set(upd)) == 1 and upd[0] == div[0], (div, upd)
    assert all(d == [0] for d in nodes["div_no_nan_runs"]), nodes["div_no_nan_runs"]
    # Per step: that run and `late`'s AddV2 (it waits for the CPU node, after the run).
    assert graph["task_lists"] == [2, 2, 2], graph["task_lists"]


# A child script's tail: runs tf.function(body) on x twice (the second measured) into `got`,
# the launches' op names per graph run into `groups`, and body on the CPU into `want`.
RUN_AND_GROUP = r"""
f = tf.function(body)
f(x)
npusim.clear_launch_records()
got = f(x)
recs = npusim.launch_records()
groups = {}
for r in recs:
    if r["graph_run"]:
        groups.setdefault(r["graph_run"], set()).add(r["op_name"])
with tf.device("/CPU:0"):
    want = tf.function(body)(x)
"""

BITCAST = r"""
import json
import numpy as np
import npusim
import tensorflow as tf

def body(x):
    y = tf.multiply(x, 3.0, name="scaled")
    bits = tf.bitcast(y, tf.int32, name="as_bits")
    magnitude = tf.bitcast(tf.bitwise.bitwise_and(bits, 0x7fffffff, name="clear_sign"),
                           tf.float32, name="as_float")
    halves = tf.bitcast(tf.add(y, 1.0, name="shifted"), tf.float16, name="as_halves")
    return tf.add(magnitude, 1.0, name="after"), tf.multiply(halves, 2.0, name="halves_2")

x = tf.constant(np.array([[-0.0, 0.5, -1.5, 2.0], [3.0, -4.0, 0.0, -2.5]], np.float32))
""" + RUN_AND_GROUP + r"""
(a, h), (want_a, want_h) = got, want
print("NPUSIM_RESULT " + json.dumps({
    "a": a.numpy().tobytes().hex(), "want_a": want_a.numpy().tobytes().hex(),
    "h": h.numpy().tobytes().hex(), "want_h": want_h.numpy().tobytes().hex(),
    "groups": sorted(sorted(g) for g in groups.values())}))
"""


def test_same_size_bitcasts_are_views_inside_a_graph():
    # f32 -> int32 -> f32 around a BitwiseAnd: views, so the chain is one graph run; the
    # f32 -> f16 Bitcast (another element size) stays outside, splitting its graph.
    result = _result(run_child(BITCAST))
    assert result["a"] == result["want_a"]
    assert result["h"] == result["want_h"]
    groups = result["groups"]
    assert ["after", "clear_sign", "scaled", "shifted"] in groups, groups
    assert not any("halves_2" in g and "shifted" in g for g in groups), groups


# A Const ordered after a member of a set (a control input, as grappler's constant-folded ShapeN
# Consts keep), read by a later node as a host input (a reduction's axes) and, cast (folded into
# another such Const by grappler), as an ordinary data input.
CONST_AFTER_MEMBER = r"""
import json
import numpy as np
import npusim
import tensorflow as tf

def body(x):
    h = tf.nn.relu(tf.add(tf.multiply(x, 3.0, name="scaled"), 1.0, name="shifted"), name="h")
    with tf.control_dependencies([h]):
        axes = tf.constant([1], name="axes")
    rows = tf.reduce_sum(tf.multiply(h, 2.0, name="twice"), axis=axes, name="rows")
    return rows, tf.add(rows, tf.cast(axes, tf.float32, name="axes_f"), name="plus_axes")

x = tf.constant(np.linspace(-2.0, 2.0, 24, dtype=np.float32).reshape(4, 6))
""" + RUN_AND_GROUP + r"""
print("NPUSIM_RESULT " + json.dumps({
    "got": [t.numpy().tolist() for t in got], "want": [t.numpy().tolist() for t in want],
    "groups": sorted(sorted(g) for g in groups.values())}))
"""


def test_a_const_read_as_a_host_input_keeps_no_path_between_sets():
    # The Sum reads the Const only as its axes, which its set copies: the path h -> Const ->
    # Sum does not keep the Sum out of h's set (the plugin before ran it alone). The folded
    # cast of the Const is a data input of the last add: its control input from h only delayed
    # it (no control flow in the graph), so the clustering drops it and the add joins the set
    # too (before, that path kept the add out: merging would have made a cycle through the
    # Const running after the NpuGraph node).
    result = _result(run_child(CONST_AFTER_MEMBER))
    for got, want in zip(result["got"], result["want"]):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    groups = result["groups"]
    assert any("h" in g and "rows" in g and "plus_axes" in g for g in groups), groups


FUSED_AT_THE_EDGE = r"""
import glob
import json
import os
import tempfile
import numpy as np
dump = tempfile.mkdtemp()
os.environ["NPUSIM_GRAPH_DUMP"] = dump
import npusim
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

@tf.function
def f(x, w, b):
    # Conv2D -> BiasAdd -> Relu becomes one Conv2DBiasAdd (relu), returned: the set's output.
    y = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME"), b))
    return y, tf.reduce_sum(y * 2.0, axis=[1, 2])

rng = np.random.default_rng(0)
args = [rng.standard_normal(s).astype(np.float32) for s in ((2, 8, 8, 16), (3, 3, 16, 16), (16,))]
with tf.device("/NPU:0"):
    f(*args)
    npusim.clear_launch_records()
    got = [t.numpy() for t in f(*args)]
recs = npusim.launch_records()
with tf.device("/CPU:0"):
    want = [t.numpy() for t in f.python_function(*[tf.constant(a) for a in args])]
# The optimizer's first call on f's graph (the dumps' call numbers count per process).
first = min(glob.glob(os.path.join(dump, "*inference_f_*.after.pb")),
            key=lambda p: int(p.split(".")[-3]))
g = graph_pb2.GraphDef()
with open(first, "rb") as fh:
    g.ParseFromString(fh.read())
print("NPUSIM_RESULT " + json.dumps({
    "first_call_ops": sorted(n.op for n in g.node if "NPU" in n.device and n.op != "Const"),
    "task_lists": len({("graph", r["graph_run"]) if r["graph_run"] else ("op", r["dispatch"])
                       for r in recs}),
    "ops": sorted(r["op_type"] for r in recs),
    "got": [a.tolist() for a in got], "want": [a.tolist() for a in want]}))
"""


def test_a_fused_node_at_a_sets_edge_is_clustered_in_the_first_call():
    result = _result(run_child(FUSED_AT_THE_EDGE, timeout=300))
    assert "NpuGraph" in result["first_call_ops"], result["first_call_ops"]
    assert "Conv2DBiasAdd" not in result["first_call_ops"], result["first_call_ops"]
    assert result["task_lists"] == 1
    assert "Conv2DBiasAdd" in result["ops"]
    # The cube's fp16 operands (the default precision mode) against the CPU's float32.
    for got, want in zip(result["got"], result["want"]):
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3 * np.max(np.abs(want)))


SQUARED_DIFFERENCE_GRAD = r"""
import json
import numpy as np
import npusim
import tensorflow as tf

@tf.function
def step(x, y):
    with tf.GradientTape() as tape:
        tape.watch(x)
        # SquaredDifference's gradient: 2 * g * (a - y), its Sub and the 2 ordered after g by
        # control edges (TensorFlow's _SquaredDifferenceGrad).
        loss = tf.reduce_sum(tf.tanh(tf.math.squared_difference(x * 3.0, y)) * 0.5)
    return loss, tape.gradient(loss, x)

rng = np.random.default_rng(0)
x, y = (tf.constant(rng.standard_normal((8, 32)).astype(np.float32)) for _ in range(2))
with tf.device("/NPU:0"):
    step(x, y)
    npusim.clear_launch_records()
    got = [t.numpy() for t in step(x, y)]
recs = npusim.launch_records()
with tf.device("/CPU:0"):
    want = [t.numpy() for t in step.python_function(x, y)]
print("NPUSIM_RESULT " + json.dumps({
    "task_lists": len({("graph", r["graph_run"]) if r["graph_run"] else ("op", r["dispatch"])
                       for r in recs}),
    "got": [np.asarray(a).tolist() for a in got], "want": [np.asarray(a).tolist() for a in want]}))
"""


def test_a_gradient_ordered_by_control_edges_joins_the_set():
    # The Sub of SquaredDifference's gradient reads the forward's values by data edges and waits
    # for the gradient g by a control edge: when the forward's set first met it, g had not yet
    # joined that set (a path through an outside node), and the plugin did not try the edge
    # again, so the Sub and the product after it ran apart (2 task lists); the 2.0 Const, also
    # ordered after g, made a path of its own. Now one task list, the CPU's values.
    result = _result(run_child(SQUARED_DIFFERENCE_GRAD, timeout=300))
    assert result["task_lists"] == 1
    for got, want in zip(result["got"], result["want"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


CONFIGURE_OFF = r"""
import json
import numpy as np
import npusim
npusim.configure(graph_mode=False)
import tensorflow as tf

@tf.function
def f(x, w):
    return tf.nn.relu(tf.matmul(x, w)) * 2.0 + 1.0

x = tf.constant(np.ones((4, 8), np.float32))
w = tf.constant(np.ones((8, 16), np.float32))
f(x, w)
npusim.clear_launch_records()
f(x, w)
recs = npusim.launch_records()
print("NPUSIM_RESULT " + json.dumps({
    "names": len({r["op_name"] for r in recs}),
    "graph_runs": sorted({r["graph_run"] for r in recs}),
    "host_dispatches": sum(r["host_dispatch_cycles"] > 0 for r in recs)}))
"""


def test_configure_graph_mode_off_runs_node_by_node():
    result = _result(run_child(CONFIGURE_OFF))
    assert result["names"] >= 2, result  # MatMul, then Relu * 2 + 1 fused
    assert result["graph_runs"] == [0], result
    assert result["host_dispatches"] == result["names"], result


FAULT = r"""
import json, os
import numpy as np
import npusim
os.environ["NPUSIM_MAX_INSNS_PER_BLOCK"] = "1"
import tensorflow as tf

@tf.function
def f(x, w):
    return tf.nn.relu(tf.matmul(x, w, name="the_matmul")) * 2.0

x = tf.constant(np.ones((4, 8), np.float32))
w = tf.constant(np.ones((8, 16), np.float32))
out = {}
try:
    f(x, w).numpy()
except tf.errors.OpError as e:
    out["error"] = [type(e).__name__, e.message]
print("NPUSIM_RESULT " + json.dumps(out))
"""


def _fault_of_the_matmul(result):
    """The child's error: an InternalError of an NpuGraph naming the node 'the_matmul'."""
    assert "error" in result, result
    kind, message = result["error"]
    assert kind == "InternalError", result
    assert "NpuGraph" in message and "of node 'the_matmul' (MatMul)" in message, message
    return message


def test_a_fault_inside_a_graph_names_the_node():
    message = _fault_of_the_matmul(_result(run_child(FAULT)))
    assert "NPUSIM_MAX_INSNS_PER_BLOCK" in message, message


CPU_IN_THE_MIDDLE = r"""
import json
import numpy as np
import npusim
import tensorflow as tf

def body(x):
    a = tf.nn.relu(tf.add(tf.multiply(x, 3.0, name="pre_mul"), 1.0, name="pre_add"),
                   name="pre_relu")
    z = tf.math.zeta(tf.add(a, 2.0, name="pre_q"), tf.add(x, 1.0, name="pre_s"))  # CPU only
    b = tf.subtract(tf.sqrt(tf.multiply(z, 2.0, name="post_mul"), name="post_sqrt"), 0.5,
                    name="post_sub")
    return b, a

x = tf.constant(np.array([[0.5, 1.0, 2.0, 3.0]], np.float32))
""" + RUN_AND_GROUP + r"""
(b, a), (want_b, want_a) = got, want
print("NPUSIM_RESULT " + json.dumps({
    "b": b.numpy().tolist(), "a": a.numpy().tolist(),
    "want_b": want_b.numpy().tolist(), "want_a": want_a.numpy().tolist(),
    "groups": sorted(sorted(g) for g in groups.values()),
    "fallbacks": npusim.cpu_fallback_ops()}))
"""


def test_a_cpu_fallback_in_the_middle_splits_the_graph():
    result = _result(run_child(CPU_IN_THE_MIDDLE))
    np.testing.assert_allclose(result["a"], result["want_a"], rtol=1e-6)
    np.testing.assert_allclose(result["b"], result["want_b"], rtol=1e-5)
    assert "Zeta" in result["fallbacks"], result
    groups = result["groups"]
    # Some graph runs several nodes, and none holds nodes on both sides of the Zeta.
    assert max(len(g) for g in groups) >= 2, groups
    for g in groups:
        before = any(n.startswith("pre_") for n in g)
        after = any(n.startswith("post_") for n in g)
        assert not (before and after), groups


ARENAS = r"""
import json, threading
import numpy as np
import npusim
import tensorflow as tf

# One trace for every batch size: one NpuGraph kernel whose input shapes change.
@tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32),
                              tf.TensorSpec([8, 16], tf.float32)])
def f(x, w):
    # One NpuGraph: the MatMul's output is an intermediate, so the plan has an arena.
    return tf.nn.relu(tf.matmul(x, w)) * 2.0 + 1.0

def want(x, w):
    # The cube reads fp16 (precision mode allow_fp32_to_fp16) and accumulates in f32.
    h = lambda a: a.astype(np.float16).astype(np.float32)
    return np.maximum(h(x) @ h(w), 0) * 2.0 + 1.0

rng = np.random.default_rng(0)
w = rng.standard_normal((8, 16)).astype(np.float32)
out = {"errors": []}
def check(x):
    got = f(tf.constant(x), tf.constant(w)).numpy()
    if not np.allclose(got, want(x, w), rtol=1e-5, atol=1e-5):
        out["errors"].append(float(np.abs(got - want(x, w)).max()))

for _ in range(5):
    check(rng.standard_normal((4, 8)).astype(np.float32))
out["same_shape"] = npusim.device_info()["graph_plans"]
check(rng.standard_normal((6, 8)).astype(np.float32))  # new shapes: a new plan
out["new_shape"] = npusim.device_info()["graph_plans"]
# Two threads run the graph at once, each its own inputs.
xs = [[rng.standard_normal((6, 8)).astype(np.float32) for _ in range(8)] for _ in range(2)]
threads = [threading.Thread(target=lambda a=a: [check(x) for x in a]) for a in xs]
for t in threads: t.start()
for t in threads: t.join()
out["threads"] = npusim.device_info()["graph_plans"]
print("NPUSIM_RESULT " + json.dumps(out))
"""


def test_arenas_are_kept_across_runs_and_never_shared():
    result = _result(run_child(ARENAS))
    assert result["errors"] == [], result
    same, new, threads = result["same_shape"], result["new_shape"], result["threads"]
    # Five runs with the same shapes: one plan, one arena, allocated once and kept.
    assert same["plans"] == 1 and same["arena_allocations"] == 1, same
    assert same["arenas_held"] == 1 and same["arena_bytes_held"] == same["max_arena_bytes"], same
    # New shapes for the same kernel: a second plan and arena; the first plan's idle arena is
    # freed.
    assert new["plans"] == 2 and new["arena_allocations"] == 2 and new["arenas_held"] == 1, new
    # Concurrent runs take an arena each (a second one only if they overlapped), all correct
    # above; every arena allocated since is still held.
    assert threads["plans"] == 2 and 1 <= threads["arenas_held"] <= 2, threads
    assert threads["arena_allocations"] == 1 + threads["arenas_held"], threads


UPDATE_FAULT = r"""
import json, os
import numpy as np
import npusim
os.environ["NPUSIM_MAX_INSNS_PER_BLOCK"] = "1"
import tensorflow as tf

x = tf.constant(np.ones((4, 8), np.float32))
w = tf.constant(np.ones((8, 16), np.float32))
v = tf.Variable(np.arange(64, dtype=np.float32).reshape(4, 16))
u = tf.Variable(np.full((4, 16), 3.0, np.float32))
before = [v.numpy().tolist(), u.numpy().tolist()]

@tf.function
def step():
    g = tf.nn.relu(tf.matmul(x, w, name="the_matmul"))
    v.assign_sub(g * 0.5)
    u.assign_add(g * 2.0)

out = {"before": before}
try:
    step()
except tf.errors.OpError as e:
    out["error"] = [type(e).__name__, e.message]
out["after"] = [v.numpy().tolist(), u.numpy().tolist()]
out["records"] = [[r["op_name"], r["op_type"], r["graph_run"]] for r in npusim.launch_records()]
out["chip"] = npusim.device_info()["settings"]["chip"]
print("NPUSIM_RESULT " + json.dumps(out))
"""


def test_a_fault_in_a_graph_with_updates_leaves_the_variables():
    result = _result(run_child(UPDATE_FAULT))
    message = _fault_of_the_matmul(result)
    assert f"chip '{result['chip']}'" in message, message
    # The updates were in the faulting graph's task list (the MatMul's graph), not run alone.
    assert all(r[2] for r in result["records"]), result["records"]
    assert result["after"] == result["before"], result


CONCURRENT_UPDATES = r"""
import json, threading
import numpy as np
import npusim
import tensorflow as tf

# Two "models" (a, b) each with its own weights, both adding into the same two accumulators in
# opposite program orders; the values are exact in f32 (and in the cube's fp16).
x = tf.constant(np.ones((4, 4), np.float32))
wa = tf.Variable(np.ones((4, 4), np.float32))
wb = tf.Variable(np.ones((4, 4), np.float32))
s1 = tf.Variable(np.zeros((4, 4), np.float32))
s2 = tf.Variable(np.zeros((4, 4), np.float32))

@tf.function
def step_a():
    g = tf.matmul(x, wa)            # 4.0 everywhere
    s1.assign_add(g * 0.5)          # + 2
    s2.assign_add(g * 2.0)          # + 8

@tf.function
def step_b():
    g = tf.matmul(x, wb)
    s2.assign_add(g * 2.0)
    s1.assign_add(g * 0.5)

step_a(); step_b()
npusim.clear_launch_records()
N = 12
errors = []
def run(f):
    try:
        for _ in range(N):
            f()
    except Exception as e:  # noqa: BLE001
        errors.append(repr(e))
threads = [threading.Thread(target=run, args=(f,)) for f in (step_a, step_b)]
for t in threads: t.start()
for t in threads: t.join()
recs = npusim.launch_records()
print("NPUSIM_RESULT " + json.dumps({
    "errors": errors, "s1": s1.numpy().tolist(), "s2": s2.numpy().tolist(),
    "updates": sum(r["op_type"] == "FusedVariableUpdate" for r in recs),
    "updates_alone": sum(r["op_type"] == "FusedVariableUpdate" and not r["graph_run"]
                         for r in recs)}))
"""


def test_concurrent_graphs_updating_shared_variables_neither_deadlock_nor_lose_updates():
    result = _result(run_child(CONCURRENT_UPDATES, timeout=300))
    assert result["errors"] == [], result
    steps = 2 + 2 * 12  # the warm-up calls and both threads'
    np.testing.assert_array_equal(np.array(result["s1"]), np.full((4, 4), 2.0 * steps))
    np.testing.assert_array_equal(np.array(result["s2"]), np.full((4, 4), 8.0 * steps))
    assert result["updates"] > 0 and result["updates_alone"] == 0, result


# A lowered cond (tf.cond in a tf.function becomes Switch / Merge before grappler sees it) after
# a chain of NPU ops, as Keras' mixed-precision step conds its update on the gradients being
# finite. Each branch holds two ops. By default the chain before the cond is one graph run and
# the taken branch another (graph_liveness.h: its nodes are live together); the branch's nodes
# never share a run with the chain's (they may be dead). `NPUSIM_GRAPH_CONTROL_FLOW=top` keeps
# to the chain, `=0` leaves the graph node by node.
COND = r"""
import json
import numpy as np
import npusim
import tensorflow as tf

def body(x):
    h = tf.nn.relu(tf.multiply(x, 3.0, name="pre_scaled"), name="pre_relu")
    h = tf.add(h, 1.0, name="pre_shifted")
    s = tf.reduce_sum(h, name="pre_sum")
    finite = tf.reduce_all(tf.math.is_finite(h, name="pre_finite"), name="pre_all")
    y = tf.cond(finite,
                lambda: tf.reduce_max(tf.multiply(h, s, name="then_scaled"), axis=1,
                                      name="then_max"),
                lambda: tf.reduce_min(tf.subtract(h, 1.0, name="else_shifted"), axis=1,
                                      name="else_min"))
    return tf.add(y, 2.0, name="post_add")

out = {}
for case, values in (("finite", np.arange(-6, 6, dtype=np.float32).reshape(3, 4) / 4),
                     ("infinite", np.array([[1, np.inf, 2, 3]] * 3, np.float32))):
    x = tf.constant(values)
""" + "\n".join("    " + line for line in RUN_AND_GROUP.strip("\n").split("\n")) + r"""
    task_lists = len({("g", r["graph_run"]) if r["graph_run"] else ("op", r["dispatch"])
                      for r in recs})
    out[case] = {"got": got.numpy().tolist(), "want": want.numpy().tolist(),
                 "groups": sorted(sorted(g) for g in groups.values()),
                 "ops": sorted(r["op_name"] for r in recs), "task_lists": task_lists}
print("NPUSIM_RESULT " + json.dumps(out))
"""


def _part(name, prefix):
    return name.startswith(prefix) or "/" + prefix in name


def test_cond_branches_run_as_graphs_of_their_own():
    result = _result(run_child(COND))
    top = _result(run_child(COND, extra_env={"NPUSIM_GRAPH_CONTROL_FLOW": "top"}))
    off = _result(run_child(COND, extra_env={"NPUSIM_GRAPH_CONTROL_FLOW": "0"}))
    for case, branch, other in (("finite", "then_", "else_"), ("infinite", "else_", "then_")):
        r, t, o = result[case], top[case], off[case]
        np.testing.assert_allclose(r["got"], r["want"], rtol=1e-6)
        assert r["got"] == t["got"] == o["got"] and r["ops"] == t["ops"] == o["ops"], case
        groups = r["groups"]
        # The chain before the cond (its predicate included) is one graph run ...
        pre = [g for g in groups if any(_part(n, "pre_") for n in g)]
        assert len(pre) == 1 and {"pre_shifted", "pre_sum", "pre_all"} <= set(pre[0]), groups
        assert all(_part(n, "pre_") for n in pre[0]), groups
        # ... the taken branch's two ops another (the untaken one's never run) ...
        taken = [g for g in groups if any(_part(n, branch) for n in g)]
        assert len(taken) == 1 and all(_part(n, branch) for n in taken[0]), groups
        assert not any(_part(n, other) for n in r["ops"]), r["ops"]
        # ... and the add after the Merge runs on its own.
        assert not any(_part(n, "post_") for g in groups for n in g), groups
        assert r["task_lists"] == t["task_lists"] - 1, (r["task_lists"], t["task_lists"])
        # `top`: only the chain before the cond; off: node by node, a task list per node.
        assert [g for g in t["groups"] if not all(_part(n, "pre_") for n in g)] == [], t["groups"]
        assert o["groups"] == [], o["groups"]
        assert t["task_lists"] < o["task_lists"], (t["task_lists"], o["task_lists"])


# A tf.while_loop whose body is a recurrent cell of four ops (MatMul, add, tanh, a scaled copy
# kept for the output): each iteration's body runs as one graph run; the loop's counter and
# condition (int32, host memory) stay TensorFlow's. The same numbers as the CPU's and as with
# `NPUSIM_GRAPH_CONTROL_FLOW=top` (every body node its own task list).
LOOP = r"""
import json
import numpy as np
import npusim
import tensorflow as tf

STEPS = 5
w = tf.constant(np.linspace(-0.5, 0.5, 64, dtype=np.float32).reshape(8, 8))

def body(x):
    def step(i, h, acc):
        h = tf.tanh(tf.add(tf.matmul(h, w, name="cell_matmul"), x[i], name="cell_add"),
                    name="cell_tanh")
        return i + 1, h, tf.add(acc, tf.multiply(h, 0.5, name="cell_half"), name="cell_acc")
    _, h, acc = tf.while_loop(lambda i, h, acc: i < STEPS, step,
                              (tf.constant(0), tf.zeros([4, 8]), tf.zeros([4, 8])))
    return tf.concat([h, acc], axis=1, name="joined")

x = tf.constant(np.sin(np.arange(STEPS * 32, dtype=np.float32)).reshape(STEPS, 4, 8))
""" + RUN_AND_GROUP + r"""
task_lists = len({("g", r["graph_run"]) if r["graph_run"] else ("op", r["dispatch"])
                  for r in recs})
print("NPUSIM_RESULT " + json.dumps({
    "got": got.numpy().tolist(), "want": want.numpy().tolist(),
    "groups": [sorted(g) for g in groups.values()],
    "ops": sorted(r["op_name"] for r in recs), "task_lists": task_lists}))
"""


def test_loop_body_runs_as_one_graph_per_iteration():
    result = _result(run_child(LOOP))
    top = _result(run_child(LOOP, extra_env={"NPUSIM_GRAPH_CONTROL_FLOW": "top"}))
    # The cube takes the f32 MatMul's operands in fp16 (the default precision mode).
    np.testing.assert_allclose(result["got"], result["want"], rtol=5e-3, atol=2e-3)
    assert result["got"] == top["got"] and result["ops"] == top["ops"]
    body = [g for g in result["groups"] if any(_part(n, "cell_") for n in g)]
    assert len(body) == 5, result["groups"]  # one graph run per iteration ...
    for g in body:  # ... holding the whole cell
        assert any(_part(n, "cell_matmul") for n in g) and all(_part(n, "cell_") for n in g), g
    assert not any(_part(n, "cell_") for g in top["groups"] for n in g), top["groups"]
    assert result["task_lists"] < top["task_lists"], (result["task_lists"], top["task_lists"])


# Keras' LSTM and GRU (a While loop over the sequence, and its gradient another) trained one
# step: each loop's body runs as one graph per iteration; the loss and the weights after the
# step are those of `NPUSIM_GRAPH_CONTROL_FLOW=top` (the bodies node by node) bit for bit.
RNN = r"""
import json
import numpy as np
import npusim
import tensorflow as tf
import keras

keras.utils.set_random_seed(0)
with tf.device("/NPU:0"):
    model = keras.Sequential([keras.Input((8,), dtype="int32"), keras.layers.Embedding(50, 8),
                              keras.layers.%s(16), keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.default_rng(0)
x = rng.integers(0, 50, (2, 8)).astype(np.int32)
y = rng.integers(0, 4, (2,)).astype(np.int32)
model.train_on_batch(x, y)
npusim.clear_launch_records()
loss = model.train_on_batch(x, y)
recs = npusim.launch_records()
print("NPUSIM_RESULT " + json.dumps({
    "loss": float(loss), "weights": [w.numpy().tolist() for w in model.weights],
    "launches": len(recs), "task_lists": len({("g", r["graph_run"]) if r["graph_run"]
                                               else ("op", r["dispatch"]) for r in recs})}))
"""


@pytest.mark.parametrize("layer", ["LSTM", "GRU"])
def test_recurrent_layer_trains_with_loop_bodies_as_graphs(layer):
    result = _result(run_child(RNN % layer, timeout=600))
    top = _result(run_child(RNN % layer, timeout=600,
                            extra_env={"NPUSIM_GRAPH_CONTROL_FLOW": "top"}))
    assert result["loss"] == top["loss"]
    for a, b in zip(result["weights"], top["weights"]):
        np.testing.assert_array_equal(np.array(a), np.array(b))
    # (Fewer launches: a body's graph casts a tensor two cube ops read to fp16 once.)
    assert result["launches"] <= top["launches"], (result["launches"], top["launches"])
    # 8 forward and 8 backward iterations, each body's launches now one task list.
    assert result["task_lists"] <= top["task_lists"] - 8 * 4, (result, top)
