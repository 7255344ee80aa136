/*
 * plan.c: the static memory planner. Execution order gives every activation a lifetime
 * [first write, last read]; activations whose lifetimes overlap get disjoint byte ranges in one
 * arena (greedy by size, best offset), so the peak is known before the first step. Parameters
 * and gradients get one arena each; gradients are laid out in the order backward finishes them.
 */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "engine/engine_int.h"

#define PLAN_ALIGN 64

static size_t align_up(size_t n) { return (n + PLAN_ALIGN - 1) & ~(size_t)(PLAN_ALIGN - 1); }

static int item_by_size_desc(const void *pa, const void *pb)
{
    const struct mge__plan_item *a = pa, *b = pb;
    if (a->size != b->size)
        return a->size < b->size ? 1 : -1;
    if (a->first != b->first)
        return a->first < b->first ? -1 : 1;
    return a->v - b->v;
}

static int item_by_offset(const void *pa, const void *pb)
{
    const struct mge__plan_item *const *a = pa, *const *b = pb;
    if ((*a)->offset != (*b)->offset)
        return (*a)->offset < (*b)->offset ? -1 : 1;
    return 0;
}

static void touch(struct mge_graph *g, int v, int64_t at)
{
    if (v < 0)
        return;
    struct mge_value *r = &g->values[mge__value_root(g, v)];
    if (r->first_use < 0 || at < r->first_use)
        r->first_use = at;
    if (at > r->last_use)
        r->last_use = at;
}

static int item_by_first(const void *pa, const void *pb)
{
    const struct mge__plan_item *a = pa, *b = pb;
    if (a->first != b->first)
        return a->first < b->first ? -1 : 1;
    if (a->size != b->size)
        return a->size < b->size ? 1 : -1;
    return a->v - b->v;
}

/* Placed items by time block, so finding the items alive with a new one is not O(n). */
struct time_index {
    int **lists;   /* per block: indices of placed items overlapping it */
    int *len, *cap;
    int nb;
    int64_t blk;   /* node indices per block */
};

static void time_index_fini(struct time_index *ti)
{
    for (int b = 0; ti->lists && b < ti->nb; b++)
        mge_free(ti->lists[b]);
    mge_free(ti->lists);
    mge_free(ti->len);
    mge_free(ti->cap);
}

static int time_index_init(struct time_index *ti, int64_t tmax, int n)
{
    memset(ti, 0, sizeof(*ti));
    int nb = n < 64 ? 1 : n / 16 > 1024 ? 1024 : n / 16;
    ti->blk = tmax / nb + 1;
    ti->nb = (int)(tmax / ti->blk) + 1;
    ti->lists = mge_calloc((size_t)ti->nb, sizeof(*ti->lists));
    ti->len = mge_calloc((size_t)ti->nb, sizeof(int));
    ti->cap = mge_calloc((size_t)ti->nb, sizeof(int));
    if (!ti->lists || !ti->len || !ti->cap) {
        time_index_fini(ti);
        return MGE_NOMEM;
    }
    return MGE_OK;
}

static int time_index_add(struct time_index *ti, const struct mge__plan_item *it, int idx)
{
    for (int64_t b = it->first / ti->blk; b <= it->last / ti->blk; b++) {
        if (ti->len[b] == ti->cap[b]) {
            int cap = ti->cap[b] ? ti->cap[b] * 2 : 16;
            int *p = mge_realloc(ti->lists[b], sizeof(int) * (size_t)cap);
            if (!p)
                return MGE_NOMEM;
            ti->lists[b] = p;
            ti->cap[b] = cap;
        }
        ti->lists[b][ti->len[b]++] = idx;
    }
    return MGE_OK;
}

/*
 * Place @items in their current order. Each goes into a gap between the already placed items
 * that are alive at the same time: best fit (@two_sided == 0), or (two_sided) the bottom when
 * it is free there, else as high as fits under @target, else the lowest gap. Returns the
 * arena size, or (size_t)-1 on OOM.
 */
