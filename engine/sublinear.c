/*
 * sublinear.c: recompute instead of store. A pass between autodiff and the memory planner
 * decides which forward activations backward may read (the kept set); every other one that
 * backward needs is recomputed right before its first use, by clones of the forward ops that
 * made it (recursively, down to kept values). Clones run the same kernels on the same inputs,
 * so results are bit-identical to the plain graph, dropout included (its mask is a function of
 * (seed, step, op)).
 *
 * Plans: "light" recomputes only cheap ops (elementwise, activations, pooling, normalisation);
 * "sublinear" splits the forward pass into segments and keeps only segment boundaries, either
 * equal segments at byte thresholds (Chen et al. 2016) or segments that shrink along the pass
 * as checkpoints accumulate (budget segmentation, below), the latter also with segments that end
 * only at cut points (block boundaries of residual networks); the parameters are searched, each
 * candidate scored by the real planner on a copy of the graph (MegEngine's
 * seq_sublinear_memory searches thresholds the same way).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "engine/engine_int.h"

double mge__node_flops(const struct mge_graph *g, const struct mge_node *n)
{
    const struct mge_value *o = n->out[0] >= 0 ? &g->values[n->out[0]] : NULL;
    double out = 1.0;
    if (o)
        for (int i = 0; i < o->ndim; i++)
            out *= (double)o->shape[i];
    switch (n->op) {
    case MGE_OP_MATMUL: {
        const struct mge_value *a = &g->values[n->in[0]];
        double k = n->a.mm.ta ? (double)a->shape[0] : (double)a->shape[a->ndim - 1];
        if (n->a.mm.ta)
            for (int i = 1; i < a->ndim - 1; i++)
                k *= (double)a->shape[i];
        return 2.0 * out * k;
    }
    case MGE_OP_LINEAR: {
        const struct mge_value *w = &g->values[n->in[1]];
        return 2.0 * out * (double)w->shape[1] + out;
    }
    case MGE_OP_CONV2D:
    case MGE_OP_CONV2D_GRAD: {
        const struct mge_value *w = &g->values[n->in[n->op == MGE_OP_CONV2D ? 1 : 2]];
        const struct mge_value *y = &g->values[n->op == MGE_OP_CONV2D ? n->out[0] : n->in[0]];
        double per = 2.0 * (double)w->shape[1] * (double)w->shape[2] * (double)w->shape[3];
        double outs = 1.0;
        for (int i = 0; i < y->ndim; i++)
            outs *= (double)y->shape[i];
        int parts = n->op == MGE_OP_CONV2D ? 1 : (n->out[0] >= 0) + (n->out[1] >= 0);
        return per * outs * (parts ? parts : 1);
    }
    case MGE_OP_ATTENTION:
    case MGE_OP_ATTENTION_GRAD: {
        /* causal: half of q k^T and of p v, 2 FLOPs a multiply-add; backward recomputes p
         * and forms dv, dp, dq and dk (5 half-size GEMMs against forward's 2) */
        const struct mge_value *y = &g->values[n->op == MGE_OP_ATTENTION ? n->out[0] : n->in[2]];
        double T = (double)y->shape[1], rows = (double)y->shape[0] * T, C = (double)y->shape[2];
        return rows * T * C * (n->op == MGE_OP_ATTENTION ? 2.0 : 5.0);
    }
    default:
        return out;
    }
}

/* Ops cheap enough that light mode recomputes them (a pass over memory, no GEMM). */
static int op_is_cheap(enum mge_op op)
{
    switch (op) {
    case MGE_OP_BIAS_ACT:
    case MGE_OP_BINARY:
    case MGE_OP_UNARY:
    case MGE_OP_SOFTMAX:
    case MGE_OP_LOG_SOFTMAX:
    case MGE_OP_POOL:
    case MGE_OP_DROPOUT:
    case MGE_OP_LAYERNORM:
    case MGE_OP_BATCHNORM:
    case MGE_OP_PERMUTE:
        return 1;
    default:
        return 0;
    }
}

