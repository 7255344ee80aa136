/* launch.c: the worker's launch socket (see launch.h). */
#include "launch.h"

#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <netinet/in.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/tls/tls.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "common/url.h"
#include "proto/worker.pb-c.h"
#include "ranks.h"

#define LAUNCH_MSG_MAX (1 << 20) /* an orted command line is a few KiB */

#define CERT_DAYS 3650 /* the certificate lives as long as the process; no expiry to manage */

struct mge_launch {
    nng_socket rep;
    pthread_t thread;
    struct mge_ranks *rs;
    nng_tls_config *tls; /* tls+tcp://, or NULL */
    void (*kick)(void *); /* mge_launch_set_kick; set before requests come, read after */
    void *kick_arg;
};

/*
 * A fresh ECDSA P-256 key and a self-signed certificate for MGE_LAUNCH_TLS_NAME (serverAuth,
 * not a CA): the certificate's PEM into @cert (MGE_LAUNCH_CERT_MAX bytes), the key's into @key
 * of @key_len bytes. Returns MGE_OK or MGE_INTERNAL with GnuTLS's reason.
 */
static int launch_cert_new(char *cert, char *key, size_t key_len)
{
    gnutls_x509_privkey_t pk = NULL;
    gnutls_x509_crt_t crt = NULL;
    gnutls_datum_t c = {NULL, 0}, k = {NULL, 0};
    unsigned char serial[16];
    time_t now = time(NULL);
    int rv, rc = MGE_OK;
    const char *what = "make a key";

    if ((rv = gnutls_x509_privkey_init(&pk)) < 0 ||
        (rv = gnutls_x509_privkey_generate(
             pk, GNUTLS_PK_ECDSA, GNUTLS_CURVE_TO_BITS(GNUTLS_ECC_CURVE_SECP256R1), 0)) < 0)
        goto fail;
    what = "make a certificate";
    if ((rv = gnutls_rnd(GNUTLS_RND_NONCE, serial, sizeof(serial))) < 0)
        goto fail;
    serial[0] &= 0x7f; /* a positive serial number */
    if ((rv = gnutls_x509_crt_init(&crt)) < 0 || (rv = gnutls_x509_crt_set_version(crt, 3)) < 0 ||
        (rv = gnutls_x509_crt_set_serial(crt, serial, sizeof(serial))) < 0 ||
        (rv = gnutls_x509_crt_set_activation_time(crt, now - 3600)) < 0 ||
        (rv = gnutls_x509_crt_set_expiration_time(crt, now + (time_t)CERT_DAYS * 86400)) < 0 ||
        (rv =
             gnutls_x509_crt_set_dn_by_oid(crt, GNUTLS_OID_X520_COMMON_NAME, 0, MGE_LAUNCH_TLS_NAME,
                                           (unsigned)strlen(MGE_LAUNCH_TLS_NAME))) < 0 ||
        (rv = gnutls_x509_crt_set_subject_alt_name(crt, GNUTLS_SAN_DNSNAME, MGE_LAUNCH_TLS_NAME,
                                                   (unsigned)strlen(MGE_LAUNCH_TLS_NAME),
                                                   GNUTLS_FSAN_SET)) < 0 ||
        (rv = gnutls_x509_crt_set_basic_constraints(crt, 0, -1)) < 0 ||
        (rv = gnutls_x509_crt_set_key_usage(crt, GNUTLS_KEY_DIGITAL_SIGNATURE)) < 0 ||
        (rv = gnutls_x509_crt_set_key_purpose_oid(crt, GNUTLS_KP_TLS_WWW_SERVER, 0)) < 0 ||
        (rv = gnutls_x509_crt_set_key(crt, pk)) < 0 ||
        (rv = gnutls_x509_crt_sign2(crt, crt, pk, GNUTLS_DIG_SHA256, 0)) < 0)
        goto fail;
    what = "write the certificate";
    if ((rv = gnutls_x509_crt_export2(crt, GNUTLS_X509_FMT_PEM, &c)) < 0 ||
        (rv = gnutls_x509_privkey_export2(pk, GNUTLS_X509_FMT_PEM, &k)) < 0)
        goto fail;
    if (c.size + 1 > MGE_LAUNCH_CERT_MAX || k.size + 1 > key_len) {
        rc = MGE_ERR(MGE_INTERNAL,
                     "launch socket: the certificate (%u bytes) or key (%u) is "
                     "larger than expected",
                     c.size, k.size);
        goto out;
    }
    memcpy(cert, c.data, c.size);
    cert[c.size] = '\0';
    memcpy(key, k.data, k.size);
    key[k.size] = '\0';
    goto out;
fail:
    rc = MGE_ERR(MGE_INTERNAL, "launch socket: cannot %s: %s", what, gnutls_strerror(rv));
out:
    if (k.data) {
        gnutls_memset(k.data, 0, k.size);
        gnutls_free(k.data);
    }
    gnutls_free(c.data);
    if (crt)
        gnutls_x509_crt_deinit(crt);
    if (pk)
        gnutls_x509_privkey_deinit(pk);
    return rc;
}

