/* planner.c: run `mge-train --plan` on a submitted spec and read its memory plans (planner.h). */
#include "planner.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/dataroot.h"
#include "common/err.h"

#define OUT_MAX (1 << 20) /* the plan JSON is a few hundred bytes */
#define ERR_KEEP 600      /* the end of stderr kept for the message */
#define PLAN_MEMORY_MB 2048 /* the planner child's data memory cap (MGE_MEMORY_LIMIT_MB) */

extern char **environ;

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

char *mge_bytes_human(int64_t bytes, char *buf, size_t len)
{
    if (bytes >= ((int64_t)1 << 30))
        snprintf(buf, len, "%.1f GiB", (double)bytes / (double)((int64_t)1 << 30));
    else if (bytes >= ((int64_t)1 << 20))
        snprintf(buf, len, "%.0f MiB", (double)bytes / (double)((int64_t)1 << 20));
    else
        snprintf(buf, len, "%.0f KiB", (double)bytes / 1024.0);
    return buf;
}

void mge_job_plan_fini(struct mge_job_plan *p)
{
    json_decref(p->json);
    memset(p, 0, sizeof(*p));
}

/* Append what @fd has to @buf (*@n bytes, capacity @cap; past it the oldest bytes go when
 * @keep_tail, else the rest is dropped). Returns false at EOF or error. */
static bool drain(int fd, char *buf, size_t *n, size_t cap, bool keep_tail)
{
    char tmp[4096];
    ssize_t r = read(fd, tmp, sizeof(tmp));
    if (r < 0 && (errno == EINTR || errno == EAGAIN))
        return true;
    if (r <= 0)
        return false;
    if (*n + (size_t)r <= cap) {
        memcpy(buf + *n, tmp, (size_t)r);
        *n += (size_t)r;
    } else if (keep_tail) {
        size_t take = (size_t)r > cap ? cap : (size_t)r, keep = cap - take;
        if (keep > *n)
            keep = *n;
        memmove(buf, buf + *n - keep, keep);
        memcpy(buf + keep, tmp + (size_t)r - take, take);
        *n = keep + take;
    } else {
        memcpy(buf + *n, tmp, cap - *n);
        *n = cap;
    }
    return true;
}

/* The last non-empty line of @s (NUL-terminated, modified): what mge-train says on exit 2. */
static const char *last_line(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == ' '))
        s[--n] = '\0';
    char *nl = strrchr(s, '\n');
    return nl ? nl + 1 : s;
}

static int64_t plan_peak(json_t *o)
{
    return (int64_t)json_integer_value(json_object_get(o, "peak_bytes"));
}

/* Fill @p from the planner's JSON @root (stolen). */
static int plan_read(json_t *root, struct mge_job_plan *p, char *why, size_t why_len)
{
    json_t *chosen = json_object_get(root, "chosen"), *plans = json_object_get(root, "plans");
    json_t *plain = json_object_get(plans, "plain"), *sub = json_object_get(plans, "sublinear");
    const char *mode = json_string_value(json_object_get(chosen, "mode"));
    if (!json_is_object(chosen) || !json_is_object(plain) || !json_is_object(sub) || !mode ||
        plan_peak(chosen) <= 0 || plan_peak(plain) <= 0 || plan_peak(sub) <= 0) {
        snprintf(why, why_len, "the planner's output lacks chosen/plans peak_bytes");
        json_decref(root);
        return MGE_PROTO;
    }
    p->chosen_bytes = plan_peak(chosen);
    p->plain_bytes = plan_peak(plain);
    p->sublinear_bytes = plan_peak(sub);
    snprintf(p->chosen_mode, sizeof(p->chosen_mode), "%s", mode);
    p->json = root;
    return MGE_OK;
}

