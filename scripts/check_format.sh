#!/usr/bin/env bash
# The repository's one format (.clang-format; CONTRIBUTING.md), checked as CI checks it: fails
# (exit 1) when a C++/CUDA source under lib/ trainer/ tests/ examples/ bench/ differs from what
# clang-format makes of it, and lists the files. `--fix` rewrites them instead (scripts/format.sh).
# The formatter is pinned, since its output differs between releases: Debian 12's clang-format-14
# (14.0.x), installed with apt-get when missing (scripts/install_debian_packages.sh); CLANG_FORMAT
# names another binary of the same major version.
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT="${CLANG_FORMAT:-clang-format-14}"
PINNED_MAJOR=14
if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
  [ "$CLANG_FORMAT" = clang-format-14 ] && bash scripts/install_debian_packages.sh "clang-format-14:cmd:clang-format-14"
  command -v "$CLANG_FORMAT" >/dev/null 2>&1 ||
    { echo "check_format: $CLANG_FORMAT not found (apt-get install clang-format-14)" >&2; exit 2; }
fi
version="$("$CLANG_FORMAT" --version)"
if ! [[ "$version" =~ version\ ${PINNED_MAJOR}\. ]]; then
  echo "check_format: $CLANG_FORMAT is '$version'; the format is pinned to clang-format $PINNED_MAJOR" >&2
  exit 2
fi
# The C++ and CUDA sources git tracks in the directories of our code (not the test fixtures).
mapfile -t files < <(git ls-files -- lib trainer tests examples bench |
                     grep -E '\.(h|cpp|cu|cuh|cpp\.in)$' | grep -v '^tests/fixtures/')
if ((${#files[@]} == 0)); then  # not a git checkout, or git failed: checking nothing is no pass
  echo "check_format: no sources found through 'git ls-files' (run it inside a git checkout)" >&2
  exit 2
fi
if [ "${1:-}" = --fix ]; then
  "$CLANG_FORMAT" -i "${files[@]}"
  echo "check_format: ${#files[@]} files formatted with $version"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$CLANG_FORMAT" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  printf 'check_format: %d of %d file(s) not formatted with %s (run scripts/format.sh):\n' \
    "${#bad[@]}" "${#files[@]}" "$CLANG_FORMAT" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