int mge__graph_clone(const struct mge_graph *g, struct mge_graph **out)
{
    struct mge_graph *c = mge_calloc(1, sizeof(*c));
    if (!c)
        return MGE_ERR(MGE_NOMEM, "cannot clone graph");
    *c = *g;
    c->values = mge_malloc(sizeof(*c->values) * (size_t)(g->cap_values ? g->cap_values : 1));
    c->nodes = mge_malloc(sizeof(*c->nodes) * (size_t)(g->cap_nodes ? g->cap_nodes : 1));
    c->params = mge_malloc(sizeof(int) * (size_t)(g->cap_params ? g->cap_params : 1));
    c->grads = g->grads ? mge_malloc(sizeof(int) * (size_t)(g->n_params ? g->n_params : 1)) : NULL;
    c->param_arena = c->grad_arena = NULL;
    c->act_arena = c->input_arena = NULL;
    c->stage_host[0] = c->stage_host[1] = NULL;
    c->slot = c->staged = 0;
    c->profile = NULL;
    c->quant = NULL; /* the original owns it */
    c->grad_ready = NULL;
    c->eager = NULL; /* the IR only: eager state stays with @g */
    c->allocated = 0;
    if (!c->values || !c->nodes || !c->params || (g->grads && !c->grads)) {
        mge_graph_free(c);
        return MGE_ERR(MGE_NOMEM, "cannot clone graph");
    }
    memcpy(c->values, g->values, sizeof(*c->values) * (size_t)g->n_values);
    memcpy(c->nodes, g->nodes, sizeof(*c->nodes) * (size_t)g->n_nodes);
    memcpy(c->params, g->params, sizeof(int) * (size_t)g->n_params);
    if (g->grads)
        memcpy(c->grads, g->grads, sizeof(int) * (size_t)g->n_params);
    *out = c;
    return MGE_OK;
}

/* ---- the rewrite ---- */

struct remat {
    struct mge_graph *g;
    const char *keep;     /* per original value: 1 = backward may read it as it is */
    int n_orig;           /* values before the rewrite */
    int *clone;           /* per original value: its recomputed clone, or -1 */
    struct mge_node *out; /* the new node list */
    int n_out, cap_out;
    double flops;     /* recomputed FLOPs */
    int n_recomputed; /* recompute ops emitted */
};

static int is_forward_act(const struct remat *r, int v)
{
    const struct mge_value *x = &r->g->values[v];
    return v < r->n_orig && x->kind == MGE_VALUE_ACT && x->producer >= 0 &&
           x->producer < r->g->n_forward;
}

static int remat_push(struct remat *r, const struct mge_node *n)
{
    if (r->n_out == r->cap_out) {
        int cap = r->cap_out ? r->cap_out * 2 : 256;
        struct mge_node *p = mge_realloc(r->out, sizeof(*p) * (size_t)cap);
        if (!p)
            return MGE_NOMEM;
        r->out = p;
        r->cap_out = cap;
    }
    r->out[r->n_out++] = *n;
    return MGE_OK;
}

static int remat_value(struct remat *r, int v);

/* Recompute original value @root (not an alias) and return its clone. */
static int remat_recompute(struct remat *r, int root)
{
    struct mge_graph *g = r->g;
    struct mge_node n = g->nodes[g->values[root].producer];
    for (int i = 0; i < n.n_in; i++) {
        if (n.in[i] < 0)
            continue;
        int v = remat_value(r, n.in[i]);
        if (v < 0)
            return v;
        n.in[i] = v;
    }
    for (int i = 0; i < n.n_out; i++) {
        int o = n.out[i];
        if (o < 0)
            continue;
        const struct mge_value x = g->values[o];
        int c = mge__graph_add_value(g, MGE_VALUE_ACT, x.dtype, x.ndim, x.shape, x.batched,
                                     "recompute");
        if (c < 0)
            return c;
        g->values[c].producer = -2; /* made by a recompute op, not a forward op */
        r->clone[o] = c;
        n.out[i] = c;
    }
    n.backward = 1;
    r->flops += mge__node_flops(g, &n);
    r->n_recomputed++;
    if (remat_push(r, &n) != MGE_OK)
        return -MGE_NOMEM;
    return r->clone[root];
}

/* The value backward should read in place of @v: @v itself if kept, else its clone. */
static int remat_value(struct remat *r, int v)
{
    struct mge_graph *g = r->g;
    if (v >= r->n_orig)
        return v;
    int root = mge__value_root(g, v);
    if (!is_forward_act(r, root) || r->keep[root])
        return v;
    int c = r->clone[root] >= 0 ? r->clone[root] : remat_recompute(r, root);
    if (c < 0 || v == root)
        return c;
    /* a view (reshape) of a recomputed value: a view of the clone */
    if (r->clone[v] >= 0)
        return r->clone[v];
    const struct mge_value x = g->values[v];
    int a = mge__graph_add_value(g, MGE_VALUE_ACT, x.dtype, x.ndim, x.shape, x.batched,
                                 "recompute_view");
    if (a < 0)
        return a;
    g->values[a].alias = c;
    r->clone[v] = a;
    return a;
}

