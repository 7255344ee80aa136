/*
 * jobspec.c: the job spec reader shared by every binary. YAML is read with libyaml's event
 * parser into a small tree of our own (so --set overrides can edit it and every node keeps
 * its line), the tree is validated into struct mge_jobspec, and the canonical YAML (emitted
 * from the same tree) and JSON forms are produced here too.
 */
#include "jobspec.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <yaml.h>

#include "alloc.h"
#include "err.h"
#include "graphspec.h"
#include "jobspec_int.h"

#define SPEC_MAX_BYTES (1u << 20) /* a spec is a page of YAML; refuse megabytes early */
#define SPEC_MAX_DEPTH 32         /* the schema is 4 deep; bounds our recursion */
#define SPEC_MAX_PATH 4096        /* data file paths */

/* snprintf for messages, where cutting a long value short is what we want. */
static void strfmt(char *dst, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void strfmt(char *dst, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------------------------ */
/* The tree                                                                                    */

static struct tnode *tnode_new(enum tnode_kind kind, int origin, int line, int column)
{
    struct tnode *t = mge_calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->kind = kind;
    t->origin = origin;
    t->line = origin < 0 ? line : 0;
    t->column = origin < 0 ? column : 0;
    return t;
}

static void tnode_free(struct tnode *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++)
        tnode_free(t->kids[i]);
    mge_free(t->kids);
    mge_free(t->str);
    mge_free(t);
}

/* Append @kid to @t. On error @t does not own @kid. */
static int tnode_push(struct tnode *t, struct tnode *kid)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 8;
        struct tnode **k = mge_realloc(t->kids, cap * sizeof(*k));
        if (!k)
            return MGE_NOMEM;
        t->kids = k;
        t->cap = cap;
    }
    t->kids[t->n++] = kid;
    return MGE_OK;
}

static int tnode_set_str(struct tnode *t, const char *s, size_t len)
{
    char *p = mge_malloc(len + 1);
    if (!p)
        return MGE_NOMEM;
    memcpy(p, s, len);
    p[len] = '\0';
    mge_free(t->str);
    t->str = p;
    t->len = len;
    return MGE_OK;
}

/* YAML 1.2 core schema nulls, written plain. */
static bool tnode_is_null(const struct tnode *t)
{
    if (t->kind != TN_SCALAR || t->quoted)
        return false;
    return t->len == 0 || !strcmp(t->str, "~") || !strcmp(t->str, "null") ||
           !strcmp(t->str, "Null") || !strcmp(t->str, "NULL");
}

static bool tnode_is_key(const struct tnode *k, const char *name)
{
    return k->kind == TN_SCALAR && k->len == strlen(name) && !strcmp(k->str, name);
}

/* Index in kids[] of the first key @name of map @m, or -1. */
static long tnode_find(const struct tnode *m, const char *name)
{
    for (size_t i = 0; i + 1 < m->n; i += 2)
        if (tnode_is_key(m->kids[i], name))
            return (long)i;
    return -1;
}

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                      */

struct ctx {
    const char *file;
    const char *const *overrides;
    int n_overrides;
    struct mge_spec_error *err; /* never NULL here: parse() points it at scratch if need be */
    const char *text;           /* the file, for turning byte offsets into lines */
    size_t text_len;
};

/* Copy @s (@len bytes) into @dst for a message: valid UTF-8 kept, other bytes and controls
 * become '?', long values end in "..." so a message never carries a megabyte. */
static void sanitize(char *dst, size_t cap, const char *s, size_t len, size_t max_chars)
{
    size_t o = 0, chars = 0, i = 0;
    while (i < len && o + 8 < cap) {
        unsigned char c = (unsigned char)s[i];
        size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = n > 0 && i + n <= len;
        for (size_t j = 1; ok && j < n; j++)
            ok = ((unsigned char)s[i + j] & 0xC0) == 0x80;
        if (chars == max_chars) {
            memcpy(dst + o, "...", 3);
            o += 3;
            break;
        }
        if (!ok || (n == 1 && (c < 0x20 || c == 0x7F))) {
            dst[o++] = '?';
            i += 1;
        } else {
            memcpy(dst + o, s + i, n);
            o += n;
            i += n;
        }
        chars++;
    }
    dst[o] = '\0';
}

/* "x" when @override is "x=...": the key part, for comparing with an error's key. */
static bool override_key_is(const char *override, const char *key)
{
    size_t n = strlen(key);
    return key[0] && !strncmp(override, key, n) && override[n] == '=';
}

/*
 * Record an error and return @code. Where: "FILE:LINE: KEY: WHAT" for the file,
 * "FILE: --set K=V: WHAT" for a value that came from an override. Only the first error
 * of a parse is kept: every caller returns at once.
 */
#define fail_at mge__spec_fail /* the name every check below uses */

static int failv(struct ctx *c, int code, int line, int column, int origin, const char *key,
                 const char *fmt, va_list ap) __attribute__((format(printf, 7, 0)));
static int failv(struct ctx *c, int code, int line, int column, int origin, const char *key,
                 const char *fmt, va_list ap)
{
    struct mge_spec_error *e = c->err;
    char what[384], file[128], ov[160];

    vsnprintf(what, sizeof(what), fmt, ap);
    sanitize(file, sizeof(file), c->file, strlen(c->file), 100);
    strfmt(e->key, sizeof(e->key), "%s", key ? key : "");
    e->line = origin < 0 ? line : 0;
    e->column = origin < 0 ? column : 0;
    if (origin >= 0 && origin < c->n_overrides && c->overrides[origin]) {
        const char *o = c->overrides[origin];
        sanitize(ov, sizeof(ov), o, strlen(o), 100);
        if (!e->key[0] || override_key_is(o, e->key))
            strfmt(e->message, sizeof(e->message), "%s: --set %s: %s", file, ov, what);
        else
            strfmt(e->message, sizeof(e->message), "%s: --set %s: %s: %s", file, ov, e->key, what);
    } else if (e->line > 0 && e->key[0]) {
        strfmt(e->message, sizeof(e->message), "%s:%d: %s: %s", file, e->line, e->key, what);
    } else if (e->line > 0 && e->column > 0) {
        /* No key: a YAML-level problem, where the column helps. */
        strfmt(e->message, sizeof(e->message), "%s:%d:%d: %s", file, e->line, e->column, what);
    } else if (e->line > 0) {
        strfmt(e->message, sizeof(e->message), "%s:%d: %s", file, e->line, what);
    } else if (e->key[0]) {
        strfmt(e->message, sizeof(e->message), "%s: %s: %s", file, e->key, what);
    } else {
        strfmt(e->message, sizeof(e->message), "%s: %s", file, what);
    }
    return code;
}

/* Declared in jobspec_int.h (graphspec.c reports through it too); fail_at() here. */
int mge__spec_fail(struct ctx *c, const struct tnode *at, const char *key, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = failv(c, MGE_SPEC, at ? at->line : 0, at ? at->column : 0, at ? at->origin : -1, key,
                   fmt, ap);
    va_end(ap);
    return rc;
}

static int fail_code(struct ctx *c, int code, int line, int column, int origin, const char *fmt,
                     ...) __attribute__((format(printf, 6, 7)));
static int fail_code(struct ctx *c, int code, int line, int column, int origin, const char *fmt,
                     ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = failv(c, code, line, column, origin, NULL, fmt, ap);
    va_end(ap);
    return rc;
}

static int fail_nomem(struct ctx *c)
{
    return fail_code(c, MGE_NOMEM, 0, 0, -1, "out of memory");
}

/* What a user wrote, for "got ...". */
static void describe(char *buf, size_t cap, const struct tnode *v)
{
    char s[128];
    if (!v || tnode_is_null(v)) {
        strfmt(buf, cap, "an empty value");
    } else if (v->kind == TN_SEQ) {
        strfmt(buf, cap, "a list");
    } else if (v->kind == TN_MAP) {
        strfmt(buf, cap, "a mapping");
    } else {
        sanitize(s, sizeof(s), v->str, v->len, 40);
        if (v->quoted)
            strfmt(buf, cap, "a quoted string '%s'", s);
        else
            strfmt(buf, cap, "'%s'", s);
    }
}

