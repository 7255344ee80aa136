#!/bin/sh
# train_sim.sh: the simulated accelerator (resources.device: sim, mge-train --device sim), whose
# arenas are PROT_NONE outside its kernels and copies: every example model trains on it to the
# same bits as on the CPU device (the per-step losses and the final checkpoint's every tensor:
# parameters, optimiser state, batch-norm statistics): an MLP with dropout, Adam and clipping,
# LeNet, a ResNet-18, a CIFAR ResNet-8 (augmentation, label smoothing, bf16), a ResNet-50 and a
# deep_mlp with recomputation, a graph with every graph op, a GPT (attention, AdamW), 2 MPI
# ranks (packed all-reduces and deterministic mode); mge-infer --device sim evaluates and
# generates as on the CPU; a sim run resumes from a CPU checkpoint and --init-from reads into
# the device; bad device keys exit 2 naming the key.
. "$(dirname "$0")/lib/train.sh"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

# the loss of every step line of a --json run, as printed, one per line
losses() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if "step" in d and "loss" in d and "final_loss" not in d:
        print(d["step"], d.get("loss_bits", d["loss"]))' "$1"; }

# same_ckpt A B: the checkpoints of a cpu and a sim run hold the same bits (lib/same_ckpt.py)
same_ckpt() { python3 "$(dirname "$0")/lib/same_ckpt.py" "$1" "$2"; }

# twin NAME SPEC ARGS...: SPEC on cpu and on sim, the same losses and checkpoint bits
twin() {
    name=$1; spec=$2; shift 2
    for d in cpu sim; do
        "$BIN/mge-train" "$spec" "$@" --device $d --json --out "$T/$name.$d" > "$T/$name.$d.out" \
            2>"$T/err" || { bad "$name on $d exited $?"; cat "$T/err"; return; }
    done
    [ "$(json "$T/$name.sim.out" device)" = sim ] || bad "$name: the summary does not say device sim"
    losses "$T/$name.cpu.out" > "$T/a.loss"; losses "$T/$name.sim.out" > "$T/b.loss"
    n=$(wc -l < "$T/a.loss")
    [ "$n" -gt 0 ] && cmp -s "$T/a.loss" "$T/b.loss" && ok "$name: $n step losses equal on cpu and sim" \
        || bad "$name: losses differ: $(diff "$T/a.loss" "$T/b.loss" | head -3)"
    f1=$(json "$T/$name.cpu.out" final_loss); f2=$(json "$T/$name.sim.out" final_loss)
    [ "$f1" = "$f2" ] || bad "$name: final loss $f1 on cpu, $f2 on sim"
    if k=$(same_ckpt "$T/$name.cpu/latest.mgeckpt" "$T/$name.sim/latest.mgeckpt"); then
        ok "$name: final loss $f2; checkpoint ($k bytes) bit-identical"
    else
        bad "$name: checkpoints differ: $k"
    fi
}

echo "-- MLP: GELU, dropout, Adam with weight decay, gradient clipping, evaluation every epoch"
cat > "$T/mlp.yaml" <<'Y'
name: mlp
model: {type: mlp, hidden: [64, 32], activation: gelu, dropout: 0.1}
data: {format: synthetic, input_dim: 100, classes: 5, train_size: 300, test_size: 70}
train:
  steps: 25
  batch_size: 32
  optimizer: {type: adamw, lr: 0.002, weight_decay: 0.01}
  clip_grad_norm: 0.5
  checkpoint_every: 10
  seed: 5
Y
twin mlp "$T/mlp.yaml"

echo "-- LeNet-5 (convolutions, pooling) with SGD and momentum"
cat > "$T/lenet.yaml" <<'Y'
name: lenet
model: {type: lenet}
data: {format: synthetic, image: [1, 28, 28], classes: 10, train_size: 256, test_size: 64}
train: {steps: 12, batch_size: 32, optimizer: {type: sgd, lr: 0.05, momentum: 0.9}, seed: 3}
Y
twin lenet "$T/lenet.yaml"

