"""AddReluCast (the vector unit's vaddreluconv) in a coupled chip's convolution way out
(docs/compiler.md "AddReluCast in the way out"): Conv2DBatchNormInference with an f16 output and
ReLU6 or ReLU on tiny_coupled (the 310p's core, which has the instruction), run by `npusim op` on
.npy inputs, against TensorFlow on the CPU (convolution, batch norm and activation in float32,
then rounded to float16):

- ReLU6 with the instruction (the default): the listing holds vaddreluconv, fewer f32 -> f16
  vconv; with NPUSIM_FUSION_ADD_RELU_CAST=0: no vaddreluconv (the f32 shift, the rounding and the
  clamps as before); the two outputs are the same values (the rounding is monotone and 0 and 6
  are exact in f16, so clamping before or after it gives the same numbers; a sum past the f16
  range gives 6 either way);
- ReLU never takes it (vaddreluconv saturates to 65504 where the rounding and TensorFlow give
  +inf): a sum past the f16 range gives +inf;
- on the 910 preset (no AddReluCast) the same op compiles without it.
Shapes: 96 channels (tiles of 48: the periodic tables' runs), 150 channels (64-lane column groups,
a masked last one, several n tiles); and MatMulBiasAdd with ReLU (the bias's column bands).
"""
import os
import subprocess

import numpy as np
import pytest

from conftest import _build_dir

NPUSIM = os.path.join(_build_dir(), "npusim")


def _inputs(tmp_path, shape, k, cout, seed):
    rng = np.random.default_rng(seed)
    c = shape[3]
    tensors = {
        "x": rng.uniform(-1, 1, shape).astype(np.float16),
        "w": rng.uniform(-0.5, 0.5, (k, k, c, cout)).astype(np.float32),
        "scale": rng.uniform(0.5, 2, cout).astype(np.float32),
        "offset": rng.uniform(-1, 1, cout).astype(np.float32),
        "mean": rng.uniform(-0.5, 0.5, cout).astype(np.float32),
        "var": rng.uniform(0.1, 2, cout).astype(np.float32),
    }
    paths = []
    for name, t in tensors.items():
        path = tmp_path / f"{name}.npy"
        np.save(path, t)
        paths.append(str(path))
    return tensors, paths


def _npusim_op(out, op_type, paths, attrs, chip, fused, sets=()):
    """`npusim op` on .npy inputs, output 0 to `out`; NPUSIM_FUSION_ADD_RELU_CAST=0 unless
    fused; `sets`: --set overrides of the chip. Returns the output and the listing."""
    args = [NPUSIM, "op", op_type]
    for p in paths:
        args += ["--input", p]
    for a in attrs:
        args += ["--attr", a]
    for kv in sets:
        args += ["--set", kv]
    args += ["--chip", chip, "--output", str(out), "--listing"]
    env = dict(os.environ)
    env.pop("NPUSIM_FUSION_ADD_RELU_CAST", None)
    if not fused:
        env["NPUSIM_FUSION_ADD_RELU_CAST"] = "0"
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    return np.load(out), p.stdout


def _run_op(tmp_path, paths, act, chip, fused, sets=()):
    return _npusim_op(tmp_path / f"y_{chip}_{int(fused)}.npy", "Conv2DBatchNormInference", paths,
                      ["strides=[1,1,1,1]", "padding=SAME", "epsilon=0.001", f"{act}=true",
                       "Tx=f16", "Tout=f16"], chip, fused, sets)


def _save(tmp_path, tensors):
    paths = []
    for name, t in tensors.items():
        np.save(tmp_path / f"{name}.npy", t)
        paths.append(str(tmp_path / f"{name}.npy"))
    return paths


def _reference(tf, t, act):
    with tf.device("/CPU:0"):
        y = tf.nn.conv2d(tf.constant(t["x"].astype(np.float32)), tf.constant(t["w"]),
                         strides=1, padding="SAME")
        y = (y - t["mean"]) * (t["scale"] / np.sqrt(t["var"] + np.float32(0.001))) + t["offset"]
        y = tf.nn.relu6(y) if act == "relu6" else tf.nn.relu(y)
        return tf.cast(y, tf.float16).numpy()


