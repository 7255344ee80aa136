/*
 * test_bf16.c: bf16 mixed precision: the conversions, the bf16 GEMM in every transpose the engine
 * uses and the bf16 convolution against double-precision references, and gradients of a small
 * conv + linear graph in bf16 against the same graph in fp32.
 *
 * Tolerances. bf16 keeps 8 significant bits: rounding one input is off by at most u = 2^-8
 * relative (half an ulp of 2^-7), so a product of two rounded inputs by at most 2u + u^2, and an
 * fp32 sum of K products adds at most K 2^-24 relative to sum |a||b| (fp32's gamma_K). Hence:
 *   against the exact product of the rounded inputs: |c - ref| <= K 2^-23 sum |a||b|  (+1e-30)
 *   against the exact product of the fp32 inputs:    |c - ref| <= (2^-7 + K 2^-23) sum |a||b|
 * and, to show the inputs were rounded at all, the first error must be far below the second.
 * Gradients through a graph (conv, conv, linear, cross-entropy at initialisation): the relative
 * L2 error per parameter against fp32 is below 0.15. Measured: 0.3% for the linear layer's
 * weights, 5-9% for the convs' (their gradients are sums with much cancellation: the class
 * gradients of a row sum to zero), the same to 6 digits on the emulated path (im2col over rounded
 * copies), so it is bf16's rounding and not a kernel's error; a wrong transpose or scale gives
 * errors near 1 or more. The kernels' own tests above carry the tight bounds.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"
#include "engine/engine.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_int.h"
#include "tests/unit/support/check_run.h"

static float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static float round1(float x)
{
    float y;
    mge_cpu_round_bf16(&y, &x, 1);
    return y;
}

START_TEST(test_bf16_convert)
{
    /* exact bf16 values come back unchanged, both ways */
    const float exact[] = {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 65280.0f, 1.0f / 1024};
    for (size_t i = 0; i < sizeof(exact) / sizeof(exact[0]); i++) {
        uint16_t h;
        float back;
        mge_cpu_f32_to_bf16(&h, &exact[i], 1);
        mge_cpu_bf16_to_f32(&back, &h, 1);
        ck_assert(memcmp(&back, &exact[i], sizeof(float)) == 0);
    }
    /* to nearest, ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 */
    ck_assert(round1(1.0f + 0x1p-8f) == 1.0f);
    ck_assert(round1(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);
    ck_assert(round1(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
    ck_assert(round1(-(1.0f + 0x1p-8f + 0x1p-20f)) == -(1.0f + 0x1p-7f));
    ck_assert(round1(1.0f + 0x1p-9f) == 1.0f);
    /* Inf stays, the largest floats overflow to Inf, NaN stays NaN (also one with only low bits) */
    ck_assert(isinf(round1(INFINITY)) && round1(-INFINITY) < 0);
    ck_assert(isinf(round1(3.4e38f)));
    ck_assert(isnan(round1(NAN)));
    ck_assert(isnan(round1(bits_f(0x7f800001u))));
    /* the relative error bound u = 2^-8 over many values */
    struct mge_rng r;
    mge_rng_seed(&r, 3);
    for (int i = 0; i < 100000; i++) {
        float x = (mge_rng_float(&r) - 0.5f) * 1e3f;
        ck_assert(fabsf(round1(x) - x) <= 0x1p-8f * fabsf(x));
    }
}
END_TEST

/* Random values in [-1, 1) for @n floats. */
static float *rand_buf(struct mge_rng *r, size_t n)
{
    float *p = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++)
        p[i] = 2.0f * mge_rng_float(r) - 1.0f;
    return p;
}

/*
 * C = alpha op(A) op(B) + beta C0 in double from @A and @B rounded to bf16 (@round) or not;
 * @abs gets alpha sum |a||b| per element.
 */
static void ref_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, const float *C0, int ldc, int round,
                     double *ref, double *abs)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, sa = 0;
            for (int k = 0; k < K; k++) {
                float a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                float b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                if (round) {
                    a = round1(a);
                    b = round1(b);
                }
                s += (double)a * b;
                sa += fabs((double)a * b);
            }
            double c0 = beta != 0.0f ? (double)beta * C0[(size_t)i * ldc + j] : 0.0;
            ref[(size_t)i * N + j] = alpha * s + c0;
            abs[(size_t)i * N + j] = fabs(alpha) * sa + fabs(c0);
        }
}

