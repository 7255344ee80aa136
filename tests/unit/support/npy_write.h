/* npy_write.h: writing NumPy .npy and CIFAR-style files in tests, without Python. */
#ifndef MGE_TESTS_NPY_WRITE_H
#define MGE_TESTS_NPY_WRITE_H

#include <stddef.h>
#include <stdint.h>

/*
 * Write @path as a .npy file of version @major.0 (1, 2 or 3) whose header dict is @dict
 * verbatim, padded with spaces and a '\n' so the data starts at a multiple of 64 as NumPy
 * does, followed by @len bytes of @data. Returns 0, or -1 with errno set.
 */
int mge_test_npy_write_raw(const char *path, int major, const char *dict, const void *data,
                           size_t len);

/* mge_test_npy_write_raw() of version 1.0 with the dict NumPy writes for C-order @descr and
 * @shape ({'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }). */
int mge_test_npy_write(const char *path, const char *descr, int ndim, const int64_t *shape,
                       const void *data, size_t len);

#endif
