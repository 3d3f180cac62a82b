"""`npusim collective` on the tiny-x8 system against numpy: every collective on 2, 4 and 8 chips
in f32, f16, bf16 and s32 (each reduction for the reducing ones), its buffers dumped with
--dump and compared bit for bit with numpy's result on the same inputs; the bus-bandwidth table;
the errors.

Usage: collective_checks.py NPUSIM_BINARY SOURCE_DIR. Prints 'N passed, N failed' and exits
non-zero on any failure.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

NPUSIM, ROOT = sys.argv[1], sys.argv[2]
failures = []
passed = 0


def run(*args, expect_rc=0):
    p = subprocess.run([NPUSIM, "collective", *args], capture_output=True, text=True, timeout=300)
    if p.returncode != expect_rc:
        raise AssertionError(f"npusim collective {' '.join(args)}: exit {p.returncode}, wanted "
                             f"{expect_rc}\n{p.stdout}\n{p.stderr}")
    return p


def as_f64(a, dtype):
    """The elements as float64 (bf16 arrives as uint16 bit patterns)."""
    if dtype == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


def expected(kind, sends, n, root, op):
    """numpy's result for every rank, from the ranks' send buffers (float64 values)."""
    x = np.stack(sends)  # [rank, element]
    if kind == "all_reduce":
        return [REDUCE[op](x, axis=0)] * n
    if kind == "reduce_scatter":
        red = REDUCE[op](x, axis=0).reshape(n, -1)
        return [red[r] for r in range(n)]
    if kind == "all_gather":
        return [x.reshape(-1)] * n
    if kind == "broadcast":
        return [x[root]] * n
    if kind == "all_to_all":
        blocks = x.reshape(n, n, -1)  # [sender, receiver, element]
        return [blocks[:, r, :].reshape(-1) for r in range(n)]
    raise ValueError(kind)


def check_case(kind, n, dtype, op, algo="auto"):
    global passed
    with tempfile.TemporaryDirectory() as d:
        run(kind, "--system", "tiny-x8", "--chips", str(n), "--bytes", "6K", "--dtype", dtype,
            "--op", op, "--root", str(n - 1), "--algo", algo, "--functional", "--dump", d)
        sends = [as_f64(np.load(os.path.join(d, f"rank{r}_send.npy")), dtype) for r in range(n)]
        recvs = [as_f64(np.load(os.path.join(d, f"rank{r}_recv.npy")), dtype) for r in range(n)]
    want = expected(kind, sends, n, n - 1, op)
    for r in range(n):
        if not np.array_equal(recvs[r], want[r]):
            bad = np.flatnonzero(recvs[r] != want[r])[:5]
            failures.append(f"{kind} {op} {dtype} n={n} algo={algo} rank {r}: elements {bad} "
                            f"got {recvs[r][bad]} want {want[r][bad]}")
            return
    passed += 1


def main():
    global passed
    for n in (2, 4, 8):
        for dtype in ("f32", "f16", "bf16", "s32"):
            for kind in ("all_reduce", "reduce_scatter"):
                for op in ("sum", "prod", "max", "min"):
                    check_case(kind, n, dtype, op)
            for kind in ("all_gather", "broadcast", "all_to_all"):
                check_case(kind, n, dtype, "sum")
        check_case("all_reduce", n, "f32", "sum", "ring")
        check_case("all_reduce", n, "f16", "sum", "hd")

    # The table: nccl-tests columns, busbw = algbw x 2(n-1)/n for all_reduce.
    out = run("all_reduce", "--system", "tiny-x8", "--chips", "4", "--bytes", "1M..4M").stdout
    rows = [l.split() for l in out.splitlines() if l and not l.startswith("#")]
    assert [int(r[0]) for r in rows] == [1 << 20, 2 << 20, 4 << 20], out
    for size, count, dtype, redop, root, t, algbw, busbw, steps, algo in rows:
        assert (dtype, redop, root, algo) == ("f32", "sum", "-1", "mesh"), out
        assert int(count) == int(size) // 4
        assert abs(float(algbw) - int(size) / (float(t) * 1e3)) < 0.01 + 1e-3 * float(algbw)
        assert abs(float(busbw) - float(algbw) * 1.5) < 0.01 + 1e-3 * float(busbw)
    passed += 1

    # Timing-only gives the functional run's times.
    for kind in ("all_reduce", "all_to_all"):
        base = ("--system", "tiny-x8", "--bytes", "64K..256K", "--op", "prod")
        timing = run(kind, *base).stdout.splitlines()[4:]
        functional = run(kind, *base, "--functional").stdout.splitlines()[4:]
        if timing != functional or not timing:
            failures.append(f"{kind}: timing-only {timing} != functional {functional}")
        else:
            passed += 1

    for args, msg in ((("all_reduce", "--system", "tiny-x8", "--chips", "9"),
                       "--chips 9: system 'tiny-x8' has 8 chips"),
                      (("all_reduce", "--system", "tiny-x8", "--algo", "tree"),
                       "unknown algorithm 'tree'"),
                      (("all_reduce", "--system", "tiny-x8", "--chips", "3", "--algo", "hd"),
                       "power-of-two"),
                      (("gather", "--system", "tiny-x8"), "unknown collective 'gather'"),
                      (("all_reduce", "--system", "tiny-x8", "--set", "server.link.gbs=9"),
                       "server.link.gbs")):
        err = run(*args, expect_rc=1).stderr
        if msg not in err:
            failures.append(f"{args}: wanted '{msg}' in: {err}")
        else:
            passed += 1

    for f in failures:
        print("FAILED:", f)
    print(f"{passed} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


main()