/*
 * One GEMM on either path: the two bounds of the header, and the bf16 error far below the
 * fp32-vs-bf16 one (the inputs really were rounded).
 */
static void check_gemm(int emulate, int ta, int tb, int M, int N, int K, float alpha, float beta,
                       int pad)
{
    struct mge_rng r;
    mge_rng_seed(&r, (uint64_t)(M * 131 + N * 7 + K + ta * 2 + tb + emulate * 1000));
    int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    float *A = rand_buf(&r, (size_t)(ta ? K : M) * lda);
    float *B = rand_buf(&r, (size_t)(tb ? N : K) * ldb);
    float *C = rand_buf(&r, (size_t)M * ldc);
    float *C0 = malloc((size_t)M * ldc * sizeof(float));
    double *ref_r = malloc((size_t)M * N * sizeof(double));
    double *ref_x = malloc((size_t)M * N * sizeof(double));
    double *abs = malloc((size_t)M * N * sizeof(double));
    ck_assert(C0 && ref_r && ref_x && abs);
    memcpy(C0, C, (size_t)M * ldc * sizeof(float));
    ref_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc, 1, ref_r, abs);
    ref_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc, 0, ref_x, abs);
    mge__cpu_gemm_bf16_with(emulate, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    double worst_r = 0, worst_x = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double c = C[(size_t)i * ldc + j], a = abs[(size_t)i * N + j];
            double er = fabs(c - ref_r[(size_t)i * N + j]), ex = fabs(c - ref_x[(size_t)i * N + j]);
            ck_assert_msg(er <= K * 0x1p-23 * a + 1e-30, "(%d,%d) %g vs rounded ref %g (bound %g)",
                          i, j, c, ref_r[(size_t)i * N + j], K * 0x1p-23 * a);
            ck_assert_msg(ex <= (0x1p-7 + K * 0x1p-23) * a, "(%d,%d) %g vs exact %g", i, j, c,
                          ref_x[(size_t)i * N + j]);
            worst_r = fmax(worst_r, er / (a + 1e-30));
            worst_x = fmax(worst_x, ex / (a + 1e-30));
        }
    ck_assert_msg(worst_r < 0.05 * worst_x, "not rounded to bf16? %g vs %g", worst_r, worst_x);
    /* the padding beyond each row of C is untouched */
    for (int i = 0; i < M; i++)
        for (int j = N; j < ldc; j++)
            ck_assert(C[(size_t)i * ldc + j] == C0[(size_t)i * ldc + j]);
    free(A);
    free(B);
    free(C);
    free(C0);
    free(ref_r);
    free(ref_x);
    free(abs);
}

/* _i: bits 0-1 (ta, tb), bit 2 emulated path; beta 0 and 1 (the engine's acc), alpha 1, 0.5 */
START_TEST(test_gemm_bf16_transposes)
{
    int ta = _i & 1, tb = (_i >> 1) & 1, emulate = (_i >> 2) & 1;
    check_gemm(emulate, ta, tb, 37, 45, 300, 1.0f, 0.0f, 0);
    check_gemm(emulate, ta, tb, 37, 45, 300, 1.0f, 1.0f, 3);
    check_gemm(emulate, ta, tb, 19, 64, 33, 0.5f, 1.0f, 5);
    check_gemm(emulate, ta, tb, 1, 1, 1, 1.0f, 0.0f, 0);
}
END_TEST

/* The MLP's GEMMs at batch 128: forward x W^T, dW = dy^T x, dx = dy W (oneDNN path). */
START_TEST(test_gemm_bf16_mlp_shapes)
{
    check_gemm(0, 0, 1, 128, 512, 784, 1.0f, 0.0f, 0);
    check_gemm(0, 1, 0, 512, 784, 128, 1.0f, 0.0f, 0);
    check_gemm(0, 0, 0, 128, 784, 512, 1.0f, 1.0f, 0);
}
END_TEST

