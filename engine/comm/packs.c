/*
 * packs.c: gradient packing for data parallelism: contiguous slices of the gradient arena,
 * each all-reduced in place as soon as backward has finished it (Horovod's tensor fusion,
 * without its fusion buffer: the engine lays gradients out in the order backward completes
 * them, so a pack is a plain slice and nothing is copied in or out).
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "engine/comm/comm.h"

struct mge_comm_packs {
    struct mge_comm *c;
    float *arena;
    struct mge_comm_pack *packs;
    int n;
    int next; /* first pack not started this step */
    int err;  /* first failure this step (from a hook) */
};

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

int mge_comm_packs_new(struct mge_comm_packs **out, struct mge_comm *c, float *arena,
                       size_t arena_bytes, const size_t *cuts, int n_cuts, size_t first_bytes,
                       size_t pack_bytes)
{
    struct mge_comm_packs *p = NULL;
    size_t *cut = mge_malloc(sizeof(size_t) * (size_t)(n_cuts + 1));
    int rc = MGE_OK;
    *out = NULL;
    if (!cut)
        return MGE_ERR(MGE_NOMEM, "cannot allocate packs");
    for (int i = 0; i < n_cuts; i++)
        if (cuts[i] > arena_bytes || cuts[i] % sizeof(float)) {
            rc =
                MGE_ERR(MGE_INVAL, "pack cut %zu outside the %zu-byte arena", cuts[i], arena_bytes);
            goto out_free;
        }
    memcpy(cut, cuts, sizeof(size_t) * (size_t)n_cuts);
    cut[n_cuts] = arena_bytes;
    qsort(cut, (size_t)n_cuts + 1, sizeof(size_t), cmp_size);
    if (!(p = mge_calloc(1, sizeof(*p))) ||
        !(p->packs = mge_calloc((size_t)n_cuts + 1, sizeof(*p->packs)))) {
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate packs");
        goto out_free;
    }
    p->c = c;
    p->arena = arena;
    size_t start = 0;
    for (int i = 0; i <= n_cuts; i++) {
        size_t want = p->n == 0 ? first_bytes : pack_bytes;
        if (cut[i] <= start || (cut[i] - start < want && cut[i] < arena_bytes))
            continue;
        p->packs[p->n].first = start / sizeof(float);
        p->packs[p->n].count = (cut[i] - start) / sizeof(float);
        p->n++;
        start = cut[i];
    }
    *out = p;
    p = NULL;
out_free:
    mge_comm_packs_free(p);
    mge_free(cut);
    return rc;
}

void mge_comm_packs_free(struct mge_comm_packs *p)
{
    if (!p)
        return;
    mge_free(p->packs);
    mge_free(p);
}

int mge_comm_packs_count(const struct mge_comm_packs *p)
{
    return p->n;
}

const struct mge_comm_pack *mge_comm_packs_get(const struct mge_comm_packs *p, int i)
{
    return i >= 0 && i < p->n ? &p->packs[i] : NULL;
}

void mge_comm_packs_begin(struct mge_comm_packs *p)
{
    p->next = 0;
    p->err = MGE_OK;
    for (int i = 0; i < p->n; i++) {
        p->packs[i].ticket = 0;
        p->packs[i].ready_at = 0.0;
        memset(&p->packs[i].timing, 0, sizeof(p->packs[i].timing));
    }
}

void mge_comm_packs_ready(struct mge_comm_packs *p, size_t ready_bytes)
{
    size_t ready = ready_bytes / sizeof(float);
    /*
     * Once the whole arena is ready, backward is over and the caller waits for the packs
     * next: those still to start are only queued, to run on the waiting thread (or on the
     * communication thread if it is still busy with an earlier pack and gets there first).
     */
    bool last = p->n > 0 && p->packs[p->n - 1].first + p->packs[p->n - 1].count <= ready;
    while (p->next < p->n && p->err == MGE_OK) {
        struct mge_comm_pack *k = &p->packs[p->next];
        if (k->first + k->count > ready)
            break;
        k->ready_at = mge_comm_now();
        p->err = last ? mge_comm_allreduce_queue(p->c, p->arena + k->first, k->count,
                                                 MGE_COMM_F32, &k->ticket)
                      : mge_comm_allreduce_start(p->c, p->arena + k->first, k->count,
                                                 MGE_COMM_F32, &k->ticket);
        p->next++;
    }
}

void mge_comm_packs_ready_hook(void *p, size_t ready_bytes)
{
    mge_comm_packs_ready(p, ready_bytes);
}

int mge_comm_packs_wait(struct mge_comm_packs *p, int i)
{
    if (p->err != MGE_OK)
        return p->err;
    if (i < 0 || i >= p->next)
        return MGE_ERR(MGE_STATE, "pack %d of %d was not started", i, p->n);
    return mge_comm_wait(p->c, p->packs[i].ticket, &p->packs[i].timing);
}
