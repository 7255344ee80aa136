#!/bin/sh
# train_graph.sh: models declared in the spec (model.type: graph): the graph twins of an MLP
# (GELU, dropout, Adam; synthetic data), LeNet and ResNet-20 (examples/*.graph.yaml, the real
# Fashion-MNIST) train bit-identically to the zoo models (the same loss at every step, the same
# weights after the run, byte for byte); one graph with every op learns and is bit-identical
# under recomputation; a graph checkpoint resumes bit-identically and mge-infer reads it; bad
# graphs exit 2 naming the node, the key and the line.
. "$(dirname "$0")/lib/train.sh"
ROOT=$(pwd)

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    echo "skip: dataset-fashion-mnist is not installed"; exit 77
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

# no test set: the twins compare training only (ResNet's evaluation would take most of the time)
NO_TEST="--set data.test_images= --set data.test_labels="

echo "-- MLP with GELU and dropout, Adam, synthetic data: zoo and graph (fused activations, same masks)"
DATA='data: {format: synthetic, input_dim: 100, classes: 5, train_size: 512, test_size: 64}'
TRAIN='train: {steps: 30, batch_size: 32, optimizer: {type: adam, lr: 0.001}}'
printf 'name: mlp\nmodel: {type: mlp, hidden: [64, 32], activation: gelu, dropout: 0.1}\n%s\n%s\n' \
    "$DATA" "$TRAIN" > "$T/mlp.yaml"
cat > "$T/mlp.graph.yaml" <<Y
name: mlp-graph
model:
  type: graph
  nodes:
    - {name: x, op: input, shape: [100]}
    - {name: fc1, op: linear, inputs: x, out_features: 64}
    - {name: a1, op: gelu, inputs: fc1}
    - {name: d1, op: dropout, inputs: a1, p: 0.1}
    - {name: fc2, op: linear, inputs: d1, out_features: 32}
    - {name: a2, op: gelu, inputs: fc2}
    - {name: d2, op: dropout, inputs: a2, p: 0.1}
    - {name: fc3, op: linear, inputs: d2, out_features: 5}
    - {name: loss, op: cross_entropy, inputs: fc3}
$DATA
$TRAIN
Y
twin mlp "$T/mlp.yaml" "$T/mlp.graph.yaml"
echo "-- LeNet-5: zoo and graph, 40 steps"
twin lenet "$ROOT/examples/fmnist-lenet.yaml" "$ROOT/examples/fmnist-lenet.graph.yaml" \
    --set train.steps=40 $NO_TEST
echo "-- ResNet-20: zoo and graph, 3 steps of 16 (batch norm's running statistics included)"
twin resnet20 "$ROOT/examples/fmnist-resnet20.yaml" "$ROOT/examples/fmnist-resnet20.graph.yaml" \
    --set train.steps=3 --set train.batch_size=16 $NO_TEST

echo "-- every op in one graph (branches, broadcasting, concat, norms) trains; recomputation keeps it bit-identical"
cp "$(dirname "$0")/lib/allops.yaml" "$T/allops.yaml"
"$BIN/mge-train" "$T/allops.yaml" --json --out "$T/allops" > "$T/allops.out" 2>"$T/err" || { bad "allops exited $?"; cat "$T/err"; }
MGE_REMAT_FORCE=1 "$BIN/mge-train" "$T/allops.yaml" --json --out "$T/allops-r" --set memory.sublinear=true \
    > "$T/allops-r.out" 2>"$T/err" || { bad "allops (sublinear) exited $?"; cat "$T/err"; }
losses "$T/allops.out" > "$T/a.loss"; losses "$T/allops-r.out" > "$T/b.loss"
first=$(head -1 "$T/a.loss" | cut -d' ' -f2); last=$(tail -1 "$T/a.loss" | cut -d' ' -f2)
lt "$last" "$first" && ok "allops learns: loss $first at step 1, $last at step 20" || bad "allops loss $first -> $last"
[ "$(wc -l < "$T/a.loss")" = 20 ] && cmp -s "$T/a.loss" "$T/b.loss" &&
    ok "allops: the same 20 losses with forced recomputation" || bad "allops: recomputation changed the losses"

echo "-- a graph checkpoint resumes bit-identically; mge-infer rebuilds the graph from it"
G="$ROOT/examples/fmnist-lenet.graph.yaml"
"$BIN/mge-train" "$G" --json --out "$T/straight" --set train.steps=40 --set train.checkpoint_every=0 \
    > "$T/straight.out" 2>&1
