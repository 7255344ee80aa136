/*
 * main_infer.c: mge-infer, evaluation of a checkpoint written by mge-train with the same engine
 * and kernels (no conversion step): the spec inside the checkpoint rebuilds the model.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "engine/ckpt.h"
#include "engine/train.h"
#include "kernels/cpu/cpu.h"

static void usage(FILE *fp)
{
    fprintf(fp, "usage: mge-infer CKPT [--data test|train] [--json] [--threads N]\n"
                "Evaluates the model in checkpoint CKPT on the test (default) or train set\n"
                "that the checkpoint's job spec names (a gpt: loss per token and perplexity\n"
                "over the held-out or training tokens).\n");
}

/* Copy every parameter and buffer of @g from checkpoint @ck; exit code 2 if one does not fit. */
static int load_params(struct mge_graph *g, const struct mge_ckpt *ck, const char *path)
{
    for (int i = 0; i < mge_graph_n_params(g); i++) {
        int v = mge_graph_param(g, i);
        const struct mge_ckpt_tensor *t = mge_ckpt_find(ck, mge_value_name(g, v));
        size_t want = sizeof(float) * (size_t)mge_value_numel(g, v);
        if (!t || t->dtype != MGE_CKPT_F32 || t->nbytes != want) {
            fprintf(stderr, "mge-infer: %s: parameter '%s' %s\n", path, mge_value_name(g, v),
                    t ? "does not match the model" : "is missing");
            return 2;
        }
        memcpy(mge_value_data(g, v), t->data, want);
    }
    return 0;
}

/* gpt: loss per token and perplexity over windows of the held-out (or training) tokens. */
static int infer_tokens(const char *path, const struct mge_ckpt *ck, const struct mge_jobspec *spec,
                        int test, int json)
{
    struct mge_tokens train, held;
    struct mge_graph *g = NULL;
    struct mge_model model;
    char err[512];
    int code = 2, rc;
    int64_t batch = spec->train.batch_size, T = spec->model.context, windows;
    double loss;
    if ((rc = mge_tokens_load_spec(spec, &train, &held, err, sizeof(err))) != MGE_OK) {
        fprintf(stderr, "mge-infer: %s\n", err);
        return 2;
    }
    const struct mge_tokens *tk = test ? &held : &train;
    if (tk->n == 0) {
        fprintf(stderr,
                "mge-infer: %s: the spec holds no test tokens (data.test_fraction 0, no "
                "data.test_file)\n",
                path);
        goto out;
    }
    code = 1;
    if ((rc = mge_graph_new(&g)) == MGE_OK &&
        (rc = mge_model_build(g, spec, batch, 0, 0, 0, 0, &model)) == MGE_OK &&
        (rc = mge_graph_plan(g, NULL)) == MGE_OK)
        rc = mge_graph_alloc(g);
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-infer: model: %s\n", g ? mge_graph_error_msg(g) : mge_strerror(rc));
        goto out;
    }
    if ((code = load_params(g, ck, path)) != 0)
        goto out;
    code = 1;
    if ((rc = mge_tokens_evaluate(g, &model, tk, batch, T, MGE_TOKENS_EVAL_WINDOWS, &loss,
                                  &windows)) != MGE_OK) {
        fprintf(stderr, "mge-infer: failed: %s\n", mge_strerror(rc));
        goto out;
    }
    if (json)
        printf("{\"loss\":%.6f,\"perplexity\":%.6f,\"tokens\":%lld,\"step\":%lld}\n", loss,
               exp(loss), (long long)(windows * T), (long long)ck->step);
    else
        printf("%s: %s tokens: loss %.4f nats/token, perplexity %.3f over %lld windows of %lld "
               "(step %lld)\n",
               path, test ? "held-out" : "training", loss, exp(loss), (long long)windows,
               (long long)T, (long long)ck->step);
    code = 0;
out:
    mge_graph_free(g);
    mge_tokens_fini(&held);
    mge_tokens_fini(&train);
    return code;
}

static int infer(const char *path, int test, int json)
{
    struct mge_ckpt *ck = NULL;
    struct mge_jobspec *spec = NULL;
    struct mge_spec_error serr;
    struct mge_dataset ds;
    struct mge_graph *g = NULL;
    struct mge_model model;
    char err[512];
    int code = 2, have_ds = 0, rc;
    double loss, acc;

    memset(&ds, 0, sizeof(ds));
    if ((rc = mge_ckpt_read(path, &ck, err, sizeof(err))) != MGE_OK) {
        fprintf(stderr, "mge-infer: %s\n", err);
        goto out;
    }
    if (!ck->spec_yaml || !ck->spec_yaml[0]) {
        fprintf(stderr, "mge-infer: %s: checkpoint holds no job spec\n", path);
        goto out;
    }
    rc = mge_jobspec_parse(path, ck->spec_yaml, strlen(ck->spec_yaml), NULL, 0, &spec, &serr);
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-infer: spec in checkpoint: %s\n", serr.message);
        goto out;
    }
    if (spec->model.type == MGE_MODEL_GPT) {
        code = infer_tokens(path, ck, spec, test, json);
        goto out;
    }
    if ((rc = mge_data_load(spec, test, &ds, err, sizeof(err))) != MGE_OK) {
        fprintf(stderr, "mge-infer: %s\n", err);
        goto out;
    }
    have_ds = 1;
    code = 1;
    int64_t batch = spec->train.batch_size;
    if ((rc = mge_graph_new(&g)) != MGE_OK)
        goto out;
    rc = mge_model_build(g, spec, batch, ds.c, ds.h, ds.w, ds.classes, &model);
    if (rc == MGE_OK)
        rc = mge_graph_plan(g, NULL);
    if (rc == MGE_OK)
        rc = mge_graph_alloc(g);
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-infer: model: %s\n", mge_graph_error_msg(g));
        goto out;
    }
    if ((code = load_params(g, ck, path)) != 0)
        goto out;
    code = 1;
    if ((rc = mge_evaluate(g, &model, &ds, batch, &loss, &acc)) != MGE_OK)
        goto out;
    if (json)
        printf("{\"accuracy\":%.6f,\"loss\":%.6f,\"samples\":%lld,\"step\":%lld}\n", acc, loss,
               (long long)ds.n, (long long)ck->step);
    else
        printf("%s: %s set: accuracy %.2f%% (%.6f), loss %.4f over %lld samples (step %lld)\n",
               path, test ? "test" : "train", 100.0 * acc, acc, loss, (long long)ds.n,
               (long long)ck->step);
    code = 0;
out:
    if (code == 1)
        fprintf(stderr, "mge-infer: failed: %s\n", mge_strerror(rc));
    mge_graph_free(g);
    if (have_ds)
        mge_dataset_fini(&ds);
    mge_jobspec_free(spec);
    mge_ckpt_free(ck);
    return code;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    int test = 1, json = 0, threads = 0;
    mge_alloc_keep_memory();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc) {
            const char *d = argv[++i];
            if (strcmp(d, "test") && strcmp(d, "train")) {
                fprintf(stderr, "mge-infer: --data must be 'test' or 'train', not '%s'\n", d);
                return 2;
            }
            test = !strcmp(d, "test");
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "mge-infer: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    mge_cpu_set_threads(threads);
    return infer(path, test, json);
}
