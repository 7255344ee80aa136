/*
 * quant.c: quantisation in the graph: the pass that mge_linear()/mge_conv2d() hand over to
 * (fake-quantise nodes for quantisation-aware training, or int8 ops for inference over the
 * same parameters), the activation observers, and the CPU kernels of those ops.
 *
 * One rounding rule serves both paths (kernels/cpu/cpu_quant.h), so an int8 op sees the very
 * codes the fake-quantised graph multiplies; they differ only in how the products are summed
 * (exact int32 against fp32), which moves an output by rounding error: the next layer's codes
 * agree or differ by one quantisation step.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "engine/engine_int.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_quant.h"

#define F(g, v) ((float *)(g)->values[(v)].data)
#define HIST_BINS 2048 /* percentile observer: bins over the batch's [min, max] */

struct mge__quant {
    struct mge_quant_opts o;
    int building;               /* inside a builder this file called: do not wrap again */
    struct mge_cpu_qweight *qw; /* (n_slots) packed weights of the int8 ops, made at first run */
    int n_slots, cap_slots;
    int *gone; /* (n_gone) int8 convs' outputs that a fold replaced (mge__quant_fuse_*) */
    int n_gone, cap_gone;
    /* image-major segments (mge__quant_plan()), or NULL: every int8 convolution batch-wide */
    int *seg;          /* (n_seg) per node: a segment's first: its last node; -2: in one; -1 */
    int n_seg;         /* nodes when planned */
    int64_t *loc;      /* (n_loc) per value: its image's offset in a thread's local area, or -1 */
    int n_loc;         /* values when planned */
    size_t loc_bytes;  /* one thread's local area (64-byte multiple) */
    int loc_threads;   /* threads the local area is for */
    uint8_t *loc_area; /* (loc_threads, loc_bytes), 64-byte aligned, made at the first run */
};

int mge_graph_set_quant(struct mge_graph *g, const struct mge_quant_opts *o)
{
    if (g->n_nodes > 0)
        return MGE_ERR(MGE_STATE, "quantisation must be set before the graph has ops");
    if (o->mode < MGE_QUANT_OFF || o->mode > MGE_QUANT_INT8 || o->observer < 0 ||
        o->observer > MGE_QUANT_OBS_PERCENTILE || !(o->momentum > 0.0f && o->momentum <= 1.0f) ||
        !(o->percentile > 50.0f && o->percentile <= 100.0f) || o->start_step < 0)
        return MGE_ERR(MGE_INVAL, "bad quantisation options");
    if (!g->quant && !(g->quant = mge_calloc(1, sizeof(*g->quant))))
        return MGE_ERR(MGE_NOMEM, "cannot allocate quantisation state");
    g->quant->o = *o;
    return MGE_OK;
}

void mge__quant_free(struct mge__quant *q)
{
    if (!q)
        return;
    for (int i = 0; i < q->n_slots; i++)
        mge_cpu_qweight_fini(&q->qw[i]);
    mge_free(q->qw);
    mge_free(q->gone);
    mge_free(q->seg);
    mge_free(q->loc);
    mge_free_aligned(q->loc_area);
    mge_free(q);
}

int mge__quant_wants(const struct mge_graph *g)
{
    return g->quant && !g->quant->building && g->quant->o.mode != MGE_QUANT_OFF;
}

/* ---- the pass: builders ---------------------------------------------------------------- */

static int new_value(struct mge_graph *g, const char *what, int like, int requires_grad)
{
    const struct mge_value x = g->values[like]; /* a copy: adding values may move the table */
    char name[64];
    snprintf(name, sizeof(name), "%s.%d", what, g->n_values);
    int v = mge__graph_add_value(g, MGE_VALUE_ACT, MGE_DTYPE_F32, x.ndim, x.shape, x.batched, name);
    if (v >= 0)
        g->values[v].requires_grad = requires_grad;
    return v;
}

/* The observer buffer of the op whose weight is @w: "<layer>.act_observer", shared when a
 * weight serves several ops. */
static int observer_of(struct mge_graph *g, int w)
{
    char name[64];
    const char *wn = g->values[w].name, *dot = strrchr(wn, '.');
    int len = dot ? (int)(dot - wn) : (int)strlen(wn);
    snprintf(name, sizeof(name), "%.*s%s", len, wn, MGE_QUANT_OBSERVER_SUFFIX);
    for (int i = 0; i < g->n_params; i++)
        if (!strcmp(g->values[g->params[i]].name, name))
            return g->params[i];
    int64_t shape[1] = {MGE_QUANT_OBSERVER_LEN};
    return mge_buffer(g, name, 1, shape, MGE_INIT_ZERO);
}

static int fake_quant(struct mge_graph *g, int x, int obs)
{
    int req = g->values[x].requires_grad;
    int out = new_value(g, obs < 0 ? "fq_weight" : "fq_act", x, req);
    if (out < 0)
        return out;
    struct mge_node n = {
        .op = MGE_OP_FAKE_QUANT, .in = {x, obs}, .n_in = 2, .out = {out}, .n_out = 1};
    n.a.q.weight = obs < 0;
    int id = mge__graph_add_node(g, &n);
    return id < 0 ? id : out;
}

/* Fake-quantise a GEMM/conv's input *@x (replaced by its fake-quantised value) with observer
 * @obs, and its weight @w; returns the fake-quantised weight, or -err. */
static int fake_quant_inputs(struct mge_graph *g, int *x, int w, int obs)
{
    int xq = fake_quant(g, *x, obs);
    if (xq < 0)
        return xq;
    *x = xq;
    return fake_quant(g, w, -1);
}

