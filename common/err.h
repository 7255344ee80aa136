/* err.h: the one error enum of mge, its messages, and MGE_ERR for logging where an error starts. */
#ifndef MGE_COMMON_ERR_H
#define MGE_COMMON_ERR_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * X-macro table: name, message, and who is at fault, which sets the level MGE_ERR logs at:
 *   SYS  the system failed (memory, disk, database, network, device, our own code): logged at
 *        error level, because an operator must see it;
 *   USER a request, file or spec was refused for what it asked (bad values, unknown names,
 *        limits, permissions, wrong state): logged at info level, because the refusal already
 *        goes back to whoever sent it (an HTTP problem, a CLI message, a job's failure reason)
 *        and a stranger must not be able to fill the operator's log with errors.
 * The enum and mge_strerror() are both made from it, so they cannot drift apart (libuv's
 * UV_ERRNO_MAP).
 */
#define MGE_ERR_MAP(X)                                                 \
    X(OK, "success", USER)                                             \
    X(NOMEM, "out of memory", SYS)                                     \
    X(INVAL, "invalid argument", USER)                                 \
    X(IO, "input/output error", SYS)                                   \
    X(NOENT, "no such file or object", USER)                           \
    X(FORMAT, "malformed input", USER)                                 \
    X(SPEC, "invalid job spec", USER)                                  \
    X(CORRUPT, "corrupt data", SYS)                                    \
    X(RANGE, "value out of range", USER)                               \
    X(UNSUPPORTED, "not supported", USER)                              \
    X(DEVICE, "device error", SYS)                                     \
    X(BUDGET, "memory budget too small", USER)                         \
    X(STATE, "operation not valid in this state", USER)                \
    X(EXISTS, "already exists", USER)                                  \
    X(AUTH, "not authorised", USER)                                    \
    X(FORBIDDEN, "forbidden", USER)                                    \
    X(TOOBIG, "too large", USER)                                       \
    X(DB, "database error", SYS)                                       \
    X(NET, "network error", SYS)                                       \
    X(TIMEOUT, "timed out", SYS)                                       \
    X(PROTO, "protocol error", SYS)                                    \
    X(COMM, "collective communication error", SYS)                     \
    X(CANCELLED, "cancelled", USER)                                    \
    X(INTERNAL, "internal error", SYS)

enum mge_err {
#define MGE__ERR_ENUM(name, msg, fault) MGE_##name,
    MGE_ERR_MAP(MGE__ERR_ENUM)
#undef MGE__ERR_ENUM
    MGE_ERR__COUNT
};

/* MGE_OK is 0; every other value is an error. */
#define MGE_ERR_OK MGE_OK

/* Human-readable text for @err; never NULL, static storage. */
const char *mge_strerror(int err);

/* Short identifier for @err ("NOMEM"), static storage. */
const char *mge_errname(int err);

/* Whether @err is the system's fault (SYS in MGE_ERR_MAP) rather than the request's. */
bool mge_err_is_system(int err);

/*
 * Log "file:line: message (NAME)" once and return @code: at error level when @code is the
 * system's fault, at info level when it refuses a request (see MGE_ERR_MAP).
 * Use at the place an error starts: `return MGE_ERR(MGE_IO, "cannot open '%s'", path);`
 */
int mge__err_log(int code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define MGE_ERR(code, ...) mge__err_log((code), __FILE__, __LINE__, __VA_ARGS__)

/*
 * As MGE_ERR, and also write the message (without the code's name) to @err, @errlen bytes
 * (neither written when @err is NULL or @errlen 0), for functions that hand their caller the
 * text: `return MGE_ERR_FILL(MGE_FORMAT, err, errlen, "%s: bad header", path);`
 */
int mge__err_fill(int code, char *err, size_t errlen, const char *file, int line, const char *fmt,
                  ...) __attribute__((format(printf, 6, 7)));
#define MGE_ERR_FILL(code, err, errlen, ...)                                                       \
    mge__err_fill((code), (err), (errlen), __FILE__, __LINE__, __VA_ARGS__)

/* Our own bugs only; never for bad input. Logs and aborts. */
void mge__assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define MGE_ASSERT(e) ((e) ? (void)0 : mge__assert_fail(#e, __FILE__, __LINE__))

#ifdef __cplusplus
}
#endif
#endif
