#!/bin/sh
# sublinear_zoo.sh: recomputation on the zoo's residual models through mge-train. An 8-layer GPT
# (dropout on) and a ResNet-56 train with memory.sublinear true and false to the same losses,
# bit for bit, step by step; --plan says the 8-layer GPT keeps <= 30 % of its plain activations;
# --max-batch fits >= 3x the sequences of the 4-layer GPT (examples/gpt-text.yaml) in 200 MiB.
. "$(dirname "$0")/lib/train.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
F=/usr/share/games/fortunes
if [ ! -f $F/fortunes ] || [ ! -f $F/literature ]; then
    echo "skip - fortunes-min is not installed (deploy/install-deps.sh installs it)"; exit 77
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

cat > "$T/gpt.yaml" <<EOF
name: gpt-sub
model: {type: gpt, layers: 8, heads: 2, d_model: 32, context: 32, vocab: 256, dropout: 0.1}
data:
  format: text
  train_files: [$F/fortunes, $F/literature]
  test_fraction: 0.1
train: {steps: 4, batch_size: 8, optimizer: {type: adamw, lr: 0.003}, seed: 3}
resources: {device: cpu}
EOF
cat > "$T/rn.yaml" <<EOF
name: rn56-sub
model: {type: resnet, depth: 56, width: 4}
data: {format: synthetic, train_size: 64, test_size: 0, image: [1, 12, 12], classes: 10}
train: {steps: 3, batch_size: 16, optimizer: {type: sgd, lr: 0.05, momentum: 0.9}, seed: 5}
resources: {device: cpu}
EOF

# same NAME SPEC: the sublinear plan recomputes, and per-step losses with and without it are
# identical
same() {
    "$BIN/mge-train" --plan "$2" --set memory.sublinear=true > "$T/$1-plan.json" 2>&1
    ops=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["chosen"]["recompute_ops"])' "$T/$1-plan.json")
    if [ "${ops:-0}" -gt 0 ]; then ok "$1: the sublinear plan recomputes $ops ops"
    else bad "$1: the sublinear plan recomputes nothing: $(cat "$T/$1-plan.json")"; fi
    for m in false true; do
        "$BIN/mge-train" "$2" --json --out "$T/$1-$m" --set memory.sublinear=$m \
            > "$T/$1-$m.out" 2> "$T/$1-$m.err" || bad "$1 sublinear=$m: $(tail -n 2 "$T/$1-$m.err")"
        losses "$T/$1-$m.out" > "$T/$1-$m.loss"
    done
    n=$(wc -l < "$T/$1-false.loss")
    if [ "$n" -ge 3 ] && cmp -s "$T/$1-false.loss" "$T/$1-true.loss"; then
        ok "$1: $n step losses bit-identical with recomputation ($(tail -n 1 "$T/$1-true.loss"))"
    else bad "$1: losses differ: $(paste "$T/$1-false.loss" "$T/$1-true.loss" | tr '\n' ';')"; fi
}
same gpt "$T/gpt.yaml"
same resnet56 "$T/rn.yaml"

"$BIN/mge-train" --plan "$ROOT/examples/gpt-text.yaml" --set model.layers=8 \
    --set memory.sublinear=true > "$T/plan.json" 2>&1
if python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); p=d["plans"]; sys.exit(0 if d["chosen"]["mode"] == "sublinear" and p["sublinear"]["activation_bytes"] <= 0.30 * p["plain"]["activation_bytes"] else 1)' "$T/plan.json"; then
    ok "8-layer GPT: the sublinear plan keeps <= 30 % of the plain activations ($(python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["plans"]; print("%.1f of %.1f MiB" % (p["sublinear"]["activation_bytes"] / 1048576, p["plain"]["activation_bytes"] / 1048576))' "$T/plan.json"))"
else bad "8-layer GPT plan: $(cat "$T/plan.json")"; fi

"$BIN/mge-train" --max-batch "$ROOT/examples/gpt-text.yaml" --set memory.budget_mb=200 \
    > "$T/maxb.json" 2>&1
if python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["ratio"] >= 3 else 1)' "$T/maxb.json"; then
    ok "4-layer GPT: >= 3x the batch in 200 MiB with sublinear ($(cat "$T/maxb.json"))"
else bad "4-layer GPT max batch: $(cat "$T/maxb.json")"; fi

echo "sublinear_zoo: $passes passed, $fails failed"
[ $fails -eq 0 ]
