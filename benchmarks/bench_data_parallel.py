"""Data-parallel training on several emulated chips (issue "Many chips", docs/multichip.md):
unmodified Keras fit under tf.distribute.MirroredStrategy of a model (default ResNet-50 at
64x64, Adam) on the first N chips of a system (default 910b-x8), timing-only
(npusim.configure(functional=False)), the per-chip batch fixed (weak scaling: global batch =
N x per-chip batch). One child process per chip count (the device count is fixed per process);
each fits one warm-up step (TensorFlow traces the step and the plugin compiles its kernels),
then times --steps steps.

Per chip count it prints, from the runtime's records (every chip has its own device timeline,
docs/runtime.md "Simulated time on a system"):
- step_us: simulated time of a step: how far the latest chip timeline moved, per step;
- samples_per_s: global batch / step time; efficiency: samples/s over N x the 1-chip figure
  (the smallest chip count run);
- compute_us: per chip, the kernels' time in a step (launch records), the slowest chip's;
- comm_us: the collectives' time in a step (on the chips' communication timelines), comm_share =
  comm / step; exposed_comm_us: the part of it during which the chip ran no kernel (per chip,
  the largest);
- collectives per step and the bytes they all-reduced (gradient segments: NPUSIM_GRAD_SPLIT,
  docs/multichip.md "Gradient segments and overlap"; run with NPUSIM_GRAD_SPLIT=tensor for one
  all-reduce per gradient);
- emulation cost: wall and CPU seconds per step (the whole process: TensorFlow, compiler,
  simulator), and both divided by N (issue 15 asks for about N times one chip, not more).

Usage: .venv/bin/python benchmarks/bench_data_parallel.py [--chips 1,2,4,8] [--model resnet50]
       [--input-size 64] [--per-chip-batch 8] [--system 910b-x8] [--steps 1] [--json OUT]
       [--timeout-s 3000]
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--chips", default="1,2,4,8", help="chip counts, comma separated")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--input-size", type=int, default=64)
    ap.add_argument("--per-chip-batch", type=int, default=8)
    ap.add_argument("--system", default="910b-x8")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--timeout-s", type=int, default=3000, help="per chip count")
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def cpu_s():
    """CPU seconds of this process so far (every thread, user + system)."""
    t = os.times()
    return t.user + t.system


def merged(intervals):
    """Sorted, non-overlapping union of [start, end) intervals."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def covered(intervals, by):
    """Cycles of the union of `intervals` that lie inside the union of `by`."""
    total = 0
    by = merged(by)
    for s, e in merged(intervals):
        for bs, be in by:
            total += max(0, min(e, be) - max(s, bs))
    return total


def step_figures(chips, steps, before, after, launches, collectives, clock_mhz):
    """The figures of `steps` steps from the records (cycles -> us at clock_mhz)."""
    us = lambda cycles: cycles / clock_mhz / steps  # noqa: E731 per step
    step_cycles = max(after) - max(before)
    compute, exposed = [], []
    comm = [[c["start_cycle"], c["end_cycle"]] for c in collectives]
    for c in range(chips):
        kernels = [[r["start_cycle"], r["start_cycle"] + r["cycles"]] for r in launches[c]]
        compute.append(sum(e - s for s, e in merged(kernels)))
        mine = [iv for iv, rec in zip(comm, collectives) if c in rec["chips"]]
        exposed.append(sum(e - s for s, e in merged(mine)) - covered(mine, kernels))
    comm_cycles = sum(e - s for s, e in merged(comm))
    return {"step_us": us(step_cycles),
            "compute_us_per_chip": [us(x) for x in compute],
            "compute_us": us(max(compute)),
            "comm_us": us(comm_cycles),
            "comm_share": comm_cycles / step_cycles if step_cycles else 0.0,
            "exposed_comm_us": us(max(exposed)),
            "collectives_per_step": len(collectives) / steps,
            "allreduce_bytes_per_step": sum(c["bytes"] for c in collectives) / steps,
            "kernels_per_step_per_chip": [len(x) / steps for x in launches]}


