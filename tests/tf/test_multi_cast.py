"""The weights' casts of a training step as one MultiTensorCast (adapter/tf/plugin/graph_fusion.h,
rewrite 19; adapter/compiler/ops/cast.cpp): Casts between float types reading a variable's value
that the same graph writes become one node, whose kernel casts each as Cast's own kernel does.

- A tf.function (default precision mode) updates float32 variables `a` and `b` and returns the
  float16 casts of their values read before the update, the float16 cast of a variable `c` it
  only reads (an inference-like read: it stays a Cast, which the derived-tensor cache may leave
  out while `c` is unchanged) and of a float32 input (no variable: it stays). The casts are
  numpy's (astype: round to nearest even), bit for bit, and those of NPUSIM_FUSION_MULTI_CAST=0
  in a child process; on, one MultiTensorCast launch and the two other Casts ran, off four Casts.
- The small CNN trained three Adam steps under allow_mix_precision (its convolution's and dense
  layer's weights cast to float16 at every step's start): the same losses and weights bit for
  bit as with NPUSIM_FUSION_MULTI_CAST=0, fewer launches per step: the weights' Cast launches
  are gone and one MultiTensorCast launch ran, nothing else differs; the step graph has a
  MultiTensorCast node of those casts (these runs with NPUSIM_CONV_WEIGHTS_BLOCKED=0). With
  rewrite 19b (NPUSIM_CONV_WEIGHTS_BLOCKED=1) its convolution's filter is a member written in blocks of 16 output
  channels by the cast's own store: the same losses and weights bit for bit, no launch added.
  Unset, the chip decides: on where its MTE issue keys (mte.copy_issue_cycles, burst_cycles) are
  > 0, off where they are 0 (the test chip as it is, and with the 910b preset's keys set).
- A CNN of grouped convolutions (Conv2D(groups=2): groups of whole 16-channel blocks, groups
  that split a block, and 24 output channels, not whole blocks) with rewrite 19b: the same
  losses and weights bit for bit as with HWIO filters.
Both with the NpuGraph task lists and node by node (NPUSIM_GRAPH=0).
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import SMALL_CNN_TRAINING, chip_config, child_result, launch_multiset_diff  # noqa: E402  pylint: disable=wrong-import-position

CODE = SMALL_CNN_TRAINING + r'''
import glob, json, os
import numpy as np
import npusim
import tensorflow as tf
import keras
from tensorflow.core.framework import graph_pb2


def launches(recs):
    return sorted([r["op_type"], r["op_name"]] for r in recs)


def variables_run():
    rng = np.random.default_rng(7)
    # Values that round to float16 in every way: ties, subnormals, overflow to inf.
    init = rng.uniform(-70000.0, 70000.0, (3, 5, 41)).astype(np.float32)
    init[0, 0, :4] = [2049.0, 2051.0, 1e-7, -3e-8]
    x = rng.uniform(-1.0, 1.0, (5, 41)).astype(np.float32)
    with tf.device("/NPU:0"):
        a, b, c = (tf.Variable(init[k]) for k in range(3))

        @tf.function
        def step(x):
            a16 = tf.cast(a, tf.float16)
            b16 = tf.cast(b, tf.float16)
            c16 = tf.cast(c, tf.float16)   # c is only read: stays a Cast
            x16 = tf.cast(x, tf.float16)   # no variable: stays a Cast
            with tf.control_dependencies([a16, b16]):
                a.assign_add(x * 0.5)
                b.assign_sub(x * 0.25)
            return a16, b16, c16, x16

        npusim.clear_launch_records()
        outs = step(tf.constant(x))
    recs = npusim.launch_records()
    want = [init[0].astype(np.float16), init[1].astype(np.float16), init[2].astype(np.float16),
            x.astype(np.float16)]
    return {"outs": [o.numpy().view(np.uint16).tolist() for o in outs],
            "want": [w.view(np.uint16).tolist() for w in want],
            "values": [v.numpy().tolist() for v in (a, b)],
            "launches": launches(recs)}


def step_graph_nodes(folder):
    path = sorted(glob.glob(os.path.join(folder, "*step*.after.pb")),
                  key=lambda p: int(p.split(".")[-3]))[-1]
    g = graph_pb2.GraphDef()
    with open(path, "rb") as f:
        g.ParseFromString(f.read())
    nodes = list(g.node)
    for n in g.node:  # the nodes inside NpuGraph nodes (their subgraph, npu_graph.h)
        if n.op == "NpuGraph":
            sub = graph_pb2.GraphDef()
            sub.ParseFromString(n.attr["graph"].s)
            nodes += list(sub.node)
    return nodes


def training_step(model, opt):
    """One Adam step of `model` on (x, y) as a tf.function: the loss and the largest |logit|."""
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, logits, from_logits=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
        return loss, tf.reduce_max(tf.abs(logits))

    return step


def two_conv_training(device):
    """The small CNN with a second, stride-2 convolution: its filter is read by the forward
    convolution and by the input gradient (Conv2DBackpropInput)."""
    keras.utils.set_random_seed(0)
    with tf.device(device):
        inp = keras.Input((8, 8, 3))
        h = keras.layers.Conv2D(16, 3, padding="same")(inp)
        h = keras.layers.ReLU()(keras.layers.BatchNormalization()(h))
        h = keras.layers.Conv2D(32, 3, strides=2, padding="same")(h)
        h = keras.layers.ReLU()(keras.layers.BatchNormalization()(h))
        h = keras.layers.GlobalAveragePooling2D()(h)
        model = keras.Model(inp, keras.layers.Dense(4)(h))
        opt = keras.optimizers.Adam(0.01)
        rng = np.random.default_rng(0)
        x = tf.constant(rng.standard_normal((4, 8, 8, 3)).astype(np.float32))
        y = tf.constant(rng.integers(0, 4, 4).astype(np.int32))

    return model, training_step(model, opt), x, y


def grouped_training(device):
    """Grouped convolutions (two groups each) of 32 output channels a group (whole 16-channel
    blocks: the filter read in place; the second also by its input gradient), of 24 a group (a
    group splits a block: an HWIO copy) and of 12 (24 output channels: HWIO bytes)."""
    keras.utils.set_random_seed(0)
    with tf.device(device):
        inp = keras.Input((8, 8, 16))
        h = inp
        for filters, size in ((64, 3), (64, 3), (48, 3), (24, 1)):
            h = keras.layers.Conv2D(filters, size, padding="same", groups=2)(h)
            h = keras.layers.ReLU()(keras.layers.BatchNormalization()(h))
        h = keras.layers.GlobalAveragePooling2D()(h)
        model = keras.Model(inp, keras.layers.Dense(4)(h))
        opt = keras.optimizers.Adam(0.01)
        rng = np.random.default_rng(1)
        x = tf.constant(rng.standard_normal((4, 8, 8, 16)).astype(np.float32))
        y = tf.constant(rng.integers(0, 4, 4).astype(np.int32))

    return model, training_step(model, opt), x, y


def cnn_run(folder, build):
    os.makedirs(folder, exist_ok=True)
    os.environ["NPUSIM_GRAPH_DUMP"] = folder
    model, step, x, y = build("/NPU:0")
    losses = []
    with tf.device("/NPU:0"):
        for _ in range(3):
            npusim.clear_launch_records()
            losses.append(float(step(x, y)[0].numpy()))
    recs = npusim.launch_records()
    os.environ.pop("NPUSIM_GRAPH_DUMP")
    nodes = step_graph_nodes(folder)
    multi = [{"N": n.attr["N"].i, "members": [m.decode() for m in n.attr["_npusim_members"].list.s],
              "n16": list(n.attr["filter_n16"].list.i)}
             for n in nodes if n.op == "MultiTensorCast"]
    convs = [{"op": n.op, "filter": n.input[1],
              "layout": n.attr["_npusim_filter_layout"].s.decode()}
             for n in nodes if n.op in ("Conv2D", "Conv2DBiasAdd", "Conv2DBNTrainingReduce",
                                        "Conv2DBackpropInput")]
    return {"losses": losses, "weights": [w.numpy().tolist() for w in model.weights],
            "launches": launches(recs), "multi": multi, "convs": convs}


if os.environ["WHAT"] == "variables":
    print("RESULT " + json.dumps(variables_run()))
elif os.environ["WHAT"] == "two_conv":
    print("RESULT " + json.dumps(cnn_run(os.environ["DUMP"], two_conv_training)))
elif os.environ["WHAT"] == "grouped":
    print("RESULT " + json.dumps(cnn_run(os.environ["DUMP"], grouped_training)))
else:
    print("RESULT " + json.dumps(cnn_run(os.environ["DUMP"], small_cnn_training)))
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multi_cast")
    # HWIO filters (rewrite 19b off) unless a run says otherwise
    cnn = {"WHAT": "cnn", "NPUSIM_PRECISION_MODE": "allow_mix_precision",
           "TF_ENABLE_ONEDNN_OPTS": "0", "NPUSIM_CONV_WEIGHTS_BLOCKED": "0"}
    blocked = dict(cnn, NPUSIM_CONV_WEIGHTS_BLOCKED="1")
    variables = {"WHAT": "variables"}
    two = dict(cnn, WHAT="two_conv")
    two_blocked = dict(two, NPUSIM_CONV_WEIGHTS_BLOCKED="1")
    grouped = dict(cnn, WHAT="grouped")
    # the MTE issue keys of the 910b preset (configs/chips/910b.yaml), set on the test chip
    priced = "mte.copy_issue_cycles=15.539;mte.burst_cycles=5.093"
    return {
        "grouped": {
            "hwio": child_result(CODE, extra_env=dict(grouped, DUMP=str(tmp / "grouped_hwio"))),
            "n16": child_result(CODE, extra_env=dict(grouped, NPUSIM_CONV_WEIGHTS_BLOCKED="1",
                                                     DUMP=str(tmp / "grouped_n16"))),
            "n16_alone": child_result(CODE, extra_env=dict(
                grouped, NPUSIM_CONV_WEIGHTS_BLOCKED="1", NPUSIM_GRAPH="0",
                DUMP=str(tmp / "grouped_n16_alone"))),
        },
        "default": {
            "chip": child_result(CODE, extra_env=dict(cnn, NPUSIM_CONV_WEIGHTS_BLOCKED="",
                                                      DUMP=str(tmp / "default_chip"))),
            "priced": child_result(CODE, extra_env=dict(
                cnn, NPUSIM_CONV_WEIGHTS_BLOCKED="", NPUSIM_CHIP_OVERRIDES=priced,
                DUMP=str(tmp / "default_priced"))),
            "priced_hwio": child_result(CODE, extra_env=dict(
                cnn, NPUSIM_CHIP_OVERRIDES=priced, DUMP=str(tmp / "default_priced_hwio"))),
        },
        "two_conv": {
            "hwio": child_result(CODE, extra_env=dict(two, DUMP=str(tmp / "two_hwio"))),
            "n16": child_result(CODE, extra_env=dict(two_blocked, DUMP=str(tmp / "two_n16"))),
            "n16_alone": child_result(CODE, extra_env=dict(two_blocked, NPUSIM_GRAPH="0",
                                                           DUMP=str(tmp / "two_n16_alone"))),
            "n16_grad_hwio": child_result(CODE, extra_env=dict(
                two_blocked, NPUSIM_CONV_WEIGHTS_BLOCKED_INPUT_GRAD="0",
                DUMP=str(tmp / "two_grad_hwio"))),
        },
        "variables": {
            "on": child_result(CODE, extra_env=variables),
            "off": child_result(CODE, extra_env=dict(variables, NPUSIM_FUSION_MULTI_CAST="0")),
            "on_alone": child_result(CODE, extra_env=dict(variables, NPUSIM_GRAPH="0")),
        },
        "cnn": {
            "on": child_result(CODE, extra_env=dict(cnn, DUMP=str(tmp / "on"))),
            "off": child_result(CODE, extra_env=dict(cnn, DUMP=str(tmp / "off"),
                                                     NPUSIM_FUSION_MULTI_CAST="0")),
            "n16": child_result(CODE, extra_env=dict(blocked, DUMP=str(tmp / "n16"))),
            "n16_alone": child_result(CODE, extra_env=dict(blocked, DUMP=str(tmp / "n16_alone"),
                                                           NPUSIM_GRAPH="0")),
            "on_alone": child_result(CODE, extra_env=dict(cnn, DUMP=str(tmp / "on_alone"),
                                                          NPUSIM_GRAPH="0")),
        },
    }


def ops(launch_list):
    return [op for op, _ in launch_list]


def test_written_variables_casts_grouped_only(runs):
    on, off, alone = (runs["variables"][k] for k in ("on", "off", "on_alone"))
    for run in (on, off, alone):
        assert run["outs"] == run["want"]
    assert on["values"] == off["values"] == alone["values"]
    # Off: four Casts; on: a's and b's in one MultiTensorCast launch, c's (only read) and x's
    # (no variable) stay Casts.
    assert ops(off["launches"]).count("Cast") == 4, off["launches"]
    assert "MultiTensorCast" not in ops(off["launches"])
    for run in (on, alone):
        assert ops(run["launches"]).count("Cast") == 2, run["launches"]
        assert ops(run["launches"]).count("MultiTensorCast") == 1, run["launches"]


def test_mixed_precision_weight_casts_in_one_launch(runs):
    on, off, alone = (runs["cnn"][k] for k in ("on", "off", "on_alone"))
    assert on["losses"] == off["losses"] == alone["losses"]
    assert on["weights"] == off["weights"] == alone["weights"]
    assert on["losses"][-1] < on["losses"][0]
    # Launch by launch (op type, node name): Casts are gone and MultiTensorCast launches came;
    # nothing else differs.
    missing, extra = launch_multiset_diff(off["launches"], on["launches"])
    assert missing and set(ops(missing)) == {"Cast"}, missing
    assert extra and set(ops(extra)) == {"MultiTensorCast"}, extra
    assert len(on["launches"]) < len(off["launches"])
    # The step graph's MultiTensorCast takes as many Casts as left the launches (the kernel of
    # the convolution and of the dense layer at least).
    assert not off["multi"]
    assert len(on["multi"]) == 1 and on["multi"][0]["N"] >= 2, on["multi"]
    assert on["multi"][0]["N"] == len(missing), (on["multi"], missing)
    assert alone["losses"] == on["losses"]


def test_forward_convolution_filters_blocked(runs):
    """Rewrite 19b (NPUSIM_CONV_WEIGHTS_BLOCKED=1): the convolution reads its float16 filter from a
    MultiTensorCast member written in blocks of 16 output channels (filter_n16,
    _npusim_filter_layout); the losses and weights are those of the HWIO filter
    (NPUSIM_CONV_WEIGHTS_BLOCKED=0) bit for bit, in the task list and node by node, and the
    launches are the same (the cast's own store writes the blocks: no relayout launch)."""
    hwio, n16_run, alone = runs["cnn"]["on"], runs["cnn"]["n16"], runs["cnn"]["n16_alone"]
    for run in (n16_run, alone):
        assert run["losses"] == hwio["losses"]
        assert run["weights"] == hwio["weights"]
    assert hwio["multi"] and not hwio["multi"][0]["n16"], hwio["multi"]
    assert all(c["layout"] == "" for c in hwio["convs"]), hwio["convs"]
    n16 = n16_run["multi"][0]["n16"]
    assert n16, n16_run["multi"]
    name = "npusim_multi_cast_0"
    blocked_outputs = {name if m == 0 else f"{name}:{m}" for m in n16}
    assert n16_run["convs"], n16_run["convs"]
    for c in n16_run["convs"]:
        assert c["layout"] == "N16_HWI16", n16_run["convs"]
        assert c["filter"] in blocked_outputs, (c, n16)
    # (op type, node name): the same launches (the first convolution's filter has no input
    # gradient, so no HWIO member is kept beside the blocked one)
    missing, extra = launch_multiset_diff(hwio["launches"], n16_run["launches"])
    assert not missing and not extra, (missing, extra)


def test_input_gradient_reads_the_blocked_filter(runs):
    """Rewrite 19b with a filter that the input gradient reads too (the second, stride-2
    convolution of a two-convolution CNN): Conv2DBackpropInput reads the same blocked member as
    the forward convolution, so the cast writes no HWIO copy beside it (the MultiTensorCast has
    as many members as with HWIO filters); the same losses and weights bit for bit as with HWIO
    filters, in the task list and node by node, and the same launches. With
    NPUSIM_CONV_WEIGHTS_BLOCKED_INPUT_GRAD=0 the input gradient reads HWIO: one more member."""
    two = runs["two_conv"]
    hwio, n16_run = two["hwio"], two["n16"]
    for run in (n16_run, two["n16_alone"], two["n16_grad_hwio"]):
        assert run["losses"] == hwio["losses"]
        assert run["weights"] == hwio["weights"]
    grads = [c for c in hwio["convs"] if c["op"] == "Conv2DBackpropInput"]
    assert grads and all(c["layout"] == "" for c in hwio["convs"]), hwio["convs"]
    n16 = n16_run["multi"][0]["n16"]
    name = "npusim_multi_cast_0"
    blocked_outputs = {name if m == 0 else f"{name}:{m}" for m in n16}
    grads = [c for c in n16_run["convs"] if c["op"] == "Conv2DBackpropInput"]
    assert grads, n16_run["convs"]
    for c in n16_run["convs"]:
        assert c["layout"] == "N16_HWI16", n16_run["convs"]
        assert c["filter"] in blocked_outputs, (c, n16)
    assert n16_run["multi"][0]["N"] == hwio["multi"][0]["N"], (n16_run["multi"], hwio["multi"])
    missing, extra = launch_multiset_diff(hwio["launches"], n16_run["launches"])
    assert not missing and not extra, (missing, extra)
    # the input gradient on HWIO: its filter's blocked copy is one more member
    kept = two["n16_grad_hwio"]
    assert kept["multi"][0]["N"] == hwio["multi"][0]["N"] + 1, kept["multi"]
    assert all(c["layout"] == "" for c in kept["convs"] if c["op"] == "Conv2DBackpropInput")


def test_grouped_convolutions_read_blocked_filters(runs):
    """Rewrite 19b on grouped convolutions (whose groups the pass cannot see: the compiler reads
    any grouped blocked filter): the forward convolutions and input gradients of 16-channel
    multiples are marked and read blocked members, and the losses and weights are those of
    HWIO filters bit for bit, in the task list and node by node."""
    grouped = runs["grouped"]
    hwio, n16_run = grouped["hwio"], grouped["n16"]
    for run in (n16_run, grouped["n16_alone"]):
        assert run["losses"] == hwio["losses"]
        assert run["weights"] == hwio["weights"]
    assert hwio["losses"][-1] < hwio["losses"][0]
    assert all(c["layout"] == "" for c in hwio["convs"]), hwio["convs"]
    n16 = n16_run["multi"][0]["n16"]
    name = "npusim_multi_cast_0"
    blocked_outputs = {name if m == 0 else f"{name}:{m}" for m in n16}
    marked = [c for c in n16_run["convs"] if c["layout"] == "N16_HWI16"]
    for c in marked:
        assert c["filter"] in blocked_outputs, (c, n16)
    # the three convolutions of 64 and 48 output channels at least, and input gradients
    forward = [c for c in marked if c["op"] != "Conv2DBackpropInput"]
    assert len(forward) >= 3, n16_run["convs"]
    assert any(c["op"] == "Conv2DBackpropInput" for c in marked), n16_run["convs"]


def test_blocked_filters_by_default_where_the_chip_prices_the_dma_issue(runs):
    """NPUSIM_CONV_WEIGHTS_BLOCKED unset: rewrite 19b runs where the chip's MTE issue keys are
    > 0 and not where they are 0 (the test chip as it is: off on tiny; with the 910b preset's
    keys set: on); either way the losses and weights are those of HWIO filters."""
    default = runs["default"]
    mte = chip_config().get("mte", {})
    chip_priced = mte.get("copy_issue_cycles", 0) > 0 or mte.get("burst_cycles", 0) > 0
    # (the keys may move the kernels' tilings: each against HWIO filters on the same keys)
    for key, on, hwio in (("chip", chip_priced, runs["cnn"]["on"]),
                          ("priced", True, default["priced_hwio"])):
        run = default[key]
        assert run["losses"] == hwio["losses"], key
        assert run["weights"] == hwio["weights"], key
        layouts = {c["layout"] for c in run["convs"]}
        assert layouts == ({"N16_HWI16"} if on else {""}), (key, run["convs"])
        assert bool(run["multi"][0]["n16"]) == on, (key, run["multi"])
