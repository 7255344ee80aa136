/*
 * url.h: the URL handling the daemons share: the host of an NNG address, and the local
 * address this host reaches it from.
 */
#ifndef MGE_COMMON_URL_H
#define MGE_COMMON_URL_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Copy the host of "SCHEME://HOST:PORT" (or "SCHEME://HOST") into @buf of @len bytes. @buf is
 * left as it was when @url has no "://", an empty host, or a host longer than @len - 1, so
 * callers fill it with their default first. Thread: any.
 */
void mge_url_host(const char *url, char *buf, size_t len);

/*
 * The local address this host sends from to reach the host of @url ("SCHEME://HOST:PORT";
 * HOST a name, an IPv4 address or "[IPv6]"): the source address of the route the kernel picks
 * for it (a UDP connect(): nothing is sent). Into @addr of @len bytes as an NNG URL host
 * ("10.0.0.2", "[fd00::2]"), loopback included ("127.0.0.1" for a HOST on this machine's lo).
 * Returns MGE_OK; MGE_INVAL (logged) when @url has no host; MGE_NET (logged) when HOST does not
 * resolve or no route reaches it; @addr is unchanged on error. Thread: any (may block on DNS).
 */
int mge_url_route_source(const char *url, char *addr, size_t len);

/* Whether @host (as mge_url_route_source() writes it) is a loopback address. */
bool mge_url_host_is_loopback(const char *host);

#endif
