/*
 * device_cuda.c: the "cuda" device (engine/device.h): device 0 of the process's
 * CUDA_VISIBLE_DEVICES, one cudaMalloc per arena, copies through the CUDA runtime, and the ops
 * table mapping each IR op onto kernels/cuda/ with the geometry the CPU table uses
 * (device_int.h). Built only with nvcc (else device_cuda_none.c). Every op is issued on the
 * default stream, so they run in order; host code sees results after a copy (which waits).
 * Ops without a kernel here (the quantisation ops) make mge_graph_set_device() refuse the graph.
 */

#include "common/err.h"
#include "engine/device.h"
#include "engine/device_int.h"
#include "engine/engine_int.h"
#include "kernels/cuda/cuda.h"

#define F MGE__F
#define FOPT MGE__FOPT
#define I32(g, v) ((const int32_t *)(g)->values[(v)].data)

/* ---- the device ---- */

static void *cuda_alloc(size_t bytes)
{
    void *p = NULL;
    return mge_cuda_malloc(&p, bytes ? bytes : 64) == MGE_OK ? p : NULL;
}

static void cuda_free(void *p, size_t bytes)
{
    (void)bytes;
    mge_cuda_free(p);
}

/* The seam's copies return nothing: a failure is logged where it happens (cuda_ops.cu), and a
 * sticky CUDA error then fails the next kernel, so the run fails with it. */
static void cuda_h2d(void *dst, const void *src, size_t n)
{
    if (n)
        mge_cuda_to_device(dst, src, n);
}

static void cuda_d2h(void *dst, const void *src, size_t n)
{
    if (n)
        mge_cuda_to_host(dst, src, n);
}

static void cuda_d2d(void *dst, const void *src, size_t n)
{
    mge_cuda_copy(dst, src, n);
}

static void cuda_memset(void *dst, int c, size_t n)
{
    if (n)
        mge_cuda_memset(dst, c, n);
}

static void cuda_sync(void)
{
    mge_cuda_sync();
}

/* The optimiser's host code calls this device's kernels below itself: nothing to wrap. */
static void cuda_kernel(void (*fn)(void *ctx), void *ctx)
{
    fn(ctx);
}

/* Input staging: pinned buffers, and copies on a copy stream ordered by events
 * (kernels/cuda/cuda_stage.cu); failures are logged there and stick, as the copies' do. */
static void *cuda_host_alloc(size_t bytes)
{
    void *p = NULL;
    return mge_cuda_host_alloc(&p, bytes) == MGE_OK ? p : NULL;
}

static void cuda_stage_copy(int slot, void *dst, const void *src, size_t n)
{
    mge_cuda_stage_copy(slot, dst, src, n);
}

static void cuda_stage_ready(int slot)
{
    mge_cuda_stage_ready(slot);
}

static void cuda_stage_release(int slot)
{
    mge_cuda_stage_release(slot);
}

static void cuda_stage_wait(int slot)
{
    mge_cuda_stage_wait(slot);
}

static int cuda_probe(char *err, size_t errlen)
{
    return mge_cuda_open(err, errlen);
}

static void cuda_sgd_update(float *p, const float *g, float *v, int64_t n, float lr, float mu,
                            float wd, int nesterov)
{
    mge_cuda_sgd_update(p, g, v, n, lr, mu, wd, nesterov);
}

static void cuda_adam_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                             float beta1, float beta2, float eps, float wd, int adamw, int64_t t)
{
    mge_cuda_adam_update(p, g, m, v, n, lr, beta1, beta2, eps, wd, adamw, t);
}

static double cuda_l2_norm(const float *g, int64_t n)
{
    double norm = 0.0;
    mge_cuda_l2_norm(&norm, g, n);
    return norm;
}

static void cuda_scale(float *out, const float *inp, float s, int64_t n)
{
    mge_cuda_scale(out, inp, s, n);
}

/* ---- the ops ---- */

