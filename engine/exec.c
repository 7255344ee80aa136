/* exec.c: running a planned graph on the CPU ops table, binding inputs, initialising parameters. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/rng.h"
#include "engine/device.h"
#include "engine/engine_int.h"

int mge_graph_bind(struct mge_graph *g, int v, void *data)
{
    if (v < 0 || v >= g->n_values || g->values[v].kind != MGE_VALUE_INPUT)
        return MGE_ERR(MGE_INVAL, "bind: value %d is not an input", v);
    g->values[v].host = data;
    if (g->input_arena) { /* off the host: runs copy @data into the input's slot */
        g->staged = 0;
        return MGE_OK;
    }
    g->values[v].data = data;
    for (int a = 0; a < g->n_values; a++)
        if (g->values[a].alias >= 0 && mge__value_root(g, a) == v)
            g->values[a].data = data;
    return MGE_OK;
}

int mge_graph_set_batch(struct mge_graph *g, int64_t n)
{
    if (n < 1 || (g->batch_max > 0 && n > g->batch_max))
        return MGE_ERR(MGE_RANGE, "batch %lld outside 1..%lld", (long long)n,
                       (long long)g->batch_max);
    g->batch = n;
    return MGE_OK;
}

/* Point the inputs (and their aliases) at input slot @slot of the input arena. */
static void point_inputs(struct mge_graph *g, int slot)
{
    unsigned char *base = g->input_arena + (size_t)slot * g->input_bytes;
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == MGE_VALUE_INPUT && g->values[v].alias < 0)
            g->values[v].data = base + g->values[v].offset;
    for (int a = 0; a < g->n_values; a++)
        if (g->values[a].alias >= 0 && g->values[mge__value_root(g, a)].kind == MGE_VALUE_INPUT)
            g->values[a].data = g->values[mge__value_root(g, a)].data;
    g->slot = slot;
}

/*
 * Off the host, the bound inputs' rows go host -> device into the slot the last run did not
 * use: first into that slot's host staging buffer (pinned on cuda), so the caller's memory is
 * free at once, then by the device's stage_copy (asynchronous on cuda, behind the kernels that
 * last read the slot). The loader's prefetch ring is the host side's own double buffer.
 */
int mge_graph_stage(struct mge_graph *g)
{
    const struct mge_device *dev = mge__graph_dev(g);
    if (!g->allocated)
        return MGE_ERR(MGE_STATE, "graph not allocated");
    if (!g->input_arena)
        return MGE_OK;
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == MGE_VALUE_INPUT && !g->values[v].host)
            return MGE_ERR(MGE_STATE, "input '%s' not bound", g->values[v].name);
    int s = g->slot ^ 1;
    size_t bytes = g->input_bytes ? g->input_bytes : 64;
    if (!g->stage_host[s])
        g->stage_host[s] = dev->host_alloc ? dev->host_alloc(bytes) : mge_malloc_aligned(bytes);
    if (!g->stage_host[s])
        return MGE_ERR(MGE_NOMEM, "cannot allocate a %zu-byte input staging buffer", bytes);
    if (dev->stage_wait) /* the slot's last copy has left its staging buffer */
        dev->stage_wait(s);
    unsigned char *slot = g->input_arena + (size_t)s * g->input_bytes;
    for (int v = 0; v < g->n_values; v++) {
        struct mge_value *val = &g->values[v];
        if (val->kind != MGE_VALUE_INPUT || val->alias >= 0)
            continue;
        size_t n = mge_dtype_size(val->dtype) * (size_t)mge__value_numel_now(g, v);
        memcpy(g->stage_host[s] + val->offset, val->host, n);
        dev->stage_copy(s, slot + val->offset, g->stage_host[s] + val->offset, n);
    }
    g->staged = 1;
    g->staged_batch = g->batch;
    return MGE_OK;
}

int mge_graph_is_staged(const struct mge_graph *g)
{
    return g->input_arena && g->staged && g->staged_batch == g->batch;
}

/* Before a run off the host: its inputs (staged now unless mge_graph_stage() did it already)
 * become the slot the values point at, and the device's kernels wait for their copies. */
static int take_inputs(struct mge_graph *g)
{
    int rc;
    if (!g->input_arena)
        return MGE_OK;
    if (!mge_graph_is_staged(g) && (rc = mge_graph_stage(g)) != MGE_OK)
        return rc;
    g->staged = 0;
    point_inputs(g, g->slot ^ 1);
    if (mge__graph_dev(g)->stage_ready)
        mge__graph_dev(g)->stage_ready(g->slot);
    return MGE_OK;
}

