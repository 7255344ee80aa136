/*
 * test_engine.c: the graph engine: every op's gradient through autodiff against central finite
 * differences, fan-out accumulation, batch-size semantics, the memory planner, optimisers.
 *
 * Gradient tolerance: eps = 1e-2 (float32 forward), |fd - analytic| <= 5e-3 + 2e-2 * |fd|.
 */
#include <check.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/rng.h"
#include "engine/engine.h"
#include "engine/engine_int.h"
#include "engine/model.h"
#include "engine/optim.h"
#include "kernels/cpu/cpu.h"
#include "tests/unit/support/check_run.h"

#define GC_EPS 1e-2f
#define GC_ATOL 5e-3
#define GC_RTOL 2e-2

struct gc {
    struct mge_graph *g;
    int r;             /* random weights of the final sum */
    float *rdata;
    int loss;
    int inputs[4];     /* non-parameter inputs to fill */
    void *idata[4];
    int n_inputs;
    struct mge_rng rng;
};

static void gc_init(struct gc *c)
{
    memset(c, 0, sizeof(*c));
    ck_assert_int_eq(mge_graph_new(&c->g), MGE_OK);
    c->r = -1;
    mge_rng_seed(&c->rng, 1234);
}

static int gc_param(struct gc *c, const char *name, int ndim, const int64_t *shape)
{
    int v = mge_param(c->g, name, ndim, shape, MGE_INIT_ZERO, 1);
    ck_assert_int_ge(v, 0);
    return v;
}

/* An int32 input filled with values in [0, hi). */
static int gc_int_input(struct gc *c, const char *name, int ndim, const int64_t *shape, int hi)
{
    int v = mge_input(c->g, name, MGE_DTYPE_I32, ndim, shape, 0);
    ck_assert_int_ge(v, 0);
    int64_t n = mge_value_numel(c->g, v);
    int32_t *d = mge_malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        d[i] = (int32_t)mge_rng_below(&c->rng, (uint64_t)hi);
    c->inputs[c->n_inputs] = v;
    c->idata[c->n_inputs++] = d;
    return v;
}

/* loss = sum(out * r) unless @out is already a scalar loss. Then build, plan, fill. */
static void gc_finish(struct gc *c, int out)
{
    ck_assert_msg(out >= 0, "build failed: %s", mge_graph_error_msg(c->g));
    int loss = out;
    if (mge_value_numel(c->g, out) != 1 || mge_value_ndim(c->g, out) != 0) {
        c->r = mge_input(c->g, "r", MGE_DTYPE_F32, mge_value_ndim(c->g, out),
                         mge_value_shape(c->g, out), 0);
        loss = mge_sum(c->g, mge_mul(c->g, out, c->r), -1);
    }
    ck_assert_msg(loss >= 0, "build failed: %s", mge_graph_error_msg(c->g));
    c->loss = loss;
    ck_assert_int_eq(mge_graph_backward(c->g, loss), MGE_OK);
    ck_assert_int_eq(mge_graph_plan(c->g, NULL), MGE_OK);
    ck_assert_int_eq(mge_graph_alloc(c->g), MGE_OK);
    if (c->r >= 0) {
        int64_t n = mge_value_numel(c->g, c->r);
        c->rdata = mge_malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < n; i++)
            c->rdata[i] = 2.0f * mge_rng_float(&c->rng) - 1.0f;
        mge_graph_bind(c->g, c->r, c->rdata);
    }
    for (int i = 0; i < c->n_inputs; i++)
        mge_graph_bind(c->g, c->inputs[i], c->idata[i]);
    for (int i = 0; i < mge_graph_n_params(c->g); i++) {
        int v = mge_graph_param(c->g, i);
        float *d = mge_value_data(c->g, v);
        for (int64_t k = 0; k < mge_value_numel(c->g, v); k++)
            d[k] = 2.0f * mge_rng_float(&c->rng) - 1.0f;
    }
}

static double gc_loss(struct gc *c)
{
    ck_assert_int_eq(mge_graph_run(c->g, MGE_RUN_FORWARD_TRAIN, 7), MGE_OK);
    return *(float *)mge_value_data(c->g, c->loss);
}

/* Compare every parameter's analytic gradient with central differences. */
static void gc_check(struct gc *c)
{
    ck_assert_int_eq(mge_graph_run(c->g, MGE_RUN_TRAIN, 7), MGE_OK);
    int64_t ng;
    float *grads = mge_graph_grads(c->g, &ng);
    float *copy = mge_malloc(sizeof(float) * (size_t)(ng ? ng : 1));
    memcpy(copy, grads, sizeof(float) * (size_t)ng);
    float *garena = grads;
    for (int i = 0; i < mge_graph_n_params(c->g); i++) {
        int v = mge_graph_param(c->g, i), gv = mge_graph_grad(c->g, v);
        float *p = mge_value_data(c->g, v);
        const float *an = gv >= 0 ? copy + ((float *)mge_value_data(c->g, gv) - garena) : NULL;
        for (int64_t k = 0; k < mge_value_numel(c->g, v); k++) {
            float keep = p[k];
            p[k] = keep + GC_EPS;
            double lp = gc_loss(c);
            p[k] = keep - GC_EPS;
            double lm = gc_loss(c);
            p[k] = keep;
            double fd = (lp - lm) / (2.0 * GC_EPS), a = an ? an[k] : 0.0;
            ck_assert_msg(fabs(fd - a) <= GC_ATOL + GC_RTOL * fabs(fd),
                          "param '%s'[%lld]: analytic %g, finite difference %g",
                          mge_value_name(c->g, v), (long long)k, a, fd);
        }
    }
    mge_free(copy);
}

static void gc_fini(struct gc *c)
{
    mge_graph_free(c->g);
    mge_free(c->rdata);
    for (int i = 0; i < c->n_inputs; i++)
        mge_free(c->idata[i]);
}

START_TEST(test_grad_matmul)
{
    /* all four transpose combinations */
    int ta = _i & 1, tb = (_i >> 1) & 1;
    struct gc c;
    gc_init(&c);
    int64_t as[2] = {ta ? 4 : 3, ta ? 3 : 4}, bs[2] = {tb ? 5 : 4, tb ? 4 : 5};
    int a = gc_param(&c, "a", 2, as), b = gc_param(&c, "b", 2, bs);
    gc_finish(&c, mge_matmul(c.g, a, b, ta, tb));
    gc_check(&c);
    gc_fini(&c);
}
END_TEST

START_TEST(test_grad_linear)
{
    /* _i: activation none, relu, gelu, tanh, sigmoid */
    struct gc c;
    gc_init(&c);
    int64_t xs[2] = {3, 5}, ws[2] = {4, 5}, bs[1] = {4};
    int x = gc_param(&c, "x", 2, xs), w = gc_param(&c, "w", 2, ws), b = gc_param(&c, "b", 1, bs);
    gc_finish(&c, mge_linear(c.g, x, w, b, (enum mge_act)_i));
    gc_check(&c);
    gc_fini(&c);
}
END_TEST

START_TEST(test_grad_binary_broadcast)
{
    /* _i: add, sub, mul, div; b broadcasts over rows and a has a size-1 dim */
    struct gc c;
    gc_init(&c);
    int64_t as[3] = {2, 1, 4}, bs[2] = {3, 4};
    int a = gc_param(&c, "a", 3, as), b = gc_param(&c, "b", 2, bs);
    int out;
    switch (_i) {
    case 0: out = mge_add(c.g, a, b); break;
    case 1: out = mge_sub(c.g, a, b); break;
    case 2: out = mge_mul(c.g, a, b); break;
    default: {
        /* keep the divisor away from zero: b' = b*b + 1 */
        int b2 = mge_add(c.g, mge_mul(c.g, b, b), mge_div(c.g, b, b));
        out = mge_div(c.g, a, b2);
    }
    }
    gc_finish(&c, out);
    gc_check(&c);
    gc_fini(&c);
}
END_TEST

START_TEST(test_grad_unary)
{
    struct gc c;
    gc_init(&c);
    int64_t xs[2] = {3, 4}, bs[1] = {4};
    int x = gc_param(&c, "x", 2, xs), b = gc_param(&c, "b", 1, bs);
    int y = mge_bias_add(c.g, x, b);
    switch (_i) {
    case 0: y = mge_relu(c.g, y); break;
    case 1: y = mge_gelu(c.g, y); break;
    case 2: y = mge_tanh(c.g, y); break;
    case 3: y = mge_sigmoid(c.g, y); break;
    case 4: y = mge_softmax(c.g, y); break;
    default: y = mge_log_softmax(c.g, y); break;
    }
    gc_finish(&c, y);
    gc_check(&c);
    gc_fini(&c);
}
END_TEST

START_TEST(test_grad_cross_entropy)
{
    /* _i: plain, then label smoothing 0.1 and 0.45 */
    static const float smoothing[3] = {0.0f, 0.1f, 0.45f};
    struct gc c;
    gc_init(&c);
    int64_t xs[2] = {5, 7}, ys[1] = {5};
    int x = gc_param(&c, "logits", 2, xs);
    int y = gc_int_input(&c, "labels", 1, ys, 7);
    gc_finish(&c, _i ? mge_cross_entropy_smoothed(c.g, x, y, smoothing[_i])
                     : mge_cross_entropy(c.g, x, y));
    gc_check(&c);
    gc_fini(&c);
}
END_TEST

