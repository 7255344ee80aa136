/*
 * conv_bf16.c: mixed-precision 2-D convolution (mge_cpu_conv2d_*_bf16) through oneDNN 2.6: the
 * convolution primitives pick their own blocked layouts (format "any"), and reorders carry our fp32
 * NCHW/KCRS tensors into them, rounding to bf16 on the way in (to nearest, ties to even) and
 * bringing fp32 results back. On plain NCHW oneDNN's bf16 convolution is an im2col GEMM, slower
 * than our fp32 direct kernel; in its own layouts it runs its AVX-512 BF16 kernels. conv.c calls
 * it and falls back to im2col over mge_cpu_gemm_bf16 when a primitive cannot be made.
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
#define MAX_PORTS 4

enum { FWD, BWD_DATA, BWD_WEIGHTS, N_PRIM };

/*
 * One tensor of one primitive: @user is our fp32 plain memory (pointed at the caller's buffer
 * on each call), @inner what the primitive reads or writes (the same object when the layouts
 * agree, else a buffer in scratch at @off), and @reorder the copy between them.
 */
struct port {
    int arg; /* DNNL_ARG_* of the convolution */
    int out; /* the primitive writes it (reorder inner -> user after) */
    dnnl_memory_t user, inner;
    dnnl_primitive_t reorder; /* NULL: inner is user */
    size_t off;               /* bytes from the aligned scratch base, when reordered */
};

struct prim {
    dnnl_primitive_t conv;
    struct port port[MAX_PORTS];
    int n_ports;
    dnnl_memory_t pad; /* scratchpad, or NULL */
};

struct entry {
    int key[10]; /* N C H W K R S stride pad threads; key[0] == 0: unused */
    int ok;
    struct prim p[N_PRIM];
    size_t bytes;      /* scratch the calls need, alignment included */
    size_t dx, dw, db; /* offsets of the fp32 temporaries for accumulation and dbias */
    float *zero_bias;  /* (K) zeros, for forward calls without a bias */
    pthread_mutex_t lock;
};

static struct entry g_cache[CACHE_SIZE];
static pthread_mutex_t g_cache_lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;

