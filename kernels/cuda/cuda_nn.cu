/*
 * cuda_nn.cu: the CUDA kernels of the elementwise, softmax, layout, pooling, normalisation,
 * embedding, dropout and attention ops (kernels/cuda/cuda.h). Written for plain correctness
 * against the CPU kernels: one thread per output element or row, every sum in a fixed order
 * (no float atomics), so results never depend on scheduling. NEEDSWORK: speed (tiled
 * attention, warp-level layernorm and batch-norm reductions).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common/err.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_int.h"

#define MAXD 6 /* MGE_MAX_DIMS */

/* Shapes and strides passed by value to the kernels that broadcast or permute. */
struct geom {
    int nd;
    int64_t shape[MAXD], sa[MAXD], sb[MAXD];
};

/* ---- elementwise ---- */

__global__ static void unary_forward_kernel(int op, float *out, const float *inp, int64_t n)
{
    MGE__CUDA_FOR(i, n)
    out[i] = mge__act_forward(op, inp[i]);
}

int mge_cuda_unary_forward(int op, float *out, const float *inp, int64_t n)
{
    if (n == 0)
        return MGE_OK;
    unary_forward_kernel<<<mge__cuda_grid(n), MGE__CUDA_THREADS>>>(op, out, inp, n);
    return mge__cuda_launched("unary_forward");
}

__global__ static void unary_backward_kernel(int op, float *dinp, const float *dout,
                                             const float *inp, const float *out, int64_t n, int acc)
{
    MGE__CUDA_FOR(i, n)
    {
        float x = inp ? inp[i] : 0.0f, y = out ? out[i] : 0.0f;
        float g = op == 1 ? (y > 0.0f ? dout[i] : 0.0f) : dout[i] * mge__act_grad(op, x, y);
        dinp[i] = acc ? dinp[i] + g : g;
    }
}

int mge_cuda_unary_backward(int op, float *dinp, const float *dout, const float *inp,
                            const float *out, int64_t n, int acc)
{
    if (n == 0)
        return MGE_OK;
    unary_backward_kernel<<<mge__cuda_grid(n), MGE__CUDA_THREADS>>>(op, dinp, dout, inp, out, n,
                                                                    acc);
    return mge__cuda_launched("unary_backward");
}

/* One thread per column, rows in order (the CPU's order within its column blocks). */
__global__ static void bias_backward_kernel(float *dbias, const float *dout, int64_t rows,
                                            int64_t cols, int acc)
{
    MGE__CUDA_FOR(c, cols)
    {
        float s = acc ? dbias[c] : 0.0f;
        for (int64_t r = 0; r < rows; r++)
            s += dout[r * cols + c];
        dbias[c] = s;
    }
}

int mge_cuda_bias_backward(float *dbias, const float *dout, int64_t rows, int64_t cols, int acc)
{
    if (cols == 0)
        return MGE_OK;
    bias_backward_kernel<<<mge__cuda_grid(cols), MGE__CUDA_THREADS>>>(dbias, dout, rows, cols, acc);
    return mge__cuda_launched("bias_backward");
}

__global__ static void binary_kernel(int op, float *out, const float *a, const float *b,
                                     struct geom g, int64_t n)
{
    MGE__CUDA_FOR(i, n)
    {
        int64_t r = i, oa = 0, ob = 0;
        for (int d = g.nd - 1; d >= 0; d--) {
            int64_t c = r % g.shape[d];
            r /= g.shape[d];
            oa += c * g.sa[d];
            ob += c * g.sb[d];
        }
        float x = a[oa], y = b[ob];
        out[i] = op == 0 ? x + y : op == 1 ? x - y : op == 2 ? x * y : x / y;
    }
}

int mge_cuda_binary_forward(int op, float *out, const float *a, const int64_t *astride,
                            const float *b, const int64_t *bstride, const int64_t *shape, int ndim)
{
    struct geom g = {1, {1}, {0}, {0}};
    int64_t n = 1;
    if (ndim > MAXD)
        return MGE_ERR(MGE_UNSUPPORTED, "binary op over %d dims (at most %d)", ndim, MAXD);
    if (ndim > 0) {
        g.nd = ndim;
        for (int d = 0; d < ndim; d++) {
            g.shape[d] = shape[d];
            g.sa[d] = astride[d];
            g.sb[d] = bstride[d];
            n *= shape[d];
        }
    }
    if (n == 0)
        return MGE_OK;
    binary_kernel<<<mge__cuda_grid(n), MGE__CUDA_THREADS>>>(op, out, a, b, g, n);
    return mge__cuda_launched("binary_forward");
}

/*
 * One thread per output element: the input elements that sum onto it, in input order (the
 * summed dims row-major); a summed last dim is summed on its own first and then added, as the
 * CPU does. g.sa holds the output strides (0 on summed dims).
 */
