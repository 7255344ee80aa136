/*
 * test_quant.c: quantisation: the u8 x s8 GEMM (VNNI and portable) and the int8 convolution (pixel
 * lanes and portable) against scalar references, bit for bit; the quantisers; the straight-through
 * estimator against finite differences of the clipped identity; observers; a quantisation-aware
 * linear layer's gradients against the fp32 layer fed the fake-quantised values; int8 graphs
 * against fake-quantised graphs; and the observer checks that name the corrupt field.
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
#include "engine/engine_int.h" /* the values' table: the chained codes */
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_quant.h"
#include "tests/unit/support/check_run.h"

static float urand(struct mge_rng *r, float lo, float hi)
{
    return lo + (hi - lo) * mge_rng_float(r);
}

/* The GEMM's contract written out plainly: exact int32 sums, then the stated epilogue. */
static void gemm_ref(const struct mge_cpu_qweight *qw, const int8_t *codes, int M, const uint8_t *a,
                     int64_t lda, const struct mge_cpu_qaffine *qx, const float *bias, int relu,
                     float *y, int64_t rs, int64_t cs)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < qw->N; n++) {
            int32_t acc = 0;
            for (int k = 0; k < qw->K; k++)
                acc += (int32_t)a[m * lda + k] * codes[n * qw->K + k];
            float v = (float)(acc - qx->zp * qw->colsum[n]) * (qx->scale * qw->scale[n]);
            if (bias)
                v += bias[n];
            if (relu)
                v = v > 0.0f ? v : 0.0f;
            y[m * rs + n * cs] = v;
        }
}

static const int shapes[][3] = {{1, 1, 1},     {3, 10, 5},     {4, 16, 4},   {7, 17, 33},
                                {33, 64, 100}, {128, 10, 512}, {5, 48, 784}, {64, 120, 400}};

/* _i: shape index x 2 paths (VNNI where the CPU has it, portable) x relu/bias/strides. */
START_TEST(test_gemm_u8s8_matches_reference)
{
    const int *sh = shapes[_i / 2];
    int M = sh[0], N = sh[1], K = sh[2], portable = _i % 2;
    struct mge_rng rng;
    mge_rng_seed(&rng, 100 + (uint64_t)_i);
    float *w = malloc(sizeof(float) * (size_t)(N * K)), *bias = malloc(sizeof(float) * (size_t)N);
    int8_t *codes = malloc((size_t)(N * K));
    int64_t lda = (K + 3) / 4 * 4 + 8; /* a wider row stride than needed */
    uint8_t *a = malloc((size_t)(M * lda));
    float *y = malloc(sizeof(float) * (size_t)(M * N)),
          *ref = malloc(sizeof(float) * (size_t)(M * N));
    for (int i = 0; i < N * K; i++)
        w[i] = urand(&rng, -1.0f, 1.0f) * (float)(1 + i % 7);
    for (int n = 0; n < N; n++)
        bias[n] = urand(&rng, -2.0f, 2.0f);
    for (int i = 0; i < M * lda; i++)
        a[i] = (uint8_t)(mge_rng_float(&rng) * 256.0f);
    struct mge_cpu_qweight qw;
    ck_assert_int_eq(mge_cpu_qweight_pack(&qw, w, N, K), MGE_OK);
    for (int n = 0; n < N; n++) {
        float inv = 1.0f / qw.scale[n];
        for (int k = 0; k < K; k++) {
            codes[n * K + k] = (int8_t)mge_cpu_quant_s8(w[n * K + k], inv);
            ck_assert_int_le(abs(codes[n * K + k]), 127);
        }
    }
    struct mge_cpu_qaffine qx;
    mge_cpu_qaffine_from_range(-1.5f, 3.0f, &qx);
    mge_cpu_set_vnni(!portable);
    for (int variant = 0; variant < 3; variant++) {
        int relu = variant == 1;
        const float *b = variant == 2 ? NULL : bias;
        /* variant 2 stores transposed, as the int8 convolution does */
        int64_t rs = variant == 2 ? 1 : N, cs = variant == 2 ? M : 1;
        mge_cpu_gemm_u8s8(&qw, M, a, lda, &qx, b, relu, y, rs, cs);
        gemm_ref(&qw, codes, M, a, lda, &qx, b, relu, ref, rs, cs);
        for (int i = 0; i < M * N; i++)
            ck_assert_msg(memcmp(&y[i], &ref[i], sizeof(float)) == 0,
                          "M %d N %d K %d %s variant %d: y[%d] = %.9g, reference %.9g", M, N, K,
                          portable ? "portable" : "vnni", variant, i, (double)y[i], (double)ref[i]);
    }
    mge_cpu_set_vnni(1);
    mge_cpu_qweight_fini(&qw);
    free(w);
    free(bias);
    free(codes);
    free(a);
    free(y);
    free(ref);
}
END_TEST

/* Convolution shapes: C, H, W, N, R, S, pad, stride (LeNet's, ResNet's and odd ones). */
static const int conv_shapes[][8] = {
    {1, 28, 28, 6, 5, 5, 2, 1},   {6, 14, 14, 16, 5, 5, 0, 1},  {16, 7, 7, 32, 3, 3, 1, 1},
    {3, 9, 5, 20, 3, 3, 1, 1},    {2, 4, 4, 3, 1, 1, 0, 1},     {5, 13, 11, 17, 3, 2, 1, 1},
    {4, 1, 1, 40, 1, 1, 0, 1},    {8, 28, 28, 16, 3, 3, 1, 1},  {16, 28, 28, 32, 3, 3, 1, 2},
    {16, 28, 28, 32, 1, 1, 0, 2}, {32, 14, 14, 64, 3, 3, 1, 2}, {3, 40, 37, 9, 3, 3, 1, 2},
    {2, 20, 21, 5, 5, 5, 2, 3},   {2, 20, 21, 5, 4, 4, 0, 4},   {2, 20, 21, 5, 3, 3, 1, 5},
    {2, 50, 50, 4, 5, 5, 2, 1},   {3, 12, 12, 5, 7, 7, 3, 2}, /* taps too wide for one load */
    {32, 14, 14, 70, 3, 3, 1, 2}, {12, 7, 7, 64, 3, 3, 1, 1},   {8, 5, 9, 130, 1, 1, 0, 1}};

