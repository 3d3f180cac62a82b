"""Several NPUs, each a chip of one simulated system (docs/multichip.md, "TensorFlow"): devices,
copies between NPUs over the links, npusim.distribute's collectives against numpy,
MirroredStrategy training against one NPU on the global batch, and the errors. Every test runs
a child process (the device count is fixed per process)."""

import re
import textwrap

import pytest

pytest.importorskip("tensorflow")

from conftest import (  # noqa: E402  pylint: disable=wrong-import-position
    child_result, mlp_on_two_npus, run_child)

SYSTEM_TINY_X8 = {"NPUSIM_SYSTEM": "tiny-x8"}


def test_eight_npus_copies_over_links_and_collectives_against_numpy():
    result = child_result(textwrap.dedent("""
        import json
        import numpy as np
        import npusim
        import tensorflow as tf
        out = {"npus": len(tf.config.list_physical_devices("NPU"))}

        # A copy NPU:0 -> NPU:1 goes over the c0->c1 link.
        x = np.arange(4096, dtype=np.float32) * 0.5 - 7
        with tf.device("/NPU:0"):
            a = tf.constant(x) + 0  # computed on chip 0
        before = npusim.system_info()["fabric"].get("c0->c1", {}).get("bytes", {}).get("value", 0)
        with tf.device("/NPU:1"):
            b = tf.identity(a)
        out["copy_device"] = b.device
        out["copy_ok"] = bool(np.array_equal(b.numpy(), x))
        info = npusim.system_info()
        out["link_bytes"] = info["fabric"]["c0->c1"]["bytes"]["value"] - before
        out["peer_copies"] = [c for c in info["peer_copies"]
                              if c["src_chip"] == 0 and c["dst_chip"] == 1]

        # all_reduce on 2 and on 4 chips against numpy (small integers: exact in any order).
        rng = np.random.default_rng(5)
        checks = []
        for n in (2, 4):
            for op in ("sum", "max", "min", "mean"):
                data = [rng.integers(-8, 9, size=(33, 7)).astype(np.float32) for _ in range(n)]
                values = []
                for r in range(n):
                    with tf.device(f"/NPU:{r}"):
                        values.append(tf.constant(data[r]) * 1)
                got = npusim.distribute.all_reduce(values, op)
                want = {"sum": np.sum, "max": np.max, "min": np.min,
                        "mean": np.mean}[op](np.stack(data), axis=0)
                checks.append({"n": n, "op": op,
                               "devices": [g.device[-5:] for g in got],
                               "equal": all(bool(np.array_equal(g.numpy(), want)) for g in got)})
        # prod of +-1, +-2 (exact), int32 sum, and a batch of two tensors per replica.
        data = [rng.choice([-2.0, -1.0, 1.0, 2.0], size=(100,)).astype(np.float32)
                for _ in range(4)]
        vals = []
        for r in range(4):
            with tf.device(f"/NPU:{r}"):
                vals.append(tf.constant(data[r]) * 1)
        got = npusim.distribute.all_reduce(vals, "prod")
        checks.append({"n": 4, "op": "prod", "devices": [],
                       "equal": all(bool(np.array_equal(g.numpy(), np.prod(data, axis=0)))
                                    for g in got)})
        ints = [rng.integers(-1000, 1000, size=(257,)).astype(np.int32) for _ in range(2)]
        batch = []
        for r in range(2):
            with tf.device(f"/NPU:{r}"):
                batch.append([tf.identity(tf.constant(ints[r])), tf.constant(data[r]) * 1])
        got = npusim.distribute.all_reduce(batch, "sum")
        checks.append({"n": 2, "op": "batch", "devices": [],
                       "equal": all(bool(np.array_equal(g[0].numpy(), ints[0] + ints[1])) and
                                    bool(np.array_equal(g[1].numpy(), data[0] + data[1]))
                                    for g in got)})
        out["checks"] = checks

        # broadcast from NPU:2 to NPUs 0..3
        with tf.device("/NPU:2"):
            root = tf.constant(x) * 2
        got = npusim.distribute.broadcast(root, [f"/NPU:{r}" for r in range(4)])
        out["broadcast"] = [bool(np.array_equal(g.numpy(), x * 2)) for g in got]
        out["broadcast_devices"] = [g.device[-5:] for g in got]

        out["collectives"] = [(c["collective"], c["algorithm"], c["chips"])
                              for c in npusim.system_info()["collectives"]]

        # Errors: mismatched replica shapes; two replicas on one NPU; a tensor on the CPU.
        errors = []
        with tf.device("/NPU:0"):
            p = tf.zeros([4]) + 1
        with tf.device("/NPU:1"):
            q = tf.zeros([5]) + 1
        with tf.device("/CPU:0"):
            c = tf.zeros([4]) + 1
        for args in ([p, q], [p, p], [p, c]):
            try:
                npusim.distribute.all_reduce(args)
                errors.append("no error")
            except ValueError as e:
                errors.append(str(e))
        out["errors"] = errors
        print("RESULT" + json.dumps(out))
        """), extra_env=SYSTEM_TINY_X8)
    assert result["npus"] == 8
    assert result["copy_device"].endswith("NPU:1")
    assert result["copy_ok"]
    assert result["link_bytes"] == 4096 * 4
    assert [c["bytes"] for c in result["peer_copies"]] == [4096 * 4]
    assert result["peer_copies"][0]["cycles"] > 0
    for check in result["checks"]:
        assert check["equal"], check
    for check in result["checks"][:8]:
        assert check["devices"] == [f"NPU:{r}" for r in range(check["n"])]
    assert result["broadcast"] == [True] * 4
    assert result["broadcast_devices"] == [f"NPU:{r}" for r in range(4)]
    kinds = [tuple(c[:2]) for c in result["collectives"]]
    assert ("all_reduce", "mesh") in kinds  # 2 or 4 chips of one full-mesh server
    assert ("broadcast", "mesh") in kinds
    assert [0, 1, 2, 3] in [c[2] for c in result["collectives"]]
    assert "mismatched replica shapes" in result["errors"][0]
    assert "both on" in result["errors"][1]
    assert "not an NPU" in result["errors"][2]


