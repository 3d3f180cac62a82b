"""The models of models/ (the registry) on the NPU against TensorFlow on the CPU with the same
weights: forward outputs of every model, training of the MLP and the CNN, eager against
tf.function, and GradientTape gradients of the CNN.

Soft placement is on (TensorFlow's default): ops without an NPU kernel run on the CPU, so these
tests hold whatever part of each model the plugin runs today, and must keep holding as more
ops move to the chip.

Tolerances. The chip runs in the default precision mode allow_fp32_to_fp16: fp32 cube ops
(MatMul, and convolutions once they run on the NPU) round both operands to fp16 (relative
error <= u = 2^-11 ~ 4.9e-4 each) and accumulate in fp32; vector ops stay fp32. A layer's
output thus carries a relative error of about 2u ~ 1e-3 in the worst case, much less where
rounding errors of a K-term dot product average out (~2u / sqrt(K) per element for random
data), and errors of successive layers add up. We compare the models' pre-activation outputs
(output_activation=None: a softmax of large logits would amplify logit errors) by the relative
error of the whole tensor, ||npu - cpu|| / ||cpu||, with the BatchNormalization statistics
set from a calibration batch first (models.calibrate_batchnorm: with the initial moving
statistics MobileNetV2's activations shrink to ~1e-12 at 32x32, below fp16's range, and its
fp16 classifier then rightly returns 0 where the CPU returns 1e-12):

- shallow models (mlp, cnn, lstm_attention, transformer): 1e-2, i.e. 10 layers of worst-case
  2u, while their longest chains of cube ops are 2 (mlp), 3 (cnn once its convolutions run on
  the cube) and 7 (transformer: Q/K/V projection, scores, weighted values, output projection,
  two feed-forward layers, head); the LSTM's 20 recurrent MatMuls pass through sigmoid/tanh
  gates (slopes <= 1), which keep an earlier step's error from growing;
- deep models (resnet50 with 53 convolutions + 1 dense, mobilenetv2 with 52 + 1, with
  inference-mode BatchNormalization that can amplify, 32x32 input, batch 2): 5e-2, i.e.
  ~50 layers at worst-case 2u.

The deep models are more sensitive than that per-layer count says: their calibrated
inference-mode BatchNormalization divides by small per-channel deviations (res5 of ResNet-50
sees 1x1 maps at 32x32 input). The test therefore measures each model's own fp16 sensitivity as
an independent reference on the CPU: the same model with its weights and input rounded to fp16
(fp16_sensitivity). The NPU rounds those and, in addition, each cube op's activation input, so
its error may reach about twice that; the bound is max(stated bound, 2 x sensitivity). Seen on
2026-11-30 (every layer on the NPU): ResNet-50 at 32x32 has sensitivity 5.6e-2 and NPU error
5.4e-2; the shallow models 2.5e-4 to 6.1e-4.
"""

import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import models  # noqa: E402  pylint: disable=wrong-import-position

SHALLOW_RTOL = 1e-2
DEEP_RTOL = 5e-2

# (input_size, batch, tolerance) per model: small inputs where the model allows.
FORWARD_CASES = {
    "mlp": (784, 4, SHALLOW_RTOL),
    "cnn": (28, 4, SHALLOW_RTOL),
    "lstm_attention": (20, 4, SHALLOW_RTOL),
    "transformer": (16, 4, SHALLOW_RTOL),
    "resnet50": (32, 2, DEEP_RTOL),  # keras.applications' smallest input
    "resnet50_v15": (32, 2, DEEP_RTOL),
    "mobilenetv2": (32, 2, DEEP_RTOL),
}


def rel_error(actual, expected):
    """||actual - expected||_2 / ||expected||_2 over the whole tensor."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def fp16_round(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def fp16_sensitivity(tf, cpu_model, run):
    """Relative change of run(model) -> numpy tensors on the CPU when the model's weights are
    rounded to fp16: the model's own sensitivity to the precision mode's operand rounding, an
    independent reference for the NPU's error (weights restored afterwards)."""
    weights = cpu_model.get_weights()
    with tf.device("/CPU:0"):
        exact = run(cpu_model, False)
        cpu_model.set_weights([fp16_round(w) for w in weights])
        try:
            rounded = run(cpu_model, True)
        finally:
            cpu_model.set_weights(weights)
    return [rel_error(r, e) for r, e in zip(rounded, exact)]


