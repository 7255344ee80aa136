#!/bin/sh
# control_plan.sh: plan-before-place. At submit the coordinator runs the engine's planner
# (mge-train --plan) on the job and places it by the planned peak memory per rank: a job
# planned above a worker's memory is not placed there; one that fits no worker as planned but
# fits with recomputation runs with it when it asks for memory.sublinear: auto (and says so);
# one that fits nowhere gets 422 with the numbers. Workers advertise small memories (MiB) so
# that small jobs show it.
. "$(dirname "$0")/lib/control.sh"

start_coord
start_worker small --memory-mb 40
start_worker mid --memory-mb 60

# deep_mlp 16 x 256 on 256 inputs: planned 42 MiB at batch 2048, 76 MiB at 4096 (44 MiB with
# recomputation), 281 MiB at 16384 (153 MiB with recomputation)
deep() { # NAME BATCH SUBLINEAR
    cat >"$T/$1.yaml" <<Y
name: $1
model: {type: deep_mlp, layers: 16, width: 256}
data: {format: synthetic, train_size: $2, test_size: 0, input_dim: 256, classes: 10}
train: {steps: 3, batch_size: $2, optimizer: {type: sgd, lr: 0.01}}
memory: {sublinear: $3}
Y
}
post() { api POST /api/v1/jobs -H 'Content-Type: application/yaml' --data-binary "@$T/$1.yaml"; }

# --- the plan is the run's: at resources.cpus threads (convolutions' scratch space grows with
# the threads), the planner's peak is the peak the rank runs with (at batch 32 a conv's scratch
# is part of LeNet's peak: 2.0 MB at 2 threads, 1.85 MB at 1) ---
cat >"$T/conv.yaml" <<Y
name: conv
model: {type: lenet}
data: {format: synthetic, train_size: 256, test_size: 0, image: [1, 28, 28], classes: 10}
resources: {cpus: 2}
train: {steps: 2, batch_size: 32, optimizer: {type: sgd, lr: 0.01}}
Y
planned=$(OMP_NUM_THREADS=1 "$MGE_TRAIN_BIN" --plan "$T/conv.yaml" | jq .peak_bytes)
planned1=$(OMP_NUM_THREADS=1 "$MGE_TRAIN_BIN" --plan "$T/conv.yaml" --set resources.cpus=1 | jq .peak_bytes)
ran=$("$MGE_TRAIN_BIN" "$T/conv.yaml" --threads 2 --json --out "$T/conv-out" 2>/dev/null |
    jq 'select(.summary) | .peak_bytes')
check "a LeNet of 2 CPUs: --plan's peak ($planned; $planned1 at 1 CPU) is the 2-thread run's ($ran)" \
    sh -c "[ -n '$ran' ] && [ '$planned' = '$ran' ] && [ '$planned1' != '$ran' ]"

# --- fits nowhere as planned, but would with recomputation: 422 naming both ---
deep big 4096 false
post big >"$T/big.json"
check "a job planned at 76 MiB per rank with 60 MiB the largest worker: 422" test "$(status)" = 422
check "... naming the plan, the largest worker and the way out" jq -e '.detail |
    test("^needs 76 MiB per rank at batch 4096; the largest worker has 60 MiB; with recomputation 44 MiB: set memory.sublinear: auto$")' "$T/big.json"
jq -r '"     " + .detail' "$T/big.json"

# --- fits nowhere even with recomputation ---
deep huge 16384 auto
post huge >"$T/huge.json"
check "a job planned at 281 MiB (153 MiB with recomputation): 422, still too large" sh -c \
    "[ \"\$(cat '$T/status')\" = 422 ] && jq -e '.detail | test(\"with recomputation 153 MiB: still too large\")' '$T/huge.json'"

# --- placed by the plan: 42 MiB does not go to the 40 MiB worker ---
deep mid42 2048 false
J1=$(post mid42 | jq -r .id)
check "a job planned at 42 MiB is accepted" test "$(status)" = 201
check "it succeeds" wait_until 60 state_is "$J1" succeeded
api GET "/api/v1/jobs/$J1" >"$T/j1.json"
check "... placed on 'mid' (60 MiB), not 'small' (40 MiB)" jq -e '.placement[0].worker == "mid"' "$T/j1.json"
check "... and GET shows the plan it was placed by (42 MiB, plain, 43 MiB reserved)" jq -e '
    .plan.mode == "none" and .plan.peak_bytes_per_rank == .plan.plain_bytes and
    .plan.reserved_mb == 43 and .plan.placed == "as planned" and .plan.batch == 2048' "$T/j1.json"

# --- fits only with recomputation, and asks for auto: runs with it under the largest worker ---
deep auto 4096 auto
J2=$(post auto | jq -r .id)
check "a job that fits only with recomputation and has memory.sublinear: auto is accepted" \
    test "$(status)" = 201
check "it succeeds" wait_until 60 state_is "$J2" succeeded
api GET "/api/v1/jobs/$J2" >"$T/j2.json"
check "... with recomputation under the largest worker's 60 MiB, and the job says so" jq -e '
    .plan.mode == "sublinear" and .plan.peak_bytes_per_rank <= 60 * 1048576 and
    .plan.plain_bytes > 60 * 1048576 and (.plan.placed | test("^with recomputation")) and
    .spec.memory.budget_mb == 60' "$T/j2.json"
