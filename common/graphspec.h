/*
 * graphspec.h: models declared in the job spec (model.type: graph): a list of named nodes, each
 * an op with its inputs by name and its attributes, validated in common/ (structure and shapes)
 * so the coordinator refuses a bad graph as mge-train does; engine/model_graph.c builds it.
 * docs/job-spec.md ("Graph models") documents every op and attribute.
 */
#ifndef MGE_COMMON_GRAPHSPEC_H
#define MGE_COMMON_GRAPHSPEC_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MGE_GRAPH_MAX_NODES 4096 /* model.nodes: at most this many */
#define MGE_GRAPH_MAX_INPUTS 16  /* inputs of one node (concat) */
#define MGE_GRAPH_NAME_MAX 48    /* node names; parameters are "<name>.running_mean" and such */
#define MGE_GRAPH_MAX_DIMS 6     /* with the batch dim (the engine's MGE_MAX_DIMS) */

enum mge_gop {
    MGE_GOP_INPUT,
    MGE_GOP_LINEAR,
    MGE_GOP_CONV2D,
    MGE_GOP_BATCHNORM2D,
    MGE_GOP_LAYERNORM,
    MGE_GOP_RELU,
    MGE_GOP_GELU,
    MGE_GOP_TANH,
    MGE_GOP_SIGMOID,
    MGE_GOP_ADD,
    MGE_GOP_SUB,
    MGE_GOP_MUL,
    MGE_GOP_MAXPOOL,
    MGE_GOP_AVGPOOL,
    MGE_GOP_GLOBAL_AVGPOOL,
    MGE_GOP_FLATTEN,
    MGE_GOP_RESHAPE,
    MGE_GOP_DROPOUT,
    MGE_GOP_CONCAT,
    MGE_GOP_CROSS_ENTROPY,
    MGE_GOP_TOKENS,           /* the input of a language model: [batch, context] token ids */
    MGE_GOP_EMBEDDING,        /* token ids -> [batch, context, d_model] rows of its weight */
    MGE_GOP_POS_EMBEDDING,    /* x + a learned [context, d_model] position table */
    MGE_GOP_CAUSAL_ATTENTION, /* [B, T, 3C] q, k, v -> [B, T, C], masked to earlier tokens */
    MGE_GOP_TIED_LINEAR,      /* x @ E^T: the output layer tied to embedding node E */
    MGE_GOP_COUNT
};

/*
 * Weight init: PyTorch's Linear/Conv2d default (uniform), torchvision ResNet's kaiming_normal_
 * (conv2d), or GPT-2's N(0, 0.02^2) with zero bias (linear; N(0, 0.02^2 / (2 residual_layers))
 * with residual_layers).
 */
enum mge_ginit { MGE_GINIT_UNIFORM, MGE_GINIT_KAIMING_NORMAL, MGE_GINIT_NORMAL };

struct mge_gnode {
    char name[MGE_GRAPH_NAME_MAX + 1]; /* [A-Za-z0-9._-], unique */
    enum mge_gop op;
    int line; /* of the node in the spec (0: from an override) */
    int n_inputs;
    int inputs[MGE_GRAPH_MAX_INPUTS]; /* indices into mge_graphspec.nodes */
    /* attributes (0 where the op has none) */
    int64_t features;                  /* linear: out_features; conv2d: out_channels */
    int kernel, stride, padding;       /* conv2d, maxpool, avgpool */
    int bias;                          /* linear, conv2d: 1 = with bias (default) */
    enum mge_ginit init;               /* conv2d, linear */
    int residual_layers;               /* linear with init normal: 0, or variance / (2 this) */
    int64_t vocab;                     /* tokens, embedding: token ids are below it */
    int64_t context;                   /* tokens, pos_embedding: tokens per window */
    int64_t d_model;                   /* embedding: width of a row */
    int heads;                         /* causal_attention */
    int tied;                          /* tied_linear: index of its embedding node, else -1 */
    double eps;                        /* batchnorm2d, layernorm (default 1e-5) */
    double momentum;                   /* batchnorm2d (default 0.1) */
    double p;                          /* dropout probability (default 0.5) */
    int axis;                          /* concat: dim >= 1 of the output (batch is 0) */
    int ndim;                          /* input: sample dims; reshape: target dims */
    int64_t shape[MGE_GRAPH_MAX_DIMS]; /* the same without the batch dim (reshape: one -1) */
    /* inferred with batch = train.batch_size */
    int out_ndim; /* 0 for the loss (a scalar) */
    int64_t out_shape[MGE_GRAPH_MAX_DIMS];
};

struct mge_graphspec {
    int n;                   /* nodes */
    struct mge_gnode *nodes; /* in the order listed */
    int *order;              /* n indices: a topological order, the listed one where it is one */
    int input;               /* the one input node (op input or tokens) */
    int loss;                /* the one cross_entropy node */
};

/* Free a graph spec (owned by its struct mge_jobspec); NULL does nothing. */
void mge_graphspec_free(struct mge_graphspec *gs);
/* The op's name as written in the spec ("conv2d"), "unknown" out of range. */
const char *mge_gop_name(enum mge_gop op);
/* Whether the input node is op tokens: the graph is a language model on token windows. */
bool mge_graphspec_reads_tokens(const struct mge_graphspec *gs);
/* Elements of one sample of the input node (product of its shape). */
int64_t mge_graphspec_input_numel(const struct mge_graphspec *gs);

#ifdef __cplusplus
}
#endif
#endif
