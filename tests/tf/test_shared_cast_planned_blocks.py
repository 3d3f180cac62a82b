"""A cast shared inside a graph (docs/graph_engine.md, "Casts shared inside a graph") is read
from its planned buffer: the launch reading it lists that arena buffer among its planned buffers
(rt::LaunchLabel::planned_blocks), so the cold L2 files the cast's lines by that buffer, as
those of the launch's other tensors, and no argument lies in the arena outside every buffer
listed. An argument there made the launch's blocks overlap (the arena and the planned buffers
in it), which the launch replay keys by address (append_fixed_blocks): every layer's copy was
simulated again (ResNet-50's filter gradients at batch 32 and more).

Two layers, each a MatMul and ReLU whose output both following MatMuls read (cast to fp16 once
under the default precision mode allow_fp32_to_fp16), run twice in a child process with the
replay on (its replay log kept), off, and under NPUSIM_REPLAY=check (every replay simulated too
and compared; a difference fails the child). Reference: every launch's cycles with the replay
off; the values from numpy on the fp16-rounded operands (the cube multiplies them exactly,
accumulating in fp32), up to a flip of fp16 rounding where the fp32 sums differ in order: one
fp16 ulp (2^-10 relative) of every operand of the last MatMuls (the sum of |products| of each
output element times 2^-10).
"""

import textwrap

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from conftest import child_result  # noqa: E402  pylint: disable=wrong-import-position

N = 64  # every operand N x N

CODE = textwrap.dedent(f"""
    import json
    import numpy as np
    import npusim
    import tensorflow as tf

    rng = np.random.default_rng(5)
    args = [rng.uniform(-1, 1, ({N}, {N})).astype(np.float32) for _ in range(7)]

    @tf.function
    def two_layers(x, w1, wa1, wb1, w2, wa2, wb2):
        out = x
        for w, wa, wb in ((w1, wa1, wb1), (w2, wa2, wb2)):
            h = tf.nn.relu(tf.matmul(out, w))  # both MatMuls below read h
            out = tf.matmul(h, wa) + tf.matmul(h, wb)
        return out

    runs = []
    with tf.device("/NPU:0"):
        ts = [tf.constant(a) for a in args]
        for _ in range(2):
            npusim.clear_launch_records()
            y = two_layers(*ts).numpy()
            recs = npusim.launch_records()
            assert all(r["ok"] for r in recs)
            runs.append([[r["kernel"], r["cycles"], bool(r.get("replayed"))] for r in recs])
    print("RESULT" + json.dumps({{"runs": runs, "y": y.tolist()}}))
    """)


def reference():
    """The two layers' output on the fp16-rounded operands, and its tolerance per element."""
    rng = np.random.default_rng(5)
    x, w1, wa1, wb1, w2, wa2, wb2 = [rng.uniform(-1, 1, (N, N)).astype(np.float32)
                                     for _ in range(7)]
    r16 = lambda a: a.astype(np.float16).astype(np.float32)  # noqa: E731
    out = x
    for w, wa, wb in ((w1, wa1, wb1), (w2, wa2, wb2)):
        h = np.maximum(r16(out) @ r16(w), 0)
        out = r16(h) @ r16(wa) + r16(h) @ r16(wb)
        magnitude = np.abs(r16(h)) @ (np.abs(r16(wa)) + np.abs(r16(wb)))
    return out, magnitude * 2.0**-10


@pytest.fixture(scope="module")
def replay_log(tmp_path_factory):
    return tmp_path_factory.mktemp("replay_log") / "on.tsv"


@pytest.fixture(scope="module")
def runs(replay_log):
    return {mode: child_result(CODE, extra_env=env)
            for mode, env in (("on", {"NPUSIM_REPLAY_LOG": str(replay_log)}),
                              ("off", {"NPUSIM_REPLAY": "off"}),
                              ("check", {"NPUSIM_REPLAY": "check"}))}


def test_each_layer_casts_its_relu_output_once(runs):
    for run in runs["off"]["runs"]:
        matmuls = sum(1 for k, _, _ in run if k.startswith("MatMul"))
        casts = sum(1 for k, _, _ in run if k.startswith("Cast"))
        # Every MatMul casts its two fp32 operands but the second reader of each h.
        assert (matmuls, casts) == (6, 2 * 6 - 2)


def test_no_launch_has_overlapping_blocks(runs, replay_log):
    lines = [line.split("\t") for line in replay_log.read_text().splitlines()]
    assert len(lines) == sum(len(run) for run in runs["on"]["runs"])
    notes = [f[5] for f in lines if len(f) >= 6]
    assert not [n for n in notes if "overlap" in n]


def test_replays_time_as_simulated(runs):
    def timing(mode):
        return [[k, c] for run in runs[mode]["runs"] for k, c, _ in run]

    assert not any(r for run in runs["off"]["runs"] for _, _, r in run)
    assert any(r for _, _, r in runs["on"]["runs"][0])  # the later layer's launches
    assert all(r for _, _, r in runs["on"]["runs"][1])
    assert timing("on") == timing("off")
    assert timing("check") == timing("off")


def test_values_match_numpy(runs):
    want, tolerance = reference()
    for mode in ("on", "off", "check"):
        got = np.array(runs[mode]["y"])
        assert got.shape == want.shape
        assert (np.abs(got - want) <= tolerance).all(), np.abs(got - want).max()
