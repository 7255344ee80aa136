/* alloc.h: the single allocation choke point, with a failure hook for tests. */
#ifndef MGE_COMMON_ALLOC_H
#define MGE_COMMON_ALLOC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Like malloc/calloc/realloc/free; return NULL on failure (and when the hook says fail). */
void *mge_malloc(size_t n);
void *mge_calloc(size_t count, size_t size);
void *mge_realloc(void *p, size_t n);
void mge_free(void *p);
char *mge_strdup(const char *s);
char *mge_strndup(const char *s, size_t n);

/*
 * Grow the array *@p of @elem-byte elements, now *@cap long, to hold at least @need (doubling,
 * 8 at first). On MGE_NOMEM (an enum mge_err value) *@p and *@cap are unchanged.
 */
int mge_array_grow(void **p, size_t *cap, size_t need, size_t elem);

/*
 * 64-byte aligned allocation for tensor arenas (AVX-512 lines). Free with mge_free_aligned().
 * Memory is not zeroed.
 */
void *mge_malloc_aligned(size_t n);
void mge_free_aligned(void *p);

/*
 * Keep freed memory in the process instead of returning it to the kernel (glibc: a fixed
 * 32 MiB mmap threshold, no trimming below 1 GiB). Libraries that allocate scratch per call
 * (oneDNN's GEMM packing, MPI's buffers) then reuse warm pages; on VMs where a first touch
 * costs ~17 us per page this made backward GEMMs 10x slower. Call once at start-up.
 */
void mge_alloc_keep_memory(void);

/*
 * The allocation counter: bytes held through these functions now (malloc_usable_size of each
 * block), and the most held since the last mge_alloc_peak_reset() (which sets it to now).
 * Memory that libraries allocate themselves (BLAS packing, MPI buffers) is not counted.
 * Thread: any (atomic).
 */
long long mge_alloc_in_use(void);
long long mge_alloc_peak(void);
void mge_alloc_peak_reset(void);

/*
 * Cap the bytes held through these functions at @bytes (0: no cap, the default): an allocation
 * that would pass it returns NULL, as when the system has no memory left. mge-train sets it
 * from MGE_MEMORY_LIMIT_MB (the coordinator's planner child). Thread: call before any other.
 */
void mge_alloc_set_limit(long long bytes);

/*
 * Test hook: after @n more successful allocations, every allocation fails
 * (n < 0 turns the hook off). Not thread-safe; tests only.
 */
void mge_alloc_fail_after(long n);

#ifdef __cplusplus
}
#endif
#endif