__global__ static void sum_to_kernel(float *out, const float *inp, struct geom g, int64_t n_out,
                                     int acc)
{
    MGE__CUDA_FOR(o, n_out)
    {
        int64_t base = 0, rows = 1, istride[MAXD], s = 1;
        for (int d = g.nd - 1; d >= 0; d--) {
            istride[d] = s;
            s *= g.shape[d];
        }
        for (int d = 0; d < g.nd; d++)
            if (g.sa[d] != 0)
                base += ((o / g.sa[d]) % g.shape[d]) * istride[d];
        for (int d = 0; d < g.nd - 1; d++)
            if (g.sa[d] == 0)
                rows *= g.shape[d];
        int last_summed = g.sa[g.nd - 1] == 0;
        int64_t inner = last_summed ? g.shape[g.nd - 1] : 1;
        float v = acc ? out[o] : 0.0f;
        for (int64_t r = 0; r < rows; r++) {
            int64_t rr = r, off = base;
            for (int d = g.nd - 2; d >= 0; d--)
                if (g.sa[d] == 0) {
                    off += (rr % g.shape[d]) * istride[d];
                    rr /= g.shape[d];
                }
            if (last_summed) {
                float t = 0.0f;
                for (int64_t j = 0; j < inner; j++)
                    t += inp[off + j];
                v += t;
            } else {
                v += inp[off];
            }
        }
        out[o] = v;
    }
}

int mge_cuda_sum_to(float *out, const int64_t *ostride, const float *inp, const int64_t *shape,
                    int ndim, int acc)
{
    struct geom g = {1, {1}, {0}, {0}};
    if (ndim > MAXD)
        return MGE_ERR(MGE_UNSUPPORTED, "sum_to over %d dims (at most %d)", ndim, MAXD);
    int64_t n_out = 1;
    if (ndim > 0) {
        g.nd = ndim;
        for (int d = 0; d < ndim; d++) {
            g.shape[d] = shape[d];
            g.sa[d] = ostride[d];
            n_out += (shape[d] - 1) * ostride[d];
        }
    }
    sum_to_kernel<<<mge__cuda_grid(n_out), MGE__CUDA_THREADS>>>(out, inp, g, n_out, acc);
    return mge__cuda_launched("sum_to");
}

__global__ static void scale_kernel(float *out, const float *inp, float s, int64_t n, int mode)
{
    MGE__CUDA_FOR(i, n)
    {
        if (mode == 0)
            out[i] = s * inp[i];
        else if (mode == 1)
            out[i] += s * inp[i];
        else
            out[i] = s;
    }
}

int mge_cuda_scale(float *out, const float *inp, float s, int64_t n)
{
    if (n == 0)
        return MGE_OK;
    scale_kernel<<<mge__cuda_grid(n), MGE__CUDA_THREADS>>>(out, inp, s, n, 0);
    return mge__cuda_launched("scale");
}

int mge_cuda_axpy(float *y, const float *x, float a, int64_t n)
{
    if (n == 0)
        return MGE_OK;
    scale_kernel<<<mge__cuda_grid(n), MGE__CUDA_THREADS>>>(y, x, a, n, 1);
    return mge__cuda_launched("axpy");
}

int mge_cuda_fill(float *out, float v, int64_t n)
{
    if (n == 0)
        return MGE_OK;
    scale_kernel<<<mge__cuda_grid(n), MGE__CUDA_THREADS>>>(out, NULL, v, n, 2);
    return mge__cuda_launched("fill");
}

/* ---- softmax: one block per row, fixed reduction trees ---- */

#define ROW_THREADS 256

__global__ static void softmax_forward_kernel(float *out, const float *inp, int64_t cols, int log)
{
    __shared__ float red[ROW_THREADS];
    const float *x = inp + (int64_t)blockIdx.x * cols;
    float *y = out + (int64_t)blockIdx.x * cols;
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += ROW_THREADS)
        m = fmaxf(m, x[j]);
    m = mge__block_reduce<float, ROW_THREADS>(m, red, 1);
    for (int64_t j = threadIdx.x; j < cols; j += ROW_THREADS)
        s += expf(x[j] - m);
    s = mge__block_reduce<float, ROW_THREADS>(s, red, 0);
    float lse = logf(s) + m, inv = 1.0f / s;
    for (int64_t j = threadIdx.x; j < cols; j += ROW_THREADS)
        y[j] = log ? x[j] - lse : expf(x[j] - m) * inv;
}

static int softmax_forward(float *out, const float *inp, int64_t rows, int64_t cols, int log)
{
    if (rows == 0 || cols == 0)
        return MGE_OK;
    softmax_forward_kernel<<<(unsigned)rows, ROW_THREADS>>>(out, inp, cols, log);
    return mge__cuda_launched(log ? "log_softmax_forward" : "softmax_forward");
}

int mge_cuda_softmax_forward(float *out, const float *inp, int64_t rows, int64_t cols)
{
    return softmax_forward(out, inp, rows, cols, 0);
}

int mge_cuda_log_softmax_forward(float *out, const float *inp, int64_t rows, int64_t cols)
{
    return softmax_forward(out, inp, rows, cols, 1);
}

__global__ static void softmax_backward_kernel(float *dinp, const float *dout, const float *out,
                                               int64_t cols, int log, int acc)
{
    __shared__ float red[ROW_THREADS];
    int64_t off = (int64_t)blockIdx.x * cols;
    const float *y = out + off, *dy = dout + off;
    float *dx = dinp + off;
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < cols; j += ROW_THREADS)
        s += log ? dy[j] : dy[j] * y[j];
    s = mge__block_reduce<float, ROW_THREADS>(s, red, 0);
    for (int64_t j = threadIdx.x; j < cols; j += ROW_THREADS) {
        float g = log ? dy[j] - expf(y[j]) * s : y[j] * (dy[j] - s);
        dx[j] = acc ? dx[j] + g : g;
    }
}

