"""The batch norm's ReLU fused under Keras' mixed_float16 (adapter/tf/plugin/graph_fusion.h,
rewrite 0f, then 0b and 0c): under the policy the ReLU reads the Cast of the batch norm's y back
to float16, so rewrite 0 takes the batch norm without it; once rewrite 0e has removed the Casts,
0f folds a Relu that alone reads a BNTrainingUpdate's y into it (relu = true), and 0b folds the
ReluGrad into the batch norm's gradients, as for float32 graphs. A residual add's ReLU (0c)
fuses under the policy with or without 0f, a projection block's too (its two batch norms' dy is
one Cast, which 0e takes for both).

A small CNN under `mixed_float16`, SGD with momentum, three steps, against
NPUSIM_FUSION_BN_RELU=0 and NPUSIM_FUSION_BN_HALF_CASTS=0 in child processes and TF on the CPU:
two Conv-BN-ReLU blocks (fused; the second's output also the next block's shortcut, so its ReLU's
gradient is a sum), a residual block Conv-BN + Add + ReLU and a projection block (0c's AddRelus,
fused in both of the first two runs), and a Conv-BN whose y is read by its ReLU and by a pooled
side branch (must not fuse: its Relu stays, so does its ReluGrad):
- the fused run lacks the two blocks' Relu launches, the first one's ReluGrad, and the second
  one's FusedElementwise of its gradient sum and ReluGrad (rewrite 16), whose AddN stays a launch
  of its own, as in float32 graphs; BNTrainingUpdate and BNTrainingReduceGrad run with relu;
- the losses and every weight equal the rewrite-off run's bit for bit (the kernel clamps before
  rounding y to float16, the Relu after: the same values, and the fused gradients mask dy by
  ReluGrad's own test, adapter/compiler/ops/batchnorm.cpp);
- against the Casts kept: the same losses and trainable weights bit for bit, the moving
  statistics within 1e-6, 23 Cast launches fewer;
- the losses track the CPU's.
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import (  # noqa: E402  pylint: disable=wrong-import-position
    child_result, launch_multiset_diff)

CODE = r'''
import json
import numpy as np
import npusim
import tensorflow as tf
import keras

keras.mixed_precision.set_global_policy("mixed_float16")


def conv_bn(h, filters, kernel=3):
    h = keras.layers.Conv2D(filters, kernel, padding="same", use_bias=False)(h)
    return keras.layers.BatchNormalization()(h)


def train(device):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8, 8, 3)).astype(np.float32)
    y = np.arange(4).astype(np.int32) % 3
    with tf.device(device):
        inp = keras.Input((8, 8, 3))
        a = keras.layers.ReLU()(conv_bn(inp, 16))  # rewrite 0f, then 0b
        a = keras.layers.ReLU()(conv_bn(a, 16))  # the same; its gradient a sum (the shortcut's)
        a = keras.layers.ReLU()(keras.layers.Add()([conv_bn(a, 16), a]))  # rewrite 0c
        # a projection block (0c; both batch norms' dy one Cast under the policy)
        a = keras.layers.ReLU()(keras.layers.Add()([conv_bn(a, 32), conv_bn(a, 32, 1)]))
        z = conv_bn(a, 16)  # y read by its ReLU and a side branch: the ReLU stays
        h = keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(z))
        side = keras.layers.GlobalMaxPooling2D()(z)
        h = keras.layers.Concatenate()([h, side])
        out = keras.layers.Dense(3, dtype="float32")(h)
        model = keras.Model(inp, out)
        # (a loss scale that no step's float16 gradients overflow on either device)
        sgd = keras.optimizers.SGD(0.05, momentum=0.9)
        model.compile(optimizer=keras.optimizers.LossScaleOptimizer(sgd, initial_scale=2.0**8),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=False)
        losses = []
        for _ in range(3):
            npusim.clear_launch_records()
            losses.append(float(model.train_on_batch(x, y)))
        records = npusim.launch_records()
        return {"losses": losses, "types": [r["op_type"] for r in records],
                "kernels": [r["kernel"].split(" ")[0] for r in records],
                "weights": {v.path: v.numpy().astype(np.float64).tolist()
                            for v in model.variables}}


print("RESULT " + json.dumps({"npu": train("/NPU:0"), "cpu": train("/CPU:0")}))
'''


@pytest.fixture(scope="module")
def runs():
    return (child_result(CODE), child_result(CODE, extra_env={"NPUSIM_FUSION_BN_RELU": "0"}),
            child_result(CODE, extra_env={"NPUSIM_FUSION_BN_HALF_CASTS": "0"}))


def test_relu_and_its_gradient_fused(runs):
    on, off, _ = runs
    types_on, types_off = on["npu"]["types"], off["npu"]["types"]
    missing, extra = launch_multiset_diff(types_off, types_on)
    # The two fusible blocks' Relus; the first's ReluGrad; the second's ReluGrad, which rewrite 16
    # had taken with the gradient sum into one FusedElementwise, leaves that AddN on its own (as
    # in float32 graphs: 0b runs before 16).
    assert sorted(missing) == ["FusedElementwise", "Relu", "Relu", "ReluGrad"], (missing, extra)
    assert extra == ["AddN"], (missing, extra)
    # Left: the side-branch block's Relu and ReluGrad, the residual AddRelu's ReluGrad; the
    # residual add in the batch norm in both runs (rewrite 0c).
    assert types_on.count("Relu") == 1 and types_on.count("ReluGrad") == 2, types_on
    assert "AddRelu" not in types_on and "AddRelu" not in types_off
    kernels_on, kernels_off = on["npu"]["kernels"], off["npu"]["kernels"]
    assert kernels_on.count("BNTrainingUpdateRelu_f16") == 2, kernels_on
    assert kernels_on.count("BNTrainingReduceGradRelu_f16") == 2, kernels_on
    assert kernels_on.count("BNTrainingUpdateAddRelu_f16") == 2, kernels_on
    assert kernels_off.count("BNTrainingUpdateAddRelu_f16") == 2, kernels_off
    assert "BNTrainingUpdateRelu_f16" not in kernels_off, kernels_off


def test_same_training_bit_for_bit(runs):
    on, off, _ = runs
    assert on["npu"]["losses"] == off["npu"]["losses"]
    for path, w in off["npu"]["weights"].items():
        assert np.array_equal(np.array(on["npu"]["weights"][path]), np.array(w)), path


def test_tracks_the_cpu(runs):
    on, _, _ = runs
    np.testing.assert_allclose(on["npu"]["losses"], on["cpu"]["losses"], rtol=5e-3)


def test_against_the_casts_kept(runs):
    """Rewrites 0e, 0f, 0b and 0c together against the policy's Casts kept (rewrite 0e off, so
    neither 0f nor 0c sees a float16 batch norm): the same training, 23 Cast launches fewer (x, y,
    dy and dx of six batch norms, the projection block's two sharing dy's)."""
    on, _, kept = runs
    assert kept["npu"]["types"].count("Cast") - on["npu"]["types"].count("Cast") == 23
    assert on["npu"]["losses"] == kept["npu"]["losses"]
    for path, w in kept["npu"]["weights"].items():
        got, want = np.array(on["npu"]["weights"][path]), np.array(w)
        if "moving_" in path:  # the batch statistics: summed in another order (rewrite 0e's)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9, err_msg=path)
        else:
            assert np.array_equal(got, want), path
