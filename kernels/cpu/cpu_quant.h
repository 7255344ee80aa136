/*
 * cpu_quant.h: int8 quantisation kernels: the quantisers that the fake-quantise op (training)
 * and the int8 path (inference) share, so both round alike, and the u8 x s8 GEMM with int32
 * sums and a fused dequantise + bias + relu epilogue (kernels/cpu/gemm_int8.c).
 *
 * Activations: per-tensor affine, stored as uint8 with a zero point: q = clamp(rint(x * inv) +
 * zp, 0, 255) stands for (q - zp) * scale (int8 affine shifted by 128, what VNNI multiplies).
 * Weights: per output channel symmetric int8: q = clamp(rint(w * inv[n]), -127, 127) stands for
 * q * scale[n], scale[n] = max |w[n, :]| / 127.
 * Threads: the GEMM uses OpenMP with mge_cpu_threads() threads; the rest is single-threaded.
 */
#ifndef MGE_KERNELS_CPU_QUANT_H
#define MGE_KERNELS_CPU_QUANT_H

#include <math.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MGE_CPU_QW_MAX 127 /* weights: [-127, 127] (no -128: symmetric) */

/* Per-tensor affine parameters of an activation (uint8 codes). */
struct mge_cpu_qaffine {
    float scale;  /* > 0 */
    float inv;    /* 1 / scale, the multiplier both paths round with */
    int32_t zp;   /* zero point in [0, 255] */
    float lo, hi; /* what codes 0 and 255 stand for: (0 - zp) * scale, (255 - zp) * scale */
};

/* Parameters for the observed range [@lo, @hi] (widened to hold 0, so 0 is exact). */
void mge_cpu_qaffine_from_range(float lo, float hi, struct mge_cpu_qaffine *q);

/* The uint8 code of @x (the one rounding rule of both paths). */
static inline int32_t mge_cpu_quant_u8(float x, const struct mge_cpu_qaffine *q)
{
    float r = nearbyintf(x * q->inv);
    /* compare in float first: a huge or NaN x must not overflow the int conversion */
    if (!(r > -512.0f))
        r = -512.0f;
    if (r > 512.0f)
        r = 512.0f;
    int32_t v = (int32_t)r + q->zp;
    return v < 0 ? 0 : v > 255 ? 255 : v;
}

/* y = (code(x) - zp) * scale, elementwise over @n values (in place allowed). */
void mge_cpu_fake_quant_affine(float *y, const float *x, int64_t n,
                               const struct mge_cpu_qaffine *q);
/*
 * Straight-through estimator: dx (+)= dy where lo <= x <= hi (the code is not clamped), else 0
 * (@acc: add into dx).
 */
void mge_cpu_fake_quant_affine_backward(float *dx, const float *dy, const float *x, int64_t n,
                                        const struct mge_cpu_qaffine *q, int acc);

/* @rows rows of @cols values of @x (row stride @ldx) -> codes, row stride @ldq (>= cols; the
 * columns past @cols get 0). */
void mge_cpu_quantize_u8(uint8_t *out, int64_t ldq, const float *x, int64_t ldx, int64_t rows,
                         int64_t cols, const struct mge_cpu_qaffine *q);

/* An image's @C planes (@H, @W) of @x -> codes (C, H + 2 @pad, W + 2 @pad) bordered by @pad
 * codes of 0 (the zero point): a convolution's padded input. */
void mge_cpu_quantize_u8_padded(uint8_t *out, const float *x, int64_t C, int64_t H, int64_t W,
                                int pad, const struct mge_cpu_qaffine *q);

/* The same codes interleaved by 4 channels, (ceil(C / 4), H + 2 @pad, W + 2 @pad, 4), the
 * channels past C and the border the zero point: MGE_CPU_QCONV_CHANS's input. */
void mge_cpu_quantize_u8_padded_quads(uint8_t *out, const float *x, int64_t C, int64_t H, int64_t W,
                                      int pad, const struct mge_cpu_qaffine *q);

/* Per-channel symmetric scales of @w (N, K): scale[n] = max|w[n,:]| / 127 (1 where the row is
 * all zero), inv[n] = 1 / scale[n]. */