static int cu_matmul(struct mge_graph *g, const struct mge_node *n)
{
    int a = n->in[0], b = n->in[1], c = n->out[0];
    int64_t ra = mge__rows_now(g, a), la = mge__last_dim(g, a);
    int64_t rb = mge__rows_now(g, b), lb = mge__last_dim(g, b);
    int64_t M = n->a.mm.ta ? la : ra, K = n->a.mm.ta ? ra : la, N = n->a.mm.tb ? rb : lb;
    return mge_cuda_sgemm(n->a.mm.ta, n->a.mm.tb, (int)M, (int)N, (int)K, 1.0f, F(g, a), (int)la,
                          F(g, b), (int)lb, n->acc ? 1.0f : 0.0f, F(g, c), (int)N);
}

static int cu_linear(struct mge_graph *g, const struct mge_node *n)
{
    int x = n->in[0], w = n->in[1], b = n->in[2], y = n->out[0], pre = n->out[1];
    int64_t rows = mge__rows_now(g, x), K = mge__last_dim(g, x), N = g->values[w].shape[0];
    float *dst = pre >= 0 ? F(g, pre) : F(g, y);
    int rc = mge_cuda_sgemm(0, 1, (int)rows, (int)N, (int)K, 1.0f, F(g, x), (int)K, F(g, w), (int)K,
                            0.0f, dst, (int)N);
    if (rc != MGE_OK)
        return rc;
    if (pre >= 0) {
        if ((rc = mge_cuda_bias_act_forward(MGE_ACT_NONE, dst, dst, FOPT(g, b), rows, N)) != MGE_OK)
            return rc;
        return mge_cuda_unary_forward(n->a.act.act, F(g, y), dst, rows * N);
    }
    if (b >= 0 || n->a.act.act != MGE_ACT_NONE)
        return mge_cuda_bias_act_forward(n->a.act.act, dst, dst, FOPT(g, b), rows, N);
    return MGE_OK;
}

static int cu_bias_act(struct mge_graph *g, const struct mge_node *n)
{
    int x = n->in[0], b = n->n_in > 1 ? n->in[1] : -1;
    return mge_cuda_bias_act_forward(n->a.act.act, F(g, n->out[0]), F(g, x), FOPT(g, b),
                                     mge__rows_now(g, x), mge__last_dim(g, x));
}

static int cu_bias_grad(struct mge_graph *g, const struct mge_node *n)
{
    int dy = n->in[0];
    return mge_cuda_bias_backward(F(g, n->out[0]), F(g, dy), mge__rows_now(g, dy),
                                  mge__last_dim(g, dy), n->acc);
}

static int cu_binary(struct mge_graph *g, const struct mge_node *n)
{
    int64_t shape[MGE_MAX_DIMS], sa[MGE_MAX_DIMS], sb[MGE_MAX_DIMS];
    int nd = mge__binary_geometry(g, n, shape, sa, sb);
    return mge_cuda_binary_forward(n->a.bin.op, F(g, n->out[0]), F(g, n->in[0]), sa,
                                   F(g, n->in[1]), sb, shape, nd);
}

static int cu_sum_to(struct mge_graph *g, const struct mge_node *n)
{
    int64_t shape[MGE_MAX_DIMS], so[MGE_MAX_DIMS];
    int nd = mge__sum_to_geometry(g, n, shape, so);
    return mge_cuda_sum_to(F(g, n->out[0]), so, F(g, n->in[0]), shape, nd, n->acc);
}

static int cu_unary(struct mge_graph *g, const struct mge_node *n)
{
    return mge_cuda_unary_forward(n->a.act.act, F(g, n->out[0]), F(g, n->in[0]),
                                  mge__value_numel_now(g, n->in[0]));
}

static int cu_unary_grad(struct mge_graph *g, const struct mge_node *n)
{
    return mge_cuda_unary_backward(n->a.act.act, F(g, n->out[0]), F(g, n->in[0]), FOPT(g, n->in[1]),
                                   FOPT(g, n->in[2]), mge__value_numel_now(g, n->in[0]), n->acc);
}

