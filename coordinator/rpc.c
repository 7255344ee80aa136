/* rpc.c: NNG REP + PUB worker link of the coordinator (see rpc.h). */
#include "rpc.h"

#include <nng/nng.h>
#include <nng/protocol/pubsub0/pub.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/tls/tls.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "ckpt_store.h"
#include "common/alloc.h"
#include "common/crypto.h"
#include "common/err.h"
#include "common/log.h"
#include "common/url.h"
#include "proto/worker.pb-c.h"
#include "sched.h"
#include "store.h"

#define RPC_MAX_RANKS 4096
#define RPC_MAX_CPUS 65536                       /* cores one worker may offer */
#define RPC_MAX_MEMORY_MB ((int64_t)1 << 30)     /* 1 PiB, in MiB */
#define RPC_MAX_GPU_MEMORY_MB ((int64_t)1 << 24) /* 16 TiB per GPU, in MiB */
#define RPC_MAX_ACKS 4096
#define RPC_SEEN_NONCES 8 /* client nonces of a name's recent Registers, refused if seen again */
#define RPC_REFUSALS_LOGGED 20 /* refused frames logged per second; a flood is counted instead */

/* One worker link session (see LinkFrame in proto/worker.proto). Only the rpc thread uses it. */
struct rpc_session {
    char worker_id[40];
    char name[128];                /* the worker's name, for log lines */
    uint8_t key[MGE_HMAC_LEN];     /* session key; never leaves this process */
    uint64_t last_counter;         /* highest counter accepted; a frame must exceed it */
    uint8_t seen[RPC_SEEN_NONCES][MGE_NONCE_LEN]; /* client nonces of this name's Registers */
    unsigned n_seen;               /* Registers seen, the last RPC_SEEN_NONCES kept in seen */
    struct mge_ckpt_upload up;     /* the worker's checkpoint upload in progress */
};

struct mge_rpc {
    struct mge_store *st;
    struct mge_sched *sched;
    nng_socket rep;
    nng_socket pub;
    bool pub_open;
    nng_tls_config *tls; /* tls+tcp:// (both ports), or NULL */
    const char *scheme;  /* "tcp" or "tls+tcp" */
    char notify_url[256];
    char listen_url[256];         /* with the port actually bound */
    const char *join_token;
    int heartbeat_ms;
    const char *ckpt_dir; /* the checkpoint store (absolute), NULL for none */
    uint8_t *fetch_buf;   /* [rpc thread] MGE_CKPT_CHUNK_MAX bytes for fetch replies */
    pthread_t thread;
    bool started;
    atomic_bool stop;
    atomic_uint_fast64_t requests;
    struct rpc_session *sess;     /* [rpc thread] one per worker name that registered */
    size_t n_sess, cap_sess;
    int64_t refusal_second;       /* [rpc thread] wall second of the refusals counted below */
    unsigned refusals;            /* [rpc thread] refused frames in that second */
};

static int err_from_nng(int rv, const char *what, const char *url)
{
    return MGE_ERR(MGE_NET, "%s '%s': %s", what, url, nng_strerror(rv));
}

/* Listen on @url with @s, through r->tls when the link is tls+tcp://. Returns NNG's code. */
static int rpc_listen(struct mge_rpc *r, nng_socket s, const char *url, nng_listener *l)
{
    int rv = nng_listener_create(l, s, url);
    if (rv == 0 && r->tls)
        rv = nng_listener_set_ptr(*l, NNG_OPT_TLS_CONFIG, r->tls);
    if (rv == 0)
        rv = nng_listener_start(*l, 0);
    return rv;
}

/* The server TLS configuration of a tls+tcp:// link into r->tls. */
static int rpc_tls_new(struct mge_rpc *r, const struct mge_rpc_opts *opts)
{
    int rv;
    if (!opts->tls_cert || !opts->tls_key)
        return MGE_ERR(MGE_INVAL,
                       "worker link '%s' is tls+tcp:// but the coordinator has no certificate: "
                       "give --tls-cert and --tls-key",
                       opts->listen_url);
    if ((rv = nng_tls_config_alloc(&r->tls, NNG_TLS_MODE_SERVER)) != 0)
        return err_from_nng(rv, "no TLS for worker link", opts->listen_url);
    if ((rv = nng_tls_config_own_cert(r->tls, opts->tls_cert, opts->tls_key, NULL)) != 0)
        return err_from_nng(rv, "NNG's TLS (mbedtls) refuses the certificate or key for",
                            opts->listen_url);
    return MGE_OK;
}

