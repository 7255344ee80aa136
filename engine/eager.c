/*
 * eager.c: eager mode, the debugging twin of the static plan. The same IR runs op by op, but
 * every activation has an allocation of its own (poisoned with a NaN and followed by guard
 * bytes), no op works in place, and after each op its outputs are checked: guard bytes intact,
 * no NaN or Inf, |x| under an optional bound. The first bad value stops the run with a report
 * naming the step, the layer, the op and the pass, and optionally a dump of the op's values.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/npy.h"
#include "engine/engine_int.h"

#define EAGER_GUARD 64           /* guard bytes after every activation */
#define EAGER_GUARD_BYTE 0xE7    /* what they hold */
#define EAGER_POISON 0x7FC0DEADu /* a quiet NaN with a payload: memory no op wrote */
#define EAGER_LAYER_DEPTH 64     /* producers followed to find an op's layer */

struct mge__eager {
    double max_abs;         /* > 0: bound on finite |x|; 0: off */
    char dump_dir[1024];    /* "" : no dump */
    unsigned char **blocks; /* (n_values) each activation root's own allocation, or NULL */
    int n_blocks;
    char report[1024]; /* the last failure, "" if none */
};

/* What one scan of a value found. */
struct scan {
    int64_t n, nan, inf, poison, big; /* elements scanned, NaN, +-Inf, poison NaN, |x| > bound */
    int64_t first;                    /* index of the first bad element, or -1 */
    double max_abs;                   /* over the finite elements */
};

int mge_graph_set_eager(struct mge_graph *g, const struct mge_eager_opts *opts)
{
    if (g->allocated)
        return MGE_ERR(MGE_STATE, "eager mode: set before the graph is allocated");
    if (!g->eager) {
        if (g->planned)
            return MGE_ERR(MGE_STATE, "eager mode: set before the graph is planned");
        if (!(g->eager = mge_calloc(1, sizeof(*g->eager))))
            return MGE_ERR(MGE_NOMEM, "cannot allocate eager state");
    }
    if (opts) {
        g->eager->max_abs = opts->max_abs > 0 ? opts->max_abs : 0;
        snprintf(g->eager->dump_dir, sizeof(g->eager->dump_dir), "%s",
                 opts->dump_dir ? opts->dump_dir : "");
    }
    return MGE_OK;
}

int mge_graph_is_eager(const struct mge_graph *g)
{
    return g->eager != NULL;
}

const char *mge_graph_eager_report(const struct mge_graph *g)
{
    return g->eager ? g->eager->report : "";
}

void mge__eager_free(struct mge_graph *g)
{
    struct mge__eager *e = g->eager;
    if (!e)
        return;
    for (int v = 0; e->blocks && v < e->n_blocks; v++)
        mge_free_aligned(e->blocks[v]);
    mge_free(e->blocks);
    mge_free(e);
    g->eager = NULL;
}

int mge__eager_alloc(struct mge_graph *g)
{
    struct mge__eager *e = g->eager;
    if (!(e->blocks = mge_calloc((size_t)(g->n_values ? g->n_values : 1), sizeof(*e->blocks))))
        return MGE_ERR(MGE_NOMEM, "eager mode: cannot allocate block table");
    e->n_blocks = g->n_values;
    for (int v = 0; v < g->n_values; v++) {
        struct mge_value *val = &g->values[v];
        if (val->kind != MGE_VALUE_ACT || val->alias >= 0)
            continue;
        size_t bytes = mge__value_bytes(g, v);
        unsigned char *b = mge_malloc_aligned(bytes + EAGER_GUARD);
        if (!b)
            return MGE_ERR(MGE_NOMEM, "eager mode: cannot allocate '%s' (%zu bytes)", val->name,
                           bytes);
        if (val->dtype == MGE_DTYPE_F32) {
            uint32_t p = EAGER_POISON;
            for (size_t k = 0; k + 4 <= bytes; k += 4)
                memcpy(b + k, &p, 4);
        } else {
            memset(b, 0, bytes);
        }
        memset(b + bytes, EAGER_GUARD_BYTE, EAGER_GUARD);
        e->blocks[v] = b;
        val->data = b;
    }
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].alias >= 0)
            g->values[v].data = g->values[mge__value_root(g, v)].data;
    return MGE_OK;
}

/* ---- scanning ---- */

