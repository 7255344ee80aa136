#!/bin/sh
# control_ckpt_replica.sh: checkpoints survive losing rank 0's node, with no shared file system.
# Three workers, each with its own work directory, run a {min: 2, max: 3} job. Rank 0's worker
# uploads each checkpoint to the coordinator's store, which verifies it before it counts as
# committed. Once the newest checkpoint is committed, rank 0's worker and its ranks are killed
# with SIGKILL and its work directory is deleted (the node is gone with its disk): the job goes
# on as incarnation 2 on the other two workers, whose rank 0 fetches the coordinator's copy
# (its log says so) and resumes from exactly that step, and the job succeeds. The copy is
# served by GET /jobs/{id}/checkpoints/{name}, at most 2 copies are kept. Then forged uploads:
# from a worker that holds no rank of the job, for a past attempt, a bad name, a size over the
# limit and corrupt bytes: each is refused and nothing of it is stored.
# Exit 77 (skip) without Open MPI's mpirun.
. "$(dirname "$0")/lib/control.sh"
MPIRUN=$(command -v mpirun.openmpi || command -v mpirun)
[ -n "$MPIRUN" ] || { echo "SKIP: mpirun (Open MPI) is not installed"; exit 77; }
[ -x "$BIN/mge-launch" ] || { echo "SKIP: $BIN/mge-launch not built"; exit 77; }
FORGE=$BUILD/tests/mge-forge
[ -x "$FORGE" ] || { echo "SKIP: $FORGE not built"; exit 77; }

# Open MPI's session directories of this test's daemons apart from any other test's on this
# host (two mpiruns of concurrent tests once met in /tmp/ompi.*: "File exists", exit 213)
export TMPDIR="$T/tmp"
mkdir -p "$TMPDIR"
WORKER_TIMEOUT=3
start_coord
start_worker wa
start_worker wb
start_worker wc

# 784-1024-1024-10 at batch 128: a checkpoint is 14.2 MiB (parameters and momentum), 15 chunks
STEPS=${REPLICA_STEPS:-600}
CKPT=100
cat >"$T/job.yaml" <<Y
name: replica
$LONG_MODEL
$LONG_DATA
resources: {workers: {min: 2, max: 3}, cpus: 1}
train: {steps: $STEPS, batch_size: 128, $LONG_OPT, checkpoint_every: $CKPT}
Y
JOB=$(submit_yaml "$T/job.yaml")
check "the {min: 2, max: 3} job starts with 3 workers" wait_until 30 sh -c "
    curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$JOB' |
    jq -e '.state == \"running\" and (.placement | length) == 3' >/dev/null"

# newest_committed: the step of the newest checkpoint when it is committed (else fail)
newest_committed() {
    api GET "/api/v1/jobs/$JOB/checkpoints" | jq -e '
        [.checkpoints[] | select(.name != "latest")] | max_by(.step) | select(.committed) | .step'
}
check "a checkpoint is committed to the coordinator's store" wait_until 120 newest_committed
ck=$(newest_committed)
# a slow machine may have requeued the job before (no progress): count from the attempt now
A=$(api GET "/api/v1/jobs/$JOB" | jq -r .attempt)
B=$((A + 1))
victim=$(api GET "/api/v1/jobs/$JOB" | jq -r '.placement[] | select(.rank == 0) | .worker')
eval "vpid=\$WORKER_PID_$victim"
kill -9 "$vpid"
for p in $(rank_cmdlines "--out $T/w-$victim/" | cut -d' ' -f1); do kill -9 "$p" 2>/dev/null; done
# mpirun and orted are not mge-train: the victim's whole job directory goes with its disk
rm -rf "$T/w-$victim"
ok "rank 0's worker $victim killed with its ranks at step $(job_step "$JOB") and its work dir deleted (committed checkpoint: step $ck)"
name=$(printf 'ckpt-%06d.mgeckpt' "$ck")
check "the coordinator holds the copy $name" test -f "$T/state/checkpoints/job-$JOB/attempt-$A/rank-0/$name"

check "the job goes on as incarnation $B on the two others" wait_until 60 sh -c "
    curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$JOB' |
    jq -e --arg v '$victim' --argjson b $B '.attempt == \$b and (.placement | length) == 2
        and all(.placement[]; .worker != \$v)' >/dev/null"
check "the job succeeds" wait_until 180 state_is "$JOB" succeeded
api GET "/api/v1/jobs/$JOB" >"$T/job.json"
api GET "/api/v1/jobs/$JOB/logs?tail=2000" >"$T/logs.json"
check "incarnation $B started at the committed step $ck" \
    jq -e --argjson c "$ck" --argjson b $B '.incarnations[$b - 1].start_step == $c' "$T/job.json"
check "its rank 0 fetched $name from the coordinator's store (worker log line)" \
    jq -e --arg c "$name" --argjson b $B '.lines | any(.attempt == $b and (.text | test("checkpoint " + $c + " fetched from the coordinator.s store")))' "$T/logs.json"
