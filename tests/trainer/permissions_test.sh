#!/usr/bin/env bash
# What the trainer cannot read is named as unreadable, never as damaged: a checkpoint without
# read permission stops the start (no fallback to an older checkpoint, no advice to delete it),
# and a train.out_dir that cannot be listed is one line naming the key. As root, the trainer runs
# without capabilities (setpriv), so that file permissions apply; without setpriv it skips.
# Usage: permissions_test.sh DISTILL_TRAINER WORK_DIR
set -u
bin=$1
work=$2
fail() { echo "FAIL: $*"; [ -f "$work/err" ] && sed 's/^/  stderr: /' "$work/err"; exit 1; }
as_user=()
if [ "$(id -u)" = 0 ]; then
  command -v setpriv >/dev/null || { echo "SKIP: root without setpriv"; exit 77; }
  as_user=(setpriv --inh-caps=-all --ambient-caps=-all --bounding-set=-all)
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
args=(-q train.mode=pretrain train.baseline=false train.device=cpu train.log_interval=1
      train.eval_interval=0 train.checkpoint_interval=2 train.keep_checkpoints=3 student.n_layer=1
      student.d_model=32 student.n_head=2 student.context_length=16 data.seq_len=16
      data.min_seq_len=4 data.batch_size=4 schedule.warmup_steps=2 train.out_dir=run)
"${as_user[@]}" "$bin" "${args[@]}" train.steps=4 >/dev/null 2>err || fail "first run failed"
ck=run/checkpoints/step_0000004.pt
[ -f "$ck" ] && [ -f run/checkpoints/step_0000002.pt ] || fail "checkpoints missing: $(ls run/checkpoints)"
before=$(cksum <"$ck")
metrics=$(cat run/metrics.jsonl)
chmod 000 "$ck"
"${as_user[@]}" "$bin" "${args[@]}" train.steps=6 >/dev/null 2>err
rc=$?
chmod 644 "$ck"
[ "$rc" = 1 ] || fail "unreadable checkpoint: exit status $rc, expected 1"
grep -q "^distill_trainer: .*$ck: cannot be read: Permission denied (the checkpoint may be intact: make it readable, e.g. chmod u+r, and run the same command again)$" err ||
  fail "unreadable checkpoint: message"
grep -q -i "fresh\|damaged\|previous checkpoint" err && fail "unreadable checkpoint: called damaged"
[ "$(cksum <"$ck")" = "$before" ] || fail "the checkpoint changed"
[ "$(cat run/metrics.jsonl)" = "$metrics" ] || fail "metrics.jsonl changed"
# Readable again: the same command resumes from it.
"${as_user[@]}" "$bin" "${args[@]}" train.steps=6 >/dev/null 2>err || fail "resume after chmod"
[ -f run/checkpoints/step_0000006.pt ] || fail "no resume"
# Its checkpoints/ that cannot be listed: named, exit status 1, nothing changed.
chmod 311 run/checkpoints
"${as_user[@]}" "$bin" "${args[@]}" train.steps=8 >/dev/null 2>err
rc=$?
chmod 755 run/checkpoints
[ "$rc" = 1 ] || fail "unlistable checkpoints/: exit status $rc, expected 1"
[ "$(cat err)" = 'distill_trainer: run/checkpoints: cannot list it: Permission denied' ] ||
  fail "unlistable checkpoints/: message"
[ -f run/checkpoints/step_0000006.pt ] && [ ! -f run/checkpoints/step_0000008.pt ] ||
  fail "unlistable checkpoints/: checkpoints changed"
# A train.out_dir that cannot be listed.
mkdir noread && chmod 311 noread
"${as_user[@]}" "$bin" "${args[@]}" train.out_dir=noread train.steps=2 >/dev/null 2>err
rc=$?
chmod 755 noread
[ "$rc" = 1 ] || fail "unlistable out_dir: exit status $rc, expected 1"
[ "$(cat err)" = 'distill_trainer: override "train.out_dir=noread": train.out_dir "noread": cannot list it: Permission denied' ] ||
  fail "unlistable out_dir: message"
echo PASS
