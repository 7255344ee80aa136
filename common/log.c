/* log.c: levelled, timestamped log lines; one fprintf per line so threads do not interleave. */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static enum mge_log_level log_level = MGE_LOG_INFO;
static int log_level_set;
static FILE *log_fp;
static const char *log_tag;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

static enum mge_log_level log_level_from_env(void)
{
    const char *s = getenv("MGE_LOG");
    if (!s)
        return MGE_LOG_INFO;
    if (!strcmp(s, "debug"))
        return MGE_LOG_DEBUG;
    if (!strcmp(s, "warn"))
        return MGE_LOG_WARN;
    if (!strcmp(s, "error"))
        return MGE_LOG_ERROR;
    if (!strcmp(s, "off"))
        return MGE_LOG_OFF;
    return MGE_LOG_INFO;
}

void mge_log_set_level(enum mge_log_level level)
{
    log_level = level;
    log_level_set = 1;
}

enum mge_log_level mge_log_get_level(void)
{
    if (!log_level_set) {
        log_level = log_level_from_env();
        log_level_set = 1;
    }
    return log_level;
}

void mge_log_set_file(FILE *fp) { log_fp = fp; }

void mge_log_set_tag(const char *tag) { log_tag = tag; }

void mge_log_at(enum mge_log_level level, const char *file, int line, const char *fmt, ...)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    char msg[2048];
    char ts[32];
    struct timespec now;
    struct tm tm;
    va_list ap;

    if (level < mge_log_get_level() || level >= MGE_LOG_OFF)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    pthread_mutex_lock(&log_mu);
    fprintf(log_fp ? log_fp : stderr, "%s.%03ldZ %s%s%s %s:%d: %s\n", ts, now.tv_nsec / 1000000L,
            log_tag ? log_tag : "", log_tag ? " " : "", names[level], file, line, msg);
    fflush(log_fp ? log_fp : stderr);
    pthread_mutex_unlock(&log_mu);
}
