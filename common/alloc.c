/* alloc.c: malloc wrappers through which every mge allocation goes, so tests can make them fail. */
#include "alloc.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

static long alloc_budget = -1; /* allocations left before failing; -1 = unlimited */

static int alloc_should_fail(void)
{
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
    if (alloc_should_fail())
        return NULL;
    return malloc(n ? n : 1);
}

void *mge_calloc(size_t count, size_t size)
{
    if (alloc_should_fail())
        return NULL;
    return calloc(count ? count : 1, size ? size : 1);
}

void *mge_realloc(void *p, size_t n)
{
    if (alloc_should_fail())
        return NULL;
    return realloc(p, n ? n : 1);
}

void mge_free(void *p) { free(p); }

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
    if (alloc_should_fail())
        return NULL;
    if (posix_memalign(&p, 64, n ? (n + 63) & ~(size_t)63 : 64) != 0)
        return NULL;
    return p;
}

void mge_free_aligned(void *p) { free(p); }

void mge_alloc_keep_memory(void)
{
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
}
