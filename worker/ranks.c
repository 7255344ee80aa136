/* ranks.c: spawning, watching and killing mge-train ranks on the libuv loop (see ranks.h). */
#include "ranks.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/crypto.h"
#include "common/err.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "gpus.h"

#define LINE_MAX_BYTES 65536       /* longer lines are split */
#define LINES_BUFFER_MAX 200000    /* per rank; log lines beyond are dropped (metrics kept) */
#define CKPT_SCAN_MS 500
/* After a rank's process exits, how long a grandchild may keep its output pipes open before
 * the worker kills the rank's process group and closes them (the rank then counts as ended) */
#define PIPE_DRAIN_MS 2000

extern char **environ;

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void notify_output(struct mge_ranks *rs)
{
    if (rs->on_output)
        rs->on_output(rs->on_output_arg);
}

/* Append a line to @r's buffer. mu held. */
static void line_push(struct mge_rank *r, int stream, const char *text, size_t len)
{
    struct mge_out_line *l;
    if (r->n_lines >= LINES_BUFFER_MAX && stream < 2) {
        r->dropped++;
        return;
    }
    if (mge_array_grow((void **)&r->lines, &r->cap_lines, r->n_lines + 1, sizeof(*r->lines)) !=
        MGE_OK) {
        r->dropped++;
        return;
    }
    l = &r->lines[r->n_lines];
    l->text = mge_strndup(text, len);
    if (!l->text) {
        r->dropped++;
        return;
    }
    l->seq = ++r->next_seq;
    l->stream = stream;
    l->time_ms = wall_ms();
    r->n_lines++;
}

static bool is_json_object(const char *s, size_t len)
{
    json_t *o;
    bool ok;
    while (len && (*s == ' ' || *s == '\t')) {
        s++;
        len--;
    }
    if (!len || *s != '{')
        return false;
    o = json_loadb(s, len, 0, NULL);
    ok = json_is_object(o);
    json_decref(o);
    return ok;
}

/* Report checkpoint files of @r's output dir not reported yet ("NAME STEP SIZE PATH"). */
static void ckpt_scan(struct mge_ranks *rs, struct mge_rank *r)
{
    DIR *d = opendir(r->out_dir);
    struct dirent *de;
    int64_t seen = r->last_ckpt_step;
    r->last_ckpt_scan = mono_ms();
    if (!d)
        return;
    while ((de = readdir(d))) {
        long long step;
        char path[2048], line[2300];
        struct stat sb;
        int n, end = 0;
        /* the whole name: mge-train writes "ckpt-<step>.mgeckpt.tmp.*" first, then renames */
        if (sscanf(de->d_name, "ckpt-%lld.mgeckpt%n", &step, &end) != 1 || !end ||
            de->d_name[end] != '\0' || step <= r->last_ckpt_step)
            continue;
        snprintf(path, sizeof(path), "%s/%s", r->out_dir, de->d_name);
        if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) /* a symlink is never reported */
            continue;
        n = snprintf(line, sizeof(line), "%s %lld %lld %s", de->d_name, step,
                     (long long)sb.st_size, path);
        pthread_mutex_lock(&rs->mu);
        line_push(r, 3, line, (size_t)n);
        if (r->rank == 0 && step > r->ckpt_new_step &&
            (size_t)snprintf(r->ckpt_new_path, sizeof(r->ckpt_new_path), "%s", path) <
                sizeof(r->ckpt_new_path))
            r->ckpt_new_step = step; /* for the link thread to upload */
        pthread_mutex_unlock(&rs->mu);
        if (step > seen)
            seen = step;
    }
    closedir(d);
    r->last_ckpt_step = seen;
}

static void on_line(struct mge_rank *r, int stream, const char *s, size_t len)
{
    struct mge_ranks *rs = r->owner;
    int kind = stream == 0 && is_json_object(s, len) ? 2 : stream;
    pthread_mutex_lock(&rs->mu);
    line_push(r, kind, s, len);
    pthread_mutex_unlock(&rs->mu);
    if (kind == 2 && mono_ms() - r->last_ckpt_scan > CKPT_SCAN_MS)
        ckpt_scan(rs, r);
}

static void maybe_finish(struct mge_rank *r);
static void on_kill_timer(uv_timer_t *t);

static void on_close(uv_handle_t *h)
{
    struct mge_rank *r = h->data;
    r->open_handles--;
    maybe_finish(r);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    buf->base = mge_malloc(suggested);
    buf->len = buf->base ? suggested : 0;
}

/* Stop reading output stream @stream (0 stdout, 1 stderr) of @r: its last partial line is kept
 * and the pipe closed. At end of file, or when a grandchild holds it open too long. */
static void pipe_close(struct mge_rank *r, int stream)
{
    uv_pipe_t *p = stream == 0 ? &r->out : &r->err;
    if (uv_is_closing((uv_handle_t *)p))
        return;
    if (r->part_len[stream]) {
        on_line(r, stream, r->part[stream], r->part_len[stream]);
        r->part_len[stream] = 0;
        notify_output(r->owner);
    }
    uv_read_stop((uv_stream_t *)p);
    uv_close((uv_handle_t *)p, on_close);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct mge_rank *r = s->data;
    int stream = s == (uv_stream_t *)&r->out ? 0 : 1;
    if (n > 0) {
        const char *p = buf->base, *end = buf->base + n;
        while (p < end) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t take = nl ? (size_t)(nl - p) : (size_t)(end - p);
            char *np = mge_realloc(r->part[stream], r->part_len[stream] + take + 1);
            if (np) {
                r->part[stream] = np;
                memcpy(np + r->part_len[stream], p, take);
                r->part_len[stream] += take;
            }
            if (nl || r->part_len[stream] >= LINE_MAX_BYTES) {
                size_t len = r->part_len[stream];
                if (len && r->part[stream][len - 1] == '\r')
                    len--;
                on_line(r, stream, r->part[stream] ? r->part[stream] : "", len);
                r->part_len[stream] = 0;
            }
            p += take + (nl ? 1 : 0);
        }
        notify_output(r->owner);
    } else if (n < 0) {
        pipe_close(r, stream);
    }
    mge_free(buf->base);
}

static int rm_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if ((type == FTW_DP ? rmdir(path) : unlink(path)) != 0 && errno != ENOENT)
        mge_log_warn("removing '%s': %s", path, strerror(errno));
    return 0;
}

