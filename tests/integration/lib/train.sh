# train.sh: helpers for the mge-train integration tests (sourced, not run): BUILD and BIN from
# the first argument, a scratch directory $T removed on exit, the ok/bad counters, json FILE KEY
# (a key of the last JSON line of FILE), losses FILE ("step loss" of each step line of a --json
# run), ge/lt comparisons of two numbers, expect2, same_weights A B (two safetensors files hold
# the same tensors, byte for byte) and twin (a zoo model and its graph spec train alike).
BUILD=${1:-build}
BIN=$(cd "$BUILD/bin" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0; passes=0
ok() { passes=$((passes + 1)); echo "  ok: $*"; }
bad() { fails=$((fails + 1)); echo "  FAIL: $*"; }
json() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])[sys.argv[2]])' "$1" "$2"; }
# the loss of every step line of a --json run, one per line: "step loss"
losses() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if "step" in d and "loss" in d and "final_loss" not in d:
        print(d["step"], d["loss"])' "$1"; }
ge() { python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)' "$1" "$2"; }
lt() { python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)' "$1" "$2"; }
# expect2 NAME TEXT COMMAND...: COMMAND exits 2 and its stderr contains TEXT (a fixed string)
expect2() {
    name=$1; needle=$2; shift 2
    "$@" > "$T/bad.out" 2> "$T/bad.err"; rc=$?
    if [ $rc -eq 2 ] && grep -qF -- "$needle" "$T/bad.err"; then ok "$name: exit 2, '$(head -c 150 "$T/bad.err" | head -n 1)'"
    else bad "$name: exit $rc, stderr: $(cat "$T/bad.err")"; fi
}

# the tensors of a safetensors file (name, dtype, shape, raw bytes) equal in both files
same_weights() { python3 -c '
import json, struct, sys
def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}
a, b = read(sys.argv[1]), read(sys.argv[2])
if sorted(a) != sorted(b):
    sys.exit("names differ: %s" % sorted(set(a) ^ set(b)))
diff = [k for k in a if a[k] != b[k]]
if diff:
    sys.exit("%d of %d tensors differ, first %s" % (len(diff), len(a), diff[0]))
print(len(a))' "$1" "$2"; }

# twin NAME ZOO GRAPH SETS...: both train with the same sets; losses and weights must agree
twin() {
    name=$1; zoo=$2; graph=$3; shift 3
    for m in zoo graph; do
        spec=$zoo; [ $m = graph ] && spec=$graph
        "$BIN/mge-train" "$spec" --json --out "$T/$name-$m" --set train.checkpoint_every=0 "$@" \
            > "$T/$name-$m.out" 2>"$T/$name-$m.err" || { bad "$name $m exited $?"; cat "$T/$name-$m.err"; }
        "$BIN/mge-export" "$T/$name-$m/latest.mgeckpt" --format safetensors \
            --output "$T/$name-$m.safetensors" 2>>"$T/$name-$m.err" || bad "$name $m: mge-export exited $?"
    done
    losses "$T/$name-zoo.out" > "$T/$name-zoo.loss"
    losses "$T/$name-graph.out" > "$T/$name-graph.loss"
    n=$(wc -l < "$T/$name-zoo.loss")
    [ "$n" -gt 0 ] && cmp -s "$T/$name-zoo.loss" "$T/$name-graph.loss" &&
        ok "$name: the graph's loss equals the zoo's at each of $n steps (last $(tail -1 "$T/$name-zoo.loss"))" ||
        { bad "$name: losses differ"; diff "$T/$name-zoo.loss" "$T/$name-graph.loss" | head -5; }
    if k=$(same_weights "$T/$name-zoo.safetensors" "$T/$name-graph.safetensors"); then
        ok "$name: all $k tensors (PyTorch names) bit-identical after the run"
    else
        bad "$name: weights differ: $k"
    fi
}

# rel_losses A B BOUND: the per-step losses ("step loss" lines) of files A and B, as many in
# each, agree within BOUND (relative); prints the count and the largest difference
rel_losses() { python3 - "$1" "$2" "$3" <<'P'
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
bound = float(sys.argv[3])
if not a or len(a) != len(b):
    sys.exit("%d step losses against %d" % (len(a), len(b)))
worst = max(abs(float(x[1]) - float(y[1])) / abs(float(x[1])) for x, y in zip(a, b))
print("%d steps, largest relative difference %.2e (bound %g)" % (len(a), worst, bound))
sys.exit(0 if worst <= bound else 1)
P
}

# gpu_or_skip NAME N COMMAND...: run COMMAND, a gpu job, into $T/probe.out and .err; return if
# it succeeded. Where it exits 2 saying there is no usable CUDA device (or no CUDA in the build)
# and naming CUDA_VISIBLE_DEVICES, that is one check passed and the script ends with a "skip -"
# line naming its N GPU checks (exit 77); any other failure ends it with exit 1.
gpu_or_skip() {
    name=$1; n=$2; shift 2
    "$@" > "$T/probe.out" 2> "$T/probe.err"; rc=$?
    [ $rc -eq 0 ] && return 0
    if [ $rc -eq 2 ] && grep -Eq "resources.device: gpu: (no usable CUDA device|this build has no CUDA) .*CUDA_VISIBLE_DEVICES=" "$T/probe.err"; then
        ok "no GPU here: exit 2, '$(head -n 1 "$T/probe.err")'"
    else
        bad "a gpu job without a GPU: exit $rc, stderr: $(cat "$T/probe.err")"
    fi
    echo "$name: $passes passed, $fails failed"
    [ $fails -eq 0 ] || exit 1
    echo "skip - $name: $n GPU checks skipped (no usable CUDA device)"
    exit 77
}
