"""compare_launch_logs.py A.tsv B.tsv: compares two launch logs written with NPUSIM_LAUNCH_LOG
(sim/simulator.h, SimOptions::launch_log: kernel, block_dim, cycles, program digest and
counter digest per launch) from the same workload, e.g. `NPUSIM_LAUNCH_LOG=a.tsv ctest -R
compiler -j1` on two builds. Prints how many launches kept their program, their cycles and
their counters, and the first differences of each kind; exits 1 if any launch's kernel name,
block_dim, cycles or (where both logs have it) counter digest differ or the launch counts
differ (a program that changed with unchanged cycles and counters is listed, not failed: the
refactor reordered code or buffers without moving the timing).

--unordered compares the two logs as multisets of launches (each sorted first): for TensorFlow
runs, whose executor may issue independent ops in another order from run to run (the
launches' own figures do not depend on that order: docs/tf_plugin.md, "Device memory")."""
import sys


def read(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n").split("\t") for line in f if line.strip()]


args = [x for x in sys.argv[1:] if x != "--unordered"]
a, b = read(args[0]), read(args[1])
if "--unordered" in sys.argv[1:]:
    a, b = sorted(a), sorted(b)
if len(a) != len(b):
    print(f"DIFFERENT: {len(a)} vs {len(b)} launches")

def counters_differ(x, y):
    """Logs written before the counter digest existed have 4 columns: nothing to compare."""
    return len(x) > 4 and len(y) > 4 and x[4] != y[4]


timing = [(i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x[:3] != y[:3]]
counters = [(i, x, y) for i, (x, y) in enumerate(zip(a, b))
            if x[:3] == y[:3] and counters_differ(x, y)]
code = [(i, x, y) for i, (x, y) in enumerate(zip(a, b)) if x[:3] == y[:3] and x[3] != y[3]]
compared = sum(1 for x, y in zip(a, b) if len(x) > 4 and len(y) > 4)
for i, x, y in timing[:10]:
    print(f"TIMING launch {i}: {x[:3]} vs {y[:3]}")
for i, x, y in counters[:10]:
    print(f"COUNTERS launch {i}: {x[0]} counter digest {x[4]} vs {y[4]}, cycles equal ({x[2]})")
for i, x, y in code[:10]:
    print(f"CODE   launch {i}: {x[0]} program {x[3]} vs {y[3]}, cycles equal ({x[2]})")
n = min(len(a), len(b))
print(f"{n} launches: {n - len(timing)} same name/block_dim/cycles, "
      f"{n - len(timing) - len(code)} also same program; counters compared for {compared}, "
      f"{len(counters)} differ; total cycles "
      f"{sum(int(x[2]) for x in a)} vs {sum(int(y[2]) for y in b)}")
sys.exit(1 if timing or counters or len(a) != len(b) else 0)
