"""npusim: TensorFlow on an emulated Ascend-class NPU.

    import npusim              # one line: TensorFlow now has a device /NPU:0
    import tensorflow as tf
    tf.config.list_physical_devices("NPU")

`import npusim` loads the PluggableDevice plugin (libnpusim_tf_plugin.so) into TensorFlow. It
works whether tensorflow was imported before or after, as long as TensorFlow has not yet created
its devices: that happens at the first op (or tf.config.list_logical_devices()), and a device
registered later never appears in the process. Importing npusim too late raises NpusimError
saying so.

The chip is chosen when TensorFlow creates the device, from NPUSIM_CHIP (default 910b),
NPUSIM_CHIP_OVERRIDES, NPUSIM_PRECISION_MODE, NPUSIM_MODIFY_MIXLIST and NPUSIM_FUNCTIONAL (0: timing-only); configure()
sets them. NPUSIM_RECORD_LAUNCHES=0 turns off the per-launch records (launch_records()), which
otherwise grow with every kernel.
One process runs one chip config (SystemC elaborates one chip per process). NPUSIM_CHIPS=N or
NPUSIM_SYSTEM (a system preset or YAML) make N NPU devices instead, each a chip of one simulated
system joined by modelled links (npusim.distribute: collectives, MirroredStrategy); set them
before `import npusim`, or call configure(chips=..., system=...) before the first op.

Keras 3: jit_compile="auto" would turn on XLA because a non-CPU device exists, and XLA cannot
compile for the NPU; importing npusim makes "auto" resolve to False (see _keras.py).
"""

import atexit
import json
import os

from . import _keras, _memory, _offline, _plugin, _report, distribute
from ._chakra import export_chakra
from ._plugin import NpusimError
from ._report import format_op_summary, mark_phase, op_summary, profile

__all__ = [
    "NpusimError",
    "clear_launch_records",
    "compiled_ops",
    "clear_cpu_fallback_ops",
    "configure",
    "cpu_fallback_ops",
    "device_info",
    "distribute",
    "export_chakra",
    "system_info",
    "format_op_summary",
    "host_cpu_seconds",
    "launch_records",
    "load_offline_model",
    "mark_phase",
    "op_summary",
    "plugin_path",
    "profile",
    "write_report",
]

PRECISION_MODES = ("must_keep_origin_dtype", "allow_fp32_to_fp16", "allow_mix_precision")
DEFAULT_CHIP = "910b"
DEFAULT_PRECISION_MODE = "allow_fp32_to_fp16"

_PLUGIN_PATH = _plugin.find_plugin()
_plugin.load(_PLUGIN_PATH)
_hooks = _plugin.Hooks(_PLUGIN_PATH)
_keras.install()
_memory.install(_hooks)
distribute.install()


def load_offline_model(path, chip=None):
    """An offline model (.om from `npusim compile`) as a callable: load_offline_model(p)(x) runs
    one inference with `npusim infer` in a child process and returns the output array (a dict by
    name for several outputs). chip: if given, the model must have been compiled for it."""
    return _offline.load_offline_model(path, chip=chip, plugin_path=_PLUGIN_PATH)


def plugin_path():
    """The loaded plugin library."""
    return _PLUGIN_PATH


def _overrides_list(overrides):
    if isinstance(overrides, dict):
        return [f"{k}={v}" for k, v in overrides.items()]
    if isinstance(overrides, str):
        raise TypeError("overrides: give a dict {key: value} or a list of 'key=value' strings")
    items = [str(o).strip() for o in overrides]
    for o in items:
        if "=" not in o:
            raise ValueError(f"override '{o}' is not of the form key=value")
        if ";" in o or "\n" in o:
            raise ValueError(f"override '{o}' must not contain ';' or a newline")
    return items


