/* main.c: mgectl, the command line client of the mge REST API. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client.h"

#define MGECTL_VERSION "0.1.0"

/* Exit codes: the job's outcome for -f, else whether the command worked. */
enum { EX_OK = 0, EX_JOB_FAILED = 1, EX_USAGE = 2, EX_CANCELLED = 3, EX_ERROR = 4 };

static struct mgectl g_c;
static const char *g_output;  /* -o json|yaml|table */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mgectl [--server URL] [--token TOKEN] COMMAND ...\n"
            "  submit FILE [--set key.path=value]... [-f] [-o json]   submit a job spec\n"
            "  list [--state S] [--limit N] [-o json]                 jobs, newest first\n"
            "  get ID [-o json|yaml]                                  one job\n"
            "  logs ID [-f] [--rank N] [--tail N]                     output of a job's ranks\n"
            "  cancel ID                                              cancel a job\n"
            "  workers [-o json]                                      workers and their slots\n"
            "  drain WORKER                                           no new ranks on a worker\n"
            "  metrics ID [--name loss] [-o json]                     stored metrics\n"
            "  checkpoint download ID [-o FILE] [--name NAME]         fetch a checkpoint\n"
            "  version\n"
            "Server and token: flags, then MGE_SERVER / MGE_TOKEN, then ~/.config/mge/config\n"
            "('server = URL', 'token = TOKEN'). Exit codes with -f: 0 succeeded, 1 failed,\n"
            "3 cancelled; 2 bad usage or spec; 4 other errors.\n");
}

/* Print an API error (problem JSON or transport error); return the exit code it maps to. */
static int report(const char *what, const struct mgectl_resp *r)
{
    json_t *p;
    if (r->status == 0) {
        fprintf(stderr, "mgectl: %s: cannot reach %s: %s\n", what, g_c.server, r->error);
        return EX_ERROR;
    }
    p = json_loads(r->body, 0, NULL);
    if (p && json_is_object(p)) {
        const char *title = json_string_value(json_object_get(p, "title"));
        const char *detail = json_string_value(json_object_get(p, "detail"));
        fprintf(stderr, "mgectl: %s: %s%s%s\n", what, title ? title : "error",
                detail ? ": " : "", detail ? detail : "");
    } else {
        fprintf(stderr, "mgectl: %s: HTTP %ld\n", what, r->status);
    }
    json_decref(p);
    if (r->status == 400 || r->status == 413 || r->status == 415 || r->status == 422)
        return EX_USAGE;
    return EX_ERROR;
}

/* GET @path as JSON; NULL (reported, *@ex set) on error. */
static json_t *get_json(const char *what, const char *path, int *ex)
{
    struct mgectl_resp r;
    json_t *o = NULL;
    mgectl_request(&g_c, "GET", path, NULL, NULL, 0, &r);
    if (r.status == 200)
        o = json_loads(r.body, 0, NULL);
    if (!o)
        *ex = report(what, &r);
    free(r.body);
    return o;
}

static void print_json(json_t *o)
{
    char *s = json_dumps(o, JSON_INDENT(2));
    if (s)
        puts(s);
    free(s);
}

/* A small YAML emitter for API objects (block style; strings quoted when needed). */
static void yaml_scalar(json_t *v)
{
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        bool plain = *s && !strpbrk(s, ":#{}[],&*!|>'\"%@`\n") && s[0] != ' ' && s[0] != '-';
        if (plain)
            fputs(s, stdout);
        else {
            char *q = json_dumps(v, JSON_ENCODE_ANY);
            fputs(q ? q : "\"\"", stdout);
            free(q);
        }
    } else {
        char *q = json_dumps(v, JSON_ENCODE_ANY);
        fputs(q ? q : "null", stdout);
        free(q);
    }
}

