/* client.c: libcurl requests, configuration (flags, environment, config.yaml) and SSE following for
 * mgectl. */
#include "client.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <yaml.h>

static void copy_trim(char *dst, size_t n, const char *s)
{
    const char *e;
    while (*s == ' ' || *s == '\t')
        s++;
    e = s + strlen(s);
    while (e > s && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t'))
        e--;
    snprintf(dst, n, "%.*s", (int)(e - s), s);
}

/* ---- configuration: flags, then the environment, then config.yaml ---- */

/* One setting of the config file: its value and the line it was on (0: not in the file). */
struct cfg_value {
    char v[1024];
    int line;
};

struct cfg_file {
    char path[1024];
    char dir[1024]; /* the file's directory: relative paths in it start there */
    struct cfg_value server, token_file, cacert;
};

/* The config file's path into @path; false when there is none to look for. */
static bool cfg_path(char *path, size_t n, bool *explicit_)
{
    const char *e = getenv("MGE_CONFIG"), *x = getenv("XDG_CONFIG_HOME"), *h = getenv("HOME");
    *explicit_ = e && *e;
    if (*explicit_)
        snprintf(path, n, "%s", e);
    else if (x && *x == '/')
        snprintf(path, n, "%s/mge/config.yaml", x);
    else if (h && *h)
        snprintf(path, n, "%s/.config/mge/config.yaml", h);
    else
        return false;
    return true;
}

/*
 * Parse the YAML mapping in @f (a file open for reading) into @cf. Returns 0, or -1 after
 * printing "mgectl: FILE:LINE: ..." to stderr.
 */
static int cfg_parse(FILE *f, struct cfg_file *cf)
{
    yaml_parser_t p;
    yaml_document_t doc;
    yaml_node_t *root;
    yaml_node_pair_t *pair;
    int rc = -1;
    if (!yaml_parser_initialize(&p)) {
        fprintf(stderr, "mgectl: %s: out of memory\n", cf->path);
        return -1;
    }
    yaml_parser_set_input_file(&p, f);
    if (!yaml_parser_load(&p, &doc)) {
        fprintf(stderr, "mgectl: %s:%zu: not YAML: %s\n", cf->path, p.problem_mark.line + 1,
                p.problem ? p.problem : "parse error");
        goto out_parser;
    }
    root = yaml_document_get_root_node(&doc);
    if (!root) { /* an empty file */
        rc = 0;
        goto out_doc;
    }
    if (root->type != YAML_MAPPING_NODE) {
        fprintf(stderr, "mgectl: %s:%zu: expected a mapping of server, token_file, cacert\n",
                cf->path, root->start_mark.line + 1);
        goto out_doc;
    }
    for (pair = root->data.mapping.pairs.start; pair < root->data.mapping.pairs.top; pair++) {
        yaml_node_t *k = yaml_document_get_node(&doc, pair->key);
        yaml_node_t *v = yaml_document_get_node(&doc, pair->value);
        int line = (int)k->start_mark.line + 1;
        const char *key = k->type == YAML_SCALAR_NODE ? (const char *)k->data.scalar.value : "?";
        struct cfg_value *dst = !strcmp(key, "server")       ? &cf->server
                                : !strcmp(key, "token_file") ? &cf->token_file
                                : !strcmp(key, "cacert")     ? &cf->cacert
                                                             : NULL;
        if (!dst) {
            fprintf(stderr, "mgectl: %s:%d: unknown key '%s' (known: server, token_file, cacert)\n",
                    cf->path, line, key);
            goto out_doc;
        }
        if (dst->line) {
            fprintf(stderr, "mgectl: %s:%d: key '%s' given twice (first on line %d)\n", cf->path,
                    line, key, dst->line);
            goto out_doc;
        }
        if (v->type != YAML_SCALAR_NODE || v->data.scalar.length == 0 ||
            v->data.scalar.length >= sizeof(dst->v)) {
            fprintf(stderr, "mgectl: %s:%d: key '%s': expected a non-empty string\n", cf->path,
                    (int)v->start_mark.line + 1, key);
            goto out_doc;
        }
        memcpy(dst->v, v->data.scalar.value, v->data.scalar.length + 1);
        dst->line = line;
    }
    rc = 0;
out_doc:
    yaml_document_delete(&doc);
out_parser:
    yaml_parser_delete(&p);
    return rc;
}

/* Load the config file into @cf (all empty when there is none). Returns 0 or -1 (printed). */
static int cfg_load(struct cfg_file *cf)
{
    bool explicit_;
    FILE *f;
    char *slash;
    int rc;
    memset(cf, 0, sizeof(*cf));
    if (!cfg_path(cf->path, sizeof(cf->path), &explicit_))
        return 0;
    f = fopen(cf->path, "r");
    if (!f) {
        if (!explicit_ && errno == ENOENT) {
            const char *home = getenv("HOME");
            char old[1024];
            /* the key = value file of earlier versions: say why it is ignored */
            if (home && snprintf(old, sizeof(old), "%s/.config/mge/config", home) > 0 &&
                access(old, F_OK) == 0)
                fprintf(stderr,
                        "mgectl: note: '%s' is no longer read; write '%s' (server:, "
                        "token_file:, cacert:)\n",
                        old, cf->path);
            return 0;
        }
        fprintf(stderr, "mgectl: cannot read config file '%s': %s\n", cf->path, strerror(errno));
        return -1;
    }
    snprintf(cf->dir, sizeof(cf->dir), "%s", cf->path);
    slash = strrchr(cf->dir, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(cf->dir, sizeof(cf->dir), ".");
    rc = cfg_parse(f, cf);
    fclose(f);
    return rc;
}

/*
 * @v of the config file as a path into @out: "~/x" from $HOME, "x" from the file's directory.
 * Returns 0, or -1 (printed) when it does not fit.
 */
static int cfg_file_path(const struct cfg_file *cf, const char *key, const struct cfg_value *v,
                         char *out, size_t n)
{
    const char *home = getenv("HOME");
    int k;
    if (v->v[0] == '~' && v->v[1] == '/' && home)
        k = snprintf(out, n, "%s%s", home, v->v + 1);
    else if (v->v[0] != '/')
        k = snprintf(out, n, "%s/%s", cf->dir, v->v);
    else
        k = snprintf(out, n, "%s", v->v);
    if (k < 0 || (size_t)k >= n) {
        fprintf(stderr, "mgectl: %s:%d: key '%s': path too long\n", cf->path, v->line, key);
        return -1;
    }
    return 0;
}

/*
 * The token in file @path (its first line, trimmed) into @c->token; @from says where the
 * path came from, for the error. Returns 0 or -1 (printed).
 */
static int token_read(struct mgectl *c, const char *path, const char *from)
{
    char line[600] = "";
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "mgectl: cannot read token file '%s' (%s): %s\n", path, from,
                strerror(errno));
        return -1;
    }
    if (!fgets(line, sizeof(line), f))
        line[0] = '\0';
    fclose(f);
    copy_trim(c->token, sizeof(c->token), line);
    if (!c->token[0]) {
        fprintf(stderr, "mgectl: token file '%s' (%s) is empty\n", path, from);
        return -1;
    }
    return 0;
}

