/*
 * conv_direct.c: direct stride-1 convolution for small channel counts (LeNet-sized), vectorised
 * over output columns with GCC vector extensions. No im2col matrix: each image is copied into a
 * zero-bordered buffer and every tap is one unaligned vector load reused across a block of output
 * channels. dinp is the same kernel run on dout with flipped, transposed weights; dw keeps one
 * vector accumulator per (channel, tap column) and sums lanes at the end. conv.c calls it and
 * falls back to im2col for shapes it does not take (stride > 1, S > 7, pad >= R or S).
 *
 * Narrow images (ResNet's 14x14 and 7x7) waste most of a 16-lane vector per output row, so a
 * geometry with S <= 3 whose rows fill vectors badly is computed "flat": each padded channel
 * plane is one long row of Hp * Wp floats, output (p, q) sits at p * Wp + q of a wide output
 * plane, and vectors run across row ends. The S - 1 columns between rows are junk computed and
 * dropped (22 % of 7x7 where rows waste 56 %); the wide plane is copied out to (P, Q).
 *
 * A 3x3 dw with K a multiple of 16 puts output channels in the lanes instead ("k-lanes"): per
 * pixel, a vector of dout's channels (dout transposed per image) times each tap's input value.
 * Every lane then sums its own channel's terms in pixel order, nothing is summed across lanes,
 * and a small image costs no more per FLOP than a large one.
 */
#include <omp.h>
#include <string.h>

#include "kernels/cpu/conv_tile_int.h"

#define KBW 4   /* output channels per dw block */
#define MAX_S 7 /* widest kernel the dw blocks take (KBW * MAX_S accumulators) */
#define KBF 8   /* output channels per flat dw block (KBF * FLAT_MAX_S accumulators) */
#define FLAT_MAX_S 3
#define FLAT_QB 3  /* vectors per flat forward tile (KB * FLAT_QB accumulators) */
#define KL_MIN_C 8 /* input channels from which a 3x3 dw puts output channels in lanes */

static int kb_pick(int K, int QV)
{
    static const int cands[] = {16, 8, 6, 4};
    int best = 4, waste = 1 << 30;
    for (int i = QV == 1 ? 0 : 1; i < 4; i++) { /* 16 x 2 vectors would spill */
        int w = (K + cands[i] - 1) / cands[i] * cands[i] - K;
        if (w < waste)
            best = cands[i], waste = w;
    }
    return best;
}

static void geo_init(struct geo *g, int C, int H, int W, int ph, int pw, int K, int R, int S)
{
    g->C = C, g->H = H, g->W = W, g->ph = ph, g->pw = pw, g->K = K, g->R = R, g->S = S;
    g->P = H + 2 * ph - R + 1;
    g->Q = W + 2 * pw - S + 1;
    g->QV = (g->Q + V - 1) / V;
    g->Hp = H + 2 * ph;
    int lv = (g->P * (W + 2 * pw) + V - 1) / V;
    g->flat = S <= FLAT_MAX_S && lv <= g->P * g->QV; /* as many vectors: flat tiles are larger */
    g->LW = lv * V;
    /* loads run to column QV * V + S - 2 (tile tails) and dw reads KBW-padded taps */
    int need = g->QV * V + S - 1;
    g->Wp = W + 2 * pw > need || g->flat ? W + 2 * pw : need;
    g->KB = kb_pick(K, g->flat ? 2 : g->QV);
    g->Kp = (K + g->KB - 1) / g->KB * g->KB;
}

/* Floats of a padded image; flat loads of the last plane's junk outputs run LW + R * Wp past it */
static size_t padded_floats(const struct geo *g)
{
    return (size_t)g->C * g->Hp * g->Wp + (g->flat ? (size_t)g->LW + (size_t)g->R * g->Wp : 0);
}

/* Interior of the padded buffer from one image; the border stays as zeroed once per call. */
MGE__CPU_CLONES
static void pad_copy(const struct geo *g, float *restrict xp, const float *restrict x)
{
    for (int c = 0; c < g->C; c++)
        for (int h = 0; h < g->H; h++)
            memcpy(xp + ((size_t)c * g->Hp + h + g->ph) * g->Wp + g->pw,
                   x + ((size_t)c * g->H + h) * g->W, (size_t)g->W * sizeof(float));
}

