/* sched.c: worker registry, reservations and the gang scheduler (see sched.h). */
#include "sched.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/jobspec.h"
#include "common/log.h"

#define QUEUE_SCAN_MAX 256        /* queued jobs looked at per placement pass */
#define CANCEL_RESEND_MS 3000     /* resend a cancel to a rank that still runs after this */
#define PROGRESS_IV_MAX 64        /* step-report intervals kept for the watchdog's median */
#define PROGRESS_MEDIAN_X 5       /* no report for this many median intervals: a hang */
#define ETA_WINDOW_MS 5000        /* an attempt's speed for ETAs: over its last 5-10 s */
#define GROW_NAMES_MAX 3          /* workers a grow's reason names */
/* after the cancel grace: how long a next incarnation waits for the ranks of the one before it
 * to end (prev_attempt_live) */
#define PREV_WAIT_MS 5000
/* after a restart: how long an elastic job waits for the workers the store knows to register
 * again (each does at its next heartbeat) before it starts with fewer (restart_grace) */
#define RESTART_GRACE_MS 3000
#define PREEMPT_SCAN_MS 1000 /* a full cluster's queue is read this often (preemption) */

enum worker_state { W_READY, W_DRAINING, W_LOST };
static const char *const worker_state_names[] = {"ready", "draining", "lost"};

struct worker {
    char id[40], name[128], host[128], version[32], device[8];
    char launch_url[300];         /* "" when it cannot take multi-rank jobs */
    char launch_cert[MGE_SCHED_CERT_MAX]; /* a tls+tcp:// launch socket's certificate: told at
                                           * each registration, not stored */
    int cpus, gpus;
    struct mge_gpu gpu[MGE_GPUS_MAX]; /* [0, gpus): each GPU's name and memory */
    int64_t memory_mb;
    enum worker_state state;
    int64_t last_seen;            /* monotonic ms */
    int64_t last_seen_wall;       /* wall ms, for the API */
    struct mge_sched_assign *assign; /* queued, owned */
    size_t n_assign, cap_assign;
    struct mge_sched_cancel *cancel;
    size_t n_cancel, cap_cancel;
    struct mge_sched_ckpt_req *ckpt; /* queued checkpoint requests (preemption) */
    size_t n_ckpt, cap_ckpt;
    int64_t fault_job;            /* the last attempt a worker fault ended here: job, */
    int fault_attempt;            /* attempt (job_worker_fault, worker_avoided) */
    int64_t joined;               /* scheduler ms of its last registration (0: loaded) */
    bool seen;                    /* it registered or sent a heartbeat since this scheduler
                                     started: only then does it get new ranks (worker_takes) */
    bool drain;                   /* an operator drained it: it stays draining when it is lost
                                     and comes back, and across restarts, until undrained */
};

/* Step progress of an attempt, as rank 0's metric lines tell it (kept on rank 0's resv). */
struct progress {
    int64_t since;                /* scheduler ms: placement, then the last step report */
    int64_t step;                 /* last step reported, -1 before the first */
    int64_t last_line_ms;         /* the worker's time of that report (wall ms) */
    int64_t iv[PROGRESS_IV_MAX];  /* ms between consecutive reports (the worker's clock) */
    int n_iv, next_iv;
    int64_t step0, line_ms0;  /* the speed for ETAs: from this report (the first, then
                                 the start of the last window of >= ETA_WINDOW_MS) ... */
    int64_t win_step, win_ms; /* ... to now; the window being filled starts here */
};

/* One placed rank. */
struct resv {
    int64_t job_id;
    int attempt, rank, world;
    int widx;                     /* index into workers */
    int cpus, gpus;
    uint64_t gpu_mask; /* the worker's GPUs it holds (bit i: GPU i), gpus of them */
    int64_t memory_mb;
    int64_t total_steps;          /* the job's, for the ETA of its end (0: unknown) */
    int priority;                 /* the job's: a queued job of a higher one may preempt it */
    bool exited;                  /* the worker reported its end (and it is stored) */
    int exit_code, term_signal;
    bool finished;                /* the attempt is decided: succeeded, failed or cancelled */
    int64_t cancel_sent;          /* monotonic ms of the last cancel, 0 if none */
    char token[40];               /* the attempt's launch token (world > 1) */
    bool failing;                 /* a rank of this gang ended badly: the rest are torn down */
    char fail_reason[256];        /* why, when failing */
    struct progress prog;         /* rank 0: the attempt's step progress (the watchdog) */
    bool stopped;                 /* the worker's last report: a process of it is stopped */
    int64_t cpu_ms;               /* ... the CPU time of its process group (0: unknown) */
    int64_t cpu_mark;             /* @cpu_ms when the attempt last made progress */
    int64_t placed;               /* scheduler ms of the placement (or of the restart) */
    int64_t ended_at;             /* scheduler ms the attempt was decided, 0 before */
    int grow_to;                  /* rank 0: grow to this many ranks at the next checkpoint,
                                     0 when no grow is pending (grow_plan) */
    char grow_why[200];           /* rank 0, grow pending: "worker w4 joined" */
    int64_t preempt_at;           /* every rank: scheduler ms a preemption asked the attempt
                                     for a checkpoint (it ends when that comes), 0: none */
    int64_t preempt_step;         /* rank 0: its step then; a checkpoint this new ends it */
    char preempt_why[160];        /* rank 0: "preempted by job 7 (priority 10)" */
    int64_t preempt_by;           /* rank 0: the job the preemption makes room for (7) ... */
    int preempt_by_attempt;       /* ... in this attempt of it: while it waits for the room */
};

/* A requeue the store could not write: the job stays running there until a retry succeeds. */
struct requeue_retry {
    int64_t job_id;
    int attempt;
    char reason[256];
};

struct mge_sched {
    struct mge_store *st;
    struct mge_sched_opts opts;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool stop, dirty;
    struct worker *w;
    size_t n_w, cap_w;
    struct resv *r;
    size_t n_r, cap_r;
    struct requeue_retry *retry;  /* retried every periodic tick (250 ms) */
    size_t n_retry, cap_retry;
    uint64_t fenced;              /* exits and ranks refused: not the current placement */
    int64_t started;              /* scheduler ms when it started (restart_grace) */
    int64_t full_scan;            /* scheduler ms of the last pass over a full cluster */
};

/* The scheduler's clock (ms, monotonic unless a test gives its own). */
static int64_t now_ms(const struct mge_sched *s)
{
    return s->opts.now_ms ? s->opts.now_ms(s->opts.now_arg) : mge_mono_ms();
}

static void assign_fini(struct mge_sched_assign *a)
{
    mge_free(a->spec_yaml);
    mge_free(a->resume);
    mge_free(a->resume_copy);
    mge_free(a->peers);
}

void mge_sched_cmds_fini(struct mge_sched_cmds *c)
{
    for (size_t i = 0; i < c->n_assign; i++)
        assign_fini(&c->assign[i]);
    mge_free(c->assign);
    mge_free(c->cancel);
    mge_free(c->acks);
    mge_free(c->ckpt);
    memset(c, 0, sizeof(*c));
}

static int worker_find(struct mge_sched *s, const char *id)
{
    for (size_t i = 0; i < s->n_w; i++)
        if (!strcmp(s->w[i].id, id))
            return (int)i;
    return -1;
}

static int worker_find_name(struct mge_sched *s, const char *name)
{
    for (size_t i = 0; i < s->n_w; i++)
        if (!strcmp(s->w[i].name, name))
            return (int)i;
    return -1;
}

static struct resv *resv_find(struct mge_sched *s, int64_t job, int attempt, int rank)
{
    for (size_t i = 0; i < s->n_r; i++)
        if (s->r[i].job_id == job && s->r[i].attempt == attempt && s->r[i].rank == rank)
            return &s->r[i];
    return NULL;
}

/* Every GPU of @w, as a mask. */
static uint64_t gpus_all(const struct worker *w)
{
    if (w->gpus <= 0)
        return 0;
    return w->gpus >= MGE_GPUS_MAX ? ~(uint64_t)0 : ((uint64_t)1 << w->gpus) - 1;
}

/*
 * The GPUs a rank of @j gets of @w's free ones @free: j->gpus of those with at least
 * j->gpu_memory_mb each, the smallest such first (the large ones stay for jobs that need
 * them), then by index; 0 when there are not enough (or @j needs none).
 */
static uint64_t gpu_pick(const struct worker *w, const struct mge_job_row *j, uint64_t free)
{
    uint64_t got = 0;
    for (int k = 0; k < j->gpus; k++) {
        int best = -1;
        for (int i = 0; i < w->gpus && i < MGE_GPUS_MAX; i++) {
            if (!(free >> i & 1) || (got >> i & 1) || w->gpu[i].memory_mb < j->gpu_memory_mb)
                continue;
            if (best < 0 || w->gpu[i].memory_mb < w->gpu[best].memory_mb)
                best = i;
        }
        if (best < 0)
            return 0;
        got |= (uint64_t)1 << best;
    }
    return got;
}

/* Free slots of worker @wi: total minus what its live ranks hold. */
static void worker_free(const struct mge_sched *s, int wi, int *cpus, uint64_t *gpus, int64_t *mem,
                        int *ranks)
{
    struct worker *w = &s->w[wi];
    *cpus = w->cpus;
    *gpus = gpus_all(w);
    *mem = w->memory_mb;
    if (ranks)
        *ranks = 0;
    for (size_t i = 0; i < s->n_r; i++) {
        if (s->r[i].widx != wi || s->r[i].exited)
            continue;
        *cpus -= s->r[i].cpus;
        *gpus &= ~s->r[i].gpu_mask;
        *mem -= s->r[i].memory_mb;
        if (ranks)
            (*ranks)++;
    }
}

static bool worker_usable(const struct worker *w) { return w->state == W_READY; }

/* Whether @w may get new ranks: ready, and heard from since this scheduler started. A restarted
 * coordinator knows the workers from the store, but one that has not re-registered yet would
 * report the ranks placed on it meanwhile as not running, and they would be taken for lost. */
static bool worker_takes(const struct worker *w)
{
    return worker_usable(w) && w->seen;
}

/* Can @w take a rank of a multi-worker job: a launch socket, and for a tls+tcp:// one the
 * certificate it registered with (a worker loaded from the store has none until it registers
 * again). */
static bool worker_launches(const struct worker *w)
{
    return w->launch_url[0] && (strncmp(w->launch_url, "tls+tcp://", 10) != 0 || w->launch_cert[0]);
}

/* Could worker @w hold one rank of @j, counting its slots @cpus/@gpus (free GPUs)/@mem? */
static bool fits(const struct worker *w, const struct mge_job_row *j, int cpus, uint64_t gpus,
                 int64_t mem)
{
    if (j->device == MGE_DEVICE_GPU && strcmp(w->device, "gpu") != 0)
        return false;
    return cpus >= j->cpus && (j->gpus <= 0 || gpu_pick(w, j, gpus) != 0) &&
           (j->memory_mb <= 0 || mem >= j->memory_mb);
}

static void notify(struct mge_sched *s, int wi)
{
    if (s->opts.notify)
        s->opts.notify(s->opts.notify_arg, s->w[wi].id);
}

static void queue_cancel(struct mge_sched *s, int wi, int64_t job, int attempt)
{
    struct worker *w = &s->w[wi];
    for (size_t i = 0; i < w->n_cancel; i++)
        if (w->cancel[i].job_id == job && w->cancel[i].attempt == attempt)
            return;
    if (mge_array_grow((void **)&w->cancel, &w->cap_cancel, w->n_cancel + 1, sizeof(*w->cancel)) != MGE_OK)
        return; /* NEEDSWORK: retried by the resend in the next heartbeat */
    w->cancel[w->n_cancel].job_id = job;
    w->cancel[w->n_cancel].attempt = attempt;
    w->n_cancel++;
    notify(s, wi);
}

/* Ask worker @wi for a checkpoint of (@job, @attempt) by its rank 0 (in its next reply). */
static void queue_ckpt(struct mge_sched *s, int wi, int64_t job, int attempt)
{
    struct worker *w = &s->w[wi];
    for (size_t i = 0; i < w->n_ckpt; i++)
        if (w->ckpt[i].job_id == job && w->ckpt[i].attempt == attempt)
            return;
    if (mge_array_grow((void **)&w->ckpt, &w->cap_ckpt, w->n_ckpt + 1, sizeof(*w->ckpt)) != MGE_OK)
        return; /* the preemption then ends the attempt at its deadline */
    w->ckpt[w->n_ckpt].job_id = job;
    w->ckpt[w->n_ckpt].attempt = attempt;
    w->n_ckpt++;
    notify(s, wi);
}

