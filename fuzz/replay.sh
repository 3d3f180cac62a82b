#!/usr/bin/env bash
# Runs a fuzz target once on every file of its seed corpus (seeds.sh; no fuzzing): deterministic,
# a few seconds. On a crash prints every file that fails and exits non-zero.
#   fuzz/replay.sh FUZZ_BINARY ROOT TARGET
set -uo pipefail
BIN="$1"; ROOT="$2"; TARGET="$3"
source "$(dirname "${BASH_SOURCE[0]}")/seeds.sh"
mapfile -t DIRS < <(seed_dirs "$ROOT" "$TARGET")
mapfile -t FILES < <(find "${DIRS[@]}" -type f | sort)
if ((${#FILES[@]} == 0)); then
  echo "replay: no files in ${DIRS[*]}"; exit 1
fi
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
# libFuzzer runs each file given on the command line once, printing "Running: FILE" first.
"$BIN" -timeout=20 -rss_limit_mb=2048 "${FILES[@]}" >"$LOG" 2>&1
rc=$?
if ((rc != 0)); then
  cat "$LOG"
  # The run stops at the first failure: run the files one by one to name every failing one.
  for f in "${FILES[@]}"; do
    "$BIN" -timeout=20 -rss_limit_mb=2048 "$f" >/dev/null 2>&1 ||
      echo "replay: $(basename "$BIN") fails on $f; reproduce: $BIN $f"
  done
  exit 1
fi
echo "replay: $(basename "$BIN"): ${#FILES[@]} corpus files pass"
