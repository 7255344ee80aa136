/* gpu.c: GPU lists and GPU index masks (see gpu.h). */
#include "gpu.h"

#include <stdio.h>
#include <string.h>

#include "err.h"
#include "parse.h"

/* One "Nx NAME:MB" item of @len bytes at @s into @out[*n...]; MGE_INVAL with @why. */
static int gpus_item(const char *s, size_t len, struct mge_gpu *out, int *n, char *why,
                     size_t why_len)
{
    char item[256], *name = item, *colon, *x;
    long long count = 1, mb;
    if (len >= sizeof(item)) {
        snprintf(why, why_len, "GPU '%.40s...' is too long", s);
        return MGE_INVAL;
    }
    memcpy(item, s, len);
    item[len] = '\0';
    while (*name == ' ')
        name++;
    x = name + strspn(name, "0123456789");
    if (x > name && x[0] == 'x' && x[1] == ' ') { /* "2x NAME" */
        *x = '\0';
        if (!mge_parse_int(name, 1, MGE_GPUS_MAX, &count)) {
            snprintf(why, why_len, "bad GPU count '%sx' (expected 1x..%dx)", name, MGE_GPUS_MAX);
            return MGE_INVAL;
        }
        name = x + 2;
    }
    colon = strrchr(name, ':');
    if (!colon) {
        snprintf(why, why_len, "GPU '%s' has no ':MEMORY_MB'", name);
        return MGE_INVAL;
    }
    *colon = '\0';
    if (!mge_parse_int(colon + 1, 1, (long long)1 << 30, &mb)) {
        snprintf(why, why_len, "bad memory '%s' of GPU '%s' (expected MiB, a positive integer)",
                 colon + 1, name);
        return MGE_INVAL;
    }
    while (*name == ' ')
        name++;
    if (!*name || strlen(name) >= sizeof(out->name)) {
        snprintf(why, why_len, "GPU name '%s' is empty or longer than %zu characters", name,
                 sizeof(out->name) - 1);
        return MGE_INVAL;
    }
    if (*n + count > MGE_GPUS_MAX) {
        snprintf(why, why_len, "more than %d GPUs", MGE_GPUS_MAX);
        return MGE_INVAL;
    }
    for (long long i = 0; i < count; i++, (*n)++) {
        snprintf(out[*n].name, sizeof(out[*n].name), "%s", name);
        out[*n].memory_mb = mb;
    }
    return MGE_OK;
}

int mge_gpus_parse(const char *s, struct mge_gpu *out, int *n, char *why, size_t why_len)
{
    *n = 0;
    while (*s) {
        const char *end = strchr(s, ',');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        int rc = gpus_item(s, len, out, n, why, why_len);
        if (rc != MGE_OK) {
            *n = 0;
            return rc;
        }
        s += len + (end ? 1 : 0);
    }
    return MGE_OK;
}

char *mge_gpu_mask_format(uint64_t mask, char *buf, size_t len)
{
    size_t off = 0;
    if (len)
        buf[0] = '\0';
    for (int i = 0; i < MGE_GPUS_MAX && off < len; i++) {
        int k;
        if (!(mask >> i & 1))
            continue;
        k = snprintf(buf + off, len - off, "%s%d", off ? "," : "", i);
        if (k < 0)
            break;
        off += (size_t)k;
    }
    return buf;
}

bool mge_gpu_mask_parse(const char *s, uint64_t *mask)
{
    uint64_t m = 0;
    while (*s) {
        const char *end = strchr(s, ',');
        char num[8];
        size_t len = end ? (size_t)(end - s) : strlen(s);
        long long i;
        if (len == 0 || len >= sizeof(num))
            return false;
        memcpy(num, s, len);
        num[len] = '\0';
        if (!mge_parse_int(num, 0, MGE_GPUS_MAX - 1, &i))
            return false;
        m |= (uint64_t)1 << i;
        s += len + (end ? 1 : 0);
        if (end && !*s)
            return false; /* a trailing comma */
    }
    *mask = m;
    return true;
}

int mge_gpu_mask_count(uint64_t mask)
{
    int n = 0;
    for (; mask; mask &= mask - 1)
        n++;
    return n;
}
