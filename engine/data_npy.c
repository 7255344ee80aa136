/* data_npy.c: reads NumPy .npy input and label arrays (memory-mapped) into an mge_dataset. */
#include "engine/data.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/dataroot.h"
#include "common/err.h"
#include "common/jobspec.h"

/* A header is a short dict; refuse a length field that claims more before reading it. */
#define NPY_MAX_HEADER (1 << 20)
#define NPY_MAX_BYTES ((int64_t)1 << 40)

static const char *const dtype_names[] = {"uint8", "float32", "int32", "int64"};
static const int dtype_size[] = {1, 4, 4, 8};

static int why_set(int code, char *why, size_t whylen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The header parser's failures: fill @why without logging (the loader logs once, with the
 * file's name; the fuzzer calls the parser millions of times). */
static int why_set(int code, char *why, size_t whylen, const char *fmt, ...)
{
    va_list ap;
    if (why && whylen) {
        va_start(ap, fmt);
        vsnprintf(why, whylen, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* ---- the header dict: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } ---- */

struct npy_lex {
    const char *p, *end;
};

static void lex_ws(struct npy_lex *l)
{
    while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' || *l->p == '\n' || *l->p == '\r'))
        l->p++;
}

static bool lex_char(struct npy_lex *l, char ch)
{
    lex_ws(l);
    if (l->p < l->end && *l->p == ch) {
        l->p++;
        return true;
    }
    return false;
}

/* A quoted string of at most @cap - 1 bytes ('x' or "x", no escapes) into @out. */
static bool lex_str(struct npy_lex *l, char *out, size_t cap)
{
    size_t n = 0;
    char q;
    lex_ws(l);
    if (l->p >= l->end || (*l->p != '\'' && *l->p != '"'))
        return false;
    q = *l->p++;
    while (l->p < l->end && *l->p != q) {
        if (*l->p == '\\' || n + 1 >= cap)
            return false;
        out[n++] = *l->p++;
    }
    if (l->p >= l->end)
        return false;
    l->p++;
    out[n] = '\0';
    return true;
}

static bool lex_word(struct npy_lex *l, const char *w)
{
    size_t n = strlen(w);
    lex_ws(l);
    if ((size_t)(l->end - l->p) < n || memcmp(l->p, w, n) != 0)
        return false;
    l->p += n;
    return true;
}

/* A tuple of non-negative ints: (), (5,), (2, 3) with an optional trailing comma. */
static int lex_shape(struct npy_lex *l, struct mge_npy_header *h, char *why, size_t whylen)
{
    if (!lex_char(l, '('))
        return why_set(MGE_FORMAT, why, whylen, "'shape' is not a tuple");
    h->ndim = 0;
    for (;;) {
        int64_t v = 0;
        bool digits = false;
        if (lex_char(l, ')'))
            break;
        lex_ws(l);
        while (l->p < l->end && *l->p >= '0' && *l->p <= '9') {
            if (v > (NPY_MAX_BYTES - 9) / 10)
                return why_set(MGE_TOOBIG, why, whylen, "a 'shape' dimension is too large");
            v = v * 10 + (*l->p++ - '0');
            digits = true;
        }
        if (!digits)
            return why_set(MGE_FORMAT, why, whylen, "'shape' holds something that is not a size");
        if (h->ndim == MGE_NPY_MAX_DIMS)
            return why_set(MGE_FORMAT, why, whylen, "'shape' has more than %d dimensions",
                           MGE_NPY_MAX_DIMS);
        h->shape[h->ndim++] = v;
        if (lex_char(l, ')'))
            break;
        if (!lex_char(l, ','))
            return why_set(MGE_FORMAT, why, whylen, "'shape' is not a tuple of sizes");
    }
    return MGE_OK;
}

/* Whether @s may be quoted in a message: a dtype or key name of letters, digits and <>|=_
 * (a message never carries other bytes of a file). */
static bool token_quotable(const char *s)
{
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              strchr("<>|=_", *s)))
            return false;
    return true;
}

static int parse_descr(const char *d, struct mge_npy_header *h, char *why, size_t whylen)
{
    static const struct {
        const char *name;
        enum mge_npy_dtype t;
    } known[] = {{"|u1", MGE_NPY_U8},
                 {"<u1", MGE_NPY_U8},
                 {"<f4", MGE_NPY_F32},
                 {"<i4", MGE_NPY_I32},
                 {"<i8", MGE_NPY_I64}};
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        if (strcmp(d, known[i].name) == 0) {
            h->dtype = known[i].t;
            return MGE_OK;
        }
    }
    if (!token_quotable(d))
        d = "?";
    if (d[0] == '>')
        return why_set(MGE_FORMAT, why, whylen,
                       "big-endian dtype '%s' is not supported (save it little-endian: "
                       "a.astype(a.dtype.newbyteorder('<')))",
                       d);
    return why_set(
        MGE_FORMAT, why, whylen,
        "unsupported dtype '%s' (uint8 '|u1', float32 '<f4', int32 '<i4' or int64 '<i8')", d);
}

