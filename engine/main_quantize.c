/*
 * main_quantize.c: mge-quantize, post-training calibration: runs a fp32 checkpoint's model on N
 * training batches with activation observers and writes a checkpoint that mge-infer --precision
 * int8 runs (the same tensors plus one "<layer>.act_observer" per GEMM/conv), for models that
 * were not trained with quant.mode qat.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/parse.h"
#include "engine/ckpt.h"
#include "engine/train.h"
#include "kernels/cpu/cpu.h"

static void usage(FILE *fp)
{
    fprintf(
        fp,
        "usage: mge-quantize CKPT --calibrate N [--out FILE] [--observer minmax|ema|percentile]\n"
        "                    [--threads N]\n"
        "Runs the model in CKPT on its first N training batches (train.batch_size samples\n"
        "each, in order, no augmentation) with activation observers (default: the spec's\n"
        "quant.observer, else minmax) and writes CKPT's tensors plus the observers to FILE\n"
        "(default: CKPT with .mgeckpt replaced by .calibrated.mgeckpt), ready for\n"
        "mge-infer FILE --precision int8.\n");
}

struct calib {
    const char *path, *out;
    int64_t batches;
    int observer; /* enum mge_quant_observer, or -1: the spec's */
};

/* Parameters and buffers of @g from @ck (observers excepted: they start empty); exit code. */
static int load_weights(struct mge_graph *g, const struct mge_ckpt *ck, const char *path)
{
    for (int i = 0; i < mge_graph_n_params(g); i++) {
        int v = mge_graph_param(g, i);
        const char *name = mge_value_name(g, v);
        const struct mge_ckpt_tensor *t = mge_ckpt_find(ck, name);
        size_t want = sizeof(float) * (size_t)mge_value_numel(g, v);
        if (mge_quant_is_observer(name))
            continue;
        if (!t || t->dtype != MGE_CKPT_F32 || t->nbytes != want) {
            fprintf(stderr, "mge-quantize: %s: parameter '%s' %s\n", path, name,
                    t ? "does not match the model" : "is missing");
            return 2;
        }
        memcpy(mge_value_data(g, v), t->data, want);
    }
    return 0;
}

/* Run @batches batches of @ds through @g in calibration mode. */
static int observe_batches(struct mge_graph *g, const struct mge_model *m,
                           const struct mge_dataset *ds, int64_t batch, int64_t batches)
{
    int rc = MGE_OK;
    float *x = mge_malloc_aligned(sizeof(float) * (size_t)(batch * ds->dim));
    int32_t *y = mge_malloc(sizeof(int32_t) * (size_t)batch);
    int64_t *idx = mge_malloc(sizeof(int64_t) * (size_t)batch);
    if (!x || !y || !idx) {
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate calibration buffers");
        goto out_free;
    }
    mge_graph_bind(g, m->x, x);
    mge_graph_bind(g, m->y, y);
    for (int64_t b = 0, at = 0; b < batches && at < ds->n; b++, at += batch) {
        int64_t n = ds->n - at < batch ? ds->n - at : batch;
        for (int64_t i = 0; i < n; i++)
            idx[i] = at + i;
        if ((rc = mge_dataset_gather(ds, idx, n, x, y)) != MGE_OK ||
            (rc = mge_graph_set_batch(g, n)) != MGE_OK ||
            (rc = mge_graph_run(g, MGE_RUN_INFER, 0)) != MGE_OK)
            goto out_free;
    }
out_free:
    mge_free_aligned(x);
    mge_free(y);
    mge_free(idx);
    return rc;
}

/* @ck's tensors (its old observers left out) and @g's observers, written to @c->out. */
static int write_calibrated(const struct calib *c, const struct mge_ckpt *ck, struct mge_graph *g)
{
    struct mge_ckpt out = *ck;
    char err[512];
    int n = 0, code = 1;
    struct mge_ckpt_tensor *ts =
        mge_calloc((size_t)(ck->n_tensors + mge_graph_n_params(g)), sizeof(*ts));
    if (!ts) {
        fprintf(stderr, "mge-quantize: out of memory\n");
        return 1;
    }
    for (int i = 0; i < ck->n_tensors; i++)
        if (!mge_quant_is_observer(ck->tensors[i].name))
            ts[n++] = ck->tensors[i];
    for (int i = 0; i < mge_graph_n_params(g); i++) {
        int v = mge_graph_param(g, i);
        if (!mge_quant_is_observer(mge_value_name(g, v)))
            continue;
        struct mge_ckpt_tensor *t = &ts[n++];
        t->name = mge_value_name(g, v);
        t->dtype = MGE_CKPT_F32;
        t->ndim = 1;
        t->shape[0] = mge_value_numel(g, v);
        t->data = mge_value_data(g, v);
        t->nbytes = sizeof(float) * (size_t)t->shape[0];
    }
    out.tensors = ts;
    out.n_tensors = n;
    out.priv = NULL;
    if (mge_ckpt_write(c->out, &out, err, sizeof(err)) != MGE_OK)
        fprintf(stderr, "mge-quantize: %s\n", err);
    else
        code = 0;
    mge_free(ts);
    return code;
}

