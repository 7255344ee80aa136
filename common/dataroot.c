/* dataroot.c: allowed data directories and the open that checks them (see dataroot.h). */
#include "common/dataroot.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"

int mge_data_roots_add(struct mge_data_roots *dr, const char *dir, char *err, size_t errlen)
{
    char real[PATH_MAX];
    struct stat st;
    if (dr->n == MGE_DATA_ROOTS_MAX) {
        snprintf(err, errlen, "data root '%s': more than %d roots", dir, MGE_DATA_ROOTS_MAX);
        return MGE_ERR(MGE_TOOBIG, "%s", err);
    }
    if (!realpath(dir, real) || stat(real, &st) != 0) {
        int e = errno;
        snprintf(err, errlen, "data root '%s': %s", dir, strerror(e));
        return MGE_ERR(e == ENOENT ? MGE_NOENT : MGE_INVAL, "%s", err);
    }
    if (!S_ISDIR(st.st_mode) || strchr(real, ':')) {
        snprintf(err, errlen, "data root '%s': %s", dir,
                 S_ISDIR(st.st_mode) ? "a ':' in its path cannot be passed to the ranks"
                                     : "not a directory");
        return MGE_ERR(MGE_INVAL, "%s", err);
    }
    if (!(dr->dir[dr->n] = mge_strdup(real))) {
        snprintf(err, errlen, "data root '%s': out of memory", dir);
        return MGE_ERR(MGE_NOMEM, "%s", err);
    }
    dr->n++;
    return MGE_OK;
}

int mge_data_roots_parse(struct mge_data_roots *dr, const char *list, char *err, size_t errlen)
{
    while (*list) {
        char dir[PATH_MAX];
        size_t n = strcspn(list, ":");
        int rc;
        if (n >= sizeof(dir)) {
            snprintf(err, errlen, "data root '%.64s...': path too long", list);
            return MGE_ERR(MGE_TOOBIG, "%s", err);
        }
        memcpy(dir, list, n);
        dir[n] = '\0';
        if (n && (rc = mge_data_roots_add(dr, dir, err, errlen)) != MGE_OK)
            return rc;
        list += n + (list[n] == ':');
    }
    return MGE_OK;
}

char *mge_data_roots_join(const struct mge_data_roots *dr)
{
    size_t len = 1;
    char *s, *p;
    for (int i = 0; i < dr->n; i++)
        len += strlen(dr->dir[i]) + 1;
    if (!(s = mge_malloc(len)))
        return NULL;
    p = s;
    for (int i = 0; i < dr->n; i++) {
        size_t n = strlen(dr->dir[i]);
        if (i)
            *p++ = ':';
        memcpy(p, dr->dir[i], n);
        p += n;
    }
    *p = '\0';
    return s;
}

void mge_data_roots_fini(struct mge_data_roots *dr)
{
    for (int i = 0; i < dr->n; i++)
        mge_free(dr->dir[i]);
    memset(dr, 0, sizeof(*dr));
}

bool mge_data_roots_contain(const struct mge_data_roots *dr, const char *real)
{
    for (int i = 0; i < dr->n; i++) {
        const char *root = dr->dir[i];
        size_t n = strlen(root);
        if (n == 1 && root[0] == '/')
            return true;
        if (!strncmp(real, root, n) && (real[n] == '/' || real[n] == '\0'))
            return true;
    }
    return false;
}

/* What a non-regular file is, for messages. */
static const char *file_kind(mode_t m)
{
    return S_ISDIR(m)    ? "directory"
           : S_ISFIFO(m) ? "FIFO"
           : S_ISCHR(m)  ? "character device"
           : S_ISBLK(m)  ? "block device"
           : S_ISSOCK(m) ? "socket"
                         : "special file";
}

/* Whether the file open as @fd (fstat'ed into @st) lies under a root of @dr. */
static int fd_check_roots(const struct mge_data_roots *dr, int fd, const struct stat *st,
                          const char *path, char *err, size_t errlen)
{
    char link[64], real[PATH_MAX];
    struct stat now;
    ssize_t n;
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    n = readlink(link, real, sizeof(real) - 1);
    if (n <= 0 || n >= (ssize_t)sizeof(real) - 1) {
        snprintf(err, errlen, "data path '%s': cannot tell where it lies (%s): refused", path,
                 n < 0 ? strerror(errno) : "path too long");
        return MGE_ERR(MGE_FORBIDDEN, "%s", err);
    }
    real[n] = '\0';
    /* the name the kernel gives is that file's now, unless it was deleted or moved since */
    if (real[0] != '/' || stat(real, &now) != 0 || now.st_dev != st->st_dev ||
        now.st_ino != st->st_ino) {
        snprintf(err, errlen, "data path '%s' was moved or deleted while it was opened", path);
        return MGE_ERR(MGE_STATE, "%s", err);
    }
    if (!mge_data_roots_contain(dr, real)) {
        snprintf(err, errlen, "data path '%s' is outside the worker's data roots (--data-root)",
                 path);
        return MGE_ERR(MGE_FORBIDDEN, "%s", err);
    }
    return MGE_OK;
}

int mge_data_open(const struct mge_data_roots *dr, const char *path, int *fd_out, char *err,
                  size_t errlen)
{
    struct stat st;
    int fd, flags, rc;
    *fd_out = -1;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; reset below for a regular file */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "data path '%s' is not readable: %s", path, strerror(e));
        return MGE_ERR(e == ENOENT ? MGE_NOENT : MGE_IO, "%s", err);
    }
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "data path '%s': cannot stat: %s", path, strerror(errno));
        rc = MGE_ERR(MGE_IO, "%s", err);
        goto err_close;
    }
    /* the roots first: of a file outside them we say nothing, not even its kind */
    if (dr && (rc = fd_check_roots(dr, fd, &st, path, err, errlen)) != MGE_OK)
        goto err_close;
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "data path '%s' is a %s, not a regular file", path,
                 file_kind(st.st_mode));
        rc = MGE_ERR(MGE_IO, "%s", err);
        goto err_close;
    }
    flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        snprintf(err, errlen, "data path '%s': fcntl: %s", path, strerror(errno));
        rc = MGE_ERR(MGE_IO, "%s", err);
        goto err_close;
    }
    *fd_out = fd;
    return MGE_OK;

err_close:
    close(fd);
    return rc;
}