static void yaml_emit(json_t *v, int indent)
{
    const char *key;
    json_t *x;
    size_t i;
    if (json_is_object(v)) {
        json_object_foreach(v, key, x)
        {
            printf("%*s%s:", indent, "", key);
            if ((json_is_object(x) && json_object_size(x)) || (json_is_array(x) && json_array_size(x))) {
                putchar('\n');
                yaml_emit(x, indent + 2);
            } else {
                putchar(' ');
                if (json_is_object(x))
                    fputs("{}", stdout);
                else if (json_is_array(x))
                    fputs("[]", stdout);
                else
                    yaml_scalar(x);
                putchar('\n');
            }
        }
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, x)
        {
            if (json_is_object(x) && json_object_size(x)) {
                printf("%*s-\n", indent, "");
                yaml_emit(x, indent + 2);
            } else {
                printf("%*s- ", indent, "");
                yaml_scalar(x);
                putchar('\n');
            }
        }
    }
}

static const char *str(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "-";
}

static int state_exit(const char *state)
{
    if (!strcmp(state, "succeeded"))
        return EX_OK;
    if (!strcmp(state, "cancelled"))
        return EX_CANCELLED;
    return EX_JOB_FAILED;
}

static bool is_terminal(const char *s)
{
    return !strcmp(s, "succeeded") || !strcmp(s, "failed") || !strcmp(s, "cancelled");
}

/* ---- following a job ---- */

struct follow {
    long long id;
    bool tty, logs, metrics;
    int rank;                 /* -1: all */
    long long total, step;
    double loss, sps;
    time_t start;
    bool bar_drawn;
    char final_state[32];
};

static void bar_clear(struct follow *f)
{
    if (f->bar_drawn) {
        fputs("\r\033[K", stderr);
        f->bar_drawn = false;
    }
}

