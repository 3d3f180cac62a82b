"""Chakra execution traces (docs/multichip.md, "Chakra traces for ASTRA-sim"): the exported
files are parsed with message classes that protoc compiles from the schema
(adapter/tf/python/npusim/chakra_et_def.proto, wire-compatible with MLCommons Chakra's), not with
the exporter's own encoder; they must hold one trace per rank, the node types and attributes
ASTRA-sim reads (COMP_NODE with duration_micros and is_cpu_op; COMM_COLL_NODE with comm_type and
comm_size), and acyclic dependencies. A Keras training step's trace is checked against the
step's launch records and the model's trainable variables."""

import math
import os
import shutil
import subprocess
import textwrap

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from conftest import ROOT  # noqa: E402  pylint: disable=wrong-import-position

PROTO = os.path.join(ROOT, "adapter", "tf", "python", "npusim", "chakra_et_def.proto")


@pytest.fixture(scope="module")
def schema(tmp_path_factory):
    """The schema's message classes, compiled by protoc into a descriptor set and built by the
    protobuf runtime (independent of any protoc/runtime version pairing)."""
    protoc = shutil.which("protoc")
    if protoc is None:
        pytest.fail("protoc not found: scripts/setup.sh installs Debian's protobuf-compiler")
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    out = tmp_path_factory.mktemp("schema") / "et_def.pb"
    subprocess.run([protoc, f"--proto_path={os.path.dirname(PROTO)}",
                    f"--descriptor_set_out={out}", os.path.basename(PROTO)], check=True)
    pool = descriptor_pool.DescriptorPool()
    for f in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file:
        pool.Add(f)
    cls = {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(
        f"ChakraProtoMsg.{name}")) for name in ("GlobalMetadata", "Node")}
    enum = pool.FindEnumTypeByName("ChakraProtoMsg.NodeType")
    cls["NodeType"] = {v.name: v.number for v in enum.values}
    coll = pool.FindEnumTypeByName("ChakraProtoMsg.CollectiveCommType")
    cls["CollectiveCommType"] = {v.name: v.number for v in coll.values}
    return cls


def _varint(data, at):
    value = shift = 0
    while True:
        b = data[at]
        at += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, at
        shift += 7


def parse_trace(path, schema):
    """(GlobalMetadata, [Node]) of one file: length-prefixed messages, metadata first."""
    data = open(path, "rb").read()
    messages, at = [], 0
    while at < len(data):
        n, at = _varint(data, at)
        messages.append(data[at:at + n])
        at += n
    assert at == len(data), f"{path}: a message runs past the end"
    meta = schema["GlobalMetadata"].FromString(messages[0])
    return meta, [schema["Node"].FromString(m) for m in messages[1:]]


def attrs(node):
    out = {}
    for a in node.attr:
        out[a.name] = getattr(a, a.WhichOneof("value"))
    return out


def check_acyclic(nodes):
    """Every dependency names a node of the trace and the graph has a topological order."""
    ids = {n.id for n in nodes}
    assert len(ids) == len(nodes), "node ids repeat"
    deps = {n.id: set(n.data_deps) | set(n.ctrl_deps) for n in nodes}
    for i, d in deps.items():
        assert d <= ids, f"node {i} depends on missing nodes {d - ids}"
    done = set()
    while len(done) < len(nodes):
        ready = [i for i, d in deps.items() if i not in done and d <= done]
        assert ready, f"cycle among nodes {sorted(ids - done)}"
        done.update(ready)


def check_astra_fields(nodes, schema):
    """What ASTRA-sim's workload layer reads: compute nodes run on the NPU (is_cpu_op false)
    for duration_micros; collectives have comm_type (int64) and comm_size (int64 bytes)."""
    t = schema["NodeType"]
    for n in nodes:
        a = attrs(n)
        assert n.type in (t["COMP_NODE"], t["COMM_COLL_NODE"]), n
        assert a["is_cpu_op"] is False, n.name
        if n.type == t["COMM_COLL_NODE"]:
            assert a["comm_type"] == schema["CollectiveCommType"]["ALL_REDUCE"]
            assert a["comm_size"] > 0


