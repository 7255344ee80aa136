/* crypto.c: HMAC-SHA256, random bytes, constant-time compare, worker link MACs (see crypto.h). */
#include "crypto.h"

#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <string.h>

#include "err.h"

static EVP_MAC *g_hmac;
static pthread_once_t g_hmac_once = PTHREAD_ONCE_INIT;

static void hmac_fetch(void)
{
    g_hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
}

int mge_hmac_sha256(const void *key, size_t key_len, const struct mge_span *parts, size_t n_parts,
                    uint8_t out[MGE_HMAC_LEN])
{
    static const uint8_t empty_key[1];
    char digest[] = "SHA256";
    OSSL_PARAM params[2];
    EVP_MAC_CTX *ctx;
    size_t out_len = 0;
    int ok;

    pthread_once(&g_hmac_once, hmac_fetch);
    if (!g_hmac)
        return MGE_ERR(MGE_INTERNAL, "libcrypto has no HMAC");
    ctx = EVP_MAC_CTX_new(g_hmac);
    if (!ctx)
        return MGE_ERR(MGE_INTERNAL, "cannot make an HMAC context");
    params[0] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0);
    params[1] = OSSL_PARAM_construct_end();
    /* libcrypto refuses a NULL key even when it is empty */
    ok = EVP_MAC_init(ctx, key_len ? key : empty_key, key_len, params);
    for (size_t i = 0; ok && i < n_parts; i++)
        if (parts[i].n)
            ok = EVP_MAC_update(ctx, parts[i].p, parts[i].n);
    ok = ok && EVP_MAC_final(ctx, out, &out_len, MGE_HMAC_LEN) && out_len == MGE_HMAC_LEN;
    EVP_MAC_CTX_free(ctx);
    if (!ok) {
        ERR_clear_error();
        return MGE_ERR(MGE_INTERNAL, "HMAC-SHA256 failed in libcrypto");
    }
    return MGE_OK;
}

int mge_random_bytes(void *buf, size_t n)
{
    if (n > (size_t)INT32_MAX || RAND_bytes(buf, (int)n) != 1) {
        ERR_clear_error();
        return MGE_ERR(MGE_INTERNAL, "cannot get %zu random bytes from libcrypto", n);
    }
    return MGE_OK;
}

bool mge_ct_equal(const void *want, size_t want_len, const void *got, size_t got_len)
{
    const volatile unsigned char *w = want, *g = got;
    unsigned char diff = (unsigned char)(want_len != got_len);
    /* read @got only within its length, and always want_len times */
    for (size_t i = 0; i < want_len; i++)
        diff |= w[i] ^ (i < got_len ? g[i] : (unsigned char)~w[i]);
    return diff == 0;
}

static void be64(uint8_t out[8], uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        out[i] = (uint8_t)v;
}

static void be32(uint8_t out[4], uint32_t v)
{
    for (int i = 3; i >= 0; i--, v >>= 8)
        out[i] = (uint8_t)v;
}

int mge_link_mac(enum mge_link_mac_kind kind, const void *key, size_t key_len,
                 const char *worker_id, uint64_t counter, const uint8_t *nonce, size_t nonce_len,
                 const uint8_t *body, size_t body_len, uint8_t mac[MGE_HMAC_LEN])
{
    /* labels end in '\0' (sizeof counts it), so one is never a prefix of another */
    static const char reg[] = "mge-register", req[] = "mge-request", rep[] = "mge-reply";
    const char *label = kind == MGE_LINK_MAC_REGISTER  ? reg
                        : kind == MGE_LINK_MAC_REQUEST ? req
                                                       : rep;
    size_t label_len = kind == MGE_LINK_MAC_REGISTER  ? sizeof(reg)
                       : kind == MGE_LINK_MAC_REQUEST ? sizeof(req)
                                                      : sizeof(rep);
    size_t id_len = worker_id ? strlen(worker_id) : 0;
    uint8_t ctr[8], idl[4], nl[4];
    struct mge_span parts[7];

    if (id_len > UINT32_MAX || nonce_len > UINT32_MAX)
        return MGE_ERR(MGE_INTERNAL, "worker link MAC input too long");
    be64(ctr, counter);
    be32(idl, (uint32_t)id_len);
    be32(nl, (uint32_t)nonce_len);
    parts[0] = (struct mge_span){label, label_len};
    parts[1] = (struct mge_span){ctr, sizeof(ctr)};
    parts[2] = (struct mge_span){idl, sizeof(idl)};
    parts[3] = (struct mge_span){worker_id, id_len};
    parts[4] = (struct mge_span){nl, sizeof(nl)};
    parts[5] = (struct mge_span){nonce, nonce_len};
    parts[6] = (struct mge_span){body, body_len};
    return mge_hmac_sha256(key, key_len, parts, 7, mac);
}

int mge_link_session_key(const char *join_token, const char *worker_id,
                         const uint8_t client_nonce[MGE_NONCE_LEN],
                         const uint8_t server_nonce[MGE_NONCE_LEN], uint8_t key[MGE_HMAC_LEN])
{
    static const char label[] = "mge-session";
    size_t id_len = strlen(worker_id);
    uint8_t idl[4];
    struct mge_span parts[5];
    if (id_len > UINT32_MAX)
        return MGE_ERR(MGE_INTERNAL, "worker id too long");
    be32(idl, (uint32_t)id_len);
    parts[0] = (struct mge_span){label, sizeof(label)};
    parts[1] = (struct mge_span){idl, sizeof(idl)};
    parts[2] = (struct mge_span){worker_id, id_len};
    parts[3] = (struct mge_span){client_nonce, MGE_NONCE_LEN};
    parts[4] = (struct mge_span){server_nonce, MGE_NONCE_LEN};
    return mge_hmac_sha256(join_token, strlen(join_token), parts, 5, key);
}
