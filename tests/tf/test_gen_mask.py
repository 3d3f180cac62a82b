"""DropOutGenMask: a dropout's keep mask on the chip's AI CPU (graph_fusion.h rewrite 18,
adapter/tf/plugin/gen_mask_rewrite.cpp and kernels_gen_mask.cpp).

GreaterEqual(StatelessRandomUniformV2(...), rate) becomes one DropOutGenMask node, run as a task
on the AI CPU timeline beside the AI cores. Only a chip with an `ai_cpu:` section gets the
rewrite: these tests run the 910 in child processes (the test process holds the tiny chip).
The mask must be TensorFlow's on the CPU bit for bit (f32, f16, bf16; shapes that are not whole
Philox groups; node-by-node and whole-graph runs), and a Keras Dropout training step must give
exactly the losses and weights it gives with the rewrite off (NPUSIM_FUSION_GENMASK=0), with
fewer AI-core launches and the masks in op_summary.csv as AI_CPU rows."""

import pytest

from conftest import TEST_CHIP, chip_config, child_result

pytest.importorskip("tensorflow")

CHIP_910 = {"NPUSIM_CHIP": "910"}

MASK_CODE = r"""
import csv, json, os, tempfile
import numpy as np
import tensorflow as tf
import npusim
tf.config.set_soft_device_placement(False)
cases = [((1,), (0, 0), 0.5), ((7,), (1, 2), 0.1), ((3, 37), (7, -9), 0.3),
         ((2, 3, 33), (2**31 - 1, -2**31), 0.9), ((5, 1001), (-123, 5), 0.25)]
out = []
for dtype in ("float32", "float16", "bfloat16"):
    for shape, seed, rate in cases:
        @tf.function
        def mask(seed):
            u = tf.random.stateless_uniform(shape, seed=seed, dtype=dtype)
            return u >= tf.constant(rate, dtype)
        seed_t = tf.constant(seed, tf.int64)
        with tf.device("/CPU:0"):
            want = mask(seed_t).numpy()
        before = len(npusim.launch_records())
        with tf.device("/NPU:0"):
            got = mask(seed_t)
        assert got.device.endswith("NPU:0"), got.device
        kernels = sorted({r["kernel"] for r in npusim.launch_records()[before:]})
        out.append(dict(case=f"{dtype} {shape} {seed} {rate}",
                        equal=bool(np.array_equal(got.numpy(), want)),
                        kernels=kernels))
rep = tempfile.mkdtemp()
npusim.write_report(rep)
with open(os.path.join(rep, "op_summary.csv")) as f:
    rows = list(csv.DictReader(f))
ai_cpu = [r["OP Type"] for r in rows if r["Task Type"] == "AI_CPU"]
print("RESULT" + json.dumps(dict(cases=out, ai_cpu=ai_cpu)))
"""


@pytest.mark.parametrize("graph", ["1", "0"])
def test_mask_matches_tf_cpu_bit_for_bit(graph):
    """Every mask equals the CPU's; no Philox kernel runs on the AI cores (only the key and
    counter's); one AI_CPU DropOutGenMask row per mask. NPUSIM_GRAPH=0: node by node."""
    r = child_result(MASK_CODE, extra_env={**CHIP_910, "NPUSIM_GRAPH": graph})
    for c in r["cases"]:
        assert c["equal"], c
        assert not any(k.startswith("RandomUniform") for k in c["kernels"]), c
    assert r["ai_cpu"] == ["DropOutGenMask"] * len(r["cases"]), r["ai_cpu"]


