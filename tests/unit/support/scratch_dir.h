/* scratch_dir.h: removing a test's scratch directory (unit tests and fuzz targets). */
#ifndef MGE_TESTS_SCRATCH_DIR_H
#define MGE_TESTS_SCRATCH_DIR_H

/* Remove the files directly under @dir, then @dir itself. Errors are ignored (a scratch
 * directory that cannot go is left for the system's temporary-file cleaner). */
void mge_test_scratch_remove(const char *dir);

#endif
