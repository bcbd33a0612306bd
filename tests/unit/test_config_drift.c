/*
 * test_config_drift.c — each tunable is declared once, in its module's list
 * (PAWL_STORE_TUNABLES in pawl/log.h, PAWL_PROCESSOR_TUNABLES in pawl/processor.h), and nothing
 * else disagrees with it. Walking both lists, it checks that:
 *
 *  - the module's defaults function gives the list's default;
 *  - the module's constructor (pawl_store_new's option check, pawl_processor_new's) accepts the
 *    list's min and max and refuses min - 1 and max + 1, each probed on the module's defaults,
 *    so a range narrowed or widened by hand in the module fails here, naming the field;
 *  - the flag table (pawl/config.h) has the list's flag with the same field, type, default,
 *    range, unit and help, no store or processor field has a flag the lists do not declare,
 *    and no field has two flags;
 *  - `pawl help --markdown` lists every flag of the table once, in its order;
 *  - the options structs' comments in the public headers state no defaults or ranges of their
 *    own (those live in the lists, next to them).
 *
 * The documented cross-field rules (reconnect and backoff maximums at least their minimums; the
 * claim extension 0 or 10..claim_timeout / 2) are kept satisfied while one side is probed.
 */
#include "pawl_test.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define LEN(a) (sizeof(a) / sizeof((a)[0]))

enum kind { K_INT, K_BOOL, K_BOOL_NOFLAG, K_DURATION, K_ENUM, K_STRING };

struct row {
    enum kind kind;
    const char *field, *flag, *unit, *help;
    int64_t def, lo, hi;
    const char *sdef;
    size_t offset, size; /* of the field in its options struct */
};

#define ROW_(st, type, field_, flag_, d, lo_, hi_, unit_, help_, choices_)                         \
    {.kind = K_##type,                                                                             \
     .field = #field_,                                                                             \
     .flag = flag_,                                                                                \
     .unit = unit_,                                                                                \
     .help = help_,                                                                                \
     DEF_##type(d),                                                                                \
     .lo = lo_,                                                                                    \
     .hi = hi_,                                                                                    \
     .offset = offsetof(st, field_),                                                               \
     .size = sizeof(((st *)0)->field_)},
#define DEF_INT(d) .def = (d)
#define DEF_BOOL(d) .def = (d)
#define DEF_BOOL_NOFLAG(d) .def = (d)
#define DEF_DURATION(d) .def = (d)
#define DEF_ENUM(d) .def = (d)
#define DEF_STRING(d) .sdef = (d)
#define STORE_ROW(...) ROW_(struct pawl_store_opts, __VA_ARGS__)
#define PROCESSOR_ROW(...) ROW_(struct pawl_processor_opts, __VA_ARGS__)

static const struct row store_rows[] = {PAWL_STORE_TUNABLES(STORE_ROW)};
static const struct row processor_rows[] = {PAWL_PROCESSOR_TUNABLES(PROCESSOR_ROW)};

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

static int64_t get(const void *field, size_t size)
{
    if (size == 8) {
        int64_t x;
        memcpy(&x, field, 8);
        return x;
    }
    int32_t x;
    memcpy(&x, field, 4);
    return x;
}

static int store_accepts(const struct row *r, int64_t v)
{
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    put((char *)&o + r->offset, r->size, v);
    if (strcmp(r->field, "reconnect_min_ms") == 0)
        o.reconnect_max_ms = (int)MAX(v, o.reconnect_max_ms);
    if (strcmp(r->field, "reconnect_max_ms") == 0 && v >= 1)
        o.reconnect_min_ms = (int)MIN(v, o.reconnect_min_ms);
    struct pawl_store *s = NULL;
    char err[512] = "";
    int rc = pawl_store_new(&s, "not a connection string", &o, err, sizeof err);
    assert_int_equal(rc, strstr(err, "invalid DSN") ? PAWL_EINVAL : PAWL_ERANGE);
    assert_null(s);
    return strstr(err, "invalid DSN") != NULL; /* the options passed, the DSN did not */
}

