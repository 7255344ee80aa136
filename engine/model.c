/* model.c: the model zoo, written with the graph-building API as any user model would be. */
#include "engine/model.h"

#include <stdio.h>

#include "common/err.h"

static enum mge_act act_of(enum mge_activation a)
{
    switch (a) {
    case MGE_ACT_RELU:
        return MGE_ACT_FN_RELU;
    case MGE_ACT_GELU:
        return MGE_ACT_FN_GELU;
    case MGE_ACT_TANH:
        return MGE_ACT_FN_TANH;
    case MGE_ACT_SIGMOID:
        return MGE_ACT_FN_SIGMOID;
    }
    return MGE_ACT_FN_RELU;
}

/* y = act(x @ W^T + b) with PyTorch's nn.Linear parameters and init. */
static int linear_layer(struct mge_graph *g, const char *name, int x, int64_t in, int64_t out,
                        enum mge_act act, float dropout)
{
    char wn[64], bn[64];
    snprintf(wn, sizeof(wn), "%s.w", name);
    snprintf(bn, sizeof(bn), "%s.b", name);
    int64_t ws[2] = {out, in}, bs[1] = {out};
    int w = mge_param(g, wn, 2, ws, MGE_INIT_UNIFORM_FAN_IN, in);
    int b = mge_param(g, bn, 1, bs, MGE_INIT_UNIFORM_FAN_IN, in);
    int y = mge_linear(g, x, w, b, act);
    if (dropout > 0.0f && act != MGE_ACT_NONE)
        y = mge_dropout(g, y, dropout);
    return y;
}

static int conv_layer(struct mge_graph *g, const char *name, int x, int cin, int cout, int k,
                      int pad)
{
    char wn[64], bn[64];
    snprintf(wn, sizeof(wn), "%s.w", name);
    snprintf(bn, sizeof(bn), "%s.b", name);
    int64_t ws[4] = {cout, cin, k, k}, bs[1] = {cout};
    int w = mge_param(g, wn, 4, ws, MGE_INIT_UNIFORM_FAN_IN, (int64_t)cin * k * k);
    int b = mge_param(g, bn, 1, bs, MGE_INIT_UNIFORM_FAN_IN, (int64_t)cin * k * k);
    return mge_conv2d(g, x, w, b, 1, pad);
}

/*
 * conv -> relu -> 2x2 max pool, computed as conv -> pool -> relu: max pooling and relu commute
 * exactly (values, and gradients: the same element gets it, or none when the window's maximum
 * is <= 0), and relu then touches a quarter of the elements.
 */
static int conv_relu_pool(struct mge_graph *g, const char *name, int x, int cin, int cout, int k,
                          int pad)
{
    return mge_relu(g, mge_maxpool2d(g, conv_layer(g, name, x, cin, cout, k, pad), 2, 2, 0));
}

int mge_model_build(struct mge_graph *g, const struct mge_jobspec *spec, int64_t batch, int c,
                    int h, int w, int classes, struct mge_model *m)
{
    const struct mge_model_spec *ms = &spec->model;
    int64_t dim = (int64_t)c * h * w, ys[1] = {batch};
    int x, t;
    char name[32];

    if (ms->type == MGE_MODEL_LENET) {
        int64_t xs[4] = {batch, c, h, w};
        x = mge_input(g, "x", MGE_DTYPE_F32, 4, xs, 1);
        /* LeNet-5: conv5(6, pad 2) pool2 conv5(16) pool2 fc120 fc84 fc10 */
        t = conv_relu_pool(g, "conv1", x, c, 6, 5, 2);
        t = conv_relu_pool(g, "conv2", t, 6, 16, 5, 0);
        t = mge_flatten(g, t);
        int64_t flat = t >= 0 ? mge_value_shape(g, t)[1] : 1;
        t = linear_layer(g, "fc1", t, flat, 120, MGE_ACT_FN_RELU, ms->dropout);
        t = linear_layer(g, "fc2", t, 120, 84, MGE_ACT_FN_RELU, ms->dropout);
        t = linear_layer(g, "fc3", t, 84, classes, MGE_ACT_NONE, 0.0f);
    } else {
        int64_t xs[2] = {batch, dim};
        x = mge_input(g, "x", MGE_DTYPE_F32, 2, xs, 1);
        t = x;
        int64_t in = dim;
        int n_hidden = ms->type == MGE_MODEL_DEEP_MLP ? ms->layers : ms->n_hidden;
        for (int i = 0; i < n_hidden; i++) {
            int64_t out = ms->type == MGE_MODEL_DEEP_MLP ? ms->width : ms->hidden[i];
            snprintf(name, sizeof(name), "fc%d", i + 1);
            t = linear_layer(g, name, t, in, out, act_of(ms->activation), ms->dropout);
            in = out;
        }
        snprintf(name, sizeof(name), "fc%d", n_hidden + 1);
        t = linear_layer(g, name, t, in, classes, MGE_ACT_NONE, 0.0f);
    }
    m->x = x;
    m->y = mge_input(g, "y", MGE_DTYPE_I32, 1, ys, 1);
    m->logits = t;
    m->loss = mge_cross_entropy(g, t, m->y);
    if (mge_graph_error(g) == MGE_OK)
        mge_graph_keep(g, m->logits);
    return mge_graph_error(g);
}
