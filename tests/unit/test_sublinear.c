/*
 * test_sublinear.c: recompute instead of store. Losses and gradients with recomputation are
 * bit-identical to the plain graph (chains, dropout, convolutions, branches); the sublinear
 * plan shrinks a chain's activations, to about sqrt(2n) at the smallest, and by default takes
 * the least recomputation within MGE__SUBLINEAR_SLACK of that; budgets choose the least
 * recomputation that fits or fail clearly; in-place reuse shares storage without changing
 * results. Causal attention (NET_GPT) is recomputed from its qkv when its output is dropped.
 * The zoo's 8-layer GPT and ResNet-56: bit-identical with recomputation, and at their benchmark
 * sizes the default plan keeps at most 30 % of the plain activations.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/err.h"
#include "common/rng.h"
#include "engine/engine.h"
#include "engine/engine_int.h"
#include "engine/model.h"
#include "tests/unit/support/check_run.h"

enum net { NET_CHAIN, NET_DROPOUT, NET_CONV, NET_BRANCHES, NET_RESNET, NET_GPT };

/* conv 3x3 (no bias) -> batch norm with its buffers, named after @i and @j. */
static int conv_bn(struct mge_graph *g, int t, int cin, int i, int j)
{
    char name[32];
    int64_t ws[4] = {4, cin, 3, 3}, cs[1] = {4};
    snprintf(name, sizeof(name), "l%d.conv%d.weight", i, j);
    int w = mge_param(g, name, 4, ws, MGE_INIT_NORMAL_FAN_OUT, 4 * 9);
    snprintf(name, sizeof(name), "l%d.bn%d.weight", i, j);
    int bw = mge_param(g, name, 1, cs, MGE_INIT_ONE, 1);
    snprintf(name, sizeof(name), "l%d.bn%d.bias", i, j);
    int bb = mge_param(g, name, 1, cs, MGE_INIT_ZERO, 1);
    snprintf(name, sizeof(name), "l%d.bn%d.running_mean", i, j);
    int rm = mge_buffer(g, name, 1, cs, MGE_INIT_ZERO);
    snprintf(name, sizeof(name), "l%d.bn%d.running_var", i, j);
    int rv = mge_buffer(g, name, 1, cs, MGE_INIT_ONE);
    return mge_batchnorm2d(g, mge_conv2d(g, t, w, -1, 1, 1), bw, bb, rm, rv, 1e-5f, 0.1f);
}

struct built {
    struct mge_graph *g;
    int x, y, loss;
    struct mge_plan_stats st;
    struct mge_remat_plan chosen, plain;
};

