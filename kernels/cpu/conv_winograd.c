/*
 * conv_winograd.c: Winograd F(2x2, 3x3) and F(4x4, 3x3) convolution for 3x3, stride-1, pad-1 convs
 * (ResNet's): forward and data gradient in either tile size, weight gradient in F(2x2) (the last in
 * its own section below); conv.c picks them.
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
 *
 * F(4x4, 3x3) (Lavin's points 0, +-1, +-2 and infinity) is the same pipeline with 4x4 output tiles
 * from 6x6 input windows: 36 positions, so 36 GEMMs and 36 transformed values per 16 outputs
 * (2.25 per output and channel where F(2x2) has 4): both the GEMMs and the transform traffic shrink
 * by 1.8x, for transforms of 6 terms instead of 4 and a larger rounding error (the transformed
 * tiles grow up to ~10x the inputs: see the bounds in tests/unit/test_kernels.c).
 */
#include <omp.h>
#include <string.h>

#include "kernels/cpu/conv_tile_int.h"
#include "kernels/cpu/conv_winograd_dw_int.h"

#define KB 8         /* output channels per GEMM register tile (U is packed by it) */
#define TV 3         /* vectors of tiles per GEMM register tile */
#define MIN_TILES 64 /* tiles a work item should have: images are grouped up to this */
#define NX 16        /* positions of a 4x4 input tile (F(2x2)'s; the weight gradient's) */

/* One Winograd conv: Ci input channels to Co output channels on H x W images (in and out). */
struct wgeo {
    int Ci, Co, H, W;
    int m;      /* outputs per tile side: 2 for F(2x2, 3x3), 4 for F(4x4, 3x3) */
    int nx;     /* positions of an input tile, (m + 2)^2 */
    int TH, TW; /* tile rows and columns */
    int Wp;     /* padded row: m TW + m (pad column, W, zeros), or m TW if m does not divide W */
    int NU;     /* tiles per image, TH * Wp / m: one junk tile ends each row if m divides W */
    int G;      /* images per work item */
    int Tp;     /* tiles of a work item, rounded up to whole vectors */
    int Kp;     /* Co rounded up to KB */
};

struct wplan {
    struct wgeo g;
    int N, slots;
    /* float offsets in scratch: the packed U (nx, Kp / KB, Ci, KB), shared; then per slot
     * (stride @slot) a zero row, m + 2 half-transformed input planes and m + 2 output planes
     * (stride @tmps: the input's pad columns stay zero, the output's are overwritten),
     * V (nx, Ci, Tp) and M (nx, Kp, Tp) */
    size_t u, slot0, slot, zr, tmp, tmps, vt, mt, total;
};

static size_t up16(size_t n)
{
    return (n + 15) / 16 * 16;
}

