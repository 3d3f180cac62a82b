#!/usr/bin/env bash
# Command-line tests: run by ctest as `bash test_cli.sh <npusim binary> <source dir>`.
set -euo pipefail
NPUSIM="$1"; ROOT="$2"
PY="$ROOT/.venv/bin/python"; [ -x "$PY" ] || PY=python3
exec "$PY" "$ROOT/tests/cli/cli_checks.py" "$NPUSIM" "$ROOT"
