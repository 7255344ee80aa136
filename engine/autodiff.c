/*
 * autodiff.c: reverse-mode autodiff. Walks the forward ops backwards and appends each op's
 * vector-Jacobian product as ops of the same graph, so the planner and executor treat forward
 * and backward alike (and the sublinear pass can rewrite both).
 *
 * Fan-out: the first contribution to a value's gradient overwrites its buffer, later ones
 * accumulate into it (every backward kernel has an accumulate flag), so no add ops are needed.
 * A gradient that flows unchanged to two values (both inputs of a residual add) is shared, not
 * copied: the second value borrows the buffer read-only, and the first later contribution to
 * it accumulates in place once nobody else can still read that buffer (ad_dst).
 */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "engine/engine_int.h"
#include "kernels/cpu/cpu.h"

struct ad {
    struct mge_graph *g;
    int *grad;      /* per value: its gradient value, or -1 */
    char *owned;    /* per gradient value: 1 if no other gradient shares its storage */
    char *borrowed; /* per gradient value: a read-only view of a buffer other gradients share */
    int cur;        /* the forward node whose gradient is being emitted */
};

static int ad_new_grad(struct ad *ad, int v)
{
    struct mge_graph *g = ad->g;
    const struct mge_value x = g->values[v]; /* a copy: adding a value may move the array */
    char name[64];
    enum mge_value_kind kind = x.kind == MGE_VALUE_PARAM ? MGE_VALUE_GRAD : MGE_VALUE_ACT;
    snprintf(name, sizeof(name), "d%.60s", x.name);
    int d = mge__graph_add_value(g, kind, MGE_DTYPE_F32, x.ndim, x.shape, x.batched, name);
    if (d < 0)
        return d;
    if (kind == MGE_VALUE_GRAD) {
        g->values[d].param_index = x.param_index;
        g->grads[x.param_index] = d;
    }
    return d;
}

/* A view of gradient @d with the shape of @v (for reshape aliases). */
static int ad_view(struct ad *ad, int d, int v)
{
    struct mge_graph *g = ad->g;
    const struct mge_value *x = &g->values[v];
    if (g->values[d].ndim == x->ndim &&
        !memcmp(g->values[d].shape, x->shape, sizeof(int64_t) * (size_t)x->ndim))
        return d;
    char name[64];
    snprintf(name, sizeof(name), "d%.60s", x->name);
    int a = mge__graph_add_value(g, MGE_VALUE_ACT, MGE_DTYPE_F32, x->ndim, x->shape, x->batched,
                                 name);
    if (a < 0)
        return a;
    g->values[a].alias = d;
    return a;
}

static int ad_node(struct ad *ad, struct mge_node *n)
{
    n->backward = 1;
    int id = mge__graph_add_node(ad->g, n);
    return id < 0 ? id : MGE_OK;
}

/* dst (+)= src over the whole tensor (same element count). */
static int ad_add_into(struct ad *ad, int dst, int src, int acc)
{
    struct mge_node n = {.op = MGE_OP_COPY_AXIS, .in = {src}, .n_in = 1, .out = {dst}, .n_out = 1,
                         .acc = acc};
    n.a.copy.axis = -1; /* whole tensor */
    return ad_node(ad, &n);
}

/*
 * The borrowed gradient of @root is about to be added to: write in place when every other
 * value whose gradient lives in that buffer is produced after the current node (its gradient
 * is complete and every node reading it comes earlier, as nodes run in order), else copy it
 * into a buffer of its own first. Returns the gradient value to add to, or -err.
 */
static int ad_unborrow(struct ad *ad, int root)
{
    struct mge_graph *g = ad->g;
    int d = ad->grad[root], r = mge__value_root(g, d), safe = 1;
    for (int w = 0; w < g->n_values && safe; w++)
        if (w != root && ad->grad[w] >= 0 && mge__value_root(g, ad->grad[w]) == r &&
            g->values[w].producer <= ad->cur)
            safe = 0;
    ad->borrowed[d] = 0;
    if (safe)
        return d;
    int c = ad_new_grad(ad, root);
    if (c < 0)
        return c;
    ad->owned[c] = 1;
    ad->grad[root] = c;
    int rc = ad_add_into(ad, c, d, 0);
    return rc < 0 ? rc : c;
}