/* Two calls give the same bits (primitives cached per shape), and K = 0 scales C by beta. */
START_TEST(test_gemm_bf16_repeat_and_empty)
{
    struct mge_rng r;
    mge_rng_seed(&r, 9);
    float *A = rand_buf(&r, 64 * 96), *B = rand_buf(&r, 96 * 80);
    float *C1 = calloc(64 * 80, sizeof(float)), *C2 = calloc(64 * 80, sizeof(float));
    ck_assert(C1 && C2);
    mge_cpu_gemm_bf16(0, 0, 64, 80, 96, 1.0f, A, 96, B, 80, 0.0f, C1, 80);
    mge_cpu_gemm_bf16(0, 0, 64, 80, 96, 1.0f, A, 96, B, 80, 0.0f, C2, 80);
    ck_assert(memcmp(C1, C2, 64 * 80 * sizeof(float)) == 0);
    mge_cpu_gemm_bf16(0, 0, 64, 80, 0, 1.0f, A, 96, B, 80, 0.5f, C1, 80);
    for (int i = 0; i < 64 * 80; i++)
        ck_assert(C1[i] == 0.5f * C2[i]);
    free(A);
    free(B);
    free(C1);
    free(C2);
}
END_TEST

/* Naive conv in double on inputs rounded (@round) or not: out, dx, dw, and sum |.| for each. */
struct conv_ref {
    double *y, *ya, *dx, *dxa, *dw, *dwa;
};

static void conv_ref(const struct mge_cpu_conv *cv, const float *x, const float *w, const float *dy,
                     int round, struct conv_ref *o)
{
    size_t ny = (size_t)cv->N * cv->K * cv->P * cv->Q, nx = (size_t)cv->N * cv->C * cv->H * cv->W;
    size_t nw = (size_t)cv->K * cv->C * cv->R * cv->S;
    double *buf = calloc(2 * (ny + nx + nw), sizeof(double));
    ck_assert_ptr_nonnull(buf);
    o->y = buf;
    o->ya = o->y + ny;
    o->dx = o->ya + ny;
    o->dxa = o->dx + nx;
    o->dw = o->dxa + nx;
    o->dwa = o->dw + nw;
    for (int n = 0; n < cv->N; n++)
        for (int k = 0; k < cv->K; k++)
            for (int p = 0; p < cv->P; p++)
                for (int q = 0; q < cv->Q; q++)
                    for (int c = 0; c < cv->C; c++)
                        for (int r = 0; r < cv->R; r++)
                            for (int s = 0; s < cv->S; s++) {
                                int h = p * cv->stride - cv->pad + r;
                                int ww = q * cv->stride - cv->pad + s;
                                if (h < 0 || h >= cv->H || ww < 0 || ww >= cv->W)
                                    continue;
                                size_t ix = (((size_t)n * cv->C + c) * cv->H + h) * cv->W + ww;
                                size_t iw = (((size_t)k * cv->C + c) * cv->R + r) * cv->S + s;
                                size_t iy = (((size_t)n * cv->K + k) * cv->P + p) * cv->Q + q;
                                double xv = round ? round1(x[ix]) : x[ix];
                                double wv = round ? round1(w[iw]) : w[iw];
                                double gv = round ? round1(dy[iy]) : dy[iy];
                                o->y[iy] += xv * wv;
                                o->ya[iy] += fabs(xv * wv);
                                o->dx[ix] += gv * wv;
                                o->dxa[ix] += fabs(gv * wv);
                                o->dw[iw] += gv * xv;
                                o->dwa[iw] += fabs(gv * xv);
                            }
}

/* |got - ref| <= bound * abs (+ 1e-30), and the worst ratio in *worst */
static void expect_close(const float *got, const double *ref, const double *abs, size_t n,
                         double bound, double *worst, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]);
        ck_assert_msg(e <= bound * abs[i] + 1e-30, "%s[%zu]: %g vs %g (sum|.| %g)", what, i, got[i],
                      ref[i], abs[i]);
        *worst = fmax(*worst, e / (abs[i] + 1e-30));
    }
}

