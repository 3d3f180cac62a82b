"""The sweep's outputs: sweep.csv (one row per point), plots/*.png (each metric against each swept
parameter), pareto.csv and pareto.png (total simulated time vs area proxy per config), and
wall_times.csv (the only file with wall-clock figures). Everything but wall_times.csv depends
only on the points' results, so the same inputs give the same files.
"""
import csv
import math
import os
import re

from sweep.cost import point_power
from sweep.grid import numeric_value
from sweep.runner import HWM_BUFFERS

# CSV columns after the parameters, and how numbers are written (None: integer or text).
METRIC_COLUMNS = [
    ("sim_time_us", "{:.3f}"),
    ("throughput", "{:.6g}"),
    ("throughput_unit", None),
    ("achieved_tflops", "{:.3f}"),
    ("cube_util_pct", "{:.2f}"),
    ("vector_util_pct", "{:.2f}"),
    ("hbm_bytes", None),
    ("gm_bytes", None),
    ("kernels", None),
] + [(f"hwm_{b}_bytes", None) for b in HWM_BUFFERS] + [
    ("area_mm2", "{:.3f}"),
    ("die_mm2", "{:.3f}"),
    ("hbm_gen", None),
    ("hbm_stacks", None),
    ("cost_usd", "{:.2f}"),
    ("energy_uj", "{:.4f}"),
    ("power_w", "{:.3f}"),
    ("loss", "{:.6g}"),
]
# Columns of the config (not of the run): filled in error rows too.
CONFIG_COLUMNS = ("area_mm2", "die_mm2", "hbm_gen", "hbm_stacks", "cost_usd")

# Metrics plotted against each parameter (label, unit).
PLOT_METRICS = {
    "sim_time_us": "simulated time (us)",
    "throughput": "throughput (per s)",
    "achieved_tflops": "achieved fp16 TFLOPS",
    "cube_util_pct": "cube utilisation (% of chip peak)",
    "vector_util_pct": "vector utilisation (% of chip peak)",
    "hbm_bytes": "HBM bytes",
    "gm_bytes": "GM bytes",
    "area_mm2": "area proxy (mm^2)",
    "cost_usd": "cost proxy (USD)",
    "energy_uj": "energy (uJ)",
    "power_w": "average power (W)",
    **{f"hwm_{b}_bytes": f"{b.upper()} high-water mark (bytes)" for b in HWM_BUFFERS},
}


def cell(v, fmt):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if fmt and isinstance(v, (int, float)) and not isinstance(v, bool):
        return fmt.format(v)
    return str(v)


def rows_of(grid, configs, records):
    """CSV rows in grid order: workloads in file order, then configs in product order.
    `configs` is [(index tuple, ResolvedConfig)], records maps (config i, workload j) -> record."""
    rows = []
    params = grid.columns
    for j, w in enumerate(grid.workloads):
        for i, (_, conf) in enumerate(configs):
            rec = records[(i, j)]
            swept = dict(conf.sets)
            row = {p: swept.get(p, "") for p in params}
            row.update({"workload": w["name"], "kind": w["kind"], "status": rec["status"],
                        "reason": rec.get("reason", "")})
            m = dict(rec.get("metrics") or {})
            cost = conf.cost()
            if cost is not None:
                m.update(cost)
                if m.get("activity") is not None and m.get("sim_time_us"):
                    m["energy_uj"], m["power_w"] = point_power(cost, m["activity"], m["sim_time_us"])
            for col, fmt in METRIC_COLUMNS:
                row[col] = cell(m.get(col), fmt) if rec["status"] == "ok" or col in CONFIG_COLUMNS else ""
            rows.append(row)
    return rows


def write_csv(path, header, rows):
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=header, lineterminator="\n")
        wr.writeheader()
        for r in rows:
            wr.writerow(r)
    os.replace(tmp, path)


def write_sweep_csv(out_dir, grid, configs, records):
    header = grid.columns + ["workload", "kind", "status", "reason"] + [c for c, _ in METRIC_COLUMNS]
    rows = rows_of(grid, configs, records)
    write_csv(os.path.join(out_dir, "sweep.csv"), header, rows)
    return rows


