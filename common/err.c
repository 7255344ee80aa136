/* err.c: error names and messages from the MGE_ERR_MAP table, and the MGE_ERR logger. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "log.h"

const char *mge_strerror(int err)
{
    static const char *const msgs[] = {
#define MGE__ERR_MSG(name, msg) msg,
        MGE_ERR_MAP(MGE__ERR_MSG)
#undef MGE__ERR_MSG
    };
    if (err < 0 || err >= MGE_ERR__COUNT)
        return "unknown error";
    return msgs[err];
}

const char *mge_errname(int err)
{
    static const char *const names[] = {
#define MGE__ERR_NAME(name, msg) #name,
        MGE_ERR_MAP(MGE__ERR_NAME)
#undef MGE__ERR_NAME
    };
    if (err < 0 || err >= MGE_ERR__COUNT)
        return "UNKNOWN";
    return names[err];
}

int mge__err_log(int code, const char *file, int line, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    mge_log_at(MGE_LOG_DEBUG, file, line, "%s (%s)", buf, mge_errname(code));
    return code;
}

void mge__assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, expr);
    abort();
}
