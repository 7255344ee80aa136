/*
 * auth.h: bearer tokens of mge-coordinator. The token file has one token per line:
 * "admin TOKEN" or "read TOKEN" (a line with only a token is an admin token); '#' starts a
 * comment. Tokens are compared in constant time (mge_ct_equal, common/crypto.h).
 * Thread: load once, then read-only from any thread.
 */
#ifndef MGE_COORDINATOR_AUTH_H
#define MGE_COORDINATOR_AUTH_H

#include <stdbool.h>
#include <stddef.h>

enum mge_role { MGE_ROLE_NONE, MGE_ROLE_READ, MGE_ROLE_ADMIN };

struct mge_auth;

/* Load @path. On MGE_OK the caller frees *@out with mge_auth_free(). MGE_NOENT, MGE_FORMAT
 * (no admin token). */
int mge_auth_load(const char *path, struct mge_auth **out);
void mge_auth_free(struct mge_auth *a);

/* Role of the token @tok (@len bytes): MGE_ROLE_NONE when unknown. */
enum mge_role mge_auth_check(const struct mge_auth *a, const char *tok, size_t len);

/* Read the first non-empty line of @path (a join token) into a new string; caller mge_free()s. */
int mge_auth_read_secret(const char *path, char **out);

#endif
