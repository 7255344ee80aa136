/* gpus.c: GPU detection and CUDA_VISIBLE_DEVICES for ranks (see gpus.h). */
#include "gpus.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"

#define PROP_BUF 8192 /* cudaDeviceProp is about 1 KiB; we give more */

/* Every device the CUDA runtime in @h sees; the count, 0 when none or on any error. */
static int cudart_gpus(void *h, struct mge_gpu *out)
{
    int (*count)(int *);
    int (*props)(void *, int);
    unsigned char *buf;
    int n = 0;
    *(void **)&count = dlsym(h, "cudaGetDeviceCount");
    *(void **)&props = dlsym(h, "cudaGetDeviceProperties_v2");
    if (!props)
        *(void **)&props = dlsym(h, "cudaGetDeviceProperties");
    if (!count || count(&n) != 0 || n <= 0)
        return 0;
    if (n > MGE_GPUS_MAX)
        n = MGE_GPUS_MAX;
    buf = mge_calloc(1, PROP_BUF);
    for (int i = 0; i < n; i++) {
        size_t total = 0;
        snprintf(out[i].name, sizeof(out[i].name), "CUDA device %d", i);
        out[i].memory_mb = 0;
        if (!buf || !props || props(buf, i) != 0)
            continue;
        buf[MGE_CUDA_PROP_NAME_LEN - 1] = '\0';
        if (buf[0])
            snprintf(out[i].name, sizeof(out[i].name), "%s", (const char *)buf);
        memcpy(&total, buf + MGE_CUDA_PROP_TOTAL_MEM_OFF, sizeof(total));
        out[i].memory_mb = (int64_t)(total >> 20);
    }
    mge_free(buf);
    return n;
}

int mge_gpus_detect(struct mge_gpu *out, int *n, char *source, size_t source_len, char *why,
                    size_t why_len)
{
    static const char *const libs[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                       "libcudart.so.11.0", "/usr/local/cuda/lib64/libcudart.so"};
    const char *fake = getenv(MGE_FAKE_GPUS_ENV);
    *n = 0;
    snprintf(source, source_len, "none");
    if (fake) {
        int rc = mge_gpus_parse(fake, out, n, why, why_len);
        if (rc == MGE_OK)
            snprintf(source, source_len, "%s", MGE_FAKE_GPUS_ENV);
        return rc;
    }
    for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++) {
        void *h = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
        if (!h)
            continue;
        *n = cudart_gpus(h, out);
        dlclose(h);
        snprintf(source, source_len, "%s", libs[i]);
        return MGE_OK;
    }
    return MGE_OK;
}

char *mge_gpus_visible(const char *ids, const char *worker_visible, char *buf, size_t len)
{
    uint64_t mask;
    size_t off = 0;
    if (len)
        buf[0] = '\0';
    if (!worker_visible || !mge_gpu_mask_parse(ids, &mask)) {
        if (!worker_visible)
            snprintf(buf, len, "%s", ids);
        return buf;
    }
    for (int i = 0; i < MGE_GPUS_MAX && mask; i++) {
        const char *e = worker_visible;
        size_t elen;
        if (!(mask >> i & 1))
            continue;
        mask &= ~((uint64_t)1 << i);
        for (int k = 0; k < i && e; k++) { /* entry i of "a,b,c" */
            e = strchr(e, ',');
            e = e ? e + 1 : NULL;
        }
        if (!e || !*e) {
            buf[0] = '\0';
            return buf;
        }
        elen = strcspn(e, ",");
        if (off + elen + 2 > len) {
            buf[0] = '\0';
            return buf;
        }
        off += (size_t)snprintf(buf + off, len - off, "%s%.*s", off ? "," : "", (int)elen, e);
    }
    return buf;
}
