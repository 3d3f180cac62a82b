"""Command line of the sweep: `npusim sweep GRID.yaml ...` or `python tools/npusim_sweep.py ...`."""
import argparse
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from sweep import executor, report, runner
from sweep.grid import GridError, load_grid


class Progress:
    """A plain-text progress bar: one line per finished point (so it works without a TTY), each
    with the bar, the count, the status, the estimated time left and the point. The estimate is
    the mean wall time per point run so far (points finished / elapsed, so it reflects the
    parallelism) times the points left."""

    def __init__(self, total, stream, quiet=False):
        self.total, self.done, self.errors = total, 0, 0
        self.ran = 0                          # points run (not found stored) so far
        self.stream, self.quiet = stream, quiet
        self.t0 = time.monotonic()
        self.lock = threading.Lock()

    def eta(self):
        left = self.total - self.done
        if left == 0:
            return "done"
        if self.ran == 0:
            return "eta ?"
        return "eta " + format_duration((time.monotonic() - self.t0) / self.ran * left)

    def finished(self, rec, label, stored=False):
        with self.lock:
            self.done += 1
            self.ran += not stored
            self.errors += rec["status"] != "ok"
            if self.quiet:
                return
            width = 24
            filled = width * self.done // max(1, self.total)
            bar = "#" * filled + "." * (width - filled)
            what = "stored" if stored else f"{rec.get('wall_s', 0.0):6.1f} s"
            status = rec["status"] if rec["status"] == "ok" else "ERROR"
            line = (f"[{bar}] {self.done:>{len(str(self.total))}}/{self.total} {status:5} "
                    f"{what:>8} {self.eta():>11}  {label}")
            if rec["status"] != "ok":
                line += f"\n    {rec.get('reason', '')}"
            print(line, file=self.stream, flush=True)


