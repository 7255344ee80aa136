#!/bin/sh
# control.sh: control-plane benchmarks (called from tests/bench/run.sh with the build dir).
#   1. job submissions per second through REST          goal >= 2000/s
#   2. submit-to-rank-spawn latency p50                 goal <= 50 ms
#   3. GET /jobs p99 with 10,000 jobs stored            goal <= 50 ms
#   4. coordinator CPU with 1,000 simulated workers at 1 Hz   goal <= 20% of one core
#   5. coordinator CPU with 500 idle SSE subscribers (GET /jobs/{id}/events on a queued job)
# `sh tests/bench/control.sh BUILD sse` runs benchmark 5 alone (BUILD may be an older build).
# The simulated workers come from mge-loadgen, a load generator: they only heartbeat. The
# worker of benchmark 2 is a real mge-worker running the real mge-train.
BUILD=${1:-build}
BIN=$BUILD/bin
T=$(mktemp -d "${TMPDIR:-/tmp}/mge-bench.XXXXXX")
PIDS=""
trap 'for p in $PIDS; do kill $p 2>/dev/null; done; sleep 0.2; rm -rf "$T"' EXIT
trap 'exit 130' INT TERM

cc -std=c11 -D_GNU_SOURCE -O2 -I. -I"$BUILD/gen" tests/bench/mge-loadgen.c worker/link_frame.c \
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
# context switches of all of a process's threads: each wakeup of a polling thread is one
ctx_switches() { cat /proc/"$1"/task/*/status | awk '/ctxt_switches/ { n += $2 } END { print n }'; }

sse_idle() { # 500 idle subscribers of one queued job: coordinator CPU over 10 s
    start_coord "$T/s5"
    id=$(curl -s -H 'Authorization: Bearer bench' -H 'Content-Type: application/yaml' \
        --data-binary "$(printf 'name: idle\nmodel: {type: mlp, hidden: [32]}\ndata: {format: synthetic, train_size: 256, test_size: 0, input_dim: 784, classes: 10}\ntrain: {steps: 10, batch_size: 32, optimizer: {type: sgd, lr: 0.05}}\n')" \
        "$URL/api/v1/jobs" | sed -n 's/.*"id":\([0-9]*\).*/\1/p')
    "$T/mge-loadgen" sse "${URL#http://}" bench "$id" "${SSE_N:-500}" 16 &
    LG=$!
    sleep 4  # connect and settle
    t0=$(cpu_ticks "$COORD"); c0=$(ctx_switches "$COORD"); s0=$(date +%s.%N)
    sleep 10
    t1=$(cpu_ticks "$COORD"); c1=$(ctx_switches "$COORD"); s1=$(date +%s.%N)
    wait $LG
    awk -v n="${SSE_N:-500}" -v t="$((t1 - t0))" -v c="$((c1 - c0))" -v hz="$(getconf CLK_TCK)" -v s0="$s0" -v s1="$s1" \
        'BEGIN { printf("sse_idle_cpu_percent %.2f (%d idle subscribers, %.1f s window, %d ticks, %d context switches)\n", 100 * t / hz / (s1 - s0), n, s1 - s0, t, c) }'
    stop_coord
}
if [ "${2:-}" = sse ]; then
    sse_idle
    exit 0
fi

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
sse_idle
