/* model.h: the model zoo: graphs built from a job spec (mlp, lenet, deep_mlp, resnet). */
#ifndef MGE_ENGINE_MODEL_H
#define MGE_ENGINE_MODEL_H

#include <stdint.h>

#include "common/jobspec.h"
#include "engine/engine.h"

struct mge_model {
    int x;       /* input value: (B, dim) or (B, C, H, W) f32 */
    int y;       /* labels: (B) i32 */
    int logits;  /* (B, classes) */
    int loss;    /* scalar mean cross-entropy */
};

/*
 * Build @spec's model into @g for batches of up to @batch samples of shape (c, h, w)
 * (dim = c*h*w) and @classes classes. On error returns the graph's error code and
 * mge_graph_error_msg(g) says why.
 */
int mge_model_build(struct mge_graph *g, const struct mge_jobspec *spec, int64_t batch, int c,
                    int h, int w, int classes, struct mge_model *m);

#endif