static void scan_add(struct scan *s, const float *x, int64_t n, int64_t base, double bound)
{
    for (int64_t k = 0; k < n; k++) {
        float f = x[k];
        int bad = 0;
        if (isnan(f)) {
            uint32_t bits;
            memcpy(&bits, &f, 4);
            s->nan++;
            s->poison += bits == EAGER_POISON;
            bad = 1;
        } else if (isinf(f)) {
            s->inf++;
            bad = 1;
        } else {
            double a = fabs((double)f);
            if (a > s->max_abs)
                s->max_abs = a;
            if (bound > 0 && a > bound) {
                s->big++;
                bad = 1;
            }
        }
        if (bad && s->first < 0)
            s->first = base + k;
    }
    s->n += n;
}

/*
 * Whether @x[0..@n) is all finite and within @bound (<= 0: no bound): the fast path of every
 * check, vectorised and threaded (a branchy scan of each output tripled a GPT step's time).
 */
static int all_good(const float *x, int64_t n, double bound)
{
    int64_t bad = 0;
    float mx = 0.0f;
#pragma omp parallel for simd reduction(+ : bad) reduction(max : mx) if (n > 65536)
    for (int64_t k = 0; k < n; k++) {
        uint32_t bits;
        memcpy(&bits, &x[k], 4);
        bad += (bits & 0x7F800000u) == 0x7F800000u;
        float a = fabsf(x[k]);
        mx = a > mx ? a : mx;
    }
    return bad == 0 && (bound <= 0 || (double)mx <= bound);
}

/* Scan f32 value @v at the current batch size (nothing for other dtypes); @fast: stop at an
 * empty scan when all_good() finds nothing wrong. */
static struct scan scan_value_fast(const struct mge_graph *g, int v, double bound, int fast)
{
    struct scan s = {.first = -1};
    if (g->values[v].dtype != MGE_DTYPE_F32 || !g->values[v].data)
        return s;
    int64_t n = mge__value_numel_now(g, v);
    if (!fast || !all_good(g->values[v].data, n, bound))
        scan_add(&s, g->values[v].data, n, 0, bound);
    return s;
}

static struct scan scan_value(const struct mge_graph *g, int v, double bound)
{
    return scan_value_fast(g, v, bound, 0);
}

/* COPY_AXIS along an axis, without zeroing first, writes one slab of its destination (a
 * concat's part): scan only that. */
static struct scan scan_slab(const struct mge_graph *g, const struct mge_node *n, double bound)
{
    struct scan s = {.first = -1};
    int v = n->out[0];
    int64_t shape[MGE_MAX_DIMS], outer = 1, inner = 1;
    const struct mge_value *val = &g->values[v];
    int axis = n->a.copy.axis;
    mge__value_shape_now(g, v, shape);
    for (int i = 0; i < axis; i++)
        outer *= shape[i];
    for (int i = axis + 1; i < val->ndim; i++)
        inner *= shape[i];
    const float *x = val->data;
    for (int64_t o = 0; o < outer; o++) {
        int64_t at = (o * shape[axis] + n->a.copy.dstart) * inner;
        if (all_good(x + at, n->a.copy.len * inner, bound))
            s.n += n->a.copy.len * inner;
        else
            scan_add(&s, x + at, n->a.copy.len * inner, at, bound);
    }
    return s;
}

static int scan_bad(const struct scan *s)
{
    return s->nan || s->inf || s->big;
}

/* Largest finite |x| over the f32 inputs of @n; *@bad_in: an input that holds NaN/Inf, or -1. */
static double inputs_max_abs(const struct mge_graph *g, const struct mge_node *n, int *bad_in)
{
    double mx = 0.0;
    *bad_in = -1;
    for (int i = 0; i < n->n_in; i++) {
        if (n->in[i] < 0)
            continue;
        struct scan s = scan_value(g, n->in[i], 0);
        if (s.max_abs > mx)
            mx = s.max_abs;
        if ((s.nan || s.inf) && *bad_in < 0)
            *bad_in = n->in[i];
    }
    return mx;
}

/* ---- names for the report ---- */

/* The layer a parameter belongs to: its name without the last component ("fc2.w" -> "fc2"). */
static void param_layer(const char *name, char *out, size_t len)
{
    const char *dot = strrchr(name, '.');
    int n = dot && dot != name ? (int)(dot - name) : (int)strlen(name);
    snprintf(out, len, "%.*s", n, name);
}