/* Mark attempt (@job, @attempt) decided; cancel its ranks that still run. */
static void attempt_finish(struct mge_sched *s, int64_t job, int attempt, bool cancel_live)
{
    int64_t now = now_ms(s);
    for (size_t i = 0; i < s->n_r; i++) {
        struct resv *r = &s->r[i];
        if (r->job_id != job || (attempt > 0 && r->attempt != attempt))
            continue;
        r->finished = true;
        if (!r->ended_at)
            r->ended_at = now;
        if (cancel_live && !r->exited && r->widx >= 0 && s->w[r->widx].state != W_LOST) {
            r->cancel_sent = now;
            queue_cancel(s, r->widx, job, r->attempt);
        }
    }
}

/* Whether the Assign of reservation @r waits in its worker @w's queue. */
static bool assign_queued(const struct worker *w, const struct resv *r)
{
    for (size_t i = 0; i < w->n_assign; i++)
        if (w->assign[i].job_id == r->job_id && w->assign[i].attempt == r->attempt &&
            w->assign[i].rank == r->rank)
            return true;
    return false;
}

/* Queue (again) the Assign of reservation @r to its worker, unless already queued. */
static int queue_assign(struct mge_sched *s, struct resv *r)
{
    struct worker *w = &s->w[r->widx];
    struct mge_sched_assign *a;
    char *spec = NULL, *resume = NULL, *resume_copy = NULL;
    int rc;
    if (assign_queued(w, r))
        return MGE_OK;
    rc = mge_store_job_spec(s->st, r->job_id, &spec);
    if (rc != MGE_OK)
        return rc;
    if (r->attempt > 1)
        mge_store_checkpoint_latest(s->st, r->job_id, &resume); /* none: start over */
    if (r->attempt > 1 && r->rank == 0)
        mge_store_checkpoint_copy_latest(s->st, r->job_id, &resume_copy);
    rc = mge_array_grow((void **)&w->assign, &w->cap_assign, w->n_assign + 1, sizeof(*w->assign));
    if (rc != MGE_OK) {
        mge_free(spec);
        mge_free(resume);
        mge_free(resume_copy);
        return rc;
    }
    a = &w->assign[w->n_assign];
    memset(a, 0, sizeof(*a));
    if (r->world > 1 && r->rank == 0) {
        /* rank 0's worker runs mpirun: it needs every rank's worker, in rank order */
        a->peers = mge_calloc((size_t)r->world, sizeof(*a->peers));
        if (!a->peers) {
            mge_free(spec);
            mge_free(resume);
            mge_free(resume_copy);
            return MGE_NOMEM;
        }
        a->n_peers = (size_t)r->world;
        for (size_t i = 0; i < s->n_r; i++) {
            const struct resv *o = &s->r[i];
            if (o->job_id != r->job_id || o->attempt != r->attempt || o->rank < 0 ||
                o->rank >= r->world || o->widx < 0)
                continue;
            a->peers[o->rank].rank = o->rank;
            snprintf(a->peers[o->rank].name, sizeof(a->peers[o->rank].name), "%s",
                     s->w[o->widx].name);
            snprintf(a->peers[o->rank].launch_url, sizeof(a->peers[o->rank].launch_url), "%s",
                     s->w[o->widx].launch_url);
            snprintf(a->peers[o->rank].launch_cert, sizeof(a->peers[o->rank].launch_cert), "%s",
                     s->w[o->widx].launch_cert);
        }
    }
    w->n_assign++;
    a->job_id = r->job_id;
    a->attempt = r->attempt;
    a->rank = r->rank;
    a->world = r->world;
    a->spec_yaml = spec;
    a->resume = resume;
    a->resume_copy = resume_copy;
    snprintf(a->launch_token, sizeof(a->launch_token), "%s", r->token);
    mge_gpu_mask_format(r->gpu_mask, a->gpu_ids, sizeof(a->gpu_ids));
    notify(s, r->widx);
    return MGE_OK;
}

