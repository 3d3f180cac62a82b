"""Performance reports of a TensorFlow run on the NPU (docs/reports.md, "From TensorFlow").

The report folder is the command line's (`npusim run --report-dir`): op_summary.csv (one row per
kernel launch, Op Name = the TF node name, OP Type = the TF op type), op_statistic.csv,
instructions.csv, counters.json, chip.yaml, trace.json (host lane with HDC copies and TF op
spans, one lane per pipe per core for the first launches), summary.txt and the plots; with several
NPUs also a folder device_<k>/ per chip k with its launches (msprof's layout). The
plugin's C++ report writer (adapter/profiler/runtime_report.h) writes it; this module calls it
through the plugin's npusim_tf_* hooks (python_hooks.cpp).

    with npusim.profile("/tmp/rep"):     # only the launches inside the block
        model.fit(x, y, epochs=1)
    npusim.write_report("/tmp/all")      # every launch since the device opened
    print(npusim.format_op_summary(npusim.op_summary(top=10)))

NPUSIM_REPORT_DIR (or configure(report_dir=...)) writes the whole run's report at exit.
"""

import ctypes
import json
import os
import re
import sys

from ._plugin import NpusimError

# tools/npusim_report_plots.py of the source tree this package lives in (adapter/tf/python/npusim).
_SOURCE_DIR = os.environ.get("NPUSIM_SOURCE_DIR") or os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))))
PLOT_SCRIPT = os.path.join(_SOURCE_DIR, "tools", "npusim_report_plots.py")


class _Hooks:
    """The report hooks of the loaded plugin."""

    def __init__(self, path):
        self._lib = ctypes.CDLL(path)
        for name, args in (("npusim_tf_report_begin", [ctypes.c_char_p]),
                           ("npusim_tf_write_report", [ctypes.c_char_p, ctypes.c_char_p]),
                           ("npusim_tf_op_summary_json", [ctypes.c_char_p])):
            fn = getattr(self._lib, name)
            fn.restype = ctypes.c_void_p
            fn.argtypes = args
        self._lib.npusim_tf_free.argtypes = [ctypes.c_void_p]
        self._lib.npusim_tf_free.restype = None

    def _json(self, ptr):
        if not ptr:
            return None
        try:
            out = json.loads(ctypes.string_at(ptr).decode("utf-8"))
        finally:
            self._lib.npusim_tf_free(ptr)
        if isinstance(out, dict) and "error" in out:
            raise NpusimError(out["error"])
        return out

    def begin(self, options):
        return self._json(self._lib.npusim_tf_report_begin(json.dumps(options).encode()))

    def write(self, directory, extra):
        return self._json(self._lib.npusim_tf_write_report(os.fspath(directory).encode(),
                                                           json.dumps(extra).encode()))

    def op_summary(self, options):
        return self._json(self._lib.npusim_tf_op_summary_json(json.dumps(options).encode()))


_hooks_instance = None


def _hooks():
    global _hooks_instance  # pylint: disable=global-statement
    if _hooks_instance is None:
        from . import plugin_path  # pylint: disable=import-outside-toplevel
        _hooks_instance = _Hooks(plugin_path())
    return _hooks_instance


def _cpu_fallback_ops():
    """npusim.cpu_fallback_ops() if the package has it and it works, else None ("not
    available" in summary.txt)."""
    package = sys.modules.get(__package__)
    fn = getattr(package, "cpu_fallback_ops", None)
    if not callable(fn):
        return None
    try:
        return fn()
    except Exception:  # pylint: disable=broad-except
        return None


# The phases marked so far (mark_phase), in order: [name or None, device cycle, items, unit]. A
# phase ends where the next mark is; None marks an end without a new phase.
_phase_marks = []
_PHASE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def _device_cycle():
    """Chip 0's device timeline now (AI-core cycles); 0 before the device opens."""
    info = sys.modules[__package__].system_info()
    cycles = info.get("timeline_cycles") or [0]
    return int(cycles[0])


def mark_phase(name, items=None, unit=None):
    """Starts phase `name` of the report at the device timeline's present time and ends the
    phase before it; mark_phase(None) only ends it (docs/reports.md, "Phases"). Marking a name
    again starts another occurrence of that phase (each decode step, each training step). The
    report folder then has a "Phases" section in summary.txt (per name: occurrences, launches
    and time per occurrence, the rate of `items`) and phases/<name>/ with the full report of
    the name's last occurrence. items, unit: the work one occurrence does (items=8,
    unit="tokens"). The marks are cleared with clear_launch_records()."""
    if name is not None and (not isinstance(name, str) or not _PHASE_NAME.fullmatch(name)
                             or name in (".", "..")):
        raise NpusimError(f"mark_phase: phase name {name!r} must be letters, digits, '_', '-' "
                          "and '.' (it names the folder phases/<name>/)")
    if items is not None and not (isinstance(items, (int, float)) and items >= 0):
        raise NpusimError(f"mark_phase({name!r}): items must be a number >= 0, not {items!r}")
    _phase_marks.append([name, _device_cycle(), float(items or 0), str(unit or "")])


