/*
 * test_cuda.c: the cuda device against the CPU (the oracle), in two layers.
 * Kernels: every function of kernels/cuda/cuda.h against its CPU kernel on random inputs,
 * overwriting and accumulating (acc). Bounds, as the largest difference over the largest |cpu|:
 * 0 (the same bits) for copies, permutes, embedding and the dropout mask; 1e-6 where the
 * arithmetic is the same op for op (bias gradient, binary ops, sums, pooling; nvcc may fuse a
 * multiply-add); 1e-5 for exp/tanh-based and row-reduced ops (activations, softmax,
 * cross-entropy, layer norm, attention forward, the optimisers); 1e-4 where the summation order
 * differs (cuDNN's convolutions, batch norm's N*H*W sums, attention backward); GEMM 1e-4 * K.
 * Graphs: small MLP, LeNet-like, ResNet-like, GPT-like and "misc" graphs that together hold
 * every op the cuda ops table has, forward and backward, built once on the cpu device and once
 * on cuda with the same parameters and inputs; one training step, then an SGD step (Nesterov,
 * weight decay) after clipping by global norm, and an inference run: loss, output, every
 * gradient and every parameter (batch-norm running statistics included) compared, each tensor
 * by its largest difference relative to its largest magnitude. Bounds: 1e-4 for graphs of GEMMs and
 * elementwise ops (cuBLAS sums in another order), 1e-3 for graphs with cuDNN convolutions and
 * batch norm (another summation order over N*H*W).
 * The engine's AdamW (with clipping and a no-decay span) runs on both devices from the same
 * parameters and gradients: 1e-5.
 * Without a GPU: the checks that need none run (every op of the table is covered by the graphs;
 * the cuda device refuses a graph with an op it has no kernel for, naming it; the graph harness
 * on the sim device is bit-identical to the CPU), then the GPU tests are skipped, visibly, with
 * their count, and the binary exits 77.
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
#include "engine/device.h"
#include "engine/engine.h"
#include "engine/engine_int.h"
#include "engine/optim.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda.h"
#include "worker/gpus.h"

/* the worker reads cudaDeviceProp without CUDA's headers (worker/gpus.c): its offsets hold */
_Static_assert(offsetof(struct cudaDeviceProp, totalGlobalMem) == MGE_CUDA_PROP_TOTAL_MEM_OFF,
               "cudaDeviceProp.totalGlobalMem moved: update MGE_CUDA_PROP_TOTAL_MEM_OFF");
_Static_assert(offsetof(struct cudaDeviceProp, name) == 0 &&
                   sizeof(((struct cudaDeviceProp *)0)->name) == MGE_CUDA_PROP_NAME_LEN,
               "cudaDeviceProp.name moved: update MGE_CUDA_PROP_NAME_LEN");

/* 4 GEMM transpose cases, bias_act, relu backward, cross-entropy, sgd, adam and l2 norm, the
 * engine's optimiser; 10 kernel groups overwriting and accumulating; 5 graphs */
#define N_GPU_TESTS 35

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
    float *A = rand_host((int64_t)M * K), *B = rand_host((int64_t)K * N),
          *C = rand_host((int64_t)M * N);
    float *dA = dev_copy(A, sizeof(float) * (size_t)M * K),
          *dB = dev_copy(B, sizeof(float) * (size_t)K * N);
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
    float *x = rand_host(rows * cols), *b = rand_host(cols),
          *y = malloc(sizeof(float) * (size_t)(rows * cols));
    float *dx = dev_copy(x, sizeof(float) * (size_t)(rows * cols)),
          *db = dev_copy(b, sizeof(float) * (size_t)cols);
    for (int act = MGE_CPU_IDENTITY; act <= MGE_CPU_SIGMOID; act++) {
        float *dy = NULL;
        ck_assert_int_eq(mge_cuda_malloc((void **)&dy, sizeof(float) * (size_t)(rows * cols)),
                         MGE_OK);
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
    ck_assert_int_eq(mge_cuda_softmax_xent_forward(d_loss, d_probs, d_logits, d_labels, B, V),
                     MGE_OK);
    ck_assert_int_eq(mge_cuda_softmax_xent_backward(d_dl, d_probs, d_labels, B, V, 1.0f, 0),
                     MGE_OK);
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
    float *dp = dev_copy(p, sizeof(float) * n), *dg = dev_copy(g, sizeof(float) * n),
          *dv = dev_copy(v, sizeof(float) * n);
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

START_TEST(test_cuda_adam)
{
    int64_t n = 1001;
    float *p = rand_host(n), *g = rand_host(n), *m = rand_host(n), *v = rand_host(n);
    for (int64_t i = 0; i < n; i++)
        v[i] = fabsf(v[i]);
    float *dp = dev_copy(p, sizeof(float) * n), *dg = dev_copy(g, sizeof(float) * n);
    float *dm = dev_copy(m, sizeof(float) * n), *dv = dev_copy(v, sizeof(float) * n);
    mge_cpu_adam_update(p, g, m, v, n, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 1, 3);
    ck_assert_int_eq(
        mge_cuda_adam_update(dp, dg, dm, dv, n, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 1, 3), MGE_OK);
    expect_close(dp, p, n, 1e-5);
    expect_close(dm, m, n, 1e-6);
    expect_close(dv, v, n, 1e-6);
    double nc = mge_cpu_l2_norm(g, n), ng = 0.0;
    ck_assert_int_eq(mge_cuda_l2_norm(&ng, dg, n), MGE_OK);
    ck_assert_msg(fabs(nc - ng) <= 1e-12 * nc, "l2 norm: gpu %.17g cpu %.17g", ng, nc);
    mge_cuda_free(dp);
    mge_cuda_free(dg);
    mge_cuda_free(dm);
    mge_cuda_free(dv);
    free(p);
    free(g);
    free(m);
    free(v);
}
END_TEST

/* Largest |gpu - cpu| over the largest |cpu|, within @tol. */
static void expect_rel(const char *graph, const char *what, const float *gpu, const float *cpu,
                       int64_t n, double tol)
{
    double diff = 0.0, mag = 0.0;
    int64_t worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)gpu[i] - (double)cpu[i]);
        ck_assert_msg(isfinite(gpu[i]), "%s: %s[%lld] is %g on cuda", graph, what, (long long)i,
                      gpu[i]);
        if (d > diff) {
            diff = d;
            worst = i;
        }
        mag = fabs(cpu[i]) > mag ? fabs(cpu[i]) : mag;
    }
    double rel = mag > 0.0 ? diff / mag : diff;
    printf("  %-7s %-11s %6lld values: max rel diff %.2e (bound %.0e)\n", graph, what, (long long)n,
           rel, tol);
    ck_assert_msg(rel <= tol, "%s: %s[%lld]: cuda %.9g, cpu %.9g (%.2e of the max %.3g)", graph,
                  what, (long long)worst, gpu[worst], cpu[worst], rel, mag);
}

/* ---- every kernel of cuda.h against its CPU kernel, overwriting and accumulating (_i: acc) ----
 */

/* A device copy of @n random floats, with the host values in *@host (malloc'd). */
static float *rand_dev(int64_t n, float **host)
{
    *host = rand_host(n);
    return dev_copy(*host, sizeof(float) * (size_t)n);
}

/* Device @d against host @cpu: largest difference relative to the largest |cpu|, within @tol. */
static void expect_dev(const char *what, const float *d, const float *cpu, int64_t n, double tol)
{
    float *h = malloc(sizeof(float) * (size_t)n);
    ck_assert_int_eq(mge_cuda_to_host(h, d, sizeof(float) * (size_t)n), MGE_OK);
    expect_rel("kernel", what, h, cpu, n, tol);
    free(h);
}

