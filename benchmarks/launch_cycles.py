"""Emulator-speed check for simulator and compiler work: runs a model's inference (default
ResNet-50, batch 1; MODE=train: a training step, Adam, at BATCH, default 2) through TensorFlow
on the NPU (910b, or $CHIP), one warm-up step and STEPS measured steps; prints s/step, and per
op type the launches, the emulator's wall time (launch records' wall_us) and the simulated
cycles; with OUT=file.json writes every launch of the last step as (kernel, block_dim, cycles)
and a digest of the output's bytes. benchmarks/compare_launches.py A.json B.json then checks
that a change meant to make the emulator faster left every simulated cycle and every output bit
alone.

Training steps launch independent ops (the gradients of different layers) in an order TF's
executor chooses at run time, so the launch list of a training step is compared as a multiset
(compare_launches.py sorts it when the JSON says "unordered"); the output digest is the loss.

MODE=train with LOSS_SCALE_FACTOR=k: Adam's `loss_scale_factor=k` (Keras' constant loss scale:
the loss times k before the gradients, every gradient divided by k before the update).

Usage: [NPUSIM_GRAPH=0] [NPUSIM_TF_PLUGIN=build-x/libnpusim_tf_plugin.so] [STEPS=2] [OUT=a.json] [CHIP=910b] \
       [MODE=infer|train] [BATCH=2] [LOSS_SCALE_FACTOR=k] \
       .venv/bin/python benchmarks/launch_cycles.py [resnet50|mlp|cnn|...]
"""
import collections, hashlib, json, os, sys, time

import numpy as np
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import npusim
npusim.configure(chip=os.environ.get("CHIP", "910b"))
import tensorflow as tf
import models
name = sys.argv[1] if len(sys.argv) > 1 else "resnet50"
steps = int(os.environ.get("STEPS", "2"))
train = os.environ.get("MODE", "infer") == "train"
x, labels = models.synthetic_data(name, int(os.environ.get("BATCH", "2")) if train else 1, seed=0)
with tf.device("/NPU:0"):
    model = models.build(name, seed=0)
    # A model of several inputs (the BERT models: ids, segments, mask) takes a dict of arrays.
    xt = tf.nest.map_structure(tf.constant, x)
    if train:
        scale = os.environ.get("LOSS_SCALE_FACTOR")
        opt = tf.keras.optimizers.Adam(1e-3, loss_scale_factor=float(scale) if scale else None)
        loss_fn = models.loss(name)
        yt = tf.nest.map_structure(tf.constant, labels)
        # A model of several outputs (the BERT models: masked LM and next sentence) has a list of
        # losses, one per output in order, and a tuple of targets: the loss is their sum (as
        # Keras' compile adds them).
        losses = loss_fn if isinstance(loss_fn, (list, tuple)) else [loss_fn]
        targets = yt if isinstance(yt, (list, tuple)) else [yt]

        def train_step(t):
            with tf.GradientTape() as tape:
                outputs = model(t, training=True)
                outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
                loss = tf.add_n([f(y, o) for f, y, o in zip(losses, targets, outputs)])
                scaled = opt.scale_loss(loss)  # the loss itself without a loss scale factor
            grads = tape.gradient(scaled, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        f = tf.function(train_step)
    else:
        f = tf.function(lambda t: model(t, training=False))
    tf.nest.map_structure(lambda t: t.numpy(), f(xt))
    for _ in range(steps):
        # Only the last step's records are kept: reading them every step would make Python's
        # garbage collector walk them during the next (timed) step.
        npusim.clear_launch_records()
        t0, c0 = time.perf_counter(), time.process_time()
        # The loss, or the model's output (a dict of tensors for a model of several outputs),
        # as one array of its values.
        y = np.concatenate([np.ravel(t.numpy()) for t in tf.nest.flatten(f(xt))])
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        # CPU seconds (all threads) vary less than wall time on a shared host.
        print(f"s/step {dt:.3f}  cpu-s/step {dc:.3f}", flush=True)
recs = npusim.launch_records()
w = collections.defaultdict(lambda: [0, 0.0, 0])  # op type: launches, wall us, cycles
for r in recs:
    e = w[r["op_type"]]; e[0] += 1; e[1] += r["wall_us"]; e[2] += r["cycles"]
print(f"launches {len(recs)}  emulator wall in launches {sum(e[1] for e in w.values())/1e3:.1f} ms  "
      f"replayed {sum(bool(r.get('replayed')) for r in recs)}")
# Simulated figures of the last step: the launches' cycles summed, and the cube's share of the
# chip's peak over the launches' time (op_summary's per-op figures weighted by time).
rows = npusim.op_summary()
busy_us = sum(r["time_us"] for r in rows) or 1.0
print(f"simulated cycles {sum(r['cycles'] for r in recs):,}  "
      f"cube utilisation {sum(r['cube_utilization_pct'] * r['time_us'] for r in rows) / busy_us:.1f}%")
# Launches that ran beside others (NPUSIM_GRAPH_CONCURRENT=1 runs a group's launches at once):
# how many, the cycles some launch was running (the union of their intervals; the launches'
# cycles summed when none overlap) and the cube utilisation over that union: the same cube work
# over the time the chip was busy, where the figure above divides by the summed durations.
spans = sorted((r["start_cycle"], r["start_cycle"] + r["cycles"]) for r in recs)
beside = sum(any(a < e and s < b for j, (a, b) in enumerate(spans) if j != i)
             for i, (s, e) in enumerate(spans))
if beside:
    union, reach = 0, 0
    for s, e in spans:
        union += max(0, e - max(s, reach))
        reach = max(reach, e)
    us_per_cycle = sum(r["time_us"] for r in recs) / max(1, sum(r["cycles"] for r in recs))
    print(f"launches beside others {beside}  busy (union) {union:,} cycles  cube utilisation "
          f"over it {sum(r['cube_utilization_pct'] * r['time_us'] for r in rows) / (union * us_per_cycle):.1f}%")
# The step on the device timeline: from its first launch's host dispatch to its last launch's
# end (host dispatch, copies between launches and kernels; NPUSIM_GRAPH=0 vs whole graphs), and
# the task lists it ran (a whole graph's run, or one op dispatched on its own).
span = (max(r["start_cycle"] + r["cycles"] for r in recs)
        - min(r["start_cycle"] - r["host_dispatch_cycles"] for r in recs))
print(f"device timeline per step {span:,} cycles  host dispatch "
      f"{sum(r['host_dispatch_cycles'] for r in recs):,} cycles  "
      f"task lists {len({('g', r['graph_run']) if r.get('graph_run') else ('op', r.get('dispatch')) for r in recs})}")
for k, e in sorted(w.items(), key=lambda kv: -kv[1][1]):
    print(f"  {k:12} n={e[0]:4} wall={e[1]/1e3:8.1f} ms  cycles={e[2]:11,}")
out = os.environ.get("OUT")
if out:
    json.dump({"launches": [[r["kernel"], r["block_dim"], r["cycles"]] for r in recs],
               "unordered": train,
               "output_sum": float(abs(y).sum()),
               # The output's exact bytes (a softmax output sums to 1 whatever it holds).
               "output_sha1": hashlib.sha1(y.tobytes()).hexdigest()}, open(out, "w"))
    print("wrote", out)