static void bar_draw(struct follow *f)
{
    char bar[31];
    double frac = f->total > 0 ? (double)f->step / (double)f->total : 0;
    int fill = (int)(frac * 30);
    long eta = -1;
    time_t el = time(NULL) - f->start;
    if (fill > 30)
        fill = 30;
    for (int i = 0; i < 30; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    if (f->step > 0 && f->total > f->step)
        eta = (long)((double)el * (double)(f->total - f->step) / (double)f->step);
    fprintf(stderr, "\r\033[K[%s] step %lld/%lld  loss %.4f  %.0f samples/s  ETA %s", bar, f->step,
            f->total, f->loss, f->sps, eta < 0 ? "-" : "");
    if (eta >= 0)
        fprintf(stderr, "%ldm%02lds", eta / 60, eta % 60);
    f->bar_drawn = true;
}

/* Whether job @id is finished now; its state into @f->final_state. */
static bool job_finished(struct follow *f)
{
    char path[64];
    int ex = 0;
    json_t *o;
    bool done = false;
    snprintf(path, sizeof(path), "/api/v1/jobs/%lld", f->id);
    o = get_json("get", path, &ex);
    if (o) {
        const char *st = str(o, "state");
        snprintf(f->final_state, sizeof(f->final_state), "%s", st);
        done = is_terminal(st);
        if (done && !strcmp(st, "failed") && json_is_string(json_object_get(o, "failure_reason"))) {
            bar_clear(f);
            fprintf(stderr, "job %lld failed: %s\n", f->id, str(o, "failure_reason"));
        }
        json_decref(o);
    }
    return done;
}

static bool on_follow_event(void *arg, const char *kind, int64_t id, json_t *d)
{
    struct follow *f = arg;
    (void)id;
    if (!strcmp(kind, "_reconnect"))
        return !job_finished(f);
    if (!strcmp(kind, "state")) {
        const char *st = str(d, "state");
        bar_clear(f);
        if (json_object_get(d, "reason"))
            fprintf(stderr, "job %lld: %s (%s)\n", f->id, st, str(d, "reason"));
        else
            fprintf(stderr, "job %lld: %s\n", f->id, st);
        if (is_terminal(st) && job_finished(f))
            return false;
    } else if (!strcmp(kind, "metric") && f->metrics) {
        json_t *s = json_object_get(d, "step");
        if (!json_is_integer(s) || json_integer_value(json_object_get(d, "rank")) != 0)
            return true;
        if (json_is_number(json_object_get(d, "test_accuracy"))) {
            /* an evaluation line of mge-train: one text line, above the bar */
            bar_clear(f);
            printf("eval step %lld epoch %lld: test accuracy %.2f%% test loss %.6f\n",
                   (long long)json_integer_value(s),
                   (long long)json_integer_value(json_object_get(d, "epoch")),
                   100.0 * json_number_value(json_object_get(d, "test_accuracy")),
                   json_number_value(json_object_get(d, "test_loss")));
            fflush(stdout);
            if (f->tty && f->step)
                bar_draw(f);
            return true;
        }
        if (!json_is_number(json_object_get(d, "loss")))
            return true;
        f->step = json_integer_value(s);
        f->loss = json_number_value(json_object_get(d, "loss"));
        f->sps = json_number_value(json_object_get(d, "samples_per_sec"));
        if (f->tty) {
            bar_draw(f);
        } else {
            printf("step %lld/%lld loss %.6f samples/s %.1f\n", f->step, f->total, f->loss,
                   f->sps);
            fflush(stdout);
        }
    } else if (!strcmp(kind, "log") && f->logs) {
        long long r = json_integer_value(json_object_get(d, "rank"));
        if (f->rank >= 0 && r != f->rank)
            return true;
        bar_clear(f);
        printf("%s\n", str(d, "text"));
        fflush(stdout);
        if (f->tty && f->metrics && f->step)
            bar_draw(f);
    }
    return true;
}

static int follow_job(long long id, bool logs, int rank)
{
    struct follow f;
    char path[96];
    int ex = 0;
    json_t *o;
    memset(&f, 0, sizeof(f));
    f.id = id;
    f.tty = isatty(STDERR_FILENO) && isatty(STDOUT_FILENO);
    f.logs = logs;
    f.metrics = true;
    f.rank = rank;
    f.start = time(NULL);
    snprintf(path, sizeof(path), "/api/v1/jobs/%lld", id);
    o = get_json("get", path, &ex);
    if (!o)
        return ex;
    f.total = json_integer_value(json_object_get(json_object_get(o, "progress"), "total_steps"));
    json_decref(o);
    snprintf(path, sizeof(path), "/api/v1/jobs/%lld/events", id);
    if (mgectl_stream(&g_c, path, on_follow_event, &f) != 0) {
        fprintf(stderr, "mgectl: cannot follow job %lld\n", id);
        return EX_ERROR;
    }
    bar_clear(&f);
    if (!f.final_state[0])
        return EX_ERROR;
    fprintf(stderr, "job %lld %s\n", id, f.final_state);
    return state_exit(f.final_state);
}

/* ---- commands ---- */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    char *buf = NULL;
    size_t cap = 0, n = 0, r;
    if (!f)
        return NULL;
    do {
        if (n + 4096 > cap) {
            char *nb;
            cap = (n + 4096) * 2;
            nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
    } while (r > 0);
    if (f != stdin)
        fclose(f);
    if (buf)
        buf[n] = '\0';
    *len = n;
    return buf;
}

static int cmd_submit(int argc, char **argv)
{
    const char *file = NULL;
    bool follow = false;
    char path[8192] = "/api/v1/jobs";
    size_t plen = strlen(path), len = 0;
    char *body;
    const char *ctype;
    struct mgectl_resp r;
    json_t *o;
    long long id;
    int ex;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--follow"))
            follow = true;
        else if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            char *e = mgectl_escape(argv[++i]);
            if (!e || plen + strlen(e) + 8 >= sizeof(path)) {
                free(e);
                return EX_USAGE;
            }
            plen += (size_t)snprintf(path + plen, sizeof(path) - plen, "%cset=%s",
                                     strchr(path, '?') ? '&' : '?', e);
            free(e);
        } else if (!file && argv[i][0] != '-')
            file = argv[i];
        else if (strcmp(argv[i], "-") == 0 && !file)
            file = argv[i];
        else {
            fprintf(stderr, "mgectl submit: unexpected '%s'\n", argv[i]);
            return EX_USAGE;
        }
    }
    if (!file) {
        fprintf(stderr, "mgectl submit: which spec file?\n");
        return EX_USAGE;
    }
    body = read_file(file, &len);
    if (!body) {
        fprintf(stderr, "mgectl submit: cannot read '%s': %s\n", file, strerror(errno));
        return EX_USAGE;
    }
    ctype = strlen(file) > 5 && !strcmp(file + strlen(file) - 5, ".json") ? "application/json"
                                                                          : "application/yaml";
    mgectl_request(&g_c, "POST", path, ctype, body, len, &r);
    free(body);
    if (r.status != 201) {
        json_t *p = json_loads(r.body, 0, NULL);
        ex = report("submit", &r);
        if (p && json_integer_value(json_object_get(p, "line")) > 0)
            fprintf(stderr, "  at %s:%lld, key '%s'\n", file,
                    (long long)json_integer_value(json_object_get(p, "line")),
                    str(p, "key"));
        json_decref(p);
        free(r.body);
        return ex;
    }
    o = json_loads(r.body, 0, NULL);
    free(r.body);
    id = json_integer_value(json_object_get(o, "id"));
    if (g_output && !strcmp(g_output, "json"))
        print_json(o);
    else
        printf("job %lld submitted (%s)\n", id, str(o, "state"));
    fflush(stdout);
    json_decref(o);
    return follow ? follow_job(id, false, -1) : EX_OK;
}

