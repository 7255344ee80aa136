/*
 * device_sim.c: "sim", a simulated accelerator for tests. Its arenas are mmap'd regions kept
 * PROT_NONE except while one of its kernels (the CPU ops, wrapped) or copies runs, so host code
 * that reaches device memory outside the seam faults; the kernels are the CPU ones, so a run on
 * "sim" is bit-identical to one on "cpu" exactly when every transfer is explicit.
 */
#define _DEFAULT_SOURCE
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "engine/device.h"
#include "engine/engine_int.h"
#include "kernels/cpu/cpu.h"

struct sim_region {
    void *p;
    size_t len; /* mapped bytes (whole pages) */
};

/* Every live region, and the depth of open windows: [mu] */
static pthread_mutex_t sim_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sim_region *sim_regions;
static int sim_n, sim_cap;
static int sim_depth;

static size_t page_round(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return n ? (n + pg - 1) / pg * pg : pg;
}

/* Make every region accessible (@on) or not; called with sim_mu held. */
static void protect_all(int on)
{
    for (int i = 0; i < sim_n; i++)
        mprotect(sim_regions[i].p, sim_regions[i].len, on ? PROT_READ | PROT_WRITE : PROT_NONE);
}

static void window_open(void)
{
    pthread_mutex_lock(&sim_mu);
    if (sim_depth++ == 0)
        protect_all(1);
    pthread_mutex_unlock(&sim_mu);
}

static void window_close(void)
{
    pthread_mutex_lock(&sim_mu);
    if (--sim_depth == 0)
        protect_all(0);
    pthread_mutex_unlock(&sim_mu);
}

static void *sim_alloc(size_t bytes)
{
    size_t len = page_round(bytes);
    void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    pthread_mutex_lock(&sim_mu);
    if (sim_n == sim_cap) {
        int cap = sim_cap ? 2 * sim_cap : 16;
        struct sim_region *r = mge_realloc(sim_regions, sizeof(*r) * (size_t)cap);
        if (!r) {
            pthread_mutex_unlock(&sim_mu);
            munmap(p, len);
            return NULL;
        }
        sim_regions = r;
        sim_cap = cap;
    }
    sim_regions[sim_n].p = p;
    sim_regions[sim_n++].len = len;
    if (sim_depth > 0)
        mprotect(p, len, PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&sim_mu);
    return p;
}

static void sim_free(void *p, size_t bytes)
{
    if (!p)
        return;
    pthread_mutex_lock(&sim_mu);
    for (int i = 0; i < sim_n; i++)
        if (sim_regions[i].p == p) {
            munmap(p, sim_regions[i].len);
            sim_regions[i] = sim_regions[--sim_n];
            break;
        }
    if (sim_n == 0) {
        mge_free(sim_regions);
        sim_regions = NULL;
        sim_cap = 0;
    }
    pthread_mutex_unlock(&sim_mu);
    (void)bytes;
}

static void sim_copy(void *dst, const void *src, size_t n)
{
    if (!n || dst == src)
        return;
    window_open();
    memcpy(dst, src, n);
    window_close();
}

static void sim_memset(void *dst, int c, size_t n)
{
    window_open();
    memset(dst, c, n);
    window_close();
}

static void sim_sync(void) {}

/* Input staging: a synchronous copy, so that sim runs the staging path bit-identically. */
static void sim_stage_copy(int slot, void *dst, const void *src, size_t n)
{
    (void)slot;
    sim_copy(dst, src, n);
}

static void sim_kernel(void (*fn)(void *ctx), void *ctx)
{
    window_open();
    fn(ctx);
    window_close();
}

/* Every op: the CPU kernel, inside the window. */
static int sim_op(struct mge_graph *g, const struct mge_node *n)
{
    window_open();
    int rc = mge__cpu_ops.fn[n->op](g, n);
    window_close();
    return rc;
}

static const struct mge_ops_table sim_ops = {
    .device = "sim",
    .fn =
        {
#define SIM_OP(name) [MGE_OP_##name] = sim_op,
            MGE_OP_MAP(SIM_OP)
#undef SIM_OP
        },
};

const struct mge_device mge_device_sim = {
    .name = "sim",
    .host_visible = 0,
    .bf16 = 1,
    .ops = &sim_ops,
    .alloc = sim_alloc,
    .free = sim_free,
    .h2d = sim_copy,
    .d2h = sim_copy,
    .d2d = sim_copy,
    .memset = sim_memset,
    .sync = sim_sync,
    .kernel = sim_kernel,
    /* the CPU's, run inside the window by sim_kernel() */
    .sgd_update = mge_cpu_sgd_update,
    .adam_update = mge_cpu_adam_update,
    .l2_norm = mge_cpu_l2_norm,
    .scale = mge_cpu_scale,
    .stage_copy = sim_stage_copy,
};
