#!/bin/sh
# bf16.sh: train.precision bf16 against fp32, median step time of mge-train on the MLP, LeNet
# and ResNet-20 (Fashion-MNIST, batch 128), fp32 and bf16 alternating, best median of ROUNDS
# rounds each. Part of `make bench`; alone: sh tests/bench/bf16.sh build [THREADS] [ROUNDS].
BUILD=${1:-build}
THREADS=${2:-${MGE_BENCH_THREADS:-2}}
ROUNDS=${3:-${MGE_BENCH_ROUNDS:-2}}
cd "$(dirname "$0")/../.." || exit 1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), avx512_bf16: $(grep -q avx512_bf16 /proc/cpuinfo && echo yes || echo no), $THREADS threads, load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-10s %14s %14s %8s\n' model "fp32 ms/step" "bf16 ms/step" "speedup"
for m in mlp:300 lenet:300 resnet20:40; do
    name=${m%:*}; steps=${m#*:}
    for r in $(seq "$ROUNDS"); do
        for p in fp32 bf16; do
            "$BUILD/bin/mge-train" "examples/fmnist-$name.yaml" --threads "$THREADS" --json \
                --set train.steps="$steps" --set train.eval=false --set train.precision="$p" \
                --out "$T/out" > "$T/$name-$p-$r.json" 2>"$T/err" || { cat "$T/err"; exit 1; }
        done
    done
    python3 - "$T" "$name" "$ROUNDS" <<'EOF'
import json, sys
t, name, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
def best(p):
    return min(json.loads(open("%s/%s-%s-%d.json" % (t, name, p, r)).read().strip().splitlines()[-1])
               ["median_step_ms"] for r in range(1, rounds + 1))
a, b = best("fp32"), best("bf16")
print("%-10s %14.2f %14.2f %7.2fx" % (name, a, b, a / b))
EOF
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
