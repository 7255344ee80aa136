/* http_api.c: REST API, server-sent events and Prometheus metrics on libmicrohttpd. */
#include "http_api.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "common/lttb.h"
#include "ckpt_path.h"
#include "auth.h"
#include "rpc.h"
#include "sched.h"
#include "store.h"

#define MAX_OVERRIDES 64
#define SSE_BATCH 200
#define SSE_KEEPALIVE_MS 15000
#define SSE_TICK_S 1              /* how often due keepalives are looked for */

/* Routes, for latency histograms. */
enum route {
    R_HEALTHZ,
    R_METRICS,
    R_JOBS_POST,
    R_JOBS_LIST,
    R_JOB_GET,
    R_JOB_CANCEL,
    R_JOB_METRICS,
    R_JOB_LOGS,
    R_JOB_EVENTS,
    R_JOB_CKPTS,
    R_JOB_CKPT_GET,
    R_WORKERS,
    R_WORKER_DRAIN,
    R_WORKER_UNDRAIN,
    R_WEB,
    R_OTHER,
    R__COUNT
};
/* clang-format off */
static const char *const route_names[R__COUNT] = {
    "/healthz", "/metrics", "POST /jobs", "GET /jobs", "GET /jobs/{id}", "POST /jobs/{id}/cancel",
    "GET /jobs/{id}/metrics", "GET /jobs/{id}/logs", "GET /jobs/{id}/events",
    "GET /jobs/{id}/checkpoints", "GET /jobs/{id}/checkpoints/{name}", "GET /workers",
    "POST /workers/{id}/drain", "POST /workers/{id}/undrain", "GET /web", "other"};
/* clang-format on */
static const double buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1};
#define N_BUCKETS (sizeof(buckets) / sizeof(buckets[0]))

struct sse;

struct mge_http {
    struct MHD_Daemon *d;
    struct mge_store *st;
    struct mge_sched *sched;
    const struct mge_auth *auth;
    struct mge_rpc *rpc;
    char *web_root;               /* dashboard files; NULL: not served */
    struct mge_planner *planner;  /* NULL: jobs are not planned */
    int port;
    pthread_mutex_t mu;           /* guards stats, the SSE streams and their flags */
    uint64_t count[R__COUNT];
    uint64_t bucket[R__COUNT][N_BUCKETS];
    double sum[R__COUNT];
    struct sse *subs;             /* every live SSE stream */
    pthread_t keepalive;          /* resumes streams whose keepalive is due */
    bool stopping;
    pthread_cond_t cv;
};

/* Per-request state (MHD's con_cls). */
struct req {
    char *body;
    size_t len, cap;
    bool too_big;
    enum route route;
    struct timespec start;
};

/* Per-stream state of one SSE response. */
struct sse {
    struct mge_http *h;
    struct MHD_Connection *conn;
    int64_t job_id;
    int64_t last_id;
    char *buf;                    /* formatted, not yet sent */
    size_t len, off;
    bool ending;                  /* the job is finished and everything is sent */
    int64_t last_write;           /* monotonic ms */
    struct sse *next;             /* [h->mu] in h->subs */
    bool notified;                /* [h->mu] the store may have new events for it */
    bool suspended;               /* [h->mu] its connection waits for a notify or keepalive */
};

/* ---- responses ---- */

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *ctype,
                                 const char *text, size_t len)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    enum MHD_Result ret;
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"mge\"");
    ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r); /* the queue holds its own reference */
    return ret;
}

/* Send @o (stolen) as JSON. */
static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *o,
                                 const char *ctype)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    enum MHD_Result ret;
    json_decref(o);
    if (!s)
        return send_text(c, 500, "text/plain", "out of memory\n", 14);
    ret = send_text(c, status, ctype ? ctype : "application/json", s, strlen(s));
    free(s);
    return ret;
}

static json_t *problem_new(unsigned status, const char *type, const char *title,
                           const char *detail)
{
    char uri[128];
    snprintf(uri, sizeof(uri), "https://mge.dev/problems/%s", type);
    return json_pack("{s:s, s:s, s:i, s:s}", "type", uri, "title", title, "status", (int)status,
                     "detail", detail ? detail : title);
}

static enum MHD_Result send_problem(struct MHD_Connection *c, unsigned status, const char *type,
                                    const char *title, const char *detail)
{
    return send_json(c, status, problem_new(status, type, title, detail),
                     "application/problem+json");
}

/* ---- job submission ---- */

