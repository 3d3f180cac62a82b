"""Launch replay under TensorFlow (docs/chip_model.md "Launch replay"): the small CNN on the
tiny chip predicts, trains a few steps (tensors at new addresses each step, so launches replay
after the address check), then predicts again (the same tf.function with new weights, so
replayed kernels compute on new data); losses, predictions and every launch's
the launched kernels are the same whether launches are replayed (NPUSIM_REPLAY=on, the
default), simulated every time (off) or replayed and verified against a simulation of each
(check: any difference in memory, cycles or counters is an error, which would fail the op).
Each mode runs in its own child process (the switch is read when the chip is created). Every
launch's cycles are compared across the processes, launch by launch of each TF op: TF's order of
independent ops may vary, but a launch's timing does not depend on where its tensors lie
(docs/tf_plugin.md, "Device memory: the same report twice").
"""

import os
import sys

import pytest

pytest.importorskip("tensorflow")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import CNN_PREDICT_TRAIN_PREDICT, child_result  # noqa: E402  pylint: disable=wrong-import-position

CHILD = r'''
import json, os, sys
os.environ["NPUSIM_REPLAY"] = sys.argv[1] if len(sys.argv) > 1 else "{mode}"
import numpy as np
import npusim
''' + CNN_PREDICT_TRAIN_PREDICT.replace("{", "{{").replace("}", "}}") + r'''
recs = npusim.launch_records()
print("RESULT" + json.dumps({{
    "losses": losses, "preds": preds,
    "cycles": [[r["kernel"], r["cycles"], r["ok"], r.get("op_name", "")] for r in recs],
    "replayed": sum(bool(r["replayed"]) for r in recs),
    }}))
'''


def run_mode(mode):
    return child_result(CHILD.format(mode=mode))


def cycles_by_op(run):
    """{(op name, kernel): [cycles of each launch, in order]}."""
    launches = {}
    for kernel, cycles, _, op_name in run["cycles"]:
        launches.setdefault((op_name, kernel), []).append(cycles)
    return launches


def test_replay_matches_simulating_every_launch():
    off = run_mode("off")
    on = run_mode("on")
    check = run_mode("check")
    assert off["replayed"] == 0
    # The predictions after the first repeat its launches; training steps repeat the first
    # step's launches at other addresses, where the L2 sees the same.
    # Every launch after the first prediction and the first training step repeats one of theirs
    # (at other addresses): at least half of a run's launches replay.
    for run in (on, check):
        assert run["replayed"] >= len(run["cycles"]) // 2, (run["replayed"], len(run["cycles"]))
    for run in (on, check):
        assert run["losses"] == off["losses"]
        assert run["preds"] == off["preds"]
        assert cycles_by_op(run) == cycles_by_op(off)
        assert all(ok for _, _, ok, _ in run["cycles"])
    assert off["losses"][-1] < off["losses"][0]  # it trained
