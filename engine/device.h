/*
 * device.h: the engine's device seam: where the arenas live, how bytes cross between host and
 * device, and which ops table runs the kernels. The planner sizes the parameter, gradient,
 * activation and input arenas; each is one allocation through the graph's device (one
 * cudaMalloc per arena on a GPU). Host code touches device memory only through these copies.
 *
 * Devices: "cpu" (host memory; copies are memcpy or pointer hand-offs); "sim", a simulated
 * accelerator for tests: its memory is host memory mapped PROT_NONE except while one of its
 * kernels or copies runs, so host code that reads or writes device memory outside the seam
 * faults (SIGSEGV). It runs the CPU kernels, so results are bit-identical to "cpu"; and "cuda"
 * (engine/device_cuda.c, in builds with nvcc): device 0 of CUDA_VISIBLE_DEVICES, one cudaMalloc
 * per arena, the kernels of kernels/cuda/.
 * Threads: a device's calls may come from any thread; the sim device's window is one for the
 * whole process (opened by the first kernel or copy in, closed by the last one out).
 */
#ifndef MGE_ENGINE_DEVICE_H
#define MGE_ENGINE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

struct mge_graph;
struct mge_ops_table;

struct mge_device {
    const char *name;                /* "cpu", "sim", "cuda" */
    int host_visible;                /* device memory is ordinary host memory (cpu) */
    int bf16;                        /* runs bf16 graphs (mge_graph_set_bf16: the CPU kernels) */
    const struct mge_ops_table *ops; /* the kernels, reading and writing device memory */
    /* One arena of @bytes (page or 64-byte aligned, contents undefined), or NULL on OOM. */
    void *(*alloc)(size_t bytes);
    /* Release an arena from alloc() (with its size); NULL does nothing. */
    void (*free)(void *p, size_t bytes);
    void (*h2d)(void *dst, const void *src, size_t n); /* host -> device */
    void (*d2h)(void *dst, const void *src, size_t n); /* device -> host */
    void (*d2d)(void *dst, const void *src, size_t n);
    void (*memset)(void *dst, int c, size_t n);
    /* Wait until every kernel and copy issued so far is done (cpu and sim run synchronously). */
    void (*sync)(void);
    /*
     * Run @fn(@ctx), host code that calls this device's optimiser kernels below over device
     * memory (the update, gradient clipping), as the device runs its own kernels.
     */
    void (*kernel)(void (*fn)(void *ctx), void *ctx);
    /*
     * MGE_OK when the device can be used in this process, else an error with the reason in @err
     * (at most @errlen bytes): a cuda device with no GPU. NULL: always usable.
     */
    int (*probe)(char *err, size_t errlen);
    /* The optimiser's kernels over device memory (arguments as mge_cpu_* in kernels/cpu/cpu.h). */
    void (*sgd_update)(float *p, const float *g, float *v, int64_t n, float lr, float mu, float wd,
                       int nesterov);
    void (*adam_update)(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                        float beta1, float beta2, float eps, float wd, int adamw, int64_t t);
    double (*l2_norm)(const float *g, int64_t n);
    void (*scale)(float *out, const float *inp, float s, int64_t n);
    /*
     * Input staging (mge_graph_stage), for devices that are not host-visible: the input arena
     * has two slots that take turns, and each slot a host staging buffer.
     * host_alloc/host_free: memory for the staging buffers (pinned on cuda; NULL: aligned
     * host memory). stage_copy: host -> device into slot @slot's memory; on cuda queued on a
     * copy stream behind the kernels that last read @slot (stage_release), so it overlaps
     * the kernels in flight, and @src must stay untouched until stage_wait(@slot) returns.
     * stage_ready: kernels issued from now on see @slot's copies. stage_release: every kernel
     * that reads @slot has been issued. stage_wait: the host waits for @slot's copies.
     * cpu and sim copy synchronously (stage_copy) and leave the other hooks NULL.
     */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
    void (*stage_copy)(int slot, void *dst, const void *src, size_t n);
    void (*stage_ready)(int slot);
    void (*stage_release)(int slot);
    void (*stage_wait)(int slot);
};

extern const struct mge_device mge_device_cpu;
extern const struct mge_device mge_device_sim;

/*
 * The device named @name ("cpu", "sim", "cuda"), or NULL: an unknown name, or "cuda" in a build
 * without nvcc (mge_device_cuda() says which).
 */
const struct mge_device *mge_device_find(const char *name);
/* The cuda device of this build, or NULL when it was built without nvcc (device_cuda_none.c). */
const struct mge_device *mge_device_cuda(void);

/*
 * Put @g's arenas on @dev (default: mge_device_cpu). Before mge_graph_alloc(); MGE_STATE after.
 * MGE_UNSUPPORTED (and the graph's error message, naming the op) when a node of @g has no
 * kernel in @dev's ops table, or needs what the device lacks (bf16 GEMMs off the CPU).
 * On a device that is not host-visible the graph also gets an input arena: mge_graph_bind()
 * then names host memory that each mge_graph_run() copies in (the current batch's bytes).
 */
int mge_graph_set_device(struct mge_graph *g, const struct mge_device *dev);
const struct mge_device *mge_graph_device(const struct mge_graph *g);

/*
 * Pinned, double-buffered input staging (devices that are not host-visible; elsewhere it does
 * nothing and returns MGE_OK): copy the inputs bound now, at the current batch size, into the
 * input slot the running batch does not use, through the device's staging hooks (on cuda: a
 * pinned buffer, then an asynchronous copy on a copy stream that overlaps the kernels still
 * running). The next mge_graph_run() computes on that slot and copies nothing; the bound host
 * memory may be reused as soon as this returns. A bind or a new batch size afterwards drops
 * the staged copy (the run then stages what is bound, synchronously: every run goes through
 * this path). MGE_STATE before mge_graph_alloc() or with an input unbound.
 */
int mge_graph_stage(struct mge_graph *g);
/* 1 if mge_graph_stage() left inputs for the next run to consume. */
int mge_graph_is_staged(const struct mge_graph *g);

/*
 * Copy @bytes between value @v's device memory (from its first byte) and host memory @host.
 * MGE_RANGE if @bytes exceeds the value's planned size; MGE_STATE before mge_graph_alloc().
 */
int mge_value_read(const struct mge_graph *g, int v, void *host, size_t bytes);
int mge_value_write(struct mge_graph *g, int v, const void *host, size_t bytes);
/*
 * Host-readable bytes of value @v: on a host-visible device its data itself (no copy), else
 * @scratch (at least @bytes) after a device -> host copy of its first @bytes.
 */
const void *mge_value_host(const struct mge_graph *g, int v, void *scratch, size_t bytes);

#endif
