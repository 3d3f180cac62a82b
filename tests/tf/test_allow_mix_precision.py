"""precision_mode allow_mix_precision: CANN's automatic mixed precision as a graph pass
(adapter/tf/plugin/mixed_precision.h). A small CNN (Conv2D with bias, BatchNormalization, ReLU,
global average pooling, Dense) trained three Adam steps with a softmax cross-entropy loss:

- the losses track TensorFlow on the CPU in float32 within the tolerance fp16 rounding allows
  (below), while the step's kernels run in fp16 (launch records);
- the graph after the pass (NPUSIM_GRAPH_DUMP, NPUSIM_GRAPH=0 so the nodes stay visible) has
  the trustlisted Conv2D, MatMul (the Dense layer's with its bias: MatMulBiasAdd) and
  convolution gradient in half, the graylisted training batch norm after them in half (x and dy; the statistics float), the blocklisted
  loss and the optimizer's variable updates in float, and the graylisted BiasAddGrad of the
  loss' gradient in float (it follows the blocklisted loss); variables stay float;
- NPUSIM_MIX_PRECISION_GRAPH=0 leaves every node float (the cube-only rounding of before);
- a modify_mixlist file moving Conv2D to the blocklist keeps the convolution float, and the
  graylisted ops after it follow it;
- a bad modify_mixlist file is an NpusimError from configure() naming the file and the key.

Tolerance: the NPU rounds each activation to fp16 (unit roundoff u = 2^-11) where the CPU keeps
float32. Along the forward path an element is rounded at most 8 times (convolution operands
and output, bias add, batch norm output, the pooled features, the Dense operands and output),
so the logits' relative error is at most ~8u; a softmax cross-entropy's gradient in the logits
has an L1 norm of at most 2, so |dL| <= 2 * 8u * max|logit|. Three steps of Adam(0.01) move
the weights by at most 0.01 each per step, by amounts that differ between the runs only
through the same roundings: we allow three times the one-step bound on the loss' scale,
rtol = 3 * 16u ~= 2.3e-2 of (loss + max|logit|).
"""

import glob
import json
import os
import sys

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import SMALL_CNN_TRAINING, child_result, chip_config, run_child  # noqa: E402  pylint: disable=wrong-import-position

CODE = SMALL_CNN_TRAINING + r'''
import glob, json, os
import numpy as np
import npusim
import tensorflow as tf
import keras
from tensorflow.core.framework import graph_pb2


def train(device):
    model, step, x, y = small_cnn_training(device)
    with tf.device(device):
        out = [step(x, y) for _ in range(3)]
    return ([float(l.numpy()) for l, _ in out], [float(m.numpy()) for _, m in out],
            [w.dtype for w in model.weights])


def step_graph(folder):
    """The step function's graph as the plugin's optimizer returned it last: {name: (op, T)}
    (T None where a node has none or a list of types, e.g. the launch order's input gate)."""
    path = sorted(glob.glob(os.path.join(folder, "*step*.after.pb")),
                  key=lambda p: int(p.split(".")[-3]))[-1]
    g = graph_pb2.GraphDef()
    with open(path, "rb") as f:
        g.ParseFromString(f.read())
    return [(n.name, n.op, tf.dtypes.as_dtype(n.attr["T"].type).name
             if "T" in n.attr and n.attr["T"].WhichOneof("value") == "type" else None)
            for n in g.node]


def run(folder):
    os.makedirs(folder, exist_ok=True)
    os.environ["NPUSIM_GRAPH_DUMP"] = folder
    npusim.clear_launch_records()
    losses, max_logits, dtypes = train("/NPU:0")
    kernels = sorted({(r["op_type"], r["kernel"]) for r in npusim.launch_records()})
    os.environ.pop("NPUSIM_GRAPH_DUMP")
    return {"losses": losses, "max_logits": max_logits, "nodes": step_graph(folder),
            "kernels": kernels, "variables": sorted({str(d) for d in dtypes})}


out = {"npu": run(os.path.join(os.environ["DUMP"], "mix"))}
if os.environ.get("OFF_TOO"):
    os.environ["NPUSIM_MIX_PRECISION_GRAPH"] = "0"
    out["off"] = run(os.path.join(os.environ["DUMP"], "off"))
    cpu = train("/CPU:0")
    out["cpu"] = {"losses": cpu[0], "max_logits": cpu[1]}
print("RESULT " + json.dumps(out))
'''

