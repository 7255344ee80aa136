#!/bin/sh
# run-tests.sh: run every unit test binary (Check), then integration and short fuzz runs.
# Prints each suite's Check summary and a closing "N passed, N failed, N skipped" line over suites.
BUILD=${1:-build}
passed=0; failed=0; skipped=0; failed_names=""
run_one() { # name, command...
    name=$1; shift
    echo "== $name"
    "$@"
    rc=$?
    if [ $rc -eq 0 ]; then passed=$((passed + 1))
    elif [ $rc -eq 77 ]; then skipped=$((skipped + 1)); echo "   (skipped)"
    else failed=$((failed + 1)); failed_names="$failed_names $name"; fi
}
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
# the GPU suites are built only with nvcc (and NCCL): say so when they are not (make test-gpu)
for t in test_cuda test_comm_nccl; do
    [ -x "$BUILD/tests/$t" ] && continue
    echo "== $t"; echo "skip - $t: not built (no nvcc or NCCL: a CPU-only build)"
    skipped=$((skipped + 1))
done
for t in tests/integration/*.sh; do
    [ -f "$t" ] || continue
    run_one "$(basename "$t" .sh)" sh "$t" "$BUILD"
done
if [ -f tests/fuzz/run.sh ] && [ -z "$MGE_NO_FUZZ" ]; then
    run_one fuzz-short sh tests/fuzz/run.sh "$BUILD" short
fi
for t in tests/e2e/run.sh; do
    [ -f "$t" ] || continue
    run_one e2e sh "$t" "$BUILD"
done
echo
[ -n "$failed_names" ] && echo "failed:$failed_names"
echo "suites: $passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
