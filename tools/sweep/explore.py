"""`npusim explore SPACE.yaml --out DIR [--ray [ADDRESS]]`: multi-objective design-space search
with Optuna (NSGA-II or TPE) over chip configs, each trial running every workload of the space
file on the sweep's executors (local processes or Ray tasks). docs/sweep.md, "Design-space search".

Trials are asked in batches (search.batch, default: the population for NSGA-II, the job count for
TPE), their points run in parallel, and they are told back in trial order, so a seed gives the
same trials. The study lives in DIR/study.db (SQLite): a rerun continues it up to search.trials,
re-running trials a killed driver left unfinished. Points are stored in DIR/points as in a sweep,
so a config seen before (in this study, or in a sweep run into the same DIR) is not run again.
"""
import argparse
import logging
import os
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

from sweep import executor, report, runner
from sweep.cli import Progress, add_run_args
from sweep.cost import point_power
from sweep.expr import ExprError
from sweep.grid import GridError, numeric_value
from sweep.space import OBJECTIVE_METRICS, load_space

STUDY = "npusim_explore"


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="npusim explore",
        description="Search a chip design space with Optuna; write trials.csv, pareto.csv and "
                    "pareto.png (docs/sweep.md, 'Design-space search').")
    ap.add_argument("space", help="the space file (YAML)")
    add_run_args(ap, "<space name>_explore")
    ap.add_argument("--trials", type=int, help="total trials (default: search.trials of the file)")
    ap.add_argument("--seed", type=int, help="sampler seed (default: search.seed of the file)")
    return ap.parse_args(argv)


def make_sampler(optuna, search, seed):
    """The sampler; both read the constraints each trial sets (Trial.set_constraint)."""
    if search["sampler"] == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True)
    return optuna.samplers.NSGAIISampler(population_size=search["population"], seed=seed)


def constraints_of(frozen):
    return frozen.user_attrs.get("constraints", [])


def trial_metrics(space, conf, recs):
    """Aggregate metrics of a trial from its points (None, reason if a point failed)."""
    bad = [r for r in recs if r["status"] != "ok"]
    if not conf.ok:
        return None, f"config: {conf.text}"
    if bad:
        return None, f"{bad[0]['workload']['name']}: {bad[0]['reason']}"
    cost = conf.cost()
    m = {k: cost[k] for k in ("area_mm2", "die_mm2", "cost_usd", "hbm_stacks")}
    m["time_us"] = sum(r["metrics"]["sim_time_us"] for r in recs)
    energies = [point_power(cost, r["metrics"]["activity"], r["metrics"]["sim_time_us"])[0]
                if r["metrics"].get("activity") is not None else None for r in recs]
    if None not in energies:
        m["energy_uj"] = sum(energies)
        m["power_w"] = m["energy_uj"] / m["time_us"] if m["time_us"] else None
    for b in runner.HWM_BUFFERS:
        marks = [r["metrics"].get(f"hwm_{b}_bytes") for r in recs]
        if any(x is not None for x in marks):
            m[f"hwm_{b}_bytes"] = max(x for x in marks if x is not None)
    return m, ""