# (NPUSIM_FUSION_CONV_BN_REDUCE=0 and NPUSIM_FUSION_BN_RELU_GRAD=0: the node types the pass
# gives, before rewrite 15 of graph_fusion.h takes each BNTrainingReduce into its convolution
# and rewrite 0b the ReluGrad into the batch norm's gradients; tests/tf/
# test_fusion_conv_bn_reduce.py and test_fusion_bn_relu_grad.py run those under this mode.)
ENV = {"NPUSIM_PRECISION_MODE": "allow_mix_precision", "NPUSIM_GRAPH": "0",
       "TF_ENABLE_ONEDNN_OPTS": "0", "NPUSIM_FUSION_CONV_BN_REDUCE": "0",
       "NPUSIM_FUSION_BN_RELU_GRAD": "0"}
U = 2.0 ** -11


def _types(nodes, op):
    """The T of every node of type `op`."""
    return sorted({t for _, o, t in nodes if o == op})


def test_mixed_precision_trains_like_cpu_with_fp16_graph(tmp_path):
    res = child_result(CODE, extra_env=dict(ENV, DUMP=str(tmp_path), OFF_TOO="1"))
    npu, off, cpu = res["npu"], res["off"], res["cpu"]
    # Losses against TensorFlow on the CPU in float32 (tolerance: module docstring).
    for got, want, logit in zip(npu["losses"], cpu["losses"], cpu["max_logits"]):
        assert abs(got - want) <= 3 * 16 * U * (abs(want) + logit), (npu["losses"], cpu["losses"])
    assert npu["losses"][-1] < npu["losses"][0]
    assert npu["variables"] == ["float32"]
    nodes = npu["nodes"]
    # trustlist: half (the convolution and the Dense layer with their bias epilogues, the bias
    # f32; the Dense layer's gradient MatMuls)
    for op in ("Conv2DBiasAdd", "MatMulBiasAdd", "MatMul", "Conv2DBackpropFilter"):
        assert _types(nodes, op) == ["float16"], (op, _types(nodes, op))
    assert "BiasAdd" not in {o for _, o, _ in nodes}, nodes
    # graylist after them: half (the training batch norm's four ops, ReLU's gradient)
    for op in ("BNTrainingReduce", "BNTrainingUpdate", "BNTrainingUpdateGrad",
               "BNTrainingReduceGrad", "ReluGrad"):
        assert _types(nodes, op) == ["float16"], (op, _types(nodes, op))
    # blocklist: float; the optimizer's updates float
    for op in ("SparseSoftmaxCrossEntropyWithLogits", "Mean", "FusedVariableUpdate"):
        assert _types(nodes, op) == ["float32"], (op, _types(nodes, op))
    # graylist after the blocklisted loss: the Dense bias gradient follows it (float); the
    # convolution's bias gradient follows the half batch-norm gradient, and is then that
    # BNTrainingReduceGrad's output 1 (graph_fusion.h rewrite 0d; half, above)
    bias_grads = {name: t for name, op, t in nodes if op == "BiasAddGrad"}
    assert list(bias_grads.values()) == ["float32"], bias_grads
    assert all("dense" in name for name in bias_grads), bias_grads
    # one Cast per tensor and type
    casts = [(name, op) for name, op, _ in nodes if op == "Cast" and "npusim_amp" in name]
    assert casts and len(casts) == len(set(casts))
    # the kernels that ran: fp16 convolution, batch norm and the Dense layer's product with
    # its bias (no BiasAdd launch); the convolution's bias from the bias table where the chip
    # has one (an l1->bt path), else added by the convolution's epilogue launch (ops/conv2d.cpp)
    kernels = {k for _, k in npu["kernels"]}
    conv = "Conv2DBias_f16" if "l1->bt" in chip_config()["paths"] else "Conv2D_f16"
    assert {conv, "BNTrainingUpdateRelu_f16"} <= kernels, kernels
    assert ["MatMulBiasAdd", "MatMul_f16_f16"] in npu["kernels"], npu["kernels"]
    assert "BiasAdd" not in {t for t, _ in npu["kernels"]}, npu["kernels"]
    # NPUSIM_MIX_PRECISION_GRAPH=0: every node float, as before the pass
    assert "float16" not in {t for _, _, t in off["nodes"]}, off["nodes"]
    assert not any("f16" in k for _, k in off["kernels"] if not k.startswith(("Cast", "MatMul",
                                                                               "FilterGrad"))), \
        off["kernels"]


