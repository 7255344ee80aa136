/* link_frame.c: see link_frame.h. */
#include "worker/link_frame.h"

#include "common/alloc.h"
#include "common/crypto.h"
#include "common/err.h"
#include "proto/worker.pb-c.h"

int mge_link_frame_seal(const void *secret, size_t secret_len, const char *worker_id,
                        uint64_t counter, const uint8_t *nonce, size_t nonce_len,
                        const uint8_t *body, size_t body_len, uint8_t **out, size_t *out_len)
{
    Mge__LinkFrame f = MGE__LINK_FRAME__INIT;
    uint8_t mac[MGE_HMAC_LEN];
    int rc;
    *out = NULL;
    *out_len = 0;
    f.body.data = (uint8_t *)body;
    f.body.len = body_len;
    if (!worker_id || !*worker_id) {
        rc = mge_link_mac(MGE_LINK_MAC_REGISTER, secret, secret_len, "", 0, nonce, nonce_len, body,
                          body_len, mac);
        f.nonce.data = (uint8_t *)nonce;
        f.nonce.len = nonce_len;
    } else {
        f.worker_id = (char *)worker_id;
        f.counter = counter;
        rc = mge_link_mac(MGE_LINK_MAC_REQUEST, secret, secret_len, worker_id, counter, NULL, 0,
                          body, body_len, mac);
    }
    if (rc != MGE_OK)
        return rc;
    f.mac.data = mac;
    f.mac.len = sizeof(mac);
    *out_len = mge__link_frame__get_packed_size(&f);
    *out = mge_malloc(*out_len ? *out_len : 1);
    if (!*out)
        return MGE_NOMEM;
    mge__link_frame__pack(&f, *out);
    return MGE_OK;
}
