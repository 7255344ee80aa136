/*
 * url.h: the one piece of URL handling the daemons share: the host of an NNG address.
 */
#ifndef MGE_COMMON_URL_H
#define MGE_COMMON_URL_H

#include <stddef.h>

/*
 * Copy the host of "SCHEME://HOST:PORT" (or "SCHEME://HOST") into @buf of @len bytes. @buf is
 * left as it was when @url has no "://", an empty host, or a host longer than @len - 1, so
 * callers fill it with their default first. Thread: any.
 */
void mge_url_host(const char *url, char *buf, size_t len);

#endif
