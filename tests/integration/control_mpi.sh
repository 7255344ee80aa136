#!/bin/sh
# control_mpi.sh: service-mode data parallelism. A 2-worker job submitted with mgectl runs as
# one mpirun started by rank 0's worker, whose launch agent (mge-launch) has the other
# worker start its rank: no ssh (a PATH whose ssh/rsh record any call). It ends with the
# 1-worker job's final loss (1e-5 relative), each rank on another worker, placement, hosts
# and incarnation in GET /jobs/{id} and mgectl get. Then kill -9 of rank 1's worker: the
# other ranks are gone within 10 s, the job is requeued and finishes from its checkpoint.
# Exit 77 (skip) without Open MPI's mpirun.
. "$(dirname "$0")/lib/control.sh"
MPIRUN=$(command -v mpirun.openmpi || command -v mpirun)
[ -n "$MPIRUN" ] || { echo "SKIP: mpirun (Open MPI) is not installed"; exit 77; }
[ -x "$BIN/mge-launch" ] || { echo "SKIP: $BIN/mge-launch not built"; exit 77; }

# any ssh or rsh call is recorded (and fails): the job must not need one
mkdir -p "$T/nossh"
for c in ssh rsh; do
    printf '#!/bin/sh\necho "%s $*" >>"%s/remote-shell-calls"\nexit 255\n' "$c" "$T" >"$T/nossh/$c"
    chmod +x "$T/nossh/$c"
done
PATH="$T/nossh:$PATH"
export PATH

WORKER_TIMEOUT=2
start_coord
start_worker wa
start_worker wb
start_worker wc

# 1003 samples, batch 50: shards of 25, and the epoch's last batch of 3 splits unevenly
spec() { # NAME WORKERS
    cat <<Y
name: $1
model: {type: mlp, hidden: [64, 32]}
data: {format: synthetic, input_dim: 100, classes: 20, train_size: 1003, test_size: 200}
resources: {workers: $2, cpus: 1}
train:
  steps: 200
  batch_size: 50
  optimizer: {type: sgd, lr: 0.01, momentum: 0.9}
  seed: 7
Y
}
spec dp-one 1 >"$T/one.yaml"
spec dp-two 2 >"$T/two.yaml"
ONE=$("$BIN/mgectl" submit "$T/one.yaml" -o json | jq -r .id)
TWO=$("$BIN/mgectl" submit "$T/two.yaml" -o json | jq -r .id)
check "the 1-worker job succeeds" wait_until 60 state_is "$ONE" succeeded
check "the 2-worker job succeeds" wait_until 60 state_is "$TWO" succeeded
api GET "/api/v1/jobs/$ONE" >"$T/one.json"
api GET "/api/v1/jobs/$TWO" >"$T/two.json"
echo "     final loss: 1 worker $(jq .result.final_loss "$T/one.json"), 2 workers $(jq .result.final_loss "$T/two.json")"
check "same final loss within 1e-5 relative" jq -e -n --slurpfile a "$T/one.json" --slurpfile b "$T/two.json" '
    ($a[0].result.final_loss) as $x | ($b[0].result.final_loss) as $y
    | ($x | type) == "number" and (($x - $y) | fabs) <= 1e-5 * ($x | fabs)'
check "2 ranks on 2 different workers, with hosts, incarnation 1" jq -e '
    (.placement | length) == 2 and ([.placement[].worker] | unique | length) == 2
    and all(.placement[]; (.host | type) == "string" and .exited and .exit_code == 0)
    and .incarnation == 1 and .attempt == 1' "$T/two.json"
check "both ranks trained in one MPI job (rank 0 reports 2 ranks)" jq -e '.result.ranks == 2 and .result.backend == "mpi"' "$T/two.json"
"$BIN/mgectl" get "$TWO" >"$T/get.txt"
check "mgectl get shows the incarnation and each rank's worker and host" sh -c "
    grep -q 'placement: incarnation 1, 2 ranks' '$T/get.txt' &&
    grep -Eq 'rank 0 +worker $(jq -r '.placement[0].worker' "$T/two.json") +host ' '$T/get.txt' &&
    grep -Eq 'rank 1 +worker $(jq -r '.placement[1].worker' "$T/two.json") +host ' '$T/get.txt'"