def build_pair(tf, name, input_size, calibration=None, **kw):
    """The same model on the CPU and on the NPU: built on each device from the same seed (the
    same initial weights and Dropout seed generators), the NPU copy also given the CPU copy's
    weights, so equal weights do not rest on the seeding alone. calibration: a batch that sets
    the BatchNormalization statistics first (models.calibrate_batchnorm, on the CPU)."""
    with tf.device("/CPU:0"):
        cpu = models.build(name, input_size, seed=0, **kw)
        if calibration is not None:
            models.calibrate_batchnorm(cpu, calibration)
    with tf.device("/NPU:0"):
        npu = models.build(name, input_size, seed=0, **kw)
        npu.set_weights(cpu.get_weights())
    return cpu, npu


@pytest.mark.parametrize("name", list(FORWARD_CASES))
def test_forward_matches_cpu(npusim, tf, name):
    # The language models (models/llm.py) and BERT (models/bert.py) take token dicts:
    # tests/tf/test_llm.py and tests/tf/test_bert.py cover them.
    assert set(FORWARD_CASES) == (set(models.names()) - set(models.llm.CONFIGS)
                                  - set(models.bert.CONFIGS))
    input_size, batch, rtol = FORWARD_CASES[name]
    start = time.perf_counter()
    x, _ = models.synthetic_data(name, batch, input_size, seed=3)
    calibration, _ = models.synthetic_data(name, 8, input_size, seed=9)
    cpu, npu = build_pair(tf, name, input_size, output_activation=None,
                          calibration=calibration)
    with tf.device("/CPU:0"):
        expected = cpu(x, training=False).numpy()
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        out = npu(x, training=False)
    records = npusim.launch_records()
    assert out.device.endswith("device:NPU:0"), out.device
    assert out.shape == expected.shape
    assert all(r["ok"] for r in records)
    # The models' dense layers run on the cube: at least one MatMul per model.
    assert any(r["kernel"].startswith("MatMul") for r in records), \
        sorted({r["kernel"] for r in records})
    err = rel_error(out.numpy(), expected)
    (sensitivity,) = fp16_sensitivity(
        tf, cpu, lambda m, rounded: [m(fp16_round(x) if rounded else x, training=False).numpy()])
    bound = max(rtol, 2 * sensitivity)
    print(f"\n{name}: relative error {err:.2e} (bound {bound:.1e}; fp16 sensitivity "
          f"{sensitivity:.1e}), {len(records)} launches, {time.perf_counter() - start:.1f} s")
    assert np.all(np.isfinite(out.numpy()))
    assert sensitivity < 0.2  # the comparison means something only for a well-conditioned model
    assert err <= bound


def _train(tf, model, name, x, y, steps):
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=models.loss(name),
                  jit_compile=False)
    return [float(model.train_on_batch(x, y)) for _ in range(steps)]


@pytest.mark.parametrize("name,input_size", [("mlp", 784), ("cnn", 28)])
def test_training_loss_decreases_and_tracks_cpu(npusim, tf, name, input_size):
    """Four Adam steps on one batch of 8: the NPU's loss falls at every step and stays within
    2e-2 relative of the CPU's (the forward bound above, plus Adam's amplification of tiny
    gradient differences over a few steps; seen: ~1e-4 for mlp and cnn). Dropout draws the
    same masks on both devices: its seed generator starts from the same seed (models.build)."""
    x, y = models.synthetic_data(name, 8, input_size, seed=4)
    cpu, npu = build_pair(tf, name, input_size)
    with tf.device("/CPU:0"):
        keras.utils.set_random_seed(7)
        loss_cpu = _train(tf, cpu, name, x, y, 4)
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        keras.utils.set_random_seed(7)
        loss_npu = _train(tf, npu, name, x, y, 4)
    records = npusim.launch_records()
    assert all(r["ok"] for r in records)
    assert any(r["kernel"].startswith("MatMul") for r in records)
    print(f"\n{name}: loss NPU {loss_npu}\n     loss CPU {loss_cpu}")
    assert all(np.isfinite(loss_npu))
    assert all(b < a for a, b in zip(loss_npu, loss_npu[1:])), loss_npu
    np.testing.assert_allclose(loss_npu, loss_cpu, rtol=2e-2)


