#!/usr/bin/env bash
# distill_trainer at real size with and without distill.fused_linear (issue 19): a Qwen2.5-0.5B-shaped
# student from a random Qwen2.5-1.5B-shaped teacher (bench/configs/qwen05_from_qwen15.yaml), V = 151936,
# seq 2048, on one GPU. Prints tokens/s (the median of the log's step lines) and the profiled peak
# memory per run.
#   bash bench/fused_linear_trainer.sh            (after `make build`; BUILD_DIR, PYTHON, WORK to override)
# BATCHES: the batch sizes, each run without and with the op (default "16 32", for an H200's 141 GB;
# "8 16" on an 80 GB card). A run the memory estimate refuses prints the estimate instead.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
[ -f "$BUILD_DIR/setup.env" ] && . "$BUILD_DIR/setup.env"
PYTHON="${PYTHON:-${LOSSFNS_PYTHON:-python3}}"
WORK="${WORK:-$(mktemp -d)}"
[ -f "$WORK/teacher/config.json" ] || "$PYTHON" bench/make_random_hf.py "$WORK/teacher" --size 1.5b
printf '| distill.fused_linear | batch | tokens/s | peak allocated |\n|---|---:|---:|---:|\n'
for run in $(for b in ${BATCHES:-16 32}; do echo "false:$b true:$b"; done); do
  set -- ${run/:/ }
  log="$WORK/train_$1_$2.txt"
  if "$BUILD_DIR/trainer/distill_trainer" --config bench/configs/qwen05_from_qwen15.yaml \
      teacher.hf_dir="$WORK/teacher" distill.fused_linear="$1" data.batch_size="$2" \
      train.out_dir="$WORK/runs/fused_$1_batch_$2" --profile-steps 2 --fresh > "$log" 2>&1; then
    # the median of the log's step lines (steps 2-14; the profiled steps 4-7 run synchronised)
    toks=$( (grep -E '^step ' "$log" || true) | grep -o '[0-9]* tok/s' | awk '{print $1}' | sort -n |
      awk '{v[NR] = $1} END {print NR ? v[int((NR + 1) / 2)] : "?"}')
    peak=$( (grep -o 'peak memory [0-9.]* GiB' "$log" || true) | awk '{print $3}')
    echo "| $1 | $2 | $toks | ${peak:-?} GiB |"
  else
    echo "| $1 | $2 | – | $(grep -m1 -o 'memory estimate: [0-9.]* GiB' "$log" || echo failed: see "$log") |"
  fi
done
echo "(logs and runs under $WORK)"
