#!/bin/sh
# train_nccl.sh: data parallelism over NCCL on the cuda device's arenas (distributed.backend:
# nccl, resources.device: gpu): gradient packs all-reduced in device memory on NCCL's stream,
# each started by an event on the compute stream, the state broadcasts and the loss's sum in
# device memory. Everywhere: nccl on a device whose memory NCCL cannot reach (cpu, sim) exits 2
# naming the key (the job spec's check). On a machine with a GPU: one process on a 1-rank NCCL communicator (the
# trainer's whole NCCL path) ends with the losses of the plain single-GPU run, deterministic
# mode over nccl exits 2, and with two GPUs and Open MPI, 2 processes (one GPU each: NCCL
# refuses two ranks on one GPU) train the Fashion-MNIST MLP with the 1-process losses (within
# 5e-3 relative: the split sums round differently). Without a GPU the GPU checks are skipped,
# visibly, with their count (exit 77). Run by `make test` and `make test-gpu`.
. "$(dirname "$0")/lib/train.sh"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MLP="$ROOT/examples/fmnist-mlp.yaml"
N_GPU_CHECKS=6 # 1 rank: losses, final loss; deterministic refusal; 2 ranks: started, losses, final
STEPS=60

echo "-- nccl needs device memory NCCL can reach"
for d in cpu sim; do
    expect2 "backend nccl on $d" "expected a CPU backend (auto, local or mpi) with resources.device $d" \
        "$BIN/mge-train" "$MLP" --device $d --set distributed.backend=nccl --set train.steps=2 \
        --set train.checkpoint_every=0 --out "$T/refuse.$d"
done

echo "-- a gpu job asks for the cuda device"
gpu_or_skip train_nccl $N_GPU_CHECKS env CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-0} \
    "$BIN/mge-train" "$MLP" --device gpu --set resources.gpus=1 --set distributed.backend=nccl \
    --set train.steps=1 --set train.checkpoint_every=0 --out "$T/probe"
ok "an nccl job runs on one GPU"

[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || {
    bad "dataset-fashion-mnist is not installed (deploy/install-deps.sh installs it)"
    echo "train_nccl: $passes passed, $fails failed"; exit 1; }

# agree NAME A B BOUND: per-step losses of two --json runs within BOUND (relative), and their
# final losses
agree() {
    losses "$2" > "$T/a.loss"; losses "$3" > "$T/b.loss"
    if r=$(rel_losses "$T/a.loss" "$T/b.loss" "$4"); then ok "$1: $r"; else bad "$1: step losses: $r"; fi
    f1=$(json "$2" final_loss); f2=$(json "$3" final_loss)
    python3 -c 'import sys; a, b, k = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= k * abs(a) else 1)' \
        "$f1" "$f2" "$4" && ok "$1: final loss $f1 and $f2" || bad "$1: final loss $f1 and $f2"
}

train() { # NAME SETS...: the MLP on gpu, --json, into $T/NAME.out
    name=$1; shift
    "$BIN/mge-train" "$MLP" --device gpu --set resources.gpus=1 --set train.steps=$STEPS \
        --set train.checkpoint_every=0 --json --out "$T/$name" "$@" > "$T/$name.out" 2> "$T/$name.err" \
        || { bad "$name exited $?: $(tail -n 3 "$T/$name.err")"; return 1; }
}

echo "-- one process, a 1-rank NCCL communicator: packs, broadcasts and the loss in device memory"
if train local && train nccl1 --set distributed.backend=nccl; then
    agree "nccl, 1 rank, against the plain gpu run" "$T/local.out" "$T/nccl1.out" 1e-6
fi
expect2 "deterministic mode over nccl" "distributed.deterministic" \
    "$BIN/mge-train" "$MLP" --device gpu --set resources.gpus=1 --set distributed.backend=nccl \
    --set distributed.deterministic=true --set train.steps=2 --out "$T/det"

echo "-- 2 processes, one GPU each"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
MPIRUN=$(command -v mpirun.openmpi || command -v mpirun)
if [ "${gpus:-0}" -lt 2 ]; then
    echo "skip - train_nccl: 3 two-process checks skipped (NCCL needs a GPU per rank; nvidia-smi lists ${gpus:-0})"
elif [ -z "$MPIRUN" ]; then
    echo "skip - train_nccl: 3 two-process checks skipped (Open MPI's mpirun not found)"
else
    # each rank sees only its own GPU, so the cuda device's device 0 is NCCL's too
    cat > "$T/rank.sh" <<W
#!/bin/sh
CUDA_VISIBLE_DEVICES=\$OMPI_COMM_WORLD_LOCAL_RANK exec "\$@"
W
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 "$MPIRUN" \
        --bind-to none -np 2 sh "$T/rank.sh" "$BIN/mge-train" "$MLP" --device gpu \
        --set resources.gpus=1 --set distributed.backend=nccl --set train.steps=$STEPS \
        --set train.checkpoint_every=0 --json --out "$T/nccl2" > "$T/nccl2.out" 2> "$T/nccl2.err"
    rc=$?
    if [ $rc -eq 0 ] && grep -q '"backend":"nccl","ranks":2' "$T/nccl2.out"; then
        ok "2 ranks over nccl: $(grep -o '"packs":[0-9]*' "$T/nccl2.out" | head -n 1) per step"
        agree "2 ranks over nccl against 1 process" "$T/local.out" "$T/nccl2.out" 5e-3
    else
        bad "2 ranks over nccl: exit $rc: $(tail -n 5 "$T/nccl2.err")"
    fi
fi
echo "train_nccl: $passes passed, $fails failed"
[ $fails -eq 0 ]
