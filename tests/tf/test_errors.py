"""Error paths of the NPU under TensorFlow: each is an ordinary TensorFlow error (or
NpusimError for configuration), names what failed, and leaves the process and the device
usable. Cases needing a particular chip or simulator setting run in a child process
(conftest.run_child)."""

import json
import os

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from conftest import run_child  # noqa: E402  pylint: disable=wrong-import-position


def _result(proc):
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.split("NPUSIM_RESULT ", 1)[1])


OOM_CHILD = r"""
import json
import numpy as np
import npusim
# 320 MiB of HBM (docs/tf_plugin.md, "Device memory": tensors are blocks of the runtime's
# allocator, with no reserve kept outside it); 384 MiB cannot fit.
npusim.configure(chip="tiny", overrides={"memory.hbm.bytes": "320 MiB"})
import tensorflow as tf
out = {}
with tf.device("/NPU:0"):
    try:
        # A kernel's output allocation (BroadcastTo on the chip) that cannot be satisfied.
        big = tf.broadcast_to(tf.constant(np.float32(1)), (96, 1024, 1024))
        out["error"] = None
    except tf.errors.ResourceExhaustedError as e:
        out["error"] = e.message
    small = tf.identity(tf.constant(np.arange(6, dtype=np.float32)))
    out["small_device"] = small.device
    out["small"] = small.numpy().tolist()
out["hbm_bytes"] = npusim.device_info()["hbm_bytes"]
print("NPUSIM_RESULT " + json.dumps(out))
"""


def test_device_out_of_memory_is_resource_exhausted():
    result = _result(run_child(OOM_CHILD))
    assert result["hbm_bytes"] == 320 << 20
    message = result["error"]
    assert message is not None, "allocating 384 MiB on a 320 MiB chip succeeded"
    # TensorFlow's allocator message: the tensor's shape and type, and the device.
    assert "96,1024,1024" in message and "float" in message, message
    assert "NPU:0" in message, message
    # The device keeps working after the failed allocation.
    assert result["small_device"].endswith("device:NPU:0")
    assert result["small"] == [0, 1, 2, 3, 4, 5]


FAULT_CHILD = r"""
import json, os
import numpy as np
import npusim
# The simulator's watchdog at 8 scalar-unit instructions per block: every compiled kernel
# faults on the chip (a kernel's prologue alone is longer).
os.environ["NPUSIM_MAX_INSNS_PER_BLOCK"] = "8"
npusim.configure(chip="tiny")
import tensorflow as tf
out = {"errors": []}
a = np.arange(12, dtype=np.float32).reshape(3, 4)
with tf.device("/NPU:0"):
    x = tf.constant(a)
    for _ in range(2):
        try:
            (x + x).numpy()
            out["errors"].append(None)
        except tf.errors.OpError as e:
            out["errors"].append([type(e).__name__, e.message])
    # Copies need no kernel: the device still moves data both ways.
    out["copy"] = tf.identity(x).numpy().tolist()
out["records"] = [[r["kernel"], r["ok"], r["error"]] for r in npusim.launch_records()]
print("NPUSIM_RESULT " + json.dumps(out))
"""


def test_kernel_fault_is_an_op_error_and_the_process_survives():
    result = _result(run_child(FAULT_CHILD))
    assert len(result["errors"]) == 2
    for error in result["errors"]:
        assert error is not None, "a kernel ran past the watchdog"
        kind, message = error
        assert kind == "InternalError", error
        # The op (its compiled signature) and the chip's fault.
        assert "AddV2(f32[3,4], f32[3,4])" in message and "on the NPU" in message, message
        assert "instructions" in message, message
    assert result["copy"] == np.arange(12, dtype=np.float32).reshape(3, 4).tolist()
    assert result["records"] and not any(ok for _, ok, _ in result["records"])


