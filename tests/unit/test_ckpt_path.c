/* test_ckpt_path.c: coordinator/ckpt_path (which checkpoint paths are stored and served), on
 * real files in a temporary directory: symlinks, hard links, a FIFO, swapped directories. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coordinator/ckpt_path.h"
#include "tests/unit/support/check_run.h"

static char g_dir[] = "/tmp/mge-test-ckpt-path.XXXXXX";
static char g_rank[512], g_file[600];
static char why[300];

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static void setup(void)
{
    char p[600];
    strcpy(g_dir, "/tmp/mge-test-ckpt-path.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    snprintf(p, sizeof(p), "%s/wd", g_dir);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    snprintf(p, sizeof(p), "%s/wd/job-7", g_dir);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    snprintf(p, sizeof(p), "%s/wd/job-7/attempt-2", g_dir);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    snprintf(g_rank, sizeof(g_rank), "%s/wd/job-7/attempt-2/rank-1", g_dir);
    ck_assert_int_eq(mkdir(g_rank, 0700), 0);
    snprintf(g_file, sizeof(g_file), "%s/ckpt-000010.mgeckpt", g_rank);
    put(g_file, "ckpt");
    snprintf(p, sizeof(p), "%s/secret", g_dir);
    put(p, "secret");
}

static void teardown(void)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    ck_assert_int_eq(system(cmd), 0);
}

static bool ok(const char *name, const char *path)
{
    return mge_ckpt_path_ok(7, 2, 1, name, path, why, sizeof(why));
}

START_TEST(test_real_checkpoint)
{
    int fd;
    ck_assert_msg(ok("ckpt-000010.mgeckpt", g_file), "%s", why);
    fd = mge_ckpt_path_open(7, g_file);
    ck_assert_int_ge(fd, 0);
    close(fd);
    /* on a worker this host cannot see: believed by its name and place alone */
    ck_assert_msg(
        ok("ckpt-000010.mgeckpt", "/elsewhere/wd/job-7/attempt-2/rank-1/ckpt-000010.mgeckpt"), "%s",
        why);
}
END_TEST

START_TEST(test_lexical_refusals)
{
    char p[800];
    ck_assert(!ok("ckpt-000010.mgeckpt", "/etc/shadow"));
    ck_assert(!ok("shadow", "/etc/shadow"));
    ck_assert(!ok("ckpt-1.mgeckpt", "/wd/job-7/attempt-2/rank-1/../../../../etc/ckpt-1.mgeckpt"));
    ck_assert(!ok("ckpt-1.mgeckpt", "/wd/job-7/attempt-2/rank-1/./ckpt-1.mgeckpt"));
    ck_assert(!ok("ckpt-1.mgeckpt", "/wd/job-7/attempt-2//rank-1/ckpt-1.mgeckpt"));
    ck_assert(!ok("ckpt-1.mgeckpt", "wd/job-7/attempt-2/rank-1/ckpt-1.mgeckpt"));
    ck_assert(!ok("ckpt-1.mgeckpt", "/job-7/attempt-2/rank-1/ckpt-1.mgeckpt"));
    ck_assert(!ok("ckpt-1.mgeckpt", "/wd/job-8/attempt-2/rank-1/ckpt-1.mgeckpt"));  /* job */
    ck_assert(!ok("ckpt-1.mgeckpt", "/wd/job-07/attempt-2/rank-1/ckpt-1.mgeckpt")); /* job */
    ck_assert(!ok("ckpt-1.mgeckpt", "/wd/job-7/attempt-1/rank-1/ckpt-1.mgeckpt"));  /* attempt */
    ck_assert(!ok("ckpt-1.mgeckpt", "/wd/job-7/attempt-2/rank-0/ckpt-1.mgeckpt"));  /* rank */
    ck_assert(!ok("ckpt-1.mgeckpt", "/wd/job-7/attempt-2/rank-1/ckpt-2.mgeckpt"));  /* name */
    ck_assert(!ok("latest.mgeckpt", "/wd/job-7/attempt-2/rank-1/latest.mgeckpt"));
    ck_assert(!ok("ckpt-.mgeckpt", "/wd/job-7/attempt-2/rank-1/ckpt-.mgeckpt"));
    ck_assert(!ok("ckpt-1.mgeckpt.tmp", "/wd/job-7/attempt-2/rank-1/ckpt-1.mgeckpt.tmp"));
    ck_assert(!ok("ckpt-1.mgeckpt", "/wd/job-7/attempt-2/rank-1/ckpt-1.mgeckpt/"));
    ck_assert(!ok("ckpt-1.mgeckpt", ""));
    snprintf(p, sizeof(p), "%s/secret", g_dir);
    ck_assert(!ok("ckpt-1.mgeckpt", p));
    errno = 0;
    ck_assert_int_eq(mge_ckpt_path_open(7, "/etc/shadow"), -1);
    ck_assert_int_eq(errno, EINVAL);
}
END_TEST

