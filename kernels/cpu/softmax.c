/* softmax.c: CPU row-wise softmax, log-softmax, fused softmax cross-entropy, accuracy. */
#include <math.h>

#include "kernels/cpu/cpu_int.h"

/* max of a row, then sum of exp(x - max) written to @out when non-NULL; returns the sum */
static float row_expsum(float *out, const float *x, int64_t n, float *pmax)
{
    float m = x[0];
    for (int64_t j = 1; j < n; j++)
        m = x[j] > m ? x[j] : m;
    float s = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        float e = expf(x[j] - m);
        if (out)
            out[j] = e;
        s += e;
    }
    *pmax = m;
    return s;
}

MGE__CPU_CLONES
void mge_cpu_softmax_forward(float *out, const float *inp, int64_t rows, int64_t cols)
{
    if (cols <= 0)
        return;
#pragma omp parallel for schedule(static) if (rows * cols > MGE__PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float m, *o = out + r * cols;
        float inv = 1.0f / row_expsum(o, inp + r * cols, cols, &m);
        for (int64_t j = 0; j < cols; j++)
            o[j] *= inv;
    }
}

MGE__CPU_CLONES
void mge_cpu_softmax_backward(float *dinp, const float *dout, const float *out, int64_t rows,
                              int64_t cols, int acc)
{
#pragma omp parallel for schedule(static) if (rows * cols > MGE__PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *y = out + r * cols, *dy = dout + r * cols;
        float *dx = dinp + r * cols;
        float dot = 0.0f;
        for (int64_t j = 0; j < cols; j++)
            dot += dy[j] * y[j];
        for (int64_t j = 0; j < cols; j++) {
            float g = y[j] * (dy[j] - dot);
            dx[j] = acc ? dx[j] + g : g;
        }
    }
}

MGE__CPU_CLONES
void mge_cpu_log_softmax_forward(float *out, const float *inp, int64_t rows, int64_t cols)
{
    if (cols <= 0)
        return;
#pragma omp parallel for schedule(static) if (rows * cols > MGE__PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = inp + r * cols;
        float *o = out + r * cols;
        float m, lse;
        lse = logf(row_expsum(NULL, x, cols, &m)) + m;
        for (int64_t j = 0; j < cols; j++)
            o[j] = x[j] - lse;
    }
}

MGE__CPU_CLONES
void mge_cpu_log_softmax_backward(float *dinp, const float *dout, const float *out, int64_t rows,
                                  int64_t cols, int acc)
{
#pragma omp parallel for schedule(static) if (rows * cols > MGE__PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *y = out + r * cols, *dy = dout + r * cols;
        float *dx = dinp + r * cols;
        float sum = 0.0f;
        for (int64_t j = 0; j < cols; j++)
            sum += dy[j];
        for (int64_t j = 0; j < cols; j++) {
            float g = dy[j] - expf(y[j]) * sum;
            dx[j] = acc ? dx[j] + g : g;
        }
    }
}

/*
 * Row losses are summed in a fixed number of fixed chunks, then the chunks in order, so the
 * loss is bit-identical whatever the thread count.
 */
enum { XENT_CHUNKS = 64 };

void mge_cpu_softmax_xent_forward(float *loss, float *probs, const float *logits,
                                  const int32_t *labels, int64_t B, int64_t V)
{
    mge_cpu_softmax_xent_smooth_forward(loss, probs, logits, labels, B, V, 0.0f);
}

MGE__CPU_CLONES
void mge_cpu_softmax_xent_smooth_forward(float *loss, float *probs, const float *logits,
                                         const int32_t *labels, int64_t B, int64_t V, float eps)
{
    double part[XENT_CHUNKS] = {0};
    int64_t chunk = (B + XENT_CHUNKS - 1) / XENT_CHUNKS;
    if (B <= 0 || V <= 0) {
        *loss = 0.0f;
        return;
    }
#pragma omp parallel for schedule(static) if (B * V > MGE__PAR_MIN)
    for (int c = 0; c < XENT_CHUNKS; c++) {
        int64_t r0 = c * chunk, r1 = r0 + chunk < B ? r0 + chunk : B;
        double s = 0.0;
        for (int64_t r = r0; r < r1; r++) {
            const float *x = logits + r * V;
            float *p = probs + r * V;
            float m;
            float sum = row_expsum(p, x, V, &m);
            float inv = 1.0f / sum;
            for (int64_t j = 0; j < V; j++)
                p[j] *= inv;
            /* -log p[label] from the logits, finite even when p[label] underflows to 0; with
             * smoothing, (1 - eps) of it plus eps times the mean of -log p[j] over the row */
            float lse = logf(sum) + m;
            if (eps == 0.0f) {
                s += (double)(lse - x[labels[r]]);
            } else {
                double xs = 0.0;
                for (int64_t j = 0; j < V; j++)
                    xs += (double)x[j];
                s += (1.0 - (double)eps) * (double)(lse - x[labels[r]]) +
                     (double)eps * ((double)lse - xs / (double)V);
            }
        }
        part[c] = s;
    }
    double total = 0.0;
    for (int c = 0; c < XENT_CHUNKS; c++)
        total += part[c];
    *loss = (float)(total / (double)B);
}

void mge_cpu_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *labels,
                                   int64_t B, int64_t V, float dloss, int acc)
{
    mge_cpu_softmax_xent_smooth_backward(dlogits, probs, labels, B, V, dloss, 0.0f, acc);
}

MGE__CPU_CLONES
void mge_cpu_softmax_xent_smooth_backward(float *dlogits, const float *probs, const int32_t *labels,
                                          int64_t B, int64_t V, float dloss, float eps, int acc)
{
    float k = dloss / (float)B, on = 1.0f - eps + eps / (float)V, off = eps / (float)V;
#pragma omp parallel for schedule(static) if (B * V > MGE__PAR_MIN)
    for (int64_t r = 0; r < B; r++) {
        const float *p = probs + r * V;
        float *d = dlogits + r * V;
        int64_t y = labels[r];
        for (int64_t j = 0; j < V; j++) {
            float g = k * (p[j] - (j == y ? on : off));
            d[j] = acc ? d[j] + g : g;
        }
    }
}

MGE__CPU_CLONES
int64_t mge_cpu_argmax_correct(const float *logits, const int32_t *labels, int64_t B, int64_t V)
{
    int64_t n = 0;
#pragma omp parallel for schedule(static) reduction(+ : n) if (B * V > MGE__PAR_MIN)
    for (int64_t r = 0; r < B; r++) {
        const float *x = logits + r * V;
        int64_t best = 0;
        for (int64_t j = 1; j < V; j++)
            if (x[j] > x[best])
                best = j;
        n += best == labels[r];
    }
    return n;
}
