#!/bin/sh
# train_formats.sh: mge-train on NumPy .npy and CIFAR binary files made from the real
# Fashion-MNIST (tests/tools/mge-convert writes what np.save writes, and CIFAR-10 records):
# an MLP's loss falls, uint8 [N,1,28,28] and float32 [N,784] files train bit-identically,
# mge-infer reproduces the test accuracy from the checkpoint, CIFAR from two training files
# trains, data.normalize applies alike in training and mge-infer, and files that disagree
# with the spec exit 2 naming the file and the reason.
. "$(dirname "$0")/lib/train.sh"
TOOL="$(cd "$BUILD/tests" && pwd)/mge-convert"

F=/usr/share/datasets/fashion-mnist
if [ ! -f $F/train-images-idx3-ubyte.gz ]; then
    echo "skip: dataset-fashion-mnist is not installed"; exit 77
fi
[ -x "$TOOL" ] || { echo "FAIL: $TOOL not built (make tests-build)"; exit 1; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

echo "-- Fashion-MNIST as .npy"
"$TOOL" $F/train-images-idx3-ubyte.gz $F/train-labels-idx1-ubyte.gz "$T/x8.npy" "$T/y.npy" u8 12000 &&
"$TOOL" $F/train-images-idx3-ubyte.gz $F/train-labels-idx1-ubyte.gz "$T/x32.npy" "$T/y.npy" f32 12000 &&
"$TOOL" $F/t10k-images-idx3-ubyte.gz $F/t10k-labels-idx1-ubyte.gz "$T/tx.npy" "$T/ty.npy" u8 2000 &&
    ok "wrote $(wc -c < "$T/x8.npy") + $(wc -c < "$T/x32.npy") + $(wc -c < "$T/tx.npy") bytes" || bad "mge-convert failed"

spec() { # NAME INPUTS EXTRA-DATA-LINE
    cat > "$T/$1.yaml" <<EOF
name: npy-$1
model: {type: mlp, hidden: [64]}
data:
  format: npy
  train_images: $2
  train_labels: $T/y.npy
  test_images: $T/tx.npy
  test_labels: $T/ty.npy
$3
train:
  steps: 150
  batch_size: 64
  optimizer: {type: sgd, lr: 0.1, momentum: 0.9}
  seed: 3
EOF
}
spec u8 "$T/x8.npy" "  image: [1, 28, 28]"
spec f32 "$T/x32.npy" "  input_dim: 784"

echo "-- an MLP trains on npy data"
"$BIN/mge-train" "$T/u8.yaml" --json --out "$T/u8" > "$T/u8.out" 2>"$T/err" || { bad "u8 run exited $?"; cat "$T/err"; }
first=$(grep '"step":1,' "$T/u8.out" | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["loss"])')
last=$(json "$T/u8.out" final_loss)
acc=$(json "$T/u8.out" test_accuracy)
lt "$last" "$first" && lt 0.5 "$first" && ok "loss falls: step 1 $first -> step 150 $last" || bad "loss did not fall: $first -> $last"
lt 0.7 "$acc" && ok "test accuracy $acc > 0.7 after 150 steps" || bad "test accuracy $acc"

echo "-- float32 [N, 784] trains bit-identically to uint8 [N, 1, 28, 28]"
"$BIN/mge-train" "$T/f32.yaml" --json --out "$T/f32" > "$T/f32.out" 2>"$T/err" || { bad "f32 run exited $?"; cat "$T/err"; }
l32=$(json "$T/f32.out" final_loss)
[ -n "$l32" ] && [ "$l32" = "$last" ] && ok "final loss $l32 == $last" || bad "f32 final loss $l32 != u8 $last"

echo "-- mge-infer reads the npy test set from the checkpoint's spec"
"$BIN/mge-infer" "$T/u8/latest.mgeckpt" --json > "$T/infer.out" 2>"$T/err" || { bad "mge-infer exited $?"; cat "$T/err"; }
iacc=$(json "$T/infer.out" accuracy)
[ "$iacc" = "$acc" ] && ok "mge-infer accuracy $iacc == training's $acc" || bad "mge-infer $iacc != $acc"

echo "-- files that disagree with the spec: exit 2 naming the file and the reason"
expect2() { # name, needle, command...
    name=$1; needle=$2; shift 2
    "$@" > "$T/bad.out" 2> "$T/bad.err"; rc=$?
    if [ $rc -eq 2 ] && grep -q -- "^mge-train: .*$needle" "$T/bad.err"; then ok "$name: exit 2, '$(grep "^mge-train:" "$T/bad.err" | head -c 200)'"
    else bad "$name: exit $rc, stderr: $(cat "$T/bad.err")"; fi
}
spec img "$T/x8.npy" "  image: [3, 32, 32]"
expect2 "image shape" "x8.npy: shape \[12000, 1, 28, 28\] does not match data.image \[3, 32, 32\]" "$BIN/mge-train" "$T/img.yaml"
spec dim "$T/x32.npy" "  input_dim: 100"
expect2 "input_dim" "x32.npy: shape \[12000, 784\] has 784 values per sample but the spec says 100" "$BIN/mge-train" "$T/dim.yaml"
spec cls "$T/x8.npy" "  classes: 5"
expect2 "label >= classes" "y.npy: label [5-9] of sample [0-9]* is out of range \[0, 5)" "$BIN/mge-train" "$T/cls.yaml"
spec lab "$T/x8.npy" ""
expect2 "labels as inputs" "y.npy: inputs must be uint8 or float32, not int64" "$BIN/mge-train" "$T/lab.yaml" --set data.train_images="$T/y.npy"
head -c 100000 "$T/x8.npy" > "$T/trunc.npy"
expect2 "truncated file" "trunc.npy: truncated: header says 12000 samples, file has data for 127" "$BIN/mge-train" "$T/lab.yaml" --set data.train_images="$T/trunc.npy"
expect2 "IDX file as npy" "train-images-idx3-ubyte.gz: bad magic: not a .npy file" "$BIN/mge-train" "$T/lab.yaml" --set data.train_images=$F/train-images-idx3-ubyte.gz

echo "-- CIFAR-10 records (Fashion-MNIST centred in 32x32x3) from two training files"
"$TOOL" $F/train-images-idx3-ubyte.gz $F/train-labels-idx1-ubyte.gz "$T/b1.bin" - cifar 6000 &&
"$TOOL" $F/t10k-images-idx3-ubyte.gz $F/t10k-labels-idx1-ubyte.gz "$T/test.bin" - cifar 2000 &&
    ok "wrote $(wc -c < "$T/b1.bin") + $(wc -c < "$T/test.bin") bytes of CIFAR records" || bad "mge-convert cifar failed"
cp "$T/b1.bin" "$T/b2.bin"
cat > "$T/cifar.yaml" <<EOF
name: cifar-mlp
model: {type: mlp, hidden: [64]}
data:
  format: cifar
  train_files: [$T/b1.bin, $T/b2.bin]
  test_file: $T/test.bin
train:
  steps: 150
  batch_size: 64
  optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
  seed: 3
EOF
"$BIN/mge-train" "$T/cifar.yaml" --json --out "$T/cifar" > "$T/cifar.out" 2>"$T/err" || { bad "cifar run exited $?"; cat "$T/err"; }
cfirst=$(grep '"step":1,' "$T/cifar.out" | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["loss"])')
clast=$(json "$T/cifar.out" final_loss)
cacc=$(json "$T/cifar.out" test_accuracy)
lt "$clast" "$cfirst" && ok "cifar loss falls: step 1 $cfirst -> step 150 $clast" || bad "cifar loss did not fall: $cfirst -> $clast"
lt 0.6 "$cacc" && ok "cifar test accuracy $cacc > 0.6 after 150 steps" || bad "cifar test accuracy $cacc"
head -c 100000 "$T/b1.bin" > "$T/cut.bin"
expect2 "cifar size not a multiple" "cut.bin: size 100000 is not a positive multiple of the 3073-byte CIFAR-10 record" "$BIN/mge-train" "$T/cifar.yaml" --set data.test_file="$T/cut.bin"
expect2 "cifar-10 read as cifar-100" "b1.bin: size 18438000 is not a positive multiple of the 3074-byte CIFAR-100 record" "$BIN/mge-train" "$T/cifar.yaml" --set data.classes=100

echo "-- data.normalize: training, evaluation and mge-infer normalise alike"
"$BIN/mge-train" "$T/cifar.yaml" --set 'data.normalize={mean: [0.2, 0.2, 0.2], std: [0.3, 0.3, 0.3]}' --json --out "$T/norm" > "$T/norm.out" 2>"$T/err" || { bad "normalised run exited $?"; cat "$T/err"; }
nlast=$(json "$T/norm.out" final_loss)
nacc=$(json "$T/norm.out" test_accuracy)
lt "$nlast" "$cfirst" && [ "$nlast" != "$clast" ] && ok "normalised loss falls to $nlast (unnormalised $clast)" || bad "normalised final loss $nlast"
"$BIN/mge-infer" "$T/norm/latest.mgeckpt" --json > "$T/ninfer.out" 2>"$T/err" || { bad "mge-infer exited $?"; cat "$T/err"; }
[ "$(json "$T/ninfer.out" accuracy)" = "$nacc" ] && ok "mge-infer accuracy $nacc == training's (normalisation from the checkpoint's spec)" || bad "mge-infer $(json "$T/ninfer.out" accuracy) != $nacc"
expect2 "normalize entries != channels" "data.normalize has 1 entry but the data has 3 channels" "$BIN/mge-train" "$T/cifar.yaml" --set 'data.normalize={mean: [0.5], std: [0.5]}'

echo "train_formats: $passes passed, $fails failed"
[ $fails -eq 0 ]
