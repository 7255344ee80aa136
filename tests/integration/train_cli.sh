#!/bin/sh
# train_cli.sh: mge-train and mge-infer end to end on the real Fashion-MNIST (Debian's
# dataset-fashion-mnist): accuracy of both examples, mge-infer reproducing the accuracy
# exactly, bit-identical resume (also with clip_grad_norm, label_smoothing and AdamW
# decay_1d: false), --plan, and clear errors (exit 2) on bad input.
. "$(dirname "$0")/lib/train.sh"
ROOT=$(pwd)

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    echo "skip: dataset-fashion-mnist is not installed"; exit 77
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

echo "-- plan"
"$BIN/mge-train" --plan "$ROOT/examples/fmnist-mlp.yaml" > "$T/plan.json" 2>"$T/err" || bad "--plan exited $?"
for k in peak_bytes lower_bound_bytes param_bytes activation_bytes; do
    v=$(json "$T/plan.json" $k 2>/dev/null) && [ "$v" -gt 0 ] && ok "plan has $k=$v" || bad "plan lacks $k"
done
[ "$(json "$T/plan.json" param_bytes)" -ge 2678848 ] && ok "param bytes cover 669706 floats" || bad "param bytes too small"

echo "-- mlp, 3 epochs"
"$BIN/mge-train" "$ROOT/examples/fmnist-mlp.yaml" --json --out "$T/mlp" > "$T/mlp.out" 2>"$T/err" || { bad "mlp exited $?"; cat "$T/err"; }
acc=$(json "$T/mlp.out" test_accuracy)
ge "$acc" 0.86 && ok "mlp test accuracy $acc >= 0.86" || bad "mlp test accuracy $acc < 0.86"
[ "$(json "$T/mlp.out" steps)" = 1407 ] && ok "mlp ran 1407 steps" || bad "mlp steps $(json "$T/mlp.out" steps)"
grep -q '"step":1,' "$T/mlp.out" && ok "per-step JSON lines" || bad "no per-step JSON line"
grep -q '"epoch":3,.*"test_accuracy"' "$T/mlp.out" && ok "per-epoch evaluation lines" || bad "no evaluation line"
python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$T/mlp.out" && ok "stdout is JSON lines only" || bad "stdout has non-JSON"

echo "-- mge-infer reproduces the accuracy exactly"
"$BIN/mge-infer" "$T/mlp/latest.mgeckpt" --json > "$T/infer.out" 2>"$T/err" || { bad "mge-infer exited $?"; cat "$T/err"; }
iacc=$(json "$T/infer.out" accuracy)
[ "$iacc" = "$acc" ] && ok "mge-infer accuracy $iacc == training's $acc" || bad "mge-infer $iacc != $acc"

echo "-- lenet, 2 epochs"
"$BIN/mge-train" "$ROOT/examples/fmnist-lenet.yaml" --json --out "$T/lenet" > "$T/lenet.out" 2>"$T/err" || { bad "lenet exited $?"; cat "$T/err"; }
lacc=$(json "$T/lenet.out" test_accuracy)
ge "$lacc" 0.86 && ok "lenet test accuracy $lacc >= 0.86" || bad "lenet test accuracy $lacc < 0.86"

echo "-- resume is bit-identical"
"$BIN/mge-train" "$ROOT/examples/fmnist-mlp.yaml" --set train.epochs=2 --json --out "$T/straight" > "$T/straight.out" 2>&1
"$BIN/mge-train" "$ROOT/examples/fmnist-mlp.yaml" --set train.epochs=1 --json --out "$T/half" > "$T/half.out" 2>&1
"$BIN/mge-train" "$ROOT/examples/fmnist-mlp.yaml" --set train.epochs=2 --resume "$T/half/latest.mgeckpt" --json --out "$T/resumed" > "$T/resumed.out" 2>&1
l1=$(json "$T/straight.out" final_loss); l2=$(json "$T/resumed.out" final_loss)
[ -n "$l1" ] && [ "$l1" = "$l2" ] && ok "final loss $l1 straight == $l2 resumed" || bad "final loss $l1 straight != $l2 resumed"
[ "$(json "$T/resumed.out" steps_run)" = 469 ] && ok "resumed run did only the second epoch" || bad "resumed run steps_run $(json "$T/resumed.out" steps_run)"
a1=$(json "$T/straight.out" test_accuracy); a2=$(json "$T/resumed.out" test_accuracy)
[ "$a1" = "$a2" ] && ok "test accuracy equal after resume ($a1)" || bad "accuracy $a1 != $a2"

