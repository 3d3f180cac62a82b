"""Offline models (docs/graph_engine.md): a Keras CNN with batch norm and the Transformer encoder
of models/, saved with model.export(), compiled by `npusim compile` for the tiny chip and run by `npusim infer` and
npusim.load_offline_model, against TensorFlow on the CPU; the errors for a corrupt, truncated,
other-chip .om, a wrong input shape or dtype, and a SavedModel with unmappable ops."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, child_env

pytest.importorskip("tensorflow")

BUILD = os.environ.get("NPUSIM_BUILD_DIR", os.path.join(ROOT, "build"))
NPUSIM = os.path.join(BUILD, "npusim")

# Builds the model in a child without npusim (TensorFlow on the CPU only), with batch-norm
# statistics and a Dense bias that are not the initial ones, exports it and writes the CPU's
# output for x.npy.
MAKE_CNN = r"""
import sys, numpy as np, keras
sys.path.insert(0, {root!r})
from models import cnn
out = {out!r}
m = cnn.build(16, 10)
rng = np.random.default_rng(0)
for layer in m.layers:
    w = layer.get_weights()
    if isinstance(layer, keras.layers.BatchNormalization):
        c = w[0].shape
        layer.set_weights([rng.uniform(0.5, 1.5, c), rng.normal(0, 0.2, c), rng.normal(0, 0.2, c),
                           rng.uniform(0.5, 1.5, c)])
    elif isinstance(layer, keras.layers.Dense):
        layer.set_weights([w[0], rng.normal(0, 0.5, w[1].shape)])
m.export(out + "/cnn")
x = rng.standard_normal((2, 16, 16, 1)).astype(np.float32)
np.save(out + "/x.npy", x)
np.save(out + "/ref.npy", m.predict(x, verbose=0))
from models import transformer
e = transformer.build(16, 10)
e.export(out + "/encoder")
tokens = rng.integers(0, transformer.VOCAB, (1, 16)).astype(np.int32)
np.save(out + "/tokens.npy", tokens)
np.save(out + "/encoder_ref.npy", e.predict(tokens, verbose=0))
"""

MAKE_UNMAPPABLE = r"""
import tensorflow as tf
class M(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
    def __call__(self, x):
        return tf.sinh(tf.nn.relu(tf.atan(x)))
tf.saved_model.save(M(), {out!r} + "/unmappable")
"""

# A model with a loop (tf.while_loop, as Keras' LSTM lowers to): the frontend passes the lowered
# control flow through; the engine refuses it, naming its nodes.
MAKE_LOOP = r"""
import tensorflow as tf
class M(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([1, 8], tf.float32)])
    def __call__(self, x):
        return tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.nn.relu(h) + 1.0),
                             (tf.constant(0), x))[1]
