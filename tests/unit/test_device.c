/*
 * test_device.c: the engine's device seam. The sim device's memory is reached only through its
 * copies and kernels: a host read or write outside them kills a child process with SIGSEGV,
 * the same access inside a kernel does not; copies round-trip; a graph on sim (parameters,
 * gradients, activations and inputs in device arenas) gives the CPU device's bits for the loss,
 * every gradient and the parameters; host reads of its values outside the seam fault.
 */
#include <check.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "engine/device.h"
#include "engine/engine.h"
#include "engine/engine_int.h"
#include "tests/unit/support/check_run.h"

/* How a child running @fn(@arg) ended: the signal that killed it, or 0 for a clean exit 0. */
static int child_signal(void (*fn)(void *arg), void *arg)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* not a sanitizer's report: the plain fault */
        fn(arg);
        _exit(0);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    if (WIFSIGNALED(st))
        return WTERMSIG(st);
    ck_assert_int_eq(WEXITSTATUS(st), 0);
    return 0;
}

static volatile float sink;

static void host_read(void *p)
{
    sink = *(volatile float *)p;
}

static void host_write(void *p)
{
    *(volatile float *)p = 1.0f;
}

static void kernel_touch(void *p)
{
    ((float *)p)[1] = ((float *)p)[0] + 1.0f;
}

static void kernel_read(void *p)
{
    mge_device_sim.kernel(kernel_touch, p);
}

START_TEST(test_find)
{
    ck_assert_ptr_eq(mge_device_find("cpu"), &mge_device_cpu);
    ck_assert_ptr_eq(mge_device_find("sim"), &mge_device_sim);
    ck_assert_ptr_null(mge_device_find("tpu"));
    ck_assert_ptr_eq(mge_device_find("cuda"), mge_device_cuda()); /* NULL without nvcc */
    ck_assert_ptr_null(mge_device_find(NULL));
    ck_assert(mge_device_cpu.host_visible && !mge_device_sim.host_visible);
}
END_TEST

START_TEST(test_sim_copies)
{
    const struct mge_device *d = &mge_device_sim;
    float in[1000], out[1000];
    for (int i = 0; i < 1000; i++)
        in[i] = (float)i * 0.5f;
    float *a = d->alloc(sizeof(in)), *b = d->alloc(sizeof(in));
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    d->h2d(a, in, sizeof(in));
    d->d2d(b, a, sizeof(in));
    memset(out, 0, sizeof(out));
    d->d2h(out, b, sizeof(out));
    ck_assert_mem_eq(out, in, sizeof(in));
    d->memset(b, 0, sizeof(in));
    d->d2h(out, b + 10, sizeof(float));
    ck_assert_float_eq(out[0], 0.0f);
    /* a kernel reads and writes device memory; its result comes back by copy */
    d->kernel(kernel_touch, a);
    d->d2h(out, a, 2 * sizeof(float));
    ck_assert_float_eq(out[1], 1.0f);
    d->free(a, sizeof(in));
    d->free(b, sizeof(in));
    d->free(NULL, 0);
}
END_TEST

START_TEST(test_sim_host_access_faults)
{
    const struct mge_device *d = &mge_device_sim;
    float one = 1.0f;
    float *a = d->alloc(4096 * 3);
    ck_assert_ptr_nonnull(a);
    d->h2d(a, &one, sizeof(one));
    ck_assert_int_eq(child_signal(host_read, a), SIGSEGV);
    ck_assert_int_eq(child_signal(host_write, a + 2000), SIGSEGV);
    ck_assert_int_eq(child_signal(kernel_read, a), 0);
    /* after a kernel and a copy, the window is shut again */
    float back = 0.0f;
    d->d2h(&back, a, sizeof(back));
    ck_assert_float_eq(back, 1.0f);
    ck_assert_int_eq(child_signal(host_read, a), SIGSEGV);
    d->free(a, 4096 * 3);
    /* the CPU device's memory is host memory */
    float *c = mge_device_cpu.alloc(64);
    ck_assert_int_eq(child_signal(host_write, c), 0);
    mge_device_cpu.free(c, 64);
}
END_TEST

