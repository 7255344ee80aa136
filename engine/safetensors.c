/*
 * safetensors.c: the safetensors reader and writer (engine/safetensors.h); the reader takes
 * untrusted files, so every header field is checked before a byte of data is touched.
 */
#include "engine/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"

/* ---- writing ---- */

/* The dtypes we read and write: float32 weights, and int64 for PyTorch's batch-norm counters
 * (num_batches_tracked), which a strict load_state_dict wants. */
static const struct {
    const char *name;
    int dtype;
    unsigned size;
} dtypes[] = {{"F32", MGE_CKPT_F32, 4}, {"I64", MGE_CKPT_I64, 8}};

static int dtype_index(int dtype)
{
    for (int i = 0; i < (int)(sizeof(dtypes) / sizeof(dtypes[0])); i++)
        if (dtypes[i].dtype == dtype)
            return i;
    return -1;
}

static json_t *shape_json(const struct mge_ckpt_tensor *t)
{
    json_t *a = json_array();
    for (int d = 0; a && d < t->ndim; d++)
        if (json_array_append_new(a, json_integer(t->shape[d])) != 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* The header JSON, padded with spaces to a multiple of 8; NULL on OOM (*@dup: a name twice). */
static char *header_build(const struct mge_ckpt_tensor *ts, int n, const char *const *meta,
                          size_t *len, int *dup)
{
    json_t *root = json_object(), *md = NULL;
    char *text = NULL, *out = NULL;
    uint64_t off = 0;
    int bad = root == NULL;
    *dup = 0;
    if (meta && meta[0]) {
        md = json_object();
        for (int i = 0; md && meta[i] && meta[i + 1]; i += 2)
            bad |= json_object_set_new(md, meta[i], json_string(meta[i + 1])) != 0;
        bad |= !md || json_object_set_new(root, "__metadata__", md) != 0;
    }
    for (int i = 0; !bad && i < n; i++) {
        if (json_object_get(root, ts[i].name)) {
            *dup = 1;
            bad = 1;
            break;
        }
        json_t *e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", dtypes[dtype_index(ts[i].dtype)].name,
                              "shape", shape_json(&ts[i]), "data_offsets", (json_int_t)off,
                              (json_int_t)(off + ts[i].nbytes));
        bad |= !e || json_object_set_new(root, ts[i].name, e) != 0;
        off += ts[i].nbytes;
    }
    if (!bad)
        text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text)
        return NULL;
    size_t tl = strlen(text), padded = (tl + 7) & ~(size_t)7;
    out = mge_malloc(padded + 1);
    if (out) {
        memcpy(out, text, tl);
        memset(out + tl, ' ', padded - tl);
        out[padded] = '\0';
        *len = padded;
    }
    free(text);
    return out;
}

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return errno ? errno : EIO;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

int mge_safetensors_write(const char *path, const struct mge_ckpt_tensor *ts, int n,
                          const char *const *meta, char *err, size_t errlen)
{
    char *header = NULL, tmp[4200];
    size_t hlen = 0;
    int rc = MGE_OK, dup, e = 0, fd;
    uint8_t lenb[8];

    for (int i = 0; i < n; i++)
        if (dtype_index(ts[i].dtype) < 0 || !ts[i].name || !ts[i].name[0])
            return MGE_ERR_FILL(MGE_INVAL, err, errlen,
                                "%s: tensor %d '%s': only named F32 or I64 tensors", path, i,
                                ts[i].name ? ts[i].name : "");
    header = header_build(ts, n, meta, &hlen, &dup);
    if (!header)
        return dup ? MGE_ERR_FILL(MGE_INVAL, err, errlen, "%s: a tensor name appears twice", path)
                   : MGE_ERR_FILL(MGE_NOMEM, err, errlen, "%s: out of memory", path);
    for (int b = 0; b < 8; b++)
        lenb[b] = (uint8_t)((uint64_t)hlen >> (8 * b));
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        e = errno;
        rc =
            MGE_ERR_FILL(MGE_IO, err, errlen, "%s: cannot create '%s': %s", path, tmp, strerror(e));
        goto out_free_header;
    }
    e = write_all(fd, lenb, sizeof(lenb));
    if (!e)
        e = write_all(fd, header, hlen);
    for (int i = 0; !e && i < n; i++)
        e = write_all(fd, ts[i].data, ts[i].nbytes); /* x86-64 and arm64: already little-endian */
    if (!e && fsync(fd) != 0)
        e = errno;
    if (close(fd) != 0 && !e)
        e = errno;
    if (!e && rename(tmp, path) != 0)
        e = errno;
    if (e) {
        rc = MGE_ERR_FILL(MGE_IO, err, errlen, "%s: cannot write: %s", path, strerror(e));
        unlink(tmp);
    }