/* A network of @kind for batch 8; returns the rc of the sublinear pass. */
static int build(enum net kind, int layers, enum mge_remat mode, size_t budget, struct built *b)
{
    struct mge_graph *g;
    char name[32];
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    b->g = g;
    int64_t ys[1] = {8};
    int t;
    if (kind == NET_RESNET) { /* stem, then basic blocks: relu(bn(conv(relu(bn(conv t)))) + t) */
        int64_t xs[4] = {8, 2, 12, 12};
        b->x = t = mge_input(g, "x", MGE_DTYPE_F32, 4, xs, 1);
        t = mge_relu(g, conv_bn(g, t, 2, 0, 0));
        for (int i = 1; i <= layers; i++) {
            int h = mge_relu(g, conv_bn(g, t, 4, i, 1));
            t = mge_relu(g, mge_add(g, conv_bn(g, h, 4, i, 2), t));
        }
        t = mge_global_avgpool2d(g, t);
    } else if (kind == NET_GPT) { /* pre-norm blocks: t + proj(attention(qkv(ln(t)))) */
        int64_t xs[2] = {8, 32}, ts[3] = {8, 4, 8}, cs[1] = {8};
        b->x = mge_input(g, "x", MGE_DTYPE_F32, 2, xs, 1);
        t = mge_reshape(g, b->x, 3, ts);
        for (int i = 0; i < layers; i++) {
            int64_t qs[2] = {24, 8}, ps[2] = {8, 8};
            snprintf(name, sizeof(name), "h%d.ln.w", i);
            int lw = mge_param(g, name, 1, cs, MGE_INIT_ONE, 1);
            snprintf(name, sizeof(name), "h%d.ln.b", i);
            int lb = mge_param(g, name, 1, cs, MGE_INIT_ZERO, 1);
            snprintf(name, sizeof(name), "h%d.c_attn.w", i);
            int wq = mge_param(g, name, 2, qs, MGE_INIT_UNIFORM_FAN_IN, 8);
            snprintf(name, sizeof(name), "h%d.c_proj.w", i);
            int wp = mge_param(g, name, 2, ps, MGE_INIT_UNIFORM_FAN_IN, 8);
            int h = mge_layernorm(g, t, lw, lb, 1e-5f);
            h = mge_causal_attention(g, mge_linear(g, h, wq, -1, MGE_ACT_NONE), 2);
            t = mge_add(g, t, mge_linear(g, h, wp, -1, MGE_ACT_NONE));
        }
        t = mge_flatten(g, t);
    } else if (kind == NET_CONV) {
        int64_t xs[4] = {8, 2, 12, 12};
        b->x = t = mge_input(g, "x", MGE_DTYPE_F32, 4, xs, 1);
        int c = 2;
        for (int i = 0; i < layers; i++) {
            int64_t ws[4] = {4, c, 3, 3}, bs[1] = {4};
            snprintf(name, sizeof(name), "c%d.w", i);
            int w = mge_param(g, name, 4, ws, MGE_INIT_UNIFORM_FAN_IN, c * 9);
            snprintf(name, sizeof(name), "c%d.b", i);
            int bb = mge_param(g, name, 1, bs, MGE_INIT_UNIFORM_FAN_IN, c * 9);
            t = mge_relu(g, mge_conv2d(g, t, w, bb, 1, 1));
            c = 4;
        }
        t = mge_flatten(g, mge_maxpool2d(g, t, 2, 2, 0));
    } else {
        int64_t xs[2] = {8, 16};
        b->x = t = mge_input(g, "x", MGE_DTYPE_F32, 2, xs, 1);
        int64_t in = 16;
        for (int i = 0; i < layers; i++) {
            int64_t ws[2] = {32, in}, bs[1] = {32};
            snprintf(name, sizeof(name), "fc%d.w", i);
            int w = mge_param(g, name, 2, ws, MGE_INIT_UNIFORM_FAN_IN, in);
            snprintf(name, sizeof(name), "fc%d.b", i);
            int bb = mge_param(g, name, 1, bs, MGE_INIT_UNIFORM_FAN_IN, in);
            int h = mge_linear(g, t, w, bb, MGE_ACT_FN_TANH);
            if (kind == NET_DROPOUT)
                h = mge_dropout(g, h, 0.25f);
            if (kind == NET_BRANCHES && i > 0) /* residual: h + t, and a side branch */
                h = mge_add(g, h, mge_mul(g, t, mge_sigmoid(g, t)));
            t = h;
            in = 32;
        }
    }
    int64_t in = mge_value_shape(g, t)[1], ws[2] = {5, in};
    int w = mge_param(g, "head.w", 2, ws, MGE_INIT_UNIFORM_FAN_IN, in);
    int logits = mge_linear(g, t, w, -1, MGE_ACT_NONE);
    b->y = mge_input(g, "y", MGE_DTYPE_I32, 1, ys, 1);
    b->loss = mge_cross_entropy(g, logits, b->y);
    ck_assert_msg(mge_graph_error(g) == MGE_OK, "%s", mge_graph_error_msg(g));
    ck_assert_int_eq(mge_graph_backward(g, b->loss), MGE_OK);
    int rc = mge_graph_sublinear(g, mode, budget, &b->chosen, &b->plain);
    if (rc == MGE_OK) {
        ck_assert_int_eq(mge_graph_plan(g, &b->st), MGE_OK);
        ck_assert_int_eq(mge_graph_alloc(g), MGE_OK);
    }
    return rc;
}

