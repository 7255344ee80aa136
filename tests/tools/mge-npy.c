/*
 * mge-npy.c: a test tool for tests/integration/train_npy.sh. It turns IDX image and label
 * files (gzip or plain, as Debian's Fashion-MNIST ships them) into the .npy files NumPy would
 * write, so the npy loader trains on real data without Python or NumPy installed.
 *
 *   mge-npy IMAGES LABELS OUT_X OUT_Y u8|f32 N
 *       the first N samples: u8 writes inputs as uint8 [N, 1, H, W]; f32 as float32 [N, H*W]
 *       holding pixel / 255 (what the loader makes of uint8 data, so both train identically).
 *       Labels go out as int64 [N]. Exit 0, or 1 with a message.
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
        fprintf(stderr, "mge-npy: %s: cannot open\n", path);
        return NULL;
    }
    if (gzread(gz, h, (unsigned)(4 + 4 * ndims)) != 4 + 4 * ndims || h[2] != 8 || h[3] != ndims) {
        fprintf(stderr, "mge-npy: %s: not an IDX file of %d dimensions\n", path, ndims);
        goto out;
    }
    for (int i = 0; i < ndims; i++) {
        dims[i] =
            (int64_t)h[4 + 4 * i] << 24 | h[5 + 4 * i] << 16 | h[6 + 4 * i] << 8 | h[7 + 4 * i];
        if (i)
            per *= dims[i];
    }
    if (n > dims[0]) {
        fprintf(stderr, "mge-npy: %s: has %lld samples, not %lld\n", path, (long long)dims[0],
                (long long)n);
        goto out;
    }
    buf = malloc((size_t)(n * per));
    if (!buf || gzread(gz, buf, (unsigned)(n * per)) != (int)(n * per)) {
        fprintf(stderr, "mge-npy: %s: cannot read %lld samples\n", path, (long long)n);
        free(buf);
        buf = NULL;
    }
out:
    gzclose(gz);
    return buf;
}

int main(int argc, char **argv)
{
    int64_t n, di[3], dl[1];
    uint8_t *img, *lab;
    int rc = 1;
    if (argc != 7 || (strcmp(argv[5], "u8") != 0 && strcmp(argv[5], "f32") != 0) ||
        (n = atoll(argv[6])) <= 0) {
        fprintf(stderr, "usage: mge-npy IMAGES LABELS OUT_X OUT_Y u8|f32 N\n");
        return 1;
    }
    img = read_idx(argv[1], 3, n, di);
    lab = read_idx(argv[2], 1, n, dl);
    if (img && lab) {
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
            perror("mge-npy: cannot write");
        free(x);
        free(y);
    }
    free(img);
    free(lab);
    return rc;
}