/*
 * A ResNet-like conv (16 -> 32 channels, 3x3; stride 1 and 2) in bf16 against both references
 * (with stride 2 the weight gradient is fp32: against the exact one with fp32's bound); backward
 * with acc adds.
 */
START_TEST(test_conv_bf16)
{
    int stride = _i + 1;
    struct mge_cpu_conv cv;
    memset(&cv, 0, sizeof(cv));
    cv.N = 4, cv.C = 16, cv.H = cv.W = 9, cv.K = 32, cv.R = cv.S = 3, cv.stride = stride;
    cv.pad = 1;
    ck_assert_int_eq(mge_cpu_conv_init(&cv), 0);
    size_t ny = (size_t)cv.N * cv.K * cv.P * cv.Q, nx = (size_t)cv.N * cv.C * cv.H * cv.W;
    size_t nw = (size_t)cv.K * cv.C * cv.R * cv.S;
    struct mge_rng r;
    mge_rng_seed(&r, 17 + stride);
    float *x = rand_buf(&r, nx), *w = rand_buf(&r, nw), *dy = rand_buf(&r, ny);
    float *y = malloc(ny * sizeof(float)), *dx = malloc(nx * sizeof(float));
    float *dw = malloc(nw * sizeof(float)), *db = malloc(cv.K * sizeof(float));
    float *dx2 = malloc(nx * sizeof(float)), *dw2 = malloc(nw * sizeof(float));
    void *scratch = malloc(mge_cpu_conv_scratch_bytes_bf16(&cv) + 1);
    ck_assert(y && dx && dw && db && dx2 && dw2 && scratch);
    mge_cpu_conv2d_forward_bf16(&cv, y, x, w, NULL, scratch);
    mge_cpu_conv2d_backward_bf16(&cv, dx, dw, db, dy, x, w, scratch, 0);
    struct conv_ref rr, rx;
    conv_ref(&cv, x, w, dy, 1, &rr);
    conv_ref(&cv, x, w, dy, 0, &rx);
    int red_y = cv.C * cv.R * cv.S, red_x = cv.K * cv.R * cv.S, red_w = cv.N * cv.P * cv.Q;
    double wr = 0, wx = 0;
    expect_close(y, rr.y, rr.ya, ny, red_y * 0x1p-23, &wr, "y");
    expect_close(dx, rr.dx, rr.dxa, nx, red_x * 0x1p-23, &wr, "dx");
    expect_close(y, rx.y, rx.ya, ny, 0x1p-7 + red_y * 0x1p-23, &wx, "y (exact)");
    expect_close(dx, rx.dx, rx.dxa, nx, 0x1p-7 + red_x * 0x1p-23, &wx, "dx (exact)");
    if (stride == 1) {
        expect_close(dw, rr.dw, rr.dwa, nw, red_w * 0x1p-23, &wr, "dw");
        expect_close(dw, rx.dw, rx.dwa, nw, 0x1p-7 + red_w * 0x1p-23, &wx, "dw (exact)");
    } else { /* a strided conv's weight gradient is fp32 (conv.c says why) */
        double w32 = 0;
        expect_close(dw, rx.dw, rx.dwa, nw, red_w * 0x1p-23, &w32, "dw (fp32)");
    }
    ck_assert_msg(wr < 0.05 * wx, "not rounded to bf16? %g vs %g", wr, wx);
    /* dbias is the fp32 sum of dout over N, P, Q */
    for (int k = 0; k < cv.K; k++) {
        double s = 0;
        for (int n = 0; n < cv.N; n++)
            for (int i = 0; i < cv.P * cv.Q; i++)
                s += dy[((size_t)n * cv.K + k) * cv.P * cv.Q + i];
        ck_assert(fabs(db[k] - s) <= 1e-5 * (1 + fabs(s)));
    }
    /* acc: adds the same gradients onto what is there (exactly with oneDNN; im2col, the path
     * without AVX-512 BF16, adds each window's share in turn: a rounding apart) */
    memcpy(dx2, dx, nx * sizeof(float));
    memcpy(dw2, dw, nw * sizeof(float));
    mge_cpu_conv2d_backward_bf16(&cv, dx2, dw2, NULL, dy, x, w, scratch, 1);
    for (size_t i = 0; i < nx; i++)
        ck_assert(fabsf(dx2[i] - 2 * dx[i]) <= 1e-6f * (1 + fabsf(dx[i])));
    for (size_t i = 0; i < nw; i++)
        ck_assert(fabsf(dw2[i] - 2 * dw[i]) <= 1e-6f * (1 + fabsf(dw[i])));
    free(rr.y);
    free(rx.y);
    free(x);
    free(w);
    free(dy);
    free(y);
    free(dx);
    free(dw);
    free(db);
    free(dx2);
    free(dw2);
    free(scratch);
}
END_TEST

