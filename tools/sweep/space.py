"""The space file of `npusim explore`: ranges instead of value lists, objectives, constraints and
the search settings; the rest (chip, fixed, derived, workloads, ...) as in a grid file.

  space:        {dotted.key: RANGE}; RANGE is one of
                  {int: [LO, HI]} (optional step: S)     integers LO..HI
                  {pow2: [LO, HI]}                       powers of two, e.g. [256 KiB, 2 MiB]
                  {choices: [v1, v2, ...]}               any values, as in a grid list
  objectives:   [METRIC, ...] to minimise (OBJECTIVE_METRICS), at least one
  constraints:  ["EXPRESSION", ...] over the metrics and the keys, e.g. "area_mm2 <= 250",
                "hwm_l1_bytes <= 0.75 * cores.aic.buffers.l1" (a trial is feasible when all hold)
  search:       {sampler: nsga2 | tpe, trials: N, seed: S, population: P (nsga2), batch: B}
docs/sweep.md, "Design-space search".
"""
import ast
import math

from sweep.expr import Expr, ExprError
from sweep.grid import (COMMON_KEYS, _check_key, _err, _value_list, derive,
                        numeric_value, parse_common, read_file)
from sweep.runner import HWM_BUFFERS

TOP_KEYS = COMMON_KEYS[:2] + ("space", "objectives", "constraints", "search") + COMMON_KEYS[2:]

# Metrics of a trial (sums over the workloads unless said otherwise).
OBJECTIVE_METRICS = {
    "time_us": "total simulated time of the workloads (us)",
    "area_mm2": "area proxy (mm^2)",
    "die_mm2": "area proxy plus HBM PHYs (mm^2)",
    "cost_usd": "cost proxy: die and HBM stacks (USD)",
    "energy_uj": "total energy of the workloads (uJ)",
    "power_w": "average power over the workloads (W): energy / time",
}
# Also usable in constraints: the buffer high-water marks (max over the workloads), HBM stacks.
CONSTRAINT_METRICS = tuple(OBJECTIVE_METRICS) + tuple(f"hwm_{b}_bytes" for b in HWM_BUFFERS) + (
    "hbm_stacks",)
SAMPLERS = ("nsga2", "tpe")


def size_text(n):
    """Bytes as the config's size text: "512 KiB", "2 MiB", or plain bytes."""
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult} {unit}"
    return str(n)


class Param:
    """One dimension: kind int/pow2/choices; `suggest(trial)` gives the value's text."""

    def __init__(self, path, key, spec):
        where = f"space.{key}"
        if not isinstance(spec, dict) or len(set(spec) & {"int", "pow2", "choices"}) != 1:
            raise _err(path, where, "expected one of {int: [LO, HI]}, {pow2: [LO, HI]}, "
                       "{choices: [values]}")
        self.key = key
        self.kind = next(k for k in ("int", "pow2", "choices") if k in spec)
        extra = set(spec) - {self.kind} - ({"step"} if self.kind == "int" else set())
        if extra:
            raise _err(path, f"{where}.{sorted(extra)[0]}", "unknown key")
        v = spec[self.kind]
        if self.kind == "choices":
            self.choices = _value_list(path, f"{where}.choices", v)
            return
        if not isinstance(v, list) or len(v) != 2:
            raise _err(path, f"{where}.{self.kind}", "expected [LO, HI]")
        lo, hi = (numeric_value(x) for x in v)
        if lo is None or hi is None or lo > hi or lo <= (0 if self.kind == "pow2" else -math.inf):
            raise _err(path, f"{where}.{self.kind}", f"bad range {v!r} (LO <= HI, numbers)")
        if self.kind == "int":
            self.lo, self.hi, self.step = int(lo), int(hi), spec.get("step", 1)
            if not isinstance(self.step, int) or self.step < 1 or (self.hi - self.lo) % self.step:
                raise _err(path, f"{where}.step", "expected a positive integer that divides HI - LO")
        else:
            self.lo, self.hi = math.log2(lo), math.log2(hi)
            if not (self.lo.is_integer() and self.hi.is_integer()):
                raise _err(path, f"{where}.pow2", f"{v!r}: LO and HI must be powers of two")
            self.lo, self.hi = int(self.lo), int(self.hi)
            self.sized = any(isinstance(x, str) for x in v)

    def suggest(self, trial):
        if self.kind == "choices":
            return trial.suggest_categorical(self.key, self.choices)
        if self.kind == "int":
            return str(trial.suggest_int(self.key, self.lo, self.hi, step=self.step))
        e = trial.suggest_int(self.key, self.lo, self.hi)  # the exponent: neighbours are close
        return size_text(1 << e) if self.sized else str(1 << e)

    def values(self):
        """Every value of the range (for the size of the space)."""
        if self.kind == "choices":
            return list(self.choices)
        if self.kind == "int":
            return [str(x) for x in range(self.lo, self.hi + 1, self.step)]
        return [size_text(1 << e) if self.sized else str(1 << e) for e in range(self.lo, self.hi + 1)]


