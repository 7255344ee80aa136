/*
 * cuda_ops.cu: the CUDA runtime calls (device, memory, copies), the cuBLAS GEMM, bias +
 * activation, cross-entropy and the optimisers, behind kernels/cuda/cuda.h; the CPU kernels are
 * the oracle (tests/unit/test_cuda.c).
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/err.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_int.h"

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
    int rc = mge__cuda_err(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    if (rc == MGE_OK && len > 0) {
        size_t i = 0;
        for (; i + 1 < len && prop.name[i]; i++)
            buf[i] = prop.name[i];
        buf[i] = '\0';
    }
    return rc;
}

int mge_cuda_open(char *err, size_t errlen)
{
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        snprintf(err, errlen, "no usable CUDA device (%s; CUDA_VISIBLE_DEVICES=%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices", vis ? vis : "(unset)");
        cudaGetLastError();
        return MGE_DEVICE;
    }
    /* the context now, so that its cost and its failure come before the first arena */
    if ((e = cudaSetDevice(0)) != cudaSuccess || (e = cudaFree(NULL)) != cudaSuccess) {
        snprintf(err, errlen, "cannot use CUDA device 0 of CUDA_VISIBLE_DEVICES=%s: %s",
                 vis ? vis : "(unset)", cudaGetErrorString(e));
        cudaGetLastError();
        return MGE_DEVICE;
    }
    return MGE_OK;
}

int mge_cuda_malloc(void **p, size_t bytes)
{
    return mge__cuda_err(cudaMalloc(p, bytes ? bytes : 1), "cudaMalloc");
}

void mge_cuda_free(void *p)
{
    if (p)
        cudaFree(p);
}

int mge_cuda_to_device(void *dst, const void *src, size_t bytes)
{
    return mge__cuda_err(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "to device");
}

int mge_cuda_to_host(void *dst, const void *src, size_t bytes)
{
    return mge__cuda_err(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "to host");
}

int mge_cuda_copy(void *dst, const void *src, size_t bytes)
{
    if (!bytes || dst == src)
        return MGE_OK;
    return mge__cuda_err(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "device copy");
}

int mge_cuda_memset(void *dst, int c, size_t bytes)
{
    return mge__cuda_err(cudaMemset(dst, c, bytes), "cudaMemset");
}

int mge_cuda_sync(void)
{
    return mge__cuda_err(cudaDeviceSynchronize(), "synchronize");
}

/*
 * cuBLAS is loaded on first use, not linked: libcublasLt alone is 540 MB, and linking it made
 * every engine process (most never touch a GPU) start in 0.2 s with 228 MB resident instead of
 * 0.04 s and 13 MB. The executable's run path (the Makefile's -rpath) finds it.
 */
#define MGE__STR2(x) #x
#define MGE__STR(x) MGE__STR2(x)
#define CUBLAS_SONAME "libcublas.so." MGE__STR(CUBLAS_VER_MAJOR)

struct cublas_api {
    decltype(&cublasCreate_v2) create;
    decltype(&cublasSetMathMode) set_math_mode;
    decltype(&cublasSgemm_v2) sgemm;
};

/* The loaded functions, or NULL (logged once). */
static const struct cublas_api *cublas_api(void)
{
    static struct cublas_api api;
    static int state; /* 0 not tried, 1 loaded, -1 failed */
    if (state == 0) {
        void *lib = dlopen(CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            api.create = (decltype(api.create))dlsym(lib, "cublasCreate_v2");
            api.set_math_mode = (decltype(api.set_math_mode))dlsym(lib, "cublasSetMathMode");
            api.sgemm = (decltype(api.sgemm))dlsym(lib, "cublasSgemm_v2");
        }
        state = lib && api.create && api.set_math_mode && api.sgemm ? 1 : -1;
        if (state < 0)
            MGE_ERR(MGE_DEVICE, "cannot load cuBLAS (%s): %s", CUBLAS_SONAME,
                    lib ? "a function is missing" : dlerror());
    }
    return state > 0 ? &api : NULL;
}

/* One handle per process, pinned to plain fp32 math (no TF32: the CPU is the oracle at 1e-5). */
static cublasHandle_t cublas_handle(const struct cublas_api *api)
{
    static cublasHandle_t h;
    static int made;
    if (!made && api->create(&h) == CUBLAS_STATUS_SUCCESS) {
        api->set_math_mode(h, CUBLAS_PEDANTIC_MATH);
        made = 1;
    }
    return made ? h : NULL;
}

int mge_cuda_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc)
{
    const struct cublas_api *api = cublas_api();
    cublasHandle_t h = api ? cublas_handle(api) : NULL;
    if (!h)
        return MGE_ERR(MGE_DEVICE, "cannot create a cuBLAS handle");
    if (M == 0 || N == 0)
        return MGE_OK;
    /* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands */
    return mge_err_from_cublas(api->sgemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                          ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb,
                                          A, lda, &beta, C, ldc),
                               "cublasSgemm");
}

