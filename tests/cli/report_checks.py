"""Checks of the report folder that `npusim run/demo --report-dir` writes (docs/reports.md).

Invariants, each from numbers the report does not derive from each other:
  - every file parses; op_summary.csv has msprof's columns, each cell of its type (or N/A);
  - every *_ratio and the L2 hit rate lie in [0, 1];
  - the task durations add up to the simulated time minus the waits, and to the chip's own
    chip.total_cycles counter; a lone kernel's wait is the host-to-device copy time before it;
  - cube_utilization(%) = cube MACs / (chip peak MACs per cycle x task cycles), the peak from
    chip.yaml; the ratios equal busy / active cycles from counters.json;
  - instructions.csv: per op, the Total Cycles of each pipe's rows equal the busy_cycles counters
    of that pipe summed over the cores that ran (the scalar unit adds one issue slot per pipe
    instruction);
  - roofline.png and op_time.png are non-empty PNGs (when matplotlib is installed).

Usage: report_checks.py NPUSIM_BINARY SOURCE_DIR. Prints 'N passed, N failed'.
"""
import csv
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import yaml

NPUSIM, ROOT = sys.argv[1], sys.argv[2]
KERNELS = os.path.join(ROOT, "kernels")
results = []

INT = "int"
FLOAT = "float"
TEXT = "text"
OPT_FLOAT = "float or N/A"
OPT_INT = "int or N/A"
MSPROF_COLUMNS = {
    "Task ID": INT, "Stream ID": INT, "Op Name": TEXT, "OP Type": TEXT, "Task Type": TEXT,
    "Task Start Time(us)": FLOAT, "Task Duration(us)": FLOAT, "Task Wait Time(us)": FLOAT,
    "Block Dim": INT, "Mix Block Dim": INT, "Input Shapes": TEXT, "Input Data Types": TEXT,
    "Input Formats": TEXT, "Output Shapes": TEXT, "Output Data Types": TEXT,
    "Output Formats": TEXT, "aic_time(us)": OPT_FLOAT, "aic_total_cycles": OPT_INT,
    "aic_mac_ratio": OPT_FLOAT, "aic_scalar_ratio": OPT_FLOAT, "aic_mte1_ratio": OPT_FLOAT,
    "aic_mte2_ratio": OPT_FLOAT, "aic_fixpipe_ratio": OPT_FLOAT, "aiv_time(us)": OPT_FLOAT,
    "aiv_total_cycles": OPT_INT, "aiv_vec_ratio": OPT_FLOAT, "aiv_scalar_ratio": OPT_FLOAT,
    "aiv_mte2_ratio": OPT_FLOAT, "aiv_mte3_ratio": OPT_FLOAT, "cube_utilization(%)": FLOAT,
    "memory_bound": OPT_FLOAT,
}
NPUSIM_COLUMNS = {
    "task_start_cycles": INT, "task_duration_cycles": INT, "task_wait_cycles": INT,
    "task_overhead(us)": FLOAT, "task_overhead_cycles": INT, "host_dispatch_cycles": INT,
    "cube_macs": INT, "vector_repeats": INT, "roofline_bound(us)": FLOAT,
    "duration/bound": OPT_FLOAT, "gm_read_bytes": INT, "gm_write_bytes": INT,
    "hbm_read_bytes": INT, "hbm_write_bytes": INT, "l2_hit_rate": OPT_FLOAT,
}
LANE_PIPE = {"SCALAR": "s", "MTE1": "mte1", "MTE2": "mte2", "MTE3": "mte3", "CUBE": "m",
             "VECTOR": "v", "FIXP": "fix"}
HAVE_MATPLOTLIB = subprocess.run([sys.executable, "-c", "import matplotlib"],
                                 capture_output=True).returncode == 0


