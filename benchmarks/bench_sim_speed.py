"""Emulation speed of the simulator on the op mix of one ResNet-50 inference at batch 1
(issue: ResNet-50 inference through the TF plugin within 3x of TF-CPU's wall time).

Runs every distinct op shape of keras.applications.ResNet50 (224x224x3, batch 1, f32, default
precision, inputs: seeded uniform [-1, 1) .npy files) through `npusim op --json` on the 910b chip,
in functional mode and with --timing-only, and prints per shape: its count in the network, the
process CPU time (user + sys: the machine is shared, so CPU time, not wall, is the figure), the
net CPU time (minus that of a near-empty op run alongside: process start-up and chip elaboration,
which a long-lived simulator such as the TF plugin pays once), the in-process wall and compile
time (JSON), the simulated time, GFLOP/s of emulation (the op's FLOPs / net CPU) and the
timing-only net CPU (functional overhead = net - timing-only net). Totals weight each shape by
its count: the sum of net CPU is the projected wall of one ResNet-50 inference on an unloaded
core (per-op host-side work such as reading the .npy inputs and the CLI's report is included).

Caveat: first-touch page faults of buffers and heap land in whichever op touches them first, so
net figures of one-op processes overstate a long-lived simulator's per-op cost somewhat.

Give --npusim twice to compare two builds: runs alternate between them (so load changes hit both
alike) and the ratios are printed; the JSON holds one entry per binary.

The network (Keras ResNet50, v1: stride 2 on the first 1x1 of a stage's first block): conv1 7x7/2
on the 230x230 zero-padded image, MaxPool 3x3/2 on the 114x114 padded map, 16 bottleneck blocks
(3, 4, 6, 3), Conv2D with bias (BiasAdd), FusedBatchNormV3 (inference) after every conv, Relu,
AddV2 for the shortcuts, Mean over H,W, MatMul 2048x1000 + BiasAdd + Softmax.

Usage: .venv/bin/python benchmarks/bench_sim_speed.py [--npusim build/npusim [--npusim OTHER]]
       [--chip 910b] [--repeat 3] [--only SUBSTRING] [--no-timing-only] [--out FILE]
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shape(*dims):
    return "x".join(str(d) for d in dims)


def resnet50_ops():
    """(name, op, inputs, attrs, flops) for every op of one inference, with repeats."""
    ops = []

    def conv(h, cin, k, cout, stride, padding="SAME"):
        oh = (h - k) // stride + 1 if padding == "VALID" else -(-h // stride)
        flops = 2 * oh * oh * k * k * cin * cout
        ops.append((f"Conv2D {k}x{k}/{stride} {cin}->{cout} @{h}", "Conv2D",
                    [f"f32:{shape(1, h, h, cin)}", f"f32:{shape(k, k, cin, cout)}"],
                    [f"strides=[1,{stride},{stride},1]", f"padding={padding}"], flops))
        post(oh, cout)
        return oh

    def post(h, c):  # BiasAdd of the conv, then FusedBatchNormV3 (inference)
        n = h * h * c
        ops.append((f"BiasAdd {shape(h, h, c)}", "BiasAdd",
                    [f"f32:{shape(1, h, h, c)}", f"f32:{c}"], [], n))
        ops.append((f"FusedBatchNormV3 {shape(h, h, c)}", "FusedBatchNormV3",
                    [f"f32:{shape(1, h, h, c)}"] + [f"f32:{c}"] * 4,
                    ["is_training=false", "epsilon=0.001"], 2 * n))

    def relu(h, c):
        ops.append((f"Relu {shape(h, h, c)}", "Relu", [f"f32:{shape(1, h, h, c)}"], [], h * h * c))

    def add(h, c):
        ops.append((f"AddV2 {shape(h, h, c)}", "AddV2", [f"f32:{shape(1, h, h, c)}"] * 2, [],
                    h * h * c))

    def pad(h, c, p):
        ops.append((f"Pad {shape(h, h, c)} +{p}", "Pad", [f"f32:{shape(1, h, h, c)}"],
                    [f"paddings=[0,0,{p},{p},{p},{p},0,0]"], (h + 2 * p) ** 2 * c))

    pad(224, 3, 3)
    h = conv(230, 3, 7, 64, 2, "VALID")
    relu(h, 64)
    pad(h, 64, 1)
    ops.append(("MaxPool 3x3/2 114x114x64", "MaxPool", [f"f32:{shape(1, 114, 114, 64)}"],
                ["ksize=[1,3,3,1]", "strides=[1,2,2,1]", "padding=VALID"], 56 * 56 * 64 * 9))
    h, cin = 56, 64
    for stage, (blocks, f) in enumerate([(3, 64), (4, 128), (6, 256), (3, 512)]):
        for b in range(blocks):
            stride = 2 if stage > 0 and b == 0 else 1
            if b == 0:
                conv(h, cin, 1, 4 * f, stride)  # shortcut
            oh = conv(h, cin, 1, f, stride)
            relu(oh, f)
            conv(oh, f, 3, f, 1)
            relu(oh, f)
            conv(oh, f, 1, 4 * f, 1)
            add(oh, 4 * f)
            relu(oh, 4 * f)
            h, cin = oh, 4 * f
    ops.append(("Mean 7x7x2048 -> 2048", "Mean", [f"f32:{shape(1, 7, 7, 2048)}"],
                ["axes=[1,2]", "keep_dims=false"], 7 * 7 * 2048))
    ops.append(("MatMul 1x2048x1000", "MatMul", ["f32:1x2048", "f32:2048x1000"], [],
                2 * 2048 * 1000))
    ops.append(("BiasAdd 1x1000", "BiasAdd", ["f32:1x1000", "f32:1000"], [], 1000))
    ops.append(("Softmax 1x1000", "Softmax", ["f32:1x1000"], [], 3 * 1000))
    return ops


NP_TYPES = {"f32": np.float32, "f16": np.float16}


def npy_inputs(inputs, d):
    """Each DTYPE:SHAPE input as a .npy file of uniform [-1, 1) values (seeded), so that the
    simulator process reads its inputs instead of drawing them (as the plugin gets them)."""
    files = []
    rng = np.random.default_rng(7)
    for k, spec in enumerate(inputs):
        dtype, dims = spec.split(":")
        a = rng.uniform(-1, 1, [int(x) for x in dims.split("x")]).astype(NP_TYPES[dtype])
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"in{k}.npy")
        np.save(path, a)
        files.append(path)
    return files


def run_once(npusim, chip, op, inputs, attrs, timing_only, d):
    cmd = [npusim, "op", op, "--chip", chip, "--json", f"{d}/r.json"]
    for i in inputs:
        cmd += ["--input", i]
    for at in attrs:
        cmd += ["--attr", at]
    if timing_only:
        cmd.append("--timing-only")
    with open(f"{d}/log", "w+") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode != 0:
            log.seek(0)
            msg = log.read().strip().splitlines()[-1:] or ["?"]
            raise RuntimeError(msg[0][:200])
    with open(f"{d}/r.json") as f:
        r = json.load(f)
    r["cpu_s"] = ru.ru_utime + ru.ru_stime  # the whole process, start-up included
    return r


def measure(npusims, chip, op, inputs, attrs, timing_only, repeat, d, base_inputs):
    """Per binary: the op's JSON with the smallest process CPU time and wall time over `repeat`
    runs, and the smallest CPU time of the baseline op (BASELINE) run right next to it, so the
    machine's changing load hits both alike; the binaries take turns. Cycles must agree."""
    best = [None] * len(npusims)
    base = [float("inf")] * len(npusims)
    b_op, _, b_attrs = BASELINE
    for _ in range(repeat):
        for j, npusim in enumerate(npusims):
            b = run_once(npusim, chip, b_op, base_inputs, b_attrs, timing_only, d)
            base[j] = min(base[j], b["cpu_s"])
            r = run_once(npusim, chip, op, inputs, attrs, timing_only, d)
            if best[j] is None:
                best[j] = r
                continue
            if r["cycles"] != best[j]["cycles"]:
                raise RuntimeError(f"cycles differ between runs: {r['cycles']} vs "
                                   f"{best[j]['cycles']}")
            for key in ("cpu_s", "wall_s", "compile_s"):
                best[j][key] = min(best[j][key], r[key])
    for j in range(len(npusims)):
        best[j]["base_cpu_s"] = base[j]
        best[j]["net_cpu_s"] = max(best[j]["cpu_s"] - base[j], 0.0)
    return best


