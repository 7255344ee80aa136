/* norm.c: CPU layer and batch normalisation, embedding lookup and counter-based dropout. */
#include <math.h>
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

/* sum p[i] and sum (p[i] - m)^2 over one plane; @sq NULL: the first only. */
static inline __attribute__((always_inline)) void plane_sums(const float *p, int64_t n, float m,
                                                             float *sum, float *sq)
{
    float a[BN_LANES] = {0}, b[BN_LANES] = {0};
    int64_t i = 0;
    for (; i + BN_LANES <= n; i += BN_LANES)
        for (int j = 0; j < BN_LANES; j++) {
            float d = p[i + j] - m;
            a[j] += p[i + j];
            b[j] += d * d;
        }
    for (int j = 0; i < n; i++, j++) {
        float d = p[i] - m;
        a[j] += p[i];
        b[j] += d * d;
    }
    float s = 0.0f, t = 0.0f;
    for (int j = 0; j < BN_LANES; j++)
        s += a[j], t += b[j];
    *sum = s;
    if (sq)
        *sq = t;
}

/* sum dy[i] and sum dy[i] (x[i] - m) over one plane. */
static inline __attribute__((always_inline)) void
plane_dots(const float *x, const float *dy, int64_t n, float m, float *sdy, float *sdyx)
{
    float a[BN_LANES] = {0}, b[BN_LANES] = {0};
    int64_t i = 0;
    for (; i + BN_LANES <= n; i += BN_LANES)
        for (int j = 0; j < BN_LANES; j++) {
            a[j] += dy[i + j];
            b[j] += dy[i + j] * (x[i + j] - m);
        }
    for (int j = 0; i < n; i++, j++) {
        a[j] += dy[i];
        b[j] += dy[i] * (x[i] - m);
    }
    float s = 0.0f, t = 0.0f;
    for (int j = 0; j < BN_LANES; j++)
        s += a[j], t += b[j];
    *sdy = s;
    *sdyx = t;
}

MGE__CPU_CLONES
void mge_cpu_batchnorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *w, const float *b, float *running_mean,
                               float *running_var, int64_t N, int64_t C, int64_t HW, float eps,
                               float momentum, int train)
{
    int64_t cnt = N * HW;
#pragma omp parallel for schedule(static) if (N * C * HW > MGE__PAR_MIN && C > 1)
    for (int64_t c = 0; c < C; c++) {
        float m, s;
        if (train) {
            double sum = 0.0, v = 0.0;
            for (int64_t n = 0; n < N; n++) {
                float ps;
                plane_sums(inp + (n * C + c) * HW, HW, 0.0f, &ps, NULL);
                sum += ps;
            }
            m = (float)(sum / (double)cnt);
            for (int64_t n = 0; n < N; n++) {
                float ps, pq;
                plane_sums(inp + (n * C + c) * HW, HW, m, &ps, &pq);
                v += pq;
            }
            double var = v / (double)cnt;
            s = (float)(1.0 / sqrt(var + (double)eps));
            if (running_mean)
                running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * m;
            if (running_var) {
                double unbiased = cnt > 1 ? v / (double)(cnt - 1) : var;
                running_var[c] = (1.0f - momentum) * running_var[c] + momentum * (float)unbiased;
            }
        } else {
            m = running_mean[c];
            s = (float)(1.0 / sqrt((double)running_var[c] + (double)eps));
        }
        mean[c] = m;
        rstd[c] = s;
        float k = s * (w ? w[c] : 1.0f), off = (b ? b[c] : 0.0f) - m * k;
        for (int64_t n = 0; n < N; n++) {
            const float *p = inp + (n * C + c) * HW;
            float *q = out + (n * C + c) * HW;
            for (int64_t i = 0; i < HW; i++)
                q[i] = p[i] * k + off;
        }
    }
}

/*
 * dx = rstd w (dy - mean(dy) - xhat mean(dy xhat)), xhat = (x - mean) rstd; dw = sum dy xhat,
 * db = sum dy, per channel (channels in parallel, planes in order within one).
 */
MGE__CPU_CLONES
void mge_cpu_batchnorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                const float *inp, const float *w, const float *mean,
                                const float *rstd, int64_t N, int64_t C, int64_t HW, int acc)
{
    int64_t cnt = N * HW;
#pragma omp parallel for schedule(static) if (N * C * HW > MGE__PAR_MIN && C > 1)
    for (int64_t c = 0; c < C; c++) {
        float m = mean[c], s = rstd[c];
        double sdy = 0.0, sdyx = 0.0;
        for (int64_t n = 0; n < N; n++) {
            float t, u;
            plane_dots(inp + (n * C + c) * HW, dout + (n * C + c) * HW, HW, m, &t, &u);
            sdy += t;
            sdyx += u;
        }
        float gsum = (float)sdy, gxhat = (float)(sdyx * (double)s); /* sum dy, sum dy xhat */
        if (dw)
            dw[c] = acc ? dw[c] + gxhat : gxhat;
        if (db)
            db[c] = acc ? db[c] + gsum : gsum;
        if (!dinp)
            continue;
        float k = s * (w ? w[c] : 1.0f);
        float a = gsum / (float)cnt, bx = gxhat / (float)cnt * s; /* per (x - m) */
        for (int64_t n = 0; n < N; n++) {
            const float *x = inp + (n * C + c) * HW, *dy = dout + (n * C + c) * HW;
            float *dx = dinp + (n * C + c) * HW;
            if (acc)
                for (int64_t i = 0; i < HW; i++)
                    dx[i] += k * (dy[i] - a - (x[i] - m) * bx);
            else
                for (int64_t i = 0; i < HW; i++)
                    dx[i] = k * (dy[i] - a - (x[i] - m) * bx);
        }
    }
}