TRAIN_CODE = r"""
import csv, json, os, tempfile
import numpy as np
import keras
import tensorflow as tf
import npusim
tf.config.set_soft_device_placement(False)
rng = np.random.default_rng(2)
x = rng.standard_normal((32, 12)).astype(np.float32)
y = rng.integers(0, 3, 32).astype(np.int64)
keras.utils.set_random_seed(5)
model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dropout(0.4, seed=11), keras.layers.Dense(16),
                          keras.layers.Dropout(0.2, seed=12), keras.layers.Dense(3)])
model.compile(optimizer=keras.optimizers.SGD(0.1),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
hist = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
rep = tempfile.mkdtemp()
npusim.write_report(rep)
with open(os.path.join(rep, "op_summary.csv")) as f:
    rows = list(csv.DictReader(f))
def span(r):
    start = float(r["Task Start Time(us)"])
    return start, start + float(r["Task Duration(us)"])
ai_core = [span(r) for r in rows if r["Task Type"] != "AI_CPU"]
ai_cpu = [span(r) for r in rows if r["Task Type"] == "AI_CPU"]
# AI CPU time during which some AI-core task ran too (the timelines overlapping).
overlap = sum(max(0.0, min(e, ce) - max(s, cs)) for s, e in ai_cpu for cs, ce in ai_core)
recs = npusim.launch_records()
us_per_cycle = next(r["time_us"] / r["cycles"] for r in recs if r["cycles"] > 0)  # the chip's clock
all_spans = ai_core + ai_cpu
print("RESULT" + json.dumps(dict(
    span_us=max(e for _, e in all_spans) - min(s for s, _ in all_spans),
    kernel_us=sum(r["cycles"] for r in recs) * us_per_cycle,
    dispatch_us=sum(r["host_dispatch_cycles"] for r in recs) * us_per_cycle,
    loss=[float(v) for v in hist.history["loss"]],
    weights=[w.numpy().tobytes().hex() for w in model.weights],
    launches=len(npusim.launch_records()),
    uniforms=sum(r["OP Type"] == "StatelessRandomUniformV2" for r in rows),
    ai_cpu_types=sorted({r["OP Type"] for r in rows if r["Task Type"] == "AI_CPU"}),
    ai_cpu_count=len(ai_cpu), overlap_us=overlap,
    ai_cpu_us=sum(e - s for s, e in ai_cpu))))
"""


def test_keras_dropout_training_same_with_the_rewrite_on_and_off():
    on = child_result(TRAIN_CODE, extra_env=CHIP_910)
    off = child_result(TRAIN_CODE, extra_env={**CHIP_910, "NPUSIM_FUSION_GENMASK": "0"})
    # The masks have TF's bits either way: the same losses and weights, bit for bit.
    assert on["loss"] == off["loss"]
    assert on["weights"] == off["weights"]
    # Two Dropouts a step, 2 epochs of 2 steps: 8 masks on the AI CPU, 8 uniforms fewer on the
    # AI cores (the weights' initializers draw theirs either way), and the comparisons gone
    # from the AI cores' launches (or from the chains that took them in).
    assert on["ai_cpu_types"] == ["DropOutGenMask"] and on["ai_cpu_count"] == 8, on
    assert off["ai_cpu_count"] == 0, off
    assert on["uniforms"] == off["uniforms"] - 8, (on["uniforms"], off["uniforms"])
    assert on["launches"] <= off["launches"] - 8, (on["launches"], off["launches"])
    # The device time, derived: the AI cores lose the uniforms' and comparisons' kernel cycles
    # and the host dispatch of the uniforms' kernel calls; the masks' AI CPU time is added at
    # most (a mask on the critical path, its reader waiting for all of it), less where it runs
    # beside the AI cores.
    saved_us = off["kernel_us"] - on["kernel_us"] + off["dispatch_us"] - on["dispatch_us"]
    assert saved_us > 0, (on, off)
    assert on["span_us"] <= off["span_us"] - saved_us + on["ai_cpu_us"] + 1e-3, (on, off)
    print(f"\nlaunches {off['launches']} -> {on['launches']}; step {off['span_us']:.1f} -> "
          f"{on['span_us']:.1f} us ({saved_us:.1f} us of AI-core kernels and dispatch saved); "
          f"AI CPU {on['ai_cpu_us']:.1f} us, {on['overlap_us']:.1f} us beside AI-core tasks")