/* Label smoothing against values computed by hand (PyTorch's definition). */
START_TEST(test_cross_entropy_smoothed_values)
{
    const float x[6] = {1, 2, 3, 0, 0, 0};
    const int32_t y[2] = {2, 1};
    float loss, loss0, probs[6], d[6], d0[6];
    /* row 0: lse(1,2,3) - 0.7 * 3 - 0.1 * (1 + 2 + 3); row 1: log 3 */
    double lse0 = 3.0 + log(exp(-2.0) + exp(-1.0) + 1.0);
    double want = 0.5 * ((lse0 - 2.1 - 0.6) + log(3.0));
    mge_cpu_softmax_xent_smooth_forward(&loss, probs, x, y, 2, 3, 0.3f);
    ck_assert_double_eq_tol(loss, want, 1e-6);
    ck_assert_double_eq_tol(loss, 0.9031091, 1e-6);
    mge_cpu_softmax_xent_smooth_backward(d, probs, y, 2, 3, 1.0f, 0.3f, 0);
    /* target: 0.1 off the label, 0.8 on it; dlogits = (p - target) / B */
    for (int j = 0; j < 3; j++) {
        double p0 = exp(x[j] - lse0);
        ck_assert_double_eq_tol(d[j], (p0 - (j == 2 ? 0.8 : 0.1)) / 2.0, 1e-6);
        ck_assert_double_eq_tol(d[3 + j], (1.0 / 3.0 - (j == 1 ? 0.8 : 0.1)) / 2.0, 1e-6);
    }
    ck_assert_double_eq_tol(d[3], 0.1166667, 1e-6);
    ck_assert_double_eq_tol(d[4], -0.2333333, 1e-6);
    /* smoothing 0 keeps the plain kernels' bits */
    mge_cpu_softmax_xent_smooth_forward(&loss, probs, x, y, 2, 3, 0.0f);
    mge_cpu_softmax_xent_smooth_backward(d, probs, y, 2, 3, 1.0f, 0.0f, 0);
    mge_cpu_softmax_xent_forward(&loss0, probs, x, y, 2, 3);
    mge_cpu_softmax_xent_backward(d0, probs, y, 2, 3, 1.0f, 0);
    ck_assert_int_eq(memcmp(&loss, &loss0, sizeof(loss)), 0);
    ck_assert_int_eq(memcmp(d, d0, sizeof(d)), 0);
    /* out of range: a build error naming the op */
    struct mge_graph *g;
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    int64_t ls[2] = {2, 3}, lbs[1] = {2};
    int l = mge_param(g, "l", 2, ls, MGE_INIT_ZERO, 1);
    int lb = mge_input(g, "y", MGE_DTYPE_I32, 1, lbs, 0);
    ck_assert_int_lt(mge_cross_entropy_smoothed(g, l, lb, 1.0f), 0);
    ck_assert_ptr_nonnull(strstr(mge_graph_error_msg(g), "label smoothing"));
    mge_graph_free(g);
}
END_TEST

START_TEST(test_grad_reduce)
{
    /* _i: sum axis 1, mean axis 0, mean all */
    struct gc c;
    gc_init(&c);
    int64_t xs[3] = {2, 3, 4};
    int x = gc_param(&c, "x", 3, xs);
    int y = _i == 0 ? mge_sum(c.g, x, 1) : _i == 1 ? mge_mean(c.g, x, 0) : mge_mean(c.g, x, -1);
    if (_i == 2)
        y = mge_mul(c.g, y, y); /* non-trivial scalar */
    gc_finish(&c, y);
    gc_check(&c);
    gc_fini(&c);
}
END_TEST

START_TEST(test_grad_shape_ops)
{
    /* reshape, transpose, concat, slice */
    struct gc c;
    gc_init(&c);
    int64_t xs[3] = {2, 3, 4}, zs[3] = {2, 2, 4}, rs[2] = {6, 4};
    int x = gc_param(&c, "x", 3, xs), z = gc_param(&c, "z", 3, zs);
    int t = mge_transpose(c.g, x, 1, 2);             /* (2, 4, 3) */
    t = mge_transpose(c.g, t, 1, 2);                 /* (2, 3, 4) */
    int parts[2] = {t, z};
    int cat = mge_concat(c.g, parts, 2, 1);          /* (2, 5, 4) */
    int s = mge_slice(c.g, cat, 1, 1, 3);            /* (2, 3, 4) */
    int r = mge_reshape(c.g, s, 2, rs);              /* (6, 4) */
    r = mge_tanh(c.g, r);
    gc_finish(&c, r);
    gc_check(&c);
    gc_fini(&c);
}
END_TEST

START_TEST(test_grad_conv_pool)
{
    /* _i: conv (stride 2, pad 1) + maxpool; conv (stride 1, pad 0) + avgpool */
    struct gc c;
    gc_init(&c);
    int64_t xs[4] = {2, 2, 6, 6}, ws[4] = {3, 2, 3, 3}, bs[1] = {3};
    int x = gc_param(&c, "x", 4, xs), w = gc_param(&c, "w", 4, ws), b = gc_param(&c, "b", 1, bs);
    int y = _i == 0 ? mge_conv2d(c.g, x, w, b, 2, 1) : mge_conv2d(c.g, x, w, b, 1, 0);
    y = _i == 0 ? mge_maxpool2d(c.g, y, 2, 1, 0) : mge_avgpool2d(c.g, y, 2, 2, 0);
    gc_finish(&c, mge_flatten(c.g, y));
    gc_check(&c);
    gc_fini(&c);
}
END_TEST

START_TEST(test_grad_layernorm_embedding_dropout)
{
    struct gc c;
    gc_init(&c);
    int64_t ids_s[2] = {2, 3}, ts[2] = {5, 4}, cs[1] = {4};
    int ids = gc_int_input(&c, "ids", 2, ids_s, 5);
    int table = gc_param(&c, "table", 2, ts);
    int w = gc_param(&c, "ln.w", 1, cs), b = gc_param(&c, "ln.b", 1, cs);
    int e = mge_embedding(c.g, ids, table);          /* (2, 3, 4) */
    int y = mge_layernorm(c.g, e, w, b, 1e-5f);
    y = mge_dropout(c.g, y, 0.3f);
    gc_finish(&c, y);
    /* dropout's mask depends on (seed, step): gc_loss and gc_check both run at step 7 */
    gc_check(&c);
    gc_fini(&c);
}
END_TEST

/*
 * Causal attention on a (B, T, 3C) parameter: _i = 0 small, 1 with T = 70 (two key blocks of
 * the online softmax), 2 with qkv also feeding a slice, so its gradient accumulates (acc).
 */
START_TEST(test_grad_attention)
{
    struct gc c;
    gc_init(&c);
    int64_t B = _i == 1 ? 1 : 2, T = _i == 1 ? 70 : 5, C = _i == 1 ? 4 : 8;
    int64_t qs[3] = {B, T, 3 * C};
    int qkv = gc_param(&c, "qkv", 3, qs);
    int y = mge_causal_attention(c.g, qkv, 2);
    if (_i == 2)
        y = mge_add(c.g, y, mge_slice(c.g, qkv, 2, C, C));
    gc_finish(&c, y);
    gc_check(&c);
    gc_fini(&c);
}
END_TEST

/*
 * Forward and backward (T = 130: two full tiles and a partial one, head 8 padded to 32) give
 * the same bits on 1 and 2 threads: every sum runs in a fixed order inside one (b, h).
 */
START_TEST(test_attention_thread_independent)
{
    enum { B = 2, T = 130, C = 24, NH = 3 };
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    struct mge_rng rng;
    mge_rng_seed(&rng, 7);
    float *qkv = mge_malloc(sizeof(float) * nq), *dy = mge_malloc(sizeof(float) * no);
    float *out[2], *lse[2], *dq[2];
    for (size_t i = 0; i < nq; i++)
        qkv[i] = 4.0f * mge_rng_float(&rng) - 2.0f;
    for (size_t i = 0; i < no; i++)
        dy[i] = 2.0f * mge_rng_float(&rng) - 1.0f;
    int saved = omp_get_max_threads();
    for (int k = 0; k < 2; k++) {
        out[k] = mge_malloc(sizeof(float) * no);
        lse[k] = mge_malloc(sizeof(float) * nl);
        dq[k] = mge_malloc(sizeof(float) * nq);
        omp_set_num_threads(k + 1);
        mge_cpu_attention_forward(out[k], lse[k], qkv, B, T, C, NH);
        mge_cpu_attention_backward(dq[k], dy, qkv, out[k], lse[k], B, T, C, NH, 0);
    }
    omp_set_num_threads(saved);
    ck_assert(memcmp(out[0], out[1], sizeof(float) * no) == 0);
    ck_assert(memcmp(lse[0], lse[1], sizeof(float) * nl) == 0);
    ck_assert(memcmp(dq[0], dq[1], sizeof(float) * nq) == 0);
    for (size_t i = 0; i < nq; i++)
        ck_assert_msg(isfinite(dq[0][i]), "dqkv[%zu] = %g", i, dq[0][i]);
    for (int k = 0; k < 2; k++) {
        mge_free(out[k]);
        mge_free(lse[k]);
        mge_free(dq[k]);
    }
    mge_free(qkv);
    mge_free(dy);
}
END_TEST