out_free_header:
    mge_free(header);
    return rc;
}

/* ---- reading ---- */

struct st_priv {
    uint8_t *image; /* the file, copied */
    char *names;    /* NUL-separated tensor names */
};

struct range {
    uint64_t begin, end;
    int idx;
};

static int range_cmp(const void *a, const void *b)
{
    const struct range *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* One tensor entry @v called @name into @t; its byte range into @r. */
static int entry_parse(const char *name, json_t *v, uint64_t data_len, struct mge_ckpt_tensor *t,
                       struct range *r, char *err, size_t errlen)
{
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape");
    json_t *off = json_object_get(v, "data_offsets");
    uint64_t numel = 1;
    const char *k;
    json_t *ignored;
    if (!json_is_object(v))
        return MGE_ERR_FILL(MGE_FORMAT, err, errlen, "tensor '%s': entry is not an object", name);
    json_object_foreach(v, k, ignored)
    {
        if (strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "data_offsets"))
            return MGE_ERR_FILL(MGE_FORMAT, err, errlen, "tensor '%s': unknown key '%s'", name, k);
    }
    if (!json_is_string(dt) || !json_is_array(sh) || !json_is_array(off))
        return MGE_ERR_FILL(MGE_FORMAT, err, errlen,
                            "tensor '%s': needs dtype (string), shape and data_offsets (arrays)",
                            name);
    int di = -1;
    for (int i = 0; i < (int)(sizeof(dtypes) / sizeof(dtypes[0])); i++)
        if (!strcmp(json_string_value(dt), dtypes[i].name))
            di = i;
    if (di < 0)
        return MGE_ERR_FILL(MGE_UNSUPPORTED, err, errlen,
                            "tensor '%s': dtype '%.16s' (only F32, and I64 for counters, for now)",
                            name, json_string_value(dt));
    if (json_array_size(sh) > MGE_CKPT_MAX_DIMS)
        return MGE_ERR_FILL(MGE_FORMAT, err, errlen, "tensor '%s': %zu dims (at most %d)", name,
                            json_array_size(sh), MGE_CKPT_MAX_DIMS);
    t->ndim = (int)json_array_size(sh);
    for (int d = 0; d < t->ndim; d++) {
        json_t *x = json_array_get(sh, (size_t)d);
        json_int_t dim = json_is_integer(x) ? json_integer_value(x) : -1;
        if (dim < 0 || dim > (json_int_t)data_len)
            return MGE_ERR_FILL(MGE_FORMAT, err, errlen,
                                "tensor '%s': shape[%d] is not an integer in [0, %llu]", name, d,
                                (unsigned long long)data_len);
        t->shape[d] = dim;
        numel = dim == 0 || numel == 0 ? 0 : numel * (uint64_t)dim;
        if (numel > data_len)
            return MGE_ERR_FILL(MGE_FORMAT, err, errlen, "tensor '%s': shape larger than the file",
                                name);
    }
    json_t *b = json_array_get(off, 0), *e = json_array_get(off, 1);
    if (json_array_size(off) != 2 || !json_is_integer(b) || !json_is_integer(e) ||
        json_integer_value(b) < 0 || json_integer_value(e) < json_integer_value(b))
        return MGE_ERR_FILL(MGE_FORMAT, err, errlen,
                            "tensor '%s': data_offsets must be [begin, end] with 0 <= begin <= end",
                            name);
    r->begin = (uint64_t)json_integer_value(b);
    r->end = (uint64_t)json_integer_value(e);
    if (r->end > data_len)
        return MGE_ERR_FILL(MGE_FORMAT, err, errlen,
                            "tensor '%s': data_offsets [%llu, %llu] outside the %llu data bytes",
                            name, (unsigned long long)r->begin, (unsigned long long)r->end,
                            (unsigned long long)data_len);
    if (r->end - r->begin != numel * dtypes[di].size)
        return MGE_ERR_FILL(MGE_FORMAT, err, errlen,
                            "tensor '%s': data_offsets span %llu bytes, shape and dtype need %llu",
                            name, (unsigned long long)(r->end - r->begin),
                            (unsigned long long)(numel * dtypes[di].size));
    t->dtype = dtypes[di].dtype;
    t->nbytes = (size_t)(r->end - r->begin);
    return MGE_OK;
}

