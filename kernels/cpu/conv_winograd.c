/*
 * conv_winograd.c: Winograd F(2x2, 3x3) convolution for 3x3, stride-1, pad-1 convs (ResNet's),
 * forward, data gradient and weight gradient (the last in its own section below); conv.c picks it.
 *
 * Each 2x2 block of outputs ("tile") comes from a 4x4 window of the input: V = B^T d B per input
 * channel, M = sum over c of U[c] .* V[c] with U = G g G^T per filter, and Y = A^T M A: 16
 * multiplications per 4 outputs and channel pair where the direct conv does 36. The sum over c
 * is 16 independent GEMMs, one per position xi of the 4x4: M[xi] (K, tiles) = U[xi] (K, C) x
 * V[xi] (C, tiles), tiles in vector lanes, register tiles of 8 output channels x 3 vectors.
 *
 * Work items are groups of whole images (enough to make ~64 tiles, so a 7x7 map's 16 tiles do
 * not leave the GEMMs one vector wide), each thread transforms its group's inputs into
 * V (16, C, tiles) in its own scratch, runs the GEMMs into M (16, Kp, tiles) and writes the
 * outputs (bias added, or added to what is there for an accumulated data gradient). An output
 * depends on its own image only, always summed in the same order: the same bits at any thread
 * count. The data gradient is the same kernel on dout with the rotated, transposed filter.
 */
#include <omp.h>
#include <string.h>

#include "kernels/cpu/conv_tile_int.h"
#include "kernels/cpu/conv_winograd_dw_int.h"

#define KB 8         /* output channels per GEMM register tile (U is packed by it) */
#define TV 3         /* vectors of tiles per GEMM register tile */
#define MIN_TILES 64 /* tiles a work item should have: images are grouped up to this */
#define NX 16        /* positions of a 4x4 input tile */

/* One Winograd conv: Ci input channels to Co output channels on H x W images (in and out). */
struct wgeo {
    int Ci, Co, H, W;
    int TH, TW; /* tile rows and columns */
    int Wp;     /* padded row: 2 * TW + 2 (pad column, W, zeros), or W + 1 for an odd W */
    int NU;     /* tiles per image, TH * Wp / 2: one junk tile ends each row of an even W */
    int G;      /* images per work item */
    int Tp;     /* tiles of a work item, rounded up to whole vectors */
    int Kp;     /* Co rounded up to KB */
};

struct wplan {
    struct wgeo g;
    int N, slots;
    /* float offsets in scratch: the packed U (16, Kp / KB, Ci, KB), shared; then per slot
     * (stride @slot) a zero row, 4 half-transformed input planes and 4 output planes (stride
     * @tmps: the input's pad columns stay zero, the output's are overwritten), V (16, Ci, Tp)
     * and M (16, Kp, Tp) */
    size_t u, slot0, slot, zr, tmp, tmps, vt, mt, total;
};

static size_t up16(size_t n)
{
    return (n + 15) / 16 * 16;
}

static void plan_init(struct wplan *pl, const struct mge_cpu_conv *cv, int data)
{
    struct wgeo *g = &pl->g;
    g->Ci = data ? cv->K : cv->C;
    g->Co = data ? cv->C : cv->K;
    g->H = cv->H, g->W = cv->W;
    g->TH = (g->H + 1) / 2, g->TW = (g->W + 1) / 2;
    g->Wp = g->W % 2 ? g->W + 1 : 2 * g->TW + 2, g->NU = g->TH * g->Wp / 2;
    g->G = (MIN_TILES + g->NU - 1) / g->NU;
    if (g->G > cv->N)
        g->G = cv->N;
    g->Tp = (g->G * g->NU + V - 1) / V * V;
    g->Kp = (g->Co + KB - 1) / KB * KB;
    pl->N = cv->N;
    pl->slots = cv->slots > 0 ? cv->slots : 1;
    pl->u = 0;
    pl->slot0 = up16((size_t)NX * g->Kp * g->Ci);
    pl->zr = 0;
    pl->tmp = up16((size_t)g->W);
    pl->tmps = up16((size_t)g->TH * g->Wp + 4); /* the last tile reads 2 floats past */
    pl->vt = pl->tmp + 8 * pl->tmps;
    pl->mt = pl->vt + (size_t)NX * g->Ci * g->Tp;
    pl->slot = pl->mt + (size_t)NX * g->Kp * g->Tp;
    pl->total = pl->slot0 + (size_t)pl->slots * pl->slot;
}

