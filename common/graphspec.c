/*
 * graphspec.c: model.type graph: model.nodes read from jobspec.c's YAML tree into struct
 * mge_graphspec, with the structure (names, ops, attributes, inputs, cycles, unused nodes) and
 * every node's shape checked here, in common/, so the coordinator refuses what mge-train would.
 */
#include "graphspec.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "err.h"
#include "jobspec_int.h"

#define DIM_MAX (1 << 24)            /* one dimension of a declared shape */
#define FEATURES_MAX (1 << 20)       /* out_features, out_channels */
#define KERNEL_MAX 1024              /* kernel, stride, padding */
#define NUMEL_MAX ((int64_t)1 << 32) /* elements of one sample, and of one weight */

/* ------------------------------------------------------------------------------------------ */
/* Ops and their attributes                                                                    */

enum attr {
    A_OUT_FEATURES = 1 << 0,
    A_OUT_CHANNELS = 1 << 1,
    A_KERNEL = 1 << 2,
    A_STRIDE = 1 << 3,
    A_PADDING = 1 << 4,
    A_BIAS = 1 << 5,
    A_INIT = 1 << 6,
    A_EPS = 1 << 7,
    A_MOMENTUM = 1 << 8,
    A_P = 1 << 9,
    A_AXIS = 1 << 10,
    A_SHAPE = 1 << 11,
    A_VOCAB = 1 << 12,
    A_CONTEXT = 1 << 13,
    A_D_MODEL = 1 << 14,
    A_HEADS = 1 << 15,
    A_TIED_TO = 1 << 16,
    A_RESIDUAL_LAYERS = 1 << 17,
};

/* Every key a node may have, in the order nodes print (JSON); attrs[i] is bit 1 << (i - 3). */
static const char *const node_keys[] = {
    "name",    "op",    "inputs",  "out_features", "out_channels", "kernel",  "stride",
    "padding", "bias",  "init",    "eps",          "momentum",     "p",       "axis",
    "shape",   "vocab", "context", "d_model",      "heads",        "tied_to", "residual_layers",
    NULL,
};
enum { N_COMMON_KEYS = 3 };

static const char *const op_names[] = {
    "input",   "linear",    "conv2d",        "batchnorm2d",      "layernorm",
    "relu",    "gelu",      "tanh",          "sigmoid",          "add",
    "sub",     "mul",       "maxpool",       "avgpool",          "global_avgpool",
    "flatten", "reshape",   "dropout",       "concat",           "cross_entropy",
    "tokens",  "embedding", "pos_embedding", "causal_attention", "tied_linear",
    NULL,
};
_Static_assert(sizeof(op_names) / sizeof(op_names[0]) == MGE_GOP_COUNT + 1,
               "op_names lists every enum mge_gop");

struct opdef {
    int min_in, max_in;
    unsigned attrs; /* enum attr bits the op takes */
};

static const struct opdef ops[MGE_GOP_COUNT] = {
    [MGE_GOP_INPUT] = {0, 0, A_SHAPE},
    [MGE_GOP_LINEAR] = {1, 1, A_OUT_FEATURES | A_BIAS | A_INIT | A_RESIDUAL_LAYERS},
    [MGE_GOP_CONV2D] = {1, 1, A_OUT_CHANNELS | A_KERNEL | A_STRIDE | A_PADDING | A_BIAS | A_INIT},
    [MGE_GOP_BATCHNORM2D] = {1, 1, A_EPS | A_MOMENTUM},
    [MGE_GOP_LAYERNORM] = {1, 1, A_EPS},
    [MGE_GOP_RELU] = {1, 1, 0},
    [MGE_GOP_GELU] = {1, 1, 0},
    [MGE_GOP_TANH] = {1, 1, 0},
    [MGE_GOP_SIGMOID] = {1, 1, 0},
    [MGE_GOP_ADD] = {2, 2, 0},
    [MGE_GOP_SUB] = {2, 2, 0},
    [MGE_GOP_MUL] = {2, 2, 0},
    [MGE_GOP_MAXPOOL] = {1, 1, A_KERNEL | A_STRIDE | A_PADDING},
    [MGE_GOP_AVGPOOL] = {1, 1, A_KERNEL | A_STRIDE | A_PADDING},
    [MGE_GOP_GLOBAL_AVGPOOL] = {1, 1, 0},
    [MGE_GOP_FLATTEN] = {1, 1, 0},
    [MGE_GOP_RESHAPE] = {1, 1, A_SHAPE},
    [MGE_GOP_DROPOUT] = {1, 1, A_P},
    [MGE_GOP_CONCAT] = {2, MGE_GRAPH_MAX_INPUTS, A_AXIS},
    [MGE_GOP_CROSS_ENTROPY] = {1, 1, 0},
    [MGE_GOP_TOKENS] = {0, 0, A_CONTEXT | A_VOCAB},
    [MGE_GOP_EMBEDDING] = {1, 1, A_VOCAB | A_D_MODEL},
    [MGE_GOP_POS_EMBEDDING] = {1, 1, A_CONTEXT},
    [MGE_GOP_CAUSAL_ATTENTION] = {1, 1, A_HEADS},
    [MGE_GOP_TIED_LINEAR] = {1, 1, A_TIED_TO},
};

static const char *const init_names[] = {"uniform", "kaiming_normal", "normal", NULL};

const char *mge_gop_name(enum mge_gop op)
{
    return (unsigned)op < MGE_GOP_COUNT ? op_names[op] : "unknown";
}

void mge_graphspec_free(struct mge_graphspec *gs)
{
    if (!gs)
        return;
    mge_free(gs->nodes);
    mge_free(gs->order);
    mge_free(gs);
}

bool mge_graphspec_reads_tokens(const struct mge_graphspec *gs)
{
    return gs && gs->input >= 0 && gs->nodes[gs->input].op == MGE_GOP_TOKENS;
}

int64_t mge_graphspec_input_numel(const struct mge_graphspec *gs)
{
    const struct mge_gnode *x = &gs->nodes[gs->input];
    int64_t n = 1;
    for (int d = 0; d < x->ndim; d++)
        n *= x->shape[d];
    return n;
}

/* ------------------------------------------------------------------------------------------ */
/* Errors: "FILE:LINE: model.nodes[I].KEY: node `NAME`: WHAT"                                    */

struct gctx {
    struct ctx *c;
    struct mge_graphspec *gs;
    const struct tnode *seq;          /* model.nodes */
    const struct mge_gnode **by_name; /* gs->nodes sorted by name, then by place */
};