static int softmax_backward(float *dinp, const float *dout, const float *out, int64_t rows,
                            int64_t cols, int log, int acc)
{
    if (rows == 0 || cols == 0)
        return MGE_OK;
    softmax_backward_kernel<<<(unsigned)rows, ROW_THREADS>>>(dinp, dout, out, cols, log, acc);
    return mge__cuda_launched(log ? "log_softmax_backward" : "softmax_backward");
}

int mge_cuda_softmax_backward(float *dinp, const float *dout, const float *out, int64_t rows,
                              int64_t cols, int acc)
{
    return softmax_backward(dinp, dout, out, rows, cols, 0, acc);
}

int mge_cuda_log_softmax_backward(float *dinp, const float *dout, const float *out, int64_t rows,
                                  int64_t cols, int acc)
{
    return softmax_backward(dinp, dout, out, rows, cols, 1, acc);
}

/* ---- reductions and layout ---- */

/* One thread per (outer, inner) output: its @len values in order, as the CPU. */
__global__ static void reduce_sum_kernel(float *out, const float *inp, int64_t outer, int64_t len,
                                         int64_t inner, float scale)
{
    MGE__CUDA_FOR(k, outer * inner)
    {
        int64_t o = k / inner, i = k % inner;
        const float *x = inp + o * len * inner + i;
        float s = 0.0f;
        for (int64_t l = 0; l < len; l++)
            s += x[l * inner];
        out[k] = scale * s;
    }
}

int mge_cuda_reduce_sum(float *out, const float *inp, int64_t outer, int64_t len, int64_t inner,
                        float scale)
{
    if (outer * inner == 0)
        return MGE_OK;
    reduce_sum_kernel<<<mge__cuda_grid(outer * inner), MGE__CUDA_THREADS>>>(out, inp, outer, len,
                                                                            inner, scale);
    return mge__cuda_launched("reduce_sum");
}

__global__ static void reduce_sum_backward_kernel(float *dinp, const float *dout, int64_t outer,
                                                  int64_t len, int64_t inner, float scale, int acc)
{
    MGE__CUDA_FOR(k, outer * len * inner)
    {
        int64_t o = k / (len * inner), i = k % inner;
        float g = scale * dout[o * inner + i];
        dinp[k] = acc ? dinp[k] + g : g;
    }
}

int mge_cuda_reduce_sum_backward(float *dinp, const float *dout, int64_t outer, int64_t len,
                                 int64_t inner, float scale, int acc)
{
    int64_t n = outer * len * inner;
    if (n == 0)
        return MGE_OK;
    reduce_sum_backward_kernel<<<mge__cuda_grid(n), MGE__CUDA_THREADS>>>(dinp, dout, outer, len,
                                                                         inner, scale, acc);
    return mge__cuda_launched("reduce_sum_backward");
}

/* g.shape: the output's shape; g.sa: the input stride of each output dim. */
__global__ static void permute_kernel(float *out, const float *inp, struct geom g, int64_t n)
{
    MGE__CUDA_FOR(i, n)
    {
        int64_t r = i, off = 0;
        for (int d = g.nd - 1; d >= 0; d--) {
            off += (r % g.shape[d]) * g.sa[d];
            r /= g.shape[d];
        }
        out[i] = inp[off];
    }
}

int mge_cuda_permute(float *out, const float *inp, const int64_t *shape, const int *perm, int ndim)
{
    struct geom g = {1, {1}, {0}, {0}};
    int64_t istride[MAXD], s = 1;
    if (ndim > MAXD)
        return MGE_ERR(MGE_UNSUPPORTED, "permute over %d dims (at most %d)", ndim, MAXD);
    if (ndim <= 0)
        return mge_cuda_copy(out, inp, sizeof(float));
    for (int d = ndim - 1; d >= 0; d--) {
        istride[d] = s;
        s *= shape[d];
    }
    g.nd = ndim;
    for (int d = 0; d < ndim; d++) {
        g.shape[d] = shape[perm[d]];
        g.sa[d] = istride[perm[d]];
    }
    if (s == 0)
        return MGE_OK;
    permute_kernel<<<mge__cuda_grid(s), MGE__CUDA_THREADS>>>(out, inp, g, s);
    return mge__cuda_launched("permute");
}

__global__ static void copy_axis_kernel(float *dst, int64_t dlen, int64_t dstart, const float *src,
                                        int64_t slen, int64_t sstart, int64_t len, int64_t outer,
                                        int64_t inner, int acc)
{
    int64_t blk = len * inner;
    MGE__CUDA_FOR(k, outer * blk)
    {
        int64_t o = k / blk, i = k % blk;
        float *d = dst + (o * dlen + dstart) * inner + i;
        float x = src[(o * slen + sstart) * inner + i];
        *d = acc ? *d + x : x;
    }
}

