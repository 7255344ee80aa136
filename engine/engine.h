/*
 * engine.h: libmge's public contract: a static graph of tensors built through a small C API,
 * reverse-mode autodiff, a static memory plan, and execution on a device's ops table.
 *
 * Life of a graph: mge_graph_new() -> build ops (mge_linear(g, ...)) -> mge_graph_backward()
 * (appends the backward ops) -> mge_graph_plan() (lifetimes -> offsets in one arena) ->
 * mge_graph_alloc() -> per step: bind inputs, mge_graph_run() -> mge_graph_free().
 *
 * Values are named by int ids (>= 0). Builder calls return a value id, or a negative enum
 * mge_err (-MGE_INVAL ...) on bad shapes; the first error sticks in the graph and every later
 * call returns it, so a model can be built without checking each call (mge_graph_error()).
 * Threads: a graph is used by one thread at a time.
 */
#ifndef MGE_ENGINE_H
#define MGE_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MGE_MAX_DIMS 6

enum mge_dtype { MGE_DTYPE_F32, MGE_DTYPE_F16, MGE_DTYPE_BF16, MGE_DTYPE_I8, MGE_DTYPE_I32 };

/* Bytes per element of @dt. */
size_t mge_dtype_size(enum mge_dtype dt);
const char *mge_dtype_name(enum mge_dtype dt);

/* What a value is, which decides where its memory lives. */
enum mge_value_kind {
    MGE_VALUE_INPUT, /* bound by the caller each step (mge_graph_bind) */
    MGE_VALUE_PARAM, /* one slice of the parameter arena */
    MGE_VALUE_GRAD,  /* one slice of the gradient arena (a parameter's gradient) */
    MGE_VALUE_ACT,   /* activation or temporary: planned into the activation arena */
};

struct mge_graph;

/* Activation applied by fused ops (matches kernels' enum mge_cpu_unary). */
enum mge_act { MGE_ACT_NONE = 0, MGE_ACT_FN_RELU, MGE_ACT_FN_GELU, MGE_ACT_FN_TANH, MGE_ACT_FN_SIGMOID };

/* ---- lifecycle ---------------------------------------------------------------------------- */

/* A new empty graph in *out (free with mge_graph_free). MGE_NOMEM on failure. */
int mge_graph_new(struct mge_graph **out);
/* Free the graph and every arena it allocated; NULL does nothing. */
void mge_graph_free(struct mge_graph *g);
/* The first error a builder call hit (MGE_OK if none), and its message (static in @g). */
int mge_graph_error(const struct mge_graph *g);
const char *mge_graph_error_msg(const struct mge_graph *g);

/* ---- values -------------------------------------------------------------------------------- */

/*
 * An input fed each step. When @batched, dim 0 is the batch: a step may run with any batch
 * n <= shape[0] (mge_graph_set_batch), and every value computed from it follows.
 */
int mge_input(struct mge_graph *g, const char *name, enum mge_dtype dt, int ndim,
              const int64_t *shape, int batched);
/* A trainable parameter (f32), initialised by mge_graph_init_params(). */
enum mge_init {
    MGE_INIT_ZERO,
    MGE_INIT_ONE,
    MGE_INIT_UNIFORM_FAN_IN, /* U(-1/sqrt(fan), 1/sqrt(fan)): PyTorch's Linear/Conv default */
    MGE_INIT_NORMAL_FAN_OUT, /* N(0, 2/fan): kaiming_normal_(mode="fan_out", relu), torchvision */
    MGE_INIT_NORMAL_GPT,     /* N(0, 0.02^2/fan): GPT-2/nanoGPT (fan 2*layers: residual proj) */
};
/* @fan_in: the fan the init uses (fan-in for UNIFORM_FAN_IN, fan-out for NORMAL_FAN_OUT). */
int mge_param(struct mge_graph *g, const char *name, int ndim, const int64_t *shape,
              enum mge_init init, int64_t fan_in);
/*
 * A buffer (PyTorch's register_buffer): state that lives beside the parameters (the parameter
 * list, mge_graph_params, checkpoints) but has no gradient and is never touched by the
 * optimiser; ops update it (batch norm's running statistics). Buffers sit after every trained
 * parameter in the parameter arena, and the gradient arena covers the trained part only.
 */
int mge_buffer(struct mge_graph *g, const char *name, int ndim, const int64_t *shape,
               enum mge_init init);
/* Whether parameter value @v is a buffer (0 for trained parameters and other values). */
int mge_value_is_buffer(const struct mge_graph *g, int v);