/* Remove the rank's private MPI temp directory with whatever Open MPI left in it (its
 * session directory survives a killed mpirun or orted). */
static void mpi_tmp_remove(struct mge_rank *r)
{
    if (!r->mpi_tmp[0])
        return;
    nftw(r->mpi_tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    r->mpi_tmp[0] = '\0';
}

/*
 * Make the private TMPDIR of rank @r's mpirun or orted. Open MPI puts its session directory
 * (/tmp/ompi.HOST.UID/jf.FAMILY/...) under TMPDIR: every orted of a job family on one host
 * shares that tree and whichever exits first removes it, so a daemon of the next attempt
 * starting meanwhile fails to create its own ("mkdir ... No such file or directory", exit
 * 213) and the job fails for nothing of its own. A directory per rank ends the sharing.
 * It is short (under TMPDIR, not the work dir): Open MPI puts Unix sockets in it.
 */
static int mpi_tmp_make(struct mge_rank *r, char *why, size_t why_len)
{
    const char *base = getenv("TMPDIR");
    int n;
    if (!base || !*base || base[0] != '/')
        base = "/tmp";
    n = snprintf(r->mpi_tmp, sizeof(r->mpi_tmp), "%s/mge-mpi.XXXXXX", base);
    if (n < 0 || (size_t)n >= sizeof(r->mpi_tmp) || !mkdtemp(r->mpi_tmp)) {
        snprintf(why, why_len, "cannot create a temporary directory under '%.300s': %s", base,
                 n < 0 || (size_t)n >= sizeof(r->mpi_tmp) ? "name too long" : strerror(errno));
        r->mpi_tmp[0] = '\0';
        return MGE_IO;
    }
    return MGE_OK;
}

/* The rank has ended when its process is gone and both pipes are closed. */
static void maybe_finish(struct mge_rank *r)
{
    struct mge_ranks *rs = r->owner;
    if (!r->proc_exited || r->open_handles > 1 || r->closing)
        return;
    /* only the kill timer is left */
    ckpt_scan(rs, r);
    mpi_tmp_remove(r);
    r->closing = true;
    uv_close((uv_handle_t *)&r->kill_timer, on_close);
    pthread_mutex_lock(&rs->mu);
    if (r->pid > 0) {
        char line[128];
        int n = r->term_signal
                    ? snprintf(line, sizeof(line), "mge-worker: rank %d: killed by signal %d",
                               r->rank, r->term_signal)
                    : snprintf(line, sizeof(line), "mge-worker: rank %d: exited with code %d",
                               r->rank, r->exit_code);
        line_push(r, 1, line, (size_t)n);
    }
    r->state = MGE_RANK_EXITED;
    pthread_mutex_unlock(&rs->mu);
    mge_log_info("job %lld rank %d: exited (code %d, signal %d)", (long long)r->job_id, r->rank,
                 r->exit_code, r->term_signal);
    notify_output(rs);
}

static void on_exit_cb(uv_process_t *p, int64_t status, int sig)
{
    struct mge_rank *r = p->data;
    struct mge_ranks *rs = r->owner;
    pthread_mutex_lock(&rs->mu);
    r->exit_code = (int)status;
    r->term_signal = sig;
    pthread_mutex_unlock(&rs->mu);
    r->proc_exited = true;
    uv_close((uv_handle_t *)p, on_close);
    /* a grandchild may hold the pipes open: give it a moment, then end it and close them
     * (this replaces a pending SIGKILL of a cancel: the process it was for is gone) */
    uv_timer_start(&r->kill_timer, on_kill_timer, PIPE_DRAIN_MS, 0);
}

static void on_kill_timer(uv_timer_t *t)
{
    struct mge_rank *r = t->data;
    if (r->pid > 0)
        kill(-r->pid, SIGKILL); /* the rank's group: mpirun's or orted's children, a stray job */
    if (!r->proc_exited)
        return; /* on_exit_cb comes next and starts the drain */
    if (!uv_is_closing((uv_handle_t *)&r->out) || !uv_is_closing((uv_handle_t *)&r->err))
        mge_log_warn("job %lld rank %d: output still open %d ms after the process exited: "
                     "killed its process group and closed it",
                     (long long)r->job_id, r->rank, PIPE_DRAIN_MS);
    pipe_close(r, 0);
    pipe_close(r, 1);
}

/* End @r before it started, for a reason of the job's (bad spec, data path refused). mu held. */
static void fail_rank(struct mge_ranks *rs, struct mge_rank *r, const char *why)
{
    snprintf(r->failure, sizeof(r->failure), "%.250s", why);
    r->state = MGE_RANK_EXITED;
    r->exit_code = 2;
    line_push(r, 1, why, strlen(why));
    mge_log_warn("job %lld rank %d: %s", (long long)r->job_id, r->rank, why);
    mpi_tmp_remove(r);
    (void)rs;
}

/* End @r before it started, for a reason of this worker's (disk full, cannot spawn): the
 * coordinator runs the job again elsewhere instead of failing it. mu held. */
static void fault_rank(struct mge_ranks *rs, struct mge_rank *r, const char *why)
{
    fail_rank(rs, r, why);
    r->exit_code = 1;
    r->worker_fault = true;
}

/* strerror(@e) as our messages start: lowercase ("no space left on device"). */
static void errno_text(int e, char *buf, size_t len)
{
    snprintf(buf, len, "%s", strerror(e));
    if (buf[0] >= 'A' && buf[0] <= 'Z' && !(buf[1] >= 'A' && buf[1] <= 'Z'))
        buf[0] = (char)(buf[0] - 'A' + 'a');
}

/*
 * Write @len bytes of @data to a new file @path (replaced if it exists), checking every write
 * and the close. On failure @why says what failed, what was written and errno's text:
 * "no space left on device writing spec '/w/job-3/attempt-1/rank-0/spec.yaml'".
 */
static int file_write_all(const char *path, const char *what, const char *data, size_t len,
                          char *why, size_t why_len)
{
    char e[128];
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        errno_text(errno, e, sizeof(e));
        snprintf(why, why_len, "%s creating %s '%.300s'", e, what, path);
        return MGE_IO;
    }
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            errno_text(n < 0 ? errno : EIO, e, sizeof(e));
            snprintf(why, why_len, "%s writing %s '%.300s'", e, what, path);
            close(fd);
            return MGE_IO;
        }
        data += n;
        len -= (size_t)n;
    }
    if (close(fd) != 0) { /* NFS and some disks report a full disk only here */
        errno_text(errno, e, sizeof(e));
        snprintf(why, why_len, "%s writing %s '%.300s'", e, what, path);
        return MGE_IO;
    }
    return MGE_OK;
}