/* One training step on fixed data; copies the loss and all gradients out. */
static float step(struct built *b, float **grads, int64_t *ng)
{
    static float x[8 * 2 * 12 * 12];
    static int32_t y[8];
    struct mge_rng rng;
    mge_rng_seed(&rng, 77);
    for (size_t i = 0; i < sizeof(x) / sizeof(x[0]); i++)
        x[i] = mge_rng_float(&rng);
    for (int i = 0; i < 8; i++)
        y[i] = (int32_t)mge_rng_below(&rng, 5);
    mge_graph_init_params(b->g, 5);
    mge_graph_bind(b->g, b->x, x);
    mge_graph_bind(b->g, b->y, y);
    ck_assert_int_eq(mge_graph_run(b->g, MGE_RUN_TRAIN, 3), MGE_OK);
    float *g = mge_graph_grads(b->g, ng);
    *grads = mge_malloc(sizeof(float) * (size_t)(*ng ? *ng : 1));
    memcpy(*grads, g, sizeof(float) * (size_t)*ng);
    return *(float *)mge_value_data(b->g, b->loss);
}

START_TEST(test_bit_identical)
{
    /* _i: network kind; each compared plain vs sublinear vs light */
    enum net kind = (enum net)_i;
    int layers = kind == NET_CONV || kind == NET_RESNET ? 4 : kind == NET_GPT ? 8 : 12;
    struct built plain, sub, light;
    float *g0, *g1, *g2;
    int64_t n0, n1, n2;
    ck_assert_int_eq(build(kind, layers, MGE_REMAT_NONE, 0, &plain), MGE_OK);
    ck_assert_int_eq(build(kind, layers, MGE_REMAT_SUBLINEAR, 0, &sub), MGE_OK);
    ck_assert_int_eq(build(kind, layers, MGE_REMAT_LIGHT, 0, &light), MGE_OK);
    float l0 = step(&plain, &g0, &n0), l1 = step(&sub, &g1, &n1), l2 = step(&light, &g2, &n2);
    /* parameters and buffers (batch norm's running statistics: updated once, not per clone) */
    int64_t p0, p1, p2;
    const float *pa0 = mge_graph_params(plain.g, &p0), *pa1 = mge_graph_params(sub.g, &p1);
    const float *pa2 = mge_graph_params(light.g, &p2);
    ck_assert_int_eq(p0, p1);
    ck_assert_int_eq(p0, p2);
    ck_assert_mem_eq(pa0, pa1, sizeof(float) * (size_t)p0);
    ck_assert_mem_eq(pa0, pa2, sizeof(float) * (size_t)p0);
    ck_assert_mem_eq(&l0, &l1, sizeof(float));
    ck_assert_mem_eq(&l0, &l2, sizeof(float));
    ck_assert_int_eq(n0, n1);
    ck_assert_int_eq(n0, n2);
    ck_assert_mem_eq(g0, g1, sizeof(float) * (size_t)n0);
    ck_assert_mem_eq(g0, g2, sizeof(float) * (size_t)n0);
    if (kind != NET_CONV) /* conv nets this small have their peak in the first layer */
        ck_assert_msg(sub.chosen.recompute_ops > 0, "sublinear recomputed nothing");
    if (kind == NET_RESNET) { /* batch norms are among what light mode recomputes */
        int bn_clones = 0;
        for (int ni = light.g->n_forward; ni < light.g->n_nodes; ni++)
            bn_clones += light.g->nodes[ni].op == MGE_OP_BATCHNORM;
        ck_assert_msg(bn_clones > 0, "light mode recomputed no batch norm");
    }
    if (kind == NET_GPT) { /* attention outputs are among what sublinear drops and recomputes */
        int attn_clones = 0;
        for (int ni = sub.g->n_forward; ni < sub.g->n_nodes; ni++)
            attn_clones += sub.g->nodes[ni].op == MGE_OP_ATTENTION;
        ck_assert_msg(attn_clones > 0, "sublinear recomputed no attention");
    }
    ck_assert_uint_le(sub.st.activation_bytes, plain.st.activation_bytes);
    mge_free(g0);
    mge_free(g1);
    mge_free(g2);
    mge_graph_free(plain.g);
    mge_graph_free(sub.g);
    mge_graph_free(light.g);
}
END_TEST

