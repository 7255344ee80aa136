/*
 * lttb.h: Largest-Triangle-Three-Buckets downsampling of a time series (Steinarsson 2013),
 * used by GET /api/v1/jobs/{id}/metrics?max_points=N so a 100,000-step curve reaches the
 * dashboard as a few thousand points that keep its shape (spikes survive, flat runs shrink).
 */
#ifndef MGE_COMMON_LTTB_H
#define MGE_COMMON_LTTB_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Choose at most @max_points of the @n points (@x[i], @y[i]) (x ascending) and write their
 * indices, ascending, to @out_idx (room for min(@n, @max_points) entries). The first and the
 * last point are always kept. @max_points < 3 or @max_points >= @n keeps every point.
 * Returns the number of indices written. Pure: no allocation, any thread.
 */
size_t mge_lttb(const double *x, const double *y, size_t n, size_t max_points, size_t *out_idx);

#ifdef __cplusplus
}
#endif

#endif
