"""Runs one case and returns its simulated figure in the published unit.

op cases run `npusim op OP ... --timing-only --json --report-dir` (a ratio case's figure is an
op_summary.csv column, averaged over the op's launches weighted by Task Duration; a host-loop
case's is the loop's time per call, `--host-loop`); cases of one op with the same command share
its run;
kernel cases run `npusim run KERNEL ... --timing-only --json --report-dir`, their figures read
as an op case's;
model cases run `python -m models.run ... --json` from the repository root with this Python.
A model case that needs timing-only TensorFlow runs uses them when models.run has
--timing-only; until then it runs its interim size (and says so) or is reported as waiting.
"""
import csv
import functools
import json
import os
import subprocess
import sys
import tempfile
import time

from sweep.runner import attr_text  # the --attr/--set text of a YAML value, as sweeps write it

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def chip_args(case, extra_sets=()):
    """--chip and --set arguments: the case's overrides, then EXTRA_SETS ("key=value", applied to
    every case: a global calibration, docs/validation.md)."""
    args = ["--chip", case["chip"]]
    for k, v in (case.get("overrides") or {}).items():
        args += ["--set", f"{k}={attr_text(v)}"]
    for kv in extra_sets:
        args += ["--set", kv]
    return args


@functools.lru_cache(maxsize=None)
def models_have_timing_only(python=sys.executable):
    """Whether models.run accepts --timing-only (timing-only TensorFlow runs have landed)."""
    p = subprocess.run([python, "-m", "models.run", "--help"], cwd=ROOT, capture_output=True,
                       text=True, check=False)
    return "--timing-only" in p.stdout


def op_command(npusim, case, tmp, extra_sets):
    out = os.path.join(tmp, "result.json")
    cmd = [npusim, "op", case["op"]] + chip_args(case, extra_sets) + ["--timing-only", "--json", out]
    for i in case["inputs"]:
        cmd += ["--input", str(i)]
    for k, v in (case.get("attrs") or {}).items():
        cmd += ["--attr", f"{k}={attr_text(v)}"]
    if "precision" in case:
        cmd += ["--precision", case["precision"]]
    for b in case.get("before") or []:
        cmd += ["--before", b]
    loop = case.get("host_loop")
    if loop:
        cmd += ["--host-loop", str(loop["calls"]), "--host-warmup", str(loop.get("warmup", 0))]
    return cmd + ["--report-dir", os.path.join(tmp, "report")], out


def kernel_command(npusim, case, tmp, extra_sets):
    """`npusim run KERNEL ... --timing-only --json --report-dir`: the case's blocks, scalar
    arguments and device buffers (each written, undefined in timing-only mode, to the scratch
    folder)."""
    out = os.path.join(tmp, "result.json")
    cmd = [npusim, "run", os.path.join(ROOT, case["kernel"])] + chip_args(case, extra_sets) + \
        ["--timing-only", "--json", out, "--quiet"]
    if "blocks" in case:
        cmd += ["--blocks", str(case["blocks"])]
    for name, v in (case.get("args") or {}).items():
        cmd += ["--arg", f"{name}={v}"]
    for name in case.get("buffers") or []:
        cmd += ["--out", f"{name}={os.path.join(tmp, name + '.npy')}"]
    return cmd + ["--report-dir", os.path.join(tmp, "report")], out


def model_size(case):
    """(batch, input_size, timing_only, label) the model case runs at, or None if it must wait."""
    size = case.get("input_size")
    if not case.get("needs_timing_only"):
        return case["batch"], size, False, ""
    if models_have_timing_only():
        return case["batch"], size, True, "timing-only"
    interim = case.get("interim")
    if not interim:
        return None
    b, n = interim.get("batch", case["batch"]), interim.get("input_size", size)
    return b, n, False, f"interim: batch {b}" + (f", {n}x{n}" if n else "")


def model_command(case, tmp, size, extra_sets):
    batch, input_size, timing_only, _ = size
    out = os.path.join(tmp, "result.json")
    cmd = [sys.executable, "-m", "models.run", "--model", case["model"], "--mode", case["mode"],
           "--batch", str(batch), "--steps", str(case.get("steps", 1))]
    if input_size:
        cmd += ["--input-size", str(input_size)]
    if "precision" in case:
        cmd += ["--precision", case["precision"]]
    if timing_only:
        cmd.append("--timing-only")
    # The case compares samples_per_s alone: no counter trees (gigabytes of JSON for a step of
    # many thousand launches, bert_large's).
    return cmd + chip_args(case, extra_sets) + ["--no-counters", "--json", out, "--quiet"], out


