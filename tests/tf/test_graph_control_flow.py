"""Whole graphs inside lowered control flow (adapter/tf/plugin/graph_liveness.h): a set of nodes
runs as one NpuGraph node only if its members are live in exactly the same executions (one loop
frame's iteration, one cond branch). Graph shapes beyond a plain cond or loop, each a
tf.function on the NPU run in the default mode and with `NPUSIM_GRAPH_CONTROL_FLOW=top` (the
control flow's nodes one by one), a child process per mode:

- outputs (and gradients, and weights after an optimizer step) bit for bit those of `top`,
  within the fp16 cube operands' tolerance of TensorFlow on the CPU, no hang (the child's
  timeout);
- the grouping: which nodes share a graph run (the launches' graph_run), named by prefixes:
  a cond inside a loop body (each iteration's nodes before the cond one run, the taken branch
  another); a loop inside a cond branch (taken: one run per iteration; not taken: none); nested
  loops (the inner body a run per inner iteration, the outer body's nodes before and after the
  inner loop runs of their own per outer iteration); an autograph `for i in tf.range(n)` loop
  writing a TensorArray; two independent chains in one body with parallel_iterations=4 (two
  sets in one frame, never one run); a loop-invariant computation inside a body; a loop bounded
  by maximum_iterations, and one that runs zero iterations; gradients through a while loop
  with a variable and Keras' SGD step; tf.switch_case with three branches and tf.case;
- Keras' mixed_float16 policy (LossScaleOptimizer conds its update on the gradients being
  finite): the MLP and the CNN of models/ trained three steps, losses and weights bit for bit
  those of `top`, in fewer task lists; a step with an infinite input takes the skip branch
  (weights unchanged, the loss scale halved) the same way in both modes;
- run-to-run determinism (launch_order.h, "Control flow"): a loop with overlapping iterations,
  two chains and a cond launches the same kernels at the same cycles in three calls and in two
  processes (one with 4 inter-op threads), one iteration after another;
- variable updates (rewrite 5) in cond branches, loop bodies and around them: each step's
  weights those of the CPU and of `top`; TF1 graphs (tf.compat.v1.while_loop / cond with v1
  control flow in a Session, and in a wrap_function): correct, clustered as in TF2.
"""

import functools
import json

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

from conftest import run_child  # noqa: E402  pylint: disable=wrong-import-position

# A child script's head: run(name, body, *args) runs tf.function(body) twice on the NPU (the
# second run measured) and once on the CPU, and records its outputs, the launches' op names per
# graph run and the number of task lists (a graph run's launches, or one op dispatched alone).
HEAD = r"""
import json
import numpy as np
import npusim
import tensorflow as tf

out = {}

def task_lists(recs):
    return len({("g", r["graph_run"]) if r["graph_run"] else ("op", r["dispatch"])
                for r in recs})

def graph_runs(recs):  # the launches' op names of each graph run, sorted
    runs = {r["graph_run"] for r in recs if r["graph_run"]}
    return sorted(sorted({r["op_name"] for r in recs if r["graph_run"] == g}) for g in runs)

def run(name, body, *args):
    npu = tf.function(body)
    npu(*args)  # traced and planned; the second run is measured
    npusim.clear_launch_records()
    got = tf.nest.flatten(npu(*args))
    recs = npusim.launch_records()
    with tf.device("/CPU:0"):
        want = tf.nest.flatten(tf.function(body)(*args))
    out[name] = {"bits": [g.numpy().tobytes().hex() for g in got],
                 "got": [g.numpy().astype(np.float64).tolist() for g in got],
                 "want": [w.numpy().astype(np.float64).tolist() for w in want],
                 "groups": graph_runs(recs),
                 "ops": sorted(r["op_name"] for r in recs), "task_lists": task_lists(recs)}

rng = np.random.default_rng(0)
x = tf.constant(rng.uniform(-1, 1, (4, 4, 8)).astype(np.float32))
"""

