#!/usr/bin/env bash
# `npusim sweep --ray` on a two-node Ray cluster at 127.0.0.1: run by ctest as
# `bash test_sweep_ray.sh <npusim binary> <source dir>`.
set -euo pipefail
NPUSIM="$1"; ROOT="$2"
PY="$ROOT/.venv/bin/python"; [ -x "$PY" ] || PY=python3
exec "$PY" "$ROOT/tests/sweep/ray_checks.py" "$NPUSIM" "$ROOT"
