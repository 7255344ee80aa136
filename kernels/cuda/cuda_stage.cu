/*
 * cuda_stage.cu: the cuda device's input staging (engine/device.h stage hooks): pinned host
 * buffers and one copy stream on which batch k+1 goes host -> device while batch k computes
 * on the default stream, ordered by two events per slot (kernels/cuda/cuda.h).
 */
#include <cuda_runtime.h>

#include "common/err.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_int.h"

/* Created on first use, for the process's one CUDA context; never destroyed (the context's
 * end frees them). */
static cudaStream_t copy_stream;
static cudaEvent_t released[2], copied[2];
static int stage_ok;
/* A slot with copies since its "copied" event was last recorded. */
static int pending[2];

static int stage_init(void)
{
    int rc = MGE_OK;
    if (stage_ok)
        return MGE_OK;
    rc = mge__cuda_err(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking),
                       "cudaStreamCreateWithFlags (copy stream)");
    for (int s = 0; s < 2 && rc == MGE_OK; s++) {
        rc = mge__cuda_err(cudaEventCreateWithFlags(&released[s], cudaEventDisableTiming),
                           "cudaEventCreate (staging)");
        if (rc == MGE_OK)
            rc = mge__cuda_err(cudaEventCreateWithFlags(&copied[s], cudaEventDisableTiming),
                               "cudaEventCreate (staging)");
    }
    stage_ok = rc == MGE_OK;
    return rc;
}

int mge_cuda_host_alloc(void **p, size_t bytes)
{
    return mge__cuda_err(cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocDefault),
                         "cudaHostAlloc");
}

void mge_cuda_host_free(void *p)
{
    if (p)
        cudaFreeHost(p);
}

int mge_cuda_stage_copy(int slot, void *dst, const void *src, size_t bytes)
{
    int rc = stage_init();
    if (rc != MGE_OK || !bytes)
        return rc;
    /* an event never recorded is complete: the first copy into a slot waits for nothing */
    if (!pending[slot] && (rc = mge__cuda_err(cudaStreamWaitEvent(copy_stream, released[slot], 0),
                                              "cudaStreamWaitEvent (staging)")) != MGE_OK)
        return rc;
    pending[slot] = 1;
    return mge__cuda_err(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_stream),
                         "cudaMemcpyAsync (staging)");
}

/* Close @slot's batch of copies with its "copied" event. */
static int stage_mark(int slot)
{
    if (!pending[slot])
        return MGE_OK;
    pending[slot] = 0;
    return mge__cuda_err(cudaEventRecord(copied[slot], copy_stream), "cudaEventRecord (staging)");
}

int mge_cuda_stage_ready(int slot)
{
    int rc = stage_init();
    if (rc == MGE_OK)
        rc = stage_mark(slot);
    if (rc == MGE_OK)
        rc = mge__cuda_err(cudaStreamWaitEvent(0, copied[slot], 0), "cudaStreamWaitEvent");
    return rc;
}

int mge_cuda_stage_release(int slot)
{
    int rc = stage_init();
    if (rc != MGE_OK)
        return rc;
    return mge__cuda_err(cudaEventRecord(released[slot], 0), "cudaEventRecord (staging)");
}

int mge_cuda_stage_wait(int slot)
{
    int rc = stage_init();
    if (rc == MGE_OK)
        rc = stage_mark(slot);
    if (rc == MGE_OK)
        rc = mge__cuda_err(cudaEventSynchronize(copied[slot]), "cudaEventSynchronize (staging)");
    return rc;
}
