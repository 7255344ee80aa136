/*
 * data.h: training data for the engine: datasets (IDX files or synthetic), the epoch sampler
 * that shards every global batch across ranks, and the prefetching batch loader.
 *
 * Formats: IDX (data_idx.c), NumPy .npy (data_npy.c), CIFAR binary (data_cifar.c), synthetic
 * (data.c); token streams for language models (data_tokens.c: their own windows, no sampler).
 * Training batches may be augmented (random crop with zero padding, horizontal flip:
 * data.augment); evaluation gathers never are.
 *
 * Determinism contract: the samples a rank sees are a pure function of
 * (seed, epoch, pos, global_batch, rank, world), and so are their augmented values (drawn per
 * (seed, epoch, sample index)). Nothing else (thread timing, prefetch depth,
 * how many times the process was restarted) changes them, so resuming at the (epoch, pos) a
 * checkpoint saved yields exactly the batches of an uninterrupted run, and because ranks split
 * a fixed global batch, changing the world size on resume does not change the global batches.
 */
#ifndef MGE_ENGINE_DATA_H
#define MGE_ENGINE_DATA_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- datasets ---- */

#define MGE_DATASET_MAX_CHANNELS 16 /* per-channel normalisation (data.normalize) */

/* Image augmentation of training samples (data.augment). */
struct mge_augment {
    int crop_padding; /* pixels of zero padding per side before a random h x w crop; 0: off */
    int hflip;        /* 1: mirror left-right with probability 1/2 */
    uint64_t seed;    /* key of the draws (train.seed) */
};

struct mge_dataset {
    int64_t n;       /* samples */
    int c, h, w;     /* image shape; dim = c*h*w */
    int64_t dim;     /* features per sample */
    int classes;     /* labels are in [0, classes) */
    uint8_t *pixels; /* (n, dim), raw bytes; scaled to [0,1] when batches are gathered; with
                        f32, (n, dim) little-endian floats, gathered as they are */
    int32_t *labels; /* (n) in [0, classes) */
    int f32;         /* 1: pixels holds float32 values (npy '<f4') */
    void *map;       /* when not NULL, pixels points into this read-only mapping of a file */
    size_t map_len;
    int norm; /* 1: gathered values become (x - mean[ch]) / std[ch] */
    float mean[MGE_DATASET_MAX_CHANNELS], std[MGE_DATASET_MAX_CHANNELS];
    struct mge_augment aug; /* used by mge_dataset_gather_augmented() only */
};

/*
 * Normalise every value @ds gathers per channel: x = (x - @mean[ch]) / @std[ch], where x is
 * what gathering gives without it (bytes / 255, or float32 as stored) and ch the channel of
 * the value in (c, h, w) order. @n must equal ds->c. Returns MGE_OK or MGE_FORMAT (@n is not
 * the data's channel count; @err says so, naming data.normalize), MGE_INVAL (a std <= 0).
 */
int mge_dataset_set_normalize(struct mge_dataset *ds, int n, const double *mean, const double *std,
                              char *err, size_t errlen);

/* The most data.augment.crop_padding may be (the jobspec's limit too). */
#define MGE_AUGMENT_MAX_PADDING 64

/*
 * Augment the training batches of @ds (mge_dataset_gather_augmented): a random crop of the
 * (c, h, w) image zero-padded by @crop_padding pixels on each side (torchvision's
 * RandomCrop(size, padding)), then a horizontal flip with probability 1/2 when @hflip. Both
 * draws are a pure function of (@seed, epoch, sample index), see mge_augment_draw().
 * Returns MGE_OK, MGE_INVAL (@crop_padding outside [0, MGE_AUGMENT_MAX_PADDING]) or MGE_FORMAT
 * (the data is not images: h or w is 1; @err names data.augment).
 */
int mge_dataset_set_augment(struct mge_dataset *ds, int crop_padding, int hflip, uint64_t seed,
                            char *err, size_t errlen);

