/*
 * fma_peak.c: this machine's fp32 multiply-add peak, the roof the training benchmarks are
 * measured against: 12 independent chains of vfmadd per thread (AVX-512 where the CPU has it,
 * else AVX2 + FMA; chosen at run time), best of 5 runs, for 1 thread and for THREADS.
 * Prints one JSON line: {"isa": ..., "gflops_1": ..., "gflops_n": ..., "threads": N}.
 * Usage: fma_peak [THREADS]   (default: OpenMP's default thread count)
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#define CHAINS 12
#define ITERS 20000000L /* per thread: 12 x 20M x 16 lanes x 2 FLOPs = 7.7 GFLOP at AVX-512 */

__attribute__((target("avx512f"))) static float chains512(long iters)
{
    __m512 a[CHAINS], b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++)
        a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < CHAINS; i++)
            a[i] = _mm512_fmadd_ps(a[i], b, c);
    }
    for (int i = 1; i < CHAINS; i++)
        a[0] = _mm512_add_ps(a[0], a[i]);
    return _mm512_reduce_add_ps(a[0]);
}

__attribute__((target("avx2,fma"))) static float chains256(long iters)
{
    __m256 a[CHAINS], b = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(1e-7f);
    float out[8], s = 0.0f;
    for (int i = 0; i < CHAINS; i++)
        a[i] = _mm256_set1_ps((float)i);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < CHAINS; i++)
            a[i] = _mm256_fmadd_ps(a[i], b, c);
    }
    for (int i = 1; i < CHAINS; i++)
        a[0] = _mm256_add_ps(a[0], a[i]);
    _mm256_storeu_ps(out, a[0]);
    for (int i = 0; i < 8; i++)
        s += out[i];
    return s;
}

/* GFLOP/s of @threads threads running their chains at once, best of 5. */
static double peak(int threads, int wide, float *sink)
{
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = omp_get_wtime();
        float s = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : s)
        s += wide ? chains512(ITERS) : chains256(ITERS);
        double t = omp_get_wtime() - t0;
        double flops = (double)threads * ITERS * CHAINS * (wide ? 16 : 8) * 2;
        if (flops / t > best)
            best = flops / t;
        *sink += s;
    }
    return best / 1e9;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : omp_get_max_threads();
    int wide = __builtin_cpu_supports("avx512f");
    float sink = 0.0f;
    if (threads < 1)
        threads = 1;
    double g1 = peak(1, wide, &sink), gn = peak(threads, wide, &sink);
    printf("{\"isa\": \"%s\", \"gflops_1\": %.1f, \"gflops_n\": %.1f, \"threads\": %d, "
           "\"sink\": %g}\n",
           wide ? "avx512f" : "avx2-fma", g1, gn, threads, (double)sink);
    return 0;
}
