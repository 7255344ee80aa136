/* ckpt_store.c: the coordinator's checkpoint store: uploads in, fetches out (see ckpt_store.h). */
#include "ckpt_store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_path.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/ckpt.h"
#include "store_int.h"

static int refuse(int code, char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int refuse(int code, char *why, size_t why_len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
    return code;
}

void mge_ckpt_upload_fini(struct mge_ckpt_upload *u)
{
    if (u->active) {
        close(u->fd);
        unlink(u->tmp);
    }
    u->active = false;
}

/* mkdir @path, one level; an existing directory is fine. */
static int mkdir_one(const char *path)
{
    return mkdir(path, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

/* Start an upload of @c's file: checks that need no data, then the .part file. */
static int upload_start(struct mge_ckpt_upload *u, const char *dir, const struct mge_ckpt_chunk *c,
                        char *why, size_t why_len)
{
    char d[4000];
    int n;
    if (strlen(dir) > 3900)
        return refuse(MGE_IO, why, why_len, "checkpoint store path too long");
    if (!c->name || !mge_ckpt_name_ok(c->name, &u->step) || strlen(c->name) >= sizeof(u->name))
        return refuse(MGE_INVAL, why, why_len, "'%.60s' is not a checkpoint file name",
                      c->name ? c->name : "");
    if (c->size < MGE_CKPT_HEADER_SIZE || c->size > MGE_CKPT_UPLOAD_MAX)
        return refuse(MGE_INVAL, why, why_len, "%s: size %llu is outside %d..%llu bytes", c->name,
                      (unsigned long long)c->size, MGE_CKPT_HEADER_SIZE,
                      (unsigned long long)MGE_CKPT_UPLOAD_MAX);
    n = snprintf(d, sizeof(d), "%s", dir);
    if (mkdir_one(d) != 0)
        goto err_dir;
    n += snprintf(d + n, sizeof(d) - (size_t)n, "/job-%lld", (long long)c->job_id);
    if (mkdir_one(d) != 0)
        goto err_dir;
    n += snprintf(d + n, sizeof(d) - (size_t)n, "/attempt-%d", c->attempt);
    if (mkdir_one(d) != 0)
        goto err_dir;
    snprintf(d + n, sizeof(d) - (size_t)n, "/rank-0");
    if (mkdir_one(d) != 0)
        goto err_dir;
    snprintf(u->path, sizeof(u->path), "%s/%s", d, c->name);
    snprintf(u->tmp, sizeof(u->tmp), "%s.part", u->path);
    u->fd = open(u->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (u->fd < 0)
        return refuse(MGE_IO, why, why_len, "cannot create '%.300s': %s", u->tmp, strerror(errno));
    u->active = true;
    u->job_id = c->job_id;
    u->attempt = c->attempt;
    snprintf(u->name, sizeof(u->name), "%s", c->name);
    u->size = c->size;
    u->offset = 0;
    return MGE_OK;
err_dir:
    return refuse(MGE_IO, why, why_len, "cannot create '%.300s': %s", d, strerror(errno));
}

/* The whole file is in: verify it, put it in place, commit it, prune old copies. */
static int upload_finish(struct mge_ckpt_upload *u, struct mge_store *st, const char *worker_id,
                         char *why, size_t why_len)
{
    struct mge_ckpt *ck = NULL;
    char err[512], *old = NULL;
    int rc;
    if (fsync(u->fd) != 0 || close(u->fd) != 0) {
        u->fd = -1;
        return refuse(MGE_IO, why, why_len, "cannot sync '%.300s': %s", u->tmp, strerror(errno));
    }
    u->fd = open("/dev/null", O_RDONLY | O_CLOEXEC); /* so that fini has one to close */
    /* NEEDSWORK: this reads the whole file on the rpc thread, which answers no other worker
     * meanwhile: fine for the tens of MiB here, not for GiB checkpoints (verify in a thread
     * and answer "not yet" until it is done) */
    rc = mge_ckpt_read(u->tmp, &ck, err, sizeof(err));
    if (rc != MGE_OK)
        return refuse(MGE_CORRUPT, why, why_len, "%s of job %lld does not verify: %s", u->name,
                      (long long)u->job_id, err);
    if (ck->step != u->step) {
        refuse(MGE_CORRUPT, why, why_len, "%s of job %lld holds step %lld, not its name's", u->name,
               (long long)u->job_id, (long long)ck->step);
        mge_ckpt_free(ck);
        return MGE_CORRUPT;
    }
    mge_ckpt_free(ck);
    if (rename(u->tmp, u->path) != 0)
        return refuse(MGE_IO, why, why_len, "cannot rename '%.300s': %s", u->tmp, strerror(errno));
    {
        char d[4200];
        snprintf(d, sizeof(d), "%s", u->path);
        *strrchr(d, '/') = '\0';
        mge__store_dir_sync(d);
    }
    /* a copy of the same name from another attempt (one that resumed from before it) goes */
    if (mge_store_checkpoint_copy_path(st, u->job_id, u->name, &old) != MGE_OK)
        old = NULL;
    rc = mge_store_checkpoint_commit(st, u->job_id, u->name, u->step, (int64_t)u->size, u->path,
                                     worker_id, u->path);
    if (rc != MGE_OK) {
        unlink(u->path);
        mge_free(old);
        return refuse(rc, why, why_len, "cannot commit %s of job %lld", u->name,
                      (long long)u->job_id);
    }
    if (old && strcmp(old, u->path) != 0)
        unlink(old);
    mge_free(old);
    old = NULL;
    mge_log_info("job %lld: checkpoint %s (%llu bytes) committed to the coordinator's store",
                 (long long)u->job_id, u->name, (unsigned long long)u->size);
    while (mge_store_checkpoint_copy_prune(st, u->job_id, MGE_CKPT_COPIES_KEPT, &old) == MGE_OK) {
        if (unlink(old) != 0 && errno != ENOENT)
            mge_log_warn("cannot delete old checkpoint copy '%s': %s", old, strerror(errno));
        mge_free(old);
    }
    return MGE_OK;
}

int mge_ckpt_upload_chunk(struct mge_ckpt_upload *u, struct mge_store *st, const char *dir,
                          const char *worker_id, const struct mge_ckpt_chunk *c, uint64_t *next,
                          bool *committed, char *why, size_t why_len)
{
    bool current = false, same;
    int rc;
    *next = 0;
    *committed = false;
    /* who may upload comes from the placements, never from the chunk */
    if ((rc = mge_store_rank_is_current(st, worker_id, c->job_id, c->attempt, 0, &current)) !=
        MGE_OK)
        return refuse(rc, why, why_len, "cannot check job %lld's placements", (long long)c->job_id);
    same = u->active && u->job_id == c->job_id && u->attempt == c->attempt && c->name &&
           !strcmp(u->name, c->name);
    if (!current) {
        if (same)
            mge_ckpt_upload_fini(u);
        return refuse(MGE_AUTH, why, why_len,
                      "this worker does not run rank 0 of job %lld's current attempt (%d named)",
                      (long long)c->job_id, c->attempt);
    }
    if (!same) {
        if (c->offset != 0)
            return MGE_OK; /* a file we know nothing of (a restart, a lost reply): from 0 */
        mge_ckpt_upload_fini(u);
        if ((rc = upload_start(u, dir, c, why, why_len)) != MGE_OK)
            return rc;
    }
    if (c->offset != u->offset) {
        *next = u->offset; /* a repeated or lost chunk: say where to go on */
        return MGE_OK;
    }
    if (c->size != u->size || c->len > MGE_CKPT_CHUNK_MAX || c->len > u->size - u->offset ||
        (c->len == 0 && u->offset != u->size)) {
        rc = refuse(MGE_INVAL, why, why_len,
                    "%s of job %lld: chunk of %zu bytes at %llu does not fit its size %llu",
                    u->name, (long long)u->job_id, c->len, (unsigned long long)c->offset,
                    (unsigned long long)u->size);
        goto err_fini;
    }
    if (c->len && pwrite(u->fd, c->data, c->len, (off_t)u->offset) != (ssize_t)c->len) {
        rc = refuse(MGE_IO, why, why_len, "cannot write '%.300s': %s", u->tmp, strerror(errno));
        goto err_fini;
    }
    u->offset += c->len;
    *next = u->offset;
    if (u->offset < u->size)
        return MGE_OK;
    if ((rc = upload_finish(u, st, worker_id, why, why_len)) != MGE_OK)
        goto err_fini;
    close(u->fd);
    u->active = false;
    *committed = true;
    return MGE_OK;
err_fini:
    mge_ckpt_upload_fini(u);
    return rc;
}

int mge_ckpt_fetch_chunk(struct mge_store *st, const char *worker_id, int64_t job_id, int attempt,
                         const char *name, uint64_t offset, void *buf, size_t *len, uint64_t *size,
                         char *why, size_t why_len)
{
    bool current = false;
    char *path = NULL;
    struct stat sb;
    int64_t step;
    ssize_t n;
    int rc, fd;
    *len = 0;
    *size = 0;
    if ((rc = mge_store_rank_is_current(st, worker_id, job_id, attempt, 0, &current)) != MGE_OK)
        return refuse(rc, why, why_len, "cannot check job %lld's placements", (long long)job_id);
    if (!current)
        return refuse(MGE_AUTH, why, why_len,
                      "this worker does not run rank 0 of job %lld's current attempt (%d named)",
                      (long long)job_id, attempt);
    if (!name || !mge_ckpt_name_ok(name, NULL) ||
        (rc = mge_store_checkpoint_copy_path(st, job_id, name, &path)) != MGE_OK)
        return refuse(MGE_NOENT, why, why_len, "job %lld has no committed checkpoint '%.60s'",
                      (long long)job_id, name ? name : "");
    fd = mge_ckpt_path_open(job_id, path);
    if (fd < 0) {
        rc = refuse(MGE_IO, why, why_len, "cannot open '%.300s': %s", path, strerror(errno));
        goto out_free;
    }
    if (fstat(fd, &sb) != 0 || offset > (uint64_t)sb.st_size) {
        rc = refuse(MGE_INVAL, why, why_len, "offset %llu is past the end of '%.300s'",
                    (unsigned long long)offset, path);
        goto out_close;
    }
    n = pread(fd, buf, MGE_CKPT_CHUNK_MAX, (off_t)offset);
    if (n < 0) {
        rc = refuse(MGE_IO, why, why_len, "cannot read '%.300s': %s", path, strerror(errno));
        goto out_close;
    }
    *len = (size_t)n;
    *size = (uint64_t)sb.st_size;
    rc = MGE_OK;
    /* the whole copy went out: rank 0 resumes from it, whatever newer checkpoint was reported
     * (one on the lost node, never committed), so the incarnation starts at its step */
    if (offset + (uint64_t)n == *size && mge_ckpt_name_ok(name, &step))
        mge_store_incarnation_start_step(st, job_id, attempt, step);
out_close:
    close(fd);
out_free:
    mge_free(path);
    return rc;
}