START_TEST(test_cuda_unary)
{
    int64_t n = 3001;
    for (int op = MGE_CPU_IDENTITY; op <= MGE_CPU_SIGMOID; op++) {
        float *x, *dy, *dx, *y = malloc(sizeof(float) * n);
        float *dx_ = rand_dev(n, &x), *ddy = rand_dev(n, &dy), *ddx = rand_dev(n, &dx);
        float *dyv = NULL;
        ck_assert_int_eq(mge_cuda_malloc((void **)&dyv, sizeof(float) * n), MGE_OK);
        mge_cpu_unary_forward(op, y, x, n);
        ck_assert_int_eq(mge_cuda_unary_forward(op, dyv, dx_, n), MGE_OK);
        expect_dev("unary forward", dyv, y, n, 1e-5);
        /* backward from the CPU's forward output on both sides */
        ck_assert_int_eq(mge_cuda_to_device(dyv, y, sizeof(float) * n), MGE_OK);
        mge_cpu_unary_backward(op, dx, dy, x, y, n, _i);
        ck_assert_int_eq(mge_cuda_unary_backward(op, ddx, ddy, dx_, dyv, n, _i), MGE_OK);
        expect_dev("unary backward", ddx, dx, n, 1e-5);
        mge_cuda_free(dx_);
        mge_cuda_free(ddy);
        mge_cuda_free(ddx);
        mge_cuda_free(dyv);
        free(x);
        free(dy);
        free(dx);
        free(y);
    }
}
END_TEST

START_TEST(test_cuda_bias_binary_sum_to)
{
    int64_t rows = 37, cols = 70, shape[3] = {3, 4, 5};
    float *dy, *db, *ddy = rand_dev(rows * cols, &dy), *ddb = rand_dev(cols, &db);
    mge_cpu_bias_backward(db, dy, rows, cols, _i);
    ck_assert_int_eq(mge_cuda_bias_backward(ddb, ddy, rows, cols, _i), MGE_OK);
    expect_dev("bias backward", ddb, db, cols, 1e-6);
    /* a (3, 4, 5) with b (4, 1) broadcast; sum back onto b's shape */
    int64_t sa[3] = {20, 5, 1}, sb[3] = {0, 1, 0}, n = 60;
    float *a, *b, *out = malloc(sizeof(float) * n), *da = rand_dev(n, &a), *dbb = rand_dev(4, &b);
    float *dout = NULL;
    ck_assert_int_eq(mge_cuda_malloc((void **)&dout, sizeof(float) * n), MGE_OK);
    for (int op = MGE_CPU_ADD; op <= MGE_CPU_DIV; op++) {
        mge_cpu_binary_forward(op, out, a, sa, b, sb, shape, 3);
        ck_assert_int_eq(mge_cuda_binary_forward(op, dout, da, sa, dbb, sb, shape, 3), MGE_OK);
        expect_dev("binary", dout, out, n, 1e-6);
    }
    mge_cpu_sum_to(b, sb, a, shape, 3, _i);
    ck_assert_int_eq(mge_cuda_sum_to(dbb, sb, da, shape, 3, _i), MGE_OK);
    expect_dev("sum_to (4, 1)", dbb, b, 4, 1e-6);
    int64_t sl[3] = {0, 0, 1}; /* onto (5): the last dim kept */
    float *c5, *dc5 = rand_dev(5, &c5);
    mge_cpu_sum_to(c5, sl, a, shape, 3, _i);
    ck_assert_int_eq(mge_cuda_sum_to(dc5, sl, da, shape, 3, _i), MGE_OK);
    expect_dev("sum_to (5)", dc5, c5, 5, 1e-6);
    mge_cuda_free(dc5);
    free(c5);
    mge_cpu_scale(out, a, 0.3f, n);
    ck_assert_int_eq(mge_cuda_scale(dout, da, 0.3f, n), MGE_OK);
    mge_cpu_axpy(out, a, -1.5f, n);
    ck_assert_int_eq(mge_cuda_axpy(dout, da, -1.5f, n), MGE_OK);
    expect_dev("scale, axpy", dout, out, n, 1e-6);
    mge_cuda_free(ddy);
    mge_cuda_free(ddb);
    mge_cuda_free(da);
    mge_cuda_free(dbb);
    mge_cuda_free(dout);
    free(dy);
    free(db);
    free(a);
    free(b);
    free(out);
}
END_TEST

START_TEST(test_cuda_softmax_rows)
{
    int64_t rows = 9, cols = 300, n = rows * cols;
    for (int lg = 0; lg < 2; lg++) {
        float *x, *dy, *dx, *y = malloc(sizeof(float) * n);
        float *dxx = rand_dev(n, &x), *ddy = rand_dev(n, &dy), *ddx = rand_dev(n, &dx), *dyy;
        ck_assert_int_eq(mge_cuda_malloc((void **)&dyy, sizeof(float) * n), MGE_OK);
        if (lg) {
            mge_cpu_log_softmax_forward(y, x, rows, cols);
            ck_assert_int_eq(mge_cuda_log_softmax_forward(dyy, dxx, rows, cols), MGE_OK);
        } else {
            mge_cpu_softmax_forward(y, x, rows, cols);
            ck_assert_int_eq(mge_cuda_softmax_forward(dyy, dxx, rows, cols), MGE_OK);
        }
        expect_dev(lg ? "log_softmax" : "softmax", dyy, y, n, 1e-5);
        ck_assert_int_eq(mge_cuda_to_device(dyy, y, sizeof(float) * n), MGE_OK);
        if (lg) {
            mge_cpu_log_softmax_backward(dx, dy, y, rows, cols, _i);
            ck_assert_int_eq(mge_cuda_log_softmax_backward(ddx, ddy, dyy, rows, cols, _i), MGE_OK);
        } else {
            mge_cpu_softmax_backward(dx, dy, y, rows, cols, _i);
            ck_assert_int_eq(mge_cuda_softmax_backward(ddx, ddy, dyy, rows, cols, _i), MGE_OK);
        }
        expect_dev(lg ? "log_softmax backward" : "softmax backward", ddx, dx, n, 1e-5);
        mge_cuda_free(dxx);
        mge_cuda_free(ddy);
        mge_cuda_free(ddx);
        mge_cuda_free(dyy);
        free(x);
        free(dy);
        free(dx);
        free(y);
    }
}
END_TEST

START_TEST(test_cuda_xent_smooth)
{
    int64_t B = 33, V = 517;
    float *logits, *dl, loss, dloss = 0.7f, *probs = malloc(sizeof(float) * (size_t)(B * V));
    int32_t labels[33];
    for (int i = 0; i < B; i++)
        labels[i] = (int32_t)mge_rng_below(&rng, (uint64_t)V);
    float *dlog = rand_dev(B * V, &logits), *ddl = rand_dev(B * V, &dl);
    int32_t *dlab = (int32_t *)dev_copy(labels, sizeof(labels));
    float *dprobs = NULL, *dloss_d = dev_copy(&dloss, sizeof(float)), *dloss_out = NULL;
    ck_assert_int_eq(mge_cuda_malloc((void **)&dprobs, sizeof(float) * (size_t)(B * V)), MGE_OK);
    ck_assert_int_eq(mge_cuda_malloc((void **)&dloss_out, sizeof(float)), MGE_OK);
    mge_cpu_softmax_xent_smooth_forward(&loss, probs, logits, labels, B, V, 0.1f);
    ck_assert_int_eq(
        mge_cuda_softmax_xent_smooth_forward(dloss_out, dprobs, dlog, dlab, B, V, 0.1f), MGE_OK);
    expect_dev("xent loss", dloss_out, &loss, 1, 1e-5);
    expect_dev("xent probs", dprobs, probs, B * V, 1e-5);
    ck_assert_int_eq(mge_cuda_to_device(dprobs, probs, sizeof(float) * (size_t)(B * V)), MGE_OK);
    mge_cpu_softmax_xent_smooth_backward(dl, probs, labels, B, V, dloss, 0.1f, _i);
    ck_assert_int_eq(
        mge_cuda_softmax_xent_smooth_backward(ddl, dprobs, dlab, B, V, dloss_d, 0.1f, _i), MGE_OK);
    expect_dev("xent backward", ddl, dl, B * V, 1e-6);
    mge_cuda_free(dlog);
    mge_cuda_free(ddl);
    mge_cuda_free(dlab);
    mge_cuda_free(dprobs);
    mge_cuda_free(dloss_d);
    mge_cuda_free(dloss_out);
    free(logits);
    free(dl);
    free(probs);
}
END_TEST