/*
 * Rewrite @g so that backward reads only values with keep[v] set (or recomputes them).
 * @keep has one entry per value of @g. Returns MGE_OK; the recomputed FLOPs and op count in
 * *@flops and *@ops.
 */
static int remat_apply(struct mge_graph *g, const char *keep, double *flops, int *ops)
{
    struct remat r = {.g = g, .keep = keep, .n_orig = g->n_values};
    int rc = MGE_OK;
    r.clone = mge_malloc(sizeof(int) * (size_t)(g->n_values ? g->n_values : 1));
    if (!r.clone)
        return MGE_ERR(MGE_NOMEM, "cannot allocate rewrite");
    for (int v = 0; v < g->n_values; v++)
        r.clone[v] = -1;
    int n_nodes = g->n_nodes;
    for (int ni = 0; ni < n_nodes && rc == MGE_OK; ni++) {
        struct mge_node n = g->nodes[ni];
        if (ni >= g->n_forward) {
            for (int i = 0; i < n.n_in && rc == MGE_OK; i++) {
                if (n.in[i] < 0)
                    continue;
                int v = remat_value(&r, n.in[i]);
                if (v < 0)
                    rc = -v;
                else
                    n.in[i] = v;
            }
        }
        if (rc == MGE_OK)
            rc = remat_push(&r, &n);
    }
    if (rc == MGE_OK) {
        /* the node array is replaced whole: producers point into the new list */
        mge_free(g->nodes);
        g->nodes = r.out;
        g->n_nodes = r.n_out;
        g->cap_nodes = r.cap_out;
        r.out = NULL;
        for (int ni = 0; ni < g->n_nodes; ni++)
            for (int i = 0; i < g->nodes[ni].n_out; i++)
                if (g->nodes[ni].out[i] >= 0 && ni >= g->n_forward)
                    if (g->values[g->nodes[ni].out[i]].producer == -2)
                        g->values[g->nodes[ni].out[i]].producer = ni;
        *flops = r.flops;
        *ops = r.n_recomputed;
    } else if (rc == MGE_NOMEM) {
        rc = MGE_ERR(MGE_NOMEM, "cannot rewrite graph for recomputation");
    }
    mge_free(r.out);
    mge_free(r.clone);
    return rc;
}

/* ---- choosing what to keep ---- */

struct remat_ctx {
    const struct mge_graph *g;
    char *needed;    /* per value: a forward activation that backward reads */
    char *must_keep; /* per value: cannot be recomputed (multi-producer, kept outputs) */
    size_t *bytes;   /* per forward node: bytes of its needed outputs */
    size_t total;    /* sum of bytes[] */
    char *cut;       /* per forward node: the rest of the forward pass reads only its outputs */
    int all_cuts;    /* every node with needed outputs is a cut point (a chain) */
    size_t *kept;    /* per forward node: bytes of all its outputs (what keeping it costs) */
};

/*
 * Cut points: forward node p is one when no activation made before p is read after it, so the
 * forward pass from p on can be redone from p's outputs alone (values kept anyway aside). In a
 * chain every node is one; in residual networks only the block boundaries (the add that ends
 * a block, in a GPT also the one between attention and MLP) are: a checkpoint elsewhere would
 * also need the residual stream that runs beside it to recompute the next segment.
 */
