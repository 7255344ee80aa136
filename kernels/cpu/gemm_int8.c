/*
 * gemm_int8.c: int8 quantisation kernels (cpu_quant.h): the quantisers and the u8 x s8 GEMM
 * with int32 sums, AVX-512 VNNI (vpdpbusd) when the CPU has it and a portable loop otherwise,
 * chosen at run time (the build never assumes the ISA: no -march=native).
 */
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "kernels/cpu/cpu_int.h"
#include "kernels/cpu/cpu_quant.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define HAVE_VNNI_BUILD 1
#else
#define HAVE_VNNI_BUILD 0
#endif

#define MR 4  /* rows of a tile */
#define NR 32 /* columns of a tile: two 16-column blocks */

/* ---- the CPU check ----------------------------------------------------------------------- */

static int g_has_vnni;
static int g_qconv_kernel; /* enum mge_cpu_qconv_kernel: tests force one */
static int g_has_vbmi;     /* vpermb: the convolution with output pixels as lanes */
static pthread_once_t g_vnni_once = PTHREAD_ONCE_INIT;

static void has_vnni_init(void)
{
    const char *s = getenv("MGE_CPU_VNNI");
    /* MGE_CPU_VNNI=off: behave as a CPU without the instructions (tests of the portable path) */
    if (s && (!strcmp(s, "off") || !strcmp(s, "0")))
        return;
    /* MGE_CPU_QCONV=pixels|channels: one int8 convolution kernel where it applies (benchmarks) */
    const char *k = getenv("MGE_CPU_QCONV");
    if (k && !strcmp(k, "pixels"))
        g_qconv_kernel = MGE_CPU_QCONV_PIXELS;
    else if (k && !strcmp(k, "channels"))
        g_qconv_kernel = MGE_CPU_QCONV_CHANNELS;
#if HAVE_VNNI_BUILD
    __builtin_cpu_init();
    g_has_vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl");
    g_has_vbmi = g_has_vnni && __builtin_cpu_supports("avx512vbmi");
#endif
}

static int g_vnni_off; /* mge_cpu_set_vnni(0) */

int mge_cpu_has_vnni(void)
{
    pthread_once(&g_vnni_once, has_vnni_init);
    return g_has_vnni && !g_vnni_off;
}

void mge_cpu_set_vnni(int on)
{
    g_vnni_off = !on;
}

/* ---- quantisers -------------------------------------------------------------------------- */

void mge_cpu_qaffine_from_range(float lo, float hi, struct mge_cpu_qaffine *q)
{
    if (!(lo < 0.0f)) /* NaN too */
        lo = 0.0f;
    if (!(hi > 0.0f))
        hi = 0.0f;
    float scale = (hi - lo) / 255.0f;
    if (!(scale > 1e-12f) || !isfinite(scale))
        scale = isfinite(scale) ? 1.0f : 3e38f / 255.0f;
    float z = nearbyintf(-lo / scale);
    q->scale = scale;
    q->inv = 1.0f / scale;
    q->zp = z < 0.0f ? 0 : z > 255.0f ? 255 : (int32_t)z;
    q->lo = (float)(0 - q->zp) * scale;
    q->hi = (float)(255 - q->zp) * scale;
}

MGE__CPU_CLONES
void mge_cpu_fake_quant_affine(float *y, const float *x, int64_t n, const struct mge_cpu_qaffine *q)
{
    const struct mge_cpu_qaffine p = *q;
    for (int64_t i = 0; i < n; i++)
        y[i] = (float)(mge_cpu_quant_u8(x[i], &p) - p.zp) * p.scale;
}

MGE__CPU_CLONES
void mge_cpu_fake_quant_affine_backward(float *dx, const float *dy, const float *x, int64_t n,
                                        const struct mge_cpu_qaffine *q, int acc)
{
    /* inside: the rounded code lies in [0, 255]; the same test as the forward clamp */
    const struct mge_cpu_qaffine p = *q;
    for (int64_t i = 0; i < n; i++) {
        float r = nearbyintf(x[i] * p.inv) + (float)p.zp;
        float g = (r >= 0.0f && r <= 255.0f) ? dy[i] : 0.0f;
        dx[i] = acc ? dx[i] + g : g;
    }
}

#if HAVE_VNNI_BUILD
/*
 * mge_cpu_quant_u8() 16 at a time, to the same codes with fewer operations: x * inv (one
 * rounding); min(512, .), which keeps a NaN (vminps returns its second operand when either is
 * NaN); conversion rounding to nearest even (what nearbyintf does in the default mode), where a
 * NaN, -inf or anything below -2^31 becomes INT_MIN; + zp. Each such value, and anything the
 * scalar clamps to -512, lies below 0 (zp <= 255), and anything it clamps to 512 at or above
 * 255, so clamping the sum to [0, 255] (or a saturating pack) gives the scalar's code.
 * Returns the unclamped sums (one per dword).
 */
__attribute__((target("avx512f,avx512bw"), always_inline)) static inline __m512i
codes16_raw(__m512 x, const struct mge_cpu_qaffine *p)
{
    __m512 r = _mm512_min_ps(_mm512_set1_ps(512.0f), _mm512_mul_ps(x, _mm512_set1_ps(p->inv)));
    return _mm512_add_epi32(
        _mm512_cvt_roundps_epi32(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
        _mm512_set1_epi32(p->zp));
}

/* The codes (one per dword, in [0, 255]) of the 16 values of @x. */
__attribute__((target("avx512f,avx512bw"), always_inline)) static inline __m512i
codes16_ps(__m512 x, const struct mge_cpu_qaffine *p)
{
    return _mm512_min_epi32(_mm512_max_epi32(codes16_raw(x, p), _mm512_setzero_si512()),
                            _mm512_set1_epi32(255));
}

/* The codes of 16 values of @x loaded under mask @k. */
__attribute__((target("avx512f,avx512bw"), always_inline)) static inline __m512i
codes16(const float *x, __mmask16 k, const struct mge_cpu_qaffine *p)
{
    return codes16_ps(_mm512_maskz_loadu_ps(k, x), p);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"))) static int64_t
quantize_row_avx512(uint8_t *o, const float *x, int64_t n, const struct mge_cpu_qaffine *p)
{
    uint8_t lows[64];
    for (int i = 0; i < 64; i++)
        lows[i] = (uint8_t)(4 * (i % 16)); /* byte i of the result: the low byte of dword i */
    const __m512i low = _mm512_loadu_si512((const void *)lows);
    for (int64_t i = 0; i < n; i += 16) {
        /* the tail under a mask: rows as short as a feature map's (14, 28) stay vectorised */
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512i v = codes16(x + i, k, p);
        /* narrowed by vpermb in a register, then stored: vpmovdb to memory (what the compiler
         * makes of a narrowing store) stalls on Zen 4 */
        __m512i b = _mm512_permutexvar_epi8(low, v);
        _mm_mask_storeu_epi8(o + i, k, _mm512_castsi512_si128(b));
    }
    return n;
}
#endif

#if HAVE_VNNI_BUILD
/* 4 channels' rows (@x, @x + @cs, ...; @c of them real) -> (W, 4) interleaved codes, @n pixels. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
quantize_quad_avx512(uint8_t *o, const float *x, int64_t cs, int c, int64_t n,
                     const struct mge_cpu_qaffine *p)
{
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512i out = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            /* a channel past C: the code of 0 (its weights are 0 anyway) */
            __m512i v = j < c ? codes16(x + j * cs + i, k, p) : _mm512_set1_epi32(p->zp);
            out = _mm512_or_si512(out, _mm512_slli_epi32(v, 8 * j));
        }
        _mm512_mask_storeu_epi32(o + 4 * i, k, out);
    }
}
#endif

void mge_cpu_quantize_u8_padded_quads(uint8_t *out, const float *x, int64_t C, int64_t H, int64_t W,
                                      int pad, const struct mge_cpu_qaffine *q)
{
    const struct mge_cpu_qaffine p = *q;
    const int64_t Hp = H + 2 * pad, Wp = W + 2 * pad, C4 = (C + 3) / 4;
    int wide = HAVE_VNNI_BUILD && mge_cpu_has_vnni();
    memset(out, p.zp, (size_t)(C4 * Hp * Wp * 4)); /* the border: the code of 0 */
    for (int64_t c4 = 0; c4 < C4; c4++) {
        int c = C - 4 * c4 < 4 ? (int)(C - 4 * c4) : 4;
        for (int64_t h = 0; h < H; h++) {
            uint8_t *o = out + ((c4 * Hp + pad + h) * Wp + pad) * 4;
            const float *xr = x + (4 * c4 * H + h) * W;
#if HAVE_VNNI_BUILD
            if (wide) {
                quantize_quad_avx512(o, xr, H * W, c, W, &p);
                continue;
            }
#endif
            for (int64_t i = 0; i < W; i++)
                for (int j = 0; j < c; j++)
                    o[4 * i + j] = (uint8_t)mge_cpu_quant_u8(xr[j * H * W + i], &p);
        }
    }
}

