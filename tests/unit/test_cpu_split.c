/*
 * test_cpu_split.c: the per-thread thread override (mge_cpu_set_local_threads) and
 * mge_cpu_run_split, which mge-infer's batch split runs on: every share is called once, each
 * under a count of 1, and kernels run inside a share (nested OpenMP regions with a team of one)
 * write all of their output, as they do outside it with the whole team.
 */
#include <check.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "tests/unit/support/check_run.h"

#define SHARES 3

static float *nan_new(size_t n)
{
    float *p = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    return p;
}

static float *rnd_new(size_t n, unsigned seed)
{
    float *p = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
    return p;
}

/* Within 1e-5 relative (a GEMM split differently may round differently); NaN (never written)
 * fails. */
static void assert_same(const char *what, const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabsf(got[i] - want[i]) <= 1e-5f * (1.0f + fabsf(want[i])),
                      "%s[%zu]: %g inside a share, %g outside", what, i, (double)got[i],
                      (double)want[i]);
}

START_TEST(test_local_threads_override)
{
    mge_cpu_set_threads(2);
    ck_assert_int_eq(mge_cpu_threads(), 2);
    mge_cpu_set_local_threads(1);
    ck_assert_int_eq(mge_cpu_threads(), 1);
    ck_assert_int_eq(omp_get_max_threads(), 1);
    mge_cpu_set_local_threads(0);
    ck_assert_int_eq(mge_cpu_threads(), 2);
    ck_assert_int_eq(omp_get_max_threads(), 2);
}
END_TEST

struct calls {
    int count[SHARES];
    int threads[SHARES];     /* mge_cpu_threads() inside */
    int omp_threads[SHARES]; /* omp_get_max_threads() inside */
};

static void count_call(void *arg, int t)
{
    struct calls *c = arg;
    __atomic_fetch_add(&c->count[t], 1, __ATOMIC_RELAXED);
    c->threads[t] = mge_cpu_threads();
    c->omp_threads[t] = omp_get_max_threads();
}

START_TEST(test_run_split_calls_every_share_once)
{
    struct calls c;
    memset(&c, 0, sizeof(c));
    mge_cpu_set_threads(2); /* 3 shares on a team of (at most) 2 threads */
    mge_cpu_run_split(SHARES, count_call, &c);
    for (int t = 0; t < SHARES; t++) {
        ck_assert_int_eq(c.count[t], 1);
        ck_assert_int_eq(c.threads[t], 1);
        ck_assert_int_eq(c.omp_threads[t], 1);
    }
    ck_assert_int_eq(mge_cpu_threads(), 2); /* the caller's count is untouched */
}
END_TEST

/* A small conv net's kernels: conv (planned for @cv's slots), batch norm (inference), a GEMM
 * big enough to be split across threads outside a share, and a softmax. */
struct net {
    struct mge_cpu_conv cv;
    float *x, *w, *bias, *bn_w, *bn_b, *rm, *rv, *a, *b;
    float *mean, *rstd; /* (K) batch norm's outputs: each share its own */
    void *scratch;
};

enum { N = 8, C = 3, H = 12, K = 8, GM = 256, GN = 128, GK = 96 };

static size_t conv_out(const struct net *n)
{
    return (size_t)N * K * n->cv.P * n->cv.Q;
}

/* Run the kernels into @out: conv output, then GEMM output, then softmax rows. */
static void net_run(struct net *n, float *out)
{
    size_t co = conv_out(n);
    mge_cpu_conv2d_forward(&n->cv, out, n->x, n->w, n->bias, n->scratch);
    mge_cpu_batchnorm_forward(out, n->mean, n->rstd, out, n->bn_w, n->bn_b, n->rm, n->rv, N, K,
                              (int64_t)n->cv.P * n->cv.Q, 1e-5f, 0.1f, 0, 0);
    mge_cpu_sgemm(0, 0, GM, GN, GK, 1.0f, n->a, GK, n->b, GN, 0.0f, out + co, GN);
    mge_cpu_softmax_forward(out + co + (size_t)GM * GN, out + co, GM, GN);
}

static size_t net_out(const struct net *n)
{
    return conv_out(n) + 2 * (size_t)GM * GN;
}