static int cmd_list(int argc, char **argv)
{
    char path[256] = "/api/v1/jobs?limit=50";
    const char *state = NULL, *limit = NULL;
    json_t *o, *jobs, *j;
    size_t i;
    int ex = 0;
    for (int k = 0; k < argc; k++) {
        if (!strcmp(argv[k], "--state") && k + 1 < argc)
            state = argv[++k];
        else if (!strcmp(argv[k], "--limit") && k + 1 < argc)
            limit = argv[++k];
        else
            return EX_USAGE;
    }
    snprintf(path, sizeof(path), "/api/v1/jobs?limit=%s%s%s", limit ? limit : "50",
             state ? "&state=" : "", state ? state : "");
    o = get_json("list", path, &ex);
    if (!o)
        return ex;
    if (g_output && !strcmp(g_output, "json")) {
        print_json(o);
        json_decref(o);
        return EX_OK;
    }
    jobs = json_object_get(o, "jobs");
    printf("%-8s %-24s %-10s %5s %7s  %-24s %s\n", "ID", "NAME", "STATE", "PRIO", "ATTEMPT",
           "CREATED", "REASON");
    json_array_foreach(jobs, i, j)
    {
        printf("%-8lld %-24.24s %-10s %5lld %7lld  %-24s %s\n",
               (long long)json_integer_value(json_object_get(j, "id")), str(j, "name"),
               str(j, "state"), (long long)json_integer_value(json_object_get(j, "priority")),
               (long long)json_integer_value(json_object_get(j, "attempt")), str(j, "created_at"),
               json_is_string(json_object_get(j, "failure_reason")) ? str(j, "failure_reason")
                                                                    : "");
    }
    json_decref(o);
    return EX_OK;
}

static long long parse_id(const char *s)
{
    char *end;
    long long v = s ? strtoll(s, &end, 10) : 0;
    return s && *s && !*end && v > 0 ? v : 0;
}

