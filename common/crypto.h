/*
 * crypto.h: the few cryptographic primitives mge needs, over OpenSSL's libcrypto: HMAC-SHA256,
 * random bytes, a constant-time compare, and the MACs and session keys of the worker link
 * (proto/worker.proto: LinkFrame, LinkReply), so that the coordinator, the worker and the
 * tools that speak to them compute them in one place.
 * Thread: every function may be called from any thread.
 */
#ifndef MGE_COMMON_CRYPTO_H
#define MGE_COMMON_CRYPTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MGE_HMAC_LEN 32  /* HMAC-SHA256 output, bytes */
#define MGE_NONCE_LEN 32 /* worker link nonces, bytes */

/* One piece of a message to MAC (@p may be NULL when @n is 0). */
struct mge_span {
    const void *p;
    size_t n;
};

/*
 * HMAC-SHA256 with key @key (@key_len bytes) over the concatenation of @parts[0..@n_parts)
 * into @out. MGE_OK, or MGE_INTERNAL when libcrypto fails (logged).
 */
int mge_hmac_sha256(const void *key, size_t key_len, const struct mge_span *parts, size_t n_parts,
                    uint8_t out[MGE_HMAC_LEN]);

/* @n bytes from the operating system's CSPRNG into @buf. MGE_OK or MGE_INTERNAL. */
int mge_random_bytes(void *buf, size_t n);

/*
 * Constant-time comparison of secret @want (@want_len bytes) with untrusted @got (@got_len
 * bytes): true when they are equal. The time depends on @want_len only, never on where the
 * bytes differ nor on @got_len. Every secret of mge is compared with it (API tokens, the join
 * token, launch tokens, MACs).
 */
bool mge_ct_equal(const void *want, size_t want_len, const void *got, size_t got_len);

/* What a worker link MAC authenticates; each has its own label, so none stands for another. */
enum mge_link_mac_kind {
    MGE_LINK_MAC_REGISTER, /* a Register frame, keyed with the join token */
    MGE_LINK_MAC_REQUEST,  /* any later frame of the worker, keyed with the session key */
    MGE_LINK_MAC_REPLY,    /* a reply of the coordinator, keyed with the session key */
};

/*
 * The MAC of one worker link message: HMAC-SHA256(@key, label || u64be(@counter) ||
 * u32be(len(@worker_id)) || @worker_id || u32be(@nonce_len) || @nonce || @body) into @mac.
 * @worker_id may be "" (a Register), @nonce NULL with @nonce_len 0. MGE_OK or MGE_INTERNAL.
 */
int mge_link_mac(enum mge_link_mac_kind kind, const void *key, size_t key_len,
                 const char *worker_id, uint64_t counter, const uint8_t *nonce, size_t nonce_len,
                 const uint8_t *body, size_t body_len, uint8_t mac[MGE_HMAC_LEN]);

/*
 * The session key of a worker link session: HMAC-SHA256(@join_token, "mge-session" ||
 * u32be(len(@worker_id)) || @worker_id || @client_nonce || @server_nonce) into @key. Both
 * sides derive it; it never crosses the wire. MGE_OK or MGE_INTERNAL.
 */
int mge_link_session_key(const char *join_token, const char *worker_id,
                         const uint8_t client_nonce[MGE_NONCE_LEN],
                         const uint8_t server_nonce[MGE_NONCE_LEN], uint8_t key[MGE_HMAC_LEN]);

#ifdef __cplusplus
}
#endif

#endif
