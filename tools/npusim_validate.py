"""Validation against published silicon: `npusim validate [--cases FILE] [--only ID] [--json OUT]`
hands over to this script; it can also be run directly:
`.venv/bin/python tools/npusim_validate.py --npusim build/npusim`. `--set KEY=VALUE` overrides a
chip key in every case (a global calibration, backed by an architecture fact; docs/validation.md).
Runs every case of the case file (default validation/cases.yaml) on its chip preset, prints
case, simulated, published and error, then the mean absolute errors of the calibration and
held-out cases against the issue's targets. Case schema and error definitions:
tools/validate/cases.py, tools/validate/table.py; the cases and results: docs/validation.md.
Exit code: 0 when every case that was run produced a figure (accuracy does not change it),
1 for bad input, 2 when a run failed.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from validate import runner, table  # noqa: E402
from validate.cases import CaseError, load_cases  # noqa: E402


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="npusim validate",
        description="Reproduce published measurements of Ascend silicon on the chip presets and "
                    "print simulated vs published, the error of every case and the mean absolute "
                    "errors (docs/validation.md).")
    ap.add_argument("--cases", default=os.path.join(runner.ROOT, "validation", "cases.yaml"),
                    help="case file (default: validation/cases.yaml)")
    ap.add_argument("--only", action="append", default=[], metavar="ID",
                    help="run only this case (repeat for several)")
    ap.add_argument("--json", dest="json_out", help="write the rows and the summary as JSON")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override a chip key in every case (a global calibration; repeat)")
    ap.add_argument("--npusim", default=os.environ.get("NPUSIM") or
                    os.path.join(runner.ROOT, "build", "npusim"), help="the npusim binary")
    ap.add_argument("--timeout", type=float, default=1800.0, help="per-case limit in seconds")
    ap.add_argument("--list", action="store_true", help="list the cases; run nothing")
    return ap.parse_args(argv)


def select(cases, only, path):
    if not only:
        return cases
    ids = {c["id"] for c in cases}
    unknown = [i for i in only if i not in ids]
    if unknown:
        raise CaseError(f"{path}: no case '{unknown[0]}' (cases: {', '.join(sorted(ids))})")
    return [c for c in cases if c["id"] in only]


def list_cases(cases):
    for c in cases:
        what = {"op": lambda: c["op"], "kernel": lambda: os.path.basename(c["kernel"]),
                "model": lambda: f"{c['model']} {c['mode']} b{c['batch']}"}[c.kind]()
        print(f"{c['id']:34} {c['set']:11} {c['chip']:5} {what:28} {c['source']['quality']}")


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    bad = [kv for kv in a.sets if "=" not in kv]
    if bad:
        print(f"npusim validate: error: --set '{bad[0]}': expected KEY=VALUE", file=sys.stderr)
        return 1
    try:
        cases = select(load_cases(a.cases, runner.ROOT), a.only, a.cases)
    except CaseError as e:
        print(f"npusim validate: error: {e}", file=sys.stderr)
        return 1
    if a.list:
        list_cases(cases)
        return 0
    if not os.access(a.npusim, os.X_OK):
        print(f"npusim validate: error: no npusim binary at '{a.npusim}' (--npusim)", file=sys.stderr)
        return 1
    records = []
    for c in cases:
        print(f"running {c['id']} ...", file=sys.stderr, flush=True)
        rec = runner.run_case(c, a.npusim, a.timeout, a.sets)
        rec["error"] = table.row_error(rec)
        records.append(rec)
    summary = table.summarise(records)
    if a.sets:
        print("global overrides: " + " ".join(a.sets))
    print(table.format_table(records))
    print(table.format_summary(summary))
    if a.json_out:
        with open(a.json_out, "w", encoding="utf-8") as f:
            json.dump({"cases_file": a.cases, "global_overrides": a.sets, "rows": records,
                       "summary": summary}, f, indent=1)
            f.write("\n")
    return 2 if any(r["status"] == "error" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
