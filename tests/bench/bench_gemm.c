/* bench_gemm.c: GFLOP/s of each SGEMM backend on the MLP and LeNet GEMM shapes, 1 and 2 threads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/cpu_int.h"

struct shape {
    const char *name;
    int ta, tb, M, N, K;
};

/* MLP 784-512-512-10 at batch 128 (weights (out, in)), then LeNet-5 im2col GEMMs per image. */
static const struct shape shapes[] = {
    {"fc1 fwd  X@W^T", 0, 1, 128, 512, 784},    {"fc2 fwd  X@W^T", 0, 1, 128, 512, 512},
    {"fc3 fwd  X@W^T", 0, 1, 128, 10, 512},     {"fc1 dX   dY@W", 0, 0, 128, 784, 512},
    {"fc2 dX   dY@W", 0, 0, 128, 512, 512},     {"fc3 dX   dY@W", 0, 0, 128, 512, 10},
    {"fc1 dW   dY^T@X", 1, 0, 512, 784, 128},   {"fc2 dW   dY^T@X", 1, 0, 512, 512, 128},
    {"fc3 dW   dY^T@X", 1, 0, 10, 512, 128},    {"conv1 fwd W@col", 0, 0, 6, 784, 25},
    {"conv1 dW dO@col^T", 0, 1, 6, 25, 784},    {"conv2 fwd W@col", 0, 0, 16, 100, 150},
    {"conv2 dW dO@col^T", 0, 1, 16, 150, 100},  {"conv2 dcol W^T@dO", 1, 0, 150, 100, 16},
    {"conv1 batched fwd", 0, 0, 6, 100352, 25}, {"conv2 batched fwd", 0, 0, 16, 12800, 150},
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median GFLOP/s over 7 samples of about 20 ms each. */
static double measure(int backend, const struct shape *s, const float *A, const float *B, float *C)
{
    int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    double flop = 2.0 * s->M * s->N * s->K;
    int reps = 1;
    for (;;) {
        double t0 = now();
        for (int r = 0; r < reps; r++)
            mge__cpu_sgemm_with(backend, s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f,
                                C, s->N);
        if (now() - t0 > 0.02 || reps > (1 << 24))
            break;
        reps *= 2;
    }
    double g[7];
    for (int i = 0; i < 7; i++) {
        double t0 = now();
        for (int r = 0; r < reps; r++)
            mge__cpu_sgemm_with(backend, s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f,
                                C, s->N);
        g[i] = flop * reps / (now() - t0) * 1e-9;
    }
    qsort(g, 7, sizeof(g[0]), cmp_double);
    return g[3];
}

int main(int argc, char **argv)
{
    static const int backends[] = {MGE__GEMM_OPENBLAS, MGE__GEMM_DNNL_OMP, MGE__GEMM_DNNL};
    int nb = (int)(sizeof(backends) / sizeof(backends[0]));
    int nshapes = (int)(sizeof(shapes) / sizeof(shapes[0]));
    size_t maxa = 0, maxb = 0, maxc = 0;
    for (int i = 0; i < nshapes; i++) {
        size_t a = (size_t)shapes[i].M * shapes[i].K, b = (size_t)shapes[i].K * shapes[i].N;
        size_t c = (size_t)shapes[i].M * shapes[i].N;
        maxa = a > maxa ? a : maxa;
        maxb = b > maxb ? b : maxb;
        maxc = c > maxc ? c : maxc;
    }
    float *A = malloc(maxa * sizeof(float)), *B = malloc(maxb * sizeof(float));
    float *C = malloc(maxc * sizeof(float));
    if (!A || !B || !C)
        return 1;
    for (size_t i = 0; i < maxa; i++)
        A[i] = (float)((i * 7 % 13) - 6) * 0.1f;
    for (size_t i = 0; i < maxb; i++)
        B[i] = (float)((i * 5 % 11) - 5) * 0.1f;

    int tmin = 1, tmax = 2;
    if (argc > 1)
        tmin = tmax = atoi(argv[1]);
    printf("GFLOP/s, median of 7 (OPENBLAS_CORETYPE=%s)\n",
           getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "unset");
    for (int t = tmin; t <= tmax; t++) {
        mge_cpu_set_threads(t);
        printf("\nthreads %d\n%-20s %2s %2s %6s %6s %6s", t, "shape", "ta", "tb", "M", "N", "K");
        for (int b = 0; b < nb; b++)
            printf(" %10s", mge__gemm_backend_name(backends[b]));
        printf("\n");
        for (int i = 0; i < nshapes; i++) {
            const struct shape *s = &shapes[i];
            printf("%-20s %2d %2d %6d %6d %6d", s->name, s->ta, s->tb, s->M, s->N, s->K);
            fflush(stdout);
            for (int b = 0; b < nb; b++)
                printf(" %10.1f", measure(backends[b], s, A, B, C));
            printf("\n");
        }
    }
    free(A);
    free(B);
    free(C);
    return 0;
}
