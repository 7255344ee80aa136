/*
 * ckpt_writer.c: background checkpoints: the training loop copies its state into one snapshot
 * buffer allocated up front, and one writer thread encodes and writes the file (engine/ckpt.c)
 * while the loop goes on.
 */
#include "engine/ckpt.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"

struct mge_ckpt_writer {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int busy;                        /* [mu] a snapshot is handed over and not yet written */
    int stop;                        /* [mu] the thread is to exit */
    int rc;                          /* [mu] result of the last finished write */
    char err[2048];                  /* [mu] its message when rc != MGE_OK */
    double cpu_sec;                  /* [mu] CPU time the thread spent writing, all writes */
    struct mge_ckpt ck;              /* the snapshot's description; tensors point into @data */
    struct mge_ckpt_tensor *tensors; /* (n_tensors) */
    char *names;                     /* every tensor name, NUL-separated */
    void *data;                      /* the snapshot: every tensor's bytes, back to back */
    size_t data_bytes;
    void (*copy)(void *dst, const void *src, size_t n); /* live state -> snapshot, or NULL */
    char path[1280];   /* file of the snapshot being written */
    char latest[1280]; /* symlink pointed at it afterwards; "" for none */
};

/* Point the symlink @latest at @path's base name, atomically (a temp link renamed over it). */
static int latest_update(const char *latest, const char *path, char *err, size_t errlen)
{
    char tmp[1300];
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", latest, (int)getpid());
    unlink(tmp);
    if (symlink(base, tmp) != 0 || rename(tmp, latest) != 0) {
        snprintf(err, errlen, "cannot update '%s': %s", latest, strerror(errno));
        unlink(tmp);
        return MGE_IO;
    }
    return MGE_OK;
}