static int cmd_get(int argc, char **argv)
{
    long long id = argc > 0 ? parse_id(argv[0]) : 0;
    char path[64];
    json_t *o, *m;
    int ex = 0;
    if (!id)
        return EX_USAGE;
    snprintf(path, sizeof(path), "/api/v1/jobs/%lld", id);
    o = get_json("get", path, &ex);
    if (!o)
        return ex;
    if (g_output && !strcmp(g_output, "json"))
        print_json(o);
    else if (g_output && !strcmp(g_output, "yaml"))
        yaml_emit(o, 0);
    else {
        json_t *p = json_object_get(o, "progress");
        printf("job %lld  %s\n", id, str(o, "name"));
        printf("  state:     %s (attempt %lld)\n", str(o, "state"),
               (long long)json_integer_value(json_object_get(o, "attempt")));
        if (json_is_string(json_object_get(o, "pending_reason")))
            printf("  pending:   %s\n", str(o, "pending_reason"));
        if (json_is_string(json_object_get(o, "failure_reason")))
            printf("  failure:   %s\n", str(o, "failure_reason"));
        if (json_array_size(json_object_get(o, "placement"))) {
            json_t *pl;
            size_t i;
            printf("  placement: incarnation %lld, %zu rank%s\n",
                   (long long)json_integer_value(json_object_get(o, "incarnation")),
                   json_array_size(json_object_get(o, "placement")),
                   json_array_size(json_object_get(o, "placement")) == 1 ? "" : "s");
            json_array_foreach(json_object_get(o, "placement"), i, pl)
            {
                printf("    rank %-3lld worker %-16s host %s",
                       (long long)json_integer_value(json_object_get(pl, "rank")),
                       str(pl, "worker"), str(pl, "host"));
                if (json_is_true(json_object_get(pl, "exited")))
                    printf("  (ended: code %lld, signal %lld)",
                           (long long)json_integer_value(json_object_get(pl, "exit_code")),
                           (long long)json_integer_value(json_object_get(pl, "signal")));
                printf("\n");
            }
        }
        if (json_array_size(json_object_get(o, "incarnations")) > 1) {
            json_t *inc;
            size_t i;
            printf("  incarnations (%lld restart%s charged to the job):\n",
                   (long long)json_integer_value(json_object_get(o, "restarts")),
                   json_integer_value(json_object_get(o, "restarts")) == 1 ? "" : "s");
            json_array_foreach(json_object_get(o, "incarnations"), i, inc)
            {
                char *members = json_dumps(json_object_get(inc, "members"), JSON_COMPACT);
                printf("    %-3lld %s from step %lld: %s%s%s\n",
                       (long long)json_integer_value(json_object_get(inc, "incarnation")),
                       members ? members : "?",
                       (long long)json_integer_value(json_object_get(inc, "start_step")),
                       json_is_string(json_object_get(inc, "ended")) ? str(inc, "ended")
                                                                     : "running",
                       json_is_string(json_object_get(inc, "reason")) ? ": " : "",
                       json_is_string(json_object_get(inc, "reason")) ? str(inc, "reason") : "");
                free(members);
            }
        }
        printf("  progress:  step %lld/%lld\n",
               (long long)json_integer_value(json_object_get(p, "step")),
               (long long)json_integer_value(json_object_get(p, "total_steps")));
        printf("  created:   %s\n  started:   %s\n  finished:  %s\n", str(o, "created_at"),
               str(o, "started_at"), str(o, "finished_at"));
        m = json_object_get(o, "latest_metrics");
        if (json_object_size(m)) {
            const char *k;
            json_t *v;
            printf("  metrics:\n");
            json_object_foreach(m, k, v)
            printf("    %-18s %g (step %lld)\n", k, json_number_value(json_object_get(v, "value")),
                   (long long)json_integer_value(json_object_get(v, "step")));
        }
    }
    json_decref(o);
    return EX_OK;
}

static int cmd_logs(int argc, char **argv)
{
    long long id = 0;
    bool follow = false;
    int rank = -1;
    const char *tail = "1000";
    char path[128];
    json_t *o, *l;
    size_t i;
    int ex = 0;
    for (int k = 0; k < argc; k++) {
        if (!strcmp(argv[k], "-f") || !strcmp(argv[k], "--follow"))
            follow = true;
        else if (!strcmp(argv[k], "--rank") && k + 1 < argc)
            rank = atoi(argv[++k]);
        else if (!strcmp(argv[k], "--tail") && k + 1 < argc)
            tail = argv[++k];
        else if (!id)
            id = parse_id(argv[k]);
        else
            return EX_USAGE;
    }
    if (!id)
        return EX_USAGE;
    if (follow)
        return follow_job(id, true, rank);
    if (rank >= 0)
        snprintf(path, sizeof(path), "/api/v1/jobs/%lld/logs?tail=%s&rank=%d", id, tail, rank);
    else
        snprintf(path, sizeof(path), "/api/v1/jobs/%lld/logs?tail=%s", id, tail);
    o = get_json("logs", path, &ex);
    if (!o)
        return ex;
    json_array_foreach(json_object_get(o, "lines"), i, l) printf("%s\n", str(l, "text"));
    json_decref(o);
    return EX_OK;
}

