#!/bin/sh
# control_drain.sh: a drain lasts until an operator undrains the worker. A drained worker takes
# no new ranks; it stays drained when it is lost and comes back under the same name and when
# the coordinator restarts; a read-only token cannot undrain it; `mgectl undrain` (POST
# /workers/{id}/undrain) puts it back to work, and the job that waited for it starts at once.
. "$(dirname "$0")/lib/control.sh"

WORKER_TIMEOUT=2
start_coord
start_worker w1

wstate() { api GET /api/v1/workers | jq -r --arg n "$1" '.workers[] | select(.name == $n) | "\(.state) \(.drain)"'; }
wstate_is() { [ "$(wstate "$1")" = "$2" ]; }

out=$("$BIN/mgectl" drain w1 2>&1)
check "mgectl drain w1: '$out'" wstate_is w1 "drained true"
cat >"$T/job.yaml" <<Y
name: waits-for-undrain
$QUICK_MODEL
$QUICK_DATA
train: {steps: 20, batch_size: 32, $QUICK_OPT}
Y
JOB=$(submit_yaml "$T/job.yaml")
sleep 1.5
api GET "/api/v1/jobs/$JOB" >"$T/q.json"
check "a job submitted meanwhile stays queued: '$(jq -r .pending_reason "$T/q.json")'" \
    jq -e '.state == "queued" and (.pending_reason | test("draining"))' "$T/q.json"

# the worker dies and comes back under its name: still drained
kill -9 "$WORKER_PID_w1"
check "w1 killed: it is lost, and still marked drained" wait_until 15 wstate_is w1 "lost true"
WAIT_STATE=drained start_worker w1
unset WAIT_STATE # (a prefix assignment to a function call may outlive the call)
check "w1 back: drained, not ready" wstate_is w1 "drained true"
check "... and the job is still queued" state_is "$JOB" queued

# the coordinator restarts: the drain is stored
kill "$COORD_PID"
wait "$COORD_PID" 2>/dev/null
start_coord
check "after a coordinator restart w1 is still drained" wait_until 15 wstate_is w1 "drained true"
check "... and the job is still queued" state_is "$JOB" queued

# who may undrain
TOKEN=$RO api POST /api/v1/workers/w1/undrain >"$T/ro.json"
check "a read-only token cannot undrain (403)" sh -c "[ \"\$(cat '$T/status')\" = 403 ]"
api POST /api/v1/workers/nope/undrain >"$T/nope.json"
check "undrain of an unknown worker: 404 '$(jq -r .title "$T/nope.json")'" \
    sh -c "[ \"\$(cat '$T/status')\" = 404 ]"
out=$("$BIN/mgectl" undrain nope 2>&1)
rc=$?
check "mgectl undrain nope: exit $rc, '$out'" sh -c "[ $rc -ne 0 ] && echo '$out' | grep -qi 'no such worker'"
check "w1 is still drained" wstate_is w1 "drained true"

out=$("$BIN/mgectl" undrain w1 2>&1)
rc=$?
check "mgectl undrain w1: exit $rc, '$out'" sh -c "[ $rc -eq 0 ] && echo '$out' | grep -q 'w1 undrained'"
check "w1 is ready and no longer drained" wait_until 5 wstate_is w1 "ready false"
check "the queued job starts on it and succeeds" wait_until 60 state_is "$JOB" succeeded
api POST /api/v1/workers/w1/undrain >"$T/again.json"
check "undrain of a worker that is not drained: 200, unchanged" \
    sh -c "[ \"\$(cat '$T/status')\" = 200 ] && jq -e '.state == \"ready\" and .drain == false' '$T/again.json' >/dev/null"
check "the coordinator logged the undrain" grep -q "worker 'w1' undrained" "$T/coordinator.log"
finish
