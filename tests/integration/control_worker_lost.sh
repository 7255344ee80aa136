#!/bin/sh
# control_worker_lost.sh: kill -9 of a worker during a job: the worker is marked lost after
# the heartbeat timeout, the job's attempt fails with "worker lost" and the job is queued
# again; the second attempt runs on the other worker (from the last checkpoint) and succeeds.
. "$(dirname "$0")/lib/control.sh"

WORKER_TIMEOUT=2
start_coord
export FAKE_TRAIN_STEP_MS=25
start_worker wa
start_worker wb
cat > "$T/job.yaml" <<'Y'
name: lost
data: {format: synthetic, train_size: 512, input_dim: 784, classes: 10}
model: {type: mlp, hidden: [32]}
resources: {cpus: 2}
train: {steps: 150, batch_size: 32}
Y
JOB=$(submit_yaml "$T/job.yaml")
check "the job runs" wait_until 20 state_is "$JOB" running
wait_until 20 sh -c "[ \$(curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$JOB' | jq '.progress.step') -ge 15 ]"
first=$(api GET "/api/v1/jobs/$JOB" | jq -r '.placement[0].worker')
eval "victim=\$WORKER_PID_$first"
kill -9 "$victim"
ok "worker $first killed with SIGKILL"
check "the worker is marked lost" wait_until 15 sh -c "curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/workers' | jq -e '.workers[] | select(.name == \"$first\" and .state == \"lost\")' >/dev/null"
curl -s -N --max-time 5 -H "Authorization: Bearer $ADMIN" "$URL/api/v1/jobs/$JOB/events" | grep '^data: {"state"' >"$T/states"
check "the attempt failed with reason 'worker lost'" grep -q '"state":"failed","attempt":1,"reason":"worker lost' "$T/states"
check "and the job was queued again as attempt 2" grep -q '"state":"queued","attempt":2' "$T/states"
check "the job succeeds on the other worker" wait_until 40 state_is "$JOB" succeeded
api GET "/api/v1/jobs/$JOB" >"$T/job.json"
check "attempt 2 ran on the surviving worker" jq -e --arg f "$first" '.attempt == 2 and .placement[0].worker != $f and .failure_reason == null' "$T/job.json"
check "loss steps 1..150 are all stored once" loss_steps_exact "$JOB" 150
finish