def test_modify_mixlist_moves_conv2d_to_blocklist(tmp_path):
    mixlist = tmp_path / "ops_info.json"
    mixlist.write_text(json.dumps({"black-list": {"to-add": ["Conv2D"]},
                                   "white-list": {"to-remove": ["Conv2DBackpropFilter"]}}))
    res = child_result(CODE, extra_env=dict(ENV, DUMP=str(tmp_path),
                                            NPUSIM_MODIFY_MIXLIST=str(mixlist)))
    nodes = res["npu"]["nodes"]
    # the convolution stays float32 and keeps its fused bias epilogue (not split: its product
    # is not reduced)
    assert _types(nodes, "Conv2D") == []
    assert _types(nodes, "Conv2DBiasAdd") == ["float32"]
    # graylisted ops after the float convolution follow it; the Dense layer keeps its bias in
    # its half MatMulBiasAdd
    for op in ("BNTrainingReduce", "BNTrainingUpdate"):
        assert _types(nodes, op) == ["float32"], (op, _types(nodes, op))
    assert _types(nodes, "MatMulBiasAdd") == ["float16"]
    # the Dense layer's MatMul stays trustlisted; the batch norm's gradient reads the float32
    # convolution's output (blocklisted: it follows it), and Conv2DBackpropFilter, moved to the
    # graylist, follows that float32 gradient
    assert _types(nodes, "MatMul") == ["float16"]
    for op in ("BNTrainingUpdateGrad", "BNTrainingReduceGrad", "Conv2DBackpropFilter"):
        assert _types(nodes, op) == ["float32"], (op, _types(nodes, op))


ERRORS = r'''
import json, sys
import npusim
for path in sys.argv[1:]:
    try:
        npusim.configure(precision_mode="allow_mix_precision", modify_mixlist=path)
        print("RESULT-" + json.dumps([path, None]))
    except npusim.NpusimError as e:
        print("RESULT-" + json.dumps([path, str(e)]))
'''


BAD_FILES = [
    ('{"black-list": {"to-add": ["Exp"]}, "grey-list": {}}', "grey-list"),
    ('{"black-list": {"to-ad": ["Exp"]}}', "black-list.to-ad"),
    ('{"white-list": {"to-add": "Conv2D"}}', "white-list.to-add"),
    ('{"white-list": {"to-add": ["MatMul", 3]}}', "white-list.to-add[1]"),
    ('{"black-list": {"to-remove": ["Conv2D"]}}', "black-list.to-remove[0]"),
    ('{"black-list": ', "not valid JSON"),
]


