/*
 * bench_qconv.c: the int8 convolution kernel (kernels/cpu/gemm_int8.c) alone on ResNet-8's
 * (width 16, 28x28 input) layer shapes, one thread: microseconds per image per layer, the
 * quantiser of each layer's input separately, and each kernel forced (pixel lanes, channel lanes:
 * "conv us" is the automatic choice; docs/benchmarks.md, int8 inference speed). Times are the
 * thread's CPU time (CLOCK_THREAD_CPUTIME_ID), which a loaded machine's neighbours inflate least.
 * Usage: bench_qconv [REPS] [LAYER]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "kernels/cpu/cpu_quant.h"

struct layer {
    const char *name;
    int C, H, W, N, R, stride, pad;
};

static const struct layer layers[] = {
    {"conv1", 1, 28, 28, 16, 3, 1, 1},           {"layer1.0.conv1/2", 16, 28, 28, 16, 3, 1, 1},
    {"layer2.0.conv1", 16, 28, 28, 32, 3, 2, 1}, {"layer2.0.conv2", 32, 14, 14, 32, 3, 1, 1},
    {"layer2.0.down", 16, 28, 28, 32, 1, 2, 0},  {"layer3.0.conv1", 32, 14, 14, 64, 3, 2, 1},
    {"layer3.0.conv2", 64, 7, 7, 64, 3, 1, 1},   {"layer3.0.down", 32, 14, 14, 64, 1, 2, 0},
};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 2000, only = argc > 2 ? atoi(argv[2]) : -1;
    double total = 0.0, total_q = 0.0;
    srand(1);
    printf("%-18s %9s %9s %8s %9s %9s %9s\n", "layer", "conv us", "quant us", "GMAC/s", "pixels us",
           "chans us", "+codes us");
    for (size_t li = 0; li < sizeof(layers) / sizeof(layers[0]); li++) {
        const struct layer *L = &layers[li];
        if (only >= 0 && (size_t)only != li)
            continue;
        int Hp = L->H + 2 * L->pad, Wp = L->W + 2 * L->pad;
        struct mge_cpu_qconv_shape sh = {L->C,
                                         Hp,
                                         Wp,
                                         L->R,
                                         L->R,
                                         L->stride,
                                         (Hp - L->R) / L->stride + 1,
                                         (Wp - L->R) / L->stride + 1};
        int layout = mge_cpu_qconv_layout(&sh);
        int K = L->C * L->R * L->R, PQ = sh.P * sh.Q;
        float *w = malloc(sizeof(float) * (size_t)L->N * (size_t)K);
        float *x = malloc(sizeof(float) * (size_t)L->C * (size_t)L->H * (size_t)L->W);
        float *y = malloc(sizeof(float) * (size_t)L->N * (size_t)PQ);
        float *bn = malloc(sizeof(float) * 2 * (size_t)L->N);
        size_t codes = (size_t)(L->C + 3) / 4 * 4 * (size_t)Hp * (size_t)Wp + 128;
        uint8_t *a = mge_malloc_aligned(codes), *idx = mge_malloc_aligned(64 * (size_t)K);
        int64_t *roff = malloc(sizeof(int64_t) * (size_t)PQ);
        int32_t *koff = malloc(sizeof(int32_t) * (size_t)K);
        for (int i = 0; i < L->N * K; i++)
            w[i] = (float)(rand() % 255 - 127) / 127.0f;
        for (int i = 0; i < L->C * L->H * L->W; i++)
            x[i] = (float)(rand() % 256) / 64.0f;
        for (int i = 0; i < 2 * L->N; i++)
            bn[i] = 0.5f;
        struct mge_cpu_qweight qw;
        struct mge_cpu_qaffine qa;
        mge_cpu_qaffine_from_range(0.0f, 4.0f, &qa);
        if (mge_cpu_qweight_pack_conv(&qw, w, L->N, L->C, L->R, L->R, layout) != 0)
            return 1;
        mge_cpu_qconv_tables(&sh, layout, roff, koff, idx);
        struct mge_cpu_qpost post = {.mul = bn, .add = bn + L->N};
        /* best of 5 rounds, the kernels alternating within each round */
        double tq = 1e9, tk[3] = {1e9, 1e9, 1e9};
        for (int round = 0; round < 5; round++) {
            double t0 = now();
            for (int r = 0; r < reps; r++) {
                if (layout == MGE_CPU_QCONV_CHANS)
                    mge_cpu_quantize_u8_padded_quads(a, x, L->C, L->H, L->W, L->pad, &qa);
                else
                    mge_cpu_quantize_u8_padded(a, x, L->C, L->H, L->W, L->pad, &qa);
            }
            double t1 = now();
            tq = (t1 - t0) / reps < tq ? (t1 - t0) / reps : tq;
            for (int kern = MGE_CPU_QCONV_AUTO; kern <= MGE_CPU_QCONV_CHANNELS; kern++) {
                mge_cpu_qconv_force(kern);
                t0 = now();
                for (int r = 0; r < reps; r++)
                    mge_cpu_qconv(&qw, &sh, a, roff, koff, idx, &qa, NULL, &post, 1, y);
                t1 = now();
                tk[kern] = (t1 - t0) / reps < tk[kern] ? (t1 - t0) / reps : tk[kern];
            }
            mge_cpu_qconv_force(MGE_CPU_QCONV_AUTO);
        }
        /* the automatic choice again, also writing a next 3x3 convolution's codes (channel
         * quads, pad 1) and leaving y unwritten */
        size_t cbytes = (size_t)(L->N + 3) / 4 * 4 * (size_t)(sh.P + 2) * (size_t)(sh.Q + 2) + 128;
        uint8_t *next = mge_malloc_aligned(cbytes);
        struct mge_cpu_qpost chained = post;
        chained.next[0] = (struct mge_cpu_qcodes){.codes = next, .qc = &qa, .pad = 1, .quads = 1};
        chained.skip_y = 1;
        double tcodes = 1e9;
        for (int round = 0; round < 5; round++) {
            double t0 = now();
            for (int r = 0; r < reps; r++)
                mge_cpu_qconv(&qw, &sh, a, roff, koff, idx, &qa, NULL, &chained, 1, y);
            double t1 = now();
            tcodes = (t1 - t0) / reps < tcodes ? (t1 - t0) / reps : tcodes;
        }
        mge_free_aligned(next);
        double tc = tk[MGE_CPU_QCONV_AUTO];
        printf("%-18s %9.2f %9.2f %8.1f %9.2f %9.2f %9.2f  layout %d\n", L->name, 1e6 * tc,
               1e6 * tq, (double)PQ * L->N * K / tc * 1e-9, 1e6 * tk[MGE_CPU_QCONV_PIXELS],
               1e6 * tk[MGE_CPU_QCONV_CHANNELS], 1e6 * tcodes, layout);
        int times = li == 1 ? 2 : 1;
        total += times * tc;
        total_q += times * tq;
        mge_cpu_qweight_fini(&qw);
        free(w), free(x), free(y), free(bn), free(roff), free(koff);
        mge_free_aligned(a), mge_free_aligned(idx);
    }
    printf("%-18s %9.2f %9.2f  (%.0f images/s over the convs)\n", "total", 1e6 * total,
           1e6 * total_q, 1.0 / (total + total_q));
    return 0;
}
