"""Keras 3 with the NPU present: jit_compile="auto" stays off XLA (which cannot compile for the
NPU), and a Dense layer's inference (model.predict, a tf.function) runs its MatMul on the chip.
Keras 3.15's Dense adds its bias with BiasAdd, which also has an NPU kernel (see
test_kernels_nn.py)."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


def _dense_model():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_auto_jit_compile_resolves_to_false(npusim, tf):  # pylint: disable=unused-argument
    assert [d.device_type for d in tf.config.list_physical_devices("NPU")] == ["NPU"]
    model = _dense_model()
    assert model.jit_compile is False


def test_dense_inference_runs_on_the_npu(npusim, tf):
    model = _dense_model()
    kernel, bias = (w.astype(np.float32) for w in model.get_weights())
    # Small integers and halves: exact in fp16 (MatMul casts fp32 inputs to fp16 on the cube in
    # the default precision mode) and in every accumulation order.
    x = np.random.default_rng(3).integers(-3, 4, size=(16, 8)).astype(np.float32)
    kernel = np.round(kernel * 4) / 4
    bias = np.round(bias * 4 + 1) / 4
    model.set_weights([kernel, bias])
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        y = model.predict(x, verbose=0)
    np.testing.assert_array_equal(y, x @ kernel + bias)
    kernels = {r["kernel"].split("_")[0] for r in npusim.launch_records()}
    assert "MatMul" in kernels, kernels