/* A fresh launch token for a gang: 128 random bits as hex. */
static void token_new(char out[40])
{
    unsigned char b[16] = {0};
    size_t got = 0;
    while (got < sizeof(b)) { /* Linux >= 3.17; blocks only before the pool is seeded */
        ssize_t n = getrandom(b + got, sizeof(b) - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            mge_log_error("getrandom: %s: launch token is weak", strerror(errno));
            break;
        }
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof(b); i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static void resv_gc(struct mge_sched *s)
{
    size_t k = 0;
    for (size_t i = 0; i < s->n_r; i++)
        if (!(s->r[i].finished && (s->r[i].exited || s->r[i].widx < 0)))
            s->r[k++] = s->r[i];
    s->n_r = k;
}

/*
 * Fail attempt @attempt of @job because worker @wi is gone; requeue the job. When the store
 * cannot write that (disk full, database locked), the job would stay running with no ranks:
 * the requeue is kept and retried every tick until it is written. Lock held.
 */
static void job_worker_lost(struct mge_sched *s, int64_t job, int attempt, const char *wname)
{
    struct requeue_retry *q;
    bool requeued = false;
    char reason[256];
    int rc;
    snprintf(reason, sizeof(reason), "worker lost: %s", wname);
    rc = mge_store_job_requeue(s->st, job, attempt, reason, false, &requeued);
    attempt_finish(s, job, attempt, true);
    if (rc == MGE_OK) {
        mge_log_warn("job %lld attempt %d: %s (%s)", (long long)job, attempt, reason,
                     requeued ? "requeued" : "failed");
        return;
    }
    mge_log_error("job %lld attempt %d: %s, but the requeue cannot be stored (%s): retrying",
                  (long long)job, attempt, reason, mge_strerror(rc));
    for (size_t i = 0; i < s->n_retry; i++)
        if (s->retry[i].job_id == job && s->retry[i].attempt == attempt)
            return;
    if (mge_array_grow((void **)&s->retry, &s->cap_retry, s->n_retry + 1, sizeof(*s->retry)) !=
        MGE_OK) {
        mge_log_error("job %lld attempt %d: out of memory: it stays running until a restart",
                      (long long)job, attempt);
        return;
    }
    q = &s->retry[s->n_retry++];
    q->job_id = job;
    q->attempt = attempt;
    snprintf(q->reason, sizeof(q->reason), "%s", reason);
}

/* Retry the requeues the store could not write; keep those that still fail. Lock held. */
static void requeue_retry_run(struct mge_sched *s)
{
    size_t k = 0;
    for (size_t i = 0; i < s->n_retry; i++) {
        struct requeue_retry *q = &s->retry[i];
        bool requeued = false;
        if (mge_store_job_requeue(s->st, q->job_id, q->attempt, q->reason, false, &requeued) !=
            MGE_OK) {
            s->retry[k++] = *q;
            continue;
        }
        mge_log_warn("job %lld attempt %d: %s (%s on retry)", (long long)q->job_id, q->attempt,
                     q->reason, requeued ? "requeued" : "failed");
        s->dirty = true;
    }
    s->n_retry = k;
}

/*
 * Worker faults: rank @r ended before it ran because of its worker (@why: its disk is full, it
 * cannot start mge-train), not because of the job, which must not fail as bad input. As with a
 * lost worker the attempt ends and the job is queued again (not charged to its restarts); its
 * next attempt avoids that worker while enough others could hold its ranks (worker_avoided).
 * Lock held.
 */
static void job_worker_fault(struct mge_sched *s, struct resv *r, const char *why)
{
    struct worker *w = &s->w[r->widx];
    char reason[512];
    bool requeued = false;
    snprintf(reason, sizeof(reason), "worker %s: %s", w->name, why);
    if (mge_store_job_requeue(s->st, r->job_id, r->attempt, reason, false, &requeued) != MGE_OK)
        mge_log_error("job %lld attempt %d: %s: cannot requeue it", (long long)r->job_id,
                      r->attempt, reason);
    mge_log_warn("job %lld attempt %d: %s (%s)", (long long)r->job_id, r->attempt, reason,
                 requeued ? "requeued" : "failed: no attempts left");
    w->fault_job = r->job_id;
    w->fault_attempt = r->attempt;
    attempt_finish(s, r->job_id, r->attempt, true);
}

/* How many ready workers other than @wi could hold a rank of @j by their total slots (busy
 * or not), with a launch socket when @j may have several ranks. Lock held. */
static int workers_could_hold(const struct mge_sched *s, int wi, const struct mge_job_row *j)
{
    int others = 0;
    for (size_t i = 0; i < s->n_w; i++) {
        const struct worker *o = &s->w[i];
        if ((int)i != wi && worker_usable(o) && (j->workers_max <= 1 || worker_launches(o)) &&
            fits(o, j, o->cpus, gpus_all(o), o->memory_mb))
            others++;
    }
    return others;
}

/* Whether worker @wi faulted the previous attempt of @j and enough other ready workers could
 * hold its ranks (workers_could_hold): then @j waits for them. Lock held. */
static bool worker_avoided(const struct mge_sched *s, int wi, const struct mge_job_row *j)
{
    if (s->w[wi].fault_job != j->id || s->w[wi].fault_attempt != j->attempt - 1)
        return false;
    return workers_could_hold(s, wi, j) >= (j->workers_min > 0 ? j->workers_min : 1);
}

static void worker_set_lost(struct mge_sched *s, int wi)
{
    struct worker *w = &s->w[wi];
    w->state = W_LOST;
    /* a drained worker's stored state stays "draining": the drain outlives the loss */
    mge_store_worker_set_state(s->st, w->id, w->drain ? "draining" : "lost");
    mge_log_warn("worker '%s' (%s) lost: no heartbeat for %d ms", w->name, w->id,
                 s->opts.worker_timeout_ms);
    for (size_t i = 0; i < s->n_r; i++) {
        struct resv *r = &s->r[i];
        if (r->widx != wi)
            continue;
        if (!r->finished)
            job_worker_lost(s, r->job_id, r->attempt, w->name);
        r->widx = -1; /* its slots are gone with the worker */
        r->exited = true;
    }
    for (size_t i = 0; i < w->n_assign; i++)
        assign_fini(&w->assign[i]);
    w->n_assign = 0;
    w->n_cancel = 0;
    w->n_ckpt = 0;
    s->dirty = true;
}

static void check_lost(struct mge_sched *s)
{
    int64_t now = now_ms(s);
    for (size_t i = 0; i < s->n_w; i++)
        if (s->w[i].state != W_LOST && now - s->w[i].last_seen > s->opts.worker_timeout_ms)
            worker_set_lost(s, (int)i);
}

/*
 * Rank 0 of an attempt reported step @step at @line_ms (the worker's wall clock). The
 * intervals between reports are measured on the worker's clock (lines come in batches); the
 * first one, from the placement, on ours: it includes the start, so it only errs long, and
 * it keeps a job that reports every few thousand steps from being taken for hung before its
 * second report. Lock held.
 */
static void progress_note(struct mge_sched *s, struct resv *r, int64_t step, int64_t line_ms)
{
    struct progress *p = &r->prog;
    int64_t iv = p->step < 0 ? now_ms(s) - p->since : line_ms - p->last_line_ms;
    if (step <= p->step)
        return; /* an evaluation line of the same step, or a replay */
    if (iv >= 0) {
        p->iv[p->next_iv] = iv;
        p->next_iv = (p->next_iv + 1) % PROGRESS_IV_MAX;
        if (p->n_iv < PROGRESS_IV_MAX)
            p->n_iv++;
    }
    if (p->line_ms0 <= 0) {
        p->step0 = p->win_step = step;
        p->line_ms0 = p->win_ms = line_ms;
    } else if (line_ms - p->win_ms >= ETA_WINDOW_MS) {
        /* the speed of the last whole window: the first steps' warm-up and an old load fade */
        p->step0 = p->win_step;
        p->line_ms0 = p->win_ms;
        p->win_step = step;
        p->win_ms = line_ms;
    }
    p->step = step;
    p->last_line_ms = line_ms;
    p->since = now_ms(s);
    for (int k = 0; k < r->world; k++) {
        struct resv *o = resv_find(s, r->job_id, r->attempt, k);
        if (o)
            o->cpu_mark = o->cpu_ms;
    }
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* How long attempt progress @p may go without a step report before it is a hang, in ms. */
static int64_t progress_allowance(const struct mge_sched *s, const struct progress *p)
{
    int64_t iv[PROGRESS_IV_MAX], median, limit = s->opts.progress_timeout_ms;
    if (p->step < 0)
        return s->opts.startup_timeout_ms;
    if (p->n_iv == 0)
        return limit;
    memcpy(iv, p->iv, (size_t)p->n_iv * sizeof(*iv));
    qsort(iv, (size_t)p->n_iv, sizeof(*iv), cmp_i64);
    median = iv[p->n_iv / 2];
    return median * PROGRESS_MEDIAN_X > limit ? median * PROGRESS_MEDIAN_X : limit;
}

/*
 * Which rank of hung attempt @r0 (its rank 0) hangs, from what the workers said of the ranks'
 * process groups since the attempt last made progress: one that is stopped, or one that used
 * (almost) no CPU while a peer burned at least a quarter of a core (ranks waiting in a
 * collective spin). Its rank, and how into @how; -1 when no rank stands out. Lock held.
 */
static int hung_rank(struct mge_sched *s, const struct resv *r0, int64_t idle, char *how,
                     size_t how_len)
{
    int least = -1;
    int64_t least_used = INT64_MAX, most_used = 0;
    for (int k = 0; k < r0->world; k++) {
        const struct resv *o = resv_find(s, r0->job_id, r0->attempt, k);
        int64_t used;
        if (!o || o->exited)
            return -1;
        if (o->stopped) {
            snprintf(how, how_len, "stopped");
            return k;
        }
        if (o->cpu_ms <= 0)
            return -1; /* not reported (an older worker): nothing to compare */
        used = o->cpu_ms - o->cpu_mark;
        if (used < least_used) {
            least_used = used;
            least = k;
        }
        if (used > most_used)
            most_used = used;
    }
    if (r0->world < 2 || most_used < idle / 4 || least_used * 10 > most_used)
        return -1;
    snprintf(how, how_len, "idle: %.1f s of CPU while a peer used %.1f s",
             (double)least_used / 1000.0, (double)most_used / 1000.0);
    return least;
}

/*
 * The watchdog found elastic attempt @r0 (its rank 0) hung (@reason): end its ranks and queue
 * the job again at once (a re-form, not charged to its restarts). The silent member, when
 * known, is left out of the next incarnation (worker_avoided) while enough others remain: the
 * worker whose heartbeats stopped more than half a worker timeout ago (before it is lost),
 * else the worker of @hung, the rank hung_rank named (-1: none). Lock held.
 */
static void watchdog_reform(struct mge_sched *s, struct resv *r0, int hung, const char *reason)
{
    int64_t now = now_ms(s), worst = s->opts.worker_timeout_ms / 2;
    int silent = -1;
    bool requeued = false;
    for (int k = 0; k < r0->world; k++) {
        const struct resv *o = resv_find(s, r0->job_id, r0->attempt, k);
        if (o && o->widx >= 0 && now - s->w[o->widx].last_seen > worst) {
            worst = now - s->w[o->widx].last_seen;
            silent = o->widx;
        }
    }
    if (silent < 0 && hung >= 0) {
        const struct resv *o = resv_find(s, r0->job_id, r0->attempt, hung);
        silent = o ? o->widx : -1;
    }
    if (mge_store_job_requeue(s->st, r0->job_id, r0->attempt, reason, false, &requeued) != MGE_OK)
        return; /* the next check tries again */
    if (silent >= 0) {
        s->w[silent].fault_job = r0->job_id;
        s->w[silent].fault_attempt = r0->attempt;
    }
    mge_log_warn("job %lld attempt %d: %s: re-forming it%s%s", (long long)r0->job_id, r0->attempt,
                 reason, silent >= 0 ? " without " : "", silent >= 0 ? s->w[silent].name : "");
    attempt_finish(s, r0->job_id, r0->attempt, true);
    s->dirty = true;
}

/*
 * Attempt @r0 (its rank 0) made no progress for @idle ms: fail the job (re-form an elastic
 * one) with a reason that names the last step and the rank that hangs. Only rank 0 (the lead)
 * prints steps; which rank of a gang hangs comes from its workers' reports of the ranks'
 * process groups (hung_rank). When none stands out the reason names every member and says
 * that the hung rank is not known. Lock held.
 */
static void watchdog_fire(struct mge_sched *s, struct resv *r0, int64_t idle)
{
    struct mge_job_row row;
    char since[48], who[320], how[96], reason[512];
    int off = 0, hung = hung_rank(s, r0, idle, how, sizeof(how));
    bool changed = false;
    if (r0->prog.step >= 0)
        snprintf(since, sizeof(since), "step %lld", (long long)r0->prog.step);
    else
        snprintf(since, sizeof(since), "the start");
    if (r0->world <= 1) {
        snprintf(who, sizeof(who), "rank 0 on %s %s",
                 r0->widx >= 0 ? s->w[r0->widx].name : "a lost worker",
                 hung == 0 ? how : "silent");
    } else if (hung >= 0) {
        const struct resv *o = resv_find(s, r0->job_id, r0->attempt, hung);
        snprintf(who, sizeof(who), "rank %d on %s %s", hung,
                 o && o->widx >= 0 ? s->w[o->widx].name : "a lost worker", how);
    } else {
        off = snprintf(who, sizeof(who), "ranks 0-%d on", r0->world - 1);
        for (int k = 0; k < r0->world && off > 0 && (size_t)off < sizeof(who); k++) {
            const struct resv *o = resv_find(s, r0->job_id, r0->attempt, k);
            off += snprintf(who + off, sizeof(who) - (size_t)off, "%s%s", k ? ", " : " ",
                            o && o->widx >= 0 ? s->w[o->widx].name : "?");
        }
        if (off > 0 && (size_t)off < sizeof(who))
            snprintf(who + off, sizeof(who) - (size_t)off,
                     ": only rank 0 reports steps, so which rank hangs is not known");
    }
    snprintf(reason, sizeof(reason), "no progress for %lld s since %s (%s)",
             (long long)(idle / 1000), since, who);
    if (mge_store_job_row(s->st, r0->job_id, &row) == MGE_OK && row.workers_min < row.workers_max) {
        watchdog_reform(s, r0, hung, reason);
        return;
    }
    if (mge_store_job_set_state(s->st, r0->job_id, r0->attempt, MGE_JOB_FAILED, reason,
                                &changed) != MGE_OK)
        return; /* the next check tries again */
    mge_log_warn("job %lld attempt %d: %s: ending its ranks", (long long)r0->job_id, r0->attempt,
                 reason);
    attempt_finish(s, r0->job_id, r0->attempt, true);
    s->dirty = true;
}

/* End the running attempts whose steps stopped (see sched.h). Lock held. */
static void watchdog_check(struct mge_sched *s)
{
    int64_t now = now_ms(s);
    for (size_t i = 0; i < s->n_r; i++) {
        struct resv *r = &s->r[i];
        int64_t limit;
        if (r->rank != 0 || r->finished || r->failing || r->exited)
            continue;
        if ((r->prog.step < 0 ? s->opts.startup_timeout_ms : s->opts.progress_timeout_ms) < 0)
            continue; /* turned off */
        limit = progress_allowance(s, &r->prog);
        if (now - r->prog.since >= limit)
            watchdog_fire(s, r, now - r->prog.since);
    }
}

/*
 * Whether ranks of an earlier attempt of @j still run on live workers: the next incarnation
 * waits until they end (they were cancelled when that attempt ended) so that it is placed on
 * every worker it may have, survivors included, not on those that happened to be free first;
 * at most the cancel grace plus PREV_WAIT_MS, after which it takes what is free. Lock held.
 */
static bool prev_attempt_live(const struct mge_sched *s, const struct mge_job_row *j)
{
    int64_t now = now_ms(s);
    for (size_t i = 0; i < s->n_r; i++) {
        const struct resv *r = &s->r[i];
        if (r->job_id == j->id && r->attempt < j->attempt && !r->exited && r->widx >= 0 &&
            s->w[r->widx].state != W_LOST &&
            now - r->ended_at < s->opts.cancel_grace_ms + PREV_WAIT_MS)
            return true;
    }
    return false;
}

/* Try to place @j. Lock held. */
/*
 * After a restart the store knows workers that have not registered again yet. An elastic job
 * waits for those that could hold one of its ranks, up to RESTART_GRACE_MS after the start, so
 * that it starts at the size it can have rather than with fewer workers and a grow at its next
 * checkpoint (an incarnation more). Lock held.
 */
static bool restart_grace(const struct mge_sched *s, const struct mge_job_row *j)
{
    if (j->workers_max <= j->workers_min || now_ms(s) - s->started >= RESTART_GRACE_MS)
        return false;
    for (size_t i = 0; i < s->n_w; i++) {
        const struct worker *w = &s->w[i];
        if (w->state == W_READY && !w->seen && fits(w, j, w->cpus, gpus_all(w), w->memory_mb))
            return true;
    }
    return false;
}

static void place_one(struct mge_sched *s, const struct mge_job_row *j)
{
    struct mge_placement pl[64];
    char token[40];
    int widx[64], n = 0, rc, want = j->workers_max;
    if (want > 64)
        want = 64;
    if (prev_attempt_live(s, j) || restart_grace(s, j))
        return;
    for (size_t i = 0; i < s->n_w && n < want; i++) {
        int cpus;
        uint64_t gpus;
        int64_t mem;
        if (!worker_takes(&s->w[i]) || worker_avoided(s, (int)i, j))
            continue;
        /* a gang's ranks are started through the workers' launch sockets */
        if (want > 1 && !worker_launches(&s->w[i]))
            continue;
        worker_free(s, (int)i, &cpus, &gpus, &mem, NULL);
        if (!fits(&s->w[i], j, cpus, gpus, mem))
            continue;
        widx[n] = (int)i;
        memset(&pl[n], 0, sizeof(pl[n]));
        pl[n].gpu_mask = gpu_pick(&s->w[i], j, gpus);
        pl[n].job_id = j->id;
        pl[n].attempt = j->attempt;
        pl[n].rank = n;
        snprintf(pl[n].worker_id, sizeof(pl[n].worker_id), "%s", s->w[i].id);
        n++;
    }
    if (n < j->workers_min || n == 0)
        return;
    if (mge_array_grow((void **)&s->r, &s->cap_r, s->n_r + (size_t)n, sizeof(*s->r)) != MGE_OK)
        return;
    rc = mge_store_job_place(s->st, j->id, j->attempt, pl, n);
    if (rc != MGE_OK)
        return;
    token_new(token);
    for (int k = 0; k < n; k++) {
        struct resv *r = &s->r[s->n_r++];
        memset(r, 0, sizeof(*r));
        r->prog.since = now_ms(s);
        r->prog.step = -1;
        if (n > 1)
            memcpy(r->token, token, sizeof(r->token));
        r->job_id = j->id;
        r->attempt = j->attempt;
        r->rank = k;
        r->world = n;
        r->widx = widx[k];
        r->cpus = j->cpus;
        r->gpus = j->gpus;
        r->gpu_mask = pl[k].gpu_mask;
        r->memory_mb = j->memory_mb;
        r->total_steps = j->total_steps;
        r->priority = j->priority;
        r->placed = now_ms(s);
    }
    /* all reservations first: rank 0's Assign lists every rank's worker */
    for (size_t i = s->n_r - (size_t)n; i < s->n_r; i++)
        queue_assign(s, &s->r[i]);
    mge_log_info("job %lld attempt %d placed: %d rank(s), rank 0 on '%s'%s", (long long)j->id,
                 j->attempt, n, s->w[widx[0]].name, n > 1 ? " (one mpirun)" : "");
}

/* Whether a job of @queued (@nq of them) could use worker @wi, by its total slots. */
static bool worker_wanted(const struct mge_sched *s, int wi, const struct mge_job_row *queued,
                          int nq)
{
    const struct worker *w = &s->w[wi];
    for (int i = 0; i < nq; i++)
        if ((queued[i].workers_max <= 1 || worker_launches(w)) &&
            fits(w, &queued[i], w->cpus, gpus_all(w), w->memory_mb))
            return true;
    return false;
}

/*
 * How many ranks running attempt @r0 (its rank 0) of an elastic job should grow to now, 0 for
 * none: the job is below its max, and ready workers that are not its members have free slots
 * for one more rank each (a launch socket; not a worker the attempt was formed without,
 * worker_avoided) that no queued job could use (queued jobs first: a grow never takes a worker
 * that a waiting job fits, whatever their priorities). @why receives "worker w4 joined" (it
 * registered after the placement) or "workers w4, w5 free". Lock held.
 */
static int grow_plan(struct mge_sched *s, const struct resv *r0, char *why, size_t size)
{
    struct mge_job_row row, *queued = NULL;
    char names[GROW_NAMES_MAX * 130] = "";
    int nq = 0, n = 0;
    bool joined = true;
    if (mge_store_job_row(s->st, r0->job_id, &row) != MGE_OK || row.state != MGE_JOB_RUNNING ||
        row.attempt != r0->attempt || row.workers_min >= row.workers_max ||
        r0->world >= row.workers_max)
        return 0;
    if (mge_store_jobs_queued(s->st, QUEUE_SCAN_MAX, &queued, &nq) != MGE_OK)
        return 0;
    for (size_t i = 0; i < s->n_w && r0->world + n < row.workers_max; i++) {
        int cpus;
        uint64_t gpus;
        int64_t mem;
        bool member = false;
        if (!worker_takes(&s->w[i]) || !worker_launches(&s->w[i]) ||
            worker_avoided(s, (int)i, &row))
            continue;
        for (size_t k = 0; k < s->n_r && !member; k++)
            member = s->r[k].job_id == r0->job_id && s->r[k].attempt == r0->attempt &&
                     s->r[k].widx == (int)i;
        worker_free(s, (int)i, &cpus, &gpus, &mem, NULL);
        if (member || !fits(&s->w[i], &row, cpus, gpus, mem) ||
            worker_wanted(s, (int)i, queued, nq))
            continue;
        joined = joined && s->w[i].joined > r0->placed;
        if (n < GROW_NAMES_MAX) {
            size_t len = strlen(names);
            snprintf(names + len, sizeof(names) - len, "%s%s", n ? ", " : "", s->w[i].name);
        }
        n++;
    }
    mge_free(queued);
    if (n == 0)
        return 0;
    snprintf(why, size, "worker%s %s%s %s", n > 1 ? "s" : "", names,
             n > GROW_NAMES_MAX ? " and others" : "", joined ? "joined" : "free");
    return r0->world + n;
}

/*
 * Mark the grows that are due (see grow_plan), or drop those that are no longer; they happen
 * at the attempt's next checkpoint (at_checkpoint). Lock held.
 */
static void grow_check(struct mge_sched *s)
{
    for (size_t i = 0; i < s->n_r && !s->opts.no_grow; i++) {
        struct resv *r0 = &s->r[i];
        char why[sizeof(r0->grow_why)];
        int to;
        if (r0->rank != 0 || r0->finished || r0->failing || r0->exited || r0->widx < 0 ||
            r0->preempt_at)
            continue;
        to = grow_plan(s, r0, why, sizeof(why));
        if (to == r0->grow_to)
            continue;
        if (to)
            mge_log_info("job %lld attempt %d: grow pending (%s): %d -> %d at its next checkpoint",
                         (long long)r0->job_id, r0->attempt, why, r0->world, to);
        else
            mge_log_info("job %lld attempt %d: grow to %d dropped: no free worker for it now",
                         (long long)r0->job_id, r0->attempt, r0->grow_to);
        r0->grow_to = to;
        snprintf(r0->grow_why, sizeof(r0->grow_why), "%s", to ? why : "");
    }
}

/*
 * A commit boundary: checkpoint notices in @lines from worker @wi of rank 0 of an attempt that
 * a preemption asked for a checkpoint (preempt_ask) end it once one is new enough; of an
 * attempt with a grow pending they end that attempt (requeued, not charged: "worker w4 joined:
 * growing"), its ranks cancelled; the next incarnation is placed once they have ended
 * (prev_attempt_live), on the survivors and the free workers, and resumes from that very
 * checkpoint, the newest the store has indexed (the lines were stored before this is called), so no
 * step it committed is lost. The grow is planned again first: a worker taken meanwhile cancels it.
 * Lock held.
 */
static bool attempt_requeue(struct mge_sched *s, int64_t job, int attempt, const char *reason,
                            bool *requeued);
static bool preempt_end(struct mge_sched *s, int64_t job, int attempt, const char *reason);
static bool preempt_still_wanted(struct mge_sched *s, struct resv *r0);

static void at_checkpoint(struct mge_sched *s, int wi, const struct mge_store_line *lines, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct mge_store_line *l = &lines[i];
        struct resv *r0;
        char why[sizeof(r0->grow_why)], reason[sizeof(why) + 16];
        bool requeued = false;
        long long step = -1;
        if (l->stream != 3 || l->rank != 0 || !l->text || !strncmp(l->text, "latest ", 7))
            continue;
        r0 = resv_find(s, l->job_id, l->attempt, 0);
        if (!r0 || r0->widx != wi || r0->finished || r0->failing)
            continue;
        /* a preemption waits for a checkpoint of the step it found the attempt at, or newer */
        if (r0->preempt_at && sscanf(l->text, "%*s %lld", &step) == 1 && step >= r0->preempt_step &&
            preempt_still_wanted(s, r0)) {
            snprintf(reason, sizeof(reason), "%s", r0->preempt_why);
            preempt_end(s, r0->job_id, r0->attempt, reason);
            continue;
        }
        if (!r0->grow_to || r0->preempt_at)
            continue;
        r0->grow_to = grow_plan(s, r0, why, sizeof(why));
        if (!r0->grow_to)
            continue;
        snprintf(reason, sizeof(reason), "%s: growing", why);
        if (!attempt_requeue(s, r0->job_id, r0->attempt, reason, &requeued))
            continue; /* the next checkpoint tries again */
        mge_log_info("job %lld attempt %d: %s %d -> %d at checkpoint '%.80s'",
                     (long long)r0->job_id, r0->attempt, reason, r0->world, r0->grow_to, l->text);
    }
}

/* Whether attempt @attempt of @job holds reservations. Lock held. */
static bool attempt_placed(const struct mge_sched *s, int64_t job, int attempt)
{
    for (size_t i = 0; i < s->n_r; i++)
        if (s->r[i].job_id == job && s->r[i].attempt == attempt)
            return true;
    return false;
}

struct victim {
    int64_t job_id;
    int attempt, priority;
    int64_t placed;
};

/* Lowest priority first; of equal ones the youngest (the least work lost) first. */
static int cmp_victim(const void *a, const void *b)
{
    const struct victim *x = a, *y = b;
    if (x->priority != y->priority)
        return x->priority - y->priority;
    return (y->placed > x->placed) - (y->placed < x->placed);
}

/* Free slots of every worker, one array per kind (index: the worker), for thought
 * experiments: what would fit if some attempts ended. */
struct slots {
    int *cpus;
    uint64_t *gpus; /* free GPUs */
    int64_t *mem;
};

/* The free slots now; false on OOM (then slots_fini() anyway). Lock held. */
static bool slots_now(const struct mge_sched *s, struct slots *sl)
{
    sl->cpus = mge_calloc(s->n_w + 1, sizeof(int));
    sl->gpus = mge_calloc(s->n_w + 1, sizeof(uint64_t));
    sl->mem = mge_calloc(s->n_w + 1, sizeof(int64_t));
    if (!sl->cpus || !sl->gpus || !sl->mem)
        return false;
    for (size_t i = 0; i < s->n_w; i++)
        worker_free(s, (int)i, &sl->cpus[i], &sl->gpus[i], &sl->mem[i], NULL);
    return true;
}

static void slots_fini(struct slots *sl)
{
    mge_free(sl->cpus);
    mge_free(sl->gpus);
    mge_free(sl->mem);
}

/* Give attempt @job/@attempt's reservations back to @cpus/@gpus/@mem. Lock held. */
static void attempt_release(const struct mge_sched *s, int64_t job, int attempt, int *cpus,
                            uint64_t *gpus, int64_t *mem)
{
    for (size_t i = 0; i < s->n_r; i++) {
        const struct resv *r = &s->r[i];
        if (r->job_id == job && r->attempt == attempt && !r->exited && r->widx >= 0) {
            cpus[r->widx] += r->cpus;
            gpus[r->widx] |= r->gpu_mask;
            mem[r->widx] += r->memory_mb;
        }
    }
}

/* How many workers could take a rank of @j with the free slots @cpus/@gpus/@mem. Lock held. */
static int workers_fitting(const struct mge_sched *s, const struct mge_job_row *j, const int *cpus,
                           const uint64_t *gpus, const int64_t *mem)
{
    int fit = 0;
    for (size_t i = 0; i < s->n_w; i++)
        if (worker_takes(&s->w[i]) && (j->workers_max <= 1 || worker_launches(&s->w[i])) &&
            fits(&s->w[i], j, cpus[i], gpus[i], mem[i]))
            fit++;
    return fit;
}

/* End attempt (@job, @attempt), requeued and not charged to its restarts (a preemption, a
 * grow), its ranks cancelled; *@requeued: whether the job went back in line (else it failed, at
 * its cap). False when the store could not write it (the caller tries again later). Lock held. */
static bool attempt_requeue(struct mge_sched *s, int64_t job, int attempt, const char *reason,
                            bool *requeued)
{
    if (mge_store_job_requeue(s->st, job, attempt, reason, false, requeued) != MGE_OK)
        return false;
    attempt_finish(s, job, attempt, true);
    s->dirty = true;
    return true;
}

/* End attempt (@job, @attempt) for a preemption (@reason). Whether it was. Lock held. */
static bool preempt_end(struct mge_sched *s, int64_t job, int attempt, const char *reason)
{
    bool requeued = false;
    if (!attempt_requeue(s, job, attempt, reason, &requeued))
        return false;
    mge_log_warn("job %lld attempt %d: %s: %s", (long long)job, attempt, reason,
                 requeued ? "requeued" : "failed");
    return true;
}

/*
 * Ask the attempt of rank 0 @r0 for a checkpoint before a preemption (@reason) ends it: the
 * worker of rank 0 sends mge-train SIGUSR2, which writes one at its next step boundary; the
 * attempt ends when a checkpoint of at least the step it had reached is indexed
 * (at_checkpoint) or after opts.preempt_ckpt_ms (preempt_overdue). Meanwhile its slots count as
 * free for preemptions; if job @by stops waiting for the room meanwhile (cancelled, placed
 * elsewhere), the preemption is withdrawn (preempt_still_wanted). False when it is not worth
 * asking (off, no step run yet, its worker lost): the caller ends it at once. Lock held.
 */
static bool preempt_ask(struct mge_sched *s, struct resv *r0, const struct mge_job_row *by,
                        const char *reason)
{
    int64_t now = now_ms(s);
    if (s->opts.preempt_ckpt_ms < 0 || r0->prog.step <= 0 || r0->widx < 0 ||
        s->w[r0->widx].state == W_LOST)
        return false;
    for (size_t i = 0; i < s->n_r; i++)
        if (s->r[i].job_id == r0->job_id && s->r[i].attempt == r0->attempt)
            s->r[i].preempt_at = now;
    r0->preempt_step = r0->prog.step;
    r0->preempt_by = by->id;
    r0->preempt_by_attempt = by->attempt;
    snprintf(r0->preempt_why, sizeof(r0->preempt_why), "%s", reason);
    queue_ckpt(s, r0->widx, r0->job_id, r0->attempt);
    mge_log_info("job %lld attempt %d: %s: asked for a checkpoint of step >= %lld first",
                 (long long)r0->job_id, r0->attempt, reason, (long long)r0->prog.step);
    return true;
}

/*
 * Whether the preemption pending on the attempt of rank 0 @r0 is still wanted: the job it makes
 * room for still waits for it (queued, in the same attempt, not placed). If not (cancelled,
 * failed, placed on room that came elsewhere), the preemption is withdrawn: the attempt trains
 * on, its slots no longer free, and a checkpoint it wrote on the request is just a checkpoint.
 * A store that cannot answer keeps the preemption. Lock held.
 */
static bool preempt_still_wanted(struct mge_sched *s, struct resv *r0)
{
    struct mge_job_row by;
    const char *why;
    int rc = mge_store_job_row(s->st, r0->preempt_by, &by);
    if (rc != MGE_OK && rc != MGE_NOENT)
        return true;
    if (rc == MGE_OK && by.state == MGE_JOB_QUEUED && by.attempt == r0->preempt_by_attempt &&
        !attempt_placed(s, by.id, by.attempt))
        return true;
    why = rc == MGE_NOENT                 ? "is gone"
          : by.state == MGE_JOB_QUEUED    ? "was placed"
          : by.state == MGE_JOB_RUNNING   ? "was placed"
          : by.state == MGE_JOB_CANCELLED ? "was cancelled"
                                          : "ended";
    for (size_t i = 0; i < s->n_r; i++)
        if (s->r[i].job_id == r0->job_id && s->r[i].attempt == r0->attempt)
            s->r[i].preempt_at = 0;
    mge_log_info("job %lld attempt %d: preemption withdrawn: job %lld %s; training on",
                 (long long)r0->job_id, r0->attempt, (long long)r0->preempt_by, why);
    s->dirty = true;
    return false;
}

/* Preemptions whose checkpoint did not come in time end their attempts now; those no longer
 * wanted are withdrawn. Lock held. */
static void preempt_overdue(struct mge_sched *s)
{
    int64_t now = now_ms(s);
    for (size_t i = 0; i < s->n_r; i++) {
        struct resv *r0 = &s->r[i];
        char reason[sizeof(r0->preempt_why) + 64];
        if (r0->rank != 0 || !r0->preempt_at || r0->finished || !preempt_still_wanted(s, r0) ||
            now - r0->preempt_at < s->opts.preempt_ckpt_ms)
            continue;
        snprintf(reason, sizeof(reason), "%s; no checkpoint came within %d ms", r0->preempt_why,
                 s->opts.preempt_ckpt_ms);
        preempt_end(s, r0->job_id, r0->attempt, reason);
    }
}

/*
 * Preemption: queued job @j (not placed this pass) may take the slots of running attempts of
 * lower priority. Counting the slots of attempts already ending as free, if @j still cannot
 * start, the lowest-priority (then youngest) running attempts are ended one by one in thought
 * until it could; if it could then, they are ended for real: requeued, not charged to their
 * restarts, to resume from their last checkpoint when there is room again ("preempted by job
 * 7 (priority 10)"). Jobs of the same or a higher priority are never preempted. Lock held.
 */
static bool preempt_for(struct mge_sched *s, const struct mge_job_row *j)
{
    struct slots sl;
    struct victim *v = mge_calloc(s->n_r + 1, sizeof(*v));
    int *cpus;
    uint64_t *gpus;
    int64_t *mem;
    size_t n_v = 0, take = 0;
    int need = j->workers_min;
    bool done = false;

    if (!slots_now(s, &sl) || !v)
        goto out;
    cpus = sl.cpus;
    gpus = sl.gpus;
    mem = sl.mem;
    for (size_t i = 0; i < s->n_r; i++) {
        const struct resv *r = &s->r[i];
        /* ending, or asked for its checkpoint by a preemption: its slots come back */
        if ((r->finished || r->preempt_at) && !r->exited && r->widx >= 0) {
            cpus[r->widx] += r->cpus;
            gpus[r->widx] |= r->gpu_mask;
            mem[r->widx] += r->memory_mb;
        } else if (r->rank == 0 && !r->finished && !r->preempt_at && r->priority < j->priority) {
            v[n_v].job_id = r->job_id;
            v[n_v].attempt = r->attempt;
            v[n_v].priority = r->priority;
            v[n_v++].placed = r->placed;
        }
    }
    if (workers_fitting(s, j, cpus, gpus, mem) >= need || n_v == 0)
        goto out; /* it starts once those end, or nothing may make room */
    qsort(v, n_v, sizeof(*v), cmp_victim);
    while (take < n_v && workers_fitting(s, j, cpus, gpus, mem) < need) {
        attempt_release(s, v[take].job_id, v[take].attempt, cpus, gpus, mem);
        take++;
    }
    if (workers_fitting(s, j, cpus, gpus, mem) < need)
        goto out;
    for (size_t k = 0; k < take; k++) {
        char reason[160];
        struct resv *r0 = resv_find(s, v[k].job_id, v[k].attempt, 0);
        snprintf(reason, sizeof(reason), "preempted by job %lld (priority %d)", (long long)j->id,
                 j->priority);
        if (r0 && preempt_ask(s, r0, j, reason)) {
            done = true;
            continue;
        }
        done |= preempt_end(s, v[k].job_id, v[k].attempt, reason);
    }
out:
    slots_fini(&sl);
    mge_free(v);
    return done;
}

static void schedule(struct mge_sched *s)
{
    struct mge_job_row *rows = NULL;
    int n = 0;
    bool any_free = false;
    for (size_t i = 0; i < s->n_w && !any_free; i++) {
        int cpus;
        uint64_t gpus;
        int64_t mem;
        if (!worker_usable(&s->w[i]))
            continue;
        worker_free(s, (int)i, &cpus, &gpus, &mem, NULL);
        any_free = cpus > 0 || gpus != 0;
    }
    /* a full cluster (every worker's slots taken): nothing can be placed, only preempted, so
     * the queue is read at most once a second instead of at every kick (heartbeats kick) */
    if (!any_free) {
        if (now_ms(s) - s->full_scan < PREEMPT_SCAN_MS)
            return;
        s->full_scan = now_ms(s);
    }
    if (mge_store_jobs_queued(s->st, QUEUE_SCAN_MAX, &rows, &n) != MGE_OK)
        return;
    for (int i = 0; i < n; i++)
        place_one(s, &rows[i]);
    /* queued jobs left waiting may preempt lower ones, highest first, one per pass (the next
     * pass counts the slots those leave as free) */
    for (int i = 0; i < n; i++)
        if (!attempt_placed(s, rows[i].id, rows[i].attempt) && preempt_for(s, &rows[i]))
            break;
    mge_free(rows);
    grow_check(s);
}

/* The periodic checks: lost workers, hung attempts, finished reservations. Lock held. */
static void periodic(struct mge_sched *s)
{
    requeue_retry_run(s);
    check_lost(s);
    watchdog_check(s);
    preempt_overdue(s);
    resv_gc(s);
}

void mge_sched_tick(struct mge_sched *s)
{
    pthread_mutex_lock(&s->mu);
    periodic(s);
    s->dirty = false;
    schedule(s);
    pthread_mutex_unlock(&s->mu);
}

static void *sched_main(void *arg)
{
    struct mge_sched *s = arg;
    int64_t last_periodic = 0;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        int64_t now = mge_mono_ms(); /* the thread's pace is real time, whatever the clock */
        struct timespec ts;
        if (now - last_periodic >= 250) {
            periodic(s);
            last_periodic = now;
            if (now % 1000 < 250)
                s->dirty = true; /* a slow safety net; kicks do the real work */
        }
        if (s->dirty) {
            s->dirty = false;
            schedule(s);
        }
        if (s->dirty)
            continue;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void attempt_check(struct mge_sched *s, struct resv *ended);

int mge_sched_new(struct mge_store *st, const struct mge_sched_opts *opts, struct mge_sched **out)
{
    struct mge_sched *s;
    struct mge_worker_row *wr = NULL;
    struct mge_placement *pl = NULL;
    int nw = 0, np = 0, rc;

    *out = NULL;
    s = mge_calloc(1, sizeof(*s));
    if (!s)
        return MGE_NOMEM;
    s->st = st;
    s->opts = *opts;
    if (s->opts.worker_timeout_ms <= 0)
        s->opts.worker_timeout_ms = 10000;
    if (s->opts.cancel_grace_ms <= 0)
        s->opts.cancel_grace_ms = 5000;
    if (s->opts.progress_timeout_ms == 0)
        s->opts.progress_timeout_ms = 10000;
    if (s->opts.preempt_ckpt_ms == 0)
        s->opts.preempt_ckpt_ms = 30000;
    s->started = now_ms(s);
    if (s->opts.startup_timeout_ms == 0)
        s->opts.startup_timeout_ms = 300000;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);

    rc = mge_store_workers_load(st, &wr, &nw);
    if (rc != MGE_OK)
        goto err_free;
    rc = mge_array_grow((void **)&s->w, &s->cap_w, (size_t)nw, sizeof(*s->w));
    if (rc != MGE_OK)
        goto err_free;
    for (int i = 0; i < nw; i++) {
        struct worker *w = &s->w[s->n_w++];
        memset(w, 0, sizeof(*w));
        snprintf(w->id, sizeof(w->id), "%s", wr[i].id);
        snprintf(w->name, sizeof(w->name), "%s", wr[i].name);
        snprintf(w->host, sizeof(w->host), "%s", wr[i].host);
        snprintf(w->version, sizeof(w->version), "%s", wr[i].version);
        snprintf(w->device, sizeof(w->device), "%s", wr[i].device);
        snprintf(w->launch_url, sizeof(w->launch_url), "%s", wr[i].launch_url);
        w->cpus = wr[i].cpus;
        w->gpus = wr[i].gpus;
        memcpy(w->gpu, wr[i].gpu, sizeof(w->gpu));
        w->memory_mb = wr[i].memory_mb;
        w->state = !strcmp(wr[i].state, "lost")       ? W_LOST
                   : !strcmp(wr[i].state, "draining") ? W_DRAINING
                                                      : W_READY;
        w->drain = w->state == W_DRAINING;
        /* A restart gives every known worker a full timeout to come back. */
        w->last_seen = now_ms(s);
        w->last_seen_wall = wr[i].registered_ms;
    }
    rc = mge_store_placements_active(st, &pl, &np);
    if (rc != MGE_OK)
        goto err_free;
    rc = mge_array_grow((void **)&s->r, &s->cap_r, (size_t)np, sizeof(*s->r));
    if (rc != MGE_OK)
        goto err_free;
    for (int i = 0; i < np; i++) {
        struct mge_job_row row;
        struct resv *r;
        int wi = worker_find(s, pl[i].worker_id);
        rc = mge_store_job_row(st, pl[i].job_id, &row);
        if (rc == MGE_NOENT)
            continue;
        if (rc != MGE_OK)
            goto err_free; /* a placed job is never dropped silently */
        r = &s->r[s->n_r++];
        memset(r, 0, sizeof(*r));
        r->job_id = pl[i].job_id;
        r->attempt = pl[i].attempt;
        r->rank = pl[i].rank;
        r->widx = wi;
        r->cpus = row.cpus;
        r->gpus = row.gpus;
        r->gpu_mask = pl[i].gpu_mask;
        r->memory_mb = row.memory_mb;
        r->total_steps = row.total_steps;
        r->priority = row.priority;
        r->exited = pl[i].exited || wi < 0;
        r->exit_code = pl[i].exit_code;
        r->term_signal = pl[i].term_signal;
        /* a restart gives a running attempt the startup allowance again */
        r->prog.since = now_ms(s);
        r->prog.step = -1;
        r->placed = now_ms(s);
        if (pl[i].superseded) {
            /* A membership change ended this attempt just before the restart: its ranks are
             * fenced (cancelled when reported running), and their slots stay taken until they
             * end, so that the next incarnation waits for them (prev_attempt_live). */
            r->finished = true;
            r->ended_at = now_ms(s);
            r->exited = r->exited || s->w[wi].state == W_LOST;
        }
    }
    for (size_t i = 0; i < s->n_r; i++) { /* world size = ranks of the same attempt */
        int world = 0;
        for (size_t k = 0; k < s->n_r; k++)
            world += s->r[k].job_id == s->r[i].job_id && s->r[k].attempt == s->r[i].attempt;
        s->r[i].world = world;
    }
    mge_free(wr);
    mge_free(pl);
    wr = NULL;
    pl = NULL;
    for (size_t i = 0; i < s->n_r; i++) /* ranks on lost workers: the job is requeued */
        if (s->r[i].widx >= 0 && s->w[s->r[i].widx].state == W_LOST && !s->r[i].finished)
            job_worker_lost(s, s->r[i].job_id, s->r[i].attempt, s->w[s->r[i].widx].name);
    for (size_t i = 0; i < s->n_r; i++) {
        struct resv *r = &s->r[i];
        /* Tokens live in memory only: a gang's ranks not yet launched get a fresh one with
         * their Assign again (NEEDSWORK: one already started by the old token's mpirun is
         * refused, and the attempt fails when mpirun gives up on it). */
        if (r->world > 1 && !r->token[0]) {
            token_new(r->token);
            for (size_t k = i + 1; k < s->n_r; k++)
                if (s->r[k].job_id == r->job_id && s->r[k].attempt == r->attempt)
                    memcpy(s->r[k].token, r->token, sizeof(r->token));
        }
        /* an exit stored before the restart whose verdict was not: decide it now */
        if (r->exited && !r->finished && (r->exit_code != 0 || r->term_signal != 0))
            attempt_check(s, r);
    }
    mge_log_info("scheduler: %zu worker(s), %zu placed rank(s) loaded", s->n_w, s->n_r);
    s->dirty = true;
    if (!s->opts.no_thread && pthread_create(&s->thread, NULL, sched_main, s) != 0) {
        rc = MGE_ERR(MGE_INTERNAL, "cannot start the scheduler thread");
        goto err_free;
    }
    *out = s;
    return MGE_OK;

err_free:
    mge_free(wr);
    mge_free(pl);
    mge_free(s->w);
    mge_free(s->r);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    mge_free(s);
    return rc;
}

void mge_sched_free(struct mge_sched *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (!s->opts.no_thread)
        pthread_join(s->thread, NULL);
    for (size_t i = 0; i < s->n_w; i++) {
        for (size_t k = 0; k < s->w[i].n_assign; k++)
            assign_fini(&s->w[i].assign[k]);
        mge_free(s->w[i].assign);
        mge_free(s->w[i].cancel);
        mge_free(s->w[i].ckpt);
    }
    mge_free(s->w);
    mge_free(s->r);
    mge_free(s->retry);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    mge_free(s);
}

void mge_sched_kick(struct mge_sched *s)
{
    pthread_mutex_lock(&s->mu);
    s->dirty = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/*
 * Count and log report @rep of worker @wi, which is not a rank placed there (@r: the
 * reservation of that rank elsewhere, or NULL), as refused. @what: "rank", "exit". Lock held.
 */
static void fence_refuse(struct mge_sched *s, int wi, const struct mge_rank_report *rep,
                         const struct resv *r, const char *what)
{
    s->fenced++;
    mge_log_warn("worker '%s': %s of job %lld attempt %d rank %d refused: %s", s->w[wi].name,
                 what, (long long)rep->job_id, rep->attempt, rep->rank,
                 r ? "that rank is not placed on this worker"
                   : "not a current placement (a superseded attempt or an ended job)");
}

int mge_sched_worker_register(struct mge_sched *s, const struct mge_worker_info *info,
                              const struct mge_rank_report *ranks, size_t n, char id_out[40],
                              struct mge_sched_cmds *out)
{
    struct mge_worker_row row;
    struct worker *w;
    int wi, rc;
    bool fresh = false;

    memset(out, 0, sizeof(*out));
    memset(&row, 0, sizeof(row));
    snprintf(row.name, sizeof(row.name), "%s", info->name);
    snprintf(row.host, sizeof(row.host), "%s", info->host ? info->host : "");
    snprintf(row.version, sizeof(row.version), "%s", info->version ? info->version : "");
    snprintf(row.device, sizeof(row.device), "%s",
             info->device && *info->device ? info->device : "cpu");
    snprintf(row.launch_url, sizeof(row.launch_url), "%s", info->launch_url ? info->launch_url : "");
    row.cpus = info->cpus;
    row.gpus = info->gpus < 0 ? 0 : info->gpus > MGE_GPUS_MAX ? MGE_GPUS_MAX : info->gpus;
    for (int i = 0; i < row.gpus && info->gpu; i++)
        row.gpu[i] = info->gpu[i];
    row.memory_mb = info->memory_mb;
    row.registered_ms = mge_now_ms();

    pthread_mutex_lock(&s->mu);
    rc = mge_store_worker_upsert(s->st, &row);
    if (rc != MGE_OK)
        goto out_unlock;
    wi = worker_find_name(s, row.name);
    if (wi < 0) {
        rc = mge_array_grow((void **)&s->w, &s->cap_w, s->n_w + 1, sizeof(*s->w));
        if (rc != MGE_OK)
            goto out_unlock;
        wi = (int)s->n_w++;
        memset(&s->w[wi], 0, sizeof(s->w[wi]));
        fresh = true;
    }
    w = &s->w[wi];
    snprintf(w->id, sizeof(w->id), "%s", row.id);
    snprintf(w->name, sizeof(w->name), "%s", row.name);
    snprintf(w->host, sizeof(w->host), "%s", row.host);
    snprintf(w->version, sizeof(w->version), "%s", row.version);
    snprintf(w->device, sizeof(w->device), "%s", row.device);
    snprintf(w->launch_url, sizeof(w->launch_url), "%s", row.launch_url);
    w->launch_cert[0] = '\0';
    if (info->launch_cert && strlen(info->launch_cert) < sizeof(w->launch_cert))
        snprintf(w->launch_cert, sizeof(w->launch_cert), "%s", info->launch_cert);
    else if (info->launch_cert)
        mge_log_warn("worker '%s': its launch certificate (%zu bytes) is too large: it takes no "
                     "multi-worker jobs",
                     w->name, strlen(info->launch_cert));
    w->cpus = row.cpus;
    w->gpus = row.gpus;
    memcpy(w->gpu, row.gpu, sizeof(w->gpu));
    w->memory_mb = row.memory_mb;
    if (fresh || w->state == W_LOST)
        w->joined = now_ms(s); /* not when it reconnects after a restart (grow_plan's wording) */
    if (w->state == W_LOST)
        w->state = w->drain ? W_DRAINING : W_READY;
    w->seen = true;
    w->last_seen = now_ms(s);
    w->last_seen_wall = row.registered_ms;
    /* A fresh worker process: ranks we placed there that it does not report are gone. */
    for (size_t i = 0; i < s->n_r; i++) {
        struct resv *r = &s->r[i];
        bool reported = false;
        if (r->widx != wi || r->exited)
            continue;
        for (size_t k = 0; k < n; k++)
            if (ranks[k].job_id == r->job_id && ranks[k].attempt == r->attempt &&
                ranks[k].rank == r->rank)
                reported = true;
        if (reported)
            continue;
        if (!r->finished)
            job_worker_lost(s, r->job_id, r->attempt, w->name);
        r->exited = true;
    }
    for (size_t i = 0; i < w->n_assign; i++)
        assign_fini(&w->assign[i]);
    w->n_assign = 0;
    w->n_cancel = 0;
    w->n_ckpt = 0; /* the preemptions that asked end their attempts at the deadline */
    /* Running ranks of an attempt that is not current here (the worker was lost and came
     * back, or the job ended meanwhile) end now: their cancels go back in this reply. */
    for (size_t k = 0; k < n; k++) {
        const struct resv *r;
        if (!ranks[k].running)
            continue;
        r = resv_find(s, ranks[k].job_id, ranks[k].attempt, ranks[k].rank);
        if (r && r->widx == wi && !r->finished)
            continue;
        if (!r || r->widx != wi)
            fence_refuse(s, wi, &ranks[k], r, "rank");
        queue_cancel(s, wi, ranks[k].job_id, ranks[k].attempt);
    }
    out->cancel = w->cancel;
    out->n_cancel = w->n_cancel;
    out->grace_ms = s->opts.cancel_grace_ms;
    w->cancel = NULL;
    w->n_cancel = w->cap_cancel = 0;
    memcpy(id_out, w->id, 40);
    mge_log_info("worker '%s' registered as %s (%d cpus, %lld MiB, %d gpus%s%s)", w->name, w->id,
                 w->cpus, (long long)w->memory_mb, w->gpus, w->gpus ? ": " : "",
                 w->gpus ? w->gpu[0].name : "");
    s->dirty = true;
    pthread_cond_signal(&s->cv);
out_unlock:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/*
 * A rank of gang (@job, @attempt) ended badly (@reason): tear the others down now (Open MPI
 * cannot go on without it) and decide once every rank is accounted for. Until then a lost
 * worker of the gang requeues it (worker_set_lost): the failure was the node's. Lock held.
 */
static void gang_failing(struct mge_sched *s, int64_t job, int attempt, const char *reason)
{
    int64_t now = now_ms(s);
    bool all_exited = true, first = true;
    for (size_t i = 0; i < s->n_r; i++) {
        const struct resv *r = &s->r[i];
        if (r->job_id == job && r->attempt == attempt && r->failing)
            first = false;
    }
    for (size_t i = 0; i < s->n_r; i++) {
        struct resv *r = &s->r[i];
        if (r->job_id != job || r->attempt != attempt || r->finished)
            continue;
        if (first) {
            r->failing = true;
            snprintf(r->fail_reason, sizeof(r->fail_reason), "%s", reason);
            if (!r->exited && r->widx >= 0 && s->w[r->widx].state != W_LOST) {
                r->cancel_sent = now;
                queue_cancel(s, r->widx, job, attempt);
            }
        }
        if (!r->exited)
            all_exited = false;
    }
    if (first)
        mge_log_warn("job %lld attempt %d: %s: ending its other ranks", (long long)job, attempt,
                     reason);
    if (!all_exited)
        return;
    for (size_t i = 0; i < s->n_r; i++) /* the first reason is the cause; the rest followed */
        if (s->r[i].job_id == job && s->r[i].attempt == attempt && s->r[i].failing) {
            reason = s->r[i].fail_reason;
            break;
        }
    mge_store_job_set_state(s->st, job, attempt, MGE_JOB_FAILED, reason, NULL);
    attempt_finish(s, job, attempt, false);
}

/* "rank 1 killed by signal 9[ on wb]" or "rank 0 exited with code 2 (bad input)[ on wa]". */
static void rank_end_reason(char *out, size_t size, int rank, int code, int sig, const char *where)
{
    if (sig)
        snprintf(out, size, "rank %d killed by signal %d%s%s", rank, sig, where ? " on " : "",
                 where ? where : "");
    else
        snprintf(out, size, "rank %d exited with code %d%s%s%s", rank, code,
                 code == 2 ? " (bad input)" : "", where ? " on " : "", where ? where : "");
}

/* Does mpirun's line @t name a failed rank (*@rank), or the code it ended with (*@code)? */
static bool mpirun_line_rank(const char *t, int *rank)
{
    const char *p;
    return ((p = strstr(t, "Process name: [[")) &&
            sscanf(p, "Process name: [[%*d,%*d],%d]", rank) == 1) ||
           ((p = strstr(t, "MPI_ABORT was invoked on rank ")) &&
            sscanf(p, "MPI_ABORT was invoked on rank %d", rank) == 1);
}

static bool mpirun_line_code(const char *t, int *code)
{
    const char *p;
    return ((p = strstr(t, "Exit code:")) && sscanf(p, "Exit code: %d", code) == 1) ||
           ((p = strstr(t, "with errorcode ")) && sscanf(p, "with errorcode %d", code) == 1);
}

/*
 * Rank 0 of gang @ended is mpirun: it exits non-zero because a rank failed, which may be
 * another one. Open MPI names the first failed rank on its stderr, which the store holds by
 * now (a worker reports an exit only with all of the rank's output before it):
 *   "mpirun noticed that process rank 1 with PID 11127 on node wb exited on signal 9 (Killed)."
 *   "  Process name: [[41239,1],1]" followed by "  Exit code:    2"
 *   "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD" and "with errorcode 2."
 *   (mge-train aborts the job when it fails on one rank)
 * Write "rank 1 killed by signal 9 on wb" (or "... exited with code 2 ...") into @reason and
 * return true, or false when the log names no rank. Lock held.
 */
static bool mpirun_cause(struct mge_sched *s, const struct resv *ended, char *reason, size_t size)
{
    json_t *logs = NULL, *l;
    size_t i;
    int rank = -1, sig = 0, code = 0, named = -1;
    bool found = false;
    const struct resv *r;

    if (mge_store_logs(s->st, ended->job_id, 0, 200, &logs) != MGE_OK)
        return false;
    json_array_foreach(json_object_get(logs, "lines"), i, l)
    {
        const char *t = json_string_value(json_object_get(l, "text")), *p;
        if (!t || json_integer_value(json_object_get(l, "attempt")) != ended->attempt)
            continue;
        if ((p = strstr(t, " noticed that process rank ")) &&
            sscanf(p, " noticed that process rank %d with PID %*d on node %*s exited on signal %d",
                   &rank, &sig) == 2) {
            found = true;
            break;
        }
        if (named >= 0 && mpirun_line_code(t, &code)) {
            rank = named;
            found = true;
            break;
        }
        mpirun_line_rank(t, &named);
    }
    json_decref(logs);
    if (!found || rank < 0 || rank >= ended->world)
        return false;
    r = resv_find(s, ended->job_id, ended->attempt, rank);
    rank_end_reason(reason, size, rank, code, sig, r && r->widx >= 0 ? s->w[r->widx].name : "?");
    return true;
}

/* Decide attempt (@job, @attempt) after one of its ranks ended. Lock held. */
static void attempt_check(struct mge_sched *s, struct resv *ended)
{
    char reason[512];
    bool all_ok = true;
    int64_t job = ended->job_id;
    int attempt = ended->attempt;

    if (ended->finished)
        return;
    if (ended->failing) { /* a rank of a gang being torn down: count it */
        gang_failing(s, job, attempt, ended->fail_reason);
        return;
    }
    if (ended->exit_code != 0 || ended->term_signal != 0) {
        if (ended->world > 1 && ended->rank == 0 && mpirun_cause(s, ended, reason, sizeof(reason)))
            ; /* the rank that failed first, as mpirun saw it */
        else
            rank_end_reason(reason, sizeof(reason), ended->rank, ended->exit_code,
                            ended->term_signal, NULL);
        if (ended->world > 1) {
            gang_failing(s, job, attempt, reason);
            return;
        }
        mge_store_job_set_state(s->st, job, attempt, MGE_JOB_FAILED, reason, NULL);
        attempt_finish(s, job, attempt, true);
        return;
    }
    if (ended->world > 1 && ended->rank == 0) {
        /* rank 0 is mpirun: exit 0 means every rank finished; daemons still ending are not
         * a reason to run the job again if their worker goes quiet now */
        mge_store_job_set_state(s->st, job, attempt, MGE_JOB_SUCCEEDED, NULL, NULL);
        attempt_finish(s, job, attempt, false);
        mge_log_info("job %lld succeeded", (long long)job);
        return;
    }
    for (size_t i = 0; i < s->n_r; i++)
        if (s->r[i].job_id == job && s->r[i].attempt == attempt &&
            (!s->r[i].exited || s->r[i].exit_code != 0 || s->r[i].term_signal != 0))
            all_ok = false;
    if (all_ok) {
        mge_store_job_set_state(s->st, job, attempt, MGE_JOB_SUCCEEDED, NULL, NULL);
        attempt_finish(s, job, attempt, false);
        mge_log_info("job %lld succeeded", (long long)job);
    }
}

/*
 * The step progress in @lines from worker @wi: rank 0's metric lines ({"step": N, ...}) of
 * the current attempt placed there (the store drops the others too). Lock held.
 */
static void progress_from_lines(struct mge_sched *s, int wi, const struct mge_store_line *lines,
                                size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct mge_store_line *l = &lines[i];
        struct resv *r;
        json_t *o, *step;
        if (l->stream != 2 || l->rank != 0 || !l->text)
            continue;
        r = resv_find(s, l->job_id, l->attempt, 0);
        if (!r || r->widx != wi || r->finished)
            continue;
        o = json_loads(l->text, 0, NULL);
        step = json_object_get(o, "step");
        if (json_is_integer(step) && !json_object_get(o, "summary"))
            progress_note(s, r, json_integer_value(step), l->time_ms);
        json_decref(o);
    }
}

int mge_sched_worker_heartbeat(struct mge_sched *s, const char *id,
                               const struct mge_rank_report *ranks, size_t n,
                               const struct mge_store_line *lines, size_t n_lines,
                               struct mge_sched_cmds *out)
{
    struct worker *w;
    int wi, rc = MGE_OK;
    int64_t now = now_ms(s);

    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&s->mu);
    wi = worker_find(s, id);
    if (wi < 0) {
        rc = MGE_NOENT;
        goto out_unlock;
    }
    w = &s->w[wi];
    out->grace_ms = s->opts.cancel_grace_ms;
    if (w->state == W_LOST) {
        /* Its jobs were requeued; it must register again, which also cancels its leftovers. */
        rc = MGE_NOENT;
        goto out_unlock;
    }
    w->last_seen = now;
    w->seen = true;
    w->last_seen_wall = mge_now_ms();
    progress_from_lines(s, wi, lines, n_lines);
    at_checkpoint(s, wi, lines, n_lines);
    out->acks = n ? mge_calloc(n, sizeof(*out->acks)) : NULL;
    for (size_t i = 0; i < n; i++) {
        const struct mge_rank_report *rep = &ranks[i];
        struct resv *r = resv_find(s, rep->job_id, rep->attempt, rep->rank);
        if (!r || r->widx != wi) {
            /* Not placed here in a live attempt (cancelled before a restart, a superseded
             * attempt, another worker's rank): a running one ends, an exit changes nothing
             * but is acked so that the worker stops reporting it. */
            if (rep->running) {
                queue_cancel(s, wi, rep->job_id, rep->attempt);
                continue;
            }
            fence_refuse(s, wi, rep, r, "exit");
            if (out->acks)
                out->acks[out->n_acks++] = (struct mge_sched_exit_ack){rep->job_id, rep->attempt,
                                                                        rep->rank};
            continue;
        }
        if (rep->running) {
            if (r->cpu_ms <= 0)
                r->cpu_mark = rep->cpu_ms; /* the first report: the baseline */
            r->stopped = rep->stopped;
            r->cpu_ms = rep->cpu_ms;
            if ((r->finished || r->failing) && now - r->cancel_sent > CANCEL_RESEND_MS) {
                r->cancel_sent = now;
                queue_cancel(s, wi, r->job_id, r->attempt);
            }
            continue;
        }
        if (!r->exited) {
            int code = rep->exit_code;
            if (rep->failure && *rep->failure && code == 0 && rep->term_signal == 0)
                code = 1;
            if (mge_store_placement_exit(s->st, r->job_id, r->attempt, r->rank, code,
                                         rep->term_signal) != MGE_OK)
                continue; /* not acked: the worker reports it again */
            r->exited = true;
            r->exit_code = code;
            r->term_signal = rep->term_signal;
            if (rep->worker_fault && rep->failure && *rep->failure && !r->finished && !r->failing) {
                job_worker_fault(s, r, rep->failure);
            } else if (rep->failure && *rep->failure && !r->finished && r->world > 1) {
                gang_failing(s, r->job_id, r->attempt, r->failing ? r->fail_reason : rep->failure);
            } else if (rep->failure && *rep->failure && !r->finished) {
                mge_store_job_set_state(s->st, r->job_id, r->attempt, MGE_JOB_FAILED,
                                        rep->failure, NULL);
                attempt_finish(s, r->job_id, r->attempt, true);
            } else {
                attempt_check(s, r);
            }
            s->dirty = true;
        }
        if (out->acks)
            out->acks[out->n_acks++] = (struct mge_sched_exit_ack){rep->job_id, rep->attempt,
                                                                    rep->rank};
    }
    /* Ranks placed here that the worker does not report: their Assign never arrived, or, for
     * an attempt already decided (one superseded before a restart), they have ended. */
    for (size_t i = 0; i < s->n_r; i++) {
        struct resv *r = &s->r[i];
        bool reported = false;
        if (r->widx != wi || r->exited)
            continue;
        for (size_t k = 0; k < n && !reported; k++)
            reported = ranks[k].job_id == r->job_id && ranks[k].attempt == r->attempt &&
                       ranks[k].rank == r->rank;
        if (reported)
            continue;
        if (!r->finished) {
            queue_assign(s, r);
        } else if (!assign_queued(w, r)) {
            r->exited = true;
            s->dirty = true;
        }
    }
    out->assign = w->assign;
    out->n_assign = w->n_assign;
    out->cancel = w->cancel;
    out->n_cancel = w->n_cancel;
    w->assign = NULL;
    w->n_assign = w->cap_assign = 0;
    w->cancel = NULL;
    w->n_cancel = w->cap_cancel = 0;
    out->ckpt = w->ckpt;
    out->n_ckpt = w->n_ckpt;
    w->ckpt = NULL;
    w->n_ckpt = w->cap_ckpt = 0;
    if (s->dirty)
        pthread_cond_signal(&s->cv);
out_unlock:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

bool mge_sched_worker_known(struct mge_sched *s, const char *id)
{
    int wi;
    bool known;
    pthread_mutex_lock(&s->mu);
    wi = worker_find(s, id);
    known = wi >= 0 && s->w[wi].state != W_LOST;
    pthread_mutex_unlock(&s->mu);
    return known;
}

int mge_sched_job_cancel(struct mge_sched *s, int64_t id)
{
    struct mge_job_row row;
    bool changed = false;
    int rc;
    pthread_mutex_lock(&s->mu);
    rc = mge_store_job_row(s->st, id, &row);
    if (rc != MGE_OK)
        goto out_unlock;
    if (mge_job_state_is_terminal(row.state)) {
        rc = MGE_STATE;
        goto out_unlock;
    }
    rc = mge_store_job_set_state(s->st, id, 0, MGE_JOB_CANCELLED, "cancelled by user", &changed);
    if (rc != MGE_OK)
        goto out_unlock;
    if (!changed) {
        rc = MGE_STATE;
        goto out_unlock;
    }
    attempt_finish(s, id, 0, true);
    s->dirty = true;
    pthread_cond_signal(&s->cv);
out_unlock:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int64_t mge_sched_memory_max_mb(struct mge_sched *s)
{
    int64_t best = 0;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n_w; i++)
        if (s->w[i].state != W_LOST && s->w[i].memory_mb > best)
            best = s->w[i].memory_mb;
    pthread_mutex_unlock(&s->mu);
    return best;
}

int64_t mge_sched_gpu_memory_max_mb(struct mge_sched *s)
{
    int64_t best = 0;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n_w; i++)
        for (int k = 0; s->w[i].state != W_LOST && k < s->w[i].gpus && k < MGE_GPUS_MAX; k++)
            if (s->w[i].gpu[k].memory_mb > best)
                best = s->w[i].gpu[k].memory_mb;
    pthread_mutex_unlock(&s->mu);
    return best;
}

/*
 * Why no worker could ever hold GPU job @j, into @buf ("" when one could, by its GPUs): none has
 * a GPU, or none has a GPU with the memory @j needs (naming the largest), or none has enough
 * such GPUs. Lock held.
 */
static void pending_gpus(const struct mge_sched *s, const struct mge_job_row *j, char *buf,
                         size_t len)
{
    int with_gpu = 0, most = 0, big_w = -1;
    int64_t biggest = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < s->n_w; i++) {
        const struct worker *w = &s->w[i];
        int enough = 0;
        if (w->state == W_LOST || w->gpus <= 0)
            continue;
        with_gpu++;
        for (int k = 0; k < w->gpus && k < MGE_GPUS_MAX; k++) {
            enough += w->gpu[k].memory_mb >= j->gpu_memory_mb;
            if (w->gpu[k].memory_mb > biggest) {
                biggest = w->gpu[k].memory_mb;
                big_w = (int)i;
            }
        }
        if (enough > most)
            most = enough;
    }
    if (with_gpu == 0)
        snprintf(buf, len, "; no registered worker has a GPU");
    else if (most == 0)
        snprintf(buf, len, "; no GPU has %lld MiB: the largest has %lld MiB (worker '%s')",
                 (long long)j->gpu_memory_mb, (long long)biggest, s->w[big_w].name);
    else if (most < j->gpus)
        snprintf(buf, len, "; the most such GPUs a worker has is %d", most);
}

/*
 * When running attempt @r0 (its rank 0) will end, in ms from now (wall clock), from its speed
 * over its last 5-10 s of step reports (since its first report before that); -1 when it cannot be
 * told yet (fewer than two reports, or an unknown length). Lock held.
 */
static int64_t attempt_eta_ms(const struct resv *r0, int64_t wall_now)
{
    const struct progress *p = &r0->prog;
    double ms_per_step;
    int64_t left;
    if (r0->total_steps <= 0 || p->line_ms0 <= 0 || p->step <= p->step0 ||
        p->last_line_ms <= p->line_ms0)
        return -1;
    ms_per_step = (double)(p->last_line_ms - p->line_ms0) / (double)(p->step - p->step0);
    left =
        (int64_t)(ms_per_step * (double)(r0->total_steps - p->step)) - (wall_now - p->last_line_ms);
    return left > 0 ? left : 0;
}

struct eta_end {
    int64_t eta, job_id;
    int attempt;
};

static int cmp_eta(const void *a, const void *b)
{
    const struct eta_end *x = a, *y = b;
    return (x->eta > y->eta) - (x->eta < y->eta);
}

/*
 * Queued job @q started in thought: its ranks take @q's slots out of @cpus/@gpus/@mem on the
 * first workers that fit, as place_one() would give them. False (nothing taken) when fewer than
 * @q's minimum fit. Lock held.
 */
static bool sim_start(const struct mge_sched *s, const struct mge_job_row *q, int *cpus,
                      uint64_t *gpus, int64_t *mem)
{
    int need = q->workers_min;
    if (workers_fitting(s, q, cpus, gpus, mem) < need)
        return false;
    for (size_t i = 0; i < s->n_w && need > 0; i++) {
        if (!worker_takes(&s->w[i]) || (q->workers_max > 1 && !worker_launches(&s->w[i])) ||
            !fits(&s->w[i], q, cpus[i], gpus[i], mem[i]))
            continue;
        cpus[i] -= q->cpus;
        gpus[i] &= ~gpu_pick(&s->w[i], q, gpus[i]);
        mem[i] -= q->memory_mb > 0 ? q->memory_mb : 0;
        need--;
    }
    return true;
}

/*
 * When queued job @j could start, as the scheduler's passes would go: the running attempts end
 * in the order of their ETAs, each giving its slots back; after each, the queued jobs ahead of
 * @j (higher priority, then older: @ahead, @n_ahead) start where they fit, in that order, and
 * keep their slots (their length is not known before they run); then @j starts once @n usable
 * workers could hold a rank of it. Writes "; about 40 s (job 12 ends)", with "1 queued job
 * ahead starts first" when one would take slots before it, or why there is no estimate, to
 * @buf. Lock held.
 */
static void pending_eta(struct mge_sched *s, const struct mge_job_row *j, int n,
                        const struct mge_job_row *ahead, int n_ahead, char *buf, size_t len)
{
    struct slots sl;
    int64_t wall = mge_now_ms();
    struct eta_end *ends = mge_calloc(s->n_r + 1, sizeof(*ends));
    bool *started = mge_calloc((size_t)n_ahead + 1, sizeof(*started));
    size_t n_ends = 0;
    int unknown = 0, n_started = 0;
    int64_t first_ahead = 0;

    buf[0] = '\0';
    if (!slots_now(s, &sl) || !ends || !started)
        goto out;
    for (size_t i = 0; i < s->n_r; i++) {
        const struct resv *r = &s->r[i];
        if (r->rank != 0 || r->finished || r->exited)
            continue;
        ends[n_ends].eta = attempt_eta_ms(r, wall);
        if (ends[n_ends].eta < 0) {
            unknown++;
            continue;
        }
        ends[n_ends].job_id = r->job_id;
        ends[n_ends++].attempt = r->attempt;
    }
    qsort(ends, n_ends, sizeof(*ends), cmp_eta);
    for (size_t e = 0; e <= n_ends; e++) {
        if (e > 0)
            attempt_release(s, ends[e - 1].job_id, ends[e - 1].attempt, sl.cpus, sl.gpus, sl.mem);
        for (int q = 0; q < n_ahead; q++)
            if (!started[q] && sim_start(s, &ahead[q], sl.cpus, sl.gpus, sl.mem)) {
                started[q] = true;
                if (n_started++ == 0)
                    first_ahead = ahead[q].id;
            }
        if (e == 0 || workers_fitting(s, j, sl.cpus, sl.gpus, sl.mem) < n)
            continue;
        if (n_started == 0)
            snprintf(buf, len, "; about %lld s (job %lld ends)",
                     (long long)((ends[e - 1].eta + 999) / 1000), (long long)ends[e - 1].job_id);
        else
            snprintf(buf, len,
                     "; about %lld s (job %lld ends; %d queued job%s ahead start%s first)",
                     (long long)((ends[e - 1].eta + 999) / 1000), (long long)ends[e - 1].job_id,
                     n_started, n_started == 1 ? "" : "s", n_started == 1 ? "s" : "");
        goto out;
    }
    if (unknown > 0)
        snprintf(buf, len, "; no estimate yet (%d running job%s not reported %s speed)", unknown,
                 unknown == 1 ? " has" : "s have", unknown == 1 ? "its" : "their");
    else if (n_started > 0)
        snprintf(buf, len,
                 "; no estimate: %d queued job%s ahead (job %lld first) take%s the slots "
                 "it needs",
                 n_started, n_started == 1 ? "" : "s", (long long)first_ahead,
                 n_started == 1 ? "s" : "");
out:
    slots_fini(&sl);
    mge_free(ends);
    mge_free(started);
}

char *mge_sched_pending_reason(struct mge_sched *s, const struct mge_job_row *j)
{
    char need[160], buf[600], eta[160] = "", gpu_why[200] = "", pre[200] = "";
    int total = 0, fit_ever = 0, fit_now = 0, usable = 0, n_pre = 0;
    int n = j->workers_min;

    pthread_mutex_lock(&s->mu);
    /* attempts a preemption for @j asked for their checkpoint: "; preempting job 3 (checkpoint
     * of step >= 30 asked 2 s ago, at most 30 s)", the first of them named */
    for (size_t i = 0; i < s->n_r; i++) {
        const struct resv *r = &s->r[i];
        if (r->rank != 0 || !r->preempt_at || r->finished || r->preempt_by != j->id ||
            r->preempt_by_attempt != j->attempt)
            continue;
        if (n_pre++ == 0)
            snprintf(pre, sizeof(pre),
                     "; preempting job %lld (checkpoint of step >= %lld asked %lld s ago, at "
                     "most %d s)",
                     (long long)r->job_id, (long long)r->preempt_step,
                     (long long)((now_ms(s) - r->preempt_at) / 1000),
                     s->opts.preempt_ckpt_ms / 1000);
    }
    if (n_pre > 1) {
        size_t len = strlen(pre);
        snprintf(pre + len, sizeof(pre) - len, " and %d more", n_pre - 1);
    }
    for (size_t i = 0; i < s->n_w; i++) {
        int cpus;
        uint64_t gpus;
        int64_t mem;
        if (s->w[i].state == W_LOST)
            continue;
        total++;
        if (!worker_usable(&s->w[i]))
            continue;
        usable++;
        if (fits(&s->w[i], j, s->w[i].cpus, gpus_all(&s->w[i]), s->w[i].memory_mb))
            fit_ever++;
        worker_free(s, (int)i, &cpus, &gpus, &mem, NULL);
        if (fits(&s->w[i], j, cpus, gpus, mem))
            fit_now++;
    }
    if (fit_ever >= n && fit_now < n) {
        /* the queued jobs the scheduler's passes consider before @j */
        struct mge_job_row *rows = NULL;
        int n_rows = 0, n_ahead = 0;
        bool found = false;
        if (mge_store_jobs_queued(s->st, QUEUE_SCAN_MAX, &rows, &n_rows) != MGE_OK)
            n_rows = 0;
        for (int i = 0; i < n_rows && !found; i++) {
            found = rows[i].id == j->id;
            /* one placed this pass holds its slots already */
            if (!found && !attempt_placed(s, rows[i].id, rows[i].attempt))
                rows[n_ahead++] = rows[i];
        }
        if (!found) /* @j is not in the queue read (any more): none are ahead */
            n_ahead = 0;
        pending_eta(s, j, n, rows, n_ahead, eta, sizeof(eta));
        mge_free(rows);
    }
    if (j->gpus > 0 && fit_ever < n)
        pending_gpus(s, j, gpu_why, sizeof(gpu_why));
    pthread_mutex_unlock(&s->mu);

    if (j->gpus > 0) {
        /* "needs 1 worker with 1 GPU of 300 MiB, 2 CPUs" */
        int off = snprintf(need, sizeof(need), "needs %d worker%s with %d GPU%s", n,
                           n == 1 ? "" : "s", j->gpus, j->gpus == 1 ? "" : "s");
        if (j->gpu_memory_mb > 0 && off > 0 && (size_t)off < sizeof(need))
            off += snprintf(need + off, sizeof(need) - (size_t)off, " of %lld MiB",
                            (long long)j->gpu_memory_mb);
        if (j->cpus > 1 && off > 0 && (size_t)off < sizeof(need))
            off += snprintf(need + off, sizeof(need) - (size_t)off, ", %d CPUs", j->cpus);
        if (j->memory_mb > 0 && off > 0 && (size_t)off < sizeof(need))
            snprintf(need + off, sizeof(need) - (size_t)off, ", %lld MiB of memory",
                     (long long)j->memory_mb);
    } else {
        int off = snprintf(need, sizeof(need), "needs %d %sworker%s with %d CPU%s", n,
                           j->device == MGE_DEVICE_GPU ? "GPU " : "", n == 1 ? "" : "s", j->cpus,
                           j->cpus == 1 ? "" : "s");
        if (j->memory_mb > 0 && off > 0 && (size_t)off < sizeof(need))
            snprintf(need + off, sizeof(need) - (size_t)off, ", %lld MiB",
                     (long long)j->memory_mb);
    }
    if (gpu_why[0])
        snprintf(buf, sizeof(buf), "%s%s", need, gpu_why);
    else if (total == 0)
        snprintf(buf, sizeof(buf), "%s, no workers are connected", need);
    else if (usable == 0)
        snprintf(buf, sizeof(buf), "%s, %s %d connected worker%s draining", need,
                 total == 1 ? "the" : "all", total, total == 1 ? " is" : "s are");
    else if (fit_ever < n)
        snprintf(buf, sizeof(buf), "%s, only %d worker%s that large", need, fit_ever,
                 fit_ever == 1 ? " is" : "s are");
    else if (fit_now < n)
        snprintf(buf, sizeof(buf), "%s, %d free%s%s", need, fit_now, eta, pre);
    else
        snprintf(buf, sizeof(buf), "%s, %d free: waiting for the scheduler", need, fit_now);
    return mge_strdup(buf);
}

static json_t *worker_json(struct mge_sched *s, int wi)
{
    struct worker *w = &s->w[wi];
    int cpus, ranks;
    uint64_t gpus;
    int64_t mem;
    const char *state = worker_state_names[w->state];
    char seen[40];
    time_t t = (time_t)(w->last_seen_wall / 1000);
    struct tm tm;
    json_t *list = json_array();
    worker_free(s, wi, &cpus, &gpus, &mem, &ranks);
    if (w->state == W_DRAINING && ranks == 0)
        state = "drained";
    gmtime_r(&t, &tm);
    strftime(seen, sizeof(seen), "%Y-%m-%dT%H:%M:%SZ", &tm);
    for (int k = 0; list && k < w->gpus && k < MGE_GPUS_MAX; k++)
        json_array_append_new(
            list, json_pack("{s:i, s:s, s:I, s:b}", "index", k, "name", w->gpu[k].name, "memory_mb",
                            (json_int_t)w->gpu[k].memory_mb, "free", (int)(gpus >> k & 1)));
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:{s:i, s:I, s:i, s:s}, s:{s:i, s:I, s:i},"
                     " s:o, s:i, s:s, s:b}",
                     "id", w->id, "name", w->name, "host", w->host, "state", state, "version",
                     w->version, "slots", "cpus", w->cpus, "memory_mb", (json_int_t)w->memory_mb,
                     "gpus", w->gpus, "device", w->device, "free", "cpus", cpus, "memory_mb",
                     (json_int_t)mem, "gpus", mge_gpu_mask_count(gpus), "gpus",
                     list ? list : json_array(), "running_ranks", ranks, "last_seen", seen, "drain",
                     (int)w->drain);
}

