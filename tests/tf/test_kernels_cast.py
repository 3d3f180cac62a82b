"""Cast and IsFinite on the NPU against TensorFlow's CPU kernels.

Every (SrcT, DstT) pair the plugin registers (adapter/tf/plugin/kernels_cast.cpp) runs on edge
values of its source type with soft placement off, and must equal TF's CPU Cast exactly (NaN
where TF gives NaN, the sign of zeros). Values whose TF result is undefined behaviour (NaN,
infinities and out-of-range floats cast to integers) are left out there and checked against the
NPU's saturating rule, written out in numpy (x86's INT_MIN is not a reference). IsFinite runs on NaN, +-Inf,
denormals and the largest values. The int32 -> float Cast of Keras' losses runs on the chip in
eager, in a tf.function and inside model.fit, and the main job no longer warns about Cast."""

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import ml_dtypes  # noqa: E402  (a tensorflow dependency)

from conftest import ROOT, child_env  # noqa: E402

BF16 = ml_dtypes.bfloat16
FLOATS = [np.float32, np.float16, BF16]
INTS = [np.int32, np.int16, np.uint16, np.int8, np.uint8]  # int64 apart: every pair
ALL = FLOATS + INTS + [np.bool_, np.int64]


def _name(t):
    return np.dtype(t).name


def _int_sources(dst):
    """The narrower integers whose values dst holds (kernels_cast.cpp: widening only)."""
    d = np.iinfo(dst)
    return [s for s in INTS if np.dtype(s).itemsize < np.dtype(dst).itemsize
            and np.iinfo(s).min >= d.min and np.iinfo(s).max <= d.max]


def _registered_pairs():
    """The (src, dst) pairs kernels_cast.cpp registers, from its rule."""
    pairs = []
    for dst in ALL:
        if dst in FLOATS or dst in (np.bool_, np.int64):
            srcs = ALL
        else:
            # bool -> every integer (to int8 / uint8 the compiler copies the 0 / 1 bytes).
            srcs = FLOATS + [np.int64, dst] + _int_sources(dst) + [np.bool_]
        pairs += [(s, dst) for s in srcs]
    return pairs


PAIRS = _registered_pairs()


def _edge_values(src):
    """Edge values of src: zeros, signs, halves (rounding toward zero), rounding boundaries of
    the narrower floats, the type's extremes, and for floats denormals, infinities and NaN."""
    if src == np.bool_:
        return np.array([False, True, True, False])
    if src in FLOATS:
        info = ml_dtypes.finfo(src) if src == BF16 else np.finfo(src)
        v = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -2.5, 0.999, 2049.0, 2051.0, 127.0, -128.0,
             255.0, 256.5, 32767.0, -32768.0, 65504.0, 65519.0, 65520.0, 16777217.0, 1e10,
             -3e9, 2.0**31, 1e-8, 1e-40, float(info.max), -float(info.max),
             float(info.tiny), float(info.smallest_subnormal), np.inf, -np.inf, np.nan]
        with np.errstate(over="ignore"):  # beyond f16 / bf16: infinities
            return np.array(v, np.float64).astype(np.float32).astype(src)
    info = np.iinfo(src)
    v = [0, 1, -1, 2, -2, 127, -128, 128, 255, 256, 2049, 2051, 32767, -32768, 65535, 65536,
         16777217, 16777219, -16777217, 2**31 - 1, -2**31, 2**53 + 1, -(2**53) - 3,
         int(info.max), int(info.min), int(info.max) - 1, int(info.min) + 1]
    return np.array([x for x in v if info.min <= x <= info.max], src)


def _defined(x, dst):
    """The values of x whose cast to dst TF defines (not NaN / out of range into integers).
    f32 denormals cast to bool are left out too: TF's CPU threads run with denormals-are-zero,
    so its Cast gives False where the NPU (and numpy) give x != 0, True."""
    if x.dtype == np.float32 and dst == np.bool_:
        return x[(x == 0) | ~(np.abs(x) < np.finfo(np.float32).tiny)]
    if dst in FLOATS or dst == np.bool_ or x.dtype == np.bool_:
        return x
    if x.dtype.kind == "f" or x.dtype == BF16:
        f = x.astype(np.float64)
        info = np.iinfo(dst)
        with np.errstate(invalid="ignore"):
            t = np.trunc(f)
            keep = np.isfinite(f) & (t >= info.min) & (t <= info.max)
        return x[keep]
    return x  # integer sources: TF wraps, as the NPU


def _as_comparable(a):
    """Floats as float64 (NaN and signed zeros kept), the rest as they are."""
    if a.dtype == BF16 or a.dtype.kind == "f":
        return a.astype(np.float64)
    return a


def _assert_same(got, want):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    g, w = _as_comparable(got), _as_comparable(want)
    np.testing.assert_array_equal(g, w)
    if g.dtype == np.float64:
        np.testing.assert_array_equal(np.signbit(g[g == 0]), np.signbit(w[w == 0]))


def test_registered_cast_pairs_match_the_table(tf):
    from tensorflow.python.framework import kernels  # pylint: disable=import-outside-toplevel

    registered = set()
    for k in kernels.get_registered_kernels_for_op("Cast").kernel:
        if k.device_type != "NPU":
            continue
        c = {x.name: [tf.as_dtype(t).as_numpy_dtype for t in x.allowed_values.list.type]
             for x in k.constraint}
        pairs = {(np.dtype(s).name, np.dtype(d).name) for s in c["SrcT"] for d in c["DstT"]}
        assert not pairs & registered, "two NPU registrations match " + str(pairs & registered)
        registered |= pairs
    assert registered == {(_name(s), _name(d)) for s, d in PAIRS}


