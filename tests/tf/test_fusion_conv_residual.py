"""The residual add in the fused convolution (adapter/tf/plugin/graph_fusion.h rewrite 2b,
docs/tf_plugin.md "Inference fusions"): AddV2(Conv2DBatchNormInference, r) [-> ReLU] as one
Conv2DBatchNormInference with r as its residual (CANN's Conv2D + BNInference + Add), and the
fp16 hand-offs through the residuals.

Two MobileNetV2 inverted-residual blocks of stride 1 (expansion + BN + ReLU6, depthwise + BN +
ReLU6, projection + BN, Add with the block's input) between a stem and a head convolution, and
a ResNet-style pair (conv + BN + ReLU, conv + BN, Add, ReLU), run with training=False in a
tf.function on the NPU (tiny chip: a bias table, the add by a vector launch after the
convolution) and on tiny_coupled (the 310P's core: the add on each tile in the UB, in the
convolution's kernel):

- the outputs match TensorFlow on the CPU within tests/tf/test_fusion.py's 1e-2 of the norm;
- no AddV2, AddRelu or Relu launch is left, and on the coupled chip no launch but the
  convolutions' (and their batch-norm folds, filters and x's cast): the residual and the
  ReLU after it are in the kernel (Conv2DBatchNormInferenceAdd[Relu]_f16);
- the block outputs between the convolutions go in f16 (the only cast is x's), also with 24
  channels (48-byte rows: packed per tile on the coupled chip);
- what must not fuse stays an AddV2 and still matches the CPU: a projection also read as a
  model output, an add of a per-channel constant (broadcast), an add after a ReLU6 expansion.
"""

import json
import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import INFERENCE_HELPERS, run_child  # noqa: E402  pylint: disable=wrong-import-position

RTOL = 1e-2

MODEL_CODE = INFERENCE_HELPERS + r'''
def conv_bn(h, filters, depthwise=False, act=None):
    if depthwise:
        h = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False)(h)
    else:
        h = keras.layers.Conv2D(filters, 1, use_bias=False)(h)
    h = keras.layers.BatchNormalization(epsilon=1e-3, momentum=0.999)(h)
    if act == "relu6":
        h = keras.layers.ReLU(6.0)(h)
    elif act == "relu":
        h = keras.layers.ReLU()(h)
    return h

def build(kind):
    """kind: mobilenet (two residual blocks of 16 channels between a stem and a head),
    mobilenet24 (the same with 24 channels: 48-byte f16 rows, packed on the coupled chip),
    mobilenet_fetch (the first projection also a model output), resnet (conv + BN + ReLU, conv
    + BN, Add, ReLU), bias (a projection plus a per-channel constant), relu6_add (an add after
    a ReLU6 expansion)."""
    keras.utils.set_random_seed(23)
    inp = keras.Input((8, 8, 8))
    outputs = []
    if kind.startswith("mobilenet"):
        width = 24 if kind == "mobilenet24" else 16
        h = conv_bn(inp, width, act="relu6")  # the stem
        for b in range(2):
            e = conv_bn(h, 64, act="relu6")
            e = conv_bn(e, 64, depthwise=True, act="relu6")
            p = conv_bn(e, width)
            if b == 0 and kind == "mobilenet_fetch":
                outputs.append(p)
            h = keras.layers.Add()([h, p])
        outputs.insert(0, conv_bn(h, 32, act="relu6"))  # the head
    elif kind == "resnet":
        h = conv_bn(inp, 32, act="relu")
        p = conv_bn(conv_bn(h, 32, act="relu"), 32)
        outputs.append(keras.layers.ReLU()(keras.layers.Add()([p, h])))
    elif kind == "bias":
        h = conv_bn(inp, 16, act="relu6")
        p = conv_bn(h, 16)
        c = keras.ops.convert_to_tensor(np.linspace(-1, 1, 16).astype(np.float32))
        outputs.append(keras.layers.Lambda(lambda t: t + c)(p))
    elif kind == "relu6_add":
        h = conv_bn(inp, 16, act="relu6")
        outputs.append(keras.layers.Add()([h, conv_bn(h, 16, act="relu6")]))
    model = keras.Model(inp, outputs)
    set_batch_norms(model, 7)
    x = np.random.default_rng(8).standard_normal((2, 8, 8, 8)).astype(np.float32)
    return model, x
'''

