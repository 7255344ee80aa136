/*
 * attention.c: fused causal multi-head self-attention on the CPU, flash-attention style: the
 * forward pass keeps one log-sum-exp per query row instead of the T x T probabilities, and the
 * backward pass recomputes the probabilities tile by tile from it (Dao et al. 2022, 2023).
 *
 * Layout (nanoGPT's c_attn output): qkv (B, T, 3C), q in columns [0, C), k in [C, 2C), v in
 * [2C, 3C); head h owns columns [h hs, (h + 1) hs) of each, hs = C / NH. out (B, T, C) with the
 * heads side by side; lse (B, NH, T). One (b, h) pair is one OpenMP task and every sum runs in
 * a fixed order inside it, so results do not depend on the thread count.
 *
 * Work goes by (64 queries x 64 keys) tiles, the operands copied into per-thread scratch with
 * head columns padded to a multiple of 32 (two 16-lane vectors) and rows to a multiple of 4, so
 * that five register-blocked micro-kernels do all the products: S = Q Kᵀ and dP = dY Vᵀ (4 rows
 * x 64 keys), O += P V and dQ += dS K (4 rows x 32 columns), dV += Pᵀ dY and dK += dSᵀ Q (4 keys
 * x 32 columns). Tiles above the diagonal are never visited; on the diagonal the products stop
 * at the last key a row sees.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_int.h"

enum {
    ATT_BLK = 64,                                      /* queries and keys per tile */
    ATT_V = 16,                                        /* lanes per vector */
    ATT_HP = ((MGE_CPU_ATTN_MAX_HEAD + 31) / 32) * 32, /* widest padded head */
};

typedef float att_vf __attribute__((vector_size(ATT_V * sizeof(float))));

/* The same vector at any float's alignment, for loads and stores (GCC's unaligned idiom). */
typedef float att_vfu __attribute__((vector_size(ATT_V * sizeof(float)), aligned(4), may_alias));
#define att_ld(p) (*(const att_vfu *)(p))
#define att_st(p, v) (*(att_vfu *)(p) = (v))

/* Per-thread operand tiles: rows of ATT_HP (row-major) or ATT_BLK (transposed) floats. */
struct att_scratch {
    float q[ATT_BLK * ATT_HP], dy[ATT_BLK * ATT_HP], k[ATT_BLK * ATT_HP], v[ATT_BLK * ATT_HP];
    float kt[ATT_HP * ATT_BLK], vt[ATT_HP * ATT_BLK];
    float s[ATT_BLK * ATT_BLK], ds[ATT_BLK * ATT_BLK];
    float o[ATT_BLK * ATT_HP], dk[ATT_BLK * ATT_HP], dv[ATT_BLK * ATT_HP];
};
static _Thread_local struct att_scratch att_scr __attribute__((aligned(64)));

static inline int64_t att_up(int64_t n, int64_t m)
{
    return (n + m - 1) / m * m;
}

/* dst (ATT_BLK rows of hp) = @n rows of @hs values @stride apart, times @mul; the rest zero. */
static void att_load_rows(float *dst, const float *src, int64_t n, int64_t hs, int64_t hp,
                          int64_t stride, float mul)
{
    memset(dst, 0, sizeof(float) * (size_t)(ATT_BLK * hp));
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < hs; i++)
            dst[r * hp + i] = mul * src[r * stride + i];
}

/* dst[i * ATT_BLK + r] = src[r * stride + i]: @n rows transposed, zero beyond n and hs. */
static void att_load_cols(float *dst, const float *src, int64_t n, int64_t hs, int64_t hp,
                          int64_t stride)
{
    memset(dst, 0, sizeof(float) * (size_t)(hp * ATT_BLK));
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < hs; i++)
            dst[i * ATT_BLK + r] = src[r * stride + i];
}

/* Rows r0..r0 + 3 of s = a bt, the first @nc key vectors (the rest zero). */
static inline __attribute__((always_inline)) void
att_nt_rows(float *s, const float *a, const float *bt, int64_t r0, int64_t hp, int nc)
{
    att_vf acc[4][4] = {{{0}}};
    for (int64_t i = 0; i < hp; i++) {
        att_vf bv[4];
        for (int c = 0; c < nc; c++)
            bv[c] = att_ld(bt + i * ATT_BLK + c * ATT_V);
        for (int rr = 0; rr < 4; rr++) {
            float x = a[(r0 + rr) * hp + i];
            for (int c = 0; c < nc; c++)
                acc[rr][c] += x * bv[c];
        }
    }
    for (int rr = 0; rr < 4; rr++)
        for (int c = 0; c < 4; c++)
            att_st(s + (r0 + rr) * ATT_BLK + c * ATT_V, acc[rr][c]);
}

