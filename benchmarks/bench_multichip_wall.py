"""Emulation cost of data-parallel training on several chips against one chip (issue "Many
chips": emulating N chips should cost about N times one chip, not more; with launch replay
shared by the chips, less). Runs benchmarks/bench_data_parallel.py's child (unmodified Keras fit
under MirroredStrategy, timing-only, the per-chip batch fixed) per chip count, with launch replay
off and on (NPUSIM_REPLAY), and prints the host CPU seconds of a timed step (the whole process:
TensorFlow, compiler, simulator), per chip, relative to one chip, and the share of launches
replayed (on the chips other than the first, most are replays of chip 0's recordings).

Usage: .venv/bin/python benchmarks/bench_multichip_wall.py [--chips 1,2,4] [--model cnn]
       [--input-size 32] [--per-chip-batch 8] [--system tiny-x8] [--steps 2]
       [--replay off,on] [--json OUT] [--timeout-s 1800]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_PARALLEL = os.path.join(ROOT, "benchmarks", "bench_data_parallel.py")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--chips", default="1,2,4", help="chip counts, comma separated")
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--input-size", type=int, default=32)
    ap.add_argument("--per-chip-batch", type=int, default=8)
    ap.add_argument("--system", default="tiny-x8")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--replay", default="off,on", help="NPUSIM_REPLAY modes, comma separated")
    ap.add_argument("--timeout-s", type=int, default=1800, help="per run")
    ap.add_argument("--json", dest="json_out", default=None)
    return ap.parse_args(argv)


def run_child(a, chips, replay):
    """bench_data_parallel.py's figures for `chips` chips with NPUSIM_REPLAY=replay, or None."""
    cmd = [sys.executable, DATA_PARALLEL, "--child", str(chips), "--model", a.model,
           "--input-size", str(a.input_size), "--per-chip-batch", str(a.per_chip_batch),
           "--system", a.system, "--steps", str(a.steps)]
    env = dict(os.environ, NPUSIM_REPLAY=replay)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout_s, check=False,
                           cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        print(f"{chips} chips, replay {replay}: timed out after {a.timeout_s} s", flush=True)
        return None
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")]
    if p.returncode != 0 or not lines:
        print(f"{chips} chips, replay {replay}: failed (exit {p.returncode}):\n"
              f"{p.stderr[-3000:]}", flush=True)
        return None
    return json.loads(lines[-1][len("RESULT"):])


def main():
    a = parse_args()
    counts = [int(c) for c in a.chips.split(",")]
    print(f"{a.model} {a.input_size}x{a.input_size}, {a.per_chip_batch} per chip, MirroredStrategy "
          f"+ Keras fit, timing-only, chips of {a.system}, {a.steps} timed steps", flush=True)
    print(f"{'replay':>6} {'chips':>5} {'CPU s/step':>10} {'per chip':>9} {'vs 1 chip':>9} "
          f"{'replayed %':>10} {'sim step ms':>11}", flush=True)
    results = []
    for replay in a.replay.split(","):
        base = None
        for n in counts:
            r = run_child(a, n, replay)
            if r is None:
                continue
            r["replay"] = replay
            if base is None:
                base = r
            # CPU per chip over the smallest chip count's CPU per chip: 1.0 = N chips cost N
            # times one chip.
            r["per_chip_vs_base"] = (r["cpu_s_per_step_per_chip"]
                                     / (base["cpu_s_per_step"] / base["chips"]))
            results.append(r)
            print(f"{replay:>6} {n:>5} {r['cpu_s_per_step']:>10.2f} "
                  f"{r['cpu_s_per_step_per_chip']:>9.2f} {r['per_chip_vs_base']:>9.2f} "
                  f"{100 * r['replayed_share']:>10.1f} {r['step_us'] / 1e3:>11.3f}", flush=True)
    if a.json_out:
        with open(a.json_out, "w", encoding="utf-8") as f:
            json.dump({"args": vars(a), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