def child(a):
    """One chip count: fit, then print the figures as RESULT<json>."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, ROOT)
    import npusim  # pylint: disable=import-outside-toplevel

    n = a.child
    npusim.configure(system=a.system, chips=n, functional=False)
    import keras  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import models  # pylint: disable=import-outside-toplevel
    from models import run  # pylint: disable=import-outside-toplevel

    batch = n * a.per_chip_batch
    x, y = models.synthetic_data(a.model, batch, a.input_size, seed=0)
    strategy = tf.distribute.MirroredStrategy()
    assert strategy.num_replicas_in_sync == n, strategy.extended.worker_devices
    with strategy.scope():
        model = models.build(a.model, a.input_size, seed=0)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=models.loss(a.model),
                      jit_compile=False)
    t0, c0 = time.perf_counter(), cpu_s()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)  # warm-up
    warm_wall, warm_cpu = time.perf_counter() - t0, cpu_s() - c0
    xs = x[None].repeat(a.steps, 0).reshape((batch * a.steps,) + x.shape[1:])
    ys = y[None].repeat(a.steps, 0).reshape((batch * a.steps,) + y.shape[1:])
    npusim.clear_launch_records()
    before = npusim.system_info()["timeline_cycles"]
    t0, c0 = time.perf_counter(), cpu_s()
    model.fit(xs, ys, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    info = npusim.system_info()
    launches = [npusim.launch_records(chip=c) for c in range(n)]
    clock = run.chip_peaks(npusim)["clock_mhz"]
    out = step_figures(n, a.steps, before, info["timeline_cycles"], launches,
                       info["collectives"], clock)
    out.update({"chips": n, "global_batch": batch,
                "samples_per_s": batch / (out["step_us"] / 1e6),
                "wall_s_per_step": wall / a.steps, "cpu_s_per_step": cpu / a.steps,
                "wall_s_per_step_per_chip": wall / a.steps / n,
                "cpu_s_per_step_per_chip": cpu / a.steps / n,
                "warmup_wall_s": warm_wall, "warmup_cpu_s": warm_cpu,
                # Launches carried out by launch replay (docs/chip_model.md "Launch replay"),
                # also those recorded on another chip.
                "replayed_share": (sum(r["replayed"] for x in launches for r in x)
                                   / max(1, sum(len(x) for x in launches))),
                "algorithms": sorted({c["algorithm"] for c in info["collectives"]})})
    print("RESULT" + json.dumps(out), flush=True)


def main():
    a = parse_args()
    if a.child is not None:
        child(a)
        return
    counts = [int(c) for c in a.chips.split(",")]
    results = []
    print(f"{a.model} {a.input_size}x{a.input_size}, {a.per_chip_batch} per chip, Adam, "
          f"MirroredStrategy + Keras fit, timing-only, chips of {a.system}", flush=True)
    print(f"{'chips':>5} {'batch':>5} {'step ms':>9} {'samples/s':>10} {'eff':>6} "
          f"{'compute ms':>10} {'comm ms':>8} {'comm %':>6} {'exposed ms':>10} "
          f"{'wall s/step/chip':>16} {'CPU s/step/chip':>15}", flush=True)
    for n in counts:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", str(n), "--model", a.model,
               "--input-size", str(a.input_size), "--per-chip-batch", str(a.per_chip_batch),
               "--system", a.system, "--steps", str(a.steps)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout_s,
                               check=False, cwd=ROOT)
        except subprocess.TimeoutExpired:
            print(f"{n:>5} timed out after {a.timeout_s} s", flush=True)
            continue
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")]
        if p.returncode != 0 or not lines:
            print(f"{n:>5} failed (exit {p.returncode}):\n{p.stderr[-3000:]}", flush=True)
            continue
        r = json.loads(lines[-1][len("RESULT"):])
        base = results[0] if results else r
        r["efficiency"] = r["samples_per_s"] / (base["samples_per_s"] * n / base["chips"])
        results.append(r)
        print(f"{n:>5} {r['global_batch']:>5} {r['step_us'] / 1e3:>9.3f} "
              f"{r['samples_per_s']:>10.1f} {r['efficiency']:>6.3f} "
              f"{r['compute_us'] / 1e3:>10.3f} {r['comm_us'] / 1e3:>8.3f} "
              f"{100 * r['comm_share']:>6.1f} {r['exposed_comm_us'] / 1e3:>10.3f} "
              f"{r['wall_s_per_step_per_chip']:>16.1f} {r['cpu_s_per_step_per_chip']:>15.1f}",
              flush=True)
    if a.json_out:
        with open(a.json_out, "w", encoding="utf-8") as f:
            json.dump({"args": vars(a), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
