/* engine_int.h: the graph IR shared by the engine's files (builder, autodiff, planner, executor). */
#ifndef MGE_ENGINE_INT_H
#define MGE_ENGINE_INT_H

#include <stdint.h>

#include "engine/engine.h"

/* Every op of the IR, forward and backward. Kernels for each live in the device ops table. */
#define MGE_OP_MAP(X)                                                                             \
    X(MATMUL)          /* in: a, b            out: c          attr: ta, tb */                     \
    X(LINEAR)          /* in: x, w, [b]       out: y, [pre]   attr: act (pre kept for gelu) */    \
    X(BIAS_ACT)        /* in: x, [b]          out: y          attr: act */                        \
    X(BIAS_GRAD)       /* in: dy              out: db */                                          \
    X(BINARY)          /* in: a, b            out: c          attr: binop */                      \
    X(SUM_TO)          /* in: x               out: y (broadcast source shape) */                  \
    X(UNARY)           /* in: x               out: y          attr: act */                        \
    X(UNARY_GRAD)      /* in: dy, x, y        out: dx         attr: act */                        \
    X(SOFTMAX)         /* in: x               out: y */                                           \
    X(SOFTMAX_GRAD)    /* in: dy, y           out: dx */                                          \
    X(LOG_SOFTMAX)     /* in: x               out: y */                                           \
    X(LOG_SOFTMAX_GRAD) /* in: dy, y          out: dx */                                          \
    X(XENT)            /* in: logits, labels  out: loss, probs */                                 \
    X(XENT_GRAD)       /* in: dloss, probs, labels  out: dlogits */                               \
    X(REDUCE)          /* in: x               out: y          attr: axis, scale (mean) */         \
    X(REDUCE_GRAD)     /* in: dy              out: dx */                                          \
    X(PERMUTE)         /* in: x               out: y          attr: perm */                       \
    X(COPY_AXIS)       /* in: src             out: dst        attr: concat/slice geometry */      \
    X(CONV2D)          /* in: x, w, [b]       out: y, scratch */                                  \
    X(CONV2D_GRAD)     /* in: dy, x, w        out: dx|-, dw, db|-, scratch */                     \
    X(POOL)            /* in: x               out: y          attr: max/avg, window */            \
    X(POOL_GRAD)       /* in: dy, x           out: dx */                                          \
    X(DROPOUT)         /* in: x               out: y          attr: p, salt */                    \
    X(DROPOUT_GRAD)    /* in: dy              out: dx */                                          \
    X(LAYERNORM)       /* in: x, w, b         out: y, mean, rstd */                               \
    X(LAYERNORM_GRAD)  /* in: dy, x, w, mean, rstd  out: dx, dw, db */                            \
    X(BATCHNORM)       /* in: x, w, b, rmean, rvar  out: y, mean, rstd  attr: eps, momentum */    \
    X(BATCHNORM_GRAD)  /* in: dy, x, w, mean, rstd  out: dx, dw, db */                            \
    X(EMBEDDING)       /* in: ids, table      out: y */                                           \
    X(EMBEDDING_GRAD)  /* in: dy, ids         out: dtable */                                      \
    X(ATTENTION)       /* in: qkv             out: y, lse     attr: heads (causal) */            \
    X(ATTENTION_GRAD)  /* in: dy, qkv, y, lse out: dqkv       attr: heads */                      \
    X(SCALE)           /* in: x               out: y (+)= s * x  attr: red.scale */             \
    X(ONES)            /* out: a tensor of ones (the seed of backward) */                         \
    X(FAKE_QUANT)      /* in: x, [observer]   out: y          attr: q (quant.c) */                \
    X(FAKE_QUANT_GRAD) /* in: dy, x, [obs]    out: dx         attr: q (straight-through) */       \
    X(QLINEAR)         /* in: x, w, [b], obs  out: y, scratch attr: q (int8, act none/relu) */    \
    X(QCONV2D)         /* in: x, w, [b], obs  out: y, scratch attr: q (int8) */

enum mge_op {
#define MGE__OP_ENUM(name) MGE_OP_##name,
    MGE_OP_MAP(MGE__OP_ENUM)
#undef MGE__OP_ENUM
    MGE_OP__COUNT
};

const char *mge__op_name(enum mge_op op);

#define MGE_NODE_MAX_IN 10 /* an int8 conv with a fused batch norm, residual and input codes: 10 */
#define MGE_NODE_MAX_OUT 4

struct mge_device;

struct mge_value {
    enum mge_value_kind kind;
    enum mge_dtype dtype;
    int ndim;
    int64_t shape[MGE_MAX_DIMS]; /* full (planned) shape */
    int batched;                 /* dim 0 follows the run's batch size */
    char name[64];
    int producer;                /* node id, -1 for inputs and params */
    int alias;                   /* value whose storage this one views, or -1 */
    int requires_grad;
    int keep;                    /* live to the end of every run */
    int param_index;             /* PARAM/GRAD: index into the parameter list, else -1 */
    int buffer;                  /* PARAM: state that is saved but not trained (running stats) */
    enum mge_init init;          /* PARAM */
    int64_t fan_in;              /* PARAM: for MGE_INIT_UNIFORM_FAN_IN */
    size_t offset;               /* bytes into its arena (PARAM/GRAD/ACT) */
    void *data;                  /* resolved after alloc; INPUT: bound by the caller */
    void *host;                  /* INPUT on a device that is not host-visible: bound host data */
    int64_t first_use, last_use; /* planner: node indices */
};

