"""Chakra execution traces of a data-parallel training step (docs/multichip.md, "Beyond one
server: Chakra traces for ASTRA-sim").

    npusim.export_chakra("out/et", chips=1024, model=model, x=x, y=y)

runs one training step of `model` on the emulated NPU (and then puts its variables back) and
writes `out/et/npusim.<rank>.et`
for ranks 0..chips-1: the step as every data-parallel rank runs it, in the execution-trace
format of MLCommons Chakra that ASTRA-sim reads (the schema: chakra_et_def.proto beside this
file). Each file holds
- a COMP_NODE per TF op run on the NPU, in execution order, with the op's simulated kernel time
  (its launches' durations) as duration_micros, each depending on the one before (one chip runs
  its tasks in order);
- a COMM_COLL_NODE (ALL_REDUCE, comm_size in bytes) per gradient segment: the trainable
  variables' gradients in variable order, split as HCCL's gradient segmentation does
  (set_split_strategy_by_size / _by_idx; default two segments of 96.54 % and 3.46 % of the
  bytes, the CANN TF adapter's default), each depending on the ops that produce its gradients;
- the optimizer's update ops of a variable depending on its segment's all-reduce.

Which op produces a variable's gradient and which ops update it comes from the step's graph:
the step is traced as a tf.function around model.train_step, and for every trainable variable
the ops that write it (Assign*VariableOp) are followed back to the gradient ops they read
(those under the tape's gradient scope). Launches are matched to graph ops by node name (a
multi-tensor update's launch by its members' names, launch_records() "members").

With several NPUs (a model compiled under MirroredStrategy, or no model: what ran since
clear_launch_records()) the traces are what ran, one per chip (export_recorded,
build_chip_nodes): each chip's own launches as compute nodes, its collectives as the collective
engine timed them, and the dependencies the runtime's data readiness used (the launch that last
wrote a collective's input, the launches that read its output).

The file format is Chakra's: a varint-length-prefixed GlobalMetadata message, then one
length-prefixed Node message per node. The messages are written by the small protobuf wire
encoder below (no generated code, so no dependency on a protobuf release);
tests/tf/test_chakra.py parses them with classes compiled by protoc from the .proto.
"""

import math
import os
import re

# Chakra's enums (chakra_et_def.proto): NodeType and CollectiveCommType values.
COMP_NODE = 4
COMM_SEND_NODE = 5
COMM_RECV_NODE = 6
COMM_COLL_NODE = 7
ALL_REDUCE = 0
# The collective engine's collectives (CollectiveRecord::collective) as Chakra's comm_type.
COMM_TYPES = {"all_reduce": ALL_REDUCE, "all_gather": 2, "broadcast": 5, "all_to_all": 6,
              "reduce_scatter": 7}

# HCCL's default gradient segmentation: two segments of 96.54 % and 3.46 % of the gradient bytes
# (CANN TensorFlow migration guide, "Adjusting Gradient Splitting Strategy";
# set_split_strategy_by_size).
HCCL_DEFAULT_SPLIT = (96.54, 3.46)
SCHEMA_VERSION = "0.0.4"  # the Chakra schema version ASTRA-sim's examples carry

_WRITE_OPS = re.compile(r"^(Assign(Add|Sub)?VariableOp|ResourceApply\w+|ResourceScatter\w+)$")


# ---- protobuf wire format -------------------------------------------------------------------
# Field keys: (field number << 3) | wire type; 0 = varint, 2 = length-delimited.

def _varint(n):
    if n < 0:
        n += 1 << 64  # int64: two's complement in 10 bytes
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field, wire_type):
    return _varint((field << 3) | wire_type)


def _uint(field, n, keep_zero=False):
    """A varint field (uint64, int64, int32, bool, enum); proto3 leaves out a zero unless it is
    a member of a oneof (keep_zero), which is written whenever it is set."""
    return _key(field, 0) + _varint(int(n)) if (n or keep_zero) else b""


def _bytes(field, data, keep_empty=False):
    return _key(field, 2) + _varint(len(data)) + data if (data or keep_empty) else b""


def _text(field, s):
    return _bytes(field, s.encode("utf-8"))


