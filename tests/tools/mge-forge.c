/*
 * mge-forge.c: an ATTACK TOOL for tests/integration/control_attack.sh. It speaks the real
 * worker link (proto/worker.proto over NNG, common/crypto.h) as an attacker with network
 * access would, and prints what came back; the test script decides what that means.
 *
 *   mge-forge heartbeat WORKER_URL WORKER_ID JOB ATTEMPT PATH
 *       heartbeats for a stolen worker id (from GET /workers) without its session key: a MAC of
 *       zeros, no MAC, and the frame as it was before frames were authenticated. Each says the
 *       job's rank 0 exited 0 and carries a metric, a summary and checkpoint notices for PATH
 *       and /etc/shadow. Exit 0 when every reply is a refusal without commands, 1 otherwise.
 *   mge-forge flood WORKER_URL WORKER_ID N
 *       N forged heartbeats (MAC of zeros) as fast as replies come. Exit 0 when all refused.
 *   mge-forge register WORKER_URL NAME
 *       a Register whose proof is made with a wrong join token. Exit 0 when refused.
 *   mge-forge replay WORKER_URL JOIN NAME
 *       a genuine session (this tool knows the join token): the Register sent again, frame 1
 *       sent again, a frame with a changed body and one with an old counter are refused, while
 *       frames 1 and 2 are accepted (the session survives the replays); then a new Register of
 *       NAME: a frame under the old key is refused, one under the new key accepted. Exit 0 when
 *       all of that holds.
 *       NAME registers with no slots, so nothing is ever placed on it.
 *   mge-forge slots WORKER_URL JOIN NAME
 *       genuine Registers of NAME (this tool knows the join token) that claim what no machine
 *       has: negative or absurd cores, memory or GPUs, an unknown device, a GPU list longer
 *       than its count, GPUs with negative or absurd memory, a name with a newline. Each must
 *       be refused; then NAME registers with sane claims (one 80 GiB GPU, no cores, so nothing
 *       is placed on it). Exit 0 when so.
 *   mge-forge launch LAUNCH_URL JOB ATTEMPT RANK TOKEN COMMAND
 *       a LaunchRequest to a worker's launch socket. Exit 0 when refused, 1 when accepted.
 *   mge-forge upload WORKER_URL JOIN NAME JOB ATTEMPT CKPT_NAME FILE [SIZE]
 *       a genuine session as worker NAME (this tool knows the join token; a NAME that exists
 *       takes over its session) uploads FILE as checkpoint CKPT_NAME of JOB's ATTEMPT to the
 *       coordinator's store, in 1 MiB chunks (Heartbeat.upload), declaring SIZE bytes if given.
 *       Prints each answer. Exit 0 when the upload was refused, 1 when it was committed.
 *   mge-forge mitm LISTEN_URL UPSTREAM_URL PORT_FILE JOB SECONDS
 *       a man in the middle between a worker and the coordinator (the worker's --coordinator is
 *       this tool: the port it listens on goes to PORT_FILE as "port=N"). It relays frames and
 *       replies and keeps the genuine reply that assigned JOB; four relayed frames later it
 *       answers the worker's next frames itself, one attack each: that Assign reply again
 *       (replayed: an old counter, a genuine MAC), that reply with its counter changed to the
 *       frame's, a reply asking JOB for a checkpoint and assigning a job JOB+1000 with a MAC of
 *       zeros, then one that also cancels JOB without a MAC, and that one as a refusal (an
 *       error). Then it relays again until SECONDS have passed since it started. Prints
 *       "attacks done" after the fifth. Exit 0 when all five were sent.
 */
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/crypto.h"
#include "proto/worker.pb-c.h"

static nng_socket dial(const char *url)
{
    nng_socket s;
    int rv;
    if ((rv = nng_req0_open(&s)) != 0 || (rv = nng_dial(s, url, NULL, 0)) != 0) {
        fprintf(stderr, "mge-forge: cannot dial '%s': %s\n", url, nng_strerror(rv));
        exit(2);
    }
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 5000);
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 5000);
    return s;
}

/* Send @len bytes, return the reply (caller nng_msg_free()s) or exit. */
static nng_msg *roundtrip(nng_socket s, const void *buf, size_t len)
{
    nng_msg *m = NULL;
    int rv;
    if ((rv = nng_send(s, (void *)buf, len, 0)) != 0 || (rv = nng_recvmsg(s, &m, 0)) != 0) {
        fprintf(stderr, "mge-forge: no reply: %s\n", nng_strerror(rv));
        exit(2);
    }
    return m;
}

