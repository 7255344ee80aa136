#!/bin/sh
# control_attack.sh: the attacks of issue 10 on the worker link, performed, and refused. The
# attacker has network access to the worker port and the launch sockets, and a READ-ONLY API
# token (which shows worker ids); build/tests/mge-forge speaks the real protocol for them.
#  1. forged heartbeats for a worker id taken from GET /workers (a running and a finished job:
#     an exit, metrics, a result, checkpoint notices naming a file outside the job and
#     /etc/shadow): refused, nothing stored or served, no Assign (no launch token) in a reply;
#     a flood of them does not flood the coordinator's log
#  2. a forged Register without the join token: refused
#  3. replays in a genuine session (the Register again, a frame again, a changed body, an old
#     counter): refused, and the session goes on; after a new Register the old key is dead
#  3b. Registers with the join token that claim what no machine has (negative cores, memory or
#     GPUs, an unknown device, a name with a newline): refused with their reasons
#  4. launch requests to the worker that holds rank 1 of a 2-rank attempt, waiting for its
#     launch: a wrong token, a rank it does not hold, a job it does not hold: refused, the
#     command never ran; the attempt's real token still works (so the refusals mean something)
#  5. an AUTHENTICATED worker whose rank plants checkpoints that lead outside its job dir (a
#     symlink, a hard link): never stored, never served; a file swapped for a symlink after it
#     was stored is not served either
#  6. the coordinator restarts: it knows no session, the workers register again (authenticated)
#     and the link works (a job runs)
. "$(dirname "$0")/lib/control.sh"
FORGE=$BUILD/tests/mge-forge
[ -x "$FORGE" ] || { echo "SKIP: $FORGE not built (make tests-build)"; exit 77; }
[ -x "$BIN/mge-launch" ] || { echo "SKIP: $BIN/mge-launch not built"; exit 77; }

# rank 0 of a 2-rank attempt runs this instead of mpirun: it keeps the attempt's launch token
# (for the positive control of step 4) and never launches rank 1, which waits for its launch
cat >"$T/fake-mpirun" <<S
#!/bin/sh
echo "\$MGE_LAUNCH_TOKEN" >"$T/launch-token.\$MGE_JOB_ID"
exec sleep 60
S
chmod +x "$T/fake-mpirun"
echo "the secret" >"$T/secret"

start_coord
start_worker wa --mpirun "$T/fake-mpirun"
start_worker wb --mpirun "$T/fake-mpirun"
ro() { TOKEN=$RO api "$@"; }

cat >"$T/quick.yaml" <<Y
name: quick
$QUICK_MODEL
$QUICK_DATA
resources: {cpus: 1}
train: {steps: 30, batch_size: 32, $QUICK_OPT, checkpoint_every: 10}
Y
cat >"$T/long.yaml" <<Y
name: long
$LONG_MODEL
$LONG_DATA
resources: {cpus: 1}
train: {steps: 100000, batch_size: 128, $LONG_OPT}
Y
DONE=$(submit_yaml "$T/quick.yaml")
check "a finished job to attack (succeeded, with checkpoints)" wait_until 30 state_is "$DONE" succeeded
RUN=$(submit_yaml "$T/long.yaml")
check "a running job to attack" wait_until 30 step_at_least "$RUN" 1

# --- 1. forged heartbeats with stolen worker ids ---
ro GET /api/v1/workers >"$T/workers.json"
check "the read-only token sees worker ids (what the attacker starts from)" \
    jq -e '[.workers[].id | select(length > 0)] | length == 2' "$T/workers.json"
