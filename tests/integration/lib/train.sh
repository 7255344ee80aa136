# train.sh: helpers for the mge-train integration tests (sourced, not run): BUILD and BIN from
# the first argument, a scratch directory $T removed on exit, the ok/bad counters, json FILE KEY
# (a key of the last JSON line of FILE), losses FILE ("step loss" of each step line of a --json
# run), ge/lt comparisons of two numbers and expect2.
BUILD=${1:-build}
BIN=$(cd "$BUILD/bin" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0; passes=0
ok() { passes=$((passes + 1)); echo "  ok: $*"; }
bad() { fails=$((fails + 1)); echo "  FAIL: $*"; }
json() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])[sys.argv[2]])' "$1" "$2"; }
# the loss of every step line of a --json run, one per line: "step loss"
losses() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if "step" in d and "loss" in d and "final_loss" not in d:
        print(d["step"], d["loss"])' "$1"; }
ge() { python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)' "$1" "$2"; }
lt() { python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)' "$1" "$2"; }
# expect2 NAME TEXT COMMAND...: COMMAND exits 2 and its stderr contains TEXT (a fixed string)
expect2() {
    name=$1; needle=$2; shift 2
    "$@" > "$T/bad.out" 2> "$T/bad.err"; rc=$?
    if [ $rc -eq 2 ] && grep -qF -- "$needle" "$T/bad.err"; then ok "$name: exit 2, '$(head -c 150 "$T/bad.err" | head -n 1)'"
    else bad "$name: exit $rc, stderr: $(cat "$T/bad.err")"; fi
}
