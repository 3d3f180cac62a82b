"""The grid file: its schema, its checks and its points (config x workload).

A grid file (YAML) has these top-level keys (docs/sweep.md):
  chip:        base chip, a preset name or a YAML path (relative to the grid file); default 910b
  fixed:       {dotted.key: value} overrides applied to every point (optional)
  grid:        {dotted.key: [v1, v2, ...]}: each key is one axis of the cartesian product
  zip:         [{key_a: [..], key_b: [..]}, ...]: each group is one axis whose keys vary together
               (all lists of a group have the same length)
  workloads:   list of {op: ...} | {kernel: ...} | {model: ...} (WORKLOAD_KEYS)
  timing_only: run the workloads in timing-only mode (default true): kernels take their simulated
               time without computing (docs/tf_plugin.md "Timing-only runs"); a workload's own
               `timing_only` overrides it (e.g. false for a model whose loss is wanted)
  timeout_s:   per-point time limit in seconds (default 1800)
  derived:     {dotted.key: "expression"}: keys computed from the swept and fixed keys at every
               point (sweep.expr), e.g. cores.aiv.count: "2 * cores.aic.count"
  resources:   {cpus: N, memory: SIZE}: what each point requests from Ray (--ray); a workload's
               own `resources` overrides it
  description: free text
Errors (GridError) name the file and the key.
"""
import itertools
import os
import re

import yaml

from sweep.expr import Expr, ExprError, number_text

COMMON_KEYS = ("chip", "fixed", "derived", "workloads", "timing_only", "timeout_s", "resources",
               "description")
TOP_KEYS = COMMON_KEYS[:2] + ("grid", "zip") + COMMON_KEYS[2:]

# Per workload kind: the keys it may have (the kind's own key first).
WORKLOAD_KEYS = {
    # a TF op compiled and run by `npusim op`: inputs DTYPE:SHAPE, attrs {name: value}
    "op": ("op", "name", "inputs", "attrs", "precision", "resources", "timing_only"),
    # a hand-written kernel run by `npusim run`: inputs {arg: DTYPE:SHAPE} (random .npy files),
    # outputs {arg: "" | DTYPE:SHAPE}, args {arg: integer}, blocks (block_dim)
    "kernel": ("kernel", "name", "inputs", "outputs", "args", "blocks", "resources", "timing_only"),
    # a model run by `python -m models.run`
    "model": ("model", "name", "mode", "batch", "steps", "input_size", "precision", "resources",
              "timing_only"),
}


class GridError(Exception):
    """A bad grid file; the message names the file and the key."""


