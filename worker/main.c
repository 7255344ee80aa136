/* main.c: mge-worker: flags, slots (CPU, memory, GPUs: gpus.h), the libuv loop and the link. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "common/alloc.h"
#include "common/dataroot.h"
#include "common/err.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "common/parse.h"
#include "gpus.h"
#include "launch.h"
#include "link.h"
#include "ranks.h"

#define MGE_VERSION "0.1.0"

static struct mge_link *g_link;
static struct mge_launch *g_launch;
static struct mge_ranks g_ranks;
static uv_signal_t g_sigint, g_sigterm;

static void usage(FILE *f)
{
    fprintf(f, "usage: mge-worker --coordinator tcp://HOST:PORT --join-token-file FILE --name NAME\n"
               "                  [--cpus N] [--memory-mb N] [--data-root DIR]... [--work-dir DIR]\n"
               "                  [--train-bin PATH] [--heartbeat-ms MS] [--launch-listen URL]\n"
               "                  [--mpirun PATH] [--mpi-if CIDR] [--cacert FILE]\n"
               "  --coordinator URL tcp://HOST:PORT, or tls+tcp://HOST:PORT when the coordinator\n"
               "                    serves its worker link with TLS (needs --cacert)\n"
               "  --cacert FILE     the CA (PEM) the tls+tcp:// coordinator's certificate must\n"
               "                    verify against, for HOST as its name\n"
               "  --data-root DIR   data paths in job specs must lie under one of these (repeatable);\n"
               "                    with none, jobs that name data files are refused\n"
               "  --train-bin PATH  the training binary (default: mge-train next to mge-worker)\n"
               "  --work-dir DIR    job output directories (default ./mge-worker-NAME)\n"
               "  --launch-listen URL  where mge-launch reaches this worker to start the ranks of\n"
               "                    multi-worker jobs (default: the address this host reaches\n"
               "                    the coordinator from, any port; 127.0.0.1 when the\n"
               "                    coordinator is on loopback)\n"
               "  --mpirun PATH     Open MPI's mpirun (default: mpirun.openmpi or mpirun on PATH)\n"
               "  --mpi-if CIDR     network the jobs' MPI traffic uses (Open MPI's\n"
               "                    oob_tcp_if_include and btl_tcp_if_include)\n");
    fputs("GPUs: every device the CUDA runtime (libcudart, loaded at run time) sees; each\n"
          "rank gets the ones the coordinator gave it as CUDA_VISIBLE_DEVICES. Test hook:\n"
          "MGE_FAKE_GPUS=\"2x NAME:MIB[,1x NAME:MIB]\" advertises those GPUs instead\n"
          "(docs/operations.md, GPU workers).\n",
          f);
}

/* @name as an executable: a path as it is, else the first match on PATH (into @out). */
static const char *find_exe(const char *name, char *out, size_t len)
{
    const char *path = getenv("PATH");
    if (strchr(name, '/'))
        return access(name, X_OK) == 0 ? name : NULL;
    while (path && *path) {
        const char *end = strchr(path, ':');
        size_t n = end ? (size_t)(end - path) : strlen(path);
        snprintf(out, len, "%.*s/%s", (int)n, path, name);
        if (n && access(out, X_OK) == 0)
            return out;
        path = end ? end + 1 : NULL;
    }
    return NULL;
}

/*
 * --cpus N (1..MGE_CPUS_MAX; what this worker offers, which is also the most threads a rank gets),
 * --memory-mb N (>= 1) or --heartbeat-ms N (50..60000) into its variable; false, with a
 * message, if @v is not such an integer ("2x" or "0" would otherwise become 2 or "all").
 */
static bool number_flag(const char *flag, const char *v, int *cpus, long long *memory_mb,
                        int *hb_ms)
{
    long long n, lo = 1, hi = MGE_CPUS_MAX;
    if (!strcmp(flag, "--memory-mb"))
        hi = (long long)1 << 40;
    else if (!strcmp(flag, "--heartbeat-ms"))
        lo = 50, hi = 60000;
    if (!mge_parse_int(v, lo, hi, &n)) {
        fprintf(stderr, "mge-worker: %s: expected an integer between %lld and %lld, got '%s'\n",
                flag, lo, hi, v);
        return false;
    }
    if (!strcmp(flag, "--cpus"))
        *cpus = (int)n;
    else if (!strcmp(flag, "--memory-mb"))
        *memory_mb = n;
    else
        *hb_ms = (int)n;
    return true;
}

