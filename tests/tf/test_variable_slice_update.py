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


def _update_then_read(tf, llm, cache):
    """A tf.function writing row * 2 into `cache` at position `index` of dim 1, then reading the
    whole cache (+ 1): the decode step's cache update and read."""

    @tf.function
    def step(row, index):
        llm.update_variable_slice(cache, row * 2.0, tf.stack([0, index, 0, 0]))
        return cache.read_value() + 1.0

    return step


@pytest.mark.parametrize("batch", [1, 3])
def test_update_and_read_join_the_graph_run(npusim, tf, llm, batch):
    """A KV cache held in a variable (ResidentCacheDecoder's step): npusim.llm.
    update_variable_slice inside a tf.function, then a read of the variable. The update and the
    read join the function's whole-graph (NpuGraph) run; the update writes only the new row into
    the variable's own buffer, one launch, a tile per batch entry (its GM writes: batch x
    heads x head_dim x 2 bytes, from the shapes); the values are numpy's: the read inside sees
    the new row, a start past the end is clamped as XLA clamps it, and a tensor read from the
    variable before the call and still alive keeps the old value (copy on write: one copy of
    the variable before the run, none when no such tensor is alive)."""
    length, heads, head_dim = 8, 2, 16
    rng = np.random.default_rng(0)
    init = rng.standard_normal((batch, length, heads, head_dim)).astype(np.float16)
    row_bytes = batch * heads * head_dim * 2
    want = init.copy()
    with tf.device("/NPU:0"):
        cache = tf.Variable(init)
        step = _update_then_read(tf, llm, cache)

        for index, hold in ((3, True), (11, False)):  # 11: clamped to length - 1
            row = rng.standard_normal((batch, 1, heads, head_dim)).astype(np.float16)
            before = cache.read_value() if hold else None
            held = before.numpy() if hold else None
            npusim.clear_launch_records()
            got = step(tf.constant(row), tf.constant(index, tf.int32)).numpy()
            records = npusim.launch_records(with_counters="flat")
            want[:, min(index, length - 1)] = row[:, 0] * np.float16(2)
            np.testing.assert_array_equal(got, want + np.float16(1))
            np.testing.assert_array_equal(cache.numpy(), want)
            if hold:
                np.testing.assert_array_equal(before.numpy(), held)
            updates = [r for r in records if r["op_name"].startswith("ResourceDynamicUpdateSlice")]
            assert len(updates) == 1, [(r["op_name"], r["op_type"]) for r in records]
            assert sum(_gm_write_bytes(r) for r in updates) == row_bytes
            runs = {r["graph_run"] for r in records if r["graph_run"]}
            assert len(runs) == 1 and all(r["graph_run"] in runs for r in updates), \
                [(r["op_name"], r["graph_run"]) for r in records]
            copies = [r for r in records if not r["graph_run"]]
            assert len(copies) == (1 if hold else 0), [(r["op_name"], r["op_type"]) for r in copies]
            if hold:
                assert _gm_write_bytes(copies[0]) == init.nbytes



def test_update_of_partial_blocks_in_the_graph_run_writes_a_new_value(npusim, tf, llm):
    """A row of 12 bytes (not whole 32-byte blocks) cannot be written in place: inside the graph
    run the update writes the whole new value into a new buffer, published after the run (the
    variable's bytes, not the row's); the read after it sees the row, values numpy's."""
    init = np.arange(24, dtype=np.float32).reshape(1, 8, 1, 3)
    want = init.copy()
    with tf.device("/NPU:0"):
        cache = tf.Variable(init)
        step = _update_then_read(tf, llm, cache)

        npusim.clear_launch_records()
        got = step(tf.constant(np.full((1, 1, 1, 3), 5, np.float32)), tf.constant(2)).numpy()
        records = npusim.launch_records(with_counters="flat")
        want[0, 2] = 10
        np.testing.assert_array_equal(got, want + 1)
        np.testing.assert_array_equal(cache.numpy(), want)
    runs = {r["graph_run"] for r in records}
    assert len(runs) == 1 and 0 not in runs, [(r["op_name"], r["graph_run"]) for r in records]
    update = [r for r in records if r["op_name"].startswith("ResourceDynamicUpdateSlice")]
    assert len(update) == 1 and _gm_write_bytes(update[0]) >= init.nbytes