/* Optimal string alignment distance, for "did you mean"; capped, short strings only. */
static int edit_distance(const char *a, const char *b)
{
    int la = (int)strlen(a), lb = (int)strlen(b);
    int d[33][33];
    if (la > 32 || lb > 32)
        return 99;
    for (int i = 0; i <= la; i++)
        d[i][0] = i;
    for (int j = 0; j <= lb; j++)
        d[0][j] = j;
    for (int i = 1; i <= la; i++) {
        for (int j = 1; j <= lb; j++) {
            int cost = a[i - 1] != b[j - 1];
            int v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (d[i - 1][j - 1] + cost < v)
                v = d[i - 1][j - 1] + cost;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    }
    return d[la][lb];
}

/* The closest of @names (NULL-terminated) to @s, or NULL when none is close. */
static const char *suggest(const char *s, const char *const *names)
{
    const char *best = NULL;
    int best_d = 3;
    for (; *names; names++) {
        int d = edit_distance(s, *names);
        if (d < best_d && d * 2 < (int)strlen(*names)) {
            best_d = d;
            best = *names;
        }
    }
    return best;
}

/* The helpers above, for graphspec.c (jobspec_int.h). */
int mge__spec_nomem(struct ctx *c)
{
    return fail_nomem(c);
}

void mge__spec_describe(char *buf, size_t cap, const struct tnode *v)
{
    describe(buf, cap, v);
}

void mge__spec_sanitize(char *dst, size_t cap, const char *s, size_t len, size_t max_chars)
{
    sanitize(dst, cap, s, len, max_chars);
}

const char *mge__spec_suggest(const char *s, const char *const *names)
{
    return suggest(s, names);
}

bool mge__spec_is_null(const struct tnode *t)
{
    return tnode_is_null(t);
}

/* ------------------------------------------------------------------------------------------ */
/* YAML -> tree                                                                                */

struct builder {
    struct ctx *c;
    yaml_parser_t parser;
    int origin;
};

static int yaml_fail(struct builder *b)
{
    yaml_parser_t *p = &b->parser;
    struct ctx *c = b->c;
    int line = 0, col = 0;

    if (p->error == YAML_MEMORY_ERROR)
        return fail_nomem(c);
    if (p->error == YAML_READER_ERROR) {
        /* The reader knows a byte offset, not a line. */
        if (b->origin < 0) {
            line = 1;
            for (size_t i = 0; i < p->problem_offset && i < c->text_len; i++)
                line += c->text[i] == '\n';
        }
        return fail_code(c, MGE_FORMAT, line, 0, b->origin, "%s at byte %zu",
                         p->problem ? p->problem : "unreadable input", p->problem_offset);
    }
    line = (int)p->problem_mark.line + 1;
    col = (int)p->problem_mark.column + 1;
    if (p->context && b->origin < 0)
        return fail_code(c, MGE_FORMAT, line, col, b->origin, "%s (%s at line %d)",
                         p->problem ? p->problem : "malformed YAML", p->context,
                         (int)p->context_mark.line + 1);
    if (b->origin < 0)
        return fail_code(c, MGE_FORMAT, line, col, b->origin, "%s",
                         p->problem ? p->problem : "malformed YAML");
    return fail_code(c, MGE_FORMAT, 0, 0, b->origin, "malformed value: %s at column %d",
                     p->problem ? p->problem : "malformed YAML", col);
}

static int next_event(struct builder *b, yaml_event_t *ev)
{
    if (!yaml_parser_parse(&b->parser, ev))
        return yaml_fail(b);
    return MGE_OK;
}

/* A spec error at @ev: "@what '@arg'@why". */
static int fail_event(struct builder *b, const yaml_event_t *ev, const char *what, const char *arg,
                      const char *why)
{
    char s[64];
    sanitize(s, sizeof(s), arg, strlen(arg), 30);
    return fail_code(b->c, MGE_SPEC, (int)ev->start_mark.line + 1, (int)ev->start_mark.column + 1,
                     b->origin, "%s%s%s", what, s, why);
}

/* Build the node that starts with @ev (owned by the caller) and everything under it. */
static int build_node(struct builder *b, const yaml_event_t *ev, int depth, struct tnode **out)
{
    const yaml_char_t *tag = NULL;
    enum tnode_kind kind;
    yaml_event_type_t end;
    struct tnode *t;
    int rc;

    *out = NULL;
    switch (ev->type) {
    case YAML_ALIAS_EVENT:
        return fail_event(b, ev, "aliases (*", (const char *)ev->data.alias.anchor,
                          ") are not supported in a job spec");
    case YAML_SCALAR_EVENT:
        tag = ev->data.scalar.tag;
        kind = TN_SCALAR;
        end = YAML_NO_EVENT;
        break;
    case YAML_SEQUENCE_START_EVENT:
        tag = ev->data.sequence_start.tag;
        kind = TN_SEQ;
        end = YAML_SEQUENCE_END_EVENT;
        break;
    case YAML_MAPPING_START_EVENT:
        tag = ev->data.mapping_start.tag;
        kind = TN_MAP;
        end = YAML_MAPPING_END_EVENT;
        break;
    default:
        return fail_code(b->c, MGE_FORMAT, (int)ev->start_mark.line + 1,
                         (int)ev->start_mark.column + 1, b->origin, "unexpected YAML event");
    }
    if (tag)
        return fail_event(b, ev, "tags (", (const char *)tag, ") are not supported in a job spec");
    if (depth >= SPEC_MAX_DEPTH)
        return fail_event(b, ev, "nested deeper than a job spec can be", "", "");

    t = tnode_new(kind, b->origin, (int)ev->start_mark.line + 1, (int)ev->start_mark.column + 1);
    if (!t)
        return fail_nomem(b->c);
    if (kind == TN_SCALAR) {
        t->quoted = ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
        if (tnode_set_str(t, (const char *)ev->data.scalar.value, ev->data.scalar.length)) {
            rc = fail_nomem(b->c);
            goto err_free_node;
        }
        *out = t;
        return MGE_OK;
    }
    for (;;) {
        yaml_event_t kev;
        struct tnode *kid;
        rc = next_event(b, &kev);
        if (rc)
            goto err_free_node;
        if (kev.type == end) {
            yaml_event_delete(&kev);
            break;
        }
        rc = build_node(b, &kev, depth + 1, &kid);
        yaml_event_delete(&kev);
        if (rc)
            goto err_free_node;
        if (tnode_push(t, kid)) {
            tnode_free(kid);
            rc = fail_nomem(b->c);
            goto err_free_node;
        }
    }
    *out = t;
    return MGE_OK;

err_free_node:
    tnode_free(t);
    return rc;
}

/*
 * Read one YAML document into a tree. An empty stream gives an empty plain scalar (null).
 * @origin: -1 for the file, or the index of the override whose value this is.
 */
static int build_tree(struct ctx *c, const char *text, size_t len, int origin, struct tnode **out)
{
    struct builder b = {.c = c, .origin = origin};
    struct tnode *root = NULL;
    yaml_event_t ev;
    int rc;

    *out = NULL;
    if (!yaml_parser_initialize(&b.parser))
        return fail_nomem(c);
    yaml_parser_set_input_string(&b.parser, (const unsigned char *)text, len);

    rc = next_event(&b, &ev); /* STREAM-START */
    if (rc)
        goto out_parser;
    yaml_event_delete(&ev);
    rc = next_event(&b, &ev);
    if (rc)
        goto out_parser;
    if (ev.type == YAML_STREAM_END_EVENT) {
        yaml_event_delete(&ev);
        root = tnode_new(TN_SCALAR, origin, 1, 1);
        if (!root || tnode_set_str(root, "", 0)) {
            rc = fail_nomem(c);
            goto err_free_root;
        }
        *out = root;
        goto out_parser;
    }
    yaml_event_delete(&ev); /* DOCUMENT-START */
    rc = next_event(&b, &ev);
    if (rc)
        goto out_parser;
    rc = build_node(&b, &ev, 0, &root);
    yaml_event_delete(&ev);
    if (rc)
        goto out_parser;
    rc = next_event(&b, &ev); /* DOCUMENT-END */
    if (rc)
        goto err_free_root;
    yaml_event_delete(&ev);
    rc = next_event(&b, &ev);
    if (rc)
        goto err_free_root;
    if (ev.type != YAML_STREAM_END_EVENT) {
        rc = fail_code(c, MGE_SPEC, (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1,
                       origin, "a job spec is one YAML document; found a second one");
        yaml_event_delete(&ev);
        goto err_free_root;
    }
    yaml_event_delete(&ev);
    *out = root;
    goto out_parser;

err_free_root:
    tnode_free(root);
out_parser:
    yaml_parser_delete(&b.parser);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* The schema: which keys exist where (unknown keys, overrides)                                */

struct keydef {
    const char *name;
    const struct keydef *kids; /* the mapping under this key; NULL for a leaf */
};

static const struct keydef model_keys[] = {
    {"type", NULL},    {"hidden", NULL},  {"activation", NULL}, {"layers", NULL},
    {"width", NULL},   {"dropout", NULL}, {"depth", NULL},      {"variant", NULL},
    {"stem", NULL},    {"nodes", NULL},   {"heads", NULL},      {"d_model", NULL},
    {"context", NULL}, {"vocab", NULL}, /* gpt */
    {NULL, NULL},
};
static const struct keydef normalize_keys[] = {{"mean", NULL}, {"std", NULL}, {NULL, NULL}};
static const struct keydef augment_keys[] = {{"crop_padding", NULL}, {"hflip", NULL}, {NULL, NULL}};
static const struct keydef data_keys[] = {
    {"format", NULL},          {"train_images", NULL},
    {"train_labels", NULL},    {"test_images", NULL},
    {"test_labels", NULL},     {"train_size", NULL},
    {"test_size", NULL},       {"input_dim", NULL},
    {"classes", NULL},         {"image", NULL},
    {"prefetch", NULL},        {"train_files", NULL},
    {"test_file", NULL},       {"normalize", normalize_keys},
    {"augment", augment_keys}, {"dtype", NULL},
    {"test_fraction", NULL}, /* tokens, text */
    {NULL, NULL},
};
static const struct keydef optim_keys[] = {
    {"type", NULL},         {"lr", NULL},    {"momentum", NULL}, {"nesterov", NULL},
    {"weight_decay", NULL}, {"beta1", NULL}, {"beta2", NULL},    {"eps", NULL},
    {"decay_1d", NULL},     {NULL, NULL},
};
static const struct keydef sched_keys[] = {
    {"type", NULL},         {"step_size", NULL}, {"gamma", NULL},
    {"warmup_steps", NULL}, {"min_lr", NULL},    {NULL, NULL},
};
static const struct keydef train_keys[] = {
    {"epochs", NULL},
    {"steps", NULL},
    {"batch_size", NULL},
    {"optimizer", optim_keys},
    {"lr_schedule", sched_keys},
    {"seed", NULL},
    {"checkpoint_every", NULL},
    {"checkpoint_every_sec", NULL},
    {"log_every", NULL},
    {"eval", NULL},
    {"eager", NULL},
    {"clip_grad_norm", NULL},
    {"label_smoothing", NULL},
    {"precision", NULL},
    {NULL, NULL},
};
static const struct keydef workers_keys[] = {{"min", NULL}, {"max", NULL}, {NULL, NULL}};
static const struct keydef resources_keys[] = {
    {"device", NULL}, {"workers", workers_keys}, {"cpus", NULL},
    {"gpus", NULL},   {"memory_mb", NULL},       {NULL, NULL},
};
static const struct keydef memory_keys[] = {{"sublinear", NULL}, {"budget_mb", NULL}, {NULL, NULL}};
static const struct keydef dist_keys[] = {{"backend", NULL},
                                          {"pack_mb", NULL},
                                          {"deterministic", NULL},
                                          {"micro_shards", NULL},
                                          {NULL, NULL}};
static const struct keydef quant_keys[] = {
    {"mode", NULL},       {"weights", NULL},  {"activations", NULL}, {"observer", NULL},
    {"start_step", NULL}, {"momentum", NULL}, {"percentile", NULL},  {NULL, NULL},
};
static const struct keydef root_keys[] = {
    {"name", NULL},
    {"model", model_keys},
    {"data", data_keys},
    {"train", train_keys},
    {"resources", resources_keys},
    {"memory", memory_keys},
    {"distributed", dist_keys},
    {"quant", quant_keys},
    {"priority", NULL},
    {NULL, NULL},
};

static const struct keydef *keydef_find(const struct keydef *defs, const char *name)
{
    for (; defs->name; defs++)
        if (!strcmp(defs->name, name))
            return defs;
    return NULL;
}

static const char *keydef_suggest(const struct keydef *defs, const char *name)
{
    const char *names[16];
    int n = 0;
    for (; defs->name && n < 15; defs++)
        names[n++] = defs->name;
    names[n] = NULL;
    return suggest(name, names);
}

/* "a.b" from "a" and "b" (either may be empty). */
static void path_join(char *dst, size_t cap, const char *prefix, const char *name)
{
    strfmt(dst, cap, "%s%s%s", prefix, prefix[0] && name[0] ? "." : "", name);
}

static int fail_unknown(struct ctx *c, const struct tnode *at, const char *path, const char *name,
                        const struct keydef *defs)
{
    const char *hint = keydef_suggest(defs, name);
    if (hint)
        return fail_at(c, at, path, "unknown key (did you mean '%s'?)", hint);
    return fail_at(c, at, path, "unknown key");
}

/* ------------------------------------------------------------------------------------------ */
/* Overrides                                                                                   */

/* Append @key: @value to map @m, the key made with the override's origin. On error @m does not own
 * @value. */
static int map_add_pair(struct tnode *m, const char *key, struct tnode *value, int origin)
{
    struct tnode *k = tnode_new(TN_SCALAR, origin, 0, 0);
    if (!k || tnode_set_str(k, key, strlen(key)) || tnode_push(m, k)) {
        tnode_free(k);
        return MGE_NOMEM;
    }
    if (tnode_push(m, value)) {
        m->n--; /* drop the key again so the map stays in pairs */
        tnode_free(k);
        return MGE_NOMEM;
    }
    return MGE_OK;
}

static void map_remove_all(struct tnode *m, const char *key)
{
    long i;
    while ((i = tnode_find(m, key)) >= 0) {
        tnode_free(m->kids[i]);
        tnode_free(m->kids[i + 1]);
        memmove(&m->kids[i], &m->kids[i + 2], (m->n - (size_t)i - 2) * sizeof(m->kids[0]));
        m->n -= 2;
    }
}

/*
 * Apply overrides[@idx] ("key.path=value") to the tree @root (a mapping).
 * Setting train.steps removes train.epochs and vice versa, so an override can switch a spec
 * from one to the other.
 */
static int apply_override(struct ctx *c, struct tnode *root, int idx)
{
    const char *ov = c->overrides[idx];
    const char *eq = ov ? strchr(ov, '=') : NULL;
    const struct keydef *defs = root_keys;
    char path[128], sofar[128] = "";
    char *comp[8];
    int ncomp = 0;
    struct tnode *m = root, *value = NULL;
    int rc;

    if (!ov || !eq || eq == ov || (size_t)(eq - ov) >= sizeof(path))
        return fail_code(c, MGE_SPEC, 0, 0, idx, "expected key.path=value");
    memcpy(path, ov, (size_t)(eq - ov));
    path[eq - ov] = '\0';
    for (char *p = path;;) {
        char *dot = strchr(p, '.');
        if (ncomp == 8)
            return fail_code(c, MGE_SPEC, 0, 0, idx, "key path too deep");
        comp[ncomp++] = p;
        if (!dot)
            break;
        *dot = '\0';
        p = dot + 1;
    }

    /* Check the whole path against the schema before touching the tree. */
    for (int i = 0; i < ncomp; i++) {
        struct tnode at = {.origin = idx};
        const struct keydef *d;
        char parent[128];
        if (!comp[i][0])
            return fail_code(c, MGE_SPEC, 0, 0, idx, "expected key.path=value");
        strfmt(parent, sizeof(parent), "%s", sofar);
        path_join(sofar, sizeof(sofar), parent, comp[i]);
        if (!defs)
            return fail_at(c, &at, sofar, "unknown key (%s takes a value, not keys)", parent);
        d = keydef_find(defs, comp[i]);
        if (!d)
            return fail_unknown(c, &at, sofar, comp[i], defs);
        defs = d->kids;
    }

    rc = build_tree(c, eq + 1, strlen(eq + 1), idx, &value);
    if (rc)
        return rc;

    sofar[0] = '\0';
    for (int i = 0; i < ncomp; i++) {
        long at = tnode_find(m, comp[i]);
        char parent[128];
        strfmt(parent, sizeof(parent), "%s", sofar);
        path_join(sofar, sizeof(sofar), parent, comp[i]);
        if (i + 1 == ncomp) {
            if (at >= 0) {
                tnode_free(m->kids[at + 1]);
                m->kids[at + 1] = value;
            } else if (map_add_pair(m, comp[i], value, idx)) {
                goto err_nomem;
            }
            value = NULL;
            if (!strcmp(sofar, "train.steps"))
                map_remove_all(m, "epochs");
            else if (!strcmp(sofar, "train.epochs"))
                map_remove_all(m, "steps");
            break;
        }
        if (at >= 0 && m->kids[at + 1]->kind == TN_MAP) {
            m = m->kids[at + 1];
        } else if (at >= 0 && tnode_is_null(m->kids[at + 1])) {
            struct tnode *sub = tnode_new(TN_MAP, idx, 0, 0);
            if (!sub)
                goto err_nomem;
            tnode_free(m->kids[at + 1]);
            m->kids[at + 1] = sub;
            m = sub;
        } else if (at >= 0) {
            const struct tnode *old = m->kids[at + 1];
            struct tnode where = {.origin = idx};
            tnode_free(value);
            if (old->origin >= 0)
                return fail_at(c, &where, sofar, "is not a mapping");
            return fail_at(c, &where, sofar, "is not a mapping (see line %d)", old->line);
        } else {
            struct tnode *sub = tnode_new(TN_MAP, idx, 0, 0);
            if (!sub)
                goto err_nomem;
            if (map_add_pair(m, comp[i], sub, idx)) {
                tnode_free(sub);
                goto err_nomem;
            }
            m = sub;
        }
    }
    return MGE_OK;

err_nomem:
    tnode_free(value);
    return fail_nomem(c);
}

/* ------------------------------------------------------------------------------------------ */
/* Validation: typed getters                                                                   */

/* One mapping of the spec being validated. */
struct sect {
    const struct tnode *map; /* NULL when the section is absent or null */
    const struct tnode *key; /* the key that introduced it, for "missing" errors; NULL: root */
    char path[64];           /* dotted path of the section ("" for the root) */
};

/* The value of @name in @s, NULL when absent or null; *@keyp gets its key node. */
static const struct tnode *sect_get(const struct sect *s, const char *name,
                                    const struct tnode **keyp)
{
    long i = s->map ? tnode_find(s->map, name) : -1;
    if (keyp)
        *keyp = i >= 0 ? s->map->kids[i] : NULL;
    if (i < 0 || tnode_is_null(s->map->kids[i + 1]))
        return NULL;
    return s->map->kids[i + 1];
}

/* The present-but-null value node, for "got an empty value" on a required key. */
static const struct tnode *sect_get_raw(const struct sect *s, const char *name)
{
    long i = s->map ? tnode_find(s->map, name) : -1;
    return i >= 0 ? s->map->kids[i + 1] : NULL;
}

static int fail_missing(struct ctx *c, const struct sect *s, const char *name, const char *what)
{
    char path[128];
    const struct tnode *raw = sect_get_raw(s, name);
    path_join(path, sizeof(path), s->path, name);
    if (raw)
        return fail_at(c, raw, path, "expected %s, got an empty value", what);
    return fail_at(c, s->key, path, "required key is missing (expected %s)", what);
}

static int fail_expected(struct ctx *c, const struct tnode *v, const char *path, const char *what)
{
    char got[192];
    describe(got, sizeof(got), v);
    return fail_at(c, v, path, "expected %s, got %s", what, got);
}

/* As fail_expected(), for numbers and booleans, where quotes are the usual mistake. */
static int fail_typed(struct ctx *c, const struct tnode *v, const char *path, const char *what)
{
    char got[192];
    if (v->kind != TN_SCALAR || !v->quoted)
        return fail_expected(c, v, path, what);
    describe(got, sizeof(got), v);
    return fail_at(c, v, path, "expected %s, got %s (write it without quotes)", what, got);
}

/* Check every key of @s against @defs: unknown and duplicate keys are errors. */
static int sect_check_keys(struct ctx *c, const struct sect *s, const struct keydef *defs)
{
    if (!s->map)
        return MGE_OK;
    for (size_t i = 0; i + 1 < s->map->n; i += 2) {
        const struct tnode *k = s->map->kids[i];
        char name[64], path[128];
        if (k->kind != TN_SCALAR || strlen(k->str) != k->len) {
            describe(name, sizeof(name), k);
            return fail_at(c, k, s->path[0] ? s->path : NULL, "expected a key name, got %s", name);
        }
        sanitize(name, sizeof(name), k->str, k->len, 40);
        path_join(path, sizeof(path), s->path, name);
        if (!keydef_find(defs, k->str))
            return fail_unknown(c, k, path, k->str, defs);
        for (size_t j = 0; j < i; j += 2)
            if (tnode_is_key(s->map->kids[j], k->str))
                return fail_at(c, k, path, "duplicate key (first given at line %d)",
                               s->map->kids[j]->line);
    }
    return MGE_OK;
}

/* Enter mapping @name of @parent; a missing or null one is an empty section. */
static int sect_enter(struct ctx *c, const struct sect *parent, const char *name,
                      const struct keydef *defs, struct sect *out)
{
    const struct tnode *k;
    const struct tnode *v = sect_get(parent, name, &k);
    out->map = NULL;
    out->key = k ? k : parent->key;
    path_join(out->path, sizeof(out->path), parent->path, name);
    if (v && v->kind != TN_MAP)
        return fail_expected(c, v, out->path, "a mapping");
    out->map = v;
    return sect_check_keys(c, out, defs);
}

static void range_text(char *buf, size_t cap, int64_t lo, int64_t hi)
{
    if (hi == INT64_MAX)
        strfmt(buf, cap, "an integer >= %" PRId64, lo);
    else
        strfmt(buf, cap, "an integer between %" PRId64 " and %" PRId64, lo, hi);
}

static bool scalar_is_int(const struct tnode *v, int64_t *out)
{
    size_t i = 0;
    if (v->kind != TN_SCALAR || v->quoted)
        return false;
    if (v->str[0] == '+' || v->str[0] == '-')
        i++;
    if (i == v->len)
        return false;
    for (; i < v->len; i++)
        if (v->str[i] < '0' || v->str[i] > '9')
            return false;
    errno = 0;
    long long x = strtoll(v->str, NULL, 10);
    if (errno == ERANGE)
        return false;
    *out = x;
    return true;
}

/* Decimal numbers only: no hex, inf or nan, which strtod would take. */
static bool scalar_is_num(const struct tnode *v, double *out)
{
    const char *s;
    size_t digits = 0;
    if (v->kind != TN_SCALAR || v->quoted || strlen(v->str) != v->len)
        return false;
    s = v->str;
    if (*s == '+' || *s == '-')
        s++;
    for (; *s >= '0' && *s <= '9'; s++)
        digits++;
    if (*s == '.')
        for (s++; *s >= '0' && *s <= '9'; s++)
            digits++;
    if (!digits)
        return false;
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-')
            s++;
        if (*s < '0' || *s > '9')
            return false;
        while (*s >= '0' && *s <= '9')
            s++;
    }
    if (*s)
        return false;
    *out = strtod(v->str, NULL);
    return isfinite(*out);
}

static bool scalar_is_bool(const struct tnode *v, bool *out)
{
    static const char *const t[] = {"true", "True", "TRUE"}, *const f[] = {"false", "False",
                                                                           "FALSE"};
    if (v->kind != TN_SCALAR || v->quoted)
        return false;
    for (int i = 0; i < 3; i++) {
        if (!strcmp(v->str, t[i]) || !strcmp(v->str, f[i])) {
            *out = !strcmp(v->str, t[i]);
            return true;
        }
    }
    return false;
}

/* The scalar readers above, for graphspec.c (jobspec_int.h). */
bool mge__spec_int(const struct tnode *v, int64_t *out)
{
    return scalar_is_int(v, out);
}

bool mge__spec_num(const struct tnode *v, double *out)
{
    return scalar_is_num(v, out);
}

bool mge__spec_bool(const struct tnode *v, bool *out)
{
    return scalar_is_bool(v, out);
}

/* An integer in [@lo, @hi]; @def NULL means required. *@given says whether it was written. */
static int get_int(struct ctx *c, const struct sect *s, const char *name, int64_t lo, int64_t hi,
                   const int64_t *def, int64_t *out, bool *given)
{
    char what[96], path[128];
    const struct tnode *v = sect_get(s, name, NULL);
    int64_t x;
    range_text(what, sizeof(what), lo, hi);
    if (given)
        *given = v != NULL;
    if (!v) {
        if (!def)
            return fail_missing(c, s, name, what);
        *out = *def;
        return MGE_OK;
    }
    path_join(path, sizeof(path), s->path, name);
    if (!scalar_is_int(v, &x) || x < lo || x > hi)
        return fail_typed(c, v, path, what);
    *out = x;
    return MGE_OK;
}

static int get_int32(struct ctx *c, const struct sect *s, const char *name, int lo, int hi,
                     const int *def, int *out, bool *given)
{
    int64_t d = def ? *def : 0, x;
    int rc = get_int(c, s, name, lo, hi, def ? &d : NULL, &x, given);
    if (rc == MGE_OK)
        *out = (int)x;
    return rc;
}

enum { OPEN = 1, CLOSED = 0 };

/* A number in the interval (@lo or [@lo, @hi) or @hi]; @hi = INFINITY: no upper bound. */
static int get_num(struct ctx *c, const struct sect *s, const char *name, double lo, int lo_open,
                   double hi, int hi_open, const double *def, double *out, bool *given)
{
    char what[96], path[128];
    const struct tnode *v = sect_get(s, name, NULL);
    double x;
    if (isinf(hi))
        strfmt(what, sizeof(what), "a number %s %g", lo_open ? ">" : ">=", lo);
    else
        strfmt(what, sizeof(what), "a number in %c%g, %g%c", lo_open ? '(' : '[', lo, hi,
               hi_open ? ')' : ']');
    if (given)
        *given = v != NULL;
    if (!v) {
        if (!def)
            return fail_missing(c, s, name, what);
        *out = *def;
        return MGE_OK;
    }
    path_join(path, sizeof(path), s->path, name);
    if (!scalar_is_num(v, &x) || (lo_open ? x <= lo : x < lo) || (hi_open ? x >= hi : x > hi))
        return fail_typed(c, v, path, what);
    *out = x;
    return MGE_OK;
}

static int get_bool(struct ctx *c, const struct sect *s, const char *name, bool def, int *out)
{
    char path[128];
    const struct tnode *v = sect_get(s, name, NULL);
    bool b = def;
    path_join(path, sizeof(path), s->path, name);
    if (v && !scalar_is_bool(v, &b))
        return fail_typed(c, v, path, "true or false");
    *out = b;
    return MGE_OK;
}

/* One of @names (NULL-terminated); @def < 0 means required. Quoted or plain. */
static int get_enum(struct ctx *c, const struct sect *s, const char *name, const char *const *names,
                    int def, int *out)
{
    char what[128] = "one of ", path[128], got[192];
    const struct tnode *v = sect_get(s, name, NULL);
    for (int i = 0; names[i]; i++) {
        if (i)
            strcat(what, ", ");
        strcat(what, names[i]);
    }
    if (!v) {
        if (def < 0)
            return fail_missing(c, s, name, what);
        *out = def;
        return MGE_OK;
    }
    path_join(path, sizeof(path), s->path, name);
    if (v->kind == TN_SCALAR && strlen(v->str) == v->len) {
        const char *hint;
        for (int i = 0; names[i]; i++) {
            if (!strcmp(v->str, names[i])) {
                *out = i;
                return MGE_OK;
            }
        }
        hint = suggest(v->str, names);
        describe(got, sizeof(got), v);
        if (hint)
            return fail_at(c, v, path, "expected %s, got %s (did you mean '%s'?)", what, got, hint);
    }
    return fail_expected(c, v, path, what);
}

static bool utf8_valid(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned char b = (unsigned char)s[i];
        size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        if (!n || i + n > len)
            return false;
        for (size_t j = 1; j < n; j++)
            if (((unsigned char)s[i + j] & 0xC0) != 0x80)
                return false;
        i += n;
    }
    return true;
}

/* A string of 1..@max bytes (any scalar style); NULL *@out when absent and not @required. */
static int get_str(struct ctx *c, const struct sect *s, const char *name, bool required, size_t max,
                   char **out)
{
    char what[64], path[128];
    const struct tnode *v = sect_get(s, name, NULL);
    strfmt(what, sizeof(what), "a string of 1 to %zu bytes", max);
    *out = NULL;
    if (!v)
        return required ? fail_missing(c, s, name, what) : MGE_OK;
    path_join(path, sizeof(path), s->path, name);
    if (v->kind != TN_SCALAR || v->len == 0 || v->len > max)
        return fail_expected(c, v, path, what);
    if (strlen(v->str) != v->len || !utf8_valid(v->str, v->len))
        return fail_at(c, v, path, "expected %s without NUL bytes", what);
    *out = mge_strdup(v->str);
    return *out ? MGE_OK : fail_nomem(c);
}

/* A list of @min_n..@max_n integers in [@lo, @hi] into @out (room for @max_n). */
static int get_int_list(struct ctx *c, const struct sect *s, const char *name, int min_n, int max_n,
                        int lo, int hi, int *out, int *n_out)
{
    char what[128], range[96], path[128];
    const struct tnode *v = sect_get(s, name, NULL);
    range_text(range, sizeof(range), lo, hi);
    if (min_n == max_n)
        strfmt(what, sizeof(what), "a list of %d integers", min_n);
    else
        strfmt(what, sizeof(what), "a list of %d to %d integers", min_n, max_n);
    path_join(path, sizeof(path), s->path, name);
    if (!v)
        return fail_missing(c, s, name, what);
    if (v->kind != TN_SEQ || (int)v->n < min_n || (int)v->n > max_n) {
        char got[192];
        describe(got, sizeof(got), v);
        if (v->kind == TN_SEQ)
            return fail_at(c, v, path, "expected %s, got %zu item%s", what, v->n,
                           v->n == 1 ? "" : "s");
        return fail_at(c, v, path, "expected %s, got %s", what, got);
    }
    for (size_t i = 0; i < v->n; i++) {
        int64_t x;
        if (!scalar_is_int(v->kids[i], &x) || x < lo || x > hi) {
            char got[192];
            describe(got, sizeof(got), v->kids[i]);
            return fail_at(c, v->kids[i], path, "item %zu: expected %s, got %s", i + 1, range, got);
        }
        out[i] = (int)x;
    }
    *n_out = (int)v->n;
    return MGE_OK;
}

/* A list of 1..@max_n strings of 1..@max bytes into @out (room for @max_n), each the caller's
 * to free (also on error: *@n_out says how many were made). */
/* The required list @name of 1..@max_n items (@what says of what) into *@out; its dotted
 * path into @path (128 bytes). */
static int get_seq(struct ctx *c, const struct sect *s, const char *name, int max_n,
                   const char *what, const struct tnode **out, char *path)
{
    const struct tnode *v = sect_get(s, name, NULL);
    path_join(path, 128, s->path, name);
    if (!v)
        return fail_missing(c, s, name, what);
    if (v->kind != TN_SEQ || v->n < 1 || (int)v->n > max_n)
        return fail_expected(c, v, path, what);
    *out = v;
    return MGE_OK;
}

static int get_str_list(struct ctx *c, const struct sect *s, const char *name, int max_n,
                        size_t max, char **out, int *n_out)
{
    char what[128], path[128];
    const struct tnode *v;
    int rc;
    strfmt(what, sizeof(what), "a list of 1 to %d paths (strings of 1 to %zu bytes)", max_n, max);
    *n_out = 0;
    if ((rc = get_seq(c, s, name, max_n, what, &v, path)))
        return rc;
    for (size_t i = 0; i < v->n; i++) {
        const struct tnode *e = v->kids[i];
        if (e->kind != TN_SCALAR || e->len == 0 || e->len > max || strlen(e->str) != e->len ||
            !utf8_valid(e->str, e->len))
            return fail_at(c, e, path, "item %zu: expected a string of 1 to %zu bytes", i + 1, max);
        out[i] = mge_strdup(e->str);
        if (!out[i])
            return fail_nomem(c);
        *n_out = (int)i + 1;
    }
    return MGE_OK;
}

/* A list of 1..@max_n numbers, each > @lo when @lo_open else >= @lo, into @out. */
static int get_num_list(struct ctx *c, const struct sect *s, const char *name, int max_n, double lo,
                        int lo_open, double *out, int *n_out)
{
    char what[128], path[128];
    const struct tnode *v;
    int rc;
    strfmt(what, sizeof(what), "a list of 1 to %d numbers", max_n);
    if ((rc = get_seq(c, s, name, max_n, what, &v, path)))
        return rc;
    for (size_t i = 0; i < v->n; i++) {
        double x;
        if (!scalar_is_num(v->kids[i], &x) || !isfinite(x) || (lo_open ? x <= lo : x < lo)) {
            char got[192];
            describe(got, sizeof(got), v->kids[i]);
            return fail_at(c, v->kids[i], path, "item %zu: expected a finite number %s %g, got %s",
                           i + 1, lo_open ? ">" : ">=", lo, got);
        }
        out[i] = x;
    }
    *n_out = (int)v->n;
    return MGE_OK;
}

/* data.normalize: {mean: [...], std: [...]}, one entry per channel, std > 0. */
static int check_normalize(struct ctx *c, const struct sect *data, struct mge_data_spec *d)
{
    struct sect s;
    int rc, n_std;
    if ((rc = sect_enter(c, data, "normalize", normalize_keys, &s)))
        return rc;
    if (!s.map)
        return MGE_OK;
    if ((rc = get_num_list(c, &s, "mean", MGE_SPEC_MAX_CHANNELS, -INFINITY, 0, d->norm_mean,
                           &d->n_norm)))
        return rc;
    if ((rc = get_num_list(c, &s, "std", MGE_SPEC_MAX_CHANNELS, 0, 1, d->norm_std, &n_std)))
        return rc;
    if (n_std != d->n_norm) {
        char what[96];
        strfmt(what, sizeof(what), "as many entries as data.normalize.mean (%d)", d->n_norm);
        d->n_norm = 0;
        return fail_expected(c, sect_get(&s, "std", NULL), "data.normalize.std", what);
    }
    return MGE_OK;
}

/* data.augment: {crop_padding: 0..64, hflip: bool}, training batches only. */
static int check_augment(struct ctx *c, const struct sect *data, struct mge_data_spec *d)
{
    struct sect s;
    int rc;
    if ((rc = sect_enter(c, data, "augment", augment_keys, &s)))
        return rc;
    if (!s.map)
        return MGE_OK;
    if ((rc = get_int32(c, &s, "crop_padding", 0, MGE_SPEC_MAX_CROP_PADDING, &(int){0},
                        &d->aug_crop_padding, NULL)))
        return rc;
    return get_bool(c, &s, "hflip", false, &d->aug_hflip);
}

/* @name must not be given (because @why); a null value counts as not given. */
static int forbid(struct ctx *c, const struct sect *s, const char *name, const char *why)
{
    const struct tnode *k;
    char path[128];
    if (!sect_get(s, name, &k))
        return MGE_OK;
    path_join(path, sizeof(path), s->path, name);
    return fail_at(c, k, path, "%s", why);
}

/* ------------------------------------------------------------------------------------------ */
/* Validation: the sections                                                                    */

static const char *const model_names[] = {"mlp",   "lenet", "deep_mlp", "resnet",
                                           "graph", "gpt",   NULL};
static const char *const variant_names[] = {"cifar",     "resnet18",  "resnet34", "resnet50",
                                            "resnet101", "resnet152", NULL};
static const char *const stem_names[] = {"imagenet", "cifar", NULL};
static const char *const act_names[] = {"relu", "gelu", "tanh", "sigmoid", NULL};
static const char *const format_names[] = {"idx",    "synthetic", "npy", "cifar",
                                           "tokens", "text",      NULL};
static const char *const optim_names[] = {"sgd", "adam", "adamw", NULL};
static const char *const sched_names[] = {"constant", "step", "cosine", NULL};
static const char *const device_names[] = {"cpu", "gpu", "sim", NULL};
static const char *const precision_names[] = {"fp32", "bf16", NULL};
static const char *const sublinear_names[] = {"false", "true", "auto", "light", NULL};
static const char *const backend_names[] = {"auto", "local", "mpi", "nccl", NULL};

/* Job and graph node names: 1 to @max of A-Z a-z 0-9 . _ - (jobspec_int.h). */
bool mge__spec_is_name(const struct tnode *v, size_t max)
{
    bool ok = v->kind == TN_SCALAR && v->len >= 1 && v->len <= max;
    for (size_t i = 0; ok && i < v->len; i++) {
        char ch = v->str[i];
        ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
             ch == '.' || ch == '_' || ch == '-';
    }
    return ok;
}

static int check_name(struct ctx *c, const struct sect *root, struct mge_jobspec *spec)
{
    static const char what[] = "1 to 128 letters, digits, '.', '_' or '-'";
    const struct tnode *v = sect_get(root, "name", NULL);

    if (!v)
        return fail_missing(c, root, "name", what);
    if (!mge__spec_is_name(v, MGE_SPEC_NAME_MAX))
        return fail_expected(c, v, "name", what);
    spec->name = mge_strdup(v->str);
    return spec->name ? MGE_OK : fail_nomem(c);
}

/* resnet's model.variant, model.stem (torchvision variants only) and model.width, whose
 * default is the variant's: 16 for cifar, 64 for torchvision's. */
static int check_resnet_variant(struct ctx *c, const struct sect *s, struct mge_model_spec *m)
{
    int rc, v, stem;
    if ((rc = get_enum(c, s, "variant", variant_names, MGE_RESNET_CIFAR, &v)))
        return rc;
    m->variant = (enum mge_resnet_variant)v;
    if (m->variant == MGE_RESNET_CIFAR) {
        if ((rc = forbid(c, s, "stem",
                         "only for the torchvision variants (model.variant resnet18 ... "
                         "resnet152); cifar's stem is a 3x3 conv")))
            return rc;
        stem = 1;
    } else if ((rc = get_enum(c, s, "stem", stem_names, 0, &stem))) {
        return rc;
    }
    m->stem_cifar = stem == 1;
    return get_int32(c, s, "width", 1, 4096, &(int){m->variant == MGE_RESNET_CIFAR ? 16 : 64},
                     &m->width, NULL);
}

/* model.type gpt: layers, heads, d_model (a multiple of heads, heads of at most 256), context,
 * vocab. */
static int check_gpt(struct ctx *c, const struct sect *s, struct mge_model_spec *m)
{
    int rc;
    if ((rc = get_int32(c, s, "layers", 1, 1024, &(int){4}, &m->layers, NULL)) ||
        (rc = get_int32(c, s, "heads", 1, 1024, &(int){4}, &m->heads, NULL)) ||
        (rc = get_int32(c, s, "d_model", 1, 65536, &(int){128}, &m->d_model, NULL)) ||
        (rc = get_int32(c, s, "context", 1, 1 << 20, &(int){128}, &m->context, NULL)) ||
        (rc = get_int32(c, s, "vocab", 2, 1 << 24, &(int){256}, &m->vocab, NULL)))
        return rc;
    if (m->d_model % m->heads != 0 || m->d_model / m->heads > 128) {
        const struct tnode *k = sect_get(s, "d_model", NULL);
        return fail_at(c, k ? k : s->key, "model.d_model",
                       "expected a multiple of model.heads (%d) with at most 128 per head, got %d",
                       m->heads, m->d_model);
    }
    return MGE_OK;
}

static int check_model(struct ctx *c, const struct sect *root, struct mge_model_spec *m)
{
    int rc;
    struct sect s;
    int type, act;
    double dropout, zero = 0;
    char why[96];

    if ((rc = sect_enter(c, root, "model", model_keys, &s)))
        return rc;
    if ((rc = get_enum(c, &s, "type", model_names, -1, &type)))
        return rc;
    m->type = (enum mge_model_type)type;
    if ((rc = get_enum(c, &s, "activation", act_names, MGE_ACT_RELU, &act)))
        return rc;
    m->activation = (enum mge_activation)act;
    if ((rc = get_num(c, &s, "dropout", 0, CLOSED, 1, OPEN, &zero, &dropout, NULL)))
        return rc;
    m->dropout = (float)dropout;
    m->layers = 128;
    m->width = 1024;
    strfmt(why, sizeof(why), "not used by model type '%s'", model_names[type]);
    if (m->type == MGE_MODEL_GRAPH &&
        ((rc = forbid(c, &s, "activation", why)) || (rc = forbid(c, &s, "dropout", why))))
        return rc;
    if (m->type != MGE_MODEL_GRAPH && (rc = forbid(c, &s, "nodes", why)))
        return rc;
    if (m->type == MGE_MODEL_MLP) {
        rc = get_int_list(c, &s, "hidden", 0, MGE_SPEC_MAX_LAYERS, 1, 1 << 20, m->hidden,
                          &m->n_hidden);
        if (rc)
            return rc;
    } else {
        if ((rc = forbid(c, &s, "hidden", why)))
            return rc;
    }
    if (m->type == MGE_MODEL_DEEP_MLP) {
        if ((rc = get_int32(c, &s, "layers", 1, 4096, &(int){128}, &m->layers, NULL)))
            return rc;
        if ((rc = get_int32(c, &s, "width", 1, 65536, &(int){1024}, &m->width, NULL)))
            return rc;
    } else if (m->type == MGE_MODEL_GPT) {
        if ((rc = check_gpt(c, &s, m)))
            return rc;
        if ((rc = forbid(c, &s, "width", why)))
            return rc;
    } else if (m->type == MGE_MODEL_RESNET) {
        if ((rc = forbid(c, &s, "layers", why)))
            return rc;
        if ((rc = check_resnet_variant(c, &s, m)))
            return rc;
    } else {
        if ((rc = forbid(c, &s, "layers", why)))
            return rc;
        if ((rc = forbid(c, &s, "width", why)))
            return rc;
    }
    m->depth = 20;
    if (m->type == MGE_MODEL_RESNET && m->variant != MGE_RESNET_CIFAR) {
        if ((rc = forbid(c, &s, "depth",
                         "not used with a torchvision variant (model.variant names the depth)")))
            return rc;
    } else if (m->type == MGE_MODEL_RESNET) {
        const struct tnode *k;
        if ((rc = get_int32(c, &s, "depth", 8, 6 * 200 + 2, &(int){20}, &m->depth, NULL)))
            return rc;
        if ((m->depth - 2) % 6 != 0) {
            sect_get(&s, "depth", &k);
            return fail_at(c, k, "model.depth",
                           "expected 6n+2 (8, 14, 20, 32, 44, 56, 110: CIFAR-style basic "
                           "blocks, n per stage), got %d",
                           m->depth);
        }
    } else if ((rc = forbid(c, &s, "depth", why)) || (rc = forbid(c, &s, "variant", why)) ||
               (rc = forbid(c, &s, "stem", why))) {
        return rc;
    }
    static const char *const gpt_only[] = {"heads", "d_model", "context", "vocab"};
    for (size_t i = 0; m->type != MGE_MODEL_GPT && i < 4; i++)
        if ((rc = forbid(c, &s, gpt_only[i], why)))
            return rc;
    return MGE_OK;
}

/* data.format tokens | text: train_files, test_file or test_fraction, dtype (tokens). */
static int check_tokens(struct ctx *c, const struct sect *s, struct mge_data_spec *d)
{
    static const char *const not_tokens[] = {
        "train_images", "train_labels", "test_images", "test_labels", "train_size",
        "test_size",    "input_dim",    "image",       "classes",     "normalize"};
    static const char *const dtypes[] = {"uint16", "uint32", NULL};
    int rc, dt;
    double tenth = 0.1;
    for (size_t i = 0; i < sizeof(not_tokens) / sizeof(not_tokens[0]); i++)
        if ((rc = forbid(c, s, not_tokens[i],
                         "not used with data.format tokens or text (train_files, test_file)")))
            return rc;
    if (d->format == MGE_DATA_TEXT &&
        (rc = forbid(c, s, "dtype", "not used with data.format text (a byte is a token)")))
        return rc;
    if ((rc = get_str_list(c, s, "train_files", MGE_SPEC_MAX_DATA_FILES, SPEC_MAX_PATH,
                           d->train_files, &d->n_train_files)) ||
        (rc = get_str(c, s, "test_file", false, SPEC_MAX_PATH, &d->test_file)) ||
        (rc = get_enum(c, s, "dtype", dtypes, 0, &dt)) ||
        (rc = get_num(c, s, "test_fraction", 0, CLOSED, 1, OPEN, &tenth, &d->test_fraction, NULL)))
        return rc;
    if (d->test_file && sect_get(s, "test_fraction", NULL))
        return fail_at(c, sect_get(s, "test_fraction", NULL), "data.test_fraction",
                       "not used with data.test_file (the test set is that file)");
    d->token_bytes = d->format == MGE_DATA_TEXT ? 1 : dt == 0 ? 2 : 4;
    return MGE_OK;
}

static int check_data(struct ctx *c, const struct sect *root, struct mge_data_spec *d)
{
    int rc;
    static const char *const synth_only[] = {"train_size", "test_size", "input_dim", "classes",
                                             "image"};
    static const char *const idx_only[] = {"train_images", "train_labels", "test_images",
                                           "test_labels"};
    struct sect s;
    int format, img[3] = {1, 28, 28}, n_img;
    bool img_given = false, dim_given;
    int64_t dflt;

    if ((rc = sect_enter(c, root, "data", data_keys, &s)))
        return rc;
    if ((rc = get_enum(c, &s, "format", format_names, -1, &format)))
        return rc;
    d->format = (enum mge_data_format)format;
    if ((rc = get_int32(c, &s, "prefetch", 0, 64, &(int){2}, &d->prefetch, NULL)))
        return rc;
    if ((rc = check_normalize(c, &s, d)))
        return rc;
    if ((rc = check_augment(c, &s, d)))
        return rc;
    d->train_size = 60000;
    d->test_size = 10000;
    d->classes = 10;
    if (d->format == MGE_DATA_CIFAR) {
        static const char *const not_cifar[] = {"train_images", "train_labels", "test_images",
                                                "test_labels",  "train_size",   "test_size",
                                                "input_dim",    "image"};
        for (size_t i = 0; i < sizeof(not_cifar) / sizeof(not_cifar[0]); i++)
            if ((rc = forbid(c, &s, not_cifar[i],
                             "not used with data.format cifar (train_files, test_file; "
                             "CIFAR images are [3, 32, 32])")))
                return rc;
        if ((rc = get_str_list(c, &s, "train_files", MGE_SPEC_MAX_DATA_FILES, SPEC_MAX_PATH,
                               d->train_files, &d->n_train_files)))
            return rc;
        if ((rc = get_str(c, &s, "test_file", false, SPEC_MAX_PATH, &d->test_file)))
            return rc;
        if ((rc = get_int32(c, &s, "classes", 10, 100, &(int){10}, &d->classes, NULL)))
            return rc;
        if (d->classes != 10 && d->classes != 100)
            return fail_expected(c, sect_get(&s, "classes", NULL), "data.classes",
                                 "10 (CIFAR-10) or 100 (CIFAR-100)");
        d->channels = 3;
        d->image_h = d->image_w = 32;
        d->input_dim = 3 * 32 * 32;
        return MGE_OK;
    }
    if (d->format == MGE_DATA_TOKENS || d->format == MGE_DATA_TEXT)
        return check_tokens(c, &s, d);
    static const char *const cifar_only[] = {"train_files", "test_file", "dtype", "test_fraction"};
    for (size_t i = 0; i < 4; i++)
        if ((rc = forbid(c, &s, cifar_only[i],
                         i < 2 ? "only used with data.format cifar, tokens or text"
                               : "only used with data.format tokens or text")))
            return rc;
    if (d->format == MGE_DATA_IDX || d->format == MGE_DATA_NPY) {
        const struct tnode *ti, *tl, *k;
        /* npy: the spec may state the shape and classes, and the files must agree */
        for (size_t i = 0;
             d->format == MGE_DATA_IDX && i < sizeof(synth_only) / sizeof(synth_only[0]); i++)
            if ((rc = forbid(
                     c, &s, synth_only[i],
                     "only used with data.format synthetic or npy (idx files carry their own)")))
                return rc;
        for (size_t i = 0; d->format == MGE_DATA_NPY && i < 2; i++)
            if ((rc = forbid(c, &s, synth_only[i],
                             "only used with data.format synthetic (npy files carry their own)")))
                return rc;
        if ((rc = get_str(c, &s, "train_images", true, SPEC_MAX_PATH, &d->train_images)))
            return rc;
        if ((rc = get_str(c, &s, "train_labels", true, SPEC_MAX_PATH, &d->train_labels)))
            return rc;
        ti = sect_get(&s, "test_images", NULL);
        tl = sect_get(&s, "test_labels", NULL);
        if (ti && !tl) {
            sect_get(&s, "test_images", &k);
            return fail_at(c, k, "data.test_images",
                           "needs data.test_labels too (both or neither)");
        }
        if (tl && !ti) {
            sect_get(&s, "test_labels", &k);
            return fail_at(c, k, "data.test_labels",
                           "needs data.test_images too (both or neither)");
        }
        if ((rc = get_str(c, &s, "test_images", false, SPEC_MAX_PATH, &d->test_images)))
            return rc;
        if ((rc = get_str(c, &s, "test_labels", false, SPEC_MAX_PATH, &d->test_labels)))
            return rc;
        if (d->format == MGE_DATA_NPY &&
            (rc = get_int32(c, &s, "classes", 2, MGE_CLASSES_MAX, &(int){10}, &d->classes, NULL)))
            return rc;
    } else {
        for (size_t i = 0; i < sizeof(idx_only) / sizeof(idx_only[0]); i++)
            if ((rc = forbid(c, &s, idx_only[i], "only used with data.format idx or npy")))
                return rc;
        if ((rc = get_int(c, &s, "train_size", 1, INT64_MAX, &d->train_size, &d->train_size, NULL)))
            return rc;
        if ((rc = get_int(c, &s, "test_size", 0, INT64_MAX, &d->test_size, &d->test_size, NULL)))
            return rc;
        if ((rc = get_int32(c, &s, "classes", 2, MGE_CLASSES_MAX, &(int){10}, &d->classes, NULL)))
            return rc;
    }
    if (d->format != MGE_DATA_IDX && sect_get(&s, "image", NULL)) {
        if ((rc = get_int_list(c, &s, "image", 3, 3, 1, 65536, img, &n_img)))
            return rc;
        img_given = true;
    }
    if ((int64_t)img[0] * img[1] * img[2] > (1 << 24))
        return fail_at(c, sect_get(&s, "image", NULL), "data.image",
                       "c*h*w must be at most 16777216");
    d->channels = img[0];
    d->image_h = img[1];
    d->image_w = img[2];
    dflt = (int64_t)img[0] * img[1] * img[2];
    d->image_given = img_given;
    if (d->format != MGE_DATA_IDX) {
        int64_t dim;
        if ((rc = get_int(c, &s, "input_dim", 1, 1 << 24, &dflt, &dim, &dim_given)))
            return rc;
        if (dim_given && img_given && dim != dflt) {
            char what[96];
            strfmt(what, sizeof(what), "c*h*w of data.image (%" PRId64 ")", dflt);
            return fail_expected(c, sect_get(&s, "input_dim", NULL), "data.input_dim", what);
        }
        d->input_dim = (int)dim;
        d->input_dim_given = dim_given;
    } else {
        d->input_dim = (int)dflt;
    }
    return MGE_OK;
}

static int check_optim(struct ctx *c, const struct sect *train, struct mge_optim_spec *o)
{
    int rc;
    static const double zero = 0, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd_adamw = 0.01;
    struct sect s;
    int type;
    char why[96];

    if ((rc = sect_enter(c, train, "optimizer", optim_keys, &s)))
        return rc;
    if (!s.map)
        return fail_missing(c, train, "optimizer", "a mapping with at least 'lr'");
    if ((rc = get_enum(c, &s, "type", optim_names, MGE_OPTIM_SGD, &type)))
        return rc;
    o->type = (enum mge_optim_type)type;
    if ((rc = get_num(c, &s, "lr", 0, OPEN, INFINITY, 0, NULL, &o->lr, NULL)))
        return rc;
    rc = get_num(c, &s, "weight_decay", 0, CLOSED, INFINITY, 0,
                 o->type == MGE_OPTIM_ADAMW ? &wd_adamw : &zero, &o->weight_decay, NULL);
    if (rc)
        return rc;
    /* decay_1d: false keeps biases and norm weights (1-D parameters) out of weight decay */
    int decay_1d;
    if ((rc = get_bool(c, &s, "decay_1d", true, &decay_1d)))
        return rc;
    o->no_decay_1d = !decay_1d;
    strfmt(why, sizeof(why), "not used by optimizer type '%s'", optim_names[type]);
    if (o->type == MGE_OPTIM_SGD) {
        const struct tnode *k;
        if ((rc = get_num(c, &s, "momentum", 0, CLOSED, 1, OPEN, &zero, &o->momentum, NULL)))
            return rc;
        if ((rc = get_bool(c, &s, "nesterov", false, &o->nesterov)))
            return rc;
        if (o->nesterov && o->momentum == 0) {
            sect_get(&s, "nesterov", &k);
            return fail_at(c, k, "train.optimizer.nesterov", "needs momentum > 0");
        }
        if ((rc = forbid(c, &s, "beta1", why)))
            return rc;
        if ((rc = forbid(c, &s, "beta2", why)))
            return rc;
        if ((rc = forbid(c, &s, "eps", why)))
            return rc;
        o->beta1 = b1;
        o->beta2 = b2;
        o->eps = eps;
    } else {
        if ((rc = forbid(c, &s, "momentum", why)))
            return rc;
        if ((rc = forbid(c, &s, "nesterov", why)))
            return rc;
        if ((rc = get_num(c, &s, "beta1", 0, CLOSED, 1, OPEN, &b1, &o->beta1, NULL)))
            return rc;
        if ((rc = get_num(c, &s, "beta2", 0, CLOSED, 1, OPEN, &b2, &o->beta2, NULL)))
            return rc;
        if ((rc = get_num(c, &s, "eps", 0, OPEN, INFINITY, 0, &eps, &o->eps, NULL)))
            return rc;
    }
    return MGE_OK;
}

static int check_sched(struct ctx *c, const struct sect *train, struct mge_sched_spec *sc,
                       double lr)
{
    int rc;
    static const double gamma_def = 0.1, zero = 0;
    static const int64_t zero64 = 0;
    struct sect s;
    int type;
    char why[96];

    if ((rc = sect_enter(c, train, "lr_schedule", sched_keys, &s)))
        return rc;
    if ((rc = get_enum(c, &s, "type", sched_names, MGE_SCHED_CONSTANT, &type)))
        return rc;
    sc->type = (enum mge_sched_type)type;
    sc->gamma = gamma_def;
    strfmt(why, sizeof(why), "not used by lr_schedule type '%s'", sched_names[type]);
    if (sc->type == MGE_SCHED_STEP) {
        if ((rc = get_int(c, &s, "step_size", 1, INT64_MAX, NULL, &sc->step_size, NULL)))
            return rc;
        if ((rc = get_num(c, &s, "gamma", 0, OPEN, 1, CLOSED, &gamma_def, &sc->gamma, NULL)))
            return rc;
    } else {
        if ((rc = forbid(c, &s, "step_size", why)))
            return rc;
        if ((rc = forbid(c, &s, "gamma", why)))
            return rc;
    }
    if (sc->type == MGE_SCHED_COSINE) {
        if ((rc = get_int(c, &s, "warmup_steps", 0, INT64_MAX, &zero64, &sc->warmup_steps, NULL)))
            return rc;
        if ((rc = get_num(c, &s, "min_lr", 0, CLOSED, lr, CLOSED, &zero, &sc->min_lr, NULL)))
            return rc;
    } else {
        if ((rc = forbid(c, &s, "warmup_steps", why)))
            return rc;
        if ((rc = forbid(c, &s, "min_lr", why)))
            return rc;
    }
    return MGE_OK;
}

static int check_train(struct ctx *c, const struct sect *root, struct mge_train_spec *t)
{
    int rc;
    static const int64_t seed = 42, zero = 0, one = 1;
    struct sect s;
    int64_t steps = 0, seed_v;
    bool has_epochs, has_steps;

    if ((rc = sect_enter(c, root, "train", train_keys, &s)))
        return rc;
    if (!s.map)
        return fail_missing(c, root, "train", "a mapping");
    if ((rc = get_int32(c, &s, "epochs", 1, 1000000, &(int){0}, &t->epochs, &has_epochs)))
        return rc;
    if ((rc = get_int(c, &s, "steps", 1, INT64_MAX, &zero, &steps, &has_steps)))
        return rc;
    t->steps = steps;
    if (!has_epochs && !has_steps)
        return fail_at(c, s.key, "train", "one of 'epochs' or 'steps' is required");
    if (has_epochs && has_steps) {
        const struct tnode *ke, *ks;
        sect_get(&s, "epochs", &ke);
        sect_get(&s, "steps", &ks);
        /* Blame whichever comes second: the first one was fine on its own. */
        if (ks->origin < 0 && ke->origin < 0 && ks->line < ke->line)
            return fail_at(c, ke, "train.epochs",
                           "cannot be given together with train.steps (line %d); give one",
                           ks->line);
        return fail_at(c, ks, "train.steps",
                       "cannot be given together with train.epochs (line %d); give one", ke->line);
    }
    if ((rc = get_int32(c, &s, "batch_size", 1, 1 << 24, NULL, &t->batch_size, NULL)))
        return rc;
    if ((rc = check_optim(c, &s, &t->optim)))
        return rc;
    if ((rc = check_sched(c, &s, &t->sched, t->optim.lr)))
        return rc;
    if ((rc = get_int(c, &s, "seed", 0, INT64_MAX, &seed, &seed_v, NULL)))
        return rc;
    t->seed = (uint64_t)seed_v;
    if ((rc = get_int(c, &s, "checkpoint_every", 0, INT64_MAX, &zero, &t->checkpoint_every, NULL)))
        return rc;
    if ((rc = get_int(c, &s, "checkpoint_every_sec", 0, 31536000, &zero, &t->checkpoint_every_sec,
                      NULL)))
        return rc;
    if ((rc = get_int(c, &s, "log_every", 1, INT64_MAX, &one, &t->log_every, NULL)))
        return rc;
    if ((rc = get_bool(c, &s, "eval", true, &t->eval_every_epoch)))
        return rc;
    if ((rc = get_bool(c, &s, "eager", false, &t->eager)))
        return rc;
    /* 0 is "absent": clipping off */
    if ((rc = get_num(c, &s, "clip_grad_norm", 0, OPEN, INFINITY, 0, &(double){0},
                      &t->clip_grad_norm, NULL)))
        return rc;
    if ((rc = get_num(c, &s, "label_smoothing", 0, CLOSED, 1, OPEN, &(double){0},
                      &t->label_smoothing, NULL)))
        return rc;
    int precision;
    if ((rc = get_enum(c, &s, "precision", precision_names, MGE_PRECISION_FP32, &precision)))
        return rc;
    t->precision = (enum mge_precision)precision;
    return MGE_OK;
}

static int check_resources(struct ctx *c, const struct sect *root, struct mge_resources_spec *r)
{
    struct sect s;
    const struct tnode *w, *k;
    int device, gpus_def, rc;
    bool gpus_given;

    if ((rc = sect_enter(c, root, "resources", resources_keys, &s)))
        return rc;
    if ((rc = get_enum(c, &s, "device", device_names, MGE_DEVICE_CPU, &device)))
        return rc;
    r->device = (enum mge_device_kind)device;
    w = sect_get(&s, "workers", &k);
    r->workers_min = r->workers_max = 1;
    if (w && w->kind == TN_MAP) {
        struct sect ws = {.map = w, .key = k, .path = "resources.workers"};
        int64_t lo, hi;
        if ((rc = sect_check_keys(c, &ws, workers_keys)))
            return rc;
        if ((rc = get_int(c, &ws, "min", 1, 4096, NULL, &lo, NULL)))
            return rc;
        if ((rc = get_int(c, &ws, "max", 1, 4096, NULL, &hi, NULL)))
            return rc;
        if (hi < lo) {
            char what[96];
            strfmt(what, sizeof(what), "an integer >= resources.workers.min (%" PRId64 ")", lo);
            return fail_expected(c, sect_get(&ws, "max", NULL), "resources.workers.max", what);
        }
        r->workers_min = (int)lo;
        r->workers_max = (int)hi;
    } else if (w) {
        int64_t n;
        if (!scalar_is_int(w, &n) || n < 1 || n > 4096)
            return fail_expected(c, w, "resources.workers",
                                 "an integer between 1 and 4096, or {min: N, max: M}");
        r->workers_min = r->workers_max = (int)n;
    }
    if ((rc = get_int32(c, &s, "cpus", 1, MGE_CPUS_MAX, &(int){1}, &r->cpus, NULL)))
        return rc;
    gpus_def = r->device == MGE_DEVICE_GPU ? 1 : 0;
    if ((rc = get_int32(c, &s, "gpus", 0, 64, &gpus_def, &r->gpus, &gpus_given)))
        return rc;
    if (gpus_given && r->device != MGE_DEVICE_GPU && r->gpus > 0)
        return fail_expected(c, sect_get(&s, "gpus", NULL), "resources.gpus",
                             r->device == MGE_DEVICE_SIM ? "0 with resources.device sim"
                                                         : "0 with resources.device cpu");
    if (gpus_given && r->device == MGE_DEVICE_GPU && r->gpus == 0)
        return fail_expected(c, sect_get(&s, "gpus", NULL), "resources.gpus",
                             "at least 1 with resources.device gpu");
    if ((rc = get_int(c, &s, "memory_mb", 0, INT64_MAX, &(int64_t){0}, &r->memory_mb, NULL)))
        return rc;
    return MGE_OK;
}

static int check_memory(struct ctx *c, const struct sect *root, struct mge_memory_spec *m)
{
    int rc;
    struct sect s;
    const struct tnode *v;
    int mode = MGE_SUBLINEAR_OFF;
    bool b;

    if ((rc = sect_enter(c, root, "memory", memory_keys, &s)))
        return rc;
    v = sect_get(&s, "sublinear", NULL);
    if (v && scalar_is_bool(v, &b))
        mode = b ? MGE_SUBLINEAR_ON : MGE_SUBLINEAR_OFF;
    else if ((rc = get_enum(c, &s, "sublinear", sublinear_names, MGE_SUBLINEAR_OFF, &mode)))
        return rc;
    m->sublinear = (enum mge_sublinear_mode)mode;
    if ((rc = get_int(c, &s, "budget_mb", 0, INT64_MAX, &(int64_t){0}, &m->budget_mb, NULL)))
        return rc;
    return MGE_OK;
}

static const char *const quant_mode_names[] = {"none", "qat", NULL};
static const char *const quant_observer_names[] = {"minmax", "ema", "percentile", NULL};
/* the one scheme of each kind there is today: named so that specs say what they get */
static const char *const quant_weight_names[] = {"int8 per-channel symmetric", NULL};
static const char *const quant_act_names[] = {"int8 per-tensor affine", NULL};

static int check_quant(struct ctx *c, const struct sect *root, struct mge_jobspec *spec)
{
    struct mge_quant_spec *q = &spec->quant;
    struct sect s;
    int rc, mode = MGE_QUANT_SPEC_NONE, obs = MGE_QUANT_SPEC_MINMAX, unused;

    if ((rc = sect_enter(c, root, "quant", quant_keys, &s)))
        return rc;
    if ((rc = get_enum(c, &s, "mode", quant_mode_names, MGE_QUANT_SPEC_NONE, &mode)) ||
        (rc = get_enum(c, &s, "weights", quant_weight_names, 0, &unused)) ||
        (rc = get_enum(c, &s, "activations", quant_act_names, 0, &unused)) ||
        (rc = get_enum(c, &s, "observer", quant_observer_names, MGE_QUANT_SPEC_MINMAX, &obs)))
        return rc;
    q->mode = (enum mge_quant_spec_mode)mode;
    q->observer = (enum mge_quant_spec_observer)obs;
    if ((rc = get_int(c, &s, "start_step", 0, INT64_MAX, &(int64_t){0}, &q->start_step, NULL)) ||
        (rc = get_num(c, &s, "momentum", 0.0, 1, 1.0, 0, &(double){0.01}, &q->momentum, NULL)) ||
        (rc = get_num(c, &s, "percentile", 50.0, 1, 100.0, 0, &(double){99.99}, &q->percentile,
                      NULL)))
        return rc;
    if (q->mode == MGE_QUANT_SPEC_QAT && spec->train.precision == MGE_PRECISION_BF16) {
        struct sect t = {.map = sect_get(root, "train", NULL)};
        return fail_expected(c, sect_get(&t, "precision", NULL), "train.precision",
                             "fp32 with quant.mode qat (fake quantisation needs exact fp32 "
                             "products)");
    }
    return MGE_OK;
}

/*
 * distributed.deterministic and distributed.micro_shards: every rank takes whole micro-shards,
 * so S must be at least the most ranks the job can have and at most the global batch.
 */
static int check_micro_shards(struct ctx *c, const struct sect *s, struct mge_jobspec *spec)
{
    struct mge_dist_spec *d = &spec->distributed;
    int wmax = spec->resources.workers_max, batch = spec->train.batch_size;
    int def = 12 * ((wmax + 11) / 12);
    bool given;
    char what[160];
    int rc;

    if ((rc = get_bool(c, s, "deterministic", false, &d->deterministic)))
        return rc;
    def = def < batch ? def : batch;
    if ((rc = get_int32(c, s, "micro_shards", 1, 1 << 20, &def, &d->micro_shards, &given)))
        return rc;
    /* the default lies in range unless batch_size < workers, which validate() reports */
    if (given && (d->micro_shards < wmax || d->micro_shards > batch)) {
        strfmt(what, sizeof(what),
               "an integer between resources.workers max (%d) and train.batch_size (%d): every "
               "rank takes whole micro-shards of the global batch",
               wmax, batch);
        return fail_expected(c, sect_get(s, "micro_shards", NULL), "distributed.micro_shards",
                             what);
    }
    return MGE_OK;
}

static int check_distributed(struct ctx *c, const struct sect *root, struct mge_jobspec *spec)
{
    int rc;
    static const double pack = 10;
    struct mge_dist_spec *d = &spec->distributed;
    struct sect s;
    int backend;

    if ((rc = sect_enter(c, root, "distributed", dist_keys, &s)))
        return rc;
    if ((rc = get_enum(c, &s, "backend", backend_names, MGE_BACKEND_AUTO, &backend)))
        return rc;
    d->backend = (enum mge_backend)backend;
    if ((rc = get_num(c, &s, "pack_mb", 0, OPEN, 4096, CLOSED, &pack, &d->pack_mb, NULL)))
        return rc;
    if ((rc = check_micro_shards(c, &s, spec)))
        return rc;
    if (d->backend == MGE_BACKEND_NCCL && spec->resources.device != MGE_DEVICE_GPU)
        return fail_expected(c, sect_get(&s, "backend", NULL), "distributed.backend",
                             spec->resources.device == MGE_DEVICE_SIM
                                 ? "a CPU backend (auto, local or mpi) with resources.device sim"
                                 : "a CPU backend (auto, local or mpi) with resources.device cpu");
    if (d->backend == MGE_BACKEND_LOCAL && spec->resources.workers_max > 1)
        return fail_expected(c, sect_get(&s, "backend", NULL), "distributed.backend",
                             "auto, mpi or nccl when resources.workers is more than 1");
    return MGE_OK;
}

/*
 * gpt trains on tokens or text, and those feed gpt alone (or a graph with a tokens node: checked
 * in graphspec.c); windows are random: steps, no epochs.
 */
static int check_gpt_data(struct ctx *c, const struct sect *root, const struct mge_jobspec *spec)
{
    bool gpt = spec->model.type == MGE_MODEL_GPT;
    bool tokens = spec->data.format == MGE_DATA_TOKENS || spec->data.format == MGE_DATA_TEXT;
    if (spec->model.type == MGE_MODEL_GRAPH)
        return MGE_OK; /* its input node says: graphspec.c checks */
    struct sect d = {.map = sect_get(root, "data", NULL)},
                t = {.map = sect_get(root, "train", NULL)};
    if (gpt != tokens)
        return fail_at(c, sect_get(&d, "format", NULL), "data.format",
                       gpt ? "model type gpt reads data.format tokens or text"
                           : "data.format tokens and text are for model type gpt (or a graph with "
                             "a tokens node)");
    if (gpt && spec->train.epochs > 0)
        return fail_at(c, sect_get(&t, "epochs", NULL), "train.epochs",
                       "model type gpt draws random windows: give train.steps, not epochs");
    return MGE_OK;
}

static int validate(struct ctx *c, const struct tnode *root, struct mge_jobspec *spec)
{
    struct sect s = {.map = root, .key = NULL, .path = ""};
    int rc;

    if ((rc = sect_check_keys(c, &s, root_keys)))
        return rc;
    if ((rc = check_name(c, &s, spec)))
        return rc;
    if (!sect_get(&s, "model", NULL))
        return fail_missing(c, &s, "model", "a mapping");
    if ((rc = check_model(c, &s, &spec->model)))
        return rc;
    if (!sect_get(&s, "data", NULL))
        return fail_missing(c, &s, "data", "a mapping");
    if ((rc = check_data(c, &s, &spec->data)))
        return rc;
    if ((rc = check_train(c, &s, &spec->train)))
        return rc;
    if ((rc = check_gpt_data(c, &s, spec)))
        return rc;
    if ((rc = check_resources(c, &s, &spec->resources)))
        return rc;
    if ((rc = check_memory(c, &s, &spec->memory)))
        return rc;
    if ((rc = check_distributed(c, &s, spec)))
        return rc;
    if ((rc = check_quant(c, &s, spec)))
        return rc;
    if ((rc = get_int32(c, &s, "priority", -100, 100, &(int){0}, &spec->priority, NULL)))
        return rc;
    if (spec->train.eager && spec->resources.device != MGE_DEVICE_CPU) {
        /* eager's checks read every value from the host: device memory is not host memory */
        struct sect t = {.map = sect_get(&s, "train", NULL)};
        return fail_expected(c, sect_get(&t, "eager", NULL), "train.eager",
                             "false with resources.device other than cpu (eager mode runs on "
                             "the cpu device)");
    }
    if (spec->train.batch_size < spec->resources.workers_max) {
        /* Ranks split the global batch: a rank with no samples has no gradient to add. */
        struct sect t = {.map = sect_get(&s, "train", NULL)};
        char what[96];
        strfmt(what, sizeof(what), "at least resources.workers (%d), so every rank gets samples",
               spec->resources.workers_max);
        return fail_expected(c, sect_get(&t, "batch_size", NULL), "train.batch_size", what);
    }
    /* last: shapes follow from the batch size and the data's classes */
    if (spec->model.type == MGE_MODEL_GRAPH) {
        rc = mge__graphspec_check(c, sect_get(&s, "model", NULL), spec, &spec->model.graph);
        if (rc == MGE_OK && mge_graphspec_reads_tokens(spec->model.graph)) {
            /* the token windows' data path reads these, as for type gpt */
            const struct mge_gnode *t = &spec->model.graph->nodes[spec->model.graph->input];
            spec->model.context = (int)t->context;
            spec->model.vocab = (int)t->vocab;
        }
        return rc;
    }
    return MGE_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Canonical YAML                                                                              */

struct outbuf {
    char *p;
    size_t len, cap;
};

static int outbuf_write(void *data, unsigned char *buf, size_t size)
{
    struct outbuf *o = data;
    if (o->len + size + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 1024;
        while (cap < o->len + size + 1)
            cap *= 2;
        char *p = mge_realloc(o->p, cap);
        if (!p)
            return 0;
        o->p = p;
        o->cap = cap;
    }
    memcpy(o->p + o->len, buf, size);
    o->len += size;
    o->p[o->len] = '\0';
    return 1;
}

static bool seq_is_flat(const struct tnode *t)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->kids[i]->kind != TN_SCALAR || tnode_is_null(t->kids[i]))
            return false;
    return true;
}

