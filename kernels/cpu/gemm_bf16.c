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
 * One block shape's primitive, made for one thread on first use and kept for the life of the
 * process (a full cache makes and destroys one per call: correct, slower). As mge_cpu_sgemm does
 * with dnnl_sgemm, a GEMM is split into one block of rows (or columns) of C per OpenMP thread,
 * each a single-threaded primitive: oneDNN's own threading stalled when a neighbour took a
 * core. Memory objects are made per block and call (they are tiny); g_lock serialises calls.
 */
struct entry {
    int key[10]; /* ta tb M N K lda ldb ldc alpha-bits beta-bits (packed A, B); key[2] == 0: unused
                  */
    dnnl_primitive_t prim;
    dnnl_memory_desc_t src, wei, dst;
    size_t pad_bytes; /* its scratchpad */
};

#define MAX_THREADS 64 /* threads that get their own stream and scratchpad; more run serially */

static struct entry g_cache[CACHE_SIZE];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;
/* guarded by g_lock: packed bf16 copies of A and B, and per thread a stream and a scratchpad */
static uint16_t *g_a, *g_b;
static size_t g_a_cap, g_b_cap;
static dnnl_stream_t g_streams[MAX_THREADS];
static unsigned char *g_pad[MAX_THREADS];
static size_t g_pad_cap[MAX_THREADS];

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
    memset(e, 0, sizeof(*e));
}

/*
 * src (M, K) from the packed A (leading dimension lda; transposed: K x M), weights (K, N) from
 * the packed B (ldb), dst (M, N) with ldc, summed into with beta (a post-op) and scaled by alpha
 * (output scales), for one thread. 0, or -1 when oneDNN cannot make it.
 */
static int entry_make(struct entry *e, const int *key, float alpha, float beta)
{
    int ta = key[0], tb = key[1], M = key[2], N = key[3], K = key[4];
    dnnl_dims_t da = {M, K}, db = {K, N}, dc = {M, N};
    dnnl_dims_t sa = {ta ? 1 : key[5], ta ? key[5] : 1}, sb = {tb ? 1 : key[6], tb ? key[6] : 1};
    dnnl_dims_t sc = {key[7], 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int rc = -1;
    if (dnnl_memory_desc_init_by_strides(&e->src, 2, da, dnnl_bf16, sa) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&e->wei, 2, db, dnnl_bf16, sb) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&e->dst, 2, dc, dnnl_f32, sc) != dnnl_success ||
        dnnl_matmul_desc_init(&md, &e->src, &e->wei, NULL, &e->dst) != dnnl_success)
        return -1;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success)
        return -1;
    if (dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) != dnnl_success)
        goto out_destroy_attr;
    if (alpha != 1.0f && dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha) != dnnl_success)
        goto out_destroy_attr;
    if (beta != 0.0f) {
        if (dnnl_post_ops_create(&po) != dnnl_success)
            goto out_destroy_attr;
        if (dnnl_post_ops_append_sum(po, beta) != dnnl_success ||
            dnnl_primitive_attr_set_post_ops(attr, po) != dnnl_success)
            goto out_destroy_po;
    }
    /* oneDNN sizes its work split by omp_get_max_threads() when a primitive is made */
    int old = omp_get_max_threads();
    omp_set_num_threads(1);
    if (dnnl_primitive_desc_create(&pd, &md, attr, g_engine, NULL) == dnnl_success) {
        const dnnl_memory_desc_t *pad =
            dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        e->pad_bytes = pad ? dnnl_memory_desc_get_size(pad) : 0;
        rc = dnnl_primitive_create(&e->prim, pd) == dnnl_success ? 0 : -1;
        dnnl_primitive_desc_destroy(pd);
    }
    omp_set_num_threads(old);
out_destroy_po:
    if (po)
        dnnl_post_ops_destroy(po);
out_destroy_attr:
    dnnl_primitive_attr_destroy(attr);
    return rc;
}

/* The entry for @key (g_lock held), or @tmp made for this call alone; NULL: no primitive. */
static struct entry *entry_get(struct entry *tmp, const int *key_in, float alpha, float beta)
{
    int key[10];
    memcpy(key, key_in, 8 * sizeof(int));
    memcpy(&key[8], &alpha, sizeof(float));
    memcpy(&key[9], &beta, sizeof(float));
    struct entry *e = NULL;
    for (int i = 0; i < CACHE_SIZE; i++)
        if (g_cache[i].key[2] && memcmp(g_cache[i].key, key, sizeof(key)) == 0)
            return &g_cache[i];
    for (int i = 0; i < CACHE_SIZE && !e; i++)
        if (!g_cache[i].key[2])
            e = &g_cache[i];
    if (!e)
        e = tmp;
    if (entry_make(e, key, alpha, beta) != 0) {
        entry_fini(e);
        return NULL;
    }
    memcpy(e->key, key, sizeof(key));
    return e;
}

static int grow(void **p, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return 0;
    void *q = realloc(*p, bytes);
    if (!q)
        return -1;
    *p = q;
    *cap = bytes;
    return 0;
}

/* Thread @t's stream and a scratchpad of @bytes (g_lock held); 0 or -1. */
static int thread_ready(int t, size_t bytes)
{
    if (!g_streams[t] &&
        dnnl_stream_create(&g_streams[t], g_engine, dnnl_stream_default_flags) != dnnl_success)
        return -1;
    return grow((void **)&g_pad[t], &g_pad_cap[t], bytes > 0 ? bytes : 1);
}

