/*
 * store.h: the coordinator's durable state, one SQLite database (WAL) under --state-dir.
 * Jobs, job events (state changes, metric lines, log lines: one sequence, so an event's id is
 * its server-sent-event id), metrics (step, name, value, time), placements (which worker runs
 * which rank of which attempt, and how it ended), workers and checkpoints.
 *
 * Thread: every function may be called from any thread; one mutex serialises the connection.
 * Every statement is prepared once and cached (no SQL text is ever built from values).
 * JSON results are jansson objects the caller owns (json_decref).
 */
#ifndef MGE_COORDINATOR_STORE_H
#define MGE_COORDINATOR_STORE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/gpu.h"

struct mge_store;
struct mge_jobspec;

enum mge_job_state {
    MGE_JOB_QUEUED,
    MGE_JOB_RUNNING,
    MGE_JOB_SUCCEEDED,
    MGE_JOB_FAILED,
    MGE_JOB_CANCELLED,
    MGE_JOB__NSTATES
};

/* "queued", "running", ...; NULL for a bad value. */
const char *mge_job_state_name(enum mge_job_state s);
/* Parse a state name; -1 when unknown. */
int mge_job_state_parse(const char *name);
bool mge_job_state_is_terminal(enum mge_job_state s);

/* What the scheduler needs of a job (no spec text). */
struct mge_job_row {
    int64_t id;
    int state;               /* enum mge_job_state */
    int priority;            /* -100..100, higher first */
    int attempt;             /* 1, 2, ... incremented on requeue */
    int workers_min, workers_max;
    int cpus, gpus;          /* per worker */
    int64_t memory_mb;       /* per worker, 0 = any */
    int64_t gpu_memory_mb;   /* per GPU (device gpu: the planned peak per rank), 0 = any */
    int device;              /* enum mge_device_kind */
    int64_t total_steps;     /* the steps the job trains in all (its progress' total) */
};

/* One placed rank as stored. */
struct mge_placement {
    int64_t job_id;
    int attempt;
    int rank;
    char worker_id[40];
    uint64_t gpu_mask; /* the worker's GPUs the rank holds (bit i: GPU index i) */
    bool exited;
    int exit_code;
    int term_signal;
    bool superseded; /* mge_store_placements_active: an attempt before the current one */
};

/* One output line from a worker (see proto/worker.proto Line). Strings are borrowed. */
struct mge_store_line {
    int64_t job_id;
    int attempt;
    int rank;
    uint64_t seq;
    int stream;              /* 0 stdout, 1 stderr, 2 metrics JSON, 3 checkpoint notice */
    const char *text;
    int64_t time_ms;
};

struct mge_worker_row {
    char id[40];
    char name[128];
    char host[128];
    int cpus, gpus;
    struct mge_gpu gpu[MGE_GPUS_MAX]; /* [0, gpus): each GPU's name and memory */
    int64_t memory_mb;
    char device[8];
    char version[32];
    char state[16];          /* ready | draining | lost */
    int64_t registered_ms;
    char launch_url[300];    /* the worker's launch socket, "" if it has none */
};

/* Wall clock in ms since the epoch, and a monotonic clock in ms. */
int64_t mge_now_ms(void);
int64_t mge_mono_ms(void);

/*
 * Open (creating if needed) @dir/mge.db, apply schema migrations, WAL mode.
 * On MGE_OK *@out is a new store the caller closes with mge_store_close().
 * Refuses (logged at error level with what to do, see docs/operations.md):
 *   MGE_CORRUPT  the file fails PRAGMA quick_check or is not a database; it was left open
 *                by a coordinator that did not stop cleanly and its WAL file is gone (commits
 *                lost, ids would be reused); or its WAL has a bad frame with good frames
 *                behind it (SQLite would drop them silently). A crash that leaves the WAL in
 *                place, torn last write included, is fine.
 *   MGE_DB       SQLite cannot open or migrate it; the schema is newer than this program.
 * The caller must hold the state directory's lock (one process per database): the open
 * marker this sets in the file assumes no other process has it open.
 */
int mge_store_open(const char *dir, struct mge_store **out);
/* Close cleanly (clears the open marker, checkpoints the WAL); NULL does nothing. */
void mge_store_close(struct mge_store *st);

/*
 * Replace @dir/mge.db with a copy of @backup (an SQLite file, e.g. from `sqlite3 ... .backup`),
 * after checking the backup with PRAGMA quick_check. The replaced mge.db and its WAL are kept
 * beside it as mge.db.replaced-<unix time>[-wal]; AUTOINCREMENT counters (job and event ids)
 * that the replaced file had advanced further are kept, so ids are not handed out twice.
 * @backup may be @dir/mge.db itself: "accept this file as it is". Caller holds the directory
 * lock and has no store open. MGE_CORRUPT: the backup is damaged; MGE_IO, MGE_DB.
 */