CHILD_CODE = MODEL_CODE + r'''
import json, sys
import npusim
import tensorflow as tf
result = {}
for kind in sys.argv[1:]:
    model, x = build(kind)
    with tf.device("/CPU:0"):
        want = model(tf.constant(x), training=False)
    want = [np.asarray(w, np.float64) for w in (want if isinstance(want, (list, tuple)) else [want])]
    got, recs = npu_second_run(npusim, tf, model, x)
    got = [np.asarray(g, np.float64) for g in got]
    result[kind] = {
        "errors": [float(np.linalg.norm(g - w) / np.linalg.norm(w)) for g, w in zip(got, want)],
        "records": [[r["op_type"], r["kernel"]] for r in recs]}
print("RESULT " + json.dumps(result))
'''

KINDS = ["mobilenet", "mobilenet24", "mobilenet_fetch", "resnet", "bias", "relu6_add"]


def run_kinds(chip):
    proc = run_child(CHILD_CODE.replace("sys.argv[1:]", repr(KINDS)), timeout=600,
                     extra_env={"NPUSIM_CHIP": chip})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module", params=["tiny", "tiny_coupled"])
def chip_results(request):
    return request.param, run_kinds(request.param)


def op_types(res):
    return {t for t, _ in res["records"]}


def kernels(res):
    return [k for _, k in res["records"]]


def test_outputs_match_the_cpu(chip_results):
    _, results = chip_results
    for kind, res in results.items():
        assert all(e < RTOL for e in res["errors"]), (kind, res["errors"])


def test_the_residual_adds_leave_no_launch_of_their_own(chip_results):
    chip, results = chip_results
    for kind in ("mobilenet", "mobilenet24", "resnet"):
        res = results[kind]
        types = op_types(res)
        for gone in ("AddV2", "AddRelu", "Relu", "Relu6", "FusedElementwise"):
            assert gone not in types, (kind, gone, sorted(types))
        ks = kernels(res)
        if chip == "tiny_coupled":  # in the convolution's kernel, the ReLU after the add
            want = ("Conv2DBatchNormInferenceAdd_f16" if kind.startswith("mobilenet")
                    else "Conv2DBatchNormInferenceAddRelu_f32")
            assert ks.count(want) == (2 if kind.startswith("mobilenet") else 1), (kind, ks)
            assert not [k for k in ks if k.startswith("AddResidual")], (kind, ks)
        else:  # a bias table: FIXPIPE adds the shift, one vector launch the residual
            want = "AddResidual_f16" if kind.startswith("mobilenet") else "AddResidualRelu_f32"
            assert ks.count(want) == (2 if kind.startswith("mobilenet") else 1), (kind, ks)


def test_block_outputs_go_in_fp16(chip_results):
    """The stem's and the first block's outputs are read by convolutions as x and as the
    residual: f16 (so the second block's residual is f16 too); the only cast is x's."""
    _, results = chip_results
    for kind in ("mobilenet", "mobilenet24"):  # 24 channels: packed rows, no f32 and cast
        ks = kernels(results[kind])
        assert [k for k in ks if k.startswith("Cast")] == ["Cast_f32_f16"], (kind, ks)


def test_what_must_not_fuse_stays_an_add(chip_results):
    _, results = chip_results
    # the first projection is a model output: its add stays (the second block's is fused)
    fetch = results["mobilenet_fetch"]
    assert [t for t in (t for t, _ in fetch["records"])].count("AddV2") == 1, fetch["records"]
    # a per-channel constant (not an activation of the network): broadcast, stays AddV2
    assert "AddV2" in op_types(results["bias"]), results["bias"]["records"]
    # the expansion's ReLU6 comes before the add: stays AddV2
    assert "AddV2" in op_types(results["relu6_add"]), results["relu6_add"]["records"]
