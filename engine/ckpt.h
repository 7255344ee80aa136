/*
 * ckpt.h: checkpoint files: named tensors (parameters and optimiser state) plus the training
 * position (step, epoch, sampler position, RNG state), the job spec and the last metrics.
 *
 * File layout: a 24-byte header (magic "MGECKPT1", payload length as uint64 LE, zlib CRC-32 of
 * the payload as uint32 LE, 4 reserved zero bytes) and then one protobuf-c encoded
 * mge.ckpt.Checkpoint (proto/checkpoint.proto). The header turns truncation and bit flips into
 * a clean MGE_CORRUPT before protobuf decoding runs.
 */
#ifndef MGE_ENGINE_CKPT_H
#define MGE_ENGINE_CKPT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MGE_CKPT_VERSION 1 /* format_version this code writes and reads */
#define MGE_CKPT_MAX_DIMS 6
#define MGE_CKPT_RNG_MAX 4
#define MGE_CKPT_HEADER_SIZE 24
#define MGE_CKPT_MAGIC "MGECKPT1"

/* Same numbers as mge.ckpt.DType. */
enum mge_ckpt_dtype {
    MGE_CKPT_F32,
    MGE_CKPT_F16,
    MGE_CKPT_BF16,
    MGE_CKPT_F64,
    MGE_CKPT_I32,
    MGE_CKPT_I64,
    MGE_CKPT_U8,
    MGE_CKPT_I8,
    MGE_CKPT_DTYPE__COUNT
};

/* Same numbers as mge.ckpt.OptimType. */
enum mge_ckpt_optim {
    MGE_CKPT_OPTIM_NONE,
    MGE_CKPT_OPTIM_SGD,
    MGE_CKPT_OPTIM_ADAM,
    MGE_CKPT_OPTIM_ADAMW,
    MGE_CKPT_OPTIM__COUNT
};

struct mge_ckpt_tensor {
    const char *name;                 /* unique, non-empty: "fc1.w", "optim.m.fc1.w" */
    int dtype;                        /* enum mge_ckpt_dtype */
    int ndim;                         /* 0..MGE_CKPT_MAX_DIMS; 0 = scalar */
    int64_t shape[MGE_CKPT_MAX_DIMS]; /* each >= 0 */
    void *data;                       /* row-major, nbytes; may be NULL when nbytes is 0 */
    size_t nbytes;                    /* product(shape) * mge_ckpt_dtype_size(dtype) */
};

struct mge_ckpt {
    int64_t step;        /* optimiser steps done */
    int64_t epoch;       /* sampler epoch to resume in */
    int64_t sampler_pos; /* samples of that epoch consumed (mge_sampler_seek) */
    int64_t optim_step;  /* optimiser's own step count */
    int optim_type;      /* enum mge_ckpt_optim */
    uint64_t rng[MGE_CKPT_RNG_MAX];
    int n_rng;             /* words of rng[] used */
    const char *spec_yaml; /* NUL-terminated; NULL writes none (reads back as "") */
    double last_loss;
    double test_accuracy; /* [0, 1]; NaN when never evaluated */
    struct mge_ckpt_tensor *tensors;
    int n_tensors;
    uint32_t version; /* read: the file's format_version; ignored by write */
    void *priv;       /* read: the decoded message that owns names and data; NULL when yours */
};

/* Bytes per element of @dtype; 0 for an unknown dtype. */
size_t mge_ckpt_dtype_size(int dtype);

/*
 * Write @ck to @path atomically: a temp file "<path>.tmp.<pid>.<n>" in the same directory is
 * written, fsynced, renamed over @path, and the directory is fsynced, so @path holds the old or
 * the new checkpoint, never a mix. Tensor data is borrowed and streamed to the file (no copy of
 * the payload is built in memory). @ck is validated as mge_ckpt_read() would.
 * Returns MGE_OK, MGE_INVAL (@ck breaks a rule above), MGE_NOENT (no such directory), MGE_IO
 * (cannot create, write, sync or rename; no temp file is left), MGE_NOMEM. On error @err
 * (if not NULL) gets a message naming @path. Thread: any; @ck must not change meanwhile.
 */
int mge_ckpt_write(const char *path, const struct mge_ckpt *ck, char *err, size_t errlen);
/* The write buffer mge_ckpt_write() holds while it runs (for memory predictions). */
size_t mge_ckpt_write_buffer_bytes(void);

/*
 * Encode @ck as a whole checkpoint file image (header and payload) in memory.
 * On MGE_OK *@buf is a new buffer of *@len bytes the caller frees with mge_free().
 * Returns MGE_OK, MGE_INVAL, MGE_TOOBIG or MGE_NOMEM (then *@buf is NULL).
 */
int mge_ckpt_encode(const struct mge_ckpt *ck, void **buf, size_t *len, char *err, size_t errlen);