/*
 * Where the next contribution to the gradient of @v goes: *dst, and *acc = 1 when it must
 * add to what is there. Returns MGE_OK, or -err.
 */
static int ad_dst(struct ad *ad, int v, int *dst, int *acc)
{
    struct mge_graph *g = ad->g;
    int root = v, d;
    if (g->values[v].alias >= 0)
        root = mge__value_root(g, v);
    if (ad->grad[root] >= 0) {
        *acc = 1;
        d = ad->grad[root];
        if (ad->borrowed[d] && (d = ad_unborrow(ad, root)) < 0)
            return d;
    } else {
        *acc = 0;
        d = ad_new_grad(ad, root);
        if (d < 0)
            return d;
        ad->grad[root] = d;
        ad->owned[d] = 1;
    }
    d = ad_view(ad, d, v);
    if (d < 0)
        return d;
    *dst = d;
    return MGE_OK;
}

/* A fresh temporary with the shape of @like. */
static int ad_temp(struct ad *ad, int like, const char *what)
{
    struct mge_graph *g = ad->g;
    const struct mge_value *x = &g->values[like];
    return mge__graph_add_value(g, MGE_VALUE_ACT, MGE_DTYPE_F32, x->ndim, x->shape, x->batched,
                                what);
}

/*
 * Contribute @src (a gradient with @v's shape, or broadcastable to it when @sum) to @v.
 * Without accumulation and sharing issues the gradient is passed through with no copy; a
 * gradient that was already passed through to another value is borrowed (ad_unborrow).
 */
static int ad_contribute(struct ad *ad, int v, int src, int sum)
{
    struct mge_graph *g = ad->g;
    if (!g->values[v].requires_grad)
        return MGE_OK;
    int root = mge__value_root(g, v);
    int same = g->values[src].ndim == g->values[v].ndim &&
               !memcmp(g->values[src].shape, g->values[v].shape,
                       sizeof(int64_t) * (size_t)g->values[v].ndim);
    int pass = ad->owned[src], shared = !pass && g->values[root].producer >= 0;
    if (same && ad->grad[root] < 0 && g->values[root].kind != MGE_VALUE_PARAM && (pass || shared)) {
        /* pass-through: v's gradient is src itself (viewed with v's root shape); src shared
         * already (passed through to another value): borrowed */
        int d = mge__graph_add_value(g, MGE_VALUE_ACT, MGE_DTYPE_F32, g->values[root].ndim,
                                     g->values[root].shape, g->values[root].batched,
                                     pass ? "dpass" : "dshared");
        if (d < 0)
            return d;
        g->values[d].alias = src;
        ad->grad[root] = d;
        ad->owned[src] = 0;
        if (shared) { /* every gradient in that buffer: none may add to it unchecked */
            int r = mge__value_root(g, src);
            for (int w = 0; w < g->n_values; w++)
                if (ad->grad[w] >= 0 && mge__value_root(g, ad->grad[w]) == r)
                    ad->borrowed[ad->grad[w]] = 1;
        }
        return MGE_OK;
    }
    int dst, acc, rc = ad_dst(ad, v, &dst, &acc);
    if (rc < 0)
        return rc;
    if (sum && !same) {
        struct mge_node n = {.op = MGE_OP_SUM_TO, .in = {src}, .n_in = 1, .out = {dst},
                             .n_out = 1, .acc = acc};
        return ad_node(ad, &n);
    }
    return ad_add_into(ad, dst, src, acc);
}

