/* test_kernels.c: CPU kernels against naive references, backwards against finite differences. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/conv_winograd_dw_int.h"
#include "kernels/cpu/cpu_int.h"
#include "tests/unit/support/check_run.h"

/*
 * Tolerances. Against a naive reference: rel 1e-5 / abs 1e-5 (same float maths, different
 * order). GEMM against the double-accumulating reference: rel 1e-4 / abs 1e-4. Backward against
 * central differences of the forward (eps 1e-3, loss = sum(out * dout) accumulated in double):
 * rel 1e-2 / abs 1e-3 (FD_REL, FD_ABS), looser where the loss is a float mean (stated there).
 */
#define FD_EPS 1e-3f
#define FD_REL 1e-2
#define FD_ABS 1e-3

static uint64_t rng_state;

static float frand(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float *rnd_new(int64_t n)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(p);
    for (int64_t i = 0; i < n; i++)
        p[i] = frand();
    return p;
}

static float *copy_new(const float *x, int64_t n)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(p);
    memcpy(p, x, (size_t)n * sizeof(float));
    return p;
}

static void assert_close(const char *what, const float *got, const float *want, int64_t n,
                         double rel, double abs_tol)
{
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        ck_assert_msg(d <= abs_tol + rel * fabs((double)want[i]), "%s[%lld]: got %.7g want %.7g",
                      what, (long long)i, (double)got[i], (double)want[i]);
    }
}

/* Forward under test: writes nout outputs from the nx inputs in x. */
typedef void (*fwd_fn)(void *ctx, float *out, const float *x);

/* Central-difference gradient of sum(out * dout) with respect to x, in double, step @eps. */
static void fd_grad_eps(fwd_fn f, void *ctx, float *x, int64_t nx, int64_t nout, const float *dout,
                        float *grad, float eps)
{
    float *out = malloc((size_t)nout * sizeof(float));
    ck_assert_ptr_nonnull(out);
    for (int64_t i = 0; i < nx; i++) {
        float save = x[i];
        double lp = 0.0, lm = 0.0;
        x[i] = save + eps;
        f(ctx, out, x);
        for (int64_t j = 0; j < nout; j++)
            lp += (double)out[j] * dout[j];
        x[i] = save - eps;
        f(ctx, out, x);
        for (int64_t j = 0; j < nout; j++)
            lm += (double)out[j] * dout[j];
        x[i] = save;
        grad[i] = (float)((lp - lm) / (2.0 * eps));
    }
    free(out);
}

static void fd_grad(fwd_fn f, void *ctx, float *x, int64_t nx, int64_t nout, const float *dout,
                    float *grad)
{
    fd_grad_eps(f, ctx, x, nx, nout, dout, grad, FD_EPS);
}

/* acc check: a backward run with acc on a buffer holding @base must give base + fresh result. */
static void assert_acc(const char *what, const float *acc_result, const float *base,
                       const float *fresh, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double want = (double)base[i] + fresh[i];
        ck_assert_msg(fabs(acc_result[i] - want) <= 1e-5 + 1e-5 * fabs(want),
                      "%s acc[%lld]: got %g want %g", what, (long long)i, (double)acc_result[i],
                      want);
    }
}

/* ---- GEMM ------------------------------------------------------------------------------- */

static void check_gemm(int backend, int ta, int tb, int M, int N, int K)
{
    int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 7;
    int arows = ta ? K : M, brows = tb ? N : K;
    float *A = rnd_new((int64_t)arows * lda), *B = rnd_new((int64_t)brows * ldb);
    float *C = rnd_new((int64_t)M * ldc), *R = copy_new(C, (int64_t)M * ldc);
    mge__cpu_sgemm_with(backend, ta, tb, M, N, K, 0.7f, A, lda, B, ldb, 0.3f, C, ldc);
    mge_cpu_sgemm_ref(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, 0.3f, R, ldc);
    /* the padding columns of C (N..ldc) must be left alone: R was never written there either */
    for (int64_t i = 0; i < (int64_t)M * ldc; i++)
        ck_assert_msg(fabsf(C[i] - R[i]) <= 1e-4f + 1e-4f * fabsf(R[i]),
                      "%s ta=%d tb=%d %dx%dx%d: C[%lld] = %g, ref %g",
                      mge__gemm_backend_name(backend), ta, tb, M, N, K, (long long)i, (double)C[i],
                      (double)R[i]);
    free(A);
    free(B);
    free(C);
    free(R);
}

START_TEST(test_sgemm_transposes_strides)
{
    static const int dims[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {128, 96, 80}, {6, 784, 25}};
    rng_state = 1;
    for (int b = MGE__GEMM_AUTO; b < MGE__GEMM_COUNT; b++)
        for (int t = 0; t < 4; t++)
            for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++)
                check_gemm(b, t >> 1, t & 1, dims[d][0], dims[d][1], dims[d][2]);
}
END_TEST

START_TEST(test_sgemm_public_and_beta_zero)
{
    /* beta == 0 must not read C: NaN there must not leak into the result */
    int M = 64, N = 48, K = 40;
    rng_state = 2;
    float *A = rnd_new(M * K), *B = rnd_new(N * K), *C = malloc(sizeof(float) * M * N);
    float *R = malloc(sizeof(float) * M * N);
    ck_assert_ptr_nonnull(C);
    ck_assert_ptr_nonnull(R);
    for (int i = 0; i < M * N; i++)
        C[i] = NAN;
    mge_cpu_sgemm(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
    mge_cpu_sgemm_ref(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, R, N);
    assert_close("C", C, R, M * N, 1e-4, 1e-4);
    const char *name = mge_cpu_sgemm_backend();
    ck_assert(strcmp(name, "dnnl") == 0 || strcmp(name, "openblas") == 0 ||
              strcmp(name, "dnnl-omp") == 0 || strcmp(name, "ref") == 0);
    free(A);
    free(B);
    free(C);
    free(R);
}
END_TEST

START_TEST(test_sgemm_ref_by_hand)
{
    /* [1 2; 3 4] @ [5 6; 7 8] = [19 22; 43 50]; with alpha 2, beta 1 over C = 1 */
    const float A[] = {1, 2, 3, 4}, B[] = {5, 6, 7, 8};
    float C[] = {1, 1, 1, 1};
    const float want[] = {39, 45, 87, 101};
    mge_cpu_sgemm_ref(0, 0, 2, 2, 2, 2.0f, A, 2, B, 2, 1.0f, C, 2);
    assert_close("C", C, want, 4, 0, 0);
    /* A^T @ B^T = (B @ A)^T: B @ A = [23 34; 31 46] */
    float D[4];
    const float wantT[] = {23, 31, 34, 46};
    mge_cpu_sgemm_ref(1, 1, 2, 2, 2, 1.0f, A, 2, B, 2, 0.0f, D, 2);
    assert_close("D", D, wantT, 4, 0, 0);
}
END_TEST

START_TEST(test_threads)
{
    int old = mge_cpu_threads();
    mge_cpu_set_threads(1);
    ck_assert_int_eq(mge_cpu_threads(), 1);
    mge_cpu_set_threads(2);
    ck_assert_int_eq(mge_cpu_threads(), 2);
    mge_cpu_set_threads(0);
    ck_assert_int_ge(mge_cpu_threads(), 1);
    mge_cpu_set_threads(old);
}
END_TEST

/* ---- elementwise ------------------------------------------------------------------------ */

static int g_op; /* context for the forward wrappers below */

static void unary_fwd(void *ctx, float *out, const float *x)
{
    mge_cpu_unary_forward(g_op, out, x, *(int64_t *)ctx);
}

static float unary_naive(int op, float x)
{
    double d = x;
    switch (op) {
    case MGE_CPU_RELU:
        return x > 0 ? x : 0;
    case MGE_CPU_GELU:
        return (float)(0.5 * d * (1 + tanh(sqrt(2 / M_PI) * (d + 0.044715 * d * d * d))));
    case MGE_CPU_TANH:
        return (float)tanh(d);
    case MGE_CPU_SIGMOID:
        return (float)(1 / (1 + exp(-d)));
    default:
        return x;
    }
}

START_TEST(test_unary_forward_backward)
{
    int64_t n = 200;
    rng_state = 3;
    for (int op = MGE_CPU_IDENTITY; op <= MGE_CPU_SIGMOID; op++) {
        float *x = rnd_new(n), *dout = rnd_new(n), *y = rnd_new(n), *want = rnd_new(n);
        float *dx = rnd_new(n), *num = rnd_new(n), *base = rnd_new(n), *dxa = copy_new(base, n);
        for (int64_t i = 0; i < n; i++)
            x[i] = 3.0f * x[i] + (x[i] >= 0 ? 0.01f : -0.01f); /* keep relu's kink away from FD */
        for (int64_t i = 0; i < n; i++)
            want[i] = unary_naive(op, x[i]);
        mge_cpu_unary_forward(op, y, x, n);
        assert_close("unary", y, want, n, 1e-5, 1e-6);
        float *inplace = copy_new(x, n);
        mge_cpu_unary_forward(op, inplace, inplace, n);
        assert_close("unary in place", inplace, y, n, 0, 0);

        mge_cpu_unary_backward(op, dx, dout, x, y, n, 0);
        g_op = op;
        fd_grad(unary_fwd, &n, x, n, n, dout, num);
        assert_close("unary backward vs FD", dx, num, n, FD_REL, FD_ABS);
        mge_cpu_unary_backward(op, dxa, dout, x, y, n, 1);
        assert_acc("unary backward", dxa, base, dx, n);
        free(x), free(dout), free(y), free(want), free(dx), free(num), free(base), free(dxa);
        free(inplace);
    }
}
END_TEST

START_TEST(test_gelu_values)
{
    /* tanh approximation: gelu(1) = 0.8411920, gelu(-1) = -0.1588080, gelu(2) = 1.9545977 */
    const float x[] = {0.0f, 1.0f, -1.0f, 2.0f}, want[] = {0.0f, 0.841192f, -0.158808f, 1.954598f};
    float y[4];
    mge_cpu_unary_forward(MGE_CPU_GELU, y, x, 4);
    assert_close("gelu", y, want, 4, 1e-5, 1e-6);
}
END_TEST

START_TEST(test_bias_act)
{
    int64_t R = 37, Cn = 70; /* cols not a multiple of the 64-column block in bias_backward */
    rng_state = 4;
    for (int act = MGE_CPU_IDENTITY; act <= MGE_CPU_SIGMOID; act++) {
        float *x = rnd_new(R * Cn), *b = rnd_new(Cn), *y = rnd_new(R * Cn), *w = rnd_new(R * Cn);
        mge_cpu_bias_act_forward(act, y, x, b, R, Cn);
        for (int64_t i = 0; i < R * Cn; i++)
            w[i] = unary_naive(act, x[i] + b[i % Cn]);
        assert_close("bias_act", y, w, R * Cn, 1e-5, 1e-6);
        mge_cpu_bias_act_forward(act, x, x, b, R, Cn); /* in place */
        assert_close("bias_act in place", x, y, R * Cn, 0, 0);
        mge_cpu_bias_act_forward(act, y, x, NULL, R, Cn);
        for (int64_t i = 0; i < R * Cn; i++)
            w[i] = unary_naive(act, x[i]);
        assert_close("bias_act no bias", y, w, R * Cn, 1e-5, 1e-6);
        free(x), free(b), free(y), free(w);
    }
}
END_TEST

START_TEST(test_bias_backward)
{
    int64_t R = 600, Cn = 150; /* R * Cn > MGE__PAR_MIN: the threaded path */
    rng_state = 5;
    float *d = rnd_new(R * Cn), *db = rnd_new(Cn), *want = rnd_new(Cn), *base = rnd_new(Cn);
    float *dba = copy_new(base, Cn), *again = rnd_new(Cn);
    for (int64_t c = 0; c < Cn; c++) {
        double s = 0;
        for (int64_t r = 0; r < R; r++)
            s += d[r * Cn + c];
        want[c] = (float)s;
    }
    mge_cpu_bias_backward(db, d, R, Cn, 0);
    assert_close("dbias", db, want, Cn, 1e-4, 1e-4);
    mge_cpu_bias_backward(dba, d, R, Cn, 1);
    assert_acc("dbias", dba, base, db, Cn);
    mge_cpu_bias_backward(again, d, R, Cn, 0);
    ck_assert(memcmp(again, db, sizeof(float) * Cn) == 0);
    free(d), free(db), free(want), free(base), free(dba), free(again);
}
END_TEST

/* strides of a contiguous tensor of @shape, 0 where shape is 1 (broadcast) */
static void bstrides(const int64_t *shape, int ndim, int64_t *st)
{
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        st[d] = shape[d] == 1 ? 0 : s;
        s *= shape[d];
    }
}

