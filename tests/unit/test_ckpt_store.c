/*
 * test_ckpt_store.c: Check suite for coordinator/ckpt_store.c on a real SQLite store and real
 * checkpoint files in a temporary directory: an upload in chunks from the current attempt's
 * rank 0 worker is verified and committed, and fetched back byte for byte; uploads from
 * another worker or for another attempt, with a bad name, a size over the limit, corrupt bytes
 * or a step other than the name's are refused and leave nothing behind; a chunk at the wrong
 * offset is answered with the right one; only the newest copies are kept.
 */
#include <check.h>
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "coordinator/ckpt_store.h"
#include "coordinator/store.h"
#include "engine/ckpt.h"
#include "tests/unit/support/check_run.h"
#include "tests/unit/support/scratch_dir.h"

static char g_dir[64], g_store[128];
static struct mge_store *g_st;
static int64_t g_job;

static void setup(void)
{
    struct mge_jobspec *spec = NULL;
    struct mge_spec_error err;
    struct mge_placement pl = {.rank = 0, .worker_id = "w-1"};
    const char *yaml = "name: j\nmodel: {type: mlp, hidden: [8]}\n"
                       "data: {format: synthetic, train_size: 64, test_size: 0, input_dim: 4,"
                       " classes: 2}\ntrain: {steps: 20, batch_size: 8, optimizer: {type: sgd,"
                       " lr: 0.05}}\n";
    mge_log_set_level(MGE_LOG_OFF);
    snprintf(g_dir, sizeof(g_dir), "/tmp/mge-test-ckpt-store.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    snprintf(g_store, sizeof(g_store), "%s/checkpoints", g_dir);
    ck_assert_int_eq(mge_store_open(g_dir, &g_st), MGE_OK);
    memset(&err, 0, sizeof(err));
    ck_assert_int_eq(mge_jobspec_parse("t.yaml", yaml, strlen(yaml), NULL, 0, &spec, &err), MGE_OK);
    ck_assert_int_eq(mge_store_job_insert(g_st, spec, "{}", 20, &g_job), MGE_OK);
    mge_jobspec_free(spec);
    pl.job_id = g_job;
    pl.attempt = 1;
    ck_assert_int_eq(mge_store_job_place(g_st, g_job, 1, &pl, 1), MGE_OK);
}

static void teardown(void)
{
    mge_store_close(g_st);
    mge_test_scratch_remove(g_dir);
}

/* A checkpoint file of step @step with @n floats, written to @path; its bytes (malloc'ed). */
static uint8_t *ckpt_file(const char *path, int64_t step, size_t n, size_t *len)
{
    float *w = malloc(n * sizeof(float));
    struct mge_ckpt_tensor t = {"w", MGE_CKPT_F32, 1, {(int64_t)n}, w, n * sizeof(float)};
    struct mge_ckpt ck = {.step = step, .tensors = &t, .n_tensors = 1, .n_rng = 1};
    char err[256];
    FILE *f;
    uint8_t *buf;
    for (size_t i = 0; i < n; i++)
        w[i] = (float)i * 0.5f + (float)step;
    ck_assert_int_eq(mge_ckpt_write(path, &ck, err, sizeof(err)), MGE_OK);
    free(w);
    f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc(*len);
    ck_assert_uint_eq(fread(buf, 1, *len, f), *len);
    fclose(f);
    return buf;
}

/* Upload @buf as @name of attempt @attempt from @worker in chunks of @chunk; the result of the
 * chunk that ended it (an error, or MGE_OK with *@committed). */
static int upload(struct mge_ckpt_upload *u, const char *worker, int attempt, const char *name,
                  const uint8_t *buf, size_t len, uint64_t size, size_t chunk, bool *committed)
{
    char why[512];
    uint64_t off = 0, next;
    int rc;
    *committed = false;
    for (int i = 0; i < 1000; i++) {
        size_t n = len - off > chunk ? chunk : len - off;
        struct mge_ckpt_chunk c = {g_job, attempt, name, off, size, buf + off, n};
        rc =
            mge_ckpt_upload_chunk(u, g_st, g_store, worker, &c, &next, committed, why, sizeof(why));
        if (rc != MGE_OK || *committed)
            return rc;
        if (next == off)
            return MGE_STATE;
        off = next;
    }
    return MGE_STATE;
}

/* Files below the store whose names contain @part. */
static int store_files(const char *part)
{
    char cmd[256], line[64];
    FILE *p;
    snprintf(cmd, sizeof(cmd), "find '%s' -type f -name '*%s*' 2>/dev/null | wc -l", g_store, part);
    p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_nonnull(fgets(line, sizeof(line), p));
    pclose(p);
    return atoi(line);
}

START_TEST(test_upload_commit_fetch)
{
    struct mge_ckpt_upload u = {0};
    char src[128], why[256], *name = NULL;
    size_t len, got;
    uint64_t size;
    bool committed;
    snprintf(src, sizeof(src), "%s/src.mgeckpt", g_dir);
    /* 3 MiB of floats: more than two chunks */
    uint8_t *buf = ckpt_file(src, 20, 3 << 18, &len), *back = malloc(len);
    ck_assert_int_eq(mge_store_checkpoint_copy_latest(g_st, g_job, &name), MGE_NOENT);
    ck_assert_int_eq(
        upload(&u, "w-1", 1, "ckpt-000020.mgeckpt", buf, len, len, MGE_CKPT_CHUNK_MAX, &committed),
        MGE_OK);
    ck_assert(committed);
    ck_assert_int_eq(mge_store_checkpoint_copy_latest(g_st, g_job, &name), MGE_OK);
    ck_assert_str_eq(name, "ckpt-000020.mgeckpt");
    mge_free(name);
    ck_assert_int_eq(store_files(".part"), 0);
    /* fetched back in chunks by the rank 0 worker, byte for byte */
    uint8_t *chunk = malloc(MGE_CKPT_CHUNK_MAX);
    for (size_t off = 0; off < len; off += got) {
        ck_assert_int_eq(mge_ckpt_fetch_chunk(g_st, "w-1", g_job, 1, "ckpt-000020.mgeckpt", off,
                                              chunk, &got, &size, why, sizeof(why)),
                         MGE_OK);
        ck_assert_uint_eq(size, len);
        ck_assert_uint_gt(got, 0);
        memcpy(back + off, chunk, got);
    }
    ck_assert_mem_eq(buf, back, len);
    /* the incarnation starts where the fetched copy does */
    json_t *j = NULL;
    ck_assert_int_eq(mge_store_job_get(g_st, g_job, &j), MGE_OK);
    json_t *inc = json_array_get(json_object_get(j, "incarnations"), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(inc, "start_step")), 20);
    json_decref(j);
    ck_assert_int_eq(mge_ckpt_fetch_chunk(g_st, "w-2", g_job, 1, "ckpt-000020.mgeckpt", 0, chunk,
                                          &got, &size, why, sizeof(why)),
                     MGE_AUTH);
    ck_assert_int_eq(mge_ckpt_fetch_chunk(g_st, "w-1", g_job, 1, "ckpt-000040.mgeckpt", 0, chunk,
                                          &got, &size, why, sizeof(why)),
                     MGE_NOENT);
    ck_assert_int_eq(mge_ckpt_fetch_chunk(g_st, "w-1", g_job, 1, "../mge.db", 0, chunk, &got, &size,
                                          why, sizeof(why)),
                     MGE_NOENT);
    free(chunk);
    free(back);
    free(buf);
    mge_ckpt_upload_fini(&u);
}
END_TEST

