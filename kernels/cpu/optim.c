/* optim.c: CPU optimiser steps (SGD with momentum/Nesterov, Adam/AdamW) and gradient clipping. */
#include <math.h>

#include "kernels/cpu/cpu_int.h"

MGE__CPU_CLONES
void mge_cpu_sgd_update(float *p, const float *g, float *v, int64_t n, float lr, float mu, float wd,
                        int nesterov)
{
    if (mu == 0.0f) {
#pragma omp parallel for schedule(static) if (n > MGE__PAR_MIN)
        for (int64_t i = 0; i < n; i++)
            p[i] -= lr * (g[i] + wd * p[i]);
        return;
    }
#pragma omp parallel for schedule(static) if (n > MGE__PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] + wd * p[i];
        float vi = mu * v[i] + gi;
        v[i] = vi;
        p[i] -= lr * (nesterov ? gi + mu * vi : vi);
    }
}

MGE__CPU_CLONES
void mge_cpu_adam_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                         float beta1, float beta2, float eps, float wd, int adamw, int64_t t)
{
    float c1 = 1.0f / (1.0f - powf(beta1, (float)t));
    float c2 = 1.0f / (1.0f - powf(beta2, (float)t));
    float l2 = adamw ? 0.0f : wd;         /* Adam: L2 folded into the gradient */
    float decay = adamw ? lr * wd : 0.0f; /* AdamW: decoupled, applied to p before the step */
#pragma omp parallel for schedule(static) if (n > MGE__PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] + l2 * p[i];
        float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= decay * p[i] + lr * (mi * c1) / (sqrtf(vi * c2) + eps);
    }
}

enum { NORM_CHUNKS = 64 };

MGE__CPU_CLONES
double mge_cpu_l2_norm(const float *g, int64_t n)
{
    double part[NORM_CHUNKS] = {0};
    int64_t chunk = (n + NORM_CHUNKS - 1) / NORM_CHUNKS;
#pragma omp parallel for schedule(static) if (n > MGE__PAR_MIN)
    for (int c = 0; c < NORM_CHUNKS; c++) {
        int64_t i0 = c * chunk, i1 = i0 + chunk < n ? i0 + chunk : n;
        double s = 0.0;
        for (int64_t i = i0; i < i1; i++)
            s += (double)g[i] * (double)g[i];
        part[c] = s;
    }
    double total = 0.0;
    for (int c = 0; c < NORM_CHUNKS; c++)
        total += part[c];
    return sqrt(total);
}
