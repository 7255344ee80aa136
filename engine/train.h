/* train.h: one training rank end to end (spec -> data -> graph -> loop -> checkpoints, metrics). */
#ifndef MGE_ENGINE_TRAIN_H
#define MGE_ENGINE_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "common/jobspec.h"
#include "engine/data.h"
#include "engine/engine.h"
#include "engine/model.h"

struct mge_train_opts {
    const char *spec_path;          /* SPEC.yaml */
    const char *const *overrides;   /* "key.path=value" (--set) */
    int n_overrides;
    const char *resume;             /* checkpoint to resume from, or NULL */
    const char *init_from;          /* weights to start from (safetensors or checkpoint), or NULL */
    const char *out_dir;            /* where checkpoints go (NULL: mge-out/<name>) */
    int json;                       /* stdout: JSON lines only */
    int threads;                    /* kernel threads; <= 0: $OMP_NUM_THREADS or all cores */
    int plan_only;                  /* --plan: print the memory plan as JSON and stop */
    int max_batch;                  /* --max-batch: largest batch fitting memory.budget_mb */
    const char *profile_path;       /* --profile: Chrome trace of the first steps, or NULL */
    int eager;                      /* --eager: as train.eager: true */
    const char *eager_dump;         /* --eager-dump: where a failing op's values go, or NULL */
    double eager_max_abs;           /* --eager-max-abs: > 0: bound on |x|; 0: off */
};

/* Run mge-train with @o. Returns the process exit code: 0 ok, 2 bad input, 1 failure. */
int mge_train_main(const struct mge_train_opts *o);

/*
 * SIGUSR2 asks a running mge_train_main() for a checkpoint at its next step boundary. Call
 * first in main, before any thread starts: it blocks SIGUSR2 in the calling thread, so in
 * every thread started after it, and the training loop takes it at step boundaries. No thread
 * must run a handler mid-kernel: with a handler, a SIGUSR2 that lands in oneDNN's JIT sgemm
 * corrupts the heap (measured: 3 crashes in 3 runs at 20 signals a second, none with OpenBLAS
 * or with the signal blocked).
 */
void mge_train_signals_init(void);

/*
 * train.precision as it runs here: whether GEMMs and convs take bf16 (bf16 asked for and the CPU
 * has AVX-512 BF16; otherwise fp32), and the words for it in logs and the summary ("fp32",
 * "bf16", or "fp32 (bf16 unsupported: no avx512_bf16)"; static storage).
 */
int mge_train_bf16(const struct mge_jobspec *spec);
/* Quantisation options @mode with @spec's quant: observer, momentum, percentile, start_step. */
void mge_quant_opts_from_spec(const struct mge_jobspec *spec, enum mge_quant_mode mode,
                              struct mge_quant_opts *o);
const char *mge_train_precision(const struct mge_jobspec *spec);

/*
 * Build @spec's model for batches of @batch, differentiate it, apply the recompute plan
 * @mode under the spec's memory.budget_mb, and plan memory. *@gp is the new graph (the caller
 * frees it, also on error; mge_graph_error_msg() says what failed). MGE_BUDGET when the budget
 * cannot be met (the message gives the smallest feasible budget).
 */
int mge_train_build(const struct mge_jobspec *spec, int64_t batch, int c, int h, int w,
                    int classes, enum mge_remat mode, struct mge_graph **gp,
                    struct mge_model *model, struct mge_plan_stats *stats,
                    struct mge_remat_plan *chosen, struct mge_remat_plan *plain);

/* Load the train or test set a spec names (@test: the test set; MGE_NOENT if it has none) in
 * its format (idx, npy, cifar, synthetic), with data.normalize applied to what it gathers,
 * and, for the train set, data.augment set up (mge_dataset_set_augment: applied by the loader).
 * On error @err names the file (or key) and the reason, and @ds is zeroed. */
int mge_data_load(const struct mge_jobspec *spec, int test, struct mge_dataset *ds, char *err,
                  size_t errlen);

/*
 * Evaluate @model (built in @g with batches up to @batch) on all of @ds: mean loss and
 * accuracy. The graph runs forward only. Returns MGE_OK or an error code.
 */
