/* test_procstat.c: Check suite for worker/procstat.c: /proc/<pid>/stat parsing (names with
 * spaces and parentheses), and real process groups: a stopped member, CPU time that grows
 * while a member spins, an empty group. */
#include <check.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "tests/unit/support/check_run.h"
#include "worker/procstat.h"

START_TEST(test_procstat_parse)
{
    char st = 0;
    int sid = 0;
    int64_t ticks = 0;
    ck_assert(mge_procstat_parse("4242 (mge-train) R 1 4242 4240 0 -1 4194304 10 0 0 0 "
                                 "150 25 0 0 20 0 3 0 100 0 0",
                                 &st, &sid, &ticks));
    ck_assert_int_eq(st, 'R');
    ck_assert_int_eq(sid, 4240);
    ck_assert_int_eq(ticks, 175);
    /* a command name can hold spaces and ") (": the fields start after the last ')' */
    ck_assert(mge_procstat_parse("7 (a) b (c) T 1 8 9 0 -1 0 0 0 0 0 3 4 0 0", &st, &sid, &ticks));
    ck_assert_int_eq(st, 'T');
    ck_assert_int_eq(sid, 9);
    ck_assert_int_eq(ticks, 7);
    ck_assert(!mge_procstat_parse("7 (truncated) R 1 2", &st, &sid, &ticks));
    ck_assert(!mge_procstat_parse("no parenthesis at all", &st, &sid, &ticks));
}
END_TEST

/*
 * A child in a session of its own (as the worker starts a rank) whose own child, in a process
 * group of its own (as Open MPI starts a rank's process), spins (@spin) or sleeps. Returns the
 * session id; the grandchild's pid into *@gc.
 */
static pid_t child_session(int spin, pid_t *gc)
{
    int fd[2];
    pid_t pid;
    ck_assert_int_eq(pipe(fd), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        pid_t g;
        setsid();
        g = fork();
        if (g > 0) {
            if (write(fd[1], &g, sizeof(g)) != sizeof(g))
                _exit(1);
            waitpid(g, NULL, 0);
            _exit(0);
        }
        setpgid(0, 0);
        if (spin) {
            volatile unsigned long x = 0;
            for (;;)
                x++;
        }
        pause();
        _exit(0);
    }
    ck_assert_int_eq(read(fd[0], gc, sizeof(*gc)), sizeof(*gc));
    close(fd[0]);
    close(fd[1]);
    return pid;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* End session @sid: its leader and the grandchild @gc (in another process group). */
static void reap(pid_t sid, pid_t gc)
{
    kill(gc, SIGKILL);
    kill(sid, SIGKILL);
    waitpid(sid, NULL, 0);
}

START_TEST(test_procstat_groups)
{
    pid_t spin_gc, idle_gc, spin = child_session(1, &spin_gc), idle = child_session(0, &idle_gc);
    struct mge_session_stat g[3] = {{.sid = spin}, {.sid = idle}, {.sid = 999999999}};
    int64_t cpu0;
    sleep_ms(300);
    ck_assert_int_eq(mge_procstat_sessions(g, 3), MGE_OK);
    ck_assert_int_eq(g[0].n_procs, 2); /* the leader and its child */
    ck_assert_int_eq(g[1].n_procs, 2);
    ck_assert_int_eq(g[2].n_procs, 0);
    ck_assert(!g[0].stopped && !g[1].stopped);
    cpu0 = g[0].cpu_ms;
    sleep_ms(500);
    ck_assert_int_eq(mge_procstat_sessions(g, 3), MGE_OK);
    ck_assert_int_gt(g[0].cpu_ms, cpu0); /* the spinning group burns CPU */
    ck_assert_int_le(g[1].cpu_ms, 20);   /* the sleeping one does not */
    /* SIGSTOP to the grandchild alone: the session reads as stopped; SIGCONT: no longer */
    kill(idle_gc, SIGSTOP);
    for (int i = 0; i < 100 && (mge_procstat_sessions(g, 3), !g[1].stopped); i++)
        sleep_ms(10);
    ck_assert(g[1].stopped);
    ck_assert(!g[0].stopped);
    kill(idle_gc, SIGCONT);
    for (int i = 0; i < 100 && (mge_procstat_sessions(g, 3), g[1].stopped); i++)
        sleep_ms(10);
    ck_assert(!g[1].stopped);
    reap(spin, spin_gc);
    reap(idle, idle_gc);
    sleep_ms(50); /* the grandchildren, reparented, are reaped by init */
    ck_assert_int_eq(mge_procstat_sessions(g, 2), MGE_OK);
    ck_assert_int_eq(g[0].n_procs, 0);
    ck_assert_int_eq(g[1].n_procs, 0);
}
END_TEST

static Suite *procstat_suite(void)
{
    Suite *s = suite_create("procstat");
    TCase *tc = tcase_create("procstat");
    tcase_add_test(tc, test_procstat_parse);
    tcase_add_test(tc, test_procstat_groups);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mge_test_run(procstat_suite());
}