# The variable kernels written on TensorFlow's C++ API (adapter/tf/plugin/tf_cc_kernel_util.h,
# GuardedOpKernel): AssignAddVariableOp, ResourceApplyGradientDescent (an optimizer kernel) and
# ResourceDynamicUpdateSlice (npusim.llm.update_variable_slice), each faulting on the chip under
# the watchdog as FAULT_CHILD's kernels do.
VARIABLE_FAULT_CHILD = r"""
import json, os
import numpy as np
import npusim
os.environ["NPUSIM_MAX_INSNS_PER_BLOCK"] = "8"
npusim.configure(chip="tiny")
import tensorflow as tf
import npusim.llm
start = np.arange(64, dtype=np.float32).reshape(2, 32)
ones = np.ones_like(start)  # copied to the chip: no kernel
out = {}
with tf.device("/NPU:0"):
    v = tf.Variable(start)
    updates = {
        "AssignAddVariableOp": lambda: v.assign_add(ones),
        "ResourceApplyGradientDescent": lambda: tf.raw_ops.ResourceApplyGradientDescent(
            var=v.handle, alpha=tf.constant(np.float32(0.5)), delta=tf.constant(ones)),
        "ResourceDynamicUpdateSlice": lambda: npusim.llm.update_variable_slice(
            v, np.ones((1, 32), np.float32), [1, 0]),
    }
    for op, update in updates.items():
        try:
            update()
            out[op] = {"error": None}
        except tf.errors.OpError as e:
            out[op] = {"error": [type(e).__name__, e.message]}
        out[op]["value"] = v.numpy().tolist()
print("NPUSIM_RESULT " + json.dumps(out))
"""


def test_variable_kernel_fault_names_the_op_and_keeps_the_value():
    result = _result(run_child(VARIABLE_FAULT_CHILD))
    assert set(result) == {"AssignAddVariableOp", "ResourceApplyGradientDescent",
                           "ResourceDynamicUpdateSlice"}, result
    start = np.arange(64, dtype=np.float32).reshape(2, 32).tolist()
    for op, run in result.items():
        assert run["error"] is not None, f"{op} ran past the watchdog"
        kind, message = run["error"]
        assert kind == "InternalError", run["error"]
        assert op in message and "on the NPU" in message, message
        assert "instructions" in message, message
        # A faulted update publishes nothing: the variable keeps its value.
        assert run["value"] == start, (op, run["value"])


def test_unsupported_op_with_soft_placement_off_is_a_placement_error(npusim, tf,
                                                                     strict_placement):
    # Zeta has CPU kernels only. Eager: TensorFlow's "no kernel" error for the NPU.
    x = np.array([2.0, 3.0], np.float32)
    with tf.device("/NPU:0"):
        with pytest.raises((tf.errors.NotFoundError, tf.errors.InvalidArgumentError),
                           match=r"(?s)Zeta.*NPU|NPU.*Zeta"):
            tf.math.zeta(tf.constant(x), tf.constant(x))

    # In a tf.function: the placer's error naming the node and the device.
    @tf.function
    def f(a):
        with tf.device("/NPU:0"):
            return tf.math.zeta(a, a)

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"(?s)Zeta.*NPU"):
        f(tf.constant(x))


CONFIGURE_CHILD = r"""
import json
import numpy as np
import npusim
npusim.configure(chip="tiny")
import tensorflow as tf
with tf.device("/NPU:0"):
    y = tf.constant(np.float32(2)) * tf.constant(np.float32(3))
out = {"first": float(y.numpy())}
try:
    npusim.configure(chip="910b")
    out["error"] = None
except npusim.NpusimError as e:
    out["error"] = str(e)
with tf.device("/NPU:0"):
    out["after"] = float((tf.constant(np.float32(4)) * tf.constant(np.float32(5))).numpy())
out["chip"] = npusim.device_info()["settings"]["chip"]
print("NPUSIM_RESULT " + json.dumps(out))
"""


def test_configure_another_chip_after_first_use_raises():
    result = _result(run_child(CONFIGURE_CHILD))
    assert result["first"] == 6.0
    assert result["error"] and "already in use" in result["error"], result
    assert "910b" in result["error"] and "tiny" in result["error"], result
    assert result["after"] == 20.0 and result["chip"] == "tiny"


def test_keras_jit_compile_true_says_xla_cannot_compile_for_the_npu(npusim, tf):
    keras = pytest.importorskip("keras")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    x = np.ones((8, 4), np.float32)
    y = np.zeros((8, 2), np.float32)
    for call in (lambda: model.fit(x, y, verbose=0), lambda: model.evaluate(x, y, verbose=0),
                 lambda: model.predict(x, verbose=0)):
        with pytest.raises(ValueError, match="XLA cannot compile for the NPU"):
            call()
    # jit_compile=False trains on the NPU as usual.
    model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    assert np.isfinite(model.fit(x, y, verbose=0).history["loss"][0])


