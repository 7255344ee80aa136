/*
 * mge-commbench.c: gradient all-reduce of one model three ways, side by side in one run
 * (run under mpirun, 2 ranks): raw MPI_Allreduce of the whole gradient arena, one
 * MPI_Allreduce per gradient tensor, and mge's packed all-reduce (engine/comm packs on the
 * communication thread). Rank 0 prints one JSON line per method with median milliseconds and
 * bus bandwidth. Usage: mge-commbench SPEC.yaml [REPS] [--set k=v]...
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/jobspec.h"
#include "engine/comm/comm.h"
#include "engine/engine.h"
#include "engine/train.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return v[n / 2];
}

struct span {
    size_t off, bytes;
};

static int cmp_span(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

int main(int argc, char **argv)
{
    const char *sets[16];
    int n_sets = 0, reps = 30;
    struct mge_jobspec *spec = NULL;
    struct mge_spec_error serr;
    char err[512];
    if (argc < 2) {
        fprintf(stderr, "usage: mge-commbench SPEC.yaml [REPS] [--set k=v]...\n");
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc && n_sets < 16)
            sets[n_sets++] = argv[++i];
        else
            reps = atoi(argv[i]);
    }
    if (mge_jobspec_load(argv[1], sets, n_sets, &spec, &serr) != MGE_OK) {
        fprintf(stderr, "mge-commbench: %s\n", serr.message);
        return 2;
    }
    struct mge_comm_env env;
    struct mge_comm *c;
    mge_comm_env_read(&env);
    if (mge_comm_open(&c, MGE_BACKEND_MPI, &env, err, sizeof(err)) != MGE_OK) {
        fprintf(stderr, "mge-commbench: %s\n", err);
        return 1;
    }
    int rank = mge_comm_rank(c), size = mge_comm_size(c);

    /* the model's gradient arena, as mge-train lays it out (data only for its shape) */
    struct mge_dataset ds;
    if (mge_data_load(spec, 0, &ds, err, sizeof(err)) != MGE_OK) {
        fprintf(stderr, "mge-commbench: %s\n", err);
        mge_comm_abort(c, 1);
        return 1;
    }
    struct mge_graph *g = NULL;
    struct mge_model model;
    struct mge_plan_stats st;
    struct mge_remat_plan chosen, plain;
    if (mge_train_build(spec, 8, ds.c, ds.h, ds.w, ds.classes, MGE_REMAT_NONE, &g, &model, &st,
                        &chosen, &plain) != MGE_OK ||
        mge_graph_alloc(g) != MGE_OK) {
        fprintf(stderr, "mge-commbench: cannot build the model\n");
        mge_comm_abort(c, 1);
        return 1;
    }
    int64_t n_floats;
    float *grads = mge_graph_grads(g, &n_floats);
    size_t bytes = sizeof(float) * (size_t)n_floats;
    for (int64_t i = 0; i < n_floats; i++)
        grads[i] = (float)(i % 97) * 1e-3f;
    int np = mge_graph_n_params(g), nt = 0;
    struct span *spans = calloc((size_t)np, sizeof(*spans));
    size_t *cuts = calloc((size_t)np + 1, sizeof(size_t));
    for (int i = 0; i < np; i++) {
        size_t off, b;
        if (mge_graph_grad_span(g, mge_graph_param(g, i), &off, &b) == MGE_OK) {
            spans[nt].off = off;
            spans[nt].bytes = b;
            cuts[nt] = off;
            nt++;
        }
    }
    qsort(spans, (size_t)nt, sizeof(*spans), cmp_span);
    size_t pack = (size_t)(spec->distributed.pack_mb * 1048576.0);
    struct mge_comm_packs *packs;
    if (mge_comm_packs_new(&packs, c, grads, bytes, cuts, nt, pack < (1u << 20) ? pack : 1u << 20,
                           pack) != MGE_OK) {
        mge_comm_abort(c, 1);
        return 1;
    }

    double *t_raw = calloc((size_t)reps, sizeof(double));
    double *t_tensor = calloc((size_t)reps, sizeof(double));
    double *t_packed = calloc((size_t)reps, sizeof(double));
    /*
     * Raw and per-tensor calls run on this thread while the communication thread is idle (it
     * only runs between packs' start and wait): MPI_THREAD_SERIALIZED allows that. Every
     * method starts from gradients just written (as after backward) and the methods take
     * turns in a rotating order, so neither the cache nor a noisy neighbour favours one.
     */
    for (int r = -3; r < reps; r++) { /* 3 warm-up rounds */
        for (int k = 0; k < 3; k++) {
            int method = (k + (r < 0 ? 0 : r)) % 3;
            double t0, dt;
            for (int64_t i = 0; i < n_floats; i++)
                grads[i] = (float)(i % 97) * 1e-3f;
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
            if (method == 0) {
                MPI_Allreduce(MPI_IN_PLACE, grads, (int)n_floats, MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD);
            } else if (method == 1) {
                for (int i = 0; i < nt; i++)
                    MPI_Allreduce(MPI_IN_PLACE, (char *)grads + spans[i].off,
                                  (int)(spans[i].bytes / sizeof(float)), MPI_FLOAT, MPI_SUM,
                                  MPI_COMM_WORLD);
            } else {
                mge_comm_packs_begin(packs);
                mge_comm_packs_ready(packs, bytes);
                for (int i = 0; i < mge_comm_packs_count(packs); i++)
                    if (mge_comm_packs_wait(packs, i) != MGE_OK)
                        mge_comm_abort(c, 1);
            }
            dt = MPI_Wtime() - t0;
            if (r >= 0)
                (method == 0 ? t_raw : method == 1 ? t_tensor : t_packed)[r] = dt;
        }
    }
    if (rank == 0) {
        double raw = median(t_raw, reps), tensor = median(t_tensor, reps);
        double packed = median(t_packed, reps);
        /* bus bandwidth of a ring all-reduce: 2 (n-1)/n of the buffer crosses each link */
        double bus = 2.0 * (size - 1) / size * (double)bytes;
        printf("{\"model\":\"%s\",\"ranks\":%d,\"grad_bytes\":%zu,\"tensors\":%d,\"packs\":%d,"
               "\"pack_mb\":%g,\"reps\":%d,"
               "\"raw_ms\":%.3f,\"per_tensor_ms\":%.3f,\"packed_ms\":%.3f,"
               "\"raw_gbps\":%.2f,\"per_tensor_gbps\":%.2f,\"packed_gbps\":%.2f,"
               "\"packed_vs_raw\":%.3f,\"packed_vs_per_tensor\":%.3f}\n",
               spec->name, size, bytes, nt, mge_comm_packs_count(packs), spec->distributed.pack_mb,
               reps, 1e3 * raw, 1e3 * tensor, 1e3 * packed, bus / raw / 1e9, bus / tensor / 1e9,
               bus / packed / 1e9, raw / packed, tensor / packed);
    }
    free(t_raw);
    free(t_tensor);
    free(t_packed);
    free(spans);
    free(cuts);
    mge_comm_packs_free(packs);
    mge_graph_free(g);
    mge_dataset_fini(&ds);
    mge_jobspec_free(spec);
    mge_comm_close(c);
    return 0;
}
