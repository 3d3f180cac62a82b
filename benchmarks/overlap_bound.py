#!/usr/bin/env python3
"""What running a report's launches concurrently could give at most: a work-conservation bound.

npusim runs the launches of a chip one after another (docs/runtime.md, "Known limits"). Whatever
a multi-stream schedule did with the same launches, each core kind's cores could not finish
sooner than the cycles its cores were occupied by blocks, summed over every launch and spread
evenly over the cores of that kind (a core runs one block at a time; concurrency only packs the
blocks tighter). This script reads a report directory (NPUSIM_REPORT_DIR of a run, e.g. of
`benchmarks/launch_cycles.py`) and prints, per core kind, those occupied cycles
(`<core>.active_cycles` of launches.json, the cycles a core held a block), the step they bound,
and the cube utilisation that bound allows:

    utilisation <= cube MACs / (cube cores x MACs per cycle) / max over kinds of the bound

next to the utilisation of the step as run (the launches' Task Durations summed). The bound
leaves out every task overhead that holds no core (dispatch, completion), every dependency
between launches and all contention a concurrent schedule adds (L2, HBM): it is a ceiling, not
an estimate.

    overlap_bound.py REPORT_DIR
"""

import argparse
import csv
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import yaml


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report_dir", type=Path)
    args = ap.parse_args()
    launches_path = args.report_dir / "launches.json"
    chip_path = args.report_dir / "chip.yaml"
    summary_path = args.report_dir / "op_summary.csv"
    for p in (launches_path, chip_path, summary_path):
        if not p.is_file():
            print(f"overlap_bound: {p} not found (a report directory of a run with "
                  "NPUSIM_REPORT_DIR has it)", file=sys.stderr)
            return 2
    chip = yaml.safe_load(chip_path.read_text())
    cores = {kind: int(spec["count"]) for kind, spec in chip["cores"].items()}
    cube_kind = "aic" if "aic" in cores else "aicore"
    macs_per_cycle = cores[cube_kind] * chip["cube"]["m"] * chip["cube"]["k"] * chip["cube"]["n"]
    launches = json.loads(launches_path.read_text())
    active = defaultdict(int)  # core kind -> cycles its cores held blocks, over all launches
    by_type = defaultdict(lambda: defaultdict(int))  # op type -> core kind -> the same
    pattern = re.compile(r"([a-z]+)\d+\.active_cycles$")
    for launch in launches:
        for name, value in launch.get("counters", {}).items():
            m = pattern.match(name)
            if m and m.group(1) in cores:
                active[m.group(1)] += int(value)
                by_type[launch.get("op_type", "?")][m.group(1)] += int(value)
    with summary_path.open() as f:
        rows = list(csv.DictReader(f))
    step = sum(int(r["task_duration_cycles"]) for r in rows)
    macs = sum(float(r["cube_macs"] or 0) for r in rows)
    peak_cycles = macs / macs_per_cycle
    print(f"{args.report_dir}: {len(rows)} launches, {macs / 1e9:.2f} G cube MACs "
          f"({peak_cycles:,.0f} cycles at the {cores[cube_kind]} cube cores' peak)")
    print(f"as run, one launch at a time: {step:,} cycles, cube utilisation "
          f"{peak_cycles / step:.1%}")
    bound = 0.0
    for kind, count in cores.items():
        per_core = active[kind] / count
        bound = max(bound, per_core)
        print(f"  {kind}: {active[kind]:,} core-cycles held by blocks over {count} cores = "
              f"{per_core:,.0f} cycles")
    if bound > 0:
        print(f"any concurrent schedule of these launches: at least {bound:,.0f} cycles, "
              f"cube utilisation at most {peak_cycles / bound:.1%}")
    print("core-cycles by op type (the largest 10, share of each kind):")
    kinds = list(cores)
    top = sorted(by_type.items(), key=lambda kv: -max(kv[1][k] / cores[k] for k in kinds))[:10]
    for op_type, held in top:
        shares = ", ".join(f"{k} {held[k] / cores[k]:,.0f} ({held[k] / max(active[k], 1):.1%})"
                           for k in kinds if held[k])
        print(f"  {op_type:32s} {shares}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
