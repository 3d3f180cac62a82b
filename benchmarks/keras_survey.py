"""Unmodified Keras models on the NPU beyond the validated ones: builds one model with random
weights, runs (infer) `predict_on_batch` at batch 2 or (train) `train_on_batch` with Adam at
batch 2, a warm-up call and one measured call, and prints one JSON line: result (ok, or the
exception's type and first lines), the ops that fell back to the CPU (npusim.cpu_fallback_ops()),
the host wall of the measured call, and the measured call's NPU launches, summed kernel cycles
and device timeline (first launch's host dispatch to last launch's end) in cycles and us.

With CPU_CHECK=1 (functional runs only) the same model, its weights copied, also runs on the CPU
and the line gives the largest difference of the outputs (infer) or of the first step's losses
and each weight's update in it (train; OPTIMIZER=sgd makes the update the gradient's multiple),
relative to the CPU's largest magnitude (a model with dropout draws other masks on each device,
so its training figures differ by more than rounding).

A crash of the process shows as no JSON line: run each model in a process of its own, e.g.

  NPUSIM_FUNCTIONAL=0 .venv/bin/python benchmarks/keras_survey.py efficientnetb0 train

Models: see MODELS below (keras.applications at small input sizes, an LSTM and a GRU text
classifier, a small ViT, a Conv1D classifier, a small U-Net with dropout and transposed
convolutions, RegNetX002 with its grouped convolutions, MobileNetV2, ResNet50V2, a masked
Transformer text classifier, a masked Bidirectional LSTM, a CNN behind Keras' augmentation
layers). Chip: $CHIP (default 910b).
"""
import json, os, sys, time, traceback

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import npusim  # pylint: disable=wrong-import-position

npusim.configure(chip=os.environ.get("CHIP", "910b"))
import tensorflow as tf  # pylint: disable=wrong-import-position
import keras  # pylint: disable=wrong-import-position
from keras import layers  # pylint: disable=wrong-import-position

BATCH = int(os.environ.get("BATCH", "2"))
# DROPOUT=0 builds the Conv1D, U-Net and MobileNetV3Small models with dropout rates 0 (for CPU_CHECK: each device
# draws other masks).
DROPOUT = float(os.environ.get("DROPOUT", "1"))
CLASSES = 10


def _application(constructor, size, **kw):
    """A keras.applications model on size x size x 3 images (SIZE overrides) with a CLASSES-way
    classifier."""
    size = int(os.environ.get("SIZE", size))

    def build():
        return getattr(keras.applications, constructor)(
            weights=None, input_shape=(size, size, 3), classes=CLASSES, **kw)
    return build, (size, size, 3), "float32"


def _vgg16_headed():
    """VGG16's convolutions (include_top=False: its top needs 224x224) and a Dense head."""
    def build():
        base = keras.applications.VGG16(weights=None, include_top=False,
                                        input_shape=(32, 32, 3))
        x = layers.Flatten()(base.output)
        x = layers.Dense(64, activation="relu")(x)
        return keras.Model(base.input, layers.Dense(CLASSES, activation="softmax")(x))
    return build, (32, 32, 3), "float32"


def _text_rnn(cell):
    """Embedding (vocabulary 1000, 32 wide) + LSTM or GRU (64) + Dense, sequences of 40 ids."""
    def build():
        inp = keras.Input((40,), dtype="int32")
        x = layers.Embedding(1000, 32)(inp)
        x = cell(64)(x)
        return keras.Model(inp, layers.Dense(CLASSES, activation="softmax")(x))
    return build, (40,), "int32"


class _LearnedPositions(layers.Layer):
    """Adds a learned [tokens, width] position table to [batch, tokens, width] tokens."""

    def build(self, input_shape):
        self.table = self.add_weight(shape=tuple(input_shape[1:]), initializer="random_normal")

    def call(self, tokens):
        return tokens + self.table


def _vit():
    """A small ViT: 32x32 images, 4x4 patches (a strided Conv2D), 64 wide, 2 encoder blocks of
    MultiHeadAttention (4 heads) and a GELU MLP with LayerNormalization, learned positions."""
    def build():
        inp = keras.Input((32, 32, 3))
        x = layers.Conv2D(64, 4, strides=4)(inp)
        x = layers.Reshape((64, 64))(x)
        x = _LearnedPositions()(x)
        for _ in range(2):
            h = layers.LayerNormalization(epsilon=1e-6)(x)
            x = x + layers.MultiHeadAttention(num_heads=4, key_dim=16)(h, h)
            h = layers.LayerNormalization(epsilon=1e-6)(x)
            h = layers.Dense(128, activation="gelu")(h)
            x = x + layers.Dense(64)(h)
        x = layers.LayerNormalization(epsilon=1e-6)(x)
        x = layers.GlobalAveragePooling1D()(x)
        return keras.Model(inp, layers.Dense(CLASSES, activation="softmax")(x))
    return build, (32, 32, 3), "float32"