static int ctx_find_cuts(struct remat_ctx *c)
{
    const struct mge_graph *g = c->g;
    int *last = mge_malloc(sizeof(int) * (size_t)(g->n_values + 1));
    int *crossing = mge_calloc((size_t)g->n_forward + 1, sizeof(int));
    int *own = mge_calloc((size_t)g->n_forward + 1, sizeof(int));
    int rc = MGE_OK;
    if (!last || !crossing || !own) {
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate recompute search");
        goto out_free;
    }
    for (int v = 0; v < g->n_values; v++)
        last[v] = -1;
    for (int ni = 0; ni < g->n_forward; ni++)
        for (int i = 0; i < g->nodes[ni].n_in; i++)
            if (g->nodes[ni].in[i] >= 0)
                last[mge__value_root(g, g->nodes[ni].in[i])] = ni;
    /* crossing[p]: values made at or before p and read after it; own[p]: of those, p's */
    for (int v = 0; v < g->n_values; v++) {
        const struct mge_value *x = &g->values[v];
        if (x->kind != MGE_VALUE_ACT || x->alias >= 0 || x->producer < 0 ||
            x->producer >= g->n_forward || c->must_keep[v] || last[v] <= x->producer)
            continue;
        crossing[x->producer]++;
        crossing[last[v]]--;
        own[x->producer]++;
    }
    c->all_cuts = 1;
    for (int ni = 0, run = 0; ni < g->n_forward; ni++) {
        run += crossing[ni];
        c->cut[ni] = run == own[ni];
        if (c->bytes[ni] > 0 && !c->cut[ni])
            c->all_cuts = 0;
        for (int i = 0; i < g->nodes[ni].n_out; i++)
            if (g->nodes[ni].out[i] >= 0)
                c->kept[ni] += mge__value_bytes(g, g->nodes[ni].out[i]);
    }
out_free:
    mge_free(last);
    mge_free(crossing);
    mge_free(own);
    return rc;
}

static int ctx_init(struct remat_ctx *c, const struct mge_graph *g)
{
    memset(c, 0, sizeof(*c));
    c->g = g;
    c->needed = mge_calloc((size_t)g->n_values + 1, 1);
    c->must_keep = mge_calloc((size_t)g->n_values + 1, 1);
    c->bytes = mge_calloc((size_t)g->n_forward + 1, sizeof(size_t));
    c->cut = mge_calloc((size_t)g->n_forward + 1, 1);
    c->kept = mge_calloc((size_t)g->n_forward + 1, sizeof(size_t));
    int *producers = mge_calloc((size_t)g->n_values + 1, sizeof(int));
    if (!c->needed || !c->must_keep || !c->bytes || !c->cut || !c->kept || !producers) {
        mge_free(producers);
        return MGE_ERR(MGE_NOMEM, "cannot allocate recompute search");
    }
    for (int ni = 0; ni < g->n_forward; ni++)
        for (int i = 0; i < g->nodes[ni].n_out; i++)
            if (g->nodes[ni].out[i] >= 0)
                producers[g->nodes[ni].out[i]]++;
    for (int ni = g->n_forward; ni < g->n_nodes; ni++)
        for (int i = 0; i < g->nodes[ni].n_in; i++) {
            int v = g->nodes[ni].in[i];
            if (v < 0)
                continue;
            v = mge__value_root(g, v);
            const struct mge_value *x = &g->values[v];
            if (x->kind == MGE_VALUE_ACT && x->producer >= 0 && x->producer < g->n_forward)
                c->needed[v] = 1;
        }
    for (int v = 0; v < g->n_values; v++)
        if (producers[v] > 1 || g->values[v].keep)
            c->must_keep[v] = 1;
    mge_free(producers);
    for (int ni = 0; ni < g->n_forward; ni++) {
        for (int i = 0; i < g->nodes[ni].n_out; i++) {
            int o = g->nodes[ni].out[i];
            if (o >= 0 && c->needed[o])
                c->bytes[ni] += mge__value_bytes(g, o);
        }
        c->total += c->bytes[ni];
    }
    return ctx_find_cuts(c);
}

static void ctx_fini(struct remat_ctx *c)
{
    mge_free(c->needed);
    mge_free(c->must_keep);
    mge_free(c->bytes);
    mge_free(c->cut);
    mge_free(c->kept);
}

static void keep_outputs(const struct mge_graph *g, int ni, char *keep)
{
    for (int i = 0; i < g->nodes[ni].n_out; i++)
        if (g->nodes[ni].out[i] >= 0)
            keep[g->nodes[ni].out[i]] = 1;
}

/* Chen's greedy segmentation: a checkpoint whenever the running bytes pass @threshold. */
static void keep_threshold(const struct remat_ctx *c, size_t threshold, char *keep)
{
    const struct mge_graph *g = c->g;
    size_t run = 0, tail = 0;
    memcpy(keep, c->must_keep, (size_t)g->n_values);
    for (int ni = 0; ni < g->n_forward; ni++) {
        run += c->bytes[ni];
        /* the last segment is read by backward at once: keeping it costs nothing extra */
        int in_tail = c->total - tail <= threshold;
        tail += c->bytes[ni];
        if (run >= threshold || in_tail) {
            keep_outputs(g, ni, keep);
            if (run >= threshold)
                run = 0;
        }
    }
}