def value_text(v):
    """A YAML value as the text of a `--set key=value` override (and of a CSV cell)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "~"
    if isinstance(v, (int, float, str)):
        return str(v)
    return yaml.safe_dump(v, default_flow_style=True, width=1 << 16).strip().removesuffix("...").strip()


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(B|KiB|MiB|GiB|TiB)?\s*$")
_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def numeric_value(text):
    """A parameter value as a number for plotting ("512 KiB" -> 524288), or None."""
    m = _SIZE.match(str(text))
    if not m:
        return None
    return float(m.group(1)) * _UNITS[m.group(2)]


class Grid:
    """A checked grid file. `axes` is a list of (names, values): one name for a grid key, several
    for a zip group, with one tuple of values per step."""

    def __init__(self, path, common, axes):
        self.path = path
        self.chip = common["chip"]            # as given (preset name or path)
        self.chip_path = common["chip_path"]  # the argument for --chip (resolved against the file)
        self.fixed = common["fixed"]          # [(key, text)]
        self.derived = common["derived"]      # [(key, Expr)], evaluated in this order
        self.workloads = common["workloads"]  # [dict], each with "kind", "name", "resources"
        self.timing_only = common["timing_only"]
        self.timeout_s = common["timeout_s"]
        self.axes = axes                      # [([key...], [(text...), ...])]

    @property
    def params(self):
        """The swept keys, in axis order (the parameter columns, the plots' x axes)."""
        return [k for names, _ in self.axes for k in names]

    @property
    def columns(self):
        """The CSV's parameter columns: the swept keys, then the derived ones."""
        return self.params + [k for k, _ in self.derived]

    def configs(self):
        """Every config of the product, in grid order: a list of (index tuple, [(key, text)]),
        the swept values followed by the derived ones."""
        out = []
        ranges = [range(len(values)) for _, values in self.axes]
        for idx in itertools.product(*ranges):
            sets = []
            for (names, values), i in zip(self.axes, idx):
                sets.extend(zip(names, values[i]))
            out.append((idx, sets + derive(self.path, self.derived, self.fixed + sets)))
        return out


def derive(path, derived, sets):
    """The derived keys' values at a point given by `sets` ([(key, text)]): [(key, text)].
    Raises GridError naming the file, the key and the point's values it read."""
    values = dict(sets)
    out = []
    for key, ex in derived:
        nums = {}
        for r in ex.refs:
            n = numeric_value(values[r])
            if n is None:
                raise _err(path, f"derived.{key}", f"'{r}' = {values[r]!r} is not a number")
            nums[r] = int(n) if n.is_integer() else n
        try:
            text = number_text(ex.evaluate(nums))
        except ExprError as e:
            at = ", ".join(f"{r}={values[r]}" for r in ex.refs)
            raise _err(path, f"derived.{key}", f"{e} (at {at})" if at else str(e)) from None
        values[key] = text
        out.append((key, text))
    return out


def _err(path, key, what):
    return GridError(f"{path}: {key}: {what}" if key else f"{path}: {what}")


def _check_key(path, where, key):
    if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z0-9_>\-]+(\.[A-Za-z0-9_>\-]+)*", key):
        raise _err(path, where, f"'{key}' is not a dotted config key (e.g. cores.aic.buffers.l1)")


def _value_list(path, where, v):
    if not isinstance(v, list):
        raise _err(path, where, f"expected a list of values, got {value_text(v)!r}")
    if not v:
        raise _err(path, where, "empty list of values")
    return [value_text(x) for x in v]


def _workload(path, i, w):
    where = f"workloads[{i}]"
    if not isinstance(w, dict):
        raise _err(path, where, "expected a mapping with one of op, kernel, model")
    kinds = [k for k in WORKLOAD_KEYS if k in w]
    if len(kinds) != 1:
        raise _err(path, where, "needs exactly one of 'op', 'kernel', 'model' "
                   f"(has: {', '.join(map(str, w)) or 'nothing'})")
    kind = kinds[0]
    for k in w:
        if k not in WORKLOAD_KEYS[kind]:
            raise _err(path, f"{where}.{k}",
                       f"unknown key for a {kind} workload (allowed: {', '.join(WORKLOAD_KEYS[kind])})")
    out = {"kind": kind}
    if kind == "op":
        out["op"] = str(w["op"])
        inputs = w.get("inputs", [])
        if not isinstance(inputs, list) or not all(isinstance(x, str) for x in inputs):
            raise _err(path, f"{where}.inputs", "expected a list of DTYPE:SHAPE strings, e.g. f16:64x128")
        out["inputs"] = inputs
        attrs = w.get("attrs", {})
        if not isinstance(attrs, dict):
            raise _err(path, f"{where}.attrs", "expected a mapping name: value")
        out["attrs"] = {str(k): attrs[k] for k in attrs}
        if "precision" in w:
            out["precision"] = str(w["precision"])
        default_name = " ".join([out["op"]] + inputs)
    elif kind == "kernel":
        kernel = str(w["kernel"])
        out["kernel"] = kernel  # the runner resolves it (repository root, then the grid's folder)
        for key in ("inputs", "outputs", "args"):
            v = w.get(key, {})
            if not isinstance(v, dict):
                raise _err(path, f"{where}.{key}", "expected a mapping argument: value")
            out[key] = {str(k): ("" if v[k] is None else v[k]) for k in v}
        for k, v in out["args"].items():
            if not isinstance(v, int) or isinstance(v, bool):
                raise _err(path, f"{where}.args.{k}", f"expected an integer, got {v!r}")
        if "blocks" in w:
            if not isinstance(w["blocks"], int) or w["blocks"] < 1:
                raise _err(path, f"{where}.blocks", "expected a positive integer")
            out["blocks"] = w["blocks"]
        default_name = os.path.basename(kernel) + "".join(
            f" {k}={v}" for k, v in out["args"].items())
    else:
        out["model"] = str(w["model"])
        out["mode"] = str(w.get("mode", "infer"))
        if out["mode"] not in ("infer", "train"):
            raise _err(path, f"{where}.mode", f"'{out['mode']}': expected infer or train")
        for key, default in (("batch", 1), ("steps", 1), ("input_size", None)):
            v = w.get(key, default)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise _err(path, f"{where}.{key}", f"expected a positive integer, got {v!r}")
            if v is not None:
                out[key] = v
        if "precision" in w:
            out["precision"] = str(w["precision"])
        default_name = f"{out['model']} {out['mode']} b{out['batch']}" + (
            f" {out['input_size']}px" if "input_size" in out else "")
    out["name"] = str(w.get("name", default_name))
    return out


