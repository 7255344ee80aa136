/*
 * cpu.h: the CPU kernels. Plain functions on raw float pointers and ints, no engine types, so
 * they can be tested and benchmarked alone. Row-major, contiguous, images NCHW, conv weights
 * KCRS. Every *_backward that takes @acc adds into its output when @acc is non-zero and
 * overwrites it otherwise. Outputs never alias inputs unless a comment says so.
 * Threads: kernels use OpenMP (or the GEMM library's pool) with mge_cpu_threads() threads.
 */
#ifndef MGE_KERNELS_CPU_H
#define MGE_KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- threads ---------------------------------------------------------------------------- */
/* Set the thread count for all kernels (OpenMP and GEMM library). n <= 0: $OMP_NUM_THREADS or cores. */
void mge_cpu_set_threads(int n);
int mge_cpu_threads(void);
/*
 * Override mge_cpu_threads() (and OpenMP's thread count for regions this thread starts) in the
 * calling thread only; n <= 0 drops the override. Kernels size their OpenMP teams and per-thread
 * scratch from mge_cpu_threads(), so a graph planned and run under an override of 1 is
 * single-threaded and holds scratch for one thread.
 */
void mge_cpu_set_local_threads(int n);
/*
 * Call @fn(@arg, t) for every t in [0, @n) at once, one OpenMP thread each (fewer threads
 * when OpenMP gives a smaller team: each then calls several t in turn), every one of them under
 * mge_cpu_set_local_threads(1) (kernels inside run single-threaded; nested OpenMP regions have a
 * team of one) with the caller's denormal mode; OpenBLAS is held at one thread meanwhile
 * (its thread count is global). Returns when all have returned. Thread: @fn must not share
 * writable state between different t without its own synchronisation.
 */
void mge_cpu_run_split(int n, void (*fn)(void *arg, int t), void *arg);
/*
 * Flush denormal floats to zero (on != 0) in the calling thread and every OpenMP thread.
 * Gradients that shrink through deep networks reach the denormal range, where x86 arithmetic
 * is ~100x slower (a 128-layer MLP step took 9 s instead of 1). mge_cpu_set_threads() turns it
 * on unless MGE_DENORMALS=keep. Threads the caller creates itself must call it too.
 */
void mge_cpu_flush_denormals(int on);

/*
 * The instruction set the vectorised kernels run with on this CPU, as the dispatch picks it
 * (see cpu_int.h): "x86-64-v4" (AVX-512), "x86-64-v3" (AVX2, FMA), "baseline", or "native"
 * for a build made for one CPU (make MARCH=native). Static storage.
 */
const char *mge_cpu_isa(void);

/* ---- GEMM ------------------------------------------------------------------------------- */
/*
 * C = alpha * op(A) @ op(B) + beta * C, row-major; op(X) = X^T when tX != 0.
 * op(A) is M x K, op(B) is K x N, C is M x N. Uses the fastest backend measured here
 * (see tests/bench/bench_gemm.c); mge_cpu_sgemm_ref is the plain reference for tests.
 */
void mge_cpu_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc);
void mge_cpu_sgemm_ref(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc);
/* Name of the GEMM backend in use ("dnnl", "openblas", "ref"); $MGE_GEMM overrides the choice
 * ("dnnl-omp" too: oneDNN's own threading, slower here). Read once, at the first GEMM. */
const char *mge_cpu_sgemm_backend(void);

/* ---- bf16 mixed precision (gemm_bf16.c) ---------------------------------------------------- */
/*
 * Whether this CPU has AVX-512 BF16 (vdpbf16ps, cpuid), the instructions that make bf16 GEMMs
 * faster than fp32 ones. MGE_CPU_BF16=off in the environment makes it report 0 (to test the
 * fallback on any machine). Read once.
 */
int mge_cpu_has_bf16(void);
/* bfloat16 as its 16 bits: fp32 -> bf16 rounds to nearest, ties to even (Inf stays Inf, NaN
 * stays NaN, values past the largest bf16 become Inf); bf16 -> fp32 is exact. */