/*
 * Budget segmentation: backward recomputes a segment while the checkpoints before it are
 * still alive, so each segment gets what @budget leaves beside them and segments shrink along
 * the forward pass; what fits beside all checkpoints at the end is kept as it is (backward
 * reads it first). On a chain of n equal layers the peak is about sqrt(2n) activations where
 * equal segments need 2 sqrt(n), and every activation is recomputed at most once.
 */
static void keep_budget(const struct remat_ctx *c, size_t budget, char *keep)
{
    const struct mge_graph *g = c->g;
    size_t ckpt = 0, run = 0, rest = c->total;
    int last = -1; /* the open segment's last node with needed outputs */
    memcpy(keep, c->must_keep, (size_t)g->n_values);
    for (int ni = 0; ni < g->n_forward; ni++) {
        if (c->bytes[ni] == 0)
            continue;
        /* a segment ends with a checkpoint: @ni would not fit beside it (nor as its end) */
        if (last >= 0 && ckpt + run + c->bytes[ni] > budget) {
            keep_outputs(g, last, keep);
            ckpt += c->bytes[last];
            run = 0;
        }
        if (ckpt + rest <= budget) {
            for (; ni < g->n_forward; ni++)
                keep_outputs(g, ni, keep);
            break;
        }
        run += c->bytes[ni];
        rest -= c->bytes[ni];
        last = ni;
    }
}

/*
 * Budget segmentation on cut points only: a segment ends at the last cut point before it would
 * pass @budget, and what is kept there is that node's outputs whole. On residual networks this
 * keeps the residual stream at block boundaries and recomputes each block from it, where
 * keep_budget() would end segments inside blocks and need the stream beside each checkpoint.
 */
static void keep_cuts(const struct remat_ctx *c, size_t budget, char *keep)
{
    const struct mge_graph *g = c->g;
    size_t ckpt = 0, run = 0, since = 0, rest = c->total;
    int cut = -1; /* the open segment's last cut point */
    memcpy(keep, c->must_keep, (size_t)g->n_values);
    for (int ni = 0; ni < g->n_forward; ni++) {
        if (c->bytes[ni] == 0 && !c->cut[ni])
            continue;
        if (cut >= 0 && ckpt + run + c->bytes[ni] > budget) {
            keep_outputs(g, cut, keep);
            ckpt += c->kept[cut];
            run = since;
            cut = -1;
        }
        if (ckpt + rest <= budget) {
            for (; ni < g->n_forward; ni++)
                keep_outputs(g, ni, keep);
            break;
        }
        run += c->bytes[ni];
        since += c->bytes[ni];
        rest -= c->bytes[ni];
        if (c->cut[ni]) {
            cut = ni;
            since = 0;
        }
    }
}

static void keep_light(const struct remat_ctx *c, char *keep)
{
    const struct mge_graph *g = c->g;
    memcpy(keep, c->must_keep, (size_t)g->n_values);
    for (int ni = 0; ni < g->n_forward; ni++) {
        const struct mge_node *n = &g->nodes[ni];
        int cheap = op_is_cheap(n->op);
        /* a cheap op whose inputs are all kept as they are can be redone from them */
        for (int i = 0; i < n->n_in && cheap; i++) {
            int v = n->in[i];
            if (v < 0)
                continue;
            v = mge__value_root(g, v);
            const struct mge_value *x = &g->values[v];
            if (x->kind == MGE_VALUE_ACT && x->producer >= 0 && x->producer < g->n_forward &&
                g->nodes[x->producer].op != MGE_OP_LINEAR && op_is_cheap(g->nodes[x->producer].op))
                cheap = 0; /* chains of cheap ops: keep every other one */
        }
        for (int i = 0; i < n->n_out; i++)
            if (n->out[i] >= 0 && !cheap)
                keep[n->out[i]] = 1;
    }
}

/* Score the keep set: clone, rewrite, plan. */
static int remat_try(const struct mge_graph *g, const char *keep, struct mge_remat_plan *p)
{
    struct mge_graph *c = NULL;
    struct mge_plan_stats st;
    int rc = mge__graph_clone(g, &c);
    if (rc != MGE_OK)
        return rc;
    if ((rc = remat_apply(c, keep, &p->recompute_flops, &p->recompute_ops)) == MGE_OK &&
        (rc = mge_graph_plan(c, &st)) == MGE_OK) {
        p->activation_bytes = st.activation_bytes;
        p->lower_bound_bytes = st.lower_bound_bytes;
    }
    mge_graph_free(c);
    return rc;
}

