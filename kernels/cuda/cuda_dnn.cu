/*
 * cuda_dnn.cu: 2-D convolution forward, backward-data and backward-weights through cuDNN's
 * legacy API (kept in cuDNN 9), NCHW fp32 with plain FMA math (no TF32) and fixed deterministic
 * algorithms; the bias and its gradient are our own kernels. One handle and one workspace,
 * grown on demand, per process.
 */
#include <cuda_runtime.h>
#include <cudnn.h>

#include "common/err.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_int.h"

static int mge_err_from_cudnn(cudnnStatus_t s, const char *what)
{
    if (s == CUDNN_STATUS_SUCCESS)
        return MGE_OK;
    return MGE_ERR(MGE_DEVICE, "%s: %s", what, cudnnGetErrorString(s));
}

static cudnnHandle_t dnn_handle(void)
{
    static cudnnHandle_t h;
    static int made;
    if (!made && cudnnCreate(&h) == CUDNN_STATUS_SUCCESS)
        made = 1;
    return made ? h : NULL;
}

/*
 * The process's workspace of at least *@bytes into *@ws, given the status of the cuDNN query
 * that sized it (@st) for @what: MGE_OK, or MGE_DEVICE / MGE_NOMEM (logged).
 */
static int workspace(cudnnStatus_t st, const size_t *bytes, const char *what, void **ws)
{
    static void *have_ws;
    static size_t have;
    int rc = mge_err_from_cudnn(st, what);
    *ws = NULL;
    if (rc != MGE_OK)
        return rc;
    if (*bytes > have) {
        mge_cuda_free(have_ws);
        have_ws = NULL;
        have = 0;
        if (mge_cuda_malloc(&have_ws, *bytes) != MGE_OK)
            return MGE_ERR(MGE_NOMEM, "%s: no %zu-byte cuDNN workspace", what, *bytes);
        have = *bytes;
    }
    *ws = have_ws;
    return MGE_OK;
}

/* The four descriptors of one convolution. */
struct dnn_conv {
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
};

static void dnn_conv_fini(struct dnn_conv *d)
{
    if (d->x)
        cudnnDestroyTensorDescriptor(d->x);
    if (d->y)
        cudnnDestroyTensorDescriptor(d->y);
    if (d->w)
        cudnnDestroyFilterDescriptor(d->w);
    if (d->conv)
        cudnnDestroyConvolutionDescriptor(d->conv);
}

static int dnn_conv_init(struct dnn_conv *d, const struct mge_cuda_conv *cv)
{
    cudnnStatus_t s;
    *d = (struct dnn_conv){0, 0, 0, 0};
    if ((s = cudnnCreateTensorDescriptor(&d->x)) != CUDNN_STATUS_SUCCESS ||
        (s = cudnnCreateTensorDescriptor(&d->y)) != CUDNN_STATUS_SUCCESS ||
        (s = cudnnCreateFilterDescriptor(&d->w)) != CUDNN_STATUS_SUCCESS ||
        (s = cudnnCreateConvolutionDescriptor(&d->conv)) != CUDNN_STATUS_SUCCESS ||
        (s = cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, cv->N, cv->C,
                                        cv->H, cv->W)) != CUDNN_STATUS_SUCCESS ||
        (s = cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, cv->N, cv->K,
                                        cv->P, cv->Q)) != CUDNN_STATUS_SUCCESS ||
        (s = cudnnSetFilter4dDescriptor(d->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, cv->K, cv->C,
                                        cv->R, cv->S)) != CUDNN_STATUS_SUCCESS ||
        (s = cudnnSetConvolution2dDescriptor(d->conv, cv->pad, cv->pad, cv->stride, cv->stride, 1,
                                             1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT)) !=
            CUDNN_STATUS_SUCCESS ||
        (s = cudnnSetConvolutionMathType(d->conv, CUDNN_FMA_MATH)) != CUDNN_STATUS_SUCCESS) {
        dnn_conv_fini(d);
        return mge_err_from_cudnn(s, "conv2d descriptors");
    }
    return MGE_OK;
}

/* out[n, k, :, :] += bias[k] */
__global__ static void conv_bias_kernel(float *out, const float *bias, int64_t n, int64_t K,
                                        int64_t PQ)
{
    MGE__CUDA_FOR(i, n)
    out[i] += bias[i / PQ % K];
}