void mge_cpu_f32_to_bf16(uint16_t *out, const float *inp, int64_t n);
void mge_cpu_bf16_to_f32(float *out, const uint16_t *inp, int64_t n);
/* out[i] = inp[i] rounded to the nearest bf16, held as fp32; out may equal inp. */
void mge_cpu_round_bf16(float *out, const float *inp, int64_t n);
/*
 * mge_cpu_sgemm's contract with A and B rounded to bf16 first; products are summed in fp32.
 * Against the exact product of the fp32 inputs, |C - C_exact| <= (2^-7 + K 2^-23) sum_k |a||b|
 * (alpha 1, beta 0). On a CPU with AVX-512 BF16 it runs oneDNN's bf16 matmul (one block of C
 * per thread, a single-threaded primitive per block shape made on first use; at most one call
 * at a time); elsewhere, or when oneDNN fails, it emulates (rounded copies, then an fp32 GEMM;
 * same rounding of the inputs, no speed-up).
 * Results are a function of the inputs and the thread count. Thread: any.
 */
void mge_cpu_gemm_bf16(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc);

/* ---- elementwise -------------------------------------------------------------------------- */
enum mge_cpu_unary { MGE_CPU_IDENTITY, MGE_CPU_RELU, MGE_CPU_GELU, MGE_CPU_TANH, MGE_CPU_SIGMOID };
enum mge_cpu_binary { MGE_CPU_ADD, MGE_CPU_SUB, MGE_CPU_MUL, MGE_CPU_DIV };

/* out[i] = f(inp[i]); out may equal inp. GELU is the tanh approximation (as GPT-2). */
void mge_cpu_unary_forward(int op, float *out, const float *inp, int64_t n);
/* dinp (+)= dout * f'(x). @inp is the forward input, @out the forward output (either may be
 * used: relu/tanh/sigmoid use @out, gelu uses @inp). */
void mge_cpu_unary_backward(int op, float *dinp, const float *dout, const float *inp,
                            const float *out, int64_t n, int acc);

/* out[r, c] = act(inp[r, c] + bias[c]) for rows x cols; out may equal inp; bias may be NULL. */
void mge_cpu_bias_act_forward(int act, float *out, const float *inp, const float *bias,
                              int64_t rows, int64_t cols);
/* dbias[c] (+)= sum_r dout[r, c]. */
void mge_cpu_bias_backward(float *dbias, const float *dout, int64_t rows, int64_t cols, int acc);

/*
 * Broadcasting binary op: out[idx] = a[idx . astride] op b[idx . bstride] over @shape (ndim <= 6),
 * where a stride of 0 broadcasts that dimension. @out is contiguous of @shape.
 */
void mge_cpu_binary_forward(int op, float *out, const float *a, const int64_t *astride,
                            const float *b, const int64_t *bstride, const int64_t *shape, int ndim);
/*
 * Sum @inp (contiguous, @shape) into @out addressed by @ostride (0 = summed-over dimension):
 * out[idx . ostride] (+)= inp[idx]. This is the backward of broadcasting.
 */
void mge_cpu_sum_to(float *out, const int64_t *ostride, const float *inp, const int64_t *shape,
                    int ndim, int acc);
/* Contiguous helpers (the engine builds mul/div gradients from binary_forward and sum_to). */
void mge_cpu_scale(float *out, const float *inp, float s, int64_t n);   /* out = s * inp */
void mge_cpu_axpy(float *y, const float *x, float a, int64_t n);        /* y += a * x */

/* ---- softmax, losses ------------------------------------------------------------------------ */
/* Row-wise over the last dimension of rows x cols (numerically stable). */
void mge_cpu_softmax_forward(float *out, const float *inp, int64_t rows, int64_t cols);
void mge_cpu_softmax_backward(float *dinp, const float *dout, const float *out, int64_t rows,
                              int64_t cols, int acc);
void mge_cpu_log_softmax_forward(float *out, const float *inp, int64_t rows, int64_t cols);
void mge_cpu_log_softmax_backward(float *dinp, const float *dout, const float *out, int64_t rows,
                                  int64_t cols, int acc);
/*
 * Fused softmax + cross-entropy with integer labels, mean over B rows of V logits.
 * Writes probs (B x V, kept for backward) and returns the mean loss in *loss.
 * Labels outside [0, V) are the caller's bug (checked at load time).
 */
void mge_cpu_softmax_xent_forward(float *loss, float *probs, const float *logits,
                                  const int32_t *labels, int64_t B, int64_t V);
