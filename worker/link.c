/* link.c: mge-worker's NNG link to the coordinator (see link.h). */
#include "link.h"

#include <errno.h>
#include <fcntl.h>
#include <nng/nng.h>
#include <nng/protocol/pubsub0/sub.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/crypto.h"
#include "common/err.h"
#include "common/gpu.h"
#include "common/log.h"
#include "common/url.h"
#include "engine/ckpt.h"
#include "link_frame.h"
#include "procstat.h"
#include "proto/worker.pb-c.h"
#include "ranks.h"

#define HB_MAX_LINES 2000      /* lines per heartbeat; the rest go in the next one */
#define HB_MIN_GAP_MS 20       /* at most ~50 heartbeats a second, so output is batched */
#define XFER_GAP_MS 50         /* checkpoint pieces: at most 20 MiB/s, so a rank's own CPU and
                                  the coordinator's disk are not swamped by its uploads */
#define RPC_TIMEOUT_MS 3000
#define CKPT_CHUNK ((size_t)1 << 20) /* checkpoint bytes per frame, both ways */

/* A checkpoint file on its way to or from the coordinator's store (link thread only). */
struct xfer {
    bool active;
    struct mge_ckpt_ref ref;
    int fd;
    uint64_t offset, size;
    char tmp[1200]; /* fetch: the partial file */
};