echo "-- sublinear memory: recomputation leaves every loss bit-identical"
# "on" runs with MGE_REMAT_FORCE=1, the plan that recomputes the most: the examples' default
# plans recompute little or nothing where it does not pay (the MLP, LeNet), and a comparison
# without recomputation proves nothing
same_loss() { # name, spec, steps, extra sets...
    name=$1; spec=$2; steps=$3; shift 3
    prev=""
    for mode in false true light; do
        MGE_REMAT_FORCE=$([ $mode = true ] && echo 1) "$BIN/mge-train" "$spec" --json \
            --out "$T/sub-$mode" --set train.steps=$steps --set train.checkpoint_every=0 \
            --set memory.sublinear=$mode "$@" > "$T/sub-$mode.out" 2>&1
        l=$(json "$T/sub-$mode.out" final_loss)
        if [ -n "$prev" ] && [ "$l" != "$prev" ]; then bad "$name: sublinear=$mode loss $l != $prev"; return; fi
        prev=$l
    done
    n=$(MGE_REMAT_FORCE=1 "$BIN/mge-train" --plan "$spec" --set memory.sublinear=true "$@" 2>/dev/null |
        tail -n 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["chosen"]["recompute_ops"])')
    [ "${n:-0}" -gt 0 ] || { bad "$name: the forced sublinear plan recomputes nothing"; return; }
    [ -n "$prev" ] && ok "$name: loss $prev with recomputation off, on ($n ops recomputed) and light" || bad "$name: no loss"
}
same_loss mlp "$ROOT/examples/fmnist-mlp.yaml" 40
same_loss lenet "$ROOT/examples/fmnist-lenet.yaml" 20
same_loss deep-mlp "$ROOT/examples/deep-mlp.yaml" 3 --set model.layers=24 --set model.width=256

echo "-- the engine allocates what the planner predicts (allocation counter, within 5 %)"
close() { # name, summary file
    python3 - "$2" "$T/close" <<'P' && ok "$1: $(cat "$T/close")" || bad "$1: $(cat "$T/close")"
import json, sys
s = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
p, c = s["engine_planned_bytes"], s["engine_counted_bytes"]
open(sys.argv[2], "w").write("predicted %d bytes, counted %d (%+.2f %%)" % (p, c, 100.0 * (c / p - 1)))
sys.exit(0 if abs(c / p - 1) <= 0.05 else 1)
P
}
close mlp "$T/mlp.out"
close lenet "$T/lenet.out"
close "deep-mlp, recomputing" "$T/sub-true.out"
for lp in 128:25 256:14; do # layers:percent of the plain activations the default plan may keep
    "$BIN/mge-train" --plan "$ROOT/examples/deep-mlp.yaml" --set memory.sublinear=true \
        --set model.layers=${lp%:*} > "$T/dplan.json" 2>&1
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); p=d["plans"]; sys.exit(0 if p["sublinear"]["activation_bytes"] <= float(sys.argv[2]) / 100 * p["plain"]["activation_bytes"] and d["chosen"]["mode"] == "sublinear" else 1)' "$T/dplan.json" ${lp#*:} \
        && ok "deep-mlp (${lp%:*} layers): sublinear plan keeps <= ${lp#*:}% of the plain activations" || bad "deep-mlp sublinear plan: $(cat "$T/dplan.json")"
done
"$BIN/mge-train" --max-batch "$ROOT/examples/deep-mlp.yaml" --set memory.budget_mb=2048 > "$T/maxb.json" 2>&1
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["ratio"] >= 4 else 1)' "$T/maxb.json" \
    && ok "deep-mlp: >= 4x larger batch in 2 GiB with sublinear ($(cat "$T/maxb.json"))" || bad "max batch: $(cat "$T/maxb.json")"
expect_budget() {
    "$BIN/mge-train" "$ROOT/examples/deep-mlp.yaml" --set memory.budget_mb=1600 --set memory.sublinear=false > "$T/b.out" 2> "$T/b.err"; rc=$?
    [ $rc -eq 2 ] && grep -q "smallest feasible budget is" "$T/b.err" && ok "budget too small: exit 2, '$(head -c 160 "$T/b.err")'" || bad "budget: exit $rc, $(cat "$T/b.err")"
}
expect_budget

# the data section of the specs below (6 lines)
D=/usr/share/datasets/fashion-mnist
FMNIST_DATA="data:
  format: idx
  train_images: $D/train-images-idx3-ubyte.gz
  train_labels: $D/train-labels-idx1-ubyte.gz
  test_images: $D/t10k-images-idx3-ubyte.gz
  test_labels: $D/t10k-labels-idx1-ubyte.gz"

