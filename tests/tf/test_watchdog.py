"""The simulator's watchdog under TensorFlow (NPUSIM_MAX_INSNS_PER_BLOCK): its budget scales
with each launch's tensors, so a large valid launch runs where a fixed count would stop it.
tf.random.stateless_uniform draws on the chip's scalar unit (~14 instructions per output byte,
adapter/compiler/ops/random.h); with 10^6 instructions per 128 KiB, a (1024, 256) f32 draw
(1 MiB, 8 units) needs ~3.5 M instructions in each of the tiny chip's 4 blocks: more than the
floor of 10^6, within the budget of 8 M. It must give TensorFlow's CPU bits. (The same ratio
lets the default budget run the 8 M-element draw of a Dense(2048) layer on a 4096-wide input,
~10^8 instructions a block, which a fixed 10^8 rejected.)"""

import json

import pytest

pytest.importorskip("tensorflow")

from conftest import run_child  # noqa: E402  pylint: disable=wrong-import-position

CHILD = r"""
import json, os
import numpy as np
import npusim
os.environ["NPUSIM_MAX_INSNS_PER_BLOCK"] = "%d"
npusim.configure(chip="tiny")
import tensorflow as tf
seed = tf.constant([3, 4], tf.int64)
with tf.device("/CPU:0"):
    want = tf.random.stateless_uniform((1024, 256), seed=seed).numpy()
out = {}
with tf.device("/NPU:0"):
    try:
        got = tf.random.stateless_uniform((1024, 256), seed=seed).numpy()
        out["equal"] = bool(np.array_equal(got.view(np.uint32), want.view(np.uint32)))
    except tf.errors.OpError as e:
        out["error"] = [type(e).__name__, e.message]
print("NPUSIM_RESULT " + json.dumps(out))
"""


def _result(proc):
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.split("NPUSIM_RESULT ", 1)[1])


def test_a_large_launch_gets_a_budget_scaled_to_its_tensors():
    result = _result(run_child(CHILD % 1_000_000))
    assert result == {"equal": True}, result

