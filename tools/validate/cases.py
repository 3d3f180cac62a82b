"""The case file: its schema, its checks and the cases it holds.

A case file (YAML) has one top-level key, `cases`, a list of cases. Every case has:
  id          unique name ([a-z0-9_]+)
  set         calibration | held_out (held-out cases never inform a parameter; docs/validation.md)
  chip        preset or chip YAML the case runs on; overrides: {dotted.key: value} (optional, each
              with its source in the file's comments: a SKU fact, not a fitted number)
  published   {value: number, unit: us | ms | TFLOPS | GB/s | samples/s | ratio}
  source      {url, where, how, quality}: where the figure is, how it was measured, how far to trust it
  conditions  what the measurement ran (chip SKU, dtype, shapes, batch, software)
and one workload:
  op: TF op run by `npusim op` (timing-only): inputs [DTYPE:SHAPE, ...], attrs {name: value},
      precision; work {flops: N} (for TFLOPS) or {bytes: N} (for GB/s); for unit ratio,
      metric: the op_summary.csv column compared (e.g. l2_hit_rate); before [OP:SPEC, ...]:
      ops the measurement ran just before the op (`npusim op --before`, not counted: a
      benchmark's L2 flush, which shows only with memory.l2.keep_across_launches); env
      {NPUSIM_NAME: "value"}: compiler switches of the run that make npusim's kernel do what the
      measured kernel did (NPUSIM_L2_STREAM_POLICY: "0", an element-wise kernel's inputs
      allocated in the L2 as Huawei's Add sample's Case 4 does; docs/compiler.md);
      host_loop {calls: N, warmup: W}: the measurement timed N eager framework calls of the op
      back to back (after W warm-ups) and divided by N, e.g. a torch.mm loop around a device
      synchronize: the figure is the time per call of `npusim op --host-loop N --host-warmup W`
      (host issue host.op_dispatch_us a call, the host running ahead of the device)
  kernel: a hand-written kernel (assembly .s or binary .npuk, its path from the repository
      root) run by `npusim run` (timing-only): blocks (block_dim; default every core it runs
      on), args {NAME: integer} (its scalar arguments), buffers [NAME, ...] (its tensor
      arguments, allocated on the device from their declared types, `npusim run --out`), metric
      for unit ratio as for op; the figure is the launch's Task Duration (or the metric). A
      vendor sample's own loop (Huawei's DataCopy sample) run without a compiler in between.
  model: a models/ registry name run by `python -m models.run`: mode, batch, input_size,
      steps (default 1), precision; needs_timing_only: true if the published size only runs
      with timing-only TensorFlow runs; interim {batch, input_size}: the size run until then
Optional: blocked: "why" (the case is listed, not run: e.g. no such model in models/), notes;
  published_includes: "TransData x2, MemSet" (kernel cases): the published time sums kernels the
      case does not run besides its own; the row is printed with its error and kept out of the
      kernel targets' means, in a line of its own (tools/validate/table.py).
Errors (CaseError) name the file, the case and the key.
"""
import os
import re

import yaml

SETS = ("calibration", "held_out")
UNITS = ("us", "ms", "TFLOPS", "GB/s", "samples/s", "ratio")
COMMON_KEYS = ("id", "set", "chip", "overrides", "published", "source", "conditions", "blocked",
               "notes", "published_includes")
KIND_KEYS = {
    "op": ("op", "inputs", "attrs", "precision", "work", "metric", "before", "env", "host_loop"),
    "kernel": ("kernel", "blocks", "args", "buffers", "work", "metric"),
    "model": ("model", "mode", "batch", "input_size", "steps", "precision", "needs_timing_only",
              "interim"),
}
SOURCE_KEYS = ("url", "where", "how", "quality")


class CaseError(Exception):
    """A bad case file; the message names the file, the case and the key."""


