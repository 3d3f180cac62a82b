#!/usr/bin/env bash
# Runs every npusim test after setting everything up: C++ unit and SystemC tests and the
# command-line tests (ctest), once more with every replayed launch checked against a simulation
# of it (NPUSIM_REPLAY=check, docs/chip_model.md "Launch replay"), then the TensorFlow
# adapter's tests (pytest; they skip themselves when TensorFlow is not installed), then the
# sanitizer build's unit tests, corpus replay and bounded fuzzing (scripts/fuzz.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NPUSIM_BUILD_DIR:-$ROOT/build}"
"$ROOT/scripts/setup.sh"
export PATH="$ROOT/.venv/bin:$PATH"
(cd "$BUILD" && ctest --output-on-failure -j "${NPUSIM_JOBS:-$(nproc)}")
(cd "$BUILD" && NPUSIM_REPLAY=check ctest --output-on-failure -j "${NPUSIM_JOBS:-$(nproc)}")
NPUSIM_BUILD_DIR="$BUILD" "$ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider "$ROOT/tests/tf"
"$ROOT/scripts/fuzz.sh"
# C++ formatting of the files scripts/format_checked_files.txt lists (docs/DESIGN.md), and
# includes that point down the layers only (docs/DESIGN.md, "Layer libraries").
"$ROOT/scripts/check_format.sh"
"$ROOT/scripts/check_layers.sh"
