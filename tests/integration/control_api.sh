#!/bin/sh
# control_api.sh: the control plane end to end on loopback: auth, spec errors, the happy path
# through mgectl, cancel while running, data roots, logs, events and /metrics.
. "$(dirname "$0")/lib/control.sh"

start_coord
mkdir -p "$T/data/inside" "$T/outside"
echo x > "$T/data/inside/train.idx"
echo x > "$T/outside/train.idx"
start_worker w1 --data-root "$T/data"

cat > "$T/ok.yaml" <<'Y'
name: happy
data: {format: synthetic, train_size: 512, input_dim: 784, classes: 10}
model: {type: mlp, hidden: [32]}
train:
  steps: 50
  batch_size: 32
Y

# --- auth
TOKEN=none api GET /api/v1/jobs >/dev/null
check "401 with an unknown token" [ "$(status)" = 401 ]
curl -s -o /dev/null -w '%{http_code}' "$URL/api/v1/jobs" >"$T/status"
check "401 without a token" [ "$(status)" = 401 ]
TOKEN=$RO api POST /api/v1/jobs -H 'Content-Type: application/yaml' --data-binary "@$T/ok.yaml" >/dev/null
check "403 with a read-only token on POST" [ "$(status)" = 403 ]
TOKEN=$RO api GET /api/v1/jobs >/dev/null
check "200 with a read-only token on GET" [ "$(status)" = 200 ]
curl -s -o /dev/null -w '%{http_code}' "$URL/healthz" >"$T/status"
check "/healthz needs no token" [ "$(status)" = 200 ]

# --- bad requests
printf 'name: bad\ntrain:\n  steps: 10\n  stpes: 3\n' > "$T/bad.yaml"
api POST /api/v1/jobs -H 'Content-Type: application/yaml' --data-binary "@$T/bad.yaml" >"$T/p.json"
check "422 for a bad spec" [ "$(status)" = 422 ]
check "the problem names the key and its line" \
    jq -e '.key == "train.stpes" and .line == 4 and (.detail | length > 0) and .title and .type' "$T/p.json"
"$BIN/mgectl" submit "$T/bad.yaml" >/dev/null 2>"$T/err"; rc=$?
check "mgectl submit of a bad spec exits 2 and names the line" \
    sh -c "[ $rc = 2 ] && grep -q 'bad.yaml:4' '$T/err'"
api POST /api/v1/jobs -H 'Content-Type: text/plain' --data-binary "@$T/ok.yaml" >/dev/null
check "415 for an unknown content type" [ "$(status)" = 415 ]
head -c 1100000 /dev/zero | tr '\0' 'a' > "$T/big"
api POST /api/v1/jobs -H 'Content-Type: application/yaml' --data-binary "@$T/big" >/dev/null
check "413 for a body over 1 MiB" [ "$(status)" = 413 ]
api GET /api/v1/jobs/999999 >/dev/null
check "404 for an unknown job" [ "$(status)" = 404 ]
api POST /api/v1/jobs -H 'Content-Type: application/json' --data-binary '{"name": "j", "train": {"steps": 5}' >/dev/null
check "400 for malformed JSON" [ "$(status)" = 400 ]

# --- happy path: mgectl submit -f follows the job to the end
"$BIN/mgectl" submit "$T/ok.yaml" -f >"$T/follow.out" 2>"$T/follow.err"; rc=$?
check "mgectl submit -f exits 0 for a job that succeeds" [ "$rc" = 0 ]
JOB=$(sed -n 's/^job \([0-9]*\) submitted.*/\1/p' "$T/follow.out")
check "plain progress lines when piped" grep -q '^step 50/50 loss' "$T/follow.out"
check "the job went queued -> running -> succeeded" \
    sh -c "api() { :; }; grep -q 'queued' '$T/follow.err' && grep -q 'running' '$T/follow.err' && grep -q 'succeeded' '$T/follow.err'"
check "job state is succeeded" state_is "$JOB" succeeded
check "50 loss metrics stored, steps 1..50 once each, decreasing" loss_steps_exact "$JOB" 50
api GET "/api/v1/jobs/$JOB" >"$T/job.json"
check "job shows placement, progress, latest metrics and the result" jq -e '
    .placement[0].worker == "w1" and .progress.step == 50 and .progress.total_steps == 50
    and (.latest_metrics.loss.value < 1) and .result.steps == 50 and .pending_reason == null
    and .started_at and .finished_at' "$T/job.json"
api GET "/api/v1/jobs/$JOB/logs?rank=0&tail=10" >"$T/logs.json"
check "logs carry the rank's stderr" jq -e '.lines | map(.text) | any(test("fake-train: rank 0/1"))' "$T/logs.json"
api GET "/api/v1/jobs/$JOB/checkpoints" >"$T/ck.json"
check "checkpoints are indexed" jq -e '.checkpoints | length >= 5 and .[0].step == 50' "$T/ck.json"
"$BIN/mgectl" checkpoint download "$JOB" -o "$T/dl.mgeckpt" >/dev/null
check "mgectl checkpoint download fetches the latest one" grep -q '^step 50' "$T/dl.mgeckpt"
"$BIN/mgectl" list >"$T/list.out"
check "mgectl list shows the job" grep -q "^$JOB *happy *succeeded" "$T/list.out"
"$BIN/mgectl" get "$JOB" -o yaml >"$T/get.yaml"
check "mgectl get -o yaml" grep -q '^state: succeeded' "$T/get.yaml"
"$BIN/mgectl" metrics "$JOB" --name loss >"$T/metrics.out"
check "mgectl metrics lists 50 loss values" [ "$(grep -c ' loss ' "$T/metrics.out")" = 50 ]
"$BIN/mgectl" workers >"$T/workers.out"
check "mgectl workers shows w1 ready" grep -q '^w1 .* ready' "$T/workers.out"