static int calibrate(const struct calib *c)
{
    struct mge_ckpt *ck = NULL;
    struct mge_jobspec *spec = NULL;
    struct mge_spec_error serr;
    struct mge_dataset ds;
    struct mge_graph *g = NULL;
    struct mge_model model;
    struct mge_quant_opts qo;
    char err[512];
    int code = 2, have_ds = 0, rc;

    memset(&ds, 0, sizeof(ds));
    if ((rc = mge_ckpt_read(c->path, &ck, err, sizeof(err))) != MGE_OK) {
        fprintf(stderr, "mge-quantize: %s\n", err);
        goto out;
    }
    rc = mge_jobspec_parse(c->path, ck->spec_yaml ? ck->spec_yaml : "",
                           ck->spec_yaml ? strlen(ck->spec_yaml) : 0, NULL, 0, &spec, &serr);
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-quantize: spec in checkpoint: %s\n", serr.message);
        goto out;
    }
    if (spec->model.type == MGE_MODEL_GPT) {
        fprintf(stderr, "mge-quantize: %s: int8 calibration is for classifiers, not a gpt\n",
                c->path);
        goto out;
    }
    if ((rc = mge_data_load(spec, 0, &ds, err, sizeof(err))) != MGE_OK) {
        fprintf(stderr, "mge-quantize: %s\n", err);
        goto out;
    }
    have_ds = 1;
    code = 1;
    mge_quant_opts_from_spec(spec, MGE_QUANT_FAKE, &qo);
    qo.calibrate = 1;
    if (c->observer >= 0)
        qo.observer = (enum mge_quant_observer)c->observer;
    int64_t batch = spec->train.batch_size;
    if ((rc = mge_graph_new(&g)) != MGE_OK || (rc = mge_graph_set_quant(g, &qo)) != MGE_OK ||
        (rc = mge_model_build(g, spec, batch, ds.c, ds.h, ds.w, ds.classes, &model)) != MGE_OK ||
        (rc = mge_graph_plan(g, NULL)) != MGE_OK || (rc = mge_graph_alloc(g)) != MGE_OK) {
        fprintf(stderr, "mge-quantize: model: %s\n",
                g && mge_graph_error(g) ? mge_graph_error_msg(g) : mge_strerror(rc));
        goto out;
    }
    for (int i = 0; i < mge_graph_n_params(g); i++) /* observers start empty */
        memset(mge_value_data(g, mge_graph_param(g, i)), 0,
               sizeof(float) * (size_t)mge_value_numel(g, mge_graph_param(g, i)));
    if ((code = load_weights(g, ck, c->path)) != 0)
        goto out;
    if ((rc = observe_batches(g, &model, &ds, batch, c->batches)) != MGE_OK) {
        fprintf(stderr, "mge-quantize: calibration failed: %s\n", mge_strerror(rc));
        code = 1;
        goto out;
    }
    if ((code = write_calibrated(c, ck, g)) == 0)
        printf("%s: calibrated on %lld batches of %lld: %s\n", c->path, (long long)c->batches,
               (long long)batch, c->out);
out:
    mge_graph_free(g);
    if (have_ds)
        mge_dataset_fini(&ds);
    mge_jobspec_free(spec);
    mge_ckpt_free(ck);
    return code;
}

int main(int argc, char **argv)
{
    static const char *const observers[] = {"minmax", "ema", "percentile"};
    struct calib c = {.observer = -1};
    char outbuf[4096];
    int threads = 0;
    long long v;
    mge_alloc_keep_memory();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--calibrate") && has_val) {
            if (!mge_parse_int(argv[++i], 1, 1000000, &v)) {
                fprintf(stderr,
                        "mge-quantize: --calibrate: expected 1 to 1000000 batches, got "
                        "'%s'\n",
                        argv[i]);
                return 2;
            }
            c.batches = v;
        } else if (!strcmp(a, "--out") && has_val) {
            c.out = argv[++i];
        } else if (!strcmp(a, "--observer") && has_val) {
            const char *o = argv[++i];
            for (int k = 0; k < 3; k++)
                if (!strcmp(o, observers[k]))
                    c.observer = k;
            if (c.observer < 0) {
                fprintf(stderr,
                        "mge-quantize: --observer must be minmax, ema or percentile, not "
                        "'%s'\n",
                        o);
                return 2;
            }
        } else if (!strcmp(a, "--threads") && has_val) {
            if (!mge_parse_int(argv[++i], 1, 4096, &v)) {
                fprintf(stderr, "mge-quantize: --threads: expected 1 to 4096, got '%s'\n", argv[i]);
                return 2;
            }
            threads = (int)v;
        } else if (a[0] == '-' || c.path) {
            fprintf(stderr, "mge-quantize: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        } else {
            c.path = a;
        }
    }
    if (!c.path || !c.batches) {
        usage(stderr);
        return 2;
    }
    if (!c.out) {
        size_t n = strlen(c.path), s = strlen(".mgeckpt");
        if (n > s && !strcmp(c.path + n - s, ".mgeckpt"))
            n -= s;
        snprintf(outbuf, sizeof(outbuf), "%.*s.calibrated.mgeckpt", (int)n, c.path);
        c.out = outbuf;
    }
    mge_cpu_set_threads(threads);
    return calibrate(&c);
}
