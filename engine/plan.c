/*
 * plan.c: the static memory planner. Execution order gives every activation a lifetime
 * [first write, last read]; activations whose lifetimes overlap get disjoint byte ranges in one
 * arena (greedy orders, then local search near the peak), so the peak is known before the first
 * step. Parameters and gradients get one arena each; gradients are laid out in the order
 * backward finishes them.
 */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/rng.h"
#include "engine/device.h"
#include "engine/engine_int.h"

#define PLAN_ALIGN 64

static size_t align_up(size_t n) { return (n + PLAN_ALIGN - 1) & ~(size_t)(PLAN_ALIGN - 1); }

static void touch(struct mge_graph *g, int v, int64_t at)
{
    if (v < 0)
        return;
    struct mge_value *r = &g->values[mge__value_root(g, v)];
    if (r->first_use < 0 || at < r->first_use)
        r->first_use = at;
    if (at > r->last_use)
        r->last_use = at;
}

/*
 * Placing activations. Every try places items one at a time into a gap between the placed items
 * alive at the same time. Whole orders come first (by the load an item lives through, and the
 * two orders over time that are optimal on chains), then local improvement of the best: lift
 * out the items around one that reaches the top and place them again in other orders.
 * Everything is a function of the input (no clock, seeded noise), so reruns plan alike.
 */

/* Every item by time block, so finding the items alive with one is not O(n). */
struct time_index {
    int **lists; /* per block: indices of the items overlapping it */
    int *len, *cap;
    int nb;
    int64_t blk; /* node indices per block */
};

static void time_index_fini(struct time_index *ti)
{
    for (int b = 0; ti->lists && b < ti->nb; b++)
        mge_free(ti->lists[b]);
    mge_free(ti->lists);
    mge_free(ti->len);
    mge_free(ti->cap);
    memset(ti, 0, sizeof(*ti));
}

static int time_index_add(struct time_index *ti, const struct mge__plan_item *it, int idx)
{
    for (int64_t b = it->first / ti->blk; b <= it->last / ti->blk; b++) {
        if (ti->len[b] == ti->cap[b]) {
            int cap = ti->cap[b] ? ti->cap[b] * 2 : 16;
            int *p = mge_realloc(ti->lists[b], sizeof(int) * (size_t)cap);
            if (!p)
                return MGE_NOMEM;
            ti->lists[b] = p;
            ti->cap[b] = cap;
        }
        ti->lists[b][ti->len[b]++] = idx;
    }
    return MGE_OK;
}

/* Empty the index, keeping its capacity: adding the same items again cannot fail. */
static void time_index_clear(struct time_index *ti)
{
    for (int b = 0; b < ti->nb; b++)
        ti->len[b] = 0;
}

/* Index the @n @items, which live within [0, @tmax]; on failure *@ti holds nothing. */
static int time_index_init(struct time_index *ti, const struct mge__plan_item *items, int n,
                           int64_t tmax)
{
    memset(ti, 0, sizeof(*ti));
    int nb = n < 64 ? 1 : n / 16 > 1024 ? 1024 : n / 16;
    ti->blk = tmax / nb + 1;
    ti->nb = (int)(tmax / ti->blk) + 1;
    ti->lists = mge_calloc((size_t)ti->nb, sizeof(*ti->lists));
    ti->len = mge_calloc((size_t)ti->nb, sizeof(int));
    ti->cap = mge_calloc((size_t)ti->nb, sizeof(int));
    if (!ti->lists || !ti->len || !ti->cap)
        goto err_fini;
    for (int i = 0; i < n; i++)
        if (time_index_add(ti, &items[i], i) != MGE_OK)
            goto err_fini;
    return MGE_OK;
err_fini:
    time_index_fini(ti);
    return MGE_NOMEM;
}

/* The bytes [lo, hi) a placed item takes. */
struct span {
    size_t lo, hi;
};

static int span_less(const struct span *a, const struct span *b)
{
    return a->lo != b->lo ? a->lo < b->lo : a->hi < b->hi;
}

static int span_cmp(const void *pa, const void *pb)
{
    const struct span *a = pa, *b = pb;
    return span_less(a, b) ? -1 : span_less(b, a) ? 1 : 0;
}

static void span_sort(struct span *s, int n)
{
    if (n > 24) {
        qsort(s, (size_t)n, sizeof(*s), span_cmp);
        return;
    }
    for (int i = 1; i < n; i++) {
        struct span x = s[i];
        int j = i;
        for (; j > 0 && span_less(&x, &s[j - 1]); j--)
            s[j] = s[j - 1];
        s[j] = x;
    }
}