/*
 * Read and validate the checkpoint at @path: header magic, length and CRC; payload decodes;
 * version is MGE_CKPT_VERSION; at most MGE_CKPT_RNG_MAX rng words; known optim type and
 * dtypes; ndim <= 6, dims >= 0, product(shape) * dtype size == nbytes; names non-empty and
 * unique; step, epoch, sampler_pos, optim_step >= 0.
 * Returns MGE_OK, MGE_NOENT (no file), MGE_IO (cannot read), MGE_CORRUPT (anything above
 * broken, including truncation and bit flips), MGE_UNSUPPORTED (another format version),
 * MGE_NOMEM. Never crashes on any input (fuzzed). On error *@out is NULL and @err (if not NULL)
 * says what was wrong, naming @path. On MGE_OK *@out belongs to the caller: mge_ckpt_free().
 */
int mge_ckpt_read(const char *path, struct mge_ckpt **out, char *err, size_t errlen);

/* As mge_ckpt_read() on the file image @buf/@len (header and payload); "<buffer>" in messages. */
int mge_ckpt_decode(const void *buf, size_t len, struct mge_ckpt **out, char *err, size_t errlen);

/*
 * As mge_ckpt_decode() on a bare protobuf payload, with no header and so no CRC check.
 * For fuzzing the decoder and validator past the CRC; not for loading real files.
 */
int mge_ckpt_decode_payload(const void *buf, size_t len, struct mge_ckpt **out, char *err,
                            size_t errlen);

/* The tensor called @name, or NULL. Linear in n_tensors. */
const struct mge_ckpt_tensor *mge_ckpt_find(const struct mge_ckpt *ck, const char *name);

/* Free a checkpoint from read/decode (not one you built); NULL does nothing. */
void mge_ckpt_free(struct mge_ckpt *ck);

/*
 * Background checkpoints (ckpt_writer.c): one writer thread and one snapshot buffer, both made
 * once. mge_ckpt_writer_save() copies the live state into the snapshot and returns; the thread
 * writes it with mge_ckpt_write() (so the file is the one a synchronous write makes, byte for
 * byte) and then points a "latest" symlink at it. One snapshot at a time: a save while the
 * previous write still runs waits for that write first.
 */
struct mge_ckpt_writer;

/*
 * Make a writer for checkpoints whose tensors have @layout's names, dtypes, shapes and sizes
 * (their data is not read here); the snapshot holds the sum of their sizes. Names are copied.
 * On MGE_OK *@out is the writer (free with mge_ckpt_writer_free()); MGE_NOMEM otherwise, with
 * *@out NULL. Thread: any.
 */
int mge_ckpt_writer_new(struct mge_ckpt_writer **out, const struct mge_ckpt_tensor *layout,
                        int n_tensors);

/*
 * Wait for the previous write, copy @ck's tensor data (same count and sizes as the layout,
 * in its order) and scalars into the snapshot and hand it to the thread, which writes @path
 * (atomically, as mge_ckpt_write()) and then, when @latest is not NULL, replaces the symlink
 * @latest with one to @path's base name. @ck->spec_yaml is borrowed until the write is done
 * (keep it alive and unchanged). Returns MGE_OK once handed over, or the previous write's
 * error (nothing handed over), or MGE_INVAL (@ck does not match the layout; @path too long);
 * @err gets the message. Thread: the owner's; not concurrently with another call on @w.
 */
int mge_ckpt_writer_save(struct mge_ckpt_writer *w, const struct mge_ckpt *ck, const char *path,
                         const char *latest, char *err, size_t errlen);

/* Wait until the write in progress (if any) is done; the result of the last write (MGE_OK when
 * none ran), its message in @err. Thread: the owner's. */
int mge_ckpt_writer_wait(struct mge_ckpt_writer *w, char *err, size_t errlen);

/*
 * How mge_ckpt_writer_save() copies the live state into its snapshot: @copy (a device's
 * device -> host copy, when the state lives on one), or memcpy when NULL (the default).
 * Thread: the thread that saves.
 */
void mge_ckpt_writer_set_copy(struct mge_ckpt_writer *w,
                              void (*copy)(void *dst, const void *src, size_t n));

/* CPU time the writer thread has spent on finished writes, in seconds. Thread: any. */
double mge_ckpt_writer_cpu_sec(struct mge_ckpt_writer *w);

/* Bytes the writer holds: the snapshot and mge_ckpt_write()'s buffer (memory predictions);
 * 0 for NULL. */
size_t mge_ckpt_writer_bytes(const struct mge_ckpt_writer *w);

/* Finish the write in progress, stop the thread and free everything; NULL does nothing. */
void mge_ckpt_writer_free(struct mge_ckpt_writer *w);

#ifdef __cplusplus
}
#endif
#endif