static int processor_accepts(const struct row *r, int64_t v)
{
    struct pawl_processor_opts o;
    pawl_processor_opts_defaults(&o);
    o.name = "drift";
    o.node_id = "n1";
    put((char *)&o + r->offset, r->size, v);
    if (strcmp(r->field, "backoff_min_ms") == 0)
        o.backoff_max_ms = (uint32_t)MAX(v, o.backoff_max_ms);
    if (strcmp(r->field, "backoff_max_ms") == 0 && v >= 1)
        o.backoff_min_ms = (uint32_t)MIN(v, o.backoff_min_ms);
    if (strcmp(r->field, "claim_extend_interval_ms") == 0)
        o.claim_timeout_ms = (uint32_t)MAX(2 * v, o.claim_timeout_ms);
    struct pawl_processor *p = NULL;
    struct pawl_handler h = {"h", NULL, handle_none, NULL};
    int rc = pawl_processor_new(&p, &o, src, tok, &h, 1);
    pawl_processor_free(p);
    /* PAWL_ENOTSUP: the value is in range, but the in-memory token store cannot do what it
     * asks (dead letters need PostgreSQL's). */
    return rc == 0 || rc == PAWL_ENOTSUP;
}

static void probe(const struct row *r, const char *mod, int (*accepts)(const struct row *, int64_t))
{
    if (r->kind == K_STRING)
        return; /* names are checked by their own rules; a DSN by the server */
    int64_t lo = r->lo, hi = r->hi;
    struct {
        int64_t v;
        int want;
    } cases[] = {
        {lo, 1}, {hi, 1}, {lo > INT64_MIN ? lo - 1 : lo, 0}, {hi < INT64_MAX ? hi + 1 : hi, 0}};
    for (size_t i = 0; i < 4; i++) {
        if (i >= 2 && cases[i].v == cases[i - 2].v)
            continue; /* the bound is the type's own: nothing beyond it to refuse */
        if (r->size == 4 && (cases[i].v > INT32_MAX || cases[i].v < INT32_MIN))
            continue; /* not representable: the list's bound is the type's */
        if (i >= 2 && r->kind == K_BOOL && strcmp(mod, "processor") == 0)
            continue; /* the processor takes any nonzero value as true */
        probes++;
        int got = accepts(r, cases[i].v);
        if (got != cases[i].want) {
            failures++;
            print_error("%s.%s: the list %s %lld, the module %s it\n", mod, r->field,
                        cases[i].want ? "allows" : "refuses", (long long)cases[i].v,
                        got ? "accepts" : "refuses");
        }
    }
}

static void check_defaults(const struct row *rows, size_t n, const char *mod, const void *opts)
{
    for (size_t i = 0; i < n; i++) {
        const struct row *r = &rows[i];
        const char *field = (const char *)opts + r->offset;
        if (r->kind == K_STRING) {
            const char *s;
            memcpy(&s, field, sizeof s);
            if (!(s == r->sdef || (s && r->sdef && strcmp(s, r->sdef) == 0))) {
                failures++;
                print_error("%s.%s: default differs from the list's\n", mod, r->field);
            }
            continue;
        }
        int64_t v = get(field, r->size);
        if (v != r->def) {
            failures++;
            print_error("%s.%s: the module's default is %lld, the list's %lld\n", mod, r->field,
                        (long long)v, (long long)r->def);
        }
    }
}

static void test_defaults_match_lists(void **state)
{
    (void)state;
    failures = 0;
    struct pawl_store_opts so;
    pawl_store_opts_defaults(&so);
    check_defaults(store_rows, LEN(store_rows), "store", &so);
    struct pawl_processor_opts po;
    pawl_processor_opts_defaults(&po);
    check_defaults(processor_rows, LEN(processor_rows), "processor", &po);
    assert_int_equal(failures, 0);
}

