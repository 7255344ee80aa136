/* optim.c: SGD (momentum, Nesterov, weight decay), Adam/AdamW, and LR schedules. */
#include "engine/optim.h"

#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "engine/device.h"
#include "kernels/cpu/cpu.h"

int mge_optim_init(struct mge_optim *o, const struct mge_optim_spec *os,
                   const struct mge_sched_spec *ss, int64_t total_steps, int64_t n)
{
    return mge_optim_init_on(o, os, ss, total_steps, n, &mge_device_cpu);
}

int mge_optim_init_on(struct mge_optim *o, const struct mge_optim_spec *os,
                      const struct mge_sched_spec *ss, int64_t total_steps, int64_t n,
                      const struct mge_device *dev)
{
    size_t bytes = sizeof(float) * (size_t)n;
    memset(o, 0, sizeof(*o));
    o->spec = *os;
    o->sched = *ss;
    o->total_steps = total_steps;
    o->n = n;
    o->dev = dev;
    int need_m = os->type != MGE_OPTIM_SGD || os->momentum > 0.0;
    int need_v = os->type != MGE_OPTIM_SGD;
    if (need_m && !(o->m = dev->alloc(bytes)))
        goto err_nomem;
    if (need_v && !(o->v = dev->alloc(bytes)))
        goto err_nomem;
    if (o->m)
        dev->memset(o->m, 0, bytes);
    if (o->v)
        dev->memset(o->v, 0, bytes);
    return MGE_OK;
err_nomem:
    mge_optim_fini(o);
    return MGE_ERR(MGE_NOMEM, "cannot allocate optimiser state (%lld floats) on %s", (long long)n,
                   dev->name);
}

void mge_optim_fini(struct mge_optim *o)
{
    if (o->dev) {
        o->dev->free(o->m, sizeof(float) * (size_t)o->n);
        o->dev->free(o->v, sizeof(float) * (size_t)o->n);
    }
    mge_free(o->no_decay);
    o->m = o->v = NULL;
    o->no_decay = NULL;
    o->n_no_decay = o->cap_no_decay = 0;
}

int mge_optim_exclude_decay(struct mge_optim *o, int64_t first, int64_t count)
{
    int i;
    if (first < 0 || count <= 0 || first + count > o->n)
        return MGE_ERR(MGE_INVAL, "no-decay span [%lld, +%lld) is outside the arena (%lld)",
                       (long long)first, (long long)count, (long long)o->n);
    for (i = 0; i < o->n_no_decay && o->no_decay[i].first < first; i++)
        ;
    if ((i > 0 && o->no_decay[i - 1].first + o->no_decay[i - 1].count > first) ||
        (i < o->n_no_decay && first + count > o->no_decay[i].first))
        return MGE_ERR(MGE_INVAL, "no-decay span [%lld, +%lld) overlaps another", (long long)first,
                       (long long)count);
    if (o->n_no_decay == o->cap_no_decay) {
        int cap = o->cap_no_decay ? 2 * o->cap_no_decay : 16;
        struct mge_optim_span *p = mge_realloc(o->no_decay, sizeof(*p) * (size_t)cap);
        if (!p)
            return MGE_ERR(MGE_NOMEM, "cannot grow the no-decay list to %d spans", cap);
        o->no_decay = p;
        o->cap_no_decay = cap;
    }
    memmove(o->no_decay + i + 1, o->no_decay + i,
            sizeof(*o->no_decay) * (size_t)(o->n_no_decay - i));
    o->no_decay[i] = (struct mge_optim_span){first, count};
    o->n_no_decay++;
    return MGE_OK;
}

double mge_optim_clip(float *grads, int64_t n, double max_norm)
{
    return mge_optim_clip_on(&mge_device_cpu, grads, n, max_norm);
}

