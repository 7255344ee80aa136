/*
 * model_graph.c: model.type graph: the nodes of the spec (common/graphspec.h, validated and
 * shaped there) built with the graph-building API, with PyTorch's parameter names
 * ("<node>.weight", "<node>.running_mean") and initialisation, in the order the nodes run.
 */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/graphspec.h"
#include "engine/engine_int.h"
#include "engine/model.h"

struct gbuild {
    struct mge_graph *g;
    const struct mge_graphspec *gs;
    int *val;   /* value id of each node's output */
    int *users; /* nodes that read each node's output */
    int *param; /* embedding nodes: the value id of their weight (tied_linear reuses it) */
};

static int param(struct gbuild *b, const struct mge_gnode *nd, const char *what, int ndim,
                 const int64_t *shape, enum mge_init init, int64_t fan)
{
    char name[96];
    snprintf(name, sizeof(name), "%s.%s", nd->name, what);
    return mge_param(b->g, name, ndim, shape, init, fan);
}

static int buffer(struct gbuild *b, const struct mge_gnode *nd, const char *what,
                  const int64_t *shape, enum mge_init init)
{
    char name[96];
    snprintf(name, sizeof(name), "%s.%s", nd->name, what);
    return mge_buffer(b->g, name, 1, shape, init);
}

static enum mge_act act_of_op(enum mge_gop op)
{
    switch (op) {
    case MGE_GOP_RELU:
        return MGE_ACT_FN_RELU;
    case MGE_GOP_GELU:
        return MGE_ACT_FN_GELU;
    case MGE_GOP_TANH:
        return MGE_ACT_FN_TANH;
    case MGE_GOP_SIGMOID:
        return MGE_ACT_FN_SIGMOID;
    default:
        return MGE_ACT_NONE;
    }
}

/*
 * The activation a linear node @i can take into its own kernel, as the zoo's layers do: that
 * of its only reader when that reader is an activation and runs right after it. The reader
 * then reuses the linear's output, so a graph and the zoo model it spells out run the same ops.
 */
static enum mge_act fused_act(const struct gbuild *b, int pos)
{
    const struct mge_graphspec *gs = b->gs;
    int i = gs->order[pos];
    if (b->users[i] != 1 || pos + 1 >= gs->n)
        return MGE_ACT_NONE;
    const struct mge_gnode *next = &gs->nodes[gs->order[pos + 1]];
    if (next->inputs[0] != i)
        return MGE_ACT_NONE;
    return act_of_op(next->op);
}

static int build_linear(struct gbuild *b, const struct mge_gnode *nd, int x, enum mge_act act)
{
    const int64_t *xs = mge_value_shape(b->g, x);
    int64_t in = xs[mge_value_ndim(b->g, x) - 1];
    int64_t ws[2] = {nd->features, in}, bs[1] = {nd->features};
    int w, bias = -1;
    if (nd->init == MGE_GINIT_NORMAL) {
        /* GPT-2: N(0, 0.02^2), residual projections N(0, 0.02^2 / (2 layers)), bias 0 */
        int64_t fan = nd->residual_layers ? 2 * (int64_t)nd->residual_layers : 1;
        w = param(b, nd, "weight", 2, ws, MGE_INIT_NORMAL_GPT, fan);
        if (nd->bias)
            bias = param(b, nd, "bias", 1, bs, MGE_INIT_ZERO, 1);
    } else {
        w = param(b, nd, "weight", 2, ws, MGE_INIT_UNIFORM_FAN_IN, in);
        if (nd->bias)
            bias = param(b, nd, "bias", 1, bs, MGE_INIT_UNIFORM_FAN_IN, in);
    }
    return mge_linear(b->g, x, w, bias, act);
}

static int build_conv2d(struct gbuild *b, const struct mge_gnode *nd, int x)
{
    int64_t cin = mge_value_shape(b->g, x)[1], k = nd->kernel;
    int64_t ws[4] = {nd->features, cin, k, k}, bs[1] = {nd->features};
    int w = nd->init == MGE_GINIT_KAIMING_NORMAL
                ? param(b, nd, "weight", 4, ws, MGE_INIT_NORMAL_FAN_OUT, nd->features * k * k)
                : param(b, nd, "weight", 4, ws, MGE_INIT_UNIFORM_FAN_IN, cin * k * k);
    int bias = nd->bias ? param(b, nd, "bias", 1, bs, MGE_INIT_UNIFORM_FAN_IN, cin * k * k) : -1;
    return mge_conv2d(b->g, x, w, bias, nd->stride, nd->padding);
}

