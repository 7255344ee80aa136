/* url.c: see url.h. */
#include "url.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "err.h"

void mge_url_host(const char *url, char *buf, size_t len)
{
    const char *p = url ? strstr(url, "://") : NULL, *colon;
    size_t n;
    if (!p)
        return;
    p += 3;
    colon = strrchr(p, ':');
    n = colon ? (size_t)(colon - p) : strlen(p);
    if (n == 0 || n >= len)
        return;
    memcpy(buf, p, n);
    buf[n] = '\0';
}

int mge_url_route_source(const char *url, char *addr, size_t len)
{
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *ai = NULL;
    struct sockaddr_storage local;
    socklen_t local_len = sizeof(local);
    char host[256] = "", ip[INET6_ADDRSTRLEN] = "";
    const void *bin;
    size_t n;
    int fd = -1, rc, gai;

    mge_url_host(url, host, sizeof(host));
    n = strlen(host);
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']') {
        memmove(host, host + 1, n - 2);
        host[n - 2] = '\0';
    }
    if (!host[0])
        return MGE_ERR(MGE_INVAL, "'%s' has no host", url ? url : "(null)");
    if ((gai = getaddrinfo(host, "9", &hints, &ai)) != 0)
        return MGE_ERR(MGE_NET, "host '%s' does not resolve: %s", host, gai_strerror(gai));
    fd = socket(ai->ai_family, SOCK_DGRAM, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
        getsockname(fd, (struct sockaddr *)&local, &local_len) != 0) {
        rc = MGE_ERR(MGE_NET, "no route to host '%s'", host);
        goto out_close;
    }
    bin = local.ss_family == AF_INET6
              ? (const void *)&((const struct sockaddr_in6 *)&local)->sin6_addr
              : (const void *)&((const struct sockaddr_in *)&local)->sin_addr;
    if (!inet_ntop(local.ss_family, bin, ip, sizeof(ip)) ||
        (size_t)snprintf(addr, len, local.ss_family == AF_INET6 ? "[%s]" : "%s", ip) >= len) {
        rc = MGE_ERR(MGE_INVAL, "the route's source address does not fit %zu bytes", len);
        goto out_close;
    }
    rc = MGE_OK;
out_close:
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return rc;
}

bool mge_url_host_is_loopback(const char *host)
{
    return !strncmp(host, "127.", 4) || !strcmp(host, "[::1]") || !strcmp(host, "localhost");
}
