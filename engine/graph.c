/* graph.c: the graph IR and its C build API (shape inference and checks for every op). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "engine/device.h"
#include "engine/engine_int.h"
#include "kernels/cpu/cpu.h"

const char *mge__op_name(enum mge_op op)
{
    static const char *const names[] = {
#define MGE__OP_NAME(name) #name,
        MGE_OP_MAP(MGE__OP_NAME)
#undef MGE__OP_NAME
    };
    return (op >= 0 && op < MGE_OP__COUNT) ? names[op] : "?";
}

size_t mge_dtype_size(enum mge_dtype dt)
{
    switch (dt) {
    case MGE_DTYPE_F32:
    case MGE_DTYPE_I32:
        return 4;
    case MGE_DTYPE_F16:
    case MGE_DTYPE_BF16:
        return 2;
    case MGE_DTYPE_I8:
        return 1;
    }
    return 4;
}

const char *mge_dtype_name(enum mge_dtype dt)
{
    static const char *const names[] = {"f32", "f16", "bf16", "i8", "i32"};
    return (dt >= 0 && dt <= MGE_DTYPE_I32) ? names[dt] : "?";
}

int mge_graph_new(struct mge_graph **out)
{
    struct mge_graph *g = mge_calloc(1, sizeof(*g));
    if (!g)
        return MGE_ERR(MGE_NOMEM, "cannot allocate graph");
    g->loss = -1;
    g->loss_scale = 1.0f;
    g->batch = -1;
    *out = g;
    return MGE_OK;
}

void mge_graph_free(struct mge_graph *g)
{
    if (!g)
        return;
    mge__graph_free_arenas(g);
    mge_free(g->values);
    mge_free(g->nodes);
    mge_free(g->params);
    mge_free(g->grads);
    mge_free(g->profile);
    mge_free(g->grad_ready);
    mge__eager_free(g);
    mge__quant_free(g->quant);
    mge_free(g);
}

int mge_graph_error(const struct mge_graph *g) { return g->err; }

const char *mge_graph_error_msg(const struct mge_graph *g) { return g->errmsg; }

int mge__graph_fail(struct mge_graph *g, int code, const char *fmt, ...)
{
    if (g->err == MGE_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g->errmsg, sizeof(g->errmsg), fmt, ap);
        va_end(ap);
        g->err = code;
    }
    return -g->err;
}

/* mge_array_grow() for the graph's int-counted tables. */
static int graph_grow(void **arr, int *cap, int need, size_t elem)
{
    size_t c = (size_t)*cap;
    int rc = mge_array_grow(arr, &c, (size_t)need, elem);
    if (rc == MGE_OK)
        *cap = (int)c;
    return rc;
}

int mge__graph_add_value(struct mge_graph *g, enum mge_value_kind kind, enum mge_dtype dt,
                         int ndim, const int64_t *shape, int batched, const char *name)
{
    if (g->err)
        return -g->err;
    if (ndim < 0 || ndim > MGE_MAX_DIMS)
        return mge__graph_fail(g, MGE_INVAL, "'%s': %d dims (at most %d)", name, ndim,
                               MGE_MAX_DIMS);
    int64_t dims[MGE_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0)
            return mge__graph_fail(g, MGE_INVAL, "'%s': dim %d is %lld", name, i,
                                   (long long)shape[i]);
        dims[i] = shape[i];
    }
    /* @shape and @name may point into g->values, which growing can move: copies first */
    char vname[64];
    snprintf(vname, sizeof(vname), "%s", name);
    shape = dims;
    name = vname;
    if (graph_grow((void **)&g->values, &g->cap_values, g->n_values + 1, sizeof(*g->values)))
        return mge__graph_fail(g, MGE_NOMEM, "out of memory adding '%s'", name);
    struct mge_value *v = &g->values[g->n_values];
    memset(v, 0, sizeof(*v));
    v->kind = kind;
    v->dtype = dt;
    v->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        v->shape[i] = shape[i];
    v->batched = batched && ndim > 0;
    snprintf(v->name, sizeof(v->name), "%s", name);
    v->producer = -1;
    v->alias = -1;
    v->param_index = -1;
    v->first_use = v->last_use = -1;
    return g->n_values++;
}

int mge__graph_add_node(struct mge_graph *g, const struct mge_node *n)
{
    if (g->err)
        return -g->err;
    if (g->planned)
        return mge__graph_fail(g, MGE_STATE, "graph already planned: cannot add '%s'",
                               mge__op_name(n->op));
    if (graph_grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof(*g->nodes)))
        return mge__graph_fail(g, MGE_NOMEM, "out of memory adding op");
    g->nodes[g->n_nodes] = *n;
    for (int i = 0; i < n->n_out; i++)
        if (n->out[i] >= 0)
            g->values[n->out[i]].producer = g->n_nodes;
    return g->n_nodes++;
}

int64_t mge__value_numel_now(const struct mge_graph *g, int v)
{
    const struct mge_value *val = &g->values[v];
    int64_t n = 1;
    for (int i = 0; i < val->ndim; i++)
        n *= (i == 0 && val->batched && g->batch > 0) ? g->batch : val->shape[i];
    return n;
}

