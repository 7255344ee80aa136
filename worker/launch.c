/* launch.c: the worker's launch socket (see launch.h). */
#include "launch.h"

#include <netinet/in.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "common/url.h"
#include "proto/worker.pb-c.h"
#include "ranks.h"

#define LAUNCH_MSG_MAX (1 << 20) /* an orted command line is a few KiB */

struct mge_launch {
    nng_socket rep;
    pthread_t thread;
    struct mge_ranks *rs;
};

static int pack_reply(bool ok, const char *error, uint8_t **out, size_t *out_len)
{
    Mge__LaunchReply rep = MGE__LAUNCH_REPLY__INIT;
    rep.ok = ok;
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
        return pack_reply(false, "malformed LaunchRequest", reply, reply_len) == MGE_OK
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
    if (pack_reply(rc == MGE_OK, rc == MGE_OK ? NULL : why, reply, reply_len) != MGE_OK)
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
        mge_launch_handle(l->rs, nng_msg_body(m), nng_msg_len(m), &out, &out_len);
        nng_msg_free(m);
        if (out)
            nng_send(l->rep, out, out_len, 0);
        mge_free(out);
    }
    return NULL;
}

int mge_launch_start(const char *listen_url, const char *advertise_host, struct mge_ranks *rs,
                     char *url, size_t url_len, struct mge_launch **out)
{
    struct mge_launch *l;
    nng_listener lst;
    char host[200] = "127.0.0.1";
    int rv, port = 0, rc;

    *out = NULL;
    l = mge_calloc(1, sizeof(*l));
    if (!l)
        return MGE_NOMEM;
    l->rs = rs;
    if ((rv = nng_rep0_open(&l->rep)) != 0) {
        rc = MGE_ERR(MGE_NET, "cannot open the launch socket: %s", nng_strerror(rv));
        goto err_free;
    }
    nng_socket_set_size(l->rep, NNG_OPT_RECVMAXSZ, LAUNCH_MSG_MAX);
    nng_socket_set_ms(l->rep, NNG_OPT_RECVTIMEO, 200);
    nng_socket_set_ms(l->rep, NNG_OPT_SENDTIMEO, 2000);
    if ((rv = nng_listen(l->rep, listen_url, &lst, 0)) != 0 ||
        (rv = nng_listener_get_int(lst, NNG_OPT_TCP_BOUND_PORT, &port)) != 0) {
        rc = MGE_ERR(MGE_NET, "cannot listen on '%s': %s", listen_url, nng_strerror(rv));
        goto err_close;
    }
    mge_url_host(listen_url, host, sizeof(host));
    if (advertise_host && *advertise_host &&
        (!strcmp(host, "0.0.0.0") || !strcmp(host, "*") || !strcmp(host, "[::]")))
        snprintf(host, sizeof(host), "%s", advertise_host);
    snprintf(url, url_len, "tcp://%s:%d", host, port);
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
    mge_free(l);
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

void mge_launch_stop(struct mge_launch *l)
{
    if (!l)
        return;
    nng_close(l->rep);
    pthread_join(l->thread, NULL);
    mge_free(l);
}