int mge_rpc_new(const struct mge_rpc_opts *opts, struct mge_store *st, struct mge_rpc **out)
{
    struct mge_rpc *r;
    nng_listener rep_l;
    char host[200] = "127.0.0.1";
    int rv, port = 0, rc;
    *out = NULL;
    r = mge_calloc(1, sizeof(*r));
    if (!r)
        return MGE_NOMEM;
    r->st = st;
    r->join_token = opts->join_token;
    r->heartbeat_ms = opts->heartbeat_ms > 0 ? opts->heartbeat_ms : 1000;
    r->ckpt_dir = opts->ckpt_dir;
    r->scheme = "tcp";
    if (!strncmp(opts->listen_url, "tls+tcp://", 10)) {
        r->scheme = "tls+tcp";
        if ((rc = rpc_tls_new(r, opts)) != MGE_OK)
            goto err_free;
    }
    if ((rv = nng_rep0_open(&r->rep)) != 0) {
        rc = err_from_nng(rv, "cannot open rep socket", opts->listen_url);
        goto err_free;
    }
    nng_socket_set_size(r->rep, NNG_OPT_RECVMAXSZ, 16 << 20);
    nng_socket_set_ms(r->rep, NNG_OPT_RECVTIMEO, 200);
    nng_socket_set_ms(r->rep, NNG_OPT_SENDTIMEO, 1000);
    if ((rv = rpc_listen(r, r->rep, opts->listen_url, &rep_l)) != 0) {
        rc = err_from_nng(rv, "cannot listen on", opts->listen_url);
        goto err_close_rep;
    }
    if ((rv = nng_pub0_open(&r->pub)) != 0) {
        rc = err_from_nng(rv, "cannot open pub socket", opts->listen_url);
        goto err_close_rep;
    }
    r->pub_open = true;
    mge_url_host(opts->listen_url, host, sizeof(host));
    snprintf(r->listen_url, sizeof(r->listen_url), "%s", opts->listen_url);
    if (nng_listener_get_int(rep_l, NNG_OPT_TCP_BOUND_PORT, &port) == 0)
        snprintf(r->listen_url, sizeof(r->listen_url), "%s://%s:%d", r->scheme, host, port);
    *out = r;
    return MGE_OK;

err_close_rep:
    nng_close(r->rep);
err_free:
    if (r->tls)
        nng_tls_config_free(r->tls);
    mge_free(r);
    return rc;
}

void mge_rpc_notify(void *arg, const char *worker_id)
{
    struct mge_rpc *r = arg;
    if (r && r->pub_open)
        nng_send(r->pub, (void *)worker_id, strlen(worker_id), NNG_FLAG_NONBLOCK);
}

const char *mge_rpc_listen_url(const struct mge_rpc *r) { return r->listen_url; }

uint64_t mge_rpc_requests(const struct mge_rpc *r) { return r ? r->requests : 0; }

static void reports_from_pb(Mge__RankReport **in, size_t n, struct mge_rank_report *out)
{
    for (size_t i = 0; i < n; i++) {
        out[i].job_id = in[i]->job_id;
        out[i].attempt = in[i]->attempt;
        out[i].rank = in[i]->rank;
        out[i].running = in[i]->running;
        out[i].exit_code = in[i]->exit_code;
        out[i].term_signal = in[i]->term_signal;
        out[i].failure = in[i]->failure;
        out[i].worker_fault = in[i]->worker_fault;
        out[i].stopped = in[i]->stopped;
        out[i].cpu_ms = in[i]->cpu_ms;
    }
}

/* Pack @tw into a new buffer *@reply (mge_malloc'ed) of *@len bytes: the body of a LinkReply. */
static int pack_reply(Mge__ToWorker *tw, uint8_t **reply, size_t *len)
{
    size_t n = mge__to_worker__get_packed_size(tw);
    *reply = mge_malloc(n ? n : 1);
    if (!*reply)
        return MGE_NOMEM;
    *len = mge__to_worker__pack(tw, *reply);
    return MGE_OK;
}

static int reply_error(const char *msg, bool reregister, uint8_t **reply, size_t *len)
{
    Mge__ToWorker tw = MGE__TO_WORKER__INIT;
    tw.error = (char *)msg;
    tw.reregister = reregister;
    return pack_reply(&tw, reply, len);
}

/* The cancels of @cmds as protobuf: *@cs and *@csp are mge_calloc'ed (caller frees both). */
static int cancels_to_pb(const struct mge_sched_cmds *cmds, Mge__Cancel **cs, Mge__Cancel ***csp)
{
    *cs = NULL;
    *csp = NULL;
    if (!cmds->n_cancel)
        return MGE_OK;
    *cs = mge_calloc(cmds->n_cancel, sizeof(**cs));
    *csp = mge_calloc(cmds->n_cancel, sizeof(**csp));
    if (!*cs || !*csp)
        return MGE_NOMEM;
    for (size_t i = 0; i < cmds->n_cancel; i++) {
        mge__cancel__init(&(*cs)[i]);
        (*cs)[i].job_id = cmds->cancel[i].job_id;
        (*cs)[i].attempt = cmds->cancel[i].attempt;
        (*cs)[i].grace_ms = cmds->grace_ms;
        (*csp)[i] = &(*cs)[i];
    }
    return MGE_OK;
}

/* The checkpoint requests of @cmds as protobuf: *@ks and *@ksp are mge_calloc'ed (caller
 * frees both). */
