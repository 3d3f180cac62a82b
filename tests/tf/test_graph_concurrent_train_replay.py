"""A TF training step replayed whole under NPUSIM_GRAPH_CONCURRENT=1 in a timing-only run
(NPUSIM_FUNCTIONAL=0; docs/chip_model.md "Launch groups replayed whole", "by blocks and
offsets"): a small CNN (conv, batch norm, dense) trained with Adam, four steps in a child process,
with replay on (the plugin's default) and with NPUSIM_REPLAY=check.

TensorFlow places some of a training step's tensors at new addresses every step (the optimizer's
step counter, the batch norm's saved statistics), so the step's group replays only by its
translated key (arguments by block and offset): from the third step on every launch is replayed
(the second step's arguments share blocks otherwise than the first's: the first step's Adam
updates read the moments' initial zeros, one buffer per shape, a layout the L2's lines filed by
block may time otherwise (ResNet-50's updates it does; this model's not), so another key; the
replay log names the first such argument), every step's launches with the first step's start
(relative to the step's first launch) and cycles; under check every replay is also
simulated and compared (a difference fails the child with the check's error), with the same
launches again.
"""

import textwrap

import pytest

pytest.importorskip("tensorflow")

from conftest import child_result  # noqa: E402  pylint: disable=wrong-import-position

CODE = textwrap.dedent("""
    import json
    import numpy as np
    import npusim
    import tensorflow as tf

    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (4, 16, 16, 8)).astype(np.float32)
    y = rng.integers(0, 10, (4,)).astype(np.int64)
    runs = []
    with tf.device("/NPU:0"):
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([
            tf.keras.Input((16, 16, 8)),
            tf.keras.layers.Conv2D(16, 3, padding="same", use_bias=False),
            tf.keras.layers.BatchNormalization(),
            tf.keras.layers.ReLU(),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(10),
        ])
        opt = tf.keras.optimizers.Adam(1e-3)
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        xt, yt = tf.constant(x), tf.constant(y)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = loss_fn(yt, model(xt, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        for _ in range(4):
            npusim.clear_launch_records()
            step().numpy()
            recs = [r for r in npusim.launch_records() if r.get("graph_run")]
            first = min(r["start_cycle"] for r in recs)
            runs.append(sorted([r["kernel"], r["start_cycle"] - first, r["cycles"],
                                bool(r.get("replayed"))] for r in recs))
    print("RESULT" + json.dumps(runs))
    """)

TIMING_ONLY = {"NPUSIM_FUNCTIONAL": "0", "NPUSIM_GRAPH_CONCURRENT": "1"}


@pytest.fixture(scope="module")
def replay_log(tmp_path_factory):
    """The replay log of the "on" run (NPUSIM_REPLAY_LOG): one line per launch, tab-separated."""
    return tmp_path_factory.mktemp("replay_log") / "on.tsv"


@pytest.fixture(scope="module")
def runs(replay_log):
    return {mode: child_result(CODE, extra_env=dict(TIMING_ONLY, **env))
            for mode, env in (("on", {"NPUSIM_REPLAY_LOG": str(replay_log)}),
                              ("check", {"NPUSIM_REPLAY": "check"}))}


def timing(run):
    return [launch[:3] for launch in run]


def test_the_training_step_replays_after_its_first_run(runs):
    steps = runs["on"]
    assert len(steps[0]) >= 10  # forward, backward and the optimizer's updates
    assert not any(launch[3] for launch in steps[0])
    # From the third step on every launch of the step's groups is replayed; every step has the
    # first step's timing.
    for later in steps[2:]:
        assert all(launch[3] for launch in later)
    for later in steps[1:]:
        assert timing(later) == timing(steps[0])


def test_check_mode_verifies_the_training_replays(runs):
    steps = runs["check"]
    assert not any(launch[3] for launch in steps[0])
    for later in steps[2:]:
        assert all(launch[3] for launch in later)
    for step in steps:
        assert timing(step) == timing(runs["on"][0])


def test_the_log_names_what_the_second_steps_layout_differs_in(runs, replay_log):
    # The second step's group finds no recording of its layout: its replay log lines name the
    # first argument laid out otherwise than in the first step's recording of the same launches.
    lines = [line.split("\t") for line in replay_log.read_text().splitlines()]
    notes = [f[5] for f in lines if len(f) >= 6 and "group recorded, translatable" in f[5]]
    assert any("not laid out as the last recording of these launches: launch " in n
               and "('FusedVariableUpdate_f32') argument 1 shares a block with launch " in n
               and "in the recording, not here" in n for n in notes)
