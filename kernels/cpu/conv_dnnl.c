/*
 * conv_dnnl.c: 2-D convolution through oneDNN 2.6 primitives on plain NCHW/KCRS memory. The only
 * file that knows oneDNN's convolution API (oneDNN 3 changed it); conv.c calls it and falls back
 * to im2col when a primitive cannot be made.
 */
#include <dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_int.h"
#include "kernels/cpu/dnnl_int.h"

#define CACHE_SIZE 32 /* conv geometries alive at once; LeNet has 2, a ResNet about 20 */
#define ALIGN 64

enum { FWD, BWD_DATA, BWD_WEIGHTS, N_PRIM };
enum { M_SRC, M_WEI, M_BIAS, M_DST, M_PAD, N_MEM }; /* memory objects, by role */

/*
 * One conv geometry's primitives, made once and kept for the life of the process. Memory objects
 * are made once too and pointed at the caller's buffers on each call (dnnl_memory_set_data_handle),
 * so a call allocates nothing; @lock serialises the calls that share them.
 */
struct entry {
    int key[10]; /* N C H W K R S stride pad threads; key[0] == 0: unused */
    int ok;      /* 1: all three primitives exist; 0: creation failed */
    dnnl_primitive_t prim[N_PRIM];
    dnnl_memory_t mem[N_PRIM][N_MEM];
    size_t pad_bytes; /* the largest user scratchpad of the three */
    float *zero_bias; /* (K) zeros, for forward calls without a bias */
    pthread_mutex_t lock;
};

static struct entry g_cache[CACHE_SIZE];
static pthread_mutex_t g_cache_lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;

static void make_key(const struct mge_cpu_conv *cv, int *key)
{
    int k[10] = {cv->N, cv->C, cv->H,      cv->W,   cv->K,
                 cv->R, cv->S, cv->stride, cv->pad, cv->slots > 0 ? cv->slots : 1};
    memcpy(key, k, sizeof(k));
}

static void entry_fini(struct entry *e)
{
    for (int p = 0; p < N_PRIM; p++) {
        if (e->prim[p])
            dnnl_primitive_destroy(e->prim[p]);
        for (int m = 0; m < N_MEM; m++)
            if (e->mem[p][m])
                dnnl_memory_destroy(e->mem[p][m]);
    }
    free(e->zero_bias);
    memset(e->prim, 0, sizeof(e->prim));
    memset(e->mem, 0, sizeof(e->mem));
    e->zero_bias = NULL;
}

/* Make primitive @p from @desc and its memory objects (roles in @md, NULL = absent). */
static int make_prim(struct entry *e, int p, const void *desc, dnnl_primitive_attr_t attr,
                     const_dnnl_primitive_desc_t hint, const dnnl_memory_desc_t *const *md)
{
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_primitive_desc_create(&pd, desc, attr, g_engine, hint) != dnnl_success)
        return -1;
    int rc = -1;
    const dnnl_memory_desc_t *pad = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t pad_bytes = pad ? dnnl_memory_desc_get_size(pad) : 0;
    if (dnnl_primitive_create(&e->prim[p], pd) != dnnl_success)
        goto out_destroy_pd;
    for (int m = 0; m < M_PAD; m++)
        if (md[m] &&
            dnnl_memory_create(&e->mem[p][m], md[m], g_engine, DNNL_MEMORY_NONE) != dnnl_success)
            goto out_destroy_pd;
    if (pad_bytes &&
        dnnl_memory_create(&e->mem[p][M_PAD], pad, g_engine, DNNL_MEMORY_NONE) != dnnl_success)
        goto out_destroy_pd;
    if (pad_bytes > e->pad_bytes)
        e->pad_bytes = pad_bytes;
    rc = 0;
out_destroy_pd:
    dnnl_primitive_desc_destroy(pd);
    return rc;
}

/*
 * oneDNN (OpenMP build) sizes its work split and scratchpad by omp_get_max_threads() when a
 * primitive is made, so make and run every primitive with the slot count the caller planned for:
 * equal slots, equal results.
 */