/* Emit @n (whose out[0] is the gradient of @v) accumulating as needed. */
static int ad_emit_grad(struct ad *ad, int v, struct mge_node *n, int can_acc)
{
    struct mge_graph *g = ad->g;
    if (!g->values[v].requires_grad)
        return MGE_OK;
    int dst, acc, rc = ad_dst(ad, v, &dst, &acc);
    if (rc < 0)
        return rc;
    if (!acc || can_acc) {
        n->out[0] = dst;
        n->acc = acc;
        return ad_node(ad, n);
    }
    int t = ad_temp(ad, v, "dtmp");
    if (t < 0)
        return t;
    n->out[0] = t;
    n->acc = 0;
    if ((rc = ad_node(ad, n)) < 0)
        return rc;
    return ad_add_into(ad, dst, t, 1);
}

static int ad_matmul(struct ad *ad, const struct mge_node *f, int dc)
{
    int a = f->in[0], b = f->in[1], ta = f->a.mm.ta, tb = f->a.mm.tb, rc;
    struct mge_node n = {.op = MGE_OP_MATMUL, .n_in = 2, .n_out = 1};
    /* da */
    if (!ta && !tb) { n.in[0] = dc; n.in[1] = b; n.a.mm.ta = 0; n.a.mm.tb = 1; }
    else if (!ta && tb) { n.in[0] = dc; n.in[1] = b; n.a.mm.ta = 0; n.a.mm.tb = 0; }
    else if (ta && !tb) { n.in[0] = b; n.in[1] = dc; n.a.mm.ta = 0; n.a.mm.tb = 1; }
    else { n.in[0] = b; n.in[1] = dc; n.a.mm.ta = 1; n.a.mm.tb = 1; }
    if ((rc = ad_emit_grad(ad, a, &n, 1)) < 0)
        return rc;
    /* db */
    if (!ta && !tb) { n.in[0] = a; n.in[1] = dc; n.a.mm.ta = 1; n.a.mm.tb = 0; }
    else if (!ta && tb) { n.in[0] = dc; n.in[1] = a; n.a.mm.ta = 1; n.a.mm.tb = 0; }
    else if (ta && !tb) { n.in[0] = a; n.in[1] = dc; n.a.mm.ta = 0; n.a.mm.tb = 0; }
    else { n.in[0] = dc; n.in[1] = a; n.a.mm.ta = 1; n.a.mm.tb = 1; }
    return ad_emit_grad(ad, b, &n, 1);
}

/*
 * The forward values an activation's gradient reads: GELU its input, the others their output.
 * Passing only that one lets the other die early (and be overwritten in place).
 */
static void ad_act_inputs(int act, int x, int y, struct mge_node *n)
{
    n->in[1] = act == MGE_ACT_FN_GELU ? x : -1;
    n->in[2] = act == MGE_ACT_FN_GELU ? -1 : y;
}

/* Gradient of act(pre) given dy: a new temporary, or dy itself when there is no activation. */
static int ad_act_grad(struct ad *ad, int act, int dy, int pre, int y)
{
    if (act == MGE_ACT_NONE)
        return dy;
    int t = ad_temp(ad, dy, "dpre");
    if (t < 0)
        return t;
    struct mge_node n = {.op = MGE_OP_UNARY_GRAD, .in = {dy, -1, -1}, .n_in = 3, .out = {t},
                         .n_out = 1};
    ad_act_inputs(act, pre, y, &n);
    n.a.act.act = act;
    int rc = ad_node(ad, &n);
    return rc < 0 ? rc : t;
}

