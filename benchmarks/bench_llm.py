"""Benchmark of decoder-only language models (issue "Large language models on the emulated NPU"):
greedy generation with the KV cache (models/llm.py) of a 1B-class Llama (`llama-1b`, Llama 3.2
1B's shape, random weights) on the 910b preset, side by side with TensorFlow on the CPU.

Each configuration is one `python -m models.run --mode generate` child process (one chip per
process), so the figures are the runner's (models/run.py, run_generate):

- NPU: time to first token (the prefill's device timeline), time per output token (a decode
  step's), tokens/s, kernels per decode step, and the decode step against its roofline (weight
  and KV-cache bytes / HBM bandwidth: a batch-1 decode reads every weight once, so it cannot be
  faster; the ratio says how close the step comes); the emulator's host wall time per token.
- CPU: TensorFlow's wall time per token for the same model and prompt (the emulator's cost is
  compared with it: how many times slower emulating the chip is than running the model).

The NPU run is functional by default: the chip computes every instruction's data, the weights
are random (seed 0, as on the CPU) and the tokens are the model's; the two runs' greedy tokens
are compared (bf16 rounding differs between the chip and the CPU, so an argmax may flip where
two logits are close: the count is printed, not required). --timing-only skips the data
(llama-7b: its weights never materialised); the simulated figures are the same either way
(docs/tf_plugin.md, "Timing-only runs"). Weights are the model's dtype
(--dtype, default bfloat16 as Llama 3.2 is published; float32 runs the cube in fp16 under
allow_fp32_to_fp16 with the weights cast once and kept).

Usage: .venv/bin/python benchmarks/bench_llm.py [--model llama-1b] [--prompt-len 128]
       [--gen-len 32] [--batch 1] [--dtype bfloat16] [--quantize int8] [--resident-cache]
       [--copied-cache] [--chip 910b]
       [--timing-only] [--no-cpu]
       [--report-dir DIR] [--json OUT]
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--quantize", default=None, choices=["int8"],
                    help="weight-only int8 (models.run --quantize; docs/llm.md)")
    ap.add_argument("--resident-cache", action="store_true",
                    help="NPU: the KV cache as a variable per layer written in place "
                    "(models.run --resident-cache, its default on the NPU; docs/llm.md)")
    ap.add_argument("--copied-cache", action="store_true",
                    help="NPU: keras-hub's own decode step, the cache copied once per step "
                    "(models.run --copied-cache)")
    ap.add_argument("--chip", default="910b")
    ap.add_argument("--timing-only", action="store_true",
                    help="NPU: simulate the times without computing the data (default: "
                    "functional)")
    ap.add_argument("--no-cpu", action="store_true", help="skip the TensorFlow-CPU run")
    ap.add_argument("--report-dir", default=None, help="the NPU run's msprof-style report")
    ap.add_argument("--json", dest="json_out", default=None)
    return ap.parse_args()


def run(args, device):
    """One models.run generate child -> (its JSON, its wall seconds)."""
    cmd = [sys.executable, "-m", "models.run", "--model", args.model, "--mode", "generate",
           "--prompt-len", str(args.prompt_len), "--gen-len", str(args.gen_len),
           "--batch", str(args.batch), "--dtype", args.dtype, "--device", device, "--quiet"]
    if args.quantize:
        cmd += ["--quantize", args.quantize]
    if device == "NPU":
        cmd += ["--chip", args.chip]
        if args.resident_cache:
            cmd.append("--resident-cache")
        if args.copied_cache:
            cmd.append("--copied-cache")
        if args.timing_only:
            cmd.append("--timing-only")
        if args.report_dir:
            cmd += ["--report-dir", args.report_dir]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise RuntimeError(f"{device} run printed no result:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1]), wall


def _flat(tokens):
    """The (batch, gen_len) token list row by row."""
    return [t for row in tokens for t in row]


def main():
    args = parse_args()
    out = {"model": args.model, "prompt_len": args.prompt_len, "gen_len": args.gen_len,
           "batch": args.batch, "dtype": args.dtype, "quantize": args.quantize,
           "resident_cache": args.resident_cache, "chip": args.chip,
           "npu_mode": "timing-only" if args.timing_only else "functional"}
    npu, npu_wall = run(args, "NPU")
    out["resident_cache"] = npu.get("resident_cache")  # models.run's choice (its default)
    out["npu"] = npu
    out["npu_process_wall_s"] = npu_wall
    if not npu.get("ok"):
        print(json.dumps(out))
        return 1
    weights = f", {args.quantize} weights" if args.quantize else ""
    cache = "resident" if npu.get("resident_cache") else "copied"
    print(f"{args.model} on {npu['chip']} ({out['npu_mode']}, {args.dtype}{weights}, {cache} KV "
          f"cache), batch "
          f"{args.batch},"
          f" prompt {args.prompt_len} + {args.gen_len} tokens:")
    print(f"  TTFT {npu['ttft_us'] / 1e3:.2f} ms ({npu['prefill_kernels']} kernels), "
          f"TPOT {npu.get('tpot_us', float('nan')) / 1e3:.3f} ms "
          f"({npu.get('decode_kernels_per_step', 0):.0f} kernels per step)")
    print(f"  decode {npu.get('decode_tokens_per_s', float('nan')):.1f} tokens/s, end to end "
          f"{npu['tokens_per_s']:.1f} tokens/s")
    if "decode_roofline_us" in npu and "tpot_us" in npu:
        out["decode_vs_roofline"] = npu["tpot_us"] / npu["decode_roofline_us"]
        print(f"  decode step roofline {npu['decode_roofline_us'] / 1e3:.3f} ms (weights "
              f"{npu['weight_bytes'] / 2**30:.2f} GiB + KV cache "
              f"{npu['kv_cache_bytes'] / 2**20:.1f} MiB at the HBM bandwidth): the step takes "
              f"{out['decode_vs_roofline']:.2f} x that")
    if "decode_roofline_sustained_us" in npu and "tpot_us" in npu:
        out["decode_vs_sustained_roofline"] = npu["tpot_us"] / npu["decode_roofline_sustained_us"]
        print(f"  at the sustained HBM rate (memory.hbm.efficiency) the roofline is "
              f"{npu['decode_roofline_sustained_us'] / 1e3:.3f} ms: the step takes "
              f"{out['decode_vs_sustained_roofline']:.2f} x that")
    print(f"  emulator: {npu.get('wall_s_per_token', float('nan')):.3f} s wall per token "
          f"({npu.get('decode_replayed_per_step', float('nan')):.0f} launches of a step replayed), "
          f"prefill {npu['wall_s_prefill']:.1f} s ({npu.get('prefill_replayed', 0)} of "
          f"{npu['prefill_kernels']} launches replayed; the first prefill "
          f"{npu.get('warmup_wall_s_prefill', float('nan')):.1f} s), warm-up "
          f"{npu['warmup_wall_s']:.1f} s (process {npu_wall:.0f} s)")
    if npu.get("cpu_fallback_ops"):
        print(f"  CPU fallbacks: {npu['cpu_fallback_ops']}")
    if not args.no_cpu:
        cpu, cpu_wall = run(args, "CPU")
        out["cpu"] = cpu
        out["cpu_process_wall_s"] = cpu_wall
        if cpu.get("ok") and "wall_s_per_token" in cpu and "wall_s_per_token" in npu:
            out["emulator_vs_cpu_per_token"] = npu["wall_s_per_token"] / cpu["wall_s_per_token"]
            print(f"  TensorFlow CPU: {cpu['wall_s_per_token']:.3f} s per token, prefill "
                  f"{cpu['wall_s_prefill']:.2f} s: the emulator takes "
                  f"{out['emulator_vs_cpu_per_token']:.3g} x its wall time per token")
            if "cpu_s_per_token" in cpu and "cpu_s_per_token" in npu:
                out["emulator_vs_cpu_cpu_time_per_token"] = (npu["cpu_s_per_token"] /
                                                             cpu["cpu_s_per_token"])
                print(f"  CPU time per token (all threads; a loaded host inflates the wall "
                      f"times): emulator {npu['cpu_s_per_token']:.3f} s, TensorFlow "
                      f"{cpu['cpu_s_per_token']:.3f} s: "
                      f"{out['emulator_vs_cpu_cpu_time_per_token']:.3g} x")
        elif not cpu.get("ok"):
            print(f"  TensorFlow CPU run failed: {cpu.get('error')}")
        if cpu.get("ok") and not args.timing_only:
            same = [a == b for a, b in zip(_flat(npu["tokens"]), _flat(cpu["tokens"]))]
            first = same.index(False) if False in same else len(same)
            out["tokens_equal_cpu"] = sum(same)
            out["tokens_equal_cpu_leading"] = first
            print(f"  greedy tokens: {sum(same)} of {len(same)} equal to the CPU's (the first "
                  f"{first} in a row)")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k not in ("npu", "cpu")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