/* @n codes of @x into @o, vectorised when @wide. */
static void quantize_row(uint8_t *o, const float *x, int64_t n, const struct mge_cpu_qaffine *p,
                         int wide)
{
    int64_t i = 0;
#if HAVE_VNNI_BUILD
    if (wide)
        i = quantize_row_avx512(o, x, n, p);
#else
    (void)wide;
#endif
    for (; i < n; i++)
        o[i] = (uint8_t)mge_cpu_quant_u8(x[i], p);
}

void mge_cpu_quantize_u8_padded(uint8_t *out, const float *x, int64_t C, int64_t H, int64_t W,
                                int pad, const struct mge_cpu_qaffine *q)
{
    const struct mge_cpu_qaffine p = *q;
    const int64_t Hp = H + 2 * pad, Wp = W + 2 * pad;
    int wide = HAVE_VNNI_BUILD && mge_cpu_has_vnni() && g_has_vbmi;
    memset(out, p.zp, (size_t)(C * Hp * Wp)); /* the border: the code of 0 */
    for (int64_t c = 0; c < C; c++)
        for (int64_t h = 0; h < H; h++)
            quantize_row(out + (c * Hp + pad + h) * Wp + pad, x + (c * H + h) * W, W, &p, wide);
}

void mge_cpu_quantize_u8(uint8_t *out, int64_t ldq, const float *x, int64_t ldx, int64_t rows,
                         int64_t cols, const struct mge_cpu_qaffine *q)
{
    const struct mge_cpu_qaffine p = *q;
    int wide = HAVE_VNNI_BUILD && mge_cpu_has_vnni() && g_has_vbmi;
    for (int64_t r = 0; r < rows; r++) {
        quantize_row(out + r * ldq, x + r * ldx, cols, &p, wide);
        for (int64_t c = cols; c < ldq; c++)
            out[r * ldq + c] = 0;
    }
}

void mge_cpu_qweight_scales(float *scale, float *inv, const float *w, int64_t N, int64_t K)
{
    for (int64_t n = 0; n < N; n++) {
        float amax = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            float a = fabsf(w[n * K + k]);
            amax = a > amax ? a : amax;
        }
        float s = amax / (float)MGE_CPU_QW_MAX;
        if (!(s > 1e-30f) || !isfinite(s))
            s = 1.0f;
        scale[n] = s;
        inv[n] = 1.0f / s;
    }
}

void mge_cpu_fake_quant_weight(float *y, const float *w, int64_t N, int64_t K)
{
    for (int64_t n = 0; n < N; n++) {
        float s, inv;
        mge_cpu_qweight_scales(&s, &inv, w + n * K, 1, K);
        for (int64_t k = 0; k < K; k++)
            y[n * K + k] = (float)mge_cpu_quant_s8(w[n * K + k], inv) * s;
    }
}

int mge_cpu_qweight_pack(struct mge_cpu_qweight *qw, const float *w, int N, int K)
{
    memset(qw, 0, sizeof(*qw));
    if (N < 1 || K < 1)
        return MGE_ERR(MGE_INVAL, "int8 weights: shape (%d, %d)", N, K);
    int Np = (N + 15) / 16 * 16, Kp = (K + 3) / 4 * 4;
    float *inv = mge_malloc(sizeof(float) * (size_t)N);
    qw->packed = mge_malloc_aligned((size_t)Np * (size_t)Kp);
    qw->colsum = mge_malloc(sizeof(int32_t) * (size_t)N);
    qw->scale = mge_malloc(sizeof(float) * (size_t)N);
    if (!inv || !qw->packed || !qw->colsum || !qw->scale) {
        mge_free(inv);
        mge_cpu_qweight_fini(qw);
        return MGE_ERR(MGE_NOMEM, "cannot allocate int8 weights (%d, %d)", N, K);
    }
    qw->N = N;
    qw->K = K;
    qw->Np = Np;
    qw->Kp = Kp;
    memset(qw->packed, 0, (size_t)Np * (size_t)Kp);
    mge_cpu_qweight_scales(qw->scale, inv, w, N, K);
    int KQ = Kp / 4;
    for (int n = 0; n < N; n++) {
        int32_t sum = 0;
        int8_t *blk = qw->packed + (size_t)(n / 16) * (size_t)KQ * 64 + (size_t)(n % 16) * 4;
        for (int k = 0; k < K; k++) {
            int32_t c = mge_cpu_quant_s8(w[(size_t)n * (size_t)K + (size_t)k], inv[n]);
            blk[(size_t)(k / 4) * 64 + (size_t)(k % 4)] = (int8_t)c;
            sum += c;
        }
        qw->colsum[n] = sum;
    }
    mge_free(inv);
    return MGE_OK;
}

int mge_cpu_qweight_pack_conv(struct mge_cpu_qweight *qw, const float *w, int N, int C, int R,
                              int S, int layout)
{
    int T = R * S, S4 = (S + 3) / 4 * 4, C4 = (C + 3) / 4;
    int K = layout == MGE_CPU_QCONV_CHANS  ? C4 * 4 * T
            : layout == MGE_CPU_QCONV_TAPS ? C * ((T + 3) / 4 * 4)
                                           : C * R * S4;
    float *wp = mge_calloc((size_t)N * (size_t)K, sizeof(float));
    if (!wp)
        return MGE_ERR(MGE_NOMEM, "cannot allocate int8 conv weights");
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int t = 0; t < T; t++) {
                int k = layout == MGE_CPU_QCONV_CHANS  ? ((c / 4) * T + t) * 4 + c % 4
                        : layout == MGE_CPU_QCONV_TAPS ? c * ((T + 3) / 4 * 4) + t
                                                       : (c * R + t / S) * S4 + t % S;
                wp[(size_t)n * (size_t)K + (size_t)k] =
                    w[((size_t)n * (size_t)C + (size_t)c) * (size_t)T + (size_t)t];
            }
    int rc = mge_cpu_qweight_pack(qw, wp, N, K);
    mge_free(wp);
    qw->layout = layout;
    return rc;
}

/* The byte of tap @j of quad @qi (of a group: a channel, or 4 channels) from the group's first
 * code; -1: a padding tap (zero weight). */
static int quad_tap(const struct mge_cpu_qconv_shape *sh, int layout, int qi, int j)
{
    if (layout == MGE_CPU_QCONV_CHANS) /* quad (r, s): 4 channels of one pixel */
        return 4 * (qi / sh->S * sh->Wp + qi % sh->S) + j;
    if (layout == MGE_CPU_QCONV_TAPS) {
        int t = 4 * qi + j;
        return t < sh->R * sh->S ? t / sh->S * sh->Wp + t % sh->S : -1;
    }
    int per = (sh->S + 3) / 4, r = qi / per, s = 4 * (qi % per) + j; /* past S: zero weights */
    return r * sh->Wp + s;
}

int mge_cpu_qconv_quads(const struct mge_cpu_qconv_shape *sh, int layout)
{
    return layout == MGE_CPU_QCONV_CHANS  ? sh->R * sh->S
           : layout == MGE_CPU_QCONV_TAPS ? (sh->R * sh->S + 3) / 4
                                          : sh->R * ((sh->S + 3) / 4);
}

/* Groups of quads: input channels, or 4 of them. */
static int quad_groups(const struct mge_cpu_qconv_shape *sh, int layout)
{
    return layout == MGE_CPU_QCONV_CHANS ? (sh->C + 3) / 4 : sh->C;
}

/* Bytes per pixel position in the codes of @layout. */
static int pixel_bytes(int layout)
{
    return layout == MGE_CPU_QCONV_CHANS ? 4 : 1;
}

/* Bytes a pixel vector's loads span in @layout: 15 strides plus the widest quad. */
static int quads_window(const struct mge_cpu_qconv_shape *sh, int layout)
{
    int wide = 0;
    for (int qi = 0; qi < mge_cpu_qconv_quads(sh, layout); qi++) {
        int o0 = quad_tap(sh, layout, qi, 0);
        for (int j = 1; j < 4; j++) {
            int o = quad_tap(sh, layout, qi, j);
            wide = o - o0 > wide ? o - o0 : wide;
        }
    }
    return 15 * sh->stride * pixel_bytes(layout) + wide + 1;
}

