"""Benchmark of compiled TensorFlow ops on the 910B-like chip (issue: "Kernel compiler and host
runtime"), as op calls through `npusim op` (no TensorFlow needed).

Runs MatMul 4096^3 fp16, the Conv2D layers of ResNet-50 at batch 32 (NHWC, fp16), a large
element-wise op, large reductions / softmax and fused attention (prefill, decode), in timing-only mode by default, and prints per
op: simulated time, cube and vector utilisation (of the whole chip's peak), achieved HBM
bandwidth, the op's roofline bound from the config, the ratio simulated / roofline, compile
time and wall time. Writes benchmarks/results/ops.json.

Targets (printed as PASS/MISS, not asserted): MatMul and the 3x3 convolutions reach at least
70 % of cube peak; element-wise ops reach at least 70 % of the HBM bound (roofline ratio <=
1/0.7). Reductions and softmax are memory-bound too; their fraction of the HBM bound is printed
(INFO) against the same 70 %, which the issue does not set for them (docs/compiler.md says what
holds them back).

Usage: .venv/bin/python benchmarks/bench_ops.py [--npusim build/npusim] [--chip 910b]
       [--functional] [--only NAME_SUBSTRING] [--out FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def conv(name, n, h, w, cin, k, cout, stride):
    return {
        "name": name, "op": "Conv2D", "kind": "conv3x3" if k == 3 else "conv",
        "inputs": [f"f16:{n}x{h}x{w}x{cin}", f"f16:{k}x{k}x{cin}x{cout}"],
        "attrs": [f"strides=[1,{stride},{stride},1]", "padding=SAME"],
    }


# ResNet-50's distinct convolution shapes at batch 32 (input H x W, Cin -> Cout).
WORKLOADS = [
    {"name": "MatMul 4096^3 f16", "op": "MatMul", "kind": "matmul",
     "inputs": ["f16:4096x4096", "f16:4096x4096"], "attrs": []},
    conv("conv1 7x7/2 3->64 @224", 32, 224, 224, 3, 7, 64, 2),
    conv("res2 1x1 64->64 @56", 32, 56, 56, 64, 1, 64, 1),
    conv("res2 3x3 64->64 @56", 32, 56, 56, 64, 3, 64, 1),
    conv("res2 1x1 64->256 @56", 32, 56, 56, 64, 1, 256, 1),
    conv("res3 3x3 128->128 @28", 32, 28, 28, 128, 3, 128, 1),
    conv("res4 3x3 256->256 @14", 32, 14, 14, 256, 3, 256, 1),
    conv("res5 3x3 512->512 @7", 32, 7, 7, 512, 3, 512, 1),
    {"name": "AddV2 f16 8192x8192", "op": "AddV2", "kind": "elementwise",
     "inputs": ["f16:8192x8192", "f16:8192x8192"], "attrs": []},
    # Reductions and row kernels are memory-bound like element-wise ops: one HBM read of the
    # input dominates; measured against the same roofline.
    {"name": "Sum f16 8192x8192 axis1", "op": "Sum", "kind": "memory_bound",
     "inputs": ["f16:8192x8192"], "attrs": ["axes=[1]"]},
    {"name": "Sum f16 8192x8192 axis0", "op": "Sum", "kind": "memory_bound",
     "inputs": ["f16:8192x8192"], "attrs": ["axes=[0]"]},
    {"name": "Softmax f16 8192x8192", "op": "Softmax", "kind": "memory_bound",
     "inputs": ["f16:8192x8192"], "attrs": []},
    # Fused attention (docs/compiler.md "Decoder-model kernels"): a Llama-7B-like layer's
    # causal prefill of 2048 tokens (32 heads of 128) and one decode step against a 2048-token
    # KV cache with grouped-query heads (32 query, 8 KV heads), batch 1 and 16.
    {"name": "PromptFlashAttention b1 s2048 32x128 causal", "op": "PromptFlashAttention",
     "kind": "attention", "inputs": ["f16:1x2048x32x128"] * 3, "attrs": ["sparse_mode=3"]},
    {"name": "IncreFlashAttention b1 L2048 32/8x128", "op": "IncreFlashAttention",
     "kind": "attention",
     "inputs": ["f16:1x1x32x128", "f16:1x2048x8x128", "f16:1x2048x8x128", "s64:1"],
     "attrs": ["actual_seq_lengths=[2048]"]},
    {"name": "IncreFlashAttention b16 L2048 32/8x128", "op": "IncreFlashAttention",
     "kind": "attention",
     "inputs": ["f16:16x1x32x128", "f16:16x2048x8x128", "f16:16x2048x8x128", "s64:16"],
     "attrs": ["actual_seq_lengths=[2048]"]},
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--npusim", default=os.path.join(ROOT, "build", "npusim"))
    ap.add_argument("--chip", default="910b")
    ap.add_argument("--functional", action="store_true", help="functional mode (slow)")
    ap.add_argument("--only", default="", help="run workloads whose name contains this")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "ops.json"))
    a = ap.parse_args()
    results = []
    print(f"{'workload':28} {'sim us':>10} {'cube %':>7} {'vec %':>6} {'HBM GB/s':>9} "
          f"{'bound us':>9} {'x bound':>8} {'compile s':>9} {'wall s':>7}")
    with tempfile.TemporaryDirectory() as d:
        for w in WORKLOADS:
            if a.only and a.only not in w["name"]:
                continue
            cmd = [a.npusim, "op", w["op"], "--chip", a.chip, "--json", f"{d}/r.json"]
            for i in w["inputs"]:
                cmd += ["--input", i]
            for at in w["attrs"]:
                cmd += ["--attr", at]
            if not a.functional:
                cmd.append("--timing-only")
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                msg = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["?"]
                print(f"{w['name']:28} FAILED: {msg[0][:100]}")
                results.append({"workload": w["name"], "error": msg[0]})
                continue
            r = json.load(open(f"{d}/r.json"))
            hbm_gbps = r["hbm_bytes"] / (r["time_us"] * 1e-6) / 1e9 if r["time_us"] else 0
            r.update({"workload": w["name"], "kind": w["kind"], "hbm_gbps": hbm_gbps})
            results.append(r)
            print(f"{w['name']:28} {r['time_us']:10.1f} {r['cube_utilization_pct']:7.1f} "
                  f"{r.get('vector_utilization_pct', 0.0):6.1f} "
                  f"{hbm_gbps:9.0f} {r['roofline_bound_us']:9.1f} {r['roofline_ratio']:8.2f} "
                  f"{r['compile_s']:9.3f} {r['wall_s']:7.2f}", flush=True)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nwritten {a.out}")
    for r in results:
        if "error" in r:
            continue
        if r["kind"] in ("matmul", "conv3x3"):
            ok = r["cube_utilization_pct"] >= 70
            print(f"{'PASS' if ok else 'MISS'} {r['workload']}: cube {r['cube_utilization_pct']:.1f}% "
                  f"(target >= 70%)")
        if r["kind"] in ("elementwise", "memory_bound"):
            frac = 1 / r["roofline_ratio"] if r["roofline_ratio"] else 0
            verdict = ("PASS" if frac >= 0.7 else "MISS") if r["kind"] == "elementwise" else "INFO"
            print(f"{verdict} {r['workload']}: {100 * frac:.0f}% of the roofline (HBM) bound "
                  f"({'target' if verdict != 'INFO' else 'element-wise target'} >= 70%)")


if __name__ == "__main__":
    sys.exit(main())
