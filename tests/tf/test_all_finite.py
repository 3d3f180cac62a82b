"""A loss scale's overflow check as one AllFinite launch (adapter/tf/plugin/graph_fusion.h,
rewrite 20; the kernel in adapter/compiler/ops/all_finite.cpp): All(Pack(All(IsFinite(g)) ...))
over the gradients, four launches per gradient, becomes one launch with the same bool.

- Keras mixed precision (`mixed_float16`, whose LossScaleOptimizer checks every gradient before
  the cond that applies or skips the step), the MLP of models/ trained three steps, then a step
  on an input with an infinity (the skip branch: the scale halves, the weights stay): losses,
  weights and loss scale bit for bit those of NPUSIM_FUSION_ALL_FINITE=0 in a child process, in
  the NpuGraph task lists and node by node; one AllFinite launch a step and no IsFinite / All
  launch, against one IsFinite per trainable variable with the rewrite off; the weights' float16
  copies in one MultiTensorCast (rewrite 19 follows the updates' handles through the cond's
  Switches), and the gradients' float32 casts that only the check and the cond read in another;
- the check by hand in a tf.function on tensors of several shapes (a scalar among them), each
  with and without an infinity or a NaN: TF on the CPU's answer; likewise over 300 tensors, more
  than one kernel's 256 arguments (AllFinite then takes several launches);
- must not fuse: the check's bool returned rather than used as a cond's predicate (nothing then
  says it is a scalar), inner reductions over some of the axes only (the graph's own answer
  kept) and an inner All with keep_dims.
"""

import os
import sys

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import child_result  # noqa: E402  pylint: disable=wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CODE = r'''
import json
import sys
import numpy as np
import npusim
import tensorflow as tf
import keras
sys.path.insert(0, ROOT)
from models import mlp


def op_types():
    return [r["op_type"] for r in npusim.launch_records()]


def keras_mixed():
    keras.mixed_precision.set_global_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=(8,)).astype(np.int32)
    with tf.device("/NPU:0"):
        model = mlp.build(784, 10, dropout=0.0)
        opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam(1e-3),
                                                       initial_scale=128.0)
        model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", jit_compile=False)
        losses, steps = [], []
        for step in range(3):
            npusim.clear_launch_records()
            losses.append(float(model.train_on_batch(x, y)))
            steps.append(op_types())
        bad = x.copy()
        bad[0, 0] = np.inf
        npusim.clear_launch_records()
        model.train_on_batch(bad, y)
        steps.append(op_types())
        out = {"losses": losses, "steps": steps,
               "scale": float(np.asarray(opt.dynamic_scale)),
               "variables": len(model.trainable_variables),
               "weights": [v.numpy().astype(np.float64).tolist()
                           for v in model.trainable_variables]}
    keras.mixed_precision.set_global_policy("float32")
    return out


SHAPES = [(3, 7), (), (64,), (5, 33), (2, 3, 4), (1,)]