static int emit_node(yaml_emitter_t *em, const struct tnode *t)
{
    yaml_event_t ev;
    int ok;

    switch (t->kind) {
    case TN_SCALAR:
        /* A quoted scalar must stay quoted ('42' is a string); a plain one stays plain. */
        ok = yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)t->str, (int)t->len,
                                          !t->quoted, 1, YAML_ANY_SCALAR_STYLE);
        return ok && yaml_emitter_emit(em, &ev);
    case TN_SEQ:
        ok = yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1,
                                                  seq_is_flat(t) ? YAML_FLOW_SEQUENCE_STYLE
                                                                 : YAML_BLOCK_SEQUENCE_STYLE);
        if (!ok || !yaml_emitter_emit(em, &ev))
            return 0;
        for (size_t i = 0; i < t->n; i++)
            if (!emit_node(em, t->kids[i]))
                return 0;
        return yaml_sequence_end_event_initialize(&ev) && yaml_emitter_emit(em, &ev);
    case TN_MAP:
        ok = yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE);
        if (!ok || !yaml_emitter_emit(em, &ev))
            return 0;
        for (size_t i = 0; i + 1 < t->n; i += 2) {
            /* A null value means "not given": leave it out of the canonical text. */
            if (tnode_is_null(t->kids[i + 1]))
                continue;
            if (!emit_node(em, t->kids[i]) || !emit_node(em, t->kids[i + 1]))
                return 0;
        }
        return yaml_mapping_end_event_initialize(&ev) && yaml_emitter_emit(em, &ev);
    }
    return 0;
}

