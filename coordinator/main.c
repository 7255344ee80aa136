/* main.c: mge-coordinator: flags and config file, then store, scheduler, worker link, HTTP. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "auth.h"
#include "http_api.h"
#include "rpc.h"
#include "sched.h"
#include "store.h"

#define MGE_VERSION "0.1.0"

struct config {
    char *listen, *worker_listen, *state_dir, *token_file, *join_token_file, *ports_file;
    char *web_root;
    int worker_timeout_s, heartbeat_ms, http_threads, cancel_grace_ms;
    int progress_timeout_s, startup_timeout_s; /* the watchdog; 0: off */
};

static void usage(FILE *f)
{
    fprintf(f,
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
            "  --http-threads N              HTTP thread pool size (default 4)\n"
            "  --ports-file FILE             write the bound addresses there once listening\n"
            "  --web-root DIR                dashboard files served at / (default: ../web next\n"
            "                                to this binary, i.e. build/web in a build tree)\n"
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
        if (!config_set(c, k, v)) {
            fprintf(stderr, "%s:%d: unknown key '%s'\n", path, lineno, k);
            fclose(f);
            return -1;
        }
    }
    fclose(f);
    return 0;
}

/* The default web root: DIR/../web for the binary DIR/mge-coordinator; NULL if unknown. */
static char *default_web_root(void)
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
    out = mge_malloc(strlen(exe) + 8);
    if (out)
        sprintf(out, "%s/../web", exe);
    return out;
}

int main(int argc, char **argv)
{
    struct config c = {.progress_timeout_s = 10, .startup_timeout_s = 300};
    struct mge_store *st = NULL;
    struct mge_sched *sched = NULL;
    struct mge_rpc *rpc = NULL;
    struct mge_http *http = NULL;
    struct mge_auth *auth = NULL;
    char *join = NULL, host[128] = "127.0.0.1";
    struct mge_sched_opts so = {0};
    struct mge_rpc_opts ro = {0};
    struct mge_http_opts ho = {0};
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

    if (mge_auth_load(c.token_file, &auth) != MGE_OK) {
        fprintf(stderr, "mge-coordinator: cannot load tokens from '%s'\n", c.token_file);
        goto out;
    }
    if (mge_auth_read_secret(c.join_token_file, &join) != MGE_OK) {
        fprintf(stderr, "mge-coordinator: cannot read join token '%s'\n", c.join_token_file);
        goto out;
    }
    rc = mge_store_open(c.state_dir ? c.state_dir : "mge-state", &st);
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-coordinator: cannot open the store: %s\n", mge_strerror(rc));
        goto out;
    }
    ro.listen_url = c.worker_listen ? c.worker_listen : "tcp://127.0.0.1:7070";
    ro.join_token = join;
    ro.heartbeat_ms = c.heartbeat_ms;
    rc = mge_rpc_new(&ro, st, &rpc);
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-coordinator: cannot listen for workers on %s\n", ro.listen_url);
        goto out;
    }
    so.worker_timeout_ms = c.worker_timeout_s > 0 ? c.worker_timeout_s * 1000 : 10000;
    so.cancel_grace_ms = c.cancel_grace_ms;
    so.progress_timeout_ms = c.progress_timeout_s > 0 ? c.progress_timeout_s * 1000 : -1;
    so.startup_timeout_ms = c.startup_timeout_s > 0 ? c.startup_timeout_s * 1000 : -1;
    so.notify = mge_rpc_notify;
    so.notify_arg = rpc;
    rc = mge_sched_new(st, &so, &sched);
    if (rc != MGE_OK)
        goto out;
    rc = mge_rpc_start(rpc, sched);
    if (rc != MGE_OK)
        goto out;
    ho.host = host;
    ho.port = port;
    ho.threads = c.http_threads;
    if (!c.web_root)
        c.web_root = default_web_root();
    ho.web_root = c.web_root;
    rc = mge_http_start(&ho, st, sched, auth, rpc, &http);
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-coordinator: cannot listen on %s:%d\n", host, port);
        goto out;
    }
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
    return exit_code;
}
