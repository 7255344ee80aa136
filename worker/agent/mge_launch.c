/*
 * mge-launch: Open MPI's launch agent (plm_rsh_agent) for multi-rank jobs. mpirun, started
 * by rank 0's worker, calls "mge-launch HOST COMMAND..." once per other host instead of ssh;
 * mge-launch finds HOST's worker in the attempt's launch map and hands it COMMAND (mpirun's
 * orted command line), which that worker starts and watches as the rank's process. It returns
 * as soon as the worker has taken the command: mpirun follows its daemons over its own TCP
 * connection.
 *
 * Environment (set by the worker for mpirun, inherited from it): MGE_LAUNCH_MAP (a file of
 * "NAME RANK URL CERT" lines), MGE_LAUNCH_TOKEN, MGE_JOB_ID, MGE_ATTEMPT. A tls+tcp:// URL is
 * dialled trusting only the certificate in the file CERT (the one that worker registered with
 * the coordinator: worker/launch.h), for the name "mge-launch".
 * Exit: 0 started, 1 refused or unreachable, 2 usage (messages on stderr, which mpirun shows).
 *
 * "mge-launch --guard WORKER_PID PROGRAM [ARG...]" is how the worker starts mpirun and the
 * daemons: it runs PROGRAM in its own process group (the one the worker made) and, when the
 * worker dies, kills that whole group at once. A parent-death signal on PROGRAM alone would
 * not do: mpirun's daemon command is a shell line whose orted is a grandchild, and a lone
 * orted keeps its ranks (and the job) alive. The ranks set their own parent-death signal.
 */
#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "proto/worker.pb-c.h"

#define LAUNCH_TIMEOUT_MS 15000
#define LAUNCH_TLS_NAME "mge-launch" /* MGE_LAUNCH_TLS_NAME of worker/launch.h */
#define CERT_MAX 8192
#define UNKNOWN_TRIES 25    /* "no such rank here" is asked again this many times, */
#define UNKNOWN_WAIT_MS 200 /* this far apart: 5 s for a late Assign */

static const char *env_or_die(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        fprintf(stderr, "mge-launch: %s is not set: mge-launch runs as mpirun's launch agent "
                        "under mge-worker\n", name);
        exit(2);
    }
    return v;
}

/* Find @host in the launch map at @path: its rank, URL (into @url) and certificate file (into
 * @cert, "-" for none). 0 on success. */
static int map_lookup(const char *path, const char *host, int *rank, char *url, size_t url_len,
                      char *cert, size_t cert_len)
{
    char line[2048], name[256], u[512], c[1200];
    FILE *f = fopen(path, "r");
    int found = -1;
    if (!f) {
        fprintf(stderr, "mge-launch: cannot read launch map '%s'\n", path);
        return -1;
    }
    while (found < 0 && fgets(line, sizeof(line), f)) {
        int r, n;
        snprintf(c, sizeof(c), "-"); /* a map of "NAME RANK URL" lines: no certificates */
        n = sscanf(line, "%255s %d %511s %1199s", name, &r, u, c);
        if (n >= 3 && !strcmp(name, host)) {
            *rank = r;
            snprintf(url, url_len, "%s", u);
            snprintf(cert, cert_len, "%s", c);
            found = 0;
        }
    }
    fclose(f);
    if (found < 0)
        fprintf(stderr, "mge-launch: host '%s' is not a worker of this job (map '%s')\n", host,
                path);
    return found;
}

/*
 * Dial @url from @sock; a tls+tcp:// one trusting only the certificate in the file @cert_path
 * for LAUNCH_TLS_NAME. Returns NNG's code, or NNG_EINVAL (with a message) when the file is
 * missing or unreadable.
 */
static int launch_dial(nng_socket sock, const char *url, const char *cert_path)
{
    nng_dialer d;
    nng_tls_config *tls = NULL;
    char *pem = NULL;
    size_t n = 0;
    FILE *f;
    int rv;
    if (strncmp(url, "tls+tcp://", 10) != 0)
        return nng_dial(sock, url, NULL, 0);
    if (!strcmp(cert_path, "-") || !(f = fopen(cert_path, "r"))) {
        fprintf(stderr, "mge-launch: no certificate for the tls+tcp:// launch socket %s (%s)\n",
                url, cert_path);
        return NNG_EINVAL;
    }
    pem = mge_malloc(CERT_MAX);
    if (pem)
        n = fread(pem, 1, CERT_MAX - 1, f);
    fclose(f);
    if (!pem)
        return NNG_ENOMEM;
    pem[n] = '\0';
    if ((rv = nng_dialer_create(&d, sock, url)) == 0 &&
        (rv = nng_tls_config_alloc(&tls, NNG_TLS_MODE_CLIENT)) == 0 &&
        (rv = nng_tls_config_ca_chain(tls, pem, NULL)) == 0 &&
        (rv = nng_tls_config_auth_mode(tls, NNG_TLS_AUTH_MODE_REQUIRED)) == 0 &&
        (rv = nng_tls_config_server_name(tls, LAUNCH_TLS_NAME)) == 0 &&
        (rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, tls)) == 0)
        rv = nng_dialer_start(d, 0);
    if (tls)
        nng_tls_config_free(tls); /* the dialer holds its own reference */
    mge_free(pem);
    return rv;
}

static void on_parent_death(int sig)
{
    (void)sig;
    kill(0, SIGKILL); /* the whole process group, this process included */
}

static volatile pid_t g_guarded; /* --guard: PROGRAM's pid, once forked */