static bool ctype_is(const char *ct, const char *want)
{
    size_t n = strlen(want);
    return ct && !strncasecmp(ct, want, n) && (ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ');
}

int mge_http_parse_job(const char *content_type, const char *body, size_t len,
                       const char *const *overrides, int n_overrides, struct mge_jobspec **spec,
                       json_t **problem, int *status)
{
    struct mge_spec_error err;
    bool is_json = ctype_is(content_type, "application/json");
    int rc;

    *spec = NULL;
    *problem = NULL;
    *status = 0;
    if (!is_json && !ctype_is(content_type, "application/yaml") &&
        !ctype_is(content_type, "application/x-yaml") && !ctype_is(content_type, "text/yaml") &&
        !ctype_is(content_type, "text/x-yaml")) {
        *status = 415;
        *problem = problem_new(415, "unsupported-media-type", "Unsupported media type",
                               "send the job spec as application/yaml or application/json");
        return MGE_UNSUPPORTED;
    }
    if (len > MGE_HTTP_BODY_MAX) {
        *status = 413;
        *problem = problem_new(413, "too-large", "Request body too large",
                               "job specs are limited to 1 MiB");
        return MGE_TOOBIG;
    }
    if (memchr(body, '\0', len)) {
        *status = 400;
        *problem = problem_new(400, "malformed", "Malformed request body",
                               "the body contains a NUL byte");
        return MGE_FORMAT;
    }
    if (is_json) {
        /* JSON is a subset of YAML's flow style: checked as JSON for its own errors, then
         * validated by the same parser as YAML so lines and keys are reported alike. */
        json_error_t jerr;
        json_t *o = json_loadb(body, len, 0, &jerr);
        if (!json_is_object(o)) {
            char detail[300];
            snprintf(detail, sizeof(detail), "line %d: %s", jerr.line,
                     o ? "expected a JSON object" : jerr.text);
            json_decref(o);
            *status = 400;
            *problem = problem_new(400, "malformed", "Malformed JSON", detail);
            if (*problem)
                json_object_set_new(*problem, "line", json_integer(o ? 1 : jerr.line));
            return MGE_FORMAT;
        }
        json_decref(o);
    }
    memset(&err, 0, sizeof(err));
    rc = mge_jobspec_parse("<request>", body, len, overrides, n_overrides, spec, &err);
    if (rc == MGE_OK)
        return MGE_OK;
    if (rc == MGE_SPEC || rc == MGE_FORMAT) {
        *status = rc == MGE_SPEC ? 422 : 400;
        *problem = problem_new(*status, rc == MGE_SPEC ? "invalid-spec" : "malformed",
                               rc == MGE_SPEC ? "Invalid job spec" : "Malformed YAML",
                               err.message[0] ? err.message : mge_strerror(rc));
        if (*problem) {
            json_object_set_new(*problem, "key", json_string(err.key));
            json_object_set_new(*problem, "line", json_integer(err.line));
            if (err.column)
                json_object_set_new(*problem, "column", json_integer(err.column));
        }
        return rc;
    }
    *status = 500;
    *problem = problem_new(500, "internal", "Internal error", mge_strerror(rc));
    return rc;
}

struct overrides {
    const char *v[MAX_OVERRIDES];
    int n;
    bool too_many;
    int nul_at;                   /* 1-based index of a set= value holding a NUL byte, or 0 */
};

static enum MHD_Result collect_set(void *cls, enum MHD_ValueKind kind, const char *key,
                                   size_t key_size, const char *value, size_t value_size)
{
    struct overrides *o = cls;
    (void)kind;
    if (key_size != 3 || memcmp(key, "set", 3) != 0 || !value)
        return MHD_YES;
    if (o->n == MAX_OVERRIDES) {
        o->too_many = true;
        return MHD_NO;
    }
    o->v[o->n++] = value;
    /* "%00" decodes to a NUL that would cut the value short without a word: refuse it */
    if (memchr(value, '\0', value_size)) {
        o->nul_at = o->n;
        return MHD_NO;
    }
    return MHD_YES;
}

/*
 * The memory plan job *@spec is placed by (see planner.h). MGE_OK: *@plan_json (mge_free; NULL
 * when planning is off) and *@plan_mb (MiB per worker the scheduler reserves) are set, and
 * *@spec may have been replaced by one with memory.budget_mb set: a job with memory.sublinear:
 * auto whose plain plan fits no worker runs with recomputation under the largest worker's
 * memory. MGE_BUDGET: it fits no worker even so, and @detail says by how much. A job that
 * cannot be planned here (its data lies outside the coordinator's --plan-data-root) is placed
 * by its slots alone, and its plan says why.
 */
static int plan_job(struct mge_http *h, const char *ct, const struct req *rq,
                    const struct overrides *ov, struct mge_jobspec **spec, char **plan_json,
                    int64_t *plan_mb, char *detail, size_t dlen)
{
    struct mge_job_plan p;
    char why[600], need[32], have[32], sub[32], set[64];
    /* a GPU job's activations live in device memory: its plan is checked against the GPUs */
    bool gpu = (*spec)->resources.device == MGE_DEVICE_GPU;
    int64_t max_mb =
        gpu ? mge_sched_gpu_memory_max_mb(h->sched) : mge_sched_memory_max_mb(h->sched);
    int64_t max_b = max_mb << 20;
    const char *how = "as planned", *largest = gpu ? "GPU" : "worker";
    json_t *o;
    int rc;

    *plan_json = NULL;
    *plan_mb = 0;
    if (!h->planner)
        return MGE_OK;
    if (mge_planner_run(h->planner, (*spec)->source, &p, why, sizeof(why)) != MGE_OK) {
        o = json_pack("{s:s}", "error", why);
        goto out;
    }
    if (max_mb > 0 && p.chosen_bytes > max_b) {
        struct mge_jobspec *s2 = NULL;
        struct mge_job_plan p2;
        json_t *problem = NULL;
        const char *v[MAX_OVERRIDES + 1];
        int status;
        bool fits = false;
        if ((*spec)->memory.sublinear == MGE_SUBLINEAR_AUTO && (*spec)->memory.budget_mb == 0 &&
            p.sublinear_bytes <= max_b) {
            memcpy(v, ov->v, (size_t)ov->n * sizeof(v[0]));
            snprintf(set, sizeof(set), "memory.budget_mb=%lld", (long long)max_mb);
            v[ov->n] = set;
            if (mge_http_parse_job(ct, rq->body ? rq->body : "", rq->len, v, ov->n + 1, &s2,
                                   &problem, &status) == MGE_OK &&
                mge_planner_run(h->planner, s2->source, &p2, why, sizeof(why)) == MGE_OK) {
                fits = p2.chosen_bytes <= max_b;
                if (fits) {
                    mge_jobspec_free(*spec);
                    *spec = s2;
                    s2 = NULL;
                    mge_job_plan_fini(&p);
                    p = p2;
                    how = gpu ? "with recomputation (memory.sublinear: auto): the plain plan "
                                "fits no GPU"
                              : "with recomputation (memory.sublinear: auto): the plain plan "
                                "fits no worker";
                } else {
                    mge_job_plan_fini(&p2);
                }
            }
            json_decref(problem);
            mge_jobspec_free(s2);
        }
        if (!fits) {
            snprintf(detail, dlen,
                     "needs %s per rank at batch %d; the largest %s has %s; with "
                     "recomputation %s%s",
                     mge_bytes_human(p.plain_bytes, need, sizeof(need)), (*spec)->train.batch_size,
                     largest, mge_bytes_human(max_b, have, sizeof(have)),
                     mge_bytes_human(p.sublinear_bytes, sub, sizeof(sub)),
                     p.sublinear_bytes <= max_b ? ": set memory.sublinear: auto"
                                                : ": still too large (lower train.batch_size)");
            mge_job_plan_fini(&p);
            return MGE_BUDGET;
        }
    }
    *plan_mb = (p.chosen_bytes + (1 << 20) - 1) >> 20;
    o = json_pack("{s:I, s:s, s:I, s:I, s:I, s:i, s:s, s:I}", "peak_bytes_per_rank",
                  (json_int_t)p.chosen_bytes, "mode", p.chosen_mode, "plain_bytes",
                  (json_int_t)p.plain_bytes, "sublinear_bytes", (json_int_t)p.sublinear_bytes,
                  "reserved_mb", (json_int_t)*plan_mb, "batch", (*spec)->train.batch_size, "placed",
                  how, gpu ? "largest_gpu_mb" : "largest_worker_mb", (json_int_t)max_mb);
    mge_job_plan_fini(&p);
out:
    if (!o)
        return MGE_NOMEM;
    rc = (*plan_json = json_dumps(o, JSON_COMPACT)) ? MGE_OK : MGE_NOMEM;
    json_decref(o);
    return rc;
}

static enum MHD_Result jobs_post(struct mge_http *h, struct MHD_Connection *c, struct req *rq)
{
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    struct overrides ov = {.n = 0};
    struct mge_jobspec *spec = NULL;
    json_t *problem = NULL;
    char *spec_json, *plan_json = NULL;
    int64_t id = 0, plan_mb = 0;
    int status, rc;
    char loc[64];
    struct MHD_Response *r;
    char *s;
    enum MHD_Result ret;

    MHD_get_connection_values_n(c, MHD_GET_ARGUMENT_KIND, collect_set, &ov);
    if (ov.too_many)
        return send_problem(c, 400, "bad-request", "Too many overrides",
                            "at most 64 set= parameters");
    if (ov.nul_at) {
        char detail[160];
        snprintf(detail, sizeof(detail), "set= parameter %d contains a NUL byte after '%.64s'",
                 ov.nul_at, ov.v[ov.nul_at - 1]);
        return send_problem(c, 400, "malformed", "Malformed set= parameter", detail);
    }
    rc = mge_http_parse_job(ct, rq->body ? rq->body : "", rq->len, ov.v, ov.n, &spec, &problem,
                            &status);
    if (rc != MGE_OK)
        return send_json(c, (unsigned)status, problem, "application/problem+json");
    {
        char detail[512];
        rc = plan_job(h, ct, rq, &ov, &spec, &plan_json, &plan_mb, detail, sizeof(detail));
        if (rc != MGE_OK) {
            mge_jobspec_free(spec);
            if (rc == MGE_BUDGET)
                return send_problem(c, 422, "does-not-fit", "The job fits no worker", detail);
            return send_problem(c, 500, "internal", "Cannot plan the job", mge_strerror(rc));
        }
    }
    spec_json = mge_jobspec_to_json(spec);
    rc = mge_store_job_insert_planned(
        h->st, spec, spec_json ? spec_json : "{}",
        mge_jobspec_total_steps(spec, spec->data.train_size > 0 ? spec->data.train_size : 60000),
        plan_json, plan_mb, &id);
    mge_free(spec_json);
    free(plan_json);
    mge_jobspec_free(spec);
    if (rc != MGE_OK)
        return send_problem(c, 500, "internal", "Cannot store the job", mge_strerror(rc));
    mge_sched_kick(h->sched);
    {
        json_t *o = json_pack("{s:I, s:s}", "id", (json_int_t)id, "state", "queued");
        s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
    }
    if (!s)
        return send_problem(c, 500, "internal", "Out of memory", NULL);
    r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_COPY);
    free(s);
    if (!r)
        return MHD_NO;
    snprintf(loc, sizeof(loc), "/api/v1/jobs/%lld", (long long)id);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(r, MHD_HTTP_HEADER_LOCATION, loc);
    ret = MHD_queue_response(c, 201, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- reads ---- */

static bool parse_i64(const char *s, int64_t *out)
{
    char *end;
    long long v;
    if (!s || !*s)
        return false;
    v = strtoll(s, &end, 10);
    if (*end)
        return false;
    *out = v;
    return true;
}

static enum MHD_Result jobs_list(struct mge_http *h, struct MHD_Connection *c)
{
    const char *state = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "state");
    const char *lim = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
    const char *cur = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "cursor");
    int64_t limit = 50, cursor = 0, next = 0;
    int st = -1;
    json_t *arr, *o;
    char nc[32];

    if (state && *state && (st = mge_job_state_parse(state)) < 0)
        return send_problem(c, 400, "bad-request", "Unknown state",
                            "state is one of queued, running, succeeded, failed, cancelled");
    if (lim && (!parse_i64(lim, &limit) || limit < 1 || limit > 1000))
        return send_problem(c, 400, "bad-request", "Bad limit", "limit is 1..1000");
    if (cur && *cur && (!parse_i64(cur, &cursor) || cursor < 0))
        return send_problem(c, 400, "bad-request", "Bad cursor", "use next_cursor as given");
    if (mge_store_job_list(h->st, st, cursor, (int)limit, &arr, &next) != MGE_OK)
        return send_problem(c, 500, "internal", "Cannot list jobs", NULL);
    snprintf(nc, sizeof(nc), "%lld", (long long)next);
    o = json_pack("{s:o, s:o}", "jobs", arr, "next_cursor", next ? json_string(nc) : json_null());
    return send_json(c, 200, o, NULL);
}

