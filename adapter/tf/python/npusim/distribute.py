"""Collectives between NPUs, and tf.distribute.MirroredStrategy over them.

With several NPUs (npusim.configure(chips=N) or system=..., NPUSIM_CHIPS / NPUSIM_SYSTEM), each
NPU is a chip of one simulated system, joined to the others by the system's links (HCCS inside a
server, RoCE between servers: docs/multichip.md). Here:

    all_reduce(values, op="sum")  one tensor per NPU (or one list of tensors per NPU) -> the
                                  reduction of all of them, on every NPU
    broadcast(value, devices)     value (on one NPU) -> a copy on each of the NPUs in devices

run as HCCL collectives on the chips' collective engine (the NpuCollective op): the data moves
over the modelled links and is reduced where HCCL reduces it, never staged through the host.
They work eagerly and inside tf.function.

`import npusim` also makes MirroredStrategy use the NPUs: MirroredStrategy() with no devices
takes every NPU, and its cross-device ops for NPU replicas are NpuAllReduce: a batch of gradients
is fused into segments as the CANN TF adapter's gradient split strategy does (HCCL's default two
segments of 96.54 % and 3.46 % of the bytes; set_split_strategy_by_size / _by_idx,
npusim.configure(grad_split=...) or NPUSIM_GRAD_SPLIT choose another), one NpuCollective per
segment and dtype, queued last segment first (its gradients are computed first in the backward
pass), so that its all-reduce overlaps the rest of the backward pass in simulated time.
Strategies that need TensorFlow's multi-worker runtime (MultiWorkerMirroredStrategy,
ParameterServerStrategy) raise NpusimError naming MirroredStrategy instead: pluggable devices do
not get that runtime.
"""

import itertools
import os
import threading
import weakref

from ._chakra import HCCL_DEFAULT_SPLIT, gradient_segments
from ._plugin import NpusimError

REDUCTIONS = ("sum", "prod", "max", "min", "mean")

_keys = itertools.count()
_last_collective = weakref.WeakKeyDictionary()
_last_collective_by_id = {}


def _tf():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    return tf


def _device_name(d):
    """The canonical device string of a tensor or device name."""
    from tensorflow.python.distribute import device_util  # pylint: disable=import-outside-toplevel

    return device_util.canonicalize(getattr(d, "device", d) or "")


def _is_npu(device):
    return ":NPU:" in _device_name(device).upper()


def _check_replicas(what, per_replica):
    """per_replica: one list of tensors per replica. Checks placement, shapes and dtypes."""
    devices = []
    for r, tensors in enumerate(per_replica):
        if not tensors:
            raise ValueError(f"{what}: replica {r} gives no tensor")
        d = _device_name(tensors[0])
        if not _is_npu(d):
            raise ValueError(f"{what}: replica {r}'s tensor is on {d or 'no device'}, not an NPU "
                             "(place each replica's tensor on its NPU, e.g. with "
                             "tf.device('/NPU:1'))")
        for i, t in enumerate(tensors):
            if _device_name(t) != d:
                raise ValueError(f"{what}: replica {r}'s tensors {0} and {i} are on different "
                                 f"devices ({d}, {_device_name(t)})")
        if d in devices:
            raise ValueError(f"{what}: replicas {devices.index(d)} and {r} are both on {d}: give "
                             "one replica per NPU")
        devices.append(d)
    first = per_replica[0]
    for r, tensors in enumerate(per_replica[1:], start=1):
        if len(tensors) != len(first):
            raise ValueError(f"{what}: replica {r} gives {len(tensors)} tensors, replica 0 gives "
                             f"{len(first)}")
        for i, (a, b) in enumerate(zip(first, tensors)):
            if a.dtype != b.dtype:
                raise ValueError(f"{what}: tensor {i} is {b.dtype.name} on replica {r} but "
                                 f"{a.dtype.name} on replica 0")
            if a.shape.is_fully_defined() and b.shape.is_fully_defined() and a.shape != b.shape:
                raise ValueError(f"{what}: tensor {i} has shape {tuple(b.shape)} on replica {r} "
                                 f"but {tuple(a.shape)} on replica 0 (mismatched replica "
                                 "shapes)")
    return devices


