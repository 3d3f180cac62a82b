"""Error paths of the NPU under TensorFlow: each is an ordinary TensorFlow error (or
NpusimError for configuration), names what failed, and leaves the process and the device
usable. Cases needing a particular chip or simulator setting run in a child process
(conftest.run_child)."""

import json

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
