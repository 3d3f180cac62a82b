"""Resource variables on the NPU: a tf.Variable created under /NPU:0 lives in device memory;
assign shares the value's buffer (TensorFlow's DEVICE_DEFAULT kernel, no launch), assign_add and
assign_sub compute the new value on the chip with the compiler's AddV2/Sub kernel
(adapter/tf/plugin/kernels_resource_variables.cpp), proved by the launch records. With soft
placement off, every op here runs on the NPU.

References are numpy computations written here: an f16/bf16 update adds in fp32 and rounds once
to the type, as the NPU's binary kernels and TensorFlow's CPU kernels do (the fp32 sum of two
f16/bf16 values is exact, so rounding it once is the correctly rounded result)."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import ml_dtypes  # noqa: E402  (a tensorflow dependency)

BF16 = ml_dtypes.bfloat16
FLOAT_TYPES = [np.float32, np.float16, BF16]


def _random(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    return rng.uniform(-4.0, 4.0, size=shape).astype(np.float32).astype(dtype)


def _rounded(values, dtype):
    return np.asarray(values, dtype=np.float32).astype(dtype)


def _kernels(npusim):
    records = npusim.launch_records()
    for r in records:
        assert r["ok"], r["error"]
        assert r["cycles"] > 0
    return [r["kernel"] for r in records]


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=lambda t: np.dtype(t).name)
def test_assign_add_sub_and_assign_on_the_npu(npusim, tf, strict_placement, dtype):
    init, a, b, c = (_random((5, 37), dtype, seed) for seed in (1, 2, 3, 4))
    with tf.device("/NPU:0"):
        v = tf.Variable(init)
        assert v.device.endswith("device:NPU:0"), v.device
        added, subtracted, assigned = tf.constant(a), tf.constant(b), tf.constant(c)
        npusim.clear_launch_records()
        v.assign_add(added)
        after_add = v.numpy()
        add_kernels = _kernels(npusim)
        npusim.clear_launch_records()
        v.assign_sub(subtracted)
        after_sub = v.numpy()
        sub_kernels = _kernels(npusim)
        npusim.clear_launch_records()
        v.assign(assigned)
        after_assign = v.numpy()
        assign_kernels = _kernels(npusim)

    expected_add = _rounded(init.astype(np.float32) + a.astype(np.float32), dtype)
    expected_sub = _rounded(expected_add.astype(np.float32) - b.astype(np.float32), dtype)
    np.testing.assert_array_equal(after_add, expected_add)
    np.testing.assert_array_equal(after_sub, expected_sub)
    np.testing.assert_array_equal(after_assign, c)
    # One update kernel each on the chip; assign only hands the buffer over.
    assert len(add_kernels) == 1 and add_kernels[0].startswith("AddV2"), add_kernels
    assert len(sub_kernels) == 1 and sub_kernels[0].startswith("Sub"), sub_kernels
    assert assign_kernels == []


def test_updates_in_a_tf_function(npusim, tf, strict_placement):
    # The graph path Keras' optimizers take: the placer puts the update ops on the NPU.
    init = _random((4, 64), np.float32, 5)
    delta = _random((4, 64), np.float32, 6)
    with tf.device("/NPU:0"):
        v = tf.Variable(init)
        d = tf.constant(delta)

        @tf.function
        def step():
            v.assign_add(d)
            v.assign_sub(d * 0.5)
            return v.read_value()

        npusim.clear_launch_records()
        out = step().numpy()
    expected = (init + delta) - np.float32(0.5) * delta
    np.testing.assert_array_equal(out, expected)
    kernels = _kernels(npusim)
    # Each update is one launch on the NPU: its AddV2 / Sub, or the graph pass's
    # FusedVariableUpdate of it (docs/tf_plugin.md "Optimizer updates").
    fused = sum(k.startswith("FusedVariableUpdate") for k in kernels)
    assert sum(k.startswith("AddV2") for k in kernels) + fused >= 1, kernels
    assert len([k for k in kernels if k.startswith(("AddV2", "Sub", "FusedVariableUpdate"))]) == 2, kernels


def test_update_shares_the_compiled_binary_op(npusim, tf, strict_placement):
    x = _random((16, 8), np.float32, 7)
    with tf.device("/NPU:0"):
        v = tf.Variable(x)
        t = tf.constant(x)
        _ = (t + t).numpy()  # an ordinary AddV2 of the same shape compiles the kernel
        before = npusim.compiled_ops()
        v.assign_add(t)
        after = npusim.compiled_ops()
    assert after["misses"] == before["misses"]
    assert after["hits"] == before["hits"] + 1
    assert any(k.startswith("AddV2(f32[16,8],f32[16,8])") for k in after["keys"])
    np.testing.assert_array_equal(v.numpy(), x + x)


def test_earlier_reads_keep_their_value(npusim, tf, strict_placement):
    # Copy-on-write, as in TensorFlow: an update writes a new buffer, so a tensor read before it
    # (sharing the old buffer) is unchanged.
    ones = np.ones((3, 5), dtype=np.float32)
    with tf.device("/NPU:0"):
        v = tf.Variable(ones)
        before = v.read_value()
        alias = tf.identity(v)
        v.assign_add(tf.constant(ones))
    np.testing.assert_array_equal(before.numpy(), ones)
    np.testing.assert_array_equal(alias.numpy(), ones)
    np.testing.assert_array_equal(v.numpy(), ones + ones)


def test_scalar_and_empty_variables(npusim, tf, strict_placement):
    with tf.device("/NPU:0"):
        s = tf.Variable(np.float32(1.5))
        s.assign_sub(tf.constant(np.float32(0.25)))
        e = tf.Variable(np.zeros((0, 4), dtype=np.float32))
        npusim.clear_launch_records()
        e.assign_add(tf.constant(np.zeros((0, 4), dtype=np.float32)))
        assert _kernels(npusim) == []  # nothing to compute
    assert s.numpy() == np.float32(1.25)
    assert e.numpy().shape == (0, 4)


def test_update_errors_are_op_errors(npusim, tf, strict_placement):
    x = np.ones((2, 3), dtype=np.float32)
    with tf.device("/NPU:0"):
        v = tf.Variable(x)
        with pytest.raises(tf.errors.InvalidArgumentError, match="shapes must be equal"):
            v.assign_add(tf.constant(np.ones((3, 2), dtype=np.float32)))
        # float64 lives on the NPU (TensorFlow's DEVICE_DEFAULT VarHandleOp) but no compiled
        # kernel takes it: the update is refused and the variable left as it was.
        n = tf.Variable(np.float64(7))
        assert n.device.endswith("device:NPU:0"), n.device
        with pytest.raises(tf.errors.UnimplementedError, match="float64|f64"):
            n.assign_add(tf.constant(np.float64(1)))
        v.assign_add(tf.constant(x))  # the device still works
    assert n.numpy() == 7
    np.testing.assert_array_equal(v.numpy(), x + x)


def test_sparse_read_is_refused_not_a_crash(tf):
    # TensorFlow's DEVICE_DEFAULT ResourceGather is CPU code; on the NPU it would read device
    # addresses as host pointers. The plugin's NPU kernel refuses instead.
    with tf.device("/NPU:0"):
        v = tf.Variable(np.arange(6, dtype=np.float32).reshape(3, 2))
        with pytest.raises(tf.errors.UnimplementedError, match="ResourceGather"):
            v.sparse_read([0, 2])
        v.assign(np.full((3, 2), 5.0, dtype=np.float32))
    np.testing.assert_array_equal(v.numpy(), np.full((3, 2), 5.0, dtype=np.float32))
