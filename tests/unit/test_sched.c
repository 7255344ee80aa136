/*
 * test_sched.c: Check suite for coordinator/sched.c over a real SQLite store in a temporary
 * directory, with the scheduler's clock in the test's hands (no scheduler thread: the test
 * calls mge_sched_tick() after moving the clock). Placement, pending reasons, requeue on a
 * lost worker, fencing of a superseded attempt (its lines, exit and checkpoints from the lost
 * worker dropped; a returning worker told to cancel), the step-progress watchdog, the
 * naming of the rank that broke a gang, and elastic jobs (shrink on a lost worker, waiting
 * below min, infrastructure restarts not charged, the watchdog's re-form, a drain's re-form,
 * incarnation rows, growing at a checkpoint when a worker joins, a restart of the scheduler
 * right after a membership change), and preemption (a checkpoint asked for first, its
 * deadline, the switch that turns the asking off).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "coordinator/sched.h"
#include "coordinator/store.h"
#include "tests/unit/support/check_run.h"

static char g_dir[64];
static struct mge_store *g_st;
static struct mge_sched *g_s;
static int64_t g_now; /* the scheduler's clock, ms */
static bool g_no_grow; /* sched_start: mge-coordinator --grow 0 */
static int g_preempt_ms; /* sched_start: opts.preempt_ckpt_ms (0: the default, 30 s) */

static int64_t fake_now(void *arg)
{
    (void)arg;
    return g_now;
}

/* Start the scheduler over the test's store (again, for a restart). */
static void sched_start(void)
{
    struct mge_sched_opts o = {0};
    o.worker_timeout_ms = 3000;
    o.cancel_grace_ms = 1000;
    o.progress_timeout_ms = 10000;
    o.startup_timeout_ms = 60000;
    o.now_ms = fake_now;
    o.no_thread = true;
    o.no_grow = g_no_grow;
    o.preempt_ckpt_ms = g_preempt_ms;
    ck_assert_int_eq(mge_sched_new(g_st, &o, &g_s), MGE_OK);
}

static void setup(void)
{
    snprintf(g_dir, sizeof(g_dir), "/tmp/mge-test-sched.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    mge_log_set_level(MGE_LOG_OFF);
    ck_assert_int_eq(mge_store_open(g_dir, &g_st), MGE_OK);
    g_now = 1000000;
    g_no_grow = false;
    g_preempt_ms = 0;
    sched_start();
}

static void teardown(void)
{
    static const char *const files[] = {"mge.db", "mge.db-wal", "mge.db-shm"};
    char path[sizeof(g_dir) + 16];
    mge_sched_free(g_s);
    mge_store_close(g_st);
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", g_dir, files[i]);
        unlink(path);
    }
    ck_assert_int_eq(rmdir(g_dir), 0); /* nothing else was left there */
}

/* A job with the resources @resources ("workers: 2, cpus: 1") and priority @priority, planned at
 * @plan_mb per rank (0: unplanned); its id. */
static int64_t job_add_resources(const char *resources, int priority, int64_t plan_mb)
{
    char yaml[512];
    struct mge_jobspec *spec = NULL;
    struct mge_spec_error err;
    int64_t id = 0;
    snprintf(yaml, sizeof(yaml),
             "name: t\npriority: %d\nmodel: {type: mlp, hidden: [8]}\n"
             "data: {format: synthetic, train_size: 64, input_dim: 4, classes: 2}\n"
             "resources: {%s}\n"
             "train: {steps: 1000, batch_size: 8, optimizer: {lr: 0.1}}\n",
             priority, resources);
    ck_assert_int_eq(mge_jobspec_parse("<test>", yaml, strlen(yaml), NULL, 0, &spec, &err), MGE_OK);
    ck_assert_int_eq(mge_store_job_insert_planned(g_st, spec, "{}", 1000, NULL, plan_mb, &id),
                     MGE_OK);
    mge_jobspec_free(spec);
    return id;
}

/* A job of @workers ("2" or "{min: 2, max: 3}") workers with @cpus CPUs each; its id. */
static int64_t job_add_spec(const char *workers, int cpus, int priority)
{
    char res[128];
    snprintf(res, sizeof(res), "workers: %s, cpus: %d", workers, cpus);
    return job_add_resources(res, priority, 0);
}

static int64_t job_add_workers(const char *workers, int cpus)
{
    return job_add_spec(workers, cpus, 0);
}

/* A 1-worker job of @cpus CPUs and priority @priority. */
static int64_t job_add_priority(int cpus, int priority)
{
    return job_add_spec("1", cpus, priority);
}

static int64_t job_add(int workers, int cpus)
{
    char n[16];
    snprintf(n, sizeof(n), "%d", workers);
    return job_add_workers(n, cpus);
}

/* Register worker @name (2 CPUs; a launch socket when @launch) running @ranks. */
static void worker_add_ranks(const char *name, bool launch, const struct mge_rank_report *ranks,
                             size_t n, char id[40], struct mge_sched_cmds *cmds)
{
    struct mge_worker_info info = {.name = name,
                                   .host = "h",
                                   .version = "t",
                                   .device = "cpu",
                                   .launch_url = launch ? "tcp://127.0.0.1:1" : "",
                                   .cpus = 2,
                                   .memory_mb = 1024};
    ck_assert_int_eq(mge_sched_worker_register(g_s, &info, ranks, n, id, cmds), MGE_OK);
}

static void worker_add(const char *name, bool launch, char id[40])
{
    struct mge_sched_cmds cmds;
    worker_add_ranks(name, launch, NULL, 0, id, &cmds);
    ck_assert_uint_eq(cmds.n_cancel, 0);
    mge_sched_cmds_fini(&cmds);
}

/* What the RPC layer does with a heartbeat: lines to the store, then the scheduler. */
static int beat(const char *wid, const struct mge_rank_report *ranks, size_t n,
                const struct mge_store_line *lines, size_t n_lines, struct mge_sched_cmds *cmds)
{
    ck_assert_int_eq(mge_store_lines_ingest(g_st, wid, lines, n_lines), MGE_OK);
    return mge_sched_worker_heartbeat(g_s, wid, ranks, n, lines, n_lines, cmds);
}

/* A heartbeat whose commands the test does not look at. */
static void beat_quiet(const char *wid, const struct mge_rank_report *ranks, size_t n,
                       const struct mge_store_line *lines, size_t n_lines)
{
    struct mge_sched_cmds cmds;
    ck_assert_int_eq(beat(wid, ranks, n, lines, n_lines, &cmds), MGE_OK);
    mge_sched_cmds_fini(&cmds);
}

static struct mge_job_row job_row(int64_t id)
{
    struct mge_job_row row;
    ck_assert_int_eq(mge_store_job_row(g_st, id, &row), MGE_OK);
    return row;
}

/* The job as the API shows it; caller json_decref()s. */
static json_t *job_json(int64_t id)
{
    json_t *j = NULL;
    ck_assert_int_eq(mge_store_job_get(g_st, id, &j), MGE_OK);
    return j;
}

static const char *job_reason(json_t *j)
{
    return json_string_value(json_object_get(j, "failure_reason"));
}

static bool has_cancel(const struct mge_sched_cmds *c, int64_t job, int attempt)
{
    for (size_t i = 0; i < c->n_cancel; i++)
        if (c->cancel[i].job_id == job && c->cancel[i].attempt == attempt)
            return true;
    return false;
}

static struct mge_store_line line(int64_t job, int attempt, int rank, uint64_t seq, int stream,
                                  const char *text, int64_t time_ms)
{
    struct mge_store_line l = {.job_id = job,
                               .attempt = attempt,
                               .rank = rank,
                               .seq = seq,
                               .stream = stream,
                               .text = text,
                               .time_ms = time_ms};
    return l;
}

static struct mge_rank_report running(int64_t job, int attempt, int rank)
{
    struct mge_rank_report r = {.job_id = job, .attempt = attempt, .rank = rank, .running = true};
    return r;
}

static struct mge_rank_report exited(int64_t job, int attempt, int rank, int code, int sig)
{
    struct mge_rank_report r = {.job_id = job,
                                .attempt = attempt,
                                .rank = rank,
                                .exit_code = code,
                                .term_signal = sig,
                                .failure = ""};
    return r;
}

/* The metric named @name of job @id at @step, or -1 when there is none. */
static double metric_at(int64_t id, const char *name, int64_t step)
{
    json_t *m = NULL, *e;
    size_t i;
    double v = -1;
    ck_assert_int_eq(mge_store_metrics(g_st, id, name, -1, &m), MGE_OK);
    json_array_foreach(json_object_get(m, "metrics"), i, e)
    {
        if (json_integer_value(json_object_get(e, "step")) == step)
            v = json_number_value(json_object_get(e, "value"));
    }
    json_decref(m);
    return v;
}

/*
 * The next heartbeat of @wid brings exactly one Assign: one rank of attempt @attempt of @job,
 * resuming from @resume (NULL: from the start).
 */
static void assert_assigned(const char *wid, int64_t job, int attempt, const char *resume)
{
    struct mge_sched_cmds c;
    ck_assert_int_eq(beat(wid, NULL, 0, NULL, 0, &c), MGE_OK);
    ck_assert_uint_eq(c.n_assign, 1);
    ck_assert_int_eq(c.assign[0].job_id, job);
    ck_assert_int_eq(c.assign[0].attempt, attempt);
    ck_assert_int_eq(c.assign[0].world, 1);
    ck_assert_ptr_nonnull(strstr(c.assign[0].spec_yaml, "mlp"));
    if (resume)
        ck_assert_str_eq(c.assign[0].resume, resume);
    else
        ck_assert_ptr_null(c.assign[0].resume);
    mge_sched_cmds_fini(&c);
}

/* Submit a job (as job_add), run a placement pass; the job is then in state @want. */
static int64_t job_add_tick(int workers, int cpus, int want)
{
    int64_t job = job_add(workers, cpus);
    mge_sched_tick(g_s);
    ck_assert_int_eq(job_row(job).state, want);
    return job;
}

/* A one-rank job placed on the only free worker @wid, which reports it running; its id. */
static int64_t job_running_on(const char *wid)
{
    int64_t job = job_add_tick(1, 2, MGE_JOB_RUNNING);
    struct mge_rank_report r = running(job, 1, 0);
    beat_quiet(wid, &r, 1, NULL, 0);
    return job;
}

