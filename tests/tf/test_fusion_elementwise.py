"""The element-wise chain fusion (adapter/tf/plugin/graph_fusion.h, rewrite 4; the op's contract
in adapter/compiler/ops/fused_elementwise.h): NPU chains of element-wise ops become one
FusedElementwise launch.

- a tf.function of element-wise chains (f32 with broadcasting, a shared intermediate read twice
  inside its chain, an intermediate that is also a function output; an f16 chain) gives results
  BIT-IDENTICAL to the same function run with NPUSIM_FUSION=0 in a child process (the fused
  kernel runs each step with the op's own instructions and roundings), close to TensorFlow on
  the CPU, in fewer launches; the intermediate used outside its chain is the sink of its own
  FusedElementwise (its name kept), not fused into the chain that reads it;
- a Keras MLP's training step with Adam (whose update is such chains, feeding
  AssignAdd/AssignSubVariableOp) gives bit-identical losses and weights with the fusion on and
  off, and fewer launches with it on;
- a node with a control edge in or out is not fused into its consumers' set;
- the op definition's shape function is the inputs' broadcast.
"""

import json
import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import run_child  # noqa: E402  pylint: disable=wrong-import-position

# Shared with the child process: the functions, their inputs, and how a run is recorded.
# npusim and tensorflow are imported inside the functions: this module runs CODE at
# collection, before the npusim fixture has pointed the package at this build's plugin.
CODE = r'''
import numpy as np


def chains(x, y, z, h):
    """x: f32 [4, 8], y: f32 [8], z: f32 [4, 1] (broadcast), h: f16 [16]."""
    import tensorflow as tf
    d = tf.math.subtract(x, y, name="d")                     # Sub, broadcasting y
    # d read twice inside the chain (as both operands of the square and by the add)
    sq = tf.math.multiply(d, d, name="sq")
    mid = tf.math.add(sq, tf.math.abs(d), name="mid")       # also an output: a sink
    e = tf.math.sqrt(tf.math.maximum(mid * z, 1e-3), name="e")
    out = tf.math.truediv(e, mid + 1.0, name="out")          # mid read again outside its set
    # f16: a GELU-like composition, 0.5 * h * (1 + tanh-free rational in h)
    g = tf.math.square(h)
    g = tf.math.reciprocal(g + 1.0)
    hout = tf.math.multiply(0.5 * h, 1.0 + h * g, name="hout")
    return out, mid, hout


def chain_inputs():
    rng = np.random.default_rng(3)
    return (rng.standard_normal((4, 8)).astype(np.float32),
            rng.standard_normal(8).astype(np.float32),
            rng.uniform(0.5, 2.0, (4, 1)).astype(np.float32),
            rng.standard_normal(16).astype(np.float16))


def run_chains():
    import npusim
    import tensorflow as tf
    args = [tf.constant(a) for a in chain_inputs()]
    with tf.device("/NPU:0"):
        f = tf.function(chains)
        f(*args)  # trace, optimize, compile
        n0 = len(npusim.launch_records())
        outs = [t.numpy() for t in f(*args)]
        recs = npusim.launch_records()[n0:]
    return outs, recs


def build_mlp():
    import keras
    keras.utils.set_random_seed(9)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", jit_compile=False)
    rng = np.random.default_rng(8)
    return model, rng.standard_normal((8, 12)).astype(np.float32), \
        rng.standard_normal((8, 3)).astype(np.float32)


def train_mlp():
    import npusim
    import tensorflow as tf
    with tf.device("/NPU:0"):
        model, x, y = build_mlp()
        losses = [float(model.train_on_batch(x, y))]
        n0 = len(npusim.launch_records())
        losses.append(float(model.train_on_batch(x, y)))
        recs = npusim.launch_records()[n0:]
        weights = [w.numpy() for w in model.weights]
    return losses, weights, recs


def summary(recs):
    return {"launches": len(recs), "op_types": sorted({r["op_type"] for r in recs})}


def hexed(arrays):
    return [[str(a.dtype), list(a.shape), a.tobytes().hex()] for a in arrays]
'''

CHILD_CHAINS = CODE + r'''
outs, recs = run_chains()
print("RESULT " + json.dumps({"outs": hexed(outs), **summary(recs)}))
'''

CHILD_TRAIN = CODE + r'''
losses, weights, recs = train_mlp()
print("RESULT " + json.dumps({"losses": losses, "weights": hexed(weights), **summary(recs)}))
'''

exec(CODE)  # pylint: disable=exec-used


def unhexed(items):
    return [np.frombuffer(bytes.fromhex(h), dtype=d).reshape(s) for d, s, h in items]


