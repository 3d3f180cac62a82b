"""Keras' mixed_float16 policy on the NPU: the layers compute in fp16 (fp16 kernels on the chip),
variables stay fp32, Keras wraps the optimizer in a LossScaleOptimizer, and training tracks the
same mixed-precision training on the CPU."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def _fit(tf, device, x, y):
    with tf.device(device):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10),
            keras.layers.Activation("softmax", dtype="float32")])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        assert type(model.optimizer).__name__ == "LossScaleOptimizer"
        history = model.fit(x, y, batch_size=16, epochs=4, verbose=0, shuffle=False)
        return history.history["loss"], model


def test_mixed_float16_trains_with_loss_scaling(npusim, tf, mixed_float16):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int32)
    loss_cpu, _ = _fit(tf, "/CPU:0", x, y)
    npusim.clear_launch_records()
    loss_npu, model = _fit(tf, "/NPU:0", x, y)
    records = npusim.launch_records()
    assert all(r["ok"] for r in records)
    # Dense layers in fp16 on the cube: MatMul kernels of f16 operands ran.
    assert any(r["kernel"].startswith("MatMul") and "f16" in r["kernel"] for r in records), \
        sorted({r["kernel"] for r in records})
    assert model.layers[0].kernel.dtype == "float32"
    assert all(b < a for a, b in zip(loss_npu, loss_npu[1:])), loss_npu
    # Both runs compute the layers in fp16 (the CPU's fp16 MatMul rounds differently from the
    # cube's fp32 accumulation): epoch losses agree to fp16's few-ulp level, 2e-2 relative.
    np.testing.assert_allclose(loss_npu, loss_cpu, rtol=2e-2)
