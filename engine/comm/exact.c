/*
 * exact.c: exact sums for deterministic data parallelism: values are rounded once to fixed
 * point (2^-40 units) and added as int64, so a sum has the same bits whatever the order of its
 * terms and however they were split over ranks (the int64 all-reduce is exact too).
 */
#include <math.h>

#include "common/err.h"
#include "engine/comm/comm.h"
#include "kernels/cpu/cpu.h"

#define EXACT_SCALE 1099511627776.0 /* 2^MGE_EXACT_FRAC_BITS */

_Static_assert(MGE_EXACT_FRAC_BITS == 40, "EXACT_SCALE is 2^40");

double mge_exact_limit(int terms)
{
    /* terms addends of at most 2^62/terms units: every partial sum, in any order, stays
     * within 2^62, well inside int64 */
    return ldexp(1.0, 62 - MGE_EXACT_FRAC_BITS) / (double)(terms > 0 ? terms : 1);
}

int mge_exact_add_f32(int64_t *acc, const float *x, size_t n, int terms, size_t *bad)
{
    const double lim = mge_exact_limit(terms) * EXACT_SCALE;
    if (!mge_cpu_exact_add(acc, x, (int64_t)n, EXACT_SCALE, lim))
        return MGE_OK;
    for (size_t i = 0; i < n; i++) {
        if (!(fabs((double)x[i] * EXACT_SCALE) <= lim)) {
            *bad = i;
            break;
        }
    }
    return MGE_RANGE;
}

int mge_exact_add_f64(int64_t *acc, double x, int terms)
{
    double v = x * EXACT_SCALE;
    if (!(fabs(v) <= mge_exact_limit(terms) * EXACT_SCALE))
        return MGE_RANGE;
    *acc += (int64_t)rint(v); /* as mge_cpu_exact_add rounds */
    return MGE_OK;
}

void mge_exact_to_f32(float *out, const int64_t *acc, size_t n)
{
    mge_cpu_exact_to_f32(out, acc, (int64_t)n, 1.0 / EXACT_SCALE);
}

double mge_exact_to_f64(int64_t acc)
{
    return (double)acc * (1.0 / EXACT_SCALE);
}