/* The worker's data roots; without --data-root, none: every data file is refused. */
static const struct mge_data_roots *roots_of(const struct mge_ranks_opts *opts)
{
    static const struct mge_data_roots none;
    return opts->data_roots ? opts->data_roots : &none;
}

/* The data-roots check of mge_ranks_data_paths_ok() on a parsed spec. */
static bool data_paths_check(const struct mge_ranks_opts *opts, const struct mge_jobspec *spec,
                             char *why, size_t why_len)
{
    const char *paths[5 + MGE_SPEC_MAX_DATA_FILES];
    int n = 0;
    paths[n++] = spec->data.train_images;
    paths[n++] = spec->data.train_labels;
    paths[n++] = spec->data.test_images;
    paths[n++] = spec->data.test_labels;
    paths[n++] = spec->data.test_file;
    for (int i = 0; i < spec->data.n_train_files; i++)
        paths[n++] = spec->data.train_files[i];
    for (int i = 0; i < n; i++) {
        int fd;
        if (!paths[i] || !*paths[i])
            continue;
        if (mge_data_open(roots_of(opts), paths[i], &fd, why, why_len) != MGE_OK)
            return false;
        close(fd);
    }
    return true;
}

static int spec_parse(const char *spec_yaml, struct mge_jobspec **out, char *why, size_t why_len)
{
    struct mge_spec_error err;
    int rc = mge_jobspec_parse("<assign>", spec_yaml, strlen(spec_yaml), NULL, 0, out, &err);
    if (rc != MGE_OK)
        snprintf(why, why_len, "invalid spec: %.400s", err.message);
    return rc;
}

bool mge_ranks_data_paths_ok(const struct mge_ranks_opts *opts, const char *spec_yaml, char *why,
                             size_t why_len)
{
    struct mge_jobspec *spec = NULL;
    bool ok;
    if (spec_parse(spec_yaml, &spec, why, why_len) != MGE_OK)
        return false;
    ok = data_paths_check(opts, spec, why, why_len);
    mge_jobspec_free(spec);
    return ok;
}

static int mkdirs(const char *path)
{
    char tmp[1024];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* How a rank's process is started. */
enum spawn_mode {
    SPAWN_TRAIN,   /* single-rank attempt: mge-train itself */
    SPAWN_MPIRUN,  /* rank 0 of a multi-rank attempt: mpirun, which starts every rank */
    SPAWN_ORTED,   /* rank k > 0: the orted command mge-launch handed us */
};

static enum spawn_mode spawn_mode_of(const struct mge_rank *r)
{
    if (r->world <= 1)
        return SPAWN_TRAIN;
    return r->rank == 0 ? SPAWN_MPIRUN : SPAWN_ORTED;
}

/* A rank > 0 of a multi-rank attempt starts only when mge-launch has handed its command. */
static bool ready_to_spawn(const struct mge_rank *r)
{
    if (r->cancel_requested)
        return true;
    if (r->fetch_wanted) /* the coordinator's copy of its checkpoint comes first */
        return false;
    return spawn_mode_of(r) != SPAWN_ORTED || r->command;
}

/* A host name mpirun accepts in --host and our launch map can carry. */
static bool host_name_ok(const char *s)
{
    if (!*s || strlen(s) > 200)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '-' || *s == '_' || *s == '.'))
            return false;
    return true;
}

struct strv {              /* a growing NULL-terminated string vector; owns nothing */
    char **v;
    size_t n, cap;
    bool oom;
};

static void strv_push(struct strv *a, const char *s)
{
    if (mge_array_grow((void **)&a->v, &a->cap, a->n + 2, sizeof(*a->v)) != MGE_OK) {
        a->oom = true;
        return;
    }
    a->v[a->n++] = (char *)s;
    a->v[a->n] = NULL;
}

/* Strings the argv/env of one spawn point into; freed after uv_spawn() copied them. */
struct spawn_bufs {
    char spec_path[1100], map_path[1100], threads[16], np[16], worker_pid[16];
    char env_job[64], env_rank[64], env_world[64], env_attempt[64], env_omp[64];
    char env_cuda[300];
    char *env_spec, *env_map, *env_token, *env_roots, *env_tmp, *hosts;
};

static void spawn_bufs_free(struct spawn_bufs *b)
{
    mge_free(b->env_spec);
    mge_free(b->env_map);
    mge_free(b->env_token);
    mge_free(b->env_roots);
    mge_free(b->env_tmp);
    mge_free(b->hosts);
}

/* "@name=@value" as a new string (mge_free), NULL on OOM. */
static char *env_pair(const char *name, const char *value)
{
    size_t n = strlen(name), v = strlen(value);
    char *s = mge_malloc(n + v + 2);
    if (s) {
        memcpy(s, name, n);
        s[n] = '=';
        memcpy(s + n + 1, value, v + 1);
    }
    return s;
}

/* "MGE_DATA_ROOTS=DIR:DIR..." of this worker's roots (empty: none), NULL on OOM. */
static char *roots_env(const struct mge_ranks_opts *opts)
{
    char *list = mge_data_roots_join(roots_of(opts));
    char *e = list ? env_pair(MGE_DATA_ROOTS_ENV, list) : NULL;
    mge_free(list);
    return e;
}

/* "mge-launch --guard WORKER_PID": the group of what follows dies with this worker. */
static void guard_push(struct mge_ranks *rs, struct spawn_bufs *b, struct strv *a)
{
    snprintf(b->worker_pid, sizeof(b->worker_pid), "%ld", (long)getpid());
    strv_push(a, rs->opts.launch_bin);
    strv_push(a, "--guard");
    strv_push(a, b->worker_pid);
}

/*
 * On a worker with GPUs, the rank's CUDA_VISIBLE_DEVICES into @b->env_cuda: the devices the
 * scheduler gave it, none ("") for a rank without GPUs, so that it cannot take another's.
 * Whether it is set (the worker's own value is then not passed on).
 */
