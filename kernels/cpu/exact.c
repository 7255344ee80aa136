/*
 * exact.c: the loops of fixed-point exact sums (engine/comm/exact.c): float to scaled int64
 * and back. Every ISA clone gives the same integers: the scale is a power of two (exact), and
 * rint and the int64/double conversions round to nearest-even in scalar and vector code alike.
 */
#include <math.h>

#include "kernels/cpu/cpu_int.h"

MGE__CPU_CLONES
int mge_cpu_exact_add(int64_t *restrict acc, const float *restrict x, int64_t n, double scale,
                      double limit)
{
    int64_t out = 0; /* no branch in the loop, so it vectorises; checked once afterwards */
    for (int64_t i = 0; i < n; i++) {
        double v = (double)x[i] * scale;
        int ok = fabs(v) <= limit; /* NaN fails too */
        out |= !ok;
        /* an addend out of range adds 0: converting it (or Inf, NaN) to int64 and adding it
         * would be undefined; the step fails on the return value anyway */
        acc[i] += (int64_t)rint(ok ? v : 0.0);
    }
    return out != 0;
}

MGE__CPU_CLONES
void mge_cpu_exact_to_f32(float *restrict out, const int64_t *restrict acc, int64_t n,
                          double inv_scale)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = (float)((double)acc[i] * inv_scale);
}