static int64_t dot_idx(int64_t flat, const int64_t *shape, const int64_t *st, int ndim)
{
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; d--) {
        off += (flat % shape[d]) * st[d];
        flat /= shape[d];
    }
    return off;
}

struct bin_ctx {
    int op, wrt_b;
    const float *other;
    int64_t as[4], bs[4], shape[4];
};

static void binary_fwd(void *vctx, float *out, const float *x)
{
    struct bin_ctx *c = vctx;
    if (c->wrt_b)
        mge_cpu_binary_forward(c->op, out, c->other, c->as, x, c->bs, c->shape, 4);
    else
        mge_cpu_binary_forward(c->op, out, x, c->as, c->other, c->bs, c->shape, 4);
}

START_TEST(test_binary_broadcast_sum_to)
{
    /* (2,3,4,5) op (1,3,1,5), (2,1,4,1) op (2,3,4,5), and two whose trailing dims merge into
     * longer rows: (2,3,4,5) op (2,3,4,5) (one row) and op (2,3,1,1); all four ops */
    static const int64_t shape[4] = {2, 3, 4, 5};
    static const int64_t ashapes[4][4] = {{2, 3, 4, 5}, {2, 1, 4, 1}, {2, 3, 4, 5}, {2, 3, 4, 5}};
    static const int64_t bshapes[4][4] = {{1, 3, 1, 5}, {2, 3, 4, 5}, {2, 3, 4, 5}, {2, 3, 1, 1}};
    int64_t n = 120;
    rng_state = 6;
    for (int cs = 0; cs < 4; cs++) {
        for (int op = MGE_CPU_ADD; op <= MGE_CPU_DIV; op++) {
            struct bin_ctx c = {.op = op};
            memcpy(c.shape, shape, sizeof(shape));
            bstrides(ashapes[cs], 4, c.as);
            bstrides(bshapes[cs], 4, c.bs);
            int64_t na = 1, nb = 1;
            for (int d = 0; d < 4; d++)
                na *= ashapes[cs][d], nb *= bshapes[cs][d];
            float *a = rnd_new(na), *b = rnd_new(nb), *out = rnd_new(n), *want = rnd_new(n);
            for (int64_t i = 0; i < nb; i++)
                b[i] = b[i] >= 0 ? b[i] + 0.5f : b[i] - 0.5f; /* away from 0 for div */
            mge_cpu_binary_forward(op, out, a, c.as, b, c.bs, shape, 4);
            for (int64_t i = 0; i < n; i++) {
                float x = a[dot_idx(i, shape, c.as, 4)], y = b[dot_idx(i, shape, c.bs, 4)];
                want[i] = op == MGE_CPU_ADD   ? x + y
                          : op == MGE_CPU_SUB ? x - y
                          : op == MGE_CPU_MUL ? x * y
                                              : x / y;
            }
            assert_close("binary", out, want, n, 1e-6, 0);

            /* Backward through sum_to: dA = sum_to(dout * dout/da), dout/da from the op. */
            float *dout = rnd_new(n), *t = rnd_new(n), *da = rnd_new(na), *db = rnd_new(nb);
            float *num = rnd_new(na > nb ? na : nb);
            for (int64_t i = 0; i < n; i++) {
                float y = b[dot_idx(i, shape, c.bs, 4)];
                t[i] = op == MGE_CPU_MUL ? dout[i] * y : op == MGE_CPU_DIV ? dout[i] / y : dout[i];
            }
            mge_cpu_sum_to(da, c.as, t, shape, 4, 0);
            c.other = b;
            c.wrt_b = 0;
            fd_grad(binary_fwd, &c, a, na, n, dout, num);
            assert_close("binary dA (sum_to) vs FD", da, num, na, FD_REL, FD_ABS);
            for (int64_t i = 0; i < n; i++) {
                float x = a[dot_idx(i, shape, c.as, 4)], y = b[dot_idx(i, shape, c.bs, 4)];
                t[i] = op == MGE_CPU_SUB   ? -dout[i]
                       : op == MGE_CPU_MUL ? dout[i] * x
                       : op == MGE_CPU_DIV ? -dout[i] * x / (y * y)
                                           : dout[i];
            }
            mge_cpu_sum_to(db, c.bs, t, shape, 4, 0);
            c.other = a;
            c.wrt_b = 1;
            fd_grad(binary_fwd, &c, b, nb, n, dout, num);
            assert_close("binary dB (sum_to) vs FD", db, num, nb, FD_REL, FD_ABS);

            float *dba = copy_new(db, nb), *fresh = rnd_new(nb);
            mge_cpu_sum_to(dba, c.bs, t, shape, 4, 1);
            mge_cpu_sum_to(fresh, c.bs, t, shape, 4, 0);
            assert_acc("sum_to", dba, db, fresh, nb);
            free(a), free(b), free(out), free(want), free(dout), free(t), free(da), free(db);
            free(num), free(dba), free(fresh);
        }
    }
}
END_TEST

START_TEST(test_sum_to_large)
{
    /* (400, 200) -> (1, 200) and (400, 1): the threaded paths, against double sums */
    static const int64_t shape[2] = {400, 200}, cols[2] = {0, 1}, rows[2] = {1, 0};
    rng_state = 7;
    float *x = rnd_new(80000), *oc = rnd_new(200), *orow = rnd_new(400);
    mge_cpu_sum_to(oc, cols, x, shape, 2, 0);
    mge_cpu_sum_to(orow, rows, x, shape, 2, 0);
    for (int j = 0; j < 200; j++) {
        double s = 0;
        for (int i = 0; i < 400; i++)
            s += x[i * 200 + j];
        ck_assert_msg(fabs(oc[j] - s) < 1e-4, "col %d", j);
    }
    for (int i = 0; i < 400; i++) {
        double s = 0;
        for (int j = 0; j < 200; j++)
            s += x[i * 200 + j];
        ck_assert_msg(fabs(orow[i] - s) < 1e-4, "row %d", i);
    }
    free(x), free(oc), free(orow);
}
END_TEST

START_TEST(test_scale_axpy)
{
    int64_t n = 100000;
    rng_state = 8;
    float *x = rnd_new(n), *y = rnd_new(n), *y0 = copy_new(y, n), *o = rnd_new(n);
    mge_cpu_scale(o, x, -2.5f, n);
    mge_cpu_axpy(y, x, 0.5f, n);
    for (int64_t i = 0; i < n; i++) {
        ck_assert_float_eq(o[i], -2.5f * x[i]);
        ck_assert_float_eq(y[i], y0[i] + 0.5f * x[i]);
    }
    free(x), free(y), free(y0), free(o);
}
END_TEST

/* ---- softmax, losses -------------------------------------------------------------------- */

struct rc_ctx {
    int64_t rows, cols;
};

static void softmax_fwd(void *v, float *out, const float *x)
{
    struct rc_ctx *c = v;
    mge_cpu_softmax_forward(out, x, c->rows, c->cols);
}

static void log_softmax_fwd(void *v, float *out, const float *x)
{
    struct rc_ctx *c = v;
    mge_cpu_log_softmax_forward(out, x, c->rows, c->cols);
}

START_TEST(test_softmax)
{
    struct rc_ctx c = {5, 13};
    int64_t n = c.rows * c.cols;
    rng_state = 9;
    float *x = rnd_new(n), *y = rnd_new(n), *ly = rnd_new(n), *dout = rnd_new(n);
    float *dx = rnd_new(n), *num = rnd_new(n), *base = rnd_new(n), *dxa = copy_new(base, n);
    for (int64_t i = 0; i < n; i++)
        x[i] *= 4.0f;
    x[3] = 1000.0f; /* stability: no overflow to inf/nan */
    mge_cpu_softmax_forward(y, x, c.rows, c.cols);
    mge_cpu_log_softmax_forward(ly, x, c.rows, c.cols);
    for (int64_t r = 0; r < c.rows; r++) {
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < c.cols; j++)
            m = fmax(m, x[r * c.cols + j]);
        for (int64_t j = 0; j < c.cols; j++)
            s += exp(x[r * c.cols + j] - m);
        for (int64_t j = 0; j < c.cols; j++) {
            double p = exp(x[r * c.cols + j] - m) / s;
            ck_assert(fabs(y[r * c.cols + j] - p) < 1e-6);
            ck_assert(fabs(ly[r * c.cols + j] - (x[r * c.cols + j] - m - log(s))) < 1e-4);
        }
    }
    x[3] = 0.5f;
    mge_cpu_softmax_forward(y, x, c.rows, c.cols);
    mge_cpu_softmax_backward(dx, dout, y, c.rows, c.cols, 0);
    fd_grad(softmax_fwd, &c, x, n, n, dout, num);
    assert_close("softmax backward vs FD", dx, num, n, FD_REL, FD_ABS);
    mge_cpu_softmax_backward(dxa, dout, y, c.rows, c.cols, 1);
    assert_acc("softmax backward", dxa, base, dx, n);

    memcpy(dxa, base, sizeof(float) * n);
    mge_cpu_log_softmax_forward(ly, x, c.rows, c.cols);
    mge_cpu_log_softmax_backward(dx, dout, ly, c.rows, c.cols, 0);
    fd_grad(log_softmax_fwd, &c, x, n, n, dout, num);
    assert_close("log_softmax backward vs FD", dx, num, n, FD_REL, FD_ABS);
    mge_cpu_log_softmax_backward(dxa, dout, ly, c.rows, c.cols, 1);
    assert_acc("log_softmax backward", dxa, base, dx, n);
    free(x), free(y), free(ly), free(dout), free(dx), free(num), free(base), free(dxa);
}
END_TEST

