"""NPU kernels of data movement, generators and the remaining element-wise / NN / reduction ops
(adapter/tf/plugin/kernels_layout.cpp, kernels_matmul.cpp's BatchMatMulV2 / Einsum,
kernels_nn.cpp's activations, kernels_reduce.cpp's ArgMax / ArgMin, Pow, Log1p, the logical
ops, the compiled AddN and RsqrtGrad): with soft placement off each runs on /NPU:0
and matches TensorFlow on the CPU.

Data movement, selection, one-hot, gather, fill and integer ops are bit-exact (assert_equal).
Sums in a fixed order (UnsortedSegmentSum, Cumsum) follow TF's order, so they are exact too
(ops/gather.cpp, ops/scan.cpp). Transcendental activations are computed in f32 with the chip's
exp/log, a few ulp from libm: rtol 1e-5 for f32 (Pow: (2 + |y log x|) ulp, docs/compiler.md).
Batched products: inputs are multiples of 1/4, exact under the fp16 rounding of the default
precision mode and in every summation order."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from test_kernels import BF16  # noqa: E402


def _ints(shape, seed, lo=-50, hi=50, dtype=np.int32):
    return np.random.default_rng(seed).integers(lo, hi, size=shape).astype(dtype)


def _floats(shape, seed, lo=-4.0, hi=4.0, dtype=np.float32):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(np.float32).astype(dtype)


def _both(npusim, tf, fn, inputs):
    """fn on /NPU:0 and /CPU:0 -> (NPU results, CPU results, NPU launch records); every NPU
    result must be on the NPU."""
    def run(device):
        with tf.device(device):
            out = fn(*[tf.constant(x) for x in inputs])
        return list(out) if isinstance(out, (list, tuple)) else [out]
    npusim.clear_launch_records()
    got = run("/NPU:0")
    records = npusim.launch_records()
    want = run("/CPU:0")
    for g in got:
        assert g.device.endswith("device:NPU:0"), g.device
    assert records and all(r["ok"] and r["cycles"] > 0 for r in records), records
    return got, want, records


def _check(npusim, tf, fn, inputs, kernel=None, rtol=0.0, atol=0.0):
    got, want, records = _both(npusim, tf, fn, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g, w)
        if rtol or atol:
            np.testing.assert_allclose(g.numpy().astype(np.float64),
                                       w.numpy().astype(np.float64), rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g.numpy(), w.numpy())
    if kernel:
        names = [r["kernel"] for r in records]
        assert any(n.startswith(kernel) for n in names), (kernel, names)


DTYPES = [np.float32, np.float16, BF16, np.int32, np.int64, np.bool_]


def _data(shape, dtype, seed):
    if dtype == np.bool_:
        return _ints(shape, seed, 0, 2).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        return _ints(shape, seed, dtype=dtype)
    return _floats(shape, seed, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
def test_transpose(npusim, tf, strict_placement, dtype):
    x = _data((3, 1, 17, 5), dtype, 1)
    _check(npusim, tf, lambda t: tf.transpose(t, [2, 0, 3, 1]), [x], "Transpose")
    _check(npusim, tf, lambda t: tf.transpose(t, [0, 1, 3, 2]), [x])


# Rows of at least one 32-byte block that are not whole blocks (the row gather, ops/transpose.cpp):
# CANN-Bench's odd permutations at small shapes, last axis kept and moved, against the CPU.
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape,perm", [
    ((3, 7, 13, 41), [0, 3, 1, 2]),
    ((3, 4, 5, 67), [3, 2, 1, 0]),
    ((2, 51, 7, 27), [0, 2, 1, 3]),
    ((41, 83), [1, 0]),
    ((5, 3, 67), [1, 0, 2]),
], ids=str)
def test_transpose_unaligned_rows(npusim, tf, strict_placement, monkeypatch, dtype, shape, perm):
    # Some of these have fewer rows than the chip has vector cores: the gather is forced.
    monkeypatch.setenv("NPUSIM_TRANSPOSE_ROW_GATHER", "1")
    x = _data(shape, dtype, 7)
    name = {np.float32: "f32", np.float16: "f16", BF16: "bf16"}[dtype]
    _check(npusim, tf, lambda t: tf.transpose(t, perm), [x], f"Transpose_{name}_row_gather")


# Kept rows of over 256 bytes that are not whole blocks: copied one at a time, as CANN's Transpose
# kernel does (ops/transpose.cpp, CannRowCopy); CANN-Bench's c14 permutation at a small shape.
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.int32],
                         ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("outer,perm", [
    ((2, 51, 7), [0, 2, 1, 3]),
    ((3, 5), [1, 0, 2]),
], ids=str)
def test_transpose_cann_rows(npusim, tf, strict_placement, dtype, outer, perm):
    row = 67 if np.dtype(dtype).itemsize == 4 else 131  # 268 / 262 bytes: 9 blocks, one partial
    x = _data(outer + (row,), dtype, 9)
    name = {np.float32: "f32", np.float16: "f16", BF16: "bf16", np.int32: "s32"}[dtype]
    _check(npusim, tf, lambda t: tf.transpose(t, perm), [x], f"Transpose_{name}_cann_rows")


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda t: np.dtype(t).name)
def test_transpose_attention_heads(npusim, tf, strict_placement, dtype):
    # BERT's heads: [B, S, N, D] -> [B, N, S, D] and back (rows of D = 64 elements, whole
    # 32-byte blocks: MTE copies alone, the "_rows" kernel), and K's [B, N, S, D] -> [B, N, D, S].
    x = _data((2, 128, 16, 64), dtype, 7)
    _check(npusim, tf, lambda t: tf.transpose(t, [0, 2, 1, 3]), [x], "Transpose_f")
    _, _, records = _both(npusim, tf, lambda t: tf.transpose(t, [0, 2, 1, 3]), [x])
    assert [r["kernel"].endswith("_rows") for r in records] == [True], records
    h = _data((2, 16, 128, 64), dtype, 8)
    _check(npusim, tf, lambda t: tf.transpose(t, [0, 2, 1, 3]), [h])
    _check(npusim, tf, lambda t: tf.transpose(t, [0, 1, 3, 2]), [h])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_],
                         ids=lambda t: np.dtype(t).name)
def test_concat_pack_unpack(npusim, tf, strict_placement, dtype):
    a, b = _data((3, 17), dtype, 2), _data((3, 5), dtype, 3)
    _check(npusim, tf, lambda p, q: tf.concat([p, q], axis=1), [a, b], "ConcatV2")
    _check(npusim, tf, lambda p, q: tf.concat([p, q], axis=-1), [a, b])
    c = _data((3, 17), dtype, 4)
    _check(npusim, tf, lambda p, q: tf.stack([p, q], axis=1), [a, c], "Pack")
    _check(npusim, tf, lambda p: tf.unstack(p, axis=1)[:3], [b], "Unpack")


def test_concat_and_pack_of_hundreds_of_inputs(npusim, tf, strict_placement):
    # Keras stacks one flag per variable (ResNet-50: 320): more inputs than one kernel addresses,
    # so the compiler concatenates them in groups first (ops/layout.cpp, concat_in_groups).
    # Three groups (128 + 128 + the rest) and the join: four concatenation kernels.
    flags = [_data((), np.bool_, k) for k in range(320)]
    _, _, records = _both(npusim, tf, lambda *t: tf.stack(t), flags)
    assert [r["kernel"] for r in records] == ["ConcatV2_bool"] * 4, records
    _check(npusim, tf, lambda *t: tf.stack(t), flags)
    parts = [_data((2, 1 + k % 3), np.float32, k) for k in range(300)]
    _check(npusim, tf, lambda *t: tf.concat(t, axis=1), parts, "ConcatV2")


def test_pack_int32_stays_on_the_npu(npusim, tf, strict_placement):
    # Pack has no DEVICE_DEFAULT int32 kernel; shape vectors built with tf.stack need this one.
    a, b = _ints((4,), 5), _ints((4,), 6)
    _check(npusim, tf, lambda p, q: tf.stack([p, q]), [a, b], "Pack")


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64],
                         ids=lambda t: np.dtype(t).name)
def test_split_splitv_slice(npusim, tf, strict_placement, dtype):
    x = _data((6, 19), dtype, 7)
    _check(npusim, tf, lambda t: tf.split(t, 3, axis=0), [x], "Split")
    _check(npusim, tf, lambda t: tf.split(t, [4, -1, 7], axis=1), [x], "SplitV")
    if dtype != np.int32:  # TF's DEVICE_DEFAULT int32 Slice runs on the host
        _check(npusim, tf, lambda t: tf.slice(t, [1, 3], [4, -1]), [x], "Slice")


def test_strided_slice_and_its_gradient(npusim, tf, strict_placement):
    x = _floats((5, 7, 3), 8)
    _check(npusim, tf, lambda t: t[1:4, ::-2, 1], [x], "StridedSlice")
    _check(npusim, tf, lambda t: t[..., None, :2], [x])
    dy = _floats((3, 4), 9)
    _check(npusim, tf,
           lambda g: tf.raw_ops.StridedSliceGrad(shape=[5, 7, 3], begin=[1, 6, 1], end=[4, -8, 2],
                                                 strides=[1, -2, 1], dy=g, shrink_axis_mask=4),
           [dy], "StridedSliceGrad")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
def test_reverse(npusim, tf, strict_placement, dtype):
    # ReverseV2 (tf.reverse; Keras' RandomFlip, go_backwards and Bidirectional recurrences).
    x = _data((3, 1, 17, 5), dtype, 41)
    _check(npusim, tf, lambda t: tf.reverse(t, [2]), [x], "ReverseV2")
    _check(npusim, tf, lambda t: tf.reverse(t, [0, -1]), [x], "ReverseV2")
    _check(npusim, tf, lambda t: tf.reverse(t, [3, 1, 2, 0]), [x], "ReverseV2")
    _check(npusim, tf, lambda t: tf.reverse(t, [1]), [x])  # a dim of 1: a copy
    _check(npusim, tf, lambda t: tf.reverse(t, tf.constant([1], tf.int64)), [x[:, :, :3, 1]])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32],
                         ids=lambda t: np.dtype(t).name)
def test_pads(npusim, tf, strict_placement, dtype):
    x = _data((2, 5, 3), dtype, 10)
    pads = [[0, 1], [2, 3], [1, 0]]
    _check(npusim, tf, lambda t: tf.pad(t, pads), [x], "Pad")
    _check(npusim, tf, lambda t: tf.pad(t, pads, constant_values=7), [x], "PadV2")
    _check(npusim, tf, lambda t: tf.pad(t, [[1, 1], [2, 2], [0, 1]], mode="REFLECT"), [x],
           "MirrorPad")
    _check(npusim, tf, lambda t: tf.pad(t, [[1, 0], [3, 2], [1, 1]], mode="SYMMETRIC"), [x])


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64],
                         ids=lambda t: np.dtype(t).name)
def test_select_and_clip(npusim, tf, strict_placement, dtype):
    cond = _ints((4, 19), 11, 0, 2).astype(np.bool_)
    a, b = _data((4, 19), dtype, 12), _data((4, 19), dtype, 13)
    _check(npusim, tf, lambda c, p, q: tf.raw_ops.Select(condition=c, x=p, y=q), [cond, a, b],
           "Select")
    _check(npusim, tf, lambda c, p, q: tf.where(c[:1], p, q), [cond, a, b], "SelectV2")
    if dtype != np.int64:
        lo, hi = np.array(-2, dtype), np.array(3, dtype)
        _check(npusim, tf,  # tf.clip_by_value composes Minimum and Maximum
               lambda t, p, q: tf.raw_ops.ClipByValue(t=t, clip_value_min=p, clip_value_max=q),
               [a, lo, hi], "ClipByValue")


def test_fill_zeros_ones_range(npusim, tf, strict_placement):
    _check(npusim, tf, lambda v: tf.fill([3, 17], v), [np.float32(2.5)], "Fill")
    _check(npusim, tf, lambda v: tf.fill([2, 1, 5], v), [np.int64(-3)])
    x = _floats((5, 33), 14, dtype=np.float16)
    # Eager tf.zeros_like / ones_like of a known shape are Fill ops: the raw ops here.
    _check(npusim, tf, lambda t: tf.raw_ops.ZerosLike(x=t), [x], "ZerosLike")
    _check(npusim, tf, lambda t: tf.raw_ops.OnesLike(x=t), [x], "OnesLike")
    _check(npusim, tf, lambda s, lim, d: tf.range(s, lim, d),
           [np.float32(-1.5), np.float32(7.0), np.float32(0.25)], "Range")


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64], ids=lambda t: np.dtype(t).name)
def test_gather_segment_sum_one_hot(npusim, tf, strict_placement, index_dtype):
    params = _floats((7, 19), 15)
    idx = _ints((5,), 16, 0, 7, index_dtype)
    _check(npusim, tf, lambda p, i: tf.gather(p, i, axis=0), [params, idx], "GatherV2")
    idx2 = _ints((2, 3), 17, 0, 19, index_dtype)
    _check(npusim, tf, lambda p, i: tf.gather(p, i, axis=1), [params, idx2])
    seg = _ints((7,), 18, 0, 4, index_dtype)
    _check(npusim, tf, lambda d, s: tf.math.unsorted_segment_sum(d, s, 4), [params, seg],
           "UnsortedSegmentSum")
    # Rows of whole 32-byte blocks and at least one segment per vector core: the segment-owner
    # kernel (docs/compiler.md, "UnsortedSegmentSum"); ids repeat, some run.
    rows = _floats((40, 16), 20)
    seg2 = np.repeat(_ints((20,), 21, 0, 9, index_dtype), 2)
    _check(npusim, tf, lambda d, s: tf.math.unsorted_segment_sum(d, s, 9), [rows, seg2])
    # Fewer segments than vector cores (a token-type table): the column-owner kernel.
    _check(npusim, tf, lambda d, s: tf.math.unsorted_segment_sum(d, s, 2), [rows, seg2 % 2])
    labels = _ints((6,), 19, 0, 10, index_dtype)
    _check(npusim, tf, lambda i: tf.one_hot(i, 10), [labels], "OneHot")
    _check(npusim, tf, lambda i: tf.one_hot(i, 3, on_value=5, off_value=-1, axis=0), [labels])


def _gather_zero_filled(params, indices, axis, batch_dims=0):
    """numpy GatherV2 with the NPU's rule for indices outside [0, params.shape[axis]): a row of
    zeros (TF's GPU kernel; its CPU kernel fails the op)."""
    n = params.shape[axis]
    ok = (indices >= 0) & (indices < n)
    safe = np.where(ok, indices, 0)
    if batch_dims == 0:
        out = np.take(params, safe, axis=axis)
        mask = ok.reshape((1,) * axis + ok.shape + (1,) * (params.ndim - axis - 1))
    else:  # batch_dims = 1, axis = 1: each batch row gathers from its own params
        out = np.stack([np.take(params[b], safe[b], axis=0) for b in range(params.shape[0])])
        mask = ok.reshape(ok.shape + (1,) * (params.ndim - 2))
    return np.where(mask, out, np.zeros((), params.dtype))


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64], ids=lambda t: np.dtype(t).name)
def test_gather_out_of_range_indices_give_zeros(npusim, tf, strict_placement, index_dtype):
    # docs/tf_plugin.md: the indices live in device memory; an index outside the axis gives
    # zeros, as TensorFlow's GPU kernel documents, where its CPU kernel raises.
    params = _floats((6, 5, 3), 40)
    bad = [-1, 6, 7, -(2**31), 2**31 - 1]
    idx = np.array([0, 5] + bad + [3], index_dtype)
    idx2 = np.array([[4, -1], [5, 2]], index_dtype)  # on axis 1 (size 5)
    idxb = np.array([[1, 5, -2], [0, 4, 9], [2, 2, 5], [-7, 3, 1], [4, 0, 0], [6, 1, 2]],
                    index_dtype)  # batch_dims 1, axis 1
    cases = [(idx, 0, 0), (idx2, 1, 0), (idxb, 1, 1)]
    for indices, axis, batch_dims in cases:
        want = _gather_zero_filled(params, indices, axis, batch_dims)
        assert not np.all(want == 0) and np.any(np.all(want == 0, axis=-1))
        npusim.clear_launch_records()
        with tf.device("/NPU:0"):
            got = tf.gather(tf.constant(params), tf.constant(indices), axis=axis,
                            batch_dims=batch_dims)
        assert got.device.endswith("device:NPU:0"), got.device
        np.testing.assert_array_equal(got.numpy(), want)
        assert any(r["kernel"].startswith("GatherV2") for r in npusim.launch_records())
    # The reference for in-range indices is TensorFlow's own CPU kernel.
    with tf.device("/CPU:0"):
        cpu = tf.gather(tf.constant(params), tf.constant(idx[:2]), axis=0).numpy()
    np.testing.assert_array_equal(cpu, _gather_zero_filled(params, idx[:2], 0))