static void test_ranges_match_modules(void **state)
{
    (void)state;
    failures = probes = 0;
    assert_int_equal(pawl_source_mem_new(&src), 0);
    assert_int_equal(pawl_tokens_mem_new(&tok), 0);
    pawl_log_set_level(PAWL_LOG_OFF);
    for (size_t i = 0; i < LEN(store_rows); i++)
        probe(&store_rows[i], "store", store_accepts);
    for (size_t i = 0; i < LEN(processor_rows); i++)
        probe(&processor_rows[i], "processor", processor_accepts);
    pawl_log_set_level(PAWL_LOG_INFO);
    print_message("%d range probes, %d disagreements\n", probes, failures);
    pawl_tokens_free(tok);
    pawl_source_free(src);
    assert_true(probes >= 150);
    assert_int_equal(failures, 0);
}

static enum pawl_flag_type flag_type(enum kind k)
{
    switch (k) {
    case K_INT:
        return PAWL_FLAG_INT;
    case K_BOOL:
    case K_BOOL_NOFLAG:
        return PAWL_FLAG_BOOL;
    case K_DURATION:
        return PAWL_FLAG_DURATION;
    case K_ENUM:
        return PAWL_FLAG_ENUM;
    case K_STRING:
        return PAWL_FLAG_STRING;
    }
    return PAWL_FLAG_INT;
}

static int same_text(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

/* The table's row for r, if the list gives r a flag, is r itself. */
static void check_table(const struct row *rows, size_t n, const char *mod, size_t base)
{
    for (size_t i = 0; i < n; i++) {
        const struct row *r = &rows[i];
        const struct pawl_flag *f = pawl_config_flag_find(r->flag);
        if (r->kind == K_BOOL_NOFLAG) {
            if (f != NULL) {
                failures++;
                print_error("%s.%s: the list offers no flag, the table has --%s\n", mod, r->field,
                            r->flag);
            }
            continue;
        }
        if (f == NULL) {
            failures++;
            print_error("%s.%s: the table has no --%s\n", mod, r->field, r->flag);
            continue;
        }
        const char *what = NULL;
        if (f->offset != base + r->offset || f->size != r->size)
            what = "field";
        else if (f->type != flag_type(r->kind))
            what = "type";
        else if (r->kind == K_STRING ? !same_text(f->sdef, r->sdef) : f->def != r->def)
            what = "default";
        else if (r->kind != K_BOOL && r->kind != K_STRING && (f->min != r->lo || f->max != r->hi))
            what = "range";
        else if (r->kind == K_STRING && f->max != r->hi)
            what = "length limit";
        else if (!same_text(f->unit, r->unit))
            what = "unit";
        else if (!same_text(f->help, r->help))
            what = "help";
        if (what) {
            failures++;
            print_error("%s.%s: --%s's %s differs from the list's\n", mod, r->field, r->flag, what);
        }
    }
}

static int listed(const struct row *rows, size_t n, size_t offset)
{
    for (size_t i = 0; i < n; i++)
        if (rows[i].offset == offset && rows[i].kind != K_BOOL_NOFLAG)
            return 1;
    return 0;
}

static void test_table_matches_lists(void **state)
{
    (void)state;
    failures = 0;
    size_t so = offsetof(struct pawl_config, store), po = offsetof(struct pawl_config, processor);
    check_table(store_rows, LEN(store_rows), "store", so);
    check_table(processor_rows, LEN(processor_rows), "processor", po);
    /* No flag of the table sets a module field the lists do not declare. */
    for (size_t i = 0; i < pawl_config_flag_count(); i++) {
        const struct pawl_flag *f = pawl_config_flag_at(i);
        int bad = 0;
        if (f->offset >= so && f->offset < so + sizeof(struct pawl_store_opts))
            bad = !listed(store_rows, LEN(store_rows), f->offset - so);
        else if (f->offset >= po && f->offset < po + sizeof(struct pawl_processor_opts))
            bad = !listed(processor_rows, LEN(processor_rows), f->offset - po);
        if (bad) {
            failures++;
            print_error("--%s sets a module field that no tunable list declares\n", f->name);
        }
        for (size_t j = 0; j < i; j++) {
            if (pawl_config_flag_at(j)->offset == f->offset) {
                failures++;
                print_error("--%s and --%s set the same field\n", pawl_config_flag_at(j)->name,
                            f->name);
            }
        }
    }
    assert_int_equal(failures, 0);
}

/*
 * `pawl help --markdown`'s flag table lists each of the library's flags exactly once, in the
 * table's order (the tool's own flags come between and after them).
 */
static void test_reference_lists_every_flag(void **state)
{
    (void)state;
    const char *bin = getenv("PAWL_BIN");
    if (bin == NULL)
        skip();
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "'%s/pawl' help --markdown", bin);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[8192];
    size_t next = 0, rows = 0;
    failures = 0;
    while (fgets(line, sizeof line, p)) { /* read to the end: the tool must not die of SIGPIPE */
        if (failures || strncmp(line, "| `--", 5) != 0)
            continue;
        char *end = strchr(line + 5, '`');
        assert_non_null(end);
        *end = '\0';
        const char *name = line + 5;
        rows++;
        const struct pawl_flag *f = pawl_config_flag_find(name);
        if (f == NULL)
            continue; /* one of the tool's own */
        if (f != pawl_config_flag_at(next)) {
            failures++;
            print_error("help --markdown lists --%s where the table has --%s next\n", name,
                        pawl_config_flag_at(next) ? pawl_config_flag_at(next)->name : "nothing");
            continue;
        }
        next++;
    }
    assert_int_equal(pclose(p), 0);
    if (failures == 0 && next != pawl_config_flag_count()) {
        failures++;
        print_error("help --markdown lists %zu of the table's %zu flags\n", next,
                    pawl_config_flag_count());
    }
    assert_true(rows > next);
    assert_int_equal(failures, 0);
}