int mge_store_restore(const char *dir, const char *backup);

/*
 * Call @fn(@arg, job_id) after each commit that appended events to job job_id (state changes,
 * log, metric and checkpoint lines), from the writing thread, with no store lock held; NULL
 * removes it. When this returns, no call of the previous hook is running. @fn must be quick
 * and must not call into the store (the hook's lock is held while it runs).
 */
void mge_store_on_events(struct mge_store *st, void (*fn)(void *arg, int64_t job_id), void *arg);

/*
 * Insert a validated job in state queued (and its first state event).
 * @spec_json: the spec as JSON text (borrowed). @total_steps: for progress.
 */
int mge_store_job_insert(struct mge_store *st, const struct mge_jobspec *spec,
                         const char *spec_json, int64_t total_steps, int64_t *out_id);

/*
 * As mge_store_job_insert, with the memory plan the job is placed by: @plan_json (NULL: none;
 * GET /jobs/{id} shows it as "plan") and @plan_mb, the MiB per worker it needs, which the
 * scheduler reserves when it is more than resources.memory_mb.
 */
int mge_store_job_insert_planned(struct mge_store *st, const struct mge_jobspec *spec,
                                 const char *spec_json, int64_t total_steps, const char *plan_json,
                                 int64_t plan_mb, int64_t *out_id);

/* The job as the API shows it (without pending_reason, which the scheduler knows). MGE_NOENT. */
int mge_store_job_get(struct mge_store *st, int64_t id, json_t **out);

/* The scheduler's view of one job. MGE_NOENT. */
int mge_store_job_row(struct mge_store *st, int64_t id, struct mge_job_row *out);

/* Spec YAML of a job; *@out is mge_malloc'ed, the caller mge_free()s it. */
int mge_store_job_spec(struct mge_store *st, int64_t id, char **out);

/*
 * Jobs newest first. @state: -1 for all. @before_id: cursor, 0 for the first page.
 * *@out: JSON array of summaries; *@next: cursor for the next page, 0 when none.
 */
int mge_store_job_list(struct mge_store *st, int state, int64_t before_id, int limit,
                       json_t **out, int64_t *next);

/*
 * Queued jobs in scheduling order (priority desc, id asc), at most @max.
 * *@rows is mge_malloc'ed (caller frees), *@n its length.
 */
int mge_store_jobs_queued(struct mge_store *st, int max, struct mge_job_row **rows, int *n);

/*
 * For a restart: the current attempt's placements of running jobs, and those of the attempt
 * before the current one of a queued or running job that are not known to have ended (a
 * membership change ended that attempt; its ranks may still run: .superseded). Caller frees.
 */
int mge_store_placements_active(struct mge_store *st, struct mge_placement **out, int *n);

/*
 * Move job @id to @state with @reason (may be NULL) if it is not terminal and, when
 * @attempt > 0, its attempt is @attempt. *@changed (may be NULL) says whether it moved.
 * Appends a state event; sets started/finished timestamps.
 */
int mge_store_job_set_state(struct mge_store *st, int64_t id, int attempt, enum mge_job_state state,
                            const char *reason, bool *changed);

/* Requeues not charged to a job after which it fails anyway (see mge_store_job_requeue). */
#define MGE_STORE_INFRA_RESTARTS_MAX 100

/*
 * Record a failure of attempt @attempt with @reason, end its incarnation ("requeued") and
 * queue the job again (attempt + 1). @charged: the job's own failure, which counts against its
 * restarts (max_attempts - 1): with none left the job fails for good instead. A failure of the
 * infrastructure (a lost worker, a worker fault, a re-form) is not charged; it requeues up to
 * MGE_STORE_INFRA_RESTARTS_MAX times (a safety net: a fault that recurs at once, on the only
 * worker there is, would otherwise loop for ever). *@requeued says which.
 */
int mge_store_job_requeue(struct mge_store *st, int64_t id, int attempt, const char *reason,
                          bool charged, bool *requeued);

/*
 * Place attempt @attempt of job @id: @n placements, its incarnation row (size @n, start step =
 * the newest checkpoint's when @attempt > 1; the previous incarnation's reason gets
 * "; resized A -> n" when its size differs), state -> running, one transaction.
 */
int mge_store_job_place(struct mge_store *st, int64_t id, int attempt,
                        const struct mge_placement *pl, int n);

/* Record that a placed rank ended. */
int mge_store_placement_exit(struct mge_store *st, int64_t job_id, int attempt, int rank,
                             int exit_code, int term_signal);

