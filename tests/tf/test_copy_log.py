"""NPUSIM_COPY_LOG=1 (adapter/tf/plugin/stream_executor.cpp; docs/runtime.md, "The same timeline
in every run") writes one line per copy TensorFlow asks of the NPU: its direction, its bytes, its
stream and the TensorFlow function that asked for it. A tf.function's int32 argument from the
host reaches the NPU through a send/receive pair, and the copy runs on whichever of the two
completes the rendezvous (TensorFlow's in-process rendezvous copies in the receive's callback,
which runs on the SendOp's thread when the RecvOp was waiting and on the RecvOp's otherwise), so
either may be named; the host reads a result through TensorHandle::Resolve; without the switch
nothing is written."""

import os
import sys

import pytest

pytest.importorskip("tensorflow")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import run_child  # noqa: E402  pylint: disable=wrong-import-position

CODE = """
import numpy as np
import tensorflow as tf
import npusim
with tf.device("/NPU:0"):
    x = tf.constant(np.arange(6, dtype=np.float32))
    scale = tf.function(lambda a, k: a * tf.cast(k, tf.float32))
    y = scale(x, np.int32(3))
print("result", y.numpy().tolist())
"""


def copy_lines(extra_env):
    proc = run_child(CODE, extra_env=extra_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "result [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]" in proc.stdout
    return [line for line in proc.stderr.splitlines() if line.startswith("npusim: copy ")]


def test_the_copy_log_names_each_copy_its_bytes_and_its_caller():
    lines = copy_lines({"NPUSIM_COPY_LOG": "1"})
    assert any(line.startswith("npusim: copy h2d 4 bytes (stream ")
               and line.endswith((" for tensorflow::RecvOp::ComputeAsync",
                                  " for tensorflow::SendOp::Compute")) for line in lines), lines
    assert any(line.startswith("npusim: copy d2h 24 bytes (stream ")
               and line.endswith(" for tensorflow::TensorHandle::Resolve") for line in lines), lines
    assert any(line.startswith("npusim: copy h2d 24 bytes") for line in lines), lines


def test_without_the_switch_no_copy_is_logged():
    assert copy_lines({}) == []
