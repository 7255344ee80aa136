/*
 * gen_worker_frame_seeds.c: writes the seed corpus of fuzz_worker_frame into a directory. Each
 * seed is one byte that says what follows (see fuzz_worker_frame.c), then: 1, a packed
 * ToCoordinator (Register, Heartbeat) that the harness seals as a genuine worker would, so the
 * fuzzer reaches registration, line ingestion and the scheduler (the harness puts its worker's
 * id into heartbeats whose worker_id is "@"; its store holds job 1); 0, a LinkFrame as a
 * stranger sends it (a Register with the join token "fuzz" proven and one with a wrong proof, a
 * heartbeat with a forged MAC). Build and run by hand when worker.proto changes:
 *   make build/lib/libmgecommon.a
 *   cc -std=c11 -D_GNU_SOURCE -I. -Ibuild/gen tests/fuzz/gen_worker_frame_seeds.c \
 *      build/gen/proto/worker.pb-c.c build/lib/libmgecommon.a -lprotobuf-c -lcrypto \
 *      -o build/gen_worker_frame_seeds
 *   rm -rf tests/fuzz/corpus/worker_frame && mkdir -p tests/fuzz/corpus/worker_frame
 *   build/gen_worker_frame_seeds tests/fuzz/corpus/worker_frame
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crypto.h"
#include "proto/worker.pb-c.h"

/* Write @mode then @n bytes of @buf to DIR/NAME. */
static int put_bytes(const char *dir, const char *name, uint8_t mode, const uint8_t *buf, size_t n)
{
    char path[512];
    FILE *f;
    int rc = 0;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "wb");
    if (!f || fputc(mode, f) == EOF || fwrite(buf, 1, n, f) != n) {
        fprintf(stderr, "gen_worker_frame_seeds: cannot write '%s'\n", path);
        rc = 1;
    }
    if (f && fclose(f) != 0)
        rc = 1;
    return rc;
}

/* A body for the harness to seal (mode 1). */
static int put(const char *dir, const char *name, const Mge__ToCoordinator *m)
{
    size_t n = mge__to_coordinator__get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    int rc;
    if (!buf)
        return 1;
    mge__to_coordinator__pack(m, buf);
    rc = put_bytes(dir, name, 1, buf, n);
    free(buf);
    return rc;
}

/* A LinkFrame as a stranger sends it (mode 0): @m sealed with join token @key when @worker_id
 * is "" (a Register), else with a MAC of zeros (nobody outside knows a session key). */
static int put_frame(const char *dir, const char *name, const Mge__ToCoordinator *m,
                     const char *worker_id, const char *key)
{
    Mge__LinkFrame f = MGE__LINK_FRAME__INIT;
    uint8_t nonce[MGE_NONCE_LEN] = {1, 2, 3}, mac[MGE_HMAC_LEN] = {0}, *body, *buf;
    size_t n = mge__to_coordinator__get_packed_size(m), len;
    int rc = 1;
    body = malloc(n ? n : 1);
    if (!body)
        return 1;
    mge__to_coordinator__pack(m, body);
    f.worker_id = (char *)worker_id;
    f.body.data = body;
    f.body.len = n;
    if (!*worker_id) {
        f.nonce.data = nonce;
        f.nonce.len = sizeof(nonce);
        if (mge_link_mac(MGE_LINK_MAC_REGISTER, key, strlen(key), "", 0, nonce, sizeof(nonce),
                         body, n, mac) != 0)
            goto out_free_body;
    } else {
        f.counter = 1;
    }
    f.mac.data = mac;
    f.mac.len = sizeof(mac);
    len = mge__link_frame__get_packed_size(&f);
    buf = malloc(len ? len : 1);
    if (buf) {
        mge__link_frame__pack(&f, buf);
        rc = put_bytes(dir, name, 0, buf, len);
        free(buf);
    }
out_free_body:
    free(body);
    return rc;
}

