/* main.c: mgectl, the command line client of the mge REST API. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "completion.h"

#define MGECTL_VERSION "0.1.0"

/*
 * Exit codes (documented in usage() and docs/operations.md; tests/integration/cli.sh checks
 * each): with -f the job's outcome, else whether the command worked.
 */
enum {
    EX_OK = 0,          /* done; with -f: the job succeeded */
    EX_JOB_FAILED = 1,  /* with -f: the job failed */
    EX_USAGE = 2,       /* bad usage or input: arguments, spec (400/413/415/422), config file */
    EX_UNREACHABLE = 3, /* no answer from the server (connection refused, DNS, TLS, timeout) */
    EX_REFUSED = 4,     /* the server refused the token (401) or its role (403) */
    EX_NOT_FOUND = 5,   /* no such job, worker or checkpoint (404) */
    EX_CANCELLED = 6,   /* with -f: the job was cancelled */
    EX_SERVER = 7,      /* the server failed (5xx) or answered something unexpected */
};

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
            "  undrain WORKER                                         it takes new ranks again\n"
            "  top [--every S] [--once]                               jobs and workers, live\n"
            "  metrics ID [--name loss] [-o json]                     stored metrics\n"
            "  checkpoint download ID [-o FILE] [--name NAME]         fetch a checkpoint\n"
            "  completion bash|zsh                                    shell completion script\n"
            "  version\n"
            "-f shows one live progress line on a terminal; otherwise a line every --every S\n"
            "seconds (default 10, $MGE_PROGRESS_EVERY; 0: every step) and a summary at the end.\n"
            "Global flags: --server URL, --token-file FILE (--token TOKEN), --cacert FILE; they\n"
            "win over MGE_SERVER, MGE_TOKEN_FILE (MGE_TOKEN), MGE_CACERT, which win over\n"
            "$XDG_CONFIG_HOME/mge/config.yaml (~/.config/mge/config.yaml; keys server,\n"
            "token_file, cacert; MGE_CONFIG names another file).\n"
            "Exit codes: 0 ok (with -f: the job succeeded), 1 the job failed, 2 bad usage or\n"
            "input, 3 server unreachable, 4 token refused (401/403), 5 not found, 6 the job\n"
            "was cancelled, 7 server error.\n");
}

/* The exit code of an HTTP status that is not the expected one (0: no answer). */
static int status_exit(long status)
{
    if (status == 0)
        return EX_UNREACHABLE;
    if (status == 401 || status == 403)
        return EX_REFUSED;
    if (status == 404)
        return EX_NOT_FOUND;
    if (status >= 400 && status < 500)
        return EX_USAGE;
    return EX_SERVER;
}

/* "mgectl CMD: bad arguments ..." on stderr; returns EX_USAGE. */
static int bad_usage(const char *cmd, const char *why)
{
    fprintf(stderr, "mgectl %s: %s (see mgectl --help)\n", cmd, why);
    return EX_USAGE;
}