/* A CA file must be readable now: a clear error beats curl's later one. */
static int cacert_check(const char *path, const char *from)
{
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "mgectl: cannot read CA file '%s' (%s): %s\n", path, from, strerror(errno));
        return -1;
    }
    return 0;
}

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

int mgectl_config(struct mgectl *c, const struct mgectl_flags *fl)
{
    struct cfg_file cf;
    char path[1024], from[1200];
    memset(c, 0, sizeof(*c));
    snprintf(c->server, sizeof(c->server), "http://127.0.0.1:8080");
    if (cfg_load(&cf) != 0)
        return -1;
    /* server */
    if (fl->server)
        copy_trim(c->server, sizeof(c->server), fl->server);
    else if (env("MGE_SERVER"))
        copy_trim(c->server, sizeof(c->server), env("MGE_SERVER"));
    else if (cf.server.line)
        copy_trim(c->server, sizeof(c->server), cf.server.v);
    /* token */
    if (fl->token)
        copy_trim(c->token, sizeof(c->token), fl->token);
    else if (fl->token_file) {
        if (token_read(c, fl->token_file, "--token-file") != 0)
            return -1;
    } else if (env("MGE_TOKEN"))
        copy_trim(c->token, sizeof(c->token), env("MGE_TOKEN"));
    else if (env("MGE_TOKEN_FILE")) {
        if (token_read(c, env("MGE_TOKEN_FILE"), "MGE_TOKEN_FILE") != 0)
            return -1;
    } else if (cf.token_file.line) {
        if (cfg_file_path(&cf, "token_file", &cf.token_file, path, sizeof(path)) != 0)
            return -1;
        snprintf(from, sizeof(from), "%s:%d, key 'token_file'", cf.path, cf.token_file.line);
        if (token_read(c, path, from) != 0)
            return -1;
    }
    /* cacert */
    if (fl->cacert || env("MGE_CACERT")) {
        const char *v = fl->cacert ? fl->cacert : env("MGE_CACERT");
        snprintf(c->cacert, sizeof(c->cacert), "%s", v);
        if (cacert_check(c->cacert, fl->cacert ? "--cacert" : "MGE_CACERT") != 0)
            return -1;
    } else if (cf.cacert.line) {
        if (cfg_file_path(&cf, "cacert", &cf.cacert, c->cacert, sizeof(c->cacert)) != 0)
            return -1;
        snprintf(from, sizeof(from), "%s:%d, key 'cacert'", cf.path, cf.cacert.line);
        if (cacert_check(c->cacert, from) != 0)
            return -1;
    }
    if (!strstr(c->server, "://")) {
        char tmp[512];
        snprintf(tmp, sizeof(tmp), "%s", c->server);
        snprintf(c->server, sizeof(c->server), "http://%.480s", tmp);
    }
    {
        size_t n = strlen(c->server);
        while (n && c->server[n - 1] == '/')
            c->server[--n] = '\0';
    }
    return 0;
}

