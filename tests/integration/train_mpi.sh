#!/bin/sh
# train_mpi.sh: static data parallelism with mpirun on one machine: 1, 2 and 4 ranks train the
# same spec, seed and global batch to the same losses (1e-5 relative after 200 steps) with
# uneven shards, a rank with no rows, dropout and Adam; rank 0 alone reports; resume with
# another world size; --profile traces every rank; a failing rank ends the job promptly;
# deterministic mode (distributed.deterministic): one process, 1, 2 and 3 ranks, and a run
# that goes 1 -> 3 -> 2 ranks through checkpoints, all bit-identical at every step. With
# train.clip_grad_norm (and label smoothing) 2 ranks match one process in both modes.
# Exit 77 (skip) when Open MPI's mpirun is not installed.
. "$(dirname "$0")/lib/train.sh"

MPIRUN=$(command -v mpirun.openmpi || command -v mpirun)
if [ -z "$MPIRUN" ]; then
    echo "skip: mpirun (Open MPI) is not installed"; exit 77
fi
# 2 cores: every rank one kernel thread, no pinning (two ranks pinned to core 0 crawl)
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
mpi() { # ranks, args...
    n=$1; shift
    timeout 120 "$MPIRUN" --oversubscribe --bind-to none -np "$n" "$@"
}

# 1003 samples in batches of 50: the last batch of each epoch has 3 rows, so with 4 ranks
# one rank gets none; 50 / 4 is uneven too. Dropout masks must follow the global rows.
cat > "$T/sgd.yaml" <<'Y'
name: dp-sgd
model: {type: mlp, hidden: [64, 32], dropout: 0.1}
data: {format: synthetic, input_dim: 100, classes: 20, train_size: 1003, test_size: 200}
train:
  steps: 200
  batch_size: 50
  optimizer: {type: sgd, lr: 0.01, momentum: 0.9}
  seed: 7
Y
cat > "$T/adam.yaml" <<'Y'
name: dp-adam
model: {type: mlp, hidden: [48], activation: tanh}
data: {format: synthetic, input_dim: 64, classes: 10, train_size: 997, test_size: 0}
train:
  steps: 200
  batch_size: 37
  optimizer: {type: adam, lr: 0.001, weight_decay: 0.01}
  seed: 11
  eval: false
Y

# compare A B: max relative difference of the per-step losses and of the final loss
compare() {
    python3 - "$1" "$2" <<'P'
import json, sys
def load(f):
    lines = [json.loads(l) for l in open(f)]
    return [l["loss"] for l in lines if "step" in l and "loss" in l], lines[-1]["final_loss"]
a, fa = load(sys.argv[1]); b, fb = load(sys.argv[2])
assert len(a) == len(b) == 200, (len(a), len(b))
m = max(abs(x - y) / abs(y) for x, y in zip(a, b))
print("%.3g %.3g %.9g %.9g" % (abs(fa - fb) / abs(fb), m, fa, fb))
P
}
within() { python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)' "$1" "$2"; }

for spec in sgd adam; do
    echo "-- $spec: 1, 2 and 4 ranks against one process"
    "$BIN/mge-train" "$T/$spec.yaml" --json --out "$T/$spec.0" > "$T/$spec.0.out" 2>"$T/err" \
        || { bad "$spec plain run exited $?"; cat "$T/err"; }
    for n in 1 2 4; do
        set -- --set distributed.pack_mb=0.004 # several packs even for this small model
        [ "$n" = 1 ] && set -- --set distributed.backend=mpi # auto would pick local
        mpi "$n" "$BIN/mge-train" "$T/$spec.yaml" --json --out "$T/$spec.$n" "$@" \
            > "$T/$spec.$n.out" 2>"$T/err" || { bad "$spec $n ranks exited $?"; cat "$T/err"; continue; }
        r=$(compare "$T/$spec.$n.out" "$T/$spec.0.out") || { bad "$spec $n ranks: cannot compare"; continue; }
        set -- $r
        if within "$1" 1e-5 && within "$2" 1e-5; then
            ok "$spec $n ranks: final loss $3 vs $4 (rel $1), max per-step rel diff $2"
        else
            bad "$spec $n ranks: final loss $3 vs $4 (rel $1), max per-step rel diff $2 > 1e-5"
        fi
        steps=$(grep -c '^{"step":' "$T/$spec.$n.out")
        [ "$steps" = 200 ] && ok "$spec $n ranks: rank 0 alone printed the 200 step lines" \
            || bad "$spec $n ranks: $steps step lines (200 expected)"
        grep -q "\"ranks\":$n," "$T/$spec.$n.out" && ok "$spec $n ranks: summary says ranks $n" || bad "$spec $n ranks: no ranks in summary"
    done