static size_t up(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

static void entry_fini(struct entry *e)
{
    for (int p = 0; p < N_PRIM; p++) {
        struct prim *pr = &e->p[p];
        if (pr->conv)
            dnnl_primitive_destroy(pr->conv);
        if (pr->pad)
            dnnl_memory_destroy(pr->pad);
        for (int i = 0; i < pr->n_ports; i++) {
            struct port *po = &pr->port[i];
            if (po->reorder)
                dnnl_primitive_destroy(po->reorder);
            if (po->inner && po->inner != po->user)
                dnnl_memory_destroy(po->inner);
            if (po->user)
                dnnl_memory_destroy(po->user);
        }
    }
    free(e->zero_bias);
    memset(e->p, 0, sizeof(e->p));
    e->zero_bias = NULL;
}

/*
 * Add a port for @arg to @pr: @user is our layout, @what/@idx the query for the primitive's.
 * Its buffer, when it needs one, goes at *@bytes (advanced). 0 or -1.
 */
static int port_add(struct prim *pr, const_dnnl_primitive_desc_t pd, int arg, int out,
                    const dnnl_memory_desc_t *user, dnnl_query_t what, int idx, size_t *bytes)
{
    struct port *po = &pr->port[pr->n_ports++];
    const dnnl_memory_desc_t *inner = dnnl_primitive_desc_query_md(pd, what, idx);
    po->arg = arg;
    po->out = out;
    if (!inner || dnnl_memory_create(&po->user, user, g_engine, DNNL_MEMORY_NONE) != dnnl_success)
        return -1;
    if (dnnl_memory_desc_equal(inner, user)) {
        po->inner = po->user;
        return 0;
    }
    if (dnnl_memory_create(&po->inner, inner, g_engine, DNNL_MEMORY_NONE) != dnnl_success)
        return -1;
    dnnl_primitive_desc_t rpd = NULL;
    if (dnnl_reorder_primitive_desc_create(&rpd, out ? inner : user, g_engine, out ? user : inner,
                                           g_engine, NULL) != dnnl_success)
        return -1;
    int rc = dnnl_primitive_create(&po->reorder, rpd) == dnnl_success ? 0 : -1;
    dnnl_primitive_desc_destroy(rpd);
    po->off = *bytes;
    *bytes += up(dnnl_memory_desc_get_size(inner));
    return rc;
}

/* The convolution of @pr from @desc and its scratchpad; @pd is kept for the ports' queries. */
static int prim_make(struct prim *pr, const void *desc, dnnl_primitive_attr_t attr,
                     const_dnnl_primitive_desc_t hint, dnnl_primitive_desc_t *pd, size_t *pad_bytes)
{
    if (dnnl_primitive_desc_create(pd, desc, attr, g_engine, hint) != dnnl_success)
        return -1;
    if (dnnl_primitive_create(&pr->conv, *pd) != dnnl_success)
        return -1;
    const dnnl_memory_desc_t *pad = dnnl_primitive_desc_query_md(*pd, dnnl_query_scratchpad_md, 0);
    size_t n = pad ? dnnl_memory_desc_get_size(pad) : 0;
    if (n && dnnl_memory_create(&pr->pad, pad, g_engine, DNNL_MEMORY_NONE) != dnnl_success)
        return -1;
    if (n > *pad_bytes)
        *pad_bytes = n;
    return 0;
}

/*
 * Primitives on the slot count the caller planned for (oneDNN sizes its work split by
 * omp_get_max_threads() at creation): equal slots, equal results. Scratch: [scratchpad][dx]
 * [dw][db][the ports' buffers].
 */
static int entry_make(struct entry *e, const struct mge_cpu_conv *cv)
{
    dnnl_dims_t src = {cv->N, cv->C, cv->H, cv->W}, wei = {cv->K, cv->C, cv->R, cv->S};
    dnnl_dims_t dst = {cv->N, cv->K, cv->P, cv->Q}, bia = {cv->K};
    dnnl_dims_t strides = {cv->stride, cv->stride}, pad_l = {cv->pad, cv->pad};
    dnnl_dims_t pad_r = {(cv->P - 1) * cv->stride + cv->R - cv->H - cv->pad,
                         (cv->Q - 1) * cv->stride + cv->S - cv->W - cv->pad};
    dnnl_memory_desc_t usrc, uwei, udst, ubia, asrc_b, awei_b, adst_b, asrc_f, awei_f, adst_f;
    dnnl_convolution_desc_t fd, bdd, bwd;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd[N_PRIM] = {NULL, NULL, NULL};
    size_t pad_bytes = 0, bytes = 0;
    int rc = -1;
    e->zero_bias = calloc((size_t)cv->K, sizeof(float));
    if (!e->zero_bias)
        return -1;
    /* ours (u*: fp32, plain) and the primitives' (a*: any layout; bf16 in, fp32 out) */
    if (dnnl_memory_desc_init_by_tag(&usrc, 4, src, dnnl_f32, dnnl_nchw) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&uwei, 4, wei, dnnl_f32, dnnl_oihw) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&udst, 4, dst, dnnl_f32, dnnl_nchw) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&ubia, 1, bia, dnnl_f32, dnnl_x) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&asrc_b, 4, src, dnnl_bf16, dnnl_format_tag_any) !=
            dnnl_success ||
        dnnl_memory_desc_init_by_tag(&awei_b, 4, wei, dnnl_bf16, dnnl_format_tag_any) !=
            dnnl_success ||
        dnnl_memory_desc_init_by_tag(&adst_b, 4, dst, dnnl_bf16, dnnl_format_tag_any) !=
            dnnl_success ||
        dnnl_memory_desc_init_by_tag(&asrc_f, 4, src, dnnl_f32, dnnl_format_tag_any) !=
            dnnl_success ||
        dnnl_memory_desc_init_by_tag(&awei_f, 4, wei, dnnl_f32, dnnl_format_tag_any) !=
            dnnl_success ||
        dnnl_memory_desc_init_by_tag(&adst_f, 4, dst, dnnl_f32, dnnl_format_tag_any) !=
            dnnl_success)
        return -1;
    if (dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct,
                                           &asrc_b, &awei_b, &ubia, &adst_f, strides, pad_l,
                                           pad_r) != dnnl_success ||
        dnnl_convolution_backward_data_desc_init(&bdd, dnnl_convolution_direct, &asrc_f, &awei_b,
                                                 &adst_b, strides, pad_l, pad_r) != dnnl_success ||
        dnnl_convolution_backward_weights_desc_init(&bwd, dnnl_convolution_direct, &asrc_b, &awei_f,
                                                    &ubia, &adst_b, strides, pad_l,
                                                    pad_r) != dnnl_success)
        return -1;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success)
        return -1;
    if (dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) != dnnl_success)
        goto out_destroy;
    if (prim_make(&e->p[FWD], &fd, attr, NULL, &pd[FWD], &pad_bytes) != 0 ||
        prim_make(&e->p[BWD_DATA], &bdd, attr, pd[FWD], &pd[BWD_DATA], &pad_bytes) != 0 ||
        prim_make(&e->p[BWD_WEIGHTS], &bwd, attr, pd[FWD], &pd[BWD_WEIGHTS], &pad_bytes) != 0)
        goto out_destroy;
    bytes = up(pad_bytes);
    e->dx = bytes;
    bytes += up((size_t)cv->N * cv->C * cv->H * cv->W * sizeof(float));
    e->dw = bytes;
    bytes += up((size_t)cv->K * cv->C * cv->R * cv->S * sizeof(float));
    e->db = bytes;
    bytes += up((size_t)cv->K * sizeof(float));
    struct prim *f = &e->p[FWD], *d = &e->p[BWD_DATA], *w = &e->p[BWD_WEIGHTS];
    if (port_add(f, pd[FWD], DNNL_ARG_SRC, 0, &usrc, dnnl_query_src_md, 0, &bytes) ||
        port_add(f, pd[FWD], DNNL_ARG_WEIGHTS, 0, &uwei, dnnl_query_weights_md, 0, &bytes) ||
        port_add(f, pd[FWD], DNNL_ARG_BIAS, 0, &ubia, dnnl_query_weights_md, 1, &bytes) ||
        port_add(f, pd[FWD], DNNL_ARG_DST, 1, &udst, dnnl_query_dst_md, 0, &bytes) ||
        port_add(d, pd[BWD_DATA], DNNL_ARG_DIFF_DST, 0, &udst, dnnl_query_diff_dst_md, 0, &bytes) ||
        port_add(d, pd[BWD_DATA], DNNL_ARG_WEIGHTS, 0, &uwei, dnnl_query_weights_md, 0, &bytes) ||
        port_add(d, pd[BWD_DATA], DNNL_ARG_DIFF_SRC, 1, &usrc, dnnl_query_diff_src_md, 0, &bytes) ||
        port_add(w, pd[BWD_WEIGHTS], DNNL_ARG_DIFF_DST, 0, &udst, dnnl_query_diff_dst_md, 0,
                 &bytes) ||
        port_add(w, pd[BWD_WEIGHTS], DNNL_ARG_SRC, 0, &usrc, dnnl_query_src_md, 0, &bytes) ||
        port_add(w, pd[BWD_WEIGHTS], DNNL_ARG_DIFF_WEIGHTS, 1, &uwei, dnnl_query_diff_weights_md, 0,
                 &bytes) ||
        port_add(w, pd[BWD_WEIGHTS], DNNL_ARG_DIFF_BIAS, 1, &ubia, dnnl_query_diff_weights_md, 1,
                 &bytes))
        goto out_destroy;
    e->bytes = bytes + ALIGN;
    rc = 0;
