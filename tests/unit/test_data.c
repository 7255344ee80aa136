/* test_data.c: unit tests of engine/data: IDX loading, synthetic data, sampler, loader. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/alloc.h"
#include "common/dataroot.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/data.h"
#include "tests/unit/support/check_run.h"
#include "tests/unit/support/npy_write.h"

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist/"

static char tmpdir[64];
static char paths[32][128];
static int n_paths;

static void setup(void)
{
    mge_log_set_level(MGE_LOG_OFF);
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/mge-test-data-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    n_paths = 0;
}

static void teardown(void)
{
    for (int i = 0; i < n_paths; i++)
        unlink(paths[i]);
    rmdir(tmpdir);
    mge_alloc_fail_after(-1);
}

/* A path in the temp dir, removed by teardown. */
static const char *tmp_path(const char *name)
{
    ck_assert_int_lt(n_paths, 32);
    snprintf(paths[n_paths], sizeof(paths[0]), "%s/%s", tmpdir, name);
    return paths[n_paths++];
}

/*
 * Write an IDX file: ubyte type, @ndims dims, then @len bytes of @data, cut to @cut bytes in
 * total when @cut >= 0 (before compression, so a gz file ends cleanly but early).
 */
static const char *write_idx(const char *name, int gz, int ndims, const uint32_t *dims,
                             const uint8_t *data, size_t len, long cut)
{
    const char *path = tmp_path(name);
    size_t hl = 4 + 4 * (size_t)ndims, total;
    uint8_t *buf = malloc(hl + len);
    ck_assert_ptr_nonnull(buf);
    buf[0] = 0;
    buf[1] = 0;
    buf[2] = 0x08;
    buf[3] = (uint8_t)ndims;
    for (int i = 0; i < ndims; i++) {
        buf[4 + 4 * i] = (uint8_t)(dims[i] >> 24);
        buf[5 + 4 * i] = (uint8_t)(dims[i] >> 16);
        buf[6 + 4 * i] = (uint8_t)(dims[i] >> 8);
        buf[7 + 4 * i] = (uint8_t)dims[i];
    }
    if (len)
        memcpy(buf + hl, data, len);
    total = cut >= 0 ? (size_t)cut : hl + len;
    if (gz) {
        gzFile f = gzopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        if (total)
            ck_assert_int_eq(gzwrite(f, buf, (unsigned)total), (int)total);
        gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_uint_eq(fwrite(buf, 1, total, f), total);
        fclose(f);
    }
    free(buf);
    return path;
}

static const char *write_raw(const char *name, const void *data, size_t len)
{
    const char *path = tmp_path(name);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    fclose(f);
    return path;
}

/* 5 images of 3x4 with pixel = 10*i + j, labels 4 3 2 1 0. */
enum { S_N = 5, S_H = 3, S_W = 4 };
static uint8_t s_pix[S_N * S_H * S_W];
static uint8_t s_lab[S_N] = {4, 3, 2, 1, 0};

static void small_set(const char **images, const char **labels, int gz_images, int gz_labels)
{
    uint32_t idims[3] = {S_N, S_H, S_W}, ldims[1] = {S_N};
    for (int i = 0; i < S_N * S_H * S_W; i++)
        s_pix[i] = (uint8_t)(i * 3);
    *images =
        write_idx(gz_images ? "img.gz" : "img", gz_images, 3, idims, s_pix, sizeof(s_pix), -1);
    *labels =
        write_idx(gz_labels ? "lab.gz" : "lab", gz_labels, 1, ldims, s_lab, sizeof(s_lab), -1);
}

static void check_small(const struct mge_dataset *ds)
{
    ck_assert_int_eq(ds->n, S_N);
    ck_assert_int_eq(ds->c, 1);
    ck_assert_int_eq(ds->h, S_H);
    ck_assert_int_eq(ds->w, S_W);
    ck_assert_int_eq(ds->dim, S_H * S_W);
    ck_assert_int_eq(ds->classes, 5);
    ck_assert_mem_eq(ds->pixels, s_pix, sizeof(s_pix));
    for (int i = 0; i < S_N; i++)
        ck_assert_int_eq(ds->labels[i], s_lab[i]);
}

/* ---- IDX ---- */

START_TEST(test_idx_load_plain_and_gz)
{
    for (int mode = 0; mode < 4; mode++) {
        struct mge_dataset ds;
        const char *img, *lab;
        char err[256];
        small_set(&img, &lab, mode & 1, mode >> 1 & 1);
        ck_assert_int_eq(mge_dataset_load_idx(&ds, img, lab, err, sizeof(err)), MGE_OK);
        check_small(&ds);
        mge_dataset_fini(&ds);
        ck_assert_ptr_null(ds.pixels);
        teardown();
        setup();
    }
}
END_TEST

START_TEST(test_idx_load_2d_and_4d)
{
    struct mge_dataset ds;
    uint8_t pix[2 * 3 * 2 * 2], lab[2] = {1, 0};
    uint32_t d4[4] = {2, 3, 2, 2}, d2[2] = {2, 12}, dl[1] = {2};
    char err[256];
    for (size_t i = 0; i < sizeof(pix); i++)
        pix[i] = (uint8_t)i;
    const char *l = write_idx("l", 0, 1, dl, lab, 2, -1);
    const char *i4 = write_idx("i4", 1, 4, d4, pix, sizeof(pix), -1);
    ck_assert_int_eq(mge_dataset_load_idx(&ds, i4, l, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(ds.c, 3);
    ck_assert_int_eq(ds.h, 2);
    ck_assert_int_eq(ds.w, 2);
    ck_assert_int_eq(ds.dim, 12);
    ck_assert_int_eq(ds.classes, 2);
    mge_dataset_fini(&ds);
    const char *i2 = write_idx("i2", 0, 2, d2, pix, sizeof(pix), -1);
    ck_assert_int_eq(mge_dataset_load_idx(&ds, i2, l, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(ds.c, 1);
    ck_assert_int_eq(ds.h, 1);
    ck_assert_int_eq(ds.w, 12);
    ck_assert_mem_eq(ds.pixels, pix, sizeof(pix));
    mge_dataset_fini(&ds);
}
END_TEST

START_TEST(test_idx_truncated)
{
    struct mge_dataset ds;
    uint32_t idims[3] = {S_N, S_H, S_W}, ldims[1] = {S_N};
    char err[256];
    for (int gz = 0; gz < 2; gz++) {
        /* Labels: header (8) + 2 of 5 labels. */
        const char *img = write_idx(gz ? "ti.gz" : "ti", gz, 3, idims, s_pix, sizeof(s_pix), -1);
        const char *lab = write_idx(gz ? "tl.gz" : "tl", gz, 1, ldims, s_lab, sizeof(s_lab), 8 + 2);
        ck_assert_int_eq(mge_dataset_load_idx(&ds, img, lab, err, sizeof(err)), MGE_CORRUPT);
        ck_assert_ptr_nonnull(strstr(err, lab));
        ck_assert_ptr_nonnull(strstr(err, "truncated: header says 5 labels, file has 2"));
        ck_assert_ptr_null(ds.pixels);
        ck_assert_ptr_null(ds.labels);

        /* Images: header (16) + 2.5 images. */
        const char *img2 = write_idx(gz ? "ti2.gz" : "ti2", gz, 3, idims, s_pix, sizeof(s_pix),
                                     16 + 2 * S_H * S_W + 6);
        ck_assert_int_eq(mge_dataset_load_idx(&ds, img2, lab, err, sizeof(err)), MGE_CORRUPT);
        ck_assert_ptr_nonnull(strstr(err, img2));
        ck_assert_ptr_nonnull(strstr(err, "truncated: header says 5 images, file has 2"));

        /* Header cut inside the dims. */
        const char *img3 = write_idx(gz ? "ti3.gz" : "ti3", gz, 3, idims, s_pix, sizeof(s_pix), 9);
        ck_assert_int_eq(mge_dataset_load_idx(&ds, img3, lab, err, sizeof(err)), MGE_CORRUPT);
        ck_assert_ptr_nonnull(strstr(err, "truncated"));

        /* Empty file. */
        const char *img4 = write_idx(gz ? "ti4.gz" : "ti4", gz, 3, idims, s_pix, sizeof(s_pix), 0);
        ck_assert_int_eq(mge_dataset_load_idx(&ds, img4, lab, err, sizeof(err)), MGE_CORRUPT);
        ck_assert_ptr_nonnull(strstr(err, "truncated"));
    }
}
END_TEST

START_TEST(test_idx_truncated_gzip_stream)
{
    /* A gzip file cut mid-stream (not a short but well-formed stream). */
    struct mge_dataset ds;
    const char *lab, *img;
    char err[256];
    small_set(&img, &lab, 1, 0);
    FILE *f = fopen(img, "rb");
    uint8_t buf[4096];
    size_t len = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    ck_assert_uint_gt(len, 20);
    const char *cut = write_raw("cut.gz", buf, len - 12); /* drop crc, size and some data */
    int rc = mge_dataset_load_idx(&ds, cut, lab, err, sizeof(err));
    ck_assert(rc == MGE_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, cut));
}
END_TEST

START_TEST(test_idx_bad_magic)
{
    struct mge_dataset ds;
    const char *img, *lab;
    char err[256];
    small_set(&img, &lab, 0, 1);
    /* Labels file given as images: 1 dim is not valid for images. */
    ck_assert_int_eq(mge_dataset_load_idx(&ds, lab, lab, err, sizeof(err)), MGE_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "bad magic"));
    ck_assert_ptr_nonnull(strstr(err, lab));
    /* Images given as labels. */
    ck_assert_int_eq(mge_dataset_load_idx(&ds, img, img, err, sizeof(err)), MGE_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "bad magic"));
    /* Not IDX at all. */
    const char *junk = write_raw("junk", "GARBAGE!GARBAGE!GARBAGE!", 24);
    ck_assert_int_eq(mge_dataset_load_idx(&ds, junk, lab, err, sizeof(err)), MGE_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "junk: bad magic"));
    /* what was expected and what the file is, never its bytes (neither text nor hex) */
    ck_assert_ptr_nonnull(strstr(err, "expected 00 00 08 02, 03 or 04"));
    ck_assert_ptr_nonnull(strstr(err, "it is a plain file of 24 bytes"));
    ck_assert_ptr_null(strstr(err, "GARB"));
    ck_assert_ptr_null(strstr(err, "4741")); /* "GA" in hex */
    ck_assert_ptr_null(strstr(err, "47 41"));
    /* Float data type. */
    const uint8_t fl[] = {0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0};
    const char *f = write_raw("float", fl, sizeof(fl));
    ck_assert_int_eq(mge_dataset_load_idx(&ds, img, f, err, sizeof(err)), MGE_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "unsupported IDX data type for labels"));
    ck_assert_ptr_nonnull(strstr(err, "only unsigned bytes, 0x08; it is a plain file of 12 bytes"));
    ck_assert_ptr_null(strstr(err, "0d"));
    ck_assert_ptr_null(ds.pixels);
}
END_TEST