double mge_graph_flops(const struct mge_graph *g)
{
    double f = 0.0;
    for (int ni = 0; ni < g->n_nodes; ni++)
        f += mge__node_flops(g, &g->nodes[ni]);
    return f;
}

/* ---- the search ---- */

/*
 * The default trade (MGE__SUBLINEAR_SLACK): on a chain each activation kept beyond the
 * smallest arena saves about one recomputed layer, so no plan is best, only a choice of how
 * much memory to give back. sqrt(2) times the budget segmentation's sqrt(2n) minimum is about
 * the 2 sqrt(n) of Chen's equal segments, and within it the least recomputation wins.
 */

enum keep_family { KEEP_ALL, KEEP_LIGHT, KEEP_THRESHOLD, KEEP_BUDGET, KEEP_CUTS };

struct cand {
    enum keep_family fam;
    size_t param; /* THRESHOLD, BUDGET: bytes */
    struct mge_remat_plan p;
};

struct search {
    const struct mge_graph *g;
    struct remat_ctx ctx;
    char *keep;     /* scratch keep set */
    struct cand *c; /* every plan scored */
    int n;
    size_t cap;
};

static void cand_keep(const struct search *s, enum keep_family fam, size_t param, char *keep)
{
    switch (fam) {
    case KEEP_ALL:
        memset(keep, 1, (size_t)s->g->n_values);
        break;
    case KEEP_LIGHT:
        keep_light(&s->ctx, keep);
        break;
    case KEEP_THRESHOLD:
        keep_threshold(&s->ctx, param, keep);
        break;
    case KEEP_BUDGET:
        keep_budget(&s->ctx, param, keep);
        break;
    case KEEP_CUTS:
        keep_cuts(&s->ctx, param, keep);
        break;
    }
}

/* Score one plan and record it; its index in *@at. */
static int search_try(struct search *s, enum keep_family fam, size_t param, int *at)
{
    static const enum mge_remat modes[] = {MGE_REMAT_NONE, MGE_REMAT_LIGHT, MGE_REMAT_SUBLINEAR,
                                           MGE_REMAT_SUBLINEAR, MGE_REMAT_SUBLINEAR};
    if (mge_array_grow((void **)&s->c, &s->cap, (size_t)s->n + 1, sizeof(*s->c)) != MGE_OK)
        return MGE_ERR(MGE_NOMEM, "cannot allocate recompute search");
    struct cand *c = &s->c[s->n];
    memset(c, 0, sizeof(*c));
    c->fam = fam;
    c->param = param;
    cand_keep(s, fam, param, s->keep);
    int rc = remat_try(s->g, s->keep, &c->p);
    if (rc != MGE_OK)
        return rc;
    c->p.mode = modes[fam];
    if (at)
        *at = s->n;
    s->n++;
    return MGE_OK;
}

/* Is plan @a better than @b when it fits in @limit (ties: less recomputation, then bytes)? */
static int fits_better(const struct mge_remat_plan *a, const struct mge_remat_plan *b, size_t limit)
{
    int af = a->activation_bytes <= limit, bf = b->activation_bytes <= limit;
    if (af != bf)
        return af;
    if (!af)
        return a->activation_bytes < b->activation_bytes;
    return a->recompute_flops < b->recompute_flops ||
           (a->recompute_flops == b->recompute_flops && a->activation_bytes < b->activation_bytes);
}

static int smallest(const struct search *s)
{
    int best = 0;
    for (int i = 1; i < s->n; i++) {
        const struct mge_remat_plan *a = &s->c[i].p, *b = &s->c[best].p;
        if (a->activation_bytes < b->activation_bytes ||
            (a->activation_bytes == b->activation_bytes && a->recompute_flops < b->recompute_flops))
            best = i;
    }
    return best;
}

/*
 * MGE_REMAT_FORCE=1 (tests): the plan that recomputes the most, whatever it saves, so that
 * bit-identity checks exercise recomputation even on models where it does not pay.
 */
static int most_recompute(const struct search *s)
{
    int best = 0;
    for (int i = 1; i < s->n; i++)
        if (s->c[i].p.recompute_ops > s->c[best].p.recompute_ops)
            best = i;
    return best;
}

static int best_within(const struct search *s, size_t limit)
{
    int best = 0;
    for (int i = 1; i < s->n; i++)
        if (fits_better(&s->c[i].p, &s->c[best].p, limit))
            best = i;
    return best;
}