static uint8_t *pack_to_coordinator(const Mge__ToCoordinator *m, size_t *len)
{
    uint8_t *b;
    *len = mge__to_coordinator__get_packed_size(m);
    b = malloc(*len ? *len : 1);
    if (!b)
        exit(2);
    mge__to_coordinator__pack(m, b);
    return b;
}

static uint8_t *pack_frame(const char *worker_id, uint64_t counter, const uint8_t *body,
                           size_t body_len, const uint8_t *nonce, const uint8_t *mac, size_t *len)
{
    Mge__LinkFrame f = MGE__LINK_FRAME__INIT;
    uint8_t *b;
    f.worker_id = (char *)worker_id;
    f.counter = counter;
    f.body.data = (uint8_t *)body;
    f.body.len = body_len;
    if (nonce) {
        f.nonce.data = (uint8_t *)nonce;
        f.nonce.len = MGE_NONCE_LEN;
    }
    if (mac) {
        f.mac.data = (uint8_t *)mac;
        f.mac.len = MGE_HMAC_LEN;
    }
    *len = mge__link_frame__get_packed_size(&f);
    b = malloc(*len ? *len : 1);
    if (!b)
        exit(2);
    mge__link_frame__pack(&f, b);
    return b;
}

struct outcome {
    bool mac;     /* the reply carried a MAC */
    bool refused; /* it said error */
    size_t assign, cancel, acks;
    char worker_id[64];
};

/* Describe reply @m as "<what>: mac=.. error=.. ..." and return what it held. */
static struct outcome report(const char *what, nng_msg *m)
{
    struct outcome o = {0};
    Mge__LinkReply *lr = mge__link_reply__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
    Mge__ToWorker *tw = lr ? mge__to_worker__unpack(NULL, lr->body.len, lr->body.data) : NULL;
    if (!tw) /* not even a reply of this protocol: count it as a refusal that says nothing */
        tw = mge__to_worker__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
    o.mac = lr && lr->mac.len;
    if (tw) {
        o.refused = tw->error && *tw->error;
        o.assign = tw->n_assign;
        o.cancel = tw->n_cancel;
        o.acks = tw->n_acks;
        snprintf(o.worker_id, sizeof(o.worker_id), "%s", tw->worker_id ? tw->worker_id : "");
    }
    printf("%s: mac=%d error=\"%s\" reregister=%d worker_id=\"%s\" assign=%zu cancel=%zu "
           "acks=%zu\n",
           what, o.mac, tw && tw->error ? tw->error : "", tw ? tw->reregister : 0, o.worker_id,
           o.assign, o.cancel, o.acks);
    mge__to_worker__free_unpacked(tw, NULL);
    mge__link_reply__free_unpacked(lr, NULL);
    nng_msg_free(m);
    return o;
}

static bool is_refusal(struct outcome o)
{
    return o.refused && !o.mac && !o.assign && !o.cancel && !o.acks && !o.worker_id[0];
}

static int forge_heartbeat(const char *url, const char *wid, long long job, int attempt,
                           const char *path)
{
    char ck1[1200], ck2[300];
    const char *texts[4] = {
        "{\"step\":99999,\"loss\":12345.0}",
        "{\"summary\":true,\"steps\":99999,\"final_loss\":12345.0,\"forged\":true}", ck1, ck2};
    int streams[4] = {2, 2, 3, 3};
    Mge__ToCoordinator m = MGE__TO_COORDINATOR__INIT;
    Mge__Heartbeat hb = MGE__HEARTBEAT__INIT;
    Mge__RankReport rr = MGE__RANK_REPORT__INIT, *rrp[1] = {&rr};
    Mge__Line ln[4], *lnp[4];
    uint8_t zeros[MGE_HMAC_LEN] = {0}, *body, *frame;
    size_t body_len, frame_len;
    nng_socket s = dial(url);
    bool all = true;

    snprintf(ck1, sizeof(ck1), "ckpt-000099.mgeckpt 99 100 %s", path);
    snprintf(ck2, sizeof(ck2), "ckpt-000098.mgeckpt 98 100 /etc/shadow");
    for (int i = 0; i < 4; i++) {
        mge__line__init(&ln[i]);
        ln[i].job_id = job;
        ln[i].attempt = attempt;
        ln[i].seq = 1000000 + (uint64_t)i;
        ln[i].stream = streams[i];
        ln[i].text = (char *)texts[i];
        ln[i].time_ms = 1795000000000;
        lnp[i] = &ln[i];
    }
    rr.job_id = job; /* "rank 0 exited 0": would finish the job */
    rr.attempt = attempt;
    hb.worker_id = (char *)wid;
    hb.n_ranks = 1;
    hb.ranks = rrp;
    hb.n_lines = 4;
    hb.lines = lnp;
    m.msg_case = MGE__TO_COORDINATOR__MSG_HEARTBEAT;
    m.heartbeat = &hb;
    body = pack_to_coordinator(&m, &body_len);

    frame = pack_frame(wid, 1ull << 40, body, body_len, NULL, zeros, &frame_len);
    all &= is_refusal(report("forged heartbeat (zero MAC)", roundtrip(s, frame, frame_len)));
    free(frame);
    frame = pack_frame(wid, 1ull << 41, body, body_len, NULL, NULL, &frame_len);
    all &= is_refusal(report("forged heartbeat (no MAC)", roundtrip(s, frame, frame_len)));
    free(frame);
    /* the frame as workers sent it before issue 10: a bare ToCoordinator */
    all &= is_refusal(report("forged heartbeat (old format)", roundtrip(s, body, body_len)));
    free(body);
    nng_close(s);
    return all ? 0 : 1;
}

