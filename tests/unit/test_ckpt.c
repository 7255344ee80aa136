/* test_ckpt.c: unit tests of engine/ckpt: round trip, atomic writes, corruption, validation. */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/ckpt.h"
#include "proto/checkpoint.pb-c.h"
#include "tests/unit/support/check_run.h"

static char tmpdir[64];
static char ckpath[128];

static void setup(void)
{
    mge_log_set_level(MGE_LOG_OFF);
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/mge-test-ckpt-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(ckpath, sizeof(ckpath), "%s/ck.bin", tmpdir);
}

/* Entries in tmpdir other than . and .., optionally counting only names containing @part. */
static int dir_entries(const char *part)
{
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    int n = 0;
    ck_assert_ptr_nonnull(d);
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && (!part || strstr(e->d_name, part)))
            n++;
    closedir(d);
    return n;
}

static void teardown(void)
{
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    char p[sizeof(tmpdir) + sizeof(e->d_name) + 1];
    mge_alloc_fail_after(-1);
    if (!d)
        return;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof(p), "%s/%s", tmpdir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(tmpdir);
}

/* A small checkpoint with borrowed data in static storage. */
static float w1[2 * 3] = {1, 2, 3, 4, 5, 6};
static float m1[2 * 3] = {0.5f, -0.5f, 0, 1e-3f, 7, 8};
static int64_t step_t = 1234;
static struct mge_ckpt_tensor tensors[4];

static struct mge_ckpt sample_ckpt(void)
{
    struct mge_ckpt ck = {0};
    tensors[0] = (struct mge_ckpt_tensor){"fc1.w", MGE_CKPT_F32, 2, {2, 3}, w1, sizeof(w1)};
    tensors[1] = (struct mge_ckpt_tensor){"optim.m.fc1.w", MGE_CKPT_F32, 2, {2, 3}, m1, sizeof(m1)};
    tensors[2] = (struct mge_ckpt_tensor){"step", MGE_CKPT_I64, 0, {0}, &step_t, sizeof(step_t)};
    tensors[3] = (struct mge_ckpt_tensor){"empty", MGE_CKPT_U8, 2, {0, 4}, NULL, 0};
    ck.step = 1234;
    ck.epoch = 3;
    ck.sampler_pos = 640;
    ck.optim_step = 1234;
    ck.optim_type = MGE_CKPT_OPTIM_ADAM;
    ck.rng[0] = 1;
    ck.rng[1] = UINT64_MAX;
    ck.rng[2] = 0x0123456789abcdefULL;
    ck.rng[3] = 42;
    ck.n_rng = 4;
    ck.spec_yaml = "name: t\nmodel: {type: mlp}\n";
    ck.last_loss = 0.125;
    ck.test_accuracy = 0.875;
    ck.tensors = tensors;
    ck.n_tensors = 4;
    return ck;
}

static void check_equal(const struct mge_ckpt *a, const struct mge_ckpt *b)
{
    ck_assert_int_eq(b->version, MGE_CKPT_VERSION);
    ck_assert_int_eq(a->step, b->step);
    ck_assert_int_eq(a->epoch, b->epoch);
    ck_assert_int_eq(a->sampler_pos, b->sampler_pos);
    ck_assert_int_eq(a->optim_step, b->optim_step);
    ck_assert_int_eq(a->optim_type, b->optim_type);
    ck_assert_int_eq(a->n_rng, b->n_rng);
    for (int i = 0; i < a->n_rng; i++)
        ck_assert_uint_eq(a->rng[i], b->rng[i]);
    ck_assert_str_eq(a->spec_yaml, b->spec_yaml);
    ck_assert(a->last_loss == b->last_loss);
    ck_assert(a->test_accuracy == b->test_accuracy);
    ck_assert_int_eq(a->n_tensors, b->n_tensors);
    for (int i = 0; i < a->n_tensors; i++) {
        const struct mge_ckpt_tensor *x = &a->tensors[i];
        const struct mge_ckpt_tensor *y = mge_ckpt_find(b, x->name);
        ck_assert_ptr_nonnull(y);
        ck_assert_int_eq(x->dtype, y->dtype);
        ck_assert_int_eq(x->ndim, y->ndim);
        for (int d = 0; d < x->ndim; d++)
            ck_assert_int_eq(x->shape[d], y->shape[d]);
        ck_assert_uint_eq(x->nbytes, y->nbytes);
        if (x->nbytes)
            ck_assert_mem_eq(x->data, y->data, x->nbytes);
    }
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    if (len)
        ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(*len ? *len : 1);
    ck_assert_uint_eq(fread(buf, 1, *len, f), *len);
    fclose(f);
    return buf;
}