static size_t plan_place(struct mge__plan_item *items, int n, int two_sided, size_t target,
                         int64_t tmax)
{
    size_t arena = 0;
    struct time_index ti;
    struct mge__plan_item **live = mge_malloc(sizeof(*live) * (size_t)(n ? n : 1));
    int *stamp = mge_malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!live || !stamp || time_index_init(&ti, tmax, n) != MGE_OK) {
        mge_free(live);
        mge_free(stamp);
        return (size_t)-1;
    }
    for (int i = 0; i < n; i++)
        stamp[i] = -1;
    for (int i = 0; i < n; i++) {
        struct mge__plan_item *it = &items[i];
        int n_live = 0;
        for (int64_t b = it->first / ti.blk; b <= it->last / ti.blk; b++)
            for (int k = 0; k < ti.len[b]; k++) {
                int j = ti.lists[b][k];
                if (stamp[j] == i)
                    continue;
                stamp[j] = i;
                if (items[j].first <= it->last && it->first <= items[j].last)
                    live[n_live++] = &items[j];
            }
        qsort(live, (size_t)n_live, sizeof(*live), item_by_offset);
        size_t best = (size_t)-1, best_gap = (size_t)-1, lowest = (size_t)-1, high = (size_t)-1;
        size_t at = 0;
        for (int j = 0; j <= n_live; j++) {
            size_t gap_end = j < n_live ? live[j]->offset : (size_t)-1;
            if (gap_end >= at + it->size) {
                size_t gap = gap_end - at;
                if (lowest == (size_t)-1)
                    lowest = at;
                if (j < n_live && gap < best_gap) {
                    best_gap = gap;
                    best = at;
                }
                size_t top = (gap_end < target ? gap_end : target);
                if (top >= at + it->size && top - it->size >= at)
                    high = top - it->size;
            }
            if (j < n_live && live[j]->offset + live[j]->size > at)
                at = live[j]->offset + live[j]->size;
        }
        if (!two_sided)
            it->offset = best != (size_t)-1 ? best : at;
        else if (lowest == 0 || high == (size_t)-1)
            it->offset = lowest;
        else
            it->offset = high;
        if (it->offset + it->size > arena)
            arena = it->offset + it->size;
        if (time_index_add(&ti, it, i) != MGE_OK) {
            arena = (size_t)-1;
            break;
        }
    }
    time_index_fini(&ti);
    mge_free(live);
    mge_free(stamp);
    return arena;
}

static int item_by_last_desc(const void *pa, const void *pb)
{
    const struct mge__plan_item *a = pa, *b = pb;
    if (a->last != b->last)
        return a->last < b->last ? 1 : -1;
    if (a->size != b->size)
        return a->size < b->size ? 1 : -1;
    return a->v - b->v;
}

static int item_by_area_desc(const void *pa, const void *pb)
{
    const struct mge__plan_item *a = pa, *b = pb;
    double x = (double)a->size * (double)(a->last - a->first + 1);
    double y = (double)b->size * (double)(b->last - b->first + 1);
    if (x != y)
        return x < y ? 1 : -1;
    return a->v - b->v;
}

size_t mge__plan_assign(struct mge__plan_item *items, int n)
{
    /* three orders, keep the smallest arena: by size (best fit), by time against the lower
     * bound from both ends (optimal on chains), by size x lifetime (best fit) */
    static int (*const orders[5])(const void *, const void *) = {
        item_by_size_desc, item_by_first, item_by_area_desc, item_by_last_desc, item_by_size_desc};
    static const int two_sided[5] = {0, 1, 0, 1, 1};
    int64_t end = 0;
    for (int i = 0; i < n; i++)
        if (items[i].last > end)
            end = items[i].last;
    size_t lower = mge__plan_lower_bound(items, n, end);
    struct mge__plan_item *alt = mge_malloc(sizeof(*alt) * (size_t)(n ? n : 1));
    struct mge__plan_item *best = mge_malloc(sizeof(*best) * (size_t)(n ? n : 1));
    size_t best_arena = (size_t)-1;
    if (lower == (size_t)-1 || !alt || !best)
        goto out_free;
    for (int s = 0; s < 5; s++) {
        memcpy(alt, items, sizeof(*alt) * (size_t)n);
        qsort(alt, (size_t)n, sizeof(*alt), orders[s]);
        size_t a = plan_place(alt, n, two_sided[s], lower, end);
        if (a == (size_t)-1) {
            best_arena = (size_t)-1;
            goto out_free;
        }
        if (a < best_arena) {
            best_arena = a;
            memcpy(best, alt, sizeof(*best) * (size_t)n);
        }
        if (a == lower)
            break; /* optimal */
    }
    memcpy(items, best, sizeof(*items) * (size_t)n);
out_free:
    mge_free(alt);
    mge_free(best);
    return best_arena;
}