START_TEST(test_chain_memory_shrinks)
{
    struct built plain, sub;
    ck_assert_int_eq(build(NET_CHAIN, 64, MGE_REMAT_NONE, 0, &plain), MGE_OK);
    ck_assert_int_eq(build(NET_CHAIN, 64, MGE_REMAT_SUBLINEAR, 0, &sub), MGE_OK);
    double ratio = (double)sub.st.activation_bytes / (double)plain.st.activation_bytes;
    /* sqrt(64) segments: well under a third of the plain activations */
    ck_assert_msg(ratio < 0.33, "sublinear keeps %.2f of the activations", ratio);
    ck_assert_uint_eq(sub.chosen.activation_bytes, sub.st.activation_bytes);
    ck_assert_uint_eq(plain.chosen.recompute_ops, 0);
    ck_assert(sub.chosen.recompute_flops > 0);
    ck_assert_uint_eq(sub.plain.activation_bytes, plain.st.activation_bytes);
    mge_graph_free(plain.g);
    mge_graph_free(sub.g);
}
END_TEST

START_TEST(test_budget_picks_least_recompute)
{
    struct built plain, min, mid;
    ck_assert_int_eq(build(NET_CHAIN, 64, MGE_REMAT_NONE, 0, &plain), MGE_OK);
    ck_assert_int_eq(build(NET_CHAIN, 64, MGE_REMAT_SUBLINEAR, 0, &min), MGE_OK);
    size_t budget = (min.st.activation_bytes + plain.st.activation_bytes) / 2;
    ck_assert_int_eq(build(NET_CHAIN, 64, MGE_REMAT_SUBLINEAR, budget, &mid), MGE_OK);
    ck_assert_uint_le(mid.st.activation_bytes, budget);
    /* more room than the minimum: less recomputation than the minimum-memory plan */
    ck_assert(mid.chosen.recompute_flops < min.chosen.recompute_flops);
    ck_assert(mid.chosen.recompute_flops > 0);
    mge_graph_free(plain.g);
    mge_graph_free(min.g);
    mge_graph_free(mid.g);
}
END_TEST

/* The smallest plan the search finds: a 1-byte budget fails and reports it. */
static struct mge_remat_plan smallest_plan(enum net kind, int layers)
{
    struct built b;
    ck_assert_int_eq(build(kind, layers, MGE_REMAT_SUBLINEAR, 1, &b), MGE_BUDGET);
    mge_graph_free(b.g);
    return b.chosen;
}

START_TEST(test_chain_budget_segments)
{
    /* 64 layers of 1 KiB activations: segments that shrink as checkpoints pile up reach about
     * sqrt(2 * 64) = 11.3 activations plus the gradients in flight; equal segments need
     * 2 sqrt(64) = 16 */
    struct mge_remat_plan min = smallest_plan(NET_CHAIN, 64);
    ck_assert_msg(min.activation_bytes <= 14 * 1024, "smallest arena %zu bytes",
                  min.activation_bytes);
    /* each activation is recomputed at most once */
    ck_assert_int_le(min.recompute_ops, 64);
}
END_TEST

START_TEST(test_default_within_slack)
{
    /* _i: network kind; no budget: the least recomputation within the slack of the minimum */
    enum net kind = (enum net)_i;
    struct mge_remat_plan min = smallest_plan(kind, 48);
    size_t limit = (size_t)((double)min.activation_bytes * MGE__SUBLINEAR_SLACK);
    struct built def, lim;
    ck_assert_int_eq(build(kind, 48, MGE_REMAT_SUBLINEAR, 0, &def), MGE_OK);
    ck_assert_uint_le(def.st.activation_bytes, limit);
    ck_assert_uint_eq(def.st.activation_bytes, def.chosen.activation_bytes);
    /* the slack buys less recomputation than the smallest plan needs */
    ck_assert(def.chosen.recompute_flops < min.recompute_flops);
    ck_assert(def.chosen.recompute_ops > 0);
    /* and as little as a budget of that size gets (up to what counts as free) */
    ck_assert_int_eq(build(kind, 48, MGE_REMAT_SUBLINEAR, limit, &lim), MGE_OK);
    double step = mge_graph_flops(def.g) - def.chosen.recompute_flops;
    ck_assert(def.chosen.recompute_flops <=
              lim.chosen.recompute_flops + MGE__SUBLINEAR_FREE * step + 0.5);
    mge_graph_free(def.g);
    mge_graph_free(lim.g);
}
END_TEST