@pytest.mark.parametrize("act", ["relu6", "relu"])
@pytest.mark.parametrize("shape,k,cout", [((2, 14, 14, 16), 1, 96), ((1, 9, 9, 24), 3, 150)])
def test_conv_bn_activation_with_and_without_add_relu_cast(tf, tmp_path, act, shape, k, cout):
    t, paths = _inputs(tmp_path, shape, k, cout, seed=cout + k)
    ref = _reference(tf, t, act)
    fused, listing = _run_op(tmp_path, paths, act, "tiny_coupled", True)
    assert ("vaddreluconv.f16.f32" in listing) == (act == "relu6")
    plain, listing_off = _run_op(tmp_path, paths, act, "tiny_coupled", False)
    assert "vaddreluconv" not in listing_off
    # with ReLU6 the way out's rounding is the instruction's (the fold of the filter keeps its
    # own); ReLU keeps the plain way out
    if act == "relu6":
        assert listing.count("vconv.f16.f32") < listing_off.count("vconv.f16.f32")
    else:
        assert listing.count("vconv.f16.f32") == listing_off.count("vconv.f16.f32")
    assert fused.dtype == np.float16 and fused.shape == ref.shape
    # The folded filter f16(W * a) rounds each product's factor: a few f16 ulps of the largest
    # output, against float32 on the CPU.
    np.testing.assert_allclose(fused.astype(np.float32), ref.astype(np.float32), rtol=1e-2,
                               atol=3e-2)
    np.testing.assert_array_equal(fused, plain)  # the same values (+0 and -0 compare equal)
    assert fused.min() >= 0 and (act != "relu6" or fused.max() <= 6)
    if act == "relu6":
        assert (fused == 6).any() and (fused == 0).any()  # both clamps are exercised


def test_matmul_bias_relu_keeps_the_rounding(tf, tmp_path):
    """MatMulBiasAdd (f16, f32 bias) with ReLU: the column bands of the bias's way out."""
    rng = np.random.default_rng(11)
    a = rng.uniform(-1, 1, (300, 128)).astype(np.float16)
    b = rng.uniform(-1, 1, (128, 200)).astype(np.float16)
    bias = rng.uniform(-2, 2, 200).astype(np.float32)
    paths = _save(tmp_path, {"a": a, "b": b, "bias": bias})
    outs = {}
    for fused in (True, False):
        outs[fused], listing = _npusim_op(tmp_path / f"mm_{int(fused)}.npy", "MatMulBiasAdd",
                                          paths, ["relu=true", "Tbias=f32"], "tiny_coupled",
                                          fused)
        assert "vaddreluconv" not in listing  # ReLU: the rounding, then the clamp
    with tf.device("/CPU:0"):
        ref = tf.cast(tf.nn.relu(tf.matmul(a.astype(np.float32), b.astype(np.float32)) + bias),
                      tf.float16).numpy()
    # f16 products exact in f32, sums of 128 in f32 (order differs from the CPU's), one rounding
    np.testing.assert_allclose(outs[True].astype(np.float32), ref.astype(np.float32), rtol=2e-3,
                               atol=2e-3)
    np.testing.assert_array_equal(outs[True], outs[False])


def test_no_add_relu_cast_on_the_910(tf, tmp_path):  # pylint: disable=unused-argument
    _, paths = _inputs(tmp_path, (1, 8, 8, 16), 1, 96, seed=5)
    y, listing = _run_op(tmp_path, paths, "relu6", "910", True)
    assert "vaddreluconv" not in listing and "vconv.f16.f32" in listing
    assert y.shape == (1, 8, 8, 96)


@pytest.mark.parametrize("chip", ["tiny_coupled", "910"])  # with the instruction and without
def test_bad_switch_value_is_a_clear_error(tmp_path, chip):
    _, paths = _inputs(tmp_path, (1, 4, 4, 16), 1, 32, seed=6)
    args = [NPUSIM, "op", "Conv2DBatchNormInference"]
    for p in paths:
        args += ["--input", p]
    args += ["--attr", "epsilon=0.001", "--attr", "relu6=true", "--attr", "Tx=f16",
             "--attr", "Tout=f16", "--attr", "strides=[1,1,1,1]", "--attr", "padding=SAME",
             "--chip", chip, "--timing-only"]
    env = dict(os.environ, NPUSIM_FUSION_ADD_RELU_CAST="yes")
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert p.returncode != 0
    assert "NPUSIM_FUSION_ADD_RELU_CAST='yes' is neither '0' nor '1'" in p.stderr, p.stderr