check "... on 'mid'" jq -e '.placement[0].worker == "mid"' "$T/j2.json"
check "... and the rank ran the plan it was placed by (its result's peak_bytes)" \
    jq -e '.result.peak_bytes == .plan.peak_bytes_per_rank' "$T/j2.json"

# --- data the coordinator may not read: placed by its slots, the plan says why ---
cat >"$T/files.yaml" <<Y
name: files
model: {type: mlp, hidden: [32]}
data: {format: idx, train_images: /etc/passwd, train_labels: /etc/passwd}
train: {steps: 1, batch_size: 8, optimizer: {type: sgd, lr: 0.01}}
Y
J3=$(post files | jq -r .id)
check "a job whose data lies outside --plan-data-root is accepted unplanned" test "$(status)" = 201
api GET "/api/v1/jobs/$J3" >"$T/j3.json"
check "... its plan names the reason (outside the data roots), nothing of the file" jq -e '
    .plan.error | test("outside") and (test("root:") | not)' "$T/j3.json"
jq -r '"     " + .plan.error' "$T/j3.json"
api POST "/api/v1/jobs/$J3/cancel" >/dev/null

# --- a spec whose data would take 60 GB: the planner child hits its memory cap at once ---
cat >"$T/huge.yaml" <<Y
name: huge
model: {type: mlp, hidden: [32]}
data: {format: synthetic, train_size: 20000000, input_dim: 784, classes: 10}
train: {steps: 1, batch_size: 8, optimizer: {type: sgd, lr: 0.01}}
Y
t0=$(date +%s.%N)
J4=$(post huge | jq -r .id)
secs_huge=$(secs "$t0" "$(date +%s.%N)")
check "a spec whose synthetic data set would take 60 GB is answered in $secs_huge s (<= 5), unplanned" \
    sh -c "[ '$(status)' = 201 ] && awk 'BEGIN { exit !($secs_huge <= 5) }'"
api GET "/api/v1/jobs/$J4" >"$T/j4.json"
check "... its plan says the planner ran out of its memory" jq -e '.plan.error | test("out of memory")' \
    "$T/j4.json"
jq -r '"     " + .plan.error' "$T/j4.json"
check "... and the coordinator is still up" sh -c "curl -sf '$URL/healthz' >/dev/null"
api POST "/api/v1/jobs/$J4/cancel" >/dev/null

# --- the pending reason's ETA: when the running jobs' speed says the slots come free ---
eta_job() { # NAME STEPS
    cat >"$T/$1.yaml" <<Y
name: $1
$LONG_MODEL
$LONG_DATA
resources: {cpus: 2}
train: {steps: $2, batch_size: 128, $LONG_OPT}
Y
}
eta_job short 600
eta_job long 1200
eta_job queued 50
A=$(post short | jq -r .id)
B=$(post long | jq -r .id)
both_run() { state_is "$A" running && state_is "$B" running; }
check "two jobs take both workers' CPUs" wait_until 20 both_run
Q=$(post queued | jq -r .id)
pending_has_eta() { # JOB: "no estimate yet (...)" before the speeds are known, then an ETA
    api GET "/api/v1/jobs/$1" | jq -e '.pending_reason |
        test("(no estimate yet [(].*[)]|about [0-9]+ s [(]job [0-9]+ ends[)])$")' >/dev/null
}
check "a third waits, and its reason says when it may start (or that it cannot tell yet)" \
    wait_until 5 pending_has_eta "$Q"
check "job $A passes step 150" wait_until 60 step_at_least "$A" 150
api GET "/api/v1/jobs/$Q" >"$T/q.json"
t_said=$(date +%s.%N)
eta=$(jq -r '.pending_reason | capture("about (?<s>[0-9]+) s [(]job (?<j>[0-9]+) ends").s' "$T/q.json")
who=$(jq -r '.pending_reason | capture("about (?<s>[0-9]+) s [(]job (?<j>[0-9]+) ends").j' "$T/q.json")
echo "     pending reason: $(jq -r .pending_reason "$T/q.json")"
check "... then it names job $A, the shorter one, and an ETA" test "$who" = "$A" -a -n "$eta"
left_queue() { ! state_is "$Q" queued; }
check "the queued job starts" wait_until 120 left_queue
started=$(api GET "/api/v1/jobs/$Q" | jq -r .started_at)
waited=$(echo "$(iso_epoch "$started") - $t_said" | bc -l)
if echo "$waited $eta" | awk '{ d = $1 - $2; if (d < 0) d = -d; m = 0.3 * $1; if (m < 2) m = 2; exit !(d <= m) }'; then
    ok "it started $(printf '%.1f' "$waited") s after the reason said about $eta s (within 30% or 2 s)"
else
    fail "it started $(printf '%.1f' "$waited") s after the reason said about $eta s (not within 30% or 2 s)"
fi
all_done() { state_is "$A" succeeded && state_is "$B" succeeded && state_is "$Q" succeeded; }
check "all three succeed" wait_until 120 all_done

# --- a coordinator without a planner places by slots alone ---
kill "$COORD_PID"; wait "$COORD_PID" 2>/dev/null
start_coord --plan-bin none
wait_until 10 worker_ready mid
post big >"$T/big2.json"
J4=$(jq -r .id "$T/big2.json")
check "--plan-bin none: the 76 MiB job is accepted without a plan" sh -c \
    "[ \"\$(cat '$T/status')\" = 201 ] && [ \"\$(curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$J4' | jq -r .plan)\" = null ]"
api POST "/api/v1/jobs/$J4/cancel" >/dev/null
finish
