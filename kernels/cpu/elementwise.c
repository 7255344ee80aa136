/* elementwise.c: CPU activations, bias add, broadcasting binary ops and their reductions. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_int.h"

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

static inline float act_forward(int op, float x)
{
    switch (op) {
    case MGE_CPU_RELU:
        return x > 0.0f ? x : 0.0f;
    case MGE_CPU_GELU:
        return 0.5f * x * (1.0f + mge__tanhf(GELU_K * (x + GELU_C * x * x * x)));
    case MGE_CPU_TANH:
        return tanhf(x);
    case MGE_CPU_SIGMOID:
        return 1.0f / (1.0f + expf(-x));
    default:
        return x;
    }
}

static inline float act_grad(int op, float x, float y)
{
    switch (op) {
    case MGE_CPU_RELU:
        return y > 0.0f ? 1.0f : 0.0f;
    case MGE_CPU_GELU: {
        float u = GELU_K * (x + GELU_C * x * x * x);
        float t = mge__tanhf(u); /* vectorises: GELU was 22 ns an element with tanhf */
        float du = GELU_K * (1.0f + 3.0f * GELU_C * x * x);
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    }
    case MGE_CPU_TANH:
        return 1.0f - y * y;
    case MGE_CPU_SIGMOID:
        return y * (1.0f - y);
    default:
        return 1.0f;
    }
}

/*
 * The op is tested once outside each loop so that every loop body is branch-free; gcc -O2 does
 * not unswitch loops by itself.
 */
MGE__CPU_CLONES
void mge_cpu_unary_forward(int op, float *out, const float *inp, int64_t n)
{
    switch (op) {
    case MGE_CPU_RELU:
#pragma omp parallel for schedule(static) if (n > MGE__PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
        break;
    case MGE_CPU_GELU:
#pragma omp parallel for schedule(static) if (n > MGE__PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            out[i] = act_forward(MGE_CPU_GELU, inp[i]);
        break;
    case MGE_CPU_TANH:
#pragma omp parallel for schedule(static) if (n > MGE__PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            out[i] = tanhf(inp[i]);
        break;
    case MGE_CPU_SIGMOID:
#pragma omp parallel for schedule(static) if (n > MGE__PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            out[i] = act_forward(MGE_CPU_SIGMOID, inp[i]);
        break;
    default:
        if (out != inp)
            memmove(out, inp, (size_t)n * sizeof(float));
        break;
    }
}

MGE__CPU_CLONES
void mge_cpu_unary_backward(int op, float *dinp, const float *dout, const float *inp,
                            const float *out, int64_t n, int acc)
{
    switch (op) {
    case MGE_CPU_RELU:
        if (acc) {
#pragma omp parallel for schedule(static) if (n > MGE__PAR_MIN)
            for (int64_t i = 0; i < n; i++)
                dinp[i] += out[i] > 0.0f ? dout[i] : 0.0f;
        } else {
#pragma omp parallel for schedule(static) if (n > MGE__PAR_MIN)
            for (int64_t i = 0; i < n; i++)
                dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
        }
        break;
    case MGE_CPU_GELU:
#pragma omp parallel for schedule(static) if (n > MGE__PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            dinp[i] = (acc ? dinp[i] : 0.0f) + dout[i] * act_grad(MGE_CPU_GELU, inp[i], 0.0f);
        break;
    case MGE_CPU_TANH:
    case MGE_CPU_SIGMOID:
#pragma omp parallel for schedule(static) if (n > MGE__PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            dinp[i] = (acc ? dinp[i] : 0.0f) + dout[i] * act_grad(op, 0.0f, out[i]);
        break;
    default:
        if (acc)
            mge_cpu_axpy(dinp, dout, 1.0f, n);
        else
            memcpy(dinp, dout, (size_t)n * sizeof(float));
        break;
    }
}