static bool cuda_env(const struct mge_ranks *rs, const struct mge_rank *r, struct spawn_bufs *b)
{
    char v[256];
    if (rs->opts.gpus <= 0 && !r->gpu_ids[0])
        return false;
    mge_gpus_visible(r->gpu_ids, getenv("CUDA_VISIBLE_DEVICES"), v, sizeof(v));
    snprintf(b->env_cuda, sizeof(b->env_cuda), "CUDA_VISIBLE_DEVICES=%s", v);
    return true;
}

/* Environment variables a rank's process gets from us, not from the worker's environment. */
static bool env_ours(const char *e)
{
    static const char *const names[] = {
        "OMP_NUM_THREADS=", "MGE_JOB_ID=",    "MGE_RANK=",           "MGE_WORLD_SIZE=",
        "MGE_ATTEMPT=",     "MGE_SPEC_YAML=", "MGE_LAUNCH_MAP=",     "MGE_LAUNCH_TOKEN=",
        "OMPI_COMM_WORLD",  "TMPDIR=",        MGE_DATA_ROOTS_ENV "="};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strncmp(e, names[i], strlen(names[i])))
            return true;
    return false;
}

/*
 * mpirun's launch map: "NAME RANK URL CERT" per line, which mge-launch reads to find the worker
 * of the host mpirun asks it to start a daemon on. CERT is the file holding the certificate
 * that worker's tls+tcp:// launch socket must show (written beside the map), or "-". mu held.
 */
static int write_launch_map(const struct mge_rank *r, const char *path, char *why, size_t why_len)
{
    char *text = NULL, cert_path[1200];
    size_t len = 0;
    int rc = MGE_OK;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        snprintf(why, why_len, "out of memory");
        return MGE_NOMEM;
    }
    for (size_t i = 0; i < r->n_peers && rc == MGE_OK; i++) {
        const struct mge_peer *p = &r->peers[i];
        snprintf(cert_path, sizeof(cert_path), "-");
        if (p->launch_cert && *p->launch_cert) {
            snprintf(cert_path, sizeof(cert_path), "%s.rank%d.pem", path, p->rank);
            rc = file_write_all(cert_path, "launch certificate", p->launch_cert,
                                strlen(p->launch_cert), why, why_len);
        }
        fprintf(f, "%s %d %s %s\n", p->name, p->rank,
                p->launch_url && *p->launch_url ? p->launch_url : "-", cert_path);
    }
    if (fclose(f) != 0 || !text) {
        free(text);
        snprintf(why, why_len, "out of memory");
        return MGE_NOMEM;
    }
    if (rc == MGE_OK)
        rc = file_write_all(path, "launch map", text, len, why, why_len);
    free(text); /* open_memstream's buffer comes from malloc, not mge_malloc */
    return rc;
}

/* mpirun's argv for rank 0 of a multi-rank attempt. mu held. */
static int mpirun_args(struct mge_ranks *rs, struct mge_rank *r, struct spawn_bufs *b,
                       struct strv *a, char *why, size_t why_len)
{
    size_t len = 0;
    if (!rs->opts.mpirun_bin || !rs->opts.launch_bin) {
        snprintf(why, why_len, "this worker cannot run multi-rank jobs: %s not found",
                 !rs->opts.mpirun_bin ? "Open MPI's mpirun" : "mge-launch");
        return MGE_UNSUPPORTED;
    }
    if ((int)r->n_peers != r->world) {
        snprintf(why, why_len, "assign of rank 0 names %zu workers for %d ranks", r->n_peers,
                 r->world);
        return MGE_PROTO;
    }
    for (size_t i = 0; i < r->n_peers; i++) {
        if (r->peers[i].rank != (int)i || !host_name_ok(r->peers[i].name)) {
            snprintf(why, why_len, "worker name '%.100s' (rank %d) cannot be an MPI host name: "
                     "use letters, digits, '-', '_' and '.'", r->peers[i].name, r->peers[i].rank);
            return MGE_INVAL;
        }
        len += strlen(r->peers[i].name) + 4;
    }
    /* rank 0 runs here under mpirun itself: "localhost" is the name Open MPI takes as local */
    b->hosts = mge_malloc(len + 16);
    if (!b->hosts)
        return MGE_NOMEM;
    strcpy(b->hosts, "localhost:1");
    for (size_t i = 1; i < r->n_peers; i++) {
        strcat(b->hosts, ",");
        strcat(b->hosts, r->peers[i].name);
        strcat(b->hosts, ":1");
    }
    snprintf(b->np, sizeof(b->np), "%d", r->world);
    guard_push(rs, b, a);
    strv_push(a, rs->opts.mpirun_bin);
    /* orted stays in the session the worker gave it (no --daemonize): the worker watches it */
    strv_push(a, "--leave-session-attached");
    strv_push(a, "--bind-to");
    strv_push(a, "none");
    strv_push(a, "-np");
    strv_push(a, b->np);
    strv_push(a, "--host");
    strv_push(a, b->hosts);
    strv_push(a, "--mca");
    strv_push(a, "plm_rsh_agent");
    strv_push(a, rs->opts.launch_bin);
    strv_push(a, "--mca");
    strv_push(a, "plm_rsh_no_tree_spawn");
    strv_push(a, "1");
    /* no hwloc topology in shared memory: orted maps it at the "biggest" hole of its address
     * space, which collided with the stack once in ~10 starts here (SIGSEGV in
     * hwloc_shmem_topology_write, the rank exits 139 and the job fails as if it crashed) */
    strv_push(a, "--mca");
    strv_push(a, "rtc_hwloc_vmhole");
    strv_push(a, "none");
    /* a rank waiting in a collective yields its core: each host has one slot, so Open MPI
     * would spin (it yields only when it sees more ranks than slots), and a spinning rank
     * starves its own compute thread (resources.cpus may be 1) and any neighbour; over TCP
     * between namespaces on 2 busy cores, spinning made a step 250 ms instead of 10 ms */
    strv_push(a, "--mca");
    strv_push(a, "mpi_yield_when_idle");
    strv_push(a, "1");
    if (rs->opts.mpi_if && *rs->opts.mpi_if) {
        strv_push(a, "--mca");
        strv_push(a, "oob_tcp_if_include");
        strv_push(a, rs->opts.mpi_if);
        strv_push(a, "--mca");
        strv_push(a, "btl_tcp_if_include");
        strv_push(a, rs->opts.mpi_if);
    }
    if (geteuid() == 0)
        strv_push(a, "--allow-run-as-root");
    strv_push(a, rs->opts.train_bin);
    /* no spec path is valid on every node: each worker puts the spec in its ranks' env */
    strv_push(a, "env:MGE_SPEC_YAML");
    return MGE_OK;
}