size_t mge__plan_lower_bound(const struct mge__plan_item *items, int n, int64_t end)
{
    int64_t *delta = mge_calloc((size_t)end + 2, sizeof(int64_t));
    size_t lower = 0;
    int64_t cur = 0;
    if (!delta)
        return (size_t)-1;
    for (int i = 0; i < n; i++) {
        delta[items[i].first] += (int64_t)items[i].size;
        delta[items[i].last + 1] -= (int64_t)items[i].size;
    }
    for (int64_t t = 0; t <= end; t++) {
        cur += delta[t];
        if ((size_t)cur > lower)
            lower = (size_t)cur;
    }
    mge_free(delta);
    return lower;
}

/*
 * For each node, the prefix of the gradient arena whose gradients are final once it ran:
 * gradients sorted by offset, each final after its last write.
 */
static int plan_grad_ready(struct mge_graph *g)
{
    if (!g->grads)
        return MGE_OK;
    int64_t *last = mge_malloc(sizeof(int64_t) * (size_t)(g->n_params ? g->n_params : 1));
    int *order = mge_malloc(sizeof(int) * (size_t)(g->n_params ? g->n_params : 1));
    g->grad_ready = mge_calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof(size_t));
    if (!last || !order || !g->grad_ready) {
        mge_free(last);
        mge_free(order);
        return MGE_ERR(MGE_NOMEM, "cannot allocate plan");
    }
    int n = 0;
    for (int i = 0; i < g->n_params; i++) {
        last[i] = -1;
        if (g->grads[i] >= 0)
            order[n++] = i;
    }
    for (int ni = 0; ni < g->n_nodes; ni++)
        for (int k = 0; k < g->nodes[ni].n_out; k++) {
            int o = g->nodes[ni].out[k];
            if (o < 0)
                continue;
            o = mge__value_root(g, o);
            if (g->values[o].kind == MGE_VALUE_GRAD)
                last[g->values[o].param_index] = ni;
        }
    /* insertion sort by offset: parameter counts are small */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && g->values[g->grads[order[j]]].offset <
                                     g->values[g->grads[order[j - 1]]].offset; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    int at = 0;
    size_t ready = 0;
    for (int ni = 0; ni < g->n_nodes; ni++) {
        while (at < n && last[order[at]] <= ni) {
            const struct mge_value *gv = &g->values[g->grads[order[at]]];
            ready = gv->offset + align_up(mge__value_bytes(g, g->grads[order[at]]));
            at++;
        }
        g->grad_ready[ni] = ready;
    }
    mge_free(last);
    mge_free(order);
    return MGE_OK;
}

int mge_graph_grad_span(const struct mge_graph *g, int param, size_t *offset, size_t *bytes)
{
    int gv = mge_graph_grad(g, param);
    if (gv < 0 || !g->planned)
        return MGE_ERR(MGE_INVAL, "parameter %d has no planned gradient", param);
    *offset = g->values[gv].offset;
    *bytes = mge__value_bytes(g, gv);
    return MGE_OK;
}

/* The input an elementwise op may overwrite with its output (-1 if none), for in-place reuse. */
static int inplace_source(const struct mge_node *n)
{
    switch (n->op) {
    case MGE_OP_UNARY:
    case MGE_OP_BIAS_ACT:
    case MGE_OP_DROPOUT:
        return n->in[0];
    case MGE_OP_UNARY_GRAD:
        return n->acc || n->a.act.act == MGE_ACT_NONE ? -1 : n->in[0];
    case MGE_OP_DROPOUT_GRAD:
    case MGE_OP_SCALE:
        return n->acc ? -1 : n->in[0];
    default:
        return -1;
    }
}

/*
 * In-place reuse: an elementwise op whose source dies at that op writes over it, so the two
 * share storage (the output becomes a view of the source). Done before lifetimes.
 */