static int cu_softmax(struct mge_graph *g, const struct mge_node *n)
{
    int x = n->in[0];
    if (n->op == MGE_OP_SOFTMAX)
        return mge_cuda_softmax_forward(F(g, n->out[0]), F(g, x), mge__rows_now(g, x),
                                        mge__last_dim(g, x));
    return mge_cuda_log_softmax_forward(F(g, n->out[0]), F(g, x), mge__rows_now(g, x),
                                        mge__last_dim(g, x));
}

static int cu_softmax_grad(struct mge_graph *g, const struct mge_node *n)
{
    int dy = n->in[0], y = n->in[1];
    if (n->op == MGE_OP_SOFTMAX_GRAD)
        return mge_cuda_softmax_backward(F(g, n->out[0]), F(g, dy), F(g, y), mge__rows_now(g, y),
                                         mge__last_dim(g, y), n->acc);
    return mge_cuda_log_softmax_backward(F(g, n->out[0]), F(g, dy), F(g, y), mge__rows_now(g, y),
                                         mge__last_dim(g, y), n->acc);
}

static int cu_xent(struct mge_graph *g, const struct mge_node *n)
{
    int logits = n->in[0], labels = n->in[1];
    return mge_cuda_softmax_xent_smooth_forward(F(g, n->out[0]), F(g, n->out[1]), F(g, logits),
                                                I32(g, labels), mge__rows_now(g, logits),
                                                mge__last_dim(g, logits), n->a.xent.smoothing);
}

/* The upstream gradient stays on the device: the kernel reads it there. */
static int cu_xent_grad(struct mge_graph *g, const struct mge_node *n)
{
    int probs = n->in[1], labels = n->in[2];
    return mge_cuda_softmax_xent_smooth_backward(F(g, n->out[0]), F(g, probs), I32(g, labels),
                                                 mge__rows_now(g, probs), mge__last_dim(g, probs),
                                                 F(g, n->in[0]), n->a.xent.smoothing, n->acc);
}

static int cu_reduce(struct mge_graph *g, const struct mge_node *n)
{
    int64_t outer, len, inner;
    mge__reduce_geometry(g, n->in[0], n->a.red.axis, &outer, &len, &inner);
    float scale = n->a.red.scale < 0 ? 1.0f / (float)len : n->a.red.scale;
    return mge_cuda_reduce_sum(F(g, n->out[0]), F(g, n->in[0]), outer, len, inner, scale);
}

static int cu_reduce_grad(struct mge_graph *g, const struct mge_node *n)
{
    int64_t outer, len, inner;
    mge__reduce_geometry(g, n->out[0], n->a.red.axis, &outer, &len, &inner);
    float scale = n->a.red.scale < 0 ? 1.0f / (float)len : n->a.red.scale;
    return mge_cuda_reduce_sum_backward(F(g, n->out[0]), F(g, n->in[0]), outer, len, inner, scale,
                                        n->acc);
}

static int cu_permute(struct mge_graph *g, const struct mge_node *n)
{
    int64_t shape[MGE_MAX_DIMS];
    mge__value_shape_now(g, n->in[0], shape);
    return mge_cuda_permute(F(g, n->out[0]), F(g, n->in[0]), shape, n->a.perm.perm,
                            g->values[n->in[0]].ndim);
}

static int cu_copy_axis(struct mge_graph *g, const struct mge_node *n)
{
    int src = n->in[0], dst = n->out[0];
    int64_t outer, inner, slen, dlen;
    if (n->a.copy.axis < 0)
        return mge_cuda_copy_axis(F(g, dst), 1, 0, F(g, src), 1, 0, 1, 1,
                                  mge__value_numel_now(g, src), n->acc);
    mge__copy_axis_geometry(g, n, &outer, &inner, &slen, &dlen);
    if (n->a.copy.zero_first && !n->acc) {
        int rc =
            mge_cuda_memset(F(g, dst), 0, sizeof(float) * (size_t)mge__value_numel_now(g, dst));
        if (rc != MGE_OK)
            return rc;
    }
    return mge_cuda_copy_axis(F(g, dst), dlen, n->a.copy.dstart, F(g, src), slen, n->a.copy.sstart,
                              n->a.copy.len, outer, inner, n->acc);
}