snapshot() { # JOB FILE: what a forged heartbeat must not change (a running job's metrics grow)
    { ro GET "/api/v1/jobs/$1" | jq -c '{state, result, attempt}'
      [ "$1" = "$RUN" ] || ro GET "/api/v1/jobs/$1/metrics?name=loss" | jq -c '[.metrics[].step] | max'
      ro GET "/api/v1/jobs/$1/checkpoints" | jq -c '[.checkpoints[].name] | sort'; } >"$2"
}
no_forged_metric() { # JOB: neither the forged step nor the forged loss was stored
    ro GET "/api/v1/jobs/$1/metrics?name=loss" |
        jq -e '.metrics | length > 0 and all(.step != 99999 and .value != 12345)'
}
for job in "$DONE" "$RUN"; do
    w=$(ro GET "/api/v1/jobs/$job" | jq -r '.placement[0].worker')
    wid=$(jq -r --arg n "$w" '.workers[] | select(.name == $n) | .id' "$T/workers.json")
    snapshot "$job" "$T/before.$job"
    "$FORGE" heartbeat "$WORKER_URL" "$wid" "$job" 1 "$T/secret" >"$T/forge-hb.$job" 2>&1
    rc=$?
    sed 's/^/     /' "$T/forge-hb.$job"
    check "job $job: 3 forged heartbeats for worker $w refused, no Assign/Cancel/ack in any reply" \
        sh -c "[ $rc -eq 0 ] && [ \$(grep -c 'mac=0 error=\"[a-z]' '$T/forge-hb.$job') -eq 3 ] &&
               ! grep -q 'assign=[1-9]' '$T/forge-hb.$job'"
    sleep 0.6 # a heartbeat interval: anything accepted would be visible now
    snapshot "$job" "$T/after.$job"
    check "... state, result, attempt, metrics and checkpoints of job $job unchanged" \
        cmp -s "$T/before.$job" "$T/after.$job"
    check "... no forged metric stored for job $job" no_forged_metric "$job"
    for name in ckpt-000099.mgeckpt ckpt-000098.mgeckpt; do
        ro GET "/api/v1/jobs/$job/checkpoints/$name" >"$T/dl"
        check "... forged checkpoint $name of job $job not served (HTTP $(status))" \
            sh -c "[ '$(status)' = 404 ] && ! grep -q 'the secret\|root:' '$T/dl'"
    done
done
check "the coordinator logged the bad MACs, naming the worker" \
    grep -q "worker 'w[ab]' (.*): frame with a bad MAC refused" "$T/coordinator.log"
check "job $RUN still runs: the forged exit was not believed" state_is "$RUN" running
n0=$(grep -c 'frame with a bad MAC refused' "$T/coordinator.log")
"$FORGE" flood "$WORKER_URL" "$wid" 500 >"$T/forge-flood" 2>&1
rc=$?
sleep 1.1
"$FORGE" flood "$WORKER_URL" "$wid" 1 >/dev/null 2>&1 # a refusal in the next second: the tally
n1=$(grep -c 'frame with a bad MAC refused' "$T/coordinator.log")
check "a flood of 500 forged heartbeats: all refused, at most 41 logged ($((n1 - n0))), the rest counted" \
    sh -c "[ $rc -eq 0 ] && [ $((n1 - n0)) -le 41 ] && grep -q 'more refused frames not logged' '$T/coordinator.log'"
api POST "/api/v1/jobs/$RUN/cancel" >/dev/null

# --- 2. a forged Register ---
"$FORGE" register "$WORKER_URL" intruder >"$T/forge-reg" 2>&1
rc=$?
sed 's/^/     /' "$T/forge-reg"
check "a Register without the join token is refused" \
    sh -c "[ $rc -eq 0 ] && grep -q 'error=\"bad join token\"' '$T/forge-reg'"
no_intruder() { ro GET /api/v1/workers | jq -e '.workers | length > 0 and all(.name != "intruder")'; }
check "... and no worker 'intruder' exists" no_intruder

# --- 3. replays ---
"$FORGE" replay "$WORKER_URL" "$(cat "$T/join")" replayer >"$T/forge-replay" 2>&1
rc=$?
sed 's/^/     /' "$T/forge-replay"
check "a replayed Register, replayed, altered and old-counter frames are refused; the session goes on; a new Register kills the old key (exit $rc)" \
    sh -c "[ $rc -eq 0 ] && [ \$(grep -c 'error=\"replayed frame\"' '$T/forge-replay') -eq 2 ] &&
           grep -q 'replayed register: mac=0 error=\"replayed register\"' '$T/forge-replay' &&
           grep -q 'previous session.s key: mac=0 error=\"bad frame MAC\"' '$T/forge-replay' &&
           grep -q 'changed body: mac=0 error=\"bad frame MAC\"' '$T/forge-replay'"