static int plan_inplace(struct mge_graph *g)
{
    int64_t *last = mge_malloc(sizeof(int64_t) * (size_t)(g->n_values ? g->n_values : 1));
    if (!last)
        return MGE_ERR(MGE_NOMEM, "cannot allocate plan");
    for (int v = 0; v < g->n_values; v++)
        last[v] = -1;
    for (int ni = 0; ni < g->n_nodes; ni++) {
        const struct mge_node *n = &g->nodes[ni];
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] >= 0)
                last[mge__value_root(g, n->in[i])] = ni;
        for (int i = 0; i < n->n_out; i++)
            if (n->out[i] >= 0)
                last[mge__value_root(g, n->out[i])] = ni;
    }
    for (int ni = 0; ni < g->n_nodes; ni++) {
        const struct mge_node *n = &g->nodes[ni];
        int src = inplace_source(n), out = n->out[0];
        if (src < 0 || out < 0)
            continue;
        int r = mge__value_root(g, src);
        struct mge_value *o = &g->values[out], *rv = &g->values[r];
        if (o->kind != MGE_VALUE_ACT || o->alias >= 0 || o->keep || o->producer != ni ||
            rv->kind != MGE_VALUE_ACT || rv->keep || last[r] != ni ||
            mge__value_bytes(g, out) != mge__value_bytes(g, r) || o->batched != rv->batched)
            continue;
        int other = 0; /* the op must not read the source through another input */
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] >= 0 && n->in[i] != src && mge__value_root(g, n->in[i]) == r)
                other = 1;
        for (int i = 1; i < n->n_out; i++)
            if (n->out[i] >= 0 && mge__value_root(g, n->out[i]) == r)
                other = 1;
        if (other)
            continue;
        o->alias = r;
        last[r] = last[out] > ni ? last[out] : ni;
        for (int k = ni + 1; k < g->n_nodes; k++) /* the merged storage lives as long as out */
            for (int i = 0; i < g->nodes[k].n_in; i++)
                if (g->nodes[k].in[i] >= 0 && mge__value_root(g, g->nodes[k].in[i]) == r)
                    last[r] = k;
    }
    mge_free(last);
    return MGE_OK;
}

int mge_graph_plan(struct mge_graph *g, struct mge_plan_stats *stats)
{
    int rc = MGE_OK;
    if (g->err)
        return g->err;
    if (g->planned)
        return MGE_ERR(MGE_STATE, "graph already planned");
    if (g->n_forward == 0 && g->loss < 0)
        g->n_forward = g->n_nodes;
    if ((rc = plan_inplace(g)) != MGE_OK)
        return rc;

    /* lifetimes over the execution order */
    for (int v = 0; v < g->n_values; v++)
        g->values[v].first_use = g->values[v].last_use = -1;
    for (int ni = 0; ni < g->n_nodes; ni++) {
        const struct mge_node *n = &g->nodes[ni];
        for (int i = 0; i < n->n_in; i++)
            touch(g, n->in[i], ni);
        for (int i = 0; i < n->n_out; i++)
            touch(g, n->out[i], ni);
    }
    int64_t end = g->n_nodes;
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].keep) {
            struct mge_value *r = &g->values[mge__value_root(g, v)];
            if (r->first_use < 0)
                r->first_use = 0;
            r->last_use = end;
        }

    /*
     * Parameters and gradients share one layout, so the optimiser walks both arenas (and its
     * state) element by element: the order in which backward first writes each gradient (the
     * last layer first: packs of gradients are ready front to back), then parameters that get
     * no gradient, in creation order.
     */
    int *order = mge_malloc(sizeof(int) * (size_t)(g->n_params ? g->n_params : 1));
    char *placed = mge_calloc((size_t)(g->n_params ? g->n_params : 1), 1);
    if (!order || !placed) {
        mge_free(order);
        mge_free(placed);
        return MGE_ERR(MGE_NOMEM, "cannot allocate plan");
    }
    int n_order = 0;
    for (int ni = 0; ni < g->n_nodes && g->grads; ni++)
        for (int i = 0; i < g->nodes[ni].n_out; i++) {
            int o = g->nodes[ni].out[i];
            if (o < 0)
                continue;
            o = mge__value_root(g, o);
            int pi = g->values[o].param_index;
            if (g->values[o].kind != MGE_VALUE_GRAD || placed[pi])
                continue;
            placed[pi] = 1;
            order[n_order++] = pi;
        }
    for (int pi = 0; pi < g->n_params; pi++)
        if (!placed[pi])
            order[n_order++] = pi;
    size_t off = 0;
    for (int k = 0; k < n_order; k++) {
        int pv = g->params[order[k]];
        g->values[pv].offset = off;
        if (g->grads && g->grads[order[k]] >= 0)
            g->values[g->grads[order[k]]].offset = off;
        off += align_up(mge__value_bytes(g, pv));
    }
    mge_free(order);
    mge_free(placed);
    g->param_bytes = off;
    g->grad_bytes = g->grads ? off : 0;

    /* activations */
    int n_items = 0;
    struct mge__plan_item *items = mge_malloc(sizeof(*items) * (size_t)(g->n_values ? g->n_values : 1));
    if (!items)
        return MGE_ERR(MGE_NOMEM, "cannot allocate plan");
    size_t inputs = 0;
    for (int v = 0; v < g->n_values; v++) {
        struct mge_value *val = &g->values[v];
        if (val->kind == MGE_VALUE_INPUT)
            inputs += mge__value_bytes(g, v);
        if (val->kind != MGE_VALUE_ACT || val->alias >= 0 || val->first_use < 0)
            continue;
        items[n_items].v = v;
        items[n_items].size = align_up(mge__value_bytes(g, v));
        items[n_items].first = val->first_use;
        items[n_items].last = val->last_use;
        n_items++;
    }
    size_t lower = mge__plan_lower_bound(items, n_items, end);
    if (lower == (size_t)-1) {
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate plan");
        goto out_free;
    }
    size_t arena = mge__plan_assign(items, n_items);
    if (arena == (size_t)-1) {
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate plan");
        goto out_free;
    }
    for (int i = 0; i < n_items; i++)
        g->values[items[i].v].offset = items[i].offset;
    g->act_bytes = arena;
    g->lower_bound = lower;
    if ((rc = plan_grad_ready(g)) != MGE_OK)
        goto out_free;
    g->planned = 1;
    if (stats) {
        stats->param_bytes = g->param_bytes;
        stats->grad_bytes = g->grad_bytes;
        stats->activation_bytes = arena;
        stats->lower_bound_bytes = lower;
        stats->input_bytes = inputs;
        stats->n_values = g->n_values;
        stats->n_nodes = g->n_nodes;
    }
