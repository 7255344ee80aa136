/*
 * gemm_bf16.c: mixed-precision GEMM (inputs rounded to bfloat16, products summed in fp32) over
 * oneDNN matmul primitives, the fp32<->bf16 conversions, and the CPU check for AVX-512 BF16.
 * The only file that knows oneDNN's matmul API; without a usable primitive it emulates.
 */
#include <dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_int.h"
#include "kernels/cpu/dnnl_int.h"

#define CACHE_SIZE 128 /* GEMM shapes alive at once: a ResNet's convs do not come here */

/* ---- the CPU check ----------------------------------------------------------------------- */

static int g_has_bf16;
static pthread_once_t g_has_once = PTHREAD_ONCE_INIT;

static void has_bf16_init(void)
{
    const char *s = getenv("MGE_CPU_BF16");
    /* MGE_CPU_BF16=off: behave as a CPU without the instructions (tests of the fallback) */
    if (s && (!strcmp(s, "off") || !strcmp(s, "0")))
        return;
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    __builtin_cpu_init();
    g_has_bf16 = __builtin_cpu_supports("avx512bf16") != 0;
#endif
}

int mge_cpu_has_bf16(void)
{
    pthread_once(&g_has_once, has_bf16_init);
    return g_has_bf16;
}

/* ---- conversions ------------------------------------------------------------------------- */

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN, sign kept */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even; overflow gives Inf */
    return (uint16_t)(u >> 16);
}

MGE__CPU_CLONES
void mge_cpu_f32_to_bf16(uint16_t *restrict out, const float *restrict inp, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = f32_to_bf16(inp[i]);
}

MGE__CPU_CLONES
void mge_cpu_bf16_to_f32(float *restrict out, const uint16_t *restrict inp, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)inp[i] << 16;
        memcpy(&out[i], &u, sizeof(u));
    }
}

MGE__CPU_CLONES
void mge_cpu_round_bf16(float *out, const float *inp, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)f32_to_bf16(inp[i]) << 16;
        memcpy(&out[i], &u, sizeof(u));
    }
}

void mge__cpu_f32_to_bf16_par(uint16_t *out, const float *inp, int64_t n)
{
    int nt = n > MGE__PAR_MIN && !omp_in_parallel() ? mge_cpu_threads() : 1;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < nt; t++) {
        int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
        mge_cpu_f32_to_bf16(out + lo, inp + lo, hi - lo);
    }
}

/* rows x cols of @src (leading dimension @ld) into dense @dst, converted; threads over rows */
static void pack_bf16(uint16_t *dst, const float *src, int rows, int cols, int ld)
{
    int64_t n = (int64_t)rows * cols;
    int nt = n > MGE__PAR_MIN && !omp_in_parallel() ? mge_cpu_threads() : 1;
    if (ld == cols) {
        mge__cpu_f32_to_bf16_par(dst, src, n);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int r = 0; r < rows; r++)
        mge_cpu_f32_to_bf16(dst + (size_t)r * cols, src + (size_t)r * ld, cols);
}

/* ---- oneDNN matmul primitives ---------------------------------------------------------- */

/*
 * One GEMM shape's primitive, made on first use and kept for the life of the process (a full
 * cache makes and destroys a primitive per call: correct, slower). Memory objects are pointed
 * at the call's buffers; g_lock serialises calls (the engine runs one op at a time).
 */
struct entry {
    int key[9]; /* ta tb M N K ldc alpha-bits beta-bits threads; key[2] == 0: unused */
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, dst;
};

static struct entry g_cache[CACHE_SIZE];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;
/* packed bf16 copies of A and B, grown as needed, guarded by g_lock */
static uint16_t *g_a, *g_b;
static size_t g_a_cap, g_b_cap;

static struct {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    int failed;
} g_dnnl;

