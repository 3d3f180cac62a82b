#!/usr/bin/env bash
# `npusim validate` checks: run by ctest as `bash test_validate.sh <npusim binary> <source dir>`.
set -euo pipefail
NPUSIM="$1"; ROOT="$2"
PY="$ROOT/.venv/bin/python"; [ -x "$PY" ] || PY=python3
exec "$PY" "$ROOT/tests/cli/validate_checks.py" "$NPUSIM" "$ROOT"
