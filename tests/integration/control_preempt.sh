#!/bin/sh
# control_preempt.sh: priorities. On a full cluster (one worker, 2 CPUs) a priority-10 job
# preempts the running priority-0 job: that one is requeued ("preempted by job N (priority
# 10)", not charged to its restarts) once it has written the checkpoint the preemption asked
# for, the high one runs within seconds, and the preempted one resumes from that checkpoint
# afterwards (no step lost) and ends with the same final loss as an undisturbed run of its spec
# (bit-identical). A job of the same priority never preempts.
. "$(dirname "$0")/lib/control.sh"

# long enough that the low job is still running when the high one arrives, however fast the
# machine (at 400 steps a fast CI machine finished it before the preemption could happen)
STEPS=1500
CKPT=50
start_coord
start_worker wa
job() { # NAME PRIORITY STEPS
    cat >"$T/$1.yaml" <<Y
name: $1
priority: $2
$LONG_MODEL
$LONG_DATA
resources: {cpus: 2}
train: {steps: $3, batch_size: 128, $LONG_OPT, checkpoint_every: $CKPT}
Y
}
job low 0 $STEPS
job same 0 20
job high 10 100
LOW=$(submit_yaml "$T/low.yaml")
check "the priority-0 job runs" wait_until 20 state_is "$LOW" running
JOB=$LOW
check "... past its checkpoint of step 100" wait_until 60 ckpt_after 99
SAME=$(submit_yaml "$T/same.yaml")
sleep 2
check "a job of the same priority waits, preempting nothing" sh -c \
    "[ \"\$(curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$SAME' | jq -r .state)\" = queued ] &&
     [ \"\$(curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$LOW' | jq -r .attempt)\" = 1 ]"
api POST "/api/v1/jobs/$SAME/cancel" >/dev/null
at=$(job_step "$LOW")
t0=$(date +%s.%N)
HIGH=$(submit_yaml "$T/high.yaml")
high_runs() { state_is "$HIGH" running || state_is "$HIGH" succeeded; }
if wait_until 5 high_runs; then
    ok "the priority-10 job runs $(secs "$t0" "$(date +%s.%N)") s after its submission (<= 5 s; the low one was at step $at)"
else
    fail "the priority-10 job does not run 5 s after its submission"
fi
api GET "/api/v1/jobs/$LOW" >"$T/low.json"
jq -c '{state, attempt, restarts, incarnations: [.incarnations[] | {start_step, reason, infra}]}' \
    "$T/low.json" | sed 's/^/     /'
check "the priority-0 job was requeued, preempted by job $HIGH, not charged" jq -e --argjson h "$HIGH" '
    .attempt >= 2 and .restarts == 0 and
    (.incarnations[0].reason | startswith("preempted by job \($h) (priority 10)")) and
    .incarnations[0].infra == true' "$T/low.json"
check "the priority-10 job succeeds" wait_until 60 state_is "$HIGH" succeeded
check "then the preempted job resumes and succeeds" wait_until 300 state_is "$LOW" succeeded
api GET "/api/v1/jobs/$LOW" >"$T/low.json"
# the preemption asked it for a checkpoint first (mge-train got SIGUSR2): it resumes from that
# one, of a step at least as far as it had come when the high job arrived, not from its last
# periodic checkpoint (a multiple of $CKPT)
curl -s -H "Authorization: Bearer $ADMIN" "$URL/api/v1/jobs/$LOW/logs" |
    jq -r '.lines[].text' >"$T/low.log"
asked=$(sed -n 's/.*checkpoint of step \([0-9]*\) on request (SIGUSR2).*/\1/p' "$T/low.log" | head -n 1)
check "its log says a checkpoint was written on request (step ${asked:-none})" test -n "$asked"
check "... from that checkpoint (step ${asked:-none} >= $at: none of its steps before the preemption lost)" \
    jq -e --argjson at "$at" --argjson asked "${asked:--1}" '
    .incarnations[-1].start_step == $asked and $asked >= $at and
    .result.steps_run == .result.steps - .incarnations[-1].start_step' "$T/low.json"
"$MGE_TRAIN_BIN" "$T/low.yaml" --out "$T/undisturbed" --json --threads 2 >"$T/undisturbed.json" \
    2>"$T/undisturbed.err"
want=$(jq -r 'select(.summary) | .final_loss' "$T/undisturbed.json")
got=$(jq -r .result.final_loss "$T/low.json")
check "its final loss equals an undisturbed run's ($got == $want)" test -n "$want" -a "$got" = "$want"
check "loss steps 1..$STEPS are all stored once" loss_steps_exact "$LOW" "$STEPS"
finish
