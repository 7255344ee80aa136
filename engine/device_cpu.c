/* device_cpu.c: the CPU ops table: each IR op mapped onto the kernels of kernels/cpu/. */
#include <string.h>

#include "common/err.h"
#include "engine/device_int.h"
#include "engine/engine_int.h"
#include "kernels/cpu/cpu.h"

#define F MGE__F
#define FOPT MGE__FOPT

/* The GEMM of MATMUL and LINEAR: fp32, or bf16 inputs with fp32 sums (mge_graph_set_bf16). */
static void gemm(const struct mge_graph *g, int ta, int tb, int64_t M, int64_t N, int64_t K,
                 float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                 float *C, int64_t ldc)
{
    if (g->bf16)
        mge_cpu_gemm_bf16(ta, tb, (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C,
                          (int)ldc);
    else
        mge_cpu_sgemm(ta, tb, (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C,
                      (int)ldc);
}

static int cpu_matmul(struct mge_graph *g, const struct mge_node *n)
{
    int a = n->in[0], b = n->in[1], c = n->out[0];
    int64_t ra = mge__rows_now(g, a), la = mge__last_dim(g, a), rb = mge__rows_now(g, b),
            lb = mge__last_dim(g, b);
    int64_t M = n->a.mm.ta ? la : ra, K = n->a.mm.ta ? ra : la;
    int64_t N = n->a.mm.tb ? rb : lb;
    gemm(g, n->a.mm.ta, n->a.mm.tb, M, N, K, 1.0f, F(g, a), la, F(g, b), lb, n->acc ? 1.0f : 0.0f,
         F(g, c), N);
    return MGE_OK;
}

static int cpu_linear(struct mge_graph *g, const struct mge_node *n)
{
    int x = n->in[0], w = n->in[1], b = n->in[2], y = n->out[0], pre = n->out[1];
    int64_t rows = mge__rows_now(g, x), K = mge__last_dim(g, x), N = g->values[w].shape[0];
    float *dst = pre >= 0 ? F(g, pre) : F(g, y);
    gemm(g, 0, 1, rows, N, K, 1.0f, F(g, x), K, F(g, w), K, 0.0f, dst, N);
    if (pre >= 0) {
        mge_cpu_bias_act_forward(MGE_CPU_IDENTITY, dst, dst, FOPT(g, b), rows, N);
        mge_cpu_unary_forward(n->a.act.act, F(g, y), dst, rows * N);
    } else if (b >= 0 || n->a.act.act != MGE_ACT_NONE) {
        mge_cpu_bias_act_forward(n->a.act.act, dst, dst, FOPT(g, b), rows, N);
    }
    return MGE_OK;
}

static int cpu_bias_act(struct mge_graph *g, const struct mge_node *n)
{
    int x = n->in[0], b = n->n_in > 1 ? n->in[1] : -1;
    mge_cpu_bias_act_forward(n->a.act.act, F(g, n->out[0]), F(g, x), FOPT(g, b),
                             mge__rows_now(g, x), mge__last_dim(g, x));
    return MGE_OK;
}

static int cpu_bias_grad(struct mge_graph *g, const struct mge_node *n)
{
    int dy = n->in[0];
    mge_cpu_bias_backward(F(g, n->out[0]), F(g, dy), mge__rows_now(g, dy), mge__last_dim(g, dy),
                          n->acc);
    return MGE_OK;
}

static int cpu_binary(struct mge_graph *g, const struct mge_node *n)
{
    int64_t shape[MGE_MAX_DIMS], sa[MGE_MAX_DIMS], sb[MGE_MAX_DIMS];
    int nd = mge__binary_geometry(g, n, shape, sa, sb);
    mge_cpu_binary_forward(n->a.bin.op, F(g, n->out[0]), F(g, n->in[0]), sa, F(g, n->in[1]), sb,
                           shape, nd);
    return MGE_OK;
}

static int cpu_sum_to(struct mge_graph *g, const struct mge_node *n)
{
    int64_t shape[MGE_MAX_DIMS], so[MGE_MAX_DIMS];
    int nd = mge__sum_to_geometry(g, n, shape, so);
    mge_cpu_sum_to(F(g, n->out[0]), so, F(g, n->in[0]), shape, nd, n->acc);
    return MGE_OK;
}

static int cpu_unary(struct mge_graph *g, const struct mge_node *n)
{
    mge_cpu_unary_forward(n->a.act.act, F(g, n->out[0]), F(g, n->in[0]),
                          mge__value_numel_now(g, n->in[0]));
    return MGE_OK;
}

static int cpu_unary_grad(struct mge_graph *g, const struct mge_node *n)
{
    mge_cpu_unary_backward(n->a.act.act, F(g, n->out[0]), F(g, n->in[0]), FOPT(g, n->in[1]),
                           FOPT(g, n->in[2]), mge__value_numel_now(g, n->in[0]), n->acc);
    return MGE_OK;
}

static int cpu_softmax(struct mge_graph *g, const struct mge_node *n)
{
    int x = n->in[0];
    if (n->op == MGE_OP_SOFTMAX)
        mge_cpu_softmax_forward(F(g, n->out[0]), F(g, x), mge__rows_now(g, x), mge__last_dim(g, x));
    else
        mge_cpu_log_softmax_forward(F(g, n->out[0]), F(g, x), mge__rows_now(g, x),
                                    mge__last_dim(g, x));
    return MGE_OK;
}

static int cpu_softmax_grad(struct mge_graph *g, const struct mge_node *n)
{
    int dy = n->in[0], y = n->in[1];
    if (n->op == MGE_OP_SOFTMAX_GRAD)
        mge_cpu_softmax_backward(F(g, n->out[0]), F(g, dy), F(g, y), mge__rows_now(g, y),
                                 mge__last_dim(g, y), n->acc);
    else
        mge_cpu_log_softmax_backward(F(g, n->out[0]), F(g, dy), F(g, y), mge__rows_now(g, y),
                                     mge__last_dim(g, y), n->acc);
    return MGE_OK;
}

static int cpu_xent(struct mge_graph *g, const struct mge_node *n)
{
    int logits = n->in[0], labels = n->in[1];
    mge_cpu_softmax_xent_smooth_forward(
        F(g, n->out[0]), F(g, n->out[1]), F(g, logits), (const int32_t *)g->values[labels].data,
        mge__rows_now(g, logits), mge__last_dim(g, logits), n->a.xent.smoothing);
    return MGE_OK;
}

static int cpu_xent_grad(struct mge_graph *g, const struct mge_node *n)
{
    int probs = n->in[1], labels = n->in[2];
    mge_cpu_softmax_xent_smooth_backward(F(g, n->out[0]), F(g, probs),
                                         (const int32_t *)g->values[labels].data,
                                         mge__rows_now(g, probs), mge__last_dim(g, probs),
                                         F(g, n->in[0])[0], n->a.xent.smoothing, n->acc);
    return MGE_OK;
}

static int cpu_reduce(struct mge_graph *g, const struct mge_node *n)
{
    int64_t outer, len, inner;
    mge__reduce_geometry(g, n->in[0], n->a.red.axis, &outer, &len, &inner);
    float scale = n->a.red.scale < 0 ? 1.0f / (float)len : n->a.red.scale;
    mge_cpu_reduce_sum(F(g, n->out[0]), F(g, n->in[0]), outer, len, inner, scale);
    return MGE_OK;
}

static int cpu_reduce_grad(struct mge_graph *g, const struct mge_node *n)
{
    int64_t outer, len, inner;
    mge__reduce_geometry(g, n->out[0], n->a.red.axis, &outer, &len, &inner);
    float scale = n->a.red.scale < 0 ? 1.0f / (float)len : n->a.red.scale;
    mge_cpu_reduce_sum_backward(F(g, n->out[0]), F(g, n->in[0]), outer, len, inner, scale, n->acc);
    return MGE_OK;
}

static int cpu_permute(struct mge_graph *g, const struct mge_node *n)
{
    int64_t shape[MGE_MAX_DIMS];
    mge__value_shape_now(g, n->in[0], shape);
    mge_cpu_permute(F(g, n->out[0]), F(g, n->in[0]), shape, n->a.perm.perm,
                    g->values[n->in[0]].ndim);
    return MGE_OK;
}

static int cpu_copy_axis(struct mge_graph *g, const struct mge_node *n)
{
    int src = n->in[0], dst = n->out[0], axis = n->a.copy.axis;
    if (axis < 0) {
        int64_t len = mge__value_numel_now(g, src);
        mge_cpu_copy_axis(F(g, dst), 1, 0, F(g, src), 1, 0, 1, 1, len, n->acc);
        return MGE_OK;
    }
    int64_t outer, inner, slen, dlen;
    mge__copy_axis_geometry(g, n, &outer, &inner, &slen, &dlen);
    if (n->a.copy.zero_first && !n->acc)
        memset(F(g, dst), 0, sizeof(float) * (size_t)mge__value_numel_now(g, dst));
    mge_cpu_copy_axis(F(g, dst), dlen, n->a.copy.dstart, F(g, src), slen, n->a.copy.sstart,
                      n->a.copy.len, outer, inner, n->acc);
    return MGE_OK;
}

static int cpu_conv2d(struct mge_graph *g, const struct mge_node *n)
{
    struct mge_cpu_conv cv;
    mge__conv_geometry(g, n->in[0], n->in[1], n->a.conv.stride, n->a.conv.pad, &cv);
    if (g->bf16)
        mge_cpu_conv2d_forward_bf16(&cv, F(g, n->out[0]), F(g, n->in[0]), F(g, n->in[1]),
                                    FOPT(g, n->in[2]), FOPT(g, n->out[1]));
    else
        mge_cpu_conv2d_forward(&cv, F(g, n->out[0]), F(g, n->in[0]), F(g, n->in[1]),
                               FOPT(g, n->in[2]), FOPT(g, n->out[1]));
    return MGE_OK;
}

static int cpu_conv2d_grad(struct mge_graph *g, const struct mge_node *n)
{
    struct mge_cpu_conv cv;
    mge__conv_geometry(g, n->in[1], n->in[2], n->a.conv.stride, n->a.conv.pad, &cv);
    if (g->bf16)
        mge_cpu_conv2d_backward_bf16(&cv, FOPT(g, n->out[0]), FOPT(g, n->out[1]),
                                     FOPT(g, n->out[2]), F(g, n->in[0]), F(g, n->in[1]),
                                     F(g, n->in[2]), FOPT(g, n->out[3]), n->acc);
    else
        mge_cpu_conv2d_backward(&cv, FOPT(g, n->out[0]), FOPT(g, n->out[1]), FOPT(g, n->out[2]),
                                F(g, n->in[0]), F(g, n->in[1]), F(g, n->in[2]), FOPT(g, n->out[3]),
                                n->acc);
    return MGE_OK;
}

static int cpu_pool(struct mge_graph *g, const struct mge_node *n)
{
    struct mge_cpu_pool pl;
    mge__pool_geometry(g, n, n->in[0], &pl);
    if (n->a.pool.max)
        mge_cpu_maxpool_forward(&pl, F(g, n->out[0]), F(g, n->in[0]));
    else
        mge_cpu_avgpool_forward(&pl, F(g, n->out[0]), F(g, n->in[0]));
    return MGE_OK;
}

static int cpu_pool_grad(struct mge_graph *g, const struct mge_node *n)
{
    struct mge_cpu_pool pl;
    mge__pool_geometry(g, n, n->in[1], &pl);
    if (n->a.pool.max)
        mge_cpu_maxpool_backward(&pl, F(g, n->out[0]), F(g, n->in[0]), F(g, n->in[1]), n->acc);
    else
        mge_cpu_avgpool_backward(&pl, F(g, n->out[0]), F(g, n->in[0]), n->acc);
    return MGE_OK;
}

static int cpu_dropout(struct mge_graph *g, const struct mge_node *n)
{
    int64_t len = mge__value_numel_now(g, n->in[0]);
    if (g->training && n->a.drop.p > 0.0f)
        mge_cpu_dropout_forward(F(g, n->out[0]), F(g, n->in[0]), len, n->a.drop.p,
                                mge__dropout_seed(g, n), mge__dropout_first(g, n->in[0]));
    else
        memcpy(F(g, n->out[0]), F(g, n->in[0]), sizeof(float) * (size_t)len);
    return MGE_OK;
}

static int cpu_dropout_grad(struct mge_graph *g, const struct mge_node *n)
{
    mge_cpu_dropout_backward(F(g, n->out[0]), F(g, n->in[0]), mge__value_numel_now(g, n->in[0]),
                             n->a.drop.p, mge__dropout_seed(g, n), mge__dropout_first(g, n->in[0]),
                             n->acc);
    return MGE_OK;
}

static int cpu_layernorm(struct mge_graph *g, const struct mge_node *n)
{
    int x = n->in[0];
    mge_cpu_layernorm_forward(F(g, n->out[0]), F(g, n->out[1]), F(g, n->out[2]), F(g, x),
                              F(g, n->in[1]), F(g, n->in[2]), mge__rows_now(g, x),
                              mge__last_dim(g, x), n->a.ln.eps);
    return MGE_OK;
}

static int cpu_layernorm_grad(struct mge_graph *g, const struct mge_node *n)
{
    int x = n->in[1];
    mge_cpu_layernorm_backward(FOPT(g, n->out[0]), FOPT(g, n->out[1]), FOPT(g, n->out[2]),
                               F(g, n->in[0]), F(g, x), F(g, n->in[2]), F(g, n->in[3]),
                               F(g, n->in[4]), mge__rows_now(g, x), mge__last_dim(g, x), n->acc);
    return MGE_OK;
}

/*
 * Training runs update the running statistics; a recomputation of this op (a clone marked
 * backward, made by the sublinear pass) normalises alike but must not update them again.
 */
static int cpu_batchnorm(struct mge_graph *g, const struct mge_node *n)
{
    int64_t N, C, HW;
    int running = !g->training || !n->backward; /* read (inference) or updated (training) */
    mge__bn_geometry(g, n->in[0], &N, &C, &HW);
    mge_cpu_batchnorm_forward(F(g, n->out[0]), F(g, n->out[1]), F(g, n->out[2]), F(g, n->in[0]),
                              FOPT(g, n->in[1]), FOPT(g, n->in[2]), running ? F(g, n->in[3]) : NULL,
                              running ? F(g, n->in[4]) : NULL, N, C, HW, n->a.bn.eps,
                              n->a.bn.momentum, g->training, n->a.bn.relu);
    return MGE_OK;
}

static int cpu_batchnorm_grad(struct mge_graph *g, const struct mge_node *n)
{
    int64_t N, C, HW;
    mge__bn_geometry(g, n->in[1], &N, &C, &HW);
    mge_cpu_batchnorm_backward(FOPT(g, n->out[0]), FOPT(g, n->out[1]), FOPT(g, n->out[2]),
                               F(g, n->in[0]), n->n_in > 5 ? F(g, n->in[5]) : NULL, F(g, n->in[1]),
                               FOPT(g, n->in[2]), F(g, n->in[3]), F(g, n->in[4]), N, C, HW, n->acc);
    return MGE_OK;
}

static int cpu_embedding(struct mge_graph *g, const struct mge_node *n)
{
    int ids = n->in[0], table = n->in[1];
    mge_cpu_embedding_forward(F(g, n->out[0]), (const int32_t *)g->values[ids].data, F(g, table),
                              mge__value_numel_now(g, ids), mge__last_dim(g, table));
    return MGE_OK;
}

static int cpu_embedding_grad(struct mge_graph *g, const struct mge_node *n)
{
    int ids = n->in[1], dt = n->out[0];
    mge_cpu_embedding_backward(F(g, dt), F(g, n->in[0]), (const int32_t *)g->values[ids].data,
                               mge__value_numel_now(g, ids), g->values[dt].shape[0],
                               mge__last_dim(g, dt), n->acc);
    return MGE_OK;
}

static int cpu_attention(struct mge_graph *g, const struct mge_node *n)
{
    int64_t s[MGE_MAX_DIMS];
    mge__value_shape_now(g, n->out[0], s);
    mge_cpu_attention_forward(F(g, n->out[0]), F(g, n->out[1]), F(g, n->in[0]), s[0], s[1], s[2],
                              n->a.attn.heads);
    return MGE_OK;
}

static int cpu_attention_grad(struct mge_graph *g, const struct mge_node *n)
{
    int64_t s[MGE_MAX_DIMS];
    mge__value_shape_now(g, n->in[2], s);
    mge_cpu_attention_backward(F(g, n->out[0]), F(g, n->in[0]), F(g, n->in[1]), F(g, n->in[2]),
                               F(g, n->in[3]), s[0], s[1], s[2], n->a.attn.heads, n->acc);
    return MGE_OK;
}

static int cpu_scale(struct mge_graph *g, const struct mge_node *n)
{
    int64_t len = mge__value_numel_now(g, n->out[0]);
    float s = n->a.red.scale;
    if (n->acc)
        mge_cpu_axpy(F(g, n->out[0]), F(g, n->in[0]), s, len);
    else if (s == 0.0f) /* zeroing: never multiply, the memory may hold NaN patterns */
        memset(F(g, n->out[0]), 0, sizeof(float) * (size_t)len);
    else
        mge_cpu_scale(F(g, n->out[0]), F(g, n->in[0]), s, len);
    return MGE_OK;
}

/* The backward seed: d(loss)/d(loss), times the loss scale (data parallelism's local_n/global_n). */
static int cpu_ones(struct mge_graph *g, const struct mge_node *n)
{
    int64_t len = mge__value_numel_now(g, n->out[0]);
    float *p = F(g, n->out[0]);
    for (int64_t i = 0; i < len; i++)
        p[i] = g->loss_scale;
    return MGE_OK;
}

const struct mge_ops_table mge__cpu_ops = {
    .device = "cpu",
    .fn = {
        [MGE_OP_MATMUL] = cpu_matmul,
        [MGE_OP_LINEAR] = cpu_linear,
        [MGE_OP_BIAS_ACT] = cpu_bias_act,
        [MGE_OP_BIAS_GRAD] = cpu_bias_grad,
        [MGE_OP_BINARY] = cpu_binary,
        [MGE_OP_SUM_TO] = cpu_sum_to,
        [MGE_OP_UNARY] = cpu_unary,
        [MGE_OP_UNARY_GRAD] = cpu_unary_grad,
        [MGE_OP_SOFTMAX] = cpu_softmax,
        [MGE_OP_SOFTMAX_GRAD] = cpu_softmax_grad,
        [MGE_OP_LOG_SOFTMAX] = cpu_softmax,
        [MGE_OP_LOG_SOFTMAX_GRAD] = cpu_softmax_grad,
        [MGE_OP_XENT] = cpu_xent,
        [MGE_OP_XENT_GRAD] = cpu_xent_grad,
        [MGE_OP_REDUCE] = cpu_reduce,
        [MGE_OP_REDUCE_GRAD] = cpu_reduce_grad,
        [MGE_OP_PERMUTE] = cpu_permute,
        [MGE_OP_COPY_AXIS] = cpu_copy_axis,
        [MGE_OP_CONV2D] = cpu_conv2d,
        [MGE_OP_CONV2D_GRAD] = cpu_conv2d_grad,
        [MGE_OP_POOL] = cpu_pool,
        [MGE_OP_POOL_GRAD] = cpu_pool_grad,
        [MGE_OP_DROPOUT] = cpu_dropout,
        [MGE_OP_DROPOUT_GRAD] = cpu_dropout_grad,
        [MGE_OP_LAYERNORM] = cpu_layernorm,
        [MGE_OP_LAYERNORM_GRAD] = cpu_layernorm_grad,
        [MGE_OP_BATCHNORM] = cpu_batchnorm,
        [MGE_OP_BATCHNORM_GRAD] = cpu_batchnorm_grad,
        [MGE_OP_EMBEDDING] = cpu_embedding,
        [MGE_OP_EMBEDDING_GRAD] = cpu_embedding_grad,
        [MGE_OP_ATTENTION] = cpu_attention,
        [MGE_OP_ATTENTION_GRAD] = cpu_attention_grad,
        [MGE_OP_SCALE] = cpu_scale,
        [MGE_OP_ONES] = cpu_ones,
        [MGE_OP_FAKE_QUANT] = mge__cpu_fake_quant,
        [MGE_OP_FAKE_QUANT_GRAD] = mge__cpu_fake_quant_grad,
        [MGE_OP_QLINEAR] = mge__cpu_qlinear,
        [MGE_OP_QCONV2D] = mge__cpu_qconv2d,
    },
};