def _last_collective_of(graph):
    """{device: the latest NpuCollective op built on it} of a graph."""
    try:
        return _last_collective.setdefault(graph, {})
    except TypeError:  # a graph that cannot be weakly referenced
        return _last_collective_by_id.setdefault(id(graph), {})


def _dtype_groups(tensors):
    """The positions of a replica's tensors, grouped by dtype (an NpuCollective takes tensors
    of one type), each group with the key of its collectives."""
    by_dtype = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    return [(indices, f"npusim/{next(_keys)}") for indices in by_dtype.values()]


def _replica_ops(tensors, groups, rank, attrs):
    """This replica's NpuCollective ops (one per dtype group) on the current device; returns its
    outputs in the order of `tensors`. Graph mode: builds them, each depending on the previous
    collective of this device (one order on every chip: two collectives queued in opposite
    orders on two chips would wait for each other forever). Eagerly: runs them, each returning
    once the collective has run on every replica."""
    from tensorflow.python.eager import context, execute  # pylint: disable=import-outside-toplevel
    from tensorflow.python.framework import op_def_library  # pylint: disable=import-outside-toplevel

    tf = _tf()
    outputs = [None] * len(tensors)
    for indices, key in groups:
        inputs = [tensors[i] for i in indices]
        op_attrs = dict(attrs, rank=rank, group_key=key)
        if tf.executing_eagerly():
            flat = ["T", inputs[0].dtype.as_datatype_enum, "N", len(inputs)]
            for name, value in op_attrs.items():
                flat += [name, value]
            outs = execute.execute("NpuCollective", len(inputs), inputs=inputs,
                                   attrs=tuple(flat), ctx=context.context())
        else:
            last = _last_collective_of(tf.compat.v1.get_default_graph())
            device = _device_name(tensors[0])
            with tf.control_dependencies([last[device]] if device in last else []):
                _, _, op, outs = op_def_library._apply_op_helper(  # pylint: disable=protected-access
                    "NpuCollective", input=inputs, name=f"NpuCollective_{attrs['collective']}",
                    **op_attrs)
            last[device] = op
        for i, out in zip(indices, outs):
            outputs[i] = out
    return outputs