static void plan_init(struct wplan *pl, const struct mge_cpu_conv *cv, int data, int m)
{
    struct wgeo *g = &pl->g;
    g->Ci = data ? cv->K : cv->C;
    g->Co = data ? cv->C : cv->K;
    g->H = cv->H, g->W = cv->W;
    g->m = m, g->nx = (m + 2) * (m + 2);
    g->TH = (g->H + m - 1) / m, g->TW = (g->W + m - 1) / m;
    g->Wp = g->W % m ? m * g->TW : m * g->TW + m, g->NU = g->TH * g->Wp / m;
    g->G = (MIN_TILES + g->NU - 1) / g->NU;
    if (g->G > cv->N)
        g->G = cv->N;
    g->Tp = (g->G * g->NU + V - 1) / V * V;
    g->Kp = (g->Co + KB - 1) / KB * KB;
    pl->N = cv->N;
    pl->slots = cv->slots > 0 ? cv->slots : 1;
    pl->u = 0;
    pl->slot0 = up16((size_t)g->nx * g->Kp * g->Ci);
    pl->zr = 0;
    pl->tmp = up16((size_t)g->W);
    pl->tmps = up16((size_t)g->TH * g->Wp + 4); /* the last tile reads 2 floats past */
    /* a group's planes; whole vectors of 16 tiles and the next tile's first 2, and of a row's
     * outputs */
    if (m == 4)
        pl->tmps = up16((size_t)g->Tp * 4 + V);
    pl->vt = pl->tmp + 2 * (size_t)(m + 2) * pl->tmps;
    pl->mt = pl->vt + (size_t)g->nx * g->Ci * g->Tp;
    pl->slot = pl->mt + (size_t)g->nx * g->Kp * g->Tp;
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

/* mt = U x vt for the first @nt tiles (a multiple of V) at all nx positions. */
MGE__CPU_CLONES
static void gemms(const struct wgeo *g, float *mt, const float *vt, const float *u, int nt)
{
    /* direct's register tile as a GEMM: a 1x1 "conv" over planes of Tp tiles, C = Ci, K = Kp */
    struct geo m = {.C = g->Ci, .K = g->Kp, .R = 1, .S = 1, .Hp = 1, .Wp = g->Tp};
    for (int xi = 0; xi < g->nx; xi++) {
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

/*
 * ---- F(4x4, 3x3): the transforms of 6x6 input windows and 4x4 output tiles -------------------
 *
 * With the points 0, 1, -1, 2, -2 and infinity, in the order of Lavin and Gray's matrices:
 *   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1]
 *   G   = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1]
 *   A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]
 * The same two flat passes as F(2x2)'s: tile (ty, tx) reads padded rows 4 ty .. 4 ty + 5 and
 * columns 4 tx .. 4 tx + 5 and starts at 4 u in the half-transformed planes, u = ty * Wp / 4 + tx.
 * Where 4 does not divide W, rows are Wp = 4 TW apart and the last tile of a row reads the next
 * row's pad column (zero) and its first input value as its sixth column: B's last column takes
 * it into V's sixth column only, and A's into the tile's fourth output column only, which lies
 * past the image (4 TW - 1 >= W) and is dropped. Where 4 divides W (28x28), rows are 4 TW + 4
 * apart and one junk tile ends each row (56 tiles for 49).
 */

/*
 * U for F(4x4): (G g G^T)[xi] for xi in 6 x 6, in double and rounded once, packed as
 * filter_transform's. Eight input channels at a time, in lanes (one at a time, 64x64 filters took
 * a seventh of a 7x7 forward).
 */
MGE__CPU_CLONES
static void filter_transform4(const struct wgeo *g, float *restrict u, const float *restrict w,
                              int flip)
{
    static const double G[6][3] = {{1.0 / 4, 0, 0},
                                   {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                   {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                   {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                   {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                   {0, 0, 1}};
    enum { L = 8 };
    memset(u, 0, (size_t)g->nx * g->Kp * g->Ci * sizeof(float));
    for (int co = 0; co < g->Co; co++)
        for (int c0 = 0; c0 < g->Ci; c0 += L) {
            int nl = g->Ci - c0 < L ? g->Ci - c0 : L;
            double f[9][L] = {{0}}, t[6][3][L];
            for (int l = 0; l < nl; l++)
                for (int rs = 0; rs < 9; rs++)
                    f[rs][l] = flip ? w[((size_t)(c0 + l) * g->Co + co) * 9 + 8 - rs]
                                    : w[((size_t)co * g->Ci + c0 + l) * 9 + rs];
            for (int i = 0; i < 6; i++)
                for (int s = 0; s < 3; s++)
                    for (int l = 0; l < L; l++)
                        t[i][s][l] =
                            G[i][0] * f[s][l] + G[i][1] * f[3 + s][l] + G[i][2] * f[6 + s][l];
            for (int i = 0; i < 6; i++)
                for (int j = 0; j < 6; j++) {
                    double x[L];
                    for (int l = 0; l < L; l++)
                        x[l] = t[i][0][l] * G[j][0] + t[i][1][l] * G[j][1] + t[i][2][l] * G[j][2];
                    float *o = u +
                               (((size_t)(i * 6 + j) * (g->Kp / KB) + co / KB) * g->Ci + c0) * KB +
                               co % KB;
                    for (int l = 0; l < nl; l++)
                        o[(size_t)l * KB] = (float)x[l];
                }
        }
}

/*
 * B^T of 6 values a .. f into o[0 .. 5] (one column of a window, or one row of its half
 * transform). The helpers below take each stream as its own restrict pointer: with one pointer and
 * offsets GCC needs more run-time alias checks than it will emit, and leaves the loops scalar.
 */
#define BT6(o, a, b, c, d, e, f)                                                                   \
    do {                                                                                           \
        __auto_type a_ = (a);                                                                      \
        __auto_type b_ = (b);                                                                      \
        __auto_type c_ = (c);                                                                      \
        __auto_type d_ = (d);                                                                      \
        __auto_type e_ = (e);                                                                      \
        __auto_type f_ = (f);                                                                      \
        o[0] = 4.0f * a_ - 5.0f * c_ + e_, o[1] = d_ + e_ - 4.0f * (b_ + c_);                      \
        o[2] = e_ - d_ + 4.0f * (b_ - c_), o[3] = e_ - c_ + 2.0f * (d_ - b_);                      \
        o[4] = e_ - c_ - 2.0f * (d_ - b_), o[5] = 4.0f * b_ - 5.0f * d_ + f_;                      \
    } while (0)

/*
 * One tile row's B^T d for F(4x4): 6 rows of n from the 6 input rows r[k], of which lim[k] floats
 * may be read, in whole vectors. The last one reads zeros past n (whole, masked, where lim allows;
 * else one by one) and so stores zeros there, which keeps the pad columns it runs over zero: GCC's
 * own loop left 12 of 28 columns and all of 14 and 7 to scalar code.
 */
static inline __attribute__((always_inline)) void vertical4(float *restrict o0, float *restrict o1,
                                                            float *restrict o2, float *restrict o3,
                                                            float *restrict o4, float *restrict o5,
                                                            const float *const r[6],
                                                            const size_t lim[6], int n)
{
    static const vi lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    for (int w = 0; w < n; w += V) {
        int nl = n - w < V ? n - w : V;
        vf a[6];
#pragma GCC unroll 6
        for (int k = 0; k < 6; k++) {
            if (nl == V) {
                a[k] = ld(r[k] + w);
            } else if (lim[k] >= (size_t)w + V) {
                a[k] = (vf)((vi)ld(r[k] + w) & (lane < nl));
            } else {
                float t[V] = {0};
                for (int i = 0; i < nl; i++)
                    t[i] = r[k][w + i];
                a[k] = ld(t);
            }
        }
        vf o[6];
        BT6(o, a[0], a[1], a[2], a[3], a[4], a[5]);
        memcpy(o0 + w, &o[0], sizeof(vf)), memcpy(o1 + w, &o[1], sizeof(vf));
        memcpy(o2 + w, &o[2], sizeof(vf)), memcpy(o3 + w, &o[3], sizeof(vf));
        memcpy(o4 + w, &o[4], sizeof(vf)), memcpy(o5 + w, &o[5], sizeof(vf));
    }
}

/*
 * Lanes of the two-vector shuffles that split 16 tiles of 4 consecutive floats (4 vectors) into 4
 * vectors of one column each, and join them back: GCC left these stride-4 loops scalar on 16 tiles
 * (a 14x14 image), so they are written out. Lanes from 16 on are the second vector's. DI_PAIR(k):
 * lanes 2 t + j = column k + j of tile t from a pair of vectors of 4 tiles each; DI_HALF(j): lane
 * t = lane 2 t + j of a pair (8 tiles each);
 * IL_PAIR(o): lanes 2 t, 2 t + 1 = lane o + t of each of a pair; IL_QUAD(o): lanes 4 t .. 4 t + 3
 * = lanes o + 2 t, o + 2 t + 1 of each of a pair.
 */
#define DI_PAIR(k, l) (4 * ((l) / 2) + (k) + (l) % 2)
#define DI_HALF(j, l) (2 * (l) + (j))
#define IL_PAIR(o, l) ((l) % 2 ? V + (o) + (l) / 2 : (o) + (l) / 2)
#define IL_QUAD(o, l)                                                                              \
    ((l) % 4 < 2 ? (o) + 2 * ((l) / 4) + (l) % 4 : V + (o) + 2 * ((l) / 4) + (l) % 4 - 2)
#define ROT1(z, l) ((l) + 1)
#define LANES(f, a)                                                                                \
    {                                                                                              \
        f(a, 0), f(a, 1), f(a, 2), f(a, 3), f(a, 4), f(a, 5), f(a, 6), f(a, 7), f(a, 8), f(a, 9),  \
            f(a, 10), f(a, 11), f(a, 12), f(a, 13), f(a, 14), f(a, 15)                             \
    }

/*
 * One half-transformed row's B times d for the n tiles along it (tile u at q[4 u] .. q[4 u + 5]),
 * 16 tiles at a time: the last vector stores up to 15 tiles past n and reads up to 64 floats past
 * q[4 n] (plan_init leaves the room)
 */
static inline __attribute__((always_inline)) void
horizontal4(float *restrict v0, float *restrict v1, float *restrict v2, float *restrict v3,
            float *restrict v4, float *restrict v5, const float *restrict q, int n)
{
    static const vi p01 = LANES(DI_PAIR, 0), p23 = LANES(DI_PAIR, 2);
    static const vi h0 = LANES(DI_HALF, 0), h1 = LANES(DI_HALF, 1), r1 = LANES(ROT1, 0);
    for (int u = 0; u < n; u += V) {
        const float *qu = q + 4 * u;
        vf a = ld(qu), b = ld(qu + V), c = ld(qu + 2 * V), d = ld(qu + 3 * V);
        vf e01 = __builtin_shuffle(a, b, p01), e23 = __builtin_shuffle(a, b, p23);
        vf f01 = __builtin_shuffle(c, d, p01), f23 = __builtin_shuffle(c, d, p23);
        vf x0 = __builtin_shuffle(e01, f01, h0), x1 = __builtin_shuffle(e01, f01, h1);
        vf x2 = __builtin_shuffle(e23, f23, h0), x3 = __builtin_shuffle(e23, f23, h1);
        /* columns 4 and 5: the next tile's 0 and 1 */
        vf x4 = __builtin_shuffle(x0, (vf){0} + qu[4 * V], r1);
        vf x5 = __builtin_shuffle(x1, (vf){0} + qu[4 * V + 1], r1);
        vf o[6];
        BT6(o, x0, x1, x2, x3, x4, x5);
        memcpy(v0 + u, &o[0], sizeof(vf)), memcpy(v1 + u, &o[1], sizeof(vf));
        memcpy(v2 + u, &o[2], sizeof(vf)), memcpy(v3 + u, &o[3], sizeof(vf));
        memcpy(v4 + u, &o[4], sizeof(vf)), memcpy(v5 + u, &o[5], sizeof(vf));
    }
}

/*
 * vt[xi][c][u] = (B^T d B)[xi] for the tiles u of the images [n0, n1) of x (N, Ci, H, W), F(4x4):
 * the group's images one under the other in the half-transformed planes (an image's last tile
 * row is followed by the next one's first, whose left pad column is zero as the row's own
 * would be), so that the pass along tiles runs over the whole group: a 7x7 image has only 4
 */
MGE__CPU_CLONES
static void input_tiles4(const struct wgeo *g, const struct wplan *pl, float *restrict sl,
                         const float *restrict x, int n0, int n1)
{
    size_t xs = (size_t)g->Ci * g->Tp, ts = pl->tmps; /* between positions xi, planes */
    size_t hw = (size_t)g->H * g->W;
    const float *zr = sl + pl->zr;
    float *tp = sl + pl->tmp;
    for (int c = 0; c < g->Ci; c++) {
        for (int n = n0; n < n1; n++) {
            const float *xc = x + ((size_t)n * g->Ci + c) * hw;
            for (int ty = 0; ty < g->TH; ty++) {
                const float *r[6];
                size_t lim[6];
                for (int k = 0; k < 6; k++) {
                    int h = 4 * ty - 1 + k, in = h >= 0 && h < g->H;
                    r[k] = in ? xc + (size_t)h * g->W : zr;
                    lim[k] = in ? (size_t)(g->H - h) * g->W : pl->tmp; /* to the plane's end */
                }
                /* past the image's row: zeros (the pad columns), then the next row's */
                float *o = tp + ((size_t)(n - n0) * g->TH + ty) * g->Wp + 1;
                vertical4(o, o + ts, o + 2 * ts, o + 3 * ts, o + 4 * ts, o + 5 * ts, r, lim, g->W);
            }
        }
        float *v = vt_at(g, pl, sl, c, 0);
        for (int i = 0; i < 6; i++) {
            float *v0 = v + (size_t)(6 * i) * xs;
            horizontal4(v0, v0 + xs, v0 + 2 * xs, v0 + 3 * xs, v0 + 4 * xs, v0 + 5 * xs,
                        tp + (size_t)i * ts, (n1 - n0) * g->NU);
        }
    }
}

/* A^T of 6 values a .. f into o[0 .. 3] */
#define AT6(o, a, b, c, d, e, f)                                                                   \
    do {                                                                                           \
        __auto_type bm_ = (b) - (c);                                                               \
        __auto_type bp_ = (b) + (c);                                                               \
        __auto_type dm_ = (d) - (e);                                                               \
        __auto_type dp_ = (d) + (e);                                                               \
        o[0] = (a) + bp_ + dp_, o[1] = bm_ + 2.0f * dm_;                                           \
        o[2] = bp_ + 4.0f * dp_, o[3] = bm_ + 8.0f * dm_ + (f);                                    \
    } while (0)

/*
 * M times A along one row of the n tiles' positions (m0 .. m5) into o (tile u at o[4 u]), 16
 * tiles at a time: the last vector reads up to 15 tiles past n and writes up to 60 floats past
 * o[4 n] (plan_init leaves the room)
 */
static inline __attribute__((always_inline)) void
horizontal_out4(float *restrict o, const float *restrict m0, const float *restrict m1,
                const float *restrict m2, const float *restrict m3, const float *restrict m4,
                const float *restrict m5, int n)
{
    static const vi i0 = LANES(IL_PAIR, 0), i8 = LANES(IL_PAIR, 8);
    static const vi q0 = LANES(IL_QUAD, 0), q8 = LANES(IL_QUAD, 8);
    for (int u = 0; u < n; u += V) {
        vf y[4];
        AT6(y, ld(m0 + u), ld(m1 + u), ld(m2 + u), ld(m3 + u), ld(m4 + u), ld(m5 + u));
        vf e01 = __builtin_shuffle(y[0], y[1], i0), f01 = __builtin_shuffle(y[0], y[1], i8);
        vf e23 = __builtin_shuffle(y[2], y[3], i0), f23 = __builtin_shuffle(y[2], y[3], i8);
        vf t[4] = {__builtin_shuffle(e01, e23, q0), __builtin_shuffle(e01, e23, q8),
                   __builtin_shuffle(f01, f23, q0), __builtin_shuffle(f01, f23, q8)};
        /* one at a time: an array copy went through the stack */
        memcpy(o + 4 * u, &t[0], sizeof(vf)), memcpy(o + 4 * u + V, &t[1], sizeof(vf));
        memcpy(o + 4 * u + 2 * V, &t[2], sizeof(vf)), memcpy(o + 4 * u + 3 * V, &t[3], sizeof(vf));
    }
}

/* y's rows y0 .. y3 (the first @nrows) of one tile row: A^T of the 6 planes s0 .. s5, plus @bv,
 * added to what is there when @acc */
static inline __attribute__((always_inline)) void
output_rows4(float *restrict y0, float *restrict y1, float *restrict y2, float *restrict y3,
             const float *restrict s0, const float *restrict s1, const float *restrict s2,
             const float *restrict s3, const float *restrict s4, const float *restrict s5, int W,
             float bv, int acc, int nrows)
{
    float *yr[4] = {y0, y1, y2, y3};
    for (int w = 0; w < W; w += V) {
        vf r[4];
        AT6(r, ld(s0 + w), ld(s1 + w), ld(s2 + w), ld(s3 + w), ld(s4 + w), ld(s5 + w));
        int n = W - w < V ? W - w : V;
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            if (k >= nrows)
                break;
            /* a row's last lanes one by one (GCC's own loop left 12 of 28 and all of 14 and 7 to
             * scalar code, transform included) */
            st_lanes(yr[k] + w, r[k] + bv, n, acc);
        }
    }
}

/*
 * The outputs of the images [n0, n1) into y (N, Co, H, W) from mt's tiles, F(4x4): M times A over
 * the whole group's tiles into 6 flat planes (images one under the other, as input_tiles4's),
 * then A^T straight into y, plus bias[co] (may be NULL), added to what y holds when @acc
 */
MGE__CPU_CLONES
static void output_tiles4(const struct wgeo *g, const struct wplan *pl, float *restrict sl,
                          float *restrict y, const float *restrict mt, int n0, int n1,
                          const float *bias, int acc)
{
    size_t xs = (size_t)g->Kp * g->Tp, ts = pl->tmps; /* between positions xi, planes */
    float *sp = sl + pl->tmp + 6 * ts;
    for (int co = 0; co < g->Co; co++) {
        const float *m = mt + (size_t)co * g->Tp;
        for (int i = 0; i < 6; i++) {
            const float *m0 = m + (size_t)(6 * i) * xs;
            horizontal_out4(sp + (size_t)i * ts, m0, m0 + xs, m0 + 2 * xs, m0 + 3 * xs, m0 + 4 * xs,
                            m0 + 5 * xs, (n1 - n0) * g->NU);
        }
        float bv = bias ? bias[co] : 0.0f;
        for (int j = 0; j < (n1 - n0) * g->TH; j++) {
            int ty = j % g->TH;
            float *yc = y + ((size_t)(n0 + j / g->TH) * g->Co + co) * g->H * g->W;
            const float *s = sp + (size_t)j * g->Wp;
            size_t W = (size_t)g->W;
            float *y0 = yc + 4 * ty * W;
            /* rows past the image point at y0 and are not written */
            int nrows = g->H - 4 * ty < 4 ? g->H - 4 * ty : 4;
            float *y1 = nrows > 1 ? y0 + W : y0, *y2 = nrows > 2 ? y0 + 2 * W : y0;
            float *y3 = nrows > 3 ? y0 + 3 * W : y0;
            if (nrows == 4 && acc)
                output_rows4(y0, y1, y2, y3, s, s + ts, s + 2 * ts, s + 3 * ts, s + 4 * ts,
                             s + 5 * ts, g->W, bv, 1, 4);
            else if (nrows == 4)
                output_rows4(y0, y1, y2, y3, s, s + ts, s + 2 * ts, s + 3 * ts, s + 4 * ts,
                             s + 5 * ts, g->W, bv, 0, 4);
            else
                output_rows4(y0, y1, y2, y3, s, s + ts, s + 2 * ts, s + 3 * ts, s + 4 * ts,
                             s + 5 * ts, g->W, bv, acc, nrows);
        }
    }
}

/* The images [n0, n1) of one work item: out (+)= conv(inp) (+ bias) through this slot's scratch */
static void group(const struct wplan *pl, float *sl, const float *u, float *out, const float *inp,
                  const float *bias, int acc, int n0, int n1)
{
    const struct wgeo *g = &pl->g;
    size_t in_img = (size_t)g->Ci * g->H * g->W, out_img = (size_t)g->Co * g->H * g->W;
    if (g->m == 4)
        input_tiles4(g, pl, sl, inp, n0, n1);
    else
        for (int n = n0; n < n1; n++)
            input_tiles(g, pl, sl, inp + (size_t)n * in_img, (n - n0) * g->NU);
    int nt = ((n1 - n0) * g->NU + V - 1) / V * V;
    gemms(g, sl + pl->mt, sl + pl->vt, u, nt);
    if (g->m == 4)
        output_tiles4(g, pl, sl, out, sl + pl->mt, n0, n1, bias, acc);
    else
        for (int n = n0; n < n1; n++)
            output_tiles(g, pl, sl, out + (size_t)n * out_img, sl + pl->mt, (n - n0) * g->NU, bias,
                         acc);
}

static void run(const struct wplan *pl, float *out, const float *inp, const float *w, int flip,
                const float *bias, int acc, void *scratch)
{
    const struct wgeo *g = &pl->g;
    float *base = aligned(scratch);
    (g->m == 4 ? filter_transform4 : filter_transform)(g, base + pl->u, w, flip);
    int ngroups = (pl->N + g->G - 1) / g->G;
    int nt = mge_cpu_threads();
    nt = nt < pl->slots ? nt : pl->slots;
    nt = nt < ngroups ? nt : ngroups;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *sl = base + pl->slot0 + (size_t)omp_get_thread_num() * pl->slot;
        /* the zero row, the planes' pad columns, and tiles past the last image (lanes whose
         * outputs are dropped) */
        memset(sl, 0, (pl->vt + (size_t)g->nx * g->Ci * g->Tp) * sizeof(float));
#pragma omp for schedule(static)
        for (int i = 0; i < ngroups; i++) {
            int n0 = i * g->G, n1 = n0 + g->G < pl->N ? n0 + g->G : pl->N;
            group(pl, sl, base + pl->u, out, inp, bias, acc, n0, n1);
        }
    }
}

/* The forward (@data 0) or the data gradient (@data 1) in tiles of m x m outputs */
static int forward_or_data(const struct mge_cpu_conv *cv, int data, int m, float *out,
                           const float *inp, const float *w, const float *bias, void *scratch,
                           int acc)
{
    if (!mge__conv_winograd_ok(cv))
        return -1;
    struct wplan pl;
    plan_init(&pl, cv, data, m);
    run(&pl, out, inp, w, data, bias, acc, scratch);
    return 0;
}

int mge__conv_winograd_forward(const struct mge_cpu_conv *cv, int m, float *out, const float *inp,
                               const float *w, const float *bias, void *scratch)
{
    return forward_or_data(cv, 0, m == 4 ? 4 : 2, out, inp, w, bias, scratch, 0);
}

int mge__conv_winograd_backward_data(const struct mge_cpu_conv *cv, int m, float *dinp,
                                     const float *dout, const float *w, void *scratch, int acc)
{
    return forward_or_data(cv, 1, m == 4 ? 4 : 2, dinp, dout, w, NULL, scratch, acc);
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
    struct mge__wdw_plan w;
    mge__wdw_plan_init(&w, cv, 2, DW_MIN_TILES);
    size_t t = w.total;
    for (int i = 0; i < 4; i++) { /* forward and data gradient, F(2x2) and F(4x4) */
        struct wplan p;
        plan_init(&p, cv, i % 2, i < 2 ? 2 : 4);
        t = p.total > t ? p.total : t;
    }
    return t * sizeof(float) + 64;
}
