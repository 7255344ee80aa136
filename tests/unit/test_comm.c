/*
 * test_comm.c: unit tests of engine/comm without a launcher: the launcher environment and
 * backend choice, the local backend, the communication thread (over a fake two-rank backend
 * whose all-reduce doubles the buffer, as two identical ranks would), gradient packs, and the
 * fixed-point exact sums of deterministic mode.
 * MPI across ranks is tested by tests/integration/train_mpi.sh under mpirun.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/comm/comm.h"
#include "engine/comm/comm_int.h"
#include "tests/unit/support/check_run.h"

static const char *const env_vars[] = {"OMPI_COMM_WORLD_RANK",
                                       "OMPI_COMM_WORLD_SIZE",
                                       "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "MGE_RANK",
                                       "MGE_WORLD_SIZE",
                                       "MGE_LOCAL_RANK",
                                       "PMI_RANK",
                                       "PMI_SIZE",
                                       "MPI_LOCALRANKID",
                                       "PMIX_RANK",
                                       "SLURM_PROCID",
                                       "SLURM_NTASKS",
                                       "SLURM_LOCALID"};

static void setup(void)
{
    mge_log_set_level(MGE_LOG_OFF);
    for (size_t i = 0; i < sizeof(env_vars) / sizeof(env_vars[0]); i++)
        unsetenv(env_vars[i]);
}

static void teardown(void)
{
    mge_alloc_fail_after(-1);
}

/* ---- environment and backend choice ---- */

START_TEST(test_env_none)
{
    struct mge_comm_env env;
    mge_comm_env_read(&env);
    ck_assert_int_eq(env.launched, 0);
    ck_assert_int_eq(env.rank, 0);
    ck_assert_int_eq(env.size, 1);
    ck_assert_int_eq(mge_comm_backend_resolve(MGE_BACKEND_AUTO, MGE_DEVICE_CPU, &env),
                     MGE_BACKEND_LOCAL);
    ck_assert_int_eq(mge_comm_backend_resolve(MGE_BACKEND_AUTO, MGE_DEVICE_GPU, &env),
                     MGE_BACKEND_LOCAL);
    ck_assert_int_eq(mge_comm_backend_resolve(MGE_BACKEND_MPI, MGE_DEVICE_CPU, &env),
                     MGE_BACKEND_MPI);
}
END_TEST

START_TEST(test_env_launchers)
{
    struct mge_comm_env env;
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    mge_comm_env_read(&env);
    ck_assert(env.launched && env.rank == 3 && env.size == 4 && env.local_rank == 1);
    ck_assert_int_eq(mge_comm_backend_resolve(MGE_BACKEND_AUTO, MGE_DEVICE_CPU, &env),
                     MGE_BACKEND_MPI);
    ck_assert_int_eq(mge_comm_backend_resolve(MGE_BACKEND_AUTO, MGE_DEVICE_GPU, &env),
                     MGE_BACKEND_NCCL);
    setup();
    setenv("PMIX_RANK", "2", 1);
    setenv("SLURM_PROCID", "2", 1);
    setenv("SLURM_NTASKS", "8", 1);
    mge_comm_env_read(&env);
    ck_assert(env.launched && env.rank == 2 && env.size == 8 && env.local_rank == 0);
    setup();
    setenv("MGE_RANK", "1", 1);
    setenv("MGE_WORLD_SIZE", "2", 1);
    mge_comm_env_read(&env);
    ck_assert(env.launched && env.rank == 1 && env.size == 2);
    /* malformed or inconsistent: not launched */
    setup();
    setenv("PMI_RANK", "5", 1);
    setenv("PMI_SIZE", "2", 1);
    mge_comm_env_read(&env);
    ck_assert(!env.launched && env.size == 1);
    setenv("PMI_RANK", "x", 1);
    mge_comm_env_read(&env);
    ck_assert(!env.launched);
}
END_TEST

START_TEST(test_backend_names)
{
    ck_assert_str_eq(mge_comm_backend_name(MGE_BACKEND_LOCAL), "local");
    ck_assert_str_eq(mge_comm_backend_name(MGE_BACKEND_MPI), "mpi");
    ck_assert_str_eq(mge_comm_backend_name(MGE_BACKEND_NCCL), "nccl");
    ck_assert_int_eq(mge_comm_backend_available(MGE_BACKEND_LOCAL), 1);
    ck_assert_int_eq(mge_comm_backend_available(MGE_BACKEND_AUTO), 0);
}
END_TEST

