#!/usr/bin/env bash
# Sanitizer build and fuzzing (fuzz/README.md). Builds the libFuzzer targets with clang under
# AddressSanitizer and UndefinedBehaviorSanitizer in a separate build folder, replays every
# corpus file once (ctest), then fuzzes each target from a fixed seed for a fixed number of inputs
# (about 20 s each here: the same work on a fast or a slow machine). A crash fails the script and
# prints the input that caused it.
#   scripts/fuzz.sh               what scripts/test.sh runs
#   scripts/fuzz.sh --unit-tests  also builds and runs the SystemC-free unit tests (test_isa,
#                                 test_config, test_exec, test_verifier) under the sanitizers
# Environment: NPUSIM_FUZZ_BUILD_DIR (default build-fuzz), NPUSIM_FUZZ_SEED (default 1),
# NPUSIM_FUZZ_RUNS_SCALE (multiplies each target's inputs; default 1, 0 skips the fuzzing),
# NPUSIM_FUZZ_SECONDS (a cap per target, default 120: a slow machine stops early rather than
# taking long), NPUSIM_FUZZ_TARGETS (default: all), NPUSIM_JOBS.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NPUSIM_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
JOBS="${NPUSIM_JOBS:-$(nproc)}"
FUZZ_SECONDS="${NPUSIM_FUZZ_SECONDS:-120}"
FUZZ_SEED="${NPUSIM_FUZZ_SEED:-1}"
RUNS_SCALE="${NPUSIM_FUZZ_RUNS_SCALE:-1}"
# Inputs per target: about 20 s of each on a 2-core host (the targets' speeds differ 100-fold).
declare -A RUNS=([assembler]=40000 [kernel_file]=60000 [verifier]=35000 [config]=6000
                 [system]=5000 [npy]=400000 [om]=15000)
TARGETS=(${NPUSIM_FUZZ_TARGETS:-assembler kernel_file verifier config system npy om})
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

((FUZZ_SECONDS > 0 && RUNS_SCALE > 0)) || exit 0
# New inputs and crashes go to a scratch folder, emptied first so that a run starts from the
# repository's corpus alone (which is only read).
WORK="$BUILD/fuzz-work"
source "$ROOT/fuzz/seeds.sh"
for t in "${TARGETS[@]}"; do
  rm -rf "$WORK/crashes/$t" "$WORK/corpus/$t"
  mkdir -p "$WORK/corpus/$t" "$WORK/crashes/$t"
  runs=$((RUNS[$t] * RUNS_SCALE))
  echo "fuzz: $t, $runs inputs from seed $FUZZ_SEED (at most ${FUZZ_SECONDS}s)"
  if ! "$BUILD/fuzz/fuzz_$t" -seed="$FUZZ_SEED" -runs="$runs" -max_total_time="$FUZZ_SECONDS" \
      -timeout=20 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$WORK/crashes/$t/" \
      "$WORK/corpus/$t" $(seed_dirs "$ROOT" "$t") >"$WORK/$t.log" 2>&1; then
    tail -n 60 "$WORK/$t.log"
    for f in "$WORK/crashes/$t"/*; do
      [ -e "$f" ] && echo "fuzz: fuzz_$t crashed; reproducer: $f (rerun: $BUILD/fuzz/fuzz_$t $f)"
    done
    exit 1
  fi
  grep -a -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "$WORK/$t.log" | tail -n 2 || true
done
echo "fuzz: done"