/* Start rank @r. mu held. */
static void spawn_rank(struct mge_ranks *rs, struct mge_rank *r)
{
    uv_process_options_t po;
    uv_stdio_container_t stdio[3];
    struct mge_jobspec *spec = NULL;
    struct spawn_bufs b;
    struct strv args = {0}, env = {0};
    enum spawn_mode mode = spawn_mode_of(r);
    char why[512];
    const char *resume_from = NULL, *what;
    int rv, cpus;
    bool paths_ok, cuda_set;

    memset(&b, 0, sizeof(b));
    r->spawned = true;
    if (r->cancel_requested) {
        fail_rank(rs, r, "cancelled before start");
        return;
    }
    if (spec_parse(r->spec_yaml, &spec, why, sizeof(why)) != MGE_OK) {
        fail_rank(rs, r, why);
        return;
    }
    paths_ok = data_paths_check(&rs->opts, spec, why, sizeof(why));
    cpus = spec->resources.cpus > 0 ? spec->resources.cpus : 1;
    mge_jobspec_free(spec);
    if (!paths_ok) {
        fail_rank(rs, r, why);
        return;
    }
    snprintf(r->out_dir, sizeof(r->out_dir), "%s/job-%lld/attempt-%d/rank-%d", rs->opts.work_dir,
             (long long)r->job_id, r->attempt, r->rank);
    snprintf(b.spec_path, sizeof(b.spec_path), "%s/spec.yaml", r->out_dir);
    if (mkdirs(r->out_dir) != 0) {
        char e[128];
        errno_text(errno, e, sizeof(e));
        snprintf(why, sizeof(why), "%s creating the rank's directory '%.300s'", e, r->out_dir);
        fault_rank(rs, r, why);
        return;
    }
    if (file_write_all(b.spec_path, "spec", r->spec_yaml, strlen(r->spec_yaml), why,
                       sizeof(why)) != MGE_OK) {
        fault_rank(rs, r, why);
        return;
    }
    snprintf(b.threads, sizeof(b.threads), "%d", cpus);

    if (mode == SPAWN_ORTED) {
        if (!rs->opts.launch_bin) {
            fault_rank(rs, r, "this worker cannot run multi-rank jobs: mge-launch not found");
            goto out_free;
        }
        guard_push(rs, &b, &args);
        strv_push(&args, "/bin/sh");
        strv_push(&args, "-c");
        strv_push(&args, r->command);
    } else {
        if (mode == SPAWN_MPIRUN) {
            snprintf(b.map_path, sizeof(b.map_path), "%s/launch-map", r->out_dir);
            if (write_launch_map(r, b.map_path, why, sizeof(why)) != MGE_OK) {
                fault_rank(rs, r, why);
                goto out_free;
            }
            if ((rv = mpirun_args(rs, r, &b, &args, why, sizeof(why))) != MGE_OK) {
                /* no mpirun here is this worker's; a bad gang from the coordinator is not */
                if (rv == MGE_UNSUPPORTED || rv == MGE_NOMEM)
                    fault_rank(rs, r, why);
                else
                    fail_rank(rs, r, why);
                goto out_free;
            }
        } else {
            strv_push(&args, rs->opts.train_bin);
            strv_push(&args, b.spec_path);
        }
        strv_push(&args, "--out");
        strv_push(&args, r->out_dir);
        strv_push(&args, "--json");
        /* the rank gets the cores the scheduler reserved for it, not every core of the node */
        strv_push(&args, "--threads");
        strv_push(&args, b.threads);
        if (r->resume && *r->resume && access(r->resume, R_OK) == 0) {
            strv_push(&args, "--resume");
            strv_push(&args, r->resume);
            resume_from = r->resume;
        } else if (r->resume && *r->resume) {
            /* the checkpoint lies on a node this one cannot see: say so in the job's log */
            snprintf(why, sizeof(why),
                     "mge-worker: checkpoint '%.300s' is not readable here (%s): "
                     "starting from the beginning",
                     r->resume, strerror(errno));
            line_push(r, 1, why, strlen(why));
            mge_log_warn("job %lld rank %d: %s", (long long)r->job_id, r->rank, why);
        }
    }

    /* OpenMP and BLAS threads follow OMP_NUM_THREADS: ours replaces the worker's own */
    cuda_set = cuda_env(rs, r, &b);
    for (char **e = environ; *e; e++)
        if ((!env_ours(*e) || (mode == SPAWN_TRAIN && !strncmp(*e, "TMPDIR=", 7))) &&
            !(cuda_set && !strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21)))
            strv_push(&env, *e);
    if (cuda_set) {
        strv_push(&env, b.env_cuda);
        /* the job's log says which devices it got (the ranks mpirun or orted start here
         * inherit them) */
        snprintf(why, sizeof(why), "mge-worker: rank %d gets GPU index(es) '%s': %.200s", r->rank,
                 r->gpu_ids, b.env_cuda);
        line_push(r, 1, why, strlen(why));
        mge_log_info("job %lld attempt %d rank %d: %s", (long long)r->job_id, r->attempt, r->rank,
                     b.env_cuda);
    }
    snprintf(b.env_job, sizeof(b.env_job), "MGE_JOB_ID=%lld", (long long)r->job_id);
    snprintf(b.env_attempt, sizeof(b.env_attempt), "MGE_ATTEMPT=%d", r->attempt);
    snprintf(b.env_omp, sizeof(b.env_omp), "OMP_NUM_THREADS=%d", cpus);
    strv_push(&env, b.env_job);
    strv_push(&env, b.env_attempt);
    strv_push(&env, b.env_omp);
    /* mge-train checks its data files against our roots where it opens them (and so do the
     * ranks mpirun or orted start here, which inherit it) */
    if ((b.env_roots = roots_env(&rs->opts)))
        strv_push(&env, b.env_roots);
    else
        env.oom = true;
    if (mode == SPAWN_TRAIN) {
        snprintf(b.env_rank, sizeof(b.env_rank), "MGE_RANK=%d", r->rank);
        snprintf(b.env_world, sizeof(b.env_world), "MGE_WORLD_SIZE=%d", r->world);
        strv_push(&env, b.env_rank);
        strv_push(&env, b.env_world);
    } else {
        /* the ranks mpirun or orted start inherit these */
        b.env_spec = env_pair("MGE_SPEC_YAML", r->spec_yaml);
        strv_push(&env, b.env_spec);
        if (mode == SPAWN_MPIRUN) {
            b.env_map = env_pair("MGE_LAUNCH_MAP", b.map_path);
            b.env_token = env_pair("MGE_LAUNCH_TOKEN", r->launch_token);
            strv_push(&env, b.env_map);
            strv_push(&env, b.env_token);
        }
        if (mpi_tmp_make(r, why, sizeof(why)) != MGE_OK) {
            fault_rank(rs, r, why);
            goto out_free;
        }
        b.env_tmp = env_pair("TMPDIR", r->mpi_tmp);
        strv_push(&env, b.env_tmp);
        if (geteuid() == 0) { /* Open MPI refuses root without both */
            strv_push(&env, "OMPI_ALLOW_RUN_AS_ROOT=1");
            strv_push(&env, "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
        }
        if (!b.env_spec || !b.env_tmp || (mode == SPAWN_MPIRUN && (!b.env_map || !b.env_token)))
            args.oom = true;
    }
    if (args.oom || env.oom) {
        fault_rank(rs, r, "out of memory");
        goto out_free;
    }

    uv_pipe_init(rs->loop, &r->out, 0);
    uv_pipe_init(rs->loop, &r->err, 0);
    uv_timer_init(rs->loop, &r->kill_timer);
    r->out.data = r->err.data = r->kill_timer.data = r->proc.data = r;
    r->open_handles = 4; /* proc, out, err, kill_timer */
    memset(&po, 0, sizeof(po));
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)&r->out;
    stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[2].data.stream = (uv_stream_t *)&r->err;
    po.file = args.v[0];
    po.args = args.v;
    po.env = env.v;
    po.cwd = r->out_dir;
    po.stdio = stdio;
    po.stdio_count = 3;
    po.exit_cb = on_exit_cb;
    po.flags = UV_PROCESS_DETACHED; /* setsid(): its own process group, killed as a group */
    rv = uv_spawn(rs->loop, &r->proc, &po);
    if (rv != 0) {
        snprintf(why, sizeof(why), "cannot start '%s': %s", args.v[0], uv_strerror(rv));
        /* the process handle must be closed even when spawn failed */
        r->proc_exited = true;
        uv_close((uv_handle_t *)&r->proc, on_close);
        uv_close((uv_handle_t *)&r->out, on_close);
        uv_close((uv_handle_t *)&r->err, on_close);
        r->exit_code = 127;
        r->worker_fault = true; /* this worker's binary or limits, not the job's */
        snprintf(r->failure, sizeof(r->failure), "%.250s", why);
        line_push(r, 1, why, strlen(why));
        goto out_free; /* maybe_finish marks it exited once the handles are closed */
    }
    r->pid = r->proc.pid;
    r->state = MGE_RANK_RUNNING;
    /* say in the job's log how the rank was started: mge-train --json prints no text */
    what = mode == SPAWN_TRAIN    ? rs->opts.train_bin
           : mode == SPAWN_MPIRUN ? "mpirun (every rank, launch agent mge-launch)"
                                  : "the MPI daemon mge-launch handed over";
    rv = snprintf(why, sizeof(why),
                  "mge-worker: rank %d/%d attempt %d: started %.200s as pid %d, "
                  "%d threads%s%.200s",
                  r->rank, r->world, r->attempt, what, r->pid, cpus,
                  resume_from ? ", resuming from " : "", resume_from ? resume_from : "");
    line_push(r, 1, why, rv > 0 ? strlen(why) : 0);
    uv_read_start((uv_stream_t *)&r->out, on_alloc, on_read);
    uv_read_start((uv_stream_t *)&r->err, on_alloc, on_read);
    mge_log_info("job %lld attempt %d rank %d/%d: started pid %d", (long long)r->job_id,
                 r->attempt, r->rank, r->world, r->pid);
