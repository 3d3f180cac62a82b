"""The MLP of the first user story: input_size (784) features -> Dense 128 relu -> Dropout 0.2
-> Dense classes (10) softmax."""

from ._common import ModelSpec, images, sparse_categorical_loss


def build(input_size, classes, hidden=128, dropout=0.2, output_activation="softmax"):
    import keras  # pylint: disable=import-outside-toplevel

    return keras.Sequential([
        keras.Input((input_size,)),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dropout(dropout),
        keras.layers.Dense(classes, activation=output_activation),
    ], name="mlp")


SPEC = ModelSpec(
    name="mlp", description="784-128-10 Dense MLP with Dropout, softmax output",
    default_input_size=784, input_shape=lambda n: (n,), default_classes=10, build=build,
    data=lambda rng, batch, n, classes: images(rng, batch, (n,), classes),
    make_loss=sparse_categorical_loss)