/* dlogits (+)= dloss * (probs - onehot(labels)) / B. */
void mge_cpu_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *labels,
                                   int64_t B, int64_t V, float dloss, int acc);
/*
 * The same with label smoothing @eps in [0, 1) (PyTorch's definition): the target is
 * (1 - eps) on the label plus eps / V on every class, so the row loss is
 * (1 - eps) * -log p[label] + eps * mean_j(-log p[j]), and
 * dlogits (+)= dloss * (probs - target) / B. eps == 0 gives the plain kernels' bits.
 */
void mge_cpu_softmax_xent_smooth_forward(float *loss, float *probs, const float *logits,
                                         const int32_t *labels, int64_t B, int64_t V, float eps);
void mge_cpu_softmax_xent_smooth_backward(float *dlogits, const float *probs, const int32_t *labels,
                                          int64_t B, int64_t V, float dloss, float eps, int acc);
/* Number of rows whose argmax equals the label (accuracy counting). */
int64_t mge_cpu_argmax_correct(const float *logits, const int32_t *labels, int64_t B, int64_t V);

/* ---- reductions, shapes ---------------------------------------------------------------------- */
/* Viewing inp as (outer, len, inner): out[o, i] = scale * sum_l inp[o, l, i]. */
void mge_cpu_reduce_sum(float *out, const float *inp, int64_t outer, int64_t len, int64_t inner,
                        float scale);
/* Backward: dinp[o, l, i] (+)= scale * dout[o, i]. */
void mge_cpu_reduce_sum_backward(float *dinp, const float *dout, int64_t outer, int64_t len,
                                 int64_t inner, float scale, int acc);
/* out = inp with dims permuted: out.shape[d] = shape[perm[d]] (ndim <= 6). */
void mge_cpu_permute(float *out, const float *inp, const int64_t *shape, const int *perm, int ndim);
/* Copy a block along one axis: viewing src as (outer, slen, inner) and dst as (outer, dlen, inner),
 * dst[o, dstart + l, i] (+)= src[o, sstart + l, i] for l < len. Serves concat, slice and both
 * backwards. */
void mge_cpu_copy_axis(float *dst, int64_t dlen, int64_t dstart, const float *src, int64_t slen,
                       int64_t sstart, int64_t len, int64_t outer, int64_t inner, int acc);

/* ---- convolution, pooling ------------------------------------------------------------------ */
struct mge_cpu_conv {
    int N, C, H, W;   /* input */
    int K, R, S;      /* output channels, kernel height, width */
    int stride, pad;  /* same in both dims */
    int P, Q;         /* output height, width: (H + 2 pad - R) / stride + 1 */
    int slots;        /* filled by init: images in flight at once, min(N, mge_cpu_threads()) */
};
/* Fill P, Q and slots from the rest; returns 0, or -1 if the shape is impossible. */
int mge_cpu_conv_init(struct mge_cpu_conv *cv);
/* Scratch bytes each conv call needs (the engine plans it in its arena; may be 0). It is sized
 * for cv->slots, so later calls use at most that many threads; results are bit-identical for
 * equal slots. */
size_t mge_cpu_conv_scratch_bytes(const struct mge_cpu_conv *cv);
/* out (N,K,P,Q) = conv(inp (N,C,H,W), w (K,C,R,S)) + bias (K, may be NULL). */
void mge_cpu_conv2d_forward(const struct mge_cpu_conv *cv, float *out, const float *inp,
                            const float *w, const float *bias, void *scratch);
/* dinp (+)= conv^T(dout, w); dw (+)= corr(inp, dout); dbias (+)= sum dout. Any output may be NULL
 * (not wanted). */
void mge_cpu_conv2d_backward(const struct mge_cpu_conv *cv, float *dinp, float *dw, float *dbias,
                             const float *dout, const float *inp, const float *w, void *scratch,
                             int acc);