START_TEST(test_cuda_layout)
{
    int64_t outer = 6, len = 7, inner = 11, n = outer * len * inner;
    float *x, *y = malloc(sizeof(float) * (size_t)n), *dx, *dy;
    float *dxx = rand_dev(n, &x), *ddx = rand_dev(n, &dx), *ddy = rand_dev(outer * inner, &dy);
    float *dyy = NULL;
    ck_assert_int_eq(mge_cuda_malloc((void **)&dyy, sizeof(float) * (size_t)n), MGE_OK);
    mge_cpu_reduce_sum(y, x, outer, len, inner, 0.25f);
    ck_assert_int_eq(mge_cuda_reduce_sum(dyy, dxx, outer, len, inner, 0.25f), MGE_OK);
    expect_dev("reduce_sum", dyy, y, outer * inner, 1e-6);
    mge_cpu_reduce_sum_backward(dx, dy, outer, len, inner, 0.25f, _i);
    ck_assert_int_eq(mge_cuda_reduce_sum_backward(ddx, ddy, outer, len, inner, 0.25f, _i), MGE_OK);
    expect_dev("reduce_sum backward", ddx, dx, n, 1e-6);
    int64_t shape[4] = {2, 3, 7, 11};
    int perm[4] = {2, 0, 3, 1};
    mge_cpu_permute(y, x, shape, perm, 4);
    ck_assert_int_eq(mge_cuda_permute(dyy, dxx, shape, perm, 4), MGE_OK);
    expect_dev("permute", dyy, y, n, 0.0);
    /* rows [2, 5) of x's axis (len 7) into rows [1, 4) of a (6, 4, 11) destination */
    ck_assert_int_eq(mge_cuda_to_device(dyy, y, sizeof(float) * (size_t)n), MGE_OK);
    mge_cpu_copy_axis(y, 4, 1, x, len, 2, 3, outer, inner, _i);
    ck_assert_int_eq(mge_cuda_copy_axis(dyy, 4, 1, dxx, len, 2, 3, outer, inner, _i), MGE_OK);
    expect_dev("copy_axis", dyy, y, outer * 4 * inner, 1e-6);
    mge_cuda_free(dxx);
    mge_cuda_free(ddx);
    mge_cuda_free(ddy);
    mge_cuda_free(dyy);
    free(x);
    free(y);
    free(dx);
    free(dy);
}
END_TEST

START_TEST(test_cuda_pool)
{
    /* 2x2/2 (LeNet), and 3x3/2 padded 1 (overlapping windows, clipped at the edges) */
    static const int win[2][3] = {{2, 2, 0}, {3, 2, 1}};
    for (int k = 0; k < 2; k++) {
        struct mge_cpu_pool pl = {.N = 3, .C = 4, .H = 9, .W = 8};
        pl.R = pl.S = win[k][0];
        pl.stride = win[k][1];
        pl.pad = win[k][2];
        ck_assert_int_eq(mge_cpu_pool_init(&pl), 0);
        struct mge_cuda_pool cp = {pl.N, pl.C,      pl.H,   pl.W, pl.R,
                                   pl.S, pl.stride, pl.pad, pl.P, pl.Q};
        int64_t ni = (int64_t)pl.N * pl.C * pl.H * pl.W, no = (int64_t)pl.N * pl.C * pl.P * pl.Q;
        float *x, *dy, *dx, *y = malloc(sizeof(float) * (size_t)no);
        float *dxx = rand_dev(ni, &x), *ddy = rand_dev(no, &dy), *ddx = rand_dev(ni, &dx), *dyy;
        ck_assert_int_eq(mge_cuda_malloc((void **)&dyy, sizeof(float) * (size_t)no), MGE_OK);
        for (int max = 0; max < 2; max++) {
            if (max) {
                mge_cpu_maxpool_forward(&pl, y, x);
                ck_assert_int_eq(mge_cuda_maxpool_forward(&cp, dyy, dxx), MGE_OK);
                mge_cpu_maxpool_backward(&pl, dx, dy, x, _i);
                ck_assert_int_eq(mge_cuda_maxpool_backward(&cp, ddx, ddy, dxx, _i), MGE_OK);
            } else {
                mge_cpu_avgpool_forward(&pl, y, x);
                ck_assert_int_eq(mge_cuda_avgpool_forward(&cp, dyy, dxx), MGE_OK);
                mge_cpu_avgpool_backward(&pl, dx, dy, _i);
                ck_assert_int_eq(mge_cuda_avgpool_backward(&cp, ddx, ddy, _i), MGE_OK);
            }
            expect_dev(max ? "maxpool" : "avgpool", dyy, y, no, 1e-6);
            expect_dev(max ? "maxpool backward" : "avgpool backward", ddx, dx, ni, 1e-6);
        }
        mge_cuda_free(dxx);
        mge_cuda_free(ddy);
        mge_cuda_free(ddx);
        mge_cuda_free(dyy);
        free(x);
        free(dy);
        free(dx);
        free(y);
    }
}
END_TEST

/* cuDNN sums in its own order: 1e-4 of the largest value */
START_TEST(test_cuda_conv)
{
    struct mge_cpu_conv cv = {
        .N = 3, .C = 5, .H = 11, .W = 9, .K = 7, .R = 3, .S = 3, .stride = 2, .pad = 1};
    ck_assert_int_eq(mge_cpu_conv_init(&cv), 0);
    struct mge_cuda_conv cc = {cv.N, cv.C,      cv.H,   cv.W, cv.K, cv.R,
                               cv.S, cv.stride, cv.pad, cv.P, cv.Q};
    int64_t nx = (int64_t)cv.N * cv.C * cv.H * cv.W, nw = (int64_t)cv.K * cv.C * cv.R * cv.S;
    int64_t ny = (int64_t)cv.N * cv.K * cv.P * cv.Q;
    size_t sb = mge_cpu_conv_scratch_bytes(&cv);
    void *scratch = malloc(sb ? sb : 64);
    float *x, *w, *b, *dy, *dx, *dw, *db, *y = malloc(sizeof(float) * (size_t)ny);
    float *dxx = rand_dev(nx, &x), *dww = rand_dev(nw, &w), *dbb = rand_dev(cv.K, &b);
    float *ddy = rand_dev(ny, &dy), *ddx = rand_dev(nx, &dx), *ddw = rand_dev(nw, &dw);
    float *ddb = rand_dev(cv.K, &db), *dyy = NULL;
    ck_assert_int_eq(mge_cuda_malloc((void **)&dyy, sizeof(float) * (size_t)ny), MGE_OK);
    mge_cpu_conv2d_forward(&cv, y, x, w, b, scratch);
    ck_assert_int_eq(mge_cuda_conv2d_forward(&cc, dyy, dxx, dww, dbb), MGE_OK);
    expect_dev("conv2d", dyy, y, ny, 1e-4);
    mge_cpu_conv2d_backward(&cv, dx, dw, db, dy, x, w, scratch, _i);
    ck_assert_int_eq(mge_cuda_conv2d_backward(&cc, ddx, ddw, ddb, ddy, dxx, dww, _i), MGE_OK);
    expect_dev("conv2d dinp", ddx, dx, nx, 1e-4);
    expect_dev("conv2d dw", ddw, dw, nw, 1e-4);
    expect_dev("conv2d dbias", ddb, db, cv.K, 1e-5);
    float *fr[] = {dxx, dww, dbb, ddy, ddx, ddw, ddb, dyy};
    for (size_t i = 0; i < sizeof(fr) / sizeof(fr[0]); i++)
        mge_cuda_free(fr[i]);
    float *hr[] = {x, w, b, dy, dx, dw, db, y};
    for (size_t i = 0; i < sizeof(hr) / sizeof(hr[0]); i++)
        free(hr[i]);
    free(scratch);
}
END_TEST