def _packed(field, values):
    return _bytes(field, b"".join(_varint(v) for v in values))


# AttributeProto: name = 1; oneof value { int32_val = 7; int64_val = 9; uint64_val = 13;
# bool_val = 27; string_val = 29 }.
def attr_int64(name, value):
    return _text(1, name) + _uint(9, value, keep_zero=True)


def attr_bool(name, value):
    return _text(1, name) + _uint(27, bool(value), keep_zero=True)


def attr_string(name, value):
    return _text(1, name) + _bytes(29, value.encode("utf-8"), keep_empty=True)


def global_metadata(version, attrs=()):
    """GlobalMetadata: version = 1, attr = 2."""
    return _text(1, version) + b"".join(_bytes(2, a, keep_empty=True) for a in attrs)


def node_message(node):
    """Node: id = 1, name = 2, type = 3, ctrl_deps = 4, data_deps = 5, start_time_micros = 6,
    duration_micros = 7, attr = 10. `node` is a dict with those keys (attr: encoded
    AttributeProto messages)."""
    return (_uint(1, node["id"]) + _text(2, node["name"]) + _uint(3, node["type"]) +
            _packed(4, node.get("ctrl_deps", ())) + _packed(5, node.get("data_deps", ())) +
            _uint(6, node.get("start_time_micros", 0)) +
            _uint(7, node.get("duration_micros", 0)) +
            b"".join(_bytes(10, a, keep_empty=True) for a in node.get("attr", ())))


def delimited(message):
    """One message of an execution-trace file: its length as a varint, then the message."""
    return _varint(len(message)) + message


# ---- the step as nodes ----------------------------------------------------------------------

def op_runs(records):
    """The launch records of one step grouped into TF op runs (consecutive launches of one
    node and, where the records say, one dispatch of it): [{"name", "type", "kernels",
    "start_cycle", "cycles", "time_us", "launches", "members"}] in order; cycles and time_us are
    the launches' summed durations, launches their records' "index" values, members the original
    node names a multi-tensor update's launches name (launch_records(), "members")."""
    runs = []
    for r in records:
        name = r.get("op_name") or r["kernel"]
        dispatch = r.get("dispatch") or 0
        if not runs or runs[-1]["name"] != name or (dispatch and runs[-1]["dispatch"] and
                                                     runs[-1]["dispatch"] != dispatch):
            runs.append({"name": name, "type": r.get("op_type") or r["kernel"], "kernels": 0,
                         "start_cycle": r["start_cycle"], "cycles": 0, "time_us": 0.0,
                         "dispatch": dispatch, "launches": [], "members": []})
        runs[-1]["members"] += [m for m in r.get("members") or []
                                if m not in runs[-1]["members"]]
        runs[-1]["kernels"] += 1
        runs[-1]["cycles"] += r["cycles"]
        runs[-1]["time_us"] += r["time_us"]
        runs[-1]["launches"].append(r.get("index"))
    return runs


def gradient_segments(grad_bytes, split_by_size=None, split_by_idx=None):
    """The segment of each gradient (a list as long as grad_bytes, gradients in variable order)
    as HCCL's gradient segmentation assigns them. split_by_idx: the last gradient index of each
    segment (set_split_strategy_by_idx, e.g. [20, 100, 159]); split_by_size: each segment's
    percentage of the bytes (set_split_strategy_by_size), a gradient belonging to the segment its
    last byte falls in. Default: HCCL_DEFAULT_SPLIT. Empty segments are dropped (numbering stays
    dense)."""
    n = len(grad_bytes)
    if split_by_idx is not None:
        ends = [int(i) for i in split_by_idx]
        if ends != sorted(ends) or not ends or ends[-1] != n - 1 or ends[0] < 0:
            raise ValueError(f"split_by_idx {list(split_by_idx)}: increasing gradient indices "
                             f"ending with the last one, {n - 1}")
        seg = [next(k for k, e in enumerate(ends) if i <= e) for i in range(n)]
    else:
        sizes = [float(p) for p in (split_by_size or HCCL_DEFAULT_SPLIT)]
        if any(p <= 0 for p in sizes) or abs(sum(sizes) - 100.0) > 1e-6:
            raise ValueError(f"split_by_size {sizes}: positive percentages summing to 100")
        total = float(sum(grad_bytes)) or 1.0
        bounds = [sum(sizes[:k + 1]) for k in range(len(sizes))]
        bounds[-1] = math.inf
        seg, at = [], 0
        for b in grad_bytes:
            at += b
            pct = 100.0 * at / total
            seg.append(next(k for k, bound in enumerate(bounds) if pct <= bound + 1e-9))
    used = sorted(set(seg))
    return [used.index(s) for s in seg]


