/* url.c: see url.h. */
#include "url.h"

#include <string.h>

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