def configure(chip=None, overrides=None, report_dir=None, precision_mode=None, functional=None,
              graph_mode=None, chips=None, system=None, grad_split=None, modify_mixlist=None):
    """Chooses the chip TensorFlow's NPU will emulate. Arguments left None keep their setting.

    chip: a preset name ("910b", "910", "310p", "tiny") or a chip YAML file.
    overrides: {"dotted.key": value} or ["dotted.key=value", ...] applied to the chip config
        ([] or {} clears them).
    report_dir: where write_report() writes the whole run's report folder at interpreter exit
        (op_summary.csv, trace.json, summary.txt, ...: docs/reports.md, "From TensorFlow").
    precision_mode: how fp32 cube ops run (CANN names): must_keep_origin_dtype,
        allow_fp32_to_fp16 (default), allow_mix_precision (CANN's automatic mixed precision: a
        graph pass runs the trustlisted ops, and the graylisted ones after them, in float16:
        docs/tf_plugin.md, "Mixed precision").
    modify_mixlist: a json file in CANN's modify_mixlist format ({"black-list": {"to-add":
        [...], "to-remove": [...]}, "white-list": {...}}) changing allow_mix_precision's
        built-in lists; "" goes back to them. A file that does not load raises NpusimError
        naming the file and key.
    functional: True (default) computes every kernel's results; False runs timing-only: every
        launch takes the simulated time and counts exactly what a functional run would, but
        kernels compute nothing and device memory holds no data, so every tensor the NPU
        produces (and what is copied back from it) is undefined (zeros here). For simulated
        time at batch sizes whose tensors would not fit this host (docs/tf_plugin.md,
        "Timing-only runs", also says which kernels' timing depends on data).
    graph_mode: True (default) runs the NPU nodes of tf.function graphs as whole graphs (one
        task list per step with a static memory plan: docs/tf_plugin.md, "Whole-graph
        execution"); False runs them node by node. Unlike the other settings it may change at any
        time: it applies to the tf.function graphs traced after the call.
    chips: N >= 1 NPU devices, each a chip of one simulated system (one SystemSimulator): with
        `system`, its first N chips; else N chips of `chip` joined as the 910b-x8 preset joins
        its 8 (HCCS full mesh; N > 8 in servers of 8). 1 (or None without a system): the one
        chip of a plain NPU.
    system: a system preset ("910b-x8", "910b-x16", "tiny-x8") or a system YAML file: every
        chip of it (or the first `chips`) is an NPU device; `chip`, if given, replaces the
        system's chip and `overrides` apply to it. docs/multichip.md, "TensorFlow".
    grad_split: how MirroredStrategy fuses a step's gradients into all-reduces (the CANN TF
        adapter's gradient split strategy): "hccl" (default: two segments of 96.54 % and 3.46 %
        of the bytes), "tensor" (one collective per gradient), a list of percentages of the
        bytes in variable order ([60, 40]) or ("idx", [last gradient index of each segment]).
        Sets NPUSIM_GRAD_SPLIT; like graph_mode it may change at any time and applies to the
        gradients reduced (tf.function graphs traced) after the call. docs/multichip.md,
        "Gradient segments".

    Call it before the first TensorFlow op. Once the device exists its config is fixed:
    asking for another one (another chip count included) raises NpusimError (the same config
    again is fine). A chip or override that does not load raises NpusimError at once, naming the
    file and key.
    """
    env = {}
    if chip is not None:
        env["NPUSIM_CHIP"] = str(chip)
    if overrides is not None:
        env["NPUSIM_CHIP_OVERRIDES"] = ";".join(_overrides_list(overrides))
    if precision_mode is not None:
        if precision_mode not in PRECISION_MODES:
            raise ValueError(f"precision_mode '{precision_mode}' is not one of {PRECISION_MODES}")
        env["NPUSIM_PRECISION_MODE"] = precision_mode
    if modify_mixlist is not None:
        env["NPUSIM_MODIFY_MIXLIST"] = os.fspath(modify_mixlist)
    if functional is not None:
        if not isinstance(functional, bool):
            raise TypeError(f"functional must be True or False, not {functional!r}")
        env["NPUSIM_FUNCTIONAL"] = "1" if functional else "0"
    if chips is not None:
        if isinstance(chips, bool) or not isinstance(chips, int) or chips < 1:
            raise ValueError(f"chips must be a positive integer, not {chips!r}")
        env["NPUSIM_CHIPS"] = str(chips)
    if system is not None:
        env["NPUSIM_SYSTEM"] = os.fspath(system)

    if grad_split is not None:
        os.environ[distribute.SPLIT_ENV] = distribute.grad_split_env(grad_split)
    if graph_mode is not None:
        if not isinstance(graph_mode, bool):
            raise TypeError(f"graph_mode must be True or False, not {graph_mode!r}")
        os.environ["NPUSIM_GRAPH"] = "1" if graph_mode else "0"

    info = _hooks.device()
    if info["open"] and env:
        current = info["settings"]
        wanted = dict(
            current,
            chip=env.get("NPUSIM_CHIP", current["chip"]),
            overrides=(_overrides_list(overrides) if overrides is not None
                       else current["overrides"]),
            precision_mode=env.get("NPUSIM_PRECISION_MODE", current["precision_mode"]),
            functional=(functional if functional is not None else current["functional"]),
            chips=(chips if chips is not None else current["chips"]),
            system=(os.fspath(system) if system is not None else current["system"]),
            modify_mixlist=env.get("NPUSIM_MODIFY_MIXLIST", current["modify_mixlist"]),
        )
        if wanted != current:
            changes = ", ".join(f"{k} {current[k]!r} -> {wanted[k]!r}" for k in wanted
                                if wanted[k] != current.get(k))
            raise NpusimError(
                f"configure: the NPU is already in use, opened by this process's first NPU op "
                f"with {json.dumps(current)}; cannot change {changes}: one chip config per "
                "process (call configure() before the first op, or start a new process per "
                "config, e.g. one per config in a sweep)")
    elif env:
        previous = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        error = _hooks.check_env_settings()
        if error is not None:
            for k, v in previous.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            raise NpusimError(f"configure: {error}")
        if chips is not None or system is not None:
            _refresh_device_count()
    if report_dir is not None:
        os.environ["NPUSIM_REPORT_DIR"] = os.fspath(report_dir)