/* Where an item goes among the gaps that fit it. */
enum plan_fit {
    PLAN_FIT_BEST,      /* the smallest gap below the top, else on top */
    PLAN_FIT_TWO_SIDED, /* the bottom if free, else as high as fits under the target, else the
                         * lowest gap: fills the lower bound from both ends */
    PLAN_FIT_LOWEST,    /* the lowest gap */
};

/*
 * The planner's state over all tries. It owns every array (freed by plan_ctx_fini()) and reads
 * @items, whose offsets it writes only at the end, from the best try.
 */
struct plan_ctx {
    const struct mge__plan_item *items;
    int n;
    size_t lower; /* the lower bound: the most bytes alive at one time */
    size_t *load; /* per item: the most bytes alive at one time during its life */
    size_t *off;  /* per item: its offset in the current try */
    unsigned char *placed;
    struct time_index ti;
    int *found;         /* scratch: items found alive in a time range */
    struct span *spans; /* scratch: the bytes those take */
    int *stamp, gen;    /* stamp[j] == gen: item j already seen by this search */
    int64_t work;       /* placements plus the placed items each had to step around */
};

/* The load over time, then c->lower and c->load[] (through maxima of blocks of 64 steps). */
static int plan_ctx_load(struct plan_ctx *c, int64_t tmax)
{
    int64_t nt = tmax + 1, nb = nt / 64 + 1;
    size_t *at = mge_calloc((size_t)nt + 1, sizeof(*at));
    size_t *blk = mge_calloc((size_t)nb, sizeof(*blk));
    if (!at || !blk) {
        mge_free(at);
        mge_free(blk);
        return MGE_NOMEM;
    }
    for (int i = 0; i < c->n; i++) { /* differences: they wrap, the prefix sums are exact */
        at[c->items[i].first] += c->items[i].size;
        at[c->items[i].last + 1] -= c->items[i].size;
    }
    for (int64_t t = 1; t < nt; t++)
        at[t] += at[t - 1];
    for (int64_t t = 0; t < nt; t++)
        if (at[t] > blk[t / 64])
            blk[t / 64] = at[t];
    c->lower = 0;
    for (int64_t b = 0; b < nb; b++)
        c->lower = blk[b] > c->lower ? blk[b] : c->lower;
    for (int i = 0; i < c->n; i++) {
        int64_t t = c->items[i].first, e = c->items[i].last;
        size_t mx = 0;
        for (; t <= e && t % 64; t++)
            mx = at[t] > mx ? at[t] : mx;
        for (; t + 63 <= e; t += 64)
            mx = blk[t / 64] > mx ? blk[t / 64] : mx;
        for (; t <= e; t++)
            mx = at[t] > mx ? at[t] : mx;
        c->load[i] = mx;
    }
    mge_free(at);
    mge_free(blk);
    return MGE_OK;
}

static void plan_ctx_fini(struct plan_ctx *c)
{
    time_index_fini(&c->ti);
    mge_free(c->load);
    mge_free(c->off);
    mge_free(c->placed);
    mge_free(c->found);
    mge_free(c->spans);
    mge_free(c->stamp);
}

/* Set up @c for the @n @items (kept, not copied), which live within [0, @tmax]. */
static int plan_ctx_init(struct plan_ctx *c, const struct mge__plan_item *items, int n,
                         int64_t tmax)
{
    size_t m = (size_t)(n ? n : 1);
    memset(c, 0, sizeof(*c));
    c->items = items;
    c->n = n;
    c->load = mge_malloc(m * sizeof(*c->load));
    c->off = mge_calloc(m, sizeof(*c->off));
    c->placed = mge_calloc(m, 1);
    c->found = mge_malloc(m * sizeof(*c->found));
    c->spans = mge_malloc(m * sizeof(*c->spans));
    c->stamp = mge_calloc(m, sizeof(*c->stamp));
    if (!c->load || !c->off || !c->placed || !c->found || !c->spans || !c->stamp ||
        time_index_init(&c->ti, items, n, tmax) != MGE_OK || plan_ctx_load(c, tmax) != MGE_OK) {
        plan_ctx_fini(c);
        return MGE_NOMEM;
    }
    return MGE_OK;
}

/*
 * The items other than @self alive at some time in [@lo, @hi] (only placed ones if @placed) into
 * c->found, in the order of the index; returns how many.
 */
static int plan_find(struct plan_ctx *c, int self, int64_t lo, int64_t hi, int placed)
{
    int nf = 0;
    if (++c->gen == 0x7fffffff) {
        memset(c->stamp, 0, sizeof(*c->stamp) * (size_t)c->n);
        c->gen = 1;
    }
    int64_t b0 = lo < 0 ? 0 : lo / c->ti.blk, b1 = hi / c->ti.blk;
    if (b1 >= c->ti.nb)
        b1 = c->ti.nb - 1;
    for (int64_t b = b0; b <= b1; b++)
        for (int k = 0; k < c->ti.len[b]; k++) {
            int j = c->ti.lists[b][k];
            if (c->stamp[j] == c->gen || j == self || (placed && !c->placed[j]))
                continue;
            c->stamp[j] = c->gen;
            if (c->items[j].first <= hi && lo <= c->items[j].last)
                c->found[nf++] = j;
        }
    return nf;
}