@pytest.mark.parametrize("name,input_size", [("mlp", 784), ("cnn", 28), ("lstm_attention", 8)])
def test_eager_matches_tf_function(npusim, tf, name, input_size):
    """The same NPU model called eagerly (op by op) and as a tf.function (one graph, grappler's
    rewrites) gives the same outputs: the same kernels on the same data, except where a graph
    rewrite changes the order of fp32 additions (bound 1e-5 relative, far below fp16's 2^-11;
    seen: bit-identical). The CNN's graph also folds each batch norm into its convolution
    (graph_fusion.h): the filter is rounded to fp16 after the batch norm's scaling instead of
    before, a different rounding of the same 2^-11 relative size per product; over its two
    convolutions that is at most 2 * 2 * 2^-11 ~ 2e-3 relative."""
    x, _ = models.synthetic_data(name, 4, input_size, seed=6)
    with tf.device("/NPU:0"):
        model = models.build(name, input_size, seed=0, output_activation=None)
        xt = tf.constant(x)
        eager = model(xt, training=False).numpy()
        graph = tf.function(lambda t: model(t, training=False))(xt).numpy()
    assert rel_error(graph, eager) <= (4 * 2.0**-11 if name == "cnn" else 1e-5)


def test_cnn_gradient_tape_matches_cpu(npusim, tf):
    """Gradients of the CNN's loss (training mode: BatchNormalization on batch statistics)
    with respect to every trainable weight, NPU against CPU: each gradient tensor within 2e-2
    relative (backward MatMul/convolution rounds its operands to fp16 like the forward pass,
    and a gradient is a chain of about twice the forward's ops)."""
    x, y = models.synthetic_data("cnn", 8, 28, seed=8)
    cpu, npu = build_pair(tf, "cnn", 28)
    grads = {}
    for device, model in (("/CPU:0", cpu), ("/NPU:0", npu)):
        with tf.device(device):
            loss_fn = models.loss("cnn")
            xt, yt = tf.constant(x), tf.constant(y)
            with tf.GradientTape() as tape:
                loss = loss_fn(yt, model(xt, training=True))
            g = tape.gradient(loss, model.trainable_variables)
            if device == "/NPU:0":
                assert all(t.device.endswith("device:NPU:0") for t in g[-2:]), \
                    [t.device for t in g]
            grads[device] = [t.numpy() for t in g]
    assert len(grads["/NPU:0"]) == len(cpu.trainable_variables)

    def gradients(model, rounded):
        loss_fn = models.loss("cnn")
        xt, yt = tf.constant(fp16_round(x) if rounded else x), tf.constant(y)
        with tf.GradientTape() as tape:
            loss = loss_fn(yt, model(xt, training=True))
        return [t.numpy() for t in tape.gradient(loss, model.trainable_variables)]

    # A gradient that is a largely cancelling sum (the first convolution's kernel, behind
    # BatchNormalization, whose backward pass makes each channel's gradient sum to zero) has a
    # relative error far above its terms' rounding: bound each by twice the CPU's own
    # sensitivity to fp16 operands, at least 2e-2.
    sensitivity = fp16_sensitivity(tf, cpu, gradients)
    for var, g_npu, g_cpu, sens in zip(cpu.trainable_variables, grads["/NPU:0"],
                                       grads["/CPU:0"], sensitivity):
        assert rel_error(g_npu, g_cpu) <= max(2e-2, 2 * sens), (var.path, rel_error(g_npu, g_cpu),
                                                                sens)


# ---- The runner (models/run.py): its figures from launch records, and its command line.

from models import run as runner  # noqa: E402  pylint: disable=wrong-import-position