# --- events: SSE with exact resume
curl -s -N --max-time 10 -H "Authorization: Bearer $RO" "$URL/api/v1/jobs/$JOB/events" >"$T/sse.all"
n_all=$(grep -c '^id: ' "$T/sse.all")
mid=$(grep '^id: ' "$T/sse.all" | sed -n '10s/id: //p')
curl -s -N --max-time 10 -H "Authorization: Bearer $RO" -H "Last-Event-ID: $mid" \
    "$URL/api/v1/jobs/$JOB/events" >"$T/sse.rest"
check "the event stream of a finished job ends, with state, metric and log events" \
    sh -c "grep -q '^event: state' '$T/sse.all' && grep -q '^event: metric' '$T/sse.all' && grep -q '^event: log' '$T/sse.all'"
check "Last-Event-ID resumes exactly after that event" \
    [ "$(grep -c '^id: ' "$T/sse.rest")" = $((n_all - 10)) ]

# --- cancel while running
sed 's/steps: 50/steps: 100000/; s/name: happy/name: long/' "$T/ok.yaml" > "$T/long.yaml"
JOB2=$(submit_yaml "$T/long.yaml")
check "a long job starts running" wait_until 20 state_is "$JOB2" running
wait_until 10 sh -c "[ \$(curl -s -H 'Authorization: Bearer $RO' '$URL/api/v1/jobs/$JOB2' | jq '.progress.step') -gt 3 ]"
"$BIN/mgectl" cancel "$JOB2" >/dev/null
check "cancel answers and the job is cancelled" state_is "$JOB2" cancelled
check "the worker frees the slot after killing the rank" \
    wait_until 15 sh -c "curl -s -H 'Authorization: Bearer $RO' '$URL/api/v1/workers' | jq -e '.workers[0].running_ranks == 0' >/dev/null"
api POST "/api/v1/jobs/$JOB2/cancel" >/dev/null
check "cancelling a finished job is 409" [ "$(status)" = 409 ]

# --- data paths must lie under the worker's data roots
cat > "$T/outside.yaml" <<Y
name: outside
data: {format: idx, train_images: $T/outside/train.idx, train_labels: $T/outside/train.idx}
train: {steps: 5, batch_size: 32}
Y
JOB3=$(submit_yaml "$T/outside.yaml")
check "a spec with a data path outside the roots fails" wait_until 20 state_is "$JOB3" failed
check "... with a clear reason" sh -c "curl -s -H 'Authorization: Bearer $RO' '$URL/api/v1/jobs/$JOB3' | jq -e '.failure_reason | test(\"outside the worker.s data roots\")' >/dev/null"
sed "s#$T/outside#$T/data/inside#g; s/name: outside/name: inside/" "$T/outside.yaml" > "$T/inside.yaml"
JOB4=$(submit_yaml "$T/inside.yaml")
check "the same spec with paths inside the roots runs" wait_until 20 state_is "$JOB4" succeeded

# --- pending reason, priority order, /metrics
cat > "$T/huge.yaml" <<'Y'
name: huge
resources: {workers: 2, cpus: 4}
train: {steps: 5}
Y
JOB5=$(submit_yaml "$T/huge.yaml")
check "a job that cannot be placed says why" sh -c "curl -s -H 'Authorization: Bearer $RO' '$URL/api/v1/jobs/$JOB5' | jq -e '.state == \"queued\" and (.pending_reason | test(\"needs 2 workers with 4 CPUs\"))' >/dev/null"
api GET "/api/v1/jobs?state=queued" >"$T/q.json"
check "GET /jobs filters by state" jq -e --argjson id "$JOB5" '[.jobs[].id] == [$id]' "$T/q.json"
api GET "/api/v1/jobs?limit=2" >"$T/p1.json"
cur=$(jq -r .next_cursor "$T/p1.json")
api GET "/api/v1/jobs?limit=2&cursor=$cur" >"$T/p2.json"
check "GET /jobs pages newest first with a cursor" sh -c "jq -e '.jobs[0].id > .jobs[1].id' '$T/p1.json' >/dev/null && [ \$(jq '.jobs[0].id' '$T/p2.json') -lt \$(jq '.jobs[1].id' '$T/p1.json') ]"
TOKEN=$RO api GET /metrics >"$T/prom.txt"
check "/metrics is Prometheus text with jobs, workers, queue and latencies" sh -c "
    grep -q '^mge_jobs{state=\"succeeded\"} [1-9]' '$T/prom.txt' && grep -q '^mge_workers{state=\"ready\"} 1' '$T/prom.txt' &&
    grep -q '^mge_queue_length 1' '$T/prom.txt' && grep -q '^mge_http_request_duration_seconds_bucket' '$T/prom.txt'"
api POST /api/v1/workers/w1/drain >"$T/drain.json"
check "drain a worker" jq -e '.state == "drained" or .state == "draining"' "$T/drain.json"
"$BIN/mgectl" cancel "$JOB5" >/dev/null
check "cancel works on a queued job" state_is "$JOB5" cancelled

finish