def _rounded_durations(times_us):
    """Whole microseconds (Chakra's duration_micros) whose running sum stays within half a
    microsecond of the exact running sum: each node gets round(end) - round(start)."""
    out, at = [], 0.0
    for t in times_us:
        out.append(int(round(at + t)) - int(round(at)))
        at += t
    return out


def _data_parallel_order(runs, needs, segments):
    """The order the chip runs the ops in when updates wait for all-reduces: the single-chip
    order, except that an op that updates a variable of a segment whose gradients are not all
    produced yet is deferred until they are (TensorFlow may run a later layer's update while
    an earlier layer's gradients are still being computed; with all-reduces in between it
    cannot). Deferred ops keep their order and follow right after the last producer they
    needed."""
    order, emitted, deferred = [], set(), []

    def ready(i):
        return all(segments[k]["producers"] <= emitted for k in needs[i])

    for i in range(len(runs)):
        if not ready(i):
            deferred.append(i)
            continue
        order.append(i)
        emitted.add(i)
        progress = True
        while progress:
            progress = False
            for j in list(deferred):
                if ready(j):
                    deferred.remove(j)
                    order.append(j)
                    emitted.add(j)
                    progress = True
    if deferred:
        names = [runs[j]["name"] for j in deferred[:3]]
        raise ValueError(f"ops {names} update variables whose gradients no op produces first")
    return order


def build_nodes(runs, gradients, split_by_size=None, split_by_idx=None):
    """The nodes of one rank's trace. runs: op_runs(); gradients: [{"variable", "bytes",
    "producers" (indices into runs), "updates" (indices into runs)}] in variable order.
    Returns (nodes, segments): node dicts for node_message (compute nodes in the order the
    chip runs them, _data_parallel_order; then the all-reduces), and per segment its bytes,
    variables and producers (indices into runs)."""
    seg_of = gradient_segments([g["bytes"] for g in gradients], split_by_size, split_by_idx)
    segments = [{"bytes": 0, "variables": [], "producers": set()}
                for _ in range(max(seg_of) + 1 if seg_of else 0)]
    for g, s in zip(gradients, seg_of):
        segments[s]["bytes"] += g["bytes"]
        segments[s]["variables"].append(g["variable"])
        segments[s]["producers"].update(g["producers"])
    for k, seg in enumerate(segments):
        if not seg["producers"]:
            raise ValueError(f"gradient segment {k} ({seg['variables']}): no op produces it")
    needs = [set() for _ in runs]  # per run: the segments whose all-reduce it waits for
    for g, s in zip(gradients, seg_of):
        for u in g["updates"]:
            needs[u].add(s)
    order = _data_parallel_order(runs, needs, segments)
    comp_id = {run: position for position, run in enumerate(order)}  # node ids: compute first
    coll_id = [len(runs) + k for k in range(len(segments))]
    nodes = []
    durations = _rounded_durations([runs[i]["time_us"] for i in order])
    for position, i in enumerate(order):
        run = runs[i]
        deps = ([position - 1] if position else []) + sorted(coll_id[k] for k in needs[i])
        nodes.append({"id": position, "name": run["name"], "type": COMP_NODE,
                      "data_deps": deps, "duration_micros": durations[position],
                      "attr": _compute_attrs(run)})
    for k, seg in enumerate(segments):
        nodes.append({"id": coll_id[k], "name": f"hcom_allReduce_segment{k}",
                      "type": COMM_COLL_NODE,
                      "data_deps": sorted(comp_id[p] for p in seg["producers"]),
                      "attr": [attr_bool("is_cpu_op", False),
                               attr_int64("comm_type", ALL_REDUCE),
                               attr_int64("comm_size", seg["bytes"]),
                               attr_string("variables", ",".join(seg["variables"]))]})
    return nodes, segments


