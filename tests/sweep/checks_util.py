"""Shared by the sweep, explore and Ray check scripts of tests/sweep: named checks that report
every failure and go on, the closing 'N passed, N failed' line, and small file helpers."""
import csv
import os
import sys
import time

results = []

# Two workloads on the tiny chip: a compiled MatMul and the hand-written vector add (YAML list
# items under `workloads:`).
TINY_WORKLOADS = """  - op: MatMul
    inputs: [f16:128x256, f16:256x256]
  - name: vadd 4096
    kernel: kernels/vadd_f16.s
    inputs: {x: "f16:4096", y: "f16:4096"}
    outputs: {z: ""}
    args: {n: 4096}
"""


def check(name):
    """Decorator: runs the function at once as the check `name`, prints PASS/FAIL and its time."""
    def wrap(fn):
        t0 = time.monotonic()
        try:
            fn()
            results.append((name, None))
            print(f"PASS {name} ({time.monotonic() - t0:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - report every failure and go on
            results.append((name, e))
            print(f"FAIL {name}: {e}", flush=True)
        return fn
    return wrap


def finish():
    """Prints the closing line and exits non-zero on any failure."""
    failed = [n for n, e in results if e]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write(d, name, text, mode=None):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write(text)
    if mode is not None:
        os.chmod(path, mode)
    return path