int mge_evaluate(struct mge_graph *g, const struct mge_model *model, const struct mge_dataset *ds,
                 int64_t batch, double *loss, double *accuracy);

/*
 * As mge_evaluate(), also writing each sample's predicted class to @pred (ds->n entries) and
 * adding the seconds spent in mge_graph_run() to *@run_sec (either may be NULL).
 */
int mge_evaluate_preds(struct mge_graph *g, const struct mge_model *model,
                       const struct mge_dataset *ds, int64_t batch, double *loss, double *accuracy,
                       int32_t *pred, double *run_sec);

/*
 * mge_evaluate_preds() with the samples split across @n_graphs graphs that run at once, one per
 * thread, each op inside them single-threaded (mge_cpu_run_split): graph t is @g[t] with
 * @model[t], on the host (a CPU device), built for batches of up to @sub samples and planned
 * under mge_cpu_set_local_threads(1). Units of @sub consecutive samples go to whichever graph is
 * free; each keeps its unit's logits, and loss (cross-entropy with label smoothing @smoothing,
 * as the model's loss node), accuracy and @pred are then taken over batches of @batch in order,
 * so they equal mge_evaluate_preds()'s at @batch whenever each sample's logits do (every op is
 * per sample in inference). *@run_sec gets the wall time of the graph runs (gathering, done by
 * the same threads, excluded in proportion). Rebinds the models' inputs. Returns MGE_OK,
 * MGE_NOMEM or the first failing graph's error.
 */
int mge_evaluate_split(struct mge_graph *const *g, const struct mge_model *model, int n_graphs,
                       const struct mge_dataset *ds, int64_t batch, int64_t sub, float smoothing,
                       double *loss, double *accuracy, int32_t *pred, double *run_sec);

/* Held-out windows a gpt's test_loss covers at most (the first ones of the held-out tokens). */
#define MGE_TOKENS_EVAL_WINDOWS 4096

/*
 * gpt: load the token streams @spec names (data.format tokens or text): the training tokens
 * into @train, the held-out ones into @test: data.test_file, or the last data.test_fraction of
 * the stream (then @test views @train's memory: free @test before or with @train), or none
 * (@test->n = 0). Both streams must be longer than model.context. Returns MGE_OK or
 * mge_tokens_load()'s codes, MGE_FORMAT for a stream too short; @err names the file; on error
 * both are zeroed. Release with mge_tokens_fini() on each.
 */
int mge_tokens_load_spec(const struct mge_jobspec *spec, struct mge_tokens *train,
                         struct mge_tokens *test, char *err, size_t errlen);

/*
 * gpt: mean loss per token of @model (built in @g for batches up to @batch rows of @T tokens)
 * over consecutive non-overlapping windows of @tk (at most @max_windows), forward only; the
 * window count in *@windows (*@loss is NaN when @tk holds no whole window). Rebinds the model's
 * inputs. Returns MGE_OK, MGE_NOMEM or a kernel error.
 */
int mge_tokens_evaluate(struct mge_graph *g, const struct mge_model *model,
                        const struct mge_tokens *tk, int64_t batch, int64_t T, int64_t max_windows,
                        double *loss, int64_t *windows);

/*
 * mge_tokens_evaluate() with the windows split across @n_graphs graphs run at once, one per
 * thread (as mge_evaluate_split(): graph t is @g[t] with @model[t], on the host, built for up
 * to @sub windows and planned under mge_cpu_set_local_threads(1)). Each unit of @sub windows
 * keeps its loss (its graph's mean per token, as a float, times its windows), added in unit
 * order: deterministic, and equal to mge_tokens_evaluate()'s within float rounding (each of
 * its batch means is rounded to float once, each unit's here). Returns as mge_tokens_evaluate().
 */
int mge_tokens_evaluate_split(struct mge_graph *const *g, const struct mge_model *model,
                              int n_graphs, const struct mge_tokens *tk, int64_t sub, int64_t T,
                              int64_t max_windows, double *loss, int64_t *windows);

#endif
