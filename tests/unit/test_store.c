/*
 * test_store.c: Check suite for coordinator/store.c on real SQLite files in a temporary
 * directory: reads that fail part-way (a page of the jobs table overwritten under an open
 * store) return the error, never a shorter list; a damaged file and a WAL deleted after an
 * unclean stop are refused at open, a crash that keeps its WAL is not; --restore-from's
 * mge_store_restore() puts a backup in place without handing ids out twice; the events hook
 * is called after each commit that adds events; a version-3 database (before incarnations)
 * is migrated with its jobs.
 */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "coordinator/store.h"
#include "tests/unit/support/check_run.h"
#include "tests/unit/support/scratch_dir.h"

#define PAGE 4096 /* SQLite's default page size, the one the store uses */

static char g_dir[64];

static void dir_setup(void)
{
    mge_log_set_level(MGE_LOG_OFF);
    snprintf(g_dir, sizeof(g_dir), "/tmp/mge-test-store.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void dir_teardown(void) { mge_test_scratch_remove(g_dir); }

static void path_in(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", g_dir, name);
}

/* Insert job "job-NNNNN-marker" with @pad bytes of YAML comment (to fill pages); its id. */
static int64_t job_add(struct mge_store *st, int i, int pad)
{
    char *yaml = malloc((size_t)pad + 512), name[32];
    struct mge_jobspec *spec = NULL;
    struct mge_spec_error err;
    int64_t id = 0;
    int n;
    ck_assert_ptr_nonnull(yaml);
    snprintf(name, sizeof(name), "job-%05d-marker", i);
    n = snprintf(yaml, 512,
                 "name: %s\n"
                 "model: {type: mlp, hidden: [32]}\n"
                 "data: {format: synthetic, train_size: 512, test_size: 0, input_dim: 784,"
                 " classes: 10}\n"
                 "train: {steps: 20, batch_size: 32, optimizer: {type: sgd, lr: 0.05}}\n# ",
                 name);
    memset(yaml + n, 'x', (size_t)pad);
    yaml[n + pad] = '\n';
    yaml[n + pad + 1] = '\0';
    memset(&err, 0, sizeof(err));
    ck_assert_int_eq(mge_jobspec_parse("t.yaml", yaml, strlen(yaml), NULL, 0, &spec, &err), MGE_OK);
    ck_assert_int_eq(mge_store_job_insert(st, spec, "{}", 20, &id), MGE_OK);
    mge_jobspec_free(spec);
    free(yaml);
    return id;
}

/* Offset of the first occurrence of @needle in file @path, or -1. */
static long file_find(const char *path, const char *needle)
{
    FILE *f = fopen(path, "rb");
    size_t n = strlen(needle), len;
    long off = -1, size;
    char *buf;
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    size = ftell(f);
    ck_assert_int_gt(size, 0);
    rewind(f);
    buf = malloc((size_t)size);
    ck_assert_ptr_nonnull(buf);
    len = fread(buf, 1, (size_t)size, f);
    fclose(f);
    for (size_t i = 0; off < 0 && i + n <= len; i++)
        if (buf[i] == needle[0] && !memcmp(buf + i, needle, n))
            off = (long)i;
    free(buf);
    return off;
}

/* Overwrite the page of @path that holds @off with bytes that are no b-tree page. */
static void page_smash(const char *path, long off)
{
    char junk[PAGE];
    int fd = open(path, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    memset(junk, 0x55, sizeof(junk));
    ck_assert_int_eq(pwrite(fd, junk, sizeof(junk), off / PAGE * PAGE), PAGE);
    close(fd);
}

/*
 * Commit a write through another connection, as another SQLite program would: the store's
 * connection sees the database changed and reads its pages from the file again (its page
 * cache would otherwise still hold the page smashed under it).
 */
static void other_writer(const char *db)
{
    sqlite3 *o = NULL;
    ck_assert_int_eq(sqlite3_open_v2(db, &o, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    ck_assert_int_eq(
        sqlite3_exec(o, "INSERT INTO meta(key, value) VALUES('test', 'x')", NULL, NULL, NULL),
        SQLITE_OK);
    ck_assert_int_eq(sqlite3_close(o), SQLITE_OK);
}

START_TEST(test_store_reads_fail_part_way)
{
    enum { JOBS = 1000, PAD = 1500, VICTIM = 100 };
    struct mge_store *st = NULL;
    struct mge_job_row *rows = (void *)1, row;
    json_t *out = (void *)1;
    int64_t next = -1;
    char db[128];
    long off;
    int n = -1;

    path_in(db, sizeof(db), "mge.db");
    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_OK);
    for (int i = 1; i <= JOBS; i++)
        ck_assert_int_eq(job_add(st, i, PAD), i);
    mge_store_close(st); /* everything in the main file */
    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_OK);
    ck_assert_int_eq(mge_store_job_list(st, -1, 0, 10, &out, &next), MGE_OK);
    ck_assert_int_eq(json_array_size(out), 10);
    json_decref(out);
    off = file_find(db, "job-00100-marker");
    ck_assert_int_gt(off, 0);
    page_smash(db, off);
    other_writer(db);

    /* a page list from id 399 down reaches job 100's page after ~300 good rows */
    out = (void *)1;
    ck_assert_int_eq(mge_store_job_list(st, -1, 400, 1000, &out, &next), MGE_CORRUPT);
    ck_assert_ptr_null(out);
    ck_assert_int_eq(next, 0);
    /* the scheduler's queue: every job is queued; in id order job 100 comes early */
    ck_assert_int_eq(mge_store_jobs_queued(st, JOBS, &rows, &n), MGE_CORRUPT);
    ck_assert_ptr_null(rows);
    ck_assert_int_eq(n, 0);
    /* one row: an error, not "no such job" */
    ck_assert_int_eq(mge_store_job_get(st, VICTIM, &out), MGE_CORRUPT);
    ck_assert_ptr_null(out);
    ck_assert_int_eq(mge_store_job_row(st, VICTIM, &row), MGE_CORRUPT);
    /* the rest of the store still answers */
    ck_assert_int_eq(mge_store_job_row(st, JOBS, &row), MGE_OK);
    ck_assert_int_eq(row.id, JOBS);
    ck_assert_int_eq(mge_store_job_get(st, JOBS + 1, &out), MGE_NOENT);
    mge_store_close(st);
}
END_TEST

START_TEST(test_store_refuses_corrupt_file_and_restores)
{
    struct mge_store *st = NULL;
    struct mge_job_row row;
    char db[128], backup[128], cmd[400];
    struct stat sb;
    DIR *d;
    struct dirent *de;
    int replaced = 0;

    path_in(db, sizeof(db), "mge.db");
    path_in(backup, sizeof(backup), "backup.db");
    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_OK);
    for (int i = 1; i <= 20; i++)
        job_add(st, i, 1500);
    mge_store_close(st);
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", db, backup); /* closed: a plain copy is whole */
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_OK);
    for (int i = 21; i <= 30; i++) /* after the backup: lost by the restore, ids kept */
        job_add(st, i, 1500);
    mge_store_close(st);
    page_smash(db, file_find(db, "job-00005-marker"));

    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_CORRUPT);
    ck_assert_ptr_null(st);
    ck_assert_int_eq(mge_store_restore(g_dir, "/nonexistent/backup.db"), MGE_IO);
    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_CORRUPT); /* untouched */
    ck_assert_int_eq(mge_store_restore(g_dir, backup), MGE_OK);
    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_OK);
    ck_assert_int_eq(mge_store_job_row(st, 5, &row), MGE_OK);
    ck_assert_int_eq(mge_store_job_row(st, 25, &row), MGE_NOENT);
    ck_assert_int_eq(job_add(st, 31, 10), 31); /* not 21: the damaged file had issued 30 */
    mge_store_close(st);
    d = opendir(g_dir);
    while (d && (de = readdir(d))) /* the file, and its WAL if it had one */
        replaced += !strncmp(de->d_name, "mge.db.replaced-", 16) && !strstr(de->d_name, "-wal");
    closedir(d);
    ck_assert_int_eq(replaced, 1);
    ck_assert_int_eq(stat(backup, &sb), 0); /* the backup itself is left alone */
}
END_TEST

