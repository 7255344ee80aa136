/*
 * ckpt_store.h: the coordinator's checkpoint store: checkpoints uploaded by the worker that runs
 * rank 0 of a job's current attempt (worker.proto CkptChunk), written under the state directory
 * as DIR/job-J/attempt-A/rank-0/NAME, verified, then committed in SQLite; and read back in
 * chunks (CkptFetch) by the worker that runs the next attempt's rank 0 when it does not hold
 * the checkpoint itself. The layout below DIR is the workers' own, so GET
 * /jobs/{id}/checkpoints/{name} serves a copy through mge_ckpt_path_open() like any other path.
 * Thread: the rpc thread (an upload's state is the caller's, one per worker session).
 */
#ifndef MGE_COORDINATOR_CKPT_STORE_H
#define MGE_COORDINATOR_CKPT_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store.h"

#define MGE_CKPT_CHUNK_MAX ((size_t)1 << 20)    /* bytes per chunk, both ways */
#define MGE_CKPT_UPLOAD_MAX ((uint64_t)4 << 30) /* largest checkpoint file accepted */
#define MGE_CKPT_COPIES_KEPT 2                  /* committed copies kept per job */

/* One worker's upload in progress. Zero it to start; mge_ckpt_upload_fini() abandons it. */
struct mge_ckpt_upload {
    bool active;
    int64_t job_id;
    int attempt;
    char name[32];   /* "ckpt-<digits>.mgeckpt" */
    int64_t step;    /* from the name */
    uint64_t size;   /* declared in the first chunk */
    uint64_t offset; /* bytes written so far */
    int fd;          /* the .part file; valid while active */
    char path[4200]; /* the copy's final path */
    char tmp[4300];  /* path + ".part" */
};

/* What a CkptChunk says (borrowed). */
struct mge_ckpt_chunk {
    int64_t job_id;
    int attempt;
    const char *name;
    uint64_t offset, size;
    const void *data;
    size_t len;
};

/*
 * Take chunk @c from worker @worker_id into the store under @dir. A chunk of another file than
 * @u's starts a new upload (the old one is dropped) when its offset is 0. Refused (nothing kept
 * of this file, @u inactive): @worker_id does not hold rank 0 of @c's job and attempt, which is
 * the current one (MGE_AUTH); a bad name, a size above MGE_CKPT_UPLOAD_MAX or below a header, a
 * chunk above MGE_CKPT_CHUNK_MAX or past the size (MGE_INVAL); the whole file fails
 * mge_ckpt_read() or its step is not the name's (MGE_CORRUPT); a file system error (MGE_IO);
 * MGE_DB. @why says which, naming job and file. On MGE_OK *@next is the offset the next chunk
 * must start at (an unexpected offset is not an error: the worker resumes from *@next), and
 * *@committed is true when this chunk completed, verified and committed the file; then older
 * copies beyond MGE_CKPT_COPIES_KEPT of the job are deleted.
 */
int mge_ckpt_upload_chunk(struct mge_ckpt_upload *u, struct mge_store *st, const char *dir,
                          const char *worker_id, const struct mge_ckpt_chunk *c, uint64_t *next,
                          bool *committed, char *why, size_t why_len);

/* Abandon @u's upload: close and delete its partial file. */
void mge_ckpt_upload_fini(struct mge_ckpt_upload *u);

/*
 * Read up to MGE_CKPT_CHUNK_MAX bytes at @offset of the committed copy @name of @job_id into
 * @buf (MGE_CKPT_CHUNK_MAX bytes) for worker @worker_id, which must hold rank 0 of the job's
 * current attempt @attempt. *@len gets the bytes read, *@size the file's size. Returns MGE_OK,
 * MGE_AUTH, MGE_NOENT (no such committed copy), MGE_INVAL (offset past the end), MGE_IO,
 * MGE_DB; @why says which. The read that reaches the end sets the incarnation's start step to
 * the copy's (rank 0 resumes from it).
 */
int mge_ckpt_fetch_chunk(struct mge_store *st, const char *worker_id, int64_t job_id, int attempt,
                         const char *name, uint64_t offset, void *buf, size_t *len, uint64_t *size,
                         char *why, size_t why_len);

#endif