/* The tree as block YAML into a new string (mge_free), or NULL on OOM. */
static char *tree_to_yaml(const struct tnode *root)
{
    struct outbuf o = {0};
    yaml_emitter_t em;
    yaml_event_t ev;
    int ok;

    if (!yaml_emitter_initialize(&em))
        return NULL;
    yaml_emitter_set_output(&em, outbuf_write, &o);
    yaml_emitter_set_unicode(&em, 1);
    yaml_emitter_set_width(&em, -1);
    yaml_emitter_set_indent(&em, 2);
    ok = yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING) &&
         yaml_emitter_emit(&em, &ev) &&
         yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1) &&
         yaml_emitter_emit(&em, &ev) && emit_node(&em, root) &&
         yaml_document_end_event_initialize(&ev, 1) && yaml_emitter_emit(&em, &ev) &&
         yaml_stream_end_event_initialize(&ev) && yaml_emitter_emit(&em, &ev) &&
         yaml_emitter_flush(&em);
    yaml_emitter_delete(&em);
    if (!ok || !o.p) {
        mge_free(o.p);
        return NULL;
    }
    return o.p;
}

/* ------------------------------------------------------------------------------------------ */
/* Public API                                                                                  */

int mge_jobspec_parse(const char *name, const char *text, size_t len, const char *const *overrides,
                      int n_overrides, struct mge_jobspec **out, struct mge_spec_error *err)
{
    struct mge_spec_error scratch;
    struct ctx c = {.file = name ? name : "<spec>",
                    .overrides = overrides,
                    .n_overrides = overrides ? n_overrides : 0,
                    .err = err ? err : &scratch,
                    .text = text,
                    .text_len = len};
    struct tnode *root = NULL;
    struct mge_jobspec *spec = NULL;
    int rc;

    memset(c.err, 0, sizeof(*c.err));
    strfmt(c.err->file, sizeof(c.err->file), "%s", c.file);
    if (!out)
        return MGE_INVAL;
    *out = NULL;
    if (!text && len)
        return fail_code(&c, MGE_INVAL, 0, 0, -1, "no spec text");
    if (len > SPEC_MAX_BYTES)
        return fail_code(&c, MGE_SPEC, 0, 0, -1, "spec is larger than %u bytes", SPEC_MAX_BYTES);

    rc = build_tree(&c, text ? text : "", len, -1, &root);
    if (rc)
        return rc;
    if (tnode_is_null(root)) {
        root->kind = TN_MAP; /* an empty file is an empty mapping: "name" is missing */
    } else if (root->kind != TN_MAP) {
        char got[192];
        describe(got, sizeof(got), root);
        rc = fail_at(&c, root, NULL, "expected a mapping of keys (name, model, ...), got %s", got);
        goto out_free_tree;
    }
    for (int i = 0; i < c.n_overrides; i++) {
        rc = apply_override(&c, root, i);
        if (rc)
            goto out_free_tree;
    }
    spec = mge_calloc(1, sizeof(*spec));
    if (!spec) {
        rc = fail_nomem(&c);
        goto out_free_tree;
    }
    rc = validate(&c, root, spec);
    if (rc)
        goto err_free_spec;
    spec->source = tree_to_yaml(root);
    if (!spec->source) {
        rc = fail_nomem(&c);
        goto err_free_spec;
    }
    *out = spec;
    goto out_free_tree;

err_free_spec:
    mge_jobspec_free(spec);
out_free_tree:
    tnode_free(root);
    return rc;
}