/* Whether the pixel-lane kernel reads @layout here (two 64-byte loads at most). */
static int pixels_can(const struct mge_cpu_qconv_shape *sh, int layout)
{
    return mge_cpu_has_vnni() && g_has_vbmi && sh->stride >= 1 && sh->stride <= 4 &&
           quads_window(sh, layout) <= 128;
}

int mge_cpu_qconv_layout(const struct mge_cpu_qconv_shape *sh)
{
    /* the fewest k slots (R S C real ones) among what runs here; rows on a tie */
    int best = MGE_CPU_QCONV_ROWS;
    int64_t slots = (int64_t)quad_groups(sh, best) * mge_cpu_qconv_quads(sh, best);
    for (int l = MGE_CPU_QCONV_TAPS; l <= MGE_CPU_QCONV_CHANS; l++) {
        int64_t k = (int64_t)quad_groups(sh, l) * mge_cpu_qconv_quads(sh, l);
        if (k < slots && pixels_can(sh, l)) {
            best = l;
            slots = k;
        }
    }
    return best;
}

void mge_cpu_qconv_tables(const struct mge_cpu_qconv_shape *sh, int layout, int64_t *roff,
                          int32_t *koff, uint8_t *idx)
{
    int qpc = mge_cpu_qconv_quads(sh, layout), pb = pixel_bytes(layout);
    int64_t plane = (int64_t)sh->Hp * sh->Wp * pb;
    for (int p = 0; p < sh->P; p++)
        for (int q = 0; q < sh->Q; q++)
            roff[p * sh->Q + q] = ((int64_t)p * sh->Wp + q) * sh->stride * pb;
    for (int qi = 0; qi < qpc; qi++) {
        int o0 = quad_tap(sh, layout, qi, 0);
        for (int c = 0; c < quad_groups(sh, layout); c++)
            koff[c * qpc + qi] = (int32_t)(c * plane + o0);
        /* byte 4 l + j of a pixel vector: lane l's tap j, from the load at lane 0's first tap */
        for (int i = 0; i < 64; i++) {
            int o = quad_tap(sh, layout, qi, i % 4);
            idx[qi * 64 + i] = (uint8_t)(sh->stride * pb * (i / 4) + (o < 0 ? 0 : o - o0));
        }
    }
}

void mge_cpu_qweight_fini(struct mge_cpu_qweight *qw)
{
    mge_free_aligned(qw->packed);
    mge_free(qw->colsum);
    mge_free(qw->scale);
    memset(qw, 0, sizeof(*qw));
}

/* ---- the GEMM ---------------------------------------------------------------------------- */

struct gemm_args {
    const struct mge_cpu_qweight *qw;
    const uint8_t *a;
    int64_t lda;
    const int64_t *roff; /* (M) row m of A at a + roff[m], or NULL: a + m * lda */
    const int32_t *koff; /* (Kp / 4) k-quad q of a row at + koff[q], or NULL: + 4 q */
    const uint8_t *idx;  /* convolutions: (qpc, 64) vpermb index of each quad of a channel */
    int qpc;             /* quads per input channel */
    int32_t zp;
    float sx;                           /* the activations' scale */
    const float *bias;                  /* (N) or NULL */
    const float *pmul, *padd;           /* (N) or NULL: the convolution's y * pmul[n] + padd[n] */
    const float *res;                   /* like y, or NULL: the convolution's y + res */
    const struct mge_cpu_qcodes *codes; /* (n_codes) codes wanted (the VNNI kernels) */
    int n_codes;
    int skip_y; /* with codes: y not written */
    int P, Q;   /* the convolution's output map */
    int relu;
    float *y;
    int64_t rs, cs;
};

/* The epilogue of one output: the same float operations, in the same order, on both paths. */
static inline float epilogue(const struct gemm_args *g, int32_t acc, int n)
{
    float v = (float)(acc - g->zp * g->qw->colsum[n]) * (g->sx * g->qw->scale[n]);
    if (g->bias)
        v += g->bias[n];
    if (g->relu)
        v = v > 0.0f ? v : 0.0f;
    return v;
}

static inline const uint8_t *a_row(const struct gemm_args *g, int m)
{
    return g->a + (g->roff ? g->roff[m] : (int64_t)m * g->lda);
}

/* One tile: rows [m0, m0 + mr), columns [n0, n0 + nr) (nr 16 or 32), portable. */
MGE__CPU_CLONES static void tile_portable(const struct gemm_args *g, int m0, int mr, int n0, int nr)
{
    const struct mge_cpu_qweight *qw = g->qw;
    int KQ = qw->Kp / 4;
    int32_t acc[MR][NR];
    memset(acc, 0, sizeof(acc));
    for (int b = 0; b < nr / 16; b++) {
        const int8_t *bp = qw->packed + (size_t)((n0 / 16) + b) * (size_t)KQ * 64;
        for (int r = 0; r < mr; r++) {
            const uint8_t *ar = a_row(g, m0 + r);
            int32_t *ac = acc[r] + b * 16;
            for (int kq = 0; kq < KQ; kq++) {
                const int8_t *bk = bp + (size_t)kq * 64;
                const uint8_t *ak = ar + (g->koff ? g->koff[kq] : kq * 4);
                for (int j = 0; j < 16; j++)
                    ac[j] += (int32_t)ak[0] * bk[j * 4] + (int32_t)ak[1] * bk[j * 4 + 1] +
                             (int32_t)ak[2] * bk[j * 4 + 2] + (int32_t)ak[3] * bk[j * 4 + 3];
            }
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr && n0 + j < qw->N; j++)
            g->y[(int64_t)(m0 + r) * g->rs + (int64_t)(n0 + j) * g->cs] =
                epilogue(g, acc[r][j], n0 + j);
}

#if HAVE_VNNI_BUILD
/* Rows m0.. (@mr of them) of 16 columns from @n0 through the epilogue (its per-column
 * constants loaded once), stored along rows (cs 1), else through a small buffer (the
 * convolution's NCHW output, where a column's rows are contiguous; a scatter was slower). */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
store_rows16(const struct gemm_args *g, const __m512i *acc, int m0, int mr, int n0)
{
    const struct mge_cpu_qweight *qw = g->qw;
    int left = qw->N - n0;
    __mmask16 k = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
    __m512i zsum =
        _mm512_mullo_epi32(_mm512_set1_epi32(g->zp), _mm512_maskz_loadu_epi32(k, qw->colsum + n0));
    __m512 comb = _mm512_mul_ps(_mm512_set1_ps(g->sx), _mm512_maskz_loadu_ps(k, qw->scale + n0));
    __m512 bias = g->bias ? _mm512_maskz_loadu_ps(k, g->bias + n0) : _mm512_setzero_ps();
    float t[MR][16];
    for (int r = 0; r < mr; r++) {
        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r], zsum)), comb);
        if (g->bias) /* the portable epilogue adds only when there is a bias: so do we */
            f = _mm512_add_ps(f, bias);
        if (g->relu)
            f = _mm512_max_ps(f, _mm512_setzero_ps());
        if (g->cs == 1)
            _mm512_mask_storeu_ps(g->y + (int64_t)(m0 + r) * g->rs + n0, k, f);
        else
            _mm512_storeu_ps(t[r], f);
    }
    if (g->cs == 1)
        return;
    for (int j = 0; j < 16 && j < left; j++) {
        float *dst = g->y + (int64_t)(n0 + j) * g->cs + (int64_t)m0 * g->rs;
        for (int r = 0; r < mr; r++)
            dst[(int64_t)r * g->rs] = t[r][j];
    }
}