def test_sum_past_f16_range_relu_is_inf_relu6_is_6(tf, tmp_path):
    """A sum past 65504 (200 x 10 x 64 = 128000): +inf under ReLU, as TensorFlow on the CPU (the
    instruction would have saturated to 65504), 6 under ReLU6 with vaddreluconv."""
    a = np.full((32, 64), 200, np.float16)
    b = np.full((64, 64), 10, np.float16)
    paths = _save(tmp_path, {"a": a, "b": b, "bias": np.zeros(64, np.float32)})
    y, _ = _npusim_op(tmp_path / "mm.npy", "MatMulBiasAdd", paths, ["relu=true", "Tbias=f32"],
                      "tiny_coupled", True)
    with tf.device("/CPU:0"):
        ref = tf.cast(tf.nn.relu(tf.matmul(a.astype(np.float32), b.astype(np.float32))),
                      tf.float16).numpy()
    assert np.isposinf(ref).all()
    np.testing.assert_array_equal(y, ref)
    # Conv2DBatchNormInference 1x1 over 16 channels of 200 x 50 (a = 1, shift 0): 160000
    cout = 64
    t = {"x": np.full((1, 4, 4, 16), 200, np.float16),
         "w": np.full((1, 1, 16, cout), 50, np.float32),
         "scale": np.ones(cout, np.float32), "offset": np.zeros(cout, np.float32),
         "mean": np.zeros(cout, np.float32), "var": np.full(cout, 0.999, np.float32)}
    paths = _save(tmp_path, t)
    for act in ("relu", "relu6"):
        y, listing = _run_op(tmp_path, paths, act, "tiny_coupled", True)
        assert ("vaddreluconv" in listing) == (act == "relu6")
        ref = _reference(tf, t, act)
        assert (np.isposinf(ref) if act == "relu" else ref == 6).all()
        np.testing.assert_array_equal(y, ref)


def test_relu6_scratch_on_a_one_bank_ub_is_aligned(tf, tmp_path):
    """ReLU6's clamp scratch sits half a UB bank span from the output tile: with one 32-byte bank
    half a span is not a multiple of the UB's 32-byte alignment, so the clamps run in place
    (a scratch at 16 bytes would be a misaligned vmaxs operand), with and without vaddreluconv."""
    t, paths = _inputs(tmp_path, (2, 14, 14, 16), 1, 96, seed=12)
    ref = _reference(tf, t, "relu6")
    one_bank = ["ub_banking.banks=1", "ub_banking.bank_groups=1",
                "ub_banking.bank_width_bytes=32"]
    for fused in (False, True):
        y, _ = _run_op(tmp_path, paths, "relu6", "310p", fused, one_bank)
        np.testing.assert_allclose(y.astype(np.float32), ref.astype(np.float32), rtol=1e-2,
                                   atol=3e-2)


def test_relu6_tiny_negative_sum_is_plus_zero(tf, tmp_path):
    """A negative sum that rounds to -0 in f16 (-2^-28): ReLU6 with vaddreluconv gives +0 as
    TensorFlow on the CPU (max with 0 before the rounding); the assertions elsewhere compare
    values, for which -0 == +0 (the plain way out keeps -0: docs/compiler.md)."""
    cout = 64
    x = np.zeros((1, 4, 4, 16), np.float16)
    x[..., 0] = 2.0**-14
    w = np.zeros((1, 1, 16, cout), np.float32)
    w[0, 0, 0, :] = -(2.0**-14)
    t = {"x": x, "w": w, "scale": np.ones(cout, np.float32),
         "offset": np.zeros(cout, np.float32), "mean": np.zeros(cout, np.float32),
         "var": np.full(cout, 0.999, np.float32)}
    paths = _save(tmp_path, t)
    y, listing = _run_op(tmp_path, paths, "relu6", "tiny_coupled", True)
    assert "vaddreluconv" in listing
    ref = _reference(tf, t, "relu6")
    assert (ref == 0).all() and not np.signbit(ref).any()
    np.testing.assert_array_equal(np.signbit(y), np.signbit(ref))