int mge_jobspec_load(const char *path, const char *const *overrides, int n_overrides,
                     struct mge_jobspec **out, struct mge_spec_error *err)
{
    struct mge_spec_error scratch;
    struct ctx c = {.file = path ? path : "<null>", .err = err ? err : &scratch};
    char *buf;
    size_t len;
    FILE *fp;
    int rc;

    if (out)
        *out = NULL;
    memset(c.err, 0, sizeof(*c.err));
    strfmt(c.err->file, sizeof(c.err->file), "%s", c.file);
    if (!path || !out)
        return fail_code(&c, MGE_INVAL, 0, 0, -1, "no spec path");
    if (!strncmp(path, "env:", 4)) {
        const char *text = getenv(path + 4);
        if (!text)
            return fail_code(&c, MGE_NOENT, 0, 0, -1, "environment variable %s is not set",
                             path + 4);
        return mge_jobspec_parse(path, text, strlen(text), overrides, n_overrides, out, err);
    }
    fp = fopen(path, "rb");
    if (!fp)
        return fail_code(&c, errno == ENOENT ? MGE_NOENT : MGE_IO, 0, 0, -1, "cannot open: %s",
                         strerror(errno));
    buf = mge_malloc(SPEC_MAX_BYTES + 1);
    if (!buf) {
        rc = fail_nomem(&c);
        goto out_close;
    }
    len = fread(buf, 1, SPEC_MAX_BYTES + 1, fp);
    if (ferror(fp)) {
        rc = fail_code(&c, MGE_IO, 0, 0, -1, "cannot read: %s", strerror(errno));
        goto out_free_buf;
    }
    rc = mge_jobspec_parse(path, buf, len, overrides, n_overrides, out, err);
out_free_buf:
    mge_free(buf);
out_close:
    fclose(fp);
    return rc;
}

