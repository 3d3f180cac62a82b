"""MatMul -> BiasAdd [-> Relu] on a coupled chip (tiny_coupled: the 310P's core, no bias table,
C leaves L0C through the UB; adapter/tf/plugin/graph_fusion.h rewrite 3b, docs/compiler.md
"MatMul"): the MatMulBiasAdd the graph fusion makes adds the bias (and applies the ReLU) on
each f32 tile in the UB, in the MatMul's own kernel, rather than by a BiasAdd launch after it.

Raw MatMul + BiasAdd (+ Relu) with every transpose the cube takes, and a Keras MLP of Dense
layers (with and without ReLU, a width that is not whole 32-byte rows), in a tf.function on the
NPU, in a child per setting (NPUSIM_FUSION_EPILOGUE is read once per process):

- the outputs match TensorFlow on the CPU within tests/tf/test_fusion.py's 1e-2 of the norm
  (allow_fp32_to_fp16: the cube's operands are rounded to fp16);
- no BiasAdd kernel is launched: every Dense is its MatMul's launches only;
- with the epilogue fusion off (NPUSIM_FUSION_EPILOGUE=0) the same graph takes one BiasAdd and,
  with ReLU, one Relu launch more per Dense.
"""

import json
import os
import sys

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import DENSE_HELPERS, run_child  # noqa: E402  pylint: disable=wrong-import-position

RTOL = 1e-2

CHILD_CODE = DENSE_HELPERS + r'''
def err(got, want):
    want = np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))

result = {}
rng = np.random.default_rng(6)
for m, k, n, ta, tb, relu in DENSE_CASES:
    x, w, c, dense = dense_case(rng, m, k, n, ta, tb, relu)
    with tf.device("/CPU:0"):
        want = dense(tf.constant(x), tf.constant(w), tf.constant(c)).numpy()
    got, recs = second_run(dense, [x, w, c])
    result[f"raw {m}x{k}x{n} ta={ta} tb={tb} relu={relu}"] = {
        "error": err(got, want), "records": recs, "dense": 1, "relu": int(relu)}

model, x = dense_mlp(rng)
with tf.device("/CPU:0"):
    want = model(x).numpy()
got, recs = second_run(lambda t: model(t, training=False), [x])
result["mlp"] = {"error": err(got, want), "records": recs, "dense": 3, "relu": 2}
print("RESULT " + json.dumps(result))
'''


def run_on_coupled(fusion):
    env = {"NPUSIM_CHIP": "tiny_coupled"}
    if not fusion:
        env["NPUSIM_FUSION_EPILOGUE"] = "0"
    proc = run_child(CHILD_CODE, timeout=600, extra_env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def fused():
    return run_on_coupled(True)


@pytest.fixture(scope="module")
def unfused():
    return run_on_coupled(False)


def test_outputs_match_the_cpu(fused, unfused):
    for res in (fused, unfused):
        for case, r in res.items():
            assert r["error"] < RTOL, (case, r["error"])


def test_the_bias_rides_in_the_matmul_kernel(fused):
    for case, r in fused.items():
        types = [t for t, _ in r["records"]]
        assert types.count("MatMulBiasAdd") >= r["dense"], (case, r["records"])
        assert "MatMul" not in types and "BiasAdd" not in types and "Relu" not in types, \
            (case, r["records"])
        assert not [k for _, k in r["records"] if k.startswith("BiasAdd")], (case, r["records"])


def test_one_launch_less_per_dense_than_unfused(fused, unfused):
    for case, r in fused.items():
        n_unfused = len(unfused[case]["records"])
        assert len(r["records"]) == n_unfused - r["dense"] - r["relu"], \
            (case, r["records"], unfused[case]["records"])