START_TEST(test_budget_too_small)
{
    struct built b;
    ck_assert_int_eq(build(NET_CHAIN, 32, MGE_REMAT_SUBLINEAR, 4096, &b), MGE_BUDGET);
    ck_assert_ptr_nonnull(strstr(mge_graph_error_msg(b.g), "activations need at least"));
    ck_assert_uint_gt(b.chosen.activation_bytes, 4096);
    mge_graph_free(b.g);
    /* no recomputation allowed: the plain plan must fit */
    ck_assert_int_eq(build(NET_CHAIN, 32, MGE_REMAT_NONE, 4096, &b), MGE_BUDGET);
    ck_assert_ptr_nonnull(strstr(mge_graph_error_msg(b.g), "without recomputation"));
    mge_graph_free(b.g);
}
END_TEST

START_TEST(test_auto_mode)
{
    struct built a, plain, tight;
    ck_assert_int_eq(build(NET_CHAIN, 32, MGE_REMAT_AUTO, 0, &a), MGE_OK);
    ck_assert_int_eq(a.chosen.mode, MGE_REMAT_NONE); /* no budget: nothing to do */
    ck_assert_int_eq(build(NET_CHAIN, 32, MGE_REMAT_NONE, 0, &plain), MGE_OK);
    ck_assert_int_eq(build(NET_CHAIN, 32, MGE_REMAT_AUTO, plain.st.activation_bytes * 2 / 3,
                           &tight), MGE_OK);
    ck_assert_int_eq(tight.chosen.mode, MGE_REMAT_SUBLINEAR);
    ck_assert_uint_lt(tight.st.activation_bytes, plain.st.activation_bytes);
    mge_graph_free(a.g);
    mge_graph_free(plain.g);
    mge_graph_free(tight.g);
}
END_TEST

START_TEST(test_inplace_shares_storage)
{
    /* relu over the conv output: the conv output dies there, so they share bytes */
    struct built b;
    ck_assert_int_eq(build(NET_CONV, 2, MGE_REMAT_NONE, 0, &b), MGE_OK);
    int found = 0;
    for (int ni = 0; ni < b.g->n_forward; ni++) {
        const struct mge_node *n = &b.g->nodes[ni];
        if (n->op == MGE_OP_UNARY) {
            ck_assert_ptr_eq(mge_value_data(b.g, n->out[0]), mge_value_data(b.g, n->in[0]));
            found++;
        }
    }
    ck_assert_int_eq(found, 2);
    mge_graph_free(b.g);
}
END_TEST

START_TEST(test_alloc_failures)
{
    /* each injected failure is logged where it starts, at error level: thousands of lines */
    mge_log_set_level(MGE_LOG_OFF);
    for (long n = 0; n < 20000; n++) {
        struct mge_graph *g = NULL;
        int64_t xs[2] = {4, 8}, ws[2] = {8, 8}, ys[1] = {4};
        int rc = mge_graph_new(&g);
        ck_assert_int_eq(rc, MGE_OK);
        int t = mge_input(g, "x", MGE_DTYPE_F32, 2, xs, 1);
        for (int i = 0; i < 8; i++) {
            char name[16];
            snprintf(name, sizeof(name), "w%d", i);
            t = mge_linear(g, t, mge_param(g, name, 2, ws, MGE_INIT_ZERO, 1), -1, MGE_ACT_FN_RELU);
        }
        int l = mge_cross_entropy(g, t, mge_input(g, "y", MGE_DTYPE_I32, 1, ys, 1));
        ck_assert_int_eq(mge_graph_backward(g, l), MGE_OK);
        mge_alloc_fail_after(n);
        rc = mge_graph_sublinear(g, MGE_REMAT_SUBLINEAR, 0, NULL, NULL);
        if (rc == MGE_OK)
            rc = mge_graph_plan(g, NULL);
        mge_alloc_fail_after(-1);
        ck_assert(rc == MGE_OK || rc == MGE_NOMEM);
        mge_graph_free(g);
        if (rc == MGE_OK)
            return; /* about 2,100 allocations since the planner's local search */
    }
    ck_abort_msg("sublinear pass never succeeded with 20000 allocations");
}
END_TEST

/* ---- the zoo's GPT and ResNet-56 ---- */

