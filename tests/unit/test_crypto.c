/* test_crypto.c: common/crypto (HMAC-SHA256 against RFC 4231, the constant-time compare, the
 * worker link MACs and session keys). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crypto.h"
#include "common/err.h"
#include "tests/unit/support/check_run.h"

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

START_TEST(test_hmac_rfc4231)
{
    /* RFC 4231 test case 2, the message split in three parts */
    struct mge_span parts[3] = {{"what do ya", 10}, {NULL, 0}, {" want for nothing?", 18}};
    uint8_t mac[MGE_HMAC_LEN];
    char h[2 * MGE_HMAC_LEN + 1];
    ck_assert_int_eq(mge_hmac_sha256("Jefe", 4, parts, 3, mac), MGE_OK);
    hex(mac, sizeof(mac), h);
    ck_assert_str_eq(h, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}
END_TEST

START_TEST(test_ct_equal)
{
    ck_assert(mge_ct_equal("secret", 6, "secret", 6));
    ck_assert(!mge_ct_equal("secret", 6, "secreT", 6));
    ck_assert(!mge_ct_equal("secret", 6, "secret!", 7));
    ck_assert(!mge_ct_equal("secret", 6, "secre", 5));
    ck_assert(!mge_ct_equal("secret", 6, NULL, 0));
    ck_assert(mge_ct_equal("", 0, "", 0));
    ck_assert(!mge_ct_equal("", 0, "x", 1));
    /* a NUL inside does not end the comparison */
    ck_assert(!mge_ct_equal("ab\0c", 4, "ab\0d", 4));
}
END_TEST

START_TEST(test_random_bytes)
{
    uint8_t a[32], b[32];
    ck_assert_int_eq(mge_random_bytes(a, sizeof(a)), MGE_OK);
    ck_assert_int_eq(mge_random_bytes(b, sizeof(b)), MGE_OK);
    ck_assert(memcmp(a, b, sizeof(a)) != 0);
}
END_TEST

START_TEST(test_link_mac_binds_everything)
{
    uint8_t key[MGE_HMAC_LEN] = {1}, nonce[MGE_NONCE_LEN] = {2}, ref[MGE_HMAC_LEN], m[MGE_HMAC_LEN];
    const uint8_t body[] = "body";
    ck_assert_int_eq(
        mge_link_mac(MGE_LINK_MAC_REQUEST, key, sizeof(key), "w-1", 7, NULL, 0, body, 4, ref),
        MGE_OK);
    /* the same input gives the same MAC; any change in kind, id, counter, nonce, body or key
     * gives another */
    mge_link_mac(MGE_LINK_MAC_REQUEST, key, sizeof(key), "w-1", 7, NULL, 0, body, 4, m);
    ck_assert(!memcmp(ref, m, sizeof(m)));
    mge_link_mac(MGE_LINK_MAC_REPLY, key, sizeof(key), "w-1", 7, NULL, 0, body, 4, m);
    ck_assert(memcmp(ref, m, sizeof(m)));
    mge_link_mac(MGE_LINK_MAC_REQUEST, key, sizeof(key), "w-2", 7, NULL, 0, body, 4, m);
    ck_assert(memcmp(ref, m, sizeof(m)));
    mge_link_mac(MGE_LINK_MAC_REQUEST, key, sizeof(key), "w-1", 8, NULL, 0, body, 4, m);
    ck_assert(memcmp(ref, m, sizeof(m)));
    mge_link_mac(MGE_LINK_MAC_REQUEST, key, sizeof(key), "w-1", 7, nonce, sizeof(nonce), body, 4,
                 m);
    ck_assert(memcmp(ref, m, sizeof(m)));
    mge_link_mac(MGE_LINK_MAC_REQUEST, key, sizeof(key), "w-1", 7, NULL, 0, body, 3, m);
    ck_assert(memcmp(ref, m, sizeof(m)));
    key[0] = 9;
    mge_link_mac(MGE_LINK_MAC_REQUEST, key, sizeof(key), "w-1", 7, NULL, 0, body, 4, m);
    ck_assert(memcmp(ref, m, sizeof(m)));
    /* the id's length is bound: "w-1" + body "xbody" differs from "w-1x" + "body" */
    key[0] = 1;
    mge_link_mac(MGE_LINK_MAC_REQUEST, key, sizeof(key), "w-1x", 7, NULL, 0, body, 4, ref);
    mge_link_mac(MGE_LINK_MAC_REQUEST, key, sizeof(key), "w-1", 7, NULL, 0,
                 (const uint8_t *)"xbody", 5, m);
    ck_assert(memcmp(ref, m, sizeof(m)));
}
END_TEST

START_TEST(test_session_key)
{
    uint8_t cn[MGE_NONCE_LEN] = {1}, sn[MGE_NONCE_LEN] = {2}, k1[MGE_HMAC_LEN], k2[MGE_HMAC_LEN];
    ck_assert_int_eq(mge_link_session_key("join", "w-1", cn, sn, k1), MGE_OK);
    ck_assert_int_eq(mge_link_session_key("join", "w-1", cn, sn, k2), MGE_OK);
    ck_assert(!memcmp(k1, k2, sizeof(k1)));
    mge_link_session_key("join2", "w-1", cn, sn, k2);
    ck_assert(memcmp(k1, k2, sizeof(k1)));
    mge_link_session_key("join", "w-1", sn, cn, k2); /* nonces swapped */
    ck_assert(memcmp(k1, k2, sizeof(k1)));
}
END_TEST

static Suite *crypto_suite(void)
{
    Suite *s = suite_create("crypto");
    TCase *tc = tcase_create("crypto");
    tcase_add_test(tc, test_hmac_rfc4231);
    tcase_add_test(tc, test_ct_equal);
    tcase_add_test(tc, test_random_bytes);
    tcase_add_test(tc, test_link_mac_binds_everything);
    tcase_add_test(tc, test_session_key);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return mge_test_run(crypto_suite()); }
