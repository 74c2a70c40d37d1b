#!/usr/bin/env bash
# Fails (exit 1) when a tracked C++/CUDA file differs from what clang-format makes of it, and
# prints the files; `--fix` rewrites them instead. The version is pinned: formatting differs
# between clang-format releases, so every developer (and CI, once the tree is formatted) uses
# Debian 12's clang-format-14 (apt-get install clang-format-14).
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT="${CLANG_FORMAT:-clang-format-14}"
if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
  echo "check_format: $CLANG_FORMAT not found (apt-get install clang-format-14, or run make setup)" >&2
  exit 2
fi
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' '*.cpp.in' | grep -v '^tests/fixtures/')
if [ "${1:-}" = --fix ]; then
  "$CLANG_FORMAT" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$CLANG_FORMAT" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  printf 'check_format: %d file(s) not formatted with %s (run scripts/check_format.sh --fix):\n' \
    "${#bad[@]}" "$CLANG_FORMAT" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
