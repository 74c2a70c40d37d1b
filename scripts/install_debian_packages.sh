#!/usr/bin/env bash
# Installs the Debian packages that are missing, each named with the probe that says whether it
# is there: PACKAGE:cmd:COMMAND (on PATH), PACKAGE:file:PATH (exists), PACKAGE:python:MODULES
# (python3 imports them, comma-separated). Only what is missing is installed, so a machine that
# has everything (the GPU machine, with no network) never calls apt-get. Used by scripts/setup.sh
# and scripts/check_format.sh.
# Usage: scripts/install_debian_packages.sh PACKAGE:KIND:PROBE...
set -euo pipefail
missing=()
for entry in "$@"; do
  IFS=: read -r pkg kind probe <<<"$entry"
  case "$kind" in
    cmd) command -v "$probe" >/dev/null 2>&1 || missing+=("$pkg") ;;
    file) [ -e "$probe" ] || missing+=("$pkg") ;;
    python) python3 -c "import ${probe}" 2>/dev/null || missing+=("$pkg") ;;
    *) echo "install_debian_packages: unknown probe kind '$kind' in '$entry'" >&2; exit 2 ;;
  esac
done
((${#missing[@]})) || exit 0
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
printf '[setup] installing Debian packages: %s\n' "${missing[*]}" >&2
if ! { $SUDO apt-get update -qq &&
       DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
  printf '[setup] error: could not install %s with apt-get; install them by hand and re-run\n' "${missing[*]}" >&2
  exit 1
fi
