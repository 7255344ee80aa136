/* cpu_int.h: internals shared inside kernels/cpu and with its benchmark (not for other modules). */
#ifndef MGE_KERNELS_CPU_INT_H
#define MGE_KERNELS_CPU_INT_H

#include "kernels/cpu/cpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Loops up to this many elements run on one thread: a fork/join costs more than it saves there,
 * and far more when another process holds a core (a descheduled thread stalls the barrier). */
#define MGE__PAR_MIN 65536

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

#ifdef __cplusplus
}
#endif
#endif