/* Wrap a payload in a valid header (so only payload validation can fail). */
static void *frame(const void *payload, size_t plen, size_t *len)
{
    uint8_t *buf = malloc(MGE_CKPT_HEADER_SIZE + plen);
    uint32_t crc = (uint32_t)crc32(0, payload, (uInt)plen);
    memcpy(buf, MGE_CKPT_MAGIC, 8);
    for (int i = 0; i < 8; i++)
        buf[8 + i] = (uint8_t)((uint64_t)plen >> (8 * i));
    for (int i = 0; i < 4; i++)
        buf[16 + i] = (uint8_t)(crc >> (8 * i));
    memset(buf + 20, 0, 4);
    memcpy(buf + MGE_CKPT_HEADER_SIZE, payload, plen);
    *len = MGE_CKPT_HEADER_SIZE + plen;
    return buf;
}

START_TEST(test_round_trip)
{
    struct mge_ckpt ck = sample_ckpt(), *got;
    char err[256];
    void *img;
    size_t ilen, flen;
    ck_assert_int_eq(mge_ckpt_write(ckpath, &ck, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(mge_ckpt_read(ckpath, &got, err, sizeof(err)), MGE_OK);
    check_equal(&ck, got);
    ck_assert_ptr_null(mge_ckpt_find(got, "nope"));
    ck_assert_ptr_nonnull(got->priv);
    mge_ckpt_free(got);

    /* The in-memory image is the file, byte for byte. */
    ck_assert_int_eq(mge_ckpt_encode(&ck, &img, &ilen, err, sizeof(err)), MGE_OK);
    void *file = read_file(ckpath, &flen);
    ck_assert_uint_eq(ilen, flen);
    ck_assert_mem_eq(img, file, ilen);
    ck_assert_int_eq(mge_ckpt_decode(img, ilen, &got, err, sizeof(err)), MGE_OK);
    check_equal(&ck, got);
    mge_ckpt_free(got);
    free(file);
    mge_free(img);

    /* Minimal: no tensors, no rng, no spec; NaN accuracy survives. */
    struct mge_ckpt empty = {0};
    empty.test_accuracy = NAN;
    ck_assert_int_eq(mge_ckpt_write(ckpath, &empty, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(mge_ckpt_read(ckpath, &got, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(got->n_tensors, 0);
    ck_assert_int_eq(got->n_rng, 0);
    ck_assert_str_eq(got->spec_yaml, "");
    ck_assert(isnan(got->test_accuracy));
    mge_ckpt_free(got);
    mge_ckpt_free(NULL);
}
END_TEST

START_TEST(test_atomic_write)
{
    struct mge_ckpt ck = sample_ckpt(), *got;
    char err[256], bad[200];
    ck_assert_int_eq(mge_ckpt_write(ckpath, &ck, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(dir_entries(NULL), 1);
    ck_assert_int_eq(dir_entries("tmp"), 0);
    /* Overwrite: the new one replaces the old; still one file. */
    ck.step = 99;
    ck_assert_int_eq(mge_ckpt_write(ckpath, &ck, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(dir_entries(NULL), 1);
    ck_assert_int_eq(mge_ckpt_read(ckpath, &got, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(got->step, 99);
    mge_ckpt_free(got);
    /* No such directory. */
    snprintf(bad, sizeof(bad), "%s/no/such/dir/ck.bin", tmpdir);
    ck_assert_int_eq(mge_ckpt_write(bad, &ck, err, sizeof(err)), MGE_NOENT);
    ck_assert_ptr_nonnull(strstr(err, bad));
    /* Out of memory at every step: error, no temp file left, old checkpoint intact. */
    for (long k = 0;; k++) {
        ck.step = 1000 + k;
        mge_alloc_fail_after(k);
        int rc = mge_ckpt_write(ckpath, &ck, err, sizeof(err));
        mge_alloc_fail_after(-1);
        ck_assert_int_eq(dir_entries("tmp"), 0);
        ck_assert_int_eq(mge_ckpt_read(ckpath, &got, err, sizeof(err)), MGE_OK);
        ck_assert_int_eq(got->step, rc == MGE_OK ? 1000 + k : 99);
        mge_ckpt_free(got);
        if (rc == MGE_OK)
            break;
        ck_assert_int_eq(rc, MGE_NOMEM);
    }
    ck_assert_int_eq(dir_entries(NULL), 1);
}
END_TEST

START_TEST(test_truncated)
{
    struct mge_ckpt ck = sample_ckpt(), *got;
    char err[256];
    void *img;
    size_t len;
    ck_assert_int_eq(mge_ckpt_encode(&ck, &img, &len, err, sizeof(err)), MGE_OK);
    ck_assert_uint_gt(len, 200);
    for (size_t cut = 0; cut < len; cut += (cut < 100 ? 1 : 100)) {
        write_file(ckpath, img, cut);
        got = (void *)1;
        ck_assert_int_eq(mge_ckpt_read(ckpath, &got, err, sizeof(err)), MGE_CORRUPT);
        ck_assert_ptr_null(got);
        ck_assert_ptr_nonnull(strstr(err, ckpath));
        if (cut >= 8)
            ck_assert_ptr_nonnull(strstr(err, "truncated"));
        ck_assert_int_eq(mge_ckpt_decode(img, cut, &got, err, sizeof(err)), MGE_CORRUPT);
    }
    /* ... and one byte short of whole, and trailing garbage. */
    ck_assert_int_eq(mge_ckpt_decode(img, len - 1, &got, err, sizeof(err)), MGE_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "<buffer>: truncated"));
    uint8_t *longer = malloc(len + 3);
    memcpy(longer, img, len);
    memset(longer + len, 0, 3);
    ck_assert_int_eq(mge_ckpt_decode(longer, len + 3, &got, err, sizeof(err)), MGE_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "trailing data"));
    free(longer);
    mge_free(img);
}
END_TEST

START_TEST(test_bit_flips)
{
    struct mge_ckpt ck = sample_ckpt(), *got;
    char err[256];
    void *img;
    size_t len;
    unsigned seed = 12345;
    ck_assert_int_eq(mge_ckpt_encode(&ck, &img, &len, err, sizeof(err)), MGE_OK);
    uint8_t *buf = malloc(len);
    /* Every single-bit flip is caught by the header or the CRC. */
    for (size_t bit = 0; bit < len * 8; bit++) {
        memcpy(buf, img, len);
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        ck_assert_int_ne(mge_ckpt_decode(buf, len, &got, err, sizeof(err)), MGE_OK);
        ck_assert_ptr_null(got);
    }
    /* Past the CRC, the payload decoder and validator must survive flips too. */
    for (int trial = 0; trial < 3000; trial++) {
        size_t plen = len - MGE_CKPT_HEADER_SIZE;
        memcpy(buf, (uint8_t *)img + MGE_CKPT_HEADER_SIZE, plen);
        int flips = 1 + rand_r(&seed) % 4;
        for (int f = 0; f < flips; f++) {
            size_t at = (size_t)rand_r(&seed) % plen;
            buf[at] ^= (uint8_t)(1u << (rand_r(&seed) % 8));
        }
        int rc = mge_ckpt_decode_payload(buf, plen, &got, err, sizeof(err));
        if (rc == MGE_OK)
            mge_ckpt_free(got);
        else
            ck_assert(rc == MGE_CORRUPT || rc == MGE_UNSUPPORTED);
    }
    free(buf);
    mge_free(img);
}
END_TEST

START_TEST(test_garbage)
{
    struct mge_ckpt *got;
    char err[256];
    uint8_t junk[64];
    size_t len;
    memset(junk, 0xff, sizeof(junk));
    /* Not a checkpoint at all. */
    write_file(ckpath, junk, sizeof(junk));
    ck_assert_int_eq(mge_ckpt_read(ckpath, &got, err, sizeof(err)), MGE_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "bad magic"));
    /* Valid header, garbage payload with a matching CRC: protobuf-c refuses it. */
    void *img = frame(junk, sizeof(junk), &len);
    ck_assert_int_eq(mge_ckpt_decode(img, len, &got, err, sizeof(err)), MGE_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "not a valid checkpoint message"));
    free(img);
    /* Empty payload: decodes, but format_version 0 is not a checkpoint. */
    img = frame(junk, 0, &len);
    ck_assert_int_eq(mge_ckpt_decode(img, len, &got, err, sizeof(err)), MGE_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "format version 0"));
    free(img);
    /* Reserved bytes must be zero. */
    struct mge_ckpt ck = sample_ckpt();
    ck_assert_int_eq(mge_ckpt_encode(&ck, &img, &len, err, sizeof(err)), MGE_OK);
    ((uint8_t *)img)[22] = 1;
    ck_assert_int_eq(mge_ckpt_decode(img, len, &got, err, sizeof(err)), MGE_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "reserved"));
    mge_free(img);
    /* A directory is not a checkpoint. */
    ck_assert_int_eq(mge_ckpt_read(tmpdir, &got, err, sizeof(err)), MGE_IO);
}
END_TEST

START_TEST(test_write_rejects_bad_tensors)
{
    struct mge_ckpt ck = sample_ckpt();
    char err[256];
    tensors[0].nbytes = 20; /* 2x3 f32 is 24 */
    ck_assert_int_eq(mge_ckpt_write(ckpath, &ck, err, sizeof(err)), MGE_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "'fc1.w' has 20 bytes but its shape and dtype need 24"));
    ck = sample_ckpt();
    tensors[0].shape[1] = 4;
    ck_assert_int_eq(mge_ckpt_write(ckpath, &ck, err, sizeof(err)), MGE_INVAL);
    ck = sample_ckpt();
    tensors[1].name = "fc1.w";
    ck_assert_int_eq(mge_ckpt_write(ckpath, &ck, err, sizeof(err)), MGE_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "'fc1.w' appears twice"));
    ck = sample_ckpt();
    tensors[0].ndim = 7;
    ck_assert_int_eq(mge_ckpt_write(ckpath, &ck, err, sizeof(err)), MGE_INVAL);
    ck = sample_ckpt();
    tensors[0].dtype = 99;
    ck_assert_int_eq(mge_ckpt_write(ckpath, &ck, err, sizeof(err)), MGE_INVAL);
    ck = sample_ckpt();
    tensors[2].name = "";
    ck_assert_int_eq(mge_ckpt_write(ckpath, &ck, err, sizeof(err)), MGE_INVAL);
    ck = sample_ckpt();
    tensors[0].shape[0] = -2;
    tensors[0].shape[1] = -3;
    ck_assert_int_eq(mge_ckpt_write(ckpath, &ck, err, sizeof(err)), MGE_INVAL);
    ck = sample_ckpt();
    ck.n_rng = 5;
    ck_assert_int_eq(mge_ckpt_write(ckpath, &ck, err, sizeof(err)), MGE_INVAL);
    ck = sample_ckpt();
    ck.epoch = -1;
    ck_assert_int_eq(mge_ckpt_write(ckpath, &ck, err, sizeof(err)), MGE_INVAL);
    ck = sample_ckpt();
    ck.optim_type = 17;
    ck_assert_int_eq(mge_ckpt_write(ckpath, &ck, err, sizeof(err)), MGE_INVAL);
    ck_assert_int_eq(dir_entries(NULL), 0); /* nothing was created */
}
END_TEST

/* Pack a message by hand (bypassing the writer's checks), frame it and decode it. */
static int decode_raw(Mge__Ckpt__Checkpoint *msg, char *err, size_t errlen)
{
    size_t plen = mge__ckpt__checkpoint__get_packed_size(msg), len;
    uint8_t *p = malloc(plen ? plen : 1);
    struct mge_ckpt *got;
    mge__ckpt__checkpoint__pack(msg, p);
    void *img = frame(p, plen, &len);
    int rc = mge_ckpt_decode(img, len, &got, err, errlen);
    if (rc == MGE_OK)
        mge_ckpt_free(got);
    else
        ck_assert_ptr_null(got);
    free(img);
    free(p);
    return rc;
}

START_TEST(test_read_rejects_bad_tensors)
{
    Mge__Ckpt__Checkpoint msg = MGE__CKPT__CHECKPOINT__INIT;
    Mge__Ckpt__Tensor t[2] = {MGE__CKPT__TENSOR__INIT, MGE__CKPT__TENSOR__INIT};
    Mge__Ckpt__Tensor *tp[2] = {&t[0], &t[1]};
    int64_t shape[7] = {2, 3, 1, 1, 1, 1, 1};
    uint64_t rng[5] = {1, 2, 3, 4, 5};
    uint8_t data[24] = {0};
    char err[256];
    msg.format_version = MGE_CKPT_VERSION;
    msg.n_tensors = 2;
    msg.tensors = tp;
    for (int i = 0; i < 2; i++) {
        t[i].name = (char *)(i ? "b" : "a");
        t[i].dtype = MGE__CKPT__DTYPE__DTYPE_F32;
        t[i].n_shape = 2;
        t[i].shape = shape;
        t[i].data.len = 24;
        t[i].data.data = data;
    }
    ck_assert_int_eq(decode_raw(&msg, err, sizeof(err)), MGE_OK);

    t[1].data.len = 23;
    ck_assert_int_eq(decode_raw(&msg, err, sizeof(err)), MGE_CORRUPT);
    ck_assert_ptr_nonnull(
        strstr(err, "<buffer>: tensor 'b' has 23 bytes but its shape and dtype need 24"));
    t[1].data.len = 24;

    t[1].n_shape = 7;
    ck_assert_int_eq(decode_raw(&msg, err, sizeof(err)), MGE_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "7 dims"));
    t[1].n_shape = 2;

    t[1].name = (char *)"a";
    ck_assert_int_eq(decode_raw(&msg, err, sizeof(err)), MGE_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "appears twice"));
    t[1].name = (char *)"b";

    t[1].dtype = (Mge__Ckpt__DType)42;
    ck_assert_int_eq(decode_raw(&msg, err, sizeof(err)), MGE_CORRUPT);
    t[1].dtype = MGE__CKPT__DTYPE__DTYPE_F32;

    int64_t huge[2] = {INT64_MAX, INT64_MAX};
    t[1].shape = huge;
    ck_assert_int_eq(decode_raw(&msg, err, sizeof(err)), MGE_CORRUPT);
    ck_assert_ptr_nonnull(strstr(err, "overflows"));
    t[1].shape = shape;

    msg.n_rng_state = 5;
    msg.rng_state = rng;
    ck_assert_int_eq(decode_raw(&msg, err, sizeof(err)), MGE_CORRUPT);
    msg.n_rng_state = 4;
    ck_assert_int_eq(decode_raw(&msg, err, sizeof(err)), MGE_OK);

    msg.sampler_pos = -5;
    ck_assert_int_eq(decode_raw(&msg, err, sizeof(err)), MGE_CORRUPT);
    msg.sampler_pos = 0;

    msg.optim_type = (Mge__Ckpt__OptimType)9;
    ck_assert_int_eq(decode_raw(&msg, err, sizeof(err)), MGE_CORRUPT);
    msg.optim_type = MGE__CKPT__OPTIM_TYPE__OPTIM_SGD;

    msg.format_version = 2;
    ck_assert_int_eq(decode_raw(&msg, err, sizeof(err)), MGE_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err, "format version 2"));
}
END_TEST

START_TEST(test_missing_file)
{
    struct mge_ckpt *got = (void *)1;
    char err[256], p[200];
    snprintf(p, sizeof(p), "%s/nope.ckpt", tmpdir);
    ck_assert_int_eq(mge_ckpt_read(p, &got, err, sizeof(err)), MGE_NOENT);
    ck_assert_ptr_null(got);
    ck_assert_ptr_nonnull(strstr(err, p));
}
END_TEST

START_TEST(test_read_alloc_failures)
{
    struct mge_ckpt ck = sample_ckpt(), *got;
    char err[256];
    ck_assert_int_eq(mge_ckpt_write(ckpath, &ck, err, sizeof(err)), MGE_OK);
    for (long k = 0;; k++) {
        mge_alloc_fail_after(k);
        int rc = mge_ckpt_read(ckpath, &got, err, sizeof(err));
        mge_alloc_fail_after(-1);
        if (rc == MGE_OK) {
            check_equal(&ck, got);
            mge_ckpt_free(got);
            break;
        }
        ck_assert_int_eq(rc, MGE_NOMEM);
        ck_assert_ptr_null(got);
    }
    for (long k = 0;; k++) {
        void *img;
        size_t len;
        mge_alloc_fail_after(k);
        int rc = mge_ckpt_encode(&ck, &img, &len, err, sizeof(err));
        mge_alloc_fail_after(-1);
        if (rc == MGE_OK) {
            mge_free(img);
            break;
        }
        ck_assert_int_eq(rc, MGE_NOMEM);
        ck_assert_ptr_null(img);
    }
}
END_TEST

START_TEST(test_dtype_size)
{
    ck_assert_uint_eq(mge_ckpt_dtype_size(MGE_CKPT_F32), 4);
    ck_assert_uint_eq(mge_ckpt_dtype_size(MGE_CKPT_BF16), 2);
    ck_assert_uint_eq(mge_ckpt_dtype_size(MGE_CKPT_I64), 8);
    ck_assert_uint_eq(mge_ckpt_dtype_size(MGE_CKPT_I8), 1);
    ck_assert_uint_eq(mge_ckpt_dtype_size(-1), 0);
    ck_assert_uint_eq(mge_ckpt_dtype_size(MGE_CKPT_DTYPE__COUNT), 0);
    /* The C enums mirror the proto enums. */
    ck_assert_int_eq(MGE_CKPT_I8, MGE__CKPT__DTYPE__DTYPE_I8);
    ck_assert_int_eq(MGE_CKPT_OPTIM_ADAMW, MGE__CKPT__OPTIM_TYPE__OPTIM_ADAMW);
}
END_TEST

/* A background write is the synchronous file byte for byte, though the live state changes
 * as soon as the save returns; "latest" then points at it. */
START_TEST(test_writer_matches_sync)
{
    struct mge_ckpt ck = sample_ckpt(), *back = NULL;
    struct mge_ckpt_writer *w = NULL;
    char bg[160], latest[160], link[64], err[256];
    size_t la, lb;
    ck_assert_int_eq(mge_ckpt_write(ckpath, &ck, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(mge_ckpt_writer_new(&w, ck.tensors, ck.n_tensors), MGE_OK);
    ck_assert_uint_ge(mge_ckpt_writer_bytes(w), sizeof(w1) + sizeof(m1) + sizeof(step_t));
    snprintf(bg, sizeof(bg), "%s/ckpt-001234.mgeckpt", tmpdir);
    snprintf(latest, sizeof(latest), "%s/latest.mgeckpt", tmpdir);
    ck_assert_int_eq(mge_ckpt_writer_save(w, &ck, bg, latest, err, sizeof(err)), MGE_OK);
    float saved = w1[0];
    w1[0] = -99.0f; /* the step loop goes on while the thread writes */
    m1[5] = -99.0f;
    ck_assert_int_eq(mge_ckpt_writer_wait(w, err, sizeof(err)), MGE_OK);
    w1[0] = saved;
    m1[5] = 8;
    uint8_t *a = read_file(ckpath, &la), *b = read_file(bg, &lb);
    ck_assert_uint_eq(la, lb);
    ck_assert_mem_eq(a, b, la);
    free(a);
    free(b);
    ssize_t n = readlink(latest, link, sizeof(link) - 1);
    ck_assert_int_gt(n, 0);
    link[n] = '\0';
    ck_assert_str_eq(link, "ckpt-001234.mgeckpt");
    /* a second save takes the state of its own moment */
    ck.step = 1300;
    w1[1] = 42.0f;
    snprintf(bg, sizeof(bg), "%s/ckpt-001300.mgeckpt", tmpdir);
    ck_assert_int_eq(mge_ckpt_writer_save(w, &ck, bg, latest, err, sizeof(err)), MGE_OK);
    mge_ckpt_writer_free(w); /* finishes the write */
    ck_assert_int_eq(mge_ckpt_read(latest, &back, err, sizeof(err)), MGE_OK);
    check_equal(&ck, back);
    ck_assert(mge_ckpt_find(back, "fc1.w") &&
              ((float *)mge_ckpt_find(back, "fc1.w")->data)[1] == 42);
    mge_ckpt_free(back);
    w1[1] = 2;
    ck_assert_int_eq(dir_entries(".tmp"), 0);
}
END_TEST

/* A failed background write is reported by the next wait and the next save, naming the path. */
START_TEST(test_writer_error)
{
    struct mge_ckpt ck = sample_ckpt();
    struct mge_ckpt_writer *w = NULL;
    char bad[160], err[256] = "";
    ck_assert_int_eq(mge_ckpt_writer_new(&w, ck.tensors, ck.n_tensors), MGE_OK);
    snprintf(bad, sizeof(bad), "%s/no-such-dir/ckpt-1.mgeckpt", tmpdir);
    ck_assert_int_eq(mge_ckpt_writer_save(w, &ck, bad, NULL, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(mge_ckpt_writer_wait(w, err, sizeof(err)), MGE_NOENT);
    ck_assert_ptr_nonnull(strstr(err, "no-such-dir"));
    err[0] = '\0';
    ck_assert_int_eq(mge_ckpt_writer_save(w, &ck, ckpath, NULL, err, sizeof(err)), MGE_NOENT);
    ck_assert_ptr_nonnull(strstr(err, "no-such-dir"));
    ck_assert_int_eq(access(ckpath, F_OK), -1); /* nothing handed over */
    ck.n_tensors = 3;
    mge_ckpt_writer_free(w);
    ck_assert_int_eq(mge_ckpt_writer_new(&w, ck.tensors, 4), MGE_OK);
    ck_assert_int_eq(mge_ckpt_writer_save(w, &ck, ckpath, NULL, err, sizeof(err)), MGE_INVAL);
    mge_ckpt_writer_free(w);
    mge_ckpt_writer_free(NULL);
    mge_alloc_fail_after(0);
    ck_assert_int_eq(mge_ckpt_writer_new(&w, ck.tensors, 4), MGE_NOMEM);
    ck_assert_ptr_null(w);
    mge_alloc_fail_after(-1);
}
END_TEST

static Suite *ckpt_suite(void)
{
    Suite *s = suite_create("ckpt");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"round_trip", test_round_trip},
        {"atomic_write", test_atomic_write},
        {"truncated", test_truncated},
        {"bit_flips", test_bit_flips},
        {"garbage", test_garbage},
        {"write_rejects", test_write_rejects_bad_tensors},
        {"read_rejects", test_read_rejects_bad_tensors},
        {"missing_file", test_missing_file},
        {"alloc_failures", test_read_alloc_failures},
        {"dtype_size", test_dtype_size},
        {"writer_matches_sync", test_writer_matches_sync},
        {"writer_error", test_writer_error},
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

int main(void) { return mge_test_run(ckpt_suite()); }