class Explorer:
    def __init__(self, a, space, out_dir, npusim):
        self.a, self.space, self.out_dir, self.npusim = a, space, out_dir, npusim
        self.ctx = runner.Context(space, npusim, out_dir)
        self.log = (lambda m: None) if a.quiet else (lambda m: print(m, flush=True))

    def evaluate(self, ex, batch, progress):
        """Runs the points of a batch [(trial, sets)]; returns [(conf, [records])] in order."""
        with ThreadPoolExecutor(max_workers=max(1, self.a.jobs)) as pool:
            confs = list(pool.map(lambda ts: runner.resolve_config(
                self.npusim, self.space.chip_path, self.space.fixed + ts[1]), batch))
        records, jobs = {}, []
        for i, conf in enumerate(confs):
            for j, w in enumerate(self.space.workloads):
                key = runner.point_key(self.ctx, conf, w)
                rec = runner.load_point(self.ctx, key)
                if rec is None and not conf.ok:
                    rec = runner.run_point(self.ctx, conf, w, key)  # the rejection, no process
                if rec is not None:
                    records[(i, j)] = rec
                    progress.finished(rec, self.label(batch[i], w), stored=True)
                else:
                    jobs.append(((i, j), self.ctx, conf, w, key))
        for (i, j), rec in (ex.run(jobs) if jobs else []):
            runner.store_point(self.ctx, rec)
            records[(i, j)] = rec
            progress.finished(rec, self.label(batch[i], self.space.workloads[j]))
        return [(conf, [records[(i, j)] for j in range(len(self.space.workloads))])
                for i, conf in enumerate(confs)]

    def label(self, ts, w):
        trial, sets = ts
        return f"trial {trial.number} {w['name']} | " + ", ".join(
            f"{k.split('.')[-1]}={v}" for k, v in sets[:len(self.space.params)])

    def tell(self, study, trial, sets, conf, recs):
        import optuna  # noqa: PLC0415
        m, reason = trial_metrics(self.space, conf, recs)
        trial.set_user_attr("sets", sets)
        if m is None or any(m.get(o) is None for o in self.space.objectives):
            trial.set_user_attr("reason", reason or "an objective has no value (model workload?)")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return
        values = {k: (int(n) if n.is_integer() else n) for k, v in sets
                  if (n := numeric_value(v)) is not None}
        values.update({k: v for k, v in m.items() if v is not None})
        try:
            cons = [c.violation(values) for c in self.space.constraints]
        except (ExprError, KeyError, ArithmeticError) as e:
            trial.set_user_attr("reason", f"constraint: {e}")
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return
        trial.set_user_attr("metrics", m)
        trial.set_user_attr("constraints", cons)
        for i, v in enumerate(cons):
            trial.set_constraint(f"c{i}", v)
        study.tell(trial, [m[o] for o in self.space.objectives])


def write_outputs(space, study, out_dir, plots):
    import optuna  # noqa: PLC0415
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    feasible = [t for t in done if all(c <= 0 for c in constraints_of(t))]
    front = {t.number for t in feasible if not any(
        all(a <= b for a, b in zip(o.values, t.values)) and o.values != t.values for o in feasible)}
    metric_cols = list(OBJECTIVE_METRICS) + [f"hwm_{b}_bytes" for b in runner.HWM_BUFFERS] + [
        "hbm_stacks"]
    header = ["trial", "state"] + space.columns + [f"objective[{o}]" for o in space.objectives] + \
        metric_cols + [f"constraint[{c.text}]" for c in space.constraints] + [
        "feasible", "pareto", "reason"]
    rows = []
    for t in trials:
        sets = dict(t.user_attrs.get("sets", []))
        m = t.user_attrs.get("metrics", {})
        state = {"COMPLETE": "ok", "FAIL": "error"}.get(t.state.name, t.state.name.lower())
        row = {"trial": t.number, "state": state, "reason": t.user_attrs.get("reason", "")}
        row.update({c: sets.get(c, "") for c in space.columns})
        for o in space.objectives:
            row[f"objective[{o}]"] = report.cell(m.get(o), "{:.6g}")
        for c in metric_cols:
            row[c] = report.cell(m.get(c), "{:.6g}")
        for c, v in zip(space.constraints, constraints_of(t)):
            row[f"constraint[{c.text}]"] = report.cell(v, "{:.6g}")
        row["feasible"] = ("yes" if t in feasible else "no") if t in done else ""
        row["pareto"] = "yes" if t.number in front else "no"
        rows.append(row)
    report.write_csv(os.path.join(out_dir, "trials.csv"), header, rows)
    report.write_csv(os.path.join(out_dir, "pareto.csv"), header,
                     [r for r in rows if r["pareto"] == "yes"])
    if plots:
        write_front_plot(space, out_dir, feasible, front)
    return len(done), len(feasible), len(front)


def write_front_plot(space, out_dir, feasible, front):
    plt = report._pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    objs = space.objectives
    x = (lambda t: t.values[0]) if len(objs) > 1 else (lambda t: t.number)
    y = (lambda t: t.values[1]) if len(objs) > 1 else (lambda t: t.values[0])
    ax.scatter([x(t) for t in feasible], [y(t) for t in feasible], color="tab:blue", s=14,
               label="feasible trials")
    pts = sorted((x(t), y(t)) for t in feasible if t.number in front)
    ax.plot([p[0] for p in pts], [p[1] for p in pts], color="tab:red", marker="o",
            drawstyle="steps-post" if len(objs) > 1 else "default", label="Pareto front")
    ax.set_xlabel(OBJECTIVE_METRICS[objs[0]] if len(objs) > 1 else "trial")
    ax.set_ylabel(OBJECTIVE_METRICS[objs[1 if len(objs) > 1 else 0]])
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"npusim explore: {' vs '.join(objs[:2])}" + (
        f" (front over {len(objs)} objectives)" if len(objs) > 2 else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "pareto.png"), dpi=90, metadata={"Software": None})
    plt.close(fig)