/* Place item @i by @fit (@target: for PLAN_FIT_TWO_SIDED); returns the end of its bytes. */
static size_t plan_place_one(struct plan_ctx *c, int i, enum plan_fit fit, size_t target)
{
    const struct mge__plan_item *it = &c->items[i];
    int n_live = plan_find(c, i, it->first, it->last, 1);
    for (int k = 0; k < n_live; k++) {
        c->spans[k].lo = c->off[c->found[k]];
        c->spans[k].hi = c->spans[k].lo + c->items[c->found[k]].size;
    }
    span_sort(c->spans, n_live);
    c->work += 1 + n_live;
    size_t best = (size_t)-1, best_gap = (size_t)-1, lowest = (size_t)-1, high = (size_t)-1;
    size_t at = 0;
    for (int j = 0; j <= n_live; j++) {
        size_t gap_end = j < n_live ? c->spans[j].lo : (size_t)-1;
        if (gap_end >= at + it->size) {
            size_t gap = gap_end - at;
            if (lowest == (size_t)-1)
                lowest = at;
            if (j < n_live && gap < best_gap) {
                best_gap = gap;
                best = at;
            }
            size_t top = (gap_end < target ? gap_end : target);
            if (top >= at + it->size && top - it->size >= at)
                high = top - it->size;
        }
        if (j < n_live && c->spans[j].hi > at)
            at = c->spans[j].hi;
    }
    if (fit == PLAN_FIT_BEST)
        c->off[i] = best != (size_t)-1 ? best : at;
    else if (fit == PLAN_FIT_LOWEST || lowest == 0 || high == (size_t)-1)
        c->off[i] = lowest;
    else
        c->off[i] = high;
    c->placed[i] = 1;
    return c->off[i] + it->size;
}

/*
 * Place the @m items @order[] again, in that order; the others stay. Returns the highest end
 * among the @m. A try over all items indexes them as they go, so searches skip no unplaced ones.
 */
static size_t plan_place(struct plan_ctx *c, const int *order, int m, enum plan_fit fit)
{
    size_t top = 0;
    int whole = m == c->n;
    if (whole)
        time_index_clear(&c->ti);
    for (int k = 0; k < m; k++)
        c->placed[order[k]] = 0;
    for (int k = 0; k < m; k++) {
        size_t e = plan_place_one(c, order[k], fit, c->lower);
        if (e > top)
            top = e;
        if (whole) /* within the capacity of the first indexing: cannot fail */
            time_index_add(&c->ti, &c->items[order[k]], order[k]);
    }
    return top;
}

/* A sort key: ascending by a, then b, then the caller's value id, then the index. */
struct order_key {
    double a, b;
    int v, idx;
};

static int order_key_less(const struct order_key *x, const struct order_key *y)
{
    if (x->a != y->a)
        return x->a < y->a;
    if (x->b != y->b)
        return x->b < y->b;
    if (x->v != y->v)
        return x->v < y->v;
    return x->idx < y->idx;
}

/* Merge sort of the @m keys @k (a total order: each has its own idx); @tmp holds m / 2. */
static void order_key_sort(struct order_key *k, int m, struct order_key *tmp)
{
    if (m <= 16) {
        for (int i = 1; i < m; i++) {
            struct order_key x = k[i];
            int j = i;
            for (; j > 0 && order_key_less(&x, &k[j - 1]); j--)
                k[j] = k[j - 1];
            k[j] = x;
        }
        return;
    }
    int h = m / 2, i = 0, j = h, o = 0;
    order_key_sort(k, h, tmp);
    order_key_sort(k + h, m - h, tmp);
    if (!order_key_less(&k[h], &k[h - 1]))
        return;
    memcpy(tmp, k, sizeof(*k) * (size_t)h);
    while (i < h && j < m)
        k[o++] = order_key_less(&k[j], &tmp[i]) ? k[j++] : tmp[i++];
    while (i < h)
        k[o++] = tmp[i++];
}

enum plan_order {
    PLAN_ORDER_FIRST,       /* earliest first, larger first */
    PLAN_ORDER_LAST,        /* latest end first, larger first */
    PLAN_ORDER_LOAD_LAST,   /* highest load while alive first, then latest end first */
    PLAN_ORDER_LOAD_FIRST,  /* highest load while alive first, then earliest first */
    PLAN_ORDER_NOISY_LOAD,  /* highest load while alive first, then larger first, sizes jittered
                             * by up to 1/4 */
    PLAN_ORDER_NOISY_SIZE,  /* larger first, sizes jittered by up to 1/4 */
    PLAN_ORDER_RANDOM,      /* shuffled */
    PLAN_ORDER_LOAD_RANDOM, /* highest load while alive first, then shuffled */
};

