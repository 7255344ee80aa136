#!/bin/sh
# control_worker_lost.sh: kill -9 of a worker during a job: the worker is marked lost after
# the heartbeat timeout, the job's attempt fails with "worker lost" and the job is queued
# again; the second attempt runs on the other worker from the last checkpoint and succeeds.
. "$(dirname "$0")/lib/control.sh"

STEPS=300    # 784-1024-1024-10 at batch 128, 2 threads: 4-8 ms a step idle, 10x that on a busy box;
             # the steps after the first checkpoint are the margin for killing the worker in time
CKPT=50
WORKER_TIMEOUT=2
start_coord
start_worker wa
start_worker wb
cat > "$T/job.yaml" <<Y
name: lost
$LONG_MODEL
$LONG_DATA
resources: {cpus: 2}
train: {steps: $STEPS, batch_size: 128, $LONG_OPT, checkpoint_every: $CKPT}
Y
JOB=$(submit_yaml "$T/job.yaml")
check "the job runs" wait_until 20 state_is "$JOB" running
check "the rank runs with the job's 2 CPUs (--threads 2, OMP_NUM_THREADS=2)" \
    wait_until 10 rank_threads_are "$JOB" 2
check "its first checkpoint is indexed" wait_until 30 has_checkpoint "$JOB"
first=$(api GET "/api/v1/jobs/$JOB" | jq -r '.placement[0].worker')
eval "victim=\$WORKER_PID_$first"
kill -9 "$victim"
at=$(job_step "$JOB")
ck=$(api GET "/api/v1/jobs/$JOB/checkpoints" | jq '[.checkpoints[] | select(.name != "latest") | .step] | max')
ok "worker $first killed with SIGKILL at step $at (last checkpoint indexed: step $ck)"
check "the worker is marked lost" wait_until 15 sh -c "curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/workers' | jq -e '.workers[] | select(.name == \"$first\" and .state == \"lost\")' >/dev/null"
curl -s -N --max-time 3 -H "Authorization: Bearer $ADMIN" "$URL/api/v1/jobs/$JOB/events" | grep '^data: {"state"' >"$T/states"
check "the attempt failed with reason 'worker lost'" grep -q '"state":"failed","attempt":1,"reason":"worker lost' "$T/states"
check "and the job was queued again as attempt 2" grep -q '"state":"queued","attempt":2' "$T/states"
check "the orphaned rank of the killed worker ends too (SIGPIPE on its next line)" \
    wait_until 10 eval "! ranks_alive '--out $T/w-$first/'"
rank_cmdlines "--out $T/w-$first/" | while read -r p cmd; do echo "     left: pid $p: $cmd"; done
check "the job succeeds on the other worker" wait_until 60 state_is "$JOB" succeeded
api GET "/api/v1/jobs/$JOB" >"$T/job.json"
check "attempt 2 ran on the surviving worker" jq -e --arg f "$first" '.attempt == 2 and .placement[0].worker != $f and .failure_reason == null' "$T/job.json"
api GET "/api/v1/jobs/$JOB/logs?tail=1000" >"$T/logs.json"
check "attempt 2 was started with --resume and the checkpoint of step $ck" jq -e --arg c "$(printf 'ckpt-%06d.mgeckpt' "$ck")" '
    .lines | any(.attempt == 2 and (.text | test("^mge-worker: rank 0/1 attempt 2: started .*, resuming from .*/job-[0-9]+/attempt-1/rank-0/" + $c + "$")))' "$T/logs.json"
check "... and trained only the steps after it" \
    jq -e --argjson n "$STEPS" --argjson c "$ck" '.result.steps == $n and .result.steps_run == $n - $c' "$T/job.json"
check "loss steps 1..$STEPS are all stored once" loss_steps_exact "$JOB" "$STEPS"
finish