/*
 * Pack weights for the forward kernel: wp[kb][c][r][s][KB] from w[k][c][r][s] (flip: from
 * w[c][k][R-1-r][S-1-s], the transposed, rotated kernel of the data gradient), zeros for k >= K.
 */
static void pack_weights(const struct geo *g, float *restrict wp, const float *restrict w, int flip)
{
    int C = g->C, R = g->R, S = g->S, KB = g->KB;
    for (int k = 0; k < g->Kp; k++)
        for (int c = 0; c < C; c++)
            for (int r = 0; r < R; r++)
                for (int s = 0; s < S; s++) {
                    float v = 0.0f;
                    if (k < g->K)
                        v = flip ? w[(((size_t)c * g->K + k) * R + R - 1 - r) * S + S - 1 - s]
                                 : w[(((size_t)k * C + c) * R + r) * S + s];
                    wp[((((size_t)(k / KB) * C + c) * R + r) * S + s) * KB + k % KB] = v;
                }
}

#define TILE(KB_, QB_)                                                                             \
    case KB_ * 4 + QB_:                                                                            \
        conv_tile(KB_, QB_, g, out + ((size_t)k0 * g->P + p) * g->Q + q0, (size_t)g->P * g->Q,     \
                  g->Q - q0, acc, xp + (size_t)p * g->Wp + q0, wp, bias, k0, r0, r1);              \
        break

/* One image: out (K, P, Q) (+)= conv(xp) + bias (may be NULL). */
MGE__CPU_CLONES
static void fwd_image(const struct geo *g, float *out, const float *xp, const float *wp,
                      const float *bias, int acc)
{
    for (int p = 0; p < g->P; p++) {
        /* rows of the zero border add nothing: a data gradient's border is R - 1 - pad rows high */
        int r0 = g->ph - p > 0 ? g->ph - p : 0;
        int r1 = g->ph + g->H - p < g->R ? g->ph + g->H - p : g->R;
        for (int k0 = 0; k0 < g->Kp; k0 += g->KB)
            for (int q0 = 0; q0 < g->Q; q0 += 2 * V) {
                int QB = g->Q - q0 > V ? 2 : 1;
                switch (g->KB * 4 + QB) {
                    TILE(4, 1);
                    TILE(4, 2);
                    TILE(6, 1);
                    TILE(6, 2);
                    TILE(8, 1);
                    TILE(8, 2);
                    TILE(16, 1);
                default: /* kb_pick never gives 16 with two vectors */
                    break;
                }
            }
    }
}

#define FLAT_TILE(KB_, QB_)                                                                        \
    case KB_ * 4 + QB_:                                                                            \
        conv_tile(KB_, QB_, g, wo + (size_t)k0 * g->LW + i0, (size_t)g->LW, QB_ * V, 0, xp + i0,   \
                  wp, bias, k0, 0, g->R);                                                          \
        break

/* One image, flat: out (K, P, Q) (+)= conv(xp) + bias (may be NULL), through wo (K, LW). */
MGE__CPU_CLONES
static void flat_image(const struct geo *g, float *out, const float *xp, const float *wp,
                       const float *bias, int acc, float *wo)
{
    for (int k0 = 0; k0 < g->Kp; k0 += g->KB)
        for (int i0 = 0; i0 < g->LW; i0 += FLAT_QB * V) {
            int QB = (g->LW - i0) / V < FLAT_QB ? (g->LW - i0) / V : FLAT_QB;
            switch (g->KB * 4 + QB) {
                FLAT_TILE(4, 1);
                FLAT_TILE(4, 2);
                FLAT_TILE(4, 3);
                FLAT_TILE(6, 1);
                FLAT_TILE(6, 2);
                FLAT_TILE(6, 3);
                FLAT_TILE(8, 1);
                FLAT_TILE(8, 2);
                FLAT_TILE(8, 3);
            default: /* a flat geometry's KB comes from {8, 6, 4} */
                break;
            }
        }
    for (int k = 0; k < g->K; k++)
        for (int p = 0; p < g->P; p++) {
            float *o = out + ((size_t)k * g->P + p) * g->Q;
            const float *src = wo + (size_t)k * g->LW + (size_t)p * g->Wp;
            if (!acc) {
                memcpy(o, src, (size_t)g->Q * sizeof(float));
                continue;
            }
            for (int q = 0; q < g->Q; q++)
                o[q] += src[q];
        }
}