static int ad_linear(struct ad *ad, const struct mge_node *f, int dy)
{
    int x = f->in[0], w = f->in[1], b = f->in[2], rc;
    int dpre = ad_act_grad(ad, f->a.act.act, dy, f->out[1], f->out[0]);
    if (dpre < 0)
        return dpre;
    struct mge_node n = {.op = MGE_OP_MATMUL, .n_in = 2, .n_out = 1};
    /* dW = dpre^T x first: the weight gradient is what communication waits for */
    n.in[0] = dpre; n.in[1] = x; n.a.mm.ta = 1; n.a.mm.tb = 0;
    if ((rc = ad_emit_grad(ad, w, &n, 1)) < 0)
        return rc;
    if (b >= 0) {
        struct mge_node nb = {.op = MGE_OP_BIAS_GRAD, .in = {dpre}, .n_in = 1, .n_out = 1};
        if ((rc = ad_emit_grad(ad, b, &nb, 1)) < 0)
            return rc;
    }
    n.in[0] = dpre; n.in[1] = w; n.a.mm.ta = 0; n.a.mm.tb = 0;
    return ad_emit_grad(ad, x, &n, 1);
}

static int ad_binary(struct ad *ad, const struct mge_node *f, int dc)
{
    struct mge_graph *g = ad->g;
    int a = f->in[0], b = f->in[1], c = f->out[0], op = f->a.bin.op, rc;
    struct mge_node n = {.op = MGE_OP_BINARY, .n_in = 2, .n_out = 1};
    int ta = -1, tb = -1;
    switch (op) {
    case MGE_CPU_ADD:
    case MGE_CPU_SUB:
        ta = dc;
        if (g->values[b].requires_grad) {
            tb = dc;
            if (op == MGE_CPU_SUB) {
                if ((tb = ad_temp(ad, c, "dneg")) < 0)
                    return tb;
                struct mge_node s = {.op = MGE_OP_SCALE, .in = {dc}, .n_in = 1, .out = {tb},
                                     .n_out = 1};
                s.a.red.scale = -1.0f;
                if ((rc = ad_node(ad, &s)) < 0)
                    return rc;
            }
        }
        break;
    case MGE_CPU_MUL:
        if (g->values[a].requires_grad) {
            if ((ta = ad_temp(ad, c, "dmul")) < 0)
                return ta;
            n.in[0] = dc; n.in[1] = b; n.out[0] = ta; n.a.bin.op = MGE_CPU_MUL;
            if ((rc = ad_node(ad, &n)) < 0)
                return rc;
        }
        if (g->values[b].requires_grad) {
            if ((tb = ad_temp(ad, c, "dmul")) < 0)
                return tb;
            n.in[0] = dc; n.in[1] = a; n.out[0] = tb; n.a.bin.op = MGE_CPU_MUL;
            if ((rc = ad_node(ad, &n)) < 0)
                return rc;
        }
        break;
    case MGE_CPU_DIV:
        if (g->values[a].requires_grad) {
            if ((ta = ad_temp(ad, c, "ddiv")) < 0)
                return ta;
            n.in[0] = dc; n.in[1] = b; n.out[0] = ta; n.a.bin.op = MGE_CPU_DIV;
            if ((rc = ad_node(ad, &n)) < 0)
                return rc;
        }
        if (g->values[b].requires_grad) { /* db = -dc * c / b */
            int t1 = ad_temp(ad, c, "ddiv");
            if (t1 < 0)
                return t1;
            n.in[0] = dc; n.in[1] = c; n.out[0] = t1; n.a.bin.op = MGE_CPU_MUL;
            if ((rc = ad_node(ad, &n)) < 0)
                return rc;
            if ((tb = ad_temp(ad, c, "ddiv")) < 0)
                return tb;
            n.in[0] = t1; n.in[1] = b; n.out[0] = tb; n.a.bin.op = MGE_CPU_DIV;
            if ((rc = ad_node(ad, &n)) < 0)
                return rc;
            struct mge_node s = {.op = MGE_OP_SCALE, .in = {tb}, .n_in = 1, .out = {t1},
                                 .n_out = 1};
            s.a.red.scale = -1.0f;
            if ((rc = ad_node(ad, &s)) < 0)
                return rc;
            tb = t1;
        }
        break;
    }
    if (ta >= 0 && (rc = ad_contribute(ad, a, ta, 1)) < 0)
        return rc;
    if (tb >= 0 && (rc = ad_contribute(ad, b, tb, 1)) < 0)
        return rc;
    return MGE_OK;
}