class Constraint:
    """"lhs <= rhs" (also <, >=, >) gives the violation lhs - rhs (<= 0 when it holds, as Optuna
    wants); any other expression is 0 when true, 1 when false."""

    def __init__(self, path, i, text, known):
        try:
            self.expr = Expr(text, known)
        except ExprError as e:
            raise _err(path, f"constraints[{i}]", str(e)) from None
        self.text = str(text)
        t = self.expr.tree
        self.sides = None
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(
                t.ops[0], (ast.LtE, ast.Lt, ast.GtE, ast.Gt)):
            lhs, rhs = t.left, t.comparators[0]
            self.sides = (lhs, rhs) if isinstance(t.ops[0], (ast.LtE, ast.Lt)) else (rhs, lhs)

    def violation(self, values):
        if self.sides:
            lhs, rhs = (self.expr.evaluate(values, side) for side in self.sides)
            return float(lhs - rhs)
        return 0.0 if self.expr.evaluate(values) else 1.0


class Space:
    def __init__(self, path, common, params, objectives, constraints, search):
        self.path = path
        self.chip, self.chip_path = common["chip"], common["chip_path"]
        self.fixed, self.derived = common["fixed"], common["derived"]
        self.workloads = common["workloads"]
        self.timing_only, self.timeout_s = common["timing_only"], common["timeout_s"]
        self.params, self.objectives, self.constraints = params, objectives, constraints
        self.search = search

    @property
    def columns(self):
        return [p.key for p in self.params] + [k for k, _ in self.derived]

    def size(self):
        return math.prod(len(p.values()) for p in self.params)

    def sets_of(self, trial):
        """The trial's overrides: [(key, text)] of the space (suggested) then the derived keys."""
        sets = [(p.key, p.suggest(trial)) for p in self.params]
        return sets + derive(self.path, self.derived, self.fixed + sets)


def _search(path, doc):
    s = doc.get("search") or {}
    if not isinstance(s, dict):
        raise _err(path, "search", "expected a mapping {sampler, trials, seed, population, batch}")
    out = {"sampler": "nsga2", "trials": 50, "seed": 0, "population": 16, "batch": None}
    for k, v in s.items():
        if k not in out:
            raise _err(path, f"search.{k}", f"unknown key (allowed: {', '.join(out)})")
        if k == "sampler":
            if v not in SAMPLERS:
                raise _err(path, "search.sampler", f"'{v}': expected {' or '.join(SAMPLERS)}")
        elif isinstance(v, bool) or not isinstance(v, int) or v < (0 if k == "seed" else 1):
            raise _err(path, f"search.{k}", f"expected a {'non-negative' if k == 'seed' else 'positive'} integer")
        out[k] = v
    return out


def load_space(path):
    """Reads and checks a space file; raises GridError naming the file and key."""
    doc = read_file(path, TOP_KEYS)
    space = doc.get("space")
    if not isinstance(space, dict) or not space:
        raise _err(path, "space", "expected a non-empty mapping dotted.key: RANGE")
    params = []
    for k, spec in space.items():
        _check_key(path, f"space.{k}", k)
        params.append(Param(path, k, spec))
    common = parse_common(path, doc, set(space))
    objectives = doc.get("objectives")
    if not isinstance(objectives, list) or not objectives:
        raise _err(path, "objectives", f"expected a list of metrics to minimise ({', '.join(OBJECTIVE_METRICS)})")
    for i, o in enumerate(objectives):
        if o not in OBJECTIVE_METRICS:
            raise _err(path, f"objectives[{i}]", f"'{o}' is not one of {', '.join(OBJECTIVE_METRICS)}")
    if len(set(objectives)) != len(objectives):
        raise _err(path, "objectives", "an objective is listed twice")
    known = set(CONSTRAINT_METRICS) | set(space) | {k for k, _ in common["fixed"]} | {
        k for k, _ in common["derived"]}
    cons = doc.get("constraints") or []
    if not isinstance(cons, list):
        raise _err(path, "constraints", "expected a list of expressions")
    constraints = [Constraint(path, i, c, known) for i, c in enumerate(cons)]
    return Space(path, common, params, objectives, constraints, _search(path, doc))
