"""npusim.llm.update_variable_slice (the plugin's ResourceDynamicUpdateSlice): a slice written
into a resource variable on /NPU:0 in place, the KV-cache update of a decode step.

Reference: numpy's slice assignment with XLA's DynamicUpdateSlice clamping of the starts. In
place: the launches of an update write exactly the update's bytes to GM (the chip's *_to_gm
data-path counters), never the variable's, and a tensor read from the variable before the
update keeps its value (copy on write)."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from test_kernels import BF16  # noqa: E402

# llama-tiny's per-layer cache [batch, max_len, kv_heads, head_dim] (models/llm.py: 2 KV heads,
# head_dim 64 / 4 query heads = 16), max_len 12.
CACHE = (1, 12, 2, 16)


@pytest.fixture(name="llm")
def _llm(npusim):  # pylint: disable=unused-argument
    import npusim.llm as module  # pylint: disable=import-outside-toplevel

    return module


def _gm_write_bytes(record):
    return sum(v for k, v in record["counters"].items()
               if ".bytes." in k and k.endswith("_to_gm"))


def _reference(cache, update, starts):
    out = cache.copy()
    box = tuple(slice(min(max(s, 0), c - u), min(max(s, 0), c - u) + u)
                for s, c, u in zip(starts, cache.shape, update.shape))
    out[box] = update
    return out


def _values(shape, dtype, seed):
    return np.random.default_rng(seed).normal(0, 1, shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("batch", [1, 3])
def test_rows_written_in_place(npusim, tf, llm, dtype, batch):
    shape = (batch,) + CACHE[1:]
    want = _values(shape, dtype, 0)
    with tf.device("/NPU:0"):
        cache = tf.Variable(want)
    row_shape = (batch, 1) + CACHE[2:]
    # 20: clamped to the last position, as XlaDynamicUpdateSlice does
    for k, position in enumerate([5, 0, 11, 20]):
        row = _values(row_shape, dtype, k + 1)
        npusim.clear_launch_records()
        llm.update_variable_slice(cache, row, [0, position, 0, 0])
        records = npusim.launch_records(with_counters="flat")
        want = _reference(want, row, [0, position, 0, 0])
        np.testing.assert_array_equal(cache.numpy(), want)
        # one launch per batch row (a contiguous run), writing that row only
        assert len(records) == batch and all(r["ok"] for r in records), records
        assert sum(_gm_write_bytes(r) for r in records) == row.nbytes, records


def test_in_a_function_and_copy_on_write(npusim, tf, llm):
    want = _values(CACHE, BF16, 0)
    with tf.device("/NPU:0"):
        cache = tf.Variable(want)

        @tf.function
        def step(row, position):
            before = cache.read_value()  # ordered before the write: keeps the old value
            llm.update_variable_slice(cache, row, tf.stack([0, position, 0, 0]))
            return before, cache.read_value()

        for k, position in enumerate([3, 4]):
            row = _values((1, 1) + CACHE[2:], BF16, k + 1)
            before, after = step(tf.constant(row), tf.constant(position))
            np.testing.assert_array_equal(before.numpy(), want)
            want = _reference(want, row, [0, position, 0, 0])
            np.testing.assert_array_equal(after.numpy(), want)
            np.testing.assert_array_equal(cache.numpy(), want)

        held = cache.read_value()
        old = held.numpy()
        llm.update_variable_slice(cache, np.ones((1, 1) + CACHE[2:], BF16), [0, 7, 0, 0])
    np.testing.assert_array_equal(held.numpy(), old)
    np.testing.assert_array_equal(cache.numpy(), _reference(old, np.ones((1, 1) + CACHE[2:], BF16),
                                                            [0, 7, 0, 0]))


def test_bad_updates_are_errors(npusim, tf, llm):
    start = _values((1, 8, 1, 3), np.float32, 0)
    with tf.device("/NPU:0"):
        cache = tf.Variable(start)
        with pytest.raises(tf.errors.InvalidArgumentError, match="rank"):
            llm.update_variable_slice(cache, np.ones((1, 3), np.float32), [0, 0, 0, 0])
        with pytest.raises(tf.errors.InvalidArgumentError, match="larger"):
            llm.update_variable_slice(cache, np.ones((1, 9, 1, 3), np.float32), [0, 0, 0, 0])
        # a 12-byte row is not whole 32-byte blocks: refused, the variable unchanged
        with pytest.raises(tf.errors.UnimplementedError, match="32-byte"):
            llm.update_variable_slice(cache, np.ones((1, 1, 1, 3), np.float32), [0, 2, 0, 0])
    np.testing.assert_array_equal(cache.numpy(), start)