/*
 * A normalisation's backward @n (in: dy, x, w, mean, rstd; out: dx, dw, db) for inputs
 * @vals = {x, w, b}: one kernel writes all three gradients with one accumulate flag, so where
 * accumulation differs the odd ones go through zeroed temporaries added in afterwards.
 */
static int ad_norm_grad(struct ad *ad, struct mge_node *n, const int *vals)
{
    struct mge_graph *g = ad->g;
    int outs[3] = {-1, -1, -1}, accs[3] = {0, 0, 0}, rc;
    for (int i = 0; i < 3; i++)
        if (vals[i] >= 0 && g->values[vals[i]].requires_grad &&
            (rc = ad_dst(ad, vals[i], &outs[i], &accs[i])) < 0)
            return rc;
    int acc = accs[1] || accs[2] || (outs[1] < 0 && outs[2] < 0 && accs[0]);
    int fix[3] = {-1, -1, -1};
    for (int i = 0; i < 3; i++)
        if (outs[i] >= 0 && accs[i] != acc) {
            fix[i] = outs[i];
            if ((outs[i] = ad_temp(ad, vals[i], "dnorm")) < 0)
                return outs[i];
        }
    for (int i = 0; i < 3; i++)
        n->out[i] = outs[i];
    n->acc = acc;
    if (acc) /* temporaries are added into, so start them from zero */
        for (int i = 0; i < 3; i++)
            if (fix[i] >= 0) {
                struct mge_node z = {.op = MGE_OP_SCALE, .in = {outs[i]}, .n_in = 1,
                                     .out = {outs[i]}, .n_out = 1};
                z.a.red.scale = 0.0f;
                if ((rc = ad_node(ad, &z)) < 0)
                    return rc;
            }
    if ((rc = ad_node(ad, n)) < 0)
        return rc;
    for (int i = 0; i < 3; i++)
        if (fix[i] >= 0 && (rc = ad_add_into(ad, fix[i], outs[i], accs[i])) < 0)
            return rc;
    return MGE_OK;
}