/* _i: shape x 3 quad layouts (rows, taps, channels) x 3 paths (portable; the automatic choice
 * where the CPU has VNNI; channel lanes forced: rows and channel quads with VNNI) x
 * relu/bias/post. */
static const char *const qconv_paths[3] = {"portable", "automatic", "channel lanes"};

START_TEST(test_qconv_matches_reference)
{
    const int *sh = conv_shapes[_i / 9];
    int C = sh[0], H = sh[1], W = sh[2], N = sh[3], R = sh[4], S = sh[5], pad = sh[6], st = sh[7];
    int path = _i % 3, portable = path == 0, layout = _i / 3 % 3;
    int Hp = H + 2 * pad, Wp = W + 2 * pad;
    int P = (Hp - R) / st + 1, Q = (Wp - S) / st + 1, K = C * R * S;
    struct mge_cpu_qconv_shape shape = {C, Hp, Wp, R, S, st, P, Q};
    int qpc = mge_cpu_qconv_quads(&shape, layout), C4 = (C + 3) / 4;
    int groups = layout == MGE_CPU_QCONV_CHANS ? C4 : C, pb = layout == MGE_CPU_QCONV_CHANS ? 4 : 1;
    struct mge_rng rng;
    mge_rng_seed(&rng, 300 + (uint64_t)_i);
    float *w = malloc(sizeof(float) * (size_t)(N * K)), *bias = malloc(sizeof(float) * (size_t)N);
    size_t xn = (size_t)(4 * C4 * Hp * Wp) + 128;
    uint8_t *xp = malloc(xn), *xq = malloc(xn); /* planes; interleaved by 4 channels */
    int64_t *roff = malloc(sizeof(int64_t) * (size_t)(P * Q));
    int32_t *koff = malloc(sizeof(int32_t) * (size_t)(groups * qpc));
    uint8_t *idx = aligned_alloc(64, (size_t)(64 * qpc));
    float *y = malloc(sizeof(float) * (size_t)(N * P * Q)),
          *ref = malloc(sizeof(float) * (size_t)(N * P * Q));
    for (int i = 0; i < N * K; i++)
        w[i] = urand(&rng, -1.0f, 1.0f) * (float)(1 + i % 5);
    for (int n = 0; n < N; n++)
        bias[n] = urand(&rng, -2.0f, 2.0f);
    for (size_t i = 0; i < xn; i++)
        xp[i] = i < (size_t)(C * Hp * Wp) ? (uint8_t)(mge_rng_float(&rng) * 256.0f) : 0;
    memset(xq, 0, xn);
    for (int c = 0; c < C; c++)
        for (int i = 0; i < Hp * Wp; i++)
            xq[((c / 4) * Hp * Wp + i) * 4 + c % 4] = xp[c * Hp * Wp + i];
    mge_cpu_qconv_tables(&shape, layout, roff, koff, idx);
    ck_assert_int_eq(roff[P * Q - 1], ((int64_t)(P - 1) * Wp + Q - 1) * st * pb);
    struct mge_cpu_qweight qw;
    ck_assert_int_eq(mge_cpu_qweight_pack_conv(&qw, w, N, C, R, S, layout), MGE_OK);
    ck_assert_int_eq(qw.Kp, 4 * groups * qpc);
    struct mge_cpu_qaffine qx;
    mge_cpu_qaffine_from_range(-0.7f, 2.0f, &qx);
    mge_cpu_set_vnni(!portable);
    mge_cpu_qconv_force(path == 2 ? MGE_CPU_QCONV_CHANNELS : MGE_CPU_QCONV_AUTO);
    /* variant 2: a folded batch norm and a residual after the bias, then the relu */
    float *mul = malloc(sizeof(float) * (size_t)N), *add = malloc(sizeof(float) * (size_t)N);
    float *res = malloc(sizeof(float) * (size_t)(N * P * Q));
    for (int n = 0; n < N; n++) {
        mul[n] = urand(&rng, -1.5f, 1.5f);
        add[n] = urand(&rng, -1.0f, 1.0f);
    }
    for (int i = 0; i < N * P * Q; i++)
        res[i] = urand(&rng, -3.0f, 3.0f);
    /* variants 2 and 3 also write the next convolution's codes (planes with a border of 2;
     * channel quads with a border of 1, y left unwritten), 0x5a where nothing may remain */
    struct mge_cpu_qaffine qc;
    mge_cpu_qaffine_from_range(-0.2f, 3.1f, &qc);
    size_t cn = (size_t)((N + 3) / 4 * 4 * (P + 4) * (Q + 4)) + 128;
    uint8_t *codes = malloc(cn), *cref = malloc(cn);
    struct mge_cpu_qpost post = {.mul = mul, .add = add, .res = res};
    post.next[0] = (struct mge_cpu_qcodes){.codes = codes, .qc = &qc};
    /* variants 4 (planes) and 5 (channel quads), without the relu: codes of values far out of
     * range (a scale of ~1e-12, so most values pass +-2^31 once scaled) and of NaN and
     * infinities (from the residual) */
    struct mge_cpu_qaffine qtiny;
    mge_cpu_qaffine_from_range(-1.5e-10f, 2e-10f, &qtiny);
    float *res_odd = malloc(sizeof(float) * (size_t)(N * P * Q));
    for (int i = 0; i < N * P * Q; i++)
        res_odd[i] = i % 7 == 1 ? NAN : i % 7 == 3 ? INFINITY : i % 7 == 5 ? -INFINITY : res[i];
    for (int variant = 0; variant < 6; variant++) {
        int relu = variant >= 1 && variant < 4;
        const float *b = variant == 1 ? NULL : bias;
        const struct mge_cpu_qpost *pp = variant >= 2 ? &post : NULL;
        post.next[0].quads = post.skip_y = variant == 3 || variant == 5;
        post.next[0].pad = post.next[0].quads ? 1 : 2;
        post.next[0].qc = variant == 4 ? &qtiny : &qc;
        post.res = variant == 5 ? res_odd : res;
        memset(codes, 0x5a, cn);
        mge_cpu_qconv(&qw, &shape, pb == 4 ? xq : xp, roff, koff, idx, &qx, b, pp, relu, y);
        for (int n = 0; n < N; n++) {
            float inv = 1.0f / qw.scale[n];
            for (int p = 0; p < P; p++)
                for (int q = 0; q < Q; q++) {
                    int32_t acc = 0;
                    for (int c = 0; c < C; c++)
                        for (int r = 0; r < R; r++)
                            for (int t = 0; t < S; t++)
                                acc += (int32_t)xp[(c * Hp + p * st + r) * Wp + q * st + t] *
                                       mge_cpu_quant_s8(w[((n * C + c) * R + r) * S + t], inv);
                    float v = (float)(acc - qx.zp * qw.colsum[n]) * (qx.scale * qw.scale[n]);
                    if (b)
                        v += b[n];
                    if (pp) {
                        v = v * mul[n] + add[n];
                        v += post.res[(n * P + p) * Q + q];
                    }
                    if (relu)
                        v = v > 0.0f ? v : 0.0f;
                    ref[(n * P + p) * Q + q] = v;
                }
        }
        if (variant >= 2) {
            int cpad = post.next[0].pad;
            size_t used = (size_t)((post.next[0].quads ? (N + 3) / 4 * 4 : N) * (P + 2 * cpad) *
                                   (Q + 2 * cpad)) +
                          128;
            memset(cref, 0x5a, cn);
            mge_cpu_set_vnni(0); /* the reference: the scalar rule */
            if (post.next[0].quads)
                mge_cpu_quantize_u8_padded_quads(cref, ref, N, P, Q, cpad, post.next[0].qc);
            else
                mge_cpu_quantize_u8_padded(cref, ref, N, P, Q, cpad, post.next[0].qc);
            mge_cpu_set_vnni(!portable);
            memset(cref + used - 128, 0, 128);
            for (size_t i = 0; i < cn; i++)
                ck_assert_msg(codes[i] == cref[i],
                              "C %d H %d W %d N %d R %d S %d pad %d stride %d %s variant %d: "
                              "code %zu of %zu = %d, reference %d",
                              C, H, W, N, R, S, pad, st, qconv_paths[path], variant, i, used,
                              codes[i], cref[i]);
        }
        for (int i = 0; i < N * P * Q && !post.skip_y; i++)
            ck_assert_msg(memcmp(&y[i], &ref[i], sizeof(float)) == 0,
                          "C %d H %d W %d N %d R %d S %d pad %d stride %d %s variant %d: y[%d] = "
                          "%.9g, reference %.9g",
                          C, H, W, N, R, S, pad, st, qconv_paths[path], variant, i, (double)y[i],
                          (double)ref[i]);
    }
    mge_cpu_set_vnni(1);
    mge_cpu_qconv_force(MGE_CPU_QCONV_AUTO);
    mge_cpu_qweight_fini(&qw);
    free(codes);
    free(cref);
    free(mul);
    free(add);
    free(res);
    free(res_odd);
    free(w);
    free(bias);
    free(xp);
    free(xq);
    free(roff);
    free(koff);
    free(idx);
    free(y);
    free(ref);
}
END_TEST