@pytest.mark.parametrize("src,dst", PAIRS, ids=[f"{_name(s)}-{_name(d)}" for s, d in PAIRS])
def test_cast_pair_matches_tf_cpu(npusim, tf, strict_placement, src, dst):
    x = _defined(_edge_values(src), dst)
    # Shape [2, n]: the values twice, in a 2-D tensor.
    x = np.stack([x, x[::-1]])
    tf_dst = tf.as_dtype(np.dtype(dst))
    with tf.device("/CPU:0"):
        want = tf.raw_ops.Cast(x=tf.constant(x), DstT=tf_dst).numpy()
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        out = tf.raw_ops.Cast(x=tf.constant(x), DstT=tf_dst)
    assert out.device.endswith("device:NPU:0"), out.device
    _assert_same(out.numpy(), want)
    records = npusim.launch_records()
    assert any(r["kernel"].startswith("Cast") for r in records), records
    assert all(r["ok"] for r in records), records


def _saturating_cast(x, dst):
    """The NPU's float -> integer rule (the vector unit's vconv, docs/tf_plugin.md), written out
    in Python integers: NaN -> 0; otherwise truncate toward zero and clamp to dst's range
    (the infinities too)."""
    info = np.iinfo(dst)

    def one(v):
        if np.isnan(v):
            return 0
        if np.isinf(v):
            return info.max if v > 0 else info.min
        return min(max(int(v), int(info.min)), int(info.max))  # int() truncates toward zero

    return np.array([one(float(v)) for v in x.astype(np.float64).ravel()], dst).reshape(x.shape)


FLOAT_TO_INT = [(s, d) for s, d in PAIRS if s in FLOATS and d not in FLOATS + [np.bool_]]


@pytest.mark.parametrize("src,dst", FLOAT_TO_INT,
                         ids=[f"{_name(s)}-{_name(d)}" for s, d in FLOAT_TO_INT])
def test_float_to_integer_cast_saturates(npusim, tf, strict_placement, src, dst):
    # NaN, the infinities and values outside dst's range, where TF's CPU Cast is undefined
    # behaviour (x86 gives INT_MIN for all of them), and the in-range values next to the edges.
    d = np.iinfo(dst)
    v = [np.nan, np.inf, -np.inf, 1e20, -1e20, 3e9, -3e9, 2.0**31, -(2.0**31) - 512, 2.0**63,
         -(2.0**63), 70000, -70000, 300, -300, 255.9, 65535.9, -1.0, -0.5, 0.5,
         float(d.max) + 1, float(d.min) - 1, float(d.max), float(d.min)]
    with np.errstate(over="ignore"):
        x = np.array(v, np.float64).astype(np.float32).astype(src)
    x = np.stack([x, x[::-1]])
    want = _saturating_cast(x, dst)
    assert (want == d.max).any() and (want == d.min).any() and (want != 0).any()
    with tf.device("/NPU:0"):
        out = tf.raw_ops.Cast(x=tf.constant(x), DstT=tf.as_dtype(np.dtype(dst)))
    assert out.device.endswith("device:NPU:0"), out.device
    _assert_same(out.numpy(), want)


@pytest.mark.parametrize("dtype", FLOATS, ids=_name)
def test_is_finite_matches_tf_cpu(npusim, tf, strict_placement, dtype):
    x = np.tile(_edge_values(dtype), 5)[:-3].reshape(2, -1)  # 2 x 81, not a multiple of 16
    with tf.device("/CPU:0"):
        want = tf.math.is_finite(tf.constant(x)).numpy()
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        out = tf.math.is_finite(tf.constant(x))
    assert out.device.endswith("device:NPU:0"), out.device
    np.testing.assert_array_equal(out.numpy(), want)
    np.testing.assert_array_equal(want, np.isfinite(x.astype(np.float64)))
    assert any(r["kernel"].startswith("IsFinite") for r in npusim.launch_records())


def test_int32_to_float_cast_in_a_tf_function(npusim, tf, strict_placement):
    labels = np.array([0, 2, 1, -7, 2**24 + 1, 2**31 - 1], np.int32)

    @tf.function
    def scaled(y):
        return tf.cast(y, tf.float32) * 2.0

    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        out = scaled(tf.constant(labels))
    assert out.device.endswith("device:NPU:0"), out.device
    np.testing.assert_array_equal(out.numpy(), labels.astype(np.float32) * 2)
    assert any(r["kernel"].startswith("Cast_s32_f32") for r in npusim.launch_records())


def test_int32_label_cast_runs_on_the_chip_inside_fit(npusim, tf, strict_placement):
    # Soft placement off and no device scope: fit fails if a Cast has no NPU kernel and is
    # pinned to the NPU, and the int32 labels' cast must be compiled for the chip.
    import keras  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, 12)).astype(np.float32)
    y = rng.integers(0, 3, 32).astype(np.int32)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(optimizer="sgd",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    loss = model.fit(x, y, batch_size=16, epochs=1, verbose=0).history["loss"]
    assert np.isfinite(loss[0])
    keys = npusim.compiled_ops()["keys"]
    assert any(k.startswith("Cast(s32[") for k in keys), keys


def test_main_job_does_not_fall_back_for_cast(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "models.train_demo", "--chip", "tiny", "--samples", "128",
         "--report-dir", str(tmp_path / "report")],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "op Cast has no NPU kernel" not in out, out[-3000:]