/* One tile with vpdpbusd: 4 rows x 32 columns in 8 accumulators; rows past @mr repeat row 0. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
tile_vnni(const struct gemm_args *g, int m0, int mr, int n0, int nr)
{
    const struct mge_cpu_qweight *qw = g->qw;
    int KQ = qw->Kp / 4;
    const uint8_t *a0 = a_row(g, m0);
    const uint8_t *a1 = mr > 1 ? a_row(g, m0 + 1) : a0, *a2 = mr > 2 ? a_row(g, m0 + 2) : a0;
    const uint8_t *a3 = mr > 3 ? a_row(g, m0 + 3) : a0;
    const int32_t *ko = g->koff;
    const int8_t *b0 = qw->packed + (size_t)(n0 / 16) * (size_t)KQ * 64;
    __m512i c00 = _mm512_setzero_si512(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
            c30 = c00, c31 = c00;
    if (nr == 32) {
        const int8_t *b1 = b0 + (size_t)KQ * 64;
        for (int kq = 0; kq < KQ; kq++) {
            __m512i w0 = _mm512_load_si512((const void *)(b0 + (size_t)kq * 64));
            __m512i w1 = _mm512_load_si512((const void *)(b1 + (size_t)kq * 64));
            int32_t v0, v1, v2, v3;
            int64_t o = ko ? ko[kq] : kq * 4;
            memcpy(&v0, a0 + o, 4);
            memcpy(&v1, a1 + o, 4);
            memcpy(&v2, a2 + o, 4);
            memcpy(&v3, a3 + o, 4);
            __m512i x0 = _mm512_set1_epi32(v0), x1 = _mm512_set1_epi32(v1);
            __m512i x2 = _mm512_set1_epi32(v2), x3 = _mm512_set1_epi32(v3);
            c00 = _mm512_dpbusd_epi32(c00, x0, w0);
            c01 = _mm512_dpbusd_epi32(c01, x0, w1);
            c10 = _mm512_dpbusd_epi32(c10, x1, w0);
            c11 = _mm512_dpbusd_epi32(c11, x1, w1);
            c20 = _mm512_dpbusd_epi32(c20, x2, w0);
            c21 = _mm512_dpbusd_epi32(c21, x2, w1);
            c30 = _mm512_dpbusd_epi32(c30, x3, w0);
            c31 = _mm512_dpbusd_epi32(c31, x3, w1);
        }
    } else {
        for (int kq = 0; kq < KQ; kq++) {
            __m512i w0 = _mm512_load_si512((const void *)(b0 + (size_t)kq * 64));
            int32_t v0, v1, v2, v3;
            int64_t o = ko ? ko[kq] : kq * 4;
            memcpy(&v0, a0 + o, 4);
            memcpy(&v1, a1 + o, 4);
            memcpy(&v2, a2 + o, 4);
            memcpy(&v3, a3 + o, 4);
            c00 = _mm512_dpbusd_epi32(c00, _mm512_set1_epi32(v0), w0);
            c10 = _mm512_dpbusd_epi32(c10, _mm512_set1_epi32(v1), w0);
            c20 = _mm512_dpbusd_epi32(c20, _mm512_set1_epi32(v2), w0);
            c30 = _mm512_dpbusd_epi32(c30, _mm512_set1_epi32(v3), w0);
        }
    }
    __m512i lo[MR] = {c00, c10, c20, c30}, hi[MR] = {c01, c11, c21, c31};
    store_rows16(g, lo, m0, mr, n0);
    if (nr == 32 && n0 + 16 < qw->N)
        store_rows16(g, hi, m0, mr, n0 + 16);
}
#else
static void tile_vnni(const struct gemm_args *g, int m0, int mr, int n0, int nr)
{
    tile_portable(g, m0, mr, n0, nr);
}
#endif

static void gemm_run(const struct gemm_args *g, int M, int threads)
{
    const struct mge_cpu_qweight *qw = g->qw;
    int vnni = mge_cpu_has_vnni();
    int mt = (M + MR - 1) / MR, nt = (qw->Np + NR - 1) / NR;
    int64_t tiles = (int64_t)mt * nt;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t t = 0; t < tiles; t++) {
        int tn = (int)(t / mt), tm = (int)(t % mt);
        int m0 = tm * MR, n0 = tn * NR;
        int mr = M - m0 < MR ? M - m0 : MR, nr = qw->Np - n0 < NR ? qw->Np - n0 : NR;
        if (vnni)
            tile_vnni(g, m0, mr, n0, nr);
        else
            tile_portable(g, m0, mr, n0, nr);
    }
}

#if HAVE_VNNI_BUILD
/* Where the code of channel @n at output pixel (@p, @q) of a @P x @Q map goes in @c. */
static inline int64_t code_at(const struct mge_cpu_qcodes *c, int P, int Q, int n, int64_t p,
                              int64_t q)
{
    int64_t Hp = P + 2 * c->pad, Wp = Q + 2 * c->pad;
    if (!c->quads)
        return ((int64_t)n * Hp + p + c->pad) * Wp + q + c->pad;
    return (((int64_t)(n / 4) * Hp + p + c->pad) * Wp + q + c->pad) * 4 + n % 4;
}

/* vpermb indices that reorder codes_pack4()'s bytes: into 16 pixels' channel quads (byte 4 i + j:
 * channel j of pixel i), and into 4 channels' planes (byte 16 j + i). */
static const uint8_t pack_quads[64] __attribute__((aligned(64))) = {
    0,  4,  8,  12, 1,  5,  9,  13, 2,  6,  10, 14, 3,  7,  11, 15, 16, 20, 24, 28, 17, 21,
    25, 29, 18, 22, 26, 30, 19, 23, 27, 31, 32, 36, 40, 44, 33, 37, 41, 45, 34, 38, 42, 46,
    35, 39, 43, 47, 48, 52, 56, 60, 49, 53, 57, 61, 50, 54, 58, 62, 51, 55, 59, 63,
};
static const uint8_t pack_planes[64] __attribute__((aligned(64))) = {
    0,  1,  2,  3,  16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51, 4,  5,  6,  7,  20, 21,
    22, 23, 36, 37, 38, 39, 52, 53, 54, 55, 8,  9,  10, 11, 24, 25, 26, 27, 40, 41, 42, 43,
    56, 57, 58, 59, 12, 13, 14, 15, 28, 29, 30, 31, 44, 45, 46, 47, 60, 61, 62, 63,
};

/*
 * The codes of 16 pixels of channels @f[0..@nc) (@nc <= 4; the rest get the zero point's code)
 * under @p, in [0, 255] by the saturating packs: byte 16 L + 4 j + i is channel j's pixel
 * 4 L + i (the order of vpackssdw and vpackuswb, which work within 128-bit lanes).
 */
__attribute__((target("avx512f,avx512bw"), always_inline)) static inline __m512i
codes_pack4(const __m512 *f, int nc, const struct mge_cpu_qaffine *p)
{
    __m512i c[4];
    for (int t = 0; t < 4; t++)
        c[t] = t < nc ? codes16_raw(f[t], p) : _mm512_set1_epi32(p->zp);
    return _mm512_packus_epi16(_mm512_packs_epi32(c[0], c[1]), _mm512_packs_epi32(c[2], c[3]));
}

/*
 * The codes of @nc channels from @n (at most 8; @n a multiple of 4 with channel quads) of the
 * output pixels in lanes @valid of @f (a pixel vector's lanes: the first from pixel (@p, @q) on,
 * each row's neighbours in neighbouring lanes, the next row's from a later lane),
 * into @c: one masked store per run and per channel (planes) or per 4 channels (channel quads,
 * whose codes are one dword a pixel; channels past N get the zero point's code, as the
 * quantiser's).
 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"), always_inline)) static inline void
put_codes(const struct gemm_args *g, const struct mge_cpu_qcodes *c, const __m512 *f, int n, int nc,
          int64_t p, int64_t q, __mmask16 valid)
{
    __m512i v[8];
    int groups = c->quads ? (nc + 3) / 4 : nc;
    for (int j = 0; j < groups; j++) {
        if (!c->quads) {
            v[j] = codes16_ps(f[j], c->qc);
            continue;
        }
        v[j] = _mm512_permutexvar_epi8(_mm512_load_si512((const void *)pack_quads),
                                       codes_pack4(f + 4 * j, nc - 4 * j, c->qc));
    }
    for (unsigned left = valid; left; p++, q = 0) {
        /* a run ends at a lane off the map or at the row's end (rows without padding) */
        int l = __builtin_ctz(left), run = __builtin_ctz(~(left >> l));
        run = g->Q - q < run ? (int)(g->Q - q) : run;
        __mmask16 k = (__mmask16)((1u << run) - 1u), lanes = (__mmask16)(k << l);
        left &= ~(unsigned)lanes;
        for (int j = 0; j < groups; j++) {
            __m512i r = l ? _mm512_maskz_compress_epi32(lanes, v[j]) : v[j];
            if (c->quads)
                _mm512_mask_storeu_epi32(c->codes + code_at(c, g->P, g->Q, n + 4 * j, p, q), k, r);
            else
                _mm_mask_storeu_epi8(c->codes + code_at(c, g->P, g->Q, n + j, p, q), k,
                                     _mm512_cvtepi32_epi8(r));
        }
    }
}