/* Forward against the plain formula with the T x T softmax materialised: |diff| <= 1e-5. */
START_TEST(test_attention_matches_naive)
{
    enum { B = 2, T = 67, C = 12, NH = 3, HS = C / NH };
    struct mge_rng rng;
    mge_rng_seed(&rng, 99);
    float *qkv = mge_malloc(sizeof(float) * B * T * 3 * C),
          *out = mge_malloc(sizeof(float) * B * T * C);
    float *lse = mge_malloc(sizeof(float) * B * NH * T), p[T];
    for (int i = 0; i < B * T * 3 * C; i++)
        qkv[i] = 4.0f * mge_rng_float(&rng) - 2.0f;
    mge_cpu_attention_forward(out, lse, qkv, B, T, C, NH);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + (b * T + t) * 3 * C + h * HS;
                double m = -1e30, l = 0.0;
                for (int j = 0; j <= t; j++) {
                    const float *k = qkv + (b * T + j) * 3 * C + C + h * HS;
                    double s = 0.0;
                    for (int i = 0; i < HS; i++)
                        s += (double)q[i] * k[i];
                    p[j] = (float)(s / sqrt((double)HS));
                    m = p[j] > m ? p[j] : m;
                }
                for (int j = 0; j <= t; j++)
                    l += exp(p[j] - m);
                ck_assert_msg(fabs(lse[(b * NH + h) * T + t] - (m + log(l))) <= 1e-5,
                              "lse[%d,%d,%d]", b, h, t);
                for (int i = 0; i < HS; i++) {
                    double o = 0.0;
                    for (int j = 0; j <= t; j++)
                        o += exp(p[j] - m) / l * qkv[(b * T + j) * 3 * C + 2 * C + h * HS + i];
                    ck_assert_msg(fabs(out[(b * T + t) * C + h * HS + i] - o) <= 1e-5,
                                  "out[%d,%d,%d]: %g vs %g", b, t, h * HS + i,
                                  out[(b * T + t) * C + h * HS + i], o);
                }
            }
    mge_free(qkv);
    mge_free(out);
    mge_free(lse);
}
END_TEST

START_TEST(test_grad_batchnorm_residual_gap)
{
    /* _i == 0: affine batch norm; 1: without weight and bias. Then a residual add of the input
     * and global average pooling: tanh(bn(x)) + x -> mean over H, W */
    struct gc c;
    gc_init(&c);
    int64_t xs[4] = {3, 2, 3, 4}, cs[1] = {2};
    int x = gc_param(&c, "x", 4, xs);
    int w = _i == 0 ? gc_param(&c, "bn.weight", 1, cs) : -1;
    int b = _i == 0 ? gc_param(&c, "bn.bias", 1, cs) : -1;
    int rm = mge_buffer(c.g, "bn.running_mean", 1, cs, MGE_INIT_ZERO);
    int rv = mge_buffer(c.g, "bn.running_var", 1, cs, MGE_INIT_ONE);
    int y = mge_batchnorm2d(c.g, x, w, b, rm, rv, 1e-5f, 0.1f);
    y = mge_global_avgpool2d(c.g, mge_add(c.g, mge_tanh(c.g, y), x)); /* tanh: no kink for FD */
    ck_assert_int_eq(mge_value_ndim(c.g, y), 2);
    ck_assert_int_eq(mge_value_shape(c.g, y)[1], 2);
    gc_finish(&c, y);
    /* buffers: no gradient, and outside the gradient arena (the optimiser's extent) */
    int64_t np, ng;
    mge_graph_params(c.g, &np);
    mge_graph_grads(c.g, &ng);
    ck_assert_int_eq(mge_graph_grad(c.g, rm), -1);
    ck_assert_int_eq(mge_graph_grad(c.g, rv), -1);
    ck_assert(mge_value_is_buffer(c.g, rm) && !mge_value_is_buffer(c.g, x));
    ck_assert_int_lt(ng, np);
    ck_assert_int_ge((float *)mge_value_data(c.g, rm) - mge_graph_params(c.g, NULL), ng);
    ck_assert_int_ge((float *)mge_value_data(c.g, rv) - mge_graph_params(c.g, NULL), ng);
    gc_check(&c);
    gc_fini(&c);
}
END_TEST

/*
 * Training runs normalise with batch statistics and move the running ones as PyTorch does
 * (momentum 0.1, unbiased variance); inference runs normalise with the running ones and leave
 * them alone. Reference in double, tolerance 1e-5 relative.
 */
START_TEST(test_batchnorm_running_stats)
{
    struct mge_graph *g;
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    enum { N = 4, C = 2, HW = 6 };
    int64_t xs[4] = {N, C, 2, 3}, cs[1] = {C};
    int x = mge_input(g, "x", MGE_DTYPE_F32, 4, xs, 1);
    int w = mge_param(g, "bn.weight", 1, cs, MGE_INIT_ONE, 1);
    int b = mge_param(g, "bn.bias", 1, cs, MGE_INIT_ZERO, 1);
    int rm = mge_buffer(g, "bn.running_mean", 1, cs, MGE_INIT_ZERO);
    int rv = mge_buffer(g, "bn.running_var", 1, cs, MGE_INIT_ONE);
    int y = mge_batchnorm2d(g, x, w, b, rm, rv, 1e-5f, 0.1f);
    ck_assert_msg(y >= 0, "%s", mge_graph_error_msg(g));
    ck_assert_int_eq(mge_graph_keep(g, y), MGE_OK);
    ck_assert_int_eq(mge_graph_plan(g, NULL), MGE_OK);
    ck_assert_int_eq(mge_graph_alloc(g), MGE_OK);
    mge_graph_init_params(g, 1);
    float xd[N * C * HW], *wd = mge_value_data(g, w), *bd = mge_value_data(g, b);
    const float *rmd = mge_value_data(g, rm), *rvd = mge_value_data(g, rv);
    const float *yd = mge_value_data(g, y);
    struct mge_rng rng;
    mge_rng_seed(&rng, 9);
    for (int i = 0; i < N * C * HW; i++)
        xd[i] = 3.0f * mge_rng_float(&rng) + (float)(i % 5);
    wd[0] = 0.5f, wd[1] = -2.0f, bd[0] = 0.25f, bd[1] = 1.0f;
    ck_assert_int_eq(mge_graph_bind(g, x, xd), MGE_OK);
    double em[C] = {0}, ev[C] = {1, 1};
    for (int round = 0; round < 2; round++) {
        ck_assert_int_eq(mge_graph_run(g, MGE_RUN_FORWARD_TRAIN, round), MGE_OK);
        for (int c = 0; c < C; c++) {
            double m = 0, v = 0;
            for (int n = 0; n < N; n++)
                for (int i = 0; i < HW; i++)
                    m += xd[(n * C + c) * HW + i];
            m /= N * HW;
            for (int n = 0; n < N; n++)
                for (int i = 0; i < HW; i++)
                    v += (xd[(n * C + c) * HW + i] - m) * (xd[(n * C + c) * HW + i] - m);
            em[c] = 0.9 * em[c] + 0.1 * m;
            ev[c] = 0.9 * ev[c] + 0.1 * v / (N * HW - 1);
            ck_assert_double_eq_tol(rmd[c], em[c], 1e-5 * fabs(em[c]) + 1e-6);
            ck_assert_double_eq_tol(rvd[c], ev[c], 1e-5 * fabs(ev[c]));
            for (int n = 0; n < N; n++) /* training output: batch statistics */
                for (int i = 0; i < HW; i++) {
                    int k = (n * C + c) * HW + i;
                    double want = (xd[k] - m) / sqrt(v / (N * HW) + 1e-5) * wd[c] + bd[c];
                    ck_assert_double_eq_tol(yd[k], want, 1e-4 * fabs(want) + 1e-5);
                }
        }
    }
    float rm_before[C], rv_before[C];
    memcpy(rm_before, rmd, sizeof(rm_before));
    memcpy(rv_before, rvd, sizeof(rv_before));
    ck_assert_int_eq(mge_graph_run(g, MGE_RUN_INFER, 2), MGE_OK);
    ck_assert_mem_eq(rm_before, rmd, sizeof(rm_before)); /* inference leaves them alone */
    ck_assert_mem_eq(rv_before, rvd, sizeof(rv_before));
    for (int k = 0; k < N * C * HW; k++) { /* inference output: running statistics */
        int c = (k / HW) % C;
        double want = (xd[k] - em[c]) / sqrt(ev[c] + 1e-5) * wd[c] + bd[c];
        ck_assert_double_eq_tol(yd[k], want, 1e-4 * fabs(want) + 1e-5);
    }
    /* bad shapes and trained (not buffer) running statistics are refused */
    int bad = mge_batchnorm2d(g, w, w, b, rm, rv, 1e-5f, 0.1f);
    ck_assert_int_lt(bad, 0);
    mge_graph_free(g);
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    x = mge_input(g, "x", MGE_DTYPE_F32, 4, xs, 1);
    w = mge_param(g, "w", 1, cs, MGE_INIT_ONE, 1);
    ck_assert_int_lt(mge_batchnorm2d(g, x, -1, -1, w, w, 1e-5f, 0.1f), 0);
    ck_assert_ptr_nonnull(strstr(mge_graph_error_msg(g), "buffers"));
    mge_graph_free(g);
}
END_TEST