void mge_jobspec_free(struct mge_jobspec *spec)
{
    if (!spec)
        return;
    mge_free(spec->name);
    mge_free(spec->data.train_images);
    mge_free(spec->data.train_labels);
    mge_free(spec->data.test_images);
    mge_free(spec->data.test_labels);
    for (int i = 0; i < spec->data.n_train_files; i++)
        mge_free(spec->data.train_files[i]);
    mge_free(spec->data.test_file);
    mge_free(spec->source);
    mge_graphspec_free(spec->model.graph);
    mge_free(spec);
}

int64_t mge_jobspec_total_steps(const struct mge_jobspec *spec, int64_t train_size)
{
    int64_t per_epoch;
    if (!spec)
        return 0;
    if (spec->train.steps > 0)
        return spec->train.steps;
    if (train_size <= 0)
        train_size = spec->data.train_size;
    if (train_size <= 0 || spec->train.batch_size <= 0)
        return 0;
    per_epoch = train_size / spec->train.batch_size + (train_size % spec->train.batch_size != 0);
    if (per_epoch > INT64_MAX / (spec->train.epochs > 0 ? spec->train.epochs : 1))
        return INT64_MAX;
    return per_epoch * spec->train.epochs;
}

bool mge_model_reads_tokens(const struct mge_model_spec *m)
{
    return m->type == MGE_MODEL_GPT ||
           (m->type == MGE_MODEL_GRAPH && mge_graphspec_reads_tokens(m->graph));
}