def test_wire_format_and_segments(tmp_path, schema):
    """build_nodes and write_traces on made-up op runs: HCCL's default 96.54/3.46 % split, the
    dependencies, durations in whole microseconds that keep the running sum."""
    from npusim import _chakra
    runs = [{"name": f"op{i}", "type": "MatMul", "kernels": 1, "time_us": t}
            for i, t in enumerate([0.4, 0.4, 0.4, 12.25, 3.0, 0.7])]
    # Gradients in variable order; var2's last byte falls past 96.54 % of 4010 bytes.
    grads = [{"variable": "v0", "bytes": 100, "producers": [3], "updates": [5]},
             {"variable": "v1", "bytes": 900, "producers": [2], "updates": [5]},
             {"variable": "v2", "bytes": 3000, "producers": [1], "updates": [4]},
             {"variable": "v3", "bytes": 10, "producers": [1], "updates": [4]}]
    nodes, segments = _chakra.build_nodes(runs, grads)
    assert [(s["bytes"], s["variables"]) for s in segments] == [(1000, ["v0", "v1"]),
                                                                 (3010, ["v2", "v3"])]
    files = _chakra.write_traces(str(tmp_path), nodes, 3, [_chakra.attr_int64("ranks", 3)])
    assert sorted(os.listdir(tmp_path)) == [f"npusim.{r}.et" for r in range(3)]
    meta, parsed = parse_trace(files[2], schema)
    assert meta.version == _chakra.SCHEMA_VERSION and attrs(meta)["ranks"] == 3
    check_acyclic(parsed)
    check_astra_fields(parsed, schema)
    comp = [n for n in parsed if n.type == schema["NodeType"]["COMP_NODE"]]
    coll = [n for n in parsed if n.type == schema["NodeType"]["COMM_COLL_NODE"]]
    assert [n.name for n in comp] == [r["name"] for r in runs]
    # Whole microseconds: each running sum within half a microsecond of the exact one.
    exact = np.cumsum([r["time_us"] for r in runs])
    assert np.all(np.abs(np.cumsum([n.duration_micros for n in comp]) - exact) <= 0.5)
    assert [attrs(n)["comm_size"] for n in coll] == [1000, 3010]
    by_name = {n.name: n for n in parsed}
    # Segment 0 after the ops producing v0, v1; segment 1 after op1. op4 updates v2, v3 after
    # segment 1's all-reduce, op5 v0, v1 after segment 0's; every op after the one before it.
    assert sorted(coll[0].data_deps) == [by_name["op2"].id, by_name["op3"].id]
    assert list(coll[1].data_deps) == [by_name["op1"].id]
    assert set(by_name["op4"].data_deps) == {by_name["op3"].id, coll[1].id}
    assert set(by_name["op5"].data_deps) == {by_name["op4"].id, coll[0].id}
    # By index, and errors.
    assert _chakra.gradient_segments([1, 1, 1], split_by_idx=[0, 2]) == [0, 1, 1]
    with pytest.raises(ValueError, match="split_by_size"):
        _chakra.gradient_segments([1, 1], split_by_size=[50, 40])
    with pytest.raises(ValueError, match="split_by_idx"):
        _chakra.gradient_segments([1, 1], split_by_idx=[0])
    # An update that ran (on one chip) before its segment's last gradient moves after it: op1
    # updates v0 (segment 0 of one gradient, produced by op3), so it runs after op3.
    early = [dict(grads[0], updates=[1]), dict(grads[2], producers=[0], updates=[4])]
    nodes, _ = _chakra.build_nodes(runs, early, split_by_idx=[0, 1])
    comp = [n for n in nodes if n["type"] == _chakra.COMP_NODE]
    assert [n["name"] for n in comp] == ["op0", "op2", "op3", "op1", "op4", "op5"]
    assert [n["data_deps"] for n in comp] == [[], [0], [1], [2, 6], [3, 7], [4]]


