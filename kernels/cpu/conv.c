/*
 * conv.c: CPU 2-D convolution: the public entry points, which pick a backend ($MGE_CONV), and the
 * im2col + SGEMM backend (per image, images spread over threads), which is also the fallback.
 */
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/conv_winograd_dw_int.h"
#include "kernels/cpu/cpu_int.h"

/* Per-slot scratch: the column matrix, then the slot's partial dw and dbias (backward). */
struct slot_layout {
    size_t col, dw, db, bytes; /* float offsets of each part; bytes per slot */
};

static size_t round_floats(size_t n)
{
    return (n + 15) / 16 * 16; /* 64-byte alignment between parts */
}

static struct slot_layout slot_layout(const struct mge_cpu_conv *cv)
{
    size_t crs = (size_t)cv->C * cv->R * cv->S, pq = (size_t)cv->P * cv->Q;
    struct slot_layout L;
    L.col = 0;
    L.dw = round_floats(crs * pq);
    L.db = L.dw + round_floats((size_t)cv->K * crs);
    L.bytes = (L.db + round_floats((size_t)cv->K)) * sizeof(float);
    return L;
}

int mge_cpu_conv_init(struct mge_cpu_conv *cv)
{
    if (cv->N <= 0 || cv->C <= 0 || cv->H <= 0 || cv->W <= 0 || cv->K <= 0 || cv->R <= 0 ||
        cv->S <= 0 || cv->stride <= 0 || cv->pad < 0)
        return -1;
    if (cv->H + 2 * cv->pad < cv->R || cv->W + 2 * cv->pad < cv->S)
        return -1;
    cv->P = (cv->H + 2 * cv->pad - cv->R) / cv->stride + 1;
    cv->Q = (cv->W + 2 * cv->pad - cv->S) / cv->stride + 1;
    int t = mge_cpu_threads();
    cv->slots = t < cv->N ? t : cv->N;
    return 0;
}

static size_t im2col_scratch_bytes(const struct mge_cpu_conv *cv)
{
    return (size_t)(cv->slots > 0 ? cv->slots : 1) * slot_layout(cv).bytes;
}

/* The output columns [*q0, *q1) whose input column q * stride - pad + s lies inside the image. */
static void valid_q(const struct mge_cpu_conv *cv, int s, int *q0, int *q1)
{
    int st = cv->stride, lo = cv->pad - s, hi = cv->W - 1 + cv->pad - s;
    int a = lo <= 0 ? 0 : (lo + st - 1) / st;
    int b = hi < 0 ? 0 : hi / st + 1;
    *q0 = a < cv->Q ? a : cv->Q;
    *q1 = b < cv->Q ? b : cv->Q;
    if (*q1 < *q0)
        *q1 = *q0;
}

/* col (C*R*S, P*Q) from one image x (C, H, W); zeros where the window hangs over the edge. */
MGE__CPU_CLONES
static void im2col(const struct mge_cpu_conv *cv, float *restrict col, const float *restrict x)
{
    int P = cv->P, Q = cv->Q, st = cv->stride;
    for (int c = 0; c < cv->C; c++)
        for (int r = 0; r < cv->R; r++)
            for (int s = 0; s < cv->S; s++) {
                float *row = col + (((size_t)c * cv->R + r) * cv->S + s) * P * Q;
                int q0, q1;
                valid_q(cv, s, &q0, &q1);
                for (int p = 0; p < P; p++) {
                    int h = p * st - cv->pad + r;
                    float *o = row + (size_t)p * Q;
                    if (h < 0 || h >= cv->H) {
                        memset(o, 0, (size_t)Q * sizeof(float));
                        continue;
                    }
                    const float *xi = x + ((size_t)c * cv->H + h) * cv->W - cv->pad + s;
                    for (int q = 0; q < q0; q++)
                        o[q] = 0.0f;
                    if (st == 1)
                        memcpy(o + q0, xi + q0, (size_t)(q1 - q0) * sizeof(float));
                    else
                        for (int q = q0; q < q1; q++)
                            o[q] = xi[q * st];
                    for (int q = q1; q < Q; q++)
                        o[q] = 0.0f;
                }
            }
}