START_TEST(test_quantisers)
{
    struct mge_cpu_qaffine q;
    /* a range without 0 is widened to hold it, and 0 is exact */
    mge_cpu_qaffine_from_range(0.5f, 2.0f, &q);
    ck_assert_int_eq(q.zp, 0);
    ck_assert(q.lo == 0.0f);
    mge_cpu_qaffine_from_range(-1.0f, 1.0f, &q);
    ck_assert(q.zp > 120 && q.zp < 135);
    float zero = 0.0f, out;
    mge_cpu_fake_quant_affine(&out, &zero, 1, &q);
    ck_assert(out == 0.0f);
    /* inside the range the error is at most half a step; outside it clamps */
    for (float x = -0.99f; x < 0.99f; x += 0.0137f) {
        mge_cpu_fake_quant_affine(&out, &x, 1, &q);
        ck_assert_float_le(fabsf(out - x), 0.5f * q.scale * 1.0001f);
    }
    float big = 100.0f, nan = NAN;
    mge_cpu_fake_quant_affine(&out, &big, 1, &q);
    ck_assert(out == q.hi);
    ck_assert_int_eq(mge_cpu_quant_u8(nan, &q), 0);
    ck_assert_int_eq(mge_cpu_quant_u8(-1e30f, &q), 0);
    ck_assert_int_eq(mge_cpu_quant_u8(1e30f, &q), 255);
    /* the row quantiser (vectorised where the CPU has VNNI) codes as the scalar rule does,
     * ties, NaN, infinities and huge values included, and zeroes the row's tail */
    enum { NQ = 203 };
    float xs[NQ];
    uint8_t codes[NQ + 5];
    struct mge_rng rng;
    mge_rng_seed(&rng, 3);
    for (int i = 0; i < NQ; i++)
        xs[i] = i % 17 == 0 ? ((float)(i % 5) - 2.5f) * q.scale /* ties */
                            : urand(&rng, -1.5f, 1.5f);
    xs[1] = NAN;
    xs[2] = INFINITY;
    xs[3] = -INFINITY;
    xs[4] = 3e38f;
    for (int portable = 0; portable < 2; portable++) {
        mge_cpu_set_vnni(!portable);
        memset(codes, 0xab, sizeof(codes));
        mge_cpu_quantize_u8(codes, NQ + 5, xs, NQ, 1, NQ, &q);
        for (int i = 0; i < NQ; i++)
            ck_assert_int_eq(codes[i], mge_cpu_quant_u8(xs[i], &q));
        for (int i = NQ; i < NQ + 5; i++)
            ck_assert_int_eq(codes[i], 0);
    }
    mge_cpu_set_vnni(1);
    /* an empty range: scale 1, no division by zero */
    mge_cpu_qaffine_from_range(0.0f, 0.0f, &q);
    ck_assert(q.scale == 1.0f);
    /* weights: per row, the largest magnitude maps to +-127 */
    float w[6] = {0.5f, -1.0f, 0.25f, 0.0f, 0.0f, 0.0f}, fq[6];
    mge_cpu_fake_quant_weight(fq, w, 2, 3);
    ck_assert(fq[1] == -1.0f);
    ck_assert_float_le(fabsf(fq[0] - 0.5f), 0.5f / 127.0f);
    ck_assert(fq[3] == 0.0f && fq[4] == 0.0f);
}
END_TEST

