/*
 * mge-loadgen.c: LOAD GENERATOR for the control-plane benchmarks (tests/bench/control.sh).
 * Its simulated workers only register and heartbeat; they never run anything and never
 * stand in for real workers in tests.
 *
 *   mge-loadgen submit URL TOKEN N CONNS      N job submissions over CONNS keep-alive
 *                                             connections; prints submissions/s
 *   mge-loadgen list URL TOKEN N              N x GET /api/v1/jobs; prints p50/p99 ms
 *   mge-loadgen latency URL TOKEN N WORKDIR   submit-to-rank-spawn latency: until the rank's
 *                                             spec.yaml appears under WORKDIR (the worker
 *                                             writes it just before it starts mge-train)
 *   mge-loadgen workers WORKER_URL JOIN N SECONDS   N simulated workers heartbeating at 1 Hz
 *                                             (authenticated as real workers are: a Register
 *                                             that proves JOIN, MACed frames, replies checked)
 *   mge-loadgen sse HOST:PORT TOKEN JOB N SECONDS   N idle subscribers of GET /jobs/JOB/events
 *                                             held open SECONDS; prints how many answered 200
 */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/crypto.h"
#include "proto/worker.pb-c.h"
#include "worker/link_frame.h"

/* a full spec that the real mge-train runs in a fraction of a second */
static const char SPEC[] =
    "name: bench\n"
    "model: {type: mlp, hidden: [32]}\n"
    "data: {format: synthetic, train_size: 256, test_size: 0, input_dim: 784, classes: 10}\n"
    "train: {steps: 10, batch_size: 32, optimizer: {type: sgd, lr: 0.05}}\n";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t sink(char *p, size_t s, size_t n, void *arg)
{
    struct {
        char buf[4096];
        size_t len;
    } *b = arg;
    size_t k = s * n;
    if (b) {
        size_t c = k < sizeof(b->buf) - 1 - b->len ? k : sizeof(b->buf) - 1 - b->len;
        memcpy(b->buf + b->len, p, c);
        b->len += c;
        b->buf[b->len] = '\0';
    }
    return k;
}

struct sub_arg {
    const char *url, *token;
    int n;
    int failed;
};

static CURL *client(const char *token, struct curl_slist **h, const char *ctype)
{
    char auth[600];
    CURL *c = curl_easy_init();
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", token);
    *h = curl_slist_append(NULL, auth);
    if (ctype)
        *h = curl_slist_append(*h, ctype);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, *h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, NULL);
    curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
    return c;
}

static void *submit_thread(void *p)
{
    struct sub_arg *a = p;
    struct curl_slist *h;
    char url[512];
    CURL *c = client(a->token, &h, "Content-Type: application/yaml");
    snprintf(url, sizeof(url), "%s/api/v1/jobs", a->url);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, SPEC);
    for (int i = 0; i < a->n; i++) {
        long st = 0;
        if (curl_easy_perform(c) != CURLE_OK ||
            (curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st), st != 201))
            a->failed++;
    }
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return NULL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int do_submit(const char *url, const char *token, int n, int conns)
{
    pthread_t t[64];
    struct sub_arg a[64];
    int failed = 0;
    double t0;
    if (conns < 1 || conns > 64)
        conns = 4;
    t0 = now_s();
    for (int i = 0; i < conns; i++) {
        a[i] = (struct sub_arg){url, token, n / conns + (i < n % conns), 0};
        pthread_create(&t[i], NULL, submit_thread, &a[i]);
    }
    for (int i = 0; i < conns; i++) {
        pthread_join(t[i], NULL);
        failed += a[i].failed;
    }
    printf("submissions_per_sec %.0f (%d jobs, %d connections, %d failed)\n",
           n / (now_s() - t0), n, conns, failed);
    return failed ? 1 : 0;
}

