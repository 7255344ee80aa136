/*
 * conv_stride2.c: direct stride-2 convolution (ResNet's downsampling 3x3 convs and 1x1
 * shortcuts), forward, data gradient and weight gradient, called by conv.c for "auto".
 *
 * Phase split: each padded input image is split into its four (row, column) parity planes,
 * xph[c][a][b][i][j] = xpad[c][2i + a][2j + b], of Hh x Wh. Tap (r, s) of output (p, q) then
 * reads plane (r & 1, s & 1) at (p + r / 2, q + s / 2): a stride-1 access, so output positions
 * run along vector lanes with each plane flattened into one long row (output (p, q) at p Wh + q,
 * one junk column per row, as conv_direct.c's flat kernels) and every tap is one unaligned load.
 * Only the R x S real taps are computed (a plain space-to-depth rewrite as a 2x2 stride-1 conv
 * would compute 16 taps for 9).
 *
 * The data gradient splits the same way on the other side: padded-input position (2i + a,
 * 2j + b) receives exactly the taps with r & 1 == a and s & 1 == b (for 3x3: 1, 2, 2 and 4 taps
 * for the four phases, 9 in all), from dout at (i - r / 2, j - s / 2). Each phase is a small
 * stride-1 conv of dout (padded by one row and column in front) whose outputs are scattered to
 * every second row and column of dinp.
 *
 * The weight gradient keeps one 16-lane accumulator per (k, c, tap) per thread and sums the lanes
 * once per call, as conv_direct.c's flat dw does. Images are spread over threads; each thread's
 * dw partial sums its images in order and the partials are added in thread order, so results
 * depend on the thread count only, never on timing; forward and dinp are per image and do not.
 */
#include <omp.h>
#include <string.h>

#include "kernels/cpu/conv_tile_int.h"

#define S2_KB 8   /* output channels per tile */
#define S2_QB 3   /* vectors per tile */
#define S2_MAXR 3 /* the widest kernel taken */
#define S2_TAPS 9 /* S2_MAXR squared */
#define S2_DWT 3  /* taps per dw block (S2_KB x S2_DWT accumulators) */

struct s2 {
    int C, H, W, K, R, S, P, Q, pad;
    int Hh, Wh; /* phase planes of the padded input */
    int Wd;     /* dinp: row length of dout padded by one in front (and of the phase outputs) */
    int Kp, Cp; /* K, C rounded up to S2_KB */
    size_t LWf; /* forward wide output plane: P * Wh rounded up to vectors */
    size_t LWd; /* dinp wide phase output plane: Hh * Wd rounded up to vectors */
    size_t PL;  /* floats per input phase plane (loads of junk outputs run past Hh * Wh) */
    size_t PLd; /* floats per padded dout plane */
    int nt;     /* forward taps (R * S) */
    int off[S2_TAPS];                     /* forward: tap offsets from a channel's four planes */
    int dnt[4], doff[4][S2_TAPS / 2 + 2]; /* dinp: per phase, taps and their offsets */
    int dtap[4][S2_TAPS / 2 + 2];         /* ... and which (r * S + s) each is */
    int slots;
    /* float offsets in scratch: packed forward weights, packed dinp weights (phases in order),
     * then per slot (stride @slot): phase planes, dout wide (dw), dout padded (dinp), wide
     * outputs, dw partial (K, C, taps, V), dbias partial */
    size_t wf, wd, slot0, slot, xph, dyw, dyp, wo, dw, db, total;
};

static size_t s2_up(size_t n)
{
    return (n + V - 1) / V * V;
}