int mge_value_ndim(const struct mge_graph *g, int v);
const int64_t *mge_value_shape(const struct mge_graph *g, int v);
int64_t mge_value_numel(const struct mge_graph *g, int v);
const char *mge_value_name(const struct mge_graph *g, int v);
/* Data of a value after mge_graph_alloc (NULL before); valid until the graph is freed. It is
 * device memory: host code reads it only on a host-visible device, else through the device's
 * copies (engine/device.h: mge_value_read). */
void *mge_value_data(const struct mge_graph *g, int v);

/* ---- ops (each returns the output value id, or -err) ---------------------------------------- */

/* op(a) @ op(b) with op(x) = x^T when tx: a is (.., M, K) flattened to 2-D rows, b is 2-D. */
int mge_matmul(struct mge_graph *g, int a, int b, int ta, int tb);
/* Fused y = act(x @ w^T + b): x (M, K), w (N, K) (PyTorch's layout), b (N) or -1. */
int mge_linear(struct mge_graph *g, int x, int w, int b, enum mge_act act);
/* Broadcasting elementwise ops (numpy rules, up to 6 dims). */
int mge_add(struct mge_graph *g, int a, int b);
int mge_sub(struct mge_graph *g, int a, int b);
int mge_mul(struct mge_graph *g, int a, int b);
int mge_div(struct mge_graph *g, int a, int b);
/* x (.., C) + b (C). */
int mge_bias_add(struct mge_graph *g, int x, int b);
int mge_relu(struct mge_graph *g, int x);
int mge_gelu(struct mge_graph *g, int x);
int mge_tanh(struct mge_graph *g, int x);
int mge_sigmoid(struct mge_graph *g, int x);
/* Over the last dimension. */
int mge_softmax(struct mge_graph *g, int x);
int mge_log_softmax(struct mge_graph *g, int x);
/*
 * Mean cross-entropy of logits (B, V) against int32 labels (B): a scalar. Fused with softmax.
 * Logits (B, .., V) with labels (B, ..) are rows too: the mean over all of them (a GPT's tokens).
 */
int mge_cross_entropy(struct mge_graph *g, int logits, int labels);
/*
 * The same with label smoothing @smoothing in [0, 1) (PyTorch's label_smoothing: the target
 * is (1 - e) on the label plus e / V on every class); MGE_INVAL outside that range.
 */
int mge_cross_entropy_smoothed(struct mge_graph *g, int logits, int labels, float smoothing);
/* Sum or mean over @axis (-1: all elements), the axis removed (keepdim = 0). */
int mge_sum(struct mge_graph *g, int x, int axis);
int mge_mean(struct mge_graph *g, int x, int axis);
/* Same data, new shape (one entry may be -1). A view: no copy. */
int mge_reshape(struct mge_graph *g, int x, int ndim, const int64_t *shape);
/* (N, ...) -> (N, prod(...)). A view. */
int mge_flatten(struct mge_graph *g, int x);
/* Swap dims @d0 and @d1. */
int mge_transpose(struct mge_graph *g, int x, int d0, int d1);
int mge_concat(struct mge_graph *g, const int *xs, int n, int axis);
int mge_slice(struct mge_graph *g, int x, int axis, int64_t start, int64_t len);
/* x (N, C, H, W), w (K, C, R, S), b (K) or -1. */
int mge_conv2d(struct mge_graph *g, int x, int w, int b, int stride, int pad);
int mge_maxpool2d(struct mge_graph *g, int x, int k, int stride, int pad);
int mge_avgpool2d(struct mge_graph *g, int x, int k, int stride, int pad);
/* Inverted dropout, active only in training runs; the mask is a function of (seed, step, op). */
int mge_dropout(struct mge_graph *g, int x, float p);
/* Over the last dimension C; w and b are (C). */
int mge_layernorm(struct mge_graph *g, int x, int w, int b, float eps);
/*
 * Batch normalisation of x (N, C, H, W) per channel, as PyTorch's BatchNorm2d: w, b (C) trained
 * (or -1: 1 and 0), running_mean and running_var (C) buffers (mge_buffer, init 0 and 1).
 * Training runs normalise with the batch's statistics and update the running ones
 * (r = (1 - momentum) r + momentum s, unbiased variance); inference runs use the running ones.
 * Recomputation (mge_graph_sublinear) never updates them twice.
 */
int mge_batchnorm2d(struct mge_graph *g, int x, int w, int b, int running_mean, int running_var,
                    float eps, float momentum);
