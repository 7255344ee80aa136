/*
 * rpc.h: the worker link of mge-coordinator: an NNG REP socket (--worker-listen) answering
 * protobuf-c frames from proto/worker.proto, and a PUB socket that wakes a worker when it
 * has commands waiting. Register and Heartbeat requests are handled on one thread; every
 * reply carries the worker's queued Assign/Cancel commands and the acks of what was stored.
 * Every frame is authenticated (LinkFrame in proto/worker.proto): a Register proves the join
 * token, later frames carry a MAC under the session key and a strictly increasing counter.
 * Sessions live in memory only: after a restart every worker registers again.
 */
#ifndef MGE_COORDINATOR_RPC_H
#define MGE_COORDINATOR_RPC_H

#include <stddef.h>
#include <stdint.h>

struct mge_rpc;
struct mge_store;
struct mge_sched;

struct mge_rpc_opts {
    const char *listen_url;  /* "tcp://127.0.0.1:7071" */
    const char *join_token;  /* workers must prove it (borrowed, must outlive the rpc) */
    int heartbeat_ms;        /* interval asked of workers (default 1000) */
    const char *ckpt_dir;    /* checkpoint store (absolute path, borrowed), NULL: uploads are
                              * refused (coordinator/ckpt_store.h) */
    const char *tls_cert;    /* PEM text of the certificate and key (tls.h) a tls+tcp://
                              * listen_url serves with (its notify port too); NULL: none */
    const char *tls_key;
};

/*
 * Bind the worker port. The notify port and the thread come with mge_rpc_start(). On MGE_OK free with
 * mge_rpc_free(). @st is borrowed.
 */
int mge_rpc_new(const struct mge_rpc_opts *opts, struct mge_store *st, struct mge_rpc **out);

/* Use scheduler @s (borrowed) without starting the thread (for fuzzing frames). */
int mge_rpc_set_sched(struct mge_rpc *r, struct mge_sched *s);

/* Bind the notify port (ephemeral: call it after binding every fixed port) and start serving
 * with scheduler @s (borrowed). */
int mge_rpc_start(struct mge_rpc *r, struct mge_sched *s);

/* Stop the thread (the sockets stay open, so notify still works); idempotent. */
void mge_rpc_stop(struct mge_rpc *r);

/* Stop the thread, close the sockets and free; NULL does nothing. */
void mge_rpc_free(struct mge_rpc *r);

/* Wake worker @worker_id (the scheduler's notify hook; @arg is the mge_rpc). Any thread. */
void mge_rpc_notify(void *arg, const char *worker_id);

/*
 * Handle one request frame (a packed LinkFrame) and build the reply (a packed LinkReply):
 * what the thread does per message; exposed for fuzzing. A frame with a bad MAC, a replayed
 * counter or an unknown session is refused (the reply then carries the error, no mac) and
 * nothing of it is used. *@reply is mge_malloc'ed (caller frees) and always set on MGE_OK;
 * on an error (no memory, libcrypto failure) it is NULL and nothing is sent. Never crashes on
 * any input. Thread: the rpc thread only (or the caller's, when the thread is not started).
 */
int mge_rpc_handle_frame(struct mge_rpc *r, const uint8_t *buf, size_t len, uint8_t **reply,
                         size_t *reply_len);

/* The worker URL with the port actually bound ("tcp://127.0.0.1:40123"). */
const char *mge_rpc_listen_url(const struct mge_rpc *r);

/* Requests handled so far (for /metrics). */
uint64_t mge_rpc_requests(const struct mge_rpc *r);

#endif
