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
#include "common/rng.h"
#include "engine/ckpt.h"
#include "engine/device.h"
#include "engine/train.h"
#include "kernels/cpu/cpu.h"

static void usage(FILE *fp)
{
    fprintf(fp,
            "usage: mge-infer CKPT [--data test|train] [--json] [--threads N]\n"
            "                 [--device cpu|sim|cuda] [--precision fp32|fakequant|int8\n"
            "                 [--compare]] [--timing] [--split auto|on|off]\n"
            "                 [--predictions FILE]\n"
            "       mge-infer CKPT --generate N [--prompt TEXT] [--seed S] [--temperature T]\n"
            "Evaluates the model in checkpoint CKPT on the test (default) or train set\n"
            "that the checkpoint's job spec names (a gpt: loss per token and perplexity\n"
            "over the held-out or training tokens). --generate samples N tokens from a gpt\n"
            "after the prompt (text: its bytes; default a newline), temperature 1, seed 1337.\n"
            "--precision: fp32 (default) ignores quantisation; fakequant runs the graph QAT\n"
            "trained (fp32 ops on fake-quantised values); int8 runs int8 GEMMs and convs with\n"
            "the checkpoint's observers and weights, no conversion step. --compare (int8)\n"
            "also runs fakequant and reports the share of samples whose predictions agree.\n"
            "--timing adds samples_per_sec (graph runs only, not data loading) and graphs to\n"
            "--json. --split on: each of the N --threads runs its own copy of the graph on\n"
            "its share of every batch, single-threaded inside (the same predictions and loss);\n"
            "off: one graph, each op using all N threads; auto (default): on for the CPU\n"
            "device. --predictions FILE writes each sample's predicted class, one per line.\n");
}

/*
 * Copy every parameter and buffer of @g from checkpoint @ck; exit code 2 if one does not fit,
 * or if an activation observer (quantised graphs) is missing, corrupt or never observed.
 */
static int load_params(struct mge_graph *g, const struct mge_ckpt *ck, const char *path)
{
    for (int i = 0; i < mge_graph_n_params(g); i++) {
        int v = mge_graph_param(g, i);
        const char *name = mge_value_name(g, v);
        const struct mge_ckpt_tensor *t = mge_ckpt_find(ck, name);
        size_t want = sizeof(float) * (size_t)mge_value_numel(g, v);
        char why[256];
        if (!t && mge_quant_is_observer(name)) {
            fprintf(stderr,
                    "mge-infer: %s: quantisation field '%s' is missing: the checkpoint was not "
                    "trained with quant.mode qat (calibrate it with mge-quantize --calibrate)\n",
                    path, name);
            return 2;
        }
        if (!t || t->dtype != MGE_CKPT_F32 || t->nbytes != want) {
            fprintf(stderr, "mge-infer: %s: %s '%s' %s\n", path,
                    mge_quant_is_observer(name) ? "quantisation field" : "parameter", name,
                    t ? "does not match the model" : "is missing");
            return 2;
        }
        if (mge_quant_is_observer(name)) {
            /* checked on a host copy: the value may live on a device */
            float ob[MGE_QUANT_OBSERVER_LEN];
            memcpy(ob, t->data, sizeof(ob) < want ? sizeof(ob) : want);
            if (mge_quant_observer_check(ob, mge_value_numel(g, v), 1, why, sizeof(why))) {
                fprintf(stderr, "mge-infer: %s: quantisation field '%s': %s\n", path, name, why);
                return 2;
            }
        }
        if (mge_value_write(g, v, t->data, want) != MGE_OK)
            return 1;
    }
    return 0;
}

/* --device: where the graphs' arenas live (the CPU unless given). */
static const struct mge_device *infer_dev = &mge_device_cpu;

/* Plan @g and allocate its arenas on infer_dev. */
static int plan_alloc(struct mge_graph *g)
{
    int rc = mge_graph_plan(g, NULL);
    if (rc == MGE_OK)
        rc = mge_graph_set_device(g, infer_dev);
    return rc == MGE_OK ? mge_graph_alloc(g) : rc;
}

/* --split: -1 auto (on where it wins: the CPU device with more than one thread), 0 off, 1 on */
static int infer_split = -1;

/*
 * Graphs to split a batch across: one per thread on the CPU device, else one (no split).
 * NEEDSWORK: with MGE_CONV=dnnl (not the default) copies of one conv share its oneDNN primitive
 * (conv_dnnl.c caches one per geometry, under a lock), so they take turns there.
 */