START_TEST(test_conv_bf16_small_is_fp32)
{
    struct mge_cpu_conv cv;
    memset(&cv, 0, sizeof(cv));
    cv.N = 8, cv.C = 6, cv.H = cv.W = 14, cv.K = 16, cv.R = cv.S = 5, cv.stride = 1;
    ck_assert_int_eq(mge_cpu_conv_init(&cv), 0);
    size_t ny = (size_t)cv.N * cv.K * cv.P * cv.Q, nx = (size_t)cv.N * cv.C * cv.H * cv.W;
    size_t nw = (size_t)cv.K * cv.C * cv.R * cv.S;
    struct mge_rng r;
    mge_rng_seed(&r, 5);
    float *x = rand_buf(&r, nx), *w = rand_buf(&r, nw), *y1 = malloc(ny * sizeof(float));
    float *y2 = malloc(ny * sizeof(float));
    size_t sb = mge_cpu_conv_scratch_bytes_bf16(&cv), sf = mge_cpu_conv_scratch_bytes(&cv);
    void *scratch = malloc((sb > sf ? sb : sf) + 1);
    ck_assert(y1 && y2 && scratch);
    mge_cpu_conv2d_forward_bf16(&cv, y1, x, w, NULL, scratch);
    mge_cpu_conv2d_forward(&cv, y2, x, w, NULL, scratch);
    ck_assert(memcmp(y1, y2, ny * sizeof(float)) == 0);
    free(x);
    free(w);
    free(y1);
    free(y2);
    free(scratch);
}
END_TEST

/*
 * x (8, 3, 10, 10) -> conv 24@3x3 p1 -> relu -> conv 32@3x3 s2 p1 -> relu -> flatten -> linear
 * 10 -> cross-entropy, built twice from one seed, fp32 and bf16: the loss agrees within 1e-2
 * relative, every gradient within 0.15 relative L2 (see the header), and they differ (bf16 was
 * used).
 */
