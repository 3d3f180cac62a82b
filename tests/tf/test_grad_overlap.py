"""Gradient all-reduces overlapping the backward pass, in gradient segments (docs/multichip.md,
"Gradient segments and overlap"): MirroredStrategy on 2 tiny NPUs fuses a step's gradients
into HCCL's default segments, each segment's all-reduce runs on the chips' communication
timelines from the moment its gradients are written while the chips compute on, and the results
are bit for bit those of one all-reduce per gradient (and track one NPU on the global batch).
Every test runs a child process (the device count is fixed per process)."""

import os
import re
import sys
import textwrap

import pytest

pytest.importorskip("tensorflow")

from conftest import child_result  # noqa: E402  pylint: disable=wrong-import-position

PRELUDE = textwrap.dedent("""
    import json
    import numpy as np
    import npusim
    npusim.configure(chip="tiny", chips=2)
    import tensorflow as tf
    import keras

    def build():
        return keras.Sequential([keras.Input((12,)), keras.layers.Dense(32, "relu"),
                                 keras.layers.Dense(32, "relu"), keras.layers.Dense(4)])

    keras.utils.set_random_seed(1)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(64, 12)).astype(np.float32)
    y = rng.integers(0, 4, size=(64,)).astype(np.int64)
    init = build().get_weights()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    """)


