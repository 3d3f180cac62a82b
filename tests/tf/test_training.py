"""Training on the NPU: a GradientTape SGD step with every op on the chip (soft placement off),
and a Keras 3 Dense MLP trained with Adam by model.fit (soft placement on: ops without an NPU
kernel run on the CPU), compared with the same training on the CPU.

The SGD step uses small integers and a power-of-two learning rate, so every value is exact in
fp16 (the cube's input type for fp32 MatMul in the default precision mode) and the NPU must match
the CPU and numpy bit for bit."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from conftest import child_env  # noqa: E402  pylint: disable=wrong-import-position


def _sgd_step(tf, device, x, w0, y, lr):
    """One step of w -= lr * d/dw sum((x @ w - y)^2) on `device`; returns (gradient, new w)."""
    with tf.device(device):
        w = tf.Variable(w0)
        xt, yt = tf.constant(x), tf.constant(y)
        # Explicit output gradients: TensorFlow's default (ones_like) has no NPU kernel.
        seed = tf.constant(np.ones(y.shape, dtype=np.float32))
        with tf.GradientTape() as tape:
            loss = tf.square(tf.matmul(xt, w) - yt)
        grad = tape.gradient(loss, w, output_gradients=seed)
        assert grad.device.endswith("device:" + device.lstrip("/")), grad.device
        w.assign_sub(tf.constant(lr) * grad)
        return grad.numpy(), w.numpy()


def test_gradient_tape_sgd_step_matches_cpu(npusim, tf, strict_placement):
    rng = np.random.default_rng(0)
    x = rng.integers(-3, 4, (8, 6)).astype(np.float32)
    w0 = rng.integers(-3, 4, (6, 3)).astype(np.float32)
    y = rng.integers(-3, 4, (8, 3)).astype(np.float32)
    lr = np.float32(2.0**-6)
    npusim.clear_launch_records()
    grad_npu, w_npu = _sgd_step(tf, "/NPU:0", x, w0, y, lr)
    kernels = [r["kernel"] for r in npusim.launch_records()]
    grad_cpu, w_cpu = _sgd_step(tf, "/CPU:0", x, w0, y, lr)

    # |x.T @ 2(xw - y)| <= 6 * 3 * 2 * 21 < 2048: exact in fp16 and fp32.
    grad_ref = x.T @ (2.0 * (x @ w0 - y))
    np.testing.assert_array_equal(grad_npu, grad_ref)
    np.testing.assert_array_equal(grad_cpu, grad_ref)
    np.testing.assert_array_equal(w_npu, w0 - lr * grad_ref)
    np.testing.assert_array_equal(w_npu, w_cpu)
    # Forward and backward MatMul on the cube, the update on the vector unit.
    assert sum(k.startswith("MatMul") for k in kernels) == 2, kernels
    assert kernels[-1].startswith("Sub"), kernels  # AssignSubVariableOp


def _mlp(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _mlp_data():
    rng = np.random.default_rng(1)
    return (rng.standard_normal((64, 32)).astype(np.float32), rng.integers(0, 4, 64))


EPOCHS, BATCH = 3, 16
STEPS = EPOCHS * 64 // BATCH


def test_keras_mlp_fit_on_the_npu_matches_cpu(npusim, tf):
    assert tf.config.get_soft_device_placement()
    x, y = _mlp_data()
    history, weights = {}, {}
    for device in ("/CPU:0", "/NPU:0"):
        with tf.device(device):
            model = _mlp(seed=2)  # same initial weights on both devices
            npusim.clear_launch_records()
            history[device] = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False,
                                        verbose=0).history["loss"]
            weights[device] = [w.numpy() for w in model.weights]
            records = npusim.launch_records()
            if device == "/CPU:0":
                assert records == []
                continue
            assert model.optimizer.iterations.numpy() == STEPS
            for v in model.weights + model.optimizer.variables:
                assert v.value.device.endswith("device:NPU:0"), (v.path, v.value.device)

    loss = history["/NPU:0"]
    assert all(b < a for a, b in zip(loss, loss[1:])), loss
    # fp32 MatMul rounds its inputs to fp16 on the cube (relative error <= 2^-11 per operand);
    # after 12 Adam steps the loss and weights of the CPU run agree to ~1e-4 (seen: 5e-5 and
    # 2e-4); the bounds leave a margin of 5-10x.
    np.testing.assert_allclose(loss, history["/CPU:0"], rtol=1e-3)
    for w_npu, w_cpu in zip(weights["/NPU:0"], weights["/CPU:0"]):
        np.testing.assert_allclose(w_npu, w_cpu, rtol=0, atol=1e-3)

    for r in records:
        assert r["ok"], r["error"]
    kernels = {r["kernel"].split("_")[0] for r in records}
    # Adam's update of each weight (m, v and the weight: their chains and AssignAdd /
    # AssignSub) runs as one FusedVariableUpdate (graph_fusion.h, rewrite 5), the four merged
    # into one multi-tensor node (rewrite 5b): its inputs hold m, v and the weight of each,
    # tensors of the weight's shape, in turn.
    # The Dense layers' MatMul -> BiasAdd [-> Relu] run as one cube kernel each (MatMulBiasAdd,
    # graph_fusion.h rewrite 3b), named MatMul_* as the product's.
    assert {"MatMul", "ReluGrad", "FusedVariableUpdate"} <= kernels, kernels
    assert any(r["op_type"] == "MatMulBiasAdd" for r in records)
    keys = npusim.compiled_ops()["keys"]
    for shape in ("32,16", "16", "16,4", "4"):
        t = f"f32[{shape}]"
        assert any(k.startswith("FusedVariableUpdate(") and
                   (f"({t},{t},{t}," in k or f",{t},{t},{t}," in k) for k in keys), (shape, keys)


PLACEMENT_CHILD = r"""
import json
import numpy as np
import npusim
import tensorflow as tf
import keras
tf.debugging.set_log_device_placement(True)
rng = np.random.default_rng(1)
x, y = rng.standard_normal((32, 32)).astype(np.float32), rng.integers(0, 4, 32)
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(4)])
model.compile(optimizer="adam",
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
loss = model.fit(x, y, batch_size=16, epochs=1, verbose=0).history["loss"]
print("NPUSIM_RESULT " + json.dumps({
    "loss": loss,
    "kernels": sorted({r["kernel"].split("_")[0] for r in npusim.launch_records()})}))
"""


def test_keras_fit_places_variable_updates_on_the_npu():
    """A child process with TensorFlow's placement log (INFO level) on: which ops of the train
    step run where. The variable ops must all be on the NPU; the CPU fallbacks are listed in
    the failure message and documented in docs/tf_plugin.md."""
    env = child_env()
    env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    proc = subprocess.run([sys.executable, "-c", PLACEMENT_CHILD], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.split("NPUSIM_RESULT ", 1)[1])
    placed = {}  # op type -> devices, for the nodes of the train step
    node = re.compile(r"placer\.cc:\d+\] StatefulPartitionedCall/\S+: "
                      r"\((\w+)\): \S*device:(\w+:\d+)")
    for m in node.finditer(proc.stderr):
        placed.setdefault(m.group(1), set()).add(m.group(2))
    assert placed, proc.stderr[-4000:]
    on_cpu = sorted(op for op, devices in placed.items() if "CPU:0" in devices)
    for op in ("AssignAddVariableOp", "AssignSubVariableOp", "AssignVariableOp",
               "ReadVariableOp", "MatMul"):
        assert placed.get(op) == {"NPU:0"}, (op, placed.get(op), "CPU fallbacks:", on_cpu)
    assert {"MatMul", "AddV2", "Sub"} <= set(result["kernels"]), result
    assert result["loss"][0] > 0
