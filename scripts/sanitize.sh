#!/usr/bin/env bash
# CI's second stage (issue 17): the CPU library, distill_trainer and their tests built with
# AddressSanitizer + UndefinedBehaviorSanitizer in their own build dir, then run by ctest. Any
# report fails the stage: ASan aborts on the first error, UBSan is built not to recover.
# Usage: scripts/sanitize.sh [BUILD_DIR]   (default build-asan; needs `make setup` done first)
#
# Left out: the Python tests (label python: a non-instrumented python cannot load an
# instrumented library without preloading libasan), the installed-package test (label install:
# a separate, non-instrumented project), the docs' numbers and the convergence examples
# (minutes of training each; instrumentation changes no number they check), the benchmarks and
# the SmolLM2 real-model tests (they skip without LOSSFNS_SMOLLM2_DIR).
# Times on the 2-core CI machine: CONTRIBUTING.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build-asan}"
JOBS="${JOBS:-$(nproc)}"
if [ ! -f build/setup.env ]; then
  echo "sanitize: build/setup.env is missing; run 'make setup' (or 'make test') first" >&2
  exit 2
fi
. build/setup.env

# libtorch is not instrumented: its allocations are not tracked for leaks (detect_leaks=0), and
# the vptr check would need RTTI of every library (-fno-sanitize=vptr). The reliability tests
# preload a fault-injection shim before libasan (verify_asan_link_order=0).
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:verify_asan_link_order=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"
SAN_FLAGS="-fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

start=$(date +%s)
# -O1 -g1: line tables for the reports at half the compile time of -O2 -g.
cmake -S . -B "$BUILD_DIR" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DCMAKE_CXX_FLAGS="$SAN_FLAGS" \
  -DCMAKE_EXE_LINKER_FLAGS="$SAN_FLAGS" \
  -DCMAKE_SHARED_LINKER_FLAGS="$SAN_FLAGS" \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
  -DLOSSFNS_CUDA=OFF \
  -DLOSSFNS_PYTHON= \
  -DLOSSFNS_SMOLLM2_DIR= \
  -DLOSSFNS_BUILD_BENCH=OFF \
  -DLOSSFNS_BUILD_EXAMPLES=OFF \
  -DLOSSFNS_BUILD_TESTS=ON \
  -DLOSSFNS_BUILD_TRAINER=ON
cmake --build "$BUILD_DIR" -j "$JOBS"
built=$(date +%s)
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" -LE 'python|install|docs_numbers|slow' \
  --timeout 900
done_at=$(date +%s)
echo "sanitize: ASan + UBSan clean; build $((built - start)) s, tests $((done_at - built)) s"