enum { B = 8, IN = 6, HID = 5, OUT = 3 };

struct net {
    struct mge_graph *g;
    int x, y, w1, b1, w2, logits, loss;
};

/* x (B, IN) -> linear + relu (HID) -> linear (OUT) -> cross-entropy, allocated on @dev. */
static void net_build(struct net *n, const struct mge_device *dev)
{
    int64_t xs[2] = {B, IN}, ys[1] = {B}, w1s[2] = {HID, IN}, b1s[1] = {HID}, w2s[2] = {OUT, HID};
    ck_assert_int_eq(mge_graph_new(&n->g), MGE_OK);
    n->x = mge_input(n->g, "x", MGE_DTYPE_F32, 2, xs, 1);
    n->y = mge_input(n->g, "y", MGE_DTYPE_I32, 1, ys, 1);
    n->w1 = mge_param(n->g, "w1", 2, w1s, MGE_INIT_UNIFORM_FAN_IN, IN);
    n->b1 = mge_param(n->g, "b1", 1, b1s, MGE_INIT_UNIFORM_FAN_IN, IN);
    n->w2 = mge_param(n->g, "w2", 2, w2s, MGE_INIT_UNIFORM_FAN_IN, HID);
    int h = mge_linear(n->g, n->x, n->w1, n->b1, MGE_ACT_FN_RELU);
    n->logits = mge_linear(n->g, h, n->w2, -1, MGE_ACT_NONE);
    n->loss = mge_cross_entropy(n->g, n->logits, n->y);
    ck_assert_int_eq(mge_graph_error(n->g), MGE_OK);
    ck_assert_int_eq(mge_graph_backward(n->g, n->loss), MGE_OK);
    ck_assert_int_eq(mge_graph_keep(n->g, n->logits), MGE_OK);
    ck_assert_int_eq(mge_graph_plan(n->g, NULL), MGE_OK);
    ck_assert_int_eq(mge_graph_set_device(n->g, dev), MGE_OK);
    ck_assert_int_eq(mge_graph_alloc(n->g), MGE_OK);
    ck_assert_int_eq(mge_graph_set_device(n->g, dev), MGE_STATE);
    mge_graph_init_params(n->g, 42);
}

/* One training run on a fixed batch of 7 rows (fewer than planned); the loss. */
static float net_run(struct net *n, float *x, int32_t *y)
{
    float loss = 0.0f;
    for (int i = 0; i < B * IN; i++)
        x[i] = (float)((i * 37) % 11) / 11.0f - 0.4f;
    for (int i = 0; i < B; i++)
        y[i] = i % OUT;
    ck_assert_int_eq(mge_graph_bind(n->g, n->x, x), MGE_OK);
    ck_assert_int_eq(mge_graph_bind(n->g, n->y, y), MGE_OK);
    ck_assert_int_eq(mge_graph_set_batch(n->g, 7), MGE_OK);
    ck_assert_int_eq(mge_graph_run(n->g, MGE_RUN_TRAIN, 1), MGE_OK);
    ck_assert_int_eq(mge_value_read(n->g, n->loss, &loss, sizeof(loss)), MGE_OK);
    return loss;
}

static void read_loss_directly(void *arg)
{
    struct net *n = arg;
    sink = *(float *)mge_value_data(n->g, n->loss);
}

