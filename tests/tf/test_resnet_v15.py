"""models/resnet_v15.py: ResNet-50 v1.5 as MindSpore's model zoo trains it, and its Momentum.

- the architecture against the published facts it must have: 53 convolutions, none with a
  bias, the stride-2 convolution of each downsampling block being its 3x3 (v1.5), and
  25,559,081 trainable parameters at 1001 classes (torchvision's resnet50, the same v1.5
  network, has 25,557,032 at 1000 classes; one more class adds 2048 weights and 1 bias);
- the optimizer's update, step by step, against numpy's MindSpore Momentum with weight decay
  and a fixed loss scale (CPU);
- a few training steps on the NPU at 32x32: each loss tracks TensorFlow's CPU forward pass on
  the same weights (after the first update, the NPU's own), the convolutions run without any bias work, every batch norm goes through the
  training batch-norm fusion and every variable update through FusedVariableUpdate.
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import models  # noqa: E402  pylint: disable=wrong-import-position
from models import resnet_v15  # noqa: E402  pylint: disable=wrong-import-position

NAME = "resnet50_v15"


def test_architecture_is_v15_without_conv_bias(tf):
    with tf.device("/CPU:0"):
        model = models.build(NAME, 64, seed=0)
    convs = [l for l in model.layers if isinstance(l, keras.layers.Conv2D)]
    assert len(convs) == 53
    assert not any(c.use_bias for c in convs)
    strided = sorted(c.name for c in convs if c.strides != (1, 1))
    # The stem, and per downsampling stage the 3x3 and the shortcut's 1x1 (v1 strides the
    # first 1x1 instead).
    assert strided == sorted(["conv1_conv"] + [f"conv{s}_block1_{k}_conv" for s in (3, 4, 5)
                                               for k in (0, 2)])
    assert all(c.kernel_size == (3, 3) for c in convs if c.name.endswith("_2_conv"))
    bns = [l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)]
    assert len(bns) == 53 and all(b.epsilon == 1e-4 for b in bns)
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert trainable == 25_557_032 + 2048 + 1
    assert model.output_shape == (None, 1001)


def test_momentum_matches_mindspore_update(tf):
    """Two apply_gradients steps on a kernel (decayed) and a bias (not decayed) against numpy:
    g' = g / loss_scale (+ wd * w), a = momentum * a + g', w -= lr * a; scale_loss multiplies."""
    lr, momentum, wd, scale = 0.05, 0.9, 1e-2, 128.0
    rng = np.random.default_rng(1)
    w0 = {"kernel": rng.standard_normal((3, 4)).astype(np.float32),
          "bias": rng.standard_normal(4).astype(np.float32)}
    grads = [{k: (rng.standard_normal(v.shape) * scale).astype(np.float32)
              for k, v in w0.items()} for _ in range(2)]
    with tf.device("/CPU:0"):
        opt = resnet_v15.momentum_optimizer(lr, momentum, wd, scale)
        variables = {k: keras.Variable(v, name=k) for k, v in w0.items()}
        for g in grads:
            opt.apply_gradients([(tf.constant(g[k]), variables[k]) for k in w0])
        assert float(opt.scale_loss(tf.constant(2.0))) == 2.0 * scale
    for k, w in w0.items():
        w, a = w.astype(np.float64), np.zeros(w.shape)
        for g in grads:
            step = g[k] / scale + (wd * w if k == "kernel" else 0.0)
            a = momentum * a + step
            w = w - lr * a
        np.testing.assert_allclose(variables[k].numpy(), w, rtol=1e-5, atol=1e-6)


def _train(tf, device, x, y, steps):
    """`steps` training steps of a 10-class model at 32x32 on `device`, same seed on both.
    Returns the losses and, for each, the model's weights it was computed on (before that
    step's update).
    Loss scale 8, not the published 1024: on tiny batches at 32x32 the unscaled weight
    gradients reach ~1.3e3 (batch 4, seen on the CPU), which x1024 exceeds float16's 65,504,
    so the NPU's fp16 cube operands rightly overflow (NaN from the second step; MindSpore's
    fixed scale without an overflow check would do the same); the published run's batch 256
    divides the mean loss's gradients by 256. lr 1e-3: at the config's 0.1 the CPU's own loss
    grows at once on this batch."""
    with tf.device(device):
        model = models.build(NAME, 32, 10, seed=0)
        model.compile(optimizer=resnet_v15.momentum_optimizer(1e-3, loss_scale=8.0),
                      loss=models.loss(NAME), jit_compile=False)
        losses, weights = [], []
        for _ in range(steps):
            weights.append(model.get_weights())
            losses.append(float(model.train_on_batch(x, y)))
        return losses, weights


def _forward_loss(tf, device, weights, x, y):
    """The loss train_on_batch reports for `weights`, without the update: the training-mode
    forward pass (batch norms on the batch's statistics) and the model's loss."""
    with tf.device(device):
        model = models.build(NAME, 32, 10, seed=0)
        model.set_weights(weights)
        return float(models.loss(NAME)(y, model(x, training=True)))


def test_trains_on_npu_tracking_cpu_without_bias_work(npusim, tf):
    """Three steps, batch 16. Each NPU loss is a forward pass, and a forward pass agrees with
    TensorFlow's CPU on the same weights within the deep-model forward bound of
    tests/tf/test_models.py (5e-2 relative); the updates between them do not give the same
    weights on both devices, so each loss is compared with the CPU's forward loss on the
    weights the NPU computed it on: the initial ones for the first, after the NPU's own
    updates for the others.
    Not with the CPU's own later losses: the NPU's first update is not the CPU's (its gradients come
    from fp16 cube operands: cosine of the first step's weight change against the CPU's 1.0
    for the classifier's bias, 0.995 for its kernel, 0.97 in the last block, 0.77 at the stem,
    seen), and the loss after it moves by more than the forward bound when the inputs move by
    about one f32 ulp, through those fp16 roundings; the channel sums' summation order is such
    a change (docs/compiler.md, "Channels first for every launch"). Seen (2026-12-05), x as
    given / scaled by 1 + 1e-7 / by 1 - 1e-7: NPU losses 2.393, 2.440, 2.138 / 2.389, 2.241,
    1.984 / 2.394, 2.270, 2.202, the second +2.1 / -6.2 / -5.0 % off the CPU's second loss
    (2.389); each loss within 0.6 % of the CPU's on the NPU's weights (at most 0.40 / 0.58 /
    0.49 %). And the CPU's own third loss is not reproducible: this step is chaotic enough
    that TensorFlow's CPU does not reproduce it from one process to the next (seen with
    TF_ENABLE_ONEDNN_OPTS=0: 2.124 and 1.963 after identical first two losses).
    Falling losses: all three on the CPU (its first update takes the loss down by 0.6 %, its
    two by 18 %), on the NPU the third below the first (one update's 0.6 % is within the
    spread above). Batch 16, not 4: at 32x32 the last stage's maps are 1x1, so its training
    batch norms normalise over `batch` values per channel; over 4 (statistics of 4 values) the
    losses after an update differed by up to 28 % (seen) while the first, the forward pass,
    agreed within 3.2e-2."""
    x, y = models.synthetic_data(NAME, 16, 32, 10, seed=4)
    loss_cpu, cpu_weights = _train(tf, "/CPU:0", x, y, 3)
    npusim.clear_launch_records()
    loss_npu, npu_weights = _train(tf, "/NPU:0", x, y, 3)
    records = npusim.launch_records()
    # _forward_loss is the loss train_on_batch reports: on the CPU's own weights after its
    # first update it gives the CPU's second loss (one device, the same computation).
    np.testing.assert_allclose(_forward_loss(tf, "/CPU:0", cpu_weights[1], x, y), loss_cpu[1],
                               rtol=1e-4)
    cpu_on_npu_weights = [_forward_loss(tf, "/CPU:0", w, x, y) for w in npu_weights]
    print(f"\nresnet50_v15 32x32: loss NPU {loss_npu}\n                   loss CPU {loss_cpu}"
          f"\n  CPU on the NPU's weights: {cpu_on_npu_weights}")
    assert all(r["ok"] for r in records)
    assert all(np.isfinite(loss_npu))
    np.testing.assert_allclose(loss_npu, cpu_on_npu_weights, rtol=5e-2)
    assert loss_cpu[0] > loss_cpu[1] > loss_cpu[2], loss_cpu
    assert loss_npu[0] > loss_npu[2], loss_npu
    types = {}
    for r in records:
        types.setdefault(r["op_type"], set()).add(r["op_name"])
    # No convolution with a bias, and the only bias gradient is the classifier's.
    assert not [t for t in types if "Conv" in t and "Bias" in t], sorted(types)
    assert all("predictions" in n for n in types.get("BiasAddGrad", ())), types["BiasAddGrad"]
    # Every batch norm trained through the fused kernels (graph_fusion.h rewrite 0): none of
    # its unfused ops (tf.nn.moments' SquaredDifference, the gradient's Neg) remains.
    assert "BNTrainingUpdate" in types and "BNTrainingReduceGrad" in types
    assert "SquaredDifference" not in types and "Neg" not in types, sorted(types)
    # The optimizer's updates: all FusedVariableUpdate launches, nothing else in its scope.
    assert "FusedVariableUpdate" in types
    assert not [r["op_name"] for r in records if r["op_name"].startswith("momentum/")
                and r["op_type"] != "FusedVariableUpdate"]
