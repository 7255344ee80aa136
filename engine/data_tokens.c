/*
 * data_tokens.c: token streams for language models: flat files of uint16 or uint32 ids (as
 * llm.c and nanoGPT write them) or the bytes of text files (ids 0..255), and the random
 * context windows of each training step, a pure function of (seed, step, global row).
 */
#include "engine/data.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/dataroot.h"
#include "common/err.h"
#include "common/rng.h"

#define TOKENS_MAX_BYTES ((int64_t)1 << 40)

static uint32_t token_at(const struct mge_tokens *tk, int64_t i)
{
    const uint8_t *p = tk->ids + i * tk->width;
    if (tk->width == 1)
        return p[0];
    if (tk->width == 2)
        return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Append the whole of @path to tk->owned from byte tk->n * width on (the caller sized it). */
static int tokens_read(struct mge_tokens *tk, int fd, const char *path, int64_t bytes, char *err,
                       size_t errlen)
{
    uint8_t *dst = tk->owned + tk->n * tk->width;
    for (int64_t got = 0; got < bytes;) {
        ssize_t r = read(fd, dst + got, (size_t)(bytes - got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return MGE_ERR_FILL(MGE_IO, err, errlen, "%s: read error at byte %lld (%s)", path,
                                (long long)got, r < 0 ? strerror(errno) : "the file shrank?");
        got += r;
    }
    return MGE_OK;
}

int mge_tokens_load(struct mge_tokens *tk, const char *const *files, int n_files, int width,
                    int64_t vocab, char *err, size_t errlen)
{
    int fds[MGE_TOKENS_MAX_FILES];
    int64_t sizes[MGE_TOKENS_MAX_FILES], total = 0;
    int rc = MGE_OK, opened = 0;
    memset(tk, 0, sizeof(*tk));
    if (width != 1 && width != 2 && width != 4)
        return MGE_ERR_FILL(MGE_INVAL, err, errlen, "tokens: width %d is not 1, 2 or 4", width);
    if (n_files < 1 || n_files > MGE_TOKENS_MAX_FILES)
        return MGE_ERR_FILL(MGE_INVAL, err, errlen, "tokens: 1 to %d files, got %d",
                            MGE_TOKENS_MAX_FILES, n_files);
    /* sizes first, so a bad last file fails before anything is read */
    for (; opened < n_files; opened++) {
        struct stat st;
        char why[512];
        rc = mge_data_open(mge__dataset_roots(), files[opened], &fds[opened], why, sizeof(why));
        if (rc != MGE_OK) {
            rc = MGE_ERR_FILL(rc, err, errlen, "%s", why);
            goto out_close;
        }
        if (fstat(fds[opened], &st) != 0) {
            rc = MGE_ERR_FILL(MGE_IO, err, errlen, "%s: cannot stat: %s", files[opened],
                              strerror(errno));
            opened++;
            goto out_close;
        }
        if (st.st_size == 0 || st.st_size % width != 0) {
            rc = MGE_ERR_FILL(MGE_FORMAT, err, errlen,
                              "%s: size %lld is not a positive multiple of %d (bytes per token "
                              "id, data.dtype)",
                              files[opened], (long long)st.st_size, width);
            opened++;
            goto out_close;
        }
        sizes[opened] = st.st_size;
        total += st.st_size;
    }
    if (total > TOKENS_MAX_BYTES) {
        rc = MGE_ERR_FILL(MGE_TOOBIG, err, errlen, "%s: %lld bytes of tokens is too many", files[0],
                          (long long)total);
        goto out_close;
    }
    tk->width = width;
    tk->owned = mge_malloc((size_t)total);
    if (!tk->owned) {
        rc = MGE_ERR_FILL(MGE_NOMEM, err, errlen, "%s: cannot allocate %lld bytes of tokens",
                          files[0], (long long)total);
        goto out_close;
    }
    tk->ids = tk->owned;
    for (int i = 0; i < n_files; i++) {
        int64_t first = tk->n;
        if ((rc = tokens_read(tk, fds[i], files[i], sizes[i], err, errlen)) != MGE_OK)
            goto out_close;
        tk->n += sizes[i] / width;
        for (int64_t k = first; k < tk->n; k++) {
            uint32_t id = token_at(tk, k);
            if ((int64_t)id >= vocab) {
                rc = MGE_ERR_FILL(MGE_CORRUPT, err, errlen,
                                  "%s: token id %u at byte offset %lld (token %lld) is not below "
                                  "model.vocab %lld",
                                  files[i], id, (long long)((k - first) * width),
                                  (long long)(k - first), (long long)vocab);
                goto out_close;
            }
        }
    }
out_close:
    for (int i = 0; i < opened; i++)
        close(fds[i]);
    if (rc != MGE_OK)
        mge_tokens_fini(tk);
    return rc;
}

void mge_tokens_split(struct mge_tokens *all, int64_t keep, struct mge_tokens *tail)
{
    memset(tail, 0, sizeof(*tail));
    tail->width = all->width;
    tail->ids = all->ids + keep * all->width;
    tail->n = all->n - keep;
    all->n = keep;
}

void mge_tokens_fini(struct mge_tokens *tk)
{
    mge_free(tk->owned);
    memset(tk, 0, sizeof(*tk));
}

int64_t mge_tokens_window(const struct mge_tokens *tk, int64_t T, uint64_t seed, int64_t step,
                          int64_t row)
{
    uint64_t h = mge_mix64(seed ^ mge_mix64((uint64_t)step * 0x9E3779B97F4A7C15ull ^
                                            mge_mix64((uint64_t)row + 0x632BE59BD9B4E019ull)));
    return (int64_t)(h % (uint64_t)(tk->n - T));
}

void mge_tokens_gather(const struct mge_tokens *tk, const int64_t *starts, int64_t rows, int64_t T,
                       int32_t *x, int32_t *y)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < T; i++) {
            x[r * T + i] = (int32_t)token_at(tk, starts[r] + i);
            y[r * T + i] = (int32_t)token_at(tk, starts[r] + i + 1);
        }
}
