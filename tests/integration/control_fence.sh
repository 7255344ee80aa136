#!/bin/sh
# control_fence.sh: stale attempts are fenced, and a hung rank is noticed.
# (a) A worker is SIGSTOPped past the worker timeout while its two ranks keep training: its
#     jobs are requeued and one of them runs attempt 2 to the end on the other worker. On
#     SIGCONT the worker comes back with attempt 1's buffered output (steps, checkpoints,
#     and the first job's whole run up to its summary): the coordinator cancels the old ranks
#     at once (the second job's old rank is gone within seconds) and stores nothing of theirs
#     (the finished job's result, metrics and checkpoints are unchanged, "latest" still points
#     at attempt 2's file).
# (b) A rank is SIGSTOPped: the watchdog fails its job within 15 s with a reason naming the
#     last step and the rank's worker; with mpirun, rank 1 of a 2-worker job likewise.
# (c) With mpirun, rank 1 of a 2-worker job is killed: the reason names rank 1 and its worker
#     (mpirun, rank 0, exits non-zero as a consequence).
. "$(dirname "$0")/lib/control.sh"

WORKER_TIMEOUT=2
start_coord --progress-timeout 10 --startup-timeout 120
start_worker wa

# job_spec NAME WORKERS STEPS [EXTRA TRAIN KEYS]: the long MLP, one CPU per worker
job_spec() {
    printf 'name: %s\n%s\n%s\nresources: {workers: %s, cpus: 1}\n' "$1" "$LONG_MODEL" "$LONG_DATA" "$2"
    printf 'train: {steps: %s, batch_size: 128, %s%s}\n' "$3" "$LONG_OPT" "${4:+, $4}"
}
# attempt1_ranks JOB: "PID COMMAND" of the mge-train processes of JOB's attempt 1 started by this
# test's workers (other tests may run jobs of the same ids); under mpirun every rank has rank
# 0's --out. attempt1_alive JOB: any of them left.
attempt1_ranks() { rank_cmdlines "--out $T/w-" | grep -F "/job-$1/attempt-1/rank-0 "; }
attempt1_alive() { [ -n "$(attempt1_ranks "$1")" ]; }
# rank1_pid JOB: under mpirun, rank 1 is the mge-train whose parent is the orted that rank 1's
# worker started (rank 0's parent is mpirun)
rank1_pid() {
    for p in $(attempt1_ranks "$1" | cut -d' ' -f1); do
        pp=$(awk '{print $4}' "/proc/$p/stat")
        case $(tr '\0' ' ' <"/proc/$pp/cmdline" 2>/dev/null) in *orted*) echo "$p" ;; esac
    done
}
# stop_detected JOB PID WHAT: SIGSTOP PID; JOB must fail within 15 s; its reason in $T/JOB.json
stop_detected() {
    kill -STOP "$2"
    t0=$(date +%s.%N)
    if wait_until 15 state_is "$1" failed; then
        ok "$3 (pid $2) stopped: its job failed $(echo "$(date +%s.%N) - $t0" | bc -l | cut -c1-4) s later (<= 15 s)"
    else
        fail "$3 (pid $2) stopped: its job is still $(job_state "$1") 15 s later"
    fi
    api GET "/api/v1/jobs/$1" >"$T/$1.json"
    echo "     reason: $(jq -r .failure_reason "$T/$1.json")"
}