int mge_cuda_copy_axis(float *dst, int64_t dlen, int64_t dstart, const float *src, int64_t slen,
                       int64_t sstart, int64_t len, int64_t outer, int64_t inner, int acc)
{
    int64_t n = outer * len * inner;
    if (n == 0)
        return MGE_OK;
    copy_axis_kernel<<<mge__cuda_grid(n), MGE__CUDA_THREADS>>>(dst, dlen, dstart, src, slen, sstart,
                                                               len, outer, inner, acc);
    return mge__cuda_launched("copy_axis");
}

/* ---- pooling: the CPU's windows, first maximum, in-bounds average ---- */

__device__ static void pool_window(struct mge_cuda_pool pl, int p, int q, int *h0, int *h1, int *w0,
                                   int *w1)
{
    int hs = p * pl.stride - pl.pad, ws = q * pl.stride - pl.pad;
    *h0 = hs < 0 ? 0 : hs;
    *w0 = ws < 0 ? 0 : ws;
    *h1 = hs + pl.R < pl.H ? hs + pl.R : pl.H;
    *w1 = ws + pl.S < pl.W ? ws + pl.S : pl.W;
}

__device__ static int pool_argmax(struct mge_cuda_pool pl, const float *x, int p, int q)
{
    int h0, h1, w0, w1;
    pool_window(pl, p, q, &h0, &h1, &w0, &w1);
    int best = h0 * pl.W + w0;
    for (int h = h0; h < h1; h++)
        for (int w = w0; w < w1; w++)
            if (x[h * pl.W + w] > x[best])
                best = h * pl.W + w;
    return best;
}

__global__ static void pool_forward_kernel(struct mge_cuda_pool pl, float *out, const float *inp,
                                           int max, int64_t n)
{
    MGE__CUDA_FOR(i, n)
    {
        int64_t plane = i / ((int64_t)pl.P * pl.Q);
        int p = (int)(i / pl.Q % pl.P), q = (int)(i % pl.Q);
        const float *x = inp + plane * pl.H * pl.W;
        if (max) {
            out[i] = x[pool_argmax(pl, x, p, q)];
            continue;
        }
        int h0, h1, w0, w1;
        pool_window(pl, p, q, &h0, &h1, &w0, &w1);
        float s = 0.0f;
        for (int h = h0; h < h1; h++)
            for (int w = w0; w < w1; w++)
                s += x[h * pl.W + w];
        out[i] = s / (float)((h1 - h0) * (w1 - w0));
    }
}

/* One thread per input cell: the windows that cover it, in the CPU's (p, q) order. */
__global__ static void pool_backward_kernel(struct mge_cuda_pool pl, float *dinp, const float *dout,
                                            const float *inp, int max, int acc, int64_t n)
{
    MGE__CUDA_FOR(i, n)
    {
        int64_t plane = i / ((int64_t)pl.H * pl.W);
        int h = (int)(i / pl.W % pl.H), w = (int)(i % pl.W), cell = h * pl.W + w;
        const float *x = inp ? inp + plane * pl.H * pl.W : NULL;
        const float *dy = dout + plane * pl.P * pl.Q;
        /* p covers h when p stride - pad <= h < p stride - pad + R */
        int plo = (h + pl.pad - pl.R + pl.stride) / pl.stride, phi = (h + pl.pad) / pl.stride;
        int qlo = (w + pl.pad - pl.S + pl.stride) / pl.stride, qhi = (w + pl.pad) / pl.stride;
        plo = h + pl.pad - pl.R + 1 <= 0 ? 0 : plo;
        qlo = w + pl.pad - pl.S + 1 <= 0 ? 0 : qlo;
        phi = phi < pl.P - 1 ? phi : pl.P - 1;
        qhi = qhi < pl.Q - 1 ? qhi : pl.Q - 1;
        float g = acc ? dinp[i] : 0.0f;
        for (int p = plo; p <= phi; p++)
            for (int q = qlo; q <= qhi; q++) {
                if (max) {
                    if (pool_argmax(pl, x, p, q) == cell)
                        g += dy[p * pl.Q + q];
                } else {
                    int h0, h1, w0, w1;
                    pool_window(pl, p, q, &h0, &h1, &w0, &w1);
                    g += dy[p * pl.Q + q] / (float)((h1 - h0) * (w1 - w0));
                }
            }
        dinp[i] = g;
    }
}

static int pool_forward(const struct mge_cuda_pool *pl, float *out, const float *inp, int max)
{
    int64_t n = (int64_t)pl->N * pl->C * pl->P * pl->Q;
    if (n == 0)
        return MGE_OK;
    pool_forward_kernel<<<mge__cuda_grid(n), MGE__CUDA_THREADS>>>(*pl, out, inp, max, n);
    return mge__cuda_launched(max ? "maxpool_forward" : "avgpool_forward");
}

static int pool_backward(const struct mge_cuda_pool *pl, float *dinp, const float *dout,
                         const float *inp, int max, int acc)
{
    int64_t n = (int64_t)pl->N * pl->C * pl->H * pl->W;
    if (n == 0)
        return MGE_OK;
    pool_backward_kernel<<<mge__cuda_grid(n), MGE__CUDA_THREADS>>>(*pl, dinp, dout, inp, max, acc,
                                                                   n);
    return mge__cuda_launched(max ? "maxpool_backward" : "avgpool_backward");
}