/*
 * dw block: dwv[k][c][r][s][lane] += sum over p, and q of that lane, of
 * dyp[k][p][q] * xp[c][p + r][q + s] for k in [k0, k0 + KBW). dyp rows are QV * V wide with zeros
 * past Q, so the lanes past the output's edge add nothing.
 */
static inline __attribute__((always_inline)) void
dw_block(const int S, const struct geo *g, float *dwv, const float *xp, const float *dyp, int k0)
{
    int QW = g->QV * V;
    for (int c = 0; c < g->C; c++)
        for (int r = 0; r < g->R; r++) {
            vf a[KBW][MAX_S];
#pragma GCC unroll 4
            for (int kk = 0; kk < KBW; kk++)
#pragma GCC unroll 7
                for (int s = 0; s < S; s++)
                    a[kk][s] = (vf){0};
            for (int p = 0; p < g->P; p++) {
                const float *row = xp + ((size_t)c * g->Hp + p + r) * g->Wp;
                const float *drow = dyp + ((size_t)k0 * g->P + p) * QW;
                for (int j = 0; j < QW; j += V) {
                    vf x[MAX_S], d[KBW];
#pragma GCC unroll 7
                    for (int s = 0; s < S; s++)
                        x[s] = ld(row + j + s);
#pragma GCC unroll 4
                    for (int kk = 0; kk < KBW; kk++)
                        d[kk] = ld(drow + (size_t)kk * g->P * QW + j);
#pragma GCC unroll 4
                    for (int kk = 0; kk < KBW; kk++)
#pragma GCC unroll 7
                        for (int s = 0; s < S; s++)
                            a[kk][s] += d[kk] * x[s];
                }
            }
            /* lanes are summed once per call, not per image: a horizontal sum costs more
             * than this whole block on small images */
            for (int kk = 0; kk < KBW && k0 + kk < g->K; kk++)
                for (int s = 0; s < S; s++) {
                    float *o = dwv + ((((size_t)(k0 + kk) * g->C + c) * g->R + r) * S + s) * V;
                    vf v = a[kk][s] + ld(o);
                    memcpy(o, &v, sizeof(v));
                }
        }
}

#define DWB(S_)                                                                                    \
    case S_:                                                                                       \
        dw_block(S_, g, dwv, xp, dyp, k0);                                                         \
        break

/*
 * Flat dw block: dwv[k][c][r][s][lane] += sum over i of that lane of dyw[k][i] * xp[c][i + r * Wp
 * + s] for k in [k0, k0 + KBF). dyw planes are LW long, zero in the junk columns and past P * Wp.
 */
static inline __attribute__((always_inline)) void dw_flat_block(const int S, const struct geo *g,
                                                                float *dwv, const float *xp,
                                                                const float *dyw, int k0)
{
    size_t plane = (size_t)g->Hp * g->Wp;
    for (int c = 0; c < g->C; c++)
        for (int r = 0; r < g->R; r++) {
            vf a[KBF][FLAT_MAX_S];
#pragma GCC unroll 8
            for (int kk = 0; kk < KBF; kk++)
#pragma GCC unroll 3
                for (int s = 0; s < S; s++)
                    a[kk][s] = (vf){0};
            const float *row = xp + c * plane + (size_t)r * g->Wp;
            const float *drow = dyw + (size_t)k0 * g->LW;
            for (int i = 0; i < g->LW; i += V) {
                vf x[FLAT_MAX_S];
#pragma GCC unroll 3
                for (int s = 0; s < S; s++)
                    x[s] = ld(row + i + s);
#pragma GCC unroll 8
                for (int kk = 0; kk < KBF; kk++) {
                    vf d = ld(drow + (size_t)kk * g->LW + i);
#pragma GCC unroll 3
                    for (int s = 0; s < S; s++)
                        a[kk][s] += d * x[s];
                }
            }
            for (int kk = 0; kk < KBF && k0 + kk < g->K; kk++)
                for (int s = 0; s < S; s++) {
                    float *o = dwv + ((((size_t)(k0 + kk) * g->C + c) * g->R + r) * S + s) * V;
                    vf v = a[kk][s] + ld(o);
                    memcpy(o, &v, sizeof(v));
                }
        }
}

#define DWF(S_)                                                                                    \
    case S_:                                                                                       \
        dw_flat_block(S_, g, dwv, xp, dyp, k0);                                                    \
        break