/*
 * The resnet zoo model: PyTorch's parameter names and counts, option-B shortcuts only where the
 * shape changes, kaiming-normal fan-out conv init, and the output shape. ResNet-20, width 16, on
 * 1x28x28 with 10 classes: stem 144 + 32; layer1 3 x 4672; layer2 14528 + 2 x 18560; layer3
 * 57728 + 2 x 73984; fc 650: 272186 trained floats; 21 batch norms (stem, 18 in blocks, 2
 * in shortcuts), 2 buffers each.
 */
START_TEST(test_model_resnet)
{
    struct mge_jobspec spec;
    memset(&spec, 0, sizeof(spec));
    spec.model.type = MGE_MODEL_RESNET;
    spec.model.depth = 20;
    spec.model.width = 16;
    struct mge_graph *g;
    struct mge_model m;
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    ck_assert_msg(mge_model_build(g, &spec, 4, 1, 28, 28, 10, &m) == MGE_OK, "%s",
                  mge_graph_error_msg(g));
    ck_assert_int_eq(mge_value_ndim(g, m.logits), 2);
    ck_assert_int_eq(mge_value_shape(g, m.logits)[1], 10);
    int64_t trained = 0;
    int buffers = 0, convs = 0;
    for (int i = 0; i < mge_graph_n_params(g); i++) {
        int v = mge_graph_param(g, i);
        if (mge_value_is_buffer(g, v))
            buffers++;
        else
            trained += mge_value_numel(g, v);
        convs += mge_value_ndim(g, v) == 4;
    }
    ck_assert_int_eq(trained, 272186);
    ck_assert_int_eq(buffers, 2 * 21);
    ck_assert_int_eq(convs, 21); /* 19 3x3 + 2 downsample */
    static const char *const names[] = {
        "conv1.weight",
        "bn1.weight",
        "bn1.running_mean",
        "layer1.0.conv1.weight",
        "layer1.2.bn2.bias",
        "layer2.0.downsample.0.weight",
        "layer2.0.downsample.1.running_var",
        "layer3.2.conv2.weight",
        "fc.weight",
        "fc.bias",
    };
    for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
        int found = 0;
        for (int i = 0; i < mge_graph_n_params(g) && !found; i++)
            found = !strcmp(mge_value_name(g, mge_graph_param(g, i)), names[k]);
        ck_assert_msg(found, "no parameter '%s'", names[k]);
    }
    for (int i = 0; i < mge_graph_n_params(g); i++) /* no shortcut conv where shapes agree */
        ck_assert_ptr_null(strstr(mge_value_name(g, mge_graph_param(g, i)), "layer1.0.downsample"));
    ck_assert_int_eq(mge_graph_backward(g, m.loss), MGE_OK);
    ck_assert_int_eq(mge_graph_plan(g, NULL), MGE_OK);
    ck_assert_int_eq(mge_graph_alloc(g), MGE_OK);
    mge_graph_init_params(g, 3);
    for (int i = 0; i < mge_graph_n_params(g); i++) {
        int v = mge_graph_param(g, i);
        const char *name = mge_value_name(g, v);
        const float *d = mge_value_data(g, v);
        int64_t n = mge_value_numel(g, v);
        if (!strcmp(name, "layer3.1.conv1.weight")) { /* N(0, 2 / (64 * 9)): std 0.0589 */
            double sum = 0, sq = 0;
            for (int64_t k = 0; k < n; k++)
                sum += d[k], sq += (double)d[k] * d[k];
            ck_assert_double_le(fabs(sum / (double)n), 0.002);
            ck_assert_double_eq_tol(sqrt(sq / (double)n), sqrt(2.0 / 576.0), 0.002);
        }
        if (strstr(name, "running_var") || (strstr(name, "bn") && strstr(name, ".weight")))
            for (int64_t k = 0; k < n; k++)
                ck_assert_float_eq(d[k], 1.0f);
        if (strstr(name, "running_mean") || (strstr(name, "bn") && strstr(name, ".bias")))
            for (int64_t k = 0; k < n; k++)
                ck_assert_float_eq(d[k], 0.0f);
    }
    mge_graph_free(g);
}
END_TEST

/* Trained floats of @spec's model on (c, h, w) images with @classes classes; *@bufs buffers. */
static int64_t zoo_trained_floats(const struct mge_jobspec *spec, int c, int h, int w, int classes,
                                  int *bufs, struct mge_graph **gp)
{
    struct mge_graph *g;
    struct mge_model m;
    int64_t trained = 0;
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    ck_assert_msg(mge_model_build(g, spec, 1, c, h, w, classes, &m) == MGE_OK, "%s",
                  mge_graph_error_msg(g));
    ck_assert_int_eq(mge_value_shape(g, m.logits)[1], classes);
    *bufs = 0;
    for (int i = 0; i < mge_graph_n_params(g); i++) {
        int v = mge_graph_param(g, i);
        if (mge_value_is_buffer(g, v))
            ++*bufs;
        else
            trained += mge_value_numel(g, v);
    }
    *gp = g;
    return trained;
}

/* Whether @g has a parameter or buffer named @name of @ndim dims @shape. */
static bool has_param(struct mge_graph *g, const char *name, int ndim, const int64_t *shape)
{
    for (int i = 0; i < mge_graph_n_params(g); i++) {
        int v = mge_graph_param(g, i);
        if (strcmp(mge_value_name(g, v), name))
            continue;
        return mge_value_ndim(g, v) == ndim &&
               !memcmp(mge_value_shape(g, v), shape, (size_t)ndim * sizeof(int64_t));
    }
    return false;
}

/*
 * torchvision's ResNet-18 ... 152 on 3x224x224 with 1000 classes have exactly torchvision's
 * parameter counts (sum(p.numel() for p in model.parameters())) and 2 buffers per batch norm;
 * spot checks of names and shapes: the 7x7/2 stem, the bottleneck's 1x1-3x3-1x1 with
 * expansion 4, downsample.0/.1 where the shape changes (layer1.0 of a bottleneck net too).
 */
START_TEST(test_model_resnet_torchvision)
{
    static const struct {
        enum mge_resnet_variant v;
        int64_t params;
        int bns;
    } want[] = {
        {MGE_RESNET_18, 11689512, 20},   {MGE_RESNET_34, 21797672, 36},
        {MGE_RESNET_50, 25557032, 53},   {MGE_RESNET_101, 44549160, 104},
        {MGE_RESNET_152, 60192808, 155},
    };
    struct mge_jobspec spec;
    struct mge_graph *g;
    int bufs;
    memset(&spec, 0, sizeof(spec));
    spec.model.type = MGE_MODEL_RESNET;
    spec.model.width = 64;
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        spec.model.variant = want[i].v;
        int64_t n = zoo_trained_floats(&spec, 3, 224, 224, 1000, &bufs, &g);
        ck_assert_msg(n == want[i].params, "%s: %lld parameters, torchvision has %lld",
                      mge_resnet_variant_name(want[i].v), (long long)n, (long long)want[i].params);
        ck_assert_int_eq(bufs, 2 * want[i].bns);
        if (want[i].v == MGE_RESNET_18) {
            ck_assert(has_param(g, "conv1.weight", 4, (int64_t[]){64, 3, 7, 7}));
            ck_assert(has_param(g, "layer1.1.conv2.weight", 4, (int64_t[]){64, 64, 3, 3}));
            ck_assert(!has_param(g, "layer1.0.downsample.0.weight", 4, (int64_t[]){64, 64, 1, 1}));
            ck_assert(has_param(g, "layer4.0.downsample.0.weight", 4, (int64_t[]){512, 256, 1, 1}));
            ck_assert(has_param(g, "layer4.1.bn2.running_var", 1, (int64_t[]){512}));
            ck_assert(has_param(g, "fc.weight", 2, (int64_t[]){1000, 512}));
        }
        if (want[i].v == MGE_RESNET_50) {
            ck_assert(has_param(g, "layer1.0.conv1.weight", 4, (int64_t[]){64, 64, 1, 1}));
            ck_assert(has_param(g, "layer1.0.downsample.0.weight", 4, (int64_t[]){256, 64, 1, 1}));
            ck_assert(has_param(g, "layer2.0.conv2.weight", 4, (int64_t[]){128, 128, 3, 3}));
            ck_assert(has_param(g, "layer3.5.conv3.weight", 4, (int64_t[]){1024, 256, 1, 1}));
            ck_assert(has_param(g, "layer4.2.bn3.running_mean", 1, (int64_t[]){2048}));
            ck_assert(has_param(g, "fc.weight", 2, (int64_t[]){1000, 2048}));
        }
        mge_graph_free(g);
    }
}
END_TEST

/*
 * Small inputs: ResNet-18 builds on 1x28x28 with either stem (the ImageNet stem ends at 1x1:
 * 28 -> 14 -> 7 -> 7, 4, 2, 1) and on 3x1x1; a ResNet-18 of width 8 learns a fixed batch
 * (class k: channel k brighter) in a few SGD steps.
 */