def write_wall_times(out_dir, grid, configs, records):
    header = grid.columns + ["workload", "status", "wall_s", "point"]
    rows = []
    for j, w in enumerate(grid.workloads):
        for i, (_, conf) in enumerate(configs):
            rec = records[(i, j)]
            swept = dict(conf.sets)
            row = {p: swept.get(p, "") for p in grid.columns}
            row.update({"workload": w["name"], "status": rec["status"],
                        "wall_s": f"{rec.get('wall_s', 0.0):.2f}", "point": rec["key"]})
            rows.append(row)
    write_csv(os.path.join(out_dir, "wall_times.csv"), header, rows)


def pareto_table(grid, configs, records):
    """Per config: area, total simulated time and whether it is on the Pareto front (no other
    config is at most as large and at most as slow, and better in one). The total sums the
    simulated times of the counted workloads: those that ran (ok) in at least one config, so a
    workload failing everywhere (e.g. a broken model runner) does not empty the table; a config
    in which a counted workload failed is left out. Returns (rows sorted by area then time,
    the counted workloads' indices)."""
    def ok(i, j):
        r = records[(i, j)]
        return r["status"] == "ok" and r["metrics"].get("sim_time_us") is not None

    counted = [j for j in range(len(grid.workloads)) if any(ok(i, j) for i in range(len(configs)))]
    table = []
    for i, (_, conf) in enumerate(configs):
        if not conf.ok or not counted or not all(ok(i, j) for j in counted):
            continue
        times = [records[(i, j)]["metrics"]["sim_time_us"] for j in counted]
        cost = conf.cost()
        energies = [point_power(cost, records[(i, j)]["metrics"].get("activity"), t)[0]
                    if records[(i, j)]["metrics"].get("activity") is not None else None
                    for j, t in zip(counted, times)]
        table.append({"config": conf, "area": cost["area_mm2"], "cost": cost["cost_usd"],
                      "time": sum(times), "times": times,
                      "energy": None if None in energies else sum(energies)})
    for t in table:
        t["front"] = not dominated(table, t, "area")
        t["front_cost"] = not dominated(table, t, "cost")
    table.sort(key=lambda t: (t["area"], t["time"]))
    return table, counted


def dominated(table, t, cost_key):
    """Whether another row is at most as costly (`cost_key`) and at most as slow, better in one."""
    return any(o is not t and o[cost_key] <= t[cost_key] and o["time"] <= t["time"]
               and (o[cost_key] < t[cost_key] or o["time"] < t["time"]) for o in table)


def config_label(grid, conf):
    swept = dict(conf.sets)
    return ", ".join(f"{p.split('.')[-1]}={swept.get(p, '')}" for p in grid.params)


def write_pareto_csv(out_dir, grid, table, counted):
    names = [grid.workloads[j]["name"] for j in counted]
    header = grid.columns + ["area_mm2", "cost_usd", "total_sim_time_us", "total_energy_uj"] + [
        f"sim_time_us[{n}]" for n in names] + ["pareto", "pareto_cost"]
    rows = []
    for t in table:
        swept = dict(t["config"].sets)
        row = {p: swept.get(p, "") for p in grid.columns}
        row["area_mm2"] = f"{t['area']:.3f}"
        row["cost_usd"] = f"{t['cost']:.2f}"
        row["total_energy_uj"] = "" if t["energy"] is None else f"{t['energy']:.4f}"
        row["pareto_cost"] = "yes" if t["front_cost"] else "no"
        row["total_sim_time_us"] = f"{t['time']:.3f}"
        for n, v in zip(names, t["times"]):
            row[f"sim_time_us[{n}]"] = f"{v:.3f}"
        row["pareto"] = "yes" if t["front"] else "no"
        rows.append(row)
    write_csv(os.path.join(out_dir, "pareto.csv"), header, rows)


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams["svg.hashsalt"] = "npusim"  # deterministic output where the backend allows
    return plt


