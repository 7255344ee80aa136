#!/bin/sh
# train_eager.sh: mge-train --eager (train.eager: true) runs the same graph op by op with every
# value in its own allocation and checked. Eager and static runs give the same loss at every
# step and byte-identical checkpoints for the MLP, LeNet, a small ResNet-20 (zoo and graph
# twins), a graph LeNet, a small GPT (dropout, AdamW, clipping) and the MLP under
# recomputation, and the same losses on 2 MPI ranks (where a rank reports a NaN). An absurd
# learning rate (1e30) is reported with the step, the layer, the op and the pass, no later than
# the static run's "diverged" line; --eager-dump writes the failing op's inputs and outputs
# (.npy) and node.json, which agree with the report; train.eager: true in the spec reports the
# same; --eager-max-abs stops at the first update past the bound; bad values exit 2 naming the
# flag or key.
. "$(dirname "$0")/lib/train.sh"

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    echo "skip: dataset-fashion-mnist is not installed"; exit 77
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
NO_TEST="--set data.test_images= --set data.test_labels="
STEPS="--set train.epochs= --set train.log_every=1"

# pair NAME SPEC SETS...: static and eager runs with the same sets: same losses, same checkpoint
pair() {
    name=$1; spec=$2; shift 2
    for m in static eager; do
        e=; [ $m = eager ] && e=--eager
        "$BIN/mge-train" "$spec" --json --out "$T/$name-$m" --set train.checkpoint_every=0 $e "$@" \
            > "$T/$name-$m.out" 2> "$T/$name-$m.err" || { bad "$name $m exited $?"; cat "$T/$name-$m.err"; }
        losses "$T/$name-$m.out" > "$T/$name-$m.loss"
    done
    n=$(wc -l < "$T/$name-static.loss")
    if [ "$n" -gt 0 ] && cmp -s "$T/$name-static.loss" "$T/$name-eager.loss" &&
        cmp -s "$T/$name-static/latest.mgeckpt" "$T/$name-eager/latest.mgeckpt"; then
        ok "$name: eager = static: the loss at each of $n steps (last $(tail -1 "$T/$name-eager.loss")), the checkpoint byte for byte"
    else
        bad "$name: eager and static differ"
        diff "$T/$name-static.loss" "$T/$name-eager.loss" | head -5
    fi
}

echo "-- eager and static runs agree bit for bit"
pair mlp examples/fmnist-mlp.yaml $STEPS --set train.steps=20 $NO_TEST
pair lenet examples/fmnist-lenet.yaml $STEPS --set train.steps=10 $NO_TEST
pair lenet-graph examples/fmnist-lenet.graph.yaml $STEPS --set train.steps=10 $NO_TEST
pair resnet20 examples/fmnist-resnet20.yaml $STEPS --set train.steps=3 --set train.batch_size=16 $NO_TEST
pair resnet20-graph examples/fmnist-resnet20.graph.yaml $STEPS --set train.steps=3 \
    --set train.batch_size=16 $NO_TEST
pair gpt examples/gpt-text.yaml --set train.steps=5 --set train.log_every=1 --set model.layers=2 \
    --set model.d_model=64 --set model.context=32 --set data.test_fraction=0
pair mlp-recompute examples/fmnist-mlp.yaml $STEPS --set train.steps=10 --set memory.sublinear=true $NO_TEST

MPIRUN=$(command -v mpirun.openmpi || command -v mpirun)
if [ -n "$MPIRUN" ]; then
    echo "-- data parallel: 2 ranks, eager = static; lr 1e30 reported by a rank"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    MPI="--set train.epochs= --set train.steps=10 $NO_TEST --set train.checkpoint_every=0"
    for m in static eager; do
        e=; [ $m = eager ] && e=--eager
        OMP_NUM_THREADS=1 "$MPIRUN" --oversubscribe --bind-to none -np 2 "$BIN/mge-train" \
            examples/fmnist-mlp.yaml --json $MPI --out "$T/mpi-$m" $e > "$T/mpi-$m.out" 2> "$T/mpi-$m.err" ||
            { bad "2 ranks $m exited $?"; cat "$T/mpi-$m.err"; }
        losses "$T/mpi-$m.out" > "$T/mpi-$m.loss"
    done
    [ "$(wc -l < "$T/mpi-eager.loss")" -eq 10 ] && cmp -s "$T/mpi-static.loss" "$T/mpi-eager.loss" &&
        ok "2 ranks: eager = static at each of 10 steps (last $(tail -1 "$T/mpi-eager.loss"))" ||
        bad "2 ranks: eager and static differ"
    OMP_NUM_THREADS=1 "$MPIRUN" --oversubscribe --bind-to none -np 2 "$BIN/mge-train" \
        examples/fmnist-mlp.yaml --json $MPI --out "$T/mpi-nan" --eager --set train.optimizer.lr=1e30 \
        > "$T/mpi-nan.out" 2> "$T/mpi-nan.err"
    rc=$?
    line=$(grep -m1 '^mge-train: rank [01]: eager: step [0-9]*, layer `fc[123]` (op ' "$T/mpi-nan.err")
    [ $rc -ne 0 ] && [ -n "$line" ] && ok "2 ranks, lr 1e30: exit $rc, '$line'" ||
        { bad "2 ranks, lr 1e30: exit $rc"; cat "$T/mpi-nan.err"; }
fi

