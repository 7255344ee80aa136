#!/bin/sh
# control_api.sh: the control plane end to end on loopback: auth, spec errors, the happy path
# through mgectl, cancel while running, data roots, logs, events and /metrics.
. "$(dirname "$0")/lib/control.sh"

start_coord
# real idx files inside the data root (copied: a link out of the root would be refused);
# FIFOs outside it, so a rank that opened one would hang instead of failing
FM=/usr/share/datasets/fashion-mnist
mkdir -p "$T/data/inside" "$T/outside"
cp "$FM/t10k-images-idx3-ubyte.gz" "$FM/t10k-labels-idx1-ubyte.gz" "$T/data/inside/" ||
    fail "copy the t10k files of $FM (deploy/install-deps.sh installs dataset-fashion-mnist)"
mkfifo "$T/outside/images.gz" "$T/outside/labels.gz"
ln -s "$T/outside/images.gz" "$T/data/link-images.gz"
start_worker w1 --data-root "$T/data"

cat > "$T/ok.yaml" <<Y
name: happy
$QUICK_MODEL
$QUICK_DATA
train:
  steps: 50
  batch_size: 32
  $QUICK_OPT
  checkpoint_every: 10
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
# a full spec but for one misspelt key
printf 'name: bad\ntrain:\n  steps: 10\n  stpes: 3\n  batch_size: 32\n  %s\n%s\n%s\n' \
    "$QUICK_OPT" "$QUICK_MODEL" "$QUICK_DATA" > "$T/bad.yaml"
api POST /api/v1/jobs -H 'Content-Type: application/yaml' --data-binary "@$T/bad.yaml" >"$T/p.json"
check "422 for a bad spec" [ "$(status)" = 422 ]
check "the problem names the key and its line" \
    jq -e '.key == "train.stpes" and .line == 4 and (.detail | length > 0) and .title and .type' "$T/p.json"
"$BIN/mgectl" submit "$T/bad.yaml" >/dev/null 2>"$T/err"; rc=$?
check "mgectl submit of a bad spec exits 2 and names the line" \
    sh -c "[ $rc = 2 ] && grep -q 'bad.yaml:4' '$T/err'"
# a graph model whose residual add joins [32,8] and [32,16]: the coordinator infers shapes too
cat > "$T/badgraph.yaml" <<Y
name: badgraph
$QUICK_DATA
train: {steps: 5, batch_size: 32, $QUICK_OPT}
model:
  type: graph
  nodes:
    - {name: x, op: input, shape: [784]}
    - {name: fc1, op: linear, inputs: x, out_features: 16}
    - {name: fc2, op: linear, inputs: fc1, out_features: 8}
    - {name: res, op: add, inputs: [fc2, fc1]}
    - {name: head, op: linear, inputs: res, out_features: 10}
    - {name: loss, op: cross_entropy, inputs: head}
Y
api POST /api/v1/jobs -H 'Content-Type: application/yaml' --data-binary "@$T/badgraph.yaml" >"$T/p.json"
check "422 for a graph whose shapes do not match" [ "$(status)" = 422 ]
check "the problem names the node, the key, the line and both shapes" \
    jq -e '.key == "model.nodes[3].inputs" and .line == 10 and (.detail | contains("node `res`: input `fc2` has shape [32,8], `fc1` has [32,16]"))' "$T/p.json"
sed 's/inputs: fc1, out_features: 8/inputs: res, out_features: 8/' "$T/badgraph.yaml" > "$T/cycle.yaml"
api POST /api/v1/jobs -H 'Content-Type: application/yaml' --data-binary "@$T/cycle.yaml" >"$T/p.json"
check "422 for a graph with a cycle" [ "$(status)" = 422 ]
check "... naming the nodes of the cycle" grep -qF 'the graph has a cycle: `fc2` reads `res` reads `fc2`' "$T/p.json"
api GET /healthz >/dev/null
check "the coordinator is still up" [ "$(status)" = 200 ]
api POST /api/v1/jobs -H 'Content-Type: text/plain' --data-binary "@$T/ok.yaml" >/dev/null
check "415 for an unknown content type" [ "$(status)" = 415 ]
head -c 1100000 /dev/zero | tr '\0' 'a' > "$T/big"
api POST /api/v1/jobs -H 'Content-Type: application/yaml' --data-binary "@$T/big" >/dev/null
check "413 for a body over 1 MiB" [ "$(status)" = 413 ]
api GET /api/v1/jobs/999999 >/dev/null
check "404 for an unknown job" [ "$(status)" = 404 ]
api POST /api/v1/jobs -H 'Content-Type: application/json' --data-binary '{"name": "j", "train": {"steps": 5}}x' >/dev/null
check "400 for malformed JSON" [ "$(status)" = 400 ]

