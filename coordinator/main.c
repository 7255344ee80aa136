/* main.c: mge-coordinator: flags and config file, then store, scheduler, worker link, HTTP. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth.h"
#include "common/alloc.h"
#include "common/dataroot.h"
#include "common/err.h"
#include "common/log.h"
#include "http_api.h"
#include "rpc.h"
#include "sched.h"
#include "store.h"
#include "tls.h"

#define MGE_VERSION "0.1.0"

struct config {
    char *listen, *worker_listen, *state_dir, *token_file, *join_token_file, *ports_file;
    char *web_root, *restore_from;
    char *plan_bin, *plan_data_root; /* the memory planner at submit ("none": off) */
    char *tls_cert, *tls_key; /* HTTPS on --listen when both are set */
    int worker_timeout_s, heartbeat_ms, http_threads, cancel_grace_ms;
    int progress_timeout_s, startup_timeout_s; /* the watchdog; 0: off */
    int grow;                                  /* 0: elastic jobs do not grow while running */
    int preempt_checkpoint_s; /* a preemption waits this long for the victim's checkpoint */
};

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: mge-coordinator [options]\n"
        "  --listen HOST:PORT            REST API address (default 127.0.0.1:8080; port 0: any)\n"
        "  --worker-listen tcp://H:P     worker link (default tcp://127.0.0.1:7070)\n"
        "  --state-dir DIR               SQLite database and state (default ./mge-state)\n"
        "  --token-file FILE             API tokens: lines 'admin TOKEN' / 'read TOKEN'\n"
        "  --join-token-file FILE        the token workers present to join\n"
        "  --config FILE                 'key = value' lines with the long option names;\n"
        "                                flags given on the command line win\n"
        "  --worker-timeout SEC          silence before a worker is lost (default 10)\n"
        "  --heartbeat-ms MS             heartbeat interval asked of workers (default 1000)\n"
        "  --cancel-grace-ms MS          SIGTERM to SIGKILL grace for ranks (default 5000)\n"
        "  --progress-timeout SEC        a running job whose steps stop for max(SEC, 5 x its\n"
        "                                median step-report interval) fails (default 10;\n"
        "                                0: off)\n"
        "  --startup-timeout SEC         ... and one with no step SEC after it was placed\n"
        "                                (default 300; 0: off)\n"
        "  --grow 0|1                    grow a running elastic job onto a free worker at\n"
        "                                its next checkpoint (default 1)\n"
        "  --preempt-checkpoint SEC      a preemption asks the job it ends for a checkpoint\n"
        "                                and waits up to SEC for it (default 30; 0: ends it\n"
        "                                at once, losing the steps since its last one)\n"
        "  --http-threads N              HTTP thread pool size (default 4)\n"
        "  --tls-cert FILE               serve the API and dashboard over HTTPS only, with\n"
        "                                this PEM certificate (chain after it); needs:\n"
        "  --tls-key FILE                its PEM private key (not readable by others)\n"
        "  --plan-bin PATH               mge-train, run as 'mge-train --plan' on each\n"
        "                                submitted job to learn its memory per rank (default:\n"
        "                                mge-train next to this binary; 'none': off)\n"
        "  --plan-data-root DIR[:DIR]    data the planner may read (default: none, so only\n"
        "                                jobs on synthetic data are planned)\n"
        "  --ports-file FILE             write the bound addresses there once listening\n"
        "  --web-root DIR                dashboard files served at / (default: ../web next\n"
        "                                to this binary, i.e. build/web in a build tree)\n"
        "  --restore-from FILE           replace the state database with this backup (checked\n"
        "                                first; the old one is kept beside it), then start\n"
        "                                (command line only; see docs/operations.md)\n"
        "  --version, --help\n");
}