def _compute_attrs(run):
    return [attr_bool("is_cpu_op", False), attr_string("op_type", run["type"]),
            attr_int64("kernels", run["kernels"]),
            attr_int64("npusim_duration_ns", round(run["time_us"] * 1e3))]


def build_chip_nodes(chip, launches, collectives, clock_mhz, origin_cycle=0):
    """The nodes of chip `chip`'s trace from what ran on it: `launches` its launch records
    (launch_records(chip=chip) of the step, in order), `collectives` the system's collective
    records of the step (system_info()["collectives"]; those without `chip` are skipped).

    - A COMP_NODE per TF op run (op_runs) with the chip's simulated durations, each depending
      on the one before (the chip runs one operation at a time), and on the collective whose
      output one of its launches reads (LaunchRecord::reads_collective);
    - a COMM_COLL_NODE per collective of the chip, in the order they ran (the communication
      stream: each depends on the one before), depending on the op run of the launch that last
      wrote the bytes this rank sends (CollectiveRecord::input_launch), with comm_type,
      comm_size (one rank's buffer, bytes), the communicator, algorithm and simulated time;
      send_recv is a COMM_SEND_NODE on its rank 0 and a COMM_RECV_NODE on its rank 1.
    start_time_micros is each node's start on the chip's timelines, from origin_cycle.
    Returns (nodes, runs)."""
    runs = op_runs(launches)
    node_of_launch = {i: n for n, run in enumerate(runs) for i in run["launches"]}
    mine = sorted((c for c in collectives if chip in c["chips"]), key=lambda c: c["id"])
    comm_id = {c["id"]: len(runs) + k for k, c in enumerate(mine)}

    def micros(cycle):
        return max(0, int(round((cycle - origin_cycle) / clock_mhz)))

    nodes = []
    durations = _rounded_durations([run["time_us"] for run in runs])
    by_index = {r.get("index"): r for r in launches}
    for n, run in enumerate(runs):
        deps = [n - 1] if n else []
        read = max((by_index[i].get("reads_collective", 0) for i in run["launches"]), default=0)
        if read in comm_id:
            deps.append(comm_id[read])
        nodes.append({"id": n, "name": run["name"], "type": COMP_NODE, "data_deps": deps,
                      "start_time_micros": micros(run["start_cycle"]),
                      "duration_micros": durations[n], "attr": _compute_attrs(run)})
    previous = None
    for c in mine:
        rank = c["chips"].index(chip)
        deps = [] if previous is None else [comm_id[previous]]
        writer = (c.get("input_launch") or [-1] * len(c["chips"]))[rank]
        if writer in node_of_launch:
            deps.insert(0, node_of_launch[writer])
        cycles = c["end_cycle"] - c["start_cycle"]
        attrs = [attr_bool("is_cpu_op", False), attr_int64("comm_size", c["bytes"]),
                 attr_string("collective", c["collective"]),
                 attr_string("algorithm", c["algorithm"]),
                 attr_string("comm_group", ",".join(str(k) for k in c["chips"])),
                 attr_int64("rank", rank), attr_string("label", c.get("label", "")),
                 attr_int64("npusim_duration_ns", round(1e3 * cycles / clock_mhz))]
        if c["collective"] == "send_recv":
            kind = COMM_SEND_NODE if rank == 0 else COMM_RECV_NODE
            attrs += [attr_int64("comm_src", c["chips"][0]), attr_int64("comm_dst", c["chips"][1]),
                      attr_int64("comm_tag", c["id"])]
        elif c["collective"] in COMM_TYPES:
            kind = COMM_COLL_NODE
            attrs.insert(1, attr_int64("comm_type", COMM_TYPES[c["collective"]]))
        else:
            raise ValueError(f"collective {c['id']} ({c['collective']}): no Chakra node type")
        nodes.append({"id": comm_id[c["id"]],
                      "name": f"hcom_{c['collective']}_{c['id']}" + (
                          f" ({c['label']})" if c.get("label") else ""),
                      "type": kind, "data_deps": deps,
                      "start_time_micros": micros(c["start_cycle"]),
                      "duration_micros": int(round(cycles / clock_mhz)), "attr": attrs})
        previous = c["id"]
    return nodes, runs


