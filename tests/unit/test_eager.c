/*
 * test_eager.c: eager mode (engine/eager.c). A small network (linear+GELU, dropout, layer norm,
 * concat and slice, linear, cross-entropy) gives bit-identical losses and weights eager and
 * static, full and partial batches; a NaN put into a parameter, a NaN written into a backward
 * op's dW and an op writing past its output (both through the op hook, which runs between an
 * op and its check) are each reported with the step, the layer, the op and the pass, and
 * memory no op wrote as such; the optimiser check, the |x| bound, the dump's files and the
 * calls' order rules.
 */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"
#include "common/rng.h"
#include "engine/engine.h"
#include "engine/engine_int.h"
#include "tests/unit/support/check_run.h"
#include "tests/unit/support/scratch_dir.h"

#define B 8 /* batch */
#define D 6 /* features */
#define H 16
#define K 5 /* classes */

struct net {
    struct mge_graph *g;
    int x, y, h1, w1, w2, loss;
    float xs[B * D];
    int32_t ys[B];
};

/* The network, eager or static, with @opts (NULL: defaults), allocated and initialised. */
static void net_build(struct net *n, int eager, const struct mge_eager_opts *opts)
{
    struct mge_graph *g;
    int64_t xs[2] = {B, D}, ys[1] = {B}, w1s[2] = {H, D}, b1s[1] = {H}, w2s[2] = {K, H},
            b2s[1] = {K};
    memset(n, 0, sizeof(*n));
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    n->g = g;
    n->x = mge_input(g, "x", MGE_DTYPE_F32, 2, xs, 1);
    n->y = mge_input(g, "y", MGE_DTYPE_I32, 1, ys, 1);
    n->w1 = mge_param(g, "fc1.w", 2, w1s, MGE_INIT_UNIFORM_FAN_IN, D);
    int b1 = mge_param(g, "fc1.b", 1, b1s, MGE_INIT_UNIFORM_FAN_IN, D);
    int lw = mge_param(g, "ln.weight", 1, b1s, MGE_INIT_ONE, 1);
    int lb = mge_param(g, "ln.bias", 1, b1s, MGE_INIT_ZERO, 1);
    n->w2 = mge_param(g, "fc2.w", 2, w2s, MGE_INIT_UNIFORM_FAN_IN, H);
    int b2 = mge_param(g, "fc2.b", 1, b2s, MGE_INIT_UNIFORM_FAN_IN, H);
    n->h1 = mge_linear(g, n->x, n->w1, b1, MGE_ACT_FN_GELU);
    int t = mge_layernorm(g, mge_dropout(g, n->h1, 0.25f), lw, lb, 1e-5f);
    int parts[2] = {t, mge_relu(g, n->h1)};
    t = mge_slice(g, mge_concat(g, parts, 2, 1), 1, 8, H); /* half of each part */
    n->loss = mge_cross_entropy(g, mge_linear(g, t, n->w2, b2, MGE_ACT_NONE), n->y);
    ck_assert_int_eq(mge_graph_error(g), MGE_OK);
    ck_assert_int_eq(mge_graph_backward(g, n->loss), MGE_OK);
    if (eager)
        ck_assert_int_eq(mge_graph_set_eager(g, opts), MGE_OK);
    ck_assert_int_eq(mge_graph_plan(g, NULL), MGE_OK);
    ck_assert_int_eq(mge_graph_alloc(g), MGE_OK);
    mge_graph_init_params(g, 7);
    struct mge_rng rng;
    mge_rng_seed(&rng, 11);
    for (int i = 0; i < B * D; i++)
        n->xs[i] = 4.0f * mge_rng_float(&rng) - 2.0f;
    for (int i = 0; i < B; i++)
        n->ys[i] = (int32_t)(i % K);
    ck_assert_int_eq(mge_graph_bind(g, n->x, n->xs), MGE_OK);
    ck_assert_int_eq(mge_graph_bind(g, n->y, n->ys), MGE_OK);
}