class Case(dict):
    """One checked case (a dict of its keys) with its workload kind and comparison group."""

    @property
    def kind(self):
        """op, kernel or model: the case's workload."""
        return next(k for k in KIND_KEYS if k in self)

    @property
    def composite(self):
        """The kernels the published figure sums besides the case's own (published_includes), or
        None: the figure is the case's workload alone."""
        return self.get("published_includes")

    @property
    def group(self):
        """kernel (time compared), ratio (a counter compared as a difference) or model."""
        if self.kind == "model":
            return "model"
        return "ratio" if self["published"]["unit"] == "ratio" else "kernel"


def _fail(path, where, msg):
    raise CaseError(f"{path}: {where}: {msg}")


def _check_keys(path, where, d, allowed):
    for k in d:
        if k not in allowed:
            _fail(path, where, f"unknown key '{k}' (allowed: {', '.join(allowed)})")


def _check_published(path, where, c):
    p = c.get("published")
    if not isinstance(p, dict) or set(p) != {"value", "unit"}:
        _fail(path, where, "'published' must be {value: number, unit: ...}")
    if not isinstance(p["value"], (int, float)) or isinstance(p["value"], bool) or p["value"] <= 0:
        _fail(path, where + ".published.value", f"must be a positive number, not {p['value']!r}")
    if p["unit"] not in UNITS:
        _fail(path, where + ".published.unit", f"'{p['unit']}' is not one of {', '.join(UNITS)}")
    kind = next((k for k in KIND_KEYS if k in c), "model")
    if (kind == "model") != (p["unit"] == "samples/s"):
        _fail(path, where + ".published.unit",
              "model cases compare samples/s; op and kernel cases compare time, TFLOPS, GB/s or "
              "a ratio")
    if "published_includes" in c:
        inc = c["published_includes"]
        if not isinstance(inc, str) or not inc.strip():
            _fail(path, where + ".published_includes",
                  f"must be a non-empty string naming the kernels the published figure sums "
                  f"besides the case's (e.g. \"TransData x2, MemSet\"), not {inc!r}")
        if kind == "model" or p["unit"] == "ratio":
            _fail(path, where + ".published_includes",
                  "only a kernel case (an op's time, TFLOPS or GB/s) sums kernels")


def _check_figure(path, where, c):
    """The keys an op or kernel case's figure needs: work for a rate, metric for a ratio."""
    unit = c["published"]["unit"]
    need = {"TFLOPS": "flops", "GB/s": "bytes"}.get(unit)
    work = c.get("work", {})
    if need and not (isinstance(work, dict) and isinstance(work.get(need), int) and work[need] > 0):
        _fail(path, where + ".work", f"unit {unit} needs work: {{{need}: positive integer}}")
    if (unit == "ratio") != ("metric" in c):
        _fail(path, where + ".metric", "a ratio case names its op_summary.csv column in 'metric' "
              "(and only ratio cases have one)")


def _check_op(path, where, c):
    if not isinstance(c.get("inputs"), list) or not c["inputs"]:
        _fail(path, where + ".inputs", "an op case needs a list of inputs DTYPE:SHAPE")
    if not isinstance(c.get("attrs", {}), dict):
        _fail(path, where + ".attrs", "must be a mapping {name: value}")
    unit = c["published"]["unit"]
    _check_figure(path, where, c)
    before = c.get("before", [])
    if not (isinstance(before, list) and all(isinstance(b, str) and ":" in b for b in before)):
        _fail(path, where + ".before", "must be a list of OP:DTYPE:SHAPE[,DTYPE:SHAPE...]")
    env = c.get("env", {})
    if not (isinstance(env, dict) and all(re.fullmatch(r"NPUSIM_[A-Z0-9_]+", str(k)) and
                                          isinstance(v, str) for k, v in env.items())):
        _fail(path, where + ".env", "must be a mapping {NPUSIM_NAME: \"value\"} (strings)")
    loop = c.get("host_loop")
    if loop is not None:
        if not (isinstance(loop, dict) and set(loop) <= {"calls", "warmup"} and "calls" in loop and
                all(isinstance(v, int) and not isinstance(v, bool) for v in loop.values()) and
                loop["calls"] >= 1 and loop.get("warmup", 0) >= 0):
            _fail(path, where + ".host_loop", "must be {calls: N >= 1, warmup: N >= 0}")
        if unit == "ratio":
            _fail(path, where + ".host_loop", "a ratio case reads a counter, not a loop's time")


