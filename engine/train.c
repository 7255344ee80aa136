/*
 * train.c: one training rank: the spec is validated, the data loaded, the model built,
 * differentiated and planned, then the loop runs (gather, forward, backward, update), with
 * evaluation per epoch, checkpoints, and JSON metric lines that the worker daemon relays.
 */
#include "engine/train.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/ckpt.h"
#include "engine/comm/comm.h"
#include "engine/device.h"
#include "engine/engine_int.h"
#include "engine/optim.h"
#include "engine/safetensors.h"
#include "engine/trace.h"
#include "kernels/cpu/cpu.h"

static double now_sec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU time of the calling thread in seconds: the work of a step, whatever else the cores run. */
static double thread_cpu_sec(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A field of /proc/self/status in bytes ("VmRSS", "VmHWM"), or -1. */
static long proc_status_bytes(const char *field)
{
    char line[256];
    long kb = -1;
    size_t fl = strlen(field);
    FILE *fp = fopen("/proc/self/status", "r");
    if (!fp)
        return -1;
    while (fgets(line, sizeof(line), fp))
        if (!strncmp(line, field, fl) && line[fl] == ':') {
            kb = atol(line + fl + 1);
            break;
        }
    fclose(fp);
    return kb < 0 ? -1 : kb * 1024L;
}

/* Restart the RSS high-water mark here (Linux: "5" > /proc/self/clear_refs); 0 if it worked. */
static int rss_peak_reset(void)
{
    FILE *fp = fopen("/proc/self/clear_refs", "w");
    if (!fp)
        return -1;
    int ok = fputs("5", fp) >= 0;
    return (fclose(fp) == 0 && ok) ? 0 : -1;
}

static long peak_rss_bytes(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss * 1024L;
}

static int data_load_raw(const struct mge_jobspec *spec, int test, struct mge_dataset *ds,
                         char *err, size_t errlen)
{
    const struct mge_data_spec *d = &spec->data;
    if (d->format == MGE_DATA_TOKENS || d->format == MGE_DATA_TEXT) {
        snprintf(err, errlen,
                 "data.format %s: token streams feed model type gpt in mge-train "
                 "only, not as a dataset of samples",
                 d->format == MGE_DATA_TEXT ? "text" : "tokens");
        return MGE_UNSUPPORTED;
    }
    if (d->format == MGE_DATA_SYNTHETIC) {
        int64_t n = test ? d->test_size : d->train_size;
        if (n <= 0) {
            snprintf(err, errlen, "data: no %s set", test ? "test" : "train");
            return MGE_NOENT;
        }
        int c = d->channels > 0 ? d->channels : 1, h = d->image_h, w = d->image_w;
        if (!mge_model_takes_images(spec->model.type)) { /* flat features */
            c = 1;
            h = 1;
            w = d->input_dim;
        }
        int rc = mge_dataset_synthetic_split(ds, n, c, h, w, d->classes, spec->train.seed,
                                             test ? 1 : 0);
        if (rc != MGE_OK)
            snprintf(err, errlen, "synthetic data: %s", mge_strerror(rc));
        return rc;
    }
    if (d->format == MGE_DATA_CIFAR) {
        if (test && !d->test_file) {
            snprintf(err, errlen, "data: no test set");
            return MGE_NOENT;
        }
        return test ? mge_dataset_load_cifar(ds, (const char *const *)&d->test_file, 1, d->classes,
                                             err, errlen)
                    : mge_dataset_load_cifar(ds, (const char *const *)d->train_files,
                                             d->n_train_files, d->classes, err, errlen);
    }
    const char *images = test ? d->test_images : d->train_images;
    const char *labels = test ? d->test_labels : d->train_labels;
    if (!images || !labels) {
        snprintf(err, errlen, "data: no %s set", test ? "test" : "train");
        return MGE_NOENT;
    }
    if (d->format == MGE_DATA_NPY) {
        struct mge_data_expect want = {.classes = d->classes};
        if (d->image_given) {
            want.c = d->channels;
            want.h = d->image_h;
            want.w = d->image_w;
        }
        if (d->image_given || d->input_dim_given)
            want.dim = d->input_dim;
        return mge_dataset_load_npy(ds, images, labels, &want, err, errlen);
    }
    return mge_dataset_load_idx_classes(ds, images, labels, d->classes, err, errlen);
}

int mge_data_load(const struct mge_jobspec *spec, int test, struct mge_dataset *ds, char *err,
                  size_t errlen)
{
    int rc = data_load_raw(spec, test, ds, err, errlen);
    if (rc == MGE_OK && spec->data.n_norm > 0) {
        rc = mge_dataset_set_normalize(ds, spec->data.n_norm, spec->data.norm_mean,
                                       spec->data.norm_std, err, errlen);
        if (rc != MGE_OK)
            mge_dataset_fini(ds);
    }
    /* the training set alone: evaluation gathers without augmentation anyway */
    if (rc == MGE_OK && !test) {
        rc = mge_dataset_set_augment(ds, spec->data.aug_crop_padding, spec->data.aug_hflip,
                                     spec->train.seed, err, errlen);
        if (rc != MGE_OK)
            mge_dataset_fini(ds);
    }
    return rc;
}

int mge_evaluate(struct mge_graph *g, const struct mge_model *model, const struct mge_dataset *ds,
                 int64_t batch, double *loss, double *accuracy)
{
    return mge_evaluate_preds(g, model, ds, batch, loss, accuracy, NULL, NULL);
}

/* The class of each of @n rows of @V logits (the first of equal maxima). */
static void argmax_rows(int32_t *pred, const float *logits, int64_t n, int64_t V)
{
    for (int64_t i = 0; i < n; i++) {
        const float *l = logits + i * V;
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            best = l[v] > l[best] ? v : best;
        pred[i] = (int32_t)best;
    }
}

int mge_evaluate_preds(struct mge_graph *g, const struct mge_model *model,
                       const struct mge_dataset *ds, int64_t batch, double *loss, double *accuracy,
                       int32_t *pred, double *run_sec)
{
    int rc = MGE_OK;
    const int64_t *ls = mge_value_shape(g, model->logits);
    float *x = mge_malloc_aligned(sizeof(float) * (size_t)(batch * ds->dim));
    int32_t *y = mge_malloc(sizeof(int32_t) * (size_t)batch);
    int64_t *idx = mge_malloc(sizeof(int64_t) * (size_t)batch);
    float *logits = mge_malloc(sizeof(float) * (size_t)(batch * ls[1])); /* a device's, copied */
    double sum_loss = 0.0;
    int64_t correct = 0;
    if (!x || !y || !idx || !logits) {
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate evaluation buffers");
        goto out_free;
    }
    mge_graph_bind(g, model->x, x);
    mge_graph_bind(g, model->y, y);
    for (int64_t at = 0; at < ds->n; at += batch) {
        int64_t n = ds->n - at < batch ? ds->n - at : batch;
        for (int64_t i = 0; i < n; i++)
            idx[i] = at + i;
        if ((rc = mge_dataset_gather(ds, idx, n, x, y)) != MGE_OK)
            goto out_free;
        mge_graph_set_batch(g, n);
        double t0 = now_sec();
        if ((rc = mge_graph_run(g, MGE_RUN_INFER, 0)) != MGE_OK)
            goto out_free;
        if (run_sec)
            *run_sec += now_sec() - t0;
        float lv;
        const float *l = mge_value_host(g, model->loss, &lv, sizeof(lv));
        const float *lg =
            mge_value_host(g, model->logits, logits, sizeof(float) * (size_t)(n * ls[1]));
        if (!l || !lg) {
            rc = MGE_ERR(MGE_STATE, "cannot read the evaluation's results");
            goto out_free;
        }
        sum_loss += (double)*l * (double)n;
        correct += mge_cpu_argmax_correct(lg, y, n, ls[1]);
        if (pred)
            argmax_rows(pred + at, lg, n, ls[1]);
    }
    *loss = sum_loss / (double)ds->n;
    *accuracy = (double)correct / (double)ds->n;
out_free:
    mge_free_aligned(x);
    mge_free(y);
    mge_free(idx);
    mge_free(logits);
    return rc;
}

/* ---- the batch split across threads (mge-infer) ---- */

/*
 * Units 0 .. units - 1 handed to graphs that run at once, one per thread (mge_cpu_run_split):
 * each graph takes the next unit when it is free, so a thread that a neighbour slows down
 * simply runs fewer. Whatever depends on the order is combined afterwards, in unit order.
 */
struct split {
    /* run unit @k on graph @t, adding its mge_graph_run() seconds to *@run; MGE_OK or an error */
    int (*unit)(struct split *sp, int t, int64_t k, double *run);
    int64_t units;
    double *run, *busy; /* per graph: seconds in mge_graph_run(), in its loop */
    int *rc;            /* per graph: MGE_OK or the error that stopped it */
    int64_t next;       /* the next unit (atomic) */
    int stop;           /* a graph failed: the others stop too (atomic) */
};

static void split_worker(void *arg, int t)
{
    struct split *sp = arg;
    int rc = MGE_OK;
    double t0 = now_sec();
    for (;;) {
        int64_t k = __atomic_fetch_add(&sp->next, 1, __ATOMIC_RELAXED);
        if (k >= sp->units || __atomic_load_n(&sp->stop, __ATOMIC_RELAXED))
            break;
        if ((rc = sp->unit(sp, t, k, &sp->run[t])) != MGE_OK) {
            sp->rc[t] = rc;
            __atomic_store_n(&sp->stop, 1, __ATOMIC_RELAXED);
            break;
        }
    }
    sp->busy[t] = now_sec() - t0;
}

/* Run all of @sp's units on @n graphs; the graphs' share of the wall time (their inputs are
 * gathered by the same threads, not counted) is added to *@run_sec (may be NULL). */
static int split_run(struct split *sp, int n, double *run_sec)
{
    int rc = MGE_OK;
    sp->run = mge_calloc((size_t)n, sizeof(*sp->run));
    sp->busy = mge_calloc((size_t)n, sizeof(*sp->busy));
    sp->rc = mge_calloc((size_t)n, sizeof(*sp->rc));
    if (!sp->run || !sp->busy || !sp->rc) {
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate evaluation buffers");
        goto out_free;
    }
    double t0 = now_sec();
    mge_cpu_run_split(n, split_worker, sp);
    double wall = now_sec() - t0, run = 0.0, busy = 0.0;
    for (int t = 0; t < n; t++) {
        if (sp->rc[t] != MGE_OK && rc == MGE_OK)
            rc = MGE_ERR(sp->rc[t], "evaluation graph %d failed", t);
        run += sp->run[t];
        busy += sp->busy[t];
    }
    if (rc == MGE_OK && run_sec)
        *run_sec += busy > 0.0 ? wall * run / busy : 0.0;
out_free:
    mge_free(sp->run);
    mge_free(sp->busy);
    mge_free(sp->rc);
    return rc;
}

/* Input buffers of @n graphs, bound to their models' x and y: @rows rows of @xb and @yb bytes
 * each, and @rows int64 indices (windows' starts or sample numbers). */
struct split_bufs {
    void **x, **y;
    int64_t **idx;
    int n;
};

static int split_bufs_init(struct split_bufs *b, struct mge_graph *const *g,
                           const struct mge_model *model, int n, int64_t rows, size_t xb, size_t yb)
{
    b->n = n;
    b->x = mge_calloc((size_t)n, sizeof(*b->x));
    b->y = mge_calloc((size_t)n, sizeof(*b->y));
    b->idx = mge_calloc((size_t)n, sizeof(*b->idx));
    if (!b->x || !b->y || !b->idx)
        return MGE_ERR(MGE_NOMEM, "cannot allocate evaluation buffers");
    for (int t = 0; t < n; t++) {
        b->x[t] = mge_malloc_aligned(xb * (size_t)rows);
        b->y[t] = mge_malloc(yb * (size_t)rows);
        b->idx[t] = mge_malloc(sizeof(int64_t) * (size_t)rows);
        if (!b->x[t] || !b->y[t] || !b->idx[t])
            return MGE_ERR(MGE_NOMEM, "cannot allocate evaluation buffers");
        mge_graph_bind(g[t], model[t].x, b->x[t]);
        mge_graph_bind(g[t], model[t].y, b->y[t]);
    }
    return MGE_OK;
}

static void split_bufs_fini(struct split_bufs *b)
{
    for (int t = 0; t < b->n && b->x; t++)
        mge_free_aligned(b->x[t]);
    for (int t = 0; t < b->n && b->y; t++)
        mge_free(b->y[t]);
    for (int t = 0; t < b->n && b->idx; t++)
        mge_free(b->idx[t]);
    mge_free(b->x);
    mge_free(b->y);
    mge_free(b->idx);
}

/* mge_evaluate_split(): units of @sub consecutive samples; each keeps its logits. */
struct split_images {
    struct split sp; /* first: the worker's argument */
    struct mge_graph *const *g;
    const struct mge_model *model;
    const struct mge_dataset *ds;
    struct split_bufs b;
    int64_t sub, V;
    float *logits; /* (ds->n, V): each unit's rows, written by the graph that ran it */
};

static int images_unit(struct split *sp, int t, int64_t k, double *run)
{
    struct split_images *e = (struct split_images *)sp;
    struct mge_graph *g = e->g[t];
    int64_t at = k * e->sub, n = e->ds->n - at < e->sub ? e->ds->n - at : e->sub;
    float *rows = e->logits + at * e->V;
    size_t bytes = sizeof(float) * (size_t)(n * e->V);
    for (int64_t i = 0; i < n; i++)
        e->b.idx[t][i] = at + i;
    int rc = mge_dataset_gather(e->ds, e->b.idx[t], n, e->b.x[t], e->b.y[t]);
    if (rc != MGE_OK)
        return rc;
    mge_graph_set_batch(g, n);
    double r0 = now_sec();
    rc = mge_graph_run(g, MGE_RUN_INFER, 0);
    *run += now_sec() - r0;
    if (rc != MGE_OK)
        return rc;
    const float *lg = mge_value_host(g, e->model[t].logits, rows, bytes);
    if (!lg)
        return MGE_STATE;
    if (lg != rows)
        memcpy(rows, lg, bytes);
    return MGE_OK;
}

int mge_evaluate_split(struct mge_graph *const *g, const struct mge_model *model, int n_graphs,
                       const struct mge_dataset *ds, int64_t batch, int64_t sub, float smoothing,
                       double *loss, double *accuracy, int32_t *pred, double *run_sec)
{
    struct split_images e = {.g = g, .model = model, .ds = ds, .sub = sub};
    e.sp.unit = images_unit;
    e.sp.units = (ds->n + sub - 1) / sub;
    e.V = mge_value_shape(g[0], model[0].logits)[1];
    e.logits = mge_malloc(sizeof(float) * (size_t)(ds->n * e.V));
    float *probs = mge_malloc(sizeof(float) * (size_t)(batch * e.V));
    int rc = split_bufs_init(&e.b, g, model, n_graphs, sub, sizeof(float) * (size_t)ds->dim,
                             sizeof(int32_t));
    if (rc == MGE_OK && (!e.logits || !probs))
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate evaluation buffers");
    if (rc != MGE_OK)
        goto out_free;
    if ((rc = split_run(&e.sp, n_graphs, run_sec)) != MGE_OK)
        goto out_free;
    /* the loss of each batch of @batch as its graph's cross-entropy node computes it (same
     * kernel, same logits), summed in batch order: mge_evaluate_preds()'s result exactly */
    double sum_loss = 0.0;
    int64_t correct = 0;
    for (int64_t at = 0; at < ds->n; at += batch) {
        int64_t n = ds->n - at < batch ? ds->n - at : batch;
        const float *lg = e.logits + at * e.V;
        float lv;
        mge_cpu_softmax_xent_smooth_forward(&lv, probs, lg, ds->labels + at, n, e.V, smoothing);
        sum_loss += (double)lv * (double)n;
        correct += mge_cpu_argmax_correct(lg, ds->labels + at, n, e.V);
        if (pred)
            argmax_rows(pred + at, lg, n, e.V);
    }
    *loss = sum_loss / (double)ds->n;
    *accuracy = (double)correct / (double)ds->n;
out_free:
    split_bufs_fini(&e.b);
    mge_free(e.logits);
    mge_free(probs);
    return rc;
}

/* mge_tokens_evaluate_split(): units of @sub windows; each keeps its loss sum. */
struct split_tokens {
    struct split sp; /* first: the worker's argument */
    struct mge_graph *const *g;
    const struct mge_model *model;
    const struct mge_tokens *tk;
    struct split_bufs b;
    int64_t sub, T, n_win;
    double *sums; /* (units): a unit's mean loss per token times its windows */
};

static int tokens_unit(struct split *sp, int t, int64_t k, double *run)
{
    struct split_tokens *e = (struct split_tokens *)sp;
    struct mge_graph *g = e->g[t];
    int64_t at = k * e->sub, n = e->n_win - at < e->sub ? e->n_win - at : e->sub;
    for (int64_t i = 0; i < n; i++)
        e->b.idx[t][i] = (at + i) * e->T;
    mge_tokens_gather(e->tk, e->b.idx[t], n, e->T, e->b.x[t], e->b.y[t]);
    mge_graph_set_batch(g, n);
    double r0 = now_sec();
    int rc = mge_graph_run(g, MGE_RUN_INFER, 0);
    *run += now_sec() - r0;
    float lv = NAN;
    if (rc == MGE_OK)
        rc = mge_value_read(g, e->model[t].loss, &lv, sizeof(lv));
    e->sums[k] = (double)lv * (double)n;
    return rc;
}

int mge_tokens_evaluate_split(struct mge_graph *const *g, const struct mge_model *model,
                              int n_graphs, const struct mge_tokens *tk, int64_t sub, int64_t T,
                              int64_t max_windows, double *loss, int64_t *windows)
{
    struct split_tokens e = {.g = g, .model = model, .tk = tk, .sub = sub, .T = T};
    e.n_win = (tk->n - 1) / T < max_windows ? (tk->n - 1) / T : max_windows;
    e.sp.unit = tokens_unit;
    e.sp.units = (e.n_win + sub - 1) / sub;
    e.sums = mge_calloc((size_t)(e.sp.units > 0 ? e.sp.units : 1), sizeof(double));
    int rc = split_bufs_init(&e.b, g, model, n_graphs, sub, sizeof(int32_t) * (size_t)T,
                             sizeof(int32_t) * (size_t)T);
    if (rc == MGE_OK && !e.sums)
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate evaluation windows");
    if (rc != MGE_OK)
        goto out_free;
    if ((rc = split_run(&e.sp, n_graphs, NULL)) != MGE_OK)
        goto out_free;
    double sum = 0.0;
    for (int64_t k = 0; k < e.sp.units; k++)
        sum += e.sums[k];
    *loss = e.n_win > 0 ? sum / (double)e.n_win : NAN;
    *windows = e.n_win;
out_free:
    split_bufs_fini(&e.b);
    mge_free(e.sums);
    return rc;
}

/* ---- checkpoints ---- */

struct trainer {
    const struct mge_train_opts *opts;
    struct mge_jobspec *spec;
    struct mge_dataset train, test;
    int have_test;
    struct mge_graph *g;
    const struct mge_device *dev; /* resources.device: where the arenas and optimiser live */
    float *grads_host;            /* (n_grads) host copy for collectives, off the host only */
    size_t mirrored;              /* bytes of this step's gradients copied into grads_host */
    struct mge_model model;
    struct mge_plan_stats stats;
    struct mge_remat_plan remat, remat_plain; /* chosen and plain recompute plans */
    long rss_base;              /* RSS before the engine allocated (high-water mark reset), or 0 */
    long long alloc_base;       /* bytes held through mge_malloc & co. at that point */
    struct mge_optim optim;
    struct mge_sampler sampler;
    struct mge_loader loader;
    int sampler_ok, loader_ok, optim_ok;
    int64_t step, epoch, pos, total_steps;
    double last_loss, test_acc, test_loss;
    char out_dir[1024];
    /* data parallelism (dist: a backend other than local; the local path is unchanged) */
    struct mge_comm_env env;
    struct mge_comm *comm;
    struct mge_comm_packs *packs;
    int rank, world, dist;
    int cdev;        /* collectives take device memory (nccl over the cuda device's arenas) */
    double *scratch; /* cdev: (4) device memory for the host scalars collectives carry */
    /* deterministic mode (distributed.deterministic): micro-shards summed exactly */
    int det;       /* 1 in deterministic mode, on any backend (local included) */
    int det_first; /* this rank's micro-shards [det_first, det_end) of micro_shards */
    int det_end;
    int64_t *det_acc;       /* (n_grads + 1) fixed-point sums: the gradients, then the loss */
    float *det_x;           /* (ceil(batch / micro_shards), dim) one micro-shard's rows, aligned */
    int32_t *det_y;         /* (ceil(batch / micro_shards)) its labels */
    struct mge_trace trace; /* --profile */
    int64_t trace_until;    /* steps below this are traced */
    double grad_norm;       /* train.clip_grad_norm: the last step's norm before clipping */
    int tracing;            /* the current step is traced */
    /* checkpoints (rank 0): tensor list over the live state, and the background writer */
    struct mge_ckpt_tensor *ck_ts; /* (ck_n) */
    char (*ck_names)[160];         /* (ck_n) their names */
    int ck_n;
    struct mge_ckpt_writer *ckw;
    double ckpt_sec; /* time the loop spent snapshotting or waiting for the writer */
    /* gpt: token streams and random windows instead of a dataset, sampler and loader */
    int gpt;
    struct mge_tokens tok, tok_test; /* tok_test: data.test_file, or the tail of tok */
    int32_t *tok_x, *tok_y;          /* (batch, context) this step's ids and next tokens */
    int64_t *tok_starts;             /* (batch) window starts */
    struct mge_batch tok_batch;      /* what the loop reads in place of a loader's batch */
    /* input staging off the host: the next step's batch, taken from the loader and staged
     * (mge_graph_stage) while this step's kernels run; NULL when none */
    struct mge_batch *ahead;
};

#define TRACE_STEPS 200
enum { TRACK_COMPUTE = 1, TRACK_COMM = 2 };

static int optim_ckpt_type(enum mge_optim_type t)
{
    switch (t) {
    case MGE_OPTIM_SGD:
        return MGE_CKPT_OPTIM_SGD;
    case MGE_OPTIM_ADAM:
        return MGE_CKPT_OPTIM_ADAM;
    case MGE_OPTIM_ADAMW:
        return MGE_CKPT_OPTIM_ADAMW;
    }
    return MGE_CKPT_OPTIM_NONE;
}

/* The i-th checkpoint tensor: parameters and buffers, then each optimiser state per trained
 * parameter (buffers have none: the optimiser's arena ends before them). */
static void ckpt_tensor_of(struct trainer *t, int pi, int state, struct mge_ckpt_tensor *ct,
                           char *name, size_t name_len)
{
    int v = mge_graph_param(t->g, pi);
    const char *pname = mge_value_name(t->g, v);
    float *base = mge_value_data(t->g, v);
    memset(ct, 0, sizeof(*ct));
    if (state < 0) {
        snprintf(name, name_len, "%s", pname);
        ct->data = base;
    } else {
        const char *sname;
        float *sd = mge_optim_state(&t->optim, state, &sname);
        int64_t n_params;
        float *arena = mge_graph_params(t->g, &n_params);
        snprintf(name, name_len, "optim.%s.%s", sname, pname);
        ct->data = sd + (base - arena);
    }
    ct->name = name;
    ct->dtype = MGE_CKPT_F32;
    ct->ndim = mge_value_ndim(t->g, v);
    memcpy(ct->shape, mge_value_shape(t->g, v), sizeof(int64_t) * (size_t)ct->ndim);
    ct->nbytes = sizeof(float) * (size_t)mge_value_numel(t->g, v);
}

/* The checkpoint's tensor list over the live state, and the background writer for it; made
 * once on rank 0 before the loop, so that a checkpoint allocates nothing. */
static int ckpt_init(struct trainer *t)
{
    int np = mge_graph_n_params(t->g), ns = mge_optim_n_states(&t->optim);
    int n = np * (1 + ns);
    t->ck_ts = mge_calloc((size_t)n, sizeof(*t->ck_ts));
    t->ck_names = mge_calloc((size_t)n, sizeof(*t->ck_names));
    if (!t->ck_ts || !t->ck_names)
        return MGE_ERR(MGE_NOMEM, "cannot allocate checkpoint");
    n = 0;
    for (int s = -1; s < ns; s++)
        for (int i = 0; i < np; i++)
            if (s < 0 || !mge_value_is_buffer(t->g, mge_graph_param(t->g, i))) {
                ckpt_tensor_of(t, i, s, &t->ck_ts[n], t->ck_names[n], sizeof(t->ck_names[n]));
                n++;
            }
    t->ck_n = n;
    int rc = mge_ckpt_writer_new(&t->ckw, t->ck_ts, n);
    if (rc == MGE_OK && !t->dev->host_visible) /* the snapshot comes off the device */
        mge_ckpt_writer_set_copy(t->ckw, t->dev->d2h);
    return rc;
}

/* Snapshot the state and hand it to the writer thread (which waits for its previous write
 * first); with @wait, also wait until this one is on disk. */
static int ckpt_save(struct trainer *t, int wait)
{
    struct mge_ckpt ck = {0};
    char err[512], path[1200], latest[1200];
    double t0 = now_sec();
    ck.step = t->step;
    ck.epoch = t->epoch;
    ck.sampler_pos = t->pos;
    ck.optim_step = t->optim.t;
    ck.optim_type = optim_ckpt_type(t->spec->train.optim.type);
    ck.rng[0] = t->spec->train.seed;
    ck.n_rng = 1;
    ck.spec_yaml = t->spec->source;
    ck.last_loss = t->last_loss;
    ck.test_accuracy = t->test_acc;
    ck.tensors = t->ck_ts;
    ck.n_tensors = t->ck_n;
    snprintf(path, sizeof(path), "%s/ckpt-%06lld.mgeckpt", t->out_dir, (long long)t->step);
    /* "latest.mgeckpt" points at the newest one; replaced atomically after it is written */
    snprintf(latest, sizeof(latest), "%s/latest.mgeckpt", t->out_dir);
    int rc = mge_ckpt_writer_save(t->ckw, &ck, path, latest, err, sizeof(err));
    if (rc == MGE_OK && wait)
        rc = mge_ckpt_writer_wait(t->ckw, err, sizeof(err));
    if (rc != MGE_OK)
        fprintf(stderr, "mge-train: checkpoint: %s\n", err);
    t->ckpt_sec += now_sec() - t0;
    return rc;
}

static int ckpt_restore(struct trainer *t, const char *path)
{
    struct mge_ckpt *ck = NULL;
    char err[512], name[160];
    int rc = mge_ckpt_read(path, &ck, err, sizeof(err));
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-train: %s\n", err);
        return rc;
    }
    int np = mge_graph_n_params(t->g), ns = mge_optim_n_states(&t->optim);
    for (int s = -1; s < ns && rc == MGE_OK; s++)
        for (int i = 0; i < np; i++) {
            struct mge_ckpt_tensor want;
            if (s >= 0 && mge_value_is_buffer(t->g, mge_graph_param(t->g, i)))
                continue;
            ckpt_tensor_of(t, i, s, &want, name, sizeof(name));
            const struct mge_ckpt_tensor *have = mge_ckpt_find(ck, name);
            if (!have || have->dtype != MGE_CKPT_F32 || have->nbytes != want.nbytes) {
                fprintf(stderr, "mge-train: %s: tensor '%s' %s\n", path, name,
                        have ? "has another shape or type than the model" : "is missing");
                rc = MGE_CORRUPT;
                break;
            }
            t->dev->h2d(want.data, have->data, want.nbytes);
        }
    if (rc == MGE_OK) {
        t->step = ck->step;
        t->epoch = ck->epoch;
        t->pos = ck->sampler_pos;
        t->optim.t = ck->optim_step;
        t->last_loss = ck->last_loss;
        t->test_acc = ck->test_accuracy;
    }
    mge_ckpt_free(ck);
    return rc;
}