/* One training step at batch @batch: run, then SGD with lr 0.1. */
static int net_step(struct net *n, int64_t step, int64_t batch, float *loss)
{
    int64_t np, ng;
    ck_assert_int_eq(mge_graph_set_batch(n->g, batch), MGE_OK);
    int rc = mge_graph_run(n->g, MGE_RUN_TRAIN, step);
    if (rc != MGE_OK)
        return rc;
    float *p = mge_graph_params(n->g, &np), *gr = mge_graph_grads(n->g, &ng);
    for (int64_t i = 0; i < ng; i++)
        p[i] -= 0.1f * gr[i];
    *loss = *(const float *)mge_value_data(n->g, n->loss);
    return MGE_OK;
}

static float *param_data(struct net *n, const char *name)
{
    for (int i = 0; i < mge_graph_n_params(n->g); i++)
        if (!strcmp(mge_value_name(n->g, mge_graph_param(n->g, i)), name))
            return mge_value_data(n->g, mge_graph_param(n->g, i));
    ck_abort_msg("no parameter %s", name);
    return NULL;
}

static void assert_has(const char *s, const char *part)
{
    ck_assert_msg(strstr(s, part) != NULL, "'%s' not in '%s'", part, s);
}

START_TEST(test_eager_bit_identical)
{
    struct net s, e;
    net_build(&s, 0, NULL);
    net_build(&e, 1, NULL);
    ck_assert(mge_graph_is_eager(e.g) && !mge_graph_is_eager(s.g));
    for (int64_t step = 0; step < 6; step++) {
        float ls, le;
        int64_t batch = step == 4 ? 5 : B; /* a partial batch too */
        ck_assert_int_eq(net_step(&s, step, batch, &ls), MGE_OK);
        ck_assert_int_eq(net_step(&e, step, batch, &le), MGE_OK);
        ck_assert(isfinite(ls));
        ck_assert_msg(!memcmp(&ls, &le, sizeof(ls)), "step %lld: loss %a static, %a eager",
                      (long long)step, (double)ls, (double)le);
    }
    int64_t ns, ne;
    const float *ps = mge_graph_params(s.g, &ns), *pe = mge_graph_params(e.g, &ne);
    ck_assert_int_eq(ns, ne);
    ck_assert(!memcmp(ps, pe, sizeof(float) * (size_t)ns));
    ck_assert_str_eq(mge_graph_eager_report(e.g), "");
    ck_assert_str_eq(mge_graph_eager_report(s.g), "");
    mge_graph_free(s.g);
    mge_graph_free(e.g);
}
END_TEST

START_TEST(test_eager_nan_in_param)
{
    struct net n;
    float loss;
    net_build(&n, 1, NULL);
    for (int64_t step = 0; step < 3; step++)
        ck_assert_int_eq(net_step(&n, step, B, &loss), MGE_OK);
    param_data(&n, "fc2.w")[7] = NAN;
    ck_assert_int_eq(net_step(&n, 3, B, &loss), MGE_RANGE);
    const char *r = mge_graph_eager_report(n.g);
    assert_has(r, "step 4, layer `fc2` (op LINEAR, forward): NaN in y `");
    assert_has(r, "from inputs with max |x| ");
    assert_has(r, "input `fc2.w` already holds NaN/Inf");
    /* inference runs are checked too, and say so */
    ck_assert_int_eq(mge_graph_run(n.g, MGE_RUN_INFER, 0), MGE_RANGE);
    assert_has(mge_graph_eager_report(n.g), "evaluation, layer `fc2` (op LINEAR, forward)");
    mge_graph_free(n.g);
}
END_TEST

/* Op hook: after node @node, a NaN into the gradient of fc2.w or one float past fc1's output. */
struct fault {
    struct net *n;
    int nan_dw; /* 1: NaN into dfc2.w; 0: write past the end of fc1's y; 2: fc1's y[5..7]
                 * as memory no op wrote (eager's poison) */
    int hits;
};

static void fault_hook(void *ctx, int node, double t0, double t1)
{
    struct fault *f = ctx;
    struct mge_graph *g = f->n->g;
    const struct mge_node *nd = &g->nodes[node];
    (void)t0;
    (void)t1;
    int target = f->nan_dw == 1 ? mge_graph_grad(g, f->n->w2) : f->n->h1;
    for (int i = 0; i < nd->n_out; i++)
        if (nd->out[i] == target && g->step == 1 && !f->hits++) {
            float *d = mge_value_data(g, target);
            uint32_t poison = 0x7FC0DEADu;
            if (f->nan_dw == 1)
                d[3] = NAN;
            else if (f->nan_dw == 2)
                for (int k = 5; k < 8; k++)
                    memcpy(&d[k], &poison, 4);
            else
                d[mge_value_numel(g, target)] = 1.0f; /* the first float past the end */
        }
}

