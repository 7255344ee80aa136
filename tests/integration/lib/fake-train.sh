#!/bin/sh
# fake-train.sh: STOPGAP stand-in for mge-train in the control-plane tests until the engine
# lands (the tests pick it through MGE_TRAIN_BIN; see control.sh). It follows mge-train's
# contract: `fake-train.sh SPEC [--set k=v]... [--resume CKPT] [--out DIR] [--json]`, prints
# one JSON line per step, an evaluation line and the summary, and writes ckpt-<step>.mgeckpt
# every 10 steps into --out. Steps come from `steps:` in the spec (default 50); each step
# sleeps FAKE_TRAIN_STEP_MS (default 20). A spec whose name is "fail-me" exits with 1.
spec=$1; shift
out=.; resume=
while [ $# -gt 0 ]; do
    case $1 in
        --out) out=$2; shift 2 ;;
        --resume) resume=$2; shift 2 ;;
        --set) shift 2 ;;
        *) shift ;;
    esac
done
[ -r "$spec" ] || { echo "fake-train: cannot read $spec" >&2; exit 2; }
steps=$(sed -n 's/.*[{ ,]steps:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$spec" | head -n 1)
steps=${steps:-50}
name=$(sed -n 's/^name:[[:space:]]*\([^[:space:]]*\).*/\1/p' "$spec" | head -n 1)
start=1
if [ -n "$resume" ] && [ -r "$resume" ]; then
    start=$(( $(sed -n 's/^step \([0-9]*\)/\1/p' "$resume") + 1 ))
fi
echo "fake-train: rank ${MGE_RANK:-0}/${MGE_WORLD_SIZE:-1} job ${MGE_JOB_ID:-?} steps $start..$steps" >&2
[ "$name" = "fail-me" ] && { echo "fake-train: failing on purpose" >&2; exit 1; }
exec awk -v start="$start" -v steps="$steps" -v out="$out" \
    -v ms="${FAKE_TRAIN_STEP_MS:-20}" 'BEGIN {
    for (s = start; s <= steps; s++) {
        loss = 2.3 * exp(-s / (steps / 3.0)) + 0.05
        printf("{\"step\":%d,\"loss\":%.6f,\"samples_per_sec\":%.1f,\"lr\":0.05}\n", s, loss, 5000 + s)
        fflush()
        if (s % 10 == 0 || s == steps) {
            f = out "/ckpt-" s ".mgeckpt"
            print "step " s > f; close(f)
            print "step " s > (out "/latest"); close(out "/latest")
        }
        if (ms > 0) system("sleep " ms / 1000.0)
    }
    printf("{\"epoch\":1,\"test_accuracy\":0.81,\"test_loss\":%.6f}\n", loss)
    printf("{\"steps\":%d,\"epochs\":1,\"final_loss\":%.6f,\"test_accuracy\":0.81,\"samples_per_sec\":5000.0,\"peak_bytes\":1048576,\"wall_sec\":1.0}\n", steps, loss)
    fflush()
}'