def _conv1d():
    """Conv1D classifier of 128-step, 8-channel sequences: Conv1D, MaxPooling1D, BatchNorm,
    Conv1D with dilation, GlobalMaxPooling1D, Dropout, Dense."""
    def build():
        inp = keras.Input((128, 8))
        x = layers.Conv1D(32, 5, padding="same", activation="relu")(inp)
        x = layers.MaxPooling1D(2)(x)
        x = layers.BatchNormalization()(x)
        x = layers.Conv1D(64, 3, dilation_rate=2, padding="same", activation="relu")(x)
        x = layers.GlobalMaxPooling1D()(x)
        x = layers.Dropout(0.3 * DROPOUT)(x)
        return keras.Model(inp, layers.Dense(CLASSES, activation="softmax")(x))
    return build, (128, 8), "float32"


def _regnetx002():
    """RegNetX-200MF (RegNetX002) on 32x32x3 (SIZE overrides), as tf.keras 2.x's keras.applications.RegNetX002
    builds it (Keras 3 dropped the RegNets): a 3x3 stride-2 stem of 32 channels, then stages of
    depths 1, 1, 4, 7 and widths 24, 56, 152, 368 of X blocks (1x1 conv, 3x3 grouped conv of
    group width 8 with the stage's stride 2 in its first block, 1x1 conv, each with batch norm;
    a 1x1 stride-2 projection on the skip where the shape changes; add, ReLU), global average
    pooling and a Dense head. Its 13 grouped layers have 3 to 46 groups of 8 channels."""
    def bn_relu(x, relu=True):
        x = layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)
        return layers.ReLU()(x) if relu else x

    def x_block(x, width, stride):
        skip = x
        if stride != 1 or x.shape[-1] != width:
            skip = bn_relu(layers.Conv2D(width, 1, strides=stride, use_bias=False)(x), False)
        y = bn_relu(layers.Conv2D(width, 1, use_bias=False)(x))
        y = bn_relu(layers.Conv2D(width, 3, strides=stride, padding="same", groups=width // 8,
                                  use_bias=False)(y))
        y = bn_relu(layers.Conv2D(width, 1, use_bias=False)(y), False)
        return layers.ReLU()(layers.Add()([y, skip]))

    size = int(os.environ.get("SIZE", 32))

    def build():
        inp = keras.Input((size, size, 3))
        x = bn_relu(layers.Conv2D(32, 3, strides=2, padding="same", use_bias=False)(inp))
        for depth, width in zip((1, 1, 4, 7), (24, 56, 152, 368)):
            for i in range(depth):
                x = x_block(x, width, 2 if i == 0 else 1)
        x = layers.GlobalAveragePooling2D()(x)
        return keras.Model(inp, layers.Dense(CLASSES, activation="softmax")(x))
    return build, (size, size, 3), "float32"


def _unet():
    """A small U-Net on 32x32x3: two down levels (Conv2D, SpatialDropout2D, MaxPooling2D), up by
    Conv2DTranspose and by UpSampling2D with skip concatenations, Dropout, a 1x1 softmax head."""
    def build():
        inp = keras.Input((32, 32, 3))
        c1 = layers.Conv2D(16, 3, padding="same", activation="relu")(inp)
        c1 = layers.SpatialDropout2D(0.1 * DROPOUT)(c1)
        p1 = layers.MaxPooling2D()(c1)
        c2 = layers.Conv2D(32, 3, padding="same", activation="relu")(p1)
        p2 = layers.MaxPooling2D()(c2)
        b = layers.Conv2D(64, 3, padding="same", activation="relu")(p2)
        b = layers.Dropout(0.2 * DROPOUT)(b)
        u2 = layers.Conv2DTranspose(32, 2, strides=2, padding="same")(b)
        c3 = layers.Conv2D(32, 3, padding="same", activation="relu")(
            layers.Concatenate()([u2, c2]))
        u1 = layers.UpSampling2D()(c3)
        c4 = layers.Conv2D(16, 3, padding="same", activation="relu")(
            layers.Concatenate()([u1, c1]))
        return keras.Model(inp, layers.Conv2D(CLASSES, 1, activation="softmax")(c4))
    return build, (32, 32, 3), "float32"