def test_pending_collective_does_not_hold_back_the_chips_stream():
    """A rank's part waits for the other ranks on the chip's collective stream, not on the stream
    TensorFlow runs ops on: chip 0 computes and sends a tensor to NPU:1 while its part of an
    all-reduce is pending, and NPU:1's replica joins with it. With the part on chip 0's op
    stream the copy waited behind it for rank 1, which waited for the copy (a whole-graph
    MirroredStrategy step hung so: NPU:1's graph read a metric chip 0 had written); with the
    eager copy's device synchronisation waiting for the collective stream, too."""
    result = child_result(textwrap.dedent("""
        import json, threading, time
        import numpy as np
        import npusim
        from npusim import distribute
        npusim.configure(chip="tiny", chips=2)
        import tensorflow as tf
        x = np.arange(64, dtype=np.float32) - 20
        with tf.device("/NPU:0"):
            a = tf.constant(x) * 1
        groups = distribute._dtype_groups([a])
        attrs = {"collective": "all_reduce", "reduction": "sum", "root": 0, "group_size": 2}
        got = {}

        def rank0():
            with tf.device("/NPU:0"):
                got[0] = distribute._replica_ops([a], groups, 0, attrs)[0]

        t = threading.Thread(target=rank0)
        t.start()
        time.sleep(2)  # rank 0's part is queued on chip 0 and waits for rank 1
        with tf.device("/NPU:0"):
            later = a * 3  # queued on chip 0 after that part
        with tf.device("/NPU:1"):
            moved = tf.identity(later)  # a copy NPU:0 -> NPU:1 over the link
        out = {"moved": bool(np.array_equal(moved.numpy(), x * 3)), "pending": t.is_alive()}
        with tf.device("/NPU:1"):
            got[1] = distribute._replica_ops([moved], groups, 1, attrs)[0]
        t.join()
        out["sums"] = [bool(np.array_equal(got[r].numpy(), x * 4)) for r in (0, 1)]
        print("RESULT" + json.dumps(out))
        """), timeout=180)
    assert result["pending"]  # the copy completed while rank 0's part still waited
    assert result["moved"]
    assert result["sums"] == [True, True]