static int s2_init(struct s2 *s, const struct mge_cpu_conv *cv)
{
    if (cv->stride != 2 || cv->R > S2_MAXR || cv->S > S2_MAXR || cv->pad > cv->R - 1 ||
        cv->pad > cv->S - 1)
        return -1;
    memset(s, 0, sizeof(*s));
    s->C = cv->C, s->H = cv->H, s->W = cv->W, s->K = cv->K, s->R = cv->R, s->S = cv->S;
    s->P = cv->P, s->Q = cv->Q, s->pad = cv->pad;
    s->Hh = (cv->H + 2 * cv->pad + 1) / 2;
    s->Wh = (cv->W + 2 * cv->pad + 1) / 2;
    s->Wd = s->Wh + 1;
    s->Kp = (cv->K + S2_KB - 1) / S2_KB * S2_KB;
    s->Cp = (cv->C + S2_KB - 1) / S2_KB * S2_KB;
    s->LWf = s2_up((size_t)s->P * s->Wh);
    s->LWd = s2_up((size_t)s->Hh * s->Wd);
    s->PL = s2_up(s->LWf + (size_t)s->Wh + 1 > (size_t)s->Hh * s->Wh ? s->LWf + (size_t)s->Wh + 1
                                                                     : (size_t)s->Hh * s->Wh);
    s->PLd = s2_up(s->LWd + (size_t)s->Wd + 1);
    s->nt = cv->R * cv->S;
    for (int r = 0; r < cv->R; r++)
        for (int c = 0; c < cv->S; c++) {
            int t = r * cv->S + c, ph = (r & 1) * 2 + (c & 1);
            s->off[t] = (int)((size_t)ph * s->PL) + (r / 2) * s->Wh + c / 2;
            int n = s->dnt[ph]++;
            /* padded-input row 2i + (r & 1) takes dout row i - r / 2: padded row i + 1 - r / 2 */
            s->doff[ph][n] = (1 - r / 2) * s->Wd + 1 - c / 2;
            s->dtap[ph][n] = t;
        }
    s->slots = cv->slots > 0 ? cv->slots : 1;
    size_t taps = (size_t)s->nt;
    s->wf = 0;
    s->wd = s2_up((size_t)s->Kp * s->C * taps);
    s->slot0 = s->wd + s2_up((size_t)s->Cp * s->K * taps);
    s->xph = 0;
    s->dyw = s->xph + (size_t)s->C * 4 * s->PL;
    s->dyp = s->dyw + (size_t)s->Kp * s->LWf;
    s->wo = s->dyp + (size_t)s->K * s->PLd;
    size_t wof = (size_t)s->Kp * s->LWf, wod = (size_t)s->Cp * s->LWd;
    s->dw = s->wo + (wof > wod ? wof : wod);
    s->db = s->dw + (size_t)s->K * s->C * taps * V;
    s->slot = s->db + s2_up((size_t)s->K);
    s->total = s->slot0 + (size_t)s->slots * s->slot;
    return 0;
}

size_t mge__conv_stride2_scratch_bytes(const struct mge_cpu_conv *cv)
{
    struct s2 s;
    return s2_init(&s, cv) == 0 ? s.total * sizeof(float) + 64 : 0;
}

/*
 * One register tile: S2_KB channels at QB vectors of wide positions, the sum over input
 * channels ci and taps t of x[ci * cs + off[t] + j * V] * wk[(ci * nt + t) * S2_KB + kk],
 * stored (not added) at o[kk * ostride + j * V], starting from bias[kk] (NULL: 0).
 */
static inline __attribute__((always_inline)) void s2_tile(const int QB, const float *x, size_t cs,
                                                          int CI, int nt, const int *off,
                                                          const float *wk, float *o, size_t ostride,
                                                          const float *bias)
{
    vf a[S2_KB][S2_QB];
#pragma GCC unroll 8
    for (int kk = 0; kk < S2_KB; kk++)
#pragma GCC unroll 3
        for (int j = 0; j < QB; j++)
            a[kk][j] = (vf){0} + (bias ? bias[kk] : 0.0f);
    for (int ci = 0; ci < CI; ci++) {
        const float *xc = x + (size_t)ci * cs;
        const float *wc = wk + (size_t)ci * nt * S2_KB;
        for (int t = 0; t < nt; t++) {
            vf xv[S2_QB];
#pragma GCC unroll 3
            for (int j = 0; j < QB; j++)
                xv[j] = ld(xc + off[t] + j * V);
            const float *wv = wc + (size_t)t * S2_KB;
#pragma GCC unroll 8
            for (int kk = 0; kk < S2_KB; kk++)
#pragma GCC unroll 3
                for (int j = 0; j < QB; j++)
                    a[kk][j] += xv[j] * wv[kk];
        }
    }
#pragma GCC unroll 8
    for (int kk = 0; kk < S2_KB; kk++)
#pragma GCC unroll 3
        for (int j = 0; j < QB; j++) {
            vf v = a[kk][j];
            memcpy(o + kk * ostride + j * V, &v, sizeof(v));
        }
}