static void *writer_main(void *arg)
{
    struct mge_ckpt_writer *w = arg;
    char err[2048];
    /* Below the step loop's threads, so that the loop gets the cores first (Linux keeps the
     * nice value per thread, and who = 0 is the calling thread). */
    setpriority(PRIO_PROCESS, 0, 10);
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->busy && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (!w->busy)
            break;
        pthread_mutex_unlock(&w->mu);
        /* the snapshot, path and latest are the thread's alone while busy */
        err[0] = '\0';
        struct timespec c0, c1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
        int rc = mge_ckpt_write(w->path, &w->ck, err, sizeof(err));
        if (rc == MGE_OK && w->latest[0])
            rc = latest_update(w->latest, w->path, err, sizeof(err));
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
        if (rc != MGE_OK)
            mge_log_error("background checkpoint: %s", err);
        pthread_mutex_lock(&w->mu);
        w->rc = rc;
        w->cpu_sec += (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9;
        snprintf(w->err, sizeof(w->err), "%s", err);
        w->busy = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int mge_ckpt_writer_new(struct mge_ckpt_writer **out, const struct mge_ckpt_tensor *layout,
                        int n_tensors)
{
    struct mge_ckpt_writer *w = mge_calloc(1, sizeof(*w));
    size_t names_len = 0, off = 0;
    int rc;
    *out = NULL;
    if (!w)
        return MGE_ERR(MGE_NOMEM, "cannot allocate a checkpoint writer");
    for (int i = 0; i < n_tensors; i++) {
        names_len += strlen(layout[i].name) + 1;
        w->data_bytes += (layout[i].nbytes + 63) & ~(size_t)63;
    }
    w->tensors = mge_calloc(n_tensors > 0 ? (size_t)n_tensors : 1, sizeof(*w->tensors));
    w->names = mge_malloc(names_len + 1);
    w->data = mge_malloc_aligned(w->data_bytes > 0 ? w->data_bytes : 64);
    if (!w->tensors || !w->names || !w->data) {
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate a %zu-byte checkpoint snapshot", w->data_bytes);
        goto err_free;
    }
    /* touch every page now, so that the first checkpoint does not fault them in mid-training */
    memset(w->data, 0, w->data_bytes);
    names_len = 0;
    for (int i = 0; i < n_tensors; i++) {
        struct mge_ckpt_tensor *t = &w->tensors[i];
        *t = layout[i];
        t->name = strcpy(w->names + names_len, layout[i].name);
        names_len += strlen(layout[i].name) + 1;
        t->data = (char *)w->data + off;
        off += (layout[i].nbytes + 63) & ~(size_t)63;
    }
    w->ck.tensors = w->tensors;
    w->ck.n_tensors = n_tensors;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if ((rc = pthread_create(&w->thread, NULL, writer_main, w)) != 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        rc = MGE_ERR(MGE_NOMEM, "cannot start the checkpoint writer: %s", strerror(rc));
        goto err_free;
    }
    *out = w;
    return MGE_OK;

err_free:
    mge_free(w->tensors);
    mge_free(w->names);
    mge_free_aligned(w->data);
    mge_free(w);
    return rc;
}

double mge_ckpt_writer_cpu_sec(struct mge_ckpt_writer *w)
{
    pthread_mutex_lock(&w->mu);
    double s = w->cpu_sec;
    pthread_mutex_unlock(&w->mu);
    return s;
}

size_t mge_ckpt_writer_bytes(const struct mge_ckpt_writer *w)
{
    return w ? w->data_bytes + mge_ckpt_write_buffer_bytes() : 0;
}

/* Wait, under @w->mu, until the thread has finished the snapshot it holds. */
static int writer_wait_locked(struct mge_ckpt_writer *w, char *err, size_t errlen)
{
    while (w->busy)
        pthread_cond_wait(&w->cv, &w->mu);
    if (w->rc != MGE_OK && err && errlen)
        snprintf(err, errlen, "%s", w->err);
    return w->rc;
}

int mge_ckpt_writer_wait(struct mge_ckpt_writer *w, char *err, size_t errlen)
{
    pthread_mutex_lock(&w->mu);
    int rc = writer_wait_locked(w, err, errlen);
    pthread_mutex_unlock(&w->mu);
    return rc;
}

int mge_ckpt_writer_save(struct mge_ckpt_writer *w, const struct mge_ckpt *ck, const char *path,
                         const char *latest, char *err, size_t errlen)
{
    pthread_mutex_lock(&w->mu);
    int rc = writer_wait_locked(w, err, errlen);
    pthread_mutex_unlock(&w->mu);
    if (rc != MGE_OK)
        return rc;
    if (ck->n_tensors != w->ck.n_tensors ||
        snprintf(w->path, sizeof(w->path), "%s", path) >= (int)sizeof(w->path) ||
        snprintf(w->latest, sizeof(w->latest), "%s", latest ? latest : "") >=
            (int)sizeof(w->latest)) {
        snprintf(err, errlen, "%s: not the writer's layout, or the path is too long", path);
        return MGE_INVAL;
    }
    for (int i = 0; i < ck->n_tensors; i++) {
        if (ck->tensors[i].nbytes != w->tensors[i].nbytes) {
            snprintf(err, errlen, "%s: tensor '%s' changed size since the writer was made", path,
                     ck->tensors[i].name);
            return MGE_INVAL;
        }
        if (ck->tensors[i].nbytes && w->copy)
            w->copy(w->tensors[i].data, ck->tensors[i].data, ck->tensors[i].nbytes);
        else if (ck->tensors[i].nbytes)
            memcpy(w->tensors[i].data, ck->tensors[i].data, ck->tensors[i].nbytes);
    }
    w->ck.step = ck->step;
    w->ck.epoch = ck->epoch;
    w->ck.sampler_pos = ck->sampler_pos;
    w->ck.optim_step = ck->optim_step;
    w->ck.optim_type = ck->optim_type;
    memcpy(w->ck.rng, ck->rng, sizeof(w->ck.rng));
    w->ck.n_rng = ck->n_rng;
    w->ck.spec_yaml = ck->spec_yaml; /* borrowed: the caller keeps it alive and unchanged */
    w->ck.last_loss = ck->last_loss;
    w->ck.test_accuracy = ck->test_accuracy;
    pthread_mutex_lock(&w->mu);
    w->busy = 1;
    w->rc = MGE_OK;
    w->err[0] = '\0';
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return MGE_OK;
}

void mge_ckpt_writer_set_copy(struct mge_ckpt_writer *w,
                              void (*copy)(void *dst, const void *src, size_t n))
{
    w->copy = copy;
}

void mge_ckpt_writer_free(struct mge_ckpt_writer *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL); /* it finishes the snapshot it holds first */
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    mge_free(w->tensors);
    mge_free(w->names);
    mge_free_aligned(w->data);
    mge_free(w);
}
