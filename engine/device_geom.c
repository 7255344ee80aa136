/* device_geom.c: how the devices' ops tables read shapes off the IR (engine/device_int.h). */
#include <string.h>

#include "engine/device_int.h"

int64_t mge__last_dim(const struct mge_graph *g, int v)
{
    const struct mge_value *x = &g->values[v];
    return x->ndim ? x->shape[x->ndim - 1] : 1;
}

int64_t mge__rows_now(const struct mge_graph *g, int v)
{
    return mge__value_numel_now(g, v) / mge__last_dim(g, v);
}

void mge__broadcast_strides(const struct mge_graph *g, int v, const int64_t *shape, int ndim,
                            int64_t *stride)
{
    int64_t vs[MGE_MAX_DIMS];
    const struct mge_value *x = &g->values[v];
    mge__value_shape_now(g, v, vs);
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        int iv = i - (ndim - x->ndim);
        if (iv < 0 || vs[iv] == 1 || (vs[iv] != shape[i])) {
            stride[i] = 0;
            if (iv >= 0)
                s *= vs[iv];
        } else {
            stride[i] = s;
            s *= vs[iv];
        }
    }
}

void mge__reduce_geometry(const struct mge_graph *g, int x, int axis, int64_t *outer, int64_t *len,
                          int64_t *inner)
{
    int64_t shape[MGE_MAX_DIMS];
    const struct mge_value *v = &g->values[x];
    mge__value_shape_now(g, x, shape);
    *outer = *inner = 1;
    if (axis < 0) {
        *len = mge__value_numel_now(g, x);
        return;
    }
    *len = shape[axis];
    for (int i = 0; i < axis; i++)
        *outer *= shape[i];
    for (int i = axis + 1; i < v->ndim; i++)
        *inner *= shape[i];
}

void mge__conv_geometry(const struct mge_graph *g, int x, int w, int stride, int pad,
                        struct mge_cpu_conv *cv)
{
    int64_t xs[MGE_MAX_DIMS];
    mge__value_shape_now(g, x, xs);
    const int64_t *ws = g->values[w].shape;
    memset(cv, 0, sizeof(*cv));
    cv->N = (int)xs[0];
    cv->C = (int)xs[1];
    cv->H = (int)xs[2];
    cv->W = (int)xs[3];
    cv->K = (int)ws[0];
    cv->R = (int)ws[2];
    cv->S = (int)ws[3];
    cv->stride = stride;
    cv->pad = pad;
    mge_cpu_conv_init(cv);
}

void mge__pool_geometry(const struct mge_graph *g, const struct mge_node *n, int x,
                        struct mge_cpu_pool *pl)
{
    int64_t xs[MGE_MAX_DIMS];
    mge__value_shape_now(g, x, xs);
    memset(pl, 0, sizeof(*pl));
    pl->N = (int)xs[0];
    pl->C = (int)xs[1];
    pl->H = (int)xs[2];
    pl->W = (int)xs[3];
    pl->R = pl->S = n->a.pool.k;
    pl->stride = n->a.pool.stride;
    pl->pad = n->a.pool.pad;
    mge_cpu_pool_init(pl);
}

uint64_t mge__dropout_seed(const struct mge_graph *g, const struct mge_node *n)
{
    return g->seed ^ n->a.drop.salt ^ ((uint64_t)g->step * 0xD1B54A32D192ED03ull);
}

/* Index of the first element of @v's mask: rows before this run's in the global batch. */
int64_t mge__dropout_first(const struct mge_graph *g, int v)
{
    if (!g->values[v].batched || g->row_offset == 0 || g->batch <= 0)
        return 0;
    return g->row_offset * (mge__value_numel_now(g, v) / g->batch);
}

void mge__bn_geometry(const struct mge_graph *g, int x, int64_t *N, int64_t *C, int64_t *HW)
{
    int64_t xs[MGE_MAX_DIMS];
    mge__value_shape_now(g, x, xs);
    *N = xs[0];
    *C = xs[1];
    *HW = xs[2] * xs[3];
}

void mge__copy_axis_geometry(const struct mge_graph *g, const struct mge_node *n, int64_t *outer,
                             int64_t *inner, int64_t *slen, int64_t *dlen)
{
    int src = n->in[0], dst = n->out[0], axis = n->a.copy.axis;
    int64_t ss[MGE_MAX_DIMS], ds[MGE_MAX_DIMS];
    mge__value_shape_now(g, src, ss);
    mge__value_shape_now(g, dst, ds);
    *outer = *inner = 1;
    for (int i = 0; i < axis; i++)
        *outer *= ss[i];
    for (int i = axis + 1; i < g->values[src].ndim; i++)
        *inner *= ss[i];
    *slen = ss[axis];
    *dlen = ds[axis];
}

int mge__binary_geometry(const struct mge_graph *g, const struct mge_node *n, int64_t *shape,
                         int64_t *sa, int64_t *sb)
{
    int c = n->out[0], nd = g->values[c].ndim;
    mge__value_shape_now(g, c, shape);
    mge__broadcast_strides(g, n->in[0], shape, nd, sa);
    mge__broadcast_strides(g, n->in[1], shape, nd, sb);
    if (nd == 0) {
        shape[0] = 1;
        sa[0] = sb[0] = 0;
        nd = 1;
    }
    return nd;
}

int mge__sum_to_geometry(const struct mge_graph *g, const struct mge_node *n, int64_t *shape,
                         int64_t *so)
{
    int src = n->in[0], nd = g->values[src].ndim;
    mge__value_shape_now(g, src, shape);
    mge__broadcast_strides(g, n->out[0], shape, nd, so);
    return nd;
}
