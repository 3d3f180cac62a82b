"""Benchmark of TensorFlow on the emulated NPU against TensorFlow on the CPU (issue: "TensorFlow
PluggableDevice"): one process runs ResNet-50 inference at batch 1 (224x224x3, weights=None) and
a training step of the 784-128-10 MLP (batch 32, Adam), first on TensorFlow's CPU, then on the
emulated NPU (910b by default), and prints per workload:

- wall time per step on each device and the ratio NPU-emulation / TF-CPU;
- the simulated device time per step on the NPU (device timeline of one step, from the launch
  records: models.run's simulated_us_per_step) and the kernels per step;
- where the emulator's wall time goes: the kernel launches' own wall time per step (launch
  records' wall_us), by TF op type;
- peak memory: the process's maximum resident set (resource.getrusage ru_maxrss) after each
  phase, the runtime's device memory (npusim.device_info()["memory"]) and TensorFlow's
  allocator peak on the NPU.

Target (printed as MET/MISS, not asserted): ResNet-50 inference on the emulated NPU within 3x
of TensorFlow-CPU wall time.

Order: `import npusim` must come before TensorFlow's first op (it registers the device then),
so it is imported first and the CPU runs are placed explicitly with tf.device("/CPU:0"); the NPU
is not touched until the NPU phase. Both devices run the same tf.function / train_on_batch
(jit_compile=False: XLA cannot compile for the NPU), the same weights (seed 0) and data.

Per-launch records (needed for the simulated time) cost emulator wall time and memory: each
holds the launch's changed counters (a counter tree of ~350 KB of JSON on the 910b when built,
which this script does not ask for); --no-records turns them off to show the
emulator's own speed.

Usage: .venv/bin/python benchmarks/bench_tf.py [--chip 910b] [--steps 3] [--only resnet|mlp]
       [--no-records] [--json benchmarks/results/tf.json]
"""
import argparse
import json
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TARGET_RATIO = 3.0  # ResNet-50 inference: NPU-emulation wall within 3x of TF-CPU


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
    x, y = models.synthetic_data("mlp", 32, seed=0)
    with tf.device(device):
        model = models.build("mlp", seed=0)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=models.loss("mlp"),
                      jit_compile=False)
        xt, yt = tf.constant(x), tf.constant(y)

    def step():
        with tf.device(device):
            return float(model.train_on_batch(xt, yt))

    return step, 32


def measure(tf, keras, models, run, name, device, steps, npusim=None):
    step, batch = workload_step(tf, keras, models, name, device)
    with tf.device(device):
        t0 = time.perf_counter()
        step()
        warmup = time.perf_counter() - t0
        # No counter trees: ~350 KB of JSON per launch on the 910b would dominate memory.
        walls, _, earlier, last = run.time_steps(step, steps, npusim, counters=False)
    out = {"wall_s_per_step": sum(walls) / len(walls), "warmup_wall_s": warmup,
           "maxrss_mib": maxrss_mib()}
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
    ap.add_argument("--only", choices=("resnet", "mlp"), default=None)
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

    names = [n for n in ("resnet50_infer", "mlp_train")
             if a.only is None or n.startswith(a.only)]
    rss_start = maxrss_mib()
    results = {"chip": a.chip, "steps": a.steps,
               "launch_records": not a.no_records,
               "maxrss_start_mib": rss_start, "workloads": {}}
    for name in names:  # TF on the CPU first, before any kernel runs on the NPU
        print(f"[cpu] {name} ...", flush=True)
        results["workloads"][name] = {"cpu": measure(tf, keras, models, run, name, "/CPU:0",
                                                     a.steps)}
    for name in names:
        print(f"[npu {a.chip}] {name} ...", flush=True)
        results["workloads"][name]["npu"] = measure(tf, keras, models, run, name, "/NPU:0",
                                                    a.steps, npusim)

    print(f"\n{'workload':16} {'CPU s/step':>10} {'NPU s/step':>10} {'NPU/CPU':>8} "
          f"{'sim us/step':>11} {'kernels':>8} {'maxrss MiB':>10}")
    for name, r in results["workloads"].items():
        cpu, npu = r["cpu"], r["npu"]
        r["ratio_npu_over_cpu"] = npu["wall_s_per_step"] / cpu["wall_s_per_step"]
        sim = npu.get("simulated_us_per_step")
        sim = f"{sim:11.1f}" if sim else f"{'n/a':>11}"
        kernels = f"{npu['kernels_per_step']:8.0f}" if sim.strip() != "n/a" else f"{'n/a':>8}"
        print(f"{name:16} {cpu['wall_s_per_step']:10.3f} {npu['wall_s_per_step']:10.3f} "
              f"{r['ratio_npu_over_cpu']:8.1f} {sim} {kernels} {npu['maxrss_mib']:10.0f}")
    for name, r in results["workloads"].items():
        npu = r["npu"]
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
    if "resnet50_infer" in results["workloads"]:
        ratio = results["workloads"]["resnet50_infer"]["ratio_npu_over_cpu"]
        met = ratio <= TARGET_RATIO
        results["target"] = {"resnet50_infer_ratio_max": TARGET_RATIO, "met": met}
        print(f"target ResNet-50 inference within {TARGET_RATIO:.0f}x of TF-CPU wall: "
              f"{ratio:.1f}x -> {'MET' if met else 'MISS'}")
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