/* ---- the local backend ---- */

START_TEST(test_local_collectives)
{
    struct mge_comm_env env;
    struct mge_comm *c;
    char err[256] = "";
    mge_comm_env_read(&env);
    ck_assert_int_eq(mge_comm_open(&c, MGE_BACKEND_LOCAL, &env, err, sizeof(err)), MGE_OK);
    ck_assert_int_eq(mge_comm_rank(c), 0);
    ck_assert_int_eq(mge_comm_size(c), 1);
    ck_assert_int_eq(mge_comm_backend(c), MGE_BACKEND_LOCAL);
    float x[3] = {1, 2, 3};
    ck_assert_int_eq(mge_comm_allreduce(c, x, 3, MGE_COMM_F32), MGE_OK);
    ck_assert(x[0] == 1 && x[1] == 2 && x[2] == 3);
    ck_assert_int_eq(mge_comm_broadcast(c, x, sizeof(x), 0), MGE_OK);
    ck_assert_int_eq(mge_comm_broadcast(c, x, sizeof(x), 1), MGE_INVAL);
    int64_t mine = 42, all[1] = {0};
    ck_assert_int_eq(mge_comm_allgather(c, &mine, sizeof(mine), all), MGE_OK);
    ck_assert_int_eq(all[0], 42);
    ck_assert_int_eq(mge_comm_barrier(c), MGE_OK);
    uint64_t t1, t2;
    struct mge_comm_timing tm = {-1, -1};
    ck_assert_int_eq(mge_comm_allreduce_start(c, x, 3, MGE_COMM_F32, &t1), MGE_OK);
    ck_assert_int_eq(mge_comm_allreduce_start(c, x, 3, MGE_COMM_F32, &t2), MGE_OK);
    ck_assert(t2 == t1 + 1);
    ck_assert_int_eq(mge_comm_wait(c, t2, &tm), MGE_OK);
    ck_assert(tm.start > 0 && tm.end >= tm.start);
    ck_assert_int_eq(mge_comm_wait(c, t1, NULL), MGE_OK);
    ck_assert_int_eq(mge_comm_wait(c, t2 + 1, NULL), MGE_INVAL);
    mge_comm_abort(c, 1); /* one rank: nothing to end, returns */
    mge_comm_close(c);
    mge_comm_close(NULL);
}
END_TEST

START_TEST(test_local_refuses_ranks)
{
    struct mge_comm_env env;
    struct mge_comm *c = (struct mge_comm *)1;
    char err[256] = "";
    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    mge_comm_env_read(&env);
    ck_assert_int_eq(mge_comm_open(&c, MGE_BACKEND_LOCAL, &env, err, sizeof(err)), MGE_UNSUPPORTED);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(err, "local runs one rank, but this is rank 1 of 2"), "%s", err);
    ck_assert_int_eq(mge_comm_open(&c, MGE_BACKEND_AUTO, &env, err, sizeof(err)), MGE_INVAL);
}
END_TEST

START_TEST(test_local_oom)
{
    struct mge_comm_env env;
    struct mge_comm *c;
    char err[256] = "";
    mge_comm_env_read(&env);
    mge_alloc_fail_after(0);
    ck_assert_int_eq(mge_comm_open(&c, MGE_BACKEND_LOCAL, &env, err, sizeof(err)), MGE_NOMEM);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(err, "out of memory"), "%s", err);
}
END_TEST

/* ---- the communication thread, over a fake two-rank backend ---- */

struct fake {
    int calls;     /* collectives run */
    int fail_at;   /* this call fails (1-based), 0: never */
    int order[64]; /* kind of each call */
    long delay_ns; /* each all-reduce takes this long */
};

static int fake_step(struct mge_comm *c, enum mge__comm_kind kind)
{
    struct fake *f = c->impl;
    f->order[f->calls % 64] = kind;
    f->calls++;
    return f->fail_at && f->calls == f->fail_at ? MGE_COMM : MGE_OK;
}

static int fake_allreduce(struct mge_comm *c, void *buf, size_t count, enum mge_comm_dtype dt)
{
    struct fake *f = c->impl;
    struct timespec ts = {0, f->delay_ns};
    ck_assert_int_eq(dt, MGE_COMM_F32);
    if (f->delay_ns)
        nanosleep(&ts, NULL);
    for (size_t i = 0; i < count; i++)
        ((float *)buf)[i] *= 2.0f; /* two ranks holding the same values */
    return fake_step(c, MGE__COMM_ALLREDUCE);
}