/* A slot for an int8 op's packed weights. */
static int new_slot(struct mge_graph *g)
{
    struct mge__quant *q = g->quant;
    size_t cap = (size_t)q->cap_slots;
    if (mge_array_grow((void **)&q->qw, &cap, (size_t)q->n_slots + 1, sizeof(*q->qw)) != MGE_OK)
        return mge__graph_fail(g, MGE_NOMEM, "out of memory adding an int8 op");
    q->cap_slots = (int)cap;
    memset(&q->qw[q->n_slots], 0, sizeof(*q->qw));
    return q->n_slots++;
}

/* Scratch of @bytes (a float vector, planned like any activation), 64 bytes of slack. */
static int scratch(struct mge_graph *g, size_t bytes)
{
    int64_t n = (int64_t)((bytes + 64 + 3) / 4);
    char name[64];
    snprintf(name, sizeof(name), "scratch.int8.%d", g->n_values); /* eager mode: "scratch" */
    return mge__graph_add_value(g, MGE_VALUE_ACT, MGE_DTYPE_F32, 1, &n, 0, name);
}

/* Activation @act after an int8 op that fused none. */
static int apply_act(struct mge_graph *g, int y, enum mge_act act)
{
    switch (act) {
    case MGE_ACT_FN_GELU:
        return mge_gelu(g, y);
    case MGE_ACT_FN_TANH:
        return mge_tanh(g, y);
    case MGE_ACT_FN_SIGMOID:
        return mge_sigmoid(g, y);
    default:
        return y;
    }
}

int mge__quant_linear(struct mge_graph *g, int x, int w, int b, enum mge_act act)
{
    struct mge__quant *q = g->quant;
    int obs = observer_of(g, w);
    if (obs < 0)
        return obs;
    if (q->o.mode == MGE_QUANT_FAKE) {
        int wq = fake_quant_inputs(g, &x, w, obs);
        q->building = 1;
        int y = wq < 0 ? wq : mge_linear(g, x, wq, b, act);
        q->building = 0;
        return y;
    }
    const struct mge_value X = g->values[x];
    int64_t shape[MGE_MAX_DIMS], K = X.shape[X.ndim - 1], rows = 1;
    for (int i = 0; i < X.ndim; i++)
        shape[i] = X.shape[i];
    shape[X.ndim - 1] = g->values[w].shape[0];
    for (int i = 0; i + 1 < X.ndim; i++)
        rows *= X.shape[i];
    int y =
        mge__graph_add_value(g, MGE_VALUE_ACT, MGE_DTYPE_F32, X.ndim, shape, X.batched, "qlinear");
    int s = y < 0 ? y : scratch(g, (size_t)rows * (size_t)((K + 3) / 4 * 4));
    int slot = s < 0 ? s : new_slot(g);
    if (slot < 0)
        return slot;
    struct mge_node n = {
        .op = MGE_OP_QLINEAR, .in = {x, w, b, obs}, .n_in = 4, .out = {y, s}, .n_out = 2};
    n.a.q.relu = act == MGE_ACT_FN_RELU;
    n.a.q.slot = slot;
    if (mge__graph_add_node(g, &n) < 0)
        return -g->err;
    return apply_act(g, y, act);
}

/*
 * Scratch of an int8 convolution: the tables of mge_cpu_qconv_tables() (pixel and k-quad
 * offsets, vpermb indices), a folded batch norm's multipliers and offsets (N each), then per
 * thread one image's codes zero-padded by @pad (128 bytes of slack: the last k-quads read up to
 * 3 bytes past a row, the pixel-lane convolution up to 50 past the last code), each part
 * 64-byte aligned.
 */
static size_t conv_shared_bytes(int64_t C, int64_t R, int64_t S, int64_t PQ, int64_t N)
{
    int64_t quads = R * S; /* per group, at most (channel quads) */
    return ((size_t)(8 * PQ) + 63) / 64 * 64 + ((size_t)(4 * C * quads) + 63) / 64 * 64 +
           (size_t)(64 * quads) + ((size_t)(8 * N) + 63) / 64 * 64;
}

static size_t conv_thread_bytes(int64_t C, int64_t H, int64_t W, int pad)
{
    int64_t C4 = (C + 3) / 4 * 4; /* channel quads pad C */
    return ((size_t)(C4 * (H + 2 * pad) * (W + 2 * pad)) + 128 + 63) / 64 * 64;
}

/* Inputs past the convolution's own four: 4..7 a batch norm's, 8 a residual, 9 its input's
 * codes written by the int8 convolution before it (-1: none of them). */
#define QCONV_IN_RES 8
#define QCONV_IN_CODES 9
_Static_assert(QCONV_IN_CODES < MGE_NODE_MAX_IN, "an int8 conv's inputs fit a node");

static void widen(struct mge_node *n)
{
    for (int i = n->n_in; i <= QCONV_IN_CODES; i++)
        n->in[i] = -1;
    if (n->n_in <= QCONV_IN_CODES)
        n->n_in = QCONV_IN_CODES + 1;
}

/* Whether int8 convolution @n has a batch norm or a residual folded in. */
static int folded(const struct mge_node *n)
{
    return n->n_in > 4 && (n->in[6] >= 0 || n->in[QCONV_IN_RES] >= 0);
}

/*
 * A convolution whose input @x an int8 convolution made (its folds included) reads its codes
 * from it: a batched byte buffer, one padded image of codes (as conv_thread_bytes() sizes it)
 * per sample, that the producer writes in its epilogue (its outputs from the third on: a block's
 * output feeds the next block's conv1 and its shortcut's conv, each with its own quantiser) and
 * this one reads instead of quantising @x, where chain_live() says so at run time (then the
 * producer skips @x itself). Returns the buffer's value, -1 where @x has no such producer (or it
 * has MGE_CPU_QNEXT already), or -err.
 */
