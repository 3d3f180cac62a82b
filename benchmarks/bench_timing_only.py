"""Benchmark of timing-only TensorFlow runs at a real batch size (issue "Fidelity at model scale"):
ResNet-50 training at batch 256, 224x224x3, Adam, on the 910b preset, with
npusim.configure(functional=False): kernels take their simulated time and count what a
functional run would, but compute nothing, and device memory holds only what the host copied
in, so the step's 30+ GB of activations cost no host memory (docs/tf_plugin.md, "Timing-only
runs").

It runs one training step (model.train_on_batch, the first: TensorFlow traces the step and the
plugin compiles every kernel in it) inside npusim.profile(report dir), and prints:

- wall_s: host wall time of the step; cpu_s: the process's CPU time over it (user + system, all
  threads; on a shared host wall time includes waiting for a CPU, the CPU time does not);
- simulated_us: the step's device timeline (first launch start to last launch end, as
  models.run's simulated_us_per_step) and the kernels it launched;
- where the wall time went: the kernel launches' own host time (launch records' wall_us, the
  simulator), by TF op type, and what is left (TensorFlow, the kernel compiler, Python); of
  the latter, the plugin's host phases' CPU seconds (npusim.host_cpu_seconds(): graph passes,
  kernel compiles, graph plans);
- with NPUSIM_REPLAY_LOG=FILE set (the replay log, sim/simulator.h SimOptions::replay_log),
  the step's simulated launches by the reason no recording timed them, with their CPU seconds
  (benchmarks/replay_log_summary.py);
- report_s: the time npusim.profile took to write the step's report folder (op_summary.csv,
  op_statistic.csv, trace.json, summary.txt, plots) and its path; report_cpu_s: its CPU
  seconds, the plot script's process included; peak host memory (ru_maxrss)
  after each step and at the end.

Target (printed as MET/MISS, not asserted): the step within 120 s of wall time.

Usage: .venv/bin/python benchmarks/bench_timing_only.py [--batch 256] [--input-size 224]
       [--chip 910b] [--set dotted.key=value ...] [--steps 1] [--report-dir out/timing_only_resnet50] [--profile FILE]
       [--no-report] [--json OUT]
--steps 2 also times a second step (kernels compiled and traced: the simulator's share alone).
--profile writes a cProfile of the first step (python -m pstats FILE).
"""
import argparse
import cProfile
import json
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TARGET_WALL_S = 120.0


def cpu_s(children=False):
    """CPU seconds of this process so far (every thread, user + system); children=True adds
    its waited-for child processes' (the report's plot script)."""
    t = os.times()
    return t.user + t.system + (t.children_user + t.children_system if children else 0.0)


def maxrss_gib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2.0**20  # Linux: KiB


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--input-size", type=int, default=224)
    ap.add_argument("--chip", default="910b")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    metavar="dotted.key=value", help="chip config override (repeatable)")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--report-dir", default=os.path.join(ROOT, "out", "timing_only_resnet50"))
    ap.add_argument("--profile", default=None)
    ap.add_argument("--no-report", action="store_true",
                    help="time the steps only (no npusim.profile report)")
    ap.add_argument("--json", dest="json_out", default=None)
    return ap.parse_args()


def replay_split(records):
    """What was replayed and what simulated: the share of the launches' cycles replayed, and
    the simulated launches split into the first of their kernel and block count in the step
    (nothing to replay them from) and those of a kernel seen before (a replay was refused: other
    arguments, tensors at other offsets in their blocks, a kernel that loads data...), with their
    own host wall time (wall_us) and the latter's count by TF op type (top 8). A kernel's name
    does not hold its shape: most "seen before" are the first launch of a kernel at a shape
    (untyped arguments); the replay log (NPUSIM_REPLAY_LOG) tells each launch's reason."""
    seen, out = set(), {"first": 0, "again": 0, "first_wall_s": 0.0, "again_wall_s": 0.0}
    again_by_type = {}
    total = replayed = 0
    for r in records:
        cycles = r.get("cycles") or 0
        total += cycles
        key = (r.get("kernel"), r.get("block_dim"))
        if r.get("replayed"):
            replayed += cycles
        else:
            kind = "again" if key in seen else "first"
            out[kind] += 1
            out[kind + "_wall_s"] += (r.get("wall_us") or 0) / 1e6
            if kind == "again":
                t = r.get("op_type") or "?"
                again_by_type[t] = again_by_type.get(t, 0) + 1
        seen.add(key)
    out["replayed_cycles_share"] = replayed / total if total else 0.0
    out["again_by_op_type"] = dict(sorted(again_by_type.items(), key=lambda kv: -kv[1])[:8])
    return out


def host_phases(times):
    """npusim.host_cpu_seconds() summed per phase (graph_pass, compile, graph_plan): {phase:
    {"cpu_s", "calls", "top": {item: cpu_s} (the 4 largest)}}."""
    out = {}
    for phase, items in (times or {}).items():
        top = sorted(items.items(), key=lambda kv: -kv[1]["cpu_s"])[:4]
        out[phase] = {"cpu_s": sum(v["cpu_s"] for v in items.values()),
                      "calls": sum(v["calls"] for v in items.values()),
                      "top": {k: round(v["cpu_s"], 2) for k, v in top}}
    return out


def replay_log_lines():
    """The lines of the replay log so far (NPUSIM_REPLAY_LOG), or None when it is not written."""
    path = os.environ.get("NPUSIM_REPLAY_LOG")
    if not path:
        return None
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [line for line in f if line.strip()]


