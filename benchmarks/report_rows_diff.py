"""How far the reports of repeated runs of one workload agree: compares op_summary.csv of each
report directory (NPUSIM_REPORT_DIR of separate processes) row by row with the first one's and
prints, per directory, its rows, how many differ from the first's in op name, start or duration
(exact cycles: task_start_cycles, task_duration_cycles), the first such row, and the span from
the first row's start to the last row's end. A report of several NPUs compares each chip's
folder (device_<k>/op_summary.csv) in turn. Exits 1 if any row differs.

    .venv/bin/python benchmarks/report_rows_diff.py DIR1 DIR2 [DIR3 ...]
"""
import csv
import glob
import os
import sys

FIELDS = ("Op Name", "task_start_cycles", "task_duration_cycles")


def rows(path):
    """[(op name, start cycles, duration cycles)] of one op_summary.csv."""
    with open(path, newline="", encoding="utf-8") as f:
        return [tuple(r[k] for k in FIELDS) for r in csv.DictReader(f)]


def tables(directory):
    """{label: op_summary.csv path} of a report: its own, or one per chip's folder."""
    chips = sorted(glob.glob(os.path.join(directory, "device_*", "op_summary.csv")))
    if chips:
        return {os.path.basename(os.path.dirname(p)): p for p in chips}
    path = os.path.join(directory, "op_summary.csv")
    if not os.path.isfile(path):
        sys.exit(f"report_rows_diff: {path}: no such file")
    return {"": path}


def span(table):
    if not table:
        return 0
    return max(int(s) + int(d) for _, s, d in table) - min(int(s) for _, s, _ in table)


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    first = {label: rows(p) for label, p in tables(argv[1]).items()}
    differ = 0
    for directory in argv[1:]:
        current = tables(directory)
        if sorted(current) != sorted(first):
            sys.exit(f"report_rows_diff: {directory} has chips {sorted(current)}, "
                     f"{argv[1]} {sorted(first)}")
        for label, path in current.items():
            table, base = rows(path), first[label]
            moved = [i for i in range(max(len(table), len(base)))
                     if i >= len(table) or i >= len(base) or table[i] != base[i]]
            differ += len(moved)
            where = f"#{moved[0]} {table[moved[0]] if moved[0] < len(table) else None}" \
                if moved else "-"
            print(f"{directory} {label}: {len(table)} rows, {len(moved)} differ from "
                  f"{argv[1]}'s (first: {where}), span {span(table)} cycles")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