tf.saved_model.save(M(), {out!r} + "/loop")
"""


def run(args, check=True):
    env = child_env()
    env["NPUSIM_PYTHON"] = sys.executable
    r = subprocess.run([NPUSIM] + args, env=env, capture_output=True, text=True, timeout=300,
                       check=False)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def run_python(code):
    env = child_env()
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    if not os.access(NPUSIM, os.X_OK):
        pytest.skip(f"{NPUSIM} is not built")
    out = str(tmp_path_factory.mktemp("offline"))
    run_python(MAKE_CNN.format(root=ROOT, out=out))
    om = os.path.join(out, "cnn.om")
    report = os.path.join(out, "compile.json")
    r = run(["compile", out + "/cnn", "--chip", "tiny", "--input-shape", "keras_tensor:2,16,16,1",
             "-o", om, "--report", report])
    with open(report, encoding="utf-8") as f:
        return {"dir": out, "om": om, "report": json.load(f), "stdout": r.stdout,
                "x": np.load(out + "/x.npy"), "ref": np.load(out + "/ref.npy")}


def test_encoder_matches_tf_cpu(cnn, tmp_path):
    om = str(tmp_path / "encoder.om")
    r = run(["compile", cnn["dir"] + "/encoder", "--chip", "tiny", "-o", om, "--no-estimate"])
    assert "-> FusedElementwise" in r.stdout  # the layer norms' arithmetic
    y = tmp_path / "y.npy"
    run(["infer", om, "--input", cnn["dir"] + "/tokens.npy", "--output", str(y)])
    close_to_cpu(np.load(y), np.load(cnn["dir"] + "/encoder_ref.npy"))


def close_to_cpu(y, ref):
    # Convolutions and the Dense layer take fp16 operands (allow_fp32_to_fp16).
    np.testing.assert_allclose(y, ref, rtol=2e-2, atol=2e-3)
    assert (y.argmax(axis=1) == ref.argmax(axis=1)).all()


def test_compile_report(cnn):
    r = cnn["report"]
    fused = [f for f in r["fusions"] if f["pattern"].endswith("Conv2DBatchNormInference")]
    assert len(fused) == 2  # each convolution with its batch norm (grappler folded the scale)
    ops = [n["op"] for n in r["nodes"]]
    assert ops.count("Conv2DBatchNormInference") == 2 and "Conv2D" not in ops
    mem = r["memory"]
    assert 0 < mem["activation_peak_bytes"] < mem["activation_bytes_without_reuse"]
    assert r["estimate"]["cycles"] > 0 and r["launches"] > 0
    assert "fusions applied: 2" in cnn["stdout"]


def test_infer_matches_tf_cpu(cnn, tmp_path):
    y = tmp_path / "y.npy"
    rep = tmp_path / "rep"
    run(["infer", cnn["om"], "--input", cnn["dir"] + "/x.npy", "--output", str(y), "--loop", "2",
         "--report-dir", str(rep)])
    close_to_cpu(np.load(y), cnn["ref"])
    with open(rep / "op_summary.csv", encoding="utf-8") as f:
        summary = f.read()
    assert "Conv2DBatchNormInference" in summary
    assert "re_lu_1/Relu" in summary  # the original node names (the chain's last, its ReLU)


def test_load_offline_model(cnn, npusim):
    model = npusim.load_offline_model(cnn["om"])
    close_to_cpu(model(cnn["x"]), cnn["ref"])
    with pytest.raises(npusim.NpusimError, match=r"expected f32\[2,16,16,1\]"):
        model(cnn["x"][:1])


def test_wrong_input_shape_and_dtype(cnn, tmp_path):
    for name, array, expect in [
            ("shape", cnn["x"][:1], "got numpy f4[1,16,16,1]"),
            ("dtype", cnn["x"].astype(np.float16), "got numpy f2[2,16,16,1]")]:
        np.save(tmp_path / f"{name}.npy", array)
        r = run(["infer", cnn["om"], "--input", str(tmp_path / f"{name}.npy")], check=False)
        assert r.returncode == 1
        assert "input 'keras_tensor'" in r.stderr and "expected f32[2,16,16,1]" in r.stderr
        assert expect in r.stderr


def test_other_chip_corrupt_truncated(cnn, tmp_path):
    x = cnn["dir"] + "/x.npy"
    r = run(["infer", cnn["om"], "--input", x, "--chip", "910b"], check=False)
    assert r.returncode == 1 and "compiled for chip 'tiny', not '910b'" in r.stderr
    data = open(cnn["om"], "rb").read()
    bad = tmp_path / "bad.om"
    bad.write_bytes(data[: len(data) // 2])
    r = run(["infer", str(bad), "--input", x], check=False)
    assert r.returncode == 1 and "truncated" in r.stderr
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 1
    bad.write_bytes(bytes(flipped))
    r = run(["infer", str(bad), "--input", x], check=False)
    assert r.returncode == 1 and "corrupt: the checksum does not match" in r.stderr


def test_unmappable_ops_listed(cnn, tmp_path):
    run_python(MAKE_UNMAPPABLE.format(out=str(tmp_path)))
    r = run(["compile", str(tmp_path / "unmappable"), "--chip", "tiny", "-o",
             str(tmp_path / "u.om"), "--no-estimate"], check=False)
    assert r.returncode == 1
    assert "2 node(s) cannot be mapped" in r.stderr
    assert "(Atan)" in r.stderr and "(Sinh)" in r.stderr
    assert not (tmp_path / "u.om").exists()


def test_control_flow_is_an_error_naming_its_nodes(cnn, tmp_path):
    run_python(MAKE_LOOP.format(out=str(tmp_path)))
    r = run(["compile", str(tmp_path / "loop"), "--chip", "tiny", "-o", str(tmp_path / "l.om"),
             "--no-estimate"], check=False)
    assert r.returncode == 1, r.stderr
    assert "control-flow node(s) of a lowered tf.cond or tf.while_loop" in r.stderr, r.stderr
    assert "(NextIteration)" in r.stderr and "(LoopCond)" in r.stderr, r.stderr
    assert "cycle" not in r.stderr, r.stderr
    assert not (tmp_path / "l.om").exists()
