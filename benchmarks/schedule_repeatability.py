"""How repeatable a data-parallel step's simulated schedule is (docs/multichip.md, "Data-parallel
training: how it scales"): runs the same MirroredStrategy fit (tests/tf/test_grad_overlap.py's
MLP, SGD, gradient segments, 2 steps on 2 tiny NPUs) in --runs fresh processes and prints, per
run, the collectives' start cycles, the chips' timeline ends and a signature of each chip's
launch order, then how many distinct schedules, launch orders and kernel-cycle sets the runs
gave. Every kernel's cycles should be the same in every run; the rest shows what still depends
on the order in which TensorFlow's executor issued the ops.

    .venv/bin/python benchmarks/schedule_repeatability.py --runs 4 [--inter-op-threads 1]
        [--launch-order off]

--launch-order on (default; NPUSIM_LAUNCH_ORDER=1) chains each NPU's nodes in the plugin's
canonical order; off leaves the step's ops in the order TensorFlow's executor issues them
(docs/multichip.md, "Launch order").
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import npusim
    npusim.configure(chip="tiny", chips=2)
    import tensorflow as tf
    import keras
    if {threads}:
        tf.config.threading.set_inter_op_parallelism_threads({threads})

    def build():
        return keras.Sequential([keras.Input((12,)), keras.layers.Dense(32, "relu"),
                                 keras.layers.Dense(32, "relu"), keras.layers.Dense(4)])

    keras.utils.set_random_seed(1)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(64, 12)).astype(np.float32)
    y = rng.integers(0, 4, size=(64,)).astype(np.int64)
    npusim.configure(grad_split="hccl")
    with tf.distribute.MirroredStrategy().scope():
        model = build()
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    npusim.clear_launch_records()
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0, steps_per_epoch=2)
    info = npusim.system_info()
    print("RESULT" + json.dumps({{
        "launches": [[(r["op_name"], r["kernel"], r["start_cycle"], r["cycles"])
                      for r in npusim.launch_records(chip=c)] for c in (0, 1)],
        "collectives": [c["start_cycle"] for c in info["collectives"]],
        "peer_copies": [(c["src_chip"], c["dst_chip"], c["bytes"], c["start_cycle"])
                        for c in info["peer_copies"]],
        "timelines": info["timeline_cycles"]}}))
    """)


def signature(items):
    return hashlib.sha1(json.dumps(items).encode()).hexdigest()[:8]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--inter-op-threads", type=int, default=0,
                    help="TensorFlow's inter-op threads (0: its default)")
    ap.add_argument("--launch-order", choices=("on", "off"), default="on",
                    help="the plugin's canonical launch order (off: NPUSIM_LAUNCH_ORDER=0)")
    args = ap.parse_args()
    code = CHILD.format(threads=args.inter_op_threads)
    schedules, orders, cycles = set(), set(), set()
    first = None
    for run in range(args.runs):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                                    NPUSIM_LAUNCH_ORDER="1" if args.launch_order == "on" else "0"), check=False)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")), None)
        if line is None:
            sys.exit(f"run {run + 1} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
        r = json.loads(line[len("RESULT"):])
        order = [signature([(n, k) for n, k, _, _ in chip]) for chip in r["launches"]]
        kernel_cycles = signature([sorted((n, k, c) for n, k, _, c in chip)
                                   for chip in r["launches"]])
        schedules.add(signature([r["launches"], r["collectives"], r["peer_copies"],
                                 r["timelines"]]))
        orders.add(tuple(order))
        cycles.add(kernel_cycles)
        print(f"run {run + 1}: collectives start {r['collectives']}, timelines end "
              f"{r['timelines']}, launch order per chip {order}, kernel cycles {kernel_cycles}")
        first = first or r
        if r["peer_copies"] != first["peer_copies"]:
            print(f"  peer copies (src, dst, bytes, start) {r['peer_copies']} (run 1: "
                  f"{first['peer_copies']})")
        for chip, (a, b) in enumerate(zip(first["launches"], r["launches"])):
            diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            if diff is not None:
                print(f"  chip {chip}: first launch unlike run 1's: #{diff} {b[diff]} "
                      f"(run 1: {a[diff]}, before it {a[max(diff - 1, 0)]})")
    print(f"{args.runs} runs: {len(schedules)} distinct schedules, {len(orders)} launch orders, "
          f"{len(cycles)} kernel-cycle sets (1 each: repeatable)")


if __name__ == "__main__":
    main()