/* l->tls: the server side of a tls+tcp:// launch socket, its certificate's PEM into @cert. */
static int launch_tls_new(struct mge_launch *l, char *cert)
{
    char key[1024];
    int rv, rc = launch_cert_new(cert, key, sizeof(key));
    if (rc != MGE_OK)
        return rc;
    if ((rv = nng_tls_config_alloc(&l->tls, NNG_TLS_MODE_SERVER)) != 0 ||
        (rv = nng_tls_config_own_cert(l->tls, cert, key, NULL)) != 0)
        rc = MGE_ERR(MGE_NET, "launch socket: NNG's TLS refuses its certificate: %s",
                     nng_strerror(rv));
    memset(key, 0, sizeof(key));
    return rc;
}

static int pack_reply(bool ok, bool unknown_rank, const char *error, uint8_t **out, size_t *out_len)
{
    Mge__LaunchReply rep = MGE__LAUNCH_REPLY__INIT;
    rep.ok = ok;
    rep.unknown_rank = unknown_rank;
    rep.error = (char *)(error ? error : "");
    *out_len = mge__launch_reply__get_packed_size(&rep);
    *out = mge_malloc(*out_len ? *out_len : 1);
    if (!*out)
        return MGE_NOMEM;
    mge__launch_reply__pack(&rep, *out);
    return MGE_OK;
}

int mge_launch_handle(struct mge_ranks *rs, const uint8_t *buf, size_t len, uint8_t **reply,
                      size_t *reply_len)
{
    Mge__LaunchRequest *req = mge__launch_request__unpack(NULL, len, buf);
    char why[512];
    int rc;
    *reply = NULL;
    *reply_len = 0;
    if (!req) {
        mge_log_warn("launch socket: malformed request ignored");
        return pack_reply(false, false, "malformed LaunchRequest", reply, reply_len) == MGE_OK
                   ? MGE_PROTO
                   : MGE_NOMEM;
    }
    rc = mge_ranks_launch(rs, req->job_id, req->attempt, req->rank, req->token, req->command,
                          why, sizeof(why));
    if (rc == MGE_OK)
        mge_log_info("job %lld attempt %d rank %d: launch requested", (long long)req->job_id,
                     req->attempt, req->rank);
    else
        mge_log_warn("job %lld attempt %d rank %d: launch refused: %s", (long long)req->job_id,
                     req->attempt, req->rank, why);
    mge__launch_request__free_unpacked(req, NULL);
    if (pack_reply(rc == MGE_OK, rc == MGE_NOENT, rc == MGE_OK ? NULL : why, reply, reply_len) !=
        MGE_OK)
        return MGE_NOMEM;
    return rc;
}

static void *launch_main(void *arg)
{
    struct mge_launch *l = arg;
    for (;;) { /* until mge_launch_stop() closes the socket */
        nng_msg *m = NULL;
        uint8_t *out = NULL;
        size_t out_len = 0;
        int rv = nng_recvmsg(l->rep, &m, 0);
        if (rv == NNG_ETIMEDOUT)
            continue;
        if (rv != 0)
            break; /* closed */
        if (mge_launch_handle(l->rs, nng_msg_body(m), nng_msg_len(m), &out, &out_len) ==
            MGE_NOENT) {
            void (*kick)(void *) = __atomic_load_n(&l->kick, __ATOMIC_ACQUIRE);
            if (kick) /* the rank's Assign may be on its way: fetch the commands now */
                kick(l->kick_arg);
        }
        nng_msg_free(m);
        if (out)
            nng_send(l->rep, out, out_len, 0);
        mge_free(out);
    }
    return NULL;
}

