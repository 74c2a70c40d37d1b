#!/usr/bin/env bash
# On a CUDA machine whose python3 has torch 2.11 (e.g. the H200 device machine): configure for
# sm_90, build everything, run every test through ctest and the TVD benchmark. Logs and JSON go to
# ${OUT:-out}/. Usage: bash scripts/device_check.sh [extra ctest args]
set -uo pipefail
OUT="${OUT:-out}"; mkdir -p "$OUT"
PY="$(command -v python3)"
PREFIX="$("$PY" -W ignore -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DLOSSFNS_PYTHON="$PY" -DLOSSFNS_CUDA=ON -DTORCH_CUDA_ARCH_LIST=9.0 >"$OUT/configure.log" 2>&1 ||
  { tail -40 "$OUT/configure.log"; exit 1; }
cmake --build build-device -j "$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" -A5 "$OUT/build.log" | head -60; exit 1; }
ctest --test-dir build-device -j 4 --output-on-failure "$@" 2>&1 | tee "$OUT/ctest.log" | tail -25
if [ -x build-device/bench/tvd_bench ] && [ "${SKIP_BENCH:-0}" != 1 ]; then
  build-device/bench/tvd_bench --json "$OUT/tvd_bench.json" 2>&1 | tee "$OUT/tvd_bench.txt"
fi
if [ "${DEBUG_PY:-0}" = 1 ] && command -v cuda-gdb >/dev/null; then  # native backtrace of the Python test
  cuda-gdb -batch -ex run -ex bt --args "$PY" tests/test_tvd_op.py build-device/lib/liblossfns.so \
    >"$OUT/py_gdb.txt" 2>&1; grep -A30 "SIGSEGV" "$OUT/py_gdb.txt" | head -40
fi