static enum MHD_Result job_get(struct mge_http *h, struct MHD_Connection *c, int64_t id)
{
    json_t *o;
    int rc = mge_store_job_get(h->st, id, &o);
    struct mge_job_row row;
    if (rc == MGE_NOENT)
        return send_problem(c, 404, "not-found", "No such job", NULL);
    if (rc != MGE_OK)
        return send_problem(c, 500, "internal", "Cannot read the job", mge_strerror(rc));
    if (mge_store_job_row(h->st, id, &row) == MGE_OK && row.state == MGE_JOB_QUEUED) {
        char *reason = mge_sched_pending_reason(h->sched, &row);
        json_object_set_new(o, "pending_reason", reason ? json_string(reason) : json_null());
        mge_free(reason);
    } else {
        json_object_set_new(o, "pending_reason", json_null());
    }
    return send_json(c, 200, o, NULL);
}

static enum MHD_Result job_cancel(struct mge_http *h, struct MHD_Connection *c, int64_t id)
{
    int rc = mge_sched_job_cancel(h->sched, id);
    struct mge_job_row row;
    if (rc == MGE_NOENT)
        return send_problem(c, 404, "not-found", "No such job", NULL);
    if (rc == MGE_STATE) {
        char detail[128];
        const char *st = "finished";
        if (mge_store_job_row(h->st, id, &row) == MGE_OK)
            st = mge_job_state_name(row.state);
        snprintf(detail, sizeof(detail), "the job is already %s", st);
        return send_problem(c, 409, "conflict", "Job already finished", detail);
    }
    if (rc != MGE_OK)
        return send_problem(c, 500, "internal", "Cannot cancel the job", mge_strerror(rc));
    return send_json(c, 200, json_pack("{s:I, s:s}", "id", (json_int_t)id, "state", "cancelled"),
                     NULL);
}

static bool job_exists(struct mge_http *h, int64_t id)
{
    struct mge_job_row row;
    return mge_store_job_row(h->st, id, &row) == MGE_OK;
}