echo "-- resnet (ResNet-8, width 4): resume is bit-identical, running statistics included"
cat > "$T/rn.yaml" <<EOF
name: rn8
model: {type: resnet, depth: 8, width: 4}
$FMNIST_DATA
train:
  steps: 12
  batch_size: 32
  optimizer: {type: sgd, lr: 0.05, momentum: 0.9, weight_decay: 0.0005}
  seed: 3
EOF
"$BIN/mge-train" "$T/rn.yaml" --json --out "$T/rn-straight" > "$T/rn-straight.out" 2>"$T/err" || { bad "resnet exited $?"; cat "$T/err"; }
"$BIN/mge-train" "$T/rn.yaml" --set train.steps=5 --json --out "$T/rn-half" > /dev/null 2>"$T/err" || { bad "resnet (5 steps) exited $?"; cat "$T/err"; }
# the second half recomputes (sublinear): another plan, the same numbers
"$BIN/mge-train" "$T/rn.yaml" --set memory.sublinear=true --resume "$T/rn-half/latest.mgeckpt" --json --out "$T/rn-resumed" > "$T/rn-resumed.out" 2>"$T/err" || { bad "resnet resume exited $?"; cat "$T/err"; }
for k in final_loss test_loss test_accuracy; do
    v1=$(json "$T/rn-straight.out" $k); v2=$(json "$T/rn-resumed.out" $k)
    [ -n "$v1" ] && [ "$v1" = "$v2" ] && ok "resnet $k $v1 straight == $v2 resumed (sublinear)" || bad "resnet $k $v1 straight != $v2 resumed"
done
"$BIN/mge-infer" "$T/rn-straight/latest.mgeckpt" --json > "$T/rn-i1.out" 2>&1
"$BIN/mge-infer" "$T/rn-resumed/latest.mgeckpt" --json > "$T/rn-i2.out" 2>&1
i1=$(json "$T/rn-i1.out" accuracy); i2=$(json "$T/rn-i2.out" accuracy)
[ -n "$i1" ] && [ "$i1" = "$i2" ] && [ "$i1" = "$(json "$T/rn-straight.out" test_accuracy)" ] \
    && ok "mge-infer (running statistics) agrees: $i1" || bad "mge-infer accuracy $i1 / $i2 vs training $(json "$T/rn-straight.out" test_accuracy)"
"$BIN/mge-train" --plan "$T/rn.yaml" --set memory.sublinear=true > "$T/rnplan.json" 2>&1
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); p=d["plans"]; sys.exit(0 if d["chosen"]["mode"] == "sublinear" and p["sublinear"]["activation_bytes"] < p["plain"]["activation_bytes"] and d["chosen"]["recompute_ops"] > 0 else 1)' "$T/rnplan.json" \
    && ok "resnet --plan: sublinear keeps less than plain" || bad "resnet plan: $(cat "$T/rnplan.json")"

echo "-- clip_grad_norm + label_smoothing + AdamW without decay on 1-D parameters: loss falls, resume is bit-identical"
cat > "$T/ops.yaml" <<EOF
name: ops
model: {type: mlp, hidden: [64]}
$FMNIST_DATA
train:
  steps: 80
  batch_size: 64
  optimizer: {type: adamw, lr: 0.002, weight_decay: 0.1, decay_1d: false}
  clip_grad_norm: 0.5
  label_smoothing: 0.1
  seed: 5
EOF
"$BIN/mge-train" "$T/ops.yaml" --json --out "$T/ops-straight" > "$T/ops-straight.out" 2>"$T/err" || { bad "ops exited $?"; cat "$T/err"; }
"$BIN/mge-train" "$T/ops.yaml" --set train.steps=35 --json --out "$T/ops-half" > /dev/null 2>"$T/err" || { bad "ops (35 steps) exited $?"; cat "$T/err"; }
"$BIN/mge-train" "$T/ops.yaml" --resume "$T/ops-half/latest.mgeckpt" --json --out "$T/ops-resumed" > "$T/ops-resumed.out" 2>"$T/err" || { bad "ops resume exited $?"; cat "$T/err"; }
# mean loss of the first and last 10 steps, the grad_norm range, and how many steps clipped
msg=$(python3 -c '
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{\"step\"")]
first = sum(s["loss"] for s in steps[:10]) / 10
last = sum(s["loss"] for s in steps[-10:]) / 10
norms = [s["grad_norm"] for s in steps]
clipped = sum(n > 0.5 for n in norms)
print("loss %.4f (steps 1-10) -> %.4f (71-80); grad_norm %.3f..%.3f, %d of %d steps clipped" % (
    first, last, min(norms), max(norms), clipped, len(norms)))
