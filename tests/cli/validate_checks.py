"""Checks of `npusim validate` (tools/npusim_validate.py) on the tiny chip: the rows it prints and
writes, not the accuracy of any case.

Usage: validate_checks.py NPUSIM_BINARY SOURCE_DIR. Prints 'N passed, N failed' and exits non-zero
on any failure. The reference for every figure is an independent `npusim op` run of the same op
and the error definitions of docs/validation.md, computed here.
"""
import csv
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

NPUSIM, ROOT = os.path.abspath(sys.argv[1]), sys.argv[2]
results = []

MATMUL = ["f16:256x256", "f16:256x256"]
FLOPS = 2 * 256 ** 3
# A kept, write-back L2 and a zero fill of the tiny chip's 8 MiB L2 before the op (a benchmark
# harness's L2 flush, docs/validation.md).
KEPT_L2 = {"memory.l2.keep_across_launches": True, "memory.l2.write_back": True}
FILL = "ZerosLike:f32:2097152"
ADD_BIG = ["f16:2048x2048", "f16:2048x2048"]  # 24 MiB in all, more than the 8 MiB L2
# A host issue far longer than the 256^3 MatMul on the tiny chip: the loop is host-bound.
LOOP_ISSUE_US = 100
# A hand-written kernel case: the DataCopy twin's GM -> UB copies on the tiny chip's 4 vector
# cores, 2 bands of 64 rows each; twice over (REPEAT) for the hit-rate row: the 256 KiB matrix
# fits the 8 MiB L2, so the second pass hits.
COPY_KERNEL = "benchmarks/kernels/gm2ub_load.s"
COPY_ARGS = {"M": 512, "N": 256, "TR": 64, "TC": 64, "EVERY": 0, "STAGGER": 0, "SLICES": 1,
             "REPEAT": 1}
COPY_TWICE = {**COPY_ARGS, "REPEAT": 2}


def case(cid, set_, published, workload):
    """One tiny-chip case of the test's case file (workload may name another chip), as a dict."""
    return {"id": cid, "set": set_, "chip": "tiny", **workload, "published": published,
            "source": {"url": f"https://example.org/{cid}", "quality": "test"},
            "conditions": "test"}


CASES = yaml.safe_dump({"cases": [
    case("mm_tflops", "calibration", {"value": 1.5, "unit": "TFLOPS"},
         {"op": "MatMul", "inputs": MATMUL, "work": {"flops": FLOPS}}),
    case("add_us", "held_out", {"value": 3.0, "unit": "us"},
         {"overrides": {"clock_mhz": 500}, "op": "AddV2", "inputs": ["f16:64x1024", "f16:64x1024"]}),
    # A composite row: the published time sums kernels the case does not run (here said of the
    # same add at a published time far from add_us's, so that counting it would move the means).
    case("add_composite", "held_out", {"value": 0.5, "unit": "us"},
         {"overrides": {"clock_mhz": 500}, "op": "AddV2", "inputs": ["f16:64x1024", "f16:64x1024"],
          "published_includes": "TransData x2, MemSet"}),
    case("mean_flushed", "calibration", {"value": 20.0, "unit": "us"},
         {"overrides": KEPT_L2, "op": "Mean", "inputs": ["f32:1024x1024"],
          "attrs": {"axes": [0, 1]}, "before": [FILL]}),
    case("add_allocated", "calibration", {"value": 3.0, "unit": "us"},
         {"overrides": KEPT_L2, "op": "AddV2", "inputs": ADD_BIG,
          "env": {"NPUSIM_L2_STREAM_POLICY": "0"}}),
    case("mm_loop", "calibration", {"value": 0.2, "unit": "TFLOPS"},
         {"overrides": {"host.op_dispatch_us": LOOP_ISSUE_US}, "op": "MatMul", "inputs": MATMUL,
          "work": {"flops": FLOPS}, "host_loop": {"calls": 30, "warmup": 6}}),
    case("mm_l2", "held_out", {"value": 0.5, "unit": "ratio"},
         {"op": "MatMul", "inputs": MATMUL, "metric": "l2_hit_rate"}),
    case("copy_us", "calibration", {"value": 2.0, "unit": "us"},
         {"kernel": COPY_KERNEL, "blocks": 4, "args": COPY_ARGS, "buffers": ["x"]}),
    case("copy_l2", "held_out", {"value": 0.4, "unit": "ratio"},
         {"kernel": COPY_KERNEL, "blocks": 4, "args": COPY_TWICE, "buffers": ["x"],
          "metric": "l2_hit_rate"}),
    case("cnn_infer", "held_out", {"value": 20000, "unit": "samples/s"},
         {"chip": "tiny_coupled", "model": "cnn", "mode": "infer", "batch": 2, "steps": 1}),
    case("not_run", "held_out", {"value": 100, "unit": "samples/s"},
         {"model": "no_such_model", "mode": "train", "batch": 8, "blocked": "no such model in models/"}),
]}, sort_keys=False)


