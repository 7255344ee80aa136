/* device.c: the CPU device (host memory, memcpy copies) and the graph's calls across the seam. */
#include "engine/device.h"

#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "engine/engine_int.h"
#include "kernels/cpu/cpu.h"

static void *cpu_alloc(size_t bytes)
{
    return mge_malloc_aligned(bytes ? bytes : 64);
}

static void cpu_free(void *p, size_t bytes)
{
    (void)bytes;
    mge_free_aligned(p);
}

static void cpu_copy(void *dst, const void *src, size_t n)
{
    if (n && dst != src)
        memcpy(dst, src, n);
}

static void cpu_memset(void *dst, int c, size_t n)
{
    memset(dst, c, n);
}

static void cpu_sync(void) {}

static void cpu_kernel(void (*fn)(void *ctx), void *ctx)
{
    fn(ctx);
}

const struct mge_device mge_device_cpu = {
    .name = "cpu",
    .host_visible = 1,
    .bf16 = 1,
    .ops = &mge__cpu_ops,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .h2d = cpu_copy,
    .d2h = cpu_copy,
    .d2d = cpu_copy,
    .memset = cpu_memset,
    .sync = cpu_sync,
    .kernel = cpu_kernel,
    .sgd_update = mge_cpu_sgd_update,
    .adam_update = mge_cpu_adam_update,
    .l2_norm = mge_cpu_l2_norm,
    .scale = mge_cpu_scale,
};

const struct mge_device *mge_device_find(const char *name)
{
    const struct mge_device *all[] = {&mge_device_cpu, &mge_device_sim, mge_device_cuda()};
    for (size_t i = 0; name && i < sizeof(all) / sizeof(all[0]); i++)
        if (all[i] && !strcmp(all[i]->name, name))
            return all[i];
    return NULL;
}

const struct mge_device *mge__graph_dev(const struct mge_graph *g)
{
    return g->dev ? g->dev : &mge_device_cpu;
}

int mge_graph_set_device(struct mge_graph *g, const struct mge_device *dev)
{
    if (g->allocated)
        return MGE_ERR(MGE_STATE, "device: the graph's arenas are allocated already");
    if (!dev)
        dev = &mge_device_cpu;
    if (g->bf16 && !dev->bf16) {
        mge__graph_fail(g, MGE_UNSUPPORTED,
                        "train.precision: bf16 runs on the cpu device only, not on '%s'",
                        dev->name);
        return MGE_UNSUPPORTED;
    }
    for (int i = 0; i < g->n_nodes; i++)
        if (!dev->ops->fn[g->nodes[i].op]) {
            mge__graph_fail(g, MGE_UNSUPPORTED, "op %s (node %d%s) has no kernel on device '%s'",
                            mge__op_name(g->nodes[i].op), i,
                            g->nodes[i].backward ? ", backward" : "", dev->name);
            return MGE_UNSUPPORTED;
        }
    g->dev = dev;
    return MGE_OK;
}

const struct mge_device *mge_graph_device(const struct mge_graph *g)
{
    return mge__graph_dev(g);
}

/* Device memory of value @v for a copy of @bytes, or NULL (and the error in *@rc). */
static void *value_span(const struct mge_graph *g, int v, size_t bytes, int *rc)
{
    *rc = MGE_OK;
    if (v < 0 || v >= g->n_values) {
        *rc = MGE_ERR(MGE_INVAL, "value %d does not exist", v);
        return NULL;
    }
    if (!g->allocated || !g->values[v].data) {
        *rc = MGE_ERR(MGE_STATE, "value '%s' has no device memory yet", g->values[v].name);
        return NULL;
    }
    if (bytes > mge__value_bytes(g, v)) {
        *rc = MGE_ERR(MGE_RANGE, "value '%s': %zu bytes asked, %zu planned", g->values[v].name,
                      bytes, mge__value_bytes(g, v));
        return NULL;
    }
    return g->values[v].data;
}

int mge_value_read(const struct mge_graph *g, int v, void *host, size_t bytes)
{
    int rc;
    void *d = value_span(g, v, bytes, &rc);
    if (d)
        mge__graph_dev(g)->d2h(host, d, bytes);
    return rc;
}

int mge_value_write(struct mge_graph *g, int v, const void *host, size_t bytes)
{
    int rc;
    void *d = value_span(g, v, bytes, &rc);
    if (d)
        mge__graph_dev(g)->h2d(d, host, bytes);
    return rc;
}

const void *mge_value_host(const struct mge_graph *g, int v, void *scratch, size_t bytes)
{
    if (mge__graph_dev(g)->host_visible)
        return g->values[v].data;
    return mge_value_read(g, v, scratch, bytes) == MGE_OK ? scratch : NULL;
}
