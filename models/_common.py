"""What every model module provides (ModelSpec), and synthetic data and losses they share."""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """How to build, feed and train one model.

    input_shape(input_size) -> the input shape without the batch dimension;
    build(input_size, classes, **kw) -> keras.Model (not compiled);
    data(rng, batch, input_size, classes) -> (x, y) numpy arrays;
    make_loss() -> a keras loss for the model's output (every classifier here ends in softmax,
    the risk score in a sigmoid). default_classes is None for a model without classes.
    make_optimizer() -> the keras optimizer the model trains with; None: Adam, learning rate
    1e-3 (optimizer() in models/__init__.py)."""

    name: str
    description: str
    default_input_size: int
    input_shape: object
    default_classes: object
    build: object
    data: object
    make_loss: object
    make_optimizer: object = None


def images(rng, batch, shape, classes):
    """Standard-normal float32 inputs of `shape` and int32 class labels in [0, classes)."""
    x = rng.standard_normal((batch,) + tuple(shape)).astype(np.float32)
    y = rng.integers(0, classes, batch).astype(np.int32)
    return x, y


def sparse_categorical_loss():
    import keras  # pylint: disable=import-outside-toplevel

    # The classifiers end in softmax; Keras' TensorFlow backend then computes the loss from
    # the softmax's logits (SparseSoftmaxCrossEntropyWithLogits), not from log(probabilities).
    return keras.losses.SparseCategoricalCrossentropy()


def binary_loss():
    import keras  # pylint: disable=import-outside-toplevel

    return keras.losses.BinaryCrossentropy()


_LOSS_SCALED_BASE = []


def loss_scaled_optimizer_base():
    """A keras Optimizer base class for MindSpore's optimizers with a fixed loss scale: its
    `loss_scale` attribute (None: unscaled) multiplies the loss in scale_loss, which Keras' train
    step calls before taking the gradients; the subclass's update_step divides the gradient back
    inside its update, as MindSpore's fused updates do (not Keras' loss_scale_factor, which
    divides every gradient in a pass of its own first). Defined once keras is imported."""
    if not _LOSS_SCALED_BASE:
        import keras  # pylint: disable=import-outside-toplevel

        class LossScaledOptimizer(keras.optimizers.Optimizer):
            loss_scale = None

            def scale_loss(self, loss):
                return loss if self.loss_scale is None else loss * self.loss_scale

        _LOSS_SCALED_BASE.append(LossScaledOptimizer)
    return _LOSS_SCALED_BASE[0]