out_free:
    mge_free(args.v);
    mge_free(env.v);
    spawn_bufs_free(&b);
}

static void rank_free(struct mge_rank *r)
{
    mpi_tmp_remove(r);
    for (size_t i = 0; i < r->n_lines; i++)
        mge_free(r->lines[i].text);
    mge_free(r->lines);
    mge_free(r->part[0]);
    mge_free(r->part[1]);
    mge_free(r->spec_yaml);
    mge_free(r->resume);
    mge_free(r->resume_copy);
    mge_free(r->launch_token);
    mge_free(r->command);
    for (size_t i = 0; i < r->n_peers; i++) {
        mge_free(r->peers[i].name);
        mge_free(r->peers[i].launch_url);
        mge_free(r->peers[i].launch_cert);
    }
    mge_free(r->peers);
    mge_free(r);
}

static void on_async(uv_async_t *a)
{
    struct mge_ranks *rs = a->data;
    bool changed = false;
    pthread_mutex_lock(&rs->mu);
    for (size_t i = 0; i < rs->n; i++) {
        struct mge_rank *r = rs->r[i];
        if (!r->spawned && !rs->stopping && ready_to_spawn(r)) {
            spawn_rank(rs, r);
            changed = true;
        }
        if (r->cancel_requested && r->state == MGE_RANK_RUNNING && !r->killed && r->pid > 0 &&
            !r->proc_exited) {
            r->killed = true;
            kill(-r->pid, SIGTERM);
            uv_timer_start(&r->kill_timer, on_kill_timer,
                           (uint64_t)(r->grace_ms > 0 ? r->grace_ms : 5000), 0);
            mge_log_info("job %lld rank %d: cancelled, SIGTERM to group %d", (long long)r->job_id,
                         r->rank, r->pid);
        }
        /* the process alone, not its group: mpirun's rsh agents there would die of it */
        if (r->ckpt_requested && r->state == MGE_RANK_RUNNING && !r->killed && r->pid > 0 &&
            !r->proc_exited) {
            r->ckpt_requested = false;
            kill(r->pid, SIGUSR2);
            mge_log_info("job %lld attempt %d rank %d: checkpoint asked for, SIGUSR2 to %d",
                         (long long)r->job_id, r->attempt, r->rank, r->pid);
        }
    }
    /* forget ranks whose end and output the coordinator has stored */
    for (size_t i = 0; i < rs->n;) {
        struct mge_rank *r = rs->r[i];
        if (r->state == MGE_RANK_EXITED && r->exit_acked && r->n_lines == 0 &&
            r->open_handles == 0) {
            rank_free(r);
            rs->r[i] = rs->r[--rs->n];
            continue;
        }
        i++;
    }
    pthread_mutex_unlock(&rs->mu);
    if (changed)
        notify_output(rs);
}