static int build_norm(struct gbuild *b, const struct mge_gnode *nd, int x)
{
    const int64_t *xs = mge_value_shape(b->g, x);
    int64_t cs[1] = {nd->op == MGE_GOP_BATCHNORM2D ? xs[1] : xs[mge_value_ndim(b->g, x) - 1]};
    int w = param(b, nd, "weight", 1, cs, MGE_INIT_ONE, 1);
    int bias = param(b, nd, "bias", 1, cs, MGE_INIT_ZERO, 1);
    if (nd->op == MGE_GOP_LAYERNORM)
        return mge_layernorm(b->g, x, w, bias, (float)nd->eps);
    int rm = buffer(b, nd, "running_mean", cs, MGE_INIT_ZERO);
    int rv = buffer(b, nd, "running_var", cs, MGE_INIT_ONE);
    return mge_batchnorm2d(b->g, x, w, bias, rm, rv, (float)nd->eps, (float)nd->momentum);
}

/* Node at position @pos of the order; its output into b->val. */
static int build_node(struct gbuild *b, const struct mge_jobspec *spec, int64_t batch, int pos,
                      struct mge_model *m)
{
    struct mge_graph *g = b->g;
    int i = b->gs->order[pos];
    const struct mge_gnode *nd = &b->gs->nodes[i];
    int in[MGE_GRAPH_MAX_INPUTS], x, y = -MGE_INVAL;
    int64_t shape[MGE_MAX_DIMS];

    for (int k = 0; k < nd->n_inputs; k++)
        in[k] = b->val[nd->inputs[k]];
    x = nd->n_inputs ? in[0] : -1;
    switch (nd->op) {
    case MGE_GOP_INPUT:
        shape[0] = batch;
        memcpy(shape + 1, nd->shape, sizeof(int64_t) * (size_t)nd->ndim);
        y = m->x = mge_input(g, nd->name, MGE_DTYPE_F32, nd->ndim + 1, shape, 1);
        break;
    case MGE_GOP_LINEAR:
        y = build_linear(b, nd, x, fused_act(b, pos));
        break;
    case MGE_GOP_CONV2D:
        y = build_conv2d(b, nd, x);
        break;
    case MGE_GOP_BATCHNORM2D:
    case MGE_GOP_LAYERNORM:
        y = build_norm(b, nd, x);
        break;
    case MGE_GOP_RELU:
    case MGE_GOP_GELU:
    case MGE_GOP_TANH:
    case MGE_GOP_SIGMOID:
        if (pos > 0 && b->gs->nodes[b->gs->order[pos - 1]].op == MGE_GOP_LINEAR &&
            fused_act(b, pos - 1) != MGE_ACT_NONE)
            y = x; /* done by the linear before it */
        else
            y = nd->op == MGE_GOP_RELU   ? mge_relu(g, x)
                : nd->op == MGE_GOP_GELU ? mge_gelu(g, x)
                : nd->op == MGE_GOP_TANH ? mge_tanh(g, x)
                                         : mge_sigmoid(g, x);
        break;
    case MGE_GOP_ADD:
        y = mge_add(g, in[0], in[1]);
        break;
    case MGE_GOP_SUB:
        y = mge_sub(g, in[0], in[1]);
        break;
    case MGE_GOP_MUL:
        y = mge_mul(g, in[0], in[1]);
        break;
    case MGE_GOP_MAXPOOL:
        y = mge_maxpool2d(g, x, nd->kernel, nd->stride, nd->padding);
        break;
    case MGE_GOP_AVGPOOL:
        y = mge_avgpool2d(g, x, nd->kernel, nd->stride, nd->padding);
        break;
    case MGE_GOP_GLOBAL_AVGPOOL:
        y = mge_global_avgpool2d(g, x);
        break;
    case MGE_GOP_FLATTEN:
        y = mge_flatten(g, x);
        break;
    case MGE_GOP_RESHAPE:
        shape[0] = batch;
        memcpy(shape + 1, nd->shape, sizeof(int64_t) * (size_t)nd->ndim);
        y = mge_reshape(g, x, nd->ndim + 1, shape);
        break;
    case MGE_GOP_DROPOUT:
        y = nd->p > 0 ? mge_dropout(g, x, (float)nd->p) : x;
        break;
    case MGE_GOP_CONCAT: {
        int axis = nd->axis < 0 ? nd->axis + mge_value_ndim(g, x) : nd->axis;
        y = mge_concat(g, in, nd->n_inputs, axis);
        break;
    }
    case MGE_GOP_TOKENS:
        shape[0] = batch;
        shape[1] = nd->context;
        y = m->x = mge_input(g, nd->name, MGE_DTYPE_I32, 2, shape, 1);
        break;
    case MGE_GOP_EMBEDDING:
        /* GPT-2's N(0, 0.02^2), as the zoo's wte */
        shape[0] = nd->vocab;
        shape[1] = nd->d_model;
        b->param[i] = param(b, nd, "weight", 2, shape, MGE_INIT_NORMAL_GPT, 1);
        y = mge_embedding(g, x, b->param[i]);
        break;
    case MGE_GOP_POS_EMBEDDING:
        /* windows are always context tokens long: the table is added whole (broadcast) */
        shape[0] = nd->context;
        shape[1] = mge_value_shape(g, x)[2];
        y = mge_add(g, x, param(b, nd, "weight", 2, shape, MGE_INIT_NORMAL_GPT, 1));
        break;
    case MGE_GOP_CAUSAL_ATTENTION:
        y = mge_causal_attention(g, x, nd->heads);
        break;
    case MGE_GOP_TIED_LINEAR:
        y = mge_linear(g, x, b->param[nd->tied], -1, MGE_ACT_NONE);
        break;
    case MGE_GOP_CROSS_ENTROPY:
        m->logits = x;
        y = m->loss = mge_cross_entropy_smoothed(g, x, m->y, (float)spec->train.label_smoothing);
        break;
    case MGE_GOP_COUNT:
        break;
    }
    b->val[i] = y;
    if (mge_graph_error(g) != MGE_OK) {
        /* name the node in the engine's message: the spec's line and name find it */
        char msg[sizeof(g->errmsg)];
        snprintf(msg, sizeof(msg), "%s", g->errmsg);
        snprintf(g->errmsg, sizeof(g->errmsg), "model.nodes[%d] (line %d): node `%s`: %.150s", i,
                 nd->line, nd->name, msg);
        return g->err;
    }
    return MGE_OK;
}

