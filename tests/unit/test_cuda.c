/*
 * test_cuda.c: each CUDA kernel against its CPU kernel (the oracle). Tolerances: GEMM
 * 1e-4 * K relative to the output scale, elementwise 1e-5, cross-entropy 1e-5.
 * Without a CUDA device every test is skipped, visibly, and the binary exits 77.
 */
#include <check.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda.h"
#include "worker/gpus.h"

/* the worker reads cudaDeviceProp without CUDA's headers (worker/gpus.c): its offsets hold */
_Static_assert(offsetof(struct cudaDeviceProp, totalGlobalMem) == MGE_CUDA_PROP_TOTAL_MEM_OFF,
               "cudaDeviceProp.totalGlobalMem moved: update MGE_CUDA_PROP_TOTAL_MEM_OFF");
_Static_assert(offsetof(struct cudaDeviceProp, name) == 0 &&
                   sizeof(((struct cudaDeviceProp *)0)->name) == MGE_CUDA_PROP_NAME_LEN,
               "cudaDeviceProp.name moved: update MGE_CUDA_PROP_NAME_LEN");

#define N_TESTS 8 /* 4 GEMM transpose cases, bias_act, relu backward, cross-entropy, sgd */

static struct mge_rng rng;

static float *rand_host(int64_t n)
{
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        p[i] = 2.0f * mge_rng_float(&rng) - 1.0f;
    return p;
}

static float *dev_copy(const void *h, size_t bytes)
{
    void *d = NULL;
    ck_assert_int_eq(mge_cuda_malloc(&d, bytes), MGE_OK);
    ck_assert_int_eq(mge_cuda_to_device(d, h, bytes), MGE_OK);
    return d;
}

static void expect_close(const float *gpu_dev, const float *cpu, int64_t n, double tol)
{
    float *h = malloc(sizeof(float) * (size_t)n);
    ck_assert_int_eq(mge_cuda_to_host(h, gpu_dev, sizeof(float) * (size_t)n), MGE_OK);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(fabs(h[i] - cpu[i]) <= tol * (1.0 + fabs(cpu[i])), "[%lld] gpu %g cpu %g",
                      (long long)i, h[i], cpu[i]);
    free(h);
}

START_TEST(test_cuda_sgemm)
{
    int ta = _i & 1, tb = (_i >> 1) & 1, M = 37, N = 53, K = 129;
    float *A = rand_host((int64_t)M * K), *B = rand_host((int64_t)K * N), *C = rand_host((int64_t)M * N);
    float *dA = dev_copy(A, sizeof(float) * (size_t)M * K), *dB = dev_copy(B, sizeof(float) * (size_t)K * N);
    float *dC = dev_copy(C, sizeof(float) * (size_t)M * N);
    int lda = ta ? M : K, ldb = tb ? K : N;
    mge_cpu_sgemm_ref(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.5f, C, N);
    ck_assert_int_eq(mge_cuda_sgemm(ta, tb, M, N, K, 1.0f, dA, lda, dB, ldb, 0.5f, dC, N), MGE_OK);
    expect_close(dC, C, (int64_t)M * N, 1e-4 * K);
    mge_cuda_free(dA);
    mge_cuda_free(dB);
    mge_cuda_free(dC);
    free(A);
    free(B);
    free(C);
}
END_TEST

START_TEST(test_cuda_bias_act)
{
    int64_t rows = 33, cols = 70;
    float *x = rand_host(rows * cols), *b = rand_host(cols), *y = malloc(sizeof(float) * (size_t)(rows * cols));
    float *dx = dev_copy(x, sizeof(float) * (size_t)(rows * cols)), *db = dev_copy(b, sizeof(float) * (size_t)cols);
    for (int act = MGE_CPU_IDENTITY; act <= MGE_CPU_SIGMOID; act++) {
        float *dy = NULL;
        ck_assert_int_eq(mge_cuda_malloc((void **)&dy, sizeof(float) * (size_t)(rows * cols)), MGE_OK);
        mge_cpu_bias_act_forward(act, y, x, b, rows, cols);
        ck_assert_int_eq(mge_cuda_bias_act_forward(act, dy, dx, db, rows, cols), MGE_OK);
        expect_close(dy, y, rows * cols, 1e-5);
        mge_cuda_free(dy);
    }
    mge_cuda_free(dx);
    mge_cuda_free(db);
    free(x);
    free(b);
    free(y);
}
END_TEST