@pytest.mark.parametrize("dtype", [np.float32, np.int32], ids=lambda t: np.dtype(t).name)
def test_cumsum(npusim, tf, strict_placement, dtype):
    x = _data((4, 21), dtype, 20)
    _check(npusim, tf, lambda t: tf.cumsum(t, axis=1), [x], "Cumsum")
    _check(npusim, tf, lambda t: tf.cumsum(t, axis=0, exclusive=True, reverse=True), [x])


@pytest.mark.parametrize("dtype", [np.float32, np.int32], ids=lambda t: np.dtype(t).name)
def test_argmax_argmin(npusim, tf, strict_placement, dtype):
    x = _data((5, 23), dtype, 21)
    _check(npusim, tf, lambda t: tf.argmax(t, axis=1), [x], "ArgMax")
    _check(npusim, tf, lambda t: tf.argmin(t, axis=0, output_type=tf.int32), [x], "ArgMin")


def test_batch_matmul_and_einsum(npusim, tf, strict_placement):
    rng = np.random.default_rng(22)
    a = rng.integers(-8, 9, (3, 5, 17)).astype(np.float32) / 4
    b = rng.integers(-8, 9, (1, 17, 6)).astype(np.float32) / 4
    _check(npusim, tf, tf.matmul, [a, b], "MatMul")
    _check(npusim, tf, lambda p, q: tf.matmul(q, p, adjoint_a=True, adjoint_b=True), [a, b])
    c = rng.integers(-8, 9, (3, 6, 17)).astype(np.float32) / 4
    _check(npusim, tf, lambda p, q: tf.einsum("bij,bkj->bik", p, q), [a, c])
    _check(npusim, tf, lambda p: tf.einsum("bij->bji", p), [a])