int mge_cuda_maxpool_forward(const struct mge_cuda_pool *pl, float *out, const float *inp)
{
    return pool_forward(pl, out, inp, 1);
}

int mge_cuda_maxpool_backward(const struct mge_cuda_pool *pl, float *dinp, const float *dout,
                              const float *inp, int acc)
{
    return pool_backward(pl, dinp, dout, inp, 1, acc);
}

int mge_cuda_avgpool_forward(const struct mge_cuda_pool *pl, float *out, const float *inp)
{
    return pool_forward(pl, out, inp, 0);
}

int mge_cuda_avgpool_backward(const struct mge_cuda_pool *pl, float *dinp, const float *dout,
                              int acc)
{
    return pool_backward(pl, dinp, dout, NULL, 0, acc);
}

/* ---- layer norm: one thread per row (forward, dinp), one per column (dw, db) ---- */

__global__ static void layernorm_forward_kernel(float *out, float *mean, float *rstd,
                                                const float *inp, const float *w, const float *b,
                                                int64_t rows, int64_t C, float eps)
{
    MGE__CUDA_FOR(r, rows)
    {
        const float *x = inp + r * C;
        float *y = out + r * C;
        float m = 0.0f, v = 0.0f;
        for (int64_t c = 0; c < C; c++)
            m += x[c];
        m /= (float)C;
        for (int64_t c = 0; c < C; c++)
            v += (x[c] - m) * (x[c] - m);
        float s = 1.0f / sqrtf(v / (float)C + eps);
        for (int64_t c = 0; c < C; c++)
            y[c] = (x[c] - m) * s * (w ? w[c] : 1.0f) + (b ? b[c] : 0.0f);
        if (mean)
            mean[r] = m;
        if (rstd)
            rstd[r] = s;
    }
}

int mge_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *w, const float *b, int64_t rows, int64_t C, float eps)
{
    if (rows == 0)
        return MGE_OK;
    layernorm_forward_kernel<<<mge__cuda_grid(rows), MGE__CUDA_THREADS>>>(out, mean, rstd, inp, w,
                                                                          b, rows, C, eps);
    return mge__cuda_launched("layernorm_forward");
}

__global__ static void layernorm_dinp_kernel(float *dinp, const float *dout, const float *inp,
                                             const float *w, const float *mean, const float *rstd,
                                             int64_t rows, int64_t C, int acc)
{
    MGE__CUDA_FOR(r, rows)
    {
        const float *x = inp + r * C, *dy = dout + r * C;
        float *dx = dinp + r * C;
        float m = mean[r], s = rstd[r], dmean = 0.0f, dnn = 0.0f;
        for (int64_t c = 0; c < C; c++) {
            float dn = dy[c] * (w ? w[c] : 1.0f);
            dmean += dn;
            dnn += dn * (x[c] - m) * s;
        }
        dmean /= (float)C;
        dnn /= (float)C;
        for (int64_t c = 0; c < C; c++) {
            float nx = (x[c] - m) * s;
            float g = (dy[c] * (w ? w[c] : 1.0f) - dmean - nx * dnn) * s;
            dx[c] = acc ? dx[c] + g : g;
        }
    }
}

__global__ static void layernorm_dwb_kernel(float *dw, float *db, const float *dout,
                                            const float *inp, const float *mean, const float *rstd,
                                            int64_t rows, int64_t C, int acc)
{
    MGE__CUDA_FOR(c, C)
    {
        float sw = acc && dw ? dw[c] : 0.0f, sb = acc && db ? db[c] : 0.0f;
        for (int64_t r = 0; r < rows; r++) {
            float dy = dout[r * C + c];
            sw += dy * (inp[r * C + c] - mean[r]) * rstd[r];
            sb += dy;
        }
        if (dw)
            dw[c] = sw;
        if (db)
            db[c] = sb;
    }
}

int mge_cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                const float *inp, const float *w, const float *mean,
                                const float *rstd, int64_t rows, int64_t C, int acc)
{
    if (rows == 0)
        return MGE_OK;
    if (dinp)
        layernorm_dinp_kernel<<<mge__cuda_grid(rows), MGE__CUDA_THREADS>>>(dinp, dout, inp, w, mean,
                                                                           rstd, rows, C, acc);
    if (dw || db)
        layernorm_dwb_kernel<<<mge__cuda_grid(C), MGE__CUDA_THREADS>>>(dw, db, dout, inp, mean,
                                                                       rstd, rows, C, acc);
    return mge__cuda_launched("layernorm_backward");
}

/* ---- batch norm: one block per channel, double sums by a fixed tree ---- */

#define BN_THREADS 256