check "the coordinator logged the replays, naming the worker" \
    grep -q "worker 'replayer' (.*): replayed frame refused" "$T/coordinator.log"

# --- 3b. a Register with the join token that claims what no machine has ---
"$FORGE" slots "$WORKER_URL" "$(cat "$T/join")" claimer >"$T/forge-slots" 2>&1
rc=$?
sed 's/^/     /' "$T/forge-slots"
check "Registers claiming negative or absurd cores, memory, GPUs, an unknown device or a name with a newline are refused, each with its reason; sane claims are accepted (exit $rc)" \
    sh -c "[ $rc -eq 0 ] && [ \$(grep -c 'genuine register: failed (bad register frame' '$T/forge-slots') -eq 11 ] &&
           grep -q 'negative cpus: genuine register: failed (bad register frame: slots.cpus out of range' '$T/forge-slots' &&
           grep -q 'unknown device: genuine register: failed (bad register frame: slots.device must be' '$T/forge-slots' &&
           grep -q 'absurd memory: genuine register: failed (bad register frame: a GPU.s memory_mb' '$T/forge-slots' &&
           grep -q 'newline: genuine register: failed (bad register frame: the name has control' '$T/forge-slots' &&
           grep -q 'sane claims: genuine register: accepted' '$T/forge-slots'"
claims_kept() {
    ro GET /api/v1/workers | jq -e '[.workers[] | select(.name == "claimer")] | length == 1 and
        (.[0].slots.gpus == 1) and (.[0].slots.cpus == 0) and (.[0].gpus[0].memory_mb == 81920)' >/dev/null &&
    ro GET /api/v1/workers | jq -e 'all(.workers[]; (.name | test("evil")) | not)' >/dev/null
}
check "... the coordinator lists 'claimer' with only its sane claims (1 GPU, no cores) and no 'evil' worker" claims_kept

# --- 4. the launch socket ---
cat >"$T/two.yaml" <<Y
name: two
$QUICK_MODEL
$QUICK_DATA
resources: {workers: 2, cpus: 1}
train: {steps: 30, batch_size: 32, $QUICK_OPT}
Y
TWO=$(submit_yaml "$T/two.yaml")
check "a 2-rank attempt whose rank 1 waits for its launch" wait_until 30 test -s "$T/launch-token.$TWO"
w1=$(ro GET "/api/v1/jobs/$TWO" | jq -r '.placement[1].worker')
lurl=$(sed -n 's/.*launch socket on //p' "$T/worker-$w1.log" | head -n 1)
attack_launch() { # DESCRIPTION EXPECTED-REASON JOB ATTEMPT RANK TOKEN
    d=$1; why=$2; shift 2
    "$FORGE" launch "$lurl" "$@" "touch $T/pwned" >"$T/forge-launch" 2>&1
    rc=$?
    sed 's/^/     /' "$T/forge-launch"
    sleep 0.5
    check "$d: refused, nothing ran" \
        sh -c "[ $rc -eq 0 ] && grep -q '$why' '$T/forge-launch' && [ ! -e '$T/pwned' ]"
}
attack_launch "launch with a wrong token for the waiting rank" "wrong launch token" \
    "$TWO" 1 1 0123456789abcdef0123456789abcdef
attack_launch "launch for a rank that worker does not hold" "has no rank 0 waiting" \
    "$TWO" 1 0 "$(cat "$T/launch-token.$TWO")"
attack_launch "launch for a job that worker does not hold" "has no rank 1 waiting" \
    999 1 1 0123456789abcdef0123456789abcdef
"$FORGE" launch "$lurl" "$TWO" 1 1 "$(cat "$T/launch-token.$TWO")" "touch $T/legit" >"$T/forge-launch"
rc=$?
check "control: the attempt's own token is accepted and its command runs (exit $rc)" \
    sh -c "[ $rc -eq 1 ] && grep -q 'ok=1' '$T/forge-launch'"