static int fake_broadcast(struct mge_comm *c, void *buf, size_t bytes, int root)
{
    (void)buf, (void)bytes, (void)root;
    return fake_step(c, MGE__COMM_BROADCAST);
}

static int fake_allgather(struct mge_comm *c, const void *send, size_t bytes, void *recv)
{
    memcpy(recv, send, bytes);
    memcpy((char *)recv + bytes, send, bytes);
    return fake_step(c, MGE__COMM_ALLGATHER);
}

static int fake_barrier(struct mge_comm *c)
{
    return fake_step(c, MGE__COMM_BARRIER);
}
static void fake_close(struct mge_comm *c)
{
    (void)c;
}

static const struct mge__comm_ops fake_ops = {
    .name = "fake",
    .threaded = 1,
    .allreduce = fake_allreduce,
    .broadcast = fake_broadcast,
    .allgather = fake_allgather,
    .barrier = fake_barrier,
    .close = fake_close,
};

START_TEST(test_thread_fifo)
{
    struct fake f = {.delay_ns = 2000000};
    struct mge_comm *c;
    ck_assert_int_eq(mge__comm_new(&c, &fake_ops, MGE_BACKEND_MPI, 0, 2, &f), MGE_OK);
    float a[4] = {1, 1, 1, 1}, b[2] = {3, 3};
    uint64_t ta, tb;
    double t0 = mge_comm_now();
    ck_assert_int_eq(mge_comm_allreduce_start(c, a, 4, MGE_COMM_F32, &ta), MGE_OK);
    ck_assert_int_eq(mge_comm_allreduce_start(c, b, 2, MGE_COMM_F32, &tb), MGE_OK);
    /* returns at once: the work is on the thread (each all-reduce takes 2 ms) */
    ck_assert_msg(mge_comm_now() - t0 < 0.002, "start blocked");
    /* a blocking call runs after what is queued */
    ck_assert_int_eq(mge_comm_barrier(c), MGE_OK);
    ck_assert(a[3] == 2.0f && b[1] == 6.0f);
    ck_assert_int_eq(f.calls, 3);
    ck_assert(f.order[0] == MGE__COMM_ALLREDUCE && f.order[1] == MGE__COMM_ALLREDUCE &&
              f.order[2] == MGE__COMM_BARRIER);
    struct mge_comm_timing ma, mb;
    ck_assert_int_eq(mge_comm_wait(c, ta, &ma), MGE_OK);
    ck_assert_int_eq(mge_comm_wait(c, tb, &mb), MGE_OK);
    ck_assert(ma.end - ma.start >= 0.0019 && mb.start >= ma.end);
    int64_t mine = 5, all[2];
    ck_assert_int_eq(mge_comm_allgather(c, &mine, sizeof(mine), all), MGE_OK);
    ck_assert(all[0] == 5 && all[1] == 5);
    ck_assert_int_eq(mge_comm_broadcast(c, a, sizeof(a), 1), MGE_OK);
    ck_assert_int_eq(mge_comm_size(c), 2);
    mge_comm_close(c);
}
END_TEST

START_TEST(test_thread_many)
{
    /* more collectives than the queue holds: start waits for room, nothing is lost */
    struct fake f = {0};
    struct mge_comm *c;
    float x = 1.0f;
    uint64_t t = 0;
    ck_assert_int_eq(mge__comm_new(&c, &fake_ops, MGE_BACKEND_MPI, 0, 2, &f), MGE_OK);
    for (int i = 0; i < 3 * MGE__COMM_RING; i++) {
        if (t && i % 7 == 0)
            ck_assert_int_eq(mge_comm_wait(c, t, NULL), MGE_OK);
        ck_assert_int_eq(mge_comm_allreduce_start(c, &x, 0, MGE_COMM_F32, &t), MGE_OK);
    }
    ck_assert_int_eq(mge_comm_wait(c, t, NULL), MGE_OK);
    ck_assert_int_eq(f.calls, 3 * MGE__COMM_RING);
    ck_assert_int_eq(t, 3 * MGE__COMM_RING);
    mge_comm_close(c);
}
END_TEST

