"""Model-level reports (docs/reports.md, "From TensorFlow"): a Keras MLP trained for two steps
inside npusim.profile(dir) writes the command line's report folder for the block's launches, with
TF node names and op types, msprof's typed columns, a trace with a host lane, and invariants
checked against numbers the report does not derive from each other (chip.yaml's peak, the
launch records, the copies in the trace)."""

import csv
import json
import os
import re
import textwrap

import numpy as np
import pytest
import yaml

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from conftest import run_child  # noqa: E402  pylint: disable=wrong-import-position

INT, FLOAT, TEXT, OPT_FLOAT, OPT_INT = "int", "float", "text", "float|N/A", "int|N/A"
# msprof's op_summary columns and their types (the reference's profiling conventions), then
# npusim's (docs/reports.md).
COLUMNS = {
    "Task ID": INT, "Stream ID": INT, "Op Name": TEXT, "OP Type": TEXT, "Task Type": TEXT,
    "Task Start Time(us)": FLOAT, "Task Duration(us)": FLOAT, "Task Wait Time(us)": FLOAT,
    "Block Dim": INT, "Mix Block Dim": INT, "Input Shapes": TEXT, "Input Data Types": TEXT,
    "Input Formats": TEXT, "Output Shapes": TEXT, "Output Data Types": TEXT,
    "Output Formats": TEXT, "aic_time(us)": OPT_FLOAT, "aic_total_cycles": OPT_INT,
    "aic_mac_ratio": OPT_FLOAT, "aic_scalar_ratio": OPT_FLOAT, "aic_mte1_ratio": OPT_FLOAT,
    "aic_mte2_ratio": OPT_FLOAT, "aic_fixpipe_ratio": OPT_FLOAT, "aiv_time(us)": OPT_FLOAT,
    "aiv_total_cycles": OPT_INT, "aiv_vec_ratio": OPT_FLOAT, "aiv_scalar_ratio": OPT_FLOAT,
    "aiv_mte2_ratio": OPT_FLOAT, "aiv_mte3_ratio": OPT_FLOAT, "cube_utilization(%)": FLOAT,
    "memory_bound": OPT_FLOAT, "task_start_cycles": INT, "task_duration_cycles": INT,
    "task_wait_cycles": INT, "task_overhead(us)": FLOAT, "task_overhead_cycles": INT,
    "host_dispatch_cycles": INT, "cube_macs": INT, "vector_repeats": INT, "roofline_bound(us)": FLOAT,
    "duration/bound": OPT_FLOAT, "gm_read_bytes": INT, "gm_write_bytes": INT,
    "hbm_read_bytes": INT, "hbm_write_bytes": INT, "l2_hit_rate": OPT_FLOAT,
}


def _typed(value, kind, where):
    if kind == TEXT:
        return value
    if kind in (OPT_FLOAT, OPT_INT) and value == "N/A":
        return None
    try:
        return int(value) if kind in (INT, OPT_INT) else float(value)
    except ValueError:
        raise AssertionError(f"{where}: '{value}' is not {kind}") from None