int mge_launch_start(const char *listen_url, const char *advertise_host, bool tls,
                     struct mge_ranks *rs, char *url, size_t url_len, char *cert,
                     struct mge_launch **out)
{
    struct mge_launch *l;
    nng_listener lst;
    char host[200] = "127.0.0.1", real[320];
    const char *scheme = tls ? "tls+tcp" : "tcp";
    int rv, port = 0, rc;

    *out = NULL;
    cert[0] = '\0';
    /* the scheme follows the worker link's; --launch-listen names the address */
    if (!strncmp(listen_url, "tcp://", 6))
        snprintf(real, sizeof(real), "%s://%s", scheme, listen_url + 6);
    else if (!strncmp(listen_url, "tls+tcp://", 10))
        snprintf(real, sizeof(real), "%s://%s", scheme, listen_url + 10);
    else
        return MGE_ERR(MGE_INVAL, "launch socket '%s': give tcp://ADDR:PORT", listen_url);
    l = mge_calloc(1, sizeof(*l));
    if (!l)
        return MGE_NOMEM;
    l->rs = rs;
    if (tls && (rc = launch_tls_new(l, cert)) != MGE_OK)
        goto err_free;
    if ((rv = nng_rep0_open(&l->rep)) != 0) {
        rc = MGE_ERR(MGE_NET, "cannot open the launch socket: %s", nng_strerror(rv));
        goto err_free;
    }
    nng_socket_set_size(l->rep, NNG_OPT_RECVMAXSZ, LAUNCH_MSG_MAX);
    nng_socket_set_ms(l->rep, NNG_OPT_RECVTIMEO, 200);
    nng_socket_set_ms(l->rep, NNG_OPT_SENDTIMEO, 2000);
    if ((rv = nng_listener_create(&lst, l->rep, real)) != 0 ||
        (l->tls && (rv = nng_listener_set_ptr(lst, NNG_OPT_TLS_CONFIG, l->tls)) != 0) ||
        (rv = nng_listener_start(lst, 0)) != 0 ||
        (rv = nng_listener_get_int(lst, NNG_OPT_TCP_BOUND_PORT, &port)) != 0) {
        rc = MGE_ERR(MGE_NET, "cannot listen on '%s': %s", real, nng_strerror(rv));
        goto err_close;
    }
    mge_url_host(listen_url, host, sizeof(host));
    if (advertise_host && *advertise_host &&
        (!strcmp(host, "0.0.0.0") || !strcmp(host, "*") || !strcmp(host, "[::]")))
        snprintf(host, sizeof(host), "%s", advertise_host);
    snprintf(url, url_len, "%s://%s:%d", scheme, host, port);
    if (pthread_create(&l->thread, NULL, launch_main, l) != 0) {
        rc = MGE_ERR(MGE_INTERNAL, "cannot start the launch thread");
        goto err_close;
    }
    mge_log_info("launch socket on %s", url);
    *out = l;
    return MGE_OK;

err_close:
    nng_close(l->rep);
err_free:
    if (l->tls)
        nng_tls_config_free(l->tls);
    mge_free(l);
    cert[0] = '\0';
    return rc;
}

int mge_launch_default_url(const char *coordinator, char *url, size_t len)
{
    char addr[INET6_ADDRSTRLEN + 2] = "";
    int rc = mge_url_route_source(coordinator, addr, sizeof(addr));
    if (rc == MGE_OK && !mge_url_host_is_loopback(addr))
        snprintf(url, len, "tcp://%s:0", addr);
    else
        snprintf(url, len, "tcp://127.0.0.1:0");
    if (rc != MGE_OK)
        mge_log_warn("launch socket on 127.0.0.1: multi-worker jobs across hosts need "
                     "--launch-listen");
    return rc;
}

void mge_launch_set_kick(struct mge_launch *l, void (*kick)(void *), void *arg)
{
    l->kick_arg = arg;
    __atomic_store_n(&l->kick, kick, __ATOMIC_RELEASE); /* kick_arg is seen with it */
}

void mge_launch_stop(struct mge_launch *l)
{
    if (!l)
        return;
    nng_close(l->rep);
    pthread_join(l->thread, NULL);
    if (l->tls)
        nng_tls_config_free(l->tls);
    mge_free(l);
}