/* A channel's constants of the pixel-lane epilogue, broadcast once for its vectors. */
struct chan_epi {
    __m512 comb, bias, mul, add; /* sx scale[n]; bias[n], pmul[n], padd[n] where there are */
};

__attribute__((target("avx512f"), always_inline)) static inline struct chan_epi
chan_epi_at(const struct gemm_args *g, int n)
{
    struct chan_epi e;
    e.comb = _mm512_set1_ps(g->sx * g->qw->scale[n]);
    e.bias = _mm512_set1_ps(g->bias ? g->bias[n] : 0.0f);
    e.mul = _mm512_set1_ps(g->pmul ? g->pmul[n] : 0.0f);
    e.add = _mm512_set1_ps(g->pmul ? g->padd[n] : 0.0f);
    return e;
}

/*
 * The epilogue of 16 output pixels of channel @ce (lanes of @acc, whose sums started at
 * -zp colsum[n]: the GEMM's acc - zp colsum[n]), stored from y + @at: the
 * float operations of the GEMM's epilogue and then post_ops()'s; lanes outside @valid (the
 * padded columns of the virtual grid) are squeezed out, so the valid ones land contiguously.
 * Returns the values: squeezed (lanes 0..), or with @grid in their lanes, the others 0.
 */
__attribute__((target("avx512f,avx512bw"), always_inline)) static inline __m512
store_pixels16(const struct gemm_args *g, __m512i acc, const struct chan_epi *ce, __mmask16 valid,
               int64_t at, const int grid)
{
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), ce->comb);
    if (g->bias)
        f = _mm512_add_ps(f, ce->bias);
    if (g->pmul)
        f = _mm512_add_ps(_mm512_mul_ps(f, ce->mul), ce->add);
    __mmask16 k = (__mmask16)((1u << __builtin_popcount(valid)) - 1u);
    if (!grid && valid != 0xffff)
        f = _mm512_maskz_compress_ps(valid, f);
    /* in the grid's lanes the residual is spread out to them instead: the same sums */
    if (g->res && grid)
        f = _mm512_add_ps(f, _mm512_maskz_expand_ps(valid, _mm512_maskz_loadu_ps(k, g->res + at)));
    else if (g->res)
        f = _mm512_add_ps(f, _mm512_maskz_loadu_ps(k, g->res + at));
    if (g->relu)
        f = _mm512_max_ps(f, _mm512_setzero_ps());
    if (!g->skip_y)
        _mm512_mask_storeu_ps(g->y + at, k,
                              grid && valid != 0xffff ? _mm512_maskz_compress_ps(valid, f) : f);
    return grid ? _mm512_maskz_mov_ps(valid, f) : f;
}

/*
 * put_codes() for a consumer whose padded grid is the producer's (stride 1, the same padding):
 * the 16 lanes of the pixel vector at virtual position @m (values in their lanes, 0 off the
 * map) are 16 neighbouring codes there, the lanes off the map its border (0's code: the zero
 * point), so one store per channel or channel quad; lanes past the map's last pixel (@end) are
 * not stored.
 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi"), always_inline)) static inline void
put_codes_grid(const struct gemm_args *g, const struct mge_cpu_qcodes *c, const __m512 *f, int n,
               int nc, int64_t m, int64_t end)
{
    const int64_t Wp = g->Q + 2 * c->pad, plane = (g->P + 2 * c->pad) * Wp;
    const int64_t at = m + c->pad * Wp + c->pad;
    __mmask16 k = end - m >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (end - m)) - 1u);
    if (!c->quads) {
        const __m512i order = _mm512_load_si512((const void *)pack_planes);
        for (int j = 0; j < nc; j += 4) {
            __m512i b = _mm512_permutexvar_epi8(order, codes_pack4(f + j, nc - j, c->qc));
            uint8_t *o = c->codes + (int64_t)(n + j) * plane + at;
            _mm_mask_storeu_epi8(o, k, _mm512_castsi512_si128(b));
            if (nc - j > 1)
                _mm_mask_storeu_epi8(o + plane, k, _mm512_extracti32x4_epi32(b, 1));
            if (nc - j > 2)
                _mm_mask_storeu_epi8(o + 2 * plane, k, _mm512_extracti32x4_epi32(b, 2));
            if (nc - j > 3)
                _mm_mask_storeu_epi8(o + 3 * plane, k, _mm512_extracti32x4_epi32(b, 3));
        }
        return;
    }
    const __m512i order = _mm512_load_si512((const void *)pack_quads);
    for (int j = 0; 4 * j < nc; j++)
        _mm512_mask_storeu_epi32(
            c->codes + ((int64_t)(n / 4 + j) * plane + at) * 4, k,
            _mm512_permutexvar_epi8(order, codes_pack4(f + 4 * j, nc - 4 * j, c->qc)));
}

/*
 * Where the 16 lanes of pixel vector @v of a convolution with stride @s read and write: the
 * offset of lane 0's first tap in the padded codes (lane l's at + @s l), the lanes that are real
 * pixels, and the dense output index of the first of them (the real lanes' outputs are
 * neighbours). Stride 1: vectors run over the padded image's positions (P rows of Wp, the last
 * S - 1 of each not real pixels), so no lane is lost at a row's end; else over segments of up to
 * 16 pixels of one output row.
 */
struct pixel_vec {
    int64_t base, dense;
    int64_t p, q; /* the first real lane's output pixel */
    __mmask16 valid;
};

static struct pixel_vec pixel_vec_at(int64_t v, int s, int P, int Q, int Wp)
{
    struct pixel_vec pv = {0, 0, 0, 0, 0};
    if (s == 1) {
        int64_t m = 16 * v, end = (int64_t)(P - 1) * Wp + Q, p = m / Wp, q = m % Wp;
        unsigned mask = 0;
        pv.base = m;
        pv.dense = p * Q + (q < Q ? q : Q);
        pv.p = q < Q ? p : p + 1;
        pv.q = q < Q ? q : 0;
        /* runs of real pixels, then the row's padded columns */
        for (int64_t l = 0, left = end - m < 16 ? end - m : 16; l < left;) {
            int64_t run = q < Q ? Q - q : Wp - q;
            run = run < left - l ? run : left - l;
            if (q < Q)
                mask |= ((1u << run) - 1u) << l;
            l += run;
            q = q + run == Wp ? 0 : q + run;
        }
        pv.valid = (__mmask16)mask;
        return pv;
    }
    int segs = (Q + 15) / 16;
    int64_t p = v / segs, q0 = v % segs * 16;
    if (p >= P)
        return pv;
    int n = Q - q0 < 16 ? (int)(Q - q0) : 16;
    pv.base = p * s * Wp + q0 * s;
    pv.dense = p * Q + q0;
    pv.p = p;
    pv.q = q0;
    pv.valid = (__mmask16)((1u << n) - 1u);
    return pv;
}

#define CB 8 /* output channels per block of the pixel-lane convolution */

/* Lane l's quad of a pixel vector whose load starts at @x: see conv_pixels_vnni(). */
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512vbmi"),
               always_inline)) static inline __m512i
load_pixels(const uint8_t *x, int mode, __m512i idx, __mmask64 win, __mmask64 win2)
{
    if (mode == 0) /* channel quads at stride 1: the lanes' quads are 64 bytes in a row */
        return _mm512_loadu_si512((const void *)x);
    if (mode == 1)
        return _mm512_permutexvar_epi8(idx, _mm512_maskz_loadu_epi8(win, x));
    return _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)x), idx,
                                    _mm512_maskz_loadu_epi8(win2, x + 64));
}

/*
 * A convolution with output pixels as the lanes (stride <= 4): lane l's k-quad lies at + s l
 * pixels from the vector's base, so the 16 lanes' quads are one load of @wbytes (<= 64; else two)
 * spread by vpermb (vpermt2b) with the quad's index; 3 pixel vectors x CB channels of sums in 24
 * accumulators, weights broadcast. Each channel's 16 sums are neighbouring pixels of the NCHW
 * output: stored whole. @pb: bytes per pixel position of the codes.
 */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi"))) static void