api GET "/api/v1/jobs/$TWO/logs?tail=1000" >"$T/two-logs.json"
check "rank 0's worker started mpirun with the launch agent" jq -e '
    .lines | any(.rank == 0 and (.text | test("^mge-worker: rank 0/2 attempt 1: started mpirun")))' "$T/two-logs.json"
check "rank 1's worker started what mge-launch handed it" jq -e '
    .lines | any(.rank == 1 and (.text | test("^mge-worker: rank 1/2 attempt 1: started the MPI daemon")))' "$T/two-logs.json"
check "no ssh or rsh was called" test ! -e "$T/remote-shell-calls"

# a forged launch request (a finished job, a made-up token) runs nothing and says why
url=$(sed -n 's/.*launch socket on //p' "$T/worker-wb.log" | head -n 1)
echo "wb 1 $url" >"$T/forged-map"
MGE_LAUNCH_MAP="$T/forged-map" MGE_LAUNCH_TOKEN=not-the-token MGE_JOB_ID="$TWO" MGE_ATTEMPT=1 \
    "$BIN/mge-launch" wb touch "$T/pwned" 2>"$T/forged.err"
rc=$?
check "mge-launch with a forged request fails (exit $rc) and nothing ran" sh -c "[ $rc -eq 1 ] && [ ! -e '$T/pwned' ]"
# the worker may still hold the finished rank's record (then the token is what is wrong) or
# have dropped it already (then no rank waits): either is the worker refusing it
check "... with the worker's reason" grep -Eq "refused rank 1: (job $TWO attempt 1 has no rank 1 waiting|wrong launch token for job $TWO attempt 1)" "$T/forged.err"

# a rank's own failure fails the gang (no requeue), with the rank's reason: mge-train exits 2
# on every rank (a memory budget no plan fits), and mpirun with it
{ spec dp-bad 2 | sed 's/hidden: \[64, 32\]/hidden: [1024, 1024]/'
  echo "memory: {sublinear: true, budget_mb: 1}"; } >"$T/bad.yaml"
BAD=$("$BIN/mgectl" submit "$T/bad.yaml" -o json | jq -r .id)
check "a 2-worker job whose ranks exit 2 fails" wait_until 30 state_is "$BAD" failed
api GET "/api/v1/jobs/$BAD" >"$T/bad.json"
check "... not requeued, with the exit of the rank that aborted first as the reason" jq -e '
    .attempt == 1 and (.failure_reason | test("^rank [01] exited with code 2 [(]bad input[)] on w[abc]$"))' "$T/bad.json"
# a worker-side refusal (a data path outside rank 0's worker's roots) fails it before launch
cat >"$T/refused.yaml" <<Y
name: dp-refused
$QUICK_MODEL
data: {format: idx, train_images: /etc/passwd, train_labels: /etc/passwd}
resources: {workers: 2, cpus: 1}
train: {steps: 10, batch_size: 8, $QUICK_OPT}
Y
REF=$("$BIN/mgectl" submit "$T/refused.yaml" -o json | jq -r .id)
check "a 2-worker job with a refused data path fails" wait_until 30 state_is "$REF" failed
api GET "/api/v1/jobs/$REF" >"$T/refused.json"
check "... with the worker's reason, and no rank left waiting" jq -e '
    .attempt == 1 and (.failure_reason | test("outside the worker.s data roots")) and all(.placement[]; .exited)' "$T/refused.json"