static int chain_codes(struct mge_graph *g, int x, int pad)
{
    int p = g->values[x].producer;
    const char *env = getenv("MGE_INT8_CHAIN");
    if (env && !strcmp(env, "off"))
        return -1;
    _Static_assert(2 + MGE_CPU_QNEXT <= MGE_NODE_MAX_OUT, "an int8 conv's outputs fit a node");
    if (p < 0 || g->nodes[p].op != MGE_OP_QCONV2D || g->nodes[p].n_out >= 2 + MGE_CPU_QNEXT ||
        g->nodes[p].out[0] != x)
        return -1;
    const struct mge_value X = g->values[x];
    int64_t shape[2] = {X.shape[0],
                        (int64_t)conv_thread_bytes(X.shape[1], X.shape[2], X.shape[3], pad) / 4};
    int v = mge__graph_add_value(g, MGE_VALUE_ACT, MGE_DTYPE_F32, 2, shape, X.batched,
                                 "scratch.codes.int8");
    if (v < 0)
        return v;
    struct mge_node *n = &g->nodes[p];
    n->out[n->n_out++] = v;
    g->values[v].producer = p;
    return v;
}

int mge__quant_conv2d(struct mge_graph *g, int x, int w, int b, int stride, int pad)
{
    struct mge__quant *q = g->quant;
    int obs = observer_of(g, w);
    if (obs < 0)
        return obs;
    if (q->o.mode == MGE_QUANT_FAKE) {
        int wq = fake_quant_inputs(g, &x, w, obs);
        q->building = 1;
        int y = wq < 0 ? wq : mge_conv2d(g, x, wq, b, stride, pad);
        q->building = 0;
        return y;
    }
    const struct mge_value X = g->values[x], W = g->values[w];
    int64_t P = (X.shape[2] + 2 * pad - W.shape[2]) / stride + 1;
    int64_t Q = (X.shape[3] + 2 * pad - W.shape[3]) / stride + 1;
    int64_t shape[4] = {X.shape[0], W.shape[0], P, Q};
    int y = mge__graph_add_value(g, MGE_VALUE_ACT, MGE_DTYPE_F32, 4, shape, X.batched, "qconv2d");
    /* images run in parallel, each thread with its own padded codes and columns */
    int threads = mge_cpu_threads() < X.shape[0] ? mge_cpu_threads() : (int)X.shape[0];
    threads = threads > 0 ? threads : 1;
    size_t bytes = conv_shared_bytes(X.shape[1], W.shape[2], W.shape[3], P * Q, W.shape[0]) +
                   (size_t)threads * conv_thread_bytes(X.shape[1], X.shape[2], X.shape[3], pad);
    int s = y < 0 ? y : scratch(g, bytes);
    int slot = s < 0 ? s : new_slot(g);
    if (slot < 0)
        return slot;
    int codes = chain_codes(g, x, pad);
    if (codes < -1)
        return codes;
    struct mge_node n = {
        .op = MGE_OP_QCONV2D, .in = {x, w, b, obs}, .n_in = 4, .out = {y, s}, .n_out = 2};
    n.a.q.slot = slot;
    n.a.q.stride = stride;
    n.a.q.pad = pad;
    n.a.q.threads = threads;
    if (codes >= 0) {
        widen(&n);
        n.in[QCONV_IN_CODES] = codes;
    }
    int id = mge__graph_add_node(g, &n);
    return id < 0 ? id : y;
}

/* ---- folds into an int8 convolution ----------------------------------------------------- */

/* The int8 convolution node whose output is @x, if it is the last op of @g (nothing else can
 * have read @x yet), else NULL. */
static struct mge_node *last_qconv(struct mge_graph *g, int x)
{
    if (!g->quant || g->quant->o.mode != MGE_QUANT_INT8 || g->n_nodes == 0)
        return NULL;
    struct mge_node *n = &g->nodes[g->n_nodes - 1];
    return n->op == MGE_OP_QCONV2D && n->out[0] == x ? n : NULL;
}

/* The folded node @n writes a new value (like @x, named @what) instead of @x, which is gone. */
static int refold(struct mge_graph *g, struct mge_node *n, int x, const char *what, int *y)
{
    struct mge__quant *q = g->quant;
    size_t cap = (size_t)q->cap_gone;
    if (mge_array_grow((void **)&q->gone, &cap, (size_t)q->n_gone + 1, sizeof(*q->gone)) != MGE_OK)
        return mge__graph_fail(g, MGE_NOMEM, "out of memory folding into an int8 convolution");
    q->cap_gone = (int)cap;
    int node = (int)(n - g->nodes), v = new_value(g, what, x, 0);
    if (v < 0)
        return -v;
    n = &g->nodes[node]; /* adding a value moves nothing in the node table, but be plain */
    q->gone[q->n_gone++] = x;
    n->out[0] = v;
    g->values[v].producer = node;
    g->values[x].producer = -1;
    *y = v;
    return MGE_OK;
}

int mge__quant_fuse_batchnorm(struct mge_graph *g, int x, int w, int b, int running_mean,
                              int running_var, float eps, int *y)
{
    struct mge_node *n = last_qconv(g, x);
    *y = -1;
    /* first of the folds (it comes before an add or relu) */
    if (!n || folded(n) || n->a.q.relu)
        return MGE_OK;
    widen(n);
    n->in[4] = w;
    n->in[5] = b;
    n->in[6] = running_mean;
    n->in[7] = running_var;
    n->a.q.eps = eps;
    return refold(g, n, x, "qconv2d.bn", y);
}