static void conv_geometry(const struct mge_graph *g, int x, int w, const struct mge_node *n,
                          struct mge_cuda_conv *cc)
{
    struct mge_cpu_conv cv;
    mge__conv_geometry(g, x, w, n->a.conv.stride, n->a.conv.pad, &cv);
    *cc = (struct mge_cuda_conv){cv.N, cv.C,      cv.H,   cv.W, cv.K, cv.R,
                                 cv.S, cv.stride, cv.pad, cv.P, cv.Q};
}

/* The planned CPU scratch (out[1], out[3]) goes unused: cuDNN has its own workspace. */
static int cu_conv2d(struct mge_graph *g, const struct mge_node *n)
{
    struct mge_cuda_conv cv;
    conv_geometry(g, n->in[0], n->in[1], n, &cv);
    return mge_cuda_conv2d_forward(&cv, F(g, n->out[0]), F(g, n->in[0]), F(g, n->in[1]),
                                   FOPT(g, n->in[2]));
}

static int cu_conv2d_grad(struct mge_graph *g, const struct mge_node *n)
{
    struct mge_cuda_conv cv;
    conv_geometry(g, n->in[1], n->in[2], n, &cv);
    return mge_cuda_conv2d_backward(&cv, FOPT(g, n->out[0]), FOPT(g, n->out[1]), FOPT(g, n->out[2]),
                                    F(g, n->in[0]), F(g, n->in[1]), F(g, n->in[2]), n->acc);
}

static void pool_geometry(const struct mge_graph *g, const struct mge_node *n, int x,
                          struct mge_cuda_pool *cp)
{
    struct mge_cpu_pool pl;
    mge__pool_geometry(g, n, x, &pl);
    *cp = (struct mge_cuda_pool){pl.N, pl.C, pl.H, pl.W, pl.R, pl.S, pl.stride, pl.pad, pl.P, pl.Q};
}

static int cu_pool(struct mge_graph *g, const struct mge_node *n)
{
    struct mge_cuda_pool pl;
    pool_geometry(g, n, n->in[0], &pl);
    if (n->a.pool.max)
        return mge_cuda_maxpool_forward(&pl, F(g, n->out[0]), F(g, n->in[0]));
    return mge_cuda_avgpool_forward(&pl, F(g, n->out[0]), F(g, n->in[0]));
}

static int cu_pool_grad(struct mge_graph *g, const struct mge_node *n)
{
    struct mge_cuda_pool pl;
    pool_geometry(g, n, n->in[1], &pl);
    if (n->a.pool.max)
        return mge_cuda_maxpool_backward(&pl, F(g, n->out[0]), F(g, n->in[0]), F(g, n->in[1]),
                                         n->acc);
    return mge_cuda_avgpool_backward(&pl, F(g, n->out[0]), F(g, n->in[0]), n->acc);
}

static int cu_dropout(struct mge_graph *g, const struct mge_node *n)
{
    int64_t len = mge__value_numel_now(g, n->in[0]);
    if (g->training && n->a.drop.p > 0.0f)
        return mge_cuda_dropout_forward(F(g, n->out[0]), F(g, n->in[0]), len, n->a.drop.p,
                                        mge__dropout_seed(g, n), mge__dropout_first(g, n->in[0]));
    return mge_cuda_copy(F(g, n->out[0]), F(g, n->in[0]), sizeof(float) * (size_t)len);
}

static int cu_dropout_grad(struct mge_graph *g, const struct mge_node *n)
{
    return mge_cuda_dropout_backward(
        F(g, n->out[0]), F(g, n->in[0]), mge__value_numel_now(g, n->in[0]), n->a.drop.p,
        mge__dropout_seed(g, n), mge__dropout_first(g, n->in[0]), n->acc);
}

