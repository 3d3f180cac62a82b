"""A TF graph's concurrent step replayed whole (NPUSIM_GRAPH_CONCURRENT=1 in a timing-only run,
NPUSIM_FUNCTIONAL=0; docs/chip_model.md "Launch groups replayed whole"): a graph of a long MatMul
beside a chain of two vector launches, run three times, each child process with replay on
(the plugin's default), with NPUSIM_REPLAY=off and with NPUSIM_REPLAY=check:

- on: the first run simulates its launch group, the next two are replayed, every launch with
  the first run's start (relative to the step's first launch) and cycles;
- off: nothing is replayed, and every run gives the same launches as the replayed ones;
- check: the later runs are replayed and verified against a fresh simulation (a difference
  would fail the child with the check's error), with the same launches again.
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

    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (512, 1024)).astype(np.float16)
    w = rng.uniform(-1, 1, (1024, 512)).astype(np.float16)
    z = rng.uniform(-1, 1, (256, 256)).astype(np.float16)

    def beside_chain(x, w, z):  # a long MatMul beside a short chain of two vector launches
        long = tf.matmul(x, w, name="long_matmul")
        chain = tf.nn.softmax(tf.nn.relu(z[:16], name="chain_relu"), name="chain_softmax")
        return tf.matmul(chain, long[:256], name="join")

    f = tf.function(beside_chain)
    runs = []
    with tf.device("/NPU:0"):
        for _ in range(3):
            npusim.clear_launch_records()
            f(x, w, z).numpy()
            recs = npusim.launch_records()
            first = min(r["start_cycle"] for r in recs)
            runs.append([[r["kernel"], r["start_cycle"] - first, r["cycles"], bool(r.get("replayed"))]
                         for r in recs])
    print("RESULT" + json.dumps(runs))
    """)

TIMING_ONLY = {"NPUSIM_FUNCTIONAL": "0", "NPUSIM_GRAPH_CONCURRENT": "1"}


@pytest.fixture(scope="module")
def runs():
    return {mode: child_result(CODE, extra_env=dict(TIMING_ONLY, **env))
            for mode, env in (("on", {}), ("off", {"NPUSIM_REPLAY": "off"}),
                              ("check", {"NPUSIM_REPLAY": "check"}))}


def timing(run):
    return [launch[:3] for launch in run]


def test_the_repeated_group_is_replayed_with_the_first_runs_timing(runs):
    first, second, third = runs["on"]
    assert len(first) >= 4  # the MatMul, the chain's two launches, the join (at least)
    assert not any(launch[3] for launch in first)
    assert all(launch[3] for launch in second + third)
    # Launches beside each other: the group's timing, not launches one after another.
    starts = [launch[1] for launch in first]
    assert starts.count(0) >= 2
    assert timing(second) == timing(first)
    assert timing(third) == timing(first)


def test_replay_off_simulates_every_run_alike(runs):
    for run in runs["off"]:
        assert not any(launch[3] for launch in run)
        assert timing(run) == timing(runs["on"][0])


def test_check_mode_verifies_the_replays(runs):
    first, second, third = runs["check"]
    assert not any(launch[3] for launch in first)
    assert all(launch[3] for launch in second + third)
    for run in (first, second, third):
        assert timing(run) == timing(runs["on"][0])