__global__ static void batchnorm_forward_kernel(float *out, float *mean, float *rstd,
                                                const float *inp, const float *w, const float *b,
                                                float *rmean, float *rvar, int64_t N, int64_t C,
                                                int64_t HW, float eps, float momentum, int train,
                                                int relu)
{
    __shared__ double red[BN_THREADS];
    int64_t c = blockIdx.x, cnt = N * HW;
    float m, s;
    if (train) {
        double sum = 0.0, sq = 0.0;
        for (int64_t k = threadIdx.x; k < cnt; k += BN_THREADS)
            sum += (double)inp[(k / HW * C + c) * HW + k % HW];
        sum = mge__block_reduce<double, BN_THREADS>(sum, red, 0);
        m = (float)(sum / (double)cnt);
        for (int64_t k = threadIdx.x; k < cnt; k += BN_THREADS) {
            float d = inp[(k / HW * C + c) * HW + k % HW] - m;
            sq += (double)(d * d);
        }
        sq = mge__block_reduce<double, BN_THREADS>(sq, red, 0);
        double var = sq / (double)cnt;
        s = (float)(1.0 / sqrt(var + (double)eps));
        if (threadIdx.x == 0) {
            if (rmean)
                rmean[c] = (1.0f - momentum) * rmean[c] + momentum * m;
            if (rvar) {
                double unbiased = cnt > 1 ? sq / (double)(cnt - 1) : var;
                rvar[c] = (1.0f - momentum) * rvar[c] + momentum * (float)unbiased;
            }
        }
    } else {
        m = rmean[c];
        s = (float)(1.0 / sqrt((double)rvar[c] + (double)eps));
    }
    if (threadIdx.x == 0) {
        mean[c] = m;
        rstd[c] = s;
    }
    float k = s * (w ? w[c] : 1.0f), off = (b ? b[c] : 0.0f) - m * k;
    for (int64_t i = threadIdx.x; i < cnt; i += BN_THREADS) {
        int64_t idx = (i / HW * C + c) * HW + i % HW;
        float v = inp[idx] * k + off;
        out[idx] = relu && !(v > 0.0f) ? 0.0f : v;
    }
}

int mge_cuda_batchnorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *w, const float *b, float *running_mean,
                               float *running_var, int64_t N, int64_t C, int64_t HW, float eps,
                               float momentum, int train, int relu)
{
    if (C == 0)
        return MGE_OK;
    batchnorm_forward_kernel<<<(unsigned)C, BN_THREADS>>>(out, mean, rstd, inp, w, b, running_mean,
                                                          running_var, N, C, HW, eps, momentum,
                                                          train, relu);
    return mge__cuda_launched("batchnorm_forward");
}

/* dout at @idx, masked by a fused relu's output (NULL: none) as relu_backward_kernel does */
__device__ static inline float bn_dout(const float *dout, const float *relu_out, int64_t idx)
{
    return relu_out && !(relu_out[idx] > 0.0f) ? 0.0f : dout[idx];
}

__global__ static void batchnorm_backward_kernel(float *dinp, float *dw, float *db,
                                                 const float *dout, const float *relu_out,
                                                 const float *inp, const float *w,
                                                 const float *mean, const float *rstd, int64_t N,
                                                 int64_t C, int64_t HW, int acc)
{
    __shared__ double red[BN_THREADS];
    int64_t c = blockIdx.x, cnt = N * HW;
    float m = mean[c], s = rstd[c];
    double sdy = 0.0, sdyx = 0.0;
    for (int64_t i = threadIdx.x; i < cnt; i += BN_THREADS) {
        int64_t idx = (i / HW * C + c) * HW + i % HW;
        float d = bn_dout(dout, relu_out, idx);
        sdy += (double)d;
        sdyx += (double)(d * (inp[idx] - m));
    }
    sdy = mge__block_reduce<double, BN_THREADS>(sdy, red, 0);
    sdyx = mge__block_reduce<double, BN_THREADS>(sdyx, red, 0);
    float gsum = (float)sdy, gxhat = (float)(sdyx * (double)s);
    if (threadIdx.x == 0) {
        if (dw)
            dw[c] = acc ? dw[c] + gxhat : gxhat;
        if (db)
            db[c] = acc ? db[c] + gsum : gsum;
    }
    if (!dinp)
        return;
    float k = s * (w ? w[c] : 1.0f), a = gsum / (float)cnt, bx = gxhat / (float)cnt * s;
    for (int64_t i = threadIdx.x; i < cnt; i += BN_THREADS) {
        int64_t idx = (i / HW * C + c) * HW + i % HW;
        float g = k * (bn_dout(dout, relu_out, idx) - a - (inp[idx] - m) * bx);
        dinp[idx] = acc ? dinp[idx] + g : g;
    }
}

int mge_cuda_batchnorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                const float *relu_out, const float *inp, const float *w,
                                const float *mean, const float *rstd, int64_t N, int64_t C,
                                int64_t HW, int acc)
{
    if (C == 0)
        return MGE_OK;
    batchnorm_backward_kernel<<<(unsigned)C, BN_THREADS>>>(dinp, dw, db, dout, relu_out, inp, w,
                                                           mean, rstd, N, C, HW, acc);
    return mge__cuda_launched("batchnorm_backward");
}

/* ---- embedding ---- */

__global__ static void embedding_forward_kernel(float *out, const int32_t *ids, const float *table,
                                                int64_t n, int64_t C)
{
    MGE__CUDA_FOR(k, n * C)
    out[k] = table[(int64_t)ids[k / C] * C + k % C];
}

int mge_cuda_embedding_forward(float *out, const int32_t *ids, const float *table, int64_t n,
                               int64_t C)
{
    if (n * C == 0)
        return MGE_OK;
    embedding_forward_kernel<<<mge__cuda_grid(n * C), MGE__CUDA_THREADS>>>(out, ids, table, n, C);
    return mge__cuda_launched("embedding_forward");
}

