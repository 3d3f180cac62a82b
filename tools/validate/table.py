"""Errors, the results table, and the mean absolute errors against the issue's targets.

error of a row (docs/validation.md):
  kernel  relative error of time, (t_sim - t_pub) / t_pub; a throughput unit (TFLOPS, GB/s) is
          turned into time first (t = work / throughput), so the sign always means "slower"
  model   relative error of throughput, (x_sim - x_pub) / x_pub
  ratio   absolute difference of the counter, sim - pub
Rows run at an interim size (a model case waiting for timing-only runs) print their error but
are left out of the means: their conditions differ from the published ones. Composite rows (a
kernel case with published_includes: the published time sums kernels the case does not run) print
their error and the kernels, and are left out of the kernel targets' means: they get a mean of
their own, "composite" (a different workload, by the case's key, not by its error).
"""
THROUGHPUT_UNITS = ("TFLOPS", "GB/s", "samples/s")
TARGETS = {"kernel_mae": 0.10, "kernel_max": 0.20, "ratio_abs": 0.05, "model_abs": 0.20}


def row_error(rec):
    """The row's error (see the module doc), or None when it has no simulated figure."""
    sim, pub = rec.get("simulated"), rec["published"]
    if rec["status"] != "ok" or sim is None:
        return None
    if rec["group"] == "ratio":
        return sim - pub
    if rec["group"] == "kernel" and rec["unit"] in THROUGHPUT_UNITS:
        return pub / sim - 1.0
    return sim / pub - 1.0


def counted(rec):
    """Whether the row enters its group's means: it ran at the published conditions (not an
    interim size) and the published figure is its workload alone (not a composite row)."""
    return rec.get("error") is not None and not rec.get("ran", "").startswith("interim") \
        and not rec.get("published_includes")


def composite(rec):
    """Whether the row is a composite kernel row with an error: its mean is the composite one."""
    return rec.get("error") is not None and bool(rec.get("published_includes"))


def summarise(records):
    """Per group and set: n, mean absolute error, worst absolute error (counted rows only); the
    composite kernel rows apart, as group "composite"."""
    out = {}
    for group in ("kernel", "ratio", "model", "composite"):
        for s in ("calibration", "held_out", "all"):
            errs = [abs(r["error"]) for r in records
                    if (composite(r) if group == "composite" else r["group"] == group and counted(r))
                    and (s == "all" or r["set"] == s)]
            if errs:
                out[f"{group}/{s}"] = {"n": len(errs), "mae": sum(errs) / len(errs),
                                       "max": max(errs)}
    return out


def target_lines(summary):
    """The issue's targets, each met or missed, for the groups that have counted rows."""
    lines = []
    k = summary.get("kernel/all")
    if k:
        lines.append(("kernel time MAE <= 10 %", k["mae"] <= TARGETS["kernel_mae"],
                      f"{100 * k['mae']:.1f} % over {k['n']} cases"))
        lines.append(("no kernel case worse than 20 %", k["max"] <= TARGETS["kernel_max"],
                      f"worst {100 * k['max']:.1f} %"))
    r = summary.get("ratio/all")
    if r:
        lines.append(("counter ratios within 0.05", r["max"] <= TARGETS["ratio_abs"],
                      f"worst {r['max']:.3f} over {r['n']} cases"))
    m = summary.get("model/all")
    if m:
        lines.append(("model throughput within 20 %", m["max"] <= TARGETS["model_abs"],
                      f"worst {100 * m['max']:.1f} % over {m['n']} cases"))
    return lines


def fmt_value(v):
    if v is None:
        return "-"
    return f"{v:.4f}" if abs(v) < 10 else f"{v:,.1f}"


def fmt_error(rec):
    e = rec.get("error")
    if e is None:
        return "-"
    return f"{e:+.3f}" if rec["group"] == "ratio" else f"{100 * e:+.1f} %"


def format_table(records):
    head = f"{'case':34} {'set':5} {'chip':5} {'simulated':>11} {'published':>11} {'unit':9} {'error':>9}  note"
    lines = [head, "-" * len(head)]
    for r in records:
        note = r["ran"] if r["status"] == "ok" else \
            (f"[{r['ran']}] " if r["ran"] else "") + f"{r['status']}: {r['reason']}"
        if r.get("published_includes"):
            note = "; ".join(n for n in (note, "published sum includes: " + r["published_includes"])
                             if n)
        lines.append(f"{r['id']:34} {'cal' if r['set'] == 'calibration' else 'held':5} "
                     f"{r['chip']:5} {fmt_value(r['simulated']):>11} {fmt_value(r['published']):>11} "
                     f"{r['unit']:9} {fmt_error(r):>9}  {note}".rstrip())
    return "\n".join(lines)


def format_summary(summary):
    lines = ["", "mean absolute error (cases run at the published conditions):"]
    names = {"kernel": "kernel time", "ratio": "counter ratio", "model": "model throughput"}
    for key, s in summary.items():
        group, which = key.split("/")
        if which == "all" or group == "composite":
            continue
        value = f"{s['mae']:.3f} (worst {s['max']:.3f})" if group == "ratio" else \
            f"{100 * s['mae']:.1f} % (worst {100 * s['max']:.1f} %)"
        lines.append(f"  {names[group]:17} {which.replace('_', '-'):12} n={s['n']:<3} {value}")
    if len(lines) == 2:
        lines.append("  (no case ran at its published conditions)")
    c = summary.get("composite/all")
    if c:
        lines.append("kernel, composite (published sum includes kernels not run; not in the "
                     f"targets): n={c['n']}, MAE {100 * c['mae']:.1f} %, worst {100 * c['max']:.1f} %")
    lines.append("targets (issue 16):")
    for text, met, detail in target_lines(summary):
        lines.append(f"  {'met   ' if met else 'MISSED'} {text}: {detail}")
    return "\n".join(lines)