START_TEST(test_model_resnet_small_inputs)
{
    struct mge_jobspec spec;
    struct mge_graph *g;
    int bufs;
    memset(&spec, 0, sizeof(spec));
    spec.model.type = MGE_MODEL_RESNET;
    spec.model.variant = MGE_RESNET_18;
    spec.model.width = 64;
    for (int stem = 0; stem < 2; stem++) {
        spec.model.stem_cifar = stem;
        int64_t n = zoo_trained_floats(&spec, 1, 28, 28, 10, &bufs, &g);
        /* conv1 1 channel, 7x7 or 3x3, instead of 3 channels 7x7; fc 10 instead of 1000 */
        int64_t k2 = stem ? 9 : 49;
        ck_assert_int_eq(n, 11689512 - 64 * 3 * 49 + 64 * k2 - 1000 * 513 + 10 * 513);
        mge_graph_free(g);
    }
    spec.model.stem_cifar = 0;
    zoo_trained_floats(&spec, 3, 1, 1, 10, &bufs, &g);
    mge_graph_free(g);

    /* a few SGD steps of a narrow ResNet-18 on 3x20x20 (ResNet-50's gradients are checked
     * against PyTorch's in tests/integration/train_resnet.sh) */
    spec.model.variant = MGE_RESNET_18;
    spec.model.width = 8;
    struct mge_model m;
    const int64_t B = 8;
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    ck_assert_int_eq(mge_model_build(g, &spec, B, 3, 20, 20, 3, &m), MGE_OK);
    ck_assert_int_eq(mge_graph_backward(g, m.loss), MGE_OK);
    ck_assert_int_eq(mge_graph_plan(g, NULL), MGE_OK);
    ck_assert_int_eq(mge_graph_alloc(g), MGE_OK);
    mge_graph_init_params(g, 5);
    static float x[8 * 3 * 400];
    int32_t y[8];
    struct mge_rng rng;
    mge_rng_seed(&rng, 17);
    for (int64_t i = 0; i < B; i++) /* class k: channel k is brighter */
        y[i] = (int32_t)(i % 3);
    for (int64_t i = 0; i < B * 3 * 400; i++)
        x[i] = mge_rng_float(&rng) + (i / 400 % 3 == y[i / 1200] ? 0.5f : 0.0f);
    ck_assert_int_eq(mge_graph_bind(g, m.x, x), MGE_OK);
    ck_assert_int_eq(mge_graph_bind(g, m.y, y), MGE_OK);
    float first = 0, last = 0;
    for (int step = 0; step < 6; step++) {
        ck_assert_int_eq(mge_graph_run(g, MGE_RUN_TRAIN, step), MGE_OK);
        last = *(float *)mge_value_data(g, m.loss);
        if (step == 0)
            first = last;
        ck_assert(isfinite(last));
        for (int i = 0; i < mge_graph_n_params(g); i++) {
            int v = mge_graph_param(g, i);
            if (mge_value_is_buffer(g, v))
                continue;
            float *p = mge_value_data(g, v), *dp = mge_value_data(g, mge_graph_grad(g, v));
            for (int64_t k = 0; k < mge_value_numel(g, v); k++)
                p[k] -= 0.01f * dp[k];
        }
    }
    ck_assert_msg(last < 0.7f * first, "loss %g -> %g", first, last);
    mge_graph_free(g);
}
END_TEST

START_TEST(test_grad_fan_out)
{
    /* x feeds three consumers and w is shared by two layers: gradients must accumulate */
    struct gc c;
    gc_init(&c);
    int64_t xs[2] = {3, 4}, ws[2] = {4, 4};
    int x = gc_param(&c, "x", 2, xs), w = gc_param(&c, "w", 2, ws);
    int h = mge_linear(c.g, x, w, -1, MGE_ACT_FN_TANH);
    int h2 = mge_linear(c.g, h, w, -1, MGE_ACT_NONE);
    int y = mge_add(c.g, mge_mul(c.g, h2, x), x);
    gc_finish(&c, y);
    gc_check(&c);
    gc_fini(&c);
}
END_TEST

/*
 * conv -> batch norm -> relu -> (x r) -> sum, with the batch norm and relu fused by autodiff
 * (@fuse) or kept apart (the batch norm's output kept); writes the loss and every parameter's
 * gradient (the input x, a parameter, too) to @out, and how many relu nodes were left.
 */
static int bn_relu_run(int fuse, float *out, int64_t *n_out)
{
    struct mge_graph *g;
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    int64_t xs[4] = {3, 2, 5, 7}, ws[4] = {4, 2, 3, 3}, cs[1] = {4}, ys[4] = {3, 4, 5, 7};
    int x = mge_param(g, "x", 4, xs, MGE_INIT_UNIFORM_FAN_IN, 1);
    int cw = mge_param(g, "conv.weight", 4, ws, MGE_INIT_UNIFORM_FAN_IN, 18);
    int w = mge_param(g, "bn.weight", 1, cs, MGE_INIT_UNIFORM_FAN_IN, 1);
    int b = mge_param(g, "bn.bias", 1, cs, MGE_INIT_UNIFORM_FAN_IN, 1);
    int rm = mge_buffer(g, "bn.running_mean", 1, cs, MGE_INIT_ZERO);
    int rv = mge_buffer(g, "bn.running_var", 1, cs, MGE_INIT_ONE);
    int r = mge_input(g, "r", MGE_DTYPE_F32, 4, ys, 0);
    int y = mge_batchnorm2d(g, mge_conv2d(g, x, cw, -1, 1, 1), w, b, rm, rv, 1e-5f, 0.1f);
    if (!fuse)
        ck_assert_int_eq(mge_graph_keep(g, y), MGE_OK);
    int loss = mge_sum(g, mge_mul(g, mge_relu(g, y), r), -1);
    ck_assert_msg(loss >= 0, "%s", mge_graph_error_msg(g));
    ck_assert_int_eq(mge_graph_backward(g, loss), MGE_OK);
    ck_assert_int_eq(mge_graph_plan(g, NULL), MGE_OK);
    ck_assert_int_eq(mge_graph_alloc(g), MGE_OK);
    mge_graph_init_params(g, 4);
    float rd[3 * 4 * 5 * 7];
    struct mge_rng rng;
    mge_rng_seed(&rng, 8);
    for (size_t i = 0; i < sizeof(rd) / sizeof(rd[0]); i++)
        rd[i] = 2.0f * mge_rng_float(&rng) - 1.0f;
    mge_graph_bind(g, r, rd);
    ck_assert_int_eq(mge_graph_run(g, MGE_RUN_TRAIN, 0), MGE_OK);
    int64_t k = 0;
    out[k++] = *(float *)mge_value_data(g, loss);
    for (int i = 0; i < mge_graph_n_params(g); i++) {
        int v = mge_graph_param(g, i);
        if (mge_value_is_buffer(g, v))
            continue;
        const float *d = mge_value_data(g, mge_graph_grad(g, v));
        for (int64_t j = 0; j < mge_value_numel(g, v); j++)
            out[k++] = d[j];
    }
    *n_out = k;
    int relus = 0;
    for (int i = 0; i < g->n_nodes; i++)
        relus += g->nodes[i].op == MGE_OP_UNARY;
    mge_graph_free(g);
    return relus;
}

START_TEST(test_batchnorm_relu_fusion)
{
    /* the fused pair gives the loss and gradients of the separate ops, bit for bit */
    float a[1 + 210 + 72 + 8], bb[1 + 210 + 72 + 8];
    int64_t na, nb;
    ck_assert_int_eq(bn_relu_run(1, a, &na), 0);
    ck_assert_int_eq(bn_relu_run(0, bb, &nb), 1);
    ck_assert_int_eq(na, (int64_t)(sizeof(a) / sizeof(a[0])));
    ck_assert_int_eq(na, nb);
    ck_assert_mem_eq(a, bb, sizeof(a));
}
END_TEST

/* The graph's nodes of kind @op. */
static int count_ops(const struct mge_graph *g, enum mge_op op)
{
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++)
        n += g->nodes[i].op == op;
    return n;
}

START_TEST(test_grad_shared_residual)
{
    /*
     * A gradient flowing unchanged into both inputs of an add is shared, not copied (autodiff.c
     * ad_unborrow), and stays right where a later contribution must then add to it:
     * _i == 0: h + f(g(h)), the ResNet block: h's other gradient adds in place, no copy;
     * 1: h + f(h): f's backward reads the shared buffer while adding to h's, so h gets a copy;
     * 2: f(h) + g(h) (a shortcut conv): both only read it, no copy;
     * 3: z = f(h) + x; z * z + h: h's second contribution lands on a shared buffer whose
     *    readers have all run, so it adds in place (copies: x, a parameter, gets its own, and
     *    z's second contribution from z * z is added in);
     * 4: h + h: one value twice (a copy, then the second contribution added in).
     */
    struct gc c;
    gc_init(&c);
    int64_t xs[2] = {3, 4}, ws[2] = {4, 4};
    int x = gc_param(&c, "x", 2, xs), w0 = gc_param(&c, "w0", 2, ws);
    int w1 = gc_param(&c, "w1", 2, ws), w2 = gc_param(&c, "w2", 2, ws);
    int h = mge_linear(c.g, x, w0, -1, MGE_ACT_FN_TANH), y = -1, copies = 0;
    switch (_i) {
    case 0:
        y = mge_add(
            c.g,
            mge_linear(c.g, mge_linear(c.g, h, w1, -1, MGE_ACT_FN_TANH), w2, -1, MGE_ACT_FN_TANH),
            h);
        break;
    case 1:
        y = mge_add(c.g, mge_linear(c.g, h, w1, -1, MGE_ACT_FN_TANH), h);
        copies = 1;
        break;
    case 2:
        y = mge_add(c.g, mge_linear(c.g, h, w1, -1, MGE_ACT_FN_TANH),
                    mge_linear(c.g, h, w2, -1, MGE_ACT_FN_TANH));
        break;
    case 3: {
        int z = mge_add(c.g, mge_linear(c.g, h, w1, -1, MGE_ACT_FN_TANH), x);
        y = mge_add(c.g, mge_mul(c.g, z, z), h);
        copies = 2;
        break;
    }
    default:
        y = mge_add(c.g, h, h);
        copies = 2;
        break;
    }
    gc_finish(&c, y);
    ck_assert_int_eq(count_ops(c.g, MGE_OP_COPY_AXIS), copies);
    gc_check(&c);
    gc_fini(&c);
}
END_TEST

