"""MatMul -> BiasAdd [-> Relu] under allow_mix_precision (adapter/tf/plugin/mixed_precision.h,
docs/graph_engine.md "Mixed precision"): the graph fusion's MatMulBiasAdd (graph_fusion.h
rewrite 3b) turns float16 whole, a and b in float16 and the bias kept float32 (CANN's MatMulV2
with a bias under mixed precision), instead of being split into a float16 MatMul and a float16
BiasAdd launch. On the tiny chip (910B-like: the cube starts from the bias in its bias table)
and on tiny_coupled (the 310P core, like the 910's: the vector unit adds the bias to the f32
tile in the UB), in a child per chip (the precision mode is read once per process).

- Raw MatMul + BiasAdd (+ Relu) in a tf.function, float32 arguments (cast to float16 for the
  cube by the pass): one MatMulBiasAdd cube launch (and on tiny_coupled, where C's rows are not
  whole 32-byte blocks, its packing copy), no MatMul, BiasAdd or Relu launch, and C rounded
  once: numpy's reference is the exact sum of the float16 operands plus the float32 bias,
  rounded to float16 once (RNE). The cube sums in float32, so each element may sit anywhere
  within the float32 accumulation bound (K + 2) * 2^-24 * sum |terms| of the exact value before
  that rounding; the result must be one of the float16 roundings of that interval (rounding is
  monotone: float16(v - tol) <= got <= float16(v + tol)), for most elements a single value. The
  unfused chain's two roundings (float16(float16(sum) + float16(bias))) break that bound
  somewhere in each case, so the check tells one rounding from two.
- A product read by a second node must not fuse: MatMul and BiasAdd stay separate float16
  launches, with the same result as numpy's two-rounding chain within that bound.
- A Keras MLP of Dense layers (ReLU and not): one MatMulBiasAdd per layer, no BiasAdd launch,
  TensorFlow's float32 CPU result within 1e-2 of the norm (tests/tf/test_fusion.py's).
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import DENSE_HELPERS, child_result  # noqa: E402  pylint: disable=wrong-import-position

CHILD = DENSE_HELPERS + r'''
out = {"raw": [], "read_twice": None, "mlp": None}
rng = np.random.default_rng(16)
for m, k, n, ta, tb, relu in DENSE_CASES:
    a, b, c, dense = dense_case(rng, m, k, n, ta, tb, relu)
    got, recs = second_run(dense, [a, b, c])
    out["raw"].append({"a": a.tolist(), "b": b.tolist(), "c": c.tolist(), "ta": ta, "tb": tb,
                       "relu": relu, "got": got.tolist(), "records": recs})

a, b = (rng.standard_normal((32, 32)).astype(np.float32) for _ in range(2))
c = rng.standard_normal(32).astype(np.float32)

def read_twice(a, b, c):
    p = tf.matmul(a, b)
    return tf.nn.bias_add(p, c) - p

got, recs = second_run(read_twice, [a, b, c])
out["read_twice"] = {"a": a.tolist(), "b": b.tolist(), "c": c.tolist(), "got": got.tolist(),
                     "records": recs}

model, x = dense_mlp(rng)
with tf.device("/CPU:0"):
    want = model(x).numpy()
got, recs = second_run(lambda t: model(t, training=False), [x])
out["mlp"] = {"got": got.tolist(), "want": want.tolist(), "records": recs}
print("RESULT " + json.dumps(out))
'''

U24 = 2.0 ** -24


def run_on(chip):
    return child_result(CHILD, extra_env={"NPUSIM_CHIP": chip, "TF_ENABLE_ONEDNN_OPTS": "0",
                                          "NPUSIM_PRECISION_MODE": "allow_mix_precision"})


@pytest.fixture(scope="module", params=["tiny", "tiny_coupled"])
def result(request):
    return run_on(request.param)


def cube_launches(records):
    """MatMulBiasAdd's cube kernels among the launch records (op type, kernel): on tiny_coupled
    a C whose rows are not whole 32-byte blocks takes a packing copy launch too."""
    return sum(t == "MatMulBiasAdd" and kernel.startswith("MatMul") for t, kernel in records)


def exact_terms(case):
    """The exact product of the float16 operands (float64: each product of two float16 values
    is exact and k is small) and the sum of the terms' magnitudes, per element."""
    a = np.asarray(case["a"], np.float32).astype(np.float16).astype(np.float64)
    b = np.asarray(case["b"], np.float32).astype(np.float16).astype(np.float64)
    a = a.T if case.get("ta") else a
    b = b.T if case.get("tb") else b
    return a @ b, np.abs(a) @ np.abs(b), a.shape[1]


