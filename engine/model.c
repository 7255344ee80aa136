/* model.c: the model zoo, written with the graph-building API as any user model would be. */
#include "engine/model.h"

#include <stdio.h>
#include <string.h>

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

/* Parameter names: "w"/"b" in the first zoo models, PyTorch's state-dict names in resnet. */
static const char *const short_names[2] = {"w", "b"};
static const char *const torch_names[2] = {"weight", "bias"};

/* y = act(x @ W^T + b) with PyTorch's nn.Linear parameters and init; @sfx names w and b. */
static int linear_layer(struct mge_graph *g, const char *name, const char *const sfx[2], int x,
                        int64_t in, int64_t out, enum mge_act act, float dropout)
{
    char wn[64], bn[64];
    snprintf(wn, sizeof(wn), "%s.%s", name, sfx[0]);
    snprintf(bn, sizeof(bn), "%s.%s", name, sfx[1]);
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

/*
 * ResNet, as torchvision writes it and He et al. (2016, section 4.2) shape it for CIFAR: a 3x3
 * stem, three stages of n basic blocks (width, 2 width, 4 width channels; the 2nd and 3rd
 * start with stride 2), global average pooling, a linear head; depth = 6n + 2. Where a block
 * changes shape its shortcut is a 1x1 conv (stride 2) + batch norm (option B, torchvision's
 * "downsample"), not zero padding (option A): it keeps every parameter a tensor PyTorch's
 * ResNet has. Convs have no bias and kaiming-normal fan-out init; batch norms weight 1, bias
 * 0, eps 1e-5, momentum 0.1. Names are PyTorch's (layer1.0.conv1.weight, bn1.running_mean,
 * fc.weight), without num_batches_tracked (unused with a fixed momentum).
 */
static int conv_bn(struct mge_graph *g, const char *conv, const char *bn, int x, int cin, int cout,
                   int k, int stride)
{
    char name[96];
    int64_t ws[4] = {cout, cin, k, k}, cs[1] = {cout};
    snprintf(name, sizeof(name), "%s.weight", conv);
    int w = mge_param(g, name, 4, ws, MGE_INIT_NORMAL_FAN_OUT, (int64_t)cout * k * k);
    snprintf(name, sizeof(name), "%s.weight", bn);
    int bw = mge_param(g, name, 1, cs, MGE_INIT_ONE, 1);
    snprintf(name, sizeof(name), "%s.bias", bn);
    int bb = mge_param(g, name, 1, cs, MGE_INIT_ZERO, 1);
    snprintf(name, sizeof(name), "%s.running_mean", bn);
    int rm = mge_buffer(g, name, 1, cs, MGE_INIT_ZERO);
    snprintf(name, sizeof(name), "%s.running_var", bn);
    int rv = mge_buffer(g, name, 1, cs, MGE_INIT_ONE);
    return mge_batchnorm2d(g, mge_conv2d(g, x, w, -1, stride, k / 2), bw, bb, rm, rv, 1e-5f, 0.1f);
}

/* relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), named @name (e.g. "layer2.0"). */
static int basic_block(struct mge_graph *g, const char *name, int x, int cin, int cout, int stride)
{
    char c1[64], b1[64], c2[64], b2[64], dc[64], db[64];
    snprintf(c1, sizeof(c1), "%s.conv1", name);
    snprintf(b1, sizeof(b1), "%s.bn1", name);
    snprintf(c2, sizeof(c2), "%s.conv2", name);
    snprintf(b2, sizeof(b2), "%s.bn2", name);
    int h = mge_relu(g, conv_bn(g, c1, b1, x, cin, cout, 3, stride));
    h = conv_bn(g, c2, b2, h, cout, cout, 3, 1);
    int sc = x;
    if (stride != 1 || cin != cout) {
        snprintf(dc, sizeof(dc), "%s.downsample.0", name);
        snprintf(db, sizeof(db), "%s.downsample.1", name);
        sc = conv_bn(g, dc, db, x, cin, cout, 1, stride);
    }
    return mge_relu(g, mge_add(g, h, sc));
}

/*
 * relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x))))))) + shortcut(x)): torchvision's
 * Bottleneck (v1.5: the stride is on the 3x3 conv2), 1x1 -> 3x3 -> 1x1 with @planes channels
 * inside and 4 @planes out.
 */
static int bottleneck_block(struct mge_graph *g, const char *name, int x, int cin, int planes,
                            int stride)
{
    char cn[64], bn[64];
    int h = x, ch = cin;
    static const int ks[3] = {1, 3, 1};
    for (int i = 0; i < 3; i++) {
        int cout = i == 2 ? 4 * planes : planes;
        snprintf(cn, sizeof(cn), "%s.conv%d", name, i + 1);
        snprintf(bn, sizeof(bn), "%s.bn%d", name, i + 1);
        h = conv_bn(g, cn, bn, h, ch, cout, ks[i], i == 1 ? stride : 1);
        if (i < 2)
            h = mge_relu(g, h);
        ch = cout;
    }
    int sc = x;
    if (stride != 1 || cin != 4 * planes) {
        snprintf(cn, sizeof(cn), "%s.downsample.0", name);
        snprintf(bn, sizeof(bn), "%s.downsample.1", name);
        sc = conv_bn(g, cn, bn, x, cin, 4 * planes, 1, stride);
    }
    return mge_relu(g, mge_add(g, h, sc));
}

/* torchvision's ResNet family: blocks per stage, and whether they are bottlenecks. */
static const struct {
    int layers[4];
    int bottleneck;
} tv_resnets[] = {
    [MGE_RESNET_18] = {{2, 2, 2, 2}, 0},   [MGE_RESNET_34] = {{3, 4, 6, 3}, 0},
    [MGE_RESNET_50] = {{3, 4, 6, 3}, 1},   [MGE_RESNET_101] = {{3, 4, 23, 3}, 1},
    [MGE_RESNET_152] = {{3, 8, 36, 3}, 1},
};

/*
 * The CIFAR variant: 3 stages of (depth - 2) / 6 basic blocks after a 3x3 stem. The torchvision
 * variants (ResNet-18 ... 152, He et al. section 3.4, torchvision.models.resnet): a 7x7/2 conv
 * stem with a 3x3/2 max pool (or, with model.stem cifar, the 3x3/1 conv alone, for small
 * images), 4 stages of width, 2, 4, 8 width planes (4x as many channels out of a bottleneck),
 * stages 2-4 starting with stride 2. Any input of at least 1x1 works: every strided conv and
 * the max pool are padded, so a map never shrinks below 1x1 (28x28 ends at 1x1).
 */
static int resnet(struct mge_graph *g, const struct mge_model_spec *ms, int x, int c, int classes)
{
    const int tv = ms->variant != MGE_RESNET_CIFAR, width = ms->width;
    const int stages = tv ? 4 : 3, expansion = tv && tv_resnets[ms->variant].bottleneck ? 4 : 1;
    int cin = width, t;
    char name[32];
    if (tv && !ms->stem_cifar) {
        t = mge_relu(g, conv_bn(g, "conv1", "bn1", x, c, width, 7, 2));
        t = mge_maxpool2d(g, t, 3, 2, 1);
    } else {
        t = mge_relu(g, conv_bn(g, "conv1", "bn1", x, c, width, 3, 1));
    }
    for (int stage = 0; stage < stages; stage++) {
        int planes = width << stage;
        int n = tv ? tv_resnets[ms->variant].layers[stage] : (ms->depth - 2) / 6;
        for (int i = 0; i < n; i++) {
            int stride = stage > 0 && i == 0 ? 2 : 1;
            snprintf(name, sizeof(name), "layer%d.%d", stage + 1, i);
            t = expansion == 4 ? bottleneck_block(g, name, t, cin, planes, stride)
                               : basic_block(g, name, t, cin, planes, stride);
            cin = planes * expansion;
        }
    }
    t = mge_global_avgpool2d(g, t);
    return linear_layer(g, "fc", torch_names, t, cin, classes, MGE_ACT_NONE, 0.0f);
}

/*
 * GPT as nanoGPT writes it (Karpathy's model.py, GPT-2's layout): token + position embeddings,
 * @layers pre-LayerNorm blocks x + attn(ln_1(x)), x + mlp(ln_2(x)) with fused causal attention
 * and a 4x GELU MLP (tanh approximation, GPT-2's), a final LayerNorm, and logits x @ wte^T with
 * the output layer tied to the token embedding (wte's gradient sums both uses). Linear and
 * embedding weights N(0, 0.02^2), the residual projections (c_proj) N(0, 0.02^2 / (2 layers)),
 * biases 0, LayerNorms 1 and 0 (eps 1e-5). Windows are always model.context tokens long, so
 * the position embedding is added whole. Parameter names are nanoGPT's state-dict names.
 */
static int gpt_param(struct mge_graph *g, const char *prefix, const char *name, int64_t d0,
                     int64_t d1, enum mge_init init, int64_t fan)
{
    char full[96];
    int64_t shape[2] = {d0, d1};
    snprintf(full, sizeof(full), "%s%s", prefix, name);
    return mge_param(g, full, d1 > 0 ? 2 : 1, shape, init, fan);
}

static int gpt_linear(struct mge_graph *g, const char *prefix, int x, int64_t in, int64_t out,
                      int64_t fan, enum mge_act act)
{
    char name[96];
    snprintf(name, sizeof(name), "%s.weight", prefix);
    int w = gpt_param(g, name, "", out, in, MGE_INIT_NORMAL_GPT, fan);
    snprintf(name, sizeof(name), "%s.bias", prefix);
    int b = gpt_param(g, name, "", out, 0, MGE_INIT_ZERO, 1);
    return mge_linear(g, x, w, b, act);
}

static int gpt_layernorm(struct mge_graph *g, const char *prefix, int x, int64_t C)
{
    char name[96];
    snprintf(name, sizeof(name), "%s.weight", prefix);
    int w = gpt_param(g, name, "", C, 0, MGE_INIT_ONE, 1);
    snprintf(name, sizeof(name), "%s.bias", prefix);
    int b = gpt_param(g, name, "", C, 0, MGE_INIT_ZERO, 1);
    return mge_layernorm(g, x, w, b, 1e-5f);
}

static int gpt_dropout(struct mge_graph *g, int x, float p)
{
    return p > 0.0f ? mge_dropout(g, x, p) : x;
}

static int gpt(struct mge_graph *g, const struct mge_model_spec *ms, int64_t batch,
               struct mge_model *m)
{
    int64_t T = ms->context, C = ms->d_model, V = ms->vocab, L = ms->layers, xs[2] = {batch, T};
    char p[64], q[96];
    m->x = mge_input(g, "x", MGE_DTYPE_I32, 2, xs, 1);
    m->y = mge_input(g, "y", MGE_DTYPE_I32, 2, xs, 1);
    int wte = gpt_param(g, "transformer.wte.weight", "", V, C, MGE_INIT_NORMAL_GPT, 1);
    int wpe = gpt_param(g, "transformer.wpe.weight", "", T, C, MGE_INIT_NORMAL_GPT, 1);
    int t = gpt_dropout(g, mge_add(g, mge_embedding(g, m->x, wte), wpe), ms->dropout);
    for (int64_t l = 0; l < L; l++) {
        snprintf(p, sizeof(p), "transformer.h.%lld.", (long long)l);
        snprintf(q, sizeof(q), "%sln_1", p);
        int h = gpt_layernorm(g, q, t, C);
        snprintf(q, sizeof(q), "%sattn.c_attn", p);
        h = mge_causal_attention(g, gpt_linear(g, q, h, C, 3 * C, 1, MGE_ACT_NONE), ms->heads);
        snprintf(q, sizeof(q), "%sattn.c_proj", p);
        h = gpt_linear(g, q, h, C, C, 2 * L, MGE_ACT_NONE);
        t = mge_add(g, t, gpt_dropout(g, h, ms->dropout));
        snprintf(q, sizeof(q), "%sln_2", p);
        h = gpt_layernorm(g, q, t, C);
        snprintf(q, sizeof(q), "%smlp.c_fc", p);
        h = gpt_linear(g, q, h, C, 4 * C, 1, MGE_ACT_FN_GELU);
        snprintf(q, sizeof(q), "%smlp.c_proj", p);
        h = gpt_linear(g, q, h, 4 * C, C, 2 * L, MGE_ACT_NONE);
        t = mge_add(g, t, gpt_dropout(g, h, ms->dropout));
    }
    t = gpt_layernorm(g, "transformer.ln_f", t, C);
    return mge_linear(g, t, wte, -1, MGE_ACT_NONE); /* tied: lm_head.weight is wte */
}

char *mge_model_torch_name(const char *name, char *out, size_t n)
{
    size_t len = strlen(name);
    if (len > 2 && !strcmp(name + len - 2, ".w"))
        snprintf(out, n, "%.*s.weight", (int)(len - 2), name);
    else if (len > 2 && !strcmp(name + len - 2, ".b"))
        snprintf(out, n, "%.*s.bias", (int)(len - 2), name);
    else
        snprintf(out, n, "%s", name);
    return out;
}

int mge_model_build(struct mge_graph *g, const struct mge_jobspec *spec, int64_t batch, int c,
                    int h, int w, int classes, struct mge_model *m)
{
    const struct mge_model_spec *ms = &spec->model;
    int64_t dim = (int64_t)c * h * w, ys[1] = {batch};
    int x, t;
    char name[32];

    if (ms->type == MGE_MODEL_GRAPH) {
        int rc = mge__model_graph_build(g, spec, batch, c, h, w, classes, m);
        if (rc == MGE_OK)
            mge_graph_keep(g, m->logits);
        return rc;
    }
    if (ms->type == MGE_MODEL_GPT) {
        t = gpt(g, ms, batch, m);
        x = m->x;
    } else if (ms->type == MGE_MODEL_RESNET) {
        int64_t xs[4] = {batch, c, h, w};
        x = mge_input(g, "x", MGE_DTYPE_F32, 4, xs, 1);
        t = resnet(g, ms, x, c, classes);
    } else if (ms->type == MGE_MODEL_LENET) {
        int64_t xs[4] = {batch, c, h, w};
        x = mge_input(g, "x", MGE_DTYPE_F32, 4, xs, 1);
        /* LeNet-5: conv5(6, pad 2) pool2 conv5(16) pool2 fc120 fc84 fc10 */
        t = conv_relu_pool(g, "conv1", x, c, 6, 5, 2);
        t = conv_relu_pool(g, "conv2", t, 6, 16, 5, 0);
        t = mge_flatten(g, t);
        int64_t flat = t >= 0 ? mge_value_shape(g, t)[1] : 1;
        t = linear_layer(g, "fc1", short_names, t, flat, 120, MGE_ACT_FN_RELU, ms->dropout);
        t = linear_layer(g, "fc2", short_names, t, 120, 84, MGE_ACT_FN_RELU, ms->dropout);
        t = linear_layer(g, "fc3", short_names, t, 84, classes, MGE_ACT_NONE, 0.0f);
    } else {
        int64_t xs[2] = {batch, dim};
        x = mge_input(g, "x", MGE_DTYPE_F32, 2, xs, 1);
        t = x;
        int64_t in = dim;
        int n_hidden = ms->type == MGE_MODEL_DEEP_MLP ? ms->layers : ms->n_hidden;
        for (int i = 0; i < n_hidden; i++) {
            int64_t out = ms->type == MGE_MODEL_DEEP_MLP ? ms->width : ms->hidden[i];
            snprintf(name, sizeof(name), "fc%d", i + 1);
            t = linear_layer(g, name, short_names, t, in, out, act_of(ms->activation), ms->dropout);
            in = out;
        }
        snprintf(name, sizeof(name), "fc%d", n_hidden + 1);
        t = linear_layer(g, name, short_names, t, in, classes, MGE_ACT_NONE, 0.0f);
    }
    m->x = x;
    if (ms->type != MGE_MODEL_GPT)
        m->y = mge_input(g, "y", MGE_DTYPE_I32, 1, ys, 1);
    m->logits = t;
    m->loss = mge_cross_entropy_smoothed(g, t, m->y, (float)spec->train.label_smoothing);
    if (mge_graph_error(g) == MGE_OK)
        mge_graph_keep(g, m->logits);
    return mge_graph_error(g);
}