void mge__value_shape_now(const struct mge_graph *g, int v, int64_t *shape)
{
    const struct mge_value *val = &g->values[v];
    for (int i = 0; i < val->ndim; i++)
        shape[i] = val->shape[i];
    if (val->batched && g->batch > 0)
        shape[0] = g->batch;
}

size_t mge__value_bytes(const struct mge_graph *g, int v)
{
    const struct mge_value *val = &g->values[v];
    size_t n = mge_dtype_size(val->dtype);
    for (int i = 0; i < val->ndim; i++)
        n *= (size_t)val->shape[i];
    return n;
}

int mge__value_root(const struct mge_graph *g, int v)
{
    while (g->values[v].alias >= 0)
        v = g->values[v].alias;
    return v;
}

/* ---- public value accessors ---- */

int mge_value_ndim(const struct mge_graph *g, int v) { return g->values[v].ndim; }
const int64_t *mge_value_shape(const struct mge_graph *g, int v) { return g->values[v].shape; }
const char *mge_value_name(const struct mge_graph *g, int v) { return g->values[v].name; }
void *mge_value_data(const struct mge_graph *g, int v) { return g->values[v].data; }

int64_t mge_value_numel(const struct mge_graph *g, int v)
{
    int64_t n = 1;
    for (int i = 0; i < g->values[v].ndim; i++)
        n *= g->values[v].shape[i];
    return n;
}

int mge_graph_n_params(const struct mge_graph *g) { return g->n_params; }
int mge_graph_param(const struct mge_graph *g, int i) { return g->params[i]; }

int mge_graph_grad(const struct mge_graph *g, int param)
{
    int pi = g->values[param].param_index;
    if (!g->grads || pi < 0)
        return -1;
    return g->grads[pi];
}

int mge_graph_keep(struct mge_graph *g, int v)
{
    if (v < 0 || v >= g->n_values)
        return MGE_ERR(MGE_INVAL, "no value %d", v);
    g->values[v].keep = 1;
    return MGE_OK;
}

/* ---- inputs and parameters ---- */

static int check_value(struct mge_graph *g, int v, const char *op)
{
    if (g->err)
        return -g->err;
    if (v < 0 || v >= g->n_values)
        return mge__graph_fail(g, MGE_INVAL, "%s: no value %d", op, v);
    return g->quant ? mge__quant_check_use(g, v, op) : MGE_OK;
}

int mge_input(struct mge_graph *g, const char *name, enum mge_dtype dt, int ndim,
              const int64_t *shape, int batched)
{
    int v = mge__graph_add_value(g, MGE_VALUE_INPUT, dt, ndim, shape, batched, name);
    if (v < 0)
        return v;
    if (batched && (g->batch_max == 0 || shape[0] > g->batch_max))
        g->batch_max = shape[0];
    return v;
}

static int add_param(struct mge_graph *g, const char *name, int ndim, const int64_t *shape,
                     enum mge_init init, int64_t fan_in, int buffer)
{
    int v = mge__graph_add_value(g, MGE_VALUE_PARAM, MGE_DTYPE_F32, ndim, shape, 0, name);
    if (v < 0)
        return v;
    for (int i = 0; i < g->n_params; i++)
        if (!strcmp(g->values[g->params[i]].name, g->values[v].name))
            return mge__graph_fail(g, MGE_EXISTS, "parameter '%s' defined twice", name);
    if (graph_grow((void **)&g->params, &g->cap_params, g->n_params + 1, sizeof(int)))
        return mge__graph_fail(g, MGE_NOMEM, "out of memory adding '%s'", name);
    g->values[v].requires_grad = !buffer;
    g->values[v].buffer = buffer;
    g->values[v].init = init;
    g->values[v].fan_in = fan_in;
    g->values[v].param_index = g->n_params;
    g->params[g->n_params++] = v;
    return v;
}

int mge_param(struct mge_graph *g, const char *name, int ndim, const int64_t *shape,
              enum mge_init init, int64_t fan_in)
{
    return add_param(g, name, ndim, shape, init, fan_in, 0);
}

int mge_buffer(struct mge_graph *g, const char *name, int ndim, const int64_t *shape,
               enum mge_init init)
{
    return add_param(g, name, ndim, shape, init, 1, 1);
}

int mge_value_is_buffer(const struct mge_graph *g, int v)
{
    return v >= 0 && v < g->n_values && g->values[v].kind == MGE_VALUE_PARAM && g->values[v].buffer;
}

/* ---- op builders ---- */

static int new_act(struct mge_graph *g, const char *opname, int ndim, const int64_t *shape,
                   int batched, int requires_grad)
{
    char name[64];
    snprintf(name, sizeof(name), "%s.%d", opname, g->n_values);
    int v = mge__graph_add_value(g, MGE_VALUE_ACT, MGE_DTYPE_F32, ndim, shape, batched, name);
    if (v >= 0)
        g->values[v].requires_grad = requires_grad;
    return v;
}

static int rg(const struct mge_graph *g, int v) { return v >= 0 && g->values[v].requires_grad; }

static int emit(struct mge_graph *g, struct mge_node *n)
{
    int id = mge__graph_add_node(g, n);
    return id < 0 ? id : n->out[0];
}

