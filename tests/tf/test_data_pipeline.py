"""tf.data input pipelines feeding the NPU (docs/tf_plugin.md, "Input pipelines"): each batch
reaches the chip as a host->device copy over the HDC link model, timed, and the report shows how
long the chip waited for it; `prefetch_to_device` pipelines train exactly like plain ones."""

import json
import os
import re

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

SAMPLES, FEATURES, CLASSES, BATCH = 48, 16, 4, 8


def _data():
    rng = np.random.default_rng(7)
    return (rng.standard_normal((SAMPLES, FEATURES)).astype(np.float32),
            rng.integers(0, CLASSES, SAMPLES).astype(np.int32))


def _model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(CLASSES)])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _fit(tf, dataset):
    """Per-batch losses of one epoch on the NPU (no device scope: the NPU is the default)."""
    model = _model()
    losses = []
    cb = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda b, logs: losses.append(float(logs["loss"])))
    model.fit(dataset, epochs=1, verbose=0, callbacks=[cb])
    # (Keras counts one more optimizer iteration for a dataset of unknown length, such as a
    # prefetch_to_device one, on the CPU as well: count the batches it reported instead.)
    assert len(losses) == SAMPLES // BATCH
    return np.array(losses)


def test_each_batch_is_a_timed_hdc_copy_and_the_report_shows_the_wait(npusim, tf, tmp_path):
    x, y = _data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).prefetch(tf.data.AUTOTUNE)
    before = len(npusim.launch_records())
    with npusim.profile(tmp_path):
        _fit(tf, ds)
    assert len(npusim.launch_records()) > before  # the steps ran on the chip
    with open(os.path.join(tmp_path, "trace.json")) as f:
        events = json.load(f)["traceEvents"]
    h2d = [e for e in events if e.get("ph") == "X" and e.get("name") == "memcpy_h2d"]
    # Every batch's features and labels go over the link (more h2d copies may carry the
    # step's scalars), each taking simulated time.
    sizes = [e["args"]["bytes"] for e in h2d]
    assert sizes.count(BATCH * FEATURES * 4) >= SAMPLES // BATCH, sizes
    assert sizes.count(BATCH * 4) >= SAMPLES // BATCH, sizes
    assert all(e["dur"] > 0 for e in h2d)
    summary = open(os.path.join(tmp_path, "summary.txt")).read()
    m = re.search(r"h2d\s+(\d+) copies", summary)
    assert m and int(m.group(1)) == len(h2d), summary
    m = re.search(r"waiting for data \(host->device copies before a kernel\): ([\d.]+) us",
                  summary)
    assert m and float(m.group(1)) > 0, summary


def test_prefetch_to_device_trains_like_a_plain_pipeline(npusim, tf):
    x, y = _data()
    plain = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    prefetched = plain.apply(tf.data.experimental.prefetch_to_device("/NPU:0", buffer_size=2))
    before = len(npusim.launch_records())
    want = _fit(tf, plain)
    got = _fit(tf, prefetched)
    assert len(npusim.launch_records()) > before
    np.testing.assert_array_equal(got, want)
    assert got[-1] < got[0]
