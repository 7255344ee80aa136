/*
 * comm.h: collectives for data-parallel training (all-reduce, broadcast, all-gather, barrier,
 * and an asynchronous all-reduce) behind one interface, with three backends: `local` (one
 * rank, no library), `mpi` (Open MPI, host memory) and `nccl` (GPU ranks, device memory).
 *
 * Life of a communicator: mge_comm_open() -> collectives -> mge_comm_close(); on a failure of
 * any rank's job, mge_comm_abort() takes every rank down (Open MPI 4.1 cannot survive a dead
 * peer: the others would spin in their next collective forever).
 *
 * Ordering: every rank must issue the same collectives in the same order (MPI's rule). Calls
 * run in issue order: a blocking call made while asynchronous all-reduces are in flight runs
 * after them. Buffers are host memory for local and mpi, device memory for nccl.
 *
 * Threads: a communicator is used by one thread (the training loop). Backends whose library
 * calls block (mpi) own a communication thread that runs the collectives one at a time after
 * init (MPI_THREAD_SERIALIZED; a caller waiting for a collective the thread has not picked up
 * yet runs it itself), so an all-reduce overlaps whatever the caller does meanwhile. With
 * one rank there is nothing to overlap and collectives run inline (no thread).
 */
#ifndef MGE_ENGINE_COMM_H
#define MGE_ENGINE_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/jobspec.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mge_comm;

/* Element types of all-reduce (sum). */
enum mge_comm_dtype { MGE_COMM_F32, MGE_COMM_F64, MGE_COMM_I64 };

/* Where this process sits in a launched job, as the launcher's environment says. */
struct mge_comm_env {
    int launched;   /* 1 if mpirun/srun/a worker set the variables below */
    int rank, size; /* 0 and 1 when not launched */
    int local_rank; /* rank among the ranks of this host (GPU choice); 0 when not known */
    /* nccl: 1 to run on the CUDA device this process already made current (the cuda
     * device's, engine/device.h); 0: device local_rank % devices. Never set by the reader. */
    int gpu_current;
};

/*
 * Read the launcher's variables: OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK} (Open MPI's mpirun),
 * PMI_RANK/PMI_SIZE (srun --mpi=pmi2, Hydra), PMIX_RANK with SLURM_PROCID/SLURM_NTASKS/
 * SLURM_LOCALID (srun --mpi=pmix), or MGE_RANK/MGE_WORLD_SIZE/MGE_LOCAL_RANK (set by hand or
 * by mge-worker). Never fails: without them the process is rank 0 of 1.
 */
void mge_comm_env_read(struct mge_comm_env *env);

/*
 * The backend a job runs on: @want as the spec says; MGE_BACKEND_AUTO picks local for one
 * unlaunched-or-single rank, nccl on gpu and mpi on cpu otherwise.
 */
enum mge_backend mge_comm_backend_resolve(enum mge_backend want, enum mge_device_kind device,
                                          const struct mge_comm_env *env);
/* "local", "mpi", "nccl" ("auto" for MGE_BACKEND_AUTO). */
const char *mge_comm_backend_name(enum mge_backend b);
/* 1 if this build has @b (local always; mpi with Open MPI; nccl with CUDA and NCCL). */
int mge_comm_backend_available(enum mge_backend b);

/*
 * Open a communicator on backend @b (not AUTO: resolve it first) for the job @env describes.
 * local: no library, size must be 1. mpi: MPI_Init_thread (SERIALIZED) and a communication
 * thread; the glibc allocator is told not to hand large buffers to mmap (M_MMAP_MAX 0), as
 * Open MPI's temporary buffers otherwise cost fresh page faults on every call (10x slower
 * above 32 MiB). nccl: the unique id goes from rank 0 to the others through MGE_NCCL_ID (hex,
 * set by a coordinator) or else an MPI broadcast; device = local_rank % devices.
 * Returns MGE_OK and *@out (free with mge_comm_close), or MGE_UNSUPPORTED (backend not built
 * in, or local with size > 1), MGE_COMM (the library failed), MGE_DEVICE (no GPU), MGE_NOMEM;
 * then @err holds one line that says why and *@out is NULL.
 */