MGE__CPU_CLONES
static void dw_image(const struct geo *g, float *dwv, const float *xp, const float *dyp)
{
    if (g->flat) {
        for (int k0 = 0; k0 < g->K; k0 += KBF)
            switch (g->S) {
                DWF(1);
                DWF(2);
                DWF(3);
            default: /* a flat geometry has S <= FLAT_MAX_S */
                break;
            }
        return;
    }
    for (int k0 = 0; k0 < g->K; k0 += KBW)
        switch (g->S) {
            DWB(1);
            DWB(2);
            DWB(3);
            DWB(4);
            DWB(5);
            DWB(6);
            DWB(7);
        default: /* mge__conv_direct_ok() keeps S <= MAX_S */
            break;
        }
}

/*
 * k-lanes dw block: dwk[c][r][s][k] += sum over pixels (p, q) of dyt[p * Q + q][k] *
 * xp[c][p + r][q + s], for channels [c0, c0 + CB) and lanes of k in [kv0 * V, (kv0 + KV) * V).
 */
static inline __attribute__((always_inline)) void kl_block(const int CB, const int KV,
                                                           const struct geo *g, float *dwk,
                                                           const float *xp, const float *dyt,
                                                           int c0, int kv0)
{
    vf a[2][2][9];
#pragma GCC unroll 2
    for (int cb = 0; cb < CB; cb++)
#pragma GCC unroll 2
        for (int j = 0; j < KV; j++)
#pragma GCC unroll 9
            for (int t = 0; t < 9; t++)
                a[cb][j][t] = (vf){0};
    size_t plane = (size_t)g->Hp * g->Wp;
    const float *x0 = xp + c0 * plane;
    const float *d0 = dyt + (size_t)kv0 * V;
    for (int p = 0; p < g->P; p++)
        for (int q = 0; q < g->Q; q++) {
            const float *xr = x0 + (size_t)p * g->Wp + q;
            const float *d = d0 + ((size_t)p * g->Q + q) * g->K;
            vf dv[2];
#pragma GCC unroll 2
            for (int j = 0; j < KV; j++)
                dv[j] = ld(d + j * V);
#pragma GCC unroll 2
            for (int cb = 0; cb < CB; cb++)
#pragma GCC unroll 3
                for (int r = 0; r < 3; r++)
#pragma GCC unroll 3
                    for (int s = 0; s < 3; s++) {
                        float xv = xr[cb * plane + (size_t)r * g->Wp + s];
#pragma GCC unroll 2
                        for (int j = 0; j < KV; j++)
                            a[cb][j][r * 3 + s] += dv[j] * xv;
                    }
        }
#pragma GCC unroll 2
    for (int cb = 0; cb < CB; cb++)
#pragma GCC unroll 2
        for (int j = 0; j < KV; j++)
#pragma GCC unroll 9
            for (int t = 0; t < 9; t++) {
                float *o = dwk + ((size_t)(c0 + cb) * 9 + t) * g->K + (size_t)(kv0 + j) * V;
                vf v = a[cb][j][t] + ld(o);
                memcpy(o, &v, sizeof(v));
            }
}

/*
 * Whether dw takes the k-lanes kernel: 3x3, whole vectors of output channels, and enough input
 * channels (ResNet-20's 1-channel stem: 2.6 ms a dw at batch 128, one thread, against 1.8 with
 * lanes along rows)
 */
static int kl_ok(const struct geo *g)
{
    return g->R == 3 && g->S == 3 && g->K % V == 0 && g->C >= KL_MIN_C;
}

/* dyt (PQ, K) = dy (K, PQ) transposed (conv_tile_int.h), compiled for each target */
MGE__CPU_CLONES
static void kl_transpose(float *restrict dyt, const float *restrict dy, int K, size_t PQ)
{
    transpose_pixels(dyt, dy, K, PQ);
}

/* One image's k-lanes dw: dwk (C, 3, 3, K) += dw of dyt (P * Q, K) against xp */
MGE__CPU_CLONES
static void kl_image(const struct geo *g, float *dwk, const float *xp, const float *dyt)
{
    int nv = g->K / V, KV = nv % 2 == 0 ? 2 : 1, CB = KV == 1 && g->C % 2 == 0 ? 2 : 1;
    for (int kv0 = 0; kv0 < nv; kv0 += KV)
        for (int c0 = 0; c0 < g->C; c0 += CB) {
            if (KV == 2)
                kl_block(1, 2, g, dwk, xp, dyt, c0, kv0);
            else if (CB == 2)
                kl_block(2, 1, g, dwk, xp, dyt, c0, kv0);
            else
                kl_block(1, 1, g, dwk, xp, dyt, c0, kv0);
        }
}

