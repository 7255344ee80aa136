/* test_lttb.c: Check suite for common/lttb.c: pass-through, endpoints, order, bucket count,
 * and that a lone spike in a long flat series survives downsampling. */
#include <check.h>
#include <stdlib.h>

#include "common/lttb.h"
#include "tests/unit/support/check_run.h"

START_TEST(test_lttb_small_passthrough)
{
    double x[5] = {1, 2, 3, 4, 5}, y[5] = {5, 4, 3, 2, 1};
    size_t idx[5];
    ck_assert_uint_eq(mge_lttb(x, y, 5, 10, idx), 5);
    for (size_t i = 0; i < 5; i++)
        ck_assert_uint_eq(idx[i], i);
    ck_assert_uint_eq(mge_lttb(x, y, 5, 2, idx), 5); /* < 3 means no downsampling */
    ck_assert_uint_eq(mge_lttb(x, y, 0, 10, idx), 0);
}
END_TEST

START_TEST(test_lttb_keeps_ends_and_order)
{
    enum { N = 100000, M = 1000 };
    double *x = malloc(N * sizeof(*x)), *y = malloc(N * sizeof(*y));
    size_t *idx = malloc(M * sizeof(*idx)), k;
    for (size_t i = 0; i < N; i++) {
        x[i] = (double)(i + 1);
        y[i] = 1.0 / (1.0 + (double)i * 1e-3) + ((i * 7919) % 13) * 1e-3;
    }
    k = mge_lttb(x, y, N, M, idx);
    ck_assert_uint_eq(k, M);
    ck_assert_uint_eq(idx[0], 0);
    ck_assert_uint_eq(idx[M - 1], N - 1);
    for (size_t i = 1; i < k; i++)
        ck_assert_uint_lt(idx[i - 1], idx[i]);
    free(x);
    free(y);
    free(idx);
}
END_TEST

START_TEST(test_lttb_keeps_spike)
{
    enum { N = 50000, M = 200, SPIKE = 31337 };
    double *x = malloc(N * sizeof(*x)), *y = malloc(N * sizeof(*y));
    size_t *idx = malloc(M * sizeof(*idx)), k;
    int found = 0;
    for (size_t i = 0; i < N; i++) {
        x[i] = (double)i;
        y[i] = i == SPIKE ? 10.0 : 0.5;
    }
    k = mge_lttb(x, y, N, M, idx);
    for (size_t i = 0; i < k; i++)
        found |= idx[i] == SPIKE;
    ck_assert(found);
    free(x);
    free(y);
    free(idx);
}
END_TEST

static Suite *lttb_suite(void)
{
    Suite *s = suite_create("lttb");
    TCase *tc = tcase_create("lttb");
    tcase_add_test(tc, test_lttb_small_passthrough);
    tcase_add_test(tc, test_lttb_keeps_ends_and_order);
    tcase_add_test(tc, test_lttb_keeps_spike);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return mge_test_run(lttb_suite()); }