struct xent_ctx {
    int64_t B, V;
    const int32_t *labels;
    float *probs;
};

static void xent_fwd(void *v, float *out, const float *x)
{
    struct xent_ctx *c = v;
    mge_cpu_softmax_xent_forward(out, c->probs, x, c->labels, c->B, c->V);
}

START_TEST(test_softmax_xent)
{
    int64_t B = 7, V = 10;
    int32_t labels[7] = {0, 9, 3, 3, 5, 1, 8};
    rng_state = 10;
    float *x = rnd_new(B * V), *p = rnd_new(B * V), *dx = rnd_new(B * V), *num = rnd_new(B * V);
    float *base = rnd_new(B * V), *dxa = copy_new(base, B * V), loss;
    for (int64_t i = 0; i < B * V; i++)
        x[i] *= 3.0f;
    mge_cpu_softmax_xent_forward(&loss, p, x, labels, B, V);
    double want = 0;
    for (int64_t r = 0; r < B; r++) {
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < V; j++)
            m = fmax(m, x[r * V + j]);
        for (int64_t j = 0; j < V; j++)
            s += exp(x[r * V + j] - m);
        want += log(s) + m - x[r * V + labels[r]];
        for (int64_t j = 0; j < V; j++)
            ck_assert(fabs(p[r * V + j] - exp(x[r * V + j] - m) / s) < 1e-6);
    }
    ck_assert(fabs(loss - want / B) < 1e-5);

    /* the loss is one float mean: FD noise is ~1e-7 / 2e-3, well inside FD_ABS */
    float dloss = 1.7f;
    mge_cpu_softmax_xent_backward(dx, p, labels, B, V, dloss, 0);
    struct xent_ctx c = {B, V, labels, p};
    fd_grad(xent_fwd, &c, x, B * V, 1, &dloss, num);
    assert_close("xent backward vs FD", dx, num, B * V, FD_REL, FD_ABS);
    mge_cpu_softmax_xent_forward(&loss, p, x, labels, B, V);
    mge_cpu_softmax_xent_backward(dxa, p, labels, B, V, dloss, 1);
    assert_acc("xent backward", dxa, base, dx, B * V);

    /* extreme logits: finite loss */
    x[0] = 200.0f, x[1] = -200.0f;
    mge_cpu_softmax_xent_forward(&loss, p, x, labels, B, V);
    ck_assert(isfinite(loss));
    free(x), free(p), free(dx), free(num), free(base), free(dxa);
}
END_TEST

START_TEST(test_softmax_xent_deterministic)
{
    int64_t B = 8192, V = 10; /* B * V > MGE__PAR_MIN: the threaded path */
    int32_t *labels = malloc(sizeof(int32_t) * B);
    ck_assert_ptr_nonnull(labels);
    rng_state = 11;
    for (int64_t r = 0; r < B; r++)
        labels[r] = (int32_t)(r * 7 % V);
    float *x = rnd_new(B * V), *p = rnd_new(B * V), l1, l2;
    mge_cpu_softmax_xent_forward(&l1, p, x, labels, B, V);
    mge_cpu_softmax_xent_forward(&l2, p, x, labels, B, V);
    ck_assert(memcmp(&l1, &l2, sizeof(float)) == 0);
    int old = mge_cpu_threads();
    mge_cpu_set_threads(1);
    mge_cpu_softmax_xent_forward(&l2, p, x, labels, B, V);
    mge_cpu_set_threads(old);
    ck_assert(memcmp(&l1, &l2, sizeof(float)) == 0); /* fixed chunks: even across thread counts */
    free(labels), free(x), free(p);
}
END_TEST

START_TEST(test_argmax_correct)
{
    const float logits[] = {0.1f, 0.9f, 0.0f, /**/ 2.0f, 2.0f, 1.0f, /**/ -1.0f, -3.0f, -0.5f};
    const int32_t labels[] = {1, 1, 2};
    /* row 0 right; row 1 a tie resolves to the first max (0), so wrong; row 2 right */
    ck_assert_int_eq(mge_cpu_argmax_correct(logits, labels, 3, 3), 2);
}
END_TEST

/* ---- optimisers ------------------------------------------------------------------------- */

START_TEST(test_sgd)
{
    /*
     * p = 1, g = 0.5 twice, lr 0.1, mu 0.9, wd 0.01. Step 1: g' = 0.51, v = 0.51, p = 0.949.
     * Step 2: g' = 0.50949, v = 0.9 * 0.51 + 0.50949 = 0.96849, p = 0.949 - 0.096849 = 0.852151.
     * Nesterov: p = 1 - 0.1 * (0.51 + 0.459) = 0.9031; then g' = 0.509031, v = 0.968031,
     * p = 0.9031 - 0.1 * (0.509031 + 0.8712279) = 0.76507411.
     */
    float p[2] = {1.0f, 1.0f}, v[2] = {0, 0};
    const float g[2] = {0.5f, 0.5f};
    mge_cpu_sgd_update(p, g, v, 1, 0.1f, 0.9f, 0.01f, 0);
    ck_assert_float_eq_tol(p[0], 0.949f, 1e-6f);
    mge_cpu_sgd_update(p, g, v, 1, 0.1f, 0.9f, 0.01f, 0);
    ck_assert_float_eq_tol(p[0], 0.852151f, 1e-6f);
    ck_assert_float_eq_tol(v[0], 0.96849f, 1e-6f);
    /* nesterov: p -= lr * (g' + mu v) */
    p[0] = 1.0f, v[0] = 0.0f;
    mge_cpu_sgd_update(p, g, v, 1, 0.1f, 0.9f, 0.01f, 1);
    ck_assert_float_eq_tol(p[0], 0.9031f, 1e-6f);
    mge_cpu_sgd_update(p, g, v, 1, 0.1f, 0.9f, 0.01f, 1);
    ck_assert_float_eq_tol(p[0], 0.76507411f, 1e-6f);
    /* mu == 0: plain step, v untouched (may be NULL) */
    p[0] = 1.0f;
    mge_cpu_sgd_update(p, g, NULL, 2, 0.1f, 0.0f, 0.0f, 0);
    ck_assert_float_eq_tol(p[0], 0.95f, 1e-7f);
    ck_assert_float_eq_tol(p[1], 0.95f, 1e-7f);
}
END_TEST

START_TEST(test_adam)
{
    /*
     * p = 1, g = 0.5 then -0.25, lr 0.01, betas (0.9, 0.999), eps 1e-8, wd 0.1.
     * Adam (L2): step 1 m^ = g' = 0.6, v^ = 0.36, p = 1 - 0.01 = 0.99 (up to eps).
     * Step 2: g' = -0.25 + 0.099 = -0.151, m = 0.0389, v = 0.000382441 (bias-corrected
     * m^ = 0.204737, v^ = 0.191316), p = 0.99 - 0.01 * 0.204737 / 0.437397 = 0.9853192.
     * AdamW: step 1 p = 1 - 0.001 - 0.01 = 0.989; step 2 m^ = 0.105263, v^ = 0.156203,
     * p = 0.989 - 0.000989 - 0.01 * 0.105263 / 0.395225 = 0.9853476.
     */
    float p = 1.0f, m = 0.0f, v = 0.0f, g = 0.5f;
    mge_cpu_adam_update(&p, &g, &m, &v, 1, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 0, 1);
    ck_assert_float_eq_tol(p, 0.99f, 1e-6f);
    g = -0.25f;
    mge_cpu_adam_update(&p, &g, &m, &v, 1, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 0, 2);
    ck_assert_float_eq_tol(p, 0.98531920f, 1e-6f);
    p = 1.0f, m = 0.0f, v = 0.0f, g = 0.5f;
    mge_cpu_adam_update(&p, &g, &m, &v, 1, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 1, 1);
    ck_assert_float_eq_tol(p, 0.989f, 1e-6f);
    g = -0.25f;
    mge_cpu_adam_update(&p, &g, &m, &v, 1, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, 1, 2);
    ck_assert_float_eq_tol(p, 0.98534763f, 1e-6f);
}
END_TEST

/* ---- convolution, pooling --------------------------------------------------------------- */

static void conv_naive(const struct mge_cpu_conv *cv, float *out, const float *x, const float *w,
                       const float *b)
{
    for (int n = 0; n < cv->N; n++)
        for (int k = 0; k < cv->K; k++)
            for (int p = 0; p < cv->P; p++)
                for (int q = 0; q < cv->Q; q++) {
                    double s = b ? b[k] : 0.0;
                    for (int c = 0; c < cv->C; c++)
                        for (int r = 0; r < cv->R; r++)
                            for (int t = 0; t < cv->S; t++) {
                                int h = p * cv->stride - cv->pad + r;
                                int ww = q * cv->stride - cv->pad + t;
                                if (h < 0 || h >= cv->H || ww < 0 || ww >= cv->W)
                                    continue;
                                s += (double)x[((n * cv->C + c) * cv->H + h) * cv->W + ww] *
                                     w[((k * cv->C + c) * cv->R + r) * cv->S + t];
                            }
                    out[((n * cv->K + k) * cv->P + p) * cv->Q + q] = (float)s;
                }
}

