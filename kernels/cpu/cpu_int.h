/* cpu_int.h: internals shared inside kernels/cpu and with its benchmark (not for other modules). */
#ifndef MGE_KERNELS_CPU_INT_H
#define MGE_KERNELS_CPU_INT_H

#include "kernels/cpu/cpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Run-time ISA dispatch. The build targets a portable baseline (plain x86-64, no -march=native:
 * a binary must run on every node of a cluster); the vectorised kernels are compiled three
 * times by GCC's target_clones (AVX-512 "x86-64-v4", AVX2+FMA "x86-64-v3", baseline) and the
 * loader picks one per function from the CPU's cpuid when the library is loaded (an ifunc);
 * OpenMP bodies inside are cloned with their function. MGE_NO_CLONES (set by `make
 * MARCH=native`, or a compiler without target_clones) builds one version for the build CPU.
 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MGE_NO_CLONES)
#define MGE__CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MGE__CPU_CLONES
#endif

/* Loops up to this many elements run on one thread: a fork/join costs more than it saves there,
 * and far more when another process holds a core (a descheduled thread stalls the barrier). */
#define MGE__PAR_MIN 65536

/*
 * expf for the kernels' inner loops: Cephes' degree-6 polynomial after reducing by ln 2, within
 * ~2 ulp of expf; branch-free (the clamp of x to [-87, 87] works on the bits, since GCC does not
 * if-convert float compares), so loops calling it vectorise, where glibc's expf is a call per
 * element. e^-87 and e^87 stand for anything beyond them.
 */
static inline float mge__expf(float x)
{
    union {
        float f;
        uint32_t u;
        int32_t i;
    } v = {.f = x}, sc;
    uint32_t mag = v.u & 0x7fffffffu, lim = 0x42ae0000u; /* 87.0f */
    v.u = (v.u & 0x80000000u) | (mag < lim ? mag : lim);
    x = v.f;
    /* n = round(x / ln 2) by truncating a positive value (x / ln 2 > -126) */
    float n = (float)(int32_t)(x * 1.44269504088896341f + 128.5f) - 128.0f;
    float r = x - n * 0.693359375f - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    sc.i = ((int32_t)n + 127) * (1 << 23);
    return p * sc.f;
}

/* tanhf from mge__expf: 1 - 2 / (e^2x + 1); absolute error ~1e-7, vectorises. */
static inline float mge__tanhf(float x)
{
    return 1.0f - 2.0f / (mge__expf(2.0f * x) + 1.0f);
}

/* GEMM backends; MGE__GEMM_AUTO picks one of the others by shape (see gemm.c). */
enum mge__gemm_backend {
    MGE__GEMM_AUTO,
    MGE__GEMM_DNNL,     /* "dnnl": one block of C per OpenMP thread, dnnl_sgemm single-threaded */
    MGE__GEMM_DNNL_OMP, /* "dnnl-omp": dnnl_sgemm with oneDNN's own OpenMP threading */
    MGE__GEMM_OPENBLAS, /* "openblas": cblas_sgemm, OpenBLAS's own threads */
    MGE__GEMM_REF,      /* "ref": mge_cpu_sgemm_ref */
    MGE__GEMM_COUNT
};

/* Name of @b ("auto", "dnnl", ...), static storage. */
const char *mge__gemm_backend_name(int b);

/* mge_cpu_sgemm on a chosen backend (benchmarks, tests). */
void mge__cpu_sgemm_with(int backend, int ta, int tb, int M, int N, int K, float alpha,
                         const float *A, int lda, const float *B, int ldb, float beta, float *C,
                         int ldc);

/* mge_cpu_gemm_bf16 through oneDNN (@emulate 0; emulates still if no primitive can be made)
 * or emulated (@emulate 1), for tests and benchmarks. */
void mge__cpu_gemm_bf16_with(int emulate, int ta, int tb, int M, int N, int K, float alpha,
                             const float *A, int lda, const float *B, int ldb, float beta, float *C,
                             int ldc);