static int forge_flood(const char *url, const char *wid, int n)
{
    Mge__ToCoordinator m = MGE__TO_COORDINATOR__INIT;
    Mge__Heartbeat hb = MGE__HEARTBEAT__INIT;
    uint8_t zeros[MGE_HMAC_LEN] = {0}, *body, *frame;
    size_t body_len, frame_len;
    nng_socket s = dial(url);
    int refused = 0;
    hb.worker_id = (char *)wid;
    m.msg_case = MGE__TO_COORDINATOR__MSG_HEARTBEAT;
    m.heartbeat = &hb;
    body = pack_to_coordinator(&m, &body_len);
    for (int i = 0; i < n; i++) {
        nng_msg *r;
        Mge__LinkReply *lr;
        frame =
            pack_frame(wid, (uint64_t)i + (1ull << 42), body, body_len, NULL, zeros, &frame_len);
        r = roundtrip(s, frame, frame_len);
        lr = mge__link_reply__unpack(NULL, nng_msg_len(r), nng_msg_body(r));
        refused += lr && !lr->mac.len;
        mge__link_reply__free_unpacked(lr, NULL);
        nng_msg_free(r);
        free(frame);
    }
    printf("flood: %d forged heartbeats, %d refused\n", n, refused);
    free(body);
    nng_close(s);
    return refused == n ? 0 : 1;
}

static int forge_register(const char *url, const char *name)
{
    Mge__ToCoordinator m = MGE__TO_COORDINATOR__INIT;
    Mge__Register reg = MGE__REGISTER__INIT;
    uint8_t nonce[MGE_NONCE_LEN], mac[MGE_HMAC_LEN], *body, *frame;
    size_t body_len, frame_len;
    nng_socket s = dial(url);
    struct outcome o;
    reg.name = (char *)name;
    m.msg_case = MGE__TO_COORDINATOR__MSG_REGISTER;
    m.register_ = &reg;
    body = pack_to_coordinator(&m, &body_len);
    if (mge_random_bytes(nonce, sizeof(nonce)) != 0 ||
        mge_link_mac(MGE_LINK_MAC_REGISTER, "not-the-join-token", 18, "", 0, nonce, sizeof(nonce),
                     body, body_len, mac) != 0)
        return 2;
    frame = pack_frame("", 0, body, body_len, nonce, mac, &frame_len);
    o = report("forged register (wrong join token)", roundtrip(s, frame, frame_len));
    free(frame);
    free(body);
    nng_close(s);
    return is_refusal(o) ? 0 : 1;
}

/* A genuine session of this tool; frames and their MACs as the worker makes them. */
struct session {
    char id[64];
    uint8_t key[MGE_HMAC_LEN];
};

/* Heartbeat @counter of session @se; @tamper: the body changes after its MAC was made. */
static uint8_t *session_frame(const struct session *se, uint64_t counter, bool tamper, size_t *len)
{
    Mge__ToCoordinator m = MGE__TO_COORDINATOR__INIT;
    Mge__Heartbeat hb = MGE__HEARTBEAT__INIT;
    uint8_t mac[MGE_HMAC_LEN], *body, *frame;
    size_t body_len;
    hb.worker_id = (char *)se->id;
    m.msg_case = MGE__TO_COORDINATOR__MSG_HEARTBEAT;
    m.heartbeat = &hb;
    body = pack_to_coordinator(&m, &body_len);
    if (mge_link_mac(MGE_LINK_MAC_REQUEST, se->key, sizeof(se->key), se->id, counter, NULL, 0, body,
                     body_len, mac) != 0)
        exit(2);
    if (tamper) { /* an unknown field 15 (varint 1), which the coordinator's parser would skip */
        body = realloc(body, body_len + 2);
        if (!body)
            exit(2);
        body[body_len++] = 15 << 3;
        body[body_len++] = 1;
    }
    frame = pack_frame(se->id, counter, body, body_len, NULL, mac, len);
    free(body);
    return frame;
}

