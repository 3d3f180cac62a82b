"""Model registry of the TensorFlow adapter's demos, tests and benchmarks.

    import models
    model = models.build("cnn")                       # a keras.Model, not compiled
    x, y = models.synthetic_data("cnn", batch=8)      # deterministic numpy inputs and labels
    model.compile(optimizer="adam", loss=models.loss("cnn"))

Every model takes `input_size` (one integer: the image side of the image models, the feature
count of the MLP, the sequence length of the sequence models) and `classes` where it has a
classifier. Nothing is downloaded: keras.applications models are built with weights=None.
Building does not choose a device: build under `tf.device("/NPU:0")` to put the weights there.
"""

import numpy as np

from . import applications, bert, cnn, llm, lstm_attention, mlp, resnet_v15, transformer
from ._common import ModelSpec


REGISTRY = {spec.name: spec for spec in (mlp.SPEC, cnn.SPEC, applications.RESNET50_SPEC,
                                         resnet_v15.SPEC, applications.MOBILENETV2_SPEC,
                                         lstm_attention.SPEC, transformer.SPEC, *llm.SPECS,
                                         *bert.SPECS)}


def names():
    return list(REGISTRY)


def spec(name):
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model '{name}'; known: {', '.join(REGISTRY)}") from None


def input_shape(name, input_size=None):
    """The model's input shape without the batch dimension (default input_size if None)."""
    s = spec(name)
    return tuple(s.input_shape(input_size or s.default_input_size))


def build(name, input_size=None, classes=None, seed=None, **kw):
    """A new keras.Model `name`. seed: keras.utils.set_random_seed(seed) first, so two builds
    with the same seed have the same initial weights. Other keywords go to the model; every
    model takes output_activation (default "softmax", lstm_attention "sigmoid"; None gives the
    logits)."""
    s = spec(name)
    if seed is not None:
        import keras  # pylint: disable=import-outside-toplevel

        keras.utils.set_random_seed(seed)
    if classes is not None and s.default_classes is None:
        raise ValueError(f"model '{name}' has no classes")
    return s.build(input_size or s.default_input_size,
                   classes if classes is not None else s.default_classes, **kw)


def synthetic_data(name, batch, input_size=None, classes=None, seed=0):
    """(x, y): a deterministic batch of inputs and training targets for `name` (numpy, from
    np.random.default_rng(seed))."""
    s = spec(name)
    rng = np.random.default_rng(seed)
    return s.data(rng, batch, input_size or s.default_input_size,
                  classes if classes is not None else s.default_classes)


def loss(name):
    """A new keras loss instance for training `name` on synthetic_data's targets."""
    return spec(name).make_loss()


def optimizer(name):
    """A new keras optimizer for training `name`: the model's own (resnet50_v15: MindSpore's
    Momentum, models/resnet_v15.py; the BERT models: MindSpore's Lamb, models/bert.py), else Adam with learning rate 1e-3."""
    make = spec(name).make_optimizer
    if make is not None:
        return make()
    import keras  # pylint: disable=import-outside-toplevel

    return keras.optimizers.Adam(1e-3)


def calibrate_batchnorm(model, x):
    """Sets every BatchNormalization layer's moving mean and variance to the statistics of
    batch `x` (one eager forward pass in training mode with momentum 0), as a trained model would
    have them. Without it a randomly initialised deep model in inference mode (moving mean 0,
    variance 1) scales its activations by whatever its random weights give: MobileNetV2 at
    32x32 ends near 1e-12, below fp16's smallest subnormal (6e-8), where an fp16 cube op
    rightly returns 0. Returns the number of layers calibrated. Run it on the device that holds
    the model's variables."""
    import keras  # pylint: disable=import-outside-toplevel

    every = model._flatten_layers(include_self=False)  # pylint: disable=protected-access
    layers = [l for l in every if isinstance(l, keras.layers.BatchNormalization)]
    momenta = [l.momentum for l in layers]
    try:
        for l in layers:
            l.momentum = 0.0
        model(x, training=True)
    finally:
        for l, m in zip(layers, momenta):
            l.momentum = m
    return len(layers)


__all__ = ["ModelSpec", "REGISTRY", "build", "calibrate_batchnorm", "input_shape", "loss",
           "names", "optimizer", "spec", "synthetic_data"]