SHAPES = HEAD + r"""
# A cond inside a loop body: even iterations take one branch, odd ones the other.
def cond_in_loop(x):
    def step(i, h):
        h = tf.tanh(tf.multiply(tf.add(h, x[i]), 0.5, name="body_half"), name="body_tanh")
        h = tf.cond(i % 2 == 0,
                    lambda: tf.tanh(tf.multiply(h, 2.0, name="even_scaled"), name="even_tanh"),
                    lambda: tf.sigmoid(tf.multiply(h, -1.5, name="odd_scaled"), name="odd_sigmoid"))
        return i + 1, h
    return tf.while_loop(lambda i, h: i < 4, step, (tf.constant(0), tf.zeros([4, 8])))[1]
run("cond_in_loop", cond_in_loop, x)

# A loop inside a cond branch, taken (positive sum) and not taken.
def loop_in_cond(x):
    s = tf.reduce_sum(tf.multiply(x, 2.0, name="pre_scaled"), name="pre_sum")
    def looped():
        def step(i, h):
            h = tf.tanh(tf.multiply(h, 0.75, name="loop_scaled"), name="loop_tanh")
            return i + 1, h
        return tf.while_loop(lambda i, h: i < 3, step, (tf.constant(0), x))[1]
    return tf.cond(tf.greater(s, 0.0, name="pre_positive"), looped,
                   lambda: tf.sigmoid(tf.multiply(x, 1.5, name="else_scaled"), name="else_sigmoid"))
run("loop_in_cond_taken", loop_in_cond, tf.abs(x) + 0.1)
run("loop_in_cond_not_taken", loop_in_cond, -tf.abs(x) - 0.1)

# Nested while loops: 2 outer iterations of 3 inner ones.
def nested(x):
    def outer(j, h):
        h = tf.tanh(tf.multiply(h, 0.5, name="outer_half"), name="outer_tanh")
        def inner(i, g):
            return i + 1, tf.tanh(tf.multiply(g, 1.5, name="inner_scaled"), name="inner_tanh")
        h = tf.while_loop(lambda i, g: i < 3, inner, (tf.constant(0), h))[1]
        return j + 1, tf.sigmoid(tf.multiply(h, 2.0, name="after_scaled"), name="after_sigmoid")
    return tf.while_loop(lambda j, h: j < 2, outer, (tf.constant(0), x[0]))[1]
run("nested", nested, x)

# Autograph: `for i in tf.range(n)` writing a TensorArray each iteration (autograph reads the
# function's source: a module of its own in a file).
AUTOGRAPH_LOOP = '''
import tensorflow as tf

def tensor_array(x):
    ta = tf.TensorArray(tf.float32, size=x.shape[0])
    h = tf.zeros([4, 8])
    for i in tf.range(x.shape[0]):
        h = tf.tanh(tf.add(tf.multiply(h, 0.5, name="ta_half"), x[i], name="ta_add"),
                    name="ta_tanh")
        ta = ta.write(i, h)
    return ta.stack()
'''
import importlib.util, os, tempfile
path = os.path.join(tempfile.mkdtemp(), "autograph_loop.py")
with open(path, "w") as f:
    f.write(AUTOGRAPH_LOOP)
spec = importlib.util.spec_from_file_location("autograph_loop", path)
autograph_loop = importlib.util.module_from_spec(spec)
spec.loader.exec_module(autograph_loop)
run("tensor_array", autograph_loop.tensor_array, x)

# Two independent chains in one body, iterations allowed to overlap.
def two_chains(x):
    def step(i, a, b):
        a = tf.tanh(tf.multiply(a, 0.9, name="chain_a_scaled"), name="chain_a_tanh")
        b = tf.sigmoid(tf.multiply(b, 1.1, name="chain_b_scaled"), name="chain_b_sigmoid")
        return i + 1, a, b
    return tf.while_loop(lambda i, a, b: i < 4, step, (tf.constant(0), x[0], x[1] * 2),
                         parallel_iterations=4)[1:]
run("two_chains", two_chains, x)

# A loop-invariant computation inside the body: reads only w, a loop invariant.
def invariant(x):
    w = tf.add(x[3], 0.5, name="w_shifted")
    def step(i, h):
        v = tf.tanh(tf.multiply(w, 2.0, name="body_invariant_scaled"),
                    name="body_invariant_tanh")
        return i + 1, tf.tanh(tf.multiply(h, v, name="body_mul"), name="body_tanh")
    return tf.while_loop(lambda i, h: i < 4, step, (tf.constant(0), x[0]))[1]
run("invariant", invariant, x)

# A loop bounded by maximum_iterations (its condition alone would run 100), and one whose
# condition is false at once (the bound a run-time input, so nothing folds it).
def bounded(x, n):
    def step(i, h):
        h = tf.tanh(tf.add(tf.multiply(h, 0.5, name="lim_half"), 0.2, name="lim_add"),
                    name="lim_tanh")
        return i + 1, h
    h = tf.while_loop(lambda i, h: i < n, step, (tf.constant(0), x[0]), maximum_iterations=3)[1]
    return tf.tanh(tf.multiply(h, 3.0, name="post_scaled"), name="post_tanh")
run("maximum_iterations", bounded, x, tf.constant(100))
run("zero_iterations", bounded, x, tf.constant(0))

# tf.switch_case with three branches, and tf.case (nested conds), each branch taken once; the
# nodes before them, and a branch reading only a variable.
v = tf.Variable(rng.uniform(-1, 1, (4, 8)).astype(np.float32))
def branches(h):
    return [lambda: tf.tanh(tf.multiply(h, 2.0, name="b0_scaled"), name="b0_tanh"),
            lambda: tf.sigmoid(tf.multiply(h, -1.5, name="b1_scaled"), name="b1_sigmoid"),
            lambda: tf.tanh(tf.multiply(v.read_value(), 3.0, name="b2_scaled"), name="b2_tanh")]
def switch(x, k):
    h = tf.tanh(tf.multiply(x[0], 0.5, name="pre_half"), name="pre_tanh")
    return tf.switch_case(k, branches(h))
def case(x, k):
    h = tf.tanh(tf.multiply(x[0], 0.5, name="pre_half"), name="pre_tanh")
    b = branches(h)
    return tf.case([(tf.equal(k, 0), b[0]), (tf.equal(k, 1), b[1])], default=b[2])
for k in range(3):
    run("switch_case_%d" % k, switch, x, tf.constant(k))
    run("case_%d" % k, case, x, tf.constant(k))

# A switch_case (lowered to a _SwitchN on the branch index) whose branch 0 is one op reading only
# a variable (a lone op of variable reads joins the largest set of its class: it must not join
# the nodes before the case) and whose branch 2 updates the variable; the branches taken in turn.
def switch_variable(device):
    with tf.device(device):
        u = tf.Variable(np.ones((4, 8), np.float32))
    def body(x, k):
        h = tf.tanh(tf.multiply(x[0], 0.5, name="pre_half"), name="pre_tanh")
        def update():
            u.assign_add(tf.multiply(h, 2.0, name="b2_scaled"))
            return tf.sigmoid(h, name="b2_sigmoid")
        return tf.switch_case(k, [lambda: tf.multiply(u.read_value(), 3.0, name="b0_scaled"),
                                  lambda: tf.tanh(h, name="b1_tanh"), update])
    f = tf.function(body)
    steps = []
    for k in (1, 0, 2, 1, 0):
        with tf.device(device):
            y = f(x, tf.constant(k))
        steps.append({"y": y.numpy().astype(np.float64).tolist(), "u": u.numpy().tolist(),
                      "bits": y.numpy().tobytes().hex() + u.numpy().tobytes().hex()})
    return steps
out["switch_case_variable"] = {"npu": switch_variable("/NPU:0"), "cpu": switch_variable("/CPU:0")}
print("NPUSIM_RESULT " + json.dumps(out))
"""

