#!/usr/bin/env bash
# SIGTERM / SIGINT / SIGHUP during training: the step finishes, a checkpoint is written, one line says
# where, the process ends as by the signal (status 128 + signal in the shell); the same command
# (with more steps) resumes from it.
# Usage: signal_test.sh DISTILL_TRAINER WORK_DIR
set -u
# Under nohup (a CI job's, say) SIGHUP is ignored, and bash cannot un-ignore a signal ignored at
# its start: run again with SIGHUP at its default, so that the trainer's own handling is tested.
if [ -z "${SIGNAL_TEST_HUP_DEFAULT:-}" ] && [ -r /proc/$$/status ] &&
  (( 0x$(awk '/^SigIgn/ {print $2}' /proc/$$/status) & 1 )); then
  SIGNAL_TEST_HUP_DEFAULT=1 exec env --default-signal=HUP bash "$0" "$@"
fi
bin=$1
work=$2
fail() { echo "FAIL: $*"; [ -f "$work/err" ] && sed 's/^/  stderr: /' "$work/err"; exit 1; }
# Waits (at most 60 s) until DIR/metrics.jsonl holds N records.
wait_for_records() {
  for _ in $(seq 600); do
    [ "$({ wc -l <"$1/metrics.jsonl"; } 2>/dev/null || echo 0)" -ge "$2" ] && return
    sleep 0.1
  done
}

for sig in TERM INT HUP; do
  dir="$work/run_$sig"
  rm -rf "$work" && mkdir -p "$work"
  args=(train.mode=pretrain train.baseline=false train.device=cpu train.log_interval=1
        train.eval_interval=0 train.checkpoint_interval=0 student.n_layer=1 student.d_model=32
        student.n_head=2 student.context_length=16 data.seq_len=16 data.min_seq_len=4
        data.batch_size=4 schedule.warmup_steps=2 "train.out_dir=$dir")
  "$bin" "${args[@]}" train.steps=1000000 2>"$work/err" >/dev/null &
  pid=$!
  wait_for_records "$dir" 3
  # Twice, as GNU timeout delivers it (to the process, then to its process group): one request.
  kill -"$sig" "$pid"
  kill -"$sig" "$pid" 2>/dev/null
  wait "$pid"
  rc=$?
  want=$(case $sig in TERM) echo 143 ;; INT) echo 130 ;; HUP) echo 129 ;; esac)
  [ "$rc" = "$want" ] || fail "SIG$sig: exit status $rc, expected $want"
  line=$(grep "^distill_trainer: SIG$sig: " "$work/err") || fail "SIG$sig: no message"
  [[ "$line" =~ ^distill_trainer:\ SIG$sig:\ checkpoint\ at\ step\ ([0-9]+)\ written\ to\ (.*)\;\ resume\ with\ the\ same\ command$ ]] ||
    fail "SIG$sig: message \"$line\""
  step=${BASH_REMATCH[1]}
  [ "${BASH_REMATCH[2]}" = "$dir/checkpoints/$(printf 'step_%07d.pt' "$step")" ] ||
    fail "SIG$sig: checkpoint path ${BASH_REMATCH[2]}"
  [ -f "${BASH_REMATCH[2]}" ] || fail "SIG$sig: ${BASH_REMATCH[2]} was not written"
  grep -q "terminate\|Aborted\|Traceback" "$work/err" && fail "SIG$sig: crash output"
  "$bin" "${args[@]}" train.steps=$((step + 2)) 2>"$work/err" >/dev/null ||
    fail "SIG$sig: the resume failed"
  grep -q "resuming at step $step " "$work/err" || fail "SIG$sig: did not resume at step $step"
  echo "SIG$sig: stopped at step $step with status $rc, resumed"
done
# A run started with --fresh (or with train.resume=false): "the same command" would delete the
# run (or refuse it), so the advice says what to leave out; that command resumes.
dir="$work/run_fresh"
"$bin" --fresh "${args[@]}" "train.out_dir=$dir" train.steps=1000000 2>"$work/err" >/dev/null &
pid=$!
wait_for_records "$dir" 3
kill -TERM "$pid"
wait "$pid"
line=$(grep "^distill_trainer: SIGTERM: " "$work/err") || fail "--fresh: no message"
[[ "$line" =~ checkpoint\ at\ step\ ([0-9]+)\ .*\;\ resume\ with\ the\ same\ command\ without\ --fresh\ \(which\ would\ delete\ the\ run\ and\ start\ over\)$ ]] ||
  fail "--fresh: message \"$line\""
step=${BASH_REMATCH[1]}
"$bin" "${args[@]}" "train.out_dir=$dir" train.steps=$((step + 1)) 2>"$work/err" >/dev/null ||
  fail "--fresh: the resume without --fresh failed"
grep -q "resuming at step $step " "$work/err" || fail "--fresh: did not resume at step $step"
echo "SIGTERM of a --fresh run: the advice leaves --fresh out, and that resumes"
# Outside a training step (here the final evaluation, made long): one line, exit 128 + signal.
dir="$work/run_eval"
"$bin" "${args[@]}" "train.out_dir=$dir" train.steps=2 train.eval_batches=1000000 \
  2>"$work/err" >/dev/null &
pid=$!
wait_for_records "$dir" 2
sleep 0.5
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" = 143 ] || fail "evaluation: exit status $rc, expected 143"
grep -q "^distill_trainer: SIGTERM: stopped outside a training step" "$work/err" ||
  fail "evaluation: no message"