/* ---- plans: the two geometries of one conv, and where scratch goes ------------------------ */

struct plan {
    struct geo f; /* forward and dw: inp padded by pad */
    struct geo d; /* dinp: dout padded by R-1-pad, S-1-pad, flipped weights */
    int Kw;       /* K rounded up to KBF (dw's padded dout rows) */
    int slots;
    /* float offsets in scratch: shared packed weights; per slot (stride @slot) the padded input,
     * padded (or, k-lanes, transposed) dout for dw, padded dout for dinp, dw (by lane, or
     * k-lanes (C, R, S, K)) and dbias partials, and the wide output planes of a flat forward or
     * dinp */
    size_t wpk, slot0, slot, xp, dyp, dxp, dw, db, wo, total;
};

static size_t up16(size_t n)
{
    return (n + 15) / 16 * 16;
}

static int plan_init(struct plan *pl, const struct mge_cpu_conv *cv)
{
    if (cv->stride != 1 || cv->S > MAX_S || cv->pad > cv->R - 1 || cv->pad > cv->S - 1)
        return -1;
    geo_init(&pl->f, cv->C, cv->H, cv->W, cv->pad, cv->pad, cv->K, cv->R, cv->S);
    geo_init(&pl->d, cv->K, cv->P, cv->Q, cv->R - 1 - cv->pad, cv->S - 1 - cv->pad, cv->C, cv->R,
             cv->S);
    if (pl->f.P != cv->P || pl->f.Q != cv->Q || pl->d.P != cv->H || pl->d.Q != cv->W)
        return -1;
    pl->Kw = (cv->K + KBF - 1) / KBF * KBF;
    pl->slots = cv->slots > 0 ? cv->slots : 1;
    size_t crs = (size_t)cv->C * cv->R * cv->S, krs = (size_t)cv->K * cv->R * cv->S;
    size_t wf = (size_t)pl->f.Kp * crs, wd = (size_t)pl->d.Kp * krs;
    pl->wpk = 0;
    pl->slot0 = up16(wf > wd ? wf : wd);
    pl->xp = 0;
    pl->dyp = pl->xp + up16(padded_floats(&pl->f));
    size_t dy_rows = (size_t)cv->P * pl->f.QV * V;
    pl->dxp = pl->dyp + up16((size_t)pl->Kw * (pl->f.flat ? (size_t)pl->f.LW : dy_rows));
    pl->dw = pl->dxp + up16(padded_floats(&pl->d));
    /* the k-lanes dw partial is (C, R, S, K): V times smaller than one by lane */
    pl->db = pl->dw + (size_t)cv->K * crs * (kl_ok(&pl->f) ? 1 : V);
    pl->wo = pl->db + up16((size_t)cv->K);
    size_t wof = pl->f.flat ? (size_t)cv->K * pl->f.LW : 0;
    size_t wod = pl->d.flat ? (size_t)cv->C * pl->d.LW : 0;
    pl->slot = pl->wo + up16(wof > wod ? wof : wod);
    pl->total = pl->slot0 + (size_t)pl->slots * pl->slot;
    return 0;
}

int mge__conv_direct_is_narrow_ok(const struct mge_cpu_conv *cv)
{
    struct plan pl;
    return plan_init(&pl, cv) == 0 && kl_ok(&pl.f) && (pl.f.flat || pl.f.QV == 1);
}

size_t mge__conv_direct_scratch_bytes(const struct mge_cpu_conv *cv)
{
    struct plan pl;
    return plan_init(&pl, cv) == 0 ? pl.total * sizeof(float) + 64 : 0;
}

int mge__conv_direct_forward(const struct mge_cpu_conv *cv, float *out, const float *inp,
                             const float *w, const float *bias, void *scratch)
{
    struct plan pl;
    if (plan_init(&pl, cv) != 0)
        return -1;
    float *base = aligned(scratch);
    const struct geo *g = &pl.f;
    pack_weights(g, base + pl.wpk, w, 0);
    size_t CHW = (size_t)cv->C * cv->H * cv->W, KPQ = (size_t)cv->K * cv->P * cv->Q;
    int nt = mge__conv_slot_threads(pl.slots, cv->N);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *sl = base + pl.slot0 + (size_t)omp_get_thread_num() * pl.slot;
        float *xp = sl + pl.xp;
        memset(xp, 0, padded_floats(g) * sizeof(float));
#pragma omp for schedule(static)
        for (int n = 0; n < cv->N; n++) {
            pad_copy(g, xp, inp + (size_t)n * CHW);
            if (g->flat)
                flat_image(g, out + (size_t)n * KPQ, xp, base + pl.wpk, bias, 0, sl + pl.wo);
            else
                fwd_image(g, out + (size_t)n * KPQ, xp, base + pl.wpk, bias, 0);
        }
    }
    return 0;
}

