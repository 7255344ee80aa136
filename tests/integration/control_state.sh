#!/bin/sh
# control_state.sh: the coordinator's state directory under faults, each one performed here:
# a second coordinator on the same directory, a requeue the store cannot write (database
# locked when a worker is lost), a clean restart and a kill -9 restart (nothing lost), a WAL
# deleted or damaged after a kill -9 (refused; the WAL put back starts with every job), a corrupted
# database file (refused with the restore steps; --restore-from a backup starts), and a NUL
# byte in a ?set= value (400).
. "$(dirname "$0")/lib/control.sh"
command -v sqlite3 >/dev/null 2>&1 || { echo "SKIP: sqlite3 not installed"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not installed"; exit 77; }

DB=$T/state/mge.db

# try_coord [flags...]: run a coordinator that should refuse to start; its exit status in
# $rc, its output in $T/refused.log (a coordinator that starts after all is killed at 10 s)
try_coord() {
    timeout 10 "$BIN/mge-coordinator" --listen 127.0.0.1:0 --worker-listen tcp://127.0.0.1:0 \
        --state-dir "$T/state" --token-file "$T/tokens" --join-token-file "$T/join" "$@" \
        >"$T/refused.log" 2>&1
    rc=$?
}
stop_coord() { kill "$COORD_PID"; wait "$COORD_PID" 2>/dev/null; }
kill9_coord() { kill -9 "$COORD_PID"; wait "$COORD_PID" 2>/dev/null; }
job_ids() { api GET '/api/v1/jobs?limit=1000' | jq -c '[.jobs[].id] | sort'; }
quick_job() { # NAME -> job id
    printf 'name: %s\n%s\n%s\ntrain: {steps: 20, batch_size: 32, %s}\n' "$1" "$QUICK_MODEL" \
        "$QUICK_DATA" "$QUICK_OPT" >"$T/quick.yaml"
    submit_yaml "$T/quick.yaml"
}

start_coord
start_worker w1

# ---- a second coordinator on the same state directory
try_coord
check "a second coordinator on the same state directory refuses to start (exit $rc)" [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]
check "... naming the holder's pid ($COORD_PID)" grep -q "in use by another coordinator (pid $COORD_PID " "$T/refused.log"
check "... before it touched the store (nothing logged by it)" sh -c "! grep -q 'store\|scheduler' '$T/refused.log'"
J1=$(quick_job first)
check "the first coordinator still serves and its job runs to the end" wait_until 30 state_is "$J1" succeeded

# ---- a NUL byte in a ?set= value, as the body path refuses it
printf 'name: nul\n%s\n%s\ntrain: {steps: 5, batch_size: 32, %s}\n' "$QUICK_MODEL" "$QUICK_DATA" \
    "$QUICK_OPT" >"$T/nul.yaml"
api POST '/api/v1/jobs?set=train.steps%3D7%00rm' -H 'Content-Type: application/yaml' \
    --data-binary "@$T/nul.yaml" >"$T/nul.json"
check "?set= with %00 is refused with 400" [ "$(status)" = 400 ]
check "... naming the parameter" jq -e '.detail | test("set= parameter 1 contains a NUL byte")' "$T/nul.json"
check "... and nothing was stored" [ "$(api GET '/api/v1/jobs?limit=1000' | jq '[.jobs[] | select(.name == "nul")] | length')" = 0 ]

# ---- a clean restart
stop_coord
check "a clean stop leaves no WAL behind" [ ! -e "$DB-wal" ]
check "... and clears the open marker" [ "$(sqlite3 "$DB" "SELECT count(*) FROM meta WHERE key = 'open'")" = 0 ]
start_coord
check "a clean restart starts with the job" state_is "$J1" succeeded

# ---- a kill -9 restart
J2=$(quick_job second)
wait_until 30 state_is "$J2" succeeded
before=$(job_ids)
kill9_coord
check "kill -9 leaves the WAL in place" [ -e "$DB-wal" ]
start_coord
check "a restart after kill -9 starts with every job ($before)" [ "$(job_ids)" = "$before" ]
J3=$(quick_job third)
check "... and hands out a new id ($J3 > $J2)" [ "$J3" -gt "$J2" ]
wait_until 30 state_is "$J3" succeeded

# ---- a WAL deleted after an unclean stop: committed jobs only in the WAL
sqlite3 "$DB" 'PRAGMA wal_checkpoint(TRUNCATE)' >/dev/null
TOKEN=$ADMIN api POST /api/v1/workers/w1/drain >/dev/null # keep the next jobs queued
for i in 1 2 3; do quick_job "walonly$i" >/dev/null; done
before=$(job_ids)
check "three committed jobs are in the WAL only" [ "$(sqlite3 -cmd 'PRAGMA query_only=1' "file:$DB?immutable=1" "SELECT count(*) FROM jobs WHERE name LIKE 'walonly%'")" = 0 ]
kill9_coord
mv "$DB-wal" "$T/saved-wal"
rm -f "$DB-shm"
try_coord
check "a deleted WAL after kill -9 refuses to start (exit $rc)" [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]
check "... saying the write-ahead log is gone and how to restore" \
    sh -c "grep -q \"write-ahead log '$DB-wal' is gone\" '$T/refused.log' && grep -q -- '--restore-from' '$T/refused.log'"
cp "$T/saved-wal" "$DB-wal"
python3 -c 'import sys; f = open(sys.argv[1], "r+b"); o = 32 + 24 + 100; f.seek(o); b = f.read(1); f.seek(o); f.write(bytes([b[0] ^ 0xff]))' "$DB-wal"
try_coord
check "a WAL damaged in its first frame refuses to start (exit $rc)" [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]
check "... saying the write-ahead log is damaged and how to restore" \
    sh -c "grep -q \"write-ahead log '$DB-wal' is damaged (frame 1 fails its checksum\" '$T/refused.log' && grep -q -- '--restore-from' '$T/refused.log'"
mv "$T/saved-wal" "$DB-wal"
start_coord
check "the WAL put back: it starts with every job, none lost ($before)" [ "$(job_ids)" = "$before" ]

# ---- a worker lost while the database is locked: the requeue is retried until it is stored
TOKEN=$ADMIN api POST /api/v1/workers/w1/drain >/dev/null
kill "$(eval echo \$WORKER_PID_w1)"
wait_until 10 sh -c "! kill -0 $(eval echo \$WORKER_PID_w1) 2>/dev/null"
start_worker w2
printf 'name: long\n%s\n%s\ntrain: {steps: 100000, batch_size: 128, %s}\n' "$LONG_MODEL" \
    "$LONG_DATA" "$LONG_OPT" >"$T/long.yaml"
JL=$(submit_yaml "$T/long.yaml")
check "a long job runs on w2" wait_until 30 state_is "$JL" running
python3 - "$DB" "$T/release" >"$T/locker.out" 2>&1 <<'PY' &
import os, sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], timeout=20, isolation_level=None)
db.execute("BEGIN IMMEDIATE")  # holds the write lock: every write of the coordinator fails
print("locked", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
db.execute("COMMIT")
PY
LOCKER=$!
PIDS="$PIDS $LOCKER"
check "another process holds the database's write lock" wait_until 20 grep -q locked "$T/locker.out"
kill -9 "$(eval echo \$WORKER_PID_w2)"
# Every write the coordinator tries meanwhile waits out SQLite's 5 s busy timeout (the exit
# reports of w2's short jobs, the lost-worker marks), so the refusal comes 15-30 s after the kill.
check "w2 is lost and the requeue cannot be written" \
    wait_until 60 grep -q "job $JL attempt 1: worker lost: w2, but the requeue cannot be stored" "$T/coordinator.log"
check "... the job is not requeued while the write fails" state_is "$JL" running
touch "$T/release"
wait "$LOCKER"
check "once the database is writable the requeue is stored: queued, attempt 2" \
    wait_until 15 sh -c "curl -s -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$JL' | jq -e '.state == \"queued\" and .attempt == 2' >/dev/null"
check "... by the retry" grep -q "job $JL attempt 1: worker lost: w2 (requeued on retry)" "$T/coordinator.log"

# ---- a corrupted database file: refused with the restore steps; a backup restores it
sqlite3 "$DB" ".backup '$T/backup.db'"
high=$(quick_job after-backup) # lost with the restore below; its id must not come back
stop_coord
page=$(sqlite3 "$DB" "SELECT pageno FROM dbstat WHERE name = 'events' AND pagetype = 'leaf' LIMIT 1 OFFSET 1")
check "the events table has a second leaf page ($page) to corrupt" [ -n "$page" ]
dd if=/dev/urandom of="$DB" bs=4096 seek=$((page - 1)) count=1 conv=notrunc 2>/dev/null
try_coord
check "a corrupted database refuses to start (exit $rc)" [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]
check "... saying it failed its integrity check and how to restore the backup" \
    sh -c "grep -q 'failed its integrity check' '$T/refused.log' && grep -q -- '--restore-from BACKUP-FILE' '$T/refused.log'"
try_coord --restore-from "$T/no-such-backup.db"
check "--restore-from a missing backup refuses and changes nothing" \
    sh -c "[ $rc -ne 0 ] && [ $rc -ne 124 ] && ! ls '$DB'.replaced-* >/dev/null 2>&1"
start_coord --restore-from "$T/backup.db"
check "--restore-from the backup starts" state_is "$J1" succeeded
check "... with the backup's jobs (job $high came after it)" sh -c "[ \"\$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer $ADMIN' '$URL/api/v1/jobs/$high')\" = 404 ]"
check "... keeping the damaged file beside it" sh -c "ls '$DB'.replaced-* >/dev/null"
J4=$(quick_job after-restore)
check "... and ids are not handed out again ($J4 > $high)" [ "$J4" -gt "$high" ]
finish