/*
 * Register @name with the join token @join on @s: the session into @se, the Register frame
 * sent into *@frame (malloc'ed, caller frees). 0 on success (the reply's MAC verified).
 */
static int session_register_slots(nng_socket s, const char *join, const char *name,
                                  Mge__Slots *claim, struct session *se, uint8_t **frame,
                                  size_t *frame_len)
{
    Mge__ToCoordinator m = MGE__TO_COORDINATOR__INIT;
    Mge__Register reg = MGE__REGISTER__INIT;
    Mge__Slots slots = MGE__SLOTS__INIT;
    Mge__LinkReply *lr;
    Mge__ToWorker *tw;
    uint8_t cn[MGE_NONCE_LEN], mac[MGE_HMAC_LEN], *body;
    size_t body_len;
    nng_msg *rep;
    int rc = 1;

    slots.device = (char *)"cpu"; /* no cpus, no memory: nothing fits here */
    reg.name = (char *)name;
    reg.slots = claim ? claim : &slots;
    m.msg_case = MGE__TO_COORDINATOR__MSG_REGISTER;
    m.register_ = &reg;
    body = pack_to_coordinator(&m, &body_len);
    if (mge_random_bytes(cn, sizeof(cn)) != 0 ||
        mge_link_mac(MGE_LINK_MAC_REGISTER, join, strlen(join), "", 0, cn, sizeof(cn), body,
                     body_len, mac) != 0)
        exit(2);
    *frame = pack_frame("", 0, body, body_len, cn, mac, frame_len);
    free(body);
    rep = roundtrip(s, *frame, *frame_len);
    lr = mge__link_reply__unpack(NULL, nng_msg_len(rep), nng_msg_body(rep));
    tw = lr ? mge__to_worker__unpack(NULL, lr->body.len, lr->body.data) : NULL;
    if (tw && tw->worker_id && *tw->worker_id && lr->nonce.len == MGE_NONCE_LEN &&
        mge_link_session_key(join, tw->worker_id, cn, lr->nonce.data, se->key) == 0 &&
        mge_link_mac(MGE_LINK_MAC_REPLY, se->key, sizeof(se->key), tw->worker_id, 0, lr->nonce.data,
                     lr->nonce.len, lr->body.data, lr->body.len, mac) == 0 &&
        mge_ct_equal(mac, sizeof(mac), lr->mac.data, lr->mac.len)) {
        snprintf(se->id, sizeof(se->id), "%s", tw->worker_id);
        printf("genuine register: accepted as %s, reply MAC verified\n", se->id);
        rc = 0;
    } else {
        printf("genuine register: failed (%s)\n", tw && tw->error ? tw->error : "no valid reply");
    }
    mge__to_worker__free_unpacked(tw, NULL);
    mge__link_reply__free_unpacked(lr, NULL);
    nng_msg_free(rep);
    return rc;
}

static int session_register(nng_socket s, const char *join, const char *name, struct session *se,
                            uint8_t **frame, size_t *frame_len)
{
    return session_register_slots(s, join, name, NULL, se, frame, frame_len);
}

/*
 * Genuine Registers (the join token is known) whose claims no machine has: each must be
 * refused with a reason, none may start a session; then NAME with sane claims is accepted.
 */
