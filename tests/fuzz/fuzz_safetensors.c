/*
 * fuzz_safetensors.c: libFuzzer target for the safetensors reader (engine/safetensors.c), which
 * mge-train --init-from runs on files from anywhere. A file that decodes must have every
 * tensor's bytes readable and must write and read back to the same tensors.
 * Seeds: tests/fuzz/corpus/safetensors/ (small files as mge-export writes them, by hand).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok)
{
    if (!ok)
        abort();
}

static void exercise(const struct mge_safetensors *st)
{
    struct mge_safetensors *again;
    char err[256], path[64];
    unsigned sum = 0;
    for (int i = 0; i < st->n_tensors; i++) {
        const struct mge_ckpt_tensor *t = &st->tensors[i];
        for (size_t k = 0; k < t->nbytes; k++)
            sum += ((const uint8_t *)t->data)[k];
        check((t->dtype == MGE_CKPT_F32 || t->dtype == MGE_CKPT_I64) &&
              t->ndim <= MGE_CKPT_MAX_DIMS);
        check(mge_safetensors_find(st, t->name) == t);
    }
    (void)sum;
    snprintf(path, sizeof(path), "/tmp/fuzz-safetensors.%ld", (long)getpid());
    check(mge_safetensors_write(path, st->tensors, st->n_tensors, NULL, err, sizeof(err)) ==
          MGE_OK);
    check(mge_safetensors_read(path, &again, err, sizeof(err)) == MGE_OK);
    unlink(path);
    check(again->n_tensors == st->n_tensors);
    for (int i = 0; i < st->n_tensors; i++) {
        const struct mge_ckpt_tensor *t = mge_safetensors_find(again, st->tensors[i].name);
        check(t && t->nbytes == st->tensors[i].nbytes && t->ndim == st->tensors[i].ndim);
        check(t->nbytes == 0 || memcmp(t->data, st->tensors[i].data, t->nbytes) == 0);
    }
    mge_safetensors_free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct mge_safetensors *st;
    char err[256];
    mge_log_set_level(MGE_LOG_OFF);
    if (mge_safetensors_decode(data, size, &st, err, sizeof(err)) == MGE_OK) {
        exercise(st);
        mge_safetensors_free(st);
    } else {
        check(st == NULL && err[0] != '\0');
    }
    return 0;
}
