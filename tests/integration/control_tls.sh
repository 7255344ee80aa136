#!/bin/sh
# control_tls.sh: HTTPS for the REST API and the dashboard (--tls-cert/--tls-key), with
# certificates made here by openssl: mgectl over https with --cacert works, clients without
# the CA and plain HTTP on the TLS port are refused, bad key/cert files refuse the start naming
# the file; the worker link stays plain tcp://.
. "$(dirname "$0")/lib/control.sh"
command -v openssl >/dev/null 2>&1 || { echo "SKIP: openssl not installed"; exit 77; }
unset MGE_TEST_TLS # this test sets up TLS itself
M=$BIN/mgectl
export XDG_CONFIG_HOME="$T/xdg" HOME="$T/home"
unset MGE_CONFIG MGE_TOKEN_FILE MGE_CACERT CURL_CA_BUNDLE
mkdir -p "$T/xdg/mge" "$T/home"

# --- a CA, a server certificate for 127.0.0.1/localhost signed by it, and an unrelated CA
. "$HERE/lib/tls.sh"
tls_certs "$T/tls" || { fail "openssl made no certificates"; cat "$T/tls/openssl.log"; exit 1; }
cp "$T/tls/ca.pem" "$T/tls/otherca.pem" "$T/tls/server.pem" "$T/tls/server.key" "$T/tls/otherca.key" "$T/"

# --- refusals at start: each names the file
refuses() { # DESCRIPTION FILE-NAMED FLAGS...: exits non-zero, names FILE-NAMED on stderr
    d=$1; f=$2; shift 2
    timeout 10 "$BIN/mge-coordinator" --listen 127.0.0.1:0 --worker-listen tcp://127.0.0.1:0 \
        --state-dir "$T/refused" --token-file "$T/tokens" --join-token-file "$T/join" \
        "$@" >"$T/refuse.out" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "$f" "$T/refuse.out"; then
        ok "refuses to start: $d ($(grep -m1 "$f" "$T/refuse.out" | cut -c1-150))"
    else
        fail "refuses to start: $d (rc $rc)"; cat "$T/refuse.out"
    fi
}
refuses "key of another certificate" "does not go with" \
    --tls-cert "$T/server.pem" --tls-key "$T/otherca.key"
refuses "missing key file" "$T/nonexistent.key" \
    --tls-cert "$T/server.pem" --tls-key "$T/nonexistent.key"
echo "not a certificate" >"$T/junk.pem"
refuses "certificate file that is not PEM" "$T/junk.pem" \
    --tls-cert "$T/junk.pem" --tls-key "$T/server.key"
cp "$T/server.key" "$T/open.key"
chmod 644 "$T/open.key"
refuses "key file readable by every user" "$T/open.key" \
    --tls-cert "$T/server.pem" --tls-key "$T/open.key"
refuses "--tls-cert without --tls-key" "go together" --tls-cert "$T/server.pem"

# --- serving HTTPS (through the config file, as a deployment would)
printf 'tls-cert = %s\ntls-key = %s\n' "$T/server.pem" "$T/server.key" >"$T/coord.conf"
start_coord --config "$T/coord.conf"
URL=https://$HTTP_ADDR
export MGE_SERVER=$URL CURL_CA_BUNDLE="$T/ca.pem" # curl(1) of lib/control.sh trusts our CA
check "the coordinator logs that it serves https" grep -q "https api on $HTTP_ADDR" "$T/coordinator.log"
check "the worker link is still plain tcp://" sh -c "echo '$WORKER_URL' | grep -q '^tcp://'"
start_worker w1
check "a worker registers over tcp:// and is listed over https" worker_ready w1

cat >"$T/quick.yaml" <<Y
name: quick-tls
$QUICK_MODEL
$QUICK_DATA
train: {steps: 20, batch_size: 32, $QUICK_OPT}
Y
JOB=$("$M" --cacert "$T/ca.pem" submit "$T/quick.yaml" -o json 2>"$T/submit.err" | jq -r .id)
check "mgectl --cacert submit over https" sh -c "[ -n '$JOB' ] && [ '$JOB' != null ]"
check "the job succeeds" wait_until 60 state_is "$JOB" succeeded
check "mgectl --cacert list shows it" sh -c "'$M' --cacert '$T/ca.pem' list | grep -q quick-tls"
check "MGE_CACERT get shows it" sh -c "MGE_CACERT='$T/ca.pem' '$M' get $JOB | grep -q succeeded"
printf 'cacert: %s\n' "$T/ca.pem" >"$T/xdg/mge/config.yaml"
check "cacert: in config.yaml works" sh -c "'$M' get $JOB -o json | jq -e '.state == \"succeeded\"'"
rm "$T/xdg/mge/config.yaml"

check "the dashboard over https: GET / with the CA returns the page" \
    sh -c "curl -sf --cacert '$T/ca.pem' '$URL/' | grep -qi '<html'"
