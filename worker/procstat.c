/* procstat.c: sessions' state and CPU time from /proc (see procstat.h). */
#include "procstat.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"

bool mge_procstat_parse(const char *text, char *state, int *sid, int64_t *ticks)
{
    /* "pid (comm) S ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
     * stime ...": comm may hold spaces and parentheses, so start after the last ')' */
    const char *p = strrchr(text, ')');
    long long f[13];
    char st;
    if (!p ||
        sscanf(p + 1, " %c %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld", &st, &f[0],
               &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7], &f[8], &f[9], &f[10], &f[11]) != 13)
        return false;
    *state = st;
    *sid = (int)f[2]; /* ppid, pgrp, session, tty, tpgid, flags, 4 faults, utime, stime */
    *ticks = f[10] + f[11];
    return true;
}

int mge_procstat_sessions(struct mge_session_stat *g, size_t n)
{
    DIR *d;
    struct dirent *e;
    long hz = sysconf(_SC_CLK_TCK);
    for (size_t i = 0; i < n; i++) {
        g[i].n_procs = 0;
        g[i].stopped = false;
        g[i].cpu_ms = 0;
    }
    if (n == 0)
        return MGE_OK;
    if (!(d = opendir("/proc")))
        return MGE_IO;
    while ((e = readdir(d)) != NULL) {
        char path[300], buf[1024], st;
        int fd, sid;
        int64_t t;
        ssize_t len;
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            continue; /* it exited meanwhile */
        len = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (len <= 0)
            continue;
        buf[len] = '\0';
        if (!mge_procstat_parse(buf, &st, &sid, &t) || st == 'Z' || st == 'X')
            continue;
        for (size_t i = 0; i < n; i++) {
            if (g[i].sid != sid)
                continue;
            g[i].n_procs++;
            g[i].stopped |= st == 'T' || st == 't';
            g[i].cpu_ms += t; /* ticks until the end */
        }
    }
    closedir(d);
    for (size_t i = 0; i < n; i++)
        g[i].cpu_ms = hz > 0 ? g[i].cpu_ms * 1000 / hz : 0;
    return MGE_OK;
}
