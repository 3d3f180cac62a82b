# User story 1: a TensorFlow user trains a Keras MLP on the emulated NPU.
#
# Plain TensorFlow/Keras code; the only addition is `import npusim`, which gives TensorFlow the
# device "NPU" (the emulated Ascend-class chip; NPUSIM_CHIP=tiny picks the small test chip,
# default 910b). Data: 256 random 784-feature samples with random labels from 10 classes, so
# that 5 epochs of batch 32 (40 train steps) stay quick on the emulator; the loss falls as the
# model memorises them.
#
# Run from the repository root: .venv/bin/python examples/story_mlp.py

import numpy as np
import tensorflow as tf

import npusim  # noqa: F401  (registers the NPU)

tf.config.set_visible_devices([], "GPU")
npus = tf.config.list_physical_devices("NPU")
print("NPUs:", npus)
tf.config.experimental.set_memory_growth(npus[0], True)

rng = np.random.default_rng(0)
x_train = rng.standard_normal((256, 784)).astype(np.float32)
y_train = rng.integers(0, 10, 256)

model = tf.keras.Sequential([
    tf.keras.Input((784,)),
    tf.keras.layers.Dense(128, activation="relu"),
    tf.keras.layers.Dropout(0.2),
    tf.keras.layers.Dense(10, activation="softmax"),
])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x_train, y_train, epochs=5, batch_size=32, verbose=2)
print("final loss:", history.history["loss"][-1])