# Gradients through a while loop over a weight variable, and Keras' SGD (momentum) step, three
# steps; the same on the CPU from the same initial weight.
GRADIENTS = r"""
import json
import numpy as np
import npusim
import tensorflow as tf
import keras

rng = np.random.default_rng(0)
x = tf.constant(rng.uniform(-1, 1, (3, 4, 8)).astype(np.float32))
w0 = rng.uniform(-0.5, 0.5, (8, 8)).astype(np.float32)

def train(device):
    with tf.device(device):
        w = keras.Variable(w0, name="w")
        opt = keras.optimizers.SGD(0.1, momentum=0.9)
        opt.build([w])
    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            def cell(i, h):
                h = tf.tanh(tf.add(tf.matmul(h, w.value, name="cell_matmul"), x[i],
                                   name="cell_add"), name="cell_tanh")
                return i + 1, h
            h = tf.while_loop(lambda i, h: i < 3, cell, (tf.constant(0), tf.zeros([4, 8])))[1]
            loss = tf.reduce_sum(tf.multiply(h, h, name="loss_sq"), name="loss_sum")
        grad = tape.gradient(loss, w.value)
        opt.apply_gradients([(grad, w)])
        return loss, grad
    results = []
    for _ in range(3):
        npusim.clear_launch_records()
        with tf.device(device):
            loss, grad = step(x)
        recs = npusim.launch_records()
        results.append({"loss": loss.numpy().tobytes().hex(), "loss_value": float(loss),
                        "grad": grad.numpy().tolist(), "grad_bits": grad.numpy().tobytes().hex(),
                        "ops": sorted(r["op_name"] for r in recs),
                        "groups": sorted(sorted({q["op_name"] for q in recs
                                                 if q["graph_run"] == g})
                                         for g in {r["graph_run"] for r in recs} if g)})
    return results, np.asarray(w.value).tolist()

npu, npu_w = train("/NPU:0")
cpu, cpu_w = train("/CPU:0")
print("NPUSIM_RESULT " + json.dumps({"npu": npu, "npu_w": npu_w, "cpu": cpu, "cpu_w": cpu_w,
                                     "npu_w_bits": np.asarray(npu_w, np.float32).tobytes().hex()}))
"""

