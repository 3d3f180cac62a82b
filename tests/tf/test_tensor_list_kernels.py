"""AddN and ZerosLike on variant TensorLists on the NPU (adapter/tf/plugin/kernels_tensor_list.cpp),
with soft placement off: the lists' element-wise sum and zeros against numpy, an uninitialised
element passed on without a launch, one launch of the compiler's AddV2 / ZerosLike per element
that needs one, all under one host dispatch; int32 elements (device tensors in a list, as
TensorFlow's list copies take them); bool lists (TensorFlow's list kernels registered for the NPU);
and a Keras LSTM's training step (also masked), whose loop gradient sums such lists, with neither op
left to the CPU and the weights after an SGD step those of the CPU.

The lists are read back by TensorListStack on the CPU: TensorFlow copies the list (element by
element) to the host, so the check does not go through the kernels under test."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from conftest import child_result  # noqa: E402


def _quarters(shape, seed):
    """Multiples of 1/4 in [-2, 2]: their sums of three are exact in fp32."""
    return np.random.default_rng(seed).integers(-8, 9, size=shape).astype(np.float32) / 4


def _stack(tf, handle, shape, dtype):
    with tf.device("/CPU:0"):
        return tf.raw_ops.TensorListStack(input_handle=handle, element_shape=shape,
                                          element_dtype=dtype).numpy()


def _reserve_with(tf, shape, n, dtype, index, item):
    """A list of n uninitialised elements with `item` at `index`."""
    r = tf.raw_ops.TensorListReserve(element_shape=shape, num_elements=n, element_dtype=dtype)
    return tf.raw_ops.TensorListSetItem(input_handle=r, index=index, item=item)


def _launches(npusim, kernel_prefix):
    return [r for r in npusim.launch_records() if r["kernel"].startswith(kernel_prefix)]


def test_addn_of_tensor_lists_adds_on_the_chip(npusim, tf, strict_placement):  # noqa: ARG001
    x, y = _quarters((3, 2, 8), 1), _quarters((3, 2, 8), 2)
    with tf.device("/NPU:0"):
        a = tf.raw_ops.TensorListFromTensor(tensor=tf.constant(x), element_shape=[2, 8])
        b = _reserve_with(tf, [2, 8], 3, tf.float32, 1, tf.constant(y[1]))
        npusim.clear_launch_records()
        total = tf.raw_ops.AddN(inputs=[a, b, a])
        adds = _launches(npusim, "AddV2")
    want = x + x
    want[1] = (x[1] + y[1]) + x[1]
    np.testing.assert_array_equal(_stack(tf, total, [2, 8], tf.float32), want)
    # a + b: one addition (elements 0 and 2 of b are uninitialised: a's tensors passed on);
    # (a + b) + a: three. One op, one host dispatch.
    assert len(adds) == 4, [r["kernel"] for r in npusim.launch_records()]
    assert len({r["dispatch"] for r in adds}) == 1
    assert sum(r["host_dispatch_cycles"] > 0 for r in adds) == 1


def test_addn_of_tensor_lists_checks_lengths(npusim, tf, strict_placement):  # noqa: ARG001
    with tf.device("/NPU:0"):
        a = tf.raw_ops.TensorListFromTensor(tensor=tf.zeros([3, 4]), element_shape=[4])
        b = tf.raw_ops.TensorListFromTensor(tensor=tf.zeros([2, 4]), element_shape=[4])
        with pytest.raises(tf.errors.InvalidArgumentError, match="different lengths"):
            tf.raw_ops.AddN(inputs=[a, b])


def test_zeros_like_of_a_tensor_list_keeps_uninitialised_elements(npusim, tf,
                                                                  strict_placement):  # noqa: ARG001
    x = _quarters((3, 2, 8), 3)
    with tf.device("/NPU:0"):
        full = tf.raw_ops.TensorListFromTensor(tensor=tf.constant(x), element_shape=[2, 8])
        sparse = _reserve_with(tf, [2, 8], 4, tf.float32, 2, tf.constant(x[0]))
        npusim.clear_launch_records()
        zeros_full = tf.raw_ops.ZerosLike(x=full)
        full_fills = _launches(npusim, "ZerosLike")
        npusim.clear_launch_records()
        zeros_sparse = tf.raw_ops.ZerosLike(x=sparse)
        sparse_fills = _launches(npusim, "ZerosLike")
        # The zeros are a list of the input's length: adding the input gives the input back.
        back = tf.raw_ops.AddN(inputs=[zeros_full, full])
    np.testing.assert_array_equal(_stack(tf, zeros_full, [2, 8], tf.float32), np.zeros_like(x))
    np.testing.assert_array_equal(_stack(tf, back, [2, 8], tf.float32), x)
    np.testing.assert_array_equal(_stack(tf, zeros_sparse, [2, 8], tf.float32),
                                  np.zeros((4, 2, 8), np.float32))
    assert len(full_fills) == 3 and len({r["dispatch"] for r in full_fills}) == 1
    assert len(sparse_fills) == 1  # only the element that holds a tensor


def test_int32_lists_on_the_chip(npusim, tf, strict_placement):  # noqa: ARG001
    x = np.arange(12, dtype=np.int32).reshape(3, 4) - 5
    with tf.device("/NPU:0"):
        a = tf.raw_ops.TensorListFromTensor(tensor=tf.constant(x), element_shape=[4])
        npusim.clear_launch_records()
        zeros = tf.raw_ops.ZerosLike(x=a)
        total = tf.raw_ops.AddN(inputs=[a, a, zeros])
        assert len(_launches(npusim, "ZerosLike")) == 3 and len(_launches(npusim, "AddV2")) == 6
    np.testing.assert_array_equal(_stack(tf, zeros, [4], tf.int32), np.zeros_like(x))
    np.testing.assert_array_equal(_stack(tf, total, [4], tf.int32), 2 * x)


def test_bool_lists_on_the_chip(npusim, tf, strict_placement):  # noqa: ARG001
    # TensorFlow's list kernels registered for bool elements (a Keras RNN's mask): made, read,
    # stacked, gathered and popped on the NPU, bit-exact.
    x = np.random.default_rng(3).integers(0, 2, (5, 2, 3)).astype(bool)
    with tf.device("/NPU:0"):
        handle = tf.raw_ops.TensorListFromTensor(tensor=tf.constant(x), element_shape=[2, 3])
        items = [tf.raw_ops.TensorListGetItem(input_handle=handle, index=i, element_shape=[2, 3],
                                              element_dtype=tf.bool) for i in range(5)]
        stacked = tf.raw_ops.TensorListStack(input_handle=handle, element_shape=[2, 3],
                                             element_dtype=tf.bool)
        gathered = tf.raw_ops.TensorListGather(input_handle=handle, indices=[3, 0],
                                               element_shape=[2, 3], element_dtype=tf.bool)
        _, last = tf.raw_ops.TensorListPopBack(input_handle=handle, element_shape=[2, 3],
                                               element_dtype=tf.bool)
    for t in items + [stacked, gathered, last]:
        assert t.device.endswith("device:NPU:0"), t.device
    for i, t in enumerate(items):
        np.testing.assert_array_equal(t.numpy(), x[i])
    np.testing.assert_array_equal(stacked.numpy(), x)
    np.testing.assert_array_equal(gathered.numpy(), x[[3, 0]])
    np.testing.assert_array_equal(last.numpy(), x[4])


# A Keras LSTM's training step (SGD) on the NPU and on the CPU from the same weights: the loop
# gradient's AddN / ZerosLike of the input sequence's list run on the NPU (their element
# launches are named by the nodes), none falls back to the CPU, and the updates match the CPU's.
LSTM = r"""
import json
import numpy as np
import npusim
import tensorflow as tf
import keras