CHIP_YAML = """
clock_mhz: 1000
cores: {aic: {count: 2}, aiv: {count: 4}}
cube: {m: 16, k: 16, n: 16}
vector: {bytes_per_cycle: 256}
"""


class _FakeNpusim:
    class _hooks:  # pylint: disable=invalid-name
        @staticmethod
        def chip_config_yaml():
            return CHIP_YAML


def _record(index, start, cycles, macs=0, repeats=0, hbm=(0, 0)):
    """A launch record with flat counters (launch_records(with_counters="flat"))."""
    return {"index": index, "kernel": f"K{index}", "ok": True, "error": "", "start_cycle": start,
            "cycles": cycles, "time_us": cycles / 1000.0, "counters": {
                "aic0.m.macs": macs // 2, "aic1.m.macs": macs - macs // 2,
                "aiv3.v.repeats": repeats, "hbm.read_bytes": hbm[0], "hbm.write_bytes": hbm[1]}}


def test_runner_figures_from_launch_records():
    """Two steps: step 1 one launch (cycles 1000..1500), step 2 two launches (2000..2400 and
    2600..3000) with counters. At 1000 MHz the timeline of both steps is 3000 - 1000 = 2000
    cycles = 2 us, i.e. 1 us per step; the last step spans 1000 cycles, in which the chip's
    2 cube cores could do 2 x 4096 x 1000 MACs and its 4 vector cores 4 x 1000 repeats."""
    earlier = [{k: v for k, v in _record(0, 1000, 500).items() if k != "counters"}]
    last = [_record(1, 2000, 400, macs=819200, repeats=100, hbm=(1000, 24)),
            _record(2, 2600, 400, repeats=300, hbm=(0, 1000))]
    fig = runner.npu_figures(_FakeNpusim, batch=4, steps=2, earlier=earlier, last=last)
    assert fig["simulated_us_per_step"] == pytest.approx(1.0)
    assert fig["kernel_us_per_step"] == pytest.approx((500 + 400 + 400) / 1000 / 2)
    assert fig["samples_per_s"] == pytest.approx(4 / 1e-6)
    assert fig["kernels_per_step"] == 1.5
    assert fig["hbm_bytes_per_step"] == 2024
    assert fig["cube_utilization_pct"] == pytest.approx(100 * 819200 / (2 * 4096 * 1000))
    assert fig["vector_utilization_pct"] == pytest.approx(100 * 400 / (4 * 1000))
    failed = dict(last[1], ok=False, error="fault")
    with pytest.raises(RuntimeError, match="K2: fault"):
        runner.npu_figures(_FakeNpusim, 4, 2, earlier, [last[0], failed])


def _run_cli(tmp_path, *args):
    from conftest import child_env  # pylint: disable=import-outside-toplevel

    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-m", "models.run", *args, "--json", str(out),
                           "--quiet"], cwd=ROOT, env=child_env(), capture_output=True,
                          text=True, timeout=300, check=False)
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == printed
    return proc.returncode, printed


def test_runner_command_line(tmp_path):
    code, r = _run_cli(tmp_path, "--model", "mlp", "--mode", "train", "--batch", "4",
                       "--steps", "2", "--set", "memory.hbm.gbps=900")
    assert code == 0, r
    assert r["ok"] and r["device"] == "NPU" and r["chip"] == "tiny"
    assert r["overrides"] == ["memory.hbm.gbps=900"]
    assert (r["model"], r["mode"], r["batch"], r["steps"]) == ("mlp", "train", 4, 2)
    assert r["simulated_us_per_step"] > 0 and r["kernels_per_step"] > 0
    assert r["samples_per_s"] == pytest.approx(4 / (r["simulated_us_per_step"] * 1e-6))
    assert r["hbm_bytes_per_step"] > 0 and 0 < r["cube_utilization_pct"] < 100
    assert math.isfinite(r["loss"]) and r["loss"] > 0

    code, r = _run_cli(tmp_path, "--model", "no_such_model", "--mode", "infer", "--batch",
                       "1", "--steps", "1")
    assert code == 1 and r["ok"] is False and "no_such_model" in r["error"], r