def test_bad_mixlist_is_a_clear_error(tmp_path):
    """Each bad file in one child (configure() restores the environment after each error)."""
    paths = []
    for i, (content, _) in enumerate(BAD_FILES):
        paths.append(tmp_path / f"mix{i}.json")
        paths[-1].write_text(content)
    missing = tmp_path / "missing.json"
    code = ERRORS.replace("sys.argv[1:]", json.dumps([str(p) for p in paths + [missing]]))
    proc = run_child(code, extra_env={"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = dict(json.loads(l[len("RESULT-"):]) for l in proc.stdout.splitlines()
                  if l.startswith("RESULT-"))
    for path, (_, key) in zip(paths, BAD_FILES):
        error = errors[str(path)]
        assert error is not None and str(path) in error and key in error, error
    assert errors[str(missing)] is not None and str(missing) in errors[str(missing)]


# Inference reading a float32 constant in float16 (a frozen graph's weights), then training
# reading a variable in float16, under allow_mix_precision; node by node or as whole graphs.
# Prints every call's Cast launches (op name) and the inference result.
CONST_AND_VARIABLE_CASTS = r'''
import json
import numpy as np
import npusim
npusim.configure(precision_mode="allow_mix_precision", graph_mode={graph_mode})
import tensorflow as tf
rng = np.random.default_rng(4)
x_np = rng.standard_normal((16, 64)).astype(np.float32)
w_np = rng.standard_normal((64, 32)).astype(np.float32) * 0.1


def casts():
    return [r["op_name"] for r in npusim.launch_records() if r["kernel"].startswith("Cast")]


@tf.function
def infer(x):
    return tf.nn.relu(tf.matmul(x, tf.constant(w_np, name="frozen_weight")))


v = tf.Variable(w_np)


@tf.function
def train(x):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.matmul(x, v) ** 2)
    v.assign_sub(1e-3 * tape.gradient(loss, v))
    return loss


x = tf.constant(x_np)
result = {{"infer": [], "train": []}}
with tf.device("/NPU:0"):
    for _ in range(2):
        npusim.clear_launch_records()
        y = infer(x).numpy()
        result["infer"].append(casts())
    for _ in range(2):
        npusim.clear_launch_records()
        train(x).numpy()
        result["train"].append(casts())
result["y"] = y.tolist()
print("RESULT" + json.dumps(result))
'''


@pytest.mark.parametrize("graph_mode", [False, True], ids=["node_by_node", "whole_graph"])
def test_constants_read_in_float16_are_folded_and_changed_weights_cast(graph_mode):
    """A float32 Const read by a float16 MatMul is stored in float16 by the pass (as CANN's graph
    engine folds the Cast): no call casts it, the input x is cast at every call. (Node by node,
    TensorFlow's constant folding folds the pass's Cast too; in a whole graph, the default, only
    the pass can: before it, every call launched that Cast.) A variable the step writes is cast
    at every training step (its float32 master copy changed). The result is that of the float16
    product of the rounded operands."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    result = child_result(CONST_AND_VARIABLE_CASTS.format(graph_mode=graph_mode))
    for casts in result["infer"]:
        assert not [c for c in casts if "frozen_weight" in c], casts
        # Casts to float16: x's, at every call (the result's cast back to float32 is not one).
        assert [c for c in casts if c.endswith("_f16")] == ["x/npusim_amp_0_f16"], casts
    for casts in result["train"]:  # x's and the changed variable's casts, at every step
        assert len([c for c in casts if "ReadVariableOp" in c]) >= 1, casts
    rng = np.random.default_rng(4)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    w = rng.standard_normal((64, 32)).astype(np.float32) * 0.1
    # The reference: the float16 operands multiplied exactly (float64), rounded to float16 once.
    want = np.maximum(x.astype(np.float16).astype(np.float64) @
                      w.astype(np.float16).astype(np.float64), 0).astype(np.float16)
    # fp32 accumulation and one fp16 rounding of the output: within 1 fp16 ulp (2^-10 relative).
    np.testing.assert_allclose(np.array(result["y"], dtype=np.float32), want.astype(np.float32),
                               rtol=2.0 ** -10, atol=1e-3)