/* SIGUSR2 (the coordinator's "checkpoint now") goes on to PROGRAM, i.e. mpirun, which passes
 * it to every rank; the group is not signalled, as the rsh agents in it would die of it. */
static void on_forward(int sig)
{
    if (g_guarded > 0)
        kill(g_guarded, sig);
}

/* --guard: see the top of the file. Returns PROGRAM's exit status (or dies of its signal). */
static int guard(int argc, char **argv)
{
    struct sigaction sa;
    pid_t child, parent;
    int status;
    if (argc < 4) {
        fprintf(stderr, "usage: mge-launch --guard WORKER_PID PROGRAM [ARG...]\n");
        return 2;
    }
    parent = (pid_t)atol(argv[2]);
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_parent_death;
    sigaction(SIGUSR1, &sa, NULL);
    prctl(PR_SET_PDEATHSIG, SIGUSR1);
    if (getppid() != parent) /* the worker died before the line above */
        on_parent_death(SIGUSR1);
    /* a cancel's SIGTERM goes to the whole group: PROGRAM handles it, we wait for PROGRAM */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    sa.sa_handler = on_forward;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR2, &sa, NULL);
    child = fork();
    if (child < 0) {
        perror("mge-launch: fork");
        return 1;
    }
    if (child == 0) {
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        execvp(argv[3], argv + 3);
        fprintf(stderr, "mge-launch: cannot run '%s': %s\n", argv[3], strerror(errno));
        _exit(127);
    }
    g_guarded = child;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR)
            return 1;
    if (WIFSIGNALED(status)) {
        signal(WTERMSIG(status), SIG_DFL);
        kill(getpid(), WTERMSIG(status));
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(int argc, char **argv)
{
    Mge__LaunchRequest req = MGE__LAUNCH_REQUEST__INIT;
    Mge__LaunchReply *rep;
    nng_socket sock;
    nng_msg *m = NULL;
    char url[512], cert[1200], *cmd;
    size_t len = 0, off = 0;
    uint8_t *buf;
    int rank = -1, rv, code = 1;

    if (argc > 1 && !strcmp(argv[1], "--guard"))
        return guard(argc, argv);
    if (argc < 3) {
        fprintf(stderr, "usage: mge-launch HOST COMMAND...  (Open MPI's plm_rsh_agent)\n"
                        "       mge-launch --guard WORKER_PID PROGRAM [ARG...]\n");
        return 2;
    }
    if (map_lookup(env_or_die("MGE_LAUNCH_MAP"), argv[1], &rank, url, sizeof(url), cert,
                   sizeof(cert)) != 0)
        return 1;
    for (int i = 2; i < argc; i++)
        len += strlen(argv[i]) + 1;
    cmd = mge_malloc(len + 1);
    if (!cmd)
        return 1;
    for (int i = 2; i < argc; i++) { /* mpirun quotes inside its words: sh -c reads them */
        size_t n = strlen(argv[i]);
        memcpy(cmd + off, argv[i], n);
        off += n;
        cmd[off++] = i + 1 < argc ? ' ' : '\0';
    }
    req.job_id = strtoll(env_or_die("MGE_JOB_ID"), NULL, 10);
    req.attempt = atoi(env_or_die("MGE_ATTEMPT"));
    req.rank = rank;
    req.token = (char *)env_or_die("MGE_LAUNCH_TOKEN");
    req.command = cmd;
    len = mge__launch_request__get_packed_size(&req);
    buf = mge_malloc(len ? len : 1);
    if (!buf)
        goto out_cmd;
    mge__launch_request__pack(&req, buf);
    if ((rv = nng_req0_open(&sock)) != 0) {
        fprintf(stderr, "mge-launch: %s\n", nng_strerror(rv));
        goto out_buf;
    }
    nng_socket_set_ms(sock, NNG_OPT_SENDTIMEO, LAUNCH_TIMEOUT_MS);
    nng_socket_set_ms(sock, NNG_OPT_RECVTIMEO, LAUNCH_TIMEOUT_MS);
    if ((rv = launch_dial(sock, url, cert)) != 0) {
        fprintf(stderr, "mge-launch: worker '%s' at %s: %s\n", argv[1], url, nng_strerror(rv));
        goto out_close;
    }
    /* a worker that holds no such rank yet may not have its Assign yet (rank 0's worker got
     * its own first): it fetches its commands when asked, so ask again for a while */
    for (int tries = 0;; tries++) {
        bool again;
        if ((rv = nng_send(sock, buf, len, 0)) != 0 || (rv = nng_recvmsg(sock, &m, 0)) != 0) {
            fprintf(stderr, "mge-launch: worker '%s' at %s: %s\n", argv[1], url, nng_strerror(rv));
            goto out_close;
        }
        rep = mge__launch_reply__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
        again = rep && !rep->ok && rep->unknown_rank && tries < UNKNOWN_TRIES;
        if (!rep) {
            fprintf(stderr, "mge-launch: worker '%s' at %s: malformed reply\n", argv[1], url);
        } else if (rep->ok) {
            code = 0;
        } else if (!again) {
            fprintf(stderr, "mge-launch: worker '%s' refused rank %d: %s\n", argv[1], rank,
                    rep->error);
        }
        mge__launch_reply__free_unpacked(rep, NULL);
        nng_msg_free(m);
        if (!again)
            break;
        nanosleep(&(struct timespec){0, UNKNOWN_WAIT_MS * 1000000L}, NULL);
    }
out_close:
    nng_close(sock);
out_buf:
    mge_free(buf);
out_cmd:
    mge_free(cmd);
    return code;
}