/*
 * Mixed precision: the same three with x, w and dout rounded to bf16 and products summed in
 * fp32 (mge_cpu_gemm_bf16's contract; dbias is summed from the fp32 dout), through oneDNN's bf16
 * convolution in its own blocked layouts (reorders in and out, conv_bf16.c) on a CPU with
 * AVX-512 BF16, else through im2col and mge_cpu_gemm_bf16 (emulated). Exception: a conv with
 * at most 8 input and 16 output channels (LeNet's) computes in fp32 here, as the plain ones:
 * oneDNN pads channels to 16 and was slower in bf16 than our fp32 direct kernel; and a strided
 * conv's dw is fp32 (oneDNN's bf16 one was 10-20x slower per FLOP there). A scratch buffer must
 * be sized by mge_cpu_conv_scratch_bytes_bf16.
 */
size_t mge_cpu_conv_scratch_bytes_bf16(const struct mge_cpu_conv *cv);
void mge_cpu_conv2d_forward_bf16(const struct mge_cpu_conv *cv, float *out, const float *inp,
                                 const float *w, const float *bias, void *scratch);
void mge_cpu_conv2d_backward_bf16(const struct mge_cpu_conv *cv, float *dinp, float *dw,
                                  float *dbias, const float *dout, const float *inp, const float *w,
                                  void *scratch, int acc);

/* Name of the conv backend in use ("im2col", "dnnl", "direct", "winograd", or "auto": direct,
 * except im2col for convs of more than 8 input channels and outputs narrower than 16, and
 * Winograd for the forward, dinp and dw of 3x3 stride-1 pad-1 convs of >= 16 channels on maps
 * up to 32x32 unless $MGE_CONV_WINOGRAD=0 (all of it) or $MGE_CONV_WINOGRAD_DW=0 (dw only);
 * the dw is F(4x4, 3x3) where it multiplies less than F(2x2), unless $MGE_CONV_WINOGRAD4_DW=0;
 * the forward and dinp in F(4x4, 3x3) tiles unless $MGE_CONV_WINOGRAD4=0 (F(2x2, 3x3) then);
 * $MGE_CONV overrides the default. Read once, at the first conv call. */
const char *mge_cpu_conv_backend(void);

struct mge_cpu_pool {
    int N, C, H, W;
    int R, S, stride, pad;
    int P, Q;         /* filled by mge_cpu_pool_init */
};
int mge_cpu_pool_init(struct mge_cpu_pool *pl);
void mge_cpu_maxpool_forward(const struct mge_cpu_pool *pl, float *out, const float *inp);
/* Gradient goes to the first maximum of each window (recomputed from inp; no index tensor). */
void mge_cpu_maxpool_backward(const struct mge_cpu_pool *pl, float *dinp, const float *dout,
                              const float *inp, int acc);
/* Average over the window's in-bounds elements (count_include_pad = false). */
void mge_cpu_avgpool_forward(const struct mge_cpu_pool *pl, float *out, const float *inp);
void mge_cpu_avgpool_backward(const struct mge_cpu_pool *pl, float *dinp, const float *dout, int acc);

/* ---- attention ------------------------------------------------------------------------------ */
/* Largest head size (C / NH) the attention kernels take (one accumulator row on the stack). */
#define MGE_CPU_ATTN_MAX_HEAD 128
/*
 * Causal multi-head self-attention, softmax(q k^T / sqrt(hs)) v with key j <= query t, fused:
 * qkv (B, T, 3C) holds q, k, v side by side (nanoGPT's c_attn output), head h in columns
 * [h hs, (h + 1) hs) of each (hs = C / NH <= MGE_CPU_ATTN_MAX_HEAD). Writes out (B, T, C) and
 * the log-sum-exp of each score row, lse (B, NH, T); no T x T matrix is stored.
 */
void mge_cpu_attention_forward(float *out, float *lse, const float *qkv, int64_t B, int64_t T,
                               int64_t C, int64_t NH);
/* dqkv (B, T, 3C) (+)= the gradient, probabilities recomputed block by block from @lse. */
void mge_cpu_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                                const float *lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                                int acc);

/* ---- normalisation, embedding, dropout ---------------------------------------------------- */
/* Over the last dim C of rows: out = (x - mean) * rstd * w + b; writes mean, rstd (rows). */
void mge_cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *w, const float *b, int64_t rows, int64_t C, float eps);
void mge_cpu_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                const float *inp, const float *w, const float *mean,
                                const float *rstd, int64_t rows, int64_t C, int acc);
