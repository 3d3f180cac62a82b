#!/usr/bin/env bash
# `npusim collective` against numpy: run by ctest as `bash test_collective.sh <npusim> <source dir>`.
set -euo pipefail
NPUSIM="$1"; ROOT="$2"
PY="$ROOT/.venv/bin/python"; [ -x "$PY" ] || PY=python3
exec "$PY" "$ROOT/tests/cli/collective_checks.py" "$NPUSIM" "$ROOT"
