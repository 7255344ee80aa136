/*
 * conv_winograd_dw.c: the part of the Winograd weight gradients that does not depend on the tile
 * size (conv_winograd_dw_int.h): scratch plan, channels-last transposes, the GEMMs over tiles,
 * the threaded driver; F(2x2) in conv_winograd.c and F(4x4) in conv_winograd4_dw.c bring the
 * transforms.
 */
#include <omp.h>
#include <string.h>

#include "kernels/cpu/conv_tile_int.h"
#include "kernels/cpu/conv_winograd_dw_int.h"

#define KB MGE__WDW_KB

static size_t up16(size_t n)
{
    return (n + 15) / 16 * 16;
}

void mge__wdw_plan_init(struct mge__wdw_plan *pl, const struct mge_cpu_conv *cv, int m,
                        int min_tiles)
{
    pl->C = cv->C, pl->K = cv->K, pl->H = cv->H, pl->W = cv->W, pl->N = cv->N;
    pl->m = m, pl->NX = (m + 2) * (m + 2);
    pl->TH = (cv->H + m - 1) / m, pl->TW = (cv->W + m - 1) / m, pl->NT = pl->TH * pl->TW;
    pl->Cp = (cv->C + V - 1) / V * V, pl->Kp = (cv->K + V - 1) / V * V;
    pl->Wx = m * pl->TW + 2;
    pl->G = (min_tiles + pl->NT - 1) / pl->NT;
    if (pl->G > cv->N)
        pl->G = cv->N;
    pl->Tg = pl->G * pl->NT;
    pl->slots = cv->slots > 0 ? cv->slots : 1;
    pl->xp = 0;
    pl->dyp = pl->xp + up16((size_t)(m * pl->TH + 2) * pl->Wx * pl->Cp);
    pl->vt = pl->dyp + up16((size_t)(m * pl->TH) * (m * pl->TW) * pl->Kp);
    pl->mt = pl->vt + (size_t)pl->NX * pl->Tg * pl->Cp;
    pl->mbs = (size_t)pl->Tg * KB + V; /* + V: blocks a multiple of 4 KiB apart thrashed L1 */
    pl->du = pl->mt + (size_t)pl->NX * (pl->Kp / KB) * pl->mbs;
    pl->slot = pl->du + (size_t)pl->NX * pl->Kp * pl->Cp;
    pl->total = (size_t)pl->slots * pl->slot;
}

/*
 * dst[pos(i) * Cp + c] = src[c * n + i] (zeros for C <= c < Cp) for the n positions of a (C, n)
 * plane whose rows are @w wide: pos(i) = (i / w + oh) * rw + i % w + ow puts them into rows of
 * @rw positions, offset by (oh, ow). Whole V x V blocks go through registers (transpose16);
 * @next (may be NULL), the next image, is prefetched on the way (at batch 128 these reads are
 * memory-bound).
 */
MGE__CPU_CLONES
static void to_channels_last(float *restrict dst, const float *restrict src, const float *next,
                             int C, int Cp, int n, int w, int rw, int oh, int ow)
{
    int nb = n / V * V;
    for (int c0 = 0; c0 < Cp; c0 += V)
        for (int i0 = 0; i0 < nb; i0 += V) {
            vf t[V];
#pragma GCC unroll 16
            for (int r = 0; r < V; r++)
                t[r] = c0 + r < C ? ld(src + (size_t)(c0 + r) * n + i0) : (vf){0};
            if (next)
#pragma GCC unroll 16
                for (int r = 0; r < V; r++)
                    if (c0 + r < C)
                        __builtin_prefetch(next + (size_t)(c0 + r) * n + i0, 0, 2);
            transpose16(t);
            int h = i0 / w, q = i0 % w;
#pragma GCC unroll 16
            for (int j = 0; j < V; j++) {
                memcpy(dst + ((size_t)(h + oh) * rw + q + ow) * Cp + c0, &t[j], sizeof(vf));
                if (++q == w)
                    q = 0, h++;
            }
        }
    for (int i = nb; i < n; i++) {
        float *d = dst + ((size_t)(i / w + oh) * rw + i % w + ow) * Cp;
        for (int c = 0; c < Cp; c++)
            d[c] = c < C ? src[(size_t)c * n + i] : 0.0f;
    }
}

/*
 * du[xi] += mt[xi]^T x vt[xi] over the first @nt tiles, all NX positions: the forward's register
 * tile (conv_tile), as a 1x1 "conv" over nt "channels" (tiles) with Cp-wide planes (input
 * channels in the lanes) and dM as the weights of Kp output channels
 */