/*
 * The straight-through estimator is the derivative of the clipped identity clamp(x, lo, hi)
 * that fake quantisation rounds: central differences of that function (away from the two
 * kinks) must equal the backward kernel's output, and accumulation must add.
 */
START_TEST(test_ste_finite_differences)
{
    struct mge_cpu_qaffine q;
    mge_cpu_qaffine_from_range(-0.7f, 1.3f, &q);
    enum { N = 400 };
    float x[N], dy[N], dx[N], acc[N];
    struct mge_rng rng;
    mge_rng_seed(&rng, 7);
    for (int i = 0; i < N; i++) {
        x[i] = urand(&rng, -2.0f, 2.5f);
        dy[i] = urand(&rng, -1.0f, 1.0f);
        acc[i] = 0.5f;
    }
    mge_cpu_fake_quant_affine_backward(dx, dy, x, N, &q, 0);
    mge_cpu_fake_quant_affine_backward(acc, dy, x, N, &q, 1);
    const double h = 1e-3;
    int inside = 0, outside = 0;
    for (int i = 0; i < N; i++) {
        double lo = q.lo - 0.5 * q.scale, hi = q.hi + 0.5 * q.scale; /* where codes clamp */
        if (fabs(x[i] - lo) < 2 * h || fabs(x[i] - hi) < 2 * h)
            continue;
        double fp = fmin(fmax(x[i] + h, lo), hi), fm = fmin(fmax(x[i] - h, lo), hi);
        double fd = (double)dy[i] * (fp - fm) / (2 * h);
        ck_assert_msg(fabs(fd - dx[i]) < 1e-4, "x %g: finite difference %g, STE %g", (double)x[i],
                      fd, (double)dx[i]);
        ck_assert(acc[i] == 0.5f + dx[i]);
        inside += dx[i] != 0.0f;
        outside += dx[i] == 0.0f;
    }
    ck_assert_int_gt(inside, 100);
    ck_assert_int_gt(outside, 50);
}
END_TEST

/* Observer rules over two batches: minmax keeps the extremes, ema moves by the momentum,
 * percentile ignores a lone outlier. */
START_TEST(test_observers)
{
    static const enum mge_quant_observer kinds[] = {MGE_QUANT_OBS_MINMAX, MGE_QUANT_OBS_EMA,
                                                    MGE_QUANT_OBS_PERCENTILE};
    enum { B = 256, K = 8 };
    for (int k = 0; k < 3; k++) {
        struct mge_graph *g;
        struct mge_quant_opts o = {
            .mode = MGE_QUANT_FAKE, .observer = kinds[k], .momentum = 0.25f, .percentile = 99.0f};
        ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
        ck_assert_int_eq(mge_graph_set_quant(g, &o), MGE_OK);
        int64_t xs[2] = {B, K}, ws[2] = {2, K}, ls[1] = {B};
        int x = mge_input(g, "x", MGE_DTYPE_F32, 2, xs, 1);
        int lab = mge_input(g, "y", MGE_DTYPE_I32, 1, ls, 1);
        int w = mge_param(g, "fc.w", 2, ws, MGE_INIT_UNIFORM_FAN_IN, K);
        int loss = mge_cross_entropy(g, mge_linear(g, x, w, -1, MGE_ACT_NONE), lab);
        ck_assert_int_ge(loss, 0);
        ck_assert_int_eq(mge_graph_backward(g, loss), MGE_OK);
        ck_assert_int_eq(mge_graph_plan(g, NULL), MGE_OK);
        ck_assert_int_eq(mge_graph_alloc(g), MGE_OK);
        mge_graph_init_params(g, 1);
        int obs = -1;
        for (int i = 0; i < mge_graph_n_params(g); i++)
            if (!strcmp(mge_value_name(g, mge_graph_param(g, i)), "fc.act_observer"))
                obs = mge_graph_param(g, i);
        ck_assert_int_ge(obs, 0);
        ck_assert(mge_value_is_buffer(g, obs));
        static float xv[B * K];
        static int32_t yv[B];
        mge_graph_bind(g, x, xv);
        mge_graph_bind(g, lab, yv);
        for (int i = 0; i < B * K; i++)
            xv[i] = -1.0f + 2.0f * (float)i / (float)(B * K); /* [-1, 1) */
        ck_assert_int_eq(mge_graph_run(g, MGE_RUN_TRAIN, 0), MGE_OK);
        const float *ob = mge_value_data(g, obs);
        ck_assert(ob[2] == 1.0f);
        if (kinds[k] != MGE_QUANT_OBS_PERCENTILE)
            ck_assert(ob[0] == -1.0f);
        float lo1 = ob[0], hi1 = ob[1];
        for (int i = 0; i < B * K; i++)
            xv[i] = 0.5f * xv[i];
        xv[3] = 50.0f; /* one outlier */
        ck_assert_int_eq(mge_graph_run(g, MGE_RUN_TRAIN, 1), MGE_OK);
        ck_assert(ob[2] == 2.0f);
        if (kinds[k] == MGE_QUANT_OBS_MINMAX) {
            ck_assert(ob[0] == lo1 && ob[1] == 50.0f);
        } else if (kinds[k] == MGE_QUANT_OBS_EMA) {
            ck_assert_float_eq_tol(ob[0], lo1 + 0.25f * (-0.5f - lo1), 1e-6f);
            ck_assert_float_eq_tol(ob[1], hi1 + 0.25f * (50.0f - hi1), 1e-5f);
        } else {
            /* the outlier is 1 of 2048 values, inside the top 1%: the high end stays ~0.5 */
            ck_assert_float_lt(ob[1], 1.5f);
            ck_assert_float_gt(ob[1], 0.4f);
        }
        /* inference runs do not observe */
        ck_assert_int_eq(mge_graph_run(g, MGE_RUN_INFER, 2), MGE_OK);
        ck_assert(ob[2] == 2.0f);
        mge_graph_free(g);
    }
}
END_TEST

