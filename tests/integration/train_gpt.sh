#!/bin/sh
# train_gpt.sh: a tiny GPT (model type gpt) on real text, the bytes of Debian's fortunes-min
# files (data.format text): the loss falls over 40 steps and a held-out test_loss is reported
# with tokens_per_sec (and at each checkpoint), and mge-infer reports the same loss and its
# perplexity from the checkpoint and samples text from it (--generate); a run resumed from its step-20 checkpoint is
# bit-identical to the uninterrupted one (windows come from (seed, step, row)); 2 MPI ranks
# match one process; a uint16 token file (data.format tokens) trains; bad token files and
# specs exit 2 naming the file, the offset or the key.
. "$(dirname "$0")/lib/train.sh"
F=/usr/share/games/fortunes
if [ ! -f $F/fortunes ] || [ ! -f $F/literature ]; then
    echo "skip - fortunes-min is not installed (deploy/install-deps.sh installs it)"; exit 77
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# expect_2 NAME TEXT CMD...: CMD exits 2 and its stderr contains TEXT
expect_2() {
    name=$1; text=$2; shift 2
    "$@" > "$T/x.out" 2> "$T/x.err"; rc=$?
    if [ $rc -eq 2 ] && grep -qF -- "$text" "$T/x.err"; then ok "$name: exit 2, '$(head -n 1 "$T/x.err")'"
    else bad "$name: exit $rc, stderr '$(cat "$T/x.err")' lacks '$text'"; fi
}
# loss_at FILE STEP: the loss line of STEP, as printed
loss_at() { grep "^{\"step\":$2," "$1" | head -n 1 | sed 's/.*"loss":\([^,]*\),.*/\1/'; }

cat > "$T/gpt.yaml" <<EOF
name: gpt-tiny
model: {type: gpt, layers: 2, heads: 2, d_model: 32, context: 32, vocab: 256}
data:
  format: text
  train_files: [$F/fortunes, $F/literature]
train:
  steps: 40
  batch_size: 8
  optimizer: {type: adamw, lr: 0.003, weight_decay: 0.1}
  lr_schedule: {type: cosine, warmup_steps: 5}
  seed: 7
  checkpoint_every: 20
resources: {device: cpu}
EOF

echo "== train 40 steps on the fortunes text"
"$BIN/mge-train" "$T/gpt.yaml" --json --out "$T/a" > "$T/a.out" 2> "$T/a.err"
rc=$?
if [ $rc -ne 0 ]; then bad "mge-train exited $rc: $(tail -n 3 "$T/a.err")"; else
    l1=$(loss_at "$T/a.out" 1); l40=$(json "$T/a.out" final_loss)
    tl=$(json "$T/a.out" test_loss); tps=$(json "$T/a.out" tokens_per_sec)
    # ln 256 = 5.55 at the start; 40 small steps learn the byte statistics (about 3.3)
    if lt "$l40" "$(python3 -c "print($l1 - 1.0)")"; then ok "loss falls: step 1 $l1, step 40 $l40"
    else bad "loss did not fall by 1 nat: step 1 $l1, step 40 $l40"; fi
    if lt "$tl" 4.5 && ge "$tl" 1.0; then ok "held-out test_loss $tl (last 10% of the text)"
    else bad "test_loss $tl"; fi
    if ge "$tps" 1; then ok "tokens_per_sec $tps"; else bad "tokens_per_sec $tps"; fi
    if grep -q '^{"epoch":0,"step":20,"test_loss":' "$T/a.out"; then
        ok "held-out loss at the step-20 checkpoint too: $(grep '"step":20,"test_loss"' "$T/a.out")"
    else bad "no test_loss line at the step-20 checkpoint"; fi
fi

echo "== mge-infer on the final checkpoint: the same held-out loss, and its perplexity"
"$BIN/mge-infer" "$T/a/latest.mgeckpt" --json > "$T/infer.out" 2> "$T/infer.err"
rc=$?
il=$(json "$T/infer.out" loss 2>/dev/null); ip=$(json "$T/infer.out" perplexity 2>/dev/null)
tl=$(json "$T/a.out" test_loss)
if [ $rc -eq 0 ] && python3 -c "import math,sys; a,b,p=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b)<=1e-5 and abs(p-math.exp(a))<=1e-3*p else 1)" "$il" "$tl" "$ip"; then
    ok "mge-infer: loss $il (training's test_loss $tl), perplexity $ip"