def run(a):
    try:
        space = load_space(a.space)
    except GridError as e:
        print(f"npusim explore: error: {e}", file=sys.stderr)
        return 1
    if not (os.path.isfile(a.npusim) and os.access(a.npusim, os.X_OK)):
        print(f"npusim explore: error: --npusim '{a.npusim}' is not an executable", file=sys.stderr)
        return 1
    try:
        import optuna  # noqa: PLC0415
    except ImportError:
        print("npusim explore: error: Optuna is not installed (scripts/setup.sh installs "
              "requirements.txt)", file=sys.stderr)
        return 1
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    logging.getLogger("optuna").setLevel(logging.WARNING)
    s = space.search
    trials = a.trials or s["trials"]
    seed = s["seed"] if a.seed is None else a.seed
    batch = s["batch"] or (s["population"] if s["sampler"] == "nsga2" else 4)
    out_dir = a.out or (os.path.splitext(os.path.basename(a.space))[0] + "_explore")
    os.makedirs(out_dir, exist_ok=True)
    study = optuna.create_study(
        storage=f"sqlite:///{os.path.abspath(os.path.join(out_dir, 'study.db'))}",
        study_name=STUDY, load_if_exists=True, directions=["minimize"] * len(space.objectives),
        sampler=make_sampler(optuna, s, seed))
    ex_objs = study.user_attrs.get("objectives")
    if ex_objs is not None and ex_objs != space.objectives:
        print(f"npusim explore: error: {out_dir}/study.db is a study of objectives {ex_objs}, "
              f"the space file has {space.objectives} (use another --out)", file=sys.stderr)
        return 1
    study.set_user_attr("objectives", space.objectives)
    all_trials = study.get_trials(deepcopy=False)
    unfinished = [t for t in all_trials if t.state == optuna.trial.TrialState.RUNNING]
    done = len(all_trials) - len(unfinished)
    ex_name = f"ray {a.ray}" if a.ray else f"jobs {a.jobs}"
    print(f"explore {a.space}: {len(space.params)} parameter(s), {space.size()} configs in the "
          f"space; {s['sampler']} seed {seed}; {trials} trials ({done} done, {len(unfinished)} "
          f"unfinished), batches of {batch}; {ex_name}; out {out_dir}", flush=True)
    explorer = Explorer(a, space, out_dir, os.path.abspath(a.npusim))
    left = max(0, trials - done)
    ex = executor.make_executor(a.ray, a.jobs, a.ray_node_ip, explorer.log) if left else None
    progress = Progress(left * len(space.workloads), sys.stdout, a.quiet)
    t0 = time.monotonic()
    try:
        # Trials a killed driver left running: evaluate them with their stored overrides.
        pending = [(t._trial_id, t.user_attrs.get("sets")) for t in unfinished]
        while left > 0:
            if pending:
                take, pending = pending[:batch], pending[batch:]
                asked = []
                for trial_id, sets in take:
                    trial = optuna.trial.Trial(study, trial_id)
                    asked.append((trial, sets or space.sets_of(trial)))
            else:
                asked = []
                for _ in range(min(batch, left)):
                    trial = study.ask()
                    try:
                        sets = space.sets_of(trial)
                    except GridError as e:
                        trial.set_user_attr("reason", str(e))
                        study.tell(trial, state=optuna.trial.TrialState.FAIL)
                        left -= 1
                        continue
                    trial.set_user_attr("sets", sets)  # stored at once: a resumed run reuses it
                    asked.append((trial, sets))
            for (trial, sets), (conf, recs) in zip(asked, explorer.evaluate(ex, asked, progress)):
                explorer.tell(study, trial, sets, conf, recs)
            left -= len(asked)
    finally:
        if ex:
            ex.close()
    n_done, n_feasible, n_front = write_outputs(space, study, out_dir, not a.no_plots)
    print(f"done: {n_done} trial(s) completed, {n_feasible} feasible, {n_front} on the Pareto "
          f"front; {os.path.join(out_dir, 'trials.csv')}, pareto.csv"
          f"{'' if a.no_plots else ', pareto.png'}; {time.monotonic() - t0:.1f} s", flush=True)
    return 0


def main(argv=None):
    return run(parse_args(sys.argv[1:] if argv is None else argv))