/*
 * Store a batch of lines from worker @worker_id in one transaction, idempotently
 * (UNIQUE(job, attempt, rank, seq)). Metric lines of rank 0 also become metrics rows; a
 * summary line becomes the job's result; checkpoint notices become checkpoint rows.
 * Fencing: only lines of the job's current attempt, from the worker that attempt placed the
 * line's rank on, are stored; once the job has ended, only their log lines. The others
 * (unknown jobs, a superseded attempt whose worker was lost and came back, another worker's
 * rank) are dropped, logged at warn and counted, and still count as stored (MGE_OK), so that
 * the caller acks them and the worker stops resending them.
 */
int mge_store_lines_ingest(struct mge_store *st, const char *worker_id,
                           const struct mge_store_line *lines, size_t n);

/* How many lines mge_store_lines_ingest() has dropped since the store was opened. */
uint64_t mge_store_lines_fenced(struct mge_store *st);

/*
 * Events of job @job_id with id > @after_id, oldest first, at most @limit, as a JSON array of
 * {"id","kind","data"} (data is an object). @kinds: NULL for all, or "log".
 */
int mge_store_events(struct mge_store *st, int64_t job_id, int64_t after_id, int limit, json_t **out);

/* The id of the newest event of job @job_id (0 if none), for resuming a stream from "now". */
int mge_store_events_last_id(struct mge_store *st, int64_t job_id, int64_t *out);

/* Log lines of a job: @rank < 0 for all ranks; the last @tail lines (tail <= 0: 1000). */
int mge_store_logs(struct mge_store *st, int64_t job_id, int rank, int tail, json_t **out);

/* Metrics of a job: @name NULL for all; steps > @since_step. {"metrics": [...]} */
int mge_store_metrics(struct mge_store *st, int64_t job_id, const char *name, int64_t since_step,
                      json_t **out);

/* Checkpoints of a job as a JSON array, newest step first. */
int mge_store_checkpoints(struct mge_store *st, int64_t job_id, json_t **out);

/* Path of checkpoint @name of job @job_id ("latest" = highest step); caller mge_free()s. */
int mge_store_checkpoint_path(struct mge_store *st, int64_t job_id, const char *name, char **out);

/* Path of the latest checkpoint of a job, or MGE_NOENT. Caller mge_free()s. */
int mge_store_checkpoint_latest(struct mge_store *st, int64_t job_id, char **out);

/*
 * Whether @worker_id holds rank @rank of @job_id's current attempt, and that is @attempt
 * (the fence lines go through). Returns MGE_OK (the answer in *@current) or MGE_DB.
 */
int mge_store_rank_is_current(struct mge_store *st, const char *worker_id, int64_t job_id,
                              int attempt, int rank, bool *current);

/*
 * Checkpoint replication (coordinator/ckpt_store.c): record that checkpoint @name (step @step,
 * @size bytes) of @job_id, uploaded by @worker_id from @worker_path, is committed as the
 * verified file @copy in the coordinator's store. Returns MGE_OK or MGE_DB.
 */
int mge_store_checkpoint_commit(struct mge_store *st, int64_t job_id, const char *name,
                                int64_t step, int64_t size, const char *worker_path,
                                const char *worker_id, const char *copy);
/* The step incarnation @attempt of @job_id really starts from (its rank 0 fetched a copy). */
int mge_store_incarnation_start_step(struct mge_store *st, int64_t job_id, int attempt,
                                     int64_t step);
/* Name of the newest committed copy of @job_id's checkpoints, or MGE_NOENT. mge_free() it. */
int mge_store_checkpoint_copy_latest(struct mge_store *st, int64_t job_id, char **name);
/* Path of the committed copy of checkpoint @name, or MGE_NOENT. mge_free() it. */
int mge_store_checkpoint_copy_path(struct mge_store *st, int64_t job_id, const char *name,
                                   char **out);
/*
 * Forget one committed copy of @job_id older than the newest @keep: its path into *@out
 * (mge_free() it; the caller deletes the file). MGE_NOENT when there is none beyond @keep.
 */
int mge_store_checkpoint_copy_prune(struct mge_store *st, int64_t job_id, int keep, char **out);

/* Count jobs per state into @counts[MGE_JOB__NSTATES]. */
int mge_store_job_counts(struct mge_store *st, int64_t counts[MGE_JOB__NSTATES]);

/* Workers: insert or update by name; the id is kept for a known name, new otherwise. */
int mge_store_worker_upsert(struct mge_store *st, struct mge_worker_row *w);
int mge_store_worker_set_state(struct mge_store *st, const char *id, const char *state);
/* All workers; *@out mge_malloc'ed, caller frees. */
int mge_store_workers_load(struct mge_store *st, struct mge_worker_row **out, int *n);

#endif
