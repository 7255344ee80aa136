/* test_dataroot.c: Check suite for common/dataroot.c: roots from flags and MGE_DATA_ROOTS, the
 * under-a-root test, and mge_data_open's refusals (outside, moved, not a regular file). */
#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/dataroot.h"
#include "common/err.h"
#include "common/log.h"
#include "tests/unit/support/check_run.h"

static char dir[64], in[128], out[128];

static void setup(void)
{
    mge_log_set_level(MGE_LOG_OFF);
    snprintf(dir, sizeof(dir), "/tmp/mge-test-dataroot-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(in, sizeof(in), "%s/in", dir);
    snprintf(out, sizeof(out), "%s/in2", dir); /* a sibling whose name extends the root's */
    ck_assert_int_eq(mkdir(in, 0700), 0);
    ck_assert_int_eq(mkdir(out, 0700), 0);
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

START_TEST(test_dataroot_contain)
{
    struct mge_data_roots dr = {0}, all = {0};
    char err[256], p[256];
    ck_assert_int_eq(mge_data_roots_add(&dr, in, err, sizeof(err)), MGE_OK);
    ck_assert(mge_data_roots_contain(&dr, dr.dir[0]));
    snprintf(p, sizeof(p), "%s/a/b", dr.dir[0]);
    ck_assert(mge_data_roots_contain(&dr, p));
    snprintf(p, sizeof(p), "%s2/a", dr.dir[0]); /* ".../in2/a" is not under ".../in" */
    ck_assert(!mge_data_roots_contain(&dr, p));
    ck_assert(!mge_data_roots_contain(&dr, "/"));
    ck_assert_int_eq(mge_data_roots_add(&all, "/", err, sizeof(err)), MGE_OK);
    ck_assert(mge_data_roots_contain(&all, "/etc/shadow"));
    ck_assert(!mge_data_roots_contain(&(struct mge_data_roots){0}, "/etc/shadow"));
    mge_data_roots_fini(&dr);
    mge_data_roots_fini(&all);
}
END_TEST

START_TEST(test_dataroot_parse_join)
{
    struct mge_data_roots dr = {0}, back = {0};
    char err[256], list[512], *joined;
    snprintf(list, sizeof(list), "%s::%s/../in2/", in, in);
    ck_assert_int_eq(mge_data_roots_parse(&dr, list, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(dr.n, 2);
    joined = mge_data_roots_join(&dr);
    ck_assert_ptr_nonnull(joined);
    ck_assert_ptr_null(strstr(joined, ".."));
    ck_assert_int_eq(mge_data_roots_parse(&back, joined, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(back.n, 2);
    ck_assert_str_eq(back.dir[0], dr.dir[0]);
    ck_assert_str_eq(back.dir[1], dr.dir[1]);
    mge_free(joined);
    mge_data_roots_fini(&back);
    /* "" is no root at all */
    mge_data_roots_fini(&dr);
    ck_assert_int_eq(mge_data_roots_parse(&dr, "", err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(dr.n, 0);
}
END_TEST

START_TEST(test_dataroot_add_errors)
{
    struct mge_data_roots dr = {0};
    char err[256], p[256];
    snprintf(p, sizeof(p), "%s/nope", dir);
    ck_assert_int_eq(mge_data_roots_add(&dr, p, err, sizeof(err)), MGE_NOENT);
    ck_assert_ptr_nonnull(strstr(err, p));
    snprintf(p, sizeof(p), "%s/file", dir);
    write_file(p, "x");
    ck_assert_int_eq(mge_data_roots_add(&dr, p, err, sizeof(err)), MGE_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "not a directory"));
    snprintf(p, sizeof(p), "%s/a:b", dir);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    ck_assert_int_eq(mge_data_roots_add(&dr, p, err, sizeof(err)), MGE_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "':'"));
    for (int i = 0; i < MGE_DATA_ROOTS_MAX; i++)
        ck_assert_int_eq(mge_data_roots_add(&dr, in, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(mge_data_roots_add(&dr, in, err, sizeof(err)), MGE_TOOBIG);
    mge_data_roots_fini(&dr);
    ck_assert_int_eq(dr.n, 0);
}
END_TEST

START_TEST(test_dataroot_open)
{
    struct mge_data_roots dr = {0};
    char err[256], f_in[192], f_out[192], link[192], fifo[192];
    int fd = 7;
    snprintf(f_in, sizeof(f_in), "%s/data", in);
    snprintf(f_out, sizeof(f_out), "%s/secret", out);
    snprintf(link, sizeof(link), "%s/link", in);
    snprintf(fifo, sizeof(fifo), "%s/fifo", in);
    write_file(f_in, "inside");
    write_file(f_out, "TOP-SECRET");
    ck_assert_int_eq(symlink(f_out, link), 0);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(mge_data_roots_add(&dr, in, err, sizeof(err)), MGE_OK);

    ck_assert_int_eq(mge_data_open(&dr, f_in, &fd, err, sizeof(err)), MGE_OK);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fcntl(fd, F_GETFL) & O_NONBLOCK, 0); /* reads block as usual */
    ck_assert_int_ne(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
    close(fd);
    /* a link inside the root to a file outside it: refused, and its target is not named */
    ck_assert_int_eq(mge_data_open(&dr, link, &fd, err, sizeof(err)), MGE_FORBIDDEN);
    ck_assert_int_eq(fd, -1);
    ck_assert_ptr_nonnull(strstr(err, "is outside the worker's data roots"));
    ck_assert_ptr_null(strstr(err, "secret"));
    ck_assert_int_eq(mge_data_open(&dr, f_out, &fd, err, sizeof(err)), MGE_FORBIDDEN);
    /* a FIFO: the open does not wait for a writer, and it is refused by kind */
    ck_assert_int_eq(mge_data_open(&dr, fifo, &fd, err, sizeof(err)), MGE_IO);
    ck_assert_ptr_nonnull(strstr(err, "is a FIFO, not a regular file"));
    ck_assert_int_eq(mge_data_open(&dr, in, &fd, err, sizeof(err)), MGE_IO);
    ck_assert_ptr_nonnull(strstr(err, "is a directory"));
    /* without roots only the kind is checked */
    ck_assert_int_eq(mge_data_open(NULL, link, &fd, err, sizeof(err)), MGE_OK);
    close(fd);
    mge_data_roots_fini(&dr);
}
END_TEST

static Suite *dataroot_suite(void)
{
    Suite *s = suite_create("dataroot");
    TCase *tc = tcase_create("dataroot");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_dataroot_contain);
    tcase_add_test(tc, test_dataroot_parse_join);
    tcase_add_test(tc, test_dataroot_add_errors);
    tcase_add_test(tc, test_dataroot_open);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return mge_test_run(dataroot_suite()); }