char *mgectl_escape(const char *s)
{
    char *e = curl_easy_escape(NULL, s, 0);
    char *r = e ? strdup(e) : NULL;
    curl_free(e);
    return r;
}

struct buf {
    char *p;
    size_t len, cap;
};

static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
    struct buf *b = arg;
    size_t add = size * n;
    if (b->len + add + 1 > b->cap) {
        size_t nc = (b->len + add + 1) * 2;
        char *np = realloc(b->p, nc);
        if (!np)
            return 0;
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, data, add);
    b->len += add;
    b->p[b->len] = '\0';
    return add;
}

static struct curl_slist *headers(const struct mgectl *c, const char *ctype, const char *last_id)
{
    struct curl_slist *h = NULL;
    char line[700];
    if (c->token[0]) {
        snprintf(line, sizeof(line), "Authorization: Bearer %s", c->token);
        h = curl_slist_append(h, line);
    }
    if (ctype) {
        snprintf(line, sizeof(line), "Content-Type: %s", ctype);
        h = curl_slist_append(h, line);
    }
    if (last_id) {
        snprintf(line, sizeof(line), "Last-Event-ID: %s", last_id);
        h = curl_slist_append(h, line);
    }
    h = curl_slist_append(h, "Expect:");
    return h;
}

/* The options every transfer of @c shares: URL, headers, CA. */
static void transfer_setup(CURL *cu, const struct mgectl *c, const char *url, struct curl_slist *h)
{
    curl_easy_setopt(cu, CURLOPT_URL, url);
    curl_easy_setopt(cu, CURLOPT_HTTPHEADER, h);
    if (c->cacert[0])
        curl_easy_setopt(cu, CURLOPT_CAINFO, c->cacert);
}

/*
 * The text of failed transfer @cc into @out: libcurl's detail (@detail, its error buffer) and,
 * when the server's certificate did not verify, where the CA comes from.
 */
static void transfer_error(const struct mgectl *c, CURLcode cc, const char *detail, char *out,
                           size_t n)
{
    bool tls = cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE;
    snprintf(out, n, "%s%s", detail[0] ? detail : curl_easy_strerror(cc),
             !tls           ? ""
             : c->cacert[0] ? " (TLS: the server's certificate does not verify with the CA "
                              "given by --cacert / MGE_CACERT / cacert:)"
                            : " (TLS: the server's certificate does not verify against the "
                              "system's CAs; give its CA with --cacert FILE, MGE_CACERT or "
                              "cacert: in config.yaml)");
}

