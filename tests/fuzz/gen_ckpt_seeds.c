/*
 * gen_ckpt_seeds.c: writes the seed corpus of fuzz_ckpt (small valid checkpoints) into a
 * directory. Build and run by hand when the format changes:
 *   cc -std=c11 -D_GNU_SOURCE -I. -Ibuild/gen tests/fuzz/gen_ckpt_seeds.c engine/ckpt.c \
 *      common/alloc.c common/err.c common/log.c build/gen/proto/checkpoint.pb-c.c \
 *      -lprotobuf-c -lz -lpthread -o build/gen_ckpt_seeds
 *   build/gen_ckpt_seeds tests/fuzz/corpus/ckpt
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "engine/ckpt.h"

static int put(const char *dir, const char *name, const struct mge_ckpt *ck)
{
    char path[512], err[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (mge_ckpt_write(path, ck, err, sizeof(err)) != MGE_OK) {
        fprintf(stderr, "gen_ckpt_seeds: %s\n", err);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    float w[2 * 3] = {1, -2, 0.5f, 0, 3, 4}, b[3] = {0.1f, 0.2f, 0.3f};
    float m[2 * 3] = {0}, v[2 * 3] = {1e-8f, 0, 0, 0, 0, 1};
    int64_t counter = 7;
    uint16_t half[4] = {0x3c00, 0xbc00, 0, 0x7c00};
    struct mge_ckpt_tensor mlp[] = {
        {"fc1.w", MGE_CKPT_F32, 2, {2, 3}, w, sizeof(w)},
        {"fc1.b", MGE_CKPT_F32, 1, {3}, b, sizeof(b)},
        {"optim.m.fc1.w", MGE_CKPT_F32, 2, {2, 3}, m, sizeof(m)},
        {"optim.v.fc1.w", MGE_CKPT_F32, 2, {2, 3}, v, sizeof(v)},
    };
    struct mge_ckpt_tensor misc[] = {
        {"counter", MGE_CKPT_I64, 0, {0}, &counter, sizeof(counter)},
        {"half", MGE_CKPT_F16, 4, {1, 2, 1, 2}, half, sizeof(half)},
        {"empty", MGE_CKPT_U8, 6, {1, 1, 1, 1, 0, 3}, NULL, 0},
    };
    /* quant.mode qat: an activation observer (low, high, count, 0) beside the weights */
    float obs[4] = {-0.25f, 4.5f, 469, 0};
    struct mge_ckpt_tensor qat[] = {
        {"fc1.w", MGE_CKPT_F32, 2, {2, 3}, w, sizeof(w)},
        {"fc1.b", MGE_CKPT_F32, 1, {3}, b, sizeof(b)},
        {"fc1.act_observer", MGE_CKPT_F32, 1, {4}, obs, sizeof(obs)},
    };
    struct mge_ckpt a = {0}, c = {0}, e = {0}, q = {0};
    int rc = 0;
    if (argc != 2) {
        fprintf(stderr, "usage: gen_ckpt_seeds DIR\n");
        return 2;
    }
    a.step = 100;
    a.epoch = 1;
    a.sampler_pos = 3200;
    a.optim_step = 100;
    a.optim_type = MGE_CKPT_OPTIM_ADAM;
    a.rng[0] = 0x9e3779b97f4a7c15ULL;
    a.rng[1] = 42;
    a.n_rng = 2;
    a.spec_yaml = "name: seed\nmodel: {type: mlp, hidden: [3]}\ntrain: {batch_size: 32}\n";
    a.last_loss = 0.6931;
    a.test_accuracy = 0.5;
    a.tensors = mlp;
    a.n_tensors = 4;
    c.optim_type = MGE_CKPT_OPTIM_SGD;
    c.rng[0] = 1;
    c.rng[1] = 2;
    c.rng[2] = 3;
    c.rng[3] = 4;
    c.n_rng = 4;
    c.test_accuracy = NAN;
    c.tensors = misc;
    c.n_tensors = 3;
    q.spec_yaml = "name: seed\nmodel: {type: mlp, hidden: [3]}\nquant: {mode: qat}\n";
    q.test_accuracy = 0.75;
    q.tensors = qat;
    q.n_tensors = 3;
    rc |= put(argv[1], "qat_observer.ckpt", &q);
    rc |= put(argv[1], "mlp_adam.ckpt", &a);
    rc |= put(argv[1], "misc_dtypes.ckpt", &c);
    rc |= put(argv[1], "empty.ckpt", &e);
    return rc;
}
