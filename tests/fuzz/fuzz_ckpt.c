/*
 * fuzz_ckpt.c: libFuzzer target for checkpoint decoding (engine/ckpt.c).
 * Each input is tried as a whole file image (header, CRC, payload) and, past the CRC, as a
 * bare protobuf payload (bytes after the 24-byte header), so mutations reach the protobuf
 * decoder and the validator. A checkpoint that decodes must re-encode and decode to the same,
 * and its quantisation fields (activation observers) go through their checks.
 * Seeds: tests/fuzz/corpus/ckpt/ (made by tests/fuzz/gen_ckpt_seeds.c).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/ckpt.h"
#include "engine/engine.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

/* Read every byte the checkpoint claims to have, and check it round-trips. */
static void exercise(const struct mge_ckpt *ck)
{
    struct mge_ckpt *again;
    char err[256];
    void *img;
    size_t len;
    unsigned sum = 0;
    for (int i = 0; i < ck->n_tensors; i++) {
        const struct mge_ckpt_tensor *t = &ck->tensors[i];
        for (size_t k = 0; k < t->nbytes; k++)
            sum += ((const uint8_t *)t->data)[k];
        check(mge_ckpt_find(ck, t->name) == t);
        if (mge_quant_is_observer(t->name) && t->dtype == MGE_CKPT_F32 && t->nbytes <= 64 &&
            t->nbytes > 0) {
            /* quantisation fields: what mge-infer and mge-train check before use */
            float v[16];
            char why[256];
            memcpy(v, t->data, t->nbytes);
            int rc = mge_quant_observer_check(v, (int64_t)(t->nbytes / 4), 1, why, sizeof(why));
            check(rc == MGE_OK || (rc == MGE_CORRUPT && why[0]));
        }
    }
    (void)sum;
    check(mge_ckpt_encode(ck, &img, &len, err, sizeof(err)) == MGE_OK);
    check(mge_ckpt_decode(img, len, &again, err, sizeof(err)) == MGE_OK);
    check(again->n_tensors == ck->n_tensors && again->step == ck->step &&
          again->n_rng == ck->n_rng && strcmp(again->spec_yaml, ck->spec_yaml) == 0);
    for (int i = 0; i < ck->n_tensors; i++)
        check(again->tensors[i].nbytes == ck->tensors[i].nbytes &&
              (ck->tensors[i].nbytes == 0 ||
               memcmp(again->tensors[i].data, ck->tensors[i].data, ck->tensors[i].nbytes) == 0));
    mge_ckpt_free(again);
    mge_free(img);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct mge_ckpt *ck;
    char err[256];
    mge_log_set_level(MGE_LOG_OFF);
    if (mge_ckpt_decode(data, size, &ck, err, sizeof(err)) == MGE_OK) {
        exercise(ck);
        mge_ckpt_free(ck);
    } else {
        check(ck == NULL && err[0] != '\0');
    }
    if (size >= MGE_CKPT_HEADER_SIZE) {
        if (mge_ckpt_decode_payload(data + MGE_CKPT_HEADER_SIZE, size - MGE_CKPT_HEADER_SIZE, &ck,
                                    err, sizeof(err)) == MGE_OK) {
            exercise(ck);
            mge_ckpt_free(ck);
        } else {
            check(ck == NULL && err[0] != '\0');
        }
    }
    return 0;
}
