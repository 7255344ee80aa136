#!/bin/sh
# demo.sh: the main demo (`make demo`): builds the binaries and the dashboard (quietly, into a
# log), starts a coordinator and two CPU workers on loopback under BUILD/demo/, submits
# examples/fmnist-mlp.yaml with `mgectl submit -f` (one live progress line on a terminal, a
# line every 10 s when piped), then says where to look next. The cluster stops when the job
# ends, or on Ctrl-C; with KEEP=1 (`make demo KEEP=1`) it stays up until Ctrl-C. The exit
# code is the job's (0 succeeded; mgectl's exit codes). The whole run prints about 20 lines.
#   usage: [KEEP=1] sh deploy/demo.sh BUILD
# For tests: MGE_DEMO_SPEC (another spec), MGE_DEMO_DIR (instead of BUILD/demo),
# MGE_DEMO_LISTEN (instead of 127.0.0.1:8080), MGE_DEMO_NO_BUILD=1 (use BUILD as it is).
BUILD=${1:-build}
SPEC=${MGE_DEMO_SPEC:-examples/fmnist-mlp.yaml}
MAKE=${MAKE:-make}
D=${MGE_DEMO_DIR:-$BUILD/demo}
mkdir -p "$D"
D=$(cd "$D" && pwd)
[ -r "$SPEC" ] || { echo "demo: $SPEC not found" >&2; exit 2; }
say() { echo "demo: $*"; }

# --- build: the binaries and the dashboard, their output into a log (shown when it fails)
t0=$(date +%s)
if [ -n "$MGE_DEMO_NO_BUILD" ]; then
    : # the caller built BUILD
elif ! $MAKE --no-print-directory BUILD="$BUILD" binaries >"$D/build.log" 2>&1; then
    tail -n 20 "$D/build.log" >&2
    echo "demo: the build failed (all of it in $D/build.log)" >&2
    exit 2
fi
WEB="dashboard"
if [ -z "$MGE_DEMO_NO_BUILD" ] && command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    $MAKE --no-print-directory BUILD="$BUILD" web >>"$D/build.log" 2>&1
fi
[ -f "$BUILD/web/index.html" ] ||
    WEB="no dashboard (node/npm missing or npm ci failed offline: see $D/build.log; apt-get install nodejs npm, then make web)"
say "built in $(( $(date +%s) - t0 )) s ($WEB; log $D/build.log)"
BIN=$(cd "$BUILD/bin" && pwd) || exit 1

# tokens: made once, kept for the next run (the state directory is kept too)
if [ ! -s "$D/tokens" ]; then
    umask 077
    printf 'admin %s\nread %s\n' "$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')" \
        "$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')" >"$D/tokens"
    od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >"$D/join"
    umask 022
fi
ADMIN=$(sed -n 's/^admin //p' "$D/tokens")
(umask 077 && echo "$ADMIN" >"$D/admin.token")

PIDS=""
JOB_RC=130
# cancel_open_jobs WHY: cancel this demo cluster's queued and running jobs, so that a job cut
# off by Ctrl-C is not requeued (and does not hold a worker) the next time the demo starts.
# At stop it is best effort: Ctrl-C in a terminal reaches the coordinator too, so the
# start of the next run does it again.
cancel_open_jobs() {
    [ -n "$DEMO_URL" ] || return 0 # only ever the demo's own coordinator
    for st in running queued; do
        for id in $("$BIN/mgectl" list --state "$st" --limit 1000 2>/dev/null |
            awk 'NR > 1 { print $1 }'); do
            say "cancelling job $id ($1)"
            "$BIN/mgectl" cancel "$id" >/dev/null 2>&1
        done
    done
}
stop() {
    trap - EXIT INT TERM
    cancel_open_jobs "the demo is stopping"
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    for p in $PIDS; do wait "$p" 2>/dev/null; done
    say "stopped (logs and state in $D)"
}
trap stop EXIT
trap 'exit $JOB_RC' INT TERM

LISTEN=${MGE_DEMO_LISTEN:-127.0.0.1:8080}
# 8080 taken (another demo, another server): any free port
if [ -z "$MGE_DEMO_LISTEN" ] && curl -s -o /dev/null --max-time 1 http://127.0.0.1:8080/; then
    LISTEN=127.0.0.1:0
fi
rm -f "$D/ports"
"$BIN/mge-coordinator" --listen "$LISTEN" \
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
# mgectl's own config file for this cluster: the hint below is one export
printf 'server: %s\ntoken_file: admin.token\n' "$DEMO_URL" >"$D/mgectl.yaml"
export MGE_CONFIG="$D/mgectl.yaml"
unset MGE_SERVER MGE_TOKEN MGE_TOKEN_FILE
i=0
until [ "$("$BIN/mgectl" workers -o json 2>/dev/null | grep -o '"state": "ready"' | wc -l)" -ge 2 ]; do
    i=$((i + 1))
    [ $i -gt 100 ] && { echo "demo: workers did not register (see $D/worker-*.log)" >&2; exit 1; }
    sleep 0.1
done
cancel_open_jobs "left from an earlier demo run"
say "coordinator $DEMO_URL, workers cpu-0 and cpu-1 (1 CPU each); training $SPEC"
"$BIN/mgectl" submit "$SPEC" -f 2>&1
JOB_RC=$?
JOB=$("$BIN/mgectl" list --limit 1 2>/dev/null | awk 'NR == 2 { print $1 }')
if [ -f "$BUILD/web/index.html" ]; then
    # the token travels in the URL's fragment: the dashboard moves it to the tab's
    # sessionStorage and drops it from the address bar; no server or proxy log sees it
    say "dashboard: $DEMO_URL/#/jobs/$JOB?token=$ADMIN"
fi
say "mgectl: export MGE_CONFIG=$D/mgectl.yaml; $BIN/mgectl get $JOB (or list, logs $JOB, metrics $JOB)"
if [ -n "$KEEP" ] && [ "$KEEP" != 0 ]; then
    say "the cluster stays up (KEEP=1): Ctrl-C stops it"
    for p in $PIDS; do wait "$p" 2>/dev/null; done
else
    say "the cluster stops now; make demo KEEP=1 keeps it up until Ctrl-C"
fi
exit $JOB_RC
