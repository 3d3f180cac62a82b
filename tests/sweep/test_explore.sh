#!/usr/bin/env bash
# Design-space search tests (npusim explore): run by ctest as
# `bash test_explore.sh <npusim binary> <source dir>`.
set -euo pipefail
NPUSIM="$1"; ROOT="$2"
PY="$ROOT/.venv/bin/python"; [ -x "$PY" ] || PY=python3
exec "$PY" "$ROOT/tests/sweep/explore_checks.py" "$NPUSIM" "$ROOT"
