/*
 * fuzz_worker_frame.c: libFuzzer target for protobuf frames from workers, through the
 * coordinator's whole request path (mge_rpc_handle_frame: unpack, join token check,
 * registration, heartbeat with rank reports and lines into a real SQLite store, reply).
 * The store lives in a fresh temporary directory; the join token is "fuzz".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "coordinator/rpc.h"
#include "coordinator/sched.h"
#include "coordinator/store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct mge_rpc *g_rpc;

static int setup(void)
{
    static char dir[] = "/tmp/mge-fuzz-frame.XXXXXX";
    struct mge_store *st;
    struct mge_sched *sched;
    struct mge_rpc_opts ro = {"tcp://127.0.0.1:0", "fuzz", 1000};
    struct mge_sched_opts so = {0};
    mge_log_set_level(MGE_LOG_OFF);
    if (!mkdtemp(dir) || mge_store_open(dir, &st) != MGE_OK)
        return -1;
    if (mge_rpc_new(&ro, st, &g_rpc) != MGE_OK)
        return -1;
    so.notify = mge_rpc_notify;
    so.notify_arg = g_rpc;
    if (mge_sched_new(st, &so, &sched) != MGE_OK)
        return -1;
    /* not started: frames are handled on the fuzzer's thread only */
    return mge_rpc_set_sched(g_rpc, sched);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    uint8_t *reply = NULL;
    size_t len = 0;
    if (!ready) {
        if (setup() != 0)
            abort(); /* the harness itself is broken */
        ready = 1;
    }
    mge_rpc_handle_frame(g_rpc, data, size, &reply, &len);
    mge_free(reply);
    return 0;
}