# --- happy path: mgectl submit -f follows the job to the end
"$BIN/mgectl" submit "$T/ok.yaml" -f --every 0 >"$T/follow.out" 2>"$T/follow.err"; rc=$?
check "mgectl submit -f exits 0 for a job that succeeds" [ "$rc" = 0 ]
JOB=$(sed -n 's/^job \([0-9]*\) submitted.*/\1/p' "$T/follow.out")
check "plain progress lines when piped, one per step" \
    sh -c "grep -q '^step 50/50 loss' '$T/follow.out' && [ \$(grep -c '^step ' '$T/follow.out') = 50 ]"
check "... and the evaluations" grep -q '^eval step 50 epoch 3: test accuracy' "$T/follow.out"
check "the job went queued -> running -> succeeded" \
    sh -c "api() { :; }; grep -q 'queued' '$T/follow.err' && grep -q 'running' '$T/follow.err' && grep -q 'succeeded' '$T/follow.err'"
check "job state is succeeded" state_is "$JOB" succeeded
check "50 loss metrics stored, steps 1..50 once each, loss falling" loss_steps_exact "$JOB" 50
api GET "/api/v1/jobs/$JOB" >"$T/job.json"
check "job shows placement, progress, latest metrics and the result" jq -e '
    .placement[0].worker == "w1" and .progress.step == 50 and .progress.total_steps == 50
    and (.latest_metrics.loss.value < 1) and .result.steps == 50 and .pending_reason == null
    and .started_at and .finished_at' "$T/job.json"
api GET "/api/v1/jobs/$JOB/logs?rank=0&tail=10" >"$T/logs.json"
check "logs say how the worker started the rank and how it ended" jq -e '.lines | map(.text)
    | any(test("^mge-worker: rank 0/1 attempt 1: started .*/mge-train as pid [0-9]+, 1 threads$"))
      and .[-1] == "mge-worker: rank 0: exited with code 0"' "$T/logs.json"
check "the evaluation is stored as metrics" jq -e '.latest_metrics.test_accuracy.value > 0.5 and .latest_metrics.test_loss.step == 50' "$T/job.json"
api GET "/api/v1/jobs/$JOB/checkpoints" >"$T/ck.json"
check "checkpoints are indexed, by their final names" jq -e '[.checkpoints[].step] == [50, 40, 30, 20, 10]
    and ([.checkpoints[].name] == ["ckpt-000050.mgeckpt", "ckpt-000040.mgeckpt", "ckpt-000030.mgeckpt",
                                   "ckpt-000020.mgeckpt", "ckpt-000010.mgeckpt"])' "$T/ck.json"
"$BIN/mgectl" checkpoint download "$JOB" -o "$T/dl.mgeckpt" >/dev/null
check "mgectl checkpoint download fetches the latest one" \
    cmp "$T/dl.mgeckpt" "$T/w-w1/job-$JOB/attempt-1/rank-0/ckpt-000050.mgeckpt"
check "... and mge-train can resume from it" sh -c \
    "'$BIN/mge-train' '$T/ok.yaml' --set train.steps=55 --resume '$T/dl.mgeckpt' --out '$T/resumed' --json --threads 1 2>&1 |
     head -n 1 | grep -q '^{\"step\":51,'"
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

# --- cancel while running (a job of many minutes)
printf 'name: long\n%s\n%s\ntrain: {steps: 100000, batch_size: 128, %s}\n' \
    "$LONG_MODEL" "$LONG_DATA" "$LONG_OPT" > "$T/long.yaml"