/* A 2-rank job placed on new workers w1 (rank 0) and w2; its id. */
static int64_t gang_placed(char w1[40], char w2[40])
{
    worker_add("w1", true, w1);
    worker_add("w2", true, w2);
    return job_add_tick(2, 1, MGE_JOB_RUNNING);
}

static void assert_reason(int64_t job, const char *want)
{
    struct mge_job_row row = job_row(job);
    char *why = mge_sched_pending_reason(g_s, &row);
    ck_assert_ptr_nonnull(why);
    ck_assert_str_eq(why, want);
    mge_free(why);
}

/* ---- placement ---- */

START_TEST(test_sched_place_one_rank)
{
    char w1[40], w2[40];
    int64_t job;
    worker_add("w1", false, w1);
    worker_add("w2", false, w2);
    /* one worker gets its Assign; a second job of the same size goes to the other one */
    job = job_add_tick(1, 2, MGE_JOB_RUNNING);
    assert_assigned(w1, job, 1, NULL);
    job = job_add_tick(1, 2, MGE_JOB_RUNNING);
    assert_assigned(w2, job, 1, NULL);
    /* a third one waits: both workers are full */
    job_add_tick(1, 2, MGE_JOB_QUEUED);
}
END_TEST

START_TEST(test_sched_place_gang)
{
    char w1[40], w2[40];
    struct mge_sched_cmds c1, c2;
    gang_placed(w1, w2);
    ck_assert_int_eq(beat(w1, NULL, 0, NULL, 0, &c1), MGE_OK);
    ck_assert_int_eq(beat(w2, NULL, 0, NULL, 0, &c2), MGE_OK);
    ck_assert_uint_eq(c1.n_assign, 1);
    ck_assert_uint_eq(c2.n_assign, 1);
    ck_assert_int_eq(c1.assign[0].rank, 0);
    ck_assert_int_eq(c1.assign[0].world, 2);
    ck_assert_int_eq(c2.assign[0].rank, 1);
    /* rank 0's worker runs mpirun: it gets every rank's worker and the attempt's token */
    ck_assert_uint_eq(c1.assign[0].n_peers, 2);
    ck_assert_str_eq(c1.assign[0].peers[1].name, "w2");
    ck_assert_uint_eq(c2.assign[0].n_peers, 0);
    ck_assert_uint_eq(strlen(c1.assign[0].launch_token), 32);
    ck_assert_str_eq(c1.assign[0].launch_token, c2.assign[0].launch_token);
    mge_sched_cmds_fini(&c1);
    mge_sched_cmds_fini(&c2);
}
END_TEST

/* ---- pending reasons ---- */

START_TEST(test_sched_pending_reasons)
{
    char w1[40];
    int64_t big, small, next;
    json_t *out = NULL;
    big = job_add(1, 4);
    assert_reason(big, "needs 1 worker with 4 CPUs, no workers are connected");
    worker_add("w1", false, w1);
    assert_reason(big, "needs 1 worker with 4 CPUs, only 0 workers are that large");
    small = job_add(1, 2);
    mge_sched_tick(g_s);
    ck_assert_int_eq(job_row(small).state, MGE_JOB_RUNNING);
    next = job_add(1, 1);
    assert_reason(next, "needs 1 worker with 1 CPU, 0 free; no estimate yet (1 running job has "
                        "not reported its speed)");
    {
        /* 100 steps in 10 s, 800 of its 1000 to go: the worker is free in about 80 s */
        int64_t now = mge_now_ms();
        struct mge_store_line l[2];
        struct mge_rank_report r = running(small, 1, 0);
        char want[160];
        l[0] = line(small, 1, 0, 1, 2, "{\"step\":100,\"loss\":1.0}", now - 10000);
        l[1] = line(small, 1, 0, 2, 2, "{\"step\":200,\"loss\":1.0}", now);
        beat_quiet(w1, &r, 1, l, 2);
        snprintf(want, sizeof(want),
                 "needs 1 worker with 1 CPU, 0 free; about 80 s (job %lld ends)", (long long)small);
        assert_reason(next, want);
    }
    ck_assert_int_eq(mge_sched_worker_drain(g_s, "w1", &out), MGE_OK);
    json_decref(out);
    assert_reason(next, "needs 1 worker with 1 CPU, the 1 connected worker is draining");
    ck_assert_int_eq(mge_sched_worker_undrain(g_s, "nope", &out), MGE_NOENT);
    ck_assert_int_eq(mge_sched_worker_undrain(g_s, "w1", &out), MGE_OK);
    ck_assert_str_eq(json_string_value(json_object_get(out, "state")), "ready");
    ck_assert(json_is_false(json_object_get(out, "drain")));
    json_decref(out);
}
END_TEST

/* The ETA counts the queued jobs ahead: they take the slots first, as the passes would. */
START_TEST(test_sched_pending_eta_queue)
{
    char w1[40], w2[40], want[200];
    int64_t a, b, c, e, now;
    struct mge_store_line l[2];
    struct mge_rank_report r;
    worker_add("w1", false, w1);
    a = job_add(1, 2);
    mge_sched_tick(g_s);
    ck_assert_int_eq(job_row(a).state, MGE_JOB_RUNNING);
    b = job_add(1, 2); /* first in the queue */
    c = job_add(1, 1); /* behind it */
    /* a: 100 steps in 10 s, 800 of its 1000 to go: w1 is free in about 80 s */
    now = mge_now_ms();
    r = running(a, 1, 0);
    l[0] = line(a, 1, 0, 1, 2, "{\"step\":100,\"loss\":1.0}", now - 10000);
    l[1] = line(a, 1, 0, 2, 2, "{\"step\":200,\"loss\":1.0}", now);
    beat_quiet(w1, &r, 1, l, 2);
    snprintf(want, sizeof(want), "needs 1 worker with 2 CPUs, 0 free; about 80 s (job %lld ends)",
             (long long)a);
    assert_reason(b, want);
    /* c fits where a ends too, but b comes first and takes all of w1 */
    snprintf(want, sizeof(want),
             "needs 1 worker with 1 CPU, 0 free; no estimate: 1 queued job ahead (job %lld "
             "first) takes the slots it needs",
             (long long)b);
    assert_reason(c, want);
    /* a second worker: b starts there; e, of a higher priority, is ahead of c and takes w2
     * when b ends (in about 40 s), so c waits for w1 (80 s) */
    worker_add("w2", false, w2);
    mge_sched_tick(g_s);
    ck_assert_int_eq(job_row(b).state, MGE_JOB_RUNNING);
    r = running(b, 1, 0);
    l[0] = line(b, 1, 0, 1, 2, "{\"step\":100,\"loss\":1.0}", now - 10000);
    l[1] = line(b, 1, 0, 2, 2, "{\"step\":280,\"loss\":1.0}", now);
    beat_quiet(w2, &r, 1, l, 2);
    snprintf(want, sizeof(want), "needs 1 worker with 1 CPU, 0 free; about 40 s (job %lld ends)",
             (long long)b);
    assert_reason(c, want);
    e = job_add_priority(2, 5);
    snprintf(want, sizeof(want),
             "needs 1 worker with 1 CPU, 0 free; about 80 s (job %lld ends; 1 queued job ahead "
             "starts first)",
             (long long)a);
    assert_reason(c, want);
    snprintf(want, sizeof(want), "needs 1 worker with 2 CPUs, 0 free; about 40 s (job %lld ends)",
             (long long)b);
    assert_reason(e, want);
}
END_TEST

/* ---- GPU placement ---- */

/* A `device: gpu` job of one worker with @gpus GPUs, planned at @plan_mb per rank; its id. */
static int64_t gpu_job_add(int gpus, int64_t plan_mb)
{
    char res[128];
    snprintf(res, sizeof(res), "device: gpu, gpus: %d, cpus: 1", gpus);
    return job_add_resources(res, 0, plan_mb);
}

/* Register worker @name with 4 CPUs and the GPUs of @list (mge_gpus_parse's format). */
static void gpu_worker_add(const char *name, const char *list, char id[40])
{
    struct mge_gpu gpus[MGE_GPUS_MAX];
    struct mge_sched_cmds cmds;
    char why[200];
    int n = 0;
    struct mge_worker_info info = {
        .name = name, .host = "h", .version = "t", .launch_url = "", .cpus = 4, .memory_mb = 1024};
    ck_assert_int_eq(mge_gpus_parse(list, gpus, &n, why, sizeof(why)), MGE_OK);
    info.device = n ? "gpu" : "cpu";
    info.gpus = n;
    info.gpu = gpus;
    ck_assert_int_eq(mge_sched_worker_register(g_s, &info, NULL, 0, id, &cmds), MGE_OK);
    mge_sched_cmds_fini(&cmds);
}

/* The next heartbeat of @wid carries the Assign of @job (with those of the jobs placed there
 * before, which it does not report yet), with GPU indexes @ids. */
static void assert_gpus_assigned(const char *wid, int64_t job, const char *ids)
{
    struct mge_sched_cmds c;
    size_t found = 0;
    ck_assert_int_eq(beat(wid, NULL, 0, NULL, 0, &c), MGE_OK);
    for (size_t i = 0; i < c.n_assign; i++) {
        if (c.assign[i].job_id != job)
            continue;
        ck_assert_str_eq(c.assign[i].gpu_ids, ids);
        found++;
    }
    ck_assert_uint_eq(found, 1);
    mge_sched_cmds_fini(&c);
}

/* The GPUs of worker @name as GET /api/v1/workers shows them: "0:NAME:MB:free,1:..." */
static void assert_worker_gpus(const char *name, const char *want)
{
    json_t *arr = mge_sched_workers_json(g_s), *w, *g;
    char got[400] = "";
    size_t i, k;
    json_array_foreach(arr, i, w)
    {
        if (strcmp(json_string_value(json_object_get(w, "name")), name) != 0)
            continue;
        json_array_foreach(json_object_get(w, "gpus"), k, g)
        {
            size_t off = strlen(got);
            snprintf(got + off, sizeof(got) - off, "%s%lld:%s:%lld:%s", k ? "," : "",
                     (long long)json_integer_value(json_object_get(g, "index")),
                     json_string_value(json_object_get(g, "name")),
                     (long long)json_integer_value(json_object_get(g, "memory_mb")),
                     json_is_true(json_object_get(g, "free")) ? "free" : "taken");
        }
    }
    json_decref(arr);
    ck_assert_str_eq(got, want);
}

