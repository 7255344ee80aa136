/*
 * client.h: mgectl's REST client on libcurl: where the server is and which token to send
 * (flags, then $MGE_SERVER/$MGE_TOKEN, then ~/.config/mge/config), plain requests, and
 * server-sent event streams that resume with Last-Event-ID after a dropped connection.
 */
#ifndef MGE_CLI_CLIENT_H
#define MGE_CLI_CLIENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct mgectl {
    char server[512];  /* "http://127.0.0.1:8080", no trailing slash */
    char token[512];   /* "" for none */
    char cacert[1024]; /* CA bundle for https; "" for the system's */
};

/* What the command line said (each may be NULL). */
struct mgectl_flags {
    const char *server, *token, *token_file, *cacert;
};

/*
 * Fill @c. Each setting comes from the flags, else the environment (MGE_SERVER, MGE_TOKEN,
 * MGE_TOKEN_FILE, MGE_CACERT), else the config file: $MGE_CONFIG, else
 * $XDG_CONFIG_HOME/mge/config.yaml, else ~/.config/mge/config.yaml (keys server, token_file,
 * cacert; a missing default file is fine). A relative token_file or cacert in the file is
 * relative to the file's directory. Returns 0, or -1 after printing to stderr what is wrong
 * (the file, the key and its line; an unreadable token file or CA file).
 */
int mgectl_config(struct mgectl *c, const struct mgectl_flags *fl);

struct mgectl_resp {
    long status; /* HTTP status; 0 when the server could not be reached */
    char *body;  /* NUL-terminated, malloc'ed (free) */
    size_t len;
    char error[256]; /* transport error text when status is 0 */
};

/*
 * @method "GET"/"POST"; @path "/api/v1/jobs?x=y"; @ctype/@body may be NULL.
 * Fills @r (caller frees r->body). Returns 0 when a response came, -1 otherwise.
 */
int mgectl_request(const struct mgectl *c, const char *method, const char *path, const char *ctype,
                   const char *body, size_t len, struct mgectl_resp *r);

/* GET @path into file @out (binary). Returns the HTTP status, or 0 on a transport error. */
long mgectl_download(const struct mgectl *c, const char *path, const char *out);

/*
 * Follow an SSE stream; @on_event gets (kind, id, data) per event and returns false to stop.
 * Reconnects with Last-Event-ID when the stream drops. Returns 0 when stopped by the
 * callback, -1 when the server refuses the stream (4xx).
 */
int mgectl_stream(const struct mgectl *c, const char *path,
                  bool (*on_event)(void *arg, const char *kind, int64_t id, json_t *data),
                  void *arg);

/* URL-encode @s into a new malloc'ed string. */
char *mgectl_escape(const char *s);

#endif
