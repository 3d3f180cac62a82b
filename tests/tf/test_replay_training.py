"""Launch replay across training steps (docs/chip_model.md "Launch replay"): the main job's MLP
(784-128-10, Dropout, Adam) on the tiny chip trains five steps; from the third step on, every
launch of its matrix products and fused variable updates must be a replay of an earlier one
(its tensors lie at new addresses every step, so each passes the address check first). The
first two steps record: the first traces and compiles, and in the second Adam's slots, still
as initialised, may share buffers, which places the update's tensors unlike later steps. Dropout's
random op is left out: its timing depends on its key, which changes every step (ops/random.h).

Regression: the check looked a core's GM ranges up in the order its transfers took effect, not
the order they reached the memory system; where a core's pipes overlap (an MTE3 store still
running while the next MTE2 load starts and ends) it refused launches that hit and missed
exactly as recorded, and those were simulated every step (on this chip, a cast feeding the
MatMul; on the 910b, the 784x128 Adam update).
"""

import os
import sys

import pytest

pytest.importorskip("tensorflow")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import child_result  # noqa: E402  pylint: disable=wrong-import-position

CHILD = r'''
import json
import npusim
import tensorflow as tf
import keras
import models
x, y = models.synthetic_data("mlp", batch=8, seed=0)
with tf.device("/NPU:0"):
    model = models.build("mlp", seed=0)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=models.loss("mlp"),
                  jit_compile=False)
    steps = []
    for _ in range(5):
        npusim.clear_launch_records()
        loss = float(model.train_on_batch(x, y))
        steps.append([[r["op_type"], r["kernel"], bool(r["replayed"])]
                      for r in npusim.launch_records()])
print("RESULT" + json.dumps({"steps": steps, "loss": loss}))
'''


def test_matmuls_and_variable_updates_replay_from_the_third_step():
    run = child_result(CHILD)
    checked = ("MatMul", "FusedVariableUpdate")
    first = [r for r in run["steps"][0] if r[0] in checked]
    assert any(r[0] == "FusedVariableUpdate" for r in first), run["steps"][0]
    assert any(r[0] == "MatMul" for r in first), run["steps"][0]
    assert not all(r[2] for r in first)  # the first step simulates (records) them
    for step, records in enumerate(run["steps"][2:], start=2):
        simulated = [r for r in records if r[0] in checked and not r[2]]
        assert not simulated, f"step {step}: simulated again: {simulated}"
