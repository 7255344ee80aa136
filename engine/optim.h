/* optim.h: optimisers over the parameter arena (SGD, Adam, AdamW) and learning-rate schedules. */
#ifndef MGE_ENGINE_OPTIM_H
#define MGE_ENGINE_OPTIM_H

#include <stdint.h>

#include "common/jobspec.h"

struct mge_device;

struct mge_optim {
    struct mge_optim_spec spec;
    struct mge_sched_spec sched;
    int64_t total_steps;  /* for cosine */
    int64_t n;            /* floats in the parameter arena */
    const struct mge_device *dev; /* where m and v live (engine/device.h) */
    float *m;             /* sgd momentum buffer or adam first moment (n), NULL if unused */
    float *v;             /* adam second moment (n), NULL if unused */
    int64_t t;            /* updates applied so far */
    struct mge_optim_span *no_decay; /* ranges without weight decay, sorted, disjoint */
    int n_no_decay, cap_no_decay;
};

struct mge_optim_span {
    int64_t first, count; /* floats of the arena */
};

/*
 * Prepare an optimiser for a parameter arena of @n floats. State buffers are zeroed.
 * Returns MGE_OK or MGE_NOMEM. Free with mge_optim_fini().
 */
int mge_optim_init(struct mge_optim *o, const struct mge_optim_spec *os,
                   const struct mge_sched_spec *ss, int64_t total_steps, int64_t n);
/*
 * The same with the state buffers on @dev (one allocation each, zeroed through the device):
 * the update functions below then read and write device memory through @dev's optimiser
 * kernels (on sim they must run inside mge_device.kernel).
 */
int mge_optim_init_on(struct mge_optim *o, const struct mge_optim_spec *os,
                      const struct mge_sched_spec *ss, int64_t total_steps, int64_t n,
                      const struct mge_device *dev);
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
/*
 * Exempt arena floats [first, first + count) from weight decay (a bias or a norm weight, as
 * PyTorch's param groups with weight_decay 0 do). Spans must not overlap; any order.
 * Returns MGE_OK, MGE_INVAL for a span outside the arena or overlapping one, or MGE_NOMEM.
 */
int mge_optim_exclude_decay(struct mge_optim *o, int64_t first, int64_t count);
/*
 * Gradient clipping by global norm (torch.nn.utils.clip_grad_norm_): the L2 norm of all @n
 * floats of @grads, and, when @max_norm > 0, grads *= min(1, max_norm / (norm + 1e-6)) in
 * place. Returns the norm before clipping. It must see the whole reduced gradient, so callers
 * that update in ranges clip first and update after every range has arrived.
 */
double mge_optim_clip(float *grads, int64_t n, double max_norm);
/* The same over device memory of @dev (through its l2_norm and scale kernels). */
double mge_optim_clip_on(const struct mge_device *dev, float *grads, int64_t n, double max_norm);
/* Number of state buffers (0, 1 or 2) and the i-th one's name ("m", "v") and data. */
int mge_optim_n_states(const struct mge_optim *o);
float *mge_optim_state(struct mge_optim *o, int i, const char **name);
/* Bytes of optimiser state. */
size_t mge_optim_state_bytes(const struct mge_optim *o);

#endif