static int fail_node(struct gctx *g, const struct tnode *at, int i, const char *key,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int fail_node(struct gctx *g, const struct tnode *at, int i, const char *key,
                     const char *fmt, ...)
{
    char what[384], path[96];
    const char *name = g->gs->nodes[i].name;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    snprintf(path, sizeof(path), "model.nodes[%d]%s%s", i, key ? "." : "", key ? key : "");
    if (!at)
        at = g->seq->kids[i];
    if (name[0])
        return mge__spec_fail(g->c, at, path, "node `%s`: %s", name, what);
    return mge__spec_fail(g->c, at, path, "%s", what);
}

/* "[128,16,28,28]" */
static void shape_text(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t o = 0;
    o += (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%" PRId64, d ? "," : "", shape[d]);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
}

/* ------------------------------------------------------------------------------------------ */
/* Reading one node                                                                            */

/* The value of key @name in map @m, NULL when absent or null; *@keyp its key node. */
static const struct tnode *map_get(const struct tnode *m, const char *name,
                                   const struct tnode **keyp)
{
    for (size_t i = 0; i + 1 < m->n; i += 2) {
        const struct tnode *k = m->kids[i];
        if (k->kind == TN_SCALAR && !strcmp(k->str, name) && strlen(name) == k->len) {
            if (keyp)
                *keyp = k;
            return mge__spec_is_null(m->kids[i + 1]) ? NULL : m->kids[i + 1];
        }
    }
    if (keyp)
        *keyp = NULL;
    return NULL;
}

static int fail_got(struct gctx *g, const struct tnode *v, int i, const char *key, const char *what)
{
    char got[192];
    mge__spec_describe(got, sizeof(got), v);
    return fail_node(g, v, i, key, "expected %s, got %s", what, got);
}

/* Keys: known, not twice, and used by op @op (-1: not known yet). */
static int check_keys(struct gctx *g, const struct tnode *m, int i, int op)
{
    for (size_t k = 0; k + 1 < m->n; k += 2) {
        const struct tnode *key = m->kids[k];
        char name[64];
        int idx = -1;
        if (key->kind != TN_SCALAR || strlen(key->str) != key->len) {
            mge__spec_describe(name, sizeof(name), key);
            return fail_node(g, key, i, NULL, "expected a key name, got %s", name);
        }
        mge__spec_sanitize(name, sizeof(name), key->str, key->len, 40);
        for (int j = 0; node_keys[j]; j++)
            if (!strcmp(node_keys[j], key->str))
                idx = j;
        if (idx < 0) {
            const char *hint = mge__spec_suggest(key->str, node_keys);
            if (hint)
                return fail_node(g, key, i, name, "unknown key (did you mean '%s'?)", hint);
            return fail_node(g, key, i, name, "unknown key");
        }
        for (size_t j = 0; j < k; j += 2)
            if (!strcmp(m->kids[j]->str, key->str))
                return fail_node(g, key, i, name, "duplicate key (first given at line %d)",
                                 m->kids[j]->line);
        if (op >= 0 && idx >= N_COMMON_KEYS && !(ops[op].attrs & (1u << (idx - N_COMMON_KEYS))) &&
            !mge__spec_is_null(m->kids[k + 1]))
            return fail_node(g, key, i, name, "not used by op '%s'", op_names[op]);
    }
    return MGE_OK;
}

static int get_name(struct gctx *g, const struct tnode *m, int i, struct mge_gnode *nd)
{
    static const char what[] = "a node name of 1 to 48 letters, digits, '.', '_' or '-'";
    const struct tnode *k, *v = map_get(m, "name", &k);
    if (!v)
        return fail_node(g, k ? k : m, i, "name", "required key is missing (expected %s)", what);
    if (!mge__spec_is_name(v, MGE_GRAPH_NAME_MAX))
        return fail_got(g, v, i, "name", what);
    memcpy(nd->name, v->str, v->len + 1);
    nd->line = v->line;
    return MGE_OK;
}

static int get_op(struct gctx *g, const struct tnode *m, int i, struct mge_gnode *nd)
{
    const struct tnode *k, *v = map_get(m, "op", &k);
    char got[192];
    if (!v)
        return fail_node(g, k ? k : m, i, "op", "required key is missing (expected one of %s)",
                         "input, linear, conv2d, ... (docs/job-spec.md)");
    if (v->kind == TN_SCALAR && strlen(v->str) == v->len) {
        for (int j = 0; op_names[j]; j++) {
            if (!strcmp(v->str, op_names[j])) {
                nd->op = (enum mge_gop)j;
                return MGE_OK;
            }
        }
    }
    mge__spec_describe(got, sizeof(got), v);
    const char *hint = v->kind == TN_SCALAR ? mge__spec_suggest(v->str, op_names) : NULL;
    if (hint)
        return fail_node(g, v, i, "op", "unknown op %s (did you mean '%s'?)", got, hint);
    return fail_node(g, v, i, "op", "unknown op %s (ops: docs/job-spec.md, \"Graph models\")", got);
}

/* Integer attribute @key in [@lo, @hi]; @def < @lo means required. */
static int get_int_attr(struct gctx *g, const struct tnode *m, int i, const char *key, int64_t lo,
                        int64_t hi, int64_t def, int64_t *out)
{
    char what[96];
    const struct tnode *v = map_get(m, key, NULL);
    int64_t x;
    snprintf(what, sizeof(what), "an integer between %" PRId64 " and %" PRId64, lo, hi);
    if (!v) {
        if (def < lo)
            return fail_node(g, m, i, key, "required key is missing (expected %s)", what);
        *out = def;
        return MGE_OK;
    }
    if (!mge__spec_int(v, &x) || x < lo || x > hi)
        return fail_got(g, v, i, key, what);
    *out = x;
    return MGE_OK;
}

static int get_int_attr32(struct gctx *g, const struct tnode *m, int i, const char *key, int lo,
                          int hi, int def, int *out)
{
    int64_t x;
    int rc = get_int_attr(g, m, i, key, lo, hi, def, &x);
    if (rc == MGE_OK)
        *out = (int)x;
    return rc;
}

/* Number in (@lo, @hi) (@closed_hi: up to @hi included), default @def. */
static int get_num_attr(struct gctx *g, const struct tnode *m, int i, const char *key, double lo,
                        int open_lo, double hi, int open_hi, double def, double *out)
{
    char what[96];
    const struct tnode *v = map_get(m, key, NULL);
    double x;
    snprintf(what, sizeof(what), "a number in %c%g, %g%c", open_lo ? '(' : '[', lo, hi,
             open_hi ? ')' : ']');
    if (!v) {
        *out = def;
        return MGE_OK;
    }
    if (!mge__spec_num(v, &x) || (open_lo ? x <= lo : x < lo) || (open_hi ? x >= hi : x > hi))
        return fail_got(g, v, i, key, what);
    *out = x;
    return MGE_OK;
}

/* shape: 1..5 integers, each 1..DIM_MAX (reshape: or one -1). */
static int get_shape(struct gctx *g, const struct tnode *m, int i, struct mge_gnode *nd,
                     bool reshape)
{
    const char *what = reshape ? "a list of 1 to 5 integers (one may be -1), without the batch dim"
                               : "a list of 1 to 5 integers, the sample's shape without the batch "
                                 "dim ([1, 28, 28], [784])";
    const struct tnode *v = map_get(m, "shape", NULL);
    int minus = 0;
    if (!v)
        return fail_node(g, m, i, "shape", "required key is missing (expected %s)", what);
    if (v->kind != TN_SEQ || v->n < 1 || v->n > MGE_GRAPH_MAX_DIMS - 1)
        return fail_got(g, v, i, "shape", what);
    for (size_t d = 0; d < v->n; d++) {
        int64_t x;
        bool ok =
            mge__spec_int(v->kids[d], &x) && ((x >= 1 && x <= DIM_MAX) || (reshape && x == -1));
        if (ok && x == -1 && minus++)
            ok = false;
        if (!ok) {
            char got[192];
            mge__spec_describe(got, sizeof(got), v->kids[d]);
            return fail_node(g, v->kids[d], i, "shape", "item %zu: expected %s, got %s", d + 1,
                             reshape ? "an integer between 1 and 16777216, or one -1"
                                     : "an integer between 1 and 16777216",
                             got);
        }
        nd->shape[d] = x;
    }
    nd->ndim = (int)v->n;
    return MGE_OK;
}

static int get_attrs(struct gctx *g, const struct tnode *m, int i, struct mge_gnode *nd)
{
    unsigned a = ops[nd->op].attrs;
    int rc = MGE_OK;
    bool b;
    const struct tnode *v;

    nd->bias = 1;
    if (a & A_OUT_FEATURES)
        rc = get_int_attr(g, m, i, "out_features", 1, FEATURES_MAX, 0, &nd->features);
    if (!rc && (a & A_OUT_CHANNELS))
        rc = get_int_attr(g, m, i, "out_channels", 1, FEATURES_MAX, 0, &nd->features);
    if (!rc && (a & A_KERNEL))
        rc = get_int_attr32(g, m, i, "kernel", 1, KERNEL_MAX, 0, &nd->kernel);
    /* PyTorch: a pool's stride defaults to its kernel, a conv's to 1 */
    if (!rc && (a & A_STRIDE))
        rc = get_int_attr32(g, m, i, "stride", 1, KERNEL_MAX,
                            nd->op == MGE_GOP_CONV2D ? 1 : nd->kernel, &nd->stride);
    if (!rc && (a & A_PADDING))
        rc = get_int_attr32(g, m, i, "padding", 0, KERNEL_MAX, 0, &nd->padding);
    if (!rc && (a & A_BIAS) && (v = map_get(m, "bias", NULL))) {
        if (!mge__spec_bool(v, &b))
            return fail_got(g, v, i, "bias", "true or false");
        nd->bias = b;
    }
    if (!rc && (a & A_INIT) && (v = map_get(m, "init", NULL))) {
        /* conv2d: uniform or kaiming_normal; linear: uniform or normal */
        enum mge_ginit other =
            nd->op == MGE_GOP_CONV2D ? MGE_GINIT_KAIMING_NORMAL : MGE_GINIT_NORMAL;
        int k = -1;
        for (int j = 0; init_names[j]; j++)
            if (v->kind == TN_SCALAR && !strcmp(v->str, init_names[j]) &&
                (j == MGE_GINIT_UNIFORM || j == (int)other))
                k = j;
        if (k < 0)
            return fail_got(g, v, i, "init",
                            other == MGE_GINIT_NORMAL ? "uniform or normal"
                                                      : "uniform or kaiming_normal");
        nd->init = (enum mge_ginit)k;
    }
    if (!rc && (a & A_RESIDUAL_LAYERS) && (v = map_get(m, "residual_layers", NULL))) {
        if (nd->init != MGE_GINIT_NORMAL)
            return fail_node(g, v, i, "residual_layers",
                             "scales init normal: give init: normal with it");
        rc = get_int_attr32(g, m, i, "residual_layers", 1, 1 << 20, 0, &nd->residual_layers);
    }
    if (!rc && (a & A_VOCAB))
        rc = get_int_attr(g, m, i, "vocab", 2, 1 << 24, 0, &nd->vocab);
    if (!rc && (a & A_CONTEXT))
        rc = get_int_attr(g, m, i, "context", 1, 1 << 20, 0, &nd->context);
    if (!rc && (a & A_D_MODEL))
        rc = get_int_attr(g, m, i, "d_model", 1, 65536, 0, &nd->d_model);
    if (!rc && (a & A_HEADS))
        rc = get_int_attr32(g, m, i, "heads", 1, 1024, 0, &nd->heads);
    if (!rc && (a & A_EPS))
        rc = get_num_attr(g, m, i, "eps", 0, 1, 1, 1, 1e-5, &nd->eps);
    if (!rc && (a & A_MOMENTUM))
        rc = get_num_attr(g, m, i, "momentum", 0, 0, 1, 0, 0.1, &nd->momentum);
    if (!rc && (a & A_P))
        rc = get_num_attr(g, m, i, "p", 0, 0, 1, 1, 0.5, &nd->p);
    if (!rc && (a & A_AXIS))
        rc = get_int_attr32(g, m, i, "axis", -(MGE_GRAPH_MAX_DIMS - 1), MGE_GRAPH_MAX_DIMS - 1, 1,
                            &nd->axis);
    if (!rc && nd->op == MGE_GOP_CONCAT && nd->axis == 0)
        return fail_node(g, map_get(m, "axis", NULL), i, "axis",
                         "axis 0 is the batch: concat along a dim >= 1 (or < 0 from the end)");
    if (!rc && (a & A_SHAPE))
        rc = get_shape(g, m, i, nd, nd->op == MGE_GOP_RESHAPE);
    return rc;
}

static int cmp_name(const void *a, const void *b)
{
    const struct mge_gnode *x = *(const struct mge_gnode *const *)a;
    const struct mge_gnode *y = *(const struct mge_gnode *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x > y) - (x < y);
}

static int cmp_key(const void *key, const void *elem)
{
    return strcmp(key, (*(const struct mge_gnode *const *)elem)->name);
}

/* Index the names (g->by_name) and refuse the first node that repeats an earlier one's. */
static int index_names(struct gctx *g)
{
    const struct mge_graphspec *gs = g->gs;
    const struct mge_gnode *dup = NULL, *first = NULL;
    char path[64];
    int run = 0;
    g->by_name = mge_calloc((size_t)gs->n, sizeof(*g->by_name));
    if (!g->by_name)
        return mge__spec_nomem(g->c);
    for (int i = 0; i < gs->n; i++)
        g->by_name[i] = &gs->nodes[i];
    qsort(g->by_name, (size_t)gs->n, sizeof(*g->by_name), cmp_name);
    for (int i = 1; i < gs->n; i++) {
        if (strcmp(g->by_name[run]->name, g->by_name[i]->name) != 0)
            run = i; /* a run of equal names starts with its earliest node */
        else if (!dup || g->by_name[i] < dup) {
            dup = g->by_name[i];
            first = g->by_name[run];
        }
    }
    if (!dup)
        return MGE_OK;
    int i = (int)(dup - gs->nodes);
    snprintf(path, sizeof(path), "model.nodes[%d].name", i);
    return mge__spec_fail(g->c, map_get(g->seq->kids[i], "name", NULL), path,
                          "duplicate node name `%s` (first given at line %d)", dup->name,
                          first->line);
}

/* Node named by scalar @e (in @key of node @i, called @what in the message) into *@out. */
static int find_node(struct gctx *g, const struct tnode *e, int i, const char *key,
                     const char *what, int *out)
{
    const struct mge_gnode **hit = NULL;
    char got[192];
    if (e->kind == TN_SCALAR && strlen(e->str) == e->len)
        hit = bsearch(e->str, g->by_name, (size_t)g->gs->n, sizeof(*g->by_name), cmp_key);
    if (hit) {
        *out = (int)(*hit - g->gs->nodes);
        return MGE_OK;
    }
    const char *names[65];
    int nn = 0;
    mge__spec_describe(got, sizeof(got), e);
    /* suggest among the first 64 names: enough for a typo, bounded for the fuzzer */
    for (int j = 0; j < g->gs->n && nn < 64; j++)
        names[nn++] = g->gs->nodes[j].name;
    names[nn] = NULL;
    const char *hint = e->kind == TN_SCALAR ? mge__spec_suggest(e->str, names) : NULL;
    if (hint)
        return fail_node(g, e, i, key, "%s %s is not a node (did you mean `%s`?)", what, got, hint);
    return fail_node(g, e, i, key, "%s %s is not a node of the graph", what, got);
}

/* inputs: a name or a list of names, each a node of the graph; arity as the op wants. */
static int get_inputs(struct gctx *g, const struct tnode *m, int i, struct mge_gnode *nd)
{
    const struct opdef *op = &ops[nd->op];
    const struct tnode *v = map_get(m, "inputs", NULL);
    const struct tnode *one[1] = {v};
    const struct tnode *const *items = one;
    size_t n = v ? 1 : 0;
    char what[96];

    if (op->max_in == 0)
        snprintf(what, sizeof(what), "no inputs");
    else if (op->min_in == op->max_in)
        snprintf(what, sizeof(what), "%d input%s", op->min_in, op->min_in == 1 ? "" : "s");
    else
        snprintf(what, sizeof(what), "%d to %d inputs", op->min_in, op->max_in);
    if (v && v->kind == TN_SEQ) {
        items = (const struct tnode *const *)v->kids;
        n = v->n;
    } else if (v && v->kind != TN_SCALAR) {
        return fail_got(g, v, i, "inputs", "a node name or a list of node names");
    }
    if ((int)n < op->min_in || (int)n > op->max_in) {
        if (!v)
            return fail_node(g, m, i, "inputs", "required key is missing (%s takes %s)",
                             op_names[nd->op], what);
        return fail_node(g, v, i, "inputs", "%s takes %s, got %zu", op_names[nd->op], what, n);
    }
    for (size_t k = 0; k < n; k++) {
        int rc = find_node(g, items[k], i, "inputs", "input", &nd->inputs[k]);
        if (rc)
            return rc;
    }
    nd->n_inputs = (int)n;
    return MGE_OK;
}

/* tied_to: the name of the embedding node whose weight the output layer reuses. */
static int get_tied(struct gctx *g, const struct tnode *m, int i, struct mge_gnode *nd)
{
    const struct tnode *v = map_get(m, "tied_to", NULL);
    nd->tied = -1;
    if (!(ops[nd->op].attrs & A_TIED_TO))
        return MGE_OK;
    if (!v)
        return fail_node(g, m, i, "tied_to",
                         "required key is missing (expected the name of an embedding node)");
    return find_node(g, v, i, "tied_to", "tied_to", &nd->tied);
}

/* ------------------------------------------------------------------------------------------ */
/* Order: inputs before the nodes that read them; cycles and unused nodes are errors           */

enum { WHITE, GRAY, BLACK };

struct topo {
    struct gctx *g;
    char *color;
    int *stack; /* the path being visited (a node is on it at most once) */
    int *next;  /* stack[d]'s next input to visit */
    int depth, n_out;
};

/* Node @v is on the stack again: the cycle is the stack from v's place, each reading the next. */
static int fail_cycle(struct topo *t, int v)
{
    const struct mge_graphspec *gs = t->g->gs;
    char path[320];
    size_t o = 0;
    int k = t->depth - 1;
    while (k > 0 && t->stack[k] != v)
        k--;
    for (int j = k; j < t->depth && o < sizeof(path); j++)
        o += (size_t)snprintf(path + o, sizeof(path) - o, "`%s` reads ",
                              gs->nodes[t->stack[j]].name);
    if (o < sizeof(path))
        snprintf(path + o, sizeof(path) - o, "`%s`", gs->nodes[v].name);
    return fail_node(t->g, NULL, v, "inputs", "the graph has a cycle: %s", path);
}

/* Post-order from @root, inputs in their order, with an explicit stack (no recursion). */
static int visit(struct topo *t, int root)
{
    const struct mge_graphspec *gs = t->g->gs;
    if (t->color[root] == BLACK)
        return MGE_OK;
    t->color[root] = GRAY;
    t->stack[0] = root;
    t->next[0] = 0;
    t->depth = 1;
    while (t->depth > 0) {
        int v = t->stack[t->depth - 1];
        if (t->next[t->depth - 1] < gs->nodes[v].n_inputs) {
            int u = gs->nodes[v].inputs[t->next[t->depth - 1]++];
            if (t->color[u] == GRAY)
                return fail_cycle(t, u);
            if (t->color[u] == WHITE) {
                t->color[u] = GRAY;
                t->stack[t->depth] = u;
                t->next[t->depth++] = 0;
            }
        } else {
            t->color[v] = BLACK;
            gs->order[t->n_out++] = v;
            t->depth--;
        }
    }
    return MGE_OK;
}

/* Depth-first, inputs first, nodes in listed order: a listed order that works is kept. */
static int order_nodes(struct gctx *g)
{
    struct mge_graphspec *gs = g->gs;
    struct topo t = {.g = g};
    int rc = MGE_OK;
    t.color = mge_calloc((size_t)gs->n, 1);
    t.stack = mge_calloc((size_t)gs->n, sizeof(int));
    t.next = mge_calloc((size_t)gs->n, sizeof(int));
    gs->order = mge_calloc((size_t)gs->n, sizeof(int));
    if (!t.color || !t.stack || !t.next || !gs->order) {
        rc = mge__spec_nomem(g->c);
        goto out_free;
    }
    for (int v = 0; v < gs->n && !rc; v++)
        rc = visit(&t, v);
    if (rc)
        goto out_free;
    /* every node must lead to the loss: walk back from it (reverse order is enough) */
    memset(t.color, 0, (size_t)gs->n);
    t.color[gs->loss] = 1;
    for (int k = gs->n - 1; k >= 0; k--) {
        const struct mge_gnode *nd = &gs->nodes[gs->order[k]];
        if (t.color[gs->order[k]])
            for (int j = 0; j < nd->n_inputs; j++)
                t.color[nd->inputs[j]] = 1;
    }
    for (int v = 0; v < gs->n; v++) {
        if (!t.color[v]) {
            rc = fail_node(g, NULL, v, NULL,
                           "does not lead to the loss node `%s` (remove it, or use its output)",
                           gs->nodes[gs->loss].name);
            break;
        }
    }
out_free:
    mge_free(t.color);
    mge_free(t.stack);
    mge_free(t.next);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Shapes                                                                                      */

static const struct mge_gnode *in_node(const struct mge_graphspec *gs, const struct mge_gnode *nd,
                                       int k)
{
    return &gs->nodes[nd->inputs[k]];
}

static int fail_rank(struct gctx *g, int i, const struct mge_gnode *x, const char *want)
{
    char s[128];
    shape_text(s, sizeof(s), x->out_ndim, x->out_shape);
    return fail_node(g, NULL, i, "inputs", "input `%s` has shape %s; %s takes %s", x->name, s,
                     mge_gop_name(g->gs->nodes[i].op), want);
}

static int fail_pair(struct gctx *g, int i, const struct mge_gnode *a, const struct mge_gnode *b,
                     const char *why)
{
    char sa[128], sb[128];
    shape_text(sa, sizeof(sa), a->out_ndim, a->out_shape);
    shape_text(sb, sizeof(sb), b->out_ndim, b->out_shape);
    return fail_node(g, NULL, i, "inputs", "input `%s` has shape %s, `%s` has %s%s", a->name, sa,
                     b->name, sb, why);
}

static int64_t numel_from(const int64_t *shape, int from, int ndim)
{
    int64_t n = 1;
    for (int d = from; d < ndim; d++)
        n *= shape[d];
    return n;
}

/* Output size of a conv or pool along one dim: floor((n + 2 pad - k) / stride) + 1, or 0. */
static int64_t window_out(int64_t n, int k, int stride, int pad)
{
    int64_t span = n + 2 * (int64_t)pad - k;
    return span < 0 ? 0 : span / stride + 1;
}

static int infer_window(struct gctx *g, int i, struct mge_gnode *nd, const struct mge_gnode *x)
{
    char s[128];
    if (x->out_ndim != 4)
        return fail_rank(g, i, x, "4 dims (N, C, H, W)");
    if (nd->op != MGE_GOP_CONV2D && 2 * nd->padding > nd->kernel)
        return fail_node(g, NULL, i, "padding",
                         "padding %d is more than half of kernel %d (as PyTorch refuses)",
                         nd->padding, nd->kernel);
    int64_t h = window_out(x->out_shape[2], nd->kernel, nd->stride, nd->padding);
    int64_t w = window_out(x->out_shape[3], nd->kernel, nd->stride, nd->padding);
    if (h < 1 || w < 1) {
        shape_text(s, sizeof(s), x->out_ndim, x->out_shape);
        return fail_node(g, NULL, i, "kernel",
                         "kernel %d with padding %d does not fit input `%s` of shape %s",
                         nd->kernel, nd->padding, x->name, s);
    }
    nd->out_ndim = 4;
    nd->out_shape[0] = x->out_shape[0];
    nd->out_shape[1] = nd->op == MGE_GOP_CONV2D ? nd->features : x->out_shape[1];
    nd->out_shape[2] = h;
    nd->out_shape[3] = w;
    if (nd->op == MGE_GOP_CONV2D &&
        x->out_shape[1] * nd->kernel * nd->kernel > NUMEL_MAX / nd->features)
        return fail_node(g, NULL, i, "out_channels",
                         "the weight [%" PRId64 ",%" PRId64 ",%d,%d] is too large", nd->features,
                         x->out_shape[1], nd->kernel, nd->kernel);
    return MGE_OK;
}

/* numpy broadcasting of a and b into nd. */
static int infer_broadcast(struct gctx *g, int i, struct mge_gnode *nd)
{
    const struct mge_gnode *a = in_node(g->gs, nd, 0), *b = in_node(g->gs, nd, 1);
    int n = a->out_ndim > b->out_ndim ? a->out_ndim : b->out_ndim;
    for (int d = 0; d < n; d++) {
        int da = d - (n - a->out_ndim), db = d - (n - b->out_ndim);
        int64_t x = da >= 0 ? a->out_shape[da] : 1, y = db >= 0 ? b->out_shape[db] : 1;
        if (x != y && x != 1 && y != 1)
            return fail_pair(g, i, a, b, " (shapes must be equal or broadcast)");
        nd->out_shape[d] = x == 1 ? y : x;
    }
    nd->out_ndim = n;
    return MGE_OK;
}

static int infer_concat(struct gctx *g, int i, struct mge_gnode *nd)
{
    const struct mge_gnode *a = in_node(g->gs, nd, 0);
    int axis = nd->axis < 0 ? nd->axis + a->out_ndim : nd->axis;
    if (axis < 1 || axis >= a->out_ndim)
        return fail_node(g, NULL, i, "axis", "axis %d is not a dim >= 1 of input `%s` (%d dims)",
                         nd->axis, a->name, a->out_ndim);
    nd->out_ndim = a->out_ndim;
    memcpy(nd->out_shape, a->out_shape, sizeof(nd->out_shape));
    for (int k = 1; k < nd->n_inputs; k++) {
        const struct mge_gnode *b = in_node(g->gs, nd, k);
        bool ok = b->out_ndim == a->out_ndim;
        for (int d = 0; ok && d < a->out_ndim; d++)
            ok = d == axis || b->out_shape[d] == a->out_shape[d];
        if (!ok) {
            char why[64];
            snprintf(why, sizeof(why), " (they must agree except along axis %d)", axis);
            return fail_pair(g, i, a, b, why);
        }
        nd->out_shape[axis] += b->out_shape[axis];
    }
    return MGE_OK;
}

static int infer_reshape(struct gctx *g, int i, struct mge_gnode *nd, const struct mge_gnode *x)
{
    int64_t have = numel_from(x->out_shape, 1, x->out_ndim), want = 1;
    int minus = -1;
    for (int d = 0; d < nd->ndim; d++) {
        if (nd->shape[d] == -1)
            minus = d;
        else
            want *= nd->shape[d];
    }
    nd->out_ndim = nd->ndim + 1;
    nd->out_shape[0] = x->out_shape[0];
    for (int d = 0; d < nd->ndim; d++)
        nd->out_shape[d + 1] = nd->shape[d];
    if (want > NUMEL_MAX || (minus >= 0 ? have % want != 0 : have != want)) {
        char s[128], t[128];
        shape_text(s, sizeof(s), x->out_ndim, x->out_shape);
        shape_text(t, sizeof(t), nd->ndim, nd->shape);
        return fail_node(g, NULL, i, "shape",
                         "input `%s` of shape %s has %" PRId64 " values per sample, "
                         "which shape %s cannot hold",
                         x->name, s, have, t);
    }
    if (minus >= 0)
        nd->out_shape[minus + 1] = have / want;
    return MGE_OK;
}

static bool data_is_tokens(const struct mge_jobspec *spec)
{
    return spec->data.format == MGE_DATA_TOKENS || spec->data.format == MGE_DATA_TEXT;
}

/* tokens: the data must be token windows, drawn by step. */
static int infer_tokens(struct gctx *g, int i, struct mge_gnode *nd, const struct mge_jobspec *spec)
{
    if (!data_is_tokens(spec))
        return fail_node(g, NULL, i, "op",
                         "op tokens reads data.format tokens or text (the data gives samples: "
                         "use op input)");
    if (spec->train.epochs > 0)
        return fail_node(g, NULL, i, "op",
                         "op tokens draws random windows: give train.steps, not train.epochs");
    nd->out_ndim = 2;
    nd->out_shape[0] = spec->train.batch_size;
    nd->out_shape[1] = nd->context;
    return MGE_OK;
}

/* Token ids feed embedding nodes alone, and embedding nodes read nothing else. */
static int check_token_reader(struct gctx *g, int i, const struct mge_gnode *nd)
{
    char s[128];
    for (int k = 0; k < nd->n_inputs; k++) {
        const struct mge_gnode *u = in_node(g->gs, nd, k);
        if (u->op == MGE_GOP_TOKENS && nd->op != MGE_GOP_EMBEDDING)
            return fail_node(g, NULL, i, "inputs",
                             "input `%s` holds token ids: only an embedding node reads them",
                             u->name);
        if (u->op != MGE_GOP_TOKENS && nd->op == MGE_GOP_EMBEDDING) {
            shape_text(s, sizeof(s), u->out_ndim, u->out_shape);
            return fail_node(g, NULL, i, "inputs",
                             "input `%s` has shape %s; embedding takes the token ids [batch, "
                             "context] of a tokens node",
                             u->name, s);
        }
    }
    return MGE_OK;
}

static int infer_embedding(struct gctx *g, int i, struct mge_gnode *nd, const struct mge_gnode *x)
{
    if (nd->vocab != x->vocab)
        return fail_node(g, NULL, i, "vocab",
                         "vocab %" PRId64 " does not match the vocab of tokens node `%s` (%" PRId64
                         ")",
                         nd->vocab, x->name, x->vocab);
    if (nd->vocab > NUMEL_MAX / nd->d_model)
        return fail_node(g, NULL, i, "d_model", "the weight [%" PRId64 ",%" PRId64 "] is too large",
                         nd->vocab, nd->d_model);
    nd->out_ndim = 3;
    nd->out_shape[0] = x->out_shape[0];
    nd->out_shape[1] = x->out_shape[1];
    nd->out_shape[2] = nd->d_model;
    return MGE_OK;
}

static int infer_pos_embedding(struct gctx *g, int i, struct mge_gnode *nd,
                               const struct mge_gnode *x)
{
    char s[128];
    if (x->out_ndim != 3)
        return fail_rank(g, i, x, "3 dims (N, context, d_model)");
    if (x->out_shape[1] != nd->context) {
        shape_text(s, sizeof(s), x->out_ndim, x->out_shape);
        return fail_node(g, NULL, i, "context",
                         "context %" PRId64 ", but input `%s` of shape %s has %" PRId64
                         " tokens per window",
                         nd->context, x->name, s, x->out_shape[1]);
    }
    nd->out_ndim = 3;
    memcpy(nd->out_shape, x->out_shape, sizeof(nd->out_shape));
    return MGE_OK;
}

static int infer_attention(struct gctx *g, int i, struct mge_gnode *nd, const struct mge_gnode *x)
{
    if (x->out_ndim != 3 || x->out_shape[2] % 3 != 0)
        return fail_rank(g, i, x,
                         "3 dims (N, T, 3 d_model): queries, keys and values side by side");
    int64_t C = x->out_shape[2] / 3;
    if (C % nd->heads != 0 || C / nd->heads > 128)
        return fail_node(g, NULL, i, "heads",
                         "d_model %" PRId64 " (a third of input `%s`'s last dim) is not a "
                         "multiple of heads %d with at most 128 per head",
                         C, x->name, nd->heads);
    nd->out_ndim = 3;
    memcpy(nd->out_shape, x->out_shape, sizeof(nd->out_shape));
    nd->out_shape[2] = C;
    return MGE_OK;
}

static int infer_tied(struct gctx *g, int i, struct mge_gnode *nd, const struct mge_gnode *x)
{
    const struct mge_gnode *e = &g->gs->nodes[nd->tied];
    char s[128];
    if (e->op != MGE_GOP_EMBEDDING)
        return fail_node(g, NULL, i, "tied_to",
                         "`%s` is a %s node, not an embedding: tied_to names the embedding whose "
                         "weight the output layer reuses",
                         e->name, mge_gop_name(e->op));
    if (e->out_ndim == 0)
        return fail_node(g, NULL, i, "tied_to",
                         "embedding `%s` does not run before this node (it must be among the "
                         "nodes its input is computed from)",
                         e->name);
    if (x->out_ndim < 2)
        return fail_rank(g, i, x, "(N, .., d_model)");
    if (x->out_shape[x->out_ndim - 1] != e->d_model) {
        shape_text(s, sizeof(s), x->out_ndim, x->out_shape);
        return fail_node(g, NULL, i, "inputs",
                         "input `%s` has shape %s; the embedding `%s` it is tied to has d_model "
                         "%" PRId64,
                         x->name, s, e->name, e->d_model);
    }
    nd->out_ndim = x->out_ndim;
    memcpy(nd->out_shape, x->out_shape, sizeof(nd->out_shape));
    nd->out_shape[nd->out_ndim - 1] = e->vocab;
    return MGE_OK;
}

/* The loss takes [batch, classes] logits, or [batch, context, vocab] after tokens. */
static int infer_loss(struct gctx *g, int i, struct mge_gnode *nd, const struct mge_gnode *x,
                      const struct mge_jobspec *spec)
{
    const struct mge_gnode *t = &g->gs->nodes[g->gs->input];
    char s[128];
    bool tokens = t->op == MGE_GOP_TOKENS;
    bool ok = tokens
                  ? x->out_ndim == 3 && x->out_shape[1] == t->context && x->out_shape[2] == t->vocab
                  : x->out_ndim == 2 && x->out_shape[1] == spec->data.classes;
    nd->out_ndim = 0;
    if (ok)
        return MGE_OK;
    shape_text(s, sizeof(s), x->out_ndim, x->out_shape);
    if (tokens)
        return fail_node(g, NULL, i, "inputs",
                         "input `%s` has shape %s; the loss takes logits [%d,%" PRId64 ",%" PRId64
                         "] (batch, context and vocab of tokens node `%s`)",
                         x->name, s, spec->train.batch_size, t->context, t->vocab, t->name);
    return fail_node(g, NULL, i, "inputs",
                     "input `%s` has shape %s; the loss takes logits [%d,%d] (batch, "
                     "data.classes)",
                     x->name, s, spec->train.batch_size, spec->data.classes);
}

static int infer_node(struct gctx *g, int i, const struct mge_jobspec *spec)
{
    struct mge_gnode *nd = &g->gs->nodes[i];
    const struct mge_gnode *x = nd->n_inputs ? in_node(g->gs, nd, 0) : NULL;
    int rc = check_token_reader(g, i, nd);

    if (rc)
        return rc;
    switch (nd->op) {
    case MGE_GOP_INPUT:
        if (data_is_tokens(spec))
            return fail_node(g, NULL, i, "op",
                             "data.format tokens and text give token ids: read them with op "
                             "tokens (and an embedding)");
        nd->out_ndim = nd->ndim + 1;
        nd->out_shape[0] = spec->train.batch_size;
        memcpy(nd->out_shape + 1, nd->shape, sizeof(int64_t) * (size_t)nd->ndim);
        if (numel_from(nd->shape, 0, nd->ndim) > NUMEL_MAX)
            return fail_node(g, NULL, i, "shape", "a sample of more than 2^32 values");
        return MGE_OK;
    case MGE_GOP_LINEAR:
        if (x->out_ndim < 2)
            return fail_rank(g, i, x, "(N, .., in_features)");
        if (x->out_shape[x->out_ndim - 1] > NUMEL_MAX / nd->features)
            return fail_node(g, NULL, i, "out_features",
                             "the weight [%" PRId64 ",%" PRId64 "] is too large", nd->features,
                             x->out_shape[x->out_ndim - 1]);
        nd->out_ndim = x->out_ndim;
        memcpy(nd->out_shape, x->out_shape, sizeof(nd->out_shape));
        nd->out_shape[nd->out_ndim - 1] = nd->features;
        return MGE_OK;
    case MGE_GOP_CONV2D:
    case MGE_GOP_MAXPOOL:
    case MGE_GOP_AVGPOOL:
        return infer_window(g, i, nd, x);
    case MGE_GOP_BATCHNORM2D:
    case MGE_GOP_GLOBAL_AVGPOOL:
        if (x->out_ndim != 4)
            return fail_rank(g, i, x, "4 dims (N, C, H, W)");
        nd->out_ndim = nd->op == MGE_GOP_BATCHNORM2D ? 4 : 2;
        memcpy(nd->out_shape, x->out_shape, sizeof(nd->out_shape));
        return MGE_OK;
    case MGE_GOP_LAYERNORM:
    case MGE_GOP_FLATTEN:
        if (x->out_ndim < 2)
            return fail_rank(g, i, x, "2 dims or more (N, ..)");
        nd->out_ndim = nd->op == MGE_GOP_FLATTEN ? 2 : x->out_ndim;
        memcpy(nd->out_shape, x->out_shape, sizeof(nd->out_shape));
        if (nd->op == MGE_GOP_FLATTEN)
            nd->out_shape[1] = numel_from(x->out_shape, 1, x->out_ndim);
        return MGE_OK;
    case MGE_GOP_RELU:
    case MGE_GOP_GELU:
    case MGE_GOP_TANH:
    case MGE_GOP_SIGMOID:
    case MGE_GOP_DROPOUT:
        nd->out_ndim = x->out_ndim;
        memcpy(nd->out_shape, x->out_shape, sizeof(nd->out_shape));
        return MGE_OK;
    case MGE_GOP_ADD:
    case MGE_GOP_SUB:
    case MGE_GOP_MUL:
        return infer_broadcast(g, i, nd);
    case MGE_GOP_RESHAPE:
        return infer_reshape(g, i, nd, x);
    case MGE_GOP_CONCAT:
        return infer_concat(g, i, nd);
    case MGE_GOP_CROSS_ENTROPY:
        return infer_loss(g, i, nd, x, spec);
    case MGE_GOP_TOKENS:
        return infer_tokens(g, i, nd, spec);
    case MGE_GOP_EMBEDDING:
        return infer_embedding(g, i, nd, x);
    case MGE_GOP_POS_EMBEDDING:
        return infer_pos_embedding(g, i, nd, x);
    case MGE_GOP_CAUSAL_ATTENTION:
        return infer_attention(g, i, nd, x);
    case MGE_GOP_TIED_LINEAR:
        return infer_tied(g, i, nd, x);
    case MGE_GOP_COUNT:
        break;
    }
    return fail_node(g, NULL, i, "op", "unknown op");
}

/* What the spec says a sample is, where it says it (idx files say it themselves). */
static int check_input_data(struct gctx *g, const struct mge_jobspec *spec)
{
    const struct mge_data_spec *d = &spec->data;
    const struct mge_gnode *x = &g->gs->nodes[g->gs->input];
    int64_t n = mge_graphspec_input_numel(g->gs);
    char s[128], what[128];
    bool image = false, ok = true;
    int64_t dim = d->input_dim;

    if (x->op == MGE_GOP_TOKENS)
        return MGE_OK; /* windows of context tokens: checked by infer_tokens */
    if (d->format == MGE_DATA_CIFAR) {
        image = true;
        dim = 3 * 32 * 32;
        snprintf(what, sizeof(what), "CIFAR images [3,32,32]");
    } else if (d->format == MGE_DATA_NPY && d->image_given) {
        image = true;
        snprintf(what, sizeof(what), "data.image [%d,%d,%d]", d->channels, d->image_h, d->image_w);
    } else if (d->format == MGE_DATA_SYNTHETIC || d->input_dim_given) {
        snprintf(what, sizeof(what), "data.input_dim %d", d->input_dim);
    } else {
        return MGE_OK; /* from the files: mge-train checks */
    }
    if (n != dim)
        ok = false;
    if (image && x->ndim == 3 && d->format == MGE_DATA_CIFAR)
        ok = ok && x->shape[0] == 3 && x->shape[1] == 32 && x->shape[2] == 32;
    else if (image && x->ndim == 3)
        ok = ok && x->shape[0] == d->channels && x->shape[1] == d->image_h &&
             x->shape[2] == d->image_w;
    if (ok)
        return MGE_OK;
    shape_text(s, sizeof(s), x->ndim, x->shape);
    return fail_node(g, NULL, g->gs->input, "shape",
                     "shape %s (%" PRId64 " values per sample) does not match the data: %s", s, n,
                     what);
}

/* ------------------------------------------------------------------------------------------ */
/* Entry points                                                                                */

static int read_nodes(struct gctx *g)
{
    struct mge_graphspec *gs = g->gs;
    int rc;
    gs->input = gs->loss = -1;
    for (int i = 0; i < gs->n; i++) {
        const struct tnode *m = g->seq->kids[i];
        struct mge_gnode *nd = &gs->nodes[i];
        if (m->kind != TN_MAP)
            return fail_got(g, m, i, NULL, "a node: a mapping {name, op, inputs, ...}");
        if ((rc = get_name(g, m, i, nd)) || (rc = check_keys(g, m, i, -1)) ||
            (rc = get_op(g, m, i, nd)) || (rc = check_keys(g, m, i, (int)nd->op)) ||
            (rc = get_attrs(g, m, i, nd)))
            return rc;
        int *one = nd->op == MGE_GOP_INPUT || nd->op == MGE_GOP_TOKENS ? &gs->input
                   : nd->op == MGE_GOP_CROSS_ENTROPY                   ? &gs->loss
                                                                       : NULL;
        if (one && *one >= 0)
            return fail_node(g, NULL, i, "op",
                             "a second %s node (the first is `%s`): a graph "
                             "has one input and one loss",
                             op_names[nd->op], gs->nodes[*one].name);
        if (one)
            *one = i;
    }
    if ((rc = index_names(g)))
        return rc;
    /* inputs once every name is known: a node may name one listed after it */
    for (int i = 0; i < gs->n; i++)
        if ((rc = get_inputs(g, g->seq->kids[i], i, &gs->nodes[i])) ||
            (rc = get_tied(g, g->seq->kids[i], i, &gs->nodes[i])))
            return rc;
    return MGE_OK;
}

int mge__graphspec_check(struct ctx *c, const struct tnode *model, const struct mge_jobspec *spec,
                         struct mge_graphspec **out)
{
    static const char what[] = "a list of 1 to 4096 nodes ({name, op, inputs, ...})";
    struct mge_graphspec *gs;
    const struct tnode *k, *seq = map_get(model, "nodes", &k);
    struct gctx g = {.c = c, .seq = seq};
    char got[192];
    int rc;

    *out = NULL;
    if (!seq)
        return mge__spec_fail(c, k ? k : model, "model.nodes",
                              "required key is missing (expected %s)", what);
    if (seq->kind != TN_SEQ || seq->n < 1 || seq->n > MGE_GRAPH_MAX_NODES) {
        mge__spec_describe(got, sizeof(got), seq);
        if (seq->kind == TN_SEQ)
            snprintf(got, sizeof(got), "%zu nodes", seq->n);
        return mge__spec_fail(c, seq, "model.nodes", "expected %s, got %s", what, got);
    }
    gs = mge_calloc(1, sizeof(*gs));
    if (!gs)
        return mge__spec_nomem(c);
    g.gs = gs;
    gs->n = (int)seq->n;
    gs->nodes = mge_calloc(seq->n, sizeof(*gs->nodes));
    if (!gs->nodes) {
        rc = mge__spec_nomem(c);
        goto err_free;
    }
    if ((rc = read_nodes(&g)))
        goto err_free;
    if (gs->input < 0 || gs->loss < 0) {
        rc = mge__spec_fail(c, seq, "model.nodes",
                            "no %s node: a graph has one input (op: input or tokens) and one "
                            "loss (op: cross_entropy)",
                            gs->input < 0 ? "input" : "cross_entropy");
        goto err_free;
    }
    if ((rc = order_nodes(&g)))
        goto err_free;
    for (int k2 = 0; k2 < gs->n; k2++)
        if ((rc = infer_node(&g, gs->order[k2], spec)))
            goto err_free;
    if ((rc = check_input_data(&g, spec)))
        goto err_free;
    *out = gs;
    mge_free(g.by_name);
    return MGE_OK;

err_free:
    mge_free(g.by_name);
    mge_graphspec_free(gs);
    return rc;
}

/* Attribute @bit (enum attr) of node @nd of @gs as JSON; a new reference, NULL on OOM. */
static json_t *attr_json(const struct mge_graphspec *gs, const struct mge_gnode *nd, unsigned bit)
{
    json_t *shape;
    switch (bit) {
    case A_OUT_FEATURES:
    case A_OUT_CHANNELS:
        return json_integer(nd->features);
    case A_KERNEL:
        return json_integer(nd->kernel);
    case A_STRIDE:
        return json_integer(nd->stride);
    case A_PADDING:
        return json_integer(nd->padding);
    case A_BIAS:
        return json_boolean(nd->bias);
    case A_INIT:
        return json_string(init_names[nd->init]);
    case A_EPS:
        return json_real(nd->eps);
    case A_MOMENTUM:
        return json_real(nd->momentum);
    case A_P:
        return json_real(nd->p);
    case A_AXIS:
        return json_integer(nd->axis);
    case A_VOCAB:
        return json_integer(nd->vocab);
    case A_CONTEXT:
        return json_integer(nd->context);
    case A_D_MODEL:
        return json_integer(nd->d_model);
    case A_HEADS:
        return json_integer(nd->heads);
    case A_TIED_TO:
        return json_string(gs->nodes[nd->tied].name);
    case A_RESIDUAL_LAYERS:
        return nd->residual_layers ? json_integer(nd->residual_layers) : json_null();
    default: /* A_SHAPE */
        shape = json_array();
        for (int d = 0; shape && d < nd->ndim; d++) {
            if (json_array_append_new(shape, json_integer(nd->shape[d]))) {
                json_decref(shape);
                return NULL;
            }
        }
        return shape;
    }
}

json_t *mge__graphspec_to_json(const struct mge_graphspec *gs)
{
    json_t *arr = json_array();
    for (int i = 0; arr && gs && i < gs->n; i++) {
        const struct mge_gnode *nd = &gs->nodes[i];
        unsigned a = ops[nd->op].attrs;
        json_t *o = json_object(), *in = json_array();
        int bad = !o || !in;
        bad = bad || json_object_set_new(o, "name", json_string(nd->name));
        bad = bad || json_object_set_new(o, "op", json_string(op_names[nd->op]));
        for (int k = 0; !bad && k < nd->n_inputs; k++)
            bad = json_array_append_new(in, json_string(gs->nodes[nd->inputs[k]].name));
        bad = bad || json_object_set(o, "inputs", in);
        for (int k = N_COMMON_KEYS; !bad && node_keys[k]; k++) {
            unsigned bit = 1u << (k - N_COMMON_KEYS);
            if (a & bit)
                bad = json_object_set_new(o, node_keys[k], attr_json(gs, nd, bit));
        }
        bad = bad || json_array_append(arr, o);
        json_decref(in);
        json_decref(o);
        if (bad) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}
