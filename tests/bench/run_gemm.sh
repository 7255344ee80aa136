#!/bin/sh
# run_gemm.sh: build and run the SGEMM backend benchmark; "busy" as $2 adds one spinning process.
#   sh tests/bench/run_gemm.sh [build] [busy]
set -e
BUILD=${1:-build}
make --no-print-directory BUILD="$BUILD" "$BUILD/lib/libmgekernels.a"
cc -std=c11 -D_GNU_SOURCE -O2 -fopenmp -I. tests/bench/bench_gemm.c \
    "$BUILD/lib/libmgekernels.a" -o "$BUILD/bench_gemm" \
    $(pkg-config --libs openblas 2>/dev/null || echo -lopenblas) -ldnnl -lm
unset OPENBLAS_CORETYPE
if [ "$2" = busy ]; then
    sh -c 'while :; do :; done' &
    spinner=$!
    trap 'kill $spinner' EXIT
    echo "(one busy spinner running)"
fi
"$BUILD/bench_gemm"
