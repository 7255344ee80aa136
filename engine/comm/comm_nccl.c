/*
 * comm_nccl.c: the NCCL backend (GPU ranks, device memory). Compiled, with the CUDA include
 * path, only when nvcc and NCCL exist (else comm_nccl_none.c); links -lnccl -lcudart.
 *
 * Bootstrap: rank 0 makes the 128-byte unique id. A coordinator hands it to every rank in
 * MGE_NCCL_ID (256 hex digits) with MGE_RANK/MGE_WORLD_SIZE; under mpirun/srun it goes by an
 * MPI broadcast on a bootstrap communicator (which also gives mge_comm_abort its MPI_Abort).
 * One rank needs neither. Collectives run on one CUDA stream of our own, in issue order;
 * asynchronous all-reduces record CUDA events around themselves, and waiting for a ticket is
 * waiting for its end event, so the host never blocks on the stream while backward runs.
 *
 * Order with the compute kernels: the cuda device issues every kernel on the legacy default
 * stream (engine/device_cuda.c), and a collective is issued from the host once the kernels
 * that write its buffer have been issued (the gradient-ready hook fires after the node that
 * finishes a pack). So each collective first records an event on the default stream and makes
 * the communication stream wait for it: the all-reduce of a pack starts when the kernel that
 * wrote its last gradient is done, and overlaps the rest of backward.
 * Failure: waits poll their event and ncclCommGetAsyncError, so a dead peer fails the wait
 * (MGE_COMM) rather than hanging; mge_comm_abort() then calls ncclCommAbort.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/err.h"
#include "engine/comm/comm_int.h"

const int mge__comm_nccl_built = 1;

struct nccl_state {
    ncclComm_t comm;
    cudaStream_t stream;
    struct mge_comm *boot; /* MPI bootstrap communicator, or NULL */
    int *scratch;          /* device int: the barrier's all-reduce */
    cudaEvent_t compute;   /* recorded on the default stream before each collective */
    cudaEvent_t base;      /* recorded at open; base_host is its host time */
    double base_host;
    cudaEvent_t ev_start[MGE__COMM_RING], ev_end[MGE__COMM_RING];
    int n_events; /* events created (pairs) */
};

static int nccl_fail(ncclResult_t r, const char *what)
{
    return MGE_ERR(MGE_COMM, "%s failed: %s", what, ncclGetErrorString(r));
}

static int cuda_fail(cudaError_t e, const char *what)
{
    return MGE_ERR(MGE_DEVICE, "%s failed: %s", what, cudaGetErrorString(e));
}

static ncclDataType_t nccl_type(enum mge_comm_dtype dt)
{
    switch (dt) {
    case MGE_COMM_F32:
        return ncclFloat32;
    case MGE_COMM_F64:
        return ncclFloat64;
    case MGE_COMM_I64:
        return ncclInt64;
    }
    return ncclUint8;
}

/*
 * Wait for @ev (NULL: for all of the communication stream) without trusting the peers to be
 * alive: poll it and NCCL's asynchronous error, so that a peer that died mid-collective fails
 * the wait with MGE_COMM; the caller then ends the job (mge_comm_abort: ncclCommAbort ends
 * the kernel stuck waiting for that peer).
 */
static int wait_done(struct nccl_state *s, cudaEvent_t ev, const char *what)
{
    struct timespec nap = {0, 20000};
    for (;;) {
        cudaError_t e = ev ? cudaEventQuery(ev) : cudaStreamQuery(s->stream);
        if (e == cudaSuccess)
            return MGE_OK;
        if (e != cudaErrorNotReady)
            return cuda_fail(e, what);
        ncclResult_t ar = ncclSuccess, r = ncclCommGetAsyncError(s->comm, &ar);
        if (r != ncclSuccess)
            return nccl_fail(r, "ncclCommGetAsyncError");
        if (ar != ncclSuccess && ar != ncclInProgress)
            return MGE_ERR(MGE_COMM, "%s: a peer failed: %s", what, ncclGetErrorString(ar));
        nanosleep(&nap, NULL);
    }
}

static int sync_stream(struct nccl_state *s)
{
    return wait_done(s, NULL, "cudaStreamQuery");
}

/* The communication stream waits for every kernel issued so far on the default stream. */
static int after_compute(struct nccl_state *s)
{
    cudaError_t e = cudaEventRecord(s->compute, 0);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(s->stream, s->compute, 0);
    return e == cudaSuccess ? MGE_OK : cuda_fail(e, "cudaStreamWaitEvent (after compute)");
}

