/*
 * conv_winograd4_dw.c: Winograd F(4x4, 3x3) weight gradient of 3x3, stride-1, pad-1 convs (the
 * tile transforms; conv_winograd_dw.c runs them, the GEMMs and the threads); conv.c picks it or
 * F(2x2)'s (conv_winograd.c) per shape.
 *
 * Each 4x4 block of outputs comes from a 6x6 window of the input (stride 4): V = B^T d B, dM =
 * A dY A^T (6x6 from the tile's 4x4 output gradient, zero past the image), dU = sum over tiles
 * of dM .* V: 36 GEMMs over tiles, 36 multiplications per 16 outputs and channel pair where
 * F(2x2) does 64 and the direct dw 144. dw = G^T dU G runs in double at the end. Lavin and Gray's
 * points 0, +-1, +-2: per direction, V's entries reach 10x the input's (B^T's rows sum to 10 in
 * magnitude) and dM's 15x the output gradient's (A's), which G's 1/6 and 1/24 take back at the
 * end; the sums over tiles round about 7x more than F(2x2)'s, within every backend's dw bound
 * (measured in docs/benchmarks.md, "Winograd F(4x4, 3x3) weight gradient").
 */
#include <string.h>

#include "kernels/cpu/conv_tile_int.h"
#include "kernels/cpu/conv_winograd_dw_int.h"

#define KB MGE__WDW_KB
#define MIN_TILES 64 /* tiles a work item should have: images are grouped up to this */

/* o = B^T x for a column of 6 (F(4x4, 3x3)'s input transform, one direction) */
static inline __attribute__((always_inline)) void bt6(vf o[6], const vf x[6])
{
    vf t1 = x[4] - 4.0f * x[2], t2 = x[3] - 4.0f * x[1];
    vf t3 = x[4] - x[2], t4 = 2.0f * (x[3] - x[1]);
    o[0] = 4.0f * x[0] - 5.0f * x[2] + x[4];
    o[1] = t1 + t2, o[2] = t1 - t2, o[3] = t3 + t4, o[4] = t3 - t4;
    o[5] = 4.0f * x[1] - 5.0f * x[3] + x[5];
}

/* o = A y for a column of 4 (the output transform's adjoint, one direction): 6 values */
static inline __attribute__((always_inline)) void a6(mge__vkb o[6], const mge__vkb y[4])
{
    mge__vkb a = y[0] + y[2], b = y[1] + y[3];
    mge__vkb c = y[0] + 4.0f * y[2], d = 2.0f * y[1] + 8.0f * y[3];
    o[0] = y[0], o[1] = a + b, o[2] = a - b, o[3] = c + d, o[4] = c - d, o[5] = y[3];
}

/* vt[xi][t0 + t][c] = (B^T d B)[xi] for the tiles t of one image, xp as the plan says */
MGE__CPU_CLONES
static void input_tiles(const struct mge__wdw_plan *pl, float *restrict vt,
                        const float *restrict xp, int t0)
{
    size_t xs = (size_t)pl->Tg * pl->Cp, rs = (size_t)pl->Wx * pl->Cp;
    for (int ty = 0; ty < pl->TH; ty++)
        for (int tx = 0; tx < pl->TW; tx++) {
            const float *x0 = xp + (size_t)(4 * ty) * rs + (size_t)(4 * tx) * pl->Cp;
            float *v0 = vt + (size_t)(t0 + ty * pl->TW + tx) * pl->Cp;
            for (int c0 = 0; c0 < pl->Cp; c0 += V) {
                vf e[6][6];
#pragma GCC unroll 6
                for (int r = 0; r < 6; r++) {
                    vf d[6];
#pragma GCC unroll 6
                    for (int s = 0; s < 6; s++)
                        d[s] = ld(x0 + r * rs + (size_t)s * pl->Cp + c0);
                    bt6(e[r], d);
                }
#pragma GCC unroll 6
                for (int j = 0; j < 6; j++) {
                    vf col[6] = {e[0][j], e[1][j], e[2][j], e[3][j], e[4][j], e[5][j]}, o[6];
                    bt6(o, col);
#pragma GCC unroll 6
                    for (int i = 0; i < 6; i++)
                        memcpy(v0 + (size_t)(6 * i + j) * xs + c0, &o[i], sizeof(vf));
                }
            }
        }
}

