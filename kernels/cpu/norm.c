/* norm.c: CPU layer and batch normalisation, embedding lookup and counter-based dropout. */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "common/rng.h"
#include "kernels/cpu/cpu_int.h"

MGE__CPU_CLONES
void mge_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *w, const float *b, int64_t rows, int64_t C, float eps)
{
#pragma omp parallel for schedule(static) if (rows * C > MGE__PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
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

/*
 * dinp row by row in parallel; dw and db by column blocks, rows in order within a block, so no
 * sum depends on the thread count.
 */
MGE__CPU_CLONES
void mge_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                const float *inp, const float *w, const float *mean,
                                const float *rstd, int64_t rows, int64_t C, int acc)
{
    if (dinp) {
#pragma omp parallel for schedule(static) if (rows * C > MGE__PAR_MIN)
        for (int64_t r = 0; r < rows; r++) {
            const float *x = inp + r * C, *dy = dout + r * C;
            float *dx = dinp + r * C;
            float m = mean[r], s = rstd[r], dmean = 0.0f, dnorm_norm = 0.0f;
            for (int64_t c = 0; c < C; c++) {
                float dn = dy[c] * (w ? w[c] : 1.0f);
                dmean += dn;
                dnorm_norm += dn * (x[c] - m) * s;
            }
            dmean /= (float)C;
            dnorm_norm /= (float)C;
            for (int64_t c = 0; c < C; c++) {
                float n = (x[c] - m) * s;
                float g = (dy[c] * (w ? w[c] : 1.0f) - dmean - n * dnorm_norm) * s;
                dx[c] = acc ? dx[c] + g : g;
            }
        }
    }
    if (!dw && !db)
        return;
    enum { BLK = 64 };
    int64_t nblk = (C + BLK - 1) / BLK;
#pragma omp parallel for schedule(static) if (rows * C > MGE__PAR_MIN && nblk > 1)
    for (int64_t k = 0; k < nblk; k++) {
        int64_t c0 = k * BLK, c1 = c0 + BLK < C ? c0 + BLK : C;
        float sw[BLK], sb[BLK];
        for (int64_t c = c0; c < c1; c++) {
            sw[c - c0] = acc && dw ? dw[c] : 0.0f;
            sb[c - c0] = acc && db ? db[c] : 0.0f;
        }
        for (int64_t r = 0; r < rows; r++) {
            const float *x = inp + r * C, *dy = dout + r * C;
            float m = mean[r], s = rstd[r];
            for (int64_t c = c0; c < c1; c++) {
                sw[c - c0] += dy[c] * (x[c] - m) * s;
                sb[c - c0] += dy[c];
            }
        }
        for (int64_t c = c0; c < c1; c++) {
            if (dw)
                dw[c] = sw[c - c0];
            if (db)
                db[c] = sb[c - c0];
        }
    }
}

MGE__CPU_CLONES
void mge_cpu_embedding_forward(float *out, const int32_t *ids, const float *table, int64_t n,
                               int64_t C)
{
#pragma omp parallel for schedule(static) if (n * C > MGE__PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        memcpy(out + i * C, table + (int64_t)ids[i] * C, (size_t)C * sizeof(float));
}

/* Column blocks in parallel, tokens in order within each: repeated ids add up deterministically. */
MGE__CPU_CLONES
void mge_cpu_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int64_t n,
                                int64_t V, int64_t C, int acc)
{
    if (!acc)
        memset(dtable, 0, (size_t)(V * C) * sizeof(float));
    enum { BLK = 64 };
    int64_t nblk = (C + BLK - 1) / BLK;
#pragma omp parallel for schedule(static) if (n * C > MGE__PAR_MIN && nblk > 1)
    for (int64_t k = 0; k < nblk; k++) {
        int64_t c0 = k * BLK, c1 = c0 + BLK < C ? c0 + BLK : C;
        for (int64_t i = 0; i < n; i++) {
            float *t = dtable + (int64_t)ids[i] * C;
            const float *g = dout + i * C;
            for (int64_t c = c0; c < c1; c++)
                t[c] += g[c];
        }
    }
}

