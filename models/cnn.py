"""A small CNN on input_size x input_size x 1 images (default 28, MNIST-like):
Conv2D 16 3x3 -> BatchNormalization -> ReLU -> MaxPool 2x2 -> Conv2D 32 3x3 ->
BatchNormalization -> ReLU -> MaxPool 2x2 -> Flatten -> Dense classes (10) softmax."""

from ._common import ModelSpec, images, sparse_categorical_loss


def build(input_size, classes, filters=(16, 32), output_activation="softmax"):
    import keras  # pylint: disable=import-outside-toplevel

    layers = [keras.Input((input_size, input_size, 1))]
    for f in filters:
        layers += [keras.layers.Conv2D(f, 3, padding="same", use_bias=False),
                   keras.layers.BatchNormalization(),
                   keras.layers.ReLU(),
                   keras.layers.MaxPool2D(2)]
    layers += [keras.layers.Flatten(), keras.layers.Dense(classes, activation=output_activation)]
    return keras.Sequential(layers, name="cnn")


SPEC = ModelSpec(
    name="cnn", description="small CNN: 2 x (Conv2D, BatchNormalization, ReLU, MaxPool2D), "
    "Flatten, Dense softmax; 28x28x1 input",
    default_input_size=28, input_shape=lambda n: (n, n, 1), default_classes=10, build=build,
    data=lambda rng, batch, n, classes: images(rng, batch, (n, n, 1), classes),
    make_loss=sparse_categorical_loss)
