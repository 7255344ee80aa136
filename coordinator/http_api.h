/*
 * http_api.h: the REST API of mge-coordinator on libmicrohttpd (thread pool + epoll),
 * under /api/v1, plus /healthz and /metrics (Prometheus); every other GET is a file of the
 * web dashboard (coordinator/web/, built into $(BUILD)/web) under the web root. docs/api/openapi.yaml is the
 * reference of every route. Errors are application/problem+json bodies.
 * Server-sent events (/jobs/{id}/events) use suspended connections, so no pool thread ever
 * blocks waiting for events; an event's id is its row id in the store (exact resume).
 */
#ifndef MGE_COORDINATOR_HTTP_API_H
#define MGE_COORDINATOR_HTTP_API_H

#include <jansson.h>
#include <stddef.h>

#include "planner.h"

struct mge_http;
struct mge_store;
struct mge_sched;
struct mge_auth;
struct mge_rpc;
struct mge_jobspec;

#define MGE_HTTP_BODY_MAX (1024 * 1024) /* request bodies above this get 413 */

struct mge_http_opts {
    const char *host;        /* "127.0.0.1" */
    int port;                /* 0: the kernel picks; see mge_http_port() */
    int threads;             /* pool size (default 4) */
    const char *web_root;    /* dashboard files served at / (NULL or missing: not served) */
    const char *tls_cert;    /* PEM text (not a path; see tls.h): serve HTTPS only, or NULL */
    const char *tls_key;     /* its key's PEM text, with tls_cert */
    struct mge_planner_opts planner; /* a job's memory plan at submit (bin NULL: off; the
                                        strings are borrowed: they outlive the server) */
};

/*
 * Start serving. @st, @sched, @auth and @rpc are borrowed and must outlive the server
 * (@rpc may be NULL). On MGE_OK stop with mge_http_stop().
 */
int mge_http_start(const struct mge_http_opts *opts, struct mge_store *st, struct mge_sched *sched,
                   const struct mge_auth *auth, struct mge_rpc *rpc, struct mge_http **out);
/* Stop and free; NULL does nothing. */
void mge_http_stop(struct mge_http *h);
/* The port actually bound. */
int mge_http_port(const struct mge_http *h);

/*
 * Parse a job submission body (what POST /api/v1/jobs does before storing it; exposed for
 * fuzzing). @content_type may be NULL. On MGE_OK *@spec is a new spec (mge_jobspec_free).
 * Otherwise *@problem is a new problem object (json_decref) and *@status its HTTP status.
 */
int mge_http_parse_job(const char *content_type, const char *body, size_t len,
                       const char *const *overrides, int n_overrides, struct mge_jobspec **spec,
                       json_t **problem, int *status);

#endif