static int entry_make(struct entry *e, const struct mge_cpu_conv *cv)
{
    dnnl_dims_t src = {cv->N, cv->C, cv->H, cv->W}, wei = {cv->K, cv->C, cv->R, cv->S};
    dnnl_dims_t dst = {cv->N, cv->K, cv->P, cv->Q}, bia = {cv->K};
    dnnl_dims_t strides = {cv->stride, cv->stride}, pad_l = {cv->pad, cv->pad};
    /* the bottom/right padding that makes oneDNN's output size equal P, Q */
    dnnl_dims_t pad_r = {(cv->P - 1) * cv->stride + cv->R - cv->H - cv->pad,
                         (cv->Q - 1) * cv->stride + cv->S - cv->W - cv->pad};
    dnnl_memory_desc_t msrc, mwei, mdst, mbia;
    dnnl_convolution_desc_t fd, bdd, bwd;
    dnnl_primitive_attr_t attr = NULL;
    int rc = -1;
    e->zero_bias = calloc((size_t)cv->K, sizeof(float));
    if (!e->zero_bias)
        return -1;
    if (dnnl_memory_desc_init_by_tag(&msrc, 4, src, dnnl_f32, dnnl_nchw) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&mwei, 4, wei, dnnl_f32, dnnl_oihw) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&mdst, 4, dst, dnnl_f32, dnnl_nchw) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&mbia, 1, bia, dnnl_f32, dnnl_x) != dnnl_success)
        return -1;
    if (dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct,
                                           &msrc, &mwei, &mbia, &mdst, strides, pad_l,
                                           pad_r) != dnnl_success ||
        dnnl_convolution_backward_data_desc_init(&bdd, dnnl_convolution_direct, &msrc, &mwei, &mdst,
                                                 strides, pad_l, pad_r) != dnnl_success ||
        dnnl_convolution_backward_weights_desc_init(&bwd, dnnl_convolution_direct, &msrc, &mwei,
                                                    &mbia, &mdst, strides, pad_l,
                                                    pad_r) != dnnl_success)
        return -1;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success)
        return -1;
    if (dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) != dnnl_success)
        goto out_destroy_attr;
    /* the backward pds want a forward pd as hint; oneDNN only reads it, so make one here */
    dnnl_primitive_desc_t hint = NULL;
    if (dnnl_primitive_desc_create(&hint, &fd, attr, g_engine, NULL) != dnnl_success)
        goto out_destroy_attr;
    const dnnl_memory_desc_t *fmd[N_MEM] = {&msrc, &mwei, &mbia, &mdst, NULL};
    const dnnl_memory_desc_t *dmd[N_MEM] = {&msrc, &mwei, NULL, &mdst, NULL};
    if (make_prim(e, FWD, &fd, attr, NULL, fmd) != 0 ||
        make_prim(e, BWD_DATA, &bdd, attr, hint, dmd) != 0 ||
        make_prim(e, BWD_WEIGHTS, &bwd, attr, hint, fmd) != 0)
        goto out_destroy_hint;
    rc = 0;
out_destroy_hint:
    dnnl_primitive_desc_destroy(hint);
out_destroy_attr:
    dnnl_primitive_attr_destroy(attr);
    return rc;
}

/* The entry for @cv, made on first use; NULL if oneDNN cannot do this conv. */
static struct entry *entry_get(const struct mge_cpu_conv *cv)
{
    if (mge__dnnl_get(&g_engine, &g_stream) != 0)
        return NULL;
    int key[10];
    make_key(cv, key);
    struct entry *e = NULL;
    pthread_mutex_lock(&g_cache_lock);
    for (int i = 0; i < CACHE_SIZE && !e; i++)
        if (g_cache[i].key[0] && memcmp(g_cache[i].key, key, sizeof(key)) == 0)
            e = &g_cache[i];
    for (int i = 0; i < CACHE_SIZE && !e; i++)
        if (!g_cache[i].key[0])
            e = &g_cache[i];
    if (e && !e->key[0]) {
        /* NEEDSWORK: a full cache leaves new geometries to im2col; evict when models need it */
        memcpy(e->key, key, sizeof(key));
        pthread_mutex_init(&e->lock, NULL);
        int old = omp_get_max_threads();
        omp_set_num_threads(key[9]);
        e->ok = entry_make(e, cv) == 0;
        omp_set_num_threads(old);
        if (!e->ok)
            entry_fini(e);
    }
    pthread_mutex_unlock(&g_cache_lock);
    return e && e->ok ? e : NULL;
}

/* Scratch: [oneDNN scratchpad][dx (N,C,H,W)][dw (K,C,R,S)][db (K)], each part 64-byte aligned. */
struct layout {
    size_t pad, dx, dw, db, bytes; /* byte offsets from the aligned base; bytes incl. alignment */
};