done
[ "$(ls "$T/sgd.4" | grep -c mgeckpt)" -ge 1 ] && ok "rank 0 wrote the checkpoint" || bad "no checkpoint from 4 ranks"

echo "-- resume a 2-rank checkpoint with 4 ranks"
mpi 2 "$BIN/mge-train" "$T/sgd.yaml" --set train.steps=100 --json --out "$T/half" > "$T/half.out" 2>"$T/err" || bad "half run exited $?"
mpi 4 "$BIN/mge-train" "$T/sgd.yaml" --resume "$T/half/latest.mgeckpt" --json --out "$T/res" > "$T/res.out" 2>"$T/err" \
    || { bad "resumed run exited $?"; cat "$T/err"; }
r=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["final_loss"], json.loads(open(sys.argv[2]).read().splitlines()[-1])["final_loss"])' "$T/res.out" "$T/sgd.0.out")
set -- $r
rel=$(python3 -c 'import sys; a,b=map(float,sys.argv[1:]); print(abs(a-b)/abs(b))' "$1" "$2")
within "$rel" 1e-5 && ok "2 ranks to step 100 then 4 ranks to 200: final loss $1 vs $2 (rel $rel)" || bad "resume: $1 vs $2 (rel $rel)"

echo "-- clip_grad_norm + label_smoothing: 2 ranks, several packs, against one process"
# the global norm is the reduced gradient's: with clipping the packed path updates only after
# the last pack; 0.5 clips about half of adam.yaml's steps
CLIP="--set train.clip_grad_norm=0.5 --set train.label_smoothing=0.1"
"$BIN/mge-train" "$T/adam.yaml" $CLIP --json --out "$T/clip.0" > "$T/clip.0.out" 2>"$T/err" \
    || { bad "clip one process exited $?"; cat "$T/err"; }
if mpi 2 "$BIN/mge-train" "$T/adam.yaml" $CLIP --set distributed.pack_mb=0.004 --json \
    --out "$T/clip.2" > "$T/clip.2.out" 2>"$T/err"; then
    r=$(compare "$T/clip.2.out" "$T/clip.0.out") && set -- $r
    if [ -n "$r" ] && within "$1" 1e-5 && within "$2" 1e-5; then
        ok "clip 2 ranks: final loss $3 vs $4 (rel $1), max per-step rel diff $2"
    else
        bad "clip 2 ranks: $r (want <= 1e-5)"
    fi
    r=$(python3 -c '
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{\"step\"")]
n = [s["grad_norm"] for s in steps]
print(sum(x > 0.5 for x in n), len(n))' "$T/clip.2.out") && set -- $r
    [ -n "$r" ] && [ "$1" -gt 0 ] && ok "clip 2 ranks: grad_norm on every step line, $1 of $2 steps clipped" \
        || bad "clip 2 ranks: grad_norm lines: $r"
else
    bad "clip 2 ranks exited $?"; cat "$T/err"
fi

echo "-- deterministic mode: bit-identical losses and final state for any world size"
# sgd.yaml (dropout, SGD with momentum, 1003 samples in batches of 50) for 60 steps: batch 21
# of each epoch has 3 rows, so 9 of the 12 micro-shards are empty and, on 2 and 3 ranks, so
# is a rank. Every run below starts with these overrides (later --set win).
DET="--set distributed.deterministic=true --set train.steps=60 --set train.optimizer.lr=0.1
     --set train.checkpoint_every=20"