def build():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(50, 8, mask_zero=MASK_ZERO),
                              keras.layers.LSTM(16), keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model

rng = np.random.default_rng(0)
x = rng.integers(0, 50, (2, 6)).astype(np.int32)
if MASK_ZERO:
    x[:, -2:] = 0  # padding: the mask's list is bool
y = rng.integers(0, 4, (2,)).astype(np.int32)
with tf.device("/NPU:0"):
    npu = build()
    w0 = [w.numpy() for w in npu.weights]
    npusim.clear_launch_records()
    npu.train_on_batch(x, y)
recs = npusim.launch_records()
with tf.device("/CPU:0"):
    cpu = build()
    cpu.set_weights(w0)
    cpu.train_on_batch(x, y)
scale = max(float(np.max(np.abs(c.numpy() - w))) for c, w in zip(cpu.weights, w0))
diff = max(float(np.max(np.abs(n.numpy() - c.numpy()))) for n, c in zip(npu.weights, cpu.weights))
print("RESULT" + json.dumps({
    "fallbacks": npusim.cpu_fallback_ops(), "rel_diff": diff / scale,
    "list_adds": sum(r["kernel"].startswith("AddV2") and r["op_name"].endswith("AddN_3")
                     for r in recs),
    "list_zeros": sum(r["kernel"].startswith("ZerosLike") and r["op_name"] == "zeros_like"
                      for r in recs)}))
"""


def test_lstm_training_sums_its_gradient_lists_on_the_chip():
    result = child_result(LSTM.replace("MASK_ZERO", "False"))
    assert "AddN" not in result["fallbacks"] and "ZerosLike" not in result["fallbacks"], result
    # One addition per backward iteration (6 steps), one zero element per input step.
    assert result["list_adds"] == 6 and result["list_zeros"] == 6, result
    # The cube's fp16 operands (default precision mode): the survey's LSTM is within 2e-4.
    assert result["rel_diff"] < 2e-3, result


def test_masked_lstm_training_keeps_its_bool_lists_on_the_chip():
    # Embedding(mask_zero=True): the mask's bool TensorList (FromTensor, GetItem in the loop,
    # PopBack in its gradient) stays on the NPU, and the update matches the CPU's.
    result = child_result(LSTM.replace("MASK_ZERO", "True"))
    assert not result["fallbacks"], result
    assert result["rel_diff"] < 2e-3, result