static int metadata_check(json_t *md, char *err, size_t errlen)
{
    const char *k;
    json_t *v;
    if (!json_is_object(md))
        return MGE_ERR_FILL(MGE_FORMAT, err, errlen, "__metadata__ is not an object");
    json_object_foreach(md, k, v)
    {
        if (!json_is_string(v))
            return MGE_ERR_FILL(MGE_FORMAT, err, errlen, "__metadata__: '%s' is not a string", k);
    }
    return MGE_OK;
}

/* The ranges, sorted, must tile [0, data_len) exactly. */
static int ranges_check(struct range *r, int n, const struct mge_ckpt_tensor *ts, uint64_t data_len,
                        char *err, size_t errlen)
{
    uint64_t at = 0;
    qsort(r, (size_t)n, sizeof(*r), range_cmp);
    for (int i = 0; i < n; i++) {
        if (r[i].begin < at)
            return MGE_ERR_FILL(MGE_FORMAT, err, errlen,
                                "tensor '%s': data_offsets [%llu, %llu] overlap "
                                "tensor '%s' (ends at %llu)",
                                ts[r[i].idx].name, (unsigned long long)r[i].begin,
                                (unsigned long long)r[i].end, ts[r[i - 1].idx].name,
                                (unsigned long long)at);
        if (r[i].begin > at)
            return MGE_ERR_FILL(
                MGE_FORMAT, err, errlen,
                "tensor '%s': data_offsets begin at %llu, leaving bytes [%llu, %llu) unused",
                ts[r[i].idx].name, (unsigned long long)r[i].begin, (unsigned long long)at,
                (unsigned long long)r[i].begin);
        at = r[i].end;
    }
    if (at != data_len)
        return MGE_ERR_FILL(MGE_FORMAT, err, errlen, "%llu data bytes after the last tensor",
                            (unsigned long long)(data_len - at));
    return MGE_OK;
}

