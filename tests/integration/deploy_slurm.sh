#!/bin/sh
# deploy_slurm.sh: deploy/slurm/ on a real single-machine Slurm. The test configures munge,
# slurmctld and slurmd itself on loopback (its own key, socket, ports and spool in a scratch
# directory; nothing of the system's is used or changed), then:
#   1. the no-daemon path: `sbatch -n 2 deploy/slurm/mge-train.sbatch` trains the
#      Fashion-MNIST MLP (examples/fmnist-mlp.yaml, 100 steps) on 2 tasks with mpirun, and
#      again with `srun --mpi=pmix` when Slurm has that plugin; each run's loss matches one
#      process (mge-train alone) to 1e-5 relative at every one of the 100 steps;
#   2. the pool: `sbatch deploy/slurm/mge-pool.sbatch` starts an mge-worker in the
#      allocation that joins a coordinator running outside Slurm; a job submitted with
#      mgectl runs on it and succeeds; the time-limit warning (USR1) drains it through the
#      API; scancel ends the pool and the worker leaves.
# The scripts are checked with bash -n (and shellcheck when installed) first. Skips visibly
# when Slurm or munge is not installed (deploy/install-deps.sh: MGE_EXTRA_PKGS="slurmctld
# slurmd slurm-client munge").
. "$(dirname "$0")/lib/control.sh"
S=deploy/slurm
for f in "$S"/*.sbatch; do
    if bash -n "$f"; then ok "bash -n $(basename "$f")"; else fail "bash -n $f"; fi
done
if command -v shellcheck >/dev/null 2>&1; then
    if shellcheck "$S"/*.sbatch >"$T/sc.out" 2>&1; then ok "shellcheck: $S/*.sbatch clean"
    else fail "shellcheck:"; cat "$T/sc.out"; fi
fi
for tool in slurmctld slurmd munged sbatch srun scontrol; do
    command -v $tool >/dev/null 2>&1 ||
        { echo "SKIP: $tool not installed (Debian: slurmctld slurmd slurm-client munge)"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "SKIP: slurmd runs jobs as their users and must be root here"; exit 77; }
MPIRUN=$(command -v mpirun.openmpi || command -v mpirun) || { echo "SKIP: Open MPI's mpirun not installed"; exit 77; }
DATA=/usr/share/datasets/fashion-mnist
[ -f $DATA/train-images-idx3-ubyte.gz ] || { echo "SKIP: dataset-fashion-mnist not installed"; exit 77; }
ABS_BIN=$(cd "$BIN" && pwd)
NCPU=$(getconf _NPROCESSORS_ONLN)  # not nproc: it follows OMP_NUM_THREADS, set below

# --- a one-node Slurm on loopback
chmod 700 "$T"
mkdir -p "$T/ctld" "$T/spool"
head -c 1024 /dev/urandom >"$T/munge.key"
chmod 400 "$T/munge.key"
munged --foreground --force --key-file="$T/munge.key" --socket="$T/munge.sock" \
    --pid-file="$T/munged.pid" --log-file="$T/munged.log" --seed-file="$T/munge.seed" \
    >>"$T/munged.log" 2>&1 &
PIDS="$PIDS $!"
wait_until 10 test -S "$T/munge.sock" || { fail "munged did not start: $(tail -3 "$T/munged.log")"; exit 1; }
ports=$(python3 -c 'import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))')
HOST=$(hostname -s)
cat >"$T/slurm.conf" <<EOT
ClusterName=mgetest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=${ports% *}
SlurmdPort=${ports#* }
AuthType=auth/munge
AuthInfo=socket=$T/munge.sock
CredType=cred/munge
SlurmUser=$(id -un)
SlurmdUser=root
StateSaveLocation=$T/ctld
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$NCPU State=UNKNOWN
PartitionName=mge Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOT
export SLURM_CONF="$T/slurm.conf"
slurmctld -D -f "$SLURM_CONF" >>"$T/slurmctld.log" 2>&1 &
PIDS="$PIDS $!"
slurmd -D -f "$SLURM_CONF" -N "$HOST" >>"$T/slurmd.log" 2>&1 &
PIDS="$PIDS $!"
node_idle() { sinfo -h -N -o %t 2>/dev/null | grep -qx idle; }
if wait_until 20 node_idle; then ok "slurmctld + slurmd on loopback: node $HOST idle, $NCPU CPUs"
else fail "Slurm did not come up: $(tail -3 "$T/slurmctld.log" "$T/slurmd.log")"; exit 1; fi
JOBS=""
stop_slurm_jobs() { for j in $JOBS; do scancel "$j" 2>/dev/null; done; }
trap 'stop_slurm_jobs; cleanup' EXIT

# job_end ID: wait until the job has ended (sbatch --wait polls every 10 s), print its state
job_state_slurm() { scontrol show job "$1" -o 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
job_ended() { case $(job_state_slurm "$1") in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) return 0 ;; esac; return 1; }
submit_batch() { # out-prefix sbatch-args...
    p=$1; shift
    sbatch --parsable -o "$T/$p.out" -e "$T/$p.err" "$@" | cut -d';' -f1
}

# --- 1. no daemons: 2 tasks vs one process, the Fashion-MNIST MLP, 100 steps
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MGE_BIN="$ABS_BIN"
SPEC=$(pwd)/examples/fmnist-mlp.yaml
"$BIN/mge-train" "$SPEC" --set train.steps=100 --json --out "$T/ref" --threads 1 \
    >"$T/ref.out" 2>"$T/ref.err" || fail "one-process run: $(tail -3 "$T/ref.err")"
compare() { # A B: max relative per-step loss difference over steps 1..100 (and "steps ranks")
    python3 - "$1" "$2" <<'P'
import json, sys
def load(f):
    lines = [json.loads(l) for l in open(f) if l.startswith("{")]
    return [l["loss"] for l in lines if "step" in l and "loss" in l], lines[-1]
a, sa = load(sys.argv[1]); b, _ = load(sys.argv[2])
assert len(a) == len(b) == 100, (len(a), len(b))
print("%.3g %d %s" % (max(abs(x - y) / abs(y) for x, y in zip(a, b)), sa.get("ranks", 1), sa.get("backend", "-")))
P
}
launchers=mpirun
if srun --mpi=list 2>&1 | grep -qw pmix; then launchers="mpirun srun"
else echo "note: Slurm has no pmix plugin here: the srun --mpi=pmix path is not run"; fi
for l in $launchers; do
    id=$(MGE_LAUNCHER=$l MGE_OUT=$T/out-$l submit_batch "train-$l" -n 2 \
        "$S/mge-train.sbatch" "$SPEC" --set train.steps=100)
    JOBS="$JOBS $id"
    wait_until 60 job_ended "$id"
    st=$(job_state_slurm "$id")
    if [ "$st" != COMPLETED ]; then
        fail "sbatch mge-train.sbatch ($l) job $id: $st: $(tail -5 "$T/train-$l.err")"; continue
    fi
    r=$(compare "$T/train-$l.out" "$T/ref.out") || { fail "$l: cannot compare: $r"; continue; }
    set -- $r
    if [ "$2" = 2 ] && [ "$3" = mpi ] &&
        python3 -c 'import sys; sys.exit(float(sys.argv[1]) > 1e-5)' "$1"; then
        ok "sbatch -n 2 mge-train.sbatch (MGE_LAUNCHER=$l): $2 ranks ($3), 100 steps, max relative loss difference to 1 process $1 (<= 1e-5)"
    else
        fail "$l: ranks $2 backend $3, max relative loss difference $1 (want 2 ranks, mpi, <= 1e-5)"
    fi
done

# --- 2. an elastic pool: workers in an allocation join a coordinator outside it
start_coord
pool=$(MGE_COORDINATOR=$WORKER_URL MGE_JOIN_TOKEN_FILE=$T/join MGE_WORK_ROOT=$T \
    MGE_SERVER=$URL MGE_TOKEN_FILE=$T/tokens \
    MGE_WORKER_OPTS="--heartbeat-ms 500" submit_batch pool -N 1 --cpus-per-task="$NCPU" \
    "$S/mge-pool.sbatch")
JOBS="$JOBS $pool"
W=slurm-$pool-$HOST
if wait_until 20 worker_ready "$W"; then
    cpus=$(api GET /api/v1/workers | jq -c --arg n "$W" '.workers[] | select(.name == $n) | .slots.cpus')
    if [ "$cpus" = "$NCPU" ]; then ok "mge-pool.sbatch (job $pool): worker '$W' registered with the allocation's $cpus CPUs"
    else fail "pool worker '$W' offers $cpus CPUs, the allocation has $NCPU"; fi
else
    fail "pool worker '$W' did not register: $(tail -5 "$T/pool.err")"
fi
cat >"$T/job.yaml" <<'Y'
name: on-slurm
model: {type: mlp, hidden: [32]}
data: {format: synthetic, input_dim: 20, classes: 4, train_size: 200, test_size: 0}
train: {steps: 50, batch_size: 20, optimizer: {type: sgd, lr: 0.05}, seed: 3, eval: false}
Y
job=$("$BIN/mgectl" submit "$T/job.yaml" 2>"$T/submit.err" | grep -o '[0-9][0-9]*' | head -n 1)
if [ -n "$job" ] && wait_until 30 state_is "$job" succeeded; then
    on=$(api GET "/api/v1/jobs/$job" | jq -r '[.placement[]?.worker_name // .placement[]?.worker] | unique | join(",")')
    ok "mgectl submit: job $job succeeded on the pool (placement: $on)"
else
    fail "job ${job:-?} submitted with mgectl did not succeed: $(job_state "${job:-0}") $(cat "$T/submit.err")"
fi
# the warning Slurm sends before the time limit (--signal=B:USR1@120), sent now: the pool
# drains its workers through the API
scancel --batch --signal=USR1 "$pool"
worker_draining() { api GET /api/v1/workers | jq -e --arg n "$W" '.workers[] | select(.name == $n and (.state == "draining" or .state == "drained"))'; }
if wait_until 15 worker_draining; then ok "USR1 to the pool's batch script (the time-limit warning): worker '$W' drained"
else fail "worker '$W' not draining after USR1: $(tail -3 "$T/pool.err")"; fi
# the worker process itself is gone (its state may stay "drained": a drain is kept)
worker_proc_gone() {
    for d in /proc/[0-9]*; do
        [ "$(cat "$d/comm" 2>/dev/null)" = mge-worker ] || continue
        tr '\0' ' ' <"$d/cmdline" 2>/dev/null | grep -q -- "--name $W " && return 1
    done
    return 0
}
if worker_proc_gone; then fail "no mge-worker process named '$W' found before scancel"; fi
scancel "$pool"
if wait_until 20 worker_proc_gone; then ok "scancel $pool: the pool's mge-worker process ended (worker state: $(api GET /api/v1/workers | jq -r --arg n "$W" '.workers[] | select(.name == $n) | .state'))"
else fail "the mge-worker of '$W' still runs after scancel"; fi
# a drain lasts until undrained: a new allocation of the pool under the same name undrains its
# workers when it starts, so they take ranks again
pool2=$(MGE_COORDINATOR=$WORKER_URL MGE_JOIN_TOKEN_FILE=$T/join MGE_WORK_ROOT=$T \
    MGE_SERVER=$URL MGE_TOKEN_FILE=$T/tokens MGE_POOL_NAME=slurm-$pool \
    MGE_WORKER_OPTS="--heartbeat-ms 500" submit_batch pool2 -N 1 --cpus-per-task="$NCPU" \
    "$S/mge-pool.sbatch")
JOBS="$JOBS $pool2"
if wait_until 20 worker_ready "$W"; then
    ok "a new pool allocation (job $pool2) under the name slurm-$pool: worker '$W' ready again (undrained at its start)"
else
    fail "worker '$W' of pool job $pool2 is not ready: $(api GET /api/v1/workers | jq -c --arg n "$W" '.workers[] | select(.name == $n) | {state, drain}') $(tail -3 "$T/pool2.err")"
fi
scancel "$pool2"
wait_until 20 worker_proc_gone || fail "the mge-worker of '$W' (job $pool2) still runs after scancel"

if [ "$fails" -eq 0 ]; then echo "deploy_slurm: all passed"; exit 0; fi
echo "deploy_slurm: $fails failed"; exit 1
