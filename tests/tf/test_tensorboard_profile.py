"""TensorFlow's profiler on the NPU (docs/reports.md, "TensorBoard (TensorFlow's profiler)"): a Keras
fit with TensorBoard(profile_batch=...) writes an xplane.pb whose NPU plane holds the kernels of
the profiled steps. The plane is parsed with TensorFlow's own xplane proto and checked against the
report that npusim.write_report() writes from the same launch records: every kernel of the
window, its TF node name and op type, and its start and duration in ps from the chip's clock."""

import csv
import glob
import os
import textwrap
from fractions import Fraction

import numpy as np
import pytest
import yaml

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
xplane_pb2 = pytest.importorskip("tensorflow.tsl.profiler.protobuf.xplane_pb2")

PLANE = "/device:CUSTOM:NPU:0"


def _ps(cycles, clock_mhz):
    """cycles at clock_mhz in ps, rounded half away from zero (cycles >= 0), exactly."""
    return int(Fraction(cycles) * 10**6 / Fraction(clock_mhz) + Fraction(1, 2))


def _xspace(logdir):
    files = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    assert len(files) == 1, files
    space = xplane_pb2.XSpace()
    with open(files[0], "rb") as f:
        space.ParseFromString(f.read())
    return space


def _stats(plane, holder):
    names = {k: v.name for k, v in plane.stat_metadata.items()}
    out = {}
    for s in holder.stats:
        kind = s.WhichOneof("value")
        out[names[s.metadata_id]] = getattr(s, kind) if kind else None
    return out


def _events(plane, line):
    for e in line.events:
        yield plane.event_metadata[e.metadata_id].name, e, _stats(plane, e)


