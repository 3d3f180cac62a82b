"""Vector ops against their HBM roofline, from a report folder (NPUSIM_REPORT_DIR of a TF run,
e.g. benchmarks/launch_cycles.py; `npusim op --report-dir` leaves the shapes out).

Per op type (all of them with --all, else the vector ops of a training step: batch norms,
optimizer updates, element-wise and gradient ops): the op instances (launches with the same
op name count as one), the bytes each instance must move at the least (every input read once,
every output written once, sizes from op_summary.csv's shapes and data types), the HBM
roofline of those bytes (bytes / the chip's HBM bytes per cycle: memory.hbm.gbps and clock_mhz
of the report's chip.yaml), the launches' cycles, the task overheads among them (dispatch,
block start, done: the config's `task` figures), and the cycles over the roofline; then the
vector cores' pipe ratios (aiv vec, mte2, mte3; weighted by each launch's cycles) and the
cores the launches used (Block Dim, weighted likewise).

Usage: .venv/bin/python benchmarks/vector_roofline.py REPORT_DIR [--all]
"""
import collections
import csv
import os
import sys

import yaml

VECTOR_TYPES = {"BNTrainingReduce", "BNTrainingUpdate", "BNTrainingUpdateGrad",
                "BNTrainingReduceGrad", "FusedVariableUpdate", "ReluGrad", "AddRelu", "AddN",
                "AddV2", "BiasAddGrad", "FusedElementwise", "MaxPoolGrad", "MaxPool",
                # Lamb's FusedVariableUpdate launches as reports name them (docs/tf_plugin.md)
                "LambUpdateWithLR", "LambNextMV"}
DTYPE_BYTES = {"DT_FLOAT": 4, "DT_HALF": 2, "DT_BFLOAT16": 2, "DT_INT32": 4, "DT_INT64": 8,
               "DT_DOUBLE": 8, "DT_INT8": 1, "DT_UINT8": 1, "DT_BOOL": 1}


def tensor_bytes(shapes, dtypes):
    """Bytes of the tensors of one op_summary cell pair ("8,7,7,64;64", "DT_FLOAT;DT_FLOAT"); a
    scalar's shape is empty, a missing type counts 4 bytes."""
    if not dtypes:
        return 0
    total = 0
    for shape, dtype in zip(shapes.split(";"), dtypes.split(";")):
        n = 1
        for d in filter(None, shape.split(",")):
            n *= int(d)
        total += n * DTYPE_BYTES.get(dtype, 4)
    return total


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    folder = sys.argv[1]
    chip = yaml.safe_load(open(os.path.join(folder, "chip.yaml")))
    hbm_bytes_per_cycle = chip["memory"]["hbm"]["gbps"] * 1e9 / (chip["clock_mhz"] * 1e6)
    types = collections.defaultdict(lambda: {"ops": {}, "cycles": 0, "overhead": 0,
                                             "vec": 0.0, "mte2": 0.0, "mte3": 0.0,
                                             "blocks": 0.0, "launches": 0})
    for r in csv.DictReader(open(os.path.join(folder, "op_summary.csv"))):
        if len(sys.argv) < 3 and r["OP Type"] not in VECTOR_TYPES:
            continue
        t = types[r["OP Type"]]
        cycles = int(r["task_duration_cycles"])
        t["ops"].setdefault(r["Op Name"],
                            tensor_bytes(r["Input Shapes"], r["Input Data Types"]) +
                            tensor_bytes(r["Output Shapes"], r["Output Data Types"]))
        t["cycles"] += cycles
        t["launches"] += 1
        t["overhead"] += int(r["task_overhead_cycles"])
        t["blocks"] += int(r["Block Dim"]) * cycles
        for pipe in ("vec", "mte2", "mte3"):
            v = r.get(f"aiv_{pipe}_ratio", "N/A")
            t[pipe] += (float(v) if v not in ("N/A", "") else 0.0) * cycles
    print(f"HBM {chip['memory']['hbm']['gbps']} GB/s at {chip['clock_mhz']} MHz: "
          f"{hbm_bytes_per_cycle:.0f} bytes per cycle")
    print(f"{'op type':22} {'ops':>4} {'launches':>8} {'MB':>8} {'roofline':>10} {'cycles':>11} "
          f"{'overhead':>10} {'x roofline':>10} {'vec':>5} {'mte2':>5} {'mte3':>5} {'cores':>5}")
    total = collections.Counter()
    for name, t in sorted(types.items(), key=lambda kv: -kv[1]["cycles"]):
        nbytes = sum(t["ops"].values())
        roof = nbytes / hbm_bytes_per_cycle
        c = t["cycles"] or 1
        print(f"{name:22} {len(t['ops']):4} {t['launches']:8} {nbytes / 1e6:8.1f} {roof:10,.0f} "
              f"{t['cycles']:11,} {t['overhead']:10,} {t['cycles'] / max(roof, 1):10.2f} "
              f"{t['vec'] / c:5.2f} {t['mte2'] / c:5.2f} {t['mte3'] / c:5.2f} "
              f"{t['blocks'] / c:5.1f}")
        total.update({"bytes": nbytes, "roof": roof, "cycles": t["cycles"],
                      "overhead": t["overhead"], "launches": t["launches"]})
    print(f"{'total':22} {'':4} {total['launches']:8} {total['bytes'] / 1e6:8.1f} "
          f"{total['roof']:10,.0f} {total['cycles']:11,} {total['overhead']:10,} "
          f"{total['cycles'] / max(total['roof'], 1):10.2f}")


if __name__ == "__main__":
    main()
