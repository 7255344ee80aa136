/* data.c: synthetic datasets, batch gathering, the epoch sampler and the prefetching loader. */
#include "engine/data.h"

#include <string.h>
#include <sys/mman.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/jobspec.h"
#include "common/rng.h"

#define LOADER_MAX_PREFETCH 64
#define SYNTH_MAX_BYTES ((int64_t)1 << 40)

/* ---- splitmix64: a counter-based stream, so any (key, counter) is reachable directly ---- */

static uint64_t splitmix64_next(uint64_t *state)
{
    *state += 0x9e3779b97f4a7c15ULL;
    return mge_mix64(*state);
}

/* Key of a stream from two words; distinct (a, b) give unrelated streams. */
static uint64_t stream_key(uint64_t a, uint64_t b)
{
    return mge_mix64(mge_mix64(a ^ 0x6a09e667f3bcc909ULL) + b * 0x9e3779b97f4a7c15ULL +
                 0x3c6ef372fe94f82bULL);
}

/* Uniform in [0, bound), bound > 0, without modulo bias (reject the short top range). */
static uint64_t uniform_below(uint64_t *state, uint64_t bound)
{
    uint64_t threshold = (0 - bound) % bound; /* 2^64 mod bound */
    for (;;) {
        uint64_t r = splitmix64_next(state);
        if (r >= threshold)
            return r % bound;
    }
}

/* ---- datasets ---- */

void mge_dataset_fini(struct mge_dataset *ds)
{
    if (ds->map)
        munmap(ds->map, ds->map_len);
    else
        mge_free(ds->pixels);
    mge_free(ds->labels);
    memset(ds, 0, sizeof(*ds));
}