else bad "mge-infer exited $rc: loss '$il' perplexity '$ip' vs test_loss $tl: $(cat "$T/infer.err")"; fi

echo "== mge-infer --generate: 40 bytes after the prompt, the same for the same seed"
"$BIN/mge-infer" "$T/a/latest.mgeckpt" --generate 40 --prompt "The " > "$T/gen1" 2> "$T/gen.err"
rc=$?
"$BIN/mge-infer" "$T/a/latest.mgeckpt" --generate 40 --prompt "The " > "$T/gen2" 2>> "$T/gen.err"
n=$(wc -c < "$T/gen1")
if [ $rc -eq 0 ] && [ "$n" -eq 44 ] && [ "$(head -c 4 "$T/gen1")" = "The " ] && cmp -s "$T/gen1" "$T/gen2"; then
    ok "generated $n bytes, reproducible: '$(tr -c '[:print:]' '?' < "$T/gen1")'"
else bad "--generate exited $rc, $n bytes, or runs differ: $(cat "$T/gen.err")"; fi
cat > "$T/m.yaml" <<EOF
name: m
model: {type: mlp, hidden: [4]}
data: {format: synthetic, input_dim: 4, classes: 2, train_size: 8, test_size: 0}
train: {steps: 1, batch_size: 4, optimizer: {type: sgd, lr: 0.1}, eval: false}
EOF
"$BIN/mge-train" "$T/m.yaml" --out "$T/m" > /dev/null 2>&1
expect_2 "--generate on an mlp" "--generate needs a gpt checkpoint, this is a mlp" \
    "$BIN/mge-infer" "$T/m/latest.mgeckpt" --generate 5
expect_2 "--generate 0" "--generate: expected 1 to 1000000 tokens, got '0'" \
    "$BIN/mge-infer" "$T/a/latest.mgeckpt" --generate 0

echo "== resume from the step-20 checkpoint: steps 21..40 bit-identical"
"$BIN/mge-train" "$T/gpt.yaml" --json --out "$T/b" --resume "$T/a/ckpt-000020.mgeckpt" \
    > "$T/b.out" 2> "$T/b.err"
rc=$?
if [ $rc -ne 0 ]; then bad "resumed mge-train exited $rc: $(tail -n 3 "$T/b.err")"; else
    same=1
    for s in 21 30 39 40; do
        [ "$(loss_at "$T/a.out" $s)" = "$(loss_at "$T/b.out" $s)" ] || same=0
    done
    fa=$(json "$T/a.out" final_loss); fb=$(json "$T/b.out" final_loss)
    ta=$(json "$T/a.out" test_loss); tb=$(json "$T/b.out" test_loss)
    if [ $same -eq 1 ] && [ "$fa" = "$fb" ] && [ "$ta" = "$tb" ]; then
        ok "resumed run: final loss $fb, test_loss $tb, as the uninterrupted run"
    else bad "resumed run differs: final $fa vs $fb, test $ta vs $tb"; fi
fi

echo "== data parallel: 2 MPI ranks take rows of each global batch and match one process"
MPIRUN=$(command -v mpirun.openmpi || command -v mpirun)
if [ -z "$MPIRUN" ]; then
    echo "  skip - mpirun (Open MPI) is not installed"
else
    OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        timeout 120 "$MPIRUN" --oversubscribe --bind-to none -np 2 "$BIN/mge-train" "$T/gpt.yaml" \
        --set distributed.backend=mpi --set train.steps=30 --json --out "$T/dp" \
        > "$T/dp.out" 2> "$T/dp.err"
    rc=$?
    OMP_NUM_THREADS=1 "$BIN/mge-train" "$T/gpt.yaml" --set train.steps=30 --json --out "$T/sp" \
        > "$T/sp.out" 2> "$T/sp.err"
    if [ $rc -ne 0 ]; then bad "2 ranks exited $rc: $(tail -n 3 "$T/dp.err")"; else
        # the split sums round differently from one process (~1e-7), nothing more
        d=$(python3 - "$T/sp.out" "$T/dp.out" <<'P'
import json, sys
def load(f):
    ls = [json.loads(l) for l in open(f) if l.startswith("{")]
    return [l["loss"] for l in ls if "loss" in l and "step" in l]
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == len(b) == 30, (len(a), len(b))
print("%.3g" % max(abs(x - y) / abs(x) for x, y in zip(a, b)))
P
)
        if [ -n "$d" ] && lt "$d" 1e-5; then ok "30 steps on 2 ranks: losses within $d (relative) of one process"
        else bad "2 ranks differ from one process: $d"; fi
    fi