/*
 * Each slot sums its images' dw and dbias in image order into its own partial; the partials are
 * added in slot order, so results depend on the slot count only, never on timing.
 */
int mge__conv_direct_backward(const struct mge_cpu_conv *cv, float *dinp, float *dw, float *dbias,
                              const float *dout, const float *inp, const float *w, void *scratch,
                              int acc)
{
    struct plan pl;
    if (plan_init(&pl, cv) != 0)
        return -1;
    float *base = aligned(scratch);
    const struct geo *f = &pl.f, *d = &pl.d;
    if (dinp)
        pack_weights(d, base + pl.wpk, w, 1);
    size_t CHW = (size_t)cv->C * cv->H * cv->W, PQ = (size_t)cv->P * cv->Q;
    size_t KPQ = (size_t)cv->K * PQ, nw = (size_t)cv->K * cv->C * cv->R * cv->S;
    size_t crs = (size_t)cv->C * cv->R * cv->S;
    int QW = f->QV * V, nt = mge__conv_slot_threads(pl.slots, cv->N);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *sl = base + pl.slot0 + (size_t)omp_get_thread_num() * pl.slot;
        float *xp = sl + pl.xp, *dyp = sl + pl.dyp, *dxp = sl + pl.dxp;
        float *dwp = sl + pl.dw, *dbp = sl + pl.db;
        /* dw's dout rows: QW wide, or flat planes with Wp-wide rows */
        size_t dys = f->flat ? (size_t)f->LW : (size_t)cv->P * QW;
        int dyq = f->flat ? f->Wp : QW;
        int kl = kl_ok(f);
        if (dw) {
            memset(xp, 0, padded_floats(f) * sizeof(float));
            memset(dyp, 0, (size_t)pl.Kw * dys * sizeof(float));
            memset(dwp, 0, nw * (kl ? 1 : V) * sizeof(float));
        }
        if (dinp)
            memset(dxp, 0, padded_floats(d) * sizeof(float));
        if (dbias)
            memset(dbp, 0, (size_t)cv->K * sizeof(float));
#pragma omp for schedule(static)
        for (int n = 0; n < cv->N; n++) {
            const float *dy = dout + (size_t)n * KPQ;
            if (dbias)
                mge__conv_dbias_image(dbp, dy, cv->K, PQ);
            if (dw) {
                pad_copy(f, xp, inp + (size_t)n * CHW);
                if (kl) {
                    /* dyt (P * Q, K): dyp has room, K * P * Q <= Kw * dys */
                    kl_transpose(dyp, dy, cv->K, PQ);
                    kl_image(f, dwp, xp, dyp);
                } else {
                    for (int k = 0; k < cv->K; k++)
                        for (int p = 0; p < cv->P; p++)
                            memcpy(dyp + k * dys + (size_t)p * dyq,
                                   dy + (size_t)k * PQ + (size_t)p * cv->Q,
                                   (size_t)cv->Q * sizeof(float));
                    dw_image(f, dwp, xp, dyp);
                }
            }
            if (dinp) {
                pad_copy(d, dxp, dy);
                if (d->flat)
                    flat_image(d, dinp + (size_t)n * CHW, dxp, base + pl.wpk, NULL, acc,
                               sl + pl.wo);
                else
                    fwd_image(d, dinp + (size_t)n * CHW, dxp, base + pl.wpk, NULL, acc);
            }
        }
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
                const float *ub = base + pl.slot0 + (size_t)u * pl.slot;
                if (is_b)
                    s += ub[pl.db + j];
                else if (kl)
                    s += ub[pl.dw + (j % crs) * cv->K + j / crs];
                else
                    for (int l = 0; l < V; l++)
                        s += ub[pl.dw + j * V + l];
            }
            dst[j] = s;
        }
    }
    return 0;
}
