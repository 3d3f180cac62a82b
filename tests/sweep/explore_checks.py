"""End-to-end checks of `npusim explore` (tools/npusim_explore.py) on the tiny chip.

Usage: explore_checks.py NPUSIM_BINARY SOURCE_DIR. Prints 'N passed, N failed' and exits non-zero
on any failure. A 36-config space (cube cores with derived vector cores, L1, HBM bandwidth), one
MatMul, two objectives and two constraints, a few trials: same seed -> same trials; the Pareto
front and the constraint values against the trials' own figures; a grown study and a killed
driver resume from study.db; bad space files.
"""
import filecmp
import glob
import os
import subprocess
import sys
import tempfile
import time

from checks_util import check, finish, read_csv, write

NPUSIM, ROOT = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])

SPACE = """
chip: tiny
space:
  cores.aic.count: {int: [1, 4]}
  cores.aic.buffers.l1: {pow2: [128 KiB, 512 KiB]}
  memory.hbm.gbps: {choices: [900, 1800, 3600]}
derived:
  cores.aiv.count: 2 * cores.aic.count
objectives: [time_us, cost_usd]
constraints:
  - area_mm2 <= 22
  - hwm_l1_bytes <= 0.5 * cores.aic.buffers.l1
workloads:
  - op: MatMul
    inputs: [f16:128x256, f16:256x256]
search: {sampler: SAMPLER, trials: 8, seed: 5, population: 4}
"""
SIZES = {"128 KiB": 128 << 10, "256 KiB": 256 << 10, "512 KiB": 512 << 10}

# Sleeps 0.3 s per point, so that a driver can be killed while a batch runs.
SLOW = """#!/bin/sh
case "$1" in explore) exec "{npusim}" "$@" --npusim "$0" ;; op) sleep 0.3 ;; esac
exec "{npusim}" "$@"
"""