def _refresh_device_count():
    """TensorFlow asked the plugin for its device count when the plugin loaded; ask again now
    that the settings name another (possible until TensorFlow creates its devices)."""
    if _plugin._devices_created():  # pylint: disable=protected-access
        # The NPU was not opened (else configure() compared settings above), yet TensorFlow's
        # devices exist: they were created with the old count.
        raise NpusimError("configure(chips=..., system=...): TensorFlow has already created its "
                          "devices, so the number of NPUs is fixed; call configure before the "
                          "first op, or set NPUSIM_CHIPS / NPUSIM_SYSTEM before starting Python")
    from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel

    context.context().reinitialize_physical_devices()
    count = _hooks.system()["devices"]
    listed = len(context.context().list_physical_devices("NPU"))
    if listed != count:
        raise NpusimError(f"configure: TensorFlow lists {listed} NPUs but the settings give "
                          f"{count}; set NPUSIM_CHIPS / NPUSIM_SYSTEM before `import npusim`")


def system_info():
    """The NPUs as a system of chips: {"devices": N, "open": bool, and once open "chips",
    "fabric" (per link direction: bytes and busy cycles since open), "peer_copies" (tensors
    copied between NPUs over the links: src_chip, dst_chip, bytes, start_cycle, cycles),
    "timeline_cycles" (each chip's device timeline now: every chip has its own, docs/runtime.md
    "Simulated time"), "host_cycles" (the host clock: the latest device time the host has
    observed, e.g. a tensor read back; ops queued later start no earlier on any chip,
    docs/runtime.md "The host clock") and "collectives" (each collective run: id (1, 2, ... in the order they
    ran), collective, algorithm, op, dtype, label, count, bytes, link_bytes, chips,
    input_launch (per rank: the index among launch_records(chip=chips[r]) of the launch that
    last wrote the bytes it sends, or the last one before the copy that did; -1: none),
    start_cycle, end_cycle, steps, inline_reduce)}.
    Cycles are AI-core cycles on the chips' timelines."""
    return _hooks.system()


def device_info():
    """{"open": bool, "settings": {"chip", "overrides", "precision_mode", "functional", ...}};
    when open also "chip_identity", "hbm_bytes" and the runtime allocator's "memory" figures."""
    return _hooks.device()