def _run(per_replica, collective, reduction="sum", root=0, groups=None, fuse=False):
    """groups: the NpuCollective ops, in order, as lists of tensor positions (one dtype each);
    default one op per dtype. fuse: each op's tensors are one collective (else one each)."""
    tf = _tf()
    devices = _check_replicas(collective, per_replica)
    if len(devices) == 1:
        return [[tf.identity(t) for t in per_replica[0]]]
    groups = (_dtype_groups(per_replica[0]) if groups is None else
              [(indices, f"npusim/{next(_keys)}") for indices in groups])
    attrs = {"collective": collective, "reduction": reduction, "root": root,
             "group_size": len(devices), "fuse": bool(fuse)}
    results = [None] * len(devices)
    if not tf.executing_eagerly():
        for rank, device in enumerate(devices):
            with tf.device(device):
                results[rank] = _replica_ops(per_replica[rank], groups, rank, attrs)
        return results
    # Eagerly an op returns once its collective has run, i.e. once every replica's op has
    # joined: one thread per replica, as MirroredStrategy runs eager replicas.
    errors = [None] * len(devices)

    def replica(rank):
        try:
            with tf.device(devices[rank]):
                results[rank] = _replica_ops(per_replica[rank], groups, rank, attrs)
        except Exception as e:  # pylint: disable=broad-except
            errors[rank] = e

    threads = [threading.Thread(target=replica, args=(r,), name=f"npusim-replica-{r}")
               for r in range(len(devices))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    return results


def _per_replica_lists(values):
    """values: a list of tensors (one per replica) or of lists (one list per replica)."""
    tf = _tf()
    if isinstance(values, (tf.Tensor, tf.Variable)) or not isinstance(values, (list, tuple)):
        raise TypeError("give a list with one tensor (or one list of tensors) per NPU replica")
    batched = all(isinstance(v, (list, tuple)) for v in values)
    lists = [[tf.convert_to_tensor(t) for t in v] if batched else [tf.convert_to_tensor(v)]
             for v in values]
    return lists, batched


def all_reduce(values, op="sum", fuse=False):
    """The all-reduce of one tensor per NPU: values[r] on replica r's NPU (distinct NPUs, equal
    shapes and dtypes: float32, float16, bfloat16 or int32). Returns a list with the reduction on
    each replica's NPU, in the order given. op: "sum", "prod", "max", "min" or "mean" (sum
    divided by the number of replicas). values[r] may also be a list of tensors: each is reduced
    with the same tensor of the other replicas, and each result is then a list.

    fuse: False, one collective per tensor. True, the list is a batch of gradients in variable
    order, fused as the gradient split strategy says (split_strategy(): HCCL's default two
    segments, or what set_split_strategy_by_size / _by_idx, configure(grad_split=...) or
    NPUSIM_GRAD_SPLIT chose): each segment's tensors of one dtype are all-reduced together as
    one collective (one NpuCollective op with fuse=True: the tensors are read and written
    in place, one after the other, as one buffer), the last segment first. Every element is
    reduced over the same replicas' values as without fusion; the order in which a rank adds
    them may differ (docs/multichip.md, "Gradient segments and overlap")."""
    if op not in REDUCTIONS:
        raise ValueError(f"all_reduce: op '{op}' is not one of {REDUCTIONS}")
    tf = _tf()
    lists, batched = _per_replica_lists(values)
    reduction = "sum" if op == "mean" else op
    if fuse and split_strategy() is not None:
        reduced = _fused_all_reduce(lists, reduction)
    else:
        reduced = _run(lists, "all_reduce", reduction)
    if op == "mean":
        n = len(lists)
        out = []
        for r, tensors in enumerate(reduced):
            with tf.device(_device_name(lists[r][0])):
                out.append([t / tf.cast(n, t.dtype) for t in tensors])
        reduced = out
    return reduced if batched else [t[0] for t in reduced]


# ---- gradient segments (the TF adapter's gradient split strategy)

SPLIT_ENV = "NPUSIM_GRAD_SPLIT"


def _parse_split(text, where):
    """The split strategy a NPUSIM_GRAD_SPLIT value names: None (one collective per tensor),
    ("size", [percent, ...]) or ("idx", [last index, ...])."""
    text = text.strip()
    try:
        if text in ("", "hccl", "default"):
            return ("size", list(HCCL_DEFAULT_SPLIT))
        if text in ("tensor", "none", "off"):
            return None
        if text.startswith("idx:"):
            return ("idx", [int(v) for v in text[4:].split(",")])
        sizes = [float(v) for v in text.split(",")]
    except ValueError:
        sizes = None
    if not sizes or any(p <= 0 for p in sizes) or abs(sum(sizes) - 100.0) > 1e-6:
        raise NpusimError(f"{where}: '{text}' is not a gradient split: give 'hccl' (HCCL's "
                          f"default {HCCL_DEFAULT_SPLIT[0]},{HCCL_DEFAULT_SPLIT[1]}), 'tensor' "
                          "(one collective per gradient), percentages of the bytes summing to "
                          "100 ('60,40') or 'idx:' and the last gradient index of each segment "
                          "('idx:20,100,159')")
    return ("size", sizes)


def split_strategy():
    """The gradient split strategy NpuAllReduce uses now: None (one collective per gradient),
    ("size", percentages) or ("idx", last indices). From NPUSIM_GRAD_SPLIT (set by
    configure(grad_split=...) and the set_split_strategy_* functions); HCCL's default when
    unset."""
    return _parse_split(os.environ.get(SPLIT_ENV, "hccl"), SPLIT_ENV)


def grad_split_env(value):
    """The NPUSIM_GRAD_SPLIT text of configure(grad_split=value): 'hccl', 'tensor', a list of
    percentages, or ('idx', [last indices]); checked."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, (tuple, list)) and len(value) == 2 and value[0] == "idx":
        text = "idx:" + ",".join(str(int(i)) for i in value[1])
    elif isinstance(value, (tuple, list)):
        text = ",".join(repr(float(p)) for p in value)
    else:
        raise TypeError(f"grad_split must be 'hccl', 'tensor', a list of percentages or "
                        f"('idx', [indices]), not {value!r}")
    _parse_split(text, "grad_split")
    return text


def set_split_strategy_by_size(sizes):
    """Gradient segments by size, as the CANN TF adapter's set_split_strategy_by_size: each
    segment's percentage of the gradient bytes, in variable order (summing to 100), e.g.
    [60, 20, 20]. Applies to the gradients reduced from now on (a tf.function traced before keeps
    its segments)."""
    os.environ[SPLIT_ENV] = grad_split_env(list(sizes))


def set_split_strategy_by_idx(indices):
    """Gradient segments by index, as set_split_strategy_by_idx: the last gradient index of each
    segment, increasing, the last one the last gradient's (checked when gradients are reduced),
    e.g. [20, 100, 159]."""
    os.environ[SPLIT_ENV] = grad_split_env(("idx", list(indices)))


def _segments(tensors, strategy):
    """The fused collectives of one replica's gradient list: [[positions], ...], one per segment
    and dtype, the last segment first. None when a shape is not fully known (then every tensor
    gets its own collective)."""
    if not all(t.shape.is_fully_defined() for t in tensors):
        return None
    sizes = [t.shape.num_elements() * t.dtype.size for t in tensors]
    kind, values = strategy
    try:
        seg = gradient_segments(sizes, split_by_size=values if kind == "size" else None,
                                split_by_idx=values if kind == "idx" else None)
    except ValueError as e:
        raise NpusimError(f"{SPLIT_ENV} for {len(tensors)} gradients: {e}") from None
    groups = {}
    for i, (k, t) in enumerate(zip(seg, tensors)):
        groups.setdefault((k, t.dtype), []).append(i)
    return [groups[key] for key in sorted(groups, key=lambda key: -key[0])]


def _fused_all_reduce(lists, reduction):
    """all_reduce(fuse=True) of per-replica lists: one NpuCollective per segment and dtype, the
    last segment first, each one collective over its tensors read and written in place (HCCL's
    fused segment, as if GE had allocated them contiguously: no copies)."""
    _check_replicas("all_reduce", lists)
    segments = _segments(lists[0], split_strategy())
    if segments is None:
        return _run(lists, "all_reduce", reduction)
    return _run(lists, "all_reduce", reduction, groups=segments, fuse=True)


def broadcast(value, devices):
    """value (a tensor on one of `devices`, the root) copied to every NPU of `devices` (names
    such as "/NPU:1" or logical devices) by an HCCL broadcast; returns one tensor per device, in
    that order (the root's is a copy too)."""
    tf = _tf()
    value = tf.convert_to_tensor(value)
    names = [_device_name(getattr(d, "name", d)) for d in devices]
    src = _device_name(value)
    if src not in names:
        raise ValueError(f"broadcast: the value is on {src}, which is not one of the devices "
                         f"{names} (place it on the root NPU)")
    root = names.index(src)
    per_replica = []
    for name in names:
        if name == src:
            per_replica.append([value])
        else:
            with tf.device(name):  # shape and dtype only: the root's data overwrites it
                per_replica.append([tf.zeros(tf.shape(value), value.dtype)])
    return [t[0] for t in _run(per_replica, "broadcast", root=root)]


# ---- tf.distribute


def _make_cross_device_ops_class():
    from tensorflow.python.distribute import cross_device_ops as cdo  # pylint: disable=import-outside-toplevel
    from tensorflow.python.distribute import cross_device_utils  # pylint: disable=import-outside-toplevel
    from tensorflow.python.distribute import reduce_util  # pylint: disable=import-outside-toplevel

    class NpuAllReduce(cdo.CrossDeviceOps):
        """CrossDeviceOps for NPU replicas: an all-reduce whose destinations are the replicas'
        own devices runs as NpuCollective ops (one per replica, the batch's tensors together);
        any other reduce (to one device, e.g. a metric read on the host) goes through
        ReductionToOneDevice, as TensorFlow's AllReduceCrossDeviceOps does."""

        def __init__(self):
            super().__init__()
            self._simple = cdo.ReductionToOneDevice()

        def _matches(self, value, destinations):
            return (cdo._devices_match(value, destinations)  # pylint: disable=protected-access
                    and all(_is_npu(d) for d in cdo.get_devices_from(destinations)))

        def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
            if self._matches(per_replica_value, destinations):
                return self._batch_all_reduce(reduce_op, [per_replica_value])[0]
            return self._simple.reduce(reduce_op, per_replica_value, destinations, options)

        def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
            if all(self._matches(v, d) for v, d in value_destination_pairs):
                return self._batch_all_reduce(reduce_op, [v for v, _ in value_destination_pairs])
            return [self.reduce_implementation(reduce_op, v, d, options)
                    for v, d in value_destination_pairs]

        def _batch_all_reduce(self, reduce_op, per_replica_values):
            dense, dense_idx, sparse, sparse_idx = cross_device_utils.split_by_sparsity(
                per_replica_values)
            if sparse:
                raise NpusimError("MirroredStrategy on NPUs: sparse gradients (IndexedSlices) "
                                  "cannot be all-reduced yet; densify them "
                                  "(tf.convert_to_tensor)")
            n = len(dense[0].values)
            per_replica = [[v.values[r] for v in dense] for r in range(n)]
            op = "mean" if reduce_op == reduce_util.ReduceOp.MEAN else "sum"
            reduced = all_reduce(per_replica, op, fuse=True)
            from tensorflow.python.distribute import distribute_utils  # pylint: disable=import-outside-toplevel
            from tensorflow.python.distribute import values as value_lib  # pylint: disable=import-outside-toplevel

            results = [distribute_utils.regroup([reduced[r][i] for r in range(n)],
                                                wrap_class=value_lib.Mirrored)
                       for i in range(len(dense))]
            return cross_device_utils.stitch_values(((results, dense_idx), ([], sparse_idx)))

    return NpuAllReduce


_installed = False


def install():
    """Teaches tf.distribute about the NPUs (called by `import npusim`)."""
    global _installed, NpuAllReduce  # pylint: disable=global-statement
    if _installed:
        return
    _installed = True
    from tensorflow.python.distribute import cross_device_utils  # pylint: disable=import-outside-toplevel
    from tensorflow.python.distribute import mirrored_strategy as ms  # pylint: disable=import-outside-toplevel
    from tensorflow.python.framework import config  # pylint: disable=import-outside-toplevel

    NpuAllReduce = _make_cross_device_ops_class()

    original_local_devices = ms.all_local_devices

    def all_local_devices(num_gpus=None):
        # MirroredStrategy() without devices: every NPU when there is no GPU.
        npus = config.list_logical_devices("NPU")
        if npus and not config.list_logical_devices("GPU"):
            return npus if num_gpus is None else npus[:num_gpus]
        return original_local_devices(num_gpus)

    ms.all_local_devices = all_local_devices

    original_make = ms.MirroredExtended._make_collective_ops_with_fallbacks  # pylint: disable=protected-access

    def make_collective_ops(self):
        if self._devices and all(_is_npu(d) for d in self._devices):  # pylint: disable=protected-access
            self._collective_keys = cross_device_utils.CollectiveKeys(  # pylint: disable=protected-access
                group_key_start=1 + self._collective_key_base)  # pylint: disable=protected-access
            return NpuAllReduce()
        return original_make(self)

    ms.MirroredExtended._make_collective_ops_with_fallbacks = make_collective_ops  # pylint: disable=protected-access

    _refuse("MultiWorkerMirroredStrategy",
            "tensorflow.python.distribute.collective_all_reduce_strategy",
            ["CollectiveAllReduceStrategy", "_CollectiveAllReduceStrategyExperimental"])
    _refuse("ParameterServerStrategy",
            "tensorflow.python.distribute.parameter_server_strategy_v2",
            ["ParameterServerStrategyV2"])


def _refuse(public_name, module_name, class_names):
    """Makes the strategy's constructor raise NpusimError while NPUs are visible."""
    import importlib  # pylint: disable=import-outside-toplevel

    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return
    for class_name in class_names:
        cls = getattr(module, class_name, None)
        if cls is None or getattr(cls, "_npusim_refused", False):
            continue
        original_init = cls.__init__

        def init(self, *args, _original=original_init, **kwargs):
            from tensorflow.python.framework import config  # pylint: disable=import-outside-toplevel

            if config.list_logical_devices("NPU"):
                raise NpusimError(
                    f"tf.distribute.{public_name} is not supported on the NPU: it needs "
                    "TensorFlow's multi-worker runtime, which pluggable devices do not get. Use "
                    "tf.distribute.MirroredStrategy() over the NPUs of this process "
                    "(npusim.configure(chips=N) or NPUSIM_CHIPS=N gives N NPUs joined by "
                    "modelled links).")
            _original(self, *args, **kwargs)

        cls.__init__ = init
        cls._npusim_refused = True


NpuAllReduce = None  # the CrossDeviceOps class, defined by install()