START_TEST(test_upload_refused)
{
    struct mge_ckpt_upload u = {0};
    char src[128], why[256];
    size_t len;
    uint64_t next;
    bool committed;
    snprintf(src, sizeof(src), "%s/src.mgeckpt", g_dir);
    uint8_t *buf = ckpt_file(src, 30, 1000, &len);
    /* not the rank 0 worker, not the current attempt */
    ck_assert_int_eq(upload(&u, "w-2", 1, "ckpt-000030.mgeckpt", buf, len, len, 4096, &committed),
                     MGE_AUTH);
    ck_assert_int_eq(upload(&u, "w-1", 2, "ckpt-000030.mgeckpt", buf, len, len, 4096, &committed),
                     MGE_AUTH);
    /* names */
    ck_assert_int_eq(
        upload(&u, "w-1", 1, "../../x/ckpt-1.mgeckpt", buf, len, len, 4096, &committed), MGE_INVAL);
    ck_assert_int_eq(upload(&u, "w-1", 1, "ckpt-.mgeckpt", buf, len, len, 4096, &committed),
                     MGE_INVAL);
    ck_assert_int_eq(upload(&u, "w-1", 1, "latest.mgeckpt", buf, len, len, 4096, &committed),
                     MGE_INVAL);
    /* sizes: over the limit, under a header, a chunk past the declared size */
    ck_assert_int_eq(upload(&u, "w-1", 1, "ckpt-000030.mgeckpt", buf, len, MGE_CKPT_UPLOAD_MAX + 1,
                            4096, &committed),
                     MGE_INVAL);
    ck_assert_int_eq(upload(&u, "w-1", 1, "ckpt-000030.mgeckpt", buf, len, 10, 4096, &committed),
                     MGE_INVAL);
    ck_assert_int_eq(
        upload(&u, "w-1", 1, "ckpt-000030.mgeckpt", buf, len, len - 1, 4096, &committed),
        MGE_INVAL);
    /* contents: a flipped byte, and a good file of another step than its name */
    buf[len / 2] ^= 0x40;
    ck_assert_int_eq(upload(&u, "w-1", 1, "ckpt-000030.mgeckpt", buf, len, len, 4096, &committed),
                     MGE_CORRUPT);
    buf[len / 2] ^= 0x40;
    ck_assert_int_eq(upload(&u, "w-1", 1, "ckpt-000031.mgeckpt", buf, len, len, 4096, &committed),
                     MGE_CORRUPT);
    ck_assert_int_eq(store_files("ckpt-"), 0);
    ck_assert_int_eq(store_files(".part"), 0);
    /* a chunk at the wrong offset is told where to go on, and the upload then completes */
    struct mge_ckpt_chunk c0 = {g_job, 1, "ckpt-000030.mgeckpt", 0, len, buf, 100};
    struct mge_ckpt_chunk c1 = {g_job, 1, "ckpt-000030.mgeckpt", 50, len, buf + 50, 100};
    ck_assert_int_eq(
        mge_ckpt_upload_chunk(&u, g_st, g_store, "w-1", &c0, &next, &committed, why, sizeof(why)),
        MGE_OK);
    ck_assert_uint_eq(next, 100);
    ck_assert_int_eq(
        mge_ckpt_upload_chunk(&u, g_st, g_store, "w-1", &c1, &next, &committed, why, sizeof(why)),
        MGE_OK);
    ck_assert_uint_eq(next, 100);
    ck_assert(!committed);
    struct mge_ckpt_chunk c2 = {g_job, 1, "ckpt-000030.mgeckpt", 100, len, buf + 100, len - 100};
    ck_assert_int_eq(
        mge_ckpt_upload_chunk(&u, g_st, g_store, "w-1", &c2, &next, &committed, why, sizeof(why)),
        MGE_OK);
    ck_assert(committed);
    ck_assert_int_eq(store_files("ckpt-000030"), 1);
    free(buf);
    mge_ckpt_upload_fini(&u);
}
END_TEST