START_TEST(test_cuda_norms)
{
    int64_t rows = 13, C = 96, n = rows * C;
    float *x, *w, *b, *dy, *dx, *dw, *db, *y = malloc(sizeof(float) * (size_t)n);
    float mean[13], rstd[13];
    float *dxx = rand_dev(n, &x), *dww = rand_dev(C, &w), *dbb = rand_dev(C, &b);
    float *ddy = rand_dev(n, &dy), *ddx = rand_dev(n, &dx), *ddw = rand_dev(C, &dw);
    float *ddb = rand_dev(C, &db), *dyy = NULL, *dm = NULL, *dr = NULL;
    ck_assert_int_eq(mge_cuda_malloc((void **)&dyy, sizeof(float) * (size_t)n), MGE_OK);
    ck_assert_int_eq(mge_cuda_malloc((void **)&dm, sizeof(mean)), MGE_OK);
    ck_assert_int_eq(mge_cuda_malloc((void **)&dr, sizeof(rstd)), MGE_OK);
    mge_cpu_layernorm_forward(y, mean, rstd, x, w, b, rows, C, 1e-5f);
    ck_assert_int_eq(mge_cuda_layernorm_forward(dyy, dm, dr, dxx, dww, dbb, rows, C, 1e-5f),
                     MGE_OK);
    expect_dev("layernorm", dyy, y, n, 1e-5);
    expect_dev("layernorm rstd", dr, rstd, rows, 1e-5);
    ck_assert_int_eq(mge_cuda_to_device(dm, mean, sizeof(mean)), MGE_OK);
    ck_assert_int_eq(mge_cuda_to_device(dr, rstd, sizeof(rstd)), MGE_OK);
    mge_cpu_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, rows, C, _i);
    ck_assert_int_eq(mge_cuda_layernorm_backward(ddx, ddw, ddb, ddy, dxx, dww, dm, dr, rows, C, _i),
                     MGE_OK);
    expect_dev("layernorm dinp", ddx, dx, n, 1e-5);
    expect_dev("layernorm dw", ddw, dw, C, 1e-5);
    expect_dev("layernorm db", ddb, db, C, 1e-5);
    /* batch norm over x as (N 4, C 8, HW 39): training (running stats updated), then eval */
    int64_t N = 4, BC = 8, HW = 39;
    float rm[8], rv[8], bm[8], br[8];
    for (int c = 0; c < BC; c++)
        rm[c] = 0.1f * (float)c, rv[c] = 1.0f + 0.2f * (float)c;
    float *drm = dev_copy(rm, sizeof(rm)), *drv = dev_copy(rv, sizeof(rv));
    for (int train = 1; train >= 0; train--) {
        mge_cpu_batchnorm_forward(y, bm, br, x, w, b, rm, rv, N, BC, HW, 1e-5f, 0.1f, train, 0);
        ck_assert_int_eq(mge_cuda_batchnorm_forward(dyy, dm, dr, dxx, dww, dbb, drm, drv, N, BC, HW,
                                                    1e-5f, 0.1f, train, 0),
                         MGE_OK);
        expect_dev(train ? "batchnorm (train)" : "batchnorm (eval)", dyy, y, n, 1e-4);
        expect_dev("batchnorm running mean", drm, rm, BC, 1e-5);
        expect_dev("batchnorm running var", drv, rv, BC, 1e-5);
    }
    ck_assert_int_eq(mge_cuda_to_device(dm, bm, sizeof(bm)), MGE_OK);
    ck_assert_int_eq(mge_cuda_to_device(dr, br, sizeof(br)), MGE_OK);
    mge_cpu_batchnorm_backward(dx, dw, db, dy, NULL, x, w, bm, br, N, BC, HW, _i);
    ck_assert_int_eq(
        mge_cuda_batchnorm_backward(ddx, ddw, ddb, ddy, NULL, dxx, dww, dm, dr, N, BC, HW, _i),
        MGE_OK);
    expect_dev("batchnorm dinp", ddx, dx, n, 1e-4);
    expect_dev("batchnorm dw", ddw, dw, BC, 1e-4);
    expect_dev("batchnorm db", ddb, db, BC, 1e-4);
    /* with a fused relu (training statistics); the backward masks with the CPU's output on both */
    mge_cpu_batchnorm_forward(y, bm, br, x, w, b, NULL, NULL, N, BC, HW, 1e-5f, 0.1f, 1, 1);
    ck_assert_int_eq(mge_cuda_batchnorm_forward(dyy, dm, dr, dxx, dww, dbb, NULL, NULL, N, BC, HW,
                                                1e-5f, 0.1f, 1, 1),
                     MGE_OK);
    expect_dev("batchnorm + relu", dyy, y, n, 1e-4);
    ck_assert_int_eq(mge_cuda_to_device(dyy, y, sizeof(float) * (size_t)n), MGE_OK);
    ck_assert_int_eq(mge_cuda_to_device(dm, bm, sizeof(bm)), MGE_OK);
    ck_assert_int_eq(mge_cuda_to_device(dr, br, sizeof(br)), MGE_OK);
    mge_cpu_batchnorm_backward(dx, dw, db, dy, y, x, w, bm, br, N, BC, HW, _i);
    ck_assert_int_eq(
        mge_cuda_batchnorm_backward(ddx, ddw, ddb, ddy, dyy, dxx, dww, dm, dr, N, BC, HW, _i),
        MGE_OK);
    expect_dev("batchnorm + relu dinp", ddx, dx, n, 1e-4);
    expect_dev("batchnorm + relu dw", ddw, dw, BC, 1e-4);
    expect_dev("batchnorm + relu db", ddb, db, BC, 1e-4);
    float *fr[] = {dxx, dww, dbb, ddy, ddx, ddw, ddb, dyy, dm, dr, drm, drv};
    for (size_t i = 0; i < sizeof(fr) / sizeof(fr[0]); i++)
        mge_cuda_free(fr[i]);
    float *hr[] = {x, w, b, dy, dx, dw, db, y};
    for (size_t i = 0; i < sizeof(hr) / sizeof(hr[0]); i++)
        free(hr[i]);
}
END_TEST

