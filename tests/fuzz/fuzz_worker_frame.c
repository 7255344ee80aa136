/*
 * fuzz_worker_frame.c: libFuzzer target for protobuf frames from workers, through the
 * coordinator's whole request path (mge_rpc_handle_frame: unpack, join token check,
 * registration, heartbeat with rank reports and lines into a real SQLite store, reply).
 * The store lives in a fresh temporary directory and holds job 1; the join token is "fuzz".
 * A heartbeat whose worker_id is "@" gets the id of a worker registered at setup (ids are
 * random), so that frames get past the worker check into line ingestion and the scheduler;
 * job 1 is placed on that worker, so its lines of attempt 1, rank 0 are stored.
 * Seeds: corpus/worker_frame/, written by gen_worker_frame_seeds.c.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "coordinator/rpc.h"
#include "coordinator/sched.h"
#include "coordinator/store.h"
#include "proto/worker.pb-c.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct mge_rpc *g_rpc;
static char g_worker_id[64]; /* the worker registered at setup */

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

/* Register worker "w1" (2 CPUs) through the frame path; its id into g_worker_id. */
static int register_worker(void)
{
    Mge__ToCoordinator m = MGE__TO_COORDINATOR__INIT;
    Mge__Register reg = MGE__REGISTER__INIT;
    Mge__Slots slots = MGE__SLOTS__INIT;
    Mge__ToWorker *tw;
    uint8_t buf[256], *reply = NULL;
    size_t len = 0;
    int ok;
    reg.name = (char *)"w1";
    reg.join_token = (char *)"fuzz";
    slots.cpus = 2;
    slots.memory_mb = 4096;
    slots.device = (char *)"cpu";
    reg.slots = &slots;
    m.msg_case = MGE__TO_COORDINATOR__MSG_REGISTER;
    m.register_ = &reg;
    if (mge__to_coordinator__get_packed_size(&m) > sizeof(buf))
        return -1;
    mge_rpc_handle_frame(g_rpc, buf, mge__to_coordinator__pack(&m, buf), &reply, &len);
    tw = reply ? mge__to_worker__unpack(NULL, len, reply) : NULL;
    ok = tw && tw->worker_id && *tw->worker_id;
    if (ok)
        snprintf(g_worker_id, sizeof(g_worker_id), "%s", tw->worker_id);
    mge__to_worker__free_unpacked(tw, NULL);
    mge_free(reply);
    return ok ? 0 : -1;
}

/*
 * @data as the frame to handle: itself, or repacked with the registered worker's id when it
 * is a heartbeat from "@". Returns a malloc'ed copy in *@out (NULL: use @data as is).
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
static void remove_dir(void)
{
    DIR *d = opendir(g_dir);
    struct dirent *de;
    char path[sizeof(g_dir) + 300];
    while (d && (de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(path, sizeof(path), "%s/%.250s", g_dir, de->d_name);
            unlink(path);
        }
    if (d)
        closedir(d);
    rmdir(g_dir);
}

static int setup(void)
{
    char *dir = g_dir;
    struct mge_store *st;
    struct mge_sched *sched;
    struct mge_rpc_opts ro = {"tcp://127.0.0.1:0", "fuzz", 1000};
    struct mge_sched_opts so = {0};
    mge_log_set_level(MGE_LOG_OFF);
    if (!mkdtemp(dir))
        return -1;
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
    uint8_t *reply = NULL, *frame;
    size_t len = 0, n;
    if (!ready) {
        if (setup() != 0)
            abort(); /* the harness itself is broken */
        ready = 1;
    }
    n = with_worker_id(data, size, &frame);
    mge_rpc_handle_frame(g_rpc, frame ? frame : data, n, &reply, &len);
    mge_free(reply);
    free(frame);
    return 0;
}