static size_t up(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

static struct layout layout_of(const struct entry *e, const struct mge_cpu_conv *cv)
{
    struct layout L;
    L.pad = 0;
    L.dx = up(e->pad_bytes);
    L.dw = L.dx + up((size_t)cv->N * cv->C * cv->H * cv->W * sizeof(float));
    L.db = L.dw + up((size_t)cv->K * cv->C * cv->R * cv->S * sizeof(float));
    L.bytes = L.db + up((size_t)cv->K * sizeof(float)) + ALIGN;
    return L;
}

size_t mge__conv_dnnl_scratch_bytes(const struct mge_cpu_conv *cv)
{
    struct entry *e = entry_get(cv);
    return e ? layout_of(e, cv).bytes : 0;
}

static char *aligned(void *scratch)
{
    return (char *)(((uintptr_t)scratch + ALIGN - 1) / ALIGN * ALIGN);
}

/* Run primitive @p with these buffers (NULL for roles it does not have); 0 or -1. */
static int run(struct entry *e, int p, const int *args, void *const *ptr, int n, char *pad,
               int threads)
{
    dnnl_exec_arg_t ea[N_MEM];
    int na = 0;
    for (int i = 0; i < n; i++) {
        dnnl_memory_t m = e->mem[p][i];
        if (!m || !ptr[i])
            continue;
        dnnl_memory_set_data_handle(m, ptr[i]);
        ea[na].arg = args[i];
        ea[na].memory = m;
        na++;
    }
    if (e->mem[p][M_PAD]) {
        dnnl_memory_set_data_handle(e->mem[p][M_PAD], pad);
        ea[na].arg = DNNL_ARG_SCRATCHPAD;
        ea[na].memory = e->mem[p][M_PAD];
        na++;
    }
    int old = omp_get_max_threads();
    omp_set_num_threads(threads);
    int rc = dnnl_primitive_execute(e->prim[p], g_stream, na, ea) == dnnl_success &&
                     dnnl_stream_wait(g_stream) == dnnl_success
                 ? 0
                 : -1;
    omp_set_num_threads(old);
    return rc;
}

int mge__conv_dnnl_forward(const struct mge_cpu_conv *cv, float *out, const float *inp,
                           const float *w, const float *bias, void *scratch)
{
    struct entry *e = entry_get(cv);
    if (!e)
        return -1;
    struct layout L = layout_of(e, cv);
    char *base = aligned(scratch);
    static const int args[N_MEM - 1] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS,
                                        DNNL_ARG_DST};
    void *ptr[N_MEM - 1] = {(void *)inp, (void *)w, bias ? (void *)bias : e->zero_bias, out};
    pthread_mutex_lock(&e->lock);
    int rc = run(e, FWD, args, ptr, N_MEM - 1, base + L.pad, e->key[9]);
    pthread_mutex_unlock(&e->lock);
    return rc;
}

/*
 * oneDNN overwrites its outputs, so with @acc the results land in scratch and are added after
 * both passes succeeded (a failed call then leaves the outputs as they were, for the fallback);
 * without, dinp and dw are written in place.
 */
int mge__conv_dnnl_backward(const struct mge_cpu_conv *cv, float *dinp, float *dw, float *dbias,
                            const float *dout, const float *inp, const float *w, void *scratch,
                            int acc)
{
    struct entry *e = entry_get(cv);
    if (!e)
        return -1;
    struct layout L = layout_of(e, cv);
    char *base = aligned(scratch);
    int rc = 0, nt = e->key[9];
    size_t nx = (size_t)cv->N * cv->C * cv->H * cv->W, nw = (size_t)cv->K * cv->C * cv->R * cv->S;
    float *dx = acc ? (float *)(base + L.dx) : dinp, *dwt = acc ? (float *)(base + L.dw) : dw;
    float *dbt = (float *)(base + L.db);
    pthread_mutex_lock(&e->lock);
    if (dinp) {
        static const int args[N_MEM - 1] = {DNNL_ARG_DIFF_SRC, DNNL_ARG_WEIGHTS, 0,
                                            DNNL_ARG_DIFF_DST};
        void *ptr[N_MEM - 1] = {dx, (void *)w, NULL, (void *)dout};
        rc = run(e, BWD_DATA, args, ptr, N_MEM - 1, base + L.pad, nt);
    }
    if (rc == 0 && dw) {
        static const int args[N_MEM - 1] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_WEIGHTS, DNNL_ARG_DIFF_BIAS,
                                            DNNL_ARG_DIFF_DST};
        void *ptr[N_MEM - 1] = {(void *)inp, dwt, dbt, (void *)dout};
        rc = run(e, BWD_WEIGHTS, args, ptr, N_MEM - 1, base + L.pad, nt);
    }
    /* our own dbias even when oneDNN made one: it must not depend on whether dw is wanted */
    if (rc == 0 && dbias)
        mge__conv_bias_grad(cv, dbt, dout, 0);
    pthread_mutex_unlock(&e->lock);
    if (rc != 0)
        return rc;
    if (dinp && acc)
        mge_cpu_axpy(dinp, dx, 1.0f, (int64_t)nx);
    if (dw && acc)
        mge_cpu_axpy(dw, dwt, 1.0f, (int64_t)nw);
    if (dbias)
        for (int k = 0; k < cv->K; k++)
            dbias[k] = acc ? dbias[k] + dbt[k] : dbt[k];
    return 0;
}