/*
 * Batch normalisation of inp viewed as (N, C, HW), per channel c (PyTorch's BatchNorm2d).
 * @train != 0: normalise with the batch's mean and biased variance, write them to @mean and
 * @rstd (C; rstd = 1/sqrt(var + eps)) and, when @running_mean/@running_var are not NULL,
 * update them: r = (1 - momentum) r + momentum s, with the unbiased variance (N HW / (N HW - 1))
 * for @running_var. @train == 0: normalise with the running statistics (which must be given)
 * and write those to @mean and @rstd. Sums go plane by plane in a fixed order, in double, so
 * results do not depend on the thread count. @w, @b (C) may be NULL (1 and 0). @relu != 0:
 * out = relu(batchnorm(inp)), bit for bit what mge_cpu_unary_forward() would make of it.
 */
void mge_cpu_batchnorm_forward(float *out, float *mean, float *rstd, const float *inp,
                               const float *w, const float *b, float *running_mean,
                               float *running_var, int64_t N, int64_t C, int64_t HW, float eps,
                               float momentum, int train, int relu);
/* Backward of a training-mode forward (batch statistics @mean, @rstd): dinp, dw, db (C) (+)=;
 * any output may be NULL. @relu_out: the output of a forward with @relu, whose gradient @dout
 * is (the relu's gradient is applied here, bit for bit as mge_cpu_unary_backward() would),
 * or NULL without. */
void mge_cpu_batchnorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                const float *relu_out, const float *inp, const float *w,
                                const float *mean, const float *rstd, int64_t N, int64_t C,
                                int64_t HW, int acc);
/* out[n, :] = table[ids[n], :] (C floats); ids outside [0, V) are the caller's bug. */
void mge_cpu_embedding_forward(float *out, const int32_t *ids, const float *table, int64_t n,
                               int64_t C);
/* dtable[ids[n], :] += dout[n, :]; with acc == 0 the whole table (V x C) is cleared first. */
void mge_cpu_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int64_t n,
                                int64_t V, int64_t C, int acc);
/*
 * Inverted dropout with a counter-based mask: element i is kept iff
 * mge_cpu_dropout_keep(seed, first + i, p); kept elements are scaled by 1/(1-p). The mask is a
 * pure function of (seed, index), so backward (and recomputation) regenerates it and nothing is
 * stored. @first: index of element 0 in a larger tensor (a data-parallel rank's rows of the
 * global batch), so a shard draws the same mask as the whole would; 0 otherwise.
 */
int mge_cpu_dropout_keep(uint64_t seed, int64_t i, float p);
void mge_cpu_dropout_forward(float *out, const float *inp, int64_t n, float p, uint64_t seed,
                             int64_t first);
void mge_cpu_dropout_backward(float *dinp, const float *dout, int64_t n, float p, uint64_t seed,
                              int64_t first, int acc);

/* ---- optimisers (in place over one contiguous parameter arena) ------------------------------ */
/* SGD: g' = g + wd*p; v = mu*v + g'; p -= lr * (nesterov ? g' + mu*v : v). mu == 0: no v used. */
void mge_cpu_sgd_update(float *p, const float *g, float *v, int64_t n, float lr, float mu,
                        float wd, int nesterov);
/* Adam (adamw != 0: decoupled weight decay p -= lr*wd*p) with bias correction at step t >= 1. */
void mge_cpu_adam_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                         float beta1, float beta2, float eps, float wd, int adamw, int64_t t);

/*
 * Global L2 norm of @n floats, summed in double over fixed chunks (bit-identical for any
 * thread count). Gradient clipping then scales with mge_cpu_scale(g, g, s, n).
 */
double mge_cpu_l2_norm(const float *g, int64_t n);

/* ---- exact sums (fixed point; engine/comm/exact.c has the contract) ------------------------ */
/*
 * acc[i] += round(x[i] * scale) for i < n (scale a power of two; rounding to nearest-even, the
 * same bits in every ISA clone). Returns 1 if some |x[i] * scale| > limit or is NaN (then the
 * out-of-range elements' acc is garbage), else 0. acc and x must not overlap.
 */
int mge_cpu_exact_add(int64_t *acc, const float *x, int64_t n, double scale, double limit);
/* out[i] = (float)(acc[i] * inv_scale), through double. */
void mge_cpu_exact_to_f32(float *out, const int64_t *acc, int64_t n, double inv_scale);

#ifdef __cplusplus
}
#endif
#endif
