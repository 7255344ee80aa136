/*
 * comm.c: the backend-independent half of engine/comm: choosing a backend from the spec and
 * the launcher's environment, and the communication thread that runs a blocking backend's
 * collectives in issue order while the training loop goes on.
 */
#include "engine/comm/comm_int.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/err.h"

double mge_comm_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A non-negative integer environment variable, or -1 when unset or malformed. */
static int env_int(const char *name)
{
    const char *s = getenv(name);
    char *end;
    if (!s || !*s)
        return -1;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 0 || v > 1 << 24)
        return -1;
    return (int)v;
}

void mge_comm_env_read(struct mge_comm_env *env)
{
    static const char *const sets[][3] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"MGE_RANK", "MGE_WORLD_SIZE", "MGE_LOCAL_RANK"},
        {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    };
    memset(env, 0, sizeof(*env));
    env->size = 1;
    for (size_t i = 0; i < sizeof(sets) / sizeof(sets[0]); i++) {
        int r = env_int(sets[i][0]), n = env_int(sets[i][1]), l = env_int(sets[i][2]);
        if (r >= 0 && n > 0 && r < n) {
            env->launched = 1;
            env->rank = r;
            env->size = n;
            env->local_rank = l >= 0 ? l : 0;
            return;
        }
    }
    /* srun --mpi=pmix exports PMIX_RANK but no size: Slurm's own variables have it */
    if (getenv("PMIX_RANK")) {
        int r = env_int("SLURM_PROCID"), n = env_int("SLURM_NTASKS"), l = env_int("SLURM_LOCALID");
        if (r >= 0 && n > 0 && r < n) {
            env->launched = 1;
            env->rank = r;
            env->size = n;
            env->local_rank = l >= 0 ? l : 0;
        }
    }
}

enum mge_backend mge_comm_backend_resolve(enum mge_backend want, enum mge_device_kind device,
                                          const struct mge_comm_env *env)
{
    if (want != MGE_BACKEND_AUTO)
        return want;
    if (env->size <= 1)
        return MGE_BACKEND_LOCAL;
    return device == MGE_DEVICE_GPU ? MGE_BACKEND_NCCL : MGE_BACKEND_MPI;
}

const char *mge_comm_backend_name(enum mge_backend b)
{
    switch (b) {
    case MGE_BACKEND_AUTO:
        return "auto";
    case MGE_BACKEND_LOCAL:
        return "local";
    case MGE_BACKEND_MPI:
        return "mpi";
    case MGE_BACKEND_NCCL:
        return "nccl";
    }
    return "?";
}

int mge_comm_backend_available(enum mge_backend b)
{
    switch (b) {
    case MGE_BACKEND_LOCAL:
        return 1;
    case MGE_BACKEND_MPI:
        return mge__comm_mpi_built;
    case MGE_BACKEND_NCCL:
        return mge__comm_nccl_built;
    case MGE_BACKEND_AUTO:
        break;
    }
    return 0;
}

int mge_comm_open(struct mge_comm **out, enum mge_backend b, const struct mge_comm_env *env,
                  char *err, size_t errlen)
{
    *out = NULL;
    switch (b) {
    case MGE_BACKEND_LOCAL:
        return mge__comm_local_open(out, env, err, errlen);
    case MGE_BACKEND_MPI:
        return mge__comm_mpi_open(out, env, err, errlen);
    case MGE_BACKEND_NCCL:
        return mge__comm_nccl_open(out, env, err, errlen);
    case MGE_BACKEND_AUTO:
        break;
    }
    snprintf(err, errlen, "distributed.backend: resolve 'auto' before opening a communicator");
    return MGE_INVAL;
}

int mge_comm_on_device(const struct mge_comm *c)
{
    return c->backend == MGE_BACKEND_NCCL;
}

int mge_comm_rank(const struct mge_comm *c)
{
    return c->rank;
}
int mge_comm_size(const struct mge_comm *c)
{
    return c->size;
}
enum mge_backend mge_comm_backend(const struct mge_comm *c)
{
    return c->backend;
}

/* ---- the communication thread ---- */

static int run_op(struct mge_comm *c, const struct mge__comm_op *op)
{
    switch (op->kind) {
    case MGE__COMM_ALLREDUCE:
        return c->ops->allreduce(c, op->buf, op->count, op->dt);
    case MGE__COMM_BROADCAST:
        return c->ops->broadcast(c, op->buf, op->count, op->root);
    case MGE__COMM_ALLGATHER:
        return c->ops->allgather(c, op->send, op->count, op->buf);
    case MGE__COMM_BARRIER:
        return c->ops->barrier(c);
    }
    return MGE_INTERNAL;
}