int mge__conv_winograd_ok(const struct mge_cpu_conv *cv)
{
    return cv->R == 3 && cv->S == 3 && cv->stride == 1 && cv->pad == 1 && cv->P == cv->H &&
           cv->Q == cv->W;
}

/* Where V's row of channel c at tile t0, position 0, lies in a slot */
static float *vt_at(const struct wgeo *g, const struct wplan *pl, float *sl, int c, int t0)
{
    return sl + pl->vt + (size_t)c * g->Tp + t0;
}

/*
 * U[xi][co][ci] = (G g G^T)[xi] for g = w[co][ci] (@flip: w[ci][co] rotated by 180 degrees, the
 * data gradient's filter), packed as u[xi][co / KB][ci][co % KB], zeros for co >= Co. The
 * transform runs in double and rounds once: the filter's error then is that of U's storage.
 */
static void filter_transform(const struct wgeo *g, float *restrict u, const float *restrict w,
                             int flip)
{
    memset(u, 0, (size_t)NX * g->Kp * g->Ci * sizeof(float));
    for (int co = 0; co < g->Co; co++)
        for (int ci = 0; ci < g->Ci; ci++) {
            double f[3][3], t[4][3];
            for (int r = 0; r < 3; r++)
                for (int s = 0; s < 3; s++)
                    f[r][s] = flip ? w[((size_t)ci * g->Co + co) * 9 + (2 - r) * 3 + 2 - s]
                                   : w[((size_t)co * g->Ci + ci) * 9 + r * 3 + s];
            for (int s = 0; s < 3; s++) {
                t[0][s] = f[0][s];
                t[1][s] = 0.5 * (f[0][s] + f[1][s] + f[2][s]);
                t[2][s] = 0.5 * (f[0][s] - f[1][s] + f[2][s]);
                t[3][s] = f[2][s];
            }
            for (int i = 0; i < 4; i++) {
                double x[4] = {t[i][0], 0.5 * (t[i][0] + t[i][1] + t[i][2]),
                               0.5 * (t[i][0] - t[i][1] + t[i][2]), t[i][2]};
                for (int j = 0; j < 4; j++)
                    u[(((size_t)(i * 4 + j) * (g->Kp / KB) + co / KB) * g->Ci + ci) * KB +
                      co % KB] = (float)x[j];
            }
        }
}

/*
 * The tile transforms run in two passes over flat planes. Tile (ty, tx) reads padded rows
 * 2 ty .. 2 ty + 3 and columns 2 tx .. 2 tx + 3. The vertical pass combines each tile row's 4
 * input rows into 4 rows of Wp (B^T d along columns), stored one tile row after another: tile
 * (ty, tx) then starts at ty * Wp + 2 tx = 2 u for u = ty * Wp / 2 + tx, and the horizontal
 * pass (times B) is one long stride-2 loop over u, which vectorises on a 7-wide image too. The
 * output transform is the same two passes the other way round.
 *
 * A row's last tile reads columns W - 1 .. W + 2 of the padded row (odd W) or W - 2 .. W + 1
 * (even W). For an even W the rows are 2 TW + 2 = W + 2 apart, and the price of the long loop
 * is tile tx = TW of each row, computed and dropped (14x14: 56 tiles for 49). For an odd W the
 * rows are W + 1 apart, so the right pad column of a row is the left one of the next, both
 * zero, and there is no junk tile (7x7: 16 tiles, where it was 20 until 2026-11): the last
 * tile's fourth column (W + 2) then reads the next row's first input value instead of a zero,
 * which only enters V's fourth column, hence M's, which only the tile's second output column
 * uses: output column W, past the image, dropped.
 */