int mge_comm_open(struct mge_comm **out, enum mge_backend b, const struct mge_comm_env *env,
                  char *err, size_t errlen);

/* Finalize and free; waits for collectives in flight. NULL does nothing. */
void mge_comm_close(struct mge_comm *c);

/*
 * A rank failed: end the whole job now (MPI_Abort with @code: every rank exits, and mpirun
 * exits non-zero; nccl: ncclCommAbort first, which frees the communicator's GPU resources
 * and ends its kernels, then the MPI abort or exit(@code)). Local: returns. Call it instead of
 * mge_comm_close() on a failure path of a multi-rank job, since peers would wait in their next
 * collective forever.
 */
void mge_comm_abort(struct mge_comm *c, int code);

/* 1 if collectives take device memory (nccl: buffers are CUDA device pointers), else 0. */
int mge_comm_on_device(const struct mge_comm *c);

int mge_comm_rank(const struct mge_comm *c);
int mge_comm_size(const struct mge_comm *c);
enum mge_backend mge_comm_backend(const struct mge_comm *c);

/* ---- blocking collectives: MGE_OK or MGE_COMM (the error is logged) ---- */

/* Sum @count elements of @buf over all ranks, in place. */
int mge_comm_allreduce(struct mge_comm *c, void *buf, size_t count, enum mge_comm_dtype dt);
/* Copy @bytes of @buf from rank @root to every rank. */
int mge_comm_broadcast(struct mge_comm *c, void *buf, size_t bytes, int root);
/* Rank r's @bytes of @send land at @recv + r * @bytes on every rank (@recv holds size*bytes). */
int mge_comm_allgather(struct mge_comm *c, const void *send, size_t bytes, void *recv);
int mge_comm_barrier(struct mge_comm *c);

/* ---- asynchronous all-reduce ---- */

/* When one collective ran (CLOCK_MONOTONIC seconds, the clock of mge_comm_now()). */
struct mge_comm_timing {
    double start, end; /* on the communication thread or stream */
};

/*
 * Start summing @count elements of @buf over all ranks, in place; *@ticket names it for
 * mge_comm_wait(). Tickets increase by one per collective, so waiting for ticket t also means
 * every earlier collective is done. @buf must stay untouched until the wait returns.
 * Returns MGE_OK, or the error of an earlier collective (then nothing was started).
 * Thread: the communicator's thread; returns at once (the work queue holds 256 collectives,
 * after which it waits for room).
 */
int mge_comm_allreduce_start(struct mge_comm *c, void *buf, size_t count, enum mge_comm_dtype dt,
                             uint64_t *ticket);
/*
 * As mge_comm_allreduce_start(), for a collective the caller waits for next: it does not wake
 * the communication thread, so unless that thread is busy and reaches it first, it runs on
 * the waiting thread and no hand-off between threads lies on the critical path.
 */
int mge_comm_allreduce_queue(struct mge_comm *c, void *buf, size_t count, enum mge_comm_dtype dt,
                             uint64_t *ticket);
/*
 * Wait until collective @ticket is done. @timing (may be NULL) gets when it ran, if it is one
 * of the last 256 collectives. Returns MGE_OK or MGE_COMM if it (or one before it) failed.
 */
int mge_comm_wait(struct mge_comm *c, uint64_t ticket, struct mge_comm_timing *timing);

/* CLOCK_MONOTONIC in seconds: the clock of struct mge_comm_timing. */
double mge_comm_now(void);

/* ---- gradient packs: all-reduce a gradient arena in contiguous slices, no copies ---- */

/*
 * Packs cut one float arena (the gradient arena, laid out in the order backward finishes
 * gradients) into contiguous slices at gradient boundaries: the first slice at least
 * @first_bytes, the others at least @pack_bytes (or what is left). Each pack's all-reduce
 * starts (mge_comm_packs_ready) as soon as the arena's prefix up to its end is final, and the
 * optimiser waits for pack i alone (mge_comm_packs_wait) before it updates that slice.
 */