/* One thread per column: tokens in order, so repeated ids add up as on the CPU. */
__global__ static void embedding_backward_kernel(float *dtable, const float *dout,
                                                 const int32_t *ids, int64_t n, int64_t C)
{
    MGE__CUDA_FOR(c, C)
    for (int64_t i = 0; i < n; i++)
        dtable[(int64_t)ids[i] * C + c] += dout[i * C + c];
}

int mge_cuda_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int64_t n,
                                int64_t V, int64_t C, int acc)
{
    int rc = MGE_OK;
    if (!acc && (rc = mge_cuda_memset(dtable, 0, sizeof(float) * (size_t)(V * C))) != MGE_OK)
        return rc;
    if (n * C == 0)
        return MGE_OK;
    embedding_backward_kernel<<<mge__cuda_grid(C), MGE__CUDA_THREADS>>>(dtable, dout, ids, n, C);
    return mge__cuda_launched("embedding_backward");
}

/* ---- dropout: the CPU's counter-based mask (common/rng.h's splitmix64) ---- */

__device__ static int dropout_keep(uint64_t seed, int64_t i, float p)
{
    uint64_t z = (seed ^ (uint64_t)i) + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    float u = (float)(z >> 40) * (1.0f / 16777216.0f);
    return u >= p;
}

__global__ static void dropout_kernel(float *out, const float *inp, int64_t n, float p,
                                      uint64_t seed, int64_t first, int acc)
{
    float k = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    MGE__CUDA_FOR(i, n)
    {
        float g = dropout_keep(seed, first + i, p) ? inp[i] * k : 0.0f;
        out[i] = acc ? out[i] + g : g;
    }
}

int mge_cuda_dropout_forward(float *out, const float *inp, int64_t n, float p, uint64_t seed,
                             int64_t first)
{
    if (n == 0)
        return MGE_OK;
    dropout_kernel<<<mge__cuda_grid(n), MGE__CUDA_THREADS>>>(out, inp, n, p, seed, first, 0);
    return mge__cuda_launched("dropout_forward");
}

int mge_cuda_dropout_backward(float *dinp, const float *dout, int64_t n, float p, uint64_t seed,
                              int64_t first, int acc)
{
    if (n == 0)
        return MGE_OK;
    dropout_kernel<<<mge__cuda_grid(n), MGE__CUDA_THREADS>>>(dinp, dout, n, p, seed, first, acc);
    return mge__cuda_launched("dropout_backward");
}

/* ---- causal attention: one thread per query row (forward, dq) or key row (dk, dv) ---- */

#define ATT_MAX_HEAD 128

/* Forward: two passes over the keys (max and sum, then the weighted values). */
__global__ static void attention_forward_kernel(float *out, float *lse, const float *qkv, int64_t B,
                                                int64_t T, int64_t C, int64_t NH)
{
    int64_t hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    MGE__CUDA_FOR(k, B * NH * T)
    {
        int64_t t = k % T, h = k / T % NH, b = k / (T * NH);
        const float *base = qkv + b * T * C3, *q = base + t * C3 + h * hs;
        float m = -INFINITY, l = 0.0f, acc[ATT_MAX_HEAD];
        for (int64_t j = 0; j <= t; j++) {
            const float *kj = base + j * C3 + C + h * hs;
            float s = 0.0f;
            for (int64_t i = 0; i < hs; i++)
                s += q[i] * kj[i];
            m = fmaxf(m, s * scale);
        }
        for (int64_t i = 0; i < hs; i++)
            acc[i] = 0.0f;
        for (int64_t j = 0; j <= t; j++) {
            const float *kj = base + j * C3 + C + h * hs, *vj = base + j * C3 + 2 * C + h * hs;
            float s = 0.0f;
            for (int64_t i = 0; i < hs; i++)
                s += q[i] * kj[i];
            float e = expf(s * scale - m);
            l += e;
            for (int64_t i = 0; i < hs; i++)
                acc[i] += e * vj[i];
        }
        float *o = out + (b * T + t) * C + h * hs, inv = 1.0f / l;
        for (int64_t i = 0; i < hs; i++)
            o[i] = acc[i] * inv;
        lse[(b * NH + h) * T + t] = m + logf(l);
    }
}

int mge_cuda_attention_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T,
                               int64_t C, int64_t NH)
{
    if (NH <= 0 || C % NH != 0 || C / NH > ATT_MAX_HEAD)
        return MGE_ERR(MGE_UNSUPPORTED,
                       "attention: head size %lld (C %lld, %lld heads): at "
                       "most %d on cuda",
                       (long long)(NH > 0 ? C / NH : 0), (long long)C, (long long)NH, ATT_MAX_HEAD);
    if (B * T == 0)
        return MGE_OK;
    attention_forward_kernel<<<mge__cuda_grid(B * NH * T), 128>>>(out, lse, qkv, B, T, C, NH);
    return mge__cuda_launched("attention_forward");
}

