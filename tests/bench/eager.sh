#!/bin/sh
# eager.sh: what eager mode (mge-train --eager) costs against the static plan, side by side in
# one run (called by run.sh; `make bench`): the median step time of each example, static and
# eager, alternated over rounds so drift in the machine's load hits both alike, and the ratio.
# Knobs: MGE_BENCH_THREADS (default 2), MGE_BENCH_ROUNDS (default 2), MGE_BENCH_STEPS (scales
# every model's steps; default 1).
BUILD=${1:-build}
cd "$(dirname "$0")/../.." || exit 1
export OMP_NUM_THREADS=${MGE_BENCH_THREADS:-2}
ROUNDS=${MGE_BENCH_ROUNDS:-2}
SCALE=${MGE_BENCH_STEPS:-1}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    echo "skip: dataset-fashion-mnist is not installed"; exit 0
fi
NO_TEST="--set data.test_images= --set data.test_labels= --set train.epochs="
run() { # name mode steps spec sets...: one run; its summary line in $T/name.mode.round
    name=$1 mode=$2 steps=$(($3 * SCALE)) spec=$4; shift 4
    e=; [ "$mode" = eager ] && e=--eager
    "$BUILD/bin/mge-train" "$spec" --json "$@" --set train.checkpoint_every=0 --set train.steps="$steps" \
        --out "$T/o" $e 2> "$T/err" | tail -1 > "$T/$name.$mode.$round" || cat "$T/err"
}
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) on $(getconf _NPROCESSORS_ONLN) cores, $OMP_NUM_THREADS threads (shared machines are noisy: compare within a row)"
round=1
while [ $round -le "$ROUNDS" ]; do
    for mode in static eager; do
        run mlp $mode 200 examples/fmnist-mlp.yaml $NO_TEST
        run lenet $mode 100 examples/fmnist-lenet.yaml $NO_TEST
        run resnet20 $mode 10 examples/fmnist-resnet20.yaml $NO_TEST --set train.batch_size=64
        run gpt $mode 40 examples/gpt-text.yaml --set data.test_fraction=0
    done
    round=$((round + 1))
done
python3 - "$T" "$ROUNDS" <<'P'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
print("%-9s %14s %14s %14s" % ("model", "static ms", "eager ms", "eager/static"))
for name in ("mlp", "lenet", "resnet20", "gpt"):
    ms = {}
    for mode in ("static", "eager"):
        v = []
        for r in range(1, rounds + 1):
            try:
                v.append(json.loads(open("%s/%s.%s.%d" % (d, name, mode, r)).read())["median_step_ms"])
            except (OSError, ValueError, KeyError):
                pass
        ms[mode] = statistics.median(v) if v else float("nan")
    print("%-9s %14.2f %14.2f %13.2fx" % (name, ms["static"], ms["eager"], ms["eager"] / ms["static"]))
P