int mge_job_plan_run(const struct mge_planner_opts *opts, const char *spec_yaml,
                     struct mge_job_plan *out, char *why, size_t why_len)
{
    char path[4200], roots_env[4200], *argv[4], *out_buf = NULL, err_buf[ERR_KEEP + 1];
    static char plan_flag[] = "--plan", one_thread[] = "OMP_NUM_THREADS=1";
    char mem_env[64];
    char **env = NULL;
    size_t n_out = 0, n_err = 0, n_env = 0;
    int fd = -1, p_out[2] = {-1, -1}, p_err[2] = {-1, -1}, status = 0, rc = MGE_IO;
    int timeout = opts->timeout_ms > 0 ? opts->timeout_ms : 30000;
    posix_spawn_file_actions_t fa;
    bool fa_init = false, out_open, err_open;
    pid_t pid = -1;
    int64_t deadline;
    size_t len = strlen(spec_yaml);

    memset(out, 0, sizeof(*out));
    if (!opts->bin) {
        snprintf(why, why_len, "planning is off (no --plan-bin)");
        return MGE_UNSUPPORTED;
    }
    snprintf(path, sizeof(path), "%s/plan-XXXXXX.yaml", opts->tmp_dir ? opts->tmp_dir : "/tmp");
    if ((fd = mkstemps(path, 5)) < 0) {
        snprintf(why, why_len, "cannot create '%.300s': %s", path, strerror(errno));
        return MGE_IO;
    }
    if (write(fd, spec_yaml, len) != (ssize_t)len || close(fd) != 0) {
        snprintf(why, why_len, "cannot write '%.300s': %s", path, strerror(errno));
        fd = -1;
        goto out;
    }
    fd = -1;
    /* the child's environment: ours, with the data roots replaced and one thread */
    for (char **e = environ; *e; e++)
        n_env++;
    if (!(env = mge_calloc(n_env + 4, sizeof(*env)))) {
        rc = MGE_NOMEM;
        snprintf(why, why_len, "out of memory");
        goto out;
    }
    n_env = 0;
    for (char **e = environ; *e; e++)
        if (strncmp(*e, MGE_DATA_ROOTS_ENV "=", strlen(MGE_DATA_ROOTS_ENV) + 1) &&
            strncmp(*e, "OMP_NUM_THREADS=", 16) && strncmp(*e, "MGE_MEMORY_LIMIT_MB=", 20))
            env[n_env++] = *e;
    snprintf(roots_env, sizeof(roots_env), "%s=%s", MGE_DATA_ROOTS_ENV,
             opts->data_roots ? opts->data_roots : "");
    env[n_env++] = roots_env;
    env[n_env++] = one_thread;
    snprintf(mem_env, sizeof(mem_env), "MGE_MEMORY_LIMIT_MB=%d",
             opts->memory_mb > 0 ? opts->memory_mb : PLAN_MEMORY_MB);
    env[n_env++] = mem_env;
    env[n_env] = NULL;

