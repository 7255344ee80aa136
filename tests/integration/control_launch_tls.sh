#!/bin/sh
# control_launch_tls.sh: the workers' launch sockets over TLS. With a tls+tcp:// worker link
# each worker's launch socket is tls+tcp:// too, with a certificate the worker made at start
# and registered over the authenticated link; rank 0's launch map names, for each peer, the
# one certificate mge-launch accepts. Checked: a 2-worker job runs over them and ends with the
# 1-worker loss; plain tcp:// to a launch socket gets no answer; an impostor with its own
# certificate for the same name, at the URL mge-launch dials, gets no TLS session and no token;
# the real certificate with a wrong token is refused by the worker.
MGE_TEST_TLS=1
. "$(dirname "$0")/lib/control.sh"
command -v openssl >/dev/null 2>&1 || { echo "SKIP: openssl not installed"; exit 77; }
MPIRUN=$(command -v mpirun.openmpi || command -v mpirun)
[ -n "$MPIRUN" ] || { echo "SKIP: mpirun (Open MPI) is not installed"; exit 77; }
[ -x "$BIN/mge-launch" ] || { echo "SKIP: $BIN/mge-launch not built"; exit 77; }
[ -x "$BUILD/tests/mge-forge" ] || { echo "SKIP: $BUILD/tests/mge-forge not built"; exit 77; }

start_coord
start_worker wa
start_worker wb
launch_url() { sed -n 's/.*launch socket on \([^ ]*\).*/\1/p' "$T/worker-$1.log" | tail -1; }
URL_A=$(launch_url wa)
URL_B=$(launch_url wb)
check "both launch sockets are tls+tcp:// ($URL_A, $URL_B)" sh -c \
    "echo '$URL_A $URL_B' | grep -Eq '^tls\\+tcp://127\\.0\\.0\\.1:[1-9][0-9]* tls\\+tcp://127\\.0\\.0\\.1:[1-9][0-9]*$'"

spec() { # NAME WORKERS
    cat <<Y
name: $1
model: {type: mlp, hidden: [64, 32]}
data: {format: synthetic, input_dim: 100, classes: 20, train_size: 1003, test_size: 200}
resources: {workers: $2, cpus: 1}
train: {steps: 60, batch_size: 50, optimizer: {type: sgd, lr: 0.01, momentum: 0.9}, seed: 7}
Y
}
spec one 1 >"$T/one.yaml"
spec two 2 >"$T/two.yaml"
ONE=$(submit_yaml "$T/one.yaml")
TWO=$(submit_yaml "$T/two.yaml")
check "the 1-worker job succeeds" wait_until 60 state_is "$ONE" succeeded
check "the 2-worker job succeeds, its rank 1 started through a TLS launch socket" \
    wait_until 90 state_is "$TWO" succeeded
api GET "/api/v1/jobs/$ONE" >"$T/one.json"
api GET "/api/v1/jobs/$TWO" >"$T/two.json"
check "same final loss as 1 worker (1e-5 relative), 2 ranks on 2 workers" jq -e -n \
    --slurpfile a "$T/one.json" --slurpfile b "$T/two.json" '
    ($a[0].result.final_loss) as $x | ($b[0].result.final_loss) as $y
    | ($x | type) == "number" and (($x - $y) | fabs) <= 1e-5 * ($x | fabs)
    and $b[0].result.ranks == 2 and ([$b[0].placement[].worker] | unique | length) == 2'
check "a worker logged the launch it was asked for" \
    sh -c "grep -h 'job $TWO attempt 1 rank 1: launch requested' '$T/worker-wa.log' '$T/worker-wb.log'"

# rank 0's launch map: every peer with its URL and its certificate file
R0=$(jq -r '.placement[] | select(.rank == 0) | .worker' "$T/two.json")
R1=$(jq -r '.placement[] | select(.rank == 1) | .worker' "$T/two.json")
MAP="$T/w-$R0/job-$TWO/attempt-1/rank-0/launch-map"
line=$(grep "^$R1 1 " "$MAP")
CERT=$(echo "$line" | cut -d' ' -f4)
check "the launch map gives rank 1's worker its tls+tcp:// URL and a certificate file ($line)" \
    sh -c "echo '$line' | grep -q '^$R1 1 tls+tcp://' && [ -s '$CERT' ]"
check "... a self-signed certificate for mge-launch, not a CA" sh -c \
    "openssl x509 -in '$CERT' -noout -subject -issuer -ext basicConstraints 2>/dev/null |
     grep -q 'subject=CN = mge-launch' &&
     openssl x509 -in '$CERT' -noout -issuer | grep -q 'issuer=CN = mge-launch' &&
     openssl x509 -in '$CERT' -noout -ext basicConstraints | grep -q 'CA:FALSE'"
