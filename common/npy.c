/* npy.c: see npy.h. */
#include "common/npy.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int mge_npy_write_raw(const char *path, int major, const char *dict, const void *data, size_t len)
{
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict), hlen = dl + 1;
    unsigned char head[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', (unsigned char)major, 0};
    static const char spaces[64] =
        "                                                               ";
    int ok;
    FILE *f;
    while ((pre + hlen) % 64)
        hlen++;
    for (size_t i = 0; i < pre - 8; i++)
        head[8 + i] = (unsigned char)(hlen >> (8 * i));
    f = fopen(path, "wb");
    if (!f)
        return -1;
    /* the dict, spaces up to the next multiple of 64 (fewer than 64), '\n': no allocation, so
     * a program may link this file alone */
    ok = fwrite(head, 1, pre, f) == pre && fwrite(dict, 1, dl, f) == dl &&
         fwrite(spaces, 1, hlen - dl - 1, f) == hlen - dl - 1 && fputc('\n', f) != EOF &&
         (len == 0 || fwrite(data, 1, len, f) == len);
    if (fclose(f) != 0 || !ok) {
        if (!errno)
            errno = EIO;
        return -1;
    }
    return 0;
}

int mge_npy_write(const char *path, const char *descr, int ndim, const int64_t *shape,
                  const void *data, size_t len)
{
    char dict[512];
    size_t at = (size_t)snprintf(dict, sizeof(dict),
                                 "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int i = 0; i < ndim && at < sizeof(dict); i++)
        at += (size_t)snprintf(dict + at, sizeof(dict) - at, "%s%lld", i ? ", " : "",
                               (long long)shape[i]);
    if (at < sizeof(dict))
        snprintf(dict + at, sizeof(dict) - at, "%s), }", ndim == 1 ? "," : "");
    return mge_npy_write_raw(path, 1, dict, data, len);
}
