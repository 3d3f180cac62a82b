"""One sweep point (a config x a workload) as one process, and its stored result.

op workloads run `npusim op ... --json`, kernel workloads `npusim run ... --json`, model workloads
`python -m models.run ... --json` (from the repository root, with this Python). A point's result
is stored in DIR/points/<key>.json, key = hash of (base chip, overrides, resolved config,
workload (and a kernel's file), timing mode, npusim binary), so a rerun skips it (docs/sweep.md).
"""
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import yaml

from sweep.area import area_breakdown
from sweep.cost import config_cost

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Buffers whose high-water marks the CSV reports (every on-chip buffer of the schema).
HWM_BUFFERS = ("l1", "l0a", "l0b", "l0c", "ub", "bt", "fb")

_NPY_DTYPES = {"f16": np.float16, "f32": np.float32, "bf16": np.uint16, "s8": np.int8,
               "u8": np.uint8, "s16": np.int16, "u16": np.uint16, "s32": np.int32,
               "u32": np.uint32, "s64": np.int64, "u64": np.uint64}


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def short_reason(text, limit=400):
    """The line of a failing command's output that says why (the last error-looking line)."""
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    for l in reversed(lines):
        if "error" in l.lower() or "failed" in l.lower() or "fault" in l.lower():
            return l[:limit]
    return (lines[-1] if lines else "no output")[:limit]


class ResolvedConfig:
    """A config of the grid as `npusim config` resolves it (or why it cannot)."""

    def __init__(self, sets, ok, text, cfg=None):
        self.sets = sets      # [(key, text)]: fixed then swept overrides
        self.ok = ok
        self.text = text      # resolved YAML, or the error line
        self.cfg = cfg        # parsed YAML (ok only)

    def area(self):
        return area_breakdown(self.cfg) if self.ok else None

    def cost(self):
        """sweep.cost.config_cost: area, die area, HBM plan, cost (None if rejected)."""
        return config_cost(self.cfg) if self.ok else None


def set_args(sets):
    out = []
    for k, v in sets:
        out += ["--set", f"{k}={v}"]
    return out


def resolve_config(npusim, chip_path, sets):
    p = subprocess.run([npusim, "config", "--chip", chip_path] + set_args(sets),
                       capture_output=True, text=True)
    if p.returncode != 0:
        reason = short_reason(p.stderr or p.stdout).removeprefix("npusim: error: ")
        return ResolvedConfig(sets, False, reason)
    return ResolvedConfig(sets, True, p.stdout, yaml.safe_load(p.stdout))


class Context:
    """What every point needs: the tools, the grid's settings and the output folder."""

    def __init__(self, grid, npusim, out_dir):
        self.grid = grid
        self.npusim = npusim
        self.out_dir = os.path.abspath(out_dir)  # absolute: points may run on other nodes
        self.points_dir = os.path.join(self.out_dir, "points")
        self.inputs_dir = os.path.join(self.out_dir, "inputs")
        self.binary_id = file_sha256(npusim)


def point_key(ctx, conf, workload):
    ident = {
        "chip": ctx.grid.chip,
        "overrides": conf.sets,
        "resolved": conf.text,
        # Resource requests say where a point runs, not what it computes.
        "workload": {k: v for k, v in workload.items() if k not in ("resources", "timing_only")},
        "timing_only": workload["timing_only"],
        "npusim": ctx.binary_id,
    }
    if workload["kind"] == "kernel" and os.path.exists(kernel_path(ctx, workload)):
        ident["kernel_sha"] = file_sha256(kernel_path(ctx, workload))  # an edited kernel reruns
    return hashlib.sha256(canonical(ident).encode()).hexdigest()[:20]