/*
 * s (rows x ATT_BLK) = a (rows x hp) bt (hp x ATT_BLK); rows a multiple of 4; with @diag the
 * key vectors wholly above rows r0..r0 + 3 are left zero instead of computed.
 */
static inline __attribute__((always_inline)) void
att_tile_nt(float *s, const float *a, const float *bt, int64_t rows, int64_t hp, int diag)
{
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
        int64_t nc = diag ? (r0 + 3) / ATT_V + 1 : 4;
        switch (nc < 4 ? nc : 4) {
        case 1:
            att_nt_rows(s, a, bt, r0, hp, 1);
            break;
        case 2:
            att_nt_rows(s, a, bt, r0, hp, 2);
            break;
        case 3:
            att_nt_rows(s, a, bt, r0, hp, 3);
            break;
        default:
            att_nt_rows(s, a, bt, r0, hp, 4);
            break;
        }
    }
}

/*
 * c (rows x hp) += p (rows x ATT_BLK) b (nk x hp), rows a multiple of 4; with @diag row r
 * stops at key r (p is zero beyond it).
 */
static inline __attribute__((always_inline)) void att_tile_nn(float *c, const float *p,
                                                              const float *b, int64_t rows,
                                                              int64_t nk, int64_t hp, int diag)
{
    for (int64_t r0 = 0; r0 < rows; r0 += 4) {
        int64_t n = diag && r0 + 4 < nk ? r0 + 4 : nk;
        for (int64_t c0 = 0; c0 < hp; c0 += 2 * ATT_V) {
            att_vf acc[4][2];
            for (int rr = 0; rr < 4; rr++) {
                acc[rr][0] = att_ld(c + (r0 + rr) * hp + c0);
                acc[rr][1] = att_ld(c + (r0 + rr) * hp + c0 + ATT_V);
            }
            for (int64_t j = 0; j < n; j++) {
                att_vf b0 = att_ld(b + j * hp + c0), b1 = att_ld(b + j * hp + c0 + ATT_V);
                for (int rr = 0; rr < 4; rr++) {
                    float x = p[(r0 + rr) * ATT_BLK + j];
                    acc[rr][0] += x * b0;
                    acc[rr][1] += x * b1;
                }
            }
            for (int rr = 0; rr < 4; rr++) {
                att_st(c + (r0 + rr) * hp + c0, acc[rr][0]);
                att_st(c + (r0 + rr) * hp + c0 + ATT_V, acc[rr][1]);
            }
        }
    }
}

/*
 * c (keys x hp) += pᵀ b: p (rows x ATT_BLK), b (rows x hp), keys a multiple of 4; with @diag
 * key j starts at row j (p is zero above it).
 */
static inline __attribute__((always_inline)) void att_tile_tn(float *c, const float *p,
                                                              const float *b, int64_t keys,
                                                              int64_t rows, int64_t hp, int diag)
{
    for (int64_t j0 = 0; j0 < keys; j0 += 4) {
        for (int64_t c0 = 0; c0 < hp; c0 += 2 * ATT_V) {
            att_vf acc[4][2];
            for (int jj = 0; jj < 4; jj++) {
                acc[jj][0] = att_ld(c + (j0 + jj) * hp + c0);
                acc[jj][1] = att_ld(c + (j0 + jj) * hp + c0 + ATT_V);
            }
            for (int64_t r = diag ? j0 : 0; r < rows; r++) {
                att_vf b0 = att_ld(b + r * hp + c0), b1 = att_ld(b + r * hp + c0 + ATT_V);
                for (int jj = 0; jj < 4; jj++) {
                    float x = p[r * ATT_BLK + j0 + jj];
                    acc[jj][0] += x * b0;
                    acc[jj][1] += x * b1;
                }
            }
            for (int jj = 0; jj < 4; jj++) {
                att_st(c + (j0 + jj) * hp + c0, acc[jj][0]);
                att_st(c + (j0 + jj) * hp + c0 + ATT_V, acc[jj][1]);
            }
        }
    }
}