START_TEST(test_sched_gpu_indexes)
{
    char wc[40], wg[40];
    int64_t a, b, c;
    struct mge_rank_report r[2];
    gpu_worker_add("cpu", "", wc);
    gpu_worker_add("g", "2x NVIDIA H100 80GB HBM3:81559", wg);
    assert_worker_gpus("g",
                       "0:NVIDIA H100 80GB HBM3:81559:free,1:NVIDIA H100 80GB HBM3:81559:free");
    assert_worker_gpus("cpu", "");
    /* two 1-GPU jobs on the 2-GPU worker get different devices; the CPU worker gets none */
    a = gpu_job_add(1, 300);
    mge_sched_tick(g_s);
    assert_gpus_assigned(wg, a, "0");
    b = gpu_job_add(1, 300);
    mge_sched_tick(g_s);
    assert_gpus_assigned(wg, b, "1");
    assert_worker_gpus("g",
                       "0:NVIDIA H100 80GB HBM3:81559:taken,1:NVIDIA H100 80GB HBM3:81559:taken");
    c = gpu_job_add(1, 300);
    mge_sched_tick(g_s);
    ck_assert_int_eq(job_row(c).state, MGE_JOB_QUEUED);
    assert_reason(c, "needs 1 worker with 1 GPU of 300 MiB, 0 free; no estimate yet (2 running "
                     "jobs have not reported their speed)");
    /* a restarted scheduler knows which GPUs the running ranks hold (the store's placements) */
    mge_sched_free(g_s);
    sched_start();
    r[0] = running(a, 1, 0);
    r[1] = running(b, 1, 0);
    {
        struct mge_sched_cmds cmds;
        struct mge_worker_info info = {.name = "g",
                                       .host = "h",
                                       .version = "t",
                                       .device = "gpu",
                                       .launch_url = "",
                                       .cpus = 4,
                                       .memory_mb = 1024,
                                       .gpus = 2};
        struct mge_gpu gpus[2] = {{"NVIDIA H100 80GB HBM3", 81559},
                                  {"NVIDIA H100 80GB HBM3", 81559}};
        info.gpu = gpus;
        ck_assert_int_eq(mge_sched_worker_register(g_s, &info, r, 2, wg, &cmds), MGE_OK);
        ck_assert_uint_eq(cmds.n_cancel, 0);
        mge_sched_cmds_fini(&cmds);
    }
    mge_sched_tick(g_s);
    ck_assert_int_eq(job_row(c).state, MGE_JOB_QUEUED);
    /* job b's rank ends: its GPU 1 goes to the waiting job */
    r[1] = exited(b, 1, 0, 0, 0);
    beat_quiet(wg, r, 2, NULL, 0);
    mge_sched_tick(g_s);
    ck_assert_int_eq(job_row(c).state, MGE_JOB_RUNNING);
    assert_gpus_assigned(wg, c, "1");
}
END_TEST

START_TEST(test_sched_gpu_memory)
{
    char wc[40], wg[40];
    int64_t big, small, huge, two;
    /* no worker has a GPU yet */
    huge = gpu_job_add(1, 0);
    assert_reason(huge, "needs 1 worker with 1 GPU; no registered worker has a GPU");
    gpu_worker_add("cpu", "", wc);
    mge_sched_tick(g_s);
    ck_assert_int_eq(job_row(huge).state, MGE_JOB_QUEUED);
    assert_reason(huge, "needs 1 worker with 1 GPU; no registered worker has a GPU");
    mge_sched_job_cancel(g_s, huge);
    /* GPUs of two sizes: a job takes the smallest GPU that holds its plan */
    gpu_worker_add("g", "1x NVIDIA A100 80GB:81920,1x NVIDIA T4:15360", wg);
    ck_assert_int_eq(mge_sched_gpu_memory_max_mb(g_s), 81920);
    big = gpu_job_add(1, 40000);
    mge_sched_tick(g_s);
    assert_gpus_assigned(wg, big, "0");
    big = gpu_job_add(1, 40000); /* only the A100 holds it, and it is taken */
    mge_sched_tick(g_s);
    ck_assert_int_eq(job_row(big).state, MGE_JOB_QUEUED);
    small = gpu_job_add(1, 10000);
    mge_sched_tick(g_s);
    assert_gpus_assigned(wg, small, "1");
    mge_sched_job_cancel(g_s, big);
    /* more memory than any GPU has: the reason names both numbers */
    huge = gpu_job_add(1, 90000);
    assert_reason(huge, "needs 1 worker with 1 GPU of 90000 MiB; no GPU has 90000 MiB: the "
                        "largest has 81920 MiB (worker 'g')");
    mge_sched_job_cancel(g_s, huge);
    /* two GPUs of 40000 MiB: the worker has one such */
    two = gpu_job_add(2, 40000);
    assert_reason(two, "needs 1 worker with 2 GPUs of 40000 MiB; the most such GPUs a worker has "
                       "is 1");
}
END_TEST

/* ---- requeue on a lost worker ---- */

/* Heartbeats from @wid with @n reports, every second for @ms, ticking after each. */
static void run_for(int64_t ms, const char *wid, const struct mge_rank_report *ranks, size_t n)
{
    for (int64_t t = 0; t < ms; t += 1000) {
        g_now += ms - t < 1000 ? ms - t : 1000;
        if (wid)
            beat_quiet(wid, ranks, n, NULL, 0);
        mge_sched_tick(g_s);
    }
}

START_TEST(test_sched_requeue_worker_lost)
{
    char w1[40], w2[40];
    struct mge_sched_cmds c;
    struct mge_rank_report r;
    json_t *j;
    int64_t job;
    worker_add("w1", false, w1);
    job = job_running_on(w1);
    r = running(job, 1, 0);
    worker_add("w2", false, w2);
    /* w1 goes silent; w2 keeps beating. 2.9 s: nothing happens. */
    run_for(2900, w2, NULL, 0);
    ck_assert_int_eq(job_row(job).state, MGE_JOB_RUNNING);
    ck_assert(mge_sched_worker_known(g_s, w1));
    /* past the 3 s timeout: w1 is lost, attempt 1 failed, attempt 2 placed on w2 */
    run_for(200, w2, NULL, 0);
    ck_assert(!mge_sched_worker_known(g_s, w1));
    ck_assert_int_eq(job_row(job).attempt, 2);
    ck_assert_int_eq(job_row(job).state, MGE_JOB_RUNNING);
    j = job_json(job);
    ck_assert_str_eq(job_reason(j), "worker lost: w1");
    json_decref(j);
    assert_assigned(w2, job, 2, NULL);
    /* a lost worker's heartbeat is refused: it must register again */
    ck_assert_int_eq(mge_sched_worker_heartbeat(g_s, w1, &r, 1, NULL, 0, &c), MGE_NOENT);
    mge_sched_cmds_fini(&c);
}
END_TEST

/* ---- fencing ---- */

START_TEST(test_sched_fence_stale_attempt)
{
    char w1[40], w2[40], w1b[40];
    struct mge_sched_cmds c;
    struct mge_rank_report r1 = {0}, r2;
    struct mge_store_line l[4];
    json_t *j, *ck;
    char *latest = NULL;
    uint64_t fenced0;
    int64_t job;
    const char *result2 = "{\"summary\":true,\"steps\":1000,\"final_loss\":0.25}";

    /* checkpoint paths as the coordinator believes them: <workdir>/job-J/attempt-A/rank-R/NAME */
    char p10[160], p20[160], p30[160], p1000[160], n10[200], n20[200], n30[200], n1000[200];

    worker_add("w1", false, w1);
    job = job_running_on(w1);
    snprintf(p10, sizeof(p10), "/w1/job-%lld/attempt-1/rank-0/ckpt-000010.mgeckpt", (long long)job);
    snprintf(p20, sizeof(p20), "/w2/job-%lld/attempt-2/rank-0/ckpt-000020.mgeckpt", (long long)job);
    snprintf(p30, sizeof(p30), "/w1/job-%lld/attempt-1/rank-0/ckpt-000030.mgeckpt", (long long)job);
    snprintf(p1000, sizeof(p1000), "/w1/job-%lld/attempt-1/rank-0/ckpt-001000.mgeckpt",
             (long long)job);
    snprintf(n10, sizeof(n10), "ckpt-000010.mgeckpt 10 100 %s", p10);
    snprintf(n20, sizeof(n20), "ckpt-000020.mgeckpt 20 100 %s", p20);
    snprintf(n30, sizeof(n30), "ckpt-000030.mgeckpt 30 100 %s", p30);
    snprintf(n1000, sizeof(n1000), "ckpt-001000.mgeckpt 1000 100 %s", p1000);
    r1 = running(job, 1, 0);
    /* attempt 1 on w1 stores step 10 and a checkpoint */
    l[0] = line(job, 1, 0, 1, 2, "{\"step\":10,\"loss\":2.0}", 1);
    l[1] = line(job, 1, 0, 2, 3, n10, 2);
    beat_quiet(w1, &r1, 1, l, 2);
    ck_assert_double_eq(metric_at(job, "loss", 10), 2.0);
    /* w1 stops (SIGSTOP): lost, attempt 2 on w2 */
    worker_add("w2", false, w2);
    run_for(3500, w2, NULL, 0);
    ck_assert_int_eq(job_row(job).attempt, 2);
    assert_assigned(w2, job, 2, p10);
    r2 = running(job, 2, 0);
    l[0] = line(job, 2, 0, 1, 2, "{\"step\":11,\"loss\":1.5}", 3);
    l[1] = line(job, 2, 0, 2, 3, n20, 4);
    beat_quiet(w2, &r2, 1, l, 2);
    ck_assert_double_eq(metric_at(job, "loss", 11), 1.5);

    /* w1 comes back (SIGCONT): its heartbeat is refused, it registers again reporting
     * attempt 1 as running, and the reply to that register cancels attempt 1 */
    ck_assert_int_eq(mge_sched_worker_heartbeat(g_s, w1, &r1, 1, NULL, 0, &c), MGE_NOENT);
    mge_sched_cmds_fini(&c);
    worker_add_ranks("w1", false, &r1, 1, w1b, &c);
    ck_assert_str_eq(w1b, w1);
    ck_assert(has_cancel(&c, job, 1));
    ck_assert_int_eq(c.grace_ms, 1000);
    mge_sched_cmds_fini(&c);

    /* its buffered output of attempt 1 (a later step, a checkpoint, the summary) is dropped,
     * but the ingest succeeds so the lines are acked; the next heartbeat cancels again */
    fenced0 = mge_store_lines_fenced(g_st);
    l[0] = line(job, 1, 0, 3, 2, "{\"step\":12,\"loss\":9.0}", 5);
    l[1] = line(job, 1, 0, 4, 3, n30, 6);
    l[2] = line(job, 1, 0, 5, 2, "{\"summary\":true,\"steps\":1000,\"final_loss\":9.9}", 7);
    l[3] = line(job, 1, 0, 6, 1, "stale stderr", 8);
    ck_assert_int_eq(beat(w1, &r1, 1, l, 4, &c), MGE_OK);
    ck_assert(has_cancel(&c, job, 1));
    mge_sched_cmds_fini(&c);
    ck_assert_uint_eq(mge_store_lines_fenced(g_st), fenced0 + 4);
    ck_assert_double_eq(metric_at(job, "loss", 12), -1);
    ck_assert_int_eq(mge_store_checkpoint_latest(g_st, job, &latest), MGE_OK);
    ck_assert_str_eq(latest, p20);
    mge_free(latest);
    latest = NULL;
    j = job_json(job);
    ck_assert(json_is_null(json_object_get(j, "result")));
    json_decref(j);

    /* another worker's rank: w1 sending lines for attempt 2 rank 0 (placed on w2) */
    l[0] = line(job, 2, 0, 3, 2, "{\"summary\":true,\"steps\":1000,\"final_loss\":7.7}", 9);
    ck_assert_int_eq(mge_store_lines_ingest(g_st, w1, l, 1), MGE_OK);
    ck_assert_uint_eq(mge_store_lines_fenced(g_st), fenced0 + 5);

    /* attempt 2 ends; then attempt 1's exit and summary arrive: nothing changes */
    l[0] = line(job, 2, 0, 3, 2, result2, 10);
    r2 = exited(job, 2, 0, 0, 0);
    beat_quiet(w2, &r2, 1, l, 1);
    ck_assert_int_eq(job_row(job).state, MGE_JOB_SUCCEEDED);
    l[0] = line(job, 1, 0, 7, 2, "{\"summary\":true,\"steps\":1000,\"final_loss\":9.9}", 11);
    l[1] = line(job, 1, 0, 8, 3, n1000, 12);
    r1 = exited(job, 1, 0, 1, 0);
    ck_assert_int_eq(beat(w1, &r1, 1, l, 2, &c), MGE_OK);
    ck_assert_uint_eq(c.n_acks, 1); /* the stale exit is acked, so w1 stops reporting it */
    ck_assert_int_eq(c.acks[0].attempt, 1);
    mge_sched_cmds_fini(&c);
    ck_assert_int_eq(job_row(job).state, MGE_JOB_SUCCEEDED);
    j = job_json(job);
    ck_assert_double_eq(
        json_number_value(json_object_get(json_object_get(j, "result"), "final_loss")), 0.25);
    ck_assert(json_is_null(json_object_get(j, "failure_reason")));
    json_decref(j);
    ck_assert_int_eq(mge_store_checkpoint_latest(g_st, job, &latest), MGE_OK);
    ck_assert_str_eq(latest, p20);
    mge_free(latest);
    ck_assert_int_eq(mge_store_checkpoints(g_st, job, &ck), MGE_OK);
    ck_assert_uint_eq(json_array_size(ck), 2); /* steps 10 (attempt 1, before) and 20 */
    json_decref(ck);
}
END_TEST