/*
 * The augmentation of sample @sample in epoch @epoch under @a: the crop's offset (*@dy, *@dx),
 * each in [-crop_padding, crop_padding] (0 when cropping is off), and *@flip (0 or 1; 0 when
 * hflip is off). Output pixel (y, x) of a channel is input pixel (y + dy, x') with
 * x' = x + dx unflipped, w - 1 - x + dx flipped, or 0 where that lies outside the image.
 * The same arguments give the same draws on every rank, run and resume. Thread: any.
 */
void mge_augment_draw(const struct mge_augment *a, int64_t epoch, int64_t sample, int *dy, int *dx,
                      int *flip);

/*
 * Load an IDX image file and its IDX label file. Each may be gzip-compressed or plain; zlib's
 * gzopen/gzread tell them apart by the gzip magic (1f 8b). Images must be unsigned bytes with
 * 2 dims (n, dim), 3 dims (n, h, w; c = 1) or 4 dims (n, c, h, w); labels unsigned bytes, 1 dim.
 * @classes: 0 infers classes = max label + 1; > 0 requires every label < @classes.
 * Returns MGE_OK, MGE_NOENT (a file does not exist), MGE_IO (cannot open or read, or not a
 * regular file: a directory, a FIFO), MGE_FORBIDDEN (outside the roots of
 * mge_dataset_set_roots()), MGE_STATE (moved while opened), MGE_FORMAT (bad magic, unsupported
 * type or rank, zero-sized dims, image and label counts differ, trailing data), MGE_CORRUPT
 * (truncated file, broken gzip stream, label out of range), MGE_TOOBIG (dims overflow),
 * MGE_NOMEM. On error @err (if not NULL) gets one message naming the file and the problem, e.g.
 *   "train-labels.gz: truncated: header says 60000 labels, file has 1200"
 * and @ds is left zeroed. No message repeats bytes of a file (a file that is not IDX is
 * described by its size and kind). On MGE_OK the caller owns @ds and releases it with
 * mge_dataset_fini().
 */
int mge_dataset_load_idx_classes(struct mge_dataset *ds, const char *images, const char *labels,
                                 int classes, char *err, size_t errlen);

/*
 * Make every later IDX load open its files with mge_data_open(@dr): a file whose real path
 * (that of the opened descriptor) lies outside @dr's roots is refused with MGE_FORBIDDEN; NULL
 * (the default) checks only that each is a regular file. @dr is borrowed and must outlive the
 * loads. mge-train sets it from MGE_DATA_ROOTS. Thread: call before loading, not during.
 */
struct mge_data_roots;
void mge_dataset_set_roots(const struct mge_data_roots *dr);

/* The roots set by mge_dataset_set_roots() (NULL: any path), for every loader of the module. */
const struct mge_data_roots *mge__dataset_roots(void);

/* ---- NumPy .npy ---- */

#define MGE_NPY_MAX_DIMS 4

enum mge_npy_dtype { MGE_NPY_U8, MGE_NPY_F32, MGE_NPY_I32, MGE_NPY_I64 };

struct mge_npy_header {
    enum mge_npy_dtype dtype;
    int ndim;                        /* 0..MGE_NPY_MAX_DIMS */
    int64_t shape[MGE_NPY_MAX_DIMS]; /* each < 2^40 */
    size_t data_offset;              /* bytes before the array data */
};

/*
 * Parse the start of a .npy file, @buf of @len bytes: the magic "\x93NUMPY", version 1.0, 2.0
 * or 3.0, the header length, and the header dict, which must hold exactly 'descr' (one of
 * '|u1', '<u1', '<f4', '<i4', '<i8'; big-endian and other types are refused by name),
 * 'fortran_order' (False only) and 'shape' (a tuple of at most MGE_NPY_MAX_DIMS sizes), with
 * nothing but white space after it. Returns MGE_OK, MGE_FORMAT (the reason in @why),
 * MGE_CORRUPT (@len ends inside the header) or MGE_TOOBIG (a dimension >= 2^40). Reads only
 * [@buf, @buf + @len); never echoes file bytes except the 'descr' string. Thread: any.
 */