echo "-- ResNet-18 (width 8): batch norm's running statistics, residuals, global pooling"
cat > "$T/r18.yaml" <<'Y'
name: r18
model: {type: resnet, variant: resnet18, width: 8}
data: {format: synthetic, image: [1, 28, 28], classes: 10, train_size: 64, test_size: 32}
train: {steps: 3, batch_size: 16, optimizer: {type: sgd, lr: 0.05, momentum: 0.9}, seed: 3}
Y
twin resnet18 "$T/r18.yaml"
for d in cpu sim; do
    "$BIN/mge-infer" "$T/resnet18.sim/latest.mgeckpt" --device $d --json > "$T/inf.$d" 2>"$T/err" \
        || { bad "mge-infer on $d exited $?"; cat "$T/err"; }
done
[ -s "$T/inf.sim" ] && cmp -s "$T/inf.cpu" "$T/inf.sim" &&
    ok "mge-infer --device sim: $(cat "$T/inf.sim") as on cpu" || bad "mge-infer differs on sim"

echo "-- CIFAR ResNet-8 on 3x32x32 with augmentation, label smoothing and train.precision bf16"
cat > "$T/r8.yaml" <<'Y'
name: r8
model: {type: resnet, depth: 8, width: 4}
data:
  format: synthetic
  image: [3, 32, 32]
  classes: 10
  train_size: 64
  test_size: 32
  augment: {crop_padding: 4, hflip: true}
train:
  steps: 4
  batch_size: 16
  label_smoothing: 0.1
  precision: bf16
  optimizer: {type: sgd, lr: 0.05, momentum: 0.9, nesterov: true, weight_decay: 0.0005}
  seed: 3
Y
twin resnet8 "$T/r8.yaml"
echo "  (precision: $(json "$T/resnet8.sim.out" precision))"

echo "-- ResNet-50 (bottlenecks, width 4) with sublinear memory: recomputed batch norms"
twin resnet50-sublinear "$T/r18.yaml" --set model.variant=resnet50 --set model.width=4 \
    --set train.steps=2 --set train.batch_size=8 --set memory.sublinear=true

echo "-- deep_mlp (24 layers of 64) with sublinear memory"
cat > "$T/deep.yaml" <<'Y'
name: deep
model: {type: deep_mlp, layers: 24, width: 64}
data: {format: synthetic, input_dim: 64, classes: 10, train_size: 256, test_size: 0}
train: {steps: 6, batch_size: 32, optimizer: {type: sgd, lr: 0.01, momentum: 0.9}, eval: false}
memory: {sublinear: true}
Y
twin deep_mlp "$T/deep.yaml"

echo "-- a graph model with every graph op (branches, broadcasting, concat, norms, dropout)"
cp "$(dirname "$0")/lib/allops.yaml" "$T/allops.yaml"
twin graph "$T/allops.yaml" --set train.steps=10 --set data.train_size=128
twin graph-sublinear "$T/allops.yaml" --set train.steps=10 --set data.train_size=128 \
    --set memory.sublinear=true

F=/usr/share/games/fortunes
if [ -f $F/fortunes ]; then
    echo "-- GPT (attention, embeddings, layer norm, AdamW, cosine schedule) on text"
    cat > "$T/gpt.yaml" <<EOF
name: gpt
model: {type: gpt, layers: 2, heads: 2, d_model: 32, context: 32, vocab: 256}
data: {format: text, train_files: [$F/fortunes], test_fraction: 0.1}
train:
  steps: 6
  batch_size: 8
  optimizer: {type: adamw, lr: 0.003, weight_decay: 0.1}
  lr_schedule: {type: cosine, warmup_steps: 2}
  checkpoint_every: 3
  seed: 7
EOF
    twin gpt "$T/gpt.yaml"
    t1=$(json "$T/gpt.cpu.out" test_loss); t2=$(json "$T/gpt.sim.out" test_loss)
    [ "$t1" = "$t2" ] && ok "gpt: held-out loss $t2 on both" || bad "gpt: held-out loss $t1 on cpu, $t2 on sim"
    for d in cpu sim; do
        "$BIN/mge-infer" "$T/gpt.sim/latest.mgeckpt" --device $d --generate 40 --prompt "Q: " \
            > "$T/gen.$d" 2>"$T/err" || { bad "mge-infer --generate on $d exited $?"; cat "$T/err"; }
    done
    [ -s "$T/gen.sim" ] && cmp -s "$T/gen.cpu" "$T/gen.sim" &&
        ok "mge-infer --generate: the same 40 tokens on cpu and sim" || bad "--generate differs on sim"
else
    echo "skip - GPT: fortunes-min is not installed"
fi