START_TEST(test_sched_fence_ended_job)
{
    char w1[40];
    struct mge_sched_cmds c;
    struct mge_rank_report r;
    struct mge_store_line l[2];
    json_t *j;
    int64_t job;
    worker_add("w1", false, w1);
    job = job_running_on(w1);
    r = running(job, 1, 0);
    ck_assert_int_eq(mge_sched_job_cancel(g_s, job), MGE_OK);
    /* the rank still prints: its log is kept, its metrics and summary are not */
    l[0] = line(job, 1, 0, 1, 1, "got SIGTERM", 1);
    l[1] = line(job, 1, 0, 2, 2, "{\"summary\":true,\"steps\":5,\"final_loss\":1.0}", 2);
    ck_assert_int_eq(beat(w1, &r, 1, l, 2, &c), MGE_OK);
    ck_assert(has_cancel(&c, job, 1));
    mge_sched_cmds_fini(&c);
    ck_assert_uint_eq(mge_store_lines_fenced(g_st), 1);
    j = job_json(job);
    ck_assert_str_eq(json_string_value(json_object_get(j, "state")), "cancelled");
    ck_assert(json_is_null(json_object_get(j, "result")));
    json_decref(j);
    /* a worker registering with a rank of the ended job is told to cancel it */
    worker_add_ranks("w1", false, &r, 1, w1, &c);
    ck_assert(has_cancel(&c, job, 1));
    mge_sched_cmds_fini(&c);
}
END_TEST

/* ---- the watchdog ---- */

/* Run attempt 1 of a one-rank job on w1 to step @steps, a report every @iv_ms. */
static int64_t run_steps(const char *w1, int64_t steps, int64_t iv_ms)
{
    struct mge_rank_report r;
    struct mge_store_line l;
    char text[64];
    int64_t job = job_running_on(w1);
    r = running(job, 1, 0);
    for (int64_t k = 1; k <= steps; k++) {
        g_now += iv_ms;
        snprintf(text, sizeof(text), "{\"step\":%lld,\"loss\":1.0}", (long long)k);
        l = line(job, 1, 0, (uint64_t)k, 2, text, 1000 + k * iv_ms);
        beat_quiet(w1, &r, 1, &l, 1);
        mge_sched_tick(g_s);
    }
    return job;
}

/*
 * One-rank job @job on @wid, silent from now on (its worker still beats): still running
 * @limit_ms - 1 ms later, failed at @limit_ms with reason @want, its rank cancelled.
 */
static void assert_watchdog_fires(int64_t job, const char *wid, int64_t limit_ms, const char *want)
{
    struct mge_rank_report r = running(job, 1, 0);
    struct mge_sched_cmds c;
    json_t *j;
    run_for(limit_ms - 1, wid, &r, 1);
    ck_assert_int_eq(job_row(job).state, MGE_JOB_RUNNING);
    run_for(1, wid, &r, 1);
    ck_assert_int_eq(job_row(job).state, MGE_JOB_FAILED);
    ck_assert_int_eq(job_row(job).attempt, 1); /* failed, not requeued */
    j = job_json(job);
    ck_assert_str_eq(job_reason(j), want);
    json_decref(j);
    ck_assert_int_eq(beat(wid, &r, 1, NULL, 0, &c), MGE_OK);
    ck_assert(has_cancel(&c, job, 1));
    mge_sched_cmds_fini(&c);
}

/*
 * The allowance: the 10 s floor, 5 x the median report interval, the startup allowance; a
 * first report 15 s after the start (log_every large) allows 75 s before the second.
 */
static const struct {
    int64_t steps, iv_ms, limit_ms;
    const char *want;
} watchdog_cases[] = {
    {316, 100, 10000, "no progress for 10 s since step 316 (rank 0 on w1 silent)"},
    {5, 4000, 20000, "no progress for 20 s since step 5 (rank 0 on w1 silent)"},
    {0, 0, 60000, "no progress for 60 s since the start (rank 0 on w1 silent)"},
    {1, 15000, 75000, "no progress for 75 s since step 1 (rank 0 on w1 silent)"},
};

START_TEST(test_sched_watchdog)
{
    char w1[40];
    worker_add("w1", false, w1);
    assert_watchdog_fires(run_steps(w1, watchdog_cases[_i].steps, watchdog_cases[_i].iv_ms), w1,
                          watchdog_cases[_i].limit_ms, watchdog_cases[_i].want);
}
END_TEST

/*
 * A 2-worker gang at step 7, then 10 s without a step while the workers report their ranks'
 * sessions: rank 1 @stopped, and CPU time from @cpu_base (0: not reported), rank 0's
 * @cpu0_per_s and rank 1's @cpu1_per_s ms more each second. The failure reason must be @want.
 */
static void gang_hangs(bool stopped, int64_t cpu_base, int64_t cpu0_per_s, int64_t cpu1_per_s,
                       const char *want)
{
    char w1[40], w2[40];
    struct mge_rank_report r0, r1;
    struct mge_store_line l;
    json_t *j;
    int64_t job = gang_placed(w1, w2);
    r0 = running(job, 1, 0);
    r1 = running(job, 1, 1);
    r0.cpu_ms = r1.cpu_ms = cpu_base;
    l = line(job, 1, 0, 1, 2, "{\"step\":7,\"loss\":1.0}", 1);
    beat_quiet(w1, &r0, 1, &l, 1);
    beat_quiet(w2, &r1, 1, NULL, 0);
    for (int k = 0; k < 10; k++) {
        g_now += 1000;
        r0.cpu_ms += cpu0_per_s;
        r1.cpu_ms += cpu1_per_s;
        r1.stopped = stopped;
        beat_quiet(w1, &r0, 1, NULL, 0);
        beat_quiet(w2, &r1, 1, NULL, 0);
        mge_sched_tick(g_s);
    }
    ck_assert_int_eq(job_row(job).state, MGE_JOB_FAILED);
    j = job_json(job);
    ck_assert_str_eq(job_reason(j), want);
    json_decref(j);
}

START_TEST(test_sched_watchdog_names_stopped_rank)
{
    /* SIGSTOP: the group's state says so, whatever the CPU figures */
    gang_hangs(true, 500, 1000, 0, "no progress for 10 s since step 7 (rank 1 on w2 stopped)");
}
END_TEST

START_TEST(test_sched_watchdog_names_idle_rank)
{
    /* rank 0 spins in the all-reduce; rank 1 waits on something else (a FIFO) */
    gang_hangs(false, 500, 990, 10,
               "no progress for 10 s since step 7 (rank 1 on w2 idle: 0.1 s of CPU while a peer "
               "used 9.9 s)");
}
END_TEST

START_TEST(test_sched_watchdog_no_rank_stands_out)
{
    /* both ranks busy (a very slow step, not a hang one rank causes): no rank is blamed */
    gang_hangs(false, 500, 900, 800,
               "no progress for 10 s since step 7 (ranks 0-1 on w1, w2: only rank 0 reports steps, "
               "so which rank hangs is not known)");
}
END_TEST

