#!/usr/bin/env bash
# `npusim collective --report-dir`: run by ctest as `bash test_collective_report.sh <npusim> <source dir>`.
set -euo pipefail
NPUSIM="$1"; ROOT="$2"
PY="$ROOT/.venv/bin/python"; [ -x "$PY" ] || PY=python3
exec "$PY" "$ROOT/tests/cli/collective_report_checks.py" "$NPUSIM" "$ROOT"