# Keras' mixed_float16 policy: `name` of models/ trained three steps with Adam under a
# LossScaleOptimizer (it conds its update on the gradients being finite; an initial scale of 128
# keeps the fp16 gradients finite), then a step on an input with an infinity (the skip branch:
# the trainable weights stay, the loss scale halves; the batch norms' moving statistics take
# the NaNs as on the CPU), then a finite step again.
MIXED = r"""
import json
import numpy as np
import npusim
import tensorflow as tf
import keras
import models

keras.mixed_precision.set_global_policy("mixed_float16")
name = %r
keras.utils.set_random_seed(0)
x, y = models.synthetic_data(name, batch=4, seed=1)
model = models.build(name, seed=3)
model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(),
                                                           initial_scale=128.0),
              loss=models.loss(name))
initial = [np.asarray(w).astype(np.float32).tobytes().hex() for w in model.weights]
out = {"losses": [], "task_lists": [], "launches": []}

def step(inputs):
    npusim.clear_launch_records()
    loss = float(model.train_on_batch(inputs, y))
    recs = npusim.launch_records()
    out["task_lists"].append(len({("g", r["graph_run"]) if r["graph_run"] else ("op", r["dispatch"])
                                  for r in recs}))
    out["launches"].append(len(recs))
    return loss

def weights(which=None):
    return [np.asarray(w).astype(np.float32).tobytes().hex() for w in which or model.weights]

for _ in range(3):
    out["losses"].append(step(x))
out["weights"] = weights()
out["trainable"] = weights(model.trainable_weights)
out["initial_changed"] = sum(a != b for a, b in zip(initial, out["weights"]))
out["iterations"] = int(np.asarray(model.optimizer.iterations))
out["scale_before_skip"] = float(np.asarray(model.optimizer.dynamic_scale))
bad = np.array(x, copy=True)
bad.reshape(-1)[0] = np.inf
step(bad)
out["skip_weights"] = weights()
out["skip_trainable"] = weights(model.trainable_weights)
out["iterations_after_skip"] = int(np.asarray(model.optimizer.iterations))
out["scale_after_skip"] = float(np.asarray(model.optimizer.dynamic_scale))
out["loss_after_skip"] = step(x)
out["final_weights"] = weights()
print("NPUSIM_RESULT " + json.dumps(out))
"""

TOP = {"NPUSIM_GRAPH_CONTROL_FLOW": "top"}


def _result(proc):
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.split("NPUSIM_RESULT ", 1)[1])


@functools.lru_cache(maxsize=None)
def _shapes(mode):
    return _result(run_child(SHAPES, timeout=300, extra_env=TOP if mode == "top" else None))


def _part(name, prefix):
    return name.startswith(prefix) or "/" + prefix in name


def _runs_of(groups, prefix):
    """The graph runs holding a node named `prefix`..., checked to hold only such nodes."""
    runs = [g for g in groups if any(_part(n, prefix) for n in g)]
    for g in runs:
        assert all(_part(n, prefix) for n in g), (prefix, g)
    return runs


# (case, {name prefix: graph runs holding it by default}); `top` runs none of them in a graph
# but for the "pre_" nodes of a graph's top frame (no control-flow op reaches them).
CASES = [
    ("cond_in_loop", {"body_": 4, "even_": 2, "odd_": 2}),
    ("loop_in_cond_taken", {"pre_": 1, "loop_": 3, "else_": 0}),
    ("loop_in_cond_not_taken", {"pre_": 1, "loop_": 0, "else_": 1}),
    ("nested", {"outer_": 2, "inner_": 6, "after_": 2}),
    ("tensor_array", {"ta_": 4}),
    ("two_chains", {"chain_a_": 4, "chain_b_": 4}),
    ("invariant", {"body_": 4}),
    ("maximum_iterations", {"lim_": 3, "post_": 1}),
    ("zero_iterations", {"lim_": 0, "post_": 1}),
] + [("%s_%d" % (kind, k), {"pre_": 1, "b%d_" % k: 1,
                            **{"b%d_" % o: 0 for o in range(3) if o != k}})
     for kind in ("switch_case", "case") for k in range(3)]


@pytest.mark.parametrize("case,expected", CASES, ids=[c for c, _ in CASES])
def test_graph_shape_with_control_flow(case, expected):
    r, t = _shapes("default")[case], _shapes("top")[case]
    for got, want in zip(r["got"], r["want"]):
        np.testing.assert_allclose(got, want, rtol=5e-3, atol=2e-3)
    assert r["bits"] == t["bits"] and r["ops"] == t["ops"], case
    for prefix, runs in expected.items():
        assert len(_runs_of(r["groups"], prefix)) == runs, (prefix, r["groups"])
        in_top = len(_runs_of(t["groups"], prefix))
        assert in_top == (runs if prefix == "pre_" else 0), (prefix, t["groups"])
    # Every graph run holds nodes of one part of the graph (the expected prefixes, or nodes
    # not named here such as x[i]'s StridedSlice joining a body's run).
    if any(runs for runs in expected.values()):
        assert r["task_lists"] < t["task_lists"], (r["task_lists"], t["task_lists"])


