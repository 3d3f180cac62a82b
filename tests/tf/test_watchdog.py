"""The simulator's watchdog under TensorFlow (NPUSIM_MAX_INSNS_PER_BLOCK): its budget scales
with each launch's tensors, so a large valid launch runs where a fixed count would stop it.
tf.random.stateless_uniform draws on the chip's vector unit (adapter/compiler/ops/random.h): a
(1024, 256) f32 draw (1 MiB, 8 units of 128 KiB) is 16 tiles of 1024 Philox groups in each of
the tiny chip's 4 blocks, 33-41 k instructions a block (2026-12-04: 64 tiles take 132-165 k):
more than a floor of 2 * 10^4, within a budget of 2 * 10^4 per 128 KiB (160 k), and past a
tenth of that (16 k). It must give TensorFlow's CPU bits. (The same ratio, at the default
10^6 per 128 KiB, let the scalar-unit Philox of before run the 8 M-element draw of a
Dense(2048) layer on a 4096-wide input, ~10^8 instructions a block, which a fixed 10^8
rejected.)"""

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
    result = _result(run_child(CHILD % 20_000))
    assert result == {"equal": True}, result
    result = _result(run_child(CHILD % 2_000))
    assert "error" in result and "watchdog" in result["error"][1], result

