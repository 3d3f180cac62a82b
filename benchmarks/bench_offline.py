"""Offline-model inference vs TensorFlow on the CPU, side by side in one run (docs/graph_engine.md):
builds a model of models/ (default resnet50; also mobilenetv2, cnn, transformer), exports it
(Keras model.export), compiles it with `npusim compile` for CHIP (default 910b) at batch 1,
runs `npusim infer --loop LOOP` (default 10) and times TensorFlow-CPU's inference of the same
model on the same input (a tf.function, one warm-up call, then LOOP calls). Prints per
inference: TF-CPU wall, npusim wall (after the first), the ratio, npusim's simulated time,
launches, the plan's activation peak, compile time; and the largest difference of the outputs.
On a shared host the wall times depend on what else runs: the CPU seconds (TF's process time per
inference; `npusim infer`'s user + system time for the whole run, load and first inference
included, divided by the inferences) are printed too.
Issue 14's target for ResNet-50: npusim wall at most 1.5x TF-CPU's.

Usage: [CHIP=910b] [LOOP=10] [NPUSIM=build/npusim] .venv/bin/python benchmarks/bench_offline.py \
       [resnet50|mobilenetv2|cnn|transformer ...]
"""
import json, os, resource, subprocess, sys, tempfile, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf
import models

CHIP = os.environ.get("CHIP", "910b")
LOOP = int(os.environ.get("LOOP", "10"))
NPUSIM = os.environ.get("NPUSIM", os.path.join(ROOT, "build", "npusim"))


def npusim(*args):
    env = dict(os.environ, NPUSIM_PYTHON=sys.executable)
    r = subprocess.run([NPUSIM, *args], env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        sys.exit(f"npusim {args[0]} failed:\n{r.stderr[-3000:]}")
    return r.stdout


def tf_cpu_seconds(model, x):
    f = tf.function(lambda t: model(t, training=False))
    with tf.device("/CPU:0"):
        xt = tf.constant(x)
        y = f(xt).numpy()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(LOOP):
            y = f(xt).numpy()
    return (time.perf_counter() - t0) / LOOP, (time.process_time() - c0) / LOOP, y


def bench(name, tmp):
    x, _ = models.synthetic_data(name, 1, seed=0)
    model = models.build(name, seed=0)
    cpu_s, cpu_cpu_s, ref = tf_cpu_seconds(model, x)
    model.export(os.path.join(tmp, name), verbose=False)
    np.save(os.path.join(tmp, "x.npy"), x)
    om, rep, out = (os.path.join(tmp, f) for f in (f"{name}.om", "compile.json", "infer.json"))
    t0 = time.perf_counter()
    npusim("compile", os.path.join(tmp, name), "--chip", CHIP, "-o", om, "--report", rep)
    compile_s = time.perf_counter() - t0
    u0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    npusim("infer", om, "--input", os.path.join(tmp, "x.npy"), "--output",
           os.path.join(tmp, "y.npy"), "--loop", str(LOOP + 1), "--json", out)
    u1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    infer_cpu_s = (u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime) / (LOOP + 1)
    with open(rep, encoding="utf-8") as f:
        c = json.load(f)
    with open(out, encoding="utf-8") as f:
        r = json.load(f)
    # The loop's mean includes the first inference (no replay yet); take it out.
    wall = (r["wall_s_per_inference"] * (LOOP + 1) - r["first_wall_s"]) / LOOP
    diff = float(np.abs(np.load(os.path.join(tmp, "y.npy")) - ref).max())
    print(f"{name:12s} {CHIP:5s} tf-cpu {cpu_s:.4f} s  npusim {wall:.4f} s (first "
          f"{r['first_wall_s']:.3f} s)  ratio {wall / cpu_s:.2f}x  simulated "
          f"{r['simulated_us_per_inference']:.1f} us  launches {r['launches']}  activations "
          f"{c['memory']['activation_peak_bytes'] / 2**20:.1f} MiB (without reuse "
          f"{c['memory']['activation_bytes_without_reuse'] / 2**20:.1f})  compile {compile_s:.1f} s"
          f"  max |y - tf| {diff:.2e}  cpu s/inference: tf {cpu_cpu_s:.3f}, npusim "
          f"{infer_cpu_s:.3f}", flush=True)


def main():
    names = sys.argv[1:] or ["resnet50"]
    for name in names:
        with tempfile.TemporaryDirectory(prefix="npusim-bench-offline-") as tmp:
            bench(name, tmp)


if __name__ == "__main__":
    main()
