/* data_idx.c: reads IDX image and label files (MNIST layout, gzip or plain) into an mge_dataset. */
#include "engine/data.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/alloc.h"
#include "common/dataroot.h"
#include "common/err.h"

#define IDX_TYPE_UBYTE 0x08
#define IDX_MAX_DIMS 4
/* A header may claim anything; refuse sizes that cannot be real before allocating them. */
#define IDX_MAX_BYTES ((int64_t)1 << 40)

struct idx_file {
    const char *path;
    gzFile gz;
    int ndims;
    int64_t dims[IDX_MAX_DIMS];
    int64_t size; /* bytes on disk (compressed when gzip) */
    bool gzip;
};

/* fail(code, err, errlen, fmt, ...): fill @err and log once where the error starts; returns
 * @code (common/err.h) */
#define fail MGE_ERR_FILL

/* The roots every load checks at open (mge_dataset_set_roots); NULL: any path. */
static const struct mge_data_roots *g_roots;

void mge_dataset_set_roots(const struct mge_data_roots *dr)
{
    g_roots = dr;
}

const struct mge_data_roots *mge__dataset_roots(void)
{
    return g_roots;
}

/* What a file that is not IDX was, for messages that must not echo its bytes. */
static void idx_not_idx(const struct idx_file *f, char *what, size_t len)
{
    snprintf(what, len, "a %s file of %lld bytes", f->gzip ? "gzip" : "plain", (long long)f->size);
}

static int idx_open(struct idx_file *f, const char *path, char *err, size_t errlen)
{
    struct stat st;
    char why[512];
    int fd, rc;
    memset(f, 0, sizeof(*f));
    f->path = path;
    /* the roots are checked on the descriptor we read, so a link flipped after a check of the
     * path cannot make us read another file; a FIFO or directory is refused here too */
    rc = mge_data_open(g_roots, path, &fd, why, sizeof(why));
    if (rc != MGE_OK)
        return fail(rc, err, errlen, "%s", why);
    if (fstat(fd, &st) == 0)
        f->size = st.st_size;
    f->gz = gzdopen(fd, "rb");
    if (!f->gz) {
        close(fd);
        return fail(MGE_NOMEM, err, errlen, "%s: cannot open: out of memory", path);
    }
    f->gzip = !gzdirect(f->gz);
    return MGE_OK;
}

static void idx_close(struct idx_file *f)
{
    if (f->gz)
        gzclose(f->gz);
    f->gz = NULL;
}

/*
 * Read up to @len bytes; *@got says how many arrived. A short read at end of input is not an
 * error here (the caller words the truncation); a broken gzip stream is.
 */
static int idx_read(struct idx_file *f, void *buf, size_t len, size_t *got, char *err,
                    size_t errlen)
{
    unsigned char *p = buf;
    *got = 0;
    while (len > 0) {
        unsigned chunk = len > (1u << 30) ? (1u << 30) : (unsigned)len;
        int n = gzread(f->gz, p, chunk);
        if (n < 0) {
            int zerr;
            const char *msg = gzerror(f->gz, &zerr);
            if (zerr == Z_ERRNO)
                return fail(MGE_IO, err, errlen, "%s: read error: %s", f->path, strerror(errno));
            if (zerr == Z_MEM_ERROR)
                return fail(MGE_NOMEM, err, errlen, "%s: out of memory in zlib", f->path);
            return fail(MGE_CORRUPT, err, errlen, "%s: broken gzip data: %s", f->path, msg);
        }
        if (n == 0)
            break;
        p += n;
        len -= (size_t)n;
        *got += (size_t)n;
    }
    if (len > 0) {
        /* Short: gzread reports "unexpected end of file" as Z_BUF_ERROR with a short count,
         * which is truncation; any other error is a broken stream. */
        int zerr;
        const char *msg = gzerror(f->gz, &zerr);
        if (zerr != Z_OK && zerr != Z_BUF_ERROR)
            return fail(MGE_CORRUPT, err, errlen, "%s: broken gzip data: %s", f->path, msg);
    }
    return MGE_OK;
}