/*
 * Downsample each name's run of @arr (sorted by name, then step) to at most @max_points
 * points with LTTB over (step, value). Returns a new array, or NULL when out of memory.
 */
static json_t *metrics_downsample(json_t *arr, size_t max_points)
{
    size_t n = json_array_size(arr), i = 0, cap = 0;
    double *x = NULL, *y = NULL;
    size_t *idx = NULL;
    json_t *out = json_array();

    while (out && i < n) {
        const char *name = json_string_value(json_object_get(json_array_get(arr, i), "name"));
        size_t j = i, len, k;
        while (j < n) {
            const char *nj = json_string_value(json_object_get(json_array_get(arr, j), "name"));
            if (!name || !nj || strcmp(name, nj) != 0)
                break;
            j++;
        }
        if (j == i)
            j = i + 1; /* a row without a name: keep it alone */
        len = j - i;
        if (len > cap) {
            mge_free(x);
            mge_free(y);
            mge_free(idx);
            cap = len;
            x = mge_malloc(cap * sizeof(*x));
            y = mge_malloc(cap * sizeof(*y));
            idx = mge_malloc(cap * sizeof(*idx));
            if (!x || !y || !idx) {
                json_decref(out);
                out = NULL;
                break;
            }
        }
        for (size_t r = 0; r < len; r++) {
            json_t *m = json_array_get(arr, i + r);
            x[r] = (double)json_integer_value(json_object_get(m, "step"));
            y[r] = json_number_value(json_object_get(m, "value"));
        }
        k = mge_lttb(x, y, len, max_points, idx);
        for (size_t r = 0; r < k; r++)
            json_array_append(out, json_array_get(arr, i + idx[r]));
        i = j;
    }
    mge_free(x);
    mge_free(y);
    mge_free(idx);
    return out;
}

static enum MHD_Result job_metrics(struct mge_http *h, struct MHD_Connection *c, int64_t id)
{
    const char *name = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "name");
    const char *since = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "since_step");
    const char *maxp = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "max_points");
    int64_t since_step = -1, max_points = 0, last_event = 0;
    json_t *o;
    if (since && !parse_i64(since, &since_step))
        return send_problem(c, 400, "bad-request", "Bad since_step", "an integer step");
    if (maxp && (!parse_i64(maxp, &max_points) || max_points < 3 || max_points > 1000000))
        return send_problem(c, 400, "bad-request", "Bad max_points", "max_points is 3..1000000");
    if (!job_exists(h, id))
        return send_problem(c, 404, "not-found", "No such job", NULL);
    /* read the event id first: a stream resumed from it repeats, never misses, a point */
    if (mge_store_events_last_id(h->st, id, &last_event) != MGE_OK)
        return send_problem(c, 500, "internal", "Cannot read events", NULL);
    if (mge_store_metrics(h->st, id, name && *name ? name : NULL, since_step, &o) != MGE_OK)
        return send_problem(c, 500, "internal", "Cannot read metrics", NULL);
    if (max_points > 0) {
        json_t *all = json_object_get(o, "metrics");
        json_t *ds = metrics_downsample(all, (size_t)max_points);
        if (!ds) {
            json_decref(o);
            return send_problem(c, 500, "internal", "Out of memory", NULL);
        }
        json_object_set_new(o, "total", json_integer((json_int_t)json_array_size(all)));
        json_object_set_new(o, "metrics", ds);
    }
    json_object_set_new(o, "last_event_id", json_integer((json_int_t)last_event));
    return send_json(c, 200, o, NULL);
}

static enum MHD_Result job_logs(struct mge_http *h, struct MHD_Connection *c, int64_t id)
{
    const char *rank_s = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "rank");
    const char *tail_s = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "tail");
    int64_t rank = -1, tail = 1000;
    json_t *o;
    if (rank_s && (!parse_i64(rank_s, &rank) || rank < 0 || rank > 100000))
        return send_problem(c, 400, "bad-request", "Bad rank", "a rank number >= 0");
    if (tail_s && (!parse_i64(tail_s, &tail) || tail < 1 || tail > 100000))
        return send_problem(c, 400, "bad-request", "Bad tail", "tail is 1..100000");
    if (!job_exists(h, id))
        return send_problem(c, 404, "not-found", "No such job", NULL);
    if (mge_store_logs(h->st, id, (int)rank, (int)tail, &o) != MGE_OK)
        return send_problem(c, 500, "internal", "Cannot read logs", NULL);
    return send_json(c, 200, o, NULL);
}

static enum MHD_Result job_checkpoints(struct mge_http *h, struct MHD_Connection *c, int64_t id)
{
    json_t *arr;
    if (!job_exists(h, id))
        return send_problem(c, 404, "not-found", "No such job", NULL);
    if (mge_store_checkpoints(h->st, id, &arr) != MGE_OK)
        return send_problem(c, 500, "internal", "Cannot read checkpoints", NULL);
    return send_json(c, 200, json_pack("{s:o}", "checkpoints", arr), NULL);
}

static enum MHD_Result job_checkpoint_get(struct mge_http *h, struct MHD_Connection *c, int64_t id,
                                          const char *name)
{
    char *path = NULL, disp[300];
    struct stat sb;
    struct MHD_Response *r;
    enum MHD_Result ret;
    const char *base;
    int fd;
    if (!job_exists(h, id))
        return send_problem(c, 404, "not-found", "No such job", NULL);
    if (mge_store_checkpoint_path(h->st, id, name, &path) != MGE_OK)
        return send_problem(c, 404, "not-found", "No such checkpoint", NULL);
    fd = mge_ckpt_path_open(id, path); /* no symlink below the work dir, a plain file */
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        if (fd >= 0)
            close(fd);
        mge_free(path);
        /* NEEDSWORK: fetch from the worker when it is on another host */
        return send_problem(c, 404, "not-found", "Checkpoint not reachable",
                            "the checkpoint file is not readable from the coordinator host");
    }
    base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(disp, sizeof(disp), "attachment; filename=\"%.200s\"", base);
    mge_free(path);
    r = MHD_create_response_from_fd((uint64_t)sb.st_size, fd); /* owns fd from here */
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_DISPOSITION, disp);
    ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result workers_list(struct mge_http *h, struct MHD_Connection *c)
{
    json_t *arr = mge_sched_workers_json(h->sched);
    if (!arr)
        return send_problem(c, 500, "internal", "Out of memory", NULL);
    return send_json(c, 200, json_pack("{s:o}", "workers", arr), NULL);
}

