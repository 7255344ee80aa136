#!/bin/sh
# control_gpu.sh: GPU workers and GPU placement, on a machine without a GPU. Workers advertise
# fake GPUs through their test hook MGE_FAKE_GPUS (docs/operations.md, GPU workers); a real
# coordinator places `device: gpu` jobs by free GPUs and by each GPU's memory against the job's
# planned peak (mge-train --plan), gives each rank its GPU indexes, and the worker sets the
# rank's CUDA_VISIBLE_DEVICES from them. The ranks are the real mge-train, which says that it
# has no usable CUDA device, or that this build has no CUDA (exit 2 either way), and names the
# CUDA_VISIBLE_DEVICES it was given; a
# wrapper holds each rank until the test has seen two jobs hold a GPU each at the same time.
. "$(dirname "$0")/lib/control.sh"

REAL_TRAIN=$MGE_TRAIN_BIN
cat >"$T/hold-train" <<EOF2
#!/bin/sh
# the real engine, once the test releases the ranks (at most 60 s later)
i=0
while [ ! -e "$T/release" ] && [ \$i -lt 600 ]; do sleep 0.1; i=\$((i + 1)); done
exec "$REAL_TRAIN" "\$@"
EOF2
chmod +x "$T/hold-train"
MGE_TRAIN_BIN=$T/hold-train

# deep_mlp 16 x 256 on 256 inputs: planned 42 MiB at batch 2048, 76 MiB at 4096 (77 MiB reserved:
# the plan in whole MiB, rounded up)
gpu_job() { # NAME BATCH
    cat >"$T/$1.yaml" <<Y
name: $1
model: {type: deep_mlp, layers: 16, width: 256}
data: {format: synthetic, train_size: $2, test_size: 0, input_dim: 256, classes: 10}
train: {steps: 3, batch_size: $2, optimizer: {type: sgd, lr: 0.01}}
resources: {device: gpu, gpus: 1}
Y
}
post() { api POST /api/v1/jobs -H 'Content-Type: application/yaml' --data-binary "@$T/$1.yaml"; }
reason() { api GET "/api/v1/jobs/$1" | jq -r '.pending_reason // ""'; }
reason_matches() { reason "$1" | grep -Eq "$2"; }

start_coord
MGE_FAKE_GPUS= start_worker cpu # none, even on a machine with GPUs

# --- no worker has a GPU: the job pends and says so ---
gpu_job g0 4096
G0=$(post g0 | jq -r .id)
check "a GPU job is accepted on a cluster without GPUs" test "$(status)" = 201
check "... and pends: 'needs 1 worker with 1 GPU of 77 MiB; no registered worker has a GPU'" \
    wait_until 10 reason_matches "$G0" '^needs 1 worker with 1 GPU of 77 MiB; no registered worker has a GPU$'
echo "     $(reason "$G0")"

# --- a worker with one small GPU: registered with its name and memory; still too small ---
MGE_FAKE_GPUS="1x Small GPU:60" start_worker small
api GET /api/v1/workers >"$T/w1.json"
check "worker 'small' registers its GPU: name 'Small GPU', 60 MiB, device gpu" jq -e '
    .workers[] | select(.name == "small") | .slots.gpus == 1 and .slots.device == "gpu" and
    .gpus == [{"index": 0, "name": "Small GPU", "memory_mb": 60, "free": true}]' "$T/w1.json"
check "worker 'cpu' has no GPUs" jq -e '.workers[] | select(.name == "cpu") |
    .slots.gpus == 0 and .slots.device == "cpu" and .gpus == []' "$T/w1.json"
check "the 76 MiB job pends naming the numbers: the largest GPU has 60 MiB" \
    wait_until 10 reason_matches "$G0" "^needs 1 worker with 1 GPU of 77 MiB; no GPU has 77 MiB: the largest has 60 MiB \\(worker 'small'\\)$"
echo "     $(reason "$G0")"
gpu_job g1 4096
post g1 >"$T/g1.json"
check "a GPU job planned above the largest GPU is refused at submit: 422" test "$(status)" = 422
check "... naming the plan and the largest GPU" jq -e '.detail |
    test("^needs 76 MiB per rank at batch 4096; the largest GPU has 60 MiB; with recomputation")' "$T/g1.json"
jq -r '"     " + .detail' "$T/g1.json"

# --- a worker with two large GPUs: two 1-GPU jobs get one each, a third waits ---
MGE_FAKE_GPUS="2x NVIDIA H100 80GB HBM3:81559" start_worker big
api GET /api/v1/workers >"$T/w2.json"
check "worker 'big' registers 2 GPUs with name and memory" jq -e '
    .workers[] | select(.name == "big") | .slots.gpus == 2 and ([.gpus[] | .name] ==
    ["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"]) and ([.gpus[].memory_mb] == [81559, 81559])' "$T/w2.json"
"$BIN/mgectl" workers >"$T/mgectl-workers.txt"
check "mgectl workers shows the GPU models" grep -q 'big .* 2x NVIDIA H100 80GB HBM3 (81559 MiB)' \
    "$T/mgectl-workers.txt"
sed 's/^/     /' "$T/mgectl-workers.txt"
placed_on() { # JOB WORKER GPUS_JSON
    api GET "/api/v1/jobs/$1" | jq -e --arg w "$2" --argjson g "$3" \
        '.state == "running" and .placement[0].worker == $w and .placement[0].gpus == $g'
}
check "the waiting GPU job is placed on 'big', GPU 0" wait_until 10 placed_on "$G0" big '[0]'
gpu_job g2 4096
G2=$(post g2 | jq -r .id)
check "a second 1-GPU job goes to 'big' too, GPU 1" wait_until 10 placed_on "$G2" big '[1]'
gpu_job g3 2048
G3=$(post g3 | jq -r .id)
check "a 42 MiB GPU job fits the small GPU: placed on 'small', GPU 0" \
    wait_until 10 placed_on "$G3" small '[0]'
