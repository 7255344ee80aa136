# control.sh: helpers for the control-plane integration tests (sourced, not run).
# Real daemons on loopback: mge-coordinator, mge-worker, mgectl; free ports (port 0 and a
# ports file); every process started here is killed on exit; waits poll with deadlines.
BUILD=${1:-build}
BIN=$BUILD/bin
HERE=$(cd "$(dirname "$0")" && pwd)
for tool in curl jq; do
    command -v $tool >/dev/null 2>&1 || { echo "SKIP: $tool not installed"; exit 77; }
done
for b in mge-coordinator mge-worker mgectl mge-train; do
    [ -x "$BIN/$b" ] || { echo "SKIP: $BIN/$b not built"; exit 77; }
done
[ "${MGE_TEST_TLS:-0}" = 1 ] || MGE_TEST_TLS= # start_coord: HTTPS when 1
# The training binary the workers run: the real engine (MGE_TRAIN_BIN overrides it).
MGE_TRAIN_BIN=${MGE_TRAIN_BIN:-$(cd "$BIN" && pwd)/mge-train}

T=$(mktemp -d "${TMPDIR:-/tmp}/mge-control.XXXXXX")
# what the daemons and their ranks put in TMPDIR (a worker's per-rank MPI directories, which a
# worker killed with -9 leaves behind) goes with the run's directory
export TMPDIR="$T"
PIDS=""
fails=0
cleanup() {
    # TERM first: a worker kills its ranks' process groups when it stops
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    sleep 0.3
    for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
    # ranks a worker killed with -9 left behind (each has its own process group; they die of
    # SIGPIPE on their next line, but do not wait for that): found by this run's work dirs
    for p in $(rank_cmdlines "$T/w-" | cut -d' ' -f1); do kill -9 "$p" 2>/dev/null; done
    if [ "$fails" -ne 0 ] || [ -n "$KEEP" ]; then
        echo "--- logs kept in $T"; tail -n 20 "$T"/*.log 2>/dev/null
    else
        rm -rf "$T"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

printf 'admin %s\nread %s\n' adm-secret ro-secret > "$T/tokens"
echo join-secret > "$T/join"
ADMIN=adm-secret
RO=ro-secret

ok()   { echo "ok   - $*"; }
fail() { echo "FAIL - $*"; fails=$((fails + 1)); }
check() { # description, command...
    d=$1; shift
    if "$@" >/dev/null; then ok "$d"; else fail "$d"; fi
}

# wait_until TIMEOUT_S COMMAND...: poll every 0.1 s
wait_until() {
    t=$1; shift
    end=$(( $(date +%s) + t ))
    while [ "$(date +%s)" -le "$end" ]; do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    return 1
}

# start_coord [extra flags...]: (re)start the coordinator; the first start picks free ports.
# MGE_TEST_TLS=1: it serves HTTPS with certificates made here (lib/tls.sh), and curl and mgectl
# trust their CA (CURL_CA_BUNDLE, MGE_CACERT); $URL is then https://, and the worker link is
# tls+tcp:// (start_worker dials it as localhost with --cacert)
start_coord() {
    listen=${HTTP_ADDR:-127.0.0.1:0}
    wlisten=${WORKER_URL:-tcp://127.0.0.1:0}
    [ -z "$MGE_TEST_TLS" ] || wlisten=tls+tcp://${wlisten#*://}
    set -- ${MGE_TEST_TLS:+--tls-cert "$T/tls/server.pem" --tls-key "$T/tls/server.key"} "$@"
    if [ -n "${MGE_TEST_TLS:-}" ] && [ ! -s "$T/tls/server.pem" ]; then
        . "$HERE/lib/tls.sh"
        tls_certs "$T/tls" || { fail "openssl made no certificates"; exit 1; }
        export CURL_CA_BUNDLE="$T/tls/ca.pem" MGE_CACERT="$T/tls/ca.pem"
    fi
    rm -f "$T/ports"
    "$BIN/mge-coordinator" --listen "$listen" --worker-listen "$wlisten" --state-dir "$T/state" \
        --token-file "$T/tokens" --join-token-file "$T/join" --ports-file "$T/ports" \
        --worker-timeout "${WORKER_TIMEOUT:-3}" --heartbeat-ms 500 --cancel-grace-ms 1000 \
        "$@" >>"$T/coordinator.log" 2>&1 &
    COORD_PID=$!
    PIDS="$PIDS $COORD_PID"
    wait_until 10 test -s "$T/ports" || { fail "coordinator did not start"; exit 1; }
    HTTP_ADDR=$(sed -n 's/^http=//p' "$T/ports")
    WORKER_URL=$(sed -n 's/^worker=//p' "$T/ports")
    URL=http${MGE_TEST_TLS:+s}://$HTTP_ADDR
    [ -z "$MGE_TEST_TLS" ] || { grep -q "https api on $HTTP_ADDR" "$T/coordinator.log" &&
        grep -q "worker link on tls+tcp://" "$T/coordinator.log"; } ||
        fail "MGE_TEST_TLS=1 but the coordinator does not serve https and tls+tcp://"
    export MGE_SERVER=$URL MGE_TOKEN=$ADMIN
}

# start_worker NAME [extra flags...]; $WORKER_RUN, when set, is a command prefix that execs the
# worker elsewhere (lib/netns.sh: WORKER_RUN="netns_exec I" runs it in node I)
start_worker() {
    name=$1; shift
    mkdir -p "$T/w-$name"
    wurl=$WORKER_URL # under MGE_TEST_TLS by name: NNG's mbedtls checks DNS names only
    [ -z "$MGE_TEST_TLS" ] || set -- --cacert "$T/tls/ca.pem" "$@"
    [ -z "$MGE_TEST_TLS" ] || wurl=tls+tcp://localhost:${WORKER_URL##*:}
    $WORKER_RUN "$BIN/mge-worker" --coordinator "$wurl" --join-token-file "$T/join" --name "$name" \
        --cpus 2 --memory-mb 4096 --work-dir "$T/w-$name" --train-bin "$MGE_TRAIN_BIN" \
        --heartbeat-ms 500 "$@" >>"$T/worker-$name.log" 2>&1 &
    eval "WORKER_PID_$name=$!"
    PIDS="$PIDS $!"
    wait_until 10 worker_ready "$name" || fail "worker $name did not register"
}

# worker_ready NAME: it is registered and in state $WAIT_STATE (default ready)
worker_ready() { api GET /api/v1/workers | jq -e --arg n "$1" --arg s "${WAIT_STATE:-ready}" '.workers[] | select(.name == $n and .state == $s)' >/dev/null; }

# api METHOD PATH [curl args...]: body on stdout, status in $T/status
api() {
    m=$1; p=$2; shift 2
    curl -s -o "$T/body" -w '%{http_code}' -X "$m" -H "Authorization: Bearer ${TOKEN:-$ADMIN}" \
        "$@" "$URL$p" >"$T/status"
    cat "$T/body"
}
status() { cat "$T/status"; }

submit_yaml() { # FILE -> prints job id
    api POST /api/v1/jobs -H 'Content-Type: application/yaml' --data-binary "@$1" | jq -r .id
}
job_state() { api GET "/api/v1/jobs/$1" | jq -r .state; }
state_is() { [ "$(job_state "$1")" = "$2" ]; }

# loss_steps_exact JOB N: loss metrics are exactly steps 1..N, each once, and the model
# learned: SGD's per-step loss is noisy, so compare the means of the first and last tenth
loss_steps_exact() {
    api GET "/api/v1/jobs/$1/metrics?name=loss" | jq -e --argjson n "$2" '
        [.metrics[].step] as $s | [.metrics[].value] as $v
        | (([$n / 10 | floor, 1] | max) as $k
           | ($v[:$k] | add / length) as $first | ($v[-$k:] | add / length) as $last
           | $last < $first / 2)
          and ($s == [range(1; $n + 1)])' >/dev/null
}

# job_step JOB: the last step the job reported (0 before the first)
job_step() { api GET "/api/v1/jobs/$1" | jq -r '.progress.step // 0'; }
step_at_least() { [ "$(job_step "$1")" -ge "$2" ]; }
n_checkpoints() { api GET "/api/v1/jobs/$1/checkpoints" | jq '[.checkpoints[] | select(.name != "latest")] | length'; }
has_checkpoint() { [ "$(n_checkpoints "$1")" -ge 1 ]; }

# Elastic jobs, of the job $JOB. inc_field K FILTER: incarnation K (1-based), through a jq filter
inc_field() { api GET "/api/v1/jobs/$JOB" | jq -r --argjson k "$1" ".incarnations[\$k - 1] | $2"; }
# ckpt_after STEP: a checkpoint past STEP is indexed
ckpt_after() { api GET "/api/v1/jobs/$JOB/checkpoints" | jq -e --argjson s "$1" 'any(.checkpoints[]; .step > $s)'; }
# step_time STEP: when the loss of STEP was reported (epoch seconds, ms precision), or fail
step_time() {
    api GET "/api/v1/jobs/$JOB/metrics?name=loss" | jq -e --argjson s "$1" '
        first(.metrics[] | select(.step == $s) | .time
              | (.[0:19] + "Z" | fromdateiso8601) + (.[20:23] | tonumber) / 1000)'
}
# step_after STEP T0: STEP was reported after T0 (epoch seconds)
step_after() { ts=$(step_time "$1") && [ "$(echo "$ts > $2" | bc -l)" -eq 1 ]; }

# rank_cmdlines PATTERN: "PID COMMAND LINE" of the mge-train processes whose command line
# (NULs as spaces) contains PATTERN. A rank of worker wa: "--out $T/w-wa/" (its --resume
# path may name another worker's directory).
rank_cmdlines() {
    for d in /proc/[0-9]*; do
        [ "$(cat "$d/comm" 2>/dev/null)" = mge-train ] || continue
        cmd=$(tr '\0' ' ' 2>/dev/null <"$d/cmdline")
        # this run's ranks only (their --out lies under $T): not another run's job of that id
        case $cmd in *"$T"*) ;; *) continue ;; esac
        case $cmd in *"$1"*) echo "${d#/proc/} $cmd" ;; esac
    done
}
ranks_alive() { [ -n "$(rank_cmdlines "$1")" ]; }

# rank_threads_are JOB N: the live rank of JOB was started with --threads N and
# OMP_NUM_THREADS=N (the job's resources.cpus)
rank_threads_are() {
    line=$(rank_cmdlines "--out $T/w-" | grep -F "/job-$1/attempt-" | head -n 1)
    case $line in *" --threads $2 "*) ;; *) return 1 ;; esac
    tr '\0' '\n' 2>/dev/null <"/proc/${line%% *}/environ" | grep -qx "OMP_NUM_THREADS=$2"
}

# Specs the real mge-train accepts. QUICK_* trains in well under a second; LONG_* is a
# 784-1024-1024-10 MLP at batch 128, about 5-25 ms a step on one core (compute bound, so
# its pace varies little between machines): give it steps for the seconds a test needs.
QUICK_DATA='data: {format: synthetic, train_size: 512, test_size: 128, input_dim: 784, classes: 10}'
QUICK_MODEL='model: {type: mlp, hidden: [32]}'
QUICK_OPT='optimizer: {type: sgd, lr: 0.05, momentum: 0.9}'
LONG_DATA='data: {format: synthetic, train_size: 4096, test_size: 512, input_dim: 784, classes: 10}'
LONG_MODEL='model: {type: mlp, hidden: [1024, 1024]}'
LONG_OPT='optimizer: {type: sgd, lr: 0.01, momentum: 0.9}'

# elastic_start NAME STEPS CHECKPOINT_EVERY: skip (77) without Open MPI; a coordinator with a
# 3 s worker timeout, workers wa, wb, wc, and a {min: 2, max: 3} job of the LONG_* MLP (its
# id in $JOB), checked to start on all three
elastic_start() {
    MPIRUN=$(command -v mpirun.openmpi || command -v mpirun)
    [ -n "$MPIRUN" ] || { echo "SKIP: mpirun (Open MPI) is not installed"; exit 77; }
    [ -x "$BIN/mge-launch" ] || { echo "SKIP: $BIN/mge-launch not built"; exit 77; }
    WORKER_TIMEOUT=3
    start_coord
    start_worker wa
    start_worker wb
    start_worker wc
    cat >"$T/$1.yaml" <<Y
name: $1
$LONG_MODEL
$LONG_DATA
resources: {workers: {min: 2, max: 3}, cpus: 1}
train: {steps: $2, batch_size: 128, $LONG_OPT, checkpoint_every: $3}
Y
    JOB=$("$BIN/mgectl" submit "$T/$1.yaml" -o json | jq -r .id)
    check "the {min: 2, max: 3} job starts with 3 workers" wait_until 30 sh -c "
        curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$JOB' |
        jq -e '.state == \"running\" and (.placement | length) == 3' >/dev/null"
}

# iso_epoch TIME: an API time (2026-01-02T03:04:05.678Z) as epoch seconds, ms precision
iso_epoch() { echo "$1" | jq -R '(.[0:19] + "Z" | fromdateiso8601) + (.[20:23] | tonumber) / 1000'; }
# secs A B: B - A in seconds, two decimals
secs() { echo "$2 - $1" | bc -l | awk '{ printf "%.2f", $1 }'; }

finish() {
    if [ "$fails" -eq 0 ]; then echo "all passed"; exit 0; fi
    echo "$fails failed"; exit 1
}
