/* main_train.c: mge-train, one training rank; standalone on a laptop or spawned by mge-worker. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/dataroot.h"
#include "common/err.h"
#include "common/jobspec.h"
#include "common/parse.h"
#include "engine/data.h"
#include "engine/train.h"

static void usage(FILE *fp)
{
    fprintf(fp,
            "usage: mge-train SPEC.yaml [--set key.path=value]... [--resume CKPT] [--out DIR]\n"
            "                 [--init-from FILE] [--json] [--threads N] [--profile TRACE.json]\n"
            "                 [--device cpu|sim]\n"
            "                 [--eager] [--eager-dump DIR] [--eager-max-abs X]\n"
            "       mge-train --plan SPEC.yaml [--set key.path=value]...\n"
            "       mge-train --max-batch SPEC.yaml --set memory.budget_mb=N\n"
            "\n"
            "Trains the job SPEC.yaml describes on this machine.\n"
            "  --set k=v     override a spec key (train.epochs=1, model.hidden=[256,256])\n"
            "  --resume F    continue from checkpoint F (exactly where it was written)\n"
            "  --init-from F start from the weights in F (safetensors, e.g. from mge-export or\n"
            "                PyTorch, or an mge checkpoint): fresh optimiser, step 0\n"
            "  --out DIR     checkpoint directory (default mge-out/<name>)\n"
            "  --json        stdout carries JSON lines only: steps, evaluations, a summary\n"
            "  --threads N   kernel threads, 1..4096 (default $OMP_NUM_THREADS or all cores)\n"
            "  --device D    resources.device: cpu, or sim (the simulated accelerator: arenas\n"
            "                off the host, reached only by copies; bit-identical to cpu)\n"
            "Environment: MGE_DATA_ROOTS=DIR:DIR... (set by mge-worker): data files must lie\n"
            "under one of these, checked on the file opened; unset: any path\n"
            "  --profile F   write a Chrome trace (chrome://tracing, Perfetto) of the first\n"
            "                200 steps to F: ops, optimiser, each pack's all-reduce; rank r > 0\n"
            "                of a multi-rank job writes F.r\n"
            "\n"
            "Data parallel: mpirun -np N mge-train SPEC.yaml (or srun) trains on N ranks; each\n"
            "takes its share of every global batch (docs/distributed.md).\n"
            "  --eager       run op by op, every value checked (train.eager: true): the first\n"
            "                NaN/Inf stops the run naming the step, layer, op and pass (exit 1)\n"
            "  --eager-dump DIR  --eager, and the failing op's inputs and outputs go to DIR\n"
            "                as .npy files, with node.json\n"
            "  --eager-max-abs X  --eager, and a value with |x| > X fails as NaN does\n"
            "  --plan        print the memory plans (chosen, plain, sublinear) as JSON and exit\n"
            "                (at resources.cpus threads unless --threads is given)\n"
            "  --max-batch   print the largest batch that fits memory.budget_mb, with and\n"
            "                without recomputation, as JSON and exit\n");
}

/* --threads N: an integer in [1, MGE_CPUS_MAX] (resources.cpus's limit), all of @s; false
 * (and a message) otherwise: more threads than that is a typo, not a machine. */
static bool threads_parse(const char *s, int *out)
{
    long long v;
    if (!mge_parse_int(s, 1, MGE_CPUS_MAX, &v)) {
        fprintf(stderr, "mge-train: --threads: expected an integer between 1 and %d, got '%s'\n",
                MGE_CPUS_MAX, s);
        return false;
    }
    *out = (int)v;
    return true;
}

/*
 * libgomp reads its wait policy when it loads, before main. Its default spins ~300k
 * iterations at every barrier; on a busy machine a spinning thread holds a core the other
 * thread needs and a 4 ms step took 34-104 ms (median) at load 5, against 7-8 ms with a spin
 * count of 10k (tests/bench numbers in docs/benchmarks.md). Unless the user chose a policy,
 * run again with that spin count; the process keeps its pid, so mpirun and workers see no change.
 */
static void omp_policy_reexec(char **argv)
{
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || getenv("MGE_OMP_REEXEC"))
        return;
    /* the resolved path, not /proc/self/exe: the process name (comm) stays "mge-train" */
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0 || n >= (ssize_t)sizeof(self) - 1)
        return;
    self[n] = '\0';
    if (setenv("GOMP_SPINCOUNT", "10000", 1) != 0 || setenv("MGE_OMP_REEXEC", "1", 1) != 0)
        return;
    execv(self, argv); /* returns only on failure: carry on as we are */
}

/*
 * MGE_MEMORY_LIMIT_MB=N caps what the engine allocates (its arenas, data sets, buffers:
 * mge_alloc_set_limit) at N MiB, so a spec that asks for more memory than that fails its
 * allocation with a message instead of taking the machine's memory. The coordinator's planner
 * sets it for its `--plan` child (a spec it is handed at submit is anyone's). Unset: no cap.
 */