enum zoo { ZOO_GPT, ZOO_RESNET56 };

struct zoo_built {
    struct mge_graph *g;
    struct mge_model m;
    struct mge_remat_plan chosen, plain;
    int64_t batch;
};

/*
 * @z at its benchmark size (@full: 8-layer GPT, d 128, 4 heads, 16 x 128 tokens, vocab 256;
 * ResNet-56 of width 16 on 128 1x28x28 images) or a small one with the same structure (8
 * layers of d 16 with dropout; ResNet-56 of width 4 on 4 1x8x8 images). Differentiated and
 * passed through mge_graph_sublinear(@mode); allocated only when not @full.
 */
static void zoo_build(enum zoo z, int full, enum mge_remat mode, struct zoo_built *b)
{
    struct mge_jobspec spec;
    int hw = full ? 28 : 8;
    memset(&spec, 0, sizeof(spec));
    memset(b, 0, sizeof(*b));
    if (z == ZOO_GPT) {
        spec.model.type = MGE_MODEL_GPT;
        spec.model.layers = 8;
        spec.model.heads = full ? 4 : 2;
        spec.model.d_model = full ? 128 : 16;
        spec.model.context = full ? 128 : 16;
        spec.model.vocab = full ? 256 : 32;
        spec.model.dropout = full ? 0.0f : 0.1f;
        b->batch = full ? 16 : 4;
    } else {
        spec.model.type = MGE_MODEL_RESNET;
        spec.model.depth = 56;
        spec.model.width = full ? 16 : 4;
        b->batch = full ? 128 : 4;
    }
    ck_assert_int_eq(mge_graph_new(&b->g), MGE_OK);
    int rc = mge_model_build(b->g, &spec, b->batch, 1, hw, hw, full ? 10 : 3, &b->m);
    ck_assert_msg(rc == MGE_OK, "%s", mge_graph_error_msg(b->g));
    ck_assert_int_eq(mge_graph_backward(b->g, b->m.loss), MGE_OK);
    ck_assert_int_eq(mge_graph_sublinear(b->g, mode, 0, &b->chosen, &b->plain), MGE_OK);
    if (!full) {
        ck_assert_int_eq(mge_graph_plan(b->g, NULL), MGE_OK);
        ck_assert_int_eq(mge_graph_alloc(b->g), MGE_OK);
    }
}

/* Two training steps (SGD on the gradients in between) on fixed data; the losses out. */
static void zoo_steps(enum zoo z, struct zoo_built *b, float loss[2])
{
    static float x[4 * 8 * 8];
    static int32_t tok[4 * 16], y[4 * 16];
    struct mge_rng rng;
    mge_rng_seed(&rng, 99);
    for (size_t i = 0; i < sizeof(x) / sizeof(x[0]); i++)
        x[i] = mge_rng_float(&rng);
    for (size_t i = 0; i < sizeof(tok) / sizeof(tok[0]); i++) {
        tok[i] = (int32_t)mge_rng_below(&rng, 32);
        y[i] = (int32_t)mge_rng_below(&rng, z == ZOO_GPT ? 32 : 3);
    }
    mge_graph_init_params(b->g, 7);
    ck_assert_int_eq(mge_graph_bind(b->g, b->m.x, z == ZOO_GPT ? (void *)tok : (void *)x), MGE_OK);
    ck_assert_int_eq(mge_graph_bind(b->g, b->m.y, y), MGE_OK);
    for (int s = 0; s < 2; s++) {
        ck_assert_int_eq(mge_graph_run(b->g, MGE_RUN_TRAIN, s + 1), MGE_OK);
        loss[s] = *(float *)mge_value_data(b->g, b->m.loss);
        int64_t np, ng;
        float *p = mge_graph_params(b->g, &np);
        const float *d = mge_graph_grads(b->g, &ng);
        for (int64_t i = 0; i < ng && s == 0; i++) /* trained floats come first */
            p[i] -= 0.1f * d[i];
    }
}