int mge_npy_parse_header(const uint8_t *buf, size_t len, struct mge_npy_header *h, char *why,
                         size_t whylen);

/* What the spec says a file must hold; 0 in a field: not checked. */
struct mge_data_expect {
    int c, h, w; /* data.image: a [N, C, H, W] or [N, H, W] file must match it */
    int64_t dim; /* values per sample (data.input_dim, or c*h*w) */
    int classes; /* every label must be < classes; 0: classes = max label + 1 */
};

/*
 * Load a .npy inputs array (uint8 or float32; [N, D], [N, H, W] or [N, C, H, W]) and a .npy
 * labels array (uint8, int32 or int64; [N]), both opened through the data roots
 * (mge_dataset_set_roots). The inputs stay memory-mapped read-only (ds->map); the labels are
 * copied to int32. The file size must be exactly header + N * sample bytes. When @want gives
 * an image shape, the dataset takes it (so [N, D] data can feed a conv model if D = c*h*w).
 * Returns MGE_OK; MGE_NOENT, MGE_IO, MGE_FORBIDDEN, MGE_STATE as mge_data_open(); MGE_FORMAT
 * (bad header, wrong dtype or rank, shape disagreeing with @want, counts differ, trailing
 * data), MGE_CORRUPT (truncated, label out of range), MGE_TOOBIG, MGE_NOMEM. On error @err
 * names the file and the reason, e.g. "x.npy: fortran_order is True: ..." and @ds is zeroed.
 * On MGE_OK the caller releases @ds with mge_dataset_fini().
 */
int mge_dataset_load_npy(struct mge_dataset *ds, const char *inputs, const char *labels,
                         const struct mge_data_expect *want, char *err, size_t errlen);

/* ---- CIFAR binary files ---- */

#define MGE_CIFAR_MAX_FILES 16

/*
 * Load CIFAR binary files (the "binary version" of CIFAR-10/100: fixed records, no header),
 * concatenated in the order given: @classes 10 reads records of 1 label byte + 3072 pixel
 * bytes (32x32x3, channel-major, as the dataset ships), 100 reads CIFAR-100 records of 2 label
 * bytes (coarse, fine) + 3072 and uses the fine label. Each file is opened through the data
 * roots; its record count comes from its size, which must be a positive multiple of the
 * record. The dataset is c, h, w = 3, 32, 32 uint8 (scaled to [0, 1] when gathered).
 * Returns MGE_OK; MGE_NOENT, MGE_IO, MGE_FORBIDDEN, MGE_STATE as mge_data_open(); MGE_INVAL
 * (@classes not 10 or 100, @n_files outside [1, MGE_CIFAR_MAX_FILES]), MGE_FORMAT (size not a
 * multiple: "train.bin: size 30000 is not a positive multiple of the 3073-byte CIFAR-10
 * record ..."), MGE_CORRUPT (a label out of range, CIFAR-100 coarse labels too), MGE_TOOBIG,
 * MGE_NOMEM; on error @err names the file and @ds is zeroed. The caller releases @ds with
 * mge_dataset_fini().
 */
int mge_dataset_load_cifar(struct mge_dataset *ds, const char *const *files, int n_files,
                           int classes, char *err, size_t errlen);

/* ---- token streams (language models) ---- */

#define MGE_TOKENS_MAX_FILES 16

/* A sequence of token ids: little-endian ids of @width bytes each. */
struct mge_tokens {
    const uint8_t *ids; /* (n * width) bytes */
    int64_t n;          /* tokens */
    int width;          /* bytes per id: 1 (text: a byte is a token), 2 (uint16), 4 (uint32) */
    uint8_t *owned;     /* what mge_tokens_fini() frees (NULL in a split's tail) */
};