static int forge_slots(const char *url, const char *join, const char *name)
{
    struct claim {
        const char *what, *name, *device;
        int cpus, gpus, n_gpu;
        int64_t memory_mb, gpu_mb;
    } claims[] = {
        {"negative cpus", name, "cpu", -8, 0, 0, 1024, 0},
        {"absurd cpus", name, "cpu", 1 << 30, 0, 0, 1024, 0},
        {"negative memory", name, "cpu", 2, 0, 0, -1, 0},
        {"absurd memory", name, "cpu", 2, 0, 0, (int64_t)1 << 50, 0},
        {"unknown device", name, "tpu", 2, 0, 0, 1024, 0},
        {"negative gpus", name, "gpu", 2, -1, 0, 1024, 0},
        {"more gpus than a worker may have", name, "gpu", 2, 65, 0, 1024, 0},
        {"a gpu list longer than its count", name, "gpu", 2, 1, 2, 1024, 80000},
        {"a gpu with negative memory", name, "gpu", 2, 1, 1, 1024, -5},
        {"a gpu with absurd memory", name, "gpu", 2, 1, 1, 1024, (int64_t)1 << 40},
        {"a name with a newline", "evil\nworker", "cpu", 2, 0, 0, 1024, 0},
        {"sane claims", name, "gpu", 0, 1, 1, 0, 81920}, /* no cores: nothing is placed */
    };
    size_t n = sizeof(claims) / sizeof(claims[0]);
    nng_socket s = dial(url);
    bool good = true;
    for (size_t i = 0; i < n; i++) {
        Mge__Slots sl = MGE__SLOTS__INIT;
        Mge__Gpu g[2] = {MGE__GPU__INIT, MGE__GPU__INIT}, *gp[2] = {&g[0], &g[1]};
        struct session se;
        uint8_t *frame;
        size_t frame_len;
        int rc;
        sl.cpus = claims[i].cpus;
        sl.memory_mb = claims[i].memory_mb;
        sl.gpus = claims[i].gpus;
        sl.device = (char *)claims[i].device;
        for (int k = 0; k < claims[i].n_gpu; k++) {
            g[k].name = (char *)"Forged GPU";
            g[k].memory_mb = claims[i].gpu_mb;
        }
        sl.n_gpu_list = (size_t)claims[i].n_gpu;
        sl.gpu_list = claims[i].n_gpu ? gp : NULL;
        printf("register with %s: ", claims[i].what);
        rc = session_register_slots(s, join, claims[i].name, &sl, &se, &frame, &frame_len);
        free(frame);
        good &= i + 1 < n ? rc != 0 : rc == 0; /* all refused but the last, which is accepted */
    }
    nng_close(s);
    return good ? 0 : 1;
}

static int forge_replay(const char *url, const char *join, const char *name)
{
    uint8_t *frame, *f1;
    size_t frame_len, f1_len;
    nng_socket s = dial(url);
    struct session se, old;
    bool good = true;

    if (session_register(s, join, name, &se, &frame, &frame_len) != 0)
        return 1;
    /* the Register again, byte for byte: refused, and the session it started lives on */
    good &= is_refusal(report("replayed register", roundtrip(s, frame, frame_len)));
    free(frame);

    f1 = session_frame(&se, 1, false, &f1_len);
    good &= report("genuine frame 1", roundtrip(s, f1, f1_len)).mac;
    good &= is_refusal(report("replayed frame 1 (same bytes)", roundtrip(s, f1, f1_len)));
    free(f1);
    frame = session_frame(&se, 5, true, &frame_len);
    good &= is_refusal(report("frame 5 with a changed body", roundtrip(s, frame, frame_len)));
    free(frame);
    frame = session_frame(&se, 0, false, &frame_len); /* valid MAC, counter below the last */
    good &= is_refusal(report("frame with counter 0", roundtrip(s, frame, frame_len)));
    free(frame);
    frame = session_frame(&se, 2, false, &frame_len);
    good &= report("genuine frame 2", roundtrip(s, frame, frame_len)).mac;
    free(frame);

    /* a new Register of the name starts a new session: the old key is dead */
    old = se;
    if (session_register(s, join, name, &se, &frame, &frame_len) != 0)
        return 1;
    free(frame);
    frame = session_frame(&old, 3, false, &frame_len);
    good &= is_refusal(
        report("frame 3 under the previous session's key", roundtrip(s, frame, frame_len)));
    free(frame);
    frame = session_frame(&se, 1, false, &frame_len);
    good &= report("frame 1 of the new session", roundtrip(s, frame, frame_len)).mac;
    free(frame);
    nng_close(s);
    return good ? 0 : 1;
}