START_TEST(test_batch_smaller_than_planned)
{
    /* a graph planned for 8 rows run with 5 gives what a graph built for 5 gives */
    float x[8 * 6], out5[5 * 3];
    int32_t y[8] = {0, 1, 2, 0, 1, 2, 0, 1};
    struct mge_rng rng;
    mge_rng_seed(&rng, 5);
    for (int i = 0; i < 48; i++)
        x[i] = mge_rng_float(&rng);
    float loss[2];
    for (int pass = 0; pass < 2; pass++) {
        int64_t rows = pass == 0 ? 8 : 5, xs[2] = {rows, 6}, ys[1] = {rows}, ws[2] = {3, 6};
        struct mge_graph *g;
        ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
        int xi = mge_input(g, "x", MGE_DTYPE_F32, 2, xs, 1);
        int yi = mge_input(g, "y", MGE_DTYPE_I32, 1, ys, 1);
        int w = mge_param(g, "w", 2, ws, MGE_INIT_UNIFORM_FAN_IN, 6);
        int logits = mge_linear(g, xi, w, -1, MGE_ACT_NONE);
        int l = mge_cross_entropy(g, logits, yi);
        mge_graph_keep(g, logits);
        ck_assert_int_eq(mge_graph_backward(g, l), MGE_OK);
        ck_assert_int_eq(mge_graph_plan(g, NULL), MGE_OK);
        ck_assert_int_eq(mge_graph_alloc(g), MGE_OK);
        mge_graph_init_params(g, 99);
        mge_graph_bind(g, xi, x);
        mge_graph_bind(g, yi, y);
        ck_assert_int_eq(mge_graph_set_batch(g, 5), MGE_OK);
        ck_assert_int_eq(mge_graph_run(g, MGE_RUN_TRAIN, 0), MGE_OK);
        loss[pass] = *(float *)mge_value_data(g, l);
        if (pass == 0)
            memcpy(out5, mge_value_data(g, logits), sizeof(out5));
        else
            ck_assert_mem_eq(out5, mge_value_data(g, logits), sizeof(out5));
        ck_assert_int_eq(mge_graph_set_batch(g, 9), MGE_RANGE);
        mge_graph_free(g);
    }
    ck_assert_float_eq(loss[0], loss[1]);
}
END_TEST

START_TEST(test_build_errors)
{
    struct mge_graph *g;
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    int64_t a[2] = {3, 4}, b[2] = {5, 6};
    int x = mge_input(g, "x", MGE_DTYPE_F32, 2, a, 0);
    int w = mge_param(g, "w", 2, b, MGE_INIT_ZERO, 1);
    ck_assert_int_lt(mge_matmul(g, x, w, 0, 0), 0);
    ck_assert_int_eq(mge_graph_error(g), MGE_INVAL);
    ck_assert_ptr_nonnull(strstr(mge_graph_error_msg(g), "inner dims"));
    /* the first error sticks */
    ck_assert_int_lt(mge_relu(g, x), 0);
    ck_assert_ptr_nonnull(strstr(mge_graph_error_msg(g), "inner dims"));
    mge_graph_free(g);
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    int64_t bad[2] = {3, 0};
    ck_assert_int_lt(mge_input(g, "z", MGE_DTYPE_F32, 2, bad, 0), 0);
    mge_graph_free(g);
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    mge_param(g, "w", 2, b, MGE_INIT_ZERO, 1);
    ck_assert_int_lt(mge_param(g, "w", 2, b, MGE_INIT_ZERO, 1), 0);
    ck_assert_int_eq(mge_graph_error(g), MGE_EXISTS);
    mge_graph_free(g);
}
END_TEST

START_TEST(test_build_alloc_failures)
{
    /* every allocation failure while building, differentiating and planning is a clean error */
    for (long n = 0; n < 400; n++) {
        struct mge_graph *g = NULL;
        mge_alloc_fail_after(n);
        int rc = mge_graph_new(&g);
        if (rc == MGE_OK) {
            int64_t xs[2] = {4, 8}, ws[2] = {8, 8}, ys[1] = {4};
            int x = mge_input(g, "x", MGE_DTYPE_F32, 2, xs, 1);
            int y = mge_input(g, "y", MGE_DTYPE_I32, 1, ys, 1);
            int w1 = mge_param(g, "w1", 2, ws, MGE_INIT_UNIFORM_FAN_IN, 8);
            int w2 = mge_param(g, "w2", 2, ws, MGE_INIT_UNIFORM_FAN_IN, 8);
            int h = mge_linear(g, x, w1, -1, MGE_ACT_FN_RELU);
            int l = mge_cross_entropy(g, mge_linear(g, h, w2, -1, MGE_ACT_NONE), y);
            rc = mge_graph_error(g);
            if (rc == MGE_OK)
                rc = mge_graph_backward(g, l);
            if (rc == MGE_OK)
                rc = mge_graph_plan(g, NULL);
            if (rc == MGE_OK)
                rc = mge_graph_alloc(g);
        }
        mge_alloc_fail_after(-1);
        ck_assert(rc == MGE_OK || rc == MGE_NOMEM);
        mge_graph_free(g);
        if (rc == MGE_OK)
            return;
    }
    ck_abort_msg("graph never built with 400 allocations");
}
END_TEST

struct hook_rec {
    struct mge_graph *g;
    size_t ready[64];
    float *snap[64]; /* the arena's ready prefix as it was at each call */
    int n;
};

static void record_ready(void *ctx, size_t ready)
{
    struct hook_rec *r = ctx;
    ck_assert_int_lt(r->n, 64);
    r->ready[r->n] = ready;
    r->snap[r->n] = mge_malloc(ready ? ready : 1);
    memcpy(r->snap[r->n], mge_graph_grads(r->g, NULL), ready);
    r->n++;
}

START_TEST(test_grad_ready_hook)
{
    /* gradients are announced in final form, front to back, while backward still runs */
    struct mge_graph *g;
    struct hook_rec rec = {0};
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    int64_t xs[2] = {8, 16}, ys[1] = {8};
    int x = mge_input(g, "x", MGE_DTYPE_F32, 2, xs, 1), t = x;
    for (int i = 0; i < 6; i++) {
        char name[16];
        int64_t ws[2] = {16, 16}, bs[1] = {16};
        snprintf(name, sizeof(name), "w%d", i);
        int w = mge_param(g, name, 2, ws, MGE_INIT_UNIFORM_FAN_IN, 16);
        snprintf(name, sizeof(name), "b%d", i);
        t = mge_linear(g, t, w, mge_param(g, name, 1, bs, MGE_INIT_UNIFORM_FAN_IN, 16),
                       MGE_ACT_FN_RELU);
    }
    int y = mge_input(g, "y", MGE_DTYPE_I32, 1, ys, 1);
    int l = mge_cross_entropy(g, t, y);
    ck_assert_int_eq(mge_graph_backward(g, l), MGE_OK);
    ck_assert_int_eq(mge_graph_plan(g, NULL), MGE_OK);
    ck_assert_int_eq(mge_graph_alloc(g), MGE_OK);
    mge_graph_init_params(g, 3);
    float xd[8 * 16];
    int32_t yd[8] = {1, 2, 3, 4, 5, 6, 7, 0};
    for (int i = 0; i < 8 * 16; i++)
        xd[i] = (float)(i % 7) / 7.0f;
    mge_graph_bind(g, x, xd);
    mge_graph_bind(g, y, yd);
    rec.g = g;
    mge_graph_set_grad_hook(g, record_ready, &rec);
    ck_assert_int_eq(mge_graph_run(g, MGE_RUN_TRAIN, 0), MGE_OK);
    int64_t ng;
    const float *grads = mge_graph_grads(g, &ng);
    ck_assert_int_gt(rec.n, 3);
    ck_assert_uint_eq(rec.ready[rec.n - 1], (size_t)ng * sizeof(float));
    for (int i = 0; i < rec.n; i++) {
        if (i > 0)
            ck_assert_uint_gt(rec.ready[i], rec.ready[i - 1]);
        ck_assert_mem_eq(rec.snap[i], grads, rec.ready[i]);
        mge_free(rec.snap[i]);
    }
    /* the last layer's gradient (first in the arena) was announced before backward ended */
    size_t off, bytes;
    ck_assert_int_eq(mge_graph_grad_span(g, mge_graph_param(g, 10), &off, &bytes), MGE_OK);
    ck_assert_uint_eq(off, 0);
    ck_assert_uint_ge(rec.ready[0], bytes);
    ck_assert_uint_lt(rec.ready[0], (size_t)ng * sizeof(float));
    /* inference runs do not call it */
    rec.n = 0;
    ck_assert_int_eq(mge_graph_run(g, MGE_RUN_INFER, 0), MGE_OK);
    ck_assert_int_eq(rec.n, 0);
    mge_graph_free(g);
}
END_TEST

