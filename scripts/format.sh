#!/usr/bin/env bash
# Formats every C++/CUDA source under lib/ trainer/ tests/ examples/ bench/ in place with the
# pinned clang-format (.clang-format; scripts/check_format.sh, which CI runs, says how it is
# pinned and installs it when missing). Put a formatting-only change in a commit of its own.
set -euo pipefail
exec bash "$(dirname "$0")/check_format.sh" --fix