static int split_count(int64_t batch)
{
    int n = mge_cpu_threads();
    if (infer_split == 0 || infer_dev != &mge_device_cpu || n <= 1)
        return 1;
    return n < batch ? n : (int)batch;
}

/* Build @spec's model quantised as @mode for batches of @batch (images shaped as @ds's; NULL
 * for a gpt) into a new *@gp (freed by the caller, also on error) and load @ck into it; an exit
 * code. */
static int build_as(const char *path, const struct mge_ckpt *ck, const struct mge_jobspec *spec,
                    const struct mge_dataset *ds, enum mge_quant_mode mode, int64_t batch,
                    struct mge_graph **gp, struct mge_model *model)
{
    struct mge_quant_opts qo;
    int rc = mge_graph_new(gp);
    mge_quant_opts_from_spec(spec, mode, &qo);
    if (rc == MGE_OK && mode != MGE_QUANT_OFF)
        rc = mge_graph_set_quant(*gp, &qo);
    if (rc == MGE_OK)
        rc = ds ? mge_model_build(*gp, spec, batch, ds->c, ds->h, ds->w, ds->classes, model)
                : mge_model_build(*gp, spec, batch, 0, 0, 0, 0, model);
    if (rc == MGE_OK)
        rc = plan_alloc(*gp);
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-infer: model: %s\n",
                *gp ? mge_graph_error_msg(*gp) : mge_strerror(rc));
        return 1;
    }
    return load_params(*gp, ck, path);
}

/* The graphs an evaluation runs: one, or one per thread with the batch split across them. */
struct graphs {
    int n;                /* graphs */
    int64_t sub;          /* the batch each is built for: ceil(batch / n) */
    struct mge_graph **g; /* (n) */
    struct mge_model *m;  /* (n) */
};

/* build_as() for each of split_count(@batch) graphs into @gs (graphs_free() it, also on
 * error), each for its share of @batch and, when split, planned single-threaded; an exit code. */
static int graphs_build(struct graphs *gs, const char *path, const struct mge_ckpt *ck,
                        const struct mge_jobspec *spec, const struct mge_dataset *ds,
                        enum mge_quant_mode mode, int64_t batch)
{
    int code = 0;
    gs->n = split_count(batch);
    gs->sub = (batch + gs->n - 1) / gs->n;
    gs->g = mge_calloc((size_t)gs->n, sizeof(*gs->g));
    gs->m = mge_calloc((size_t)gs->n, sizeof(*gs->m));
    if (!gs->g || !gs->m) {
        fprintf(stderr, "mge-infer: out of memory\n");
        return 1;
    }
    /* kernels size their teams and per-thread scratch when the graph is planned */
    if (gs->n > 1)
        mge_cpu_set_local_threads(1);
    for (int t = 0; t < gs->n && code == 0; t++)
        code = build_as(path, ck, spec, ds, mode, gs->sub, &gs->g[t], &gs->m[t]);
    if (gs->n > 1)
        mge_cpu_set_local_threads(0);
    return code;
}

static void graphs_free(struct graphs *gs)
{
    for (int t = 0; gs->g && t < gs->n; t++)
        mge_graph_free(gs->g[t]);
    mge_free(gs->g);
    mge_free(gs->m);
}

struct gen_opts {
    int64_t n;          /* tokens to sample */
    const char *prompt; /* text format: its bytes start the sequence (NULL: a newline) */
    uint64_t seed;
    double temperature; /* > 0 */
};

/*
 * --generate: sample @o->n tokens after the prompt, each from softmax(logits / temperature) of
 * the model on the last (at most) context tokens, as nanoGPT's sample.py does; text goes to
 * stdout as bytes, token ids as numbers. The same seed samples the same text.
 */
