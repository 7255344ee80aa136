/* npy_write.c: see npy_write.h (the writer itself is common/npy.c, which the engine shares). */
#include "tests/unit/support/npy_write.h"

#include "common/npy.h"

int mge_test_npy_write_raw(const char *path, int major, const char *dict, const void *data,
                           size_t len)
{
    return mge_npy_write_raw(path, major, dict, data, len);
}

int mge_test_npy_write(const char *path, const char *descr, int ndim, const int64_t *shape,
                       const void *data, size_t len)
{
    return mge_npy_write(path, descr, ndim, shape, data, len);
}