out_free:
    mge_free(items);
    return rc;
}

int mge_graph_alloc(struct mge_graph *g)
{
    if (!g->planned)
        return MGE_ERR(MGE_STATE, "graph not planned");
    if (g->allocated)
        return MGE_OK;
    g->param_arena = mge_malloc_aligned(g->param_bytes ? g->param_bytes : 64);
    g->grad_arena = mge_malloc_aligned(g->grad_bytes ? g->grad_bytes : 64);
    g->act_arena = mge_malloc_aligned(g->act_bytes ? g->act_bytes : 64);
    if (!g->param_arena || !g->grad_arena || !g->act_arena) {
        mge_free_aligned(g->param_arena);
        mge_free_aligned(g->grad_arena);
        mge_free_aligned(g->act_arena);
        g->param_arena = g->grad_arena = NULL;
        g->act_arena = NULL;
        return MGE_ERR(MGE_NOMEM, "cannot allocate arenas (%zu + %zu + %zu bytes)",
                       g->param_bytes, g->grad_bytes, g->act_bytes);
    }
    memset(g->param_arena, 0, g->param_bytes);
    memset(g->grad_arena, 0, g->grad_bytes);
    /* the activation arena is left untouched: pages are mapped on first write (RSS = use) */
    for (int v = 0; v < g->n_values; v++) {
        struct mge_value *val = &g->values[v];
        switch (val->kind) {
        case MGE_VALUE_PARAM:
            val->data = (unsigned char *)g->param_arena + val->offset;
            break;
        case MGE_VALUE_GRAD:
            val->data = (unsigned char *)g->grad_arena + val->offset;
            break;
        case MGE_VALUE_ACT:
            if (val->alias < 0)
                val->data = g->act_arena + val->offset;
            break;
        case MGE_VALUE_INPUT:
            break;
        }
    }
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].alias >= 0)
            g->values[v].data = g->values[mge__value_root(g, v)].data;
    g->allocated = 1;
    g->batch = g->batch_max > 0 ? g->batch_max : 1;
    return MGE_OK;
}

size_t mge_graph_param_bytes(const struct mge_graph *g)
{
    size_t n = 0;
    for (int i = 0; i < g->n_params; i++)
        n += align_up(mge__value_bytes(g, g->params[i]));
    return n;
}

float *mge_graph_params(struct mge_graph *g, int64_t *n)
{
    if (n)
        *n = (int64_t)(g->param_bytes / sizeof(float));
    return g->param_arena;
}

float *mge_graph_grads(struct mge_graph *g, int64_t *n)
{
    if (n)
        *n = (int64_t)(g->grad_bytes / sizeof(float));
    return g->grad_arena;
}
