/* log.h: levelled logging to stderr (or a file), thread-safe, one line per call. */
#ifndef MGE_COMMON_LOG_H
#define MGE_COMMON_LOG_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

enum mge_log_level { MGE_LOG_DEBUG, MGE_LOG_INFO, MGE_LOG_WARN, MGE_LOG_ERROR, MGE_LOG_OFF };

/* Set the lowest level printed (default INFO, or $MGE_LOG=debug|info|warn|error|off). */
void mge_log_set_level(enum mge_log_level level);
enum mge_log_level mge_log_get_level(void);

/* Send log lines to @fp instead of stderr (NULL restores stderr). Not owned. */
void mge_log_set_file(FILE *fp);

/* Prefix each line with @tag (e.g. "coordinator"); @tag must outlive the logger. */
void mge_log_set_tag(const char *tag);

void mge_log_at(enum mge_log_level level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define mge_log_debug(...) mge_log_at(MGE_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define mge_log_info(...) mge_log_at(MGE_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define mge_log_warn(...) mge_log_at(MGE_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define mge_log_error(...) mge_log_at(MGE_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