/* x (N, C, H, W) -> (N, C): the mean over H and W (a view and a mean; no copy). */
int mge_global_avgpool2d(struct mge_graph *g, int x);
/*
 * Causal multi-head self-attention, fused (GPT's attention without its projections): @qkv
 * (B, T, 3C) holds q, k and v side by side, as nanoGPT's c_attn writes them; -> (B, T, C), heads
 * side by side. C % @heads == 0 and C / @heads <= 128. Stores one log-sum-exp per row
 * (B * heads * T floats) for backward, which recomputes the probabilities (flash attention).
 */
int mge_causal_attention(struct mge_graph *g, int qkv, int heads);
/* ids int32 (..), table (V, C) -> (.., C). */
int mge_embedding(struct mge_graph *g, int ids, int table);

/* ---- autodiff, planning, execution ---------------------------------------------------------- */

/*
 * Append the backward ops of @loss (a scalar) with respect to every parameter. Each
 * parameter's gradient lands in the gradient arena, laid out in reverse execution order so
 * that the gradients finished first form the arena's first bytes (parameter packing).
 */
int mge_graph_backward(struct mge_graph *g, int loss);
/* Gradient value of parameter @param (after backward), or -1 if it has none. */
int mge_graph_grad(const struct mge_graph *g, int param);

struct mge_plan_stats {
    size_t param_bytes;       /* parameter arena */
    size_t grad_bytes;        /* gradient arena */
    size_t activation_bytes;  /* activation arena (the planned peak of activations) */
    size_t lower_bound_bytes; /* largest sum of live activation bytes at any op */
    size_t input_bytes;       /* bound inputs (owned by the caller) */
    int n_values, n_nodes;
};

/* ---- sublinear memory: recompute instead of store ------------------------------------------ */

enum mge_remat {
    MGE_REMAT_NONE,      /* keep every activation backward reads */
    MGE_REMAT_LIGHT,     /* recompute cheap ops only (elementwise, activations, pooling, norms) */
    MGE_REMAT_SUBLINEAR, /* segment the forward pass, keep boundaries (Chen et al.) */
    MGE_REMAT_AUTO,      /* sublinear only when the plain plan does not fit the budget */
};

struct mge_remat_plan {
    enum mge_remat mode;      /* what the plan does (NONE, LIGHT or SUBLINEAR) */
    size_t activation_bytes;  /* planned activation arena */
    size_t lower_bound_bytes; /* its lower bound */
    double recompute_flops;   /* FLOPs of the recomputed forward ops, per step */
    int recompute_ops;        /* ops recomputed per step */
};

/*
 * Between mge_graph_backward() and mge_graph_plan(): choose what backward recomputes.
 * @budget: bytes the activation arena may use (0: none). NONE/AUTO without a budget keep the
 * plain graph; LIGHT picks the smallest arena (ties: least recomputation), SUBLINEAR the least
 * recomputation within sqrt(2) of the smallest arena; with a budget, the plan with the least
 * recomputation that fits. Results are bit-identical to the plain graph. *@chosen and *@plain
 * (either may be NULL) describe the chosen and plain plans.
 * Returns MGE_OK; MGE_BUDGET when nothing fits (the graph is unchanged, *@chosen holds the
 * smallest plan and mge_graph_error_msg() says so); MGE_NOMEM.
 */
int mge_graph_sublinear(struct mge_graph *g, enum mge_remat mode, size_t budget,
                        struct mge_remat_plan *chosen, struct mge_remat_plan *plain);
/* FLOPs of one run of every op of @g (forward, backward and recomputation). */
double mge_graph_flops(const struct mge_graph *g);

/* Bytes of the parameter arena (each parameter 64-byte aligned); known before planning. */
size_t mge_graph_param_bytes(const struct mge_graph *g);

/* Keep @v alive to the end of a run (a value the caller reads afterwards, e.g. the logits). */
int mge_graph_keep(struct mge_graph *g, int v);
/* Lifetimes -> offsets in one activation arena. Call after backward (or without it, forward only). */
int mge_graph_plan(struct mge_graph *g, struct mge_plan_stats *stats);
/* Allocate the parameter, gradient and activation arenas (once). */
int mge_graph_alloc(struct mge_graph *g);
/* Initialise parameters from @seed (deterministic, PyTorch's default Linear/Conv init). */
void mge_graph_init_params(struct mge_graph *g, uint64_t seed);
/* Point input @v at caller memory for the next runs (not owned; not copied on the CPU; off the
 * host each run copies the current batch's rows of it to the device). */