def test_keras_training_step(tmp_path, schema):
    """export_chakra on a Keras MLP trained with Adam: one file per rank, a compute node per TF
    op run with the launch records' time, all-reduces whose sizes add up to the trainable
    variables' bytes, each after the gradient ops of its variables and before their updates."""
    import npusim
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).normal(size=(16, 12)).astype(np.float32)
    y = np.random.default_rng(1).integers(0, 3, size=(16,)).astype(np.int32)
    before = [v.numpy() for v in model.trainable_variables]
    out = npusim.export_chakra(str(tmp_path), chips=4, model=model, x=x, y=y)
    records = npusim.launch_records()  # the exported step's launches
    # The steps it ran leave the model as it was.
    for v, w in zip(model.trainable_variables, before):
        np.testing.assert_array_equal(v.numpy(), w)
    assert int(model.optimizer.iterations.numpy()) == 0
    assert len(out["files"]) == 4
    first = open(out["files"][0], "rb").read()
    assert all(open(f, "rb").read() == first for f in out["files"])
    meta, nodes = parse_trace(out["files"][0], schema)
    assert attrs(meta)["ranks"] == 4
    check_acyclic(nodes)
    check_astra_fields(nodes, schema)
    t = schema["NodeType"]
    comp = [n for n in nodes if n.type == t["COMP_NODE"]]
    coll = [n for n in nodes if n.type == t["COMM_COLL_NODE"]]
    # Compute: every launch in a node, the step's time kept.
    assert sum(attrs(n)["kernels"] for n in comp) == len(records)
    total_us = sum(r["time_us"] for r in records)
    assert math.isclose(out["compute_us"], total_us, rel_tol=1e-9)
    assert abs(sum(n.duration_micros for n in comp) - total_us) <= 0.5
    assert abs(sum(attrs(n)["npusim_duration_ns"] for n in comp) - 1e3 * total_us) <= len(comp)
    # Communication: HCCL's default segments, 96.54 % and 3.46 % of the variables' bytes: the
    # variables whose last byte lies within the first 96.54 %, then the rest.
    sizes = [int(np.prod(v.shape)) * 4 for v in model.trainable_variables]
    first = sum(1 for c in np.cumsum(sizes) if 100.0 * c / sum(sizes) <= 96.54)
    assert 0 < first < len(sizes)
    assert [attrs(n)["comm_size"] for n in coll] == [sum(sizes[:first]), sum(sizes[first:])]
    position = {n.id: i for i, n in enumerate(nodes)}
    for c in coll:
        producers = [nodes[position[d]] for d in c.data_deps]
        assert producers and all("gradient_tape" in p.name for p in producers), c.name
        consumers = [n for n in comp if c.id in n.data_deps]
        assert consumers, f"{c.name}: no update waits for it"
        assert all("gradient_tape" not in n.name and "sequential" not in n.name
                   for n in consumers), [n.name for n in consumers]
        assert min(position[n.id] for n in consumers) > max(position[p.id] for p in producers)


def test_chip_nodes_follow_the_records(schema):
    """build_chip_nodes on made-up records of one chip: a compute node per op run, chained; a
    collective node per collective of the chip, after the op run that wrote its input and the
    chip's previous collective; the op run that reads its output after it."""
    from npusim import _chakra

    def launch(index, op, start, cycles, reads=0):
        return {"index": index, "kernel": op.lower(), "op_name": op, "op_type": op,
                "dispatch": index + 1, "start_cycle": start, "cycles": cycles,
                "time_us": cycles / 1000.0, "reads_collective": reads}

    # Chip 1's launches 7..11 (earlier ones fell before the window); collective 3 reads what
    # launch 8 wrote, collective 4 what launch 6 (before the window) wrote; launch 10 reads
    # collective 4's output, launch 11 collective 3's. Collective 5 is chips 0 and 2 only.
    launches = [launch(7, "A", 1000, 500), launch(8, "B", 1500, 2000),
                launch(9, "C", 3500, 3000), launch(10, "D", 9000, 700, reads=4),
                launch(11, "E", 9700, 300, reads=3)]
    colls = [{"id": 3, "collective": "all_reduce", "algorithm": "mesh", "chips": [0, 1],
              "input_launch": [4, 8], "bytes": 4096, "start_cycle": 3500, "end_cycle": 5500,
              "label": "seg1"},
             {"id": 4, "collective": "all_gather", "algorithm": "mesh", "chips": [1, 0],
              "input_launch": [6, 5], "bytes": 64, "start_cycle": 5500, "end_cycle": 9000},
             {"id": 5, "collective": "all_reduce", "algorithm": "mesh", "chips": [0, 2],
              "input_launch": [5, 2], "bytes": 64, "start_cycle": 5500, "end_cycle": 6000}]
    nodes, runs = _chakra.build_chip_nodes(1, launches, colls, clock_mhz=1000.0,
                                           origin_cycle=1000)
    assert [r["name"] for r in runs] == ["A", "B", "C", "D", "E"]
    by_name = {n["name"]: n for n in nodes}
    c3, c4 = nodes[5], nodes[6]
    assert len(nodes) == 7 and c3["name"].startswith("hcom_all_reduce_3")
    assert [n["data_deps"] for n in nodes[:5]] == [[], [0], [1], [2, 6], [3, 5]]
    assert c3["data_deps"] == [1] and c4["data_deps"] == [5]
    assert c3["type"] == _chakra.COMM_COLL_NODE and c3["start_time_micros"] == 2
    assert by_name["C"]["start_time_micros"] == 2 and c4["duration_micros"] == 4


def _run_of_records(records, comp, coll_attrs):
    """Splits `records` (a chip's launches, in order) into the compute nodes `comp` (in order):
    node i takes the next attrs(comp[i])["kernels"] launches, all of its TF op. Returns per node
    its (first start, last end) cycles and its launches."""
    at, spans = 0, []
    for n in comp:
        k = attrs(n)["kernels"]
        mine = records[at:at + k]
        assert len(mine) == k and all(r["op_name"] == n.name for r in mine), n.name
        spans.append({"start": mine[0]["start_cycle"],
                      "end": mine[-1]["start_cycle"] + mine[-1]["cycles"], "launches": mine})
        at += k
    assert at == len(records), "launches not in any compute node"
    return spans


