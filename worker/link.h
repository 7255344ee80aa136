/*
 * link.h: mge-worker's link to the coordinator: an NNG REQ socket that registers and then
 * heartbeats (running ranks, batched output lines), a SUB socket on which the coordinator
 * wakes it, and a thread that runs both. Reconnects with backoff and re-registers as needed;
 * lines stay buffered in the rank table until acked, so none is lost or sent twice into the
 * store (the coordinator dedups by (job, attempt, rank, seq)). Every frame is authenticated
 * (LinkFrame in proto/worker.proto): the Register proves the join token without sending it, and
 * only replies that carry the session's MAC and our counter are applied.
 */
#ifndef MGE_WORKER_LINK_H
#define MGE_WORKER_LINK_H

#include <stdint.h>

struct mge_gpu;
struct mge_ranks;
struct mge_link;

struct mge_link_opts {
    const char *coordinator; /* "tcp://127.0.0.1:7070" */
    const char *join_token;  /* proven in every Register, never sent */
    const char *name, *host, *version;
    const char *launch_url;  /* the launch socket (launch.h), NULL if none */
    const char *launch_cert; /* its certificate (PEM) when tls+tcp://, else NULL or "" */
    int cpus, gpus;
    const struct mge_gpu *gpu; /* @gpus of them, in index order (common/gpu.h) */
    int64_t memory_mb;
    int heartbeat_ms;        /* default 1000 (the coordinator may ask for another) */
    const char *cacert;      /* CA file (PEM) a tls+tcp:// coordinator's certificate must
                              * verify against, with its host as the name; NULL: tcp:// only */
};

/*
 * Start the link thread over @rs (borrowed). Strings in @opts are borrowed and must outlive
 * the link. On MGE_OK stop with mge_link_stop().
 */
int mge_link_start(const struct mge_link_opts *opts, struct mge_ranks *rs, struct mge_link **out);
/* Stop the thread, close sockets, free; NULL does nothing. */
void mge_link_stop(struct mge_link *l);
/* Something new to send (the rank table's on_output hook; @arg is the link). Any thread. */
void mge_link_kick(void *arg);

#endif