/* POST /workers/{id}/drain and /undrain (@on: drain) */
static enum MHD_Result worker_drain(struct mge_http *h, struct MHD_Connection *c, const char *id,
                                    bool on)
{
    json_t *o;
    int rc =
        on ? mge_sched_worker_drain(h->sched, id, &o) : mge_sched_worker_undrain(h->sched, id, &o);
    if (rc == MGE_NOENT)
        return send_problem(c, 404, "not-found", "No such worker", NULL);
    if (rc != MGE_OK || !o)
        return send_problem(c, 500, "internal",
                            on ? "Cannot drain the worker" : "Cannot undrain the worker", NULL);
    return send_json(c, 200, o, NULL);
}

/* ---- server-sent events ---- */

/*
 * How a stream waits (no polling): a stream with nothing to send suspends its connection and
 * sits in h->subs until the store's events hook (sse_notify, called by every commit that adds
 * events to its job: the ingest path, state changes) or the keepalive timer resumes it. A
 * resumed stream reads the store once; 500 idle subscribers cost no query at all.
 */

/* Events of job @job_id were committed: resume its streams. The store's events hook. */
static void sse_notify(void *arg, int64_t job_id)
{
    struct mge_http *h = arg;
    pthread_mutex_lock(&h->mu);
    for (struct sse *e = h->subs; e; e = e->next) {
        if (e->job_id != job_id)
            continue;
        e->notified = true;
        if (e->suspended) {
            e->suspended = false;
            MHD_resume_connection(e->conn);
        }
    }
    pthread_mutex_unlock(&h->mu);
}

/* Suspend @e until a notify or its keepalive, unless a notify came meanwhile (then false). */
static bool sse_wait(struct sse *e)
{
    bool waiting;
    pthread_mutex_lock(&e->h->mu);
    waiting = !e->notified && !e->h->stopping;
    if (waiting) {
        /* under h->mu: a notify cannot resume it before it is suspended */
        MHD_suspend_connection(e->conn);
        e->suspended = true;
    }
    pthread_mutex_unlock(&e->h->mu);
    return waiting;
}