def test_mirrored_strategy_step_on_two_npus(tmp_path, schema):
    """export_chakra of a model compiled under MirroredStrategy on 2 tiny NPUs writes what ran:
    one trace per chip, its compute nodes the chip's own launches with their simulated
    durations, its collective nodes the driver's collective records (type, bytes, communicator),
    and dependencies that the chips' timelines satisfy: a collective after the compute node
    that last wrote its input (a gradient op), its readers (the optimizer) after it."""
    from conftest import child_result, mlp_on_two_npus  # pylint: disable=import-outside-toplevel
    out_dir = tmp_path / "et"
    result = child_result(mlp_on_two_npus(32) + textwrap.dedent(f"""
        with tf.distribute.MirroredStrategy().scope():
            model = build()
            model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
        before = model.get_weights()
        out = npusim.export_chakra({str(out_dir)!r}, model=model, x=x, y=y)
        info = npusim.system_info()
        res = {{"out": out, "launches": [npusim.launch_records(chip=c) for c in (0, 1)],
                "collectives": info["collectives"],
                "variable_bytes": sum(int(np.prod(v.shape)) * 4
                                      for v in model.trainable_variables),
                "restored": all(bool(np.array_equal(a, b))
                                for a, b in zip(before, model.get_weights()))}}
        print("RESULT" + json.dumps(res))
        """), timeout=600)
    assert result["restored"]
    colls = result["collectives"]
    assert len(colls) >= 2 and all(c["chips"] == [0, 1] for c in colls)
    assert result["out"]["files"] == [str(out_dir / f"npusim.{k}.et") for k in (0, 1)]
    t = schema["NodeType"]
    for k in (0, 1):
        meta, nodes = parse_trace(str(out_dir / f"npusim.{k}.et"), schema)
        assert attrs(meta)["ranks"] == 2 and attrs(meta)["rank"] == k
        check_acyclic(nodes)
        check_astra_fields(nodes, schema)
        records = result["launches"][k]
        assert records and all(r["chip"] == k for r in records)
        comp = [n for n in nodes if n.type == t["COMP_NODE"]]
        coll = [n for n in nodes if n.type == t["COMM_COLL_NODE"]]
        # Compute: the chip's own launches, in order, each node with its launches' time.
        spans = _run_of_records(records, comp, attrs)
        for n, s in zip(comp, spans):
            exact_ns = 1e3 * sum(r["time_us"] for r in s["launches"])
            assert abs(attrs(n)["npusim_duration_ns"] - exact_ns) <= 0.5, n.name
        total_us = sum(r["time_us"] for r in records)
        assert abs(sum(n.duration_micros for n in comp) - total_us) <= 0.5
        # Communication: the driver's collectives of this chip, in order, with their bytes.
        assert len(coll) == len(colls)
        for n, c in zip(coll, colls):
            a = attrs(n)
            assert a["comm_type"] == schema["CollectiveCommType"]["ALL_REDUCE"]
            assert a["comm_size"] == c["bytes"] and a["comm_group"] == "0,1"
            assert a["rank"] == k and a["algorithm"] == c["algorithm"]
        # Dependencies as the timelines ran them: every node starts after its dependencies end
        # (cycles of the records; a record's end is rounded up, so one cycle of slack).
        window = {n.id: (s["start"], s["end"]) for n, s in zip(comp, spans)}
        window.update({n.id: (c["start_cycle"], c["end_cycle"]) for n, c in zip(coll, colls)})
        for n in nodes:
            for d in n.data_deps:
                assert window[d][1] <= window[n.id][0] + 1, (n.name, d)
        # The step's collectives are the gradient segments' all-reduces (HCCL's default split:
        # together every trainable variable's bytes), each after the gradient op that wrote the
        # last of its input (a gradient-tape op) and before the optimizer ops that read its
        # output (the updates; no gradient op waits for it).
        assert sum(attrs(n)["comm_size"] for n in coll) == result["variable_bytes"]
        position = {n.id: i for i, n in enumerate(comp)}
        for n in coll:
            writers = [d for d in n.data_deps if d in position]
            readers = [m for m in comp if n.id in m.data_deps]
            assert len(writers) == 1, n.name
            w = comp[position[writers[0]]]
            assert "gradient_tape" in w.name, (n.name, w.name)
            assert readers and all("gradient_tape" not in m.name for m in readers), n.name
            assert any("update" in m.name for m in readers), [m.name for m in readers]
            assert all(position[m.id] > position[w.id] for m in readers)