int mge_dataset_synthetic_split(struct mge_dataset *ds, int64_t n, int c, int h, int w, int classes,
                                uint64_t seed, uint64_t split)
{
    uint8_t *protos;
    int64_t dim;
    memset(ds, 0, sizeof(*ds));
    if (n <= 0 || c <= 0 || h <= 0 || w <= 0 || classes < 1 || classes > MGE_CLASSES_MAX)
        return MGE_ERR(MGE_INVAL, "synthetic dataset: bad shape n=%lld c=%d h=%d w=%d classes=%d",
                       (long long)n, c, h, w, classes);
    dim = (int64_t)c * h * w;
    if (dim > SYNTH_MAX_BYTES || n > SYNTH_MAX_BYTES / dim || classes > SYNTH_MAX_BYTES / dim)
        return MGE_ERR(MGE_TOOBIG, "synthetic dataset: %lld x %lld bytes is too large",
                       (long long)n, (long long)dim);
    protos = mge_malloc((size_t)(classes * dim));
    ds->pixels = mge_malloc((size_t)(n * dim));
    ds->labels = mge_malloc((size_t)n * sizeof(*ds->labels));
    if (!protos || !ds->pixels || !ds->labels) {
        mge_free(protos);
        mge_dataset_fini(ds);
        return MGE_ERR(MGE_NOMEM, "synthetic dataset: cannot allocate %lld samples", (long long)n);
    }
    ds->n = n;
    ds->c = c;
    ds->h = h;
    ds->w = w;
    ds->dim = dim;
    ds->classes = classes;

    /* Prototypes depend on the seed only, so every split shares them. Keep them away from the
     * clip limits so the noise stays mostly symmetric. */
    for (int k = 0; k < classes; k++) {
        uint64_t st = stream_key(seed, (uint64_t)k);
        for (int64_t j = 0; j < dim; j++)
            protos[k * dim + j] = (uint8_t)(32 + uniform_below(&st, 192));
    }
    for (int64_t i = 0; i < n; i++) {
        uint64_t st = stream_key(stream_key(seed, ~split), (uint64_t)i);
        int k = (int)uniform_below(&st, (uint64_t)classes);
        const uint8_t *p = protos + k * dim;
        uint8_t *out = ds->pixels + i * dim;
        ds->labels[i] = k;
        for (int64_t j = 0; j < dim; j++) {
            /* Sum of four uniform bytes - 510 is roughly normal with sd ~147; scale to ~40. */
            uint64_t r = splitmix64_next(&st);
            int s4 = (int)(r & 0xff) + (int)(r >> 8 & 0xff) + (int)(r >> 16 & 0xff) +
                     (int)(r >> 24 & 0xff) - 510;
            int v = p[j] + s4 * 40 / 147;
            out[j] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
    mge_free(protos);
    return MGE_OK;
}

int mge_dataset_synthetic(struct mge_dataset *ds, int64_t n, int c, int h, int w, int classes,
                          uint64_t seed)
{
    return mge_dataset_synthetic_split(ds, n, c, h, w, classes, seed, 0);
}

int mge_dataset_set_normalize(struct mge_dataset *ds, int n, const double *mean, const double *std,
                              char *err, size_t errlen)
{
    if (n != ds->c || n < 1 || n > MGE_DATASET_MAX_CHANNELS)
        return MGE_ERR_FILL(
            MGE_FORMAT, err, errlen,
            "data.normalize has %d entr%s but the data has %d channel%s (c of [c, h, w])", n,
            n == 1 ? "y" : "ies", ds->c, ds->c == 1 ? "" : "s");
    for (int i = 0; i < n; i++) {
        if (!(std[i] > 0))
            return MGE_ERR_FILL(MGE_INVAL, err, errlen, "data.normalize.std[%d] must be > 0", i);
        ds->mean[i] = (float)mean[i];
        ds->std[i] = (float)std[i];
    }
    ds->norm = 1;
    return MGE_OK;
}

/* (x - mean) / std per channel over one gathered sample of (c, hw) values. */
static void normalize_sample(const struct mge_dataset *ds, float *x)
{
    const int64_t hw = ds->dim / ds->c;
    for (int ch = 0; ch < ds->c; ch++) {
        const float m = ds->mean[ch], sd = ds->std[ch];
        float *p = x + ch * hw;
        for (int64_t k = 0; k < hw; k++)
            p[k] = (p[k] - m) / sd;
    }
}

_Static_assert(MGE_AUGMENT_MAX_PADDING == MGE_SPEC_MAX_CROP_PADDING,
               "the engine and the job spec limit data.augment.crop_padding alike");

int mge_dataset_set_augment(struct mge_dataset *ds, int crop_padding, int hflip, uint64_t seed,
                            char *err, size_t errlen)
{
    if (crop_padding < 0 || crop_padding > MGE_AUGMENT_MAX_PADDING)
        return MGE_ERR_FILL(MGE_INVAL, err, errlen,
                            "data.augment.crop_padding must be in [0, %d], not %d",
                            MGE_AUGMENT_MAX_PADDING, crop_padding);
    if ((crop_padding > 0 || hflip) && (ds->h < 2 || ds->w < 2))
        return MGE_ERR_FILL(MGE_FORMAT, err, errlen,
                            "data.augment needs images, but the data is [%d, %d, %d] (c, h, w): "
                            "give data.image for flat features",
                            ds->c, ds->h, ds->w);
    ds->aug.crop_padding = crop_padding;
    ds->aug.hflip = hflip != 0;
    ds->aug.seed = seed;
    return MGE_OK;
}

void mge_augment_draw(const struct mge_augment *a, int64_t epoch, int64_t sample, int *dy, int *dx,
                      int *flip)
{
    /* a stream of its own per (seed, epoch, sample), apart from the sampler's (seed, epoch) */
    uint64_t st =
        stream_key(stream_key(a->seed ^ 0xa0761d6478bd642fULL, (uint64_t)epoch), (uint64_t)sample);
    const uint64_t span = 2 * (uint64_t)a->crop_padding + 1;
    *dy = (int)uniform_below(&st, span) - a->crop_padding;
    *dx = (int)uniform_below(&st, span) - a->crop_padding;
    *flip = a->hflip ? (int)(splitmix64_next(&st) >> 63) : 0;
}

/* Sample @s as floats (bytes / 255, or float32 as stored) into @dst, without augmentation. */
static void gather_plain(const struct mge_dataset *ds, int64_t s, float *dst)
{
    const int64_t dim = ds->dim;
    if (ds->f32) {
        memcpy(dst, ds->pixels + s * dim * (int64_t)sizeof(float), (size_t)dim * sizeof(float));
    } else {
        const uint8_t *src = ds->pixels + s * dim;
        for (int64_t j = 0; j < dim; j++)
            dst[j] = (float)src[j] / 255.0f;
    }
}

/* Sample @s cropped at offset (@dy, @dx) and mirrored when @flip (mge_augment_draw's rule). */
static void gather_shifted(const struct mge_dataset *ds, int64_t s, int dy, int dx, int flip,
                           float *dst)
{
    const int H = ds->h, W = ds->w;
    const int64_t hw = (int64_t)H * W;
    for (int ch = 0; ch < ds->c; ch++) {
        const int64_t base = s * ds->dim + ch * hw;
        for (int y = 0; y < H; y++) {
            float *row = dst + ch * hw + (int64_t)y * W;
            const int sy = y + dy;
            for (int x = 0; x < W; x++) {
                const int sx = (flip ? W - 1 - x : x) + dx;
                float v = 0.0f;
                if (sy >= 0 && sy < H && sx >= 0 && sx < W) {
                    const int64_t k = base + (int64_t)sy * W + sx;
                    if (ds->f32)
                        memcpy(&v, ds->pixels + k * (int64_t)sizeof(float), sizeof(v));
                    else
                        v = (float)ds->pixels[k] / 255.0f;
                }
                row[x] = v;
            }
        }
    }
}

/* Gather as the headers say; @epoch < 0: no augmentation (evaluation). */
static int gather(const struct mge_dataset *ds, const int64_t *idx, int64_t n, int64_t epoch,
                  float *x, int32_t *y)
{
    const int augment = epoch >= 0 && (ds->aug.crop_padding > 0 || ds->aug.hflip);
    for (int64_t i = 0; i < n; i++) {
        int64_t s = idx[i];
        if (s < 0 || s >= ds->n)
            return MGE_ERR(MGE_RANGE, "sample index %lld outside [0, %lld)", (long long)s,
                           (long long)ds->n);
        float *dst = x + i * ds->dim;
        y[i] = ds->labels[s];
        int dy = 0, dx = 0, flip = 0;
        if (augment)
            mge_augment_draw(&ds->aug, epoch, s, &dy, &dx, &flip);
        if (dy || dx || flip)
            gather_shifted(ds, s, dy, dx, flip, dst);
        else
            gather_plain(ds, s, dst);
        if (ds->norm)
            normalize_sample(ds, dst);
    }
    return MGE_OK;
}

int mge_dataset_gather(const struct mge_dataset *ds, const int64_t *idx, int64_t n, float *x,
                       int32_t *y)
{
    return gather(ds, idx, n, -1, x, y);
}

int mge_dataset_gather_augmented(const struct mge_dataset *ds, const int64_t *idx, int64_t n,
                                 int64_t epoch, float *x, int32_t *y)
{
    return gather(ds, idx, n, epoch < 0 ? 0 : epoch, x, y);
}

/* ---- sampler ---- */

int mge_sampler_init(struct mge_sampler *s, int64_t n, int64_t global_batch, int rank, int world,
                     uint64_t seed)
{
    memset(s, 0, sizeof(*s));
    if (n <= 0 || global_batch <= 0 || world <= 0 || rank < 0 || rank >= world)
        return MGE_ERR(MGE_INVAL, "sampler: bad n=%lld global_batch=%lld rank=%d world=%d",
                       (long long)n, (long long)global_batch, rank, world);
    if ((uint64_t)n > SIZE_MAX / sizeof(*s->perm))
        return MGE_ERR(MGE_TOOBIG, "sampler: %lld samples", (long long)n);
    s->perm = mge_malloc((size_t)n * sizeof(*s->perm));
    if (!s->perm)
        return MGE_ERR(MGE_NOMEM, "sampler: cannot allocate a permutation of %lld", (long long)n);
    s->n = n;
    s->global_batch = global_batch;
    s->rank = rank;
    s->world = world;
    s->seed = seed;
    s->perm_epoch = -1;
    return MGE_OK;
}

void mge_sampler_fini(struct mge_sampler *s)
{
    mge_free(s->perm);
    memset(s, 0, sizeof(*s));
}

void mge_sampler_seek(struct mge_sampler *s, int64_t epoch, int64_t pos)
{
    s->epoch = epoch < 0 ? 0 : epoch;
    s->pos = pos < 0 ? 0 : pos > s->n ? s->n : pos;
}

int64_t mge_split_start(int64_t n, int64_t i, int64_t parts)
{
    return i * (n / parts) + (i < n % parts ? i : n % parts);
}

int mge_sampler_set_micro_shards(struct mge_sampler *s, int micro_shards)
{
    if (micro_shards < 0 || micro_shards > s->global_batch ||
        (micro_shards > 0 && micro_shards < s->world))
        return MGE_ERR(MGE_INVAL, "sampler: %d micro-shards for a global batch of %lld on %d ranks",
                       micro_shards, (long long)s->global_batch, s->world);
    s->micro_shards = micro_shards;
    return MGE_OK;
}

void mge_sampler_rank_shards(const struct mge_sampler *s, int *first, int *end)
{
    int parts = s->micro_shards > 0 ? s->micro_shards : s->world;
    *first = (int)mge_split_start(parts, s->rank, s->world);
    *end = (int)mge_split_start(parts, s->rank + 1, s->world);
}

int64_t mge_sampler_local_max(const struct mge_sampler *s)
{
    int64_t S = s->micro_shards, B = s->global_batch, W = s->world;
    if (S == 0)
        return (B + W - 1) / W;
    int64_t m = ((S + W - 1) / W) * ((B + S - 1) / S);
    return m < B ? m : B;
}

/* P_e: Fisher-Yates over the identity from the stream keyed by (seed, epoch). */
static void sampler_shuffle(struct mge_sampler *s)
{
    uint64_t st = stream_key(s->seed, (uint64_t)s->epoch);
    for (int64_t i = 0; i < s->n; i++)
        s->perm[i] = i;
    for (int64_t i = s->n - 1; i > 0; i--) {
        int64_t j = (int64_t)uniform_below(&st, (uint64_t)i + 1);
        int64_t t = s->perm[i];
        s->perm[i] = s->perm[j];
        s->perm[j] = t;
    }
    s->perm_epoch = s->epoch;
}

int mge_sampler_next(struct mge_sampler *s, int64_t *idx, int64_t *n_local, int64_t *global_n)
{
    int64_t b, start, count;
    int k0, k1;
    if (s->pos >= s->n) {
        s->epoch++;
        s->pos = 0;
        return 1;
    }
    if (s->perm_epoch != s->epoch)
        sampler_shuffle(s);
    b = s->n - s->pos < s->global_batch ? s->n - s->pos : s->global_batch;
    mge_sampler_rank_shards(s, &k0, &k1);
    if (s->micro_shards > 0) {
        start = mge_split_start(b, k0, s->micro_shards);
        count = mge_split_start(b, k1, s->micro_shards) - start;
    } else {
        start = mge_split_start(b, s->rank, s->world);
        count = mge_split_start(b, s->rank + 1, s->world) - start;
    }
    memcpy(idx, s->perm + s->pos + start, (size_t)count * sizeof(*idx));
    *n_local = count;
    *global_n = b;
    s->pos += b;
    return 0;
}

/* ---- loader ---- */

/* Produce the next batch into @bt (a buffer nobody else touches now). */
static int loader_fill(struct mge_loader *ld, struct mge_batch *bt)
{
    int64_t n_local, global_n;
    while (mge_sampler_next(ld->s, ld->idx, &n_local, &global_n) == 1)
        continue; /* epoch rolled over: ask again */
    bt->n = n_local;
    bt->global_n = global_n;
    bt->epoch = ld->s->epoch;
    bt->pos_after = ld->s->pos;
    bt->epoch_end = ld->s->pos == ld->s->n;
    return mge_dataset_gather_augmented(ld->ds, ld->idx, n_local, bt->epoch, bt->x, bt->y);
}

static void *loader_main(void *arg)
{
    struct mge_loader *ld = arg;
    pthread_mutex_lock(&ld->mu);
    for (;;) {
        while (!ld->stop && ld->filled + ld->held >= ld->nbuf)
            pthread_cond_wait(&ld->space, &ld->mu);
        if (ld->stop)
            break;
        struct mge_batch *bt = &ld->ring[ld->wr];
        /* The slot is neither filled nor held: ours alone while unlocked. */
        pthread_mutex_unlock(&ld->mu);
        int rc = loader_fill(ld, bt);
        pthread_mutex_lock(&ld->mu);
        if (rc != MGE_OK) {
            ld->err = rc;
            pthread_cond_signal(&ld->ready);
            break;
        }
        ld->wr = (ld->wr + 1) % ld->nbuf;
        ld->filled++;
        pthread_cond_signal(&ld->ready);
    }
    pthread_mutex_unlock(&ld->mu);
    return NULL;
}

/* Free the ring and zero @ld; each pointer may be NULL. */
static void loader_free_buffers(struct mge_loader *ld)
{
    mge_free(ld->idx);
    mge_free(ld->ybuf);
    mge_free_aligned(ld->xbuf);
    mge_free(ld->ring);
    memset(ld, 0, sizeof(*ld));
}

int mge_loader_init(struct mge_loader *ld, const struct mge_dataset *ds, struct mge_sampler *s,
                    int prefetch)
{
    int64_t lm;
    size_t xn;
    memset(ld, 0, sizeof(*ld));
    if (prefetch < 0 || prefetch > LOADER_MAX_PREFETCH || ds->n != s->n || ds->dim <= 0)
        return MGE_ERR(MGE_INVAL, "loader: bad prefetch %d or dataset size %lld != sampler %lld",
                       prefetch, (long long)ds->n, (long long)s->n);
    lm = mge_sampler_local_max(s);
    if (lm > (int64_t)(SIZE_MAX / sizeof(float) / (size_t)ds->dim / (size_t)(prefetch + 1)))
        return MGE_ERR(MGE_TOOBIG, "loader: batch buffers too large");
    ld->ds = ds;
    ld->s = s;
    ld->nbuf = prefetch + 1;
    ld->local_max = lm;
    ld->threaded = prefetch > 0;
    xn = (size_t)lm * (size_t)ds->dim;
    ld->ring = mge_calloc((size_t)ld->nbuf, sizeof(*ld->ring));
    ld->xbuf = mge_malloc_aligned((size_t)ld->nbuf * xn * sizeof(float));
    ld->ybuf = mge_malloc((size_t)ld->nbuf * (size_t)lm * sizeof(int32_t));
    ld->idx = mge_malloc((size_t)lm * sizeof(int64_t));
    if (!ld->ring || !ld->xbuf || !ld->ybuf || !ld->idx)
        goto err_free_buffers;
    for (int i = 0; i < ld->nbuf; i++) {
        ld->ring[i].x = ld->xbuf + (size_t)i * xn;
        ld->ring[i].y = ld->ybuf + (size_t)i * (size_t)lm;
    }
    if (!ld->threaded)
        return MGE_OK;
    pthread_mutex_init(&ld->mu, NULL);
    pthread_cond_init(&ld->ready, NULL);
    pthread_cond_init(&ld->space, NULL);
    if (pthread_create(&ld->thread, NULL, loader_main, ld) != 0) {
        pthread_cond_destroy(&ld->space);
        pthread_cond_destroy(&ld->ready);
        pthread_mutex_destroy(&ld->mu);
        loader_free_buffers(ld);
        return MGE_ERR(MGE_INTERNAL, "loader: cannot start the prefetch thread");
    }
    return MGE_OK;

err_free_buffers:
    loader_free_buffers(ld);
    return MGE_ERR(MGE_NOMEM, "loader: cannot allocate %d batch buffers", prefetch + 1);
}

int mge_loader_next(struct mge_loader *ld, struct mge_batch **out)
{
    int rc = MGE_OK;
    if (!ld->threaded) {
        if (ld->err)
            return ld->err;
        rc = loader_fill(ld, &ld->ring[0]);
        if (rc != MGE_OK)
            return ld->err = rc;
        *out = &ld->ring[0];
        return MGE_OK;
    }
    pthread_mutex_lock(&ld->mu);
    if (ld->held) {
        ld->held = 0;
        pthread_cond_signal(&ld->space);
    }
    while (ld->filled == 0 && !ld->err)
        pthread_cond_wait(&ld->ready, &ld->mu);
    if (ld->filled == 0) {
        rc = ld->err;
    } else {
        *out = &ld->ring[ld->rd];
        ld->rd = (ld->rd + 1) % ld->nbuf;
        ld->filled--;
        ld->held = 1;
    }
    pthread_mutex_unlock(&ld->mu);
    return rc;
}

void mge_loader_fini(struct mge_loader *ld)
{
    if (ld->threaded) {
        pthread_mutex_lock(&ld->mu);
        ld->stop = 1;
        pthread_cond_signal(&ld->space);
        pthread_mutex_unlock(&ld->mu);
        pthread_join(ld->thread, NULL);
        pthread_cond_destroy(&ld->space);
        pthread_cond_destroy(&ld->ready);
        pthread_mutex_destroy(&ld->mu);
    }
    loader_free_buffers(ld);
}