def _report_rows(d):
    with open(os.path.join(d, "op_summary.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    with open(os.path.join(d, "chip.yaml")) as f:
        clock = yaml.safe_load(f)["clock_mhz"]
    return rows, clock


def _classifier():
    """A 32-8-3 classifier trained with Adam (its update kernels are in every step)."""
    keras.utils.set_random_seed(5)
    inputs = keras.Input((32,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.fixture(scope="module")
def keras_profile(npusim, tf, tmp_path_factory):  # pylint: disable=unused-argument
    """Four training steps; Keras' TensorBoard callback profiles steps 2 and 3."""
    pytest.importorskip("tensorboard", reason="Keras' TensorBoard callback needs tensorboard "
                        "(requirements-tf.txt)")
    logdir, report = tmp_path_factory.mktemp("tb"), tmp_path_factory.mktemp("report")
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((64, 32)).astype(np.float32), rng.integers(0, 3, 64)
    model = _classifier()
    before = len(npusim.launch_records())
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0,
              callbacks=[keras.callbacks.TensorBoard(log_dir=str(logdir), profile_batch=(2, 3))])
    assert model.optimizer.iterations.numpy() == 4
    npusim.write_report(str(report))
    rows, clock = _report_rows(str(report))
    return {"space": _xspace(str(logdir)), "rows": rows, "clock": clock,
            "fit_launches": npusim.launch_records()[before:]}


def _npu_plane(space):
    planes = [p for p in space.planes if p.name == PLANE]
    assert len(planes) == 1, [p.name for p in space.planes]
    return planes[0]


def _kernel_events(plane):
    return [ev for line in plane.lines if line.name.startswith("Stream #")
            for ev in _events(plane, line)]


def test_npu_plane_holds_the_window_kernels_as_the_report_times_them(keras_profile):
    space, rows, clock = keras_profile["space"], keras_profile["rows"], keras_profile["clock"]
    assert any(p.name == "/host:CPU" and p.lines for p in space.planes)  # TensorFlow's host ops
    plane = _npu_plane(space)
    pstats = _stats(plane, plane)
    assert pstats["clock_mhz"] == clock and pstats["chip"] == "tiny"
    origin, end = pstats["origin_cycle"], pstats["end_cycle"]
    # Exactly the report's tasks that started inside the profiled window, in order.
    window = [r for r in rows if origin <= int(r["task_start_cycles"]) < end]
    kernels = _kernel_events(plane)
    assert len(kernels) == len(window) > 0
    by_start = {int(r["task_start_cycles"]): r for r in window}
    for name, e, st in kernels:
        r = by_start[st["start_cycle"]]
        assert name == r["kernel"]
        assert st["tf_op"] == f'{r["Op Name"]}:{r["OP Type"]}'
        assert st["cycles"] == int(r["task_duration_cycles"])
        # The chip's clock onto the profile's timeline: ps after the window's origin.
        assert e.duration_ps == _ps(int(r["task_duration_cycles"]), clock), r
        assert e.offset_ps == _ps(int(r["task_start_cycles"]) - origin, clock), r
        assert st["task_type"] == r["Task Type"] and st["block_dim"] == int(r["Block Dim"])
    # The profiled steps are two of the fit's four: the window holds half of its training-step
    # kernels (the fit's launches less the few that run once, before the first step).
    matmuls = [st for _, _, st in kernels if st["tf_op"].endswith(":MatMul")]
    fit_matmuls = [r for r in keras_profile["fit_launches"] if r.get("op_type") == "MatMul"]
    assert len(fit_matmuls) == 2 * len(matmuls) > 0
    # (The Dense layers' MatMul -> BiasAdd -> Relu run fused: MatMulBiasAdd.)
    assert {st["tf_op"].rsplit(":", 1)[1] for _, _, st in kernels} >= {"MatMul", "MatMulBiasAdd",
                                                                         "ReluGrad"}


def test_tf_ops_line_spans_each_op_run_over_its_kernels(keras_profile):
    plane = _npu_plane(keras_profile["space"])
    [line] = [ln for ln in plane.lines if ln.name == "TensorFlow Ops"]
    kernels = sorted(_kernel_events(plane), key=lambda k: k[1].offset_ps)
    runs = list(_events(plane, line))
    assert runs
    covered = 0
    for name, e, st in runs:
        assert st["tf_op"].startswith(name + ":")
        inside = [k for k in kernels if e.offset_ps <= k[1].offset_ps
                  and k[1].offset_ps + k[1].duration_ps <= e.offset_ps + e.duration_ps]
        assert [k[0] for k in inside] == st["kernels"].split(","), name
        assert all(k[2]["tf_op"] == st["tf_op"] for k in inside)
        covered += len(inside)
    assert covered == len(kernels)


def test_profiler_start_stop_around_eager_ops(npusim, tf, tmp_path):  # pylint: disable=unused-argument
    """tf.profiler.experimental.start/stop directly: the two eager ops' kernels, nothing else."""
    a = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 4))
    with tf.device("/NPU:0"):
        (a * 2.0).numpy()  # before the window
        tf.profiler.experimental.start(str(tmp_path))
        b = tf.math.exp(a)
        c = tf.linalg.matmul(b, b, transpose_b=True)
        c.numpy()
        tf.profiler.experimental.stop()
        (a + 1.0).numpy()  # after it
    plane = _npu_plane(_xspace(str(tmp_path)))
    types = [st["tf_op"].rsplit(":", 1)[1] for _, _, st in _kernel_events(plane)]
    assert types[0] == "Exp" and types[-1] == "MatMul", types
    assert set(types) == {"Exp", "MatMul"}, types


def test_a_plane_per_npu_with_its_launches_and_collectives(tmp_path):
    """tf.profiler around a MirroredStrategy step on 2 tiny NPUs: one plane per NPU, each with
    the kernels that chip ran in the window (its launch records between its timeline at start and
    at stop) and a Communication line with the collectives of the window, timed as the driver's
    collective records, on one clock (a collective starts at the same ps on both planes)."""
    from conftest import child_result, mlp_on_two_npus  # pylint: disable=import-outside-toplevel
    logdir = tmp_path / "tb"
    result = child_result(mlp_on_two_npus(32) + textwrap.dedent(f"""
        with tf.distribute.MirroredStrategy().scope():
            model = build()
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)  # compiles
        before = npusim.system_info()["timeline_cycles"]
        tf.profiler.experimental.start({str(logdir)!r})
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
        tf.profiler.experimental.stop()
        info = npusim.system_info()
        print("RESULT" + json.dumps({{
            "before": before, "after": info["timeline_cycles"],
            "launches": [npusim.launch_records(chip=c) for c in (0, 1)],
            "collectives": info["collectives"]}}))
        """), timeout=600)
    space = _xspace(str(logdir))
    planes = {p.name: p for p in space.planes if p.name.startswith("/device:CUSTOM:NPU:")}
    assert sorted(planes) == ["/device:CUSTOM:NPU:0", "/device:CUSTOM:NPU:1"]
    comm_ps = []
    for k in (0, 1):
        plane = planes[f"/device:CUSTOM:NPU:{k}"]
        assert plane.id == k
        pstats = _stats(plane, plane)
        clock, origin = pstats["clock_mhz"], pstats["origin_cycle"]
        lo, hi = result["before"][k], result["after"][k]
        window = [r for r in result["launches"][k] if lo <= r["start_cycle"] < hi]
        kernels = _kernel_events(plane)
        assert len(window) > 0 and len(kernels) == len(window), k
        assert sorted(st["start_cycle"] for _, _, st in kernels) == [r["start_cycle"]
                                                                     for r in window]
        colls = [c for c in result["collectives"] if c["start_cycle"] >= lo and k in c["chips"]]
        assert colls
        [line] = [ln for ln in plane.lines if ln.name == "Communication"]
        events = list(_events(plane, line))
        assert len(events) == len(colls), k
        for (name, e, st), c in zip(events, colls):
            assert name == "hcom_" + c["collective"] and st["id"] == c["id"]
            assert st["bytes"] == c["bytes"] and st["chips"] == "0,1" and st["rank"] == k
            assert e.offset_ps == _ps(c["start_cycle"] - origin, clock)
            assert e.duration_ps == _ps(c["end_cycle"] - c["start_cycle"], clock)
        comm_ps.append([line.timestamp_ns * 1000 + e.offset_ps for _, e, _ in events])
    # One clock: each collective at the same instant on both planes (up to the lines' whole ns).
    assert all(abs(a - b) < 1000 for a, b in zip(*comm_ps)), comm_ps
