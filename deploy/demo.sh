#!/bin/sh
# demo.sh: the main demo (`make demo`): a coordinator and two CPU workers on loopback under
# BUILD/demo/, then `mgectl submit -f examples/fmnist-mlp.yaml`. Everything stops on Ctrl-C
# or when the job ends; the exit code is the job's (0 succeeded).
#   usage: sh deploy/demo.sh BUILD
BUILD=${1:-build}
BIN=$(cd "$BUILD/bin" && pwd) || exit 1
SPEC=${MGE_DEMO_SPEC:-examples/fmnist-mlp.yaml}
D=$BUILD/demo
mkdir -p "$D"
D=$(cd "$D" && pwd)
[ -r "$SPEC" ] || { echo "demo: $SPEC not found" >&2; exit 2; }
for b in mge-coordinator mge-worker mgectl mge-train; do
    [ -x "$BIN/$b" ] || { echo "demo: $BIN/$b not built (run make)" >&2; exit 2; }
done

# tokens: made once, kept for the next run (the state directory is kept too)
if [ ! -s "$D/tokens" ]; then
    umask 077
    printf 'admin %s\nread %s\n' "$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')" \
        "$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')" >"$D/tokens"
    od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$D/join"
    umask 022
fi
ADMIN=$(sed -n 's/^admin //p' "$D/tokens")

PIDS=""
# cancel_open_jobs WHY: cancel this demo cluster's queued and running jobs, so that a job cut
# off by Ctrl-C is not requeued (and does not hold a worker) the next time the demo starts.
# At stop it is best effort: Ctrl-C in a terminal reaches the coordinator too, so the
# start of the next run does it again.
cancel_open_jobs() {
    [ -n "$DEMO_URL" ] || return 0 # only ever the demo's own coordinator
    for st in running queued; do
        for id in $("$BIN/mgectl" --server "$DEMO_URL" --token "$ADMIN" list --state "$st" \
            --limit 1000 2>/dev/null | awk 'NR > 1 { print $1 }'); do
            echo "demo: cancelling job $id ($1)"
            "$BIN/mgectl" --server "$DEMO_URL" --token "$ADMIN" cancel "$id" >/dev/null 2>&1
        done
    done
}
stop() {
    trap - EXIT INT TERM
    cancel_open_jobs "the demo is stopping"
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    for p in $PIDS; do wait "$p" 2>/dev/null; done
    echo "demo: stopped (logs and state in $D)"
}
trap stop EXIT
trap 'exit 130' INT TERM

rm -f "$D/ports"
"$BIN/mge-coordinator" --listen "${MGE_DEMO_LISTEN:-127.0.0.1:8080}" \
    --worker-listen tcp://127.0.0.1:0 --state-dir "$D/state" --token-file "$D/tokens" \
    --join-token-file "$D/join" --ports-file "$D/ports" >"$D/coordinator.log" 2>&1 &
PIDS="$PIDS $!"
i=0
while [ ! -s "$D/ports" ]; do
    i=$((i + 1))
    [ $i -gt 100 ] && { echo "demo: the coordinator did not start:" >&2; tail "$D/coordinator.log" >&2; exit 1; }
    sleep 0.1
done
HTTP=$(sed -n 's/^http=//p' "$D/ports")
DEMO_URL=http://$HTTP
WORKER_URL=$(sed -n 's/^worker=//p' "$D/ports")
ROOTS=""
[ -d /usr/share/datasets ] && ROOTS="--data-root /usr/share/datasets"
for w in cpu-0 cpu-1; do
    # shellcheck disable=SC2086
    "$BIN/mge-worker" --coordinator "$WORKER_URL" --join-token-file "$D/join" --name "$w" \
        --cpus 1 --work-dir "$D/$w" $ROOTS ${MGE_DEMO_TRAIN_BIN:+--train-bin "$MGE_DEMO_TRAIN_BIN"} >"$D/worker-$w.log" 2>&1 &
    PIDS="$PIDS $!"
done
export MGE_SERVER="http://$HTTP" MGE_TOKEN="$ADMIN"
i=0
until [ "$("$BIN/mgectl" workers -o json 2>/dev/null | grep -o '"state": "ready"' | wc -l)" -ge 2 ]; do
    i=$((i + 1))
    [ $i -gt 100 ] && { echo "demo: workers did not register" >&2; exit 1; }
    sleep 0.1
done
cancel_open_jobs "left from an earlier demo run"
echo "demo: coordinator on http://$HTTP (API token in $D/tokens)"
echo "demo: the dashboard will be at http://$HTTP/ ; try: MGE_SERVER=http://$HTTP MGE_TOKEN=$ADMIN $BIN/mgectl list"
"$BIN/mgectl" workers
"$BIN/mgectl" submit "$SPEC" -f