/* Keys of a tile row r sees: nk, on the diagonal only those up to r. */
static inline int64_t att_seen(int64_t r, int64_t nk, int diag)
{
    return diag && r + 1 < nk ? r + 1 : nk;
}

/*
 * Per (b, h): query tiles in order, and for each the key tiles it sees, in order, with an
 * online softmax per query (running max m, sum l, the output rows rescaled when m grows).
 */
MGE__CPU_CLONES
void mge_cpu_attention_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T,
                               int64_t C, int64_t NH)
{
    int64_t hs = C / NH, C3 = 3 * C, hp = att_up(hs, 2 * ATT_V);
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static) if (B * NH * T * T * hs > MGE__PAR_MIN)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            struct att_scratch *w = &att_scr;
            const float *base = qkv + b * T * C3 + h * hs;
            float m[ATT_BLK], l[ATT_BLK];
            for (int64_t q0 = 0; q0 < T; q0 += ATT_BLK) {
                int64_t nq = q0 + ATT_BLK < T ? ATT_BLK : T - q0, rows = att_up(nq, 4);
                att_load_rows(w->q, base + q0 * C3, nq, hs, hp, C3, scale);
                memset(w->o, 0, sizeof(float) * (size_t)(ATT_BLK * hp));
                for (int64_t r = 0; r < ATT_BLK; r++) {
                    m[r] = -INFINITY;
                    l[r] = 0.0f;
                }
                for (int64_t k0 = 0; k0 <= q0; k0 += ATT_BLK) {
                    int diag = k0 == q0;
                    int64_t nk = diag ? nq : ATT_BLK;
                    att_load_cols(w->kt, base + k0 * C3 + C, nk, hs, hp, C3);
                    att_load_rows(w->v, base + k0 * C3 + 2 * C, nk, hs, hp, C3, 1.0f);
                    att_tile_nt(w->s, w->q, w->kt, rows, hp, diag);
                    for (int64_t r = 0; r < rows; r++) {
                        float *s = w->s + r * ATT_BLK, bm = -INFINITY, sum = 0.0f;
                        if (r >= nq) {
                            memset(s, 0, sizeof(float) * ATT_BLK);
                            continue;
                        }
                        int64_t n = att_seen(r, nk, diag);
#pragma omp simd reduction(max : bm)
                        for (int64_t jj = 0; jj < n; jj++)
                            bm = s[jj] > bm ? s[jj] : bm;
                        float mo = m[r], mn = bm > mo ? bm : mo, corr = expf(mo - mn);
                        if (corr != 1.0f)
                            for (int64_t i = 0; i < hp; i++)
                                w->o[r * hp + i] *= corr;
#pragma omp simd
                        for (int64_t jj = 0; jj < ATT_BLK; jj++)
                            s[jj] = mge__expf(s[jj] - mn);
                        for (int64_t jj = n; jj < ATT_BLK; jj++)
                            s[jj] = 0.0f;
#pragma omp simd reduction(+ : sum)
                        for (int64_t jj = 0; jj < ATT_BLK; jj++)
                            sum += s[jj];
                        m[r] = mn;
                        l[r] = l[r] * corr + sum;
                    }
                    att_tile_nn(w->o, w->s, w->v, rows, nk, hp, diag);
                }
                for (int64_t r = 0; r < nq; r++) {
                    float *o = out + (b * T + q0 + r) * C + h * hs, inv = 1.0f / l[r];
                    for (int64_t i = 0; i < hs; i++)
                        o[i] = w->o[r * hp + i] * inv;
                    lse[(b * NH + h) * T + q0 + r] = m[r] + logf(l[r]);
                }
            }
        }
    }
}

/* dst (n rows, @stride apart) += src (n rows of hp), the first hs columns. */
static void att_add_rows(float *dst, const float *src, int64_t n, int64_t hs, int64_t hp,
                         int64_t stride)
{
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < hs; i++)
            dst[r * stride + i] += src[r * hp + i];
}

/*
 * With p_tj = exp(s_tj - lse_t) and D_t = dout_t . out_t (= sum_j p_tj dp_tj):
 * dv_j += p_tj dout_t, ds_tj = p_tj (dout_t . v_j - D_t), dq_t += scale ds_tj k_j,
 * dk_j += scale ds_tj q_t. Key tiles outside, their dk and dv accumulated in scratch over the
 * query tiles that see them, in order; each tile's dq added to dqkv as the key tiles go, in order.
 */