def by_hand():
    rng = np.random.default_rng(3)
    base = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]

    def all_finite(xs):
        return tf.reduce_all([tf.reduce_all(tf.math.is_finite(x)) for x in xs])

    def check(*xs):  # as a loss scale uses it: the predicate of a cond
        return tf.cond(all_finite(xs), lambda: tf.constant(1.0), lambda: tf.constant(0.0))

    def returned(*xs):  # the bool itself returned: not only a predicate
        return all_finite(xs)

    def partial(a, b):  # each inner All over axis 0 only: a [4] per tensor, not a scalar
        return tf.reduce_all([tf.reduce_all(tf.math.is_finite(a), axis=0),
                              tf.reduce_all(tf.math.is_finite(b), axis=0)], axis=0)

    def kept(a, b):  # keep_dims on the inner Alls: [1, 1] each
        ok = tf.reduce_all([tf.reduce_all(tf.math.is_finite(a), keepdims=True),
                            tf.reduce_all(tf.math.is_finite(b), keepdims=True)])
        return tf.cond(ok, lambda: tf.constant(1.0), lambda: tf.constant(0.0))

    cases = {"finite": base}
    for i, (where, value) in enumerate([(0, np.inf), (1, np.nan), (3, -np.inf), (5, np.nan)]):
        xs = [x.copy() for x in base]
        flat = xs[where].reshape(-1)
        flat[flat.size - 1] = value
        xs[where] = flat.reshape(SHAPES[where])
        cases[f"bad{i}"] = xs
    out = {}
    for name, xs in cases.items():
        with tf.device("/NPU:0"):
            npusim.clear_launch_records()
            npu = float(tf.function(check)(*[tf.constant(x) for x in xs]).numpy()) == 1.0
            types = op_types()
            npusim.clear_launch_records()
            npu_returned = bool(tf.function(returned)(*[tf.constant(x) for x in xs]).numpy())
            types_returned = op_types()
        with tf.device("/CPU:0"):
            cpu = bool(returned(*[tf.constant(x) for x in xs]).numpy())
        out[name] = {"npu": npu, "cpu": cpu, "types": types, "npu_returned": npu_returned,
                     "types_returned": types_returned}
    a = rng.standard_normal((2, 4)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    b[1, 2] = np.inf
    for name, fn in (("partial", partial), ("kept", kept)):
        with tf.device("/NPU:0"):
            npusim.clear_launch_records()
            npu = tf.function(fn)(tf.constant(a), tf.constant(b)).numpy().tolist()
            types = op_types()
        with tf.device("/CPU:0"):
            cpu = fn(tf.constant(a), tf.constant(b)).numpy().tolist()
        if name == "kept":
            npu, cpu = npu == 1.0, cpu == 1.0
        out[name] = {"npu": npu, "cpu": cpu, "types": types}
    many = [rng.standard_normal(3).astype(np.float32) for _ in range(300)]
    for name, where in (("many", None), ("many_bad_first", 0), ("many_bad_last", 299)):
        xs = [x.copy() for x in many]
        if where is not None:
            xs[where][1] = np.nan
        with tf.device("/NPU:0"):
            npusim.clear_launch_records()
            npu = float(tf.function(check)(*[tf.constant(x) for x in xs]).numpy()) == 1.0
            types = op_types()
        with tf.device("/CPU:0"):
            cpu = bool(returned(*[tf.constant(x) for x in xs]).numpy())
        out[name] = {"npu": npu, "cpu": cpu, "types": types}
    return out


print("RESULT " + json.dumps({"keras": keras_mixed(), "by_hand": by_hand()}))
'''.replace("ROOT", repr(ROOT))

OFF = {"NPUSIM_FUSION_ALL_FINITE": "0"}
MODES = {"graph": {}, "node_by_node": {"NPUSIM_GRAPH": "0"}}


@pytest.fixture(scope="module", params=sorted(MODES))
def runs(request):
    env = MODES[request.param]
    return child_result(CODE, extra_env=env), child_result(CODE, extra_env={**env, **OFF})


def test_keras_loss_scale_check_is_one_launch_bit_identical(runs):
    on, off = runs
    k_on, k_off = on["keras"], off["keras"]
    assert k_on["losses"] == k_off["losses"]
    assert k_on["weights"] == k_off["weights"]
    # the infinite step was skipped in both: the scale halved from 128 (three finite steps do
    # not reach Keras' growth interval)
    assert k_on["scale"] == k_off["scale"] == 64.0
    for step_on, step_off in zip(k_on["steps"], k_off["steps"]):
        assert step_on.count("AllFinite") == 1, step_on
        assert "IsFinite" not in step_on and "All" not in step_on, step_on
        assert "AllFinite" not in step_off
        # the weights' float16 copies in one MultiTensorCast (rewrite 19), their variables
        # updated in the cond's branch through the Switch of the handle the reads take
        assert "MultiTensorCast" in step_on, step_on
        # and the gradients' float32 casts that the check and the cond read, one per variable,
        # in another (the rewrite off: AllFinite does not read them, so they stay Casts)
        assert step_off.count("Cast") - step_on.count("Cast") == k_off["variables"], (
            step_on, step_off)
        assert step_off.count("IsFinite") == k_off["variables"], step_off
        assert len(step_on) < len(step_off)
    print(f"\nlaunches per step: {len(k_off['steps'][0])} -> {len(k_on['steps'][0])}")


def test_check_by_hand_matches_the_cpu(runs):
    on, off = runs
    for name in ("finite", "bad0", "bad1", "bad2", "bad3"):
        case = on["by_hand"][name]
        assert case["npu"] == case["cpu"], (name, case)
        assert case["npu"] == (name == "finite")
        assert case["types"].count("AllFinite") == 1 and "IsFinite" not in case["types"], case
        assert off["by_hand"][name]["npu"] == case["cpu"]
    # 300 tensors: AllFinite in several launches (at most 254 tensors each), the same answers
    for name in ("many", "many_bad_first", "many_bad_last"):
        case = on["by_hand"][name]
        assert case["npu"] == case["cpu"] == (name == "many"), (name, case["npu"], case["cpu"])
        assert case["types"].count("AllFinite") >= 2 and "IsFinite" not in case["types"]
        assert off["by_hand"][name]["npu"] == case["cpu"]


def test_checks_not_used_as_a_predicate_stay_unfused(runs):
    on, _ = runs
    for name in ("finite", "bad0"):
        case = on["by_hand"][name]
        assert case["npu_returned"] == case["cpu"], (name, case)
        assert "AllFinite" not in case["types_returned"], case
    for name in ("partial", "kept"):
        case = on["by_hand"][name]
        assert case["npu"] == case["cpu"], (name, case)
        assert "AllFinite" not in case["types"], (name, case["types"])
        assert "IsFinite" in case["types"], (name, case["types"])