START_TEST(test_copies_pruned)
{
    struct mge_ckpt_upload u = {0};
    char src[128], name[32], *latest = NULL;
    size_t len;
    bool committed;
    snprintf(src, sizeof(src), "%s/src.mgeckpt", g_dir);
    for (int step = 10; step <= 40; step += 10) {
        uint8_t *buf = ckpt_file(src, step, 100, &len);
        snprintf(name, sizeof(name), "ckpt-%06d.mgeckpt", step);
        ck_assert_int_eq(upload(&u, "w-1", 1, name, buf, len, len, 4096, &committed), MGE_OK);
        ck_assert(committed);
        free(buf);
    }
    ck_assert_int_eq(store_files("ckpt-"), MGE_CKPT_COPIES_KEPT);
    ck_assert_int_eq(store_files("ckpt-000040"), 1);
    ck_assert_int_eq(store_files("ckpt-000030"), 1);
    ck_assert_int_eq(mge_store_checkpoint_copy_latest(g_st, g_job, &latest), MGE_OK);
    ck_assert_str_eq(latest, "ckpt-000040.mgeckpt");
    mge_free(latest);
    mge_ckpt_upload_fini(&u);
}
END_TEST

static Suite *ckpt_store_suite(void)
{
    Suite *s = suite_create("ckpt_store");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"upload_commit_fetch", test_upload_commit_fetch},
        {"upload_refused", test_upload_refused},
        {"copies_pruned", test_copies_pruned},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    return mge_test_run(ckpt_store_suite());
}