int main(int argc, char **argv)
{
    /* the lines mge-train --json and the worker really produce, one per stream */
    static const struct {
        int stream;
        const char *text;
    } texts[] = {
        {1, "mge-worker: rank 0/1 attempt 1: started /usr/local/bin/mge-train as pid 4242, "
            "1 threads"},
        {2, "{\"step\":1,\"loss\":2.356803,\"samples_per_sec\":670.6,\"lr\":0.05,\"epoch\":0}"},
        {2, "{\"step\":2,\"loss\":2.286274,\"samples_per_sec\":1337.3,\"lr\":0.05,\"epoch\":0}"},
        {2, "{\"epoch\":1,\"step\":2,\"test_accuracy\":0.902900,\"test_loss\":0.493211}"},
        {3, "ckpt-000002.mgeckpt 2 204063 /var/lib/mge/w/job-1/attempt-1/rank-0/"
            "ckpt-000002.mgeckpt"},
        {2, "{\"summary\":true,\"steps\":2,\"epochs\":1,\"final_loss\":2.286274,"
            "\"test_accuracy\":0.902900,\"test_loss\":0.493211,\"samples_per_sec\":1337.3,"
            "\"peak_bytes\":319104,\"wall_sec\":0.149,\"steps_run\":2}"},
        {0, "plain stdout text"},
        {1, "mge-worker: rank 0: exited with code 0"},
    };
    enum { N_LINES = sizeof(texts) / sizeof(texts[0]) };
    Mge__ToCoordinator m = MGE__TO_COORDINATOR__INIT;
    Mge__Register reg = MGE__REGISTER__INIT;
    Mge__Heartbeat hb = MGE__HEARTBEAT__INIT;
    Mge__Slots slots = MGE__SLOTS__INIT;
    Mge__RankReport run = MGE__RANK_REPORT__INIT, done = MGE__RANK_REPORT__INIT;
    Mge__RankReport *runp[1] = {&run}, *donep[1] = {&done};
    Mge__Line lines[N_LINES], *linep[N_LINES];
    int rc = 0;

    if (argc != 2) {
        fprintf(stderr, "usage: gen_worker_frame_seeds DIR\n");
        return 2;
    }
    slots.cpus = 2;
    slots.memory_mb = 4096;
    slots.device = (char *)"cpu";
    run.job_id = done.job_id = 1;
    run.attempt = done.attempt = 1;
    run.running = true;
    run.pid = 4242;

    reg.name = (char *)"w1";
    reg.host = (char *)"node-1";
    reg.slots = &slots;
    reg.version = (char *)"0.1.0";
    m.msg_case = MGE__TO_COORDINATOR__MSG_REGISTER;
    m.register_ = &reg;
    rc |= put(argv[1], "register", &m);
    rc |= put_frame(argv[1], "frame-register", &m, "", "fuzz");
    rc |= put_frame(argv[1], "frame-register-bad-proof", &m, "", "wrong");
    reg.n_ranks = 1; /* a worker that comes back with a rank running */
    reg.ranks = runp;
    rc |= put(argv[1], "register-with-rank", &m);

    for (int i = 0; i < N_LINES; i++) {
        mge__line__init(&lines[i]);
        lines[i].job_id = 1;
        lines[i].attempt = 1;
        lines[i].seq = (uint64_t)i + 1;
        lines[i].stream = texts[i].stream;
        lines[i].text = (char *)texts[i].text;
        lines[i].time_ms = 1795000000000 + i;
        linep[i] = &lines[i];
    }
    hb.worker_id = (char *)"@";
    m.msg_case = MGE__TO_COORDINATOR__MSG_HEARTBEAT;
    m.heartbeat = &hb;
    rc |= put(argv[1], "heartbeat-idle", &m);
    hb.n_ranks = 1;
    hb.ranks = runp;
    hb.n_lines = N_LINES - 1;
    hb.lines = linep;
    rc |= put(argv[1], "heartbeat-lines", &m);
    hb.ranks = donep;
    hb.n_lines = N_LINES;
    rc |= put(argv[1], "heartbeat-exit", &m);
    rc |= put_frame(argv[1], "frame-heartbeat-forged", &m, "w-0123456789abcdef", "");
    hb.worker_id = (char *)"nobody";
    rc |= put(argv[1], "heartbeat-unknown-worker", &m);

    /* checkpoint replication: the first piece of an upload, a whole (unverifiable) file, and
     * a fetch of a committed copy */
    static uint8_t piece[64] = "MGECKPT1";
    Mge__CkptChunk up = MGE__CKPT_CHUNK__INIT;
    Mge__CkptFetch fe = MGE__CKPT_FETCH__INIT;
    hb.worker_id = (char *)"@";
    hb.n_ranks = 1;
    hb.ranks = runp;
    hb.n_lines = 0;
    up.job_id = fe.job_id = 1;
    up.attempt = fe.attempt = 1;
    up.name = fe.name = (char *)"ckpt-000002.mgeckpt";
    up.size = 128;
    up.data.data = piece;
    up.data.len = sizeof(piece);
    hb.upload = &up;
    rc |= put(argv[1], "heartbeat-upload-first", &m);
    up.size = sizeof(piece);
    rc |= put(argv[1], "heartbeat-upload-whole", &m);
    hb.upload = NULL;
    hb.fetch = &fe;
    rc |= put(argv[1], "heartbeat-fetch", &m);
    return rc;
}
