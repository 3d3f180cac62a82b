#!/usr/bin/env bash
# Checks that the C++ layers include only layers below them (docs/DESIGN.md, "Layer
# libraries"): every `#include "dir/..."` of a file under the first folder of a rule may not
# name a path that starts with one of the rule's forbidden prefixes. Exits 1 listing each
# violation as file:line: include.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# folder|forbidden include prefixes (space separated)
SYSTEMC_MODEL="sim/core/ sim/chip/ sim/counters/ sim/replay/ sim/simulator.h"
RULES=(
  "common|sim/ adapter/ tools/"
  "isa|sim/ adapter/ tools/"
  # sim/config takes one header constant from sim/memory (DeviceMemory::kMaxCapacity).
  "sim/config|$SYSTEMC_MODEL sim/exec/ sim/verifier/ adapter/ tools/"
  "sim/exec|$SYSTEMC_MODEL sim/verifier/ adapter/ tools/"
  "sim/memory|$SYSTEMC_MODEL sim/verifier/ adapter/ tools/"
  "sim/verifier|$SYSTEMC_MODEL adapter/ tools/"
  "sim|adapter/ tools/"
  "adapter/compiler|$SYSTEMC_MODEL sim/exec/ sim/memory/ adapter/runtime/ adapter/profiler/ adapter/tf/ tools/"
  "adapter/profiler|sim/exec/ adapter/compiler/ adapter/tf/ tools/"
  "adapter/runtime|adapter/compiler/ adapter/profiler/ adapter/tf/ tools/"
  "adapter/graph|adapter/runtime/ adapter/profiler/ adapter/tf/ tools/"
)
bad=0
for rule in "${RULES[@]}"; do
  dir="${rule%%|*}"
  read -r -a forbidden <<<"${rule#*|}"
  while IFS= read -r hit; do
    inc="${hit#*#include \"}"
    inc="${inc%%\"*}"
    for prefix in "${forbidden[@]}"; do
      if [[ "$inc" == "$prefix"* ]]; then
        echo "check_layers: ${hit%%:#*}: $dir may not include $inc" >&2
        bad=1
      fi
    done
  done < <(grep -rn --include='*.h' --include='*.cpp' '^#include "' "$dir" || true)
done
if ((bad)); then
  echo "check_layers: an include points up a layer (docs/DESIGN.md, \"Layer libraries\")" >&2
  exit 1
fi
echo "check_layers: ${#RULES[@]} layers include only layers below them"