START_TEST(test_zoo_bit_identical)
{
    /* _i: enum zoo; the default sublinear plan against the plain one, two steps */
    enum zoo z = (enum zoo)_i;
    struct zoo_built plain, sub;
    float l0[2], l1[2];
    zoo_build(z, 0, MGE_REMAT_NONE, &plain);
    zoo_build(z, 0, MGE_REMAT_SUBLINEAR, &sub);
    ck_assert_msg(sub.chosen.recompute_ops > 0, "sublinear recomputed nothing");
    zoo_steps(z, &plain, l0);
    zoo_steps(z, &sub, l1);
    ck_assert_mem_eq(l0, l1, sizeof(l0));
    int64_t n0, n1, p0, p1;
    const float *g0 = mge_graph_grads(plain.g, &n0), *g1 = mge_graph_grads(sub.g, &n1);
    ck_assert_int_eq(n0, n1);
    ck_assert_mem_eq(g0, g1, sizeof(float) * (size_t)n0);
    const float *pa0 = mge_graph_params(plain.g, &p0), *pa1 = mge_graph_params(sub.g, &p1);
    ck_assert_int_eq(p0, p1);
    ck_assert_mem_eq(pa0, pa1, sizeof(float) * (size_t)p0); /* batch norms' running stats too */
    int attn = 0;
    for (int ni = sub.g->n_forward; ni < sub.g->n_nodes; ni++)
        attn += sub.g->nodes[ni].op == MGE_OP_ATTENTION;
    if (z == ZOO_GPT) /* blocks are recomputed whole, fused attention included */
        ck_assert_msg(attn > 0, "sublinear recomputed no attention");
    mge_graph_free(plain.g);
    mge_graph_free(sub.g);
}
END_TEST

START_TEST(test_zoo_memory_goal)
{
    /* _i: enum zoo; at the benchmark sizes (docs/benchmarks.md): at most 30 % of the plain
     * activations, recomputing at most a quarter of the plain step's FLOPs (each block about
     * once: a forward pass is about a third of a step; 20 % on both) */
    enum zoo z = (enum zoo)_i;
    struct zoo_built b;
    zoo_build(z, 1, MGE_REMAT_SUBLINEAR, &b);
    double ratio = (double)b.chosen.activation_bytes / (double)b.plain.activation_bytes;
    double flops = b.chosen.recompute_flops / (mge_graph_flops(b.g) - b.chosen.recompute_flops);
    ck_assert_msg(ratio <= 0.30, "%s keeps %.1f %% of the plain activations (%zu of %zu bytes)",
                  z == ZOO_GPT ? "gpt" : "resnet-56", 100.0 * ratio, b.chosen.activation_bytes,
                  b.plain.activation_bytes);
    ck_assert_msg(flops <= 0.25, "%s recomputes %.1f %% of the plain step's FLOPs",
                  z == ZOO_GPT ? "gpt" : "resnet-56", 100.0 * flops);
    mge_graph_free(b.g);
}
END_TEST

static Suite *sublinear_suite(void)
{
    Suite *s = suite_create("sublinear");
    TCase *tc = tcase_create("identical");
    tcase_add_loop_test(tc, test_bit_identical, NET_CHAIN, NET_GPT + 1);
    suite_add_tcase(s, tc);
    tc = tcase_create("zoo");
    tcase_set_timeout(tc, 120); /* searching ResNet-56's plans: seconds on a busy machine */
    tcase_add_loop_test(tc, test_zoo_bit_identical, ZOO_GPT, ZOO_RESNET56 + 1);
    tcase_add_loop_test(tc, test_zoo_memory_goal, ZOO_GPT, ZOO_RESNET56 + 1);
    suite_add_tcase(s, tc);
    tc = tcase_create("plans");
    tcase_add_test(tc, test_chain_memory_shrinks);
    tcase_add_test(tc, test_budget_picks_least_recompute);
    tcase_add_test(tc, test_chain_budget_segments);
    tcase_add_loop_test(tc, test_default_within_slack, NET_CHAIN, NET_DROPOUT + 1);
    tcase_add_loop_test(tc, test_default_within_slack, NET_BRANCHES, NET_BRANCHES + 1);
    tcase_add_test(tc, test_budget_too_small);
    tcase_add_test(tc, test_auto_mode);
    tcase_add_test(tc, test_inplace_shares_storage);
    tcase_add_test(tc, test_alloc_failures);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return mge_test_run(sublinear_suite()); }