# Ops given inputs or attributes that break the op's own contract, on the NPU with soft placement
# off: each must fail with the error class TensorFlow's CPU kernel raises for the same call
# (user code catches InvalidArgumentError), naming the op and what is wrong.
# name: (op type, call, words the NPU's message must hold); in a call, f(*shape) is an f32
# tensor of ones, i(*shape) the same in int64.
SHAPE_ERROR_CASES = {
    "MatMul inner dims": ("MatMul", lambda tf, f, i: tf.raw_ops.MatMul(a=f(2, 3), b=f(4, 5)),
                          "inner dimensions"),
    "MatMul scalars": ("MatMul", lambda tf, f, i: tf.raw_ops.MatMul(a=f(), b=f()), "rank 2"),
    "MatMul rank 3": ("MatMul", lambda tf, f, i: tf.raw_ops.MatMul(a=f(2, 2, 3), b=f(3, 2)),
                      "rank 2"),
    "BatchMatMulV2 inner dims": (
        "BatchMatMulV2", lambda tf, f, i: tf.raw_ops.BatchMatMulV2(x=f(2, 2, 3), y=f(2, 4, 5)),
        "inner dimensions"),
    "BatchMatMulV2 batch dims": (
        "BatchMatMulV2", lambda tf, f, i: tf.raw_ops.BatchMatMulV2(x=f(2, 2, 3), y=f(3, 3, 5)),
        "broadcast-compatible"),
    "BatchMatMul batch dims": (
        "BatchMatMul", lambda tf, f, i: tf.raw_ops.BatchMatMul(x=f(2, 2, 3), y=f(1, 3, 5)),
        "batch dims"),
    "AddV2 broadcast": ("AddV2", lambda tf, f, i: tf.raw_ops.AddV2(x=f(2, 3), y=f(4, 3)),
                        "broadcast-compatible"),
    "Less broadcast": ("Less", lambda tf, f, i: tf.raw_ops.Less(x=f(2, 3), y=f(2)),
                       "broadcast-compatible"),
    "int64 Mul broadcast": ("Mul", lambda tf, f, i: tf.raw_ops.Mul(x=i(2, 3), y=i(3, 2)),
                            "broadcast-compatible"),
    "Sum axis": ("Sum", lambda tf, f, i: tf.raw_ops.Sum(input=f(2, 3), axis=2), "out of range"),
    "Max negative axis": ("Max", lambda tf, f, i: tf.raw_ops.Max(input=f(2, 3), axis=-3),
                          "out of range"),
    "Mean axes": ("Mean", lambda tf, f, i: tf.raw_ops.Mean(input=f(2, 3), axis=[0, 5]),
                  "out of range"),
    "ArgMax axis": ("ArgMax", lambda tf, f, i: tf.raw_ops.ArgMax(input=f(2, 3), dimension=2),
                    "out of range"),
    "Transpose repeated perm": (
        "Transpose", lambda tf, f, i: tf.raw_ops.Transpose(x=f(2, 3), perm=[0, 0]),
        "permutation"),
    "Transpose perm length": (
        "Transpose", lambda tf, f, i: tf.raw_ops.Transpose(x=f(2, 3), perm=[0, 1, 2]), "perm"),
    "Conv2D channels": (
        "Conv2D", lambda tf, f, i: tf.raw_ops.Conv2D(input=f(1, 5, 5, 3), filter=f(3, 3, 4, 2),
                                                     strides=[1, 1, 1, 1], padding="VALID"),
        "channels"),
    "ConcatV2 shapes": (
        "ConcatV2", lambda tf, f, i: tf.raw_ops.ConcatV2(values=[f(2, 3), f(3, 4)], axis=0),
        "does not match"),
    "ConcatV2 axis": (
        "ConcatV2", lambda tf, f, i: tf.raw_ops.ConcatV2(values=[f(2, 3), f(2, 3)], axis=3),
        "out of range"),
    "Pack shapes": ("Pack", lambda tf, f, i: tf.raw_ops.Pack(values=[f(2, 3), f(3, 2)]),
                    "does not match"),
    "Slice size": (
        "Slice", lambda tf, f, i: tf.raw_ops.Slice(input=f(2, 3), begin=[0, 1], size=[2, 3]),
        "outside the input"),
    "Slice begin": (
        "Slice", lambda tf, f, i: tf.raw_ops.Slice(input=f(2, 3), begin=[3, 0], size=[1, 1]),
        "outside the input"),
    "StridedSlice index": (
        "StridedSlice",
        lambda tf, f, i: tf.raw_ops.StridedSlice(input=f(2, 3), begin=[5], end=[6], strides=[1],
                                                 shrink_axis_mask=1),
        "out of bounds"),
    "ReverseV2 repeated axis": (
        "ReverseV2", lambda tf, f, i: tf.raw_ops.ReverseV2(tensor=f(2, 3), axis=[1, -1]),
        "axis 1 is given more than once"),
    "ReverseV2 axis range": (
        "ReverseV2", lambda tf, f, i: tf.raw_ops.ReverseV2(tensor=f(2, 3), axis=[2]),
        "out of range"),
    "Split divisibility": (
        "Split", lambda tf, f, i: tf.raw_ops.Split(axis=1, value=f(2, 3), num_split=2),
        "not divisible"),
    "Softmax scalar": ("Softmax", lambda tf, f, i: tf.raw_ops.Softmax(logits=f()), "dimension"),
    "LogSoftmax scalar": ("LogSoftmax", lambda tf, f, i: tf.raw_ops.LogSoftmax(logits=f()),
                          "dimension"),
    "BiasAdd channels": ("BiasAdd", lambda tf, f, i: tf.raw_ops.BiasAdd(value=f(2, 3), bias=f(4)),
                         "channels"),
    "SelectV2 broadcast": (
        "SelectV2",
        lambda tf, f, i: tf.raw_ops.SelectV2(condition=tf.constant([[True, False]]), t=f(3, 3),
                                             e=f(3, 3)),
        "broadcast-compatible"),
    "BroadcastTo shape": (
        "BroadcastTo", lambda tf, f, i: tf.raw_ops.BroadcastTo(input=f(2, 3), shape=[4, 3]),
        "cannot be broadcast"),
    "GatherV2 axis": (
        "GatherV2",
        lambda tf, f, i: tf.raw_ops.GatherV2(params=f(2, 3), indices=tf.constant([0]), axis=2),
        "out of range"),
}