sys.exit(0 if len(steps) == 80 and last < 0.8 * first and clipped > 0 else 1)' "$T/ops-straight.out") \
    && ok "$msg" || bad "ops run: $msg"
for k in final_loss test_loss test_accuracy; do
    v1=$(json "$T/ops-straight.out" $k); v2=$(json "$T/ops-resumed.out" $k)
    [ -n "$v1" ] && [ "$v1" = "$v2" ] && ok "ops $k $v1 straight == $v2 resumed" || bad "ops $k $v1 straight != $v2 resumed"
done
"$BIN/mge-train" "$T/ops.yaml" --set train.steps=10 --set train.optimizer.decay_1d=true --json --out "$T/ops-d1" > "$T/ops-d1.out" 2>&1
"$BIN/mge-train" "$T/ops.yaml" --set train.steps=10 --json --out "$T/ops-d0" > "$T/ops-d0.out" 2>&1
v1=$(json "$T/ops-d1.out" final_loss); v0=$(json "$T/ops-d0.out" final_loss)
[ -n "$v0" ] && [ "$v0" != "$v1" ] && ok "decay_1d: false changes the run (final loss $v0, $v1 with decay_1d: true)" || bad "decay_1d had no effect ($v0 vs $v1)"

echo "-- bad input: exit 2 and a message naming file, key and line"
expect2() { # name, needle, command...
    name=$1; needle=$2; shift 2
    "$@" > "$T/bad.out" 2> "$T/bad.err"; rc=$?
    if [ $rc -eq 2 ] && grep -q -- "$needle" "$T/bad.err"; then ok "$name: exit 2, '$(head -c 150 "$T/bad.err" | head -n 1)'"
    else bad "$name: exit $rc, stderr: $(cat "$T/bad.err")"; fi
}
printf 'name: x\nmodel: {type: mlp, hidden: [8]\ntrain: {steps: 1}\n' > "$T/broken.yaml"
expect2 "malformed YAML" "broken.yaml:" "$BIN/mge-train" "$T/broken.yaml"
sed 's/^  batch_size: 128/  batch_sise: 128/' "$ROOT/examples/fmnist-mlp.yaml" > "$T/unknown.yaml"
expect2 "unknown key" "unknown.yaml:15: train.batch_sise" "$BIN/mge-train" "$T/unknown.yaml"
expect2 "wrong type" "train.optimizer.lr" "$BIN/mge-train" "$ROOT/examples/fmnist-mlp.yaml" --set train.optimizer.lr=fast
expect2 "missing data file" "nothere.gz" "$BIN/mge-train" "$ROOT/examples/fmnist-mlp.yaml" --set data.train_images=$T/nothere.gz
head -c 100000 /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz > "$T/trunc.gz"
expect2 "truncated data file" "trunc.gz" "$BIN/mge-train" "$ROOT/examples/fmnist-mlp.yaml" --set data.train_images=$T/trunc.gz
head -c 5000 "$T/half/latest.mgeckpt" > "$T/trunc.mgeckpt"
expect2 "truncated checkpoint (resume)" "trunc.mgeckpt" "$BIN/mge-train" "$ROOT/examples/fmnist-mlp.yaml" --resume "$T/trunc.mgeckpt"
expect2 "truncated checkpoint (infer)" "trunc.mgeckpt" "$BIN/mge-infer" "$T/trunc.mgeckpt"
expect2 "checkpoint of another model" "fc1.w" "$BIN/mge-train" "$ROOT/examples/fmnist-mlp.yaml" --set 'model.hidden=[64]' --resume "$T/half/latest.mgeckpt"
expect2 "no such spec" "nope.yaml" "$BIN/mge-train" "$T/nope.yaml"
for n in 0 -1 2x "" 4097 99999999999; do
    expect2 "--threads '$n'" "--threads: expected an integer between 1 and 4096, got '$n'" \
        "$BIN/mge-train" "$ROOT/examples/fmnist-mlp.yaml" --threads "$n"
done
expect2 "label smoothing out of range" "train.label_smoothing=1: expected a number in" "$BIN/mge-train" "$T/ops.yaml" --set train.label_smoothing=1
sed 's/clip_grad_norm: 0.5/clip_grad_norm: -1/' "$T/ops.yaml" > "$T/ops-bad.yaml"
expect2 "clip_grad_norm not > 0" "ops-bad.yaml:13: train.clip_grad_norm: expected a number > 0" "$BIN/mge-train" "$T/ops-bad.yaml"
expect2 "resnet depth not 6n+2" "rn.yaml:2: model.depth: expected 6n+2" "$BIN/mge-train" "$T/rn.yaml" --set model.depth=9

echo "train_cli: $passes passed, $fails failed"
[ $fails -eq 0 ]