/* mge_cpu_f32_to_bf16 over mge_cpu_threads() threads when @n is large (one outside a
 * parallel region). */
void mge__cpu_f32_to_bf16_par(uint16_t *out, const float *inp, int64_t n);

/* Conv backends; MGE__CONV_AUTO is the default ($MGE_CONV overrides it, see conv.c). */
enum mge__conv_backend {
    MGE__CONV_AUTO,
    MGE__CONV_IM2COL, /* "im2col": per-image im2col + mge_cpu_sgemm; the others' fallback */
    MGE__CONV_DNNL,   /* "dnnl": oneDNN convolution primitives on plain NCHW (conv_dnnl.c) */
    MGE__CONV_DIRECT, /* "direct": vectorised direct conv, stride 1 (conv_direct.c); default */
    /* "winograd": F(4x4, 3x3) or F(2x2, 3x3) forward and dinp, F(2x2) dw, of 3x3 stride-1 pad-1
     * convs (conv_winograd.c), every other conv as "auto" does them; "auto" takes it where it wins
     * (conv.c) */
    MGE__CONV_WINOGRAD,
    MGE__CONV_COUNT
};

const char *mge__conv_backend_name(int b);
/* mge_cpu_conv_* on a chosen backend (benchmarks, tests). A backend that cannot do @cv falls
 * back to im2col, and the scratch size always has room for that. */
size_t mge__conv_scratch_bytes_with(int backend, const struct mge_cpu_conv *cv);
void mge__cpu_conv2d_forward_with(int backend, const struct mge_cpu_conv *cv, float *out,
                                  const float *inp, const float *w, const float *bias,
                                  void *scratch);
void mge__cpu_conv2d_backward_with(int backend, const struct mge_cpu_conv *cv, float *dinp,
                                   float *dw, float *dbias, const float *dout, const float *inp,
                                   const float *w, void *scratch, int acc);

/* db[k] (+)= sum of dout (N, K, P, Q) over n, p, q, image by image in one thread (the oneDNN
 * adapters' dbias, the same bits whichever passes run). */
void mge__conv_bias_grad(const struct mge_cpu_conv *cv, float *db, const float *dout, int acc);

/*
 * conv_dnnl.c. Primitives are made on the first call for a geometry (cv including slots) and
 * cached. Scratch bytes: 0 when oneDNN cannot do @cv. forward/backward: 0, or -1 with the outputs
 * left for the caller to compute another way (nothing was added into them). Thread: any; calls on
 * one geometry are serialised.
 */
size_t mge__conv_dnnl_scratch_bytes(const struct mge_cpu_conv *cv);
int mge__conv_dnnl_forward(const struct mge_cpu_conv *cv, float *out, const float *inp,
                           const float *w, const float *bias, void *scratch);
int mge__conv_dnnl_backward(const struct mge_cpu_conv *cv, float *dinp, float *dw, float *dbias,
                            const float *dout, const float *inp, const float *w, void *scratch,
                            int acc);

/*
 * conv_bf16.c: the same contract for mge_cpu_conv2d_*_bf16 (oneDNN in its own layouts,
 * reorders in and out); 0 bytes / -1 also where the CPU has no AVX-512 BF16.
 */
/* Whether a bf16 conv of this geometry still runs in fp32 (few channels; conv.c says why). */
int mge__conv_bf16_is_fp32(const struct mge_cpu_conv *cv);
size_t mge__conv_bf16_scratch_bytes(const struct mge_cpu_conv *cv);
int mge__conv_bf16_forward(const struct mge_cpu_conv *cv, float *out, const float *inp,
                           const float *w, const float *bias, void *scratch);
int mge__conv_bf16_backward(const struct mge_cpu_conv *cv, float *dinp, float *dw, float *dbias,
                            const float *dout, const float *inp, const float *w, void *scratch,
                            int acc);

/*
 * conv_direct.c: stride 1, S <= 7, pad < R and pad < S only. Scratch bytes: 0 when it cannot do
 * @cv; forward/backward: 0, or -1 (not this shape) with the outputs untouched.
 */
