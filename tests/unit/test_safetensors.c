/* test_safetensors.c: unit tests of engine/safetensors: round trip, and every malformed header
 * refused with a message naming the rule (the reader takes untrusted files). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/safetensors.h"
#include "tests/unit/support/check_run.h"

static char tmpdir[64];
static char path[128];

static void setup(void)
{
    mge_log_set_level(MGE_LOG_OFF);
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/mge-test-st-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(path, sizeof(path), "%s/w.safetensors", tmpdir);
}

static void teardown(void)
{
    mge_alloc_fail_after(-1);
    unlink(path);
    rmdir(tmpdir);
}

static float w1[2 * 3] = {1, 2, 3, 4, 5, -6};
static float b1[2] = {0.5f, -0.25f};
static float sc[1] = {3.5f};
static int64_t count = 1407;

static int sample(struct mge_ckpt_tensor *ts)
{
    ts[0] = (struct mge_ckpt_tensor){"fc1.weight", MGE_CKPT_F32, 2, {2, 3}, w1, sizeof(w1)};
    ts[1] = (struct mge_ckpt_tensor){"fc1.bias", MGE_CKPT_F32, 1, {2}, b1, sizeof(b1)};
    ts[2] = (struct mge_ckpt_tensor){"scale", MGE_CKPT_F32, 0, {0}, sc, sizeof(sc)};
    ts[3] = (struct mge_ckpt_tensor){"empty", MGE_CKPT_F32, 2, {0, 4}, NULL, 0};
    ts[4] = (struct mge_ckpt_tensor){
        "bn1.num_batches_tracked", MGE_CKPT_I64, 0, {0}, &count, sizeof(count)};
    return 5;
}

static uint8_t *slurp(const char *p, size_t *len)
{
    FILE *fp = fopen(p, "rb");
    ck_assert_ptr_nonnull(fp);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    *len = (size_t)n;
    return buf;
}

START_TEST(test_round_trip)
{
    struct mge_ckpt_tensor ts[5];
    struct mge_safetensors *st = NULL;
    const char *meta[] = {"format", "pt", "mge.step", "7", NULL};
    char err[512];
    int n = sample(ts);
    ck_assert_int_eq(mge_safetensors_write(path, ts, n, meta, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(mge_safetensors_read(path, &st, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(st->n_tensors, n);
    for (int i = 0; i < n; i++) {
        const struct mge_ckpt_tensor *t = mge_safetensors_find(st, ts[i].name);
        ck_assert_ptr_nonnull(t);
        ck_assert_int_eq(t->dtype, ts[i].dtype);
        ck_assert_int_eq(t->ndim, ts[i].ndim);
        for (int d = 0; d < t->ndim; d++)
            ck_assert_int_eq(t->shape[d], ts[i].shape[d]);
        ck_assert_uint_eq(t->nbytes, ts[i].nbytes);
        if (t->nbytes)
            ck_assert_int_eq(memcmp(t->data, ts[i].data, t->nbytes), 0);
    }
    ck_assert_ptr_null(mge_safetensors_find(st, "nope"));
    mge_safetensors_free(st);

    /* the layout the format prescribes: u64 LE length, a multiple of 8, JSON, then the data */
    size_t len;
    uint8_t *img = slurp(path, &len);
    uint64_t hl = 0;
    for (int b = 7; b >= 0; b--)
        hl = hl << 8 | img[b];
    ck_assert_uint_eq(hl % 8, 0);
    ck_assert_uint_eq(len, 8 + hl + sizeof(w1) + sizeof(b1) + sizeof(sc) + sizeof(count));
    ck_assert_ptr_nonnull(strstr((char *)img + 8, "\"bn1.num_batches_tracked\":{\"dtype\":\"I64\","
                                                  "\"shape\":[],\"data_offsets\":[36,44]}"));
    ck_assert_int_eq(img[8], '{');
    ck_assert_ptr_nonnull(strstr((char *)img + 8, "\"__metadata__\":{\"format\":\"pt\""));
    ck_assert_ptr_nonnull(strstr((char *)img + 8, "\"fc1.weight\":{\"dtype\":\"F32\",\"shape\":"
                                                  "[2,3],\"data_offsets\":[0,24]}"));
    ck_assert_int_eq(memcmp(img + 8 + hl, w1, sizeof(w1)), 0);
    free(img);
}
END_TEST

