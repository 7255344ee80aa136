/*
 * quant_check.c: the checks of quantisation fields read from files (activation observers in
 * checkpoints), apart from the rest of quant.c so that the checkpoint fuzzer links them alone.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "engine/engine.h"

int mge_quant_is_observer(const char *name)
{
    size_t n = strlen(name), s = strlen(MGE_QUANT_OBSERVER_SUFFIX);
    return n > s && !strcmp(name + n - s, MGE_QUANT_OBSERVER_SUFFIX);
}

int mge_quant_observer_check(const float *v, int64_t n, int need_observed, char *err, size_t errlen)
{
    static const char *const field[MGE_QUANT_OBSERVER_LEN] = {"low", "high", "count", "reserved"};
    if (n != MGE_QUANT_OBSERVER_LEN) {
        snprintf(err, errlen, "has %lld values, not %d (low, high, count, reserved)", (long long)n,
                 MGE_QUANT_OBSERVER_LEN);
        return MGE_CORRUPT;
    }
    for (int i = 0; i < MGE_QUANT_OBSERVER_LEN; i++)
        if (!isfinite(v[i])) {
            snprintf(err, errlen, "field '%s' is %g, not a finite number", field[i], (double)v[i]);
            return MGE_CORRUPT;
        }
    if (v[2] < 0.0f || v[2] != floorf(v[2])) {
        snprintf(err, errlen, "field 'count' is %g, not a whole number >= 0", (double)v[2]);
        return MGE_CORRUPT;
    }
    if (v[3] != 0.0f) {
        snprintf(err, errlen, "field 'reserved' is %g, not 0", (double)v[3]);
        return MGE_CORRUPT;
    }
    if (v[2] > 0.0f && v[0] > v[1]) {
        snprintf(err, errlen, "field 'low' %g is above field 'high' %g", (double)v[0],
                 (double)v[1]);
        return MGE_CORRUPT;
    }
    if (need_observed && v[2] == 0.0f) {
        snprintf(err, errlen,
                 "field 'count' is 0: never observed (train with quant.mode qat, or "
                 "run mge-quantize --calibrate)");
        return MGE_CORRUPT;
    }
    return MGE_OK;
}