static void dnnl_init(void)
{
    if (dnnl_engine_create(&g_dnnl.engine, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&g_dnnl.stream, g_dnnl.engine, dnnl_stream_default_flags) !=
            dnnl_success)
        g_dnnl.failed = 1;
}

int mge__dnnl_get(dnnl_engine_t *engine, dnnl_stream_t *stream)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, dnnl_init);
    if (g_dnnl.failed)
        return -1;
    *engine = g_dnnl.engine;
    *stream = g_dnnl.stream;
    return 0;
}

static void entry_fini(struct entry *e)
{
    if (e->prim)
        dnnl_primitive_destroy(e->prim);
    if (e->src)
        dnnl_memory_destroy(e->src);
    if (e->wei)
        dnnl_memory_destroy(e->wei);
    if (e->dst)
        dnnl_memory_destroy(e->dst);
    memset(e, 0, sizeof(*e));
}

/*
 * src (M, K) is A as packed: dense K x M when transposed, else M x K; weights (K, N) likewise
 * from B; dst (M, N) is C with leading dimension ldc, summed into with beta (a post-op) and
 * scaled by alpha (output scales). 0, or -1 when oneDNN cannot make it.
 */
static int entry_make(struct entry *e, int ta, int tb, int M, int N, int K, int ldc, float alpha,
                      float beta)
{
    dnnl_dims_t da = {M, K}, db = {K, N}, dc = {M, N};
    dnnl_dims_t sa = {ta ? 1 : K, ta ? M : 1}, sb = {tb ? 1 : N, tb ? K : 1}, sc = {ldc, 1};
    dnnl_memory_desc_t ma, mb, mc;
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int rc = -1;
    if (dnnl_memory_desc_init_by_strides(&ma, 2, da, dnnl_bf16, sa) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&mb, 2, db, dnnl_bf16, sb) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&mc, 2, dc, dnnl_f32, sc) != dnnl_success ||
        dnnl_matmul_desc_init(&md, &ma, &mb, NULL, &mc) != dnnl_success)
        return -1;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success)
        return -1;
    if (alpha != 1.0f && dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha) != dnnl_success)
        goto out_destroy_attr;
    if (beta != 0.0f) {
        if (dnnl_post_ops_create(&po) != dnnl_success)
            goto out_destroy_attr;
        if (dnnl_post_ops_append_sum(po, beta) != dnnl_success ||
            dnnl_primitive_attr_set_post_ops(attr, po) != dnnl_success)
            goto out_destroy_po;
    }
    if (dnnl_primitive_desc_create(&pd, &md, attr, g_engine, NULL) != dnnl_success)
        goto out_destroy_po;
    if (dnnl_primitive_create(&e->prim, pd) == dnnl_success &&
        dnnl_memory_create(&e->src, &ma, g_engine, DNNL_MEMORY_NONE) == dnnl_success &&
        dnnl_memory_create(&e->wei, &mb, g_engine, DNNL_MEMORY_NONE) == dnnl_success &&
        dnnl_memory_create(&e->dst, &mc, g_engine, DNNL_MEMORY_NONE) == dnnl_success)
        rc = 0;
    dnnl_primitive_desc_destroy(pd);
out_destroy_po:
    if (po)
        dnnl_post_ops_destroy(po);
out_destroy_attr:
    dnnl_primitive_attr_destroy(attr);
    return rc;
}

/* The entry for this shape (g_lock held), or @tmp made for this call alone; NULL: no primitive. */
static struct entry *entry_get(struct entry *tmp, int ta, int tb, int M, int N, int K, int ldc,
                               float alpha, float beta)
{
    int key[9] = {ta, tb, M, N, K, ldc, 0, 0, mge_cpu_threads()};
    memcpy(&key[6], &alpha, sizeof(float));
    memcpy(&key[7], &beta, sizeof(float));
    struct entry *e = NULL;
    for (int i = 0; i < CACHE_SIZE && !e; i++)
        if (g_cache[i].key[2] && memcmp(g_cache[i].key, key, sizeof(key)) == 0)
            return &g_cache[i];
    for (int i = 0; i < CACHE_SIZE && !e; i++)
        if (!g_cache[i].key[2])
            e = &g_cache[i];
    if (!e)
        e = tmp;
    if (entry_make(e, ta, tb, M, N, K, ldc, alpha, beta) != 0) {
        entry_fini(e);
        return NULL;
    }
    memcpy(e->key, key, sizeof(key));
    return e;
}

