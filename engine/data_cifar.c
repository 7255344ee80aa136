/* data_cifar.c: reads CIFAR-10 and CIFAR-100 binary files (the "binary version") into an
 * mge_dataset. */
#include "engine/data.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/dataroot.h"
#include "common/err.h"

#define CIFAR_PIXELS 3072 /* 3 x 32 x 32, channel-major (CHW) */
#define CIFAR_MAX_BYTES ((int64_t)1 << 40)

/* Record layout of a CIFAR-@classes file: label bytes, then the pixels. */
static int cifar_label_bytes(int classes)
{
    return classes == 100 ? 2 : 1;
}

/* Open @path, check its size, return its record count in *@n (and the fd, the caller's). */
static int cifar_open(const char *path, int classes, int *fd_out, int64_t *n, char *err,
                      size_t errlen)
{
    const int64_t rec = cifar_label_bytes(classes) + CIFAR_PIXELS;
    struct stat st;
    char why[512];
    int fd, rc = mge_data_open(mge__dataset_roots(), path, &fd, why, sizeof(why));
    if (rc != MGE_OK)
        return MGE_ERR_FILL(rc, err, errlen, "%s", why);
    if (fstat(fd, &st) != 0) {
        close(fd);
        return MGE_ERR_FILL(MGE_IO, err, errlen, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (st.st_size == 0 || st.st_size % rec != 0) {
        close(fd);
        return MGE_ERR_FILL(
            MGE_FORMAT, err, errlen,
            "%s: size %lld is not a positive multiple of the %lld-byte CIFAR-%d record "
            "(%d label byte%s + 3072 pixels)",
            path, (long long)st.st_size, (long long)rec, classes, cifar_label_bytes(classes),
            classes == 100 ? "s" : "");
    }
    *n = st.st_size / rec;
    *fd_out = fd;
    return MGE_OK;
}

/* Read the @n records of @fd into @ds from sample @at on. */
static int cifar_read(struct mge_dataset *ds, int fd, const char *path, int classes, int64_t at,
                      int64_t n, char *err, size_t errlen)
{
    const int lb = cifar_label_bytes(classes);
    uint8_t rec[2 + CIFAR_PIXELS];
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return MGE_ERR_FILL(MGE_NOMEM, err, errlen, "%s: cannot open: %s", path, strerror(errno));
    }
    for (int64_t i = 0; i < n; i++) {
        if (fread(rec, 1, (size_t)lb + CIFAR_PIXELS, f) != (size_t)lb + CIFAR_PIXELS) {
            fclose(f);
            return MGE_ERR_FILL(MGE_IO, err, errlen,
                                "%s: read error at record %lld (the file shrank?)", path,
                                (long long)i);
        }
        /* CIFAR-100: coarse label (0..19), then fine label (0..99); the fine one is used */
        if (lb == 2 && rec[0] >= 20) {
            fclose(f);
            return MGE_ERR_FILL(MGE_CORRUPT, err, errlen,
                                "%s: coarse label %u of record %lld is out of range [0, 20)", path,
                                rec[0], (long long)i);
        }
        if (rec[lb - 1] >= classes) {
            fclose(f);
            return MGE_ERR_FILL(MGE_CORRUPT, err, errlen,
                                "%s: label %u of record %lld is out of range [0, %d)", path,
                                rec[lb - 1], (long long)i, classes);
        }
        ds->labels[at + i] = rec[lb - 1];
        memcpy(ds->pixels + (at + i) * CIFAR_PIXELS, rec + lb, CIFAR_PIXELS);
    }
    fclose(f);
    return MGE_OK;
}

int mge_dataset_load_cifar(struct mge_dataset *ds, const char *const *files, int n_files,
                           int classes, char *err, size_t errlen)
{
    int64_t counts[MGE_CIFAR_MAX_FILES], total = 0;
    int fds[MGE_CIFAR_MAX_FILES];
    int rc = MGE_OK, opened = 0;
    memset(ds, 0, sizeof(*ds));
    if (err && errlen)
        err[0] = '\0';
    if (classes != 10 && classes != 100)
        return MGE_ERR_FILL(MGE_INVAL, err, errlen, "CIFAR classes must be 10 or 100, got %d",
                            classes);
    if (n_files < 1 || n_files > MGE_CIFAR_MAX_FILES)
        return MGE_ERR_FILL(MGE_INVAL, err, errlen, "CIFAR: 1 to %d files, got %d",
                            MGE_CIFAR_MAX_FILES, n_files);
    /* sizes first, so a bad last file fails before anything is read */
    for (; opened < n_files; opened++) {
        rc = cifar_open(files[opened], classes, &fds[opened], &counts[opened], err, errlen);
        if (rc != MGE_OK)
            goto out_close;
        total += counts[opened];
    }
    if (total > CIFAR_MAX_BYTES / CIFAR_PIXELS) {
        rc = MGE_ERR_FILL(MGE_TOOBIG, err, errlen, "%s: too many CIFAR records (%lld)", files[0],
                          (long long)total);
        goto out_close;
    }
    ds->pixels = mge_malloc((size_t)(total * CIFAR_PIXELS));
    ds->labels = mge_malloc((size_t)total * sizeof(*ds->labels));
    if (!ds->pixels || !ds->labels) {
        rc = MGE_ERR_FILL(MGE_NOMEM, err, errlen, "%s: cannot allocate %lld CIFAR records",
                          files[0], (long long)total);
        goto out_close;
    }
    ds->n = total;
    ds->c = 3;
    ds->h = 32;
    ds->w = 32;
    ds->dim = CIFAR_PIXELS;
    ds->classes = classes;
    int64_t at = 0;
    for (int i = 0; i < n_files && rc == MGE_OK; i++) {
        int fd = fds[i];
        fds[i] = -1; /* cifar_read closes it */
        rc = cifar_read(ds, fd, files[i], classes, at, counts[i], err, errlen);
        at += counts[i];
    }
out_close:
    for (int i = 0; i < opened; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    if (rc != MGE_OK)
        mge_dataset_fini(ds);
    return rc;
}