/* A number in [0, 1) for item @i, a function of @seed and @i only. */
static double plan_hash(uint64_t seed, int i)
{
    return (double)(mge_mix64(seed * 0x9E3779B97F4A7C15ull + (uint64_t)i) >> 11) * 0x1.0p-53;
}

/* Sort the @m item indices @order[] by @how (@seed: for the noisy ones); @keys holds 1.5 m. */
static void plan_order(const struct plan_ctx *c, int *order, int m, enum plan_order how,
                       uint64_t seed, struct order_key *keys)
{
    for (int k = 0; k < m; k++) {
        int i = order[k];
        const struct mge__plan_item *it = &c->items[i];
        double size = (double)it->size, load = (double)c->load[i];
        struct order_key *key = &keys[k];
        key->v = it->v;
        key->idx = i;
        switch (how) {
        case PLAN_ORDER_FIRST:
            key->a = (double)it->first;
            key->b = -size;
            break;
        case PLAN_ORDER_LAST:
            key->a = -(double)it->last;
            key->b = -size;
            break;
        case PLAN_ORDER_LOAD_LAST:
            key->a = -load;
            key->b = -(double)it->last;
            break;
        case PLAN_ORDER_LOAD_FIRST:
            key->a = -load;
            key->b = (double)it->first;
            break;
        case PLAN_ORDER_NOISY_LOAD:
            key->a = -load;
            key->b = -size * (1.0 + 0.25 * plan_hash(seed, i));
            break;
        case PLAN_ORDER_LOAD_RANDOM:
            key->a = -load;
            key->b = plan_hash(seed, i);
            break;
        case PLAN_ORDER_NOISY_SIZE:
            key->a = -size * (1.0 + 0.25 * plan_hash(seed, i));
            key->b = (double)it->first;
            break;
        case PLAN_ORDER_RANDOM:
            key->a = plan_hash(seed, i);
            key->b = 0;
            break;
        }
    }
    order_key_sort(keys, m, keys + m);
    for (int k = 0; k < m; k++)
        order[k] = keys[k].idx;
}

/* The items whose bytes end at @arena into @tops; returns how many. */
static int plan_tops(const struct plan_ctx *c, size_t arena, int *tops)
{
    int n_top = 0;
    for (int i = 0; i < c->n; i++)
        if (c->off[i] + c->items[i].size == arena)
            tops[n_top++] = i;
    return n_top;
}

static size_t plan_top(const struct plan_ctx *c)
{
    size_t top = 0;
    for (int i = 0; i < c->n; i++)
        if (c->off[i] + c->items[i].size > top)
            top = c->off[i] + c->items[i].size;
    return top;
}

/*
 * Local improvement of the complete placement in @c, of height @arena. Each try takes an item
 * that reaches the top (each in turn), lifts out every item alive within @pads steps of it and
 * places them again by the next of @moves; it keeps the result when they all end below @arena,
 * else puts them back. Stops at the lower bound or once c->work passes @work_end. Scratch:
 * @order, @tops (n each), @saved (n), @keys (1.5 n). Returns the height.
 */
static size_t plan_improve(struct plan_ctx *c, size_t arena, int64_t work_end, int *order,
                           int *tops, size_t *saved, struct order_key *keys)
{
    static const int64_t pads[] = {0, 8, 24, 60, 150, 400};
    static const struct {
        enum plan_order order;
        enum plan_fit fit;
    } moves[] = {
        {PLAN_ORDER_LOAD_LAST, PLAN_FIT_BEST},     {PLAN_ORDER_NOISY_LOAD, PLAN_FIT_BEST},
        {PLAN_ORDER_LOAD_RANDOM, PLAN_FIT_LOWEST}, {PLAN_ORDER_LOAD_RANDOM, PLAN_FIT_BEST},
        {PLAN_ORDER_LOAD_FIRST, PLAN_FIT_BEST},    {PLAN_ORDER_NOISY_LOAD, PLAN_FIT_BEST},
        {PLAN_ORDER_RANDOM, PLAN_FIT_LOWEST},      {PLAN_ORDER_NOISY_SIZE, PLAN_FIT_BEST},
    };
    const int n_moves = (int)(sizeof(moves) / sizeof(moves[0]));
    const int n_pads = (int)(sizeof(pads) / sizeof(pads[0]));
    int n_top = plan_tops(c, arena, tops);
    uint64_t seed = 0;
    for (int fails = 0; arena > c->lower && c->work < work_end;) {
        int t = tops[fails % n_top];
        int64_t pad = pads[(fails / n_moves) % n_pads];
        const struct mge__plan_item *it = &c->items[t];
        int m = plan_find(c, t, it->first - pad, it->last + pad, 0);
        memcpy(order, c->found, sizeof(*order) * (size_t)m);
        order[m++] = t;
        plan_order(c, order, m, moves[fails % n_moves].order, ++seed, keys);
        for (int k = 0; k < m; k++)
            saved[k] = c->off[order[k]];
        if (plan_place(c, order, m, moves[fails % n_moves].fit) < arena) {
            arena = plan_top(c);
            n_top = plan_tops(c, arena, tops);
            fails = 0;
        } else {
            for (int k = 0; k < m; k++) /* put them back */
                c->off[order[k]] = saved[k];
            fails++;
        }
    }
    return arena;
}