START_TEST(test_links_and_special_files)
{
    char p[700], secret[600];
    snprintf(secret, sizeof(secret), "%s/secret", g_dir);
    snprintf(p, sizeof(p), "%s/ckpt-000011.mgeckpt", g_rank);
    ck_assert_int_eq(symlink(secret, p), 0);
    ck_assert(!ok("ckpt-000011.mgeckpt", p));
    ck_assert_ptr_nonnull(strstr(why, "symbolic link"));
    ck_assert_int_eq(mge_ckpt_path_open(7, p), -1);
    ck_assert_int_eq(errno, ELOOP);
    snprintf(p, sizeof(p), "%s/ckpt-000012.mgeckpt", g_rank);
    ck_assert_int_eq(link(secret, p), 0);
    ck_assert(!ok("ckpt-000012.mgeckpt", p));
    ck_assert_int_eq(mge_ckpt_path_open(7, p), -1);
    ck_assert_int_eq(errno, EINVAL);
    snprintf(p, sizeof(p), "%s/ckpt-000013.mgeckpt", g_rank);
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    ck_assert(!ok("ckpt-000013.mgeckpt", p)); /* and opening it did not block */
    snprintf(p, sizeof(p), "%s/ckpt-000014.mgeckpt", g_rank);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    ck_assert(!ok("ckpt-000014.mgeckpt", p));
}
END_TEST

START_TEST(test_swapped_directory)
{
    /* the rank dir swapped for a symlink to a look-alike tree outside the work dir */
    char outside[700], moved[700], f[800];
    snprintf(outside, sizeof(outside), "%s/out", g_dir);
    ck_assert_int_eq(mkdir(outside, 0700), 0);
    snprintf(f, sizeof(f), "%s/ckpt-000010.mgeckpt", outside);
    put(f, "elsewhere");
    snprintf(moved, sizeof(moved), "%s.moved", g_rank);
    ck_assert_int_eq(rename(g_rank, moved), 0);
    ck_assert_int_eq(symlink(outside, g_rank), 0);
    ck_assert(!ok("ckpt-000010.mgeckpt", g_file));
    ck_assert_int_eq(mge_ckpt_path_open(7, g_file), -1);
    ck_assert_int_eq(errno, ELOOP);
}
END_TEST

START_TEST(test_symlinked_work_dir)
{
    /* the work dir itself is the operator's: a symlink to it is fine */
    char wd_link[700], p[900];
    int fd;
    snprintf(wd_link, sizeof(wd_link), "%s/wd-link", g_dir);
    snprintf(p, sizeof(p), "%s/wd", g_dir);
    ck_assert_int_eq(symlink(p, wd_link), 0);
    snprintf(p, sizeof(p), "%s/job-7/attempt-2/rank-1/ckpt-000010.mgeckpt", wd_link);
    ck_assert_msg(ok("ckpt-000010.mgeckpt", p), "%s", why);
    fd = mge_ckpt_path_open(7, p);
    ck_assert_int_ge(fd, 0);
    close(fd);
}
END_TEST

static Suite *ckpt_path_suite(void)
{
    Suite *s = suite_create("ckpt_path");
    TCase *tc = tcase_create("ckpt_path");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_real_checkpoint);
    tcase_add_test(tc, test_lexical_refusals);
    tcase_add_test(tc, test_links_and_special_files);
    tcase_add_test(tc, test_swapped_directory);
    tcase_add_test(tc, test_symlinked_work_dir);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return mge_test_run(ckpt_path_suite()); }