/*
 * The layer of node @ni: the parameter it differentiates or reads, else the layer of the op that
 * produced its first input with one (forward inputs first: a backward op belongs to the forward
 * op it differentiates), else its output's name. Cross-entropy and the backward seed are "loss".
 */
static void node_layer(const struct mge_graph *g, int ni, char *out, size_t len, int depth)
{
    const struct mge_node *n = &g->nodes[ni];
    if (n->op == MGE_OP_XENT || n->op == MGE_OP_ONES) {
        snprintf(out, len, "loss");
        return;
    }
    for (int i = 0; i < n->n_out; i++) {
        int r = n->out[i] >= 0 ? mge__value_root(g, n->out[i]) : -1;
        if (r >= 0 && g->values[r].kind == MGE_VALUE_GRAD) {
            param_layer(g->values[g->params[g->values[r].param_index]].name, out, len);
            return;
        }
    }
    for (int i = 0; i < n->n_in; i++) {
        int r = n->in[i] >= 0 ? mge__value_root(g, n->in[i]) : -1;
        if (r >= 0 && g->values[r].kind == MGE_VALUE_PARAM) {
            param_layer(g->values[r].name, out, len);
            return;
        }
    }
    for (int pass = 0; pass < 2 && depth < EAGER_LAYER_DEPTH; pass++)
        for (int i = 0; i < n->n_in; i++) {
            int p = n->in[i] >= 0 ? g->values[n->in[i]].producer : -1;
            if (p >= 0 && p != ni && g->nodes[p].backward == pass) {
                node_layer(g, p, out, len, depth + 1);
                return;
            }
        }
    snprintf(out, len, "%s", n->out[0] >= 0 ? g->values[n->out[0]].name : "?");
}

/* What output @i of @n is to a reader: y, dx, dW, db, probs ... */
static const char *output_role(const struct mge_graph *g, const struct mge_node *n, int i)
{
    int r = mge__value_root(g, n->out[i]);
    if (!strncmp(g->values[r].name, "scratch", 7))
        return "scratch";
    if (g->values[r].kind == MGE_VALUE_GRAD) {
        const char *pn = g->values[g->params[g->values[r].param_index]].name;
        const char *last = strrchr(pn, '.');
        last = last ? last + 1 : pn;
        if (!strcmp(last, "b") || !strcmp(last, "bias"))
            return "db";
        return "dW";
    }
    switch (n->op) {
    case MGE_OP_XENT:
        return i == 0 ? "loss" : "probs";
    case MGE_OP_LAYERNORM:
    case MGE_OP_BATCHNORM:
        return i == 0 ? "y" : i == 1 ? "mean" : "rstd";
    case MGE_OP_ATTENTION:
        return i == 0 ? "y" : "lse";
    case MGE_OP_LINEAR:
        return i == 0 ? "y" : "pre-activation";
    case MGE_OP_ATTENTION_GRAD:
        return "dqkv";
    case MGE_OP_EMBEDDING_GRAD:
        return "dtable";
    default:
        return n->backward ? "dx" : "y";
    }
}

static const char *node_pass(const struct mge_graph *g, int ni)
{
    return g->nodes[ni].backward ? "backward" : ni < g->n_forward ? "forward" : "recompute";
}

static const char *kind_name(enum mge_value_kind k)
{
    static const char *const names[] = {"input", "param", "grad", "act"};
    return (unsigned)k < 4 ? names[k] : "?";
}

/* "NaN", "Inf", "NaN and Inf" or "|x| above B" for @s. */
static void scan_what(const struct scan *s, double bound, char *out, size_t len)
{
    if (s->nan && s->inf)
        snprintf(out, len, "NaN and Inf");
    else if (s->nan)
        snprintf(out, len, "NaN");
    else if (s->inf)
        snprintf(out, len, "Inf");
    else
        snprintf(out, len, "|x| above %g", bound);
}

/* ---- the dump: values as .npy, the node as JSON ---- */

static json_t *value_json(const struct mge_graph *g, int v, const char *file)
{
    int64_t shape[MGE_MAX_DIMS];
    struct scan s = scan_value(g, v, 0);
    json_t *o = json_object(), *sh = json_array();
    mge__value_shape_now(g, v, shape);
    for (int i = 0; i < g->values[v].ndim; i++)
        json_array_append_new(sh, json_integer((json_int_t)shape[i]));
    json_object_set_new(o, "name", json_string(g->values[v].name));
    json_object_set_new(o, "kind", json_string(kind_name(g->values[v].kind)));
    json_object_set_new(o, "dtype", json_string(mge_dtype_name(g->values[v].dtype)));
    json_object_set_new(o, "shape", sh);
    json_object_set_new(o, "file", file ? json_string(file) : json_null());
    json_object_set_new(o, "max_abs", json_real(s.max_abs));
    json_object_set_new(o, "nan", json_integer((json_int_t)s.nan));
    json_object_set_new(o, "inf", json_integer((json_int_t)s.inf));
    return o;
}

