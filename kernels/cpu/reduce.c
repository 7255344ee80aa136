/* reduce.c: CPU axis sums, permutes and axis block copies (concat, slice) on contiguous tensors. */
#include <string.h>

#include "kernels/cpu/cpu_int.h"

enum { INNER_BLK = 256 };

/* Each (outer, inner block) task sums its rows in order: the result never depends on threads. */
MGE__CPU_CLONES
void mge_cpu_reduce_sum(float *out, const float *inp, int64_t outer, int64_t len, int64_t inner,
                        float scale)
{
    int64_t nblk = (inner + INNER_BLK - 1) / INNER_BLK, tasks = outer * nblk;
#pragma omp parallel for schedule(static) if (outer * len * inner > MGE__PAR_MIN && tasks > 1)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t o = t / nblk, i0 = (t % nblk) * INNER_BLK;
        int64_t i1 = i0 + INNER_BLK < inner ? i0 + INNER_BLK : inner;
        const float *x = inp + o * len * inner;
        float *y = out + o * inner;
        if (inner == 1) {
            float s = 0.0f;
            for (int64_t l = 0; l < len; l++)
                s += x[l];
            y[0] = scale * s;
            continue;
        }
        float s[INNER_BLK];
        for (int64_t i = i0; i < i1; i++)
            s[i - i0] = 0.0f;
        for (int64_t l = 0; l < len; l++)
            for (int64_t i = i0; i < i1; i++)
                s[i - i0] += x[l * inner + i];
        for (int64_t i = i0; i < i1; i++)
            y[i] = scale * s[i - i0];
    }
}

MGE__CPU_CLONES
void mge_cpu_reduce_sum_backward(float *dinp, const float *dout, int64_t outer, int64_t len,
                                 int64_t inner, float scale, int acc)
{
#pragma omp parallel for schedule(static) if (outer * len * inner > MGE__PAR_MIN)
    for (int64_t ol = 0; ol < outer * len; ol++) {
        const float *g = dout + (ol / len) * inner;
        float *d = dinp + ol * inner;
        if (acc)
            for (int64_t i = 0; i < inner; i++)
                d[i] += scale * g[i];
        else
            for (int64_t i = 0; i < inner; i++)
                d[i] = scale * g[i];
    }
}

MGE__CPU_CLONES
void mge_cpu_permute(float *out, const float *inp, const int64_t *shape, const int *perm, int ndim)
{
    if (ndim <= 0) {
        out[0] = inp[0];
        return;
    }
    int64_t istride[6], oshape[6], ist[6], s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        istride[d] = s;
        s *= shape[d];
    }
    for (int d = 0; d < ndim; d++) {
        oshape[d] = shape[perm[d]];
        ist[d] = istride[perm[d]]; /* input stride of output dim d */
    }
    int64_t inner = oshape[ndim - 1], rows = s / (inner > 0 ? inner : 1), is = ist[ndim - 1];
    if (inner <= 0)
        return;
#pragma omp parallel for schedule(static) if (s > MGE__PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t off = 0, rr = r;
        for (int d = ndim - 2; d >= 0; d--) {
            off += (rr % oshape[d]) * ist[d];
            rr /= oshape[d];
        }
        const float *x = inp + off;
        float *y = out + r * inner;
        for (int64_t i = 0; i < inner; i++)
            y[i] = x[i * is];
    }
}

MGE__CPU_CLONES
void mge_cpu_copy_axis(float *dst, int64_t dlen, int64_t dstart, const float *src, int64_t slen,
                       int64_t sstart, int64_t len, int64_t outer, int64_t inner, int acc)
{
    int64_t blk = len * inner;
#pragma omp parallel for schedule(static) if (outer * blk > MGE__PAR_MIN && outer > 1)
    for (int64_t o = 0; o < outer; o++) {
        float *d = dst + (o * dlen + dstart) * inner;
        const float *x = src + (o * slen + sstart) * inner;
        if (acc)
            for (int64_t i = 0; i < blk; i++)
                d[i] += x[i];
        else
            memcpy(d, x, (size_t)blk * sizeof(float));
    }
}
