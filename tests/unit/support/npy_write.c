/* npy_write.c: see npy_write.h. */
#include "tests/unit/support/npy_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mge_test_npy_write_raw(const char *path, int major, const char *dict, const void *data,
                           size_t len)
{
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict), hlen = dl + 1;
    unsigned char head[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', (unsigned char)major, 0};
    char *pad;
    int ok;
    FILE *f;
    while ((pre + hlen) % 64)
        hlen++;
    for (size_t i = 0; i < pre - 8; i++)
        head[8 + i] = (unsigned char)(hlen >> (8 * i));
    pad = malloc(hlen);
    if (!pad)
        return -1;
    memcpy(pad, dict, dl);
    memset(pad + dl, ' ', hlen - dl - 1);
    pad[hlen - 1] = '\n';
    f = fopen(path, "wb");
    if (!f) {
        free(pad);
        return -1;
    }
    ok = fwrite(head, 1, pre, f) == pre && fwrite(pad, 1, hlen, f) == hlen &&
         (len == 0 || fwrite(data, 1, len, f) == len);
    free(pad);
    if (fclose(f) != 0 || !ok) {
        if (!errno)
            errno = EIO;
        return -1;
    }
    return 0;
}

int mge_test_npy_write(const char *path, const char *descr, int ndim, const int64_t *shape,
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
    return mge_test_npy_write_raw(path, 1, dict, data, len);
}