def launch_records(with_counters=False, chip=0):
    """Every kernel chip `chip` (NPU:chip) ran, oldest first: dicts with chip, kernel, stream,
    block_dim,
    start_cycle, cycles, time_us, wall_us (host time it took), replayed (a replay of an
    identical earlier launch, docs/chip_model.md "Launch replay"), ok, error, loads_data (the
    kernel reads device memory with its scalar unit, so its timing can depend on data: in a
    timing-only run it may differ from a functional one), aiv_per_aic (a mix kernel's declared
    vector cores per cube core: 1 where it runs one per cube core, 0 the chip's ratio),
    op_name and op_type (the TF op that
    launched it; a multi-tensor optimizer update's launches also give "members", the original
    node names of the members each computes: docs/tf_plugin.md "Optimizer updates"), and the
    launch's counters if asked: with_counters=True gives the counter tree
    (units and descriptions, as counters.json), "flat" a dict {"aic0.mte2.busy_cycles": value}
    of the same counters (what launches.json holds: a fraction of the bytes). start_cycle is on
    the chip's own device timeline; index is the launch's position among the chip's launches;
    reads_collective the id (system_info()["collectives"]) of the latest collective whose
    output the launch reads, 0 if none. A chip that is not an NPU raises NpusimError."""
    records = _hooks.launch_records(with_counters, chip)
    if isinstance(records, dict) and "error" in records:
        raise NpusimError(records["error"])
    return records


def clear_launch_records():
    """Forgets the launch records so far, and the report phases marked (mark_phase)."""
    _hooks.clear_launch_records()
    _report.clear_phases()


def compiled_ops():
    """The plugin's compiled-op cache: hits, misses, failed_compiles, entries, keys."""
    return _hooks.compiled_ops()


def host_cpu_seconds(reset=False):
    """CPU seconds of the plugin's host-side phases since the process started or the last call
    with reset=True (which clears them): {phase: {item: {"calls", "cpu_s"}}} with the phases
    "graph_pass" (the graph optimizer's passes over tf.function graphs, by pass), "compile" (the
    kernel compiler on a compiled-op cache miss, by op type) and "graph_plan" (NpuGraph plans on
    a first run with new input shapes, their compiles not included). Each figure is the CPU time
    of the thread that ran it, the phases exclusive of one another, so they add up."""
    return _hooks.host_cpu_seconds(reset)


def cpu_fallback_ops():
    """{op type: nodes} of the ops TensorFlow ran on the CPU because the NPU has no kernel for
    them (soft placement), as found in every placed tf.function graph (model.fit's steps
    included) by the plugin's graph optimizer; each op type is also warned about once on stderr.
    Host-side ops (tf.data, function arguments, constants, control flow, int32 shape arithmetic)
    are not counted, nor are eager ops outside a tf.function (docs/tf_plugin.md, "CPU
    fallbacks")."""
    return _hooks.cpu_fallback_ops()


def clear_cpu_fallback_ops():
    """Resets the cpu_fallback_ops() counts (the once-per-op-type warnings stay given)."""
    _hooks.clear_cpu_fallback_ops()


def write_report(directory=None):
    """Writes the report folder of every NPU launch since the device opened to `directory`
    (default: NPUSIM_REPORT_DIR): the command line's files (op_summary.csv, op_statistic.csv,
    counters.json, chip.yaml, trace.json, summary.txt, plots; docs/reports.md and _report.py),
    plus the raw device.json, launches.json (with flat counters: launch_records) and
    compiled_ops.json; with several NPUs also device_<k>/ per chip k with its launches' report
    files and launches.json (docs/multichip.md, "Reports of a system run"). Returns the
    directory, or None if the device was never opened (nothing ran on the NPU)."""
    directory = directory or os.environ.get("NPUSIM_REPORT_DIR")
    if not directory:
        raise NpusimError("write_report: no directory given and NPUSIM_REPORT_DIR is not set")
    info = _hooks.device()
    if not info["open"]:
        return None
    os.makedirs(directory, exist_ok=True)
    files = {
        "device.json": json.dumps(info, indent=1),
        "chip.yaml": _hooks.chip_config_yaml() or "",
        "launches.json": json.dumps(_hooks.launch_records("flat")),
        "compiled_ops.json": json.dumps(_hooks.compiled_ops(), indent=1),
        "cpu_fallback_ops.json": json.dumps(_hooks.cpu_fallback_ops(), indent=1),
    }
    for name, text in files.items():
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            f.write(text)
    _report.write_report_folder(directory)
    chips = _hooks.system().get("devices", 1)
    if chips > 1:
        for k in range(chips):
            with open(os.path.join(directory, f"device_{k}", "launches.json"), "w",
                      encoding="utf-8") as f:
                f.write(json.dumps(_hooks.launch_records("flat", k)))
    return directory


def _report_at_exit():
    if os.environ.get("NPUSIM_REPORT_DIR"):
        write_report()


atexit.register(_report_at_exit)