static int64_t rows_of(const struct mge_value *v)
{
    int64_t r = 1;
    for (int i = 0; i + 1 < v->ndim; i++)
        r *= v->shape[i];
    return r;
}

int mge_matmul(struct mge_graph *g, int a, int b, int ta, int tb)
{
    if (check_value(g, a, "matmul") || check_value(g, b, "matmul"))
        return -g->err;
    const struct mge_value *A = &g->values[a], *B = &g->values[b];
    if (A->ndim < 2 || B->ndim != 2)
        return mge__graph_fail(g, MGE_INVAL, "matmul: '%s' needs >= 2 dims and '%s' 2 dims",
                               A->name, B->name);
    if (ta && A->ndim != 2)
        return mge__graph_fail(g, MGE_INVAL, "matmul: transposed '%s' must be 2-D", A->name);
    int64_t M = ta ? A->shape[1] : rows_of(A), K = ta ? A->shape[0] : A->shape[A->ndim - 1];
    int64_t KB = tb ? B->shape[1] : B->shape[0], N = tb ? B->shape[0] : B->shape[1];
    if (K != KB)
        return mge__graph_fail(g, MGE_INVAL, "matmul: inner dims differ (%lld vs %lld)",
                               (long long)K, (long long)KB);
    int64_t shape[MGE_MAX_DIMS];
    int ndim = ta ? 2 : A->ndim;
    for (int i = 0; i < ndim - 1; i++)
        shape[i] = ta ? M : A->shape[i];
    shape[ndim - 1] = N;
    int out = new_act(g, "matmul", ndim, shape, !ta && A->batched, rg(g, a) || rg(g, b));
    if (out < 0)
        return out;
    struct mge_node n = {.op = MGE_OP_MATMUL, .in = {a, b}, .n_in = 2, .out = {out}, .n_out = 1};
    n.a.mm.ta = ta;
    n.a.mm.tb = tb;
    return emit(g, &n);
}

int mge_linear(struct mge_graph *g, int x, int w, int b, enum mge_act act)
{
    if (check_value(g, x, "linear") || check_value(g, w, "linear") ||
        (b >= 0 && check_value(g, b, "linear")))
        return -g->err;
    const struct mge_value *X = &g->values[x], *W = &g->values[w];
    if (W->ndim != 2 || X->ndim < 1 || X->shape[X->ndim - 1] != W->shape[1])
        return mge__graph_fail(g, MGE_INVAL, "linear: '%s' (.., %lld) does not fit weight '%s'",
                               X->name, (long long)X->shape[X->ndim - 1], W->name);
    if (b >= 0 && (g->values[b].ndim != 1 || g->values[b].shape[0] != W->shape[0]))
        return mge__graph_fail(g, MGE_INVAL, "linear: bias '%s' must be (%lld)", g->values[b].name,
                               (long long)W->shape[0]);
    if (mge__quant_wants(g))
        return mge__quant_linear(g, x, w, b, act);
    int64_t shape[MGE_MAX_DIMS];
    for (int i = 0; i < X->ndim; i++)
        shape[i] = X->shape[i];
    shape[X->ndim - 1] = W->shape[0];
    int req = rg(g, x) || rg(g, w) || rg(g, b), ndim = X->ndim, batched = X->batched;
    int out = new_act(g, "linear", ndim, shape, batched, req); /* X may move from here on */
    int pre = -1;
    if (out >= 0 && act == MGE_ACT_FN_GELU)
        pre = new_act(g, "linear_pre", ndim, shape, batched, 0);
    if (out < 0 || (act == MGE_ACT_FN_GELU && pre < 0))
        return -g->err;
    struct mge_node n = {.op = MGE_OP_LINEAR, .in = {x, w, b}, .n_in = 3, .out = {out, pre},
                         .n_out = 2};
    n.a.act.act = act;
    return emit(g, &n);
}

