#!/usr/bin/env bash
# Architecture sweep tests: run by ctest as `bash test_sweep.sh <npusim binary> <source dir>`.
set -euo pipefail
NPUSIM="$1"; ROOT="$2"
PY="$ROOT/.venv/bin/python"; [ -x "$PY" ] || PY=python3
exec "$PY" "$ROOT/tests/sweep/sweep_checks.py" "$NPUSIM" "$ROOT"