START_TEST(test_cuda_embedding_dropout)
{
    int64_t n = 50, V = 7, C = 33; /* 50 ids over 7 rows: repeated ids add up */
    int32_t ids[50];
    for (int i = 0; i < n; i++)
        ids[i] = (int32_t)mge_rng_below(&rng, (uint64_t)V);
    float *t, *dy, *dt, *y = malloc(sizeof(float) * (size_t)(n * C));
    float *dtt = rand_dev(V * C, &t), *ddy = rand_dev(n * C, &dy), *ddt = rand_dev(V * C, &dt);
    int32_t *dids = (int32_t *)dev_copy(ids, sizeof(ids));
    float *dyy = NULL;
    ck_assert_int_eq(mge_cuda_malloc((void **)&dyy, sizeof(float) * (size_t)(n * C)), MGE_OK);
    mge_cpu_embedding_forward(y, ids, t, n, C);
    ck_assert_int_eq(mge_cuda_embedding_forward(dyy, dids, dtt, n, C), MGE_OK);
    expect_dev("embedding", dyy, y, n * C, 0.0);
    mge_cpu_embedding_backward(dt, dy, ids, n, V, C, _i);
    ck_assert_int_eq(mge_cuda_embedding_backward(ddt, ddy, dids, n, V, C, _i), MGE_OK);
    expect_dev("embedding backward", ddt, dt, V * C, 0.0); /* same order: the same bits */
    /* dropout: the same mask, from an offset into the global batch */
    mge_cpu_dropout_forward(y, dy, n * C, 0.3f, 0x1234567ull, 777);
    ck_assert_int_eq(mge_cuda_dropout_forward(dyy, ddy, n * C, 0.3f, 0x1234567ull, 777), MGE_OK);
    expect_dev("dropout", dyy, y, n * C, 0.0);
    ck_assert_int_eq(mge_cuda_to_device(dyy, t, sizeof(float) * (size_t)(V * C)), MGE_OK);
    mge_cpu_dropout_backward(t, dy, V * C, 0.3f, 99, 5, _i);
    ck_assert_int_eq(mge_cuda_dropout_backward(dyy, ddy, V * C, 0.3f, 99, 5, _i), MGE_OK);
    expect_dev("dropout backward", dyy, t, V * C, 1e-6); /* nvcc may fuse the add (FMA) */
    mge_cuda_free(dtt);
    mge_cuda_free(ddy);
    mge_cuda_free(ddt);
    mge_cuda_free(dids);
    mge_cuda_free(dyy);
    free(t);
    free(dy);
    free(dt);
    free(y);
}
END_TEST

START_TEST(test_cuda_attention)
{
    int64_t B = 2, T = 70, C = 48, NH = 3, nq = B * T * 3 * C, ny = B * T * C;
    float *qkv, *dy, *dq, *y = malloc(sizeof(float) * (size_t)ny), lse[2 * 3 * 70];
    float *dqkv_ = rand_dev(nq, &qkv), *ddy = rand_dev(ny, &dy), *ddq = rand_dev(nq, &dq);
    float *dyy = NULL, *dl = NULL;
    ck_assert_int_eq(mge_cuda_malloc((void **)&dyy, sizeof(float) * (size_t)ny), MGE_OK);
    ck_assert_int_eq(mge_cuda_malloc((void **)&dl, sizeof(lse)), MGE_OK);
    mge_cpu_attention_forward(y, lse, qkv, B, T, C, NH);
    ck_assert_int_eq(mge_cuda_attention_forward(dyy, dl, dqkv_, B, T, C, NH), MGE_OK);
    expect_dev("attention", dyy, y, ny, 1e-5);
    expect_dev("attention lse", dl, lse, B * NH * T, 1e-5);
    ck_assert_int_eq(mge_cuda_to_device(dyy, y, sizeof(float) * (size_t)ny), MGE_OK);
    ck_assert_int_eq(mge_cuda_to_device(dl, lse, sizeof(lse)), MGE_OK);
    mge_cpu_attention_backward(dq, dy, qkv, y, lse, B, T, C, NH, _i);
    ck_assert_int_eq(mge_cuda_attention_backward(ddq, ddy, dqkv_, dyy, dl, B, T, C, NH, _i),
                     MGE_OK);
    expect_dev("attention backward", ddq, dq, nq, 1e-4); /* blockwise vs row sums */
    mge_cuda_free(dqkv_);
    mge_cuda_free(ddy);
    mge_cuda_free(ddq);
    mge_cuda_free(dyy);
    mge_cuda_free(dl);
    free(qkv);
    free(dy);
    free(dq);
    free(y);
}
END_TEST

struct optim_run {
    const struct mge_device *dev;
    struct mge_optim *o;
    float *p, *g; /* device memory */
    int64_t n;
    double norm;
};

static void optim_run_fn(void *ctx)
{
    struct optim_run *r = ctx;
    r->norm = mge_optim_clip_on(r->dev, r->g, r->n, 1.0);
    for (int64_t step = 0; step < 3; step++)
        mge_optim_step(r->o, r->p, r->g, step);
}

/* AdamW through the engine's optimiser on the cpu and on @other (a no-decay span, clipping, 3
 * steps) from the same parameters and gradients: the same parameters and state within @tol. */
static void optim_compare(const struct mge_device *other, double tol)
{
    int64_t n = 5000;
    float *p = rand_host(n), *g = rand_host(n);
    float *cp = malloc(sizeof(float) * n), *gp = malloc(sizeof(float) * n); /* results */
    float *cm = malloc(sizeof(float) * n), *gm = malloc(sizeof(float) * n);
    struct mge_optim_spec os = {.type = MGE_OPTIM_ADAMW,
                                .lr = 1e-2,
                                .weight_decay = 0.1,
                                .beta1 = 0.9,
                                .beta2 = 0.999,
                                .eps = 1e-8};
    struct mge_sched_spec ss = {.type = MGE_SCHED_COSINE, .warmup_steps = 1, .min_lr = 1e-4};
    const struct mge_device *devs[2] = {&mge_device_cpu, other};
    double norm[2];
    for (int k = 0; k < 2; k++) {
        const struct mge_device *dev = devs[k];
        struct mge_optim o;
        float *dp = dev->alloc(sizeof(float) * n), *dg = dev->alloc(sizeof(float) * n);
        dev->h2d(dp, p, sizeof(float) * n);
        dev->h2d(dg, g, sizeof(float) * n);
        ck_assert_int_eq(mge_optim_init_on(&o, &os, &ss, 10, n, dev), MGE_OK);
        ck_assert_int_eq(mge_optim_exclude_decay(&o, 100, 900), MGE_OK);
        struct optim_run r = {dev, &o, dp, dg, n, 0.0};
        dev->kernel(optim_run_fn, &r);
        norm[k] = r.norm;
        dev->d2h(k ? gp : cp, dp, sizeof(float) * n);
        dev->d2h(k ? gm : cm, o.m, sizeof(float) * n);
        mge_optim_fini(&o);
        dev->free(dp, sizeof(float) * n);
        dev->free(dg, sizeof(float) * n);
    }
    ck_assert_msg(fabs(norm[0] - norm[1]) <= 1e-12 * norm[0], "norm: cpu %.17g %s %.17g", norm[0],
                  other->name, norm[1]);
    expect_rel("optim", "parameters", gp, cp, n, tol);
    expect_rel("optim", "first moment", gm, cm, n, tol);
    free(p);
    free(g);
    free(cp);
    free(gp);
    free(cm);
    free(gm);
}

START_TEST(test_cuda_optim)
{
    optim_compare(mge_device_cuda(), 1e-5);
}
END_TEST

/* ---- graphs: the ops table, op by op, through the engine ---- */

enum { MAX_INPUTS = 4 };

struct built {
    int loss, out;         /* scalar loss; the output compared after each run */
    int in[MAX_INPUTS];    /* inputs, filled with random data */
    int range[MAX_INPUTS]; /* int32 inputs: ids in [0, range); 0: f32 in [-1, 1) */
    int n_in;
    int64_t batch; /* batch size of the batched inputs, 0: none */
};

typedef void (*build_fn)(struct mge_graph *g, struct built *b);

static int add_input(struct mge_graph *g, struct built *b, const char *name, int ndim,
                     const int64_t *shape, int range, int batched)
{
    int v = mge_input(g, name, range ? MGE_DTYPE_I32 : MGE_DTYPE_F32, ndim, shape, batched);
    b->in[b->n_in] = v;
    b->range[b->n_in++] = range;
    if (batched)
        b->batch = shape[0];
    return v;
}

