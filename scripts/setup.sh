#!/usr/bin/env bash
# Installs everything npusim needs on a fresh Debian 12 machine and builds it. Idempotent: a
# second run only rebuilds what changed.
#   scripts/setup.sh            Debian packages, Python virtual environment (.venv), build/
#   scripts/setup.sh --no-tests the same, building only the command line and the TF plugin
#                               (scripts/demo.sh; scripts/test.sh builds the rest)
# Progress goes to stderr, one line per phase and per 5 % of the build, so a caller that
# silences stdout still shows it. With ccache installed (it is in the Debian packages) the
# build goes through it, keyed relative to the repository (CCACHE_BASEDIR), so a second clone
# or a fresh build directory reuses what was compiled before.
# Environment: NPUSIM_BUILD_DIR (default build), NPUSIM_JOBS (default: nproc).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NPUSIM_BUILD_DIR:-$ROOT/build}"
JOBS="${NPUSIM_JOBS:-$(nproc)}"
TESTS=1
for arg in "$@"; do
  case "$arg" in
    --no-tests) TESTS=0 ;;
    *) echo "setup: unknown argument '$arg' (known: --no-tests)" >&2; exit 2 ;;
  esac
done

# "setup: [phase] message (elapsed)" on stderr.
step() { echo "setup: $* (${SECONDS}s)" >&2; }

# Reads the build tool's output: ninja's "[done/total] ..." lines become one line per 5 % of the
# targets; everything else (warnings, errors, make's output) passes through.
build_progress() {
  awk '/^\[[0-9]+\/[0-9]+\] / {
         split(substr($1, 2, length($1) - 2), n, "/")
         pct = int(100 * n[1] / n[2])
         if (pct >= shown + 5 || n[1] == n[2]) {
           shown = pct; printf "setup:   build %3d%% %s\n", pct, $0; fflush()
         }
         next
       }
       !/^ninja: (Entering|Leaving) directory/ { print; fflush() }' >&2
}

# Debian packages: compilers, SystemC (C++17 build), Eigen, fmt, spdlog, Catch2 v2, yaml-cpp,
# nlohmann-json, CLI11, pybind11, Python's venv; ccache; clang 16 with its sanitizer and libFuzzer
# runtimes for scripts/fuzz.sh; clang-format-14 for scripts/check_format.sh; protoc
# (protobuf-compiler) for the Chakra trace test (tests/tf/test_chakra.py).
APT_PACKAGES=(g++ cmake ninja-build ccache pkg-config libsystemc-dev libeigen3-dev libfmt-dev
  libspdlog-dev catch2 libyaml-cpp-dev nlohmann-json3-dev libcli11-dev pybind11-dev
  python3-venv python3-dev clang-16 libclang-rt-16-dev clang-format-14 protobuf-compiler)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  step "[1/4] installing ${#missing[@]} Debian packages (apt-get, a few minutes): ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
else
  step "[1/4] Debian packages: all installed"
fi

# Python virtual environment for the tests' reference computations and the benchmarks.
VENV="$ROOT/.venv"
if [ ! -x "$VENV/bin/python" ]; then
  step "[2/4] creating $VENV"
  python3 -m venv "$VENV"
fi
# requirements-tf.txt: TensorFlow for the adapter (adapter/tf) and its tests;
# requirements-tf-nodeps.txt: packages installed without their declared dependencies (tf-keras
# would pull the full `tensorflow` wheel over tensorflow-cpu).
REQS=("$ROOT/requirements.txt" "$ROOT/requirements-tf.txt" "$ROOT/requirements-tf-nodeps.txt")
STAMP="$VENV/.requirements.sha"
# The stamp is the files' contents' hash (not their paths: a clone elsewhere with the same
# requirements has nothing to install).
req_hash() { cat "${REQS[@]}" | sha1sum; }
# pip's "Collecting ..." lines show which package it is on (TensorFlow is ~250 MB to download).
pip_progress() {
  awk '/^(Collecting|Successfully installed)/ { print "setup:   " $0; fflush() }' >&2
}
if [ ! -f "$STAMP" ] || [ "$(req_hash)" != "$(cat "$STAMP")" ]; then
  step "[2/4] installing Python packages from requirements*.txt into .venv"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install --progress-bar off -r "${REQS[0]}" -r "${REQS[1]}" | pip_progress
  "$VENV/bin/python" -m pip install --progress-bar off --no-deps -r "${REQS[2]}" | pip_progress
  req_hash > "$STAMP"
else
  step "[2/4] Python packages: up to date"
fi

# Build (Debian's cmake and ninja; whatever is first on PATH also works).
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
CACHE=()
if command -v ccache >/dev/null; then
  CACHE=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="$ROOT"
fi
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  step "[3/4] configuring $BUILD (cmake)"
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" "${CACHE[@]}" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
TARGETS=()
if [ "$TESTS" = 0 ]; then
  TARGETS=(npusim)
  # CMake defines the plugin's target only when .venv's tensorflow imports (it then caches
  # NPUSIM_TF_INCLUDE_DIR).
  grep -q '^NPUSIM_TF_INCLUDE_DIR:PATH=.' "$BUILD/CMakeCache.txt" && TARGETS+=(npusim_tf_plugin)
fi
step "[4/4] building ${TARGETS[*]:-everything} in $BUILD with $JOBS jobs (a fresh build takes minutes)"
cmake --build "$BUILD" -j "$JOBS" ${TARGETS[@]:+--target "${TARGETS[@]}"} | build_progress
# The TensorFlow plugin (built when the venv has tensorflow): the npusim package in develop mode.
if [ -f "$BUILD/libnpusim_tf_plugin.so" ]; then
  "$VENV/bin/python" "$ROOT/adapter/tf/python/install_dev.py" "$BUILD/libnpusim_tf_plugin.so" >/dev/null
fi
step "done (binary: $BUILD/npusim)"