/* One tile row's B^T d: 4 rows of n from the 4 input rows */
static inline __attribute__((always_inline)) void
vertical(float *restrict o0, float *restrict o1, float *restrict o2, float *restrict o3,
         const float *restrict r0, const float *restrict r1, const float *restrict r2,
         const float *restrict r3, int n)
{
    for (int w = 0; w < n; w++) {
        float a = r0[w], b = r1[w], d = r2[w], e = r3[w];
        o0[w] = a - d, o1[w] = b + d, o2[w] = d - b, o3[w] = b - e;
    }
}

/* vt[xi][c][t0 + u] = (B^T d B)[xi] for the tiles u of one image x (Ci, H, W). */
MGE__CPU_CLONES
static void input_tiles(const struct wgeo *g, const struct wplan *pl, float *restrict sl,
                        const float *restrict x, int t0)
{
    size_t xs = (size_t)g->Ci * g->Tp; /* between positions xi */
    const float *zr = sl + pl->zr;
    float *t0p = sl + pl->tmp, *t1p = t0p + pl->tmps, *t2p = t1p + pl->tmps, *t3p = t2p + pl->tmps;
    for (int c = 0; c < g->Ci; c++) {
        const float *xc = x + (size_t)c * g->H * g->W;
        for (int ty = 0; ty < g->TH; ty++) {
            int h = 2 * ty - 1;
            const float *r0 = h >= 0 ? xc + (size_t)h * g->W : zr;
            const float *r1 = xc + (size_t)(h + 1) * g->W;
            const float *r2 = h + 2 < g->H ? xc + (size_t)(h + 2) * g->W : zr;
            const float *r3 = h + 3 < g->H ? xc + (size_t)(h + 3) * g->W : zr;
            size_t o = (size_t)ty * g->Wp + 1; /* the pad columns stay zero */
            vertical(t0p + o, t1p + o, t2p + o, t3p + o, r0, r1, r2, r3, g->W);
        }
        float *v = vt_at(g, pl, sl, c, t0);
        const float *tr[4] = {t0p, t1p, t2p, t3p};
        for (int i = 0; i < 4; i++) {
            const float *q = tr[i];
            float *v0 = v + (size_t)(4 * i) * xs;
            for (int u = 0; u < g->NU; u++) {
                float q0 = q[2 * u], q1 = q[2 * u + 1], q2 = q[2 * u + 2], q3 = q[2 * u + 3];
                v0[u] = q0 - q2, v0[xs + u] = q1 + q2;
                v0[2 * xs + u] = q2 - q1, v0[3 * xs + u] = q1 - q3;
            }
        }
    }
}

/* mt = U x vt for the first @nt tiles (a multiple of V) at all 16 positions. */
MGE__CPU_CLONES
static void gemms(const struct wgeo *g, float *mt, const float *vt, const float *u, int nt)
{
    /* direct's register tile as a GEMM: a 1x1 "conv" over planes of Tp tiles, C = Ci, K = Kp */
    struct geo m = {.C = g->Ci, .K = g->Kp, .R = 1, .S = 1, .Hp = 1, .Wp = g->Tp};
    for (int xi = 0; xi < NX; xi++) {
        const float *v = vt + (size_t)xi * g->Ci * g->Tp, *ux = u + (size_t)xi * g->Kp * g->Ci;
        float *mx = mt + (size_t)xi * g->Kp * g->Tp;
        for (int k0 = 0; k0 < g->Kp; k0 += KB)
            for (int t0 = 0; t0 < nt; t0 += TV * V) {
                float *o = mx + (size_t)k0 * g->Tp + t0;
                int nv = (nt - t0) / V;
                if (nv >= 3)
                    conv_tile(KB, 3, &m, o, g->Tp, 3 * V, 0, v + t0, ux, NULL, k0, 0, 1);
                else if (nv == 2)
                    conv_tile(KB, 2, &m, o, g->Tp, 2 * V, 0, v + t0, ux, NULL, k0, 0, 1);
                else
                    conv_tile(KB, 1, &m, o, g->Tp, V, 0, v + t0, ux, NULL, k0, 0, 1);
            }
    }
}

