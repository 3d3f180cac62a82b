"""Benchmark of the L2 cache policy (docs/chip_model.md "Memory system", docs/compiler.md
"L2 policy of element-wise streams"): what keeping the L2 across launches, a write-back L2 and
the compiler's noalloc streams change in simulated time, L2 hit rate and HBM traffic.

Workloads, each run in its own process per configuration (SystemC elaborates one chip per
process), timing-only (the figures do not depend on data):

- chain: y = |((x * 1.5 + 0.5) max 0)^2 - 1| as six element-wise TF ops (six launches) in one
  tf.function on an fp16 tensor of --small elements (fits in the L2) and of --large elements
  (input plus output larger than the L2: the compiler streams the input with noalloc);
- model: models.run --model mlp --mode train (the main job's MLP step), --batch.

Configurations: cold (the presets: L2 cold at every launch), keep (memory.l2.keep_across_
launches=true), keep+wb (and memory.l2.write_back=true), and for keep+wb the same with the
compiler's stream policy off (NPUSIM_L2_STREAM_POLICY=0): the "no hints" row.

Prints per workload and configuration: simulated us (device timeline of one measured call or
step), L2 hit rate (hits / lookups), HBM MiB.

Usage: .venv/bin/python benchmarks/bench_l2_policy.py [--chip 910b] [--small 1048576]
       [--large 67108864] [--batch 32] [--json OUT]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = [
    ("cold", [], {}),
    ("keep", ["memory.l2.keep_across_launches=true"], {}),
    ("keep+wb, no hints", ["memory.l2.keep_across_launches=true", "memory.l2.write_back=true"],
     {"NPUSIM_L2_STREAM_POLICY": "0"}),
    ("keep+wb", ["memory.l2.keep_across_launches=true", "memory.l2.write_back=true"], {}),
]


def chain_child(chip, overrides, n):
    """Runs the chain once to compile, once measured; prints its figures as JSON."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, ROOT)
    import npusim  # pylint: disable=import-outside-toplevel

    npusim.configure(chip=chip, overrides=overrides, functional=False)
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from models.run import (  # pylint: disable=import-outside-toplevel
        _clock_mhz, chip_peaks, launch_counters, timeline)

    @tf.function
    def chain(x):
        y = x * tf.constant(1.5, tf.float16)
        y = y + tf.constant(0.5, tf.float16)
        y = tf.nn.relu(y)
        y = y * y
        y = y - tf.constant(1.0, tf.float16)
        return tf.abs(y)

    with tf.device("/NPU:0"):
        x = tf.zeros([n], tf.float16)
        chain(x)
        npusim.clear_launch_records()
        chain(x)
        records = npusim.launch_records(with_counters=True)
    first, last, _ = timeline(records)
    clock = _clock_mhz(records, chip_peaks(npusim))
    figures = launch_counters(records, None)
    print(json.dumps({"launches": len(records), "simulated_cycles": last - first,
                      "l2_hit_rate": figures.get("l2_hit_rate", 0.0),
                      "hbm_bytes": figures["hbm_bytes"], "clock_mhz": clock}))


def run_child(args, env_extra):
    env = dict(os.environ, **env_extra)
    out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stderr or out.stdout).strip().splitlines()[-1:]}
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chip", default="910b")
    ap.add_argument("--small", type=int, default=1 << 20)
    ap.add_argument("--large", type=int, default=1 << 26)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--json")
    ap.add_argument("--chain-child", nargs=2, metavar=("N", "OVERRIDES"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.chain_child:
        n, overrides = a.chain_child
        chain_child(a.chip, [o for o in overrides.split(";") if o], int(n))
        return 0
    py = sys.executable
    rows = []
    for name, overrides, env in CONFIGS:
        for n in (a.small, a.large):
            r = run_child([py, __file__, "--chip", a.chip, "--chain-child", str(n),
                           ";".join(overrides)], env)
            if "simulated_cycles" in r:
                r["simulated_us"] = r["simulated_cycles"] / r["clock_mhz"]
            rows.append({"workload": f"chain f16[{n}]", "config": name, **r})
        cmd = [py, "-m", "models.run", "--model", "mlp", "--mode", "train", "--batch",
               str(a.batch), "--steps", "2", "--chip", a.chip, "--timing-only", "--quiet"]
        for o in overrides:
            cmd += ["--set", o]
        r = run_child(cmd, env)
        rows.append({"workload": f"mlp train b{a.batch}", "config": name,
                     "simulated_us": r.get("simulated_us_per_step"),
                     "l2_hit_rate": r.get("l2_hit_rate"),
                     "hbm_bytes": r.get("hbm_bytes_per_step"), "error": r.get("error")})
    print(f"{'workload':<24} {'config':<18} {'simulated us':>13} {'L2 hit rate':>12} "
          f"{'HBM MiB':>10}")
    for r in sorted(rows, key=lambda r: r["workload"]):
        if r.get("error"):
            print(f"{r['workload']:<24} {r['config']:<18} error: {r['error']}")
            continue
        print(f"{r['workload']:<24} {r['config']:<18} {r['simulated_us']:>13.1f} "
              f"{r['l2_hit_rate']:>12.3f} {r['hbm_bytes'] / 2**20:>10.1f}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