static struct mge_graph *small_net(int bf16, int *loss, float *x, int32_t *labels)
{
    struct mge_graph *g;
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    mge_graph_set_bf16(g, bf16);
    int64_t xs[4] = {8, 3, 10, 10}, w1s[4] = {24, 3, 3, 3}, b1s[1] = {24};
    int64_t w2s[4] = {32, 24, 3, 3}, b2s[1] = {32}, fs[2] = {10, 32 * 5 * 5}, fbs[1] = {10};
    int64_t ls[1] = {8};
    int in = mge_input(g, "x", MGE_DTYPE_F32, 4, xs, 1);
    int lab = mge_input(g, "y", MGE_DTYPE_I32, 1, ls, 1);
    int w1 = mge_param(g, "c1.w", 4, w1s, MGE_INIT_UNIFORM_FAN_IN, 27);
    int b1 = mge_param(g, "c1.b", 1, b1s, MGE_INIT_UNIFORM_FAN_IN, 27);
    int w2 = mge_param(g, "c2.w", 4, w2s, MGE_INIT_UNIFORM_FAN_IN, 216);
    int b2 = mge_param(g, "c2.b", 1, b2s, MGE_INIT_UNIFORM_FAN_IN, 216);
    int fw = mge_param(g, "fc.w", 2, fs, MGE_INIT_UNIFORM_FAN_IN, 800);
    int fb = mge_param(g, "fc.b", 1, fbs, MGE_INIT_UNIFORM_FAN_IN, 800);
    int h = mge_relu(g, mge_conv2d(g, in, w1, b1, 1, 1));
    h = mge_relu(g, mge_conv2d(g, h, w2, b2, 2, 1));
    int logits = mge_linear(g, mge_flatten(g, h), fw, fb, MGE_ACT_NONE);
    *loss = mge_cross_entropy(g, logits, lab);
    ck_assert_int_eq(mge_graph_error(g), MGE_OK);
    ck_assert_int_eq(mge_graph_backward(g, *loss), MGE_OK);
    ck_assert_int_eq(mge_graph_plan(g, NULL), MGE_OK);
    ck_assert_int_eq(mge_graph_alloc(g), MGE_OK);
    mge_graph_init_params(g, 11);
    mge_graph_bind(g, in, x);
    mge_graph_bind(g, lab, labels);
    ck_assert_int_eq(mge_graph_run(g, MGE_RUN_TRAIN, 1), MGE_OK);
    return g;
}

START_TEST(test_grad_bf16_close_to_fp32)
{
    struct mge_rng r;
    mge_rng_seed(&r, 21);
    float *x = rand_buf(&r, 8 * 3 * 10 * 10);
    for (int i = 0; i < 8 * 3 * 10 * 10; i++)
        x[i] = 0.5f * (x[i] + 1.0f); /* pixels in [0, 1) */
    int32_t labels[8];
    for (int i = 0; i < 8; i++)
        labels[i] = (int32_t)mge_rng_below(&r, 10);
    int l32, l16;
    struct mge_graph *g32 = small_net(0, &l32, x, labels), *g16 = small_net(1, &l16, x, labels);
    float loss32 = *(float *)mge_value_data(g32, l32), loss16 = *(float *)mge_value_data(g16, l16);
    ck_assert_msg(fabsf(loss16 - loss32) <= 1e-2f * fabsf(loss32), "loss %g vs %g", loss16, loss32);
    double worst = 0;
    for (int i = 0; i < mge_graph_n_params(g32); i++) {
        int p32 = mge_graph_param(g32, i), p16 = mge_graph_param(g16, i);
        const float *a = mge_value_data(g32, mge_graph_grad(g32, p32));
        const float *b = mge_value_data(g16, mge_graph_grad(g16, p16));
        double d = 0, n = 0;
        for (int64_t j = 0; j < mge_value_numel(g32, p32); j++) {
            d += ((double)b[j] - a[j]) * ((double)b[j] - a[j]);
            n += (double)a[j] * a[j];
        }
        double rel = sqrt(d / n);
        if (getenv("MGE_TEST_VERBOSE"))
            printf("%s: %g\n", mge_value_name(g32, p32), rel);
        worst = fmax(worst, rel);
    }
    ck_assert_msg(worst < 0.15, "gradient relative error %g", worst);
    ck_assert_msg(worst > 1e-6, "bf16 gradients equal fp32's (%g): bf16 not used?", worst);
    mge_graph_free(g32);
    mge_graph_free(g16);
    free(x);
}
END_TEST

static Suite *bf16_suite(void)
{
    Suite *s = suite_create("bf16");
    TCase *tc = tcase_create("kernels");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_bf16_convert);
    tcase_add_loop_test(tc, test_gemm_bf16_transposes, 0, 8);
    tcase_add_test(tc, test_gemm_bf16_mlp_shapes);
    tcase_add_test(tc, test_gemm_bf16_repeat_and_empty);
    tcase_add_loop_test(tc, test_conv_bf16, 0, 2);
    tcase_add_test(tc, test_conv_bf16_small_is_fp32);
    suite_add_tcase(s, tc);
    tc = tcase_create("engine");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_grad_bf16_close_to_fp32);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mge_test_run(bf16_suite());
}
