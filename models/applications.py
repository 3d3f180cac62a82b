"""ResNet-50 and MobileNetV2 from keras.applications, randomly initialised (weights=None: nothing
is downloaded), on input_size x input_size x 3 images (default 224; keras.applications needs at
least 32), with a softmax classifier of `classes` (default 1000)."""

from ._common import ModelSpec, images, sparse_categorical_loss


def _application(constructor_name):
    def build(input_size, classes, output_activation="softmax", **kw):
        import keras  # pylint: disable=import-outside-toplevel

        constructor = getattr(keras.applications, constructor_name)
        return constructor(weights=None, input_shape=(input_size, input_size, 3),
                           classes=classes, classifier_activation=output_activation, **kw)

    return build


def _spec(name, constructor_name, description):
    return ModelSpec(
        name=name, description=description, default_input_size=224,
        input_shape=lambda n: (n, n, 3), default_classes=1000,
        build=_application(constructor_name),
        data=lambda rng, batch, n, classes: images(rng, batch, (n, n, 3), classes),
        make_loss=sparse_categorical_loss)


RESNET50_SPEC = _spec("resnet50", "ResNet50",
                      "keras.applications.ResNet50(weights=None), 224x224x3 default")
MOBILENETV2_SPEC = _spec("mobilenetv2", "MobileNetV2",
                         "keras.applications.MobileNetV2(weights=None), 224x224x3 default")