/* A file image: the 8-byte length of @header, @header, then @data_len bytes of data. */
static uint8_t *image(const char *header, size_t data_len, size_t *len)
{
    size_t hl = strlen(header);
    uint8_t *img = calloc(1, 8 + hl + data_len + 1);
    ck_assert_ptr_nonnull(img);
    for (int b = 0; b < 8; b++)
        img[b] = (uint8_t)((uint64_t)hl >> (8 * b));
    memcpy(img + 8, header, hl);
    *len = 8 + hl + data_len;
    return img;
}

static void refused(const char *header, size_t data_len, int code, const char *msg)
{
    struct mge_safetensors *st = (void *)1;
    char err[512];
    size_t len;
    uint8_t *img = image(header, data_len, &len);
    int rc = mge_safetensors_decode(img, len, &st, err, sizeof(err));
    ck_assert_msg(rc == code, "%s: rc %d, want %d (%s)", header, rc, code, err);
    ck_assert_ptr_null(st);
    ck_assert_msg(strstr(err, msg) != NULL, "%s: message '%s' lacks '%s'", header, err, msg);
    free(img);
}

#define T(name, dt, shape, off)                                                                    \
    "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" off "}"

START_TEST(test_malformed)
{
    refused("{\"a\"", 0, MGE_FORMAT, "header JSON");
    refused("[1, 2]", 0, MGE_FORMAT, "does not start with '{'");
    refused("{\"a\":1,\"a\":2}", 0, MGE_FORMAT, "duplicate");
    refused("{" T("a", "F16", "[2]", "[0,4]") "}", 4, MGE_UNSUPPORTED, "'a': dtype 'F16'");
    refused("{" T("a", "F32", "[2]", "[0,8]") ",\"x\":1}", 8, MGE_FORMAT, "'x': entry is not");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"z\":0}}", 4,
            MGE_FORMAT, "'a': unknown key 'z'");
    refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, MGE_FORMAT, "'a': needs dtype");
    refused("{" T("a", "F32", "[-1]", "[0,4]") "}", 4, MGE_FORMAT, "'a': shape[0]");
    refused("{" T("a", "F32", "[1.5]", "[0,4]") "}", 4, MGE_FORMAT, "'a': shape[0]");
    refused("{" T("a", "F32", "[1,1,1,1,1,1,1]", "[0,4]") "}", 4, MGE_FORMAT, "'a': 7 dims");
    refused("{" T("a", "F32", "[4,4]", "[0,4]") "}", 4, MGE_FORMAT,
            "'a': shape larger than the file");
    refused("{" T("a", "F32", "[2]", "[4,0]") "}", 8, MGE_FORMAT, "'a': data_offsets must be");
    refused("{" T("a", "F32", "[2]", "[0]") "}", 8, MGE_FORMAT, "'a': data_offsets must be");
    refused("{" T("a", "F32", "[2]", "[0,8]") "}", 4, MGE_FORMAT,
            "'a': data_offsets [0, 8] outside");
    refused("{" T("a", "F32", "[2]", "[0,4]") "}", 4, MGE_FORMAT, "'a': data_offsets span 4 bytes");
    refused("{" T("a", "I64", "[2]", "[0,8]") "}", 8, MGE_FORMAT, "need 16");
    refused("{" T("a", "F32", "[2]", "[0,8]") "," T("b", "F32", "[2]", "[4,12]") "}", 12,
            MGE_FORMAT, "overlap tensor 'a'");
    refused("{" T("a", "F32", "[1]", "[4,8]") "}", 8, MGE_FORMAT, "leaving bytes [0, 4) unused");
    refused("{" T("a", "F32", "[1]", "[0,4]") "}", 8, MGE_FORMAT, "4 data bytes after");
    refused("{\"__metadata__\":{\"k\":1}}", 0, MGE_FORMAT, "__metadata__: 'k' is not a string");
    refused("{\"__metadata__\":[]}", 0, MGE_FORMAT, "__metadata__ is not an object");
    refused("{" T("", "F32", "[1]", "[0,4]") "}", 4, MGE_FORMAT, "empty name");
}
END_TEST