/* ---- planner ---- */

/*
 * No two items alive at once share bytes, none passes @arena, and (@in_order) the planner left
 * them in their input order. One assertion per call: Check records every one it passes.
 */
static void check_no_overlap(const struct mge__plan_item *it, int n, size_t arena, int in_order)
{
    int bad_i = -1, bad_j = -1, order_ok = 1;
    for (int i = 0; i < n && bad_i < 0; i++) {
        if (it[i].offset + it[i].size > arena) {
            bad_i = bad_j = i;
            break;
        }
        order_ok &= !in_order || it[i].v == i;
        for (int j = i + 1; j < n; j++)
            if (it[i].first <= it[j].last && it[j].first <= it[i].last &&
                it[i].offset < it[j].offset + it[j].size &&
                it[j].offset < it[i].offset + it[i].size) {
                bad_i = i;
                bad_j = j;
                break;
            }
    }
    ck_assert_msg(bad_i < 0, "items %d and %d overlap in time and memory (or pass the arena)",
                  bad_i, bad_j);
    ck_assert_msg(order_ok, "items were reordered");
}

/* @n random items: sizes 64 B..64*@units B, first < @span, lifetimes below @life ops */
static struct mge__plan_item *plan_random_items(struct mge_rng *rng, int n, uint64_t units,
                                                uint64_t span, uint64_t life)
{
    struct mge__plan_item *it = mge_calloc((size_t)n, sizeof(*it));
    ck_assert_ptr_nonnull(it);
    for (int i = 0; i < n; i++) {
        it[i].v = i;
        it[i].size = 64 * (1 + mge_rng_below(rng, units));
        it[i].first = (int64_t)mge_rng_below(rng, span);
        it[i].last = it[i].first + (int64_t)mge_rng_below(rng, life);
    }
    return it;
}

/* Plan @it (times within [0, @tmax]), check it, free it; the arena over the lower bound. */
static double plan_ratio(struct mge__plan_item *it, int n, int64_t tmax)
{
    size_t lower = mge__plan_lower_bound(it, n, tmax);
    size_t arena = mge__plan_assign(it, n);
    ck_assert_uint_ne(arena, (size_t)-1);
    check_no_overlap(it, n, arena, 1);
    ck_assert_uint_ge(arena, lower);
    mge_free(it);
    return (double)arena / (double)lower;
}

START_TEST(test_plan_chain_is_optimal)
{
    /* a chain: each tensor lives from its op to the next: arena == lower bound */
    struct mge__plan_item it[64];
    struct mge_rng rng;
    mge_rng_seed(&rng, 3);
    for (int i = 0; i < 64; i++) {
        it[i].v = i;
        it[i].size = 64 * (1 + mge_rng_below(&rng, 100));
        it[i].first = i;
        it[i].last = i + 1;
    }
    size_t lower = mge__plan_lower_bound(it, 64, 66);
    size_t arena = mge__plan_assign(it, 64);
    check_no_overlap(it, 64, arena, 1);
    ck_assert_uint_eq(arena, lower);
}
END_TEST

START_TEST(test_plan_random_sets)
{
    struct mge_rng rng;
    mge_rng_seed(&rng, 11);
    double worst = 0.0;
    for (int trial = 0; trial < 50; trial++) {
        int n = 20 + (int)mge_rng_below(&rng, 200);
        double r = plan_ratio(plan_random_items(&rng, n, 1000, 300, 40), n, 400);
        if (r > worst)
            worst = r;
    }
    /* the planner's target on random interval sets: 1.10x (1.066 measured) */
    ck_assert_msg(worst <= 1.10, "planner arena %.3fx the lower bound", worst);
}
END_TEST

START_TEST(test_plan_random_1000_within_bound)
{
    /* the planner's target on bench_planner's sets: arena <= 1.10x the lower bound */
    static const uint64_t seeds[] = {1, 2, 3, 4, 5};
    double worst = 0.0;
    for (size_t s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++) {
        struct mge_rng rng;
        mge_rng_seed(&rng, seeds[s]);
        for (int set = 0; set < 2; set++) { /* as bench_planner makes them */
            int n = 1000;
            double r = plan_ratio(plan_random_items(&rng, n, 4096, 3 * (uint64_t)n, 60), n,
                                  3 * (int64_t)n + 61);
            if (r > worst)
                worst = r;
        }
    }
    ck_assert_msg(worst <= 1.10, "planner arena %.3fx the lower bound", worst);
}
END_TEST

START_TEST(test_plan_is_deterministic)
{
    /* the same items plan to the same offsets (reruns and ranks rely on it) */
    struct mge_rng rng;
    mge_rng_seed(&rng, 7);
    int n = 2000;
    struct mge__plan_item *a = plan_random_items(&rng, n, 4096, 3 * (uint64_t)n, 60);
    struct mge__plan_item *b = mge_calloc((size_t)n, sizeof(*b));
    ck_assert_ptr_nonnull(b);
    memcpy(b, a, sizeof(*a) * (size_t)n);
    size_t arena_a = mge__plan_assign(a, n);
    size_t arena_b = mge__plan_assign(b, n);
    ck_assert_uint_eq(arena_a, arena_b);
    int same = 1;
    for (int i = 0; i < n; i++)
        same &= a[i].offset == b[i].offset;
    ck_assert_msg(same, "two runs on the same items placed them differently");
    mge_free(a);
    mge_free(b);
}
END_TEST

START_TEST(test_plan_empty_and_single)
{
    struct mge__plan_item it[1] = {{.v = 0, .size = 128, .first = 3, .last = 5}};
    ck_assert_uint_eq(mge__plan_assign(it, 0), 0);
    ck_assert_uint_eq(mge__plan_assign(it, 1), 128);
    ck_assert_uint_eq(it[0].offset, 0);
}
END_TEST

START_TEST(test_plan_graph_is_valid)
{
    /* a real MLP graph: values alive at once never share bytes */
    struct mge_graph *g;
    struct mge_plan_stats st;
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    int64_t xs[2] = {16, 20}, ys[1] = {16};
    int x = mge_input(g, "x", MGE_DTYPE_F32, 2, xs, 1);
    int y = mge_input(g, "y", MGE_DTYPE_I32, 1, ys, 1);
    int t = x;
    int64_t in = 20;
    for (int i = 0; i < 5; i++) {
        char name[16];
        int64_t ws[2] = {32, in};
        snprintf(name, sizeof(name), "w%d", i);
        t = mge_linear(g, t, mge_param(g, name, 2, ws, MGE_INIT_UNIFORM_FAN_IN, in), -1,
                       MGE_ACT_FN_RELU);
        in = 32;
    }
    int64_t wl[2] = {10, 32};
    int l = mge_cross_entropy(g, mge_linear(g, t, mge_param(g, "wl", 2, wl, MGE_INIT_ZERO, 1), -1,
                                            MGE_ACT_NONE), y);
    ck_assert_int_eq(mge_graph_backward(g, l), MGE_OK);
    ck_assert_int_eq(mge_graph_plan(g, &st), MGE_OK);
    ck_assert_uint_ge(st.activation_bytes, st.lower_bound_bytes);
    ck_assert_uint_gt(st.lower_bound_bytes, 0);
    int n = 0;
    struct mge__plan_item it[512];
    for (int v = 0; v < g->n_values; v++) {
        const struct mge_value *val = &g->values[v];
        if (val->kind != MGE_VALUE_ACT || val->alias >= 0 || val->first_use < 0)
            continue;
        it[n].v = v;
        it[n].size = mge__value_bytes(g, v);
        it[n].first = val->first_use;
        it[n].last = val->last_use;
        it[n].offset = val->offset;
        n++;
    }
    check_no_overlap(it, n, st.activation_bytes, 0);
    /* gradients: the last layer's is written first, so it comes first in the arena */
    ck_assert_uint_eq(g->values[mge_graph_grad(g, mge_graph_param(g, 5))].offset, 0);
    mge_graph_free(g);
}
END_TEST

/* ---- optimisers ---- */

START_TEST(test_optim_sgd_momentum_nesterov)
{
    struct mge_optim_spec os = {.type = MGE_OPTIM_SGD, .lr = 0.1, .momentum = 0.9,
                                .weight_decay = 0.01, .nesterov = _i};
    struct mge_sched_spec ss = {.type = MGE_SCHED_CONSTANT};
    struct mge_optim o;
    float p[1] = {1.0f}, g1[1] = {0.5f};
    ck_assert_int_eq(mge_optim_init(&o, &os, &ss, 10, 1), MGE_OK);
    mge_optim_step(&o, p, g1, 0);
    /* g' = 0.5 + 0.01*1 = 0.51; v = 0.51; step = nesterov ? 0.51 + 0.9*0.51 : 0.51 */
    double v = 0.51, step = _i ? 0.51 + 0.9 * 0.51 : 0.51, pe = 1.0 - 0.1 * step;
    ck_assert_double_eq_tol(p[0], pe, 1e-6);
    mge_optim_step(&o, p, g1, 1);
    double gp = 0.5 + 0.01 * pe;
    v = 0.9 * v + gp;
    step = _i ? gp + 0.9 * v : v;
    pe -= 0.1 * step;
    ck_assert_double_eq_tol(p[0], pe, 1e-6);
    mge_optim_fini(&o);
}
END_TEST