static int nccl_allreduce(struct mge_comm *c, void *buf, size_t count, enum mge_comm_dtype dt)
{
    struct nccl_state *s = c->impl;
    int rc = after_compute(s);
    if (rc != MGE_OK)
        return rc;
    ncclResult_t r = ncclAllReduce(buf, buf, count, nccl_type(dt), ncclSum, s->comm, s->stream);
    return r == ncclSuccess ? sync_stream(s) : nccl_fail(r, "ncclAllReduce");
}

static int nccl_broadcast(struct mge_comm *c, void *buf, size_t bytes, int root)
{
    struct nccl_state *s = c->impl;
    int rc = after_compute(s);
    if (rc != MGE_OK)
        return rc;
    ncclResult_t r = ncclBroadcast(buf, buf, bytes, ncclUint8, root, s->comm, s->stream);
    return r == ncclSuccess ? sync_stream(s) : nccl_fail(r, "ncclBroadcast");
}

static int nccl_allgather(struct mge_comm *c, const void *send, size_t bytes, void *recv)
{
    struct nccl_state *s = c->impl;
    int rc = after_compute(s);
    if (rc != MGE_OK)
        return rc;
    ncclResult_t r = ncclAllGather(send, recv, bytes, ncclUint8, s->comm, s->stream);
    return r == ncclSuccess ? sync_stream(s) : nccl_fail(r, "ncclAllGather");
}

static int nccl_barrier(struct mge_comm *c)
{
    struct nccl_state *s = c->impl;
    ncclResult_t r =
        ncclAllReduce(s->scratch, s->scratch, 1, ncclInt32, ncclSum, s->comm, s->stream);
    return r == ncclSuccess ? sync_stream(s) : nccl_fail(r, "ncclAllReduce (barrier)");
}

static int nccl_allreduce_start(struct mge_comm *c, void *buf, size_t count, enum mge_comm_dtype dt,
                                uint64_t ticket)
{
    struct nccl_state *s = c->impl;
    size_t k = ticket % MGE__COMM_RING;
    int rc = after_compute(s);
    if (rc != MGE_OK)
        return rc;
    cudaError_t e = cudaEventRecord(s->ev_start[k], s->stream);
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaEventRecord");
    ncclResult_t r = ncclAllReduce(buf, buf, count, nccl_type(dt), ncclSum, s->comm, s->stream);
    if (r != ncclSuccess)
        return nccl_fail(r, "ncclAllReduce");
    e = cudaEventRecord(s->ev_end[k], s->stream);
    return e == cudaSuccess ? MGE_OK : cuda_fail(e, "cudaEventRecord");
}

static int nccl_wait(struct mge_comm *c, uint64_t ticket, struct mge_comm_timing *timing)
{
    struct nccl_state *s = c->impl;
    size_t k = ticket % MGE__COMM_RING;
    if (c->err && ticket >= c->err_at)
        return c->err;
    /* an event reused by a later ticket is also later on the stream: waiting on it is safe */
    int rc = wait_done(s, s->ev_end[k], "all-reduce");
    if (rc != MGE_OK) {
        c->err = rc;
        c->err_at = ticket;
        return c->err;
    }
    if (timing && c->issued - ticket < MGE__COMM_RING - 1) {
        float ms0 = 0.0f, ms1 = 0.0f;
        cudaEventElapsedTime(&ms0, s->base, s->ev_start[k]);
        cudaEventElapsedTime(&ms1, s->base, s->ev_end[k]);
        timing->start = s->base_host + 1e-3 * ms0;
        timing->end = s->base_host + 1e-3 * ms1;
    }
    return MGE_OK;
}

static void state_free(struct nccl_state *s)
{
    for (int i = 0; i < s->n_events; i++) {
        cudaEventDestroy(s->ev_start[i]);
        cudaEventDestroy(s->ev_end[i]);
    }
    if (s->base)
        cudaEventDestroy(s->base);
    if (s->compute)
        cudaEventDestroy(s->compute);
    if (s->scratch)
        cudaFree(s->scratch);
    if (s->stream)
        cudaStreamDestroy(s->stream);
    mge_free(s);
}

static void nccl_abort(struct mge_comm *c, int code)
{
    struct nccl_state *s = c->impl;
    if (c->size <= 1)
        return;
    ncclCommAbort(s->comm);
    s->comm = NULL;
    if (s->boot)
        mge_comm_abort(s->boot, code);
    exit(code ? code : 1); /* no launcher to take the others down: the coordinator will */
}

static void nccl_close(struct mge_comm *c)
{
    struct nccl_state *s = c->impl;
    if (s->comm) {
        sync_stream(s);
        ncclCommDestroy(s->comm);
    }
    mge_comm_close(s->boot);
    state_free(s);
}

static const struct mge__comm_ops nccl_ops = {
    .name = "nccl",
    .allreduce = nccl_allreduce,
    .broadcast = nccl_broadcast,
    .allgather = nccl_allgather,
    .barrier = nccl_barrier,
    .allreduce_start = nccl_allreduce_start,
    .wait = nccl_wait,
    .abort = nccl_abort,
    .close = nccl_close,
};

