/*
 * fuzz_launch_request.c: untrusted LaunchRequest frames into a worker's launch handling
 * (worker/launch.c mge_launch_handle -> worker/ranks.c mge_ranks_launch), against a rank
 * table holding one rank waiting for its launch (job 1, attempt 1, rank 1 of 2, token "tok").
 * A frame that gets through is only recorded (the rank's command is cleared again after each
 * input); nothing is ever started.
 */
#include <stdint.h>
#include <stdlib.h>
#include <uv.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "worker/launch.h"
#include "worker/ranks.h"

static struct mge_ranks g_rs;

static int setup(void)
{
    struct mge_ranks_opts o = {0};
    struct mge_rank_assign a = {0};
    mge_log_set_level(MGE_LOG_OFF);
    o.train_bin = "/bin/false";
    o.work_dir = "/nonexistent";
    if (mge_ranks_init(&g_rs, uv_default_loop(), &o) != MGE_OK)
        return -1;
    a.job_id = 1;
    a.attempt = 1;
    a.rank = 1;
    a.world = 2;
    a.spec_yaml = "name: f\nmodel: {type: mlp, hidden: [4]}\n"
                  "data: {format: synthetic, input_dim: 3, classes: 2, train_size: 10}\n"
                  "train: {steps: 1, batch_size: 2, optimizer: {type: sgd, lr: 0.1}}\n";
    a.launch_token = "tok";
    return mge_ranks_assign(&g_rs, &a);
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
    mge_launch_handle(&g_rs, data, size, &reply, &len);
    mge_free(reply);
    /* forget an accepted command, so the next input meets a waiting rank again */
    pthread_mutex_lock(&g_rs.mu);
    mge_free(g_rs.r[0]->command);
    g_rs.r[0]->command = NULL;
    pthread_mutex_unlock(&g_rs.mu);
    return 0;
}