out_destroy:
    for (int p = 0; p < N_PRIM; p++)
        if (pd[p])
            dnnl_primitive_desc_destroy(pd[p]);
    dnnl_primitive_attr_destroy(attr);
    return rc;
}

/*
 * The entry for @cv, made on first use; NULL if oneDNN cannot do this conv in bf16.
 * NEEDSWORK: the same keyed cache as conv_dnnl.c's; one helper for both when either changes.
 */
static struct entry *entry_get(const struct mge_cpu_conv *cv)
{
    if (!mge_cpu_has_bf16() || mge__dnnl_get(&g_engine, &g_stream) != 0)
        return NULL;
    int key[10] = {cv->N, cv->C, cv->H,      cv->W,   cv->K,
                   cv->R, cv->S, cv->stride, cv->pad, cv->slots > 0 ? cv->slots : 1};
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

size_t mge__conv_bf16_scratch_bytes(const struct mge_cpu_conv *cv)
{
    struct entry *e = entry_get(cv);
    return e ? e->bytes : 0;
}

static char *aligned(void *scratch)
{
    return (char *)(((uintptr_t)scratch + ALIGN - 1) / ALIGN * ALIGN);
}

static int exec(dnnl_primitive_t p, int n, const dnnl_exec_arg_t *args)
{
    return dnnl_primitive_execute(p, g_stream, n, args) == dnnl_success ? 0 : -1;
}

/*
 * Run primitive @p: @ptr[i] is the caller's buffer for port i (NULL: skip this port's argument,
 * which the primitive must not need). Reorders in, the convolution, reorders out; 0 or -1.
 */
static int run(struct entry *e, int p, void *const *ptr, char *base)
{
    struct prim *pr = &e->p[p];
    dnnl_exec_arg_t ea[MAX_PORTS + 1];
    int na = 0, rc = 0;
    int old = omp_get_max_threads();
    omp_set_num_threads(e->key[9]);
    for (int i = 0; i < pr->n_ports; i++) {
        struct port *po = &pr->port[i];
        if (!ptr[i])
            continue;
        dnnl_memory_set_data_handle(po->user, ptr[i]);
        if (po->reorder)
            dnnl_memory_set_data_handle(po->inner, base + po->off);
        if (po->reorder && !po->out) {
            dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, po->user}, {DNNL_ARG_TO, po->inner}};
            rc |= exec(po->reorder, 2, ra);
        }
        ea[na].arg = po->arg;
        ea[na].memory = po->inner;
        na++;
    }
    if (pr->pad) {
        dnnl_memory_set_data_handle(pr->pad, base);
        ea[na].arg = DNNL_ARG_SCRATCHPAD;
        ea[na].memory = pr->pad;
        na++;
    }
    rc |= exec(pr->conv, na, ea);
    for (int i = 0; i < pr->n_ports; i++) {
        struct port *po = &pr->port[i];
        if (ptr[i] && po->reorder && po->out) {
            dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, po->inner}, {DNNL_ARG_TO, po->user}};
            rc |= exec(po->reorder, 2, ra);
        }
    }
    if (dnnl_stream_wait(g_stream) != dnnl_success)
        rc = -1;
    omp_set_num_threads(old);
    return rc ? -1 : 0;
}

