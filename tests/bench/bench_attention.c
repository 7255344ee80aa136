/*
 * bench_attention.c: the fused causal attention kernels alone (kernels/cpu/attention.c) on
 * GPT-mini's shape, B 16, T 128, C 128, 4 heads of 32 (examples/gpt-text.yaml; one layer).
 * Best of REPS timed runs of forward and of backward after a warm-up, GFLOP/s counting the
 * products a causal kernel needs: 2 of them forward (S = Q Kᵀ, O = P V), 5 backward (S, dP,
 * dV, dK, dQ), each 2 hs T (T + 1) / 2 FLOPs per (b, h). Prints one JSON line.
 * Usage: bench_attention [THREADS [REPS]]   (defaults: OpenMP's thread count, 50)
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"

enum { B = 16, T = 128, C = 128, NH = 4, HS = C / NH };

static double best_ms(int fwd, int reps, float *out, float *lse, const float *qkv, float *dqkv,
                      const float *dout)
{
    double best = INFINITY;
    for (int r = -3; r < reps; r++) {
        double t0 = omp_get_wtime();
        if (fwd)
            mge_cpu_attention_forward(out, lse, qkv, B, T, C, NH);
        else
            mge_cpu_attention_backward(dqkv, dout, qkv, out, lse, B, T, C, NH, 0);
        double ms = (omp_get_wtime() - t0) * 1e3;
        if (r >= 0 && ms < best)
            best = ms;
    }
    return best;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : omp_get_max_threads();
    int reps = argc > 2 ? atoi(argv[2]) : 50;
    if (threads < 1 || reps < 1) {
        fprintf(stderr, "usage: bench_attention [THREADS [REPS]]\n");
        return 2;
    }
    omp_set_num_threads(threads);
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    float *qkv = malloc(sizeof(float) * nqkv), *dqkv = malloc(sizeof(float) * nqkv);
    float *out = malloc(sizeof(float) * nout), *dout = malloc(sizeof(float) * nout);
    float *lse = malloc(sizeof(float) * B * NH * T);
    if (!qkv || !dqkv || !out || !dout || !lse) {
        fprintf(stderr, "bench_attention: out of memory\n");
        return 1;
    }
    unsigned s = 12345;
    for (size_t i = 0; i < nqkv; i++) {
        s = s * 1664525u + 1013904223u;
        qkv[i] = (float)(s >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
    }
    for (size_t i = 0; i < nout; i++) {
        s = s * 1664525u + 1013904223u;
        dout[i] = (float)(s >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
    }
    double prod = 2.0 * HS * T * (T + 1) / 2.0 * B * NH; /* FLOPs of one causal product */
    double f = best_ms(1, reps, out, lse, qkv, dqkv, dout);
    double g = best_ms(0, reps, out, lse, qkv, dqkv, dout);
    printf("{\"threads\": %d, \"forward_ms\": %.3f, \"forward_gflops\": %.1f, "
           "\"backward_ms\": %.3f, \"backward_gflops\": %.1f}\n",
           threads, f, 2 * prod / f / 1e6, g, 5 * prod / g / 1e6);
    free(qkv);
    free(dqkv);
    free(out);
    free(dout);
    free(lse);
    return 0;
}