/* A child that opens the store, adds @jobs jobs and dies without closing it (a kill -9). */
static void crash_with_jobs(int jobs)
{
    pid_t pid = fork();
    int status;
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct mge_store *st;
        if (mge_store_open(g_dir, &st) != MGE_OK)
            _exit(1);
        for (int i = 0; i < jobs; i++)
            job_add(st, 100 + i, 10);
        _exit(0);
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

START_TEST(test_store_crash_keeps_wal_deleted_wal_refused)
{
    struct mge_store *st = NULL;
    struct mge_job_row row;
    char wal[128], shm[128];

    path_in(wal, sizeof(wal), "mge.db-wal");
    path_in(shm, sizeof(shm), "mge.db-shm");
    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_OK);
    job_add(st, 1, 10);
    mge_store_close(st);
    ck_assert_int_ne(access(wal, F_OK), 0); /* a clean close leaves no WAL */

    crash_with_jobs(3); /* jobs 2..4 are committed, in the WAL only */
    ck_assert_int_eq(access(wal, F_OK), 0);
    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_OK); /* a crash is no corruption */
    ck_assert_int_eq(mge_store_job_row(st, 4, &row), MGE_OK);
    mge_store_close(st);

    crash_with_jobs(3); /* jobs 5..7 */
    ck_assert_int_eq(unlink(wal), 0);
    unlink(shm);
    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_CORRUPT);
    ck_assert_ptr_null(st);
    /* still refused on the next try: the refusal changed nothing */
    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_CORRUPT);
}
END_TEST