int mge__conv_bf16_forward(const struct mge_cpu_conv *cv, float *out, const float *inp,
                           const float *w, const float *bias, void *scratch)
{
    struct entry *e = entry_get(cv);
    if (!e)
        return -1;
    /* ports: src, weights, bias, dst */
    void *ptr[MAX_PORTS] = {(void *)inp, (void *)w, bias ? (void *)bias : e->zero_bias, out};
    pthread_mutex_lock(&e->lock);
    int rc = run(e, FWD, ptr, aligned(scratch));
    pthread_mutex_unlock(&e->lock);
    return rc;
}

/* As conv_dnnl.c: with @acc the results land in scratch and are added once both passes worked. */
int mge__conv_bf16_backward(const struct mge_cpu_conv *cv, float *dinp, float *dw, float *dbias,
                            const float *dout, const float *inp, const float *w, void *scratch,
                            int acc)
{
    struct entry *e = entry_get(cv);
    if (!e)
        return -1;
    char *base = aligned(scratch);
    int rc = 0;
    size_t nx = (size_t)cv->N * cv->C * cv->H * cv->W, nw = (size_t)cv->K * cv->C * cv->R * cv->S;
    float *dx = acc ? (float *)(base + e->dx) : dinp, *dwt = acc ? (float *)(base + e->dw) : dw;
    float *dbt = (float *)(base + e->db);
    pthread_mutex_lock(&e->lock);
    if (dinp) { /* ports: diff_dst, weights, diff_src */
        void *ptr[MAX_PORTS] = {(void *)dout, (void *)w, dx, NULL};
        rc = run(e, BWD_DATA, ptr, base);
    }
    if (rc == 0 && dw) { /* ports: diff_dst, src, diff_weights, diff_bias */
        void *ptr[MAX_PORTS] = {(void *)dout, (void *)inp, dwt, dbt};
        rc = run(e, BWD_WEIGHTS, ptr, base);
    }
    pthread_mutex_unlock(&e->lock);
    if (rc != 0)
        return rc;
    if (dbias) /* ours, from the fp32 dout: not to depend on whether dw is wanted */
        mge__conv_bias_grad(cv, dbias, dout, acc);
    if (dinp && acc)
        mge_cpu_axpy(dinp, dx, 1.0f, (int64_t)nx);
    if (dw && acc)
        mge_cpu_axpy(dw, dwt, 1.0f, (int64_t)nw);
    return 0;
}
