#!/bin/sh
# control.sh: control-plane benchmarks (called from tests/bench/run.sh with the build dir).
#   1. job submissions per second through REST          goal >= 2000/s
#   2. submit-to-rank-spawn latency p50                 goal <= 50 ms
#   3. GET /jobs p99 with 10,000 jobs stored            goal <= 50 ms
#   4. coordinator CPU with 1,000 simulated workers at 1 Hz   goal <= 20% of one core
# The simulated workers come from mge-loadgen, a load generator: they only heartbeat. The
# worker of benchmark 2 is a real mge-worker running the real mge-train.
BUILD=${1:-build}
BIN=$BUILD/bin
T=$(mktemp -d "${TMPDIR:-/tmp}/mge-bench.XXXXXX")
PIDS=""
trap 'for p in $PIDS; do kill $p 2>/dev/null; done; sleep 0.2; rm -rf "$T"' EXIT
trap 'exit 130' INT TERM

cc -std=c11 -D_GNU_SOURCE -O2 -I. -I"$BUILD/gen" tests/bench/mge-loadgen.c \
    "$BUILD/lib/libmgeproto.a" "$BUILD/lib/libmgecommon.a" -lnng -lprotobuf-c -lcurl -lcrypto -lpthread -o "$T/mge-loadgen" || exit 1
printf 'admin bench\n' >"$T/tokens"
echo join >"$T/join"

start_coord() { # state dir
    rm -f "$T/ports"
    "$BIN/mge-coordinator" --listen 127.0.0.1:0 --worker-listen tcp://127.0.0.1:0 \
        --state-dir "$1" --token-file "$T/tokens" --join-token-file "$T/join" \
        --ports-file "$T/ports" --worker-timeout 30 >>"$T/coord.log" 2>&1 &
    COORD=$!
    PIDS="$PIDS $COORD"
    i=0; while [ ! -s "$T/ports" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    URL=http://$(sed -n 's/^http=//p' "$T/ports")
    WURL=$(sed -n 's/^worker=//p' "$T/ports")
}
stop_coord() { kill "$COORD"; wait "$COORD" 2>/dev/null; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

echo "== control plane benchmarks ($(nproc) cores)"
start_coord "$T/s1"
"$T/mge-loadgen" submit "$URL" bench 10000 4
"$T/mge-loadgen" list "$URL" bench 500
stop_coord

start_coord "$T/s2"
mkdir -p "$T/wd"
"$BIN/mge-worker" --coordinator "$WURL" --join-token-file "$T/join" --name bench-w \
    --cpus 2 --work-dir "$T/wd" >>"$T/worker.log" 2>&1 &
PIDS="$PIDS $!"
i=0; until grep -qs 'registered with the coordinator' "$T/worker.log" || [ $i -ge 100 ]; do
    sleep 0.1; i=$((i + 1))
done
"$T/mge-loadgen" latency "$URL" bench 40 "$T/wd"
# the ranks are the real mge-train: each one that trained to the end left its checkpoint
i=0; while [ "$(ls "$T"/wd/job-*/attempt-1/rank-0/latest.mgeckpt 2>/dev/null | wc -l)" -lt 40 ] &&
    [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
echo "latency_jobs_trained $(ls "$T"/wd/job-*/attempt-1/rank-0/latest.mgeckpt 2>/dev/null | wc -l) of 40 (mge-train, 10 steps each)"
stop_coord

start_coord "$T/s3"
"$T/mge-loadgen" workers "$WURL" join 1000 25 &
LG=$!
sleep 12  # registration and settling
t0=$(cpu_ticks "$COORD"); s0=$(date +%s.%N)
sleep 10
t1=$(cpu_ticks "$COORD"); s1=$(date +%s.%N)
wait $LG
awk -v t="$((t1 - t0))" -v hz="$(getconf CLK_TCK)" -v s0="$s0" -v s1="$s1" \
    'BEGIN { printf("coordinator_cpu_percent %.1f (1000 simulated workers at 1 Hz, %.1f s window)\n", 100 * t / hz / (s1 - s0), s1 - s0) }'
stop_coord
