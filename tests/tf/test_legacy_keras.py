"""tf-keras (Keras 2, TF_USE_LEGACY_KERAS=1) on the NPU: a Dense MLP trained by model.fit with
the legacy optimizers, whose updates are TensorFlow's fused ops ResourceApplyAdam,
ResourceApplyKerasMomentum (SGD with momentum, plain and Nesterov) and
ResourceApplyGradientDescent (kernels_optimizer.cpp, on the chip),
matched against the same fit on the CPU. tf-keras only turns XLA on when a GPU exists, so
nothing needs patching. Runs in a child process: TF_USE_LEGACY_KERAS must be set before
tensorflow is imported. Skipped when tf_keras is not installed."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("tf_keras")

from conftest import child_env  # noqa: E402  pylint: disable=wrong-import-position

CHILD = r"""
import json, sys
import numpy as np
import npusim
import tensorflow as tf
keras = tf.keras
assert keras.__name__.startswith("tf_keras"), keras.__name__
tf.config.set_soft_device_placement(sys.argv[1] == "soft")

OPTIMIZERS = {
    "adam": lambda: keras.optimizers.legacy.Adam(1e-2),
    "momentum": lambda: keras.optimizers.legacy.SGD(5e-2, momentum=0.9),
    "nesterov": lambda: keras.optimizers.legacy.SGD(5e-2, momentum=0.9, nesterov=True),
    "sgd": lambda: keras.optimizers.legacy.SGD(5e-2),
}
rng = np.random.default_rng(4)
x = rng.standard_normal((48, 12)).astype(np.float32)
y = rng.integers(0, 3, 48).astype(np.int64)
out = {}
for name, make in OPTIMIZERS.items():
    # The NPU run has no device scope (TensorFlow prefers the NPU for every op with a kernel
    # there); under tf.device("/NPU:0") with soft placement off, the initializers' random ops
    # (CPU kernels only) would be requested on the NPU.
    for device in ("/CPU:0", None):
        with tf.device(device):
            tf.keras.utils.set_random_seed(5)
            model = keras.Sequential([keras.layers.Dense(8, activation="relu", input_shape=(12,)),
                                      keras.layers.Dense(3)])
            model.compile(optimizer=make(),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            npusim.clear_launch_records()
            loss = model.fit(x, y, batch_size=16, epochs=2, shuffle=False,
                             verbose=0).history["loss"]
            records = npusim.launch_records()
        out[name + (device or "/NPU:0")] = {
            "loss": loss, "weights": [w.numpy().tolist() for w in model.weights],
            "weight_devices": [w.device for w in model.weights],
            "kernels": sorted({r["kernel"].split("_")[0] for r in records}),
            "failed": [r["error"] for r in records if not r["ok"]],
            "jit_compile": bool(model._jit_compile)}
print("NPUSIM_RESULT " + json.dumps(out))
"""

# The compiled kernels' names (the compiler names ResourceApplyX's kernels ApplyX_<type>);
# ResourceApplyKerasMomentum is composed of binary ops (kernels_optimizer.cpp).
FUSED = {"adam": {"ApplyAdam"}, "sgd": {"ApplyGradientDescent"},
         "momentum": {"Mul", "Sub", "AddV2"}, "nesterov": {"Mul", "Sub", "AddV2"}}


def _run(placement):
    env = child_env()
    env["TF_USE_LEGACY_KERAS"] = "1"
    proc = subprocess.run([sys.executable, "-c", CHILD, placement], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.split("NPUSIM_RESULT ", 1)[1])


@pytest.mark.parametrize("placement", ["soft", "strict"])
def test_tf_keras_fit_with_legacy_optimizers_on_the_npu(placement):
    import numpy as np  # pylint: disable=import-outside-toplevel

    out = _run(placement)
    for name, fused in FUSED.items():
        npu, cpu = out[name + "/NPU:0"], out[name + "/CPU:0"]
        assert not npu["jit_compile"]
        assert all(d.endswith("device:NPU:0") for d in npu["weight_devices"]), npu
        assert cpu["kernels"] == []
        assert npu["failed"] == []
        # The fused update ran on the chip, with the forward and backward passes.
        # (The Dense layers' MatMul -> BiasAdd -> Relu run as MatMulBiasAdd: MatMul kernels.)
        assert fused | {"MatMul", "ReluGrad"} <= set(npu["kernels"]), (name, npu)
        # fp32 MatMul rounds its inputs to fp16 on the cube (default precision mode); the
        # updates themselves are bit-exact with TF's CPU functors (compiler/ops/optimizer.cpp).
        np.testing.assert_allclose(npu["loss"], cpu["loss"], rtol=1e-3)
        for w_npu, w_cpu in zip(npu["weights"], cpu["weights"]):
            np.testing.assert_allclose(w_npu, w_cpu, rtol=0, atol=1e-3)