check "... (the command ran)" wait_until 10 test -e "$T/legit"
api POST "/api/v1/jobs/$TWO/cancel" >/dev/null

# --- 5. an authenticated worker's rank plants checkpoints leading outside its job ---
cat >"$T/evil-train" <<S
#!/bin/sh
# in the rank's output dir (its cwd): a symlink and a hard link to a file outside it, and a
# real checkpoint file; metric lines make the worker scan the directory and report them
ln -s "$T/secret" ckpt-000007.mgeckpt
ln "$T/secret" ckpt-000008.mgeckpt
echo "real checkpoint bytes" >ckpt-000009.mgeckpt
i=1
while [ \$i -le 6 ]; do echo "{\"step\":\$i,\"loss\":1.0}"; i=\$((i + 1)); sleep 0.3; done
S
chmod +x "$T/evil-train"
api POST /api/v1/workers/wa/drain >/dev/null
api POST /api/v1/workers/wb/drain >/dev/null
REAL_TRAIN=$MGE_TRAIN_BIN
MGE_TRAIN_BIN=$T/evil-train
start_worker we
MGE_TRAIN_BIN=$REAL_TRAIN
EVIL=$(submit_yaml "$T/quick.yaml")
has_ckpt9() { ro GET "/api/v1/jobs/$EVIL/checkpoints" | jq -e '.checkpoints | any(.name == "ckpt-000009.mgeckpt")'; }
check "the planted job ran on the authenticated worker 'we'" wait_until 30 has_ckpt9
check "... its real checkpoint file is stored" has_ckpt9
wait_until 20 eval "! state_is $EVIL running" >/dev/null
planted_not_stored() {
    ro GET "/api/v1/jobs/$EVIL/checkpoints" |
        jq -e '[.checkpoints[].name] | (index("ckpt-000007.mgeckpt") == null) and (index("ckpt-000008.mgeckpt") == null)'
}
check "... the symlink and the hard link are never stored" planted_not_stored
for name in ckpt-000007.mgeckpt ckpt-000008.mgeckpt; do
    ro GET "/api/v1/jobs/$EVIL/checkpoints/$name" >"$T/dl"
    check "... and never served: $name HTTP $(status)" \
        sh -c "[ '$(status)' = 404 ] && ! grep -q 'the secret' '$T/dl'"
done
# the worker does not report the symlink at all (lstat in its checkpoint scan); the coordinator's
# own symlink refusal is exercised by test_ckpt_path
check "the coordinator logged the hard link's refusal with the worker and job" sh -c "
    grep -q \"checkpoint 'ckpt-000008.mgeckpt' of job $EVIL attempt 1 rank 0 refused: .*one link\" '$T/coordinator.log'"
ro GET "/api/v1/jobs/$EVIL/checkpoints/ckpt-000009.mgeckpt" >"$T/dl"
check "control: the real checkpoint is served (HTTP $(status))" \
    sh -c "[ '$(status)' = 200 ] && grep -q 'real checkpoint bytes' '$T/dl'"
f9=$(ls "$T"/w-we/job-"$EVIL"/attempt-1/rank-0/ckpt-000009.mgeckpt)
rm -f "$f9" && ln -s "$T/secret" "$f9"
ro GET "/api/v1/jobs/$EVIL/checkpoints/ckpt-000009.mgeckpt" >"$T/dl"
check "... swapped for a symlink after it was stored, it is not served (HTTP $(status))" \
    sh -c "[ '$(status)' = 404 ] && ! grep -q 'the secret' '$T/dl'"

# --- 6. a coordinator restart: every worker registers again ---
kill "$COORD_PID"
wait "$COORD_PID" 2>/dev/null
start_coord
check "after a coordinator restart worker 'we' registered again (authenticated)" \
    wait_until 15 sh -c "[ \$(grep -c 'registered with the coordinator as' '$T/worker-we.log') -ge 2 ]"
check "... because the coordinator asked it to" grep -q 'coordinator asks us to register again' "$T/worker-we.log"
AFTER=$(submit_yaml "$T/quick.yaml")
check "... and the link works: a job runs on it to the end" wait_until 30 state_is "$AFTER" succeeded
finish