fi

echo "== data.format tokens: uint16 ids, a separate test file"
python3 - "$T" <<'PY'
import struct, sys
t = sys.argv[1]
text = open("/usr/share/games/fortunes/fortunes", "rb").read()
ids = [b + 1000 * (i % 3) for i, b in enumerate(text)]  # ids up to 2255: not bytes
open(t + "/train.bin", "wb").write(struct.pack("<%dH" % len(ids), *ids))
open(t + "/test.bin", "wb").write(struct.pack("<%dH" % 4000, *ids[:4000]))
bad = ids[:500]; bad[123] = 3000
open(t + "/bad_id.bin", "wb").write(struct.pack("<%dH" % len(bad), *bad))
open(t + "/odd.bin", "wb").write(b"\x01\x00\x02")
open(t + "/short.bin", "wb").write(struct.pack("<10H", *range(10)))
PY
TOK="--set data.format=tokens --set data.train_files=[$T/train.bin] --set data.dtype=uint16 --set model.vocab=3000"
# shellcheck disable=SC2086
"$BIN/mge-train" "$T/gpt.yaml" $TOK --set data.test_file="$T/test.bin" --set train.steps=5 \
    --json --out "$T/c" > "$T/c.out" 2> "$T/c.err"
rc=$?
if [ $rc -eq 0 ] && ge "$(json "$T/c.out" test_loss)" 1.0; then
    ok "uint16 tokens (vocab 3000) train; test_loss $(json "$T/c.out" test_loss) on test.bin"
else bad "tokens run exited $rc: $(tail -n 3 "$T/c.err")"; fi

echo "== bad input: exit 2 naming the file, the offset or the key"
# shellcheck disable=SC2086
expect_2 "token id >= vocab" "bad_id.bin: token id 3000 at byte offset 246 (token 123) is not below model.vocab 3000" \
    "$BIN/mge-train" "$T/gpt.yaml" $TOK --set "data.train_files=[$T/bad_id.bin]" --out "$T/x"
expect_2 "text bytes >= a small vocab" "fortunes: token id" \
    "$BIN/mge-train" "$T/gpt.yaml" --set model.vocab=64 --out "$T/x"
# shellcheck disable=SC2086
expect_2 "odd-sized uint16 file" "odd.bin: size 3 is not a positive multiple of 2" \
    "$BIN/mge-train" "$T/gpt.yaml" $TOK --set "data.train_files=[$T/odd.bin]" --out "$T/x"
# shellcheck disable=SC2086
expect_2 "fewer tokens than a window" "short.bin: 10 training tokens: model.context 32 needs at least 33" \
    "$BIN/mge-train" "$T/gpt.yaml" $TOK --set "data.train_files=[$T/short.bin]" \
    --set data.test_fraction=0 --out "$T/x"
expect_2 "missing file" "$T/none.txt" \
    "$BIN/mge-train" "$T/gpt.yaml" --set "data.train_files=[$T/none.txt]" --out "$T/x"
sed 's/^model: .*/model: {type: mlp, hidden: [8]}/' "$T/gpt.yaml" > "$T/mlp.yaml"
expect_2 "text data for an mlp" "mlp.yaml:4: data.format: data.format tokens and text are for model type gpt" \
    "$BIN/mge-train" "$T/mlp.yaml" --out "$T/x"
expect_2 "epochs for gpt" "--set train.epochs=1: model type gpt draws random windows" \
    "$BIN/mge-train" "$T/gpt.yaml" --set train.epochs=1 --out "$T/x"
expect_2 "d_model not a multiple of heads" "model.d_model: expected a multiple of model.heads (3)" \
    "$BIN/mge-train" "$T/gpt.yaml" --set model.heads=3 --out "$T/x"
expect_2 "deterministic mode" "distributed.deterministic: not available for model type gpt" \
    "$BIN/mge-train" "$T/gpt.yaml" --set distributed.deterministic=true --out "$T/x"
expect_2 "dtype with text" "--set data.dtype=uint32: not used with data.format text" \
    "$BIN/mge-train" "$T/gpt.yaml" --set data.dtype=uint32 --out "$T/x"

echo "train_gpt: $passes passed, $fails failed"
[ $fails -eq 0 ]