def clear_phases():
    """Forgets the phases marked so far."""
    _phase_marks.clear()


def phase_windows(origin_cycle=0):
    """The phases marked since `origin_cycle`: [{"name", "origin_cycle", "end_cycle" (0: still
    open), "items", "unit"}]."""
    out = []
    for i, (name, cycle, items, unit) in enumerate(_phase_marks):
        if name is None or cycle < origin_cycle:
            continue
        end = _phase_marks[i + 1][1] if i + 1 < len(_phase_marks) else 0
        out.append({"name": name, "origin_cycle": cycle, "end_cycle": end, "items": items,
                    "unit": unit})
    return out


def _extra(title, origin_cycle, plots, origin_cycles=None):
    extra = {"title": title, "origin_cycle": int(origin_cycle),
             "cpu_fallback_ops": _cpu_fallback_ops(), "phases": phase_windows(origin_cycle)}
    if origin_cycles:
        extra["origin_cycles"] = [int(c) for c in origin_cycles]
    if plots and os.path.isfile(PLOT_SCRIPT):
        extra["python"] = os.environ.get("NPUSIM_PYTHON") or sys.executable
        extra["plot_script"] = PLOT_SCRIPT
    return extra


def write_report_folder(directory, origin_cycle=0, title=None, plots=True, origin_cycles=None):
    """Writes the report folder of the launches since `origin_cycle` (0: the whole run); with
    several NPUs also device_<k>/ per chip k, its launches since origin_cycles[k] (default:
    origin_cycle). Returns the hook's answer: {"files": [...], "window": {...},
    "plots": {...}}."""
    os.makedirs(directory, exist_ok=True)
    return _hooks().write(directory, _extra(title or f"npusim TensorFlow run ({sys.argv[0]})",
                                            origin_cycle, plots, origin_cycles))


def op_summary(top=None, origin_cycle=0, end_cycle=0):
    """Kernel time per TF op type, longest first: [{"op_type", "count" (runs of the op),
    "tasks" (its kernel launches), "time_us" (sum of the launches' durations),
    "cube_utilization_pct", "vector_utilization_pct" (of the whole chip's peak over that
    time)}] over every launch recorded so far (since the device opened or
    clear_launch_records()); `top` keeps the first rows."""
    rows = _hooks().op_summary({"top": int(top or 0), "origin_cycle": int(origin_cycle),
                                "end_cycle": int(end_cycle)})
    return rows or []


def format_op_summary(rows):
    """A short text table of op_summary() rows."""
    if not rows:
        return "no NPU kernels ran"
    total = sum(r["time_us"] for r in rows) or 1.0
    width = max(12, max(len(r["op_type"]) for r in rows))
    lines = [f"{'op type':<{width}} {'count':>6} {'time(us)':>12} {'share':>6} "
             f"{'cube %':>7} {'vector %':>8}"]
    for r in rows:
        lines.append(f"{r['op_type']:<{width}} {r['count']:>6} {r['time_us']:>12.3f} "
                     f"{100.0 * r['time_us'] / total:>5.1f}% {r['cube_utilization_pct']:>7.2f} "
                     f"{r['vector_utilization_pct']:>8.2f}")
    return "\n".join(lines)


class profile:  # pylint: disable=invalid-name  (used like a function: `with npusim.profile(d):`)
    """Context manager: records the NPU launches made inside the block and writes their report
    folder to `directory` at the block's end (also when the block raises). trace_launches and
    trace_max_events cap the per-pipe instruction detail of trace.json (defaults:
    NPUSIM_TRACE_DETAIL_LAUNCHES, NPUSIM_TRACE_MAX_EVENTS, else 50 launches, 1,000,000 events).
    Blocks do not nest. After the block: .directory, .files, .op_summary(top)."""

    _active = None

    def __init__(self, directory, trace_launches=None, trace_max_events=None, plots=True):
        self.directory = os.fspath(directory)
        self.files = []
        self._options = {}
        if trace_launches is not None:
            self._options["trace_launches"] = int(trace_launches)
        if trace_max_events is not None:
            self._options["trace_max_events"] = int(trace_max_events)
        self._plots = plots
        self._window = None
        self._origin_cycles = []

    def __enter__(self):
        if profile._active is not None:
            raise NpusimError("npusim.profile: blocks do not nest (one is already active for "
                              f"{profile._active.directory})")
        begin = _hooks().begin(self._options)
        self._window = {"origin_cycle": begin["origin_cycle"], "end_cycle": 0}
        self._origin_cycles = begin.get("origin_cycles") or []
        profile._active = self
        return self

    def __exit__(self, *exc):
        profile._active = None
        result = write_report_folder(self.directory, self._window["origin_cycle"],
                                     title=f"npusim.profile({self.directory})", plots=self._plots,
                                     origin_cycles=self._origin_cycles)
        self.files = result.get("files", [])
        if "window" in result:
            self._window = result["window"]
        return False

    def op_summary(self, top=None):
        """op_summary() of the block's launches."""
        if self._window is None:
            raise NpusimError("npusim.profile: op_summary() before the block ran")
        return op_summary(top, self._window["origin_cycle"], self._window["end_cycle"])