URL_R1=$(echo "$line" | cut -d' ' -f3)

# plain tcp:// to the TLS launch socket: no session, nothing runs
"$BUILD/tests/mge-forge" launch "tcp://${URL_R1#tls+tcp://}" 99 1 1 sometoken "touch $T/pwned-plain" \
    >"$T/forge-plain.out" 2>&1; rc=$?
check "plain tcp:// to a tls+tcp:// launch socket gets no reply (exit $rc, nothing ran)" \
    sh -c "[ $rc = 2 ] && [ ! -e '$T/pwned-plain' ]"

# an impostor at the URL mge-launch dials, with its own certificate for the same name
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=mge-launch -addext subjectAltName=DNS:mge-launch -keyout "$T/fake.key" \
    -out "$T/fake.pem" >"$T/fake-openssl.log" 2>&1
FAKE_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
openssl s_server -accept "127.0.0.1:$FAKE_PORT" -cert "$T/fake.pem" -key "$T/fake.key" \
    -quiet >"$T/impostor.out" 2>&1 &
IMP=$!
PIDS="$PIDS $IMP"
wait_until 5 sh -c "ss -ltn | grep -q '127.0.0.1:$FAKE_PORT '" || true
printf '%s 1 tls+tcp://127.0.0.1:%s %s\n' "$R1" "$FAKE_PORT" "$CERT" >"$T/impostor-map"
TOKEN=secret-launch-token-$$
MGE_LAUNCH_MAP="$T/impostor-map" MGE_LAUNCH_TOKEN=$TOKEN MGE_JOB_ID=99 MGE_ATTEMPT=1 \
    timeout 30 "$BIN/mge-launch" "$R1" true >"$T/impostor-launch.out" 2>&1; rc=$?
sed 's/^/     mge-launch: /' "$T/impostor-launch.out" | head -3
check "mge-launch refuses an impostor's certificate (exit $rc)" [ "$rc" = 1 ]
kill "$IMP" 2>/dev/null
check "... and the impostor never saw the launch token" sh -c "! grep -q '$TOKEN' '$T/impostor.out'"
check "... mge-launch with the right certificate also refuses a map without one" sh -c "
    printf '%s 1 %s -\n' '$R1' '$URL_R1' >'$T/nocert-map'
    MGE_LAUNCH_MAP='$T/nocert-map' MGE_LAUNCH_TOKEN=x MGE_JOB_ID=99 MGE_ATTEMPT=1 \
        '$BIN/mge-launch' '$R1' true 2>&1 | grep -q 'no certificate for the tls+tcp:// launch socket'"

# the real certificate: the session is made, and the worker still checks the token
printf '%s 1 %s %s\n' "$R1" "$URL_R1" "$CERT" >"$T/real-map"
MGE_LAUNCH_MAP="$T/real-map" MGE_LAUNCH_TOKEN=wrong MGE_JOB_ID="$TWO" MGE_ATTEMPT=1 \
    timeout 30 "$BIN/mge-launch" "$R1" "touch $T/pwned-token" >"$T/real-launch.out" 2>&1; rc=$?
check "over TLS with the real certificate a wrong token is refused by the worker (exit $rc)" \
    sh -c "[ $rc = 1 ] && grep -q \"refused rank 1\" '$T/real-launch.out' && [ ! -e '$T/pwned-token' ]"

# a rank the worker does not hold: its Assign may still be on its way, so mge-launch asks again
# (and the worker fetches its commands at each ask) for 5 s before it gives up
t0=$(date +%s.%N)
MGE_LAUNCH_MAP="$T/real-map" MGE_LAUNCH_TOKEN=x MGE_JOB_ID=999 MGE_ATTEMPT=1 \
    timeout 30 "$BIN/mge-launch" "$R1" "touch $T/pwned-999" >"$T/late.out" 2>&1; rc=$?
took=$(secs "$t0" "$(date +%s.%N)")
asks=$(grep -c "job 999 attempt 1 rank 1: launch refused: job 999 attempt 1 has no rank 1" \
    "$T/worker-$R1.log")
check "a rank the worker does not hold is asked for again ($asks asks in $took s), then refused" \
    sh -c "[ $rc = 1 ] && [ $asks -ge 10 ] && awk 'BEGIN { exit !($took >= 4) }' &&
           grep -q 'refused rank 1: job 999 attempt 1 has no rank 1' '$T/late.out' &&
           [ ! -e '$T/pwned-999' ]"
finish
