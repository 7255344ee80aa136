/*
 * cuda.h: the CUDA kernels, the GPU counterpart of kernels/cpu/cpu.h (same argument order and
 * semantics; pointers are device memory). Built only when nvcc exists; callers test
 * mge_cuda_device_count() first, since a machine may have the toolkit and no GPU.
 * Every function returns MGE_OK or MGE_DEVICE (the CUDA error is logged where it happens).
 * Threads: one CUDA context per process; calls are issued on the default stream.
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

int mge_cuda_malloc(void **p, size_t bytes);
void mge_cuda_free(void *p);
int mge_cuda_to_device(void *dst, const void *src, size_t bytes);
int mge_cuda_to_host(void *dst, const void *src, size_t bytes);
int mge_cuda_sync(void);

/* C = alpha op(A) op(B) + beta C, row-major, as mge_cpu_sgemm (cuBLAS underneath). */
int mge_cuda_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc);
/* out[r, c] = act(inp[r, c] + bias[c]); act as enum mge_cpu_unary (0 identity, 1 relu, ...). */
int mge_cuda_bias_act_forward(int act, float *out, const float *inp, const float *bias,
                              int64_t rows, int64_t cols);
/* dinp (+)= dout * f'(x) for relu (uses @out) and identity. */
int mge_cuda_relu_backward(float *dinp, const float *dout, const float *out, int64_t n, int acc);
/* Fused softmax + mean cross-entropy; *loss is device memory (one float). */
int mge_cuda_softmax_xent_forward(float *loss, float *probs, const float *logits,
                                  const int32_t *labels, int64_t B, int64_t V);
int mge_cuda_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *labels,
                                   int64_t B, int64_t V, float dloss, int acc);
int mge_cuda_sgd_update(float *p, const float *g, float *v, int64_t n, float lr, float mu,
                        float wd, int nesterov);

#ifdef __cplusplus
}
#endif
#endif