def test_report_has_hccl_rows_of_the_collectives_tf_ran(tmp_path):
    """npusim.write_report() with several NPUs: an HCCL row per collective and rank in
    op_summary.csv (docs/reports.md, "Communication (HCCL) tasks") with the bytes all-reduced,
    and a communication lane per chip in trace.json."""
    result = child_result(textwrap.dedent(f"""
        import csv, json, os
        import numpy as np
        import npusim
        npusim.configure(chip="tiny", chips=2)
        import tensorflow as tf
        values = []
        for r, n in enumerate((1000, 1000)):
            with tf.device(f"/NPU:{{r}}"):
                values.append(tf.ones([n]) * (r + 1))
        got = npusim.distribute.all_reduce(values)  # 4,000 bytes of float32 per rank
        ints = []
        for r in range(2):
            with tf.device(f"/NPU:{{r}}"):
                ints.append(tf.identity(tf.range(300)))
        npusim.distribute.all_reduce(ints, "max")  # 1,200 bytes of int32
        out = {{"ok": bool(np.all(got[1].numpy() == 3))}}
        d = npusim.write_report({str(tmp_path)!r})
        with open(os.path.join(d, "op_summary.csv"), newline="") as f:
            out["rows"] = [r for r in csv.DictReader(f) if r["Task Type"] == "HCCL"]
        with open(os.path.join(d, "trace.json")) as f:
            ev = json.load(f)["traceEvents"]
        out["lanes"] = sorted(e["args"]["name"] for e in ev
                              if e.get("ph") == "M" and e.get("name") == "process_name"
                              and e["args"]["name"].endswith("HCCL"))
        out["records"] = [(c["collective"], c["bytes"], c["start_cycle"], c["end_cycle"])
                          for c in npusim.system_info()["collectives"]]
        print("RESULT" + json.dumps(out))
        """), timeout=180)
    assert result["ok"]
    rows = result["rows"]
    assert [(r["OP Type"], int(r["comm_bytes"]), int(r["ranks"]), int(r["chip"])) for r in rows] \
        == [("HcomAllReduce", 4000, 2, 0), ("HcomAllReduce", 4000, 2, 1),
            ("HcomAllReduce", 1200, 2, 0), ("HcomAllReduce", 1200, 2, 1)]
    # Two ranks: each sends 2(n-1)/n = 1 x the buffer over its one link to the other chip, for
    # as long as the runtime's record of the collective says it ran.
    for r, (_, size, start, end) in zip(rows, [c for c in result["records"] for _ in (0, 1)]):
        assert int(r["link_bytes"]) == size
        assert int(r["task_duration_cycles"]) == end - start
    assert result["lanes"] == ["chip0 HCCL", "chip1 HCCL"]


def test_configure_chips_and_its_errors():
    result = child_result(textwrap.dedent("""
        import json
        import npusim
        import tensorflow as tf
        out = {}
        try:
            npusim.configure(system="tiny-x8", chips=16)
        except npusim.NpusimError as e:
            out["too_many"] = str(e)
        npusim.configure(chip="tiny", chips=2)
        out["npus"] = len(tf.config.list_physical_devices("NPU"))
        with tf.device("/NPU:1"):
            out["value"] = float(tf.reduce_sum(tf.ones([10]) * 2))
        try:
            npusim.configure(chips=4)
        except npusim.NpusimError as e:
            out["after_first_op"] = str(e)
        npusim.configure(chips=2)  # the same again is fine
        try:
            tf.distribute.MultiWorkerMirroredStrategy()
        except npusim.NpusimError as e:
            out["multi_worker"] = str(e)
        print("RESULT" + json.dumps(out))
        """))
    assert "has only 8 chips" in result["too_many"]
    assert result["npus"] == 2
    assert result["value"] == 20.0
    assert "already in use" in result["after_first_op"]
    assert "MirroredStrategy()" in result["multi_worker"]


