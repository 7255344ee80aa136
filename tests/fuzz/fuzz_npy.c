/*
 * fuzz_npy.c: libFuzzer target for the .npy reader (engine/data_npy.c): the header parser on
 * the raw bytes, then the whole loader (open through the data-roots code, size checks, mmap,
 * label conversion) on two files cut from the input.
 *
 * Input: a 2-byte little-endian length L, then L bytes of the inputs file, then the labels
 * file (the rest). Beyond "no crash, no leak": a header that parses must describe what it
 * says (offset inside the input, at most 4 dimensions, sizes below 2^40), and a dataset that
 * loads must hold sane counts and labels, and gather without reading outside its mapping.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64], path_x[96], path_y[96];

static void put(const char *path, const uint8_t *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n))
        abort();
    fclose(f);
}

static void cleanup(void)
{
    unlink(path_x);
    unlink(path_y);
    rmdir(dir);
}

static void check_header(const uint8_t *p, size_t n)
{
    struct mge_npy_header h;
    char why[256];
    int rc = mge_npy_parse_header(p, n, &h, why, sizeof(why));
    if (rc != MGE_OK) {
        if (rc != MGE_FORMAT && rc != MGE_CORRUPT && rc != MGE_TOOBIG)
            abort();
        if (why[0] == '\0')
            abort(); /* every refusal says why */
        return;
    }
    if (h.data_offset > n || h.ndim < 0 || h.ndim > MGE_NPY_MAX_DIMS ||
        (unsigned)h.dtype > MGE_NPY_I64)
        abort();
    for (int i = 0; i < h.ndim; i++)
        if (h.shape[i] < 0 || h.shape[i] >= ((int64_t)1 << 40))
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct mge_dataset ds;
    struct mge_data_expect want = {0};
    char err[512];
    size_t lx;

    if (!dir[0]) {
        mge_log_set_level(MGE_LOG_OFF);
        snprintf(dir, sizeof(dir), "/dev/shm/mge-fuzz-npy-XXXXXX");
        if (!mkdtemp(dir)) {
            snprintf(dir, sizeof(dir), "/tmp/mge-fuzz-npy-XXXXXX");
            if (!mkdtemp(dir))
                abort();
        }
        snprintf(path_x, sizeof(path_x), "%s/x.npy", dir);
        snprintf(path_y, sizeof(path_y), "%s/y.npy", dir);
        atexit(cleanup);
    }
    check_header(data, size);
    if (size < 2)
        return 0;
    lx = (size_t)data[0] | (size_t)data[1] << 8;
    if (lx > size - 2)
        lx = size - 2;
    check_header(data + 2, lx);
    check_header(data + 2 + lx, size - 2 - lx);
    put(path_x, data + 2, lx);
    put(path_y, data + 2 + lx, size - 2 - lx);
    want.classes = size & 1 ? 10 : 0;
    if (mge_dataset_load_npy(&ds, path_x, path_y, &want, err, sizeof(err)) != MGE_OK) {
        if (err[0] == '\0' || ds.map || ds.pixels || ds.labels)
            abort();
        return 0;
    }
    if (ds.n <= 0 || ds.dim <= 0 || (int64_t)ds.c * ds.h * ds.w != ds.dim || ds.classes <= 0)
        abort();
    if (ds.dim * (ds.f32 ? 4 : 1) * ds.n > (int64_t)lx)
        abort();
    for (int64_t i = 0; i < ds.n; i++)
        if (ds.labels[i] < 0 || ds.labels[i] >= ds.classes)
            abort();
    if (ds.dim <= 4096) { /* gather the last sample: must stay inside the mapping */
        float x[4096];
        int32_t y;
        int64_t last = ds.n - 1;
        if (mge_dataset_gather(&ds, &last, 1, x, &y) != MGE_OK)
            abort();
    }
    mge_dataset_fini(&ds);
    return 0;
}
