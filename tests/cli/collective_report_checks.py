"""`npusim collective ... --report-dir` (docs/reports.md, "Communication (HCCL) tasks") on the
tiny-x8 system, checked against the collective's known sizes and the link config (system.yaml
written next to the report): op_summary.csv has one HCCL row per collective and rank whose bytes
sent over the chip's links are what the algorithm sends (a ring all-reduce 2(n-1)/n of the
buffer, over one link; the mesh the same over n-1 links), whose link utilisation is those bytes
over the links' bandwidth times the duration, and whose bandwidths follow nccl-tests; trace.json
has a communication lane per chip and a flow per transfer of every step; summary.txt splits every
chip's time into compute, communication and overlap.

Usage: collective_report_checks.py NPUSIM_BINARY SOURCE_DIR. Prints 'N passed, N failed' and
exits non-zero on any failure.
"""
import csv
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

NPUSIM, ROOT = sys.argv[1], sys.argv[2]
failures = []
passed = 0


def check(cond, what):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(what)


def report(*args):
    d = tempfile.mkdtemp(prefix="npusim_comm_report_")
    p = subprocess.run([NPUSIM, "collective", *args, "--report-dir", d], capture_output=True,
                       text=True, timeout=300, check=False)
    if p.returncode != 0:
        raise AssertionError(f"npusim collective {' '.join(args)}: exit {p.returncode}\n"
                             f"{p.stdout}\n{p.stderr}")
    with open(os.path.join(d, "op_summary.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(d, "trace.json")) as f:
        trace = json.load(f)
    with open(os.path.join(d, "summary.txt")) as f:
        summary = f.read()
    with open(os.path.join(d, "system.yaml")) as f:
        system = yaml.safe_load(f)
    with open(os.path.join(d, "chip.yaml")) as f:
        chip = yaml.safe_load(f)
    with open(os.path.join(d, "op_statistic.csv"), newline="") as f:
        stats = list(csv.DictReader(f))
    return rows, trace, summary, system, chip, stats


def close(a, b, rel=2e-3, abs_=2e-3):
    return abs(a - b) <= abs_ + rel * abs(b)


def check_rows(label, rows, n, sizes, links_per_rank, gbps, clock_mhz, op_type="HcomAllReduce",
               bus=None):
    """Every HCCL row against the sizes and the links: a rank sends bus x size bytes (the
    nccl-tests bus factor is exactly the share a rank sends in these algorithms) over
    `links_per_rank` links of `gbps`."""
    bus = bus if bus is not None else 2.0 * (n - 1) / n
    hccl = [r for r in rows if r["Task Type"] == "HCCL"]
    check(len(hccl) == n * len(sizes), f"{label}: {len(hccl)} HCCL rows, wanted {n * len(sizes)}")
    for k, size in enumerate(sizes):
        mine = hccl[k * n:(k + 1) * n]
        check(sorted(int(r["chip"]) for r in mine) == list(range(n)),
              f"{label} size {size}: chips {[r['chip'] for r in mine]}")
        for r in mine:
            where = f"{label} size {size} chip {r['chip']}"
            dur_us = float(r["Task Duration(us)"])
            cycles = int(r["task_duration_cycles"])
            check(r["OP Type"] == op_type and int(r["comm_bytes"]) == size and
                  int(r["ranks"]) == n, f"{where}: {r['OP Type']} {r['comm_bytes']} {r['ranks']}")
            check(close(dur_us, cycles / clock_mhz), f"{where}: {dur_us} us vs {cycles} cycles")
            sent = int(r["link_bytes"])
            check(sent == round(bus * size), f"{where}: sent {sent}, wanted {bus} x {size}")
            check(float(r["link_bandwidth(GB/s)"]) == links_per_rank * gbps,
                  f"{where}: link bandwidth {r['link_bandwidth(GB/s)']}")
            util = 100.0 * sent / (links_per_rank * gbps * 1e3 * (cycles / clock_mhz))
            check(close(float(r["link_utilization(%)"]), util),
                  f"{where}: utilisation {r['link_utilization(%)']} vs {util}")
            algbw = size / (dur_us * 1e3)
            check(close(float(r["alg_bandwidth(GB/s)"]), algbw) and
                  close(float(r["bus_bandwidth(GB/s)"]), algbw * bus),
                  f"{where}: bandwidths {r['alg_bandwidth(GB/s)']} {r['bus_bandwidth(GB/s)']}")
    return hccl


def check_trace(label, trace, n, sizes, steps_per_collective, transfers_per_step):
    ev = trace["traceEvents"]
    lanes = {e["args"]["name"] for e in ev
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    check(lanes == {f"chip{c} HCCL" for c in range(n)}, f"{label}: lanes {sorted(lanes)}")
    slices = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "hccl"]
    collectives = [e for e in slices if e["name"].startswith("hcom_")]
    check(len(collectives) == n * len(sizes), f"{label}: {len(collectives)} collective slices")
    steps = [e for e in slices if e["name"].startswith("step ")]
    check(len(steps) == n * len(sizes) * steps_per_collective, f"{label}: {len(steps)} steps")
    starts = {e["id"]: e for e in ev if e.get("ph") == "s" and e.get("cat") == "hccl"}
    ends = {e["id"]: e for e in ev if e.get("ph") == "f" and e.get("cat") == "hccl"}
    want = len(sizes) * steps_per_collective * transfers_per_step
    check(len(starts) == want and starts.keys() == ends.keys(),
          f"{label}: {len(starts)} flow starts, {len(ends)} ends, wanted {want}")
    # Each flow leaves a chip and arrives at another one, no earlier, inside a step slice there.
    by_lane = {}
    for s in steps:
        by_lane.setdefault(s["pid"], []).append((s["ts"], s["ts"] + s["dur"]))
    bad = [i for i, s in starts.items()
           if ends[i]["pid"] == s["pid"] or ends[i]["ts"] < s["ts"] or
           not any(b <= ends[i]["ts"] <= e for b, e in by_lane[ends[i]["pid"]])]
    check(not bad, f"{label}: {len(bad)} flows out of place, e.g. {bad[:3]}")


def check_summary(label, summary, hccl, n):
    """Per chip: no kernels, so communication = the collectives' summed time, overlap 0."""
    lines = summary.split("Time per chip (us)")[-1].splitlines()
    table = {}
    for line in lines:
        m = re.match(r"\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", line)
        if m:
            table[int(m.group(1))] = [float(v) for v in m.groups()[1:]]
    check(sorted(table) == list(range(n)), f"{label}: summary chips {sorted(table)}")
    for chip, (compute, comm, overlap, exposed, busy) in table.items():
        want = sum(float(r["Task Duration(us)"]) for r in hccl if int(r["chip"]) == chip)
        check(compute == 0 and overlap == 0 and close(comm, want, abs_=0.01) and
              close(exposed, comm) and close(busy, comm),
              f"{label}: chip {chip}: {compute} {comm} {overlap} {exposed} {busy}, comm {want}")


def main():
    sizes = [64 << 10, 128 << 10, 256 << 10]
    # Ring all-reduce on the 4 chips of one full-mesh server: each rank sends 2(n-1)/n of the
    # buffer to its neighbour over one HCCS link; 2(n-1) steps of n transfers.
    rows, trace, summary, system, chip, _ = report(
        "all_reduce", "--system", "tiny-x8", "--chips", "4", "--bytes", "64K..256K", "--algo",
        "ring")
    gbps, mhz = float(system["server"]["link"]["gbps"]), float(chip["clock_mhz"])
    hccl = check_rows("ring", rows, 4, sizes, 1, gbps, mhz)
    check_trace("ring", trace, 4, sizes, 6, 4)
    check_summary("ring", summary, hccl, 4)
    check(all(r["algorithm"] == "ring" and r["reduce_op"] == "sum" for r in hccl),
          "ring: algorithm/reduce_op columns")
    # The ring's time from the config: 2(n-1) steps, each a link latency plus one block (size / n)
    # at the link's bandwidth; the links are busy only for the blocks, so the utilisation is
    # 2(n-1) x block time / duration.
    lat_us = float(system["server"]["link"]["latency_us"])
    for k, size in enumerate(sizes):
        block_us = size / 4 / (gbps * 1e3)
        want_us = 6 * (lat_us + block_us)
        for r in hccl[k * 4:(k + 1) * 4]:
            check(close(float(r["Task Duration(us)"]), want_us, abs_=0.01) and
                  close(float(r["link_utilization(%)"]), 100 * 6 * block_us / want_us, abs_=0.01),
                  f"ring {size}: {r['Task Duration(us)']} us, {r['link_utilization(%)']} %, "
                  f"wanted {want_us} us, {100 * 6 * block_us / want_us} %")

    # Mesh: the same bytes per rank, spread over its n-1 links; two steps of n(n-1) transfers.
    rows, trace, summary, system, chip, stats = report(
        "all_reduce", "--system", "tiny-x8", "--chips", "4", "--bytes", "64K..256K")
    hccl = check_rows("mesh", rows, 4, sizes, 3, gbps, mhz)
    check([(s["OP Type"], s["Core Type"], int(s["Count"])) for s in stats] ==
          [("HcomAllReduce", "HCCL", 12)] and
          close(float(stats[0]["Total Time(us)"]),
                sum(float(r["Task Duration(us)"]) for r in hccl), abs_=0.01),
          f"mesh: op_statistic {stats}")
    check(all(r["algorithm"] == "mesh" for r in hccl), "mesh: algorithm column")
    check_trace("mesh", trace, 4, sizes, 2, 12)

    # all_gather over the 8 chips of both servers (a flat ring 0 -> 1 -> ... -> 7 -> 0): each rank
    # sends (n-1)/n of the gathered output to its neighbour, over an HCCS link, or over its NIC
    # for chips 3 and 7, whose neighbours sit in the other server.
    rows, trace, summary, system, chip, _ = report(
        "all_gather", "--system", "tiny-x8", "--bytes", "256K")
    hccl = [r for r in rows if r["Task Type"] == "HCCL"]
    check(len(hccl) == 8 and all(r["OP Type"] == "HcomAllGather" for r in hccl),
          f"all_gather: {[(r['OP Type'], r['chip']) for r in hccl]}")
    for r in hccl:
        c = int(r["chip"])
        crosses = c in (3, 7)  # its ring neighbour sits in the other server
        want_gbps = float(system["scale_out"]["nic"]["gbps"] if crosses
                          else system["server"]["link"]["gbps"])
        check(int(r["link_bytes"]) == (256 << 10) * 7 // 8 and
              float(r["link_bandwidth(GB/s)"]) == want_gbps,
              f"all_gather chip {c}: {r['link_bytes']} B over {r['link_bandwidth(GB/s)']} GB/s")
    check_trace("all_gather", trace, 8, [256 << 10], 7, 8)

    for f in failures:
        print("FAILED:", f)
    print(f"{passed} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


main()