/* dbias[k] (+)= sum over n, p, q of dout: one block per channel, a fixed tree. */
#define DB_THREADS 256
__global__ static void conv_dbias_kernel(float *dbias, const float *dout, int64_t N, int64_t K,
                                         int64_t PQ, int acc)
{
    __shared__ float red[DB_THREADS];
    int64_t k = blockIdx.x, cnt = N * PQ;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < cnt; i += DB_THREADS)
        s += dout[(i / PQ * K + k) * PQ + i % PQ];
    s = mge__block_reduce<float, DB_THREADS>(s, red, 0);
    if (threadIdx.x == 0)
        dbias[k] = acc ? dbias[k] + s : s;
}

int mge_cuda_conv2d_forward(const struct mge_cuda_conv *cv, float *out, const float *inp,
                            const float *w, const float *bias)
{
    cudnnHandle_t h = dnn_handle();
    struct dnn_conv d;
    size_t bytes = 0;
    const float one = 1.0f, zero = 0.0f;
    const cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    if (!h)
        return MGE_ERR(MGE_DEVICE, "cannot create a cuDNN handle");
    int rc = dnn_conv_init(&d, cv);
    if (rc != MGE_OK)
        return rc;
    void *ws;
    rc = workspace(cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, algo, &bytes),
                   &bytes, "conv2d forward workspace", &ws);
    if (rc == MGE_OK)
        rc = mge_err_from_cudnn(cudnnConvolutionForward(h, &one, d.x, inp, d.w, w, d.conv, algo, ws,
                                                        bytes, &zero, d.y, out),
                                "cudnnConvolutionForward");
    dnn_conv_fini(&d);
    int64_t n = (int64_t)cv->N * cv->K * cv->P * cv->Q;
    if (rc == MGE_OK && bias && n) {
        conv_bias_kernel<<<mge__cuda_grid(n), MGE__CUDA_THREADS>>>(out, bias, n, cv->K,
                                                                   (int64_t)cv->P * cv->Q);
        rc = mge__cuda_launched("conv2d bias");
    }
    return rc;
}

int mge_cuda_conv2d_backward(const struct mge_cuda_conv *cv, float *dinp, float *dw, float *dbias,
                             const float *dout, const float *inp, const float *w, int acc)
{
    cudnnHandle_t h = dnn_handle();
    struct dnn_conv d;
    const float one = 1.0f, beta = acc ? 1.0f : 0.0f;
    const cudnnConvolutionBwdDataAlgo_t dalgo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    const cudnnConvolutionBwdFilterAlgo_t walgo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
    if (!h)
        return MGE_ERR(MGE_DEVICE, "cannot create a cuDNN handle");
    int rc = dnn_conv_init(&d, cv);
    if (rc != MGE_OK)
        return rc;
    if (dinp) {
        size_t bytes = 0;
        void *ws;
        rc = workspace(
            cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, dalgo, &bytes),
            &bytes, "conv2d backward-data workspace", &ws);
        if (rc == MGE_OK)
            rc =
                mge_err_from_cudnn(cudnnConvolutionBackwardData(h, &one, d.w, w, d.y, dout, d.conv,
                                                                dalgo, ws, bytes, &beta, d.x, dinp),
                                   "cudnnConvolutionBackwardData");
    }
    if (rc == MGE_OK && dw) {
        size_t bytes = 0;
        void *ws;
        rc = workspace(
            cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, walgo, &bytes),
            &bytes, "conv2d backward-filter workspace", &ws);
        if (rc == MGE_OK)
            rc = mge_err_from_cudnn(cudnnConvolutionBackwardFilter(h, &one, d.x, inp, d.y, dout,
                                                                   d.conv, walgo, ws, bytes, &beta,
                                                                   d.w, dw),
                                    "cudnnConvolutionBackwardFilter");
    }
    dnn_conv_fini(&d);
    if (rc == MGE_OK && dbias && cv->K) {
        conv_dbias_kernel<<<(unsigned)cv->K, DB_THREADS>>>(dbias, dout, cv->N, cv->K,
                                                           (int64_t)cv->P * cv->Q, acc);
        rc = mge__cuda_launched("conv2d dbias");
    }
    return rc;
}
