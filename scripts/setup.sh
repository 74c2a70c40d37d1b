#!/usr/bin/env bash
# One-time (idempotent) set-up for a fresh Debian 12 / Ubuntu machine: system packages and LibTorch.
# Writes build/setup.env with LOSSFNS_PYTHON (a python3 that imports torch 2.11) and TORCH_PREFIX
# (its torch.utils.cmake_prefix_path). Nothing is downloaded during build or test; only here.
set -euo pipefail

TORCH_VERSION="${LOSSFNS_TORCH_VERSION:-2.11.0}"
CACHE_ROOT="${LOSSFNS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lossfns}"
VENV="$CACHE_ROOT/venv-torch-$TORCH_VERSION"
BUILD_DIR="${1:-build}"
# Python packages beside torch: numpy silences torch's import warning, matplotlib draws the plots.
PY_EXTRAS=(numpy matplotlib)

log() { printf '[setup] %s\n' "$*" >&2; }

# --- Debian packages -------------------------------------------------------------------------
# Each package with a probe: a command on PATH or a header. Only what is missing is installed, so a
# machine that has everything (the GPU machine, with no network) never calls apt-get.
PKGS=(
  "cmake:cmd:cmake" "ninja-build:cmd:ninja" "g++:cmd:g++" "make:cmd:make" "ccache:cmd:ccache"
  "libyaml-cpp-dev:file:/usr/include/yaml-cpp/yaml.h" "libfmt-dev:file:/usr/include/fmt/format.h"
  "libgtest-dev:file:/usr/include/gtest/gtest.h" "libcli11-dev:file:/usr/include/CLI/CLI.hpp"
)
missing=()
for entry in "${PKGS[@]}"; do
  IFS=: read -r pkg kind probe <<<"$entry"
  if [ "$kind" = cmd ]; then command -v "$probe" >/dev/null 2>&1 || missing+=("$pkg")
  else [ -e "$probe" ] || missing+=("$pkg"); fi
done
python3 -c "import venv, ensurepip" 2>/dev/null || missing+=(python3-venv)
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  log "installing Debian packages: ${missing[*]}"
  if ! { $SUDO apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }; then
    log "error: could not install ${missing[*]} with apt-get; install them by hand and re-run"
    exit 1
  fi
fi

# --- LibTorch --------------------------------------------------------------------------------
torch_ok() {  # $1: python; true if it imports torch $TORCH_VERSION (any local build suffix)
  "$1" - "$TORCH_VERSION" <<'PY' 2>/dev/null
import sys, warnings
warnings.filterwarnings("ignore")
import torch
sys.exit(0 if torch.__version__.split("+")[0] == sys.argv[1] else 1)
PY
}

PYTHON=""
if [ -n "${LOSSFNS_PYTHON:-}" ] && torch_ok "$LOSSFNS_PYTHON"; then
  PYTHON="$LOSSFNS_PYTHON"
elif [ -x "$VENV/bin/python" ] && torch_ok "$VENV/bin/python"; then
  PYTHON="$VENV/bin/python"
elif command -v python3 >/dev/null && torch_ok "$(command -v python3)"; then
  PYTHON="$(command -v python3)"   # e.g. the GPU machine's system torch: use it, install nothing
else
  log "creating $VENV and installing torch==$TORCH_VERSION (~2.7 GB, first time only)"
  mkdir -p "$CACHE_ROOT"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION" "${PY_EXTRAS[@]}"
  PYTHON="$VENV/bin/python"
fi
if [ "$PYTHON" = "$VENV/bin/python" ]; then  # our own venv: make sure the extras are there too
  "$PYTHON" -c "import numpy, matplotlib" 2>/dev/null ||
    "$PYTHON" -m pip install -q --disable-pip-version-check "${PY_EXTRAS[@]}"
fi

TORCH_PREFIX="$("$PYTHON" -W ignore -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
mkdir -p "$BUILD_DIR"
cat >"$BUILD_DIR/setup.env.tmp" <<ENV
LOSSFNS_PYTHON=$PYTHON
TORCH_PREFIX=$TORCH_PREFIX
ENV
mv "$BUILD_DIR/setup.env.tmp" "$BUILD_DIR/setup.env"
log "python: $PYTHON"
log "torch cmake prefix: $TORCH_PREFIX"