/* "[512, 784]" into @buf. */
static const char *shape_str(const int64_t *shape, int ndim, char *buf, size_t n)
{
    size_t at = 0;
    at += (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && at < n; d++)
        at += (size_t)snprintf(buf + at, n - at, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (at < n)
        snprintf(buf + at, n - at, "]");
    return buf;
}

/* Tensors --init-from skips: a checkpoint's optimiser state ("optim.<state>.<param>"), and
 * PyTorch's batch-norm counters (mge's batch norm has a fixed momentum and keeps none). */
static bool init_from_ignores(const char *name, int torch_names)
{
    const char *nbt = ".num_batches_tracked";
    size_t len = strlen(name), nl = strlen(nbt);
    /* activation observers: a fp32 model ignores them, a quantised one starts them afresh */
    if (mge_quant_is_observer(name))
        return true;
    if (!torch_names)
        return !strncmp(name, "optim.", 6);
    return len > nl && !strcmp(name + len - nl, nbt);
}

/*
 * --init-from: every parameter and buffer from @ts (an mge checkpoint's tensors, named as mge
 * names them, or a safetensors file's, named as PyTorch does: @torch_names), which must hold
 * each with the model's shape as float32, and nothing else besides what init_from_ignores()
 * (the optimiser starts fresh, at step 0).
 */
static int init_from_tensors(struct trainer *t, const char *path, const struct mge_ckpt_tensor *ts,
                             int n, int torch_names)
{
    char name[160], s1[160], s2[160];
    int np = mge_graph_n_params(t->g), used = 0, expected = 0;
    for (int i = 0; i < n; i++)
        expected += !init_from_ignores(ts[i].name, torch_names);
    for (int i = 0; i < np; i++) {
        int v = mge_graph_param(t->g, i);
        const char *pname = mge_value_name(t->g, v);
        const int64_t *shape = mge_value_shape(t->g, v);
        int ndim = mge_value_ndim(t->g, v);
        const struct mge_ckpt_tensor *have = NULL;
        if (torch_names)
            mge_model_torch_name(pname, name, sizeof(name));
        else
            snprintf(name, sizeof(name), "%s", pname);
        for (int k = 0; k < n && !have; k++)
            if (!strcmp(ts[k].name, name))
                have = &ts[k];
        if (!have && mge_quant_is_observer(pname))
            continue; /* QAT from a fp32 checkpoint: observe from scratch */
        if (!have) {
            fprintf(stderr, "mge-train: %s: tensor '%s' (shape %s) is missing\n", path, name,
                    shape_str(shape, ndim, s1, sizeof(s1)));
            return MGE_INVAL;
        }
        if (have->dtype != MGE_CKPT_F32 || have->ndim != ndim ||
            memcmp(have->shape, shape, sizeof(int64_t) * (size_t)ndim) != 0) {
            fprintf(stderr,
                    "mge-train: %s: tensor '%s': the model expects float32 %s, the file "
                    "has %s%s\n",
                    path, name, shape_str(shape, ndim, s1, sizeof(s1)),
                    have->dtype != MGE_CKPT_F32 ? "another dtype, " : "",
                    shape_str(have->shape, have->ndim, s2, sizeof(s2)));
            return MGE_INVAL;
        }
        if (mge_quant_is_observer(pname)) {
            /* checked on the host copy: the value may live on a device */
            float ob[MGE_QUANT_OBSERVER_LEN] = {0};
            char why[256];
            int64_t nv = (int64_t)(have->nbytes / sizeof(float));
            memcpy(ob, have->data, nv <= MGE_QUANT_OBSERVER_LEN ? have->nbytes : sizeof(ob));
            if (mge_quant_observer_check(ob, nv, 0, why, sizeof(why))) {
                fprintf(stderr, "mge-train: %s: quantisation observer '%s': %s\n", path, name, why);
                return MGE_INVAL;
            }
        }
        if (mge_value_write(t->g, v, have->data, have->nbytes) != MGE_OK)
            return MGE_STATE;
        used += !mge_quant_is_observer(pname);
    }
    if (used != expected) {
        for (int k = 0; k < n; k++) {
            int found = 0;
            if (init_from_ignores(ts[k].name, torch_names))
                continue;
            for (int i = 0; i < np && !found; i++) {
                const char *pname = mge_value_name(t->g, mge_graph_param(t->g, i));
                found =
                    !strcmp(torch_names ? mge_model_torch_name(pname, name, sizeof(name)) : pname,
                            ts[k].name);
            }
            if (!found) {
                fprintf(stderr,
                        "mge-train: %s: tensor '%s' (shape %s) is not a parameter or "
                        "buffer of the model\n",
                        path, ts[k].name, shape_str(ts[k].shape, ts[k].ndim, s1, sizeof(s1)));
                break;
            }
        }
        return MGE_INVAL;
    }
    return MGE_OK;
}

/* --init-from FILE: an mge checkpoint (by its magic) or a safetensors file. */
static int init_from(struct trainer *t, const char *path)
{
    char err[768], magic[8] = {0};
    FILE *fp = fopen(path, "rb");
    int rc;
    if (!fp) {
        fprintf(stderr, "mge-train: --init-from: cannot open '%s': %s\n", path, strerror(errno));
        return MGE_NOENT;
    }
    size_t got = fread(magic, 1, sizeof(magic), fp);
    fclose(fp);
    if (got == sizeof(magic) && !memcmp(magic, MGE_CKPT_MAGIC, sizeof(magic))) {
        struct mge_ckpt *ck = NULL;
        if ((rc = mge_ckpt_read(path, &ck, err, sizeof(err))) != MGE_OK) {
            fprintf(stderr, "mge-train: --init-from: %s\n", err);
            return rc;
        }
        rc = init_from_tensors(t, path, ck->tensors, ck->n_tensors, 0);
        mge_ckpt_free(ck);
        return rc;
    }
    struct mge_safetensors *st = NULL;
    if ((rc = mge_safetensors_read(path, &st, err, sizeof(err))) != MGE_OK) {
        fprintf(stderr, "mge-train: --init-from: %s\n", err);
        return rc;
    }
    rc = init_from_tensors(t, path, st->tensors, st->n_tensors, 1);
    mge_safetensors_free(st);
    return rc;
}

/* ---- graphs, plans, budgets ---- */

static enum mge_remat spec_remat(const struct mge_jobspec *spec)
{
    switch (spec->memory.sublinear) {
    case MGE_SUBLINEAR_ON:
        return MGE_REMAT_SUBLINEAR;
    case MGE_SUBLINEAR_LIGHT:
        return MGE_REMAT_LIGHT;
    case MGE_SUBLINEAR_AUTO:
        return MGE_REMAT_AUTO;
    case MGE_SUBLINEAR_OFF:
        break;
    }
    return MGE_REMAT_NONE;
}

/* Optimiser state buffers the spec's optimiser keeps (each the size of the parameters). */
static int optim_buffers(const struct mge_jobspec *spec)
{
    const struct mge_optim_spec *o = &spec->train.optim;
    return o->type == MGE_OPTIM_SGD ? (o->momentum > 0.0) : 2;
}

/* Bytes of the budget left for activations once parameters, gradients and state are in. */
static size_t activation_budget(const struct mge_jobspec *spec, size_t param_bytes, int *enough)
{
    size_t total = (size_t)spec->memory.budget_mb * 1048576u;
    size_t fixed = param_bytes * (size_t)(2 + optim_buffers(spec));
    *enough = total == 0 || total > fixed;
    return total == 0 ? 0 : total > fixed ? total - fixed : 1;
}

void mge_quant_opts_from_spec(const struct mge_jobspec *spec, enum mge_quant_mode mode,
                              struct mge_quant_opts *o)
{
    const struct mge_quant_spec *q = &spec->quant;
    memset(o, 0, sizeof(*o));
    o->mode = mode;
    o->observer = q->observer == MGE_QUANT_SPEC_EMA          ? MGE_QUANT_OBS_EMA
                  : q->observer == MGE_QUANT_SPEC_PERCENTILE ? MGE_QUANT_OBS_PERCENTILE
                                                             : MGE_QUANT_OBS_MINMAX;
    o->momentum = q->momentum > 0.0 ? (float)q->momentum : 0.01f;
    o->percentile = q->percentile > 50.0 ? (float)q->percentile : 99.99f;
    o->start_step = q->start_step;
}

int mge_train_bf16(const struct mge_jobspec *spec)
{
    return spec->train.precision == MGE_PRECISION_BF16 && mge_cpu_has_bf16();
}

const char *mge_train_precision(const struct mge_jobspec *spec)
{
    if (spec->train.precision != MGE_PRECISION_BF16)
        return "fp32";
    return mge_cpu_has_bf16() ? "bf16" : "fp32 (bf16 unsupported: no avx512_bf16)";
}

int mge_train_build(const struct mge_jobspec *spec, int64_t batch, int c, int h, int w,
                    int classes, enum mge_remat mode, struct mge_graph **gp,
                    struct mge_model *model, struct mge_plan_stats *stats,
                    struct mge_remat_plan *chosen, struct mge_remat_plan *plain)
{
    struct mge_graph *g = NULL;
    int rc = mge_graph_new(&g), enough;
    *gp = g;
    if (rc != MGE_OK)
        return rc;
    mge_graph_set_bf16(g, mge_train_bf16(spec));
    if (spec->quant.mode == MGE_QUANT_SPEC_QAT) {
        struct mge_quant_opts qo;
        mge_quant_opts_from_spec(spec, MGE_QUANT_FAKE, &qo);
        if ((rc = mge_graph_set_quant(g, &qo)) != MGE_OK)
            return rc;
    }
    rc = mge_model_build(g, spec, batch, c, h, w, classes, model);
    if (rc == MGE_OK)
        rc = mge_graph_backward(g, model->loss);
    if (rc != MGE_OK)
        return rc;
    size_t budget = activation_budget(spec, mge_graph_param_bytes(g), &enough);
    if (!enough) {
        mge__graph_fail(g, MGE_BUDGET,
                        "memory.budget_mb: %lld MiB does not hold the parameters, gradients and "
                        "optimiser state (%.1f MiB)",
                        (long long)spec->memory.budget_mb,
                        (double)(mge_graph_param_bytes(g) * (size_t)(2 + optim_buffers(spec))) /
                            1048576.0);
        return MGE_BUDGET;
    }
    rc = mge_graph_sublinear(g, mode, budget, chosen, plain);
    if (rc == MGE_OK && spec->train.eager) /* before planning: eager plans no in-place ops */
        rc = mge_graph_set_eager(g, NULL);
    if (rc == MGE_BUDGET) {
        size_t need = chosen->activation_bytes +
                      mge_graph_param_bytes(g) * (size_t)(2 + optim_buffers(spec));
        char msg[256];
        snprintf(msg, sizeof(msg), "memory.budget_mb: %lld MiB is too small: %s; the smallest "
                 "feasible budget is %lld MiB", (long long)spec->memory.budget_mb,
                 mge_graph_error_msg(g), (long long)((need + 1048575) / 1048576));
        snprintf(g->errmsg, sizeof(g->errmsg), "%s", msg);
        g->err = MGE_BUDGET;
        return rc;
    }
    if (rc == MGE_OK)
        rc = mge_graph_plan(g, stats);
    return rc;
}

static void print_remat(const char *name, const struct mge_remat_plan *p, size_t fixed)
{
    static const char *const modes[] = {"none", "light", "sublinear", "auto"};
    printf("\"%s\":{\"mode\":\"%s\",\"peak_bytes\":%zu,\"activation_bytes\":%zu,"
           "\"lower_bound_bytes\":%zu,\"recompute_flops\":%.0f,\"recompute_ops\":%d}",
           name, modes[p->mode], fixed + p->activation_bytes, p->activation_bytes,
           p->lower_bound_bytes, p->recompute_flops, p->recompute_ops);
}

/* --plan: the chosen plan at the top level, and the plain and sublinear plans side by side. */
static int print_plan(struct trainer *t)
{
    const struct mge_plan_stats *s = &t->stats;
    size_t optim_bytes = mge_optim_state_bytes(&t->optim);
    size_t fixed = s->param_bytes + s->grad_bytes + optim_bytes;
    size_t peak = fixed + s->activation_bytes;
    struct mge_graph *g2 = NULL;
    struct mge_model m2;
    struct mge_plan_stats st2;
    struct mge_remat_plan sub, plain;
    int rc = mge_train_build(t->spec, t->spec->train.batch_size, t->train.c, t->train.h,
                             t->train.w, t->train.classes, MGE_REMAT_SUBLINEAR, &g2, &m2, &st2,
                             &sub, &plain);
    double flops = mge_graph_flops(t->g);
    mge_graph_free(g2);
    if (rc != MGE_OK)
        return rc;
    printf("{\"peak_bytes\":%zu,\"lower_bound_bytes\":%zu,\"param_bytes\":%zu,"
           "\"grad_bytes\":%zu,\"optimizer_bytes\":%zu,\"activation_bytes\":%zu,"
           "\"input_bytes\":%zu,\"values\":%d,\"ops\":%d,\"step_flops\":%.0f,",
           peak, s->lower_bound_bytes, s->param_bytes, s->grad_bytes, optim_bytes,
           s->activation_bytes, s->input_bytes, s->n_values, s->n_nodes, flops);
    print_remat("chosen", &t->remat, fixed);
    printf(",\"plans\":{");
    print_remat("plain", &plain, fixed);
    printf(",");
    print_remat("sublinear", &sub, fixed);
    printf("}}\n");
    return MGE_OK;
}

/* The largest batch whose plan fits the budget, by bisection. */
static int64_t max_batch_for(struct trainer *t, enum mge_remat mode)
{
    int64_t lo = 0, hi = 1;
    for (;;) { /* grow until it does not fit */
        struct mge_graph *g = NULL;
        struct mge_model m;
        struct mge_plan_stats st;
        struct mge_remat_plan p;
        int rc = mge_train_build(t->spec, hi, t->train.c, t->train.h, t->train.w,
                                 t->train.classes, mode, &g, &m, &st, &p, NULL);
        mge_graph_free(g);
        if (rc != MGE_OK)
            break;
        lo = hi;
        if (hi >= ((int64_t)1 << 24))
            return lo;
        hi *= 2;
    }
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        struct mge_graph *g = NULL;
        struct mge_model m;
        struct mge_plan_stats st;
        struct mge_remat_plan p;
        int rc = mge_train_build(t->spec, mid, t->train.c, t->train.h, t->train.w,
                                 t->train.classes, mode, &g, &m, &st, &p, NULL);
        mge_graph_free(g);
        if (rc == MGE_OK)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

static int max_batch(struct trainer *t)
{
    if (t->spec->memory.budget_mb <= 0) {
        fprintf(stderr, "mge-train: --max-batch needs memory.budget_mb (--set memory.budget_mb=N)\n");
        return MGE_INVAL;
    }
    int64_t plain = max_batch_for(t, MGE_REMAT_NONE);
    int64_t light = max_batch_for(t, MGE_REMAT_LIGHT);
    int64_t sub = max_batch_for(t, MGE_REMAT_SUBLINEAR);
    printf("{\"budget_mb\":%lld,\"max_batch_plain\":%lld,\"max_batch_light\":%lld,"
           "\"max_batch_sublinear\":%lld,\"ratio\":%.3f}\n",
           (long long)t->spec->memory.budget_mb, (long long)plain, (long long)light,
           (long long)sub, plain > 0 ? (double)sub / (double)plain : 0.0);
    return MGE_OK;
}

/* ---- the run ---- */

static int mkdir_p(const char *path)
{
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return (mkdir(buf, 0755) != 0 && errno != EEXIST) ? -1 : 0;
}

/* ---- gpt: token windows ---- */

int mge_tokens_load_spec(const struct mge_jobspec *spec, struct mge_tokens *train,
                         struct mge_tokens *test, char *err, size_t errlen)
{
    const struct mge_data_spec *d = &spec->data;
    int64_t T = spec->model.context;
    memset(test, 0, sizeof(*test));
    int rc = mge_tokens_load(train, (const char *const *)d->train_files, d->n_train_files,
                             d->token_bytes, spec->model.vocab, err, errlen);
    if (rc == MGE_OK && d->test_file)
        rc = mge_tokens_load(test, (const char *const *)&d->test_file, 1, d->token_bytes,
                             spec->model.vocab, err, errlen);
    else if (rc == MGE_OK && d->test_fraction > 0.0)
        mge_tokens_split(train, train->n - (int64_t)((double)train->n * d->test_fraction), test);
    if (rc == MGE_OK && (train->n <= T || (test->n > 0 && test->n <= T)))
        rc = MGE_ERR_FILL(MGE_FORMAT, err, errlen,
                          "%s: %lld %s tokens: model.context %lld needs at least %lld",
                          train->n <= T  ? d->train_files[0]
                          : d->test_file ? d->test_file
                                         : "data.test_fraction",
                          (long long)(train->n <= T ? train->n : test->n),
                          train->n <= T ? "training" : "held-out", (long long)T, (long long)T + 1);
    if (rc != MGE_OK) {
        mge_tokens_fini(test);
        mge_tokens_fini(train);
    }
    return rc;
}

int mge_tokens_evaluate(struct mge_graph *g, const struct mge_model *model,
                        const struct mge_tokens *tk, int64_t batch, int64_t T, int64_t max_windows,
                        double *loss, int64_t *windows)
{
    int64_t n_win = (tk->n - 1) / T;
    n_win = n_win < max_windows ? n_win : max_windows;
    int32_t *x = mge_malloc(sizeof(int32_t) * (size_t)(batch * T));
    int32_t *y = mge_malloc(sizeof(int32_t) * (size_t)(batch * T));
    int64_t *starts = mge_malloc(sizeof(int64_t) * (size_t)batch);
    double sum = 0.0;
    int rc = MGE_OK;
    if (!x || !y || !starts) {
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate evaluation windows");
        goto out_free;
    }
    mge_graph_bind(g, model->x, x);
    mge_graph_bind(g, model->y, y);
    for (int64_t at = 0; at < n_win && rc == MGE_OK; at += batch) {
        int64_t n = n_win - at < batch ? n_win - at : batch;
        for (int64_t i = 0; i < n; i++)
            starts[i] = (at + i) * T;
        mge_tokens_gather(tk, starts, n, T, x, y);
        mge_graph_set_batch(g, n);
        rc = mge_graph_run(g, MGE_RUN_INFER, 0);
        float lv = NAN;
        if (rc == MGE_OK)
            rc = mge_value_read(g, model->loss, &lv, sizeof(lv));
        sum += (double)lv * (double)n;
    }
    *loss = n_win > 0 ? sum / (double)n_win : NAN;
    *windows = n_win;
out_free:
    mge_free(x);
    mge_free(y);
    mge_free(starts);
    return rc;
}

/* gpt: the spec's token streams, and this rank's batch buffers. */
static int tokens_load(struct trainer *t, char *err, size_t errlen)
{
    int64_t T = t->spec->model.context, B = t->spec->train.batch_size;
    int rc = mge_tokens_load_spec(t->spec, &t->tok, &t->tok_test, err, errlen);
    if (rc != MGE_OK)
        return rc;
    t->have_test = t->tok_test.n > 0 && t->rank == 0; /* rank 0 alone evaluates */
    t->tok_x = mge_malloc(sizeof(int32_t) * (size_t)(B * T));
    t->tok_y = mge_malloc(sizeof(int32_t) * (size_t)(B * T));
    t->tok_starts = mge_malloc(sizeof(int64_t) * (size_t)B);
    if (!t->tok_x || !t->tok_y || !t->tok_starts)
        return MGE_ERR_FILL(MGE_NOMEM, err, errlen, "cannot allocate token batches");
    return MGE_OK;
}

/* This rank's rows of step t->step's global batch: windows from (seed, step, global row). */
static struct mge_batch *tokens_next(struct trainer *t)
{
    int64_t B = t->spec->train.batch_size, T = t->spec->model.context;
    int64_t r0 = mge_split_start(B, t->rank, t->world),
            r1 = mge_split_start(B, t->rank + 1, t->world);
    for (int64_t r = r0; r < r1; r++)
        t->tok_starts[r - r0] = mge_tokens_window(&t->tok, T, t->spec->train.seed, t->step, r);
    mge_tokens_gather(&t->tok, t->tok_starts, r1 - r0, T, t->tok_x, t->tok_y);
    t->tok_batch.n = r1 - r0;
    t->tok_batch.global_n = B;
    return &t->tok_batch;
}

/* The held-out loss now (MGE_TOKENS_EVAL_WINDOWS windows at most), printed. */
static int tokens_evaluate(struct trainer *t, int json)
{
    int64_t n_win;
    int rc =
        mge_tokens_evaluate(t->g, &t->model, &t->tok_test, t->spec->train.batch_size,
                            t->spec->model.context, MGE_TOKENS_EVAL_WINDOWS, &t->test_loss, &n_win);
    if (rc != MGE_OK)
        return rc;
    if (json)
        printf("{\"epoch\":%lld,\"step\":%lld,\"test_loss\":%.6f}\n", (long long)t->epoch,
               (long long)t->step, t->test_loss);
    else
        printf("step %lld: held-out loss %.4f nats/token (%lld windows)\n", (long long)t->step,
               t->test_loss, (long long)n_win);
    fflush(stdout);
    return MGE_OK;
}

static int evaluate_epoch(struct trainer *t, int json)
{
    int64_t batch = t->spec->train.batch_size;
    if (t->gpt)
        return tokens_evaluate(t, json);
    int rc = mge_evaluate(t->g, &t->model, &t->test, batch, &t->test_loss, &t->test_acc);
    if (rc != MGE_OK)
        return rc;
    if (json)
        printf("{\"epoch\":%lld,\"step\":%lld,\"test_accuracy\":%.6f,\"test_loss\":%.6f}\n",
               (long long)t->epoch, (long long)t->step, t->test_acc, t->test_loss);
    else
        printf("epoch %lld: test accuracy %.2f%%, test loss %.4f\n", (long long)t->epoch,
               100.0 * t->test_acc, t->test_loss);
    fflush(stdout);
    return MGE_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- data parallelism ---- */

/* Op timing hook: every op of a traced step on the compute track. */
static void trace_op(void *ctx, int node, double t0, double t1)
{
    struct trainer *t = ctx;
    int bwd = 0;
    if (!t->tracing)
        return;
    const char *op = mge_graph_node_op(t->g, node, &bwd);
    char args[64];
    snprintf(args, sizeof(args), "\"node\":%d", node);
    mge_trace_event(&t->trace, TRACK_COMPUTE, op, bwd ? "backward" : "forward", t0, t1, args);
}

static int trace_open(struct trainer *t)
{
    char path[1200];
    if (t->world > 1 && t->rank > 0)
        snprintf(path, sizeof(path), "%s.%d", t->opts->profile_path, t->rank);
    else
        snprintf(path, sizeof(path), "%s", t->opts->profile_path);
    int rc = mge_trace_open(&t->trace, path, t->rank, now_sec());
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-train: --profile: cannot create '%s': %s\n", path, strerror(errno));
        return rc;
    }
    mge_trace_track(&t->trace, TRACK_COMPUTE, "compute (forward, backward, optimiser)");
    mge_trace_track(&t->trace, TRACK_COMM, "comm (all-reduce per pack)");
    t->trace_until = t->step + TRACE_STEPS;
    mge_graph_set_op_hook(t->g, trace_op, t);
    return MGE_OK;
}

/* Broadcast @bytes of device memory @p from rank 0 (through a host copy off the host). */
static int dev_broadcast(struct trainer *t, void *p, size_t bytes)
{
    if (t->dev->host_visible || t->cdev) /* NCCL reads and writes the arenas themselves */
        return mge_comm_broadcast(t->comm, p, bytes, 0);
    void *h = mge_malloc_aligned(bytes ? bytes : 64);
    if (!h)
        return MGE_ERR(MGE_NOMEM, "cannot allocate a %zu-byte broadcast buffer", bytes);
    t->dev->d2h(h, p, bytes);
    int rc = mge_comm_broadcast(t->comm, h, bytes, 0);
    if (rc == MGE_OK)
        t->dev->h2d(p, h, bytes);
    mge_free_aligned(h);
    return rc;
}

/*
 * Broadcast @bytes (at most 32) of host memory @h from rank 0: directly, or with collectives on
 * device memory (cdev) through the device scratch buffer, by explicit copies.
 */
static int host_broadcast(struct trainer *t, void *h, size_t bytes)
{
    if (!t->cdev)
        return mge_comm_broadcast(t->comm, h, bytes, 0);
    t->dev->h2d(t->scratch, h, bytes);
    int rc = mge_comm_broadcast(t->comm, t->scratch, bytes, 0);
    if (rc == MGE_OK)
        t->dev->d2h(h, t->scratch, bytes);
    return rc;
}

/* Rank 0's parameters, optimiser state and position go to every rank (fresh start or resume). */
static int dist_sync_state(struct trainer *t)
{
    int64_t n;
    float *params = mge_graph_params(t->g, &n);
    int64_t meta[4] = {t->step, t->epoch, t->pos, t->optim.t};
    double metad[2] = {t->last_loss, t->test_acc};
    const char *sname;
    int rc = dev_broadcast(t, params, sizeof(float) * (size_t)n);
    for (int i = 0; i < mge_optim_n_states(&t->optim) && rc == MGE_OK; i++)
        rc = dev_broadcast(t, mge_optim_state(&t->optim, i, &sname),
                           sizeof(float) * (size_t)t->optim.n);
    if (rc == MGE_OK)
        rc = host_broadcast(t, meta, sizeof(meta));
    if (rc == MGE_OK)
        rc = host_broadcast(t, metad, sizeof(metad));
    if (rc != MGE_OK)
        return rc;
    t->step = meta[0];
    t->epoch = meta[1];
    t->pos = meta[2];
    t->optim.t = meta[3];
    t->last_loss = metad[0];
    t->test_acc = metad[1];
    return MGE_OK;
}

/* train.optimizer.decay_1d: false: every 1-D trained parameter (biases, norm weights and
 * biases) is kept out of weight decay, the nanoGPT/PyTorch param-group convention. */
static int optim_exclude_1d(struct trainer *t)
{
    if (!t->spec->train.optim.no_decay_1d)
        return MGE_OK;
    for (int i = 0; i < mge_graph_n_params(t->g); i++) {
        int p = mge_graph_param(t->g, i);
        size_t off, bytes;
        int rc;
        if (mge_value_ndim(t->g, p) != 1 || mge_graph_grad(t->g, p) < 0 ||
            mge_graph_grad_span(t->g, p, &off, &bytes) != MGE_OK)
            continue;
        rc = mge_optim_exclude_decay(&t->optim, (int64_t)(off / sizeof(float)),
                                     (int64_t)(bytes / sizeof(float)));
        if (rc != MGE_OK)
            return rc;
    }
    return MGE_OK;
}

/* train.clip_grad_norm: clip the whole (reduced) gradient before any update. */
static void clip_grads(struct trainer *t, float *grads, int64_t n_grads)
{
    double max_norm = t->spec->train.clip_grad_norm;
    if (max_norm > 0.0)
        t->grad_norm = mge_optim_clip_on(t->dev, grads, n_grads, max_norm);
}

/* ---- the device seam: the optimiser as a device kernel, results back by copy ---- */

struct dev_update {
    struct trainer *t;
    float *params, *grads; /* device memory */
    int64_t n_grads, first, count;
    int clip, range; /* clip first (the whole gradient); update [first, first + count) only */
};

static void dev_update_run(void *ctx)
{
    struct dev_update *u = ctx;
    if (u->clip)
        clip_grads(u->t, u->grads, u->n_grads);
    if (u->range)
        mge_optim_step_range(&u->t->optim, u->params, u->grads, u->t->step, u->first, u->count);
    else
        mge_optim_step(&u->t->optim, u->params, u->grads, u->t->step);
}

/* Clip (when @clip) and apply the update, on the device: the whole arena, or with @range the
 * floats [@first, @first + @count) after mge_optim_step_begin(). */
static void dev_update(struct trainer *t, float *params, float *grads, int64_t n_grads, int clip,
                       int range, int64_t first, int64_t count)
{
    struct dev_update u = {t, params, grads, n_grads, first, count, clip, range};
    t->dev->kernel(dev_update_run, &u);
}

/* The last run's loss, copied off the device. */
static float loss_now(struct trainer *t)
{
    float lv = NAN;
    mge_value_read(t->g, t->model.loss, &lv, sizeof(lv));
    return lv;
}

/*
 * Off the host, collectives and exact sums work on t->grads_host: the gradient-ready hook
 * copies each newly final prefix of the gradient arena there before handing it to the packs
 * (NCCL would read device memory itself; MPI here reads host memory).
 */
static void dev_ready_hook(void *ctx, size_t ready)
{
    struct trainer *t = ctx;
    float *grads = mge_graph_grads(t->g, NULL);
    if (ready > t->mirrored) {
        t->dev->d2h((char *)t->grads_host + t->mirrored, (char *)grads + t->mirrored,
                    ready - t->mirrored);
        t->mirrored = ready;
    }
    mge_comm_packs_ready_hook(t->packs, ready);
}

/* Packs over the gradient arena, cut at gradient boundaries; their all-reduces start from the
 * gradient-ready hook. The first pack is small (1 MiB at most) so communication starts early. */
static int dist_packs_init(struct trainer *t)
{
    int np = mge_graph_n_params(t->g), n_cuts = 0;
    size_t *cuts = mge_malloc(sizeof(size_t) * (size_t)(np + 1));
    size_t pack = (size_t)(t->spec->distributed.pack_mb * 1048576.0);
    size_t first = pack < ((size_t)1 << 20) ? pack : (size_t)1 << 20;
    int64_t n_grads;
    float *grads = mge_graph_grads(t->g, &n_grads);
    if (!cuts)
        return MGE_ERR(MGE_NOMEM, "cannot allocate packs");
    for (int i = 0; i < np; i++) {
        size_t off, bytes;
        if (mge_graph_grad(t->g, mge_graph_param(t->g, i)) >= 0 &&
            mge_graph_grad_span(t->g, mge_graph_param(t->g, i), &off, &bytes) == MGE_OK)
            cuts[n_cuts++] = off;
    }
    pack = pack < sizeof(float) ? sizeof(float) : pack;
    int rc = mge_comm_packs_new(&t->packs, t->comm, t->grads_host ? t->grads_host : grads,
                                sizeof(float) * (size_t)n_grads, cuts, n_cuts, first, pack);
    mge_free(cuts);
    if (rc == MGE_OK && t->grads_host)
        mge_graph_set_grad_hook(t->g, dev_ready_hook, t);
    else if (rc == MGE_OK)
        mge_graph_set_grad_hook(t->g, mge_comm_packs_ready_hook, t->packs);
    return rc;
}

/* What one data-parallel step measured (seconds). */
struct dist_stats {
    double compute; /* forward + backward, from the bound batch to the last gradient */
    double comm;    /* all collectives of the step, as they ran on the communication thread */
    double hidden;  /* the part of comm that ran while backward still computed */
    double wait;    /* the training thread blocked on collectives */
    double wait_cpu; /* CPU time the training thread spent inside those waits (MPI polls) */
};

static double overlap(double a0, double a1, double b0, double b1)
{
    double lo = a0 > b0 ? a0 : b0, hi = a1 < b1 ? a1 : b1;
    return hi > lo ? hi - lo : 0.0;
}

/*
 * One data-parallel step: forward and backward on this rank's rows with the loss scaled by
 * n_local / global_n (so the sum over ranks is the gradient of the global mean loss), packs
 * all-reduced as backward finishes them, each pack's slice updated as soon as its sum is in.
 * *@loss is the global mean loss.
 */
/* Point the model's inputs at batch @b: its samples, or a gpt's token windows. */
static void bind_batch(struct trainer *t, const struct mge_batch *b)
{
    mge_graph_bind(t->g, t->model.x, t->gpt ? (void *)t->tok_x : (void *)b->x);
    mge_graph_bind(t->g, t->model.y, t->gpt ? t->tok_y : b->y);
}

static int dist_step(struct trainer *t, const struct mge_batch *b, double *loss,
                     struct dist_stats *st)
{
    int64_t n_grads;
    float *params = mge_graph_params(t->g, NULL);
    float *grads = mge_graph_grads(t->g, &n_grads);
    float *cgrads = t->grads_host ? t->grads_host : grads; /* what the collectives sum */
    double t0 = now_sec(), t_bwd, w0, lsum[1];
    struct mge_comm_timing lt = {0, 0};
    uint64_t lticket;
    int rc;
    memset(st, 0, sizeof(*st));
    mge_comm_packs_begin(t->packs);
    t->mirrored = 0;
    if (b->n > 0) {
        bind_batch(t, b);
        mge_graph_set_batch(t->g, b->n);
        mge_graph_set_loss_scale(t->g, (float)((double)b->n / (double)b->global_n));
        mge_graph_set_row_offset(t->g, mge_split_start(b->global_n, t->rank, t->world));
        if ((rc = mge_graph_run(t->g, MGE_RUN_TRAIN, t->step)) != MGE_OK)
            return rc;
    } else { /* no rows for this rank in a short batch: it adds zeros, but it must take part */
        if (t->cdev)
            t->dev->memset(cgrads, 0, sizeof(float) * (size_t)n_grads);
        else
            memset(cgrads, 0, sizeof(float) * (size_t)n_grads);
        mge_comm_packs_ready(t->packs, sizeof(float) * (size_t)n_grads);
    }
    t_bwd = now_sec();
    st->compute = t_bwd - t0;
    lsum[0] = b->n > 0 ? (double)loss_now(t) * (double)b->n : 0.0;
    if (t->cdev) /* the loss's sum goes by NCCL too: in device memory, behind the packs */
        t->dev->h2d(t->scratch, lsum, sizeof(lsum));
    if ((rc = mge_comm_allreduce_start(t->comm, t->cdev ? (void *)t->scratch : (void *)lsum, 1,
                                       MGE_COMM_F64, &lticket)) != MGE_OK)
        return rc;
    mge_optim_step_begin(&t->optim);
    /* clipping needs the global norm of the whole sum: update only once every pack is in */
    int clip = t->spec->train.clip_grad_norm > 0.0;
    for (int i = 0; i < mge_comm_packs_count(t->packs); i++) {
        double c0 = thread_cpu_sec();
        w0 = now_sec();
        if ((rc = mge_comm_packs_wait(t->packs, i)) != MGE_OK)
            return rc;
        double w1 = now_sec();
        st->wait += w1 - w0;
        st->wait_cpu += thread_cpu_sec() - c0;
        const struct mge_comm_pack *k = mge_comm_packs_get(t->packs, i);
        if (t->grads_host) /* the sum goes back to the device */
            t->dev->h2d(grads + k->first, cgrads + k->first, sizeof(float) * k->count);
        if (!clip)
            dev_update(t, params, grads, n_grads, 0, 1, (int64_t)k->first, (int64_t)k->count);
        st->comm += k->timing.end - k->timing.start;
        st->hidden += overlap(k->timing.start, k->timing.end, t0, t_bwd);
        if (t->tracing) {
            char name[48], args[96];
            snprintf(name, sizeof(name), "allreduce pack %d", i);
            snprintf(args, sizeof(args), "\"bytes\":%zu,\"ready_ms\":%.3f", 4 * k->count,
                     1e3 * (k->ready_at - t->trace.origin));
            mge_trace_event(&t->trace, TRACK_COMM, name, "comm", k->timing.start, k->timing.end,
                            args);
            if (w1 - w0 > 1e-6)
                mge_trace_event(&t->trace, TRACK_COMPUTE, "wait", "comm", w0, w1, NULL);
            mge_trace_event(&t->trace, TRACK_COMPUTE, "optimizer", "optimizer", w1, now_sec(),
                            NULL);
        }
    }
    if (clip) {
        double o0 = now_sec();
        dev_update(t, params, grads, n_grads, 1, 1, 0, t->optim.n);
        if (t->tracing)
            mge_trace_event(&t->trace, TRACK_COMPUTE, "optimizer", "optimizer", o0, now_sec(),
                            NULL);
    }
    w0 = now_sec();
    double c0 = thread_cpu_sec();
    if ((rc = mge_comm_wait(t->comm, lticket, &lt)) != MGE_OK)
        return rc;
    if (t->cdev)
        t->dev->d2h(lsum, t->scratch, sizeof(lsum));
    st->wait += now_sec() - w0;
    st->wait_cpu += thread_cpu_sec() - c0;
    st->comm += lt.end - lt.start;
    if (t->tracing)
        mge_trace_event(&t->trace, TRACK_COMM, "allreduce loss", "comm", lt.start, lt.end, NULL);
    *loss = lsum[0] / (double)b->global_n;
    return MGE_OK;
}

/* Buffers of deterministic mode: the fixed-point sums and one micro-shard's rows. */
static int det_init(struct trainer *t)
{
    int64_t n_grads, S = t->spec->distributed.micro_shards;
    int64_t rows = (t->spec->train.batch_size + S - 1) / S;
    mge_graph_grads(t->g, &n_grads);
    mge_sampler_rank_shards(&t->sampler, &t->det_first, &t->det_end);
    t->det_acc = mge_malloc(sizeof(int64_t) * (size_t)(n_grads + 1));
    t->det_x = mge_malloc_aligned(sizeof(float) * (size_t)(rows * t->train.dim));
    t->det_y = mge_malloc(sizeof(int32_t) * (size_t)rows);
    if (!t->det_acc || !t->det_x || !t->det_y)
        return MGE_ERR(MGE_NOMEM, "cannot allocate the buffers of deterministic mode");
    return MGE_OK;
}

/*
 * One deterministic step: each of this rank's micro-shards runs forward and backward alone
 * (loss scaled by its rows / global_n, dropout rows at its global offset), and its gradient and
 * loss * rows / global_n go into the fixed-point sums; one int64 all-reduce adds the ranks'
 * sums. Integer sums are exact, so the reduced gradient and loss have the same bits for any
 * world size and any split of micro-shards over ranks; the optimiser then runs on identical
 * input everywhere. A value outside the sums' range (mge_exact_limit; a diverging run) fails
 * the step with MGE_RANGE rather than wrap.
 * Each micro-shard's rows are copied to one aligned buffer first, so the kernels see the same
 * addresses' alignment on every rank. *@loss is the global mean loss.
 */
static int det_step(struct trainer *t, const struct mge_batch *b, double *loss,
                    struct dist_stats *st)
{
    int64_t n_grads, S = t->spec->distributed.micro_shards, dim = t->train.dim;
    float *params = mge_graph_params(t->g, NULL);
    float *grads = mge_graph_grads(t->g, &n_grads);
    float *hgrads = t->grads_host ? t->grads_host : grads; /* what the exact sums read */
    int64_t base = mge_split_start(b->global_n, t->det_first, S);
    double t0 = now_sec(), t1;
    struct mge_comm_timing ct = {0, 0};
    uint64_t ticket;
    size_t bad = 0;
    int rc;
    memset(st, 0, sizeof(*st));
    memset(t->det_acc, 0, sizeof(int64_t) * (size_t)(n_grads + 1));
    for (int k = t->det_first; k < t->det_end; k++) {
        int64_t row0 = mge_split_start(b->global_n, k, S);
        int64_t rows = mge_split_start(b->global_n, k + 1, S) - row0;
        if (rows == 0) /* a short last batch leaves some micro-shards empty */
            continue;
        memcpy(t->det_x, b->x + (row0 - base) * dim, sizeof(float) * (size_t)(rows * dim));
        memcpy(t->det_y, b->y + (row0 - base), sizeof(int32_t) * (size_t)rows);
        mge_graph_bind(t->g, t->model.x, t->det_x);
        mge_graph_bind(t->g, t->model.y, t->det_y);
        mge_graph_set_batch(t->g, rows);
        mge_graph_set_loss_scale(t->g, (float)((double)rows / (double)b->global_n));
        mge_graph_set_row_offset(t->g, row0);
        if ((rc = mge_graph_run(t->g, MGE_RUN_TRAIN, t->step)) != MGE_OK)
            return rc;
        if (t->grads_host)
            t->dev->d2h(hgrads, grads, sizeof(float) * (size_t)n_grads);
        if (mge_exact_add_f32(t->det_acc, hgrads, (size_t)n_grads, (int)S, &bad) != MGE_OK) {
            fprintf(stderr,
                    "mge-train: step %lld, micro-shard %d: gradient element %zu is %g, "
                    "outside the exact sum's range (|x| <= %g with %lld micro-shards)\n",
                    (long long)t->step + 1, k, bad, (double)hgrads[bad], mge_exact_limit((int)S),
                    (long long)S);
            return MGE_RANGE;
        }
        /* the loss as its share of the global mean, so its range is that of the loss */
        float loss_val = loss_now(t);
        double lshare = (double)loss_val * (double)rows / (double)b->global_n;
        if (mge_exact_add_f64(t->det_acc + n_grads, lshare, (int)S) != MGE_OK) {
            fprintf(stderr,
                    "mge-train: step %lld, micro-shard %d: loss %g is outside the exact "
                    "sum's range (|loss * rows / batch| <= %g)\n",
                    (long long)t->step + 1, k, (double)loss_val, mge_exact_limit((int)S));
            return MGE_RANGE;
        }
    }
    t1 = now_sec();
    st->compute = t1 - t0;
    double c0 = thread_cpu_sec();
    if ((rc = mge_comm_allreduce_queue(t->comm, t->det_acc, (size_t)(n_grads + 1), MGE_COMM_I64,
                                       &ticket)) != MGE_OK ||
        (rc = mge_comm_wait(t->comm, ticket, &ct)) != MGE_OK)
        return rc;
    st->wait = now_sec() - t1;
    st->wait_cpu = thread_cpu_sec() - c0;
    st->comm = ct.end - ct.start;
    mge_exact_to_f32(hgrads, t->det_acc, (size_t)n_grads);
    if (t->grads_host)
        t->dev->h2d(grads, hgrads, sizeof(float) * (size_t)n_grads);
    dev_update(t, params, grads, n_grads, 1, 0, 0, n_grads);
    if (t->tracing) {
        mge_trace_event(&t->trace, TRACK_COMM, "allreduce exact", "comm", ct.start, ct.end, NULL);
        mge_trace_event(&t->trace, TRACK_COMPUTE, "optimizer", "optimizer", t1 + st->wait,
                        now_sec(), NULL);
    }
    *loss = mge_exact_to_f64(t->det_acc[n_grads]);
    return MGE_OK;
}

/* FNV-1a (64-bit) of @n bytes at @p, continuing from @h. */
static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 0x100000001b3ULL;
    return h;
}

/* A hash of the parameters and optimiser state: equal hashes across runs mean the runs left
 * the same model bits (deterministic mode prints it; checkpoints also hold the spec text). */
static uint64_t state_hash(struct trainer *t)
{
    int64_t n;
    const char *sname;
    const float *params = mge_graph_params(t->g, &n);
    size_t pbytes = sizeof(float) * (size_t)n, sbytes = sizeof(float) * (size_t)t->optim.n;
    void *host = t->dev->host_visible ? NULL : mge_malloc_aligned(pbytes ? pbytes : 64);
    if (!t->dev->host_visible && !host)
        return 0;
    if (host) /* off the host: hash copies */
        t->dev->d2h(host, params, pbytes);
    uint64_t h = fnv1a(0xcbf29ce484222325ULL, host ? host : params, pbytes);
    for (int i = 0; i < mge_optim_n_states(&t->optim); i++) {
        const float *sd = mge_optim_state(&t->optim, i, &sname);
        if (host)
            t->dev->d2h(host, sd, sbytes);
        h = fnv1a(h, host ? host : sd, sbytes);
    }
    mge_free_aligned(host);
    return h;
}

/* Eager mode: the parameters after this step's update, checked as op outputs are. */
static int eager_check_update(struct trainer *t)
{
    char what[96];
    snprintf(what, sizeof(what), "optimiser %s, lr %.3g",
             mge_optim_type_name(t->spec->train.optim.type), mge_optim_lr(&t->optim, t->step));
    return mge_graph_eager_check_params(t->g, t->step, what);
}

/*
 * Off the host, on the single-process path: take the next step's batch now and stage it
 * (mge_graph_stage: pinned buffer, copy stream), so that its host -> device copy overlaps the
 * kernels of this step still in flight. The next step then trains on it without binding.
 * Data parallel and deterministic steps, and gpt's token windows, stage in their run instead.
 */
static int stage_ahead(struct trainer *t)
{
    int rc;
    if (t->dev->host_visible || t->gpt || t->step + 1 >= t->total_steps)
        return MGE_OK;
    if ((rc = mge_loader_next(&t->loader, &t->ahead)) != MGE_OK)
        return rc;
    bind_batch(t, t->ahead);
    mge_graph_set_batch(t->g, t->ahead->n);
    return mge_graph_stage(t->g);
}

/* A SIGUSR2 asks for a checkpoint at the next step boundary (rank 0 writes it), and training
 * goes on: the coordinator asks so before it preempts a job, so that no step is lost; a user
 * may send it too. Under mpirun every rank gets it (mpirun forwards SIGUSR2). */
static volatile sig_atomic_t g_ckpt_asked;

static void on_ckpt_signal(int sig)
{
    (void)sig;
    g_ckpt_asked = 1;
}

void mge_train_signals_init(void)
{
    struct sigaction sa;
    sigset_t set;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_ckpt_signal; /* for threads that started before this call */
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR2, &sa, NULL);
    sigemptyset(&set);
    sigaddset(&set, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

/* Whether a checkpoint was asked for since the last call: a SIGUSR2 pending (blocked, see
 * mge_train_signals_init) or taken by a thread that had it unblocked. */
static int ckpt_signal_taken(void)
{
    sigset_t set;
    struct timespec zero = {0, 0};
    int asked = g_ckpt_asked;
    g_ckpt_asked = 0;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR2);
    while (sigtimedwait(&set, NULL, &zero) == SIGUSR2)
        asked = 1;
    return asked;
}

static int train_loop(struct trainer *t)
{
    const struct mge_jobspec *spec = t->spec;
    const struct mge_train_opts *o = t->opts;
    int64_t ce = spec->train.checkpoint_every, le = spec->train.log_every > 0 ? spec->train.log_every : 1;
    double ce_sec = (double)spec->train.checkpoint_every_sec;
    double train_sec = 0.0, wall0 = now_sec(), last_ckpt = wall0, loop_ckpt_sec = 0.0;
    double writer_cpu_sec = 0.0;
    int64_t samples = 0, first_step = t->step, n_times = 0;
    int rc = MGE_OK, lead = t->rank == 0, par = t->dist || t->det;
    /* per-step times: the median is what a noisy shared machine cannot spoil */
    size_t n_slots = (size_t)(t->total_steps - t->step + 1);
    double *times = mge_malloc(sizeof(double) * n_slots);
    double *cpu_t = mge_malloc(sizeof(double) * n_slots); /* outside collective waits */
    double *compute_t = par ? mge_malloc(sizeof(double) * n_slots) : NULL;
    double *comm_t = par ? mge_malloc(sizeof(double) * n_slots) : NULL;
    double *wait_t = par ? mge_malloc(sizeof(double) * n_slots) : NULL;
    double comm_sum = 0.0, hidden_sum = 0.0;
    if (!times || !cpu_t || (par && (!compute_t || !comm_t || !wait_t))) {
        mge_free(times);
        mge_free(cpu_t);
        mge_free(compute_t);
        mge_free(comm_t);
        mge_free(wait_t);
        return MGE_ERR(MGE_NOMEM, "cannot allocate step timers");
    }
    int64_t n_params, n_grads;
    float *params = mge_graph_params(t->g, &n_params);
    float *grads = mge_graph_grads(t->g, &n_grads);
    const char *prof = getenv("MGE_PROFILE");
    if (prof && *prof && strcmp(prof, "0") && mge_graph_profile(t->g, 1) != MGE_OK)
        return MGE_NOMEM;

    while (t->step < t->total_steps) {
        struct mge_batch *b, cur;
        struct dist_stats ds = {0, 0, 0, 0, 0};
        double t0 = now_sec(), c0 = thread_cpu_sec();
        if (t->ahead)
            b = t->ahead;
        else if (t->gpt)
            b = tokens_next(t);
        else if ((rc = mge_loader_next(&t->loader, &b)) != MGE_OK)
            goto out_free;
        t->ahead = NULL;
        cur = *b; /* the loader may reuse its slot once the next batch is taken early */
        b = &cur;
        t->tracing = t->step < t->trace_until;
        if (par) {
            rc = t->det ? det_step(t, b, &t->last_loss, &ds) : dist_step(t, b, &t->last_loss, &ds);
            if (rc != MGE_OK)
                goto out_free;
            compute_t[n_times] = ds.compute;
            comm_t[n_times] = ds.comm;
            wait_t[n_times] = ds.wait;
            comm_sum += ds.comm;
            hidden_sum += ds.hidden;
        } else {
            if (!mge_graph_is_staged(t->g)) {
                bind_batch(t, b);
                mge_graph_set_batch(t->g, b->n);
            }
            if ((rc = mge_graph_run(t->g, MGE_RUN_TRAIN, t->step)) != MGE_OK)
                goto out_free;
            double o0 = now_sec();
            dev_update(t, params, grads, n_grads, 1, 0, 0, n_grads);
            if (t->tracing)
                mge_trace_event(&t->trace, TRACK_COMPUTE, "optimizer", "optimizer", o0,
                                now_sec(), NULL);
            if ((rc = stage_ahead(t)) != MGE_OK)
                goto out_free;
            t->last_loss = loss_now(t);
        }
        if (mge_graph_is_eager(t->g) && (rc = eager_check_update(t)) != MGE_OK)
            goto out_free;
        times[n_times] = now_sec() - t0;
        cpu_t[n_times] = thread_cpu_sec() - c0 - ds.wait_cpu;
        if (t->tracing) {
            char name[32];
            snprintf(name, sizeof(name), "step %lld", (long long)t->step);
            mge_trace_event(&t->trace, 0, name, "step", t0, t0 + times[n_times], NULL);
        }
        train_sec += times[n_times++];
        samples += par ? b->global_n : b->n;
        t->step++;
        if (!isfinite(t->last_loss)) {
            fprintf(stderr, "mge-train: loss is %f at step %lld: diverged\n", t->last_loss,
                    (long long)t->step);
            rc = MGE_RANGE;
            goto out_free;
        }
        /* epochs completed after this step: the step line that ends an epoch says 1, as the
         * evaluation line of the same step does (the coordinator keeps one value per step) */
        t->epoch = b->epoch_end ? b->epoch + 1 : b->epoch;
        t->pos = b->epoch_end ? 0 : b->pos_after;
        if (lead && (t->step % le == 0 || t->step == t->total_steps)) {
            double sps = samples / (train_sec > 0 ? train_sec : 1e-9);
            double lr = mge_optim_lr(&t->optim, t->step - 1);
            char gn[48] = ""; /* the norm before clipping, when clipping is on */
            if (spec->train.clip_grad_norm > 0.0)
                snprintf(gn, sizeof(gn), ",\"grad_norm\":%.7g", t->grad_norm);
            if (o->json && t->det) /* loss_bits: the double's exact bits, to compare runs */
                printf("{\"step\":%lld,\"loss\":%.7g,\"loss_bits\":\"%a\","
                       "\"samples_per_sec\":%.1f,\"lr\":%.6g,\"epoch\":%lld,"
                       "\"compute_ms\":%.3f,\"comm_ms\":%.3f,\"comm_wait_ms\":%.3f%s}\n",
                       (long long)t->step, t->last_loss, t->last_loss, sps, lr, (long long)b->epoch,
                       1e3 * ds.compute, 1e3 * ds.comm, 1e3 * ds.wait, gn);
            else if (o->json && t->dist)
                printf("{\"step\":%lld,\"loss\":%.7g,\"samples_per_sec\":%.1f,\"lr\":%.6g,"
                       "\"epoch\":%lld,\"compute_ms\":%.3f,\"comm_ms\":%.3f,"
                       "\"comm_hidden_ms\":%.3f,\"comm_wait_ms\":%.3f%s}\n",
                       (long long)t->step, t->last_loss, sps, lr, (long long)t->epoch,
                       1e3 * ds.compute, 1e3 * ds.comm, 1e3 * ds.hidden, 1e3 * ds.wait, gn);
            else if (o->json)
                printf("{\"step\":%lld,\"loss\":%.7g,\"samples_per_sec\":%.1f,\"lr\":%.6g,"
                       "\"epoch\":%lld%s}\n",
                       (long long)t->step, t->last_loss, sps, lr, (long long)t->epoch, gn);
            else if (t->step % 100 == 0 || t->step == t->total_steps)
                printf("step %lld/%lld  loss %.4f  %.0f samples/s\n", (long long)t->step,
                       (long long)t->total_steps, t->last_loss, sps);
        }
        /* rank 0 alone evaluates and writes checkpoints (have_test is 0 elsewhere) */
        if (b->epoch_end && t->have_test && spec->train.eval_every_epoch &&
            (rc = evaluate_epoch(t, o->json)) != MGE_OK)
            goto out_free;
        /* a gpt has no epochs: its held-out loss comes at every checkpoint_every steps */
        if (t->gpt && t->have_test && ce > 0 && t->step % ce == 0 && t->step < t->total_steps &&
            (rc = evaluate_epoch(t, o->json)) != MGE_OK)
            goto out_free;
        int asked = ckpt_signal_taken();
        if (lead && t->step < t->total_steps &&
            ((ce > 0 && t->step % ce == 0) || (ce_sec > 0 && now_sec() - last_ckpt >= ce_sec) ||
             asked)) {
            if (asked)
                fprintf(stderr, "mge-train: checkpoint of step %lld on request (SIGUSR2)\n",
                        (long long)t->step);
            if ((rc = ckpt_save(t, 0)) != MGE_OK)
                goto out_free;
            last_ckpt = now_sec();
        }
    }
    if (t->trace.fp && (rc = mge_trace_close(&t->trace)) != MGE_OK)
        goto out_free;
    /* a run that ends mid-epoch still reports the model it leaves */
    if (t->have_test && (t->pos != 0 || !spec->train.eval_every_epoch || t->gpt) &&
        (rc = evaluate_epoch(t, o->json)) != MGE_OK)
        goto out_free;
    if (!lead)
        goto out_free;
    loop_ckpt_sec = t->ckpt_sec; /* the final checkpoint is not part of any step */
    {
        char err[512];
        if ((rc = mge_ckpt_writer_wait(t->ckw, err, sizeof(err))) != MGE_OK) {
            fprintf(stderr, "mge-train: checkpoint: %s\n", err);
            goto out_free;
        }
    }
    writer_cpu_sec = mge_ckpt_writer_cpu_sec(t->ckw);
    if ((rc = ckpt_save(t, 1)) != MGE_OK)
        goto out_free;
    mge_graph_profile_print(t->g, stderr, n_times);
    qsort(times, (size_t)n_times, sizeof(double), cmp_double);
    double median_ms = n_times ? 1000.0 * times[n_times / 2] : 0.0;
    qsort(cpu_t, (size_t)n_times, sizeof(double), cmp_double);
    double median_cpu_ms = n_times ? 1000.0 * cpu_t[n_times / 2] : 0.0;
    double wall = now_sec() - wall0;
    double sps = samples / (train_sec > 0 ? train_sec : 1e-9);
    size_t peak = t->stats.param_bytes + t->stats.grad_bytes + mge_optim_state_bytes(&t->optim) +
                  t->stats.activation_bytes;
    /* what the engine allocates besides the plan: the loader's buffers, the sampler's
     * permutation, and the checkpoint writer's snapshot and buffer (rank 0 saves) */
    size_t loader_bytes = (size_t)t->loader.nbuf * (size_t)t->loader.local_max *
                              ((size_t)t->train.dim * sizeof(float) + sizeof(int32_t)) +
                          (size_t)t->train.n * sizeof(*t->sampler.perm) +
                          mge_ckpt_writer_bytes(t->ckw);
    long long counted = mge_alloc_peak() - t->alloc_base;
    long hwm = proc_status_bytes("VmHWM");
    long measured = t->rss_base > 0 && hwm > 0 ? hwm - t->rss_base : -1;
    if (o->json) {
        printf("{\"summary\":true,\"engine_planned_bytes\":%zu,\"engine_measured_bytes\":%ld,"
               "\"engine_counted_bytes\":%lld,",
               peak + loader_bytes, measured, counted);
        if (par) {
            qsort(compute_t, (size_t)n_times, sizeof(double), cmp_double);
            qsort(comm_t, (size_t)n_times, sizeof(double), cmp_double);
            qsort(wait_t, (size_t)n_times, sizeof(double), cmp_double);
            printf("\"backend\":\"%s\",\"ranks\":%d,\"packs\":%d,\"median_compute_ms\":%.4f,"
                   "\"median_comm_ms\":%.4f,\"median_comm_wait_ms\":%.4f,"
                   "\"comm_hidden_fraction\":%.4f,",
                   mge_comm_backend_name(mge_comm_backend(t->comm)), t->world,
                   t->packs ? mge_comm_packs_count(t->packs) : 0,
                   n_times ? 1e3 * compute_t[n_times / 2] : 0.0,
                   n_times ? 1e3 * comm_t[n_times / 2] : 0.0,
                   n_times ? 1e3 * wait_t[n_times / 2] : 0.0,
                   comm_sum > 0 ? hidden_sum / comm_sum : 0.0);
            if (t->det)
                printf("\"deterministic\":true,\"micro_shards\":%d,\"state_hash\":\"%016llx\",",
                       t->spec->distributed.micro_shards, (unsigned long long)state_hash(t));
        }
        printf("\"steps\":%lld,\"epochs\":%lld,\"final_loss\":%.9g,",
               (long long)t->step, (long long)t->epoch, t->last_loss);
        if (t->have_test && !t->gpt)
            printf("\"test_accuracy\":%.6f,\"test_loss\":%.6f,", t->test_acc, t->test_loss);
        if (t->gpt && t->have_test)
            printf("\"test_loss\":%.6f,", t->test_loss);
        if (t->gpt)
            printf("\"tokens_per_sec\":%.1f,", sps * (double)spec->model.context);
        printf("\"samples_per_sec\":%.1f,\"peak_bytes\":%zu,\"peak_rss_bytes\":%ld,"
               "\"train_sec\":%.3f,\"wall_sec\":%.3f,\"steps_run\":%lld,\"median_step_ms\":%.4f,"
               "\"median_step_cpu_ms\":%.4f,"
               "\"mean_step_ms\":%.4f,\"checkpoint_ms\":%.3f,\"checkpoint_writer_cpu_ms\":%.3f,"
               "\"threads\":%d,\"gemm\":\"%s\",\"cpu_isa\":\"%s\",\"precision\":\"%s\","
               "\"device\":\"%s\",\"checkpoint\":\"%s/latest.mgeckpt\"}\n",
               sps, peak, peak_rss_bytes(), train_sec, wall, (long long)(t->step - first_step),
               median_ms, median_cpu_ms,
               n_times ? 1e3 * (train_sec + loop_ckpt_sec) / (double)n_times : 0.0,
               1e3 * loop_ckpt_sec, 1e3 * writer_cpu_sec, mge_cpu_threads(),
               mge_cpu_sgemm_backend(), mge_cpu_isa(), mge_train_precision(t->spec), t->dev->name,
               t->out_dir);
    } else {
        printf("done: %lld steps, final loss %.4f", (long long)t->step, t->last_loss);
        if (t->have_test && !t->gpt)
            printf(", test accuracy %.2f%%", 100.0 * t->test_acc);
        if (t->have_test && t->gpt)
            printf(", test loss %.4f", t->test_loss);
        printf(", %.0f samples/s, peak %.1f MiB planned, %.1f MiB RSS\n", sps,
               (double)peak / 1048576.0, (double)peak_rss_bytes() / 1048576.0);
        printf("checkpoint: %s/latest.mgeckpt\n", t->out_dir);
    }
    fflush(stdout);
out_free:
    mge_trace_close(&t->trace);
    mge_free(times);
    mge_free(cpu_t);
    mge_free(compute_t);
    mge_free(comm_t);
    mge_free(wait_t);
    return rc;
}

static void trainer_fini(struct trainer *t)
{
    mge_free_aligned(t->grads_host);
    if (t->scratch)
        t->dev->free(t->scratch, 4 * sizeof(double));
    mge_free(t->det_acc);
    mge_free_aligned(t->det_x);
    mge_free(t->det_y);
    mge_ckpt_writer_free(t->ckw);
    mge_free(t->ck_ts);
    mge_free(t->ck_names);
    mge_comm_packs_free(t->packs);
    if (t->loader_ok)
        mge_loader_fini(&t->loader);
    if (t->sampler_ok)
        mge_sampler_fini(&t->sampler);
    if (t->optim_ok)
        mge_optim_fini(&t->optim);
    mge_graph_free(t->g);
    mge_free(t->tok_x);
    mge_free(t->tok_y);
    mge_free(t->tok_starts);
    mge_tokens_fini(&t->tok_test);
    mge_tokens_fini(&t->tok);
    mge_dataset_fini(&t->train);
    if (t->have_test)
        mge_dataset_fini(&t->test);
    mge_jobspec_free(t->spec);
}

int mge_train_main(const struct mge_train_opts *o)
{
    struct trainer t;
    struct mge_spec_error serr;
    char err[512];
    int rc, code = 1;

    memset(&t, 0, sizeof(t));
    t.opts = o;
    t.test_acc = NAN;
    rc = mge_jobspec_load(o->spec_path, o->overrides, o->n_overrides, &t.spec, &serr);
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-train: %s\n", serr.message);
        return 2;
    }
    if (o->eager && t.spec->resources.device != MGE_DEVICE_CPU) {
        fprintf(stderr,
                "mge-train: --eager runs on the cpu device only, not on resources.device "
                "%s\n",
                t.spec->resources.device == MGE_DEVICE_SIM ? "sim" : "gpu");
        code = 2;
        goto out;
    }
    t.spec->train.eager |= o->eager;
    /* the memory plan is the device's too: --plan answers for a GPU job (the coordinator
     * places it by that peak per GPU), planned on the host */
    t.dev = t.spec->resources.device == MGE_DEVICE_SIM ? &mge_device_sim : &mge_device_cpu;
    if (t.spec->resources.device == MGE_DEVICE_GPU && !o->plan_only) {
        /* a GPU rank trains on device 0 of the CUDA_VISIBLE_DEVICES its worker gave it */
        if (!(t.dev = mge_device_cuda())) {
            const char *vis = getenv("CUDA_VISIBLE_DEVICES");
            fprintf(stderr,
                    "mge-train: %s: resources.device: gpu: this build has no CUDA (built "
                    "without nvcc; CUDA_VISIBLE_DEVICES=%s): rebuild with the CUDA toolkit, or "
                    "use device: cpu\n",
                    o->spec_path, vis ? vis : "(unset)");
            code = 2;
            goto out;
        }
        if (t.dev->probe && t.dev->probe(err, sizeof(err)) != MGE_OK) {
            fprintf(stderr, "mge-train: %s: resources.device: gpu: %s\n", o->spec_path, err);
            code = 2;
            goto out;
        }
    }
    /* --plan answers for the job as a worker runs it: one thread per CPU of resources.cpus
     * (the kernels' scratch space grows with the threads: ResNet-20's peak is 3.5% larger at
     * 2 threads than at 1) */
    mge_cpu_set_threads(o->plan_only && o->threads <= 0 ? t.spec->resources.cpus : o->threads);
    /*
     * The communicator comes first, so that from here on a failure of any rank ends the job
     * (mge_comm_abort) instead of leaving the others in their next collective. Without a
     * launcher and with backend auto this is the local backend: no MPI at all.
     */
    t.world = 1;
    if (!o->plan_only && !o->max_batch) {
        mge_comm_env_read(&t.env);
        /* a rank lives no longer than its launcher (mpirun, orted, srun's stepd): Open MPI
         * cannot end survivors itself, and a rank left spinning would hold its cores */
        if (t.env.launched)
            prctl(PR_SET_PDEATHSIG, SIGKILL);
        enum mge_backend be = mge_comm_backend_resolve(t.spec->distributed.backend,
                                                       t.spec->resources.device, &t.env);
        if (be == MGE_BACKEND_NCCL && t.spec->distributed.deterministic) {
            fprintf(stderr,
                    "mge-train: %s: distributed.deterministic: its exact sums are host "
                    "memory: set distributed.backend: mpi for deterministic mode on gpu\n",
                    o->spec_path);
            code = 2;
            goto out;
        }
        /* NCCL all-reduces the cuda device's arenas (the job spec allows nccl on gpu only) */
        t.env.gpu_current = be == MGE_BACKEND_NCCL;
        if ((rc = mge_comm_open(&t.comm, be, &t.env, err, sizeof(err))) != MGE_OK) {
            fprintf(stderr, "mge-train: %s: %s\n", o->spec_path, err);
            code = 2;
            goto out;
        }
        t.rank = mge_comm_rank(t.comm);
        t.world = mge_comm_size(t.comm);
        t.dist = be != MGE_BACKEND_LOCAL;
        t.cdev = mge_comm_on_device(t.comm);
        if (t.world > t.spec->train.batch_size) {
            fprintf(stderr, "mge-train: %s: %d ranks for a global batch of %d: every rank needs "
                    "at least one sample (train.batch_size >= ranks)\n", o->spec_path, t.world,
                    t.spec->train.batch_size);
            code = 2;
            goto out;
        }
        t.det = t.spec->distributed.deterministic;
        if (t.det && t.world > t.spec->distributed.micro_shards) {
            fprintf(stderr,
                    "mge-train: %s: distributed.micro_shards: %d micro-shards over %d "
                    "ranks: every rank takes whole micro-shards (micro_shards >= ranks)\n",
                    o->spec_path, t.spec->distributed.micro_shards, t.world);
            code = 2;
            goto out;
        }
    }
    t.gpt = mge_model_reads_tokens(&t.spec->model);
    if (t.gpt && t.det) {
        fprintf(stderr,
                "mge-train: %s: distributed.deterministic: not available for model type "
                "gpt yet (its rows hold context windows, not samples)\n",
                o->spec_path);
        code = 2;
        goto out;
    }
    if ((rc = t.gpt ? tokens_load(&t, err, sizeof(err))
                    : mge_data_load(t.spec, 0, &t.train, err, sizeof(err))) != MGE_OK) {
        fprintf(stderr, "mge-train: %s\n", err);
        code = 2;
        goto out;
    }
    int want_test = t.gpt                                       ? 0
                    : t.spec->data.format == MGE_DATA_SYNTHETIC ? t.spec->data.test_size > 0
                    : t.spec->data.format == MGE_DATA_CIFAR     ? t.spec->data.test_file != NULL
                                                                : t.spec->data.test_images != NULL;
    if (want_test && t.rank == 0) { /* rank 0 alone evaluates */
        if ((rc = mge_data_load(t.spec, 1, &t.test, err, sizeof(err))) != MGE_OK) {
            fprintf(stderr, "mge-train: %s\n", err);
            code = 2;
            goto out;
        }
        if (t.test.dim != t.train.dim) {
            fprintf(stderr,
                    "mge-train: %s: test set has %lld values per sample, the train set %lld\n",
                    t.spec->data.test_images ? t.spec->data.test_images : "data",
                    (long long)t.test.dim, (long long)t.train.dim);
            code = 2;
            goto out;
        }
        t.have_test = 1;
    }
    if (t.rank == 0 && t.spec->train.precision == MGE_PRECISION_BF16 && !mge_train_bf16(t.spec))
        fprintf(stderr,
                "mge-train: warning: %s: train.precision: bf16 needs AVX-512 BF16, which "
                "this CPU lacks (no avx512_bf16): training in fp32\n",
                o->spec_path);
    int64_t batch = t.spec->train.batch_size;
    rc = mge_train_build(t.spec, batch, t.train.c, t.train.h, t.train.w, t.train.classes,
                         spec_remat(t.spec), &t.g, &t.model, &t.stats, &t.remat, &t.remat_plain);
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-train: %s: %s\n", o->spec_path,
                t.g ? mge_graph_error_msg(t.g) : mge_strerror(rc));
        code = 2;
        goto out;
    }
    if (t.spec->train.eager &&
        (rc = mge_graph_set_eager(t.g, &(struct mge_eager_opts){.max_abs = o->eager_max_abs,
                                                                .dump_dir = o->eager_dump})) !=
            MGE_OK)
        goto out;
    if (o->max_batch) {
        rc = max_batch(&t);
        code = rc == MGE_OK ? 0 : 2;
        goto out;
    }
    /* the optimiser covers the trained parameters, the gradient arena's extent (no buffers) */
    int64_t n_params_f = (int64_t)(t.stats.grad_bytes / sizeof(float));
    t.total_steps = mge_jobspec_total_steps(t.spec, t.train.n);
    /* from here on, what the process adds is the engine's planned memory (and the loader's) */
    if (!o->plan_only && !o->max_batch && rss_peak_reset() == 0)
        t.rss_base = proc_status_bytes("VmRSS");
    t.alloc_base = mge_alloc_in_use();
    mge_alloc_peak_reset();
    if ((rc = mge_optim_init_on(&t.optim, &t.spec->train.optim, &t.spec->train.sched, t.total_steps,
                                n_params_f, t.dev)) != MGE_OK)
        goto out;
    t.optim_ok = 1;
    if ((rc = optim_exclude_1d(&t)) != MGE_OK)
        goto out;
    if (o->plan_only) {
        rc = print_plan(&t);
        code = rc == MGE_OK ? 0 : 2;
        goto out;
    }
    /* the device runs every op of the graph, or says which one it cannot (exit 2) */
    if ((rc = mge_graph_set_device(t.g, t.dev)) != MGE_OK) {
        fprintf(stderr, "mge-train: %s: resources.device: %s: %s\n", o->spec_path,
                t.spec->resources.device == MGE_DEVICE_GPU ? "gpu" : t.dev->name,
                mge_graph_error_msg(t.g));
        code = 2;
        goto out;
    }
    if ((rc = mge_graph_alloc(t.g)) != MGE_OK)
        goto out;
    mge_graph_init_params(t.g, t.spec->train.seed);
    if ((rc = mge_graph_error(t.g)) != MGE_OK)
        goto out;
    /* off the host, MPI and the exact sums work on a host copy of the gradients; NCCL on the
     * gradient arena itself, with a few device bytes for the loss and the position */
    if ((t.dist || t.det) && !t.dev->host_visible && !t.cdev &&
        !(t.grads_host = mge_malloc_aligned(t.stats.grad_bytes ? t.stats.grad_bytes : 64))) {
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate the gradients' host copy");
        goto out;
    }
    if (t.cdev && !(t.scratch = t.dev->alloc(4 * sizeof(double)))) {
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate the collectives' device scratch");
        goto out;
    }
    if (o->out_dir)
        snprintf(t.out_dir, sizeof(t.out_dir), "%s", o->out_dir);
    else
        snprintf(t.out_dir, sizeof(t.out_dir), "mge-out/%s", t.spec->name);
    if (t.rank == 0 && mkdir_p(t.out_dir) != 0) {
        fprintf(stderr, "mge-train: cannot create '%s': %s\n", t.out_dir, strerror(errno));
        goto out;
    }
    if (t.rank == 0 && o->init_from && (rc = init_from(&t, o->init_from)) != MGE_OK) {
        code = 2;
        goto out;
    }
    if (t.rank == 0 && o->resume && (rc = ckpt_restore(&t, o->resume)) != MGE_OK) {
        code = 2;
        goto out;
    }
    if (t.rank == 0 && (rc = ckpt_init(&t)) != MGE_OK)
        goto out;
    /* every rank starts from rank 0's state (its parameters, or the checkpoint it read) */
    if (t.dist &&
        ((rc = dist_sync_state(&t)) != MGE_OK || (!t.det && (rc = dist_packs_init(&t)) != MGE_OK)))
        goto out;
    if (o->profile_path && (rc = trace_open(&t)) != MGE_OK) {
        code = 2;
        goto out;
    }
    if (!t.gpt && (rc = mge_sampler_init(&t.sampler, t.train.n, batch, t.rank, t.world,
                                         t.spec->train.seed)) != MGE_OK)
        goto out;
    t.sampler_ok = !t.gpt;
    if (t.det && ((rc = mge_sampler_set_micro_shards(&t.sampler,
                                                     t.spec->distributed.micro_shards)) != MGE_OK ||
                  (rc = det_init(&t)) != MGE_OK))
        goto out;
    if (!t.gpt) { /* a gpt draws its windows from the step (tokens_next) */
        mge_sampler_seek(&t.sampler, t.epoch, t.pos);
        if ((rc = mge_loader_init(&t.loader, &t.train, &t.sampler,
                                  t.spec->data.prefetch > 0 ? t.spec->data.prefetch : 2)) != MGE_OK)
            goto out;
        t.loader_ok = 1;
    }
    if (!o->json && t.rank == 0) {
        printf("%s: %s, %lld parameters, %lld steps, batch %lld, %d threads, gemm %s, %s, %s\n",
               t.spec->name, mge_model_type_name(t.spec->model.type), (long long)n_params_f,
               (long long)t.total_steps, (long long)batch, mge_cpu_threads(),
               mge_cpu_sgemm_backend(), mge_cpu_isa(), mge_train_precision(t.spec));
        if (t.spec->train.eager)
            printf("eager mode: op by op, every value checked (NaN, Inf%s)\n",
                   o->eager_max_abs > 0 ? ", |x| bound" : "");
        if (t.det)
            printf("deterministic data parallel: %d ranks (%s), %d micro-shards summed exactly\n",
                   t.world, mge_comm_backend_name(mge_comm_backend(t.comm)),
                   t.spec->distributed.micro_shards);
        else if (t.dist)
            printf("data parallel: %d ranks (%s), %d packs of gradients\n", t.world,
                   mge_comm_backend_name(mge_comm_backend(t.comm)),
                   mge_comm_packs_count(t.packs));
    }
    rc = train_loop(&t);
    code = rc == MGE_OK ? 0 : 1;
out:
    if (t.g && mge_graph_eager_report(t.g)[0] && t.world > 1)
        fprintf(stderr, "mge-train: rank %d: eager: %s\n", t.rank, mge_graph_eager_report(t.g));
    else if (t.g && mge_graph_eager_report(t.g)[0])
        fprintf(stderr, "mge-train: eager: %s\n", mge_graph_eager_report(t.g));
    if (rc != MGE_OK && code == 1)
        fprintf(stderr, "mge-train: failed: %s\n", mge_strerror(rc));
    /* a checkpoint being written is finished before the job is ended */
    mge_ckpt_writer_free(t.ckw);
    t.ckw = NULL;
    if (code != 0 && t.world > 1) {
        fprintf(stderr, "mge-train: rank %d of %d failed: ending the job\n", t.rank, t.world);
        fflush(stderr);
        mge_comm_abort(t.comm, code);
    }
    mge_comm_close(t.comm);
    trainer_fini(&t);
    return code;
}