static bool memory_limit_from_env(void)
{
    const char *v = getenv("MGE_MEMORY_LIMIT_MB");
    char *end;
    long long mb;
    if (!v || !*v)
        return true;
    errno = 0;
    mb = strtoll(v, &end, 10);
    if (errno || *end || mb <= 0 || mb > (1LL << 40)) {
        fprintf(stderr, "mge-train: MGE_MEMORY_LIMIT_MB: '%s' is not a number of MiB\n", v);
        return false;
    }
    mge_alloc_set_limit(mb << 20);
    return true;
}

/*
 * A worker passes its --data-root directories in MGE_DATA_ROOTS: every data file is then
 * checked where it is opened (common/dataroot.h), so a path that changes after the worker's
 * own check cannot make this rank read outside them. Unset: any path (mge-train on a laptop).
 */
static bool data_roots_from_env(struct mge_data_roots *dr)
{
    const char *list = getenv(MGE_DATA_ROOTS_ENV);
    char err[512];
    if (!list)
        return true;
    if (mge_data_roots_parse(dr, list, err, sizeof(err)) != MGE_OK) {
        fprintf(stderr, "mge-train: %s: %s\n", MGE_DATA_ROOTS_ENV, err);
        return false;
    }
    mge_dataset_set_roots(dr);
    return true;
}

int main(int argc, char **argv)
{
    static struct mge_data_roots roots; /* lives as long as the loads that check it */
    struct mge_train_opts o = {0};
    omp_policy_reexec(argv);
    mge_train_signals_init(); /* before any thread starts */
    if (!memory_limit_from_env())
        return 2;
    mge_alloc_keep_memory();
    const char **sets = mge_calloc((size_t)argc, sizeof(*sets));
    int code;
    if (!sets)
        return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            mge_free(sets);
            return 0;
        } else if (!strcmp(a, "--set") && has_val) {
            sets[o.n_overrides++] = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            sets[o.n_overrides++] = a + 6;
        } else if (!strcmp(a, "--resume") && has_val) {
            o.resume = argv[++i];
        } else if (!strcmp(a, "--init-from") && has_val) {
            o.init_from = argv[++i];
        } else if (!strcmp(a, "--out") && has_val) {
            o.out_dir = argv[++i];
        } else if (!strcmp(a, "--threads") && has_val) {
            if (!threads_parse(argv[++i], &o.threads)) {
                mge_free(sets);
                return 2;
            }
        } else if (!strcmp(a, "--device") && has_val) {
            /* the spec key itself, so the spec's checks and messages apply */
            static char dev_set[128];
            snprintf(dev_set, sizeof(dev_set), "resources.device=%s", argv[++i]);
            sets[o.n_overrides++] = dev_set;
        } else if (!strcmp(a, "--profile") && has_val) {
            o.profile_path = argv[++i];
        } else if (!strcmp(a, "--eager")) {
            o.eager = 1;
        } else if (!strcmp(a, "--eager-dump") && has_val) {
            o.eager = 1;
            o.eager_dump = argv[++i];
        } else if (!strcmp(a, "--eager-max-abs") && has_val) {
            char *end;
            o.eager = 1;
            o.eager_max_abs = strtod(argv[++i], &end);
            if (*end || end == argv[i] || !(o.eager_max_abs > 0) || isinf(o.eager_max_abs)) {
                fprintf(stderr,
                        "mge-train: --eager-max-abs: expected a positive number, got '%s'\n",
                        argv[i]);
                mge_free(sets);
                return 2;
            }
        } else if (!strcmp(a, "--json")) {
            o.json = 1;
        } else if (!strcmp(a, "--plan")) {
            o.plan_only = 1;
        } else if (!strcmp(a, "--max-batch")) {
            o.max_batch = 1;
        } else if (a[0] == '-' || o.spec_path) {
            fprintf(stderr, "mge-train: unexpected argument '%s'\n", a);
            usage(stderr);
            mge_free(sets);
            return 2;
        } else {
            o.spec_path = a;
        }
    }
    if (!o.spec_path) {
        usage(stderr);
        mge_free(sets);
        return 2;
    }
    if (o.init_from && o.resume) {
        fprintf(stderr, "mge-train: --init-from and --resume exclude each other (--resume "
                        "continues a run; --init-from starts a new one from its weights)\n");
        mge_free(sets);
        return 2;
    }
    if (!data_roots_from_env(&roots)) {
        mge_free(sets);
        return 2;
    }
    o.overrides = sets;
    if (o.json)
        setvbuf(stdout, NULL, _IOLBF, 0);
    code = mge_train_main(&o);
    mge_dataset_set_roots(NULL);
    mge_data_roots_fini(&roots);
    mge_free(sets);
    return code;
}