/* dx (C, H, W) += col2im(col) */
MGE__CPU_CLONES
static void col2im_add(const struct mge_cpu_conv *cv, float *restrict dx, const float *restrict col)
{
    int P = cv->P, Q = cv->Q, st = cv->stride;
    for (int c = 0; c < cv->C; c++)
        for (int r = 0; r < cv->R; r++)
            for (int s = 0; s < cv->S; s++) {
                const float *row = col + (((size_t)c * cv->R + r) * cv->S + s) * P * Q;
                int q0, q1;
                valid_q(cv, s, &q0, &q1);
                for (int p = 0; p < P; p++) {
                    int h = p * st - cv->pad + r;
                    if (h < 0 || h >= cv->H)
                        continue;
                    float *di = dx + ((size_t)c * cv->H + h) * cv->W - cv->pad + s;
                    const float *o = row + (size_t)p * Q;
                    if (st == 1)
                        for (int q = q0; q < q1; q++)
                            di[q] += o[q];
                    else
                        for (int q = q0; q < q1; q++)
                            di[q * st] += o[q];
                }
            }
}

/*
 * A bf16 conv with few channels runs the fp32 direct kernel instead: oneDNN's bf16 kernels pad
 * channels to 16 and fall back to a GEMM for LeNet's first weight gradient; on LeNet at batch
 * 128, 2 threads, its two convs in bf16 took longer than the whole fp32 step (tests/bench).
 */
#define MGE__CONV_BF16_FP32_MAX_C 8  /* input channels ... */
#define MGE__CONV_BF16_FP32_MAX_K 16 /* ... and output channels of a bf16 conv that stays fp32 */

int mge__conv_bf16_is_fp32(const struct mge_cpu_conv *cv)
{
    return cv->C <= MGE__CONV_BF16_FP32_MAX_C && cv->K <= MGE__CONV_BF16_FP32_MAX_K;
}

/* The conv computes in bf16: asked for (@bf16), and not one of those */
static int is_bf16(int bf16, const struct mge_cpu_conv *cv)
{
    return bf16 && !mge__conv_bf16_is_fp32(cv);
}