MGE__CPU_CLONES
static void gemms(const struct mge__wdw_plan *pl, float *du, const float *vt, const float *mt,
                  int nt)
{
    int Cp = pl->Cp, Kp = pl->Kp;
    struct geo m = {.C = nt, .K = KB, .R = 1, .S = 1, .Hp = 1, .Wp = Cp};
    for (int xi = 0; xi < pl->NX; xi++) {
        const float *v = vt + (size_t)xi * pl->Tg * Cp, *mx = mt + (size_t)xi * (Kp / KB) * pl->mbs;
        float *d = du + (size_t)xi * Kp * Cp;
        for (int k0 = 0; k0 < Kp; k0 += KB) {
            const float *w = mx + (size_t)(k0 / KB) * pl->mbs;
            float *o = d + (size_t)k0 * Cp;
            /* 3 vectors at a time, but 2 + 2 rather than 3 + 1 (64 channels: 5 % faster) */
            for (int c0 = 0, nv; c0 < Cp; c0 += nv * V) {
                nv = (Cp - c0) / V;
                nv = nv == 4 ? 2 : nv > 3 ? 3 : nv;
                if (nv == 3)
                    conv_tile(KB, 3, &m, o + c0, Cp, 3 * V, 1, v + c0, w, NULL, 0, 0, 1);
                else if (nv == 2)
                    conv_tile(KB, 2, &m, o + c0, Cp, 2 * V, 1, v + c0, w, NULL, 0, 0, 1);
                else
                    conv_tile(KB, 1, &m, o + c0, Cp, V, 1, v + c0, w, NULL, 0, 0, 1);
            }
        }
    }
}

/* The images [n0, n1) of one work item into this slot's partial dU */
static void group(const struct mge__wdw_plan *pl, const struct mge__wdw_ops *ops, float *sl,
                  const float *dout, const float *inp, int n0, int n1)
{
    size_t hw = (size_t)pl->H * pl->W;
    for (int n = n0; n < n1; n++) {
        const float *x = inp + (size_t)n * pl->C * hw, *dy = dout + (size_t)n * pl->K * hw;
        int more = n + 1 < pl->N; /* a thread's groups are consecutive (schedule(static)) */
        to_channels_last(sl + pl->xp, x, more ? x + (size_t)pl->C * hw : NULL, pl->C, pl->Cp,
                         (int)hw, pl->W, pl->Wx, 1, 1);
        to_channels_last(sl + pl->dyp, dy, more ? dy + (size_t)pl->K * hw : NULL, pl->K, pl->Kp,
                         (int)hw, pl->W, pl->m * pl->TW, 0, 0);
        ops->input_tiles(pl, sl + pl->vt, sl + pl->xp, (n - n0) * pl->NT);
        ops->output_tiles(pl, sl + pl->mt, sl + pl->dyp, (n - n0) * pl->NT);
    }
    gemms(pl, sl + pl->du, sl + pl->vt, sl + pl->mt, (n1 - n0) * pl->NT);
}

/*
 * dw[k][c] (+)= G^T dU G for the channels c of one output channel k, dU the sum of the @ns
 * slots' partials in slot order (in double, as the transform; rounded once). Rows of 16
 * channels at a time: a partial's positions lie Kp * Cp floats apart, and one (k, c) at a time
 * (36 loads 16 KiB apart at 64 channels) took a sixth of a 64x7x7 dw.
 */
static void filter_grad(const struct mge__wdw_plan *pl, const struct mge__wdw_ops *ops, float *dw,
                        const float *base, int ns, int k, int acc)
{
    double u[64][V], du[64], g[9];
    for (int c0 = 0; c0 < pl->C; c0 += V) {
        int nc = pl->C - c0 < V ? pl->C - c0 : V;
        for (int xi = 0; xi < pl->NX; xi++) {
            for (int c = 0; c < nc; c++)
                u[xi][c] = 0.0;
            for (int i = 0; i < ns; i++) {
                const float *p =
                    base + (size_t)i * pl->slot + pl->du + ((size_t)xi * pl->Kp + k) * pl->Cp + c0;
                for (int c = 0; c < nc; c++)
                    u[xi][c] += p[c];
            }
        }
        for (int c = 0; c < nc; c++) {
            for (int xi = 0; xi < pl->NX; xi++)
                du[xi] = u[xi][c];
            ops->filter(du, g);
            float *o = dw + ((size_t)k * pl->C + c0 + c) * 9;
            for (int i = 0; i < 9; i++)
                o[i] = acc ? (float)(o[i] + g[i]) : (float)g[i];
        }
    }
}

void mge__wdw_run(const struct mge__wdw_plan *pl, const struct mge__wdw_ops *ops, float *dw,
                  const float *dout, const float *inp, void *scratch, int acc)
{
    float *base = aligned(scratch);
    int ngroups = (pl->N + pl->G - 1) / pl->G;
    int nt = mge_cpu_threads();
    nt = nt < pl->slots ? nt : pl->slots;
    nt = nt < ngroups ? nt : ngroups;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *sl = base + (size_t)omp_get_thread_num() * pl->slot;
        int ns = omp_get_num_threads();
        /* the pads of the channels-last planes, and the partial */
        memset(sl, 0, pl->vt * sizeof(float));
        memset(sl + pl->du, 0, (pl->slot - pl->du) * sizeof(float));
#pragma omp for schedule(static)
        for (int i = 0; i < ngroups; i++) {
            int n0 = i * pl->G, n1 = n0 + pl->G < pl->N ? n0 + pl->G : pl->N;
            group(pl, ops, sl, dout, inp, n0, n1);
        }
        /* implicit barrier: all partials complete */
#pragma omp for schedule(static)
        for (int k = 0; k < pl->K; k++)
            filter_grad(pl, ops, dw, base, ns, k, acc);
    }
}