MGE__CPU_CLONES
void mge_cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                                const float *lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                                int acc)
{
    int64_t hs = C / NH, C3 = 3 * C, hp = att_up(hs, 2 * ATT_V);
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static) if (B * NH * T * T * hs > MGE__PAR_MIN)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < NH; h++) {
            struct att_scratch *w = &att_scr;
            const float *base = qkv + b * T * C3 + h * hs;
            const float *dyb = dout + b * T * C + h * hs, *ob = out + b * T * C + h * hs;
            float *dbase = dqkv + b * T * C3 + h * hs;
            const float *L = lse + (b * NH + h) * T;
            float D[ATT_BLK];
            if (!acc)
                for (int64_t t = 0; t < T; t++)
                    for (int part = 0; part < 3; part++)
                        memset(dbase + t * C3 + part * C, 0, sizeof(float) * (size_t)hs);
            for (int64_t k0 = 0; k0 < T; k0 += ATT_BLK) {
                int64_t nk = k0 + ATT_BLK < T ? ATT_BLK : T - k0, keys = att_up(nk, 4);
                att_load_rows(w->k, base + k0 * C3 + C, nk, hs, hp, C3, 1.0f);
                att_load_cols(w->kt, base + k0 * C3 + C, nk, hs, hp, C3);
                att_load_cols(w->vt, base + k0 * C3 + 2 * C, nk, hs, hp, C3);
                memset(w->dk, 0, sizeof(float) * (size_t)(ATT_BLK * hp));
                memset(w->dv, 0, sizeof(float) * (size_t)(ATT_BLK * hp));
                for (int64_t q0 = k0; q0 < T; q0 += ATT_BLK) {
                    int diag = q0 == k0;
                    int64_t nq = q0 + ATT_BLK < T ? ATT_BLK : T - q0, rows = att_up(nq, 4);
                    att_load_rows(w->q, base + q0 * C3, nq, hs, hp, C3, 1.0f);
                    att_load_rows(w->dy, dyb + q0 * C, nq, hs, hp, C, 1.0f);
                    for (int64_t r = 0; r < nq; r++) {
                        float d = 0.0f;
                        for (int64_t i = 0; i < hs; i++)
                            d += dyb[(q0 + r) * C + i] * ob[(q0 + r) * C + i];
                        D[r] = d;
                    }
                    att_tile_nt(w->s, w->q, w->kt, rows, hp, diag);
                    att_tile_nt(w->ds, w->dy, w->vt, rows, hp, diag);
                    for (int64_t r = 0; r < rows; r++) {
                        float *s = w->s + r * ATT_BLK, *ds = w->ds + r * ATT_BLK;
                        if (r >= nq) {
                            memset(s, 0, sizeof(float) * ATT_BLK);
                            memset(ds, 0, sizeof(float) * ATT_BLK);
                            continue;
                        }
                        float Lr = L[q0 + r], Dr = D[r];
                        int64_t n = att_seen(r, nk, diag);
#pragma omp simd
                        for (int64_t jj = 0; jj < ATT_BLK; jj++)
                            s[jj] = mge__expf(s[jj] * scale - Lr);
                        for (int64_t jj = n; jj < ATT_BLK; jj++)
                            s[jj] = 0.0f;
#pragma omp simd
                        for (int64_t jj = 0; jj < ATT_BLK; jj++)
                            ds[jj] = s[jj] * (ds[jj] - Dr) * scale;
                    }
                    att_tile_tn(w->dv, w->s, w->dy, keys, rows, hp, diag);
                    att_tile_tn(w->dk, w->ds, w->q, keys, rows, hp, diag);
                    memset(w->o, 0, sizeof(float) * (size_t)(ATT_BLK * hp));
                    att_tile_nn(w->o, w->ds, w->k, rows, nk, hp, diag);
                    att_add_rows(dbase + q0 * C3, w->o, nq, hs, hp, C3);
                }
                att_add_rows(dbase + k0 * C3 + C, w->dk, nk, hs, hp, C3);
                att_add_rows(dbase + k0 * C3 + 2 * C, w->dv, nk, hs, hp, C3);
            }
        }
    }
}
