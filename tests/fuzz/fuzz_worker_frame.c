/*
 * fuzz_worker_frame.c: libFuzzer target for frames from workers, through the coordinator's
 * whole request path (mge_rpc_handle_frame: LinkFrame unpack, join token proof, session MAC and
 * counter checks, registration, heartbeat with rank reports and lines into a real SQLite store,
 * sealed reply). The store lives in a fresh temporary directory and holds job 1; the join
 * token is "fuzz". The first byte of an input says what the rest is:
 *   even: a LinkFrame as a stranger sends it (fuzzes the envelope and the refusals);
 *   odd:  a ToCoordinator body, which the harness seals the way a genuine worker does (a
 *         Register with a valid join token proof; anything else as the next frame of the
 *         session of worker "w1", registered at setup), so the fuzzer reaches what lies behind
 *         the MAC check. A heartbeat whose worker_id is "@" gets w1's id (ids are random);
 *         job 1 is placed on w1, so its lines of attempt 1, rank 0 are stored, and its
 *         checkpoint uploads and fetches reach the checkpoint store (in the same directory).
 * Seeds: corpus/worker_frame/, written by gen_worker_frame_seeds.c.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/crypto.h"
#include "common/err.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "coordinator/rpc.h"
#include "coordinator/sched.h"
#include "coordinator/store.h"
#include "proto/worker.pb-c.h"
#include "tests/unit/support/scratch_dir.h"
#include "worker/link_frame.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define JOIN "fuzz"

static struct mge_rpc *g_rpc;
static char g_worker_id[64];           /* w1, registered at setup */
static uint8_t g_key[MGE_HMAC_LEN];    /* w1's session key */
static uint64_t g_counter;             /* w1's last frame */

static const char SPEC[] = "name: fuzz\nmodel: {type: mlp, hidden: [8]}\n"
                           "data: {format: synthetic, train_size: 64, input_dim: 4, classes: 2}\n"
                           "train: {steps: 2, batch_size: 8, optimizer: {lr: 0.1}}\n";

/* Job 1 in the store, so that lines for it are stored and its metrics ingested. */
static int insert_job(struct mge_store *st)
{
    struct mge_jobspec *spec = NULL;
    struct mge_spec_error err;
    int64_t id = 0;
    int rc = mge_jobspec_parse("<fuzz>", SPEC, strlen(SPEC), NULL, 0, &spec, &err);
    if (rc == MGE_OK)
        rc = mge_store_job_insert(st, spec, "{}", 2, &id);
    mge_jobspec_free(spec);
    return rc == MGE_OK && id == 1 ? 0 : -1;
}

/*
 * Seal @body (a packed ToCoordinator) as a genuine worker does and handle it: a Register with
 * the join token's proof, else frame g_counter + 1 of w1's session. When the reply starts a new
 * session of w1 (a Register of "w1"), the harness follows it.
 */
static void handle_sealed(const uint8_t *body, size_t body_len)
{
    static uint64_t registers; /* in the nonces: the coordinator refuses one it saw lately */
    Mge__ToCoordinator *m = mge__to_coordinator__unpack(NULL, body_len, body);
    Mge__LinkReply *lr = NULL;
    Mge__ToWorker *tw = NULL;
    uint8_t nonce[MGE_NONCE_LEN] = {7}, *frame = NULL, *reply = NULL;
    size_t frame_len = 0, reply_len = 0;
    int reg = m && m->msg_case == MGE__TO_COORDINATOR__MSG_REGISTER, rc;
    mge__to_coordinator__free_unpacked(m, NULL);

    if (reg) {
        registers++;
        memcpy(nonce + 8, &registers, sizeof(registers));
        rc = mge_link_frame_seal(JOIN, strlen(JOIN), NULL, 0, nonce, sizeof(nonce), body, body_len,
                                 &frame, &frame_len);
    } else {
        rc = mge_link_frame_seal(g_key, sizeof(g_key), g_worker_id, ++g_counter, NULL, 0, body,
                                 body_len, &frame, &frame_len);
    }
    if (rc != MGE_OK)
        return;
    mge_rpc_handle_frame(g_rpc, frame, frame_len, &reply, &reply_len);
    mge_free(frame);
    lr = reply ? mge__link_reply__unpack(NULL, reply_len, reply) : NULL;
    tw = lr ? mge__to_worker__unpack(NULL, lr->body.len, lr->body.data) : NULL;
    if (reg && tw && lr->mac.len && lr->nonce.len == MGE_NONCE_LEN && tw->worker_id &&
        (!g_worker_id[0] || !strcmp(tw->worker_id, g_worker_id))) {
        snprintf(g_worker_id, sizeof(g_worker_id), "%s", tw->worker_id);
        mge_link_session_key(JOIN, g_worker_id, nonce, lr->nonce.data, g_key);
        g_counter = 0;
    }
    mge__to_worker__free_unpacked(tw, NULL);
    mge__link_reply__free_unpacked(lr, NULL);
    mge_free(reply);
}