/* dx, dw, db = the backward of conv_naive, accumulated in double (overwrites). */
static void conv_naive_backward(const struct mge_cpu_conv *cv, float *dx, float *dw, float *db,
                                const float *dy, const float *x, const float *w)
{
    int64_t nx = (int64_t)cv->N * cv->C * cv->H * cv->W,
            nw = (int64_t)cv->K * cv->C * cv->R * cv->S;
    double *gx = calloc((size_t)nx, sizeof(double)), *gw = calloc((size_t)nw, sizeof(double));
    double *gb = calloc((size_t)cv->K, sizeof(double));
    ck_assert(gx && gw && gb);
    for (int n = 0; n < cv->N; n++)
        for (int k = 0; k < cv->K; k++)
            for (int p = 0; p < cv->P; p++)
                for (int q = 0; q < cv->Q; q++) {
                    double d = dy[((n * cv->K + k) * cv->P + p) * cv->Q + q];
                    gb[k] += d;
                    for (int c = 0; c < cv->C; c++)
                        for (int r = 0; r < cv->R; r++)
                            for (int t = 0; t < cv->S; t++) {
                                int h = p * cv->stride - cv->pad + r;
                                int ww = q * cv->stride - cv->pad + t;
                                if (h < 0 || h >= cv->H || ww < 0 || ww >= cv->W)
                                    continue;
                                int xi = ((n * cv->C + c) * cv->H + h) * cv->W + ww;
                                int wi = ((k * cv->C + c) * cv->R + r) * cv->S + t;
                                gx[xi] += d * w[wi];
                                gw[wi] += d * x[xi];
                            }
                }
    for (int64_t i = 0; i < nx; i++)
        dx[i] = (float)gx[i];
    for (int64_t i = 0; i < nw; i++)
        dw[i] = (float)gw[i];
    for (int k = 0; k < cv->K; k++)
        db[k] = (float)gb[k];
    free(gx), free(gw), free(gb);
}

struct conv_ctx {
    const struct mge_cpu_conv *cv;
    const float *x, *w, *b;
    void *scratch;
    int wrt; /* 0 x, 1 w, 2 b */
    int backend;
    float eps; /* finite-difference step */
};

static void conv_fwd(void *v, float *out, const float *p)
{
    struct conv_ctx *c = v;
    mge__cpu_conv2d_forward_with(c->backend, c->cv, out, c->wrt == 0 ? p : c->x,
                                 c->wrt == 1 ? p : c->w, c->wrt == 2 ? p : c->b, c->scratch);
}

/*
 * The forward's abs bound in check_conv_with: 1e-5, or 1e-5 * C * R * S (what dinp has for its
 * K * R * S terms) where Winograd F(4x4, 3x3) may run, whose transforms scale intermediates up to
 * ~10x (see test_conv_winograd4)
 */
static int conv_fwd_loose;

/*
 * One conv shape on one backend and thread count: forward against conv_naive, backward against
 * conv_naive_backward (and finite differences when @fd), acc, each output alone, determinism.
 */
static void check_conv_with(int backend, int N, int C, int H, int W, int K, int R, int S,
                            int stride, int pad, int threads, int fd)
{
    int old = mge_cpu_threads();
    mge_cpu_set_threads(threads);
    struct mge_cpu_conv cv = {N, C, H, W, K, R, S, stride, pad, 0, 0, 0};
    ck_assert_int_eq(mge_cpu_conv_init(&cv), 0);
    ck_assert_int_eq(cv.P, (H + 2 * pad - R) / stride + 1);
    int64_t nx = (int64_t)N * C * H * W, nw = (int64_t)K * C * R * S;
    int64_t ny = (int64_t)N * K * cv.P * cv.Q;
    /* abs tolerance grows with the number of float terms summed into one dw or dbias */
    double tol = 1e-5 * sqrt((double)N * cv.P * cv.Q) + 1e-5;
    void *scratch = malloc(mge__conv_scratch_bytes_with(backend, &cv) + sizeof(float));
    ck_assert_ptr_nonnull(scratch);
    scratch = (float *)scratch + 1; /* backends may assume float alignment, no more */
    float *x = rnd_new(nx), *w = rnd_new(nw), *b = rnd_new(K), *y = rnd_new(ny);
    float *want = rnd_new(ny), *dy = rnd_new(ny), *dx = rnd_new(nx), *dw = rnd_new(nw);
    float *db = rnd_new(K), *num = rnd_new(nx > nw ? nx : nw);
    float *rx = rnd_new(nx), *rw = rnd_new(nw), *rb = rnd_new(K);
    double ftol = conv_fwd_loose ? 1e-5 * C * R * S : 1e-5;
    mge__cpu_conv2d_forward_with(backend, &cv, y, x, w, b, scratch);
    conv_naive(&cv, want, x, w, b);
    assert_close("conv forward", y, want, ny, 1e-4, ftol);
    mge__cpu_conv2d_forward_with(backend, &cv, y, x, w, NULL, scratch);
    conv_naive(&cv, want, x, w, NULL);
    assert_close("conv forward, no bias", y, want, ny, 1e-4, ftol);

    mge__cpu_conv2d_backward_with(backend, &cv, dx, dw, db, dy, x, w, scratch, 0);
    conv_naive_backward(&cv, rx, rw, rb, dy, x, w);
    assert_close("conv dinp", dx, rx, nx, 1e-4, 1e-5 * K * R * S);
    assert_close("conv dw", dw, rw, nw, 1e-4, tol);
    assert_close("conv dbias", db, rb, K, 1e-4, tol);
    if (fd) {
        /* a conv is linear in each of x, w and b, so a central difference has no truncation
         * error at any step and only the forward's rounding counts: Winograd's rounds ~3x more
         * than a direct sum (intermediates larger than the outputs) and takes a 10x larger step
         * for the same tolerance */
        float eps = backend == MGE__CONV_WINOGRAD ? 10 * FD_EPS : FD_EPS;
        struct conv_ctx c = {&cv, x, w, b, scratch, 0, backend, eps};
        fd_grad_eps(conv_fwd, &c, x, nx, ny, dy, num, eps);
        assert_close("conv dinp vs FD", dx, num, nx, FD_REL, FD_ABS);
        c.wrt = 1;
        fd_grad_eps(conv_fwd, &c, w, nw, ny, dy, num, eps);
        assert_close("conv dw vs FD", dw, num, nw, FD_REL, FD_ABS);
        c.wrt = 2;
        fd_grad_eps(conv_fwd, &c, b, K, ny, dy, num, eps);
        assert_close("conv dbias vs FD", db, num, K, FD_REL, FD_ABS);
    }

    /* acc, each output on its own (the others NULL), and a second run bit-identical */
    float *bx = rnd_new(nx), *bw = rnd_new(nw), *bb = rnd_new(K);
    float *ax = copy_new(bx, nx), *aw = copy_new(bw, nw), *ab = copy_new(bb, K);
    mge__cpu_conv2d_backward_with(backend, &cv, ax, aw, ab, dy, x, w, scratch, 1);
    assert_acc("conv dinp", ax, bx, dx, nx);
    assert_acc("conv dw", aw, bw, dw, nw);
    assert_acc("conv dbias", ab, bb, db, K);
    float *only = rnd_new(nx > nw ? nx : nw);
    mge__cpu_conv2d_backward_with(backend, &cv, only, NULL, NULL, dy, x, w, scratch, 0);
    ck_assert(memcmp(only, dx, sizeof(float) * nx) == 0);
    mge__cpu_conv2d_backward_with(backend, &cv, NULL, only, NULL, dy, x, w, scratch, 0);
    ck_assert(memcmp(only, dw, sizeof(float) * nw) == 0);
    mge__cpu_conv2d_backward_with(backend, &cv, NULL, NULL, only, dy, x, w, scratch, 0);
    ck_assert(memcmp(only, db, sizeof(float) * K) == 0);
    mge__cpu_conv2d_backward_with(backend, &cv, rx, rw, rb, dy, x, w, scratch, 0);
    ck_assert(memcmp(rx, dx, sizeof(float) * nx) == 0);
    ck_assert(memcmp(rw, dw, sizeof(float) * nw) == 0);
    ck_assert(memcmp(rb, db, sizeof(float) * K) == 0);

    free((float *)scratch - 1), free(x), free(w), free(b), free(y), free(want), free(dy);
    free(dx), free(dw), free(db), free(num), free(bx), free(bw), free(bb), free(ax), free(aw);
    free(ab), free(only), free(rx), free(rw), free(rb);
    mge_cpu_set_threads(old);
}

static const int conv_backends[] = {MGE__CONV_IM2COL, MGE__CONV_DNNL, MGE__CONV_DIRECT};
#define N_CONV_BACKENDS (int)(sizeof(conv_backends) / sizeof(conv_backends[0]))

static void check_conv(int N, int C, int H, int W, int K, int R, int S, int stride, int pad,
                       int threads)
{
    for (int i = 0; i < N_CONV_BACKENDS; i++)
        check_conv_with(conv_backends[i], N, C, H, W, K, R, S, stride, pad, threads, 1);
}

START_TEST(test_conv_stride_pad)
{
    rng_state = 12;
    for (int t = 1; t <= 2; t++) {
        check_conv(3, 2, 7, 6, 4, 3, 3, 2, 1, t);  /* stride 2, padding 1, odd sizes */
        check_conv(2, 1, 8, 8, 3, 5, 5, 1, 2, t);  /* LeNet conv1-like: C = 1, 5x5, pad 2 */
        check_conv(3, 3, 5, 5, 2, 1, 1, 1, 0, t);  /* pointwise: no im2col */
        check_conv(2, 2, 6, 7, 3, 2, 3, 3, 0, t);  /* R != S, stride 3 */
        check_conv(1, 2, 5, 37, 5, 3, 3, 1, 1, t); /* N = 1, Q = 37: three vectors per row */
        check_conv(2, 2, 6, 6, 17, 3, 2, 1, 0, t); /* K = 17: a partial channel block, R != S */
        check_conv(2, 2, 9, 9, 3, 7, 7, 1, 3, t);  /* widest direct kernel */
        check_conv(2, 1, 4, 4, 2, 3, 3, 1, 3, t);  /* pad >= R: direct falls back */
        check_conv(2, 2, 5, 5, 3, 3, 9, 1, 4, t);  /* S > 7: direct falls back */
    }
}
END_TEST

START_TEST(test_conv_lenet_batch)
{
    /* LeNet-5's convs at batch 128: every backend against the plain reference (no FD: slow) */
    rng_state = 14;
    for (int t = 1; t <= 2; t++)
        for (int i = 0; i < N_CONV_BACKENDS; i++) {
            check_conv_with(conv_backends[i], 128, 1, 28, 28, 6, 5, 5, 1, 2, t, 0);
            check_conv_with(conv_backends[i], 128, 6, 14, 14, 16, 5, 5, 1, 0, t, 0);
        }
}
END_TEST

START_TEST(test_conv_flat)
{
    /* narrow images with 3x3 taps: direct computes them flat (rows across vector ends) */
    rng_state = 15;
    for (int t = 1; t <= 2; t++) {
        check_conv(2, 2, 7, 7, 4, 3, 3, 1, 1, t); /* ResNet's 7x7: 4 vectors per plane */
        check_conv(3, 2, 5, 6, 5, 3, 3, 1, 1, t); /* K = 5 and C = 5 (dinp): partial blocks */
        check_conv(2, 3, 6, 5, 9, 3, 2, 1, 0, t); /* R != S, no padding, K = 9 */
        check_conv(2, 2, 9, 3, 7, 1, 1, 1, 0, t); /* pointwise on a 3-wide image */
        /* "auto" on narrow convs with many channels: direct's forward and dinp with im2col's dw
         * (K = 5), and direct whole (K = 16: dw with channels in lanes) */
        check_conv_with(MGE__CONV_AUTO, 2, 9, 7, 7, 5, 3, 3, 1, 1, t, 1);
        check_conv_with(MGE__CONV_AUTO, 2, 9, 6, 6, 16, 3, 3, 1, 1, t, 0);
    }
}
END_TEST