static int sse_fill(struct sse *e)
{
    json_t *arr = NULL, *ev;
    size_t i, cap = 0;
    struct mge_job_row row;
    int rc = mge_store_events(e->h->st, e->job_id, e->last_id, SSE_BATCH, &arr);
    if (rc != MGE_OK)
        return rc;
    e->len = e->off = 0;
    json_array_foreach(arr, i, ev)
    {
        char *data = json_dumps(json_object_get(ev, "data"), JSON_COMPACT);
        int64_t id = json_integer_value(json_object_get(ev, "id"));
        const char *kind = json_string_value(json_object_get(ev, "kind"));
        size_t need = (data ? strlen(data) : 2) + 128;
        if (e->len + need > cap) {
            char *nb;
            cap = (e->len + need) * 2;
            nb = mge_realloc(e->buf, cap);
            if (!nb) {
                free(data);
                break;
            }
            e->buf = nb;
        }
        e->len += (size_t)snprintf(e->buf + e->len, cap - e->len, "id: %lld\nevent: %s\ndata: %s\n\n",
                                   (long long)id, kind ? kind : "message", data ? data : "{}");
        e->last_id = id;
        free(data);
    }
    if (json_array_size(arr) == 0) {
        rc = mge_store_job_row(e->h->st, e->job_id, &row);
        if (rc == MGE_OK && mge_job_state_is_terminal(row.state))
            e->ending = true;
    }
    json_decref(arr);
    return rc;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct sse *e = cls;
    size_t n;
    (void)pos;
    while (e->off == e->len) {
        bool stopping, query;
        pthread_mutex_lock(&e->h->mu);
        stopping = e->h->stopping;
        query = e->notified;
        e->notified = false;
        pthread_mutex_unlock(&e->h->mu);
        if (stopping)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (query) {
            if (sse_fill(e) != MGE_OK)
                return MHD_CONTENT_READER_END_WITH_ERROR;
            if (e->len > 0) {
                /* a full batch may have more behind it, and an end is seen on an empty read */
                pthread_mutex_lock(&e->h->mu);
                e->notified = true;
                pthread_mutex_unlock(&e->h->mu);
                break;
            }
            if (e->ending)
                return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (mge_mono_ms() - e->last_write >= SSE_KEEPALIVE_MS) {
            static const char ka[] = ": keepalive\n\n";
            n = sizeof(ka) - 1 < max ? sizeof(ka) - 1 : max;
            memcpy(buf, ka, n);
            e->last_write = mge_mono_ms();
            return (ssize_t)n;
        }
        if (sse_wait(e))
            return 0;
    }
    n = e->len - e->off < max ? e->len - e->off : max;
    memcpy(buf, e->buf + e->off, n);
    e->off += n;
    e->last_write = mge_mono_ms();
    return (ssize_t)n;
}

static void sse_free(void *cls)
{
    struct sse *e = cls;
    struct mge_http *h = e->h;
    pthread_mutex_lock(&h->mu);
    for (struct sse **p = &h->subs; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            break;
        }
    pthread_mutex_unlock(&h->mu);
    mge_free(e->buf);
    mge_free(e);
}

/* Resume the suspended streams whose keepalive is due (or all, when stopping). */
static void *sse_keepalive(void *arg)
{
    struct mge_http *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        struct timespec ts;
        int64_t now = mge_mono_ms();
        for (struct sse *e = h->subs; e; e = e->next)
            if (e->suspended && (h->stopping || now - e->last_write >= SSE_KEEPALIVE_MS)) {
                e->suspended = false;
                MHD_resume_connection(e->conn);
            }
        if (h->stopping)
            break;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += SSE_TICK_S;
        pthread_cond_timedwait(&h->cv, &h->mu, &ts);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static enum MHD_Result job_events(struct mge_http *h, struct MHD_Connection *c, int64_t id)
{
    const char *last = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
    struct MHD_Response *r;
    struct sse *e;
    enum MHD_Result ret;
    int64_t last_id = 0;
    if (!last)
        last = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "last_event_id");
    if (last && *last && !parse_i64(last, &last_id))
        return send_problem(c, 400, "bad-request", "Bad Last-Event-ID", "an event id");
    if (!job_exists(h, id))
        return send_problem(c, 404, "not-found", "No such job", NULL);
    e = mge_calloc(1, sizeof(*e));
    if (!e)
        return MHD_NO;
    e->h = h;
    e->conn = c;
    e->job_id = id;
    e->last_id = last_id;
    e->last_write = mge_mono_ms();
    e->notified = true; /* the first read looks */
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, e, sse_free);
    if (!r) {
        mge_free(e);
        return MHD_NO;
    }
    pthread_mutex_lock(&h->mu);
    e->next = h->subs;
    h->subs = e;
    pthread_mutex_unlock(&h->mu);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- /metrics ---- */

static enum MHD_Result prom_metrics(struct mge_http *h, struct MHD_Connection *c)
{
    int64_t counts[MGE_JOB__NSTATES];
    struct mge_sched_stats ss;
    char *buf;
    size_t cap = 65536, len = 0;
    enum MHD_Result ret;
#define P(...)                                                                                 \
    do {                                                                                       \
        if (len < cap)                                                                         \
            len += (size_t)snprintf(buf + len, cap - len, __VA_ARGS__);                        \
    } while (0)
    buf = mge_malloc(cap);
    if (!buf)
        return MHD_NO;
    mge_store_job_counts(h->st, counts);
    mge_sched_stats_get(h->sched, &ss);
    P("# HELP mge_jobs Jobs by state.\n# TYPE mge_jobs gauge\n");
    for (int i = 0; i < MGE_JOB__NSTATES; i++)
        P("mge_jobs{state=\"%s\"} %lld\n", mge_job_state_name(i), (long long)counts[i]);
    P("# HELP mge_queue_length Jobs waiting to be placed.\n# TYPE mge_queue_length gauge\n");
    P("mge_queue_length %lld\n", (long long)counts[MGE_JOB_QUEUED]);
    P("# HELP mge_workers Workers by state.\n# TYPE mge_workers gauge\n");
    P("mge_workers{state=\"ready\"} %d\n", ss.workers_ready);
    P("mge_workers{state=\"draining\"} %d\n", ss.workers_draining);
    P("mge_workers{state=\"lost\"} %d\n", ss.workers_lost);
    P("# HELP mge_ranks_running Ranks placed and not yet ended.\n# TYPE mge_ranks_running gauge\n");
    P("mge_ranks_running %d\n", ss.ranks_running);
    P("# HELP mge_worker_requests_total Frames received from workers.\n"
      "# TYPE mge_worker_requests_total counter\n");
    P("mge_worker_requests_total %llu\n", (unsigned long long)mge_rpc_requests(h->rpc));
    P("# HELP mge_fenced_total Worker reports dropped: not the current attempt's placement on\n"
      "# that worker (a stale attempt), or output after the job ended.\n"
      "# TYPE mge_fenced_total counter\n");
    P("mge_fenced_total{what=\"lines\"} %llu\n", (unsigned long long)mge_store_lines_fenced(h->st));
    P("mge_fenced_total{what=\"ranks\"} %llu\n", (unsigned long long)ss.fenced_reports);
    P("# HELP mge_http_request_duration_seconds API request latency.\n"
      "# TYPE mge_http_request_duration_seconds histogram\n");
    pthread_mutex_lock(&h->mu);
    for (int r = 0; r < R__COUNT; r++) {
        uint64_t cum = 0;
        if (!h->count[r])
            continue;
        for (size_t b = 0; b < N_BUCKETS; b++) {
            cum += h->bucket[r][b];
            P("mge_http_request_duration_seconds_bucket{route=\"%s\",le=\"%g\"} %llu\n",
              route_names[r], buckets[b], (unsigned long long)cum);
        }
        P("mge_http_request_duration_seconds_bucket{route=\"%s\",le=\"+Inf\"} %llu\n",
          route_names[r], (unsigned long long)h->count[r]);
        P("mge_http_request_duration_seconds_sum{route=\"%s\"} %.6f\n", route_names[r],
          h->sum[r]);
        P("mge_http_request_duration_seconds_count{route=\"%s\"} %llu\n", route_names[r],
          (unsigned long long)h->count[r]);
    }
    pthread_mutex_unlock(&h->mu);
#undef P
    if (len >= cap)
        len = cap - 1;
    ret = send_text(c, 200, "text/plain; version=0.0.4", buf, len);
    mge_free(buf);
    return ret;
}

/* ---- the dashboard: static files under the web root ---- */

static const char *web_content_type(const char *path)
{
    static const struct {
        const char *ext, *type;
    } types[] = {
        {".html", "text/html; charset=utf-8"}, {".js", "text/javascript; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},   {".json", "application/json"},
        {".svg", "image/svg+xml"},             {".png", "image/png"},
        {".ico", "image/x-icon"},              {".txt", "text/plain; charset=utf-8"},
        {".map", "application/json"},
    };
    const char *dot = strrchr(path, '.');
    for (size_t i = 0; dot && i < sizeof(types) / sizeof(types[0]); i++)
        if (!strcmp(dot, types[i].ext))
            return types[i].type;
    return "application/octet-stream";
}

/* A request path we serve: [A-Za-z0-9._-/] only, no empty, "." or ".." segment, no dotfile. */
static bool web_path_ok(const char *p)
{
    const char *seg = p;
    if (!*p || strlen(p) > 200)
        return false;
    for (const char *q = p;; q++) {
        if (*q == '/' || *q == '\0') {
            if (q == seg || *seg == '.')
                return false;
            if (!*q)
                return true;
            seg = q + 1;
        } else if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') ||
                     (*q >= '0' && *q <= '9') || *q == '.' || *q == '_' || *q == '-')) {
            return false;
        }
    }
}

/* Open @root/@rel (+ @suffix) read-only if it is a regular file; -1 otherwise. */
static int web_open(const char *root, const char *rel, const char *suffix, struct stat *sb)
{
    char path[4096];
    int fd, n = snprintf(path, sizeof(path), "%s/%s%s", root, rel, suffix);
    if (n < 0 || (size_t)n >= sizeof(path))
        return -1;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -1;
    if (fstat(fd, sb) != 0 || !S_ISREG(sb->st_mode)) {
        close(fd);
        return -1;
    }
    return fd;
}

/*
 * Serve a dashboard file. No token is needed: the files are public and hold no data; the
 * page asks for the token and sends it only to /api/v1 in a header. A precompressed
 * FILE.gz next to FILE is sent when the client accepts gzip.
 */
