"""NPU kernels of the convolution family (adapter/tf/plugin/kernels_conv.cpp): Conv2D,
DepthwiseConv2dNative, MaxPool, AvgPool, FusedBatchNormV3, forward and gradients through
tf.GradientTape (Conv2DBackpropInput/Filter, the depthwise gradients, MaxPoolGrad, AvgPoolGrad,
FusedBatchNormGradV3), each with soft placement off on /NPU:0 against the same computation by
TensorFlow on the CPU; a small Keras CNN trained by SGD steps on the NPU tracking the CPU; and
the blocks MobileNetV2 and ResNet-50 are built from (depthwise, ReLU6, padding, residual adds,
3x3/2 max pooling), forward and backward, nothing left on the CPU.

Tolerances. The default precision mode (allow_fp32_to_fp16, docs/compiler.md) rounds fp32
inputs of cube ops (convolutions) to fp16 and accumulates in fp32:
- "exact" tests use values that are multiples of 1/4 in [-2, 2] (exact in fp16); every product
  is a multiple of 1/16 and every sum of at most a few hundred of them is exact in fp32, so the
  NPU must equal the CPU bit for bit (in any summation order);
- "random" tests compare with the CPU run on inputs rounded to fp16 first: what remains is the
  fp32 summation order, below K * 2^-24 * sum|x w| (K terms); rtol/atol 1e-5 cover it for the
  K <= 100 here.
Pooling and batch normalisation run on the vector unit in fp32 (MaxPoolGrad in the tensor's
type, summing as TF's CPU kernel does, in another order): MaxPool and MaxPoolGrad are exact;
AvgPool multiplies by a reciprocal where TF divides (1 ulp); batch normalisation's
per-channel statistics sum in another order and use the vector unit's rsqrt (rtol 1e-5 /
1e-4 for the gradients, whose terms cancel)."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from conftest import TEST_CHIP, child_result, chip_config  # noqa: E402
from test_kernels import BF16  # noqa: E402


def _quarters(shape, seed, lo=-8, hi=8):
    """Multiples of 1/4 in [lo/4, hi/4]: exact in fp16, bf16 and fp32."""
    return np.random.default_rng(seed).integers(lo, hi + 1, size=shape).astype(np.float32) / 4


def _uniform(shape, seed, lo=-1.0, hi=1.0):
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(np.float32)


def _to_f16(x):
    return x.astype(np.float16).astype(np.float32)


def _run(tf, device, fn, inputs, grads):
    """fn(*inputs) on `device`; with grads, also d(sum(y^2))/d(inputs) by GradientTape."""
    with tf.device(device):
        ts = [tf.constant(x) for x in inputs]
        if not grads:
            y = fn(*ts)
            return [y]
        with tf.GradientTape() as tape:
            for t in ts:
                tape.watch(t)
            y = fn(*ts)
            loss = tf.reduce_sum(tf.square(y))
        return [y] + tape.gradient(loss, ts)


def _compare(npusim, tf, fn, inputs, kernels, grads=True, rtol=0.0, atol=0.0, cpu_inputs=None,
             cpu_fn=None):
    """Runs fn (and its gradients) on the NPU and the CPU (cpu_fn there when given: the same
    function computed another way); checks every result is on the NPU and matches, and that
    each name in `kernels` prefixes a launched kernel."""
    npusim.clear_launch_records()
    got = _run(tf, "/NPU:0", fn, inputs, grads)
    records = npusim.launch_records()
    want = _run(tf, "/CPU:0", cpu_fn or fn, cpu_inputs if cpu_inputs is not None else inputs,
                grads)
    for g, w in zip(got, want):
        assert g.device.endswith("device:NPU:0"), g.device
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g.numpy().astype(np.float64), w.numpy().astype(np.float64),
                                   rtol=rtol, atol=atol)
    names = [r["kernel"] for r in records]
    for k in kernels:
        assert any(n.startswith(k) for n in names), (k, names)
    assert all(r["ok"] and r["cycles"] > 0 for r in records), records
    return got


# (input NHWC, filter HWIO, strides, padding, dilations): odd sizes, channel counts that are
# not multiples of 16, size-1 batch / spatial / channel dims, stride 2, dilation 2.
CONV_CASES = [
    ((2, 7, 9, 3), (3, 3, 3, 5), 1, "SAME", 1),
    ((1, 8, 6, 17), (3, 1, 17, 4), 2, "VALID", 1),
    ((1, 1, 5, 1), (1, 3, 1, 2), 1, "SAME", 1),
    ((2, 9, 9, 4), (3, 3, 4, 3), 1, "VALID", 2),
]


def _zero_inserted_filter(tf, w, dilation):
    """The HWIO filter w with dilation - 1 zeros between its taps: an undilated convolution with
    it is w's dilated convolution (the same products, plus products with zero), and its gradient
    reaches w's taps through scatter_nd's gradient (a gather), exactly."""
    kh, kw, ci, co = w.shape
    taps = [[a * dilation, b * dilation] for a in range(kh) for b in range(kw)]
    return tf.scatter_nd(taps, tf.reshape(w, [kh * kw, ci, co]),
                         [(kh - 1) * dilation + 1, (kw - 1) * dilation + 1, ci, co])


@pytest.mark.parametrize("x_shape,w_shape,stride,padding,dilation", CONV_CASES, ids=str)
def test_conv2d_and_gradients_exact(npusim, tf, strict_placement, x_shape, w_shape, stride,
                                    padding, dilation):
    x = _quarters(x_shape, 1)
    w = _quarters(w_shape, 2)

    def conv(a, b):
        return tf.nn.conv2d(a, b, strides=stride, padding=padding, dilations=dilation)

    # The CPU reference without dilations: TensorFlow's CPU Conv2DBackpropInput takes dilation
    # > 1 only through oneDNN, which TensorFlow enables on Intel hosts alone.
    def conv_undilated(a, b):
        return tf.nn.conv2d(a, _zero_inserted_filter(tf, b, dilation), strides=stride,
                            padding=padding)

    _compare(npusim, tf, conv, [x, w],
             ["Conv2D_", "Conv2DBackpropInput_", "FilterGrad_"], cpu_fn=conv_undilated)


# Grouped convolutions (x's channels G times the filter's: TF's Conv2D shape rule, Keras'
# Conv2D(groups=G)): G = 4 of 6 -> 2 channels, 2 of 16 -> 16 with stride 2, 4 of 3 -> 2 in a
# 1x1 window, 8 of 1 -> 1 dilated. Forward and both gradients, each one NPU launch for all the
# groups, against the per-group convolutions on the CPU (tf.split, conv2d, tf.concat).
@pytest.mark.parametrize("x_shape,w_shape,stride,padding,dilation", [
    ((2, 7, 9, 24), (3, 3, 6, 8), 1, "SAME", 1),
    ((1, 8, 8, 32), (3, 3, 16, 32), 2, "VALID", 1),
    ((2, 6, 5, 12), (1, 1, 3, 8), 1, "SAME", 1),
    ((1, 9, 9, 8), (3, 3, 1, 8), 1, "SAME", 2),
], ids=str)
def test_grouped_conv2d_and_gradients_exact(npusim, tf, strict_placement, x_shape, w_shape,
                                            stride, padding, dilation):
    x = _quarters(x_shape, 5)
    w = _quarters(w_shape, 6)
    groups = x_shape[3] // w_shape[2]

    def conv(a, b):
        return tf.nn.conv2d(a, b, strides=stride, padding=padding, dilations=dilation)

    def per_group(a, b):  # (undilated on the CPU: as test_conv2d_and_gradients_exact)
        b = _zero_inserted_filter(tf, b, dilation)
        return tf.concat([tf.nn.conv2d(xa, wb, strides=stride, padding=padding)
                          for xa, wb in zip(tf.split(a, groups, axis=3),
                                            tf.split(b, groups, axis=3))], axis=3)

    _compare(npusim, tf, conv, [x, w], ["Conv2D_", "Conv2DBackpropInput_", "FilterGrad_"],
             cpu_fn=per_group)
    names = [r["kernel"] for r in npusim.launch_records()]
    for kernel in ("Conv2D_", "Conv2DBackpropInput_", "FilterGrad_"):
        assert len([n for n in names if n.startswith(kernel)]) == 1, (kernel, names)


# Narrow groups packed into the cube's 16-channel blocks (docs/compiler.md "Narrow groups packed
# block-diagonally"): 8 groups of 4 -> 4 (4 per block) and 3 groups of 8 -> 8 with stride 2 (2
# per block, the last block holding one group), packing forced where the shapes allow
# (NPUSIM_FUSION_GROUPED_CONV_PACK=1; unset, the estimate leaves layers this small unpacked).
# The forward and the input gradient build the block-diagonal filter and run one cube launch
# each; the filter gradient stays per group. Exact values: bit for bit against the per-group
# convolutions on the CPU.
@pytest.mark.parametrize("x_shape,w_shape,stride", [
    ((2, 7, 9, 32), (3, 3, 4, 32), 1),
    ((1, 8, 8, 24), (3, 3, 8, 24), 2),
], ids=str)
def test_grouped_conv2d_packed_groups_exact(npusim, tf, strict_placement, monkeypatch, x_shape,
                                            w_shape, stride):
    monkeypatch.setenv("NPUSIM_FUSION_GROUPED_CONV_PACK", "1")
    x = _quarters(x_shape, 7)
    w = _quarters(w_shape, 8)
    groups = x_shape[3] // w_shape[2]

    def conv(a, b):
        return tf.nn.conv2d(a, b, strides=stride, padding="SAME")

    def per_group(a, b):
        return tf.concat([tf.nn.conv2d(xa, wb, strides=stride, padding="SAME")
                          for xa, wb in zip(tf.split(a, groups, axis=3),
                                            tf.split(b, groups, axis=3))], axis=3)

    _compare(npusim, tf, conv, [x, w], ["Conv2D_", "Conv2DBackpropInput_", "FilterGrad_"],
             cpu_fn=per_group)
    names = [r["kernel"] for r in npusim.launch_records()]
    assert len([n for n in names if n.startswith("GroupedBlockDiag_")]) == 2, names
    for kernel in ("Conv2D_", "Conv2DBackpropInput_", "FilterGrad_"):
        assert len([n for n in names if n.startswith(kernel)]) == 1, (kernel, names)


# The filter gradient's paths: a 1x1 window of stride 1 (x is the img2col matrix: the MatMul)
# and the fused kernel (img2col made in L0A by load3dt), here over the width-folded view of few
# channels without padding along W, and a 7x7 stride 2 over 3 channels with SAME padding; 1x1
# windows of stride 2 over x viewed as the rows and columns they read (one tall map of the
# batch: loaded by columns with 32 channels, by rows with 20). No Img2col launch either way.
# The 1x1 stride-1 window takes the MatMul where its product's rows (Cin) reach GM: straight from
# L0C, or through the UB (chips without an l0c->gm path: the 910, 310P) as whole 32-byte blocks
# of fp16 only (20 channels are not: the fused kernel there).
def _pointwise_filter_grad_kernel(cin):
    whole_blocks = "l0c->gm" in chip_config()["paths"] or cin * 2 % 32 == 0
    return "MatMul_" if whole_blocks else "FilterGrad_"


@pytest.mark.parametrize("x_shape,w_shape,stride,padding,product", [
    ((2, 5, 6, 20), (1, 1, 20, 24), 1, "SAME", _pointwise_filter_grad_kernel(20)),
    ((2, 9, 11, 3), (5, 4, 3, 8), 2, "VALID", "FilterGrad_"),
    ((1, 15, 13, 3), (7, 7, 3, 16), 2, "SAME", "FilterGrad_"),
    ((4, 8, 6, 32), (1, 1, 32, 24), 2, "SAME", "FilterGrad_"),
    ((3, 6, 8, 20), (1, 1, 20, 17), 2, "VALID", "FilterGrad_"),
], ids=str)
def test_conv2d_filter_gradient_paths(npusim, tf, strict_placement, x_shape, w_shape, stride,
                                      padding, product):
    def conv(a, b):
        return tf.nn.conv2d(a, b, strides=stride, padding=padding)

    # dx of a 1x1 window of stride 2: the convolution of the zero-inserted dy, or where FIXPIPE
    # writes GM the MatMul storing at dx's strided positions (docs/compiler.md, the
    # Conv2DBackpropInput row), whichever the estimates choose; its filter gradient here is the
    # fused kernel, so a MatMul launch is the input gradient's.
    strided_1x1 = tuple(w_shape[:2]) == (1, 1) and stride > 1
    _compare(npusim, tf, conv, [_quarters(x_shape, 5), _quarters(w_shape, 6)],
             ["Conv2D_", product] + ([] if strided_1x1 else ["Conv2DBackpropInput_"]))
    launched = [r["kernel"] for r in npusim.launch_records()]
    assert not any(n.startswith("Img2col_") for n in launched), launched


# The strided 1x1 input gradient's switch (NPUSIM_CONV_STRIDED_INPUT_GRAD, read at every compile;
# a child process per value, as the plugin keeps compiled ops): which kernel computed dx, told by
# the launches of the Conv2DBackpropInput op: on ("1"), where FIXPIPE writes GM from any L0C row
# (an l0c->gm path, alignment.l0c at most 64 bytes), one of the strided kernels, which multiply
# dy's positions only: the MatMul ("MatMul_") or dy's 1x1 convolution, either with fewer than half
# the zero-insertion convolution's cube MACs (a quarter at stride 2, before padding to 16-row
# tiles); off ("0"), the zero-insertion convolution, no MatMul. dx the same bit for bit.
STRIDED_DX_CHILD = r'''
import json
import numpy as np
import npusim
import tensorflow as tf

x = (np.random.default_rng(5).integers(-8, 9, size=X_SHAPE) / 4).astype(np.float32)
w = (np.random.default_rng(6).integers(-8, 9, size=W_SHAPE) / 4).astype(np.float32)
with tf.device("/NPU:0"):
    xs = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xs)
        y = tf.nn.conv2d(xs, tf.constant(w), strides=2, padding=PADDING)
        loss = tf.reduce_sum(tf.square(y))
    dx = tape.gradient(loss, xs).numpy()
dx_launches = [r for r in npusim.launch_records(with_counters="flat")
               if r["op_type"] == "Conv2DBackpropInput"]
print("RESULT" + json.dumps({
    "kernels": [r["kernel"] for r in dx_launches],
    "macs": sum(v for r in dx_launches for k, v in r["counters"].items() if k.endswith(".m.macs")),
    "dx": dx.ravel().tolist()}))
'''


@pytest.mark.parametrize("x_shape,w_shape,padding", [
    ((4, 8, 6, 32), (1, 1, 32, 24), "SAME"),
    ((3, 6, 8, 20), (1, 1, 20, 17), "VALID"),
], ids=str)
def test_strided_input_gradient_switch(x_shape, w_shape, padding):
    code = (STRIDED_DX_CHILD.replace("X_SHAPE", str(x_shape)).replace("W_SHAPE", str(w_shape))
            .replace("PADDING", repr(padding)))
    on, off = (child_result(code, extra_env={"NPUSIM_CONV_STRIDED_INPUT_GRAD": v})
               for v in ("1", "0"))
    assert on["dx"] == off["dx"]
    assert not any(k.startswith("MatMul_") for k in off["kernels"]), off["kernels"]
    assert any(k.startswith("Conv2DBackpropInput_") for k in off["kernels"]), off["kernels"]
    chip = chip_config()
    strided = "l0c->gm" in chip["paths"] and int(chip["alignment"]["l0c"]) <= 64
    if strided:
        assert 2 * on["macs"] < off["macs"], (on["kernels"], on["macs"], off["macs"])
        assert any(k.startswith(("MatMul_", "Conv2DBackpropInput_")) for k in on["kernels"])
    else:
        assert (on["kernels"], on["macs"]) == (off["kernels"], off["macs"])


def test_conv2d_random_fp32_rounds_inputs_to_fp16(npusim, tf, strict_placement):
    x = _uniform((2, 6, 5, 20), 3)
    w = _uniform((3, 3, 20, 18), 4)
    conv = lambda a, b: tf.nn.conv2d(a, b, strides=1, padding="SAME")  # noqa: E731
    # K = 3 * 3 * 20 = 180 products of |x w| <= 1: atol 180 * 2^-24 * 2 < 3e-5.
    _compare(npusim, tf, conv, [x, w], ["Conv2D_"], grads=False, rtol=1e-5, atol=3e-5,
             cpu_inputs=[_to_f16(x), _to_f16(w)])


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=lambda t: np.dtype(t).name)
def test_conv2d_half_types(npusim, tf, strict_placement, dtype):
    x = _quarters((1, 5, 7, 6), 5).astype(dtype)
    w = _quarters((3, 3, 6, 8), 6).astype(dtype)
    conv = lambda a, b: tf.nn.conv2d(a, b, strides=1, padding="SAME")  # noqa: E731
    if dtype is BF16 and not chip_config()["cube"]["bf16"]:
        # A cube without bf16 (the 910, 310P): the compiler's refusal, not a result.
        with pytest.raises(tf.errors.UnimplementedError,
                           match=f"bf16 is not supported by the cube of chip {TEST_CHIP}"):
            with tf.device("/NPU:0"):
                conv(tf.constant(x), tf.constant(w)).numpy()
        return
    # Exact sums (multiples of 1/16, |y| <= 54 * 4 = 216) rounded once to the type; TF's CPU
    # kernel also accumulates in fp32 for half types.
    _compare(npusim, tf, conv, [x, w], ["Conv2D_"], grads=False)


@pytest.mark.parametrize("x_shape,multiplier,stride", [
    ((2, 7, 6, 3), 1, 1), ((1, 9, 8, 18), 2, 2), ((1, 5, 5, 1), 3, 1)], ids=str)
def test_depthwise_conv2d_and_gradients(npusim, tf, strict_placement, x_shape, multiplier,
                                        stride):
    x = _quarters(x_shape, 7)
    w = _quarters((3, 3, x_shape[3], multiplier), 8)

    def depthwise(a, b):
        return tf.nn.depthwise_conv2d(a, b, strides=[1, stride, stride, 1], padding="SAME")

    _compare(npusim, tf, depthwise, [x, w],
             ["DepthwiseConv2dNative_", "DepthwiseConv2dNativeBackpropInput_"])


@pytest.mark.parametrize("x_shape,ksize,stride,padding", [
    ((2, 7, 9, 3), 2, 2, "VALID"), ((1, 6, 5, 20), 3, 2, "SAME"), ((1, 1, 4, 1), 1, 1, "SAME"),
    ((2, 20, 18, 64), 3, 2, "SAME")], ids=str)
def test_max_pool_and_gradient(npusim, tf, strict_placement, x_shape, ksize, stride, padding):
    # Distinct values: the gradient goes to the unique maximum of each window.
    n = int(np.prod(x_shape))
    x = (np.random.default_rng(9).permutation(n).reshape(x_shape) / 8).astype(np.float32)
    pool = lambda a: tf.nn.max_pool2d(a, ksize, stride, padding)  # noqa: E731
    _compare(npusim, tf, pool, [x], ["MaxPool_", "MaxPoolGrad_"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("x_shape,ksize,stride,padding", [
    ((2, 13, 11, 64), 3, 2, "SAME"),  # ResNet-50's pool geometry, sizes that divide nothing
    ((3, 12, 10, 8), 3, 2, "VALID"),  # the last row and column in no window
    ((1, 9, 7, 5), 3, 1, "SAME"),  # channels not whole blocks; each row in three window rows
    ((2, 8, 9, 16), 2, 3, "VALID")], ids=str)  # stride > window: inputs in no window
def test_max_pool_grad_ties(npusim, tf, strict_placement, dtype, x_shape, ksize, stride,
                            padding):
    """MaxPoolGrad as the raw op, x on a grid of four values (most windows hold ties: the first
    maximum in the window's scan order takes the gradient, TF's CPU rule). dy is multiples of
    1/4 in [-2, 2] and an input is in at most 9 windows, so every sum is exact in f16 as in
    f32 and the NPU must equal the CPU bit for bit, whatever the order of the additions."""
    rng = np.random.default_rng(12)
    x = rng.integers(0, 4, size=x_shape).astype(dtype)
    attrs = dict(ksize=[1, ksize, ksize, 1], strides=[1, stride, stride, 1], padding=padding)
    with tf.device("/CPU:0"):
        y = tf.nn.max_pool2d(tf.constant(x), ksize, stride, padding).numpy()
    dy = _quarters(y.shape, 13).astype(dtype)
    npusim.clear_launch_records()
    results = []
    for device in ("/NPU:0", "/CPU:0"):
        with tf.device(device):
            results.append(tf.raw_ops.MaxPoolGrad(orig_input=tf.constant(x),
                                                  orig_output=tf.constant(y),
                                                  grad=tf.constant(dy), **attrs))
    got, want = results
    assert got.device.endswith("device:NPU:0"), got.device
    assert got.dtype == want.dtype and got.shape == x.shape
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert any(r["kernel"].startswith("MaxPoolGrad_") for r in npusim.launch_records())


@pytest.mark.parametrize("x_shape,ksize,stride,padding", [
    ((2, 7, 9, 3), 2, 2, "VALID"), ((1, 6, 5, 20), 3, 2, "SAME")], ids=str)
def test_avg_pool_and_gradient(npusim, tf, strict_placement, x_shape, ksize, stride, padding):
    x = _uniform(x_shape, 10)
    pool = lambda a: tf.nn.avg_pool2d(a, ksize, stride, padding)  # noqa: E731
    # The NPU multiplies by f32 reciprocals of the valid window sizes, TF divides: 2 ulp.
    _compare(npusim, tf, pool, [x], ["AvgPool_", "AvgPoolGrad_"], rtol=1e-6, atol=1e-7)


def test_pooling_half(npusim, tf, strict_placement):
    x = _uniform((1, 6, 6, 5), 11).astype(np.float16)
    _compare(npusim, tf, lambda a: tf.nn.max_pool2d(a, 2, 2, "VALID"), [x], ["MaxPool_"],
             grads=False)


def _fused_bn(tf, training, mean=None, var=None, factor=1.0):
    def fn(x, scale, offset):
        c = x.shape[-1]
        m = tf.constant(mean if mean is not None else np.zeros(c, np.float32))
        v = tf.constant(var if var is not None else np.ones(c, np.float32))
        y, batch_mean, batch_var, _, _, _ = tf.raw_ops.FusedBatchNormV3(
            x=x, scale=scale, offset=offset, mean=m, variance=v, epsilon=1e-3,
            exponential_avg_factor=factor, data_format="NHWC", is_training=training)
        # Every output is checked through y: the statistics feed the comparison too.
        return y + tf.reduce_sum(batch_mean) + tf.reduce_sum(batch_var)
    return fn


@pytest.mark.parametrize("x_shape", [(2, 5, 3, 7), (4, 1, 1, 17), (1, 6, 6, 1)], ids=str)
def test_fused_batch_norm_training_and_gradient(npusim, tf, strict_placement, x_shape):
    c = x_shape[-1]
    x = _uniform(x_shape, 12, -2.0, 2.0)
    scale = _uniform((c,), 13, 0.5, 1.5)
    offset = _uniform((c,), 14)
    # Both sides are float32 summing in their own orders: at 4 pixels a channel dx cancels
    # O(1) terms, and each side's dx is up to ~7e-5 from a float64 evaluation of the same
    # formula (measured 2026-12-05 at (4, 1, 1, 17): NPU 6.6e-5, CPU 5.3e-5, of opposite
    # signs), so the two may differ by their sum: atol 2e-4.
    _compare(npusim, tf, _fused_bn(tf, True), [x, scale, offset],
             ["BatchNorm_", "BatchNormGrad_"], rtol=1e-4, atol=2e-4)


def test_fused_batch_norm_inference_and_moving_average(npusim, tf, strict_placement):
    x = _uniform((2, 4, 3, 9), 15, -2.0, 2.0)
    scale = _uniform((9,), 16, 0.5, 1.5)
    offset = _uniform((9,), 17)
    mean = _uniform((9,), 18, -0.5, 0.5)
    var = _uniform((9,), 19, 0.5, 2.0)
    _compare(npusim, tf, _fused_bn(tf, False, mean, var), [x, scale, offset], ["BatchNorm_"],
             rtol=1e-5, atol=1e-5)
    # Training with exponential averaging: the running statistics are outputs 1 and 2.
    _compare(npusim, tf, _fused_bn(tf, True, mean, var, factor=0.25), [x, scale, offset],
             ["BatchNorm_"], grads=False, rtol=1e-5, atol=1e-5)


def test_fused_batch_norm_outputs_as_tensorflow_expects(npusim, tf, strict_placement):
    x = _uniform((2, 3, 3, 5), 20)
    with tf.device("/NPU:0"):
        outs = tf.raw_ops.FusedBatchNormV3(
            x=tf.constant(x), scale=tf.ones([5]), offset=tf.zeros([5]), mean=tf.zeros([0]),
            variance=tf.zeros([0]), epsilon=1e-3, is_training=True)
    assert [o.shape.as_list() for o in outs] == [[2, 3, 3, 5], [5], [5], [5], [5], []]
    np.testing.assert_allclose(outs[1].numpy(), x.mean(axis=(0, 1, 2)), rtol=1e-5, atol=1e-6)
    # TF's running variance is Bessel-corrected (n / (n - 1)), the reserve space is not.
    n = 18
    np.testing.assert_allclose(outs[2].numpy(), x.var(axis=(0, 1, 2)) * n / (n - 1), rtol=1e-5)
    np.testing.assert_allclose(outs[4].numpy(), x.var(axis=(0, 1, 2)), rtol=1e-5)


# Inside a tf.function, TensorFlow's placer puts a node without an NPU kernel on the CPU even
# with soft placement off (only explicitly placed nodes must match); the plugin's graph pass
# counts such nodes (npusim.cpu_fallback_ops, where this build has it).
def _clear_fallbacks(npusim):
    if hasattr(npusim, "clear_cpu_fallback_ops"):
        npusim.clear_cpu_fallback_ops()


def _assert_no_fallbacks(npusim):
    if hasattr(npusim, "cpu_fallback_ops"):
        assert npusim.cpu_fallback_ops() == {}, npusim.cpu_fallback_ops()


def _cnn(keras, seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((9, 9, 2)),
        keras.layers.Conv2D(6, 3, padding="same", use_bias=False),
        keras.layers.BatchNormalization(),
        keras.layers.ReLU(),
        keras.layers.MaxPool2D(2),
        keras.layers.Conv2D(5, 3, padding="valid"),
        keras.layers.Flatten(),
        keras.layers.Dense(4),
    ])


def _train(tf, keras, device, x, labels, weights, steps, lr=0.02):
    """SGD steps of a tf.function GradientTape train step on `device`; returns the losses."""
    with tf.device(device):
        # Building runs Keras' initializers (seeded random ops, an int32 -> int64 Cast), which
        # have no NPU kernel: soft placement is on while building, off for the train steps.
        strict = not tf.config.get_soft_device_placement()
        tf.config.set_soft_device_placement(True)
        model = _cnn(keras, 0)
        model.set_weights(weights)
        tf.config.set_soft_device_placement(not strict)
        xs, ys = tf.constant(x), tf.constant(labels)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                logits = model(xs, training=True)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=ys, logits=logits))
            grads = tape.gradient(loss, model.trainable_variables)
            for v, g in zip(model.trainable_variables, grads):
                v.assign_sub(lr * g)
            return loss

        return [float(step().numpy()) for _ in range(steps)], model


def test_keras_cnn_sgd_steps_track_the_cpu(npusim, tf, strict_placement):
    keras = pytest.importorskip("keras")
    rng = np.random.default_rng(21)
    x = rng.uniform(-1, 1, (8, 9, 9, 2)).astype(np.float32)
    labels = rng.integers(0, 4, 8).astype(np.int32)
    with tf.device("/CPU:0"):
        weights = _cnn(keras, 0).get_weights()
    _clear_fallbacks(npusim)
    npusim.clear_launch_records()
    losses, model = _train(tf, keras, "/NPU:0", x, labels, weights, steps=6)
    _assert_no_fallbacks(npusim)
    kernels = {r["kernel"].split("_")[0] for r in npusim.launch_records()}
    assert all(v.value.device.endswith("device:NPU:0") for v in model.variables)
    # Keras 3's BatchNormalization computes moments (Mean, SquaredDifference) and normalises
    # with Rsqrt and arithmetic, not with FusedBatchNormV3; with its gradient it runs as CANN's
    # training batch norm (graph_fusion.h rewrite 0), the constant learning rate that grappler
    # folds into the scale's gradient included (docs/graph_engine.md, "The training batch norm
    # under Keras' loss scaling").
    assert {"Conv2D", "Conv2DBackpropInput", "FilterGrad", "MaxPool", "MaxPoolGrad", "MatMul",
            "SparseSoftmaxCrossEntropyWithLogits"} <= kernels, kernels
    assert any(k.startswith("BNTrainingUpdate") for k in kernels), kernels
    assert any(k.startswith("BNTrainingReduceGrad") for k in kernels), kernels
    assert "SquaredDifference" not in kernels, kernels
    losses_cpu, _ = _train(tf, keras, "/CPU:0", x, labels, weights, steps=6)
    assert losses_cpu[-1] < losses_cpu[0] / 2
    # Convolutions and the Dense MatMul see fp16-rounded inputs (relative 2^-11 = 4.9e-4
    # each), so each step's gradients differ by about 1e-3 relative and the weights drift
    # apart; over 6 steps (loss 3.2 -> 0.94) the losses stayed within 2e-3 relative: 5e-3.
    np.testing.assert_allclose(losses, losses_cpu, rtol=5e-3)


def _blocks(keras):
    """The layers MobileNetV2 and ResNet-50 are made of, in two small residual blocks: an
    inverted residual (1x1 expand, ZeroPadding2D + stride-2 DepthwiseConv2D, ReLU6, 1x1
    project) and a bottleneck (Conv2D with bias, MaxPool 3x3/2, residual Add), global average
    pooling and a Dense head."""
    layers = keras.layers
    inp = keras.Input((10, 10, 3))
    x = layers.Conv2D(8, 3, padding="same", use_bias=False)(inp)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(6.0)(x)
    x = layers.ZeroPadding2D(((0, 1), (0, 1)))(x)
    x = layers.DepthwiseConv2D(3, strides=2, padding="valid", use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(6.0)(x)
    shortcut = layers.Conv2D(6, 1)(x)
    y = layers.Conv2D(6, 3, padding="same")(x)
    y = layers.BatchNormalization()(y)
    x = layers.Activation("relu")(layers.Add()([shortcut, y]))
    x = layers.MaxPool2D(3, strides=2, padding="same")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, layers.Dense(4)(x))


def test_mobilenet_and_resnet_blocks_forward_and_backward(npusim, tf, strict_placement):
    keras = pytest.importorskip("keras")
    rng = np.random.default_rng(22)
    x = rng.uniform(-1, 1, (4, 10, 10, 3)).astype(np.float32)
    labels = rng.integers(0, 4, 4).astype(np.int32)
    with tf.device("/CPU:0"):
        keras.utils.set_random_seed(1)
        weights = _blocks(keras).get_weights()
    results = {}
    for device in ("/NPU:0", "/CPU:0"):
        with tf.device(device):
            tf.config.set_soft_device_placement(True)  # building: see _train
            model = _blocks(keras)
            model.set_weights(weights)
            tf.config.set_soft_device_placement(False)

            @tf.function
            def loss_and_grads(xs, ys):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                        labels=ys, logits=model(xs, training=True)))
                return loss, tape.gradient(loss, model.trainable_variables)

            _clear_fallbacks(npusim)
            npusim.clear_launch_records()
            loss, grads = loss_and_grads(tf.constant(x), tf.constant(labels))
            _assert_no_fallbacks(npusim)
            results[device] = (loss, grads, npusim.launch_records())
    loss, grads, records = results["/NPU:0"]
    kernels = {r["kernel"].split("_")[0] for r in records}
    assert {"Conv2D", "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
            "DepthwiseFilterGrad", "Relu6", "Relu6Grad", "Pad", "MaxPool", "MaxPoolGrad",
            "Img2col", "FilterGrad"} <= kernels, kernels
    assert all(g.device.endswith("device:NPU:0") for g in grads), [g.device for g in grads]
    # fp16 rounding of the cube ops' inputs (2^-11 relative), through about 10 layers forward
    # and back, with BatchNormalization on 16..400 values per channel: gradients within 2e-2
    # of their norm (seen: below 1e-2), the loss within 1e-3.
    np.testing.assert_allclose(loss.numpy(), results["/CPU:0"][0].numpy(), rtol=1e-3)
    # The bias of the convolution feeding a BatchNormalization has a zero gradient (the batch
    # mean is subtracted): both devices give rounding noise there, hence the absolute 1e-5.
    for v, g, g_cpu in zip(model.trainable_variables, grads, results["/CPU:0"][1]):
        diff = np.linalg.norm(g.numpy() - g_cpu.numpy())
        assert diff <= 2e-2 * np.linalg.norm(g_cpu.numpy()) + 1e-5, (v.path, diff)