def read_file(path, allowed):
    """The YAML mapping of a grid or space file; raises GridError (file, line, key)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise GridError(f"{path}: cannot read: {e.strerror}")
    try:
        doc = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        m = e.problem_mark
        where = f":{m.line + 1}:{m.column + 1}" if m else ""
        raise GridError(f"{path}{where}: YAML error: {e.problem or e}")
    if not isinstance(doc, dict):
        raise GridError(f"{path}: expected a mapping with keys {', '.join(allowed)}")
    for k in doc:
        if k not in allowed:
            raise _err(path, k, f"unknown top-level key (allowed: {', '.join(allowed)})")
    return doc


def _flag(path, where, v):
    """A true/false value."""
    if not isinstance(v, bool):
        raise _err(path, where, "expected true or false")
    return v


def _resources(path, where, v, default):
    """A `resources` mapping {cpus, memory} -> {"cpus": float, "memory": bytes}."""
    if v is None:
        return dict(default)
    if not isinstance(v, dict):
        raise _err(path, where, "expected a mapping {cpus: N, memory: SIZE}")
    out = dict(default)
    for k, x in v.items():
        if k == "cpus":
            if isinstance(x, bool) or not isinstance(x, (int, float)) or x <= 0:
                raise _err(path, f"{where}.cpus", f"expected a positive number, got {x!r}")
            out["cpus"] = float(x)
        elif k == "memory":
            n = numeric_value(x)
            if n is None or n < 0:
                raise _err(path, f"{where}.memory", f"expected a size like '4 GiB', got {x!r}")
            out["memory"] = int(n)
        else:
            raise _err(path, f"{where}.{k}", "unknown resource (allowed: cpus, memory)")
    return out


def parse_derived(path, doc, known):
    """`derived:` -> [(key, Expr)]; each may read `known` keys and the derived keys before it."""
    derived = doc.get("derived") or {}
    if not isinstance(derived, dict):
        raise _err(path, "derived", "expected a mapping dotted.key: \"expression\"")
    known, out = set(known), []
    for k, text in derived.items():
        _check_key(path, f"derived.{k}", k)
        if k in known:
            raise _err(path, f"derived.{k}", f"'{k}' is also swept, fixed or derived")
        if isinstance(text, bool) or not isinstance(text, (str, int, float)):
            raise _err(path, f"derived.{k}", "expected an expression (text or a number)")
        try:
            out.append((k, Expr(text, known)))
        except ExprError as e:
            raise _err(path, f"derived.{k}", str(e)) from None
        known.add(k)
    return out


def parse_common(path, doc, swept):
    """The keys grid and space files share (COMMON_KEYS); `swept`: the keys the file varies."""
    chip = str(doc.get("chip", "910b"))
    chip_path = chip
    if "/" in chip or chip.endswith((".yaml", ".yml")):
        chip_path = chip if os.path.isabs(chip) else os.path.join(
            os.path.dirname(os.path.abspath(path)), chip)
        if not os.path.exists(chip_path):
            raise _err(path, "chip", f"file '{chip}' not found (looked for {chip_path})")

    fixed = doc.get("fixed") or {}
    if not isinstance(fixed, dict):
        raise _err(path, "fixed", "expected a mapping dotted.key: value")
    for k in fixed:
        _check_key(path, f"fixed.{k}", k)
        if k in swept:
            raise _err(path, f"fixed.{k}", "is also swept")
    fixed = [(k, value_text(v)) for k, v in fixed.items()]
    derived = parse_derived(path, doc, list(swept) + [k for k, _ in fixed])

    timing_only = _flag(path, "timing_only", doc.get("timing_only", True))
    default_res = _resources(path, "resources", doc.get("resources"), {"cpus": 1.0, "memory": 0})
    workloads = doc.get("workloads")
    if not isinstance(workloads, list) or not workloads:
        raise _err(path, "workloads", "expected a non-empty list of workloads "
                   "({op: ...}, {kernel: ...} or {model: ...})")
    wl = []
    for i, w in enumerate(workloads):
        one = _workload(path, i, w)
        one["resources"] = _resources(path, f"workloads[{i}].resources", w.get("resources"),
                                      default_res)
        one["timing_only"] = _flag(path, f"workloads[{i}].timing_only",
                                   w.get("timing_only", timing_only))
        wl.append(one)
    names = [w["name"] for w in wl]
    for n in names:
        if names.count(n) > 1:
            raise _err(path, "workloads", f"two workloads are named '{n}' (give each a distinct name)")

    timeout_s = doc.get("timeout_s", 1800)
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or timeout_s <= 0:
        raise _err(path, "timeout_s", "expected a positive number of seconds")
    return {"chip": chip, "chip_path": chip_path, "fixed": fixed, "derived": derived,
            "workloads": wl, "timing_only": timing_only, "timeout_s": float(timeout_s)}


def load_grid(path):
    """Reads and checks a grid file; raises GridError naming the file and key."""
    doc = read_file(path, TOP_KEYS)
    axes, seen = [], set()

    def claim(where, key):
        _check_key(path, where, key)
        if key in seen:
            raise _err(path, where, f"'{key}' is swept twice")
        seen.add(key)

    grid = doc.get("grid") or {}
    if not isinstance(grid, dict):
        raise _err(path, "grid", "expected a mapping dotted.key: [values]")
    for k, v in grid.items():
        claim(f"grid.{k}", k)
        axes.append(([k], [(x,) for x in _value_list(path, f"grid.{k}", v)]))
    zips = doc.get("zip") or []
    if not isinstance(zips, list):
        raise _err(path, "zip", "expected a list of groups {key: [values], ...}")
    for gi, group in enumerate(zips):
        if not isinstance(group, dict) or not group:
            raise _err(path, f"zip[{gi}]", "expected a non-empty mapping key: [values]")
        names, lists = [], []
        for k, v in group.items():
            claim(f"zip[{gi}].{k}", k)
            names.append(k)
            lists.append(_value_list(path, f"zip[{gi}].{k}", v))
        if len({len(x) for x in lists}) != 1:
            raise _err(path, f"zip[{gi}]", "the lists of a zip group must have the same length "
                       f"({', '.join(f'{n}: {len(x)}' for n, x in zip(names, lists))})")
        axes.append((names, list(zip(*lists))))
    if not axes:
        raise _err(path, "grid", "empty grid: give at least one key with a list of values "
                   "under grid or zip")
    g = Grid(path, parse_common(path, doc, seen), axes)
    g.configs()  # evaluates the derived keys at every point: their errors stop the sweep here
    return g