int mge_graph_bind(struct mge_graph *g, int v, void *data);
/* Batch size of the next runs: 1..shape[0] of the batched inputs. */
int mge_graph_set_batch(struct mge_graph *g, int64_t n);
enum mge_run {
    MGE_RUN_INFER,         /* forward ops, inference behaviour (dropout off) */
    MGE_RUN_TRAIN,         /* forward and backward ops, training behaviour */
    MGE_RUN_FORWARD_TRAIN, /* forward ops only, training behaviour (gradient checks) */
};
/*
 * Run the graph in @mode. @step seeds dropout (same step, same masks).
 * Returns MGE_OK or the first kernel error.
 */
int mge_graph_run(struct mge_graph *g, enum mge_run mode, int64_t step);

/*
 * Gradient-ready hook (data parallelism): during MGE_RUN_TRAIN runs, after each backward op
 * that completes more of the gradient arena, @fn(@ctx, ready) is called with the number of
 * leading bytes of the arena (mge_graph_grads) that hold final gradients for this step; the
 * last call of a run has ready == the arena's size. Gradients are laid out in the order
 * backward finishes them, so packs are contiguous prefixes of the arena and the first packs
 * are ready while backward still runs. @fn runs on the calling thread and must be quick (hand
 * the work to a communication thread). NULL @fn removes the hook.
 */
void mge_graph_set_grad_hook(struct mge_graph *g, void (*fn)(void *ctx, size_t ready_bytes),
                             void *ctx);
/* Byte offset and size of parameter @param's gradient in the gradient arena (after planning). */
int mge_graph_grad_span(const struct mge_graph *g, int param, size_t *offset, size_t *bytes);

/*
 * Op timing hook (traces): after each op of later runs, @fn(@ctx, node, t0, t1) with the op's
 * CLOCK_MONOTONIC start and end in seconds. Same thread and rules as the gradient-ready hook.
 */
void mge_graph_set_op_hook(struct mge_graph *g,
                           void (*fn)(void *ctx, int node, double t0, double t1), void *ctx);
/* Nodes of the graph (forward, backward and recomputation ops, in execution order). */
int mge_graph_n_nodes(const struct mge_graph *g);
/* Op name of @node ("matmul", ...) and whether it is a backward op; NULL if no such node. */
const char *mge_graph_node_op(const struct mge_graph *g, int node, int *backward);

/*
 * Multiply every gradient of later MGE_RUN_TRAIN runs by @scale (default 1) by seeding backward
 * with d(loss) = @scale. Data parallelism: a rank holding n of a global batch of N rows sets
 * n/N, so summing the ranks' gradients gives the gradient of the global mean loss.
 */
void mge_graph_set_loss_scale(struct mge_graph *g, float scale);
/*
 * The rows of later runs are rows [@rows, @rows + batch) of a larger global batch (default 0).
 * Dropout masks follow global rows, so data-parallel ranks draw the masks one process would.
 */
void mge_graph_set_row_offset(struct mge_graph *g, int64_t rows);
/*
 * Mixed precision (@on != 0): MATMUL, LINEAR and CONV2D, forward and backward, round their
 * inputs to bf16 and accumulate in fp32 (mge_cpu_gemm_bf16 and the bf16 convolution); every
 * other op, the parameters, gradients and optimiser state stay fp32. Set it before the graph
 * gets its first conv2d (conv scratch is sized for it). Default off.
 */
void mge_graph_set_bf16(struct mge_graph *g, int on);

/* ---- eager mode: the same graph run op by op, every value checked ----------------------- */

struct mge_eager_opts {
    double max_abs;       /* > 0: a finite |value| above this fails too; 0: NaN and Inf only */
    const char *dump_dir; /* on a failure, the node's inputs and outputs as .npy files and
                           * node.json go here (created if missing; its parent must exist);
                           * NULL: no dump. Copied. */
};

/*
 * Eager mode (@opts NULL: defaults): every activation gets an allocation of its own instead of
 * an offset in the shared arena (filled with a NaN before the first run, so a read of memory no
 * op wrote shows), no op works in place, and after each op of a run its outputs are checked:
 * the guard bytes past each output (an op that writes too much), NaN and Inf, and |x| against
 * @opts->max_abs. The first failure stops the run with MGE_RANGE; mge_graph_eager_report()
 * names the step, the layer, the op, forward/backward/recompute, the output and the inputs'
 * largest |x|. Results are bit-identical to the static plan's.
 * Call before mge_graph_plan() (the plan differs) or, to change @opts only, later but before
 * mge_graph_alloc(). Returns MGE_OK, MGE_STATE (too late), MGE_NOMEM.
 */
