/*
 * link_frame.h: sealing a request of the worker link (see LinkFrame in proto/worker.proto) as
 * mge-worker sends it. One piece of code for the worker, its load generator and the fuzz target.
 */
#ifndef MGE_WORKER_LINK_FRAME_H
#define MGE_WORKER_LINK_FRAME_H

#include <stddef.h>
#include <stdint.h>

/*
 * Wrap @body (a packed ToCoordinator) into a packed LinkFrame in *@out (mge_malloc'ed, the
 * caller frees it with mge_free; NULL on failure). @worker_id NULL or "": a Register, its MAC
 * made under the join token @secret with the client nonce @nonce. Otherwise frame @counter of
 * session @worker_id, its MAC made under the session key @secret (@nonce unused).
 */
int mge_link_frame_seal(const void *secret, size_t secret_len, const char *worker_id,
                        uint64_t counter, const uint8_t *nonce, size_t nonce_len,
                        const uint8_t *body, size_t body_len, uint8_t **out, size_t *out_len);

#endif
