#!/bin/sh
# control_worker_faults.sh: faults a worker must handle, performed on real daemons:
#  0. numeric flags of mge-worker that are not integers in range are refused;
#  1. a rank whose process exits while a grandchild holds its stdout/stderr open still ends
#     (the worker kills its group and closes the pipes after a short delay);
#  2. a symlink inside the data root flipping between a dataset inside the root and a valid
#     dataset outside it while 40 jobs read it: no job reads the outside file, no message
#     shows its contents (the roots are checked on the file mge-train opened);
#  3. a worker whose work directory is a full filesystem: the attempt ends with "no space left
#     on device writing spec", as the worker's fault, and the job runs on a healthy worker.
. "$(dirname "$0")/lib/control.sh"

WORKER_TIMEOUT=2
start_coord
JOBS=40

worker_lost() { api GET /api/v1/workers | jq -e --arg n "$1" '.workers[] | select(.name == $n and .state == "lost")' >/dev/null; }
# stop_worker NAME: end it and wait until the coordinator stops placing jobs there
stop_worker() {
    eval "kill \$WORKER_PID_$1"
    wait_until 15 worker_lost "$1" || fail "worker $1 was not marked lost"
}
job_field() { api GET "/api/v1/jobs/$1" | jq -r "$2"; }
state_events() { # JOB: the job's state events so far, one JSON object a line
    curl -s -N --max-time 2 -H "Authorization: Bearer $ADMIN" "$URL/api/v1/jobs/$1/events" |
        sed -n 's/^data: \({"state".*\)$/\1/p'
}
finished() { s=$(job_state "$1"); [ "$s" = succeeded ] || [ "$s" = failed ] || [ "$s" = cancelled ]; }

# ---------------------------------------------------------------- 0. numeric flags
# "2x" or "0" used to become 2 or "every core" (atoi): now exit 2 naming the flag
for fv in "--cpus 2x" "--cpus 0" "--cpus 4097" "--memory-mb -5" "--heartbeat-ms 10"; do
    # shellcheck disable=SC2086 # flag and value are two words
    "$BIN/mge-worker" --coordinator "$WORKER_URL" --join-token-file "$T/join" --name bad $fv \
        >"$T/flag.out" 2>&1
    rc=$?
    check "mge-worker $fv: exit 2 and '$(head -n 1 "$T/flag.out")'" \
        sh -c "[ $rc -eq 2 ] && grep -q -- '^mge-worker: ${fv%% *}: expected an integer between' '$T/flag.out'"
done

# ---------------------------------------------------------------- 1. grandchild holds stdout
cat > "$T/holdout.sh" <<EOF
#!/bin/sh
# a rank whose child outlives it, holding the rank's stdout and stderr
echo "holdout: starting a grandchild"
sleep 300 &
echo \$! > "$T/grandchild.pid"
exit 3
EOF
chmod +x "$T/holdout.sh"
start_worker wg --train-bin "$T/holdout.sh"
printf 'name: holdout\n%s\n%s\ntrain: {steps: 5, batch_size: 32, %s}\n' "$QUICK_MODEL" \
    "$QUICK_DATA" "$QUICK_OPT" > "$T/holdout.yaml"
t0=$(date +%s)
JOB=$(submit_yaml "$T/holdout.yaml")
check "a rank whose grandchild holds its stdout open still ends (job failed within 20 s)" \
    wait_until 20 state_is "$JOB" failed
ok "... it took $(( $(date +%s) - t0 )) s"
check "... with the rank's own exit code as the reason" \
    sh -c "curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$JOB' | jq -e '.failure_reason == \"rank 0 exited with code 3\"' >/dev/null"
check "... and the grandchild was killed with the rank's process group" \
    wait_until 5 sh -c "! kill -0 \$(cat '$T/grandchild.pid') 2>/dev/null"
check "... and the line it printed before reached the job's log" \
    sh -c "curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$JOB/logs' | jq -e '.lines | any(.text == \"holdout: starting a grandchild\")' >/dev/null"
stop_worker wg

# ---------------------------------------------------------------- 2. flipping symlink
# inside the root: 64 samples (2 steps of 32); outside: a valid IDX set of 96 samples (3 steps)
# whose pixels spell a marker, so a job that read it shows it by its step count or its text
mkdir -p "$T/data/real" "$T/outside"
python3 - "$T/data/real" "$T/outside" <<'EOF'
import struct, sys
def idx(path, dims, data):
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + data)
inside, outside = sys.argv[1], sys.argv[2]
idx(inside + "/images", [64, 4, 4], bytes((i * 37) % 256 for i in range(64 * 16)))
idx(inside + "/labels", [64], bytes(i % 2 for i in range(64)))
secret = (b"OUTSIDE-SECRET-" * 200)[:96 * 16]
idx(outside + "/images", [96, 4, 4], secret)
idx(outside + "/labels", [96], bytes(i % 5 for i in range(96)))
EOF
ln -s "$T/data/real" "$T/data/cur"
start_worker wd --data-root "$T/data" --cpus 4
python3 - "$T/data" "$T/outside" "$T/flip.stop" <<'EOF' &
import os, sys, time
root, outside, stop = sys.argv[1:]
targets, i = [root + "/real", outside], 0
while not os.path.exists(stop):
    tmp = root + "/cur.new"
    os.symlink(targets[i % 2], tmp)
    os.rename(tmp, root + "/cur")  # atomic: the link always exists, pointing in or out
    i += 1
    time.sleep(0.0005)
EOF
FLIP=$!
PIDS="$PIDS $FLIP"
printf 'name: flip\n%s\ndata: {format: idx, train_images: %s, train_labels: %s}\n' "$QUICK_MODEL" \
    "$T/data/cur/images" "$T/data/cur/labels" > "$T/flip.yaml"