/* Write value @v to DIR/@file; 0 or -1 (errno set). */
static int dump_value(const struct mge_graph *g, const char *dir, int v, const char *file)
{
    static const char *const descr[] = {"<f4", "<f2", "<u2", "|i1", "<i4"};
    const struct mge_value *val = &g->values[v];
    int64_t shape[MGE_MAX_DIMS];
    char path[1280];
    if (!val->data) {
        errno = EINVAL;
        return -1;
    }
    mge__value_shape_now(g, v, shape);
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    return mge_npy_write(path, descr[(unsigned)val->dtype < 5 ? val->dtype : 0], val->ndim, shape,
                         val->data,
                         (size_t)mge__value_numel_now(g, v) * mge_dtype_size(val->dtype));
}

/*
 * Dump the values @ins (@n_in) and @outs (@n_out) as in<i>.npy / out<i>.npy and node.json
 * with @fields (owned: consumed) into the dump directory. Appends a note to the report when it
 * cannot.
 */
static void dump(struct mge_graph *g, const int *ins, int n_in, const int *outs, int n_out,
                 json_t *fields)
{
    struct mge__eager *e = g->eager;
    const char *dir = e->dump_dir;
    json_t *jin = json_array(), *jout = json_array();
    char file[32], path[1280];
    int failed = 0;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        failed = errno;
        goto out_note;
    }
    for (int k = 0; k < n_in + n_out; k++) {
        int v = k < n_in ? ins[k] : outs[k - n_in];
        if (v < 0)
            continue;
        snprintf(file, sizeof(file), k < n_in ? "in%d.npy" : "out%d.npy", k < n_in ? k : k - n_in);
        int ok = dump_value(g, dir, v, file) == 0;
        if (!ok && !failed)
            failed = errno ? errno : EIO;
        json_array_append_new(k < n_in ? jin : jout, value_json(g, v, ok ? file : NULL));
    }
    json_object_set_new(fields, "report", json_string(e->report));
    json_object_set_new(fields, "inputs", jin);
    json_object_set_new(fields, "outputs", jout);
    jin = jout = NULL;
    snprintf(path, sizeof(path), "%s/node.json", dir);
    if (json_dump_file(fields, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0 && !failed)
        failed = EIO;
out_note:
    json_decref(jin);
    json_decref(jout);
    json_decref(fields);
    size_t at = strlen(e->report);
    if (failed)
        snprintf(e->report + at, sizeof(e->report) - at, " (dump to '%s' failed: %s)", dir,
                 strerror(failed));
    else
        snprintf(e->report + at, sizeof(e->report) - at, " (dumped to '%s')", dir);
}

static json_t *fields_new(const struct mge_graph *g, const char *layer, const char *op,
                          const char *pass, const char *output)
{
    json_t *f = json_object();
    json_object_set_new(f, "step", json_integer((json_int_t)(g->step + 1)));
    json_object_set_new(f, "training", json_boolean(g->training));
    json_object_set_new(f, "layer", json_string(layer));
    json_object_set_new(f, "op", json_string(op));
    json_object_set_new(f, "pass", json_string(pass));
    json_object_set_new(f, "output", json_string(output));
    return f;
}

/* "step 3" for a training run, "evaluation" for an inference one. */
static void when(const struct mge_graph *g, int64_t step, char *out, size_t len)
{
    if (g->training)
        snprintf(out, len, "step %lld", (long long)(step + 1));
    else
        snprintf(out, len, "evaluation");
}

/* ---- the checks ---- */

