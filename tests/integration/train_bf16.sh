#!/bin/sh
# train_bf16.sh: train.precision: bf16 end to end on the real Fashion-MNIST. The MLP, LeNet and
# a ResNet-8 (width 16, so its convs run in bf16) train in bf16 with a loss curve within the
# noise of fp32's (see compare below), resume
# bit-identically in bf16, fall back to fp32 with a warning and a summary saying so where the
# CPU lacks AVX-512 BF16 (MGE_CPU_BF16=off plays such a CPU), the bf16 unit tests pass on the
# emulated path too, and a bad value is exit 2 naming the key.
. "$(dirname "$0")/lib/train.sh"
ROOT=$(pwd)

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    echo "skip: dataset-fashion-mnist is not installed"; exit 77
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
TRAIN="$BIN/mge-train"

# mean of the loss over the last N per-step lines of FILE, and its step-to-step noise: the
# standard deviation of successive differences / sqrt(2) (the downward trend left out)
tail_loss() {
    python3 -c '
import json, math, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{\"step\"")]
w = [s["loss"] for s in steps[-int(sys.argv[2]):]]
d = [y - x for x, y in zip(w, w[1:])]
print("%.6f %.6f" % (sum(w) / len(w), statistics.stdev(d) / math.sqrt(2)))' "$1" "$2"
}

