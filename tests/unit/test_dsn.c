/*
 * test_dsn.c — DSN checking and password redaction.
 */
#include "pawl_test.h"

#include "dsn.h"

#include <stdio.h>
#include <string.h>

static void test_redact_keyword_form(void **state)
{
    (void)state;
    char out[256];
    pawl_dsn_redact("host=/tmp/x dbname=pawl user=u password=s3cret", out, sizeof out);
    assert_null(strstr(out, "s3cret"));
    assert_non_null(strstr(out, "password=***"));
    assert_non_null(strstr(out, "dbname=pawl"));
}

static void test_redact_uri_form(void **state)
{
    (void)state;
    char out[256];
    pawl_dsn_redact("postgresql://alice:hunter2@localhost:5433/db", out, sizeof out);
    assert_null(strstr(out, "hunter2"));
    assert_non_null(strstr(out, "user=alice"));
    assert_non_null(strstr(out, "port=5433"));
}

static void test_invalid(void **state)
{
    (void)state;
    char err[256], out[64];
    assert_int_equal(pawl_dsn_check("host=x nonsense_key=1", err, sizeof err), PAWL_EINVAL);
    assert_non_null(strstr(err, "nonsense_key"));
    assert_int_equal(pawl_dsn_check("dbname='unterminated", err, sizeof err), PAWL_EINVAL);
    assert_int_equal(pawl_dsn_check(NULL, err, sizeof err), PAWL_EINVAL);
    assert_int_equal(pawl_dsn_check("host=/tmp dbname=x", NULL, 0), 0);
    assert_string_equal(pawl_dsn_redact("password='oops", out, sizeof out), "<invalid dsn>");
    /* Truncation still terminates and never cuts into a half-printed password. */
    char tiny[8];
    pawl_dsn_redact("host=averyveryverylonghostname password=x", tiny, sizeof tiny);
    assert_true(strlen(tiny) < sizeof tiny);
}

/* dsn is refused with a message that carries neither secret (secret2 may be NULL). */
static void assert_refused_hiding(const char *dsn, const char *secret, const char *secret2)
{
    char err[1024] = "";
    assert_int_equal(pawl_dsn_check(dsn, err, sizeof err), PAWL_EINVAL);
    assert_true(err[0] != '\0');
    if (strstr(err, secret) != NULL || (secret2 && strstr(err, secret2) != NULL))
        fail_msg("%s: the password shows in \"%s\"", dsn, err);
}

/* libpq's parse errors quote the malformed part, for a URI often the whole string: the check's
 * message never carries the password, in any of the forms it can be written in. */
static void test_check_never_echoes_password(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "postgresql://alice:Zq9SecretPw@[::1/db",    /* whole URI quoted */
        "postgresql://alice:Zq9Secret%ZZPw@host/db", /* bad percent-encoding in the password */
        "postgresql://alice:Zq9SecretPw@host/db?host=%zz",   /* bad percent-encoding later on */
        "postgresql://alice@host/db?password=Zq9SecretPw&x", /* query parameter without "=" */
        "postgres://alice:Zq9SecretPw@host/db?nosuch=1",
        "password=Zq9SecretPw host",    /* key=value, malformed after it */
        "password='Zq9SecretPw host=x", /* unterminated quote */
        "host=x password = Zq9SecretPw nosuch=1",
        "sslpassword=Zq9SecretPw nosuch=1",
        " postgresql://alice:Zq9SecretPw@host/db",  /* leading space: libpq quotes it all */
        "\npostgresql://alice:Zq9SecretPw@host/db", /* leading newline */
        "POSTGRESQL://alice:Zq9SecretPw@host/db",   /* upper-case scheme */
        "Postgres://alice:Zq9SecretPw@host/db",
        "\t postgresql://alice:Zq9SecretPw@host/db?x=1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_refused_hiding(bad[i], "Zq9Secret", NULL);
        assert_true(pawl_dsn_has_password(bad[i]));
    }
    assert_false(pawl_dsn_has_password("host=/tmp dbname=x passfile=/tmp/p"));
    assert_false(pawl_dsn_has_password("postgresql://alice@host/db"));
    assert_true(pawl_dsn_has_password("postgresql://alice:pw@host/db"));
}

static void test_scrub(void **state)
{
    (void)state;
    char out[256];
    /* As written, unescaped, percent-decoded. */
    pawl__dsn_scrub("host=x password='a\\'b c'", "x a\\'b c y a'b c z", out, sizeof out);
    assert_string_equal(out, "x *** y *** z");
    pawl__dsn_scrub("postgresql://u:p%40ss%2Fw0rd@h/db", "bad \"p%40ss%2Fw0rd\" or p@ss/w0rd", out,
                    sizeof out);
    assert_null(strstr(out, "w0rd"));
    /* Cut short after scrubbing: no part of the secret at the end. */
    char tiny[12];
    pawl__dsn_scrub("password=0123456789abcdef", "at 0123456789abcdef", tiny, sizeof tiny);
    assert_null(strstr(tiny, "0123"));
    /* No secret: the message as it is. */
    pawl__dsn_scrub("host=/tmp dbname=x", "plain message", out, sizeof out);
    assert_string_equal(out, "plain message");
    /* More password values than the scrubber keeps: the message is hidden whole, so the ones
     * past its limit never show. */
    char many[4096] = "host=x";
    for (int i = 0; i < 80; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), " password=secret%02d", i);
    pawl__dsn_scrub(many, "refused secret79 and secret00", out, sizeof out);
    assert_null(strstr(out, "secret"));
    assert_non_null(strstr(out, "message hidden"));
}

/* A percent-encoded NUL in a password (libpq refuses "%00") decodes to a secret that ends at
 * its first byte as a C string. Found by the DSN fuzzer: an empty secret made the scrubber
 * loop forever, so a mistyped DSN hung the check that reports it. Each of these must come
 * back, refused, with the rest of the password hidden. */
static void test_nul_in_password(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "postgresql://u:%00Zq9SecretPw@h/db",
        "postgres://u:%00@h/db",
        "postgresql://u:Zq9Secret%00Pw@h/db",
        "postgresql://u@h/db?password=%00Zq9SecretPw",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_refused_hiding(bad[i], "Zq9Secret", "SecretPw");
    char out[128];
    pawl__dsn_scrub("postgres://u:%00@h/db", "message with %00 in it", out, sizeof out);
    assert_string_equal(out, "message with *** in it");
}

/* The library's own connection errors (a server that is not there) name the DSN redacted. */
static void test_store_error_has_no_password(void **state)
{
    (void)state;
    static const char *const dsns[] = {
        "host=/nonexistent-pawl dbname=x user=u password=Zq9SecretPw connect_timeout=2",
        "postgresql://u:Zq9SecretPw@/x?host=/nonexistent-pawl&connect_timeout=2",
    };
    for (size_t i = 0; i < 2; i++) {
        char err[1024] = "";
        struct pawl_store *s = NULL;
        struct pawl_store_opts o;
        pawl_store_opts_defaults(&o);
        o.connect_timeout_ms = 2000;
        o.open_timeout_ms = 2000;
        assert_int_not_equal(pawl_store_new(&s, dsns[i], &o, err, sizeof err), 0);
        assert_null(s);
        assert_true(err[0] != '\0');
        if (strstr(err, "Zq9Secret") != NULL)
            fail_msg("the password shows in \"%s\"", err);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_redact_keyword_form),
        cmocka_unit_test(test_redact_uri_form),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_check_never_echoes_password),
        cmocka_unit_test(test_scrub),
        cmocka_unit_test(test_nul_in_password),
        cmocka_unit_test(test_store_error_has_no_password),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