# same A B [FROM]: the step lines from step FROM on (default 1) of B are those of A, with the
# loss's exact bits ("loss_bits", %a) equal, and the final state hashes are equal
same() {
    python3 - "$1" "$2" "${3:-1}" <<'P'
import json, sys
def load(f):
    lines = [json.loads(l) for l in open(f)]
    steps = {l["step"]: l for l in lines if "loss_bits" in l}
    return steps, lines[-1]
a, sa = load(sys.argv[1]); b, sb = load(sys.argv[2]); first = int(sys.argv[3])
want = list(range(first, 61))
assert sorted(b) == want, ("steps", sorted(b)[:3], len(b))
diff = [s for s in want if a[s]["loss_bits"] != b[s]["loss_bits"]]
assert not diff, "loss bits differ from step %d: %s vs %s" % (diff[0], a[diff[0]]["loss_bits"], b[diff[0]]["loss_bits"])
assert sa["state_hash"] == sb["state_hash"], (sa["state_hash"], sb["state_hash"])
assert sa["final_loss"] < 0.8 * a[1]["loss"], "did not learn: %g -> %g" % (a[1]["loss"], sa["final_loss"])
print("%d steps, loss %s -> %s, state %s" % (len(want), a[first]["loss_bits"], a[60]["loss_bits"], sb["state_hash"]))
P
}
"$BIN/mge-train" "$T/sgd.yaml" $DET --json --out "$T/det.0" > "$T/det.0.out" 2>"$T/err" \
    || { bad "deterministic one process exited $?"; cat "$T/err"; }
grep -q '"backend":"local","ranks":1,' "$T/det.0.out" && ok "deterministic one process ran on the local backend" \
    || bad "deterministic one process: not local"
# ranks may run different thread counts (a worker's cpus): the kernels' sums do not depend on it
"$BIN/mge-train" "$T/sgd.yaml" $DET --threads 2 --json --out "$T/det.t2" > "$T/det.t2.out" 2>"$T/err" \
    || { bad "deterministic 2 threads exited $?"; cat "$T/err"; }
r=$(same "$T/det.0.out" "$T/det.t2.out" 2>&1) && ok "deterministic 2 threads = 1 thread: $r" \
    || bad "deterministic 2 threads: $r"
for n in 1 2 3; do
    mpi "$n" "$BIN/mge-train" "$T/sgd.yaml" $DET --json --out "$T/det.$n" --set distributed.backend=mpi \
        > "$T/det.$n.out" 2>"$T/err" || { bad "deterministic $n ranks exited $?"; cat "$T/err"; continue; }
    r=$(same "$T/det.0.out" "$T/det.$n.out" 2>&1) && ok "deterministic $n ranks = one process: $r" \
        || bad "deterministic $n ranks: $r"
done
# 1 rank to step 20 (its own run, stopped there), 3 ranks to 40, 2 ranks to 60
"$BIN/mge-train" "$T/sgd.yaml" $DET --set train.steps=20 --json --out "$T/el.1" > "$T/el.1.out" 2>"$T/err" \
    || { bad "elastic 1 rank exited $?"; cat "$T/err"; }
mpi 3 "$BIN/mge-train" "$T/sgd.yaml" $DET --set train.steps=40 --resume "$T/el.1/latest.mgeckpt" --json \
    --out "$T/el.3" > "$T/el.3.out" 2>"$T/err" || { bad "elastic 3 ranks exited $?"; cat "$T/err"; }
mpi 2 "$BIN/mge-train" "$T/sgd.yaml" $DET --resume "$T/el.3/latest.mgeckpt" --json --out "$T/el.2" \
    > "$T/el.2.out" 2>"$T/err" || { bad "elastic 2 ranks exited $?"; cat "$T/err"; }
