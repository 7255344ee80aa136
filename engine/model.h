/* model.h: the model zoo: graphs built from a job spec (mlp, lenet, deep_mlp, resnet, gpt, graph). */
#ifndef MGE_ENGINE_MODEL_H
#define MGE_ENGINE_MODEL_H

#include <stdint.h>

#include "common/jobspec.h"
#include "engine/engine.h"

struct mge_model {
    int x;       /* input value: (B, dim) or (B, C, H, W) f32; gpt: (B, T) i32 token ids */
    int y;       /* labels: (B) i32; gpt: (B, T) i32 next tokens */
    int logits;  /* (B, classes); gpt: (B, T, vocab) */
    int loss;    /* scalar mean cross-entropy */
};

/*
 * Build @spec's model into @g for batches of up to @batch samples of shape (c, h, w)
 * (dim = c*h*w) and @classes classes (gpt: windows of model.context tokens; c, h, w and
 * @classes are not used). On error returns the graph's error code and
 * mge_graph_error_msg(g) says why.
 */
int mge_model_build(struct mge_graph *g, const struct mge_jobspec *spec, int64_t batch, int c,
                    int h, int w, int classes, struct mge_model *m);

/*
 * model_graph.c, for mge_model_build(): model.type graph, spec->model.graph's nodes (checked
 * and shaped by common/graphspec.c) against data of shape (c, h, w) with @classes classes.
 * Errors name the node and its line in mge_graph_error_msg(g).
 */
int mge__model_graph_build(struct mge_graph *g, const struct mge_jobspec *spec, int64_t batch,
                           int c, int h, int w, int classes, struct mge_model *m);

/*
 * The name PyTorch's equivalent module gives the parameter or buffer mge calls @name: the
 * first zoo models' "fc1.w"/"fc1.b" become "fc1.weight"/"fc1.bias"; resnet's names are
 * PyTorch's already. Writes at most @n bytes (NUL included) to @out; returns @out.
 */
char *mge_model_torch_name(const char *name, char *out, size_t n);

#endif
