"""CPU fallbacks under soft placement: ops without an NPU kernel that TensorFlow runs on the CPU
are found by the plugin's graph optimizer (graph_optimizer.cpp) in every placed tf.function
graph, warned about once per op type, and counted (npusim.cpu_fallback_ops()). Host-side ops
(tf.data, function arguments, constants, control flow, int32 shape arithmetic) are not
fallbacks. A child process gives a fresh count and fresh once-per-process warnings."""

import json

import pytest

pytest.importorskip("tensorflow")

from conftest import run_child  # noqa: E402  pylint: disable=wrong-import-position

CHILD = r"""
import json
import numpy as np
import npusim
import tensorflow as tf

# Zeta and Igamma have CPU kernels only; the multiplications run on the NPU.
@tf.function
def one(x):
    return tf.math.zeta(x * 2.0, x)

@tf.function
def two(x):
    y = x * 3.0
    return tf.math.zeta(y, x) + tf.math.zeta(x, y) * tf.math.igamma(x, y)

x = tf.constant(np.array([2.0, 3.0], np.float32))
out = {"before": npusim.cpu_fallback_ops()}
one(x); one(x)  # traced and placed once
two(x)
out["functions"] = npusim.cpu_fallback_ops()

# A graph entirely on the CPU is host code, not a fallback.
with tf.device("/CPU:0"):
    tf.function(lambda a: tf.math.igamma(a, a))(x)
out["cpu_function"] = npusim.cpu_fallback_ops()

# Eager ops never pass through grappler (documented limitation).
with tf.device("/NPU:0"):
    tf.math.zeta(x, x)
out["eager"] = npusim.cpu_fallback_ops()

npusim.clear_cpu_fallback_ops()
import keras
rng = np.random.default_rng(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"),
                          keras.layers.Dense(2)])
model.compile(optimizer="adam",
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(rng.standard_normal((32, 8)).astype(np.float32), rng.integers(0, 2, 32),
          batch_size=16, epochs=1, verbose=0)
out["fit"] = npusim.cpu_fallback_ops()
print("NPUSIM_RESULT " + json.dumps(out))
"""

HOST_SIDE = {"_Arg", "_Retval", "Const", "NoOp", "IteratorGetNext", "OptionalHasValue",
             "OptionalGetValue", "IteratorGetNextAsOptional", "Switch", "Merge", "Identity",
             "StatefulPartitionedCall", "PartitionedCall", "Shape", "StridedSlice", "Prod"}


def test_fallbacks_are_counted_and_warned_once_per_op_type():
    proc = run_child(CHILD, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.split("NPUSIM_RESULT ", 1)[1])
    assert out["before"] == {}
    # one: 1 Zeta node; two: 2 Zeta, 1 Igamma. The second call of `one` reuses its graph.
    assert out["functions"] == {"Zeta": 3, "Igamma": 1}, out
    assert out["cpu_function"] == out["functions"]
    assert out["eager"] == out["functions"]
    for op in ("Zeta", "Igamma"):
        warnings = [line for line in proc.stderr.splitlines()
                    if line.startswith(f"npusim: warning: op {op} has no NPU kernel")]
        assert len(warnings) == 1, (op, warnings, proc.stderr[-3000:])
    # The Keras train step: no host-side op is reported, whatever else falls back.
    assert not HOST_SIDE & set(out["fit"]), out["fit"]