static int forge_upload(const char *url, const char *join, const char *name, long long job,
                        int attempt, const char *ckpt_name, const char *file, long long size)
{
    FILE *fp = fopen(file, "rb");
    static uint8_t data[1 << 20];
    uint8_t *frame, *body, mac[MGE_HMAC_LEN];
    size_t frame_len, body_len, n;
    uint64_t offset = 0, counter = 0;
    nng_socket s = dial(url);
    struct session se;
    long long file_size;
    if (!fp || fseek(fp, 0, SEEK_END) != 0 || (file_size = ftell(fp)) < 0)
        return 2;
    if (size < 0)
        size = file_size;
    if (session_register(s, join, name, &se, &frame, &frame_len) != 0)
        return 2;
    free(frame);
    for (int i = 0; i < 10000; i++) {
        Mge__ToCoordinator m = MGE__TO_COORDINATOR__INIT;
        Mge__Heartbeat hb = MGE__HEARTBEAT__INIT;
        Mge__CkptChunk c = MGE__CKPT_CHUNK__INIT;
        Mge__LinkReply *lr;
        Mge__ToWorker *tw;
        nng_msg *rep;
        int verdict = -1;
        if (fseek(fp, (long)offset, SEEK_SET) != 0)
            return 2;
        n = fread(data, 1, sizeof(data), fp);
        c.job_id = job;
        c.attempt = attempt;
        c.name = (char *)ckpt_name;
        c.offset = offset;
        c.size = (uint64_t)size;
        c.data.data = data;
        c.data.len = n;
        hb.worker_id = se.id;
        hb.upload = &c;
        m.msg_case = MGE__TO_COORDINATOR__MSG_HEARTBEAT;
        m.heartbeat = &hb;
        body = pack_to_coordinator(&m, &body_len);
        if (mge_link_mac(MGE_LINK_MAC_REQUEST, se.key, sizeof(se.key), se.id, ++counter, NULL, 0,
                         body, body_len, mac) != 0)
            exit(2);
        frame = pack_frame(se.id, counter, body, body_len, NULL, mac, &frame_len);
        free(body);
        rep = roundtrip(s, frame, frame_len);
        free(frame);
        lr = mge__link_reply__unpack(NULL, nng_msg_len(rep), nng_msg_body(rep));
        tw = lr ? mge__to_worker__unpack(NULL, lr->body.len, lr->body.data) : NULL;
        if (!tw || !tw->upload_ack) {
            printf("upload %s at %llu: no answer (%s)\n", ckpt_name, (unsigned long long)offset,
                   tw && tw->error ? tw->error : "no upload ack");
            verdict = 2;
        } else if (tw->upload_ack->error && *tw->upload_ack->error) {
            printf("upload %s at %llu: refused: %s\n", ckpt_name, (unsigned long long)offset,
                   tw->upload_ack->error);
            verdict = 0;
        } else if (tw->upload_ack->committed) {
            printf("upload %s: committed\n", ckpt_name);
            verdict = 1;
        } else if (tw->upload_ack->offset == offset) {
            printf("upload %s at %llu: no progress\n", ckpt_name, (unsigned long long)offset);
            verdict = 2;
        } else {
            offset = tw->upload_ack->offset;
        }
        mge__to_worker__free_unpacked(tw, NULL);
        mge__link_reply__free_unpacked(lr, NULL);
        nng_msg_free(rep);
        if (verdict >= 0) {
            fclose(fp);
            nng_close(s);
            return verdict;
        }
    }
    return 2;
}

static int forge_launch(const char *url, long long job, int attempt, int rank, const char *token,
                        const char *command)
{
    Mge__LaunchRequest req = MGE__LAUNCH_REQUEST__INIT;
    Mge__LaunchReply *rep;
    uint8_t *buf;
    size_t len;
    nng_socket s = dial(url);
    nng_msg *m;
    int code;
    req.job_id = job;
    req.attempt = attempt;
    req.rank = rank;
    req.token = (char *)token;
    req.command = (char *)command;
    len = mge__launch_request__get_packed_size(&req);
    buf = malloc(len ? len : 1);
    if (!buf)
        return 2;
    mge__launch_request__pack(&req, buf);
    m = roundtrip(s, buf, len);
    rep = mge__launch_reply__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
    printf("launch job %lld attempt %d rank %d: ok=%d error=\"%s\"\n", job, attempt, rank,
           rep ? rep->ok : 0, rep && rep->error ? rep->error : "");
    code = rep && rep->ok ? 1 : 0;
    mge__launch_reply__free_unpacked(rep, NULL);
    nng_msg_free(m);
    free(buf);
    nng_close(s);
    return code;
}

/* A forged ToWorker for mitm: ask @job for a checkpoint, assign job @job + 1000, and when
 * @cancel, cancel @job (after the checkpoint: a worker that obeyed would do both). */