START_TEST(test_header_length)
{
    struct mge_safetensors *st;
    char err[512];
    uint8_t img[16] = {0};
    ck_assert_int_eq(mge_safetensors_decode(img, 5, &st, err, sizeof(err)), MGE_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "too short"));
    img[0] = 9; /* 9 header bytes, 8 in the file */
    ck_assert_int_eq(mge_safetensors_decode(img, 16, &st, err, sizeof(err)), MGE_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "header length 9 outside"));
    memset(img, 0xff, 8); /* 2^64 - 1: no overflow in the bounds check */
    ck_assert_int_eq(mge_safetensors_decode(img, 16, &st, err, sizeof(err)), MGE_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "header length"));
    memset(img, 0, 8);
    img[3] = 0x10; /* 256 MiB, over the 100 MiB limit */
    ck_assert_int_eq(mge_safetensors_decode(img, 16, &st, err, sizeof(err)), MGE_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, "header length"));
    ck_assert_ptr_null(st);
}
END_TEST

START_TEST(test_write_errors)
{
    struct mge_ckpt_tensor ts[5];
    char err[512], bad[200];
    int n = sample(ts);
    snprintf(bad, sizeof(bad), "%s/no/such/dir/w.safetensors", tmpdir);
    ck_assert_int_eq(mge_safetensors_write(bad, ts, n, NULL, err, sizeof(err)), MGE_IO);
    ck_assert_ptr_nonnull(strstr(err, bad));
    ts[1].name = "fc1.weight";
    ck_assert_int_eq(mge_safetensors_write(path, ts, n, NULL, err, sizeof(err)), MGE_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "twice"));
    n = sample(ts);
    ts[2].dtype = MGE_CKPT_F16;
    ck_assert_int_eq(mge_safetensors_write(path, ts, n, NULL, err, sizeof(err)), MGE_INVAL);
    ck_assert_ptr_nonnull(strstr(err, "'scale'"));
    ck_assert_int_eq(access(path, F_OK), -1);
}
END_TEST

START_TEST(test_read_errors)
{
    struct mge_safetensors *st;
    char err[512];
    FILE *fp;
    ck_assert_int_eq(mge_safetensors_read(path, &st, err, sizeof(err)), MGE_NOENT);
    ck_assert_ptr_nonnull(strstr(err, path));
    fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    fputs("MGECKPT1 this is not safetensors", fp);
    fclose(fp);
    ck_assert_int_eq(mge_safetensors_read(path, &st, err, sizeof(err)), MGE_FORMAT);
    ck_assert_ptr_nonnull(strstr(err, path));
    ck_assert_ptr_null(st);
}
END_TEST

/* Every allocation that can fail does so once: a clean MGE_NOMEM, nothing leaked. */
START_TEST(test_alloc_failures)
{
    struct mge_ckpt_tensor ts[5];
    struct mge_safetensors *st;
    char err[512];
    size_t len;
    int n = sample(ts), ok = 0;
    ck_assert_int_eq(mge_safetensors_write(path, ts, n, NULL, err, sizeof(err)), MGE_OK);
    uint8_t *img = slurp(path, &len);
    for (long k = 0; !ok && k < 64; k++) {
        mge_alloc_fail_after(k);
        int rc = mge_safetensors_decode(img, len, &st, err, sizeof(err));
        mge_alloc_fail_after(-1);
        ck_assert(rc == MGE_OK || rc == MGE_NOMEM);
        ok = rc == MGE_OK;
        if (ok)
            mge_safetensors_free(st);
        else
            ck_assert_ptr_null(st);
    }
    ck_assert(ok);
    free(img);
}
END_TEST

static Suite *safetensors_suite(void)
{
    Suite *s = suite_create("safetensors");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"round_trip", test_round_trip},       {"malformed", test_malformed},
        {"header_length", test_header_length}, {"write_errors", test_write_errors},
        {"read_errors", test_read_errors},     {"alloc_failures", test_alloc_failures},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int main(void)
{
    return mge_test_run(safetensors_suite());
}