static int ckpts_to_pb(const struct mge_sched_cmds *cmds, Mge__CkptRequest **ks,
                       Mge__CkptRequest ***ksp)
{
    *ks = NULL;
    *ksp = NULL;
    if (!cmds->n_ckpt)
        return MGE_OK;
    *ks = mge_calloc(cmds->n_ckpt, sizeof(**ks));
    *ksp = mge_calloc(cmds->n_ckpt, sizeof(**ksp));
    if (!*ks || !*ksp)
        return MGE_NOMEM;
    for (size_t i = 0; i < cmds->n_ckpt; i++) {
        mge__ckpt_request__init(&(*ks)[i]);
        (*ks)[i].job_id = cmds->ckpt[i].job_id;
        (*ks)[i].attempt = cmds->ckpt[i].attempt;
        (*ksp)[i] = &(*ks)[i];
    }
    return MGE_OK;
}

static bool refusal_logged(struct mge_rpc *r);

/* Whether @s has a control character (names reach logs, the store and the dashboard). */
static bool has_control(const char *s)
{
    for (; s && *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return true;
    return false;
}

/*
 * Why the coordinator refuses @reg's claims, or NULL: a worker that holds the join token is
 * still believed only within what a machine can have (no negative or absurd cores, memory or
 * GPUs, a device it knows, a printable name), so a forged or broken frame cannot skew the
 * scheduler's arithmetic or what operators see.
 */
static const char *register_refusal(const Mge__Register *reg)
{
    const Mge__Slots *sl = reg->slots;
    if (has_control(reg->name))
        return "bad register frame: the name has control characters";
    if (!sl)
        return NULL;
    if (sl->cpus < 0 || sl->cpus > RPC_MAX_CPUS)
        return "bad register frame: slots.cpus out of range (0-65536)";
    if (sl->memory_mb < 0 || sl->memory_mb > RPC_MAX_MEMORY_MB)
        return "bad register frame: slots.memory_mb out of range (0 to 1 PiB)";
    if (sl->device && *sl->device && strcmp(sl->device, "cpu") != 0 &&
        strcmp(sl->device, "gpu") != 0)
        return "bad register frame: slots.device must be \"cpu\" or \"gpu\"";
    if (sl->gpus < 0 || sl->gpus > MGE_GPUS_MAX || sl->n_gpu_list > (size_t)sl->gpus)
        return "bad register frame: gpus out of range";
    for (size_t i = 0; i < sl->n_gpu_list; i++)
        if (sl->gpu_list[i]->memory_mb < 0 || sl->gpu_list[i]->memory_mb > RPC_MAX_GPU_MEMORY_MB)
            return "bad register frame: a GPU's memory_mb out of range (0 to 16 TiB)";
    return NULL;
}

/* Register @reg (its join token proven by the caller); its id into @id (or "" if refused). */
static int handle_register(struct mge_rpc *r, Mge__Register *reg, char id[40], uint8_t **reply,
                           size_t *len)
{
    Mge__ToWorker tw = MGE__TO_WORKER__INIT;
    struct mge_worker_info info;
    struct mge_gpu *gpus = NULL;
    struct mge_rank_report *reps = NULL;
    struct mge_sched_cmds cmds;
    Mge__Cancel *cs = NULL, **csp = NULL;
    const char *why;
    int rc;

    id[0] = '\0';
    if (!reg->name || !*reg->name || strlen(reg->name) > 120 || reg->n_ranks > RPC_MAX_RANKS)
        return reply_error("bad register frame", false, reply, len);
    if ((why = register_refusal(reg)) != NULL) {
        if (refusal_logged(r))
            mge_log_warn("worker link: refused the Register of '%.40s': %s",
                         has_control(reg->name) ? "(a name with control characters)" : reg->name,
                         why);
        return reply_error(why, false, reply, len);
    }
    memset(&info, 0, sizeof(info));
    info.name = reg->name;
    info.host = reg->host;
    info.version = reg->version;
    info.launch_url = reg->launch_url;
    info.launch_cert = reg->launch_cert;
    if (reg->slots) {
        info.cpus = reg->slots->cpus;
        info.gpus = reg->slots->gpus;
        info.memory_mb = reg->slots->memory_mb;
        info.device = reg->slots->device;
        if (reg->slots->n_gpu_list) {
            gpus = mge_calloc((size_t)info.gpus, sizeof(*gpus));
            if (!gpus)
                return MGE_NOMEM;
            for (size_t i = 0; i < reg->slots->n_gpu_list; i++) {
                const Mge__Gpu *g = reg->slots->gpu_list[i];
                snprintf(gpus[i].name, sizeof(gpus[i].name), "%s", g->name ? g->name : "");
                /* the store keeps one GPU per line, and the dashboard shows the name */
                for (char *c = gpus[i].name; *c; c++)
                    if ((unsigned char)*c < 0x20 || *c == 0x7f)
                        *c = '?';
                gpus[i].memory_mb = g->memory_mb > 0 ? g->memory_mb : 0;
            }
            info.gpu = gpus;
        }
    }
    if (reg->n_ranks) {
        reps = mge_calloc(reg->n_ranks, sizeof(*reps));
        if (!reps) {
            mge_free(gpus);
            return MGE_NOMEM;
        }
        reports_from_pb(reg->ranks, reg->n_ranks, reps);
    }
    rc = mge_sched_worker_register(r->sched, &info, reps, reg->n_ranks, id, &cmds);
    mge_free(reps);
    mge_free(gpus);
    if (rc != MGE_OK) {
        id[0] = '\0';
        mge_sched_cmds_fini(&cmds);
        return reply_error("registration failed", false, reply, len);
    }
    /* ranks of attempts that are not current (it was lost and came back) end at once */
    rc = cancels_to_pb(&cmds, &cs, &csp);
    if (rc == MGE_OK) {
        tw.worker_id = id;
        tw.notify_url = r->notify_url;
        tw.heartbeat_ms = r->heartbeat_ms;
        tw.n_cancel = cmds.n_cancel;
        tw.cancel = csp;
        rc = pack_reply(&tw, reply, len);
    }
    mge_free(cs);
    mge_free(csp);
    mge_sched_cmds_fini(&cmds);
    return rc;
}

static bool refusal_logged(struct mge_rpc *r);

/* Heartbeat.upload: the chunk goes into the checkpoint store; the answer into @ack. */
static void ckpt_upload(struct mge_rpc *r, struct rpc_session *se, const Mge__CkptChunk *c,
                        Mge__CkptAck *ack, char *why, size_t why_len)
{
    struct mge_ckpt_chunk ch = {.job_id = c->job_id,
                                .attempt = c->attempt,
                                .name = c->name,
                                .offset = c->offset,
                                .size = c->size,
                                .data = c->data.data,
                                .len = c->data.len};
    uint64_t next = 0;
    bool committed = false;
    int rc = MGE_UNSUPPORTED;
    mge__ckpt_ack__init(ack);
    ack->job_id = c->job_id;
    ack->attempt = c->attempt;
    ack->name = c->name;
    if (!r->ckpt_dir)
        snprintf(why, why_len, "this coordinator keeps no checkpoint store");
    else
        rc = mge_ckpt_upload_chunk(&se->up, r->st, r->ckpt_dir, se->worker_id, &ch, &next,
                                   &committed, why, why_len);
    if (rc != MGE_OK) {
        if (refusal_logged(r))
            mge_log_warn("worker '%s' (%s): checkpoint upload refused: %s", se->name, se->worker_id,
                         why);
        ack->error = why;
        return;
    }
    ack->offset = next;
    ack->committed = committed;
}

/* Heartbeat.fetch: a piece of a committed copy into @d (its data in r->fetch_buf). */
static void ckpt_fetch(struct mge_rpc *r, struct rpc_session *se, const Mge__CkptFetch *f,
                       Mge__CkptData *d, char *why, size_t why_len)
{
    size_t n = 0;
    uint64_t size = 0;
    int rc = MGE_NOMEM;
    mge__ckpt_data__init(d);
    d->job_id = f->job_id;
    d->attempt = f->attempt;
    d->name = f->name;
    d->offset = f->offset;
    if (!r->fetch_buf)
        r->fetch_buf = mge_malloc(MGE_CKPT_CHUNK_MAX);
    if (!r->fetch_buf)
        snprintf(why, why_len, "out of memory");
    else
        rc = mge_ckpt_fetch_chunk(r->st, se->worker_id, f->job_id, f->attempt, f->name, f->offset,
                                  r->fetch_buf, &n, &size, why, why_len);
    if (rc != MGE_OK) {
        if (refusal_logged(r))
            mge_log_warn("worker '%s' (%s): checkpoint fetch refused: %s", se->name, se->worker_id,
                         why);
        d->error = why;
        return;
    }
    d->size = size;
    d->data.data = r->fetch_buf;
    d->data.len = n;
}

static int handle_heartbeat(struct mge_rpc *r, struct rpc_session *se, Mge__Heartbeat *hb,
                            uint8_t **reply, size_t *len)
{
    Mge__CkptAck up_ack;
    Mge__CkptData fetched;
    char up_why[512], fetch_why[512];
    Mge__ToWorker tw = MGE__TO_WORKER__INIT;
    struct mge_store_line *lines = NULL;
    struct mge_rank_report *reps = NULL;
    struct mge_sched_cmds cmds;
    Mge__Assign *as = NULL, **asp = NULL;
    Mge__Peer *pe = NULL, **pep = NULL;
    size_t n_pe = 0;
    Mge__CkptRequest *ks = NULL, **ksp = NULL;
    Mge__Cancel *cs = NULL, **csp = NULL;
    Mge__Ack *ak = NULL, **akp = NULL;
    size_t n_ak = 0, cap_ak;
    int rc = MGE_OK;
    bool stored = true;

    memset(&cmds, 0, sizeof(cmds));
    if (!hb->worker_id || !mge_sched_worker_known(r->sched, hb->worker_id))
        return reply_error("unknown worker", true, reply, len);
    if (hb->n_ranks > RPC_MAX_RANKS)
        return reply_error("too many ranks", false, reply, len);

    /* Lines first, so a job's last metrics are stored before its exit finishes it. */
    if (hb->n_lines) {
        lines = mge_calloc(hb->n_lines, sizeof(*lines));
        if (!lines)
            return MGE_NOMEM;
        for (size_t i = 0; i < hb->n_lines; i++) {
            Mge__Line *l = hb->lines[i];
            lines[i].job_id = l->job_id;
            lines[i].attempt = l->attempt;
            lines[i].rank = l->rank;
            lines[i].seq = l->seq;
            lines[i].stream = l->stream;
            lines[i].text = l->text ? l->text : "";
            lines[i].time_ms = l->time_ms;
        }
        stored = mge_store_lines_ingest(r->st, hb->worker_id, lines, hb->n_lines) == MGE_OK;
    }
    if (hb->n_ranks) {
        reps = mge_calloc(hb->n_ranks, sizeof(*reps));
        if (!reps) {
            rc = MGE_NOMEM;
            goto out_free;
        }
        reports_from_pb(hb->ranks, hb->n_ranks, reps);
    }
    rc = mge_sched_worker_heartbeat(r->sched, hb->worker_id, reps, hb->n_ranks, lines,
                                    lines ? hb->n_lines : 0, &cmds);
    if (rc == MGE_NOENT) {
        rc = reply_error("unknown worker", true, reply, len);
        goto out_free;
    }
    if (rc != MGE_OK)
        goto out_free;

    /* Acks: the highest stored seq of each (job, attempt, rank) in this batch, plus exits. */
    cap_ak = (stored ? hb->n_lines : 0) + cmds.n_acks;
    if (cap_ak > RPC_MAX_ACKS + cmds.n_acks)
        cap_ak = RPC_MAX_ACKS + cmds.n_acks;
    if (cap_ak) {
        ak = mge_calloc(cap_ak, sizeof(*ak));
        akp = mge_calloc(cap_ak, sizeof(*akp));
        if (!ak || !akp) {
            rc = MGE_NOMEM;
            goto out_free;
        }
    }
    for (size_t i = 0; stored && i < hb->n_lines; i++) {
        Mge__Line *l = hb->lines[i];
        size_t k;
        for (k = 0; k < n_ak; k++)
            if (ak[k].job_id == l->job_id && ak[k].attempt == l->attempt && ak[k].rank == l->rank)
                break;
        if (k == n_ak) {
            if (n_ak == cap_ak)
                continue;
            mge__ack__init(&ak[k]);
            ak[k].job_id = l->job_id;
            ak[k].attempt = l->attempt;
            ak[k].rank = l->rank;
            n_ak++;
        }
        if (l->seq > ak[k].seq)
            ak[k].seq = l->seq;
    }
    for (size_t i = 0; i < cmds.n_acks && n_ak < cap_ak; i++) {
        size_t k;
        for (k = 0; k < n_ak; k++)
            if (ak[k].job_id == cmds.acks[i].job_id && ak[k].attempt == cmds.acks[i].attempt &&
                ak[k].rank == cmds.acks[i].rank)
                break;
        if (k == n_ak) {
            mge__ack__init(&ak[k]);
            ak[k].job_id = cmds.acks[i].job_id;
            ak[k].attempt = cmds.acks[i].attempt;
            ak[k].rank = cmds.acks[i].rank;
            n_ak++;
        }
        ak[k].exit_acked = true;
    }
    for (size_t k = 0; k < n_ak; k++)
        akp[k] = &ak[k];

    if (cmds.n_assign) {
        for (size_t i = 0; i < cmds.n_assign; i++)
            n_pe += cmds.assign[i].n_peers;
        as = mge_calloc(cmds.n_assign, sizeof(*as));
        asp = mge_calloc(cmds.n_assign, sizeof(*asp));
        pe = n_pe ? mge_calloc(n_pe, sizeof(*pe)) : NULL;
        pep = n_pe ? mge_calloc(n_pe, sizeof(*pep)) : NULL;
        if (!as || !asp || (n_pe && (!pe || !pep))) {
            rc = MGE_NOMEM;
            goto out_free;
        }
        n_pe = 0;
        for (size_t i = 0; i < cmds.n_assign; i++) {
            mge__assign__init(&as[i]);
            as[i].job_id = cmds.assign[i].job_id;
            as[i].attempt = cmds.assign[i].attempt;
            as[i].rank = cmds.assign[i].rank;
            as[i].world_size = cmds.assign[i].world;
            as[i].spec_yaml = cmds.assign[i].spec_yaml;
            as[i].resume = cmds.assign[i].resume ? cmds.assign[i].resume : (char *)"";
            as[i].resume_copy =
                cmds.assign[i].resume_copy ? cmds.assign[i].resume_copy : (char *)"";
            as[i].launch_token = cmds.assign[i].launch_token;
            as[i].gpu_ids = cmds.assign[i].gpu_ids;
            as[i].peers = cmds.assign[i].n_peers ? pep + n_pe : NULL;
            as[i].n_peers = cmds.assign[i].n_peers;
            for (size_t k = 0; k < cmds.assign[i].n_peers; k++, n_pe++) {
                const struct mge_sched_peer *sp = &cmds.assign[i].peers[k];
                mge__peer__init(&pe[n_pe]);
                pe[n_pe].rank = sp->rank;
                pe[n_pe].name = (char *)sp->name;
                pe[n_pe].launch_url = (char *)sp->launch_url;
                pe[n_pe].launch_cert = (char *)sp->launch_cert;
                pep[n_pe] = &pe[n_pe];
            }
            asp[i] = &as[i];
        }
    }
    rc = cancels_to_pb(&cmds, &cs, &csp);
    if (rc == MGE_OK)
        rc = ckpts_to_pb(&cmds, &ks, &ksp);
    if (rc != MGE_OK)
        goto out_free;
    tw.n_checkpoint = cmds.n_ckpt;
    tw.checkpoint = ksp;
    tw.n_assign = cmds.n_assign;
    tw.assign = asp;
    tw.n_cancel = cmds.n_cancel;
    tw.cancel = csp;
    tw.n_acks = n_ak;
    tw.acks = akp;
    tw.heartbeat_ms = r->heartbeat_ms;
    tw.notify_url = r->notify_url; /* changes when the coordinator restarts */
    if (hb->upload) {
        ckpt_upload(r, se, hb->upload, &up_ack, up_why, sizeof(up_why));
        tw.upload_ack = &up_ack;
    }
    if (hb->fetch) {
        ckpt_fetch(r, se, hb->fetch, &fetched, fetch_why, sizeof(fetch_why));
        tw.fetched = &fetched;
    }
    rc = pack_reply(&tw, reply, len);
    /* NEEDSWORK: if this reply is lost, the commands in it are re-derived: assigns by the
     * missing-rank check, cancels by the resend of cancels to finished ranks. */
out_free:
    mge_free(as);
    mge_free(asp);
    mge_free(pe);
    mge_free(pep);
    mge_free(cs);
    mge_free(csp);
    mge_free(ks);
    mge_free(ksp);
    mge_free(ak);
    mge_free(akp);
    mge_sched_cmds_fini(&cmds);
    mge_free(reps);
    mge_free(lines);
    return rc;
}

/* ---- sessions and the LinkFrame envelope (proto/worker.proto) ---- */

/*
 * Whether to log one more refused frame: the first RPC_REFUSALS_LOGGED of each second, so that
 * a flood of forged frames cannot flood the log; the rest are counted in one line.
 */
static bool refusal_logged(struct mge_rpc *r)
{
    int64_t sec = mge_now_ms() / 1000;
    if (sec != r->refusal_second) {
        if (r->refusals > RPC_REFUSALS_LOGGED)
            mge_log_warn("worker link: %u more refused frames not logged",
                         r->refusals - RPC_REFUSALS_LOGGED);
        r->refusal_second = sec;
        r->refusals = 0;
    }
    return ++r->refusals <= RPC_REFUSALS_LOGGED;
}

static struct rpc_session *session_find(struct mge_rpc *r, const char *worker_id)
{
    for (size_t i = 0; i < r->n_sess; i++)
        if (!strcmp(r->sess[i].worker_id, worker_id))
            return &r->sess[i];
    return NULL;
}

static struct rpc_session *session_find_name(struct mge_rpc *r, const char *name)
{
    for (size_t i = 0; i < r->n_sess; i++)
        if (!strcmp(r->sess[i].name, name))
            return &r->sess[i];
    return NULL;
}

static bool session_seen_nonce(const struct rpc_session *se, const uint8_t *nonce)
{
    unsigned n = se->n_seen < RPC_SEEN_NONCES ? se->n_seen : RPC_SEEN_NONCES;
    for (unsigned i = 0; i < n; i++)
        if (!memcmp(se->seen[i], nonce, MGE_NONCE_LEN))
            return true;
    return false;
}

/*
 * Seal @body (ours, freed here on every path) into a LinkReply in *@reply (mge_malloc'ed).
 * @key NULL: a refusal, sent without mac. @nonce: the server nonce of a Register reply or NULL.
 */
static int seal_reply(const uint8_t *key, const char *worker_id, uint64_t counter,
                      const uint8_t *nonce, uint8_t *body, size_t body_len, uint8_t **reply,
                      size_t *reply_len)
{
    Mge__LinkReply lr = MGE__LINK_REPLY__INIT;
    uint8_t mac[MGE_HMAC_LEN];
    int rc = MGE_OK;
    lr.counter = counter;
    lr.body.data = body;
    lr.body.len = body_len;
    if (nonce) {
        lr.nonce.data = (uint8_t *)nonce;
        lr.nonce.len = MGE_NONCE_LEN;
    }
    if (key) {
        rc = mge_link_mac(MGE_LINK_MAC_REPLY, key, MGE_HMAC_LEN, worker_id, counter, nonce,
                          nonce ? MGE_NONCE_LEN : 0, body, body_len, mac);
        if (rc != MGE_OK)
            goto out_free_body;
        lr.mac.data = mac;
        lr.mac.len = sizeof(mac);
    }
    *reply_len = mge__link_reply__get_packed_size(&lr);
    *reply = mge_malloc(*reply_len ? *reply_len : 1);
    if (!*reply) {
        rc = MGE_NOMEM;
        goto out_free_body;
    }
    mge__link_reply__pack(&lr, *reply);
out_free_body:
    mge_free(body);
    return rc;
}

/* A refusal: a LinkReply without mac whose ToWorker says @msg (and asks for a Register). */
static int refuse(uint64_t counter, const char *msg, bool reregister, uint8_t **reply,
                  size_t *reply_len)
{
    uint8_t *body = NULL;
    size_t body_len = 0;
    int rc = reply_error(msg, reregister, &body, &body_len);
    if (rc != MGE_OK)
        return rc;
    return seal_reply(NULL, "", counter, NULL, body, body_len, reply, reply_len);
}

/* A Register frame @f: prove the join token, register, start the session, reply. */
static int frame_register(struct mge_rpc *r, const Mge__LinkFrame *f, uint8_t **reply,
                          size_t *reply_len)
{
    Mge__ToCoordinator *m = NULL;
    struct rpc_session *se;
    uint8_t mac[MGE_HMAC_LEN], sn[MGE_NONCE_LEN], key[MGE_HMAC_LEN], *body = NULL;
    size_t body_len = 0;
    char id[40];
    int rc;

    if (f->nonce.len != MGE_NONCE_LEN || f->counter != 0)
        return refuse(f->counter, "bad register frame", false, reply, reply_len);
    rc = mge_link_mac(MGE_LINK_MAC_REGISTER, r->join_token, strlen(r->join_token), "", 0,
                      f->nonce.data, f->nonce.len, f->body.data, f->body.len, mac);
    if (rc != MGE_OK)
        return rc;
    if (!mge_ct_equal(mac, sizeof(mac), f->mac.data, f->mac.len)) {
        if (refusal_logged(r))
            mge_log_warn("worker link: register refused: bad join token proof");
        return refuse(0, "bad join token", false, reply, reply_len);
    }
    m = mge__to_coordinator__unpack(NULL, f->body.len, f->body.data);
    if (!m || m->msg_case != MGE__TO_COORDINATOR__MSG_REGISTER) {
        rc = refuse(0, "bad register frame", false, reply, reply_len);
        goto out_free_msg;
    }
    se = m->register_->name ? session_find_name(r, m->register_->name) : NULL;
    if (se && session_seen_nonce(se, f->nonce.data)) {
        /* an attacker's replay, or NNG REQ's resend of a Register already handled: a genuine
         * worker registers again with a new nonce */
        if (refusal_logged(r))
            mge_log_warn("worker '%s': replayed register refused", se->name);
        rc = refuse(0, "replayed register", true, reply, reply_len);
        goto out_free_msg;
    }
    rc = handle_register(r, m->register_, id, &body, &body_len);
    if (rc != MGE_OK || !*id) {
        if (rc == MGE_OK)
            rc = seal_reply(NULL, "", 0, NULL, body, body_len, reply, reply_len);
        goto out_free_msg;
    }
    rc = mge_random_bytes(sn, sizeof(sn));
    if (rc == MGE_OK)
        rc = mge_link_session_key(r->join_token, id, f->nonce.data, sn, key);
    if (rc == MGE_OK && !se && !(se = session_find(r, id))) {
        rc = mge_array_grow((void **)&r->sess, &r->cap_sess, r->n_sess + 1, sizeof(*r->sess));
        if (rc == MGE_OK) {
            se = &r->sess[r->n_sess++];
            memset(se, 0, sizeof(*se));
        }
    }
    if (rc != MGE_OK) {
        mge_free(body);
        goto out_free_msg;
    }
    /* a new session: the old key of this name is dead from here */
    snprintf(se->worker_id, sizeof(se->worker_id), "%s", id);
    snprintf(se->name, sizeof(se->name), "%s", m->register_->name);
    memcpy(se->key, key, sizeof(key));
    memcpy(se->seen[se->n_seen++ % RPC_SEEN_NONCES], f->nonce.data, MGE_NONCE_LEN);
    se->last_counter = 0;
    rc = seal_reply(se->key, id, 0, sn, body, body_len, reply, reply_len);
out_free_msg:
    if (m)
        mge__to_coordinator__free_unpacked(m, NULL);
    return rc;
}

/* A frame of session @f->worker_id: check its MAC and counter, then handle its heartbeat. */
static int frame_session(struct mge_rpc *r, const Mge__LinkFrame *f, uint8_t **reply,
                         size_t *reply_len)
{
    struct rpc_session *se = session_find(r, f->worker_id);
    Mge__ToCoordinator *m = NULL;
    uint8_t mac[MGE_HMAC_LEN], *body = NULL;
    size_t body_len = 0;
    int rc;

    if (!se) {
        /* a coordinator that restarted knows no session: the worker registers again */
        mge_log_debug("worker link: frame for unknown session '%.40s'", f->worker_id);
        return refuse(f->counter, "unknown worker", true, reply, reply_len);
    }
    rc = mge_link_mac(MGE_LINK_MAC_REQUEST, se->key, sizeof(se->key), se->worker_id, f->counter,
                      NULL, 0, f->body.data, f->body.len, mac);
    if (rc != MGE_OK)
        return rc;
    if (f->nonce.len || !mge_ct_equal(mac, sizeof(mac), f->mac.data, f->mac.len)) {
        if (refusal_logged(r))
            mge_log_warn("worker '%s' (%s): frame with a bad MAC refused", se->name,
                         se->worker_id);
        return refuse(f->counter, "bad frame MAC", true, reply, reply_len);
    }
    if (f->counter <= se->last_counter) {
        /* a replay, or NNG REQ's resend of a frame already handled: the worker registers
         * again, and what the lost reply carried is derived again (see handle_heartbeat) */
        if (refusal_logged(r))
            mge_log_warn("worker '%s' (%s): replayed frame refused (counter %llu, last %llu)",
                         se->name, se->worker_id, (unsigned long long)f->counter,
                         (unsigned long long)se->last_counter);
        return refuse(f->counter, "replayed frame", true, reply, reply_len);
    }
    se->last_counter = f->counter;
    m = mge__to_coordinator__unpack(NULL, f->body.len, f->body.data);
    if (!m || m->msg_case != MGE__TO_COORDINATOR__MSG_HEARTBEAT || !m->heartbeat->worker_id ||
        strcmp(m->heartbeat->worker_id, se->worker_id) != 0)
        rc = reply_error("malformed frame", false, &body, &body_len);
    else
        rc = handle_heartbeat(r, se, m->heartbeat, &body, &body_len);
    if (m)
        mge__to_coordinator__free_unpacked(m, NULL);
    if (rc != MGE_OK) {
        mge_free(body);
        return rc;
    }
    return seal_reply(se->key, se->worker_id, f->counter, NULL, body, body_len, reply, reply_len);
}

int mge_rpc_handle_frame(struct mge_rpc *r, const uint8_t *buf, size_t len, uint8_t **reply,
                         size_t *reply_len)
{
    Mge__LinkFrame *f;
    int rc;
    *reply = NULL;
    *reply_len = 0;
    f = mge__link_frame__unpack(NULL, len, buf);
    if (!f)
        return refuse(0, "malformed frame", false, reply, reply_len);
    if (!f->worker_id || !*f->worker_id)
        rc = frame_register(r, f, reply, reply_len);
    else
        rc = frame_session(r, f, reply, reply_len);
    mge__link_frame__free_unpacked(f, NULL);
    if (rc != MGE_OK) {
        mge_free(*reply);
        *reply = NULL;
        *reply_len = 0;
    }
    return rc;
}

static void *rpc_main(void *arg)
{
    struct mge_rpc *r = arg;
    while (!r->stop) {
        nng_msg *msg = NULL;
        uint8_t *reply = NULL;
        size_t reply_len = 0;
        int rv = nng_recvmsg(r->rep, &msg, 0);
        if (rv == NNG_ETIMEDOUT)
            continue;
        if (rv != 0) {
            if (rv == NNG_ECLOSED)
                break;
            mge_log_warn("worker link: receive failed: %s", nng_strerror(rv));
            continue;
        }
        r->requests++;
        if (mge_rpc_handle_frame(r, nng_msg_body(msg), nng_msg_len(msg), &reply, &reply_len) !=
                MGE_OK ||
            !reply) {
            /* No reply: the worker times out and asks again, which is always safe. */
            nng_msg_free(msg);
            mge_free(reply);
            continue;
        }
        nng_msg_clear(msg);
        if (nng_msg_append(msg, reply, reply_len) != 0 || nng_sendmsg(r->rep, msg, 0) != 0)
            nng_msg_free(msg);
        mge_free(reply);
    }
    return NULL;
}

int mge_rpc_set_sched(struct mge_rpc *r, struct mge_sched *s)
{
    r->sched = s;
    return MGE_OK;
}

int mge_rpc_start(struct mge_rpc *r, struct mge_sched *s)
{
    nng_listener l;
    char host[200] = "127.0.0.1";
    char url[256];
    int rv, port = 0;
    /* The notify socket listens on the same host, on a port of the kernel's choosing.  It is
     * bound last, after every fixed port of this process (the caller starts the HTTP API
     * first): an ephemeral port taken earlier could be the HTTP port a restart wants back. */
    mge_url_host(r->listen_url, host, sizeof(host));
    snprintf(url, sizeof(url), "%s://%s:0", r->scheme, host);
    if ((rv = rpc_listen(r, r->pub, url, &l)) != 0 ||
        (rv = nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port)) != 0)
        return err_from_nng(rv, "cannot listen on", url);
    snprintf(r->notify_url, sizeof(r->notify_url), "%s://%s:%d", r->scheme, host, port);
    mge_log_info("worker link on %s (notify %s)", r->listen_url, r->notify_url);
    r->sched = s;
    if (pthread_create(&r->thread, NULL, rpc_main, r) != 0)
        return MGE_ERR(MGE_INTERNAL, "cannot start the worker link thread");
    r->started = true;
    return MGE_OK;
}

void mge_rpc_stop(struct mge_rpc *r)
{
    if (!r || !r->started)
        return;
    r->stop = true;
    pthread_join(r->thread, NULL);
    r->started = false;
}

void mge_rpc_free(struct mge_rpc *r)
{
    if (!r)
        return;
    mge_rpc_stop(r);
    nng_close(r->rep);
    if (r->pub_open)
        nng_close(r->pub);
    for (size_t i = 0; i < r->n_sess; i++)
        mge_ckpt_upload_fini(&r->sess[i].up);
    mge_free(r->fetch_buf);
    if (r->tls)
        nng_tls_config_free(r->tls);
    /* the session keys die with the process; do not leave them in freed memory */
    if (r->sess)
        explicit_bzero(r->sess, r->cap_sess * sizeof(*r->sess));
    mge_free(r->sess);
    mge_free(r);
}