START_TEST(test_conv_resnet_batch)
{
    /* ResNet-20's stride-1 3x3 convs on a few images: every backend against the reference
     * (dinp sums K * 9 terms: too many for float finite differences) */
    rng_state = 16;
    for (int t = 1; t <= 2; t++)
        for (int i = 0; i < N_CONV_BACKENDS; i++) {
            check_conv_with(conv_backends[i], 4, 16, 28, 28, 16, 3, 3, 1, 1, t, 0);
            check_conv_with(conv_backends[i], 5, 32, 14, 14, 32, 3, 3, 1, 1, t, 0);
            check_conv_with(conv_backends[i], 3, 64, 7, 7, 64, 3, 3, 1, 1, t, 0);
            /* dw with channels in lanes, odd vector and channel counts */
            check_conv_with(conv_backends[i], 2, 3, 5, 6, 48, 3, 3, 1, 1, t, 0);
        }
}
END_TEST

/*
 * Winograd F(2x2, 3x3) (forward and dinp; dw is direct's) against the fp64 reference: forward
 * and dinp within rel 1e-4 + abs 1e-5 (dinp: 1e-5 * K * 9), as every backend, on odd shapes
 * (odd H and W: half tiles at the edges; batch 1; channel counts off the 8- and 16-blocks),
 * finite differences where the shapes are small, and ResNet-20's shapes on a few images. Shapes
 * Winograd does not take (stride 2, 5x5, pad 0) pass through to "auto".
 */
START_TEST(test_conv_winograd)
{
    /* backend, N, C, H, W, K, R, S, stride, pad, finite differences */
    static const int shapes[][11] = {
        {MGE__CONV_WINOGRAD, 1, 5, 7, 9, 3, 3, 3, 1, 1, 1},
        {MGE__CONV_WINOGRAD, 1, 3, 1, 1, 2, 3, 3, 1, 1, 1},
        {MGE__CONV_WINOGRAD, 3, 2, 5, 6, 9, 3, 3, 1, 1, 1},
        {MGE__CONV_WINOGRAD, 1, 2, 5, 37, 5, 3, 3, 1, 1, 1},
        {MGE__CONV_WINOGRAD, 2, 17, 9, 7, 19, 3, 3, 1, 1, 0},
        {MGE__CONV_WINOGRAD, 1, 33, 13, 11, 24, 3, 3, 1, 1, 0},
        {MGE__CONV_WINOGRAD, 9, 20, 3, 3, 17, 3, 3, 1, 1, 0},
        {MGE__CONV_WINOGRAD, 4, 16, 28, 28, 16, 3, 3, 1, 1, 0},
        {MGE__CONV_WINOGRAD, 5, 32, 14, 14, 32, 3, 3, 1, 1, 0},
        {MGE__CONV_WINOGRAD, 6, 64, 7, 7, 64, 3, 3, 1, 1, 0},
        {MGE__CONV_WINOGRAD, 3, 2, 7, 6, 4, 3, 3, 2, 1, 1},
        {MGE__CONV_WINOGRAD, 2, 1, 8, 8, 3, 5, 5, 1, 2, 1},
        {MGE__CONV_WINOGRAD, 2, 3, 6, 5, 9, 3, 3, 1, 0, 1},
        /* "auto" takes Winograd from 16 channels in and out */
        {MGE__CONV_AUTO, 2, 16, 9, 7, 16, 3, 3, 1, 1, 0},
    };
    rng_state = 17;
    mge__conv_set_winograd_tile(2);
    for (int t = 1; t <= 2; t++)
        for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
            const int *z = shapes[i];
            check_conv_with(z[0], z[1], z[2], z[3], z[4], z[5], z[6], z[7], z[8], z[9], t, z[10]);
        }
    mge__conv_set_winograd_tile(0);
}
END_TEST

/*
 * Winograd's forward and dinp are the same bits at 1 and 2 threads (one image per output), in
 * F(2x2) and in F(4x4), and the two tiles differ (the switch does switch)
 */
START_TEST(test_conv_winograd_threads)
{
    struct mge_cpu_conv cv = {7, 24, 9, 11, 20, 3, 3, 1, 1, 0, 0, 0};
    int old = mge_cpu_threads();
    mge_cpu_set_threads(2);
    ck_assert_int_eq(mge_cpu_conv_init(&cv), 0);
    int64_t nx = 7 * 24 * 9 * 11, nw = 20 * 24 * 9, ny = 7 * 20 * 9 * 11;
    rng_state = 18;
    void *scratch = malloc(mge__conv_scratch_bytes_with(MGE__CONV_WINOGRAD, &cv));
    ck_assert_ptr_nonnull(scratch);
    float *x = rnd_new(nx), *w = rnd_new(nw), *b = rnd_new(20), *dy = rnd_new(ny);
    float *y[3] = {rnd_new(ny), rnd_new(ny), rnd_new(ny)};
    float *dx[3] = {rnd_new(nx), rnd_new(nx), rnd_new(nx)};
    for (int m = 2; m <= 4; m += 2) {
        mge__conv_set_winograd_tile(m);
        for (int t = 1; t <= 2; t++) {
            mge_cpu_set_threads(t);
            mge__cpu_conv2d_forward_with(MGE__CONV_WINOGRAD, &cv, y[t - 1], x, w, b, scratch);
            mge__cpu_conv2d_backward_with(MGE__CONV_WINOGRAD, &cv, dx[t - 1], NULL, NULL, dy, x, w,
                                          scratch, 0);
        }
        ck_assert(memcmp(y[0], y[1], sizeof(float) * ny) == 0);
        ck_assert(memcmp(dx[0], dx[1], sizeof(float) * nx) == 0);
        if (m == 2) /* keep F(2x2)'s to compare with */
            memcpy(y[2], y[0], sizeof(float) * ny), memcpy(dx[2], dx[0], sizeof(float) * nx);
    }
    mge__conv_set_winograd_tile(0);
    ck_assert(memcmp(y[0], y[2], sizeof(float) * ny) != 0);
    ck_assert(memcmp(dx[0], dx[2], sizeof(float) * nx) != 0);
    free(scratch), free(x), free(w), free(b), free(dy), free(y[0]), free(y[1]), free(y[2]);
    free(dx[0]), free(dx[1]), free(dx[2]);
    mge_cpu_set_threads(old);
}
END_TEST

/* A Winograd weight gradient under test: F(2x2, 3x3)'s or F(4x4, 3x3)'s */
struct wdw_kernel {
    const char *name;
    int f4; /* what mge__conv_winograd_dw_is_f4 says where the dispatch takes it */
    int (*dw)(const struct mge_cpu_conv *cv, float *dw, const float *dout, const float *inp,
              void *scratch, int acc);
    size_t (*scratch_bytes)(const struct mge_cpu_conv *cv);
};

/*
 * Winograd F(4x4, 3x3) (forced wherever Winograd runs; dw stays F(2x2)'s) through check_conv_with:
 * dinp within rel 1e-4 + abs 1e-5 * K * 9 of the fp64 reference, as every backend, and the forward
 * within rel 1e-4 + abs 1e-5 * C * 9, the same bound for its C * 9 terms, where every other
 * backend meets abs 1e-5: the transforms scale intermediates up to ~10x, and the largest errors
 * measured on these shapes (values in [-1, 1]) were 1e-5 (C = 2 .. 5) to 1.5e-4 (C = 64; F(2x2)
 * 1e-6 to 1.2e-5, direct 6e-7 to 2.4e-5), i.e. ~2e-5 of the outputs' typical size, far below what
 * training notices. Also acc, each output alone, a repeat the same bits, finite differences
 * on the small shapes. Shapes whose sides 4 does not divide (1x1, 5x7, 6x6, 7x7, 13x13, 14x14: the
 * last tile of a row reads the next row's first value, the last tile row is partly past the
 * image), and 28x28 (a junk tile per row); batch 1; channel counts off the 8- and 16-blocks; more
 * images than one work item; ResNet-20's shapes on a few images.
 */
START_TEST(test_conv_winograd4)
{
    /* N, C, H, W, K, finite differences */
    static const int shapes[][6] = {
        {1, 3, 1, 1, 2, 1},   {1, 5, 5, 7, 3, 1},     {2, 2, 6, 6, 9, 1},
        {3, 4, 7, 7, 5, 1},   {1, 2, 13, 13, 3, 1},   {1, 3, 14, 14, 2, 1},
        {1, 2, 28, 28, 3, 0}, {2, 17, 13, 13, 19, 0}, {1, 33, 14, 14, 24, 0},
        {20, 9, 7, 7, 23, 0}, {2, 16, 28, 28, 16, 0}, {5, 32, 14, 14, 32, 0},
        {6, 64, 7, 7, 64, 0},
    };
    rng_state = 20;
    conv_fwd_loose = 1;
    mge__conv_set_winograd_tile(4);
    for (int t = 1; t <= 2; t++)
        for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
            const int *z = shapes[i];
            check_conv_with(MGE__CONV_WINOGRAD, z[0], z[1], z[2], z[3], z[4], 3, 3, 1, 1, t, z[5]);
        }
    mge__conv_set_winograd_tile(0);
    /* "auto" with its per-shape choice */
    for (int t = 1; t <= 2; t++) {
        check_conv_with(MGE__CONV_AUTO, 2, 16, 28, 28, 16, 3, 3, 1, 1, t, 0);
        check_conv_with(MGE__CONV_AUTO, 2, 32, 14, 14, 32, 3, 3, 1, 1, t, 0);
        check_conv_with(MGE__CONV_AUTO, 3, 64, 7, 7, 64, 3, 3, 1, 1, t, 0);
    }
    conv_fwd_loose = 0;
}
END_TEST

/*
 * @kn called directly (so no fallback can hide it) on @shapes (N, C, H, W, K) against the fp64
 * reference, within every backend's dw bound (rel 1e-4 + abs 1e-5 * sqrt(N * H * W) + 1e-5), at 1
 * and 2 threads and 1 against 2 within it; a repeat the same bits; through the "winograd" backend
 * the same bits where the dispatch picks @kn; acc adding onto what is there. Stride 2, 5x5 and
 * pad 0 are refused with nothing written and no scratch asked for.
 */
