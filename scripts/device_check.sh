#!/usr/bin/env bash
# On a CUDA machine with torch 2.11 (e.g. the H200 device machine's python3): configure for
# sm_90, build everything, run every test through ctest, the TVD benchmark, and (when present) the
# convergence and multi-GPU scripts. Everything lands in ${OUT:-out}/results.tgz; the ctest log and
# the benchmark's table and JSON are also copied to ${OUT}/. Usage: bash scripts/device_check.sh
# Environment: SKIP_BENCH=1, SKIP_CONVERGENCE=1, BUDGET_S (the convergence runs' time),
# CTEST_EXCLUDE_LABELS and CTEST_ARGS (a part of the tests: see the ctest line).
set -uo pipefail
# A machine without a GPU would build for sm_90 for many minutes and then skip every CUDA test.
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "device_check.sh: no NVIDIA GPU here (nvidia-smi is missing or sees none); run it on a" \
    "CUDA machine. On this one, make test runs the CPU tests." >&2
  exit 1
fi
START=$(date +%s)
BUDGET_S=${BUDGET_S:-570}  # the device tool's per-call limit is 600 s: leave time to pack results
stage() { echo "== $1 at +$(( $(date +%s) - START )) s"; }
OUT="${OUT:-out}"; mkdir -p "$OUT"
W="$OUT/work"; mkdir -p "$W"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# LibTorch: the torch of LOSSFNS_PYTHON, else the set-up's python (build/setup.env, after `make`),
# else python3 (the GPU machine's system torch).
PY="${LOSSFNS_PYTHON:-}"
[ -n "$PY" ] || [ ! -f build/setup.env ] || PY="$(sed -n 's/^LOSSFNS_PYTHON=//p' build/setup.env)"
PY="${PY:-$(command -v python3)}"
export PATH="$(dirname "$PY"):$PATH"  # its torchrun and python3 for the scripts called below
PREFIX="$("$PY" -W ignore -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$W/gpu.txt"
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DLOSSFNS_PYTHON="$PY" -DLOSSFNS_CUDA=ON -DTORCH_CUDA_ARCH_LIST=9.0 >"$W/configure.log" 2>&1 ||
  { tail -40 "$W/configure.log"; exit 1; }
cmake --build build-device -j "$(nproc)" >"$W/build.log" 2>&1 || { grep -E "error|FAILED" -A5 "$W/build.log" | head -60; exit 1; }
stage build-done
# Excluded labels: docs_numbers (the docs' CPU numbers are the development machine's; another CPU
# type skips them) and CTEST_EXCLUDE_LABELS, in one -LE pattern (ctest ANDs repeated -LE
# options). To split the run where one call has a time limit (the device tool's 600 s; the full
# run takes longer): CTEST_EXCLUDE_LABELS=python in one call, CTEST_ARGS="-L python" with
# SKIP_BENCH=1 SKIP_CONVERGENCE=1 in the next. CTEST_ARGS: more ctest arguments, split on spaces.
LE="docs_numbers${CTEST_EXCLUDE_LABELS:+|$CTEST_EXCLUDE_LABELS}"
read -ra EXTRA <<<"${CTEST_ARGS:-}"
ctest --test-dir build-device -j 4 --output-on-failure -LE "$LE" "${EXTRA[@]}" 2>&1 |
  tee "$W/ctest.log" | tail -8
stage ctest-done
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  build-device/bench/tvd_bench --json "$W/tvd_bench.json" >"$W/tvd_bench.txt" 2>&1
  build-device/bench/tvd_kernel_variants >"$W/tvd_kernel_variants.txt" 2>&1
  cat "$W/tvd_bench.txt"
fi
stage bench-done
# The convergence runs get what is left of the budget (each experiment's log survives a timeout).
LEFT=$(( BUDGET_S - ($(date +%s) - START) ))
if [ -f scripts/convergence_device.sh ] && [ "${SKIP_CONVERGENCE:-0}" != 1 ] && [ "$LEFT" -gt 30 ]; then
  OUT="$W" timeout "$LEFT" bash scripts/convergence_device.sh 2>&1 | tee "$W/convergence.txt" | tail -30
  (( PIPESTATUS[0] == 124 )) && echo "== convergence stopped by the time budget (${LEFT} s)"
  rm -rf "$W/convergence/runs"  # checkpoints (MBs each), left behind when the budget ran out
  stage convergence-done
fi
if [ -f scripts/ddp_device.sh ] && [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  OUT="$W" bash scripts/ddp_device.sh 2>&1 | tee "$W/ddp.txt" | tail -30
fi
cp "$W/ctest.log" "$W"/tvd_bench.* "$W/tvd_kernel_variants.txt" "$OUT/" 2>/dev/null
tar czf "$OUT/results.tgz" -C "$W" . && rm -rf "$W"