static int do_list(const char *url, const char *token, int n)
{
    struct curl_slist *h;
    char u[512];
    double *lat = calloc((size_t)n, sizeof(*lat));
    CURL *c = client(token, &h, NULL);
    snprintf(u, sizeof(u), "%s/api/v1/jobs", url);
    curl_easy_setopt(c, CURLOPT_URL, u);
    for (int i = 0; i < n; i++) {
        double t0 = now_s();
        curl_easy_perform(c);
        lat[i] = (now_s() - t0) * 1000;
    }
    qsort(lat, (size_t)n, sizeof(*lat), cmp_d);
    printf("get_jobs_ms p50 %.2f p99 %.2f max %.2f (%d requests, 50 jobs per page)\n",
           lat[n / 2], lat[(n * 99) / 100], lat[n - 1], n);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    free(lat);
    return 0;
}

static int do_latency(const char *url, const char *token, int n, const char *workdir)
{
    struct curl_slist *h;
    char u[512];
    double *lat = calloc((size_t)n, sizeof(*lat));
    CURL *c = client(token, &h, "Content-Type: application/yaml");
    struct {
        char buf[4096];
        size_t len;
    } b;
    int got = 0;
    snprintf(u, sizeof(u), "%s/api/v1/jobs", url);
    curl_easy_setopt(c, CURLOPT_URL, u);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, SPEC);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    for (int i = 0; i < n; i++) {
        double sent, deadline;
        long long id;
        char path[1024];
        b.len = 0;
        sent = now_s();
        if (curl_easy_perform(c) != CURLE_OK || sscanf(b.buf, "{\"id\":%lld", &id) != 1)
            continue;
        snprintf(path, sizeof(path), "%s/job-%lld/attempt-1/rank-0/spec.yaml", workdir, id);
        deadline = now_s() + 10;
        while (now_s() < deadline) {
            if (access(path, F_OK) == 0) { /* polled every 0.2 ms: that close to the spawn */
                lat[got++] = (now_s() - sent) * 1000;
                break;
            }
            usleep(200);
        }
        usleep(300000); /* let mge-train finish and the slot free up */
    }
    if (got) {
        qsort(lat, (size_t)got, sizeof(*lat), cmp_d);
        printf("submit_to_spawn_ms p50 %.1f p90 %.1f max %.1f (%d of %d jobs)\n", lat[got / 2],
               lat[(got * 9) / 10], lat[got - 1], got, n);
    } else {
        printf("submit_to_spawn_ms none measured\n");
    }
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    free(lat);
    return got == n ? 0 : 1;
}

struct sim {
    nng_socket s;
    char id[40];
    double next;
    const char *join;
    uint8_t key[MGE_HMAC_LEN];   /* session key (see LinkFrame in proto/worker.proto) */
    uint8_t nonce[MGE_NONCE_LEN];
    uint64_t counter;
};

struct sim_arg {
    struct sim *w;
    int from, to;
    double end;
    long beats, errors;
};

/* Seal @m as mge-worker does (worker/link_frame.c): a Register while w->id is "", else a frame.
 * The frame is mge_malloc'ed (mge_free it); NULL on failure. */
static uint8_t *sim_seal(struct sim *w, const Mge__ToCoordinator *m, size_t *len)
{
    size_t body_len = mge__to_coordinator__get_packed_size(m);
    uint8_t *body = malloc(body_len ? body_len : 1), *buf = NULL;
    int rc;
    if (!body)
        return NULL;
    mge__to_coordinator__pack(m, body);
    if (!w->id[0]) {
        rc = mge_random_bytes(w->nonce, sizeof(w->nonce));
        if (rc == 0)
            rc = mge_link_frame_seal(w->join, strlen(w->join), NULL, 0, w->nonce, sizeof(w->nonce),
                                     body, body_len, &buf, len);
    } else {
        rc = mge_link_frame_seal(w->key, sizeof(w->key), w->id, ++w->counter, NULL, 0, body,
                                 body_len, &buf, len);
    }
    free(body);
    return rc == 0 ? buf : NULL;
}