static void check_winograd_dw(const struct wdw_kernel *kn, const int (*shapes)[5], size_t n)
{
    int old = mge_cpu_threads();
    for (size_t i = 0; i < n; i++) {
        const int *z = shapes[i];
        int N = z[0], C = z[1], H = z[2], W = z[3], K = z[4];
        int64_t nx = (int64_t)N * C * H * W, nw = (int64_t)K * C * 9, ny = (int64_t)N * K * H * W;
        float *x = rnd_new(nx), *w = rnd_new(nw), *dy = rnd_new(ny), *rx = rnd_new(nx);
        float *rw = rnd_new(nw), *rb = rnd_new(K), *dw[2] = {rnd_new(nw), rnd_new(nw)};
        float *via = rnd_new(nw), *base = rnd_new(nw), *acc = copy_new(base, nw);
        struct mge_cpu_conv cv = {N, C, H, W, K, 3, 3, 1, 1, 0, 0, 0};
        double tol = 1e-5 * sqrt((double)N * H * W) + 1e-5;
        mge_cpu_set_threads(2);
        ck_assert_int_eq(mge_cpu_conv_init(&cv), 0);
        size_t sb = mge__conv_scratch_bytes_with(MGE__CONV_WINOGRAD, &cv);
        ck_assert(kn->scratch_bytes(&cv) > 0);
        void *scratch = malloc(sb > kn->scratch_bytes(&cv) ? sb : kn->scratch_bytes(&cv));
        ck_assert_ptr_nonnull(scratch);
        conv_naive_backward(&cv, rx, rw, rb, dy, x, w);
        for (int t = 1; t <= 2; t++) {
            mge_cpu_set_threads(t);
            ck_assert_int_eq(kn->dw(&cv, dw[t - 1], dy, x, scratch, 0), 0);
            assert_close(kn->name, dw[t - 1], rw, nw, 1e-4, tol);
        }
        assert_close(kn->name, dw[0], dw[1], nw, 1e-4, tol); /* 1 against 2 threads */
        mge__cpu_conv2d_backward_with(MGE__CONV_WINOGRAD, &cv, NULL, via, NULL, dy, x, w, scratch,
                                      0);
        if (mge__conv_winograd_dw_is_f4(&cv) == kn->f4)
            ck_assert(memcmp(via, dw[1], sizeof(float) * nw) == 0);
        ck_assert_int_eq(kn->dw(&cv, via, dy, x, scratch, 0), 0);
        ck_assert(memcmp(via, dw[1], sizeof(float) * nw) == 0);
        ck_assert_int_eq(kn->dw(&cv, acc, dy, x, scratch, 1), 0);
        assert_acc(kn->name, acc, base, dw[1], nw);
        free(scratch), free(x), free(w), free(dy), free(rx), free(rw), free(rb), free(dw[0]);
        free(dw[1]), free(via), free(base), free(acc);
    }
    /* stride 2, 5x5 and pad 0: not Winograd's, nothing written */
    static const int no[][5] = {{3, 3, 2, 2}, {5, 5, 1, 2}, {3, 3, 1, 0}};
    for (int i = 0; i < 3; i++) {
        struct mge_cpu_conv cv = {2, 3, 8, 8, 4, no[i][0], no[i][1], no[i][2], no[i][3], 0, 0, 0};
        ck_assert_int_eq(mge_cpu_conv_init(&cv), 0);
        float dw = 7.0f;
        ck_assert(kn->scratch_bytes(&cv) == 0);
        ck_assert_int_eq(kn->dw(&cv, &dw, NULL, NULL, NULL, 0), -1);
        ck_assert(dw == 7.0f);
    }
    mge_cpu_set_threads(old);
}

/*
 * Winograd F(2x2, 3x3)'s weight gradient (check_winograd_dw) on odd shapes: H and W odd (half
 * tiles at the edges), a 1x1 image, batch 1, C and K off the 16-lane blocks, more images than
 * one work item (a short last one).
 */
START_TEST(test_conv_winograd_dw)
{
    /* N, C, H, W, K */
    static const int shapes[][5] = {
        {1, 5, 7, 9, 3},     {1, 3, 1, 1, 2},    {3, 2, 5, 6, 9},   {2, 17, 9, 7, 19},
        {1, 33, 13, 11, 24}, {20, 16, 7, 7, 16}, {3, 64, 7, 7, 48}, {2, 16, 28, 28, 32},
    };
    static const struct wdw_kernel f2 = {"winograd dw", 0, mge__conv_winograd_backward_weights,
                                         mge__conv_winograd_scratch_bytes};
    rng_state = 19;
    check_winograd_dw(&f2, shapes, sizeof(shapes) / sizeof(shapes[0]));
}
END_TEST

/*
 * Winograd F(4x4, 3x3)'s weight gradient (check_winograd_dw, the same bound as every backend's
 * dw) on H, W off the 4x4 tiles (1x1, 5x7, 6x6, 7x7, 13x13, 14x14, 28x28: partial tiles at the
 * right and bottom edges), batch 1 and 3, C and K off the 8- and 16-blocks, more images than one
 * work item.
 */
START_TEST(test_conv_winograd4_dw)
{
    /* N, C, H, W, K */
    static const int shapes[][5] = {
        {1, 3, 1, 1, 2},     {3, 5, 5, 7, 9},     {1, 17, 6, 6, 19},   {3, 16, 7, 7, 16},
        {20, 16, 7, 7, 16},  {3, 64, 7, 7, 48},   {1, 33, 13, 13, 24}, {3, 32, 14, 14, 32},
        {1, 16, 28, 28, 16}, {3, 16, 28, 28, 40},
    };
    static const struct wdw_kernel f4 = {"winograd4 dw", 1, mge__conv_winograd4_backward_weights,
                                         mge__conv_winograd4_dw_scratch_bytes};
    rng_state = 20;
    check_winograd_dw(&f4, shapes, sizeof(shapes) / sizeof(shapes[0]));
}
END_TEST

START_TEST(test_conv_init_invalid)
{
    struct mge_cpu_conv bad = {1, 1, 4, 4, 1, 5, 5, 1, 0, 0, 0, 0};
    ck_assert_int_eq(mge_cpu_conv_init(&bad), -1);
    struct mge_cpu_conv zero_stride = {1, 1, 4, 4, 1, 3, 3, 0, 0, 0, 0, 0};
    ck_assert_int_eq(mge_cpu_conv_init(&zero_stride), -1);
}
END_TEST

/*
 * conv_stride2.c (what "direct" and "auto" run for these) on odd shapes against the naive conv
 * and finite differences: 3x3 pad 1 and 0, 2x2, 1x1 shortcuts, odd and even sizes, channel
 * counts off the 8-channel blocks, 1 and 2 threads; ResNet-20's two 3x3 and 1x1 shapes at a
 * small batch.
 */