/* The im2col GEMMs: fp32, or bf16 inputs with fp32 sums for a bf16 conv */
static void conv_gemm(int bf16, int ta, int tb, int M, int N, int K, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc)
{
    if (bf16)
        mge_cpu_gemm_bf16(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    else
        mge_cpu_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

static int is_pointwise(const struct mge_cpu_conv *cv)
{
    return cv->R == 1 && cv->S == 1 && cv->stride == 1 && cv->pad == 0;
}

static int slots_now(const struct mge_cpu_conv *cv)
{
    int t = mge_cpu_threads(), s = cv->slots > 0 ? cv->slots : 1;
    return t < s ? t : s;
}

static void forward_image(int bf16, const struct mge_cpu_conv *cv, int n, float *out,
                          const float *inp, const float *w, const float *bias, float *col)
{
    int CRS = cv->C * cv->R * cv->S, PQ = cv->P * cv->Q;
    const float *x = inp + (size_t)n * cv->C * cv->H * cv->W;
    float *y = out + (size_t)n * cv->K * PQ;
    const float *cx = x; /* a pointwise conv's image is its own column matrix */
    if (!is_pointwise(cv)) {
        im2col(cv, col, x);
        cx = col;
    }
    conv_gemm(bf16, 0, 0, cv->K, PQ, CRS, w, CRS, cx, PQ, 0.0f, y, PQ);
    if (bias)
        for (int k = 0; k < cv->K; k++)
            for (int i = 0; i < PQ; i++)
                y[(size_t)k * PQ + i] += bias[k];
}

static void im2col_forward(int bf16, const struct mge_cpu_conv *cv, float *out, const float *inp,
                           const float *w, const float *bias, void *scratch)
{
    struct slot_layout L = slot_layout(cv);
    int nt = slots_now(cv);
    if (nt <= 1) {
        /* one image at a time: the GEMM itself may use every thread */
        for (int n = 0; n < cv->N; n++)
            forward_image(bf16, cv, n, out, inp, w, bias, scratch);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        float *col = (float *)((char *)scratch + (size_t)omp_get_thread_num() * L.bytes);
#pragma omp for schedule(static)
        for (int n = 0; n < cv->N; n++)
            forward_image(bf16, cv, n, out, inp, w, bias, col);
    }
}

int mge__conv_slot_threads(int slots, int N)
{
    int t = mge_cpu_threads(), s = slots > 0 ? slots : 1;
    s = s < N ? s : N;
    return t < s ? t : s;
}

void mge__conv_dbias_image(float *db_part, const float *dy, int K, size_t PQ)
{
    for (int k = 0; k < K; k++) {
        float s = 0.0f;
        for (size_t i = 0; i < PQ; i++)
            s += dy[(size_t)k * PQ + i];
        db_part[k] += s;
    }
}

/* One image's share: dw_part, db_part += this image; dinp image (+)= conv^T(dout). */
static void backward_image(int bf16, const struct mge_cpu_conv *cv, int n, float *dinp,
                           float *dw_part, float *db_part, const float *dout, const float *inp,
                           const float *w, float *col, int acc)
{
    int CRS = cv->C * cv->R * cv->S, PQ = cv->P * cv->Q;
    size_t CHW = (size_t)cv->C * cv->H * cv->W;
    const float *x = inp + (size_t)n * CHW;
    const float *dy = dout + (size_t)n * cv->K * PQ;
    int pw = is_pointwise(cv);
    if (db_part)
        mge__conv_dbias_image(db_part, dy, cv->K, (size_t)PQ);
    if (dw_part) {
        const float *cx = x;
        if (!pw) {
            im2col(cv, col, x);
            cx = col;
        }
        conv_gemm(bf16, 0, 1, cv->K, CRS, PQ, dy, PQ, cx, PQ, 1.0f, dw_part, CRS);
    }
    if (dinp) {
        float *dx = dinp + (size_t)n * CHW;
        if (pw) {
            conv_gemm(bf16, 1, 0, CRS, PQ, cv->K, w, CRS, dy, PQ, acc ? 1.0f : 0.0f, dx, PQ);
            return;
        }
        conv_gemm(bf16, 1, 0, CRS, PQ, cv->K, w, CRS, dy, PQ, 0.0f, col, PQ);
        if (!acc)
            memset(dx, 0, CHW * sizeof(float));
        col2im_add(cv, dx, col);
    }
}

/*
 * Each slot sums its images' dw and dbias in image order into its own partial; the partials
 * are then added in slot order, so results depend on the slot count only, never on timing.
 */
static void im2col_backward(int bf16, const struct mge_cpu_conv *cv, float *dinp, float *dw,
                            float *dbias, const float *dout, const float *inp, const float *w,
                            void *scratch, int acc)
{
    struct slot_layout L = slot_layout(cv);
    size_t nw = (size_t)cv->K * cv->C * cv->R * cv->S;
    int nt = slots_now(cv);
    if (nt <= 1) {
        float *col = scratch;
        if (dw && !acc)
            memset(dw, 0, nw * sizeof(float));
        if (dbias && !acc)
            memset(dbias, 0, (size_t)cv->K * sizeof(float));
        for (int n = 0; n < cv->N; n++)
            backward_image(bf16, cv, n, dinp, dw, dbias, dout, inp, w, col, acc);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num();
        float *base = (float *)((char *)scratch + (size_t)t * L.bytes);
        float *dwp = dw ? base + L.dw : NULL, *dbp = dbias ? base + L.db : NULL;
        if (dwp)
            memset(dwp, 0, nw * sizeof(float));
        if (dbp)
            memset(dbp, 0, (size_t)cv->K * sizeof(float));
#pragma omp for schedule(static)
        for (int n = 0; n < cv->N; n++)
            backward_image(bf16, cv, n, dinp, dwp, dbp, dout, inp, w, base + L.col, acc);
            /* implicit barrier: all partials complete */
#pragma omp for schedule(static)
        for (size_t i = 0; i < nw + (size_t)cv->K; i++) {
            int is_b = i >= nw;
            float *dst = is_b ? dbias : dw;
            size_t j = is_b ? i - nw : i;
            if (!dst)
                continue;
            float s = acc ? dst[j] : 0.0f;
            for (int u = 0; u < omp_get_num_threads(); u++) {
                const float *ub = (const float *)((const char *)scratch + (size_t)u * L.bytes);
                s += (is_b ? ub + L.db : ub + L.dw)[j];
            }
            dst[j] = s;
        }
    }
}

void mge__conv_bias_grad(const struct mge_cpu_conv *cv, float *db, const float *dout, int acc)
{
    size_t pq = (size_t)cv->P * cv->Q;
    for (int k = 0; k < cv->K; k++) {
        float s = 0.0f;
        for (int n = 0; n < cv->N; n++) {
            const float *d = dout + ((size_t)n * cv->K + k) * pq;
            for (size_t i = 0; i < pq; i++)
                s += d[i];
        }
        db[k] = acc ? db[k] + s : s;
    }
}

/* ---- backend choice ------------------------------------------------------------------------ */

static const char *const conv_names[MGE__CONV_COUNT] = {
    [MGE__CONV_AUTO] = "auto",
    [MGE__CONV_IM2COL] = "im2col",
    [MGE__CONV_DNNL] = "dnnl",
    [MGE__CONV_DIRECT] = "direct",
    [MGE__CONV_WINOGRAD] = "winograd",
};

const char *mge__conv_backend_name(int b)
{
    return b >= 0 && b < MGE__CONV_COUNT ? conv_names[b] : "?";
}

static int g_conv_backend = MGE__CONV_AUTO;
static int g_conv_winograd = 1;    /* "auto" may take Winograd; $MGE_CONV_WINOGRAD=0 turns it off */
static int g_conv_winograd_dw = 1; /* $MGE_CONV_WINOGRAD_DW=0: Winograd's dw off, the rest on */
static int g_conv_winograd4_dw = 1; /* $MGE_CONV_WINOGRAD4_DW=0: F(2x2)'s dw where F(4x4)'s was */
static int g_conv_winograd4 = 1;    /* $MGE_CONV_WINOGRAD4=0: F(2x2) wherever Winograd runs */
static int g_winograd_tile;         /* mge__conv_set_winograd_tile: 2, 4, or 0 (per shape) */
static pthread_once_t g_conv_once = PTHREAD_ONCE_INIT;

/* *@flag = 0 when $@name is "0" (the before/after switches of one build) */
static void env_off(const char *name, int *flag)
{
    const char *v = getenv(name);
    if (v && strcmp(v, "0") == 0)
        *flag = 0;
}

static void conv_backend_init(void)
{
    env_off("MGE_CONV_WINOGRAD", &g_conv_winograd);
    env_off("MGE_CONV_WINOGRAD_DW", &g_conv_winograd_dw);
    env_off("MGE_CONV_WINOGRAD4_DW", &g_conv_winograd4_dw);
    env_off("MGE_CONV_WINOGRAD4", &g_conv_winograd4);
    const char *s = getenv("MGE_CONV");
    if (!s || !*s)
        return;
    for (int b = 0; b < MGE__CONV_COUNT; b++)
        if (strcmp(s, conv_names[b]) == 0)
            g_conv_backend = b;
}

/*
 * "auto" is direct (which hands what it cannot do to im2col) unless a conv has many input
 * channels and narrow output rows, where im2col wins. On LeNet's convs (1 and 6 input
 * channels) at batch 128 direct took 5.1 ms per step on one thread against im2col's 9.6 and
 * oneDNN's 13.0 (plain NCHW makes oneDNN fall back to its gemm convolution); see
 * tests/bench/run_conv.sh. On ResNet-20's 3x3 convs at batch 128, one thread (fwd + bwd ms, the
 * better of two runs on a loaded machine): 16 channels at 28x28 direct 19.1, im2col 21.7; 32 at
 * 14x14 direct 21.5, im2col 20.4; 64 at 7x7 direct 46.7, im2col 24.3 (direct vectorises along
 * an output row, 16 lanes: a 7-wide row leaves more than half of each vector empty). Direct now
 * runs narrow 3x3 convs flat (vectors across row ends) and takes them whole when their weight
 * gradient can keep output channels in lanes (mge__conv_direct_is_narrow_ok; one thread, CPU
 * time: 32 at 14x14 fwd + bwd 15.3 ms, im2col 23.1; 64 at 7x7 16.5 against 25.1); other narrow
 * convs of at most 3 taps a row give it their forward and data gradient (direct_for_data).
 */
#define MGE__CONV_DIRECT_MAX_C 8  /* input channels direct always takes */
#define MGE__CONV_DIRECT_MIN_Q 16 /* output width from which direct takes any channel count */

/*
 * Where "auto" gives a conv to im2col (many input channels, narrow rows), direct still runs the
 * forward and the data gradient (a forward conv too) of one with S <= 3, which it computes flat:
 * on ResNet-20's 32x14x14 and 64x7x7 convs at one thread direct took 5.5 and 5.8 ms a forward
 * against im2col's 7.4 and 9.0; a weight gradient that sums lanes per image is the slower one
 * there, so dw stays on im2col.
 */
static int direct_for_data(int b, int bf16, const struct mge_cpu_conv *cv)
{
    if (b != MGE__CONV_AUTO || bf16)
        return 0;
    pthread_once(&g_conv_once, conv_backend_init);
    return (g_conv_backend == MGE__CONV_AUTO || g_conv_backend == MGE__CONV_WINOGRAD) &&
           cv->S <= 3 && mge__conv_direct_scratch_bytes(cv) > 0;
}

/*
 * Whether the forward and the data gradient of @cv run Winograd F(2x2, 3x3) (conv_winograd.c):
 * asked for ("winograd", which hands everything else to "auto"), or "auto" on a 3x3 stride-1
 * pad-1 fp32 conv with at least MGE__CONV_WINOGRAD_MIN_C channels in and out, unless
 * $MGE_CONV_WINOGRAD=0. ResNet-20's convs at batch 128, one thread, CPU ms per call (direct
 * against Winograd; backward is dinp + dw, dw direct in both; tests/bench/run_conv.sh under
 * load 4, before odd widths lost their junk tile): 16x28x28 fwd 5.08 / 4.04, bwd 12.10 / 11.87;
 * 32x14x14 fwd 5.09 / 3.42, bwd 10.28 / 8.71; 64x7x7 fwd 5.68 / 4.81, bwd 10.60 / 9.61. Few
 * channels leave the tile transforms
 * (linear in C + K) heavier than the GEMMs (C * K), hence the bound. A work item is at least one
 * whole image, whose transformed tiles take 16 / 4 = 4x its input and output: beyond 32x32 maps
 * (not measured) they leave L2, so "auto" stops there.
 */
#define MGE__CONV_WINOGRAD_MIN_C 16
#define MGE__CONV_WINOGRAD_MAX_HW (32 * 32)

static int use_winograd(int b, int bf16, const struct mge_cpu_conv *cv)
{
    if (bf16 || !mge__conv_winograd_ok(cv))
        return 0;
    if (b == MGE__CONV_WINOGRAD)
        return 1;
    if (b != MGE__CONV_AUTO)
        return 0;
    pthread_once(&g_conv_once, conv_backend_init);
    if (g_conv_backend != MGE__CONV_AUTO)
        return g_conv_backend == MGE__CONV_WINOGRAD;
    return g_conv_winograd && cv->C >= MGE__CONV_WINOGRAD_MIN_C &&
           cv->K >= MGE__CONV_WINOGRAD_MIN_C && cv->H * cv->W <= MGE__CONV_WINOGRAD_MAX_HW;
}

/*
 * Whether @cv runs conv_stride2.c's phase-split kernels: a stride-2 fp32 conv they take, asked
 * for ("direct"), or a 3x3 one under "auto" (or "winograd", which hands it to "auto").
 * ResNet-20's downsampling convs at batch 128, one thread, CPU ms per call, im2col against
 * stride2 (load 5): 16x28x28 -> 32 fwd 4.60 / 3.34, dinp 5.02 / 4.17, dw 5.01 / 3.99; 32x14x14
 * -> 64 fwd 4.32 / 3.32, dinp 4.53 / 4.32, dw 3.69 / 3.49. The 1x1 shortcuts stay on im2col
 * (0.62 / 1.04 fwd, 0.83 / 1.39 dw: the phase split costs more than their small GEMMs).
 */
static int use_stride2(int b, int bf16, const struct mge_cpu_conv *cv)
{
    if (bf16 || mge__conv_stride2_scratch_bytes(cv) == 0)
        return 0;
    if (b == MGE__CONV_DIRECT)
        return 1;
    if (b != MGE__CONV_AUTO && b != MGE__CONV_WINOGRAD)
        return 0;
    pthread_once(&g_conv_once, conv_backend_init);
    return (g_conv_backend == MGE__CONV_AUTO || g_conv_backend == MGE__CONV_WINOGRAD ||
            g_conv_backend == MGE__CONV_DIRECT) &&
           cv->R == 3 && cv->S == 3;
}

/*
 * Whether the weight gradient of @cv runs Winograd too: wherever its forward does, unless
 * $MGE_CONV_WINOGRAD_DW=0 (a switch for before/after benchmarks in one build). ResNet-20's
 * convs at batch 128, one thread, CPU ms per dinp + dw (tests/bench/run_conv.sh, load ~5,
 * direct dw against Winograd dw): 16x28x28 12.3 / 10.4, 32x14x14 9.1 / 7.1, 64x7x7 9.1 / 7.6;
 * see docs/benchmarks.md, "Winograd F(2x2, 3x3)".
 */
static int use_winograd_dw(int b, int bf16, const struct mge_cpu_conv *cv)
{
    pthread_once(&g_conv_once, conv_backend_init);
    return g_conv_winograd_dw && use_winograd(b, bf16, cv);
}

/*
 * Whether a Winograd weight gradient (use_winograd_dw) is F(4x4, 3x3)'s (conv_winograd4_dw.c)
 * rather than F(2x2, 3x3)'s: where its GEMMs multiply at most 3/4 as often (36 per 4x4 tile
 * against 16 per 2x2 tile, partial tiles at the edges counted whole), unless
 * $MGE_CONV_WINOGRAD4_DW=0. Its transforms cost more per output, so the gain is smaller than the
 * count's: ResNet-20's convs at batch 128, one thread, CPU ms per dw alone, F(2x2) against
 * F(4x4) (tests/bench/run_conv.sh ... dw, load 3): 16x28x28 3.18 / 2.13 (multiplies 1.78x
 * fewer), 32x14x14 2.57 / 2.34 (1.36x), 64x7x7 3.20 / 2.31 (1.78x). A 5x5 or 6x6 map (1.0x)
 * and a 1x1 one (F(4x4) 2.25x more) stay on F(2x2).
 */
int mge__conv_winograd_dw_is_f4(const struct mge_cpu_conv *cv)
{
    pthread_once(&g_conv_once, conv_backend_init);
    long m2 = (long)((cv->H + 1) / 2) * ((cv->W + 1) / 2) * 16;
    long m4 = (long)((cv->H + 3) / 4) * ((cv->W + 3) / 4) * 36;
    return g_conv_winograd4_dw && 4 * m4 <= 3 * m2;
}

/* dw (+)= the weight gradient by the Winograd kernel mge__conv_winograd_dw_is_f4 picks */
static int winograd_dw(const struct mge_cpu_conv *cv, float *dw, const float *dout,
                       const float *inp, void *scratch, int acc)
{
    if (mge__conv_winograd_dw_is_f4(cv))
        return mge__conv_winograd4_backward_weights(cv, dw, dout, inp, scratch, acc);
    return mge__conv_winograd_backward_weights(cv, dw, dout, inp, scratch, acc);
}

void mge__conv_set_winograd_tile(int m)
{
    g_winograd_tile = m == 2 || m == 4 ? m : 0;
}

/*
 * Whether a conv that runs Winograd (use_winograd) takes F(4x4, 3x3) for its forward and data
 * gradient rather than F(2x2, 3x3): unless $MGE_CONV_WINOGRAD4=0 (a switch for before/after
 * benchmarks in one build) or a test or benchmark chose a tile (mge__conv_set_winograd_tile),
 * F(4x4) wherever Winograd runs, because it won on every shape measured. One thread, batch 128,
 * CPU ms per forward, F(2x2) / F(4x4), best of two or three runs at load 4-5 (100 calls of
 * mge__cpu_conv2d_forward_with, as many channels in as out): ResNet-20's 16x28x28 4.66 / 3.31,
 * 32x14x14 3.83 / 2.63, 64x7x7 3.96 / 2.83; CIFAR's 16x32x32 6.45 / 4.71, 32x16x16 4.65 / 3.21,
 * 64x8x8 4.56 / 4.16 (a junk tile per row: 3 for 2), 64x4x4 2.62 / 1.57, 64x3x3 1.83 / 0.93, 64x2x2
 * 1.13 / 0.84, 16x6x6 0.42 / 0.31. F(4x4) does 36 multiplications and moves 36 transformed
 * values per 16 outputs where F(2x2) does 64; the price is ~10x F(2x2)'s rounding error (see
 * conv_winograd.c), still ~2e-5 of the outputs. Per-shape data for tests/bench/run_conv.sh's
 * "wino2" / "wino4" columns are in docs/benchmarks.md, "Winograd F(4x4, 3x3)".
 */
static int use_winograd4(const struct mge_cpu_conv *cv)
{
    pthread_once(&g_conv_once, conv_backend_init);
    if (g_winograd_tile)
        return g_winograd_tile == 4;
    (void)cv; /* no shape measured stays on F(2x2); the choice is per conv should one appear */
    return g_conv_winograd4;
}

static int conv_backend(int b, int bf16, const struct mge_cpu_conv *cv)
{
    if (b == MGE__CONV_AUTO) {
        pthread_once(&g_conv_once, conv_backend_init);
        b = g_conv_backend;
    }
    if (b == MGE__CONV_WINOGRAD) /* what Winograd does not do goes where "auto" sends it */
        b = MGE__CONV_AUTO;
    /* mixed precision: oneDNN's bf16 convolution (conv_bf16.c) where the CPU has the
     * instructions, else im2col over mge_cpu_gemm_bf16 (emulated); an explicit backend still
     * wins, but direct is fp32 only and hands a bf16 conv to im2col */
    if (b == MGE__CONV_AUTO && bf16)
        return mge_cpu_has_bf16() ? MGE__CONV_DNNL : MGE__CONV_IM2COL;
    if (b != MGE__CONV_AUTO)
        return b;
    if (cv && cv->C > MGE__CONV_DIRECT_MAX_C && cv->Q < MGE__CONV_DIRECT_MIN_Q &&
        !mge__conv_direct_is_narrow_ok(cv))
        return MGE__CONV_IM2COL;
    return MGE__CONV_DIRECT;
}

const char *mge_cpu_conv_backend(void)
{
    int b = conv_backend(MGE__CONV_AUTO, 0, NULL);
    if (g_conv_backend == MGE__CONV_WINOGRAD)
        return conv_names[MGE__CONV_WINOGRAD];
    return b == MGE__CONV_DIRECT && g_conv_backend == MGE__CONV_AUTO ? "auto" : conv_names[b];
}

static size_t scratch_bytes(int backend, int bf16, const struct mge_cpu_conv *cv)
{
    bf16 = is_bf16(bf16, cv);
    size_t fallback = im2col_scratch_bytes(cv), b = 0;
    int be = conv_backend(backend, bf16, cv);
    if (be == MGE__CONV_IM2COL && direct_for_data(backend, bf16, cv))
        be = MGE__CONV_DIRECT;
    switch (be) {
    case MGE__CONV_DNNL:
        b = bf16 ? mge__conv_bf16_scratch_bytes(cv) : mge__conv_dnnl_scratch_bytes(cv);
        break;
    case MGE__CONV_DIRECT:
        b = mge__conv_direct_scratch_bytes(cv);
        break;
    default:
        break;
    }
    if (use_winograd(backend, bf16, cv) && mge__conv_winograd_scratch_bytes(cv) > b)
        b = mge__conv_winograd_scratch_bytes(cv);
    if (use_winograd_dw(backend, bf16, cv) && mge__conv_winograd_dw_is_f4(cv) &&
        mge__conv_winograd4_dw_scratch_bytes(cv) > b)
        b = mge__conv_winograd4_dw_scratch_bytes(cv);
    if (use_stride2(backend, bf16, cv) && mge__conv_stride2_scratch_bytes(cv) > b)
        b = mge__conv_stride2_scratch_bytes(cv);
    return b > fallback ? b : fallback; /* room for the fallback too */
}

size_t mge__conv_scratch_bytes_with(int backend, const struct mge_cpu_conv *cv)
{
    return scratch_bytes(backend, 0, cv);
}

size_t mge_cpu_conv_scratch_bytes_bf16(const struct mge_cpu_conv *cv)
{
    return scratch_bytes(MGE__CONV_AUTO, 1, cv);
}

size_t mge_cpu_conv_scratch_bytes(const struct mge_cpu_conv *cv)
{
    return mge__conv_scratch_bytes_with(MGE__CONV_AUTO, cv);
}

static void forward_with(int backend, int bf16, const struct mge_cpu_conv *cv, float *out,
                         const float *inp, const float *w, const float *bias, void *scratch)
{
    bf16 = is_bf16(bf16, cv);
    if (use_winograd(backend, bf16, cv) &&
        mge__conv_winograd_forward(cv, use_winograd4(cv) ? 4 : 2, out, inp, w, bias, scratch) == 0)
        return;
    if (use_stride2(backend, bf16, cv) &&
        mge__conv_stride2_forward(cv, out, inp, w, bias, scratch) == 0)
        return;
    switch (conv_backend(backend, bf16, cv)) {
    case MGE__CONV_DNNL:
        if ((bf16 ? mge__conv_bf16_forward : mge__conv_dnnl_forward)(cv, out, inp, w, bias,
                                                                     scratch) == 0)
            return;
        break;
    case MGE__CONV_DIRECT: /* fp32 only: a bf16 conv goes to im2col, unless it stays fp32 */
        if (!bf16 && mge__conv_direct_forward(cv, out, inp, w, bias, scratch) == 0)
            return;
        break;
    default:
        if (direct_for_data(backend, bf16, cv) &&
            mge__conv_direct_forward(cv, out, inp, w, bias, scratch) == 0)
            return;
        break;
    }
    im2col_forward(bf16, cv, out, inp, w, bias, scratch);
}

void mge__cpu_conv2d_forward_with(int backend, const struct mge_cpu_conv *cv, float *out,
                                  const float *inp, const float *w, const float *bias,
                                  void *scratch)
{
    forward_with(backend, 0, cv, out, inp, w, bias, scratch);
}

static void backward_with(int backend, int bf16, const struct mge_cpu_conv *cv, float *dinp,
                          float *dw, float *dbias, const float *dout, const float *inp,
                          const float *w, void *scratch, int acc)
{
    bf16 = is_bf16(bf16, cv);
    if (bf16 && cv->stride > 1 && dw) {
        /* oneDNN 2.6's bf16 weight gradient of a strided conv ran 10-20x slower per FLOP than a
         * stride-1 one (ResNet-20 at batch 128: 100-200 ms a call), so a strided conv's dw is
         * fp32 over im2col, on every path alike; dx (and dbias) first, in bf16, which may keep
         * a temporary in scratch until it returns */
        backward_with(backend, bf16, cv, dinp, NULL, dbias, dout, inp, w, scratch, acc);
        im2col_backward(0, cv, NULL, dw, NULL, dout, inp, w, scratch, acc);
        return;
    }
    if (dw && use_winograd_dw(backend, bf16, cv) &&
        winograd_dw(cv, dw, dout, inp, scratch, acc) == 0) {
        /* dinp and dbias as they would be without dw (scratch is free again) */
        if (dinp || dbias)
            backward_with(backend, bf16, cv, dinp, NULL, dbias, dout, inp, w, scratch, acc);
        return;
    }
    if (dinp && use_winograd(backend, bf16, cv) &&
        mge__conv_winograd_backward_data(cv, use_winograd4(cv) ? 4 : 2, dinp, dout, w, scratch,
                                         acc) == 0) {
        /* dw and dbias as they would be without Winograd (scratch is free again) */
        if (dw || dbias)
            backward_with(backend, bf16, cv, NULL, dw, dbias, dout, inp, w, scratch, acc);
        return;
    }
    if (use_stride2(backend, bf16, cv) &&
        mge__conv_stride2_backward(cv, dinp, dw, dbias, dout, inp, w, scratch, acc) == 0)
        return;
    switch (conv_backend(backend, bf16, cv)) {
    case MGE__CONV_DNNL:
        if ((bf16 ? mge__conv_bf16_backward : mge__conv_dnnl_backward)(cv, dinp, dw, dbias, dout,
                                                                       inp, w, scratch, acc) == 0)
            return;
        break;
    case MGE__CONV_DIRECT:
        if (!bf16 &&
            mge__conv_direct_backward(cv, dinp, dw, dbias, dout, inp, w, scratch, acc) == 0)
            return;
        break;
    default:
        if (dinp && direct_for_data(backend, bf16, cv) &&
            mge__conv_direct_backward(cv, dinp, NULL, NULL, dout, inp, w, scratch, acc) == 0) {
            if (dw || dbias)
                im2col_backward(bf16, cv, NULL, dw, dbias, dout, inp, w, scratch, acc);
            return;
        }
        break;
    }
    im2col_backward(bf16, cv, dinp, dw, dbias, dout, inp, w, scratch, acc);
}

void mge__cpu_conv2d_backward_with(int backend, const struct mge_cpu_conv *cv, float *dinp,
                                   float *dw, float *dbias, const float *dout, const float *inp,
                                   const float *w, void *scratch, int acc)
{
    backward_with(backend, 0, cv, dinp, dw, dbias, dout, inp, w, scratch, acc);
}

void mge_cpu_conv2d_forward(const struct mge_cpu_conv *cv, float *out, const float *inp,
                            const float *w, const float *bias, void *scratch)
{
    mge__cpu_conv2d_forward_with(MGE__CONV_AUTO, cv, out, inp, w, bias, scratch);
}

void mge_cpu_conv2d_backward(const struct mge_cpu_conv *cv, float *dinp, float *dw, float *dbias,
                             const float *dout, const float *inp, const float *w, void *scratch,
                             int acc)
{
    mge__cpu_conv2d_backward_with(MGE__CONV_AUTO, cv, dinp, dw, dbias, dout, inp, w, scratch, acc);
}

void mge_cpu_conv2d_forward_bf16(const struct mge_cpu_conv *cv, float *out, const float *inp,
                                 const float *w, const float *bias, void *scratch)
{
    forward_with(MGE__CONV_AUTO, 1, cv, out, inp, w, bias, scratch);
}

void mge_cpu_conv2d_backward_bf16(const struct mge_cpu_conv *cv, float *dinp, float *dw,
                                  float *dbias, const float *dout, const float *inp, const float *w,
                                  void *scratch, int acc)
{
    backward_with(MGE__CONV_AUTO, 1, cv, dinp, dw, dbias, dout, inp, w, scratch, acc);
}