def check(name, ok, detail=""):
    results.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""))


def run(*args):
    return subprocess.run([NPUSIM, *args], capture_output=True, text=True, check=False)


def op_reference(tmp, op, inputs, sets=(), report=False, extra=()):
    """The op's time (us) and, with report, its op_summary.csv rows, from `npusim op` directly
    (EXTRA: more arguments)."""
    out = os.path.join(tmp, f"ref_{op}.json")
    cmd = ["op", op, "--chip", "tiny", "--timing-only", "--json", out, *extra]
    for i in inputs:
        cmd += ["--input", i]
    for s in sets:
        cmd += ["--set", s]
    rep = os.path.join(tmp, f"ref_{op}_report")
    if report:
        cmd += ["--report-dir", rep]
    p = run(*cmd)
    assert p.returncode == 0, p.stderr
    with open(out) as f:
        t = json.load(f)["time_us"]
    rows = []
    if report:
        with open(os.path.join(rep, "op_summary.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
    return t, rows


def kernel_reference(tmp, args):
    """The copy kernel's time (us) and op_summary.csv rows, from `npusim run` directly."""
    out, rep = os.path.join(tmp, "ref_copy.json"), os.path.join(tmp, "ref_copy_report")
    cmd = ["run", os.path.join(ROOT, COPY_KERNEL), "--chip", "tiny", "--timing-only", "--blocks",
           "4", "--out", f"x={os.path.join(tmp, 'ref_x.npy')}", "--json", out, "--report-dir", rep]
    for k, v in args.items():
        cmd += ["--arg", f"{k}={v}"]
    p = run(*cmd)
    assert p.returncode == 0, p.stderr
    with open(os.path.join(rep, "op_summary.csv"), newline="") as f:
        return json.load(open(out))["time_us"], list(csv.DictReader(f))


def model_reference(tmp):
    """models.run's figures for the cnn case, run directly (its convolutions on a coupled chip)."""
    out = os.path.join(tmp, "ref_cnn.json")
    p = subprocess.run([sys.executable, "-m", "models.run", "--model", "cnn", "--mode", "infer",
                        "--batch", "2", "--steps", "1", "--chip", "tiny_coupled", "--json", out,
                        "--quiet"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    with open(out) as f:
        return json.load(f)


def main():
    with tempfile.TemporaryDirectory(prefix="validate_test_") as tmp:
        cases = os.path.join(tmp, "cases.yaml")
        with open(cases, "w") as f:
            f.write(CASES)
        out_json = os.path.join(tmp, "out.json")
        p = run("validate", "--cases", cases, "--json", out_json)
        check("runs and exits 0", p.returncode == 0, p.stderr[-500:])
        rows = {r["id"]: r for r in json.load(open(out_json))["rows"]}

        t_mm, mm_rows = op_reference(tmp, "MatMul", MATMUL, report=True)
        t_add, _ = op_reference(tmp, "AddV2", ["f16:64x1024", "f16:64x1024"], ["clock_mhz=500"])
        sim_tflops = FLOPS / (t_mm * 1e6)
        r = rows["mm_tflops"]
        check("TFLOPS row: simulated = flops / time of the op",
              abs(r["simulated"] - sim_tflops) < 1e-9 * sim_tflops, f"{r['simulated']} vs {sim_tflops}")
        err_mm = 1.5 / sim_tflops - 1.0  # time error: t_sim / t_pub - 1, t = flops / TFLOPS
        check("TFLOPS row: error is the time error", abs(r["error"] - err_mm) < 1e-9, f"{r['error']} vs {err_mm}")
        r = rows["add_us"]
        check("us row: overrides reach the run (clock 500 MHz)", abs(r["simulated"] - t_add) < 1e-9,
              f"{r['simulated']} vs {t_add}")
        err_add = t_add / 3.0 - 1.0
        check("us row: error", abs(r["error"] - err_add) < 1e-9)
        mean_args = ["f32:1024x1024"], [f"{k}=true" for k in KEPT_L2]
        t_flushed, _ = op_reference(tmp, "Mean", *mean_args, extra=["--attr", "axes=[0,1]",
                                                                    "--before", FILL])
        t_kept, _ = op_reference(tmp, "Mean", *mean_args, extra=["--attr", "axes=[0,1]"])
        r = rows["mean_flushed"]
        check("before: the case's ops run first on the case's chip (a flushed L2 is slower)",
              abs(r["simulated"] - t_flushed) < 1e-9 and t_flushed > t_kept,
              f"{r['simulated']} vs {t_flushed} (without: {t_kept})")
        # env: the add's streams keep the normal L2 policy (NPUSIM_L2_STREAM_POLICY=0) instead of
        # the noalloc inputs a kept, write-back L2 gives a stream larger than the L2.
        kept_sets = [f"{k}=true" for k in KEPT_L2]
        os.environ["NPUSIM_L2_STREAM_POLICY"] = "0"
        t_normal, _ = op_reference(tmp, "AddV2", ADD_BIG, kept_sets)
        del os.environ["NPUSIM_L2_STREAM_POLICY"]
        t_policy, _ = op_reference(tmp, "AddV2", ADD_BIG, kept_sets)
        r = rows["add_allocated"]
        check("env reaches the case's run (the add's L2 stream policy off)",
              abs(r["simulated"] - t_normal) < 1e-9 and t_normal != t_policy,
              f"{r['simulated']} vs {t_normal} (policy on: {t_policy})")
        # host_loop: 30 calls of a host-bound loop take 30 issues and the last call's kernel, per
        # call (issue + t / 30) with the issue in whole cycles (clock from the op's own figures).
        out_ref = os.path.join(tmp, "ref_mm.json")
        p_ref = run("op", "MatMul", "--chip", "tiny", "--timing-only", "--json", out_ref,
                    *sum((["--input", i] for i in MATMUL), []))
        ref = json.load(open(out_ref))
        mhz = ref["cycles"] / ref["time_us"]
        per_call_us = (30 * round(LOOP_ISSUE_US * mhz) + ref["cycles"]) / mhz / 30
        r = rows["mm_loop"]
        check("host_loop row: flops / the loop's time per call (host-bound: issue + kernel / 30)",
              p_ref.returncode == 0 and ref["time_us"] < LOOP_ISSUE_US and
              abs(r["simulated"] - FLOPS / (per_call_us * 1e6)) < 1e-9 * r["simulated"],
              f"{r['simulated']} vs {FLOPS / (per_call_us * 1e6)}")
        hit = [float(x["l2_hit_rate"]) for x in mm_rows]
        dur = [float(x["Task Duration(us)"]) for x in mm_rows]
        ref_hit = sum(h * d for h, d in zip(hit, dur)) / sum(dur)
        r = rows["mm_l2"]
        check("ratio row: op_summary.csv l2_hit_rate and difference",
              abs(r["simulated"] - ref_hit) < 1e-9 and abs(r["error"] - (ref_hit - 0.5)) < 1e-9,
              f"{r['simulated']} vs {ref_hit}")
        t_copy, _ = kernel_reference(tmp, COPY_ARGS)
        r = rows["copy_us"]
        check("kernel row: npusim run's Task Duration of the hand-written kernel, and its error",
              r["status"] == "ok" and abs(r["simulated"] - t_copy) < 1e-9 and
              abs(r["error"] - (t_copy / 2.0 - 1.0)) < 1e-9, f"{r} vs {t_copy}")
        _, twice_rows = kernel_reference(tmp, COPY_TWICE)
        hit = float(twice_rows[0]["l2_hit_rate"])
        # From the config: a matrix row (N f16) is one L2 line (tiny extends the 910b:
        # memory.l2.line_bytes 512) read by N / TC copies a pass; the first of the first pass
        # misses and fills the line, every other lookup of the two passes hits.
        line_bytes = yaml.safe_load(run("config", "--chip", "tiny").stdout)["memory"]["l2"]["line_bytes"]
        per_pass = COPY_ARGS["N"] // COPY_ARGS["TC"]
        expect_hit = 1 - 1 / (2 * per_pass)
        r = rows["copy_l2"]
        check("kernel ratio row: its op_summary.csv column (the L2 hits the config gives)",
              line_bytes == 2 * COPY_ARGS["N"] and len(twice_rows) == 1 and
              abs(hit - expect_hit) < 1e-4 and abs(r["simulated"] - hit) < 1e-9 and
              abs(r["error"] - (hit - 0.4)) < 1e-9, f"{r} vs {hit}, expected {expect_hit}")
        ref = model_reference(tmp)
        r = rows["cnn_infer"]
        check("model row: models.run's samples/s on a coupled chip, its convolutions on the NPU",
              r["status"] == "ok" and abs(r["simulated"] - ref["samples_per_s"]) < 1e-6 * ref["samples_per_s"]
              and not ref["cpu_fallback_ops"] and "Conv2DBatchNormInference" in ref["emulator_wall_s_by_op_type"],
              f"{r} vs {ref['samples_per_s']}")
        check("model row: error is the throughput error",
              abs(r["error"] - (ref["samples_per_s"] / 20000 - 1.0)) < 1e-6, f"{r['error']}")
        r = rows["not_run"]
        check("blocked row: not run, no error", r["status"] == "blocked" and r["error"] is None)

        line = next((l for l in p.stdout.splitlines() if l.startswith("mm_tflops ")), "")
        m = re.fullmatch(r"mm_tflops\s+cal\s+tiny\s+([0-9.,]+)\s+1\.5000\s+TFLOPS\s+([+-][0-9.]+) %", line)
        check("printed row is well formed", bool(m), repr(line))
        if m:
            check("printed figures match the JSON",
                  abs(float(m.group(1).replace(",", "")) - sim_tflops) < 1e-4 * max(1, sim_tflops)
                  and abs(float(m.group(2)) - 100 * err_mm) < 0.051)
        mae_line = next((l for l in p.stdout.splitlines() if "kernel time" in l and "held-out" in l), "")
        check("held-out kernel MAE printed", f"{100 * abs(err_add):.1f} %" in mae_line, repr(mae_line))
        check("blocked reason printed", "blocked: no such model in models/" in p.stdout)
        # The composite row: printed with its error and its kernels, in the JSON with its key,
        # outside the kernel means (the held-out kernel line above is add_us's alone) and in a
        # summary line of its own.
        r = rows["add_composite"]
        err_comp = t_add / 0.5 - 1.0
        check("composite row: error as any kernel row, key in the JSON",
              abs(r["error"] - err_comp) < 1e-9 and r["published_includes"] == "TransData x2, MemSet",
              f"{r}")
        line = next((l for l in p.stdout.splitlines() if l.startswith("add_composite ")), "")
        check("composite row printed with its error and the kernels its figure includes",
              f"{100 * err_comp:+.1f} %" in line and "published sum includes: TransData x2, MemSet" in line,
              repr(line))
        summary = json.load(open(out_json))["summary"]
        check("composite row kept out of the kernel means, in a mean of its own",
              summary["kernel/held_out"]["n"] == 1 and summary["kernel/all"]["n"] == 6 and
              abs(summary["kernel/held_out"]["mae"] - abs(err_add)) < 1e-9 and
              summary["composite/all"]["n"] == 1 and abs(summary["composite/all"]["mae"] - abs(err_comp)) < 1e-9,
              f"{summary}")
        comp_line = next((l for l in p.stdout.splitlines() if l.startswith("kernel, composite")), "")
        check("composite summary line printed", f"n=1, MAE {100 * abs(err_comp):.1f} %" in comp_line,
              repr(comp_line))
        targets = [l for l in p.stdout.splitlines() if "kernel time MAE <= 10 %" in l]
        check("composite row not in the kernel target", len(targets) == 1 and "over 6 cases" in targets[0],
              repr(targets))

        out2 = os.path.join(tmp, "out2.json")
        p = run("validate", "--cases", cases, "--only", "mm_tflops", "--set", "clock_mhz=900",
                "--json", out2)
        t_900, _ = op_reference(tmp, "MatMul", MATMUL, ["clock_mhz=900"])
        r = json.load(open(out2))["rows"][0]
        check("--set reaches every case's run", p.returncode == 0 and
              abs(r["simulated"] - FLOPS / (t_900 * 1e6)) < 1e-9 * r["simulated"] and t_900 != t_mm,
              f"{r['simulated']} vs {FLOPS / (t_900 * 1e6)}")

        p = run("validate", "--cases", cases, "--only", "mm_l2", "--only", "nope")
        check("unknown --only id: exit 1 naming it", p.returncode == 1 and "no case 'nope'" in p.stderr, p.stderr)
        bad = os.path.join(tmp, "bad.yaml")
        with open(bad, "w") as f:
            f.write(CASES.replace("  conditions: test\n", "  conditions: test\n  speed: 3\n", 1))
        p = run("validate", "--cases", bad)
        check("bad key: exit 1 naming file, case and key",
              p.returncode == 1 and "bad.yaml" in p.stderr and "mm_tflops" in p.stderr and "'speed'" in p.stderr,
              p.stderr)
        with open(bad, "w") as f:
            f.write(CASES.replace(f"- {FILL}", "- ZerosLike", 1))
        p = run("validate", "--cases", bad)
        check("bad before: exit 1 naming the case and the key",
              p.returncode == 1 and "mean_flushed" in p.stderr and ".before" in p.stderr, p.stderr)
        with open(bad, "w") as f:
            f.write(CASES.replace("calls: 30", "calls: 0", 1))
        p = run("validate", "--cases", bad)
        check("bad host_loop: exit 1 naming the case and the key",
              p.returncode == 1 and "mm_loop" in p.stderr and ".host_loop" in p.stderr, p.stderr)
        with open(bad, "w") as f:
            f.write(CASES.replace("NPUSIM_L2_STREAM_POLICY", "L2_STREAM_POLICY", 1))
        p = run("validate", "--cases", bad)
        check("bad env: exit 1 naming the case and the key",
              p.returncode == 1 and "add_allocated" in p.stderr and ".env" in p.stderr, p.stderr)
        for bad_value, why in (('""', "empty"), ("[TransData]", "a list")):
            with open(bad, "w") as f:
                f.write(CASES.replace("published_includes: TransData x2, MemSet",
                                      f"published_includes: {bad_value}", 1))
            p = run("validate", "--cases", bad)
            check(f"bad published_includes ({why}): exit 1 naming file, case and key",
                  p.returncode == 1 and "bad.yaml" in p.stderr and "add_composite" in p.stderr and
                  ".published_includes" in p.stderr, p.stderr)
        for bad_value, key in (("benchmarks/kernels/no_such_kernel.s", ".kernel"),
                               ("benchmarks/kernels/gm2ub_load.txt", ".kernel")):
            with open(bad, "w") as f:
                f.write(CASES.replace(f"kernel: {COPY_KERNEL}", f"kernel: {bad_value}", 1))
            p = run("validate", "--cases", bad)
            check(f"bad kernel path ({bad_value}): exit 1 naming the case and the key",
                  p.returncode == 1 and "copy_us" in p.stderr and key in p.stderr, p.stderr)
        with open(bad, "w") as f:
            f.write(CASES.replace("    M: 512\n", "    M: many\n", 1))
        p = run("validate", "--cases", bad)
        check("bad kernel args: exit 1 naming the case and the key",
              p.returncode == 1 and "copy_us" in p.stderr and ".args" in p.stderr, p.stderr)
        with open(bad, "w") as f:
            f.write(CASES.replace("  metric: l2_hit_rate\n",
                                  "  metric: l2_hit_rate\n  published_includes: MemSet\n", 1))
        p = run("validate", "--cases", bad)
        check("published_includes on a ratio case: exit 1 naming the case and the key",
              p.returncode == 1 and "mm_l2" in p.stderr and ".published_includes" in p.stderr, p.stderr)
    print(f"{results.count(True)} passed, {results.count(False)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