def _text_transformer():
    """A BERT-like text classifier: Embedding (vocabulary 1000, 64 wide, mask_zero: id 0 pads,
    the last 8 of each 40-id sequence), learned positions, 2 encoder blocks of
    MultiHeadAttention (4 heads of 16) under the padding mask Keras derives from the Embedding,
    a GELU MLP with LayerNormalization, masked GlobalAveragePooling1D, Dense."""
    def build():
        inp = keras.Input((40,), dtype="int32")
        x = layers.Embedding(1000, 64, mask_zero=True)(inp)
        x = _LearnedPositions()(x)
        for _ in range(2):
            x = layers.LayerNormalization(epsilon=1e-6)(
                x + layers.MultiHeadAttention(num_heads=4, key_dim=16)(x, x))
            h = layers.Dense(128, activation="gelu")(x)
            x = layers.LayerNormalization(epsilon=1e-6)(x + layers.Dense(64)(h))
        x = layers.GlobalAveragePooling1D()(x)
        return keras.Model(inp, layers.Dense(CLASSES, activation="softmax")(x))
    return build, (40,), "int32"


def _bilstm():
    """Embedding (vocabulary 1000, 32 wide, mask_zero: the last 8 of 40 ids pad) + a
    Bidirectional LSTM(32) returning sequences + LSTM(32) + Dense: masked, stacked recurrences."""
    def build():
        inp = keras.Input((40,), dtype="int32")
        x = layers.Embedding(1000, 32, mask_zero=True)(inp)
        x = layers.Bidirectional(layers.LSTM(32, return_sequences=True))(x)
        x = layers.LSTM(32)(x)
        return keras.Model(inp, layers.Dense(CLASSES, activation="softmax")(x))
    return build, (40,), "int32"


def _augmented_cnn():
    """The Keras image-classification tutorial's shape on 32x32x3: Rescaling, RandomFlip,
    RandomRotation and RandomZoom (active in training only), Conv2D / MaxPooling2D blocks with
    LeakyReLU and ELU, AveragePooling2D, Flatten, Dropout, Dense."""
    def build():
        inp = keras.Input((32, 32, 3))
        x = layers.Rescaling(1.0 / 4)(inp)
        x = layers.RandomFlip("horizontal", seed=1)(x)
        x = layers.RandomRotation(0.1, seed=2)(x)
        x = layers.RandomZoom(0.1, seed=3)(x)
        x = layers.Conv2D(16, 3, padding="same")(x)
        x = layers.LeakyReLU(0.1)(x)
        x = layers.MaxPooling2D()(x)
        x = layers.Conv2D(32, 3, padding="same", activation="elu")(x)
        x = layers.AveragePooling2D(2)(x)
        x = layers.Flatten()(x)
        x = layers.Dropout(0.5 * DROPOUT)(x)
        return keras.Model(inp, layers.Dense(CLASSES, activation="softmax")(x))
    return build, (32, 32, 3), "float32"


MODELS = {
    "mobilenetv3small": lambda: _application("MobileNetV3Small", 32, dropout_rate=0.2 * DROPOUT),
    "efficientnetb0": lambda: _application("EfficientNetB0", 32),
    "densenet121": lambda: _application("DenseNet121", 32),
    "inceptionv3": lambda: _application("InceptionV3", 75),
    "vgg16": _vgg16_headed,
    "xception": lambda: _application("Xception", 71),
    "nasnetmobile": lambda: _application("NASNetMobile", 32),
    "convnexttiny": lambda: _application("ConvNeXtTiny", 32),
    "regnetx002": _regnetx002,
    "lstm": lambda: _text_rnn(layers.LSTM),
    "gru": lambda: _text_rnn(layers.GRU),
    "vit": _vit,
    "conv1d": _conv1d,
    "unet": _unet,
    "mobilenetv2": lambda: _application("MobileNetV2", 32),
    "resnet50v2": lambda: _application("ResNet50V2", 32),
    "text_transformer": _text_transformer,
    "bilstm": _bilstm,
    "augmented_cnn": _augmented_cnn,
}


def _data(shape, dtype, out_shape):
    rng = np.random.default_rng(0)
    if dtype == "int32":
        # Ids 1..999, the last 8 of each sequence 0: padding where an Embedding has mask_zero.
        x = rng.integers(1, 1000, (BATCH,) + shape).astype(np.int32)
        x[..., -8:] = 0
    else:
        x = rng.standard_normal((BATCH,) + shape).astype(np.float32)
    y = rng.integers(0, CLASSES, (BATCH,) + tuple(out_shape[1:-1])).astype(np.int32)
    return x, y