/* Train @n (eager) with the fault hook: step 1 works, step 2 meets the fault; its report. */
static const char *faulted_run(struct net *n, int nan_dw)
{
    float loss;
    net_build(n, 1, NULL);
    struct fault f = {.n = n, .nan_dw = nan_dw};
    mge_graph_set_op_hook(n->g, fault_hook, &f);
    ck_assert_int_eq(net_step(n, 0, B, &loss), MGE_OK);
    ck_assert_int_eq(net_step(n, 1, B, &loss), MGE_RANGE);
    ck_assert_int_eq(f.hits, 1);
    mge_graph_set_op_hook(n->g, NULL, NULL);
    return mge_graph_eager_report(n->g);
}

START_TEST(test_eager_nan_in_backward)
{
    struct net n;
    const char *r = faulted_run(&n, 1);
    assert_has(r, "step 2, layer `fc2` (op ");
    assert_has(r, ", backward): NaN in dW `dfc2.w` from inputs with max |x| ");
    assert_has(r, "(1 of 80 values bad, the first at index 3)");
    mge_graph_free(n.g);
}
END_TEST

START_TEST(test_eager_overrun)
{
    struct net n;
    const char *r = faulted_run(&n, 0);
    assert_has(r, "step 2, layer `fc1` (op LINEAR, forward): wrote past the end of y `linear.");
    assert_has(r, "` (512 bytes)");
    mge_graph_free(n.g);
}
END_TEST

START_TEST(test_eager_unwritten)
{
    struct net n;
    const char *r = faulted_run(&n, 2);
    assert_has(r, "step 2, layer `fc1` (op LINEAR, forward): NaN in y `linear.");
    assert_has(r, "(3 of 128 values bad, the first at index 5; 3 never written)");
    mge_graph_free(n.g);
}
END_TEST

START_TEST(test_eager_update_check)
{
    struct net n, s;
    float loss;
    net_build(&n, 1, NULL);
    net_build(&s, 0, NULL);
    ck_assert_int_eq(net_step(&n, 0, B, &loss), MGE_OK);
    ck_assert_int_eq(mge_graph_eager_check_params(n.g, 0, "optimiser sgd, lr 0.1"), MGE_OK);
    param_data(&n, "fc1.b")[2] = INFINITY;
    param_data(&s, "fc1.b")[2] = INFINITY;
    ck_assert_int_eq(mge_graph_eager_check_params(s.g, 0, "x"), MGE_OK); /* static: no checks */
    ck_assert_int_eq(mge_graph_eager_check_params(n.g, 6, "optimiser sgd, lr 0.1"), MGE_RANGE);
    assert_has(mge_graph_eager_report(n.g),
               "step 7, layer `fc1` (optimiser sgd, lr 0.1, update): Inf in parameter `fc1.b` "
               "from gradient `dfc1.b` with max |x| ");
    mge_graph_free(n.g);
    mge_graph_free(s.g);
}
END_TEST

START_TEST(test_eager_max_abs)
{
    struct net n;
    float loss;
    net_build(&n, 1, &(struct mge_eager_opts){.max_abs = 1e-3});
    ck_assert_int_eq(net_step(&n, 0, B, &loss), MGE_RANGE);
    assert_has(mge_graph_eager_report(n.g),
               "step 1, layer `fc1` (op LINEAR, forward): |x| above 0.001 in y `");
    mge_graph_free(n.g);
}
END_TEST