static uint8_t *forged_to_worker(long long job, int attempt, bool cancel, bool refusal, bool reg,
                                 size_t *len)
{
    Mge__ToWorker tw = MGE__TO_WORKER__INIT;
    Mge__Cancel c = MGE__CANCEL__INIT, *cp[1] = {&c};
    Mge__CkptRequest k = MGE__CKPT_REQUEST__INIT, *kp[1] = {&k};
    Mge__Assign a = MGE__ASSIGN__INIT, *ap[1] = {&a};
    uint8_t *b;
    c.job_id = job, c.grace_ms = 0; /* attempt 0: every attempt */
    k.job_id = job, k.attempt = attempt;
    a.job_id = job + 1000, a.attempt = 1, a.world_size = 1;
    a.spec_yaml = (char *)"name: forged\nmodel: {type: mlp, hidden: [8]}\n"
                          "data: {format: synthetic, train_size: 64, test_size: 64, input_dim: 4, "
                          "classes: 2}\ntrain: {steps: 1000000, batch_size: 8, optimizer: {type: "
                          "sgd, lr: 0.1}}\n";
    tw.n_cancel = cancel ? 1 : 0, tw.cancel = cp;
    tw.n_checkpoint = 1, tw.checkpoint = kp;
    tw.n_assign = 1, tw.assign = ap;
    if (refusal)
        tw.error = (char *)"forged refusal that carries commands";
    if (reg)
        tw.worker_id = (char *)"w-forged";
    *len = mge__to_worker__get_packed_size(&tw);
    b = malloc(*len ? *len : 1);
    if (!b)
        exit(2);
    mge__to_worker__pack(&tw, b);
    return b;
}

/* Pack @lr into a new message for nng_sendmsg, or exit. */
static nng_msg *reply_msg(const Mge__LinkReply *lr)
{
    nng_msg *m;
    size_t len = mge__link_reply__get_packed_size(lr);
    if (nng_msg_alloc(&m, len) != 0)
        exit(2);
    mge__link_reply__pack(lr, nng_msg_body(m));
    return m;
}

/*
 * The attack @i (0..4) as the answer to a frame with counter @counter; @assign is the genuine
 * reply that assigned the job (a packed LinkReply). To a Register (@reg) a reply carries a
 * worker id and a server nonce, as a genuine one does, so that the worker gets as far as its MAC.
 */
static nng_msg *mitm_attack(int i, uint64_t counter, bool reg, const uint8_t *assign,
                            size_t assign_len, long long job, int attempt, const char **what)
{
    static const char *names[5] = {"the Assign reply replayed", "the Assign reply, counter changed",
                                   "forged commands (no cancel), MAC of zeros",
                                   "forged commands, no MAC", "forged commands in a refusal"};
    uint8_t zeros[MGE_HMAC_LEN] = {0}, nonce[MGE_NONCE_LEN], *body;
    Mge__LinkReply *old, lr = MGE__LINK_REPLY__INIT;
    nng_msg *m;
    size_t len;
    *what = names[i];
    memset(nonce, 0x5a, sizeof(nonce));
    if (i == 0) {
        if (nng_msg_alloc(&m, assign_len) != 0)
            exit(2);
        memcpy(nng_msg_body(m), assign, assign_len);
        return m;
    }
    if (i == 1) {
        old = mge__link_reply__unpack(NULL, assign_len, assign);
        Mge__ToWorker *tw =
            old ? mge__to_worker__unpack(NULL, old->body.len, old->body.data) : NULL;
        if (!tw)
            exit(2);
        char *id = tw->worker_id; /* the unpacked message frees its own string */
        lr = *old;
        if (reg)
            tw->worker_id = (char *)"w-forged";
        body = malloc(mge__to_worker__get_packed_size(tw) + 1);
        if (!body)
            exit(2);
        lr.body.data = body, lr.body.len = mge__to_worker__pack(tw, body);
        tw->worker_id = id;
        mge__to_worker__free_unpacked(tw, NULL);
    } else {
        body = forged_to_worker(job, attempt, i != 2, i == 4, reg, &len);
        lr.body.data = body, lr.body.len = len;
        if (i == 2)
            lr.mac.data = zeros, lr.mac.len = sizeof(zeros);
        old = NULL;
    }
    lr.counter = counter;
    if (reg)
        lr.nonce.data = nonce, lr.nonce.len = sizeof(nonce);
    m = reply_msg(&lr);
    free(body);
    mge__link_reply__free_unpacked(old, NULL);
    return m;
}