START_TEST(test_graph_bit_identical)
{
    struct net c, s;
    float xc[B * IN], xs[B * IN];
    int32_t yc[B], ys[B];
    net_build(&c, &mge_device_cpu);
    net_build(&s, &mge_device_sim);
    ck_assert_ptr_eq(mge_graph_device(s.g), &mge_device_sim);
    float lc = net_run(&c, xc, yc), ls = net_run(&s, xs, ys);
    ck_assert_mem_eq(&lc, &ls, sizeof(lc));
    ck_assert(lc > 0.0f);

    int64_t np, ng;
    float *pc = mge_graph_params(c.g, &np), *gc = mge_graph_grads(c.g, &ng);
    float *ps = mge_graph_params(s.g, NULL), *gs = mge_graph_grads(s.g, NULL);
    float hp[256], hg[256];
    ck_assert_int_le(np, 256);
    mge_device_sim.d2h(hp, ps, sizeof(float) * (size_t)np);
    mge_device_sim.d2h(hg, gs, sizeof(float) * (size_t)ng);
    ck_assert_mem_eq(hp, pc, sizeof(float) * (size_t)np);
    ck_assert_mem_eq(hg, gc, sizeof(float) * (size_t)ng);
    float lg[B * OUT];
    const float *l = mge_value_host(s.g, s.logits, lg, sizeof(float) * 7 * OUT);
    ck_assert_ptr_eq(l, lg);
    ck_assert_mem_eq(l, mge_value_host(c.g, c.logits, NULL, 0), sizeof(float) * 7 * OUT);

    /* host code that reads a sim value outside the seam faults; on cpu it is host memory */
    ck_assert_int_eq(child_signal(read_loss_directly, &s), SIGSEGV);
    ck_assert_int_eq(child_signal(read_loss_directly, &c), 0);

    /* writes go in through copies, and reads past a value's size are refused */
    float w[HID * IN];
    memset(w, 0, sizeof(w));
    ck_assert_int_eq(mge_value_write(s.g, s.w1, w, sizeof(w)), MGE_OK);
    ck_assert_int_eq(mge_value_read(s.g, s.w1, hp, sizeof(w) + 4), MGE_RANGE);
    ck_assert_int_eq(mge_value_read(s.g, -1, hp, 4), MGE_INVAL);
    mge_graph_free(c.g);
    mge_graph_free(s.g);
}
END_TEST

struct sgd_ctx {
    const struct mge_device *d;
    float *p, *g;
    int64_t n;
};

static void sgd_run(void *ctx)
{
    struct sgd_ctx *u = ctx;
    u->d->sgd_update(u->p, u->g, NULL, u->n, 0.1f, 0.0f, 0.0f, 0);
}

/* Plain SGD (lr 0.1) over @n's parameters, as a kernel of its device. */
static void net_sgd(struct net *n)
{
    struct sgd_ctx u = {mge_graph_device(n->g), NULL, NULL, 0};
    u.p = mge_graph_params(n->g, &u.n);
    u.g = mge_graph_grads(n->g, NULL);
    u.d->kernel(sgd_run, &u);
}

/* Rows of batch @k: deterministic, different for every k. */
static void batch_fill(int k, float *x, int32_t *y)
{
    for (int i = 0; i < B * IN; i++)
        x[i] = (float)((i * 37 + k * 13) % 11) / 11.0f - 0.4f;
    for (int i = 0; i < B; i++)
        y[i] = (i + k) % OUT;
}

/*
 * Staging: mge_graph_stage() copies the bound rows at once (the host buffers may change
 * afterwards), the next run computes on the staged slot, slots alternate, and a bind or a new
 * batch size drops a staged copy. Ten steps staged one ahead on sim leave the same parameter
 * bits as ten plain steps on cpu.
 */
