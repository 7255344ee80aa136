/* err.c: error names and messages from the MGE_ERR_MAP table, and the MGE_ERR logger. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "log.h"

const char *mge_strerror(int err)
{
    static const char *const msgs[] = {
#define MGE__ERR_MSG(name, msg, fault) msg,
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
#define MGE__ERR_NAME(name, msg, fault) #name,
        MGE_ERR_MAP(MGE__ERR_NAME)
#undef MGE__ERR_NAME
    };
    if (err < 0 || err >= MGE_ERR__COUNT)
        return "UNKNOWN";
    return names[err];
}

bool mge_err_is_system(int err)
{
    static const bool sys[] = {
#define MGE__ERR_SYS(name, msg, fault) MGE__ERR_FAULT_##fault,
#define MGE__ERR_FAULT_SYS true
#define MGE__ERR_FAULT_USER false
        MGE_ERR_MAP(MGE__ERR_SYS)
#undef MGE__ERR_FAULT_USER
#undef MGE__ERR_FAULT_SYS
#undef MGE__ERR_SYS
    };
    if (err < 0 || err >= MGE_ERR__COUNT)
        return true; /* not one of ours: a bug somewhere */
    return sys[err];
}

int mge__err_log(int code, const char *file, int line, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    mge_log_at(mge_err_is_system(code) ? MGE_LOG_ERROR : MGE_LOG_INFO, file, line, "%s (%s)", buf,
               mge_errname(code));
    return code;
}

int mge__err_fill(int code, char *err, size_t errlen, const char *file, int line, const char *fmt,
                  ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (err && errlen)
        snprintf(err, errlen, "%s", buf);
    return mge__err_log(code, file, line, "%s", buf);
}

void mge__assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, expr);
    abort();
}
