/* pool.c: CPU max and average pooling over NCHW planes, forward and backward. */
#include <string.h>

#include "kernels/cpu/cpu_int.h"

int mge_cpu_pool_init(struct mge_cpu_pool *pl)
{
    if (pl->N <= 0 || pl->C <= 0 || pl->H <= 0 || pl->W <= 0 || pl->R <= 0 || pl->S <= 0 ||
        pl->stride <= 0 || pl->pad < 0 || pl->pad >= pl->R || pl->pad >= pl->S)
        return -1;
    if (pl->H + 2 * pl->pad < pl->R || pl->W + 2 * pl->pad < pl->S)
        return -1;
    pl->P = (pl->H + 2 * pl->pad - pl->R) / pl->stride + 1;
    pl->Q = (pl->W + 2 * pl->pad - pl->S) / pl->stride + 1;
    return 0;
}

/* The in-bounds part [h0, h1) x [w0, w1) of output (p, q)'s window. */
static void window(const struct mge_cpu_pool *pl, int p, int q, int *h0, int *h1, int *w0, int *w1)
{
    int hs = p * pl->stride - pl->pad, ws = q * pl->stride - pl->pad;
    *h0 = hs < 0 ? 0 : hs;
    *w0 = ws < 0 ? 0 : ws;
    *h1 = hs + pl->R < pl->H ? hs + pl->R : pl->H;
    *w1 = ws + pl->S < pl->W ? ws + pl->S : pl->W;
}

/* Index in the plane of the window's first maximum (row-major scan), as PyTorch picks it. */
static int argmax_window(const struct mge_cpu_pool *pl, const float *x, int p, int q)
{
    int h0, h1, w0, w1;
    window(pl, p, q, &h0, &h1, &w0, &w1);
    int best = h0 * pl->W + w0;
    for (int h = h0; h < h1; h++)
        for (int w = w0; w < w1; w++)
            if (x[h * pl->W + w] > x[best])
                best = h * pl->W + w;
    return best;
}

/*
 * The common 2x2, stride 2, no padding window (LeNet, most CNNs): straight-line code the
 * compiler vectorises. Same comparisons in the same order as argmax_window, so results and
 * tie-breaking (the first maximum) are identical to the general path.
 */
static int pool_is_2x2(const struct mge_cpu_pool *pl)
{
    return pl->R == 2 && pl->S == 2 && pl->stride == 2 && pl->pad == 0 && pl->P * 2 <= pl->H &&
           pl->Q * 2 <= pl->W;
}

static void maxpool2x2_forward(const struct mge_cpu_pool *pl, float *out, const float *inp)
{
    int64_t planes = (int64_t)pl->N * pl->C, HW = (int64_t)pl->H * pl->W;
    int64_t PQ = (int64_t)pl->P * pl->Q;
    int W = pl->W, P = pl->P, Q = pl->Q;
#pragma omp parallel for schedule(static) if (planes * HW > 4 * MGE__PAR_MIN)
    for (int64_t i = 0; i < planes; i++) {
        const float *x = inp + i * HW;
        float *y = out + i * PQ;
        for (int p = 0; p < P; p++) {
            const float *r0 = x + 2 * p * W, *r1 = r0 + W;
            for (int q = 0; q < Q; q++) {
                float m = r0[2 * q];
                m = r0[2 * q + 1] > m ? r0[2 * q + 1] : m;
                m = r1[2 * q] > m ? r1[2 * q] : m;
                m = r1[2 * q + 1] > m ? r1[2 * q + 1] : m;
                y[p * Q + q] = m;
            }
        }
    }
}

static void maxpool2x2_backward(const struct mge_cpu_pool *pl, float *dinp, const float *dout,
                                const float *inp, int acc)
{
    int64_t planes = (int64_t)pl->N * pl->C, HW = (int64_t)pl->H * pl->W;
    int64_t PQ = (int64_t)pl->P * pl->Q;
    int W = pl->W, P = pl->P, Q = pl->Q;
#pragma omp parallel for schedule(static) if (planes * HW > 4 * MGE__PAR_MIN)
    for (int64_t i = 0; i < planes; i++) {
        const float *x = inp + i * HW, *dy = dout + i * PQ;
        float *dx = dinp + i * HW;
        if (!acc)
            memset(dx, 0, (size_t)HW * sizeof(float));
        for (int p = 0; p < P; p++) {
            const float *r0 = x + 2 * p * W, *r1 = r0 + W;
            float *d0 = dx + 2 * p * W, *d1 = d0 + W;
            for (int q = 0; q < Q; q++) {
                float m = r0[2 * q];
                float *at = &d0[2 * q];
                if (r0[2 * q + 1] > m) {
                    m = r0[2 * q + 1];
                    at = &d0[2 * q + 1];
                }
                if (r1[2 * q] > m) {
                    m = r1[2 * q];
                    at = &d1[2 * q];
                }
                if (r1[2 * q + 1] > m)
                    at = &d1[2 * q + 1];
                *at += dy[p * Q + q];
            }
        }
    }
}