struct mge_comm_packs;

struct mge_comm_pack {
    size_t first, count;           /* floats [first, first + count) of the arena */
    uint64_t ticket;               /* this step's all-reduce, 0 before it started */
    double ready_at;               /* when it became ready (mge_comm_now) */
    struct mge_comm_timing timing; /* when its all-reduce ran (after the wait) */
};

/*
 * Plan packs over @arena (@arena_bytes, a multiple of 4) for @c. @cuts: @n_cuts byte offsets
 * where a pack may end (gradient boundaries, any order; arena_bytes is always one).
 * Ownership: *@out is the caller's (mge_comm_packs_free); @c and @arena are borrowed and must
 * outlive it. Returns MGE_OK, MGE_INVAL (a cut outside the arena or not float-aligned),
 * MGE_NOMEM.
 */
int mge_comm_packs_new(struct mge_comm_packs **out, struct mge_comm *c, float *arena,
                       size_t arena_bytes, const size_t *cuts, int n_cuts, size_t first_bytes,
                       size_t pack_bytes);
void mge_comm_packs_free(struct mge_comm_packs *p);
int mge_comm_packs_count(const struct mge_comm_packs *p);
const struct mge_comm_pack *mge_comm_packs_get(const struct mge_comm_packs *p, int i);
/* A new step: no pack started yet. */
void mge_comm_packs_begin(struct mge_comm_packs *p);
/*
 * The first @ready_bytes of the arena are final: start every pack that ends inside them.
 * Fits mge_graph_set_grad_hook(g, mge_comm_packs_ready_hook, p). Errors are kept for the
 * next mge_comm_packs_wait() (a hook cannot return one).
 */
void mge_comm_packs_ready(struct mge_comm_packs *p, size_t ready_bytes);
void mge_comm_packs_ready_hook(void *p, size_t ready_bytes);
/* Wait for pack @i's all-reduce of this step (every pack must have started). */
int mge_comm_packs_wait(struct mge_comm_packs *p, int i);

/* ---- exact sums: fixed point, for reductions whose bits must not depend on order ---- */

/*
 * Deterministic data parallelism adds each gradient element as round(x * 2^40) into an int64
 * accumulator: integer sums are exact, so any order of the same terms, split over any ranks and
 * then summed with an MGE_COMM_I64 all-reduce, gives the same bits. Resolution 2^-40 (9.1e-13),
 * below a float's rounding for any |x| above ~1e-5; range 2^22 / terms (about 350000 for 12
 * terms), checked on every addend so that no partial sum can leave int64 in any order.
 */
#define MGE_EXACT_FRAC_BITS 40

/* Largest |x| one of at most @terms addends of an element may have. */
double mge_exact_limit(int terms);
/*
 * @acc[i] += round(@x[i] * 2^40) for i in [0, @n); each element gets at most @terms addends
 * over the whole sum (all ranks). Returns MGE_OK, or MGE_RANGE when some |x| exceeds
 * mge_exact_limit(@terms) or is not finite: then *@bad is the first such index and @acc is
 * garbage (fail the step: the sum would have wrapped). Thread: any; touches only its arguments.
 */
int mge_exact_add_f32(int64_t *acc, const float *x, size_t n, int terms, size_t *bad);
/* One double addend: *@acc += round(@x * 2^40); MGE_RANGE (acc unchanged) as above. */
int mge_exact_add_f64(int64_t *acc, double x, int terms);
/* @out[i] = the float nearest @acc[i] * 2^-40 (through double), for i in [0, @n). */
void mge_exact_to_f32(float *out, const int64_t *acc, size_t n);
/* @acc * 2^-40 as a double (exact below 2^53 units). */
double mge_exact_to_f64(int64_t acc);

#ifdef __cplusplus
}
#endif
#endif