MGE__CPU_CLONES
void mge_cpu_bias_act_forward(int act, float *out, const float *inp, const float *bias,
                              int64_t rows, int64_t cols)
{
#pragma omp parallel for schedule(static) if (rows * cols > MGE__PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float *o = out + r * cols;
        const float *x = inp + r * cols;
        if (bias) {
            for (int64_t c = 0; c < cols; c++)
                o[c] = x[c] + bias[c];
            x = o;
        }
        switch (act) {
        case MGE_CPU_RELU:
            for (int64_t c = 0; c < cols; c++)
                o[c] = x[c] > 0.0f ? x[c] : 0.0f;
            break;
        case MGE_CPU_GELU:
        case MGE_CPU_TANH:
        case MGE_CPU_SIGMOID:
            for (int64_t c = 0; c < cols; c++)
                o[c] = act_forward(act, x[c]);
            break;
        default:
            if (o != x)
                memmove(o, x, (size_t)cols * sizeof(float));
            break;
        }
    }
}

MGE__CPU_CLONES
void mge_cpu_bias_backward(float *dbias, const float *dout, int64_t rows, int64_t cols, int acc)
{
    /* Column blocks in parallel, rows in order within each: the sum order never depends on threads.
     */
    enum { BLK = 64 };
    int64_t nblk = (cols + BLK - 1) / BLK;
#pragma omp parallel for schedule(static) if (rows * cols > MGE__PAR_MIN && nblk > 1)
    for (int64_t b = 0; b < nblk; b++) {
        int64_t c0 = b * BLK, c1 = c0 + BLK < cols ? c0 + BLK : cols;
        float s[BLK];
        for (int64_t c = c0; c < c1; c++)
            s[c - c0] = acc ? dbias[c] : 0.0f;
        for (int64_t r = 0; r < rows; r++) {
            const float *d = dout + r * cols;
            for (int64_t c = c0; c < c1; c++)
                s[c - c0] += d[c];
        }
        for (int64_t c = c0; c < c1; c++)
            dbias[c] = s[c - c0];
    }
}

/* Offsets into a and b of the first element of outer row @o (all dims but the last). */
static void row_offsets(int64_t o, const int64_t *shape, int ndim, const int64_t *sa,
                        const int64_t *sb, int64_t *oa, int64_t *ob)
{
    int64_t a = 0, b = 0;
    for (int d = ndim - 2; d >= 0; d--) {
        int64_t i = o % shape[d];
        o /= shape[d];
        a += i * sa[d];
        if (sb)
            b += i * sb[d];
    }
    *oa = a;
    *ob = b;
}

#define BINARY_LOOP(EXPR)                                                                          \
    do {                                                                                           \
        if (as == 1 && bs == 1)                                                                    \
            for (int64_t j = 0; j < inner; j++) {                                                  \
                float x = pa[j], y = pb[j];                                                        \
                po[j] = (EXPR);                                                                    \
            }                                                                                      \
        else                                                                                       \
            for (int64_t j = 0; j < inner; j++) {                                                  \
                float x = pa[j * as], y = pb[j * bs];                                              \
                po[j] = (EXPR);                                                                    \
            }                                                                                      \
    } while (0)

#define MGE_CPU_BINARY_MAX_DIMS 8
#define BINARY_ROW 4096 /* floats from which a row is long enough */