int mge__quant_fuse_add(struct mge_graph *g, int a, int b, int *y)
{
    struct mge_node *n = last_qconv(g, b);
    int x = b, other = a;
    if (!n) {
        n = last_qconv(g, a);
        x = a;
        other = b;
    }
    *y = -1;
    if (!n || n->a.q.relu || (n->n_in > QCONV_IN_RES && n->in[QCONV_IN_RES] >= 0) || other == x)
        return MGE_OK;
    /* a residual of the very same shape only (no broadcast); addition commutes in IEEE */
    const struct mge_value *X = &g->values[x], *O = &g->values[other];
    if (O->ndim != X->ndim || O->batched != X->batched || O->dtype != MGE_DTYPE_F32)
        return MGE_OK;
    for (int i = 0; i < X->ndim; i++)
        if (O->shape[i] != X->shape[i])
            return MGE_OK;
    widen(n);
    n->in[QCONV_IN_RES] = other;
    return refold(g, n, x, "qconv2d.add", y);
}

int mge__quant_fuse_relu(struct mge_graph *g, int x, int *y)
{
    struct mge_node *n = last_qconv(g, x);
    *y = -1;
    if (!n || n->a.q.relu)
        return MGE_OK;
    n->a.q.relu = 1;
    return refold(g, n, x, "qconv2d.relu", y);
}

int mge__quant_check_use(struct mge_graph *g, int v, const char *op)
{
    for (int i = 0; g->quant && i < g->quant->n_gone; i++)
        if (g->quant->gone[i] == v)
            return mge__graph_fail(g, MGE_INVAL,
                                   "%s: '%s' was folded into the int8 convolution that made it "
                                   "(its batch norm, add or relu): int8 graphs cannot read it",
                                   op, g->values[v].name);
    return MGE_OK;
}

/* ---- image-major segments ------------------------------------------------------------- */

#define SEG_MAX 32 /* int8 convolutions in one image-major segment, at most */

/* Bytes of one image of batched value @v (F32 storage). */
static size_t image_bytes(const struct mge_graph *g, int v)
{
    const struct mge_value *x = &g->values[v];
    size_t n = sizeof(float);
    for (int i = 1; i < x->ndim; i++)
        n *= (size_t)x->shape[i];
    return n;
}

/* The segment [*@lo, *@hi] node @ni belongs to (itself where none). */
void mge__quant_span(const struct mge_graph *g, int ni, int64_t *lo, int64_t *hi)
{
    const struct mge__quant *q = g->quant;
    *lo = *hi = ni;
    if (!q || !q->seg || ni < 0 || ni >= q->n_seg || q->seg[ni] == -1)
        return;
    int h = ni;
    while (q->seg[h] == -2)
        h--;
    *lo = h;
    *hi = q->seg[h];
}

/*
 * Values whose every use lies inside one segment (made and read there only, not kept) are
 * segment-local: image i of them lives in a per-thread buffer of one image, overwritten by image
 * i + 1, so a block's activations and chained codes stay in L2 instead of going batch-wide.
 */
static void plan_locals(struct mge_graph *g)
{
    struct mge__quant *q = g->quant;
    size_t off = 0;
    for (int v = 0; v < g->n_values; v++) {
        const struct mge_value *x = &g->values[v];
        q->loc[v] = -1;
        if (x->kind != MGE_VALUE_ACT || x->alias >= 0 || x->keep || !x->batched ||
            x->producer < 0 || q->seg[x->producer] == -1)
            continue;
        int64_t lo, hi;
        mge__quant_span(g, x->producer, &lo, &hi);
        int inside = 1;
        for (int ni = 0; ni < g->n_nodes && inside; ni++)
            for (int k = 0; k < g->nodes[ni].n_in; k++) {
                int u = g->nodes[ni].in[k];
                if (u >= 0 && mge__value_root(g, u) == v && (ni < lo || ni > hi))
                    inside = 0;
            }
        for (int u = 0; u < g->n_values && inside; u++)
            if (u != v && mge__value_root(g, u) == v)
                inside = 0; /* a view of it: keep it plain */
        if (!inside)
            continue;
        q->loc[v] = (int64_t)off;
        off += (image_bytes(g, v) + 63) / 64 * 64;
    }
    q->loc_bytes = off;
}

int mge__quant_local(const struct mge_graph *g, int v)
{
    const struct mge__quant *q = g->quant;
    int r = v >= 0 ? mge__value_root(g, v) : -1;
    return q && q->loc && r >= 0 && r < q->n_loc && q->loc[r] >= 0;
}

int mge__quant_segment_nodes(const struct mge_graph *g, int *locals)
{
    const struct mge__quant *q = g->quant;
    int nodes = 0;
    *locals = 0;
    for (int i = 0; q && q->seg && i < q->n_seg; i++)
        nodes += q->seg[i] != -1;
    for (int v = 0; q && q->loc && v < q->n_loc; v++)
        *locals += q->loc[v] >= 0;
    return nodes;
}

