/*
 * comm_local.c: the one-rank backend: every collective is the identity (an all-gather copies),
 * so a job that is not launched by mpirun or a worker pays nothing for data parallelism.
 */
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "engine/comm/comm_int.h"

static int local_allreduce(struct mge_comm *c, void *buf, size_t count, enum mge_comm_dtype dt)
{
    (void)c, (void)buf, (void)count, (void)dt;
    return MGE_OK;
}

static int local_broadcast(struct mge_comm *c, void *buf, size_t bytes, int root)
{
    (void)c, (void)buf, (void)bytes, (void)root;
    return MGE_OK;
}

static int local_allgather(struct mge_comm *c, const void *send, size_t bytes, void *recv)
{
    (void)c;
    if (recv != send)
        memmove(recv, send, bytes);
    return MGE_OK;
}

static int local_barrier(struct mge_comm *c)
{
    (void)c;
    return MGE_OK;
}

static void local_close(struct mge_comm *c)
{
    (void)c;
}

static const struct mge__comm_ops local_ops = {
    .name = "local",
    .allreduce = local_allreduce,
    .broadcast = local_broadcast,
    .allgather = local_allgather,
    .barrier = local_barrier,
    .close = local_close,
};

int mge__comm_local_open(struct mge_comm **out, const struct mge_comm_env *env, char *err,
                         size_t errlen)
{
    if (env->size > 1) {
        snprintf(err, errlen,
                 "distributed.backend: local runs one rank, but this is rank %d of "
                 "%d; use auto or mpi",
                 env->rank, env->size);
        *out = NULL;
        return MGE_UNSUPPORTED;
    }
    int rc = mge__comm_new(out, &local_ops, MGE_BACKEND_LOCAL, 0, 1, NULL);
    if (rc != MGE_OK)
        snprintf(err, errlen, "cannot open the local communicator: %s", mge_strerror(rc));
    return rc;
}