/* net_run(n[t], out[t]) in share t */
struct shares {
    struct net *n[2];
    float *out[2];
};

static void run_share(void *arg, int t)
{
    struct shares *s = arg;
    net_run(s->n[t], s->out[t]);
}

START_TEST(test_kernels_inside_a_share_write_everything)
{
    struct net n;
    memset(&n, 0, sizeof(n));
    mge_cpu_set_threads(2);
    n.cv = (struct mge_cpu_conv){
        .N = N, .C = C, .H = H, .W = H, .K = K, .R = 3, .S = 3, .stride = 1, .pad = 1};
    ck_assert_int_eq(mge_cpu_conv_init(&n.cv), 0); /* planned at 2 threads: 2 slots */
    n.x = rnd_new((size_t)N * C * H * H, 1);
    n.w = rnd_new((size_t)K * C * 9, 2);
    n.bias = rnd_new(K, 3);
    n.bn_w = rnd_new(K, 4);
    n.bn_b = rnd_new(K, 5);
    n.rm = rnd_new(K, 6);
    n.rv = rnd_new(K, 7);
    for (int k = 0; k < K; k++)
        n.rv[k] = 1.0f + fabsf(n.rv[k]);
    n.mean = nan_new(K);
    n.rstd = nan_new(K);
    n.a = rnd_new((size_t)GM * GK, 8);
    n.b = rnd_new((size_t)GK * GN, 9);
    n.scratch = malloc(mge_cpu_conv_scratch_bytes(&n.cv) + 64);
    ck_assert_ptr_nonnull(n.scratch);
    size_t no = net_out(&n);
    float *want = nan_new(no);
    net_run(&n, want); /* outside: every op over the whole team */

    /* each share gets its own conv plan (one scratch would race), made under a count of 1 as
     * mge-infer plans its graphs; run alone, then both at once */
    struct net each[2];
    struct shares alone, both;
    mge_cpu_set_local_threads(1);
    for (int t = 0; t < 2; t++) {
        each[t] = n;
        ck_assert_int_eq(mge_cpu_conv_init(&each[t].cv), 0);
        ck_assert_int_eq(each[t].cv.slots, 1);
        each[t].scratch = malloc(mge_cpu_conv_scratch_bytes(&each[t].cv) + 64);
        each[t].mean = nan_new(K);
        each[t].rstd = nan_new(K);
        ck_assert_ptr_nonnull(each[t].scratch);
        alone.n[t] = both.n[t] = &each[t];
        alone.out[t] = nan_new(no);
        both.out[t] = nan_new(no);
    }
    mge_cpu_set_local_threads(0);
    for (int t = 0; t < 2; t++) {
        struct shares one = {{alone.n[t]}, {alone.out[t]}};
        mge_cpu_run_split(1, run_share, &one);
    }
    mge_cpu_run_split(2, run_share, &both);
    for (int t = 0; t < 2; t++) {
        assert_same("a share alone", alone.out[t], want, no);
        assert_same("shares at once", both.out[t], want, no);
        free(alone.out[t]);
        free(both.out[t]);
        free(each[t].scratch);
        free(each[t].mean);
        free(each[t].rstd);
    }
    /* a conv planned at 2 threads (2 slots) and run inside a share uses one */
    struct shares planned2 = {{&n}, {nan_new(no)}};
    mge_cpu_run_split(1, run_share, &planned2);
    assert_same("a 2-slot plan inside a share", planned2.out[0], want, no);
    free(planned2.out[0]);
    free(want);
    free(n.x);
    free(n.w);
    free(n.bias);
    free(n.bn_w);
    free(n.bn_b);
    free(n.rm);
    free(n.rv);
    free(n.a);
    free(n.b);
    free(n.scratch);
    free(n.mean);
    free(n.rstd);
}
END_TEST

static Suite *cpu_split_suite(void)
{
    Suite *s = suite_create("cpu_split");
    TCase *tc = tcase_create("local_threads");
    tcase_add_test(tc, test_local_threads_override);
    suite_add_tcase(s, tc);
    tc = tcase_create("run_split");
    tcase_add_test(tc, test_run_split_calls_every_share_once);
    tcase_add_test(tc, test_kernels_inside_a_share_write_everything);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mge_test_run(cpu_split_suite());
}