/*
 * Load and concatenate @files (each opened through the data roots) as ids of @width bytes
 * (1: the bytes of text files; 2, 4: flat uint16 / uint32 arrays as llm.c and nanoGPT write
 * them, little-endian, no header). Every id must be below @vocab.
 * Returns MGE_OK; MGE_NOENT, MGE_IO, MGE_FORBIDDEN, MGE_STATE as mge_data_open(); MGE_INVAL
 * (bad @width or file count), MGE_FORMAT (a size that is 0 or not a multiple of @width),
 * MGE_CORRUPT (an id >= @vocab: "t.bin: token id 300 at byte offset 8 (token 4) is not below
 * model.vocab 256"), MGE_TOOBIG, MGE_NOMEM. On error @err names the file and @tk is zeroed.
 * On MGE_OK the caller releases @tk with mge_tokens_fini().
 */
int mge_tokens_load(struct mge_tokens *tk, const char *const *files, int n_files, int width,
                    int64_t vocab, char *err, size_t errlen);

/* Cut @all after its first @keep tokens: *@tail views the rest (freed with @all, not alone). */
void mge_tokens_split(struct mge_tokens *all, int64_t keep, struct mge_tokens *tail);

/* Free what @tk owns and zero it; a zeroed @tk is fine. */
void mge_tokens_fini(struct mge_tokens *tk);

/*
 * First token of the context window of global row @row of training step @step: uniform in
 * [0, n - T - 1] (a window is T inputs and the T next tokens as targets), a pure function of
 * (@seed, @step, @row), so a rank drawing rows [a, b) of the global batch sees what one process
 * would, and a resumed run sees what an uninterrupted one saw. Needs tk->n > T.
 */
int64_t mge_tokens_window(const struct mge_tokens *tk, int64_t T, uint64_t seed, int64_t step,
                          int64_t row);

/* Rows r < @rows: x[r, i] = id(@starts[r] + i), y[r, i] = id(@starts[r] + i + 1), i < @T. */
void mge_tokens_gather(const struct mge_tokens *tk, const int64_t *starts, int64_t rows, int64_t T,
                       int32_t *x, int32_t *y);

/* mge_dataset_load_idx_classes() with @classes = 0 (classes = max label + 1; 10 for MNIST). */
int mge_dataset_load_idx(struct mge_dataset *ds, const char *images, const char *labels, char *err,
                         size_t errlen);

/*
 * Deterministic, learnable synthetic dataset: each class has a prototype image drawn from
 * @seed; a sample is its class's prototype plus noise (sd about 40 grey levels), clipped to
 * bytes. Sample i of split @split is a pure function of (@seed, @split, i), and all splits of
 * one @seed share the prototypes: use split 0 for training and split 1 for the test set.
 * Returns MGE_OK, MGE_INVAL (n <= 0, a dim <= 0, classes outside [1, MGE_CLASSES_MAX]), MGE_TOOBIG,
 * MGE_NOMEM (then @ds is zeroed). On MGE_OK the caller releases @ds with mge_dataset_fini().
 */
int mge_dataset_synthetic_split(struct mge_dataset *ds, int64_t n, int c, int h, int w, int classes,
                                uint64_t seed, uint64_t split);

/* mge_dataset_synthetic_split() with split 0. */
int mge_dataset_synthetic(struct mge_dataset *ds, int64_t n, int c, int h, int w, int classes,
                          uint64_t seed);

/* Free what @ds holds and zero it; a zeroed @ds is fine. */
void mge_dataset_fini(struct mge_dataset *ds);

/*
 * Gather samples @idx[0..n) into @x (n, dim) as floats (byte / 255, so in [0, 1]; float32
 * data as it is; then normalised per channel when mge_dataset_set_normalize() was called) and
 * @y (n) labels. Returns MGE_OK, or MGE_RANGE if an index is outside [0, ds->n) (then @x and @y
 * are partly written). Thread: any; reads @ds only.
 */
int mge_dataset_gather(const struct mge_dataset *ds, const int64_t *idx, int64_t n, float *x,
                       int32_t *y);

/*
 * mge_dataset_gather() for a training batch of epoch @epoch: each sample is augmented as
 * ds->aug says (mge_dataset_set_augment; nothing when unset), in raw values (the padding is a
 * 0 byte, or 0.0 for float32 data), before the per-channel normalisation. Evaluation uses
 * mge_dataset_gather(), which never augments. Returns as mge_dataset_gather(). Thread: any.
 */
