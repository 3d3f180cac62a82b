"""Benchmark of TensorFlow on the emulated NPU against TensorFlow on the CPU (issues: "TensorFlow
PluggableDevice", 14 "emulator speed"): one process runs ResNet-50 inference at batch 1
(224x224x3, weights=None), a training step of the 784-128-10 MLP (batch 32, Adam) and a
ResNet-50 training step (batch 8, 224x224, Adam; functional), first on TensorFlow's CPU, then on
the emulated NPU (910b by default), and prints per workload:

- wall time and process CPU time per step on each device (medians of the measured steps; the
  JSON also holds the means) and the ratios NPU-emulation / TF-CPU (CPU seconds, all threads,
  vary less than wall time on a shared host), and the same for the first (warm-up) step, which
  traces the step and, on the NPU, compiles and records its kernels;
- the simulated device time per step on the NPU (device timeline of one step, from the launch
  records: models.run's simulated_us_per_step) and the kernels per step;
- where the emulator's wall time goes: the kernel launches' own wall time per step (launch
  records' wall_us), by TF op type;
- where the first step's CPU seconds go on the NPU (issue 14's "first step" target): the Python
  thread's (tracing, TensorFlow's graph building and grappler) and the other threads', the
  plugin's graph passes by pass, kernel compiles by op type and NpuGraph plans
  (npusim.host_cpu_seconds), and the rest outside those phases (the Python thread's tracing,
  the launches and TensorFlow's executor);
- peak memory: the process's maximum resident set (resource.getrusage ru_maxrss) after each
  phase, the runtime's device memory (npusim.device_info()["memory"]) and TensorFlow's
  allocator peak on the NPU.

Targets (printed as MET/MISS with both the wall and the CPU ratio, not asserted): ResNet-50
inference on the emulated NPU within 3x of TensorFlow-CPU wall time; issue 14: the MLP training
step within 5x, the ResNet-50 batch-8 training step within 3x and its first step within 2x of
TensorFlow-CPU's first step. MET is judged on the median wall time, which a loaded host moves by
several times for TF-CPU's millisecond MLP step: read the CPU ratio beside it.

Order: `import npusim` must come before TensorFlow's first op (it registers the device then),
so it is imported first and the CPU runs are placed explicitly with tf.device("/CPU:0"); the NPU
is not touched until the NPU phase. Both devices run the same tf.function / train_on_batch
(jit_compile=False: XLA cannot compile for the NPU), the same weights (seed 0) and data.

Per-launch records (needed for the simulated time) cost emulator wall time and memory: each
holds the launch's changed counters (a counter tree of ~350 KB of JSON on the 910b when built,
which this script does not ask for); --no-records turns them off to show the
emulator's own speed.

Usage: .venv/bin/python benchmarks/bench_tf.py [--chip 910b] [--steps 3] [--train-steps 3]
       [--only resnet,mlp,resnet_train] [--no-records] [--json benchmarks/results/tf.json]
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Workloads by their --only name.
WORKLOADS = {"resnet": "resnet50_infer", "mlp": "mlp_train", "resnet_train": "resnet50_train"}
RESNET_TRAIN_BATCH = 8
# (workload, figure, at most NPU-emulation / TF-CPU wall): ResNet-50 inference (the plugin's
# issue), issue 14's training steps ("step": per measured step, "first": the warm-up step).
TARGETS = [("resnet50_infer", "step", 3.0), ("mlp_train", "step", 5.0),
           ("resnet50_train", "step", 3.0), ("resnet50_train", "first", 2.0)]


def maxrss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def workload_step(tf, keras, models, name, device):
    """(step function, batch) of one workload on `device`; step() returns a host value so the
    device has finished when it returns."""
    if name == "resnet50_infer":
        x, _ = models.synthetic_data("resnet50", 1, seed=0)
        with tf.device(device):
            model = models.build("resnet50", seed=0)
            xt = tf.constant(x)
            forward = tf.function(lambda t: model(t, training=False))
        return (lambda: forward(xt).numpy()), 1
    model_name, batch = ("mlp", 32) if name == "mlp_train" else ("resnet50", RESNET_TRAIN_BATCH)
    x, y = models.synthetic_data(model_name, batch, seed=0)
    with tf.device(device):
        model = models.build(model_name, seed=0)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=models.loss(model_name),
                      jit_compile=False)
        xt, yt = tf.constant(x), tf.constant(y)

    def step():
        with tf.device(device):
            return float(model.train_on_batch(xt, yt))

    return step, batch


def first_step_split(cpu_s, main_thread_s, phases):
    """The first step's process CPU seconds by where they went: the calling (Python) thread's
    (tracing the step, TensorFlow's graph building and grappler, the plugin's graph passes), the
    plugin's host phases (npusim.host_cpu_seconds: graph passes by pass, kernel compiles by op
    type, NpuGraph plans), and the rest outside those phases (`rest_cpu_s`: the Python thread's
    tracing, the launches and TensorFlow's executor)."""
    totals = {ph: sum(v["cpu_s"] for v in items.values()) for ph, items in phases.items()}
    known = sum(totals.values())
    split = {"cpu_s": cpu_s, "main_thread_cpu_s": main_thread_s,
             "graph_pass_cpu_s": totals.get("graph_pass", 0.0),
             "compile_cpu_s": totals.get("compile", 0.0),
             "graph_plan_cpu_s": totals.get("graph_plan", 0.0),
             # Threads other than the caller's (compiles and plans run there too), and what
             # the plugin's passes, compiles and plans did not take (tracing on the Python
             # thread, the launches, simulated or replayed, and TensorFlow's executor).
             "other_threads_cpu_s": cpu_s - main_thread_s, "rest_cpu_s": cpu_s - known}
    for ph, items in phases.items():
        split[ph + "_by_item"] = {k: v["cpu_s"] for k, v in
                                  sorted(items.items(), key=lambda kv: -kv[1]["cpu_s"])}
    return split


def measure(tf, keras, models, run, name, device, steps, npusim=None):
    step, batch = workload_step(tf, keras, models, name, device)
    cpus = []  # process CPU seconds of each measured step

    def timed_step():
        c0 = time.process_time()
        out = step()
        cpus.append(time.process_time() - c0)
        return out

    with tf.device(device):
        if npusim is not None:
            npusim.host_cpu_seconds(reset=True)
        t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
        step()
        warmup, warmup_cpu = time.perf_counter() - t0, time.process_time() - c0
        warmup_main = time.thread_time() - m0
        phases = npusim.host_cpu_seconds(reset=True) if npusim is not None else {}
        # No counter trees: ~350 KB of JSON per launch on the 910b would dominate memory.
        walls, _, earlier, last = run.time_steps(timed_step, steps, npusim, counters=False)
    out = {"wall_s_per_step": sum(walls) / len(walls), "cpu_s_per_step": sum(cpus) / len(cpus),
           # statistics.median: of an even count the mean of the middle two (sorted()[n // 2]
           # took the larger of the two steps of --train-steps 2).
           "wall_s_median": statistics.median(walls), "cpu_s_median": statistics.median(cpus),
           "warmup_wall_s": warmup, "warmup_cpu_s": warmup_cpu, "maxrss_mib": maxrss_mib(),
           "warmup_split": first_step_split(warmup_cpu, warmup_main, phases)}
    if npusim is not None:
        out.update(run.npu_figures(npusim, batch, steps, earlier, last))
        out["device_memory"] = npusim.device_info().get("memory")
        out["tf_peak_bytes"] = tf.config.experimental.get_memory_info("NPU:0")["peak"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--chip", default="910b")
    ap.add_argument("--steps", type=int, default=3, help="measured steps per run (after 1 "
                    "warm-up step)")
    ap.add_argument("--train-steps", type=int, default=3, help="measured steps of the ResNet-50 "
                    "training step (after 1 warm-up step; each takes seconds to minutes; the "
                    "first of them still simulates 16 of the Adam updates, whose arguments lie "
                    "at other addresses than in the warm-up step's recordings, so the median "
                    "of 3 is a step that replays all its launches)")
    ap.add_argument("--only", default=None,
                    help="comma-separated workloads among " + ", ".join(WORKLOADS))
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "tf.json"))
    ap.add_argument("--no-records", action="store_true",
                    help="NPUSIM_RECORD_LAUNCHES=0: the emulator's wall time without per-launch "
                    "records and counter trees (no simulated time then)")
    a = ap.parse_args()
    if a.no_records:
        os.environ["NPUSIM_RECORD_LAUNCHES"] = "0"

    import npusim  # before TensorFlow's first op: registers the NPU

    npusim.configure(chip=a.chip)
    import keras
    import tensorflow as tf

    # Allocate NPU memory as needed (TensorFlow would otherwise reserve all of it at once), so
    # the runtime's memory figures show what the workloads use.
    for npu in tf.config.list_physical_devices("NPU"):
        tf.config.experimental.set_memory_growth(npu, True)

    import models
    from models import run

    only = list(WORKLOADS) if a.only is None else a.only.split(",")
    unknown = [o for o in only if o not in WORKLOADS]
    if unknown:
        ap.error(f"--only: unknown workload(s) {', '.join(unknown)} (known: "
                 f"{', '.join(WORKLOADS)})")
    names = [WORKLOADS[o] for o in WORKLOADS if o in only]
    steps_of = {n: a.train_steps if n == "resnet50_train" else a.steps for n in names}
    rss_start = maxrss_mib()
    results = {"chip": a.chip, "steps": a.steps,
               "launch_records": not a.no_records,
               "maxrss_start_mib": rss_start, "workloads": {}}
    for name in names:  # TF on the CPU first, before any kernel runs on the NPU
        print(f"[cpu] {name} ...", flush=True)
        results["workloads"][name] = {"cpu": measure(tf, keras, models, run, name, "/CPU:0",
                                                     steps_of[name])}
    for name in names:
        print(f"[npu {a.chip}] {name} ...", flush=True)
        results["workloads"][name]["npu"] = measure(tf, keras, models, run, name, "/NPU:0",
                                                    steps_of[name], npusim)

    # Wall and process CPU seconds per measured step (mean) and of the first step, on TF-CPU
    # and on the emulated NPU, with the ratios NPU / TF-CPU.
    print(f"\n{'workload':16} {'step':6} {'CPU wall':>9} {'NPU wall':>9} {'ratio':>6} "
          f"{'CPU cpu-s':>9} {'NPU cpu-s':>9} {'ratio':>6} {'sim us/step':>11} {'kernels':>8} "
          f"{'maxrss MiB':>10}")
    for name, r in results["workloads"].items():
        cpu, npu = r["cpu"], r["npu"]
        r["ratio_npu_over_cpu"] = npu["wall_s_median"] / cpu["wall_s_median"]
        r["cpu_ratio_npu_over_cpu"] = npu["cpu_s_median"] / cpu["cpu_s_median"]
        r["first_ratio_npu_over_cpu"] = npu["warmup_wall_s"] / cpu["warmup_wall_s"]
        r["first_cpu_ratio_npu_over_cpu"] = npu["warmup_cpu_s"] / cpu["warmup_cpu_s"]
        sim = npu.get("simulated_us_per_step")
        sim = f"{sim:11.1f}" if sim else f"{'n/a':>11}"
        kernels = f"{npu['kernels_per_step']:8.0f}" if sim.strip() != "n/a" else f"{'n/a':>8}"
        print(f"{name:16} {'median':6} {cpu['wall_s_median']:9.4f} {npu['wall_s_median']:9.4f}"
              f" {r['ratio_npu_over_cpu']:6.1f} {cpu['cpu_s_median']:9.4f} "
              f"{npu['cpu_s_median']:9.4f} {r['cpu_ratio_npu_over_cpu']:6.1f} {sim} {kernels} "
              f"{npu['maxrss_mib']:10.0f}")
        print(f"{'':16} {'first':6} {cpu['warmup_wall_s']:9.4f} {npu['warmup_wall_s']:9.4f} "
              f"{r['first_ratio_npu_over_cpu']:6.1f} {cpu['warmup_cpu_s']:9.4f} "
              f"{npu['warmup_cpu_s']:9.4f} {r['first_cpu_ratio_npu_over_cpu']:6.1f}")
    for name, r in results["workloads"].items():
        npu, sp = r["npu"], r["npu"]["warmup_split"]
        # The first step's CPU seconds split (first_step_split), beside TF-CPU's first step.
        top = lambda ph: ", ".join(f"{k} {v:.2f}" for k, v in
                                   list(sp.get(ph + "_by_item", {}).items())[:4])
        print(f"{name}: first step {sp['cpu_s']:.2f} CPU-s (TF-CPU {r['cpu']['warmup_cpu_s']:.2f}):"
              f" the Python thread {sp['main_thread_cpu_s']:.2f}, other threads "
              f"{sp['other_threads_cpu_s']:.2f}; graph passes {sp['graph_pass_cpu_s']:.2f} "
              f"({top('graph_pass')}), compiles {sp['compile_cpu_s']:.2f} ({top('compile')}), "
              f"NpuGraph plans {sp['graph_plan_cpu_s']:.2f}, the rest (tracing, launches, "
              f"executor) {sp['rest_cpu_s']:.2f}")
        if "emulator_wall_s_by_op_type" in npu:
            top = list(npu["emulator_wall_s_by_op_type"].items())[:6]
            print(f"{name}: emulator wall in kernel launches {npu['emulator_wall_s_per_step']:.3f}"
                  " s/step; by op type: "
                  + ", ".join(f"{k} {v:.3f}" for k, v in top))
    last_npu = results["workloads"][names[-1]]["npu"]
    print(f"\npeak memory: maxrss {maxrss_mib():.0f} MiB (at start {rss_start:.0f} MiB, after "
          "the CPU runs "
          f"{results['workloads'][names[-1]]['cpu']['maxrss_mib']:.0f} MiB); NPU runtime memory "
          f"{json.dumps(last_npu['device_memory'])}; TF allocator peak on the NPU "
          f"{last_npu['tf_peak_bytes'] / 2**20:.1f} MiB")
    results["targets"] = []
    for name, which, limit in TARGETS:
        r = results["workloads"].get(name)
        if r is None:
            continue
        prefix = "first_" if which == "first" else ""
        wall, cpu = r[prefix + "ratio_npu_over_cpu"], r[prefix + "cpu_ratio_npu_over_cpu"]
        met = wall <= limit
        results["targets"].append({"workload": name, "step": which, "ratio_max": limit,
                                   "wall_ratio": wall, "cpu_ratio": cpu, "met": met})
        print(f"target {name} {'first step' if which == 'first' else 'step'} within "
              f"{limit:.0f}x of TF-CPU wall: {wall:.1f}x (CPU time {cpu:.1f}x) -> "
              f"{'MET' if met else 'MISS'}")
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