# --- (a) a worker stopped past the timeout, then resumed ---
# From the first checkpoint (50) to the end is the margin to stop wa before attempt 1 ends.
# A metric line every 10 steps: while wa is stopped, attempt 1's output waits in its stdout
# socket, whose buffer holds only ~200 lines (a line per write); it must not block on it.
STEPS=400
job_spec fence-done 1 $STEPS "checkpoint_every: 50, log_every: 10" >"$T/done.yaml"
job_spec fence-forever 1 100000 >"$T/forever.yaml"
DONE=$(submit_yaml "$T/done.yaml")
FOREVER=$(submit_yaml "$T/forever.yaml")
check "both jobs run on wa" wait_until 20 sh -c "
    [ \"\$(curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs?state=running' | jq '.jobs | length')\" = 2 ]"
start_worker wb
check "the first job's first checkpoint is indexed" wait_until 60 has_checkpoint "$DONE"
done1=$(attempt1_ranks "$DONE" | cut -d' ' -f1)
forever1=$(attempt1_ranks "$FOREVER" | cut -d' ' -f1)
check "attempt 1 of each job runs on wa (pids $done1, $forever1)" test -n "$done1" -a -n "$forever1"
kill -STOP "$WORKER_PID_wa"
ok "worker wa stopped (SIGSTOP) at step $(job_step "$DONE") of the first job"
check "both jobs are requeued and run attempt 2 on wb" wait_until 20 sh -c "
    curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$DONE' | jq -e '.attempt == 2' &&
    curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$FOREVER' | jq -e '.attempt == 2'"
check "the first job's attempt 2 runs to the end" wait_until 90 state_is "$DONE" succeeded
# attempt 1 trains on meanwhile (its output waits in the stopped worker's pipes): let it end
check "the first job's attempt 1 (on the stopped worker) trained to its end too" \
    wait_until 90 eval "! attempt1_alive $DONE"
check "the second job's attempt 1 still runs" kill -0 "$forever1"
snapshot() { # SUFFIX: what the API shows of the finished job
    api GET "/api/v1/jobs/$DONE" | jq -S '{state, attempt, result, failure_reason}' >"$T/done-$1.json"
    api GET "/api/v1/jobs/$DONE/metrics" | jq -S . >"$T/metrics-$1.json"
    api GET "/api/v1/jobs/$DONE/checkpoints" | jq -S . >"$T/ckpt-$1.json"
}
snapshot before
check "attempt 2's result is stored (steps_run < $STEPS: resumed)" jq -e --argjson n "$STEPS" '
    .result.steps == $n and .result.steps_run < $n' "$T/done-before.json"

kill -CONT "$WORKER_PID_wa"
t0=$(date +%s.%N)
if wait_until 10 eval "! kill -0 $forever1 2>/dev/null && ! attempt1_alive $FOREVER"; then
    ok "the second job's old rank (pid $forever1) ended $(echo "$(date +%s.%N) - $t0" | bc -l | cut -c1-4) s after SIGCONT (<= 10 s)"
else
    fail "the second job's old rank (pid $forever1) still runs 10 s after SIGCONT"
fi
check "wa registered again" wait_until 10 worker_ready wa
check "the coordinator dropped attempt 1's output from wa (logged)" \
    wait_until 10 grep -q "dropped [0-9]* line(s) from worker .*job $DONE attempt 1" "$T/coordinator.log"
check "... and told wa to cancel the old ranks (logged)" \
    grep -q "worker 'wa': rank of job $FOREVER attempt 1 rank 0 refused" "$T/coordinator.log"
sleep 2 # a few more heartbeats: whatever wa still had to send is in
snapshot after
check "the finished job's state and result are unchanged" cmp "$T/done-before.json" "$T/done-after.json"
check "its metrics are unchanged" cmp "$T/metrics-before.json" "$T/metrics-after.json"
check "its checkpoints are unchanged" cmp "$T/ckpt-before.json" "$T/ckpt-after.json"
check "its latest checkpoint is attempt 2's, on wb" sh -c "
    curl -s -o '$T/latest' -w '%{http_code}' -H 'Authorization: Bearer $ADMIN' \
        '$URL/api/v1/jobs/$DONE/checkpoints/latest' | grep -q 200 &&
    jq -e '[.checkpoints[] | select(.name != \"latest\")] | max_by(.step) | .worker == \"wb\"' '$T/ckpt-after.json'"
"$BIN/mgectl" cancel "$FOREVER" >/dev/null
check "the second job is cancelled" wait_until 10 state_is "$FOREVER" cancelled

# --- (b) a rank stopped: the watchdog ---
job_spec fence-hang 1 100000 >"$T/hang.yaml"
HANG=$(submit_yaml "$T/hang.yaml")
check "the job to hang reaches step 20" wait_until 60 step_at_least "$HANG" 20
hung=$(attempt1_ranks "$HANG" | cut -d' ' -f1)
at=$(job_step "$HANG")
stop_detected "$HANG" "$hung" "a one-rank job's rank"
check "... with the step and the stopped rank's worker in the reason, not requeued" jq -e --argjson at "$at" '
    (.failure_reason | test("^no progress for [0-9]+ s since step [0-9]+ [(]rank 0 on w[ab] stopped[)]$"))
    and (.failure_reason | capture("since step (?<s>[0-9]+)").s | tonumber) >= $at and .attempt == 1' "$T/$HANG.json"
check "... and the stopped rank is killed" wait_until 10 eval "! kill -0 $hung 2>/dev/null || [ \"\$(cut -d' ' -f3 /proc/$hung/stat)\" = Z ]"

MPIRUN=$(command -v mpirun.openmpi || command -v mpirun)
if [ -z "$MPIRUN" ] || [ ! -x "$BIN/mge-launch" ]; then
    echo "     (no mpirun or mge-launch: the 2-worker cases are skipped)"
    finish
fi
# with mpirun: rank 1 of a 2-worker job stopped (the others spin in MPI_Allreduce)
job_spec fence-hang2 2 100000 >"$T/hang2.yaml"
HANG2=$(submit_yaml "$T/hang2.yaml")
check "the 2-worker job to hang reaches step 20" wait_until 60 step_at_least "$HANG2" 20
r1_hang_worker=$(api GET "/api/v1/jobs/$HANG2" | jq -r '.placement[1].worker')
stop_detected "$HANG2" "$(rank1_pid "$HANG2")" "rank 1 of a 2-worker job"
check "... with the step, and the stopped rank and its worker in the reason" jq -e --arg w "$r1_hang_worker" '
    .failure_reason | test("^no progress for [0-9]+ s since step [0-9]+ [(]rank 1 on " + $w + " stopped[)]$")' "$T/$HANG2.json"
check "... and every rank of it ends" wait_until 10 eval "! attempt1_alive $HANG2"

# --- (c) rank 1 killed: mpirun (rank 0) exits non-zero too, but the reason names rank 1 ---
job_spec fence-kill1 2 100000 >"$T/kill1.yaml"
KILL1=$(submit_yaml "$T/kill1.yaml")
check "the 2-worker job to break reaches step 5" wait_until 60 step_at_least "$KILL1" 5
r1_worker=$(api GET "/api/v1/jobs/$KILL1" | jq -r '.placement[1].worker')
kill -9 "$(rank1_pid "$KILL1")"
check "rank 1 killed with SIGKILL: the job fails" wait_until 20 state_is "$KILL1" failed
api GET "/api/v1/jobs/$KILL1" >"$T/kill1.json"
echo "     reason: $(jq -r .failure_reason "$T/kill1.json")"
check "... and the reason names rank 1 and its worker $r1_worker, not rank 0" jq -e --arg w "$r1_worker" '
    .failure_reason == "rank 1 killed by signal 9 on " + $w' "$T/kill1.json"
finish