/*
 * Sublinear without a budget: the least recomputation within MGE__SUBLINEAR_SLACK of the smallest
 * arena, where recomputation under MGE__SUBLINEAR_FREE of the step's @flops counts as none (the
 * smaller arena wins), so a graph that saves little by recomputing still saves it for free.
 */
static int best_slack(const struct search *s, double flops)
{
    size_t limit = (size_t)((double)s->c[smallest(s)].p.activation_bytes * MGE__SUBLINEAR_SLACK);
    int best = best_within(s, limit);
    double most = s->c[best].p.recompute_flops + MGE__SUBLINEAR_FREE * flops;
    for (int i = 0; i < s->n; i++) {
        const struct mge_remat_plan *a = &s->c[i].p, *b = &s->c[best].p;
        if (a->activation_bytes <= limit && a->recompute_flops <= most &&
            (a->activation_bytes < b->activation_bytes ||
             (a->activation_bytes == b->activation_bytes &&
              a->recompute_flops < b->recompute_flops)))
            best = i;
    }
    return best;
}

/* The largest @fam parameter tried below @below (0 if none). */
static size_t budget_below(const struct search *s, enum keep_family fam, size_t below)
{
    size_t p = 0;
    for (int i = 0; i < s->n; i++)
        if (s->c[i].fam == fam && s->c[i].param < below && s->c[i].param > p)
            p = s->c[i].param;
    return p;
}

/* The plan of family @fam with the smallest arena (ties: less recomputation), or -1. */
static int smallest_of(const struct search *s, enum keep_family fam)
{
    int best = -1;
    for (int i = 0; i < s->n; i++) {
        if (s->c[i].fam != fam)
            continue;
        const struct mge_remat_plan *a = &s->c[i].p;
        if (best < 0 || a->activation_bytes < s->c[best].p.activation_bytes ||
            (a->activation_bytes == s->c[best].p.activation_bytes &&
             a->recompute_flops < s->c[best].p.recompute_flops))
            best = i;
    }
    return best;
}

/*
 * Budget segmentations (@fam: KEEP_BUDGET or KEEP_CUTS) from coarse to fine. Above the smallest
 * feasible parameter the arena grows with it; below, segments get too short and checkpoints
 * pile up, so the arena jumps. A geometric sweep brackets both ends of interest and bisection
 * narrows them: search_sweep() the smallest arena, search_limit() the largest parameter whose
 * arena fits @limit. Every plan tried stays a candidate, so where the arena is not monotone in
 * the parameter the search loses precision, not plans.
 */
static int search_sweep(struct search *s, enum keep_family fam)
{
    int rc, at, rising = 0;
    size_t bottom = s->ctx.total / 4096 + 1, prev = (size_t)-1, lo, hi, a;
    /* down until the arena has grown three times running: past the smallest feasible */
    for (size_t b = s->ctx.total; b >= bottom && rising < 3; b = b / 5 * 4) {
        if ((rc = search_try(s, fam, b, &at)) != MGE_OK)
            return rc;
        rising = s->c[at].p.activation_bytes > prev ? rising + 1 : 0;
        prev = s->c[at].p.activation_bytes;
    }
    if ((at = smallest_of(s, fam)) < 0)
        return MGE_OK;
    hi = s->c[at].param;
    lo = budget_below(s, fam, hi);
    a = s->c[at].p.activation_bytes;
    for (int it = 0; it < 12 && hi - lo >= hi / 256 + 1; it++) {
        size_t mid = lo + (hi - lo) / 2;
        if ((rc = search_try(s, fam, mid, &at)) != MGE_OK)
            return rc;
        if (s->c[at].p.activation_bytes <= a) {
            a = s->c[at].p.activation_bytes;
            hi = mid;
        } else {
            lo = mid;
        }
    }
    return MGE_OK;
}

