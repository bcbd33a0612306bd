/*
 * test_tool_jsonl.c — the JSON-lines event parser of `pawl append` and the writer of `pawl tail`:
 * valid lines, each kind of invalid line with its reason, and a write/parse round trip.
 */
#include "pawl_test.h"

#include "jsonl.h"

#include <stdlib.h>
#include <string.h>

static int parse(const char *line, struct tool_jsonl_event *e, char *err, size_t errlen)
{
    return tool_jsonl_parse(line, strlen(line), e, err, errlen);
}

static void test_valid(void **state)
{
    (void)state;
    struct tool_jsonl_event e;
    char err[256];
    assert_int_equal(parse("{\"stream\":\"s-1\",\"type\":\"Created\",\"payload\":{\"a\":[1,2]},"
                           "\"metadata\":{\"by\":\"me\"},\"seq\":3}",
                           &e, err, sizeof err),
                     0);
    assert_string_equal(e.ev.stream_id, "s-1");
    assert_string_equal(e.ev.type, "Created");
    assert_int_equal(e.ev.payload_len, strlen("{\"a\":[1,2]}"));
    assert_memory_equal(e.ev.payload, "{\"a\":[1,2]}", e.ev.payload_len);
    assert_string_equal(e.ev.metadata, "{\"by\":\"me\"}");
    assert_int_equal(e.ev.stream_seq, 3);
    tool_jsonl_event_fini(&e);

    /* A string payload is its bytes; payload and metadata may be absent. */
    assert_int_equal(parse("  {\"type\":\"T\",\"stream\":\"x\",\"payload\":\"raw text\"}\r\n", &e,
                           err, sizeof err),
                     0);
    assert_int_equal(e.ev.payload_len, 8);
    assert_memory_equal(e.ev.payload, "raw text", 8);
    assert_null(e.ev.metadata);
    assert_int_equal(e.ev.stream_seq, 0);
    tool_jsonl_event_fini(&e);
    assert_int_equal(
        parse("{\"type\":\"T\",\"stream\":\"x\",\"metadata\":null}", &e, err, sizeof err), 0);
    assert_null(e.ev.payload);
    assert_int_equal(e.ev.payload_len, 0);
    tool_jsonl_event_fini(&e);
    assert_int_equal(parse("   \t", &e, err, sizeof err), 1);
    assert_int_equal(parse("", &e, err, sizeof err), 1);
}

static void test_invalid(void **state)
{
    (void)state;
    static const struct {
        const char *line;
        const char *reason;
    } bad[] = {
        {"{\"stream\":\"x\",\"type\":\"T\"", "not valid JSON at column"},
        {"[1,2]", "expected a JSON object"},
        {"{\"type\":\"T\"}", "missing \"stream\""},
        {"{\"stream\":\"x\"}", "missing \"type\""},
        {"{\"stream\":5,\"type\":\"T\"}", "\"stream\" must be a string"},
        {"{\"stream\":\"\",\"type\":\"T\"}", "\"stream\" must be 1 to 255 bytes"},
        {"{\"stream\":\"x\",\"type\":\"T\",\"seq\":-1}", "\"seq\" must be an integer"},
        {"{\"stream\":\"x\",\"type\":\"T\",\"seq\":1.5}", "\"seq\" must be an integer"},
        {"{\"stream\":\"x\",\"type\":\"T\",\"metadata\":[1]}",
         "\"metadata\" must be a JSON object"},
        {"{\"stream\":\"x\",\"type\":\"T\",\"paylaod\":1}", "unknown key \"paylaod\""},
        {"{\"stream\":\"x\",\"stream\":\"y\",\"type\":\"T\"}", "not valid JSON"},
        {"{\"stream\":\"a\\u0000b\",\"type\":\"T\"}", "must not contain NUL"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct tool_jsonl_event e;
        char err[256] = "";
        int rc = parse(bad[i].line, &e, err, sizeof err);
        if (rc != PAWL_EINVAL || strstr(err, bad[i].reason) == NULL)
            fail_msg("line %s: rc %d, message '%s', want '%s'", bad[i].line, rc, err,
                     bad[i].reason);
    }
    /* A stream id one byte too long. */
    char line[400], id[300];
    memset(id, 'a', 256);
    id[256] = '\0';
    snprintf(line, sizeof line, "{\"stream\":\"%s\",\"type\":\"T\"}", id);
    struct tool_jsonl_event e;
    char err[256];
    assert_int_equal(parse(line, &e, err, sizeof err), PAWL_EINVAL);
    assert_non_null(strstr(err, "(it is 256)"));
}

static void test_round_trip(void **state)
{
    (void)state;
    struct pawl_event ev = {.index = 42,
                            .stream_id = "acct-\"9\"",
                            .stream_seq = 7,
                            .type = "Deposited",
                            .payload = "{\"amount\":10}",
                            .payload_len = 13,
                            .metadata = "{\"k\":1}",
                            .appended_at_us = 1764486000123456LL};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(tool_jsonl_write(f, &ev), 0);
    fclose(f);
    assert_non_null(strstr(buf, "\"index\":42"));
    assert_non_null(strstr(buf, "\"payload\":{\"amount\":10}"));
    assert_non_null(strstr(buf, "\"appended_at\":\"2025-11-30T07:00:00.123456Z\""));
    /* What tail writes, append reads back (index and appended_at are ignored). */
    struct tool_jsonl_event e;
    char err[256];
    assert_int_equal(parse(buf, &e, err, sizeof err), 0);
    assert_string_equal(e.ev.stream_id, ev.stream_id);
    assert_string_equal(e.ev.type, ev.type);
    assert_int_equal(e.ev.stream_seq, 7);
    assert_int_equal(e.ev.payload_len, ev.payload_len);
    assert_memory_equal(e.ev.payload, ev.payload, ev.payload_len);
    assert_string_equal(e.ev.metadata, ev.metadata);
    assert_int_equal(e.ev.index, 0);
    tool_jsonl_event_fini(&e);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),
        cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