/* @what: "images" or "labels", for messages; @magic_dims: allowed ranks (bit i = i dims). */
static int idx_read_header(struct idx_file *f, const char *what, unsigned magic_dims, char *err,
                           size_t errlen)
{
    unsigned char h[4 + 4 * IDX_MAX_DIMS];
    char is[96];
    size_t got;
    int rc = idx_read(f, h, 4, &got, err, errlen);
    if (rc != MGE_OK)
        return rc;
    if (got < 4)
        return fail(MGE_CORRUPT, err, errlen, "%s: truncated: %zu of 4 header bytes", f->path, got);
    /* Say what was expected and what the file is, never its bytes: a file the user may not
     * read (/etc/shadow) must not come back in an error message. */
    idx_not_idx(f, is, sizeof(is));
    if (h[0] != 0 || h[1] != 0 || h[3] > IDX_MAX_DIMS || !(magic_dims & (1u << h[3])))
        return fail(MGE_FORMAT, err, errlen,
                    "%s: bad magic: not an IDX file of %s (expected 00 00 08 %s: unsigned bytes, "
                    "%s; it is %s)",
                    f->path, what, magic_dims == (1u << 1) ? "01" : "02, 03 or 04",
                    magic_dims == (1u << 1) ? "1 dimension" : "2 to 4 dimensions", is);
    if (h[2] != IDX_TYPE_UBYTE)
        return fail(MGE_FORMAT, err, errlen,
                    "%s: unsupported IDX data type for %s (only unsigned bytes, 0x08; it is %s)",
                    f->path, what, is);
    f->ndims = h[3];
    rc = idx_read(f, h + 4, 4 * (size_t)f->ndims, &got, err, errlen);
    if (rc != MGE_OK)
        return rc;
    if (got < 4 * (size_t)f->ndims)
        return fail(MGE_CORRUPT, err, errlen, "%s: truncated: %zu of %d header bytes", f->path,
                    4 + got, 4 + 4 * f->ndims);
    for (int i = 0; i < f->ndims; i++) {
        const unsigned char *d = h + 4 + 4 * i;
        f->dims[i] = (int64_t)d[0] << 24 | (int64_t)d[1] << 16 | (int64_t)d[2] << 8 | d[3];
        if (f->dims[i] == 0)
            return fail(MGE_FORMAT, err, errlen, "%s: dimension %d of %s is 0", f->path, i, what);
    }
    return MGE_OK;
}

/* After the payload, the file must end. */
static int idx_expect_end(struct idx_file *f, char *err, size_t errlen)
{
    unsigned char extra;
    size_t got;
    int rc = idx_read(f, &extra, 1, &got, err, errlen);
    if (rc != MGE_OK)
        return rc;
    if (got)
        return fail(MGE_FORMAT, err, errlen,
                    "%s: trailing data after the samples the header declares", f->path);
    return MGE_OK;
}

static int load_images(struct mge_dataset *ds, const char *path, char *err, size_t errlen)
{
    struct idx_file f;
    size_t got, bytes;
    int rc = idx_open(&f, path, err, errlen);
    if (rc != MGE_OK)
        return rc;
    rc = idx_read_header(&f, "images", 1u << 2 | 1u << 3 | 1u << 4, err, errlen);
    if (rc != MGE_OK)
        goto out_close;
    /* Each dim is < 2^32; bound the running product so it cannot overflow. */
    int too_big = 0;
    ds->dim = 1;
    for (int i = 1; i < f.ndims && !too_big; i++) {
        too_big = f.dims[i] > INT32_MAX || ds->dim > IDX_MAX_BYTES / f.dims[i];
        ds->dim *= too_big ? 1 : f.dims[i];
    }
    ds->n = f.dims[0];
    if (too_big || ds->n > IDX_MAX_BYTES / ds->dim) {
        rc = fail(MGE_TOOBIG, err, errlen, "%s: header says %lld images of %lld x %lld: too large",
                  path, (long long)f.dims[0], (long long)f.dims[1], (long long)f.dims[f.ndims - 1]);
        goto out_close;
    }
    ds->c = f.ndims == 4 ? (int)f.dims[1] : 1;
    ds->h = f.ndims == 2 ? 1 : (int)f.dims[f.ndims - 2];
    ds->w = (int)f.dims[f.ndims - 1];
    bytes = (size_t)(ds->n * ds->dim);
    ds->pixels = mge_malloc(bytes);
    if (!ds->pixels) {
        rc = fail(MGE_NOMEM, err, errlen, "%s: cannot allocate %zu bytes for images", path, bytes);
        goto out_close;
    }
    rc = idx_read(&f, ds->pixels, bytes, &got, err, errlen);
    if (rc != MGE_OK)
        goto out_close;
    if (got < bytes) {
        rc = fail(MGE_CORRUPT, err, errlen,
                  "%s: truncated: header says %lld images, file has %lld (and %lld bytes more)",
                  path, (long long)ds->n, (long long)(got / (size_t)ds->dim),
                  (long long)(got % (size_t)ds->dim));
        goto out_close;
    }
    rc = idx_expect_end(&f, err, errlen);
out_close:
    idx_close(&f);
    return rc;
}

