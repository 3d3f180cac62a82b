"""End-to-end checks of the `npusim` command line against numpy references.

Usage: cli_checks.py NPUSIM_BINARY SOURCE_DIR. Prints 'N passed, N failed' and exits non-zero
on any failure.
"""
import json
import os
import resource
import subprocess
import sys
import tempfile

import numpy as np

NPUSIM, ROOT = sys.argv[1], sys.argv[2]
KERNELS = os.path.join(ROOT, "kernels")
results = []


def limit_memory():
    """Bounds a regressed input reader: 8 GiB of address space (the tiny chip needs far less)."""
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, resource.RLIM_INFINITY))


def run(*args, expect_rc=0, timeout=600, bounded=False):
    """npusim ARGS; bounded: at most 8 GiB of address space (the timeout ends a hang)."""
    p = subprocess.run([NPUSIM, *args], capture_output=True, text=True, timeout=timeout,
                       preexec_fn=limit_memory if bounded else None)
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


@check("vadd on the tiny chip matches numpy, with counters and trace")
def _(d):
    rng = np.random.default_rng(1)
    n = 3 * 8192 + 48  # several tiles per block and a partial last tile
    x = rng.uniform(-4, 4, n).astype(np.float16)
    y = rng.uniform(-4, 4, n).astype(np.float16)
    np.save(f"{d}/x.npy", x)
    np.save(f"{d}/y.npy", y)
    run("run", f"{KERNELS}/vadd_f16.s", "--chip", "tiny", "--in", f"x={d}/x.npy",
        "--in", f"y={d}/y.npy", "--out", f"z={d}/z.npy:f16:{n}", "--arg", f"n={n}",
        "--counters", f"{d}/c.json", "--trace", f"{d}/t.json")
    z = np.load(f"{d}/z.npy")
    # numpy adds float16 by rounding the exact sum once, as the vector unit does.
    assert z.dtype == np.float16 and z.shape == (n,)
    assert np.array_equal(z, x + y), "vadd result differs from numpy"
    counters = json.load(open(f"{d}/c.json"))
    assert counters["run"]["cycles"] > 0
    trace = json.load(open(f"{d}/t.json"))
    assert len(trace["traceEvents"]) > 0


# Extreme chip values (the reproducers of issue 18): each is refused at load, naming the key and
# its range, instead of crashing or simulating forever; a timeout turns a regression into a failure.
@check("extreme config values are refused naming the key and the allowed range")
def _(d):
    cases = {
        "memory.hbm.bytes=18446744073709551615": "from 1 to 256 TiB",
        "memory.hbm.bytes=1152921504606846976": "from 1 to 256 TiB",
        "memory.hbm.gbps=1e-300": "bytes per cycle",
        "clock_mhz=1e300": "(0, 1e+06]",
        "clock_mhz=1e20": "(0, 1e+06]",
        "paths.gm->ub.bytes_per_cycle=1e-300": "[9.53674e-07, 2.81475e+17]",
        "paths.ub->gm.bytes_per_cycle=1e-300": "[9.53674e-07, 2.81475e+17]",
        "memory.l2.gbps=1e-300": "bytes per cycle",
        "memory.l2.core_read_bytes_per_cycle=1e-300": "[9.53674e-07, 2.81475e+17]",
        "memory.l2.core_write_bytes_per_cycle=1e-300": "[9.53674e-07, 2.81475e+17]",
    }
    for override, allowed in cases.items():
        p = run("op", "AddV2", "--input", "f16:1024", "--input", "f16:1024", "--chip", "tiny",
                "--set", override, "--timing-only", expect_rc=1, timeout=60)
        key = override.split("=")[0]
        assert f"key '{key}'" in p.stderr and allowed in p.stderr, (override, p.stderr)


SPIN_COPY = """.kernel spin_copy
.arg src
.section aiv
    ldarg x1, src
    movi x2, 0
spin:
    copy_gm2ub x2, x1, 1, 1, 0, 0
    jmp spin
    end
"""


@check("the watchdog stops an endless loop, naming --max-insns-per-block, which sets it")
def _(d):
    open(f"{d}/spin.s", "w").write(SPIN_COPY)
    np.save(f"{d}/src.npy", np.zeros(16, np.float16))
    spin = ("run", f"{d}/spin.s", "--chip", "tiny", "--blocks", "1", "--in", f"src={d}/src.npy")
    # The default budget: 2^23 instructions for this launch of 32 bytes of tensors.
    p = run(*spin, expect_rc=3, timeout=120)
    assert "watchdog" in p.stderr and f"more than {2**23} instructions" in p.stderr, p.stderr
    assert "--max-insns-per-block" in p.stderr and "NPUSIM_MAX_INSNS_PER_BLOCK" in p.stderr, p.stderr
    p = run(*spin, "--max-insns-per-block", "1000", expect_rc=3, timeout=60)
    assert "more than 1000 instructions" in p.stderr, p.stderr
    # npusim op: AddV2 of 3 x 2 KiB is one 128 KiB unit; 8 instructions end any kernel.
    p = run("op", "AddV2", "--input", "f16:1024", "--input", "f16:1024", "--chip", "tiny",
            "--max-insns-per-block", "8", expect_rc=3, timeout=60)
    assert "more than 8 instructions" in p.stdout, p.stdout  # op reports launches on stdout