/* Flip one byte of WAL frame @frame (1-based) of @wal, inside its page. */
static void wal_frame_flip(const char *wal, long frame)
{
    long off = 32 + (frame - 1) * (24 + PAGE) + 24 + 100;
    unsigned char b;
    int fd = open(wal, O_RDWR);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, &b, 1, off), 1);
    b ^= 0xff;
    ck_assert_int_eq(pwrite(fd, &b, 1, off), 1);
    close(fd);
}

START_TEST(test_store_damaged_wal_refused_torn_tail_not)
{
    struct mge_store *st = NULL;
    struct mge_job_row row;
    char wal[128];
    struct stat sb;
    long frames;

    path_in(wal, sizeof(wal), "mge.db-wal");
    crash_with_jobs(6); /* jobs 1..6, committed, in the WAL only */
    ck_assert_int_eq(stat(wal, &sb), 0);
    frames = (sb.st_size - 32) / (24 + PAGE);
    ck_assert_int_ge(frames, 6);
    /* a write torn by the crash: the last frame half there */
    ck_assert_int_eq(truncate(wal, sb.st_size - PAGE / 2), 0);
    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_OK);
    ck_assert_int_eq(mge_store_job_row(st, 5, &row), MGE_OK); /* job 6's commit was torn */
    ck_assert_int_eq(mge_store_job_row(st, 6, &row), MGE_NOENT);
    mge_store_close(st);

    crash_with_jobs(6); /* jobs 6..11 */
    ck_assert_int_eq(stat(wal, &sb), 0);
    frames = (sb.st_size - 32) / (24 + PAGE);
    wal_frame_flip(wal, frames); /* the last frame bad: as torn, SQLite drops that commit */
    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_OK);
    ck_assert_int_eq(mge_store_job_row(st, 10, &row), MGE_OK);
    ck_assert_int_eq(mge_store_job_row(st, 11, &row), MGE_NOENT);
    mge_store_close(st);

    crash_with_jobs(6);     /* jobs 11..16 */
    wal_frame_flip(wal, 2); /* bit rot in the middle: every later commit would be dropped */
    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_CORRUPT);
    ck_assert_ptr_null(st);
}
END_TEST

static int64_t g_hook_jobs[16];
static int g_hook_calls;

static void hook(void *arg, int64_t job_id)
{
    ck_assert_ptr_eq(arg, &g_hook_calls);
    if (g_hook_calls < 16)
        g_hook_jobs[g_hook_calls] = job_id;
    g_hook_calls++;
}

