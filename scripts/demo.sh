#!/usr/bin/env bash
# The main job on a built-in default: sets everything up, then runs the demo kernels (a
# double-buffered fp16 GEMM on all cube cores and a vector add on all vector cores) on the
# default 910B-like chip, checks their results against a host reference, and prints the counter
# summary. Extra arguments go to `npusim demo` (e.g. --chip tiny, --report-dir out/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NPUSIM_BUILD_DIR:-$ROOT/build}"
"$ROOT/scripts/setup.sh" >/dev/null
exec "$BUILD/npusim" demo "$@"
