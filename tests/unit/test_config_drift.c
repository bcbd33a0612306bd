/*
 * test_config_drift.c — the flag table and the modules agree on every numeric tunable's range:
 * for each flag that sets a field of struct pawl_store_opts or struct pawl_processor_opts, the
 * module itself (pawl_store_new's option check, pawl_processor_new's) must accept the table's
 * min and max and refuse min - 1 and max + 1, each probed on the module's defaults. Together
 * with test_config's defaults check, a tunable whose range or default is changed in one place
 * only fails here, naming it. The documented cross-field rules (reconnect, backoff and finalizer
 * cadence maximums at least their minimums; the claim extension at most half the claim timeout)
 * are kept satisfied while one side is probed.
 */
#include "pawl_test.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define MIN(a, b) ((a) < (b) ? (a) : (b))

static int handle_none(void *self, struct pawl_event_ctx *ctx)
{
    return 0;
}

static struct pawl_source *src;
static struct pawl_tokens *tok;
static int probes, failures;

static void put(void *field, size_t size, int64_t v)
{
    if (size == 8)
        memcpy(field, &v, 8);
    else if (size == 4) {
        int32_t x = (int32_t)v;
        memcpy(field, &x, 4);
    } else
        fail_msg("unexpected field size %zu", size);
}

static int store_accepts(const struct pawl_flag *f, size_t off, int64_t v)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    put((char *)&o + off, f->size, v);
    if (strcmp(f->name, "reconnect-min") == 0)
        o.reconnect_max_ms = (int)MAX(v, o.reconnect_max_ms);
    if (strcmp(f->name, "reconnect-max") == 0 && v >= 1)
        o.reconnect_min_ms = (int)MIN(v, o.reconnect_min_ms);
    if (strcmp(f->name, "finalizer-min-interval") == 0)
        o.finalizer_max_interval_us = MAX(v, o.finalizer_max_interval_us);
    struct pawl_store *s = NULL;
    char err[512] = "";
    int rc = pawl_store_new(&s, "not a connection string", &o, err, sizeof err);
    assert_int_equal(rc, strstr(err, "invalid DSN") ? PAWL_EINVAL : PAWL_ERANGE);
    assert_null(s);
    return strstr(err, "invalid DSN") != NULL; /* the options passed, the DSN did not */
}

static int processor_accepts(const struct pawl_flag *f, size_t off, int64_t v)
{
    struct pawl_processor_opts o;
    pawl_processor_opts_defaults(&o);
    o.name = "drift";
    o.node_id = "n1";
    put((char *)&o + off, f->size, v);
    if (strcmp(f->name, "backoff-min") == 0)
        o.backoff_max_ms = (uint32_t)MAX(v, o.backoff_max_ms);
    if (strcmp(f->name, "backoff-max") == 0 && v >= 1)
        o.backoff_min_ms = (uint32_t)MIN(v, o.backoff_min_ms);
    if (strcmp(f->name, "claim-extend-interval") == 0)
        o.claim_timeout_ms = (uint32_t)MAX(2 * v, o.claim_timeout_ms);
    struct pawl_processor *p = NULL;
    struct pawl_handler h = {"h", NULL, handle_none, NULL};
    int rc = pawl_processor_new(&p, &o, src, tok, &h, 1);
    pawl_processor_free(p);
    /* PAWL_ENOTSUP: the value is in range, but the in-memory token store cannot do what it
     * asks (dead letters need PostgreSQL's). */
    return rc == 0 || rc == PAWL_ENOTSUP;
}

static void probe(const struct pawl_flag *f, const char *mod, size_t off,
                  int (*accepts)(const struct pawl_flag *, size_t, int64_t))
{
    if (f->type != PAWL_FLAG_INT && f->type != PAWL_FLAG_DURATION)
        return;
    int64_t lo = f->min, hi = f->max;
    struct {
        int64_t v;
        int want;
    } cases[] = {
        {lo, 1}, {hi, 1}, {lo > INT64_MIN ? lo - 1 : lo, 0}, {hi < INT64_MAX ? hi + 1 : hi, 0}};
    for (size_t i = 0; i < 4; i++) {
        if (i >= 2 && cases[i].v == cases[i - 2].v)
            continue; /* the bound is the type's own: nothing beyond it to refuse */
        if (f->size == 4 && (cases[i].v > INT32_MAX || cases[i].v < INT32_MIN))
            continue; /* not representable: the table's bound is the type's */
        probes++;
        int got = accepts(f, off, cases[i].v);
        if (got != cases[i].want) {
            failures++;
            print_error("--%s (%s): the table %s %lld, the module %s it\n", f->name, mod,
                        cases[i].want ? "allows" : "refuses", (long long)cases[i].v,
                        got ? "accepts" : "refuses");
        }
    }
}

static void test_ranges_match_modules(void **state)
{
    assert_int_equal(pawl_source_mem_new(&src), 0);
    assert_int_equal(pawl_tokens_mem_new(&tok), 0);
    pawl_log_set_level(PAWL_LOG_OFF);
    size_t so = offsetof(struct pawl_config, store), po = offsetof(struct pawl_config, processor);
    for (size_t i = 0; i < pawl_config_flag_count(); i++) {
        const struct pawl_flag *f = pawl_config_flag_at(i);
        if (f->offset >= so && f->offset < so + sizeof(struct pawl_store_opts))
            probe(f, "store", f->offset - so, store_accepts);
        else if (f->offset >= po && f->offset < po + sizeof(struct pawl_processor_opts))
            probe(f, "processor", f->offset - po, processor_accepts);
    }
    pawl_log_set_level(PAWL_LOG_INFO);
    print_message("%d range probes, %d disagreements\n", probes, failures);
    pawl_tokens_free(tok);
    pawl_source_free(src);
    assert_true(probes >= 40);
    assert_int_equal(failures, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranges_match_modules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
