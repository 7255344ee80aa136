/*
 * test_comm_nccl.c: the NCCL backend on one rank and one GPU: all-reduce (blocking and
 * asynchronous), broadcast, all-gather and barrier through engine/comm on device memory.
 * Without a CUDA device it prints the device count and exits 77 (skipped, visibly).
 * Multi-rank NCCL runs need a GPU machine: mpirun -np 2 build/tests/test_comm_nccl.
 */
#include <check.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/comm/comm.h"

#define N_TESTS 2

static struct mge_comm *comm;

static void setup(void)
{
    struct mge_comm_env env;
    char err[256];
    mge_comm_env_read(&env);
    ck_assert_msg(mge_comm_open(&comm, MGE_BACKEND_NCCL, &env, err, sizeof(err)) == MGE_OK, "%s",
                  err);
}

static void teardown(void)
{
    mge_comm_close(comm);
    comm = NULL;
}

START_TEST(test_nccl_allreduce)
{
    int n = 1 << 20, size = mge_comm_size(comm);
    float *h = malloc(sizeof(float) * (size_t)n), *d = NULL;
    ck_assert_ptr_nonnull(h);
    for (int i = 0; i < n; i++)
        h[i] = (float)(i % 1000) * 0.5f;
    ck_assert_int_eq(cudaMalloc((void **)&d, sizeof(float) * (size_t)n), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(d, h, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice),
                     cudaSuccess);
    ck_assert_int_eq(mge_comm_allreduce(comm, d, (size_t)n, MGE_COMM_F32), MGE_OK);
    /* asynchronous, in two packs */
    uint64_t t1, t2;
    struct mge_comm_timing tm;
    ck_assert_int_eq(mge_comm_allreduce_start(comm, d, (size_t)n / 2, MGE_COMM_F32, &t1), MGE_OK);
    ck_assert_int_eq(mge_comm_allreduce_start(comm, d + n / 2, (size_t)n / 2, MGE_COMM_F32, &t2),
                     MGE_OK);
    ck_assert_int_eq(mge_comm_wait(comm, t2, &tm), MGE_OK);
    ck_assert(tm.end >= tm.start);
    ck_assert_int_eq(mge_comm_wait(comm, t1, NULL), MGE_OK);
    float *back = malloc(sizeof(float) * (size_t)n);
    ck_assert_int_eq(cudaMemcpy(back, d, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    for (int i = 0; i < n; i++)
        ck_assert_msg(back[i] == h[i] * (float)(size * size), "[%d] %g != %g", i, back[i],
                      h[i] * (float)(size * size));
    cudaFree(d);
    free(h);
    free(back);
}
END_TEST

START_TEST(test_nccl_broadcast_allgather)
{
    int size = mge_comm_size(comm), rank = mge_comm_rank(comm);
    int64_t mine = 100 + rank, *d = NULL, *all = malloc(sizeof(int64_t) * (size_t)size);
    ck_assert_int_eq(cudaMalloc((void **)&d, sizeof(int64_t) * (size_t)(size + 1)), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(d, &mine, sizeof(mine), cudaMemcpyHostToDevice), cudaSuccess);
    ck_assert_int_eq(mge_comm_allgather(comm, d, sizeof(int64_t), d + 1), MGE_OK);
    ck_assert_int_eq(cudaMemcpy(all, d + 1, sizeof(int64_t) * (size_t)size, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    for (int r = 0; r < size; r++)
        ck_assert_int_eq(all[r], 100 + r);
    ck_assert_int_eq(mge_comm_broadcast(comm, d, sizeof(int64_t), 0), MGE_OK);
    ck_assert_int_eq(cudaMemcpy(&mine, d, sizeof(mine), cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(mine, 100);
    ck_assert_int_eq(mge_comm_barrier(comm), MGE_OK);
    cudaFree(d);
    free(all);
}
END_TEST

int main(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("Running suite(s): comm_nccl\nSKIP: %d NCCL tests skipped: cudaGetDeviceCount "
               "says %d devices (%s); the NCCL backend is built and linked\n",
               N_TESTS, n, cudaGetErrorString(e));
        return 77;
    }
    Suite *s = suite_create("comm_nccl");
    TCase *tc = tcase_create("nccl");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_nccl_allreduce);
    tcase_add_test(tc, test_nccl_broadcast_allgather);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK); /* one CUDA context, one NCCL communicator */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
