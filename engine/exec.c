/* exec.c: running a planned graph on the CPU ops table, binding inputs, initialising parameters. */
#include <math.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"
#include "engine/engine_int.h"

int mge_graph_bind(struct mge_graph *g, int v, void *data)
{
    if (v < 0 || v >= g->n_values || g->values[v].kind != MGE_VALUE_INPUT)
        return MGE_ERR(MGE_INVAL, "bind: value %d is not an input", v);
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

int mge_graph_run(struct mge_graph *g, enum mge_run mode, int64_t step)
{
    if (!g->allocated)
        return MGE_ERR(MGE_STATE, "graph not allocated");
    int train = mode == MGE_RUN_TRAIN;
    if (train && g->loss < 0)
        return MGE_ERR(MGE_STATE, "graph has no backward");
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == MGE_VALUE_INPUT && !g->values[v].data)
            return MGE_ERR(MGE_STATE, "input '%s' not bound", g->values[v].name);
    g->training = mode != MGE_RUN_INFER;
    g->step = step;
    int end = train ? g->n_nodes : g->n_forward;
    const struct mge_ops_table *ops = &mge__cpu_ops;
    for (int ni = 0; ni < end; ni++) {
        const struct mge_node *n = &g->nodes[ni];
        int rc = ops->fn[n->op](g, n);
        if (rc != MGE_OK)
            return MGE_ERR(rc, "op %d (%s) failed", ni, mge__op_name(n->op));
    }
    return MGE_OK;
}

void mge_graph_init_params(struct mge_graph *g, uint64_t seed)
{
    g->seed = seed;
    for (int i = 0; i < g->n_params; i++) {
        struct mge_value *p = &g->values[g->params[i]];
        float *d = p->data;
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
        }
    }
}