echo "-- lr 1e30: the first non-finite value named, its op dumped"
LR="$STEPS --set train.steps=20 $NO_TEST --set train.optimizer.lr=1e30 --set train.checkpoint_every=0"
"$BIN/mge-train" examples/fmnist-mlp.yaml --json --out "$T/lr-s" $LR > "$T/lr-s.out" 2> "$T/lr-s.err"
rc=$?
diverged=$(sed -n 's/.*loss is .* at step \([0-9]*\): diverged.*/\1/p' "$T/lr-s.err")
[ $rc -eq 1 ] && [ -n "$diverged" ] && ok "static: exit 1, 'loss is ... at step $diverged: diverged'" ||
    { bad "static lr 1e30: exit $rc"; cat "$T/lr-s.err"; }
"$BIN/mge-train" examples/fmnist-mlp.yaml --json --out "$T/lr-e" $LR --eager-dump "$T/dump" \
    > "$T/lr-e.out" 2> "$T/lr-e.err"
rc=$?
report=$(sed -n 's/^mge-train: eager: //p' "$T/lr-e.err")
step=$(echo "$report" | sed -n 's/^step \([0-9]*\), layer .*/\1/p')
if [ $rc -eq 1 ] && echo "$report" | grep -Eq '^step [0-9]+, layer `fc[123]` \(op [A-Z_]+, (forward|backward)\): (NaN|Inf|NaN and Inf) in [a-zA-Z]+ `[^`]+` from inputs with max \|x\| [0-9.e+]+ ' &&
    [ -n "$step" ] && [ -n "$diverged" ] && [ "$step" -le "$diverged" ]; then
    ok "eager: exit 1 at step $step (static: $diverged): '$report'"
else
    bad "eager lr 1e30: exit $rc, report '$report' (static diverged at step $diverged)"; cat "$T/lr-e.err"
fi
if /usr/bin/python3 - "$T/dump" "$report" <<'EOF'
import json, os, struct, sys
d, report = sys.argv[1], sys.argv[2]
node = json.load(open(os.path.join(d, "node.json")))
def npy(path):  # (shape, floats) of a little-endian float32 .npy file
    b = open(path, "rb").read()
    assert b[:6] == b"\x93NUMPY", path
    n = struct.unpack("<H", b[8:10])[0]
    h = eval(b[10:10 + n].decode())
    assert h["descr"] == "<f4" and not h["fortran_order"], h
    count = 1
    for s in h["shape"]:
        count *= s
    assert len(b) == 10 + n + 4 * count, path
    return list(h["shape"]), struct.unpack("<%df" % count, b[10 + n:])
assert report.startswith(node["report"]), (report, node["report"])
assert report.startswith("step %d, layer `%s` (op %s, %s)" % (node["step"], node["layer"], node["op"], node["pass"]))
for kind in ("inputs", "outputs"):
    for v in node[kind]:
        shape, x = npy(os.path.join(d, v["file"]))
        assert shape == v["shape"], (v, shape)
        fin = [abs(f) for f in x if f == f and abs(f) != float("inf")]
        assert sum(1 for f in x if f != f) == v["nan"], v
        assert sum(1 for f in x if abs(f) == float("inf")) == v["inf"], v
        assert (max(fin) if fin else 0.0) == v["max_abs"], (v, max(fin))
bad = sum(v["nan"] + v["inf"] for v in node["outputs"])
assert bad > 0, node["outputs"]
print("%d inputs, %d outputs (%d non-finite values), e.g. %s %s" % (len(node["inputs"]), len(node["outputs"]),
      bad, node["inputs"][-1]["name"], node["inputs"][-1]["shape"]))
EOF
then ok "--eager-dump: node.json and each .npy agree with the report (above)"
else bad "--eager-dump: $(ls "$T/dump" 2>&1)"; fi

"$BIN/mge-train" examples/fmnist-mlp.yaml --json --out "$T/lr-k" $LR --set train.eager=true \
    > "$T/lr-k.out" 2> "$T/lr-k.err"
rc=$?
kreport=$(sed -n 's/^mge-train: eager: //p' "$T/lr-k.err")
[ $rc -eq 1 ] && [ -n "$kreport" ] && [ "$kreport (dumped to '$T/dump')" = "$report" ] &&
    ok "train.eager: true in the spec: the same report" || { bad "train.eager: true: exit $rc"; cat "$T/lr-k.err"; }

"$BIN/mge-train" examples/fmnist-mlp.yaml --json --out "$T/lr-m" $LR --eager --eager-max-abs 1e6 \
    > "$T/lr-m.out" 2> "$T/lr-m.err"
rc=$?
report=$(sed -n 's/^mge-train: eager: //p' "$T/lr-m.err")
echo "$report" | grep -Eq '^step 1, layer `fc[123]` \(optimiser sgd, lr 1e\+30, update\): \|x\| above 1e\+06 in parameter `fc[123]\.[wb]`' &&
    [ $rc -eq 1 ] && ok "--eager-max-abs 1e6: exit 1, '$report'" || { bad "--eager-max-abs: exit $rc"; cat "$T/lr-m.err"; }

echo "-- bad values"
expect2 "--eager-max-abs abc" "mge-train: --eager-max-abs: expected a positive number, got 'abc'" \
    "$BIN/mge-train" examples/fmnist-mlp.yaml --eager-max-abs abc
expect2 "train.eager: maybe" "train.eager" "$BIN/mge-train" examples/fmnist-mlp.yaml --set train.eager=maybe
expect2 "--eager on the sim device" "mge-train: --eager runs on the cpu device only, not on resources.device sim" \
    "$BIN/mge-train" examples/fmnist-mlp.yaml --eager --device sim
expect2 "train.eager with resources.device sim" "train.eager=true: expected false with resources.device other than cpu" \
    "$BIN/mge-train" examples/fmnist-mlp.yaml --set train.eager=true --device sim

echo "train_eager: $passes passed, $fails failed"
[ $fails -eq 0 ]