START_TEST(test_store_events_hook)
{
    struct mge_store *st = NULL;
    struct mge_store_line lines[3] = {
        {.job_id = 1, .attempt = 1, .rank = 0, .seq = 1, .stream = 0, .text = "a"},
        {.job_id = 1, .attempt = 1, .rank = 0, .seq = 2, .stream = 0, .text = "b"},
        {.job_id = 2, .attempt = 1, .rank = 0, .seq = 1, .stream = 0, .text = "c"},
    };
    bool changed;
    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_OK);
    mge_store_on_events(st, hook, &g_hook_calls);
    ck_assert_int_eq(job_add(st, 1, 10), 1);
    ck_assert_int_eq(job_add(st, 2, 10), 2);
    ck_assert_int_eq(g_hook_calls, 2);
    ck_assert_int_eq(g_hook_jobs[1], 2);
    for (int64_t j = 1; j <= 2; j++) { /* rank 0 of attempt 1 on worker w-1: running */
        struct mge_placement pl = {.job_id = j, .attempt = 1, .rank = 0, .worker_id = "w-1"};
        ck_assert_int_eq(mge_store_job_place(st, j, 1, &pl, 1), MGE_OK);
    }
    ck_assert_int_eq(g_hook_calls, 4);
    ck_assert_int_eq(mge_store_lines_ingest(st, "w-1", lines, 3), MGE_OK);
    ck_assert_int_eq(g_hook_calls, 6); /* once per job of the batch */
    ck_assert_int_eq(g_hook_jobs[4], 1);
    ck_assert_int_eq(g_hook_jobs[5], 2);
    ck_assert_int_eq(mge_store_job_set_state(st, 2, 0, MGE_JOB_CANCELLED, "x", &changed), MGE_OK);
    ck_assert(changed);
    ck_assert_int_eq(g_hook_calls, 7);
    ck_assert_int_eq(mge_store_job_set_state(st, 2, 0, MGE_JOB_CANCELLED, "x", &changed), MGE_OK);
    ck_assert(!changed);
    ck_assert_int_eq(g_hook_calls, 7); /* nothing appended, nobody woken */
    mge_store_on_events(st, NULL, NULL);
    job_add(st, 3, 10);
    ck_assert_int_eq(g_hook_calls, 7);
    mge_store_close(st);
}
END_TEST

/* What migration 7 added (GPU workers), as SQL that removes it. */
#define UNDO_MIGRATION_7                                                                           \
    " ALTER TABLE workers DROP COLUMN gpu_list; ALTER TABLE placements DROP COLUMN gpu_ids;"       \
    " ALTER TABLE jobs DROP COLUMN gpu_memory_mb;"

/* Run @sql on the closed store's mge.db directly (to make it an older schema). */
static void db_exec(const char *sql)
{
    char db[128];
    sqlite3 *o = NULL;
    path_in(db, sizeof(db), "mge.db");
    ck_assert_int_eq(sqlite3_open_v2(db, &o, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_exec(o, sql, NULL, NULL, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_close(o), SQLITE_OK);
}

/* A database of schema version 3 (no incarnations, no restarts column), made by undoing
 * migrations 4 to 7 on a store with a running job, opens at version 4: the job is kept, it has no
 * incarnation rows and no restarts, and requeueing and placing it write them. */
START_TEST(test_store_migrates_v3)
{
    struct mge_store *st = NULL;
    struct mge_placement pl = {.rank = 0, .worker_id = "w-1"};
    json_t *j = NULL, *inc;
    bool requeued = false;
    int64_t id;
    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_OK);
    id = job_add(st, 1, 0);
    pl.job_id = id;
    pl.attempt = 1;
    ck_assert_int_eq(mge_store_job_place(st, id, 1, &pl, 1), MGE_OK);
    mge_store_close(st);
    db_exec("DROP TABLE incarnations; ALTER TABLE jobs DROP COLUMN restarts;"
            " ALTER TABLE checkpoints DROP COLUMN copy; ALTER TABLE jobs DROP COLUMN "
            "plan;" UNDO_MIGRATION_7 " PRAGMA user_version=3;");

    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_OK);
    ck_assert_int_eq(mge_store_job_get(st, id, &j), MGE_OK);
    ck_assert_str_eq(json_string_value(json_object_get(j, "state")), "running");
    ck_assert_int_eq(json_integer_value(json_object_get(j, "restarts")), 0);
    ck_assert_uint_eq(json_array_size(json_object_get(j, "incarnations")), 0);
    json_decref(j);
    ck_assert_int_eq(mge_store_job_requeue(st, id, 1, "worker lost: w1", false, &requeued), MGE_OK);
    ck_assert(requeued);
    pl.attempt = 2;
    ck_assert_int_eq(mge_store_job_place(st, id, 2, &pl, 1), MGE_OK);
    ck_assert_int_eq(mge_store_job_get(st, id, &j), MGE_OK);
    ck_assert_uint_eq(json_array_size(json_object_get(j, "incarnations")), 1);
    inc = json_array_get(json_object_get(j, "incarnations"), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(inc, "incarnation")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(inc, "world")), 1);
    ck_assert(json_is_null(json_object_get(inc, "ended")));
    json_decref(j);
    mge_store_close(st);
}
END_TEST

/* GPU workers: a database of schema version 6 (no GPU columns) opens at version 7 with its
 * placements holding no GPU; then a worker's GPUs (names with spaces) and a rank's GPU indexes
 * are kept, read back by a restarted coordinator and shown in the job's placement. */