/*
 * One image's outputs y (Co, H, W) from mt's tiles [t0, t0 + NU): Y = A^T M A, plus bias[co]
 * (may be NULL), added to what y holds when @acc. Horizontal pass (M times A) into 4 flat rows,
 * then the vertical one (A^T) straight into y.
 */
MGE__CPU_CLONES
static void output_tiles(const struct wgeo *g, const struct wplan *pl, float *restrict sl,
                         float *restrict y, const float *restrict mt, int t0, const float *bias,
                         int acc)
{
    size_t xs = (size_t)g->Kp * g->Tp; /* between positions xi */
    float *s0p = sl + pl->tmp + 4 * pl->tmps, *s1p = s0p + pl->tmps, *s2p = s1p + pl->tmps,
          *s3p = s2p + pl->tmps;
    float *sr[4] = {s0p, s1p, s2p, s3p};
    for (int co = 0; co < g->Co; co++) {
        const float *m = mt + (size_t)co * g->Tp + t0;
        for (int i = 0; i < 4; i++) {
            const float *m0 = m + (size_t)(4 * i) * xs;
            float *o = sr[i];
            for (int u = 0; u < g->NU; u++) {
                float a = m0[u], b = m0[xs + u], c = m0[2 * xs + u], d = m0[3 * xs + u];
                o[2 * u] = a + b + c, o[2 * u + 1] = b - c - d;
            }
        }
        float bv = bias ? bias[co] : 0.0f;
        float *yc = y + (size_t)co * g->H * g->W;
        for (int ty = 0; ty < g->TH; ty++) {
            size_t o = (size_t)ty * g->Wp;
            float *y0 = yc + (size_t)(2 * ty) * g->W;
            if (acc)
                for (int w = 0; w < g->W; w++)
                    y0[w] += s0p[o + w] + s1p[o + w] + s2p[o + w] + bv;
            else
                for (int w = 0; w < g->W; w++)
                    y0[w] = s0p[o + w] + s1p[o + w] + s2p[o + w] + bv;
            if (2 * ty + 1 >= g->H)
                continue;
            float *y1 = y0 + g->W;
            if (acc)
                for (int w = 0; w < g->W; w++)
                    y1[w] += s1p[o + w] - s2p[o + w] - s3p[o + w] + bv;
            else
                for (int w = 0; w < g->W; w++)
                    y1[w] = s1p[o + w] - s2p[o + w] - s3p[o + w] + bv;
        }
    }
}

/* The images [n0, n1) of one work item: out (+)= conv(inp) (+ bias) through this slot's scratch */
static void group(const struct wplan *pl, float *sl, const float *u, float *out, const float *inp,
                  const float *bias, int acc, int n0, int n1)
{
    const struct wgeo *g = &pl->g;
    size_t in_img = (size_t)g->Ci * g->H * g->W, out_img = (size_t)g->Co * g->H * g->W;
    for (int n = n0; n < n1; n++)
        input_tiles(g, pl, sl, inp + (size_t)n * in_img, (n - n0) * g->NU);
    int nt = ((n1 - n0) * g->NU + V - 1) / V * V;
    gemms(g, sl + pl->mt, sl + pl->vt, u, nt);
    for (int n = n0; n < n1; n++)
        output_tiles(g, pl, sl, out + (size_t)n * out_img, sl + pl->mt, (n - n0) * g->NU, bias,
                     acc);
}