int mge__quant_plan(struct mge_graph *g)
{
    struct mge__quant *q = g->quant;
    const char *env = getenv("MGE_INT8_BLOCK");
    if (!q || q->o.mode != MGE_QUANT_INT8 || g->eager || (env && !strcmp(env, "off")))
        return MGE_OK;
    mge_free(q->seg);
    mge_free(q->loc);
    q->seg = mge_malloc(sizeof(int) * (size_t)(g->n_nodes ? g->n_nodes : 1));
    q->loc = mge_malloc(sizeof(int64_t) * (size_t)(g->n_values ? g->n_values : 1));
    if (!q->seg || !q->loc) {
        mge_free(q->seg);
        mge_free(q->loc);
        q->seg = NULL;
        q->loc = NULL;
        return MGE_ERR(MGE_NOMEM, "cannot allocate int8 segments");
    }
    q->n_seg = g->n_nodes;
    q->n_loc = g->n_values;
    q->loc_threads = 1;
    int segs = 0;
    for (int ni = 0; ni < g->n_nodes; ni++)
        q->seg[ni] = -1;
    /* consecutive int8 convolutions of the forward pass over one batch, same threads */
    for (int ni = 0; ni < g->n_forward;) {
        const struct mge_node *h = &g->nodes[ni];
        int j = ni;
        while (j < g->n_forward && j - ni < SEG_MAX && g->nodes[j].op == MGE_OP_QCONV2D &&
               g->nodes[j].a.q.threads == h->a.q.threads && g->values[g->nodes[j].in[0]].batched)
            j++;
        if (j - ni >= 2) {
            q->seg[ni] = j - 1;
            for (int k = ni + 1; k < j; k++)
                q->seg[k] = -2;
            q->loc_threads = h->a.q.threads > q->loc_threads ? h->a.q.threads : q->loc_threads;
            segs++;
        }
        ni = j > ni ? j : ni + 1;
    }
    if (segs == 0) {
        mge_free(q->seg);
        mge_free(q->loc);
        q->seg = NULL;
        q->loc = NULL;
        return MGE_OK;
    }
    plan_locals(g);
    return MGE_OK;
}

/* ---- observers ----------------------------------------------------------------------------- */

/* The [100 - p, p] percentiles of @x by a histogram over [lo, hi] (bin edges: within a bin). */
static void batch_percentiles(const float *x, int64_t n, float lo, float hi, float p, float *plo,
                              float *phi)
{
    static int64_t hist[HIST_BINS]; /* graphs run on one thread at a time (engine.h) */
    float width = (hi - lo) / (float)HIST_BINS;
    if (!(width > 0.0f)) {
        *plo = lo;
        *phi = hi;
        return;
    }
    memset(hist, 0, sizeof(hist));
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            continue;
        int b = (int)((x[i] - lo) / width);
        hist[b < 0 ? 0 : b >= HIST_BINS ? HIST_BINS - 1 : b]++;
    }
    double tail = (double)n * (100.0 - (double)p) / 100.0;
    int64_t acc = 0;
    int bl = 0, bh = HIST_BINS - 1;
    while (bl < HIST_BINS - 1 && (double)(acc + hist[bl]) <= tail)
        acc += hist[bl++];
    acc = 0;
    while (bh > bl && (double)(acc + hist[bh]) <= tail)
        acc += hist[bh--];
    *plo = lo + width * (float)bl;
    *phi = lo + width * (float)(bh + 1);
}

/* Fold @x's range into observer @obs (low, high, count, 0) by the chosen rule. */
static void observe(const struct mge_quant_opts *o, float *obs, const float *x, int64_t n)
{
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo; /* NaN compares false: skipped */
        hi = x[i] > hi ? x[i] : hi;
    }
    if (!(lo <= hi))
        return; /* nothing finite seen */
    if (o->observer == MGE_QUANT_OBS_PERCENTILE)
        batch_percentiles(x, n, lo, hi, o->percentile, &lo, &hi);
    if (obs[2] == 0.0f) {
        obs[0] = lo;
        obs[1] = hi;
    } else if (o->observer == MGE_QUANT_OBS_MINMAX) {
        obs[0] = lo < obs[0] ? lo : obs[0];
        obs[1] = hi > obs[1] ? hi : obs[1];
    } else {
        obs[0] += o->momentum * (lo - obs[0]);
        obs[1] += o->momentum * (hi - obs[1]);
    }
    obs[2] += 1.0f;
}

/* ---- CPU kernels ------------------------------------------------------------------------- */

/* Whether the fake-quantise op @n quantises in this run (else it passes values through). */
static int fq_active(const struct mge_graph *g, const struct mge_node *n)
{
    const struct mge_quant_opts *o = &g->quant->o;
    if (o->calibrate)
        return 0;
    if (g->training && g->step < o->start_step)
        return 0;
    return n->a.q.weight || F(g, n->in[1])[2] > 0.0f;
}

int mge__cpu_fake_quant(struct mge_graph *g, const struct mge_node *n)
{
    int x = n->in[0], y = n->out[0];
    int64_t len = mge__value_numel_now(g, x);
    const struct mge_quant_opts *o = &g->quant->o;
    if (!n->a.q.weight) {
        /* training forward ops observe (not recomputations: those are marked backward), and
         * so do calibration runs */
        int train_fwd = g->training && !n->backward;
        if (train_fwd || (o->calibrate && !g->training))
            observe(o, F(g, n->in[1]), F(g, x), len);
    }
    if (!fq_active(g, n)) {
        if (F(g, y) != F(g, x))
            memcpy(F(g, y), F(g, x), sizeof(float) * (size_t)len);
        return MGE_OK;
    }
    if (n->a.q.weight) {
        int64_t N = g->values[x].shape[0];
        mge_cpu_fake_quant_weight(F(g, y), F(g, x), N, len / N);
    } else {
        const float *obs = F(g, n->in[1]);
        struct mge_cpu_qaffine qa;
        mge_cpu_qaffine_from_range(obs[0], obs[1], &qa);
        mge_cpu_fake_quant_affine(F(g, y), F(g, x), len, &qa);
    }
    return MGE_OK;
}