START_TEST(test_thread_error_sticks)
{
    struct fake f = {.fail_at = 2};
    struct mge_comm *c;
    float x[2] = {1, 1};
    uint64_t t1, t2, t3;
    ck_assert_int_eq(mge__comm_new(&c, &fake_ops, MGE_BACKEND_MPI, 0, 2, &f), MGE_OK);
    ck_assert_int_eq(mge_comm_allreduce_start(c, x, 2, MGE_COMM_F32, &t1), MGE_OK);
    ck_assert_int_eq(mge_comm_allreduce_start(c, x, 2, MGE_COMM_F32, &t2), MGE_OK);
    ck_assert_int_eq(mge_comm_wait(c, t1, NULL), MGE_OK); /* before the failure */
    ck_assert_int_eq(mge_comm_wait(c, t2, NULL), MGE_COMM);
    ck_assert_int_eq(mge_comm_allreduce_start(c, x, 2, MGE_COMM_F32, &t3), MGE_COMM);
    ck_assert_int_eq(mge_comm_barrier(c), MGE_COMM);
    ck_assert_int_le(f.calls, 2); /* nothing ran after the failure */
    mge_comm_close(c);
}
END_TEST

/* ---- gradient packs ---- */

START_TEST(test_packs_plan)
{
    struct fake f = {0};
    struct mge_comm *c;
    struct mge_comm_packs *p;
    float arena[1000];
    /* gradients start at these bytes (any order): sizes 40, 400, 960, 1600, 1000 bytes */
    size_t cuts[] = {2400, 0, 40, 440, 1400};
    ck_assert_int_eq(mge__comm_new(&c, &fake_ops, MGE_BACKEND_MPI, 0, 2, &f), MGE_OK);
    /* first pack >= 400 bytes, later ones >= 1000 */
    ck_assert_int_eq(mge_comm_packs_new(&p, c, arena, sizeof(arena), cuts, 5, 400, 1000), MGE_OK);
    ck_assert_int_eq(mge_comm_packs_count(p), 3);
    const struct mge_comm_pack *k0 = mge_comm_packs_get(p, 0), *k1 = mge_comm_packs_get(p, 1),
                               *k2 = mge_comm_packs_get(p, 2);
    ck_assert(k0->first == 0 && k0->count == 110);   /* bytes [0, 440) */
    ck_assert(k1->first == 110 && k1->count == 490); /* [440, 2400) */
    ck_assert(k2->first == 600 && k2->count == 400); /* [2400, 4000): the rest */
    ck_assert_ptr_null(mge_comm_packs_get(p, 3));
    mge_comm_packs_free(p);
    /* one pack when the pack size exceeds the arena */
    ck_assert_int_eq(mge_comm_packs_new(&p, c, arena, sizeof(arena), cuts, 5, 1 << 20, 1 << 20),
                     MGE_OK);
    ck_assert_int_eq(mge_comm_packs_count(p), 1);
    mge_comm_packs_free(p);
    size_t badcut = 4001;
    ck_assert_int_eq(mge_comm_packs_new(&p, c, arena, sizeof(arena), &badcut, 1, 4, 4), MGE_INVAL);
    ck_assert_ptr_null(p);
    mge_alloc_fail_after(1);
    ck_assert_int_eq(mge_comm_packs_new(&p, c, arena, sizeof(arena), cuts, 5, 4, 4), MGE_NOMEM);
    ck_assert_ptr_null(p);
    mge_alloc_fail_after(-1);
    mge_comm_packs_free(NULL);
    mge_comm_close(c);
}
END_TEST

