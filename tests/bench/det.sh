#!/bin/sh
# det.sh: what deterministic data parallelism (distributed.deterministic) costs, side by side
# with the default mode in one run (called by run.sh; `make bench`): median step time of the
# Fashion-MNIST MLP (examples/fmnist-mlp.yaml) with 1 rank (local) and 2 ranks (mpirun), default
# vs deterministic at 12 micro-shards (the default) and at as many micro-shards as ranks, and
# how far the default mode's 2-rank losses drift from 1 rank while deterministic ones do not.
# Knobs: MGE_BENCH_STEPS (default 200).
BUILD=${1:-build}
cd "$(dirname "$0")/../.." || exit 1
MPIRUN=$(command -v mpirun.openmpi || command -v mpirun)
if [ -z "$MPIRUN" ]; then echo "skip: mpirun (Open MPI) is not installed"; exit 0; fi
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
STEPS=${MGE_BENCH_STEPS:-200}
SPEC=${MGE_BENCH_SPEC:-examples/fmnist-mlp.yaml}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mpi() { n=$1; shift; "$MPIRUN" --oversubscribe --bind-to none -np "$n" "$@"; }
run() { # name ranks args...: one training run, its JSON lines in $T/name
    name=$1 n=$2; shift 2
    set -- "$SPEC" --set train.steps="$STEPS" --set train.eval=false \
        --set train.checkpoint_every=0 --json --out "$T/o.$name" "$@"
    if [ "$n" = 1 ]; then
        "$BUILD/bin/mge-train" "$@" > "$T/$name" 2>"$T/err" || cat "$T/err"
    else
        mpi "$n" "$BUILD/bin/mge-train" "$@" > "$T/$name" 2>"$T/err" || cat "$T/err"
    fi
}
DET="--set distributed.deterministic=true"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(getconf _NPROCESSORS_ONLN) cores, 1 thread per rank (shared machines are noisy: compare within a row)"
# alternate the runs three times so drift in the machine's load hits all alike
for round in 1 2 3; do
    run "def1.$round" 1
    run "det1.$round" 1 $DET
    run "det1s1.$round" 1 $DET --set distributed.micro_shards=1
    run "def2.$round" 2
    run "det2.$round" 2 $DET
    run "det2s2.$round" 2 $DET --set distributed.micro_shards=2
done
python3 - "$T" "$STEPS" <<'P'
import json, sys
d, steps = sys.argv[1], int(sys.argv[2])
def lines(f):
    return [json.loads(l) for l in open("%s/%s" % (d, f))]
def best(name, key):  # the best of the 3 rounds
    return min(lines("%s.%d" % (name, r))[-1][key] for r in (1, 2, 3))
print()
for key, what in (("median_step_ms", "wall time"),
                  ("median_step_cpu_ms", "CPU time of the training thread outside collectives")):
    print("-- step %s, %s steps (median, best of 3 runs), ms" % (what, steps))
    print("%-5s | %10s | %12s %6s | %12s %6s" % ("ranks", "default", "det_S12", "ratio",
                                                 "det_S=W", "ratio"))
    for w in (1, 2):
        base = best("def%d" % w, key)
        det = best("det%d" % w, key)
        detw = best("det%ds%d" % (w, w), key)
        print("%-5d | %10.3f | %12.3f %5.2fx | %12.3f %5.2fx" % (w, base, det, det / base, detw,
                                                               detw / base))
print()
print("-- losses: 2 ranks against 1 rank (same mode)")
for mode in ("def", "det"):
    a = [l for l in lines("%s1.1" % mode) if "step" in l and "loss" in l and "summary" not in l]
    b = [l for l in lines("%s2.1" % mode) if "step" in l and "loss" in l and "summary" not in l]
    rel = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
    fa, fb = lines("%s1.1" % mode)[-1]["final_loss"], lines("%s2.1" % mode)[-1]["final_loss"]
    same = ""
    if mode == "det":
        same = ", loss bits equal at %d of %d steps, state %s" % (
            sum(x["loss_bits"] == y["loss_bits"] for x, y in zip(a, b)), len(a),
            "equal" if lines("det1.1")[-1]["state_hash"] == lines("det2.1")[-1]["state_hash"]
            else "DIFFERS")
    print("%-13s final loss %.9g vs %.9g, max per-step rel diff %.3g%s" % (
        "default" if mode == "def" else "deterministic", fa, fb, rel, same))
P
echo "(CPU time: the same work without the neighbours' share of the cores nor the time a rank"
echo " spins in MPI waiting for the other; det_S12: distributed.micro_shards 12, the default;"
echo " det_S=W: as many micro-shards as ranks, the cheapest setting; runs are bit-identical only"
echo " among runs with the same micro_shards; ratio: over the default mode's median step)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
