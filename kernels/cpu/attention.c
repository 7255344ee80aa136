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

/* Keys per block: the scores of one block live on the stack. */
enum { ATT_BLK = 64 };

static float dot(const float *a, const float *b, int64_t n)
{
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

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
            float s[ATT_BLK], acc[MGE_CPU_ATTN_MAX_HEAD];
            for (int64_t t = 0; t < T; t++) {
                const float *q = base + t * C3 + h * hs;
                float m = -INFINITY, l = 0.0f;
                for (int64_t i = 0; i < hs; i++)
                    acc[i] = 0.0f;
                /* online softmax over key blocks: rescale what is summed when the max grows */
                for (int64_t j0 = 0; j0 <= t; j0 += ATT_BLK) {
                    int64_t j1 = j0 + ATT_BLK < t + 1 ? j0 + ATT_BLK : t + 1;
                    float bm = -INFINITY;
                    for (int64_t j = j0; j < j1; j++) {
                        s[j - j0] = dot(q, base + j * C3 + C + h * hs, hs) * scale;
                        bm = s[j - j0] > bm ? s[j - j0] : bm;
                    }
                    float mn = bm > m ? bm : m, corr = expf(m - mn);
                    l *= corr;
                    for (int64_t i = 0; i < hs; i++)
                        acc[i] *= corr;
                    for (int64_t j = j0; j < j1; j++) {
                        float p = expf(s[j - j0] - mn);
                        const float *v = base + j * C3 + 2 * C + h * hs;
                        l += p;
                        for (int64_t i = 0; i < hs; i++)
                            acc[i] += p * v[i];
                    }
                    m = mn;
                }
                float *o = out + (b * T + t) * C + h * hs, inv = 1.0f / l;
                for (int64_t i = 0; i < hs; i++)
                    o[i] = acc[i] * inv;
                lse[(b * NH + h) * T + t] = m + logf(l);
            }
        }
    }
}

/*
 * With p_tj = exp(s_tj - lse_t) and D_t = dout_t . out_t (= sum_j p_tj dp_tj):
 * dv_j += p_tj dout_t, ds_tj = p_tj (dout_t . v_j - D_t), dq_t += scale ds_tj k_j,
 * dk_j += scale ds_tj q_t.
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
            float p[ATT_BLK];
            if (!acc)
                for (int64_t t = 0; t < T; t++)
                    for (int part = 0; part < 3; part++)
                        memset(dbase + t * C3 + part * C + h * hs, 0, sizeof(float) * (size_t)hs);
            for (int64_t t = 0; t < T; t++) {
                const float *q = base + t * C3 + h * hs;
                const float *dy = dout + (b * T + t) * C + h * hs;
                const float *o = out + (b * T + t) * C + h * hs;
                float *dq = dbase + t * C3 + h * hs;
                float D = dot(dy, o, hs);
                for (int64_t j0 = 0; j0 <= t; j0 += ATT_BLK) {
                    int64_t j1 = j0 + ATT_BLK < t + 1 ? j0 + ATT_BLK : t + 1;
                    for (int64_t j = j0; j < j1; j++)
                        p[j - j0] = expf(dot(q, base + j * C3 + C + h * hs, hs) * scale - L[t]);
                    for (int64_t j = j0; j < j1; j++) {
                        const float *k = base + j * C3 + C + h * hs;
                        const float *v = base + j * C3 + 2 * C + h * hs;
                        float *dk = dbase + j * C3 + C + h * hs;
                        float *dv = dbase + j * C3 + 2 * C + h * hs;
                        float pj = p[j - j0], ds = pj * (dot(dy, v, hs) - D) * scale;
                        for (int64_t i = 0; i < hs; i++) {
                            dv[i] += pj * dy[i];
                            dq[i] += ds * k[i];
                            dk[i] += ds * q[i];
                        }
                    }
                }
            }
        }
    }
}
