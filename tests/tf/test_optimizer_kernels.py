"""The fused optimizer updates on the NPU (kernels_optimizer.cpp), called as raw ops on NPU
variables with soft placement off, against numpy references written here in float32 in
TensorFlow's functor order (training_ops.cc), so the results must match bit for bit: every step
is one IEEE float32 operation on both sides. The launch records show the updates ran on the
chip; an earlier read of a variable keeps its value (new buffers, as TF's copy-on-write)."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")

F32 = np.float32
SHAPE = (5, 37)


def _rand(seed, lo=-2.0, hi=2.0):
    return np.random.default_rng(seed).uniform(lo, hi, SHAPE).astype(F32)


def _kernels(npusim):
    records = npusim.launch_records()
    for r in records:
        assert r["ok"], r["error"]
    return {r["kernel"].split("_")[0] for r in records}


def test_apply_gradient_descent(npusim, tf, strict_placement):
    var0, delta, alpha = _rand(1), _rand(2), F32(0.125)
    with tf.device("/NPU:0"):
        var = tf.Variable(var0)
        before = var.read_value()
        npusim.clear_launch_records()
        tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=tf.constant(alpha),
                                                delta=tf.constant(delta))
    assert "ApplyGradientDescent" in _kernels(npusim)
    np.testing.assert_array_equal(var.numpy(), var0 - delta * alpha)
    np.testing.assert_array_equal(before.numpy(), var0)


@pytest.mark.parametrize("nesterov", [False, True])
def test_apply_momentum(npusim, tf, strict_placement, nesterov):
    var0, accum0, grad = _rand(3), _rand(4), _rand(5)
    lr, momentum = F32(0.05), F32(0.9)
    with tf.device("/NPU:0"):
        var, accum = tf.Variable(var0), tf.Variable(accum0)
        npusim.clear_launch_records()
        tf.raw_ops.ResourceApplyMomentum(var=var.handle, accum=accum.handle, lr=tf.constant(lr),
                                         grad=tf.constant(grad), momentum=tf.constant(momentum),
                                         use_nesterov=nesterov)
    assert "ApplyMomentum" in _kernels(npusim)
    accum1 = accum0 * momentum + grad
    var1 = var0 - (grad * lr + accum1 * momentum * lr) if nesterov else var0 - accum1 * lr
    np.testing.assert_array_equal(accum.numpy(), accum1)
    np.testing.assert_array_equal(var.numpy(), var1)


@pytest.mark.parametrize("nesterov", [False, True])
def test_apply_keras_momentum(npusim, tf, strict_placement, nesterov):
    var0, accum0, grad = _rand(6), _rand(7), _rand(8)
    lr, momentum = F32(0.05), F32(0.9)
    with tf.device("/NPU:0"):
        var, accum = tf.Variable(var0), tf.Variable(accum0)
        npusim.clear_launch_records()
        tf.raw_ops.ResourceApplyKerasMomentum(
            var=var.handle, accum=accum.handle, lr=tf.constant(lr), grad=tf.constant(grad),
            momentum=tf.constant(momentum), use_nesterov=nesterov)
    assert {"Mul", "Sub", "AddV2"} <= _kernels(npusim)
    accum1 = accum0 * momentum - grad * lr
    var1 = var0 + (accum1 * momentum - grad * lr) if nesterov else var0 + accum1
    np.testing.assert_array_equal(accum.numpy(), accum1)
    np.testing.assert_array_equal(var.numpy(), var1)


def test_apply_adam(npusim, tf, strict_placement):
    var0, m0, grad = _rand(9), _rand(10), _rand(11)
    v0 = _rand(12, 0.0, 1.0)
    b1p, b2p, lr, b1, b2, eps = (F32(0.81), F32(0.998), F32(0.01), F32(0.9), F32(0.999),
                                 F32(1e-7))
    with tf.device("/NPU:0"):
        var, m, v = tf.Variable(var0), tf.Variable(m0), tf.Variable(v0)
        npusim.clear_launch_records()
        tf.raw_ops.ResourceApplyAdam(
            var=var.handle, m=m.handle, v=v.handle, beta1_power=tf.constant(b1p),
            beta2_power=tf.constant(b2p), lr=tf.constant(lr), beta1=tf.constant(b1),
            beta2=tf.constant(b2), epsilon=tf.constant(eps), grad=tf.constant(grad))
    assert "ApplyAdam" in _kernels(npusim)
    alpha = lr * np.sqrt(F32(1) - b2p) / (F32(1) - b1p)
    m1 = m0 + (grad - m0) * (F32(1) - b1)
    v1 = v0 + (grad * grad - v0) * (F32(1) - b2)
    np.testing.assert_array_equal(m.numpy(), m1)
    np.testing.assert_array_equal(v.numpy(), v1)
    np.testing.assert_array_equal(var.numpy(), var0 - (m1 * alpha) / (np.sqrt(v1) + eps))


def test_apply_errors_leave_the_variables_unchanged(npusim, tf, strict_placement):
    var0 = _rand(13)
    with tf.device("/NPU:0"):
        var = tf.Variable(var0)
        with pytest.raises(tf.errors.InvalidArgumentError, match="same shape"):
            tf.raw_ops.ResourceApplyGradientDescent(
                var=var.handle, alpha=tf.constant(F32(1)),
                delta=tf.constant(np.ones((2, 2), F32)))
        with pytest.raises(tf.errors.InvalidArgumentError, match="not a scalar"):
            tf.raw_ops.ResourceApplyGradientDescent(
                var=var.handle, alpha=tf.constant(np.ones(2, F32)), delta=tf.constant(var0))
    np.testing.assert_array_equal(var.numpy(), var0)