static int ad_forward_node(struct ad *ad, int ni)
{
    struct mge_graph *g = ad->g;
    const struct mge_node f = g->nodes[ni]; /* copy: the node array may grow */
    int dy = ad->grad[f.out[0]];
    ad->cur = ni;
    int rc = MGE_OK;
    if (dy < 0)
        return MGE_OK; /* nothing flows back through this op */
    switch (f.op) {
    case MGE_OP_MATMUL:
        return ad_matmul(ad, &f, dy);
    case MGE_OP_LINEAR:
        return ad_linear(ad, &f, dy);
    case MGE_OP_BIAS_ACT: {
        int dpre = ad_act_grad(ad, f.a.act.act, dy, f.in[0], f.out[0]);
        if (dpre < 0)
            return dpre;
        if (f.n_in > 1 && f.in[1] >= 0) {
            struct mge_node nb = {.op = MGE_OP_BIAS_GRAD, .in = {dpre}, .n_in = 1, .n_out = 1};
            if ((rc = ad_emit_grad(ad, f.in[1], &nb, 1)) < 0)
                return rc;
        }
        return ad_contribute(ad, f.in[0], dpre, 0);
    }
    case MGE_OP_BINARY:
        return ad_binary(ad, &f, dy);
    case MGE_OP_UNARY: {
        struct mge_node n = {.op = MGE_OP_UNARY_GRAD, .in = {dy, -1, -1}, .n_in = 3, .n_out = 1};
        n.a.act.act = f.a.act.act;
        ad_act_inputs(f.a.act.act, f.in[0], f.out[0], &n);
        return ad_emit_grad(ad, f.in[0], &n, 1);
    }
    case MGE_OP_SOFTMAX:
    case MGE_OP_LOG_SOFTMAX: {
        struct mge_node n = {.op = f.op == MGE_OP_SOFTMAX ? MGE_OP_SOFTMAX_GRAD
                                                          : MGE_OP_LOG_SOFTMAX_GRAD,
                             .in = {dy, f.out[0]}, .n_in = 2, .n_out = 1};
        return ad_emit_grad(ad, f.in[0], &n, 1);
    }
    case MGE_OP_XENT: {
        struct mge_node n = {.op = MGE_OP_XENT_GRAD, .in = {dy, f.out[1], f.in[1]}, .n_in = 3,
                             .n_out = 1};
        n.a.xent = f.a.xent;
        return ad_emit_grad(ad, f.in[0], &n, 1);
    }
    case MGE_OP_REDUCE: {
        struct mge_node n = {.op = MGE_OP_REDUCE_GRAD, .in = {dy}, .n_in = 1, .n_out = 1};
        n.a.red = f.a.red;
        return ad_emit_grad(ad, f.in[0], &n, 1);
    }
    case MGE_OP_PERMUTE: {
        struct mge_node n = {.op = MGE_OP_PERMUTE, .in = {dy}, .n_in = 1, .n_out = 1};
        int nd = g->values[f.in[0]].ndim;
        for (int i = 0; i < nd; i++)
            n.a.perm.perm[f.a.perm.perm[i]] = i;
        return ad_emit_grad(ad, f.in[0], &n, 0);
    }
    case MGE_OP_COPY_AXIS: {
        /* forward: dst[dstart + l] (+)= src[sstart + l]; backward reads the same block back */
        struct mge_node n = {.op = MGE_OP_COPY_AXIS, .in = {dy}, .n_in = 1, .n_out = 1};
        n.a.copy.axis = f.a.copy.axis;
        n.a.copy.dstart = f.a.copy.sstart;
        n.a.copy.sstart = f.a.copy.dstart;
        n.a.copy.len = f.a.copy.len;
        n.a.copy.zero_first = f.a.copy.axis >= 0 &&
                              f.a.copy.len < g->values[f.in[0]].shape[f.a.copy.axis];
        return ad_emit_grad(ad, f.in[0], &n, 1);
    }
    case MGE_OP_CONV2D: {
        int x = f.in[0], w = f.in[1], b = f.in[2], scratch = f.out[1];
        /* backward's own workspace: the forward's would live from forward to backward (all of
         * a network's at once) though no kernel reads what the other left there */
        if (scratch >= 0 && (scratch = ad_temp(ad, scratch, "scratch")) < 0)
            return scratch;
        struct mge_node n = {.op = MGE_OP_CONV2D_GRAD, .in = {dy, x, w}, .n_in = 3,
                             .out = {-1, -1, -1, scratch}, .n_out = 4};
        n.a.conv = f.a.conv;
        if (g->values[w].requires_grad) {
            int dw, accw, db = -1, accb = 0;
            if ((rc = ad_dst(ad, w, &dw, &accw)) < 0)
                return rc;
            if (b >= 0 && g->values[b].requires_grad && (rc = ad_dst(ad, b, &db, &accb)) < 0)
                return rc;
            if (db >= 0 && accb != accw)
                return mge__graph_fail(g, MGE_UNSUPPORTED, "conv2d: shared bias '%s'",
                                       g->values[b].name);
            n.out[1] = dw;
            n.out[2] = db;
            n.acc = accw;
            if ((rc = ad_node(ad, &n)) < 0)
                return rc;
        }
        n.out[1] = n.out[2] = -1;
        return ad_emit_grad(ad, x, &n, 1);
    }
    case MGE_OP_POOL: {
        struct mge_node n = {.op = MGE_OP_POOL_GRAD, .in = {dy, f.in[0]}, .n_in = 2, .n_out = 1};
        n.a.pool = f.a.pool;
        return ad_emit_grad(ad, f.in[0], &n, 1);
    }
    case MGE_OP_DROPOUT: {
        struct mge_node n = {.op = MGE_OP_DROPOUT_GRAD, .in = {dy}, .n_in = 1, .n_out = 1};
        n.a.drop = f.a.drop;
        return ad_emit_grad(ad, f.in[0], &n, 1);
    }
    case MGE_OP_LAYERNORM:
    case MGE_OP_BATCHNORM: {
        struct mge_node n = {.op = f.op == MGE_OP_LAYERNORM ? MGE_OP_LAYERNORM_GRAD
                                                            : MGE_OP_BATCHNORM_GRAD,
                             .in = {dy, f.in[0], f.in[1], f.out[1], f.out[2]},
                             .n_in = 5,
                             .n_out = 3};
        if (f.op == MGE_OP_BATCHNORM && f.a.bn.relu) { /* the fused relu's mask: its output */
            n.in[5] = f.out[0];
            n.n_in = 6;
        }
        return ad_norm_grad(ad, &n, f.in);
    }
    case MGE_OP_ATTENTION: {
        struct mge_node n = {.op = MGE_OP_ATTENTION_GRAD,
                             .in = {dy, f.in[0], f.out[0], f.out[1]},
                             .n_in = 4,
                             .n_out = 1};
        n.a.attn = f.a.attn;
        return ad_emit_grad(ad, f.in[0], &n, 1);
    }
    case MGE_OP_EMBEDDING: {
        struct mge_node n = {.op = MGE_OP_EMBEDDING_GRAD, .in = {dy, f.in[0]}, .n_in = 2,
                             .n_out = 1};
        return ad_emit_grad(ad, f.in[1], &n, 1);
    }
    case MGE_OP_FAKE_QUANT: { /* straight-through: quant.c */
        struct mge_node n = {
            .op = MGE_OP_FAKE_QUANT_GRAD, .in = {dy, f.in[0], f.in[1]}, .n_in = 3, .n_out = 1};
        n.a.q = f.a.q;
        return ad_emit_grad(ad, f.in[0], &n, 1);
    }
    default:
        return mge__graph_fail(g, MGE_UNSUPPORTED, "no gradient for op %s", mge__op_name(f.op));
    }
}