int mge__cpu_fake_quant_grad(struct mge_graph *g, const struct mge_node *n)
{
    int dy = n->in[0], x = n->in[1], obs = n->in[2], dx = n->out[0];
    int64_t len = mge__value_numel_now(g, x);
    float *d = F(g, dx);
    const float *s = F(g, dy);
    struct mge_node fwd = *n; /* fq_active reads the forward's inputs: x, observer */
    fwd.in[0] = x;
    fwd.in[1] = obs;
    if (n->a.q.weight || !fq_active(g, &fwd)) {
        /* weights: every code lies inside [-127, 127] by construction, so all pass */
        for (int64_t i = 0; i < len; i++)
            d[i] = n->acc ? d[i] + s[i] : s[i];
        return MGE_OK;
    }
    const float *o = F(g, obs);
    struct mge_cpu_qaffine qa;
    mge_cpu_qaffine_from_range(o[0], o[1], &qa);
    mge_cpu_fake_quant_affine_backward(d, s, F(g, x), len, &qa, n->acc);
    return MGE_OK;
}

/* The packed weights of int8 op @n, packed from its weight at the first run (a convolution's
 * in k-quad @layout). */
static const struct mge_cpu_qweight *packed_weights(struct mge_graph *g, const struct mge_node *n,
                                                    int layout)
{
    struct mge_cpu_qweight *qw = &g->quant->qw[n->a.q.slot];
    int w = n->in[1];
    const int64_t *ws = g->values[w].shape;
    int64_t N = ws[0], K = mge_value_numel(g, w) / N;
    int rc = MGE_OK;
    if (!qw->packed)
        rc = n->op == MGE_OP_QCONV2D ? mge_cpu_qweight_pack_conv(qw, F(g, w), (int)N, (int)ws[1],
                                                                 (int)ws[2], (int)ws[3], layout)
                                     : mge_cpu_qweight_pack(qw, F(g, w), (int)N, (int)K);
    if (rc != MGE_OK)
        return NULL;
    return qw;
}

int mge__cpu_qlinear(struct mge_graph *g, const struct mge_node *n)
{
    int x = n->in[0], b = n->in[2], obs = n->in[3], y = n->out[0];
    const struct mge_cpu_qweight *qw = packed_weights(g, n, 0);
    if (!qw)
        return MGE_NOMEM;
    const struct mge_value *X = &g->values[x];
    int64_t K = X->shape[X->ndim - 1], rows = mge__value_numel_now(g, x) / K;
    const float *o = F(g, obs);
    struct mge_cpu_qaffine qa;
    mge_cpu_qaffine_from_range(o[0], o[1], &qa);
    uint8_t *codes = (uint8_t *)F(g, n->out[1]);
    mge_cpu_quantize_u8(codes, qw->Kp, F(g, x), K, rows, K, &qa);
    mge_cpu_gemm_u8s8(qw, (int)rows, codes, qw->Kp, &qa, b >= 0 ? F(g, b) : NULL, n->a.q.relu,
                      F(g, y), qw->N, 1);
    return MGE_OK;
}

/* One image of an int8 convolution: its codes into @xp (zero-padded with the zero point's
 * code), unless @ready has them (written by the convolution before), then the convolution over
 * them straight into the NCHW output @y. */
static void qconv_image(const struct mge_cpu_qweight *qw, const struct mge_cpu_qconv_shape *sh,
                        const struct mge_cpu_qaffine *qa, const float *x, const uint8_t *ready,
                        const float *bias, const struct mge_cpu_qpost *post, int relu, float *y,
                        uint8_t *xp, const int64_t *roff, const int32_t *koff, const uint8_t *idx,
                        int pad)
{
    int64_t H = sh->Hp - 2 * pad, W = sh->Wp - 2 * pad, codes = (int64_t)sh->C * sh->Hp * sh->Wp;
    if (ready) {
        mge_cpu_qconv(qw, sh, ready, roff, koff, idx, qa, bias, post, relu, y);
        return;
    }
    if (qw->layout == MGE_CPU_QCONV_CHANS) {
        codes = (int64_t)(sh->C + 3) / 4 * 4 * sh->Hp * sh->Wp;
        mge_cpu_quantize_u8_padded_quads(xp, x, sh->C, H, W, pad, qa);
    } else {
        mge_cpu_quantize_u8_padded(xp, x, sh->C, H, W, pad, qa);
    }
    memset(xp + codes, 0, 128);
    mge_cpu_qconv(qw, sh, xp, roff, koff, idx, qa, bias, post, relu, y);
}

/*
 * Whether int8 convolution node @p writes its consumers' codes (chain_codes()) in this run:
 * only where they replace its fp32 output, every reader of which reads codes instead. Writing
 * codes besides the fp32 output cost more than the consumers' own quantisers, which code into a
 * per-thread buffer that stays in cache (ResNet-8's stem, whose output the residual reads: +0.25
 * ms a batch of 64). Eager mode checks every value: no chains there. The producer and its
 * consumers ask alike.
 */
static int chain_live(const struct mge_graph *g, int p)
{
    const struct mge_node *n = &g->nodes[p];
    int y = n->out[0], readers = 0;
    if (n->op != MGE_OP_QCONV2D || n->n_out <= 2 || g->values[y].keep || g->eager)
        return 0;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) {
            int v = g->nodes[i].in[k];
            readers += v >= 0 && mge__value_root(g, v) == mge__value_root(g, y);
        }
    return readers == n->n_out - 2;
}

/*
 * Where int8 convolution @n writes the codes of the int8 convolutions after it (chain_codes()):
 * sets @post's next[] for image 0 (@qc: the consumers' quantisers) and @per[] to their bytes per
 * image (0: none). MGE_OK, or MGE_NOMEM packing a consumer's weights.
 */