conv_pixels_vnni(const struct gemm_args *g, const struct mge_cpu_qconv_shape *sh, int wbytes,
                 int pb)
{
    /* a local copy: the epilogue's stores may alias *g as far as the compiler knows, so it
     * reloaded every field after each (the stem's epilogue-bound time) */
    const struct gemm_args gl = *g;
    g = &gl;
    const struct mge_cpu_qweight *qw = g->qw;
    const int KQ = qw->Kp / 4, N = qw->N, s = sh->stride, P = sh->P, Q = sh->Q, Wp = sh->Wp;
    const int64_t PQ = (int64_t)P * Q;
    const int64_t end = (int64_t)(P - 1) * Wp + Q; /* stride 1: past the last pixel's position */
    const int64_t nvec = s == 1 ? (end + 15) / 16 : P * ((Q + 15) / 16);
    const __mmask64 win = wbytes >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << wbytes) - 1;
    const __mmask64 win2 = wbytes <= 64    ? 0
                           : wbytes >= 128 ? ~(__mmask64)0
                                           : ((__mmask64)1 << (wbytes - 64)) - 1;
    /* 0: every index the identity (plain loads), 1: one load, 2: two loads */
    int mode = wbytes > 64 ? 2 : 1;
    if (wbytes == 64) {
        /* a quad at a time: a byte loop here cost 2% of ResNet-8's whole int8 inference */
        static const uint8_t ident[64] = {
            0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
            22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43,
            44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};
        mode = 0;
        for (int qi = 0; mode == 0 && qi < g->qpc; qi++)
            mode = memcmp(g->idx + 64 * qi, ident, 64) ? 1 : 0;
    }
    for (int64_t v = 0; v < nvec; v += 3) {
        struct pixel_vec e0 = pixel_vec_at(v, s, P, Q, Wp), e1 = pixel_vec_at(v + 1, s, P, Q, Wp);
        struct pixel_vec e2 = pixel_vec_at(v + 2, s, P, Q, Wp);
        if (!e1.valid) /* past the last vector: read what is known to be there */
            e1.base = e0.base;
        if (!e2.valid)
            e2.base = e0.base;
        const int64_t b0 = e0.base * pb, b1 = e1.base * pb, b2 = e2.base * pb;
        for (int n0 = 0; n0 < N; n0 += CB) {
            /* named accumulators: an array indexed after the loop was kept on the stack */
            /* the sums start at -zp colsum[n]: the epilogue's subtraction, exact in int32 */
            const int nc = N - n0 < CB ? N - n0 : CB;
            int32_t z[CB];
            for (int j = 0; j < CB; j++)
                z[j] = j < nc ? -g->zp * qw->colsum[n0 + j] : 0;
            __m512i p0 = _mm512_set1_epi32(z[0]), p1 = _mm512_set1_epi32(z[1]),
                    p2 = _mm512_set1_epi32(z[2]), p3 = _mm512_set1_epi32(z[3]),
                    p4 = _mm512_set1_epi32(z[4]), p5 = _mm512_set1_epi32(z[5]),
                    p6 = _mm512_set1_epi32(z[6]), p7 = _mm512_set1_epi32(z[7]), q0 = p0, q1 = p1,
                    q2 = p2, q3 = p3, q4 = p4, q5 = p5, q6 = p6, q7 = p7, r0 = p0, r1 = p1, r2 = p2,
                    r3 = p3, r4 = p4, r5 = p5, r6 = p6, r7 = p7;
            const int8_t *wb = qw->packed + (size_t)(n0 / 16) * (size_t)KQ * 64 + (n0 % 16) * 4;
            /* the sums over every k-quad; R(j) adds the third vector's (or nothing: the last
             * group of a map whose vectors do not come in threes, ResNet-8's 14x14: 14) */
#define PIXEL_SUMS(R)                                                                              \
    for (int kq = 0, qi = 0; kq < KQ; kq++, qi = qi + 1 == g->qpc ? 0 : qi + 1) {                  \
        const uint8_t *x = g->a + g->koff[kq];                                                     \
        const __m512i idx = _mm512_load_si512((const void *)(g->idx + 64 * qi));                   \
        const __m512i x0 = load_pixels(x + b0, mode, idx, win, win2);                              \
        const __m512i x1 = load_pixels(x + b1, mode, idx, win, win2);                              \
        const __m512i x2 = load_pixels(x + b2, mode, idx, win, win2);                              \
        const int8_t *w = wb + (size_t)kq * 64;                                                    \
        DP(0, R);                                                                                  \
        DP(1, R);                                                                                  \
        DP(2, R);                                                                                  \
        DP(3, R);                                                                                  \
        DP(4, R);                                                                                  \
        DP(5, R);                                                                                  \
        DP(6, R);                                                                                  \
        DP(7, R);                                                                                  \
        (void)x2;                                                                                  \
    }
#define DP(j, R)                                                                                   \
    do {                                                                                           \
        int32_t wj;                                                                                \
        memcpy(&wj, w + 4 * (j), 4);                                                               \
        const __m512i wv = _mm512_set1_epi32(wj);                                                  \
        p##j = _mm512_dpbusd_epi32(p##j, x0, wv);                                                  \
        q##j = _mm512_dpbusd_epi32(q##j, x1, wv);                                                  \
        R(j);                                                                                      \
    } while (0)
#define R3(j) (r##j = _mm512_dpbusd_epi32(r##j, x2, wv))
#define R2(j) ((void)0)
            if (e2.valid) {
                PIXEL_SUMS(R3)
            } else {
                PIXEL_SUMS(R2)
            }
#undef R2
#undef R3
#undef DP
#undef PIXEL_SUMS
            __m512i a0[CB] = {p0, p1, p2, p3, p4, p5, p6, p7};
            __m512i a1[CB] = {q0, q1, q2, q3, q4, q5, q6, q7};
            __m512i a2[CB] = {r0, r1, r2, r3, r4, r5, r6, r7};
            if (!g->n_codes) {
                for (int j = 0; j < nc; j++) {
                    const struct chan_epi ce = chan_epi_at(g, n0 + j);
                    int64_t yn = (int64_t)(n0 + j) * PQ;
                    if (e0.valid)
                        store_pixels16(g, a0[j], &ce, e0.valid, yn + e0.dense, 0);
                    if (e1.valid)
                        store_pixels16(g, a1[j], &ce, e1.valid, yn + e1.dense, 0);
                    if (e2.valid)
                        store_pixels16(g, a2[j], &ce, e2.valid, yn + e2.dense, 0);
                }
                continue;
            }
            /* the values kept for the consumers' codes, in their grid lanes */
            __m512 f0[CB], f1[CB], f2[CB];
            for (int j = 0; j < nc; j++) {
                const struct chan_epi ce = chan_epi_at(g, n0 + j);
                int64_t yn = (int64_t)(n0 + j) * PQ;
                if (e0.valid)
                    f0[j] = store_pixels16(g, a0[j], &ce, e0.valid, yn + e0.dense, 1);
                if (e1.valid)
                    f1[j] = store_pixels16(g, a1[j], &ce, e1.valid, yn + e1.dense, 1);
                if (e2.valid)
                    f2[j] = store_pixels16(g, a2[j], &ce, e2.valid, yn + e2.dense, 1);
            }
            for (int t = 0; t < g->n_codes; t++) {
                const struct mge_cpu_qcodes *c = &g->codes[t];
                if (s == 1 && Q + 2 * c->pad == Wp && P + 2 * c->pad == sh->Hp) {
                    if (e0.valid)
                        put_codes_grid(g, c, f0, n0, nc, e0.base, end);
                    if (e1.valid)
                        put_codes_grid(g, c, f1, n0, nc, e1.base, end);
                    if (e2.valid)
                        put_codes_grid(g, c, f2, n0, nc, e2.base, end);
                    continue;
                }
                const struct pixel_vec *es[3] = {&e0, &e1, &e2};
                const __m512 *fs[3] = {f0, f1, f2};
                for (int i = 0; i < 3; i++)
                    if (es[i]->valid)
                        put_codes(g, c, fs[i], n0, nc, es[i]->p, es[i]->q, es[i]->valid);
            }
        }
    }
}

/* The epilogue's constants of the 16 channels from @n (lanes past N: 0), and in @zneg the
 * sums' start, -zp colsum[n + l]. */