size_t mge__plan_assign(struct mge__plan_item *items, int n)
{
    static const struct {
        enum plan_order order;
        enum plan_fit fit;
    } whole[] = {
        {PLAN_ORDER_LOAD_LAST, PLAN_FIT_BEST},
        {PLAN_ORDER_FIRST, PLAN_FIT_TWO_SIDED}, /* these two are optimal on chains */
        {PLAN_ORDER_LAST, PLAN_FIT_TWO_SIDED},
    };
    struct plan_ctx c;
    int64_t end = 0;
    for (int i = 0; i < n; i++)
        if (items[i].last > end)
            end = items[i].last;
    size_t m = (size_t)(n ? n : 1);
    int *order = mge_malloc(sizeof(*order) * m);
    int *tops = mge_malloc(sizeof(*tops) * m);
    size_t *best = mge_malloc(sizeof(*best) * m);
    size_t *saved = mge_malloc(sizeof(*saved) * m);
    struct order_key *keys = mge_malloc(sizeof(*keys) * (m + m / 2 + 1));
    size_t best_arena = (size_t)-1;
    if (!order || !tops || !best || !saved || !keys || plan_ctx_init(&c, items, n, end) != MGE_OK)
        goto out_free;
    int64_t pass_work = 0;
    for (size_t s = 0; s < sizeof(whole) / sizeof(whole[0]); s++) {
        for (int i = 0; i < n; i++)
            order[i] = i;
        plan_order(&c, order, n, whole[s].order, 0, keys);
        size_t a = plan_place(&c, order, n, whole[s].fit);
        if (s == 0)
            pass_work = c.work;
        if (a < best_arena) {
            best_arena = a;
            memcpy(best, c.off, sizeof(*best) * m);
        }
        if (a == c.lower)
            break; /* optimal */
    }
    if (best_arena > c.lower) {
        /* as much work as 30 whole passes at 1,000 items, 4 at 10,000, more on small graphs */
        int64_t passes_n = 30 * (int64_t)n;
        passes_n = passes_n < 20000 ? 20000 : passes_n > 40000 ? 40000 : passes_n;
        memcpy(c.off, best, sizeof(*best) * m);
        best_arena = plan_improve(&c, best_arena, c.work + pass_work * passes_n / n, order, tops,
                                  saved, keys);
        memcpy(best, c.off, sizeof(*best) * m);
    }
    for (int i = 0; i < n; i++)
        items[i].offset = best[i];
    plan_ctx_fini(&c);
out_free:
    mge_free(order);
    mge_free(tops);
    mge_free(best);
    mge_free(saved);
    mge_free(keys);
    return best_arena;
}

size_t mge__plan_lower_bound(const struct mge__plan_item *items, int n, int64_t end)
{
    int64_t *delta = mge_calloc((size_t)end + 2, sizeof(int64_t));
    size_t lower = 0;
    int64_t cur = 0;
    if (!delta)
        return (size_t)-1;
    for (int i = 0; i < n; i++) {
        delta[items[i].first] += (int64_t)items[i].size;
        delta[items[i].last + 1] -= (int64_t)items[i].size;
    }
    for (int64_t t = 0; t <= end; t++) {
        cur += delta[t];
        if ((size_t)cur > lower)
            lower = (size_t)cur;
    }
    mge_free(delta);
    return lower;
}

/*
 * For each node, the prefix of the gradient arena whose gradients are final once it ran:
 * gradients sorted by offset, each final after its last write.
 */