cat "$T/el.1.out" "$T/el.3.out" "$T/el.2.out" > "$T/el.out"
r=$(same "$T/det.0.out" "$T/el.out" 2>&1) && ok "deterministic 1 -> 3 -> 2 ranks = one process: $r" \
    || bad "deterministic 1 -> 3 -> 2 ranks: $r"
# clipping sees the exact reduced sum, so it keeps the bits equal too
"$BIN/mge-train" "$T/sgd.yaml" $DET $CLIP --json --out "$T/detc.0" > "$T/detc.0.out" 2>"$T/err" \
    || { bad "deterministic clip one process exited $?"; cat "$T/err"; }
mpi 2 "$BIN/mge-train" "$T/sgd.yaml" $DET $CLIP --json --out "$T/detc.2" --set distributed.backend=mpi \
    > "$T/detc.2.out" 2>"$T/err" || { bad "deterministic clip 2 ranks exited $?"; cat "$T/err"; }
r=$(same "$T/detc.0.out" "$T/detc.2.out" 2>&1) && ok "deterministic with clip_grad_norm, 2 ranks = one process: $r" \
    || bad "deterministic clip 2 ranks: $r"
mpi 2 "$BIN/mge-train" "$T/sgd.yaml" $DET --set distributed.micro_shards=1 > /dev/null 2>"$T/err"; rc=$?
[ $rc -eq 2 ] && grep -q "1 micro-shards over 2 ranks" "$T/err" \
    && ok "1 micro-shard on 2 ranks: exit 2, '$(grep -m1 'micro-shards over' "$T/err")'" \
    || bad "1 micro-shard on 2 ranks: exit $rc: $(cat "$T/err")"
"$BIN/mge-train" "$T/sgd.yaml" $DET --set train.optimizer.lr=1e5 --set train.optimizer.momentum=0 \
    --out "$T/big" > /dev/null 2>"$T/err"; rc=$?
[ $rc -ne 0 ] && grep -q "outside the exact sum's range" "$T/err" \
    && ok "diverging deterministic run fails, not wraps: exit $rc, '$(grep -m1 'outside' "$T/err")'" \
    || bad "diverging deterministic run: exit $rc: $(cat "$T/err")"

echo "-- --profile: a Chrome trace per rank, all-reduces on the comm track"
mpi 2 "$BIN/mge-train" "$T/sgd.yaml" --set train.steps=20 --set distributed.pack_mb=0.004 --json --out "$T/prof" --profile "$T/trace.json" > /dev/null 2>"$T/err" \
    || { bad "profiled run exited $?"; cat "$T/err"; }
python3 - "$T/trace.json" "$T/trace.json.1" <<'P' && ok "trace.json and trace.json.1 parse; forward, backward ops and pack all-reduces present" || bad "bad trace"
import json, sys
for f in sys.argv[1:]:
    ev = json.load(open(f))["traceEvents"]
    cats = {e.get("cat") for e in ev}
    assert {"forward", "backward", "comm", "optimizer"} <= cats, cats
    assert any(e["name"].startswith("allreduce pack") and e["tid"] == 2 for e in ev)
P

echo "-- errors: exit non-zero promptly"
start=$(date +%s)
mpi 2 "$BIN/mge-train" "$T/sgd.yaml" --resume "$T/nothere.mgeckpt" --json --out "$T/fail" > /dev/null 2>"$T/err"; rc=$?
took=$(( $(date +%s) - start ))
[ $rc -ne 0 ] && [ $took -lt 30 ] && ok "rank 0 cannot read the checkpoint: job exit $rc after ${took}s" || bad "failing rank: exit $rc after ${took}s"
mpi 2 "$BIN/mge-train" "$T/sgd.yaml" --set distributed.backend=local > /dev/null 2>"$T/err"; rc=$?
[ $rc -ne 0 ] && grep -q "local runs one rank" "$T/err" && ok "backend local under 2 ranks: exit $rc, '$(grep -m1 'local runs' "$T/err")'" || bad "backend local with 2 ranks: exit $rc: $(cat "$T/err")"

echo "train_mpi: $passes passed, $fails failed"
[ $fails -eq 0 ]