static int cmd_post(const char *what, const char *path, const char *done_msg)
{
    struct mgectl_resp r;
    int ex = EX_OK;
    mgectl_request(&g_c, "POST", path, "application/json", "{}", 2, &r);
    if (r.status != 200)
        ex = report(what, &r);
    else if (g_output && !strcmp(g_output, "json"))
        puts(r.body);
    else
        puts(done_msg);
    free(r.body);
    return ex;
}

static int cmd_workers(void)
{
    json_t *o, *w;
    size_t i;
    int ex = 0;
    o = get_json("workers", "/api/v1/workers", &ex);
    if (!o)
        return ex;
    if (g_output && !strcmp(g_output, "json")) {
        print_json(o);
        json_decref(o);
        return EX_OK;
    }
    printf("%-16s %-20s %-9s %9s %15s %6s %6s  %s\n", "NAME", "ID", "STATE", "CPUS", "MEMORY_MB",
           "GPUS", "RANKS", "LAST_SEEN");
    json_array_foreach(json_object_get(o, "workers"), i, w)
    {
        json_t *s = json_object_get(w, "slots"), *f = json_object_get(w, "free");
        char cpus[32], mem[48], gpus[32];
        snprintf(cpus, sizeof(cpus), "%lld/%lld",
                 (long long)json_integer_value(json_object_get(f, "cpus")),
                 (long long)json_integer_value(json_object_get(s, "cpus")));
        snprintf(mem, sizeof(mem), "%lld/%lld",
                 (long long)json_integer_value(json_object_get(f, "memory_mb")),
                 (long long)json_integer_value(json_object_get(s, "memory_mb")));
        snprintf(gpus, sizeof(gpus), "%lld/%lld",
                 (long long)json_integer_value(json_object_get(f, "gpus")),
                 (long long)json_integer_value(json_object_get(s, "gpus")));
        printf("%-16.16s %-20s %-9s %9s %15s %6s %6lld  %s\n", str(w, "name"), str(w, "id"),
               str(w, "state"), cpus, mem, gpus,
               (long long)json_integer_value(json_object_get(w, "running_ranks")),
               str(w, "last_seen"));
    }
    json_decref(o);
    return EX_OK;
}

static int cmd_metrics(int argc, char **argv)
{
    long long id = 0;
    const char *name = NULL;
    char path[256];
    json_t *o, *m;
    size_t i;
    int ex = 0;
    for (int k = 0; k < argc; k++) {
        if (!strcmp(argv[k], "--name") && k + 1 < argc)
            name = argv[++k];
        else if (!id)
            id = parse_id(argv[k]);
        else
            return EX_USAGE;
    }
    if (!id)
        return EX_USAGE;
    if (name) {
        char *e = mgectl_escape(name);
        snprintf(path, sizeof(path), "/api/v1/jobs/%lld/metrics?name=%s", id, e ? e : "");
        free(e);
    } else {
        snprintf(path, sizeof(path), "/api/v1/jobs/%lld/metrics", id);
    }
    o = get_json("metrics", path, &ex);
    if (!o)
        return ex;
    if (g_output && !strcmp(g_output, "json")) {
        print_json(o);
    } else {
        printf("%8s  %-20s %s\n", "STEP", "NAME", "VALUE");
        json_array_foreach(json_object_get(o, "metrics"), i, m)
        printf("%8lld  %-20s %.6g\n", (long long)json_integer_value(json_object_get(m, "step")),
               str(m, "name"), json_number_value(json_object_get(m, "value")));
    }
    json_decref(o);
    return EX_OK;
}