def rounding_interval(v, tol):
    """The float16 values RNE rounding can give for anything within tol of v."""
    return (np.float16(v - tol).astype(np.float64), np.float16(v + tol).astype(np.float64))


def within(got, lo, hi, relu):
    if relu:
        lo, hi = np.maximum(lo, 0), np.maximum(hi, 0)
    return (got >= lo) & (got <= hi)


def test_matmul_bias_is_one_float16_launch_rounded_once(result):
    for case in result["raw"]:
        types = [t for t, _ in case["records"]]
        assert cube_launches(case["records"]) == 1, case["records"]
        assert not {"MatMul", "BiasAdd", "Relu"} & set(types), case["records"]
        prod, mag, k = exact_terms(case)
        bias = np.asarray(case["c"], np.float64)  # float32 values, kept so
        tol = (k + 2) * U24 * (mag + np.abs(bias))
        got = np.asarray(case["got"])
        lo, hi = rounding_interval(prod + bias, tol)
        assert within(got, lo, hi, case["relu"]).all(), (got, lo, hi)
        # Two roundings (MatMul in float16, then BiasAdd of the bias cast to float16) leave the
        # one-rounding interval somewhere: the check above tells them apart.
        twice = (np.float16(prod).astype(np.float64) +
                 np.float16(bias).astype(np.float64)).astype(np.float16).astype(np.float64)
        if case["relu"]:
            twice = np.maximum(twice, 0)
        assert not within(twice, lo, hi, case["relu"]).all()


def test_product_read_twice_stays_unfused(result):
    case = result["read_twice"]
    types = [t for t, _ in case["records"]]
    assert "MatMulBiasAdd" not in types and "MatMul" in types and "BiasAdd" in types, types
    prod, mag, k = exact_terms(case)
    bias = np.float16(np.asarray(case["c"], np.float32)).astype(np.float64)
    tol = (k + 2) * U24 * mag
    p_lo, p_hi = rounding_interval(prod, tol)  # the float16 MatMul's C
    # BiasAdd in float16 (the sum formed in float32, exact for these magnitudes, rounded once),
    # then the Sub likewise; monotone in p.
    y_lo = np.float16(p_lo + bias).astype(np.float64)
    y_hi = np.float16(p_hi + bias).astype(np.float64)
    lo = np.float16(y_lo - p_hi).astype(np.float64)
    hi = np.float16(y_hi - p_lo).astype(np.float64)
    got = np.asarray(case["got"])
    assert ((got >= lo) & (got <= hi)).all(), (got, lo, hi)


def test_dense_layers_fused_in_float16(result):
    mlp = result["mlp"]
    types = [t for t, _ in mlp["records"]]
    assert cube_launches(mlp["records"]) == 3, mlp["records"]
    assert not {"MatMul", "BiasAdd", "Relu"} & set(types), mlp["records"]
    assert all("f16" in kernel for t, kernel in mlp["records"] if t == "MatMulBiasAdd"), \
        mlp["records"]
    got, want = np.asarray(mlp["got"]), np.asarray(mlp["want"])
    assert np.linalg.norm(got - want) <= 1e-2 * np.linalg.norm(want)
