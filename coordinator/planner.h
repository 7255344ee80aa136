/*
 * planner.h: a job's memory plan, learnt at submit from the engine's own planner.
 *
 * The coordinator does not link the engine: it runs `mge-train --plan SPEC` (the binary named
 * by --plan-bin) as a child process and reads the JSON it prints: the peak bytes per rank of
 * the plan the job will run with ("chosen"), of the plain plan and of the sublinear one. The
 * child reads data files only under the roots it is given (MGE_DATA_ROOTS: none by default, so
 * a spec cannot make the coordinator read its files), is killed past a deadline, and may use
 * at most 2 GiB of memory (MGE_MEMORY_LIMIT_MB: a spec that would load a huge data set fails
 * its allocation in the child, and the job is accepted unplanned, saying so).
 */
#ifndef MGE_COORDINATOR_PLANNER_H
#define MGE_COORDINATOR_PLANNER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct mge_planner_opts {
    const char *bin;        /* mge-train; NULL: planning is off */
    const char *data_roots; /* "DIR:DIR" the child may read data under ("" or NULL: none) */
    const char *tmp_dir;    /* where the spec is written for the child (must exist) */
    int timeout_ms;         /* the child is killed after this (default 30000) */
    int memory_mb;          /* the child's data memory is capped at this (default 2048) */
};

struct mge_job_plan {
    int64_t chosen_bytes;    /* peak per rank of the plan the spec asks for */
    int64_t plain_bytes;     /* ... of the plain plan (everything kept) */
    int64_t sublinear_bytes; /* ... of the least-memory recomputation plan */
    char chosen_mode[16];    /* "none", "sublinear", "light" */
    json_t *json;            /* the planner's whole output (owned; mge_job_plan_fini) */
};

/*
 * Plan @spec_yaml (a canonical spec: it parses) with @opts. MGE_OK: *@out filled (release it
 * with mge_job_plan_fini). Otherwise @why says why ("the planner exited 2: data path ... is
 * outside ..."; "no answer within 30 s") and *@out is zeroed; the caller decides what an
 * unplanned job means. Thread: any (blocks for the child's run).
 */
int mge_job_plan_run(const struct mge_planner_opts *opts, const char *spec_yaml,
                     struct mge_job_plan *out, char *why, size_t why_len);

/*
 * A planner that remembers the plans of the last specs it planned (a plan depends on the spec
 * and the shapes of its data alone; an entry is kept 10 minutes), so a burst of submissions of
 * one spec runs one child. @opts' strings are borrowed and must outlive it.
 */
struct mge_planner;
int mge_planner_new(const struct mge_planner_opts *opts, struct mge_planner **out);
void mge_planner_free(struct mge_planner *p); /* NULL does nothing */
/* As mge_job_plan_run, from the cache when it can. Thread: any. */
int mge_planner_run(struct mge_planner *p, const char *spec_yaml, struct mge_job_plan *out,
                    char *why, size_t why_len);

void mge_job_plan_fini(struct mge_job_plan *p);

/* @bytes as "1.4 GiB", "300 MiB" or "12 KiB" into @buf; returns @buf. */
char *mge_bytes_human(int64_t bytes, char *buf, size_t len);

#endif
