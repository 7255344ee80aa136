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

void mge_cpu_maxpool_forward(const struct mge_cpu_pool *pl, float *out, const float *inp)
{
    int64_t planes = (int64_t)pl->N * pl->C, HW = (int64_t)pl->H * pl->W;
    int64_t PQ = (int64_t)pl->P * pl->Q;
#pragma omp parallel for schedule(static) if (planes * HW > MGE__PAR_MIN)
    for (int64_t i = 0; i < planes; i++) {
        const float *x = inp + i * HW;
        float *y = out + i * PQ;
        for (int p = 0; p < pl->P; p++)
            for (int q = 0; q < pl->Q; q++)
                y[p * pl->Q + q] = x[argmax_window(pl, x, p, q)];
    }
}

void mge_cpu_maxpool_backward(const struct mge_cpu_pool *pl, float *dinp, const float *dout,
                              const float *inp, int acc)
{
    int64_t planes = (int64_t)pl->N * pl->C, HW = (int64_t)pl->H * pl->W;
    int64_t PQ = (int64_t)pl->P * pl->Q;
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
