/*
 * device_int.h: the geometry every device's ops table derives from a node the same way (rows and
 * last dims, broadcast strides, reduce/conv/pool/batch-norm shapes, dropout's mask seed), so
 * that the cpu and cuda tables read the IR alike (device_geom.c).
 */
#ifndef MGE_ENGINE_DEVICE_INT_H
#define MGE_ENGINE_DEVICE_INT_H

#include <stdint.h>

#include "engine/engine_int.h"
#include "kernels/cpu/cpu.h"

/* Value @v's data as floats, and an optional input or output (-1: NULL). */
#define MGE__F(g, v) ((float *)(g)->values[(v)].data)
#define MGE__FOPT(g, v) ((v) >= 0 ? MGE__F(g, v) : NULL)

/* Size of @v's last dim (1 for a scalar), and its rows at the current batch size. */
int64_t mge__last_dim(const struct mge_graph *g, int v);
int64_t mge__rows_now(const struct mge_graph *g, int v);
/* Strides of @v right-aligned to an @ndim shape @shape, 0 where @v broadcasts. */
void mge__broadcast_strides(const struct mge_graph *g, int v, const int64_t *shape, int ndim,
                            int64_t *stride);
/*
 * BINARY's output shape and its inputs' broadcast strides at the current batch size; returns
 * the number of dims (a scalar as one dim of 1, strides 0).
 */
int mge__binary_geometry(const struct mge_graph *g, const struct mge_node *n, int64_t *shape,
                         int64_t *sa, int64_t *sb);
/* SUM_TO's source shape and the destination's strides over it (0 where summed); the dims. */
int mge__sum_to_geometry(const struct mge_graph *g, const struct mge_node *n, int64_t *shape,
                         int64_t *so);
/* REDUCE over @axis of @x (-1: all) as (outer, len, inner). */
void mge__reduce_geometry(const struct mge_graph *g, int x, int axis, int64_t *outer, int64_t *len,
                          int64_t *inner);
/* COPY_AXIS's outer and inner extents and the two axis lengths (@axis >= 0). */
void mge__copy_axis_geometry(const struct mge_graph *g, const struct mge_node *n, int64_t *outer,
                             int64_t *inner, int64_t *slen, int64_t *dlen);
/* The conv of input @x and weight @w at the current batch, through mge_cpu_conv_init(). */
void mge__conv_geometry(const struct mge_graph *g, int x, int w, int stride, int pad,
                        struct mge_cpu_conv *cv);
/* The pooling window of node @n over input @x, through mge_cpu_pool_init(). */
void mge__pool_geometry(const struct mge_graph *g, const struct mge_node *n, int x,
                        struct mge_cpu_pool *pl);
/* Dropout's mask seed for node @n at the graph's step, and its first mask index for @v. */
uint64_t mge__dropout_seed(const struct mge_graph *g, const struct mge_node *n);
int64_t mge__dropout_first(const struct mge_graph *g, int v);
/* x (N, C, H, W) as (N, C, HW) at the current batch size. */
void mge__bn_geometry(const struct mge_graph *g, int x, int64_t *N, int64_t *C, int64_t *HW);

#endif
