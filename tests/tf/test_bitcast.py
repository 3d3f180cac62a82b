"""Bitcast on the NPU (adapter/tf/plugin/kernels_bitcast.cpp): the output aliases the input's
device buffer, so no kernel runs; the bits and the shape rule (wider -> extra last dim,
narrower -> last dim dropped) must equal TF's CPU Bitcast, with soft placement off."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")


CASES = [  # (input dtype, values shape, output dtype)
    ("float32", (2, 3), "int32"),
    ("int64", (5,), "uint64"),
    ("float32", (4,), "uint16"),      # wider: [4] -> [4, 2]
    ("uint16", (3, 2), "float32"),    # narrower: [3, 2] -> [3]
    ("int64", (2, 2), "int8"),        # [2, 2] -> [2, 2, 8]
    ("uint32", (6,), "float32"),
    ("bfloat16", (1, 4), "float16"),
]


@pytest.mark.parametrize("src,shape,dst", CASES)
def test_bitcast_matches_tf_cpu(npusim, tf, strict_placement, src, shape, dst):
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, int(np.prod(shape)) * tf.as_dtype(src).size, dtype=np.uint8)
    x = raw.view(tf.as_dtype(src).as_numpy_dtype).reshape(shape)
    with tf.device("/CPU:0"):
        want = tf.bitcast(tf.constant(x), dst).numpy()
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        got = tf.bitcast(tf.constant(x), dst)
    assert got.device.endswith("device:NPU:0"), got.device
    got = got.numpy()
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.tobytes() == want.tobytes()
    assert npusim.launch_records() == []  # an alias: no kernel


def test_bitcast_rejects_a_wrong_last_dim(npusim, tf, strict_placement):
    with tf.device("/NPU:0"):
        with pytest.raises(tf.errors.InvalidArgumentError):
            tf.bitcast(tf.constant(np.zeros((3, 3), np.uint16)), tf.float32).numpy()
