#!/bin/sh
# train_quant.sh: quantisation end to end on the real Fashion-MNIST. A fp32 MLP and LeNet are
# fine-tuned with quantisation-aware training (--init-from CKPT --set quant.mode=qat), and
# mge-infer runs the same checkpoints in int8 (no conversion step): int8 loses at most 1.0
# point of test accuracy against the fp32 model, predicts as the fake-quantised graph does on
# >= 99.9% of the 10,000 test images, and the portable int8 path (MGE_CPU_VNNI=off) gives the
# very same numbers as VNNI (on LeNet; test_quant checks the GEMM itself bit for bit). QAT resumes byte-identically (observers round-trip through
# checkpoints); mge-quantize --calibrate makes a fp32 checkpoint int8-ready; a missing or corrupt
# quantisation field, and a bad quant: value, are exit 2 naming the field or key.
# Short runs (hundreds of steps, not epochs) keep this well under a minute; docs/benchmarks.md
# has the one-epoch numbers.
. "$(dirname "$0")/lib/train.sh"
ROOT=$(pwd)

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    echo "skip: dataset-fashion-mnist is not installed"; exit 77
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
TRAIN="$BIN/mge-train"
INFER="$BIN/mge-infer"
PATCH="python3 $ROOT/tests/integration/lib/ckpt_patch.py"

# run NAME ARGS...: mge-train ARGS --json, output in $T/NAME.out; a failure is reported
run() {
    name=$1; shift
    "$TRAIN" "$@" --json --out "$T/$name" > "$T/$name.out" 2> "$T/$name.err" \
        || { bad "$name: mge-train exited $?: $(tail -n 3 "$T/$name.err")"; return 1; }
}

# check NAME CKPT FP32_ACC: int8 against fp32 (the same checkpoint's weights unquantised; the
# fp32 model fine-tuning started from, FP32_ACC, for the record) and against the fake-quantised
# graph's predictions
check() {
    name=$1; ck=$2; fp=$3
    "$INFER" "$ck" --precision int8 --compare --json > "$T/$name-int8.json" 2> "$T/err" \
        || { bad "$name: mge-infer --precision int8 exited $?: $(cat "$T/err")"; return; }
    "$INFER" "$ck" --precision fp32 --json > "$T/$name-fp32.json" 2> "$T/err" \
        || { bad "$name: mge-infer --precision fp32 exited $?: $(cat "$T/err")"; return; }
    acc=$(json "$T/$name-int8.json" test_accuracy)
    same=$(json "$T/$name-fp32.json" test_accuracy)
    agree=$(json "$T/$name-int8.json" agreement)
    msg="int8 test accuracy $acc, fp32 $same (the fp32 model it started from: $fp), fake-quantised $(json "$T/$name-int8.json" fakequant_accuracy)"
    ge "$acc" "$(python3 -c "print($same - 0.01)")" && ok "$name: $msg" || bad "$name: $msg (> 1.0 point lost)"
    ge "$agree" 0.999 && ok "$name: int8 and fake-quantised predictions agree on $agree of the test set" \
        || bad "$name: agreement $agree < 0.999"
    # the portable path (slow: plain C) once, on LeNet: its convs and linears both
    [ "$name" = lenet ] || return 0
    MGE_CPU_VNNI=off "$INFER" "$ck" --precision int8 --json > "$T/$name-port.json" 2> "$T/err" \
        || { bad "$name: portable int8 exited $?: $(cat "$T/err")"; return; }
    for k in test_accuracy loss; do
        a=$(json "$T/$name-int8.json" $k); b=$(json "$T/$name-port.json" $k)
        [ "$a" = "$b" ] && ok "$name: portable int8 $k $b == $a" || bad "$name: portable $k $b != $a"
    done
}

echo "-- MLP: fp32, then QAT from its checkpoint, then int8 inference from the QAT checkpoint"
MLP="$ROOT/examples/fmnist-mlp.yaml"
run mlp32 "$MLP" --set train.steps=120 --set train.eval=false
"$INFER" "$T/mlp32/latest.mgeckpt" --json > "$T/mlp32.json" 2> "$T/err" || bad "fp32 mge-infer: $(cat "$T/err")"
fp=$(json "$T/mlp32.json" test_accuracy)
run mlpq "$MLP" --init-from "$T/mlp32/latest.mgeckpt" --set quant.mode=qat --set train.steps=100 \
    --set train.checkpoint_every=60 --set train.eval=false
check mlp "$T/mlpq/latest.mgeckpt" "$fp"