def write_trace(path, nodes, metadata_attrs=()):
    """One execution-trace file: the GlobalMetadata, then the nodes."""
    with open(path, "wb") as f:
        f.write(delimited(global_metadata(SCHEMA_VERSION, metadata_attrs)) + b"".join(
            delimited(node_message(n)) for n in nodes))
    return path


def write_traces(directory, nodes, chips, metadata_attrs=(), prefix="npusim"):
    """Writes <directory>/<prefix>.<rank>.et for every rank (ASTRA-sim's
    --workload-configuration=<directory>/<prefix>); data-parallel ranks run the same step, so
    the files are the same. Returns their paths."""
    if int(chips) < 1:
        raise ValueError(f"chips must be at least 1, got {chips}")
    os.makedirs(directory, exist_ok=True)
    return [write_trace(os.path.join(directory, f"{prefix}.{rank}.et"), nodes, metadata_attrs)
            for rank in range(int(chips))]


# ---- the step's graph -----------------------------------------------------------------------

def _is_gradient_op(op):
    return op.name.startswith("gradient_tape/") or "/gradient_tape/" in op.name


def _gradient_structure(graph, variables):
    """Per variable (the tf.Variables of the trainable weights, in order): the gradient ops its
    update reads (the first gradient-tape ops met walking back from the ops that write it) and
    the ops of its update (those on the way that depend on one of them). Ops are graph names.

    The walk goes back through data inputs; at a read of a variable that the step also writes
    and that is not a trainable weight (an optimizer slot such as Adam's moments, the iteration
    count) it goes on to the ops that write that variable, which the graph's automatic control
    dependencies run before the read. It stops at reads of other variables and at constants."""
    captured = {}  # internal placeholder op name -> external handle
    for external, internal in graph.captures:
        captured[internal.op.name] = external
    trainable = {}  # placeholder op name -> variable index
    for name, external in captured.items():
        for i, v in enumerate(variables):
            if external is v.handle:
                trainable[name] = i
    writes = {}  # placeholder op name -> the ops that write that variable
    for op in graph.get_operations():
        if _WRITE_OPS.match(op.type) and op.inputs:
            writes.setdefault(op.inputs[0].op.name, []).append(op)

    # The walk visits tensors as (op, output index) so that a pass-through op of many tensors
    # (IdentityN, which Keras' optimizer puts over all gradients) links output k to input k only;
    # other ops are visited as a whole (index None).
    def node(t):
        return (t.op, t.value_index if t.op.type == "IdentityN" else None)

    def preds(n):
        o, k = n
        if o.type == "IdentityN":
            return [node(o.inputs[k])]
        if o.type == "ReadVariableOp":
            handle = o.inputs[0].op.name
            return [] if handle in trainable else [(w, None) for w in writes.get(handle, [])]
        if o.type in ("Placeholder", "Const", "VarHandleOp"):
            return []
        return [node(t) for t in o.inputs]

    def key(n):
        return (n[0].name, n[1])

    result = [{"producers": set(), "updates": set()} for _ in variables]
    for handle, i in trainable.items():
        for write in writes.get(handle, []):
            walked, stack = {}, [(write, None)]
            while stack:
                n = stack.pop()
                if key(n) in walked:
                    continue
                if _is_gradient_op(n[0]):
                    result[i]["producers"].add(n[0].name)
                    walked[key(n)] = None
                    continue
                walked[key(n)] = n
                stack.extend(preds(n))
            fed = {}

            def depends(n, fed=fed, walked=walked):
                """Whether a gradient op feeds `n` along the walked tensors."""
                if key(n) not in fed:
                    fed[key(n)] = False  # a graph has no cycles; this only guards re-entry
                    fed[key(n)] = any(_is_gradient_op(p[0]) or
                                      (walked.get(key(p)) is not None and depends(p))
                                      for p in preds(n))
                return fed[key(n)]

            result[i]["updates"].update(n[0].name for n in walked.values()
                                        if n is not None and depends(n))
            result[i]["updates"].add(write.name)
    return result