static int plan_grad_ready(struct mge_graph *g)
{
    if (!g->grads)
        return MGE_OK;
    int64_t *last = mge_malloc(sizeof(int64_t) * (size_t)(g->n_params ? g->n_params : 1));
    int *order = mge_malloc(sizeof(int) * (size_t)(g->n_params ? g->n_params : 1));
    g->grad_ready = mge_calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof(size_t));
    if (!last || !order || !g->grad_ready) {
        mge_free(last);
        mge_free(order);
        return MGE_ERR(MGE_NOMEM, "cannot allocate plan");
    }
    int n = 0;
    for (int i = 0; i < g->n_params; i++) {
        last[i] = -1;
        if (g->grads[i] >= 0)
            order[n++] = i;
    }
    for (int ni = 0; ni < g->n_nodes; ni++)
        for (int k = 0; k < g->nodes[ni].n_out; k++) {
            int o = g->nodes[ni].out[k];
            if (o < 0)
                continue;
            o = mge__value_root(g, o);
            if (g->values[o].kind == MGE_VALUE_GRAD)
                last[g->values[o].param_index] = ni;
        }
    /* insertion sort by offset: parameter counts are small */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && g->values[g->grads[order[j]]].offset <
                                     g->values[g->grads[order[j - 1]]].offset; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    int at = 0;
    size_t ready = 0;
    for (int ni = 0; ni < g->n_nodes; ni++) {
        while (at < n && last[order[at]] <= ni) {
            const struct mge_value *gv = &g->values[g->grads[order[at]]];
            ready = gv->offset + align_up(mge__value_bytes(g, g->grads[order[at]]));
            at++;
        }
        g->grad_ready[ni] = ready;
    }
    mge_free(last);
    mge_free(order);
    return MGE_OK;
}

int mge_graph_grad_span(const struct mge_graph *g, int param, size_t *offset, size_t *bytes)
{
    int gv = mge_graph_grad(g, param);
    if (gv < 0 || !g->planned)
        return MGE_ERR(MGE_INVAL, "parameter %d has no planned gradient", param);
    *offset = g->values[gv].offset;
    *bytes = mge__value_bytes(g, gv);
    return MGE_OK;
}

/* The input an elementwise op may overwrite with its output (-1 if none), for in-place reuse. */
static int inplace_source(const struct mge_node *n)
{
    switch (n->op) {
    case MGE_OP_UNARY:
    case MGE_OP_BIAS_ACT:
    case MGE_OP_DROPOUT:
        return n->in[0];
    case MGE_OP_UNARY_GRAD:
        return n->acc || n->a.act.act == MGE_ACT_NONE ? -1 : n->in[0];
    case MGE_OP_DROPOUT_GRAD:
    case MGE_OP_SCALE:
        return n->acc ? -1 : n->in[0];
    default:
        return -1;
    }
}

/*
 * In-place reuse: an elementwise op whose source dies at that op writes over it, so the two
 * share storage (the output becomes a view of the source). Done before lifetimes.
 */
static int plan_inplace(struct mge_graph *g)
{
    int64_t *last = mge_malloc(sizeof(int64_t) * (size_t)(g->n_values ? g->n_values : 1));
    if (!last)
        return MGE_ERR(MGE_NOMEM, "cannot allocate plan");
    for (int v = 0; v < g->n_values; v++)
        last[v] = -1;
    for (int ni = 0; ni < g->n_nodes; ni++) {
        const struct mge_node *n = &g->nodes[ni];
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] >= 0)
                last[mge__value_root(g, n->in[i])] = ni;
        for (int i = 0; i < n->n_out; i++)
            if (n->out[i] >= 0)
                last[mge__value_root(g, n->out[i])] = ni;
    }
    for (int ni = 0; ni < g->n_nodes; ni++) {
        const struct mge_node *n = &g->nodes[ni];
        int src = inplace_source(n), out = n->out[0];
        if (src < 0 || out < 0)
            continue;
        int r = mge__value_root(g, src);
        struct mge_value *o = &g->values[out], *rv = &g->values[r];
        if (o->kind != MGE_VALUE_ACT || o->alias >= 0 || o->keep || o->producer != ni ||
            rv->kind != MGE_VALUE_ACT || rv->keep || last[r] != ni ||
            mge__value_bytes(g, out) != mge__value_bytes(g, r) || o->batched != rv->batched)
            continue;
        int other = 0; /* the op must not read the source through another input */
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] >= 0 && n->in[i] != src && mge__value_root(g, n->in[i]) == r)
                other = 1;
        for (int i = 1; i < n->n_out; i++)
            if (n->out[i] >= 0 && mge__value_root(g, n->out[i]) == r)
                other = 1;
        if (other)
            continue;
        o->alias = r;
        last[r] = last[out] > ni ? last[out] : ni;
        for (int k = ni + 1; k < g->n_nodes; k++) /* the merged storage lives as long as out */
            for (int i = 0; i < g->nodes[k].n_in; i++)
                if (g->nodes[k].in[i] >= 0 && mge__value_root(g, g->nodes[k].in[i]) == r)
                    last[r] = k;
    }
    mge_free(last);
    return MGE_OK;
}