static int load_labels(struct mge_dataset *ds, const char *path, const char *images, int classes,
                       char *err, size_t errlen)
{
    struct idx_file f;
    size_t got;
    uint8_t *raw = NULL;
    int maxl = 0;
    int rc = idx_open(&f, path, err, errlen);
    if (rc != MGE_OK)
        return rc;
    rc = idx_read_header(&f, "labels", 1u << 1, err, errlen);
    if (rc != MGE_OK)
        goto out_close;
    if (f.dims[0] != ds->n) {
        rc = fail(MGE_FORMAT, err, errlen, "%s: has %lld labels but %s has %lld images", path,
                  (long long)f.dims[0], images, (long long)ds->n);
        goto out_close;
    }
    ds->labels = mge_malloc((size_t)ds->n * sizeof(*ds->labels));
    raw = mge_malloc((size_t)ds->n);
    if (!ds->labels || !raw) {
        rc =
            fail(MGE_NOMEM, err, errlen, "%s: cannot allocate %lld labels", path, (long long)ds->n);
        goto out_free_raw;
    }
    rc = idx_read(&f, raw, (size_t)ds->n, &got, err, errlen);
    if (rc != MGE_OK)
        goto out_free_raw;
    if (got < (size_t)ds->n) {
        rc = fail(MGE_CORRUPT, err, errlen, "%s: truncated: header says %lld labels, file has %zu",
                  path, (long long)ds->n, got);
        goto out_free_raw;
    }
    rc = idx_expect_end(&f, err, errlen);
    if (rc != MGE_OK)
        goto out_free_raw;
    for (int64_t i = 0; i < ds->n; i++) {
        if (classes > 0 && raw[i] >= classes) {
            rc = fail(MGE_CORRUPT, err, errlen,
                      "%s: label %u of sample %lld is out of range [0, %d)", path, raw[i],
                      (long long)i, classes);
            goto out_free_raw;
        }
        if (raw[i] > maxl)
            maxl = raw[i];
        ds->labels[i] = raw[i];
    }
    ds->classes = classes > 0 ? classes : maxl + 1;
out_free_raw:
    mge_free(raw);
out_close:
    idx_close(&f);
    return rc;
}

int mge_dataset_load_idx_classes(struct mge_dataset *ds, const char *images, const char *labels,
                                 int classes, char *err, size_t errlen)
{
    int rc;
    memset(ds, 0, sizeof(*ds));
    if (err && errlen)
        err[0] = '\0';
    if (classes < 0 || classes > 256)
        return fail(MGE_INVAL, err, errlen, "classes must be in [0, 256], got %d", classes);
    rc = load_images(ds, images, err, errlen);
    if (rc == MGE_OK)
        rc = load_labels(ds, labels, images, classes, err, errlen);
    if (rc != MGE_OK)
        mge_dataset_fini(ds);
    return rc;
}

int mge_dataset_load_idx(struct mge_dataset *ds, const char *images, const char *labels, char *err,
                         size_t errlen)
{
    return mge_dataset_load_idx_classes(ds, images, labels, 0, err, errlen);
}