def _op_summary(d):
    with open(os.path.join(d, "op_summary.csv"), newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        raw = list(reader)
    assert header[:len(COLUMNS)] == list(COLUMNS), header
    assert header[-1] == "kernel", header
    rows = []
    for i, cells in enumerate(raw):
        kinds = [COLUMNS.get(c, INT if c.startswith("stall_") else TEXT) for c in header]
        rows.append({c: _typed(v, k, f"op_summary row {i} {c}")
                     for c, k, v in zip(header, kinds, cells)})
    return rows


def _mlp():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.SGD(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.fixture(scope="module")
def profiled(npusim, tf, tmp_path_factory):
    """Two training steps inside npusim.profile(dir), with NPU work before and after the block."""
    d = tmp_path_factory.mktemp("report")
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((32, 32)).astype(np.float32), rng.integers(0, 4, 32)
    with tf.device("/NPU:0"):
        model = _mlp()
        model.predict(x[:16], verbose=0)  # before the block
        before = len(npusim.launch_records())
        with npusim.profile(d, trace_launches=4) as prof:
            model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        inside = npusim.launch_records(with_counters=True)[before:]
        assert model.optimizer.iterations.numpy() == 2
        (tf.constant(np.ones(8, np.float32)) * 3.0).numpy()  # after the block
    return {"dir": str(d), "inside": inside, "profile": prof}


def test_op_summary_has_tf_names_and_typed_msprof_columns(profiled):
    rows = _op_summary(profiled["dir"])
    inside = profiled["inside"]
    # Exactly the block's launches, in order: one row per kernel launch (task).
    assert [r["kernel"] for r in rows] == [r["kernel"] for r in inside]
    assert [r["Op Name"] for r in rows] == [r["op_name"] for r in inside]
    assert [r["task_start_cycles"] for r in rows] == [r["start_cycle"] for r in inside]
    types = {r["OP Type"] for r in rows}
    # The Dense layers' MatMul -> BiasAdd [-> Relu] run fused (MatMulBiasAdd, graph_fusion.h
    # rewrite 3b) under the chain's last node's name; the gradients' products stay MatMul.
    assert {"MatMul", "MatMulBiasAdd", "ReluGrad"} <= types, types
    for r in rows:
        # TF node names of the traced train function ("sequential/dense/Relu"), not kernels.
        assert r["Op Name"] != r["kernel"], r
        assert r["Input Data Types"].startswith("DT_"), r
    fused = [r for r in rows if r["OP Type"] == "MatMulBiasAdd"]
    assert any(r["Input Shapes"] == "16,32;32,16;16" and r["Op Name"].endswith("Relu")
               for r in fused), fused


def test_report_invariants(profiled):
    d = profiled["dir"]
    rows = _op_summary(profiled["dir"])
    with open(os.path.join(d, "chip.yaml")) as f:
        chip = yaml.safe_load(f)
    assert chip["name"] == "tiny"
    for r in rows:
        for c, v in r.items():
            if (c.endswith("_ratio") or c == "l2_hit_rate") and v is not None:
                assert 0.0 <= v <= 1.0, (c, v, r["Op Name"])
    # The timeline: each task starts where the one before ended plus its wait, so the durations
    # add up to the simulated time minus the waits.
    for prev, r in zip(rows, rows[1:]):
        assert r["task_start_cycles"] == (prev["task_start_cycles"] + prev["task_duration_cycles"]
                                          + r["task_wait_cycles"]), r
    origin = rows[0]["task_start_cycles"] - rows[0]["task_wait_cycles"]
    span = rows[-1]["task_start_cycles"] + rows[-1]["task_duration_cycles"] - origin
    assert sum(r["task_duration_cycles"] for r in rows) == span - sum(r["task_wait_cycles"]
                                                                      for r in rows)
    summary = open(os.path.join(d, "summary.txt")).read()
    m = re.search(r"task time ([\d.]+) us, waits ([\d.]+) us, simulated time ([\d.]+) us",
                  summary)
    assert m, summary[:500]
    task_us, wait_us, sim_us = map(float, m.groups())
    assert task_us + wait_us == pytest.approx(sim_us, abs=0.002)
    assert sim_us == pytest.approx(span / chip["clock_mhz"], abs=0.001)
    # cube_utilization(%) against the whole chip's cube peak from chip.yaml.
    cube_cores = sum(k["count"] for k in chip["cores"].values() if "m" in k.get("pipes", []))
    peak = chip["cube"]["m"] * chip["cube"]["k"] * chip["cube"]["n"] * cube_cores
    for r in rows:
        want = 100.0 * r["cube_macs"] / (peak * r["task_duration_cycles"])
        assert r["cube_utilization(%)"] == pytest.approx(want, abs=1e-3), r["Op Name"]
    assert any(r["cube_macs"] > 0 for r in rows if r["OP Type"] == "MatMul")
    # op_statistic aggregates the tasks by op type.
    with open(os.path.join(d, "op_statistic.csv"), newline="") as f:
        stats = list(csv.DictReader(f))
    assert sum(int(s["Count"]) for s in stats) == len(rows)


def test_trace_has_host_lane_copies_and_pipe_detail(profiled):
    d = profiled["dir"]
    rows = _op_summary(d)
    with open(os.path.join(d, "trace.json")) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")}
    host = [pid for (pid, tid), n in names.items() if tid is None and n == "host"]
    assert len(host) == 1
    lanes = {n for (pid, tid), n in names.items() if pid == host[0] and tid is not None}
    assert {"TF ops", "h2d", "d2h"} <= lanes
    slices = [e for e in events if e["ph"] == "X"]
    copies = [e for e in slices if e["cat"] == "copy"]
    assert any(e["name"] == "memcpy_h2d" for e in copies)
    tf_ops = [e for e in slices if e["cat"] == "tf_op"]
    assert {e["args"]["op_type"] for e in tf_ops} == {r["OP Type"] for r in rows}
    assert len([e for e in slices if e["cat"] == "kernel"]) == len(rows)
    # Instruction detail for the first 4 launches only, on the core lanes.
    assert trace["otherData"]["detail_launches"] == 4
    insns = [e for e in slices if e["cat"] == "insn"]
    assert insns
    clock = trace["otherData"]["clock_mhz"]
    end_of_4th = (rows[3]["task_start_cycles"] + rows[3]["task_duration_cycles"]) / clock
    assert trace["otherData"]["launches_seen"] == len(rows), trace["otherData"]
    # (the instruction times are exact, the task times whole cycles: a cycle's tolerance)
    assert max(e["ts"] for e in insns) <= end_of_4th + 1 / clock
    assert min(e["ts"] for e in insns) >= rows[0]["task_start_cycles"] / clock - 1 / clock
    # The waits are filled by the copies and the ops' host dispatch (the runtime runs one
    # operation at a time): the copies that lie between the first task's origin and the last
    # task's end plus the host dispatch add up to the waits, to two cycles per copy (starts are rounded down and durations up to whole cycles,
    # at each end of a copy and of the task next to it). A copy's start is a whole cycle that
    # the trace writes in us: round it back, or a copy starting in the last task's final
    # (rounded-up) cycle reads as 1e-9 cycles earlier and falls inside the window.
    origin = rows[0]["task_start_cycles"] - rows[0]["task_wait_cycles"]
    end = rows[-1]["task_start_cycles"] + rows[-1]["task_duration_cycles"]
    inside = [e for e in copies if origin - 1 <= round(e["ts"] * clock) < end - 1]
    copy_cycles = sum(e["dur"] * clock for e in inside)
    waits = sum(r["task_wait_cycles"] for r in rows)
    host = sum(r["host_dispatch_cycles"] for r in rows)
    # Each TF op dispatched on its own paid host.op_dispatch_us once, before its first launch;
    # each run of a whole graph (launch records' graph_run: docs/tf_plugin.md, "Whole-graph
    # execution") paid host.graph_dispatch_us once. Every node is its own span either way.
    chip = yaml.safe_load(open(os.path.join(profiled["dir"], "chip.yaml")))
    per_op = round(chip["host"]["op_dispatch_us"] * clock)
    per_graph = round(chip["host"]["graph_dispatch_us"] * clock)
    inside = profiled["inside"]
    alone = {r["dispatch"] for r in inside if not r["graph_run"]}
    graph_runs = {r["graph_run"] for r in inside if r["graph_run"]}
    assert len(tf_ops) == len({r["dispatch"] for r in inside})
    assert per_op > 0 and host == per_op * len(alone) + per_graph * len(graph_runs), (
        host, per_op, len(alone), per_graph, len(graph_runs))
    assert abs(copy_cycles + host - waits) <= 2 * len(inside) + 1, (copy_cycles, host, waits)


def test_summary_lists_top_ops_hdc_waits_and_fallbacks(npusim, profiled):
    summary = open(os.path.join(profiled["dir"], "summary.txt")).read()
    for heading in ("Top ops by time:", "TF ops by op type", "Utilisation per unit by op type",
                    "HDC link", "waiting for data", "CPU-fallback ops", "Trace (trace.json)"):
        assert heading in summary, heading
    top = summary.split("Top ops by time:")[1].split("\n\n")[0]
    assert "MatMul" in top or "sequential" in top, top
    fallbacks = summary.split("CPU-fallback ops")[1].split("\n\n")[0]
    if hasattr(npusim, "cpu_fallback_ops"):  # added by the CPU-fallback work
        assert "not available" not in fallbacks, fallbacks


def test_op_summary_api(npusim, profiled):
    rows = profiled["profile"].op_summary()
    by_type = {r["op_type"]: r for r in rows}
    csv_rows = _op_summary(profiled["dir"])
    assert set(by_type) == {r["OP Type"] for r in csv_rows}
    for t, r in by_type.items():
        mine = [c for c in csv_rows if c["OP Type"] == t]
        assert r["tasks"] == len(mine)
        assert r["time_us"] == pytest.approx(sum(c["Task Duration(us)"] for c in mine), abs=0.01)
        assert 0 <= r["cube_utilization_pct"] <= 100 and 0 <= r["vector_utilization_pct"] <= 100
    assert [r["time_us"] for r in rows] == sorted((r["time_us"] for r in rows), reverse=True)
    assert len(profiled["profile"].op_summary(top=2)) == 2
    text = npusim.format_op_summary(rows)
    assert "MatMul" in text and "op type" in text
    assert len(npusim.op_summary()) >= len(rows)  # the whole run


def test_plots_when_matplotlib_is_there(profiled):
    pytest.importorskip("matplotlib")
    for name in ("roofline.png", "op_time.png"):
        path = os.path.join(profiled["dir"], name)
        assert os.path.getsize(path) > 0, name


def test_report_dir_env_writes_the_report_at_exit(tmp_path):
    result = run_child(textwrap.dedent(f"""
        import os
        os.environ["NPUSIM_REPORT_DIR"] = {str(tmp_path)!r}
        import numpy as np
        import npusim
        import tensorflow as tf
        with tf.device("/NPU:0"):
            (tf.constant(np.ones(64, np.float32)) * 2.0).numpy()
    """))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = _op_summary(str(tmp_path))
    assert rows and rows[0]["OP Type"] == "Mul"
    assert (tmp_path / "launches.json").exists()
    with open(tmp_path / "trace.json") as f:
        assert any(e.get("cat") == "insn" for e in json.load(f)["traceEvents"])