struct mge_link {
    struct mge_link_opts o;
    struct mge_ranks *rs;
    nng_socket req, sub;
    bool sub_open, dialed_sub;
    nng_dialer sub_dialer;
    nng_tls_config *tls; /* a tls+tcp:// coordinator (both its ports), or NULL */
    const char *scheme;  /* "tcp" or "tls+tcp" */
    char notify_url[300];
    char coord_host[200];
    pthread_t thread, sub_thread;
    bool sub_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, kicked;         /* [mu] */
    char worker_id[40];
    bool registered;
    int hb_ms;
    uint8_t key[MGE_HMAC_LEN];        /* session key (see LinkFrame in proto/worker.proto) */
    uint64_t counter;                 /* of the last frame sent in this session */
    uint8_t nonce[MGE_NONCE_LEN];     /* client nonce of the last Register */
    struct xfer up, down;             /* checkpoint upload and fetch in progress */
    uint8_t *chunk;                   /* CKPT_CHUNK bytes: the upload's next piece */
    bool xfer_next;                   /* a transfer is under way: its next piece is due soon */
};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void mge_link_kick(void *arg)
{
    struct mge_link *l = arg;
    pthread_mutex_lock(&l->mu);
    l->kicked = true;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* Wait until kicked or @ms passed; false when stopping. */
static bool link_wait(struct mge_link *l, int64_t ms)
{
    struct timespec ts;
    bool stop;
    pthread_mutex_lock(&l->mu);
    if (!l->kicked && !l->stop && ms > 0) {
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += ms / 1000;
        ts.tv_nsec += (ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&l->cv, &l->mu, &ts);
    }
    l->kicked = false;
    stop = l->stop;
    pthread_mutex_unlock(&l->mu);
    return !stop;
}

static bool stopping(struct mge_link *l)
{
    bool s;
    pthread_mutex_lock(&l->mu);
    s = l->stop;
    pthread_mutex_unlock(&l->mu);
    return s;
}

/*
 * Build the rank reports and up to HB_MAX_LINES lines and pack @msg into *@out
 * (mge_malloc'ed). Called with rs->mu held, so the borrowed strings stay put.
 */
static int pack_locked(struct mge_link *l, Mge__ToCoordinator *msg, Mge__Register *reg,
                       Mge__Heartbeat *hb, uint8_t **out, size_t *out_len)
{
    struct mge_ranks *rs = l->rs;
    size_t n_lines = 0, k = 0;
    Mge__RankReport *rr = NULL, **rrp = NULL;
    Mge__Line *ln = NULL, **lnp = NULL;
    struct mge_session_stat *groups = NULL;
    size_t *group_of = NULL, n_groups = 0;
    int rc = MGE_OK;

    if (rs->n) {
        rr = mge_calloc(rs->n, sizeof(*rr));
        rrp = mge_calloc(rs->n, sizeof(*rrp));
        groups = mge_calloc(rs->n, sizeof(*groups));
        group_of = mge_calloc(rs->n, sizeof(*group_of));
        if (!rr || !rrp || !groups || !group_of) {
            rc = MGE_NOMEM;
            goto out_free;
        }
    }
    for (size_t i = 0; i < rs->n; i++) {
        struct mge_rank *r = rs->r[i];
        mge__rank_report__init(&rr[i]);
        rr[i].job_id = r->job_id;
        rr[i].attempt = r->attempt;
        rr[i].rank = r->rank;
        rr[i].running = r->state != MGE_RANK_EXITED;
        rr[i].exit_code = r->exit_code;
        rr[i].term_signal = r->term_signal;
        rr[i].failure = r->failure;
        rr[i].worker_fault = r->worker_fault;
        rr[i].pid = r->pid;
        if (r->state == MGE_RANK_RUNNING && r->pid > 0 && n_groups < rs->n) {
            groups[n_groups].sid = r->pid;
            group_of[n_groups++] = i;
        }
        rrp[i] = &rr[i];
        n_lines += r->n_lines;
    }
    /* the ranks' process groups, for the watchdog: stopped or idle while peers spin */
    if (n_groups && mge_procstat_sessions(groups, n_groups) == MGE_OK) {
        for (size_t g = 0; g < n_groups; g++) {
            rr[group_of[g]].stopped = groups[g].stopped;
            rr[group_of[g]].cpu_ms = groups[g].cpu_ms;
        }
    }
    if (hb && n_lines) {
        if (n_lines > HB_MAX_LINES)
            n_lines = HB_MAX_LINES;
        ln = mge_calloc(n_lines, sizeof(*ln));
        lnp = mge_calloc(n_lines, sizeof(*lnp));
        if (!ln || !lnp) {
            rc = MGE_NOMEM;
            goto out_free;
        }
        for (size_t i = 0; i < rs->n && k < n_lines; i++) {
            struct mge_rank *r = rs->r[i];
            for (size_t j = 0; j < r->n_lines && k < n_lines; j++, k++) {
                mge__line__init(&ln[k]);
                ln[k].job_id = r->job_id;
                ln[k].attempt = r->attempt;
                ln[k].rank = r->rank;
                ln[k].seq = r->lines[j].seq;
                ln[k].stream = r->lines[j].stream;
                ln[k].text = r->lines[j].text;
                ln[k].time_ms = r->lines[j].time_ms;
                lnp[k] = &ln[k];
            }
        }
    }
    /* A rank reported as exited must have all its lines in this message or acked before:
     * lines come first in rank order, so an exit is only reported with its whole tail. */
    for (size_t i = 0; i < rs->n; i++) {
        size_t sent = 0, before = 0;
        struct mge_rank *r = rs->r[i];
        for (size_t j = 0; j < i; j++)
            before += rs->r[j]->n_lines;
        sent = before >= k ? 0 : k - before;
        if (sent < r->n_lines)
            rr[i].running = true; /* its exit goes with the rest of its output */
    }
    if (reg) {
        reg->n_ranks = rs->n;
        reg->ranks = rrp;
    } else {
        hb->n_ranks = rs->n;
        hb->ranks = rrp;
        hb->n_lines = k;
        hb->lines = lnp;
    }
    *out_len = mge__to_coordinator__get_packed_size(msg);
    *out = mge_malloc(*out_len ? *out_len : 1);
    if (!*out) {
        rc = MGE_NOMEM;
        goto out_free;
    }
    mge__to_coordinator__pack(msg, *out);
out_free:
    mge_free(groups);
    mge_free(group_of);
    mge_free(rr);
    mge_free(rrp);
    mge_free(ln);
    mge_free(lnp);
    return rc;
}

/* Dial @url from @s in the background, through l->tls when set. Returns NNG's code. */
static int link_dial(struct mge_link *l, nng_socket s, const char *url, nng_dialer *d)
{
    int rv = nng_dialer_create(d, s, url);
    if (rv == 0 && l->tls)
        rv = nng_dialer_set_ptr(*d, NNG_OPT_TLS_CONFIG, l->tls);
    if (rv == 0)
        rv = nng_dialer_start(*d, NNG_FLAG_NONBLOCK);
    return rv;
}

/*
 * The client TLS configuration of a tls+tcp:// coordinator into l->tls: its certificate must
 * verify against CA file @cacert for the host of the URL.
 */
static int link_tls_new(struct mge_link *l, const char *cacert)
{
    int rv;
    if (!cacert)
        return MGE_ERR(MGE_INVAL,
                       "coordinator '%s' is tls+tcp://: give the CA its certificate is "
                       "signed by with --cacert FILE",
                       l->o.coordinator);
    if ((rv = nng_tls_config_alloc(&l->tls, NNG_TLS_MODE_CLIENT)) != 0)
        return MGE_ERR(MGE_NET, "no TLS for '%s': %s", l->o.coordinator, nng_strerror(rv));
    if ((rv = nng_tls_config_ca_file(l->tls, cacert)) != 0)
        return MGE_ERR(MGE_INVAL, "CA file '%s' (--cacert): %s", cacert, nng_strerror(rv));
    if ((rv = nng_tls_config_auth_mode(l->tls, NNG_TLS_AUTH_MODE_REQUIRED)) != 0 ||
        (rv = nng_tls_config_server_name(l->tls, l->coord_host)) != 0)
        return MGE_ERR(MGE_NET, "TLS for '%s': %s", l->o.coordinator, nng_strerror(rv));
    if (strspn(l->coord_host, "0123456789.") == strlen(l->coord_host) || strchr(l->coord_host, ':'))
        mge_log_warn("coordinator '%s' is an IP address: NNG's TLS (mbedtls 2) checks the "
                     "certificate's DNS names only, so this is likely to fail to verify; dial "
                     "a name the certificate holds",
                     l->o.coordinator);
    return MGE_OK;
}

static void sub_connect(struct mge_link *l, const char *notify_url)
{
    const char *colon = strrchr(notify_url, ':');
    char url[300];
    if (!l->sub_open || !colon)
        return;
    snprintf(url, sizeof(url), "%s://%s%s", l->scheme, l->coord_host, colon);
    if (l->dialed_sub && !strcmp(url, l->notify_url))
        return;
    if (l->dialed_sub)
        nng_dialer_close(l->sub_dialer);
    l->dialed_sub = link_dial(l, l->sub, url, &l->sub_dialer) == 0;
    snprintf(l->notify_url, sizeof(l->notify_url), "%s", url);
    nng_socket_set(l->sub, NNG_OPT_SUB_SUBSCRIBE, l->worker_id, strlen(l->worker_id));
}

static void apply_reply(struct mge_link *l, Mge__ToWorker *tw)
{
    bool wake = false;
    if (tw->heartbeat_ms > 0)
        l->hb_ms = tw->heartbeat_ms;
    for (size_t i = 0; i < tw->n_assign; i++) {
        Mge__Assign *a = tw->assign[i];
        struct mge_rank_assign ra = {.job_id = a->job_id,
                                     .attempt = a->attempt,
                                     .rank = a->rank,
                                     .world = a->world_size,
                                     .spec_yaml = a->spec_yaml,
                                     .resume = a->resume,
                                     .resume_copy = a->resume_copy,
                                     .launch_token = a->launch_token,
                                     .gpu_ids = a->gpu_ids};
        struct mge_peer *peers = a->n_peers ? mge_calloc(a->n_peers, sizeof(*peers)) : NULL;
        for (size_t k = 0; peers && k < a->n_peers; k++) {
            peers[k].rank = a->peers[k]->rank;
            peers[k].name = a->peers[k]->name;
            peers[k].launch_url = a->peers[k]->launch_url;
            peers[k].launch_cert = a->peers[k]->launch_cert;
        }
        ra.peers = peers;
        ra.n_peers = peers ? a->n_peers : 0;
        /* on failure the rank is not in the table: the coordinator assigns it again */
        if (a->n_peers == 0 || peers)
            mge_ranks_assign(l->rs, &ra);
        mge_free(peers);
        wake = true;
    }
    for (size_t i = 0; i < tw->n_cancel; i++) {
        mge_ranks_cancel(l->rs, tw->cancel[i]->job_id, tw->cancel[i]->attempt,
                         tw->cancel[i]->grace_ms);
        wake = true;
    }
    for (size_t i = 0; i < tw->n_checkpoint; i++) {
        mge_ranks_checkpoint(l->rs, tw->checkpoint[i]->job_id, tw->checkpoint[i]->attempt);
        wake = true;
    }
    for (size_t i = 0; i < tw->n_acks; i++) {
        Mge__Ack *a = tw->acks[i];
        mge_ranks_ack(l->rs, a->job_id, a->attempt, a->rank, a->seq, a->exit_acked);
        wake = true;
    }
    if (wake)
        mge_ranks_wake(l->rs);
}

/*
 * Wrap @body (a packed ToCoordinator) into a LinkFrame in *@out (mge_malloc'ed): a Register
 * (with a new client nonce) when not registered, else the next frame of the session.
 */
static int seal_frame(struct mge_link *l, const uint8_t *body, size_t body_len, uint8_t **out,
                      size_t *out_len)
{
    if (!l->registered) {
        int rc = mge_random_bytes(l->nonce, sizeof(l->nonce));
        if (rc != MGE_OK)
            return rc;
        return mge_link_frame_seal(l->o.join_token, strlen(l->o.join_token), NULL, 0, l->nonce,
                                   sizeof(l->nonce), body, body_len, out, out_len);
    }
    l->counter++;
    return mge_link_frame_seal(l->key, sizeof(l->key), l->worker_id, l->counter, NULL, 0, body,
                               body_len, out, out_len);
}

/*
 * Check reply @lr to the frame just sent and unpack its ToWorker into *@out. A reply without
 * mac is a refusal: only its error and reregister are believed. A reply with a mac must be ours:
 * the key of this session (of the session it starts, for a Register) and our counter.
 */
static int open_reply(struct mge_link *l, const Mge__LinkReply *lr, Mge__ToWorker **out,
                      bool *authentic)
{
    Mge__ToWorker *tw = mge__to_worker__unpack(NULL, lr->body.len, lr->body.data);
    uint8_t mac[MGE_HMAC_LEN], key[MGE_HMAC_LEN];
    const char *id = l->worker_id;
    int rc;

    *out = NULL;
    *authentic = false;
    if (!tw)
        return MGE_ERR(MGE_PROTO, "malformed reply from the coordinator");
    if (!lr->mac.len) {
        *out = tw;
        return MGE_OK;
    }
    memcpy(key, l->key, sizeof(key));
    if (!l->registered) {
        if (!tw->worker_id || !*tw->worker_id || strlen(tw->worker_id) >= sizeof(l->worker_id) ||
            lr->nonce.len != MGE_NONCE_LEN) {
            rc = MGE_ERR(MGE_PROTO, "malformed register reply from the coordinator");
            goto err_free;
        }
        id = tw->worker_id;
        rc = mge_link_session_key(l->o.join_token, id, l->nonce, lr->nonce.data, key);
        if (rc != MGE_OK)
            goto err_free;
    }
    rc = mge_link_mac(MGE_LINK_MAC_REPLY, key, sizeof(key), id, lr->counter, lr->nonce.data,
                      lr->nonce.len, lr->body.data, lr->body.len, mac);
    if (rc != MGE_OK)
        goto err_free;
    if (lr->counter != (l->registered ? l->counter : 0) ||
        !mge_ct_equal(mac, sizeof(mac), lr->mac.data, lr->mac.len)) {
        rc = MGE_ERR(MGE_AUTH, "reply with a bad MAC or counter ignored (not from a coordinator "
                               "that knows our join token)");
        goto err_free;
    }
    if (!l->registered) {
        memcpy(l->key, key, sizeof(key));
        l->counter = 0;
    }
    *authentic = true;
    *out = tw;
    return MGE_OK;

err_free:
    mge__to_worker__free_unpacked(tw, NULL);
    return rc;
}

/* ---- checkpoint replication: uploads of rank 0's checkpoints, fetches of the coordinator's ----
 */

static void xfer_close(struct xfer *x)
{
    if (x->active && x->fd >= 0)
        close(x->fd);
    x->active = false;
}

/* Put the next piece of the upload in progress (or of a new one) into @c; false if none. */
static bool upload_fill(struct mge_link *l, Mge__CkptChunk *c)
{
    struct xfer *x = &l->up;
    struct stat sb;
    ssize_t n;
    if (!l->chunk && !(l->chunk = mge_malloc(CKPT_CHUNK)))
        return false;
    while (!x->active && mge_ranks_upload_next(l->rs, &x->ref)) {
        x->fd = open(x->ref.path, O_RDONLY | O_CLOEXEC);
        if (x->fd >= 0 && fstat(x->fd, &sb) == 0) {
            x->active = true;
            x->offset = 0;
            x->size = (uint64_t)sb.st_size;
            break;
        }
        mge_log_warn("job %lld: cannot upload checkpoint '%s': %s", (long long)x->ref.job_id,
                     x->ref.path, strerror(errno));
        if (x->fd >= 0)
            close(x->fd);
        mge_ranks_upload_done(l->rs, x->ref.job_id, x->ref.attempt, x->ref.step);
    }
    if (!x->active)
        return false;
    n = x->size - x->offset > CKPT_CHUNK ? (ssize_t)CKPT_CHUNK : (ssize_t)(x->size - x->offset);
    if (n > 0 && pread(x->fd, l->chunk, (size_t)n, (off_t)x->offset) != n) {
        mge_log_warn("job %lld: cannot read checkpoint '%s': %s", (long long)x->ref.job_id,
                     x->ref.path, strerror(errno));
        mge_ranks_upload_done(l->rs, x->ref.job_id, x->ref.attempt, x->ref.step);
        xfer_close(x);
        return false;
    }
    mge__ckpt_chunk__init(c);
    c->job_id = x->ref.job_id;
    c->attempt = x->ref.attempt;
    c->name = x->ref.name;
    c->offset = x->offset;
    c->size = x->size;
    c->data.data = l->chunk;
    c->data.len = (size_t)n;
    return true;
}

/* The coordinator's answer to an upload chunk. */
static void upload_answer(struct mge_link *l, const Mge__CkptAck *a)
{
    struct xfer *x = &l->up;
    if (!x->active || a->job_id != x->ref.job_id || a->attempt != x->ref.attempt || !a->name ||
        strcmp(a->name, x->ref.name) != 0)
        return;
    if ((a->error && *a->error) || a->committed) {
        if (a->committed)
            mge_log_info("job %lld: checkpoint %s (%llu bytes) committed to the coordinator",
                         (long long)x->ref.job_id, x->ref.name, (unsigned long long)x->size);
        else
            mge_log_warn("job %lld: coordinator refused checkpoint %s: %s",
                         (long long)x->ref.job_id, x->ref.name, a->error);
        mge_ranks_upload_done(l->rs, x->ref.job_id, x->ref.attempt, x->ref.step);
        xfer_close(x);
        return;
    }
    x->offset = a->offset <= x->size ? a->offset : 0;
    mge_link_kick(l); /* the next piece at once */
}

/* Ask for the next piece of the fetch in progress (or of a new one) in @f; false if none. */
static bool fetch_fill(struct mge_link *l, Mge__CkptFetch *f)
{
    struct xfer *x = &l->down;
    while (!x->active && mge_ranks_fetch_next(l->rs, &x->ref)) {
        snprintf(x->tmp, sizeof(x->tmp), "%s/%s.part", x->ref.path, x->ref.name);
        x->fd = open(x->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (x->fd >= 0) {
            x->active = true;
            x->offset = 0;
            x->size = 0;
            break;
        }
        char why[1400];
        snprintf(why, sizeof(why), "cannot create '%s': %s", x->tmp, strerror(errno));
        mge_ranks_fetch_done(l->rs, x->ref.job_id, x->ref.attempt, NULL, why);
    }
    if (!x->active)
        return false;
    mge__ckpt_fetch__init(f);
    f->job_id = x->ref.job_id;
    f->attempt = x->ref.attempt;
    f->name = x->ref.name;
    f->offset = x->offset;
    return true;
}

/* The whole copy is here: verify it and put it in place; the path into @out. */
static int fetch_finish(struct xfer *x, char *out, size_t out_len, char *why, size_t why_len)
{
    struct mge_ckpt *ck = NULL;
    int rc;
    if (fsync(x->fd) != 0) {
        snprintf(why, why_len, "cannot sync '%s': %s", x->tmp, strerror(errno));
        return MGE_IO;
    }
    if ((rc = mge_ckpt_read(x->tmp, &ck, why, why_len)) != MGE_OK)
        return rc;
    mge_ckpt_free(ck);
    snprintf(out, out_len, "%s/%s", x->ref.path, x->ref.name);
    if (rename(x->tmp, out) != 0) {
        snprintf(why, why_len, "cannot rename '%s': %s", x->tmp, strerror(errno));
        return MGE_IO;
    }
    return MGE_OK;
}

/* The coordinator's answer to a fetch. */
static void fetch_answer(struct mge_link *l, const Mge__CkptData *d)
{
    struct xfer *x = &l->down;
    char why[1400] = "", path[1300];
    int rc = MGE_OK;
    if (!x->active || d->job_id != x->ref.job_id || d->attempt != x->ref.attempt || !d->name ||
        strcmp(d->name, x->ref.name) != 0 || d->offset != x->offset)
        return;
    if (d->error && *d->error) {
        snprintf(why, sizeof(why), "%s", d->error);
        rc = MGE_NOENT;
    } else if (d->size > ((uint64_t)4 << 30) || d->data.len > CKPT_CHUNK ||
               d->offset + d->data.len > d->size || (x->size && d->size != x->size) ||
               (d->data.len == 0 && d->offset < d->size)) {
        snprintf(why, sizeof(why), "malformed piece at %llu", (unsigned long long)d->offset);
        rc = MGE_PROTO;
    } else if (d->data.len &&
               pwrite(x->fd, d->data.data, d->data.len, (off_t)d->offset) != (ssize_t)d->data.len) {
        snprintf(why, sizeof(why), "cannot write '%s': %s", x->tmp, strerror(errno));
        rc = MGE_IO;
    }
    if (rc == MGE_OK) {
        x->size = d->size;
        x->offset += d->data.len;
        if (x->offset < x->size) {
            mge_link_kick(l);
            return;
        }
        rc = fetch_finish(x, path, sizeof(path), why, sizeof(why));
    }
    if (rc != MGE_OK)
        unlink(x->tmp);
    xfer_close(x);
    mge_ranks_fetch_done(l->rs, x->ref.job_id, x->ref.attempt, rc == MGE_OK ? path : NULL, why);
}

/* One request/reply. MGE_OK when a reply came and was applied. */
static int exchange(struct mge_link *l)
{
    Mge__ToCoordinator msg = MGE__TO_COORDINATOR__INIT;
    Mge__Register reg = MGE__REGISTER__INIT;
    Mge__Heartbeat hb = MGE__HEARTBEAT__INIT;
    Mge__Slots slots = MGE__SLOTS__INIT;
    Mge__Gpu gpus[MGE_GPUS_MAX], *gpup[MGE_GPUS_MAX];
    Mge__CkptChunk chunk;
    Mge__CkptFetch fetch;
    Mge__LinkReply *lr;
    Mge__ToWorker *tw;
    uint8_t *buf = NULL, *frame = NULL;
    size_t len = 0, frame_len = 0;
    nng_msg *reply = NULL;
    bool authentic;
    int rv, rc;

    if (!l->registered) {
        slots.cpus = l->o.cpus;
        slots.gpus = l->o.gpus;
        slots.memory_mb = l->o.memory_mb;
        slots.device = l->o.gpus > 0 ? (char *)"gpu" : (char *)"cpu";
        for (int i = 0; i < l->o.gpus && i < MGE_GPUS_MAX && l->o.gpu; i++) {
            mge__gpu__init(&gpus[i]);
            gpus[i].name = (char *)l->o.gpu[i].name;
            gpus[i].memory_mb = l->o.gpu[i].memory_mb;
            gpup[i] = &gpus[i];
            slots.n_gpu_list = (size_t)i + 1;
        }
        slots.gpu_list = gpup;
        reg.name = (char *)l->o.name;
        reg.host = (char *)l->o.host;
        reg.version = (char *)l->o.version;
        reg.launch_url = (char *)(l->o.launch_url ? l->o.launch_url : "");
        reg.launch_cert = (char *)(l->o.launch_cert ? l->o.launch_cert : "");
        reg.slots = &slots;
        msg.msg_case = MGE__TO_COORDINATOR__MSG_REGISTER;
        msg.register_ = &reg;
    } else {
        hb.worker_id = l->worker_id;
        msg.msg_case = MGE__TO_COORDINATOR__MSG_HEARTBEAT;
        msg.heartbeat = &hb;
        if (upload_fill(l, &chunk))
            hb.upload = &chunk;
        if (fetch_fill(l, &fetch))
            hb.fetch = &fetch;
    }
    pthread_mutex_lock(&l->rs->mu);
    rc = pack_locked(l, &msg, l->registered ? NULL : &reg, l->registered ? &hb : NULL, &buf, &len);
    pthread_mutex_unlock(&l->rs->mu);
    if (rc != MGE_OK)
        return rc;
    rc = seal_frame(l, buf, len, &frame, &frame_len);
    mge_free(buf);
    if (rc != MGE_OK)
        return rc;
    rv = nng_send(l->req, frame, frame_len, 0);
    mge_free(frame);
    if (rv != 0)
        return MGE_NET;
    rv = nng_recvmsg(l->req, &reply, 0);
    if (rv != 0)
        return MGE_NET;
    lr = mge__link_reply__unpack(NULL, nng_msg_len(reply), nng_msg_body(reply));
    nng_msg_free(reply);
    if (!lr)
        return MGE_ERR(MGE_PROTO, "malformed reply from the coordinator");
    rc = open_reply(l, lr, &tw, &authentic);
    mge__link_reply__free_unpacked(lr, NULL);
    if (rc != MGE_OK) {
        l->registered = false; /* whatever went wrong with the session, start a new one */
        return rc;
    }
    if (tw->reregister) {
        /* unauthenticated or not, this can only make us start a new session */
        mge_log_info("coordinator asks us to register again%s%s", tw->error ? ": " : "",
                     tw->error ? tw->error : "");
        l->registered = false;
        mge__to_worker__free_unpacked(tw, NULL);
        return MGE_OK;
    }
    if (tw->error && *tw->error) {
        mge_log_error("coordinator refused us: %s", tw->error);
        mge__to_worker__free_unpacked(tw, NULL);
        return MGE_AUTH;
    }
    if (!authentic) {
        mge__to_worker__free_unpacked(tw, NULL);
        return MGE_ERR(MGE_PROTO, "reply without MAC ignored");
    }
    if (!l->registered) {
        snprintf(l->worker_id, sizeof(l->worker_id), "%s", tw->worker_id);
        l->registered = true;
        mge_log_info("registered with the coordinator as %s", l->worker_id);
    }
    if (tw->notify_url && *tw->notify_url)
        sub_connect(l, tw->notify_url);
    apply_reply(l, tw);
    if (tw->upload_ack)
        upload_answer(l, tw->upload_ack);
    if (tw->fetched)
        fetch_answer(l, tw->fetched);
    mge__to_worker__free_unpacked(tw, NULL);
    /* a checkpoint on its way: the next piece goes XFER_GAP_MS later, not at the next
     * heartbeat (a 15 MB checkpoint took 15 heartbeats: 7.5 s at 500 ms, 15 s at the default) */
    l->xfer_next = l->up.active || l->down.active;
    return MGE_OK;
}

static void *link_main(void *arg)
{
    struct mge_link *l = arg;
    int64_t last = 0, backoff = 100;
    bool was_down = false;
    while (!stopping(l)) {
        int64_t now = mono_ms();
        int rc = exchange(l);
        last = now;
        if (rc == MGE_OK) {
            if (was_down)
                mge_log_info("coordinator reachable again");
            was_down = false;
            backoff = 100;
            /* wait for the interval or something to send, but not less than the gap; a
             * checkpoint piece to send next waits XFER_GAP_MS only */
            if (!link_wait(l, (l->xfer_next ? XFER_GAP_MS : l->hb_ms) - (mono_ms() - last)))
                break;
            now = mono_ms();
            if (now - last < HB_MIN_GAP_MS) {
                struct timespec ts = {0, (long)(HB_MIN_GAP_MS - (now - last)) * 1000000L};
                nanosleep(&ts, NULL);
            }
            continue;
        }
        if (!was_down)
            mge_log_warn("coordinator unreachable (%s); ranks keep running, retrying",
                         mge_strerror(rc));
        was_down = true;
        if (rc == MGE_AUTH)
            backoff = 5000;
        {
            struct timespec ts = {(time_t)(backoff / 1000), (long)(backoff % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
    }
    return NULL;
}

static void *sub_main(void *arg)
{
    struct mge_link *l = arg;
    while (!stopping(l)) {
        void *buf = NULL;
        size_t sz = 0;
        if (nng_recv(l->sub, &buf, &sz, NNG_FLAG_ALLOC) == 0) {
            nng_free(buf, sz);
            mge_link_kick(l);
        }
    }
    return NULL;
}

int mge_link_start(const struct mge_link_opts *opts, struct mge_ranks *rs, struct mge_link **out)
{
    struct mge_link *l;
    nng_dialer req_dialer;
    int rv;

    *out = NULL;
    l = mge_calloc(1, sizeof(*l));
    if (!l)
        return MGE_NOMEM;
    l->o = *opts;
    l->rs = rs;
    l->hb_ms = opts->heartbeat_ms > 0 ? opts->heartbeat_ms : 1000;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    snprintf(l->coord_host, sizeof(l->coord_host), "127.0.0.1");
    mge_url_host(opts->coordinator, l->coord_host, sizeof(l->coord_host));
    l->scheme = "tcp";
    if (!strncmp(opts->coordinator, "tls+tcp://", 10)) {
        int rc;
        l->scheme = "tls+tcp";
        if ((rc = link_tls_new(l, opts->cacert)) != MGE_OK) {
            if (l->tls)
                nng_tls_config_free(l->tls);
            mge_free(l);
            return rc;
        }
    }
    if ((rv = nng_req0_open(&l->req)) != 0)
        goto err_nng;
    nng_socket_set_ms(l->req, NNG_OPT_RECVTIMEO, RPC_TIMEOUT_MS);
    nng_socket_set_ms(l->req, NNG_OPT_SENDTIMEO, RPC_TIMEOUT_MS);
    nng_socket_set_ms(l->req, NNG_OPT_RECONNMINT, 100);
    nng_socket_set_ms(l->req, NNG_OPT_RECONNMAXT, 2000);
    nng_socket_set_size(l->req, NNG_OPT_RECVMAXSZ, 64 << 20);
    if ((rv = link_dial(l, l->req, opts->coordinator, &req_dialer)) != 0)
        goto err_close;
    if (nng_sub0_open(&l->sub) == 0) {
        l->sub_open = true;
        nng_socket_set_ms(l->sub, NNG_OPT_RECVTIMEO, 300);
        nng_socket_set_ms(l->sub, NNG_OPT_RECONNMINT, 100);
        nng_socket_set_ms(l->sub, NNG_OPT_RECONNMAXT, 2000);
    }
    rs->on_output = mge_link_kick;
    rs->on_output_arg = l;
    if (pthread_create(&l->thread, NULL, link_main, l) != 0) {
        rv = NNG_ENOMEM;
        goto err_close;
    }
    if (l->sub_open && pthread_create(&l->sub_thread, NULL, sub_main, l) == 0)
        l->sub_started = true;
    *out = l;
    return MGE_OK;

err_close:
    nng_close(l->req);
    if (l->sub_open)
        nng_close(l->sub);
err_nng:
    if (l->tls)
        nng_tls_config_free(l->tls);
    mge_free(l);
    return MGE_ERR(MGE_NET, "cannot dial '%s': %s", opts->coordinator, nng_strerror(rv));
}

void mge_link_stop(struct mge_link *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    nng_close(l->req); /* unblocks a pending send/recv */
    pthread_join(l->thread, NULL);
    if (l->sub_open) {
        nng_close(l->sub);
        if (l->sub_started)
            pthread_join(l->sub_thread, NULL);
    }
    l->rs->on_output = NULL;
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    explicit_bzero(l->key, sizeof(l->key));
    xfer_close(&l->up);
    if (l->down.active)
        unlink(l->down.tmp);
    xfer_close(&l->down);
    mge_free(l->chunk);
    if (l->tls)
        nng_tls_config_free(l->tls);
    mge_free(l);
}