static int run_nodes(struct mge_graph *g, int train);

int mge_graph_run(struct mge_graph *g, enum mge_run mode, int64_t step)
{
    if (!g->allocated)
        return MGE_ERR(MGE_STATE, "graph not allocated");
    int train = mode == MGE_RUN_TRAIN;
    if (train && g->loss < 0)
        return MGE_ERR(MGE_STATE, "graph has no backward");
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == MGE_VALUE_INPUT && !g->values[v].host)
            return MGE_ERR(MGE_STATE, "input '%s' not bound", g->values[v].name);
    g->training = mode != MGE_RUN_INFER;
    g->step = step;
    int rc = take_inputs(g);
    if (rc != MGE_OK)
        return rc;
    rc = run_nodes(g, train);
    /* every kernel that reads this slot is issued: the next copy into it may follow them */
    if (g->input_arena && mge__graph_dev(g)->stage_release)
        mge__graph_dev(g)->stage_release(g->slot);
    return rc;
}

/* Issue the nodes of one run in order, with the profiling, eager and gradient-ready hooks. */
static int run_nodes(struct mge_graph *g, int train)
{
    int end = train ? g->n_nodes : g->n_forward;
    const struct mge_ops_table *ops = mge__graph_dev(g)->ops;
    size_t reported = 0;
    for (int ni = 0; ni < end; ni++) {
        const struct mge_node *n = &g->nodes[ni];
        struct timespec t0, t1;
        if (g->profile || g->op_fn)
            clock_gettime(CLOCK_MONOTONIC, &t0);
        if (!ops->fn[n->op]) /* mge_graph_set_device() refuses such a graph: a node added since */
            return MGE_ERR(MGE_UNSUPPORTED, "op %d (%s) has no kernel on device '%s'", ni,
                           mge__op_name(n->op), ops->device);
        int rc = ops->fn[n->op](g, n);
        if (rc != MGE_OK)
            return MGE_ERR(rc, "op %d (%s) failed", ni, mge__op_name(n->op));
        if (g->profile || g->op_fn) {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if (g->profile)
                g->profile[ni] += (double)(t1.tv_sec - t0.tv_sec) +
                                  1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        }
        if (g->op_fn)
            g->op_fn(g->op_ctx, ni, (double)t0.tv_sec + 1e-9 * (double)t0.tv_nsec,
                     (double)t1.tv_sec + 1e-9 * (double)t1.tv_nsec);
        if (g->eager && (rc = mge__eager_check(g, ni)) != MGE_OK)
            return rc;
        if (train && g->ready_fn && g->grad_ready && g->grad_ready[ni] > reported) {
            reported = g->grad_ready[ni];
            g->ready_fn(g->ready_ctx, reported);
        }
    }
    if (train && g->ready_fn && reported < g->grad_bytes)
        g->ready_fn(g->ready_ctx, g->grad_bytes);
    return MGE_OK;
}

void mge_graph_set_grad_hook(struct mge_graph *g, void (*fn)(void *ctx, size_t ready_bytes),
                             void *ctx)
{
    g->ready_fn = fn;
    g->ready_ctx = ctx;
}

void mge_graph_set_op_hook(struct mge_graph *g,
                           void (*fn)(void *ctx, int node, double t0, double t1), void *ctx)
{
    g->op_fn = fn;
    g->op_ctx = ctx;
}

const char *mge_graph_node_op(const struct mge_graph *g, int node, int *backward)
{
    if (node < 0 || node >= g->n_nodes)
        return NULL;
    if (backward)
        *backward = g->nodes[node].backward;
    return mge__op_name(g->nodes[node].op);
}

int mge_graph_n_nodes(const struct mge_graph *g) { return g->n_nodes; }

void mge_graph_set_loss_scale(struct mge_graph *g, float scale) { g->loss_scale = scale; }

void mge_graph_set_row_offset(struct mge_graph *g, int64_t rows) { g->row_offset = rows; }

void mge_graph_set_bf16(struct mge_graph *g, int on)
{
    g->bf16 = on != 0;
}

int mge_graph_profile(struct mge_graph *g, int on)
{
    mge_free(g->profile);
    g->profile = NULL;
    if (on && !(g->profile = mge_calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof(double))))
        return MGE_ERR(MGE_NOMEM, "cannot allocate profile");
    return MGE_OK;
}

