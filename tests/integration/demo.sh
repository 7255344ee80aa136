#!/bin/sh
# demo.sh: `make demo` as a newcomer sees it (deploy/demo.sh with a short job, on the binaries
# and dashboard already built): at most 30 lines piped and on a pseudo-terminal, the live
# progress line on the terminal, the final accuracy, the dashboard link (served, its token
# accepted) and KEEP=1 keeping the cluster up until Ctrl-C, which then stops every process.
. "$(dirname "$0")/lib/control.sh"
command -v script >/dev/null 2>&1 || { echo "SKIP: script (util-linux) not installed"; exit 77; }
ROOT=$(cd "$HERE/../.." && pwd)
BUILD_ABS=$(cd "$BUILD" && pwd)
cat > "$T/quick.yaml" <<Y
name: demo-quick
$QUICK_MODEL
$QUICK_DATA
train:
  epochs: 3
  batch_size: 32
  $QUICK_OPT
Y
export MGE_DEMO_NO_BUILD=1 MGE_DEMO_LISTEN=127.0.0.1:0 MGE_DEMO_SPEC="$T/quick.yaml"
export MGE_DEMO_DIR="$T/demo"
unset KEEP MGE_SERVER MGE_TOKEN
cd "$ROOT" || exit 1

# --- piped
sh deploy/demo.sh "$BUILD_ABS" >"$T/piped.out" 2>&1; rc=$?
n=$(wc -l <"$T/piped.out")
check "piped: the demo exits 0 (the job's code)" [ "$rc" = 0 ]
check "piped: $n lines of output (at most 30)" [ "$n" -le 30 ]
check "piped: the final accuracy" grep -Eq '^job [0-9]+ succeeded: step 48/48, loss [0-9.]+, test accuracy [0-9.]+%' "$T/piped.out"
check "piped: where to look next" grep -q '^demo: mgectl: export MGE_CONFIG=' "$T/piped.out"
if [ -f "$BUILD/web/index.html" ]; then
    check "piped: the dashboard link with its token" grep -Eq '^demo: dashboard: http://127\.0\.0\.1:[0-9]+/#/jobs/[0-9]+\?token=[0-9a-f]{32}$' "$T/piped.out"
else
    check "piped: no dashboard built, and it says so" grep -q 'no dashboard' "$T/piped.out"
fi
check "piped: everything stopped" sh -c "! grep -q 'stays up' '$T/piped.out' && grep -q '^demo: stopped' '$T/piped.out'"

# --- a terminal: the progress line is rewritten in place
script -qec "sh deploy/demo.sh '$BUILD_ABS'" /dev/null </dev/null >"$T/pty.out" 2>&1; rc=$?
n=$(wc -l <"$T/pty.out")
check "pty: the demo exits 0" [ "$rc" = 0 ]
check "pty: $n lines (at most 30)" [ "$n" -le 30 ]
check "pty: the live progress line reached 48/48" \
    grep -q "$(printf '\033')\\[K\\[####################\\] step 48/48  loss" "$T/pty.out"

# --- KEEP=1: up until stopped (a signal to the demo's process group, as a terminal sends it)
# not a group leader when started with & here, so setsid runs in place: $! is the group
setsid sh -c "trap : TERM; KEEP=1 sh deploy/demo.sh '$BUILD_ABS' >'$T/keep.out' 2>&1; echo \$? >'$T/keep.rc'" \
    </dev/null >/dev/null 2>&1 &
PG=$!
wait_until 60 grep -q 'stays up' "$T/keep.out"
check "KEEP=1: the cluster stays up after the job" grep -q 'stays up' "$T/keep.out"
URL=http://$(sed -n 's/^http=//p' "$T/demo/ports")
if [ -f "$BUILD/web/index.html" ]; then
    check "KEEP=1: the dashboard is served" sh -c "curl -sf '$URL/' | grep -q '<title>mge'"
fi
TOK=$(sed -n 's/.*token=\([0-9a-f]*\)$/\1/p' "$T/keep.out")
[ -n "$TOK" ] || TOK=$(cat "$T/demo/admin.token")
check "KEEP=1: the link's token opens the API" \
    sh -c "curl -sf -H 'Authorization: Bearer $TOK' '$URL/api/v1/jobs' >/dev/null"
# a command started with & by a script has SIGINT ignored (and sh cannot trap a signal
# ignored on entry), so the stop comes as SIGTERM, which demo.sh traps like SIGINT
/bin/kill -s TERM -- "-$PG"
wait_until 20 test -s "$T/keep.rc"
check "stopped: the demo exits with the job's code (0)" [ "$(cat "$T/keep.rc" 2>/dev/null)" = 0 ]
check "stopped: the coordinator is gone" sh -c "! curl -s -m 2 '$URL/healthz' >/dev/null"
check "stopped: no process of the demo is left" \
    sh -c "! ps -eo pgid= | awk '\$1 == \"$PG\"' | grep -q ."
/bin/kill -s KILL -- "-$PG" 2>/dev/null # whatever a failed check above left
finish