def _slug(s):
    return re.sub(r"[^A-Za-z0-9_.]+", "_", s).strip("_")


def write_plots(out_dir, grid, rows):
    """plots/<metric>_vs_<param>.png: one line per workload and combination of the other
    parameters; metrics that are zero or missing in every ok row are left out. Returns the
    files written."""
    plt = _pyplot()
    plot_dir = os.path.join(out_dir, "plots")
    os.makedirs(plot_dir, exist_ok=True)
    written = []
    ok = [r for r in rows if r["status"] == "ok"]
    for param in grid.params:
        axis_values = []
        for names, values in grid.axes:
            if param in names:
                axis_values = [v[names.index(param)] for v in values]
        nums = [numeric_value(v) for v in axis_values]
        numeric = all(n is not None for n in nums)
        pos = {v: (n if numeric else k) for k, (v, n) in enumerate(zip(axis_values, nums))}
        others = [p for p in grid.params if p != param]
        for metric, label in PLOT_METRICS.items():
            series = {}
            for r in ok:
                if r.get(metric, "") == "":
                    continue
                name = r["workload"] + "".join(f", {o.split('.')[-1]}={r[o]}" for o in others)
                series.setdefault(name, []).append((pos[r[param]], float(r[metric])))
            if not any(v for pts in series.values() for _, v in pts):
                continue  # nothing to see (e.g. a buffer no workload touched)
            for pts in series.values():
                pts.sort()
            path = _line_plot(plt, plot_dir, f"{metric}_vs_{_slug(param)}", series, param, label,
                              axis_values, nums if numeric else None)
            written.append(path)
            if metric == "sim_time_us":
                # The same relative to each line's first parameter value (100 % = no change).
                rel = {n: [(x, 100.0 * y / pts[0][1]) for x, y in pts]
                       for n, pts in series.items() if pts[0][1] > 0}
                if rel:
                    written.append(_line_plot(
                        plt, plot_dir, f"sim_time_rel_vs_{_slug(param)}", rel, param,
                        f"simulated time (% of {param}={axis_values[0]})", axis_values,
                        nums if numeric else None, log_ok=False))
    return written


def _line_plot(plt, plot_dir, stem, series, param, label, axis_values, nums, log_ok=True):
    """One figure: a line per series (points (x, y) sorted by x), legend outside on the right."""
    fig, ax = plt.subplots(figsize=(7 + (3 if len(series) > 1 else 0), 4.5))
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D", "v"]
    for k, (name, pts) in enumerate(series.items()):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=styles[(k // 10) % 4],
                marker=markers[(k // 10) % 5], label=name)
    ax.set_xlabel(param)
    ax.set_ylabel(label)
    ax.set_xticks(nums if nums is not None else range(len(axis_values)))
    ax.set_xticklabels(axis_values)
    vals = [p[1] for pts in series.values() for p in pts]
    if log_ok and min(vals) > 0 and max(vals) / min(vals) > 100:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_title(f"{label} vs {param}", fontsize=10)
    fig.tight_layout()
    path = os.path.join(plot_dir, stem + ".png")
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return path


def write_pareto_plot(out_dir, grid, table):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if table:
        ax.scatter([t["area"] for t in table], [t["time"] for t in table], color="tab:blue",
                   label="configs", zorder=2)
        front = [t for t in table if t["front"]]
        ax.plot([t["area"] for t in front], [t["time"] for t in front], color="tab:red",
                marker="o", drawstyle="steps-post", label="Pareto front", zorder=3)
        for t in table:
            ax.annotate(config_label(grid, t["config"]), (t["area"], t["time"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")
    else:
        ax.text(0.5, 0.5, "no config ran every workload", ha="center", transform=ax.transAxes)
    ax.set_xlabel("area proxy (mm^2)")
    ax.set_ylabel("total simulated time over the workloads (us)")
    ax.set_title("simulated time vs area", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "pareto.png")
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return path
