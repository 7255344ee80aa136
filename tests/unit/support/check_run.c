/* check_run.c: see check_run.h. */
#include "tests/unit/support/check_run.h"

#include <stdlib.h>

int mge_test_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    int failed;
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
