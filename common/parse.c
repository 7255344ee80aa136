/* parse.c: strict number parsing (see parse.h). */
#include "common/parse.h"

#include <errno.h>
#include <stdlib.h>

bool mge_parse_int(const char *s, long long lo, long long hi, long long *out)
{
    char *end = NULL;
    long long v;
    if (!s)
        return false;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}
