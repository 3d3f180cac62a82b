"""Stateless random numbers and Keras 3 Dropout on the NPU.

tf.random.stateless_uniform (StatelessRandomGetKeyCounter + StatelessRandomUniformV2, Philox
on the chip's vector or scalar unit: adapter/compiler/ops/random.h) must give TensorFlow's CPU bits for
the same seed, for f32, f16 and bf16, with soft placement off. Keras 3's Dropout draws its mask
that way after reducing its int64 seed state with FloorMod; a Dense + Dropout MLP trains with
soft placement off, matches the CPU fit (same seed: the same masks), and none of those ops
falls back to the CPU."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from conftest import chip_config  # noqa: E402  pylint: disable=wrong-import-position


# The ops of Dropout's path that used to run on the CPU.
DROPOUT_OPS = {"StatelessRandomUniformV2", "StatelessRandomGetKeyCounter", "FloorMod"}


def _bits(a):
    a = np.asarray(a)
    return a.view({4: np.uint32, 2: np.uint16}[a.dtype.itemsize])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_stateless_uniform_matches_tf_cpu_bit_for_bit(npusim, tf, strict_placement, dtype):
    # Below 33 Philox groups (132 elements) on the scalar unit, from there on the vector unit
    # (several tiles and blocks, ragged tails: 5005 and 6147 are not whole groups).
    cases = [((1,), (0, 0)), ((7,), (1, 2)), ((3, 5), (-5, 123456789)),
             ((2, 3, 33), (2**31 - 1, -2**31)), ((0, 4), (3, 4)),
             ((5, 1001), (7, -9)), ((3, 2049), (-123, 2**31 - 5))]
    for shape, seed in cases:
        for seed_dtype in (tf.int32, tf.int64):
            with tf.device("/CPU:0"):
                want = tf.random.stateless_uniform(
                    shape, seed=tf.constant(seed, seed_dtype), dtype=dtype).numpy()
            npusim.clear_launch_records()
            with tf.device("/NPU:0"):
                got = tf.random.stateless_uniform(
                    shape, seed=tf.constant(seed, seed_dtype), dtype=dtype)
            assert got.device.endswith("device:NPU:0"), got.device
            got = got.numpy()
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"{shape} {seed}")
            records = npusim.launch_records()
            assert all(r["ok"] for r in records), records
            kernels = {r["kernel"] for r in records}
            assert "RandomKeyCounter" in kernels, kernels
            if np.prod(shape) > 0:
                assert any(k.startswith("RandomUniform_") for k in kernels), kernels


def test_raw_uniform_v2_with_explicit_key_counter(npusim, tf, strict_placement):
    """Key and counter given directly (uint64 tensors), a counter whose low word wraps within
    the tensor (carry into the high word), alg 1 (Philox) and 3 (auto-select)."""
    key = np.array([0x0123456789ABCDEF], np.uint64)
    counter = np.array([2**64 - 3, 17], np.uint64)
    for alg in (1, 3):
        args = dict(shape=[5, 9], key=key, counter=counter, alg=alg, dtype=tf.float32)
        with tf.device("/CPU:0"):
            want = tf.raw_ops.StatelessRandomUniformV2(**args).numpy()
        with tf.device("/NPU:0"):
            got = tf.raw_ops.StatelessRandomUniformV2(**args)
        assert got.device.endswith("device:NPU:0"), got.device
        np.testing.assert_array_equal(_bits(got.numpy()), _bits(want))


def test_int64_floor_mod_on_the_npu(npusim, tf, strict_placement):
    a = np.array([-7, 7, -2**40, 2**62 + 5, 0, 13], np.int64)
    b = np.array([3, -3, 2**31 - 2, 2**31 - 2, 5, -13], np.int64)
    with tf.device("/NPU:0"):
        mod = tf.math.floormod(tf.constant(a), tf.constant(b))
        div = tf.math.floordiv(tf.constant(a), tf.constant(b))
    assert mod.device.endswith("device:NPU:0") and div.device.endswith("device:NPU:0")
    np.testing.assert_array_equal(mod.numpy(), np.mod(a, b))
    np.testing.assert_array_equal(div.numpy(), np.floor_divide(a, b))


def _dropout_mlp():
    keras.utils.set_random_seed(11)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(0.5, seed=3), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_keras_dropout_fit_on_the_npu_with_soft_placement_off(npusim, tf, strict_placement):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((32, 12)).astype(np.float32)
    y = rng.integers(0, 3, 32).astype(np.int64)
    runs = {}
    for device in ("/CPU:0", None):  # None: no scope, every op with an NPU kernel goes there
        with tf.device(device):
            model = _dropout_mlp()
            npusim.clear_cpu_fallback_ops()
            npusim.clear_launch_records()
            loss = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
            runs[device] = loss.history["loss"], [w.numpy() for w in model.weights]
    records = npusim.launch_records()
    assert all(r["ok"] for r in records), [r for r in records if not r["ok"]]
    kernels = {r["kernel"] for r in records}
    if "ai_cpu" in chip_config():
        # A chip with an AI CPU (the 910 preset): the dropout's mask is one
        # DropOutGenMask task there (graph_fusion.h rewrite 18; test_gen_mask.py checks the
        # task and its mask), no RandomUniform kernel.
        assert not any(k.startswith("RandomUniform") for k in kernels), kernels
    else:
        assert "RandomKeyCounter" in kernels and "RandomUniform_f32" in kernels, kernels
    assert "FloorMod_s64" in kernels, kernels
    fallbacks = npusim.cpu_fallback_ops()
    assert not DROPOUT_OPS & set(fallbacks), fallbacks
    # The same masks on both devices (bit-exact random numbers from the same seed state): the
    # losses and weights differ only by the fp16 rounding of MatMul inputs on the cube
    # (test_strict_fit.py's bounds).
    np.testing.assert_allclose(runs[None][0], runs["/CPU:0"][0], rtol=1e-3)
    for w_npu, w_cpu in zip(runs[None][1], runs["/CPU:0"][1]):
        np.testing.assert_allclose(w_npu, w_cpu, rtol=0, atol=1e-3)


def test_stateful_random_uniform_matches_tf_cpu(npusim, tf, strict_placement):
    """RandomUniform with op seeds: TF's generator state (PhiloxRandom(seed, seed2), advanced by
    n * 256 groups per run) kept per kernel on the host; three runs of one node in a
    tf.function give the CPU's three tensors bit for bit."""
    for dtype in (tf.float32, tf.float16, tf.bfloat16):
        def draws():
            @tf.function
            def draw():
                return tf.raw_ops.RandomUniform(shape=[3, 7], dtype=dtype, seed=1234, seed2=99)
            return [draw().numpy() for _ in range(3)]

        with tf.device("/CPU:0"):
            want = draws()
        npusim.clear_launch_records()
        with tf.device("/NPU:0"):
            got = draws()
        assert any(r["kernel"].startswith("RandomUniform_") for r in npusim.launch_records())
        for g, w in zip(got, want):
            np.testing.assert_array_equal(_bits(g), _bits(w))
        assert not np.array_equal(_bits(got[0]), _bits(got[1]))  # the state advanced