int mge_dataset_gather_augmented(const struct mge_dataset *ds, const int64_t *idx, int64_t n,
                                 int64_t epoch, float *x, int32_t *y);

/* ---- sampler ---- */

/*
 * Epoch order and rank sharding.
 *
 * Epoch e visits the permutation P_e of [0, n) made by Fisher-Yates from a splitmix64 stream
 * keyed by (seed, e); every rank computes the same P_e. The epoch is cut into global batches
 * of B = global_batch samples: P_e[pos .. pos+b) with b = min(B, n - pos). The last batch of
 * an epoch is kept even when it is short (b < B), so every sample is seen once per epoch and
 * an epoch has ceil(n / B) batches; samples never spill into the next epoch.
 *
 * Rank r of W takes rows [start(r), start(r+1)) of each global batch of size b, where
 * start(r) = r*(b/W) + min(r, b%W): the first b%W ranks get one row more. A rank may get no
 * rows when b < W (n_local = 0); it must still take part in collectives, and gradients should
 * be summed over ranks and divided by global_n, not averaged per rank.
 *
 * Micro-shards (deterministic mode, mge_sampler_set_micro_shards): each global batch of b rows
 * is cut into S fixed micro-shards, micro-shard k being rows [start_b(k), start_b(k+1)) with
 * start_b(k) = mge_split_start(b, k, S), whatever the world size; rank r takes the whole
 * micro-shards [mge_split_start(S, r, W), mge_split_start(S, r + 1, W)), so its rows are still
 * one contiguous run of the global batch, and a micro-shard's rows never depend on W.
 *
 * Position: (epoch, pos) with pos = samples of epoch consumed, 0 <= pos <= n. That pair is
 * all a checkpoint needs to save for exact resume (with the same seed and global batch).
 */
struct mge_sampler {
    int64_t n;            /* dataset size */
    int64_t global_batch; /* B */
    int rank, world;
    uint64_t seed;
    int64_t epoch;      /* current epoch */
    int64_t pos;        /* samples of the current epoch consumed, [0, n] */
    int64_t *perm;      /* (n) permutation of perm_epoch */
    int64_t perm_epoch; /* epoch perm holds; -1 when none yet */
    int micro_shards;   /* S, or 0: rows split evenly over ranks */
};

/*
 * First of the @n items that part @i of @parts takes when @n is cut into @parts contiguous
 * runs as evenly as possible, the first n % parts runs one longer: i*(n/parts) + min(i, n%parts).
 * @i may be @parts (then it is @n). The one rule for rank shards and micro-shards.
 */
int64_t mge_split_start(int64_t n, int64_t i, int64_t parts);

/*
 * Set up @s at (epoch 0, pos 0). Returns MGE_OK, MGE_INVAL (n <= 0, global_batch <= 0,
 * world <= 0, rank outside [0, world)) or MGE_NOMEM. Release with mge_sampler_fini().
 */
int mge_sampler_init(struct mge_sampler *s, int64_t n, int64_t global_batch, int rank, int world,
                     uint64_t seed);
void mge_sampler_fini(struct mge_sampler *s);

/*
 * Cut every global batch into @micro_shards fixed micro-shards and give each rank whole ones
 * (see above); 0 goes back to the even split. Call before the first mge_sampler_next().
 * Returns MGE_OK, or MGE_INVAL when @micro_shards is negative, above the global batch, or
 * below the world size (a rank would get no micro-shard).
 */
int mge_sampler_set_micro_shards(struct mge_sampler *s, int micro_shards);

/* This rank's micro-shards [*@first, *@end) of S; with micro-shards off, [rank, rank + 1). */
void mge_sampler_rank_shards(const struct mge_sampler *s, int *first, int *end);

/*
 * Move to (@epoch, @pos), @pos = samples of the epoch consumed. Out-of-range values are
 * clamped (epoch >= 0, 0 <= pos <= n); validate checkpoint values before calling if a clamp
 * would be an error for you. Seeking to pos = n means the next call ends the epoch.
 */
