"""A while loop's condition of int32 comparisons joined by LogicalAnd / LogicalOr runs on the host
(adapter/tf/plugin/host_loop_condition.h): no LogicalAnd launch, no copy of its operands to the
chip, the loop's result unchanged; NPUSIM_HOST_LOOP_CONDITION=0 (read when a function is traced)
launches it once per test of the condition. A LogicalAnd of bools the chip computed, read by the
chip, keeps its launch."""

import os

import numpy as np
import pytest

pytest.importorskip("tensorflow")


def _loop(tf):
    @tf.function
    def run(x, n, m):
        def cond(i, j, _):
            return tf.logical_and(i < n, j < m)

        def body(i, j, y):
            keep = tf.logical_and(y > -1.0, y < 100.0)  # bools the chip computes, the chip reads
            return i + 1, j + 2, tf.where(keep, y * 0.5 + 1.0, y)

        return tf.while_loop(cond, body, (tf.constant(0), tf.constant(0), x))[2]
    return run


def _launches(npusim, tf, run, x):
    with tf.device("/NPU:0"):
        npusim.clear_launch_records()
        out = run(tf.constant(x), tf.constant(5), tf.constant(7)).numpy()
    return out, [r["op_type"] for r in npusim.launch_records()]


@pytest.mark.parametrize("switch", ["1", "0"])
def test_loop_condition_on_the_host(npusim, tf, strict_placement, switch):  # noqa: ARG001
    x = np.linspace(-2.0, 2.0, 64, dtype=np.float32).reshape(8, 8)
    want = x.copy()
    for _ in range(4):  # j = 0, 2, 4, 6 < 7 (and i < 5)
        want = np.where((want > -1) & (want < 100), want * np.float32(0.5) + np.float32(1), want)
    previous = os.environ.get("NPUSIM_HOST_LOOP_CONDITION")
    os.environ["NPUSIM_HOST_LOOP_CONDITION"] = switch
    try:
        out, ops = _launches(npusim, tf, _loop(tf), x)
    finally:
        if previous is None:
            del os.environ["NPUSIM_HOST_LOOP_CONDITION"]
        else:
            os.environ["NPUSIM_HOST_LOOP_CONDITION"] = previous
    np.testing.assert_array_equal(out, want)
    # The body's LogicalAnd of two float comparisons is on the chip in each of the 4 iterations;
    # the condition's, tested 5 times, only with the switch 0.
    assert ops.count("LogicalAnd") == (4 if switch == "1" else 9), ops
    assert ops.count("FusedElementwise") == 4, ops
