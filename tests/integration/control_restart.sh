#!/bin/sh
# control_restart.sh: kill -9 of the coordinator during a job loses nothing: after a restart
# on the same ports the worker reports its running rank again, the job succeeds, and every
# loss step is stored exactly once. A follower (mgectl logs -f) rides through the restart.
. "$(dirname "$0")/lib/control.sh"

STEPS=800    # 784-1024-1024-10 at batch 128: about 10-20 s on one core
CKPT=200
WORKER_TIMEOUT=5
start_coord
start_worker w1
cat > "$T/job.yaml" <<Y
name: survive
$LONG_MODEL
$LONG_DATA
train: {steps: $STEPS, batch_size: 128, $LONG_OPT, checkpoint_every: $CKPT}
Y
JOB=$(submit_yaml "$T/job.yaml")
check "the job runs" wait_until 20 state_is "$JOB" running
check "... and trains" wait_until 20 step_at_least "$JOB" 20
"$BIN/mgectl" logs "$JOB" -f --every 0 >"$T/follow.out" 2>"$T/follow.err" &
FOLLOW=$!
PIDS="$PIDS $FOLLOW"
wait_until 10 grep -q '^step ' "$T/follow.out"

at=$(job_step "$JOB")
kill -9 "$COORD_PID"
wait "$COORD_PID" 2>/dev/null # its state lock goes with it
ok "coordinator killed with SIGKILL at step $at"
check "the worker notices and keeps its rank running" \
    wait_until 15 grep -q 'coordinator unreachable' "$T/worker-w1.log"
# let the rank train on while nobody listens: its next checkpoint file is the proof
next=$(( (at / CKPT + 1) * CKPT ))
check "the rank reaches step $next with the coordinator down" \
    wait_until 30 test -e "$T/w-w1/job-$JOB/attempt-1/rank-0/$(printf 'ckpt-%06d.mgeckpt' "$next")"
start_coord
ok "coordinator restarted on $HTTP_ADDR"
check "the job is still running after the restart" state_is "$JOB" running
check "the worker reports the steps it buffered" wait_until 15 step_at_least "$JOB" "$next"
check "the job succeeds" wait_until 60 state_is "$JOB" succeeded
check "loss steps 1..$STEPS stored exactly once each, loss falling" loss_steps_exact "$JOB" "$STEPS"
curl -s -N --max-time 10 -H "Authorization: Bearer $ADMIN" "$URL/api/v1/jobs/$JOB/events" |
    sed -n 's/^data: //p' >"$T/events.json"
check "every step line of mge-train is one metric event, none lost or repeated" \
    jq -e -s --argjson n "$STEPS" '[.[] | select(.loss != null) | .step] == [range(1; $n + 1)]' \
    "$T/events.json"
api GET "/api/v1/jobs/$JOB/logs?tail=100000" >"$T/logs.json"
check "no log line stored twice" jq -e '[.lines[] | [.attempt, .rank, .seq]] | (length == (unique | length))' "$T/logs.json"
check "the job ran once (attempt 1), all steps in one process" sh -c "curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$JOB' |
    jq -e '.attempt == 1 and .result.steps == $STEPS and .result.steps_run == $STEPS' >/dev/null"
wait_until 20 sh -c "! kill -0 $FOLLOW 2>/dev/null"
wait "$FOLLOW"; rc=$?
check "mgectl logs -f followed through the restart and exits 0" [ "$rc" = 0 ]
check "... printed every step once" \
    sh -c "sed -n 's#^step \([0-9]*\)/.*#\1#p' '$T/follow.out' | awk 'NR != \$1 { exit 1 } END { exit NR != $STEPS }'"
check "... and the rank's log lines" grep -q '^mge-worker: rank 0: exited with code 0' "$T/follow.out"
finish