START_TEST(test_optim_adam_adamw)
{
    struct mge_optim_spec os = {.type = _i ? MGE_OPTIM_ADAMW : MGE_OPTIM_ADAM, .lr = 0.01,
                                .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
    struct mge_sched_spec ss = {.type = MGE_SCHED_CONSTANT};
    struct mge_optim o;
    float p[1] = {2.0f}, g[1] = {0.3f};
    double pe = 2.0, m = 0, v = 0;
    ck_assert_int_eq(mge_optim_init(&o, &os, &ss, 10, 1), MGE_OK);
    for (int t = 1; t <= 2; t++) {
        mge_optim_step(&o, p, g, t - 1);
        double gr = 0.3;
        if (!_i)
            gr += 0.1 * pe; /* Adam: L2 added to the gradient */
        else
            pe -= 0.01 * 0.1 * pe; /* AdamW: decoupled decay */
        m = 0.9 * m + 0.1 * gr;
        v = 0.999 * v + 0.001 * gr * gr;
        double mh = m / (1 - pow(0.9, t)), vh = v / (1 - pow(0.999, t));
        pe -= 0.01 * mh / (sqrt(vh) + 1e-8);
        ck_assert_double_eq_tol(p[0], pe, 1e-5);
    }
    mge_optim_fini(&o);
}
END_TEST

/* AdamW with the middle element exempt from decay (a bias), two steps by hand. */
START_TEST(test_optim_adamw_no_decay)
{
    struct mge_optim_spec os = {.type = MGE_OPTIM_ADAMW,
                                .lr = 0.01,
                                .beta1 = 0.9,
                                .beta2 = 0.999,
                                .eps = 1e-8,
                                .weight_decay = 0.1};
    struct mge_sched_spec ss = {.type = MGE_SCHED_CONSTANT};
    struct mge_optim o;
    float p[3] = {2.0f, 1.0f, -1.5f}, g[3] = {0.3f, -0.2f, 0.05f};
    double pe[3] = {2.0, 1.0, -1.5}, m[3] = {0}, v[3] = {0};
    ck_assert_int_eq(mge_optim_init(&o, &os, &ss, 10, 3), MGE_OK);
    ck_assert_int_eq(mge_optim_exclude_decay(&o, 1, 1), MGE_OK);
    ck_assert_int_eq(mge_optim_exclude_decay(&o, 1, 2), MGE_INVAL); /* overlaps */
    ck_assert_int_eq(mge_optim_exclude_decay(&o, 2, 2), MGE_INVAL); /* past the arena */
    for (int t = 1; t <= 2; t++) {
        /* the second step in two ranges, as the packed data-parallel path applies it */
        if (t == 1) {
            mge_optim_step(&o, p, g, t - 1);
        } else {
            mge_optim_step_begin(&o);
            mge_optim_step_range(&o, p, g, t - 1, 0, 2);
            mge_optim_step_range(&o, p, g, t - 1, 2, 1);
        }
        for (int i = 0; i < 3; i++) {
            if (i != 1)
                pe[i] -= 0.01 * 0.1 * pe[i];
            m[i] = 0.9 * m[i] + 0.1 * g[i];
            v[i] = 0.999 * v[i] + 0.001 * (double)g[i] * g[i];
            double mh = m[i] / (1 - pow(0.9, t)), vh = v[i] / (1 - pow(0.999, t));
            pe[i] -= 0.01 * mh / (sqrt(vh) + 1e-8);
            ck_assert_double_eq_tol(p[i], pe[i], 1e-6);
        }
    }
    /* the exempt element moved by the Adam step alone: 2 * lr * sign(g) */
    ck_assert_double_eq_tol(p[1], 1.0 + 0.02, 1e-6);
    mge_optim_fini(&o);
}
END_TEST

/* torch.nn.utils.clip_grad_norm_: g *= max_norm / (norm + 1e-6) when that is below 1. */
START_TEST(test_optim_clip_grad_norm)
{
    float g[4] = {3.0f, 0.0f, -4.0f, 0.0f};
    ck_assert_double_eq_tol(mge_optim_clip(g, 4, 1.0), 5.0, 1e-12);
    ck_assert_double_eq_tol(g[0], 3.0 / (5.0 + 1e-6), 1e-7);
    ck_assert_double_eq_tol(g[2], -4.0 / (5.0 + 1e-6), 1e-7);
    ck_assert_double_eq_tol(mge_optim_clip(g, 4, 10.0), 1.0, 1e-6); /* under the cap */
    ck_assert_double_eq_tol(g[0], 0.6, 1e-6);
    ck_assert_double_eq_tol(mge_optim_clip(g, 4, 0.0), 1.0, 1e-6); /* norm only */
    ck_assert_double_eq_tol(g[2], -0.8, 1e-6);
}
END_TEST

START_TEST(test_lr_schedules)
{
    struct mge_optim_spec os = {.type = MGE_OPTIM_SGD, .lr = 1.0};
    struct mge_sched_spec st = {.type = MGE_SCHED_STEP, .step_size = 10, .gamma = 0.5};
    struct mge_sched_spec cs = {.type = MGE_SCHED_COSINE, .warmup_steps = 10, .min_lr = 0.1};
    struct mge_optim o;
    ck_assert_int_eq(mge_optim_init(&o, &os, &st, 100, 1), MGE_OK);
    ck_assert_double_eq_tol(mge_optim_lr(&o, 9), 1.0, 1e-12);
    ck_assert_double_eq_tol(mge_optim_lr(&o, 10), 0.5, 1e-12);
    ck_assert_double_eq_tol(mge_optim_lr(&o, 25), 0.25, 1e-12);
    mge_optim_fini(&o);
    ck_assert_int_eq(mge_optim_init(&o, &os, &cs, 110, 1), MGE_OK);
    ck_assert_double_eq_tol(mge_optim_lr(&o, 0), 0.1, 1e-12);   /* warmup 1/10 */
    ck_assert_double_eq_tol(mge_optim_lr(&o, 9), 1.0, 1e-12);
    ck_assert_double_eq_tol(mge_optim_lr(&o, 10), 1.0, 1e-12);  /* cosine starts at lr */
    ck_assert_double_eq_tol(mge_optim_lr(&o, 60), 0.55, 1e-12); /* halfway */
    ck_assert_double_eq_tol(mge_optim_lr(&o, 110), 0.1, 1e-12); /* floor */
    mge_optim_fini(&o);
}
END_TEST

static Suite *engine_suite(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("gradients");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_grad_matmul, 0, 4);
    tcase_add_loop_test(tc, test_grad_linear, 0, 5);
    tcase_add_loop_test(tc, test_grad_binary_broadcast, 0, 4);
    tcase_add_loop_test(tc, test_grad_unary, 0, 6);
    tcase_add_loop_test(tc, test_grad_cross_entropy, 0, 3);
    tcase_add_test(tc, test_cross_entropy_smoothed_values);
    tcase_add_loop_test(tc, test_grad_reduce, 0, 3);
    tcase_add_test(tc, test_grad_shape_ops);
    tcase_add_loop_test(tc, test_grad_conv_pool, 0, 2);
    tcase_add_test(tc, test_grad_layernorm_embedding_dropout);
    tcase_add_loop_test(tc, test_grad_attention, 0, 3);
    tcase_add_test(tc, test_attention_matches_naive);
    tcase_add_test(tc, test_attention_thread_independent);
    tcase_add_loop_test(tc, test_grad_batchnorm_residual_gap, 0, 2);
    tcase_add_test(tc, test_batchnorm_running_stats);
    tcase_add_test(tc, test_model_resnet);
    tcase_add_test(tc, test_model_resnet_torchvision);
    tcase_add_test(tc, test_model_resnet_small_inputs);
    tcase_add_test(tc, test_grad_fan_out);
    tcase_add_loop_test(tc, test_grad_shared_residual, 0, 5);
    tcase_add_test(tc, test_batchnorm_relu_fusion);
    suite_add_tcase(s, tc);
    tc = tcase_create("graph");
    tcase_add_test(tc, test_batch_smaller_than_planned);
    tcase_add_test(tc, test_build_errors);
    tcase_add_test(tc, test_build_alloc_failures);
    tcase_add_test(tc, test_grad_ready_hook);
    suite_add_tcase(s, tc);
    tc = tcase_create("planner");
    tcase_add_test(tc, test_plan_chain_is_optimal);
    tcase_add_test(tc, test_plan_random_sets);
    tcase_add_test(tc, test_plan_random_1000_within_bound);
    tcase_add_test(tc, test_plan_is_deterministic);
    tcase_add_test(tc, test_plan_empty_and_single);
    tcase_add_test(tc, test_plan_graph_is_valid);
    suite_add_tcase(s, tc);
    tc = tcase_create("optimisers");
    tcase_add_loop_test(tc, test_optim_sgd_momentum_nesterov, 0, 2);
    tcase_add_loop_test(tc, test_optim_adam_adamw, 0, 2);
    tcase_add_test(tc, test_optim_adamw_no_decay);
    tcase_add_test(tc, test_optim_clip_grad_norm);
    tcase_add_test(tc, test_lr_schedules);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return mge_test_run(engine_suite()); }
