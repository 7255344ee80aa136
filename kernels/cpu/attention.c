/*
 * attention.c: fused causal multi-head self-attention on the CPU, flash-attention style: the
 * forward pass keeps one log-sum-exp per query row instead of the T x T probabilities, and the
 * backward pass recomputes the probabilities block by block from it (Dao et al. 2022, 2023).
 *
 * Layout (nanoGPT's c_attn output): qkv (B, T, 3C), q in columns [0, C), k in [C, 2C), v in
 * [2C, 3C); head h owns columns [h hs, (h + 1) hs) of each, hs = C / NH. out (B, T, C) with the
 * heads side by side; lse (B, NH, T). One (b, h) pair is one OpenMP task and every sum runs in
 * a fixed order inside it, so results do not depend on the thread count.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_int.h"

/* Queries and keys per block: a block's scores and its transposed keys live on the stack. */
enum { ATT_BLK = 64 };

/* kt[i * ATT_BLK + jj] = rows[jj][i]: @n rows of @hs values, @stride apart, transposed. */
static inline void block_transpose(float *restrict kt, const float *restrict rows, int64_t n,
                                   int64_t hs, int64_t stride)
{
    for (int64_t jj = 0; jj < n; jj++)
        for (int64_t i = 0; i < hs; i++)
            kt[i * ATT_BLK + jj] = rows[jj * stride + i];
}

/* s[jj] = scale * sum_i q[i] kt[i][jj] for jj < n: vectorised over keys, no horizontal sums. */
static inline void block_scores(float *restrict s, const float *restrict q,
                                const float *restrict kt, int64_t n, int64_t hs, float scale)
{
    for (int64_t jj = 0; jj < n; jj++)
        s[jj] = 0.0f;
    for (int64_t i = 0; i < hs; i++) {
        float qi = q[i];
        const float *restrict row = kt + i * ATT_BLK;
#pragma omp simd
        for (int64_t jj = 0; jj < n; jj++)
            s[jj] += qi * row[jj];
    }
    for (int64_t jj = 0; jj < n; jj++)
        s[jj] *= scale;
}

/* y[i] += a x[i], i < n. */
static inline void axpy(float *restrict y, float a, const float *restrict x, int64_t n)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

static float dot(const float *restrict a, const float *restrict b, int64_t n)
{
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/*
 * Per (b, h): query blocks in order, and for each the key blocks it sees, in order, with an
 * online softmax per query (running max m, sum l, and the output row as the accumulator,
 * rescaled when the max grows).
 */
MGE__CPU_CLONES
void mge_cpu_attention_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T,
                               int64_t C, int64_t NH)
{
    int64_t hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static) if (B * NH * T * T * hs > MGE__PAR_MIN)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            const float *base = qkv + b * T * C3;
            float kt[MGE_CPU_ATTN_MAX_HEAD * ATT_BLK], s[ATT_BLK], m[ATT_BLK], l[ATT_BLK];
            for (int64_t q0 = 0; q0 < T; q0 += ATT_BLK) {
                int64_t q1 = q0 + ATT_BLK < T ? q0 + ATT_BLK : T;
                for (int64_t t = q0; t < q1; t++) {
                    m[t - q0] = -INFINITY;
                    l[t - q0] = 0.0f;
                    memset(out + (b * T + t) * C + h * hs, 0, sizeof(float) * (size_t)hs);
                }
                for (int64_t k0 = 0; k0 < q1; k0 += ATT_BLK) {
                    int64_t k1 = k0 + ATT_BLK < q1 ? k0 + ATT_BLK : q1;
                    block_transpose(kt, base + k0 * C3 + C + h * hs, k1 - k0, hs, C3);
                    for (int64_t t = q0 > k0 ? q0 : k0; t < q1; t++) {
                        int64_t n = (t + 1 < k1 ? t + 1 : k1) - k0;
                        float *o = out + (b * T + t) * C + h * hs, bm = -INFINITY;
                        block_scores(s, base + t * C3 + h * hs, kt, n, hs, scale);
                        for (int64_t jj = 0; jj < n; jj++)
                            bm = s[jj] > bm ? s[jj] : bm;
                        float mo = m[t - q0], mn = bm > mo ? bm : mo, corr = expf(mo - mn);
                        float sum = l[t - q0] * corr;
                        if (corr != 1.0f)
                            for (int64_t i = 0; i < hs; i++)
                                o[i] *= corr;
                        for (int64_t jj = 0; jj < n; jj++)
                            s[jj] = mge__expf(s[jj] - mn);
                        for (int64_t jj = 0; jj < n; jj++) {
                            sum += s[jj];
                            axpy(o, s[jj], base + (k0 + jj) * C3 + 2 * C + h * hs, hs);
                        }
                        m[t - q0] = mn;
                        l[t - q0] = sum;
                    }
                }
                for (int64_t t = q0; t < q1; t++) {
                    float *o = out + (b * T + t) * C + h * hs, inv = 1.0f / l[t - q0];
                    for (int64_t i = 0; i < hs; i++)
                        o[i] *= inv;
                    lse[(b * NH + h) * T + t] = m[t - q0] + logf(l[t - q0]);
                }
            }
        }
    }
}