printf 'train: {epochs: 1, batch_size: 32, %s}\n' "$QUICK_OPT" >> "$T/flip.yaml"
: > "$T/flip.jobs"
for i in $(seq 1 $JOBS); do submit_yaml "$T/flip.yaml" >> "$T/flip.jobs"; done
all_finished() { while read -r j; do finished "$j" || return 1; done < "$T/flip.jobs"; }
check "$JOBS jobs reading the flipping link all end" wait_until 90 all_finished
touch "$T/flip.stop"
n_ok=0; n_worker=0; n_train=0; n_outside=0; n_other=0
while read -r j; do
    api GET "/api/v1/jobs/$j" > "$T/j.json"
    api GET "/api/v1/jobs/$j/logs?tail=1000" > "$T/l.json"
    st=$(jq -r .state "$T/j.json")
    if grep -q "OUTSIDE-SECRET\|4f555453\|4f 55 53" "$T/j.json" "$T/l.json"; then
        n_outside=$((n_outside + 1)); echo "     job $j: the outside file's contents are in its record"
    elif [ "$st" = succeeded ] && jq -e '.result.steps == 2' "$T/j.json" >/dev/null; then
        n_ok=$((n_ok + 1))
    elif [ "$st" = succeeded ]; then
        n_outside=$((n_outside + 1)); echo "     job $j: trained $(jq .result.steps "$T/j.json") steps: read outside"
    elif jq -e '.failure_reason | test("^data path .*/cur/(images|labels). is outside the worker.s data roots")' \
            "$T/j.json" >/dev/null; then
        n_worker=$((n_worker + 1))
    elif jq -e '.failure_reason == "rank 0 exited with code 2 (bad input)"' "$T/j.json" >/dev/null &&
            jq -e '.lines | any(.text | test("^mge-train: data path .*/cur/(images|labels). is outside the worker.s data roots"))' \
            "$T/l.json" >/dev/null; then
        n_train=$((n_train + 1))
    else
        n_other=$((n_other + 1)); echo "     job $j: $st: $(jq -r .failure_reason "$T/j.json")"
    fi
done < "$T/flip.jobs"
ok "of $JOBS jobs: $n_ok read inside the root, $n_worker refused by the worker's check at spawn," \
    "$n_train refused by mge-train on the file it opened, $n_outside read outside"
check "0 of $JOBS jobs read the file outside the root" [ "$n_outside" -eq 0 ]
check "every other job was refused as outside the roots (no other failure)" [ "$n_other" -eq 0 ]
check "the link flipped between the worker's check and mge-train's open (refused at open)" \
    [ "$n_train" -ge 1 ]
stop_worker wd

# ---------------------------------------------------------------- 3. full work directory
mkdir -p "$T/probe" "$T/w-wfull"
if ! unshare -m sh -c "mount -t tmpfs -o size=64k mge-probe '$T/probe'" 2>"$T/probe.err"; then
    echo "SKIP - full work directory: cannot mount a tmpfs in a mount namespace here" \
        "($(head -c 200 "$T/probe.err"))"
    finish
fi
# wfull runs in its own mount namespace, its work dir a 256 KiB tmpfs filled to the last byte
unshare -m sh -c 'mount -t tmpfs -o size=256k mge-full "$0" &&
    { dd if=/dev/zero of="$0/fill" bs=4096 2>/dev/null; true; } && exec "$@"' \
    "$T/w-wfull" "$BIN/mge-worker" --coordinator "$WORKER_URL" --join-token-file "$T/join" \
    --name wfull --cpus 2 --memory-mb 4096 --work-dir "$T/w-wfull" --train-bin "$MGE_TRAIN_BIN" \
    --heartbeat-ms 500 >>"$T/worker-wfull.log" 2>&1 &
WORKER_PID_wfull=$!
PIDS="$PIDS $!"
wait_until 10 worker_ready wfull || fail "worker wfull did not register"
start_worker wok
# one job per worker at a time (2 cpus each): whichever lands on wfull must move to wok
printf 'name: disk\n%s\n%s\nresources: {cpus: 2}\ntrain: {steps: 20, batch_size: 32, %s}\n' \
    "$QUICK_MODEL" "$QUICK_DATA" "$QUICK_OPT" > "$T/disk.yaml"
J1=$(submit_yaml "$T/disk.yaml")
J2=$(submit_yaml "$T/disk.yaml")
check "both jobs succeed" wait_until 60 sh -c "[ \"\$(curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$J1' | jq -r .state)\$(curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$J2' | jq -r .state)\" = succeededsucceeded ]"
: > "$T/disk.events"
for j in $J1 $J2; do state_events "$j" | sed "s/^/$j /" >> "$T/disk.events"; done
check "an attempt on wfull ended with 'no space left on device writing spec'" \
    grep -q '"state":"failed","attempt":1,"reason":"worker wfull: no space left on device writing spec .*/w-wfull/job-[0-9]*/attempt-1/rank-0/spec.yaml' "$T/disk.events"
check "... as the worker's fault: requeued, never failed as bad input" \
    sh -c "grep -q '\"state\":\"queued\",\"attempt\":2' '$T/disk.events' && ! grep -q 'bad input' '$T/disk.events'"
check "both ran to success on the healthy worker wok" \
    sh -c "for j in $J1 $J2; do curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/'\$j | jq -e '.placement[0].worker == \"wok\" and .failure_reason == null and .result.steps == 20' >/dev/null || exit 1; done"
moved=$(grep -c '"state":"queued","attempt":2' "$T/disk.events")
ok "$moved job(s) moved from wfull to wok after the disk fault"
finish