static int param(struct mge_graph *g, const char *name, int ndim, const int64_t *shape, int64_t fan)
{
    return mge_param(g, name, ndim, shape, MGE_INIT_UNIFORM_FAN_IN, fan);
}

/* MLP: linear + relu, linear + gelu (its pre-activation kept), tanh, sigmoid, cross-entropy. */
static void build_mlp(struct mge_graph *g, struct built *b)
{
    int x = add_input(g, b, "x", 2, (int64_t[]){16, 24}, 0, 1);
    int y = add_input(g, b, "y", 1, (int64_t[]){16}, 10, 1);
    int h = mge_linear(g, x, param(g, "w1", 2, (int64_t[]){32, 24}, 24),
                       param(g, "b1", 1, (int64_t[]){32}, 24), MGE_ACT_FN_RELU);
    h = mge_linear(g, h, param(g, "w2", 2, (int64_t[]){32, 32}, 32),
                   param(g, "b2", 1, (int64_t[]){32}, 32), MGE_ACT_FN_GELU);
    h = mge_tanh(g, h);
    h = mge_sigmoid(g,
                    mge_linear(g, h, param(g, "w3", 2, (int64_t[]){32, 32}, 32), -1, MGE_ACT_NONE));
    b->out = mge_linear(g, h, param(g, "w4", 2, (int64_t[]){10, 32}, 32),
                        param(g, "b4", 1, (int64_t[]){10}, 32), MGE_ACT_NONE);
    b->loss = mge_cross_entropy(g, b->out, y);
}

/* LeNet-like: conv + bias, relu, 2x2 max pool, strided padded conv, batch norm, padded average
 * pool, overlapping max pool, linear, cross-entropy with label smoothing. */
static void build_lenet(struct mge_graph *g, struct built *b)
{
    int x = add_input(g, b, "x", 4, (int64_t[]){8, 3, 12, 12}, 0, 1);
    int y = add_input(g, b, "y", 1, (int64_t[]){8}, 10, 1);
    int h = mge_conv2d(g, x, param(g, "c1", 4, (int64_t[]){6, 3, 3, 3}, 27),
                       param(g, "c1b", 1, (int64_t[]){6}, 27), 1, 1);
    h = mge_maxpool2d(g, mge_relu(g, h), 2, 2, 0);
    h = mge_conv2d(g, h, param(g, "c2", 4, (int64_t[]){8, 6, 3, 3}, 54), -1, 2, 1);
    h = mge_batchnorm2d(g, h, mge_param(g, "bw", 1, (int64_t[]){8}, MGE_INIT_ONE, 1),
                        mge_param(g, "bb", 1, (int64_t[]){8}, MGE_INIT_ZERO, 1),
                        mge_buffer(g, "rm", 1, (int64_t[]){8}, MGE_INIT_ZERO),
                        mge_buffer(g, "rv", 1, (int64_t[]){8}, MGE_INIT_ONE), 1e-5f, 0.1f);
    h = mge_avgpool2d(g, mge_relu(g, h), 3, 1, 1);
    h = mge_maxpool2d(g, h, 3, 2, 1);
    b->out = mge_linear(g, mge_flatten(g, h), param(g, "fc", 2, (int64_t[]){10, 32}, 32),
                        param(g, "fcb", 1, (int64_t[]){10}, 32), MGE_ACT_NONE);
    b->loss = mge_cross_entropy_smoothed(g, b->out, y, 0.1f);
}

static int bn(struct mge_graph *g, int x, int c, const char *name)
{
    char n[4][32];
    for (int i = 0; i < 4; i++)
        snprintf(n[i], sizeof(n[i]), "%s.%d", name, i);
    return mge_batchnorm2d(g, x, mge_param(g, n[0], 1, (int64_t[]){c}, MGE_INIT_ONE, 1),
                           mge_param(g, n[1], 1, (int64_t[]){c}, MGE_INIT_ZERO, 1),
                           mge_buffer(g, n[2], 1, (int64_t[]){c}, MGE_INIT_ZERO),
                           mge_buffer(g, n[3], 1, (int64_t[]){c}, MGE_INIT_ONE), 1e-5f, 0.1f);
}

/* ResNet-like: a basic block with a 1x1 projection shortcut, global average pool, linear. */
static void build_resnet(struct mge_graph *g, struct built *b)
{
    int x = add_input(g, b, "x", 4, (int64_t[]){4, 4, 8, 8}, 0, 1);
    int y = add_input(g, b, "y", 1, (int64_t[]){4}, 5, 1);
    int h = mge_conv2d(g, x, param(g, "c1", 4, (int64_t[]){8, 4, 3, 3}, 36), -1, 1, 1);
    h = mge_relu(g, bn(g, h, 8, "bn1"));
    h = bn(g, mge_conv2d(g, h, param(g, "c2", 4, (int64_t[]){8, 8, 3, 3}, 72), -1, 1, 1), 8, "bn2");
    int sc = mge_conv2d(g, x, param(g, "p", 4, (int64_t[]){8, 4, 1, 1}, 4), -1, 1, 0);
    h = mge_relu(g, mge_add(g, h, sc));
    b->out = mge_linear(g, mge_global_avgpool2d(g, h), param(g, "fc", 2, (int64_t[]){5, 8}, 8),
                        param(g, "fcb", 1, (int64_t[]){5}, 8), MGE_ACT_NONE);
    b->loss = mge_cross_entropy(g, b->out, y);
}

/* GPT-like: token and position embeddings, layer norm, fused causal attention over 2 heads,
 * residuals, a GELU MLP with dropout, cross-entropy over every token. */
static void build_gpt(struct mge_graph *g, struct built *b)
{
    enum { Bt = 2, T = 8, C = 16, V = 13 };
    int ids = add_input(g, b, "ids", 2, (int64_t[]){Bt, T}, V, 1);
    int y = add_input(g, b, "y", 2, (int64_t[]){Bt, T}, V, 1);
    int pos = add_input(g, b, "pos", 1, (int64_t[]){T}, T, 0);
    int x = mge_add(g, mge_embedding(g, ids, param(g, "wte", 2, (int64_t[]){V, C}, C)),
                    mge_embedding(g, pos, param(g, "wpe", 2, (int64_t[]){T, C}, C)));
    int ln = mge_layernorm(g, x, mge_param(g, "l1w", 1, (int64_t[]){C}, MGE_INIT_ONE, 1),
                           mge_param(g, "l1b", 1, (int64_t[]){C}, MGE_INIT_ZERO, 1), 1e-5f);
    int qkv = mge_linear(g, ln, param(g, "wqkv", 2, (int64_t[]){3 * C, C}, C),
                         param(g, "bqkv", 1, (int64_t[]){3 * C}, C), MGE_ACT_NONE);
    int att = mge_causal_attention(g, qkv, 2);
    x = mge_add(g, x,
                mge_linear(g, att, param(g, "wo", 2, (int64_t[]){C, C}, C), -1, MGE_ACT_NONE));
    ln = mge_layernorm(g, x, mge_param(g, "l2w", 1, (int64_t[]){C}, MGE_INIT_ONE, 1),
                       mge_param(g, "l2b", 1, (int64_t[]){C}, MGE_INIT_ZERO, 1), 1e-5f);
    int m = mge_linear(g, ln, param(g, "wfc", 2, (int64_t[]){4 * C, C}, C), -1, MGE_ACT_FN_GELU);
    m = mge_dropout(g, m, 0.25f);
    x = mge_add(
        g, x, mge_linear(g, m, param(g, "wp", 2, (int64_t[]){C, 4 * C}, 4 * C), -1, MGE_ACT_NONE));
    b->out = mge_linear(g, x, param(g, "wlm", 2, (int64_t[]){V, C}, C), -1, MGE_ACT_NONE);
    b->loss = mge_cross_entropy(g, b->out, y);
}