/* u in [0, 1) from the top 24 bits of splitmix64(seed ^ i); kept iff u >= p. */
int mge_cpu_dropout_keep(uint64_t seed, int64_t i, float p)
{
    float u = (float)(mge_splitmix64(seed ^ (uint64_t)i) >> 40) * (1.0f / 16777216.0f);
    return u >= p;
}

MGE__CPU_CLONES
void mge_cpu_dropout_forward(float *out, const float *inp, int64_t n, float p, uint64_t seed,
                             int64_t first)
{
    float k = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
#pragma omp parallel for schedule(static) if (n > MGE__PAR_MIN)
    for (int64_t i = 0; i < n; i++)
        out[i] = mge_cpu_dropout_keep(seed, first + i, p) ? inp[i] * k : 0.0f;
}

MGE__CPU_CLONES
void mge_cpu_dropout_backward(float *dinp, const float *dout, int64_t n, float p, uint64_t seed,
                              int64_t first, int acc)
{
    float k = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
#pragma omp parallel for schedule(static) if (n > MGE__PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float g = mge_cpu_dropout_keep(seed, first + i, p) ? dout[i] * k : 0.0f;
        dinp[i] = acc ? dinp[i] + g : g;
    }
}

/* ---- batch normalisation ---- */

/*
 * Per-plane sums in BN_LANES independent partial sums, added up in a fixed order at the end: the
 * loops vectorise without reassociating (a single running float sum is bound by the adder's
 * latency, 4x slower here), and results do not depend on the ISA clone or thread count.
 */
#define BN_LANES 16

typedef float bn_vf __attribute__((vector_size(BN_LANES * sizeof(float))));

/* The lanes of *a and *b, each summed in lane order */
static inline __attribute__((always_inline)) void bn_finish(const bn_vf *a, const bn_vf *b,
                                                            float *sum, float *sq)
{
    float s = 0.0f, t = 0.0f;
    for (int j = 0; j < BN_LANES; j++)
        s += (*a)[j], t += (*b)[j];
    *sum = s;
    if (sq)
        *sq = t;
}

/* sum p[i] and sum (p[i] - m)^2 over one plane; @sq NULL: the first only. */
static inline __attribute__((always_inline)) void plane_sums(const float *p, int64_t n, float m,
                                                             float *sum, float *sq)
{
    bn_vf a = {0}, b = {0};
    int64_t i = 0;
    for (; i + BN_LANES <= n; i += BN_LANES) {
        bn_vf x, d;
        memcpy(&x, p + i, sizeof(x));
        d = x - m;
        a += x;
        if (sq)
            b += d * d;
    }
    for (int j = 0; i < n; i++, j++) {
        float d = p[i] - m;
        a[j] += p[i];
        b[j] += d * d;
    }
    bn_finish(&a, &b, sum, sq);
}

/* sum dy[i] and sum dy[i] (x[i] - m) over one plane. */
static inline __attribute__((always_inline)) void
plane_dots(const float *x, const float *dy, int64_t n, float m, float *sdy, float *sdyx)
{
    bn_vf a = {0}, b = {0};
    int64_t i = 0;
    for (; i + BN_LANES <= n; i += BN_LANES) {
        bn_vf g, v;
        memcpy(&g, dy + i, sizeof(g));
        memcpy(&v, x + i, sizeof(v));
        a += g;
        b += g * (v - m);
    }
    for (int j = 0; i < n; i++, j++) {
        a[j] += dy[i];
        b[j] += dy[i] * (x[i] - m);
    }
    bn_finish(&a, &b, sdy, sdyx);
}

typedef int32_t bn_vi __attribute__((vector_size(BN_LANES * sizeof(int32_t))));

/*
 * plane_dots of dy masked by a fused relu's output @y: y > 0 ? dy : +0, ReLU's gradient bit for
 * bit (an and with the comparison's all-ones or zero lanes).
 */