double mge_optim_clip_on(const struct mge_device *dev, float *grads, int64_t n, double max_norm)
{
    double norm = dev->l2_norm(grads, n);
    /* as torch: the coefficient in fp32, applied even when clamped to 1 (a no-op multiply) */
    if (max_norm > 0.0) {
        float coef = (float)max_norm / ((float)norm + 1e-6f);
        if (coef < 1.0f)
            dev->scale(grads, grads, coef, n);
    }
    return norm;
}

double mge_optim_lr(const struct mge_optim *o, int64_t step)
{
    double lr = o->spec.lr;
    const struct mge_sched_spec *s = &o->sched;
    switch (s->type) {
    case MGE_SCHED_CONSTANT:
        return lr;
    case MGE_SCHED_STEP:
        return s->step_size > 0 ? lr * pow(s->gamma, (double)(step / s->step_size)) : lr;
    case MGE_SCHED_COSINE: {
        if (step < s->warmup_steps)
            return lr * (double)(step + 1) / (double)s->warmup_steps;
        int64_t span = o->total_steps - s->warmup_steps;
        if (span <= 0)
            return lr;
        double t = (double)(step - s->warmup_steps) / (double)span;
        if (t > 1.0)
            t = 1.0;
        return s->min_lr + 0.5 * (lr - s->min_lr) * (1.0 + cos(M_PI * t));
    }
    }
    return lr;
}

void mge_optim_step_begin(struct mge_optim *o) { o->t++; }

static void update(struct mge_optim *o, float *params, const float *grads, float lr, int64_t first,
                   int64_t count, float wd)
{
    const struct mge_optim_spec *s = &o->spec;
    const struct mge_device *dev = o->dev ? o->dev : &mge_device_cpu;
    float *m = o->m ? o->m + first : NULL, *v = o->v ? o->v + first : NULL;
    if (count <= 0)
        return;
    if (s->type == MGE_OPTIM_SGD)
        dev->sgd_update(params + first, grads + first, m, count, lr, (float)s->momentum, wd,
                        s->nesterov);
    else
        dev->adam_update(params + first, grads + first, m, v, count, lr, (float)s->beta1,
                         (float)s->beta2, (float)s->eps, wd, s->type == MGE_OPTIM_ADAMW, o->t);
}

void mge_optim_step_range(struct mge_optim *o, float *params, const float *grads, int64_t step,
                          int64_t first, int64_t count)
{
    float lr = (float)mge_optim_lr(o, step), wd = (float)o->spec.weight_decay;
    int64_t pos = first, end = first + count;
    /* the range in pieces: decayed stretches between the no-decay spans it crosses */
    for (int i = 0; i < o->n_no_decay && pos < end; i++) {
        int64_t a = o->no_decay[i].first, b = a + o->no_decay[i].count;
        if (b <= pos)
            continue;
        if (a >= end)
            break;
        if (a > pos) {
            update(o, params, grads, lr, pos, a - pos, wd);
            pos = a;
        }
        int64_t e = b < end ? b : end;
        update(o, params, grads, lr, pos, e - pos, 0.0f);
        pos = e;
    }
    update(o, params, grads, lr, pos, end - pos, wd);
}

void mge_optim_step(struct mge_optim *o, float *params, const float *grads, int64_t step)
{
    mge_optim_step_begin(o);
    mge_optim_step_range(o, params, grads, step, 0, o->n);
}

int mge_optim_n_states(const struct mge_optim *o) { return (o->m != NULL) + (o->v != NULL); }

float *mge_optim_state(struct mge_optim *o, int i, const char **name)
{
    if (i == 0 && o->m) {
        *name = "m";
        return o->m;
    }
    if ((i == 1 || (i == 0 && !o->m)) && o->v) {
        *name = "v";
        return o->v;
    }
    *name = NULL;
    return NULL;
}

size_t mge_optim_state_bytes(const struct mge_optim *o)
{
    return sizeof(float) * (size_t)o->n * (size_t)mge_optim_n_states(o);
}