/* wo (blocks of S2_KB channels, LW each) = the tiles over [0, LW) of every channel block */
MGE__CPU_CLONES
static void s2_wide(size_t LW, int nblk, const float *x, size_t cs, int CI, int nt, const int *off,
                    const float *wp, float *wo, const float *bias, int K)
{
    for (int kb = 0; kb < nblk; kb++) {
        const float *wk = wp + (size_t)kb * CI * nt * S2_KB;
        float bb[S2_KB];
        for (int kk = 0; kk < S2_KB; kk++)
            bb[kk] = bias && kb * S2_KB + kk < K ? bias[kb * S2_KB + kk] : 0.0f;
        float *o = wo + (size_t)kb * S2_KB * LW;
        for (size_t i0 = 0; i0 < LW; i0 += S2_QB * V) {
            size_t left = (LW - i0) / V;
            if (left >= 3)
                s2_tile(3, x + i0, cs, CI, nt, off, wk, o + i0, LW, bias ? bb : NULL);
            else if (left == 2)
                s2_tile(2, x + i0, cs, CI, nt, off, wk, o + i0, LW, bias ? bb : NULL);
            else
                s2_tile(1, x + i0, cs, CI, nt, off, wk, o + i0, LW, bias ? bb : NULL);
        }
    }
}

/*
 * xph (C, 4 planes of PL) from one image; the zero border stays as zeroed once per call. Input
 * column 2j goes to padded column 2j + pad: phase pad & 1, index j + pad / 2; column 2j + 1 to
 * the other phase (index one further on when pad is odd). Written as two stride-2 streams,
 * which GCC vectorises (scalar, this took as long as the forward's tiles on 28x28 images).
 */
MGE__CPU_CLONES
static void s2_split(const struct s2 *s, float *restrict xph, const float *restrict x)
{
    int half = s->pad / 2, odd = s->pad & 1, W2 = s->W / 2;
    for (int c = 0; c < s->C; c++)
        for (int h = 0; h < s->H; h++) {
            int hp = h + s->pad;
            const float *restrict row = x + ((size_t)c * s->H + h) * s->W;
            float *p0 = xph + ((size_t)c * 4 + (hp & 1) * 2) * s->PL + (size_t)(hp / 2) * s->Wh;
            float *p1 = p0 + s->PL;
            float *restrict ev = odd ? p1 + half : p0 + half;
            float *restrict od = odd ? p0 + half + 1 : p1 + half;
            for (int j = 0; j < W2; j++) {
                ev[j] = row[2 * j];
                od[j] = row[2 * j + 1];
            }
            if (s->W & 1)
                ev[W2] = row[s->W - 1];
        }
}

/* Packed forward weights: wp[kb][c][t][S2_KB] = w[k][c][t], zeros for k >= K */
static void s2_pack_forward(const struct s2 *s, float *restrict wp, const float *restrict w)
{
    for (int k = 0; k < s->Kp; k++)
        for (int c = 0; c < s->C; c++)
            for (int t = 0; t < s->nt; t++)
                wp[(((size_t)(k / S2_KB) * s->C + c) * s->nt + t) * S2_KB + k % S2_KB] =
                    k < s->K ? w[((size_t)k * s->C + c) * s->nt + t] : 0.0f;
}

/*
 * Packed dinp weights, phase after phase: for phase ph, [cb][k][n][S2_KB] = w[k][c][dtap[ph][n]]
 * (the conv's input channel c is the output here), zeros for c >= C
 */
static void s2_pack_data(const struct s2 *s, float *restrict wp, const float *restrict w)
{
    for (int ph = 0; ph < 4; ph++) {
        int n = s->dnt[ph];
        for (int c = 0; c < s->Cp; c++)
            for (int k = 0; k < s->K; k++)
                for (int u = 0; u < n; u++)
                    wp[(((size_t)(c / S2_KB) * s->K + k) * n + u) * S2_KB + c % S2_KB] =
                        c < s->C ? w[((size_t)k * s->C + c) * s->nt + s->dtap[ph][u]] : 0.0f;
        wp += (size_t)s->Cp * s->K * n;
    }
}