def attr_text(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(str(x) for x in v) + "]"
    return str(v)


def random_input(ctx, spec):
    """A .npy file of random data for a kernel input DTYPE:SHAPE (deterministic, cached)."""
    dtype, _, shape = spec.partition(":")
    if dtype not in _NPY_DTYPES:
        raise ValueError(f"input '{spec}': unknown dtype '{dtype}' (one of {', '.join(_NPY_DTYPES)})")
    dims = [int(d) for d in shape.split("x")] if shape else []
    path = os.path.join(ctx.inputs_dir, hashlib.sha256(spec.encode()).hexdigest()[:16] + ".npy")
    if not os.path.exists(path):
        rng = np.random.default_rng(int(hashlib.sha256(spec.encode()).hexdigest()[:8], 16))
        if np.issubdtype(_NPY_DTYPES[dtype], np.floating):
            a = rng.uniform(-1, 1, dims).astype(_NPY_DTYPES[dtype])
        elif dtype == "bf16":  # bf16 bit patterns of values in [-1, 1]
            a = (rng.uniform(-1, 1, dims).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        else:
            a = rng.integers(-8 if dtype.startswith("s") else 0, 8, dims).astype(_NPY_DTYPES[dtype])
        os.makedirs(ctx.inputs_dir, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp.npy"
        np.save(tmp, a)
        os.replace(tmp, path)
    return path


def kernel_path(ctx, w):
    k = w["kernel"]
    if os.path.isabs(k):
        return k
    for base in (ROOT, os.path.dirname(os.path.abspath(ctx.grid.path))):
        if os.path.exists(os.path.join(base, k)):
            return os.path.join(base, k)
    return os.path.join(ROOT, k)


def command(ctx, conf, w, tmp):
    """The command line of a point and the JSON file it writes."""
    out_json = os.path.join(tmp, "result.json")
    chip = ["--chip", ctx.grid.chip_path] + set_args(conf.sets)
    timing = ["--timing-only"] if w["timing_only"] else []
    if w["kind"] == "op":
        cmd = [ctx.npusim, "op", w["op"]] + chip + timing + ["--json", out_json]
        for i in w["inputs"]:
            cmd += ["--input", i]
        for k, v in w["attrs"].items():
            cmd += ["--attr", f"{k}={attr_text(v)}"]
        if "precision" in w:
            cmd += ["--precision", w["precision"]]
    elif w["kind"] == "kernel":
        cmd = [ctx.npusim, "run", kernel_path(ctx, w)] + chip + timing + [
            "--json", out_json, "--quiet"]
        for name, spec in w["inputs"].items():
            cmd += ["--in", f"{name}={random_input(ctx, str(spec))}"]
        for name, spec in w["outputs"].items():
            f = os.path.join(tmp, f"out_{name}.npy")
            cmd += ["--out", f"{name}={f}" + (f":{spec}" if spec else "")]
        for name, v in w["args"].items():
            cmd += ["--arg", f"{name}={v}"]
        if "blocks" in w:
            cmd += ["--blocks", str(w["blocks"])]
    else:
        cmd = [sys.executable, "-m", "models.run", "--model", w["model"], "--mode", w["mode"],
               "--batch", str(w["batch"]), "--steps", str(w["steps"])]
        if "input_size" in w:
            cmd += ["--input-size", str(w["input_size"])]
        if "precision" in w:
            cmd += ["--precision", w["precision"]]
        cmd += chip + timing + ["--json", out_json, "--quiet"]
    return cmd, out_json


def peak_tflops(cfg):
    """The config's fp16 cube peak in TFLOPS (2 flops per MAC)."""
    cube_cores = sum(int(k.get("count", 0)) for k in cfg["cores"].values() if "m" in (k.get("pipes") or []))
    c = cfg["cube"]
    return 2.0 * int(c["m"]) * int(c["k"]) * int(c["n"]) * cube_cores * float(cfg["clock_mhz"]) * 1e6 / 1e12


def metrics_of(kind, r, conf):
    """The CSV's figures from a point's JSON output."""
    m = {}
    if kind == "model":
        m["sim_time_us"] = r.get("simulated_us_per_step")
        m["throughput"] = r.get("samples_per_s")
        m["throughput_unit"] = "samples/s"
        m["kernels"] = r.get("kernels_per_step")
        m["hbm_bytes"] = r.get("hbm_bytes_per_step")
        if "loss" in r:
            m["loss"] = r["loss"]
    else:
        m["sim_time_us"] = r.get("time_us")
        m["throughput"] = 1e6 / r["time_us"] if r.get("time_us") else None
        m["throughput_unit"] = "runs/s"
        m["kernels"] = len(r["launches"]) if "launches" in r else 1
        m["hbm_bytes"] = r.get("hbm_bytes")
        m["gm_bytes"] = r.get("gm_bytes")
    m["cube_util_pct"] = r.get("cube_utilization_pct")
    m["vector_util_pct"] = r.get("vector_utilization_pct")
    if m["cube_util_pct"] is not None and conf.ok:
        m["achieved_tflops"] = m["cube_util_pct"] / 100.0 * peak_tflops(conf.cfg)
    if r.get("activity") is not None:
        m["activity"] = r["activity"]
    hwm = r.get("buffer_high_water_bytes") or {}
    for b in HWM_BUFFERS:
        if b in hwm:
            m[f"hwm_{b}_bytes"] = hwm[b]
    return m


def error_record(conf, w, key, reason=""):
    """The record of a point that did not run (yet): status error with `reason`."""
    return {"key": key, "config": conf.sets, "workload": w, "status": "error", "reason": reason,
            "metrics": {}, "wall_s": 0.0}


def run_point(ctx, conf, w, key):
    """Runs one point and returns its result record (also for bad configs and failures)."""
    rec = error_record(conf, w, key)
    if not conf.ok:
        rec["reason"] = f"config: {conf.text}"
        return rec
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="npusim_sweep_") as tmp:
        try:
            cmd, out_json = command(ctx, conf, w, tmp)
        except (ValueError, OSError) as e:
            rec["reason"] = str(e)
            return rec
        rec["command"] = cmd
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=ctx.grid.timeout_s,
                               cwd=ROOT if w["kind"] == "model" else None)
        except subprocess.TimeoutExpired:
            rec["reason"] = f"timed out after {ctx.grid.timeout_s:g} s"
            rec["wall_s"] = time.monotonic() - t0
            return rec
        rec["wall_s"] = time.monotonic() - t0
        result = None
        if os.path.exists(out_json):
            try:
                with open(out_json) as f:
                    result = json.load(f)
            except (OSError, ValueError):
                result = None
        if p.returncode != 0 or result is None or result.get("ok") is False:
            if p.returncode < 0:  # killed by a signal: a crash, not a message
                try:
                    sig = signal.Signals(-p.returncode).name
                except ValueError:
                    sig = str(-p.returncode)
                rec["reason"] = f"crashed ({sig}); last output: {short_reason(p.stderr or p.stdout, 200)}"
            elif isinstance(result, dict) and result.get("error"):
                rec["reason"] = short_reason(str(result["error"]))
            else:
                rec["reason"] = short_reason(p.stderr + "\n" + p.stdout if p.stderr.strip() else p.stdout)
                if p.returncode == 0 and result is None:
                    rec["reason"] = "the command wrote no JSON result"
            # The point's scratch folder is random: keep it out of the (deterministic) reason.
            rec["reason"] = rec["reason"].removeprefix("npusim: error: ").replace(tmp, "<tmp>")
            rec["exit_code"] = p.returncode
            return rec
        rec["status"] = "ok"
        rec["metrics"] = metrics_of(w["kind"], result, conf)
        rec["wall_s_inner"] = result.get("wall_s", result.get("wall_s_per_step"))
    return rec


def load_point(ctx, key):
    path = os.path.join(ctx.points_dir, key + ".json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def store_point(ctx, rec):
    os.makedirs(ctx.points_dir, exist_ok=True)
    path = os.path.join(ctx.points_dir, rec["key"] + ".json")
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        json.dump(rec, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