/* The data's samples must be what the input node declares (idx files say it only here). */
static int check_data(struct mge_graph *g, const struct mge_graphspec *gs, int c, int h, int w,
                      int classes)
{
    const struct mge_gnode *x = &gs->nodes[gs->input], *loss = &gs->nodes[gs->loss];
    const struct mge_gnode *logits = &gs->nodes[loss->inputs[0]];
    int64_t n = mge_graphspec_input_numel(gs), dim = (int64_t)c * h * w;
    if (mge_graphspec_reads_tokens(gs))
        return MGE_OK;            /* token windows: the spec's checks are all there is */
    bool flat = c == 1 && h == 1; /* synthetic data for a graph is flat: any shape of dim */
    if (n != dim ||
        (!flat && x->ndim == 3 && (x->shape[0] != c || x->shape[1] != h || x->shape[2] != w)))
        return mge__graph_fail(g, MGE_INVAL,
                               "model.nodes[%d] (line %d): node `%s`: the data's samples are "
                               "[%d,%d,%d] (%lld values), the input declares %lld values",
                               gs->input, x->line, x->name, c, h, w, (long long)dim, (long long)n);
    if (logits->out_shape[1] != classes)
        return mge__graph_fail(g, MGE_INVAL,
                               "model.nodes[%d] (line %d): node `%s`: logits of %lld classes, the "
                               "data has %d",
                               gs->loss, loss->line, loss->name, (long long)logits->out_shape[1],
                               classes);
    return MGE_OK;
}

int mge__model_graph_build(struct mge_graph *g, const struct mge_jobspec *spec, int64_t batch,
                           int c, int h, int w, int classes, struct mge_model *m)
{
    const struct mge_graphspec *gs = spec->model.graph;
    struct gbuild b = {.g = g, .gs = gs};
    int64_t ys[2] = {batch, 0};
    int rc;

    if (!gs) {
        mge__graph_fail(g, MGE_INVAL, "model.type graph without nodes");
        return MGE_INVAL;
    }
    if (check_data(g, gs, c, h, w, classes) != MGE_OK)
        return mge_graph_error(g);
    b.val = mge_calloc((size_t)gs->n, sizeof(int));
    b.users = mge_calloc((size_t)gs->n, sizeof(int));
    b.param = mge_calloc((size_t)gs->n, sizeof(int));
    if (!b.val || !b.users || !b.param) {
        mge__graph_fail(g, MGE_NOMEM, "cannot allocate the graph's node table");
        rc = MGE_NOMEM;
        goto out_free;
    }
    for (int i = 0; i < gs->n; i++)
        for (int k = 0; k < gs->nodes[i].n_inputs; k++)
            b.users[gs->nodes[i].inputs[k]]++;
    /* labels first, as the zoo makes them last: the loss node needs them, inputs are not ops */
    if (mge_graphspec_reads_tokens(gs)) /* the next token at each place of the window */
        ys[1] = gs->nodes[gs->input].context;
    m->y = mge_input(g, "y", MGE_DTYPE_I32, ys[1] ? 2 : 1, ys, 1);
    rc = mge_graph_error(g);
    for (int pos = 0; pos < gs->n && rc == MGE_OK; pos++)
        rc = build_node(&b, spec, batch, pos, m);
out_free:
    mge_free(b.val);
    mge_free(b.users);
    mge_free(b.param);
    return rc;
}
