#!/usr/bin/env bash
# The full convergence examples on a GPU machine (CUDA, bf16 and fp32), from the repo root:
#   bash scripts/device_check.sh            # or any build into build-device/ with CUDA
#   bash scripts/convergence_device.sh      # CSVs + logs -> ${OUT:-out}/convergence/
# Then: python3 scripts/plot_convergence.py ${OUT:-out}/convergence --prefix convergence_cuda_
# (plots under ${OUT:-out}/convergence/plots; the prefix keeps them apart from the CPU plots;
# docs/img only with --update-docs), and compare with the "Measured on CUDA" section of
# docs/convergence.md. Exits non-zero when an experiment fails its assertion (all of them still
# run). Output is line-buffered, so a log written up to a timeout keeps what was printed.
set -uo pipefail
BIN=${BIN:-build-device/examples/convergence/convergence}
DEST=${OUT:-out}/convergence
[[ -x $BIN ]] || { echo "convergence_device.sh: $BIN not found: build into build-device/ first" >&2; exit 2; }
mkdir -p "$DEST"
echo "== run of $(date -u +%FT%TZ)" >> "$DEST/times.txt"
status=0
logs=()
# SPECS: which experiments, as name:dtype words (default: all ten).
SPECS=${SPECS:-"kernel_vs_reference:bf16 kernel_vs_reference:fp32 ties:bf16 ties:fp32
  padded:bf16 padded:fp32 distill_works:bf16 distill_works:fp32 divergences:bf16 divergences:fp32"}
for spec in $SPECS; do
  cmd=${spec%%:*} dtype=${spec##*:}
  echo "== convergence $cmd --device cuda --dtype $dtype"
  start=$(date +%s)
  log="$DEST/${cmd}_${dtype}.log"
  logs+=("$log")
  stdbuf -oL -eL "$BIN" "$cmd" --device cuda --dtype "$dtype" --out "$DEST" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  echo "== $cmd $dtype: exit $rc, $(( $(date +%s) - start )) s" | tee -a "$DEST/times.txt"
  (( rc == 0 )) || status=1
done
echo "== summary (CSVs, logs and times.txt in $DEST)"
grep -h -E "^(PASS|FAIL) " "${logs[@]}"
cat "$DEST/times.txt"
# The teachers' and students' run directories (checkpoints, MBs each) are scaffolding: drop them
# so that device_check.sh's results.tgz stays small.
rm -rf "$DEST/runs"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$DEST/device.txt" 2>/dev/null || true
exit $status
