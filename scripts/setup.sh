#!/usr/bin/env bash
# Installs everything npusim needs on a fresh Debian 12 machine and builds it. Idempotent: a
# second run only rebuilds what changed.
#   scripts/setup.sh            Debian packages, Python virtual environment (.venv), build/
# Environment: NPUSIM_BUILD_DIR (default build), NPUSIM_JOBS (default: nproc).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${NPUSIM_BUILD_DIR:-$ROOT/build}"
JOBS="${NPUSIM_JOBS:-$(nproc)}"

# Debian packages: compilers, SystemC (C++17 build), Eigen, fmt, spdlog, Catch2 v2, yaml-cpp,
# nlohmann-json, CLI11, pybind11, Python's venv; clang 16 with its sanitizer and libFuzzer
# runtimes for scripts/fuzz.sh; clang-format-14 for scripts/check_format.sh.
APT_PACKAGES=(g++ cmake ninja-build pkg-config libsystemc-dev libeigen3-dev libfmt-dev
  libspdlog-dev catch2 libyaml-cpp-dev nlohmann-json3-dev libcli11-dev pybind11-dev
  python3-venv python3-dev clang-16 libclang-rt-16-dev clang-format-14)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python virtual environment for the tests' reference computations and the benchmarks.
VENV="$ROOT/.venv"
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  python3 -m venv "$VENV"
fi
# requirements-tf.txt: TensorFlow for the adapter (adapter/tf) and its tests;
# requirements-tf-nodeps.txt: packages installed without their declared dependencies (tf-keras
# would pull the full `tensorflow` wheel over tensorflow-cpu).
REQS=("$ROOT/requirements.txt" "$ROOT/requirements-tf.txt" "$ROOT/requirements-tf-nodeps.txt")
STAMP="$VENV/.requirements.sha"
if [ ! -f "$STAMP" ] || [ "$(sha1sum "${REQS[@]}")" != "$(cat "$STAMP")" ]; then
  echo "setup: installing Python packages from requirements*.txt"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -r "${REQS[0]}" -r "${REQS[1]}"
  "$VENV/bin/python" -m pip install -q --no-deps -r "${REQS[2]}"
  sha1sum "${REQS[@]}" > "$STAMP"
fi

# Build (Debian's cmake and ninja; whatever is first on PATH also works).
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$BUILD" -j "$JOBS"
# The TensorFlow plugin (built when the venv has tensorflow): the npusim package in develop mode.
if [ -f "$BUILD/libnpusim_tf_plugin.so" ]; then
  "$VENV/bin/python" "$ROOT/adapter/tf/python/install_dev.py" "$BUILD/libnpusim_tf_plugin.so" >/dev/null
fi
echo "setup: done (binary: $BUILD/npusim)"
