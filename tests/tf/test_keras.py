"""Keras 3 with the NPU present: jit_compile="auto" stays off XLA (which cannot compile for the
NPU), and a Dense layer's inference (model.predict, a tf.function) runs its MatMul on the chip.
Keras 3.15's Dense adds its bias with BiasAdd, which also has an NPU kernel (see
test_kernels_nn.py)."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


def _dense_model():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_auto_jit_compile_resolves_to_false(npusim, tf):  # pylint: disable=unused-argument
    assert [d.device_type for d in tf.config.list_physical_devices("NPU")] == ["NPU"]
    model = _dense_model()
    assert model.jit_compile is False


def test_dense_inference_runs_on_the_npu(npusim, tf):
    model = _dense_model()
    kernel, bias = (w.astype(np.float32) for w in model.get_weights())
    # Small integers and halves: exact in fp16 (MatMul casts fp32 inputs to fp16 on the cube in
    # the default precision mode) and in every accumulation order.
    x = np.random.default_rng(3).integers(-3, 4, size=(16, 8)).astype(np.float32)
    kernel = np.round(kernel * 4) / 4
    bias = np.round(bias * 4 + 1) / 4
    model.set_weights([kernel, bias])
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        y = model.predict(x, verbose=0)
    np.testing.assert_array_equal(y, x @ kernel + bias)
    kernels = {r["kernel"].split("_")[0] for r in npusim.launch_records()}
    assert "MatMul" in kernels, kernels


@pytest.mark.parametrize("rank,filters,groups,strides,dilation,depthwise", [
    (2, 16, 8, 1, 1, True),   # ConvNeXt's depthwise Conv2D (groups = channels), multiplier 2
    (2, 8, 8, 2, 1, True),    # strided, multiplier 1
    (2, 8, 2, 1, 1, False),   # two groups of four channels: one grouped Conv2D
    (1, 8, 4, 1, 1, False),   # Conv1D, four groups
    (2, 8, 1, 1, 2, False),   # dilated Conv2D (no groups)
    (1, 8, 1, 1, 3, False),   # dilated Conv1D (a WaveNet / TCN layer)
    (2, 8, 2, 1, 2, False),   # dilated and grouped
])
def test_grouped_and_dilated_convolutions_run_on_the_npu(npusim, tf, rank, filters, groups,
                                                         strides, dilation, depthwise):
    """Keras runs grouped convolutions as a jit_compile=True function, which cannot run on the
    NPU, and tf.nn.convolution wraps dilated ones in SpaceToBatchND / BatchToSpaceND, which ran
    on the CPU; npusim's patch computes both on the NPU. Forward and gradients against Keras'
    own path on the CPU (XLA for the grouped ones), on small integers and quarters (exact in
    fp16, which the default precision mode casts the cube's fp32 operands to)."""
    rng = np.random.default_rng(rank * 100 + groups)
    shape = (2,) + (9,) * rank + (8,)

    def make():
        conv = (keras.layers.Conv1D if rank == 1 else keras.layers.Conv2D)(
            filters, 3, strides=strides, padding="same", groups=groups, dilation_rate=dilation)
        conv.build(shape)
        return conv

    npu_conv = make()
    kernel = np.round(rng.uniform(-2, 2, npu_conv.kernel.shape) * 4) / 4
    npu_conv.set_weights([kernel.astype(np.float32), np.zeros(filters, np.float32)])
    # The reference: Keras' own conv (XLA for the grouped ones) on a layer whose variables are
    # on the CPU (XLA on the CPU cannot read an NPU variable).
    with tf.device("/CPU:0"):
        cpu_conv = make()
    cpu_conv.set_weights(npu_conv.get_weights())
    x = rng.integers(-3, 4, shape).astype(np.float32)

    def forward_and_gradients(conv, t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            y = conv(t)
            signs = tf.cast(tf.range(tf.size(y)) % 3 - 1, y.dtype)  # -1, 0, 1
            loss = tf.reduce_sum(y * tf.reshape(signs, tf.shape(y)))
        return [y] + tape.gradient(loss, [t, conv.kernel])

    npusim.clear_launch_records()
    npusim.clear_cpu_fallback_ops()
    with tf.device("/NPU:0"):
        got = [v.numpy() for v in
               tf.function(lambda t: forward_and_gradients(npu_conv, t))(tf.constant(x))]
    kernels = {r["kernel"].split("_")[0] for r in npusim.launch_records()}
    assert npusim.cpu_fallback_ops() == {}
    with tf.device("/CPU:0"):
        want = [v.numpy() for v in
                tf.function(lambda t: forward_and_gradients(cpu_conv, t))(tf.constant(x))]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    if depthwise:
        assert any(k.startswith("DepthwiseConv2dNative") for k in kernels), kernels
    else:
        assert any(k.startswith("Conv2D") for k in kernels), kernels


def test_embedding_with_plain_sgd_trains_on_the_npu(npusim, tf):
    """Plain SGD applies an Embedding's sparse gradient with scatter_sub (ResourceScatterSub, no
    NPU kernel: the step failed to place); npusim's patch applies it densified on the chip.
    The weights after two steps against the same model trained on the CPU; ids repeat within
    and across rows (a scatter's repeated indices add up)."""
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 12, (4, 6)).astype(np.int32)
    labels = rng.integers(0, 3, (4,)).astype(np.int32)

    def build():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((6,), dtype="int32"),
                                  keras.layers.Embedding(16, 8),
                                  keras.layers.GlobalAveragePooling1D(),
                                  keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.SGD(0.5),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    npusim.clear_cpu_fallback_ops()
    model = build()
    start = model.get_weights()
    assert "NPU" in model.layers[0].embeddings.value.device
    for _ in range(2):
        model.train_on_batch(ids, labels)
    assert npusim.cpu_fallback_ops() == {}
    with tf.device("/CPU:0"):
        reference = build()
        reference.set_weights(start)
        for _ in range(2):
            reference.train_on_batch(ids, labels)
    got, want = model.get_weights(), reference.get_weights()
    assert not np.array_equal(want[0], start[0])  # the embedding moved
    assert np.array_equal(want[0][12:], start[0][12:])  # rows no id picks stay
    for g, w in zip(got, want):
        # The Dense MatMul's operands are fp16 on the cube in the default precision mode.
        np.testing.assert_allclose(g, w, rtol=0, atol=2e-3 * np.max(np.abs(w)))



@pytest.mark.parametrize("one_launch", [True, False], ids=["grouped", "per_group"])
def test_grouped_conv2d_trains_with_one_launch_per_layer(npusim, tf, monkeypatch, one_launch):
    """Keras' Conv2D(groups=4) (ResNeXt / RegNet's grouped layers) on the NPU is one Conv2D per
    layer, and its gradients one Conv2DBackpropInput and one Conv2DBackpropFilter: one cube
    launch each for all four groups (a convolution per group would be four). The forward and
    the weights after one SGD step against the same model on the CPU, whose reference computes
    each group on its own (tf.split of the input and kernel, Conv2D, tf.concat).
    NPUSIM_FUSION_GROUPED_CONV=0 keeps the per-group form: the same results, four launches
    for each."""
    if not one_launch:
        monkeypatch.setenv("NPUSIM_FUSION_GROUPED_CONV", "0")
    rng = np.random.default_rng(11)
    x = rng.integers(-3, 4, (2, 8, 8, 16)).astype(np.float32)
    labels = rng.integers(0, 3, (2,)).astype(np.int32)

    def build():
        keras.utils.set_random_seed(2)
        model = keras.Sequential([
            keras.Input((8, 8, 16)),
            keras.layers.Conv2D(16, 3, padding="same", groups=4, activation="relu"),  # 4 -> 4
            keras.layers.Conv2D(8, 3, strides=2, padding="valid", groups=4),         # 4 -> 2
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.SGD(0.05),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    model = build()
    # Quarters: exact in fp16, the cube's operand type in the default precision mode.
    start = [np.round(w * 8) / 8 for w in model.get_weights()]
    model.set_weights(start)

    def grouped_conv(t, kernel, bias, strides, padding):  # the CPU's per-group reference
        groups = t.shape[-1] // kernel.shape[-2]
        ys = [tf.nn.conv2d(a, k, strides, padding)
              for a, k in zip(tf.split(t, groups, axis=-1), tf.split(kernel, groups, axis=-1))]
        return tf.concat(ys, axis=-1) + bias

    def reference_forward(weights, t):
        k1, b1, k2, b2, kd, bd = weights
        h = tf.nn.relu(grouped_conv(t, k1, b1, 1, "SAME"))
        h = grouped_conv(h, k2, b2, 2, "VALID")
        return tf.reduce_mean(h, axis=[1, 2]) @ kd + bd

    npusim.clear_cpu_fallback_ops()
    with tf.device("/NPU:0"):
        got_y = model.predict(x, verbose=0)
    with tf.device("/CPU:0"):
        weights = [tf.Variable(w) for w in start]
        want_y = reference_forward(weights, tf.constant(x))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels, reference_forward(weights, tf.constant(x))))
        want = [w - 0.05 * g for w, g in zip(start, tape.gradient(loss, weights))]
    np.testing.assert_allclose(got_y, want_y.numpy(), rtol=0,
                               atol=2e-3 * np.max(np.abs(want_y.numpy())))

    npusim.clear_launch_records()
    model.train_on_batch(x, labels)
    kernels = [r["kernel"] for r in npusim.launch_records()]
    assert npusim.cpu_fallback_ops() == {}
    # Two layers forward, the second's input gradient (the first's input is the data), both
    # filter gradients: one cube launch each (per group: four).
    per = 1 if one_launch else 4
    assert len([k for k in kernels if k.startswith("Conv2D_")]) == 2 * per, kernels
    assert len([k for k in kernels if k.startswith("Conv2DBackpropInput")]) == per, kernels
    assert len([k for k in kernels if k.startswith("FilterGrad")]) == 2 * per, kernels
    for g, w, s in zip(model.get_weights(), want, start):
        # The cube's operands are fp16 in the default precision mode: compare the updates.
        np.testing.assert_allclose(g - s, w - s, rtol=0, atol=2e-2 * np.max(np.abs(w - s)))
