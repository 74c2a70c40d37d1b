#!/usr/bin/env bash
# Data-parallel check on a GPU machine (issues #7 and #20). From the repository root, after
#   cmake --build build-device
# runs
#   (a) the world-size-1 NCCL test (distill_distributed_cuda_test), the CPU data-parallel tests
#       and the gradient reducer's tests (two simulated ranks),
#   (b) configs/ddp.yaml (teacher pretraining + distillation, same global batch) on 1 GPU via
#       torchrun --nproc-per-node 1, then each of its two stages again on 2 GPUs via
#       torchrun --nproc-per-node 2, from the stage's own resolved config.yaml: the 2-GPU
#       distillation uses the 1-GPU run's teacher, so both students start from the same point;
#       once in bf16 (the config as shipped) and once in fp32 (train.precision=fp32),
#   (c) compares the trajectories against the tolerances below,
#   (d) prints tokens/s on 1 and 2 GPUs and the scaling efficiency tokens/s(2) / (2 x tokens/s(1)),
#       and per rank (a short profiled 2-GPU run, --profile-steps): peak memory, tokens/s and the
#       communication left on the critical path,
#   (e) two "nodes" on this host: two torchrun launches with --nnodes 2 --node-rank 0/1 and a
#       static rendezvous on loopback (node-rank 0 is rank 0), which must give the --nproc-per-node 2 run's trajectory,
#   (f) when SmolLM2 is prepared (scripts/prepare_smollm2.py; SMOLLM2_DIR), a short real-size
#       distillation (SmolLM2-135M teacher, configs/smollm2_distill.yaml) on 1 and 2 GPUs: scaling.
# Everything goes to ${OUT:-out}/ddp/ (logs, run directories, report.txt). Exit status 0 when
# the tests pass and the trajectories agree; the scaling figures are reported, not enforced.
# Optional: BUILD (default build-device), DDP_OVERRIDES (extra key=value for the 1-GPU runs,
# which the 2-GPU runs inherit through the stage configs, e.g. "train.steps=50"),
# DDP_TEST_FILTER (gtest filter for the world-1 test, default all), DDP_FP32=0 (skip the fp32
# runs), SMOLLM2_DIR (default ~/.cache/lossfns/smollm2), SMOLLM2_STEPS (default 60).
#
# configs/ddp.yaml: 57M teacher pretrained 100 steps, 19M student distilled 150 steps, global
# batch 16 x 32 x 256 tokens; about 1.5 min on 1 H200 and 1 min on 2 in bf16 (plus start-up).
#
# Tolerances (docs/trainer.md, Multi-GPU). The 2-GPU run sees the same global batch, the same
# micro-batches and the same forward passes; only the order of float sums differs (each rank
# sums its 8 micro-batch gradients, NCCL then the 2 ranks' sums, instead of 16 in a row).
#   step 1 (no update yet), both precisions: |loss2 - loss1| / loss1 <= 1e-5
#   fp32, every logged step:  max |loss2 - loss1| / loss1 <= 1e-4
#   fp32, final val_loss:     relative difference <= 1e-4
#   bf16, final val_loss:     relative difference <= 1e-2; every step is reported, not checked.
# Why: a training trajectory amplifies a perturbation; a bf16 run's rounding (2^-8 per
# operation) grew to 3.75e-2 at step 39 of the student (issue 20), so bf16 runs can only be held
# to where they end. fp32's rounding is 2^-16 of bf16's: amplified alike it stays far below 1e-4,
# while a real bug (a bucket summed twice or not at all, another data order, a normalisation off
# by the number of ranks) moves the loss by 1e-2 or more within a few steps.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-device}
DIR=${OUT:-out}/ddp
mkdir -p "$DIR"
# NVLink multicast stays off on the shared machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
TRAINER=$BUILD/trainer/distill_trainer
TESTS=$BUILD/tests/trainer
CONFIG=configs/ddp.yaml
status=0
for f in "$TRAINER" "$TESTS/distill_distributed_cuda_test" "$TESTS/distill_distributed_test" \
  "$TESTS/distill_grad_reducer_test"; do
  [ -x "$f" ] || { echo "missing $f: run cmake --build $BUILD first" >&2; exit 2; }
done
command -v torchrun >/dev/null || { echo "torchrun not on PATH" >&2; exit 2; }
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
echo "== $(date -u +%FT%TZ)  GPUs: $NGPU  build: $BUILD  out: $DIR"

echo "== (a) world size 1 through NCCL, and the CPU data-parallel tests"
timeout 180 "$TESTS/distill_distributed_cuda_test" --gtest_filter="${DDP_TEST_FILTER:-*}" 2>&1 | tee "$DIR/world1_test.log" | tail -n 4
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAIL: distill_distributed_cuda_test"; status=1; }
grep -q "SKIPPED" "$DIR/world1_test.log" && { echo "FAIL: the world-1 test skipped (no CUDA?)"; status=1; }
for t in distill_distributed_test distill_grad_reducer_test; do
  timeout 180 "$TESTS/$t" 2>&1 | tee "$DIR/$t.log" | tail -n 1
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAIL: $t"; status=1; }
done