/* Run @e on one block in thread @t; the pointers are the block's own. 0 or -1. */
static int block_run(const struct entry *e, int t, const uint16_t *a, const uint16_t *b, float *c)
{
    dnnl_memory_t m[4] = {NULL, NULL, NULL, NULL};
    int rc = -1;
    if (dnnl_memory_create(&m[0], &e->src, g_engine, (void *)a) != dnnl_success ||
        dnnl_memory_create(&m[1], &e->wei, g_engine, (void *)b) != dnnl_success ||
        dnnl_memory_create(&m[2], &e->dst, g_engine, c) != dnnl_success)
        goto out_destroy;
    dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]}, {DNNL_ARG_DST, m[2]}, {0, NULL}};
    int na = 3;
    if (e->pad_bytes) {
        dnnl_memory_desc_t pmd;
        dnnl_dims_t pd = {(dnnl_dim_t)e->pad_bytes};
        if (dnnl_memory_desc_init_by_tag(&pmd, 1, pd, dnnl_u8, dnnl_x) != dnnl_success ||
            dnnl_memory_create(&m[3], &pmd, g_engine, g_pad[t]) != dnnl_success)
            goto out_destroy;
        args[na].arg = DNNL_ARG_SCRATCHPAD;
        args[na].memory = m[3];
        na++;
    }
    rc = dnnl_primitive_execute(e->prim, g_streams[t], na, args) == dnnl_success &&
                 dnnl_stream_wait(g_streams[t]) == dnnl_success
             ? 0
             : -1;
out_destroy:
    for (int i = 0; i < 4; i++)
        if (m[i])
            dnnl_memory_destroy(m[i]);
    return rc;
}

/* 0, or -1 with C untouched (no primitive, no memory): the caller emulates */
static int gemm_dnnl(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                     const float *B, int ldb, float beta, float *C, int ldc)
{
    if (mge__dnnl_get(&g_engine, &g_stream) != 0)
        return -1;
    /* blocks as sgemm_split_dnnl makes them (gemm.c) */
    int nt = mge_cpu_threads(), along_m = M >= N, len = along_m ? M : N, align = along_m ? 8 : 16;
    if (nt > len / align)
        nt = len / align;
    if (nt > MAX_THREADS)
        nt = MAX_THREADS;
    if (nt < 1 || (double)M * N * K < 2e5 || omp_in_parallel())
        nt = 1;
    int chunk = (len + nt - 1) / nt;
    chunk = (chunk + align - 1) / align * align;
    int la = ta ? M : K, lb = tb ? K : N; /* leading dimensions of the packed copies */
    struct entry tmp[2], *e[2] = {NULL, NULL};
    memset(tmp, 0, sizeof(tmp));
    int rc = -1, last = len - (nt - 1) * chunk;
    if (last <= 0) { /* rounding the chunk up left the last threads nothing */
        nt = (len + chunk - 1) / chunk;
        last = len - (nt - 1) * chunk;
    }
    pthread_mutex_lock(&g_lock);
    if (grow((void **)&g_a, &g_a_cap, (size_t)M * K * sizeof(uint16_t)) != 0 ||
        grow((void **)&g_b, &g_b_cap, (size_t)K * N * sizeof(uint16_t)) != 0)
        goto out_unlock;
    for (int i = 0; i < 2; i++) { /* the full blocks' shape, then the last block's */
        int bl = i == 0 ? chunk : last;
        if (i == 1 && (nt == 1 ? 1 : bl == chunk)) {
            e[1] = nt == 1 ? NULL : e[0];
            continue;
        }
        if (nt == 1)
            bl = len;
        int key[8] = {ta, tb, along_m ? bl : M, along_m ? N : bl, K, la, lb, ldc};
        e[i] = entry_get(&tmp[i], key, alpha, beta);
        if (!e[i])
            goto out_fini;
    }
    for (int t = 0; t < nt; t++)
        if (thread_ready(t, e[0]->pad_bytes > (e[1] ? e[1]->pad_bytes : 0)
                                ? e[0]->pad_bytes
                                : (e[1] ? e[1]->pad_bytes : 0)) != 0)
            goto out_fini;
    pack_bf16(g_a, A, ta ? K : M, ta ? M : K, lda);
    pack_bf16(g_b, B, tb ? N : K, tb ? K : N, ldb);
    int fails = 0;
#pragma omp parallel for num_threads(nt) schedule(static, 1) reduction(+ : fails)
    for (int t = 0; t < nt; t++) {
        int lo = t * chunk;
        const struct entry *et = t == nt - 1 && e[1] ? e[1] : e[0];
        const uint16_t *a = g_a, *b = g_b;
        float *c = C;
        if (along_m) {
            a += ta ? (size_t)lo : (size_t)lo * K;
            c += (size_t)lo * ldc;
        } else {
            b += tb ? (size_t)lo * K : (size_t)lo;
            c += lo;
        }
        fails += block_run(et, t, a, b, c) != 0;
    }
    rc = fails ? -1 : 0;
out_fini:
    for (int i = 0; i < 2; i++)
        if (e[i] == &tmp[i])
            entry_fini(&tmp[i]);
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