def test_switch_case_branch_reading_a_variable_stays_in_its_branch():
    # Was: the _SwitchN's outputs carried no literal, so branch 0's multiply of a variable read
    # joined the nodes before the case, ran whatever the index and gave an empty output, and
    # branch 2's update was lost.
    result, top = _shapes("default")["switch_case_variable"], _shapes("top")["switch_case_variable"]
    for r, t, c in zip(result["npu"], top["npu"], result["cpu"]):
        np.testing.assert_allclose(r["y"], c["y"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(r["u"], c["u"], rtol=1e-5, atol=1e-6)
        assert r["bits"] == t["bits"]


def test_two_chains_of_one_frame_are_two_sets():
    # parallel_iterations=4: each chain's iteration is a run of its own, never one with the other.
    groups = _shapes("default")["two_chains"]["groups"]
    assert not any(any(_part(n, "chain_a_") for n in g) and any(_part(n, "chain_b_") for n in g)
                   for g in groups), groups


def test_loop_invariant_computation_runs_in_each_body_run():
    # A While's lowering carries the captured tensor through the loop's Merge / Switch like any
    # loop variable, so the computation on it runs under the loop's predicate, in the body's run.
    groups = _shapes("default")["invariant"]["groups"]
    body = _runs_of(groups, "body_")
    assert all(any(_part(n, "body_invariant_tanh") for n in g) for g in body), groups


def test_gradients_and_an_optimizer_step_through_a_loop():
    result = _result(run_child(GRADIENTS, timeout=300))
    top = _result(run_child(GRADIENTS, timeout=300, extra_env=TOP))
    for r, t, c in zip(result["npu"], top["npu"], result["cpu"]):
        assert r["loss"] == t["loss"] and r["grad_bits"] == t["grad_bits"]
        # (A body's graph may launch less: x[i]'s slice and shared fp16 casts inside a graph.)
        assert set(r["ops"]) <= set(t["ops"]) and len(r["ops"]) <= len(t["ops"])
        np.testing.assert_allclose(r["loss_value"], c["loss_value"], rtol=5e-3)
        np.testing.assert_allclose(r["grad"], c["grad"], rtol=2e-2, atol=2e-2)
        # The forward body and the gradient's: one run per iteration each, holding the cell's
        # MatMul and its gradient's.
        cell = [g for g in r["groups"] if any(_part(n, "cell_matmul") for n in g)]
        backward = [g for g in cell if all("while_grad/" in n for n in g)]
        forward = [g for g in cell if not any("gradient_tape" in n for n in g)]
        assert len(forward) == 3 and len(backward) == 3 and len(cell) == 6, r["groups"]
        assert not any(_part(n, "cell_") for g in t["groups"] for n in g), t["groups"]
    assert result["npu_w_bits"] == top["npu_w_bits"]
    np.testing.assert_allclose(result["npu_w"], result["cpu_w"], rtol=2e-2, atol=2e-2)


@functools.lru_cache(maxsize=None)
def _mixed(name, mode):
    return _result(run_child(MIXED % name, timeout=600, extra_env=TOP if mode == "top" else None))


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_keras_mixed_precision_trains_as_top_in_fewer_task_lists(name):
    result, top = _mixed(name, "default"), _mixed(name, "top")
    assert result["losses"] == top["losses"] and np.all(np.isfinite(result["losses"]))
    assert result["weights"] == top["weights"] and result["initial_changed"] == len(
        result["weights"]) and result["iterations"] == 3
    assert all(a <= b for a, b in zip(result["launches"], top["launches"]))
    # The taken branch (the update) is graph runs of its own instead of a task list per node
    # (the finite steps; the skip step's branch launches nothing).
    for i in (0, 1, 2, 4):
        assert result["task_lists"][i] < top["task_lists"][i], (result["task_lists"],
                                                                top["task_lists"])
    # The step with an infinity updates no trainable weight in either mode; the next one
    # trains again.
    assert result["skip_trainable"] == result["trainable"] == top["skip_trainable"]
    assert result["skip_weights"] == top["skip_weights"]
    assert result["iterations_after_skip"] == 3 == top["iterations_after_skip"]
    assert result["loss_after_skip"] == top["loss_after_skip"]
    assert result["final_weights"] == top["final_weights"] != result["weights"]


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_keras_mixed_precision_skip_step_halves_the_loss_scale(name):
    # Was: the multi-tensor update rewrite grouped the skip branch's update of the scale with
    # an update of the other branch (no path between them) into one node with inputs from both
    # branches, one always dead: it never ran, the scale never halved, and a model whose fp16
    # gradients overflow at the initial scale never trained (NPUSIM_FUSION_MULTI_TENSOR=0 halved
    # it). Now a group holds nodes of one liveness class (graph_fusion.cpp, independent_groups).
    for result in (_mixed(name, "default"), _mixed(name, "top")):
        assert result["scale_after_skip"] == result["scale_before_skip"] / 2 == 64.0


# Run-to-run determinism, variable updates under control flow, TF1-style graphs: child scripts
# of MORE_HEAD and parts (_more: which part in which mode).
MORE_HEAD = r"""
import csv, json, os, tempfile
import numpy as np
import npusim
import tensorflow as tf

if os.environ.get("INTER_OP"):
    tf.config.threading.set_inter_op_parallelism_threads(int(os.environ["INTER_OP"]))
out = {}
"""

DETERMINISM = r"""
rng = np.random.default_rng(0)
# Determinism: independent nodes before the loop, a body of two independent chains and a cond
# with iterations allowed to overlap (parallel_iterations=4), an independent node after it. The
# function runs three times; each call's launches (op name, cycles, start after the call's first
# launch), and the report of all three (op_summary.csv's rows).
x = tf.constant(rng.uniform(-1, 1, (4, 64, 256)).astype(np.float32))
w = tf.constant(rng.uniform(-0.1, 0.1, (256, 256)).astype(np.float32))
def overlapping(x):
    p = tf.tanh(tf.multiply(x[2], 0.3, name="pre_p"), name="pre_p_tanh")
    q = tf.sigmoid(tf.multiply(x[3], 0.7, name="post_q"), name="post_q_sigmoid")
    def step(i, a, b, c):
        a = tf.tanh(tf.matmul(a, w, name="chain_a_matmul"), name="chain_a_tanh")
        b = tf.sigmoid(tf.multiply(b, 1.1, name="chain_b_scaled"), name="chain_b_sigmoid")
        c = tf.cond(i % 2 == 0, lambda: tf.tanh(tf.multiply(c, 2.0, name="even_scaled")),
                    lambda: tf.sigmoid(tf.multiply(c, -1.5, name="odd_scaled")))
        return i + 1, a, b, c
    r = tf.while_loop(lambda i, a, b, c: i < 6, step, (tf.constant(0), x[0], x[1] * 2.0, p),
                      parallel_iterations=4)[1:]
    return r + (q,)
f = tf.function(overlapping)
calls = []
for _ in range(3):
    npusim.clear_launch_records()
    got = f(x)
    recs = npusim.launch_records()
    t0 = min(r["start_cycle"] for r in recs)
    calls.append([(r["op_name"], r["cycles"], r["start_cycle"] - t0) for r in recs])
with tf.device("/CPU:0"):
    want = tf.function(overlapping)(x)
report = tempfile.mkdtemp()
npusim.write_report(report)
with open(os.path.join(report, "op_summary.csv")) as table:
    rows = [(r["Op Name"], r["Task Start Time(us)"], r["task_start_cycles"],
             r["task_duration_cycles"]) for r in csv.DictReader(table)]
out["determinism"] = {"calls": calls, "report": rows,
                      "got": [g.numpy().astype(np.float64).tolist() for g in got],
                      "want": [g.numpy().astype(np.float64).tolist() for g in want]}
"""

UPDATES = r"""
# Variable updates (rewrite 5's FusedVariableUpdate: a moment, then a weight from the new moment)
# under control flow: a cond choosing between momentum and plain SGD for all weights; a cond
# updating two of four; the moments updated before a cond and the weights from them inside it;
# the moments updated in a loop body and the weights after the loop; a whole momentum update in
# a loop body and an SGD step after it. Each step's weights and moments, on the NPU and the CPU.
rng = np.random.default_rng(1)
W0 = [rng.uniform(-1, 1, (16, 32)).astype(np.float32) for _ in range(4)]
G = [tf.constant(rng.uniform(-1, 1, (16, 32)).astype(np.float32)) for _ in range(4)]
def momentum(w, m, g):
    m.assign(tf.add(tf.multiply(m, 0.9), g))
    w.assign_sub(tf.multiply(m.read_value(), 0.1))
def sgd(w, g):
    w.assign_sub(tf.multiply(g, 0.05))
def moments(ms):
    for m, g in zip(ms, G):
        m.assign(tf.add(tf.multiply(m, 0.9), g))
def weights_from_moments(ws, ms):
    for w, m in zip(ws, ms):
        w.assign_sub(tf.multiply(m.read_value(), 0.1))
    return tf.constant(1.0)
def cond_two_optimizers(ws, ms, flag):
    def a():
        for w, m, g in zip(ws, ms, G):
            momentum(w, m, g)
        return tf.constant(1.0)
    def b():
        for w, g in zip(ws, G):
            sgd(w, g)
        return tf.constant(2.0)
    return tf.cond(flag, a, b)
def cond_subset(ws, ms, flag):
    momentum(ws[0], ms[0], G[0])
    momentum(ws[1], ms[1], G[1])
    def a():
        momentum(ws[2], ms[2], G[2])
        momentum(ws[3], ms[3], G[3])
        return tf.constant(1.0)
    return tf.cond(flag, a, lambda: tf.constant(0.0))
def cond_split_chain(ws, ms, flag):
    moments(ms)
    return tf.cond(flag, lambda: weights_from_moments(ws, ms), lambda: tf.constant(0.0))
def loop_moments(ws, ms, flag):
    def body(i):
        moments(ms)
        return (i + 1,)
    tf.while_loop(lambda i: i < 3, body, (tf.constant(0),))
    return weights_from_moments(ws, ms)
def loop_momentum(ws, ms, flag):
    def body(i):
        for w, m, g in zip(ws, ms, G):
            momentum(w, m, g)
        return (i + 1,)
    tf.while_loop(lambda i: i < 2, body, (tf.constant(0),))
    for w, g in zip(ws, G):
        sgd(w, g)
    return tf.constant(1.0)
for case in (cond_two_optimizers, cond_subset, cond_split_chain, loop_moments, loop_momentum):
    result = {}
    for device in ("/NPU:0", "/CPU:0"):
        with tf.device(device):
            ws = [tf.Variable(v) for v in W0]
            ms = [tf.Variable(np.zeros_like(v)) for v in W0]
        step = tf.function(lambda flag: case(ws, ms, flag))
        npusim.clear_launch_records()
        states = []
        for flag in (True, False, True):
            with tf.device(device):
                step(tf.constant(flag))
            states.append([v.numpy() for v in ws + ms])
        result[device] = {"bits": [[s.tobytes().hex() for s in state] for state in states],
                          "values": [[s.astype(np.float64).tolist() for s in state]
                                     for state in states]}
        if device == "/NPU:0":
            result["fused"] = sum(r["op_type"] == "FusedVariableUpdate"
                                  for r in npusim.launch_records())
    out["updates_" + case.__name__] = result
"""

TF1 = r"""
# TF1-style graphs: tf.compat.v1.while_loop with a tf.compat.v1.cond in its body, its weight a
# constant the loop reads (an is_constant Enter with v1 control flow), and a v1 loop of variable
# updates; in a v1 Graph run by a Session with v1 control flow, and in a wrap_function.
v1 = tf.compat.v1
rng = np.random.default_rng(2)
X1 = rng.uniform(-1, 1, (4, 8)).astype(np.float32)
W1 = rng.uniform(-0.5, 0.5, (8, 8)).astype(np.float32)
def tf1_loop(x):
    w1 = tf.constant(W1)
    def body(i, h):
        h = tf.tanh(tf.matmul(h, w1, name="v1_matmul"), name="v1_tanh")
        h = v1.cond(i % 2 > 0, lambda: tf.multiply(h, 2.0, name="v1_odd"),
                    lambda: tf.sigmoid(h, name="v1_even"))
        return i + 1, h
    h = v1.while_loop(lambda i, h: i < 3, body, (tf.constant(0), x))[1]
    return tf.reduce_sum(tf.multiply(h, h, name="v1_square"), name="v1_sum"), h
def graph_runs(recs):
    runs = {r["graph_run"] for r in recs if r["graph_run"]}
    return sorted(sorted({r["op_name"] for r in recs if r["graph_run"] == g}) for g in runs)
for device in ("/NPU:0", "/CPU:0"):
    v1.disable_control_flow_v2()
    graph = tf.Graph()
    with graph.as_default(), tf.device(device):
        xp = v1.placeholder(tf.float32, [4, 8])
        total, h = tf1_loop(xp)
        acc = v1.get_variable("acc", initializer=tf.zeros([4, 8]), use_resource=True)
        def accumulate(i):
            with tf.control_dependencies([acc.assign_add(tf.multiply(xp, 0.5, name="v1_half"))]):
                return i + 1
        updates = v1.while_loop(lambda i: i < 4, accumulate, [tf.constant(0)])
        init = v1.global_variables_initializer()
    enters = [n for n in graph.as_graph_def().node if n.op == "Enter"]
    with v1.Session(graph=graph) as sess:
        sess.run(init)
        npusim.clear_launch_records()
        got = sess.run([total, h], {xp: X1})
        sess.run(updates, {xp: X1})
        got.append(sess.run(acc.read_value()))
        recs = npusim.launch_records()
    v1.enable_control_flow_v2()
    with tf.device(device):
        wrapped = v1.wrap_function(tf1_loop, [tf.TensorSpec([4, 8], tf.float32)])
        npusim.clear_launch_records()
        got += [t.numpy() for t in wrapped(tf.constant(X1))]
    out["tf1_" + device] = {
        "values": [np.asarray(g, np.float64).tolist() for g in got],
        "bits": [np.asarray(g).tobytes().hex() for g in got],
        "constant_enters": sum(n.attr["is_constant"].b for n in enters),
        "session_groups": graph_runs(recs), "wrap_groups": graph_runs(npusim.launch_records())}
"""


@functools.lru_cache(maxsize=None)
def _more(mode):
    """The parts' results: "default" all three, "inter_op" (4 inter-op threads, another
    process) the determinism part, "top" the updates and TF1 graphs."""
    parts, env = {"default": ([DETERMINISM, UPDATES, TF1], None),
                  "inter_op": ([DETERMINISM], {"INTER_OP": "4"}),
                  "top": ([UPDATES, TF1], TOP)}[mode]
    code = MORE_HEAD + "".join(parts) + 'print("NPUSIM_RESULT " + json.dumps(out))\n'
    return _result(run_child(code, timeout=300, extra_env=env))


def test_a_loop_with_overlapping_iterations_launches_the_same_from_run_to_run():
    # Was: a graph with control flow got no launch order (launch_order.h), so the executor's
    # threads decided which of the independent nodes (before the loop, the two chains, the
    # cond's branch, another iteration's) reached the chip first: 14 to 35 of the 164 rows of
    # op_summary.csv moved between two processes (2026-12-06).
    result, other = _more("default")["determinism"], _more("inter_op")["determinism"]
    for got, want in zip(result["got"], result["want"]):
        np.testing.assert_allclose(got, want, rtol=5e-3, atol=2e-3)
    for run in (result, other):
        assert run["calls"][0] == run["calls"][1] == run["calls"][2]
    assert result["calls"] == other["calls"] and result["report"] == other["report"]
    # One iteration's launches before the next one's: the body's launches are six equal
    # chunks, each with both chains and the branch of its iteration's parity.
    body = [name for name, _, _ in result["calls"][0] if "while/" in name]
    size = len(body) // 6
    assert size * 6 == len(body), body
    for k in range(6):
        chunk = body[k * size:(k + 1) * size]
        assert any("chain_a_" in n for n in chunk) and any("chain_b_" in n for n in chunk), chunk
        assert all("odd_" not in n for n in chunk if "/cond/" in n) == (k % 2 == 0), chunk
        assert any("/cond/" in n for n in chunk), chunk


@pytest.mark.parametrize("case", ["cond_two_optimizers", "cond_subset", "cond_split_chain",
                                  "loop_moments", "loop_momentum"])
def test_variable_updates_under_control_flow(case):
    # Rewrite 5 groups an update with one that reads its new value through a control edge; under
    # control flow such a read lies in the same branch or body as the update (TensorFlow moves
    # control edges from outside a cond or loop onto its entry), so each group is of one
    # liveness class: each step's weights and moments those of the CPU and of `top`.
    result, top = _more("default")["updates_" + case], _more("top")["updates_" + case]
    assert result["fused"] > 0
    assert result["/NPU:0"]["bits"] == top["/NPU:0"]["bits"]
    for npu, cpu in zip(result["/NPU:0"]["values"], result["/CPU:0"]["values"]):
        for a, b in zip(npu, cpu):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_tf1_while_loop_and_cond_in_a_session_and_a_wrap_function():
    result, top = _more("default"), _more("top")
    npu, cpu, top_npu = result["tf1_/NPU:0"], result["tf1_/CPU:0"], top["tf1_/NPU:0"]
    # v1 control flow: the loop's weight enters as a constant (is_constant Enter).
    assert npu["constant_enters"] > 0
    assert npu["bits"] == top_npu["bits"]
    for got, want in zip(npu["values"], cpu["values"]):
        np.testing.assert_allclose(got, want, rtol=5e-3, atol=2e-3)
    # The body's MatMul and Tanh one graph run per iteration, in the session and the
    # wrap_function; none with `top`.
    for groups in (npu["session_groups"], npu["wrap_groups"]):
        body = [g for g in groups if any(_part(n, "v1_matmul") for n in g)]
        assert len(body) == 3 and all(any(_part(n, "v1_tanh") for n in g) for g in body), groups
    assert not any(_part(n, "v1_matmul") for g in top_npu["session_groups"] + top_npu["wrap_groups"]
                   for n in g)