struct mge_node {
    enum mge_op op;
    int in[MGE_NODE_MAX_IN];
    int n_in;
    int out[MGE_NODE_MAX_OUT];   /* -1 where an optional output is not wanted */
    int n_out;
    int backward;                /* appended by autodiff */
    int acc;                     /* backward: add into out[0] instead of overwriting */
    union {
        struct { int ta, tb; } mm;
        struct { int act; } act;
        struct { int op; } bin;
        struct { int axis; float scale; } red;
        struct { int perm[MGE_MAX_DIMS]; } perm;
        struct { int axis; int64_t dstart, sstart, len; int zero_first; } copy;
        struct { int stride, pad; } conv;
        struct { int max, k, stride, pad; } pool;
        struct { float p; uint64_t salt; } drop;
        struct { float eps; } ln;
        struct { float eps, momentum; int relu; } bn; /* relu: fused relu (autodiff.c) */
        struct { float smoothing; } xent; /* label smoothing in [0, 1) */
        struct { int heads; } attn;
        struct {
            int weight, relu, slot, stride, pad, threads;
            float eps;
        } q; /* quant.c */
    } a;
};

struct mge_graph {
    struct mge_value *values;
    int n_values, cap_values;
    struct mge_node *nodes;
    int n_nodes, cap_nodes;
    int n_forward;               /* nodes [0, n_forward) are the forward pass */
    int *params;                 /* value ids of parameters, creation order */
    int n_params, cap_params;
    int *grads;                  /* grads[i]: gradient value of params[i] or -1 */
    int loss;                    /* value id of the loss, -1 if no backward */
    int err;
    char errmsg[256];
    int planned, allocated;
    size_t param_bytes, grad_bytes, act_bytes, lower_bound;
    float *param_arena, *grad_arena;
    unsigned char *act_arena;
    int64_t batch;               /* current run's batch size */
    int64_t batch_max;           /* planned batch size (shape[0] of batched inputs) */
    int64_t step;                /* current run's step (dropout seeds) */
    int training;                /* current run trains */
    uint64_t seed;               /* dropout base seed */
    double *profile;             /* per node: seconds spent, when profiling (else NULL) */
    size_t *grad_ready;          /* per node: gradient-arena prefix final after it (planned) */
    void (*ready_fn)(void *ctx, size_t ready_bytes); /* gradient-ready hook, or NULL */
    void *ready_ctx;
    void (*op_fn)(void *ctx, int node, double t0, double t1); /* op timing hook, or NULL */
    void *op_ctx;
    float loss_scale;            /* backward seed dloss (1 unless set) */
    int64_t row_offset;          /* rows of the global batch before this run's (dropout masks) */
    int bf16;                    /* GEMMs and convs take bf16-rounded inputs (train.precision) */
    const struct mge_device *dev; /* where the arenas live (engine/device.h); NULL: cpu */
    unsigned char *input_arena;   /* inputs' device copies, when dev is not host-visible */
    size_t input_bytes;           /* one slot's planned size (every input at the planned batch) */
    /* input staging: the arena holds two slots of input_bytes (exec.c, mge_graph_stage) */
    unsigned char *stage_host[2]; /* per slot: host staging buffer (pinned on cuda), or NULL */
    int slot;                     /* the slot the input values point at (the last run's) */
    int staged;                   /* slot ^ 1 holds the next run's inputs */
    int64_t staged_batch;         /* the batch size they were staged at */
    struct mge__eager *eager;    /* eager mode's state (eager.c), or NULL: the static plan */
    struct mge__quant *quant;    /* mge_graph_set_quant() state, or NULL (quant.c) */
};

/* quant.c: the builders mge_linear()/mge_conv2d() hand over to when quantising (their checks
 * done), the state's destructor, and the CPU kernels of the quant ops. */
int mge__quant_wants(const struct mge_graph *g);
int mge__quant_linear(struct mge_graph *g, int x, int w, int b, enum mge_act act);
int mge__quant_conv2d(struct mge_graph *g, int x, int w, int b, int stride, int pad);
void mge__quant_free(struct mge__quant *q);
/*
 * int8 graphs: fold the op being built into the int8 convolution just added, when its input @x is
 * that convolution's output (a batch norm first, then an add of a same-shaped value, then a
 * relu); *@y gets the op's output, or -1 where nothing was folded (build the op as usual).
 * MGE_OK, or an error recorded in @g. The convolution's plain output is gone after a fold:
 * mge__quant_check_use() refuses it as an input to a later op.
 */
