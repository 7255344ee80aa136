/*
 * jobspec_int.h: the job spec reader's YAML tree and error helpers, shared inside common/ by
 * jobspec.c (the reader and the sections) and graphspec.c (model.type: graph). Not for other
 * modules: they use jobspec.h and graphspec.h.
 */
#ifndef MGE_COMMON_JOBSPEC_INT_H
#define MGE_COMMON_JOBSPEC_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "jobspec.h"

enum tnode_kind { TN_SCALAR, TN_SEQ, TN_MAP };

struct tnode {
    enum tnode_kind kind;
    int line, column;    /* 1-based position in the file; 0 for nodes made by an override */
    int origin;          /* -1: the file; i >= 0: overrides[i] */
    bool quoted;         /* scalar was quoted or a block scalar: a string, never a number */
    char *str;           /* scalar text, NUL-terminated; may hold NULs itself (see len) */
    size_t len;          /* bytes in str */
    struct tnode **kids; /* seq: items; map: key, value, key, value, ... */
    size_t n, cap;       /* entries used / allocated in kids */
};

/* jobspec.c's parse context (file name, overrides, the error being filled); opaque here. */
struct ctx;

/*
 * Record the parse's error at @at's line ("FILE:LINE: KEY: WHAT", or the override that made
 * @at) and return MGE_SPEC. Only the first error of a parse is kept: return at once.
 */
int mge__spec_fail(struct ctx *c, const struct tnode *at, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Record "out of memory" and return MGE_NOMEM. */
int mge__spec_nomem(struct ctx *c);
/* What a user wrote, for "got ...": "'abc'", "a list", "an empty value", ... */
void mge__spec_describe(char *buf, size_t cap, const struct tnode *v);
/* @s (@len bytes) made safe for a message, at most @max_chars characters. */
void mge__spec_sanitize(char *dst, size_t cap, const char *s, size_t len, size_t max_chars);
/* The closest of @names (NULL-terminated) to @s, or NULL when none is close. */
const char *mge__spec_suggest(const char *s, const char *const *names);
/* YAML null written plain (empty, ~, null). */
bool mge__spec_is_null(const struct tnode *t);
/* Plain decimal integer / finite decimal number / true or false, as every spec key reads them. */
bool mge__spec_int(const struct tnode *v, int64_t *out);
bool mge__spec_num(const struct tnode *v, double *out);
bool mge__spec_bool(const struct tnode *v, bool *out);
/* A name: 1 to @max of A-Z a-z 0-9 . _ - (job names, graph nodes). */
bool mge__spec_is_name(const struct tnode *v, size_t max);

/*
 * graphspec.c: validate model.nodes of the model mapping @model (its data and train sections
 * already validated into @spec: the batch size and classes) into a new *@out.
 * Returns MGE_OK, or MGE_SPEC / MGE_NOMEM with the parse's error filled (*@out NULL).
 */
int mge__graphspec_check(struct ctx *c, const struct tnode *model, const struct mge_jobspec *spec,
                         struct mge_graphspec **out);
/* model.nodes as JSON: every node with its attributes, defaults filled in (NULL on OOM). */
json_t *mge__graphspec_to_json(const struct mge_graphspec *gs);

#endif