# cancelling a running 2-worker job ends every rank on both workers
cat > "$T/cancel.yaml" <<Y
name: dp-cancel
$LONG_MODEL
$LONG_DATA
resources: {workers: 2, cpus: 1}
train: {steps: 100000, batch_size: 128, $LONG_OPT}
Y
CAN=$("$BIN/mgectl" submit "$T/cancel.yaml" -o json | jq -r .id)
can_ranks() { [ "$(rank_cmdlines "/job-$CAN/attempt-1/rank-0 --json" | wc -l)" -eq "$1" ]; }
check "the 2-worker job to cancel runs both ranks" wait_until 30 can_ranks 2
"$BIN/mgectl" cancel "$CAN" >/dev/null
check "mgectl cancel: the job is cancelled" wait_until 10 state_is "$CAN" cancelled
check "... and both ranks are gone within 5 s" wait_until 5 can_ranks 0

# --- a worker of a running 2-worker job dies ---
STEPS=600
cat > "$T/long.yaml" <<Y
name: dp-lost
$LONG_MODEL
$LONG_DATA
resources: {workers: 2, cpus: 1}
train: {steps: $STEPS, batch_size: 128, $LONG_OPT, checkpoint_every: 50}
Y
JOB=$("$BIN/mgectl" submit "$T/long.yaml" -o json | jq -r .id)
check "the long 2-worker job runs" wait_until 30 state_is "$JOB" running
check "its first checkpoint is indexed" wait_until 60 has_checkpoint "$JOB"
api GET "/api/v1/jobs/$JOB" >"$T/long1.json"
victim_name=$(jq -r '.placement[1].worker' "$T/long1.json")
eval "victim=\$WORKER_PID_$victim_name"
two_ranks() { [ "$(rank_cmdlines "/job-$JOB/attempt-1/rank-0 --json" | wc -l)" -eq 2 ]; }
check "attempt 1 runs 2 mge-train ranks" wait_until 10 two_ranks
kill -9 "$victim"
t0=$(date +%s.%N)
at=$(job_step "$JOB")
ok "worker $victim_name (rank 1) killed with SIGKILL at step $at"
if wait_until 10 eval "! ranks_alive '/job-$JOB/attempt-1/rank-0 --json'"; then
    t1=$(date +%s.%N)
    ok "every rank of attempt 1 is gone $(echo "$t1 - $t0" | bc -l | cut -c1-4) s after the kill (<= 10 s)"
else
    fail "ranks of attempt 1 still alive 10 s after the kill"
    rank_cmdlines "/job-$JOB/attempt-1/rank-0 --json" | while read -r p cmd; do echo "     left: pid $p: $cmd"; done
fi
check "the job is requeued as attempt 2" wait_until 20 sh -c "curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$JOB' | jq -e '.attempt == 2' >/dev/null"
echo "     requeued $(echo "$(date +%s.%N) - $t0" | bc -l | cut -c1-4) s after the kill (worker timeout $WORKER_TIMEOUT s)"
curl -s -N --max-time 3 -H "Authorization: Bearer $ADMIN" "$URL/api/v1/jobs/$JOB/events" | grep '^data: {"state"' >"$T/states"
check "attempt 1 failed with reason 'worker lost'" grep -q '"state":"failed","attempt":1,"reason":"worker lost' "$T/states"
check "the job succeeds" wait_until 120 state_is "$JOB" succeeded
api GET "/api/v1/jobs/$JOB" >"$T/long2.json"
check "attempt 2 ran on the two surviving workers" jq -e --arg v "$victim_name" '
    .attempt == 2 and .incarnation == 2 and (.placement | length) == 2
    and all(.placement[]; .worker != $v)' "$T/long2.json"
ck=$(jq -r '.result.steps - .result.steps_run' "$T/long2.json")
check "attempt 2 resumed from a checkpoint (step $ck) and ran only the steps after it" \
    jq -e --argjson n "$STEPS" '.result.steps == $n and .result.steps_run < $n and .result.steps_run > 0 and (($n - .result.steps_run) % 50 == 0)' "$T/long2.json"
check "loss steps 1..$STEPS are all stored once" loss_steps_exact "$JOB" "$STEPS"
finish