@check("a large valid launch gets a budget scaled to its data (stateless random on tiny)")
def _(d):
    # 2^20 f32 of Philox on the vector unit: 4 blocks of 64 tiles, 115-132 k instructions per
    # block (2026-12-04), above the floor of 2 * 10^4 but within 2 * 10^4 per 128 KiB of its
    # 4 MiB.
    np.save(f"{d}/shape.npy", np.array([1024, 1024], np.int32))
    np.save(f"{d}/key.npy", np.array([7], np.int64))
    np.save(f"{d}/counter.npy", np.array([0, 0], np.int64))
    np.save(f"{d}/alg.npy", np.array(1, np.int32))
    args = ["op", "StatelessRandomUniformV2", "--input", f"{d}/shape.npy",
            "--input", f"{d}/key.npy", "--input", f"{d}/counter.npy", "--input", f"{d}/alg.npy",
            "--attr", "dtype=f32", "--attr", "shape=[1024,1024]", "--chip", "tiny",
            "--timing-only", "--json", f"{d}/op.json"]
    run(*args, "--max-insns-per-block", "20000", timeout=300)
    figures = json.load(open(f"{d}/op.json"))
    assert figures["cycles"] > 5 * 10**5, figures  # ~1.03 M (2026-12-04)
    # A tenth of the budget is too little for it: 2000 per 128 KiB of its tensors (the 4 MiB
    # output and 36 bytes of inputs), so a block ran more than 66 k instructions, above the floor.
    units = -(-(4 * 2**20 + 8 + 4 + 8 + 16) // (128 * 1024))
    p = run(*args, "--max-insns-per-block", "2000", expect_rc=3, timeout=300)
    assert "watchdog" in p.stdout and f"more than {units * 2000} instructions" in p.stdout, \
        p.stdout


def gemm_matches_numpy(d, chip, M, N, K, seed, out_spec=True):
    """out_spec: spell out c's type (--out c=c.npy:f16:MxN) or let the kernel's .arg give it."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (M, K)).astype(np.float16)
    b = rng.uniform(-1, 1, (K, N)).astype(np.float16)
    np.save(f"{d}/a.npy", a)
    np.save(f"{d}/b.npy", b)
    out = f"c={d}/c.npy:f16:{M}x{N}" if out_spec else f"c={d}/c.npy"
    run("run", f"{KERNELS}/gemm_f16.s", "--chip", chip, "--in", f"a={d}/a.npy",
        "--in", f"b={d}/b.npy", "--out", out,
        "--arg", f"M={M}", "--arg", f"N={N}", "--arg", f"K={K}", "--counters", f"{d}/k.json")
    c = np.load(f"{d}/c.npy")
    assert c.dtype == np.float16 and c.shape == (M, N), (c.dtype, c.shape)
    c = c.astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    # fp32 accumulation then one rounding to fp16: relative error about 2^-11.
    err = np.abs(c - ref)
    assert np.all(err <= 1e-3 + 1e-3 * np.abs(ref)), f"max error {err.max()}"
    return json.load(open(f"{d}/k.json"))


def blocks_run(counters, kind):
    """Cores of a kind ('aic', 'aiv') that completed at least one block."""
    chip = counters["counters"]["chip"]
    return sum(1 for name, node in chip.items()
               if name.startswith(kind) and node.get("blocks", {}).get("value", 0) > 0)


@check("gemm on the tiny chip matches numpy, --out typed by the kernel")
def _(d):
    gemm_matches_numpy(d, "tiny", 256, 512, 512, 2, out_spec=False)


@check("gemm on the 910B-like chip matches numpy, every cube core busy")
def _(d):
    # 768 x 1024 is 6 x 4 = 24 output tiles of 128 x 256: one per cube core.
    counters = gemm_matches_numpy(d, "910b", 768, 1024, 256, 3)
    assert blocks_run(counters, "aic") == 24


@check("vadd on the 910B-like chip matches numpy, every vector core busy")
def _(d):
    rng = np.random.default_rng(4)
    n = 48 * 4096 + 16 * 7
    x = rng.uniform(-8, 8, n).astype(np.float16)
    y = rng.uniform(-8, 8, n).astype(np.float16)
    np.save(f"{d}/x.npy", x)
    np.save(f"{d}/y.npy", y)
    run("run", f"{KERNELS}/vadd_f16.s", "--chip", "910b", "--in", f"x={d}/x.npy",
        "--in", f"y={d}/y.npy", "--out", f"z={d}/z.npy:f16:{n}", "--arg", f"n={n}",
        "--counters", f"{d}/k.json")
    assert np.array_equal(np.load(f"{d}/z.npy"), x + y)
    assert blocks_run(json.load(open(f"{d}/k.json")), "aiv") == 48


@check("timing-only mode gives the same cycles as functional mode")
def _(d):
    n = 8192
    np.save(f"{d}/x.npy", np.ones(n, np.float16))
    common = ["run", f"{KERNELS}/vadd_f16.s", "--chip", "tiny", "--in", f"x={d}/x.npy",
              "--in", f"y={d}/x.npy", "--out", f"z={d}/z.npy:f16:{n}", "--arg", f"n={n}"]
    run(*common, "--counters", f"{d}/f.json")
    run(*common, "--counters", f"{d}/t.json", "--timing-only")
    f, t = json.load(open(f"{d}/f.json")), json.load(open(f"{d}/t.json"))
    assert f["run"]["cycles"] == t["run"]["cycles"]


@check("bad inputs give clear errors and exit 1")
def _(d):
    p = run("run", f"{d}/missing.s", "--chip", "tiny", expect_rc=1)
    assert "missing.s" in p.stderr
    with open(f"{d}/bad.s", "w") as f:
        f.write(".section aiv\n    movi x1, 5\n    vbogus x1\n    end\n")
    p = run("run", f"{d}/bad.s", "--chip", "tiny", expect_rc=1)
    assert "bad.s:3:" in p.stderr, p.stderr
    p = run("config", "--chip", "tiny", "--set", "cores.aic.cuont=3", expect_rc=1)
    assert "cuont" in p.stderr, p.stderr
    p = run("run", f"{KERNELS}/vadd_f16.s", "--chip", "nosuchchip", expect_rc=1)
    assert "nosuchchip" in p.stderr
    np.save(f"{d}/x.npy", np.ones(16, np.float16))
    p = run("run", f"{KERNELS}/vadd_f16.s", "--chip", "tiny", "--in", f"x={d}/x.npy",
            "--in", f"y={d}/x.npy", "--out", f"z={d}/z.npy:f16:16", expect_rc=1)
    assert "'n'" in p.stderr, p.stderr  # the missing argument is named


@check("npusim op refuses tensors too large for the device or for int64, naming op and shape")
def _(d):
    # 2^62 bytes of input: refused by the device memory before any host buffer is made (before:
    # "std::bad_alloc", no op named).
    p = run("op", "Neg", "--input", "f32:1073741824x1073741824", "--chip", "tiny",
            "--timing-only", expect_rc=1, bounded=True)
    assert "Neg(f32[1073741824,1073741824]) input 0:" in p.stderr, p.stderr
    assert "do not fit in the device memory" in p.stderr, p.stderr
    # A shape attribute whose bytes pass 2^63 (before: compiled, the output's byte count
    # wrapped to 0 and the launch faulted outside device memory).
    p = run("op", "BroadcastTo", "--input", "f32:1", "--attr", "shape=[2147483648,2147483648]",
            "--chip", "tiny", "--timing-only", expect_rc=1, bounded=True)
    assert "BroadcastTo(f32[1]): shape f32[2147483648,2147483648] is too large" in p.stderr, \
        p.stderr


@check("vadd with --out typed by the kernel (no :DTYPE:SHAPE) matches numpy")
def _(d):
    rng = np.random.default_rng(5)
    n = 8192 + 32
    x = rng.uniform(-4, 4, n).astype(np.float16)
    y = rng.uniform(-4, 4, n).astype(np.float16)
    np.save(f"{d}/x.npy", x)
    np.save(f"{d}/y.npy", y)
    run("run", f"{KERNELS}/vadd_f16.s", "--chip", "tiny", "--in", f"x={d}/x.npy",
        "--in", f"y={d}/y.npy", "--out", f"z={d}/z.npy", "--arg", f"n={n}", "--quiet")
    z = np.load(f"{d}/z.npy")
    assert z.dtype == np.float16 and z.shape == (n,), (z.dtype, z.shape)
    assert np.array_equal(z, x + y)


def vadd_args(d, x="x.npy", y="y.npy", z="z.npy", n=64):
    return ["run", f"{KERNELS}/vadd_f16.s", "--chip", "tiny", "--in", f"x={d}/{x}",
            "--in", f"y={d}/{y}", "--out", f"z={d}/{z}", "--arg", f"n={n}", "--quiet"]


@check("an --in .npy of the wrong dtype exits 1 naming argument, file and both dtypes")
def _(d):
    np.save(f"{d}/x.npy", np.ones(64, np.float16))
    np.save(f"{d}/y.npy", np.ones(64, np.float32))
    p = run(*vadd_args(d), expect_rc=1)
    assert "argument 'y'" in p.stderr and f"{d}/y.npy" in p.stderr, p.stderr
    assert "float16" in p.stderr and "float32" in p.stderr, p.stderr
    assert not os.path.exists(f"{d}/z.npy")


@check("an --in .npy of the wrong shape exits 1 naming argument, file and both shapes")
def _(d):
    np.save(f"{d}/x.npy", np.ones(64, np.float16))
    np.save(f"{d}/y.npy", np.ones(64, np.float16))
    p = run(*vadd_args(d, n=48), expect_rc=1)  # n disagrees with the arrays
    assert "argument 'x'" in p.stderr and "(48,)" in p.stderr and "(64,)" in p.stderr, p.stderr
    np.save(f"{d}/y.npy", np.ones((8, 8), np.float16))  # right size, wrong rank
    p = run(*vadd_args(d), expect_rc=1)
    assert "argument 'y'" in p.stderr and "(8, 8)" in p.stderr, p.stderr
    # gemm: b is K x N, given N x K.
    M, N, K = 128, 256, 512
    np.save(f"{d}/a.npy", np.ones((M, K), np.float16))
    np.save(f"{d}/b.npy", np.ones((N, K), np.float16))
    p = run("run", f"{KERNELS}/gemm_f16.s", "--chip", "tiny", "--in", f"a={d}/a.npy",
            "--in", f"b={d}/b.npy", "--out", f"c={d}/c.npy", "--arg", f"M={M}",
            "--arg", f"N={N}", "--arg", f"K={K}", expect_rc=1)
    assert "argument 'b'" in p.stderr and f"{d}/b.npy" in p.stderr, p.stderr
    assert f"({K}, {N})" in p.stderr and f"({N}, {K})" in p.stderr, p.stderr


@check("--out specs must agree with typed arguments; untyped ones need a spec")
def _(d):
    np.save(f"{d}/x.npy", np.ones(64, np.float16))
    np.save(f"{d}/y.npy", np.ones(64, np.float16))
    run(*vadd_args(d, z="z.npy:f16:64"))  # a spec that agrees is fine
    p = run(*vadd_args(d, z="z.npy:f32:64"), expect_rc=1)
    assert "argument 'z'" in p.stderr and "f32" in p.stderr, p.stderr
    p = run(*vadd_args(d, z="z.npy:f16:32"), expect_rc=1)
    assert "argument 'z'" in p.stderr and "(32,)" in p.stderr, p.stderr
    with open(f"{d}/raw.s", "w") as f:
        f.write(".arg dst\n.section aiv\n    end\n")
    p = run("run", f"{d}/raw.s", "--chip", "tiny", "--out", f"dst={d}/o.npy", expect_rc=1)
    assert "argument 'dst'" in p.stderr and "untyped" in p.stderr, p.stderr
    run("run", f"{d}/raw.s", "--chip", "tiny", "--out", f"dst={d}/o.npy:s8:3x5", "--quiet")
    assert np.load(f"{d}/o.npy").shape == (3, 5)
    p = run(*vadd_args(d), "--arg", "n=64", expect_rc=1)
    assert "already given" in p.stderr, p.stderr


@check("bf16 arguments take uint16 .npy files; literal and any-shape dims")
def _(d):
    with open(f"{d}/t.s", "w") as f:
        f.write(".arg src, bf16[R, 4]\n.arg any, s8\n.arg dst, bf16[R, 4]\n.arg R\n"
                ".section aiv\n    end\n")
    np.save(f"{d}/src.npy", np.zeros((2, 4), np.uint16))
    np.save(f"{d}/any.npy", np.zeros((3, 1, 7), np.int8))
    run("run", f"{d}/t.s", "--chip", "tiny", "--in", f"src={d}/src.npy", "--in",
        f"any={d}/any.npy", "--out", f"dst={d}/dst.npy", "--arg", "R=2", "--quiet")
    out = np.load(f"{d}/dst.npy")
    assert out.dtype == np.uint16 and out.shape == (2, 4), (out.dtype, out.shape)
    np.save(f"{d}/src.npy", np.zeros((2, 4), np.float16))
    p = run("run", f"{d}/t.s", "--chip", "tiny", "--in", f"src={d}/src.npy", "--in",
            f"any={d}/any.npy", "--out", f"dst={d}/dst.npy", "--arg", "R=2", expect_rc=1)
    assert "argument 'src'" in p.stderr and "uint16" in p.stderr and "bf16" in p.stderr, p.stderr
    np.save(f"{d}/src.npy", np.zeros((2, 4), np.uint16))
    np.save(f"{d}/any.npy", np.zeros(4, np.uint8))
    p = run("run", f"{d}/t.s", "--chip", "tiny", "--in", f"src={d}/src.npy", "--in",
            f"any={d}/any.npy", "--out", f"dst={d}/dst.npy", "--arg", "R=2", expect_rc=1)
    assert "argument 'any'" in p.stderr and "int8" in p.stderr, p.stderr


@check("a faulting kernel exits 3 naming core, pc and instruction")
def _(d):
    with open(f"{d}/oob.s", "w") as f:
        # the UB address comes from an argument, so only the running kernel can see it is bad
        f.write(".arg where\n.section aiv\n    ldarg x1, where\n    movi x2, 0\n"
                "    copy_gm2ub x1, x2, 1, 1, 0, 0\n    end\n")
    p = run("run", f"{d}/oob.s", "--chip", "tiny", "--blocks", "1", "--arg", "where=0x7fffffe0",
            expect_rc=3)
    assert "pc 2" in p.stderr and "copy_gm2ub" in p.stderr, p.stderr


@check("asm, disasm and verify round trip")
def _(d):
    run("asm", f"{KERNELS}/gemm_f16.s", "-o", f"{d}/g.npuk")
    text = run("disasm", f"{d}/g.npuk").stdout
    assert "mmad.f16" in text
    assert ".arg a, f16[M, K]\n" in text and ".arg M\n" in text, text  # types survive the binary
    with open(f"{d}/g2.s", "w") as f:
        f.write(text)
    run("asm", f"{d}/g2.s", "-o", f"{d}/g2.npuk")
    assert open(f"{d}/g.npuk", "rb").read()[:16] == open(f"{d}/g2.npuk", "rb").read()[:16]
    run("verify", f"{KERNELS}/gemm_f16.s", "--chip", "910b")
    with open(f"{d}/big.s", "w") as f:  # an L1 destination past 256 KiB, known statically
        f.write(".section aic\n    movi x1, 300000\n    movi x2, 0\n"
                "    copy_gm2l1 x1, x2, 1, 1, 0, 0\n    end\n")
    run("verify", f"{d}/big.s", "--chip", "910b")
    p = run("verify", f"{d}/big.s", "--chip", "910b", "--set", "cores.aic.buffers.l1=256 KiB",
            expect_rc=1)
    assert "big.s:4:" in p.stderr, p.stderr


@check("verify: bf16 arithmetic refused where vector.bf16_arithmetic is false")
def _(d):
    with open(f"{d}/bf16.s", "w") as f:
        f.write(".section aiv\n    movi x1, 0\n    movi x2, 1024\n"
                "    vconv.f32.bf16 x2, x1, 1, 1, 1, 8, 4, 0\n"
                "    vmax.bf16 x2, x1, x1, 1, 1, 1, 1, 8, 8, 8\n    end\n")
    p = run("verify", f"{d}/bf16.s", "--chip", "910b", expect_rc=1)
    assert "bf16.s:5:" in p.stderr and "vmax.bf16 (@3)" in p.stderr, p.stderr
    assert "vector.bf16_arithmetic is false" in p.stderr and "910b.yaml" in p.stderr, p.stderr
    assert "bf16.s:4:" not in p.stderr, p.stderr  # vconv takes bf16 on the 910B
    run("verify", f"{d}/bf16.s", "--chip", "910b", "--set", "vector.bf16_arithmetic=true")
    for chip in ("910", "310p"):  # no bf16 at all there, not even vconv (docs/validation.md)
        p = run("verify", f"{d}/bf16.s", "--chip", chip, expect_rc=1)
        assert "bf16.s:4:" in p.stderr and "vector.bf16_conversion is false" in p.stderr, p.stderr


@check("every preset runs the vector-add smoke kernel")
def _(d):
    out = run("chips").stdout
    presets = [line.split()[0] for line in out.splitlines() if line.strip()]
    assert {"910b", "910", "310p", "tiny"} <= set(presets), presets
    n = 4096
    x = np.arange(n, dtype=np.float16) / 64
    np.save(f"{d}/x.npy", x)
    for chip in presets:
        run("run", f"{KERNELS}/vadd_f16.s", "--chip", chip, "--in", f"x={d}/x.npy",
            "--in", f"y={d}/x.npy", "--out", f"z={d}/z.npy:f16:{n}", "--arg", f"n={n}", "--quiet")
        assert np.array_equal(np.load(f"{d}/z.npy"), x + x), chip


@check("npusim op runs compiled TF ops on the chip, matching numpy")
def _(d):
    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, (37, 50)).astype(np.float32)
    y = rng.uniform(-2, 2, (50,)).astype(np.float32)
    np.save(f"{d}/x.npy", x)
    np.save(f"{d}/y.npy", y)
    out = run("op", "AddV2", "--input", f"{d}/x.npy", "--input", f"{d}/y.npy",
              "--output", f"{d}/z.npy", "--chip", "tiny", "--json", f"{d}/op.json").stdout
    assert "op total" in out, out
    assert np.array_equal(np.load(f"{d}/z.npy"), x + y)  # fp32 add: exact
    a = rng.uniform(-1, 1, (40, 72)).astype(np.float16)
    b = rng.uniform(-1, 1, (72, 24)).astype(np.float16)
    np.save(f"{d}/a.npy", a)
    np.save(f"{d}/b.npy", b)
    run("op", "MatMul", "--input", f"{d}/a.npy", "--input", f"{d}/b.npy",
        "--output", f"{d}/c.npy", "--chip", "tiny", "--json", f"{d}/mm.json",
        "--report-dir", f"{d}/rep", "--trace", f"{d}/mm_trace.json")
    ref = a.astype(np.float64) @ b.astype(np.float64)
    c = np.load(f"{d}/c.npy").astype(np.float64)
    # fp32 accumulation of exact fp16 products, one rounding to fp16 (2^-11 relative)
    assert np.all(np.abs(c - ref) <= 1e-3 + 1e-3 * np.abs(ref)), np.abs(c - ref).max()
    figures = json.load(open(f"{d}/mm.json"))
    assert figures["cycles"] > 0 and figures["cube_utilization_pct"] > 0
    assert os.path.exists(f"{d}/rep/op_summary.csv")
    # --trace: the timeline holds the launch's mmad on a cube lane
    events = json.load(open(f"{d}/mm_trace.json"))["traceEvents"]
    assert any(e.get("ph") == "X" and e["name"].startswith("mmad") for e in events)
    p = run("op", "NoSuchOp", "--input", "f32:4", "--chip", "tiny", expect_rc=1)
    assert "NoSuchOp" in p.stderr and "not supported" in p.stderr, p.stderr


@check("devices, FIFOs and directories as input files are refused, naming the file")
def _(d):
    fifo = f"{d}/x.npy"  # a FIFO with a .npy name: opening it must not wait for a writer
    os.mkfifo(fifo)
    for path, kind in [("/dev/zero", "a character device"), ("/dev/urandom", "a character device"),
                       (fifo, "a FIFO (named pipe)"), (d, "a directory")]:
        for args, what in [(["verify", path, "--chip", "tiny"], "assembly file"),
                           (["disasm", path], "assembly file"),
                           (["asm", path, "-o", f"{d}/k.npuk"], "assembly file"),
                           (["run", f"{KERNELS}/vadd_f16.s", "--chip", "tiny", "--in",
                             f"x={path}", "--in", f"y={path}", "--out", f"z={d}/z.npy",
                             "--arg", "n=64"], "npy file")]:
            p = run(*args, expect_rc=1, timeout=60, bounded=True)
            assert f"{path}: {what} is {kind}, not a regular file" in p.stderr, (args, p.stderr)
            assert f"--in x={path}: " in p.stderr or args[0] != "run", p.stderr
        p = run("config", "--chip", path, expect_rc=1, timeout=60, bounded=True)
        assert path in p.stderr, p.stderr
    p = run("op", "AddV2", "--input", fifo, "--input", fifo, "--chip", "tiny", expect_rc=1,
            timeout=60, bounded=True)
    assert f"{fifo}: npy file is a FIFO (named pipe), not a regular file" in p.stderr, p.stderr
    # A chip config over its 16 MiB limit (sparse: nothing is written) is refused by its size.
    big = f"{d}/big.yaml"
    with open(big, "w") as f:
        f.truncate((16 << 20) + 1)
    p = run("config", "--chip", big, expect_rc=1, timeout=60, bounded=True)
    assert f"{big}: chip config is {(16 << 20) + 1} bytes, more than the limit of {16 << 20} " \
        "bytes" in p.stderr, p.stderr
    # A binary kernel (.npuk by name) goes through the same check.
    os.mkfifo(f"{d}/k.npuk")
    p = run("disasm", f"{d}/k.npuk", expect_rc=1, timeout=60, bounded=True)
    assert f"{d}/k.npuk: kernel file is a FIFO (named pipe), not a regular file" in p.stderr, \
        p.stderr


@check("an expression nested 17,000 parentheses deep is an error naming line, column, limit")
def _(d):
    n = 17000
    with open(f"{d}/deep.s", "w") as f:
        f.write("nop\nmovi x1, " + "(" * n + "1" + ")" * n + "\nend\n")
    # kMaxExprDepth (isa/assembler.h) is 256: the 257th '(' is at column 10 + 256.
    want = f"{d}/deep.s:2:266: expression nested more than 256 levels deep"
    for args in (["verify", f"{d}/deep.s", "--chip", "tiny"], ["asm", f"{d}/deep.s", "-o",
                 f"{d}/deep.npuk"], ["disasm", f"{d}/deep.s"],
                 ["run", f"{d}/deep.s", "--chip", "tiny"]):
        p = run(*args, expect_rc=1, timeout=60, bounded=True)
        assert want in p.stderr, (args, p.stderr)


@check("op --before: a zero fill's dirty L2 lines are written back by the op's reads (kept L2)")
def _(d):
    # The tiny chip's L2 (8 MiB, from its config) filled with dirty lines by a ZerosLike of its
    # size, then a Mean reading 4 MiB: with a kept, write-back L2 every line the Mean brings in
    # evicts one dirty line, so HBM carries 4 MiB more (plus the few lines of its partial results
    # and output); with the L2 cold at every launch the fill leaves nothing and changes nothing.
    import yaml
    with open(os.path.join(ROOT, "configs", "chips", "tiny.yaml")) as f:
        l2 = yaml.safe_load(f)["memory"]["l2"]
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    num, unit = str(l2["bytes"]).split()
    l2_bytes = int(num) * units[unit]
    fill = f"ZerosLike:f32:{l2_bytes // 4}"
    in_bytes = 4 << 20
    assert in_bytes <= l2_bytes

    def op(*extra):
        out = f"{d}/op.json"
        run("op", "Mean", "--input", f"f32:1024x{in_bytes // 4096}", "--attr", "axes=[0,1]",
            "--chip", "tiny", "--timing-only", "--json", out, *extra)
        with open(out) as f:
            j = json.load(f)
        return j["hbm_bytes"], j["cycles"]

    kept = ["--set", "memory.l2.keep_across_launches=true", "--set", "memory.l2.write_back=true"]
    hbm0, cyc0 = op(*kept)
    hbm1, cyc1 = op(*kept, "--before", fill)
    assert in_bytes <= hbm1 - hbm0 <= in_bytes + (64 << 10), (hbm0, hbm1)
    assert cyc1 > cyc0, (cyc0, cyc1)
    assert op() == op("--before", fill), "a cold L2 must not see the fill"
    p = run("op", "Mean", "--input", "f32:64x64", "--attr", "axes=[0,1]", "--chip", "tiny",
            "--timing-only", "--before", "ZerosLike", expect_rc=1)
    assert "--before 'ZerosLike': expected OP:DTYPE:SHAPE" in p.stderr, p.stderr
    p = run("op", "Mean", "--input", "f32:64x64", "--attr", "axes=[0,1]", "--chip", "tiny",
            "--timing-only", "--before", "Nope:f32:4", expect_rc=1)
    assert "--before 'Nope:f32:4': Nope(f32[4]): op Nope is not supported" in p.stderr, p.stderr



@check("op --attr takes a string list: a FusedElementwise chain matches numpy bit for bit")
def _(d):
    # Items that are not all integers make a list(string) attribute (the chain's steps); each
    # f32 step rounds as numpy's f32 operation does.
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 96)).astype(np.float32)
    y = rng.normal(size=(4, 96)).astype(np.float32)
    np.save(f"{d}/x.npy", x)
    np.save(f"{d}/y.npy", y)
    run("op", "FusedElementwise", "--input", f"{d}/x.npy", "--input", f"{d}/y.npy",
        "--attr", "steps=[Mul i0 i1,AddV2 s0 i1,Sub s1 i0]", "--chip", "tiny",
        "--output", f"{d}/o.npy")
    assert np.array_equal(np.load(f"{d}/o.npy"), (x * y + y) - x)
    p = run("op", "FusedElementwise", "--input", f"{d}/x.npy", "--attr", "steps=[Mul i0 i3]",
            "--chip", "tiny", expect_rc=1)
    assert "step 0 'Mul i0 i3'" in p.stderr, p.stderr


@check("op --host-loop: an eager host running ahead of the device, host- or device-bound")
def _(d):
    # The loop's time from the op's own Task Durations (every call of a cold-L2 op is alike) and
    # host.op_dispatch_us, by the max-plus recurrence of a host that issues call c at
    # (c + 1) x issue and a device that starts it when both it and the previous call are done.
    def op(size, issue_us, calls, warmup=0, *extra):
        out = f"{d}/op.json"
        p = run("op", "MatMul", "--input", f"f16:{size}x{size}", "--input", f"f16:{size}x{size}",
                "--chip", "tiny", "--timing-only", "--set", f"host.op_dispatch_us={issue_us}",
                "--host-loop", str(calls), "--host-warmup", str(warmup), "--json", out, *extra)
        with open(out) as f:
            return json.load(f), p.stdout

    def recurrence(issue, call_cycles):
        host = device = 0
        for c in call_cycles:
            host += issue
            device = max(device, host) + c
        return device

    for size, issue_us, want in ((64, 50, "host"), (256, 0.5, "device")):
        j, text = op(size, issue_us, 5, warmup=2)
        mhz = j["cycles"] / j["time_us"]  # the chip's clock (tiny extends the 910b preset)
        issue, per_call = round(issue_us * mhz), [l["cycles"] for l in j["launches"]]
        device = recurrence(issue, [sum(per_call)] * 5)
        loop = j["host_loop"]
        assert loop["call_cycles"] == [sum(per_call)] * 5, loop
        assert loop["loop_cycles"] == device, (loop, device)
        assert abs(loop["per_call_us"] - device / mhz / 5) < 1e-9, loop
        assert loop["bound"] == want and loop["calls"] == 5 and loop["warmup"] == 2, loop
        assert abs(loop["device_busy_us"] - 5 * sum(per_call) / mhz) < 1e-9, loop
        assert f"{want}-bound" in text, text
    j, _ = op(64, 0, 1)
    assert j["host_loop"]["loop_cycles"] == j["cycles"], j["host_loop"]
    # A kept L2: every call runs; the second finds the first's lines in the L2 and is faster
    # than the first, which starts cold; a warm-up makes the first call a warm one too.
    cold, _ = op(256, 0.5, 1)
    kept = ("--set", "memory.l2.keep_across_launches=true")
    j, _ = op(256, 0.5, 3, 0, *kept)
    loop = j["host_loop"]
    assert loop["call_cycles"][0] == j["cycles"] == cold["cycles"], (loop, cold["cycles"])
    assert loop["call_cycles"][1] < loop["call_cycles"][0], loop
    assert loop["loop_cycles"] == recurrence(round(0.5 * mhz), loop["call_cycles"]), loop
    j, _ = op(256, 0.5, 3, 1, *kept)
    assert j["host_loop"]["call_cycles"][0] < cold["cycles"], j["host_loop"]
    p = run("op", "MatMul", "--input", "f16:64x64", "--input", "f16:64x64", "--chip", "tiny",
            "--timing-only", "--host-warmup", "2", expect_rc=1)
    assert "--host-warmup needs --host-loop" in p.stderr, p.stderr
    p = run("op", "MatMul", "--input", "f16:64x64", "--input", "f16:64x64", "--chip", "tiny",
            "--timing-only", "--host-loop", "-1", expect_rc=1)
    assert "--host-loop -1" in p.stderr, p.stderr



@check("benchmarks/kernels/nd2nz_load.s loads what its arguments say")
def _(d):
    # GM -> L1 bytes = the matrix (M x N fp16) x REPEAT, x the blocks when every block loads all.
    kernel = os.path.join(ROOT, "benchmarks", "kernels", "nd2nz_load.s")
    M, N = 96, 200  # 200 columns: slices of 100 in tiles of 64 and 36 (a short last tile)
    for every, stagger, slices, repeat in [(0, 0, 1, 1), (0, 0, 2, 3), (1, 0, 1, 1), (1, 1, 2, 1)]:
        run("run", kernel, "--chip", "tiny", "--timing-only", "--out", f"x={d}/x.npy:f16:{M}x{N}",
            "--arg", f"M={M}", "--arg", f"N={N}", "--arg", "TR=16", "--arg", "TC=64",
            "--arg", f"EVERY={every}", "--arg", f"STAGGER={stagger}", "--arg", f"SLICES={slices}",
            "--arg", f"REPEAT={repeat}", "--json", f"{d}/r.json", "--quiet")
        r = json.load(open(f"{d}/r.json"))
        want = M * N * 2 * repeat * (r["block_dim"] if every else 1)
        assert r["activity"]["bytes.gm_to_l1"] == want, (every, stagger, slices, repeat, r)

@check("vaddreluconv (AddReluCast) on the 310p matches numpy; the 910 refuses it")
def _(d):
    # f16(max(a + b, 0)): the f32 sum, ReLU, rounded to nearest even, saturating at 65504 (the
    # conversion rules' default overflow mode); a NaN sum stays NaN.
    n = 512
    rng = np.random.default_rng(7)
    a = rng.uniform(-8, 8, n).astype(np.float32)
    b = rng.uniform(-8, 8, n).astype(np.float32)
    special = np.array([-1.0, -0.0, 0.0, 6.0, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 2049.0, 65504.0,
                        65519.0, 65520.0, 1e6, np.inf, -np.inf, np.nan, 2.0**-20, 2.0**-30],
                       np.float32)
    a[:special.size] = special
    b[:special.size] = 0
    a[special.size] = 40000.0  # two finite sources whose sum overflows f16
    b[special.size] = 40000.0
    np.save(f"{d}/a.npy", a)
    np.save(f"{d}/b.npy", b)
    with open(f"{d}/arc.s", "w") as f:
        f.write(f""".arg a, f32[{n}]
.arg b, f32[{n}]
.arg z, f16[{n}]
.section aicore
    ldarg x1, a
    ldarg x2, b
    ldarg x3, z
    movi x4, 0
    movi x5, {4 * n}
    movi x6, {8 * n}
    copy_gm2ub x4, x1, 1, {4 * n // 32}, 0, 0
    copy_gm2ub x5, x2, 1, {4 * n // 32}, 0, 0
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    vaddreluconv.f16.f32 x6, x4, x5, {n // 64}, 1, 1, 1, 4, 8, 8
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    copy_ub2gm x3, x6, 1, {2 * n // 32}, 0, 0
    end
""")
    run("run", f"{d}/arc.s", "--chip", "310p", "--blocks", "1", "--in", f"a={d}/a.npy",
        "--in", f"b={d}/b.npy", "--out", f"z={d}/z.npy", "--quiet")
    z = np.load(f"{d}/z.npy")
    with np.errstate(over="ignore", invalid="ignore"):
        s = a + b  # f32
        want = np.where(s < 0, np.float32(0), s).astype(np.float16)  # RNE; NaN stays NaN
    want[np.isinf(want)] = np.float16(65504)
    assert z.dtype == np.float16 and z.shape == (n,), (z.dtype, z.shape)
    same = (z.view(np.uint16) == want.view(np.uint16)) | (np.isnan(z) & np.isnan(want))
    assert same.all(), (np.flatnonzero(~same)[:8], z[~same][:8], want[~same][:8])
    assert (z[7:12] == 65504).all() and z[12] == 0 and np.isnan(z[13]), z[:17]  # saturated
    assert z[special.size] == 65504, z[special.size]
    assert z[4] == 1 and z[5] == np.float16(1 + 2.0**-9), z[4:6]  # ties to even
    p = run("verify", f"{d}/arc.s", "--chip", "910", expect_rc=1)
    assert ("arc.s:15:" in p.stderr and "vaddreluconv (@10): chip 910 does not have this "
            "instruction (vector.add_relu_conv is false in" in p.stderr), p.stderr


@check("vmla (MulAddDst) on the 910b matches numpy's vmul then vadd, f16 and f32; the 910 refuses it")
def _(d):
    # dst = a * b + dst per lane: the product rounded to the type, then the sum (docs/assembly.md);
    # f16 in place with a = dst (dst = dst * b + dst), f32 with three tensors.
    n = 512
    rng = np.random.default_rng(11)
    for t, np_t, size in [("f16", np.float16, 2), ("f32", np.float32, 4)]:
        a = rng.uniform(-4, 4, n).astype(np_t)
        b = rng.uniform(-4, 4, n).astype(np_t)
        c = rng.uniform(-4, 4, n).astype(np_t)
        np.save(f"{d}/a.npy", a)
        np.save(f"{d}/b.npy", b)
        np.save(f"{d}/c.npy", c)
        lanes = 256 // size
        with open(f"{d}/mla.s", "w") as f:
            f.write(f""".arg a, {t}[{n}]
.arg b, {t}[{n}]
.arg c, {t}[{n}]
.arg zc, {t}[{n}]
.arg za, {t}[{n}]
.section aiv
    ldarg x1, a
    ldarg x2, b
    ldarg x3, c
    movi x4, 0
    movi x5, {size * n}
    movi x6, {2 * size * n}
    copy_gm2ub x4, x1, 1, {size * n // 32}, 0, 0
    copy_gm2ub x5, x2, 1, {size * n // 32}, 0, 0
    copy_gm2ub x6, x3, 1, {size * n // 32}, 0, 0
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    vmla.{t} x6, x4, x5, {n // lanes}, 1, 1, 1, 8, 8, 8
    vmla.{t} x4, x4, x5, {n // lanes}, 1, 1, 1, 8, 8, 8
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    ldarg x3, zc
    ldarg x1, za
    copy_ub2gm x3, x6, 1, {size * n // 32}, 0, 0
    copy_ub2gm x1, x4, 1, {size * n // 32}, 0, 0
    end
""")
        run("run", f"{d}/mla.s", "--chip", "910b", "--blocks", "1", "--in", f"a={d}/a.npy",
            "--in", f"b={d}/b.npy", "--in", f"c={d}/c.npy", "--out", f"zc={d}/zc.npy",
            "--out", f"za={d}/za.npy", "--quiet")
        zc, za = np.load(f"{d}/zc.npy"), np.load(f"{d}/za.npy")
        want_c = (a * b).astype(np_t) + c  # numpy rounds each op to the type
        want_a = (a * b).astype(np_t) + a
        assert (zc.view(np.uint8) == want_c.view(np.uint8)).all(), (t, zc[:4], want_c[:4])
        assert (za.view(np.uint8) == want_a.view(np.uint8)).all(), (t, za[:4], want_a[:4])
    p = run("verify", f"{d}/mla.s", "--chip", "910", expect_rc=1)
    assert ("mla.s:18:" in p.stderr and "vmla (@11): chip 910 does not have this instruction "
            "(vector.multiply_accumulate is false in" in p.stderr), p.stderr


def l2_set(line, origin, sets):
    """The L2 set of line `line` under page rotation with pages counted from line `origin`: an
    independent transcription of docs/chip_model.md's rule (L2Tags::set_in)."""
    mask = (1 << 64) - 1
    page = (line - origin) // sets
    rotation = ((((page * 0x9E3779B97F4A7C15) & mask) >> 32) * sets) >> 32
    return (origin % sets + (line - origin) % sets + rotation) % sets


def reread_hits(first, lines, origin, sets, ways):
    """L2 hits of reading lines [first, first + lines) twice into a cold LRU L2: the second pass
    hits every line of a set holding at most `ways` of them and none of a fuller set (a cyclic
    sweep of more lines than ways evicts each line before its reuse)."""
    count = {}
    for line in range(first, first + lines):
        s = l2_set(line, origin, sets)
        count[s] = count.get(s, 0) + 1
    return sum(n for n in count.values() if n <= ways)


@check("run: each buffer is an allocation block, its L2 pages counted from its first line")
def _(d):
    # A kernel re-reading x (64 rows of one 512-byte L2 line) after a pad buffer of k lines, on
    # the 910b (page rotation) with a 32 KiB L2: 4 sets of 16 ways, pages of 4 lines. The
    # runtime's allocator files every buffer as a block whose pages count from its first line
    # (KernelLaunch::gm_blocks), so x's 16 whole pages put 16 lines in every set and the second
    # pass hits all 64, wherever the pad puts x. Pages counted from device line 0 (no blocks)
    # would straddle x for some k: a set of 17 lines, which miss (the reference says which).
    with open(f"{d}/reread.s", "w") as f:
        f.write(""".kernel reread
.arg pad, f16[P]
.arg x, f16[M, N]
.arg P
.arg M
.arg N
.section aiv
    ldarg x1, x
    ldarg x2, M
    ldarg x3, N
    shr x4, x3, 4               ; 32-byte blocks in a row
    movi x20, 0
    copy_gm2ub x20, x1, x2, x4, 0, 0
    copy_gm2ub x20, x1, x2, x4, 0, 0
    end
""")
    import yaml
    with open(os.path.join(ROOT, "configs", "chips", "910b.yaml")) as f:
        l2 = yaml.safe_load(f)["memory"]["l2"]
    line, ways = l2["line_bytes"], l2["ways"]
    assert l2["page_rotation"] is True, l2
    sets, rows = 4, 64
    first_line = (64 << 10) // line  # the first buffer's line (the allocator's base, 64 KiB)
    straddled = 0
    for pad_lines in (1, 2, 3, 4):
        run("run", f"{d}/reread.s", "--chip", "910b",
            "--set", f"memory.l2.bytes={sets * ways * line}", "--timing-only", "--blocks", "1", "--out", f"pad={d}/p.npy",
            "--out", f"x={d}/x.npy", "--arg", f"P={pad_lines * line // 2}", "--arg", f"M={rows}",
            "--arg", f"N={line // 2}", "--counters", f"{d}/c.json", "--quiet")
        hits = json.load(open(f"{d}/c.json"))["counters"]["chip"]["l2"]["hits"]["value"]
        x_line = first_line + pad_lines
        assert hits == reread_hits(x_line, rows, x_line, sets, ways) == rows, (pad_lines, hits)
        straddled += reread_hits(x_line, rows, 0, sets, ways) < rows
    assert straddled > 0, "no pad makes absolute pages straddle x: the check would not fail"

failed = sum(1 for _, e in results if e is not None)
print(f"{len(results) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