run() {  # run <nproc> <log name> <distill_trainer arguments...>
  local n=$1 log=$DIR/$2.log
  shift 2
  mkdir -p "$(dirname "$log")"
  echo "== on $n GPU(s): torchrun --no-python --standalone --nproc-per-node $n $TRAINER $*"
  timeout 400 torchrun --no-python --standalone --nproc-per-node "$n" "$TRAINER" --fresh "$@" \
    > "$log" 2>&1
  local rc=$?
  tail -n 3 "$log"
  [ $rc -eq 0 ] || { echo "FAIL: exit status $rc (see $log)"; status=1; }
}
pipeline() {  # pipeline <precision>: the 1-GPU pipeline, then each stage on 2 GPUs
  local p=$1 d=$DIR/$1
  echo "== (b) $p"
  # shellcheck disable=SC2086  # DDP_OVERRIDES is a list of key=value words
  run 1 "$p/gpu1" --config "$CONFIG" train.out_dir="$d/gpu1" train.log_interval=1 \
    train.precision="$p" ${DDP_OVERRIDES:-}
  [ "$NGPU" -lt 2 ] && return
  for stage in teacher student; do  # the pipeline's stages, each run alone on 2 GPUs
    [ -f "$d/gpu1/$stage/config.yaml" ] || continue
    run 2 "$p/gpu2_$stage" --config "$d/gpu1/$stage/config.yaml" train.out_dir="$d/gpu2/$stage"
  done
  if [ ! -f "$d/gpu1/teacher/config.yaml" ]; then  # not a pipeline: the run itself
    run 2 "$p/gpu2" --config "$d/gpu1/config.yaml" train.out_dir="$d/gpu2"
  fi
}
[ "$NGPU" -lt 2 ] && { echo "only $NGPU GPU: no 2-GPU runs"; status=1; }
pipeline bf16
[ "${DDP_FP32:-1}" = 1 ] && pipeline fp32

STUDENT_CONFIG=$DIR/bf16/gpu1/student/config.yaml
if [ "$NGPU" -ge 2 ] && [ -f "$STUDENT_CONFIG" ]; then
  echo "== (d) per rank: a profiled 2-GPU distillation (30 steps: 3 skipped, 10 traced, 10 timed)"
  run 2 profile --config "$STUDENT_CONFIG" train.out_dir="$DIR/profile" train.steps=30 \
    --profile-steps 10
  echo "== (e) two nodes on this host: torchrun --nnodes 2 --node-rank 0/1, one rendezvous"
  PORT=$((29600 + RANDOM % 300))
  for rank in 0 1; do
    CUDA_VISIBLE_DEVICES=$rank timeout 400 torchrun --no-python --nnodes 2 --node-rank "$rank" \
      --nproc-per-node 1 --rdzv-backend static --master-addr 127.0.0.1 --master-port "$PORT" \
      "$TRAINER" --fresh --config "$STUDENT_CONFIG" \
      train.out_dir="$DIR/nodes2/node$rank" train.steps=30 > "$DIR/nodes2_node$rank.log" 2>&1 &
  done
  wait_status=0
  for job in $(jobs -p); do wait "$job" || wait_status=1; done
  tail -n 3 "$DIR/nodes2_node0.log"
  [ $wait_status -eq 0 ] || { echo "FAIL: the two-node launch (see $DIR/nodes2_node*.log)"; status=1; }
  run 2 nodes1 --config "$STUDENT_CONFIG" train.out_dir="$DIR/nodes1" train.steps=30
fi

SMOLLM2_DIR=${SMOLLM2_DIR:-${HOME}/.cache/lossfns/smollm2}
if [ "$NGPU" -ge 2 ] && [ -f "$SMOLLM2_DIR/hf/model.safetensors" ]; then
  echo "== (f) SmolLM2-135M teaching a llama student: ${SMOLLM2_STEPS:-60} steps on 1 and 2 GPUs"
  for n in 1 2; do
    run "$n" "smollm2/gpu$n" --config configs/smollm2_distill.yaml \
      teacher.hf_dir="$SMOLLM2_DIR/hf" data.path="$SMOLLM2_DIR/shakespeare/train_*.bin" \
      data.val_path="$SMOLLM2_DIR/shakespeare/val_*.bin" train.out_dir="$DIR/smollm2/gpu$n" \
      train.steps="${SMOLLM2_STEPS:-60}" train.grad_accum=2 train.log_interval=1 \
      train.baseline=false train.eval_interval=0 train.export_hf=false
  done
fi

echo "== (c) trajectories and (d) scaling"
python3 - "$DIR" <<'PY' | tee "$DIR/report.txt"
import glob, json, statistics, sys, os
d = sys.argv[1]
def records(path):
    path = os.path.join(path, "metrics.jsonl")
    if not os.path.exists(path): return {}
    out = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("type") == "train": out[r["step"]] = r
    return out
