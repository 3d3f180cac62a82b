"""Timing-only TensorFlow runs (docs/tf_plugin.md, "Timing-only runs"): the small CNN on the
tiny chip predicts, trains three steps with Adam and predicts again, once computing
(NPUSIM_FUNCTIONAL=1) and once timing-only (npusim.configure(functional=False)), each in its own
child process (the setting is read when the device opens). Both launch the same kernels, TF op
by TF op (TF may order independent ops differently, so launches are compared per op), and leave
out the same derived launches (docs/tf_plugin.md, "Weights kept in fp16"). Every launch of a
kernel that does not read device memory with its scalar unit (launch records' loads_data) has
the same cycles and counters in both runs; the others (Philox's seeds, int64 casts) read zeros
where a kernel computed their input, and only they may differ. The timing-only run computed
nothing: its outputs are the zeros of device memory that holds no data.
"""

import json
import os
import sys

import pytest

pytest.importorskip("tensorflow")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import CNN_PREDICT_TRAIN_PREDICT, child_result, run_child  # noqa: E402  pylint: disable=wrong-import-position

CHILD = r'''
import json, sys
import npusim
npusim.configure(functional={functional})
''' + CNN_PREDICT_TRAIN_PREDICT.replace("{", "{{").replace("}", "}}") + r'''
recs = npusim.launch_records(with_counters=True)
try:
    npusim.configure(functional=not {functional})
    switched = "no error"
except npusim.NpusimError as e:
    switched = str(e)
npusim.configure(functional={functional})  # the setting it has: fine
print("RESULT" + json.dumps({{
    "losses": losses, "preds": preds, "switched": switched,
    "settings": npusim.device_info()["settings"],
    "launches": [[r.get("op_name", ""), r["kernel"], r["block_dim"], r["cycles"], r["ok"],
                  r["loads_data"], r["counters"]] for r in recs],
    }}))
'''


def run(functional):
    return child_result(CHILD.format(functional=functional), timeout=900)


def by_op(result):
    """{(op name, kernel, loads_data): [(block_dim, cycles, counters) of each launch, in
    order]}."""
    launches = {}
    for op_name, kernel, block_dim, cycles, ok, loads, counters in result["launches"]:
        assert ok, (op_name, kernel)
        launches.setdefault((op_name, kernel, loads), []).append(
            (block_dim, cycles, json.dumps(counters, sort_keys=True)))
    return launches


def flat(values):
    if isinstance(values, list):
        for v in values:
            yield from flat(v)
    else:
        yield values


def test_timing_only_takes_the_cycles_and_counts_of_a_functional_run():
    functional = run(True)
    timing = run(False)
    assert functional["settings"]["functional"] is True
    assert timing["settings"]["functional"] is False
    f, t = by_op(functional), by_op(timing)
    assert sorted(f) == sorted(t)
    data_dependent = set()
    for key in f:
        assert [b for b, _, _ in t[key]] == [b for b, _, _ in f[key]], key
        if not key[2]:
            assert t[key] == f[key], key
        elif t[key] != f[key]:
            data_dependent.add(key[1])
    # Among those compared exactly: the convolutions and their gradients (FilterGrad for the
    # filter), the dense layer (MatMul), pooling.
    exact = {kernel for _, kernel, loads in f if not loads}
    for family in ("Conv2D_", "Conv2DBackpropInput", "FilterGrad", "MatMul", "MaxPoolGrad"):
        assert any(k.startswith(family) for k in exact), (family, sorted(exact))
    # Those that took other cycles here: the int64 casts (scalar unit); Philox's took other
    # cycles too while its counter carries branched on the loaded counter (docs/compiler.md).
    assert data_dependent and all(k.startswith(("RandomUniform", "Cast_")) and
                                  ("RandomUniform" in k or "s64" in k) for k in data_dependent)
    # The functional run computed and trained; the timing-only one computed nothing.
    assert functional["losses"][-1] < functional["losses"][0]
    assert any(v != 0 for v in flat(functional["preds"]))
    assert all(v == 0 for v in flat(timing["preds"]))
    assert timing["losses"] == [0.0, 0.0, 0.0]
    # The setting is fixed once the device is open.
    for result, other in ((functional, "False"), (timing, "True")):
        assert "already in use" in result["switched"]
        assert f"cannot change functional {other == 'False'} -> {other}" in result["switched"]


def test_bad_functional_setting_is_named():
    proc = run_child("import npusim\nnpusim.configure(functional='no')\n")
    assert proc.returncode != 0
    assert "functional must be True or False" in proc.stderr
    proc = run_child("import npusim\nprint(npusim.device_info().get('env_error'))\n",
                     extra_env={"NPUSIM_FUNCTIONAL": "yes"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "NPUSIM_FUNCTIONAL: 'yes' is not 0 (timing-only) or 1 (functional)" in proc.stdout
