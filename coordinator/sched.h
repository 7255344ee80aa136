/*
 * sched.h: the worker registry and the gang scheduler of mge-coordinator.
 *
 * The registry keeps every worker's slots, liveness and queued commands in memory; the
 * reservations (which rank of which job attempt runs where) mirror the store's placements
 * so a restarted coordinator rebuilds them from SQLite. Jobs are placed by priority, then
 * submission order; a job gets all of its ranks (workers_min..workers_max workers, one
 * rank each) or none. A worker silent for longer than the timeout is lost: its jobs fail
 * with "worker lost" and are queued again (a new attempt, or incarnation, placed on the
 * workers free then: an elastic job goes on with at least workers_min). Such infrastructure
 * requeues are not charged to the job's restarts (mge_store_job_requeue). An elastic job below
 * workers_max grows when a ready worker has room for one more of its ranks and no queued job
 * could use it: at its rank 0's next checkpoint notice the attempt ends ("worker w4 joined:
 * growing") and the next one resumes from that checkpoint with it. The next attempt of a job
 * is placed once the ranks of the one before have ended (or after the cancel grace + 5 s); a
 * restarted coordinator reloads those ranks, fences them and keeps their slots until then.
 *
 * Fencing: only the current attempt's ranks, on the very worker the attempt placed them on,
 * change a job. Exits from elsewhere are acknowledged and dropped (the store fences output
 * lines the same way, see mge_store_lines_ingest), and a worker that reports ranks of an
 * attempt that is not current (it was lost and came back, or the job ended) is told to cancel
 * them in the reply to that very register or heartbeat.
 *
 * Watchdog: a running attempt that reports no step progress (rank 0's metric lines) for
 * max(progress timeout, 5 x the median time between its step reports), or no step at all
 * within the startup timeout, is ended: its ranks are cancelled and the job fails with a
 * reason that names the last step and the rank that hangs when one stands out (stopped, or
 * idle while its peers spin: the workers report each rank's session state and CPU time), the
 * silent ranks otherwise. An elastic job (workers_min < workers_max) is re-formed instead:
 * requeued, not charged, and without the member whose worker had gone quiet, or else whose
 * rank hangs, when there is one.
 *
 * A multi-rank attempt (a gang) runs as one mpirun started by rank 0's worker (its Assign
 * names every rank's worker), which starts the other ranks through their workers' launch
 * sockets (worker/launch.h), authenticated by a random token per attempt. Open MPI cannot
 * survive the loss of a rank, so when any rank of a gang ends badly the others are cancelled
 * at once, and the attempt is decided when every rank is accounted for: requeued if one of
 * its workers was lost meanwhile, failed otherwise.
 *
 * Thread: every function may be called from any thread (one mutex inside). The scheduler
 * has its own thread (placement passes, lost-worker checks). Lock order: sched, then store.
 */
#ifndef MGE_COORDINATOR_SCHED_H
#define MGE_COORDINATOR_SCHED_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store.h"

struct mge_sched;

struct mge_sched_opts {
    int worker_timeout_ms;   /* silence after which a worker is lost (default 10000) */
    int cancel_grace_ms;     /* SIGTERM -> SIGKILL grace the workers are told (default 5000) */
    int progress_timeout_ms; /* watchdog floor between step reports (0: 10000, < 0: off) */
    int startup_timeout_ms;  /* watchdog allowance before the first step (0: 300000, < 0: off) */
    /* The clock every decision reads, in ms (monotonic); NULL: mge_mono_ms(). Tests pass
     * their own and drive the scheduler through time with mge_sched_tick(). */
    int64_t (*now_ms)(void *arg);
    void *now_arg;
    bool no_thread;          /* tests: no scheduler thread; the caller runs mge_sched_tick() */
    bool no_grow;            /* running elastic jobs never grow (mge-coordinator --grow 0) */
    /* A preemption first asks the victim for a checkpoint and ends it when that arrives, or
     * after this many ms without one (0: 30000; < 0: no request, the victim ends at once and
     * loses the steps since its last checkpoint). */
    int preempt_ckpt_ms;
    /* Called (with the scheduler's lock held, so it must not call back) when @worker_id has
     * commands waiting; the RPC layer wakes the worker. May be NULL. */
    void (*notify)(void *arg, const char *worker_id);
    void *notify_arg;
};

struct mge_worker_info {     /* what a worker says about itself; strings borrowed */
    const char *name, *host, *version, *device;
    const char *launch_url;  /* its launch socket for multi-worker jobs; NULL or "" if none */
    const char *launch_cert; /* that socket's certificate (PEM) when it is tls+tcp:// */
    int cpus, gpus;
    const struct mge_gpu *gpu; /* @gpus of them (name, memory), NULL when it did not say */
    int64_t memory_mb;
};

struct mge_rank_report {     /* one rank in a register or heartbeat; strings borrowed */
    int64_t job_id;
    int attempt, rank;
    bool running;
    int exit_code, term_signal;
    const char *failure;     /* "" or NULL when none */
    bool worker_fault;       /* @failure is the worker's (disk full, cannot spawn): requeue */
    bool stopped;            /* running: a process of its group is stopped (SIGSTOP) */
    int64_t cpu_ms;          /* running: CPU time of its process group, ms (0: unknown) */
};

#define MGE_SCHED_CERT_MAX 2048 /* a launch socket's certificate, PEM, NUL included */

/* A worker of a multi-rank attempt, as rank 0's worker gets it (worker.proto Peer). */
struct mge_sched_peer {
    int rank;
    char name[128];
    char launch_url[300];
    char launch_cert[MGE_SCHED_CERT_MAX]; /* "" for a tcp:// launch socket */
};