int mge_safetensors_decode(const void *buf, size_t len, struct mge_safetensors **out, char *err,
                           size_t errlen)
{
    const uint8_t *p = buf;
    struct mge_safetensors *st = NULL;
    struct st_priv *pv = NULL;
    struct range *ranges = NULL;
    json_t *root = NULL;
    json_error_t jerr;
    uint64_t hlen = 0, data_len;
    size_t names_len = 0, at = 0;
    const char *k;
    json_t *v;
    int rc = MGE_OK, n = 0;

    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    if (len < 8)
        return MGE_ERR_FILL(MGE_FORMAT, err, errlen,
                            "%zu bytes: too short for the 8-byte header length", len);
    for (int b = 7; b >= 0; b--)
        hlen = hlen << 8 | p[b];
    if (hlen < 2 || hlen > MGE_SAFETENSORS_HEADER_MAX || hlen > len - 8)
        return MGE_ERR_FILL(MGE_FORMAT, err, errlen,
                            "header length %llu outside [2, %llu] (the file has %zu bytes)",
                            (unsigned long long)hlen,
                            (unsigned long long)(len - 8 < MGE_SAFETENSORS_HEADER_MAX
                                                     ? len - 8
                                                     : MGE_SAFETENSORS_HEADER_MAX),
                            len);
    if (p[8] != '{')
        return MGE_ERR_FILL(MGE_FORMAT, err, errlen, "header does not start with '{'");
    data_len = len - 8 - hlen;
    root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return MGE_ERR_FILL(MGE_FORMAT, err, errlen, "header JSON, column %d: %s", jerr.column,
                            jerr.text);
    if (!json_is_object(root)) {
        rc = MGE_ERR_FILL(MGE_FORMAT, err, errlen, "header is not a JSON object");
        goto out_decref;
    }
    json_object_foreach(root, k, v)
    {
        if (!strcmp(k, "__metadata__")) {
            if ((rc = metadata_check(v, err, errlen)) != MGE_OK)
                goto out_decref;
            continue;
        }
        if (!k[0]) {
            rc = MGE_ERR_FILL(MGE_FORMAT, err, errlen, "a tensor has an empty name");
            goto out_decref;
        }
        n++;
        names_len += strlen(k) + 1;
    }
    st = mge_calloc(1, sizeof(*st));
    pv = mge_calloc(1, sizeof(*pv));
    if (st)
        st->tensors = mge_calloc((size_t)n + 1, sizeof(*st->tensors));
    ranges = mge_calloc((size_t)n + 1, sizeof(*ranges));
    if (pv) {
        pv->image = mge_malloc(len);
        pv->names = mge_malloc(names_len + 1);
    }
    if (st)
        st->priv = pv; /* freed with it from here on */
    if (!st || !pv || !st->tensors || !ranges || !pv->image || !pv->names) {
        if (!st && pv) {
            mge_free(pv->image);
            mge_free(pv->names);
            mge_free(pv);
        }
        rc = MGE_ERR_FILL(MGE_NOMEM, err, errlen, "out of memory for a %zu-byte file", len);
        goto out_free;
    }
    memcpy(pv->image, buf, len);
    json_object_foreach(root, k, v)
    {
        if (!strcmp(k, "__metadata__"))
            continue;
        struct mge_ckpt_tensor *t = &st->tensors[st->n_tensors];
        size_t kl = strlen(k) + 1;
        memcpy(pv->names + at, k, kl);
        t->name = pv->names + at;
        at += kl;
        rc = entry_parse(k, v, data_len, t, &ranges[st->n_tensors], err, errlen);
        if (rc != MGE_OK)
            goto out_free;
        t->data = pv->image + 8 + hlen + ranges[st->n_tensors].begin;
        ranges[st->n_tensors].idx = st->n_tensors;
        st->n_tensors++;
    }
    if ((rc = ranges_check(ranges, st->n_tensors, st->tensors, data_len, err, errlen)) != MGE_OK)
        goto out_free;
    *out = st;
    st = NULL;
out_free:
    mge_free(ranges);
    mge_safetensors_free(st);
out_decref:
    json_decref(root);
    return rc;
}

int mge_safetensors_read(const char *path, struct mge_safetensors **out, char *err, size_t errlen)
{
    struct stat sb;
    uint8_t *buf = NULL;
    size_t got = 0;
    int rc, e, fd;
    *out = NULL;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        e = errno;
        return MGE_ERR_FILL(e == ENOENT ? MGE_NOENT : MGE_IO, err, errlen, "%s: cannot open: %s",
                            path, strerror(e));
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        rc = MGE_ERR_FILL(MGE_IO, err, errlen, "%s: not a regular file", path);
        goto out_close;
    }
    buf = mge_malloc((size_t)sb.st_size + 1);
    if (!buf) {
        rc = MGE_ERR_FILL(MGE_NOMEM, err, errlen, "%s: out of memory", path);
        goto out_close;
    }
    while (got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    if (got != (size_t)sb.st_size) {
        rc = MGE_ERR_FILL(MGE_IO, err, errlen, "%s: cannot read", path);
        goto out_free;
    }
    rc = mge_safetensors_decode(buf, got, out, err, errlen);
    if (rc != MGE_OK && err && errlen) {
        char inner[512];
        snprintf(inner, sizeof(inner), "%s", err);
        snprintf(err, errlen, "%s: %s", path, inner);
    }
out_free:
    mge_free(buf);
out_close:
    close(fd);
    return rc;
}

const struct mge_ckpt_tensor *mge_safetensors_find(const struct mge_safetensors *st,
                                                   const char *name)
{
    for (int i = 0; st && i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i].name, name))
            return &st->tensors[i];
    return NULL;
}

void mge_safetensors_free(struct mge_safetensors *st)
{
    if (!st)
        return;
    struct st_priv *pv = st->priv;
    if (pv) {
        mge_free(pv->image);
        mge_free(pv->names);
        mge_free(pv);
    }
    mge_free(st->tensors);
    mge_free(st);
}