void mge_graph_profile_print(const struct mge_graph *g, FILE *fp, int64_t runs)
{
    if (!g->profile || runs <= 0)
        return;
    double total = 0.0;
    for (int ni = 0; ni < g->n_nodes; ni++)
        total += g->profile[ni];
    fprintf(fp, "profile: %.3f ms per run over %lld runs\n", 1e3 * total / (double)runs,
            (long long)runs);
    for (int ni = 0; ni < g->n_nodes; ni++) {
        const struct mge_node *n = &g->nodes[ni];
        int64_t shape[MGE_MAX_DIMS] = {0};
        int o = n->out[0] >= 0 ? n->out[0] : 0;
        memcpy(shape, g->values[o].shape, sizeof(int64_t) * (size_t)g->values[o].ndim);
        fprintf(fp, "  %4d %-16s %s %8.4f ms %5.1f%%  out %s [%lld %lld %lld %lld]\n", ni,
                mge__op_name(n->op), n->backward ? "bwd" : "fwd",
                1e3 * g->profile[ni] / (double)runs, 100.0 * g->profile[ni] / total,
                g->values[o].name, (long long)shape[0], (long long)shape[1],
                (long long)shape[2], (long long)shape[3]);
    }
}

/* Two independent N(0, 1) draws (Box-Muller; u1 in (0, 1] so the log is finite). */
static void rng_normal2(struct mge_rng *rng, float z[2])
{
    double u1 = 1.0 - (double)mge_rng_float(rng), u2 = (double)mge_rng_float(rng);
    double r = sqrt(-2.0 * log(u1)), t = 2.0 * M_PI * u2;
    z[0] = (float)(r * cos(t));
    z[1] = (float)(r * sin(t));
}

/*
 * Initial values are drawn on the host: in place on a host-visible device, else into a host
 * copy of the parameter arena that then goes to the device in one copy.
 */
void mge_graph_init_params(struct mge_graph *g, uint64_t seed)
{
    const struct mge_device *dev = mge__graph_dev(g);
    unsigned char *host = dev->host_visible
                              ? (unsigned char *)g->param_arena
                              : mge_malloc_aligned(g->param_bytes ? g->param_bytes : 64);
    g->seed = seed;
    if (!host) {
        mge__graph_fail(g, MGE_NOMEM, "cannot allocate the parameters' host copy");
        return;
    }
    if (!dev->host_visible) /* the padding between parameters is zero on every device */
        memset(host, 0, g->param_bytes);
    for (int i = 0; i < g->n_params; i++) {
        struct mge_value *p = &g->values[g->params[i]];
        float *d = (float *)(host + p->offset);
        int64_t n = mge_value_numel(g, g->params[i]);
        /* one stream per parameter, so adding a layer does not change the others */
        struct mge_rng rng;
        mge_rng_seed(&rng, seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(i + 1)));
        switch (p->init) {
        case MGE_INIT_ZERO:
            memset(d, 0, sizeof(float) * (size_t)n);
            break;
        case MGE_INIT_ONE:
            for (int64_t k = 0; k < n; k++)
                d[k] = 1.0f;
            break;
        case MGE_INIT_UNIFORM_FAN_IN: {
            /* PyTorch's Linear/Conv default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) */
            float bound = 1.0f / sqrtf((float)(p->fan_in > 0 ? p->fan_in : 1));
            for (int64_t k = 0; k < n; k++)
                d[k] = (2.0f * mge_rng_float(&rng) - 1.0f) * bound;
            break;
        }
        case MGE_INIT_NORMAL_FAN_OUT:
        case MGE_INIT_NORMAL_GPT: {
            /* kaiming_normal_(mode="fan_out", nonlinearity="relu"): N(0, 2 / fan_out); GPT-2:
             * N(0, 0.02^2 / fan) */
            float fan = (float)(p->fan_in > 0 ? p->fan_in : 1);
            float std = p->init == MGE_INIT_NORMAL_GPT ? 0.02f / sqrtf(fan) : sqrtf(2.0f / fan);
            for (int64_t k = 0; k < n; k += 2) {
                float z[2];
                rng_normal2(&rng, z);
                d[k] = z[0] * std;
                if (k + 1 < n)
                    d[k + 1] = z[1] * std;
            }
            break;
        }
        }
    }
    if (!dev->host_visible) {
        dev->h2d(g->param_arena, host, g->param_bytes);
        mge_free_aligned(host);
    }
}