@pytest.mark.parametrize("chip", ["910", "tiny"])
def test_keras_dropout_training_whole_graph_as_node_by_node(tmp_path, chip):
    """Whole graph, each mask is an AI CPU step of the training step's one NpuGraph task list
    (with the forward readers, the backward pass and the updates), and so are its key and
    counter (StatelessRandomGetKeyCounter), the seed's FloorMod and Cast before them and the
    seed's update (its int64 AddV2): the
    losses and weights equal node by node's bit for bit, with the same 8 AI_CPU DropOutGenMask
    rows; node by node every mask is a kernel call of its own. On a chip without an AI CPU
    (tiny) the uniforms (StatelessRandomUniformV2 launches) are steps of that task list
    instead."""
    code = MASKS_PLACED + TRAIN_CODE + r"""
per_graph = []
placed = masks_placed(os.environ["NPUSIM_GRAPH_DUMP"], per_graph) if "NPUSIM_GRAPH_DUMP" in os.environ else None
runs = sorted({r["graph_run"] for r in recs})
print("RESULT" + json.dumps(dict(
    loss=[float(v) for v in hist.history["loss"]],
    weights=[w.numpy().tobytes().hex() for w in model.weights],
    ai_cpu=sorted(r["Op Name"] for r in rows if r["Task Type"] == "AI_CPU"),
    placed=placed, per_graph=per_graph, graph_runs=len([r for r in runs if r]),
    key_counters_outside=sum(r["op_type"] == "StatelessRandomGetKeyCounter" and not r["graph_run"]
                             for r in recs),
    uniforms_inside=sum(r["op_type"] == "StatelessRandomUniformV2" and bool(r["graph_run"])
                        for r in recs),
    seed_adds_outside=sum(r["op_type"] == "AddV2" and "/dropout" in r["op_name"]
                          and not r["graph_run"] for r in recs))))
"""
    env = {"NPUSIM_CHIP": chip}
    graph = child_result(code, extra_env={**env, "NPUSIM_GRAPH_DUMP": str(tmp_path)})
    nodes = child_result(code, extra_env={**env, "NPUSIM_GRAPH": "0"})
    assert graph["loss"] == nodes["loss"]
    assert graph["weights"] == nodes["weights"]
    if chip == "910":
        assert graph["ai_cpu"] == nodes["ai_cpu"] and len(graph["ai_cpu"]) == 8, graph["ai_cpu"]
        # The traced step's two masks, both in one NpuGraph node; none left outside.
        assert graph["placed"] == [2, 0] and graph["per_graph"] == [2], graph
        assert graph["uniforms_inside"] == 0, graph
    else:  # no masks: the uniforms are AI-core steps of the task list
        assert graph["ai_cpu"] == nodes["ai_cpu"] == [], graph["ai_cpu"]
        assert graph["placed"] == [0, 0], graph
        assert graph["uniforms_inside"] == 8 and nodes["uniforms_inside"] == 0, (graph, nodes)
    # 2 epochs of 2 steps: one task list a step (before the key and counter joined it, three:
    # each Dropout's seed FloorMod and Cast were a small NpuGraph of their own, cut from the
    # step's by the key and counter's kernel call between them).
    assert nodes["graph_runs"] == 0 and graph["graph_runs"] == 4, (graph, nodes)
    # The step's 8 keys and counters (2 a step) inside its task list; outside, in both runs,
    # only the eager ones of the Dense layers' initializers.
    assert nodes["key_counters_outside"] - graph["key_counters_outside"] == 8, (graph, nodes)
    # Each Dropout's seed update (Keras 3's SeedGenerator: the int64 state plus [0, 1], written
    # back by an AssignVariableOp) is a step of that task list too (graph_cluster.cpp: a lone
    # step of a variable's state); node by node, 8 kernel calls of their own.
    assert graph["seed_adds_outside"] == 0 and nodes["seed_adds_outside"] == 8, (graph, nodes)


RAW_OP = r"""
import numpy as np
import tensorflow as tf

def gen_mask(shape, key, counter, alg, rate, dtype=tf.float32):
    # DropOutGenMask itself (the rewrite's op), built into the function's graph.
    g = tf.compat.v1.get_default_graph()
    op = g._create_op_internal(  # pylint: disable=protected-access
        "DropOutGenMask", [tf.constant(shape, tf.int32), key, counter, tf.constant(alg, tf.int32)],
        [tf.bool], attrs={"dtype": tf.compat.v1.AttrValue(type=dtype.as_datatype_enum),
                          "Tshape": tf.compat.v1.AttrValue(type=tf.int32.as_datatype_enum),
                          "rate": tf.compat.v1.AttrValue(f=rate)})
    return op.outputs[0]
"""