/* Text of the block from "struct NAME {" to its "};" in a public header. */
static char *struct_text(const char *header, const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/include/pawl/%s", PAWL_SOURCE_DIR, header);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char buf[1 << 18];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char open[128];
    snprintf(open, sizeof open, "struct %s {", name);
    char *a = strstr(buf, open);
    assert_non_null(a);
    char *b = strstr(a, "\n};");
    assert_non_null(b);
    *b = '\0';
    return a;
}

/* "default 2", "Default: 16", "1..64", "10..3600000": a default or range stated in prose. */
static void check_prose(const char *header, const char *name)
{
    const char *t = struct_text(header, name);
    for (const char *c = t; *c; c++) {
        int hit = 0;
        if (strncasecmp(c, "default", 7) == 0) {
            const char *d = c + 7;
            while (*d == ' ' || *d == ':' || *d == '\n' || *d == '*')
                d++;
            hit = isdigit((unsigned char)*d);
        } else if (isdigit((unsigned char)*c) && c[1] == '.' && c[2] == '.' &&
                   isdigit((unsigned char)c[3])) {
            hit = 1;
        }
        if (hit) {
            failures++;
            print_error("%s: struct %s's comments state a default or range (\"%.30s\"); the "
                        "tunable list declares them\n",
                        header, name, c);
        }
    }
}

static void test_headers_state_no_values(void **state)
{
    (void)state;
    failures = 0;
    check_prose("log.h", "pawl_store_opts");
    check_prose("processor.h", "pawl_processor_opts");
    assert_int_equal(failures, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_match_lists),
        cmocka_unit_test(test_ranges_match_modules),
        cmocka_unit_test(test_table_matches_lists),
        cmocka_unit_test(test_reference_lists_every_flag),
        cmocka_unit_test(test_headers_state_no_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