int mge_ranks_init(struct mge_ranks *rs, uv_loop_t *loop, const struct mge_ranks_opts *opts)
{
    memset(rs, 0, sizeof(*rs));
    rs->loop = loop;
    rs->opts = *opts;
    pthread_mutex_init(&rs->mu, NULL);
    rs->async.data = rs;
    if (uv_async_init(loop, &rs->async, on_async) != 0)
        return MGE_ERR(MGE_INTERNAL, "cannot init the async handle");
    return MGE_OK;
}

void mge_ranks_stop(struct mge_ranks *rs)
{
    pthread_mutex_lock(&rs->mu);
    rs->stopping = true;
    for (size_t i = 0; i < rs->n; i++)
        if (rs->r[i]->pid > 0 && !rs->r[i]->proc_exited)
            kill(-rs->r[i]->pid, SIGKILL);
    pthread_mutex_unlock(&rs->mu);
    uv_close((uv_handle_t *)&rs->async, NULL);
}

void mge_ranks_fini(struct mge_ranks *rs)
{
    for (size_t i = 0; i < rs->n; i++)
        rank_free(rs->r[i]);
    mge_free(rs->r);
    pthread_mutex_destroy(&rs->mu);
}

void mge_ranks_wake(struct mge_ranks *rs) { uv_async_send(&rs->async); }

static struct mge_rank *rank0_find(struct mge_ranks *rs, int64_t job_id, int attempt)
{
    for (size_t i = 0; i < rs->n; i++)
        if (rs->r[i]->job_id == job_id && rs->r[i]->attempt == attempt && rs->r[i]->rank == 0)
            return rs->r[i];
    return NULL;
}

bool mge_ranks_upload_next(struct mge_ranks *rs, struct mge_ckpt_ref *out)
{
    bool found = false;
    pthread_mutex_lock(&rs->mu);
    for (size_t i = 0; i < rs->n && !found; i++) {
        struct mge_rank *r = rs->r[i];
        const char *base = strrchr(r->ckpt_new_path, '/');
        if (r->rank != 0 || r->ckpt_new_step <= r->ckpt_up_step || !base)
            continue;
        out->job_id = r->job_id;
        out->attempt = r->attempt;
        out->step = r->ckpt_new_step;
        snprintf(out->name, sizeof(out->name), "%.39s", base + 1);
        snprintf(out->path, sizeof(out->path), "%s", r->ckpt_new_path);
        found = true;
    }
    pthread_mutex_unlock(&rs->mu);
    return found;
}

void mge_ranks_upload_done(struct mge_ranks *rs, int64_t job_id, int attempt, int64_t step)
{
    pthread_mutex_lock(&rs->mu);
    struct mge_rank *r = rank0_find(rs, job_id, attempt);
    if (r && step > r->ckpt_up_step)
        r->ckpt_up_step = step;
    pthread_mutex_unlock(&rs->mu);
}

bool mge_ranks_fetch_next(struct mge_ranks *rs, struct mge_ckpt_ref *out)
{
    bool found = false;
    pthread_mutex_lock(&rs->mu);
    for (size_t i = 0; i < rs->n && !found; i++) {
        struct mge_rank *r = rs->r[i];
        if (!r->fetch_wanted || r->cancel_requested)
            continue;
        out->job_id = r->job_id;
        out->attempt = r->attempt;
        out->step = 0;
        snprintf(out->name, sizeof(out->name), "%.39s", r->resume_copy);
        snprintf(out->path, sizeof(out->path), "%s/job-%lld/attempt-%d/rank-0", rs->opts.work_dir,
                 (long long)r->job_id, r->attempt);
        if (mkdirs(out->path) != 0) {
            char e[128], why[1400];
            errno_text(errno, e, sizeof(e));
            snprintf(why, sizeof(why),
                     "mge-worker: %s creating '%.1000s' for checkpoint %s: "
                     "starting from the beginning",
                     e, out->path, out->name);
            line_push(r, 1, why, strlen(why));
            r->fetch_wanted = false;
            continue;
        }
        found = true;
    }
    pthread_mutex_unlock(&rs->mu);
    return found;
}

void mge_ranks_fetch_done(struct mge_ranks *rs, int64_t job_id, int attempt, const char *path,
                          const char *why)
{
    char line[1600];
    pthread_mutex_lock(&rs->mu);
    struct mge_rank *r = rank0_find(rs, job_id, attempt);
    if (r && r->fetch_wanted) {
        char *p = path ? mge_strdup(path) : NULL;
        if (p) {
            long long step = 0;
            mge_free(r->resume);
            r->resume = p;
            /* the copy lies in the rank's directory now: it is not a new checkpoint to upload */
            if (sscanf(r->resume_copy, "ckpt-%lld", &step) == 1 && step > r->ckpt_up_step)
                r->ckpt_up_step = step;
            snprintf(line, sizeof(line),
                     "mge-worker: rank 0 attempt %d: checkpoint %s fetched from the "
                     "coordinator's store into %.1000s",
                     attempt, r->resume_copy, path);
        } else {
            snprintf(line, sizeof(line),
                     "mge-worker: rank 0 attempt %d: cannot fetch checkpoint %s from the "
                     "coordinator's store: %.1000s",
                     attempt, r->resume_copy,
                     path  ? "out of memory"
                     : why ? why
                           : "unknown");
        }
        line_push(r, 1, line, strlen(line));
        mge_log_info("job %lld: %s", (long long)job_id, line + 12);
        r->fetch_wanted = false;
    }
    pthread_mutex_unlock(&rs->mu);
    notify_output(rs);
    mge_ranks_wake(rs);
}

