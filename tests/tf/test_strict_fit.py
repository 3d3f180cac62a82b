"""Keras 3 training with soft placement OFF: model.fit, evaluate and predict of a Dense MLP
with Adam, every op of the train step on the NPU or legitimately on the host (the tf.data
pipeline, int32 shape arithmetic), matched against the same fit on the CPU.

What makes it possible (docs/tf_plugin.md, "Soft placement off"): the iteration counter's int64
AddV2 and its Cast to float run on the chip (the op table's int64 rows, the compiler's
scalar-unit s64 kernels), Adam's Pow has an NPU kernel, and the data iterator's ops stay on the
CPU."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

EPOCHS, BATCH, SAMPLES = 2, 16, 48
STEPS = EPOCHS * SAMPLES // BATCH


def _mlp():
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data():
    rng = np.random.default_rng(4)
    return (rng.standard_normal((SAMPLES, 12)).astype(np.float32),
            rng.integers(0, 3, SAMPLES).astype(np.int64))


def _forward(weights, x):
    w1, b1, w2, b2 = weights
    return np.maximum(x @ w1 + b1, 0) @ w2 + b2


def test_keras_fit_evaluate_predict_with_soft_placement_off(npusim, tf, strict_placement):
    assert not tf.config.get_soft_device_placement()
    x, y = _data()
    runs = {}
    # The NPU run has no device scope: TensorFlow puts every op with an NPU kernel there (a
    # PluggableDevice outranks the CPU) and the rest, with no scope to violate, on the CPU.
    # Under tf.device("/NPU:0") eager conversions Keras makes outside the step (Cast of integer
    # inputs) would be requested on the NPU too.
    for device in ("/CPU:0", None):
        with tf.device(device):
            model = _mlp()  # same initial weights on both devices
            npusim.clear_launch_records()
            loss = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False,
                             verbose=0).history["loss"]
            records = npusim.launch_records()
            keys = npusim.compiled_ops()["keys"]
            weights = [w.numpy() for w in model.weights]
            evaluated = model.evaluate(x, y, batch_size=BATCH, verbose=0)
            predicted = model.predict(x, batch_size=BATCH, verbose=0)
        runs[device or "/NPU:0"] = (loss, weights, evaluated, predicted)
        if device == "/CPU:0":
            assert records == []
            continue
        device = "/NPU:0"
        assert model.optimizer.iterations.numpy() == STEPS
        for v in model.weights + model.optimizer.variables:
            assert v.value.device.endswith("device:NPU:0"), (v.path, v.value.device)

    # fp32 MatMul rounds its inputs to fp16 on the cube (default precision mode): after 6 Adam
    # steps the NPU's loss and weights stay within 1e-3 of the CPU's (test_training.py bounds).
    loss, weights, evaluated, predicted = runs["/NPU:0"]
    np.testing.assert_allclose(loss, runs["/CPU:0"][0], rtol=1e-3)
    for w_npu, w_cpu in zip(weights, runs["/CPU:0"][1]):
        np.testing.assert_allclose(w_npu, w_cpu, rtol=0, atol=1e-3)
    np.testing.assert_allclose(evaluated, runs["/CPU:0"][2], rtol=1e-3)
    # predict against a numpy forward pass of the trained weights (|logits| < 8: fp16 inputs
    # give errors of a few 1e-3).
    np.testing.assert_allclose(predicted, _forward(weights, x), rtol=0, atol=2e-2)

    for r in records:
        assert r["ok"], r["error"]
    kernels = {r["kernel"].split("_")[0] for r in records}
    # Adam's updates (chains and assigns) run as one FusedVariableUpdate per weight
    # (graph_fusion.h, rewrite 5).
    # The Dense layers' MatMul -> BiasAdd [-> Relu] run as one cube kernel each (MatMulBiasAdd,
    # graph_fusion.h rewrite 3b: the bias and ReLU in the MatMul kernel).
    assert {"MatMul", "ReluGrad", "SparseSoftmaxCrossEntropyWithLogits",
            "FusedVariableUpdate"} <= kernels, kernels
    assert any(r["op_type"] == "MatMulBiasAdd" for r in records)
    # The iteration counter: int64 iterations + 1 and its Cast to float32 on the chip.
    assert any(k.startswith("AddV2(s64[]") for k in keys), keys
    assert any(k.startswith("Cast(s64[]") for k in keys), keys


def test_int64_counter_ops_on_the_npu(npusim, tf, strict_placement):
    with tf.device("/NPU:0"):
        n = tf.Variable(np.int64(2**40 - 1))
        n.assign_add(tf.constant(np.int64(3)))
        a = tf.constant(np.array([-5, 7, 2**33], dtype=np.int64))
        s = a + tf.constant(np.int64(4))
        f = tf.cast(a, tf.float32)
        back = tf.cast(tf.constant(np.array([1.5, -2.5, 1e6], np.float32)), tf.int64)
    for t in (s, f, back):
        assert t.device.endswith("device:NPU:0"), t.device
    assert n.numpy() == 2**40 + 2
    np.testing.assert_array_equal(s.numpy(), [-1, 11, 2**33 + 4])
    np.testing.assert_array_equal(f.numpy(), np.array([-5, 7, 2**33], np.float32))
    np.testing.assert_array_equal(back.numpy(), [1, -2, 1000000])  # truncation, as C (TF)