/* @limit 0: MGE__SUBLINEAR_SLACK times the smallest arena of all plans. */
static int search_limit(struct search *s, enum keep_family fam, size_t limit)
{
    int rc, at;
    size_t lo = 0, hi = (size_t)-1;
    if (limit == 0)
        limit = (size_t)((double)s->c[smallest(s)].p.activation_bytes * MGE__SUBLINEAR_SLACK);
    for (int i = 0; i < s->n; i++)
        if (s->c[i].fam == fam && s->c[i].p.activation_bytes <= limit && s->c[i].param > lo)
            lo = s->c[i].param;
    for (int i = 0; i < s->n; i++)
        if (s->c[i].fam == fam && s->c[i].param > lo && s->c[i].param < hi)
            hi = s->c[i].param;
    if (lo == 0 || hi == (size_t)-1)
        return MGE_OK;
    for (int it = 0; it < 12 && hi - lo >= hi / 256 + 1; it++) {
        size_t mid = lo + (hi - lo) / 2;
        if ((rc = search_try(s, fam, mid, &at)) != MGE_OK)
            return rc;
        if (s->c[at].p.activation_bytes <= limit)
            lo = mid;
        else
            hi = mid;
    }
    return MGE_OK;
}

int mge_graph_sublinear(struct mge_graph *g, enum mge_remat mode, size_t budget,
                        struct mge_remat_plan *chosen, struct mge_remat_plan *plain)
{
    struct search s;
    int rc, best = 0;

    memset(&s, 0, sizeof(s));
    s.g = g;
    if (g->err)
        return g->err;
    if (g->loss < 0 || g->planned)
        return MGE_ERR(MGE_STATE, "sublinear: needs a differentiated, unplanned graph");
    if ((rc = ctx_init(&s.ctx, g)) != MGE_OK)
        goto out;
    s.keep = mge_malloc((size_t)g->n_values + 1);
    if (!s.keep) {
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate recompute search");
        goto out;
    }
    /* the plain plan: everything kept */
    if ((rc = search_try(&s, KEEP_ALL, 0, NULL)) != MGE_OK)
        goto out;
    if (plain)
        *plain = s.c[0].p;
    /* auto without a budget, or a plain plan that fits the budget: nothing to gain */
    int search = mode == MGE_REMAT_LIGHT || mode == MGE_REMAT_SUBLINEAR ||
                 (mode == MGE_REMAT_AUTO && budget > 0 && s.c[0].p.activation_bytes > budget);
    if (search && (rc = search_try(&s, KEEP_LIGHT, 0, NULL)) != MGE_OK)
        goto out;
    if (search && mode != MGE_REMAT_LIGHT) {
        for (int k = 2; k <= 1024; k = k < 16 ? k + 1 : k + k / 4) {
            size_t thr = s.ctx.total / (size_t)k;
            if (thr == 0)
                break;
            if ((rc = search_try(&s, KEEP_THRESHOLD, thr, NULL)) != MGE_OK)
                goto out;
        }
        /* on a chain both segmentations are one: search it once */
        int cuts = !s.ctx.all_cuts;
        if ((rc = search_sweep(&s, KEEP_BUDGET)) != MGE_OK ||
            (cuts && (rc = search_sweep(&s, KEEP_CUTS)) != MGE_OK) ||
            (rc = search_limit(&s, KEEP_BUDGET, budget)) != MGE_OK ||
            (cuts && (rc = search_limit(&s, KEEP_CUTS, budget)) != MGE_OK))
            goto out;
    }
    if (search && getenv("MGE_REMAT_FORCE") && !strcmp(getenv("MGE_REMAT_FORCE"), "1"))
        best = most_recompute(&s);
    else if (budget > 0)
        best = best_within(&s, budget);
    else if (search && mode != MGE_REMAT_LIGHT)
        best = best_slack(&s, mge_graph_flops(g));
    else if (search)
        best = smallest(&s);
    if (chosen)
        *chosen = s.c[best].p;
    if (budget > 0 && s.c[best].p.activation_bytes > budget) {
        rc = MGE_BUDGET;
        snprintf(g->errmsg, sizeof(g->errmsg),
                 "activations need at least %zu bytes (%.1f MiB)%s; the budget leaves %zu bytes "
                 "(%.1f MiB) for them",
                 s.c[best].p.activation_bytes, (double)s.c[best].p.activation_bytes / 1048576.0,
                 mode == MGE_REMAT_NONE ? " without recomputation" : " with recomputation", budget,
                 (double)budget / 1048576.0);
        goto out;
    }
    if (s.c[best].fam != KEEP_ALL) {
        double f;
        int ops;
        cand_keep(&s, s.c[best].fam, s.c[best].param, s.keep);
        if ((rc = remat_apply(g, s.keep, &f, &ops)) != MGE_OK)
            goto out;
    }
    rc = MGE_OK;
out:
    ctx_fini(&s.ctx);
    mge_free(s.keep);
    mge_free(s.c);
    return rc;
}
