/*
 * test_gpus.c: Check suite for GPU lists and index masks (common/gpu.c) and the worker's GPU
 * side (worker/gpus.c): the MGE_FAKE_GPUS test hook's format and its errors, masks as
 * CUDA_VISIBLE_DEVICES text, and a rank's CUDA_VISIBLE_DEVICES mapped through the worker's own.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/gpu.h"
#include "tests/unit/support/check_run.h"
#include "worker/gpus.h"

static struct mge_gpu g[MGE_GPUS_MAX];

START_TEST(test_gpus_parse)
{
    char why[200];
    int n = -1;
    ck_assert_int_eq(mge_gpus_parse("2x NVIDIA H100 80GB HBM3:81559", g, &n, why, sizeof(why)),
                     MGE_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_str_eq(g[1].name, "NVIDIA H100 80GB HBM3");
    ck_assert_int_eq(g[1].memory_mb, 81559);
    /* the count is optional; a name may hold 'x' and ':' (the memory follows the last ':') */
    ck_assert_int_eq(mge_gpus_parse("1x Small:60, Tesla T4x:x:15360", g, &n, why, sizeof(why)),
                     MGE_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_str_eq(g[0].name, "Small");
    ck_assert_str_eq(g[1].name, "Tesla T4x:x");
    ck_assert_int_eq(g[1].memory_mb, 15360);
    ck_assert_int_eq(mge_gpus_parse("", g, &n, why, sizeof(why)), MGE_OK);
    ck_assert_int_eq(n, 0);
}
END_TEST

static const struct {
    const char *in, *why;
} bad[] = {
    {"2x NVIDIA H100", "GPU 'NVIDIA H100' has no ':MEMORY_MB'"},
    {"0x A:1", "bad GPU count '0x' (expected 1x..64x)"},
    {"A:0", "bad memory '0' of GPU 'A' (expected MiB, a positive integer)"},
    {"A:80GB", "bad memory '80GB' of GPU 'A' (expected MiB, a positive integer)"},
    {"2x :100", "GPU name '' is empty or longer than 95 characters"},
    {"60x A:1,5x B:1", "more than 64 GPUs"},
};

START_TEST(test_gpus_parse_bad)
{
    char why[200] = "";
    int n = -1;
    ck_assert_int_eq(mge_gpus_parse(bad[_i].in, g, &n, why, sizeof(why)), MGE_INVAL);
    ck_assert_str_eq(why, bad[_i].why);
    ck_assert_int_eq(n, 0);
}
END_TEST

START_TEST(test_gpus_mask)
{
    char buf[256];
    uint64_t m = 0;
    ck_assert_str_eq(mge_gpu_mask_format(0, buf, sizeof(buf)), "");
    ck_assert_str_eq(mge_gpu_mask_format(0x6, buf, sizeof(buf)), "1,2");
    ck_assert_str_eq(mge_gpu_mask_format((uint64_t)1 << 63, buf, sizeof(buf)), "63");
    ck_assert(mge_gpu_mask_parse("1,2", &m));
    ck_assert_uint_eq(m, 0x6);
    ck_assert_int_eq(mge_gpu_mask_count(m), 2);
    ck_assert(mge_gpu_mask_parse("", &m));
    ck_assert_uint_eq(m, 0);
    ck_assert(!mge_gpu_mask_parse("1,", &m));
    ck_assert(!mge_gpu_mask_parse("64", &m));
    ck_assert(!mge_gpu_mask_parse("a", &m));
    ck_assert(!mge_gpu_mask_parse(",1", &m));
}
END_TEST

START_TEST(test_gpus_visible)
{
    char buf[256];
    ck_assert_str_eq(mge_gpus_visible("1", NULL, buf, sizeof(buf)), "1");
    ck_assert_str_eq(mge_gpus_visible("", NULL, buf, sizeof(buf)), "");
    /* the worker runs under CUDA_VISIBLE_DEVICES: its index i is the i-th entry there */
    ck_assert_str_eq(mge_gpus_visible("0,1", "2,3", buf, sizeof(buf)), "2,3");
    ck_assert_str_eq(mge_gpus_visible("1", "GPU-aa,GPU-bb", buf, sizeof(buf)), "GPU-bb");
    ck_assert_str_eq(mge_gpus_visible("", "2,3", buf, sizeof(buf)), "");
    ck_assert_str_eq(mge_gpus_visible("2", "5", buf, sizeof(buf)), ""); /* not the worker's */
}
END_TEST

START_TEST(test_gpus_detect_fake)
{
    char source[64], why[200];
    int n = 0;
    ck_assert_int_eq(setenv(MGE_FAKE_GPUS_ENV, "2x NVIDIA H100 80GB HBM3:81559", 1), 0);
    ck_assert_int_eq(mge_gpus_detect(g, &n, source, sizeof(source), why, sizeof(why)), MGE_OK);
    ck_assert_str_eq(source, "MGE_FAKE_GPUS");
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(g[0].memory_mb, 81559);
    ck_assert_int_eq(setenv(MGE_FAKE_GPUS_ENV, "H100", 1), 0);
    ck_assert_int_eq(mge_gpus_detect(g, &n, source, sizeof(source), why, sizeof(why)), MGE_INVAL);
    ck_assert_str_eq(why, "GPU 'H100' has no ':MEMORY_MB'");
    ck_assert_int_eq(n, 0);
    /* without the hook: whatever the CUDA runtime sees here (no GPU on CI), never an error */
    ck_assert_int_eq(unsetenv(MGE_FAKE_GPUS_ENV), 0);
    ck_assert_int_eq(mge_gpus_detect(g, &n, source, sizeof(source), why, sizeof(why)), MGE_OK);
    ck_assert_int_ge(n, 0);
}
END_TEST

static Suite *gpus_suite(void)
{
    Suite *s = suite_create("gpus");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, test_gpus_parse);
    tcase_add_loop_test(tc, test_gpus_parse_bad, 0, (int)(sizeof(bad) / sizeof(bad[0])));
    suite_add_tcase(s, tc);
    tc = tcase_create("mask");
    tcase_add_test(tc, test_gpus_mask);
    suite_add_tcase(s, tc);
    tc = tcase_create("visible");
    tcase_add_test(tc, test_gpus_visible);
    suite_add_tcase(s, tc);
    tc = tcase_create("detect");
    tcase_add_test(tc, test_gpus_detect_fake);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mge_test_run(gpus_suite());
}
