#!/bin/sh
# train_graph_gpt.sh: the GPT written as a graph spec (examples/gpt-text.graph.yaml: tokens,
# embedding, pos_embedding, layernorm, causal_attention, GELU, tied_linear nodes) trains
# bit-identically to the zoo GPT (examples/gpt-text.yaml): the same loss at every step and the
# same weights after the run, byte for byte, at a small size (d_model and context 32) over 20
# steps with dropout, and the real example files for 3 steps; the example's --plan equals the
# zoo's; mge-infer reads the graph's checkpoint (the same held-out loss as the zoo's, and
# --generate); bad GPT nodes exit 2 naming the node, the key and the line.
. "$(dirname "$0")/lib/train.sh"
ROOT=$(pwd)
F=/usr/share/games/fortunes
if [ ! -f $F/fortunes ] || [ ! -f $F/literature ] || [ ! -f $F/riddles ]; then
    echo "skip - fortunes-min is not installed (deploy/install-deps.sh installs it)"; exit 77
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
ZOO="$ROOT/examples/gpt-text.yaml"
G="$ROOT/examples/gpt-text.graph.yaml"

echo "-- small GPT (4 blocks, d_model 32, context 32, dropout 0.1): zoo and graph, 20 steps"
# every 128 of the example (d_model, context, out_features) becomes 32; 384 -> 96, 512 -> 128
sed 's/: 128\([,}]\)/: 32\1/g; s/out_features: 384/out_features: 96/; s/out_features: 512/out_features: 128/' \
    "$G" > "$T/small.graph.yaml"
sed 's/^  d_model: 128$/  d_model: 32/; s/^  context: 128$/  context: 32/' "$ZOO" > "$T/small.yaml"
twin gpt-small "$T/small.yaml" "$T/small.graph.yaml" --set train.steps=20 --set train.batch_size=8 --set train.log_every=1 \
    --set train.lr_schedule.warmup_steps=5

echo "-- the example files themselves: zoo and graph, 3 steps of 2 windows"
twin gpt-text "$ZOO" "$G" --set train.steps=3 --set train.batch_size=2 --set train.log_every=1

echo "-- --plan: the graph example plans as the zoo model does"
"$BIN/mge-train" --plan "$ZOO" > "$T/plan-zoo.json" 2>"$T/err" || { bad "zoo --plan exited $?"; cat "$T/err"; }
"$BIN/mge-train" --plan "$G" > "$T/plan-graph.json" 2>"$T/err" || { bad "graph --plan exited $?"; cat "$T/err"; }
peak=$(json "$T/plan-zoo.json" peak_bytes)
[ -n "$peak" ] && cmp -s "$T/plan-zoo.json" "$T/plan-graph.json" &&
    ok "the same plan, byte for byte (peak $peak bytes, $(json "$T/plan-zoo.json" ops) ops)" ||
    { bad "plans differ"; diff "$T/plan-zoo.json" "$T/plan-graph.json" | head -4; }

echo "-- mge-infer reads the graph's checkpoint"
"$BIN/mge-infer" "$T/gpt-small-zoo/latest.mgeckpt" --json > "$T/infer-zoo.out" 2>"$T/err" ||
    { bad "mge-infer (zoo) exited $?"; cat "$T/err"; }
"$BIN/mge-infer" "$T/gpt-small-graph/latest.mgeckpt" --json > "$T/infer-graph.out" 2>"$T/err" ||
    { bad "mge-infer (graph) exited $?"; cat "$T/err"; }
l1=$(json "$T/infer-zoo.out" loss); l2=$(json "$T/infer-graph.out" loss)
[ -n "$l1" ] && [ "$l1" = "$l2" ] && ok "held-out loss $l2 from the graph's checkpoint == the zoo's $l1" ||
    bad "mge-infer loss: graph '$l2', zoo '$l1'"
"$BIN/mge-infer" "$T/gpt-small-graph/latest.mgeckpt" --generate 40 --prompt "The " > "$T/gen.out" 2>"$T/err"
rc=$?
[ $rc = 0 ] && [ "$(wc -c < "$T/gen.out")" -gt 4 ] && ok "--generate samples $(wc -c < "$T/gen.out") bytes" ||
    { bad "--generate exited $rc"; cat "$T/err"; }

echo "-- bad GPT nodes: exit 2, naming node, key and line"
line() { grep -n "$1" "$G" | head -1 | cut -d: -f1; }
idx() { python3 -c '
import sys
n = -1
for l in open(sys.argv[1]):
    if l.startswith("    - {"):
        n += 1
        if "name: " + sys.argv[2] + "," in l:
            print(n); break' "$G" "$1"; }
# refused SED NEEDLE WHAT: the GPT graph edited by SED must exit 2 with NEEDLE on stderr
refused() {
    sed "$1" "$G" > "$T/bad.yaml"
    "$BIN/mge-train" "$T/bad.yaml" --set train.steps=1 > "$T/bad.out" 2>"$T/bad.err"; rc=$?
    if [ $rc = 2 ] && grep -qF "$2" "$T/bad.err"; then ok "$3: $(head -1 "$T/bad.err")"
    else bad "$3: exit $rc, stderr: $(cat "$T/bad.err")"; fi
}
n=lm_head
refused 's/tied_to: transformer.wte}/tied_to: transformer.ln_f}/' \
    "bad.yaml:$(line "name: $n,"): model.nodes[$(idx $n)].tied_to: node \`$n\`: \`transformer.ln_f\` is a layernorm node, not an embedding" \
    "a tied output whose embedding is not an embedding node"
n=transformer.wpe
refused 's/op: pos_embedding, inputs: transformer.wte, context: 128/op: pos_embedding, inputs: transformer.wte, context: 64/' \
    "bad.yaml:$(line "name: $n,"): model.nodes[$(idx $n)].context: node \`$n\`: context 64, but input \`transformer.wte\` of shape [16,128,128] has 128 tokens per window" \
    "a context mismatch"
n=transformer.wte
refused 's/inputs: idx, vocab: 256/inputs: idx, vocab: 255/' \
    "bad.yaml:$(line "name: $n,"): model.nodes[$(idx $n)].vocab: node \`$n\`: vocab 255 does not match the vocab of tokens node \`idx\` (256)" \
    "a vocab mismatch"
n=transformer.h.0.attn.qkv
refused 's/inputs: transformer.h.0.ln_1, out_features: 384/inputs: transformer.h.0.ln_1, out_features: 128/' \
    "bad.yaml:$(line "name: $n,"): model.nodes[$(idx $n)].inputs: node \`$n\`: input \`transformer.h.0.attn.c_attn\` has shape [16,128,128]; causal_attention takes 3 dims (N, T, 3 d_model)" \
    "attention on the wrong shape"
n=transformer.wte
refused 's/op: embedding, inputs: idx/op: embedding, inputs: transformer.wpe/' \
    "bad.yaml:$(line "name: $n,"): model.nodes[$(idx $n)].inputs: node \`$n\`: the graph has a cycle" \
    "an embedding of its own output"
refused 's/op: tokens, context: 128, vocab: 256/op: input, shape: [128]/' \
    "data.format tokens and text give token ids: read them with op tokens" "op input on text"

echo "train_graph_gpt: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