static int generate(const char *path, const struct mge_ckpt *ck, const struct mge_jobspec *spec,
                    const struct gen_opts *o)
{
    struct mge_graph *g = NULL;
    struct mge_model model;
    struct mge_rng rng;
    int64_t T = spec->model.context, V = spec->model.vocab;
    int text = spec->data.format == MGE_DATA_TEXT;
    const char *prompt = o->prompt ? o->prompt : "\n";
    int64_t np = text ? (int64_t)strlen(prompt) : 1, len = 0;
    int32_t *seq = mge_malloc(sizeof(int32_t) * (size_t)(np + o->n + 1));
    int32_t *x = mge_calloc((size_t)T, sizeof(int32_t)),
            *y = mge_calloc((size_t)T, sizeof(int32_t));
    double *p = mge_malloc(sizeof(double) * (size_t)V);
    float *logits = mge_malloc(sizeof(float) * (size_t)(T * V)); /* a device's, copied */
    int code = 1, rc = MGE_OK;
    if (!seq || !x || !y || !p || !logits) {
        fprintf(stderr, "mge-infer: out of memory\n");
        goto out;
    }
    if (!text && o->prompt) {
        fprintf(stderr, "mge-infer: --prompt: only for data.format text (a gpt on bytes)\n");
        code = 2;
        goto out;
    }
    for (int64_t i = 0; i < np; i++)
        seq[len++] = text ? (int32_t)(unsigned char)prompt[i] : 0;
    if ((code = build_as(path, ck, spec, NULL, MGE_QUANT_OFF, 1, &g, &model)) != 0)
        goto out;
    code = 1;
    mge_graph_bind(g, model.x, x);
    mge_graph_bind(g, model.y, y);
    mge_rng_seed(&rng, o->seed);
    for (int64_t k = 0; k < o->n; k++) {
        int64_t n = len < T ? len : T;
        memcpy(x, seq + len - n, sizeof(int32_t) * (size_t)n);
        if ((rc = mge_graph_run(g, MGE_RUN_INFER, 0)) != MGE_OK) {
            fprintf(stderr, "mge-infer: failed: %s\n", mge_strerror(rc));
            goto out;
        }
        const float *l = mge_value_host(g, model.logits, logits, sizeof(float) * (size_t)(n * V));
        if (!l) {
            rc = MGE_STATE;
            fprintf(stderr, "mge-infer: failed: cannot read the logits\n");
            goto out;
        }
        l += (n - 1) * V;
        double mx = l[0], sum = 0.0, u;
        for (int64_t v = 1; v < V; v++)
            mx = l[v] > mx ? l[v] : mx;
        for (int64_t v = 0; v < V; v++)
            sum += p[v] = exp(((double)l[v] - mx) / o->temperature);
        u = (double)mge_rng_float(&rng) * sum;
        int64_t pick = V - 1;
        for (int64_t v = 0; v < V; v++)
            if ((u -= p[v]) < 0.0) {
                pick = v;
                break;
            }
        seq[len++] = (int32_t)pick;
    }
    for (int64_t i = 0; i < len; i++) {
        if (text)
            putchar(seq[i]);
        else
            printf("%s%d", i ? " " : "", seq[i]);
    }
    if (!text)
        putchar('\n');
    fflush(stdout);
    code = 0;
out:
    mge_graph_free(g);
    mge_free(seq);
    mge_free(x);
    mge_free(y);
    mge_free(p);
    mge_free(logits);
    return code;
}

