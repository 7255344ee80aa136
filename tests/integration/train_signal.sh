#!/bin/sh
# train_signal.sh: SIGUSR2 asks mge-train for a checkpoint at its next step boundary (what the
# coordinator does before it preempts a job). Sent 20 times a second for the whole run (it
# once corrupted the heap when a handler ran inside oneDNN's sgemm): the run ends normally,
# the last request gives a checkpoint of the step it names, the final loss is an undisturbed
# run's bit for bit, and a run resumed from that checkpoint ends with that loss too.
# Under mpirun (2 ranks), a SIGUSR2 to mpirun reaches the ranks and rank 0 writes one.
. "$(dirname "$0")/lib/train.sh"

export OMP_NUM_THREADS=2
cat >"$T/mlp.yaml" <<'Y'
name: sig
model: {type: mlp, hidden: [512, 512]}
data: {format: synthetic, train_size: 4096, test_size: 256, input_dim: 784, classes: 10}
train: {steps: 400, batch_size: 128, optimizer: {type: sgd, lr: 0.01, momentum: 0.9}, checkpoint_every: 10000}
Y

# poke PID with SIGUSR2 every 50 ms from its first step line in OUT until it exits; of the
# checkpoints in DIR only the newest 2 are kept meanwhile (each is 5 MB)
poke() { # PID OUT DIR
    i=0
    while kill -0 "$1" 2>/dev/null && ! grep -qs '"step"' "$2" && [ $i -lt 600 ]; do
        sleep 0.05; i=$((i + 1))
    done
    while kill -0 "$1" 2>/dev/null; do
        kill -USR2 "$1" 2>/dev/null
        sleep 0.05
        ls "$3"/ckpt-*.mgeckpt 2>/dev/null | sort | head -n -2 | xargs -r rm -f
    done
}

echo "-- SIGUSR2 20 times a second"
"$BIN/mge-train" "$T/mlp.yaml" --out "$T/sig" --json --threads 2 >"$T/sig.out" 2>"$T/sig.err" &
pid=$!
poke $pid "$T/sig.out" "$T/sig"
wait $pid
rc=$?
n=$(grep -c 'checkpoint of step [0-9]* on request (SIGUSR2)' "$T/sig.err")
[ $rc -eq 0 ] && ok "the poked run ends normally (exit 0) after $n requested checkpoints" ||
    { bad "the poked run exited $rc"; tail -n 5 "$T/sig.err"; }
[ "$n" -ge 5 ] && ok "$n checkpoints written on request (>= 5)" || bad "only $n checkpoints on request"
last=$(sed -n 's/.*checkpoint of step \([0-9]*\) on request.*/\1/p' "$T/sig.err" | tail -n 1)
f=$(printf '%s/sig/ckpt-%06d.mgeckpt' "$T" "${last:-0}")
[ -n "$last" ] && [ -f "$f" ] && ok "the last one is the checkpoint file of its step ($last)" ||
    bad "no checkpoint file for the last request (step $last)"

"$BIN/mge-train" "$T/mlp.yaml" --out "$T/plain" --json --threads 2 >"$T/plain.out" 2>"$T/plain.err" ||
    bad "the undisturbed run exited $?"
want=$(json "$T/plain.out" final_loss)
got=$(json "$T/sig.out" final_loss)
[ -n "$want" ] && [ "$got" = "$want" ] && ok "final loss $got equals the undisturbed run's" ||
    bad "final loss $got, undisturbed $want"

if [ -n "$last" ]; then
    "$BIN/mge-train" "$T/mlp.yaml" --resume "$f" --out "$T/res" --json --threads 2 >"$T/res.out" \
        2>"$T/res.err" || bad "resume from $f exited $?"
    got=$(json "$T/res.out" final_loss)
    [ "$got" = "$want" ] && ok "resumed from the requested checkpoint of step $last: final loss $got, the same" ||
        bad "resumed from step $last: final loss $got, want $want"
fi

MPIRUN=$(command -v mpirun.openmpi || command -v mpirun)
if [ -n "$MPIRUN" ]; then
    echo "-- under mpirun, 2 ranks"
    export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    # mpirun itself is signalled (it passes SIGUSR2 on to the ranks), so no timeout(1) between
    "$MPIRUN" --oversubscribe --bind-to none -np 2 "$BIN/mge-train" "$T/mlp.yaml" \
        --out "$T/mpi" --json --threads 1 >"$T/mpi.out" 2>"$T/mpi.err" &
    pid=$!
    i=0
    while ! grep -qs '"step"' "$T/mpi.out" && [ $i -lt 600 ] && kill -0 $pid 2>/dev/null; do
        sleep 0.05; i=$((i + 1))
    done
    for k in 1 2 3; do kill -USR2 $pid 2>/dev/null; sleep 0.3; done
    wait $pid
    rc=$?
    n=$(grep -c 'checkpoint of step [0-9]* on request (SIGUSR2)' "$T/mpi.err")
    [ $rc -eq 0 ] && ok "mpirun's job ends normally (exit 0)" || { bad "mpirun exited $rc"; tail -n 5 "$T/mpi.err"; }
    [ "$n" -ge 1 ] && [ "$(ls "$T"/mpi/ckpt-*.mgeckpt 2>/dev/null | wc -l)" -ge 1 ] &&
        ok "rank 0 wrote $n checkpoint(s) on request (3 signals to mpirun)" ||
        bad "no checkpoint on request under mpirun: $(tail -n 3 "$T/mpi.err")"
else
    echo "  skip: mpirun (Open MPI) is not installed: the mpirun part"
fi

echo "train_signal: $passes passed, $fails failed"
[ $fails -eq 0 ]