static enum MHD_Result web_file(struct mge_http *h, struct MHD_Connection *c, const char *url)
{
    const char *rel = url[0] == '/' ? url + 1 : url;
    const char *ae = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_ACCEPT_ENCODING);
    struct MHD_Response *r;
    struct stat sb;
    bool gz = false;
    enum MHD_Result ret;
    int fd = -1;

    if (!*rel)
        rel = "index.html";
    if (!h->web_root) {
        static const char msg[] = "mge-coordinator: the dashboard is not built or not found;\n"
                                  "run 'make web' or start with --web-root DIR\n";
        return send_text(c, 404, "text/plain; charset=utf-8", msg, sizeof(msg) - 1);
    }
    if (!web_path_ok(rel))
        return send_problem(c, 404, "not-found", "No such route", NULL);
    if (ae && strstr(ae, "gzip")) {
        fd = web_open(h->web_root, rel, ".gz", &sb);
        gz = fd >= 0;
    }
    if (fd < 0)
        fd = web_open(h->web_root, rel, "", &sb);
    if (fd < 0)
        return send_problem(c, 404, "not-found", "No such route", NULL);
    r = MHD_create_response_from_fd((uint64_t)sb.st_size, fd); /* owns fd from here */
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, web_content_type(rel));
    if (gz)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_ENCODING, "gzip");
    MHD_add_response_header(r, MHD_HTTP_HEADER_VARY, "Accept-Encoding");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "X-Frame-Options", "DENY");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'self'; script-src 'self'; style-src 'self' "
                            "'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self'; "
                            "object-src 'none'; base-uri 'none'; frame-ancestors 'none'");
    ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

/* ---- dispatch ---- */

static enum mge_role request_role(struct mge_http *h, struct MHD_Connection *c)
{
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!a || strncasecmp(a, "Bearer ", 7) != 0)
        return MGE_ROLE_NONE;
    a += 7;
    while (*a == ' ')
        a++;
    return mge_auth_check(h->auth, a, strlen(a));
}

/* Split "/api/v1/jobs/12/cancel" after the prefix into up to 4 segments. */
static int split(const char *path, char seg[4][160])
{
    int n = 0;
    while (*path == '/')
        path++;
    while (*path && n < 4) {
        const char *e = strchr(path, '/');
        size_t len = e ? (size_t)(e - path) : strlen(path);
        if (len >= 160)
            return -1;
        memcpy(seg[n], path, len);
        seg[n][len] = '\0';
        n++;
        path += len;
        while (*path == '/')
            path++;
    }
    return *path ? -1 : n;
}

static enum MHD_Result method_not_allowed(struct MHD_Connection *c)
{
    return send_problem(c, 405, "method-not-allowed", "Method not allowed", NULL);
}