START_TEST(test_sched_watchdog_gang)
{
    /* workers that say nothing of their ranks' sessions: no rank can be singled out */
    gang_hangs(false, 0, 0, 0,
               "no progress for 10 s since step 7 (ranks 0-1 on w1, w2: only rank 0 reports steps, "
               "so which rank hangs is not known)");
}
END_TEST

/* ---- which rank broke a gang ---- */

static void gang_killed(const char *mpirun_line1, const char *mpirun_line2, const char *want)
{
    char w1[40], w2[40];
    struct mge_rank_report r0, r1;
    struct mge_store_line l[2];
    json_t *j;
    int64_t job = gang_placed(w1, w2);
    /* as observed: rank 1's orted exits 0 first, then mpirun exits 137 with its message */
    r1 = exited(job, 1, 1, 0, 0);
    beat_quiet(w2, &r1, 1, NULL, 0);
    ck_assert_int_eq(job_row(job).state, MGE_JOB_RUNNING);
    l[0] = line(job, 1, 0, 1, 1, mpirun_line1, 1);
    l[1] = line(job, 1, 0, 2, 1, mpirun_line2, 2);
    r0 = exited(job, 1, 0, 137, 0);
    beat_quiet(w1, &r0, 1, l, 2);
    ck_assert_int_eq(job_row(job).state, MGE_JOB_FAILED);
    j = job_json(job);
    ck_assert_str_eq(job_reason(j), want);
    json_decref(j);
}

START_TEST(test_sched_gang_names_killed_rank)
{
    gang_killed("mpirun.openmpi noticed that process rank 1 with PID 11127 on node w2 exited on "
                "signal 9 (Killed).",
                "--------------------------------------------------------------------------",
                "rank 1 killed by signal 9 on w2");
}
END_TEST

START_TEST(test_sched_gang_names_failed_rank)
{
    gang_killed("  Process name: [[41239,1],1]", "  Exit code:    3",
                "rank 1 exited with code 3 on w2");
}
END_TEST

START_TEST(test_sched_gang_names_aborting_rank)
{
    gang_killed("MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD",
                "with errorcode 2.", "rank 1 exited with code 2 (bad input) on w2");
}
END_TEST

START_TEST(test_sched_gang_no_mpirun_message)
{
    gang_killed("something else", "entirely", "rank 0 exited with code 137");
}
END_TEST

/* ---- elastic jobs: {min, max} ---- */

/* Incarnation @k (0-based) of job @id as the API shows it; caller json_decref()s. */
static json_t *incarnation(int64_t id, size_t k)
{
    json_t *j = job_json(id), *inc = json_array_get(json_object_get(j, "incarnations"), k);
    ck_assert_ptr_nonnull(inc);
    json_incref(inc);
    json_decref(j);
    return inc;
}

static void assert_members(json_t *inc, const char *want)
{
    json_t *m;
    size_t i;
    char got[128] = "";
    json_array_foreach(json_object_get(inc, "members"), i, m)
    {
        strncat(got, i ? "," : "", sizeof(got) - strlen(got) - 1);
        strncat(got, json_string_value(m), sizeof(got) - strlen(got) - 1);
    }
    ck_assert_str_eq(got, want);
}

/* The next heartbeat of @wid brings one Assign of @job: rank @rank of a world of @world. */
static void assert_assigned_rank(const char *wid, int64_t job, int attempt, int rank, int world)
{
    struct mge_sched_cmds c;
    ck_assert_int_eq(beat(wid, NULL, 0, NULL, 0, &c), MGE_OK);
    ck_assert_uint_eq(c.n_assign, 1);
    ck_assert_int_eq(c.assign[0].job_id, job);
    ck_assert_int_eq(c.assign[0].attempt, attempt);
    ck_assert_int_eq(c.assign[0].rank, rank);
    ck_assert_int_eq(c.assign[0].world, world);
    mge_sched_cmds_fini(&c);
}

/* Workers w1 .. w@n (2 CPUs each) and a {min: 2, max: 3} job of 2 CPUs a rank, placed on all
 * of them, which report it running. */
static int64_t elastic_on(char w[3][40], int n)
{
    static const char *const names[] = {"w1", "w2", "w3"};
    int64_t job;
    for (int k = 0; k < n; k++)
        worker_add(names[k], true, w[k]);
    job = job_add_workers("{min: 2, max: 3}", 2);
    mge_sched_tick(g_s);
    ck_assert_int_eq(job_row(job).state, MGE_JOB_RUNNING);
    for (int k = 0; k < n; k++) {
        struct mge_rank_report r = running(job, 1, k);
        beat_quiet(w[k], &r, 1, NULL, 0);
    }
    return job;
}

/*
 * Workers w1, w2, w3 (2 CPUs each) and a {min: 2, max: 3} job of 2 CPUs a rank, placed on all
 * three, which report it running; rank 0 reports step 40 and a checkpoint at step 30.
 */
static int64_t elastic_placed(char w[3][40])
{
    struct mge_rank_report r;
    struct mge_store_line l[2];
    char note[200];
    int64_t job = elastic_on(w, 3);
    snprintf(note, sizeof(note),
             "ckpt-000030.mgeckpt 30 100 /w1/job-%lld/attempt-1/rank-0/ckpt-000030.mgeckpt",
             (long long)job);
    l[0] = line(job, 1, 0, 1, 3, note, 1);
    l[1] = line(job, 1, 0, 2, 2, "{\"step\":40,\"loss\":1.0}", 2);
    r = running(job, 1, 0);
    beat_quiet(w[0], &r, 1, l, 2);
    return job;
}

/* Workers @a and @b report rank @ra / @rb of attempt @attempt ended by the cancel. */
static void ranks_cancelled(const char *a, int ra, const char *b, int rb, int64_t job, int attempt)
{
    struct mge_rank_report r = exited(job, attempt, ra, 0, 15);
    beat_quiet(a, &r, 1, NULL, 0);
    r = exited(job, attempt, rb, 0, 15);
    beat_quiet(b, &r, 1, NULL, 0);
}

START_TEST(test_sched_elastic_shrink)
{
    char w[3][40];
    struct mge_rank_report r[2];
    json_t *inc;
    int64_t job = elastic_placed(w);
    /* w3 goes silent past the 3 s timeout: attempt 1 ends, the job is queued again at once */
    r[0] = running(job, 1, 0);
    r[1] = running(job, 1, 1);
    for (int t = 0; t < 4; t++) {
        g_now += 1000;
        beat_quiet(w[0], &r[0], 1, NULL, 0);
        beat_quiet(w[1], &r[1], 1, NULL, 0);
        mge_sched_tick(g_s);
    }
    ck_assert_int_eq(job_row(job).attempt, 2);
    /* the survivors' slots are taken until their ranks of attempt 1 end */
    ck_assert_int_eq(job_row(job).state, MGE_JOB_QUEUED);
    ranks_cancelled(w[0], 0, w[1], 1, job, 1);
    mge_sched_tick(g_s);
    /* 2 >= min: attempt 2 runs on the two survivors, from the checkpoint */
    ck_assert_int_eq(job_row(job).state, MGE_JOB_RUNNING);
    assert_assigned_rank(w[0], job, 2, 0, 2);
    assert_assigned_rank(w[1], job, 2, 1, 2);
    inc = incarnation(job, 0);
    ck_assert_int_eq(json_integer_value(json_object_get(inc, "world")), 3);
    assert_members(inc, "w1,w2,w3");
    ck_assert_int_eq(json_integer_value(json_object_get(inc, "start_step")), 0);
    ck_assert_str_eq(json_string_value(json_object_get(inc, "ended")), "requeued");
    ck_assert_str_eq(json_string_value(json_object_get(inc, "reason")),
                     "worker lost: w3 at step 40; resized 3 -> 2");
    ck_assert(json_is_true(json_object_get(inc, "infra")));
    ck_assert_ptr_nonnull(json_string_value(json_object_get(inc, "ended_at")));
    json_decref(inc);
    inc = incarnation(job, 1);
    ck_assert_int_eq(json_integer_value(json_object_get(inc, "world")), 2);
    assert_members(inc, "w1,w2");
    ck_assert_int_eq(json_integer_value(json_object_get(inc, "start_step")), 30);
    ck_assert(json_is_null(json_object_get(inc, "ended")));
    ck_assert(json_is_null(json_object_get(inc, "ended_at")));
    json_decref(inc);
}
END_TEST

START_TEST(test_sched_elastic_waits_below_min)
{
    char w[3][40], again[40];
    struct mge_rank_report r = {0};
    json_t *j;
    int64_t job = elastic_placed(w);
    struct mge_job_row row;
    char *why;
    /* w2 and w3 go silent: one worker is left, fewer than min */
    r = running(job, 1, 0);
    run_for(3500, w[0], &r, 1);
    ck_assert_int_eq(job_row(job).attempt, 2);
    r = exited(job, 1, 0, 0, 15);
    beat_quiet(w[0], &r, 1, NULL, 0);
    run_for(5000, w[0], NULL, 0);
    ck_assert_int_eq(job_row(job).state, MGE_JOB_QUEUED);
    row = job_row(job);
    why = mge_sched_pending_reason(g_s, &row);
    ck_assert_str_eq(why, "needs 2 workers with 2 CPUs, only 1 worker is that large");
    mge_free(why);
    /* w2 comes back: two workers again, attempt 2 starts with them */
    worker_add("w2", true, again);
    ck_assert_str_eq(again, w[1]);
    mge_sched_tick(g_s);
    ck_assert_int_eq(job_row(job).state, MGE_JOB_RUNNING);
    j = incarnation(job, 1);
    assert_members(j, "w1,w2");
    json_decref(j);
    j = job_json(job);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "restarts")), 0);
    json_decref(j);
}
END_TEST