def _check_kernel(path, where, c, root):
    k = c["kernel"]
    if not (isinstance(k, str) and k.endswith((".s", ".npuk"))):
        _fail(path, where + ".kernel", f"must be the path of a .s or .npuk file, not {k!r}")
    if root is not None and not os.path.isfile(os.path.join(root, k)):
        _fail(path, where + ".kernel", f"no such file '{k}' (paths are from the repository root)")
    blocks = c.get("blocks", 1)
    if not (isinstance(blocks, int) and not isinstance(blocks, bool) and blocks >= 1):
        _fail(path, where + ".blocks", f"must be a positive integer, not {blocks!r}")
    args = c.get("args", {})
    if not (isinstance(args, dict) and all(
            re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(n)) and isinstance(v, int) and
            not isinstance(v, bool) for n, v in args.items())):
        _fail(path, where + ".args", "must be a mapping {NAME: integer}")
    bufs = c.get("buffers", [])
    if not (isinstance(bufs, list) and all(
            isinstance(b, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", b) for b in bufs)):
        _fail(path, where + ".buffers", "must be a list of argument names")
    _check_figure(path, where, c)


def _check_model(path, where, c):
    for k in ("mode", "batch"):
        if k not in c:
            _fail(path, where, f"a model case needs '{k}'")
    if c["mode"] not in ("infer", "train"):
        _fail(path, where + ".mode", f"'{c['mode']}' is not infer or train")
    interim = c.get("interim")
    if interim is not None and not (isinstance(interim, dict) and set(interim) <= {"batch", "input_size"}):
        _fail(path, where + ".interim", "must be {batch: N, input_size: N}")


def check_case(path, index, c, seen, root=None):
    where = f"cases[{index}]"
    if not isinstance(c, dict):
        _fail(path, where, "a case is a mapping")
    where = f"case '{c.get('id', index)}'"
    kinds = [k for k in KIND_KEYS if k in c]
    if len(kinds) != 1:
        _fail(path, where, "a case has exactly one workload: 'op', 'kernel' or 'model'")
    _check_keys(path, where, c, COMMON_KEYS + KIND_KEYS[kinds[0]])
    for k in ("id", "set", "chip", "published", "source", "conditions"):
        if k not in c:
            _fail(path, where, f"missing key '{k}'")
    if not re.fullmatch(r"[a-z0-9_]+", str(c["id"])):
        _fail(path, where + ".id", "use lower-case letters, digits and _")
    if c["id"] in seen:
        _fail(path, where + ".id", "the id is used twice")
    if c["set"] not in SETS:
        _fail(path, where + ".set", f"'{c['set']}' is not one of {', '.join(SETS)}")
    if not isinstance(c.get("overrides", {}), dict):
        _fail(path, where + ".overrides", "must be a mapping {dotted.key: value}")
    src = c["source"]
    if not isinstance(src, dict) or not src.get("url") or not src.get("quality"):
        _fail(path, where + ".source", "needs at least url and quality")
    _check_keys(path, where + ".source", src, SOURCE_KEYS)
    _check_published(path, where, c)
    if kinds[0] == "op":
        _check_op(path, where, c)
    elif kinds[0] == "kernel":
        _check_kernel(path, where, c, root)
    else:
        _check_model(path, where, c)
    return Case(c)


def load_cases(path, root=None):
    """The checked cases of a case file, in file order (ROOT: the repository root, where a
    kernel case's file must exist; None: not checked)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise CaseError(f"{path}: cannot read: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise CaseError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(doc, dict) or set(doc) != {"cases"} or not isinstance(doc["cases"], list):
        raise CaseError(f"{path}: the file must have one top-level key 'cases' with a list of cases")
    seen, out = set(), []
    for i, c in enumerate(doc["cases"]):
        out.append(check_case(path, i, c, seen, root))
        seen.add(c["id"])
    return out