int mge__conv_stride2_forward(const struct mge_cpu_conv *cv, float *out, const float *inp,
                              const float *w, const float *bias, void *scratch)
{
    struct s2 s;
    if (s2_init(&s, cv) != 0)
        return -1;
    float *base = aligned(scratch);
    s2_pack_forward(&s, base + s.wf, w);
    size_t CHW = (size_t)s.C * s.H * s.W, PQ = (size_t)s.P * s.Q;
    int nt = mge__conv_slot_threads(s.slots, cv->N);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *sl = base + s.slot0 + (size_t)omp_get_thread_num() * s.slot;
        float *xph = sl + s.xph, *wo = sl + s.wo;
        memset(xph, 0, (size_t)s.C * 4 * s.PL * sizeof(float));
#pragma omp for schedule(static)
        for (int n = 0; n < cv->N; n++) {
            s2_split(&s, xph, inp + (size_t)n * CHW);
            s2_wide(s.LWf, s.Kp / S2_KB, xph, 4 * s.PL, s.C, s.nt, s.off, base + s.wf, wo, bias,
                    s.K);
            float *y = out + (size_t)n * s.K * PQ;
            for (int k = 0; k < s.K; k++)
                for (int p = 0; p < s.P; p++)
                    memcpy(y + (size_t)k * PQ + (size_t)p * s.Q,
                           wo + (size_t)k * s.LWf + (size_t)p * s.Wh, (size_t)s.Q * sizeof(float));
        }
    }
    return 0;
}

/*
 * dw block: dwv[k][c][t][lane] += sum over wide positions i of that lane of dyw[k][i] *
 * x[c][off[t] + i], for k in [k0, k0 + S2_KB) and taps [t0, t0 + NT). dyw rows are zero at the
 * junk positions, so those add nothing.
 */
static inline __attribute__((always_inline)) void s2_dw_block(const int NT, const struct s2 *s,
                                                              float *dwv, const float *xc,
                                                              const float *dyw, int k0, int c,
                                                              int t0)
{
    vf a[S2_KB][S2_DWT];
#pragma GCC unroll 8
    for (int kk = 0; kk < S2_KB; kk++)
#pragma GCC unroll 3
        for (int t = 0; t < NT; t++)
            a[kk][t] = (vf){0};
    for (size_t i = 0; i < s->LWf; i += V) {
        vf x[S2_DWT];
#pragma GCC unroll 3
        for (int t = 0; t < NT; t++)
            x[t] = ld(xc + s->off[t0 + t] + i);
#pragma GCC unroll 8
        for (int kk = 0; kk < S2_KB; kk++) {
            vf d = ld(dyw + (size_t)(k0 + kk) * s->LWf + i);
#pragma GCC unroll 3
            for (int t = 0; t < NT; t++)
                a[kk][t] += d * x[t];
        }
    }
    for (int kk = 0; kk < S2_KB && k0 + kk < s->K; kk++)
        for (int t = 0; t < NT; t++) {
            float *o = dwv + (((size_t)(k0 + kk) * s->C + c) * s->nt + t0 + t) * V;
            vf v = a[kk][t] + ld(o);
            memcpy(o, &v, sizeof(v));
        }
}

/*
 * k-lanes dw block (K a multiple of V): dwk[c][t][k] += sum over output pixels (p, q) of
 * dyt[p * Q + q][k] * x[c][t] at (p, q), for channels [c0, c0 + CB) and the lanes of k in
 * [kv0 * V, (kv0 + KV) * V): every lane sums its own channel in pixel order, nothing is summed
 * across lanes, and small images cost no more per FLOP than large ones.
 */
static inline __attribute__((always_inline)) void s2_kl_block(const int CB, const int KV,
                                                              const struct s2 *s, float *dwk,
                                                              const float *xph, const float *dyt,
                                                              int c0, int kv0)
{
    vf a[2][2][S2_TAPS];
#pragma GCC unroll 2
    for (int cb = 0; cb < CB; cb++)
#pragma GCC unroll 2
        for (int j = 0; j < KV; j++)
#pragma GCC unroll 9
            for (int t = 0; t < S2_TAPS; t++)
                a[cb][j][t] = (vf){0};
    const float *x0 = xph + (size_t)c0 * 4 * s->PL;
    for (int p = 0; p < s->P; p++)
        for (int q = 0; q < s->Q; q++) {
            const float *xr = x0 + (size_t)p * s->Wh + q;
            const float *d = dyt + ((size_t)p * s->Q + q) * s->K + (size_t)kv0 * V;
            vf dv[2];
#pragma GCC unroll 2
            for (int j = 0; j < KV; j++)
                dv[j] = ld(d + j * V);
#pragma GCC unroll 2
            for (int cb = 0; cb < CB; cb++)
#pragma GCC unroll 9
                for (int t = 0; t < S2_TAPS; t++) {
                    float xv = xr[(size_t)cb * 4 * s->PL + s->off[t]];
#pragma GCC unroll 2
                    for (int j = 0; j < KV; j++)
                        a[cb][j][t] += dv[j] * xv;
                }
        }
#pragma GCC unroll 2
    for (int cb = 0; cb < CB; cb++)
#pragma GCC unroll 2
        for (int j = 0; j < KV; j++)
#pragma GCC unroll 9
            for (int t = 0; t < S2_TAPS; t++) {
                float *o = dwk + ((size_t)(c0 + cb) * S2_TAPS + t) * s->K + (size_t)(kv0 + j) * V;
                vf v = a[cb][j][t] + ld(o);
                memcpy(o, &v, sizeof(v));
            }
}

