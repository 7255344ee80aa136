/* dnnl_int.h: what the oneDNN adapters inside kernels/cpu share (not for other modules). */
#ifndef MGE_KERNELS_CPU_DNNL_INT_H
#define MGE_KERNELS_CPU_DNNL_INT_H

#include <dnnl.h>

/*
 * oneDNN's CPU engine and a stream on it, made on the first call and shared by every adapter
 * (conv_dnnl.c, conv_bf16.c, gemm_bf16.c). 0, or -1 when oneDNN cannot make them (then never
 * again). Thread: any; executing on the stream is the caller's to serialise.
 */
int mge__dnnl_get(dnnl_engine_t *engine, dnnl_stream_t *stream);

#endif