/*
 * Run the oldest queued collective. Called with c->mu held, nothing running, and work queued;
 * returns with c->mu held. Whoever calls it (the communication thread, or the training thread
 * waiting for that very collective) is the only thread in the library meanwhile (running),
 * which is all MPI_THREAD_SERIALIZED asks; the mutex orders the calls.
 */
static void run_next_locked(struct mge_comm *c)
{
    uint64_t t = c->completed + 1;
    struct mge__comm_op op = c->queue[t % MGE__COMM_RING];
    int failed = c->err;
    c->running = 1;
    pthread_mutex_unlock(&c->mu);
    struct mge_comm_timing tm = {mge_comm_now(), 0.0};
    int rc = failed ? failed : run_op(c, &op);
    tm.end = mge_comm_now();
    pthread_mutex_lock(&c->mu);
    if (rc != MGE_OK && !c->err) {
        c->err = rc;
        c->err_at = t;
    }
    c->timing[t % MGE__COMM_RING] = tm;
    c->completed = t;
    c->running = 0;
    pthread_cond_broadcast(&c->done);
    /* more work for the communication thread (it may have gone back to sleep while this ran
     * on the waiting thread); work queued for a waiter stays with it: waking the thread then
     * only makes it compete for the cores with the ranks' own progress */
    if (c->completed < c->issued && c->queue[(c->completed + 1) % MGE__COMM_RING].wake)
        pthread_cond_signal(&c->work);
}