/*
 * Fuse each batch norm whose output only a relu reads into that relu: the batch norm writes
 * the relu's output (a.bn.relu) and its backward masks the gradient itself, bit for bit as the
 * pair computes it, which saves a pass over the tensor each way. Done on the forward graph
 * before differentiating; node ids after a fused relu shift down by one per fusion.
 */
static int fuse_bn_relu(struct mge_graph *g, int loss)
{
    int *uses = mge_calloc((size_t)(g->n_values ? g->n_values : 1), sizeof(int));
    int *at = mge_malloc(sizeof(int) * (size_t)(g->n_nodes ? g->n_nodes : 1)); /* new node ids */
    if (!uses || !at) {
        mge_free(uses);
        mge_free(at);
        return MGE_ERR(MGE_NOMEM, "cannot allocate fusion tables");
    }
    for (int ni = 0; ni < g->n_nodes; ni++)
        for (int i = 0; i < g->nodes[ni].n_in; i++)
            if (g->nodes[ni].in[i] >= 0)
                uses[mge__value_root(g, g->nodes[ni].in[i])]++;
    int kept = 0;
    for (int ni = 0; ni < g->n_nodes; ni++) {
        struct mge_node *n = &g->nodes[ni];
        int y = n->op == MGE_OP_UNARY && n->a.act.act == MGE_ACT_FN_RELU ? n->in[0] : -1;
        int p = y >= 0 ? g->values[y].producer : -1;
        if (p >= 0 && g->nodes[p].op == MGE_OP_BATCHNORM && !g->nodes[p].a.bn.relu &&
            g->nodes[p].out[0] == y && uses[y] == 1 && !g->values[y].keep && y != loss &&
            g->values[y].alias < 0 && g->values[n->out[0]].alias < 0) {
            struct mge_node *bn = &g->nodes[at[p]]; /* p < ni: already moved */
            bn->out[0] = n->out[0];
            bn->a.bn.relu = 1;
            g->values[y].producer = -1; /* gone: nothing reads it */
            at[ni] = -1;
            continue;
        }
        at[ni] = kept;
        g->nodes[kept++] = *n;
    }
    g->n_nodes = kept;
    for (int ni = 0; ni < g->n_nodes; ni++)
        for (int i = 0; i < g->nodes[ni].n_out; i++)
            if (g->nodes[ni].out[i] >= 0)
                g->values[g->nodes[ni].out[i]].producer = ni;
    mge_free(uses);
    mge_free(at);
    return MGE_OK;
}

