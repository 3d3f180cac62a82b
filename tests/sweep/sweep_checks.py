"""End-to-end checks of `npusim sweep` (tools/npusim_sweep.py) on the tiny chip.

Usage: sweep_checks.py NPUSIM_BINARY SOURCE_DIR. Prints 'N passed, N failed' and exits non-zero
on any failure. Runs one 2x2 sweep (2 workloads, 8 points) through the C++ subcommand, then
checks resume, determinism, a bad point and bad grid files.
"""
import filecmp
import json
import os
import subprocess
import sys
import tempfile

from checks_util import TINY_WORKLOADS, check, finish, read_csv, write

NPUSIM, ROOT = os.path.abspath(sys.argv[1]), sys.argv[2]

# 2x2 on tiny: HBM bandwidth x L1 size; a compiled MatMul and the hand-written vector add.
# vadd_f16.s with n = 4096 on the 4 vector cores: 1024 elements (2048 bytes) per block, one tile,
# so only the ping buffers are used: x at 0, y at 2*16384, z at 4*16384 = 65536 (UB_X, UB_Y, UB_Z
# with TILE_BYTES = 16384 in the kernel); the highest UB byte touched is 65536 + 2048 = 67584.
GRID_2X2 = """
chip: tiny
description: sweep test grid
grid:
  memory.hbm.gbps: [900, 1800]
  cores.aic.buffers.l1: [256 KiB, 512 KiB]
workloads:
""" + TINY_WORKLOADS
VADD_UB_HIGH_WATER = 67584

# One good config, one the loader rejects (the UB must be a whole number of 48 x 32 B bank rows,
# so 1 KiB is rejected) and one it accepts but no tile fits (a UB of one 1536-byte bank row holds
# fewer than the 128 fp16 elements of one vector repeat per operand), and a workload that fails
# to run (an op the compiler does not know).
GRID_BAD_POINT = """
chip: tiny
grid:
  cores.aiv.buffers.ub: [192 KiB, 1 KiB, 1536]
workloads:
  - op: AddV2
    inputs: [f16:64x128, f16:64x128]
  - op: NoSuchOp
    inputs: [f16:16]
"""

EXPECTED_COLUMNS = ["memory.hbm.gbps", "cores.aic.buffers.l1", "workload", "kind", "status",
                    "reason", "sim_time_us", "throughput", "cube_util_pct", "vector_util_pct",
                    "hbm_bytes", "gm_bytes", "hwm_l1_bytes", "hwm_l0a_bytes", "hwm_ub_bytes",
                    "area_mm2"]


