#!/usr/bin/env bash
# Checks that every C++ file named in scripts/format_checked_files.txt (one path a line, relative
# to the repository root; # starts a comment) is formatted as .clang-format says. Uses
# clang-format-14 (Debian 12's, installed by scripts/setup.sh; other versions format some
# constructs differently), or $CLANG_FORMAT. Exits 1 naming the files that differ; to fix one:
# clang-format-14 -i FILE. docs/DESIGN.md "Conventions" says how the list grows.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CF="${CLANG_FORMAT:-clang-format-14}"
if ! command -v "$CF" >/dev/null; then
  echo "check_format: $CF not found (scripts/setup.sh installs clang-format-14)" >&2
  exit 1
fi
cd "$ROOT"
bad=()
while read -r f; do
  [ -z "$f" ] && continue
  if [ ! -f "$f" ]; then
    echo "check_format: scripts/format_checked_files.txt names $f, which does not exist" >&2
    exit 1
  fi
  "$CF" --style=file --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' scripts/format_checked_files.txt)
if ((${#bad[@]})); then
  echo "check_format: not formatted as .clang-format says (clang-format-14 -i FILE fixes it):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: $(grep -cv '^[[:space:]]*\(#\|$\)' scripts/format_checked_files.txt) files formatted"