/*
 * A QAT linear layer's weight gradient is the fp32 layer's gradient at the fake-quantised
 * input and weights (the STE passes the weight's gradient straight through), bit for bit; and
 * before quant.start_step the layer is plain fp32.
 */
START_TEST(test_qat_linear_gradients)
{
    enum { B = 16, K = 12, N = 5 };
    struct mge_quant_opts o = {.mode = MGE_QUANT_FAKE,
                               .observer = MGE_QUANT_OBS_MINMAX,
                               .momentum = 0.01f,
                               .percentile = 99.99f,
                               .start_step = 3};
    struct mge_graph *gq, *gf;
    int64_t xs[2] = {B, K}, ws[2] = {N, K}, bs[1] = {N}, ls[1] = {B};
    int xq, lq, wq, bq, xf, lf, wf, bf, loss;
    ck_assert_int_eq(mge_graph_new(&gq), MGE_OK);
    ck_assert_int_eq(mge_graph_set_quant(gq, &o), MGE_OK);
    xq = mge_input(gq, "x", MGE_DTYPE_F32, 2, xs, 1);
    lq = mge_input(gq, "y", MGE_DTYPE_I32, 1, ls, 1);
    wq = mge_param(gq, "fc.w", 2, ws, MGE_INIT_UNIFORM_FAN_IN, K);
    bq = mge_param(gq, "fc.b", 1, bs, MGE_INIT_UNIFORM_FAN_IN, K);
    loss = mge_cross_entropy(gq, mge_linear(gq, xq, wq, bq, MGE_ACT_NONE), lq);
    ck_assert_int_eq(mge_graph_backward(gq, loss), MGE_OK);
    ck_assert_int_eq(mge_graph_plan(gq, NULL), MGE_OK);
    ck_assert_int_eq(mge_graph_alloc(gq), MGE_OK);
    mge_graph_init_params(gq, 5);

    ck_assert_int_eq(mge_graph_new(&gf), MGE_OK);
    xf = mge_input(gf, "x", MGE_DTYPE_F32, 2, xs, 1);
    lf = mge_input(gf, "y", MGE_DTYPE_I32, 1, ls, 1);
    wf = mge_param(gf, "fc.w", 2, ws, MGE_INIT_UNIFORM_FAN_IN, K);
    bf = mge_param(gf, "fc.b", 1, bs, MGE_INIT_UNIFORM_FAN_IN, K);
    loss = mge_cross_entropy(gf, mge_linear(gf, xf, wf, bf, MGE_ACT_NONE), lf);
    ck_assert_int_eq(mge_graph_backward(gf, loss), MGE_OK);
    ck_assert_int_eq(mge_graph_plan(gf, NULL), MGE_OK);
    ck_assert_int_eq(mge_graph_alloc(gf), MGE_OK);

    float x[B * K], xfq[B * K];
    int32_t y[B];
    struct mge_rng rng;
    mge_rng_seed(&rng, 11);
    for (int i = 0; i < B * K; i++)
        x[i] = urand(&rng, -2.0f, 3.0f);
    for (int i = 0; i < B; i++)
        y[i] = i % N;
    mge_graph_bind(gq, xq, x);
    mge_graph_bind(gq, lq, y);
    mge_graph_bind(gf, xf, xfq);
    mge_graph_bind(gf, lf, y);
    for (int step = 2; step <= 3; step++) {
        ck_assert_int_eq(mge_graph_run(gq, MGE_RUN_TRAIN, step), MGE_OK);
        /* the fp32 graph at what the QAT graph multiplied (step 2: the plain values) */
        const float *obs = NULL;
        for (int i = 0; i < mge_graph_n_params(gq); i++)
            if (mge_value_is_buffer(gq, mge_graph_param(gq, i)))
                obs = mge_value_data(gq, mge_graph_param(gq, i));
        ck_assert_ptr_nonnull(obs);
        struct mge_cpu_qaffine qa;
        mge_cpu_qaffine_from_range(obs[0], obs[1], &qa);
        if (step == 3) {
            mge_cpu_fake_quant_affine(xfq, x, B * K, &qa);
            mge_cpu_fake_quant_weight(mge_value_data(gf, wf), mge_value_data(gq, wq), N, K);
        } else {
            memcpy(xfq, x, sizeof(x));
            memcpy(mge_value_data(gf, wf), mge_value_data(gq, wq), sizeof(float) * N * K);
        }
        memcpy(mge_value_data(gf, bf), mge_value_data(gq, bq), sizeof(float) * N);
        ck_assert_int_eq(mge_graph_run(gf, MGE_RUN_TRAIN, step), MGE_OK);
        const float *dq = mge_value_data(gq, mge_graph_grad(gq, wq));
        const float *df = mge_value_data(gf, mge_graph_grad(gf, wf));
        ck_assert(memcmp(dq, df, sizeof(float) * N * K) == 0);
        dq = mge_value_data(gq, mge_graph_grad(gq, bq));
        df = mge_value_data(gf, mge_graph_grad(gf, bf));
        ck_assert(memcmp(dq, df, sizeof(float) * N) == 0);
    }
    mge_graph_free(gq);
    mge_graph_free(gf);
}
END_TEST

/* One model (linear + relu, conv) built three ways; returns the logits after a run. */
/* Keep @out, plan, allocate and initialise @g's parameters with @seed. */
static void graph_ready(struct mge_graph *g, int out, uint64_t seed)
{
    ck_assert_int_ge(out, 0);
    ck_assert_int_eq(mge_graph_keep(g, out), MGE_OK);
    ck_assert_int_eq(mge_graph_plan(g, NULL), MGE_OK);
    ck_assert_int_eq(mge_graph_alloc(g), MGE_OK);
    mge_graph_init_params(g, seed);
}

/* One input in [-1, 2) from @seed (*@rng goes on from there) bound to input @x of @g and @y of
 * @h, both its shape; the caller frees it. */