/* Set option @key to @val; false if unknown. Later calls override earlier ones. */
static bool config_set(struct config *c, const char *key, const char *val)
{
    char **s = NULL;
    int *i = NULL;
    if (!strcmp(key, "listen"))
        s = &c->listen;
    else if (!strcmp(key, "worker-listen"))
        s = &c->worker_listen;
    else if (!strcmp(key, "state-dir"))
        s = &c->state_dir;
    else if (!strcmp(key, "token-file"))
        s = &c->token_file;
    else if (!strcmp(key, "join-token-file"))
        s = &c->join_token_file;
    else if (!strcmp(key, "ports-file"))
        s = &c->ports_file;
    else if (!strcmp(key, "web-root"))
        s = &c->web_root;
    else if (!strcmp(key, "plan-bin"))
        s = &c->plan_bin;
    else if (!strcmp(key, "plan-data-root"))
        s = &c->plan_data_root;
    else if (!strcmp(key, "restore-from"))
        s = &c->restore_from;
    else if (!strcmp(key, "tls-cert"))
        s = &c->tls_cert;
    else if (!strcmp(key, "tls-key"))
        s = &c->tls_key;
    else if (!strcmp(key, "worker-timeout"))
        i = &c->worker_timeout_s;
    else if (!strcmp(key, "heartbeat-ms"))
        i = &c->heartbeat_ms;
    else if (!strcmp(key, "http-threads"))
        i = &c->http_threads;
    else if (!strcmp(key, "cancel-grace-ms"))
        i = &c->cancel_grace_ms;
    else if (!strcmp(key, "progress-timeout"))
        i = &c->progress_timeout_s;
    else if (!strcmp(key, "startup-timeout"))
        i = &c->startup_timeout_s;
    else if (!strcmp(key, "grow"))
        i = &c->grow;
    else if (!strcmp(key, "preempt-checkpoint"))
        i = &c->preempt_checkpoint_s;
    else
        return false;
    if (s) {
        mge_free(*s);
        *s = mge_strdup(val);
    } else {
        *i = atoi(val);
    }
    return true;
}

static int config_file(struct config *c, const char *path)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    int lineno = 0;
    if (!f) {
        fprintf(stderr, "mge-coordinator: cannot open config '%s': %s\n", path, strerror(errno));
        return -1;
    }
    while (fgets(line, sizeof(line), f)) {
        char *k = line, *eq, *v, *e;
        lineno++;
        while (*k == ' ' || *k == '\t')
            k++;
        if (*k == '#' || *k == '\n' || !*k)
            continue;
        eq = strchr(k, '=');
        if (!eq) {
            fprintf(stderr, "%s:%d: expected 'key = value'\n", path, lineno);
            fclose(f);
            return -1;
        }
        for (e = eq; e > k && (e[-1] == ' ' || e[-1] == '\t'); e--)
            ;
        *e = '\0';
        v = eq + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        for (e = v + strlen(v); e > v && (e[-1] == '\n' || e[-1] == ' ' || e[-1] == '\r'); e--)
            ;
        *e = '\0';
        if (!strcmp(k, "restore-from")) { /* a one-off act, not a setting */
            fprintf(stderr, "%s:%d: 'restore-from' is a command-line flag only\n", path, lineno);
            fclose(f);
            return -1;
        }
        if (!config_set(c, k, v)) {
            fprintf(stderr, "%s:%d: unknown key '%s'\n", path, lineno, k);
            fclose(f);
            return -1;
        }
    }
    fclose(f);
    return 0;
}

/*
 * Take the exclusive lock on state directory @dir (created if missing): an fcntl write lock on
 * @dir/mge.lock, held until the process exits (the descriptor is never closed; an exit or a
 * kill -9 releases it). The file holds our pid for people; the holder's pid in the refusal comes
 * from the lock itself (F_GETLK). Returns 0, or -1 after printing why.
 */