def overlap(a, b):
    """Cycles of the union of intervals `a` that lie inside the union of `b` (the benchmark's
    exposed-communication arithmetic)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "benchmarks"))
    from bench_data_parallel import covered  # pylint: disable=import-outside-toplevel

    return covered(a, b)


def test_gradient_segments_overlap_the_backward_pass_and_match_per_tensor_all_reduce(tmp_path):
    result = child_result(PRELUDE + textwrap.dedent(f"""
        import os

        def train(model, split, steps=2):
            npusim.configure(grad_split=split)
            model.set_weights(init)
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
            npusim.clear_launch_records()
            h = model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0,
                          steps_per_epoch=steps)
            info = npusim.system_info()
            return {{"losses": h.history["loss"],
                    "weights": [w.tolist() for w in model.get_weights()],
                    "launches": [[(r["start_cycle"], r["start_cycle"] + r["cycles"])
                                  for r in npusim.launch_records(chip=c)] for c in (0, 1)],
                    "collectives": [c for c in info["collectives"]
                                    if c["collective"] == "all_reduce"],
                    "after": info["timeline_cycles"]}}

        out = {{"sizes": [int(np.prod(w.shape)) for w in init]}}
        one = build()
        out["one"] = train(one, "hccl")  # NPU:0 alone: no collective
        strategy = tf.distribute.MirroredStrategy()
        with strategy.scope():
            fused_model = build()
            tensor_model = build()
        out["fused"] = train(fused_model, "hccl")
        with open(os.path.join(npusim.write_report({str(tmp_path)!r}), "summary.txt")) as f:
            out["summary"] = f.read()
        out["tensor"] = train(tensor_model, "tensor")
        print("RESULT" + json.dumps(out))
        """), timeout=900)
    np = pytest.importorskip("numpy")
    sizes = result["sizes"]  # kernel, bias of three layers, in variable order
    fused, tensor, one = result["fused"], result["tensor"], result["one"]

    # Bit for bit what one all-reduce per gradient gives (2 ranks: a + b either way round), and
    # within the tolerance of one NPU on the global batch.
    assert fused["losses"] == tensor["losses"]
    for a, b in zip(fused["weights"], tensor["weights"]):
        assert np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    assert np.allclose(fused["losses"], one["losses"], rtol=1e-4, atol=1e-5)
    for a, b in zip(fused["weights"], one["weights"]):
        assert np.allclose(a, b, atol=1e-4)

    # HCCL's default split, derived here: a gradient belongs to the segment its last byte falls
    # in, the first segment ending at 96.54 % of the bytes.
    total, at, second = sum(sizes), 0, []
    for i, n in enumerate(sizes):
        at += n
        if 100.0 * at / total > 96.54:
            second.append(i)
    first_count = sum(n for i, n in enumerate(sizes) if i not in second)
    second_count = sum(sizes[i] for i in second)
    steps = 2
    assert [c["count"] for c in fused["collectives"]] == [second_count, first_count] * steps
    assert len(tensor["collectives"]) == len(sizes) * steps
    assert sorted(c["count"] for c in tensor["collectives"]) == sorted(sizes * steps)

    # The last segment's all-reduce (each step's first) starts before the backward pass is over:
    # it starts once every rank has written its gradients, and the rank that wrote them last (the
    # one whose launch ends latest by the collective's start) computes the first layers'
    # gradients while it runs. (The other rank may have finished its backward pass before: the
    # chips' timelines are skewed by the work only chip 0 does, the metrics and the loss's mean,
    # and by each chip's host dispatches.)
    def gating_chip(coll):
        return max((0, 1), key=lambda c: max(e for _, e in fused["launches"][c]
                                             if e <= coll["start_cycle"] + 1))

    gating = set()
    for coll in fused["collectives"][0::2]:
        c = gating_chip(coll)
        gating.add(c)
        assert overlap([(coll["start_cycle"], coll["end_cycle"])], fused["launches"][c]) > 0, c
    # Per step the segments run in order on the communication timeline, and the chips'
    # timelines end after the last one (the updates read its output).
    for a, b in zip(fused["collectives"], fused["collectives"][1:]):
        assert b["start_cycle"] >= a["end_cycle"]
    assert all(t >= fused["collectives"][-1]["end_cycle"] for t in fused["after"])
    # summary.txt splits each chip's time: compute = the union of the chip's kernels (the top
    # level lists chip 0's launches but counts every chip's here), communication = the union of
    # the collectives it is a rank of, overlap = both at once, derived here from the records;
    # the overlap is real on the chips that gated a segment's all-reduce.
    clock_mhz = float(re.search(r"^clock_mhz:\s*([0-9.eE+-]+)",
                                (tmp_path / "chip.yaml").read_text(), re.M).group(1))
    lines = result["summary"].split("Time per chip")[1].splitlines()
    for chip in (0, 1):
        row = next(ln.split() for ln in lines if ln.split() and ln.split()[0] == str(chip))
        compute_us, comm_us, overlap_us, exposed_us = (float(v) for v in row[1:5])
        kernels = fused["launches"][chip]
        comms = [(c["start_cycle"], c["end_cycle"]) for c in fused["collectives"]
                 if chip in c["chips"]]
        assert compute_us == pytest.approx(overlap(kernels, kernels) / clock_mhz, abs=2e-3), chip
        assert comm_us == pytest.approx(overlap(comms, comms) / clock_mhz, abs=2e-3), chip
        assert overlap_us == pytest.approx(overlap(comms, kernels) / clock_mhz, abs=2e-3), chip
        assert overlap_us > 0 or chip not in gating, chip
        assert exposed_us == pytest.approx(comm_us - overlap_us, abs=2e-3)
    # Fewer collectives, so fewer link latencies: the fused step is not slower in total link time.
    def busy(run):
        return sum(c["end_cycle"] - c["start_cycle"] for c in run["collectives"])

    assert busy(fused) < busy(tensor)


def test_fused_all_reduce_equals_per_tensor_for_every_dtype_and_split():
    """npusim.distribute.all_reduce(fuse=True) on mixed dtypes and shapes: one collective per
    segment and dtype, results equal to fuse=False (and to numpy); the split strategies and their
    errors."""
    result = child_result(PRELUDE + textwrap.dedent("""
        from npusim import distribute as d
        rng = np.random.default_rng(5)
        shapes = [(3, 5), (7,), (2, 2, 4), (11,), (1,), (6, 3)]
        dtypes = [tf.float32, tf.int32, tf.float32, tf.float32, tf.int32, tf.float16]
        host = [[rng.normal(size=s).astype(dt.as_numpy_dtype) if dt != tf.int32 else
                 rng.integers(-50, 50, size=s).astype(np.int32)
                 for s, dt in zip(shapes, dtypes)] for _ in range(2)]
        per_replica = []
        for r in range(2):
            with tf.device(f"/NPU:{r}"):
                per_replica.append([tf.constant(v) for v in host[r]])
        out = {}
        for split in ("hccl", [40, 60], ("idx", [1, 3, 5]), "tensor"):
            npusim.configure(grad_split=split)
            npusim.clear_launch_records()
            for op in ("sum", "max"):
                fused = d.all_reduce(per_replica, op, fuse=True)
                plain = d.all_reduce(per_replica, op)
                out[f"{split}-{op}-equal"] = all(
                    np.array_equal(f.numpy(), p.numpy()) and f.dtype == p.dtype and
                    f.shape == p.shape for r in range(2) for f, p in zip(fused[r], plain[r]))
                ref = [np.maximum(a, b) if op == "max" else a + b
                       for a, b in zip(host[0], host[1])]
                out[f"{split}-{op}-numpy"] = all(
                    np.array_equal(f.numpy(), ref[i]) for i, f in enumerate(fused[1]))
            colls = npusim.system_info()["collectives"]
            out[f"{split}-collectives"] = len(colls)
        errors = {}
        for bad in ("abc", [50, 40], ("idx", [3, 1]), 7):
            try:
                npusim.configure(grad_split=bad)
                errors[repr(bad)] = None
            except (npusim.NpusimError, TypeError) as e:
                errors[repr(bad)] = f"{type(e).__name__}: {e}"
        d.set_split_strategy_by_idx([1, 2])  # the list has 6 tensors: the last must be 5
        try:
            d.all_reduce(per_replica, "sum", fuse=True)
            errors["short idx"] = None
        except npusim.NpusimError as e:
            errors["short idx"] = str(e)
        out["errors"] = errors
        print("RESULT" + json.dumps(out))
        """), timeout=900)
    for key, value in result.items():
        if key.endswith("-equal") or key.endswith("-numpy"):
            assert value, key
    # Per op: one collective per segment and dtype (fuse=True), then one per tensor.
    tensors = 6
    assert result["tensor-collectives"] == 2 * (tensors + tensors)
    # hccl: f32 (3, 5), (7 x ... ): sizes in bytes 60, 28, 64, 44, 4, 36 (236): the last byte
    # of tensor 4 is at 200 / 236 = 84.7 %, of tensor 5 at 100 %: segments {0..4}, {5}; dtypes
    # in segment 0: f32 and i32 -> 2 collectives, segment 1: f16 -> 1.
    assert result["hccl-collectives"] == 2 * (3 + tensors)
    # [40, 60]: 40 % = 94.4 bytes: tensors 0, 1 (60, 88) then 2..5: {f32, i32}, {f32, i32, f16}.
    assert result["[40, 60]-collectives"] == 2 * (5 + tensors)
    # idx [1, 3, 5]: {0, 1}, {2, 3}, {4, 5}: {f32, i32}, {f32}, {i32, f16}.
    assert result["('idx', [1, 3, 5])-collectives"] == 2 * (5 + tensors)
    errors = result["errors"]
    assert "is not a gradient split" in errors["'abc'"]
    assert "is not a gradient split" in errors["[50, 40]"]
    assert errors["('idx', [3, 1])"] is None  # checked against the gradients when reducing
    assert errors["7"].startswith("TypeError")
    assert "ending with the last one, 5" in errors["short idx"]