static float *bind_random(struct mge_graph *g, int x, struct mge_graph *h, int y, uint64_t seed,
                          struct mge_rng *rng)
{
    int64_t n = mge_value_numel(g, x);
    float *v = malloc(sizeof(float) * (size_t)n);
    mge_rng_seed(rng, seed);
    for (int64_t i = 0; i < n; i++)
        v[i] = urand(rng, -1.0f, 2.0f);
    mge_graph_bind(g, x, v);
    mge_graph_bind(h, y, v);
    return v;
}

struct small {
    struct mge_graph *g;
    int x, out;
};

static void small_build(struct small *s, enum mge_quant_mode mode, int conv)
{
    struct mge_quant_opts o = {.mode = mode, .momentum = 0.01f, .percentile = 99.99f};
    int64_t xs[4] = {8, 3, 9, 9}, cws[4] = {6, 3, 3, 3}, cbs[1] = {6};
    int64_t ls[2] = {8, 27}, lws[2] = {20, 27}, lbs[1] = {20}, w2s[2] = {7, 20}, b2s[1] = {7};
    ck_assert_int_eq(mge_graph_new(&s->g), MGE_OK);
    ck_assert_int_eq(mge_graph_set_quant(s->g, &o), MGE_OK);
    struct mge_graph *g = s->g;
    if (conv) {
        s->x = mge_input(g, "x", MGE_DTYPE_F32, 4, xs, 1);
        int w = mge_param(g, "c.w", 4, cws, MGE_INIT_UNIFORM_FAN_IN, 27);
        int b = mge_param(g, "c.b", 1, cbs, MGE_INIT_UNIFORM_FAN_IN, 27);
        s->out = mge_relu(g, mge_conv2d(g, s->x, w, b, 2, 1));
    } else {
        s->x = mge_input(g, "x", MGE_DTYPE_F32, 2, ls, 1);
        int w = mge_param(g, "fc1.w", 2, lws, MGE_INIT_UNIFORM_FAN_IN, 27);
        int b = mge_param(g, "fc1.b", 1, lbs, MGE_INIT_UNIFORM_FAN_IN, 27);
        int w2 = mge_param(g, "fc2.w", 2, w2s, MGE_INIT_UNIFORM_FAN_IN, 20);
        int b2 = mge_param(g, "fc2.b", 1, b2s, MGE_INIT_UNIFORM_FAN_IN, 20);
        s->out = mge_linear(g, mge_linear(g, s->x, w, b, MGE_ACT_FN_RELU), w2, b2, MGE_ACT_NONE);
    }
    graph_ready(g, s->out, 3);
}

/*
 * int8 graphs against the fake-quantised graph over the same parameters and observers: the
 * codes are the same, so each output differs by fp32 rounding of the sums only; the second
 * linear's input codes may move by one step where the first's output sits on a rounding edge,
 * so its outputs are compared within one step of its input times the weights' size.
 */
START_TEST(test_int8_graph_matches_fake)
{
    int conv = _i;
    struct small f, q;
    small_build(&f, MGE_QUANT_FAKE, conv);
    small_build(&q, MGE_QUANT_INT8, conv);
    int64_t n, np;
    struct mge_rng rng;
    float *x = bind_random(f.g, f.x, q.g, q.x, 21, &rng);
    /* observers: set as a training run would, then copied to the int8 graph */
    for (int i = 0; i < mge_graph_n_params(f.g); i++) {
        int v = mge_graph_param(f.g, i);
        if (mge_value_is_buffer(f.g, v)) {
            float *o = mge_value_data(f.g, v);
            o[0] = -0.8f;
            o[1] = 1.9f;
            o[2] = 1.0f;
        }
    }
    float *pf = mge_graph_params(f.g, &np), *pq = mge_graph_params(q.g, &n);
    ck_assert_int_eq(n, np);
    memcpy(pq, pf, sizeof(float) * (size_t)n);
    ck_assert_int_eq(mge_graph_run(f.g, MGE_RUN_INFER, 0), MGE_OK);
    ck_assert_int_eq(mge_graph_run(q.g, MGE_RUN_INFER, 0), MGE_OK);
    const float *yf = mge_value_data(f.g, f.out), *yq = mge_value_data(q.g, q.out);
    int64_t m = mge_value_numel(f.g, f.out);
    double maxabs = 0.0, maxerr = 0.0;
    for (int64_t i = 0; i < m; i++) {
        maxabs = fmax(maxabs, fabs(yf[i]));
        maxerr = fmax(maxerr, fabs((double)yf[i] - yq[i]));
    }
    /* one input step (2.7 / 255) times a row of at most 20 weights below 1/sqrt(20) */
    double bound = conv ? 1e-5 * maxabs + 1e-6 : 2.7 / 255.0 * 20.0 / sqrt(20.0);
    ck_assert_msg(maxerr <= bound, "%s: max |int8 - fake| %g > %g", conv ? "conv" : "mlp", maxerr,
                  bound);
    ck_assert(maxabs > 0.1);
    free(x);
    mge_graph_free(f.g);
    mge_graph_free(q.g);
}
END_TEST

/* A residual block in int8, "conv.w" + ... names; @sep: an exact x * 1 after each conv, so no
 * batch norm, add or relu can fold into it. */
struct block {
    struct mge_graph *g;
    int x, out;
};

static int block_conv_bn(struct mge_graph *g, const char *name, int x, int64_t cin, int64_t cout,
                         int k, int stride, int one)
{
    char n[32];
    int64_t ws[4] = {cout, cin, k, k}, cs[1] = {cout};
    snprintf(n, sizeof(n), "%s.w", name);
    int w = mge_param(g, n, 4, ws, MGE_INIT_UNIFORM_FAN_IN, cin * k * k);
    snprintf(n, sizeof(n), "%s.bn.w", name);
    int bw = mge_param(g, n, 1, cs, MGE_INIT_ONE, 1);
    snprintf(n, sizeof(n), "%s.bn.b", name);
    int bb = mge_param(g, n, 1, cs, MGE_INIT_ZERO, 1);
    snprintf(n, sizeof(n), "%s.bn.mean", name);
    int rm = mge_buffer(g, n, 1, cs, MGE_INIT_ZERO);
    snprintf(n, sizeof(n), "%s.bn.var", name);
    int rv = mge_buffer(g, n, 1, cs, MGE_INIT_ONE);
    int y = mge_conv2d(g, x, w, -1, stride, k / 2);
    if (one >= 0)
        y = mge_mul(g, y, one);
    return mge_batchnorm2d(g, y, bw, bb, rm, rv, 1e-5f, 0.1f);
}