static int forge_mitm(const char *listen, const char *upstream, const char *port_file,
                      long long job, int seconds)
{
    nng_socket rep, req = dial(upstream);
    nng_listener lst;
    uint8_t *assign = NULL;
    size_t assign_len = 0;
    int rv, port = 0, after = 0, attack = 0, attempt = 0;
    time_t end = time(NULL) + seconds;
    FILE *f;

    if ((rv = nng_rep0_open(&rep)) != 0 || (rv = nng_listen(rep, listen, &lst, 0)) != 0 ||
        (rv = nng_listener_get_int(lst, NNG_OPT_TCP_BOUND_PORT, &port)) != 0) {
        fprintf(stderr, "mge-forge: cannot listen on '%s': %s\n", listen, nng_strerror(rv));
        return 2;
    }
    nng_socket_set_ms(rep, NNG_OPT_RECVTIMEO, 500);
    if (!(f = fopen(port_file, "w")) || fprintf(f, "port=%d\n", port) < 0 || fclose(f) != 0) {
        fprintf(stderr, "mge-forge: cannot write '%s'\n", port_file);
        return 2;
    }
    while (time(NULL) < end) {
        nng_msg *in, *out;
        if (nng_recvmsg(rep, &in, 0) != 0)
            continue;
        Mge__LinkFrame *fr = mge__link_frame__unpack(NULL, nng_msg_len(in), nng_msg_body(in));
        uint64_t counter = fr ? fr->counter : 0;
        bool reg = fr && fr->nonce.len;
        mge__link_frame__free_unpacked(fr, NULL);
        if (assign && after >= 4 && attack < 5) {
            const char *what;
            out = mitm_attack(attack, counter, reg, assign, assign_len, job, attempt, &what);
            printf("attack %d on %s %llu: %s\n", attack + 1, reg ? "Register" : "frame",
                   (unsigned long long)counter, what);
            if (++attack == 5)
                printf("attacks done\n");
            fflush(stdout);
            nng_msg_free(in);
            if (nng_sendmsg(rep, out, 0) != 0)
                nng_msg_free(out);
            continue;
        }
        if (nng_sendmsg(req, in, 0) != 0 || nng_recvmsg(req, &out, 0) != 0) {
            nng_msg_free(in);
            fprintf(stderr, "mge-forge: the coordinator did not answer\n");
            continue; /* the worker's request times out and it retries */
        }
        if (assign)
            after++;
        else {
            Mge__LinkReply *lr = mge__link_reply__unpack(NULL, nng_msg_len(out), nng_msg_body(out));
            Mge__ToWorker *tw =
                lr ? mge__to_worker__unpack(NULL, lr->body.len, lr->body.data) : NULL;
            for (size_t i = 0; tw && i < tw->n_assign; i++)
                if (tw->assign[i]->job_id == job && lr->mac.len) {
                    attempt = tw->assign[i]->attempt;
                    assign_len = nng_msg_len(out);
                    assign = malloc(assign_len);
                    if (!assign)
                        exit(2);
                    memcpy(assign, nng_msg_body(out), assign_len);
                    printf("relayed the genuine Assign of job %lld attempt %d (frame %llu)\n", job,
                           attempt, (unsigned long long)lr->counter);
                    fflush(stdout);
                    break;
                }
            mge__to_worker__free_unpacked(tw, NULL);
            mge__link_reply__free_unpacked(lr, NULL);
        }
        if (nng_sendmsg(rep, out, 0) != 0)
            nng_msg_free(out);
    }
    free(assign);
    nng_close(rep);
    nng_close(req);
    return attack == 5 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 7 && !strcmp(argv[1], "heartbeat"))
        return forge_heartbeat(argv[2], argv[3], atoll(argv[4]), atoi(argv[5]), argv[6]);
    if (argc == 5 && !strcmp(argv[1], "flood"))
        return forge_flood(argv[2], argv[3], atoi(argv[4]));
    if (argc == 4 && !strcmp(argv[1], "register"))
        return forge_register(argv[2], argv[3]);
    if (argc == 5 && !strcmp(argv[1], "slots"))
        return forge_slots(argv[2], argv[3], argv[4]);
    if (argc == 5 && !strcmp(argv[1], "replay"))
        return forge_replay(argv[2], argv[3], argv[4]);
    if ((argc == 9 || argc == 10) && !strcmp(argv[1], "upload"))
        return forge_upload(argv[2], argv[3], argv[4], atoll(argv[5]), atoi(argv[6]), argv[7],
                            argv[8], argc == 10 ? atoll(argv[9]) : -1);
    if (argc == 8 && !strcmp(argv[1], "launch"))
        return forge_launch(argv[2], atoll(argv[3]), atoi(argv[4]), atoi(argv[5]), argv[6],
                            argv[7]);
    if (argc == 7 && !strcmp(argv[1], "mitm"))
        return forge_mitm(argv[2], argv[3], argv[4], atoll(argv[5]), atoi(argv[6]));
    fprintf(stderr, "usage: see the top of tests/tools/mge-forge.c (an attack tool for tests)\n");
    return 2;
}