START_TEST(test_idx_count_mismatch)
{
    struct mge_dataset ds;
    const char *img, *lab;
    uint32_t ldims[1] = {4};
    char err[256];
    small_set(&img, &lab, 1, 1);
    const char *lab4 = write_idx("lab4", 0, 1, ldims, s_lab, 4, -1);
    ck_assert_int_eq(mge_dataset_load_idx(&ds, img, lab4, err, sizeof(err)), MGE_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "has 4 labels but"));
    ck_assert_ptr_nonnull(strstr(err, "has 5 images"));
    ck_assert_ptr_nonnull(strstr(err, lab4));
}
END_TEST

START_TEST(test_idx_trailing_data)
{
    struct mge_dataset ds;
    const char *img, *lab;
    uint8_t extra[S_N + 1] = {0, 1, 2, 3, 4, 5};
    uint32_t ldims[1] = {S_N};
    char err[256];
    small_set(&img, &lab, 0, 0);
    const char *lab6 = write_idx("lab6", 1, 1, ldims, extra, sizeof(extra), -1);
    ck_assert_int_eq(mge_dataset_load_idx(&ds, img, lab6, err, sizeof(err)), MGE_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "trailing data"));
}
END_TEST

START_TEST(test_idx_label_range)
{
    struct mge_dataset ds;
    const char *img, *lab;
    char err[256];
    small_set(&img, &lab, 0, 0);
    ck_assert_int_eq(mge_dataset_load_idx_classes(&ds, img, lab, 3, err, sizeof(err)), MGE_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "label 4 of sample 0 is out of range [0, 3)"));
    ck_assert_int_eq(mge_dataset_load_idx_classes(&ds, img, lab, 10, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(ds.classes, 10);
    mge_dataset_fini(&ds);
}
END_TEST

START_TEST(test_idx_missing_file)
{
    struct mge_dataset ds;
    const char *img, *lab;
    char err[256];
    small_set(&img, &lab, 0, 0);
    const char *nope = tmp_path("nope.gz");
    ck_assert_int_eq(mge_dataset_load_idx(&ds, nope, lab, err, sizeof(err)), MGE_NOENT);
    ck_assert_ptr_nonnull(strstr(err, nope));
    ck_assert_ptr_nonnull(strstr(err, "No such file"));
    ck_assert_int_eq(mge_dataset_load_idx(&ds, img, nope, err, sizeof(err)), MGE_NOENT);
    ck_assert_ptr_nonnull(strstr(err, nope));
    ck_assert_ptr_null(ds.pixels);
    ck_assert_int_eq(mge_dataset_load_idx(&ds, tmpdir, lab, err, sizeof(err)), MGE_IO);
}
END_TEST

START_TEST(test_idx_data_roots)
{
    /* The roots hold for the file opened: a link inside the root to a valid IDX file outside
     * it is refused, and nothing of that file shows in the message. A FIFO cannot hang the
     * open (Check's timeout would end this test). */
    struct mge_dataset ds;
    struct mge_data_roots dr = {0};
    const char *img, *lab, *link = tmp_path("link-out"), *fifo = tmp_path("fifo");
    char err[256], out_dir[64], out_lab[128];
    uint8_t secret[S_N] = {7, 7, 7, 7, 7};
    FILE *f;
    small_set(&img, &lab, 0, 0);
    snprintf(out_dir, sizeof(out_dir), "/tmp/mge-test-data-out-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(out_dir));
    snprintf(out_lab, sizeof(out_lab), "%s/labels", out_dir);
    f = fopen(out_lab, "wb");
    ck_assert_ptr_nonnull(f);
    fwrite("\0\0\x08\x01\0\0\0\x05", 1, 8, f);
    fwrite(secret, 1, sizeof(secret), f);
    fclose(f);
    ck_assert_int_eq(symlink(out_lab, link), 0);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(mge_data_roots_add(&dr, tmpdir, err, sizeof(err)), MGE_OK);
    mge_dataset_set_roots(&dr);

    ck_assert_int_eq(mge_dataset_load_idx(&ds, img, lab, err, sizeof(err)), MGE_OK);
    mge_dataset_fini(&ds);
    ck_assert_int_eq(mge_dataset_load_idx(&ds, img, link, err, sizeof(err)), MGE_FORBIDDEN);
    ck_assert_ptr_nonnull(strstr(err, "is outside the worker's data roots"));
    ck_assert_ptr_nonnull(strstr(err, link));
    ck_assert_ptr_null(strstr(err, out_lab)); /* nor where the link points */
    ck_assert_ptr_null(ds.pixels);
    ck_assert_int_eq(mge_dataset_load_idx(&ds, fifo, lab, err, sizeof(err)), MGE_IO);
    ck_assert_ptr_nonnull(strstr(err, "is a FIFO, not a regular file"));
    ck_assert_int_eq(mge_dataset_load_idx(&ds, tmpdir, lab, err, sizeof(err)), MGE_IO);
    ck_assert_ptr_nonnull(strstr(err, "is a directory"));
    /* outside the roots directly, and without roots the same file loads */
    ck_assert_int_eq(mge_dataset_load_idx(&ds, img, out_lab, err, sizeof(err)), MGE_FORBIDDEN);
    mge_dataset_set_roots(NULL);
    ck_assert_int_eq(mge_dataset_load_idx(&ds, img, link, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(ds.labels[0], 7);
    mge_dataset_fini(&ds);
    mge_data_roots_fini(&dr);
    unlink(out_lab);
    rmdir(out_dir);
}
END_TEST

START_TEST(test_idx_alloc_failures)
{
    const char *img, *lab;
    char err[256];
    small_set(&img, &lab, 1, 1);
    for (long k = 0;; k++) {
        struct mge_dataset ds;
        mge_alloc_fail_after(k);
        int rc = mge_dataset_load_idx(&ds, img, lab, err, sizeof(err));
        mge_alloc_fail_after(-1);
        if (rc == MGE_OK) {
            check_small(&ds);
            mge_dataset_fini(&ds);
            ck_assert_int_ge(k, 3);
            break;
        }
        ck_assert_int_eq(rc, MGE_NOMEM);
        ck_assert_ptr_null(ds.pixels);
        ck_assert_ptr_null(ds.labels);
    }
}
END_TEST

START_TEST(test_idx_fashion_mnist)
{
    struct mge_dataset tr, te;
    char err[256];
    if (access(FMNIST_DIR "train-images-idx3-ubyte.gz", R_OK) != 0)
        return; /* not installed: nothing to check */
    ck_assert_int_eq(mge_dataset_load_idx(&tr, FMNIST_DIR "train-images-idx3-ubyte.gz",
                                          FMNIST_DIR "train-labels-idx1-ubyte.gz", err,
                                          sizeof(err)),
                     MGE_OK);
    ck_assert_int_eq(tr.n, 60000);
    ck_assert_int_eq(tr.c, 1);
    ck_assert_int_eq(tr.h, 28);
    ck_assert_int_eq(tr.w, 28);
    ck_assert_int_eq(tr.dim, 784);
    ck_assert_int_eq(tr.classes, 10);
    ck_assert_int_eq(tr.labels[0], 9);
    int counts[10] = {0};
    for (int64_t i = 0; i < tr.n; i++)
        counts[tr.labels[i]]++;
    for (int k = 0; k < 10; k++)
        ck_assert_int_eq(counts[k], 6000);
    ck_assert_int_eq(mge_dataset_load_idx(&te, FMNIST_DIR "t10k-images-idx3-ubyte.gz",
                                          FMNIST_DIR "t10k-labels-idx1-ubyte.gz", err, sizeof(err)),
                     MGE_OK);
    ck_assert_int_eq(te.n, 10000);
    ck_assert_int_eq(te.dim, 784);
    ck_assert_int_eq(te.classes, 10);
    mge_dataset_fini(&tr);
    mge_dataset_fini(&te);
}
END_TEST

/* ---- synthetic ---- */

START_TEST(test_synthetic_deterministic)
{
    struct mge_dataset a, b, t;
    ck_assert_int_eq(mge_dataset_synthetic(&a, 500, 1, 8, 8, 10, 42), MGE_OK);
    ck_assert_int_eq(mge_dataset_synthetic(&b, 500, 1, 8, 8, 10, 42), MGE_OK);
    ck_assert_int_eq(a.dim, 64);
    ck_assert_int_eq(a.classes, 10);
    ck_assert_mem_eq(a.pixels, b.pixels, 500 * 64);
    ck_assert_mem_eq(a.labels, b.labels, 500 * sizeof(int32_t));
    for (int i = 0; i < 500; i++)
        ck_assert(a.labels[i] >= 0 && a.labels[i] < 10);
    mge_dataset_fini(&b);
    ck_assert_int_eq(mge_dataset_synthetic(&b, 500, 1, 8, 8, 10, 43), MGE_OK);
    ck_assert(memcmp(a.pixels, b.pixels, 500 * 64) != 0);
    /* A test split: other samples, same classes: a nearest-class-mean rule learned on the
     * train split classifies the test split well, so the data is learnable. */
    ck_assert_int_eq(mge_dataset_synthetic_split(&t, 300, 1, 8, 8, 10, 42, 1), MGE_OK);
    ck_assert(memcmp(a.pixels, t.pixels, 300 * 64) != 0);
    double mean[10][64] = {{0}};
    int cnt[10] = {0}, correct = 0;
    for (int i = 0; i < 500; i++) {
        cnt[a.labels[i]]++;
        for (int j = 0; j < 64; j++)
            mean[a.labels[i]][j] += a.pixels[i * 64 + j];
    }
    for (int i = 0; i < 300; i++) {
        int best = -1;
        double bestd = 1e300;
        for (int k = 0; k < 10; k++) {
            double d = 0;
            for (int j = 0; j < 64; j++) {
                double e = t.pixels[i * 64 + j] - mean[k][j] / (cnt[k] ? cnt[k] : 1);
                d += e * e;
            }
            if (d < bestd) {
                bestd = d;
                best = k;
            }
        }
        correct += best == t.labels[i];
    }
    ck_assert_int_gt(correct, 270);
    /* but not trivially noise-free */
    ck_assert(memcmp(a.pixels, a.pixels + 64, 64) != 0);
    mge_dataset_fini(&a);
    mge_dataset_fini(&b);
    mge_dataset_fini(&t);
}
END_TEST

START_TEST(test_synthetic_errors)
{
    struct mge_dataset ds;
    ck_assert_int_eq(mge_dataset_synthetic(&ds, 0, 1, 2, 2, 10, 1), MGE_INVAL);
    ck_assert_int_eq(mge_dataset_synthetic(&ds, 10, 1, 0, 2, 10, 1), MGE_INVAL);
    ck_assert_int_eq(mge_dataset_synthetic(&ds, 10, 1, 2, 2, 0, 1), MGE_INVAL);
    ck_assert_int_eq(mge_dataset_synthetic(&ds, (int64_t)1 << 40, 1000, 1000, 1000, 2, 1),
                     MGE_TOOBIG);
    for (long k = 0; k < 3; k++) {
        mge_alloc_fail_after(k);
        ck_assert_int_eq(mge_dataset_synthetic(&ds, 10, 1, 2, 2, 3, 1), MGE_NOMEM);
        ck_assert_ptr_null(ds.pixels);
    }
    mge_alloc_fail_after(-1);
}
END_TEST

START_TEST(test_gather)
{
    struct mge_dataset ds;
    ck_assert_int_eq(mge_dataset_synthetic(&ds, 20, 1, 2, 3, 4, 7), MGE_OK);
    int64_t idx[3] = {19, 0, 5};
    float x[18];
    int32_t y[3];
    ck_assert_int_eq(mge_dataset_gather(&ds, idx, 3, x, y), MGE_OK);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(y[i], ds.labels[idx[i]]);
        for (int j = 0; j < 6; j++) {
            ck_assert_float_eq(x[i * 6 + j], ds.pixels[idx[i] * 6 + j] / 255.0f);
            ck_assert(x[i * 6 + j] >= 0.0f && x[i * 6 + j] <= 1.0f);
        }
    }
    int64_t bad[2] = {1, 20};
    ck_assert_int_eq(mge_dataset_gather(&ds, bad, 2, x, y), MGE_RANGE);
    bad[1] = -1;
    ck_assert_int_eq(mge_dataset_gather(&ds, bad, 2, x, y), MGE_RANGE);
    mge_dataset_fini(&ds);
}
END_TEST

/* ---- sampler ---- */

START_TEST(test_sampler_permutation)
{
    struct mge_sampler s;
    const int64_t n = 103, B = 10;
    int64_t idx[10], nl, gn, first[103];
    ck_assert_int_eq(mge_sampler_init(&s, n, B, 0, 1, 42), MGE_OK);
    ck_assert_int_eq(mge_sampler_local_max(&s), 10);
    for (int e = 0; e < 3; e++) {
        int seen[103] = {0}, batches = 0, k = 0;
        int64_t order[103];
        for (;;) {
            int rc = mge_sampler_next(&s, idx, &nl, &gn);
            if (rc == 1)
                break;
            ck_assert_int_eq(rc, 0);
            ck_assert_int_eq(nl, gn);
            ck_assert_int_eq(gn, batches == 10 ? 3 : 10);
            for (int64_t i = 0; i < nl; i++) {
                ck_assert(idx[i] >= 0 && idx[i] < n);
                seen[idx[i]]++;
                order[k++] = idx[i];
            }
            batches++;
        }
        ck_assert_int_eq(batches, 11); /* ceil(103 / 10): the short batch is kept */
        ck_assert_int_eq(s.epoch, e + 1);
        ck_assert_int_eq(s.pos, 0);
        for (int i = 0; i < n; i++)
            ck_assert_int_eq(seen[i], 1);
        if (e == 0)
            memcpy(first, order, sizeof(first));
        else
            ck_assert(memcmp(first, order, sizeof(first)) != 0); /* epochs reshuffle */
    }
    mge_sampler_fini(&s);

    /* Same seed, same order; other seed, other order. */
    struct mge_sampler a, b;
    int64_t ia[10], ib[10];
    ck_assert_int_eq(mge_sampler_init(&a, n, B, 0, 1, 42), MGE_OK);
    ck_assert_int_eq(mge_sampler_init(&b, n, B, 0, 1, 43), MGE_OK);
    mge_sampler_next(&a, ia, &nl, &gn);
    mge_sampler_next(&b, ib, &nl, &gn);
    ck_assert(memcmp(ia, first, sizeof(ia)) == 0);
    ck_assert(memcmp(ia, ib, sizeof(ia)) != 0);
    mge_sampler_fini(&a);
    mge_sampler_fini(&b);
}
END_TEST

/*
 * For each world size, the ranks' shards, concatenated in rank order, are the global batch.
 * @S = 0: rows split evenly over ranks (the first gn % W get one more). @S > 0: micro-shards,
 * so rank r's rows are those of its whole micro-shards, micro-shard k is the same rows of the
 * global batch for every world size, and W goes up to S.
 */
static void check_shards(int64_t n, int64_t B, int S)
{
    struct mge_sampler g;
    int64_t gidx[64], nl, gn;
    int wmax = S == 0 ? 4 : S < 5 ? S : 5;
    ck_assert_int_le(B, 64);
    ck_assert_int_eq(mge_sampler_init(&g, n, B, 0, 1, 9), MGE_OK);
    for (int W = 1; W <= wmax; W++) {
        struct mge_sampler r[5];
        for (int k = 0; k < W; k++) {
            ck_assert_int_eq(mge_sampler_init(&r[k], n, B, k, W, 9), MGE_OK);
            ck_assert_int_eq(mge_sampler_set_micro_shards(&r[k], S), MGE_OK);
        }
        mge_sampler_seek(&g, 0, 0);
        for (int step = 0; step < 40; step++) {
            int rc = mge_sampler_next(&g, gidx, &nl, &gn);
            int64_t off = 0;
            for (int k = 0; k < W; k++) {
                int64_t lidx[64], lnl, lgn, first, end;
                int m0, m1;
                ck_assert_int_eq(mge_sampler_next(&r[k], lidx, &lnl, &lgn), rc);
                if (rc == 1)
                    continue;
                ck_assert_int_eq(lgn, gn);
                ck_assert_int_le(lnl, mge_sampler_local_max(&r[k]));
                mge_sampler_rank_shards(&r[k], &m0, &m1);
                if (S == 0) { /* uneven: the first gn % W ranks get one more */
                    ck_assert(m0 == k && m1 == k + 1);
                    first = k * (gn / W) + (k < gn % W ? k : gn % W);
                    end = first + gn / W + (k < gn % W ? 1 : 0);
                } else {
                    ck_assert_int_eq(m0, mge_split_start(S, k, W));
                    first = mge_split_start(gn, m0, S);
                    end = mge_split_start(gn, m1, S);
                }
                ck_assert_int_eq(off, first);
                ck_assert_int_eq(lnl, end - first);
                ck_assert_mem_eq(lidx, gidx + off, (size_t)lnl * sizeof(int64_t));
                off += lnl;
            }
            if (rc == 0)
                ck_assert_int_eq(off, gn); /* disjoint (distinct rows) and covering */
        }
        for (int k = 0; k < W; k++)
            mge_sampler_fini(&r[k]);
    }
    mge_sampler_fini(&g);
}

START_TEST(test_sampler_micro_shards)
{
    struct mge_sampler s;
    check_shards(103, 10, 4); /* the last batch (3 rows) leaves a micro-shard empty */
    check_shards(50, 7, 7);
    check_shards(200, 64, 12);
    check_shards(7, 64, 12); /* batch larger than the dataset */
    ck_assert_int_eq(mge_sampler_init(&s, 100, 10, 2, 3, 1), MGE_OK);
    ck_assert_int_eq(mge_sampler_set_micro_shards(&s, 2), MGE_INVAL);  /* fewer than ranks */
    ck_assert_int_eq(mge_sampler_set_micro_shards(&s, 11), MGE_INVAL); /* more than the batch */
    ck_assert_int_eq(mge_sampler_set_micro_shards(&s, -1), MGE_INVAL);
    ck_assert_int_eq(mge_sampler_set_micro_shards(&s, 4), MGE_OK);
    ck_assert_int_eq(mge_sampler_local_max(&s), 6); /* 2 micro-shards of at most 3 rows */
    mge_sampler_fini(&s);
}
END_TEST

START_TEST(test_sampler_shards)
{
    check_shards(103, 10, 0); /* 10 over 3 and 4 is uneven; last batch 3 < W=4 */
    check_shards(50, 7, 0);
    check_shards(5, 5, 0);
    check_shards(7, 64, 0); /* batch larger than the dataset: one short batch per epoch */
}
END_TEST

START_TEST(test_sampler_seek)
{
    /* Record a run of 3 epochs, then restart at each recorded position and compare. */
    enum { N = 37, B = 8, W = 3, R = 1, STEPS = 20 };
    struct mge_sampler s;
    int64_t ep[STEPS], pos[STEPS], idx[STEPS][3], nls[STEPS], nl, gn;
    ck_assert_int_eq(mge_sampler_init(&s, N, B, R, W, 5), MGE_OK);
    for (int k = 0; k < STEPS; k++) {
        ep[k] = s.epoch;
        pos[k] = s.pos;
        while (mge_sampler_next(&s, idx[k], &nls[k], &gn) == 1)
            continue;
    }
    mge_sampler_fini(&s);
    for (int k0 = 0; k0 < STEPS; k0++) {
        ck_assert_int_eq(mge_sampler_init(&s, N, B, R, W, 5), MGE_OK);
        mge_sampler_seek(&s, ep[k0], pos[k0]);
        for (int k = k0; k < STEPS; k++) {
            int64_t got[3];
            while (mge_sampler_next(&s, got, &nl, &gn) == 1)
                continue;
            ck_assert_int_eq(nl, nls[k]);
            ck_assert_mem_eq(got, idx[k], (size_t)nl * sizeof(int64_t));
        }
        mge_sampler_fini(&s);
    }
    /* Seeking to the end of an epoch rolls over on the next call; clamps. */
    ck_assert_int_eq(mge_sampler_init(&s, N, B, 0, 1, 5), MGE_OK);
    mge_sampler_seek(&s, 2, N);
    ck_assert_int_eq(mge_sampler_next(&s, idx[0], &nl, &gn), 1);
    ck_assert_int_eq(s.epoch, 3);
    ck_assert_int_eq(s.pos, 0);
    mge_sampler_seek(&s, -4, N + 100);
    ck_assert_int_eq(s.epoch, 0);
    ck_assert_int_eq(s.pos, N);
    mge_sampler_fini(&s);
}
END_TEST

START_TEST(test_sampler_errors)
{
    struct mge_sampler s;
    ck_assert_int_eq(mge_sampler_init(&s, 0, 1, 0, 1, 1), MGE_INVAL);
    ck_assert_int_eq(mge_sampler_init(&s, 10, 0, 0, 1, 1), MGE_INVAL);
    ck_assert_int_eq(mge_sampler_init(&s, 10, 2, 1, 1, 1), MGE_INVAL);
    ck_assert_int_eq(mge_sampler_init(&s, 10, 2, -1, 2, 1), MGE_INVAL);
    ck_assert_int_eq(mge_sampler_init(&s, 10, 2, 0, 0, 1), MGE_INVAL);
    mge_alloc_fail_after(0);
    ck_assert_int_eq(mge_sampler_init(&s, 10, 2, 0, 1, 1), MGE_NOMEM);
    mge_alloc_fail_after(-1);
    ck_assert_ptr_null(s.perm);
}
END_TEST

/* ---- loader ---- */

/* The loader's batches equal the sampler's indices gathered directly. */
static void check_loader(int prefetch, int rank, int world)
{
    struct mge_dataset ds;
    struct mge_sampler s, ref;
    struct mge_loader ld;
    const int64_t n = 53, B = 8;
    int64_t idx[8], nl, gn;
    float x[8 * 12];
    int32_t y[8];
    ck_assert_int_eq(mge_dataset_synthetic(&ds, n, 1, 3, 4, 5, 11), MGE_OK);
    ck_assert_int_eq(mge_sampler_init(&s, n, B, rank, world, 3), MGE_OK);
    ck_assert_int_eq(mge_sampler_init(&ref, n, B, rank, world, 3), MGE_OK);
    ck_assert_int_eq(mge_loader_init(&ld, &ds, &s, prefetch), MGE_OK);
    for (int step = 0; step < 25; step++) { /* 7 batches per epoch: 3.5 epochs */
        struct mge_batch *bt;
        int64_t e;
        ck_assert_int_eq(mge_loader_next(&ld, &bt), MGE_OK);
        while (mge_sampler_next(&ref, idx, &nl, &gn) == 1)
            continue;
        e = ref.epoch;
        ck_assert_int_eq(mge_dataset_gather(&ds, idx, nl, x, y), MGE_OK);
        ck_assert_int_eq(bt->n, nl);
        ck_assert_int_eq(bt->global_n, gn);
        ck_assert_int_eq(bt->epoch, e);
        ck_assert_int_eq(bt->epoch, step / 7);
        ck_assert_int_eq(bt->pos_after, ref.pos);
        ck_assert_int_eq(bt->epoch_end, step % 7 == 6);
        ck_assert_mem_eq(bt->x, x, (size_t)nl * 12 * sizeof(float));
        ck_assert_mem_eq(bt->y, y, (size_t)nl * sizeof(int32_t));
    }
    mge_loader_fini(&ld);
    mge_sampler_fini(&s);
    mge_sampler_fini(&ref);
    mge_dataset_fini(&ds);
}

START_TEST(test_loader_matches_gather)
{
    for (int prefetch = 0; prefetch <= 3; prefetch++) {
        check_loader(prefetch, 0, 1);
        check_loader(prefetch, 2, 3);
    }
}
END_TEST

/* Stop after k batches, save the batch's (epoch, pos_after), resume: same batches. */
static void check_loader_resume(int crop_padding, int hflip)
{
    struct mge_dataset ds;
    const int64_t n = 41, B = 6;
    float saved[40][6 * 4];
    int64_t saved_n[40];
    char err[256];
    ck_assert_int_eq(mge_dataset_synthetic(&ds, n, 1, 2, 2, 3, 1), MGE_OK);
    ck_assert_int_eq(mge_dataset_set_augment(&ds, crop_padding, hflip, 5, err, sizeof(err)),
                     MGE_OK);
    {
        struct mge_sampler s;
        struct mge_loader ld;
        struct mge_batch *bt;
        ck_assert_int_eq(mge_sampler_init(&s, n, B, 1, 2, 8), MGE_OK);
        ck_assert_int_eq(mge_loader_init(&ld, &ds, &s, 2), MGE_OK);
        for (int k = 0; k < 40; k++) {
            ck_assert_int_eq(mge_loader_next(&ld, &bt), MGE_OK);
            saved_n[k] = bt->n;
            memcpy(saved[k], bt->x, (size_t)bt->n * 4 * sizeof(float));
        }
        mge_loader_fini(&ld);
        mge_sampler_fini(&s);
    }
    for (int stop = 1; stop < 30; stop += 4) {
        struct mge_sampler s;
        struct mge_loader ld;
        struct mge_batch *bt;
        int64_t ep = 0, pos = 0;
        ck_assert_int_eq(mge_sampler_init(&s, n, B, 1, 2, 8), MGE_OK);
        ck_assert_int_eq(mge_loader_init(&ld, &ds, &s, 3), MGE_OK);
        for (int k = 0; k < stop; k++) {
            ck_assert_int_eq(mge_loader_next(&ld, &bt), MGE_OK);
            ep = bt->epoch;
            pos = bt->pos_after;
        }
        mge_loader_fini(&ld);
        /* The sampler ran ahead; the checkpoint's position is what counts. */
        mge_sampler_seek(&s, ep, pos);
        ck_assert_int_eq(mge_loader_init(&ld, &ds, &s, 1), MGE_OK);
        for (int k = stop; k < 40; k++) {
            ck_assert_int_eq(mge_loader_next(&ld, &bt), MGE_OK);
            ck_assert_int_eq(bt->n, saved_n[k]);
            ck_assert_mem_eq(bt->x, saved[k], (size_t)bt->n * 4 * sizeof(float));
        }
        mge_loader_fini(&ld);
        mge_sampler_fini(&s);
    }
    mge_dataset_fini(&ds);
}

START_TEST(test_loader_resume)
{
    check_loader_resume(0, 0);
    check_loader_resume(1, 1); /* augmented batches resume alike too */
}
END_TEST

START_TEST(test_loader_errors)
{
    struct mge_dataset ds;
    struct mge_sampler s, s2;
    struct mge_loader ld;
    ck_assert_int_eq(mge_dataset_synthetic(&ds, 30, 1, 2, 2, 3, 1), MGE_OK);
    ck_assert_int_eq(mge_sampler_init(&s, 30, 4, 0, 1, 8), MGE_OK);
    ck_assert_int_eq(mge_sampler_init(&s2, 31, 4, 0, 1, 8), MGE_OK);
    ck_assert_int_eq(mge_loader_init(&ld, &ds, &s2, 2), MGE_INVAL);
    ck_assert_int_eq(mge_loader_init(&ld, &ds, &s, -1), MGE_INVAL);
    ck_assert_int_eq(mge_loader_init(&ld, &ds, &s, 1000), MGE_INVAL);
    for (long k = 0; k < 4; k++) {
        mge_alloc_fail_after(k);
        ck_assert_int_eq(mge_loader_init(&ld, &ds, &s, 2), MGE_NOMEM);
        mge_alloc_fail_after(-1);
    }
    ck_assert_int_eq(mge_loader_init(&ld, &ds, &s, 2), MGE_OK);
    mge_loader_fini(&ld); /* without ever calling next: the thread is waiting for space */
    mge_sampler_fini(&s);
    mge_sampler_fini(&s2);
    mge_dataset_fini(&ds);
}
END_TEST

/* ---- NumPy .npy ---- */

#define NPY_N 6

/* Labels 0..5 and pixels i*7+j for the npy tests. */
static void npy_small(const char **img, const char **lab, const char *descr_lab)
{
    static uint8_t pix[NPY_N * 2 * 3 * 4];
    int64_t shape[4] = {NPY_N, 2, 3, 4};
    for (size_t i = 0; i < sizeof(pix); i++)
        pix[i] = (uint8_t)(i * 7 + 1);
    *img = tmp_path("x-u8.npy");
    ck_assert_int_eq(mge_test_npy_write(*img, "|u1", 4, shape, pix, sizeof(pix)), 0);
    *lab = tmp_path("y.npy");
    if (strcmp(descr_lab, "<i8") == 0) {
        int64_t y[NPY_N] = {0, 1, 2, 3, 4, 5};
        ck_assert_int_eq(mge_test_npy_write(*lab, descr_lab, 1, shape, y, sizeof(y)), 0);
    } else if (strcmp(descr_lab, "<i4") == 0) {
        int32_t y[NPY_N] = {0, 1, 2, 3, 4, 5};
        ck_assert_int_eq(mge_test_npy_write(*lab, descr_lab, 1, shape, y, sizeof(y)), 0);
    } else {
        uint8_t y[NPY_N] = {0, 1, 2, 3, 4, 5};
        ck_assert_int_eq(mge_test_npy_write(*lab, descr_lab, 1, shape, y, sizeof(y)), 0);
    }
}

START_TEST(test_npy_load_u8)
{
    static const char *const label_types[] = {"|u1", "<i4", "<i8"};
    struct mge_dataset ds;
    const char *img, *lab;
    char err[256];
    for (int t = 0; t < 3; t++) {
        npy_small(&img, &lab, label_types[t]);
        ck_assert_int_eq(mge_dataset_load_npy(&ds, img, lab, NULL, err, sizeof(err)), MGE_OK);
        ck_assert_int_eq(ds.n, NPY_N);
        ck_assert_int_eq(ds.c, 2);
        ck_assert_int_eq(ds.h, 3);
        ck_assert_int_eq(ds.w, 4);
        ck_assert_int_eq(ds.dim, 24);
        ck_assert_int_eq(ds.classes, NPY_N);
        ck_assert_int_eq(ds.f32, 0);
        ck_assert_ptr_nonnull(ds.map);
        for (int i = 0; i < NPY_N; i++) {
            ck_assert_int_eq(ds.labels[i], i);
            for (int j = 0; j < 24; j++)
                ck_assert_uint_eq(ds.pixels[i * 24 + j], (uint8_t)((i * 24 + j) * 7 + 1));
        }
        int64_t idx[2] = {5, 1};
        float x[48];
        int32_t y[2];
        ck_assert_int_eq(mge_dataset_gather(&ds, idx, 2, x, y), MGE_OK);
        ck_assert_int_eq(y[0], 5);
        ck_assert_float_eq(x[24 + 3], (float)(uint8_t)((24 + 3) * 7 + 1) / 255.0f);
        mge_dataset_fini(&ds);
        ck_assert_ptr_null(ds.map);
    }
    /* the spec's image shape and classes, when given, must hold and are taken */
    struct mge_data_expect want = {.c = 2, .h = 3, .w = 4, .dim = 24, .classes = 10};
    ck_assert_int_eq(mge_dataset_load_npy(&ds, img, lab, &want, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(ds.classes, 10);
    mge_dataset_fini(&ds);
}
END_TEST

START_TEST(test_npy_load_f32)
{
    /* float32 [N, D] inputs, gathered as they are; [N, H, W] too; version 2.0 and 3.0 */
    float xs[NPY_N * 5];
    int64_t shape[3] = {NPY_N, 5, 1}, y[NPY_N] = {1, 0, 1, 0, 1, 0};
    struct mge_dataset ds;
    const char *img = tmp_path("x-f32.npy"), *lab = tmp_path("y-i8.npy");
    const char *img3 = tmp_path("x-f32-v3.npy");
    char err[256];
    for (int i = 0; i < NPY_N * 5; i++)
        xs[i] = (float)i * 0.25f - 3.0f;
    ck_assert_int_eq(mge_test_npy_write(img, "<f4", 2, shape, xs, sizeof(xs)), 0);
    ck_assert_int_eq(mge_test_npy_write(lab, "<i8", 1, shape, y, sizeof(y)), 0);
    ck_assert_int_eq(mge_dataset_load_npy(&ds, img, lab, NULL, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(ds.f32, 1);
    ck_assert_int_eq(ds.dim, 5);
    ck_assert_int_eq(ds.c * ds.h * ds.w, 5);
    ck_assert_int_eq(ds.classes, 2);
    int64_t idx[NPY_N] = {5, 4, 3, 2, 1, 0};
    float x[NPY_N * 5];
    int32_t yy[NPY_N];
    ck_assert_int_eq(mge_dataset_gather(&ds, idx, NPY_N, x, yy), MGE_OK);
    for (int i = 0; i < NPY_N; i++) {
        ck_assert_int_eq(yy[i], (int)y[idx[i]]);
        for (int j = 0; j < 5; j++)
            ck_assert_float_eq(x[i * 5 + j], xs[idx[i] * 5 + j]);
    }
    mge_dataset_fini(&ds);
    ck_assert_int_eq(mge_test_npy_write_raw(img3, 3,
                                            "{\"shape\": (6, 5, 1), \"fortran_order\": False, "
                                            "\"descr\": \"<f4\"}",
                                            xs, sizeof(xs)),
                     0);
    ck_assert_int_eq(mge_dataset_load_npy(&ds, img3, lab, NULL, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(ds.h, 5);
    ck_assert_int_eq(ds.w, 1);
    ck_assert_float_eq(((const float *)ds.pixels)[7], xs[7]);
    mge_dataset_fini(&ds);
}
END_TEST

/* Load @img with the labels of npy_small(); expect @code and @want_msg in the message. */
static void npy_refused(const char *img, const char *lab, const struct mge_data_expect *want,
                        int code, const char *want_msg)
{
    struct mge_dataset ds;
    char err[512];
    int rc = mge_dataset_load_npy(&ds, img, lab, want, err, sizeof(err));
    ck_assert_msg(rc == code, "%s: got %s, want %s (%s)", want_msg, mge_strerror(rc),
                  mge_strerror(code), err);
    ck_assert_msg(strstr(err, want_msg) != NULL, "message '%s' lacks '%s'", err, want_msg);
    ck_assert_ptr_null(ds.pixels);
    ck_assert_ptr_null(ds.map);
    ck_assert_ptr_null(ds.labels);
}

START_TEST(test_npy_malformed)
{
    uint8_t pix[NPY_N * 4] = {0};
    int64_t shape[4] = {NPY_N, 2, 2, 1}, y8[NPY_N] = {0, 1, 2, 3, 4, 5};
    const char *img, *lab, *p;
    char dict[256];
    npy_small(&img, &lab, "|u1");

    p = tmp_path("magic.npy");
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    fputs("PK\x03\x04 this is a zip file, as np.savez writes", f);
    fclose(f);
    npy_refused(p, lab, NULL, MGE_FORMAT, "bad magic");
    p = tmp_path("empty.npy");
    f = fopen(p, "wb");
    fclose(f);
    npy_refused(p, lab, NULL, MGE_FORMAT, "bad magic");

    p = tmp_path("fortran.npy");
    ck_assert_int_eq(mge_test_npy_write_raw(p, 1,
                                            "{'descr': '|u1', 'fortran_order': True, "
                                            "'shape': (6, 4), }",
                                            pix, sizeof(pix)),
                     0);
    npy_refused(p, lab, NULL, MGE_FORMAT, "fortran_order is True");

    p = tmp_path("big-endian.npy");
    ck_assert_int_eq(mge_test_npy_write(p, ">f4", 2, shape, pix, sizeof(pix)), 0);
    npy_refused(p, lab, NULL, MGE_FORMAT, "big-endian dtype '>f4'");
    p = tmp_path("f8.npy");
    ck_assert_int_eq(mge_test_npy_write(p, "<f8", 2, shape, pix, sizeof(pix) / 2), 0);
    npy_refused(p, lab, NULL, MGE_FORMAT, "unsupported dtype '<f8'");
    p = tmp_path("i4-inputs.npy");
    ck_assert_int_eq(mge_test_npy_write(p, "<i4", 2, (int64_t[]){NPY_N, 1}, pix, sizeof(pix)), 0);
    npy_refused(p, lab, NULL, MGE_FORMAT, "inputs must be uint8 or float32, not int32");
    p = tmp_path("version.npy");
    ck_assert_int_eq(mge_test_npy_write(p, "|u1", 2, shape, pix, sizeof(pix)), 0);
    f = fopen(p, "r+b");
    fseek(f, 6, SEEK_SET);
    fputc(4, f);
    fclose(f);
    npy_refused(p, lab, NULL, MGE_FORMAT, "unsupported .npy version 4.0");

    /* the dict itself */
    static const struct {
        const char *dict, *msg;
    } dicts[] = {
        {"{'descr': '|u1', 'shape': (6, 4), }", "lacks 'fortran_order'"},
        {"{'descr': '|u1', 'fortran_order': False, 'shape': (6, 4), 'x': 1}",
         "unknown or repeated key 'x'"},
        {"{'descr': '|u1', 'descr': '|u1', 'fortran_order': False, 'shape': (6, 4)}",
         "repeated key 'descr'"},
        {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6, 4)}", "structured arrays"},
        {"{'descr': '|u1', 'fortran_order': False, 'shape': (6, 4)} junk", "data after the dict"},
        {"{'descr': '|u1', 'fortran_order': False, 'shape': (6, -4)}", "not a size"},
        {"{'descr': '|u1', 'fortran_order': False, 'shape': (6, 1, 1, 1, 4)}",
         "more than 4 dimensions"},
        {"{'descr': '|u1', 'fortran_order': False, 'shape': (0, 4)}",
         "dimension 0 of the shape is 0"},
        {"{'descr': '|u1', 'fortran_order': False, 'shape': ()}", "0-dimensional"},
    };
    for (size_t i = 0; i < sizeof(dicts) / sizeof(dicts[0]); i++) {
        snprintf(dict, sizeof(dict), "dict%zu.npy", i);
        p = tmp_path(dict);
        ck_assert_int_eq(mge_test_npy_write_raw(p, 1, dicts[i].dict, pix, sizeof(pix)), 0);
        npy_refused(p, lab, NULL, MGE_FORMAT, dicts[i].msg);
    }

    /* sizes: truncated, trailing data, a header longer than the file */
    int64_t sh24[2] = {NPY_N, 4};
    p = tmp_path("truncated.npy");
    ck_assert_int_eq(mge_test_npy_write(p, "|u1", 2, sh24, pix, sizeof(pix) - 5), 0);
    npy_refused(p, lab, NULL, MGE_CORRUPT, "truncated: header says 6 samples, file has data for 4");
    p = tmp_path("trailing.npy");
    int64_t sh5[2] = {5, 4};
    ck_assert_int_eq(mge_test_npy_write(p, "|u1", 2, sh5, pix, sizeof(pix)), 0);
    npy_refused(p, lab, NULL, MGE_FORMAT, "trailing data");
    p = tmp_path("short-header.npy");
    ck_assert_int_eq(mge_test_npy_write(p, "|u1", 2, sh24, pix, sizeof(pix)), 0);
    ck_assert_int_eq(truncate(p, 40), 0);
    npy_refused(p, lab, NULL, MGE_CORRUPT, "truncated: 40 of 128 header bytes");

    /* the spec disagrees with the file */
    struct mge_data_expect want_img = {.c = 1, .h = 3, .w = 8};
    npy_refused(img, lab, &want_img, MGE_FORMAT,
                "shape [6, 2, 3, 4] does not match data.image [1, 3, 8] of the spec");
    struct mge_data_expect want_dim = {.dim = 784};
    npy_refused(img, lab, &want_dim, MGE_FORMAT,
                "shape [6, 2, 3, 4] has 24 values per sample but the spec says 784");

    /* labels: range, sign, type, rank, count */
    struct mge_data_expect want_cls = {.classes = 5};
    npy_refused(img, lab, &want_cls, MGE_CORRUPT, "label 5 of sample 5 is out of range [0, 5)");
    p = tmp_path("neg.npy");
    y8[2] = -1;
    ck_assert_int_eq(mge_test_npy_write(p, "<i8", 1, sh24, y8, sizeof(y8)), 0);
    npy_refused(img, p, NULL, MGE_CORRUPT, "label -1 of sample 2 is out of range");
    p = tmp_path("float-labels.npy");
    ck_assert_int_eq(mge_test_npy_write(p, "<f4", 1, sh24, pix, sizeof(pix)), 0);
    npy_refused(img, p, NULL, MGE_FORMAT, "labels must be uint8, int32 or int64, not float32");
    p = tmp_path("labels-2d.npy");
    int64_t sh61[2] = {NPY_N, 1};
    ck_assert_int_eq(mge_test_npy_write(p, "|u1", 2, sh61, pix, NPY_N), 0);
    npy_refused(img, p, NULL, MGE_FORMAT, "labels have shape [6, 1]; expected [N]");
    p = tmp_path("labels-5.npy");
    ck_assert_int_eq(mge_test_npy_write(p, "|u1", 1, sh5, pix, 5), 0);
    npy_refused(img, p, NULL, MGE_FORMAT, "has 5 labels but");
    npy_refused(tmp_path("missing.npy"), lab, NULL, MGE_NOENT, "missing.npy");
}
END_TEST

START_TEST(test_npy_long_header_and_roots)
{
    /* a header past the first 4096 bytes is read from the mapping; the data roots hold */
    char dict[6000];
    uint8_t pix[NPY_N * 4];
    const char *img, *lab, *p = tmp_path("long.npy");
    struct mge_dataset ds;
    struct mge_data_roots dr = {0};
    char err[256];
    npy_small(&img, &lab, "|u1");
    for (int i = 0; i < NPY_N * 4; i++)
        pix[i] = (uint8_t)(200 + i);
    int at = snprintf(dict, sizeof(dict),
                      "{'descr': '|u1', 'fortran_order': False, "
                      "'shape': (6, 4),");
    memset(dict + at, ' ', 5000);
    snprintf(dict + at + 5000, sizeof(dict) - (size_t)at - 5000, "}");
    ck_assert_int_eq(mge_test_npy_write_raw(p, 2, dict, pix, sizeof(pix)), 0);
    ck_assert_int_eq(mge_dataset_load_npy(&ds, p, lab, NULL, err, sizeof(err)), MGE_OK);
    ck_assert_uint_eq(ds.pixels[23], 223);
    mge_dataset_fini(&ds);

    ck_assert_int_eq(mge_data_roots_add(&dr, "/usr/share", err, sizeof(err)), MGE_OK);
    mge_dataset_set_roots(&dr);
    npy_refused(p, lab, NULL, MGE_FORBIDDEN, "is outside the worker's data roots");
    mge_dataset_set_roots(NULL);
    mge_data_roots_fini(&dr);
}
END_TEST

/* ---- CIFAR binary files ---- */

/* Write @n CIFAR records: label bytes (@lb: 1, or 2 with coarse = label % 20) of label
 * (first + i) % classes and pixels (first + i) * 3 + j; @cut bytes less at the end. */
static const char *write_cifar(const char *name, int lb, int classes, int first, int n, int cut)
{
    const char *path = tmp_path(name);
    FILE *f = fopen(path, "wb");
    size_t rec = (size_t)lb + 3072, total = rec * (size_t)n - (size_t)cut;
    uint8_t *buf = malloc(rec * (size_t)n);
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(buf);
    for (int i = 0; i < n; i++) {
        uint8_t *r = buf + rec * (size_t)i;
        int label = (first + i) % classes;
        if (lb == 2)
            r[0] = (uint8_t)(label % 20);
        r[lb - 1] = (uint8_t)label;
        for (int j = 0; j < 3072; j++)
            r[lb + j] = (uint8_t)((first + i) * 3 + j);
    }
    ck_assert_uint_eq(fwrite(buf, 1, total, f), total);
    fclose(f);
    free(buf);
    return path;
}

START_TEST(test_cifar_load)
{
    /* CIFAR-10 from two files, concatenated in order; CIFAR-100 takes the fine label */
    struct mge_dataset ds;
    char err[256];
    const char *files[2] = {write_cifar("data_batch_1.bin", 1, 10, 0, 7, 0),
                            write_cifar("data_batch_2.bin", 1, 10, 7, 5, 0)};
    ck_assert_int_eq(mge_dataset_load_cifar(&ds, files, 2, 10, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(ds.n, 12);
    ck_assert_int_eq(ds.c, 3);
    ck_assert_int_eq(ds.h, 32);
    ck_assert_int_eq(ds.w, 32);
    ck_assert_int_eq(ds.dim, 3072);
    ck_assert_int_eq(ds.classes, 10);
    for (int i = 0; i < 12; i++) {
        ck_assert_int_eq(ds.labels[i], i % 10);
        for (int j = 0; j < 3072; j += 97)
            ck_assert_uint_eq(ds.pixels[i * 3072 + j], (uint8_t)(i * 3 + j));
    }
    mge_dataset_fini(&ds);

    const char *c100 = write_cifar("train.bin", 2, 100, 30, 80, 0);
    ck_assert_int_eq(mge_dataset_load_cifar(&ds, &c100, 1, 100, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(ds.n, 80);
    ck_assert_int_eq(ds.classes, 100);
    for (int i = 0; i < 80; i++) {
        ck_assert_int_eq(ds.labels[i], (30 + i) % 100);
        ck_assert_uint_eq(ds.pixels[i * 3072 + 5], (uint8_t)((30 + i) * 3 + 5));
    }
    mge_dataset_fini(&ds);
}
END_TEST

static void cifar_refused(const char *const *files, int n, int classes, int code, const char *msg)
{
    struct mge_dataset ds;
    char err[512];
    int rc = mge_dataset_load_cifar(&ds, files, n, classes, err, sizeof(err));
    ck_assert_msg(rc == code, "%s: got %s (%s)", msg, mge_strerror(rc), err);
    ck_assert_msg(strstr(err, msg) != NULL, "message '%s' lacks '%s'", err, msg);
    ck_assert_ptr_null(ds.pixels);
    ck_assert_ptr_null(ds.labels);
}

START_TEST(test_cifar_malformed)
{
    const char *good = write_cifar("good.bin", 1, 10, 0, 3, 0);
    const char *f[2] = {good, write_cifar("cut.bin", 1, 10, 0, 3, 100)};
    cifar_refused(f, 2, 10, MGE_FORMAT,
                  "cut.bin: size 9119 is not a positive multiple of the 3073-byte CIFAR-10 "
                  "record (1 label byte + 3072 pixels)");
    /* CIFAR-100 records read as CIFAR-10: 3074 * 3 bytes is no multiple of 3073 */
    f[1] = write_cifar("c100.bin", 2, 100, 0, 3, 0);
    cifar_refused(f + 1, 1, 10, MGE_FORMAT, "c100.bin: size 9222 is not a positive multiple");
    f[1] = write_cifar("empty.bin", 1, 10, 0, 1, 3073);
    cifar_refused(f + 1, 1, 10, MGE_FORMAT, "empty.bin: size 0 is not");
    /* a label >= 10 in a CIFAR-10 file; a coarse label >= 20 in CIFAR-100 */
    f[1] = write_cifar("labels.bin", 1, 12, 0, 12, 0);
    cifar_refused(f, 2, 10, MGE_CORRUPT,
                  "labels.bin: label 10 of record 10 is out of range [0, 10)");
    const char *p = tmp_path("coarse.bin");
    uint8_t rec[3074] = {25, 3};
    FILE *fp = fopen(p, "wb");
    fwrite(rec, 1, sizeof(rec), fp);
    fclose(fp);
    cifar_refused(&p, 1, 100, MGE_CORRUPT,
                  "coarse.bin: coarse label 25 of record 0 is out of range [0, 20)");
    f[1] = tmp_path("missing.bin");
    cifar_refused(f, 2, 10, MGE_NOENT, "missing.bin");
    cifar_refused(f, 1, 20, MGE_INVAL, "CIFAR classes must be 10 or 100, got 20");
    cifar_refused(f, 0, 10, MGE_INVAL, "1 to 16 files, got 0");
}
END_TEST

START_TEST(test_tokens_load)
{
    /* uint16 from two files, concatenated; uint32; text bytes; the held-out split */
    struct mge_tokens tk, tail;
    char err[256];
    uint16_t a[5] = {1, 2, 3, 40000, 5}, b[3] = {6, 7, 8};
    uint32_t c[3] = {70000, 1, 99999};
    const char *f16[2] = {write_raw("a.bin", a, sizeof(a)), write_raw("b.bin", b, sizeof(b))};
    ck_assert_int_eq(mge_tokens_load(&tk, f16, 2, 2, 50257, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(tk.n, 8);
    int64_t starts[2] = {2, 4};
    int32_t x[6], y[6];
    mge_tokens_gather(&tk, starts, 2, 3, x, y);
    const int32_t wx[6] = {3, 40000, 5, 5, 6, 7}, wy[6] = {40000, 5, 6, 6, 7, 8};
    ck_assert_mem_eq(x, wx, sizeof(wx));
    ck_assert_mem_eq(y, wy, sizeof(wy));
    mge_tokens_split(&tk, 6, &tail);
    ck_assert_int_eq(tk.n, 6);
    ck_assert_int_eq(tail.n, 2);
    ck_assert_ptr_null(tail.owned);
    mge_tokens_gather(&tail, (int64_t[]){0}, 1, 1, x, y);
    ck_assert_int_eq(x[0], 7);
    ck_assert_int_eq(y[0], 8);
    mge_tokens_fini(&tail);
    mge_tokens_fini(&tk);
    const char *f32 = write_raw("c.bin", c, sizeof(c));
    ck_assert_int_eq(mge_tokens_load(&tk, &f32, 1, 4, 100000, err, sizeof(err)), MGE_OK);
    mge_tokens_gather(&tk, (int64_t[]){0}, 1, 2, x, y);
    ck_assert_int_eq(x[0], 70000);
    ck_assert_int_eq(y[1], 99999);
    mge_tokens_fini(&tk);
    const char *txt = write_raw("t.txt", "hello\n\xff", 7);
    ck_assert_int_eq(mge_tokens_load(&tk, &txt, 1, 1, 256, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(tk.n, 7);
    mge_tokens_gather(&tk, (int64_t[]){5}, 1, 1, x, y);
    ck_assert_int_eq(x[0], '\n');
    ck_assert_int_eq(y[0], 255);
    mge_tokens_fini(&tk);
}
END_TEST

static void tokens_refused(const char *const *files, int n, int width, int64_t vocab, int code,
                           const char *msg)
{
    struct mge_tokens tk;
    char err[512];
    int rc = mge_tokens_load(&tk, files, n, width, vocab, err, sizeof(err));
    ck_assert_msg(rc == code, "%s: got %s (%s)", msg, mge_strerror(rc), err);
    ck_assert_msg(strstr(err, msg) != NULL, "message '%s' lacks '%s'", err, msg);
    ck_assert_ptr_null(tk.owned);
    ck_assert_int_eq(tk.n, 0);
}

START_TEST(test_tokens_malformed)
{
    uint16_t ids[4] = {1, 2, 300, 4};
    const char *f[2] = {write_raw("ok.bin", ids, 4), write_raw("big.bin", ids, sizeof(ids))};
    tokens_refused(f, 2, 2, 256, MGE_CORRUPT,
                   "big.bin: token id 300 at byte offset 4 (token 2) is not below model.vocab 256");
    tokens_refused(&f[1], 1, 1, 3, MGE_CORRUPT, "big.bin: token id 44 at byte offset 4 (token 4)");
    f[1] = write_raw("odd.bin", ids, 3);
    tokens_refused(f, 2, 2, 256, MGE_FORMAT, "odd.bin: size 3 is not a positive multiple of 2");
    f[1] = write_raw("empty.bin", ids, 0);
    tokens_refused(f, 2, 4, 256, MGE_FORMAT, "empty.bin: size 0 is not a positive multiple of 4");
    f[1] = tmp_path("missing.bin");
    tokens_refused(f, 2, 2, 256, MGE_NOENT, "missing.bin");
    tokens_refused(f, 1, 3, 256, MGE_INVAL, "width 3 is not 1, 2 or 4");
    tokens_refused(f, 0, 2, 256, MGE_INVAL, "1 to 16 files, got 0");
}
END_TEST

START_TEST(test_tokens_windows)
{
    /* a pure function of (seed, step, row), in [0, n - T), spread over the range */
    struct mge_tokens tk = {.n = 1000, .width = 1};
    int64_t T = 100, seen_lo = 0, seen_hi = 0, same_rows = 0;
    for (int64_t step = 0; step < 50; step++)
        for (int64_t row = 0; row < 8; row++) {
            int64_t s = mge_tokens_window(&tk, T, 42, step, row);
            ck_assert_int_ge(s, 0);
            ck_assert_int_lt(s, tk.n - T);
            ck_assert_int_eq(s, mge_tokens_window(&tk, T, 42, step, row));
            seen_lo += s < 300;
            seen_hi += s >= 600;
            same_rows += row > 0 && s == mge_tokens_window(&tk, T, 42, step, row - 1);
        }
    ck_assert_int_gt(seen_lo, 50);
    ck_assert_int_gt(seen_hi, 50);
    ck_assert_int_lt(same_rows, 10);
    ck_assert_int_ne(mge_tokens_window(&tk, T, 42, 3, 1), mge_tokens_window(&tk, T, 43, 3, 1));
}
END_TEST

START_TEST(test_normalize)
{
    /* per channel (x - mean) / std after the byte scaling, channel = j / (h*w) */
    struct mge_dataset ds;
    const double mean[2] = {0.5, 0.25}, std[2] = {0.2, 2.0};
    char err[256];
    ck_assert_int_eq(mge_dataset_synthetic(&ds, 10, 2, 2, 3, 4, 7), MGE_OK);
    ck_assert_int_eq(mge_dataset_set_normalize(&ds, 1, mean, std, err, sizeof(err)), MGE_FORMAT);
    ck_assert_str_eq(err,
                     "data.normalize has 1 entry but the data has 2 channels (c of [c, h, w])");
    const double bad_std[2] = {0.2, 0};
    ck_assert_int_eq(mge_dataset_set_normalize(&ds, 2, mean, bad_std, err, sizeof(err)), MGE_INVAL);
    ck_assert_int_eq(ds.norm, 0);
    ck_assert_int_eq(mge_dataset_set_normalize(&ds, 2, mean, std, err, sizeof(err)), MGE_OK);
    int64_t idx[2] = {9, 3};
    float x[24];
    int32_t y[2];
    ck_assert_int_eq(mge_dataset_gather(&ds, idx, 2, x, y), MGE_OK);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 12; j++) {
            int ch = j / 6;
            float want =
                ((float)ds.pixels[idx[i] * 12 + j] / 255.0f - (float)mean[ch]) / (float)std[ch];
            ck_assert_float_eq(x[i * 12 + j], want);
        }
    mge_dataset_fini(&ds);
}
END_TEST

/* ---- augmentation ---- */

START_TEST(test_augment_draw)
{
    /* a pure function of (seed, epoch, sample): every offset and both flips occur, evenly */
    struct mge_augment a = {.crop_padding = 4, .hflip = 1, .seed = 42};
    int seen[9][9] = {{0}}, flips = 0, moved_by_epoch = 0, moved_by_seed = 0;
    const int N = 20000;
    for (int64_t i = 0; i < N; i++) {
        int dy, dx, f, dy2, dx2, f2;
        mge_augment_draw(&a, 3, i, &dy, &dx, &f);
        mge_augment_draw(&a, 3, i, &dy2, &dx2, &f2);
        ck_assert(dy == dy2 && dx == dx2 && f == f2);
        ck_assert(dy >= -4 && dy <= 4 && dx >= -4 && dx <= 4 && (f == 0 || f == 1));
        seen[dy + 4][dx + 4]++;
        flips += f;
        mge_augment_draw(&a, 4, i, &dy2, &dx2, &f2);
        moved_by_epoch += dy != dy2 || dx != dx2 || f != f2;
        struct mge_augment b = a;
        b.seed = 43;
        mge_augment_draw(&b, 3, i, &dy2, &dx2, &f2);
        moved_by_seed += dy != dy2 || dx != dx2 || f != f2;
    }
    for (int y = 0; y < 9; y++)
        for (int x = 0; x < 9; x++) /* N / 81 = 247 expected each */
            ck_assert_msg(seen[y][x] > 150 && seen[y][x] < 350, "offset (%d, %d) drawn %d times",
                          y - 4, x - 4, seen[y][x]);
    ck_assert_msg(flips > N / 2 - 500 && flips < N / 2 + 500, "%d flips of %d", flips, N);
    /* another epoch or seed draws anew: 1 - 1/162 of the draws differ */
    ck_assert_int_gt(moved_by_epoch, N * 95 / 100);
    ck_assert_int_gt(moved_by_seed, N * 95 / 100);

    /* cropping and flipping off: the identity */
    struct mge_augment off = {.crop_padding = 0, .hflip = 0, .seed = 42};
    for (int64_t i = 0; i < 100; i++) {
        int dy, dx, f;
        mge_augment_draw(&off, 1, i, &dy, &dx, &f);
        ck_assert(dy == 0 && dx == 0 && f == 0);
    }
}
END_TEST

/*
 * A hand-made 2-channel 3x4 image (bytes 1..12, and 101..112 in channel 1), stored 256 times in
 * uint8 and in float32; padding 1 with flips. For the samples whose draw is one of four cases
 * below, the gathered image must be the one written out by hand (torchvision's pad 1, crop at
 * (dy + 1, dx + 1) of the 5x6 padded image, then mirror).
 */
START_TEST(test_augment_hand_image)
{
    static const float want[4][3][4] = {
        {{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}}, /* dy 0, dx 0 */
        {{0, 5, 6, 7}, {0, 9, 10, 11}, {0, 0, 0, 0}},  /* dy 1, dx -1 */
        {{0, 0, 0, 0}, {0, 4, 3, 2}, {0, 8, 7, 6}},    /* dy -1, dx 1, flipped */
        {{4, 3, 2, 1}, {8, 7, 6, 5}, {12, 11, 10, 9}}, /* dy 0, dx 0, flipped */
    };
    static const int cases[4][3] = {{0, 0, 0}, {1, -1, 0}, {-1, 1, 1}, {0, 0, 1}};
    const int64_t n = 256;
    char err[256];
    for (int f32 = 0; f32 < 2; f32++) {
        struct mge_dataset ds;
        int found[4] = {0};
        memset(&ds, 0, sizeof(ds));
        ds.n = n;
        ds.c = 2;
        ds.h = 3;
        ds.w = 4;
        ds.dim = 24;
        ds.classes = 1;
        ds.f32 = f32;
        ds.pixels = mge_malloc((size_t)(n * 24) * (f32 ? sizeof(float) : 1));
        ds.labels = mge_calloc((size_t)n, sizeof(int32_t));
        ck_assert(ds.pixels && ds.labels);
        for (int64_t i = 0; i < n; i++)
            for (int j = 0; j < 24; j++) {
                int v = 1 + j % 12 + (j >= 12 ? 100 : 0);
                if (f32)
                    ((float *)ds.pixels)[i * 24 + j] = (float)v / 255.0f;
                else
                    ds.pixels[i * 24 + j] = (uint8_t)v;
            }
        ck_assert_int_eq(mge_dataset_set_augment(&ds, 1, 1, 9, err, sizeof(err)), MGE_OK);
        for (int64_t i = 0; i < n; i++) {
            int dy, dx, fl, k;
            float x[24], plain[24];
            int32_t y;
            mge_augment_draw(&ds.aug, 2, i, &dy, &dx, &fl);
            ck_assert_int_eq(mge_dataset_gather_augmented(&ds, &i, 1, 2, x, &y), MGE_OK);
            /* evaluation never augments */
            ck_assert_int_eq(mge_dataset_gather(&ds, &i, 1, plain, &y), MGE_OK);
            for (int j = 0; j < 24; j++)
                ck_assert_float_eq(plain[j], (float)(1 + j % 12 + (j >= 12 ? 100 : 0)) / 255.0f);
            for (k = 0; k < 4; k++)
                if (cases[k][0] == dy && cases[k][1] == dx && cases[k][2] == fl)
                    break;
            if (k == 4)
                continue;
            found[k]++;
            for (int ch = 0; ch < 2; ch++)
                for (int r = 0; r < 3; r++)
                    for (int c = 0; c < 4; c++) {
                        float v = want[k][r][c];
                        v = v > 0 && ch == 1 ? v + 100 : v;
                        ck_assert_float_eq(x[ch * 12 + r * 4 + c], v / 255.0f);
                    }
        }
        /* 18 draws are possible, each case had 256 tries: (17/18)^256 < 1e-6 to miss one */
        for (int k = 0; k < 4; k++)
            ck_assert_msg(found[k] > 0, "case %d never drawn", k);

        /* normalisation comes after the crop: the padding is (0 - mean) / std */
        const double mean[2] = {0.5, 0.25}, std[2] = {0.2, 2.0};
        ck_assert_int_eq(mge_dataset_set_normalize(&ds, 2, mean, std, err, sizeof(err)), MGE_OK);
        for (int64_t i = 0; i < n; i++) {
            int dy, dx, fl;
            float x[24];
            int32_t y;
            mge_augment_draw(&ds.aug, 2, i, &dy, &dx, &fl);
            if (dy != 1 || dx != -1 || fl)
                continue;
            ck_assert_int_eq(mge_dataset_gather_augmented(&ds, &i, 1, 2, x, &y), MGE_OK);
            ck_assert_float_eq(x[0], (0.0f - 0.5f) / 0.2f);
            ck_assert_float_eq(x[12], (0.0f - 0.25f) / 2.0f);
            ck_assert_float_eq(x[1], (5.0f / 255.0f - 0.5f) / 0.2f);
            ck_assert_float_eq(x[13], (105.0f / 255.0f - 0.25f) / 2.0f);
        }
        mge_dataset_fini(&ds);
    }
}
END_TEST

START_TEST(test_augment_errors)
{
    struct mge_dataset ds;
    char err[256];
    ck_assert_int_eq(mge_dataset_synthetic(&ds, 4, 1, 1, 784, 2, 1), MGE_OK);
    ck_assert_int_eq(mge_dataset_set_augment(&ds, 4, 0, 1, err, sizeof(err)), MGE_FORMAT);
    ck_assert_str_eq(err, "data.augment needs images, but the data is [1, 1, 784] (c, h, w): "
                          "give data.image for flat features");
    ck_assert_int_eq(mge_dataset_set_augment(&ds, 0, 0, 1, err, sizeof(err)), MGE_OK);
    mge_dataset_fini(&ds);
    ck_assert_int_eq(mge_dataset_synthetic(&ds, 4, 1, 28, 28, 2, 1), MGE_OK);
    ck_assert_int_eq(mge_dataset_set_augment(&ds, 65, 0, 1, err, sizeof(err)), MGE_INVAL);
    ck_assert_str_eq(err, "data.augment.crop_padding must be in [0, 64], not 65");
    ck_assert_int_eq(mge_dataset_set_augment(&ds, -1, 0, 1, err, sizeof(err)), MGE_INVAL);
    ck_assert_int_eq(ds.aug.crop_padding, 0);
    mge_dataset_fini(&ds);
}
END_TEST

/*
 * Data parallelism: the rows ranks 0 and 1 of 2 get, side by side, are the 1-rank batch, also
 * augmented (the draws follow the sample, not the rank or the batch row), and augmentation
 * changes the batch.
 */
START_TEST(test_loader_augment_ranks)
{
    struct mge_dataset ds;
    struct mge_sampler s1, s2[2], ref;
    struct mge_loader l1, l2[2];
    const int64_t n = 37, B = 8, dim = 3 * 6 * 5;
    char err[256];
    int changed = 0;
    ck_assert_int_eq(mge_dataset_synthetic(&ds, n, 3, 6, 5, 4, 2), MGE_OK);
    ck_assert_int_eq(mge_dataset_set_augment(&ds, 2, 1, 77, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(mge_sampler_init(&s1, n, B, 0, 1, 6), MGE_OK);
    ck_assert_int_eq(mge_sampler_init(&ref, n, B, 0, 1, 6), MGE_OK);
    ck_assert_int_eq(mge_loader_init(&l1, &ds, &s1, 2), MGE_OK);
    for (int r = 0; r < 2; r++) {
        ck_assert_int_eq(mge_sampler_init(&s2[r], n, B, r, 2, 6), MGE_OK);
        ck_assert_int_eq(mge_loader_init(&l2[r], &ds, &s2[r], r), MGE_OK);
    }
    for (int step = 0; step < 15; step++) { /* 5 batches per epoch: 3 epochs */
        struct mge_batch *b1, *b2[2];
        ck_assert_int_eq(mge_loader_next(&l1, &b1), MGE_OK);
        ck_assert_int_eq(mge_loader_next(&l2[0], &b2[0]), MGE_OK);
        ck_assert_int_eq(mge_loader_next(&l2[1], &b2[1]), MGE_OK);
        ck_assert_int_eq(b2[0]->n + b2[1]->n, b1->n);
        ck_assert_mem_eq(b2[0]->x, b1->x, (size_t)(b2[0]->n * dim) * sizeof(float));
        ck_assert_mem_eq(b2[1]->x, b1->x + b2[0]->n * dim,
                         (size_t)(b2[1]->n * dim) * sizeof(float));
        /* the batch is the sampler's samples augmented with the batch's epoch ... */
        float aug[8 * 3 * 6 * 5], plain[8 * 3 * 6 * 5];
        int32_t y[8];
        int64_t idx[8], nl, gn;
        while (mge_sampler_next(&ref, idx, &nl, &gn) == 1)
            continue;
        ck_assert_int_eq(nl, b1->n);
        ck_assert_int_eq(b1->epoch, step / 5);
        ck_assert_int_eq(mge_dataset_gather_augmented(&ds, idx, nl, b1->epoch, aug, y), MGE_OK);
        ck_assert_mem_eq(b1->x, aug, (size_t)(nl * dim) * sizeof(float));
        /* ... which differs from the plain samples in most rows (1 of 50 draws is the identity) */
        ck_assert_int_eq(mge_dataset_gather(&ds, idx, nl, plain, y), MGE_OK);
        for (int64_t i = 0; i < nl; i++)
            changed += memcmp(aug + i * dim, plain + i * dim, (size_t)dim * sizeof(float)) != 0;
    }
    ck_assert_int_gt(changed, 37 * 3 * 3 / 4);
    mge_loader_fini(&l1);
    mge_sampler_fini(&s1);
    mge_sampler_fini(&ref);
    for (int r = 0; r < 2; r++) {
        mge_loader_fini(&l2[r]);
        mge_sampler_fini(&s2[r]);
    }
    mge_dataset_fini(&ds);
}
END_TEST

static Suite *data_suite(void)
{
    Suite *s = suite_create("data");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"idx_load", test_idx_load_plain_and_gz},
        {"idx_shapes", test_idx_load_2d_and_4d},
        {"idx_truncated", test_idx_truncated},
        {"idx_truncated_gzip", test_idx_truncated_gzip_stream},
        {"idx_bad_magic", test_idx_bad_magic},
        {"idx_count_mismatch", test_idx_count_mismatch},
        {"idx_trailing", test_idx_trailing_data},
        {"idx_label_range", test_idx_label_range},
        {"idx_missing", test_idx_missing_file},
        {"idx_data_roots", test_idx_data_roots},
        {"idx_alloc", test_idx_alloc_failures},
        {"idx_fashion_mnist", test_idx_fashion_mnist},
        {"npy_load_u8", test_npy_load_u8},
        {"npy_load_f32", test_npy_load_f32},
        {"npy_malformed", test_npy_malformed},
        {"npy_long_header_roots", test_npy_long_header_and_roots},
        {"cifar_load", test_cifar_load},
        {"cifar_malformed", test_cifar_malformed},
        {"normalize", test_normalize},
        {"tokens_load", test_tokens_load},
        {"tokens_malformed", test_tokens_malformed},
        {"tokens_windows", test_tokens_windows},
        {"synthetic", test_synthetic_deterministic},
        {"synthetic_errors", test_synthetic_errors},
        {"gather", test_gather},
        {"sampler_permutation", test_sampler_permutation},
        {"sampler_shards", test_sampler_shards},
        {"sampler_micro_shards", test_sampler_micro_shards},
        {"sampler_seek", test_sampler_seek},
        {"sampler_errors", test_sampler_errors},
        {"loader_gather", test_loader_matches_gather},
        {"loader_resume", test_loader_resume},
        {"loader_errors", test_loader_errors},
        {"augment_draw", test_augment_draw},
        {"augment_hand_image", test_augment_hand_image},
        {"augment_errors", test_augment_errors},
        {"loader_augment_ranks", test_loader_augment_ranks},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void) { return mge_test_run(data_suite()); }