/* The ops the models above leave out: broadcasting sub/mul/div, bias add, softmax, log-softmax,
 * concat, transpose, slice, matmul with each transpose, sums and means over an axis and over all.
 */
static void build_misc(struct mge_graph *g, struct built *b)
{
    int a = add_input(g, b, "a", 2, (int64_t[]){4, 6}, 0, 0);
    int w = param(g, "w", 1, (int64_t[]){6}, 6), c = param(g, "c", 2, (int64_t[]){4, 1}, 1);
    int one = mge_param(g, "one", 1, (int64_t[]){6}, MGE_INIT_ONE, 1);
    int d = mge_sub(g, mge_mul(g, a, w), c);
    d = mge_div(g, d, mge_add(g, mge_sigmoid(g, w), one));
    d = mge_bias_add(g, d, param(g, "bias", 1, (int64_t[]){6}, 6));
    int s = mge_concat(g, (int[]){mge_softmax(g, d), mge_log_softmax(g, d)}, 2, 1); /* (4, 12) */
    int tr = mge_transpose(g, s, 0, 1);                                             /* (12, 4) */
    int m1 = mge_matmul(g, tr, param(g, "m1", 2, (int64_t[]){4, 5}, 4), 0, 0);      /* (12, 5) */
    int m2 = mge_matmul(g, s, param(g, "m2", 2, (int64_t[]){5, 12}, 12), 0, 1);     /* (4, 5) */
    int m3 = mge_matmul(g, s, param(g, "m3", 2, (int64_t[]){4, 3}, 4), 1, 0);       /* (12, 3) */
    int m4 = mge_matmul(g, m2, param(g, "m4", 2, (int64_t[]){3, 5}, 5), 0, 1);      /* (4, 3) */
    int sl = mge_slice(g, s, 1, 2, 6);                                              /* (4, 6) */
    b->out = mge_sum(g, m1, 1);                                                     /* (12) */
    int l = mge_add(g, mge_mean(g, b->out, -1), mge_mean(g, mge_mul(g, sl, sl), -1));
    l = mge_add(g, l, mge_sum(g, mge_mean(g, m3, 0), -1));
    b->loss = mge_add(g, l, mge_mean(g, mge_mean(g, m4, 1), -1));
}

struct run {
    struct mge_graph *g;
    struct built b;
    float loss, *out, *grads, *params, *infer_out; /* host copies */
    int64_t n_out, n_grads, n_params;
};

struct update {
    const struct mge_device *dev;
    struct mge_optim o;
    float *params, *grads; /* device memory */
    int64_t n;
};

static void update_run(void *ctx)
{
    struct update *u = ctx;
    mge_optim_clip_on(u->dev, u->grads, u->n, 0.5);
    mge_optim_step(&u->o, u->params, u->grads, 0);
}

/* Build @build's graph on @dev, train one step on @inputs, clip and SGD, infer once. */
static void run_graph(build_fn build, const struct mge_device *dev, void *const *inputs,
                      struct run *r)
{
    memset(r, 0, sizeof(*r));
    ck_assert_int_eq(mge_graph_new(&r->g), MGE_OK);
    build(r->g, &r->b);
    ck_assert_msg(mge_graph_error(r->g) == MGE_OK, "build: %s", mge_graph_error_msg(r->g));
    ck_assert_int_eq(mge_graph_backward(r->g, r->b.loss), MGE_OK);
    ck_assert_int_eq(mge_graph_keep(r->g, r->b.out), MGE_OK);
    ck_assert_int_eq(mge_graph_plan(r->g, NULL), MGE_OK);
    ck_assert_msg(mge_graph_set_device(r->g, dev) == MGE_OK, "%s", mge_graph_error_msg(r->g));
    ck_assert_int_eq(mge_graph_alloc(r->g), MGE_OK);
    mge_graph_init_params(r->g, 7);
    for (int i = 0; i < r->b.n_in; i++)
        ck_assert_int_eq(mge_graph_bind(r->g, r->b.in[i], inputs[i]), MGE_OK);
    if (r->b.batch)
        ck_assert_int_eq(mge_graph_set_batch(r->g, r->b.batch), MGE_OK);
    ck_assert_int_eq(mge_graph_run(r->g, MGE_RUN_TRAIN, 3), MGE_OK);

    float *p = mge_graph_params(r->g, &r->n_params), *gr = mge_graph_grads(r->g, &r->n_grads);
    r->n_out = mge_value_numel(r->g, r->b.out);
    size_t ob = sizeof(float) * (size_t)r->n_out;
    r->out = malloc(ob);
    r->infer_out = malloc(ob);
    r->grads = malloc(sizeof(float) * (size_t)r->n_grads);
    r->params = malloc(sizeof(float) * (size_t)r->n_params);
    ck_assert_int_eq(mge_value_read(r->g, r->b.loss, &r->loss, sizeof(float)), MGE_OK);
    ck_assert_int_eq(mge_value_read(r->g, r->b.out, r->out, ob), MGE_OK);
    dev->d2h(r->grads, gr, sizeof(float) * (size_t)r->n_grads);

    /* the optimiser through the device: clip by global norm, then SGD with Nesterov momentum and
     * weight decay (linear in the gradients: Adam's first step, lr * sign(g), would turn a
     * rounding difference in a near-zero gradient into a full step; test_cuda_optim checks it) */
    struct mge_optim_spec os = {
        .type = MGE_OPTIM_SGD, .lr = 0.1, .momentum = 0.9, .nesterov = 1, .weight_decay = 0.01};
    struct mge_sched_spec ss = {.type = MGE_SCHED_CONSTANT};
    struct update u = {.dev = dev, .params = p, .grads = gr, .n = r->n_grads};
    ck_assert_int_eq(mge_optim_init_on(&u.o, &os, &ss, 10, r->n_grads, dev), MGE_OK);
    dev->kernel(update_run, &u); /* as mge-train runs it */
    mge_optim_fini(&u.o);
    dev->d2h(r->params, p, sizeof(float) * (size_t)r->n_params);

    ck_assert_int_eq(mge_graph_run(r->g, MGE_RUN_INFER, 4), MGE_OK);
    ck_assert_int_eq(mge_value_read(r->g, r->b.out, r->infer_out, ob), MGE_OK);
}

static void run_free(struct run *r)
{
    mge_graph_free(r->g);
    free(r->out);
    free(r->infer_out);
    free(r->grads);
    free(r->params);
}

static const struct {
    const char *name;
    build_fn build;
    double tol;
} graphs[] = {
    {"mlp", build_mlp, 1e-4}, {"lenet", build_lenet, 1e-3}, {"resnet", build_resnet, 1e-3},
    {"gpt", build_gpt, 1e-4}, {"misc", build_misc, 1e-4},
};
#define N_GRAPHS ((int)(sizeof(graphs) / sizeof(graphs[0])))

/* Random inputs for @build's graph into @inputs (malloc'd); returns how many. */
static int graph_inputs(build_fn build, void **inputs)
{
    struct built probe = {0};
    struct mge_graph *pg = NULL;
    ck_assert_int_eq(mge_graph_new(&pg), MGE_OK);
    build(pg, &probe);
    for (int i = 0; i < probe.n_in; i++) {
        int64_t n = mge_value_numel(pg, probe.in[i]);
        if (probe.range[i]) {
            int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
            for (int64_t k = 0; k < n; k++)
                ids[k] = (int32_t)mge_rng_below(&rng, (uint64_t)probe.range[i]);
            inputs[i] = ids;
        } else {
            inputs[i] = rand_host(n);
        }
    }
    mge_graph_free(pg);
    return probe.n_in;
}

