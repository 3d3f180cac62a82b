"""NPU kernels under TensorFlow: with soft placement off, each registered op runs on /NPU:0,
gives numpy's result, and the runtime's launch records show its kernels ran on the chip. An op
without an NPU kernel fails with TensorFlow's placement error, or falls back to the CPU with
soft placement on.

References are numpy computations written here: element-wise f16/bf16 ops compute in fp32 and
round once to the type (adapter/compiler/ops/binary.cpp, unary.cpp state this is what the NPU
and TF's CPU kernels do); MatMul inputs are small integers, so the product is exact under every
precision mode."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import ml_dtypes  # noqa: E402  (a tensorflow dependency)
from conftest import chip_config  # noqa: E402  pylint: disable=wrong-import-position

BF16 = ml_dtypes.bfloat16
FLOAT_TYPES = [np.float32, np.float16, BF16]


def _on_npu(npusim, tf, fn, *inputs):
    """Runs fn on /NPU:0; returns (result as numpy, the launch records it added)."""
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        tensors = [tf.constant(x) for x in inputs]
        out = fn(*tensors)
    assert out.device.endswith("device:NPU:0"), out.device
    records = npusim.launch_records()
    return out.numpy(), records


def _assert_ran_on_chip(records, op):
    """The op's kernel (named after it, e.g. AddV2_f32) ran on the chip, and every launch of
    the op (f32 MatMul also casts its inputs to fp16 first) completed."""
    assert any(r["kernel"].startswith(op) for r in records), (op, records)
    for r in records:
        assert r["ok"], r["error"]
        assert r["cycles"] > 0


def _random(shape, dtype, seed, lo=-4.0, hi=4.0):
    rng = np.random.default_rng(seed)
    return rng.uniform(lo, hi, size=shape).astype(np.float32).astype(dtype)


BINARY = {
    "AddV2": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "RealDiv": np.divide,
    "Maximum": np.maximum,
    "Minimum": np.minimum,
}


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_op_runs_on_npu(npusim, tf, strict_placement, op, dtype):
    a = _random((5, 37), dtype, 1)
    b = _random((5, 37), dtype, 2, lo=0.5, hi=4.0)  # no division by ~0
    got, records = _on_npu(npusim, tf, lambda x, y: getattr(tf.raw_ops, op)(x=x, y=y), a, b)
    want = BINARY[op](a.astype(np.float32), b.astype(np.float32)).astype(dtype)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)
    _assert_ran_on_chip(records, op)


@pytest.mark.parametrize("op", ["AddV2", "Sub", "Mul", "Maximum", "Minimum",
                                "SquaredDifference", "Less", "Equal"])
def test_bf16_binary_op_matches_tf_cpu(npusim, tf, strict_placement, op):
    """bf16 on a chip whose vector unit has no bf16 arithmetic (vector.bf16_arithmetic false:
    the 910b / 310p presets the test chips derive from): the kernel widens to f32 and rounds
    back once per TF op; bit-identical to TF's own CPU kernel, at an odd broadcast shape with
    ties."""
    assert chip_config()["vector"].get("bf16_arithmetic", True) is False
    a = _random((7, 131), BF16, 11)
    b = _random((131,), BF16, 12)
    a[0, :9] = b[:9]
    fn = lambda x, y: getattr(tf.raw_ops, op)(x=x, y=y)  # noqa: E731
    got, records = _on_npu(npusim, tf, fn, a, b)
    with tf.device("/CPU:0"):
        want = fn(tf.constant(a), tf.constant(b)).numpy()
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    _assert_ran_on_chip(records, op)


def test_broadcast_add_of_a_bias_row(npusim, tf, strict_placement):
    # Keras Dense adds its bias like this (AddV2 of [batch, units] and [units]).
    x = _random((8, 40), np.float32, 3)
    bias = _random((40,), np.float32, 4)
    got, records = _on_npu(npusim, tf, lambda p, q: p + q, x, bias)
    np.testing.assert_array_equal(got, x + bias)
    _assert_ran_on_chip(records, "AddV2")


def test_squared_difference_and_comparisons(npusim, tf, strict_placement):
    a = _random((3, 50), np.float32, 5)
    b = _random((3, 50), np.float32, 6)
    b[0, :10] = a[0, :10]  # some equal elements
    got, records = _on_npu(npusim, tf, tf.math.squared_difference, a, b)
    np.testing.assert_array_equal(got, np.square(a - b))
    _assert_ran_on_chip(records, "SquaredDifference")
    for op, ref in [("Equal", np.equal), ("NotEqual", np.not_equal), ("Less", np.less),
                    ("LessEqual", np.less_equal), ("Greater", np.greater),
                    ("GreaterEqual", np.greater_equal)]:
        got, records = _on_npu(npusim, tf, lambda x, y, o=op: getattr(tf.raw_ops, o)(x=x, y=y),
                               a, b)
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, ref(a, b), err_msg=op)
        _assert_ran_on_chip(records, op)


def test_div_no_nan_gives_zero_where_the_divisor_is_zero(npusim, tf, strict_placement):
    # Adam's bias correction uses DivNoNan; x / 0 must be 0, not inf or nan.
    a = _random((4, 33), np.float32, 11)
    b = _random((4, 33), np.float32, 12, lo=0.5, hi=4.0)
    b[1, ::3] = 0
    got, records = _on_npu(npusim, tf, lambda x, y: tf.raw_ops.DivNoNan(x=x, y=y), a, b)
    want = np.where(b == 0, np.float32(0), a / np.where(b == 0, np.float32(1), b))
    np.testing.assert_array_equal(got, want)
    _assert_ran_on_chip(records, "DivNoNan")


@pytest.mark.parametrize("dtype", [np.int32, np.int16, np.uint16], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr"])
def test_bitwise_op_runs_on_npu_as_on_the_cpu(npusim, tf, strict_placement, op, dtype):
    # Every bit pattern of the type, with a broadcast row and a broadcast scalar (Keras'
    # argmax tests a float's sign bit as Bitcast(x, int32) & INT32_MIN).
    info = np.iinfo(dtype)
    rng = np.random.default_rng(21)
    a = rng.integers(info.min, info.max, size=(5, 37), endpoint=True).astype(dtype)
    for b in (rng.integers(info.min, info.max, size=(5, 37), endpoint=True).astype(dtype),
              rng.integers(info.min, info.max, size=(37,), endpoint=True).astype(dtype),
              np.array(info.min if info.min else info.max, dtype)):
        fn = lambda x, y: getattr(tf.raw_ops, op)(x=x, y=y)  # noqa: E731
        got, records = _on_npu(npusim, tf, fn, a, b)
        with tf.device("/CPU:0"):
            want = fn(tf.constant(a), tf.constant(b)).numpy()
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, (np.bitwise_and if op == "BitwiseAnd"
                                            else np.bitwise_or)(a, b))
        _assert_ran_on_chip(records, op)
    if op == "BitwiseAnd":  # once per dtype
        got, records = _on_npu(npusim, tf, lambda x: tf.raw_ops.Invert(x=x), a)
        np.testing.assert_array_equal(got, np.invert(a))
        _assert_ran_on_chip(records, "Invert")


# op -> (reference, largest error in units of the last place of fp32, input range). Exact ops
# are computed in fp32 (one IEEE rounding, as on the chip). Exp, Log and Rsqrt are compared with
# the correctly rounded value (computed in fp64, rounded once): the chip's expf/logf are
# faithful (within 1 ulp), and 1/sqrt(x) rounds twice in fp32.
UNARY = {
    "Neg": (np.negative, 0, (-4, 4)),
    "Abs": (np.abs, 0, (-4, 4)),
    "Square": (np.square, 0, (-4, 4)),
    "Relu": (lambda x: np.maximum(x, np.float32(0)), 0, (-4, 4)),
    "Sqrt": (np.sqrt, 0, (0.1, 9)),
    "Reciprocal": (lambda x: np.float32(1) / x, 0, (0.5, 4)),
    "Rsqrt": (lambda x: 1.0 / np.sqrt(x.astype(np.float64)), 1, (0.1, 9)),
    "Exp": (lambda x: np.exp(x.astype(np.float64)), 1, (-4, 4)),
    "Log": (lambda x: np.log(x.astype(np.float64)), 1, (0.1, 9)),
    "Floor": (np.floor, 0, (-4, 4)),
    "Ceil": (np.ceil, 0, (-4, 4)),
    "Round": (np.round, 0, (-4, 4)),  # half to even, as TF's Round
    "Sign": (np.sign, 0, (-4, 4)),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_op_runs_on_npu(npusim, tf, strict_placement, op, dtype):
    ref, ulps, (lo, hi) = UNARY[op]
    x = _random((4, 45), dtype, 7, lo, hi)
    arg = "features" if op == "Relu" else "x"
    got, records = _on_npu(npusim, tf, lambda t: getattr(tf.raw_ops, op)(**{arg: t}), x)
    want = ref(x.astype(np.float32)).astype(np.float32)
    if dtype == np.float32:
        if ulps == 0:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_array_max_ulp(got, want, maxulp=ulps)
    else:
        # Rounded once from fp32; a 1-ulp fp32 difference can flip the fp16 rounding by 1 ulp.
        np.testing.assert_array_max_ulp(got, want.astype(dtype), maxulp=0 if ulps == 0 else 1)
    _assert_ran_on_chip(records, op)


@pytest.mark.parametrize("src,dst", [(np.float32, np.float16), (np.float16, np.float32),
                                     (np.float32, BF16), (BF16, np.float32)],
                         ids=lambda t: np.dtype(t).name)
def test_cast_runs_on_npu(npusim, tf, strict_placement, src, dst):
    x = _random((6, 33), np.float32, 8, -1000, 1000).astype(src)
    got, records = _on_npu(npusim, tf, lambda t: tf.cast(t, tf.as_dtype(np.dtype(dst))), x)
    assert got.dtype == np.dtype(dst)
    np.testing.assert_array_equal(got, x.astype(np.float32).astype(dst))
    _assert_ran_on_chip(records, "Cast")


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("transpose_b", [False, True])
def test_matmul_runs_on_the_cube(npusim, tf, strict_placement, dtype, transpose_b):
    rng = np.random.default_rng(9)
    m, k, n = 24, 40, 20
    a = rng.integers(-4, 5, size=(m, k)).astype(dtype)
    b = rng.integers(-4, 5, size=(n, k) if transpose_b else (k, n)).astype(dtype)
    got, records = _on_npu(npusim, tf, lambda x, y: tf.matmul(x, y, transpose_b=transpose_b),
                           a, b)
    b_kn = b.T if transpose_b else b
    # |sum| <= 40 * 16: exact in fp16 and fp32 whatever the accumulation order.
    np.testing.assert_array_equal(got, (a.astype(np.int64) @ b_kn.astype(np.int64)).astype(dtype))
    _assert_ran_on_chip(records, "MatMul")


def test_compiled_ops_are_cached(npusim, tf, strict_placement):
    x = _random((16, 16), np.float32, 10)
    _on_npu(npusim, tf, lambda t: t * t, x)
    before = npusim.compiled_ops()
    _on_npu(npusim, tf, lambda t: t * t, x)
    after = npusim.compiled_ops()
    assert after["misses"] == before["misses"]
    assert after["hits"] == before["hits"] + 1
    assert any(key.startswith("Mul(f32[16,16],f32[16,16])") for key in after["keys"])


def test_host_cpu_seconds_split_a_first_call(npusim, tf, strict_placement):
    # A tf.function's first call on a shape no other test uses runs the graph passes, plans its
    # NpuGraph (a set of at least two NPU nodes) and compiles each kernel once (compiled-op cache
    # misses); the second call none of them.
    x = _random((24, 40), np.float32, 10)
    f = tf.function(lambda t: tf.reduce_max(tf.matmul(t, t, transpose_b=True), axis=1) - t[:, 0])
    npusim.host_cpu_seconds(reset=True)
    misses = npusim.compiled_ops()["misses"]
    with tf.device("/NPU:0"):
        f(tf.constant(x)).numpy()
    first = npusim.host_cpu_seconds(reset=True)
    compiles = first.get("compile", {})
    assert sum(v["calls"] for v in compiles.values()) == npusim.compiled_ops()["misses"] - misses
    assert compiles and all(v["cpu_s"] >= 0 for v in compiles.values())
    assert first["graph_pass"]["cluster"]["calls"] >= 1
    assert first["graph_plan"]["plan"]["calls"] == 1
    assert sum(v["cpu_s"] for v in first["graph_pass"].values()) > 0
    with tf.device("/NPU:0"):
        f(tf.constant(x)).numpy()
    second = npusim.host_cpu_seconds()
    assert "compile" not in second and "graph_plan" not in second and "graph_pass" not in second


def test_op_without_npu_kernel_fails_without_soft_placement(tf, strict_placement):
    # Zeta (the Hurwitz zeta function) has no NPU kernel.
    x = np.linspace(1.5, 3, 8, dtype=np.float32)
    with pytest.raises((tf.errors.InvalidArgumentError, tf.errors.NotFoundError),
                       match="Zeta.*NPU|NPU.*Zeta"):
        with tf.device("/NPU:0"):
            tf.math.zeta(tf.constant(x), tf.constant(np.ones(8, np.float32)))


def test_op_without_npu_kernel_falls_back_to_cpu_with_soft_placement(tf):
    previous = tf.config.get_soft_device_placement()
    tf.config.set_soft_device_placement(True)
    try:
        x = np.linspace(1.5, 3, 8, dtype=np.float32)
        q = np.ones(8, np.float32)
        with tf.device("/NPU:0"):
            y = tf.math.zeta(tf.constant(x), tf.constant(q))
        assert y.device.endswith("device:CPU:0")
        with tf.device("/CPU:0"):
            want = tf.math.zeta(tf.constant(x), tf.constant(q)).numpy()
        np.testing.assert_array_equal(y.numpy(), want)
    finally:
        tf.config.set_soft_device_placement(previous)


def test_kernel_failure_is_an_op_error_not_a_crash(tf, strict_placement):
    # Incompatible shapes pass TensorFlow's eager checks for AddV2 only at run time: the NPU
    # kernel must report the compiler's error through the op's status.
    a = np.ones((3, 4), dtype=np.float32)
    b = np.ones((5,), dtype=np.float32)
    with pytest.raises(tf.errors.OpError):
        with tf.device("/NPU:0"):
            tf.raw_ops.AddV2(x=tf.constant(a), y=tf.constant(b))
    with tf.device("/NPU:0"):  # and the device still works
        np.testing.assert_array_equal((tf.constant(a) + 1.0).numpy(), a + 1.0)