/* D[(b, h, t)] = dout_t . out_t over the head's columns. */
__global__ static void attention_d_kernel(float *D, const float *dout, const float *out, int64_t B,
                                          int64_t T, int64_t C, int64_t NH)
{
    int64_t hs = C / NH;
    MGE__CUDA_FOR(k, B * NH * T)
    {
        int64_t t = k % T, h = k / T % NH, b = k / (T * NH);
        const float *dy = dout + (b * T + t) * C + h * hs, *y = out + (b * T + t) * C + h * hs;
        float s = 0.0f;
        for (int64_t i = 0; i < hs; i++)
            s += dy[i] * y[i];
        D[k] = s;
    }
}

/* p_tj and ds_tj (scaled) of query @t and key @j. */
__device__ static void attention_pds(const float *base, const float *dout, const float *lse,
                                     const float *D, int64_t b, int64_t h, int64_t t, int64_t j,
                                     int64_t T, int64_t C, int64_t NH, float scale, float *p,
                                     float *ds)
{
    int64_t hs = C / NH, C3 = 3 * C, row = (b * NH + h) * T + t;
    const float *q = base + t * C3 + h * hs, *kj = base + j * C3 + C + h * hs;
    const float *vj = base + j * C3 + 2 * C + h * hs, *dy = dout + (b * T + t) * C + h * hs;
    float s = 0.0f, dp = 0.0f;
    for (int64_t i = 0; i < hs; i++) {
        s += q[i] * kj[i];
        dp += dy[i] * vj[i];
    }
    *p = expf(s * scale - lse[row]);
    *ds = *p * (dp - D[row]) * scale;
}

__global__ static void attention_dq_kernel(float *dqkv, const float *dout, const float *qkv,
                                           const float *lse, const float *D, int64_t B, int64_t T,
                                           int64_t C, int64_t NH, int acc)
{
    int64_t hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    MGE__CUDA_FOR(k, B * NH * T)
    {
        int64_t t = k % T, h = k / T % NH, b = k / (T * NH);
        const float *base = qkv + b * T * C3;
        float dq[ATT_MAX_HEAD];
        for (int64_t i = 0; i < hs; i++)
            dq[i] = 0.0f;
        for (int64_t j = 0; j <= t; j++) {
            float p, ds;
            attention_pds(base, dout, lse, D, b, h, t, j, T, C, NH, scale, &p, &ds);
            const float *kj = base + j * C3 + C + h * hs;
            for (int64_t i = 0; i < hs; i++)
                dq[i] += ds * kj[i];
        }
        float *d = dqkv + b * T * C3 + t * C3 + h * hs;
        for (int64_t i = 0; i < hs; i++)
            d[i] = acc ? d[i] + dq[i] : dq[i];
    }
}

__global__ static void attention_dkv_kernel(float *dqkv, const float *dout, const float *qkv,
                                            const float *lse, const float *D, int64_t B, int64_t T,
                                            int64_t C, int64_t NH, int acc)
{
    int64_t hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    MGE__CUDA_FOR(k, B * NH * T)
    {
        int64_t j = k % T, h = k / T % NH, b = k / (T * NH);
        const float *base = qkv + b * T * C3;
        float dk[ATT_MAX_HEAD], dv[ATT_MAX_HEAD];
        for (int64_t i = 0; i < hs; i++)
            dk[i] = dv[i] = 0.0f;
        for (int64_t t = j; t < T; t++) {
            float p, ds;
            attention_pds(base, dout, lse, D, b, h, t, j, T, C, NH, scale, &p, &ds);
            const float *q = base + t * C3 + h * hs, *dy = dout + (b * T + t) * C + h * hs;
            for (int64_t i = 0; i < hs; i++) {
                dk[i] += ds * q[i];
                dv[i] += p * dy[i];
            }
        }
        float *d = dqkv + b * T * C3 + j * C3;
        for (int64_t i = 0; i < hs; i++) {
            float *pk = d + C + h * hs + i, *pv = d + 2 * C + h * hs + i;
            *pk = acc ? *pk + dk[i] : dk[i];
            *pv = acc ? *pv + dv[i] : dv[i];
        }
    }
}

int mge_cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                                const float *lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                                int acc)
{
    if (NH <= 0 || C % NH != 0 || C / NH > ATT_MAX_HEAD)
        return MGE_ERR(MGE_UNSUPPORTED, "attention: head size %lld: at most %d on cuda",
                       (long long)(NH > 0 ? C / NH : 0), ATT_MAX_HEAD);
    int64_t rows = B * NH * T;
    if (rows == 0)
        return MGE_OK;
    float *D = NULL;
    int rc = mge_cuda_malloc((void **)&D, sizeof(float) * (size_t)rows);
    if (rc != MGE_OK)
        return rc;
    attention_d_kernel<<<mge__cuda_grid(rows), 128>>>(D, dout, out, B, T, C, NH);
    attention_dq_kernel<<<mge__cuda_grid(rows), 128>>>(dqkv, dout, qkv, lse, D, B, T, C, NH, acc);
    attention_dkv_kernel<<<mge__cuda_grid(rows), 128>>>(dqkv, dout, qkv, lse, D, B, T, C, NH, acc);
    rc = mge__cuda_launched("attention_backward");
    mge_cuda_free(D); /* cudaFree waits for the kernels above */
    return rc;
}