START_TEST(test_conv_stride2)
{
    static const int shapes[][10] = {
        /* N, C, H, W, K, R, S, pad, fd, threads */
        {2, 4, 7, 9, 3, 3, 3, 1, 1, 1},     {3, 5, 8, 8, 13, 3, 3, 1, 1, 2},
        {1, 6, 9, 7, 8, 3, 3, 0, 1, 1},     {2, 4, 6, 11, 5, 2, 2, 1, 1, 2},
        {2, 9, 5, 5, 17, 1, 1, 0, 1, 1},    {1, 17, 13, 10, 9, 3, 3, 1, 1, 2},
        {1, 4, 1, 1, 2, 3, 3, 1, 1, 1},     {3, 16, 28, 28, 32, 3, 3, 1, 0, 2},
        {2, 32, 14, 14, 64, 3, 3, 1, 0, 1}, {3, 16, 28, 28, 32, 1, 1, 0, 0, 2},
        {2, 32, 14, 14, 64, 1, 1, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        const int *h = shapes[i];
        struct mge_cpu_conv cv = {h[0], h[1], h[2], h[3], h[4], h[5], h[6], 2, h[7], 0, 0, 0};
        ck_assert_int_eq(mge_cpu_conv_init(&cv), 0);
        ck_assert_msg(mge__conv_stride2_scratch_bytes(&cv) > 0, "shape %zu not taken", i);
        check_conv_with(MGE__CONV_DIRECT, h[0], h[1], h[2], h[3], h[4], h[5], h[6], 2, h[7], h[9],
                        h[8]);
    }
}
END_TEST

START_TEST(test_conv_lenet_deterministic)
{
    /* LeNet-5 conv2 at batch 16: two runs are bit-identical (same slots) */
    struct mge_cpu_conv cv = {16, 6, 14, 14, 16, 5, 5, 1, 0, 0, 0, 0};
    ck_assert_int_eq(mge_cpu_conv_init(&cv), 0);
    int64_t nx = 16 * 6 * 14 * 14, nw = 16 * 6 * 25, ny = 16 * 16 * 10 * 10;
    rng_state = 13;
    void *scratch = malloc(mge_cpu_conv_scratch_bytes(&cv));
    ck_assert_ptr_nonnull(scratch);
    float *x = rnd_new(nx), *w = rnd_new(nw), *dy = rnd_new(ny), *dw1 = rnd_new(nw);
    float *dw2 = rnd_new(nw), *dx1 = rnd_new(nx), *dx2 = rnd_new(nx);
    mge_cpu_conv2d_backward(&cv, dx1, dw1, NULL, dy, x, w, scratch, 0);
    mge_cpu_conv2d_backward(&cv, dx2, dw2, NULL, dy, x, w, scratch, 0);
    ck_assert(memcmp(dw1, dw2, sizeof(float) * nw) == 0);
    ck_assert(memcmp(dx1, dx2, sizeof(float) * nx) == 0);
    free(scratch), free(x), free(w), free(dy), free(dw1), free(dw2), free(dx1), free(dx2);
}
END_TEST

struct pool_ctx {
    const struct mge_cpu_pool *pl;
    int avg;
};

static void pool_fwd(void *v, float *out, const float *x)
{
    struct pool_ctx *c = v;
    if (c->avg)
        mge_cpu_avgpool_forward(c->pl, out, x);
    else
        mge_cpu_maxpool_forward(c->pl, out, x);
}

START_TEST(test_pool)
{
    static const int cfg[][4] = {{2, 2, 2, 0}, {3, 3, 2, 1}, {3, 2, 1, 1}}; /* R, S, stride, pad */
    rng_state = 14;
    for (size_t k = 0; k < sizeof(cfg) / sizeof(cfg[0]); k++) {
        struct mge_cpu_pool pl = {2, 3, 7, 6, cfg[k][0], cfg[k][1], cfg[k][2], cfg[k][3], 0, 0};
        ck_assert_int_eq(mge_cpu_pool_init(&pl), 0);
        int64_t nx = 2 * 3 * 7 * 6, ny = (int64_t)2 * 3 * pl.P * pl.Q;
        float *x = rnd_new(nx), *y = rnd_new(ny), *want = rnd_new(ny), *dy = rnd_new(ny);
        float *dx = rnd_new(nx), *num = rnd_new(nx), *base = rnd_new(nx);
        float *dxa = copy_new(base, nx);
        for (int64_t i = 0; i < nx; i++) /* distinct values, spaced past FD_EPS: no ties */
            x[i] = (float)((i * 37) % nx) * 0.01f - 1.0f;
        for (int avg = 0; avg <= 1; avg++) {
            for (int64_t pi = 0; pi < 6; pi++)
                for (int p = 0; p < pl.P; p++)
                    for (int q = 0; q < pl.Q; q++) {
                        double m = -INFINITY, s = 0;
                        int cnt = 0;
                        for (int r = 0; r < pl.R; r++)
                            for (int t = 0; t < pl.S; t++) {
                                int h = p * pl.stride - pl.pad + r, w = q * pl.stride - pl.pad + t;
                                if (h < 0 || h >= pl.H || w < 0 || w >= pl.W)
                                    continue;
                                double v = x[(pi * pl.H + h) * pl.W + w];
                                m = fmax(m, v), s += v, cnt++;
                            }
                        want[(pi * pl.P + p) * pl.Q + q] = (float)(avg ? s / cnt : m);
                    }
            struct pool_ctx c = {&pl, avg};
            pool_fwd(&c, y, x);
            assert_close(avg ? "avgpool" : "maxpool", y, want, ny, 1e-6, 1e-6);
            if (avg)
                mge_cpu_avgpool_backward(&pl, dx, dy, 0);
            else
                mge_cpu_maxpool_backward(&pl, dx, dy, x, 0);
            fd_grad(pool_fwd, &c, x, nx, ny, dy, num);
            assert_close("pool backward vs FD", dx, num, nx, FD_REL, FD_ABS);
            memcpy(dxa, base, sizeof(float) * nx);
            if (avg)
                mge_cpu_avgpool_backward(&pl, dxa, dy, 1);
            else
                mge_cpu_maxpool_backward(&pl, dxa, dy, x, 1);
            assert_acc("pool backward", dxa, base, dx, nx);
        }
        free(x), free(y), free(want), free(dy), free(dx), free(num), free(base), free(dxa);
    }
}
END_TEST

START_TEST(test_maxpool_first_max)
{
    /* a 2x2 window of equal values: the gradient goes to the first one only */
    struct mge_cpu_pool pl = {1, 1, 2, 2, 2, 2, 2, 0, 0, 0};
    ck_assert_int_eq(mge_cpu_pool_init(&pl), 0);
    const float x[4] = {1, 1, 1, 1}, dy[1] = {5};
    float dx[4];
    mge_cpu_maxpool_backward(&pl, dx, dy, x, 0);
    ck_assert(dx[0] == 5 && dx[1] == 0 && dx[2] == 0 && dx[3] == 0);
}
END_TEST

/* ---- reductions, shapes ----------------------------------------------------------------- */

struct red_ctx {
    int64_t outer, len, inner;
    float scale;
};

static void reduce_fwd(void *v, float *out, const float *x)
{
    struct red_ctx *c = v;
    mge_cpu_reduce_sum(out, x, c->outer, c->len, c->inner, c->scale);
}

START_TEST(test_reduce_sum)
{
    static const int64_t cfg[][3] = {{3, 5, 4}, {1, 7, 1}, {4, 6, 1}, {2, 3, 300}, {50, 40, 30}};
    rng_state = 15;
    for (size_t k = 0; k < sizeof(cfg) / sizeof(cfg[0]); k++) {
        struct red_ctx c = {cfg[k][0], cfg[k][1], cfg[k][2], 0.5f};
        int64_t nx = c.outer * c.len * c.inner, ny = c.outer * c.inner;
        float *x = rnd_new(nx), *y = rnd_new(ny), *want = rnd_new(ny), *dy = rnd_new(ny);
        float *dx = rnd_new(nx), *base = rnd_new(nx), *dxa = copy_new(base, nx);
        mge_cpu_reduce_sum(y, x, c.outer, c.len, c.inner, c.scale);
        for (int64_t o = 0; o < c.outer; o++)
            for (int64_t i = 0; i < c.inner; i++) {
                double sum = 0;
                for (int64_t l = 0; l < c.len; l++)
                    sum += x[(o * c.len + l) * c.inner + i];
                want[o * c.inner + i] = (float)(0.5 * sum);
            }
        assert_close("reduce_sum", y, want, ny, 1e-5, 1e-5);
        mge_cpu_reduce_sum_backward(dx, dy, c.outer, c.len, c.inner, c.scale, 0);
        if (nx <= 2000) {
            float *num = rnd_new(nx);
            fd_grad(reduce_fwd, &c, x, nx, ny, dy, num);
            assert_close("reduce_sum backward vs FD", dx, num, nx, FD_REL, FD_ABS);
            free(num);
        }
        mge_cpu_reduce_sum_backward(dxa, dy, c.outer, c.len, c.inner, c.scale, 1);
        assert_acc("reduce_sum backward", dxa, base, dx, nx);
        free(x), free(y), free(want), free(dy), free(dx), free(base), free(dxa);
    }
}
END_TEST

START_TEST(test_permute)
{
    static const int64_t shape[4] = {2, 3, 4, 5};
    static const int perms[][4] = {{0, 1, 2, 3}, {3, 2, 1, 0}, {0, 2, 1, 3}, {1, 3, 0, 2}};
    rng_state = 16;
    float *x = rnd_new(120), *y = rnd_new(120), *back = rnd_new(120);
    for (size_t k = 0; k < sizeof(perms) / sizeof(perms[0]); k++) {
        const int *pm = perms[k];
        mge_cpu_permute(y, x, shape, pm, 4);
        int64_t os[4];
        for (int d = 0; d < 4; d++)
            os[d] = shape[pm[d]];
        for (int64_t f = 0; f < 120; f++) {
            int64_t idx[4], r = f, in[4];
            for (int d = 3; d >= 0; d--)
                idx[d] = r % os[d], r /= os[d];
            for (int d = 0; d < 4; d++)
                in[pm[d]] = idx[d];
            ck_assert(y[f] == x[((in[0] * 3 + in[1]) * 4 + in[2]) * 5 + in[3]]);
        }
        /* permuting back with the inverse permutation restores x */
        int inv[4];
        for (int d = 0; d < 4; d++)
            inv[pm[d]] = d;
        mge_cpu_permute(back, y, os, inv, 4);
        ck_assert(memcmp(back, x, sizeof(float) * 120) == 0);
    }
    free(x), free(y), free(back);
}
END_TEST

START_TEST(test_copy_axis)
{
    /* concat of (2,3,4) and (2,5,4) along axis 1 into (2,8,4), then slice them back out */
    rng_state = 17;
    float *a = rnd_new(24), *b = rnd_new(40), *cat = rnd_new(64), *sa = rnd_new(24);
    float *sb = rnd_new(40);
    mge_cpu_copy_axis(cat, 8, 0, a, 3, 0, 3, 2, 4, 0);
    mge_cpu_copy_axis(cat, 8, 3, b, 5, 0, 5, 2, 4, 0);
    for (int o = 0; o < 2; o++)
        for (int l = 0; l < 8; l++)
            for (int i = 0; i < 4; i++)
                ck_assert(cat[(o * 8 + l) * 4 + i] ==
                          (l < 3 ? a[(o * 3 + l) * 4 + i] : b[(o * 5 + l - 3) * 4 + i]));
    mge_cpu_copy_axis(sa, 3, 0, cat, 8, 0, 3, 2, 4, 0);
    mge_cpu_copy_axis(sb, 5, 0, cat, 8, 3, 5, 2, 4, 0);
    ck_assert(memcmp(sa, a, sizeof(float) * 24) == 0);
    ck_assert(memcmp(sb, b, sizeof(float) * 40) == 0);
    /* acc: slice backward adds into a gradient that already holds something */
    float *g = copy_new(sb, 40);
    mge_cpu_copy_axis(g, 5, 1, cat, 8, 4, 2, 2, 4, 1);
    for (int o = 0; o < 2; o++)
        for (int l = 0; l < 5; l++)
            for (int i = 0; i < 4; i++) {
                float want = sb[(o * 5 + l) * 4 + i];
                if (l >= 1 && l < 3)
                    want += cat[(o * 8 + l + 3) * 4 + i];
                ck_assert(g[(o * 5 + l) * 4 + i] == want);
            }
    free(a), free(b), free(cat), free(sa), free(sb), free(g);
}
END_TEST

/* ---- normalisation, embedding, dropout -------------------------------------------------- */

struct ln_ctx {
    int64_t rows, C;
    const float *x, *w, *b;
    float *mean, *rstd;
    int wrt; /* 0 x, 1 w, 2 b */
};

static void ln_fwd(void *v, float *out, const float *p)
{
    struct ln_ctx *c = v;
    mge_cpu_layernorm_forward(out, c->mean, c->rstd, c->wrt == 0 ? p : c->x, c->wrt == 1 ? p : c->w,
                              c->wrt == 2 ? p : c->b, c->rows, c->C, 1e-5f);
}

START_TEST(test_layernorm)
{
    int64_t rows = 6, C = 70, n = rows * C;
    rng_state = 18;
    float *x = rnd_new(n), *w = rnd_new(C), *b = rnd_new(C), *y = rnd_new(n), *dy = rnd_new(n);
    float *mean = rnd_new(rows), *rstd = rnd_new(rows), *dx = rnd_new(n), *dw = rnd_new(C);
    float *db = rnd_new(C), *num = rnd_new(n), *m2 = rnd_new(rows), *r2 = rnd_new(rows);
    mge_cpu_layernorm_forward(y, mean, rstd, x, w, b, rows, C, 1e-5f);
    for (int64_t r = 0; r < rows; r++) {
        double m = 0, v = 0;
        for (int64_t c = 0; c < C; c++)
            m += x[r * C + c];
        m /= C;
        for (int64_t c = 0; c < C; c++)
            v += (x[r * C + c] - m) * (x[r * C + c] - m);
        double s = 1 / sqrt(v / C + 1e-5);
        ck_assert(fabs(mean[r] - m) < 1e-6 && fabs(rstd[r] - s) < 1e-4 * s);
        for (int64_t c = 0; c < C; c++)
            ck_assert(fabs(y[r * C + c] - ((x[r * C + c] - m) * s * w[c] + b[c])) < 1e-5);
    }
    mge_cpu_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, rows, C, 0);
    struct ln_ctx c = {rows, C, x, w, b, m2, r2, 0};
    fd_grad(ln_fwd, &c, x, n, n, dy, num);
    assert_close("layernorm dinp vs FD", dx, num, n, FD_REL, FD_ABS);
    c.wrt = 1;
    fd_grad(ln_fwd, &c, w, C, n, dy, num);
    assert_close("layernorm dw vs FD", dw, num, C, FD_REL, FD_ABS);
    c.wrt = 2;
    fd_grad(ln_fwd, &c, b, C, n, dy, num);
    assert_close("layernorm db vs FD", db, num, C, FD_REL, FD_ABS);
    float *bx = rnd_new(n), *bw = rnd_new(C), *bb = rnd_new(C);
    float *ax = copy_new(bx, n), *aw = copy_new(bw, C), *ab = copy_new(bb, C);
    mge_cpu_layernorm_backward(ax, aw, ab, dy, x, w, mean, rstd, rows, C, 1);
    assert_acc("layernorm dinp", ax, bx, dx, n);
    assert_acc("layernorm dw", aw, bw, dw, C);
    assert_acc("layernorm db", ab, bb, db, C);
    free(x), free(w), free(b), free(y), free(dy), free(mean), free(rstd), free(dx), free(dw);
    free(db), free(num), free(m2), free(r2), free(bx), free(bw), free(bb), free(ax), free(aw);
    free(ab);
}
END_TEST