void mge_cpu_qweight_scales(float *scale, float *inv, const float *w, int64_t N, int64_t K);
/* The int8 code of weight @x with multiplier @inv. */
static inline int32_t mge_cpu_quant_s8(float x, float inv)
{
    float r = nearbyintf(x * inv);
    if (!(r > -(float)MGE_CPU_QW_MAX))
        r = -(float)MGE_CPU_QW_MAX;
    if (r > (float)MGE_CPU_QW_MAX)
        r = (float)MGE_CPU_QW_MAX;
    return (int32_t)r;
}
/* y = code(w) * scale[n] for w (N, K), per row n (the fake-quantised weight). */
void mge_cpu_fake_quant_weight(float *y, const float *w, int64_t N, int64_t K);

/* Weights (N, K) quantised and packed for mge_cpu_gemm_u8s8(). */
struct mge_cpu_qweight {
    int N, K;        /* logical shape */
    int Np, Kp;      /* N rounded up to 16, K to 4 */
    int8_t *packed;  /* (Np / 16, Kp / 4, 16, 4) codes, zero in the padding */
    int32_t *colsum; /* (N) sum over k of the codes of row n */
    float *scale;    /* (N) per-channel scales */
    int layout;      /* convolutions: enum mge_cpu_qconv_layout of the k-quads */
};

/* Quantise and pack @w (N, K). MGE_OK, MGE_INVAL (bad shape), MGE_NOMEM (@qw is zeroed). */
int mge_cpu_qweight_pack(struct mge_cpu_qweight *qw, const float *w, int N, int K);
/* The geometry of an int8 convolution over one image of codes zero-padded to (C, Hp, Wp). */
struct mge_cpu_qconv_shape {
    int C, Hp, Wp; /* the padded input */
    int R, S, stride;
    int P, Q; /* the output: (Hp - R) / stride + 1, (Wp - S) / stride + 1 */
};

/* What the 4 codes of a convolution's k-quad are (one layout per packed weight). */
enum mge_cpu_qconv_layout {
    MGE_CPU_QCONV_ROWS,  /* 4 neighbouring taps of a filter row, rows padded to 4 (every path) */
    MGE_CPU_QCONV_TAPS,  /* 4 taps of a channel in (r, s) order, the last quad padded (5x5: 7) */
    MGE_CPU_QCONV_CHANS, /* one tap of 4 channels: codes interleaved (C / 4, Hp, Wp, 4) */
};

/*
 * A convolution's weights (N, C, R, S) for mge_cpu_qconv() with k-quads in @layout, padding
 * quads with zero weights. Scales are per output channel, as the plain pack's (zero weights
 * change no maximum). Returns as mge_cpu_qweight_pack().
 */
int mge_cpu_qweight_pack_conv(struct mge_cpu_qweight *qw, const float *w, int N, int C, int R,
                              int S, int layout);
/* The layout with the fewest k-quads for @sh that the kernels here run fast (taps and channel
 * quads need AVX-512 VNNI and VBMI and a span the pixel-lane kernel can load). */
int mge_cpu_qconv_layout(const struct mge_cpu_qconv_shape *sh);
/* Quads per group (an input channel; 4 of them in MGE_CPU_QCONV_CHANS) in @layout. */
int mge_cpu_qconv_quads(const struct mge_cpu_qconv_shape *sh, int layout);
/*
 * The tables mge_cpu_qconv() reads for @layout: @roff (P * Q) each output pixel's first code,
 * @koff (groups * quads, at most C R S) each quad's first code from there, @idx (quads, 64;
 * 64-byte aligned) per quad of a group the byte of tap j of lane l of a pixel vector (4 l + j)
 * from lane 0's first tap.
 */
void mge_cpu_qconv_tables(const struct mge_cpu_qconv_shape *sh, int layout, int64_t *roff,
                          int32_t *koff, uint8_t *idx);
/* Free what pack allocated and zero @qw; a zeroed @qw does nothing. */
void mge_cpu_qweight_fini(struct mge_cpu_qweight *qw);

/*
 * y[m * rs + n * cs] = act(float(acc[m][n] - zp * colsum[n]) * (scale_x * scale[n]) + bias[n])
 * with acc[m][n] = sum_k a[m][k] * code[n][k] in int32 (exact), for m < @M, n < qw->N.
 * @a: (M, qw->Kp) uint8 codes, row stride @lda (the columns past K are ignored by zero weights).
 * @bias: (N) or NULL; @relu: max(0, .) after the bias. AVX-512 VNNI when the CPU has it
 * (mge_cpu_has_vnni()), else a portable loop; the two give identical results.
 */
