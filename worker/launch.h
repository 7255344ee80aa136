/*
 * launch.h: a worker's launch socket. mpirun runs a multi-rank attempt from rank 0's worker
 * and starts its daemon (orted) on every other host through mge-launch, its plm_rsh_agent;
 * mge-launch sends a LaunchRequest (proto/worker.proto) to the launch socket of the worker
 * that holds that rank, which starts the command as the rank's process (ranks.h). A request
 * runs something only for a rank this worker holds, of an attempt still waiting for that
 * rank's launch, and only with the attempt's launch token (compared in constant time), which
 * only the attempt's workers were told, in their authenticated Assigns (worker/link.c).
 * Anything else is refused with the reason and runs nothing.
 *
 * TLS: when the worker link is tls+tcp://, the launch socket is too. The worker makes a key
 * pair and a self-signed certificate for "mge-launch" at start (memory only, never on disk)
 * and sends the certificate in its authenticated Register; the coordinator hands it to rank
 * 0's worker with the peers, and mge-launch accepts only that very certificate (it is the
 * whole trust list of its dial). So the launch token never crosses the network in clear and
 * mge-launch hands its command to the worker the coordinator placed the rank on, nobody else.
 *
 * Thread: the socket has one thread of its own; mge_ranks_launch() takes the table's lock.
 */
#ifndef MGE_WORKER_LAUNCH_H
#define MGE_WORKER_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct mge_ranks;
struct mge_launch;

/* The server name in every launch socket's certificate (mge-launch checks it). */
#define MGE_LAUNCH_TLS_NAME "mge-launch"
/* Room for a launch socket's certificate (PEM, NUL included): an ECDSA P-256 one is ~600. */
#define MGE_LAUNCH_CERT_MAX 2048

/*
 * Listen on @listen_url ("tcp://ADDR:PORT", port 0 for any) for @rs (borrowed, must outlive
 * the server). @advertise_host: the host others reach us by when ADDR is 0.0.0.0 (NULL: ADDR).
 * @tls: listen on tls+tcp:// with a certificate made now, whose PEM goes to @cert of
 * MGE_LAUNCH_CERT_MAX bytes (@cert is "" without @tls). The URL to give others (with the port
 * bound; tls+tcp:// with @tls) goes to @url of @url_len bytes. On MGE_OK stop with
 * mge_launch_stop().
 */
int mge_launch_start(const char *listen_url, const char *advertise_host, bool tls,
                     struct mge_ranks *rs, char *url, size_t url_len, char *cert,
                     struct mge_launch **out);
/*
 * The launch socket's address when none is given (--launch-listen), for a worker whose
 * coordinator is @coordinator ("tcp://HOST:PORT"): "tcp://127.0.0.1:0" when HOST is this
 * machine's loopback (one machine), else "tcp://ADDR:0" with ADDR the local address this host
 * reaches HOST from (the route's source address: the address other nodes on that network reach
 * us by; mge_url_route_source()). Into @url of @len bytes. Returns MGE_OK, or the error of
 * mge_url_route_source() (logged), with the loopback default in @url. Thread: any.
 */
int mge_launch_default_url(const char *coordinator, char *url, size_t len);
/* Call @kick(@arg) from the socket's thread when a request names a rank this worker does not
 * hold (yet): the worker's link then asks the coordinator for its commands at once
 * (mge_link_kick), so an Assign still on its way arrives before mge-launch asks again. */
void mge_launch_set_kick(struct mge_launch *l, void (*kick)(void *), void *arg);
/* Stop the thread, close the socket, free; NULL does nothing. */
void mge_launch_stop(struct mge_launch *l);

/*
 * Handle one LaunchRequest frame (@buf, @len: untrusted bytes) for @rs and pack the
 * LaunchReply into *@reply (mge_malloc'ed, caller frees) of *@reply_len bytes. Returns the
 * result of mge_ranks_launch() (MGE_NOENT: no such rank here yet, the reply says
 * unknown_rank), or MGE_PROTO for a frame that does not parse, MGE_NOMEM when no reply could be
 * made (*@reply NULL). Any thread; never crashes on any input (fuzzed).
 */
int mge_launch_handle(struct mge_ranks *rs, const uint8_t *buf, size_t len, uint8_t **reply,
                      size_t *reply_len);

#endif