START_TEST(test_store_gpus)
{
    struct mge_store *st = NULL;
    struct mge_worker_row w, *rows = NULL;
    struct mge_placement pl = {.rank = 0}, *act = NULL;
    json_t *j = NULL, *p;
    bool requeued = false;
    int64_t id;
    int n = 0;
    memset(&w, 0, sizeof(w));
    snprintf(w.name, sizeof(w.name), "g1");
    snprintf(w.device, sizeof(w.device), "cpu");
    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_OK);
    ck_assert_int_eq(mge_store_worker_upsert(st, &w), MGE_OK);
    id = job_add(st, 1, 0);
    pl.job_id = id;
    pl.attempt = 1;
    snprintf(pl.worker_id, sizeof(pl.worker_id), "%s", w.id);
    ck_assert_int_eq(mge_store_job_place(st, id, 1, &pl, 1), MGE_OK);
    mge_store_close(st);
    db_exec(UNDO_MIGRATION_7 " PRAGMA user_version=6;");

    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_OK);
    ck_assert_int_eq(mge_store_placements_active(st, &act, &n), MGE_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_uint_eq(act[0].gpu_mask, 0);
    mge_free(act);
    /* the worker registers again, with two GPUs; the job's next attempt holds GPU 1 */
    w.gpus = 2;
    snprintf(w.device, sizeof(w.device), "gpu");
    snprintf(w.gpu[0].name, sizeof(w.gpu[0].name), "NVIDIA A100-SXM4-80GB");
    w.gpu[0].memory_mb = 81920;
    snprintf(w.gpu[1].name, sizeof(w.gpu[1].name), "NVIDIA T4");
    w.gpu[1].memory_mb = 15360;
    ck_assert_int_eq(mge_store_worker_upsert(st, &w), MGE_OK);
    ck_assert_int_eq(mge_store_job_requeue(st, id, 1, "worker lost: g1", false, &requeued), MGE_OK);
    pl.attempt = 2;
    pl.gpu_mask = 0x2;
    ck_assert_int_eq(mge_store_job_place(st, id, 2, &pl, 1), MGE_OK);
    mge_store_close(st);

    ck_assert_int_eq(mge_store_open(g_dir, &st), MGE_OK);
    ck_assert_int_eq(mge_store_workers_load(st, &rows, &n), MGE_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(rows[0].gpus, 2);
    ck_assert_str_eq(rows[0].gpu[0].name, "NVIDIA A100-SXM4-80GB");
    ck_assert_int_eq(rows[0].gpu[0].memory_mb, 81920);
    ck_assert_str_eq(rows[0].gpu[1].name, "NVIDIA T4");
    ck_assert_int_eq(rows[0].gpu[1].memory_mb, 15360);
    mge_free(rows);
    /* attempt 1's rank, not known to have ended, is superseded; attempt 2's holds GPU 1 */
    ck_assert_int_eq(mge_store_placements_active(st, &act, &n), MGE_OK);
    ck_assert_int_eq(n, 2);
    for (int i = 0; i < n; i++)
        ck_assert_uint_eq(act[i].gpu_mask, act[i].attempt == 2 ? 0x2 : 0);
    mge_free(act);
    ck_assert_int_eq(mge_store_job_get(st, id, &j), MGE_OK);
    p = json_array_get(json_object_get(j, "placement"), 0);
    ck_assert_uint_eq(json_array_size(json_object_get(p, "gpus")), 1);
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(p, "gpus"), 0)), 1);
    json_decref(j);
    mge_store_close(st);
}
END_TEST

static Suite *store_suite(void)
{
    Suite *s = suite_create("store");
    TCase *tc = tcase_create("faults");
    tcase_add_checked_fixture(tc, dir_setup, dir_teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_store_reads_fail_part_way);
    tcase_add_test(tc, test_store_refuses_corrupt_file_and_restores);
    tcase_add_test(tc, test_store_crash_keeps_wal_deleted_wal_refused);
    tcase_add_test(tc, test_store_damaged_wal_refused_torn_tail_not);
    suite_add_tcase(s, tc);
    tc = tcase_create("events");
    tcase_add_checked_fixture(tc, dir_setup, dir_teardown);
    tcase_add_test(tc, test_store_events_hook);
    suite_add_tcase(s, tc);
    tc = tcase_create("migrate");
    tcase_add_checked_fixture(tc, dir_setup, dir_teardown);
    tcase_add_test(tc, test_store_migrates_v3);
    tcase_add_test(tc, test_store_gpus);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return mge_test_run(store_suite()); }