static int cmd_checkpoint(int argc, char **argv)
{
    long long id = 0;
    const char *out = NULL, *name = "latest";
    char path[256], def[64];
    long status;
    if (argc < 1 || strcmp(argv[0], "download") != 0)
        return EX_USAGE;
    for (int k = 1; k < argc; k++) {
        if (!strcmp(argv[k], "-o") && k + 1 < argc)
            out = argv[++k];
        else if (!strcmp(argv[k], "--name") && k + 1 < argc)
            name = argv[++k];
        else if (!id)
            id = parse_id(argv[k]);
        else
            return EX_USAGE;
    }
    if (!id)
        return EX_USAGE;
    if (!out) {
        snprintf(def, sizeof(def), "job-%lld.mgeckpt", id);
        out = def;
    }
    {
        char *e = mgectl_escape(name);
        snprintf(path, sizeof(path), "/api/v1/jobs/%lld/checkpoints/%s", id, e ? e : "latest");
        free(e);
    }
    status = mgectl_download(&g_c, path, out);
    if (status != 200) {
        fprintf(stderr, "mgectl: checkpoint download: %s\n",
                status == 0 ? "cannot reach the server" : status == 404 ? "no such checkpoint"
                                                                        : "refused");
        return EX_ERROR;
    }
    printf("%s\n", out);
    return EX_OK;
}

int main(int argc, char **argv)
{
    const char *server = NULL, *token = NULL;
    char *rest[256];
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--server") && i + 1 < argc)
            server = argv[++i];
        else if (!strcmp(argv[i], "--token") && i + 1 < argc)
            token = argv[++i];
        else if (!strcmp(argv[i], "-o") && i + 1 < argc && n > 0 && strcmp(rest[0], "checkpoint"))
            g_output = argv[++i];
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return EX_OK;
        } else if (n < 256)
            rest[n++] = argv[i];
    }
    if (n == 0) {
        usage(stderr);
        return EX_USAGE;
    }
    if (g_output && strcmp(g_output, "json") && strcmp(g_output, "yaml") &&
        strcmp(g_output, "table")) {
        fprintf(stderr, "mgectl: -o is json, yaml or table\n");
        return EX_USAGE;
    }
    if (!strcmp(rest[0], "version")) {
        printf("mgectl %s\n", MGECTL_VERSION);
        return EX_OK;
    }
    mgectl_config(&g_c, server, token);
    if (!strcmp(rest[0], "submit"))
        return cmd_submit(n - 1, rest + 1);
    if (!strcmp(rest[0], "list"))
        return cmd_list(n - 1, rest + 1);
    if (!strcmp(rest[0], "get"))
        return cmd_get(n - 1, rest + 1);
    if (!strcmp(rest[0], "logs"))
        return cmd_logs(n - 1, rest + 1);
    if (!strcmp(rest[0], "cancel") && n == 2 && parse_id(rest[1])) {
        char path[64], msg[64];
        snprintf(path, sizeof(path), "/api/v1/jobs/%lld/cancel", parse_id(rest[1]));
        snprintf(msg, sizeof(msg), "job %lld cancelled", parse_id(rest[1]));
        return cmd_post("cancel", path, msg);
    }
    if (!strcmp(rest[0], "drain") && n == 2) {
        char path[256], msg[300];
        char *e = mgectl_escape(rest[1]);
        int ex;
        snprintf(path, sizeof(path), "/api/v1/workers/%s/drain", e ? e : "");
        snprintf(msg, sizeof(msg), "worker %.200s draining", rest[1]);
        ex = cmd_post("drain", path, msg);
        free(e);
        return ex;
    }
    if (!strcmp(rest[0], "workers"))
        return cmd_workers();
    if (!strcmp(rest[0], "metrics"))
        return cmd_metrics(n - 1, rest + 1);
    if (!strcmp(rest[0], "checkpoint"))
        return cmd_checkpoint(n - 1, rest + 1);
    usage(stderr);
    return EX_USAGE;
}