# The fixed cost of one `npusim op` process (start-up, chip elaboration, counters, JSON),
# measured on an op with almost no work; a long-lived simulator (the TF plugin) pays it once.
BASELINE = ("Relu", ["f32:1x64"], [])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--npusim", action="append",
                    help="simulator binary (default build/npusim); give two to compare them "
                         "(runs interleaved, ratios printed)")
    ap.add_argument("--chip", default="910b")
    ap.add_argument("--repeat", type=int, default=3, help="runs per shape; the fastest counts")
    ap.add_argument("--only", default="", help="run shapes whose name contains this")
    ap.add_argument("--no-timing-only", action="store_true", help="skip the timing-only runs")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "sim_speed.json"))
    a = ap.parse_args()
    bins = a.npusim or [os.path.join(ROOT, "build", "npusim")]

    counts = collections.OrderedDict()
    spec = {}
    for name, op, inputs, attrs, flops in resnet50_ops():
        counts[name] = counts.get(name, 0) + 1
        spec[name] = (op, inputs, attrs, flops)

    modes = [False] if a.no_timing_only else [False, True]
    results = [[] for _ in bins]
    tot = [collections.Counter() for _ in bins]
    by_op = [collections.Counter() for _ in bins]
    print("cpu = process CPU time (user + sys); net = cpu - the baseline op's (Relu 1x64, the "
          "fixed cost of a process); wall = in-process wall (JSON wall_s); t-only = "
          "timing-only; ms per call, best of --repeat")
    for j, b in enumerate(bins):
        print(f"binary {j}: {b}")
    print(f"\n{'op shape':34} {'n':>3} {'bin':>3} {'cpu':>7} {'net':>7} {'wall':>7} {'comp':>5} "
          f"{'sim us':>7} {'GFLOP/s':>8} {'t-o net':>8} {'n*net':>8}")
    with tempfile.TemporaryDirectory() as d:
        base_inputs = npy_inputs(BASELINE[1], os.path.join(d, "base"))
        for name, n in counts.items():
            if a.only and a.only not in name:
                continue
            op, inputs, attrs, flops = spec[name]
            inputs = npy_inputs(inputs, d)
            try:
                r = {t: measure(bins, a.chip, op, inputs, attrs, t, a.repeat, d, base_inputs)
                     for t in modes}
            except RuntimeError as e:
                print(f"{name:34} FAILED: {e}", flush=True)
                continue
            for j in range(len(bins)):
                f = r[False][j]
                t = r[True][j] if True in r else None
                if t is not None and t["cycles"] != f["cycles"]:
                    print(f"  WARNING: timing-only cycles {t['cycles']} != functional {f['cycles']}")
                if j and f["cycles"] != r[False][0]["cycles"]:
                    print(f"  WARNING: binary {j} gives {f['cycles']} cycles, binary 0 "
                          f"{r[False][0]['cycles']}")
                net = f["net_cpu_s"]
                t_net = t["net_cpu_s"] if t else float("nan")
                gflops = flops / net / 1e9 if net > 0 else float("inf")
                results[j].append({
                    "name": name, "op": op, "count": n, "flops": flops, "cycles": f["cycles"],
                    "time_us": f["time_us"], "cpu_s": f["cpu_s"], "net_cpu_s": net,
                    "base_cpu_s": f["base_cpu_s"], "wall_s": f["wall_s"],
                    "compile_s": f["compile_s"], "timing_only_net_cpu_s": t_net if t else None,
                    "gflops_emulated": gflops})
                c = tot[j]
                c["cpu"] += n * f["cpu_s"]
                c["net"] += n * net
                c["wall"] += n * f["wall_s"]
                c["compile"] += n * f["compile_s"]
                c["sim_us"] += n * f["time_us"]
                c["flops"] += n * flops
                c["t_net"] += n * t_net if t else 0
                by_op[j][op] += n * net
                print(f"{name if j == 0 else '':34} {n if j == 0 else '':>3} {j:3} "
                      f"{1e3 * f['cpu_s']:7.1f} {1e3 * net:7.1f} {1e3 * f['wall_s']:7.1f} "
                      f"{1e3 * f['compile_s']:5.1f} {f['time_us']:7.1f} {gflops:8.2f} "
                      f"{1e3 * t_net:8.1f} {1e3 * n * net:8.1f}", flush=True)

    for j, b in enumerate(bins):
        c = tot[j]
        print(f"\nResNet-50 inference, batch 1 ({sum(counts.values())} ops, counts applied), {b}:")
        print(f"  process CPU, one process per op   {c['cpu']:8.3f} s   (wall {c['wall']:.3f} s)")
        print(f"  net CPU (long-lived simulator)    {c['net']:8.3f} s   (compile "
              f"{c['compile']:.3f} s)  <- projected inference wall")
        if not a.no_timing_only:
            print(f"  net CPU, timing-only              {c['t_net']:8.3f} s   (functional overhead "
                  f"{c['net'] - c['t_net']:.3f} s)")
        print(f"  simulated time                    {c['sim_us']:8.1f} us")
        if c["net"]:
            print(f"  emulation rate                    {c['flops'] / c['net'] / 1e9:8.2f} GFLOP/s "
                  f"({c['flops'] / 1e9:.2f} GFLOP)")
        print("  net CPU by op type: " + ", ".join(f"{k} {v:.3f} s"
                                                  for k, v in by_op[j].most_common()))
    if len(bins) > 1 and tot[0]["net"]:
        for j in range(1, len(bins)):
            print(f"\nbinary {j} / binary 0: process CPU {tot[j]['cpu'] / tot[0]['cpu']:.3f}, "
                  f"net CPU {tot[j]['net'] / tot[0]['net']:.3f}" +
                  ("" if a.no_timing_only else
                   f", functional overhead {(tot[j]['net'] - tot[j]['t_net']) / max(tot[0]['net'] - tot[0]['t_net'], 1e-9):.3f}"))
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump([{"npusim": b, "chip": a.chip, "ops": results[j],
                    "total": {"cpu_s": tot[j]["cpu"], "net_cpu_s": tot[j]["net"],
                              "wall_s": tot[j]["wall"], "compile_s": tot[j]["compile"],
                              "timing_only_net_cpu_s": tot[j]["t_net"],
                              "sim_us": tot[j]["sim_us"], "flops": tot[j]["flops"]}}
                   for j, b in enumerate(bins)], f, indent=1)
    print(f"written {a.out}")


if __name__ == "__main__":
    sys.exit(main())