int mge_graph_plan(struct mge_graph *g, struct mge_plan_stats *stats)
{
    int rc = MGE_OK;
    if (g->err)
        return g->err;
    if (g->planned)
        return MGE_ERR(MGE_STATE, "graph already planned");
    if (g->n_forward == 0 && g->loss < 0)
        g->n_forward = g->n_nodes;
    if (!g->eager && (rc = plan_inplace(g)) != MGE_OK) /* eager: every value its own memory */
        return rc;
    if ((rc = mge__quant_plan(g)) != MGE_OK)
        return rc;

    /* lifetimes over the execution order */
    for (int v = 0; v < g->n_values; v++)
        g->values[v].first_use = g->values[v].last_use = -1;
    for (int ni = 0; ni < g->n_nodes; ni++) {
        const struct mge_node *n = &g->nodes[ni];
        int64_t lo, hi; /* an int8 segment's node runs any time during the segment */
        mge__quant_span(g, ni, &lo, &hi);
        for (int i = 0; i < n->n_in + n->n_out; i++) {
            int v = i < n->n_in ? n->in[i] : n->out[i - n->n_in];
            if (mge__quant_local(g, v))
                continue; /* in the segment's per-image buffers, not the arena */
            touch(g, v, lo);
            touch(g, v, hi);
        }
    }
    int64_t end = g->n_nodes;
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].keep) {
            struct mge_value *r = &g->values[mge__value_root(g, v)];
            if (r->first_use < 0)
                r->first_use = 0;
            r->last_use = end;
        }

    /*
     * Parameters and gradients share one layout, so the optimiser walks both arenas (and its
     * state) element by element: the order in which backward first writes each gradient (the
     * last layer first: packs of gradients are ready front to back), then parameters that get
     * no gradient, in creation order, then buffers (never trained): the gradient arena and the
     * optimiser cover the trained prefix only.
     */
    int *order = mge_malloc(sizeof(int) * (size_t)(g->n_params ? g->n_params : 1));
    char *placed = mge_calloc((size_t)(g->n_params ? g->n_params : 1), 1);
    if (!order || !placed) {
        mge_free(order);
        mge_free(placed);
        return MGE_ERR(MGE_NOMEM, "cannot allocate plan");
    }
    int n_order = 0;
    for (int ni = 0; ni < g->n_nodes && g->grads; ni++)
        for (int i = 0; i < g->nodes[ni].n_out; i++) {
            int o = g->nodes[ni].out[i];
            if (o < 0)
                continue;
            o = mge__value_root(g, o);
            int pi = g->values[o].param_index;
            if (g->values[o].kind != MGE_VALUE_GRAD || placed[pi])
                continue;
            placed[pi] = 1;
            order[n_order++] = pi;
        }
    for (int buffers = 0; buffers < 2; buffers++)
        for (int pi = 0; pi < g->n_params; pi++)
            if (!placed[pi] && g->values[g->params[pi]].buffer == buffers)
                order[n_order++] = pi;
    size_t off = 0, trained = 0;
    for (int k = 0; k < n_order; k++) {
        int pv = g->params[order[k]];
        g->values[pv].offset = off;
        if (g->grads && g->grads[order[k]] >= 0)
            g->values[g->grads[order[k]]].offset = off;
        off += align_up(mge__value_bytes(g, pv));
        if (!g->values[pv].buffer)
            trained = off;
    }
    mge_free(order);
    mge_free(placed);
    g->param_bytes = off;
    g->grad_bytes = g->grads ? trained : 0;

    /* activations */
    int n_items = 0;
    struct mge__plan_item *items = mge_malloc(sizeof(*items) * (size_t)(g->n_values ? g->n_values : 1));
    if (!items)
        return MGE_ERR(MGE_NOMEM, "cannot allocate plan");
    size_t inputs = 0;
    for (int v = 0; v < g->n_values; v++) {
        struct mge_value *val = &g->values[v];
        if (val->kind == MGE_VALUE_INPUT)
            inputs += mge__value_bytes(g, v);
        if (val->kind != MGE_VALUE_ACT || val->alias >= 0 || val->first_use < 0)
            continue;
        items[n_items].v = v;
        items[n_items].size = align_up(mge__value_bytes(g, v));
        items[n_items].first = val->first_use;
        items[n_items].last = val->last_use;
        n_items++;
    }
    size_t lower = mge__plan_lower_bound(items, n_items, end);
    if (lower == (size_t)-1) {
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate plan");
        goto out_free;
    }
    size_t arena = mge__plan_assign(items, n_items);
    if (arena == (size_t)-1) {
        rc = MGE_ERR(MGE_NOMEM, "cannot allocate plan");
        goto out_free;
    }
    for (int i = 0; i < n_items; i++)
        g->values[items[i].v].offset = items[i].offset;
    g->act_bytes = arena;
    g->lower_bound = lower;
    if ((rc = plan_grad_ready(g)) != MGE_OK)
        goto out_free;
    g->planned = 1;
    if (stats) {
        stats->param_bytes = g->param_bytes;
        stats->grad_bytes = g->grad_bytes;
        stats->activation_bytes = arena;
        stats->lower_bound_bytes = lower;
        stats->input_bytes = inputs;
        stats->n_values = g->n_values;
        stats->n_nodes = g->n_nodes;
    }