static int chain_out(struct mge_graph *g, const struct mge_node *n, struct mge_cpu_qpost *post,
                     struct mge_cpu_qaffine *qc, size_t *per)
{
    int y = n->out[0], live = chain_live(g, (int)(n - g->nodes));
    for (int t = 0; t < MGE_CPU_QNEXT; t++) {
        int cv = live && n->n_out > 2 + t ? n->out[2 + t] : -1, zi = -1;
        per[t] = 0;
        for (int i = 0; cv >= 0 && i < g->n_nodes; i++) {
            const struct mge_node *m = &g->nodes[i];
            if (m->op == MGE_OP_QCONV2D && m->n_in > QCONV_IN_CODES && m->in[QCONV_IN_CODES] == cv)
                zi = i;
        }
        if (zi < 0)
            continue;
        const struct mge_node *z = &g->nodes[zi];
        int64_t ys[MGE_MAX_DIMS];
        mge__value_shape_now(g, y, ys);
        const int64_t *ws = g->values[z->in[1]].shape;
        int pad = z->a.q.pad, st = z->a.q.stride;
        struct mge_cpu_qconv_shape zs = {.C = (int)ys[1],
                                         .Hp = (int)(ys[2] + 2 * pad),
                                         .Wp = (int)(ys[3] + 2 * pad),
                                         .R = (int)ws[2],
                                         .S = (int)ws[3],
                                         .stride = st,
                                         .P = (int)((ys[2] + 2 * pad - ws[2]) / st + 1),
                                         .Q = (int)((ys[3] + 2 * pad - ws[3]) / st + 1)};
        const struct mge_cpu_qweight *zq = packed_weights(g, z, mge_cpu_qconv_layout(&zs));
        if (!zq)
            return MGE_NOMEM;
        const float *o = F(g, z->in[3]);
        mge_cpu_qaffine_from_range(o[0], o[1], &qc[t]);
        post->next[t] = (struct mge_cpu_qcodes){.codes = (uint8_t *)F(g, cv),
                                                .qc = &qc[t],
                                                .pad = pad,
                                                .quads = zq->layout == MGE_CPU_QCONV_CHANS};
        per[t] = conv_thread_bytes(ys[1], ys[2], ys[3], pad);
    }
    post->skip_y = live;
    return MGE_OK;
}

/* Where one image of a value lies: @base + img * @img + thread * @thr (a batch-wide value:
 * @thr 0; a segment-local one, mge__quant_plan(): @img 0, each thread its own image). */
struct qconv_ptr {
    uint8_t *base; /* NULL: no such value */
    size_t img, thr;
};

/* One int8 convolution node of a run, prepared for its images (qconv_job_image()). */
struct qconv_job {
    const struct mge_cpu_qweight *qw;
    struct mge_cpu_qconv_shape sh;
    struct mge_cpu_qaffine qa;                /* its input's quantiser */
    struct mge_cpu_qaffine qc[MGE_CPU_QNEXT]; /* the consumers' whose codes it writes */
    struct mge_cpu_qpost post;                /* res and next[].codes: image 0's, set per image */
    const int64_t *roff;
    const int32_t *koff;
    const uint8_t *idx;
    const float *bias;
    int relu, pad;
    struct qconv_ptr x, y, res, ready, next[MGE_CPU_QNEXT];
    uint8_t *images; /* (threads, per): each thread's padded codes of its image */
    size_t per;
};

static uint8_t *ptr_at(const struct qconv_ptr *p, int64_t img, int thread)
{
    return p->base ? p->base + (size_t)img * p->img + (size_t)thread * p->thr : NULL;
}

/* @v's images (@bytes each) as @g runs it: in the local area where mge__quant_plan() made it
 * segment-local, else batch-wide. */
static struct qconv_ptr value_ptr(const struct mge_graph *g, int v, size_t bytes)
{
    const struct mge__quant *q = g->quant;
    if (v < 0)
        return (struct qconv_ptr){.base = NULL};
    if (mge__quant_local(g, v))
        return (struct qconv_ptr){
            .base = q->loc_area + q->loc[mge__value_root(g, v)], .img = 0, .thr = q->loc_bytes};
    return (struct qconv_ptr){.base = (uint8_t *)F(g, v), .img = bytes, .thr = 0};
}

/* Prepare int8 convolution @n for this run's images into @j (kept where it is: its post
 * points into it). MGE_OK, MGE_NOMEM (packing weights) or MGE_STATE (a training run). */
