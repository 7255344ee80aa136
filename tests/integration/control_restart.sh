#!/bin/sh
# control_restart.sh: kill -9 of the coordinator during a job loses nothing: after a restart
# on the same ports the worker reports its running rank again, the job succeeds, and every
# loss step is stored exactly once. A follower (mgectl logs -f) rides through the restart.
. "$(dirname "$0")/lib/control.sh"

WORKER_TIMEOUT=5
start_coord
export FAKE_TRAIN_STEP_MS=25
start_worker w1
cat > "$T/job.yaml" <<'Y'
name: survive
data: {format: synthetic, train_size: 512, input_dim: 784, classes: 10}
model: {type: mlp, hidden: [32]}
train: {steps: 200, batch_size: 32}
Y
JOB=$(submit_yaml "$T/job.yaml")
check "the job runs" wait_until 20 state_is "$JOB" running
wait_until 20 sh -c "[ \$(curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$JOB' | jq '.progress.step') -ge 20 ]"
"$BIN/mgectl" logs "$JOB" -f >"$T/follow.out" 2>"$T/follow.err" &
FOLLOW=$!
PIDS="$PIDS $FOLLOW"
sleep 0.3

at=$(api GET "/api/v1/jobs/$JOB" | jq -r '.progress.step')
kill -9 "$COORD_PID"
ok "coordinator killed with SIGKILL at step $at"
check "the worker notices and keeps its rank running" \
    wait_until 15 grep -q 'coordinator unreachable' "$T/worker-w1.log"
sleep 1   # the rank keeps producing lines the worker must buffer
start_coord
ok "coordinator restarted on $HTTP_ADDR"
check "the job is still running after the restart" state_is "$JOB" running
check "the job succeeds" wait_until 40 state_is "$JOB" succeeded
check "loss steps 1..200 stored exactly once each, decreasing" loss_steps_exact "$JOB" 200
api GET "/api/v1/jobs/$JOB/logs?tail=100000" >"$T/logs.json"
check "no log line stored twice" jq -e '[.lines[] | [.attempt, .rank, .seq]] | (length == (unique | length))' "$T/logs.json"
check "the job ran once (attempt 1)" sh -c "curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$JOB' | jq -e '.attempt == 1 and .result.steps == 200' >/dev/null"
wait_until 20 sh -c "! kill -0 $FOLLOW 2>/dev/null"
wait "$FOLLOW"; rc=$?
check "mgectl logs -f followed through the restart and exits 0" [ "$rc" = 0 ]
check "... and printed the rank's output" grep -q 'fake-train: rank 0/1' "$T/follow.out"
finish
