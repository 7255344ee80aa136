/*
 * gpu.h: what a worker says of each of its GPUs (name, memory), and the GPU index sets the
 * scheduler gives ranks, as bit masks and as the CUDA_VISIBLE_DEVICES text ("0,1").
 */
#ifndef MGE_COMMON_GPU_H
#define MGE_COMMON_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MGE_GPUS_MAX 64 /* GPUs of one worker: an index set is a uint64_t mask */

struct mge_gpu {
    char name[96];     /* "NVIDIA H100 80GB HBM3" */
    int64_t memory_mb; /* total device memory, MiB */
};

/*
 * Parse a GPU list "2x NVIDIA H100 80GB HBM3:81559[,1x NAME:MB]..." (count "Nx " optional,
 * 1 by default; MB the memory of each, MiB) into @out (room for MGE_GPUS_MAX) and *@n. The
 * worker's test hook MGE_FAKE_GPUS uses it. MGE_INVAL, with @why naming the bad part, for a
 * missing ":MB", a count or memory that is not a positive integer, an empty name, or more than
 * MGE_GPUS_MAX GPUs in all.
 */
int mge_gpus_parse(const char *s, struct mge_gpu *out, int *n, char *why, size_t why_len);

/* Mask @mask as "0,1,3" into @buf ("" for 0); returns @buf. */
char *mge_gpu_mask_format(uint64_t mask, char *buf, size_t len);
/* Parse "0,1,3" ("" is 0) into *@mask; false for anything else or an index >= MGE_GPUS_MAX. */
bool mge_gpu_mask_parse(const char *s, uint64_t *mask);
/* How many GPUs @mask holds. */
int mge_gpu_mask_count(uint64_t mask);

#endif
