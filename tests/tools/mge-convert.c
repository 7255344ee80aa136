/*
 * mge-convert.c: a test tool for tests/integration/train_formats.sh. It turns IDX image and
 * label files (gzip or plain, as Debian's Fashion-MNIST ships them) into the .npy files NumPy
 * would write, or CIFAR-10 binary records, so those loaders train on real data without Python,
 * NumPy or a download.
 *
 *   mge-convert IMAGES LABELS OUT_X OUT_Y u8|f32|cifar N
 *       the first N samples: u8 writes inputs as uint8 [N, 1, H, W]; f32 as float32 [N, H*W]
 *       holding pixel / 255 (what the loader makes of uint8 data, so both train identically).
 *       Labels go out as int64 [N]. cifar writes OUT_X only (OUT_Y is ignored): N CIFAR-10
 *       records, each the label byte and the 28x28 image centred in 32x32 (zero border),
 *       repeated in all 3 channels. Exit 0, or 1 with a message.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "tests/unit/support/npy_write.h"

/* Read an IDX header and the first @n samples' bytes; NULL with a message on failure. */
static uint8_t *read_idx(const char *path, int ndims, int64_t n, int64_t *dims)
{
    unsigned char h[16];
    uint8_t *buf = NULL;
    int64_t per = 1;
    gzFile gz = gzopen(path, "rb");
    if (!gz) {
        fprintf(stderr, "mge-convert: %s: cannot open\n", path);
        return NULL;
    }
    if (gzread(gz, h, (unsigned)(4 + 4 * ndims)) != 4 + 4 * ndims || h[2] != 8 || h[3] != ndims) {
        fprintf(stderr, "mge-convert: %s: not an IDX file of %d dimensions\n", path, ndims);
        goto out;
    }
    for (int i = 0; i < ndims; i++) {
        dims[i] =
            (int64_t)h[4 + 4 * i] << 24 | h[5 + 4 * i] << 16 | h[6 + 4 * i] << 8 | h[7 + 4 * i];
        if (i)
            per *= dims[i];
    }
    if (n > dims[0]) {
        fprintf(stderr, "mge-convert: %s: has %lld samples, not %lld\n", path, (long long)dims[0],
                (long long)n);
        goto out;
    }
    buf = malloc((size_t)(n * per));
    if (!buf || gzread(gz, buf, (unsigned)(n * per)) != (int)(n * per)) {
        fprintf(stderr, "mge-convert: %s: cannot read %lld samples\n", path, (long long)n);
        free(buf);
        buf = NULL;
    }
out:
    gzclose(gz);
    return buf;
}

/* @n CIFAR-10 records of @h x @w images (at most 32 x 32) centred in 32 x 32, 3 channels. */
static int write_cifar(const char *path, const uint8_t *img, const uint8_t *lab, int64_t n,
                       int64_t h, int64_t w)
{
    uint8_t rec[1 + 3072];
    FILE *f = fopen(path, "wb");
    int64_t top = (32 - h) / 2, left = (32 - w) / 2;
    if (!f || h > 32 || w > 32) {
        perror("mge-convert: cannot write");
        return 1;
    }
    for (int64_t i = 0; i < n; i++) {
        memset(rec, 0, sizeof(rec));
        rec[0] = lab[i];
        for (int ch = 0; ch < 3; ch++)
            for (int64_t y = 0; y < h; y++)
                memcpy(rec + 1 + ch * 1024 + (top + y) * 32 + left, img + (i * h + y) * w,
                       (size_t)w);
        if (fwrite(rec, 1, sizeof(rec), f) != sizeof(rec)) {
            fclose(f);
            return 1;
        }
    }
    return fclose(f) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    int64_t n, di[3], dl[1];
    uint8_t *img, *lab;
    int rc = 1;
    if (argc != 7 ||
        (strcmp(argv[5], "u8") != 0 && strcmp(argv[5], "f32") != 0 &&
         strcmp(argv[5], "cifar") != 0) ||
        (n = atoll(argv[6])) <= 0) {
        fprintf(stderr, "usage: mge-convert IMAGES LABELS OUT_X OUT_Y u8|f32|cifar N\n");
        return 1;
    }
    img = read_idx(argv[1], 3, n, di);
    lab = read_idx(argv[2], 1, n, dl);
    if (img && lab && strcmp(argv[5], "cifar") == 0) {
        rc = write_cifar(argv[3], img, lab, n, di[1], di[2]);
    } else if (img && lab) {
        int64_t d = di[1] * di[2], *y = malloc((size_t)n * sizeof(*y));
        float *x = strcmp(argv[5], "f32") == 0 ? malloc((size_t)(n * d) * sizeof(*x)) : NULL;
        int64_t sx4[4] = {n, 1, di[1], di[2]}, sx2[2] = {n, d};
        for (int64_t i = 0; y && i < n; i++)
            y[i] = lab[i];
        for (int64_t i = 0; x && i < n * d; i++)
            x[i] = (float)img[i] / 255.0f;
        if (y &&
            (x ? mge_test_npy_write(argv[3], "<f4", 2, sx2, x, (size_t)(n * d) * 4)
               : mge_test_npy_write(argv[3], "|u1", 4, sx4, img, (size_t)(n * d))) == 0 &&
            mge_test_npy_write(argv[4], "<i8", 1, &n, y, (size_t)n * 8) == 0)
            rc = 0;
        else
            perror("mge-convert: cannot write");
        free(x);
        free(y);
    }
    free(img);
    free(lab);
    return rc;
}