__global__ static void bias_act_kernel(int act, float *out, const float *inp, const float *bias,
                                       int64_t rows, int64_t cols)
{
    MGE__CUDA_FOR(i, rows * cols)
    out[i] = mge__act_forward(act, inp[i] + (bias ? bias[i % cols] : 0.0f));
}

int mge_cuda_bias_act_forward(int act, float *out, const float *inp, const float *bias,
                              int64_t rows, int64_t cols)
{
    if (rows * cols == 0)
        return MGE_OK;
    bias_act_kernel<<<mge__cuda_grid(rows * cols), MGE__CUDA_THREADS>>>(act, out, inp, bias, rows,
                                                                        cols);
    return mge__cuda_launched("bias_act");
}

__global__ static void relu_backward_kernel(float *dinp, const float *dout, const float *out,
                                            int64_t n, int acc)
{
    MGE__CUDA_FOR(i, n)
    {
        float g = out[i] > 0.0f ? dout[i] : 0.0f;
        dinp[i] = acc ? dinp[i] + g : g;
    }
}

int mge_cuda_relu_backward(float *dinp, const float *dout, const float *out, int64_t n, int acc)
{
    if (n == 0)
        return MGE_OK;
    relu_backward_kernel<<<mge__cuda_grid(n), MGE__CUDA_THREADS>>>(dinp, dout, out, n, acc);
    return mge__cuda_launched("relu_backward");
}

/*
 * One block per row: max and sum by a fixed tree over the block's threads, probs written, the
 * row's loss (with smoothing @eps) to rowloss[r] in double; the mean is then summed in row order
 * by one thread, so the loss does not depend on scheduling.
 */
#define XENT_THREADS 256
__global__ static void xent_forward_kernel(double *rowloss, float *probs, const float *logits,
                                           const int32_t *labels, int64_t V, float eps)
{
    __shared__ float red[XENT_THREADS];
    __shared__ double redd[XENT_THREADS];
    int64_t r = blockIdx.x;
    const float *x = logits + r * V;
    float *p = probs + r * V;
    int t = threadIdx.x;
    float m = -INFINITY;
    for (int64_t j = t; j < V; j += XENT_THREADS)
        m = fmaxf(m, x[j]);
    m = mge__block_reduce<float, XENT_THREADS>(m, red, 1);
    float sum = 0.0f;
    double xs = 0.0;
    for (int64_t j = t; j < V; j += XENT_THREADS) {
        float e = expf(x[j] - m);
        p[j] = e;
        sum += e;
        xs += (double)x[j];
    }
    sum = mge__block_reduce<float, XENT_THREADS>(sum, red, 0);
    xs = mge__block_reduce<double, XENT_THREADS>(xs, redd, 0);
    float inv = 1.0f / sum;
    for (int64_t j = t; j < V; j += XENT_THREADS)
        p[j] *= inv;
    if (t == 0) {
        float lse = logf(sum) + m;
        double l = (double)(lse - x[labels[r]]);
        if (eps != 0.0f)
            l = (1.0 - (double)eps) * l + (double)eps * ((double)lse - xs / (double)V);
        rowloss[r] = l;
    }
}

__global__ static void mean_kernel(float *out, const double *v, int64_t n)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        double s = 0.0;
        for (int64_t i = 0; i < n; i++)
            s += v[i];
        *out = (float)(s / (double)n);
    }
}

int mge_cuda_softmax_xent_smooth_forward(float *loss, float *probs, const float *logits,
                                         const int32_t *labels, int64_t B, int64_t V, float eps)
{
    if (B <= 0 || V <= 0)
        return mge_cuda_memset(loss, 0, sizeof(float));
    double *rowloss = NULL;
    int rc = mge_cuda_malloc((void **)&rowloss, sizeof(double) * (size_t)B);
    if (rc != MGE_OK)
        return rc;
    xent_forward_kernel<<<(unsigned)B, XENT_THREADS>>>(rowloss, probs, logits, labels, V, eps);
    mean_kernel<<<1, 1>>>(loss, rowloss, B);
    rc = mge__cuda_launched("softmax_xent_forward");
    mge_cuda_free(rowloss);
    return rc;
}

int mge_cuda_softmax_xent_forward(float *loss, float *probs, const float *logits,
                                  const int32_t *labels, int64_t B, int64_t V)
{
    return mge_cuda_softmax_xent_smooth_forward(loss, probs, logits, labels, B, V, 0.0f);
}

/* @dloss_dev: device pointer to the upstream gradient, or NULL to use @dloss. */
__global__ static void xent_backward_kernel(float *dlogits, const float *probs,
                                            const int32_t *labels, int64_t B, int64_t V,
                                            const float *dloss_dev, float dloss, float eps, int acc)
{
    float k = (dloss_dev ? *dloss_dev : dloss) / (float)B;
    float on = 1.0f - eps + eps / (float)V, off = eps / (float)V;
    MGE__CUDA_FOR(i, B * V)
    {
        int64_t r = i / V, j = i % V;
        float g = k * (probs[i] - (j == labels[r] ? on : off));
        dlogits[i] = acc ? dlogits[i] + g : g;
    }
}