/* The reply's ToWorker when its MAC is the session's (a Register reply starts the session). */
static Mge__ToWorker *sim_open(struct sim *w, const Mge__LinkReply *lr)
{
    Mge__ToWorker *tw = mge__to_worker__unpack(NULL, lr->body.len, lr->body.data);
    uint8_t mac[MGE_HMAC_LEN];
    if (!tw || !lr->mac.len)
        goto err_free;
    if (!w->id[0]) {
        if (!tw->worker_id || !*tw->worker_id || lr->nonce.len != MGE_NONCE_LEN ||
            mge_link_session_key(w->join, tw->worker_id, w->nonce, lr->nonce.data, w->key) != 0)
            goto err_free;
        snprintf(w->id, sizeof(w->id), "%s", tw->worker_id);
        w->counter = 0;
    }
    if (mge_link_mac(MGE_LINK_MAC_REPLY, w->key, sizeof(w->key), w->id, lr->counter,
                     lr->nonce.data, lr->nonce.len, lr->body.data, lr->body.len, mac) != 0 ||
        lr->counter != w->counter || !mge_ct_equal(mac, sizeof(mac), lr->mac.data, lr->mac.len))
        goto err_free;
    return tw;
err_free:
    mge__to_worker__free_unpacked(tw, NULL);
    return NULL;
}

static int sim_call(struct sim *w, Mge__ToCoordinator *m)
{
    size_t len = 0;
    uint8_t *buf = sim_seal(w, m, &len);
    nng_msg *r = NULL;
    Mge__LinkReply *lr;
    Mge__ToWorker *tw;
    int ok = 0;
    if (buf && nng_send(w->s, buf, len, 0) == 0 && nng_recvmsg(w->s, &r, 0) == 0) {
        lr = mge__link_reply__unpack(NULL, nng_msg_len(r), nng_msg_body(r));
        tw = lr ? sim_open(w, lr) : NULL;
        ok = tw && !(tw->error && *tw->error);
        mge__to_worker__free_unpacked(tw, NULL);
        mge__link_reply__free_unpacked(lr, NULL);
        nng_msg_free(r);
    }
    mge_free(buf);
    return ok;
}

static void *sim_thread(void *p)
{
    struct sim_arg *a = p;
    while (now_s() < a->end) {
        double t = now_s(), soonest = t + 1;
        for (int i = a->from; i < a->to; i++) {
            struct sim *w = &a->w[i];
            if (w->next <= t) {
                Mge__ToCoordinator m = MGE__TO_COORDINATOR__INIT;
                Mge__Heartbeat hb = MGE__HEARTBEAT__INIT;
                hb.worker_id = w->id;
                m.msg_case = MGE__TO_COORDINATOR__MSG_HEARTBEAT;
                m.heartbeat = &hb;
                if (sim_call(w, &m))
                    a->beats++;
                else
                    a->errors++;
                w->next += 1.0;
            }
            if (w->next < soonest)
                soonest = w->next;
        }
        if (soonest > now_s())
            usleep((useconds_t)((soonest - now_s()) * 1e6));
    }
    return NULL;
}

