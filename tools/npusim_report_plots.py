"""Plots of an npusim report folder (docs/reports.md): reads op_summary.csv, op_statistic.csv and
chip.yaml, writes

  roofline.png  the chip's roofline (cube peak, vector peak, HBM bandwidth, all from chip.yaml)
                with every op placed on it: x = operations per HBM byte, y = operations per
                second; cube ops count 2 x cube_macs FLOPs, vector-only ops count their vector
                repeats x 256 bytes / 2 (fp16 lanes) against the vector ceiling
  op_time.png   total time per op type (op_statistic.csv), longest first

Usage: python tools/npusim_report_plots.py REPORT_DIR  (needs matplotlib and pyyaml,
requirements.txt). `npusim run/demo --report-dir` runs it with .venv's Python when it exists.
"""
import csv
import os
import sys

REPEAT_BYTES = 256  # one vector repeat: 8 blocks of 32 bytes (isa: docs/assembly.md)
FP16_BYTES = 2


def chip_peaks(cfg):
    """Peaks per second from a chip.yaml: cube FLOP/s (fp16), vector fp16 lane-op/s, HBM B/s."""
    hz = float(cfg["clock_mhz"]) * 1e6
    cube_cores = vector_cores = 0
    for kind in cfg["cores"].values():
        pipes = kind.get("pipes", [])
        if "m" in pipes:
            cube_cores += int(kind["count"])
        if "v" in pipes:
            vector_cores += int(kind["count"])
    cube = cfg["cube"]
    cube_flops = 2.0 * cube["m"] * cube["k"] * cube["n"] * cube_cores * hz
    vector_ops = float(cfg["vector"]["bytes_per_cycle"]) / FP16_BYTES * vector_cores * hz
    hbm = float(cfg["memory"]["hbm"]["gbps"]) * 1e9
    return cube_flops, vector_ops, hbm


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# Above this many ops (a TF training run has thousands) the roofline labels one point per op
# type (its totals) and draws the single ops as small unlabelled dots.
MAX_LABELLED_OPS = 40


def op_work(r):
    """(operations, HBM bytes, seconds, 'cube' or 'vector') of one op_summary row."""
    seconds = float(r["Task Duration(us)"]) * 1e-6
    hbm = int(r["hbm_read_bytes"]) + int(r["hbm_write_bytes"])
    macs = int(r["cube_macs"])
    if macs:
        return 2.0 * macs, hbm, seconds, "cube"
    return int(r["vector_repeats"]) * REPEAT_BYTES / FP16_BYTES, hbm, seconds, "vector"


def op_points(rows):
    """(label, ops per HBM byte, ops per second, 'cube' or 'vector') per op with HBM traffic."""
    points = []
    for r in rows:
        ops, hbm, seconds, unit = op_work(r)
        if seconds <= 0 or hbm <= 0 or ops <= 0:
            continue
        points.append((f"{r['Task ID']}:{r['Op Name']}", ops / hbm, ops / seconds, unit))
    return points


def op_type_points(rows):
    """The same per OP Type, from its ops' summed operations, bytes and time ("MatMul x320")."""
    totals = {}
    for r in rows:
        ops, hbm, seconds, unit = op_work(r)
        t = totals.setdefault((r["OP Type"], unit), [0.0, 0, 0.0, 0])
        t[0] += ops
        t[1] += hbm
        t[2] += seconds
        t[3] += 1
    return [(f"{op_type} x{n}", ops / hbm, ops / seconds, unit)
            for (op_type, unit), (ops, hbm, seconds, n) in sorted(totals.items())
            if seconds > 0 and hbm > 0 and ops > 0]


def plot_roofline(plt, cfg, rows, out):
    cube_flops, vector_ops, hbm = chip_peaks(cfg)
    points = op_points(rows)
    xs = [p[1] for p in points] or [1.0]
    lo = min(min(xs) / 4, 0.1)
    hi = max(max(xs) * 4, 4 * cube_flops / hbm)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for peak, label, style in ((cube_flops, "cube fp16 peak", "-"),
                               (vector_ops, "vector fp16 peak", "--")):
        if peak > 0:
            ax.plot(grid, [min(peak, hbm * x) for x in grid], style, color="black", lw=1.2)
            ax.annotate(f"{label} {peak / 1e12:.1f} T/s", (hi, peak), ha="right", va="bottom",
                        fontsize=8)
    x_label = (lo * cube_flops / hbm) ** 0.5  # halfway up the bandwidth slope (log scale)
    ax.annotate(f"HBM {hbm / 1e9:.0f} GB/s", (x_label, hbm * x_label * 2.5), ha="right",
                fontsize=8)
    labelled = points
    if len(points) > MAX_LABELLED_OPS:
        for unit, color in (("cube", "tab:red"), ("vector", "tab:blue")):
            dots = [(x, y) for _, x, y, u in points if u == unit]
            if dots:
                ax.scatter([d[0] for d in dots], [d[1] for d in dots], s=4, color=color,
                           alpha=0.25, linewidths=0)
        labelled = op_type_points(rows)
    for label, x, y, unit in labelled:
        ax.plot([x], [y], "o" if unit == "cube" else "s", ms=7,
                color="tab:red" if unit == "cube" else "tab:blue")
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("operations per HBM byte")
    ax.set_ylabel("operations per second (cube: FLOP/s, vector: fp16 lane-op/s)")
    ax.set_title(f"Roofline of chip {cfg.get('name', '?')} at {cfg['clock_mhz']} MHz")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_op_time(plt, stats, out):
    stats = sorted(stats, key=lambda r: float(r["Total Time(us)"]))
    labels = [f"{r['OP Type']} ({r['Core Type']}) x{r['Count']}" for r in stats]
    values = [float(r["Total Time(us)"]) for r in stats]
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.4 * max(1, len(stats))))
    ax.barh(range(len(values)), values, color="tab:green")
    ax.set_yticks(range(len(values)))
    ax.set_yticklabels(labels, fontsize=8)
    for i, v in enumerate(values):
        ax.annotate(f"{v:.1f} us", (v, i), textcoords="offset points", xytext=(4, -3), fontsize=8)
    if values:
        ax.set_xlim(0, max(values) * 1.2)  # room for the labels
    ax.set_xlabel("total task time (us)")
    ax.set_title("Time per op type")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv):
    if len(argv) != 2:
        print(__doc__)
        return 2
    d = argv[1]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import yaml
    except ImportError as e:
        print(f"npusim_report_plots: {e} (pip install -r requirements.txt)")
        return 1
    with open(os.path.join(d, "chip.yaml")) as f:
        cfg = yaml.safe_load(f)
    rows = read_csv(os.path.join(d, "op_summary.csv"))
    stats = read_csv(os.path.join(d, "op_statistic.csv"))
    written = []
    for name, fn in (("roofline.png", lambda p: plot_roofline(plt, cfg, rows, p)),
                     ("op_time.png", lambda p: plot_op_time(plt, stats, p))):
        path = os.path.join(d, name)
        fn(path)
        written.append(name)
    print(f"plots: {', '.join(written)} in {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