struct mge_sched_assign {
    int64_t job_id;
    int attempt, rank, world;
    char *spec_yaml;         /* owned */
    char *resume;            /* owned, NULL for none */
    char *resume_copy;       /* owned, NULL for none: newest checkpoint in the coordinator's
                              * store (rank 0 only), for a worker that cannot read @resume */
    char launch_token[40];   /* world > 1: the attempt's secret; "" otherwise */
    char gpu_ids[200];       /* the worker's GPUs the rank gets ("0,1"), "" for none */
    struct mge_sched_peer *peers; /* owned; rank 0 of world > 1: every rank's worker */
    size_t n_peers;
};

struct mge_sched_cancel {
    int64_t job_id;
    int attempt;
};

struct mge_sched_ckpt_req { /* rank 0 of (job, attempt): write a checkpoint now */
    int64_t job_id;
    int attempt;
};

struct mge_sched_exit_ack {
    int64_t job_id;
    int attempt, rank;
};

/* Commands for one worker, taken out of its queue by mge_sched_worker_heartbeat(). */
struct mge_sched_cmds {
    struct mge_sched_assign *assign;
    size_t n_assign;
    struct mge_sched_cancel *cancel;
    size_t n_cancel;
    struct mge_sched_exit_ack *acks;
    size_t n_acks;
    struct mge_sched_ckpt_req *ckpt;
    size_t n_ckpt;
    int grace_ms;
};

/* Free what @c holds (not @c itself). */
void mge_sched_cmds_fini(struct mge_sched_cmds *c);

/*
 * Create the scheduler over @st (borrowed; must outlive it), load workers and active
 * placements from the store, and start its thread. On MGE_OK the caller frees with
 * mge_sched_free().
 */
int mge_sched_new(struct mge_store *st, const struct mge_sched_opts *opts, struct mge_sched **out);
/* Stop the thread and free; NULL does nothing. */
void mge_sched_free(struct mge_sched *s);

/* Ask for a placement pass soon (after a submit, an exit, a new worker). */
void mge_sched_kick(struct mge_sched *s);

/*
 * One round of the scheduler's periodic work, now: lost-worker checks, the progress watchdog,
 * and a placement pass. The scheduler thread runs it every 250 ms; with opts.no_thread the
 * caller does (tests, with their own clock).
 */
void mge_sched_tick(struct mge_sched *s);

/*
 * A worker (re)registers. @ranks: what it runs now. Ranks it no longer runs that the
 * coordinator had placed on it are lost (their jobs are requeued); running ranks that are not
 * the current attempt's placements on it are to be cancelled: @out (caller finis it, also on
 * error) receives those cancels for the reply. @id_out receives its id.
 */
int mge_sched_worker_register(struct mge_sched *s, const struct mge_worker_info *info,
                              const struct mge_rank_report *ranks, size_t n, char id_out[40],
                              struct mge_sched_cmds *out);

/*
 * A heartbeat from worker @id with its ranks and the output @lines it carried (already given
 * to the store; the scheduler reads the step progress of metric lines from them). Records
 * exits, finishes jobs, and moves the worker's queued commands into @out (caller finis it,
 * also on error). MGE_NOENT: unknown worker (it must register).
 */
int mge_sched_worker_heartbeat(struct mge_sched *s, const char *id,
                               const struct mge_rank_report *ranks, size_t n,
                               const struct mge_store_line *lines, size_t n_lines,
                               struct mge_sched_cmds *out);

/* Whether @id names a known worker that is not lost (heartbeats from others are refused). */
bool mge_sched_worker_known(struct mge_sched *s, const char *id);

/* Cancel job @id from any non-terminal state. MGE_NOENT, MGE_STATE (already finished). */
int mge_sched_job_cancel(struct mge_sched *s, int64_t id);

/* Why queued job @row is not running, as a new string (mge_free), or NULL on OOM. */
char *mge_sched_pending_reason(struct mge_sched *s, const struct mge_job_row *row);

/* The memory (MiB) of the largest worker that is not lost, 0 when none is known: what a job's
 * memory plan is checked against at submit. */
int64_t mge_sched_memory_max_mb(struct mge_sched *s);

/* The memory (MiB) of the largest GPU of a worker that is not lost, 0 when none has a GPU:
 * what a GPU job's memory plan is checked against at submit. */
int64_t mge_sched_gpu_memory_max_mb(struct mge_sched *s);

/* Workers as a JSON array (caller owns). */
json_t *mge_sched_workers_json(struct mge_sched *s);

/*
 * Drain worker @id: no new ranks go there; an elastic job running there is re-formed without
 * it when enough other ready workers could hold it (not charged to its restarts); other ranks
 * there finish normally. *@out: the worker as JSON. MGE_NOENT.
 */
int mge_sched_worker_drain(struct mge_sched *s, const char *id, json_t **out);

/*
 * Undrain worker @id (drained or not, connected or lost): it takes new ranks again, now or when
 * it comes back. *@out: the worker as JSON (caller owns). MGE_NOENT.
 */
int mge_sched_worker_undrain(struct mge_sched *s, const char *id, json_t **out);

struct mge_sched_stats {
    int workers_ready, workers_draining, workers_lost;
    int ranks_running;
    uint64_t fenced_reports;   /* running ranks and exits refused: not a current placement */
};
void mge_sched_stats_get(struct mge_sched *s, struct mge_sched_stats *out);

#endif
