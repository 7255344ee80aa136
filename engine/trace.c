/* trace.c: the Chrome trace-event writer behind `mge-train --profile FILE` (see trace.h). */
#include "engine/trace.h"

#include <errno.h>
#include <string.h>

#include "common/err.h"

int mge_trace_open(struct mge_trace *tr, const char *path, int pid, double origin)
{
    memset(tr, 0, sizeof(*tr));
    if (!(tr->fp = fopen(path, "w")))
        return MGE_ERR(MGE_IO, "cannot create trace '%s': %s", path, strerror(errno));
    tr->pid = pid;
    tr->origin = origin;
    fprintf(tr->fp, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    fprintf(tr->fp,
            "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"name\":\"rank %d\"}}",
            pid, pid);
    return MGE_OK;
}

void mge_trace_track(struct mge_trace *tr, int tid, const char *name)
{
    if (!tr->fp)
        return;
    fprintf(tr->fp,
            ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
            "\"args\":{\"name\":\"%s\"}}",
            tr->pid, tid, name);
}

void mge_trace_event(struct mge_trace *tr, int tid, const char *name, const char *cat, double t0,
                     double t1, const char *args)
{
    if (!tr->fp)
        return;
    fprintf(tr->fp,
            ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,"
            "\"ts\":%.3f,\"dur\":%.3f,\"args\":{%s}}",
            name, cat, tr->pid, tid, 1e6 * (t0 - tr->origin), 1e6 * (t1 > t0 ? t1 - t0 : 0.0),
            args ? args : "");
    tr->n_events++;
}

int mge_trace_close(struct mge_trace *tr)
{
    if (!tr->fp)
        return MGE_OK;
    fprintf(tr->fp, "\n]}\n");
    int bad = ferror(tr->fp);
    if (fclose(tr->fp) != 0)
        bad = 1;
    tr->fp = NULL;
    return bad ? MGE_ERR(MGE_IO, "cannot write trace") : MGE_OK;
}