START_TEST(test_cuda_relu_backward)
{
    int64_t n = 1000;
    float *dout = rand_host(n), *out = rand_host(n), *din = rand_host(n);
    float *d_dout = dev_copy(dout, sizeof(float) * n), *d_out = dev_copy(out, sizeof(float) * n);
    float *d_din = dev_copy(din, sizeof(float) * n);
    mge_cpu_unary_backward(MGE_CPU_RELU, din, dout, NULL, out, n, 1);
    ck_assert_int_eq(mge_cuda_relu_backward(d_din, d_dout, d_out, n, 1), MGE_OK);
    expect_close(d_din, din, n, 1e-6);
    mge_cuda_free(d_dout);
    mge_cuda_free(d_out);
    mge_cuda_free(d_din);
    free(dout);
    free(out);
    free(din);
}
END_TEST

START_TEST(test_cuda_softmax_xent)
{
    int64_t B = 16, V = 10;
    float *logits = rand_host(B * V), probs[160], dl[160], loss;
    int32_t labels[16];
    for (int i = 0; i < B; i++)
        labels[i] = (int32_t)mge_rng_below(&rng, (uint64_t)V);
    float *d_logits = dev_copy(logits, sizeof(float) * (size_t)(B * V));
    int32_t *d_labels = (int32_t *)dev_copy(labels, sizeof(labels));
    float *d_probs = NULL, *d_loss = NULL, *d_dl = NULL;
    ck_assert_int_eq(mge_cuda_malloc((void **)&d_probs, sizeof(probs)), MGE_OK);
    ck_assert_int_eq(mge_cuda_malloc((void **)&d_dl, sizeof(dl)), MGE_OK);
    ck_assert_int_eq(mge_cuda_malloc((void **)&d_loss, sizeof(float)), MGE_OK);
    mge_cpu_softmax_xent_forward(&loss, probs, logits, labels, B, V);
    mge_cpu_softmax_xent_backward(dl, probs, labels, B, V, 1.0f, 0);
    ck_assert_int_eq(mge_cuda_softmax_xent_forward(d_loss, d_probs, d_logits, d_labels, B, V), MGE_OK);
    ck_assert_int_eq(mge_cuda_softmax_xent_backward(d_dl, d_probs, d_labels, B, V, 1.0f, 0), MGE_OK);
    expect_close(d_loss, &loss, 1, 1e-5);
    expect_close(d_probs, probs, B * V, 1e-5);
    expect_close(d_dl, dl, B * V, 1e-5);
    mge_cuda_free(d_logits);
    mge_cuda_free(d_labels);
    mge_cuda_free(d_probs);
    mge_cuda_free(d_dl);
    mge_cuda_free(d_loss);
    free(logits);
}
END_TEST

START_TEST(test_cuda_sgd)
{
    int64_t n = 777;
    float *p = rand_host(n), *g = rand_host(n), *v = rand_host(n);
    float *dp = dev_copy(p, sizeof(float) * n), *dg = dev_copy(g, sizeof(float) * n), *dv = dev_copy(v, sizeof(float) * n);
    mge_cpu_sgd_update(p, g, v, n, 0.1f, 0.9f, 0.01f, 1);
    ck_assert_int_eq(mge_cuda_sgd_update(dp, dg, dv, n, 0.1f, 0.9f, 0.01f, 1), MGE_OK);
    expect_close(dp, p, n, 1e-6);
    expect_close(dv, v, n, 1e-6);
    mge_cuda_free(dp);
    mge_cuda_free(dg);
    mge_cuda_free(dv);
    free(p);
    free(g);
    free(v);
}
END_TEST

int main(void)
{
    if (mge_cuda_device_count() == 0) {
        printf("Running suite(s): cuda\nSKIP: %d CUDA kernel tests skipped: no CUDA device "
               "(built with nvcc; the CPU kernels are checked by test_kernels)\n",
               N_TESTS);
        return 77;
    }
    char name[256];
    mge_cuda_device_name(name, sizeof(name));
    printf("cuda device: %s\n", name);
    mge_rng_seed(&rng, 2024);
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("kernels");
    tcase_add_loop_test(tc, test_cuda_sgemm, 0, 4);
    tcase_add_test(tc, test_cuda_bias_act);
    tcase_add_test(tc, test_cuda_relu_backward);
    tcase_add_test(tc, test_cuda_softmax_xent);
    tcase_add_test(tc, test_cuda_sgd);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