json_t *mge_sched_workers_json(struct mge_sched *s)
{
    json_t *arr = json_array();
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; arr && i < s->n_w; i++)
        json_array_append_new(arr, worker_json(s, (int)i));
    pthread_mutex_unlock(&s->mu);
    return arr;
}

/*
 * Worker @wi was drained: an elastic job running there is re-formed without it (requeued, not
 * charged) when enough other ready workers could hold its ranks (by their total slots);
 * otherwise, and for a job of a fixed size, its ranks there finish normally. Lock held.
 */
static void drain_reform(struct mge_sched *s, int wi)
{
    for (size_t i = 0; i < s->n_r; i++) {
        struct resv *r = &s->r[i];
        struct mge_job_row row;
        char reason[200];
        bool requeued = false;
        if (r->widx != wi || r->finished || r->failing || r->exited ||
            mge_store_job_row(s->st, r->job_id, &row) != MGE_OK ||
            row.workers_min >= row.workers_max || row.attempt != r->attempt ||
            workers_could_hold(s, wi, &row) < row.workers_min)
            continue;
        snprintf(reason, sizeof(reason), "worker %s drained", s->w[wi].name);
        if (mge_store_job_requeue(s->st, r->job_id, r->attempt, reason, false, &requeued) != MGE_OK)
            continue; /* its ranks run on; the drain itself is stored */
        mge_log_info("job %lld attempt %d: %s: re-forming it", (long long)r->job_id, r->attempt,
                     reason);
        attempt_finish(s, r->job_id, r->attempt, true);
        s->dirty = true;
    }
}