static void run(const struct wplan *pl, float *out, const float *inp, const float *w, int flip,
                const float *bias, int acc, void *scratch)
{
    const struct wgeo *g = &pl->g;
    float *base = aligned(scratch);
    filter_transform(g, base + pl->u, w, flip);
    int ngroups = (pl->N + g->G - 1) / g->G;
    int nt = mge_cpu_threads();
    nt = nt < pl->slots ? nt : pl->slots;
    nt = nt < ngroups ? nt : ngroups;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *sl = base + pl->slot0 + (size_t)omp_get_thread_num() * pl->slot;
        /* the zero row, the planes' pad columns, and tiles past the last image (lanes whose
         * outputs are dropped) */
        memset(sl, 0, (pl->vt + (size_t)NX * g->Ci * g->Tp) * sizeof(float));
#pragma omp for schedule(static)
        for (int i = 0; i < ngroups; i++) {
            int n0 = i * g->G, n1 = n0 + g->G < pl->N ? n0 + g->G : pl->N;
            group(pl, sl, base + pl->u, out, inp, bias, acc, n0, n1);
        }
    }
}

int mge__conv_winograd_forward(const struct mge_cpu_conv *cv, float *out, const float *inp,
                               const float *w, const float *bias, void *scratch)
{
    if (!mge__conv_winograd_ok(cv))
        return -1;
    struct wplan pl;
    plan_init(&pl, cv, 0);
    run(&pl, out, inp, w, 0, bias, 0, scratch);
    return 0;
}

int mge__conv_winograd_backward_data(const struct mge_cpu_conv *cv, float *dinp, const float *dout,
                                     const float *w, void *scratch, int acc)
{
    if (!mge__conv_winograd_ok(cv))
        return -1;
    struct wplan pl;
    plan_init(&pl, cv, 1);
    run(&pl, dinp, dout, w, 1, NULL, acc, scratch);
    return 0;
}

/*
 * ---- the weight gradient ---------------------------------------------------------------------
 *
 * The adjoint of the forward (conv_winograd_dw_int.h says how; conv_winograd_dw.c runs it): dM =
 * A dY A^T from each tile's 2x2 output gradient, 16 GEMMs reducing over tiles into dU, dw =
 * G^T dU G, 16 multiplications per 2x2 outputs and channel pair where the direct dw does 36.
 * Channels are the lanes (both transforms work on whole vectors of 16 channels per tile, with no
 * junk tile); F(4x4, 3x3)'s weight gradient (conv_winograd4_dw.c) is the same with 6x6 tiles.
 */

#define DW_MIN_TILES 64 /* tiles a dw work item should have: images are grouped up to this */

_Static_assert(KB == MGE__WDW_KB, "dM's blocks are the GEMMs' register tile");

/* vt[xi][t0 + t][c] = (B^T d B)[xi] for the tiles t of one image, xp as the plan says */
MGE__CPU_CLONES
static void dw_input_tiles(const struct mge__wdw_plan *pl, float *restrict vt,
                           const float *restrict xp, int t0)
{
    size_t xs = (size_t)pl->Tg * pl->Cp, rs = (size_t)pl->Wx * pl->Cp;
    for (int ty = 0; ty < pl->TH; ty++)
        for (int tx = 0; tx < pl->TW; tx++) {
            const float *x0 = xp + (size_t)(2 * ty) * rs + (size_t)(2 * tx) * pl->Cp;
            float *v0 = vt + (size_t)(t0 + ty * pl->TW + tx) * pl->Cp;
            for (int c0 = 0; c0 < pl->Cp; c0 += V) {
                vf d[4][4], e[4][4];
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
                    for (int s = 0; s < 4; s++)
                        d[r][s] = ld(x0 + r * rs + (size_t)s * pl->Cp + c0);
#pragma GCC unroll 4
                for (int s = 0; s < 4; s++) {
                    e[0][s] = d[0][s] - d[2][s], e[1][s] = d[1][s] + d[2][s];
                    e[2][s] = d[2][s] - d[1][s], e[3][s] = d[1][s] - d[3][s];
                }
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    vf o[4] = {e[i][0] - e[i][2], e[i][1] + e[i][2], e[i][2] - e[i][1],
                               e[i][1] - e[i][3]};
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++)
                        memcpy(v0 + (size_t)(4 * i + j) * xs + c0, &o[j], sizeof(vf));
                }
            }
        }
}