/*
 * With p_tj = exp(s_tj - lse_t) and D_t = dout_t . out_t (= sum_j p_tj dp_tj):
 * dv_j += p_tj dout_t, ds_tj = p_tj (dout_t . v_j - D_t), dq_t += scale ds_tj k_j,
 * dk_j += scale ds_tj q_t. The same block walk as forward, keys and values transposed per block.
 */
MGE__CPU_CLONES
void mge_cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                                const float *lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                                int acc)
{
    int64_t hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static) if (B * NH * T * T * hs > MGE__PAR_MIN)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            const float *base = qkv + b * T * C3;
            float *dbase = dqkv + b * T * C3;
            const float *L = lse + (b * NH + h) * T;
            float kt[MGE_CPU_ATTN_MAX_HEAD * ATT_BLK], vt[MGE_CPU_ATTN_MAX_HEAD * ATT_BLK];
            float p[ATT_BLK], dp[ATT_BLK], D[ATT_BLK];
            if (!acc)
                for (int64_t t = 0; t < T; t++)
                    for (int part = 0; part < 3; part++)
                        memset(dbase + t * C3 + part * C + h * hs, 0, sizeof(float) * (size_t)hs);
            for (int64_t q0 = 0; q0 < T; q0 += ATT_BLK) {
                int64_t q1 = q0 + ATT_BLK < T ? q0 + ATT_BLK : T;
                for (int64_t t = q0; t < q1; t++)
                    D[t - q0] =
                        dot(dout + (b * T + t) * C + h * hs, out + (b * T + t) * C + h * hs, hs);
                for (int64_t k0 = 0; k0 < q1; k0 += ATT_BLK) {
                    int64_t k1 = k0 + ATT_BLK < q1 ? k0 + ATT_BLK : q1;
                    block_transpose(kt, base + k0 * C3 + C + h * hs, k1 - k0, hs, C3);
                    block_transpose(vt, base + k0 * C3 + 2 * C + h * hs, k1 - k0, hs, C3);
                    for (int64_t t = q0 > k0 ? q0 : k0; t < q1; t++) {
                        int64_t n = (t + 1 < k1 ? t + 1 : k1) - k0;
                        const float *q = base + t * C3 + h * hs;
                        const float *dy = dout + (b * T + t) * C + h * hs;
                        float *dq = dbase + t * C3 + h * hs;
                        block_scores(p, q, kt, n, hs, scale);
                        block_scores(dp, dy, vt, n, hs, 1.0f);
                        for (int64_t jj = 0; jj < n; jj++)
                            p[jj] = mge__expf(p[jj] - L[t]);
                        for (int64_t jj = 0; jj < n; jj++) {
                            int64_t j = k0 + jj;
                            float pj = p[jj], ds = pj * (dp[jj] - D[t - q0]) * scale;
                            axpy(dbase + j * C3 + 2 * C + h * hs, pj, dy, hs);
                            axpy(dq, ds, base + j * C3 + C + h * hs, hs);
                            axpy(dbase + j * C3 + C + h * hs, ds, q, hs);
                        }
                    }
                }
            }
        }
    }
}
