/* cuda_int.h: what the .cu files of kernels/cuda share: errors, launch sizes, activations. */
#ifndef MGE_KERNELS_CUDA_INT_H
#define MGE_KERNELS_CUDA_INT_H

#include <cuda_runtime.h>

#include "common/err.h"
#include "kernels/cuda/cuda.h"

/* cudaError_t -> MGE_OK or MGE_DEVICE, logged with @what. */
static inline int mge__cuda_err(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return MGE_OK;
    return MGE_ERR(MGE_DEVICE, "%s: %s", what, cudaGetErrorString(e));
}

/* The launch just issued: MGE_OK, or its error (bad configuration, a sticky fault). */
static inline int mge__cuda_launched(const char *what)
{
    return mge__cuda_err(cudaGetLastError(), what);
}

#define MGE__CUDA_THREADS 256
static inline unsigned mge__cuda_blocks(int64_t n)
{
    return (unsigned)((n + MGE__CUDA_THREADS - 1) / MGE__CUDA_THREADS);
}

/* Grid-stride loop over [0, n). */
#define MGE__CUDA_FOR(i, n)                                                                        \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)blockDim.x * gridDim.x)

/* Blocks for a grid-stride loop over @n elements (capped: each thread then takes several). */
static inline unsigned mge__cuda_grid(int64_t n)
{
    int64_t b = (n + MGE__CUDA_THREADS - 1) / MGE__CUDA_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/*
 * Block-wide sum (or max, @is_max) of every thread's @v by a fixed tree over @red (THREADS
 * elements of shared memory; blockDim.x == THREADS, a power of 2): the same order every run.
 * Every thread gets the result; @red may be reused right after.
 */
template <typename T, int THREADS>
__device__ static inline T mge__block_reduce(T v, T *red, int is_max)
{
    int t = threadIdx.x;
    red[t] = v;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {
        if (t < s)
            red[t] = is_max ? (red[t + s] > red[t] ? red[t + s] : red[t]) : red[t] + red[t + s];
        __syncthreads();
    }
    T r = red[0];
    __syncthreads();
    return r;
}

#define MGE__GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define MGE__GELU_C 0.044715f

/* The activations of enum mge_cpu_unary: 0 identity, 1 relu, 2 gelu (tanh form), 3 tanh, 4 sigmoid.
 */
__device__ static inline float mge__act_forward(int act, float x)
{
    switch (act) {
    case 1:
        return x > 0.0f ? x : 0.0f;
    case 2:
        return 0.5f * x * (1.0f + tanhf(MGE__GELU_K * (x + MGE__GELU_C * x * x * x)));
    case 3:
        return tanhf(x);
    case 4:
        return 1.0f / (1.0f + expf(-x));
    default:
        return x;
    }
}

/* f'(x) given the input @x and the output @y, as the CPU's act_grad. */
__device__ static inline float mge__act_grad(int act, float x, float y)
{
    switch (act) {
    case 1:
        return y > 0.0f ? 1.0f : 0.0f;
    case 2: {
        float u = MGE__GELU_K * (x + MGE__GELU_C * x * x * x);
        float t = tanhf(u);
        float du = MGE__GELU_K * (1.0f + 3.0f * MGE__GELU_C * x * x);
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    }
    case 3:
        return 1.0f - y * y;
    case 4:
        return y * (1.0f - y);
    default:
        return 1.0f;
    }
}

#endif
