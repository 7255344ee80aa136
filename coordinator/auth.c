/* auth.c: token file loading and constant-time token checks (see auth.h). */
#include "auth.h"

#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/crypto.h"
#include "common/err.h"

#define MGE_AUTH_MAX_TOKENS 64

struct mge_auth {
    char *tok[MGE_AUTH_MAX_TOKENS];
    enum mge_role role[MGE_AUTH_MAX_TOKENS];
    int n;
};

static char *trim(char *s)
{
    char *e;
    while (*s == ' ' || *s == '\t')
        s++;
    e = s + strlen(s);
    while (e > s && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t'))
        *--e = '\0';
    return s;
}

int mge_auth_load(const char *path, struct mge_auth **out)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    struct mge_auth *a;
    bool admin = false;
    *out = NULL;
    if (!f)
        return MGE_ERR(MGE_NOENT, "cannot open token file '%s'", path);
    a = mge_calloc(1, sizeof(*a));
    if (!a) {
        fclose(f);
        return MGE_NOMEM;
    }
    while (fgets(line, sizeof(line), f) && a->n < MGE_AUTH_MAX_TOKENS) {
        char *s = trim(line), *sp;
        enum mge_role role = MGE_ROLE_ADMIN;
        if (!*s || *s == '#')
            continue;
        sp = strpbrk(s, " \t");
        if (sp) {
            *sp = '\0';
            if (!strcmp(s, "read"))
                role = MGE_ROLE_READ;
            else if (strcmp(s, "admin") != 0)
                continue;
            s = trim(sp + 1);
        }
        if (!*s)
            continue;
        a->tok[a->n] = mge_strdup(s);
        a->role[a->n] = role;
        admin |= role == MGE_ROLE_ADMIN;
        a->n++;
    }
    fclose(f);
    if (!admin) {
        mge_auth_free(a);
        return MGE_ERR(MGE_FORMAT, "token file '%s' has no admin token", path);
    }
    *out = a;
    return MGE_OK;
}

void mge_auth_free(struct mge_auth *a)
{
    if (!a)
        return;
    for (int i = 0; i < a->n; i++)
        mge_free(a->tok[i]);
    mge_free(a);
}

enum mge_role mge_auth_check(const struct mge_auth *a, const char *tok, size_t len)
{
    enum mge_role role = MGE_ROLE_NONE;
    /* every token is compared, so the time does not say which one matched */
    for (int i = 0; i < a->n; i++)
        if (a->tok[i] && mge_ct_equal(a->tok[i], strlen(a->tok[i]), tok, len) && a->role[i] > role)
            role = a->role[i];
    return role;
}

int mge_auth_read_secret(const char *path, char **out)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    *out = NULL;
    if (!f)
        return MGE_ERR(MGE_NOENT, "cannot open '%s'", path);
    while (fgets(line, sizeof(line), f)) {
        char *s = trim(line);
        if (*s && *s != '#') {
            fclose(f);
            *out = mge_strdup(s);
            return *out ? MGE_OK : MGE_NOMEM;
        }
    }
    fclose(f);
    return MGE_ERR(MGE_FORMAT, "'%s' holds no token", path);
}
