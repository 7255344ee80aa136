/* cuda_ops.cu: CUDA kernels and cuBLAS GEMM behind kernels/cuda/cuda.h; the CPU kernels are the oracle. */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "common/err.h"
#include "kernels/cuda/cuda.h"

static int mge_err_from_cuda(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return MGE_OK;
    return MGE_ERR(MGE_DEVICE, "%s: %s", what, cudaGetErrorString(e));
}

static int mge_err_from_cublas(cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return MGE_OK;
    return MGE_ERR(MGE_DEVICE, "%s: cublas status %d", what, (int)s);
}

int mge_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no driver" error */
        return 0;
    }
    return n;
}

int mge_cuda_device_name(char *buf, size_t len)
{
    cudaDeviceProp prop;
    int rc = mge_err_from_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    if (rc == MGE_OK && len > 0) {
        size_t i = 0;
        for (; i + 1 < len && prop.name[i]; i++)
            buf[i] = prop.name[i];
        buf[i] = '\0';
    }
    return rc;
}

int mge_cuda_malloc(void **p, size_t bytes)
{
    return mge_err_from_cuda(cudaMalloc(p, bytes ? bytes : 1), "cudaMalloc");
}

void mge_cuda_free(void *p)
{
    if (p)
        cudaFree(p);
}

int mge_cuda_to_device(void *dst, const void *src, size_t bytes)
{
    return mge_err_from_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "to device");
}

int mge_cuda_to_host(void *dst, const void *src, size_t bytes)
{
    return mge_err_from_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "to host");
}

int mge_cuda_sync(void) { return mge_err_from_cuda(cudaDeviceSynchronize(), "synchronize"); }

static cublasHandle_t cublas_handle(void)
{
    static cublasHandle_t h;
    static int made;
    if (!made && cublasCreate(&h) == CUBLAS_STATUS_SUCCESS)
        made = 1;
    return made ? h : NULL;
}

int mge_cuda_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc)
{
    cublasHandle_t h = cublas_handle();
    if (!h)
        return MGE_ERR(MGE_DEVICE, "cannot create a cuBLAS handle");
    /* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands */
    return mge_err_from_cublas(cublasSgemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                           ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B,
                                           ldb, A, lda, &beta, C, ldc),
                               "cublasSgemm");
}

__device__ static float act_apply(int act, float x)
{
    switch (act) {
    case 1:
        return x > 0.0f ? x : 0.0f;
    case 2:
        return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
    case 3:
        return tanhf(x);
    case 4:
        return 1.0f / (1.0f + expf(-x));
    default:
        return x;
    }
}

__global__ static void bias_act_kernel(int act, float *out, const float *inp, const float *bias,
                                       int64_t rows, int64_t cols)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < rows * cols)
        out[i] = act_apply(act, inp[i] + (bias ? bias[i % cols] : 0.0f));
}

static unsigned blocks_for(int64_t n) { return (unsigned)((n + 255) / 256); }

int mge_cuda_bias_act_forward(int act, float *out, const float *inp, const float *bias,
                              int64_t rows, int64_t cols)
{
    if (rows * cols == 0)
        return MGE_OK;
    bias_act_kernel<<<blocks_for(rows * cols), 256>>>(act, out, inp, bias, rows, cols);
    return mge_err_from_cuda(cudaGetLastError(), "bias_act");
}

__global__ static void relu_backward_kernel(float *dinp, const float *dout, const float *out,
                                            int64_t n, int acc)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = out[i] > 0.0f ? dout[i] : 0.0f;
        dinp[i] = acc ? dinp[i] + g : g;
    }
}

int mge_cuda_relu_backward(float *dinp, const float *dout, const float *out, int64_t n, int acc)
{
    if (n == 0)
        return MGE_OK;
    relu_backward_kernel<<<blocks_for(n), 256>>>(dinp, dout, out, n, acc);
    return mge_err_from_cuda(cudaGetLastError(), "relu_backward");
}

/* One block per row; the row's loss goes to rowloss[r], summed afterwards in a fixed order. */
__global__ static void xent_forward_kernel(float *rowloss, float *probs, const float *logits,
                                           const int32_t *labels, int64_t V)
{
    int64_t r = blockIdx.x;
    const float *x = logits + r * V;
    float *p = probs + r * V;
    if (threadIdx.x != 0)
        return;
    float mx = x[0];
    for (int64_t j = 1; j < V; j++)
        mx = fmaxf(mx, x[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < V; j++) {
        p[j] = expf(x[j] - mx);
        sum += p[j];
    }
    for (int64_t j = 0; j < V; j++)
        p[j] /= sum;
    rowloss[r] = -(x[labels[r]] - mx - logf(sum));
}

__global__ static void mean_kernel(float *out, const float *v, int64_t n)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        float s = 0.0f;
        for (int64_t i = 0; i < n; i++)
            s += v[i];
        *out = s / (float)n;
    }
}

int mge_cuda_softmax_xent_forward(float *loss, float *probs, const float *logits,
                                  const int32_t *labels, int64_t B, int64_t V)
{
    float *rowloss = NULL;
    int rc = mge_cuda_malloc((void **)&rowloss, sizeof(float) * (size_t)B);
    if (rc != MGE_OK)
        return rc;
    xent_forward_kernel<<<(unsigned)B, 32>>>(rowloss, probs, logits, labels, V);
    mean_kernel<<<1, 1>>>(loss, rowloss, B);
    rc = mge_err_from_cuda(cudaGetLastError(), "softmax_xent_forward");
    mge_cuda_free(rowloss);
    return rc;
}

__global__ static void xent_backward_kernel(float *dlogits, const float *probs,
                                            const int32_t *labels, int64_t B, int64_t V,
                                            float k, int acc)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < B * V) {
        int64_t r = i / V, j = i % V;
        float g = k * (probs[i] - (j == labels[r] ? 1.0f : 0.0f));
        dlogits[i] = acc ? dlogits[i] + g : g;
    }
}

int mge_cuda_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *labels,
                                   int64_t B, int64_t V, float dloss, int acc)
{
    if (B * V == 0)
        return MGE_OK;
    xent_backward_kernel<<<blocks_for(B * V), 256>>>(dlogits, probs, labels, B, V,
                                                     dloss / (float)B, acc);
    return mge_err_from_cuda(cudaGetLastError(), "softmax_xent_backward");
}

__global__ static void sgd_kernel(float *p, const float *g, float *v, int64_t n, float lr,
                                  float mu, float wd, int nesterov)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float gi = g[i] + wd * p[i];
    if (mu == 0.0f) {
        p[i] -= lr * gi;
        return;
    }
    float vi = mu * v[i] + gi;
    v[i] = vi;
    p[i] -= lr * (nesterov ? gi + mu * vi : vi);
}

int mge_cuda_sgd_update(float *p, const float *g, float *v, int64_t n, float lr, float mu,
                        float wd, int nesterov)
{
    if (n == 0)
        return MGE_OK;
    sgd_kernel<<<blocks_for(n), 256>>>(p, g, v, n, lr, mu, wd, nesterov);
    return mge_err_from_cuda(cudaGetLastError(), "sgd_update");
}
