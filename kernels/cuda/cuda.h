/*
 * cuda.h: the CUDA kernels, the GPU counterpart of kernels/cpu/cpu.h (same argument order and
 * semantics; pointers are device memory). Built only when nvcc exists; callers test
 * mge_cuda_device_count() first, since a machine may have the toolkit and no GPU.
 * Every function returns MGE_OK or MGE_DEVICE (the CUDA error is logged where it happens).
 * Threads: one CUDA context per process; calls are issued on the default stream, in order, so
 * a kernel sees the results of every kernel and copy issued before it.
 * Determinism: no kernel adds floats in an order that depends on scheduling (no float atomics);
 * cuDNN's convolutions use fixed, deterministic algorithms.
 */
#ifndef MGE_KERNELS_CUDA_H
#define MGE_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 when there is no GPU or no driver (never an error). */
int mge_cuda_device_count(void);
/* Name of device 0 into @buf (at most @len bytes), for logs. */
int mge_cuda_device_name(char *buf, size_t len);
/*
 * Make device 0 (of CUDA_VISIBLE_DEVICES) current and create its context. Returns MGE_OK, or
 * MGE_DEVICE with the reason in @err (at most @errlen bytes) when no GPU is usable.
 */
int mge_cuda_open(char *err, size_t errlen);

int mge_cuda_malloc(void **p, size_t bytes);
void mge_cuda_free(void *p);
int mge_cuda_to_device(void *dst, const void *src, size_t bytes);
int mge_cuda_to_host(void *dst, const void *src, size_t bytes);
int mge_cuda_copy(void *dst, const void *src, size_t bytes); /* device -> device */
int mge_cuda_memset(void *dst, int c, size_t bytes);
int mge_cuda_sync(void);

/*
 * ---- input staging (cuda_stage.cu): pinned host buffers, a copy stream, two slots ----
 * A slot's copies run on a copy stream of their own (non-blocking, so they overlap the
 * kernels on the default stream). Each slot has three events: "released" (recorded on the
 * default stream after the last kernel that reads the slot: the next copy into it waits for
 * it), "copied" (recorded on the copy stream after the slot's copies: the kernels wait for it,
 * and so does the host before it rewrites the slot's pinned buffer). @slot is 0 or 1.
 */
int mge_cuda_host_alloc(void **p, size_t bytes); /* cudaHostAlloc (pinned) */
void mge_cuda_host_free(void *p);
/* cudaMemcpyAsync of @bytes from pinned @src on the copy stream, after @slot was released. */
int mge_cuda_stage_copy(int slot, void *dst, const void *src, size_t bytes);
int mge_cuda_stage_ready(int slot);   /* the default stream waits for @slot's copies */
int mge_cuda_stage_release(int slot); /* record "released" on the default stream */
int mge_cuda_stage_wait(int slot);    /* the host waits for @slot's copies */

/* ---- GEMM (cuBLAS, fp32 arithmetic: no TF32) ---- */
/* C = alpha op(A) op(B) + beta C, row-major, as mge_cpu_sgemm (cuBLAS underneath). */
int mge_cuda_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc);

/* ---- elementwise (act/op codes as enum mge_cpu_unary / mge_cpu_binary) ---- */
/* out[r, c] = act(inp[r, c] + bias[c]); act as enum mge_cpu_unary (0 identity, 1 relu, ...). */
int mge_cuda_bias_act_forward(int act, float *out, const float *inp, const float *bias,
                              int64_t rows, int64_t cols);
/* dbias[c] (+)= sum over rows of dout[r, c] (rows in order). */
int mge_cuda_bias_backward(float *dbias, const float *dout, int64_t rows, int64_t cols, int acc);
/* dinp (+)= dout * f'(x) for relu (uses @out) and identity. */
int mge_cuda_relu_backward(float *dinp, const float *dout, const float *out, int64_t n, int acc);
int mge_cuda_unary_forward(int op, float *out, const float *inp, int64_t n);
int mge_cuda_unary_backward(int op, float *dinp, const float *dout, const float *inp,
                            const float *out, int64_t n, int acc);
/* Strides and shape are host arrays of @ndim (<= 6) elements, as mge_cpu_binary_forward's. */
int mge_cuda_binary_forward(int op, float *out, const float *a, const int64_t *astride,
                            const float *b, const int64_t *bstride, const int64_t *shape, int ndim);
/* out (+)= inp summed onto the broadcast source described by @ostride (0 where summed). */
int mge_cuda_sum_to(float *out, const int64_t *ostride, const float *inp, const int64_t *shape,
                    int ndim, int acc);
int mge_cuda_scale(float *out, const float *inp, float s, int64_t n); /* out = s * inp */
int mge_cuda_axpy(float *y, const float *x, float a, int64_t n);      /* y += a * x */
int mge_cuda_fill(float *out, float v, int64_t n);                    /* out = v */

/* ---- softmax and cross-entropy (one block per row, fixed-order sums) ---- */
int mge_cuda_softmax_forward(float *out, const float *inp, int64_t rows, int64_t cols);
int mge_cuda_softmax_backward(float *dinp, const float *dout, const float *out, int64_t rows,
                              int64_t cols, int acc);
int mge_cuda_log_softmax_forward(float *out, const float *inp, int64_t rows, int64_t cols);
int mge_cuda_log_softmax_backward(float *dinp, const float *dout, const float *out, int64_t rows,
                                  int64_t cols, int acc);