/* mt[xi][k / KB][t0 + t][k % KB] = (A dY A^T)[xi] for the tiles t of one image, dyp as the plan
 * says: packed as the forward's U, the GEMMs' broadcast operand, a block of KB channels at a
 * time (splitting 16-lane vectors into blocks on the way out took a third longer) */
MGE__CPU_CLONES
static void dw_output_tiles(const struct mge__wdw_plan *pl, float *restrict mt,
                            const float *restrict dyp, int t0)
{
    size_t bs = pl->mbs, xs = (size_t)(pl->Kp / KB) * bs, rs = (size_t)(2 * pl->TW) * pl->Kp;
    for (int ty = 0; ty < pl->TH; ty++)
        for (int tx = 0; tx < pl->TW; tx++) {
            const float *y0 = dyp + (size_t)(2 * ty) * rs + (size_t)(2 * tx) * pl->Kp;
            float *m0 = mt + (size_t)(t0 + ty * pl->TW + tx) * KB;
            for (int k0 = 0; k0 < pl->Kp; k0 += KB) {
                mge__vkb a, b, c, d;
                memcpy(&a, y0 + k0, sizeof(a)), memcpy(&b, y0 + pl->Kp + k0, sizeof(b));
                memcpy(&c, y0 + rs + k0, sizeof(c)), memcpy(&d, y0 + rs + pl->Kp + k0, sizeof(d));
                mge__vkb e[4][2] = {{a, b}, {a + c, b + d}, {a - c, b - d}, {-c, -d}};
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    mge__vkb o[4] = {e[i][0], e[i][0] + e[i][1], e[i][0] - e[i][1], -e[i][1]};
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++)
                        memcpy(m0 + (size_t)(4 * i + j) * xs + (size_t)(k0 / KB) * bs, &o[j],
                               sizeof(mge__vkb));
                }
            }
        }
}

/* g (3, 3) = G^T du G for du (4, 4), in double */
static void dw_filter(const double *du, double *g)
{
    double t[3][4];
    for (int j = 0; j < 4; j++) {
        t[0][j] = du[j] + 0.5 * (du[4 + j] + du[8 + j]);
        t[1][j] = 0.5 * (du[4 + j] - du[8 + j]);
        t[2][j] = 0.5 * (du[4 + j] + du[8 + j]) + du[12 + j];
    }
    for (int r = 0; r < 3; r++) {
        g[r * 3] = t[r][0] + 0.5 * (t[r][1] + t[r][2]);
        g[r * 3 + 1] = 0.5 * (t[r][1] - t[r][2]);
        g[r * 3 + 2] = 0.5 * (t[r][1] + t[r][2]) + t[r][3];
    }
}

static const struct mge__wdw_ops dw_ops = {dw_input_tiles, dw_output_tiles, dw_filter};

int mge__conv_winograd_backward_weights(const struct mge_cpu_conv *cv, float *dw, const float *dout,
                                        const float *inp, void *scratch, int acc)
{
    if (!mge__conv_winograd_ok(cv))
        return -1;
    struct mge__wdw_plan pl;
    mge__wdw_plan_init(&pl, cv, 2, DW_MIN_TILES);
    mge__wdw_run(&pl, &dw_ops, dw, dout, inp, scratch, acc);
    return 0;
}

size_t mge__conv_winograd_scratch_bytes(const struct mge_cpu_conv *cv)
{
    if (!mge__conv_winograd_ok(cv))
        return 0;
    struct wplan f, d;
    plan_init(&f, cv, 0);
    plan_init(&d, cv, 1);
    struct mge__wdw_plan w;
    mge__wdw_plan_init(&w, cv, 2, DW_MIN_TILES);
    size_t t = f.total > d.total ? f.total : d.total;
    return (t > w.total ? t : w.total) * sizeof(float) + 64;
}
