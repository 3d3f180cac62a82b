# User story 2: a TensorFlow user trains ResNet-50 (randomly initialised, nothing downloaded)
# on the emulated NPU.
#
# Plain TensorFlow/Keras code; the only addition is `import npusim`, which gives TensorFlow the
# device "NPU" (the emulated Ascend-class chip; NPUSIM_CHIP=tiny picks the small test chip,
# default 910b). One batch of 8 random 224x224 RGB images with random labels from 1000
# classes, trained for STEPS steps (default 5; the environment variable STORY_STEPS or the
# first argument changes it, e.g. 1 in the tests).
#
# Run from the repository root: .venv/bin/python examples/story_resnet50.py [STEPS]

import os
import sys

import numpy as np
import tensorflow as tf

import npusim  # noqa: F401  (registers the NPU)

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("STORY_STEPS", "5"))

print("NPUs:", tf.config.list_physical_devices("NPU"))

rng = np.random.default_rng(0)
images = rng.standard_normal((8, 224, 224, 3)).astype(np.float32)
labels = rng.integers(0, 1000, 8)

model = tf.keras.applications.ResNet50(weights=None)
model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
              loss="sparse_categorical_crossentropy")
for step in range(STEPS):
    loss = model.train_on_batch(images, labels)
    print(f"step {step + 1}: loss {float(loss):.4f}", flush=True)
