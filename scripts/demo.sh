#!/usr/bin/env bash
# The main job on a built-in default: sets everything up, then trains the Keras MLP (784-128-10
# with Dropout) for one epoch of synthetic data on the emulated 910B-like chip through the
# TensorFlow plugin (`import npusim`), with Keras' progress bar, and prints the final loss and a
# per-op summary from the chip's counters; the msprof-style report goes to out/mlp_910b/.
# Extra arguments go to models/train_demo.py (e.g. --chip tiny, --set memory.hbm.gbps=900,
# --epochs 2, --report-dir DIR). The hand-written kernel demo is `build/npusim demo`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh" --no-tests >/dev/null  # progress on stderr
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m models.train_demo "$@"
