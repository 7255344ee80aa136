/*
 * conv_winograd_dw_int.h: what the Winograd weight gradients F(2x2, 3x3) (conv_winograd.c) and
 * F(4x4, 3x3) (conv_winograd4_dw.c) share (conv_winograd_dw.c): the plan of a thread's scratch,
 * the channels-last transposes, the GEMMs that reduce over tiles and the threaded driver. Each
 * file brings its own tile transforms and filter transform (struct mge__wdw_ops).
 *
 * The forward is y = A^T [U .* V] A per tile with U = G g G^T and V = B^T d B, so the weight
 * gradient is its adjoint: dU[xi][k][c] = sum over tiles of dM[xi][k] * V[xi][c] with
 * dM = A dY A^T (dY the tile's m x m output gradient, zero past the image), then dw = G^T dU G:
 * NX = (m + 2)^2 GEMMs (K, tiles) x (tiles, C) reducing over tiles. The reduction runs along
 * tiles, so lanes hold channels: each image and its output gradient are transposed to channels
 * last first, and the transforms work on whole vectors of channels per tile. A work item is a
 * group of whole images; each thread adds its items into its own dU in item order, and the
 * partials are added in thread order, in double, before the (double) filter transform: the same
 * bits for the same thread count.
 */
#ifndef MGE_KERNELS_CPU_CONV_WINOGRAD_DW_INT_H
#define MGE_KERNELS_CPU_CONV_WINOGRAD_DW_INT_H

#include <stddef.h>

#include "kernels/cpu/cpu_int.h"

#define MGE__WDW_KB 8 /* output channels per block of dM (the GEMMs' broadcast operand) */

/* A block of MGE__WDW_KB output channels: half a 16-lane vector (what AVX-512 machines split
 * vectors into anyway) */
typedef float mge__vkb __attribute__((vector_size(MGE__WDW_KB * sizeof(float))));

/* One weight gradient F(m x m, 3x3) of a 3x3 stride-1 pad-1 conv */
struct mge__wdw_plan {
    int C, K, H, W, N;
    int m, NX;      /* output tile m x m, (m + 2)^2 positions of a transformed tile */
    int TH, TW, NT; /* tile rows, columns, tiles per image */
    int Cp, Kp;     /* C and K rounded up to 16 (channels are the lanes) */
    int Wx;         /* padded input row, in positions: m * TW + 2 */
    int G, Tg;      /* images per work item, tiles of a full one */
    int slots;
    /* float offsets in each slot (stride @slot): the input image channels last, padded by one
     * (m TH + 2, Wx, Cp); the output gradient channels last, zero past H and W (m TH, m TW, Kp);
     * V (NX, Tg, Cp); dM (NX, Kp / KB, Tg, KB), blocks @mbs floats apart; the partial dU
     * (NX, Kp, Cp) */
    size_t mbs;
    size_t xp, dyp, vt, mt, du, slot, total;
};

/* The per-image transforms and the filter transform of one F(m x m, 3x3) */
struct mge__wdw_ops {
    /* vt[xi][t0 + t][c] = (B^T d B)[xi] for the tiles t of one image, xp as the plan says */
    void (*input_tiles)(const struct mge__wdw_plan *pl, float *vt, const float *xp, int t0);
    /* mt[xi][k / KB][t0 + t][k % KB] = (A dY A^T)[xi] for the tiles t of one image */
    void (*output_tiles)(const struct mge__wdw_plan *pl, float *mt, const float *dyp, int t0);
    /* g (3, 3) = G^T du G for du (m + 2, m + 2), in double */
    void (*filter)(const double *du, double *g);
};

/*
 * Fill @pl for @cv (3x3, stride 1, pad 1: the caller checks) with m x m output tiles, work items
 * of whole images grouped up to @min_tiles tiles. Scratch: pl->total floats (+ 64 bytes).
 */
void mge__wdw_plan_init(struct mge__wdw_plan *pl, const struct mge_cpu_conv *cv, int m,
                        int min_tiles);

/*
 * dw (+)= the weight gradient (+ when @acc) of dout against inp through @ops, in pl->slots
 * slots of @scratch (pl->total floats + 64 bytes): the same bits for the same thread count.
 * Thread: any, outside a parallel region (it forks its own).
 */
void mge__wdw_run(const struct mge__wdw_plan *pl, const struct mge__wdw_ops *ops, float *dw,
                  const float *dout, const float *inp, void *scratch, int acc);

/* conv_winograd4_dw.c: F(4x4, 3x3)'s weight gradient, as mge__conv_winograd_backward_weights
 * (0, or -1 with dw untouched for a conv it does not take; scratch bytes 0 then) */
size_t mge__conv_winograd4_dw_scratch_bytes(const struct mge_cpu_conv *cv);
int mge__conv_winograd4_backward_weights(const struct mge_cpu_conv *cv, float *dw,
                                         const float *dout, const float *inp, void *scratch,
                                         int acc);

/* conv.c: whether the Winograd weight gradient of @cv (where one runs) is F(4x4)'s */
int mge__conv_winograd_dw_is_f4(const struct mge_cpu_conv *cv);

#endif