START_TEST(test_stage_double_buffer)
{
    struct net c, s;
    float xc[B * IN], xs[B * IN], junk[B * IN];
    int32_t yc[B], ys[B];
    net_build(&c, &mge_device_cpu);
    net_build(&s, &mge_device_sim);
    ck_assert_int_eq(mge_graph_stage(s.g), MGE_STATE); /* nothing bound yet */
    /* on a host-visible device staging does nothing */
    batch_fill(0, xc, yc);
    mge_graph_bind(c.g, c.x, xc);
    mge_graph_bind(c.g, c.y, yc);
    ck_assert_int_eq(mge_graph_stage(c.g), MGE_OK);
    ck_assert(!mge_graph_is_staged(c.g));

    const void *slot[10];
    for (int k = 0; k < 10; k++) {
        int64_t rows = k % 3 == 2 ? 5 : B; /* short batches too */
        float lc, ls;
        batch_fill(k, xc, yc);
        mge_graph_bind(c.g, c.x, xc);
        mge_graph_bind(c.g, c.y, yc);
        mge_graph_set_batch(c.g, rows);
        ck_assert_int_eq(mge_graph_run(c.g, MGE_RUN_TRAIN, k), MGE_OK);
        net_sgd(&c);
        if (k == 0) { /* sim's first batch staged by the run itself */
            batch_fill(k, xs, ys);
            mge_graph_bind(s.g, s.x, xs);
            mge_graph_bind(s.g, s.y, ys);
            mge_graph_set_batch(s.g, rows);
            ck_assert(!mge_graph_is_staged(s.g));
        }
        ck_assert_int_eq(mge_graph_run(s.g, MGE_RUN_TRAIN, k), MGE_OK);
        ck_assert(!mge_graph_is_staged(s.g));
        slot[k] = mge_value_data(s.g, s.x);
        net_sgd(&s);
        if (k + 1 < 10) { /* the next batch, staged while "this step" ends */
            batch_fill(k + 1, xs, ys);
            mge_graph_bind(s.g, s.x, xs);
            mge_graph_bind(s.g, s.y, ys);
            mge_graph_set_batch(s.g, (k + 1) % 3 == 2 ? 5 : B);
            ck_assert_int_eq(mge_graph_stage(s.g), MGE_OK);
            ck_assert(mge_graph_is_staged(s.g));
            /* the rows went at stage time: the host buffer is free again */
            for (int i = 0; i < B * IN; i++)
                xs[i] = 1e6f;
        }
        mge_value_read(c.g, c.loss, &lc, sizeof(lc));
        mge_value_read(s.g, s.loss, &ls, sizeof(ls));
        ck_assert_mem_eq(&lc, &ls, sizeof(lc));
    }
    for (int k = 2; k < 10; k++) /* two slots, in turn */
        ck_assert_ptr_eq(slot[k], slot[k - 2]);
    ck_assert_ptr_ne(slot[0], slot[1]);
    int64_t np;
    float *pc = mge_graph_params(c.g, &np), hp[256];
    mge_device_sim.d2h(hp, mge_graph_params(s.g, NULL), sizeof(float) * (size_t)np);
    ck_assert_mem_eq(hp, pc, sizeof(float) * (size_t)np);

    /* a bind or another batch size after staging drops the staged copy */
    batch_fill(3, xs, ys);
    ck_assert_int_eq(mge_graph_stage(s.g), MGE_OK);
    ck_assert(mge_graph_is_staged(s.g));
    mge_graph_bind(s.g, s.x, junk);
    ck_assert(!mge_graph_is_staged(s.g));
    mge_graph_bind(s.g, s.x, xs);
    ck_assert_int_eq(mge_graph_stage(s.g), MGE_OK);
    mge_graph_set_batch(s.g, 3);
    ck_assert(!mge_graph_is_staged(s.g));
    mge_graph_free(c.g);
    mge_graph_free(s.g);
}
END_TEST

static Suite *device_suite(void)
{
    Suite *s = suite_create("device");
    TCase *tc = tcase_create("sim");
    tcase_add_test(tc, test_find);
    tcase_add_test(tc, test_sim_copies);
    tcase_add_test(tc, test_sim_host_access_faults);
    tcase_add_test(tc, test_graph_bit_identical);
    tcase_add_test(tc, test_stage_double_buffer);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mge_test_run(device_suite());
}