/* Losing a worker five times does not fail the job; failures charged to it do, after two. */
START_TEST(test_sched_elastic_infra_not_charged)
{
    char w[3][40], back[40];
    struct mge_rank_report r[2];
    bool requeued = false;
    json_t *j;
    int64_t job = elastic_placed(w);
    static const char *const names[] = {"w1", "w2", "w3"};
    for (int round = 1; round <= 5; round++) {
        /* attempt `round` runs on w1, w2, w3 (ranks 0, 1, 2): w3, w2, w3, ... goes silent */
        int lost = round % 2 ? 2 : 1, keep = 3 - lost;
        r[0] = running(job, round, 0);
        r[1] = running(job, round, keep);
        for (int t = 0; t < 4; t++) {
            g_now += 1000;
            beat_quiet(w[0], &r[0], 1, NULL, 0);
            beat_quiet(w[keep], &r[1], 1, NULL, 0);
            mge_sched_tick(g_s);
        }
        ck_assert_int_eq(job_row(job).attempt, round + 1);
        ranks_cancelled(w[0], 0, w[keep], keep, job, round);
        worker_add(names[lost], true, back); /* it comes back, idle, and is taken again */
        mge_sched_tick(g_s);
        ck_assert_int_eq(job_row(job).state, MGE_JOB_RUNNING);
        for (int k = 0; k < 3; k++) {
            struct mge_sched_cmds c;
            ck_assert_int_eq(beat(w[k], NULL, 0, NULL, 0, &c), MGE_OK);
            ck_assert_uint_eq(c.n_assign, 1);
            mge_sched_cmds_fini(&c);
        }
    }
    ck_assert_int_eq(job_row(job).attempt, 6);
    j = job_json(job);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "restarts")), 0);
    ck_assert_uint_eq(json_array_size(json_object_get(j, "incarnations")), 6);
    json_decref(j);
    /* failures of the job itself are charged: max_attempts 3 leaves two restarts */
    ck_assert_int_eq(mge_store_job_requeue(g_st, job, 6, "nan loss", true, &requeued), MGE_OK);
    ck_assert(requeued);
    ck_assert_int_eq(mge_store_job_requeue(g_st, job, 7, "nan loss", true, &requeued), MGE_OK);
    ck_assert(requeued);
    ck_assert_int_eq(mge_store_job_requeue(g_st, job, 8, "nan loss", true, &requeued), MGE_OK);
    ck_assert(!requeued);
    ck_assert_int_eq(job_row(job).state, MGE_JOB_FAILED);
    j = incarnation(job, 5);
    ck_assert(!json_is_true(json_object_get(j, "infra")));
    json_decref(j);
}
END_TEST

/*
 * Ranks 0..2 of attempt 1 of @job on @w report their end (cancelled: signal @sig); after a
 * placement pass the job runs again, incarnation 2 on @members ("w1,w3").
 */
static void reformed_on(char w[3][40], int64_t job, int sig, const char *members)
{
    json_t *inc;
    for (int k = 0; k < 3; k++) {
        struct mge_rank_report e = exited(job, 1, k, 0, sig);
        beat_quiet(w[k], &e, 1, NULL, 0);
    }
    mge_sched_tick(g_s);
    ck_assert_int_eq(job_row(job).state, MGE_JOB_RUNNING);
    inc = incarnation(job, 1);
    assert_members(inc, members);
    json_decref(inc);
}

/* Draining a member re-forms an elastic job without it while enough others remain; a
 * fixed-size job's ranks there finish normally. */
START_TEST(test_sched_elastic_drain)
{
    char w[3][40];
    json_t *out = NULL, *inc;
    int64_t job = elastic_placed(w);
    ck_assert_int_eq(mge_sched_worker_drain(g_s, "w2", &out), MGE_OK);
    json_decref(out);
    ck_assert_int_eq(job_row(job).attempt, 2);
    inc = incarnation(job, 0);
    ck_assert_str_eq(json_string_value(json_object_get(inc, "reason")),
                     "worker w2 drained at step 40");
    ck_assert(json_is_true(json_object_get(inc, "infra")));
    json_decref(inc);
    reformed_on(w, job, 15, "w1,w3");
    /* draining w3 now would leave one worker, fewer than min: the job runs on there */
    ck_assert_int_eq(mge_sched_worker_drain(g_s, "w3", &out), MGE_OK);
    json_decref(out);
    ck_assert_int_eq(job_row(job).attempt, 2);
    ck_assert_int_eq(job_row(job).state, MGE_JOB_RUNNING);
}
END_TEST

/* Requeues not charged stop at the safety net: a fault that recurs at once cannot loop. */
START_TEST(test_sched_elastic_infra_cap)
{
    bool requeued = false;
    int64_t job = job_add_workers("{min: 2, max: 3}", 1);
    for (int a = 1; a <= MGE_STORE_INFRA_RESTARTS_MAX; a++) {
        ck_assert_int_eq(
            mge_store_job_requeue(g_st, job, a, "worker w1: disk full", false, &requeued), MGE_OK);
        ck_assert(requeued);
    }
    ck_assert_int_eq(mge_store_job_requeue(g_st, job, MGE_STORE_INFRA_RESTARTS_MAX + 1,
                                           "worker w1: disk full", false, &requeued),
                     MGE_OK);
    ck_assert(!requeued);
    ck_assert_int_eq(job_row(job).state, MGE_JOB_FAILED);
}
END_TEST

/* The watchdog re-forms an elastic job (requeued, not failed), without the member that went
 * quiet when it knows one. */
START_TEST(test_sched_elastic_watchdog_reform)
{
    char w[3][40];
    struct mge_rank_report r[3];
    json_t *inc;
    int64_t job = elastic_placed(w);
    for (int k = 0; k < 3; k++)
        r[k] = running(job, 1, k);
    /* no step after 40 for 10 s; w3's heartbeats stopped 2 s before that */
    for (int t = 0; t < 10; t++) {
        g_now += 1000;
        beat_quiet(w[0], &r[0], 1, NULL, 0);
        beat_quiet(w[1], &r[1], 1, NULL, 0);
        if (t < 8)
            beat_quiet(w[2], &r[2], 1, NULL, 0);
        mge_sched_tick(g_s);
    }
    ck_assert_int_eq(job_row(job).attempt, 2);
    ck_assert_int_eq(job_row(job).state, MGE_JOB_QUEUED);
    inc = incarnation(job, 0);
    ck_assert_str_eq(json_string_value(json_object_get(inc, "ended")), "requeued");
    ck_assert(json_is_true(json_object_get(inc, "infra")));
    ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(inc, "reason")),
                                 "no progress for 10 s since step 40"));
    json_decref(inc);
    /* every rank ends (w3 is back in time); w3 is left out of the next incarnation */
    reformed_on(w, job, 9, "w1,w2");
}
END_TEST

/* ---- growing: a worker joins an elastic job that runs below its max ---- */

/* Rank 0 of @attempt of @job on @wid reports step @step (line @seq) and, when @ckpt, a
 * checkpoint of that step (line @seq + 1). */
static void step_at_cmds(const char *wid, int64_t job, int attempt, int64_t step, uint64_t seq,
                         bool ckpt, struct mge_sched_cmds *cmds);

static void step_at(const char *wid, int64_t job, int attempt, int64_t step, uint64_t seq,
                    bool ckpt)
{
    struct mge_sched_cmds cmds;
    step_at_cmds(wid, job, attempt, step, seq, ckpt, &cmds);
    mge_sched_cmds_fini(&cmds);
}

/* step_at, with the heartbeat's commands in *@cmds (caller finis). */
static void step_at_cmds(const char *wid, int64_t job, int attempt, int64_t step, uint64_t seq,
                         bool ckpt, struct mge_sched_cmds *cmds)
{
    char note[200], metric[64];
    struct mge_store_line l[2];
    struct mge_rank_report r = running(job, attempt, 0);
    snprintf(metric, sizeof(metric), "{\"step\":%lld,\"loss\":1.0}", (long long)step);
    snprintf(note, sizeof(note),
             "ckpt-%06lld.mgeckpt %lld 100 /w1/job-%lld/attempt-%d/rank-0/ckpt-%06lld.mgeckpt",
             (long long)step, (long long)step, (long long)job, attempt, (long long)step);
    l[0] = line(job, attempt, 0, seq, 2, metric, (int64_t)seq);
    l[1] = line(job, attempt, 0, seq + 1, 3, note, (int64_t)seq + 1);
    ck_assert_int_eq(beat(wid, &r, 1, l, ckpt ? 2 : 1, cmds), MGE_OK);
}

/* The job is in @state at attempt @attempt. */
static void assert_at(int64_t job, int state, int attempt)
{
    struct mge_job_row row = job_row(job);
    ck_assert_int_eq(row.state, state);
    ck_assert_int_eq(row.attempt, attempt);
}

/*
 * Attempt 1 of @job on w1, w2 was ended for a grow at its checkpoint of step 40: once both of
 * its ranks are reported ended (rank 1 by @w2_report: an exit, or nothing, when its worker no
 * longer runs it), attempt 2 runs on w1, w2, w3 from that checkpoint.
 */
static void grown_to_three(char w[3][40], int64_t job, bool w2_exit)
{
    struct mge_rank_report r = exited(job, 1, 1, 0, 15);
    struct mge_sched_cmds c;
    json_t *inc;
    char want[200];
    if (w2_exit)
        beat_quiet(w[1], &r, 1, NULL, 0);
    else
        beat_quiet(w[1], NULL, 0, NULL, 0);
    mge_sched_tick(g_s);
    assert_at(job, MGE_JOB_QUEUED, 2); /* rank 0 of attempt 1 still holds w1 */
    r = exited(job, 1, 0, 0, 15);
    beat_quiet(w[0], &r, 1, NULL, 0);
    mge_sched_tick(g_s);
    assert_at(job, MGE_JOB_RUNNING, 2);
    ck_assert_int_eq(beat(w[0], NULL, 0, NULL, 0, &c), MGE_OK);
    ck_assert_uint_eq(c.n_assign, 1);
    ck_assert_int_eq(c.assign[0].world, 3);
    snprintf(want, sizeof(want), "/w1/job-%lld/attempt-1/rank-0/ckpt-000040.mgeckpt",
             (long long)job);
    ck_assert_str_eq(c.assign[0].resume, want);
    mge_sched_cmds_fini(&c);
    assert_assigned_rank(w[1], job, 2, 1, 3);
    assert_assigned_rank(w[2], job, 2, 2, 3);
    inc = incarnation(job, 0);
    ck_assert_str_eq(json_string_value(json_object_get(inc, "ended")), "requeued");
    ck_assert(json_is_true(json_object_get(inc, "infra")));
    ck_assert_str_eq(json_string_value(json_object_get(inc, "reason")),
                     "worker w3 joined: growing at step 40; resized 2 -> 3");
    json_decref(inc);
    inc = incarnation(job, 1);
    assert_members(inc, "w1,w2,w3");
    ck_assert_int_eq(json_integer_value(json_object_get(inc, "start_step")), 40);
    json_decref(inc);
    inc = job_json(job);
    ck_assert_int_eq(json_integer_value(json_object_get(inc, "restarts")), 0);
    json_decref(inc);
}

