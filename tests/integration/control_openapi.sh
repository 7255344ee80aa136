#!/bin/sh
# control_openapi.sh: the running coordinator answers every route of docs/api/openapi.yaml
# with a documented status, content type and body shape (lib/openapi_check.py).
. "$(dirname "$0")/lib/control.sh"
python3 -c 'import yaml' 2>/dev/null || { echo "SKIP: python3 with PyYAML needed"; exit 77; }

start_coord
start_worker w1
MGE_FAKE_GPUS="1x NVIDIA H100 80GB HBM3:81559" start_worker g1 # a worker with GPUs: its gpus[] items
REC="$T/records.tsv"
: >"$REC"
n=0
# rec METHOD TEMPLATE PATH [curl args...]: one request, recorded for the checker
rec() {
    m=$1; tpl=$2; p=$3; shift 3
    n=$((n + 1))
    out=$(curl -s -o "$T/r$n" -w '%{http_code}\t%{content_type}' --max-time 10 -X "$m" \
          "$@" "$URL$p")
    printf '%s\t%s\t%s\t%s\n' "$m" "$tpl" "$(echo "$out" | cut -f1)" \
        "$(echo "$out" | cut -f2)	$T/r$n" >>"$REC"
}
A="Authorization: Bearer $ADMIN"
R="Authorization: Bearer $RO"
Y='Content-Type: application/yaml'
printf 'name: oa\n%s\n%s\ntrain: {steps: 20, batch_size: 32, %s, checkpoint_every: 10}\n' \
    "$QUICK_MODEL" "$QUICK_DATA" "$QUICK_OPT" >"$T/ok.yaml"
printf 'name: oa\n%s\n%s\ntrain: {steps: 20, batch_size: 32, %s, bogus: 1}\n' \
    "$QUICK_MODEL" "$QUICK_DATA" "$QUICK_OPT" >"$T/bad.yaml"
OK_JSON='{"name": "oa", "model": {"type": "mlp", "hidden": [32]},
  "data": {"format": "synthetic", "train_size": 512, "input_dim": 784, "classes": 10},
  "train": {"steps": 20, "batch_size": 32, "optimizer": {"type": "sgd", "lr": 0.05}}}'

