/*
 * ranks.h: the ranks one mge-worker runs: the shared rank table and the libuv side that
 * spawns mge-train processes (each in its own process group), reads their output lines,
 * kills them on cancel (SIGTERM, SIGKILL after a grace period) and records how they ended.
 *
 * Threads: the table is shared by the libuv loop thread (spawn, output, exit) and the link
 * thread (assign, cancel, acks, heartbeat snapshots). Every field marked [mu] is read and
 * written with mge_ranks.mu held; fields marked [loop] belong to the loop thread only.
 * The link thread hands work to the loop with mge_ranks_wake() (uv_async_send).
 *
 * Multi-rank attempts (world > 1) run as one mpirun: rank 0's worker starts mpirun (the
 * rank's process) with mge-launch as its launch agent; mge-launch asks the worker that holds
 * rank k (its launch socket, launch.h) to start mpirun's orted command, which becomes rank
 * k's process there. Every process of the job is thus started and watched by a worker, and
 * dies with it (mge-launch --guard): no ssh, no process outside a worker's view.
 */
#ifndef MGE_WORKER_RANKS_H
#define MGE_WORKER_RANKS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/dataroot.h"

enum mge_rank_state { MGE_RANK_STARTING, MGE_RANK_RUNNING, MGE_RANK_EXITED };

/* One output line waiting for the coordinator's ack. */
struct mge_out_line {
    uint64_t seq;            /* 1, 2, ... per rank */
    int stream;              /* 0 stdout, 1 stderr, 2 metrics JSON, 3 checkpoint notice */
    char *text;              /* owned */
    int64_t time_ms;         /* wall clock */
};

/* A worker of a multi-rank attempt (see worker.proto Peer). */
struct mge_peer {
    int rank;
    char *name;              /* the host name mpirun is given */
    char *launch_url;
    char *launch_cert; /* PEM, the only certificate mge-launch accepts there; "" if none */
};

/* What mge_ranks_assign() copies. Strings and @peers are borrowed. */
struct mge_rank_assign {
    int64_t job_id;
    int attempt, rank, world;
    const char *spec_yaml;
    const char *resume;      /* checkpoint to resume from, NULL or "" for none */
    const char *resume_copy; /* rank 0: newest checkpoint in the coordinator's store, for when
                              * @resume is not readable here; NULL or "" for none */
    const char *launch_token; /* world > 1: the attempt's secret for LaunchRequests */
    const struct mge_peer *peers; /* rank 0 of world > 1: every rank's worker, rank order */
    size_t n_peers;
    const char *gpu_ids; /* this worker's GPUs the rank gets ("0,1"), NULL or "" for none */
};

struct mge_rank {
    /* identity, fixed at creation */
    int64_t job_id;
    int attempt, rank, world;
    char *spec_yaml;         /* owned */
    char *resume;            /* owned, NULL for none */
    char *launch_token;      /* owned, NULL for single-rank attempts */
    struct mge_peer *peers;  /* owned (and their strings); rank 0 of world > 1 only */
    size_t n_peers;
    char gpu_ids[200]; /* the scheduler's GPU indexes ("0,1"), "" for none */
    /* [mu] */
    char *command;           /* owned: the orted command a LaunchRequest handed us (rank > 0) */
    enum mge_rank_state state;
    int pid;
    int exit_code, term_signal;
    char failure[256];       /* worker-side reason ("" if none) */
    bool worker_fault;       /* @failure is this worker's (disk, spawn), not the job's */
    bool cancel_requested;
    bool ckpt_requested; /* rank 0: the coordinator wants a checkpoint now (SIGUSR2) */
    int grace_ms;
    bool exit_acked;         /* the coordinator stored the exit */
    struct mge_out_line *lines; /* unacked output, oldest first */
    size_t n_lines, cap_lines;
    uint64_t next_seq;       /* seq of the next line */
    uint64_t dropped;        /* log lines dropped because the buffer was full */
    /* checkpoint replication (rank 0 only; the link thread moves the bytes) */
    char *resume_copy;        /* owned: the coordinator's copy to fetch first, NULL for none */
    bool fetch_wanted;        /* the rank waits for resume_copy to be fetched before it starts */
    int64_t ckpt_new_step;    /* newest checkpoint seen in out_dir (0 none) ... */
    char ckpt_new_path[1100]; /* ... and its path */
    int64_t ckpt_up_step;     /* newest one uploaded or given up on */
    /* [loop] */
    bool spawned, killed, proc_exited, closing;
    int open_handles;        /* uv handles not yet closed */
    uv_process_t proc;
    uv_pipe_t out, err;
    uv_timer_t kill_timer;
    char *part[2];           /* partial line of stdout, stderr */
    size_t part_len[2];
    char out_dir[1024];
    char mpi_tmp[512]; /* the private TMPDIR of mpirun or orted and its session dir ("" none) */
    int64_t last_ckpt_scan;  /* monotonic ms */
    int64_t last_ckpt_step;  /* highest checkpoint step reported */
    struct mge_ranks *owner;
};