/* A worker joins: the grow waits for the next checkpoint, then re-forms the job with it. */
START_TEST(test_sched_grow_at_checkpoint)
{
    char w[3][40];
    struct mge_rank_report r;
    struct mge_sched_cmds c;
    int64_t job = elastic_on(w, 2);
    step_at(w[0], job, 1, 20, 1, true);
    g_now += 1000;
    worker_add("w3", true, w[2]);
    mge_sched_tick(g_s);
    /* pending: nothing in flight is killed, and steps without a checkpoint change nothing */
    assert_at(job, MGE_JOB_RUNNING, 1);
    step_at(w[0], job, 1, 30, 3, false);
    mge_sched_tick(g_s);
    assert_at(job, MGE_JOB_RUNNING, 1);
    /* the commit boundary: attempt 1 ends (requeued), its ranks are cancelled */
    step_at(w[0], job, 1, 40, 5, true);
    assert_at(job, MGE_JOB_QUEUED, 2);
    r = running(job, 1, 1);
    ck_assert_int_eq(beat(w[1], &r, 1, NULL, 0, &c), MGE_OK);
    ck_assert(has_cancel(&c, job, 1));
    mge_sched_cmds_fini(&c);
    grown_to_three(w, job, true);
}
END_TEST

/* Queued jobs first: no grow takes a worker that a waiting job could use. */
START_TEST(test_sched_grow_queued_first)
{
    char w[3][40];
    int64_t job = elastic_on(w, 2), other = job_add(2, 2);
    worker_add("w3", true, w[2]);
    mge_sched_tick(g_s);
    assert_at(other, MGE_JOB_QUEUED, 1); /* it needs two free workers, one is */
    step_at(w[0], job, 1, 20, 1, true);
    mge_sched_tick(g_s);
    assert_at(job, MGE_JOB_RUNNING, 1);
    /* the waiting job is cancelled: the next checkpoint grows the elastic one */
    ck_assert_int_eq(mge_sched_job_cancel(g_s, other), MGE_OK);
    mge_sched_tick(g_s);
    step_at(w[0], job, 1, 40, 3, true);
    assert_at(job, MGE_JOB_QUEUED, 2);
}
END_TEST

/* With --grow 0 a joining worker waits for the next membership change. */
START_TEST(test_sched_grow_off)
{
    char w[3][40];
    int64_t job;
    mge_sched_free(g_s);
    g_no_grow = true;
    sched_start();
    job = elastic_on(w, 2);
    g_now += 1000;
    worker_add("w3", true, w[2]);
    mge_sched_tick(g_s);
    step_at(w[0], job, 1, 40, 1, true);
    mge_sched_tick(g_s);
    assert_at(job, MGE_JOB_RUNNING, 1);
}
END_TEST

/* No grow beyond max. */
START_TEST(test_sched_grow_not_beyond_max)
{
    char w[3][40], w4[40];
    int64_t job = elastic_placed(w);
    worker_add("w4", true, w4);
    mge_sched_tick(g_s);
    step_at(w[0], job, 1, 50, 10, true);
    mge_sched_tick(g_s);
    assert_at(job, MGE_JOB_RUNNING, 1); /* it has max = 3 ranks */
}
END_TEST

/* A pending grow is dropped when its worker is taken by a job submitted meanwhile. */
START_TEST(test_sched_grow_dropped)
{
    char w[3][40];
    int64_t job = elastic_on(w, 2), one;
    worker_add("w3", true, w[2]);
    mge_sched_tick(g_s); /* pending */
    one = job_add_tick(1, 2, MGE_JOB_RUNNING);
    assert_assigned(w[2], one, 1, NULL);
    step_at(w[0], job, 1, 40, 1, true);
    mge_sched_tick(g_s);
    assert_at(job, MGE_JOB_RUNNING, 1);
}
END_TEST

/*
 * kill -9 of the coordinator right after a membership change (a grow ended attempt 1 and
 * requeued the job; its ranks still run; attempt 2 is not placed): a new scheduler over the
 * same database fences the old ranks (cancels them), keeps their workers' slots until they
 * end (w2's ended while nobody listened: it no longer reports it), then places attempt 2.
 */
START_TEST(test_sched_restart_mid_change)
{
    char w[3][40];
    struct mge_rank_report r;
    struct mge_sched_cmds c;
    int64_t job = elastic_on(w, 2);
    g_now += 1000;
    worker_add("w3", true, w[2]);
    mge_sched_tick(g_s);
    step_at(w[0], job, 1, 40, 1, true);
    assert_at(job, MGE_JOB_QUEUED, 2);
    mge_sched_free(g_s);
    g_now += 500;
    sched_start();
    mge_sched_tick(g_s);
    assert_at(job, MGE_JOB_QUEUED, 2);
    r = running(job, 1, 0);
    ck_assert_int_eq(beat(w[0], &r, 1, NULL, 0, &c), MGE_OK);
    ck_assert(has_cancel(&c, job, 1));
    mge_sched_cmds_fini(&c);
    /* w3 was seen before the restart; it beats again */
    beat_quiet(w[2], NULL, 0, NULL, 0);
    grown_to_three(w, job, false);
}
END_TEST

/* The watchdog re-forms an elastic job without the worker whose rank is stopped, although
 * that worker still sends heartbeats. */
START_TEST(test_sched_elastic_watchdog_stopped_rank)
{
    char w[3][40];
    struct mge_rank_report r[3];
    int64_t job = elastic_placed(w);
    for (int k = 0; k < 3; k++) {
        r[k] = running(job, 1, k);
        r[k].cpu_ms = 100;
    }
    for (int t = 0; t < 10; t++) {
        g_now += 1000;
        r[0].cpu_ms += 1000;
        r[2].cpu_ms += 1000;
        r[1].stopped = true; /* rank 1, on w2 */
        for (int k = 0; k < 3; k++)
            beat_quiet(w[k], &r[k], 1, NULL, 0);
        mge_sched_tick(g_s);
    }
    ck_assert_int_eq(job_row(job).attempt, 2);
    json_t *inc = incarnation(job, 0);
    ck_assert_str_eq(json_string_value(json_object_get(inc, "reason")),
                     "no progress for 10 s since step 40 (rank 1 on w2 stopped) at step 40");
    json_decref(inc);
    reformed_on(w, job, 9, "w1,w3");
}
END_TEST

/* A restarted scheduler places nothing on a worker it has not heard from since (it would take
 * the ranks for lost when the worker registers again without them). */
START_TEST(test_sched_restart_unseen_worker)
{
    char w1[40], w2[40];
    int64_t job;
    worker_add("w1", false, w1);
    worker_add("w2", false, w2);
    mge_sched_free(g_s);
    sched_start();
    job = job_add_tick(1, 2, MGE_JOB_QUEUED);
    beat_quiet(w2, NULL, 0, NULL, 0);
    mge_sched_tick(g_s);
    assert_at(job, MGE_JOB_RUNNING, 1);
    assert_assigned(w2, job, 1, NULL);
}
END_TEST

/* After a restart an elastic job waits up to 3 s for the workers the store knows to register
 * again, then starts with those that did (not smaller at once, to grow right after). */
START_TEST(test_sched_restart_grace)
{
    char w1[40], w2[40];
    int64_t job, job2;
    worker_add("w1", true, w1);
    worker_add("w2", true, w2);
    mge_sched_free(g_s);
    sched_start();
    job = job_add_workers("{min: 1, max: 2}", 2);
    beat_quiet(w1, NULL, 0, NULL, 0);
    mge_sched_tick(g_s);
    assert_at(job, MGE_JOB_QUEUED, 1); /* w2 has not registered again yet */
    beat_quiet(w2, NULL, 0, NULL, 0);
    mge_sched_tick(g_s);
    assert_at(job, MGE_JOB_RUNNING, 1);
    assert_assigned_rank(w1, job, 1, 0, 2); /* both: no grow needed */
    /* a second restart: w2 stays silent; after the grace the job takes w1 alone */
    mge_sched_job_cancel(g_s, job);
    mge_sched_free(g_s);
    sched_start();
    job2 = job_add_workers("{min: 1, max: 2}", 2);
    beat_quiet(w1, NULL, 0, NULL, 0);
    mge_sched_tick(g_s);
    assert_at(job2, MGE_JOB_QUEUED, 1);
    g_now += 3000;
    beat_quiet(w1, NULL, 0, NULL, 0);
    mge_sched_tick(g_s);
    assert_at(job2, MGE_JOB_RUNNING, 1);
    assert_assigned_rank(w1, job2, 1, 0, 1);
}
END_TEST

/* ---- preemption: a checkpoint first ---- */

/* A priority-0 job runs on the only worker (w1, 2 CPUs), at step 30 with its last checkpoint
 * of step 20, when a priority-10 job of 2 CPUs arrives (*@high) and a pass runs; its id. */
static int64_t preempt_setup(char w1[40], int64_t *high)
{
    int64_t low;
    worker_add("w1", false, w1);
    low = job_add_priority(2, 0);
    mge_sched_tick(g_s);
    assert_at(low, MGE_JOB_RUNNING, 1);
    step_at(w1, low, 1, 20, 1, true);
    step_at(w1, low, 1, 30, 3, false);
    *high = job_add_priority(2, 10);
    g_now += 2000; /* a full cluster is scanned for preemptions once a second */
    mge_sched_tick(g_s);
    return low;
}

/* Incarnation 0 of @job ended requeued, not charged, for a preemption by @high: @detail in
 * its reason too, when not NULL. */
static void assert_preempted(int64_t job, int64_t high, const char *detail)
{
    char want[80];
    json_t *inc = incarnation(job, 0);
    const char *why = json_string_value(json_object_get(inc, "reason"));
    snprintf(want, sizeof(want), "preempted by job %lld (priority 10)", (long long)high);
    ck_assert_str_eq(json_string_value(json_object_get(inc, "ended")), "requeued");
    ck_assert(json_is_true(json_object_get(inc, "infra")));
    ck_assert_ptr_nonnull(why);
    ck_assert_msg(!strncmp(why, want, strlen(want)), "reason '%s'", why);
    if (detail)
        ck_assert_msg(strstr(why, detail) != NULL, "reason '%s' lacks '%s'", why, detail);
    json_decref(inc);
}

