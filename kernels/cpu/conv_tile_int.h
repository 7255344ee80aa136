/*
 * conv_tile_int.h: the register-tiled inner kernel shared by conv_direct.c and conv_winograd.c
 * (16-lane GCC vectors; include only from files built with -Wno-psabi, see the Makefile).
 */
#ifndef MGE_KERNELS_CPU_CONV_TILE_INT_H
#define MGE_KERNELS_CPU_CONV_TILE_INT_H

#include <stdint.h>
#include <string.h>

#include "kernels/cpu/cpu_int.h"

#define V 16 /* lanes per vector */
typedef float vf __attribute__((vector_size(V * sizeof(float))));

/* One direct conv: input (C, H, W) padded by ph, pw into (C, Hp, Wp); output (K, P, Q). */
struct geo {
    int C, H, W, ph, pw;
    int K, R, S, P, Q;
    int Hp, Wp;
    int QV;     /* vectors per output row: ceil(Q / V) */
    int KB, Kp; /* output channels per block (weights are packed by it), K rounded up to KB */
    int flat;   /* planes as one row each (see conv_direct.c); then Wp = W + 2 * pw */
    int LW;     /* flat: floats per wide output plane, P * Wp rounded up to vectors */
};

static inline __attribute__((always_inline)) vf ld(const float *p)
{
    vf v;
    memcpy(&v, p, sizeof(v));
    return v;
}

/* p[0 .. n) (+)= v's first n lanes (n <= V; added to what is there when @acc) */
static inline __attribute__((always_inline)) void st_lanes(float *p, vf v, int n, int acc)
{
    if (n == V) {
        if (acc)
            v += ld(p);
        memcpy(p, &v, sizeof(v));
        return;
    }
    float t[V];
    memcpy(t, &v, sizeof(t));
    for (int i = 0; i < n; i++) /* a loop: memcpy of a variable size is a libc call */
        p[i] = acc ? p[i] + t[i] : t[i];
}

/*
 * One register tile: channels [k0, k0 + KB) at QB vectors of positions, the sum over c, r, s of
 * x[c * plane + r * Wp + s + j * V] * w[k][c][r][s] for r in [r0, r1), where @x points at the
 * tile's first position in channel 0, row 0 (rows: xp at output (p, q0); flat: xp + i0). Stored
 * at o[(k - k0) * ostride + j * V], the first @nvalid positions only, added to what is there when
 * @acc. KB and QB are constants at every call, so the accumulators live in registers once the
 * loops are unrolled.
 */
static inline __attribute__((always_inline)) void
conv_tile(const int KB, const int QB, const struct geo *g, float *o, size_t ostride, int nvalid,
          int acc, const float *x, const float *wp, const float *bias, int k0, int r0, int r1)
{
    vf a[16][3];
#pragma GCC unroll 16
    for (int kk = 0; kk < KB; kk++) {
        float b0 = bias && k0 + kk < g->K ? bias[k0 + kk] : 0.0f;
#pragma GCC unroll 3
        for (int j = 0; j < QB; j++)
            a[kk][j] = (vf){0} + b0;
    }
    const float *wk = wp + (size_t)(k0 / KB) * g->C * g->R * g->S * KB;
    size_t plane = (size_t)g->Hp * g->Wp;
    for (int c = 0; c < g->C; c++)
        for (int r = r0; r < r1; r++) {
            const float *row = x + c * plane + (size_t)r * g->Wp;
            const float *wr = wk + ((size_t)c * g->R + r) * g->S * KB;
            for (int s = 0; s < g->S; s++) {
                vf xv[3];
#pragma GCC unroll 3
                for (int j = 0; j < QB; j++)
                    xv[j] = ld(row + s + j * V);
                const float *wv = wr + (size_t)s * KB;
#pragma GCC unroll 16
                for (int kk = 0; kk < KB; kk++)
#pragma GCC unroll 3
                    for (int j = 0; j < QB; j++)
                        a[kk][j] += xv[j] * wv[kk];
            }
        }
#pragma GCC unroll 16
    for (int kk = 0; kk < KB; kk++) {
        if (k0 + kk >= g->K)
            break;
#pragma GCC unroll 3
        for (int j = 0; j < QB; j++) {
            int n = nvalid - j * V < V ? nvalid - j * V : V;
            /* a copy: no address of @a escapes, so it stays in registers */
            st_lanes(o + kk * ostride + j * V, a[kk][j], n, acc);
        }
    }
}