int mgectl_request(const struct mgectl *c, const char *method, const char *path, const char *ctype,
                   const char *body, size_t len, struct mgectl_resp *r)
{
    CURL *cu = curl_easy_init();
    struct curl_slist *h;
    struct buf b = {0};
    char url[2048], detail[CURL_ERROR_SIZE] = "";
    CURLcode cc;
    memset(r, 0, sizeof(*r));
    if (!cu)
        return -1;
    snprintf(url, sizeof(url), "%s%s", c->server, path);
    h = headers(c, ctype, NULL);
    transfer_setup(cu, c, url, h);
    curl_easy_setopt(cu, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(cu, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(cu, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(cu, CURLOPT_TIMEOUT, 60L);
    if (!strcmp(method, "POST")) {
        curl_easy_setopt(cu, CURLOPT_POST, 1L);
        curl_easy_setopt(cu, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(cu, CURLOPT_POSTFIELDSIZE, (long)(body ? len : 0));
    }
    curl_easy_setopt(cu, CURLOPT_ERRORBUFFER, detail);
    cc = curl_easy_perform(cu);
    if (cc == CURLE_OK)
        curl_easy_getinfo(cu, CURLINFO_RESPONSE_CODE, &r->status);
    else
        transfer_error(c, cc, detail, r->error, sizeof(r->error));
    curl_slist_free_all(h);
    curl_easy_cleanup(cu);
    r->body = b.p ? b.p : strdup("");
    r->len = b.len;
    return cc == CURLE_OK ? 0 : -1;
}

static size_t on_file(char *data, size_t size, size_t n, void *arg)
{
    return fwrite(data, size, n, arg) * size;
}

long mgectl_download(const struct mgectl *c, const char *path, const char *out)
{
    CURL *cu = curl_easy_init();
    struct curl_slist *h;
    char url[2048], tmp[1100];
    long status = 0;
    FILE *f;
    snprintf(tmp, sizeof(tmp), "%s.part", out);
    f = fopen(tmp, "wb");
    if (!cu || !f) {
        if (f)
            fclose(f);
        curl_easy_cleanup(cu);
        return 0;
    }
    snprintf(url, sizeof(url), "%s%s", c->server, path);
    h = headers(c, NULL, NULL);
    transfer_setup(cu, c, url, h);
    curl_easy_setopt(cu, CURLOPT_WRITEFUNCTION, on_file);
    curl_easy_setopt(cu, CURLOPT_WRITEDATA, f);
    if (curl_easy_perform(cu) == CURLE_OK)
        curl_easy_getinfo(cu, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    curl_easy_cleanup(cu);
    if (fclose(f) != 0)
        status = 0;
    if (status == 200)
        rename(tmp, out);
    else
        unlink(tmp);
    return status;
}

struct sse_state {
    struct buf b;
    char last_id[32];
    bool stop;
    bool (*on_event)(void *, const char *, int64_t, json_t *);
    void *arg;
};

static void sse_dispatch(struct sse_state *s, char *ev)
{
    char kind[64] = "message";
    char *data = NULL, *line, *save = NULL;
    int64_t id = 0;
    for (line = strtok_r(ev, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(line, "id: ", 4)) {
            id = strtoll(line + 4, NULL, 10);
            snprintf(s->last_id, sizeof(s->last_id), "%s", line + 4);
        } else if (!strncmp(line, "event: ", 7)) {
            snprintf(kind, sizeof(kind), "%s", line + 7);
        } else if (!strncmp(line, "data: ", 6)) {
            data = line + 6;
        }
    }
    if (data && !s->stop) {
        json_t *d = json_loads(data, 0, NULL);
        if (d && !s->on_event(s->arg, kind, id, d))
            s->stop = true;
        json_decref(d);
    }
}

static size_t on_sse(char *data, size_t size, size_t n, void *arg)
{
    struct sse_state *s = arg;
    char *end;
    if (on_body(data, size, n, &s->b) != size * n)
        return 0;
    while (s->b.p && (end = strstr(s->b.p, "\n\n"))) {
        size_t used = (size_t)(end - s->b.p) + 2;
        *end = '\0';
        sse_dispatch(s, s->b.p);
        memmove(s->b.p, s->b.p + used, s->b.len - used + 1);
        s->b.len -= used;
    }
    return s->stop ? 0 : size * n; /* 0 aborts the transfer */
}

int mgectl_stream(const struct mgectl *c, const char *path,
                  bool (*on_event)(void *arg, const char *kind, int64_t id, json_t *data),
                  void *arg)
{
    struct sse_state s;
    char url[2048];
    memset(&s, 0, sizeof(s));
    s.on_event = on_event;
    s.arg = arg;
    snprintf(url, sizeof(url), "%s%s", c->server, path);
    while (!s.stop) {
        CURL *cu = curl_easy_init();
        struct curl_slist *h = headers(c, NULL, s.last_id[0] ? s.last_id : NULL);
        long status = 0;
        transfer_setup(cu, c, url, h);
        curl_easy_setopt(cu, CURLOPT_WRITEFUNCTION, on_sse);
        curl_easy_setopt(cu, CURLOPT_WRITEDATA, &s);
        curl_easy_setopt(cu, CURLOPT_CONNECTTIMEOUT, 5L);
        /* no event or keepalive for this long: the server is gone, reconnect */
        curl_easy_setopt(cu, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(cu, CURLOPT_LOW_SPEED_TIME, 40L);
        curl_easy_perform(cu);
        curl_easy_getinfo(cu, CURLINFO_RESPONSE_CODE, &status);
        curl_slist_free_all(h);
        curl_easy_cleanup(cu);
        if (s.stop)
            break;
        if (status >= 400 && status < 500) {
            free(s.b.p);
            return -1;
        }
        s.b.len = 0;
        if (s.b.p)
            s.b.p[0] = '\0';
        /* the stream ended: the job is over (the caller's callback decides) or we retry */
        if (!on_event(arg, "_reconnect", 0, NULL))
            break;
        sleep(1);
    }
    free(s.b.p);
    return 0;
}