def explore(*args, npusim=NPUSIM, expect_rc=0):
    cmd = [npusim, "explore"] + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != expect_rc:
        raise AssertionError(f"{' '.join(cmd)}: exit {p.returncode}, wanted {expect_rc}\n"
                             f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p






with tempfile.TemporaryDirectory() as tmp:
    nsga = write(tmp, "nsga.yaml", SPACE.replace("SAMPLER", "nsga2"))
    tpe = write(tmp, "tpe.yaml", SPACE.replace("SAMPLER", "tpe"))

    @check("same seed, same trials (NSGA-II and TPE); another seed differs")
    def _():
        for space, name in ((nsga, "nsga"), (tpe, "tpe")):
            a, b = os.path.join(tmp, f"{name}_a"), os.path.join(tmp, f"{name}_b")
            p = explore(space, "--out", a, "--jobs", "2")
            assert "done: 8 trial(s) completed" in p.stdout, p.stdout
            explore(space, "--out", b, "--jobs", "1", "--no-plots")
            assert filecmp.cmp(os.path.join(a, "trials.csv"), os.path.join(b, "trials.csv"),
                               shallow=False), f"{name}: trials.csv differs between two runs"
            for f in ("trials.csv", "pareto.csv", "pareto.png", "study.db"):
                assert os.path.exists(os.path.join(a, f)), f
        c = os.path.join(tmp, "nsga_c")
        explore(nsga, "--out", c, "--seed", "6", "--no-plots")
        assert not filecmp.cmp(os.path.join(tmp, "nsga_a", "trials.csv"),
                               os.path.join(c, "trials.csv"), shallow=False)

    @check("trials.csv: derived keys, constraint values, feasibility and the Pareto front")
    def _():
        rows = read_csv(os.path.join(tmp, "nsga_a", "trials.csv"))
        assert len(rows) == 8 and all(r["state"] == "ok" for r in rows), rows
        feasible = []
        for r in rows:
            assert int(r["cores.aiv.count"]) == 2 * int(r["cores.aic.count"]), r
            c_area = float(r["constraint[area_mm2 <= 22]"])
            assert abs(c_area - (float(r["area_mm2"]) - 22)) < 1e-3, r
            c_l1 = float(r["constraint[hwm_l1_bytes <= 0.5 * cores.aic.buffers.l1]"])
            assert c_l1 == int(r["hwm_l1_bytes"]) - SIZES[r["cores.aic.buffers.l1"]] / 2, r
            ok = c_area <= 0 and c_l1 <= 0
            assert r["feasible"] == ("yes" if ok else "no"), r
            if ok:
                feasible.append(r)
        assert feasible and len(feasible) < len(rows), "want feasible and infeasible trials"

        def obj(r):
            return float(r["objective[time_us]"]), float(r["objective[cost_usd]"])

        for r in rows:
            dominated = any(all(x <= y for x, y in zip(obj(o), obj(r))) and obj(o) != obj(r)
                            for o in feasible)
            want = r in feasible and not dominated
            assert r["pareto"] == ("yes" if want else "no"), (r, want)
        front = read_csv(os.path.join(tmp, "nsga_a", "pareto.csv"))
        assert [r["trial"] for r in front] == [r["trial"] for r in rows if r["pareto"] == "yes"]

    @check("a grown study continues from study.db")
    def _():
        out = os.path.join(tmp, "grow")
        explore(nsga, "--out", out, "--trials", "4", "--no-plots")
        p = explore(nsga, "--out", out, "--trials", "8", "--no-plots")
        assert "(4 done, 0 unfinished)" in p.stdout, p.stdout
        rows = read_csv(os.path.join(out, "trials.csv"))
        assert [r["trial"] for r in rows] == [str(i) for i in range(8)], rows
        # NSGA-II's first generation (population 4) does not depend on where the run stopped.
        first = read_csv(os.path.join(tmp, "nsga_a", "trials.csv"))[:4]
        cols = ["cores.aic.count", "cores.aic.buffers.l1", "memory.hbm.gbps"]
        assert [[r[c] for c in cols] for r in rows[:4]] == [[r[c] for c in cols] for r in first]

    @check("a killed driver: its unfinished trials run on the next start")
    def _():
        slow = write(tmp, "slow_npusim", SLOW.format(npusim=NPUSIM), 0o755)
        out = os.path.join(tmp, "killed")
        p = subprocess.Popen([slow, "explore", nsga, "--out", out, "--jobs", "1", "--no-plots"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.monotonic()
        while not glob.glob(os.path.join(out, "points", "*.json")):
            assert p.poll() is None and time.monotonic() - t0 < 120, "no point before the end"
            time.sleep(0.05)
        p.kill()
        p.wait()
        r = explore(nsga, "--out", out, "--no-plots", npusim=slow)
        assert "(0 done, 4 unfinished)" in r.stdout, r.stdout
        rows = read_csv(os.path.join(out, "trials.csv"))
        assert len(rows) == 8 and all(x["state"] == "ok" for x in rows), rows
        first = read_csv(os.path.join(tmp, "nsga_a", "trials.csv"))[:4]
        cols = ["cores.aic.count", "cores.aic.buffers.l1", "memory.hbm.gbps"]
        assert [[x[c] for c in cols] for x in rows[:4]] == [[x[c] for c in cols] for x in first]

    @check("bad space files: a clear error naming the file and the key")
    def _():
        base = SPACE.replace("SAMPLER", "nsga2")
        cases = {
            "objective.yaml": (base.replace("[time_us, cost_usd]", "[time_us, speed]"),
                               "objectives[1]: 'speed' is not one of"),
            "pow2.yaml": (base.replace("[128 KiB, 512 KiB]", "[100 KiB, 512 KiB]"),
                          "space.cores.aic.buffers.l1.pow2"),
            "range.yaml": (base.replace("{int: [1, 4]}", "{int: [4, 1]}"),
                           "space.cores.aic.count.int: bad range"),
            "constraint.yaml": (base.replace("area_mm2 <= 22", "aera_mm2 <= 22"),
                                "constraints[0]: 'aera_mm2 <= 22': 'aera_mm2' is not"),
            "sampler.yaml": (base.replace("sampler: nsga2", "sampler: grid"),
                             "search.sampler: 'grid'"),
        }
        for name, (text, what) in cases.items():
            p = explore(write(tmp, name, text), "--out", os.path.join(tmp, "never"), expect_rc=1)
            assert name in p.stderr and what in p.stderr, f"{name}: {p.stderr}"
        assert not os.path.exists(os.path.join(tmp, "never"))

finish()