static void *comm_thread(void *arg)
{
    struct mge_comm *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        /* idle waits block here, never spin: backward keeps the core */
        while (!c->stop && (c->running || c->completed == c->issued))
            pthread_cond_wait(&c->work, &c->mu);
        if (c->running || c->completed == c->issued)
            break; /* stop, and nothing left */
        run_next_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int mge__comm_new(struct mge_comm **out, const struct mge__comm_ops *ops, enum mge_backend b,
                  int rank, int size, void *impl)
{
    struct mge_comm *c = mge_calloc(1, sizeof(*c));
    *out = NULL;
    if (!c)
        return MGE_ERR(MGE_NOMEM, "cannot allocate communicator");
    c->ops = ops;
    c->backend = b;
    c->rank = rank;
    c->size = size;
    c->impl = impl;
    /* one rank has nothing to overlap: its collectives are no-ops and run inline */
    if (ops->threaded && size > 1) {
        if (pthread_mutex_init(&c->mu, NULL) != 0)
            goto err_free;
        if (pthread_cond_init(&c->work, NULL) != 0)
            goto err_mutex;
        if (pthread_cond_init(&c->done, NULL) != 0)
            goto err_work;
        if (pthread_create(&c->thread, NULL, comm_thread, c) != 0)
            goto err_done;
        c->thread_ok = 1;
    }
    *out = c;
    return MGE_OK;
err_done:
    pthread_cond_destroy(&c->done);
err_work:
    pthread_cond_destroy(&c->work);
err_mutex:
    pthread_mutex_destroy(&c->mu);
err_free:
    mge_free(c);
    return MGE_ERR(MGE_INTERNAL, "cannot start the communication thread");
}

static void stop_thread(struct mge_comm *c)
{
    if (!c->thread_ok)
        return;
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    pthread_cond_signal(&c->work);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
    c->thread_ok = 0;
    pthread_cond_destroy(&c->done);
    pthread_cond_destroy(&c->work);
    pthread_mutex_destroy(&c->mu);
}

void mge_comm_close(struct mge_comm *c)
{
    if (!c)
        return;
    stop_thread(c); /* runs what is queued first, so every rank still matches */
    c->ops->close(c);
    mge_free(c);
}

void mge_comm_abort(struct mge_comm *c, int code)
{
    if (c && c->ops->abort)
        c->ops->abort(c, code);
}

/*
 * Queue @op; *@ticket names it. @wake: signal the communication thread (not needed when it is
 * busy: it takes the next item before it sleeps; nor when the caller waits next and would run
 * it itself). Caller: the communicator's one user thread.
 */
static int enqueue(struct mge_comm *c, const struct mge__comm_op *op, uint64_t *ticket, bool wake)
{
    pthread_mutex_lock(&c->mu);
    while (!c->err && c->issued - c->completed >= MGE__COMM_RING - 1)
        pthread_cond_wait(&c->done, &c->mu);
    int rc = c->err;
    if (rc == MGE_OK) {
        *ticket = ++c->issued;
        c->queue[*ticket % MGE__COMM_RING] = *op;
        c->queue[*ticket % MGE__COMM_RING].wake = wake;
        if (wake)
            pthread_cond_signal(&c->work);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int wait_ticket(struct mge_comm *c, uint64_t ticket, struct mge_comm_timing *timing)
{
    pthread_mutex_lock(&c->mu);
    /*
     * The waiter runs queued collectives itself when the communication thread is not in one
     * (it has not woken up yet): waiting is all it would do, and a thread's wake-up on a busy
     * machine costs more than a small all-reduce.
     */
    while (c->completed < ticket) {
        if (!c->running)
            run_next_locked(c);
        else
            pthread_cond_wait(&c->done, &c->mu);
    }
    int rc = c->err && ticket >= c->err_at ? c->err : MGE_OK;
    if (timing && c->issued - ticket < MGE__COMM_RING - 1)
        *timing = c->timing[ticket % MGE__COMM_RING];
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* Run @op: on the thread (after everything queued) or here. */
static int run_blocking(struct mge_comm *c, const struct mge__comm_op *op)
{
    if (!c->thread_ok) {
        if (c->ops->wait && c->issued) { /* the backend's own async work goes first */
            int rc = c->ops->wait(c, c->issued, NULL);
            if (rc != MGE_OK)
                return rc;
        }
        return run_op(c, op);
    }
    uint64_t t;
    int rc = enqueue(c, op, &t, false);
    return rc != MGE_OK ? rc : wait_ticket(c, t, NULL);
}

int mge_comm_allreduce(struct mge_comm *c, void *buf, size_t count, enum mge_comm_dtype dt)
{
    struct mge__comm_op op = {.kind = MGE__COMM_ALLREDUCE, .buf = buf, .count = count, .dt = dt};
    return run_blocking(c, &op);
}

int mge_comm_broadcast(struct mge_comm *c, void *buf, size_t bytes, int root)
{
    struct mge__comm_op op = {
        .kind = MGE__COMM_BROADCAST, .buf = buf, .count = bytes, .root = root};
    if (root < 0 || root >= c->size)
        return MGE_ERR(MGE_INVAL, "broadcast root %d outside 0..%d", root, c->size - 1);
    return run_blocking(c, &op);
}

int mge_comm_allgather(struct mge_comm *c, const void *send, size_t bytes, void *recv)
{
    struct mge__comm_op op = {
        .kind = MGE__COMM_ALLGATHER, .buf = recv, .send = send, .count = bytes};
    return run_blocking(c, &op);
}

int mge_comm_barrier(struct mge_comm *c)
{
    struct mge__comm_op op = {.kind = MGE__COMM_BARRIER};
    return run_blocking(c, &op);
}

static int allreduce_start(struct mge_comm *c, void *buf, size_t count, enum mge_comm_dtype dt,
                           uint64_t *ticket, bool wake)
{
    struct mge__comm_op op = {.kind = MGE__COMM_ALLREDUCE, .buf = buf, .count = count, .dt = dt};
    if (c->thread_ok)
        return enqueue(c, &op, ticket, wake);
    if (c->err)
        return c->err;
    uint64_t t = ++c->issued;
    *ticket = t;
    if (c->ops->allreduce_start) {
        int rc = c->ops->allreduce_start(c, buf, count, dt, t);
        if (rc != MGE_OK) {
            c->err = rc;
            c->err_at = t;
        }
        return rc;
    }
    /* no thread and no async form (local): it runs now */
    struct mge_comm_timing tm = {mge_comm_now(), 0.0};
    int rc = c->ops->allreduce(c, buf, count, dt);
    tm.end = mge_comm_now();
    c->timing[t % MGE__COMM_RING] = tm;
    c->completed = t;
    if (rc != MGE_OK) {
        c->err = rc;
        c->err_at = t;
    }
    return rc;
}

int mge_comm_allreduce_start(struct mge_comm *c, void *buf, size_t count, enum mge_comm_dtype dt,
                             uint64_t *ticket)
{
    return allreduce_start(c, buf, count, dt, ticket, true);
}

int mge_comm_allreduce_queue(struct mge_comm *c, void *buf, size_t count, enum mge_comm_dtype dt,
                             uint64_t *ticket)
{
    return allreduce_start(c, buf, count, dt, ticket, false);
}

int mge_comm_wait(struct mge_comm *c, uint64_t ticket, struct mge_comm_timing *timing)
{
    if (ticket == 0 || ticket > c->issued)
        return MGE_ERR(MGE_INVAL, "no collective with ticket %llu", (unsigned long long)ticket);
    if (c->thread_ok)
        return wait_ticket(c, ticket, timing);
    if (c->ops->wait)
        return c->ops->wait(c, ticket, timing);
    if (timing && c->issued - ticket < MGE__COMM_RING - 1)
        *timing = c->timing[ticket % MGE__COMM_RING];
    return c->err && ticket >= c->err_at ? c->err : MGE_OK;
}