JOB2=$(submit_yaml "$T/long.yaml")
check "a long job starts running" wait_until 20 state_is "$JOB2" running
check "... and trains" wait_until 20 step_at_least "$JOB2" 4
check "the rank runs with the job's one CPU (--threads 1, OMP_NUM_THREADS=1)" rank_threads_are "$JOB2" 1
"$BIN/mgectl" cancel "$JOB2" >/dev/null
check "cancel answers and the job is cancelled" state_is "$JOB2" cancelled
check "the worker frees the slot after killing the rank" \
    wait_until 15 sh -c "curl -s -H 'Authorization: Bearer $RO' '$URL/api/v1/workers' | jq -e '.workers[0].running_ranks == 0' >/dev/null"
api POST "/api/v1/jobs/$JOB2/cancel" >/dev/null
check "cancelling a finished job is 409" [ "$(status)" = 409 ]

# --- data paths must lie under the worker's data roots
idx_spec() { # NAME IMAGES LABELS
    printf 'name: %s\n%s\ndata: {format: idx, train_images: %s, train_labels: %s}\n' \
        "$1" "$QUICK_MODEL" "$2" "$3"
    printf 'train: {steps: 5, batch_size: 32, %s}\n' "$QUICK_OPT"
}
reason_is_roots() {
    api GET "/api/v1/jobs/$1" | jq -e '.failure_reason | test("data path .* is outside the worker.s data roots")'
}
failed_outside_roots() { state_is "$1" failed && reason_is_roots "$1"; }
idx_spec outside "$T/outside/images.gz" "$T/outside/labels.gz" > "$T/outside.yaml"
JOB3=$(submit_yaml "$T/outside.yaml")
check "a spec with a data path outside the roots fails, with a clear reason" \
    wait_until 20 failed_outside_roots "$JOB3"
check "... and no rank was started (the FIFO was never opened)" [ ! -e "$T/w-w1/job-$JOB3" ]
idx_spec link "$T/data/link-images.gz" "$T/data/inside/t10k-labels-idx1-ubyte.gz" > "$T/link.yaml"
JOB3L=$(submit_yaml "$T/link.yaml")
check "a link inside the roots that points outside them is refused too" \
    wait_until 20 failed_outside_roots "$JOB3L"
idx_spec inside "$T/data/inside/t10k-images-idx3-ubyte.gz" "$T/data/inside/t10k-labels-idx1-ubyte.gz" \
    > "$T/inside.yaml"
JOB4=$(submit_yaml "$T/inside.yaml")
check "the same spec with paths inside the roots runs" wait_until 30 state_is "$JOB4" succeeded
check "... and trains on the real idx files for 5 steps" \
    sh -c "curl -s -H 'Authorization: Bearer $RO' '$URL/api/v1/jobs/$JOB4' | jq -e '.result.steps == 5 and .progress.step == 5' >/dev/null"

# --- a rank that fails: mge-train's stderr reaches the job's log and the job fails
printf 'not an idx file\n' > "$T/data/garbage.gz"
idx_spec garbage "$T/data/garbage.gz" "$T/data/inside/t10k-labels-idx1-ubyte.gz" > "$T/garbage.yaml"
JOB6=$(submit_yaml "$T/garbage.yaml")
check "a job whose data mge-train cannot read fails" wait_until 20 state_is "$JOB6" failed
api GET "/api/v1/jobs/$JOB6" >"$T/job6.json"
check "... with the exit code as its reason" jq -e '.failure_reason | test("code [1-9]")' "$T/job6.json"
api GET "/api/v1/jobs/$JOB6/logs" >"$T/logs6.json"
check "... and mge-train's stderr in its log" \
    jq -e '.lines | any(.stream == "stderr" and (.text | test("^mge-train: .*garbage.gz")))' "$T/logs6.json"

# --- a graph model through the whole path: validated, planned, placed, trained
sed -e 's/name: badgraph/name: goodgraph/' -e 's/inputs: x, out_features: 16/inputs: x, out_features: 8/' \
    "$T/badgraph.yaml" > "$T/goodgraph.yaml"
"$BIN/mgectl" submit "$T/goodgraph.yaml" -f --every 0 >"$T/graph.out" 2>"$T/graph.err"; rc=$?
check "a graph job (a residual add) runs through mgectl to success" \
    sh -c "[ $rc = 0 ] && grep -q '^step 5/5 loss' '$T/graph.out'"

# --- pending reason, priority order, /metrics
cat > "$T/huge.yaml" <<Y
name: huge
$QUICK_MODEL
$QUICK_DATA
resources: {workers: 2, cpus: 4}
train: {steps: 5, batch_size: 32, $QUICK_OPT}
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