__attribute__((target("avx512f"), always_inline)) static inline struct chan_epi
chan_epi_lanes(const struct gemm_args *g, int n, __m512i *zneg)
{
    int left = g->qw->N - n;
    __mmask16 k = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
    struct chan_epi e;
    *zneg = _mm512_mullo_epi32(_mm512_set1_epi32(-g->zp),
                               _mm512_maskz_loadu_epi32(k, g->qw->colsum + n));
    e.comb = _mm512_mul_ps(_mm512_set1_ps(g->sx), _mm512_maskz_loadu_ps(k, g->qw->scale + n));
    e.bias = g->bias ? _mm512_maskz_loadu_ps(k, g->bias + n) : _mm512_setzero_ps();
    e.mul = g->pmul ? _mm512_maskz_loadu_ps(k, g->pmul + n) : _mm512_setzero_ps();
    e.add = g->pmul ? _mm512_maskz_loadu_ps(k, g->padd + n) : _mm512_setzero_ps();
    return e;
}

/*
 * The epilogue of channel-lane tile vector @acc (16 channels from @n of pixel @m, constants @ce,
 * sums started at -zp colsum): the float operations of store_pixels16(), in the same order,
 * scattered into the NCHW output (a pixel's channels lie @PQ apart). @lanes: l PQ in lane l.
 */
__attribute__((target("avx512f,avx512bw"), always_inline)) static inline void
store_chans16(const struct gemm_args *g, __m512i acc, const struct chan_epi *ce, int n, int64_t m,
              int64_t PQ, __m512i lanes)
{
    int left = g->qw->N - n;
    __mmask16 k = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), ce->comb);
    if (g->bias)
        f = _mm512_add_ps(f, ce->bias);
    if (g->pmul)
        f = _mm512_add_ps(_mm512_mul_ps(f, ce->mul), ce->add);
    __m512i at = _mm512_add_epi32(lanes, _mm512_set1_epi32((int32_t)(n * PQ + m)));
    if (g->res)
        f = _mm512_add_ps(f, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), k, at, g->res, 4));
    if (g->relu)
        f = _mm512_max_ps(f, _mm512_setzero_ps());
    for (int t = 0; t < g->n_codes; t++) {
        const struct mge_cpu_qcodes *c = &g->codes[t];
        uint8_t b[16];
        _mm_storeu_si128((__m128i *)(void *)b, _mm512_cvtepi32_epi8(codes16_ps(f, c->qc)));
        int64_t p = m / g->Q, q = m % g->Q;
        if (c->quads) /* n is a multiple of 16: 4 whole quads of channels */
            for (int j = 0; j < left && j < 16; j += 4)
                memcpy(c->codes + code_at(c, g->P, g->Q, n + j, p, q), b + j, 4);
        else
            for (int j = 0; j < left && j < 16; j++)
                c->codes[code_at(c, g->P, g->Q, n + j, p, q)] = b[j];
    }
    if (!g->skip_y)
        _mm512_mask_i32scatter_ps(g->y, k, at, f, 4);
}

#define CPX 7 /* pixels per tile of the channel-lane convolution */
#define CNB 2 /* 16-channel blocks per tile of it (CPX CNB accumulators) */

/*
 * The channel-lane convolution: 16 output channels per vector and a pixel's k-quad (4
 * contiguous codes: channel quads or a filter row's taps) broadcast, so a map's size wastes no
 * lanes (a 7x7 map at stride 2 fills 7 of the pixel kernel's 16). Tiles of CPX pixels x CNB
 * blocks of 16 channels in 14 named accumulators (7 x 2: ResNet's 7x7 and 14x14 maps and 32 or
 * 64 channels fill every lane; 6 x 4 left 5 of 54 pixel slots of a 7x7 map empty); pixels past
 * the map's end repeat the tile's first (unstored), blocks past Np / 16 repeat the last
 * (unstored).
 */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
conv_chans_vnni(const struct gemm_args *g, int64_t PQ)
{
    const struct mge_cpu_qweight *qw = g->qw;
    const int KQ = qw->Kp / 4, blocks = qw->Np / 16;
    const __m512i lanes =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                           _mm512_set1_epi32((int32_t)PQ));
    _Static_assert(CPX == 7 && CNB == 2, "the accumulators below are named for 7 x 2");
    for (int nb0 = 0; nb0 < blocks; nb0 += CNB) {
        const int8_t *w0 = qw->packed + (size_t)nb0 * (size_t)KQ * 64;
        const int8_t *w1 = nb0 + 1 < blocks ? w0 + (size_t)KQ * 64 : w0;
        /* the blocks' epilogue constants once for all pixels; blocks past the last unstored */
        struct chan_epi ce[CNB];
        __m512i z[CNB];
        for (int j = 0; j < CNB; j++)
            ce[j] = chan_epi_lanes(g, (nb0 + j < blocks ? nb0 + j : nb0) * 16, &z[j]);
        for (int64_t m0 = 0; m0 < PQ; m0 += CPX) {
            int mp = PQ - m0 < CPX ? (int)(PQ - m0) : CPX;
            const uint8_t *x0 = g->a + g->roff[m0];
            const uint8_t *x1 = mp > 1 ? g->a + g->roff[m0 + 1] : x0;
            const uint8_t *x2 = mp > 2 ? g->a + g->roff[m0 + 2] : x0;
            const uint8_t *x3 = mp > 3 ? g->a + g->roff[m0 + 3] : x0;
            const uint8_t *x4 = mp > 4 ? g->a + g->roff[m0 + 4] : x0;
            const uint8_t *x5 = mp > 5 ? g->a + g->roff[m0 + 5] : x0;
            const uint8_t *x6 = mp > 6 ? g->a + g->roff[m0 + 6] : x0;
            __m512i a00 = z[0], a01 = z[1], a10 = a00, a11 = a01, a20 = a00, a21 = a01, a30 = a00,
                    a31 = a01, a40 = a00, a41 = a01, a50 = a00, a51 = a01, a60 = a00, a61 = a01;
            for (int kq = 0; kq < KQ; kq++) {
                const int64_t o = g->koff[kq], wo = (int64_t)kq * 64;
                const __m512i v0 = _mm512_load_si512((const void *)(w0 + wo));
                const __m512i v1 = _mm512_load_si512((const void *)(w1 + wo));
#define DP2(i)                                                                                     \
    do {                                                                                           \
        int32_t xi;                                                                                \
        memcpy(&xi, x##i + o, 4);                                                                  \
        const __m512i b = _mm512_set1_epi32(xi);                                                   \
        a##i##0 = _mm512_dpbusd_epi32(a##i##0, b, v0);                                             \
        a##i##1 = _mm512_dpbusd_epi32(a##i##1, b, v1);                                             \
    } while (0)
                DP2(0);
                DP2(1);
                DP2(2);
                DP2(3);
                DP2(4);
                DP2(5);
                DP2(6);
#undef DP2
            }
            const __m512i acc[CPX][CNB] = {{a00, a01}, {a10, a11}, {a20, a21}, {a30, a31},
                                           {a40, a41}, {a50, a51}, {a60, a61}};
            for (int j = 0; j < CNB && nb0 + j < blocks; j++)
                for (int i = 0; i < mp; i++)
                    store_chans16(g, acc[i][j], &ce[j], (nb0 + j) * 16, m0 + i, PQ, lanes);
        }
    }
}

/*
 * Whether the channel-lane convolution uses more of its lanes than the pixel-lane one on @sh
 * (the pixel kernel: vectors of 16 pixels x 8 channels, the last group of them two or three;
 * small maps and strided rows leave lanes empty), by a margin that pays for its scattered stores,
 * on a convolution with arithmetic enough to matter (at least 32 k-quads: else the epilogue is the
 * cost, and scattered stores and gathered residuals lose to the pixel kernel's contiguous ones;
 * ResNet-8's 1x1 shortcut with 8 k-quads ran 25% slower on channel lanes).
 */
void mge_cpu_qconv_force(int kernel)
{
    g_qconv_kernel = kernel;
}

static int chans_better(const struct mge_cpu_qconv_shape *sh, int layout, int N, int KQ)
{
    if (layout == MGE_CPU_QCONV_TAPS || !mge_cpu_has_vnni() ||
        g_qconv_kernel == MGE_CPU_QCONV_PIXELS)
        return 0;
    if (!pixels_can(sh, layout) || g_qconv_kernel == MGE_CPU_QCONV_CHANNELS)
        return 1;
    if (KQ < 32)
        return 0;
    const int64_t P = sh->P, Q = sh->Q, PQ = P * Q;
    int64_t nvec = sh->stride == 1 ? ((P - 1) * sh->Wp + Q + 15) / 16 : P * ((Q + 15) / 16);
    double pix = (double)PQ / (double)(nvec * 16) * N / ((N + CB - 1) / CB * CB);
    double chn = (double)PQ / (double)((PQ + CPX - 1) / CPX * CPX) * N /
                 ((N + 16 * CNB - 1) / (16 * CNB) * 16 * CNB);
    return chn > 1.15 * pix;
}
#endif