int mge_ranks_assign(struct mge_ranks *rs, const struct mge_rank_assign *a)
{
    struct mge_rank *r;
    int rc = MGE_OK;
    pthread_mutex_lock(&rs->mu);
    for (size_t i = 0; i < rs->n; i++)
        if (rs->r[i]->job_id == a->job_id && rs->r[i]->attempt == a->attempt &&
            rs->r[i]->rank == a->rank)
            goto out_unlock; /* a repeated assign: already ours */
    if ((rc = mge_array_grow((void **)&rs->r, &rs->cap, rs->n + 1, sizeof(*rs->r))) != MGE_OK)
        goto out_unlock;
    r = mge_calloc(1, sizeof(*r));
    if (!r) {
        rc = MGE_NOMEM;
        goto out_unlock;
    }
    r->job_id = a->job_id;
    r->attempt = a->attempt;
    r->rank = a->rank;
    r->world = a->world;
    snprintf(r->gpu_ids, sizeof(r->gpu_ids), "%s", a->gpu_ids ? a->gpu_ids : "");
    r->spec_yaml = mge_strdup(a->spec_yaml ? a->spec_yaml : "");
    r->resume = a->resume && *a->resume ? mge_strdup(a->resume) : NULL;
    r->launch_token = mge_strdup(a->launch_token ? a->launch_token : "");
    bool oom = !r->spec_yaml || !r->launch_token || (a->resume && *a->resume && !r->resume);
    /* rank 0 that cannot read the checkpoint it resumes (it was on a lost node) fetches the
     * coordinator's copy first */
    if (a->rank == 0 && a->resume_copy && *a->resume_copy &&
        (!r->resume || access(r->resume, R_OK) != 0)) {
        r->resume_copy = mge_strdup(a->resume_copy);
        r->fetch_wanted = r->resume_copy != NULL;
        oom |= !r->resume_copy;
    }
    r->peers = a->n_peers ? mge_calloc(a->n_peers, sizeof(*r->peers)) : NULL;
    oom |= a->n_peers && !r->peers;
    for (size_t i = 0; r->peers && i < a->n_peers; i++) {
        r->peers[i].rank = a->peers[i].rank;
        r->peers[i].name = mge_strdup(a->peers[i].name ? a->peers[i].name : "");
        r->peers[i].launch_url = mge_strdup(a->peers[i].launch_url ? a->peers[i].launch_url : "");
        r->peers[i].launch_cert =
            mge_strdup(a->peers[i].launch_cert ? a->peers[i].launch_cert : "");
        r->n_peers = i + 1;
        oom |= !r->peers[i].name || !r->peers[i].launch_url || !r->peers[i].launch_cert;
    }
    r->state = MGE_RANK_STARTING;
    r->owner = rs;
    if (oom) {
        rank_free(r);
        rc = MGE_NOMEM;
        goto out_unlock;
    }
    rs->r[rs->n++] = r;
out_unlock:
    pthread_mutex_unlock(&rs->mu);
    return rc;
}

int mge_ranks_launch(struct mge_ranks *rs, int64_t job_id, int attempt, int rank,
                     const char *token, const char *command, char *why, size_t why_len)
{
    struct mge_rank *r = NULL;
    int rc = MGE_OK;
    pthread_mutex_lock(&rs->mu);
    for (size_t i = 0; i < rs->n && !r; i++)
        if (rs->r[i]->job_id == job_id && rs->r[i]->attempt == attempt && rs->r[i]->rank == rank)
            r = rs->r[i];
    if (!r || spawn_mode_of(r) != SPAWN_ORTED) {
        snprintf(why, why_len, "job %lld attempt %d has no rank %d waiting for a launch here",
                 (long long)job_id, attempt, rank);
        rc = MGE_NOENT;
    } else if (!token || !r->launch_token || !*r->launch_token ||
               !mge_ct_equal(r->launch_token, strlen(r->launch_token), token, strlen(token))) {
        snprintf(why, why_len, "wrong launch token for job %lld attempt %d", (long long)job_id,
                 attempt);
        rc = MGE_AUTH;
    } else if (r->command || r->spawned || r->cancel_requested || r->state != MGE_RANK_STARTING) {
        snprintf(why, why_len, "rank %d of job %lld attempt %d was launched, cancelled or ended "
                 "already", rank, (long long)job_id, attempt);
        rc = MGE_STATE;
    } else if (!mge_ranks_data_paths_ok(&rs->opts, r->spec_yaml, why, why_len)) {
        rc = MGE_INVAL;
    } else if (!(r->command = mge_strdup(command ? command : ""))) {
        snprintf(why, why_len, "out of memory");
        rc = MGE_NOMEM;
    }
    pthread_mutex_unlock(&rs->mu);
    if (rc == MGE_OK)
        mge_ranks_wake(rs);
    return rc;
}

void mge_ranks_cancel(struct mge_ranks *rs, int64_t job_id, int attempt, int grace_ms)
{
    pthread_mutex_lock(&rs->mu);
    for (size_t i = 0; i < rs->n; i++)
        if (rs->r[i]->job_id == job_id && (attempt == 0 || rs->r[i]->attempt == attempt)) {
            rs->r[i]->cancel_requested = true;
            rs->r[i]->grace_ms = grace_ms;
        }
    pthread_mutex_unlock(&rs->mu);
}

void mge_ranks_checkpoint(struct mge_ranks *rs, int64_t job_id, int attempt)
{
    pthread_mutex_lock(&rs->mu);
    for (size_t i = 0; i < rs->n; i++)
        if (rs->r[i]->job_id == job_id && rs->r[i]->attempt == attempt && rs->r[i]->rank == 0)
            rs->r[i]->ckpt_requested = true;
    pthread_mutex_unlock(&rs->mu);
}

void mge_ranks_ack(struct mge_ranks *rs, int64_t job_id, int attempt, int rank, uint64_t seq,
                   bool exit_acked)
{
    pthread_mutex_lock(&rs->mu);
    for (size_t i = 0; i < rs->n; i++) {
        struct mge_rank *r = rs->r[i];
        size_t k = 0;
        if (r->job_id != job_id || r->attempt != attempt || r->rank != rank)
            continue;
        while (k < r->n_lines && r->lines[k].seq <= seq)
            mge_free(r->lines[k++].text);
        if (k) {
            memmove(r->lines, r->lines + k, (r->n_lines - k) * sizeof(*r->lines));
            r->n_lines -= k;
        }
        if (exit_acked && r->state == MGE_RANK_EXITED)
            r->exit_acked = true;
    }
    pthread_mutex_unlock(&rs->mu);
}