MGE__CPU_CLONES
void mge_cpu_maxpool_forward(const struct mge_cpu_pool *pl, float *out, const float *inp)
{
    int64_t planes = (int64_t)pl->N * pl->C, HW = (int64_t)pl->H * pl->W;
    int64_t PQ = (int64_t)pl->P * pl->Q;
    if (pool_is_2x2(pl)) {
        maxpool2x2_forward(pl, out, inp);
        return;
    }
#pragma omp parallel for schedule(static) if (planes * HW > MGE__PAR_MIN)
    for (int64_t i = 0; i < planes; i++) {
        const float *x = inp + i * HW;
        float *y = out + i * PQ;
        for (int p = 0; p < pl->P; p++)
            for (int q = 0; q < pl->Q; q++)
                y[p * pl->Q + q] = x[argmax_window(pl, x, p, q)];
    }
}

MGE__CPU_CLONES
void mge_cpu_maxpool_backward(const struct mge_cpu_pool *pl, float *dinp, const float *dout,
                              const float *inp, int acc)
{
    int64_t planes = (int64_t)pl->N * pl->C, HW = (int64_t)pl->H * pl->W;
    int64_t PQ = (int64_t)pl->P * pl->Q;
    if (pool_is_2x2(pl)) {
        maxpool2x2_backward(pl, dinp, dout, inp, acc);
        return;
    }
#pragma omp parallel for schedule(static) if (planes * HW > MGE__PAR_MIN)
    for (int64_t i = 0; i < planes; i++) {
        const float *x = inp + i * HW, *dy = dout + i * PQ;
        float *dx = dinp + i * HW;
        if (!acc)
            memset(dx, 0, (size_t)HW * sizeof(float));
        for (int p = 0; p < pl->P; p++)
            for (int q = 0; q < pl->Q; q++)
                dx[argmax_window(pl, x, p, q)] += dy[p * pl->Q + q];
    }
}

MGE__CPU_CLONES
void mge_cpu_avgpool_forward(const struct mge_cpu_pool *pl, float *out, const float *inp)
{
    int64_t planes = (int64_t)pl->N * pl->C, HW = (int64_t)pl->H * pl->W;
    int64_t PQ = (int64_t)pl->P * pl->Q;
#pragma omp parallel for schedule(static) if (planes * HW > MGE__PAR_MIN)
    for (int64_t i = 0; i < planes; i++) {
        const float *x = inp + i * HW;
        float *y = out + i * PQ;
        for (int p = 0; p < pl->P; p++)
            for (int q = 0; q < pl->Q; q++) {
                int h0, h1, w0, w1;
                window(pl, p, q, &h0, &h1, &w0, &w1);
                float s = 0.0f;
                for (int h = h0; h < h1; h++)
                    for (int w = w0; w < w1; w++)
                        s += x[h * pl->W + w];
                y[p * pl->Q + q] = s / (float)((h1 - h0) * (w1 - w0));
            }
    }
}

MGE__CPU_CLONES
void mge_cpu_avgpool_backward(const struct mge_cpu_pool *pl, float *dinp, const float *dout,
                              int acc)
{
    int64_t planes = (int64_t)pl->N * pl->C, HW = (int64_t)pl->H * pl->W;
    int64_t PQ = (int64_t)pl->P * pl->Q;
#pragma omp parallel for schedule(static) if (planes * HW > MGE__PAR_MIN)
    for (int64_t i = 0; i < planes; i++) {
        const float *dy = dout + i * PQ;
        float *dx = dinp + i * HW;
        if (!acc)
            memset(dx, 0, (size_t)HW * sizeof(float));
        for (int p = 0; p < pl->P; p++)
            for (int q = 0; q < pl->Q; q++) {
                int h0, h1, w0, w1;
                window(pl, p, q, &h0, &h1, &w0, &w1);
                float g = dy[p * pl->Q + q] / (float)((h1 - h0) * (w1 - w0));
                for (int h = h0; h < h1; h++)
                    for (int w = w0; w < w1; w++)
                        dx[h * pl->W + w] += g;
            }
    }
}