def _tf_variable(v):
    """The tf.Variable behind a Keras 3 variable (v itself for a tf.Variable)."""
    inner = getattr(v, "_value", None)  # Keras 3 (not .value, which may autocast)
    return inner if inner is not None and hasattr(inner, "handle") else v


def _training_state(model):
    """Every variable a training step changes: the model's, its optimizer's (slots, iteration
    count) and its metrics', each once."""
    out, seen = [], set()
    groups = [model.variables, getattr(model.optimizer, "variables", [])]
    groups += [m.variables for m in getattr(model, "metrics", [])]
    for group in groups:
        for v in group:
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)
    return out


def trace_step(model, x, y):
    """Runs one training step of the compiled Keras model on (x, y) as a tf.function twice (the
    first compiles the kernels), then puts the model's, optimizer's and metrics' variables back
    as they were. Returns (records, structure): the second run's launch records and, per
    trainable variable, {"variable", "bytes", "producers", "updates"} (graph op names)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from . import clear_launch_records, launch_records  # pylint: disable=import-outside-toplevel

    weights = list(model.trainable_weights)
    tf_vars = [_tf_variable(w) for w in weights]

    @tf.function
    def step(x, y):
        return model.train_step((x, y))

    concrete = step.get_concrete_function(x, y)  # tracing builds the optimizer and metrics
    structure = _gradient_structure(concrete.graph, tf_vars)
    state = _training_state(model)
    saved = [v.numpy() for v in state]
    try:
        step(x, y)
        clear_launch_records()
        step(x, y)
        records = launch_records()
    finally:
        for v, value in zip(state, saved):
            v.assign(value)
    grads = []
    for w, v, s in zip(weights, tf_vars, structure):
        elements = math.prod(int(d) for d in v.shape)
        grads.append({"variable": getattr(w, "path", None) or v.name,
                      "bytes": elements * tf.as_dtype(v.dtype).size,
                      "producers": s["producers"], "updates": s["updates"]})
    return records, grads


def attach_runs(runs, grads):
    """Graph op names of trace_step() as indices of `runs` (op_runs()): a gradient's producers
    are the runs of its gradient ops that ran on the NPU (if none did, e.g. a fusion renamed
    them, the last run before the first update of any variable); its updates the runs of its
    update ops (a run of a multi-tensor update stands for its members' names too)."""
    index = {}
    for i, r in enumerate(runs):
        for name in [r["name"]] + r.get("members", []):
            index[name] = i
    first_update = min((index[n] for g in grads for n in g["updates"] if n in index),
                       default=len(runs))
    out = []
    for g in grads:
        producers = sorted(index[n] for n in g["producers"] if n in index)
        if not producers and first_update > 0:
            producers = [first_update - 1]
        updates = sorted(index[n] for n in g["updates"] if n in index)
        out.append(dict(g, producers=producers, updates=updates))
    return out


def _replicas(model):
    """How many replicas the model's distribution strategy runs (1 without one)."""
    strategy = getattr(model, "distribute_strategy", None)
    return int(getattr(strategy, "num_replicas_in_sync", 1) or 1)


def _clock_mhz():
    """The chips' clock (chip config clock_mhz): cycles of the records -> microseconds."""
    from . import _hooks  # pylint: disable=import-outside-toplevel
    match = re.search(r"^clock_mhz:\s*([0-9.eE+-]+)", _hooks.chip_config_yaml() or "", re.M)
    if not match:
        raise RuntimeError("export_chakra: the chip config has no clock_mhz")
    return float(match.group(1))


def _distributed_step(model, x, y):
    """Runs one training step of `model` (compiled under a MirroredStrategy of NPUs) on the
    global batch (x, y) twice with train_on_batch (the first compiles), recording the second,
    and puts the model's, optimizer's and metrics' variables back."""
    from . import clear_launch_records  # pylint: disable=import-outside-toplevel

    state = _training_state(model)
    saved = [v.numpy() for v in state]
    try:
        model.train_on_batch(x, y)
        clear_launch_records()
        model.train_on_batch(x, y)
    finally:
        for v, value in zip(state, saved):
            v.assign(value)


def export_recorded(directory, prefix="npusim"):
    """Writes one Chakra trace per NPU, <directory>/<prefix>.<k>.et for NPU:k, of what ran on
    the NPUs since clear_launch_records(): every chip's launches and the collectives as the
    collective engine timed them (build_chip_nodes). Returns {"files", "nodes" (per chip),
    "compute_nodes" (per chip), "collectives" (per chip), "compute_us" (per chip)}."""
    from . import device_info, launch_records, system_info  # pylint: disable=import-outside-toplevel

    info = system_info()
    if not info.get("open"):
        raise RuntimeError("export_chakra: nothing ran on the NPU (the device is not open)")
    chips = len(info.get("timeline_cycles", [])) or 1
    launches = [launch_records(chip=k) for k in range(chips)]
    collectives = info.get("collectives", [])
    if not any(launches):
        raise RuntimeError("export_chakra: no launch recorded since clear_launch_records()")
    starts = [r["start_cycle"] for rs in launches for r in rs]
    starts += [c["start_cycle"] for c in collectives]
    origin = min(starts)
    clock = _clock_mhz()
    chip_name = str(device_info().get("settings", {}).get("chip", ""))
    os.makedirs(directory, exist_ok=True)
    out = {"files": [], "nodes": [], "compute_nodes": [], "collectives": [], "compute_us": []}
    for k in range(chips):
        nodes, runs = build_chip_nodes(k, launches[k], collectives, clock, origin)
        meta = [attr_string("source", "npusim"), attr_string("chip", chip_name),
                attr_int64("ranks", chips), attr_int64("rank", k),
                attr_int64("origin_cycle", origin)]
        out["files"].append(write_trace(os.path.join(directory, f"{prefix}.{k}.et"), nodes,
                                        meta))
        out["nodes"].append(len(nodes))
        out["compute_nodes"].append(len(runs))
        out["collectives"].append(len(nodes) - len(runs))
        out["compute_us"].append(sum(r["time_us"] for r in runs))
    return out


def export_chakra(directory, chips=None, model=None, x=None, y=None, split_by_size=None,
                  split_by_idx=None, prefix="npusim"):
    """Writes the Chakra execution traces of one data-parallel training step (see the module's
    docstring and docs/multichip.md).

    - `model` compiled under a MirroredStrategy of several NPUs: runs one step on the global
      batch (x, y) and writes what ran, one trace per NPU (export_recorded); `chips`, if given,
      must be the replica count.
    - `model` on one NPU: runs one step on (x, y) and writes it as `chips` ranks' traces
      (the same step on every rank, its all-reduces from the gradients' sizes). Returns
      {"files", "nodes", "compute_nodes", "segments" (bytes and variables of each all-reduce),
      "compute_us" (the step's kernel time on one chip)}.
    - no `model`: writes what ran on the NPUs since clear_launch_records() (export_recorded)."""
    if model is None:
        return export_recorded(directory, prefix)
    replicas = _replicas(model)
    if replicas > 1:
        if chips is not None and int(chips) != replicas:
            raise ValueError(f"export_chakra: chips={chips}, but the model's strategy runs "
                             f"{replicas} replicas (one trace per NPU it ran on)")
        _distributed_step(model, x, y)
        return export_recorded(directory, prefix)
    if chips is None:
        raise ValueError("export_chakra: give chips (the ranks) for a model on one NPU")
    from . import device_info  # pylint: disable=import-outside-toplevel

    records, grads = trace_step(model, x, y)
    info = device_info()
    runs = op_runs(records)
    if not runs:
        raise RuntimeError("export_chakra: the training step ran no kernel on the NPU")
    grads = attach_runs(runs, grads)
    nodes, segments = build_nodes(runs, grads, split_by_size, split_by_idx)
    chip = info.get("settings", {}).get("chip", "")
    files = write_traces(directory, nodes, chips,
                         [attr_string("source", "npusim"), attr_string("chip", str(chip)),
                          attr_int64("ranks", int(chips))], prefix)
    return {"files": files, "nodes": len(nodes), "compute_nodes": len(runs),
            "segments": [{"bytes": s["bytes"], "variables": s["variables"]} for s in segments],
            "compute_us": sum(r["time_us"] for r in runs)}