static int broadcast_shape(struct mge_graph *g, int a, int b, int64_t *shape, int *ndim)
{
    const struct mge_value *A = &g->values[a], *B = &g->values[b];
    int nd = A->ndim > B->ndim ? A->ndim : B->ndim;
    for (int i = 0; i < nd; i++) {
        int ia = i - (nd - A->ndim), ib = i - (nd - B->ndim);
        int64_t da = ia >= 0 ? A->shape[ia] : 1, db = ib >= 0 ? B->shape[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return mge__graph_fail(g, MGE_INVAL, "cannot broadcast '%s' with '%s' at dim %d",
                                   A->name, B->name, i);
        shape[i] = da > db ? da : db;
    }
    *ndim = nd;
    return MGE_OK;
}

static int binary(struct mge_graph *g, int a, int b, int op, const char *name)
{
    if (check_value(g, a, name) || check_value(g, b, name))
        return -g->err;
    int64_t shape[MGE_MAX_DIMS];
    int ndim = 0;
    if (broadcast_shape(g, a, b, shape, &ndim))
        return -g->err;
    const struct mge_value *A = &g->values[a], *B = &g->values[b];
    /* dim 0 follows the batch when the operand that has it full-size is batched */
    int batched = (A->ndim == ndim && A->batched && A->shape[0] == shape[0]) ||
                  (B->ndim == ndim && B->batched && B->shape[0] == shape[0]);
    int out = new_act(g, name, ndim, shape, batched, rg(g, a) || rg(g, b));
    if (out < 0)
        return out;
    struct mge_node n = {.op = MGE_OP_BINARY, .in = {a, b}, .n_in = 2, .out = {out}, .n_out = 1};
    n.a.bin.op = op;
    return emit(g, &n);
}

int mge_add(struct mge_graph *g, int a, int b)
{
    int y = -1;
    if (mge__quant_wants(g) && mge__quant_fuse_add(g, a, b, &y) != MGE_OK)
        return -g->err;
    return y >= 0 ? y : binary(g, a, b, MGE_CPU_ADD, "add");
}
int mge_sub(struct mge_graph *g, int a, int b) { return binary(g, a, b, MGE_CPU_SUB, "sub"); }
int mge_mul(struct mge_graph *g, int a, int b) { return binary(g, a, b, MGE_CPU_MUL, "mul"); }
int mge_div(struct mge_graph *g, int a, int b) { return binary(g, a, b, MGE_CPU_DIV, "div"); }

static int same_shape_op(struct mge_graph *g, int x, enum mge_op op, const char *name, int act)
{
    if (check_value(g, x, name))
        return -g->err;
    const struct mge_value *X = &g->values[x];
    int out = new_act(g, name, X->ndim, X->shape, X->batched, rg(g, x));
    if (out < 0)
        return out;
    struct mge_node n = {.op = op, .in = {x}, .n_in = 1, .out = {out}, .n_out = 1};
    n.a.act.act = act;
    return emit(g, &n);
}

int mge_bias_add(struct mge_graph *g, int x, int b)
{
    if (check_value(g, x, "bias_add") || check_value(g, b, "bias_add"))
        return -g->err;
    const struct mge_value *X = &g->values[x];
    if (g->values[b].ndim != 1 || g->values[b].shape[0] != X->shape[X->ndim - 1])
        return mge__graph_fail(g, MGE_INVAL, "bias_add: '%s' must be (%lld)", g->values[b].name,
                               (long long)X->shape[X->ndim - 1]);
    int out = new_act(g, "bias_add", X->ndim, X->shape, X->batched, rg(g, x) || rg(g, b));
    if (out < 0)
        return out;
    struct mge_node n = {.op = MGE_OP_BIAS_ACT, .in = {x, b}, .n_in = 2, .out = {out}, .n_out = 1};
    n.a.act.act = MGE_ACT_NONE;
    return emit(g, &n);
}

int mge_relu(struct mge_graph *g, int x)
{
    int y = -1;
    if (mge__quant_wants(g) && mge__quant_fuse_relu(g, x, &y) != MGE_OK)
        return -g->err;
    return y >= 0 ? y : same_shape_op(g, x, MGE_OP_UNARY, "relu", MGE_ACT_FN_RELU);
}
int mge_gelu(struct mge_graph *g, int x) { return same_shape_op(g, x, MGE_OP_UNARY, "gelu", MGE_ACT_FN_GELU); }
int mge_tanh(struct mge_graph *g, int x) { return same_shape_op(g, x, MGE_OP_UNARY, "tanh", MGE_ACT_FN_TANH); }
int mge_sigmoid(struct mge_graph *g, int x) { return same_shape_op(g, x, MGE_OP_UNARY, "sigmoid", MGE_ACT_FN_SIGMOID); }
int mge_softmax(struct mge_graph *g, int x) { return same_shape_op(g, x, MGE_OP_SOFTMAX, "softmax", 0); }
int mge_log_softmax(struct mge_graph *g, int x) { return same_shape_op(g, x, MGE_OP_LOG_SOFTMAX, "log_softmax", 0); }

int mge_cross_entropy(struct mge_graph *g, int logits, int labels)
{
    return mge_cross_entropy_smoothed(g, logits, labels, 0.0f);
}

int mge_cross_entropy_smoothed(struct mge_graph *g, int logits, int labels, float smoothing)
{
    if (check_value(g, logits, "cross_entropy") || check_value(g, labels, "cross_entropy"))
        return -g->err;
    const struct mge_value *L = &g->values[logits], *Y = &g->values[labels];
    int rows_ok = L->ndim >= 2 && Y->ndim == L->ndim - 1 && Y->dtype == MGE_DTYPE_I32;
    for (int i = 0; rows_ok && i < Y->ndim; i++)
        rows_ok = Y->shape[i] == L->shape[i];
    if (!rows_ok)
        return mge__graph_fail(g, MGE_INVAL,
                               "cross_entropy: logits '%s' must be (B, .., V) and labels '%s' "
                               "int32 (B, ..)",
                               L->name, Y->name);
    if (!(smoothing >= 0.0f && smoothing < 1.0f))
        return mge__graph_fail(g, MGE_INVAL, "cross_entropy: label smoothing %g is not in [0, 1)",
                               (double)smoothing);
    int64_t one = 1, ls[MGE_MAX_DIMS];
    int lb = L->batched, lnd = L->ndim;
    memcpy(ls, L->shape, sizeof(ls));
    int loss = new_act(g, "loss", 0, &one, 0, rg(g, logits)); /* L may move from here on */
    int probs = new_act(g, "probs", lnd, ls, lb, 0);
    if (loss < 0 || probs < 0)
        return -g->err;
    struct mge_node n = {.op = MGE_OP_XENT, .in = {logits, labels}, .n_in = 2, .out = {loss, probs},
                         .n_out = 2};
    n.a.xent.smoothing = smoothing;
    return emit(g, &n);
}

static int reduce(struct mge_graph *g, int x, int axis, int mean)
{
    if (check_value(g, x, "reduce"))
        return -g->err;
    const struct mge_value *X = &g->values[x];
    int64_t shape[MGE_MAX_DIMS];
    int ndim = 0, batched = 0;
    if (axis < 0) {
        ndim = 0;
        shape[0] = 1;
    } else {
        if (axis >= X->ndim)
            return mge__graph_fail(g, MGE_INVAL, "reduce: axis %d of '%s' (%d dims)", axis,
                                   X->name, X->ndim);
        for (int i = 0; i < X->ndim; i++)
            if (i != axis)
                shape[ndim++] = X->shape[i];
        batched = X->batched && axis != 0;
    }
    int out = new_act(g, mean ? "mean" : "sum", ndim, shape, batched, rg(g, x));
    if (out < 0)
        return out;
    struct mge_node n = {.op = MGE_OP_REDUCE, .in = {x}, .n_in = 1, .out = {out}, .n_out = 1};
    n.a.red.axis = axis;
    n.a.red.scale = mean ? -1.0f : 1.0f; /* negative: 1/len, resolved at run time */
    return emit(g, &n);
}

int mge_sum(struct mge_graph *g, int x, int axis) { return reduce(g, x, axis, 0); }
int mge_mean(struct mge_graph *g, int x, int axis) { return reduce(g, x, axis, 1); }

int mge_reshape(struct mge_graph *g, int x, int ndim, const int64_t *shape_in)
{
    if (check_value(g, x, "reshape"))
        return -g->err;
    const struct mge_value *X = &g->values[x];
    int64_t shape[MGE_MAX_DIMS], known = 1, total = 1;
    int infer = -1;
    if (ndim < 1 || ndim > MGE_MAX_DIMS)
        return mge__graph_fail(g, MGE_INVAL, "reshape: %d dims", ndim);
    for (int i = 0; i < X->ndim; i++)
        total *= X->shape[i];
    for (int i = 0; i < ndim; i++) {
        shape[i] = shape_in[i];
        if (shape[i] == -1 && infer < 0)
            infer = i;
        else if (shape[i] <= 0)
            return mge__graph_fail(g, MGE_INVAL, "reshape: bad dim %lld", (long long)shape[i]);
        else
            known *= shape[i];
    }
    if (infer >= 0)
        shape[infer] = total / known;
    int64_t got = 1;
    for (int i = 0; i < ndim; i++)
        got *= shape[i];
    if (got != total)
        return mge__graph_fail(g, MGE_INVAL, "reshape: '%s' has %lld elements, not %lld", X->name,
                               (long long)total, (long long)got);
    int batched = X->batched && shape[0] == X->shape[0];
    if (X->batched && !batched)
        return mge__graph_fail(g, MGE_INVAL, "reshape: '%s' must keep its batch dim", X->name);
    int out = new_act(g, "reshape", ndim, shape, batched, rg(g, x));
    if (out < 0)
        return out;
    g->values[out].alias = x;
    g->values[out].producer = -1;
    return out;
}

int mge_flatten(struct mge_graph *g, int x)
{
    if (check_value(g, x, "flatten"))
        return -g->err;
    int64_t shape[2] = {g->values[x].shape[0], -1};
    return mge_reshape(g, x, 2, shape);
}

int mge_transpose(struct mge_graph *g, int x, int d0, int d1)
{
    if (check_value(g, x, "transpose"))
        return -g->err;
    const struct mge_value *X = &g->values[x];
    if (d0 < 0 || d1 < 0 || d0 >= X->ndim || d1 >= X->ndim)
        return mge__graph_fail(g, MGE_INVAL, "transpose: dims %d, %d of '%s'", d0, d1, X->name);
    if (X->batched && (d0 == 0 || d1 == 0) && d0 != d1)
        return mge__graph_fail(g, MGE_UNSUPPORTED, "transpose: cannot move the batch dim of '%s'",
                               X->name);
    int64_t shape[MGE_MAX_DIMS];
    struct mge_node n = {.op = MGE_OP_PERMUTE, .in = {x}, .n_in = 1, .n_out = 1};
    for (int i = 0; i < X->ndim; i++)
        n.a.perm.perm[i] = i;
    n.a.perm.perm[d0] = d1;
    n.a.perm.perm[d1] = d0;
    for (int i = 0; i < X->ndim; i++)
        shape[i] = X->shape[n.a.perm.perm[i]];
    int out = new_act(g, "transpose", X->ndim, shape, X->batched, rg(g, x));
    if (out < 0)
        return out;
    n.out[0] = out;
    return emit(g, &n);
}

int mge_concat(struct mge_graph *g, const int *xs, int nx, int axis)
{
    if (nx < 1)
        return mge__graph_fail(g, MGE_INVAL, "concat: no inputs");
    for (int i = 0; i < nx; i++)
        if (check_value(g, xs[i], "concat"))
            return -g->err;
    const struct mge_value *X0 = &g->values[xs[0]];
    if (axis < 0 || axis >= X0->ndim)
        return mge__graph_fail(g, MGE_INVAL, "concat: axis %d", axis);
    if (axis == 0 && X0->batched)
        return mge__graph_fail(g, MGE_UNSUPPORTED, "concat: not along the batch dim");
    int64_t shape[MGE_MAX_DIMS], total = 0;
    int req = 0;
    for (int i = 0; i < nx; i++) {
        const struct mge_value *X = &g->values[xs[i]];
        if (X->ndim != X0->ndim)
            return mge__graph_fail(g, MGE_INVAL, "concat: '%s' has %d dims", X->name, X->ndim);
        for (int d = 0; d < X->ndim; d++)
            if (d != axis && X->shape[d] != X0->shape[d])
                return mge__graph_fail(g, MGE_INVAL, "concat: '%s' differs at dim %d", X->name, d);
        total += X->shape[axis];
        req |= rg(g, xs[i]);
    }
    for (int d = 0; d < X0->ndim; d++)
        shape[d] = X0->shape[d];
    shape[axis] = total;
    int out = new_act(g, "concat", X0->ndim, shape, X0->batched, req);
    if (out < 0)
        return out;
    int64_t at = 0;
    for (int i = 0; i < nx; i++) {
        struct mge_node n = {.op = MGE_OP_COPY_AXIS, .in = {xs[i]}, .n_in = 1, .out = {out},
                             .n_out = 1};
        n.a.copy.axis = axis;
        n.a.copy.dstart = at;
        n.a.copy.sstart = 0;
        n.a.copy.len = g->values[xs[i]].shape[axis];
        at += n.a.copy.len;
        if (mge__graph_add_node(g, &n) < 0)
            return -g->err;
    }
    return out;
}

int mge_slice(struct mge_graph *g, int x, int axis, int64_t start, int64_t len)
{
    if (check_value(g, x, "slice"))
        return -g->err;
    const struct mge_value *X = &g->values[x];
    if (axis < 0 || axis >= X->ndim || start < 0 || len <= 0 || start + len > X->shape[axis])
        return mge__graph_fail(g, MGE_INVAL, "slice: [%lld, %lld) of axis %d of '%s'",
                               (long long)start, (long long)(start + len), axis, X->name);
    if (axis == 0 && X->batched)
        return mge__graph_fail(g, MGE_UNSUPPORTED, "slice: not along the batch dim");
    int64_t shape[MGE_MAX_DIMS];
    for (int d = 0; d < X->ndim; d++)
        shape[d] = X->shape[d];
    shape[axis] = len;
    int out = new_act(g, "slice", X->ndim, shape, X->batched, rg(g, x));
    if (out < 0)
        return out;
    struct mge_node n = {.op = MGE_OP_COPY_AXIS, .in = {x}, .n_in = 1, .out = {out}, .n_out = 1};
    n.a.copy.axis = axis;
    n.a.copy.dstart = 0;
    n.a.copy.sstart = start;
    n.a.copy.len = len;
    return emit(g, &n);
}

/* Scratch is planned like any activation: one float vector of the kernel's stated size. */
static int scratch_value(struct mge_graph *g, size_t bytes)
{
    if (bytes == 0)
        return -1;
    int64_t n = (int64_t)((bytes + 3) / 4);
    return new_act(g, "scratch", 1, &n, 0, 0);
}

int mge_conv2d(struct mge_graph *g, int x, int w, int b, int stride, int pad)
{
    if (check_value(g, x, "conv2d") || check_value(g, w, "conv2d") ||
        (b >= 0 && check_value(g, b, "conv2d")))
        return -g->err;
    const struct mge_value *X = &g->values[x], *W = &g->values[w];
    if (X->ndim != 4 || W->ndim != 4 || W->shape[1] != X->shape[1])
        return mge__graph_fail(g, MGE_INVAL, "conv2d: '%s' (N,C,H,W) and '%s' (K,C,R,S) disagree",
                               X->name, W->name);
    if (b >= 0 && (g->values[b].ndim != 1 || g->values[b].shape[0] != W->shape[0]))
        return mge__graph_fail(g, MGE_INVAL, "conv2d: bias '%s' must be (%lld)", g->values[b].name,
                               (long long)W->shape[0]);
    struct mge_cpu_conv cv = {.N = (int)X->shape[0], .C = (int)X->shape[1],
                              .H = (int)X->shape[2], .W = (int)X->shape[3],
                              .K = (int)W->shape[0], .R = (int)W->shape[2],
                              .S = (int)W->shape[3], .stride = stride, .pad = pad};
    if (stride < 1 || pad < 0 || mge_cpu_conv_init(&cv) != 0)
        return mge__graph_fail(g, MGE_INVAL, "conv2d: kernel %dx%d stride %d pad %d does not fit %dx%d",
                               cv.R, cv.S, stride, pad, cv.H, cv.W);
    if (mge__quant_wants(g))
        return mge__quant_conv2d(g, x, w, b, stride, pad);
    int64_t shape[4] = {X->shape[0], W->shape[0], cv.P, cv.Q};
    int out = new_act(g, "conv2d", 4, shape, X->batched, rg(g, x) || rg(g, w) || rg(g, b));
    if (out < 0)
        return out;
    int scratch = scratch_value(g, g->bf16 ? mge_cpu_conv_scratch_bytes_bf16(&cv)
                                           : mge_cpu_conv_scratch_bytes(&cv));
    if (g->err)
        return -g->err;
    struct mge_node n = {.op = MGE_OP_CONV2D, .in = {x, w, b}, .n_in = 3, .out = {out, scratch},
                         .n_out = 2};
    n.a.conv.stride = stride;
    n.a.conv.pad = pad;
    return emit(g, &n);
}

static int pool(struct mge_graph *g, int x, int k, int stride, int pad, int max)
{
    if (check_value(g, x, "pool"))
        return -g->err;
    const struct mge_value *X = &g->values[x];
    if (X->ndim != 4)
        return mge__graph_fail(g, MGE_INVAL, "pool: '%s' must be (N,C,H,W)", X->name);
    struct mge_cpu_pool pl = {.N = (int)X->shape[0], .C = (int)X->shape[1], .H = (int)X->shape[2],
                              .W = (int)X->shape[3], .R = k, .S = k, .stride = stride, .pad = pad};
    if (k < 1 || stride < 1 || pad < 0 || mge_cpu_pool_init(&pl) != 0)
        return mge__graph_fail(g, MGE_INVAL, "pool: window %d stride %d pad %d does not fit '%s'",
                               k, stride, pad, X->name);
    int64_t shape[4] = {X->shape[0], X->shape[1], pl.P, pl.Q};
    int out = new_act(g, max ? "maxpool" : "avgpool", 4, shape, X->batched, rg(g, x));
    if (out < 0)
        return out;
    struct mge_node n = {.op = MGE_OP_POOL, .in = {x}, .n_in = 1, .out = {out}, .n_out = 1};
    n.a.pool.max = max;
    n.a.pool.k = k;
    n.a.pool.stride = stride;
    n.a.pool.pad = pad;
    return emit(g, &n);
}

int mge_maxpool2d(struct mge_graph *g, int x, int k, int stride, int pad)
{
    return pool(g, x, k, stride, pad, 1);
}

int mge_avgpool2d(struct mge_graph *g, int x, int k, int stride, int pad)
{
    return pool(g, x, k, stride, pad, 0);
}

int mge_dropout(struct mge_graph *g, int x, float p)
{
    if (!(p >= 0.0f && p < 1.0f))
        return mge__graph_fail(g, MGE_INVAL, "dropout: p must be in [0, 1)");
    int out = same_shape_op(g, x, MGE_OP_DROPOUT, "dropout", 0);
    if (out < 0)
        return out;
    struct mge_node *n = &g->nodes[g->n_nodes - 1];
    n->a.drop.p = p;
    n->a.drop.salt = (uint64_t)(g->n_nodes - 1) * 0x9E3779B97F4A7C15ull;
    return out;
}

int mge_layernorm(struct mge_graph *g, int x, int w, int b, float eps)
{
    if (check_value(g, x, "layernorm") || check_value(g, w, "layernorm") ||
        check_value(g, b, "layernorm"))
        return -g->err;
    const struct mge_value *X = &g->values[x];
    int64_t C = X->shape[X->ndim - 1];
    if (g->values[w].ndim != 1 || g->values[w].shape[0] != C || g->values[b].ndim != 1 ||
        g->values[b].shape[0] != C)
        return mge__graph_fail(g, MGE_INVAL, "layernorm: weight and bias must be (%lld)",
                               (long long)C);
    int64_t rows[MGE_MAX_DIMS];
    int nr = X->ndim - 1 > 0 ? X->ndim - 1 : 1, xb = X->batched;
    for (int i = 0; i < nr; i++)
        rows[i] = X->ndim > 1 ? X->shape[i] : 1;
    int out = new_act(g, "layernorm", X->ndim, X->shape, xb, rg(g, x) || rg(g, w) || rg(g, b));
    int mean = new_act(g, "ln_mean", nr, rows, xb, 0); /* X may have moved: use copies */
    int rstd = new_act(g, "ln_rstd", nr, rows, xb, 0);
    if (out < 0 || mean < 0 || rstd < 0)
        return -g->err;
    struct mge_node n = {.op = MGE_OP_LAYERNORM, .in = {x, w, b}, .n_in = 3,
                         .out = {out, mean, rstd}, .n_out = 3};
    n.a.ln.eps = eps;
    return emit(g, &n);
}

/* Whether @v is a (C) vector: -1 (absent) passes when @optional. */
static int is_channel_vector(const struct mge_graph *g, int v, int64_t C, int optional)
{
    if (v < 0)
        return optional;
    return v < g->n_values && g->values[v].ndim == 1 && g->values[v].shape[0] == C;
}

int mge_batchnorm2d(struct mge_graph *g, int x, int w, int b, int running_mean, int running_var,
                    float eps, float momentum)
{
    if (check_value(g, x, "batchnorm2d") || (w >= 0 && check_value(g, w, "batchnorm2d")) ||
        (b >= 0 && check_value(g, b, "batchnorm2d")) ||
        check_value(g, running_mean, "batchnorm2d") || check_value(g, running_var, "batchnorm2d"))
        return -g->err;
    const struct mge_value *X = &g->values[x];
    if (X->ndim != 4)
        return mge__graph_fail(g, MGE_INVAL, "batchnorm2d: '%s' must be (N,C,H,W)", X->name);
    int64_t C = X->shape[1];
    if (!is_channel_vector(g, w, C, 1) || !is_channel_vector(g, b, C, 1))
        return mge__graph_fail(g, MGE_INVAL, "batchnorm2d: weight and bias must be (%lld)",
                               (long long)C);
    if (!is_channel_vector(g, running_mean, C, 0) || !is_channel_vector(g, running_var, C, 0) ||
        !mge_value_is_buffer(g, running_mean) || !mge_value_is_buffer(g, running_var))
        return mge__graph_fail(g, MGE_INVAL,
                               "batchnorm2d: running mean and variance must be (%lld) buffers",
                               (long long)C);
    if (!(eps > 0.0f) || !(momentum >= 0.0f && momentum <= 1.0f))
        return mge__graph_fail(g, MGE_INVAL,
                               "batchnorm2d: eps %g must be > 0, momentum %g in [0, 1]",
                               (double)eps, (double)momentum);
    int fused = -1;
    if (mge__quant_wants(g) &&
        mge__quant_fuse_batchnorm(g, x, w, b, running_mean, running_var, eps, &fused) != MGE_OK)
        return -g->err;
    if (fused >= 0)
        return fused;
    int req = rg(g, x) || rg(g, w) || rg(g, b), xb = X->batched;
    int out = new_act(g, "batchnorm", 4, X->shape, xb, req); /* X may move from here on */
    int mean = new_act(g, "bn_mean", 1, &C, 0, 0);
    int rstd = new_act(g, "bn_rstd", 1, &C, 0, 0);
    if (out < 0 || mean < 0 || rstd < 0)
        return -g->err;
    struct mge_node n = {.op = MGE_OP_BATCHNORM,
                         .in = {x, w, b, running_mean, running_var},
                         .n_in = 5,
                         .out = {out, mean, rstd},
                         .n_out = 3};
    n.a.bn.eps = eps;
    n.a.bn.momentum = momentum;
    return emit(g, &n);
}

int mge_global_avgpool2d(struct mge_graph *g, int x)
{
    if (check_value(g, x, "global_avgpool2d"))
        return -g->err;
    const struct mge_value *X = &g->values[x];
    if (X->ndim != 4)
        return mge__graph_fail(g, MGE_INVAL, "global_avgpool2d: '%s' must be (N,C,H,W)", X->name);
    int64_t shape[3] = {X->shape[0], X->shape[1], X->shape[2] * X->shape[3]};
    return mge_mean(g, mge_reshape(g, x, 3, shape), 2);
}

int mge_embedding(struct mge_graph *g, int ids, int table)
{
    if (check_value(g, ids, "embedding") || check_value(g, table, "embedding"))
        return -g->err;
    const struct mge_value *I = &g->values[ids], *T = &g->values[table];
    if (I->dtype != MGE_DTYPE_I32 || T->ndim != 2 || I->ndim + 1 > MGE_MAX_DIMS)
        return mge__graph_fail(g, MGE_INVAL, "embedding: ids '%s' int32, table '%s' (V, C)",
                               I->name, T->name);
    int64_t shape[MGE_MAX_DIMS];
    for (int i = 0; i < I->ndim; i++)
        shape[i] = I->shape[i];
    shape[I->ndim] = T->shape[1];
    int out = new_act(g, "embedding", I->ndim + 1, shape, I->batched, rg(g, table));
    if (out < 0)
        return out;
    struct mge_node n = {.op = MGE_OP_EMBEDDING, .in = {ids, table}, .n_in = 2, .out = {out},
                         .n_out = 1};
    return emit(g, &n);
}

int mge_causal_attention(struct mge_graph *g, int qkv, int heads)
{
    if (check_value(g, qkv, "causal_attention"))
        return -g->err;
    const struct mge_value *X = &g->values[qkv];
    int64_t C = X->ndim == 3 ? X->shape[2] / 3 : 0;
    if (X->ndim != 3 || X->shape[2] % 3 != 0 || heads < 1 || C % heads != 0 ||
        C / heads > MGE_CPU_ATTN_MAX_HEAD)
        return mge__graph_fail(g, MGE_INVAL,
                               "causal_attention: '%s' must be (B, T, 3C) with C a multiple of "
                               "%d heads of at most %d",
                               X->name, heads, MGE_CPU_ATTN_MAX_HEAD);
    int64_t ys[3] = {X->shape[0], X->shape[1], C}, ls[3] = {X->shape[0], heads, X->shape[1]};
    int xb = X->batched, req = rg(g, qkv);
    int out = new_act(g, "attention", 3, ys, xb, req); /* X may move from here on */
    int lse = new_act(g, "attn_lse", 3, ls, xb, 0);
    if (out < 0 || lse < 0)
        return -g->err;
    struct mge_node n = {
        .op = MGE_OP_ATTENTION, .in = {qkv}, .n_in = 1, .out = {out, lse}, .n_out = 2};
    n.a.attn.heads = heads;
    return emit(g, &n);
}
