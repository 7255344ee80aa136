#!/bin/sh
# infer_split.sh: mge-infer with the batch split across threads (--split on: one graph per
# thread, each op inside it single-threaded) against one graph whose ops use every thread
# (--split off), on a LeNet (label smoothing 0.1, then QAT) and a ResNet-8 trained here on the
# real Fashion-MNIST (evaluated on its first 2,000 test images): per-sample predictions (--predictions files) identical, accuracy and loss
# equal as printed (6 decimals: the split computes each batch's loss from the same logits with
# the same kernel, so it is exact, not within a tolerance), in fp32 and int8, --compare's
# agreement too, at 2 threads and at 3 (shares of 43, 43, 42: uneven units). --timing's
# "graphs" shows which way each run went; a bad --split value is exit 2.
. "$(dirname "$0")/lib/train.sh"
ROOT=$(pwd)

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    echo "skip: dataset-fashion-mnist is not installed"; exit 77
fi
INFER="$BIN/mge-infer"
# the first 2,000 test images (15 batches of 128 and one of 80) keep the unsplit runs short: on a
# busy machine one graph over 2 threads is slow (libgomp's spinning, docs/benchmarks.md)
N=2000
python3 - "$T" $N <<'PY'
import gzip, struct, sys
d, n = sys.argv[1], int(sys.argv[2])
src = "/usr/share/datasets/fashion-mnist/t10k-%s-idx%d-ubyte.gz"
img = gzip.open(src % ("images", 3)).read()
lab = gzip.open(src % ("labels", 1)).read()
open(d + "/images", "wb").write(struct.pack(">IIII", 2051, n, 28, 28) + img[16:16 + n * 784])
open(d + "/labels", "wb").write(struct.pack(">II", 2049, n) + lab[8:8 + n])
PY
# behaviour, not speed: threads that wait sleep instead of spinning against the neighbours
export OMP_WAIT_POLICY=passive
SMALL="--set data.test_images=$T/images --set data.test_labels=$T/labels"

# run NAME ARGS...: mge-train ARGS --json at 2 threads, output in $T/NAME
run() {
    name=$1; shift
    # shellcheck disable=SC2086 # $SMALL is a list of arguments
    "$BIN/mge-train" "$@" $SMALL --threads 2 --set train.eval=false --json --out "$T/$name" \
        > "$T/$name.out" 2> "$T/$name.err" \
        || { bad "$name: mge-train exited $?: $(tail -n 3 "$T/$name.err")"; return 1; }
}

# same NAME CKPT THREADS ARGS...: --split on and off agree on every prediction and the summary
same() {
    name=$1; ck=$2; th=$3; shift 3
    for s in on off; do
        "$INFER" "$ck" --json --timing --threads "$th" --split $s --predictions "$T/$name-$s.pred" \
            "$@" > "$T/$name-$s.json" 2> "$T/err" \
            || { bad "$name: mge-infer --split $s exited $?: $(cat "$T/err")"; return; }
    done
    g=$(json "$T/$name-on.json" graphs); g0=$(json "$T/$name-off.json" graphs)
    [ "$g" = "$th" ] && [ "$g0" = 1 ] && ok "$name: $g graphs split on, $g0 off" \
        || bad "$name: graphs $g split on, $g0 off (want $th and 1)"
    n=$(wc -l < "$T/$name-on.pred")
    cmp -s "$T/$name-on.pred" "$T/$name-off.pred" && [ "$n" -eq $N ] \
        && ok "$name: $n predictions identical" || bad "$name: predictions differ ($n lines)"
    for k in test_accuracy loss $KEYS; do
        a=$(json "$T/$name-on.json" "$k"); b=$(json "$T/$name-off.json" "$k")
        [ "$a" = "$b" ] && ok "$name: $k $a split == $b unsplit" || bad "$name: $k $a split != $b unsplit"
    done
    echo "     samples/s split $(json "$T/$name-on.json" samples_per_sec), unsplit $(json "$T/$name-off.json" samples_per_sec)"
}

echo "-- LeNet (label smoothing 0.1): fp32, then QAT from it; int8 and fp32 split and unsplit"
LENET="$ROOT/examples/fmnist-lenet.yaml"
run lenet32 "$LENET" --set train.steps=40 --set train.label_smoothing=0.1
run lenetq "$LENET" --init-from "$T/lenet32/latest.mgeckpt" --set quant.mode=qat \
    --set train.steps=20 --set train.label_smoothing=0.1
CK="$T/lenetq/latest.mgeckpt"
KEYS=""; same lenet-fp32 "$CK" 2 --precision fp32
KEYS="fakequant_accuracy agreement"; same lenet-int8 "$CK" 2 --precision int8 --compare
KEYS=""; same lenet-int8-3t "$CK" 3 --precision int8

echo "-- ResNet-8 (batch norm, residual adds): fp32 and int8"
run rn32 "$ROOT/examples/fmnist-resnet20.yaml" --set model.depth=8 --set train.batch_size=64 \
    --set train.steps=10
run rnq "$ROOT/examples/fmnist-resnet20.yaml" --set model.depth=8 --set train.batch_size=64 \
    --init-from "$T/rn32/latest.mgeckpt" --set quant.mode=qat --set train.steps=6
KEYS=""; same rn-fp32 "$T/rnq/latest.mgeckpt" 2 --precision fp32
KEYS=""; same rn-int8 "$T/rnq/latest.mgeckpt" 2 --precision int8

echo "-- a gpt: held-out loss per token split and unsplit (windows in units of 4 per graph)"
F=/usr/share/games/fortunes
if [ -f $F/fortunes ]; then
    cat > "$T/gpt.yaml" <<EOF
name: gpt-tiny
model: {type: gpt, layers: 2, heads: 2, d_model: 32, context: 32, vocab: 256}
data: {format: text, train_files: [$F/fortunes, $F/literature]}
train: {steps: 10, batch_size: 8, seed: 7, optimizer: {type: adamw, lr: 0.003}}
EOF
    SMALL=""; run gpt "$T/gpt.yaml"
    for s in on off; do
        "$INFER" "$T/gpt/latest.mgeckpt" --json --threads 2 --split $s > "$T/gpt-$s.json" 2> "$T/err" \
            || bad "gpt: mge-infer --split $s exited $?: $(cat "$T/err")"
    done
    a=$(json "$T/gpt-on.json" loss); b=$(json "$T/gpt-off.json" loss)
    # each unit's mean is rounded to float once (each batch's, unsplit): equal within 1e-6
    python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-6 * abs(b))' "$a" "$b" \
        && ok "gpt: loss $a split, $b unsplit (1e-6 relative)" || bad "gpt: loss $a split != $b unsplit"
    [ "$(json "$T/gpt-on.json" tokens)" = "$(json "$T/gpt-off.json" tokens)" ] \
        && ok "gpt: $(json "$T/gpt-on.json" tokens) tokens both ways" || bad "gpt: token counts differ"
else
    echo "skip - gpt: fortunes-min is not installed"
fi

echo "-- bad values"
expect2 "--split" "--split must be auto, on or off, not 'yes'" "$INFER" "$CK" --split yes
expect2 "--split on off the CPU" "--split on: only for --device cpu" "$INFER" "$CK" --split on --device sim

echo "infer_split: $passes passed, $fails failed"
[ $fails -eq 0 ]