# compare NAME SPEC STEPS ARGS...: bf16 against fp32 (same seed, so the same batches) over the
# last quarter of the steps. Noise: the larger of twice the distance between two fp32 seeds and
# three standard errors of the difference of two window means (step-to-step noise / sqrt(N)).
compare() {
    name=$1; spec=$2; steps=$3; shift 3
    for run in fp32:12 bf16:12 fp32:13; do
        p=${run%:*}; s=${run#*:}
        "$TRAIN" "$spec" --set train.steps="$steps" --set train.precision="$p" --set train.seed="$s" \
            "$@" --json --out "$T/$name-$p-$s" > "$T/$name-$p-$s.out" 2>"$T/err" \
            || { bad "$name $p seed $s exited $?"; cat "$T/err"; return; }
    done
    pr=$(json "$T/$name-bf16-12.out" precision)
    [ "$pr" = bf16 ] && ok "$name: summary says precision $pr" || bad "$name: precision '$pr'"
    n=$((steps / 4))
    msg=$(python3 -c '
import math, sys
a, sa, b, sb, c, sc = map(float, sys.argv[1:7])
n = int(sys.argv[7])
noise = max(2 * abs(c - a), 3 * math.sqrt((sa * sa + sb * sb) / n))
print("mean loss of the last %d steps: fp32 %.4f, bf16 %.4f (|diff| %.4f); fp32 seed 13 %.4f; "
      "noise bound %.4f" % (n, a, b, abs(b - a), c, noise))
sys.exit(0 if abs(b - a) <= noise else 1)' $(tail_loss "$T/$name-fp32-12.out" $n) \
        $(tail_loss "$T/$name-bf16-12.out" $n) $(tail_loss "$T/$name-fp32-13.out" $n) $n) \
        && ok "$name: $msg" || bad "$name: $msg"
}

FMNIST_DATA="data:
  format: idx
  train_images: /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
  train_labels: /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"

cat > "$T/rn.yaml" <<EOF
name: rn8
model: {type: resnet, depth: 8, width: 16}
$FMNIST_DATA
train:
  steps: 40
  batch_size: 16
  eval: false
  optimizer: {type: sgd, lr: 0.05, momentum: 0.9, weight_decay: 0.0005}
  seed: 3
EOF

if grep -q avx512_bf16 /proc/cpuinfo; then
    echo "-- loss curves: bf16 within the noise of fp32"
    compare mlp "$ROOT/examples/fmnist-mlp.yaml" 200 --set train.eval=false
    compare lenet "$ROOT/examples/fmnist-lenet.yaml" 300 --set train.eval=false
    compare resnet8 "$T/rn.yaml" 32
else
    echo "-- loss curves: skipped, this CPU has no avx512_bf16 (bf16 runs would be fp32)"
fi

echo "-- resume in bf16 is bit-identical (fp32 where the CPU has no avx512_bf16)"
resume() { # NAME SPEC STEPS HALF ARGS...
    name=$1; spec=$2; steps=$3; half=$4; shift 4
    "$TRAIN" "$spec" --set train.precision=bf16 --set train.steps="$steps" "$@" --json \
        --out "$T/$name-straight" > "$T/$name-straight.out" 2>"$T/err" || { bad "$name exited $?"; cat "$T/err"; }
    "$TRAIN" "$spec" --set train.precision=bf16 --set train.steps="$half" "$@" --json \
        --out "$T/$name-half" > /dev/null 2>"$T/err" || { bad "$name ($half steps) exited $?"; cat "$T/err"; }
    "$TRAIN" "$spec" --set train.precision=bf16 --set train.steps="$steps" "$@" --json \
        --resume "$T/$name-half/latest.mgeckpt" --out "$T/$name-resumed" > "$T/$name-resumed.out" 2>"$T/err" \
        || { bad "$name resume exited $?"; cat "$T/err"; }
    for k in final_loss test_loss; do
        v1=$(json "$T/$name-straight.out" $k 2>/dev/null); v2=$(json "$T/$name-resumed.out" $k 2>/dev/null)
        [ "$k" = test_loss ] && [ -z "$v1" ] && [ -z "$v2" ] && continue
        [ -n "$v1" ] && [ "$v1" = "$v2" ] && ok "$name $k $v1 straight == $v2 resumed" \
            || bad "$name $k $v1 straight != $v2 resumed"
    done
    cmp -s "$T/$name-straight/latest.mgeckpt" "$T/$name-resumed/latest.mgeckpt" \
        && ok "$name: checkpoints byte-identical" || bad "$name: checkpoints differ"
}
resume mlp "$ROOT/examples/fmnist-mlp.yaml" 60 25
resume lenet "$ROOT/examples/fmnist-lenet.yaml" 40 15 --set train.eval=false
resume resnet8 "$T/rn.yaml" 10 4

echo "-- fallback: a CPU without AVX-512 BF16 trains in fp32 and says so"
MGE_CPU_BF16=off "$TRAIN" "$ROOT/examples/fmnist-mlp.yaml" --set train.precision=bf16 --set train.steps=30 \
    --set train.eval=false --json --out "$T/fb" > "$T/fb.out" 2>"$T/fb.err" || { bad "fallback run exited $?"; cat "$T/fb.err"; }
"$TRAIN" "$ROOT/examples/fmnist-mlp.yaml" --set train.steps=30 --set train.eval=false --json \
    --out "$T/fb32" > "$T/fb32.out" 2>"$T/err" || { bad "fp32 run exited $?"; cat "$T/err"; }
pr=$(json "$T/fb.out" precision)
[ "$pr" = "fp32 (bf16 unsupported: no avx512_bf16)" ] && ok "summary: \"precision\": \"$pr\"" || bad "fallback precision '$pr'"
grep -q "warning: .*train.precision: bf16 needs AVX-512 BF16.*training in fp32" "$T/fb.err" \
    && ok "log: $(grep warning "$T/fb.err")" || bad "no fallback warning: $(cat "$T/fb.err")"
[ "$(json "$T/fb.out" final_loss)" = "$(json "$T/fb32.out" final_loss)" ] \
    && ok "fallback final loss $(json "$T/fb.out" final_loss) == fp32's" || bad "fallback $(json "$T/fb.out" final_loss) != fp32 $(json "$T/fb32.out" final_loss)"
MGE_CPU_BF16=off "$BUILD/tests/test_bf16" > "$T/emu.out" 2>&1 \
    && ok "unit tests on the emulated path: $(tail -n 1 "$T/emu.out")" || { bad "test_bf16 with MGE_CPU_BF16=off"; cat "$T/emu.out"; }

echo "-- bad value: exit 2 naming file, key and line"
sed 's/^  batch_size: 128/  batch_size: 128\n  precision: fp16/' "$ROOT/examples/fmnist-mlp.yaml" > "$T/bad.yaml"
"$TRAIN" "$T/bad.yaml" > /dev/null 2> "$T/bad.err"; rc=$?
[ $rc -eq 2 ] && grep -q "bad.yaml:16: train.precision: expected one of fp32, bf16" "$T/bad.err" \
    && ok "exit 2: $(head -n 1 "$T/bad.err")" || bad "exit $rc: $(cat "$T/bad.err")"

echo "train_bf16: $passes passed, $fails failed"
[ $fails -eq 0 ]