static int cu_layernorm(struct mge_graph *g, const struct mge_node *n)
{
    int x = n->in[0];
    return mge_cuda_layernorm_forward(F(g, n->out[0]), F(g, n->out[1]), F(g, n->out[2]), F(g, x),
                                      F(g, n->in[1]), F(g, n->in[2]), mge__rows_now(g, x),
                                      mge__last_dim(g, x), n->a.ln.eps);
}

static int cu_layernorm_grad(struct mge_graph *g, const struct mge_node *n)
{
    int x = n->in[1];
    return mge_cuda_layernorm_backward(FOPT(g, n->out[0]), FOPT(g, n->out[1]), FOPT(g, n->out[2]),
                                       F(g, n->in[0]), F(g, x), F(g, n->in[2]), F(g, n->in[3]),
                                       F(g, n->in[4]), mge__rows_now(g, x), mge__last_dim(g, x),
                                       n->acc);
}

/* Running statistics: as cpu_batchnorm (a sublinear recomputation does not update them). */
static int cu_batchnorm(struct mge_graph *g, const struct mge_node *n)
{
    int64_t N, C, HW;
    int running = !g->training || !n->backward;
    mge__bn_geometry(g, n->in[0], &N, &C, &HW);
    return mge_cuda_batchnorm_forward(
        F(g, n->out[0]), F(g, n->out[1]), F(g, n->out[2]), F(g, n->in[0]), FOPT(g, n->in[1]),
        FOPT(g, n->in[2]), running ? F(g, n->in[3]) : NULL, running ? F(g, n->in[4]) : NULL, N, C,
        HW, n->a.bn.eps, n->a.bn.momentum, g->training, n->a.bn.relu);
}

static int cu_batchnorm_grad(struct mge_graph *g, const struct mge_node *n)
{
    int64_t N, C, HW;
    mge__bn_geometry(g, n->in[1], &N, &C, &HW);
    return mge_cuda_batchnorm_backward(FOPT(g, n->out[0]), FOPT(g, n->out[1]), FOPT(g, n->out[2]),
                                       F(g, n->in[0]), n->n_in > 5 ? F(g, n->in[5]) : NULL,
                                       F(g, n->in[1]), FOPT(g, n->in[2]), F(g, n->in[3]),
                                       F(g, n->in[4]), N, C, HW, n->acc);
}

static int cu_embedding(struct mge_graph *g, const struct mge_node *n)
{
    int ids = n->in[0], table = n->in[1];
    return mge_cuda_embedding_forward(F(g, n->out[0]), I32(g, ids), F(g, table),
                                      mge__value_numel_now(g, ids), mge__last_dim(g, table));
}

static int cu_embedding_grad(struct mge_graph *g, const struct mge_node *n)
{
    int ids = n->in[1], dt = n->out[0];
    return mge_cuda_embedding_backward(F(g, dt), F(g, n->in[0]), I32(g, ids),
                                       mge__value_numel_now(g, ids), g->values[dt].shape[0],
                                       mge__last_dim(g, dt), n->acc);
}

static int cu_attention(struct mge_graph *g, const struct mge_node *n)
{
    int64_t s[MGE_MAX_DIMS];
    mge__value_shape_now(g, n->out[0], s);
    return mge_cuda_attention_forward(F(g, n->out[0]), F(g, n->out[1]), F(g, n->in[0]), s[0], s[1],
                                      s[2], n->a.attn.heads);
}

static int cu_attention_grad(struct mge_graph *g, const struct mge_node *n)
{
    int64_t s[MGE_MAX_DIMS];
    mge__value_shape_now(g, n->in[2], s);
    return mge_cuda_attention_backward(F(g, n->out[0]), F(g, n->in[0]), F(g, n->in[1]),
                                       F(g, n->in[2]), F(g, n->in[3]), s[0], s[1], s[2],
                                       n->a.attn.heads, n->acc);
}