/* Graph @k on the cpu and on @dev: every result within @tol (0: bit-identical). */
static void compare_on(int k, const struct mge_device *dev, double tol)
{
    struct run c, d;
    void *inputs[MAX_INPUTS] = {0};
    int n_in = graph_inputs(graphs[k].build, inputs);
    const char *nm = graphs[k].name;
    run_graph(graphs[k].build, &mge_device_cpu, inputs, &c);
    run_graph(graphs[k].build, dev, inputs, &d);
    ck_assert(c.loss > 0.0f);
    expect_rel(nm, "loss", &d.loss, &c.loss, 1, tol);
    expect_rel(nm, "output", d.out, c.out, c.n_out, tol);
    expect_rel(nm, "gradients", d.grads, c.grads, c.n_grads, tol);
    expect_rel(nm, "parameters", d.params, c.params, c.n_params, tol);
    expect_rel(nm, "inference", d.infer_out, c.infer_out, c.n_out, tol);
    run_free(&c);
    run_free(&d);
    for (int i = 0; i < n_in; i++)
        free(inputs[i]);
}

START_TEST(test_cuda_graph)
{
    compare_on(_i, mge_device_cuda(), graphs[_i].tol);
}
END_TEST

/* ---- what needs no GPU ---- */

/* The harness itself, on the simulated accelerator: bit-identical to the CPU (every transfer
 * explicit), so a difference on cuda is the kernels'. */
START_TEST(test_graph_harness_on_sim)
{
    compare_on(_i, &mge_device_sim, 0.0);
}
END_TEST

START_TEST(test_optim_harness_on_sim)
{
    optim_compare(&mge_device_sim, 0.0);
}
END_TEST

/* The graphs above hold every op that has a kernel on the cuda device, forward and backward. */
START_TEST(test_cuda_graphs_cover_the_table)
{
    const struct mge_device *dev = mge_device_cuda();
    int seen[MGE_OP__COUNT] = {0};
    ck_assert_ptr_nonnull(dev);
    ck_assert_ptr_eq(mge_device_find("cuda"), dev);
    ck_assert(!dev->host_visible && !dev->bf16);
    for (int k = 0; k < N_GRAPHS; k++) {
        struct mge_graph *g = NULL;
        struct built b = {0};
        ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
        graphs[k].build(g, &b);
        ck_assert_msg(mge_graph_error(g) == MGE_OK, "%s: %s", graphs[k].name,
                      mge_graph_error_msg(g));
        ck_assert_int_eq(mge_graph_backward(g, b.loss), MGE_OK);
        ck_assert_int_eq(mge_graph_plan(g, NULL), MGE_OK);
        /* setting the device checks every node against the table; it allocates nothing */
        ck_assert_msg(mge_graph_set_device(g, dev) == MGE_OK, "%s", mge_graph_error_msg(g));
        for (int i = 0; i < g->n_nodes; i++)
            seen[g->nodes[i].op] = 1;
        mge_graph_free(g);
    }
    char missing[512] = "";
    for (int op = 0; op < MGE_OP__COUNT; op++)
        if (dev->ops->fn[op] && !seen[op])
            snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing), " %s",
                     mge__op_name(op));
    ck_assert_msg(!missing[0], "ops with a cuda kernel that no graph of test_cuda runs:%s",
                  missing);
}
END_TEST

/* A graph with an op the table lacks (a quantised linear layer) is refused, naming the op. */
START_TEST(test_cuda_refuses_missing_op)
{
    struct mge_graph *g = NULL;
    struct mge_quant_opts qo;
    memset(&qo, 0, sizeof(qo));
    qo.mode = MGE_QUANT_FAKE;
    qo.momentum = 0.01f;
    qo.percentile = 99.99f;
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    ck_assert_int_eq(mge_graph_set_quant(g, &qo), MGE_OK);
    int x = mge_input(g, "x", MGE_DTYPE_F32, 2, (int64_t[]){4, 8}, 1);
    int y = mge_input(g, "y", MGE_DTYPE_I32, 1, (int64_t[]){4}, 1);
    int h = mge_linear(g, x, param(g, "w", 2, (int64_t[]){3, 8}, 8), -1, MGE_ACT_NONE);
    ck_assert_int_eq(mge_graph_backward(g, mge_cross_entropy(g, h, y)), MGE_OK);
    ck_assert_int_eq(mge_graph_plan(g, NULL), MGE_OK);
    ck_assert_int_eq(mge_graph_set_device(g, mge_device_cuda()), MGE_UNSUPPORTED);
    ck_assert_msg(strstr(mge_graph_error_msg(g), "FAKE_QUANT") &&
                      strstr(mge_graph_error_msg(g), "no kernel on device 'cuda'"),
                  "message: %s", mge_graph_error_msg(g));
    mge_graph_free(g);
    /* bf16 GEMMs are the CPU's */
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    mge_graph_set_bf16(g, 1);
    x = mge_input(g, "x", MGE_DTYPE_F32, 2, (int64_t[]){4, 8}, 1);
    ck_assert_int_ge(mge_relu(g, x), 0);
    ck_assert_int_eq(mge_graph_set_device(g, mge_device_cuda()), MGE_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(mge_graph_error_msg(g), "bf16"));
    mge_graph_free(g);
}
END_TEST

int main(void)
{
    mge_rng_seed(&rng, 2024);
    Suite *s = suite_create("cuda");
    TCase *host = tcase_create("without a gpu");
    tcase_add_test(host, test_cuda_graphs_cover_the_table);
    tcase_add_test(host, test_cuda_refuses_missing_op);
    tcase_add_loop_test(host, test_graph_harness_on_sim, 0, N_GRAPHS);
    tcase_add_test(host, test_optim_harness_on_sim);
    suite_add_tcase(s, host);
    int gpu = mge_cuda_device_count() > 0;
    if (gpu) {
        char name[256];
        mge_cuda_device_name(name, sizeof(name));
        printf("cuda device: %s\n", name);
        TCase *tc = tcase_create("kernels");
        tcase_add_loop_test(tc, test_cuda_sgemm, 0, 4);
        tcase_add_test(tc, test_cuda_bias_act);
        tcase_add_test(tc, test_cuda_relu_backward);
        tcase_add_test(tc, test_cuda_softmax_xent);
        tcase_add_test(tc, test_cuda_sgd);
        tcase_add_test(tc, test_cuda_adam);
        tcase_add_test(tc, test_cuda_optim);
        TCase *to = tcase_create("kernels, overwriting and accumulating");
        tcase_add_loop_test(to, test_cuda_unary, 0, 2);
        tcase_add_loop_test(to, test_cuda_bias_binary_sum_to, 0, 2);
        tcase_add_loop_test(to, test_cuda_softmax_rows, 0, 2);
        tcase_add_loop_test(to, test_cuda_xent_smooth, 0, 2);
        tcase_add_loop_test(to, test_cuda_layout, 0, 2);
        tcase_add_loop_test(to, test_cuda_pool, 0, 2);
        tcase_add_loop_test(to, test_cuda_conv, 0, 2);
        tcase_add_loop_test(to, test_cuda_norms, 0, 2);
        tcase_add_loop_test(to, test_cuda_embedding_dropout, 0, 2);
        tcase_add_loop_test(to, test_cuda_attention, 0, 2);
        suite_add_tcase(s, to);
        suite_add_tcase(s, tc);
        TCase *tg = tcase_create("graphs");
        tcase_set_timeout(tg, 120);
        tcase_add_loop_test(tg, test_cuda_graph, 0, N_GRAPHS);
        suite_add_tcase(s, tg);
    }
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (failed)
        return 1;
    if (!gpu) {
        printf("skip - %d CUDA tests skipped: no CUDA device (built with nvcc; the CPU kernels "
               "are checked by test_kernels)\n",
               N_GPU_TESTS);
        return 77;
    }
    return 0;
}