/* The preemption asks for a checkpoint and ends the job when one of its step or newer comes;
 * the high job runs once its rank has ended. */
START_TEST(test_sched_preempt_asks_checkpoint)
{
    char w1[40], note[200];
    int64_t high, low = preempt_setup(w1, &high);
    struct mge_rank_report r = running(low, 1, 0);
    struct mge_store_line l;
    struct mge_sched_cmds c;
    /* asked, not ended: rank 0's worker gets the request, nothing is cancelled */
    assert_at(low, MGE_JOB_RUNNING, 1);
    assert_at(high, MGE_JOB_QUEUED, 1);
    {
        struct mge_job_row row = job_row(high);
        char *why = mge_sched_pending_reason(g_s, &row), want[160];
        snprintf(want, sizeof(want),
                 "; preempting job %lld (checkpoint of step >= 30 asked 0 s ago, at most 30 s)",
                 (long long)low);
        ck_assert_ptr_nonnull(why);
        ck_assert_msg(strstr(why, want) != NULL, "pending reason '%s'", why);
        mge_free(why);
    }
    ck_assert_int_eq(beat(w1, &r, 1, NULL, 0, &c), MGE_OK);
    ck_assert_uint_eq(c.n_ckpt, 1);
    ck_assert_int_eq(c.ckpt[0].job_id, low);
    ck_assert_int_eq(c.ckpt[0].attempt, 1);
    ck_assert(!has_cancel(&c, low, 1));
    mge_sched_cmds_fini(&c);
    /* the next passes neither ask again nor end it */
    g_now += 2000;
    mge_sched_tick(g_s);
    ck_assert_int_eq(beat(w1, &r, 1, NULL, 0, &c), MGE_OK);
    ck_assert_uint_eq(c.n_ckpt, 0);
    ck_assert(!has_cancel(&c, low, 1));
    mge_sched_cmds_fini(&c);
    assert_at(low, MGE_JOB_RUNNING, 1);
    /* a checkpoint older than the step it had reached (reported late) changes nothing */
    snprintf(note, sizeof(note),
             "ckpt-000025.mgeckpt 25 100 /w1/job-%lld/attempt-1/rank-0/"
             "ckpt-000025.mgeckpt",
             (long long)low);
    l = line(low, 1, 0, 5, 3, note, 5);
    beat_quiet(w1, &r, 1, &l, 1);
    mge_sched_tick(g_s);
    assert_at(low, MGE_JOB_RUNNING, 1);
    /* the one it asked for ends it: requeued, not charged, its rank cancelled */
    step_at_cmds(w1, low, 1, 31, 6, true, &c);
    assert_at(low, MGE_JOB_QUEUED, 2);
    ck_assert(has_cancel(&c, low, 1));
    mge_sched_cmds_fini(&c);
    assert_preempted(low, high, NULL);
    /* its rank ends: the high job runs, the low one waits for it */
    r = exited(low, 1, 0, 0, 15);
    beat_quiet(w1, &r, 1, NULL, 0);
    g_now += 2000;
    mge_sched_tick(g_s);
    assert_at(high, MGE_JOB_RUNNING, 1);
    assert_at(low, MGE_JOB_QUEUED, 2);
}
END_TEST

/* No checkpoint within the deadline (30 s by default): the job is ended anyway. */
START_TEST(test_sched_preempt_deadline)
{
    char w1[40];
    int64_t high, low = preempt_setup(w1, &high);
    /* it trains on (a step a second: the watchdog is content) but writes no checkpoint */
    for (int t = 1; t <= 29; t++) {
        g_now += 1000;
        step_at(w1, low, 1, 30 + t, 3 + 2 * (uint64_t)t, false);
        mge_sched_tick(g_s);
    }
    assert_at(low, MGE_JOB_RUNNING, 1);
    g_now += 1500;
    step_at(w1, low, 1, 60, 100, false);
    mge_sched_tick(g_s);
    assert_at(low, MGE_JOB_QUEUED, 2);
    assert_preempted(low, high, "no checkpoint came within 30000 ms");
}
END_TEST

/* The job a preemption makes room for is cancelled while the victim writes its checkpoint: the
 * preemption is withdrawn, the victim trains on through its checkpoint and past the deadline,
 * and a new arrival preempts it again (its slots are not counted free twice). */
START_TEST(test_sched_preempt_withdrawn)
{
    char w1[40];
    int64_t high, high2, low = preempt_setup(w1, &high);
    struct mge_rank_report r = running(low, 1, 0);
    struct mge_sched_cmds c;
    ck_assert_int_eq(beat(w1, &r, 1, NULL, 0, &c), MGE_OK);
    ck_assert_uint_eq(c.n_ckpt, 1);
    mge_sched_cmds_fini(&c);
    ck_assert_int_eq(mge_sched_job_cancel(g_s, high), MGE_OK);
    g_now += 1000;
    mge_sched_tick(g_s);
    /* the checkpoint it was asked for comes: it does not end the job */
    step_at_cmds(w1, low, 1, 31, 6, true, &c);
    ck_assert(!has_cancel(&c, low, 1));
    mge_sched_cmds_fini(&c);
    assert_at(low, MGE_JOB_RUNNING, 1);
    /* nor does the deadline */
    for (int t = 1; t <= 40; t++) {
        g_now += 1000;
        step_at(w1, low, 1, 31 + t, 7 + (uint64_t)t, false);
        mge_sched_tick(g_s);
    }
    assert_at(low, MGE_JOB_RUNNING, 1);
    /* a new arrival preempts it again: asked for a checkpoint once more */
    high2 = job_add_priority(2, 10);
    g_now += 2000;
    mge_sched_tick(g_s);
    ck_assert_int_eq(beat(w1, &r, 1, NULL, 0, &c), MGE_OK);
    ck_assert_uint_eq(c.n_ckpt, 1);
    mge_sched_cmds_fini(&c);
    step_at_cmds(w1, low, 1, 80, 60, true, &c);
    ck_assert(has_cancel(&c, low, 1));
    mge_sched_cmds_fini(&c);
    assert_at(low, MGE_JOB_QUEUED, 2);
    assert_preempted(low, high2, NULL);
}
END_TEST

/* Asking off (mge-coordinator --preempt-checkpoint 0), or a job that has not run a step yet:
 * the job is ended at once and nothing is asked. */
START_TEST(test_sched_preempt_at_once)
{
    char w1[40];
    int64_t high, low;
    struct mge_sched_cmds c;
    if (_i == 0) {
        mge_sched_free(g_s);
        g_preempt_ms = -1;
        sched_start();
        low = preempt_setup(w1, &high);
    } else {
        struct mge_rank_report r;
        worker_add("w1", false, w1);
        low = job_add_priority(2, 0);
        mge_sched_tick(g_s);
        r = running(low, 1, 0);
        beat_quiet(w1, &r, 1, NULL, 0);
        high = job_add_priority(2, 10);
        g_now += 2000;
        mge_sched_tick(g_s);
    }
    assert_at(low, MGE_JOB_QUEUED, 2);
    assert_preempted(low, high, NULL);
    ck_assert_int_eq(beat(w1, NULL, 0, NULL, 0, &c), MGE_OK);
    ck_assert_uint_eq(c.n_ckpt, 0);
    mge_sched_cmds_fini(&c);
}
END_TEST

static Suite *sched_suite(void)
{
    Suite *s = suite_create("sched");
    struct {
        const char *name;
        const TTest *t;
        int loops;
    } cases[] = {
        {"place", test_sched_place_one_rank, 1},
        {"place_gang", test_sched_place_gang, 1},
        {"pending", test_sched_pending_reasons, 1},
        {"pending_eta_queue", test_sched_pending_eta_queue, 1},
        {"gpu_indexes", test_sched_gpu_indexes, 1},
        {"gpu_memory", test_sched_gpu_memory, 1},
        {"requeue", test_sched_requeue_worker_lost, 1},
        {"fence", test_sched_fence_stale_attempt, 1},
        {"fence_ended", test_sched_fence_ended_job, 1},
        {"watchdog", test_sched_watchdog,
         (int)(sizeof(watchdog_cases) / sizeof(watchdog_cases[0]))},
        {"watchdog_gang", test_sched_watchdog_gang, 1},
        {"watchdog_stopped", test_sched_watchdog_names_stopped_rank, 1},
        {"watchdog_idle", test_sched_watchdog_names_idle_rank, 1},
        {"watchdog_busy", test_sched_watchdog_no_rank_stands_out, 1},
        {"gang_killed", test_sched_gang_names_killed_rank, 1},
        {"gang_failed", test_sched_gang_names_failed_rank, 1},
        {"gang_abort", test_sched_gang_names_aborting_rank, 1},
        {"gang_plain", test_sched_gang_no_mpirun_message, 1},
        {"elastic_shrink", test_sched_elastic_shrink, 1},
        {"elastic_below_min", test_sched_elastic_waits_below_min, 1},
        {"elastic_infra", test_sched_elastic_infra_not_charged, 1},
        {"elastic_cap", test_sched_elastic_infra_cap, 1},
        {"elastic_drain", test_sched_elastic_drain, 1},
        {"elastic_watchdog", test_sched_elastic_watchdog_reform, 1},
        {"elastic_watchdog_stopped", test_sched_elastic_watchdog_stopped_rank, 1},
        {"grow", test_sched_grow_at_checkpoint, 1},
        {"grow_queued_first", test_sched_grow_queued_first, 1},
        {"grow_max", test_sched_grow_not_beyond_max, 1},
        {"grow_off", test_sched_grow_off, 1},
        {"grow_dropped", test_sched_grow_dropped, 1},
        {"restart_mid_change", test_sched_restart_mid_change, 1},
        {"restart_unseen", test_sched_restart_unseen_worker, 1},
        {"restart_grace", test_sched_restart_grace, 1},
        {"preempt_checkpoint", test_sched_preempt_asks_checkpoint, 1},
        {"preempt_deadline", test_sched_preempt_deadline, 1},
        {"preempt_at_once", test_sched_preempt_at_once, 2},
        {"preempt_withdrawn", test_sched_preempt_withdrawn, 1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_loop_test(tc, cases[i].t, 0, cases[i].loops);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    return mge_test_run(sched_suite());
}