static void block_build(struct block *b, int sep)
{
    struct mge_quant_opts o = {.mode = MGE_QUANT_INT8, .momentum = 0.01f, .percentile = 99.99f};
    int64_t xs[4] = {4, 3, 7, 7}, os[1] = {1}; /* maps small enough to chain codes */
    ck_assert_int_eq(mge_graph_new(&b->g), MGE_OK);
    ck_assert_int_eq(mge_graph_set_quant(b->g, &o), MGE_OK);
    struct mge_graph *g = b->g;
    b->x = mge_input(g, "x", MGE_DTYPE_F32, 4, xs, 1);
    int one = sep ? mge_buffer(g, "one", 1, os, MGE_INIT_ONE) : -1;
    /* a stem whose output feeds two int8 convolutions (c1, sc) */
    int x = mge_relu(g, block_conv_bn(g, "c0", b->x, 3, 8, 3, 1, one));
    int h = mge_relu(g, block_conv_bn(g, "c1", x, 8, 16, 3, 2, one));
    h = block_conv_bn(g, "c2", h, 16, 16, 3, 1, one);
    int sc = block_conv_bn(g, "sc", x, 8, 16, 1, 2, one);
    b->out = mge_relu(g, mge_add(g, h, sc));
    graph_ready(g, b->out, 5);
}

/* @s gets @f's parameters by name, with batch norms (from @rng) and observers away from their
 * initial values. */
static void block_same_params(struct block *f, struct block *s, struct mge_rng *rng)
{
    for (int i = 0; i < mge_graph_n_params(f->g); i++) {
        int v = mge_graph_param(f->g, i), u = -1;
        const char *name = mge_value_name(f->g, v);
        for (int j = 0; j < mge_graph_n_params(s->g); j++)
            if (!strcmp(mge_value_name(s->g, mge_graph_param(s->g, j)), name))
                u = mge_graph_param(s->g, j);
        ck_assert_msg(u >= 0, "no '%s' in the other graph", name);
        float *d = mge_value_data(f->g, v);
        int64_t len = mge_value_numel(f->g, v);
        if (strstr(name, "act_observer")) {
            /* the two consumers of c0's output quantise it differently */
            d[0] = strstr(name, "sc.") ? -0.4f : -1.1f;
            d[1] = strstr(name, "sc.") ? 1.9f : 2.3f;
            d[2] = 1.0f;
        } else if (strstr(name, ".bn.")) {
            for (int64_t k = 0; k < len; k++)
                d[k] = strstr(name, ".var") ? urand(rng, 0.3f, 2.0f) : urand(rng, -0.7f, 0.7f);
        }
        memcpy(mge_value_data(s->g, u), d, sizeof(float) * (size_t)len);
    }
}

/*
 * Batch norms, a residual add and relus folded into int8 convolutions give the very numbers of
 * the same ops run one by one (the folds repeat their float operations in order), and so do
 * convolutions writing their consumers' input codes in their epilogues (c0 for c1 and sc, each
 * with its own quantiser, c1 for c2; those quantise nothing, and c0's and c1's float outputs are
 * not written), on every path (_i: portable, automatic, channel lanes); and a folded
 * convolution's plain output cannot be read again.
 */
START_TEST(test_int8_folds_match_separate_ops)
{
    int portable = _i == 0;
    struct block f, s;
    block_build(&f, 0);
    block_build(&s, 1);
    struct mge_rng rng;
    float *x = bind_random(f.g, f.x, s.g, s.x, 33, &rng);
    block_same_params(&f, &s, &rng);
    /* c0 -> c1, c0 -> sc, c1 -> c2 are chained through codes in the folded graph only */
    int chained = 0;
    for (int v = 0; v < f.g->n_values; v++)
        chained += !strcmp(mge_value_name(f.g, v), "scratch.codes.int8");
    for (int v = 0; v < s.g->n_values; v++)
        ck_assert_str_ne(mge_value_name(s.g, v), "scratch.codes.int8");
    ck_assert_int_eq(chained, 3);
    mge_cpu_set_vnni(!portable);
    mge_cpu_qconv_force(_i == 2 ? MGE_CPU_QCONV_CHANNELS : MGE_CPU_QCONV_AUTO);
    ck_assert_int_eq(mge_graph_run(f.g, MGE_RUN_INFER, 0), MGE_OK);
    ck_assert_int_eq(mge_graph_run(s.g, MGE_RUN_INFER, 0), MGE_OK);
    mge_cpu_set_vnni(1);
    mge_cpu_qconv_force(MGE_CPU_QCONV_AUTO);
    const float *yf = mge_value_data(f.g, f.out), *ys = mge_value_data(s.g, s.out);
    int64_t m = mge_value_numel(f.g, f.out), positive = 0;
    for (int64_t i = 0; i < m; i++) {
        ck_assert_msg(memcmp(&yf[i], &ys[i], sizeof(float)) == 0, "%s: y[%lld] = %.9g, not %.9g",
                      qconv_paths[_i], (long long)i, (double)yf[i], (double)ys[i]);
        positive += yf[i] > 0.0f;
    }
    ck_assert(positive > m / 10 && positive < m); /* the relu and the residual did something */
    /* fewer ops: three batch norms, the add and two relus live in the convolutions */
    ck_assert_int_lt(mge_graph_n_nodes(f.g), mge_graph_n_nodes(s.g) - 5);
    free(x);
    mge_graph_free(f.g);
    mge_graph_free(s.g);

    /* a folded convolution's output is gone: reading it is a build error naming it */
    struct mge_graph *g;
    struct mge_quant_opts o = {.mode = MGE_QUANT_INT8, .momentum = 0.01f, .percentile = 99.99f};
    int64_t xs[4] = {2, 4, 5, 5}, ws[4] = {4, 4, 3, 3};
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    ck_assert_int_eq(mge_graph_set_quant(g, &o), MGE_OK);
    int xi = mge_input(g, "x", MGE_DTYPE_F32, 4, xs, 1);
    int w = mge_param(g, "c.w", 4, ws, MGE_INIT_UNIFORM_FAN_IN, 36);
    int c = mge_conv2d(g, xi, w, -1, 1, 1);
    ck_assert_int_ge(mge_relu(g, c), 0);
    ck_assert_int_lt(mge_sigmoid(g, c), 0);
    ck_assert_ptr_nonnull(strstr(mge_graph_error_msg(g), "was folded into the int8 convolution"));
    mge_graph_free(g);
}
END_TEST

