/*
 * bench_conv.c: ms per call of each conv backend on LeNet-5's convs (or ResNet-20's, "resnet" as
 * the second argument) at batch 128, 1 and 2 threads (or the third argument's count only).
 * "cpu" as the fourth argument times with the process's CPU clock instead of the wall clock: at one
 * thread on a shared machine, what the kernels cost without the time other processes took.
 * With "resnet", the weight gradients of the stride-1 3x3 convs alone follow (direct, Winograd
 * F(2x2) and F(4x4)), then the batch norms; "dw" as the fifth argument times those dw alone.
 * Columns: each backend; "winograd" is F(2x2) or F(4x4) forward and dinp as conv.c chooses per
 * shape, "wino2" and "wino4" the same backend held to one tile (its dw as conv.c chooses in all).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/conv_winograd_dw_int.h"
#include "kernels/cpu/cpu_int.h"

struct shape {
    const char *name;
    int C, H, W, K, R, S, stride, pad;
    int want_dx; /* LeNet's conv1 reads the data: no dinp wanted */
    int count;   /* how many of this conv one step runs */
};

static const struct shape lenet[] = {
    {"conv1 1x28x28->6 5x5 p2", 1, 28, 28, 6, 5, 5, 1, 2, 0, 1},
    {"conv2 6x14x14->16 5x5", 6, 14, 14, 16, 5, 5, 1, 0, 1, 1},
};

/* ResNet-20 on 1x28x28 (examples/fmnist-resnet20.yaml, width 16, option-B shortcuts) */
static const struct shape resnet[] = {
    {"stem 1x28x28->16 3x3 p1", 1, 28, 28, 16, 3, 3, 1, 1, 0, 1},
    {"16x28x28->16 3x3 p1", 16, 28, 28, 16, 3, 3, 1, 1, 1, 6},
    {"16x28x28->32 3x3 s2 p1", 16, 28, 28, 32, 3, 3, 2, 1, 1, 1},
    {"16x28x28->32 1x1 s2", 16, 28, 28, 32, 1, 1, 2, 0, 1, 1},
    {"32x14x14->32 3x3 p1", 32, 14, 14, 32, 3, 3, 1, 1, 1, 5},
    {"32x14x14->64 3x3 s2 p1", 32, 14, 14, 64, 3, 3, 2, 1, 1, 1},
    {"32x14x14->64 1x1 s2", 32, 14, 14, 64, 1, 1, 2, 0, 1, 1},
    {"64x7x7->64 3x3 p1", 64, 7, 7, 64, 3, 3, 1, 1, 1, 5},
};

static clockid_t g_clock = CLOCK_MONOTONIC;