/* mt[xi][k / KB][t0 + t][k % KB] = (A dY A^T)[xi] for the tiles t of one image, dyp as the plan
 * says: a block of KB channels at a time, as F(2x2)'s */
MGE__CPU_CLONES
static void output_tiles(const struct mge__wdw_plan *pl, float *restrict mt,
                         const float *restrict dyp, int t0)
{
    size_t bs = pl->mbs, xs = (size_t)(pl->Kp / KB) * bs, rs = (size_t)(4 * pl->TW) * pl->Kp;
    for (int ty = 0; ty < pl->TH; ty++)
        for (int tx = 0; tx < pl->TW; tx++) {
            const float *y0 = dyp + (size_t)(4 * ty) * rs + (size_t)(4 * tx) * pl->Kp;
            float *m0 = mt + (size_t)(t0 + ty * pl->TW + tx) * KB;
            for (int k0 = 0; k0 < pl->Kp; k0 += KB) {
                mge__vkb e[4][6];
#pragma GCC unroll 4
                for (int p = 0; p < 4; p++) {
                    mge__vkb y[4];
#pragma GCC unroll 4
                    for (int q = 0; q < 4; q++)
                        memcpy(&y[q], y0 + p * rs + (size_t)q * pl->Kp + k0, sizeof(y[q]));
                    a6(e[p], y);
                }
#pragma GCC unroll 6
                for (int j = 0; j < 6; j++) {
                    mge__vkb col[4] = {e[0][j], e[1][j], e[2][j], e[3][j]}, o[6];
                    a6(o, col);
#pragma GCC unroll 6
                    for (int i = 0; i < 6; i++)
                        memcpy(m0 + (size_t)(6 * i + j) * xs + (size_t)(k0 / KB) * bs, &o[i],
                               sizeof(mge__vkb));
                }
            }
        }
}

/* o[0..2] = G^T u for u[0], u[st], ..., u[5 st] (products with 1/6 and 1/24, not quotients:
 * dividing took a tenth of a 64x7x7 dw) */
static void gt6(double o[3], const double *u, int st)
{
    const double s6 = 1.0 / 6.0, s12 = 1.0 / 12.0, s24 = 1.0 / 24.0;
    double a = u[st] + u[2 * st], b = u[3 * st] + u[4 * st];
    o[0] = 0.25 * u[0] - a * s6 + b * s24;
    o[1] = (u[2 * st] - u[st]) * s6 + (u[3 * st] - u[4 * st]) * s12;
    o[2] = (b - a) * s6 + u[5 * st];
}

/* g (3, 3) = G^T du G for du (6, 6), in double */
static void filter(const double *du, double *g)
{
    double t[3][6], c[6];
    for (int j = 0; j < 6; j++) {
        double o[3];
        gt6(o, du + j, 6);
        t[0][j] = o[0], t[1][j] = o[1], t[2][j] = o[2];
    }
    for (int r = 0; r < 3; r++) {
        memcpy(c, t[r], sizeof(c));
        gt6(g + 3 * r, c, 1);
    }
}

static const struct mge__wdw_ops ops = {input_tiles, output_tiles, filter};

size_t mge__conv_winograd4_dw_scratch_bytes(const struct mge_cpu_conv *cv)
{
    if (!mge__conv_winograd_ok(cv))
        return 0;
    struct mge__wdw_plan pl;
    mge__wdw_plan_init(&pl, cv, 4, MIN_TILES);
    return pl.total * sizeof(float) + 64;
}

int mge__conv_winograd4_backward_weights(const struct mge_cpu_conv *cv, float *dw,
                                         const float *dout, const float *inp, void *scratch,
                                         int acc)
{
    if (!mge__conv_winograd_ok(cv))
        return -1;
    struct mge__wdw_plan pl;
    mge__wdw_plan_init(&pl, cv, 4, MIN_TILES);
    mge__wdw_run(&pl, &ops, dw, dout, inp, scratch, acc);
    return 0;
}
