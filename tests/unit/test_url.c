/* test_url.c: Check suite for common/url.c: the host of an NNG URL, and the local address a
 * host is reached from (loopback only: a unit test has no other network, nor a resolver that
 * answers at once, to count on; the route to another host, from a network namespace, is
 * exercised by tests/integration/elastic_netns.sh). */
#include <check.h>
#include <string.h>

#include "common/err.h"
#include "common/url.h"
#include "tests/unit/support/check_run.h"

START_TEST(test_url_host)
{
    char h[16] = "dflt";
    mge_url_host("tcp://10.1.2.3:7070", h, sizeof(h));
    ck_assert_str_eq(h, "10.1.2.3");
    mge_url_host("tcp://[::1]:7070", h, sizeof(h));
    ck_assert_str_eq(h, "[::1]");
    strcpy(h, "dflt");
    mge_url_host("no-scheme", h, sizeof(h));
    ck_assert_str_eq(h, "dflt");
    mge_url_host("tcp://:7070", h, sizeof(h));
    ck_assert_str_eq(h, "dflt");
    mge_url_host("tcp://a-host-name-longer-than-16:1", h, sizeof(h));
    ck_assert_str_eq(h, "dflt");
}
END_TEST

START_TEST(test_url_route_source_loopback)
{
    char a[64] = "";
    ck_assert_int_eq(mge_url_route_source("tcp://127.0.0.1:7070", a, sizeof(a)), MGE_OK);
    ck_assert_str_eq(a, "127.0.0.1");
    ck_assert(mge_url_host_is_loopback(a));
    ck_assert_int_eq(mge_url_route_source("tcp://127.3.4.5:1", a, sizeof(a)), MGE_OK);
    ck_assert(mge_url_host_is_loopback(a));
    ck_assert_int_eq(mge_url_route_source("tcp://localhost:1", a, sizeof(a)), MGE_OK);
    ck_assert(mge_url_host_is_loopback(a));
    ck_assert(!mge_url_host_is_loopback("10.0.0.2"));
    ck_assert(!mge_url_host_is_loopback("[fd00::2]"));
    ck_assert(mge_url_host_is_loopback("[::1]"));
}
END_TEST

START_TEST(test_url_route_source_errors)
{
    char a[64] = "kept", tiny[4] = "k";
    ck_assert_int_eq(mge_url_route_source("no-scheme", a, sizeof(a)), MGE_INVAL);
    ck_assert_int_eq(mge_url_route_source("tcp://:7070", a, sizeof(a)), MGE_INVAL);
    ck_assert_int_eq(mge_url_route_source(NULL, a, sizeof(a)), MGE_INVAL);
    ck_assert_str_eq(a, "kept");
    ck_assert_int_eq(mge_url_route_source("tcp://127.0.0.1:7070", tiny, sizeof(tiny)), MGE_INVAL);
}
END_TEST

static Suite *url_suite(void)
{
    Suite *s = suite_create("url");
    TCase *tc = tcase_create("url");
    tcase_add_test(tc, test_url_host);
    tcase_add_test(tc, test_url_route_source_loopback);
    tcase_add_test(tc, test_url_route_source_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mge_test_run(url_suite());
}