def main():
    a = parse_args()
    import npusim  # before TensorFlow's first op

    npusim.configure(chip=a.chip, overrides=a.overrides, functional=False)
    import keras
    import tensorflow as tf

    import models
    from models import run

    x, y = models.synthetic_data(a.model, a.batch, a.input_size, seed=0)
    with tf.device("/NPU:0"):
        model = models.build(a.model, a.input_size, seed=0)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=models.loss(a.model),
                      jit_compile=False)
        xt, yt = tf.constant(x), tf.constant(y)

    def step():
        with tf.device("/NPU:0"):
            return float(model.train_on_batch(xt, yt))

    steps = []
    # The msprof-style report of the last step (npusim.profile, as a user writes it): its
    # writing is timed apart from the step.
    report = npusim.profile(a.report_dir)
    for i in range(a.steps):
        if i == a.steps - 1 and not a.no_report:
            report.__enter__()  # pylint: disable=unnecessary-dunder-call
        profiler = cProfile.Profile() if a.profile and i == 0 else None
        npusim.clear_launch_records()
        npusim.host_cpu_seconds(reset=True)
        logged = replay_log_lines()
        c0, t0 = cpu_s(), time.perf_counter()
        if profiler:
            profiler.runcall(step)
            profiler.dump_stats(a.profile)
        else:
            step()
        wall, cpu = time.perf_counter() - t0, cpu_s() - c0
        rss = maxrss_gib()
        host = host_phases(npusim.host_cpu_seconds())
        records = npusim.launch_records()
        figures = run.npu_figures(npusim, a.batch, 1, records, [])
        replay = replay_split(records)
        steps.append({"wall_s": wall, "cpu_s": cpu, "max_rss_gib": rss,
                      "simulated_us": figures.get("simulated_us_per_step"),
                      "kernels": len(records),
                      "replayed": sum(1 for r in records if r.get("replayed")),
                      "replay": replay, "host_cpu_s": host,
                      "launch_wall_s": figures["emulator_wall_s_per_step"],
                      "launch_wall_s_by_op_type": {
                          k: round(v, 3) for k, v in
                          list(figures["emulator_wall_s_by_op_type"].items())[:8]}})
        s = steps[-1]
        print(f"step {i + 1}: {s['wall_s']:.1f} s wall, {s['cpu_s']:.1f} s CPU; simulated "
              f"{s['simulated_us'] / 1000:.2f} ms, {s['kernels']} kernels "
              f"({s['replayed']} replayed); launches' own wall "
              f"{s['launch_wall_s']:.1f} s, the rest (TensorFlow, compiler, Python) "
              f"{s['wall_s'] - s['launch_wall_s']:.1f} s; host max RSS {rss:.1f} GiB",
              flush=True)
        print(f"  replayed {replay['replayed_cycles_share']:.0%} of the launches' cycles; "
              f"simulated: {replay['first']} first launches of a kernel and block count "
              f"({replay['first_wall_s']:.1f} s of their own wall), {replay['again']} of one "
              f"seen before ({replay['again_wall_s']:.1f} s; by op type: "
              f"{replay['again_by_op_type']})", flush=True)
        print("  the plugin's host phases (CPU s of the threads that ran them): " + "; ".join(
            f"{phase} {h['cpu_s']:.1f} s in {h['calls']} calls (top: "
            + ", ".join(f"{k} {v:.1f}" for k, v in h["top"].items()) + ")"
            for phase, h in host.items()), flush=True)
        if logged is not None:
            from benchmarks.replay_log_summary import summarise
            why = summarise(replay_log_lines()[len(logged):], top=3)
            s["replay_log"] = why
            print("  simulated launches by reason (replay log; the simulation thread's CPU s):",
                  flush=True)
            for reason, r in why["simulated_by_reason"].items():
                top = ", ".join(f"{k['launches']} {k['kernel']} {k['cpu_s']:.1f} s"
                                for k in r["top_kernels"])
                print(f"    {r['launches']} launches, {r['cpu_s']:.1f} CPU-s: {reason} ({top})",
                      flush=True)
    c0, t0 = cpu_s(children=True), time.perf_counter()
    if not a.no_report:
        report.__exit__(None, None, None)
    report_s, report_cpu_s = time.perf_counter() - t0, cpu_s(children=True) - c0
    report = None if a.no_report else report.directory
    first = steps[0]
    out = {"model": a.model, "batch": a.batch, "input_size": a.input_size, "chip": a.chip,
           "overrides": a.overrides,
           "functional": False, "steps": steps, "report_dir": report, "report_s": report_s, "report_cpu_s": report_cpu_s,
           "max_rss_gib": maxrss_gib(),
           "device_peak_bytes": tf.config.experimental.get_memory_info("NPU:0")["peak"],
           "target_wall_s": TARGET_WALL_S, "met": first["wall_s"] <= TARGET_WALL_S}
    print(f"{a.model} training, batch {a.batch}, {a.input_size}x{a.input_size}, {a.chip}, "
          f"timing-only: one step {first['wall_s']:.1f} s wall ({first['cpu_s']:.1f} s CPU), "
          f"simulated step {first['simulated_us'] / 1000:.2f} ms; report ({report_s:.1f} s, "
          f"{report_cpu_s:.1f} s CPU with its plots): "
          f"{report}; device peak {out['device_peak_bytes'] / 2**30:.1f} GiB, host max RSS "
          f"{out['max_rss_gib']:.1f} GiB; target {TARGET_WALL_S:.0f} s: "
          f"{'MET' if out['met'] else 'MISS'}")
    if a.json_out:
        with open(a.json_out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
