#!/bin/sh
# comm.sh: data-parallel communication, side by side in one run (called by run.sh; `make bench`).
#  1. gradient all-reduce of three models with 2 ranks: raw MPI_Allreduce of all gradient
#     bytes, one MPI_Allreduce per gradient tensor, and mge's packed all-reduce (mge-commbench);
#  2. the comm layer's cost with 1 rank: mge-train local vs the mpi backend under mpirun -np 1;
#  3. 2-rank training: compute, communication and the part of it hidden behind backward.
# Knobs: MGE_BENCH_REPS (all-reduce repetitions, default 30), MGE_BENCH_STEPS (default 200).
BUILD=${1:-build}
cd "$(dirname "$0")/../.." || exit 1
MPIRUN=$(command -v mpirun.openmpi || command -v mpirun)
if [ -z "$MPIRUN" ]; then echo "skip: mpirun (Open MPI) is not installed"; exit 0; fi
[ -x "$BUILD/bench/mge-commbench" ] || make --no-print-directory -s BUILD="$BUILD" bench-tools || exit 1
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
REPS=${MGE_BENCH_REPS:-30}
STEPS=${MGE_BENCH_STEPS:-200}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mpi() { n=$1; shift; "$MPIRUN" --oversubscribe --bind-to none -np "$n" "$@"; }
# models: name, spec, overrides (the deep MLP is cut to 32 layers: 128 MiB of gradients)
MODELS="mlp:examples/fmnist-mlp.yaml: lenet:examples/fmnist-lenet.yaml: deep-mlp:examples/deep-mlp.yaml:model.layers=32"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(getconf _NPROCESSORS_ONLN) cores (shared machines are noisy: compare within a row)"

echo
echo "-- gradient all-reduce, 2 ranks, shared memory (median of $REPS; bus GB/s = 2(n-1)/n bytes / time)"
printf '%-9s %10s %7s %5s | %9s %9s %9s | %7s %7s %7s | %8s %8s\n' model grad_MiB tensors packs \
    raw_ms tensor_ms packed_ms raw_GB/s ten_GB/s pck_GB/s pck/raw pck/ten
for m in $MODELS; do
    name=${m%%:*}; rest=${m#*:}; spec=${rest%%:*}; set_=${rest#*:}
    set -- ; [ -n "$set_" ] && set -- --set "$set_"
    reps=$REPS; [ "$name" = deep-mlp ] && reps=$(( (REPS + 2) / 3 ))
    mpi 2 "$BUILD/bench/mge-commbench" "$spec" "$reps" "$@" > "$T/$name.ar" 2>"$T/err" || { cat "$T/err"; continue; }
    python3 - "$T/$name.ar" "$name" <<'P'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("%-9s %10.2f %7d %5d | %9.3f %9.3f %9.3f | %7.2f %7.2f %7.2f | %8.3f %8.3f" % (
    sys.argv[2], r["grad_bytes"] / 1048576, r["tensors"], r["packs"], r["raw_ms"],
    r["per_tensor_ms"], r["packed_ms"], r["raw_gbps"], r["per_tensor_gbps"], r["packed_gbps"],
    r["packed_vs_raw"], r["packed_vs_per_tensor"]))
P
done

echo
echo "-- training step time: 1 rank local vs 1 rank mpi (comm layer cost), 2 ranks mpi (overlap)"
printf '%-9s %6s | %10s %10s %9s | %10s %10s %9s %9s %8s\n' model steps local_ms mpi1_ms overhead \
    mpi2_ms compute_ms comm_ms wait_ms hidden
for m in $MODELS; do
    name=${m%%:*}; rest=${m#*:}; spec=${rest%%:*}; set_=${rest#*:}
    steps=$STEPS; [ "$name" = deep-mlp ] && steps=$(( (STEPS + 19) / 20 ))
    set -- --set train.steps=$steps --set train.eval=false --set train.checkpoint_every=0 --json
    [ -n "$set_" ] && set -- "$@" --set "$set_"
    # alternate the runs twice so drift in the machine's load hits both alike
    for round in 1 2; do
        "$BUILD/bin/mge-train" "$spec" "$@" --out "$T/o" > "$T/$name.local.$round" 2>"$T/err" || cat "$T/err"
        mpi 1 "$BUILD/bin/mge-train" "$spec" "$@" --set distributed.backend=mpi --out "$T/o" > "$T/$name.mpi1.$round" 2>"$T/err" || cat "$T/err"
    done
    mpi 2 "$BUILD/bin/mge-train" "$spec" "$@" --out "$T/o" > "$T/$name.mpi2" 2>"$T/err" || cat "$T/err"
    python3 - "$T" "$name" "$steps" <<'P'
import json, sys
d, name, steps = sys.argv[1:]
def summ(f):
    return json.loads(open(f).read().strip().splitlines()[-1])
local = min(summ("%s/%s.local.%d" % (d, name, r))["median_step_ms"] for r in (1, 2))
mpi1 = min(summ("%s/%s.mpi1.%d" % (d, name, r))["median_step_ms"] for r in (1, 2))
s2 = summ("%s/%s.mpi2" % (d, name))
print("%-9s %6s | %10.3f %10.3f %8.1f%% | %10.3f %10.3f %9.3f %9.3f %7.0f%%" % (
    name, steps, local, mpi1, 100 * (mpi1 / local - 1), s2["median_step_ms"],
    s2["median_compute_ms"], s2["median_comm_ms"], s2["median_comm_wait_ms"],
    100 * s2["comm_hidden_fraction"]))
P
done
echo "(overhead: 1-rank mpi median step over local, best of 2 runs each; hidden: share of the"
echo " 2-rank all-reduce time that ran while backward was still computing, over all steps;"
echo " compute, comm, wait: medians per step; comm is timed on the comm thread, so it includes"
echo " waiting for the slower rank; wait: the training thread blocked on collectives)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
