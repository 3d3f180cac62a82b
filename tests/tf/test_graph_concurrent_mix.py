"""The filter gradients 1:1 under streams (docs/graph_engine.md, "The filter gradients 1:1 under
streams"): the NpuGraph plan built with NPUSIM_GRAPH_CONCURRENT=1 compiles its steps with the
compiler's mix_one_to_one option "filter_grad", so that a filter gradient that adds its parts in
its own vector cores runs one vector core per cube core (the launch record's aiv_per_aic 1)
where NPUSIM_MIX_ONE_TO_ONE is unset; in order it keeps the chip's ratio (aiv_per_aic 0, 1:2 on
the tiny chip); an explicit NPUSIM_MIX_ONE_TO_ONE wins either way ("0" under streams: 1:2;
"filter_grad" in order: 1:1).

A conv training step (plain SGD on a 3x3 filter, few output channels over many positions, so
that the filter gradient splits its k over the cube cores and adds the parts in the kernel), in
a child process per setting; the step's filter gradient and the updated filter against
TensorFlow on the CPU, and bit for bit across the settings (each element's parts are added in
part order whatever the ratio). One child runs the step in order and then, with the switch
set, a new function of the same step under streams: the compiled-op cache holds the filter
gradient twice, once with the option in its key.
"""

import textwrap

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from conftest import child_result  # noqa: E402  pylint: disable=wrong-import-position

CODE = textwrap.dedent("""
    import json
    import os
    import numpy as np
    import npusim
    import tensorflow as tf

    rng = np.random.default_rng(11)
    x = rng.uniform(-1, 1, (2, 32, 32, 16)).astype(np.float16)
    dy = rng.uniform(-1, 1, (2, 32, 32, 16)).astype(np.float16)
    w0 = rng.uniform(-1, 1, (3, 3, 16, 16)).astype(np.float16)

    def run(settings):
        for name, value in settings.items():  # read when the function's plan is built
            os.environ[name] = value
        with tf.device("/NPU:0"):
            w = tf.Variable(w0)
            xt, dyt = tf.constant(x), tf.constant(dy)

            @tf.function
            def step():
                with tf.GradientTape() as tape:
                    y = tf.nn.conv2d(xt, w, strides=1, padding="SAME")
                    loss = tf.reduce_sum(tf.cast(y * dyt, tf.float32))
                g = tape.gradient(loss, w)
                w.assign_sub(tf.cast(0.01, tf.float16) * g)
                return g

            npusim.clear_launch_records()
            g = step().numpy()
        recs = npusim.launch_records()
        return {"filter_grad": [[r["kernel"], r["aiv_per_aic"], bool(r.get("graph_run"))]
                                for r in recs if r.get("op_type") == "Conv2DBackpropFilter"],
                "grad": g.view(np.uint16).tolist(),
                "w": w.numpy().view(np.uint16).tolist()}

    out = [run({})]
    if os.environ.get("SECOND_UNDER_STREAMS") == "1":
        out.append(run({"NPUSIM_GRAPH_CONCURRENT": "1"}))
        out.append([k for k in npusim.compiled_ops()["keys"] if k.startswith("Conv2DBackpropFilter")])
    print("RESULT" + json.dumps(out))
    """)


@pytest.fixture(scope="module")
def runs():
    """{setting: [run, ...]}; "unset": in order, then under streams in the same process (and the
    compiled-op cache's Conv2DBackpropFilter keys)."""
    return {
        "unset": child_result(CODE, extra_env={"SECOND_UNDER_STREAMS": "1"}),
        "streams, switch 0": child_result(CODE, extra_env={"NPUSIM_GRAPH_CONCURRENT": "1",
                                                           "NPUSIM_MIX_ONE_TO_ONE": "0"}),
        "in order, switch filter_grad":
            child_result(CODE, extra_env={"NPUSIM_MIX_ONE_TO_ONE": "filter_grad"}),
    }


def ratios(run):
    """The aiv_per_aic of the step's filter gradient launches (run as part of the NpuGraph)."""
    launches = run["filter_grad"]
    assert launches and all(in_graph for _, _, in_graph in launches), launches
    return [aiv_per_aic for _, aiv_per_aic, _ in launches]


def test_the_filter_gradient_runs_one_to_one_under_streams_by_default(runs):
    in_order, streams, keys = runs["unset"]
    assert ratios(in_order) == [0], in_order["filter_grad"]
    assert ratios(streams) == [1], streams["filter_grad"]
    # The same op compiled twice in one process: the option is in the second one's key.
    assert len(keys) == 2, keys
    assert sum("mix_one_to_one" in k for k in keys) == 1, keys


def test_an_explicit_switch_wins(runs):
    assert ratios(runs["streams, switch 0"][0]) == [0]
    assert ratios(runs["in order, switch filter_grad"][0]) == [1]


def test_the_results_match_the_cpu_and_each_other(tf, runs):
    rng = np.random.default_rng(11)  # the child's inputs
    x = rng.uniform(-1, 1, (2, 32, 32, 16)).astype(np.float16)
    dy = rng.uniform(-1, 1, (2, 32, 32, 16)).astype(np.float16)
    w0 = rng.uniform(-1, 1, (3, 3, 16, 16)).astype(np.float16)
    with tf.device("/CPU:0"):
        ref = tf.compat.v1.nn.conv2d_backprop_filter(
            tf.constant(x.astype(np.float32)), tf.constant(w0.shape),
            tf.constant(dy.astype(np.float32)), strides=[1, 1, 1, 1], padding="SAME").numpy()
    first = runs["unset"][0]
    grad = np.array(first["grad"], np.uint16).view(np.float16).reshape(w0.shape)
    # f16 products summed in f32 over 2,048 positions, the sum rounded to f16 once.
    scale = np.abs(ref).max()
    assert np.abs(grad.astype(np.float32) - ref).max() <= 2e-3 * scale
    w = np.array(first["w"], np.uint16).view(np.float16).reshape(w0.shape)
    w_ref = (w0.astype(np.float32) - np.float32(np.float16(0.01)) * grad.astype(np.float32))
    assert np.abs(w.astype(np.float32) - w_ref).max() <= 2e-3 * np.abs(w_ref).max()
    for setting, results in runs.items():
        for run in results[:2] if setting == "unset" else results:
            assert run["grad"] == first["grad"], setting
            assert run["w"] == first["w"], setting