gpu_job g4 4096
G4=$(post g4 | jq -r .id)
check "a third 76 MiB job waits: both large GPUs are taken" \
    wait_until 10 reason_matches "$G4" '^needs 1 worker with 1 GPU of 77 MiB, 0 free'
echo "     $(reason "$G4")"
check "... and the CPU worker got no GPU job" sh -c "! grep -q 'placed: 1 rank(s), rank 0 on .cpu.' '$T/coordinator.log'"
api GET /api/v1/workers >"$T/w3.json"
check "GET /api/v1/workers shows both of big's GPUs taken" jq -e '
    .workers[] | select(.name == "big") | .free.gpus == 0 and ([.gpus[].free] == [false, false])' "$T/w3.json"

# --- the ranks run: each sees its own device; there is no GPU behind it ---
touch "$T/release"
failed() { state_is "$1" failed; }
check "job $G0 ends (mge-train exits 2: no usable CUDA device)" wait_until 30 failed "$G0"
check "job $G2 ends the same way" wait_until 30 failed "$G2"
logs() { api GET "/api/v1/jobs/$1/logs" | jq -r '.lines[].text'; }
logs "$G0" >"$T/g0.log"
logs "$G2" >"$T/g2.log"
check "job $G0's rank got GPU 0 as CUDA_VISIBLE_DEVICES=0 (the worker's line in its log)" \
    grep -qF "gets GPU index(es) '0': CUDA_VISIBLE_DEVICES=0" "$T/g0.log"
check "job $G2's rank got GPU 1 as CUDA_VISIBLE_DEVICES=1" \
    grep -qF "gets GPU index(es) '1': CUDA_VISIBLE_DEVICES=1" "$T/g2.log"
check "job $G0: mge-train saw CUDA_VISIBLE_DEVICES=0 and says it has no usable CUDA device" \
    grep -Eq "resources.device: gpu: (no usable CUDA device|this build has no CUDA) .*CUDA_VISIBLE_DEVICES=0\)" "$T/g0.log"
check "job $G2: mge-train saw CUDA_VISIBLE_DEVICES=1" \
    grep -Eq "resources.device: gpu: (no usable CUDA device|this build has no CUDA) .*CUDA_VISIBLE_DEVICES=1\)" "$T/g2.log"
sed 's/^/     /' "$T/g2.log"
check "the queued 76 MiB job then gets a freed large GPU" wait_until 30 sh -c \
    "curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$G4' | jq -e '.placement[0].worker == \"big\"'"

# --- a CPU job on a GPU worker sees no GPU ---
cat >"$T/c.yaml" <<Y
name: c
$QUICK_MODEL
$QUICK_DATA
train: {steps: 2, batch_size: 32, $QUICK_OPT}
Y
api POST /api/v1/workers/cpu/drain >/dev/null
api POST /api/v1/workers/small/drain >/dev/null
C=$(submit_yaml "$T/c.yaml")
check "a CPU job on 'big' succeeds" wait_until 30 state_is "$C" succeeded
logs "$C" >"$T/c.log"
check "... with CUDA_VISIBLE_DEVICES empty (none of the worker's GPUs)" \
    grep -qx "mge-worker: rank 0 gets GPU index(es) '': CUDA_VISIBLE_DEVICES=" "$T/c.log"
# --- a 2-worker GPU job (one mpirun): every rank gets its worker's GPU ---
if MPIRUN=$(command -v mpirun.openmpi || command -v mpirun) && [ -x "$BIN/mge-launch" ]; then
    MGE_FAKE_GPUS="1x NVIDIA L4:22563" start_worker l4
    cat >"$T/gang.yaml" <<Y
name: gang
model: {type: mlp, hidden: [8]}
data: {format: synthetic, train_size: 64, test_size: 0, input_dim: 4, classes: 2}
train: {steps: 2, batch_size: 8, optimizer: {type: sgd, lr: 0.01}}
resources: {device: gpu, workers: 2}
Y
    GANG=$(submit_yaml "$T/gang.yaml")
    gang_ended() { state_is "$GANG" failed; }
    check "a 2-worker GPU job is placed on 'big' and 'l4' (one GPU each) and ends" \
        wait_until 30 gang_ended
    api GET "/api/v1/jobs/$GANG" >"$T/gang.json"
    check "... its placement: rank 0 on 'big' GPU [0], rank 1 on 'l4' GPU [0]" jq -e '
        [.placement[] | [.worker, .gpus]] == [["big", [0]], ["l4", [0]]]' "$T/gang.json"
    api GET "/api/v1/jobs/$GANG/logs" | jq -r '.lines[] | "\(.rank) \(.text)"' >"$T/gang.log"
    check "... and each rank's worker gave it CUDA_VISIBLE_DEVICES=0 (mpirun's, and orted's)" sh -c \
        "grep -qF \"0 mge-worker: rank 0 gets GPU index(es) '0': CUDA_VISIBLE_DEVICES=0\" '$T/gang.log' &&
         grep -qF \"1 mge-worker: rank 1 gets GPU index(es) '0': CUDA_VISIBLE_DEVICES=0\" '$T/gang.log'"
    grep -F "gets GPU" "$T/gang.log" | sed 's/^/     /'
else
    echo "skip - the 2-worker GPU job: Open MPI's mpirun or mge-launch not found"
fi
finish