/* Register worker "w1" (2 CPUs) through the sealed frame path: its id and session key in g_*. */
static int register_worker(void)
{
    Mge__ToCoordinator m = MGE__TO_COORDINATOR__INIT;
    Mge__Register reg = MGE__REGISTER__INIT;
    Mge__Slots slots = MGE__SLOTS__INIT;
    uint8_t buf[256];
    reg.name = (char *)"w1";
    slots.cpus = 2;
    slots.memory_mb = 4096;
    slots.device = (char *)"cpu";
    reg.slots = &slots;
    m.msg_case = MGE__TO_COORDINATOR__MSG_REGISTER;
    m.register_ = &reg;
    if (mge__to_coordinator__get_packed_size(&m) > sizeof(buf))
        return -1;
    handle_sealed(buf, mge__to_coordinator__pack(&m, buf));
    return g_worker_id[0] ? 0 : -1;
}

/*
 * @data as the body to seal: itself, or repacked with w1's id when it is a heartbeat from "@".
 * Returns a malloc'ed copy in *@out (NULL: use @data as is).
 */
static size_t with_worker_id(const uint8_t *data, size_t size, uint8_t **out)
{
    Mge__ToCoordinator *m = mge__to_coordinator__unpack(NULL, size, data);
    size_t n = 0;
    *out = NULL;
    if (m && m->msg_case == MGE__TO_COORDINATOR__MSG_HEARTBEAT && m->heartbeat->worker_id &&
        !strcmp(m->heartbeat->worker_id, "@")) {
        char *mine = m->heartbeat->worker_id;
        m->heartbeat->worker_id = g_worker_id;
        n = mge__to_coordinator__get_packed_size(m);
        *out = malloc(n ? n : 1);
        if (*out)
            mge__to_coordinator__pack(m, *out);
        m->heartbeat->worker_id = mine; /* free_unpacked frees what unpack made */
    }
    mge__to_coordinator__free_unpacked(m, NULL);
    return *out ? n : size;
}

static char g_dir[] = "/tmp/mge-fuzz-frame.XXXXXX";

/* At exit (libFuzzer ends with exit()): the store's files and directory go. */
static void remove_dir(void) { mge_test_scratch_remove(g_dir); }

static int setup(void)
{
    char *dir = g_dir;
    struct mge_store *st;
    struct mge_sched *sched;
    struct mge_rpc_opts ro = {"tcp://127.0.0.1:0", JOIN, 1000, NULL};
    struct mge_sched_opts so = {0};
    static char ckpt_dir[sizeof(g_dir) + 16];
    mge_log_set_level(MGE_LOG_OFF);
    if (!mkdtemp(dir))
        return -1;
    /* checkpoint uploads and fetches reach the store (coordinator/ckpt_store.c) */
    snprintf(ckpt_dir, sizeof(ckpt_dir), "%s/checkpoints", dir);
    ro.ckpt_dir = ckpt_dir;
    atexit(remove_dir);
    if (mge_store_open(dir, &st) != MGE_OK || insert_job(st) != 0)
        return -1;
    if (mge_rpc_new(&ro, st, &g_rpc) != MGE_OK)
        return -1;
    so.notify = mge_rpc_notify;
    so.notify_arg = g_rpc;
    if (mge_sched_new(st, &so, &sched) != MGE_OK)
        return -1;
    /* not started: frames are handled on the fuzzer's thread only */
    if (mge_rpc_set_sched(g_rpc, sched) != MGE_OK)
        return -1;
    if (register_worker() != 0)
        return -1;
    /* job 1 attempt 1 rank 0 on w1, so that the store takes w1's lines of it (it fences
     * off lines that are not the current attempt's placement on the sending worker) */
    mge_sched_tick(sched);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    uint8_t *reply = NULL, *body;
    size_t len = 0, n;
    if (!ready) {
        if (setup() != 0)
            abort(); /* the harness itself is broken */
        ready = 1;
    }
    if (size == 0)
        return 0;
    if (!(data[0] & 1)) { /* a stranger's frame */
        mge_rpc_handle_frame(g_rpc, data + 1, size - 1, &reply, &len);
        mge_free(reply);
        return 0;
    }
    n = with_worker_id(data + 1, size - 1, &body);
    handle_sealed(body ? body : data + 1, n);
    free(body);
    return 0;
}
