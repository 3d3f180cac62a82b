"""One training step of a Keras recurrent text classifier on the NPU (910b): Embedding(1000, 32),
LSTM(64) or GRU(64), Dense(10) on 40 ids at batch 2, SGD(0.1), sparse cross-entropy from
logits; `train_on_batch` twice, the second measured. Prints one JSON line: the measured step's
launches, summed kernel cycles, device timeline (first launch's host dispatch to the last
launch's end) and the host dispatch in it, in us, and the ops that fell back to the CPU. With
NPUSIM_REPORT_DIR set the report (op_summary.csv: each launch's "Task Wait Time(us)";
trace.json: the HDC copies) covers both steps.

  .venv/bin/python benchmarks/rnn_train_step.py lstm|gru
"""
import json
import os
import sys

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import npusim  # pylint: disable=wrong-import-position

npusim.configure(chip=os.environ.get("CHIP", "910b"))
import keras  # pylint: disable=wrong-import-position
from keras import layers  # pylint: disable=wrong-import-position


def main():
    kind = sys.argv[1] if len(sys.argv) > 1 else "lstm"
    if kind not in ("lstm", "gru"):
        sys.exit("usage: rnn_train_step.py lstm|gru")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1000, (2, 40)).astype(np.int32)
    labels = rng.integers(0, 10, (2,)).astype(np.int32)
    cell = {"lstm": layers.LSTM, "gru": layers.GRU}[kind](64)
    model = keras.Sequential([keras.Input((40,), dtype="int32"), layers.Embedding(1000, 32), cell,
                              layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = ids, labels
    model.train_on_batch(x, y)
    npusim.clear_launch_records()
    model.train_on_batch(x, y)
    recs = npusim.launch_records()
    cycles = sum(r["cycles"] for r in recs)
    us_per_cycle = sum(r["time_us"] for r in recs) / cycles
    span = (max(r["start_cycle"] + r["cycles"] for r in recs)
            - min(r["start_cycle"] - r["host_dispatch_cycles"] for r in recs))
    print(json.dumps({
        "model": kind, "launches": len(recs), "kernel_cycles": cycles,
        "timeline_us": round(span * us_per_cycle, 1),
        "host_dispatch_us": round(sum(r["host_dispatch_cycles"] for r in recs) * us_per_cycle, 1),
        "cpu_fallback_ops": npusim.cpu_fallback_ops()}))


if __name__ == "__main__":
    main()