    if (pipe2(p_out, O_CLOEXEC) != 0 || pipe2(p_err, O_CLOEXEC) != 0) {
        snprintf(why, why_len, "pipe: %s", strerror(errno));
        goto out;
    }
    posix_spawn_file_actions_init(&fa);
    fa_init = true;
    posix_spawn_file_actions_adddup2(&fa, p_out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, p_err[1], 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    argv[0] = (char *)opts->bin;
    argv[1] = plan_flag;
    argv[2] = path;
    argv[3] = NULL;
    if ((errno = posix_spawn(&pid, opts->bin, &fa, NULL, argv, env)) != 0) {
        snprintf(why, why_len, "cannot start the planner '%.300s': %s", opts->bin, strerror(errno));
        pid = -1;
        goto out;
    }
    close(p_out[1]);
    close(p_err[1]);
    p_out[1] = p_err[1] = -1;
    if (!(out_buf = mge_malloc(OUT_MAX + 1))) {
        rc = MGE_NOMEM;
        snprintf(why, why_len, "out of memory");
        goto out;
    }
    deadline = mono_ms() + timeout;
    out_open = err_open = true;
    while (out_open || err_open) {
        struct pollfd pf[2] = {{.fd = out_open ? p_out[0] : -1, .events = POLLIN},
                               {.fd = err_open ? p_err[0] : -1, .events = POLLIN}};
        int64_t left = deadline - mono_ms();
        if (left <= 0)
            break;
        if (poll(pf, 2, (int)left) < 0 && errno != EINTR)
            break;
        if (pf[0].revents && !drain(p_out[0], out_buf, &n_out, OUT_MAX, false))
            out_open = false;
        if (pf[1].revents && !drain(p_err[0], err_buf, &n_err, ERR_KEEP, true))
            err_open = false;
    }
    if (out_open || err_open) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        pid = -1;
        rc = MGE_TIMEOUT;
        snprintf(why, why_len, "the planner gave no answer within %d s", timeout / 1000);
        goto out;
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    pid = -1;
    out_buf[n_out] = '\0';
    err_buf[n_err] = '\0';
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        const char *msg = last_line(err_buf);
        if (WIFEXITED(status))
            snprintf(why, why_len, "the planner exited %d: %.400s", WEXITSTATUS(status), msg);
        else
            snprintf(why, why_len, "the planner was killed by signal %d", WTERMSIG(status));
        rc = MGE_INVAL;
        goto out;
    }
    {
        json_error_t je;
        json_t *root = json_loads(out_buf, 0, &je);
        if (!root) {
            snprintf(why, why_len, "the planner's output is not JSON: %s", je.text);
            rc = MGE_PROTO;
            goto out;
        }
        rc = plan_read(root, out, why, why_len);
    }
out:
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    if (fa_init)
        posix_spawn_file_actions_destroy(&fa);
    for (int i = 0; i < 2; i++) {
        if (p_out[i] >= 0)
            close(p_out[i]);
        if (p_err[i] >= 0)
            close(p_err[i]);
    }
    unlink(path);
    mge_free(out_buf);
    mge_free(env);
    return rc;
}

#define CACHE_N 64
#define CACHE_TTL_MS (10 * 60 * 1000)

struct cache_entry {
    char *spec; /* owned; NULL: empty */
    int64_t at; /* mono_ms when planned */
    struct mge_job_plan plan;
};

struct mge_planner {
    struct mge_planner_opts opts;
    pthread_mutex_t mu;
    struct cache_entry e[CACHE_N];
    unsigned next; /* the entry replaced next (round robin) */
};

int mge_planner_new(const struct mge_planner_opts *opts, struct mge_planner **out)
{
    struct mge_planner *p = mge_calloc(1, sizeof(*p));
    if (!p)
        return MGE_NOMEM;
    p->opts = *opts;
    pthread_mutex_init(&p->mu, NULL);
    *out = p;
    return MGE_OK;
}

void mge_planner_free(struct mge_planner *p)
{
    if (!p)
        return;
    for (int i = 0; i < CACHE_N; i++) {
        mge_free(p->e[i].spec);
        mge_job_plan_fini(&p->e[i].plan);
    }
    pthread_mutex_destroy(&p->mu);
    mge_free(p);
}

/* A copy of @src into @dst (the JSON shared, referenced once more). */
static void plan_copy(struct mge_job_plan *dst, const struct mge_job_plan *src)
{
    *dst = *src;
    json_incref(dst->json);
}

int mge_planner_run(struct mge_planner *p, const char *spec_yaml, struct mge_job_plan *out,
                    char *why, size_t why_len)
{
    int64_t now = mono_ms();
    int rc;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < CACHE_N; i++) {
        struct cache_entry *e = &p->e[i];
        if (e->spec && now - e->at < CACHE_TTL_MS && !strcmp(e->spec, spec_yaml)) {
            plan_copy(out, &e->plan);
            pthread_mutex_unlock(&p->mu);
            return MGE_OK;
        }
    }
    pthread_mutex_unlock(&p->mu);
    rc = mge_job_plan_run(&p->opts, spec_yaml, out, why, why_len);
    if (rc != MGE_OK)
        return rc;
    pthread_mutex_lock(&p->mu);
    {
        struct cache_entry *e = &p->e[p->next];
        char *copy = mge_strdup(spec_yaml);
        if (copy) {
            mge_free(e->spec);
            mge_job_plan_fini(&e->plan);
            e->spec = copy;
            e->at = now;
            plan_copy(&e->plan, out);
            p->next = (p->next + 1) % CACHE_N;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return MGE_OK;
}
