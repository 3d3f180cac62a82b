"""Benchmark of the collective engine (issue "Many chips"): the all-reduce bus-bandwidth curve of
the 910B-like server and the two-server cluster through `npusim collective` (timing-only).

For each case it runs 1 KiB .. 1 GiB and prints the nccl-tests table, then checks two targets
derived from the system config (printed as PASS/MISS; exit 1 on a MISS):
- large messages: the largest size's busbw is within 10 % of the peak the config implies for the
  algorithm: ring -> one link's bandwidth (the slowest link on the ring: an HCCS link in a
  server, a NIC across servers); mesh on n chips -> (n - 1) links at once, (n - 1) x link;
  mesh_ring (S servers of L chips) -> 2(n-1)/n / (2 / (L link) + 2 (S-1) / (S L nic)), the
  data's time through level 0 twice and the NICs' ring once;
- small messages: the smallest size's time is within 10 % of the latency-bound time, the sum of
  the steps' latencies (link latency in a server; NIC + switch across servers): the curve's
  small end is latency-bound as the config says.

Usage: python3 benchmarks/bench_collective.py [--npusim build/npusim] [--out FILE]
Writes benchmarks/results/collective.json.
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (system, algorithm as given to --algo)
CASES = [("910b-x8", "ring"), ("910b-x8", "auto"), ("910b-x16", "auto"), ("910b-x16", "ring")]


def run_case(npusim, system, algo):
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run([npusim, "collective", "all_reduce", "--system", system, "--algo",
                            algo, "--bytes", "1K..1G", "--out", d], capture_output=True,
                           text=True, check=True)
        print(p.stdout, end="")
        with open(os.path.join(d, "results.csv")) as f:
            rows = list(csv.DictReader(f))
        with open(os.path.join(d, "system.yaml")) as f:
            cfg = yaml.safe_load(f)
    return rows, cfg


def targets(rows, cfg):
    """(peak busbw GB/s, latency-bound time of the smallest size us) from the resolved system."""
    servers, per = cfg["servers"], cfg["chips_per_server"]
    n = servers * per
    link = cfg["server"]["link"]
    algo, steps = rows[-1]["algorithm"], int(rows[0]["steps"])
    if servers > 1:
        nic = cfg["scale_out"]["nic"]
        remote_latency = nic["latency_us"] + cfg["scale_out"]["switch"]["latency_us"]
    if algo == "mesh_ring":
        level0 = 2 / (per * link["gbps"])
        level1 = 2 * (servers - 1) / (servers * per * nic["gbps"])
        return (2 * (n - 1) / n / (level0 + level1),
                2 * link["latency_us"] + 2 * (servers - 1) * remote_latency)
    if servers > 1:  # a flat ring crosses servers: a NIC is its slowest hop
        return min(link["gbps"], nic["gbps"]), steps * max(link["latency_us"], remote_latency)
    if algo == "mesh":
        return (n - 1) * link["gbps"], steps * link["latency_us"]
    return link["gbps"], steps * link["latency_us"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--npusim", default=os.path.join(ROOT, "build", "npusim"))
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                  "collective.json"))
    args = ap.parse_args()
    results, ok = [], True
    for system, algo in CASES:
        rows, cfg = run_case(args.npusim, system, algo)
        peak, lat_time = targets(rows, cfg)
        big, small = rows[-1], rows[0]
        busbw, t_small = float(big["busbw_gbps"]), float(small["time_us"])
        big_ok = abs(busbw - peak) <= 0.1 * peak
        small_ok = abs(t_small - lat_time) <= 0.1 * lat_time
        ok &= big_ok and small_ok
        print(f"# {system} {big['algorithm']}: {int(big['size_bytes'])} B busbw {busbw:.2f} GB/s "
              f"vs configured peak {peak:.2f} GB/s ({busbw / peak * 100:.1f} %): "
              f"{'PASS' if big_ok else 'MISS'}")
        print(f"# {system} {small['algorithm']}: {int(small['size_bytes'])} B takes "
              f"{t_small:.2f} us vs latency bound {lat_time:.2f} us ({small['steps']} steps): "
              f"{'PASS' if small_ok else 'MISS'}\n")
        results.append({"system": system, "algorithm": big["algorithm"], "peak_busbw_gbps": peak,
                        "large_busbw_gbps": busbw, "latency_bound_us": lat_time,
                        "small_time_us": t_small, "rows": rows})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.out}")
    sys.exit(0 if ok else 1)


main()