static enum MHD_Result dispatch(struct mge_http *h, struct MHD_Connection *c, const char *url,
                                const char *method, struct req *rq)
{
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool post = !strcmp(method, "POST");
    char seg[4][160];
    enum mge_role role;
    int n;
    int64_t id;

    if (!strcmp(url, "/healthz")) {
        rq->route = R_HEALTHZ;
        return get ? send_text(c, 200, "application/json", "{\"status\":\"ok\"}", 15)
                   : method_not_allowed(c);
    }
    if (strcmp(url, "/metrics") != 0 && strncmp(url, "/api/v1/", 8) != 0 &&
        strcmp(url, "/api/v1") != 0) {
        rq->route = R_WEB;
        return get ? web_file(h, c, url) : send_problem(c, 404, "not-found", "No such route", url);
    }
    role = request_role(h, c);
    if (role == MGE_ROLE_NONE)
        return send_problem(c, 401, "unauthorized", "Missing or unknown bearer token",
                            "send Authorization: Bearer TOKEN");
    if (!get && role != MGE_ROLE_ADMIN)
        return send_problem(c, 403, "forbidden", "Read-only token",
                            "this token may only read; changes need the admin token");
    if (rq->too_big)
        return send_problem(c, 413, "too-large", "Request body too large",
                            "request bodies are limited to 1 MiB");
    if (!strcmp(url, "/metrics")) {
        rq->route = R_METRICS;
        return get ? prom_metrics(h, c) : method_not_allowed(c);
    }
    n = split(url + 8, seg);
    if (n < 1)
        return send_problem(c, 404, "not-found", "No such route", url);
    if (!strcmp(seg[0], "jobs")) {
        if (n == 1) {
            rq->route = post ? R_JOBS_POST : R_JOBS_LIST;
            return post ? jobs_post(h, c, rq) : get ? jobs_list(h, c) : method_not_allowed(c);
        }
        if (!parse_i64(seg[1], &id) || id <= 0)
            return send_problem(c, 404, "not-found", "No such job", "job ids are integers");
        if (n == 2) {
            rq->route = R_JOB_GET;
            return get ? job_get(h, c, id) : method_not_allowed(c);
        }
        if (n == 3 && !strcmp(seg[2], "cancel")) {
            rq->route = R_JOB_CANCEL;
            return post ? job_cancel(h, c, id) : method_not_allowed(c);
        }
        if (n == 3 && !strcmp(seg[2], "metrics")) {
            rq->route = R_JOB_METRICS;
            return get ? job_metrics(h, c, id) : method_not_allowed(c);
        }
        if (n == 3 && !strcmp(seg[2], "logs")) {
            rq->route = R_JOB_LOGS;
            return get ? job_logs(h, c, id) : method_not_allowed(c);
        }
        if (n == 3 && !strcmp(seg[2], "events")) {
            rq->route = R_JOB_EVENTS;
            return get ? job_events(h, c, id) : method_not_allowed(c);
        }
        if (n == 3 && !strcmp(seg[2], "checkpoints")) {
            rq->route = R_JOB_CKPTS;
            return get ? job_checkpoints(h, c, id) : method_not_allowed(c);
        }
        if (n == 4 && !strcmp(seg[2], "checkpoints")) {
            rq->route = R_JOB_CKPT_GET;
            return get ? job_checkpoint_get(h, c, id, seg[3]) : method_not_allowed(c);
        }
    } else if (!strcmp(seg[0], "workers")) {
        if (n == 1) {
            rq->route = R_WORKERS;
            return get ? workers_list(h, c) : method_not_allowed(c);
        }
        if (n == 3 && !strcmp(seg[2], "drain")) {
            rq->route = R_WORKER_DRAIN;
            return post ? worker_drain(h, c, seg[1], true) : method_not_allowed(c);
        }
        if (n == 3 && !strcmp(seg[2], "undrain")) {
            rq->route = R_WORKER_UNDRAIN;
            return post ? worker_drain(h, c, seg[1], false) : method_not_allowed(c);
        }
    }
    return send_problem(c, 404, "not-found", "No such route", url);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    struct mge_http *h = cls;
    struct req *rq = *con_cls;
    (void)version;

    if (!rq) {
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        rq = mge_calloc(1, sizeof(*rq));
        if (!rq)
            return MHD_NO;
        rq->route = R_OTHER;
        clock_gettime(CLOCK_MONOTONIC, &rq->start);
        *con_cls = rq;
        if (cl && strtoull(cl, NULL, 10) > MGE_HTTP_BODY_MAX) {
            /* refuse before reading: the connection is closed after this response */
            rq->too_big = true;
            return send_problem(c, 413, "too-large", "Request body too large",
                                "request bodies are limited to 1 MiB");
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (rq->too_big || rq->len + n > MGE_HTTP_BODY_MAX) {
            rq->too_big = true;
            return MHD_YES;
        }
        if (rq->len + n + 1 > rq->cap) {
            size_t nc = (rq->len + n + 1) * 2;
            char *nb = mge_realloc(rq->body, nc);
            if (!nb)
                return MHD_NO;
            rq->body = nb;
            rq->cap = nc;
        }
        memcpy(rq->body + rq->len, upload_data, n);
        rq->len += n;
        rq->body[rq->len] = '\0';
        return MHD_YES;
    }
    return dispatch(h, c, url, method, rq);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct mge_http *h = cls;
    struct req *rq = *con_cls;
    struct timespec now;
    double dt;
    (void)c;
    (void)toe;
    if (!rq)
        return;
    clock_gettime(CLOCK_MONOTONIC, &now);
    dt = (double)(now.tv_sec - rq->start.tv_sec) + (double)(now.tv_nsec - rq->start.tv_nsec) / 1e9;
    pthread_mutex_lock(&h->mu);
    h->count[rq->route]++;
    h->sum[rq->route] += dt;
    for (size_t b = 0; b < N_BUCKETS; b++)
        if (dt <= buckets[b]) {
            h->bucket[rq->route][b]++;
            break;
        }
    pthread_mutex_unlock(&h->mu);
    mge_free(rq->body);
    mge_free(rq);
    *con_cls = NULL;
}

/*
 * libmicrohttpd's own error messages (a failed TLS handshake, e.g. a plain-HTTP client on the
 * HTTPS port, or a client without the CA) as our log lines, not bare lines on stderr.
 */
static void mhd_log(void *arg, const char *fmt, va_list ap)
{
    char msg[512];
    size_t n;
    (void)arg;
    vsnprintf(msg, sizeof(msg), fmt, ap);
    n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
        msg[--n] = '\0';
    mge_log_info("libmicrohttpd: %s", msg);
}

int mge_http_start(const struct mge_http_opts *opts, struct mge_store *st, struct mge_sched *sched,
                   const struct mge_auth *auth, struct mge_rpc *rpc, struct mge_http **out)
{
    struct mge_http *h;
    struct sockaddr_in sa;
    const union MHD_DaemonInfo *info;
    unsigned threads = opts->threads > 0 ? (unsigned)opts->threads : 4;
    bool tls = opts->tls_cert && opts->tls_key;
    struct MHD_OptionItem tls_opts[] = {
        {tls ? MHD_OPTION_HTTPS_MEM_KEY : MHD_OPTION_END, 0, (void *)opts->tls_key},
        {MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)opts->tls_cert},
        {MHD_OPTION_END, 0, NULL},
    };

    *out = NULL;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)opts->port);
    if (inet_pton(AF_INET, opts->host, &sa.sin_addr) != 1)
        return MGE_ERR(MGE_INVAL, "bad listen address '%s' (an IPv4 address)", opts->host);
    h = mge_calloc(1, sizeof(*h));
    if (!h)
        return MGE_NOMEM;
    h->st = st;
    h->sched = sched;
    h->auth = auth;
    h->rpc = rpc;
    if (opts->web_root) {
        struct stat sb;
        if (stat(opts->web_root, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            h->web_root = mge_strdup(opts->web_root);
            if (!h->web_root) {
                mge_free(h);
                return MGE_NOMEM;
            }
        } else {
            mge_log_warn("dashboard not served: '%s' is not a directory (make web)",
                         opts->web_root);
        }
    }
    if (opts->planner.bin && mge_planner_new(&opts->planner, &h->planner) != MGE_OK) {
        mge_free(h->web_root);
        mge_free(h);
        return MGE_NOMEM;
    }
    if (tls && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        mge_free(h->web_root);
        mge_planner_free(h->planner);
        mge_free(h);
        return MGE_ERR(MGE_UNSUPPORTED, "--tls-cert given, but this libmicrohttpd was built "
                                        "without TLS (GnuTLS): cannot serve HTTPS");
    }
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    /* TLS: the whole port speaks it; a plain-HTTP client gets no HTTP answer */
    h->d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
            MHD_USE_ERROR_LOG | (tls ? MHD_USE_TLS : 0),
        0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_THREAD_POOL_SIZE, threads,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)1000, MHD_OPTION_ARRAY, tls_opts, MHD_OPTION_END);
    if (!h->d) {
        pthread_mutex_destroy(&h->mu);
        pthread_cond_destroy(&h->cv);
        mge_free(h->web_root);
        mge_planner_free(h->planner);
        mge_free(h);
        return MGE_ERR(MGE_NET, "cannot listen on %s:%d", opts->host, opts->port);
    }
    info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = info ? info->port : opts->port;
    if (pthread_create(&h->keepalive, NULL, sse_keepalive, h) != 0) {
        MHD_stop_daemon(h->d);
        mge_free(h->web_root);
        mge_planner_free(h->planner);
        mge_free(h);
        return MGE_ERR(MGE_INTERNAL, "cannot start the event thread");
    }
    mge_store_on_events(st, sse_notify, h);
    mge_log_info("%s api on %s:%d (%u threads)%s%s", tls ? "https" : "http", opts->host, h->port,
                 threads, h->web_root ? ", dashboard from " : "", h->web_root ? h->web_root : "");
    *out = h;
    return MGE_OK;
}

int mge_http_port(const struct mge_http *h) { return h->port; }

void mge_http_stop(struct mge_http *h)
{
    if (!h)
        return;
    mge_store_on_events(h->st, NULL, NULL);
    /* suspended connections must be resumed before the daemon stops: the keepalive thread
     * resumes them all on its way out, and none suspends again once stopping is set */
    pthread_mutex_lock(&h->mu);
    h->stopping = true;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->keepalive, NULL);
    MHD_stop_daemon(h->d);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    mge_free(h->web_root);
    mge_planner_free(h->planner);
    mge_free(h);
}