const char *mge_model_type_name(enum mge_model_type t)
{
    return (unsigned)t <= MGE_MODEL_GPT ? model_names[t] : "unknown";
}

const char *mge_resnet_variant_name(enum mge_resnet_variant v)
{
    return (unsigned)v <= MGE_RESNET_152 ? variant_names[v] : "unknown";
}

bool mge_model_takes_images(enum mge_model_type t)
{
    return t == MGE_MODEL_LENET || t == MGE_MODEL_RESNET;
}

const char *mge_optim_type_name(enum mge_optim_type t)
{
    return (unsigned)t < 3 ? optim_names[t] : "unknown";
}

/* ------------------------------------------------------------------------------------------ */
/* JSON                                                                                        */

/* Build helpers: a NULL value (jansson OOM) makes json_object_set_new fail, which we count. */
struct jb {
    int failed;
};

static void jset(struct jb *b, json_t *obj, const char *key, json_t *v)
{
    if (!obj || json_object_set_new(obj, key, v))
        b->failed = 1;
}

static json_t *jstr_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

/* A float shown as its shortest decimal (0.1f as 0.1, not 0.100000001490116). */
static json_t *jfloat(float f)
{
    char buf[32];
    for (int p = 6; p <= 9; p++) {
        strfmt(buf, sizeof(buf), "%.*g", p, (double)f);
        if (strtof(buf, NULL) == f)
            break;
    }
    return json_real(strtod(buf, NULL));
}