/* Whether dw takes the k-lanes kernel: 3x3 and whole vectors of output channels */
static int s2_kl_ok(const struct s2 *s)
{
    return s->nt == S2_TAPS && s->K % V == 0;
}

/* One image's k-lanes dw: dwk (C, 9, K) += dw of dyt (P * Q, K) against the phase planes */
MGE__CPU_CLONES
static void s2_kl_image(const struct s2 *s, float *dwk, const float *xph, const float *dyt)
{
    int nv = s->K / V, KV = nv % 2 == 0 ? 2 : 1, CB = KV == 1 && s->C % 2 == 0 ? 2 : 1;
    for (int kv0 = 0; kv0 < nv; kv0 += KV)
        for (int c0 = 0; c0 < s->C; c0 += CB) {
            if (KV == 2)
                s2_kl_block(1, 2, s, dwk, xph, dyt, c0, kv0);
            else if (CB == 2)
                s2_kl_block(2, 1, s, dwk, xph, dyt, c0, kv0);
            else
                s2_kl_block(1, 1, s, dwk, xph, dyt, c0, kv0);
        }
}

/* dyt (PQ, K) = dy (K, PQ) transposed (conv_tile_int.h; K is a multiple of V, s2_kl_ok) */
MGE__CPU_CLONES
static void s2_transpose(float *restrict dyt, const float *restrict dy, int K, size_t PQ)
{
    transpose_pixels(dyt, dy, K, PQ);
}

MGE__CPU_CLONES
static void s2_dw_image(const struct s2 *s, float *dwv, const float *xph, const float *dyw)
{
    for (int k0 = 0; k0 < s->K; k0 += S2_KB)
        for (int c = 0; c < s->C; c++) {
            const float *xc = xph + (size_t)c * 4 * s->PL;
            for (int t0 = 0; t0 < s->nt; t0 += S2_DWT) {
                int n = s->nt - t0 < S2_DWT ? s->nt - t0 : S2_DWT;
                if (n == 3)
                    s2_dw_block(3, s, dwv, xc, dyw, k0, c, t0);
                else if (n == 2)
                    s2_dw_block(2, s, dwv, xc, dyw, k0, c, t0);
                else
                    s2_dw_block(1, s, dwv, xc, dyw, k0, c, t0);
            }
        }
}

/* One image's dinp (zeroed first unless @acc): the four phases, scattered to every second pixel */
static void s2_dinp_image(const struct s2 *s, float *dx, const float *dyp, const float *wd,
                          float *wo, int acc)
{
    if (!acc)
        memset(dx, 0, (size_t)s->C * s->H * s->W * sizeof(float));
    const float *wp = wd;
    for (int ph = 0; ph < 4; ph++) {
        int n = s->dnt[ph], a = ph / 2, b = ph % 2;
        if (n == 0)
            continue;
        s2_wide(s->LWd, s->Cp / S2_KB, dyp, s->PLd, s->K, n, s->doff[ph], wp, wo, NULL, s->C);
        wp += (size_t)s->Cp * s->K * n;
        /* padded-input position (2i + a, 2j + b) is dinp's (2i + a - pad, 2j + b - pad) */
        int i0 = (s->pad - a + 1) / 2, j0 = (s->pad - b + 1) / 2;
        for (int c = 0; c < s->C; c++)
            for (int i = i0; i < s->Hh; i++) {
                int h = 2 * i + a - s->pad;
                if (h >= s->H)
                    break;
                const float *src = wo + (size_t)c * s->LWd + (size_t)i * s->Wd;
                float *drow = dx + ((size_t)c * s->H + h) * s->W - s->pad + b;
                for (int j = j0; j < s->Wh && 2 * j + b - s->pad < s->W; j++)
                    drow[2 * j] += src[j];
            }
    }
}