static int state_dir_lock(const char *dir)
{
    char path[4200], pid[32];
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    struct stat sb;
    int fd, n;

    if (mkdir(dir, 0700) != 0 && (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
        fprintf(stderr, "mge-coordinator: cannot create state directory '%s': %s\n", dir,
                strerror(errno));
        return -1;
    }
    snprintf(path, sizeof(path), "%s/mge.lock", dir);
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "mge-coordinator: cannot open lock file '%s': %s\n", path,
                strerror(errno));
        return -1;
    }
    if (fcntl(fd, F_SETLK, &fl) != 0) {
        int err = errno;
        struct flock who = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        if (err == EACCES || err == EAGAIN) {
            if (fcntl(fd, F_GETLK, &who) == 0 && who.l_type != F_UNLCK)
                fprintf(stderr,
                        "mge-coordinator: state directory '%s' is in use by another "
                        "coordinator (pid %ld holds '%s'); refusing to start: two coordinators "
                        "on one state would both schedule its jobs. Stop that one first, or "
                        "give this one another --state-dir\n",
                        dir, (long)who.l_pid, path);
            else
                fprintf(stderr, "mge-coordinator: state directory '%s' is in use by another "
                        "coordinator (lock '%s' is held); refusing to start\n", dir, path);
        } else {
            fprintf(stderr, "mge-coordinator: cannot lock '%s': %s\n", path, strerror(err));
        }
        close(fd);
        return -1;
    }
    n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
        mge_log_warn("cannot write our pid into '%s': %s", path, strerror(errno));
    return 0; /* fd stays open: closing it would release the lock */
}

/* DIR/@rel for the binary DIR/mge-coordinator, as a new string; NULL if unknown. */
static char *beside_exe(const char *rel)
{
    char exe[4096], *slash, *out;
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return NULL;
    exe[n] = '\0';
    slash = strrchr(exe, '/');
    if (!slash)
        return NULL;
    *slash = '\0';
    out = mge_malloc(strlen(exe) + strlen(rel) + 2);
    if (out)
        sprintf(out, "%s/%s", exe, rel);
    return out;
}

/*
 * The planner's settings from --plan-bin and --plan-data-root into @po (strings borrowed from
 * @c and @roots_out, which the caller frees); false, with a message, if they are unusable.
 */
static bool planner_setup(struct config *c, struct mge_data_roots *roots, char **roots_out,
                          struct mge_planner_opts *po)
{
    char err[512];
    bool dflt = !c->plan_bin;
    if (dflt)
        c->plan_bin = beside_exe("mge-train");
    if (!c->plan_bin || !strcmp(c->plan_bin, "none") || !*c->plan_bin) {
        mge_log_info("jobs are not planned at submit (--plan-bin none): placed by their slots");
        return true;
    }
    if (access(c->plan_bin, X_OK) != 0) {
        if (dflt) { /* a coordinator installed without the engine */
            mge_log_warn("no planner at '%s': jobs are placed by their slots", c->plan_bin);
            return true;
        }
        fprintf(stderr, "mge-coordinator: --plan-bin '%s': %s\n", c->plan_bin, strerror(errno));
        return false;
    }
    if (c->plan_data_root &&
        mge_data_roots_parse(roots, c->plan_data_root, err, sizeof(err)) != MGE_OK) {
        fprintf(stderr, "mge-coordinator: --plan-data-root: %s\n", err);
        return false;
    }
    if (!(*roots_out = mge_data_roots_join(roots)))
        return false;
    po->bin = c->plan_bin;
    po->data_roots = *roots_out;
    return true;
}

