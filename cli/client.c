/* client.c: libcurl requests, configuration lookup and SSE following for mgectl. */
#include "client.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

void mgectl_config(struct mgectl *c, const char *server, const char *token)
{
    const char *home = getenv("HOME");
    char path[1024], line[1024];
    FILE *f;
    snprintf(c->server, sizeof(c->server), "http://127.0.0.1:8080");
    c->token[0] = '\0';
    if (home) {
        snprintf(path, sizeof(path), "%s/.config/mge/config", home);
        f = fopen(path, "r");
        while (f && fgets(line, sizeof(line), f)) {
            char *eq = strchr(line, '=');
            char key[64];
            if (line[0] == '#' || !eq)
                continue;
            *eq = '\0';
            copy_trim(key, sizeof(key), line);
            if (!strcmp(key, "server"))
                copy_trim(c->server, sizeof(c->server), eq + 1);
            else if (!strcmp(key, "token"))
                copy_trim(c->token, sizeof(c->token), eq + 1);
        }
        if (f)
            fclose(f);
    }
    if (getenv("MGE_SERVER") && *getenv("MGE_SERVER"))
        copy_trim(c->server, sizeof(c->server), getenv("MGE_SERVER"));
    if (getenv("MGE_TOKEN") && *getenv("MGE_TOKEN"))
        copy_trim(c->token, sizeof(c->token), getenv("MGE_TOKEN"));
    if (server)
        copy_trim(c->server, sizeof(c->server), server);
    if (token)
        copy_trim(c->token, sizeof(c->token), token);
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

int mgectl_request(const struct mgectl *c, const char *method, const char *path, const char *ctype,
                   const char *body, size_t len, struct mgectl_resp *r)
{
    CURL *cu = curl_easy_init();
    struct curl_slist *h;
    struct buf b = {0};
    char url[2048];
    CURLcode cc;
    memset(r, 0, sizeof(*r));
    if (!cu)
        return -1;
    snprintf(url, sizeof(url), "%s%s", c->server, path);
    h = headers(c, ctype, NULL);
    curl_easy_setopt(cu, CURLOPT_URL, url);
    curl_easy_setopt(cu, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(cu, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(cu, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(cu, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(cu, CURLOPT_TIMEOUT, 60L);
    if (!strcmp(method, "POST")) {
        curl_easy_setopt(cu, CURLOPT_POST, 1L);
        curl_easy_setopt(cu, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(cu, CURLOPT_POSTFIELDSIZE, (long)(body ? len : 0));
    }
    cc = curl_easy_perform(cu);
    if (cc == CURLE_OK)
        curl_easy_getinfo(cu, CURLINFO_RESPONSE_CODE, &r->status);
    else
        snprintf(r->error, sizeof(r->error), "%s", curl_easy_strerror(cc));
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
    curl_easy_setopt(cu, CURLOPT_URL, url);
    curl_easy_setopt(cu, CURLOPT_HTTPHEADER, h);
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
        curl_easy_setopt(cu, CURLOPT_URL, url);
        curl_easy_setopt(cu, CURLOPT_HTTPHEADER, h);
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