echo "-- a sim run resumed from a CPU checkpoint, and --init-from into device memory"
"$BIN/mge-train" "$T/mlp.yaml" --set train.steps=10 --device cpu --json --out "$T/half" \
    > /dev/null 2>"$T/err" || { bad "mlp 10 steps exited $?"; cat "$T/err"; }
"$BIN/mge-train" "$T/mlp.yaml" --device sim --resume "$T/half/latest.mgeckpt" --json \
    --out "$T/res" > "$T/res.out" 2>"$T/err" || { bad "sim resume exited $?"; cat "$T/err"; }
if k=$(same_ckpt "$T/mlp.cpu/latest.mgeckpt" "$T/res/latest.mgeckpt"); then
    ok "cpu 10 steps + sim 15 steps == cpu 25 steps, bit for bit"
else
    bad "resumed on sim: $k"
fi
for d in cpu sim; do
    "$BIN/mge-train" "$T/lenet.yaml" --set train.steps=3 --device $d --init-from \
        "$T/lenet.cpu/latest.mgeckpt" --json --out "$T/init.$d" > "$T/init.$d.out" 2>"$T/err" \
        || { bad "--init-from on $d exited $?"; cat "$T/err"; }
done
[ "$(losses "$T/init.cpu.out")" = "$(losses "$T/init.sim.out")" ] &&
    same_ckpt "$T/init.cpu/latest.mgeckpt" "$T/init.sim/latest.mgeckpt" > /dev/null &&
    ok "--init-from: the same losses and checkpoint on cpu and sim" || bad "--init-from differs on sim"

MPIRUN=$(command -v mpirun.openmpi || command -v mpirun)
if [ -n "$MPIRUN" ]; then
    echo "-- 2 MPI ranks: packed all-reduces through host copies, and deterministic mode"
    mpi() { OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        OMPI_MCA_rmaps_base_oversubscribe=1 timeout 120 "$MPIRUN" --oversubscribe --bind-to none \
        -np 2 "$@"; }
    # a 2-pack gradient (distributed.pack_mb) so a pack's all-reduce and update start mid-backward
    for d in cpu sim; do
        mpi "$BIN/mge-train" "$T/mlp.yaml" --set distributed.pack_mb=0.01 --set train.steps=15 \
            --device $d --json --out "$T/dp.$d" > "$T/dp.$d.out" 2>"$T/err" \
            || { bad "2 ranks on $d exited $?"; cat "$T/err"; }
        mpi "$BIN/mge-train" "$T/mlp.yaml" --set distributed.deterministic=true \
            --set train.steps=15 --device $d --json --out "$T/det.$d" > "$T/det.$d.out" \
            2>"$T/err" || { bad "deterministic 2 ranks on $d exited $?"; cat "$T/err"; }
    done
    [ "$(json "$T/dp.sim.out" ranks)" = 2 ] && [ "$(json "$T/dp.sim.out" packs)" -ge 2 ] &&
        [ "$(losses "$T/dp.cpu.out")" = "$(losses "$T/dp.sim.out")" ] &&
        k=$(same_ckpt "$T/dp.cpu/latest.mgeckpt" "$T/dp.sim/latest.mgeckpt") &&
        ok "2 ranks, $(json "$T/dp.sim.out" packs) packs: losses and checkpoint equal on cpu and sim" \
        || bad "2 ranks: cpu and sim differ $k"
    h1=$(json "$T/det.cpu.out" state_hash); h2=$(json "$T/det.sim.out" state_hash)
    [ -n "$h1" ] && [ "$h1" = "$h2" ] && [ "$(losses "$T/det.cpu.out")" = "$(losses "$T/det.sim.out")" ] &&
        ok "deterministic 2 ranks: loss bits and state hash $h2 equal on cpu and sim" \
        || bad "deterministic 2 ranks: state hash $h1 on cpu, $h2 on sim"
else
    echo "skip - MPI: Open MPI's mpirun is not installed"
fi

echo "-- bad device keys exit 2 naming the key"
expect2 "unknown device" "resources.device" "$BIN/mge-train" "$T/mlp.yaml" --device tpu
printf 'resources: {device: sim, gpus: 1}\n' >> "$T/mlp.yaml"
expect2 "gpus with sim" "0 with resources.device sim" "$BIN/mge-train" "$T/mlp.yaml"

echo "train_sim: $passes passed, $fails failed"
[ $fails -eq 0 ]