int mge_graph_set_eager(struct mge_graph *g, const struct mge_eager_opts *opts);
/* Whether @g runs in eager mode. */
int mge_graph_is_eager(const struct mge_graph *g);
/*
 * The report of the last eager failure ("step 3, layer `fc2` (op LINEAR, backward): NaN in dW
 * `dfc2.w` ..."), "" if none; static in @g until the next failure. Steps count from 1 (the
 * run's @step + 1, as mge-train's step lines). A dump that could not be written is said there.
 */
const char *mge_graph_eager_report(const struct mge_graph *g);
/*
 * Eager mode, after the optimiser's update of step @step: check every parameter (the trained
 * ones and buffers) as op outputs are checked; @what names the update in the report
 * ("optimiser sgd, lr 0.1"). Returns MGE_OK (also when @g is not eager) or MGE_RANGE.
 */
int mge_graph_eager_check_params(struct mge_graph *g, int64_t step, const char *what);

/* ---- quantisation (engine/quant.c) --------------------------------------------------------- */

enum mge_quant_mode {
    MGE_QUANT_OFF,  /* plain fp32 */
    MGE_QUANT_FAKE, /* fake-quantise GEMM/conv inputs and weights (QAT; STE in backward) */
    MGE_QUANT_INT8, /* int8 GEMMs and convs with int32 sums (inference only: no backward) */
};
enum mge_quant_observer { MGE_QUANT_OBS_MINMAX, MGE_QUANT_OBS_EMA, MGE_QUANT_OBS_PERCENTILE };
struct mge_quant_opts {
    enum mge_quant_mode mode;
    enum mge_quant_observer observer; /* how training runs update activation ranges */
    float momentum;                   /* ema/percentile: weight of a new batch, (0, 1] */
    float percentile;                 /* percentile: the batch range is [100 - p, p] %, (50, 100] */
    int64_t start_step; /* training steps before this one run unquantised (observing) */
    int calibrate;      /* FAKE: inference runs observe and do not quantise */
};
/*
 * Quantise the MATMUL-like ops built after this call: every mge_linear() and mge_conv2d() gets
 * its weight fake-quantised per output channel (symmetric int8) and its input per tensor
 * (affine uint8, range from an observer), or (INT8) runs as one int8 op over the same
 * parameters. Each such op adds a buffer "<layer>.act_observer" (4 floats: observed low,
 * high, batches observed, 0), named after its weight ("fc1.w" -> "fc1.act_observer"): it is
 * saved in checkpoints like any buffer, and INT8 graphs need it observed (count > 0).
 * Call before building. Returns MGE_OK, MGE_INVAL (bad options), MGE_NOMEM, MGE_STATE (ops built).
 */
int mge_graph_set_quant(struct mge_graph *g, const struct mge_quant_opts *o);
#define MGE_QUANT_OBSERVER_SUFFIX ".act_observer"
#define MGE_QUANT_OBSERVER_LEN 4
/* Whether @name is an activation observer's (ends with MGE_QUANT_OBSERVER_SUFFIX). */
int mge_quant_is_observer(const char *name);
/*
 * Check an observer's stored values (@n floats): 4 of them, all finite, low <= high, the count a
 * whole number >= 0 (with @need_observed: > 0), the 4th 0. MGE_OK or MGE_CORRUPT with @err
 * saying which field is wrong.
 */
int mge_quant_observer_check(const float *v, int64_t n, int need_observed, char *err,
                             size_t errlen);

/* Time every op of later runs (on != 0) or stop; MGE_NOMEM if the table cannot be made. */
int mge_graph_profile(struct mge_graph *g, int on);
/* Print per-op mean times over @runs runs to @fp. */
void mge_graph_profile_print(const struct mge_graph *g, FILE *fp, int64_t runs);

/* The parameter and gradient arenas (contiguous; NULL before alloc; device memory, as
 * mge_value_data's) and their float counts. */
float *mge_graph_params(struct mge_graph *g, int64_t *n);
float *mge_graph_grads(struct mge_graph *g, int64_t *n);
int mge_graph_n_params(const struct mge_graph *g);
/* The i-th parameter's value id (0 <= i < n_params), in creation order. */
int mge_graph_param(const struct mge_graph *g, int i);

#ifdef __cplusplus
}
#endif
#endif