def _compile(model):
    # SGD for comparisons with the CPU: Adam's first step moves every weight by about its
    # learning rate times the gradient's sign, which rounding flips where a gradient is ~0.
    optimizer = (keras.optimizers.SGD(0.1) if os.environ.get("OPTIMIZER") == "sgd"
                 else keras.optimizers.Adam(1e-3))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")


def _launch_figures(records):
    if not records:
        return {"launches": 0}
    us_per_cycle = sum(r["time_us"] for r in records) / max(1, sum(r["cycles"] for r in records))
    span = (max(r["start_cycle"] + r["cycles"] for r in records)
            - min(r["start_cycle"] - r["host_dispatch_cycles"] for r in records))
    failed = sorted({r["op_type"] for r in records if not r.get("ok", True)})
    # A task list: the launches of one graph run, or of one op dispatched on its own.
    task_lists = len({("graph", r["graph_run"]) if r["graph_run"] else ("op", r["dispatch"])
                      for r in records})
    return {"launches": len(records), "task_lists": task_lists,
            "kernel_cycles": sum(r["cycles"] for r in records),
            "timeline_cycles": span, "timeline_us": round(span * us_per_cycle, 1),
            "failed_launch_ops": failed}


def main():
    name, mode = sys.argv[1], sys.argv[2]
    if name not in MODELS or mode not in ("infer", "train"):
        sys.exit(f"usage: keras_survey.py {{{','.join(MODELS)}}} {{infer,train}}")
    build, shape, dtype = MODELS[name]()
    out = {"model": name, "mode": mode, "batch": BATCH,
           "functional": os.environ.get("NPUSIM_FUNCTIONAL", "1") != "0"}
    t_start = time.perf_counter()
    if os.environ.get("KERAS_POLICY"):  # e.g. mixed_float16: Keras' own mixed precision
        keras.mixed_precision.set_global_policy(os.environ["KERAS_POLICY"])
        out["keras_policy"] = os.environ["KERAS_POLICY"]
    try:
        keras.utils.set_random_seed(0)
        model = build()
        x, y = _data(shape, dtype, model.output_shape)
        initial_weights = [np.asarray(w) for w in model.get_weights()]
        if mode == "train":
            _compile(model)
            run = lambda: model.train_on_batch(x, y)  # noqa: E731
        else:
            run = lambda: model.predict_on_batch(x)  # noqa: E731
        first = run()
        after_first = [np.asarray(w) for w in model.get_weights()] if mode == "train" else None
        npusim.clear_launch_records()
        t0 = time.perf_counter()
        result = run()
        out["wall_s"] = round(time.perf_counter() - t0, 2)
        out["warmup_wall_s"] = round(t0 - t_start, 2)
        out.update(_launch_figures(npusim.launch_records()))
        out["result"] = "ok"
        if os.environ.get("CPU_CHECK") == "1" and out["functional"]:
            with tf.device("/CPU:0"):
                cpu_model = build()
                cpu_model.set_weights(initial_weights)
                if mode == "train":
                    # The first step's loss, both from the same initial weights.
                    _compile(cpu_model)
                    want, got = np.asarray(cpu_model.train_on_batch(x, y)), np.asarray(first)
                    # And the weights after that step: the largest difference, relative to the
                    # CPU's largest update of any weight (a weight whose gradient is ~0, as an
                    # attention key's bias, has updates of rounding noise on both devices).
                    after_cpu = cpu_model.get_weights()
                    scale = max(float(np.max(np.abs(b - w0)))
                                for w0, b in zip(initial_weights, after_cpu) if b.size)
                    diffs = [(float(np.max(np.abs(a - b))) / max(scale, 1e-30), v.path)
                             for v, a, b in zip(model.weights, after_first, after_cpu) if b.size]
                    out["cpu_update_max_rel_diff"], out["cpu_update_worst_weight"] = max(diffs)
                else:
                    want, got = np.asarray(cpu_model.predict_on_batch(x)), np.asarray(result)
            scale = max(float(np.max(np.abs(want))), 1e-30)
            out["cpu_max_rel_diff"] = float(np.max(np.abs(got - want))) / scale
    except Exception as e:  # pylint: disable=broad-except  (the survey records any failure)
        out["result"] = "error"
        out["error"] = f"{type(e).__name__}: " + " | ".join(str(e).strip().splitlines()[:6])[:600]
        out["traceback_tail"] = traceback.format_exc().splitlines()[-3:]
    out["cpu_fallback_ops"] = npusim.cpu_fallback_ops()
    out["total_wall_s"] = round(time.perf_counter() - t_start, 2)
    print("SURVEY " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
