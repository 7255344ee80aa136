#!/bin/sh
# run-gpu.sh: the tests that need a GPU (`make test-gpu`): each CUDA kernel and every op of the
# cuda device against the CPU (test_cuda), the MLP and LeNet examples trained on cuda against
# cpu (train_cuda.sh), the NCCL backend on one rank, and on two processes when there are two
# GPUs and Open MPI. Without nvcc or without a device it prints a "skip - ..." line with the
# number of suites skipped and exits 0; a suite that runs and fails exits 1.
BUILD=${1:-build}
passed=0; failed=0; skipped=0
skip() { echo "skip - $*"; skipped=$((skipped + 1)); }
run() { # name, command...
    name=$1; shift
    echo "== $name"
    "$@"
    rc=$?
    if [ $rc -eq 0 ]; then passed=$((passed + 1))
    elif [ $rc -eq 77 ]; then skipped=$((skipped + 1)); echo "skip - $name: no CUDA device"
    else failed=$((failed + 1)); echo "FAIL - $name (exit $rc)"; fi
}
if [ -x "$BUILD/tests/test_cuda" ]; then
    run test_cuda "$BUILD/tests/test_cuda"
else
    skip "test_cuda: not built (nvcc not found: CPU-only build)"
fi
run train_cuda sh tests/integration/train_cuda.sh "$BUILD"
run train_nccl sh tests/integration/train_nccl.sh "$BUILD"
if [ -x "$BUILD/tests/test_comm_nccl" ]; then
    run "test_comm_nccl (1 rank)" "$BUILD/tests/test_comm_nccl"
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    MPIRUN=$(command -v mpirun.openmpi || command -v mpirun)
    if [ "${gpus:-0}" -lt 2 ]; then
        skip "test_comm_nccl (2 processes): needs 2 GPUs, nvidia-smi lists ${gpus:-0}"
    elif [ -z "$MPIRUN" ]; then
        skip "test_comm_nccl (2 processes): Open MPI's mpirun not found"
    else
        run "test_comm_nccl (2 processes)" env OMPI_ALLOW_RUN_AS_ROOT=1 \
            OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$MPIRUN" --bind-to none -np 2 \
            "$BUILD/tests/test_comm_nccl"
    fi
else
    skip "test_comm_nccl (1 rank and 2 processes): not built (no nvcc or no NCCL)"
    skipped=$((skipped + 1)) # two suites
fi
echo "gpu suites: $passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
