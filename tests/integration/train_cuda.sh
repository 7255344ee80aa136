#!/bin/sh
# train_cuda.sh: the cuda device end to end (resources.device: gpu, mge-train --device gpu). On
# a machine with a GPU: the Fashion-MNIST MLP and LeNet examples train 150 steps on the cpu
# device and on cuda from the same initial weights and batches, and every step's loss agrees
# within a stated bound (the GEMMs and cuDNN's convolutions sum in other orders, so the runs
# drift apart slowly: 2e-3 relative for the MLP, 5e-3 for LeNet), as do the final losses and
# test accuracies (within 1 point); a QAT job exits 2 naming the op the cuda device lacks.
# Without a GPU: a gpu job exits 2 saying there is no usable CUDA device (or that the build has
# no CUDA) and naming CUDA_VISIBLE_DEVICES; the GPU checks are skipped, visibly, with their count
# (exit 77). Run by `make test-gpu` and `make test`.
. "$(dirname "$0")/lib/train.sh"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
N_GPU_CHECKS=7 # 2 models x (step losses, final loss, accuracy), the QAT refusal

echo "-- a gpu job asks for the cuda device"
gpu_or_skip train_cuda $N_GPU_CHECKS env CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-0} \
    "$BIN/mge-train" "$ROOT/examples/fmnist-mlp.yaml" --device gpu --set resources.gpus=1 \
    --set train.steps=1 --set train.checkpoint_every=0 --out "$T/probe"
ok "a gpu job runs here: $(json "$T/probe.out" device 2>/dev/null)"

[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || {
    bad "dataset-fashion-mnist is not installed (deploy/install-deps.sh installs it)"
    echo "train_cuda: $passes passed, $fails failed"; exit 1; }

# pair NAME SPEC BOUND: SPEC on cpu and on gpu; per-step losses, final loss and accuracy agree
pair() {
    name=$1; spec=$2; bound=$3
    for d in cpu gpu; do
        "$BIN/mge-train" "$spec" --device $d --set resources.gpus=$([ $d = gpu ] && echo 1 || echo 0) \
            --set train.steps=150 --set train.checkpoint_every=0 --json --out "$T/$name.$d" \
            > "$T/$name.$d.out" 2> "$T/$name.$d.err" || { bad "$name on $d exited $?"; cat "$T/$name.$d.err"; return; }
    done
    losses "$T/$name.cpu.out" > "$T/$name.cpu.loss"
    losses "$T/$name.gpu.out" > "$T/$name.gpu.loss"
    if r=$(rel_losses "$T/$name.cpu.loss" "$T/$name.gpu.loss" "$bound"); then ok "$name: $r"
    else bad "$name: step losses: $r"; fi
    f1=$(json "$T/$name.cpu.out" final_loss); f2=$(json "$T/$name.gpu.out" final_loss)
    python3 -c 'import sys; a, b, k = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= k * abs(a) else 1)' \
        "$f1" "$f2" "$bound" && ok "$name: final loss $f1 on cpu, $f2 on cuda" \
        || bad "$name: final loss $f1 on cpu, $f2 on cuda"
    a1=$(json "$T/$name.cpu.out" test_accuracy); a2=$(json "$T/$name.gpu.out" test_accuracy)
    python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 0.01 else 1)' \
        "$a1" "$a2" && ok "$name: test accuracy $a1 on cpu, $a2 on cuda" \
        || bad "$name: test accuracy $a1 on cpu, $a2 on cuda"
}

echo "-- the Fashion-MNIST MLP (cuBLAS GEMMs, fused bias + ReLU, SGD with momentum)"
pair mlp "$ROOT/examples/fmnist-mlp.yaml" 2e-3
echo "-- LeNet-5 (cuDNN convolutions, pooling)"
pair lenet "$ROOT/examples/fmnist-lenet.yaml" 5e-3

echo "-- an op without a CUDA kernel: exit 2 naming it"
expect2 "quantisation-aware training on gpu" "has no kernel on device 'cuda'" \
    "$BIN/mge-train" "$ROOT/examples/fmnist-mlp.yaml" --device gpu --set resources.gpus=1 \
    --set quant.mode=qat --set train.steps=2 --out "$T/qat"

echo "train_cuda: $passes passed, $fails failed"
[ $fails -eq 0 ]