check "curl without the CA fails verification (exit 60)" \
    sh -c "CURL_CA_BUNDLE= curl -s -o /dev/null --capath /nonexistent '$URL/healthz'; [ \$? = 60 ]"
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://$HTTP_ADDR/healthz")
check "plain HTTP to the TLS port gets no HTTP answer (status '$code')" [ "$code" = 000 ]
check "... which the coordinator logs as a failed TLS handshake, in its own log format" \
    grep -q "coordinator info .*libmicrohttpd: .*handshake" "$T/coordinator.log"
check "... and the coordinator still serves https after it" \
    sh -c "curl -sf --cacert '$T/ca.pem' '$URL/healthz' >/dev/null && kill -0 $COORD_PID"
check "https://localhost verifies too (the certificate's DNS name)" \
    sh -c "curl -sf --cacert '$T/ca.pem' 'https://localhost:${HTTP_ADDR##*:}/healthz' >/dev/null"

"$M" --cacert "$T/otherca.pem" list >/dev/null 2>"$T/wrongca.err"; rc=$?
check "mgectl with the wrong CA exits 3 (unreachable/TLS)" [ "$rc" = 3 ]
check "... and says the certificate does not verify with that CA" \
    grep -q "does not verify with the CA given by --cacert" "$T/wrongca.err"
"$M" list >/dev/null 2>"$T/noca.err"; rc=$?
check "mgectl without a CA (system CAs only) exits 3 and names --cacert" \
    sh -c "[ $rc = 3 ] && grep -q 'give its CA with --cacert' '$T/noca.err'"
check "no token in the coordinator's log" sh -c "! grep -q 'adm-secret\|ro-secret' '$T/coordinator.log'"
check "no token in mgectl's errors" sh -c "! grep -q 'adm-secret' '$T/wrongca.err' '$T/noca.err'"

# --- the worker link over tls+tcp:// (the same certificate; workers verify it with --cacert)
kill "$WORKER_PID_w1" "$COORD_PID"
wait_until 10 sh -c "! kill -0 $COORD_PID"
WORKER_URL=tls+tcp://127.0.0.1:0
start_coord --config "$T/coord.conf"
URL=https://$HTTP_ADDR MGE_SERVER=https://$HTTP_ADDR
check "the worker link is tls+tcp:// now ($WORKER_URL)" sh -c "echo '$WORKER_URL' | grep -q '^tls+tcp://127.0.0.1:[1-9]'"
# by name: NNG's TLS (mbedtls 2.28 in Debian 12) matches the host against the certificate's DNS
# names only, not its IP addresses
TLS_WORKER_URL=tls+tcp://localhost:${WORKER_URL##*:}
WORKER_URL=$TLS_WORKER_URL
start_worker w2 --cacert "$T/ca.pem"
check "a worker with the CA joins over tls+tcp://" worker_ready w2
JOB2=$("$M" --cacert "$T/ca.pem" submit "$T/quick.yaml" -o json | jq -r .id)
check "a job is submitted ($JOB2)" sh -c "[ -n '$JOB2' ] && [ '$JOB2' != null ]"
check "it runs on w2 and succeeds (Assign, steps and result over TLS)" \
    wait_until 60 state_is "$JOB2" succeeded
wstart() { # NAME FLAGS...: a worker that is not expected to join
    n=$1; shift
    mkdir -p "$T/w-$n"
    "$BIN/mge-worker" --coordinator "$TLS_WORKER_URL" --join-token-file "$T/join" --name "$n" \
        --cpus 1 --work-dir "$T/w-$n" --train-bin "$MGE_TRAIN_BIN" "$@" >>"$T/worker-$n.log" 2>&1 &
    PIDS="$PIDS $!"
    echo $!
}
WRONG=$(wstart wrongca --cacert "$T/otherca.pem")
PLAIN=$(wstart plain --coordinator "tcp://${TLS_WORKER_URL#tls+tcp://}")
PIDS="$PIDS $WRONG $PLAIN" # wstart ran in a subshell: its PIDS did not reach this one
sleep 4
unjoined() { ! worker_ready "$1" 2>/dev/null && kill -0 "$2"; } # NAME PID: up, not registered
# the workers listed: w2 (and w1 of the plain-HTTP part, lost since the restart), not those two
unlisted() { api GET /api/v1/workers | jq -e '[.workers[].name] | index("w2") != null and
    index("wrongca") == null and index("plain") == null' >/dev/null; }
check "a worker whose CA does not verify the coordinator cannot join (4 s)" unjoined wrongca "$WRONG"
check "a plain tcp:// worker cannot join the tls+tcp:// port (4 s)" unjoined plain "$PLAIN"
check "... neither is listed at all" unlisted
"$BIN/mge-worker" --coordinator "$TLS_WORKER_URL" --join-token-file "$T/join" --name noca \
    --work-dir "$T/w-noca" >"$T/noca-worker.out" 2>&1; rc=$?
check "a worker without --cacert for tls+tcp:// refuses to start and says why" \
    sh -c "[ $rc != 0 ] && grep -q 'give the CA .* with --cacert' '$T/noca-worker.out'"
[ "$fails" -eq 0 ] || exit 1