START_TEST(test_packs_ready)
{
    struct fake f = {0};
    struct mge_comm *c;
    struct mge_comm_packs *p;
    float arena[1000];
    size_t cuts[] = {40, 440, 1400, 2400};
    for (int i = 0; i < 1000; i++)
        arena[i] = (float)i;
    ck_assert_int_eq(mge__comm_new(&c, &fake_ops, MGE_BACKEND_MPI, 0, 2, &f), MGE_OK);
    ck_assert_int_eq(mge_comm_packs_new(&p, c, arena, sizeof(arena), cuts, 4, 400, 1000), MGE_OK);
    for (int step = 0; step < 2; step++) {
        mge_comm_packs_begin(p);
        ck_assert_int_eq(mge_comm_packs_wait(p, 0), MGE_STATE); /* not started */
        mge_comm_packs_ready_hook(p, 40);                       /* inside pack 0: nothing starts */
        ck_assert(mge_comm_packs_get(p, 0)->ticket == 0);
        mge_comm_packs_ready_hook(p, 1400); /* pack 0 starts, pack 1 not yet */
        ck_assert(mge_comm_packs_get(p, 0)->ticket != 0);
        ck_assert(mge_comm_packs_get(p, 1)->ticket == 0);
        ck_assert_int_eq(mge_comm_packs_wait(p, 0), MGE_OK);
        ck_assert(arena[109] == 109.0f * (float)(2 << step)); /* pack 0 summed */
        mge_comm_packs_ready(p, sizeof(arena));               /* the rest */
        for (int i = 0; i < mge_comm_packs_count(p); i++) {
            ck_assert_int_eq(mge_comm_packs_wait(p, i), MGE_OK);
            const struct mge_comm_pack *k = mge_comm_packs_get(p, i);
            ck_assert(k->ready_at > 0 && k->timing.end >= k->timing.start);
        }
    }
    for (int i = 0; i < 1000; i++) /* every element reduced exactly once per step */
        ck_assert(arena[i] == 4.0f * (float)i);
    mge_comm_packs_free(p);
    mge_comm_close(c);
}
END_TEST

/* ---- exact sums ---- */

enum { EX_TERMS = 12, EX_N = 4096 };

/* Terms of mixed signs and magnitudes, so float sums in different orders round differently. */
static void exact_terms(float x[EX_TERMS][EX_N])
{
    unsigned r = 12345;
    for (int k = 0; k < EX_TERMS; k++)
        for (int i = 0; i < EX_N; i++) {
            r = r * 1103515245u + 12345u;
            float m = (float)((r >> 8) & 0xffff) / 65536.0f - 0.5f;
            x[k][i] = m * (float)(1 << (r >> 28)) * 1e-3f;
        }
}

/* The same terms in forward, reverse and a strided order, and split over 1, 2 or 3 "ranks"
 * whose accumulators are then summed (what the int64 all-reduce does), give equal bits. */
START_TEST(test_exact_order_independent)
{
    static float x[EX_TERMS][EX_N];
    static int64_t ref[EX_N], acc[3][EX_N], sum[EX_N];
    static float out_ref[EX_N], out[EX_N];
    static const int orders[3][EX_TERMS] = {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11},
                                            {11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0},
                                            {5, 0, 7, 2, 9, 4, 11, 6, 1, 8, 3, 10}};
    size_t bad = 0;
    int float_differs = 0;
    exact_terms(x);
    for (int k = 0; k < EX_TERMS; k++)
        ck_assert_int_eq(mge_exact_add_f32(ref, x[k], EX_N, EX_TERMS, &bad), MGE_OK);
    mge_exact_to_f32(out_ref, ref, EX_N);
    for (int o = 0; o < 3; o++) {
        for (int w = 1; w <= 3; w++) {
            memset(acc, 0, sizeof(acc));
            for (int j = 0; j < EX_TERMS; j++) /* term j goes to rank j * w / EX_TERMS */
                ck_assert_int_eq(
                    mge_exact_add_f32(acc[j * w / EX_TERMS], x[orders[o][j]], EX_N, EX_TERMS, &bad),
                    MGE_OK);
            for (int i = 0; i < EX_N; i++)
                sum[i] = acc[2][i] + acc[1][i] + acc[0][i];
            ck_assert_mem_eq(sum, ref, sizeof(ref));
            mge_exact_to_f32(out, sum, EX_N);
            ck_assert_mem_eq(out, out_ref, sizeof(out));
        }
    }
    /* and the result is the true sum to within the rounding of the terms */
    for (int i = 0; i < EX_N; i++) {
        double d = 0, fwd = 0, rev = 0;
        for (int k = 0; k < EX_TERMS; k++)
            d += x[k][i];
        for (int k = 0; k < EX_TERMS; k++) {
            fwd = (float)(fwd + x[k][i]);
            rev = (float)(rev + x[EX_TERMS - 1 - k][i]);
        }
        float_differs |= fwd != rev;
        ck_assert_double_le(fabs(mge_exact_to_f64(ref[i]) - d), EX_TERMS * ldexp(1, -41));
        ck_assert_double_le(fabs((double)out_ref[i] - d), fabs(d) * 0x1p-23 + ldexp(1, -36));
    }
    ck_assert_msg(float_differs, "the float sums should depend on the order (else no test)");
}
END_TEST