typedef int vi __attribute__((vector_size(V * sizeof(int))));

/* Lane l of the two-vector shuffles that swap the off-diagonal b x b sub-blocks of a pair */
#define TR_LO(b, l) ((l) & (b) ? V + (l) - (b) : (l))
#define TR_HI(b, l) ((l) & (b) ? V + (l) : (l) + (b))
#define TR_LANES(f, b)                                                                             \
    {                                                                                              \
        f(b, 0), f(b, 1), f(b, 2), f(b, 3), f(b, 4), f(b, 5), f(b, 6), f(b, 7), f(b, 8), f(b, 9),  \
            f(b, 10), f(b, 11), f(b, 12), f(b, 13), f(b, 14), f(b, 15)                             \
    }

/*
 * t[j][i] = t[i][j] in place for a V x V block held as V vectors: four rounds of two-vector
 * shuffles, each swapping the off-diagonal sub-blocks of one size (no scalar copies). The lane
 * tables are constants: built in a loop, GCC rebuilt them on the stack at every call.
 */
static inline __attribute__((always_inline)) void transpose16(vf t[V])
{
    static const vi lo[4] = {TR_LANES(TR_LO, 8), TR_LANES(TR_LO, 4), TR_LANES(TR_LO, 2),
                             TR_LANES(TR_LO, 1)};
    static const vi hi[4] = {TR_LANES(TR_HI, 8), TR_LANES(TR_HI, 4), TR_LANES(TR_HI, 2),
                             TR_LANES(TR_HI, 1)};
#pragma GCC unroll 4
    for (int i = 0, b = V / 2; i < 4; i++, b /= 2)
#pragma GCC unroll 16
        for (int r = 0; r < V; r++)
            if (!(r & b)) {
                vf a = t[r], c = t[r + b];
                t[r] = __builtin_shuffle(a, c, lo[i]);
                t[r + b] = __builtin_shuffle(a, c, hi[i]);
            }
}

/*
 * dyt (PQ, K) = dy (K, PQ) transposed, K a multiple of V: V x V blocks transposed in registers
 * (transpose16), the last PQ % V pixels one by one. Scalar copies took a fifth of a 16x28x28 dw.
 * Inlined into each caller's target clone.
 */
static inline __attribute__((always_inline)) void
transpose_pixels(float *restrict dyt, const float *restrict dy, int K, size_t PQ)
{
    size_t i0 = 0;
    for (; i0 + V <= PQ; i0 += V)
        for (int k0 = 0; k0 < K; k0 += V) {
            vf t[V];
#pragma GCC unroll 16
            for (int r = 0; r < V; r++)
                t[r] = ld(dy + (size_t)(k0 + r) * PQ + i0);
            transpose16(t);
#pragma GCC unroll 16
            for (int j = 0; j < V; j++)
                memcpy(dyt + (i0 + j) * K + k0, &t[j], sizeof(vf));
        }
    for (int k = 0; k < K; k++)
        for (size_t i = i0; i < PQ; i++)
            dyt[i * K + k] = dy[(size_t)k * PQ + i];
}

/* The first 64-byte boundary in @scratch (callers size scratch with 64 bytes to spare) */
static inline float *aligned(void *scratch)
{
    return (float *)(((uintptr_t)scratch + 63) / 64 * 64);
}

#endif
