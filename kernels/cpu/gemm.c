/* gemm.c: CPU row-major SGEMM over oneDNN, OpenBLAS or plain loops, and the thread count. */
#include <dnnl.h>
#include <omp.h>
#include <xmmintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "kernels/cpu/cpu_int.h"

static int g_threads; /* 0: not set yet */
static _Thread_local int
    tl_threads; /* this thread's override (mge_cpu_set_local_threads), 0: none */

void mge_cpu_set_threads(int n)
{
    if (n <= 0) {
        const char *s = getenv("OMP_NUM_THREADS");
        n = s ? atoi(s) : 0;
        if (n <= 0)
            n = (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (n <= 0)
            n = 1;
    }
    g_threads = n;
    omp_set_num_threads(n); /* oneDNN (OpenMP build) follows this too */
    openblas_set_num_threads(n);
    mge_cpu_flush_denormals(!(getenv("MGE_DENORMALS") && !strcmp(getenv("MGE_DENORMALS"), "keep")));
}

void mge_cpu_flush_denormals(int on)
{
    /* MXCSR bits: FTZ (15) flushes denormal results, DAZ (6) reads denormal inputs as zero.
     * Set in every OpenMP thread (the pool persists) and in the caller's thread. */
    unsigned bits = 0x8040;
#pragma omp parallel
    _mm_setcsr(on ? (_mm_getcsr() | bits) : (_mm_getcsr() & ~bits));
    _mm_setcsr(on ? (_mm_getcsr() | bits) : (_mm_getcsr() & ~bits));
}

int mge_cpu_threads(void)
{
    if (tl_threads > 0)
        return tl_threads;
    return g_threads > 0 ? g_threads : omp_get_max_threads();
}

void mge_cpu_set_local_threads(int n)
{
    tl_threads = n > 0 ? n : 0;
    /* this thread's OpenMP nthreads-var: regions without num_threads() follow it */
    omp_set_num_threads(mge_cpu_threads());
}

void mge_cpu_run_split(int n, void (*fn)(void *arg, int t), void *arg)
{
    unsigned csr = _mm_getcsr(); /* threads new to the pool inherit the caller's FTZ/DAZ */
    if (n <= 1) {
        int old = tl_threads;
        mge_cpu_set_local_threads(1);
        fn(arg, 0);
        mge_cpu_set_local_threads(old);
        return;
    }
    /* OpenBLAS (pthread build) has one global thread count: serial while the split runs */
    openblas_set_num_threads(1);
#pragma omp parallel num_threads(n)
    {
        _mm_setcsr(csr);
        mge_cpu_set_local_threads(1);
        /* a smaller team (nested inside another region, OMP_THREAD_LIMIT) still calls every t */
        for (int t = omp_get_thread_num(); t < n; t += omp_get_num_threads())
            fn(arg, t);
        mge_cpu_set_local_threads(0);
    }
    openblas_set_num_threads(g_threads > 0 ? g_threads : omp_get_max_threads());
}

static const char *const backend_names[MGE__GEMM_COUNT] = {
    [MGE__GEMM_AUTO] = "auto",         [MGE__GEMM_DNNL] = "dnnl", [MGE__GEMM_DNNL_OMP] = "dnnl-omp",
    [MGE__GEMM_OPENBLAS] = "openblas", [MGE__GEMM_REF] = "ref",
};

const char *mge__gemm_backend_name(int b)
{
    return b >= 0 && b < MGE__GEMM_COUNT ? backend_names[b] : "?";
}

static int g_backend = MGE__GEMM_AUTO;
static pthread_once_t g_backend_once = PTHREAD_ONCE_INIT;

static void backend_init(void)
{
    const char *s = getenv("MGE_GEMM");
    if (!s || !*s)
        return;
    for (int b = 0; b < MGE__GEMM_COUNT; b++)
        if (strcmp(s, backend_names[b]) == 0)
            g_backend = b;
}

static int backend_chosen(void)
{
    pthread_once(&g_backend_once, backend_init);
    return g_backend;
}

const char *mge_cpu_sgemm_backend(void)
{
    int b = backend_chosen();
    /* "auto" is dnnl on every shape: it won or tied on all of tests/bench/bench_gemm.c's */
    return b == MGE__GEMM_AUTO ? "dnnl" : backend_names[b];
}

void mge_cpu_sgemm_ref(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc)
{
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double s = 0.0;
            for (int k = 0; k < K; k++) {
                float a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                float b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                s += (double)a * b;
            }
            float *c = &C[(size_t)i * ldc + j];
            /* beta == 0 never reads C, as in BLAS, so C may hold garbage */
            *c = beta == 0.0f ? alpha * (float)s : alpha * (float)s + beta * *c;
        }
    }
}

static void sgemm_openblas(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                           int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void sgemm_dnnl(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc)
{
    dnnl_status_t st =
        dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (st != dnnl_success) /* only on arguments we validated already; keep going regardless */
        sgemm_openblas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/*
 * One block of C per OpenMP thread, each a single-threaded dnnl_sgemm (oneDNN runs serially
 * inside a parallel region). On 2 cores this matched or beat oneDNN's own threading on every
 * MLP shape and held up better next to a busy process (tests/bench/bench_gemm.c).
 */
static void sgemm_split_dnnl(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                             int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    int nt = mge_cpu_threads();
    int along_m = M >= N;
    int len = along_m ? M : N;
    int align = along_m ? 8 : 16;
    if (nt > len / align)
        nt = len / align;
    /* below ~0.4 MFLOP the fork/join costs more than the second core gives back */
    if (nt <= 1 || (double)M * N * K < 2e5 || omp_in_parallel()) {
        sgemm_dnnl(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int chunk = (len + nt - 1) / nt;
    chunk = (chunk + align - 1) / align * align;
#pragma omp parallel num_threads(nt)
    {
        int lo = omp_get_thread_num() * chunk;
        int hi = lo + chunk < len ? lo + chunk : len;
        if (lo < hi) {
            if (along_m) {
                const float *a = ta ? A + lo : A + (size_t)lo * lda;
                dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', hi - lo, N, K, alpha, a, lda, B, ldb,
                           beta, C + (size_t)lo * ldc, ldc);
            } else {
                const float *b = tb ? B + (size_t)lo * ldb : B + lo;
                dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, hi - lo, K, alpha, A, lda, b, ldb,
                           beta, C + lo, ldc);
            }
        }
    }
}

void mge__cpu_sgemm_with(int backend, int ta, int tb, int M, int N, int K, float alpha,
                         const float *A, int lda, const float *B, int ldb, float beta, float *C,
                         int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    switch (backend) {
    case MGE__GEMM_DNNL_OMP:
        sgemm_dnnl(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        break;
    case MGE__GEMM_OPENBLAS:
        sgemm_openblas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        break;
    case MGE__GEMM_REF:
        mge_cpu_sgemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        break;
    case MGE__GEMM_DNNL:
    case MGE__GEMM_AUTO:
    default:
        sgemm_split_dnnl(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        break;
    }
}

void mge_cpu_sgemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc)
{
    mge__cpu_sgemm_with(backend_chosen(), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