ACTIVATIONS = ["Relu6", "Elu", "Selu", "Softplus"]


@pytest.mark.parametrize("op", ACTIVATIONS)
def test_activations_and_gradients(npusim, tf, strict_placement, op):
    x = _floats((3, 37), 23, -8.0, 8.0)
    x[0, :4] = [0.0, 6.0, -1e-3, 30.0]  # the kinks and Softplus' thresholds
    fn = getattr(tf.raw_ops, op)
    _check(npusim, tf, lambda t: fn(features=t), [x], op, rtol=1e-5, atol=1e-6)
    dy = _floats((3, 37), 24)
    grad = getattr(tf.raw_ops, op + "Grad")
    if op in ("Elu", "Selu"):  # their gradients take the forward output
        _check(npusim, tf, lambda g, t: grad(gradients=g, outputs=fn(features=t)), [dy, x],
               op + "Grad", rtol=1e-5, atol=1e-6)
    else:
        _check(npusim, tf, lambda g, t: grad(gradients=g, features=t), [dy, x], op + "Grad",
               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=lambda t: np.dtype(t).name)
def test_leaky_relu_and_gradient(npusim, tf, strict_placement, dtype):
    # Keras' LeakyReLU layer (negative_slope 0.3) and tf.nn.leaky_relu (alpha 0.2): bit-exact,
    # the slope rounded to the type as TF's kernel does.
    x = _floats((3, 37), 43, -8.0, 8.0, dtype)
    x[0, :3] = [0.0, -0.0, 1e-3]
    dy = _floats((3, 37), 44, dtype=dtype)
    for alpha in (0.2, 0.3, -1.5):
        _check(npusim, tf, lambda t, a=alpha: tf.nn.leaky_relu(t, alpha=a), [x], "LeakyRelu")
        _check(npusim, tf,
               lambda g, t, a=alpha: tf.raw_ops.LeakyReluGrad(gradients=g, features=t, alpha=a),
               [dy, x], "LeakyReluGrad")

    import keras  # pylint: disable=import-outside-toplevel

    def layer_and_gradient(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            y = keras.layers.LeakyReLU(0.3)(t)
        return y, tape.gradient(y, t)

    _check(npusim, tf, layer_and_gradient, [x], "LeakyReluGrad")


def test_erf_erfc_and_exact_gelu(npusim, tf, strict_placement):
    x = _floats((3, 37), 33, -4.0, 4.0)
    x[0, :5] = [0.0, 0.4999, -0.5001, 1e-3, -1e-6]  # both sides of Erf's series / erfc switch
    _check(npusim, tf, tf.math.erf, [x], "Erf_", rtol=2e-6, atol=1e-7)
    _check(npusim, tf, tf.math.erfc, [x], "Erfc", rtol=2e-6, atol=1e-7)

    # tf.nn.gelu's erf form (Keras' "gelu" activation: 0.5 x erfc(-x / sqrt 2)) and its
    # gradient, with no op left to the CPU.
    def gelu_and_gradient(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            y = tf.nn.gelu(t, approximate=False)
        return y, tape.gradient(y, t)

    _check(npusim, tf, gelu_and_gradient, [x], "Erfc", rtol=1e-5, atol=1e-6)


def test_l2loss_and_softmax_cross_entropy(npusim, tf, strict_placement):
    x = _floats((6, 29), 25)
    # L2Loss compiles to a squaring sum (its kernel is named Sum_...).
    _check(npusim, tf, tf.nn.l2_loss, [x], "Sum", rtol=1e-5)
    logits = _floats((6, 11), 26)
    labels = np.random.default_rng(27).dirichlet(np.ones(11), 6).astype(np.float32)
    _check(npusim, tf,
           lambda f, lab: tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=f, labels=lab),
           [logits, labels], "SoftmaxCrossEntropyWithLogits", rtol=1e-5, atol=1e-6)


def test_pow_log1p_and_logical_ops(npusim, tf, strict_placement):
    x = _floats((4, 33), 28, 0.1, 4.0)
    y = _floats((4, 33), 29, -3.0, 3.0)
    _check(npusim, tf, tf.pow, [x, y], "Pow", rtol=2e-5)
    _check(npusim, tf, tf.math.log1p, [_floats((4, 33), 30, -0.9, 5.0)], "Log1p", rtol=1e-6)
    a = _ints((4, 33), 31, 0, 2).astype(np.bool_)
    b = _ints((4, 33), 32, 0, 2).astype(np.bool_)
    _check(npusim, tf, tf.logical_and, [a, b], "LogicalAnd")
    _check(npusim, tf, tf.logical_or, [a, b], "LogicalOr")
    _check(npusim, tf, tf.logical_not, [a], "LogicalNot")


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda t: np.dtype(t).name)
def test_add_n(npusim, tf, strict_placement, n, dtype):
    # One compiled kernel of N-1 AddV2 steps, left to right, each rounded to the type: the CPU
    # kernel's order may differ, so values are multiples of 1/4 below 64 (every partial sum
    # exact).
    xs = [(_ints((3, 37), 40 + i, -64, 64) / 4).astype(dtype) for i in range(n)]
    _check(npusim, tf, lambda *t: tf.raw_ops.AddN(inputs=list(t)), xs,
           "BroadcastTo" if n == 1 else "AddN")


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda t: np.dtype(t).name)
def test_add_n_wide(npusim, tf, strict_placement, dtype):
    # 100 inputs: more than one kernel's scalar registers hold addresses for, so several launches
    # continue a running sum (ops/fused_elementwise.cpp). Exact values (multiples of 1/4, every
    # partial sum below 512) match the CPU in any order; random ones match numpy's left-to-right
    # sum, each partial sum rounded to the type, bit for bit.
    fn = lambda *t: tf.raw_ops.AddN(inputs=list(t))  # noqa: E731
    exact = [(_ints((3, 37), 500 + i, -16, 17) / 4).astype(dtype) for i in range(100)]
    _check(npusim, tf, fn, exact, "AddN")
    xs = [_floats((3, 37), 700 + i, -10.0 ** (i % 5 - 2), 10.0 ** (i % 5 - 2), dtype)
          for i in range(100)]
    got, _, records = _both(npusim, tf, fn, xs)
    assert sum(r["kernel"].startswith("AddN") for r in records) >= 2, records
    want = xs[0]
    for x in xs[1:]:
        want = (want + x).astype(dtype)
    np.testing.assert_array_equal(got[0].numpy(), want)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=lambda t: np.dtype(t).name)
def test_rsqrt_grad(npusim, tf, strict_placement, dtype):
    # One compiled launch (ops/binary.cpp): (-0.5 * (y * y)) * (y * dy), the two products rounded
    # to the type as TF's: bit-exact in f32 and f16; bf16 on a chip without bf16 arithmetic
    # rounds once where TF rounds all three products, so up to two ulp apart (1.4 measured);
    # 0 wherever dy is 0, even for y = inf (TF's mul_no_nan).
    y = _floats((5, 37), 50, 0.1, 3.0, dtype=dtype)
    dy = _floats((5, 37), 51, dtype=dtype)
    dy[0, :2] = 0
    y[0, 1] = np.inf
    rtol = 2.0 ** -6 if dtype == BF16 else 0.0
    _check(npusim, tf, lambda a, b: tf.raw_ops.RsqrtGrad(y=a, dy=b), [y, dy], "RsqrtGrad",
           rtol=rtol)
