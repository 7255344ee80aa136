/*
 * procstat.h: what the kernel says about a rank's processes, for the coordinator's progress
 * watchdog. A rank runs as one session (the worker starts it with setsid(): mge-train, or
 * mpirun or an orted with their children, which Open MPI puts in process groups of their own
 * but leaves in the session); when a job stops making progress, the session with a stopped
 * process (SIGSTOP, a debugger) or that burns no CPU while its peers spin in a collective is
 * the one that hangs.
 *
 * Linux only: reads /proc/<pid>/stat of every process. Thread: any (no shared state).
 */
#ifndef MGE_WORKER_PROCSTAT_H
#define MGE_WORKER_PROCSTAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One process group: @pgid set by the caller, the rest filled by mge_procstat_sessions(). */
struct mge_session_stat {
    int sid;
    int n_procs;    /* live processes in the group */
    bool stopped;   /* at least one of them is stopped (state T or t) */
    int64_t cpu_ms; /* user + system CPU time of the live processes, ms */
};

/*
 * Fill @g[0..@n) in one pass over /proc. Sessions with no live process get n_procs 0. Returns
 * MGE_OK, or MGE_IO when /proc cannot be read (then every session reads as empty).
 */
int mge_procstat_sessions(struct mge_session_stat *g, size_t n);

/*
 * Parse the text of one /proc/<pid>/stat (@text, NUL-terminated) into its state character,
 * session id and utime + stime in clock ticks. False when it does not parse.
 */
bool mge_procstat_parse(const char *text, char *state, int *sid, int64_t *ticks);

#endif
