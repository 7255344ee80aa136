/* lttb.c: Largest-Triangle-Three-Buckets downsampling (see lttb.h). */
#include "lttb.h"

#include <math.h>

size_t mge_lttb(const double *x, const double *y, size_t n, size_t max_points, size_t *out_idx)
{
    size_t a = 0, k = 0;
    double every;

    if (max_points >= n || max_points < 3) {
        for (size_t i = 0; i < n; i++)
            out_idx[i] = i;
        return n;
    }
    /* the inner points fall into max_points - 2 buckets of equal width in index space */
    every = (double)(n - 2) / (double)(max_points - 2);
    out_idx[k++] = 0;
    for (size_t b = 0; b < max_points - 2; b++) {
        size_t lo = (size_t)floor((double)b * every) + 1;
        size_t hi = (size_t)floor((double)(b + 1) * every) + 1;
        size_t nlo = hi, nhi = (size_t)floor((double)(b + 2) * every) + 1;
        double ax = x[a], ay = y[a], cx = 0, cy = 0, best = -1;
        size_t pick = lo;

        if (hi > n - 1)
            hi = n - 1;
        if (nhi > n)
            nhi = n;
        /* the third corner: the average of the next bucket (the last point for the last) */
        if (nlo >= n - 1 || nlo >= nhi) {
            cx = x[n - 1];
            cy = y[n - 1];
        } else {
            for (size_t j = nlo; j < nhi; j++) {
                cx += x[j];
                cy += y[j];
            }
            cx /= (double)(nhi - nlo);
            cy /= (double)(nhi - nlo);
        }
        for (size_t j = lo; j < hi; j++) {
            double area = fabs((ax - cx) * (y[j] - ay) - (ax - x[j]) * (cy - ay));
            if (area > best) {
                best = area;
                pick = j;
            }
        }
        out_idx[k++] = pick;
        a = pick;
    }
    out_idx[k++] = n - 1;
    return k;
}
