"""The README's main job: train the MLP for one epoch on the emulated NPU and report it.

    .venv/bin/python -m models.train_demo [--chip 910b] [--set key=value ...]
        [--samples 2048] [--batch 32] [--epochs 1] [--report-dir out/mlp_910b]

What it does, as a TensorFlow user would: `import npusim` (the only addition to plain Keras
code), build the 784-128-10 Dense MLP with Dropout (models/mlp.py), compile it with Adam and
sparse categorical cross-entropy, and `model.fit` it on synthetic data with Keras' own progress
bar. Every op of the train step runs as kernels on the chip model. At the end it prints the
final loss and a per-op-type summary from the chip's counters (op type, count, simulated time,
cube and vector utilisation), and leaves the msprof-style report folder (op_summary.csv,
op_statistic.csv, trace.json, summary.txt, plots; docs/reports.md) in --report-dir.

The data: standard-normal inputs labelled by a fixed random linear "teacher" (the argmax of
x @ W over 10 classes), so the task is learnable and the loss falls within one epoch; seeded,
so a run is repeatable.
"""

import argparse
import os
import sys
import time

import numpy as np

DEFAULT_REPORT_DIR = os.path.join("out", "mlp_910b")


def teacher_data(samples, features, classes, seed=0):
    """(x, y): float32 inputs and the int32 labels a fixed random linear map gives them."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, features)).astype(np.float32)
    teacher = rng.standard_normal((features, classes)).astype(np.float32)
    return x, np.argmax(x @ teacher, axis=1).astype(np.int32)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m models.train_demo", description=__doc__.split(
        "\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chip", default="910b", help="chip preset or YAML file (default 910b)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="chip config override, e.g. memory.hbm.gbps=900 (repeat)")
    p.add_argument("--samples", type=int, default=2048, help="training samples (default 2048)")
    p.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    p.add_argument("--epochs", type=int, default=1, help="epochs (default 1)")
    p.add_argument("--report-dir", default=DEFAULT_REPORT_DIR,
                   help=f"report folder (default {DEFAULT_REPORT_DIR}); '' for none")
    p.add_argument("--top", type=int, default=12, help="op types in the summary (default 12)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import npusim  # pylint: disable=import-outside-toplevel

    npusim.configure(chip=args.chip, overrides=args.overrides)
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import models  # pylint: disable=import-outside-toplevel

    print(f"npusim: training the MLP (784-128-10, Dropout) for {args.epochs} epoch(s) on "
          f"{args.samples} synthetic samples, batch {args.batch}, chip '{args.chip}'"
          + (f" with {', '.join(args.overrides)}" if args.overrides else ""))
    print("devices:", ", ".join(d.name for d in tf.config.list_logical_devices("NPU")))
    x, y = teacher_data(args.samples, models.input_shape("mlp")[0], 10)
    model = models.build("mlp", seed=0)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])

    report = args.report_dir or None
    started = time.perf_counter()
    if report:
        with npusim.profile(report):
            history = model.fit(x, y, batch_size=args.batch, epochs=args.epochs)
    else:
        history = model.fit(x, y, batch_size=args.batch, epochs=args.epochs)
    wall = time.perf_counter() - started

    losses = history.history["loss"]
    print(f"\nfinal loss {losses[-1]:.4f} (first epoch {losses[0]:.4f}), accuracy "
          f"{history.history['accuracy'][-1]:.3f}; wall time {wall:.1f} s")
    print(f"\nper-op summary on the NPU (top {args.top} op types by simulated time):")
    print(npusim.format_op_summary(npusim.op_summary(top=args.top)))
    fallbacks = npusim.cpu_fallback_ops() if hasattr(npusim, "cpu_fallback_ops") else {}
    if fallbacks:
        print("ops that ran on the CPU (no NPU kernel):",
              ", ".join(f"{k} x{v}" for k, v in sorted(fallbacks.items())))
    if report:
        print(f"\nreport folder: {report} (op_summary.csv, op_statistic.csv, summary.txt, "
              "trace.json for Perfetto, roofline.png, op_time.png)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
