#!/usr/bin/env bash
# Sanitizer build and fuzzing (fuzz/README.md). Builds the libFuzzer targets with clang under
# AddressSanitizer and UndefinedBehaviorSanitizer in a separate build folder, replays every
# corpus file once (ctest), then fuzzes each target for a bounded time. A crash fails the script
# and prints the input that caused it.
#   scripts/fuzz.sh               what scripts/test.sh runs
#   scripts/fuzz.sh --unit-tests  also builds and runs the SystemC-free unit tests (test_isa,
#                                 test_config, test_exec, test_verifier) under the sanitizers
# Environment: NPUSIM_FUZZ_BUILD_DIR (default build-fuzz), NPUSIM_FUZZ_SECONDS (per target,
# default 20; 0 skips the fuzzing), NPUSIM_FUZZ_TARGETS (default: all), NPUSIM_JOBS.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NPUSIM_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
JOBS="${NPUSIM_JOBS:-$(nproc)}"
FUZZ_SECONDS="${NPUSIM_FUZZ_SECONDS:-20}"
TARGETS=(${NPUSIM_FUZZ_TARGETS:-assembler kernel_file verifier config npy})
UNIT_TESTS=0
[ "${1:-}" = "--unit-tests" ] && UNIT_TESTS=1
CXX="${NPUSIM_FUZZ_CXX:-clang++-16}"

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" "${LAUNCHER[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER="$CXX" -DNPUSIM_FUZZ=ON >/dev/null
fi
BUILD_TARGETS=("${TARGETS[@]/#/fuzz_}")
((UNIT_TESTS)) && BUILD_TARGETS+=(test_isa test_config test_exec test_verifier)
cmake --build "$BUILD" -j "$JOBS" --target "${BUILD_TARGETS[@]}"

export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export NPUSIM_CONFIG_DIR="$ROOT/configs/chips"
TESTS="^fuzz_($(IFS='|'; echo "${TARGETS[*]}"))_corpus\$"
((UNIT_TESTS)) && TESTS="$TESTS|^(isa|config|exec|verifier)\$"
(cd "$BUILD" && ctest --output-on-failure -j "$JOBS" -R "$TESTS")

((FUZZ_SECONDS > 0)) || exit 0
# New inputs and crashes go to a scratch folder; the repository's corpus is only read.
WORK="$BUILD/fuzz-work"
for t in "${TARGETS[@]}"; do
  rm -rf "$WORK/crashes/$t"
  mkdir -p "$WORK/corpus/$t" "$WORK/crashes/$t"
  echo "fuzz: $t for ${FUZZ_SECONDS}s"
  if ! "$BUILD/fuzz/fuzz_$t" -max_total_time="$FUZZ_SECONDS" -timeout=20 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$WORK/crashes/$t/" \
      "$WORK/corpus/$t" "$ROOT/fuzz/corpus/$t" >"$WORK/$t.log" 2>&1; then
    tail -n 60 "$WORK/$t.log"
    for f in "$WORK/crashes/$t"/*; do
      [ -e "$f" ] && echo "fuzz: fuzz_$t crashed; reproducer: $f (rerun: $BUILD/fuzz/fuzz_$t $f)"
    done
    exit 1
  fi
  grep -a -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "$WORK/$t.log" | tail -n 2 || true
done
echo "fuzz: done"