/* Both entry points: A addressed by @lda, or by @roff/@koff when they are not NULL. */
static void gemm(const struct mge_cpu_qweight *qw, int M, const uint8_t *a, int64_t lda,
                 const int64_t *roff, const int32_t *koff, const struct mge_cpu_qaffine *qx,
                 const float *bias, int relu, float *y, int64_t rs, int64_t cs, int threads)
{
    struct gemm_args g = {.qw = qw,
                          .a = a,
                          .lda = lda,
                          .roff = roff,
                          .koff = koff,
                          .zp = qx->zp,
                          .sx = qx->scale,
                          .bias = bias,
                          .relu = relu,
                          .y = y,
                          .rs = rs,
                          .cs = cs};
    if (M > 0)
        gemm_run(&g, M, threads);
}

void mge_cpu_gemm_u8s8(const struct mge_cpu_qweight *qw, int M, const uint8_t *a, int64_t lda,
                       const struct mge_cpu_qaffine *qx, const float *bias, int relu, float *y,
                       int64_t rs, int64_t cs)
{
    int64_t work = (int64_t)M * qw->Np * qw->Kp;
    gemm(qw, M, a, lda, NULL, NULL, qx, bias, relu, y, rs, cs,
         work >= (1 << 20) ? mge_cpu_threads() : 1);
}

void mge_cpu_gemm_u8s8_gather(const struct mge_cpu_qweight *qw, int M, const uint8_t *a,
                              const int64_t *roff, const int32_t *koff,
                              const struct mge_cpu_qaffine *qx, const float *bias, int relu,
                              float *y, int64_t rs, int64_t cs)
{
    gemm(qw, M, a, 0, roff, koff, qx, bias, relu, y, rs, cs, 1);
}

/* A convolution's operations after the GEMM's epilogue, over its output @y (N, @PQ): the same
 * float operations as store_pixels16()'s, in the same order. */
static void post_ops(float *y, int N, int64_t PQ, const struct mge_cpu_qpost *post, int relu)
{
    for (int n = 0; n < N; n++)
        for (int64_t i = 0; i < PQ; i++) {
            float v = y[n * PQ + i];
            if (post->mul)
                v = v * post->mul[n] + post->add[n];
            if (post->res)
                v += post->res[n * PQ + i];
            if (relu)
                v = v > 0.0f ? v : 0.0f;
            y[n * PQ + i] = v;
        }
}

/* Any quad layout, portable: each output through the GEMM's epilogue (with @relu). */
static void conv_portable(const struct gemm_args *g, int64_t PQ, int relu)
{
    const struct mge_cpu_qweight *qw = g->qw;
    int KQ = qw->Kp / 4;
    struct gemm_args e = *g;
    e.relu = relu;
    for (int n = 0; n < qw->N; n++) {
        const int8_t *wn = qw->packed + (size_t)(n / 16) * (size_t)KQ * 64 + (size_t)(n % 16) * 4;
        for (int64_t m = 0; m < PQ; m++) {
            int32_t acc = 0;
            for (int kq = 0; kq < KQ; kq++) {
                const uint8_t *x = g->a + g->roff[m] + g->koff[kq];
                const uint8_t *ix = g->idx + 64 * (kq % g->qpc); /* lane 0's taps */
                for (int j = 0; j < 4; j++)
                    acc += (int32_t)x[ix[j]] * wn[(size_t)kq * 64 + (size_t)j];
            }
            g->y[(int64_t)n * PQ + m] = epilogue(&e, acc, n);
        }
    }
}

/* Bytes of @c's codes for @N channels of a @P x @Q map (without the slack). */
static int64_t codes_bytes(const struct mge_cpu_qcodes *c, int N, int P, int Q)
{
    return (int64_t)(c->quads ? (N + 3) / 4 * 4 : N) * (P + 2 * c->pad) * (Q + 2 * c->pad);
}

/* What the kernels' epilogues do not write of @c: the border (the zero point's code) and the
 * slack (0). Their stores cover every interior code, channels past N of a quad included. */
static void codes_border(const struct mge_cpu_qcodes *c, int N, int P, int Q)
{
    const int pb = c->quads ? 4 : 1, planes = c->quads ? (N + 3) / 4 : N, pad = c->pad;
    const int64_t Wp = (int64_t)(Q + 2 * pad) * pb, plane = Wp * (P + 2 * pad);
    const uint8_t zp = (uint8_t)c->qc->zp;
    for (int i = 0; i < planes && pad > 0; i++) {
        uint8_t *o = c->codes + i * plane;
        memset(o, zp, (size_t)(pad * Wp));
        /* a few bytes each side of a row: plain stores (a memset call a row cost 3%) */
        const uint32_t quad = 0x01010101u * zp;
        for (int64_t r = pad; r < pad + P; r++)
            for (int k = 0; k < pad; k++) {
                uint8_t *l = o + r * Wp + k * pb, *rt = o + r * Wp + Wp - (k + 1) * pb;
                if (pb == 4) {
                    memcpy(l, &quad, 4);
                    memcpy(rt, &quad, 4);
                } else {
                    *l = zp;
                    *rt = zp;
                }
            }
        memset(o + (pad + P) * Wp, zp, (size_t)(pad * Wp));
    }
    memset(c->codes + codes_bytes(c, N, P, Q), 0, 128);
}

void mge_cpu_qconv(const struct mge_cpu_qweight *qw, const struct mge_cpu_qconv_shape *sh,
                   const uint8_t *a, const int64_t *roff, const int32_t *koff, const uint8_t *idx,
                   const struct mge_cpu_qaffine *qx, const float *bias,
                   const struct mge_cpu_qpost *post, int relu, float *y)
{
    int64_t PQ = (int64_t)sh->P * sh->Q;
    int has_post = post && (post->mul || post->res);
    struct gemm_args g = {.qw = qw,
                          .a = a,
                          .roff = roff,
                          .koff = koff,
                          .idx = idx,
                          .qpc = mge_cpu_qconv_quads(sh, qw->layout),
                          .zp = qx->zp,
                          .sx = qx->scale,
                          .bias = bias,
                          .pmul = has_post ? post->mul : NULL,
                          .padd = has_post ? post->add : NULL,
                          .res = has_post ? post->res : NULL,
                          .P = sh->P,
                          .Q = sh->Q,
                          .relu = relu,
                          .y = y};
    struct mge_cpu_qcodes next[MGE_CPU_QNEXT];
    int n_next = 0;
    for (int t = 0; post && t < MGE_CPU_QNEXT; t++)
        if (post->next[t].codes)
            next[n_next++] = post->next[t];
#if HAVE_VNNI_BUILD
    /* a channel block's weights are 4-byte groups of one 16-channel block: CB divides 16 */
    _Static_assert(16 % CB == 0, "a channel block within one packed block");
    int chans = chans_better(sh, qw->layout, qw->N, qw->Kp / 4);
    if (chans || pixels_can(sh, qw->layout)) {
        for (int t = 0; t < n_next; t++)
            codes_border(&next[t], qw->N, sh->P, sh->Q);
        g.codes = next;
        g.n_codes = n_next;
        g.skip_y = n_next && post->skip_y;
        if (chans)
            conv_chans_vnni(&g, PQ);
        else
            conv_pixels_vnni(&g, sh, quads_window(sh, qw->layout), pixel_bytes(qw->layout));
        return;
    }
#endif
    if (qw->layout != MGE_CPU_QCONV_ROWS)
        conv_portable(&g, PQ, relu && !has_post);
    else
        mge_cpu_gemm_u8s8_gather(qw, (int)PQ, a, roff, koff, qx, bias, relu && !has_post, y, 1, PQ);
    if (has_post)
        post_ops(y, qw->N, PQ, post, relu);
    /* the portable paths write y whole, then code it as the consumers would */
    for (int t = 0; t < n_next; t++) {
        const struct mge_cpu_qcodes *c = &next[t];
        if (c->quads)
            mge_cpu_quantize_u8_padded_quads(c->codes, y, qw->N, sh->P, sh->Q, c->pad, c->qc);
        else
            mge_cpu_quantize_u8_padded(c->codes, y, qw->N, sh->P, sh->Q, c->pad, c->qc);
        memset(c->codes + codes_bytes(c, qw->N, sh->P, sh->Q), 0, 128);
    }
}
