/*
 * trace.h: Chrome trace-event JSON (chrome://tracing, Perfetto) for `mge-train --profile`:
 * complete events ("ph":"X") on named tracks, written as they come, one file per rank.
 */
#ifndef MGE_ENGINE_TRACE_H
#define MGE_ENGINE_TRACE_H

#include <stdio.h>

struct mge_trace {
    FILE *fp;
    int pid;       /* the rank: each rank is one process in the viewer */
    double origin; /* CLOCK_MONOTONIC seconds at time 0 of the trace */
    int n_events;
};

/*
 * Create @path and start the JSON; @pid names the process (the rank), @origin is time 0.
 * Returns MGE_OK or MGE_IO (logged). Close with mge_trace_close() (caller-owned @tr).
 */
int mge_trace_open(struct mge_trace *tr, const char *path, int pid, double origin);
/* Name track @tid (one row in the viewer), e.g. "compute", "comm". */
void mge_trace_track(struct mge_trace *tr, int tid, const char *name);
/*
 * One event from @t0 to @t1 (CLOCK_MONOTONIC seconds) on track @tid. @name and @cat are
 * JSON-safe literals; @args is NULL or the inside of a JSON object ("\"bytes\":4096").
 */
void mge_trace_event(struct mge_trace *tr, int tid, const char *name, const char *cat, double t0,
                     double t1, const char *args);
/* Finish the JSON and close; MGE_OK or MGE_IO. A zeroed @tr does nothing. */
int mge_trace_close(struct mge_trace *tr);

#endif