void mge_sampler_seek(struct mge_sampler *s, int64_t epoch, int64_t pos);

/* Most rows one rank gets from one global batch: ceil(global_batch / world), or with
 * micro-shards ceil(S / world) micro-shards of at most ceil(global_batch / S) rows. */
int64_t mge_sampler_local_max(const struct mge_sampler *s);

/*
 * Next global batch: writes this rank's sample indices into @idx (capacity
 * >= mge_sampler_local_max()), *@n_local (may be 0) and *@global_n (the global batch's size),
 * and advances pos by *global_n. Returns 0; or 1 when the epoch had ended (pos was n): then
 * nothing is written, the sampler is at (epoch + 1, 0), and the caller calls again.
 * Cannot fail: the permutation buffer is allocated at init. Thread: one caller at a time.
 */
int mge_sampler_next(struct mge_sampler *s, int64_t *idx, int64_t *n_local, int64_t *global_n);

/* ---- loader ---- */

struct mge_batch {
    float *x;          /* (n, dim) in [0, 1] */
    int32_t *y;        /* (n) */
    int64_t n;         /* this rank's rows; may be 0 */
    int64_t global_n;  /* rows in the global batch */
    int64_t epoch;     /* epoch the batch belongs to */
    int64_t pos_after; /* samples of that epoch consumed after this batch */
    int epoch_end;     /* 1 if this is the epoch's last batch (pos_after == n) */
};

/*
 * A prefetch thread takes batches from the sampler and gathers them (augmented, with the
 * batch's epoch: mge_dataset_gather_augmented) into a ring of
 * prefetch + 1 buffers (the one the caller holds plus @prefetch ready ahead), allocated once
 * at init: no allocation per step. With @prefetch = 0 there is no thread and mge_loader_next()
 * gathers in the caller's thread. The sequence of batches is the sampler's, whatever the
 * prefetch depth.
 */
struct mge_loader {
    const struct mge_dataset *ds;
    struct mge_sampler *s;
    int nbuf;               /* prefetch + 1 */
    struct mge_batch *ring; /* (nbuf) */
    float *xbuf;            /* (nbuf, local_max, dim) */
    int32_t *ybuf;          /* (nbuf, local_max) */
    int64_t *idx;           /* (local_max) producer's scratch */
    int64_t local_max;
    int threaded;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t ready; /* a batch was filled, or the producer failed */
    pthread_cond_t space; /* a buffer was released, or stop was asked */
    int rd, wr;           /* next slot to hand out / to fill */
    int filled;           /* filled slots not yet handed out */
    int held;             /* 1 while the caller holds slot rd - 1 */
    int stop;
    int err; /* producer's error, returned by the next mge_loader_next() */
};

/*
 * Start loading batches of @ds in the order of @s (already seeked, for a resume) with
 * @prefetch buffers ready ahead (0..64). Until mge_loader_fini() the loader owns @s: do not
 * use it. The sampler runs ahead of what was handed out, so a checkpoint must save the
 * handed-out batch's (epoch, pos_after), never the sampler's own position.
 * Returns MGE_OK, MGE_INVAL (bad @prefetch, or dataset size != sampler size), MGE_NOMEM, or
 * MGE_INTERNAL (no thread). On error nothing needs freeing and no thread runs.
 */
int mge_loader_init(struct mge_loader *ld, const struct mge_dataset *ds, struct mge_sampler *s,
                    int prefetch);

/*
 * Block until the next batch is ready and point *@out at it. The batch stays valid until the
 * next call or mge_loader_fini(). Batches run on across epochs forever; stop when you like.
 * Returns MGE_OK or the error that stopped the producer. Thread: one consumer thread.
 */
int mge_loader_next(struct mge_loader *ld, struct mge_batch **out);

/* Stop and join the thread and free the buffers; only after mge_loader_init() returned MGE_OK.
 * The sampler is the caller's again afterwards (at the producer's position, not the caller's). */
void mge_loader_fini(struct mge_loader *ld);

#ifdef __cplusplus
}
#endif
#endif