/* Addends beyond 2^22 / terms, infinities and NaN are refused, and the first is named; at the
 * limit, terms addends of the same sign still sum inside int64. */
START_TEST(test_exact_range)
{
    int64_t acc[4] = {0, 0, 0, 0}, one = 0;
    float x[4] = {1.0f, 2.0f, 0, 0};
    double lim = mge_exact_limit(EX_TERMS);
    size_t bad = 99;
    ck_assert_double_eq(lim, 4194304.0 / EX_TERMS);
    x[2] = (float)(lim * 1.001);
    ck_assert_int_eq(mge_exact_add_f32(acc, x, 4, EX_TERMS, &bad), MGE_RANGE);
    ck_assert_uint_eq(bad, 2);
    x[2] = 0;
    x[3] = -INFINITY;
    ck_assert_int_eq(mge_exact_add_f32(acc, x, 4, EX_TERMS, &bad), MGE_RANGE);
    ck_assert_uint_eq(bad, 3);
    x[1] = NAN;
    ck_assert_int_eq(mge_exact_add_f32(acc, x, 4, EX_TERMS, &bad), MGE_RANGE);
    ck_assert_uint_eq(bad, 1);
    ck_assert_int_eq(mge_exact_add_f64(&one, lim * 1.001, EX_TERMS), MGE_RANGE);
    ck_assert_int_eq(mge_exact_add_f64(&one, NAN, EX_TERMS), MGE_RANGE);
    ck_assert_int_eq(one, 0);
    /* EX_TERMS addends at the limit, either sign: no wrap */
    float top = (float)lim, low = -(float)lim;
    while ((double)top > lim)
        top = nextafterf(top, 0);
    low = -top;
    memset(acc, 0, sizeof(acc));
    for (int k = 0; k < EX_TERMS; k++) {
        ck_assert_int_eq(mge_exact_add_f32(acc, &top, 1, EX_TERMS, &bad), MGE_OK);
        ck_assert_int_eq(mge_exact_add_f32(acc + 1, &low, 1, EX_TERMS, &bad), MGE_OK);
        ck_assert_int_eq(mge_exact_add_f64(&one, (double)top, EX_TERMS), MGE_OK);
    }
    ck_assert(acc[0] > 0 && acc[1] < 0 && acc[0] == -acc[1] && one == acc[0]);
    ck_assert_double_eq(mge_exact_to_f64(acc[0]), (double)top * EX_TERMS);
}
END_TEST

/* Halves round to even, as lrint would, in the vector body and the remainder alike (every ISA
 * clone must give these integers, or ranks on different CPUs would disagree). */
START_TEST(test_exact_rounding)
{
    static const float units[5] = {1.5f, 2.5f, -1.5f, 0.25f, -0.75f};
    static const int64_t want[5] = {2, 2, -2, 0, -1};
    float x[67];
    int64_t acc[67] = {0};
    size_t bad;
    for (int i = 0; i < 67; i++)
        x[i] = ldexpf(units[i % 5], -MGE_EXACT_FRAC_BITS);
    ck_assert_int_eq(mge_exact_add_f32(acc, x, 67, 1, &bad), MGE_OK);
    for (int i = 0; i < 67; i++)
        ck_assert_msg(acc[i] == want[i % 5], "element %d: %lld, want %lld", i, (long long)acc[i],
                      (long long)want[i % 5]);
}
END_TEST

static Suite *comm_suite(void)
{
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("env");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_env_none);
    tcase_add_test(tc, test_env_launchers);
    tcase_add_test(tc, test_backend_names);
    suite_add_tcase(s, tc);
    tc = tcase_create("local");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_local_collectives);
    tcase_add_test(tc, test_local_refuses_ranks);
    tcase_add_test(tc, test_local_oom);
    suite_add_tcase(s, tc);
    tc = tcase_create("thread");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_thread_fifo);
    tcase_add_test(tc, test_thread_many);
    tcase_add_test(tc, test_thread_error_sticks);
    suite_add_tcase(s, tc);
    tc = tcase_create("packs");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_packs_plan);
    tcase_add_test(tc, test_packs_ready);
    suite_add_tcase(s, tc);
    tc = tcase_create("exact");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_exact_order_independent);
    tcase_add_test(tc, test_exact_range);
    tcase_add_test(tc, test_exact_rounding);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return mge_test_run(comm_suite()); }