/* Fused softmax + mean cross-entropy; *loss is device memory (one float). */
int mge_cuda_softmax_xent_forward(float *loss, float *probs, const float *logits,
                                  const int32_t *labels, int64_t B, int64_t V);
int mge_cuda_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *labels,
                                   int64_t B, int64_t V, float dloss, int acc);
/* With label smoothing @eps, as mge_cpu_softmax_xent_smooth_*; the backward's @dloss is device
 * memory (one float: the engine's upstream gradient never leaves the device). */
int mge_cuda_softmax_xent_smooth_forward(float *loss, float *probs, const float *logits,
                                         const int32_t *labels, int64_t B, int64_t V, float eps);
int mge_cuda_softmax_xent_smooth_backward(float *dlogits, const float *probs, const int32_t *labels,
                                          int64_t B, int64_t V, const float *dloss, float eps,
                                          int acc);

/* ---- reductions and layout ---- */
int mge_cuda_reduce_sum(float *out, const float *inp, int64_t outer, int64_t len, int64_t inner,
                        float scale);
int mge_cuda_reduce_sum_backward(float *dinp, const float *dout, int64_t outer, int64_t len,
                                 int64_t inner, float scale, int acc);
/* @shape and @perm: host arrays of @ndim (<= 6) elements. */
int mge_cuda_permute(float *out, const float *inp, const int64_t *shape, const int *perm, int ndim);
int mge_cuda_copy_axis(float *dst, int64_t dlen, int64_t dstart, const float *src, int64_t slen,
                       int64_t sstart, int64_t len, int64_t outer, int64_t inner, int acc);

/* ---- convolution (cuDNN) and pooling ---- */
struct mge_cuda_conv {
    int N, C, H, W;  /* input */
    int K, R, S;     /* output channels, kernel height, width */
    int stride, pad; /* same in both dims */
    int P, Q;        /* output height, width: (H + 2 pad - R) / stride + 1 */
};
/* out (N,K,P,Q) = conv(inp (N,C,H,W), w (K,C,R,S)) + bias (K, may be NULL). */
int mge_cuda_conv2d_forward(const struct mge_cuda_conv *cv, float *out, const float *inp,
                            const float *w, const float *bias);
/* dinp (+)= conv^T(dout, w); dw (+)= corr(inp, dout); dbias (+)= sum dout; any may be NULL. */
int mge_cuda_conv2d_backward(const struct mge_cuda_conv *cv, float *dinp, float *dw, float *dbias,
                             const float *dout, const float *inp, const float *w, int acc);
struct mge_cuda_pool {
    int N, C, H, W;
    int R, S, stride, pad;
    int P, Q;
};
/* Max: the first maximum of the window (row-major), as the CPU; average over in-bounds cells. */
int mge_cuda_maxpool_forward(const struct mge_cuda_pool *pl, float *out, const float *inp);
int mge_cuda_maxpool_backward(const struct mge_cuda_pool *pl, float *dinp, const float *dout,
                              const float *inp, int acc);
int mge_cuda_avgpool_forward(const struct mge_cuda_pool *pl, float *out, const float *inp);
int mge_cuda_avgpool_backward(const struct mge_cuda_pool *pl, float *dinp, const float *dout,
                              int acc);

/* ---- normalisation, embedding, dropout, attention ---- */
int mge_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *w, const float *b, int64_t rows, int64_t C, float eps);
int mge_cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                const float *inp, const float *w, const float *mean,
                                const float *rstd, int64_t rows, int64_t C, int acc);
/* As mge_cpu_batchnorm_forward/backward, fused relu (@relu, @relu_out) included. */
int mge_cuda_batchnorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *w, const float *b, float *running_mean,
                               float *running_var, int64_t N, int64_t C, int64_t HW, float eps,
                               float momentum, int train, int relu);
int mge_cuda_batchnorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                const float *relu_out, const float *inp, const float *w,
                                const float *mean, const float *rstd, int64_t N, int64_t C,
                                int64_t HW, int acc);
int mge_cuda_embedding_forward(float *out, const int32_t *ids, const float *table, int64_t n,
                               int64_t C);
/* Deterministic: one thread per column, tokens in order (no atomics). */
int mge_cuda_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int64_t n,
                                int64_t V, int64_t C, int acc);
/* The CPU's mask function: kept iff top 24 bits of splitmix64(seed ^ (first + i)) / 2^24 >= p. */
int mge_cuda_dropout_forward(float *out, const float *inp, int64_t n, float p, uint64_t seed,
                             int64_t first);
int mge_cuda_dropout_backward(float *dinp, const float *dout, int64_t n, float p, uint64_t seed,
                              int64_t first, int acc);
/* Causal self-attention over qkv (B, T, 3C), NH heads (head size <= 128); lse (B, NH, T). */
int mge_cuda_attention_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T,
                               int64_t C, int64_t NH);
int mge_cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                                const float *lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                                int acc);

/* ---- optimisers over the parameter arena ---- */
int mge_cuda_sgd_update(float *p, const float *g, float *v, int64_t n, float lr, float mu, float wd,
                        int nesterov);
int mge_cuda_adam_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                         float beta1, float beta2, float eps, float wd, int adamw, int64_t t);
/* *@norm (host) = the L2 norm of @g, summed in double in a fixed order. */
int mge_cuda_l2_norm(double *norm, const float *g, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
