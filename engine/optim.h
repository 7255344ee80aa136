/* optim.h: optimisers over the parameter arena (SGD, Adam, AdamW) and learning-rate schedules. */
#ifndef MGE_ENGINE_OPTIM_H
#define MGE_ENGINE_OPTIM_H

#include <stdint.h>

#include "common/jobspec.h"

struct mge_optim {
    struct mge_optim_spec spec;
    struct mge_sched_spec sched;
    int64_t total_steps;  /* for cosine */
    int64_t n;            /* floats in the parameter arena */
    float *m;             /* sgd momentum buffer or adam first moment (n), NULL if unused */
    float *v;             /* adam second moment (n), NULL if unused */
    int64_t t;            /* updates applied so far */
};

/*
 * Prepare an optimiser for a parameter arena of @n floats. State buffers are zeroed.
 * Returns MGE_OK or MGE_NOMEM. Free with mge_optim_fini().
 */
int mge_optim_init(struct mge_optim *o, const struct mge_optim_spec *os,
                   const struct mge_sched_spec *ss, int64_t total_steps, int64_t n);
void mge_optim_fini(struct mge_optim *o);
/* Learning rate at 0-based @step under the schedule. */
double mge_optim_lr(const struct mge_optim *o, int64_t step);
/* Apply one update at 0-based @step: params -= f(grads). */
void mge_optim_step(struct mge_optim *o, float *params, const float *grads, int64_t step);
/*
 * The same update in pieces, so that each pack of gradients is applied as soon as its
 * all-reduce is done: mge_optim_step_begin() once per step, then mge_optim_step_range() over
 * ranges [first, first + count) of the arena that together cover it once. Element for element
 * the result equals mge_optim_step()'s (every update is elementwise).
 */
void mge_optim_step_begin(struct mge_optim *o);
void mge_optim_step_range(struct mge_optim *o, float *params, const float *grads, int64_t step,
                          int64_t first, int64_t count);
/* Number of state buffers (0, 1 or 2) and the i-th one's name ("m", "v") and data. */
int mge_optim_n_states(const struct mge_optim *o);
float *mge_optim_state(struct mge_optim *o, int i, const char **name);
/* Bytes of optimiser state. */
size_t mge_optim_state_bytes(const struct mge_optim *o);

#endif