SHAPE_ERROR_REFERENCE_CHILD = r"""
import json, sys
import numpy as np
sys.path.insert(0, %r)
import tensorflow as tf
from test_errors import SHAPE_ERROR_CASES
f = lambda *s: tf.constant(np.ones(s, np.float32))
i = lambda *s: tf.constant(np.ones(s, np.int64))
out = {}
for name, (_, call, _) in SHAPE_ERROR_CASES.items():
    try:
        with tf.device("/CPU:0"):
            call(tf, f, i).numpy()
        out[name] = None
    except tf.errors.OpError as e:
        out[name] = type(e).__name__
print("NPUSIM_RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def cpu_error_classes():
    """The error class TensorFlow's own CPU kernels raise for each case, in a child process with
    oneDNN off: the oneDNN kernels (on by default on Intel hosts only) differ in places (a scalar
    Softmax is AbortedError there), and the reference must not depend on the host."""
    code = SHAPE_ERROR_REFERENCE_CHILD % os.path.dirname(os.path.abspath(__file__))
    return _result(run_child(code, extra_env={"TF_ENABLE_ONEDNN_OPTS": "0"}))


@pytest.mark.parametrize("name", list(SHAPE_ERROR_CASES))
def test_invalid_op_raises_the_cpu_error_class(npusim, tf, strict_placement, cpu_error_classes,
                                               name):
    op_type, call, words = SHAPE_ERROR_CASES[name]
    want = cpu_error_classes[name]
    assert want is not None, f"{name}: TensorFlow's CPU kernel accepts the call"
    f = lambda *s: tf.constant(np.ones(s, np.float32))  # noqa: E731
    i = lambda *s: tf.constant(np.ones(s, np.int64))  # noqa: E731
    with tf.device("/NPU:0"):
        with pytest.raises(tf.errors.OpError) as info:
            call(tf, f, i).numpy()
    message = info.value.message
    assert type(info.value).__name__ == want, message
    # Raised by the NPU kernel (the compiler's message: the op's signature, then the reason).
    assert "device:NPU:0" in message and f"{op_type}(" in message, message
    assert words in message, message
    # The device keeps working.
    with tf.device("/NPU:0"):
        assert float(tf.reduce_sum(f(2, 2)).numpy()) == 4.0