def read_summary(report_dir):
    """The rows of the report's op_summary.csv (none if the run wrote no report)."""
    path = os.path.join(report_dir, "op_summary.csv")
    if not os.path.exists(path):
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def summary_column(rows, column):
    """Task-Duration-weighted mean of an op_summary.csv column over the op's launches."""
    if not rows or column not in rows[0]:
        raise ValueError(f"op_summary.csv has no column '{column}'")
    pairs = [(float(r["Task Duration(us)"]), float(r[column])) for r in rows
             if r[column] not in ("", "N/A")]
    if not pairs:
        raise ValueError(f"op_summary.csv column '{column}' has no values")
    total = sum(d for d, _ in pairs)
    return sum(d * v for d, v in pairs) / total if total else pairs[0][1]


def simulated_value(case, run):
    """The run's figure in the case's published unit."""
    unit = case["published"]["unit"]
    if case.group == "model":
        return run["result"]["samples_per_s"]
    if unit == "ratio":
        return summary_column(run["summary"], case["metric"])
    # A host loop's figure is its time per call (the measurement divided the loop by its calls).
    t_us = run["result"]["host_loop"]["per_call_us"] if case.get("host_loop") else \
        run["result"]["time_us"]
    return {"us": t_us, "ms": t_us / 1e3,
            "TFLOPS": case.get("work", {}).get("flops", 0) / (t_us * 1e6),
            "GB/s": case.get("work", {}).get("bytes", 0) / (t_us * 1e3)}[unit]


# Lines of an error text that say where, not what: Python/TensorFlow traceback frames and
# TensorFlow's node annotations.
_NOISE = ("File \"", "[[", "Detected at node", "Traceback (most recent call last)")


def last_error_line(text):
    """The line of a failing run's output that says why: the last one that is not a traceback
    frame or node annotation (TensorFlow puts the op's own message last), else the last line."""
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    said = [l for l in lines if not l.startswith(_NOISE)]
    for l in reversed(said):
        if "error" in l.lower() or "fault" in l.lower() or "not supported" in l.lower():
            return l[:300]
    return (said or lines or ["no output"])[-1][:300]


# Runs of this process by command line (without its scratch folder): cases that differ only in
# the figure they compare (a time and several pipe ratios of one op) share one run.
_RUNS = {}


def execute(cmd, out, tmp, timeout_s, env=None):
    """Runs a command (ENV: variables added to this process's environment); returns {"result":
    its JSON, "summary": op_summary rows, "wall_s"} or {"reason": why it failed}."""
    key = tuple(c.replace(tmp, "<tmp>") for c in cmd) + tuple(sorted((env or {}).items()))
    if key in _RUNS:
        return _RUNS[key]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                           check=False, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return {"reason": f"timed out after {timeout_s:g} s", "wall_s": time.monotonic() - t0}
    run = {"wall_s": time.monotonic() - t0}
    result = None
    if os.path.exists(out):
        with open(out, encoding="utf-8") as f:
            result = json.load(f)
    if p.returncode != 0 or not result or result.get("ok") is False:
        msg = result.get("error") if isinstance(result, dict) and result.get("error") else \
            last_error_line(p.stderr + "\n" + p.stdout)
        run["reason"] = last_error_line(str(msg)).removeprefix("npusim: error: ").replace(tmp, "<tmp>")
    else:
        run.update(result=result, summary=read_summary(os.path.join(tmp, "report")))
    _RUNS[key] = run
    return run


def run_case(case, npusim, timeout_s, extra_sets=()):
    """The case's record: status ok | error | blocked | waiting, and on ok its simulated figure;
    published_includes: the case's key (kernels the published sum has besides the case's), or
    None."""
    rec = {"id": case["id"], "set": case["set"], "group": case.group, "chip": case["chip"],
           "unit": case["published"]["unit"], "published": case["published"]["value"],
           "simulated": None, "ran": "", "status": "error", "reason": "", "wall_s": 0.0,
           "published_includes": case.composite}
    if case.get("blocked"):
        rec.update(status="blocked", reason=case["blocked"])
        return rec
    size = model_size(case) if case.kind == "model" else None
    if case.kind == "model" and size is None:
        rec.update(status="waiting", reason="needs timing-only mode (models.run --timing-only)")
        return rec
    rec["ran"] = size[3] if size else ""
    with tempfile.TemporaryDirectory(prefix="npusim_validate_") as tmp:
        if case.kind == "op":
            cmd, out = op_command(npusim, case, tmp, extra_sets)
        elif case.kind == "kernel":
            cmd, out = kernel_command(npusim, case, tmp, extra_sets)
        else:
            cmd, out = model_command(case, tmp, size, extra_sets)
        run = execute(cmd, out, tmp, timeout_s, case.get("env"))
    rec["wall_s"] = run["wall_s"]
    if "reason" in run:
        rec["reason"] = run["reason"]
        return rec
    try:
        rec["simulated"] = simulated_value(case, run)
    except (KeyError, ValueError, ZeroDivisionError) as e:
        rec["reason"] = f"cannot read the run's figure: {e}"
        return rec
    rec["status"] = "ok"
    return rec
