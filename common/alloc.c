/* alloc.c: malloc wrappers through which every mge allocation goes, so tests can make them fail. */
#include "alloc.h"

#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

static long alloc_budget = -1; /* allocations left before failing; -1 = unlimited */
/* usable bytes held through these functions (atomic); signed, so that a block freed here but
 * allocated elsewhere cannot wrap the counter */
static long long bytes_in_use, bytes_peak, bytes_limit;

static void count_add(void *p)
{
    long long cur, peak;
    if (!p)
        return;
    cur = __atomic_add_fetch(&bytes_in_use, (long long)malloc_usable_size(p), __ATOMIC_RELAXED);
    peak = __atomic_load_n(&bytes_peak, __ATOMIC_RELAXED);
    while (cur > peak &&
           !__atomic_compare_exchange_n(&bytes_peak, &peak, cur, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
        ;
}

static void count_sub(void *p)
{
    if (p)
        __atomic_sub_fetch(&bytes_in_use, (long long)malloc_usable_size(p), __ATOMIC_RELAXED);
}

long long mge_alloc_in_use(void) { return __atomic_load_n(&bytes_in_use, __ATOMIC_RELAXED); }

long long mge_alloc_peak(void) { return __atomic_load_n(&bytes_peak, __ATOMIC_RELAXED); }

void mge_alloc_peak_reset(void)
{
    __atomic_store_n(&bytes_peak, __atomic_load_n(&bytes_in_use, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
}

void mge_alloc_set_limit(long long bytes)
{
    bytes_limit = bytes > 0 ? bytes : 0;
}

/* Whether an allocation of @n bytes must fail: past the cap, or by the test hook. */
static int alloc_should_fail(size_t n)
{
    if (bytes_limit > 0 &&
        (n > (size_t)bytes_limit ||
         __atomic_load_n(&bytes_in_use, __ATOMIC_RELAXED) + (long long)n > bytes_limit))
        return 1;
    if (alloc_budget < 0)
        return 0;
    if (alloc_budget == 0)
        return 1;
    alloc_budget--;
    return 0;
}

void mge_alloc_fail_after(long n) { alloc_budget = n; }

void *mge_malloc(size_t n)
{
    void *p;
    if (alloc_should_fail(n))
        return NULL;
    p = malloc(n ? n : 1);
    count_add(p);
    return p;
}

void *mge_calloc(size_t count, size_t size)
{
    void *p;
    if (alloc_should_fail(size && count > SIZE_MAX / size ? SIZE_MAX : count * size))
        return NULL;
    p = calloc(count ? count : 1, size ? size : 1);
    count_add(p);
    return p;
}

void *mge_realloc(void *p, size_t n)
{
    void *np;
    if (alloc_should_fail(n))
        return NULL;
    count_sub(p);
    np = realloc(p, n ? n : 1);
    count_add(np ? np : p); /* on failure @p is still held */
    return np;
}

void mge_free(void *p)
{
    count_sub(p);
    free(p);
}

int mge_array_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    void *np;
    size_t nc;
    if (need <= *cap)
        return MGE_OK;
    nc = *cap ? *cap * 2 : 8;
    while (nc < need)
        nc *= 2;
    np = mge_realloc(*p, nc * elem);
    if (!np)
        return MGE_NOMEM;
    *p = np;
    *cap = nc;
    return MGE_OK;
}

char *mge_strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *d = mge_malloc(len + 1);
    if (!d)
        return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *mge_strdup(const char *s) { return mge_strndup(s, strlen(s)); }

void *mge_malloc_aligned(size_t n)
{
    void *p = NULL;
    if (alloc_should_fail(n))
        return NULL;
    if (posix_memalign(&p, 64, n ? (n + 63) & ~(size_t)63 : 64) != 0)
        return NULL;
    count_add(p);
    return p;
}

void mge_free_aligned(void *p)
{
    count_sub(p);
    free(p);
}

void mge_alloc_keep_memory(void)
{
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
}