struct mge_ranks_opts {
    const char *train_bin;   /* mge-train (or a stand-in for tests) */
    const char *mpirun_bin;  /* Open MPI's mpirun, for multi-rank attempts; NULL: refuse them */
    const char *launch_bin;  /* mge-launch (absolute path): mpirun's plm_rsh_agent */
    const char *mpi_if;      /* CIDR the job's MPI traffic uses (oob and btl tcp), or NULL */
    const char *work_dir;    /* job directories go under it */
    int gpus;                /* GPUs this worker offers: when > 0, every rank gets its
                              * CUDA_VISIBLE_DEVICES (its Assign's gpu_ids, "" for none) */
    const struct mge_data_roots *data_roots; /* data paths must lie under one; passed to
                                              * every rank in MGE_DATA_ROOTS, checked there
                                              * on the file opened */
};

struct mge_ranks {
    pthread_mutex_t mu;
    struct mge_rank **r;     /* [mu] */
    size_t n, cap;           /* [mu] */
    uv_loop_t *loop;
    uv_async_t async;        /* wakes the loop: new assigns, cancels, acks */
    struct mge_ranks_opts opts;
    /* called (without mu) when there is something new to send: lines or an exit */
    void (*on_output)(void *arg);
    void *on_output_arg;
    bool stopping;           /* [loop] */
};

/* Set up on @loop (the loop thread). Strings in @opts are borrowed and must outlive @rs. */
int mge_ranks_init(struct mge_ranks *rs, uv_loop_t *loop, const struct mge_ranks_opts *opts);
/* Kill every rank (SIGKILL to its group) and close the handles; run the loop after it. */
void mge_ranks_stop(struct mge_ranks *rs);
/* Free the table; after the loop has finished. */
void mge_ranks_fini(struct mge_ranks *rs);

/*
 * Any thread, mu NOT held. Add a rank to start (ignored when it is already known). Everything
 * in @a is copied. A rank > 0 of a multi-rank attempt waits for mge_ranks_launch().
 */
int mge_ranks_assign(struct mge_ranks *rs, const struct mge_rank_assign *a);

/*
 * Any thread, mu NOT held. Start @command (through sh -c) as rank @rank of (@job_id,
 * @attempt), which must be a rank > 0 of a multi-rank attempt assigned here, waiting, with
 * launch token @token. On failure writes the reason into @why: MGE_NOENT (no such rank here),
 * MGE_AUTH (wrong token), MGE_STATE (already launched, cancelled or ended), MGE_NOMEM.
 */
int mge_ranks_launch(struct mge_ranks *rs, int64_t job_id, int attempt, int rank,
                     const char *token, const char *command, char *why, size_t why_len);
/* Cancel the ranks of @job_id (@attempt 0: every attempt). Any thread, mu NOT held. */
void mge_ranks_cancel(struct mge_ranks *rs, int64_t job_id, int attempt, int grace_ms);
/* Ask rank 0 of (@job_id, @attempt), if it runs here, for a checkpoint at its next step
 * boundary: its process (mge-train, or the guard of mpirun, which passes it on to every rank)
 * gets SIGUSR2. Unknown or ended ranks: nothing. Any thread, mu NOT held; mge_ranks_wake()
 * after. */
void mge_ranks_checkpoint(struct mge_ranks *rs, int64_t job_id, int attempt);
/* Drop lines up to @seq; record the exit ack. Any thread, mu NOT held. */
void mge_ranks_ack(struct mge_ranks *rs, int64_t job_id, int attempt, int rank, uint64_t seq,
                   bool exit_acked);
/* A checkpoint file to move between this worker and the coordinator's store. */
struct mge_ckpt_ref {
    int64_t job_id;
    int attempt;
    int64_t step;
    char name[40];   /* "ckpt-<step>.mgeckpt" */
    char path[1100]; /* upload: the file; fetch: the directory to put it in (created) */
};

/*
 * Any thread, mu NOT held. The newest checkpoint of a rank 0 here that is newer than what was
 * uploaded of it: into *@out, true; false when there is none.
 */
bool mge_ranks_upload_next(struct mge_ranks *rs, struct mge_ckpt_ref *out);
/* Any thread, mu NOT held. Checkpoint @step of (@job_id, @attempt) is uploaded (or given up). */
void mge_ranks_upload_done(struct mge_ranks *rs, int64_t job_id, int attempt, int64_t step);
/*
 * Any thread, mu NOT held. A rank 0 here that waits for the coordinator's copy of a checkpoint:
 * its job, attempt and the copy's name into *@out, and its output directory (created) as
 * @out->path; true. False when none waits.
 */
bool mge_ranks_fetch_next(struct mge_ranks *rs, struct mge_ckpt_ref *out);
/*
 * Any thread, mu NOT held. The fetch for (@job_id, @attempt) rank 0 is over: @path is the
 * verified copy to resume from, or NULL when it failed (@why says why, in the job's log; the
 * rank then starts as if it had no checkpoint). The rank may start now (wakes the loop).
 */
void mge_ranks_fetch_done(struct mge_ranks *rs, int64_t job_id, int attempt, const char *path,
                          const char *why);

/* Wake the loop to act on the table. Any thread. */
void mge_ranks_wake(struct mge_ranks *rs);

/*
 * Check the data paths of @spec_yaml against @opts->data_roots, before a rank starts: each is
 * opened (mge_data_open: no FIFO can hang it) and its real path checked, then closed. This is
 * the early, friendly refusal; what holds is the same check where mge-train opens the file.
 * On failure writes the reason into @why and returns false. Thread: any.
 */
bool mge_ranks_data_paths_ok(const struct mge_ranks_opts *opts, const char *spec_yaml, char *why,
                             size_t why_len);

#endif