static int do_workers(const char *wurl, const char *join, int n, int secs)
{
    struct sim *w = calloc((size_t)n, sizeof(*w));
    pthread_t t[4];
    struct sim_arg a[4];
    long beats = 0, errors = 0;
    double start = now_s();
    for (int i = 0; i < n; i++) {
        Mge__ToCoordinator m = MGE__TO_COORDINATOR__INIT;
        Mge__Register reg = MGE__REGISTER__INIT;
        Mge__Slots slots = MGE__SLOTS__INIT;
        char name[32];
        snprintf(name, sizeof(name), "sim-%04d", i);
        w[i].join = join;
        nng_req0_open(&w[i].s);
        nng_socket_set_ms(w[i].s, NNG_OPT_RECVTIMEO, 5000);
        if (nng_dial(w[i].s, wurl, NULL, 0) != 0) {
            fprintf(stderr, "loadgen: cannot dial %s\n", wurl);
            return 1;
        }
        slots.cpus = 0; /* nothing can be placed on a simulated worker */
        slots.device = (char *)"cpu";
        reg.name = name;
        reg.host = (char *)"loadgen";
        reg.version = (char *)"loadgen";
        reg.slots = &slots;
        m.msg_case = MGE__TO_COORDINATOR__MSG_REGISTER;
        m.register_ = &reg;
        if (!sim_call(&w[i], &m)) {
            fprintf(stderr, "loadgen: register %s refused\n", name);
            return 1;
        }
        w[i].next = start + (double)i / n; /* spread the beats over the second */
    }
    for (int k = 0; k < 4; k++) {
        a[k] = (struct sim_arg){w, k * n / 4, (k + 1) * n / 4, now_s() + secs, 0, 0};
        pthread_create(&t[k], NULL, sim_thread, &a[k]);
    }
    for (int k = 0; k < 4; k++) {
        pthread_join(t[k], NULL);
        beats += a[k].beats;
        errors += a[k].errors;
    }
    printf("simulated_workers %d heartbeats %ld errors %ld over %d s\n", n, beats, errors, secs);
    for (int i = 0; i < n; i++)
        nng_close(w[i].s);
    free(w);
    return errors ? 1 : 0;
}

/* N raw connections, each a GET of the job's event stream, held open and never read again. */
static int do_sse(const char *hostport, const char *token, int job, int n, int secs)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    const char *colon = strrchr(hostport, ':');
    char host[64], req[512], buf[512];
    int *fds = calloc((size_t)n, sizeof(*fds)), ok = 0;
    if (!fds || !colon || (size_t)(colon - hostport) >= sizeof(host))
        return 2;
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return 2;
    snprintf(req, sizeof(req),
             "GET /api/v1/jobs/%d/events HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
             "Accept: text/event-stream\r\n\r\n", job, hostport, token);
    for (int i = 0; i < n; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (fds[i] < 0 || connect(fds[i], (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
            write(fds[i], req, strlen(req)) != (ssize_t)strlen(req)) {
            perror("sse subscriber");
            break;
        }
    }
    for (int i = 0; i < n; i++) { /* the status line and the job's first events */
        ssize_t k = fds[i] > 0 ? read(fds[i], buf, sizeof(buf) - 1) : -1;
        if (k > 12 && !strncmp(buf, "HTTP/1.1 200", 12))
            ok++;
    }
    printf("sse_subscribers %d of %d answered 200, holding them %d s\n", ok, n, secs);
    fflush(stdout);
    sleep((unsigned)secs);
    for (int i = 0; i < n; i++)
        if (fds[i] > 0)
            close(fds[i]);
    free(fds);
    return ok == n ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        fprintf(stderr, "mge-loadgen: a LOAD GENERATOR for benchmarks; simulated workers never run "
                        "anything.\nsee the comment at the top of tests/bench/mge-loadgen.c\n");
        return 2;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    if (!strcmp(argv[1], "submit") && argc == 6)
        return do_submit(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
    if (!strcmp(argv[1], "list") && argc == 5)
        return do_list(argv[2], argv[3], atoi(argv[4]));
    if (!strcmp(argv[1], "latency") && argc == 6)
        return do_latency(argv[2], argv[3], atoi(argv[4]), argv[5]);
    if (!strcmp(argv[1], "workers") && argc == 6)
        return do_workers(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
    if (!strcmp(argv[1], "sse") && argc == 7)
        return do_sse(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), atoi(argv[6]));
    fprintf(stderr, "mge-loadgen: bad arguments (try --help)\n");
    return 2;
}
