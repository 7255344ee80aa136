/* check_run.h: what every unit test binary shares (a Check suite runner, scratch directories). */
#ifndef MGE_TESTS_CHECK_RUN_H
#define MGE_TESTS_CHECK_RUN_H

#include <check.h>

/* Run every test of @s (the runner takes and frees it), printing Check's summary line;
 * EXIT_SUCCESS when none failed, else EXIT_FAILURE. For main(). */
int mge_test_run(Suite *s);

#endif
