#!/bin/sh
# run_conv.sh: build and run the conv backend benchmark (LeNet shapes, or ResNet-20's with "resnet"
# as $4, at $5 threads only if given; "cpu" as $6 times CPU, not wall, time); "busy" as $2 adds
# one spinning process; $3 is the batch size (default 128); "dw" as $7 (with "resnet") times the
# weight gradients of the stride-1 3x3 convs alone: direct, Winograd F(2x2) and F(4x4).
#   sh tests/bench/run_conv.sh [build] [busy] [batch] [resnet] [threads] [cpu] [dw]
set -e
BUILD=${1:-build}
make --no-print-directory BUILD="$BUILD" "$BUILD/lib/libmgekernels.a"
cc -std=c11 -D_GNU_SOURCE -O2 -fopenmp -I. tests/bench/bench_conv.c \
    "$BUILD/lib/libmgekernels.a" -o "$BUILD/bench_conv" \
    $(pkg-config --libs openblas 2>/dev/null || echo -lopenblas) -ldnnl -lm
unset OPENBLAS_CORETYPE
if [ "$2" = busy ]; then
    sh -c 'while :; do :; done' &
    spinner=$!
    trap 'kill $spinner' EXIT
    echo "(one busy spinner running)"
fi
cat /proc/loadavg
"$BUILD/bench_conv" ${3:-128} $4 $5 $6 $7
