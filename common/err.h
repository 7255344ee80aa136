/* err.h: the one error enum of mge, its messages, and MGE_ERR for logging where an error starts. */
#ifndef MGE_COMMON_ERR_H
#define MGE_COMMON_ERR_H

#ifdef __cplusplus
extern "C" {
#endif

/*
 * X-macro table: name, message. The enum and mge_strerror() are both made
 * from it, so they cannot drift apart (libuv's UV_ERRNO_MAP).
 */
#define MGE_ERR_MAP(X)                                                 \
    X(OK, "success")                                                   \
    X(NOMEM, "out of memory")                                          \
    X(INVAL, "invalid argument")                                       \
    X(IO, "input/output error")                                        \
    X(NOENT, "no such file or object")                                 \
    X(FORMAT, "malformed input")                                       \
    X(SPEC, "invalid job spec")                                        \
    X(CORRUPT, "corrupt data")                                         \
    X(RANGE, "value out of range")                                     \
    X(UNSUPPORTED, "not supported")                                    \
    X(DEVICE, "device error")                                          \
    X(BUDGET, "memory budget too small")                               \
    X(STATE, "operation not valid in this state")                      \
    X(EXISTS, "already exists")                                        \
    X(AUTH, "not authorised")                                          \
    X(FORBIDDEN, "forbidden")                                          \
    X(TOOBIG, "too large")                                             \
    X(DB, "database error")                                            \
    X(NET, "network error")                                            \
    X(TIMEOUT, "timed out")                                            \
    X(PROTO, "protocol error")                                         \
    X(COMM, "collective communication error")                          \
    X(CANCELLED, "cancelled")                                          \
    X(INTERNAL, "internal error")

enum mge_err {
#define MGE__ERR_ENUM(name, msg) MGE_##name,
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

/*
 * Log "file:line: message" once at error level and return @code.
 * Use at the place an error starts: `return MGE_ERR(MGE_IO, "cannot open '%s'", path);`
 */
int mge__err_log(int code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define MGE_ERR(code, ...) mge__err_log((code), __FILE__, __LINE__, __VA_ARGS__)

/* Our own bugs only; never for bad input. Logs and aborts. */
void mge__assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define MGE_ASSERT(e) ((e) ? (void)0 : mge__assert_fail(#e, __FILE__, __LINE__))

#ifdef __cplusplus
}
#endif
#endif
