/*
 * gpus.h: the GPUs mge-worker offers: detected through the CUDA runtime (dlopen, so the worker
 * has no link-time CUDA dependency), or, as a test hook, read from MGE_FAKE_GPUS; and the
 * CUDA_VISIBLE_DEVICES a rank gets for the indexes the scheduler gave it.
 */
#ifndef MGE_WORKER_GPUS_H
#define MGE_WORKER_GPUS_H

#include <stddef.h>

#include "common/gpu.h"

/* The test hook: a GPU list as mge_gpus_parse() reads it ("" for none), honoured by mge-worker
 * alone. */
#define MGE_FAKE_GPUS_ENV "MGE_FAKE_GPUS"

/* Where cudaGetDeviceProperties puts the name (char[256] first) and totalGlobalMem (a size_t
 * after uuid[16], luid[8] and luidDeviceNodeMask), read without CUDA's headers: stable since
 * CUDA 10; test_cuda checks both against the toolkit's cuda_runtime_api.h at build time. */
#define MGE_CUDA_PROP_NAME_LEN 256
#define MGE_CUDA_PROP_TOTAL_MEM_OFF 288

/*
 * This worker's GPUs into @out (room for MGE_GPUS_MAX) and *@n: MGE_FAKE_GPUS when it is set
 * (a CI machine has no GPU: "2x NVIDIA H100 80GB HBM3:81559"), else every device the CUDA
 * runtime sees (it honours the worker's own CUDA_VISIBLE_DEVICES), else none. @source receives
 * "MGE_FAKE_GPUS", "libcudart.so.13" or "none". MGE_INVAL, with @why, for a bad MGE_FAKE_GPUS.
 */
int mge_gpus_detect(struct mge_gpu *out, int *n, char *source, size_t source_len, char *why,
                    size_t why_len);

/*
 * The CUDA_VISIBLE_DEVICES value for the scheduler's indexes @ids ("0,1"; indexes into the
 * list mge_gpus_detect() gave) into @buf: the same text, or, when the worker itself runs under
 * CUDA_VISIBLE_DEVICES (@worker_visible, NULL when unset), its entries at those indexes, since
 * the runtime numbers only what the worker sees. Returns @buf; "" for "" or an index it lacks.
 */
char *mge_gpus_visible(const char *ids, const char *worker_visible, char *buf, size_t len);

#endif
