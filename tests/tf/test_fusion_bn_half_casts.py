"""Keras mixed_float16's casts around the training batch norm folded away (adapter/tf/plugin/
graph_fusion.h, rewrite 0e): under the policy Keras casts a float16 x to float32 for the batch
norm and y back (and the gradient likewise); the batch norm's four CANN ops then read x and dy
in float16 and write y and dx in float16, the statistics float32, without the Casts.

A small CNN (two Conv2D + BatchNormalization + ReLU, the second with a bias and axis 3, a Dense
head in float32) under `mixed_float16`, SGD with momentum, three steps, against
NPUSIM_FUSION_BN_HALF_CASTS=0 in a child process and TF on the CPU:
- the losses equal the rewrite-off run's, and every trainable weight too except the second
  convolution's bias, whose gradient is mathematically zero (a batch norm follows it: only
  rounding noise of about 1e-6, summed in another order, moves it); the moving statistics
  within 1e-6 (the float16 batch norm's statistics sum the same values in another order: the
  convolution's kernel sums its own output, Conv2DBNTrainingReduce, once the Cast between them
  is gone);
- 8 Cast launches fewer per step (x, y, dy and dx of both batch norms) and the BNTraining* ops
  still there;
- the losses track the CPU's.
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import child_result  # noqa: E402  pylint: disable=wrong-import-position

CODE = r'''
import json
import numpy as np
import npusim
import tensorflow as tf
import keras

keras.mixed_precision.set_global_policy("mixed_float16")


def train(device):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8, 8, 3)).astype(np.float32)
    y = np.arange(4).astype(np.int32) % 3
    with tf.device(device):
        inp = keras.Input((8, 8, 3))
        h = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inp)
        h = keras.layers.BatchNormalization()(h)
        h = keras.layers.ReLU()(h)
        h = keras.layers.Conv2D(16, 3, padding="same")(h)
        h = keras.layers.BatchNormalization(axis=3)(h)
        h = keras.layers.ReLU()(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
        out = keras.layers.Dense(3, dtype="float32")(h)
        model = keras.Model(inp, out)
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=False)
        losses = []
        for _ in range(3):
            npusim.clear_launch_records()
            losses.append(float(model.train_on_batch(x, y)))
        types = [r["op_type"] for r in npusim.launch_records()]
        return {"losses": losses, "types": types,
                "weights": {v.path: v.numpy().astype(np.float64).tolist()
                            for v in model.variables}}


print("RESULT " + json.dumps({"npu": train("/NPU:0"), "cpu": train("/CPU:0")}))
'''


@pytest.fixture(scope="module")
def runs():
    return child_result(CODE), child_result(CODE, extra_env={"NPUSIM_FUSION_BN_HALF_CASTS": "0"})


def test_batch_norm_casts_folded_same_training(runs):
    on, off = runs
    assert on["npu"]["losses"] == off["npu"]["losses"]
    for path, w in off["npu"]["weights"].items():
        got, want = np.array(on["npu"]["weights"][path]), np.array(w)
        if path.endswith("conv2d_1/bias"):  # zero gradient: rounding noise only
            np.testing.assert_allclose(got, want, atol=1e-5, err_msg=path)
        elif "moving_" in path:  # the batch statistics, summed in another order
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9, err_msg=path)
        else:
            assert np.array_equal(got, want), path
    types_on, types_off = on["npu"]["types"], off["npu"]["types"]
    assert types_off.count("Cast") - types_on.count("Cast") == 8, (types_on, types_off)
    for op in ("BNTrainingUpdate", "BNTrainingUpdateGrad", "BNTrainingReduceGrad"):
        assert op in types_on, types_on


def test_batch_norm_casts_folded_track_the_cpu(runs):
    on, _ = runs
    np.testing.assert_allclose(on["npu"]["losses"], on["cpu"]["losses"], rtol=5e-3)
