"""Inference at batch 1 through npusim vs TensorFlow on the CPU (docs/graph_engine.md "Figures"):
builds a model of models/ (default resnet50; also mobilenetv2, cnn, transformer) and times
  - TensorFlow-CPU: a tf.function of the model on /CPU:0, one warm-up call, then LOOP calls;
  - the offline runner: the model exported (Keras model.export), compiled with `npusim compile`
    for CHIP (default 910b), run by `npusim infer --loop LOOP+1` (and `--loop 1`, for CPU time);
  - TensorFlow on the NPU (unless TF_NPU=0): the same tf.function on /NPU:0 (the plugin's whole
    graphs), two warm-up calls (the first simulates every launch, the second is the first
    replay), then LOOP calls.
Prints per inference, for each side, the wall time and the CPU seconds, and npusim's ratios to
TF-CPU; the offline runner's simulated time, launches, activation peak, compile time; and the
largest difference of each npusim output from TF-CPU's. Wall times depend on what else runs on
the host; the CPU seconds less so. The offline runner's CPU seconds are steady state: (user +
system time of `--loop LOOP+1` less that of `--loop 1`) / LOOP; TensorFlow's are its process
time over the timed calls (all threads).
Issue 14's targets for ResNet-50: the offline runner at most 1.5x TF-CPU's wall, TensorFlow on
the NPU at most 2x.

Usage: [CHIP=910b] [LOOP=10] [TF_NPU=0] [NPUSIM=build/npusim] \
       .venv/bin/python benchmarks/bench_offline.py [resnet50|mobilenetv2|cnn|transformer ...]
"""
import json, os, resource, subprocess, sys, tempfile, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np

CHIP = os.environ.get("CHIP", "910b")
LOOP = int(os.environ.get("LOOP", "10"))
TF_NPU = os.environ.get("TF_NPU", "1") != "0"
if TF_NPU:
    import npusim  # before TensorFlow creates its devices

    npusim.configure(chip=CHIP)
import tensorflow as tf
import models

NPUSIM = os.environ.get("NPUSIM", os.path.join(ROOT, "build", "npusim"))


def npusim(*args):
    env = dict(os.environ, NPUSIM_PYTHON=sys.executable)
    r = subprocess.run([NPUSIM, *args], env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        sys.exit(f"npusim {args[0]} failed:\n{r.stderr[-3000:]}")
    return r.stdout


def timed_calls(f, xt, warm_up):
    """(wall s, process CPU s) per call of f over LOOP calls after `warm_up` calls, and the
    last output."""
    for _ in range(warm_up):
        y = f(xt).numpy()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(LOOP):
        y = f(xt).numpy()
    return (time.perf_counter() - t0) / LOOP, (time.process_time() - c0) / LOOP, y


def tf_seconds(name, x, device, warm_up):
    """The model (same seed, so the same weights) built and run on `device`."""
    with tf.device(device):
        model = models.build(name, seed=0)
        f = tf.function(lambda t: model(t, training=False))
        return model, timed_calls(f, tf.constant(x), warm_up)


def infer_cpu_seconds(args, loop):
    """User + system seconds of one `npusim infer ... --loop loop` run."""
    u0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    npusim("infer", *args, "--loop", str(loop))
    u1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime


def bench(name, tmp):
    x, _ = models.synthetic_data(name, 1, seed=0)
    model, (cpu_s, cpu_cpu_s, ref) = tf_seconds(name, x, "/CPU:0", 1)
    model.export(os.path.join(tmp, name), verbose=False)
    np.save(os.path.join(tmp, "x.npy"), x)
    om, rep, out = (os.path.join(tmp, f) for f in (f"{name}.om", "compile.json", "infer.json"))
    t0 = time.perf_counter()
    npusim("compile", os.path.join(tmp, name), "--chip", CHIP, "-o", om, "--report", rep)
    compile_s = time.perf_counter() - t0
    args = [om, "--input", os.path.join(tmp, "x.npy"), "--output", os.path.join(tmp, "y.npy")]
    once = infer_cpu_seconds(args, 1)
    infer_cpu_s = (infer_cpu_seconds(args + ["--json", out], LOOP + 1) - once) / LOOP
    with open(rep, encoding="utf-8") as f:
        c = json.load(f)
    with open(out, encoding="utf-8") as f:
        r = json.load(f)
    # The loop's mean includes the first inference (no replay yet); take it out.
    wall = (r["wall_s_per_inference"] * (LOOP + 1) - r["first_wall_s"]) / LOOP
    diff = float(np.abs(np.load(os.path.join(tmp, "y.npy")) - ref).max())
    print(f"{name:12s} {CHIP:5s} tf-cpu {cpu_s:.4f} s (cpu {cpu_cpu_s:.4f} s)\n"
          f"  offline: npusim infer {wall:.4f} s (first {r['first_wall_s']:.3f} s), ratio "
          f"{wall / cpu_s:.2f}x; cpu {infer_cpu_s:.4f} s, ratio {infer_cpu_s / cpu_cpu_s:.2f}x; "
          f"simulated {r['simulated_us_per_inference']:.1f} us  launches {r['launches']}  "
          f"activations {c['memory']['activation_peak_bytes'] / 2**20:.1f} MiB (without reuse "
          f"{c['memory']['activation_bytes_without_reuse'] / 2**20:.1f})  compile {compile_s:.1f} s"
          f"  max |y - tf| {diff:.2e}", flush=True)
    if TF_NPU:
        _, (npu_s, npu_cpu_s, y) = tf_seconds(name, x, "/NPU:0", 2)
        print(f"  tensorflow on /NPU:0: {npu_s:.4f} s, ratio {npu_s / cpu_s:.2f}x; cpu "
              f"{npu_cpu_s:.4f} s, ratio {npu_cpu_s / cpu_cpu_s:.2f}x  max |y - tf| "
              f"{float(np.abs(y - ref).max()):.2e}", flush=True)


def main():
    names = sys.argv[1:] or ["resnet50"]
    for name in names:
        with tempfile.TemporaryDirectory(prefix="npusim-bench-offline-") as tmp:
            bench(name, tmp)


if __name__ == "__main__":
    main()