[ -f "$dir/checkpoints/step_0000002.pt" ] || fail "evaluation: the step-2 checkpoint is missing"
echo "SIGTERM during the final evaluation: one line, status $rc"
# A second signal a second or more after the first: the user insists, the process ends at once
# (here inside step 3's evaluation, made long, which the first signal waits for), as a death by
# the signal, keeping the checkpoints written so far (that a kept checkpoint resumes is the first
# part's check: this run's final evaluation would be as long).
dir="$work/run_twice"
"$bin" "${args[@]}" "train.out_dir=$dir" train.steps=1000000 train.eval_interval=3 \
  train.eval_batches=1000000 train.checkpoint_interval=1 2>"$work/err" >/dev/null &
pid=$!
wait_for_records "$dir" 3
kill -TERM "$pid"
sleep 1.5
kill -0 "$pid" 2>/dev/null || fail "twice: the first SIGTERM ended the process before the step did"
kill -TERM "$pid"
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && { kill -KILL "$pid"; fail "twice: still running 10 s after the second SIGTERM"; }
wait "$pid"
rc=$?
[ "$rc" = 143 ] || fail "twice: exit status $rc, expected 143"
grep -q "^distill_trainer: stopping on SIGTERM: finishing this step" "$work/err" ||
  fail "twice: no line for the first SIGTERM"
grep -q "^distill_trainer: second SIGTERM: exiting at once" "$work/err" ||
  fail "twice: no line for the second SIGTERM"
grep -q "terminate\|Aborted\|Traceback" "$work/err" && fail "twice: crash output"
[ -f "$dir/checkpoints/step_0000002.pt" ] || fail "twice: the step-2 checkpoint is missing"
[ -f "$dir/checkpoints/step_0000003.pt" ] && fail "twice: a step-3 checkpoint was written"
echo "SIGTERM twice, 1.5 s apart: exited at once with status $rc, the step-2 checkpoint kept"
# A signal during a mid-run evaluation (step 3's, made long): that step is checkpointed and the
# run stops there, without training another step first.
dir="$work/run_in_eval"
"$bin" "${args[@]}" "train.out_dir=$dir" train.steps=1000000 train.eval_interval=3 \
  train.eval_batches=20000 2>"$work/err" >/dev/null &
pid=$!
wait_for_records "$dir" 3
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" = 143 ] || fail "in an evaluation: exit status $rc, expected 143"
grep -q "^distill_trainer: SIGTERM: checkpoint at step 3 written to" "$work/err" ||
  fail "in an evaluation: did not stop at step 3"
[ -f "$dir/checkpoints/step_0000004.pt" ] && fail "in an evaluation: a step-4 checkpoint was written"
echo "SIGTERM during step 3's evaluation: stopped at step 3, status $rc"
# SIGTERM and at once SIGHUP (systemd ending a login session): one request, the step finishes and
# is checkpointed, the process ends as by the signal handled first (both pending at once, the
# kernel delivers SIGHUP, the lower number, first).
dir="$work/run_term_hup"
"$bin" "${args[@]}" "train.out_dir=$dir" train.steps=1000000 2>"$work/err" >/dev/null &
pid=$!
wait_for_records "$dir" 3
kill -TERM "$pid"
kill -HUP "$pid"
wait "$pid"
rc=$?
[ "$rc" = 143 ] || [ "$rc" = 129 ] ||
  fail "SIGTERM then SIGHUP: exit status $rc, expected 143 or 129"
grep -q "^distill_trainer: SIG\(TERM\|HUP\): checkpoint at step [0-9]* written to" "$work/err" ||
  fail "SIGTERM then SIGHUP: no checkpoint"
grep -q "^distill_trainer: second " "$work/err" &&
  fail "SIGTERM then SIGHUP: the second signal counted as insisting"
echo "SIGTERM and at once SIGHUP: one request, checkpointed, status $rc"
# SIGHUP ignored when the trainer starts (nohup, or a parent that ignores it): it stays ignored,
# and the run goes on until a SIGTERM.
dir="$work/run_nohup"
(trap '' HUP && exec "$bin" "${args[@]}" "train.out_dir=$dir" train.steps=1000000) \
  2>"$work/err" >/dev/null &
pid=$!
wait_for_records "$dir" 3
kill -HUP "$pid"
records=$(wc -l <"$dir/metrics.jsonl")
wait_for_records "$dir" $((records + 2))
kill -0 "$pid" 2>/dev/null || fail "nohup: the ignored SIGHUP ended the process"
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" = 143 ] || fail "nohup: exit status $rc after SIGTERM, expected 143"
grep -q "SIGHUP" "$work/err" && fail "nohup: the ignored SIGHUP was reported"
echo "SIGHUP under nohup: ignored; SIGTERM then stopped the run, status $rc"
# A SIGHUP whose terminal took the log's reader with it (\`distill_trainer ... 2>&1 | tee log\`
# when the session ends): the lines written after it go into a broken pipe, and the step still
# finishes and is checkpointed (no death by SIGPIPE, status 141, before the checkpoint).
dir="$work/run_hangup_pipe"
rm -f "$work/fifo" "$work/err" && mkfifo "$work/fifo"
cat "$work/fifo" >/dev/null &
reader=$!
"$bin" "${args[@]}" "train.out_dir=$dir" train.steps=1000000 >"$work/fifo" 2>&1 &
pid=$!
wait_for_records "$dir" 3
kill -HUP "$pid"
kill -KILL "$reader"
wait "$reader" 2>/dev/null
wait "$pid"
rc=$?
[ "$rc" = 129 ] || fail "SIGHUP with a broken pipe: exit status $rc, expected 129"
ls "$dir"/checkpoints/step_*.pt >/dev/null 2>&1 || fail "SIGHUP with a broken pipe: no checkpoint"
echo "SIGHUP with the log's reader gone: checkpointed, status $rc"
echo PASS
