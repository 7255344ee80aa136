/*
 * comm_int.h: inside engine/comm only: the backend vtable, the communicator struct and its
 * work queue. A backend is one file (comm_local.c, comm_mpi.c, comm_nccl.c) exporting one
 * open function; a build without MPI or NCCL links a stub file that reports so instead.
 */
#ifndef MGE_ENGINE_COMM_INT_H
#define MGE_ENGINE_COMM_INT_H

#include <pthread.h>

#include "engine/comm/comm.h"

#define MGE__COMM_RING 256 /* collectives queued or remembered (timings) */

/*
 * A backend. Blocking entries are required; they run on the caller's thread, or on the
 * communication thread when the backend asks for one (threaded). Async entries are optional:
 * a backend with its own asynchrony (NCCL streams) fills them, and comm.c calls them instead of
 * queueing. Every entry returns MGE_OK or MGE_COMM (logged by the backend).
 */
struct mge__comm_ops {
    const char *name;
    int threaded; /* run every collective on comm.c's communication thread (size > 1) */
    int (*allreduce)(struct mge_comm *c, void *buf, size_t count, enum mge_comm_dtype dt);
    int (*broadcast)(struct mge_comm *c, void *buf, size_t bytes, int root);
    int (*allgather)(struct mge_comm *c, const void *send, size_t bytes, void *recv);
    int (*barrier)(struct mge_comm *c);
    /* optional: start ticket @ticket's all-reduce; wait for it (and fill @timing) */
    int (*allreduce_start)(struct mge_comm *c, void *buf, size_t count, enum mge_comm_dtype dt,
                           uint64_t ticket);
    int (*wait)(struct mge_comm *c, uint64_t ticket, struct mge_comm_timing *timing);
    void (*abort)(struct mge_comm *c, int code); /* never returns when size > 1 */
    void (*close)(struct mge_comm *c);           /* finalize; frees c->impl */
};

enum mge__comm_kind {
    MGE__COMM_ALLREDUCE,
    MGE__COMM_BROADCAST,
    MGE__COMM_ALLGATHER,
    MGE__COMM_BARRIER
};

/* One queued collective. */
struct mge__comm_op {
    enum mge__comm_kind kind;
    void *buf;        /* allreduce, broadcast: in place; allgather: recv */
    const void *send; /* allgather */
    size_t count;     /* allreduce: elements; broadcast, allgather: bytes */
    enum mge_comm_dtype dt;
    int root;
    int wake;         /* queued for the communication thread (0: for the thread that waits) */
};

struct mge_comm {
    const struct mge__comm_ops *ops;
    enum mge_backend backend;
    int rank, size;
    void *impl; /* the backend's state, freed by ops->close */

    /* the communication thread and its FIFO of collectives (ops->threaded only) */
    int thread_ok;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work; /* work queued and nothing running, or stop */
    pthread_cond_t done; /* completed advanced, or room in the queue */
    struct mge__comm_op queue[MGE__COMM_RING];
    uint64_t issued;    /* tickets handed out; ticket t is the t-th collective (from 1) */
    uint64_t completed; /* collectives finished (tickets 1..completed) */
    int err;            /* first failure; every later collective fails with it */
    uint64_t err_at;    /* the ticket that failed first */
    int stop;
    int running;        /* a thread is inside the backend (at most one: SERIALIZED) */
    struct mge_comm_timing timing[MGE__COMM_RING]; /* by ticket % MGE__COMM_RING */
};

/*
 * Make a communicator on @ops (rank @rank of @size, backend state @impl) and start its
 * communication thread if @ops->threaded. On error nothing is left (ops->close is not called:
 * the caller still owns @impl). Used by the backends' open functions and by the unit tests'
 * fake backend.
 */
int mge__comm_new(struct mge_comm **out, const struct mge__comm_ops *ops, enum mge_backend b,
                  int rank, int size, void *impl);

/* The backends (each in its own file; stubs say "not built in" through @err). */
int mge__comm_local_open(struct mge_comm **out, const struct mge_comm_env *env, char *err,
                         size_t errlen);
int mge__comm_mpi_open(struct mge_comm **out, const struct mge_comm_env *env, char *err,
                       size_t errlen);
int mge__comm_nccl_open(struct mge_comm **out, const struct mge_comm_env *env, char *err,
                        size_t errlen);
extern const int mge__comm_mpi_built, mge__comm_nccl_built;

#endif
