#!/bin/sh
# control_sim.sh: a job with resources.device: sim goes through the control plane like a CPU
# job: the coordinator accepts it, places it on an ordinary CPU worker (no GPUs), its rank
# trains on the simulated accelerator, and the result is the CPU device's to the last bit (the
# final loss, every step's loss and the checkpoint equal those of a local mge-train --device
# cpu run).
. "$(dirname "$0")/lib/control.sh"

start_coord
start_worker w1
cat > "$T/job.yaml" <<'Y'
name: on-sim
model: {type: mlp, hidden: [32], dropout: 0.1}
data: {format: synthetic, input_dim: 40, classes: 4, train_size: 200, test_size: 40}
train: {steps: 20, batch_size: 16, optimizer: {type: adam, lr: 0.002}, seed: 9}
resources: {device: sim, workers: 1}
Y
JOB=$(submit_yaml "$T/job.yaml")
check "the sim job is accepted" [ "$(status)" = 201 ]
check "its spec keeps device sim" \
    sh -c "curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$JOB' | jq -e '.spec.resources.device == \"sim\"'"
check "it runs on the CPU worker and succeeds" wait_until 60 state_is "$JOB" succeeded
api GET "/api/v1/jobs/$JOB" > "$T/job.json"
check "... as one rank on w1, an ordinary CPU worker" jq -e '.incarnations[0].members == ["w1"]' "$T/job.json"
check "the rank trained on sim" jq -e '.result.device == "sim"' "$T/job.json"
"$MGE_TRAIN_BIN" "$T/job.yaml" --device cpu --json --out "$T/local" > "$T/local.out" 2>"$T/local.err" ||
    fail "local cpu run exited $?"
want=$(tail -n 1 "$T/local.out" | jq -r .final_loss)
got=$(jq -r .result.final_loss "$T/job.json")
check "final loss $got on sim == $want from a local cpu run" [ -n "$want" ] && [ "$want" = "$got" ]
api GET "/api/v1/jobs/$JOB/metrics?name=loss" | jq -c '[.metrics[].value]' > "$T/sim.loss"
jq -s -c '[.[] | select(.loss != null and .final_loss == null) | .loss]' "$T/local.out" > "$T/cpu.loss"
check "all 20 step losses equal" sh -c "cmp -s '$T/sim.loss' '$T/cpu.loss' && jq -e 'length == 20' '$T/sim.loss'"
check "its checkpoint holds the cpu run's bits" python3 "$HERE/lib/same_ckpt.py" \
    "$T/local/latest.mgeckpt" "$T/w-w1/job-$JOB/attempt-1/rank-0/latest.mgeckpt"
finish