static double now(void)
{
    struct timespec ts;
    clock_gettime(g_clock, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct bufs {
    float *x, *w, *b, *y, *dy, *dx, *dw, *db;
    void *scratch;
};

/* A column: a backend, and the Winograd tile its forward and dinp are held to (0: conv.c's) */
struct column {
    int backend, tile;
    const char *name;
};

/* One weight gradient alone: the direct kernel's through the dispatch, or a Winograd one */
enum dw_kind { DW_NONE = -1, DW_DIRECT, DW_WINOGRAD2, DW_WINOGRAD4, DW_KINDS };

/* What one timed call does: a backend's forward or backward, or a weight gradient alone */
struct op {
    int backend, bwd, want_dx; /* want_dx: LeNet's conv1 reads the data: no dinp wanted */
    enum dw_kind dw;           /* DW_NONE, or the dw alone and nothing else */
};

static void call(const struct op *op, const struct mge_cpu_conv *cv, const struct bufs *B)
{
    if (op->dw == DW_DIRECT)
        mge__cpu_conv2d_backward_with(MGE__CONV_DIRECT, cv, NULL, B->dw, NULL, B->dy, B->x, B->w,
                                      B->scratch, 0);
    else if (op->dw == DW_WINOGRAD2)
        mge__conv_winograd_backward_weights(cv, B->dw, B->dy, B->x, B->scratch, 0);
    else if (op->dw == DW_WINOGRAD4)
        mge__conv_winograd4_backward_weights(cv, B->dw, B->dy, B->x, B->scratch, 0);
    else if (op->bwd)
        mge__cpu_conv2d_backward_with(op->backend, cv, op->want_dx ? B->dx : NULL, B->dw, B->db,
                                      B->dy, B->x, B->w, B->scratch, 0);
    else
        mge__cpu_conv2d_forward_with(op->backend, cv, B->y, B->x, B->w, B->b, B->scratch);
}

/* Median ms per call over 9 samples of about 30 ms each (after one warm-up call). */
static double measure(const struct op *op, const struct mge_cpu_conv *cv, const struct bufs *B)
{
    call(op, cv, B);
    int reps = 1;
    for (;;) {
        double t0 = now();
        for (int r = 0; r < reps; r++)
            call(op, cv, B);
        if (now() - t0 > 0.03)
            break;
        reps *= 2;
    }
    double ms[9];
    for (int i = 0; i < 9; i++) {
        double t0 = now();
        for (int r = 0; r < reps; r++)
            call(op, cv, B);
        ms[i] = (now() - t0) * 1e3 / reps;
    }
    qsort(ms, 9, sizeof(ms[0]), cmp_double);
    return ms[4];
}

static float *rnd(size_t n)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = (float)rand() / RAND_MAX - 0.5f;
    return p;
}

/*
 * The weight gradient alone of ResNet-20's stride-1 3x3 convs: direct, Winograd F(2x2, 3x3) and
 * F(4x4, 3x3) (conv_winograd4_dw.c), each called directly, and which one "auto" picks
 */
static void bench_winograd_dw(const struct shape *shapes, size_t nshapes, int N, int t)
{
    static const char *const names[DW_KINDS] = {"direct", "wino2x2", "wino4x4"};
    printf("%-26s %-4s %3s", "weight gradient alone", "pass", "thr");
    for (int k = 0; k < DW_KINDS; k++)
        printf(" %10s", names[k]);
    printf(" %10s\n", "auto picks");
    double total[DW_KINDS] = {0};
    for (size_t i = 0; i < nshapes; i++) {
        const struct shape *s = &shapes[i];
        struct mge_cpu_conv cv = {N,    s->C,      s->H,   s->W, s->K, s->R,
                                  s->S, s->stride, s->pad, 0,    0,    0};
        if (mge_cpu_conv_init(&cv) != 0 || !mge__conv_winograd_ok(&cv) || s->C < 16)
            continue;
        size_t nx = (size_t)N * s->C * s->H * s->W, nw = (size_t)s->K * s->C * 9;
        size_t ny = (size_t)N * s->K * cv.P * cv.Q;
        size_t sb = mge__conv_scratch_bytes_with(MGE__CONV_DIRECT, &cv);
        size_t s2 = mge__conv_winograd_scratch_bytes(&cv),
               s4 = mge__conv_winograd4_dw_scratch_bytes(&cv);
        sb = s2 > sb ? s2 : sb;
        sb = s4 > sb ? s4 : sb;
        struct bufs B = {rnd(nx), rnd(nw), NULL, NULL, rnd(ny), NULL, rnd(nw), NULL, malloc(sb)};
        printf("%-26s %-4s %3d", s->name, "dw", t);
        for (int k = 0; k < DW_KINDS; k++) {
            struct op op = {MGE__CONV_AUTO, 1, 0, (enum dw_kind)k};
            double ms = measure(&op, &cv, &B);
            total[k] += ms * s->count;
            printf(" %10.3f", ms);
        }
        printf(" %10s\n", mge__conv_winograd_dw_is_f4(&cv) ? "wino4x4" : "wino2x2");
        free(B.x), free(B.w), free(B.dy), free(B.dw), free(B.scratch);
    }
    printf("%-26s %-4s %3d", "their dw per step", "dw", t);
    for (int k = 0; k < DW_KINDS; k++)
        printf(" %10.3f", total[k]);
    printf("\n");
}

/*
 * ResNet-20's batch norms (training): ms per forward and backward call, one per stage shape;
 * then a batch norm and the ReLU after it, as the two ops (the ReLU in place, as the planner
 * runs it) and fused (what autodiff makes of them)
 */
static void bench_batchnorm(int N)
{
    static const int stages[3][2] = {{16, 28 * 28}, {32, 14 * 14}, {64, 7 * 7}};
    for (int i = 0; i < 3; i++) {
        int C = stages[i][0], HW = stages[i][1];
        size_t n = (size_t)N * C * HW;
        float *x = rnd(n), *y = rnd(n), *dy = rnd(n), *dx = rnd(n), *w = rnd(C), *b = rnd(C);
        float *dr = rnd(n), *rm = rnd(C), *rv = rnd(C), *m = rnd(C), *rs = rnd(C), *dw = rnd(C),
              *db = rnd(C);
        for (int c = 0; c < C; c++)
            rv[c] = 1.0f;
        double best[6] = {1e9, 1e9, 1e9, 1e9, 1e9, 1e9};
        for (int r = 0; r < 20; r++) {
            double t[7];
            t[0] = now();
            mge_cpu_batchnorm_forward(y, m, rs, x, w, b, rm, rv, N, C, HW, 1e-5f, 0.1f, 1, 0);
            t[1] = now();
            mge_cpu_batchnorm_backward(dx, dw, db, dy, NULL, x, w, m, rs, N, C, HW, 0);
            t[2] = now();
            mge_cpu_batchnorm_forward(y, m, rs, x, w, b, rm, rv, N, C, HW, 1e-5f, 0.1f, 1, 0);
            mge_cpu_unary_forward(MGE_CPU_RELU, y, y, (int64_t)n);
            t[3] = now();
            mge_cpu_unary_backward(MGE_CPU_RELU, dr, dy, NULL, y, (int64_t)n, 0);
            mge_cpu_batchnorm_backward(dx, dw, db, dr, NULL, x, w, m, rs, N, C, HW, 0);
            t[4] = now();
            mge_cpu_batchnorm_forward(y, m, rs, x, w, b, rm, rv, N, C, HW, 1e-5f, 0.1f, 1, 1);
            t[5] = now();
            mge_cpu_batchnorm_backward(dx, dw, db, dy, y, x, w, m, rs, N, C, HW, 0);
            t[6] = now();
            for (int k = 0; k < 6; k++)
                best[k] = t[k + 1] - t[k] < best[k] ? t[k + 1] - t[k] : best[k];
        }
        printf("batchnorm %2dx%-4d (fastest of 20)  fwd %7.3f  bwd %7.3f ms;  + relu: pair fwd "
               "%7.3f  bwd %7.3f, fused fwd %7.3f  bwd %7.3f ms\n",
               C, HW, best[0] * 1e3, best[1] * 1e3, best[2] * 1e3, best[3] * 1e3, best[4] * 1e3,
               best[5] * 1e3);
        free(x), free(y), free(dy), free(dx), free(w), free(b), free(rm), free(rv), free(m);
        free(rs), free(dw), free(db), free(dr);
    }
}

int main(int argc, char **argv)
{
    int N = argc > 1 ? atoi(argv[1]) : 128;
    int is_resnet = argc > 2 && strcmp(argv[2], "resnet") == 0;
    const struct shape *shapes = is_resnet ? resnet : lenet;
    size_t nshapes =
        is_resnet ? sizeof(resnet) / sizeof(resnet[0]) : sizeof(lenet) / sizeof(lenet[0]);
    int t0 = argc > 3 ? atoi(argv[3]) : 1, t1 = argc > 3 ? t0 : 2;
    if (argc > 4 && strcmp(argv[4], "cpu") == 0)
        g_clock = CLOCK_PROCESS_CPUTIME_ID;
    if (is_resnet && argc > 5 && strcmp(argv[5], "dw") == 0) { /* the weight gradients alone */
        for (int t = t0; t <= t1; t++) {
            mge_cpu_set_threads(t);
            bench_winograd_dw(shapes, nshapes, N, t);
        }
        return 0;
    }
    static const struct column cols[] = {
        {MGE__CONV_IM2COL, 0, "im2col"},  {MGE__CONV_DNNL, 0, "dnnl"},
        {MGE__CONV_DIRECT, 0, "direct"},  {MGE__CONV_WINOGRAD, 2, "wino2"},
        {MGE__CONV_WINOGRAD, 4, "wino4"}, {MGE__CONV_WINOGRAD, 0, "winograd"},
        {MGE__CONV_AUTO, 0, "auto"},
    };
    int nb = (int)(sizeof(cols) / sizeof(cols[0]));
    printf("conv ms per call, batch %d (median of 9, %s clock); default backend: %s\n", N,
           g_clock == CLOCK_MONOTONIC ? "wall" : "CPU", mge_cpu_conv_backend());
    printf("%-26s %-4s %3s", "shape", "pass", "thr");
    for (int b = 0; b < nb; b++)
        printf(" %10s", cols[b].name);
    printf("\n");
    double total[2][8] = {{0}};
    for (int t = t0; t <= t1; t++) {
        mge_cpu_set_threads(t);
        for (size_t i = 0; i < nshapes; i++) {
            const struct shape *s = &shapes[i];
            struct mge_cpu_conv cv = {N,    s->C,      s->H,   s->W, s->K, s->R,
                                      s->S, s->stride, s->pad, 0,    0,    0};
            if (mge_cpu_conv_init(&cv) != 0)
                return 1;
            size_t nx = (size_t)N * s->C * s->H * s->W, nw = (size_t)s->K * s->C * s->R * s->S;
            size_t ny = (size_t)N * s->K * cv.P * cv.Q, sb = 0;
            for (int b = 0; b < nb; b++) {
                size_t z = mge__conv_scratch_bytes_with(cols[b].backend, &cv);
                sb = z > sb ? z : sb;
            }
            struct bufs B = {rnd(nx), rnd(nw), rnd(s->K), rnd(ny),   rnd(ny),
                             rnd(nx), rnd(nw), rnd(s->K), malloc(sb)};
            for (int bwd = 0; bwd <= 1; bwd++) {
                printf("%-26s %-4s %3d", s->name, bwd ? "bwd" : "fwd", t);
                for (int b = 0; b < nb; b++) {
                    struct op op = {cols[b].backend, bwd, s->want_dx, DW_NONE};
                    mge__conv_set_winograd_tile(cols[b].tile);
                    double ms = measure(&op, &cv, &B);
                    mge__conv_set_winograd_tile(0);
                    total[t - 1][b] += ms * s->count;
                    printf(" %10.3f", ms);
                }
                printf("\n");
            }
            free(B.x), free(B.w), free(B.b), free(B.y), free(B.dy), free(B.dx), free(B.dw);
            free(B.db), free(B.scratch);
        }
        printf("%-26s %-4s %3d", is_resnet ? "ResNet-20 convs per step" : "LeNet convs per step",
               "all", t);
        for (int b = 0; b < nb; b++)
            printf(" %10.3f", total[t - 1][b]);
        printf("\n");
        if (is_resnet) {
            bench_winograd_dw(shapes, nshapes, N, t);
            bench_batchnorm(N);
        }
    }
    return 0;
}