static int qconv_prepare(struct mge_graph *g, const struct mge_node *n, struct qconv_job *j)
{
    int x = n->in[0], w = n->in[1], b = n->in[2], obs = n->in[3], y = n->out[0];
    int64_t xs[MGE_MAX_DIMS];
    mge__value_shape_now(g, x, xs);
    const int64_t *ws = g->values[w].shape;
    int64_t C = xs[1], H = xs[2], W = xs[3], R = ws[2], S = ws[3];
    int stride = n->a.q.stride, pad = n->a.q.pad;
    int64_t P = (H + 2 * pad - R) / stride + 1, Q = (W + 2 * pad - S) / stride + 1;
    memset(j, 0, sizeof(*j));
    j->sh = (struct mge_cpu_qconv_shape){.C = (int)C,
                                         .Hp = (int)(H + 2 * pad),
                                         .Wp = (int)(W + 2 * pad),
                                         .R = (int)R,
                                         .S = (int)S,
                                         .stride = stride,
                                         .P = (int)P,
                                         .Q = (int)Q};
    const struct mge_cpu_qweight *qw = packed_weights(g, n, mge_cpu_qconv_layout(&j->sh));
    if (!qw)
        return MGE_NOMEM;
    j->qw = qw;
    if (n->n_in > 4 && n->in[6] >= 0 && g->training)
        return MGE_ERR(MGE_STATE,
                       "int8 convolution '%s' with a folded batch norm: int8 graphs "
                       "run inference only (a training batch norm needs its batch)",
                       g->values[y].name);
    const float *o = F(g, obs);
    mge_cpu_qaffine_from_range(o[0], o[1], &j->qa);
    uint8_t *base = (uint8_t *)F(g, n->out[1]);
    base += (64 - ((uintptr_t)base & 63)) & 63; /* the scratch has 64 bytes of slack */
    int64_t quads = R * S;                      /* as conv_shared_bytes() counts */
    int64_t *roff = (int64_t *)(void *)base;
    int32_t *koff = (int32_t *)(void *)(base + ((size_t)(8 * P * Q) + 63) / 64 * 64);
    uint8_t *idx = (uint8_t *)(koff + (4 * C * quads + 63) / 64 * 16);
    float *bn = (float *)(void *)(idx + 64 * quads);
    j->images = base + conv_shared_bytes(C, R, S, P * Q, qw->N);
    j->per = conv_thread_bytes(C, H, W, pad);
    mge_cpu_qconv_tables(&j->sh, qw->layout, roff, koff, idx);
    j->roff = roff;
    j->koff = koff;
    j->idx = idx;
    j->bias = b >= 0 ? F(g, b) : NULL;
    j->relu = n->a.q.relu;
    j->pad = pad;
    size_t next[MGE_CPU_QNEXT];
    if (chain_out(g, n, &j->post, j->qc, next) != MGE_OK)
        return MGE_NOMEM;
    for (int t = 0; t < MGE_CPU_QNEXT; t++)
        j->next[t] = next[t] ? value_ptr(g, n->out[2 + t], next[t]) : (struct qconv_ptr){0};
    if (n->n_in > QCONV_IN_CODES && n->in[QCONV_IN_CODES] >= 0 &&
        chain_live(g, g->values[x].producer))
        j->ready = value_ptr(g, n->in[QCONV_IN_CODES], j->per);
    if (n->n_in > 4 && n->in[6] >= 0) {
        /* the batch norm's inference form, as mge_cpu_batchnorm_forward() computes it */
        const float *bw = n->in[4] >= 0 ? F(g, n->in[4]) : NULL;
        const float *bb = n->in[5] >= 0 ? F(g, n->in[5]) : NULL;
        const float *rm = F(g, n->in[6]), *rv = F(g, n->in[7]);
        for (int64_t c = 0; c < qw->N; c++) {
            float s = (float)(1.0 / sqrt((double)rv[c] + (double)n->a.q.eps));
            float k = s * (bw ? bw[c] : 1.0f);
            bn[c] = k;
            bn[qw->N + c] = (bb ? bb[c] : 0.0f) - rm[c] * k;
        }
        j->post.mul = bn;
        j->post.add = bn + qw->N;
    }
    size_t ybytes = sizeof(float) * (size_t)(qw->N * P * Q);
    j->x = value_ptr(g, x, sizeof(float) * (size_t)(C * H * W));
    j->y = value_ptr(g, y, ybytes);
    if (n->n_in > QCONV_IN_RES && n->in[QCONV_IN_RES] >= 0)
        j->res = value_ptr(g, n->in[QCONV_IN_RES], ybytes);
    return MGE_OK;
}

/* Image @img of prepared convolution @j on OpenMP thread @thread. */
static void qconv_job_image(const struct qconv_job *j, int64_t img, int thread)
{
    struct mge_cpu_qpost pi = j->post;
    pi.res = (const float *)(void *)ptr_at(&j->res, img, thread);
    for (int t = 0; t < MGE_CPU_QNEXT; t++)
        if (j->next[t].base)
            pi.next[t].codes = ptr_at(&j->next[t], img, thread);
    qconv_image(j->qw, &j->sh, &j->qa, (const float *)(void *)ptr_at(&j->x, img, thread),
                ptr_at(&j->ready, img, thread), j->bias, &pi, j->relu,
                (float *)(void *)ptr_at(&j->y, img, thread), j->images + (size_t)thread * j->per,
                j->roff, j->koff, j->idx, j->pad);
}

/* Run the @K int8 convolution nodes from @head on over the batch image by image: each image
 * goes through all of them before the next starts (one node: the plain batch-wide run). */
static int run_qconvs(struct mge_graph *g, const struct mge_node *head, int K)
{
    struct qconv_job jobs[SEG_MAX];
    MGE_ASSERT(K >= 1 && K <= SEG_MAX);
    int64_t xs[MGE_MAX_DIMS];
    mge__value_shape_now(g, head->in[0], xs);
    int64_t N = xs[0];
    for (int k = 0; k < K; k++) {
        int rc = qconv_prepare(g, &head[k], &jobs[k]);
        if (rc != MGE_OK)
            return rc;
    }
    /* as many threads as the scratch (and the local area) was sized for at most */
    int threads = mge_cpu_threads() < head->a.q.threads ? mge_cpu_threads() : head->a.q.threads;
    if (threads > N)
        threads = (int)N;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int t = omp_get_thread_num();
#pragma omp for schedule(static)
        for (int64_t img = 0; img < N; img++)
            for (int k = 0; k < K; k++)
                qconv_job_image(&jobs[k], img, t);
    }
    return MGE_OK;
}

int mge__cpu_qconv2d(struct mge_graph *g, const struct mge_node *n)
{
    struct mge__quant *q = g->quant;
    int ni = n >= g->nodes && n < g->nodes + g->n_nodes ? (int)(n - g->nodes) : -1;
    if (q->seg && ni >= 0 && ni < q->n_seg && q->seg[ni] != -1) {
        if (q->seg[ni] == -2)
            return MGE_OK; /* its segment's first node ran it */
        if (q->loc_bytes && !q->loc_area &&
            !(q->loc_area = mge_malloc_aligned(q->loc_bytes * (size_t)q->loc_threads)))
            return MGE_ERR(MGE_NOMEM, "cannot allocate int8 segment buffers");
        return run_qconvs(g, n, q->seg[ni] - ni + 1);
    }
    return run_qconvs(g, n, 1);
}