# For a child run with NPUSIM_GRAPH_DUMP=<dump> (graph_optimizer.cpp): the DropOutGenMask nodes
# of the optimized graphs (each graph's last optimizer pass), as (inside an NpuGraph node's task
# list, left outside) counts; per_graph: the masks of each NpuGraph node holding any.
MASKS_PLACED = r"""
import glob
from tensorflow.core.framework import graph_pb2
def masks_placed(dump, per_graph=None):
    last = {}
    for path in glob.glob(os.path.join(dump, "*.after.pb")):
        item, npass = path[:-len(".after.pb")].rsplit(".", 1)
        if int(npass) >= last.get(item, (-1, ""))[0]:
            last[item] = (int(npass), path)
    inside = outside = 0
    for _, path in last.values():
        g = graph_pb2.GraphDef()
        with open(path, "rb") as f:
            g.ParseFromString(f.read())
        for n in g.node:
            outside += n.op == "DropOutGenMask"
            if n.op == "NpuGraph":
                sub = graph_pb2.GraphDef()
                sub.ParseFromString(n.attr["graph"].s)
                masks = sum(m.op == "DropOutGenMask" for m in sub.node)
                inside += masks
                if masks and per_graph is not None:
                    per_graph.append(masks)
    return inside, outside
"""

# The mask alone (a set of one node stays a kernel call of its own), or read by a Cast and a Mul
# on the NPU: then the three are one NpuGraph whose task list holds the mask as an AI CPU step
# (npu_graph_kernel.cpp), its key and counter TensorFlow's uint64 inputs of the graph.
USES = {"alone": "lambda m: m", "in a graph": "lambda m: tf.cast(m, tf.float32) * 2.0"}


@pytest.mark.parametrize("use", list(USES))
def test_raw_op_with_explicit_key_counter(use, tmp_path):
    """The op: a counter whose low word wraps inside the mask (the carry into the high word),
    alg 1 and 3, against TF's uniform from the same key and counter on the CPU."""
    code = RAW_OP + MASKS_PLACED + r"""
import json, os
import npusim
use = """ + USES[use] + r"""
key = tf.constant([0x0123456789ABCDEF], tf.uint64)
counter = tf.constant([2**64 - 3, 17], tf.uint64)
out = []
for alg in (1, 3):
    for dtype, rate in ((tf.float32, 0.3), (tf.float16, 0.7), (tf.bfloat16, 0.5)):
        with tf.device("/CPU:0"):
            want = use(tf.raw_ops.StatelessRandomUniformV2(
                shape=[5, 9], key=key, counter=counter, alg=alg, dtype=dtype) >= tf.constant(rate, dtype))
        npusim.clear_launch_records()
        with tf.device("/NPU:0"):
            got = tf.function(lambda: use(gen_mask([5, 9], key, counter, alg, rate, dtype)))()
        runs = {r["graph_run"] for r in npusim.launch_records()}
        out.append([bool(np.array_equal(got.numpy(), want.numpy())), len(runs), 0 in runs])
print("RESULT" + json.dumps(dict(cases=out, placed=masks_placed(os.environ["NPUSIM_GRAPH_DUMP"]))))
"""
    r = child_result(code, extra_env={**CHIP_910, "NPUSIM_GRAPH_DUMP": str(tmp_path)})
    assert [c[0] for c in r["cases"]] == [True] * 6, r
    if use == "in a graph":  # the mask a step of the graph; its launches one graph run
        assert r["placed"] == [6, 0], r
        assert all(c[1] == 1 and not c[2] for c in r["cases"]), r
    else:
        assert r["placed"] == [0, 6], r


def test_a_chip_without_ai_cpu_refuses_the_op(npusim, tf):
    """The tests' chip (tiny) has no `ai_cpu:` section: the rewrite leaves dropout alone there,
    and the op given directly fails with an error naming the node and the chip. (A test chip
    with an AI CPU, NPUSIM_TEST_CHIP=910, runs the op: the other tests here check it.)"""
    if "ai_cpu" in chip_config():
        pytest.skip(f"the test chip {TEST_CHIP} models an AI CPU")
    scope = {"tf": tf}
    exec(RAW_OP, scope)  # pylint: disable=exec-used
    key = tf.constant([1], tf.uint64)
    counter = tf.constant([2, 3], tf.uint64)
    for use in USES.values():  # node by node, and as a step of an NpuGraph's task list
        use = eval(use, scope)  # pylint: disable=eval-used
        with tf.device("/NPU:0"):
            with pytest.raises(tf.errors.FailedPreconditionError,
                               match=f"DropOutGenMask .*chip '{TEST_CHIP}' models no AI CPU"):
                tf.function(lambda: use(scope["gen_mask"]([4, 5], key, counter, 1, 0.5)))().numpy()