int mge__eager_check(struct mge_graph *g, int ni)
{
    struct mge__eager *e = g->eager;
    const struct mge_node *n = &g->nodes[ni];
    for (int i = 0; i < n->n_out; i++) {
        int v = n->out[i];
        if (v < 0)
            continue;
        int r = mge__value_root(g, v);
        const char *role = output_role(g, n, i);
        char layer[96], at[32], what[48];
        struct scan s = {.first = -1};
        int overrun = 0;
        if (r < e->n_blocks && e->blocks[r]) {
            const unsigned char *guard = e->blocks[r] + mge__value_bytes(g, r);
            for (int k = 0; k < EAGER_GUARD; k++)
                overrun |= guard[k] != EAGER_GUARD_BYTE;
        }
        if (!overrun && strcmp(role, "scratch") != 0)
            s = n->op == MGE_OP_COPY_AXIS && n->a.copy.axis >= 0 && !n->a.copy.zero_first
                    ? scan_slab(g, n, e->max_abs)
                    : scan_value_fast(g, v, e->max_abs, 1);
        if (!overrun && !scan_bad(&s))
            continue;
        int bad_in;
        double in_max = inputs_max_abs(g, n, &bad_in);
        node_layer(g, ni, layer, sizeof(layer), 0);
        when(g, g->step, at, sizeof(at));
        if (overrun) {
            snprintf(e->report, sizeof(e->report),
                     "%s, layer `%s` (op %s, %s): wrote past the end of %s `%s` (%zu bytes)", at,
                     layer, mge__op_name(n->op), node_pass(g, ni), role, g->values[r].name,
                     mge__value_bytes(g, r));
        } else {
            scan_what(&s, e->max_abs, what, sizeof(what));
            int len = snprintf(e->report, sizeof(e->report),
                               "%s, layer `%s` (op %s, %s): %s in %s `%s` from inputs with max "
                               "|x| %.3g (%lld of %lld values bad, the first at index %lld",
                               at, layer, mge__op_name(n->op), node_pass(g, ni), what, role,
                               g->values[v].name, in_max, (long long)(s.nan + s.inf + s.big),
                               (long long)s.n, (long long)s.first);
            if (s.poison && len > 0 && (size_t)len < sizeof(e->report))
                len += snprintf(e->report + len, sizeof(e->report) - (size_t)len,
                                "; %lld never written", (long long)s.poison);
            if (bad_in >= 0 && len > 0 && (size_t)len < sizeof(e->report))
                len += snprintf(e->report + len, sizeof(e->report) - (size_t)len,
                                "; input `%s` already holds NaN/Inf", g->values[bad_in].name);
            if (len > 0 && (size_t)len < sizeof(e->report))
                snprintf(e->report + len, sizeof(e->report) - (size_t)len, ")");
        }
        if (e->dump_dir[0]) {
            json_t *f = fields_new(g, layer, mge__op_name(n->op), node_pass(g, ni), role);
            json_object_set_new(f, "node", json_integer(ni));
            json_object_set_new(f, "inputs_max_abs", json_real(in_max));
            dump(g, n->in, n->n_in, n->out, n->n_out, f);
        }
        return MGE_ERR(MGE_RANGE, "eager: the check after node %d failed", ni);
    }
    return MGE_OK;
}

int mge_graph_eager_check_params(struct mge_graph *g, int64_t step, const char *what)
{
    struct mge__eager *e = g->eager;
    if (!e)
        return MGE_OK;
    for (int i = 0; i < g->n_params; i++) {
        int p = g->params[i], d = g->grads ? g->grads[i] : -1;
        struct scan s = scan_value_fast(g, p, e->max_abs, 1);
        if (!scan_bad(&s))
            continue;
        char layer[96], at[32], bad[48];
        struct scan sg = {.first = -1};
        if (d >= 0)
            sg = scan_value(g, d, 0);
        param_layer(g->values[p].name, layer, sizeof(layer));
        snprintf(at, sizeof(at), "step %lld", (long long)(step + 1));
        scan_what(&s, e->max_abs, bad, sizeof(bad));
        snprintf(e->report, sizeof(e->report),
                 "%s, layer `%s` (%s, update): %s in parameter `%s` from gradient `%s` with max "
                 "|x| %.3g (%lld of %lld values bad, the first at index %lld)",
                 at, layer, what, bad, g->values[p].name, d >= 0 ? g->values[d].name : "-",
                 sg.max_abs, (long long)(s.nan + s.inf + s.big), (long long)s.n,
                 (long long)s.first);
        if (e->dump_dir[0]) {
            int64_t saved = g->step;
            g->step = step;
            json_t *f = fields_new(g, layer, what, "update", "parameter");
            g->step = saved;
            dump(g, &d, 1, &p, 1, f);
        }
        return MGE_ERR(MGE_RANGE, "eager: the check of parameter '%s' failed", g->values[p].name);
    }
    return MGE_OK;
}
