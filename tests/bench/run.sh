#!/bin/sh
# run.sh: every benchmark, side by side with its reference (PyTorch, raw MPI). `make bench`.
BUILD=${1:-build}
cd "$(dirname "$0")/../.." || exit 1
echo "== engine: mge-train vs PyTorch"
/usr/bin/python3 tests/bench/engine.py "$BUILD" "${MGE_BENCH_THREADS:-2}" "${MGE_BENCH_ROUNDS:-2}"
echo "== gpt: mge-train vs PyTorch (tokens/s)"
/usr/bin/python3 tests/bench/gpt.py "$BUILD" "${MGE_BENCH_THREADS:-2}" "${MGE_BENCH_ROUNDS:-2}"
echo "== sublinear: mge vs PyTorch checkpoint_sequential"
/usr/bin/python3 tests/bench/sublinear.py "$BUILD" "${MGE_BENCH_THREADS:-2}"
echo "== bf16 vs fp32 (train.precision)"
sh tests/bench/bf16.sh "$BUILD" "${MGE_BENCH_THREADS:-2}" "${MGE_BENCH_ROUNDS:-2}"
echo "== int8 vs fp32 inference (mge-infer --precision, PyTorch int8 beside)"
/usr/bin/python3 tests/bench/quant.py "$BUILD" "${MGE_BENCH_THREADS:-2}" "${MGE_BENCH_ROUNDS:-3}"
echo "== checkpoints: background every 20 steps vs off"
/usr/bin/python3 tests/bench/ckpt.py "$BUILD" "${MGE_BENCH_THREADS:-2}"
for b in tests/bench/control.sh tests/bench/comm.sh tests/bench/det.sh tests/bench/eager.sh; do
    [ -f "$b" ] || continue
    echo "== $(basename "$b" .sh)"
    sh "$b" "$BUILD"
done