/* Drain (@on) or undrain worker @id (its id or name): see sched.h. */
static int worker_set_drain(struct mge_sched *s, const char *id, bool on, json_t **out)
{
    int wi, rc = MGE_OK;
    struct worker *w;
    *out = NULL;
    pthread_mutex_lock(&s->mu);
    wi = worker_find(s, id);
    if (wi < 0)
        wi = worker_find_name(s, id);
    if (wi < 0) {
        rc = MGE_NOENT;
        goto out_unlock;
    }
    w = &s->w[wi];
    if (w->drain != on) {
        w->drain = on;
        mge_store_worker_set_state(s->st, w->id,
                                   on ? "draining" : w->state == W_LOST ? "lost" : "ready");
        if (!on)
            mge_log_info("worker '%s' undrained: it takes new ranks again", w->name);
    }
    if (on && w->state == W_READY) {
        w->state = W_DRAINING;
        mge_log_info("worker '%s' draining", w->name);
        drain_reform(s, wi);
    } else if (!on && w->state == W_DRAINING) {
        w->state = W_READY;
        s->dirty = true; /* queued jobs may fit now */
    }
    if (s->dirty)
        pthread_cond_signal(&s->cv);
    *out = worker_json(s, wi);
out_unlock:
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int mge_sched_worker_drain(struct mge_sched *s, const char *id, json_t **out)
{
    return worker_set_drain(s, id, true, out);
}

int mge_sched_worker_undrain(struct mge_sched *s, const char *id, json_t **out)
{
    return worker_set_drain(s, id, false, out);
}

void mge_sched_stats_get(struct mge_sched *s, struct mge_sched_stats *out)
{
    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->n_w; i++) {
        if (s->w[i].state == W_READY)
            out->workers_ready++;
        else if (s->w[i].state == W_DRAINING)
            out->workers_draining++;
        else
            out->workers_lost++;
    }
    for (size_t i = 0; i < s->n_r; i++)
        out->ranks_running += !s->r[i].exited;
    out->fenced_reports = s->fenced;
    pthread_mutex_unlock(&s->mu);
}