static void on_signal(uv_signal_t *s, int sig)
{
    (void)s;
    mge_log_info("signal %d: stopping", sig);
    mge_launch_stop(g_launch); /* first: its thread may kick the link */
    g_launch = NULL;
    mge_link_stop(g_link);
    g_link = NULL;
    mge_ranks_stop(&g_ranks);
    uv_close((uv_handle_t *)&g_sigint, NULL);
    uv_close((uv_handle_t *)&g_sigterm, NULL);
}

int main(int argc, char **argv)
{
    const char *coordinator = NULL, *join_file = NULL, *name = NULL, *work_dir = NULL;
    const char *cacert = NULL;
    const char *train_bin = NULL, *launch_listen = NULL, *mpirun = NULL;
    const char *mpi_if = NULL;
    char mpirun_found[PATH_MAX], launch_bin[PATH_MAX + 16], launch_url[300], launch_default[300];
    static char launch_cert[MGE_LAUNCH_CERT_MAX];
    struct mge_data_roots roots = {0};
    int cpus = 0, hb_ms = 0, rc;
    long long memory_mb = 0;
    char exe[PATH_MAX], train_default[PATH_MAX + 16], work_default[PATH_MAX], work_real[PATH_MAX];
    char host[256] = "localhost", join[1024] = "";
    static struct mge_gpu gpus[MGE_GPUS_MAX];
    char gpu_source[64], gpu_why[256];
    int n_gpus = 0;
    struct mge_ranks_opts ro;
    struct mge_link_opts lo;
    uv_loop_t *loop = uv_default_loop();
    FILE *f;

    mge_log_set_tag("worker");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--version")) {
            printf("mge-worker %s\n", MGE_VERSION);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "mge-worker: '%s' needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--coordinator"))
            coordinator = v;
        else if (!strcmp(a, "--join-token-file"))
            join_file = v;
        else if (!strcmp(a, "--name"))
            name = v;
        else if (!strcmp(a, "--cpus") || !strcmp(a, "--memory-mb") ||
                 !strcmp(a, "--heartbeat-ms")) {
            if (!number_flag(a, v, &cpus, &memory_mb, &hb_ms))
                return 2;
        }
        else if (!strcmp(a, "--work-dir"))
            work_dir = v;
        else if (!strcmp(a, "--train-bin"))
            train_bin = v;
        else if (!strcmp(a, "--launch-listen"))
            launch_listen = v;
        else if (!strcmp(a, "--mpirun"))
            mpirun = v;
        else if (!strcmp(a, "--mpi-if"))
            mpi_if = v;
        else if (!strcmp(a, "--cacert"))
            cacert = v;
        else if (!strcmp(a, "--data-root")) {
            char err[PATH_MAX + 128];
            if (mge_data_roots_add(&roots, v, err, sizeof(err)) != MGE_OK) {
                fprintf(stderr, "mge-worker: bad --data-root: %s\n", err);
                return 2;
            }
        } else {
            fprintf(stderr, "mge-worker: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!coordinator || !join_file || !name) {
        usage(stderr);
        return 2;
    }
    f = fopen(join_file, "r");
    if (!f || !fgets(join, sizeof(join), f)) {
        fprintf(stderr, "mge-worker: cannot read join token '%s'\n", join_file);
        if (f)
            fclose(f);
        return 2;
    }
    fclose(f);
    join[strcspn(join, "\r\n")] = '\0';
    {
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        char *slash;
        exe[n > 0 ? n : 0] = '\0';
        slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0';
    }
    if (!train_bin) {
        snprintf(train_default, sizeof(train_default), "%s/mge-train", exe);
        train_bin = train_default;
    }
    /* multi-worker jobs: mpirun, and our launch agent (and process guard) next to us */
    if (mpirun) {
        if (access(mpirun, X_OK) != 0) {
            fprintf(stderr, "mge-worker: --mpirun '%s' is not executable\n", mpirun);
            return 2;
        }
    } else if (!(mpirun = find_exe("mpirun.openmpi", mpirun_found, sizeof(mpirun_found)))) {
        mpirun = find_exe("mpirun", mpirun_found, sizeof(mpirun_found));
    }
    snprintf(launch_bin, sizeof(launch_bin), "%s/mge-launch", exe);
    if (!work_dir) {
        snprintf(work_default, sizeof(work_default), "mge-worker-%s", name);
        work_dir = work_default;
    }
    if (mkdir(work_dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "mge-worker: cannot create '%s': %s\n", work_dir, strerror(errno));
        return 1;
    }
    if (!realpath(work_dir, work_real)) {
        fprintf(stderr, "mge-worker: bad work dir '%s'\n", work_dir);
        return 1;
    }
    gethostname(host, sizeof(host) - 1);
    if (cpus <= 0)
        cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (memory_mb <= 0)
        memory_mb = (long long)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE) / (1024 * 1024);
    if (mge_gpus_detect(gpus, &n_gpus, gpu_source, sizeof(gpu_source), gpu_why, sizeof(gpu_why)) !=
        MGE_OK) {
        fprintf(stderr, "mge-worker: bad %s: %s\n", MGE_FAKE_GPUS_ENV, gpu_why);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);

    memset(&ro, 0, sizeof(ro));
    ro.train_bin = train_bin;
    ro.mpirun_bin = mpirun;
    ro.launch_bin = access(launch_bin, X_OK) == 0 ? launch_bin : NULL;
    ro.mpi_if = mpi_if;
    ro.work_dir = work_real;
    ro.gpus = n_gpus;
    ro.data_roots = &roots;
    rc = mge_ranks_init(&g_ranks, loop, &ro);
    if (rc != MGE_OK)
        return 1;
    if (!launch_listen) {
        mge_launch_default_url(coordinator, launch_default, sizeof(launch_default));
        launch_listen = launch_default;
    }
    rc = mge_launch_start(launch_listen, host, !strncmp(coordinator, "tls+tcp://", 10), &g_ranks,
                          launch_url, sizeof(launch_url), launch_cert, &g_launch);
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-worker: cannot open the launch socket on '%s'\n", launch_listen);
        return 1;
    }
    memset(&lo, 0, sizeof(lo));
    lo.launch_url = launch_url;
    lo.launch_cert = launch_cert;
    lo.coordinator = coordinator;
    lo.join_token = join;
    lo.name = name;
    lo.host = host;
    lo.version = MGE_VERSION;
    lo.cpus = cpus;
    lo.gpus = n_gpus;
    lo.gpu = gpus;
    lo.memory_mb = memory_mb;
    lo.heartbeat_ms = hb_ms;
    lo.cacert = cacert;
    rc = mge_link_start(&lo, &g_ranks, &g_link);
    if (rc != MGE_OK) {
        fprintf(stderr, "mge-worker: cannot reach '%s'\n", coordinator);
        return 1;
    }
    mge_launch_set_kick(g_launch, mge_link_kick, g_link);
    uv_signal_init(loop, &g_sigint);
    uv_signal_init(loop, &g_sigterm);
    uv_signal_start(&g_sigint, on_signal, SIGINT);
    uv_signal_start(&g_sigterm, on_signal, SIGTERM);
    mge_log_info("mge-worker %s '%s': %d cpus, %lld MiB, %d gpus (%s), %d data root(s), train %s",
                 MGE_VERSION, name, cpus, memory_mb, lo.gpus, gpu_source, roots.n, train_bin);
    for (int i = 0; i < n_gpus; i++)
        mge_log_info("gpu %d: %s, %lld MiB", i, gpus[i].name, (long long)gpus[i].memory_mb);
    if (!ro.mpirun_bin || !ro.launch_bin)
        mge_log_warn("multi-worker jobs will be refused here: %s not found",
                     !ro.mpirun_bin ? "Open MPI's mpirun" : launch_bin);
    uv_run(loop, UV_RUN_DEFAULT);
    mge_launch_stop(g_launch);
    mge_link_stop(g_link);
    mge_ranks_fini(&g_ranks);
    uv_loop_close(loop);
    mge_data_roots_fini(&roots);
    return 0;
}