int mge_npy_parse_header(const uint8_t *buf, size_t len, struct mge_npy_header *h, char *why,
                         size_t whylen)
{
    static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    struct npy_lex l;
    size_t pre, hlen;
    bool seen[3] = {false, false, false};
    int rc;

    memset(h, 0, sizeof(*h));
    if (why && whylen)
        why[0] = '\0';
    if (len < 8 || memcmp(buf, magic, 6) != 0)
        return why_set(MGE_FORMAT, why, whylen, "bad magic: not a .npy file (expected \\x93NUMPY)");
    if (buf[6] == 1 && buf[7] == 0) {
        pre = 10;
        if (len < pre)
            return why_set(MGE_CORRUPT, why, whylen, "truncated: %zu of %zu header bytes", len,
                           pre);
        hlen = (size_t)buf[8] | (size_t)buf[9] << 8;
    } else if ((buf[6] == 2 || buf[6] == 3) && buf[7] == 0) {
        pre = 12;
        if (len < pre)
            return why_set(MGE_CORRUPT, why, whylen, "truncated: %zu of %zu header bytes", len,
                           pre);
        hlen = (size_t)buf[8] | (size_t)buf[9] << 8 | (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
    } else {
        return why_set(MGE_FORMAT, why, whylen, "unsupported .npy version %u.%u (1.0, 2.0 or 3.0)",
                       buf[6], buf[7]);
    }
    if (hlen > NPY_MAX_HEADER)
        return why_set(MGE_FORMAT, why, whylen, "header length %zu is over %d bytes", hlen,
                       NPY_MAX_HEADER);
    if (len < pre + hlen)
        return why_set(MGE_CORRUPT, why, whylen, "truncated: %zu of %zu header bytes", len,
                       pre + hlen);
    h->data_offset = pre + hlen;
    l.p = (const char *)buf + pre;
    l.end = l.p + hlen;
    if (!lex_char(&l, '{'))
        return why_set(MGE_FORMAT, why, whylen, "header is not a dict");
    for (;;) {
        char key[16], val[16];
        if (lex_char(&l, '}'))
            break;
        if (!lex_str(&l, key, sizeof(key)) || !lex_char(&l, ':'))
            return why_set(MGE_FORMAT, why, whylen, "header dict: expected a key and ':'");
        if (strcmp(key, "descr") == 0 && !seen[0]) {
            seen[0] = true;
            if (!lex_str(&l, val, sizeof(val)))
                return why_set(MGE_FORMAT, why, whylen,
                               "'descr' is not a simple dtype string (structured arrays are not "
                               "supported)");
            if ((rc = parse_descr(val, h, why, whylen)) != MGE_OK)
                return rc;
        } else if (strcmp(key, "fortran_order") == 0 && !seen[1]) {
            seen[1] = true;
            if (lex_word(&l, "True"))
                return why_set(MGE_FORMAT, why, whylen,
                               "fortran_order is True: only C order is supported "
                               "(save np.ascontiguousarray(a))");
            if (!lex_word(&l, "False"))
                return why_set(MGE_FORMAT, why, whylen, "'fortran_order' is not True or False");
        } else if (strcmp(key, "shape") == 0 && !seen[2]) {
            seen[2] = true;
            if ((rc = lex_shape(&l, h, why, whylen)) != MGE_OK)
                return rc;
        } else {
            return why_set(MGE_FORMAT, why, whylen, "header dict: unknown or repeated key '%s'",
                           token_quotable(key) ? key : "?");
        }
        if (lex_char(&l, '}'))
            break;
        if (!lex_char(&l, ','))
            return why_set(MGE_FORMAT, why, whylen, "header dict: expected ',' or '}'");
    }
    lex_ws(&l);
    if (l.p != l.end)
        return why_set(MGE_FORMAT, why, whylen, "header: data after the dict");
    if (!seen[0] || !seen[1] || !seen[2])
        return why_set(MGE_FORMAT, why, whylen, "header dict lacks '%s'",
                       !seen[0]   ? "descr"
                       : !seen[1] ? "fortran_order"
                                  : "shape");
    return MGE_OK;
}

/* ---- files ---- */

struct npy_map {
    struct mge_npy_header h;
    void *base;  /* the mapping, or NULL */
    size_t len;  /* bytes mapped (the whole file) */
    int64_t n;   /* shape[0] */
    int64_t per; /* elements per sample: product of shape[1..] */
};

/* Open @path through the data roots, parse its header, check its size, map it read-only. */
static int npy_map_open(struct npy_map *m, const char *path, char *err, size_t errlen)
{
    uint8_t head[4096];
    char why[512];
    struct stat st;
    int fd, rc;
    ssize_t got;
    size_t want;
    int64_t elems = 1;

    memset(m, 0, sizeof(*m));
    rc = mge_data_open(mge__dataset_roots(), path, &fd, why, sizeof(why));
    if (rc != MGE_OK)
        return MGE_ERR_FILL(rc, err, errlen, "%s", why);
    if (fstat(fd, &st) != 0) {
        rc = MGE_ERR_FILL(MGE_IO, err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        goto out_close;
    }
    got = pread(fd, head, sizeof(head), 0);
    if (got < 0) {
        rc = MGE_ERR_FILL(MGE_IO, err, errlen, "%s: read error: %s", path, strerror(errno));
        goto out_close;
    }
    want = (size_t)got;
    rc = mge_npy_parse_header(head, want, &m->h, why, sizeof(why));
    if (rc == MGE_CORRUPT && want == sizeof(head) && (size_t)st.st_size > want) {
        /* a long header: map the file and parse again */
        want = 0;
    } else if (rc != MGE_OK) {
        rc = MGE_ERR_FILL(rc, err, errlen, "%s: %s", path, why);
        goto out_close;
    }
    m->len = (size_t)st.st_size;
    m->base = mmap(NULL, m->len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m->base == MAP_FAILED) {
        m->base = NULL;
        rc = MGE_ERR_FILL(MGE_IO, err, errlen, "%s: cannot map: %s", path, strerror(errno));
        goto out_close;
    }
    if (want == 0 && (rc = mge_npy_parse_header(m->base, m->len, &m->h, why, sizeof(why)))) {
        rc = MGE_ERR_FILL(rc, err, errlen, "%s: %s", path, why);
        goto out_close;
    }
    if (m->h.ndim == 0) {
        rc =
            MGE_ERR_FILL(MGE_FORMAT, err, errlen, "%s: a 0-dimensional array has no samples", path);
        goto out_close;
    }
    for (int i = 0; i < m->h.ndim; i++) {
        if (m->h.shape[i] == 0) {
            rc = MGE_ERR_FILL(MGE_FORMAT, err, errlen, "%s: dimension %d of the shape is 0", path,
                              i);
            goto out_close;
        }
        if (elems > NPY_MAX_BYTES / m->h.shape[i]) {
            rc = MGE_ERR_FILL(MGE_TOOBIG, err, errlen, "%s: shape is too large", path);
            goto out_close;
        }
        elems *= m->h.shape[i];
    }
    m->n = m->h.shape[0];
    m->per = elems / m->n;
    int64_t bytes = elems * dtype_size[m->h.dtype];
    int64_t have = (int64_t)m->len - (int64_t)m->h.data_offset;
    if (have < bytes) {
        rc = MGE_ERR_FILL(MGE_CORRUPT, err, errlen,
                          "%s: truncated: header says %lld samples, file has data for %lld", path,
                          (long long)m->n,
                          (long long)(have < 0 ? 0 : have / (m->per * dtype_size[m->h.dtype])));
        goto out_close;
    }
    if (have > bytes) {
        rc = MGE_ERR_FILL(MGE_FORMAT, err, errlen,
                          "%s: trailing data after the samples the header declares", path);
        goto out_close;
    }
out_close:
    close(fd);
    if (rc != MGE_OK && m->base) {
        munmap(m->base, m->len);
        m->base = NULL;
    }
    return rc;
}

static const uint8_t *npy_data(const struct npy_map *m)
{
    return (const uint8_t *)m->base + m->h.data_offset;
}

static void shape_str(const struct mge_npy_header *h, char *out, size_t len)
{
    size_t at = 0;
    at += (size_t)snprintf(out, len, "[");
    for (int i = 0; i < h->ndim && at < len; i++)
        at += (size_t)snprintf(out + at, len - at, "%s%lld", i ? ", " : "", (long long)h->shape[i]);
    if (at < len)
        snprintf(out + at, len - at, "]");
}

static int load_inputs(struct mge_dataset *ds, const char *path, const struct mge_data_expect *want,
                       char *err, size_t errlen)
{
    struct npy_map m;
    char shp[128];
    int rc = npy_map_open(&m, path, err, errlen);
    if (rc != MGE_OK)
        return rc;
    shape_str(&m.h, shp, sizeof(shp));
    if (m.h.dtype != MGE_NPY_U8 && m.h.dtype != MGE_NPY_F32) {
        rc = MGE_ERR_FILL(MGE_FORMAT, err, errlen, "%s: inputs must be uint8 or float32, not %s",
                          path, dtype_names[m.h.dtype]);
        goto out_unmap;
    }
    if (m.h.ndim < 2) {
        rc = MGE_ERR_FILL(MGE_FORMAT, err, errlen,
                          "%s: inputs have shape %s; expected [N, D], [N, H, W] or [N, C, H, W]",
                          path, shp);
        goto out_unmap;
    }
    if (m.per > INT32_MAX) {
        rc = MGE_ERR_FILL(MGE_TOOBIG, err, errlen, "%s: %lld values per sample is too many", path,
                          (long long)m.per);
        goto out_unmap;
    }
    ds->n = m.n;
    ds->dim = m.per;
    ds->c = m.h.ndim == 4 ? (int)m.h.shape[1] : 1;
    ds->h = m.h.ndim == 2 ? 1 : (int)m.h.shape[m.h.ndim - 2];
    ds->w = (int)m.h.shape[m.h.ndim - 1];
    if (want && want->c > 0) {
        if (m.h.ndim > 2 && (ds->c != want->c || ds->h != want->h || ds->w != want->w)) {
            rc = MGE_ERR_FILL(MGE_FORMAT, err, errlen,
                              "%s: shape %s does not match data.image [%d, %d, %d] of the spec",
                              path, shp, want->c, want->h, want->w);
            goto out_unmap;
        }
        ds->c = want->c;
        ds->h = want->h;
        ds->w = want->w;
    }
    if (want && want->dim > 0 && want->dim != m.per) {
        rc = MGE_ERR_FILL(MGE_FORMAT, err, errlen,
                          "%s: shape %s has %lld values per sample but the spec says %lld "
                          "(data.input_dim or data.image)",
                          path, shp, (long long)m.per, (long long)want->dim);
        goto out_unmap;
    }
    ds->f32 = m.h.dtype == MGE_NPY_F32;
    ds->map = m.base;
    ds->map_len = m.len;
    ds->pixels = (uint8_t *)npy_data(&m);
    return MGE_OK;
out_unmap:
    munmap(m.base, m.len);
    return rc;
}

static int load_labels(struct mge_dataset *ds, const char *path, const char *inputs, int classes,
                       char *err, size_t errlen)
{
    struct npy_map m;
    char shp[128];
    int64_t maxl = 0;
    int rc = npy_map_open(&m, path, err, errlen);
    if (rc != MGE_OK)
        return rc;
    shape_str(&m.h, shp, sizeof(shp));
    if (m.h.dtype == MGE_NPY_F32) {
        rc = MGE_ERR_FILL(MGE_FORMAT, err, errlen,
                          "%s: labels must be uint8, int32 or int64, not float32", path);
        goto out_unmap;
    }
    if (m.h.ndim != 1) {
        rc = MGE_ERR_FILL(MGE_FORMAT, err, errlen, "%s: labels have shape %s; expected [N]", path,
                          shp);
        goto out_unmap;
    }
    if (m.n != ds->n) {
        rc = MGE_ERR_FILL(MGE_FORMAT, err, errlen, "%s: has %lld labels but %s has %lld samples",
                          path, (long long)m.n, inputs, (long long)ds->n);
        goto out_unmap;
    }
    ds->labels = mge_malloc((size_t)ds->n * sizeof(*ds->labels));
    if (!ds->labels) {
        rc = MGE_ERR_FILL(MGE_NOMEM, err, errlen, "%s: cannot allocate %lld labels", path,
                          (long long)ds->n);
        goto out_unmap;
    }
    const uint8_t *p = npy_data(&m);
    for (int64_t i = 0; i < ds->n; i++) {
        int64_t v;
        if (m.h.dtype == MGE_NPY_U8) {
            v = p[i];
        } else if (m.h.dtype == MGE_NPY_I32) {
            int32_t t;
            memcpy(&t, p + 4 * i, 4);
            v = t;
        } else {
            memcpy(&v, p + 8 * i, 8);
        }
        if (v < 0 || (classes > 0 && v >= classes) || v >= MGE_CLASSES_MAX) {
            rc = MGE_ERR_FILL(MGE_CORRUPT, err, errlen,
                              "%s: label %lld of sample %lld is out of range [0, %d)", path,
                              (long long)v, (long long)i, classes > 0 ? classes : MGE_CLASSES_MAX);
            goto out_unmap;
        }
        if (v > maxl)
            maxl = v;
        ds->labels[i] = (int32_t)v;
    }
    ds->classes = classes > 0 ? classes : (int)maxl + 1;
out_unmap:
    munmap(m.base, m.len);
    return rc;
}

int mge_dataset_load_npy(struct mge_dataset *ds, const char *inputs, const char *labels,
                         const struct mge_data_expect *want, char *err, size_t errlen)
{
    int rc;
    memset(ds, 0, sizeof(*ds));
    if (err && errlen)
        err[0] = '\0';
    rc = load_inputs(ds, inputs, want, err, errlen);
    if (rc == MGE_OK)
        rc = load_labels(ds, labels, inputs, want ? want->classes : 0, err, errlen);
    if (rc != MGE_OK)
        mge_dataset_fini(ds);
    return rc;
}