rec GET /healthz /healthz
rec GET /metrics /metrics -H "$R"
rec GET /metrics /metrics
rec POST /api/v1/jobs /api/v1/jobs -H "$A" -H "$Y" --data-binary "@$T/ok.yaml"
JOB=$(jq -r .id "$T/r$n")
rec POST /api/v1/jobs /api/v1/jobs -H "$A" -H 'Content-Type: application/json' --data-binary "$OK_JSON"
JOB_J=$(jq -r .id "$T/r$n")
rec POST /api/v1/jobs /api/v1/jobs -H "$A" -H "$Y" --data-binary "@$T/bad.yaml"
rec POST /api/v1/jobs /api/v1/jobs -H "$A" -H 'Content-Type: text/plain' --data-binary x
rec POST /api/v1/jobs /api/v1/jobs -H "$A" -H 'Content-Type: application/json' --data-binary '{'
rec POST /api/v1/jobs /api/v1/jobs -H "$R" -H "$Y" --data-binary "@$T/ok.yaml"
rec POST /api/v1/jobs /api/v1/jobs -H "$Y" --data-binary "@$T/ok.yaml"
head -c 1100000 /dev/zero | tr '\0' a >"$T/big"
rec POST /api/v1/jobs /api/v1/jobs -H "$A" -H "$Y" --data-binary "@$T/big"
check "the YAML job trains to the end" wait_until 20 state_is "$JOB" succeeded
check "the JSON job trains to the end" wait_until 20 state_is "$JOB_J" succeeded
rec GET /api/v1/jobs "/api/v1/jobs?limit=1" -H "$R"
rec GET /api/v1/jobs "/api/v1/jobs?state=succeeded" -H "$R"
rec GET /api/v1/jobs "/api/v1/jobs?state=nope" -H "$R"
rec GET /api/v1/jobs /api/v1/jobs
rec GET '/api/v1/jobs/{id}' "/api/v1/jobs/$JOB" -H "$R"
rec GET '/api/v1/jobs/{id}' /api/v1/jobs/424242 -H "$R"
rec GET '/api/v1/jobs/{id}' "/api/v1/jobs/$JOB"
rec GET '/api/v1/jobs/{id}/metrics' "/api/v1/jobs/$JOB/metrics?name=loss&since_step=5" -H "$R"
rec GET '/api/v1/jobs/{id}/metrics' "/api/v1/jobs/$JOB/metrics?since_step=x" -H "$R"
rec GET '/api/v1/jobs/{id}/metrics' /api/v1/jobs/424242/metrics -H "$R"
rec GET '/api/v1/jobs/{id}/metrics' "/api/v1/jobs/$JOB/metrics"
rec GET '/api/v1/jobs/{id}/logs' "/api/v1/jobs/$JOB/logs?rank=0&tail=5" -H "$R"
rec GET '/api/v1/jobs/{id}/logs' "/api/v1/jobs/$JOB/logs?tail=0" -H "$R"
rec GET '/api/v1/jobs/{id}/logs' /api/v1/jobs/424242/logs -H "$R"
rec GET '/api/v1/jobs/{id}/logs' "/api/v1/jobs/$JOB/logs"
rec GET '/api/v1/jobs/{id}/events' "/api/v1/jobs/$JOB/events" -H "$R"
rec GET '/api/v1/jobs/{id}/events' "/api/v1/jobs/$JOB/events" -H "$R" -H 'Last-Event-ID: x'
rec GET '/api/v1/jobs/{id}/events' /api/v1/jobs/424242/events -H "$R"
rec GET '/api/v1/jobs/{id}/events' "/api/v1/jobs/$JOB/events"
rec GET '/api/v1/jobs/{id}/checkpoints' "/api/v1/jobs/$JOB/checkpoints" -H "$R"
rec GET '/api/v1/jobs/{id}/checkpoints' /api/v1/jobs/424242/checkpoints -H "$R"
rec GET '/api/v1/jobs/{id}/checkpoints' "/api/v1/jobs/$JOB/checkpoints"
rec GET '/api/v1/jobs/{id}/checkpoints/{name}' "/api/v1/jobs/$JOB/checkpoints/latest" -H "$R"
rec GET '/api/v1/jobs/{id}/checkpoints/{name}' "/api/v1/jobs/$JOB/checkpoints/nope" -H "$R"
rec GET '/api/v1/jobs/{id}/checkpoints/{name}' "/api/v1/jobs/$JOB/checkpoints/latest"
rec POST '/api/v1/jobs/{id}/cancel' "/api/v1/jobs/$JOB/cancel" -H "$A"
rec POST '/api/v1/jobs/{id}/cancel' /api/v1/jobs/424242/cancel -H "$A"
rec POST '/api/v1/jobs/{id}/cancel' "/api/v1/jobs/$JOB/cancel" -H "$R"
rec POST '/api/v1/jobs/{id}/cancel' "/api/v1/jobs/$JOB/cancel"
printf 'name: oa2\n%s\n%s\ntrain: {steps: 100000, batch_size: 128, %s}\n' \
    "$LONG_MODEL" "$LONG_DATA" "$LONG_OPT" >"$T/long.yaml"
rec POST /api/v1/jobs /api/v1/jobs -H "$A" -H "$Y" --data-binary "@$T/long.yaml"
JOB2=$(jq -r .id "$T/r$n")
check "the long job is accepted" [ "$JOB2" -gt 0 ]
rec POST '/api/v1/jobs/{id}/cancel' "/api/v1/jobs/$JOB2/cancel" -H "$A"
rec GET /api/v1/workers /api/v1/workers -H "$R"
rec GET /api/v1/workers /api/v1/workers
rec POST '/api/v1/workers/{id}/drain' /api/v1/workers/w1/drain -H "$A"
rec POST '/api/v1/workers/{id}/drain' /api/v1/workers/nope/drain -H "$A"
rec POST '/api/v1/workers/{id}/drain' /api/v1/workers/w1/drain -H "$R"
rec POST '/api/v1/workers/{id}/drain' /api/v1/workers/w1/drain
rec POST '/api/v1/workers/{id}/undrain' /api/v1/workers/w1/undrain -H "$A"
rec POST '/api/v1/workers/{id}/undrain' /api/v1/workers/nope/undrain -H "$A"
rec POST '/api/v1/workers/{id}/undrain' /api/v1/workers/w1/undrain -H "$R"
rec POST '/api/v1/workers/{id}/undrain' /api/v1/workers/w1/undrain

python3 "$HERE/lib/openapi_check.py" docs/api/openapi.yaml "$REC" >"$T/check.out"; rc=$?
grep -v '^ok' "$T/check.out"
check "every documented route answers with a documented status and shape" [ "$rc" = 0 ]
finish