int main(int argc, char **argv)
{
    struct config c = {
        .progress_timeout_s = 10, .startup_timeout_s = 300, .grow = 1, .preempt_checkpoint_s = 30};
    struct mge_store *st = NULL;
    struct mge_sched *sched = NULL;
    struct mge_rpc *rpc = NULL;
    struct mge_http *http = NULL;
    struct mge_auth *auth = NULL;
    char *join = NULL, host[128] = "127.0.0.1";
    struct mge_sched_opts so = {0};
    struct mge_rpc_opts ro = {0};
    char ckpt_dir[4200], *state_abs = NULL;
    struct mge_http_opts ho = {0};
    struct mge_tls_pem pem = {0};
    struct mge_data_roots plan_roots = {0};
    char *plan_roots_list = NULL, plan_tmp[4200];
    sigset_t sigs;
    int sig, port = 8080, rc, exit_code = 1;
    const char *config = NULL;

    mge_log_set_tag("coordinator");
    /* the config file first, so that flags win */
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            config = argv[i + 1];
    if (config && config_file(&c, config) != 0)
        return 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--version")) {
            printf("mge-coordinator %s\n", MGE_VERSION);
            return 0;
        }
        if (strncmp(argv[i], "--", 2) != 0 || i + 1 >= argc) {
            fprintf(stderr, "mge-coordinator: bad argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
        if (!strcmp(argv[i], "--config")) {
            i++;
            continue;
        }
        if (!config_set(&c, argv[i] + 2, argv[i + 1])) {
            fprintf(stderr, "mge-coordinator: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
        i++;
    }
    if (!c.token_file || !c.join_token_file) {
        fprintf(stderr, "mge-coordinator: --token-file and --join-token-file are required\n");
        return 2;
    }
    if (!c.tls_cert != !c.tls_key) {
        fprintf(stderr, "mge-coordinator: --tls-cert and --tls-key go together (HTTPS needs "
                        "both; neither: plain HTTP)\n");
        return 2;
    }
    if (c.listen) {
        const char *colon = strrchr(c.listen, ':');
        size_t n = colon ? (size_t)(colon - c.listen) : 0;
        if (!colon || n == 0 || n >= sizeof(host)) {
            fprintf(stderr, "mge-coordinator: --listen wants HOST:PORT\n");
            return 2;
        }
        memcpy(host, c.listen, n);
        host[n] = '\0';
        port = atoi(colon + 1);
    }

    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL); /* threads inherit it; main waits below */
    signal(SIGPIPE, SIG_IGN);

    /* before anything listens: a bad certificate or key refuses the start, naming the file */
    if (c.tls_cert && mge_tls_pem_load(c.tls_cert, c.tls_key, &pem) != MGE_OK) {
        fprintf(stderr,
                "mge-coordinator: cannot serve HTTPS with certificate '%s' and key '%s' "
                "(the reason is logged above); refusing to start\n",
                c.tls_cert, c.tls_key);
        goto out;
    }
    if (mge_auth_load(c.token_file, &auth) != MGE_OK) {
        fprintf(stderr, "mge-coordinator: cannot load tokens from '%s'\n", c.token_file);
        goto out;
    }
    if (mge_auth_read_secret(c.join_token_file, &join) != MGE_OK) {
        fprintf(stderr, "mge-coordinator: cannot read join token '%s'\n", c.join_token_file);
        goto out;
    }
    if (!c.state_dir)
        c.state_dir = mge_strdup("mge-state");
    if (!c.state_dir || state_dir_lock(c.state_dir) != 0)
        goto out;
    if (c.restore_from && mge_store_restore(c.state_dir, c.restore_from) != MGE_OK) {
        fprintf(stderr, "mge-coordinator: cannot restore '%s' from '%s' (the reason is logged "
                "above)\n", c.state_dir, c.restore_from);
        goto out;
    }
    rc = mge_store_open(c.state_dir, &st);
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-coordinator: cannot open the store in '%s': %s (the reason is "
                "logged above); refusing to start\n", c.state_dir, mge_strerror(rc));
        goto out;
    }
    ro.listen_url = c.worker_listen ? c.worker_listen : "tcp://127.0.0.1:7070";
    ro.join_token = join;
    ro.heartbeat_ms = c.heartbeat_ms;
    ro.tls_cert = pem.cert; /* a tls+tcp:// worker link serves the same certificate */
    ro.tls_key = pem.key;
    /* the checkpoint store: absolute, since its copies are served as checkpoint paths */
    state_abs = realpath(c.state_dir, NULL);
    if (state_abs &&
        (size_t)snprintf(ckpt_dir, sizeof(ckpt_dir), "%s/checkpoints", state_abs) <
            sizeof(ckpt_dir) &&
        (mkdir(ckpt_dir, 0700) == 0 || errno == EEXIST))
        ro.ckpt_dir = ckpt_dir;
    else
        fprintf(stderr,
                "mge-coordinator: no checkpoint store under '%s' (%s): checkpoints are "
                "not replicated\n",
                c.state_dir, strerror(errno));
    /* the planner writes each spec it plans under the state directory (it is ours alone) */
    if (!state_abs ||
        (size_t)snprintf(plan_tmp, sizeof(plan_tmp), "%s/tmp", state_abs) >= sizeof(plan_tmp) ||
        (mkdir(plan_tmp, 0700) != 0 && errno != EEXIST)) {
        fprintf(stderr, "mge-coordinator: cannot create '%s/tmp': %s\n", c.state_dir,
                strerror(errno));
        free(state_abs);
        goto out;
    }
    free(state_abs);
    if (!planner_setup(&c, &plan_roots, &plan_roots_list, &ho.planner))
        goto out;
    ho.planner.tmp_dir = plan_tmp;
    rc = mge_rpc_new(&ro, st, &rpc);
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-coordinator: cannot listen for workers on %s\n", ro.listen_url);
        goto out;
    }
    so.worker_timeout_ms = c.worker_timeout_s > 0 ? c.worker_timeout_s * 1000 : 10000;
    so.cancel_grace_ms = c.cancel_grace_ms;
    so.progress_timeout_ms = c.progress_timeout_s > 0 ? c.progress_timeout_s * 1000 : -1;
    so.startup_timeout_ms = c.startup_timeout_s > 0 ? c.startup_timeout_s * 1000 : -1;
    so.no_grow = !c.grow;
    so.preempt_ckpt_ms = c.preempt_checkpoint_s > 0 ? c.preempt_checkpoint_s * 1000 : -1;
    so.notify = mge_rpc_notify;
    so.notify_arg = rpc;
    rc = mge_sched_new(st, &so, &sched);
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-coordinator: cannot load the jobs and workers from the store: %s "
                "(the reason is logged above); refusing to start rather than drop them\n",
                mge_strerror(rc));
        goto out;
    }
    ho.host = host;
    ho.port = port;
    ho.threads = c.http_threads;
    if (!c.web_root)
        c.web_root = beside_exe("../web");
    ho.web_root = c.web_root;
    ho.tls_cert = pem.cert;
    ho.tls_key = pem.key;
    rc = mge_http_start(&ho, st, sched, auth, rpc, &http);
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-coordinator: cannot listen on %s:%d\n", host, port);
        goto out;
    }
    rc = mge_rpc_start(rpc, sched);
    if (rc != MGE_OK)
        goto out;
    if (c.ports_file) {
        char tmp[4200];
        FILE *f;
        snprintf(tmp, sizeof(tmp), "%s.tmp", c.ports_file);
        f = fopen(tmp, "w");
        if (f) {
            fprintf(f, "http=%s:%d\nworker=%s\n", host, mge_http_port(http),
                    mge_rpc_listen_url(rpc));
            fclose(f);
            rename(tmp, c.ports_file);
        }
    }
    mge_log_info("mge-coordinator %s ready", MGE_VERSION);
    sigwait(&sigs, &sig);
    mge_log_info("signal %d: shutting down", sig);
    exit_code = 0;
out:
    mge_http_stop(http);
    mge_rpc_stop(rpc);     /* no more calls into the scheduler */
    mge_sched_free(sched); /* its thread may still notify through rpc */
    mge_rpc_free(rpc);
    mge_store_close(st);
    mge_auth_free(auth);
    mge_free(join);
    mge_free(c.listen);
    mge_free(c.worker_listen);
    mge_free(c.state_dir);
    mge_free(c.token_file);
    mge_free(c.join_token_file);
    mge_free(c.ports_file);
    mge_free(c.web_root);
    mge_free(c.restore_from);
    mge_free(c.tls_cert);
    mge_free(c.tls_key);
    mge_free(c.plan_bin);
    mge_free(c.plan_data_root);
    mge_free(plan_roots_list);
    mge_data_roots_fini(&plan_roots);
    mge_tls_pem_fini(&pem);
    return exit_code;
}