def sweep(*args, via_npusim=True, expect_rc=0):
    cmd = ([NPUSIM, "sweep"] if via_npusim else
           [sys.executable, os.path.join(ROOT, "tools", "npusim_sweep.py"), "--npusim", NPUSIM])
    p = subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=900)
    if p.returncode != expect_rc:
        raise AssertionError(f"{' '.join(cmd + list(args))}: exit {p.returncode}, wanted "
                             f"{expect_rc}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p








with tempfile.TemporaryDirectory() as tmp:
    grid = write(tmp, "grid2x2.yaml", GRID_2X2)
    out1 = os.path.join(tmp, "out1")
    first = {}

    @check("a 2x2 sweep on tiny completes: 4 configs x 2 workloads rows, expected columns")
    def _():
        p = sweep(grid, "--out", out1, "--jobs", "2")
        first["stdout"] = p.stdout
        rows = read_csv(os.path.join(out1, "sweep.csv"))
        assert len(rows) == 8, f"{len(rows)} rows, wanted 8"
        missing = [c for c in EXPECTED_COLUMNS if c not in rows[0]]
        assert not missing, f"columns missing: {missing}"
        bad = [r for r in rows if r["status"] != "ok"]
        assert not bad, f"points failed: {[(r['workload'], r['reason']) for r in bad]}"
        for r in rows:
            assert float(r["sim_time_us"]) > 0 and float(r["area_mm2"]) > 0
        # Rows sorted: workloads in file order, then the configs in product order.
        assert [(r["workload"], r["memory.hbm.gbps"], r["cores.aic.buffers.l1"]) for r in rows] == [
            (w, g, l) for w in ("MatMul f16:128x256 f16:256x256", "vadd 4096")
            for g in ("900", "1800") for l in ("256 KiB", "512 KiB")]
        for r in rows:
            if r["workload"] == "vadd 4096":
                assert int(r["hwm_ub_bytes"]) == VADD_UB_HIGH_WATER, r["hwm_ub_bytes"]
                assert float(r["vector_util_pct"]) > 0
            else:
                assert float(r["cube_util_pct"]) > 0 and int(r["hwm_l1_bytes"]) > 0
                assert int(r["hwm_l1_bytes"]) <= 256 * 1024 or r["cores.aic.buffers.l1"] != "256 KiB"
        # Area grows with L1 (same HBM bandwidth, which the proxy does not count).
        area = {(r["memory.hbm.gbps"], r["cores.aic.buffers.l1"]): float(r["area_mm2"]) for r in rows}
        assert area[("900", "512 KiB")] > area[("900", "256 KiB")] == area[("1800", "256 KiB")]
        assert os.path.exists(os.path.join(out1, "pareto.csv"))
        assert os.path.exists(os.path.join(out1, "pareto.png"))
        plots = os.listdir(os.path.join(out1, "plots"))
        assert "sim_time_us_vs_cores.aic.buffers.l1.png" in plots, plots
        assert len(os.listdir(os.path.join(out1, "points"))) == 8

    @check("a rerun resumes: no point runs again and the CSV is unchanged")
    def _():
        points = os.path.join(out1, "points")
        before = {f: os.stat(os.path.join(points, f)).st_mtime_ns for f in os.listdir(points)}
        saved = os.path.join(tmp, "sweep1.csv")
        os.replace(os.path.join(out1, "sweep.csv"), saved)
        p = sweep(grid, "--out", out1, "--jobs", "2", "--no-plots")
        assert "8 stored, 0 to run" in p.stdout, p.stdout
        after = {f: os.stat(os.path.join(points, f)).st_mtime_ns for f in os.listdir(points)}
        assert before == after, "point files were rewritten"
        assert filecmp.cmp(saved, os.path.join(out1, "sweep.csv"), shallow=False)

    @check("deterministic: a fresh run (--no-resume, other folder, run directly) gives the same CSV")
    def _():
        out2 = os.path.join(tmp, "out2")
        p = sweep(grid, "--out", out2, "--jobs", "2", "--no-resume", "--no-plots",
                  via_npusim=False)
        assert "0 stored, 8 to run" in p.stdout, p.stdout
        assert filecmp.cmp(os.path.join(out1, "sweep.csv"), os.path.join(out2, "sweep.csv"),
                           shallow=False), "sweep.csv differs between two runs"
        assert filecmp.cmp(os.path.join(out1, "pareto.csv"), os.path.join(out2, "pareto.csv"),
                           shallow=False)

    @check("--dry-run lists the points and runs nothing")
    def _():
        out3 = os.path.join(tmp, "out3")
        p = sweep(grid, "--out", out3, "--dry-run")
        assert p.stdout.count("to run") >= 8 and not os.path.exists(out3), p.stdout

    @check("an impossible config and a failing workload are reported in their rows, not fatal")
    def _():
        g = write(tmp, "bad_point.yaml", GRID_BAD_POINT)
        out = os.path.join(tmp, "bad")
        sweep(g, "--out", out, "--jobs", "2", "--no-plots")
        rows = {(r["cores.aiv.buffers.ub"], r["workload"]): r
                for r in read_csv(os.path.join(out, "sweep.csv"))}
        assert len(rows) == 6
        good = rows[("192 KiB", "AddV2 f16:64x128 f16:64x128")]
        assert good["status"] == "ok" and float(good["sim_time_us"]) > 0, good
        for wl in ("AddV2 f16:64x128 f16:64x128", "NoSuchOp f16:16"):
            r = rows[("1 KiB", wl)]
            assert r["status"] == "error" and "cores.aiv.buffers.ub" in r["reason"], r
        r = rows[("1536", "AddV2 f16:64x128 f16:64x128")]
        assert r["status"] == "error" and "1536 bytes of UB" in r["reason"], r
        r = rows[("192 KiB", "NoSuchOp f16:16")]
        assert r["status"] == "error" and "NoSuchOp" in r["reason"], r
        # A key the config does not have: every point of the grid is an error row naming it.
        g = write(tmp, "typo_key.yaml", "chip: tiny\ngrid: {memory.hbm.gbbps: [900]}\n"
                  "workloads: [{op: AddV2, inputs: [f16:16, f16:16]}]\n")
        sweep(g, "--out", os.path.join(tmp, "typo_key"), "--no-plots")
        (r,) = read_csv(os.path.join(tmp, "typo_key", "sweep.csv"))
        assert r["status"] == "error" and "memory.hbm.gbbps" in r["reason"] and \
            "does not exist" in r["reason"], r

    @check("bad grid files: a clear error naming the file and the key")
    def _():
        cases = {
            "typo.yaml": (GRID_2X2 + "wrkloads: []\n", "wrkloads"),
            "empty.yaml": ("chip: tiny\ngrid: {}\nworkloads: [{op: AddV2, inputs: [f16:16, f16:16]}]\n",
                           "empty grid"),
            "yamlerr.yaml": ("chip: tiny\ngrid:\n  a: [1, 2\nworkloads: []\n", "YAML error"),
            "wlkey.yaml": ("chip: tiny\ngrid: {clock_mhz: [1000]}\n"
                           "workloads: [{op: AddV2, input: [f16:16]}]\n", "workloads[0].input"),
            "wltiming.yaml": ("chip: tiny\ngrid: {clock_mhz: [1000]}\n"
                              "workloads: [{op: AddV2, inputs: [f16:16, f16:16], timing_only: 1}]\n",
                              "workloads[0].timing_only: expected true or false"),
            "derived_ref.yaml": ("chip: tiny\ngrid: {cores.aic.count: [1, 2]}\n"
                                 "derived: {cores.aiv.count: 2 * cores.aic.cnt}\n"
                                 "workloads: [{op: AddV2, inputs: [f16:16, f16:16]}]\n",
                                 "derived.cores.aiv.count: '2 * cores.aic.cnt': 'cores.aic.cnt' is not"),
            "derived_eval.yaml": ("chip: tiny\ngrid: {cores.aic.count: [0, 2]}\n"
                                  "derived: {cores.aiv.count: 4 // cores.aic.count}\n"
                                  "workloads: [{op: AddV2, inputs: [f16:16, f16:16]}]\n",
                                  "derived.cores.aiv.count: '4 // cores.aic.count': integer "
                                  "division or modulo by zero (at cores.aic.count=0)"),
            "derived_code.yaml": ("chip: tiny\ngrid: {cores.aic.count: [1]}\n"
                                  "derived: {cores.aiv.count: \"(1).__class__\"}\n"
                                  "workloads: [{op: AddV2, inputs: [f16:16, f16:16]}]\n",
                                  "is not allowed"),
        }
        for name, (text, what) in cases.items():
            g = write(tmp, name, text)
            p = sweep(g, "--out", os.path.join(tmp, "never"), expect_rc=1)
            assert name in p.stderr and what in p.stderr, f"{name}: {p.stderr}"
        assert not os.path.exists(os.path.join(tmp, "never"))

    @check("cost and power: more HBM bandwidth costs more; MACs counted; derived keys")
    def _():
        # tiny has 1 GiB of HBM: one 16 GiB stack. 900 GB/s needs the 1228.8 GB/s HBM3E stack
        # (HBM3's 819.2 is short), 1800 and 3600 two and three HBM3E stacks.
        g = write(tmp, "hbm.yaml", "chip: tiny\ngrid: {memory.hbm.gbps: [900, 1800, 3600]}\n"
                  "zip: [{cores.aic.count: [1, 2]}]\nderived: {cores.aiv.count: 2 * cores.aic.count}\n"
                  "workloads: [{op: MatMul, inputs: [f16:128x256, f16:256x256]}]\n")
        out = os.path.join(tmp, "hbm")
        sweep(g, "--out", out, "--jobs", "2", "--no-plots")
        rows = read_csv(os.path.join(out, "sweep.csv"))
        assert [(r["memory.hbm.gbps"], r["cores.aic.count"], r["cores.aiv.count"]) for r in rows] \
            == [(b, c, str(2 * int(c))) for b in ("900", "1800", "3600") for c in ("1", "2")], rows
        for r, (gen, stacks) in zip(rows[::2], [("HBM3E", "1"), ("HBM3E", "2"), ("HBM3E", "3")]):
            assert (r["hbm_gen"], r["hbm_stacks"]) == (gen, stacks), r
        costs = [float(r["cost_usd"]) for r in rows if r["cores.aic.count"] == "2"]
        assert costs[0] < costs[1] < costs[2], costs
        for r in rows:
            assert float(r["power_w"]) > 0 and float(r["energy_uj"]) > 0, r
        with open(os.path.join(out, "points", os.listdir(os.path.join(out, "points"))[0])) as f:
            activity = json.load(f)["metrics"]["activity"]
        assert activity["macs"] == 128 * 256 * 256, activity
        front = {(r["memory.hbm.gbps"], r["cores.aic.count"]): r
                 for r in read_csv(os.path.join(out, "pareto.csv"))}
        # Same chip, more bandwidth: on the cost front only if it is faster.
        for c in ("1", "2"):
            for lo, hi in (("900", "1800"), ("1800", "3600")):
                a, b = front[(lo, c)], front[(hi, c)]
                if float(b["total_sim_time_us"]) >= float(a["total_sim_time_us"]):
                    assert b["pareto_cost"] == "no", (a, b)

    @check("model workloads: the models.run contract (command line, JSON figures, errors)")
    def _():
        # A stand-in models/run.py in a scratch root records its command line and answers with
        # the contract's JSON; the runner is pointed at that root.
        sys.path.insert(0, os.path.join(ROOT, "tools"))
        from sweep import runner
        from sweep.grid import load_grid
        fake = os.path.join(tmp, "fakeroot")
        os.makedirs(os.path.join(fake, "models"))
        write(fake, "models/__init__.py", "")
        write(fake, "models/run.py", """import json, sys
args = sys.argv[1:]
out = args[args.index("--json") + 1]
if "--set" in args and "fail=1" in args:
    json.dump({"ok": False, "error": "ValueError: no such thing"}, open(out, "w"))
    sys.exit(1)
r = {"ok": True, "simulated_us_per_step": 250.0, "samples_per_s": 8000.0,
     "kernels_per_step": 42, "cube_utilization_pct": 12.5, "hbm_bytes_per_step": 1000,
     "wall_s_per_step": 3.0, "argv": args}
if "--timing-only" not in args:  # as models.run: the loss is undefined in timing-only runs
    r["loss"] = 2.5
json.dump(r, open(out, "w"))
""")
        # The grid's timing_only (default true) applies to model workloads too; a workload's
        # own key overrides it.
        g = write(tmp, "model.yaml", "chip: tiny\ngrid: {clock_mhz: [1000]}\n"
                  "workloads: [{model: resnet50, mode: train, batch: 4, steps: 2, input_size: 32},\n"
                  "            {model: mlp, name: mlp_loss, mode: train, batch: 4, steps: 1,\n"
                  "             timing_only: false}]\n")
        grid = load_grid(g)
        ctx = runner.Context(grid, NPUSIM, os.path.join(tmp, "model_out"))
        saved_root = runner.ROOT
        runner.ROOT = fake
        try:
            conf = runner.resolve_config(NPUSIM, "tiny", [("clock_mhz", "1000")])
            rec = runner.run_point(ctx, conf, grid.workloads[0], "k")
            bad = runner.ResolvedConfig([("fail", "1")], True, "", conf.cfg)
            rec_bad = runner.run_point(ctx, bad, grid.workloads[0], "k2")
            rec_func = runner.run_point(ctx, conf, grid.workloads[1], "k3")
        finally:
            runner.ROOT = saved_root
        assert rec["status"] == "ok", rec
        cmd = rec["command"]
        assert cmd[1:3] == ["-m", "models.run"], cmd
        for flag, v in (("--model", "resnet50"), ("--mode", "train"), ("--batch", "4"),
                        ("--steps", "2"), ("--input-size", "32"), ("--chip", "tiny"),
                        ("--set", "clock_mhz=1000")):
            assert cmd[cmd.index(flag) + 1] == v, (flag, cmd)
        assert "--quiet" in cmd and "--json" in cmd and "--timing-only" in cmd
        m = rec["metrics"]
        assert (m["sim_time_us"], m["throughput"], m["kernels"], m["hbm_bytes"]) == (
            250.0, 8000.0, 42, 1000), m
        assert "loss" not in m, m
        assert rec_func["status"] == "ok" and "--timing-only" not in rec_func["command"], rec_func
        assert rec_func["metrics"]["loss"] == 2.5, rec_func
        # The mode is part of a point's identity: the same workload functional is another point.
        w_func = dict(grid.workloads[0], timing_only=False)
        assert runner.point_key(ctx, conf, w_func) != runner.point_key(ctx, conf, grid.workloads[0])
        # 12.5 % of tiny's cube peak at 1000 MHz: 2 x 16^3 MACs x 2 cores x 1e9 / 1e12 TFLOPS.
        assert abs(m["achieved_tflops"] - 0.125 * 2 * 4096 * 2 * 1e9 / 1e12) < 1e-9, m
        assert rec_bad["status"] == "error" and "no such thing" in rec_bad["reason"], rec_bad

finish()