static inline __attribute__((always_inline)) void plane_dots_relu(const float *x, const float *dy,
                                                                  const float *y, int64_t n,
                                                                  float m, float *sdy, float *sdyx)
{
    bn_vf a = {0}, b = {0};
    int64_t i = 0;
    for (; i + BN_LANES <= n; i += BN_LANES) {
        bn_vf g, v, o;
        memcpy(&g, dy + i, sizeof(g));
        memcpy(&v, x + i, sizeof(v));
        memcpy(&o, y + i, sizeof(o));
        g = (bn_vf)((bn_vi)g & (o > 0.0f));
        a += g;
        b += g * (v - m);
    }
    for (int j = 0; i < n; i++, j++) {
        float g = y[i] > 0.0f ? dy[i] : 0.0f;
        a[j] += g;
        b[j] += g * (x[i] - m);
    }
    bn_finish(&a, &b, sdy, sdyx);
}

/*
 * Channels [*c0, *c1) of @C for this thread: contiguous ranges, one per thread. Within its range
 * a thread walks images outer and a block of channels inner, so it reads each image's planes of
 * the block as one contiguous stretch (channel-outer order read 128 short strided planes per
 * channel, which the prefetchers did not follow: the backward's sums ran at 0.7-1.1 G floats/s).
 * Every channel still adds its planes in image order, so results do not depend on threads.
 */
#define BN_BLOCK 64 /* channels per block: the per-channel sums live on the stack */

static void bn_range(int64_t C, int par, int64_t *c0, int64_t *c1)
{
    int t = par ? omp_get_thread_num() : 0, nt = par ? omp_get_num_threads() : 1;
    *c0 = C * t / nt;
    *c1 = C * (t + 1) / nt;
}

MGE__CPU_CLONES
void mge_cpu_batchnorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *w, const float *b, float *running_mean,
                               float *running_var, int64_t N, int64_t C, int64_t HW, float eps,
                               float momentum, int train, int relu)
{
    int64_t cnt = N * HW;
    int par = N * C * HW > MGE__PAR_MIN && C > 1;
#pragma omp parallel if (par)
    {
        int64_t c0, c1;
        bn_range(C, par, &c0, &c1);
        for (int64_t cb = c0; cb < c1; cb += BN_BLOCK) {
            int64_t ce = cb + BN_BLOCK < c1 ? cb + BN_BLOCK : c1;
            double sum[BN_BLOCK] = {0}, v[BN_BLOCK] = {0};
            if (train) {
                for (int64_t n = 0; n < N; n++)
                    for (int64_t c = cb; c < ce; c++) {
                        float ps;
                        plane_sums(inp + (n * C + c) * HW, HW, 0.0f, &ps, NULL);
                        sum[c - cb] += ps;
                    }
                for (int64_t c = cb; c < ce; c++)
                    mean[c] = (float)(sum[c - cb] / (double)cnt);
                for (int64_t n = 0; n < N; n++)
                    for (int64_t c = cb; c < ce; c++) {
                        float ps, pq;
                        plane_sums(inp + (n * C + c) * HW, HW, mean[c], &ps, &pq);
                        v[c - cb] += pq;
                    }
            }
            for (int64_t c = cb; c < ce; c++) {
                float m, s;
                if (train) {
                    m = mean[c];
                    double var = v[c - cb] / (double)cnt;
                    s = (float)(1.0 / sqrt(var + (double)eps));
                    if (running_mean)
                        running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * m;
                    if (running_var) {
                        double unbiased = cnt > 1 ? v[c - cb] / (double)(cnt - 1) : var;
                        running_var[c] =
                            (1.0f - momentum) * running_var[c] + momentum * (float)unbiased;
                    }
                } else {
                    m = running_mean[c];
                    s = (float)(1.0 / sqrt((double)running_var[c] + (double)eps));
                }
                mean[c] = m;
                rstd[c] = s;
            }
            for (int64_t n = 0; n < N; n++)
                for (int64_t c = cb; c < ce; c++) {
                    float k = rstd[c] * (w ? w[c] : 1.0f), off = (b ? b[c] : 0.0f) - mean[c] * k;
                    const float *p = inp + (n * C + c) * HW;
                    float *q = out + (n * C + c) * HW;
                    if (relu)
                        for (int64_t i = 0; i < HW; i++) {
                            float t = p[i] * k + off;
                            q[i] = t > 0.0f ? t : 0.0f;
                        }
                    else
                        for (int64_t i = 0; i < HW; i++)
                            q[i] = p[i] * k + off;
                }
        }
    }
}