/* Print an API error (problem JSON or transport error); return the exit code it maps to. */
static int report(const char *what, const struct mgectl_resp *r)
{
    json_t *p;
    if (r->status == 0) {
        fprintf(stderr, "mgectl: %s: cannot reach %s: %s\n", what, g_c.server, r->error);
        return EX_UNREACHABLE;
    }
    p = json_loads(r->body, 0, NULL);
    if (p && json_is_object(p)) {
        const char *title = json_string_value(json_object_get(p, "title"));
        const char *detail = json_string_value(json_object_get(p, "detail"));
        if (detail && title && !strcmp(detail, title))
            detail = NULL;
        fprintf(stderr, "mgectl: %s: %s%s%s\n", what, title ? title : "error",
                detail ? ": " : "", detail ? detail : "");
    } else {
        fprintf(stderr, "mgectl: %s: HTTP %ld\n", what, r->status);
    }
    json_decref(p);
    return status_exit(r->status);
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

/*
 * Progress of a followed job. On a terminal (stdout and stderr both): one line on stderr,
 * rewritten in place (at most 10 times a second, and at the last step). Otherwise a plain
 * "step N/T ..." line on stdout every @every seconds (0: every step) and at the last step.
 * Either way, evaluations, state changes and the final summary are lines of their own.
 */
struct follow {
    long long id;
    bool tty, logs, metrics;
    int rank;                 /* -1: all */
    double every;             /* seconds between plain lines; 0: every step */
    long long total, step;
    double loss, sps, test_acc;
    bool have_acc;
    long long rate_step;      /* first step seen, and when (event time): the ETA's speed */
    double rate_t, step_t;    /* step_t: the event time of the latest step */
    double run_s;             /* how long the job ran (started_at to finished_at), -1 unknown */
    double last_out;          /* when the progress was last drawn or printed */
    bool bar_drawn;
    double lost_since;        /* when the server stopped answering; 0: it answers */
    long last_status;         /* an unexpected HTTP status of the job, 0 none */
    char final_state[32];
    char failure[512];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "1h02m", "3m07s", "12s" into @buf */
static const char *fmt_duration(char *buf, size_t n, double s)
{
    long t = s < 0 ? 0 : (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, n, "%lds", t);
    return buf;
}

/* Seconds since the epoch of an RFC 3339 UTC time ("2026-11-25T04:46:07.284Z"); -1 if not. */
static double iso_seconds(const char *s)
{
    struct tm tm;
    double sec;
    memset(&tm, 0, sizeof(tm));
    if (!s || sscanf(s, "%d-%d-%dT%d:%d:%lf", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                     &tm.tm_min, &sec) != 6)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    return (double)timegm(&tm) + sec;
}

/*
 * Seconds until the last step, from the speed between the first step seen and the latest
 * (by the events' own times, so that a replayed history gives the speed it had); -1 unknown.
 */
static double follow_eta(const struct follow *f)
{
    double dt = f->step_t - f->rate_t;
    if (f->step <= f->rate_step || f->total <= f->step || dt <= 0)
        return -1;
    return dt * (double)(f->total - f->step) / (double)(f->step - f->rate_step);
}

/*
 * The progress into @buf: for a terminal "step 812/1407  loss 0.4123  5230 samples/s  ETA 41s";
 * @plain (for logs and scripts) "step 812/1407 loss 0.412300 samples/s 5230.4 eta 41s".
 */
static void progress_text(const struct follow *f, bool plain, char *buf, size_t n)
{
    char d[32];
    double eta = follow_eta(f);
    const char *e =
        f->step >= f->total ? "done" : eta < 0 ? "-" : fmt_duration(d, sizeof(d), eta);
    if (plain)
        snprintf(buf, n, "step %lld/%lld loss %.6f samples/s %.1f eta %s", f->step, f->total,
                 f->loss, f->sps, e);
    else
        snprintf(buf, n, "step %lld/%lld  loss %.4f  %.0f samples/s  ETA %s", f->step, f->total,
                 f->loss, f->sps, e);
}

static void bar_clear(struct follow *f)
{
    if (f->bar_drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        f->bar_drawn = false;
    }
}

static void bar_draw(struct follow *f)
{
    char bar[21], text[160], line[256];
    struct winsize ws;
    int width = 80, fill;
    double frac = f->total > 0 ? (double)f->step / (double)f->total : 0;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        width = ws.ws_col;
    fill = frac > 1 ? 20 : (int)(frac * 20);
    for (int i = 0; i < 20; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[20] = '\0';
    progress_text(f, false, text, sizeof(text));
    snprintf(line, sizeof(line), "[%s] %s", bar, text);
    /* never wrap: a wrapped line cannot be rewritten with \r */
    if (width > 1 && (int)strlen(line) >= width)
        line[width - 1] = '\0';
    fprintf(stderr, "\r\033[K%s", line);
    fflush(stderr);
    f->bar_drawn = true;
    f->last_out = now_s();
}

/* A new step arrived: redraw or print it when it is time. */
static void progress_show(struct follow *f)
{
    double t = now_s();
    bool last = f->total > 0 && f->step >= f->total;
    if (f->tty) {
        if (last || !f->bar_drawn || t - f->last_out >= 0.1)
            bar_draw(f);
    } else if (last || f->every <= 0 || f->last_out == 0 || t - f->last_out >= f->every) {
        char text[160];
        progress_text(f, true, text, sizeof(text));
        printf("%s\n", text);
        fflush(stdout);
        f->last_out = t;
    }
}

/* How long a follower waits for a server that stopped answering before it gives up. */
#define FOLLOW_LOST_S 120.0

/*
 * Whether following job @id is over: it finished (its state into @f->final_state, its failure
 * reason too), or the server has not answered for FOLLOW_LOST_S (final_state stays "").
 * A server that does not answer is said once, not at each retry.
 */
static bool job_finished(struct follow *f)
{
    char path[64];
    struct mgectl_resp r;
    json_t *o = NULL;
    bool done = false;
    snprintf(path, sizeof(path), "/api/v1/jobs/%lld", f->id);
    mgectl_request(&g_c, "GET", path, NULL, NULL, 0, &r);
    if (r.status == 200)
        o = json_loads(r.body, 0, NULL);
    if (!o && r.status == 0) {
        if (f->lost_since == 0) {
            bar_clear(f);
            fprintf(stderr, "mgectl: cannot reach %s (%s); retrying for %.0f s\n", g_c.server,
                    r.error, FOLLOW_LOST_S);
            f->lost_since = now_s();
        }
        done = now_s() - f->lost_since > FOLLOW_LOST_S;
    } else if (!o) {
        f->final_state[0] = '\0';
        done = true; /* refused or gone: follow_job says so */
        f->last_status = r.status;
    }
    free(r.body);
    if (o) {
        f->lost_since = 0;
        const char *st = str(o, "state");
        snprintf(f->final_state, sizeof(f->final_state), "%s", st);
        done = is_terminal(st);
        if (json_is_string(json_object_get(o, "failure_reason")))
            snprintf(f->failure, sizeof(f->failure), "%s", str(o, "failure_reason"));
        if (done && json_is_integer(json_object_get(json_object_get(o, "progress"), "step")))
            f->step = json_integer_value(json_object_get(json_object_get(o, "progress"), "step"));
        if (done) {
            double a = iso_seconds(json_string_value(json_object_get(o, "started_at")));
            double b = iso_seconds(json_string_value(json_object_get(o, "finished_at")));
            f->run_s = a > 0 && b >= a ? b - a : -1;
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
        if (is_terminal(st))
            return !job_finished(f); /* the summary says how it ended */
        bar_clear(f);
        if (json_object_get(d, "reason"))
            fprintf(stderr, "job %lld: %s (%s)\n", f->id, st, str(d, "reason"));
        else
            fprintf(stderr, "job %lld: %s\n", f->id, st);
        if (f->tty && f->step)
            bar_draw(f);
    } else if (!strcmp(kind, "metric") && f->metrics) {
        json_t *s = json_object_get(d, "step");
        if (!json_is_integer(s) || json_integer_value(json_object_get(d, "rank")) != 0)
            return true;
        if (json_is_number(json_object_get(d, "test_accuracy"))) {
            /* an evaluation of mge-train: a line of its own, above the progress line */
            f->test_acc = json_number_value(json_object_get(d, "test_accuracy"));
            f->have_acc = true;
            bar_clear(f);
            printf("eval step %lld epoch %lld: test accuracy %.2f%% test loss %.6f\n",
                   (long long)json_integer_value(s),
                   (long long)json_integer_value(json_object_get(d, "epoch")),
                   100.0 * f->test_acc, json_number_value(json_object_get(d, "test_loss")));
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
        f->step_t = iso_seconds(json_string_value(json_object_get(d, "time")));
        if (f->step_t < 0)
            f->step_t = now_s();
        if (f->rate_t == 0) {
            f->rate_step = f->step;
            f->rate_t = f->step_t;
        }
        progress_show(f);
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

/*
 * Follow job @id to its end; returns the exit code of its final state. The last line (stderr)
 * sums it up: "job 12 succeeded: step 1407/1407, loss 0.3124, test accuracy 86.66%, 1m23s",
 * or "job 12 failed: REASON".
 */
static int follow_job(long long id, bool logs, int rank, double every)
{
    struct follow f;
    char path[96], d[32];
    int ex = 0;
    json_t *o;
    memset(&f, 0, sizeof(f));
    f.id = id;
    f.tty = isatty(STDERR_FILENO) && isatty(STDOUT_FILENO);
    f.logs = logs;
    f.metrics = true;
    f.rank = rank;
    f.every = every;
    f.run_s = -1;
    snprintf(path, sizeof(path), "/api/v1/jobs/%lld", id);
    o = get_json("get", path, &ex);
    if (!o)
        return ex;
    f.total = json_integer_value(json_object_get(json_object_get(o, "progress"), "total_steps"));
    json_decref(o);
    snprintf(path, sizeof(path), "/api/v1/jobs/%lld/events", id);
    if (mgectl_stream(&g_c, path, on_follow_event, &f) != 0) {
        bar_clear(&f);
        fprintf(stderr, "mgectl: cannot follow job %lld: the server refused its event stream\n",
                id);
        return EX_REFUSED;
    }
    bar_clear(&f);
    if (!f.final_state[0] && f.last_status) {
        fprintf(stderr, "mgectl: lost job %lld: HTTP %ld from %s\n", id, f.last_status,
                g_c.server);
        return status_exit(f.last_status);
    }
    if (!f.final_state[0]) {
        fprintf(stderr, "mgectl: lost job %lld: %s did not answer for %.0f s\n", id, g_c.server,
                FOLLOW_LOST_S);
        return EX_UNREACHABLE;
    }
    if (!strcmp(f.final_state, "failed")) {
        fprintf(stderr, "job %lld failed: %s\n", id, f.failure[0] ? f.failure : "no reason given");
    } else {
        fprintf(stderr, "job %lld %s: step %lld/%lld", id, f.final_state, f.step, f.total);
        if (f.rate_t > 0)
            fprintf(stderr, ", loss %.4f", f.loss);
        if (f.have_acc)
            fprintf(stderr, ", test accuracy %.2f%%", 100.0 * f.test_acc);
        if (f.run_s >= 0)
            fprintf(stderr, ", ran %s", fmt_duration(d, sizeof(d), f.run_s));
        fputc('\n', stderr);
    }
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

/* The default of --every: $MGE_PROGRESS_EVERY, else 10 s. */
static double every_default(void)
{
    const char *e = getenv("MGE_PROGRESS_EVERY");
    char *end;
    double v = e && *e ? strtod(e, &end) : 10;
    return e && *e && (*end || v < 0) ? 10 : v;
}

/* Parse SECONDS of --every into @out; false when it is not a number >= 0. */
static bool parse_every(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (!*s || *end || v < 0 || v != v)
        return false;
    *out = v;
    return true;
}

static int cmd_submit(int argc, char **argv)
{
    const char *file = NULL;
    bool follow = false;
    double every = every_default();
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
        else if (!strcmp(argv[i], "--every") && i + 1 < argc) {
            if (!parse_every(argv[++i], &every))
                return bad_usage("submit", "--every takes seconds (a number >= 0)");
        } else if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            char *e = mgectl_escape(argv[++i]);
            if (!e || plen + strlen(e) + 8 >= sizeof(path)) {
                free(e);
                return bad_usage("submit", "--set values too long");
            }
            plen += (size_t)snprintf(path + plen, sizeof(path) - plen, "%cset=%s",
                                     strchr(path, '?') ? '&' : '?', e);
            free(e);
        } else if (!file && argv[i][0] != '-')
            file = argv[i];
        else if (strcmp(argv[i], "-") == 0 && !file)
            file = argv[i];
        else {
            fprintf(stderr, "mgectl submit: unexpected '%s' (see mgectl --help)\n", argv[i]);
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
    return follow ? follow_job(id, false, -1, every) : EX_OK;
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
            return bad_usage("list", "takes --state S and --limit N");
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
    if (!id || argc > 1)
        return bad_usage("get", "takes one job ID");
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
    double every = every_default();
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
        else if (!strcmp(argv[k], "--every") && k + 1 < argc) {
            if (!parse_every(argv[++k], &every))
                return bad_usage("logs", "--every takes seconds (a number >= 0)");
        } else if (!id)
            id = parse_id(argv[k]);
        else
            return bad_usage("logs", "takes one job ID");
    }
    if (!id)
        return bad_usage("logs", "which job ID?");
    if (follow)
        return follow_job(id, true, rank, every);
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

/*
 * A worker's "gpus" list as one column: "2x NVIDIA H100 80GB HBM3 (81559 MiB)", runs of alike
 * GPUs joined by ", "; "-" for none.
 */
static void gpus_column(json_t *list, char *buf, size_t len)
{
    size_t n = json_array_size(list), off = 0;
    snprintf(buf, len, "-");
    for (size_t i = 0; i < n && off < len;) {
        json_t *g = json_array_get(list, i);
        const char *name = str(g, "name");
        json_int_t mb = json_integer_value(json_object_get(g, "memory_mb"));
        size_t k = i + 1;
        int w;
        while (k < n && !strcmp(str(json_array_get(list, k), "name"), name) &&
               json_integer_value(json_object_get(json_array_get(list, k), "memory_mb")) == mb)
            k++;
        w = snprintf(buf + off, len - off, "%s%zux %s (%lld MiB)", off ? ", " : "", k - i, name,
                     (long long)mb);
        if (w < 0)
            break;
        off += (size_t)w;
        i = k;
    }
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
    printf("%-16s %-20s %-9s %9s %15s %6s %6s  %-20s  %s\n", "NAME", "ID", "STATE", "CPUS",
           "MEMORY_MB", "GPUS", "RANKS", "LAST_SEEN", "GPU_MODELS");
    json_array_foreach(json_object_get(o, "workers"), i, w)
    {
        json_t *s = json_object_get(w, "slots"), *f = json_object_get(w, "free");
        char cpus[32], mem[48], gpus[32], models[300];
        snprintf(cpus, sizeof(cpus), "%lld/%lld",
                 (long long)json_integer_value(json_object_get(f, "cpus")),
                 (long long)json_integer_value(json_object_get(s, "cpus")));
        snprintf(mem, sizeof(mem), "%lld/%lld",
                 (long long)json_integer_value(json_object_get(f, "memory_mb")),
                 (long long)json_integer_value(json_object_get(s, "memory_mb")));
        snprintf(gpus, sizeof(gpus), "%lld/%lld",
                 (long long)json_integer_value(json_object_get(f, "gpus")),
                 (long long)json_integer_value(json_object_get(s, "gpus")));
        gpus_column(json_object_get(w, "gpus"), models, sizeof(models));
        printf("%-16.16s %-20s %-9s %9s %15s %6s %6lld  %-20s  %s\n", str(w, "name"), str(w, "id"),
               str(w, "state"), cpus, mem, gpus,
               (long long)json_integer_value(json_object_get(w, "running_ranks")),
               str(w, "last_seen"), models);
    }
    json_decref(o);
    return EX_OK;
}

/* One screen of `mgectl top`: workers, then the live jobs (queued and running) with their
 * progress and why a queued one waits, then the last finished ones. */
static int top_screen(bool clear_screen, FILE *out)
{
    json_t *jobs, *workers, *j, *w;
    size_t i;
    int ex = 0, shown = 0;
    if (!(workers = get_json("top", "/api/v1/workers", &ex)))
        return ex;
    if (!(jobs = get_json("top", "/api/v1/jobs?limit=200", &ex))) {
        json_decref(workers);
        return ex;
    }
    if (clear_screen)
        fputs("\033[H\033[2J", out);
    fprintf(out, "%-16s %-9s %9s %13s %6s %6s\n", "WORKER", "STATE", "CPUS", "MEMORY_MB", "GPUS",
            "RANKS");
    json_array_foreach(json_object_get(workers, "workers"), i, w)
    {
        json_t *sl = json_object_get(w, "slots"), *f = json_object_get(w, "free");
        fprintf(out, "%-16.16s %-9s %4lld/%-4lld %6lld/%-6lld %2lld/%-3lld %6lld\n", str(w, "name"),
                str(w, "state"), (long long)json_integer_value(json_object_get(f, "cpus")),
                (long long)json_integer_value(json_object_get(sl, "cpus")),
                (long long)json_integer_value(json_object_get(f, "memory_mb")),
                (long long)json_integer_value(json_object_get(sl, "memory_mb")),
                (long long)json_integer_value(json_object_get(f, "gpus")),
                (long long)json_integer_value(json_object_get(sl, "gpus")),
                (long long)json_integer_value(json_object_get(w, "running_ranks")));
    }
    fprintf(out, "\n%-6s %-20s %-10s %4s %13s %10s %9s  %s\n", "JOB", "NAME", "STATE", "PRIO",
            "STEP", "LOSS", "SAMPLES/S", "WAITING FOR / ENDED");
    json_array_foreach(json_object_get(jobs, "jobs"), i, j)
    {
        const char *state = str(j, "state");
        bool live = !strcmp(state, "running") || !strcmp(state, "queued");
        char path[64], step[32] = "-", loss[32] = "-", sps[32] = "-";
        const char *why =
            json_is_string(json_object_get(j, "failure_reason")) ? str(j, "failure_reason") : "";
        json_t *d = NULL;
        if (!live && shown >= 10)
            continue; /* the live ones all, the last 10 others */
        if (live) {
            snprintf(path, sizeof(path), "/api/v1/jobs/%lld",
                     (long long)json_integer_value(json_object_get(j, "id")));
            d = get_json("top", path, &ex);
        }
        if (d) {
            json_t *pr = json_object_get(d, "progress"), *lm = json_object_get(d, "latest_metrics");
            snprintf(step, sizeof(step), "%lld/%lld",
                     (long long)json_integer_value(json_object_get(pr, "step")),
                     (long long)json_integer_value(json_object_get(pr, "total_steps")));
            if (json_object_get(lm, "loss"))
                snprintf(loss, sizeof(loss), "%.4g",
                         json_number_value(json_object_get(json_object_get(lm, "loss"), "value")));
            if (json_object_get(lm, "samples_per_sec"))
                snprintf(sps, sizeof(sps), "%.0f",
                         json_number_value(
                             json_object_get(json_object_get(lm, "samples_per_sec"), "value")));
            if (json_is_string(json_object_get(d, "pending_reason")))
                why = str(d, "pending_reason");
        }
        fprintf(out, "%-6lld %-20.20s %-10s %4lld %13s %10s %9s  %s\n",
                (long long)json_integer_value(json_object_get(j, "id")), str(j, "name"), state,
                (long long)json_integer_value(json_object_get(j, "priority")), step, loss, sps,
                why);
        json_decref(d);
        if (!live)
            shown++;
    }
    fflush(out);
    json_decref(jobs);
    json_decref(workers);
    return EX_OK;
}

/* mgectl top [--every S] [--once]: on a terminal the screen is redrawn every S seconds
 * (default 2) until Ctrl-C; otherwise (or with --once) one screen is printed. */
static int cmd_top(int argc, char **argv)
{
    double every = 2.0;
    bool once = !isatty(STDOUT_FILENO);
    for (int k = 0; k < argc; k++) {
        char *end;
        if (!strcmp(argv[k], "--once"))
            once = true;
        else if (!strcmp(argv[k], "--every") && k + 1 < argc &&
                 (every = strtod(argv[k + 1], &end)) >= 0.2 && !*end && every <= 3600)
            k++;
        else
            return bad_usage("top", "takes --every S (0.2 to 3600) and --once");
    }
    for (;;) {
        int ex = top_screen(!once, stdout);
        if (ex != EX_OK || once)
            return ex;
        usleep((useconds_t)(every * 1e6));
    }
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
            return bad_usage("metrics", "takes one job ID");
    }
    if (!id)
        return bad_usage("metrics", "which job ID?");
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
        return bad_usage("checkpoint", "the subcommand is download");
    for (int k = 1; k < argc; k++) {
        if (!strcmp(argv[k], "-o") && k + 1 < argc)
            out = argv[++k];
        else if (!strcmp(argv[k], "--name") && k + 1 < argc)
            name = argv[++k];
        else if (!id)
            id = parse_id(argv[k]);
        else
            return bad_usage("checkpoint download", "takes one job ID");
    }
    if (!id)
        return bad_usage("checkpoint download", "which job ID?");
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
        fprintf(stderr, "mgectl: checkpoint download: %s (HTTP %ld)\n",
                status == 0                      ? "cannot reach the server"
                : status == 404                  ? "no such checkpoint"
                : status == 401 || status == 403 ? "the token was refused"
                                                 : "failed",
                status);
        return status_exit(status);
    }
    printf("%s\n", out);
    return EX_OK;
}

int main(int argc, char **argv)
{
    struct mgectl_flags fl = {0};
    char *rest[256];
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--server") && i + 1 < argc)
            fl.server = argv[++i];
        else if (!strcmp(argv[i], "--token") && i + 1 < argc)
            fl.token = argv[++i];
        else if (!strcmp(argv[i], "--token-file") && i + 1 < argc)
            fl.token_file = argv[++i];
        else if (!strcmp(argv[i], "--cacert") && i + 1 < argc)
            fl.cacert = argv[++i];
        else if (!strcmp(argv[i], "-o") && i + 1 < argc && n > 0 && strcmp(rest[0], "checkpoint"))
            g_output = argv[++i];
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return EX_OK;
        } else if (n < 256)
            rest[n++] = argv[i];
        else
            return bad_usage(rest[0], "too many arguments");
    }
    if (n == 0) {
        usage(stderr);
        return EX_USAGE;
    }
    if (!strcmp(rest[0], "workers") && n > 1)
        return bad_usage("workers", "takes no arguments");
    if (g_output && strcmp(g_output, "json") && strcmp(g_output, "yaml") &&
        strcmp(g_output, "table")) {
        fprintf(stderr, "mgectl: -o is json, yaml or table\n");
        return EX_USAGE;
    }
    if (!strcmp(rest[0], "version")) {
        printf("mgectl %s\n", MGECTL_VERSION);
        return EX_OK;
    }
    if (!strcmp(rest[0], "completion")) {
        if (n != 2 || mgectl_completion_print(rest[1], stdout) != 0)
            return bad_usage("completion", "takes bash or zsh");
        return EX_OK;
    }
    if (mgectl_config(&g_c, &fl) != 0)
        return EX_USAGE;
    if (!strcmp(rest[0], "submit"))
        return cmd_submit(n - 1, rest + 1);
    if (!strcmp(rest[0], "list"))
        return cmd_list(n - 1, rest + 1);
    if (!strcmp(rest[0], "get"))
        return cmd_get(n - 1, rest + 1);
    if (!strcmp(rest[0], "logs"))
        return cmd_logs(n - 1, rest + 1);
    if (!strcmp(rest[0], "cancel") && !(n == 2 && parse_id(rest[1])))
        return bad_usage("cancel", "takes one job ID");
    if ((!strcmp(rest[0], "drain") || !strcmp(rest[0], "undrain")) && n != 2)
        return bad_usage(rest[0], "takes one worker name or ID");
    if (!strcmp(rest[0], "cancel")) {
        char path[64], msg[64];
        snprintf(path, sizeof(path), "/api/v1/jobs/%lld/cancel", parse_id(rest[1]));
        snprintf(msg, sizeof(msg), "job %lld cancelled", parse_id(rest[1]));
        return cmd_post("cancel", path, msg);
    }
    if (!strcmp(rest[0], "drain") || !strcmp(rest[0], "undrain")) {
        char path[256], msg[300];
        char *e = mgectl_escape(rest[1]);
        bool on = !strcmp(rest[0], "drain");
        int ex;
        snprintf(path, sizeof(path), "/api/v1/workers/%s/%s", e ? e : "", rest[0]);
        snprintf(msg, sizeof(msg), "worker %.200s %s", rest[1],
                 on ? "draining" : "undrained: it takes new ranks again");
        ex = cmd_post(rest[0], path, msg);
        free(e);
        return ex;
    }
    if (!strcmp(rest[0], "workers"))
        return cmd_workers();
    if (!strcmp(rest[0], "top"))
        return cmd_top(n - 1, rest + 1);
    if (!strcmp(rest[0], "metrics"))
        return cmd_metrics(n - 1, rest + 1);
    if (!strcmp(rest[0], "checkpoint"))
        return cmd_checkpoint(n - 1, rest + 1);
    fprintf(stderr, "mgectl: unknown command '%s' (see mgectl --help)\n", rest[0]);
    return EX_USAGE;
}