static int grow(uint16_t **p, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    uint16_t *q = realloc(*p, n * sizeof(uint16_t));
    if (!q)
        return -1;
    *p = q;
    *cap = n;
    return 0;
}

/* 0, or -1 with C untouched (no primitive, no memory): the caller emulates */
static int gemm_dnnl(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc)
{
    if (mge__dnnl_get(&g_engine, &g_stream) != 0)
        return -1;
    struct entry tmp = {{0}, NULL, NULL, NULL, NULL}, *e;
    int rc = -1;
    pthread_mutex_lock(&g_lock);
    if (grow(&g_a, &g_a_cap, (size_t)M * K) != 0 || grow(&g_b, &g_b_cap, (size_t)K * N) != 0)
        goto out_unlock;
    e = entry_get(&tmp, ta, tb, M, N, K, ldc, alpha, beta);
    if (!e)
        goto out_unlock;
    pack_bf16(g_a, A, ta ? K : M, ta ? M : K, lda);
    pack_bf16(g_b, B, tb ? N : K, tb ? K : N, ldb);
    dnnl_memory_set_data_handle(e->src, g_a);
    dnnl_memory_set_data_handle(e->wei, g_b);
    dnnl_memory_set_data_handle(e->dst, C);
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, e->src}, {DNNL_ARG_WEIGHTS, e->wei}, {DNNL_ARG_DST, e->dst}};
    rc = dnnl_primitive_execute(e->prim, g_stream, 3, args) == dnnl_success &&
                 dnnl_stream_wait(g_stream) == dnnl_success
             ? 0
             : -1;
    if (e == &tmp)
        entry_fini(&tmp);
out_unlock:
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/*
 * The same numbers without oneDNN's bf16 kernels: the inputs rounded to bf16 (held in fp32,
 * where products of two bf16 values are exact) and an fp32 GEMM. Slow (it copies both), but
 * any CPU runs it.
 */
static void gemm_emulated(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                          const float *B, int ldb, float beta, float *C, int ldc)
{
    int ra = ta ? K : M, ca = ta ? M : K, rb = tb ? N : K, cb = tb ? K : N;
    float *a = malloc((size_t)ra * ca * sizeof(float)),
          *b = malloc((size_t)rb * cb * sizeof(float));
    if (!a || !b) {
        /* NEEDSWORK: no error path through the ops table; fp32 is the nearest honest result */
        mge_cpu_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        goto out_free;
    }
    for (int r = 0; r < ra; r++)
        mge_cpu_round_bf16(a + (size_t)r * ca, A + (size_t)r * lda, ca);
    for (int r = 0; r < rb; r++)
        mge_cpu_round_bf16(b + (size_t)r * cb, B + (size_t)r * ldb, cb);
    mge_cpu_sgemm(ta, tb, M, N, K, alpha, a, ca, b, cb, beta, C, ldc);
out_free:
    free(a);
    free(b);
}

void mge__cpu_gemm_bf16_with(int emulate, int ta, int tb, int M, int N, int K, float alpha,
                             const float *A, int lda, const float *B, int ldb, float beta, float *C,
                             int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) { /* C = beta C, as BLAS (beta 0 never reads C); oneDNN refuses empty sums */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
        return;
    }
    if (emulate || gemm_dnnl(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) != 0)
        gemm_emulated(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void mge_cpu_gemm_bf16(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc)
{
    mge__cpu_gemm_bf16_with(!mge_cpu_has_bf16(), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C,
                            ldc);
}