int mge_graph_backward(struct mge_graph *g, int loss)
{
    struct ad ad = {.g = g};
    int rc = MGE_OK;
    if (g->err)
        return g->err;
    if (loss < 0 || loss >= g->n_values || mge_value_numel(g, loss) != 1)
        return mge__graph_fail(g, MGE_INVAL, "backward: loss must be a scalar value"), g->err;
    if (g->loss >= 0)
        return mge__graph_fail(g, MGE_STATE, "backward: already built"), g->err;
    if ((rc = fuse_bn_relu(g, loss)) != MGE_OK)
        return rc;
    int n_forward = g->n_nodes;
    /* the value array grows while we go: size the side tables for the worst case lazily */
    int cap = g->n_values * 8 + 64;
    ad.grad = mge_malloc(sizeof(int) * (size_t)cap);
    ad.owned = mge_calloc((size_t)cap, 1);
    ad.borrowed = mge_calloc((size_t)cap, 1);
    g->grads = mge_malloc(sizeof(int) * (size_t)(g->n_params ? g->n_params : 1));
    if (!ad.grad || !ad.owned || !ad.borrowed || !g->grads) {
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate autodiff tables");
        goto out_free;
    }
    for (int i = 0; i < cap; i++)
        ad.grad[i] = -1;
    for (int i = 0; i < g->n_params; i++)
        g->grads[i] = -1;
    g->n_forward = n_forward;
    g->loss = loss;
    g->values[loss].keep = 1;

    int64_t one = 1;
    int seed = mge__graph_add_value(g, MGE_VALUE_ACT, MGE_DTYPE_F32, 0, &one, 0, "dloss");
    if (seed < 0) {
        rc = -seed;
        goto out_free;
    }
    struct mge_node ones = {.op = MGE_OP_ONES, .n_in = 0, .out = {seed}, .n_out = 1,
                            .backward = 1};
    if (mge__graph_add_node(g, &ones) < 0) {
        rc = g->err;
        goto out_free;
    }
    ad.grad[loss] = seed;
    ad.owned[seed] = 1;
    for (int ni = n_forward - 1; ni >= 0; ni--) {
        if (g->n_values + 16 > cap) {
            int ncap = cap * 2;
            int *ng = mge_realloc(ad.grad, sizeof(int) * (size_t)ncap);
            char *no = ng ? mge_realloc(ad.owned, (size_t)ncap) : NULL;
            if (ng)
                ad.grad = ng;
            if (no)
                ad.owned = no;
            char *nb = no ? mge_realloc(ad.borrowed, (size_t)ncap) : NULL;
            if (!nb) {
                rc = MGE_ERR(MGE_NOMEM, "cannot grow autodiff tables");
                goto out_free;
            }
            ad.borrowed = nb;
            for (int i = cap; i < ncap; i++) {
                ad.grad[i] = -1;
                ad.owned[i] = 0;
                ad.borrowed[i] = 0;
            }
            cap = ncap;
        }
        if (ad_forward_node(&ad, ni) < 0) {
            rc = g->err ? g->err : MGE_INTERNAL;
            goto out_free;
        }
    }
out_free:
    mge_free(ad.grad);
    mge_free(ad.owned);
    mge_free(ad.borrowed);
    return rc;
}