/* MGE_NCCL_ID: 256 hex digits into @id; 0 if set and valid, 1 if unset, -1 if malformed */
static int id_from_env(ncclUniqueId *id)
{
    const char *hex = getenv("MGE_NCCL_ID");
    if (!hex || !*hex)
        return 1;
    if (strlen(hex) != 2 * NCCL_UNIQUE_ID_BYTES)
        return -1;
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return -1;
        id->internal[i] = (char)v;
    }
    return 0;
}

int mge__comm_nccl_open(struct mge_comm **out, const struct mge_comm_env *env, char *err,
                        size_t errlen)
{
    int ndev = 0, dev = 0, rank = env->rank, size = env->size, rc;
    ncclUniqueId id;
    ncclResult_t r;
    cudaError_t e;
    struct nccl_state *s;
    *out = NULL;
    if ((e = cudaGetDeviceCount(&ndev)) != cudaSuccess || ndev == 0) {
        snprintf(err, errlen,
                 "distributed.backend: nccl needs a CUDA device, and this machine "
                 "has none (cudaGetDeviceCount: %d, %s)",
                 ndev, cudaGetErrorString(e));
        return MGE_DEVICE;
    }
    if (!(s = mge_calloc(1, sizeof(*s)))) {
        snprintf(err, errlen, "out of memory");
        return MGE_NOMEM;
    }
    int from_env = id_from_env(&id);
    if (from_env < 0) {
        snprintf(err, errlen, "MGE_NCCL_ID: expected %d hex digits", 2 * NCCL_UNIQUE_ID_BYTES);
        rc = MGE_INVAL;
        goto err_free;
    }
    if (from_env == 1 && size > 1) { /* launched by mpirun/srun: the id goes by MPI */
        if ((rc = mge__comm_mpi_open(&s->boot, env, err, errlen)) != MGE_OK)
            goto err_free;
        rank = mge_comm_rank(s->boot);
        size = mge_comm_size(s->boot);
    }
    if (from_env == 1 && rank == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess) {
        snprintf(err, errlen, "ncclGetUniqueId failed: %s", ncclGetErrorString(r));
        rc = MGE_COMM;
        goto err_free;
    }
    if (s->boot && (rc = mge_comm_broadcast(s->boot, &id, sizeof(id), 0)) != MGE_OK) {
        snprintf(err, errlen, "cannot hand the NCCL id from rank 0 to the others");
        goto err_free;
    }
    /* the trainer's cuda device made its GPU current already: the arenas live there */
    if (env->gpu_current)
        e = cudaGetDevice(&dev);
    else
        e = cudaSetDevice(dev = env->local_rank % ndev);
    if (e != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaMalloc((void **)&s->scratch, sizeof(int))) != cudaSuccess ||
        (e = cudaEventCreate(&s->base)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&s->compute, cudaEventDisableTiming)) != cudaSuccess) {
        snprintf(err, errlen, "CUDA setup on device %d failed: %s", dev, cudaGetErrorString(e));
        rc = MGE_DEVICE;
        goto err_free;
    }
    for (; s->n_events < MGE__COMM_RING; s->n_events++)
        if ((e = cudaEventCreate(&s->ev_start[s->n_events])) != cudaSuccess ||
            (e = cudaEventCreate(&s->ev_end[s->n_events])) != cudaSuccess) {
            if (e != cudaSuccess && s->ev_start[s->n_events])
                cudaEventDestroy(s->ev_start[s->n_events]);
            snprintf(err, errlen, "cudaEventCreate failed: %s", cudaGetErrorString(e));
            rc = MGE_DEVICE;
            goto err_free;
        }
    if ((r = ncclCommInitRank(&s->comm, size, id, rank)) != ncclSuccess) {
        snprintf(err, errlen, "ncclCommInitRank (rank %d of %d) failed: %s", rank, size,
                 ncclGetErrorString(r));
        rc = MGE_COMM;
        goto err_free;
    }
    cudaEventRecord(s->base, s->stream);
    cudaEventSynchronize(s->base);
    s->base_host = mge_comm_now();
    if ((rc = mge__comm_new(out, &nccl_ops, MGE_BACKEND_NCCL, rank, size, s)) != MGE_OK) {
        snprintf(err, errlen, "cannot open the NCCL communicator: %s", mge_strerror(rc));
        ncclCommDestroy(s->comm);
        goto err_free;
    }
    return MGE_OK;
err_free:
    if (s->boot && size > 1)
        mge_comm_abort(s->boot, 1);
    mge_comm_close(s->boot);
    state_free(s);
    return rc;
}
