/*
 * bench_planner.c: the memory planner on random interval sets: arena over lower bound and
 * planning time. Sizes 64 B..256 KiB, lifetimes up to 60 ops, 5 sets per size.
 * Usage: bench_planner [-s SEED] [N...]   (default seed 1, sizes 1000 10000)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/rng.h"
#include "engine/engine_int.h"

static void run(int n, struct mge_rng *r)
{
    double worst = 0.0, sum = 0.0, tmax = 0.0;
    for (int trial = 0; trial < 5; trial++) {
        struct mge__plan_item *it = malloc(sizeof(*it) * (size_t)n);
        for (int i = 0; i < n; i++) {
            it[i].v = i;
            it[i].size = 64 * (1 + mge_rng_below(r, 4096));
            it[i].first = (int64_t)mge_rng_below(r, (uint64_t)(3 * n));
            it[i].last = it[i].first + (int64_t)mge_rng_below(r, 60);
        }
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        size_t lb = mge__plan_lower_bound(it, n, 3 * (int64_t)n + 61);
        size_t ar = mge__plan_assign(it, n);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
        double q = (double)ar / (double)lb;
        sum += q;
        if (q > worst)
            worst = q;
        if (ms > tmax)
            tmax = ms;
        free(it);
    }
    printf("  planner: %6d tensors: arena/lower bound mean %.3f worst %.3f; slowest plan %.1f ms\n",
           n, sum / 5.0, worst, tmax);
}

int main(int argc, char **argv)
{
    struct mge_rng r;
    uint64_t seed = 1;
    int i = 1;
    if (argc > 2 && strcmp(argv[1], "-s") == 0) {
        seed = strtoull(argv[2], NULL, 10);
        i = 3;
    }
    mge_rng_seed(&r, seed);
    if (i == argc) {
        run(1000, &r);
        run(10000, &r);
    }
    for (; i < argc; i++)
        run(atoi(argv[i]), &r);
    return 0;
}