static int cu_scale(struct mge_graph *g, const struct mge_node *n)
{
    int64_t len = mge__value_numel_now(g, n->out[0]);
    float s = n->a.red.scale;
    if (n->acc)
        return mge_cuda_axpy(F(g, n->out[0]), F(g, n->in[0]), s, len);
    if (s == 0.0f) /* zeroing: never multiply, the memory may hold NaN patterns */
        return mge_cuda_memset(F(g, n->out[0]), 0, sizeof(float) * (size_t)len);
    return mge_cuda_scale(F(g, n->out[0]), F(g, n->in[0]), s, len);
}

static int cu_ones(struct mge_graph *g, const struct mge_node *n)
{
    return mge_cuda_fill(F(g, n->out[0]), g->loss_scale, mge__value_numel_now(g, n->out[0]));
}

/* The quantisation ops (FAKE_QUANT, QLINEAR, QCONV2D) have no kernels here: left NULL. */
static const struct mge_ops_table cuda_ops = {
    .device = "cuda",
    .fn =
        {
            [MGE_OP_MATMUL] = cu_matmul,       [MGE_OP_LINEAR] = cu_linear,
            [MGE_OP_BIAS_ACT] = cu_bias_act,   [MGE_OP_BIAS_GRAD] = cu_bias_grad,
            [MGE_OP_BINARY] = cu_binary,       [MGE_OP_SUM_TO] = cu_sum_to,
            [MGE_OP_UNARY] = cu_unary,         [MGE_OP_UNARY_GRAD] = cu_unary_grad,
            [MGE_OP_SOFTMAX] = cu_softmax,     [MGE_OP_SOFTMAX_GRAD] = cu_softmax_grad,
            [MGE_OP_LOG_SOFTMAX] = cu_softmax, [MGE_OP_LOG_SOFTMAX_GRAD] = cu_softmax_grad,
            [MGE_OP_XENT] = cu_xent,           [MGE_OP_XENT_GRAD] = cu_xent_grad,
            [MGE_OP_REDUCE] = cu_reduce,       [MGE_OP_REDUCE_GRAD] = cu_reduce_grad,
            [MGE_OP_PERMUTE] = cu_permute,     [MGE_OP_COPY_AXIS] = cu_copy_axis,
            [MGE_OP_CONV2D] = cu_conv2d,       [MGE_OP_CONV2D_GRAD] = cu_conv2d_grad,
            [MGE_OP_POOL] = cu_pool,           [MGE_OP_POOL_GRAD] = cu_pool_grad,
            [MGE_OP_DROPOUT] = cu_dropout,     [MGE_OP_DROPOUT_GRAD] = cu_dropout_grad,
            [MGE_OP_LAYERNORM] = cu_layernorm, [MGE_OP_LAYERNORM_GRAD] = cu_layernorm_grad,
            [MGE_OP_BATCHNORM] = cu_batchnorm, [MGE_OP_BATCHNORM_GRAD] = cu_batchnorm_grad,
            [MGE_OP_EMBEDDING] = cu_embedding, [MGE_OP_EMBEDDING_GRAD] = cu_embedding_grad,
            [MGE_OP_ATTENTION] = cu_attention, [MGE_OP_ATTENTION_GRAD] = cu_attention_grad,
            [MGE_OP_SCALE] = cu_scale,         [MGE_OP_ONES] = cu_ones,
        },
};

static const struct mge_device cuda_device = {
    .name = "cuda",
    .host_visible = 0,
    .bf16 = 0,
    .ops = &cuda_ops,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .h2d = cuda_h2d,
    .d2h = cuda_d2h,
    .d2d = cuda_d2d,
    .memset = cuda_memset,
    .sync = cuda_sync,
    .kernel = cuda_kernel,
    .probe = cuda_probe,
    .sgd_update = cuda_sgd_update,
    .adam_update = cuda_adam_update,
    .l2_norm = cuda_l2_norm,
    .scale = cuda_scale,
    .host_alloc = cuda_host_alloc,
    .host_free = mge_cuda_host_free,
    .stage_copy = cuda_stage_copy,
    .stage_ready = cuda_stage_ready,
    .stage_release = cuda_stage_release,
    .stage_wait = cuda_stage_wait,
};

const struct mge_device *mge_device_cuda(void)
{
    return &cuda_device;
}