static json_t *jint_list(const int *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) {
        if (json_array_append_new(a, json_integer(v[i]))) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

char *mge_jobspec_to_json(const struct mge_jobspec *spec)
{
    struct jb b = {0};
    json_t *root, *model, *data, *train, *optim, *sched, *res, *workers, *mem, *dist;
    const struct mge_optim_spec *o;
    const struct mge_sched_spec *sc;
    bool sgd, idx, npy, cifar, graph, tokens;
    char *out = NULL;
    size_t n;

    if (!spec)
        return NULL;
    o = &spec->train.optim;
    sc = &spec->train.sched;
    sgd = o->type == MGE_OPTIM_SGD;
    idx = spec->data.format == MGE_DATA_IDX;
    npy = spec->data.format == MGE_DATA_NPY;
    cifar = spec->data.format == MGE_DATA_CIFAR;
    graph = spec->model.type == MGE_MODEL_GRAPH;
    tokens = spec->data.format == MGE_DATA_TOKENS || spec->data.format == MGE_DATA_TEXT;
    root = json_object();
    jset(&b, root, "name", jstr_or_null(spec->name));

    /* Keys a type does not use are null: the JSON, read back as a spec, is the same spec. */
    model = json_object();
    jset(&b, model, "type", json_string(mge_model_type_name(spec->model.type)));
    jset(&b, model, "hidden",
         spec->model.type == MGE_MODEL_MLP ? jint_list(spec->model.hidden, spec->model.n_hidden)
                                           : json_null());
    jset(&b, model, "activation",
         graph
             ? json_null()
             : json_string((unsigned)spec->model.activation < 4 ? act_names[spec->model.activation]
                                                                : "unknown"));
    bool gpt = spec->model.type == MGE_MODEL_GPT;
    jset(&b, model, "layers",
         spec->model.type == MGE_MODEL_DEEP_MLP || gpt ? json_integer(spec->model.layers)
                                                       : json_null());
    jset(&b, model, "heads", gpt ? json_integer(spec->model.heads) : json_null());
    jset(&b, model, "d_model", gpt ? json_integer(spec->model.d_model) : json_null());
    jset(&b, model, "context", gpt ? json_integer(spec->model.context) : json_null());
    jset(&b, model, "vocab", gpt ? json_integer(spec->model.vocab) : json_null());
    jset(&b, model, "width",
         spec->model.type == MGE_MODEL_DEEP_MLP || spec->model.type == MGE_MODEL_RESNET
             ? json_integer(spec->model.width)
             : json_null());
    bool tv = spec->model.type == MGE_MODEL_RESNET && spec->model.variant != MGE_RESNET_CIFAR;
    jset(&b, model, "depth",
         spec->model.type == MGE_MODEL_RESNET && !tv ? json_integer(spec->model.depth)
                                                     : json_null());
    jset(&b, model, "variant",
         spec->model.type == MGE_MODEL_RESNET
             ? json_string(mge_resnet_variant_name(spec->model.variant))
             : json_null());
    jset(&b, model, "stem", tv ? json_string(stem_names[spec->model.stem_cifar]) : json_null());
    jset(&b, model, "dropout", graph ? json_null() : jfloat(spec->model.dropout));
    jset(&b, model, "nodes", graph ? mge__graphspec_to_json(spec->model.graph) : json_null());
    jset(&b, root, "model", model);

    data = json_object();
    jset(&b, data, "format", json_string(format_names[spec->data.format]));
    jset(&b, data, "train_images", jstr_or_null(spec->data.train_images));
    jset(&b, data, "train_labels", jstr_or_null(spec->data.train_labels));
    jset(&b, data, "test_images", jstr_or_null(spec->data.test_images));
    jset(&b, data, "test_labels", jstr_or_null(spec->data.test_labels));
    jset(&b, data, "train_size",
         idx || npy || cifar || tokens ? json_null() : json_integer(spec->data.train_size));
    jset(&b, data, "test_size",
         idx || npy || cifar || tokens ? json_null() : json_integer(spec->data.test_size));
    jset(&b, data, "input_dim",
         idx || cifar || tokens || (npy && !spec->data.input_dim_given)
             ? json_null()
             : json_integer(spec->data.input_dim));
    jset(&b, data, "classes", idx || tokens ? json_null() : json_integer(spec->data.classes));
    jset(&b, data, "image",
         idx || cifar || tokens || (npy && !spec->data.image_given)
             ? json_null()
             : jint_list((const int[]){spec->data.channels, spec->data.image_h, spec->data.image_w},
                         3));
    jset(&b, data, "prefetch", json_integer(spec->data.prefetch));
    if (cifar || tokens) {
        json_t *files = json_array();
        for (int i = 0; files && i < spec->data.n_train_files; i++)
            if (json_array_append_new(files, json_string(spec->data.train_files[i])) != 0)
                b.failed = 1;
        jset(&b, data, "train_files", files);
    } else {
        jset(&b, data, "train_files", json_null());
    }
    jset(&b, data, "test_file", jstr_or_null(spec->data.test_file));
    jset(&b, data, "dtype",
         spec->data.format == MGE_DATA_TOKENS
             ? json_string(spec->data.token_bytes == 4 ? "uint32" : "uint16")
             : json_null());
    jset(&b, data, "test_fraction",
         tokens && !spec->data.test_file ? json_real(spec->data.test_fraction) : json_null());
    if (spec->data.n_norm > 0) {
        json_t *norm = json_object(), *mean = json_array(), *std = json_array();
        for (int i = 0; mean && std && i < spec->data.n_norm; i++)
            if (json_array_append_new(mean, json_real(spec->data.norm_mean[i])) ||
                json_array_append_new(std, json_real(spec->data.norm_std[i])))
                b.failed = 1;
        jset(&b, norm, "mean", mean);
        jset(&b, norm, "std", std);
        jset(&b, data, "normalize", norm);
    } else {
        jset(&b, data, "normalize", json_null());
    }
    if (spec->data.aug_crop_padding > 0 || spec->data.aug_hflip) {
        json_t *aug = json_object();
        jset(&b, aug, "crop_padding", json_integer(spec->data.aug_crop_padding));
        jset(&b, aug, "hflip", json_boolean(spec->data.aug_hflip));
        jset(&b, data, "augment", aug);
    } else {
        jset(&b, data, "augment", json_null());
    }
    jset(&b, root, "data", data);

    train = json_object();
    jset(&b, train, "epochs",
         spec->train.steps > 0 ? json_null() : json_integer(spec->train.epochs));
    jset(&b, train, "steps", spec->train.steps > 0 ? json_integer(spec->train.steps) : json_null());
    jset(&b, train, "batch_size", json_integer(spec->train.batch_size));
    optim = json_object();
    jset(&b, optim, "type", json_string(mge_optim_type_name(o->type)));
    jset(&b, optim, "lr", json_real(o->lr));
    jset(&b, optim, "momentum", sgd ? json_real(o->momentum) : json_null());
    jset(&b, optim, "nesterov", sgd ? json_boolean(o->nesterov) : json_null());
    jset(&b, optim, "weight_decay", json_real(o->weight_decay));
    jset(&b, optim, "beta1", sgd ? json_null() : json_real(o->beta1));
    jset(&b, optim, "beta2", sgd ? json_null() : json_real(o->beta2));
    jset(&b, optim, "eps", sgd ? json_null() : json_real(o->eps));
    jset(&b, optim, "decay_1d", json_boolean(!o->no_decay_1d));
    jset(&b, train, "optimizer", optim);
    sched = json_object();
    jset(&b, sched, "type",
         json_string((unsigned)sc->type < 3 ? sched_names[sc->type] : "unknown"));
    jset(&b, sched, "step_size",
         sc->type == MGE_SCHED_STEP ? json_integer(sc->step_size) : json_null());
    jset(&b, sched, "gamma", sc->type == MGE_SCHED_STEP ? json_real(sc->gamma) : json_null());
    jset(&b, sched, "warmup_steps",
         sc->type == MGE_SCHED_COSINE ? json_integer(sc->warmup_steps) : json_null());
    jset(&b, sched, "min_lr", sc->type == MGE_SCHED_COSINE ? json_real(sc->min_lr) : json_null());
    jset(&b, train, "lr_schedule", sched);
    jset(&b, train, "seed", json_integer((json_int_t)spec->train.seed));
    jset(&b, train, "checkpoint_every", json_integer(spec->train.checkpoint_every));
    jset(&b, train, "checkpoint_every_sec", json_integer(spec->train.checkpoint_every_sec));
    jset(&b, train, "log_every", json_integer(spec->train.log_every));
    jset(&b, train, "eval", json_boolean(spec->train.eval_every_epoch));
    jset(&b, train, "eager", json_boolean(spec->train.eager));
    jset(&b, train, "clip_grad_norm",
         spec->train.clip_grad_norm > 0 ? json_real(spec->train.clip_grad_norm) : json_null());
    jset(&b, train, "label_smoothing", json_real(spec->train.label_smoothing));
    jset(&b, train, "precision", json_string(precision_names[spec->train.precision & 1]));
    jset(&b, root, "train", train);

    res = json_object();
    jset(&b, res, "device",
         json_string((unsigned)spec->resources.device < 3 ? device_names[spec->resources.device]
                                                          : "unknown"));
    workers = json_object();
    jset(&b, workers, "min", json_integer(spec->resources.workers_min));
    jset(&b, workers, "max", json_integer(spec->resources.workers_max));
    jset(&b, res, "workers", workers);
    jset(&b, res, "cpus", json_integer(spec->resources.cpus));
    jset(&b, res, "gpus", json_integer(spec->resources.gpus));
    jset(&b, res, "memory_mb", json_integer(spec->resources.memory_mb));
    jset(&b, root, "resources", res);

    mem = json_object();
    switch (spec->memory.sublinear) {
    case MGE_SUBLINEAR_OFF:
        jset(&b, mem, "sublinear", json_false());
        break;
    case MGE_SUBLINEAR_ON:
        jset(&b, mem, "sublinear", json_true());
        break;
    case MGE_SUBLINEAR_AUTO:
        jset(&b, mem, "sublinear", json_string("auto"));
        break;
    default:
        jset(&b, mem, "sublinear", json_string("light"));
        break;
    }
    jset(&b, mem, "budget_mb", json_integer(spec->memory.budget_mb));
    jset(&b, root, "memory", mem);

    dist = json_object();
    jset(&b, dist, "backend",
         json_string((unsigned)spec->distributed.backend < 4
                         ? backend_names[spec->distributed.backend]
                         : "unknown"));
    jset(&b, dist, "pack_mb", json_real(spec->distributed.pack_mb));
    jset(&b, dist, "deterministic", json_boolean(spec->distributed.deterministic));
    jset(&b, dist, "micro_shards", json_integer(spec->distributed.micro_shards));
    jset(&b, root, "distributed", dist);
    if (spec->quant.mode == MGE_QUANT_SPEC_QAT) { /* absent unless used: older readers agree */
        json_t *quant = json_object();
        jset(&b, quant, "mode", json_string("qat"));
        jset(&b, quant, "weights", json_string(quant_weight_names[0]));
        jset(&b, quant, "activations", json_string(quant_act_names[0]));
        jset(&b, quant, "observer", json_string(quant_observer_names[spec->quant.observer % 3]));
        jset(&b, quant, "start_step", json_integer(spec->quant.start_step));
        jset(&b, quant, "momentum", json_real(spec->quant.momentum));
        jset(&b, quant, "percentile", json_real(spec->quant.percentile));
        jset(&b, root, "quant", quant);
    }
    jset(&b, root, "priority", json_integer(spec->priority));

    if (!b.failed) {
        /* 15 digits: lr 0.05 reads "0.05", not "0.050000000000000003". */
        size_t flags = JSON_COMPACT | JSON_REAL_PRECISION(15);
        n = json_dumpb(root, NULL, 0, flags);
        if (n > 0 && (out = mge_malloc(n + 1)) != NULL) {
            if (json_dumpb(root, out, n, flags) != n) {
                mge_free(out);
                out = NULL;
            } else {
                out[n] = '\0';
            }
        }
    }
    json_decref(root);
    return out;
}