/*
 * Batch norm with a fused relu against the pair it replaces (mge_cpu_unary_forward/backward
 * around the plain batch norm), bit for bit: odd shapes (plane tails of the 16-lane sums, one
 * pixel planes), exact zeros in the input, accumulating or not, 1 and 2 threads.
 */
START_TEST(test_batchnorm_relu_fused)
{
    static const int64_t shapes[][3] = {{3, 5, 37}, {2, 3, 16}, {5, 7, 1}, {4, 17, 49}};
    int old = mge_cpu_threads();
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int64_t N = shapes[si][0], C = shapes[si][1], HW = shapes[si][2], n = N * C * HW;
        float *x = rnd_new(n), *w = rnd_new(C), *b = rnd_new(C), *dy = rnd_new(n);
        float *y0 = rnd_new(n), *y1 = rnd_new(n), *dr = rnd_new(n);
        float *m0 = rnd_new(C), *r0 = rnd_new(C), *m1 = rnd_new(C), *r1 = rnd_new(C);
        float *dx0 = rnd_new(n), *dx1 = copy_new(dx0, n), *dw0 = rnd_new(C);
        float *dw1 = copy_new(dw0, C), *db0 = rnd_new(C), *db1 = copy_new(db0, C);
        for (int64_t i = 0; i < n; i += 7)
            x[i] = 0.0f;
        for (int threads = 1; threads <= 2; threads++) {
            mge_cpu_set_threads(threads);
            for (int acc = 0; acc <= 1; acc++) {
                mge_cpu_batchnorm_forward(y0, m0, r0, x, w, b, NULL, NULL, N, C, HW, 1e-5f, 0.1f, 1,
                                          0);
                mge_cpu_unary_forward(MGE_CPU_RELU, y0, y0, n);
                mge_cpu_batchnorm_forward(y1, m1, r1, x, w, b, NULL, NULL, N, C, HW, 1e-5f, 0.1f, 1,
                                          1);
                ck_assert_mem_eq(y1, y0, (size_t)n * sizeof(float));
                ck_assert_mem_eq(m1, m0, (size_t)C * sizeof(float));
                ck_assert_mem_eq(r1, r0, (size_t)C * sizeof(float));
                mge_cpu_unary_backward(MGE_CPU_RELU, dr, dy, NULL, y0, n, 0);
                mge_cpu_batchnorm_backward(dx0, dw0, db0, dr, NULL, x, w, m0, r0, N, C, HW, acc);
                mge_cpu_batchnorm_backward(dx1, dw1, db1, dy, y1, x, w, m1, r1, N, C, HW, acc);
                ck_assert_mem_eq(dx1, dx0, (size_t)n * sizeof(float));
                ck_assert_mem_eq(dw1, dw0, (size_t)C * sizeof(float));
                ck_assert_mem_eq(db1, db0, (size_t)C * sizeof(float));
            }
        }
        float *all[] = {x, w, b, dy, y0, y1, dr, m0, r0, m1, r1, dx0, dx1, dw0, dw1, db0, db1};
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
            free(all[i]);
    }
    mge_cpu_set_threads(old);
}
END_TEST

START_TEST(test_embedding)
{
    int64_t V = 5, C = 3, n = 6;
    const int32_t ids[6] = {4, 0, 4, 2, 4, 1}; /* repeated ids accumulate */
    rng_state = 19;
    float *table = rnd_new(V * C), *out = rnd_new(n * C), *dy = rnd_new(n * C);
    float *dt = rnd_new(V * C), *want = rnd_new(V * C), *base = rnd_new(V * C);
    float *dta = copy_new(base, V * C);
    mge_cpu_embedding_forward(out, ids, table, n, C);
    for (int64_t i = 0; i < n; i++)
        ck_assert(memcmp(out + i * C, table + ids[i] * C, sizeof(float) * C) == 0);
    mge_cpu_embedding_backward(dt, dy, ids, n, V, C, 0);
    memset(want, 0, sizeof(float) * V * C);
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < C; c++)
            want[ids[i] * C + c] += dy[i * C + c];
    assert_close("dtable", dt, want, V * C, 1e-6, 1e-6); /* row 3 untouched: cleared to 0 */
    mge_cpu_embedding_backward(dta, dy, ids, n, V, C, 1);
    assert_acc("dtable", dta, base, dt, V * C);
    free(table), free(out), free(dy), free(dt), free(want), free(base), free(dta);
}
END_TEST

START_TEST(test_dropout)
{
    int64_t n = 100000;
    float p = 0.3f;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    float *y2 = malloc(sizeof(float) * n), *dx = malloc(sizeof(float) * n);
    ck_assert(x && y && y2 && dx);
    for (int64_t i = 0; i < n; i++)
        x[i] = 1.0f + (float)(i % 7);
    mge_cpu_dropout_forward(y, x, n, p, 42, 0);
    mge_cpu_dropout_forward(y2, x, n, p, 42, 0);
    ck_assert(memcmp(y, y2, sizeof(float) * n) == 0); /* same seed: same mask */
    int64_t kept = 0, same_as_other_seed = 0;
    for (int64_t i = 0; i < n; i++) {
        int k = mge_cpu_dropout_keep(42, i, p);
        kept += k;
        ck_assert(k ? fabsf(y[i] - x[i] / (1.0f - p)) <= 1e-6f * y[i] : y[i] == 0.0f);
        same_as_other_seed += k == mge_cpu_dropout_keep(43, i, p);
    }
    /* rate: 70000 +- 5 sigma (sigma = sqrt(n p (1-p)) ~ 145) */
    ck_assert_msg(llabs(kept - 70000) < 725, "kept %lld of %lld", (long long)kept, (long long)n);
    ck_assert(same_as_other_seed < 60000); /* another seed is a different mask (~58% agree) */
    /* backward regenerates the mask: the gradient of sum(y) is the keep/(1-p) mask */
    for (int64_t i = 0; i < n; i++)
        y2[i] = 1.0f;
    mge_cpu_dropout_backward(dx, y2, n, p, 42, 0, 0);
    for (int64_t i = 0; i < n; i++)
        ck_assert(dx[i] == (mge_cpu_dropout_keep(42, i, p) ? 1.0f / (1.0f - p) : 0.0f));
    mge_cpu_dropout_backward(dx, y2, n, p, 42, 0, 1);
    for (int64_t i = 0; i < n; i++)
        ck_assert(dx[i] == (mge_cpu_dropout_keep(42, i, p) ? 2.0f / (1.0f - p) : 0.0f));
    /* a shard starting at element 1234 draws the whole tensor's mask there (data parallel) */
    mge_cpu_dropout_forward(y, x, n, p, 42, 0);
    mge_cpu_dropout_forward(y2, x + 1234, n - 1234, p, 42, 1234);
    ck_assert(memcmp(y + 1234, y2, sizeof(float) * (size_t)(n - 1234)) == 0);
    /* p = 0 keeps everything unscaled */
    mge_cpu_dropout_forward(y, x, n, 0.0f, 7, 0);
    ck_assert(memcmp(y, x, sizeof(float) * n) == 0);
    free(x), free(y), free(y2), free(dx);
}
END_TEST

/* ---- suite ------------------------------------------------------------------------------ */

static Suite *kernels_suite(void)
{
    Suite *s = suite_create("kernels");
    TCase *tc;

    tc = tcase_create("gemm");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_sgemm_transposes_strides);
    tcase_add_test(tc, test_sgemm_public_and_beta_zero);
    tcase_add_test(tc, test_sgemm_ref_by_hand);
    tcase_add_test(tc, test_threads);
    suite_add_tcase(s, tc);

    tc = tcase_create("elementwise");
    tcase_add_test(tc, test_unary_forward_backward);
    tcase_add_test(tc, test_gelu_values);
    tcase_add_test(tc, test_bias_act);
    tcase_add_test(tc, test_bias_backward);
    tcase_add_test(tc, test_binary_broadcast_sum_to);
    tcase_add_test(tc, test_sum_to_large);
    tcase_add_test(tc, test_scale_axpy);
    suite_add_tcase(s, tc);

    tc = tcase_create("softmax");
    tcase_add_test(tc, test_softmax);
    tcase_add_test(tc, test_softmax_xent);
    tcase_add_test(tc, test_softmax_xent_deterministic);
    tcase_add_test(tc, test_argmax_correct);
    suite_add_tcase(s, tc);

    tc = tcase_create("optim");
    tcase_add_test(tc, test_sgd);
    tcase_add_test(tc, test_adam);
    suite_add_tcase(s, tc);

    tc = tcase_create("conv");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_conv_stride_pad);
    tcase_add_test(tc, test_conv_lenet_batch);
    tcase_add_test(tc, test_conv_flat);
    tcase_add_test(tc, test_conv_resnet_batch);
    tcase_add_test(tc, test_conv_winograd);
    tcase_add_test(tc, test_conv_winograd_threads);
    tcase_add_test(tc, test_conv_winograd4);
    tcase_add_test(tc, test_conv_winograd_dw);
    tcase_add_test(tc, test_conv_winograd4_dw);
    tcase_add_test(tc, test_conv_init_invalid);
    tcase_add_test(tc, test_conv_stride2);
    tcase_add_test(tc, test_conv_lenet_deterministic);
    suite_add_tcase(s, tc);

    tc = tcase_create("pool");
    tcase_add_test(tc, test_pool);
    tcase_add_test(tc, test_maxpool_first_max);
    suite_add_tcase(s, tc);

    tc = tcase_create("reduce");
    tcase_add_test(tc, test_reduce_sum);
    tcase_add_test(tc, test_permute);
    tcase_add_test(tc, test_copy_axis);
    suite_add_tcase(s, tc);

    tc = tcase_create("norm");
    tcase_add_test(tc, test_layernorm);
    tcase_add_test(tc, test_batchnorm_relu_fused);
    tcase_add_test(tc, test_embedding);
    tcase_add_test(tc, test_dropout);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mge_test_run(kernels_suite());
}
