"""replay_log_summary.py LOG.tsv: where a run's launch replay fell short, from the replay log
that NPUSIM_REPLAY_LOG=LOG.tsv writes (sim/simulator.h, SimOptions::replay_log: per launch the
kernel, block_dim, cycles, the simulation thread's CPU microseconds, "replayed" or "simulated"
and how or why). A launch group's lines (streams) are written at its end: the group's CPU time
is on its first member's line, so the lines sum to the time spent.

Prints the launches replayed and simulated with their CPU seconds, then the simulated ones by
reason (the numbers in a reason left out, so that "argument 3 at another offset ..." and
"argument 0 at another offset ..." count as one) with their count, CPU seconds and simulated
cycles, and the kernels that took the most CPU time under each reason.

Usage: python benchmarks/replay_log_summary.py LOG.tsv [--last N] [--top 5] [--json OUT]
--last N: only the log's last N launches (a benchmark's step after the model's set-up: the
number of kernels bench_timing_only.py prints for the step).
"""
import argparse
import json
import re
import sys
from collections import defaultdict


def reason_class(why):
    """The reason without its numbers and without what the launch's own recording gives."""
    why = why.split("; ", 1)[0]
    why = re.sub(r"\(.*?\)", "", why)
    why = re.sub(r"\b\d+\b", "N", why)
    return re.sub(r"\s+", " ", why).strip()


def summarise(lines, top):
    """Totals and the simulated launches by reason class, from the log's lines."""
    totals = defaultdict(lambda: {"launches": 0, "cpu_s": 0.0, "cycles": 0})
    reasons = defaultdict(lambda: {"launches": 0, "cpu_s": 0.0, "cycles": 0,
                                   "kernels": defaultdict(lambda: [0, 0.0])})
    for n, line in enumerate(lines, 1):
        fields = line.rstrip("\n").split("\t")
        if len(fields) < 6:
            raise SystemExit(f"replay log line {n}: expected 6 tab-separated fields, got "
                             f"{len(fields)}: {line!r}")
        kernel, _blocks, cycles, cpu_us, verdict, detail = fields[:6]
        cpu = int(cpu_us) / 1e6
        t = totals[verdict]
        t["launches"] += 1
        t["cpu_s"] += cpu
        t["cycles"] += int(cycles)
        if verdict != "simulated":
            continue
        r = reasons[reason_class(detail)]
        r["launches"] += 1
        r["cpu_s"] += cpu
        r["cycles"] += int(cycles)
        r["kernels"][kernel][0] += 1
        r["kernels"][kernel][1] += cpu
    out = {"totals": {k: dict(v) for k, v in totals.items()}, "simulated_by_reason": {}}
    for why, r in sorted(reasons.items(), key=lambda kv: -kv[1]["cpu_s"]):
        kernels = sorted(r["kernels"].items(), key=lambda kv: -kv[1][1])[:top]
        out["simulated_by_reason"][why] = {
            "launches": r["launches"], "cpu_s": round(r["cpu_s"], 3), "cycles": r["cycles"],
            "top_kernels": [{"kernel": k, "launches": c, "cpu_s": round(s, 3)}
                            for k, (c, s) in kernels]}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log")
    ap.add_argument("--last", type=int, default=0, help="only the last N launches")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args()
    with open(a.log, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    out = summarise(lines[-a.last:] if a.last > 0 else lines, a.top)
    for verdict, t in sorted(out["totals"].items()):
        print(f"{verdict}: {t['launches']} launches, {t['cpu_s']:.1f} CPU-s, "
              f"{t['cycles']:,} cycles")
    print("simulated, by reason:")
    for why, r in out["simulated_by_reason"].items():
        print(f"  {r['launches']:5d} launches {r['cpu_s']:8.1f} CPU-s {r['cycles']:>14,} cycles  "
              f"{why}")
        for k in r["top_kernels"]:
            print(f"        {k['launches']:5d} x {k['kernel']} ({k['cpu_s']:.1f} CPU-s)")
    if a.json_out:
        with open(a.json_out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