int mge__quant_fuse_batchnorm(struct mge_graph *g, int x, int w, int b, int running_mean,
                              int running_var, float eps, int *y);
int mge__quant_fuse_add(struct mge_graph *g, int a, int b, int *y);
int mge__quant_fuse_relu(struct mge_graph *g, int x, int *y);
int mge__quant_check_use(struct mge_graph *g, int v, const char *op);
int mge__cpu_fake_quant(struct mge_graph *g, const struct mge_node *n);
int mge__cpu_fake_quant_grad(struct mge_graph *g, const struct mge_node *n);
int mge__cpu_qlinear(struct mge_graph *g, const struct mge_node *n);
int mge__cpu_qconv2d(struct mge_graph *g, const struct mge_node *n);
/*
 * int8 graphs (not eager; MGE_INT8_BLOCK=off: never): runs of consecutive int8 convolutions
 * become image-major segments, each image through all of them before the next (the first node
 * runs the segment, the others nothing), with values used only inside one kept per image in
 * per-thread buffers. mge_graph_plan() calls it before lifetimes and gives every node of a
 * segment the segment's whole span (mge__quant_span(): [*@lo, *@hi], @ni itself outside any)
 * and no lifetime to the per-image values (mge__quant_local()). MGE_OK or MGE_NOMEM.
 */
int mge__quant_plan(struct mge_graph *g);
void mge__quant_span(const struct mge_graph *g, int ni, int64_t *lo, int64_t *hi);
/* Whether value @v lives in a segment's per-image buffers (then it gets no arena memory). */
int mge__quant_local(const struct mge_graph *g, int v);
/* Tests: nodes in image-major segments, and (@locals) values kept per image. */
int mge__quant_segment_nodes(const struct mge_graph *g, int *locals);

/* Sticky error: record the first failure and return -code. */
int mge__graph_fail(struct mge_graph *g, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Append a value / node; return its id or -err. */
int mge__graph_add_value(struct mge_graph *g, enum mge_value_kind kind, enum mge_dtype dt,
                         int ndim, const int64_t *shape, int batched, const char *name);
int mge__graph_add_node(struct mge_graph *g, const struct mge_node *n);
/* Element count of @v at the current batch size. */
int64_t mge__value_numel_now(const struct mge_graph *g, int v);
/* Shape of @v at the current batch size (dim 0 replaced when batched). */
void mge__value_shape_now(const struct mge_graph *g, int v, int64_t *shape);
size_t mge__value_bytes(const struct mge_graph *g, int v);
/* Root of the alias chain of @v. */
int mge__value_root(const struct mge_graph *g, int v);

/* FLOPs of one op (2 per multiply-add; elementwise ops count their outputs). */
double mge__node_flops(const struct mge_graph *g, const struct mge_node *n);
/* A copy of @g's IR (not its arenas) in *@out, freed with mge_graph_free(). */
int mge__graph_clone(const struct mge_graph *g, struct mge_graph **out);

/*
 * Sublinear mode without a budget takes the least recomputation among the plans whose arena is
 * at most MGE__SUBLINEAR_SLACK times the smallest one found; recomputation under
 * MGE__SUBLINEAR_FREE of the step's FLOPs counts as none (the smaller arena wins).
 */
#define MGE__SUBLINEAR_SLACK 1.41421356
#define MGE__SUBLINEAR_FREE 1e-3

/* One activation for the planner: lifetime [first, last] in node indices, bytes, result offset. */
struct mge__plan_item {
    int v;
    size_t size;
    int64_t first, last;
    size_t offset;
};
/*
 * Assign offsets to @items so that items alive at the same time do not overlap (greedy orders,
 * then local search near the peak; a function of the input alone, so reruns plan alike). Keeps
 * the order of @items. Returns the arena size, or (size_t)-1 on OOM.
 */
size_t mge__plan_assign(struct mge__plan_item *items, int n);
/* Largest sum of sizes alive at one time over @items (the arena's lower bound). */
size_t mge__plan_lower_bound(const struct mge__plan_item *items, int n, int64_t end);

/*
 * eager.c, for the planner and executor: give every activation its own allocation (called by
 * mge_graph_alloc once the arenas exist), check the outputs of node @node after it ran
 * (MGE_RANGE and a report on the first bad value), free the state.
 */
int mge__eager_alloc(struct mge_graph *g);
int mge__eager_check(struct mge_graph *g, int node);
void mge__eager_free(struct mge_graph *g);

/* The device's kernel for one node: reads and writes the values' data. */
typedef int (*mge_node_fn)(struct mge_graph *g, const struct mge_node *n);
struct mge_ops_table {
    const char *device;
    mge_node_fn fn[MGE_OP__COUNT];
};
extern const struct mge_ops_table mge__cpu_ops;
/* The graph's device: g->dev, or the CPU device. */
const struct mge_device *mge__graph_dev(const struct mge_graph *g);
/* Release every arena of @g through its device (allocated or not). */
void mge__graph_free_arenas(struct mge_graph *g);

#endif
