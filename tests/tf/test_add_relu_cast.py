"""AddReluCast (the vector unit's vaddreluconv) in a coupled chip's convolution way out
(docs/compiler.md "AddReluCast in the way out"): Conv2DBatchNormInference with an f16 output and
ReLU6 or ReLU on tiny_coupled (the 310p's core, which has the instruction), run by `npusim op` on
.npy inputs, against TensorFlow on the CPU (convolution, batch norm and activation in float32,
then rounded to float16):

- with the instruction (the default): the listing holds vaddreluconv, fewer f32 -> f16 vconv;
- with NPUSIM_FUSION_ADD_RELU_CAST=0: no vaddreluconv (the f32 shift, the rounding and the
  clamps as before); the two outputs are the same values (the rounding is monotone and 0 and 6
  are exact in f16, so clamping before or after it gives the same numbers);
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


def _npusim_op(out, op_type, paths, attrs, chip, fused):
    """`npusim op` on .npy inputs, output 0 to `out`; NPUSIM_FUSION_ADD_RELU_CAST=0 unless
    fused. Returns the output and the listing."""
    args = [NPUSIM, "op", op_type]
    for p in paths:
        args += ["--input", p]
    for a in attrs:
        args += ["--attr", a]
    args += ["--chip", chip, "--output", str(out), "--listing"]
    env = dict(os.environ)
    env.pop("NPUSIM_FUSION_ADD_RELU_CAST", None)
    if not fused:
        env["NPUSIM_FUSION_ADD_RELU_CAST"] = "0"
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    return np.load(out), p.stdout


def _run_op(tmp_path, paths, act, chip, fused):
    return _npusim_op(tmp_path / f"y_{chip}_{int(fused)}.npy", "Conv2DBatchNormInference", paths,
                      ["strides=[1,1,1,1]", "padding=SAME", "epsilon=0.001", f"{act}=true",
                       "Tx=f16", "Tout=f16"], chip, fused)


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
    assert "vaddreluconv.f16.f32" in listing
    plain, listing_off = _run_op(tmp_path, paths, act, "tiny_coupled", False)
    assert "vaddreluconv" not in listing_off
    # the way out's rounding is the instruction's (the fold of the filter keeps its own)
    assert listing.count("vconv.f16.f32") < listing_off.count("vconv.f16.f32")
    assert fused.dtype == np.float16 and fused.shape == ref.shape
    # The folded filter f16(W * a) rounds each product's factor: a few f16 ulps of the largest
    # output, against float32 on the CPU.
    np.testing.assert_allclose(fused.astype(np.float32), ref.astype(np.float32), rtol=1e-2,
                               atol=3e-2)
    np.testing.assert_array_equal(fused, plain)  # the same values (+0 and -0 compare equal)
    assert fused.min() >= 0 and (act != "relu6" or fused.max() <= 6)
    if act == "relu6":
        assert (fused == 6).any() and (fused == 0).any()  # both clamps are exercised


def test_matmul_bias_relu_with_and_without_add_relu_cast(tf, tmp_path):
    """MatMulBiasAdd (f16, f32 bias) with ReLU: the column bands of the bias's way out."""
    rng = np.random.default_rng(11)
    a = rng.uniform(-1, 1, (300, 128)).astype(np.float16)
    b = rng.uniform(-1, 1, (128, 200)).astype(np.float16)
    bias = rng.uniform(-2, 2, 200).astype(np.float32)
    paths = []
    for name, t in (("a", a), ("b", b), ("bias", bias)):
        np.save(tmp_path / f"{name}.npy", t)
        paths.append(str(tmp_path / f"{name}.npy"))
    outs = {}
    for fused in (True, False):
        outs[fused], listing = _npusim_op(tmp_path / f"mm_{int(fused)}.npy", "MatMulBiasAdd",
                                          paths, ["relu=true", "Tbias=f32"], "tiny_coupled",
                                          fused)
        assert ("vaddreluconv" in listing) == fused
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


def test_bad_switch_value_is_a_clear_error(tmp_path):
    _, paths = _inputs(tmp_path, (1, 4, 4, 16), 1, 32, seed=6)
    args = [NPUSIM, "op", "Conv2DBatchNormInference"]
    for p in paths:
        args += ["--input", p]
    args += ["--attr", "epsilon=0.001", "--attr", "relu6=true", "--attr", "Tx=f16",
             "--attr", "Tout=f16", "--attr", "strides=[1,1,1,1]", "--attr", "padding=SAME",
             "--chip", "tiny_coupled", "--timing-only"]
    env = dict(os.environ, NPUSIM_FUSION_ADD_RELU_CAST="yes")
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert p.returncode != 0
    assert "NPUSIM_FUSION_ADD_RELU_CAST='yes' is neither '0' nor '1'" in p.stderr, p.stderr