int mge_cuda_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *labels,
                                   int64_t B, int64_t V, float dloss, int acc)
{
    if (B * V == 0)
        return MGE_OK;
    xent_backward_kernel<<<mge__cuda_grid(B * V), MGE__CUDA_THREADS>>>(dlogits, probs, labels, B, V,
                                                                       NULL, dloss, 0.0f, acc);
    return mge__cuda_launched("softmax_xent_backward");
}

int mge_cuda_softmax_xent_smooth_backward(float *dlogits, const float *probs, const int32_t *labels,
                                          int64_t B, int64_t V, const float *dloss, float eps,
                                          int acc)
{
    if (B * V == 0)
        return MGE_OK;
    xent_backward_kernel<<<mge__cuda_grid(B * V), MGE__CUDA_THREADS>>>(dlogits, probs, labels, B, V,
                                                                       dloss, 0.0f, eps, acc);
    return mge__cuda_launched("softmax_xent_backward");
}

__global__ static void sgd_kernel(float *p, const float *g, float *v, int64_t n, float lr, float mu,
                                  float wd, int nesterov)
{
    MGE__CUDA_FOR(i, n)
    {
        if (mu == 0.0f) {
            p[i] -= lr * (g[i] + wd * p[i]);
            continue;
        }
        float gi = g[i] + wd * p[i];
        float vi = mu * v[i] + gi;
        v[i] = vi;
        p[i] -= lr * (nesterov ? gi + mu * vi : vi);
    }
}

int mge_cuda_sgd_update(float *p, const float *g, float *v, int64_t n, float lr, float mu, float wd,
                        int nesterov)
{
    if (n == 0)
        return MGE_OK;
    sgd_kernel<<<mge__cuda_grid(n), MGE__CUDA_THREADS>>>(p, g, v, n, lr, mu, wd, nesterov);
    return mge__cuda_launched("sgd_update");
}

__global__ static void adam_kernel(float *p, const float *g, float *m, float *v, int64_t n,
                                   float lr, float beta1, float beta2, float eps, float l2,
                                   float decay, float c1, float c2)
{
    MGE__CUDA_FOR(i, n)
    {
        float gi = g[i] + l2 * p[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= decay * p[i] + lr * (mi * c1) / (sqrtf(vi * c2) + eps);
    }
}

int mge_cuda_adam_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                         float beta1, float beta2, float eps, float wd, int adamw, int64_t t)
{
    if (n == 0)
        return MGE_OK;
    /* the bias corrections on the host, in float as the CPU kernel computes them */
    float c1 = 1.0f / (1.0f - powf(beta1, (float)t));
    float c2 = 1.0f / (1.0f - powf(beta2, (float)t));
    float l2 = adamw ? 0.0f : wd, decay = adamw ? lr * wd : 0.0f;
    adam_kernel<<<mge__cuda_grid(n), MGE__CUDA_THREADS>>>(p, g, m, v, n, lr, beta1, beta2, eps, l2,
                                                          decay, c1, c2);
    return mge__cuda_launched("adam_update");
}

/* The CPU's 64 fixed chunks, each summed in order by one block's tree, then the chunks in order. */
#define NORM_CHUNKS 64
#define NORM_THREADS 256
__global__ static void l2_chunks_kernel(double *part, const float *g, int64_t n, int64_t chunk)
{
    __shared__ double red[NORM_THREADS];
    int64_t i0 = blockIdx.x * chunk, i1 = i0 + chunk < n ? i0 + chunk : n;
    double s = 0.0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += NORM_THREADS)
        s += (double)g[i] * (double)g[i];
    s = mge__block_reduce<double, NORM_THREADS>(s, red, 0);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

int mge_cuda_l2_norm(double *norm, const float *g, int64_t n)
{
    double part[NORM_CHUNKS], *dpart = NULL;
    int64_t chunk = (n + NORM_CHUNKS - 1) / NORM_CHUNKS;
    *norm = 0.0;
    if (n <= 0)
        return MGE_OK;
    int rc = mge_cuda_malloc((void **)&dpart, sizeof(part));
    if (rc != MGE_OK)
        return rc;
    l2_chunks_kernel<<<NORM_CHUNKS, NORM_THREADS>>>(dpart, g, n, chunk);
    rc = mge__cuda_launched("l2_norm");
    if (rc == MGE_OK)
        rc = mge_cuda_to_host(part, dpart, sizeof(part));
    mge_cuda_free(dpart);
    if (rc != MGE_OK)
        return rc;
    double total = 0.0;
    for (int c = 0; c < NORM_CHUNKS; c++)
        total += part[c];
    *norm = sqrt(total);
    return MGE_OK;
}
