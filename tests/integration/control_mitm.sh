#!/bin/sh
# control_mitm.sh: the other direction of the worker link. An attacker between a worker and the
# coordinator (build/tests/mge-forge mitm: the worker dials it, it relays to the coordinator)
# answers the worker's frames itself while the worker runs a job:
#  1. the genuine reply that assigned the job, replayed (a valid MAC, an old counter)
#  2. that reply with its counter changed to the frame's (the MAC no longer matches)
#  3. a reply that asks the job for a checkpoint and assigns a job of the attacker's, with a
#     MAC of zeros; 4. that and a cancel of the job, without a MAC; 5. that as a refusal (an error)
# None is obeyed: the rank runs on (same process, no checkpoint, no second rank), the forged job
# never starts, the worker logs each refusal, registers again and trains on; then a genuine
# cancel through the same relay ends the job (so the refusals mean something).
. "$(dirname "$0")/lib/control.sh"
FORGE=$BUILD/tests/mge-forge
[ -x "$FORGE" ] || { echo "SKIP: $FORGE not built (make tests-build)"; exit 77; }

# the job's live rank processes ("PID PID ..."); each check below is a function of this shell
rank_pids() { rank_cmdlines "/job-$JOB/attempt-" | cut -d' ' -f1 | tr '\n' ' ' | sed 's/ $//'; }
same_rank() { [ -n "$PID0" ] && [ "$(rank_pids)" = "$PID0" ]; }
no_ckpt_asked() { ! grep -q 'checkpoint asked for' "$T/worker-wa.log"; }
first_attempt_running() { api GET "/api/v1/jobs/$JOB" | jq -e '.state == "running" and .attempt == 1'; }
rank_gone() { ! kill -0 "$PID0" 2>/dev/null; }

# the attacks hold the worker's heartbeats back for ~22 s (5 s of back-off after each refusal): a
# relay can always delay or drop frames; that it stalls a job is not what this test is about
WORKER_TIMEOUT=60
start_coord --progress-timeout 120
REAL_URL=$WORKER_URL

cat >"$T/long.yaml" <<Y
name: long
$LONG_MODEL
$LONG_DATA
resources: {cpus: 1}
train: {steps: 100000, batch_size: 128, $LONG_OPT, checkpoint_every: 100000}
Y
JOB=$(submit_yaml "$T/long.yaml")
[ -n "$JOB" ] && [ "$JOB" != null ] || { fail "the job was not accepted"; finish; }
FAKE=$((JOB + 1000))

"$FORGE" mitm tcp://127.0.0.1:0 "$REAL_URL" "$T/mitm.port" "$JOB" 60 >"$T/mitm.log" 2>&1 &
MITM_PID=$!
PIDS="$PIDS $MITM_PID"
wait_until 10 test -s "$T/mitm.port" || { fail "mge-forge mitm did not start"; finish; }
WORKER_URL=tcp://127.0.0.1:$(sed -n 's/^port=//p' "$T/mitm.port")
start_worker wa
WORKER_URL=$REAL_URL

check "the job runs on the worker behind the relay" wait_until 30 step_at_least "$JOB" 1
check "the relay saw the genuine Assign" grep -q "relayed the genuine Assign of job $JOB" "$T/mitm.log"
PID0=$(rank_pids)
check "one rank of the job is running" test -n "$PID0"
check "the five attacks were sent" wait_until 60 grep -q "attacks done" "$T/mitm.log"
cat "$T/mitm.log"

# every forged reply was refused, and said so
n_bad=$(grep -c "reply with a bad MAC or counter ignored" "$T/worker-wa.log")
n_nomac=$(grep -c "reply without MAC ignored" "$T/worker-wa.log")
n_refused=$(grep -c "coordinator refused us: forged refusal" "$T/worker-wa.log")
echo "worker: $n_bad bad MAC or counter, $n_nomac without MAC, $n_refused forged refusals"
check "attacks 1-3 refused for their MAC or counter" test "$n_bad" -ge 3
check "attack 4 refused for its missing MAC" test "$n_nomac" -ge 1
check "attack 5 taken as a refusal only" test "$n_refused" -ge 1
S=$(job_step "$JOB")
check "the worker registers again and the job trains on (past step $S + 5)" \
    wait_until 30 step_at_least "$JOB" $((S + 5))

# nothing the attacker said was done
check "the same rank process runs (not cancelled, not restarted, no second one)" same_rank
check "no checkpoint was asked for" no_ckpt_asked
check "and none was written" test "$(n_checkpoints "$JOB")" -eq 0
check "the forged job never started" test ! -e "$T/w-wa/job-$FAKE"
check "the job is still in its first attempt, running" first_attempt_running
check "the worker is ready, not lost" worker_ready wa

# the positive control: a genuine cancel through the same relay is obeyed
api POST "/api/v1/jobs/$JOB/cancel" >/dev/null
check "a genuine cancel through the relay ends the job" wait_until 20 state_is "$JOB" cancelled
check "and its rank" wait_until 20 rank_gone
finish