/*
 * The folded block's four int8 convolutions run image by image as one segment (each image
 * through c0, c1, c2, sc before the next; the stem's output, c2's and the chained codes kept per
 * image in per-thread buffers) give the very numbers of the batch-wide run (MGE_INT8_BLOCK=off),
 * on the portable path and the automatic one, at 1 and 2 threads (_i: path + 2 * (threads - 1)).
 */
START_TEST(test_int8_segments_match_batchwide)
{
    int portable = _i % 2 == 0, threads = 1 + _i / 2, saved = mge_cpu_threads(), locals;
    struct block f, s;
    mge_cpu_set_threads(threads);
    setenv("MGE_INT8_BLOCK", "off", 1);
    block_build(&f, 0);
    unsetenv("MGE_INT8_BLOCK");
    block_build(&s, 0);
    ck_assert_int_eq(mge__quant_segment_nodes(f.g, &locals), 0);
    ck_assert_int_eq(mge__quant_segment_nodes(s.g, &locals), 4);
    /* c0's, c1's, c2's outputs and the three code buffers; not the kept output: they take no
     * arena memory */
    ck_assert_int_eq(locals, 6);
    ck_assert_msg(s.g->act_bytes < f.g->act_bytes, "arena %zu, batch-wide %zu", s.g->act_bytes,
                  f.g->act_bytes);
    struct mge_rng rng;
    float *x = bind_random(f.g, f.x, s.g, s.x, 35, &rng);
    block_same_params(&f, &s, &rng);
    mge_cpu_set_vnni(!portable);
    /* twice: the second run reuses the per-image buffers the first left dirty */
    for (int run = 0; run < 2; run++) {
        ck_assert_int_eq(mge_graph_run(f.g, MGE_RUN_INFER, 0), MGE_OK);
        ck_assert_int_eq(mge_graph_run(s.g, MGE_RUN_INFER, 0), MGE_OK);
        const float *yf = mge_value_data(f.g, f.out), *ys = mge_value_data(s.g, s.out);
        int64_t m = mge_value_numel(f.g, f.out), positive = 0;
        for (int64_t i = 0; i < m; i++) {
            ck_assert_msg(memcmp(&yf[i], &ys[i], sizeof(float)) == 0,
                          "%s, %d threads: y[%lld] = %.9g, not %.9g", qconv_paths[_i % 2], threads,
                          (long long)i, (double)ys[i], (double)yf[i]);
            positive += yf[i] > 0.0f;
        }
        ck_assert(positive > m / 10 && positive < m);
    }
    mge_cpu_set_vnni(1);
    mge_cpu_set_threads(saved);
    free(x);
    mge_graph_free(f.g);
    mge_graph_free(s.g);
}
END_TEST

START_TEST(test_observer_check_names_field)
{
    char err[256];
    float ok[4] = {-1.0f, 2.0f, 3.0f, 0.0f};
    ck_assert_int_eq(mge_quant_observer_check(ok, 4, 1, err, sizeof(err)), MGE_OK);
    float swapped[4] = {2.0f, -1.0f, 3.0f, 0.0f};
    ck_assert_int_eq(mge_quant_observer_check(swapped, 4, 0, err, sizeof(err)), MGE_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "'low'"));
    float nan[4] = {-1.0f, NAN, 3.0f, 0.0f};
    ck_assert_int_eq(mge_quant_observer_check(nan, 4, 0, err, sizeof(err)), MGE_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "'high'"));
    float frac[4] = {-1.0f, 1.0f, 0.5f, 0.0f};
    ck_assert_int_eq(mge_quant_observer_check(frac, 4, 0, err, sizeof(err)), MGE_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "'count'"));
    float empty[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    ck_assert_int_eq(mge_quant_observer_check(empty, 4, 0, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(mge_quant_observer_check(empty, 4, 1, err, sizeof(err)), MGE_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "never observed"));
    ck_assert_int_eq(mge_quant_observer_check(ok, 3, 0, err, sizeof(err)), MGE_CORRUPT);
    ck_assert(mge_quant_is_observer("layer1.0.conv1.act_observer"));
    ck_assert(!mge_quant_is_observer(".act_observer"));
    ck_assert(!mge_quant_is_observer("fc1.w"));
}
END_TEST

static Suite *quant_suite(void)
{
    Suite *s = suite_create("quant");
    TCase *tc = tcase_create("kernels");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_gemm_u8s8_matches_reference, 0,
                        2 * (int)(sizeof(shapes) / sizeof(shapes[0])));
    tcase_add_loop_test(tc, test_qconv_matches_reference, 0,
                        9 * (int)(sizeof(conv_shapes) / sizeof(conv_shapes[0])));
    tcase_add_test(tc, test_quantisers);
    tcase_add_test(tc, test_ste_finite_differences);
    suite_add_tcase(s, tc);
    tc = tcase_create("engine");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_observers);
    tcase_add_test(tc, test_qat_linear_gradients);
    tcase_add_loop_test(tc, test_int8_graph_matches_fake, 0, 2);
    tcase_add_loop_test(tc, test_int8_folds_match_separate_ops, 0, 3);
    tcase_add_loop_test(tc, test_int8_segments_match_batchwide, 0, 4);
    tcase_add_test(tc, test_observer_check_names_field);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mge_test_run(quant_suite());
}