size_t mge__conv_direct_scratch_bytes(const struct mge_cpu_conv *cv);
/* Whether direct beats im2col on every pass of @cv although its rows are narrow (3x3 convs whose
 * dw puts output channels in vector lanes, see conv_direct.c) */
int mge__conv_direct_is_narrow_ok(const struct mge_cpu_conv *cv);
int mge__conv_direct_forward(const struct mge_cpu_conv *cv, float *out, const float *inp,
                             const float *w, const float *bias, void *scratch);
int mge__conv_direct_backward(const struct mge_cpu_conv *cv, float *dinp, float *dw, float *dbias,
                              const float *dout, const float *inp, const float *w, void *scratch,
                              int acc);

/* conv.c, for the conv backends: how many per-thread slots a call over @N images uses (the
 * thread count, at most @slots and @N), and one image's dbias sums (db_part[k] += sum of dy's
 * plane k, PQ floats, in order) */
int mge__conv_slot_threads(int slots, int N);
void mge__conv_dbias_image(float *db_part, const float *dy, int K, size_t PQ);

/*
 * conv_stride2.c: stride 2, R, S <= 3, pad < R and pad < S only. Scratch bytes: 0 when it
 * cannot do @cv. forward: out = conv + bias (may be NULL); backward: dinp, dw, dbias (+)= (any
 * may be NULL). Both return 0, or -1 (not this shape) with the outputs untouched. dw and dbias
 * depend on the thread count only. Thread: any, outside a parallel region (they fork their own).
 */
size_t mge__conv_stride2_scratch_bytes(const struct mge_cpu_conv *cv);
int mge__conv_stride2_forward(const struct mge_cpu_conv *cv, float *out, const float *inp,
                              const float *w, const float *bias, void *scratch);
int mge__conv_stride2_backward(const struct mge_cpu_conv *cv, float *dinp, float *dw, float *dbias,
                               const float *dout, const float *inp, const float *w, void *scratch,
                               int acc);

/*
 * conv_winograd.c: Winograd F(2x2, 3x3) and F(4x4, 3x3), 3x3 stride-1 pad-1 convs only
 * (mge__conv_winograd_ok). Scratch bytes: 0 when it cannot do @cv, else room for either tile.
 * forward and backward_data run F(4x4, 3x3) tiles when @m is 4, F(2x2, 3x3) ones otherwise
 * (F(4x4) rounds ~10x more: see conv_winograd.c); the weight gradient is F(2x2)'s.
 * forward: out = conv + bias (may be NULL);
 * backward_data: dinp (+)= conv^T(dout, w) (+ when @acc); backward_weights: dw (+)= the weight
 * gradient (dbias is left to the other backends). All return 0, or -1 (not
 * this shape) with the outputs untouched. forward and backward_data: the same bits at any
 * thread count; backward_weights: the same bits for the same thread count (per-thread partials
 * added in thread order). Thread: any, outside a parallel region (they fork their own).
 */
int mge__conv_winograd_ok(const struct mge_cpu_conv *cv);
size_t mge__conv_winograd_scratch_bytes(const struct mge_cpu_conv *cv);
int mge__conv_winograd_forward(const struct mge_cpu_conv *cv, int m, float *out, const float *inp,
                               const float *w, const float *bias, void *scratch);
int mge__conv_winograd_backward_data(const struct mge_cpu_conv *cv, int m, float *dinp,
                                     const float *dout, const float *w, void *scratch, int acc);
int mge__conv_winograd_backward_weights(const struct mge_cpu_conv *cv, float *dw, const float *dout,
                                        const float *inp, void *scratch, int acc);
/* Which tile the Winograd forward and data gradient use (tests, benchmarks): 2 for F(2x2), 4 for
 * F(4x4), 0 to let conv.c choose per shape (the default). Thread: between calls only. */
void mge__conv_set_winograd_tile(int m);

#ifdef __cplusplus
}
#endif
#endif