MGE__CPU_CLONES
void mge_cpu_binary_forward(int op, float *out, const float *a, const int64_t *astride,
                            const float *b, const int64_t *bstride, const int64_t *shape, int ndim)
{
    if (ndim <= 0) {
        static const int64_t one = 1, zero = 0;
        shape = &one;
        astride = bstride = &zero;
        ndim = 1;
    }
    /*
     * Trailing dims that a and b both walk contiguously become one row, up to BINARY_ROW
     * floats: a residual add over (N, C, 28, 28) ran 28-float rows, each behind three integer
     * divisions in row_offsets (1.1 G floats/s)
     */
    int64_t rshape[MGE_CPU_BINARY_MAX_DIMS], ra[MGE_CPU_BINARY_MAX_DIMS],
        rb[MGE_CPU_BINARY_MAX_DIMS];
    if (ndim <= MGE_CPU_BINARY_MAX_DIMS) {
        memcpy(rshape, shape, (size_t)ndim * sizeof(*shape));
        memcpy(ra, astride, (size_t)ndim * sizeof(*astride));
        memcpy(rb, bstride, (size_t)ndim * sizeof(*bstride));
        while (ndim > 1 && rshape[ndim - 1] < BINARY_ROW &&
               ra[ndim - 2] == ra[ndim - 1] * rshape[ndim - 1] &&
               rb[ndim - 2] == rb[ndim - 1] * rshape[ndim - 1]) {
            rshape[ndim - 2] *= rshape[ndim - 1];
            ra[ndim - 2] = ra[ndim - 1]; /* the merged dim steps as the inner one did */
            rb[ndim - 2] = rb[ndim - 1];
            ndim--;
        }
        shape = rshape, astride = ra, bstride = rb;
    }
    int64_t inner = shape[ndim - 1], outer = 1;
    for (int d = 0; d < ndim - 1; d++)
        outer *= shape[d];
    int64_t as = astride[ndim - 1], bs = bstride[ndim - 1];
#pragma omp parallel for schedule(static) if (outer * inner > MGE__PAR_MIN && outer > 1)
    for (int64_t o = 0; o < outer; o++) {
        int64_t oa, ob;
        row_offsets(o, shape, ndim, astride, bstride, &oa, &ob);
        const float *pa = a + oa, *pb = b + ob;
        float *po = out + o * inner;
        switch (op) {
        case MGE_CPU_ADD:
            BINARY_LOOP(x + y);
            break;
        case MGE_CPU_SUB:
            BINARY_LOOP(x - y);
            break;
        case MGE_CPU_MUL:
            BINARY_LOOP(x * y);
            break;
        case MGE_CPU_DIV:
            BINARY_LOOP(x / y);
            break;
        default:
            break;
        }
    }
}

/*
 * Rows of @inp (the last dim) go to @out in index order, so every output element sums its
 * inputs in the same order whatever the thread count; only dim 0, when it is not summed over,
 * is split between threads, since then threads write disjoint parts of @out.
 */
MGE__CPU_CLONES
void mge_cpu_sum_to(float *out, const int64_t *ostride, const float *inp, const int64_t *shape,
                    int ndim, int acc)
{
    if (ndim <= 0) {
        *out = acc ? *out + *inp : *inp;
        return;
    }
    if (!acc) {
        /* @out is the contiguous tensor these strides describe */
        int64_t n = 1;
        for (int d = 0; d < ndim; d++)
            n += (shape[d] - 1) * ostride[d];
        memset(out, 0, (size_t)n * sizeof(float));
    }
    int64_t inner = shape[ndim - 1], outer = 1;
    for (int d = 0; d < ndim - 1; d++)
        outer *= shape[d];
    int64_t os = ostride[ndim - 1];
    int64_t per0 = ndim > 1 ? outer / shape[0] : 1;
    int64_t n0 = ndim > 1 ? shape[0] : 1;
    int split = ndim > 1 && ostride[0] != 0 && outer * inner > MGE__PAR_MIN;
#pragma omp parallel for schedule(static) if (split)
    for (int64_t i0 = 0; i0 < n0; i0++) {
        for (int64_t o = i0 * per0; o < (i0 + 1) * per0; o++) {
            int64_t oo, unused;
            row_offsets(o, shape, ndim, ostride, NULL, &oo, &unused);
            const float *pi = inp + o * inner;
            float *po = out + oo;
            if (os == 0) {
                float s = 0.0f;
                for (int64_t j = 0; j < inner; j++)
                    s += pi[j];
                *po += s;
            } else if (os == 1) {
                for (int64_t j = 0; j < inner; j++)
                    po[j] += pi[j];
            } else {
                for (int64_t j = 0; j < inner; j++)
                    po[j * os] += pi[j];
            }
        }
    }
}

MGE__CPU_CLONES
void mge_cpu_scale(float *out, const float *inp, float s, int64_t n)
{
#pragma omp parallel for schedule(static) if (n > MGE__PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        out[i] = s * inp[i];
}

MGE__CPU_CLONES
void mge_cpu_axpy(float *y, const float *x, float a, int64_t n)
{
#pragma omp parallel for schedule(static) if (n > MGE__PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}