def run(*args, expect_rc=0, env=None):
    p = subprocess.run([NPUSIM, *args], capture_output=True, text=True, timeout=600,
                       env={**os.environ, **(env or {})})
    if p.returncode != expect_rc:
        raise AssertionError(f"npusim {' '.join(args)}: exit {p.returncode}, wanted {expect_rc}\n"
                             f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def check(name):
    def wrap(fn):
        try:
            with tempfile.TemporaryDirectory() as d:
                fn(d)
            results.append((name, None))
            print(f"PASS {name}")
        except Exception as e:  # noqa: BLE001 - report every failure and go on
            results.append((name, e))
            print(f"FAIL {name}: {e}")
        return fn
    return wrap


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def typed(value, kind, where):
    if kind == TEXT:
        return value
    if kind in (OPT_FLOAT, OPT_INT) and value == "N/A":
        return None
    try:
        return int(value) if kind in (INT, OPT_INT) else float(value)
    except ValueError:
        raise AssertionError(f"{where}: '{value}' is not {kind}") from None


def load_report(d):
    """Parses every file; returns (op_summary rows typed, statistic rows, instruction rows,
    counters.json, chip.yaml). Checks the columns and their types."""
    for f in ("op_summary.csv", "op_statistic.csv", "instructions.csv", "counters.json",
              "chip.yaml", "summary.txt"):
        assert os.path.getsize(os.path.join(d, f)) > 0, f"{f} is empty"
    raw = read_csv(f"{d}/op_summary.csv")
    with open(f"{d}/op_summary.csv", newline="") as f:
        header = next(csv.reader(f))
    want = list(MSPROF_COLUMNS) + list(NPUSIM_COLUMNS)
    assert header[:len(want)] == want, f"op_summary columns {header}"
    stalls = header[len(want):]
    assert all(c.startswith("stall_") and c.endswith("(cycles)") for c in stalls), stalls
    ops = []
    for i, r in enumerate(raw):
        row = {}
        for col, kind in {**MSPROF_COLUMNS, **NPUSIM_COLUMNS}.items():
            row[col] = typed(r[col], kind, f"op_summary row {i} {col}")
        for col in stalls:
            row[col] = typed(r[col], INT, f"op_summary row {i} {col}")
        ops.append(row)
    stats = read_csv(f"{d}/op_statistic.csv")
    insns = read_csv(f"{d}/instructions.csv")
    with open(f"{d}/counters.json") as f:
        counters = json.load(f)
    with open(f"{d}/chip.yaml") as f:
        chip = yaml.safe_load(f)
    with open(f"{d}/summary.txt") as f:
        summary = f.read()
    for op in ops:
        assert op["Op Name"] in summary, f"{op['Op Name']} missing from summary.txt"
    return ops, stats, insns, counters, chip


def cores_that_ran(tree):
    return {name: node for name, node in tree["chip"].items()
            if isinstance(node, dict) and "active_cycles" in node
            and node["blocks"]["value"] > 0}


def value(node, dotted):
    for part in dotted.split("."):
        if part not in node:
            return 0
        node = node[part]
    return node["value"]


def check_ratios(ops, counters):
    """Ratios in [0, 1] and equal to busy (MTE2, MTE3, FIXPIPE: in-flight) / active cycles of the
    cores that ran."""
    sides = {"aic": (("aicore", "aic"), {"mac": "m", "scalar": "s", "mte1": "mte1",
                                         "mte2": "mte2", "fixpipe": "fix"}),
             "aiv": (("aicore", "aiv"), {"vec": "v", "scalar": "s", "mte2": "mte2",
                                         "mte3": "mte3"})}
    for op, rec in zip(ops, counters["ops"]):
        for col, v in op.items():
            if (col.endswith("_ratio") or col == "l2_hit_rate") and v is not None:
                assert 0 <= v <= 1, f"{op['Op Name']} {col} = {v}"
        cores = cores_that_ran(rec["counters"])
        for side, (kinds, units) in sides.items():
            mine = [c for n, c in cores.items()
                    if n.rstrip("0123456789") in kinds]
            if not mine:
                assert op[f"{side}_total_cycles"] is None, f"{side} columns should be N/A"
                continue
            total = sum(value(c, "active_cycles") for c in mine)
            assert op[f"{side}_total_cycles"] == total
            for name, pipe in units.items():
                # msprof's GM-moving pipes count an instruction until its data has landed
                counter = "inflight_cycles" if name in ("mte2", "mte3", "fixpipe") else "busy_cycles"
                busy = sum(value(c, f"{pipe}.{counter}") for c in mine)
                got = op[f"{side}_{name}_ratio"]
                assert abs(got - busy / total) <= 6e-5, \
                    f"{side}_{name}_ratio {got} vs {busy}/{total}"


def check_timeline(ops, counters, clock_mhz):
    """Durations = simulated time (last op's end) - waits; = the chip's total_cycles counter."""
    durations = sum(op["task_duration_cycles"] for op in ops)
    waits = sum(op["task_wait_cycles"] for op in ops)
    last_end = ops[-1]["task_start_cycles"] + ops[-1]["task_duration_cycles"]
    assert durations == last_end - waits, (durations, last_end, waits)
    total = counters["session"]["chip"]["total_cycles"]["value"]
    assert abs(durations - total) <= len(ops), (durations, total)
    for op, rec in zip(ops, counters["ops"]):
        # The task overheads are the chip's counter, and part of the duration.
        if "counters" not in rec:
            continue
        want = rec["counters"]["chip"].get("task_overhead_cycles", {"value": 0})["value"]
        assert op["task_overhead_cycles"] == want, (op["task_overhead_cycles"], want)
        assert abs(op["task_overhead(us)"] - want / clock_mhz) <= 6e-4
        assert op["task_overhead_cycles"] <= op["task_duration_cycles"]
    for op in ops:
        us = op["task_duration_cycles"] / clock_mhz
        assert abs(op["Task Duration(us)"] - us) <= 6e-4, (op["Task Duration(us)"], us)
        assert abs(op["Task Wait Time(us)"] - op["task_wait_cycles"] / clock_mhz) <= 6e-4
    ends = [0] + [op["task_start_cycles"] + op["task_duration_cycles"] for op in ops[:-1]]
    for op, prev_end in zip(ops, ends):
        assert op["task_start_cycles"] == prev_end + op["task_wait_cycles"]


def check_cube_utilization(ops, counters, chip):
    cube = chip["cube"]
    cube_cores = sum(k["count"] for k in chip["cores"].values() if "m" in k["pipes"])
    peak = cube["m"] * cube["k"] * cube["n"] * cube_cores
    for op, rec in zip(ops, counters["ops"]):
        macs = sum(value(c, "m.macs") for c in cores_that_ran(rec["counters"]).values())
        assert op["cube_macs"] == macs
        want = 100.0 * macs / (peak * op["task_duration_cycles"])
        assert abs(op["cube_utilization(%)"] - want) <= 6e-5, (op["cube_utilization(%)"], want)


def check_instructions(ops, insns, counters, chip):
    s = chip["scalar"]["cycles_per_insn"]
    for op, rec in zip(ops, counters["ops"]):
        rows = [r for r in insns if int(r["Task ID"]) == op["Task ID"]]
        assert rows, f"no instructions for op {op['Op Name']}"
        cores = cores_that_ran(rec["counters"])
        by_pipe, pipe_calls = {}, 0
        for r in rows:
            pipe = LANE_PIPE[r["Pipe"]]
            by_pipe[pipe] = by_pipe.get(pipe, 0.0) + float(r["Total Cycles"])
            calls = int(r["Call Count"])
            assert calls > 0
            assert abs(float(r["Avg Cycles"]) - float(r["Total Cycles"]) / calls) <= 6e-4
            if pipe != "s":
                pipe_calls += calls
        by_pipe["s"] = by_pipe.get("s", 0.0) + s * pipe_calls
        # counters round picoseconds to cycles per core: at most half a cycle each
        for pipe in LANE_PIPE.values():
            busy = sum(value(c, f"{pipe}.busy_cycles") for c in cores.values())
            got = by_pipe.get(pipe, 0.0)
            assert abs(got - busy) <= 0.5 * len(cores) + 1e-6, \
                f"{op['Op Name']} pipe {pipe}: instructions {got} vs busy counters {busy}"


def check_statistic(ops, stats):
    total = sum(op["Task Duration(us)"] for op in ops)
    by_type = {}
    for op in ops:
        by_type.setdefault((op["OP Type"], op["Task Type"]), []).append(op["Task Duration(us)"])
    assert len(stats) == len(by_type)
    for r in stats:
        times = by_type[(r["OP Type"], r["Core Type"])]
        assert int(r["Count"]) == len(times)
        assert abs(float(r["Total Time(us)"]) - sum(times)) <= 1e-3 * len(times)
        assert abs(float(r["Min Time(us)"]) - min(times)) <= 1e-3
        assert abs(float(r["Max Time(us)"]) - max(times)) <= 1e-3
        assert abs(float(r["Ratio(%)"]) - 100 * sum(times) / total) <= 1e-2


def check_plots(d):
    if not HAVE_MATPLOTLIB:
        print("  (matplotlib missing: plots not checked)")
        return
    for f in ("roofline.png", "op_time.png"):
        path = os.path.join(d, f)
        assert os.path.exists(path), f"{f} was not made"
        with open(path, "rb") as fh:
            data = fh.read()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000, f"{f} is not a PNG"


def check_all(d):
    ops, stats, insns, counters, chip = load_report(d)
    check_ratios(ops, counters)
    check_timeline(ops, counters, float(chip["clock_mhz"]))
    check_cube_utilization(ops, counters, chip)
    check_instructions(ops, insns, counters, chip)
    check_statistic(ops, stats)
    check_plots(d)
    return ops, counters


def vadd_run(d, chip, n, *extra, env=None):
    rng = np.random.default_rng(7)
    np.save(f"{d}/x.npy", rng.uniform(-1, 1, n).astype(np.float16))
    np.save(f"{d}/y.npy", rng.uniform(-1, 1, n).astype(np.float16))
    return run("run", f"{KERNELS}/vadd_f16.s", "--chip", chip, "--in", f"x={d}/x.npy",
               "--in", f"y={d}/y.npy", "--out", f"z={d}/z.npy", "--arg", f"n={n}", "--quiet",
               *extra, env=env)


@check("demo --report-dir: both kernels as two ops; every invariant holds")
def _(d):
    p = run("demo", "--chip", "tiny", "--timing-only", "--trace", f"{d}/t.json",
            "--report-dir", f"{d}/rep")
    assert f"{d}/rep" in p.stdout, p.stdout
    ops, _ = check_all(f"{d}/rep")
    assert [op["Op Name"] for op in ops] == ["gemm_f16", "vadd_f16"]
    assert [op["Task Type"] for op in ops] == ["AI_CORE", "AI_VECTOR_CORE"]
    assert ops[0]["Input Shapes"].count(";") == 1 and ops[0]["Output Data Types"] == "DT_FLOAT16"
    assert ops[0]["aiv_total_cycles"] is None and ops[1]["aic_total_cycles"] is None
    assert ops[0]["cube_utilization(%)"] > 0 and ops[1]["cube_utilization(%)"] == 0
    for op in ops:  # the roofline is a lower bound of the time
        assert op["duration/bound"] >= 1, op
    with open(f"{d}/rep/trace.json") as f:
        assert len(json.load(f)["traceEvents"]) > 0


@check("run --report-dir: vadd's op row; its wait is the host-to-device copy time")
def _(d):
    n = 4 * 8192 + 32
    vadd_run(d, "tiny", n, "--report-dir", f"{d}/rep")
    ops, counters = check_all(f"{d}/rep")
    assert len(ops) == 1
    op = ops[0]
    assert (op["Op Name"], op["OP Type"], op["Task Type"]) == ("vadd_f16", "vadd_f16",
                                                               "AI_VECTOR_CORE")
    assert op["Input Shapes"] == f"{n};{n}" and op["Output Shapes"] == str(n)
    assert op["Input Data Types"] == "DT_FLOAT16;DT_FLOAT16" and op["Input Formats"] == "ND;ND"
    assert op["Block Dim"] == 4 and op["Mix Block Dim"] == 0
    # The only thing before the kernel was uploading x and y over the HDC link.
    h2d = counters["session"]["chip"]["hdc"]["h2d_busy_cycles"]["value"]
    assert abs(op["task_wait_cycles"] - h2d) <= 1, (op["task_wait_cycles"], h2d)
    # One block per vector core: dispatch + one block start + completion (docs/chip_model.md).
    chip = yaml.safe_load(open(f"{d}/rep/chip.yaml"))
    task, clock = chip["task"], float(chip["clock_mhz"])
    want = (round(task["dispatch_us"] * clock) + task["block_start_cycles"]
            + round(task["done_us"] * clock))
    assert op["task_overhead_cycles"] == want, (op["task_overhead_cycles"], want)
    # GM traffic: x and y read, z written, each n fp16 elements.
    assert op["gm_read_bytes"] == 2 * 2 * n and op["gm_write_bytes"] == 2 * n
    assert not os.path.exists(f"{d}/rep/trace.json")  # the run did not trace


@check("run --report-dir: gemm's cube utilisation and instructions on the 910B-like chip")
def _(d):
    M, N, K = 256, 512, 256
    rng = np.random.default_rng(8)
    np.save(f"{d}/a.npy", rng.uniform(-1, 1, (M, K)).astype(np.float16))
    np.save(f"{d}/b.npy", rng.uniform(-1, 1, (K, N)).astype(np.float16))
    run("run", f"{KERNELS}/gemm_f16.s", "--chip", "910b", "--in", f"a={d}/a.npy",
        "--in", f"b={d}/b.npy", "--out", f"c={d}/c.npy", "--arg", f"M={M}", "--arg", f"N={N}",
        "--arg", f"K={K}", "--timing-only", "--quiet", "--report-dir", f"{d}/rep")
    ops, _ = check_all(f"{d}/rep")
    op = ops[0]
    assert op["cube_macs"] == M * N * K  # fp16 MACs of the product
    assert op["Input Shapes"] == f"{M},{K};{K},{N}" and op["Output Shapes"] == f"{M},{N}"
    insns = read_csv(f"{d}/rep/instructions.csv")
    mmad = [r for r in insns if r["Instruction"].startswith("mmad")]
    assert mmad and all(r["Pipe"] == "CUBE" and r["Core Type"] == "aic" for r in mmad)
    assert all(r["Source"].startswith(f"{KERNELS}/gemm_f16.s:") for r in insns)


@check("run --report-dir on a coupled chip fills the aic and aiv columns from the same cores")
def _(d):
    vadd_run(d, "910", 32 * 1024, "--report-dir", f"{d}/rep")
    ops, _ = check_all(f"{d}/rep")
    op = ops[0]
    assert op["Task Type"] == "AI_CORE"
    assert op["aic_total_cycles"] == op["aiv_total_cycles"] and op["aic_total_cycles"] > 0
    assert op["aic_scalar_ratio"] == op["aiv_scalar_ratio"]
    assert op["aic_mte2_ratio"] == op["aiv_mte2_ratio"]
    assert op["aiv_vec_ratio"] > 0 and op["aic_mac_ratio"] == 0


@check("without a Python for the plots the report is still written, with how to plot it")
def _(d):
    p = vadd_run(d, "tiny", 1024, "--report-dir", f"{d}/rep",
                 env={"NPUSIM_PYTHON": f"{d}/no-such-python"})
    assert "make them with" in p.stdout and "npusim_report_plots.py" in p.stdout, p.stdout
    assert os.path.exists(f"{d}/rep/op_summary.csv")
    assert not os.path.exists(f"{d}/rep/roofline.png")
    if HAVE_MATPLOTLIB:  # the printed way works
        subprocess.run([sys.executable, f"{ROOT}/tools/npusim_report_plots.py", f"{d}/rep"],
                       check=True, capture_output=True)
        check_plots(f"{d}/rep")


@check("an unwritable report folder exits 1 naming it")
def _(d):
    with open(f"{d}/file", "w") as f:
        f.write("x")
    np.save(f"{d}/x.npy", np.ones(64, np.float16))
    p = run("run", f"{KERNELS}/vadd_f16.s", "--chip", "tiny", "--in", f"x={d}/x.npy",
            "--in", f"y={d}/x.npy", "--out", f"z={d}/z.npy", "--arg", "n=64", "--quiet",
            "--report-dir", f"{d}/file/rep", expect_rc=1)
    assert f"{d}/file/rep" in p.stderr, p.stderr


failed = sum(1 for _, e in results if e is not None)
print(f"{len(results) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
