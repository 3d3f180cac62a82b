#!/usr/bin/env bash
# Report-folder tests (--report-dir): run by ctest as `bash test_report.sh <npusim> <source dir>`.
set -euo pipefail
NPUSIM="$1"; ROOT="$2"
PY="$ROOT/.venv/bin/python"; [ -x "$PY" ] || PY=python3
exec "$PY" "$ROOT/tests/cli/report_checks.py" "$NPUSIM" "$ROOT"