def val(path):
    path = os.path.join(path, "summary.json")
    return json.load(open(path))["val_loss"] if os.path.exists(path) else None
def rate(x, after=10):
    v = [r["tokens_per_s"] for s, r in x.items() if s > after]
    return statistics.median(v) if v else float("nan")
ok = True
TOL = {"bf16": {"first": 1e-5, "step": None, "val": 1e-2}, "fp32": {"first": 1e-5, "step": 1e-4, "val": 1e-4}}
for p in ("bf16", "fp32"):
    base = os.path.join(d, p)
    if not os.path.isdir(os.path.join(base, "gpu1")): continue
    # The pipeline's stages, or a single run's own directory.
    stages = [s for s in ("teacher", "student") if os.path.isdir(os.path.join(base, "gpu1", s))] or ["."]
    for stage in stages:
        a, b = records(os.path.join(base, "gpu1", stage)), records(os.path.join(base, "gpu2", stage))
        steps = sorted(set(a) & set(b))
        if not steps or len(steps) != len(a):
            print(f"{p} {stage}: FAIL: missing records (1 GPU {len(a)}, 2 GPUs {len(b)})"); ok = False; continue
        t = TOL[p]
        rel = {s: abs(b[s]["loss"] - a[s]["loss"]) / abs(a[s]["loss"]) for s in steps}
        worst = max(rel, key=rel.get)
        first_ok = rel[steps[0]] <= t["first"]
        step_ok = t["step"] is None or rel[worst] <= t["step"]
        va, vb = val(os.path.join(base, "gpu1", stage)), val(os.path.join(base, "gpu2", stage))
        vrel = abs(vb - va) / va if va and vb else float("inf")
        val_ok = vrel <= t["val"]
        ok &= first_ok and step_ok and val_ok
        print(f"{p} {stage}: {len(steps)} steps; loss {a[steps[0]]['loss']:.4f} -> {a[steps[-1]]['loss']:.4f} (1 GPU)")
        print(f"  step {steps[0]} rel diff {rel[steps[0]]:.2e} (tol {t['first']:.0e}) {'PASS' if first_ok else 'FAIL'}")
        verdict = "reported" if t["step"] is None else f"(tol {t['step']:.0e}) {'PASS' if step_ok else 'FAIL'}"
        print(f"  max rel diff {rel[worst]:.2e} at step {worst} {verdict}")
        print(f"  final val_loss {va} vs {vb}: rel {vrel:.2e} (tol {t['val']:.0e}) {'PASS' if val_ok else 'FAIL'}")
        r1, r2 = rate(a), rate(b)
        print(f"  tokens/s: 1 GPU {r1:,.0f}  2 GPUs {r2:,.0f} ({r2 / 2:,.0f} per rank)  scaling "
              f"efficiency {r2 / (2 * r1):.1%} (target >= 95%)")
for f in sorted(glob.glob(os.path.join(d, "profile", "profile", "phases_rank*.json"))):
    ph = json.load(open(f))
    print(f"profiled 2-GPU distillation, {os.path.basename(f)}: {ph['step_ms']:.1f} ms/step, "
          f"communication {ph.get('communication_ms', 0):.2f} ms/step, backward "
          f"{ph.get('backward_ms', 0):.1f} ms/step, peak {ph.get('peak_allocated_bytes', 0) / 2**30:.2f} GiB "
          f"allocated / {ph.get('peak_reserved_bytes', 0) / 2**30:.2f} GiB reserved")
n1, n2 = records(os.path.join(d, "nodes1")), records(os.path.join(d, "nodes2", "node0"))
if n1:
    common = sorted(set(n1) & set(n2))
    worst = max((abs(n2[s]["loss"] - n1[s]["loss"]) / n1[s]["loss"] for s in common), default=float("inf"))
    two_ok = bool(common) and len(common) == len(n1) and worst <= 1e-5
    ok &= two_ok
    print(f"two nodes (--nnodes 2) vs one node (--nproc-per-node 2): {len(common)} steps, max rel "
          f"diff {worst:.2e} (tol 1e-5: the same ranks, the same sums) {'PASS' if two_ok else 'FAIL'}")
s1, s2 = records(os.path.join(d, "smollm2", "gpu1")), records(os.path.join(d, "smollm2", "gpu2"))
if s1 and s2:
    r1, r2 = rate(s1), rate(s2)
    print(f"SmolLM2-135M teacher, llama student: tokens/s 1 GPU {r1:,.0f}, 2 GPUs {r2:,.0f}: "
          f"scaling efficiency {r2 / (2 * r1):.1%} (target >= 95%)")
print("trajectories:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== overall: $([ $status -eq 0 ] && echo PASS || echo FAIL)  (report: $DIR/report.txt)"
exit $status