/* gpt: loss per token and perplexity over windows of the held-out (or training) tokens. */
static int infer_tokens(const char *path, const struct mge_ckpt *ck, const struct mge_jobspec *spec,
                        int test, int json)
{
    struct mge_tokens train, held;
    struct graphs gs = {0};
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
    if ((code = graphs_build(&gs, path, ck, spec, NULL, MGE_QUANT_OFF, batch)) != 0)
        goto out;
    code = 1;
    rc = gs.n > 1 ? mge_tokens_evaluate_split(gs.g, gs.m, gs.n, tk, gs.sub, T,
                                              MGE_TOKENS_EVAL_WINDOWS, &loss, &windows)
                  : mge_tokens_evaluate(gs.g[0], gs.m, tk, batch, T, MGE_TOKENS_EVAL_WINDOWS, &loss,
                                        &windows);
    if (rc != MGE_OK) {
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
    graphs_free(&gs);
    mge_tokens_fini(&held);
    mge_tokens_fini(&train);
    return code;
}

struct eval_result {
    double loss, acc;
    double run_sec; /* in mge_graph_run() */
    int graphs;     /* run at once, the batch split across them (1: no split) */
    int32_t *pred;  /* (ds->n) predicted classes, or NULL */
};

/*
 * Build @spec's model quantised as @mode, load @ck and evaluate it on @ds; an exit code. With
 * the split (split_count() > 1) there is one graph per thread, each for its share of the batch
 * and planned single-threaded, run at once by mge_evaluate_split().
 */
static int eval_as(const char *path, const struct mge_ckpt *ck, const struct mge_jobspec *spec,
                   const struct mge_dataset *ds, enum mge_quant_mode mode, struct eval_result *r)
{
    int64_t batch = spec->train.batch_size;
    struct graphs gs = {0};
    int code = graphs_build(&gs, path, ck, spec, ds, mode, batch), rc;
    if (code != 0)
        goto out;
    r->run_sec = 0.0;
    r->graphs = gs.n;
    if (gs.n > 1)
        rc = mge_evaluate_split(gs.g, gs.m, gs.n, ds, batch, gs.sub,
                                (float)spec->train.label_smoothing, &r->loss, &r->acc, r->pred,
                                &r->run_sec);
    else
        rc = mge_evaluate_preds(gs.g[0], gs.m, ds, batch, &r->loss, &r->acc, r->pred, &r->run_sec);
    code = rc == MGE_OK ? 0 : 1;
    if (rc != MGE_OK)
        fprintf(stderr, "mge-infer: failed: %s\n", mge_strerror(rc));
out:
    graphs_free(&gs);
    return code;
}

static const char *const precision_names[] = {"fp32", "fakequant", "int8"};

/* --predictions: write @pred's @n classes to @file, one per line; an exit code. */
static int write_predictions(const char *file, const int32_t *pred, int64_t n)
{
    FILE *fp = fopen(file, "w");
    int bad = !fp;
    for (int64_t i = 0; fp && i < n; i++)
        bad |= fprintf(fp, "%d\n", pred[i]) < 0;
    if (fp && fclose(fp) != 0)
        bad = 1;
    if (bad)
        fprintf(stderr, "mge-infer: --predictions: cannot write '%s'\n", file);
    return bad;
}

static int infer(const char *path, int test, int json, const struct gen_opts *gen,
                 enum mge_quant_mode prec, int compare, int timing, const char *preds_path)
{
    struct mge_ckpt *ck = NULL;
    struct mge_jobspec *spec = NULL;
    struct mge_spec_error serr;
    struct mge_dataset ds;
    struct eval_result r = {0}, ref = {0};
    int64_t agree = 0;
    char err[512];
    int code = 2, have_ds = 0, rc;

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
    if (gen && !mge_model_reads_tokens(&spec->model)) {
        fprintf(stderr, "mge-infer: %s: --generate needs a gpt checkpoint, this is a %s\n", path,
                mge_model_type_name(spec->model.type));
        goto out;
    }
    if (mge_model_reads_tokens(&spec->model)) {
        if (prec != MGE_QUANT_OFF) {
            fprintf(stderr, "mge-infer: --precision %s: only for classifiers, not a gpt\n",
                    precision_names[prec]);
            goto out;
        }
        if (preds_path) {
            fprintf(stderr, "mge-infer: --predictions: only for classifiers, not a gpt\n");
            goto out;
        }
        code = gen ? generate(path, ck, spec, gen) : infer_tokens(path, ck, spec, test, json);
        goto out;
    }
    if ((rc = mge_data_load(spec, test, &ds, err, sizeof(err))) != MGE_OK) {
        fprintf(stderr, "mge-infer: %s\n", err);
        goto out;
    }
    have_ds = 1;
    if (((compare || preds_path) && !(r.pred = mge_malloc(sizeof(int32_t) * (size_t)ds.n))) ||
        (compare && !(ref.pred = mge_malloc(sizeof(int32_t) * (size_t)ds.n)))) {
        fprintf(stderr, "mge-infer: out of memory\n");
        code = 1;
        goto out;
    }
    if ((code = eval_as(path, ck, spec, &ds, prec, &r)) != 0)
        goto out;
    if (compare && (code = eval_as(path, ck, spec, &ds, MGE_QUANT_FAKE, &ref)) != 0)
        goto out;
    for (int64_t i = 0; compare && i < ds.n; i++)
        agree += r.pred[i] == ref.pred[i];
    if (preds_path && (code = write_predictions(preds_path, r.pred, ds.n)) != 0)
        goto out;
    double sps = r.run_sec > 0.0 ? (double)ds.n / r.run_sec : 0.0;
    if (json) {
        printf("{\"accuracy\":%.6f,\"%s\":%.6f,\"loss\":%.6f,\"samples\":%lld,\"step\":%lld,"
               "\"precision\":\"%s\"",
               r.acc, test ? "test_accuracy" : "train_accuracy", r.acc, r.loss, (long long)ds.n,
               (long long)ck->step, precision_names[prec]);
        if (timing) /* not by default: the same checkpoint prints the same line */
            printf(",\"samples_per_sec\":%.1f,\"graphs\":%d", sps, r.graphs);
        if (compare)
            printf(",\"fakequant_accuracy\":%.6f,\"agreement\":%.6f,\"disagree\":%lld", ref.acc,
                   (double)agree / (double)ds.n, (long long)(ds.n - agree));
        printf("}\n");
    } else {
        printf("%s: %s set: accuracy %.2f%% (%.6f), loss %.4f over %lld samples (step %lld)%s%s\n",
               path, test ? "test" : "train", 100.0 * r.acc, r.acc, r.loss, (long long)ds.n,
               (long long)ck->step, prec != MGE_QUANT_OFF ? ", " : "",
               prec != MGE_QUANT_OFF ? precision_names[prec] : "");
        if (compare)
            printf("fakequant graph: accuracy %.2f%%; predictions agree on %lld of %lld "
                   "samples (%.3f%%)\n",
                   100.0 * ref.acc, (long long)agree, (long long)ds.n,
                   100.0 * (double)agree / (double)ds.n);
    }
    code = 0;
out:
    mge_free(r.pred);
    mge_free(ref.pred);
    if (have_ds)
        mge_dataset_fini(&ds);
    mge_jobspec_free(spec);
    mge_ckpt_free(ck);
    return code;
}

int main(int argc, char **argv)
{
    const char *path = NULL, *preds_path = NULL;
    int test = 1, json = 0, threads = 0, compare = 0, timing = 0;
    enum mge_quant_mode prec = MGE_QUANT_OFF;
    struct gen_opts gen = {.n = 0, .prompt = NULL, .seed = 1337, .temperature = 1.0};
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
        } else if (!strcmp(argv[i], "--compare")) {
            compare = 1;
        } else if (!strcmp(argv[i], "--timing")) {
            timing = 1;
        } else if (!strcmp(argv[i], "--precision") && i + 1 < argc) {
            const char *p = argv[++i];
            int k = 0;
            while (k < 3 && strcmp(p, precision_names[k]))
                k++;
            if (k == 3) {
                fprintf(stderr,
                        "mge-infer: --precision must be fp32, fakequant or int8, not "
                        "'%s'\n",
                        p);
                return 2;
            }
            prec = (enum mge_quant_mode)k;
        } else if (!strcmp(argv[i], "--generate") && i + 1 < argc) {
            char *end;
            gen.n = strtoll(argv[++i], &end, 10);
            if (*end || gen.n < 1 || gen.n > 1000000) {
                fprintf(stderr, "mge-infer: --generate: expected 1 to 1000000 tokens, got '%s'\n",
                        argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) {
            gen.prompt = argv[++i];
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            gen.seed = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--temperature") && i + 1 < argc) {
            char *end;
            gen.temperature = strtod(argv[++i], &end);
            if (*end || !(gen.temperature > 0.0 && gen.temperature <= 100.0)) {
                fprintf(stderr,
                        "mge-infer: --temperature: expected a number in (0, 100], got "
                        "'%s'\n",
                        argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--split") && i + 1 < argc) {
            const char *v = argv[++i];
            if (strcmp(v, "auto") && strcmp(v, "on") && strcmp(v, "off")) {
                fprintf(stderr, "mge-infer: --split must be auto, on or off, not '%s'\n", v);
                return 2;
            }
            infer_split = !strcmp(v, "auto") ? -1 : !strcmp(v, "on");
        } else if (!strcmp(argv[i], "--predictions") && i + 1 < argc) {
            preds_path = argv[++i];
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            char err[256];
            if (!(infer_dev = mge_device_find(argv[++i]))) {
                fprintf(stderr,
                        "mge-infer: --device: expected cpu, sim or cuda (cuda in builds with "
                        "nvcc), got '%s'\n",
                        argv[i]);
                return 2;
            }
            if (infer_dev->probe && infer_dev->probe(err, sizeof(err)) != MGE_OK) {
                fprintf(stderr, "mge-infer: --device %s: %s\n", argv[i], err);
                return 2;
            }
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
    if (gen.prompt && !gen.n) {
        fprintf(stderr, "mge-infer: --prompt goes with --generate N\n");
        return 2;
    }
    if (infer_split == 1 && infer_dev != &mge_device_cpu) {
        fprintf(stderr, "mge-infer: --split on: only for --device cpu\n");
        return 2;
    }
    if (compare && prec != MGE_QUANT_INT8) {
        fprintf(stderr, "mge-infer: --compare goes with --precision int8\n");
        return 2;
    }
    return infer(path, test, json, gen.n ? &gen : NULL, prec, compare, timing, preds_path);
}
