/*
 * bench_cuda.c: SGEMM GFLOP/s of the CUDA kernels (cuBLAS) against the CPU kernels, on square
 * and MLP-shaped GEMMs, with the largest relative difference of the results (`make bench-gpu`).
 * Without a CUDA device it prints a skip line and exits 0.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/err.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda.h"

struct shape {
    const char *name;
    int M, N, K;
};

static const struct shape shapes[] = {
    {"square 1024", 1024, 1024, 1024},
    {"square 4096", 4096, 4096, 4096},
    {"fc1 fwd (128x512x784)", 128, 512, 784},
    {"fc big (4096x4096x1024)", 4096, 4096, 1024},
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Median of @n times, s, of the GEMM of @sh on the device (@gpu) or the CPU. */
static double time_gemm(const struct shape *sh, int gpu, const float *A, const float *B, float *C,
                        int n)
{
    double t[16], tmp;
    for (int r = 0; r < n; r++) {
        double t0 = now();
        if (gpu) {
            mge_cuda_sgemm(0, 0, sh->M, sh->N, sh->K, 1.0f, A, sh->K, B, sh->N, 0.0f, C, sh->N);
            mge_cuda_sync();
        } else {
            mge_cpu_sgemm(0, 0, sh->M, sh->N, sh->K, 1.0f, A, sh->K, B, sh->N, 0.0f, C, sh->N);
        }
        t[r] = now() - t0;
    }
    for (int i = 0; i < n; i++)
        for (int k = i + 1; k < n; k++)
            if (t[k] < t[i])
                tmp = t[i], t[i] = t[k], t[k] = tmp;
    return t[n / 2];
}

int main(void)
{
    char name[256];
    int threads = getenv("MGE_BENCH_THREADS") ? atoi(getenv("MGE_BENCH_THREADS")) : 2;
    if (mge_cuda_device_count() == 0) {
        printf("skip - bench-gpu: no CUDA device (%zu GEMM shapes not timed)\n",
               sizeof(shapes) / sizeof(shapes[0]));
        return 0;
    }
    mge_cuda_device_name(name, sizeof(name));
    mge_cpu_set_threads(threads > 0 ? threads : 2);
    printf("cuda device: %s; CPU: %d threads\n", name, mge_cpu_threads());
    printf("%-26s %12s %12s %8s %12s\n", "shape", "GPU GFLOP/s", "CPU GFLOP/s", "x",
           "max rel diff");
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        const struct shape *sh = &shapes[s];
        size_t na = (size_t)sh->M * sh->K, nb = (size_t)sh->K * sh->N, nc = (size_t)sh->M * sh->N;
        /* one host allocation: A, B, the CPU's C, the GPU's result G */
        float *A = malloc((na + nb + 2 * nc) * sizeof(float)), *B = A + na, *C = B + nb,
              *G = C + nc;
        void *dA = NULL, *dB = NULL, *dC = NULL;
        double flop = 2.0 * sh->M * sh->N * sh->K, tg, tc, diff = 0, scale = 0;
        if (!A || mge_cuda_malloc(&dA, na * sizeof(float)) != MGE_OK ||
            mge_cuda_malloc(&dB, nb * sizeof(float)) != MGE_OK ||
            mge_cuda_malloc(&dC, nc * sizeof(float)) != MGE_OK) {
            fprintf(stderr, "bench_cuda: out of memory at '%s'\n", sh->name);
            return 1;
        }
        for (size_t i = 0; i < na; i++)
            A[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
        for (size_t i = 0; i < nb; i++)
            B[i] = (float)((i * 40503u) % 1000) / 500.0f - 1.0f;
        mge_cuda_to_device(dA, A, na * sizeof(float));
        mge_cuda_to_device(dB, B, nb * sizeof(float));
        time_gemm(sh, 1, dA, dB, dC, 1); /* warm-up: cuBLAS handle, kernels */
        tg = time_gemm(sh, 1, dA, dB, dC, 5);
        tc = time_gemm(sh, 0, A, B, C, sh->M * (double)sh->N * sh->K > 4e9 ? 1 : 3);
        mge_cuda_to_host(G, dC, nc * sizeof(float));
        for (size_t i = 0; i < nc; i++) {
            diff = fmax(diff, fabs((double)G[i] - C[i]));
            scale = fmax(scale, fabs((double)C[i]));
        }
        printf("%-26s %12.1f %12.1f %8.1f %12.2e\n", sh->name, flop / tg * 1e-9, flop / tc * 1e-9,
               tc / tg, scale > 0 ? diff / scale : diff);
        mge_cuda_free(dA);
        mge_cuda_free(dB);
        mge_cuda_free(dC);
        free(A);
    }
    return 0;
}