"$BIN/mge-train" "$G" --json --out "$T/half" --set train.steps=20 --set train.checkpoint_every=0 \
    $NO_TEST > "$T/half.out" 2>&1
"$BIN/mge-train" "$G" --json --out "$T/resumed" --set train.steps=40 --set train.checkpoint_every=0 \
    --resume "$T/half/latest.mgeckpt" > "$T/resumed.out" 2>&1
l1=$(json "$T/straight.out" final_loss); l2=$(json "$T/resumed.out" final_loss)
[ -n "$l1" ] && [ "$l1" = "$l2" ] && ok "final loss $l1 straight == $l2 resumed" || bad "final loss $l1 != $l2"
acc=$(json "$T/straight.out" test_accuracy)
"$BIN/mge-infer" "$T/straight/latest.mgeckpt" --json > "$T/infer.out" 2>"$T/err" || { bad "mge-infer exited $?"; cat "$T/err"; }
iacc=$(json "$T/infer.out" accuracy)
[ -n "$acc" ] && [ "$iacc" = "$acc" ] && ok "mge-infer rebuilds the graph from the checkpoint: accuracy $iacc == training's $acc" ||
    bad "mge-infer accuracy $iacc != training's $acc"

echo "-- bad graphs: exit 2, naming node, key and line"
# refused SED NEEDLE WHAT: the LeNet graph edited by SED must exit 2 with NEEDLE on stderr
refused() {
    sed "$1" "$G" > "$T/bad.yaml"
    "$BIN/mge-train" "$T/bad.yaml" --set train.steps=1 > "$T/bad.out" 2>"$T/bad.err"; rc=$?
    if [ $rc = 2 ] && grep -qF "$2" "$T/bad.err"; then ok "$3: $(head -1 "$T/bad.err")"
    else bad "$3: exit $rc, stderr: $(cat "$T/bad.err")"; fi
}
line() { grep -n "$1" "$G" | head -1 | cut -d: -f1; }
L=$(line 'name: relu1,')
refused 's/name: relu1, op: relu, inputs: pool1/name: relu1, op: relu, inputs: conv2/' \
    "bad.yaml:$L: model.nodes[3].inputs: node \`relu1\`: the graph has a cycle: \`relu1\` reads \`conv2\` reads \`relu1\`" "a cycle"
refused 's/inputs: pool2}/inputs: pool3}/' \
    "bad.yaml:$(line 'name: relu2,'): model.nodes[6].inputs: node \`relu2\`: input 'pool3' is not a node (did you mean \`pool1\`?)" "an unknown input"
refused 's/op: maxpool, inputs: conv1/op: maxpol, inputs: conv1/' \
    "bad.yaml:$(line 'name: pool1,'): model.nodes[2].op: node \`pool1\`: unknown op 'maxpol' (did you mean 'maxpool'?)" "an unknown op"
refused 's/name: fc2, op: linear/name: fc1, op: linear/' \
    "bad.yaml:$(line 'name: fc2,'): model.nodes[10].name: duplicate node name \`fc1\` (first given at line $(line 'name: fc1,'))" "a duplicate name"
refused 's/out_channels: 16, kernel: 5}/out_channels: 16, kernel: 5, stride: 0}/' \
    "bad.yaml:$(line 'name: conv2,'): model.nodes[4].stride: node \`conv2\`: expected an integer between 1 and 1024, got '0'" "a bad attribute"
refused 's/inputs: relu4, out_features: 10/inputs: relu4, out_features: 12/' \
    "bad.yaml:$(line 'name: loss,'): model.nodes[13].inputs: node \`loss\`: input \`fc3\` has shape [128,12]; the loss takes logits [128,10]" "logits of the wrong shape"
refused 's/name: relu3, op: relu, inputs: fc1}/name: relu3, op: add, inputs: [fc1, flatten]}/' \
    "bad.yaml:$(line 'name: relu3,'): model.nodes[9].inputs: node \`relu3\`: input \`fc1\` has shape [128,120], \`flatten\` has [128,400] (shapes must be equal or broadcast)" "mismatched add"
# idx files tell their sample shape only when mge-train reads them
refused 's/shape: \[1, 28, 28\]/shape: [1, 27, 28]/' \
    "model.nodes[0] (line $(line 'name: x,')): node \`x\`: the data's samples are [1,28,28] (784 values), the input declares 756 values" "input shape vs the data"

echo "train_graph: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