out_free:
    mge_free(items);
    return rc;
}

void mge__graph_free_arenas(struct mge_graph *g)
{
    const struct mge_device *dev = mge__graph_dev(g);
    dev->free(g->param_arena, g->param_bytes);
    dev->free(g->grad_arena, g->grad_bytes);
    dev->free(g->act_arena, g->act_bytes);
    dev->free(g->input_arena, 2 * g->input_bytes);
    for (int s = 0; s < 2; s++) {
        if (dev->host_free)
            dev->host_free(g->stage_host[s]);
        else
            mge_free_aligned(g->stage_host[s]);
        g->stage_host[s] = NULL;
    }
    g->param_arena = g->grad_arena = NULL;
    g->act_arena = g->input_arena = NULL;
    g->slot = g->staged = 0;
}

/* Off the host (a device that is not host-visible): every input gets a place of its planned
 * size in an input slot; the input arena holds two slots, which runs fill in turn from the
 * bound host memory (exec.c, mge_graph_stage). */
static size_t plan_inputs(struct mge_graph *g)
{
    size_t off = 0;
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == MGE_VALUE_INPUT && g->values[v].alias < 0) {
            g->values[v].offset = off;
            off += align_up(mge__value_bytes(g, v));
        }
    return off;
}

int mge_graph_alloc(struct mge_graph *g)
{
    const struct mge_device *dev = mge__graph_dev(g);
    if (!g->planned)
        return MGE_ERR(MGE_STATE, "graph not planned");
    if (g->allocated)
        return MGE_OK;
    g->input_bytes = dev->host_visible ? 0 : plan_inputs(g);
    g->param_arena = dev->alloc(g->param_bytes ? g->param_bytes : 64);
    g->grad_arena = dev->alloc(g->grad_bytes ? g->grad_bytes : 64);
    g->act_arena = dev->alloc(g->act_bytes ? g->act_bytes : 64);
    if (!dev->host_visible)
        g->input_arena = dev->alloc(g->input_bytes ? 2 * g->input_bytes : 64);
    if (!g->param_arena || !g->grad_arena || !g->act_arena ||
        (!dev->host_visible && !g->input_arena)) {
        mge__graph_free_arenas(g);
        return MGE_ERR(MGE_NOMEM, "cannot allocate arenas on %s (%zu + %zu + %zu + %zu bytes)",
                       dev->name, g->param_bytes, g->grad_bytes, g->act_bytes, g->input_bytes);
    }
    dev->memset(g->param_arena, 0, g->param_bytes);
    dev->memset(g->grad_arena, 0, g->grad_bytes);
    /* the activation arena is left untouched: pages are mapped on first write (RSS = use) */
    for (int v = 0; v < g->n_values; v++) {
        struct mge_value *val = &g->values[v];
        switch (val->kind) {
        case MGE_VALUE_PARAM:
            val->data = (unsigned char *)g->param_arena + val->offset;
            break;
        case MGE_VALUE_GRAD:
            val->data = (unsigned char *)g->grad_arena + val->offset;
            break;
        case MGE_VALUE_ACT:
            if (val->alias < 0)
                val->data = g->act_arena + val->offset;
            break;
        case MGE_VALUE_INPUT:
            if (g->input_arena && val->alias < 0)
                val->data = g->input_arena + val->offset;
            break;
        }
    }
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].alias >= 0)
            g->values[v].data = g->values[mge__value_root(g, v)].data;
    if (g->eager) {
        int rc = mge__eager_alloc(g);
        if (rc != MGE_OK)
            return rc;
    }
    g->allocated = 1;
    g->batch = g->batch_max > 0 ? g->batch_max : 1;
    return MGE_OK;
}

size_t mge_graph_param_bytes(const struct mge_graph *g)
{
    size_t n = 0;
    for (int i = 0; i < g->n_params; i++)
        n += align_up(mge__value_bytes(g, g->params[i]));
    return n;
}

float *mge_graph_params(struct mge_graph *g, int64_t *n)
{
    if (n)
        *n = (int64_t)(g->param_bytes / sizeof(float));
    return g->param_arena;
}

float *mge_graph_grads(struct mge_graph *g, int64_t *n)
{
    if (n)
        *n = (int64_t)(g->grad_bytes / sizeof(float));
    return g->grad_arena;
}