check "... and was started with --resume of that copy in its own work dir" \
    jq -e --arg c "$name" --argjson b $B '.lines | any(.attempt == $b and (.text | test("started .*, resuming from .*/w-w[abc]/job-[0-9]+/attempt-\($b)/rank-0/" + $c + "$")))' "$T/logs.json"
# (a loaded machine may requeue it once more, "no progress": then from a later checkpoint)
check "... and the last incarnation trained only the steps after its start" \
    jq -e --argjson n "$STEPS" '.result.steps == $n and .result.steps_run == $n - .incarnations[-1].start_step' "$T/job.json"
check "loss steps 1..$STEPS are all stored once" loss_steps_exact "$JOB" "$STEPS"
api GET "/api/v1/jobs/$JOB/checkpoints/$name" >"$T/served"
check "GET /jobs/$JOB/checkpoints/$name serves a checkpoint" sh -c "[ \"\$(cat '$T/status')\" = 200 ] && head -c 8 '$T/served' | grep -q MGECKPT1"
# (an upload still arriving when the job ends puts a third copy in place a moment before the
# oldest is pruned: the count settles)
copies() { find "$T/state/checkpoints/job-$JOB" -name 'ckpt-*.mgeckpt' | wc -l; }
copies_kept() { n=$(copies); [ "$n" -le 2 ] && [ "$n" -ge 1 ]; }
wait_until 10 copies_kept
check "the coordinator keeps at most 2 copies ($(copies))" copies_kept

# --- forged uploads: refused, nothing stored ---
# The forger registers under the name of the job's rank 0 worker, which starts a new session for
# that name; a live worker of that name would find its own key dead at its next heartbeat and
# register again, killing the forger's session in the middle of a 15-chunk upload ("bad frame
# MAC"). The job is over: stop the live workers first, so each refusal comes from the check
# under test.
for w in wa wb wc; do
    eval "wpid=\$WORKER_PID_$w"
    [ "$w" = "$victim" ] || kill "$wpid" 2>/dev/null
done
for w in wa wb wc; do
    eval "wpid=\$WORKER_PID_$w"
    [ "$w" = "$victim" ] || wait_until 10 sh -c "! kill -0 $wpid 2>/dev/null" ||
        fail "worker $w did not stop on SIGTERM"
done
last=$(jq -r '.placement[] | select(.rank == 0) | .worker' "$T/job.json")
F=$(jq -r .attempt "$T/job.json") # the job's last attempt: its rank 0 worker may upload
# a copy of a genuine checkpoint: the one served above, else one from the store, which may
# prune a file between find and cp (the final checkpoint's upload can still be under way when
# the job has succeeded), so try again until a copy is whole
if [ "$(cat "$T/status")" = 200 ] && head -c 8 "$T/served" | grep -q MGECKPT1; then
    cp "$T/served" "$T/good"
else
    i=0
    until cp "$(find "$T/state/checkpoints/job-$JOB" -name 'ckpt-*.mgeckpt' | head -n 1)" "$T/good" 2>/dev/null ||
        [ $i -ge 50 ]; do i=$((i + 1)); sleep 0.1; done
fi
good=$T/good
head -c 4096 /dev/urandom >"$T/garbage"
cp "$good" "$T/flipped"
printf 'X' | dd of="$T/flipped" bs=1 seek=1000 conv=notrunc 2>/dev/null
forged() { # DESCRIPTION REASON(regex) NAME JOB ATTEMPT CKPT_NAME FILE [SIZE]
    d=$1; why=$2; shift 2
    "$FORGE" upload "$WORKER_URL" join-secret "$@" >"$T/forge.out" 2>&1
    rc=$?
    sed 's/^/     /' "$T/forge.out"
    if [ $rc -eq 0 ] && grep -q "refused: .*$why" "$T/forge.out"; then ok "$d: refused ($why)"
    else fail "$d: exit $rc"; fi
}
forged "upload from a worker with no rank of the job" "does not run rank 0" \
    intruder "$JOB" "$F" ckpt-000777.mgeckpt "$good"
forged "upload for a past attempt by the job's rank 0 worker" "does not run rank 0" \
    "$last" "$JOB" "$A" ckpt-000778.mgeckpt "$good"
forged "upload with a bad name" "not a checkpoint file name" \
    "$last" "$JOB" "$F" ../../../etc/ckpt-1.mgeckpt "$good"
forged "upload declaring 5 GiB" "outside" "$last" "$JOB" "$F" ckpt-000779.mgeckpt "$good" 5368709120
forged "upload of random bytes" "does not verify" "$last" "$JOB" "$F" ckpt-000780.mgeckpt "$T/garbage"
forged "upload with one byte flipped" "does not verify" \
    "$last" "$JOB" "$F" ckpt-000781.mgeckpt "$T/flipped"
check "no forged checkpoint is stored or committed" sh -c "
    ! find '$T/state' -name 'ckpt-0007*' | grep -q . &&
    ! curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$JOB/checkpoints' |
      jq -e 'any(.checkpoints[]; .name | startswith(\"ckpt-0007\"))' >/dev/null"
check "nothing was written outside the store" test ! -e /etc/ckpt-1.mgeckpt
finish