echo "-- QAT resumes byte-identically: observers and weights round-trip through checkpoints"
run mlpr "$MLP" --resume "$T/mlpq/ckpt-000060.mgeckpt" --set quant.mode=qat --set train.steps=100 \
    --set train.checkpoint_every=60 --set train.eval=false
cmp -s "$T/mlpq/latest.mgeckpt" "$T/mlpr/latest.mgeckpt" \
    && ok "resumed at step 60: final checkpoint byte-identical" || bad "resumed checkpoint differs"

echo "-- recomputation (memory.sublinear, forced) neither changes QAT nor observes twice"
SUB="--init-from $T/mlp32/latest.mgeckpt --set quant.mode=qat --set train.steps=20 --set train.eval=false --set memory.sublinear=true"
# shellcheck disable=SC2086 # $SUB is a list of arguments
run mlpsub "$MLP" $SUB
export MGE_REMAT_FORCE=1
# shellcheck disable=SC2086
run mlpsubf "$MLP" $SUB
unset MGE_REMAT_FORCE
a=$(json "$T/mlpsub.out" final_loss); b=$(json "$T/mlpsubf.out" final_loss)
[ "$a" = "$b" ] && ok "final loss $b with forced recomputation == $a without" || bad "final loss $b != $a"
cmp -s "$T/mlpsub/latest.mgeckpt" "$T/mlpsubf/latest.mgeckpt" \
    && ok "checkpoints (observers included) byte-identical with and without recomputation" \
    || bad "recomputation changed the checkpoint"

echo "-- post-training calibration of the fp32 checkpoint"
"$BIN/mge-quantize" "$T/mlp32/latest.mgeckpt" --calibrate 10 --out "$T/ptq.mgeckpt" > "$T/ptq.out" 2>&1 \
    && ok "mge-quantize: $(cat "$T/ptq.out" | sed "s|$T/||g")" || bad "mge-quantize: $(cat "$T/ptq.out")"
check ptq "$T/ptq.mgeckpt" "$fp"

echo "-- LeNet: convolutions in int8"
LENET="$ROOT/examples/fmnist-lenet.yaml"
run lenet32 "$LENET" --set train.steps=60 --set train.eval=false
"$INFER" "$T/lenet32/latest.mgeckpt" --json > "$T/lenet32.json" 2> "$T/err" || bad "fp32 mge-infer: $(cat "$T/err")"
run lenetq "$LENET" --init-from "$T/lenet32/latest.mgeckpt" --set quant.mode=qat \
    --set quant.observer=ema --set train.steps=40 --set train.eval=false
check lenet "$T/lenetq/latest.mgeckpt" "$(json "$T/lenet32.json" test_accuracy)"

echo "-- bad quantisation fields and values: exit 2 naming them"
expect2 "int8 without observers" "quantisation field 'fc1.act_observer' is missing" \
    "$INFER" "$T/mlp32/latest.mgeckpt" --precision int8
$PATCH "$T/mlpq/latest.mgeckpt" "$T/lowhigh.mgeckpt" fc2.act_observer 0 1e9
expect2 "observer low above high" "quantisation field 'fc2.act_observer': field 'low'" \
    "$INFER" "$T/lowhigh.mgeckpt" --precision int8
$PATCH "$T/mlpq/latest.mgeckpt" "$T/nan.mgeckpt" fc1.act_observer 2 nan
expect2 "observer count NaN" "quantisation field 'fc1.act_observer': field 'count'" \
    "$INFER" "$T/nan.mgeckpt" --precision fakequant
expect2 "--init-from a corrupt observer" "observer 'fc1.act_observer': field 'count'" \
    "$TRAIN" "$MLP" --init-from "$T/nan.mgeckpt" --set quant.mode=qat --set train.steps=1 --out "$T/x"
printf 'quant:\n  mode: qat\n  observer: p99\n' | cat "$MLP" - > "$T/bad.yaml"
expect2 "quant.observer" "bad.yaml:$(wc -l < "$T/bad.yaml"): quant.observer: expected one of minmax, ema, percentile, got 'p99'" \
    "$TRAIN" "$T/bad.yaml" --out "$T/x"
expect2 "qat with bf16" "train.precision=bf16: expected fp32 with quant.mode qat" \
    "$TRAIN" "$MLP" --set quant.mode=qat --set train.precision=bf16 --set train.steps=1 --out "$T/x"
expect2 "--precision" "--precision must be fp32, fakequant or int8" "$INFER" "$T/mlpq/latest.mgeckpt" --precision int4

echo "train_quant: $passes passed, $fails failed"
[ $fails -eq 0 ]