/*
 * dx = rstd w (dy - mean(dy) - xhat mean(dy xhat)), xhat = (x - mean) rstd; dw = sum dy xhat,
 * db = sum dy, per channel (channel ranges in parallel, planes in image order within one).
 * With a fused relu dy is masked where it is read (y > 0 ? dy : 0, as mge_cpu_unary_backward
 * writes it), so the sums and dx are those of the unfused pair.
 */
MGE__CPU_CLONES
void mge_cpu_batchnorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                const float *relu_out, const float *inp, const float *w,
                                const float *mean, const float *rstd, int64_t N, int64_t C,
                                int64_t HW, int acc)
{
    int64_t cnt = N * HW;
    int par = N * C * HW > MGE__PAR_MIN && C > 1;
#pragma omp parallel if (par)
    {
        int64_t c0, c1;
        bn_range(C, par, &c0, &c1);
        for (int64_t cb = c0; cb < c1; cb += BN_BLOCK) {
            int64_t ce = cb + BN_BLOCK < c1 ? cb + BN_BLOCK : c1;
            double sdy[BN_BLOCK] = {0}, sdyx[BN_BLOCK] = {0};
            float ka[BN_BLOCK], aa[BN_BLOCK], ba[BN_BLOCK];
            for (int64_t n = 0; n < N; n++)
                for (int64_t c = cb; c < ce; c++) {
                    float t, u;
                    if (relu_out)
                        plane_dots_relu(inp + (n * C + c) * HW, dout + (n * C + c) * HW,
                                        relu_out + (n * C + c) * HW, HW, mean[c], &t, &u);
                    else
                        plane_dots(inp + (n * C + c) * HW, dout + (n * C + c) * HW, HW, mean[c], &t,
                                   &u);
                    sdy[c - cb] += t;
                    sdyx[c - cb] += u;
                }
            for (int64_t c = cb; c < ce; c++) {
                float s = rstd[c];
                float gsum = (float)sdy[c - cb], gxhat = (float)(sdyx[c - cb] * (double)s);
                if (dw)
                    dw[c] = acc ? dw[c] + gxhat : gxhat;
                if (db)
                    db[c] = acc ? db[c] + gsum : gsum;
                ka[c - cb] = s * (w ? w[c] : 1.0f);
                aa[c - cb] = gsum / (float)cnt;
                ba[c - cb] = gxhat / (float)cnt * s; /* per (x - m) */
            }
            if (!dinp)
                continue;
            for (int64_t n = 0; n < N; n++)
                for (int64_t c = cb; c < ce; c++) {
                    const float *x = inp + (n * C + c) * HW, *dy = dout + (n * C + c) * HW;
                    float *dx = dinp + (n * C + c) * HW;
                    float k = ka[c - cb], a = aa[c - cb], bx = ba[c - cb], m = mean[c];
                    if (relu_out) {
                        const float *y = relu_out + (n * C + c) * HW;
                        for (int64_t i = 0; i < HW; i++) {
                            float g = k * ((y[i] > 0.0f ? dy[i] : 0.0f) - a - (x[i] - m) * bx);
                            dx[i] = acc ? dx[i] + g : g;
                        }
                    } else if (acc)
                        for (int64_t i = 0; i < HW; i++)
                            dx[i] += k * (dy[i] - a - (x[i] - m) * bx);
                    else
                        for (int64_t i = 0; i < HW; i++)
                            dx[i] = k * (dy[i] - a - (x[i] - m) * bx);
                }
        }
    }
}