def fusion_off(code, variable="NPUSIM_FUSION"):
    proc = run_child(f"import json, os\nos.environ['{variable}'] = '0'\n" + code,
                     timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def fused_chains(npusim, tf):  # pylint: disable=unused-argument
    outs, recs = run_chains()  # pylint: disable=undefined-variable
    return outs, recs


def test_chains_match_cpu(tf, fused_chains):
    outs, _ = fused_chains
    with tf.device("/CPU:0"):
        want = [t.numpy() for t in tf.function(chains)(  # pylint: disable=undefined-variable
            *[tf.constant(a) for a in chain_inputs()])]  # pylint: disable=undefined-variable
    for got, w in zip(outs, want):
        assert got.dtype == w.dtype and got.shape == w.shape
        # f32: a few ulp per step (the vector unit's sqrt/division); f16: its own rounding
        tol = 1e-5 if w.dtype == np.float32 else 4e-3
        np.testing.assert_allclose(got.astype(np.float64), w.astype(np.float64), rtol=tol,
                                   atol=tol)


def test_chains_fuse_into_fewer_launches_bit_identical_to_unfused(fused_chains):
    outs, recs = fused_chains
    off = fusion_off(CHILD_CHAINS)
    for got, want in zip(outs, unhexed(off["outs"])):
        np.testing.assert_array_equal(got, want)
        assert got.tobytes() == want.tobytes()
    assert "FusedElementwise" not in off["op_types"]
    fused = {r["op_name"].rsplit("/", 1)[-1]: r for r in recs
             if r["op_type"] == "FusedElementwise"}
    # mid is also an output: the sink of its own set (d, sq, Abs, mid), not fused into out's
    # (mul, Maximum, e, add, out), which reads it as an input; hout ends the f16 chain.
    assert set(fused) == {"mid", "out", "hout"}, sorted(fused)
    assert fused["hout"]["kernel"].endswith("f16") and fused["out"]["kernel"].endswith("f32")
    for unfused in ("Sub", "Mul", "AddV2", "Abs", "Sqrt", "Maximum", "RealDiv", "Square",
                    "Reciprocal"):
        assert unfused not in {r["op_type"] for r in recs}, sorted({r["op_type"] for r in recs})
    # 3 launches instead of 4 + 5 + 7 element-wise ones
    assert len(recs) == 3 and off["launches"] == 16, (len(recs), off)


def test_adam_training_bit_identical_with_fewer_launches():
    # Both sides without the MatMul epilogue (rewrite 3b: the bias added inside the product's
    # fp32 sum rounds once less, so not bit-identical to MatMul then BiasAdd).
    on = fusion_off(CHILD_TRAIN, "NPUSIM_FUSION_EPILOGUE")
    losses, weights = on["losses"], unhexed(on["weights"])
    off = fusion_off(CHILD_TRAIN)
    assert losses == off["losses"], (losses, off["losses"])
    for got, want in zip(weights, unhexed(off["weights"])):
        assert got.tobytes() == want.tobytes()
    types = set(on["op_types"])
    assert "FusedElementwise" in types, sorted(types)
    assert "FusedElementwise" not in off["op_types"]
    print(f"\nAdam step: {on['launches']} launches fused, {off['launches']} unfused")
    assert on["launches"] < off["launches"]


def test_op_definition_infers_the_broadcast_shape(tf):
    """FusedElementwise's shape function (kernels_fused.cpp): the numpy broadcast of all
    inputs, a dimension unknown where no input knows it."""
    assert tf.config.list_physical_devices("NPU")  # the plugin (and its op definitions) loaded
    g = tf.Graph()
    with g.as_default():
        def node(*shapes):
            ins = [tf.compat.v1.placeholder(tf.float32, s) for s in shapes]
            op = g._create_op_internal(  # pylint: disable=protected-access
                "FusedElementwise", ins, [tf.float32],
                attrs={"T": tf.compat.v1.AttrValue(type=tf.float32.as_datatype_enum),
                       "Tin": tf.compat.v1.AttrValue(list=tf.compat.v1.AttrValue.ListValue(
                           type=[tf.float32.as_datatype_enum] * len(ins))),
                       "steps": tf.compat.v1.AttrValue(
                           list=tf.compat.v1.AttrValue.ListValue(s=[b"Neg i0"]))})
            return op.outputs[0].shape.as_list() if op.outputs[0].shape.rank is not None \
                else None
        assert node([4, 1, 3], [5, 1], [3]) == [4, 5, 3]
        assert node([2, 3]) == [2, 3]
        assert node([None, 1], [1, 7], []) == [None, 7]
        assert node([1, 1], [1]) == [1, 1]
        assert node(None, [3]) is None


def test_control_edges_end_a_set(npusim, tf):
    """A node that is the source of a control edge, or has control inputs, is not fused into
    its consumer's set (it stays the sink of its own): the control edge keeps its node."""
    def ctrl(x):
        a = tf.math.abs(x)
        k = tf.math.negative(a, name="k")
        with tf.control_dependencies([k]):
            s = tf.math.square(x, name="s")
        return tf.math.multiply(k, s, name="prod")

    x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    with tf.device("/NPU:0"):
        f = tf.function(ctrl)
        f(tf.constant(x))
        n0 = len(npusim.launch_records())
        got = f(tf.constant(x)).numpy()
        recs = npusim.launch_records()[n0:]
    np.testing.assert_array_equal(got, -np.abs(x) * (x * x))  # one f32 rounding per op
    by_name = {r["op_name"].rsplit("/", 1)[-1]: r["op_type"] for r in recs}
    assert by_name == {"k": "FusedElementwise", "s": "Square", "prod": "Mul"}, by_name