void mge_cpu_gemm_u8s8(const struct mge_cpu_qweight *qw, int M, const uint8_t *a, int64_t lda,
                       const struct mge_cpu_qaffine *qx, const float *bias, int relu, float *y,
                       int64_t rs, int64_t cs);

/*
 * The same GEMM with A addressed implicitly (a convolution without im2col): row m of A starts at
 * @a + @roff[m] and its k-quad q (4 codes) is at that + @koff[q]; single-threaded (callers run
 * images in parallel). Bytes read past a row's last real code meet zero weights.
 */
void mge_cpu_gemm_u8s8_gather(const struct mge_cpu_qweight *qw, int M, const uint8_t *a,
                              const int64_t *roff, const int32_t *koff,
                              const struct mge_cpu_qaffine *qx, const float *bias, int relu,
                              float *y, int64_t rs, int64_t cs);

/* The input codes of an int8 convolution that reads another's output, written by that one:
 * what the consumer's quantiser would write (mge_cpu_quantize_u8_padded(), or its _quads form
 * when @quads): (N or ceil(N / 4) 4, P + 2 @pad, Q + 2 @pad) codes under @qc, the border the zero
 * point, then 128 bytes of 0. */
struct mge_cpu_qcodes {
    uint8_t *codes; /* NULL: none */
    const struct mge_cpu_qaffine *qc;
    int pad, quads;
};

#define MGE_CPU_QNEXT 2 /* consumers whose codes one convolution writes, at most */

/* What an int8 convolution does to its outputs after the GEMM's epilogue (bias included), in
 * this order, before @relu: a folded batch norm, then a residual; and after @relu, the codes of
 * the int8 convolutions that read them. */
struct mge_cpu_qpost {
    const float *mul, *add; /* (N) each, or NULL: y = y * mul[n] + add[n] (two roundings) */
    const float *res;       /* (N, P, Q) or NULL: y = y + res (a residual connection) */
    struct mge_cpu_qcodes next[MGE_CPU_QNEXT];
    int skip_y; /* with codes: y itself may be left unwritten (no one else reads it) */
};

/*
 * An int8 convolution of one image @a (codes, @sh) into its NCHW output @y (N, P, Q) with weights
 * @qw packed by mge_cpu_qweight_pack_conv() and the tables of mge_cpu_qconv_tables() for its
 * layout: the GEMM epilogue of mge_cpu_gemm_u8s8() per output, then @post (NULL: none), then
 * @relu, bit for bit the same numbers on every path. With AVX-512 VNNI and VBMI and a stride of
 * at most 4, output pixels are the vector lanes (no transposed stores, @post in registers), or,
 * where that leaves many lanes empty (maps of 7x7, strided rows), 16 output channels are the
 * lanes (rows and channel-quad layouts; @post in registers, scattered stores); @a needs 128
 * bytes of slack past its last code.
 */
void mge_cpu_qconv(const struct mge_cpu_qweight *qw, const struct mge_cpu_qconv_shape *sh,
                   const uint8_t *a, const int64_t *roff, const int32_t *koff, const uint8_t *idx,
                   const struct mge_cpu_qaffine *qx, const float *bias,
                   const struct mge_cpu_qpost *post, int relu, float *y);

/* Which kernel mge_cpu_qconv() runs with AVX-512 VNNI (results are the same bit for bit). */
enum mge_cpu_qconv_kernel {
    MGE_CPU_QCONV_AUTO,     /* whichever fills more of its lanes on the shape */
    MGE_CPU_QCONV_PIXELS,   /* output pixels as lanes (needs VBMI and a loadable window) */
    MGE_CPU_QCONV_CHANNELS, /* output channels as lanes (rows and channel-quad layouts) */
};
/* Tests and benchmarks: run @kernel where it applies (else the automatic choice). Not
 * thread-safe against running convolutions. */
void mge_cpu_qconv_force(int kernel);

/* Whether the int8 GEMM uses AVX-512 VNNI here (MGE_CPU_VNNI=off in the environment: never). */
int mge_cpu_has_vnni(void);
/* Tests: use the portable path (@on 0) or VNNI again where the CPU has it (@on 1). Not
 * thread-safe against running GEMMs. */
void mge_cpu_set_vnni(int on);

#ifdef __cplusplus
}
#endif
#endif
