/* npy.h: writing NumPy .npy files (the engine's eager dumps, the tests' data, mge-convert). */
#ifndef MGE_COMMON_NPY_H
#define MGE_COMMON_NPY_H

#include <stddef.h>
#include <stdint.h>

/*
 * Write @path as a .npy file of version @major.0 (1, 2 or 3) whose header dict is @dict
 * verbatim, padded with spaces and a '\n' so the data starts at a multiple of 64 as NumPy
 * does, followed by @len bytes of @data. Returns 0, or -1 with errno set (the file may then
 * exist, incomplete).
 */
int mge_npy_write_raw(const char *path, int major, const char *dict, const void *data, size_t len);

/*
 * mge_npy_write_raw() of version 1.0 with the dict NumPy writes for C-order @descr ("<f4",
 * "<i4") and @shape (@ndim dims, 0 for a scalar): {'descr': '<f4', 'fortran_order': False,
 * 'shape': (2, 3), }. Returns 0, or -1 with errno set.
 */
int mge_npy_write(const char *path, const char *descr, int ndim, const int64_t *shape,
                  const void *data, size_t len);

#endif