LEGACY_DROPOUT_FIT = r"""
import os
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import npusim
import tensorflow as tf
import tf_keras as keras
tf.config.set_soft_device_placement(False)
keras.utils.set_random_seed(1)
m = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                      keras.layers.Dropout(0.5), keras.layers.Dense(3)])
m.compile(optimizer=keras.optimizers.legacy.SGD(0.05),
          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
rng = np.random.default_rng(0)
x = rng.standard_normal((32, 12)).astype(np.float32)
y = rng.integers(0, 3, 32).astype(np.int64)
npusim.clear_cpu_fallback_ops()
loss = m.fit(x, y, batch_size=16, epochs=2, verbose=0).history["loss"]
assert all(np.isfinite(loss)), loss
print("FALLBACKS", sorted(npusim.cpu_fallback_ops()))
print("KERNELS", sorted({r["kernel"] for r in npusim.launch_records()}))
"""


def test_tf_keras_dropout_fit_without_random_fallback():
    """tf-keras' Dropout draws with the stateful RandomUniform: on the chip now (child process:
    TF_USE_LEGACY_KERAS must be set before Keras loads)."""
    pytest.importorskip("tf_keras")
    from conftest import run_child  # pylint: disable=import-outside-toplevel

    r = run_child(LEGACY_DROPOUT_FIT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines()
                 if line.startswith(("FALLBACKS", "KERNELS")))
    assert "RandomUniform" not in lines["FALLBACKS"], lines
    assert "RandomUniform_f32" in lines["KERNELS"], lines