def test_mirrored_strategy_tracks_one_npu_on_the_global_batch():
    result = child_result(mlp_on_two_npus(64) + textwrap.dedent("""

        def train(model):
            model.set_weights(init)
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
            h = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
            return h.history["loss"], model.get_weights()

        one_losses, one_weights = train(build())  # on NPU:0, the default device
        strategy = tf.distribute.MirroredStrategy()
        out = {"replicas": strategy.num_replicas_in_sync,
               "devices": list(strategy.extended.worker_devices),
               "cross_device_ops": type(strategy.extended._cross_device_ops).__name__}
        with strategy.scope():
            model = build()
        two_losses, two_weights = train(model)
        out["one_losses"] = one_losses
        out["two_losses"] = two_losses
        out["max_weight_diff"] = max(float(np.max(np.abs(a - b)))
                                     for a, b in zip(one_weights, two_weights))
        out["max_weight_change"] = max(float(np.max(np.abs(a - b)))
                                       for a, b in zip(init, two_weights))
        out["collectives"] = [(c["collective"], c["algorithm"], c["chips"], c["count"])
                              for c in npusim.system_info()["collectives"]]
        out["fallbacks"] = npusim.cpu_fallback_ops()
        print("RESULT" + json.dumps(out))
        """), timeout=900)
    assert result["replicas"] == 2
    assert [d[-5:] for d in result["devices"]] == ["NPU:0", "NPU:1"]
    assert result["cross_device_ops"] == "NpuAllReduce"
    np = pytest.importorskip("numpy")
    assert np.allclose(result["two_losses"], result["one_losses"], rtol=1e-4, atol=1e-5)
    assert result["max_weight_change"] > 1e-2  # it trained
    assert result["max_weight_diff"] < 1e-4
    # Every step all-reduced the four gradients (kernel and bias of two layers: 192, 16, 64 and 4
    # floats) on both chips in HCCL's default segments (docs/multichip.md, "Gradient segments"):
    # the second layer's kernel ends at 272 / 276 = 98.6 % of the bytes, past 96.54 %, so the
    # second layer (68 floats) is one segment, all-reduced first, and the first layer (208) the
    # other.
    grads = [c for c in result["collectives"] if c[0] == "all_reduce"]
    steps = 2 * (64 // 16)
    assert [c[3] for c in grads] == [68, 208] * steps
    assert {tuple(c[2]) for c in grads} == {(0, 1)}
    assert result["fallbacks"] == {}


def test_replicas_run_side_by_side_on_their_chips_timelines():
    """Every chip has its own device timeline (docs/runtime.md, "Simulated time on a system"): a
    MirroredStrategy step on 2 NPUs computes, on each replica's chip, what one NPU computes on
    half the batch; the chips' work overlaps in simulated time (it did not while every operation
    took the one shared clock); every all-reduce starts where what wrote its input ended."""
    result = child_result(mlp_on_two_npus(32) + textwrap.dedent("""

        def one_step(model, batch):
            model.set_weights(init)
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
            model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)  # compiles
            npusim.clear_launch_records()
            before = npusim.system_info()["timeline_cycles"]
            model.fit(x[:batch], y[:batch], batch_size=batch, epochs=1, shuffle=False,
                      verbose=0)
            info = npusim.system_info()
            return {"before": before, "after": info["timeline_cycles"],
                    "launches": [npusim.launch_records(chip=c) for c in (0, 1)],
                    "collectives": info["collectives"], "peer_copies": info["peer_copies"]}

        out = {"one": one_step(build(), 16)}  # NPU:0 alone on half the global batch
        strategy = tf.distribute.MirroredStrategy()
        with strategy.scope():
            model = build()
        out["two"] = one_step(model, 32)      # 16 per replica
        try:
            npusim.launch_records(chip=2)
        except npusim.NpusimError as e:
            out["bad_chip"] = str(e)
        print("RESULT" + json.dumps(out))
        """), timeout=600)
    one, two = result["one"], result["two"]
    assert "chip 2 is not an NPU" in result["bad_chip"]

    # The model's forward and backward kernels (its layers' ops) on each replica's chip are
    # those of one NPU on half the batch, kernel for kernel and cycle for cycle. (The optimizer
    # and the metrics differ: an all-reduce between gradient and update changes the fusion.)
    def model_kernels(records):
        return sorted((r["kernel"], r["cycles"]) for r in records if "sequential" in r["op_name"])

    single = model_kernels(one["launches"][0])
    # 2 dense layers: casts, MatMuls (forward: MatMulBiasAdd, the bias and Relu in the cube
    # kernel) and gradients
    assert len(single) >= 14
    for c in (0, 1):
        assert two["launches"][c][0]["chip"] == c
        assert model_kernels(two["launches"][c]) == single, c

    # The chips' work overlaps in simulated time: some cycles of chip 1's kernels (and the host
    # dispatch the device waits for before them) lie inside chip 0's.
    def busy(records):
        return [(r["start_cycle"] - r["host_dispatch_cycles"], r["start_cycle"] + r["cycles"])
                for r in records]

    overlap = sum(max(0, min(e0, e1) - max(s0, s1))
                  for s0, e0 in busy(two["launches"][0]) for s1, e1 in busy(two["launches"][1]))
    assert overlap > 0

    # Every all-reduce of the gradients runs on the chips' communication timelines: it starts
    # where the work that wrote its input ended (a launch or a copy of one of its chips) or where
    # the previous collective ended (up to one cycle: a copy's duration is rounded up to whole
    # cycles), not where the chips' compute ended.
    colls = two["collectives"]
    assert len(colls) >= 2 and all(c["chips"] == [0, 1] for c in colls)
    ends = {r["start_cycle"] + r["cycles"] for chip in (0, 1) for r in two["launches"][chip]}
    ends |= {p["start_cycle"] + p["cycles"] for p in two["peer_copies"]}
    ends |= {c["end_cycle"] for c in colls}
    for c in colls:
        assert min(abs(c["start_cycle"] - e) for e in ends) <= 1, c
    # The updates read the last all-reduce's output: the timelines end after it.
    last = colls[-1]["end_cycle"]
    assert all(t >= last for t in two["after"])


def test_an_op_queued_after_the_host_read_chip_0_starts_after_the_read_on_chip_1():
    """The host clock (docs/runtime.md, "The host clock"): the chips' timelines are tied by what
    the host reads back. Eagerly, chip 0 computes a chain of MatMuls; a MatMul queued on chip 1
    meanwhile starts on chip 1's own timeline, alongside the chain; a Relu queued on chip 1 after
    `.numpy()` of the chain's result starts after that read ended on chip 0's timeline, although
    chip 1 was free long before."""
    result = child_result(textwrap.dedent("""
        import json
        import numpy as np
        import npusim
        npusim.configure(chip="tiny", chips=2)
        import tensorflow as tf
        a = np.random.default_rng(0).standard_normal((128, 128)).astype(np.float32) * 0.05
        with tf.device("/NPU:1"):
            b = tf.constant(a) * 1.0
        b.numpy()
        npusim.clear_launch_records()
        with tf.device("/NPU:0"):
            h = tf.constant(a)
            for _ in range(8):
                h = tf.matmul(h, h)
        with tf.device("/NPU:1"):
            alongside = tf.matmul(b, b)  # queued before any read of chip 0
        host_before = npusim.system_info()["host_cycles"]
        got = h.numpy()
        host_after = npusim.system_info()["host_cycles"]
        with tf.device("/NPU:1"):
            after = tf.nn.relu(b)  # queued after the read
        after.numpy(), alongside.numpy()
        print("RESULT" + json.dumps({
            "launches": [npusim.launch_records(chip=c) for c in (0, 1)],
            "host_before": host_before, "host_after": host_after,
            "finite": bool(np.isfinite(got).all())}))
        """), timeout=600)
    chip0, chip1 = result["launches"]
    chain = [r for r in chip0 if r["op_type"] == "MatMul"]
    assert len(chain) >= 8 and result["finite"]
    chain_end = max(r["start_cycle"] + r["cycles"] for r in chain)
    # The MatMul's launches (casts to fp16, the cube kernel) and the Relu's, on chip 1.
    alongside = [r for r in chip1 if r["op_type"] == "MatMul"]
    after = [r for r in chip1 if r["op_type"] == "Relu"]
    assert alongside and after, [(r["op_type"], r["kernel"]) for r in chip1]
    # Queued before the read: chip 1 computed alongside chip 0's chain.
    assert alongside[0]["start_cycle"] < chain_end
    # Nothing read yet, the host clock stood before the chain's end; the read followed it.
    assert result["host_before"] < chain_end <= result["host_after"]
    # Queued after the read: no earlier than its end (plus the op's host dispatch).
    first = after[0]
    assert first["start_cycle"] >= result["host_after"]
    assert first["start_cycle"] - result["host_after"] <= first["host_dispatch_cycles"] + 1
    assert first["start_cycle"] > alongside[-1]["start_cycle"] + alongside[-1]["cycles"]


def test_profile_on_two_npus_writes_a_report_folder_per_chip(tmp_path):
    """npusim.profile() with several NPUs (docs/multichip.md, "Reports of a system run"): every
    chip's launches in device_<k>/ with their counters and per-pipe trace lanes; launch records
    of chip 1 carry the chip and counters equal to chip 0's for the same kernel on the same
    shapes (data-parallel replicas)."""
    result = child_result(textwrap.dedent(f"""
        import csv, json, os
        import numpy as np
        import npusim
        npusim.configure(chip="tiny", chips=2)
        import tensorflow as tf
        rng = np.random.default_rng(3)
        a = rng.normal(size=(64, 96)).astype(np.float32)
        b = rng.normal(size=(96, 32)).astype(np.float32)
        with tf.device("/NPU:1"):
            tf.constant(a) * 2  # before the window
        out = {{}}
        with npusim.profile({str(tmp_path / "prof")!r}) as p:
            for r in range(2):
                with tf.device(f"/NPU:{{r}}"):
                    c = tf.matmul(tf.constant(a), tf.constant(b) * (r + 1))
                    out[f"ok{{r}}"] = bool(np.allclose(c.numpy(), (a @ b) * (r + 1),
                                                       rtol=2e-2, atol=0.1))
        for k in (0, 1):
            d = os.path.join(p.directory, f"device_{{k}}")
            with open(os.path.join(d, "op_summary.csv"), newline="") as f:
                out[f"ops{{k}}"] = [r["OP Type"] for r in csv.DictReader(f)]
            with open(os.path.join(d, "counters.json")) as f:
                out[f"counters{{k}}"] = json.load(f)
            with open(os.path.join(d, "trace.json")) as f:
                ev = json.load(f)["traceEvents"]
            out[f"pipe_events{{k}}"] = sum(1 for e in ev if e.get("ph") == "X"
                                           and e.get("cat") == "insn")
        d = npusim.write_report({str(tmp_path / "all")!r})
        with open(os.path.join(d, "device_1", "launches.json")) as f:
            out["written1"] = [r["kernel"] for r in json.load(f)]
        out["pngs"] = {{s: sorted(f for f in os.listdir(os.path.join(d, s)) if f.endswith(".png"))
                       for s in ("", "device_0", "device_1")}}
        try:
            import matplotlib  # noqa: F401
            out["matplotlib"] = True
        except ImportError:
            out["matplotlib"] = False
        recs = {{k: npusim.launch_records(with_counters="flat", chip=k) for k in (0, 1)}}
        out["chips"] = sorted({{r["chip"] for k in (0, 1) for r in recs[k]}})
        mm = {{k: [r for r in recs[k] if r["op_type"] == "MatMul"] for k in (0, 1)}}
        out["mm_counters"] = [mm[k][-1]["counters"] for k in (0, 1)]
        out["mm_cycles"] = [mm[k][-1]["cycles"] for k in (0, 1)]
        print("RESULT" + json.dumps(out))
        """), timeout=240)
    assert result["ok0"] and result["ok1"]
    for k in (0, 1):
        assert "MatMul" in result[f"ops{k}"], result[f"ops{k}"]
        assert result[f"pipe_events{k}"] > 0, k
    assert result["counters0"] and result["counters1"]
    assert result["chips"] == [0, 1]
    # The whole run's report: chip 1's launches before the window too.
    assert len(result["written1"]) > len(result["ops1"])
    # Every folder has the plots (with matplotlib; each device_<k>/ of its chip's launches).
    if result["matplotlib"]:
        for sub, pngs in result["pngs"].items():
            assert pngs == ["op_time.png", "roofline.png"], (sub, pngs)
    c0, c1 = result["mm_counters"]
    assert any(k.endswith("busy_cycles") and v > 0 for k, v in c1.items()), c1
    assert c0 == c1
    assert result["mm_cycles"][0] == result["mm_cycles"][1]


def test_two_runs_of_a_mirrored_step_take_the_same_cycles(tmp_path):
    """The same MirroredStrategy training on 2 tiny NPUs in two processes gives the same
    simulated schedule: each chip's timeline, the host clock, every launch in the same order
    with the same start and cycles, every copy and collective at the same place, and the same
    reports: op_summary.csv row by row (task ids, start times, durations) and summary.txt, per
    device and at the top level, but for the allocator's peak. TensorFlow's executor threads
    issue a chip's independent ops in an order of their own; the plugin chains each NPU's nodes
    in a canonical order (launch_order.h) and times its copies into and out of a device by their data
    (docs/runtime.md, "Copies timed by data"), so the schedule does not depend on it. Before
    both, this failed in 2 of 2 runs (launch starts differed; docs/multichip.md, "Launch
    order")."""
    def run(k):
        report = tmp_path / f"report{k}"
        return child_result(mlp_on_two_npus(64) + textwrap.dedent(f"""
            import csv, os
            strategy = tf.distribute.MirroredStrategy()
            with strategy.scope():
                model = build()
                model.set_weights(init)
                model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
            model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
            info = npusim.system_info()
            npusim.write_report({str(report)!r})
            out = {{"timeline": info["timeline_cycles"], "host": info["host_cycles"],
                    "collectives": [(c["collective"], c["bytes"], c["start_cycle"],
                                     c["end_cycle"]) for c in info["collectives"]],
                    "launches": [[(r["op_name"], r["kernel"], r["start_cycle"], r["cycles"])
                                  for r in npusim.launch_records(chip=c)] for c in (0, 1)],
                    "peer_copies": info["peer_copies"],
                    "summary": {{}}, "op_summary": {{}}}}
            for d in ("", "device_0", "device_1"):
                with open(os.path.join({str(report)!r}, d, "summary.txt")) as f:
                    out["summary"][d] = f.read()
                if d:
                    with open(os.path.join({str(report)!r}, d, "op_summary.csv")) as f:
                        out["op_summary"][d] = [
                            (r["Task ID"], r["Op Name"], r["OP Type"], r["task_start_cycles"],
                             r["task_duration_cycles"]) for r in csv.DictReader(f)]
            print("RESULT" + json.dumps(out))
            """), timeout=600)

    first, second = run(1), run(2)
    assert len(first["collectives"]) >= 4 and all(len(k) > 0 for k in first["launches"])
    assert first["host"] > 0  # fit read the losses back: the host clock moved
    for key in ("timeline", "host", "collectives", "launches", "peer_copies", "op_summary"):
        assert first[key] == second[key], key

    # summary.txt but for the allocator's peak: TensorFlow frees a tensor when its last reader's
    # executor thread lets go of it, which is host timing, not simulated time.
    def timed(text):
        return [line for line in text.splitlines()
                if not line.startswith("  TensorFlow's allocator")]

    for d, text in first["summary"].items():
        assert "Device memory" in text and timed(text) == timed(second["summary"][d]), d


def test_three_runs_of_a_step_with_gradient_segments_take_the_same_cycles():
    """A MirroredStrategy SGD fit with gradient segments (grad_split="hccl", 2 steps on 2 tiny
    NPUs; benchmarks/schedule_repeatability.py's workload) in three processes: every launch at
    the same start with the same cycles, the same collectives, peer copies, timelines and host
    clock. TensorFlow's executor threads copy a step's inputs (x and y of each replica) in an
    order of their own; on the compute timeline each copy moved the kernels the driver served
    after it (chip 0's iteration counter by one copy's time), which this caught in most runs;
    copies into a device are now timed by their data (docs/runtime.md, "Copies timed by
    data")."""
    code = mlp_on_two_npus(64) + textwrap.dedent("""
        npusim.configure(grad_split="hccl")
        with tf.distribute.MirroredStrategy().scope():
            model = build()
            model.set_weights(init)
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
        npusim.clear_launch_records()
        model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0, steps_per_epoch=2)
        info = npusim.system_info()
        print("RESULT" + json.dumps({
            "launches": [[(r["op_name"], r["kernel"], r["start_cycle"], r["cycles"])
                          for r in npusim.launch_records(chip=c)] for c in (0, 1)],
            "collectives": [(c["collective"], c["bytes"], c["start_cycle"], c["end_cycle"])
                            for c in info["collectives"]],
            "peer_copies": info["peer_copies"], "timeline": info["timeline_cycles"],
            "host": info["host_cycles"]}))
        """)
    runs = [child_result(code, timeout=600) for _ in range(3)]
    first = runs[0]
    assert len(first["collectives"]) >= 2 and all(len(k) > 0 for k in first["launches"])
    for other in runs[1:]:
        for key in ("launches", "collectives", "peer_copies", "timeline", "host"):
            assert other[key] == first[key], key