def format_duration(s):
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def cpu_count():
    """CPUs this process may run on (its affinity mask), else os.cpu_count()."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_npusim():
    env = os.environ.get("NPUSIM")
    return env if env else os.path.join(runner.ROOT, "build", "npusim")


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="npusim sweep",
        description="Run every (chip config x workload) point of a grid file and write sweep.csv, "
                    "plots/*.png, pareto.csv and pareto.png (docs/sweep.md).")
    ap.add_argument("grid", help="the grid file (YAML)")
    add_run_args(ap, "<grid name>_sweep")
    ap.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                    help="skip points whose result is stored in OUT/points (default); "
                         "--no-resume reruns them")
    ap.add_argument("--retry-errors", action="store_true",
                    help="with --resume: run stored points that failed again (e.g. after fixing "
                         "what made them fail); configs the loader rejects are not retried")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the grid and list the points (stored or to run); run nothing")
    return ap.parse_args(argv)


def add_run_args(ap, default_out):
    """Options of sweep and explore: output folder, executor (local jobs or Ray), binary, plots."""
    ap.add_argument("--out", help=f"output folder (default: {default_out} in the current folder)")
    ap.add_argument("--jobs", type=int, default=cpu_count(),
                    help="points run in parallel on this host, also the CPUs of a local Ray "
                         "instance (default: the CPU count)")
    ap.add_argument("--npusim", default=default_npusim(),
                    help="the npusim binary (default: $NPUSIM, else build/npusim)")
    ap.add_argument("--no-plots", action="store_true", help="write the CSV files only")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    ap.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                    help="run the points as Ray tasks: on a local Ray instance started for the "
                         "run, or on the cluster at ADDRESS (host:port of `ray start --head`)")
    ap.add_argument("--ray-node-ip", default="127.0.0.1",
                    help="the IP this driver (and a local instance) binds to (default 127.0.0.1)")


def point_label(conf, grid, w):
    swept = dict(conf.sets)
    return w["name"] + " | " + ", ".join(f"{p}={swept.get(p, '')}" for p in grid.params)


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        grid = load_grid(a.grid)
    except GridError as e:
        print(f"npusim sweep: error: {e}", file=sys.stderr)
        return 1
    if not (os.path.isfile(a.npusim) and os.access(a.npusim, os.X_OK)):
        print(f"npusim sweep: error: --npusim '{a.npusim}' is not an executable "
              "(build it, or pass --npusim)", file=sys.stderr)
        return 1
    if a.jobs < 1:
        print("npusim sweep: error: --jobs must be at least 1", file=sys.stderr)
        return 1
    npusim = os.path.abspath(a.npusim)
    out_dir = a.out or (os.path.splitext(os.path.basename(a.grid))[0] + "_sweep")
    ctx = runner.Context(grid, npusim, out_dir)

    # Resolve every config once (`npusim config`): checks its keys and values and gives the
    # resolved tree for the area proxy and the point keys.
    combos = grid.configs()
    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        resolved = list(pool.map(
            lambda c: runner.resolve_config(npusim, grid.chip_path, grid.fixed + c[1]), combos))
    configs = list(zip([c[0] for c in combos], resolved))

    points = []  # (config i, workload j, key)
    for i, (_, conf) in enumerate(configs):
        for j, w in enumerate(grid.workloads):
            points.append((i, j, runner.point_key(ctx, conf, w)))
    records, todo = {}, []
    for i, j, key in points:
        rec = runner.load_point(ctx, key) if a.resume else None
        if rec is not None and a.retry_errors and rec["status"] != "ok" and configs[i][1].ok:
            rec = None
        if rec is not None:
            records[(i, j)] = rec
        else:
            todo.append((i, j, key))

    out = sys.stdout
    bad = sum(not c.ok for _, c in configs)
    print(f"sweep {grid.path}: {len(configs)} config(s) x {len(grid.workloads)} workload(s) = "
          f"{len(points)} point(s); {len(points) - len(todo)} stored, {len(todo)} to run"
          f"{f'; {bad} config(s) rejected' if bad else ''}; "
          f"{'ray ' + a.ray if a.ray else f'jobs {a.jobs}'}; out {out_dir}",
          file=out, flush=True)
    if a.dry_run:
        for i, j, key in points:
            conf, w = configs[i][1], grid.workloads[j]
            state = "stored" if (i, j) in records else "to run"
            bad_cfg = "" if conf.ok else f"  [config rejected: {conf.text}]"
            print(f"  {key}  {state:6}  {point_label(conf, grid, w)}{bad_cfg}", file=out)
        return 0

    os.makedirs(out_dir, exist_ok=True)
    progress = Progress(len(points), out, a.quiet)
    for i, j, key in points:
        if (i, j) in records:
            progress.finished(records[(i, j)], point_label(configs[i][1], grid, grid.workloads[j]),
                              stored=True)

    try:
        ex = executor.make_executor(a.ray, a.jobs, a.ray_node_ip,
                                    lambda m: print(m, file=out, flush=True)) if todo else None
    except Exception as e:  # noqa: BLE001 - Ray not installed, cluster unreachable, ...
        print(f"npusim sweep: error: --ray: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    progress.t0 = time.monotonic()
    try:
        jobs = [((i, j), ctx, configs[i][1], grid.workloads[j], key) for i, j, key in todo]
        for (i, j), rec in (ex.run(jobs) if ex else []):
            runner.store_point(ctx, rec)  # at once: a killed driver resumes from here
            records[(i, j)] = rec
            progress.finished(rec, point_label(configs[i][1], grid, grid.workloads[j]))
    finally:
        if ex:
            ex.close()

    rows = report.write_sweep_csv(out_dir, grid, configs, records)
    report.write_wall_times(out_dir, grid, configs, records)
    table, counted = report.pareto_table(grid, configs, records)
    report.write_pareto_csv(out_dir, grid, table, counted)
    try:
        if a.no_plots:
            raise ImportError("--no-plots")
        plots = report.write_plots(out_dir, grid, rows)
        report.write_pareto_plot(out_dir, grid, table)
        plot_note = f"{len(plots)} plots in {os.path.join(out_dir, 'plots')}, pareto.png"
    except ImportError as e:
        plot_note = "no plots (--no-plots)" if a.no_plots else f"no plots ({e}; install matplotlib)"
    ok = sum(r["status"] == "ok" for r in records.values())
    print(f"done: {ok} ok, {len(records) - ok} error; {os.path.join(out_dir, 'sweep.csv')}, "
          f"pareto.csv ({sum(t['front'] for t in table)} on the front), {plot_note}; "
          f"{time.monotonic() - progress.t0:.1f} s", file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
