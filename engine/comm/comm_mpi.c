/*
 * comm_mpi.c: the Open MPI backend (CPU ranks, host memory). Compiled only when Open MPI's
 * development files exist (else comm_mpi_none.c); the Makefile adds `pkg-config ompi-c`.
 *
 * Threading: MPI_THREAD_SERIALIZED. After MPI_Init_thread on the main thread, collectives run
 * one at a time, on comm.c's communication thread (or on the training thread when it waits for
 * a collective the communication thread has not picked up yet), ordered by comm.c's mutex;
 * MPI_Finalize runs on the main thread after that thread is joined. That is all SERIALIZED
 * promises, and it is enough:
 * MULTIPLE would make Open MPI take locks on every call for concurrency we never use, and
 * FUNNELED would forbid the communication thread, which is what lets a pack's all-reduce run
 * while backward computes the next gradients.
 */
#include <limits.h>
#include <malloc.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "engine/comm/comm_int.h"

const int mge__comm_mpi_built = 1;

struct mpi_state {
    MPI_Comm comm; /* a duplicate of MPI_COMM_WORLD: our collectives, nobody else's */
};

static int mpi_fail(int mrc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(mrc, msg, &len);
    return MGE_ERR(MGE_COMM, "%s failed: %s", what, msg);
}

static MPI_Datatype mpi_type(enum mge_comm_dtype dt, size_t *size)
{
    switch (dt) {
    case MGE_COMM_F32:
        *size = 4;
        return MPI_FLOAT;
    case MGE_COMM_F64:
        *size = 8;
        return MPI_DOUBLE;
    case MGE_COMM_I64:
        *size = 8;
        return MPI_INT64_T;
    }
    *size = 1;
    return MPI_BYTE;
}

/* MPI counts are int: larger buffers go in pieces of at most CHUNK elements */
#define CHUNK ((size_t)1 << 30)

static int mpi_allreduce(struct mge_comm *c, void *buf, size_t count, enum mge_comm_dtype dt)
{
    struct mpi_state *s = c->impl;
    size_t esize;
    MPI_Datatype t = mpi_type(dt, &esize);
    for (size_t at = 0; at < count; at += CHUNK) {
        int n = (int)(count - at < CHUNK ? count - at : CHUNK);
        int mrc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + at * esize, n, t, MPI_SUM, s->comm);
        if (mrc != MPI_SUCCESS)
            return mpi_fail(mrc, "MPI_Allreduce");
    }
    return MGE_OK;
}

static int mpi_broadcast(struct mge_comm *c, void *buf, size_t bytes, int root)
{
    struct mpi_state *s = c->impl;
    for (size_t at = 0; at < bytes; at += CHUNK) {
        int n = (int)(bytes - at < CHUNK ? bytes - at : CHUNK);
        int mrc = MPI_Bcast((char *)buf + at, n, MPI_BYTE, root, s->comm);
        if (mrc != MPI_SUCCESS)
            return mpi_fail(mrc, "MPI_Bcast");
    }
    return MGE_OK;
}

static int mpi_allgather(struct mge_comm *c, const void *send, size_t bytes, void *recv)
{
    struct mpi_state *s = c->impl;
    if (bytes > (size_t)INT_MAX)
        return MGE_ERR(MGE_TOOBIG, "all-gather of %zu bytes per rank", bytes);
    int mrc = MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, s->comm);
    return mrc == MPI_SUCCESS ? MGE_OK : mpi_fail(mrc, "MPI_Allgather");
}

static int mpi_barrier(struct mge_comm *c)
{
    struct mpi_state *s = c->impl;
    int mrc = MPI_Barrier(s->comm);
    return mrc == MPI_SUCCESS ? MGE_OK : mpi_fail(mrc, "MPI_Barrier");
}

static void mpi_abort(struct mge_comm *c, int code)
{
    if (c->size > 1)
        MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
}

static void mpi_close(struct mge_comm *c)
{
    struct mpi_state *s = c->impl;
    if (s) {
        MPI_Comm_free(&s->comm);
        mge_free(s);
    }
    MPI_Finalize();
}

static const struct mge__comm_ops mpi_ops = {
    .name = "mpi",
    .threaded = 1,
    .allreduce = mpi_allreduce,
    .broadcast = mpi_broadcast,
    .allgather = mpi_allgather,
    .barrier = mpi_barrier,
    .abort = mpi_abort,
    .close = mpi_close,
};

int mge__comm_mpi_open(struct mge_comm **out, const struct mge_comm_env *env, char *err,
                       size_t errlen)
{
    int provided = 0, rank = 0, size = 1, rc;
    struct mpi_state *s = NULL;
    *out = NULL;
    /*
     * Before MPI allocates anything: large blocks from the heap, kept after free. Open MPI's
     * all-reduce takes a temporary buffer per call; from mmap that is fresh, zeroed pages
     * every time (measured: 64 MiB in 130 ms instead of 11.5 ms).
     */
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Init_thread failed (launch with mpirun or srun)");
        return MGE_COMM;
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        snprintf(err, errlen,
                 "this MPI provides thread level %d, mge needs "
                 "MPI_THREAD_SERIALIZED (%d)",
                 provided, MPI_THREAD_SERIALIZED);
        rc = MGE_COMM;
        goto err_finalize;
    }
    if (!(s = mge_calloc(1, sizeof(*s)))) {
        snprintf(err, errlen, "out of memory");
        rc = MGE_NOMEM;
        goto err_finalize;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (MPI_Comm_dup(MPI_COMM_WORLD, &s->comm) != MPI_SUCCESS) {
        snprintf(err, errlen, "MPI_Comm_dup failed");
        rc = MGE_COMM;
        goto err_free;
    }
    MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(s->comm, &rank);
    MPI_Comm_size(s->comm, &size);
    if (env->launched && (rank != env->rank || size != env->size)) {
        snprintf(err, errlen, "MPI says rank %d of %d, the launcher's environment rank %d of %d",
                 rank, size, env->rank, env->size);
        rc = MGE_COMM;
        goto err_comm;
    }
    if ((rc = mge__comm_new(out, &mpi_ops, MGE_BACKEND_MPI, rank, size, s)) != MGE_OK) {
        snprintf(err, errlen, "cannot open the MPI communicator: %s", mge_strerror(rc));
        goto err_comm;
    }
    return MGE_OK;
err_comm:
    MPI_Comm_free(&s->comm);
err_free:
    mge_free(s);
err_finalize:
    if (size > 1)
        MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
    return rc;
}