static long file_size(const char *dir, const char *name)
{
    char path[512];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

START_TEST(test_eager_dump)
{
    char base[] = "/tmp/mge-eager-XXXXXX", dir[64], path[128];
    struct net n;
    float loss;
    ck_assert_ptr_nonnull(mkdtemp(base));
    snprintf(dir, sizeof(dir), "%s/dump", base); /* created by the dump */
    net_build(&n, 1, &(struct mge_eager_opts){.dump_dir = dir});
    float *w2 = param_data(&n, "fc2.w");
    w2[7] = NAN;
    ck_assert_int_eq(net_step(&n, 2, B, &loss), MGE_RANGE);
    assert_has(mge_graph_eager_report(n.g), "(dumped to '");
    /* x (8, 16), w (5, 16), b (5) and y (8, 5), each a 128-byte header then the floats */
    ck_assert_int_eq(file_size(dir, "in0.npy"), 128 + 4 * B * H);
    ck_assert_int_eq(file_size(dir, "in1.npy"), 128 + 4 * K * H);
    ck_assert_int_eq(file_size(dir, "in2.npy"), 128 + 4 * K);
    ck_assert_int_eq(file_size(dir, "out0.npy"), 128 + 4 * B * K);
    snprintf(path, sizeof(path), "%s/in1.npy", dir);
    FILE *fp = fopen(path, "rb");
    unsigned char buf[128 + 4 * K * H];
    ck_assert_ptr_nonnull(fp);
    ck_assert_uint_eq(fread(buf, 1, sizeof(buf), fp), sizeof(buf));
    fclose(fp);
    ck_assert(!memcmp(buf + 128, w2, 4 * K * H));
    buf[127] = '\0'; /* the header's closing '\n' */
    ck_assert(strstr((const char *)buf + 10, "'descr': '<f4'") &&
              strstr((const char *)buf + 10, "'shape': (5, 16)"));
    snprintf(path, sizeof(path), "%s/node.json", dir);
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    ck_assert_msg(j != NULL, "node.json: %s", jerr.text);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "step")), 3);
    ck_assert_str_eq(json_string_value(json_object_get(j, "layer")), "fc2");
    ck_assert_str_eq(json_string_value(json_object_get(j, "op")), "LINEAR");
    ck_assert_str_eq(json_string_value(json_object_get(j, "pass")), "forward");
    json_t *in1 = json_array_get(json_object_get(j, "inputs"), 1);
    ck_assert_str_eq(json_string_value(json_object_get(in1, "name")), "fc2.w");
    ck_assert_str_eq(json_string_value(json_object_get(in1, "file")), "in1.npy");
    ck_assert_int_eq(json_integer_value(json_object_get(in1, "nan")), 1);
    json_decref(j);
    mge_graph_free(n.g);
    mge_test_scratch_remove(dir);
    mge_test_scratch_remove(base);
}
END_TEST

START_TEST(test_eager_order)
{
    struct mge_graph *g;
    int64_t xs[2] = {2, 3};
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    mge_relu(g, mge_input(g, "x", MGE_DTYPE_F32, 2, xs, 1));
    ck_assert_int_eq(mge_graph_plan(g, NULL), MGE_OK);
    ck_assert_int_eq(mge_graph_set_eager(g, NULL), MGE_STATE); /* planned static */
    ck_assert_str_eq(mge_graph_eager_report(g), "");
    mge_graph_free(g);
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    mge_relu(g, mge_input(g, "x", MGE_DTYPE_F32, 2, xs, 1));
    ck_assert_int_eq(mge_graph_set_eager(g, NULL), MGE_OK);
    ck_assert_int_eq(mge_graph_plan(g, NULL), MGE_OK);
    ck_assert_int_eq(mge_graph_set_eager(g, &(struct mge_eager_opts){.max_abs = 1}), MGE_OK);
    ck_assert_int_eq(mge_graph_alloc(g), MGE_OK);
    ck_assert_int_eq(mge_graph_set_eager(g, NULL), MGE_STATE); /* allocated */
    mge_graph_free(g);
}
END_TEST

static Suite *eager_suite(void)
{
    Suite *s = suite_create("eager");
    TCase *tc = tcase_create("eager");
    tcase_add_test(tc, test_eager_bit_identical);
    tcase_add_test(tc, test_eager_nan_in_param);
    tcase_add_test(tc, test_eager_nan_in_backward);
    tcase_add_test(tc, test_eager_overrun);
    tcase_add_test(tc, test_eager_unwritten);
    tcase_add_test(tc, test_eager_update_check);
    tcase_add_test(tc, test_eager_max_abs);
    tcase_add_test(tc, test_eager_dump);
    tcase_add_test(tc, test_eager_order);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mge_test_run(eager_suite());
}