int mge__conv_stride2_backward(const struct mge_cpu_conv *cv, float *dinp, float *dw, float *dbias,
                               const float *dout, const float *inp, const float *w, void *scratch,
                               int acc)
{
    struct s2 s;
    if (s2_init(&s, cv) != 0)
        return -1;
    float *base = aligned(scratch);
    if (dinp)
        s2_pack_data(&s, base + s.wd, w);
    size_t CHW = (size_t)s.C * s.H * s.W, PQ = (size_t)s.P * s.Q, KPQ = (size_t)s.K * PQ;
    size_t nw = (size_t)s.K * s.C * s.nt, ctaps = (size_t)s.C * s.nt;
    int nt = mge__conv_slot_threads(s.slots, cv->N);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *sl = base + s.slot0 + (size_t)omp_get_thread_num() * s.slot;
        float *xph = sl + s.xph, *dyw = sl + s.dyw, *dyp = sl + s.dyp, *wo = sl + s.wo;
        float *dwp = sl + s.dw, *dbp = sl + s.db;
        int kl = s2_kl_ok(&s);
        if (dw) {
            memset(xph, 0, (size_t)s.C * 4 * s.PL * sizeof(float));
            memset(dyw, 0, (size_t)s.Kp * s.LWf * sizeof(float));
            memset(dwp, 0, nw * (kl ? 1 : V) * sizeof(float));
        }
        if (dinp)
            memset(dyp, 0, (size_t)s.K * s.PLd * sizeof(float));
        if (dbias)
            memset(dbp, 0, (size_t)s.K * sizeof(float));
#pragma omp for schedule(static)
        for (int n = 0; n < cv->N; n++) {
            const float *dy = dout + (size_t)n * KPQ;
            if (dbias)
                mge__conv_dbias_image(dbp, dy, s.K, PQ);
            if (dw && kl) {
                s2_split(&s, xph, inp + (size_t)n * CHW);
                s2_transpose(dyw, dy, s.K, PQ); /* dyw has room: K P Q <= Kp LWf */
                s2_kl_image(&s, dwp, xph, dyw);
            } else if (dw) {
                s2_split(&s, xph, inp + (size_t)n * CHW);
                for (int k = 0; k < s.K; k++)
                    for (int p = 0; p < s.P; p++)
                        memcpy(dyw + (size_t)k * s.LWf + (size_t)p * s.Wh,
                               dy + (size_t)k * PQ + (size_t)p * s.Q, (size_t)s.Q * sizeof(float));
                s2_dw_image(&s, dwp, xph, dyw);
            }
            if (dinp) {
                for (int k = 0; k < s.K; k++)
                    for (int p = 0; p < s.P; p++)
                        memcpy(dyp + (size_t)k * s.PLd + (size_t)(p + 1) * s.Wd + 1,
                               dy + (size_t)k * PQ + (size_t)p * s.Q, (size_t)s.Q * sizeof(float));
                s2_dinp_image(&s, dinp + (size_t)n * CHW, dyp, base + s.wd, wo, acc);
            }
        }
        /* implicit barrier: all partials complete */
#pragma omp for schedule(static)
        for (size_t i = 0; i < nw + (size_t)s.K; i++) {
            int is_b = i >= nw;
            float *dst = is_b ? dbias : dw;
            size_t j = is_b ? i - nw : i;
            if (!dst)
                continue;
            float t = acc ? dst[j] : 0.0f;
            for (int u = 0; u < omp_get_num_threads(); u++) {
                const float *ub = base + s.slot0 + (size_t)u * s.slot;
                if (is_b)
                    t += ub[s.db + j];
                else if (kl) /* (C, taps, K) */
                    t += ub[s.dw + (j % ctaps) * s.K + j / ctaps];
                else
                    for (int l = 0; l < V; l++)
                        t += ub[s.dw + j * V + l];
            }
            dst[j] = t;
        }
    }
    return 0;
}
