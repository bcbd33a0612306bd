/* app.c: append an event, then follow the log until it comes back with its final index. */
#include <pawl.h>

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    const char *dsn = argc > 1 ? argv[1] : ""; /* "": libpq's PG* variables */
    struct pawl_store_opts o;
    pawl_store_opts_defaults(&o);
    o.migrate = 1; /* create or upgrade the schema, as `pawl init` does */
    struct pawl_store *s;
    char err[256];
    if (pawl_store_new(&s, dsn, &o, err, sizeof err) != 0) {
        fprintf(stderr, "open: %s\n", err);
        return 1;
    }

    struct pawl_event ev = {.stream_id = "order-17",
                            .type = "OrderPlaced",
                            .payload = "{\"total\":42}",
                            .payload_len = 12,
                            .stream_seq = PAWL_SEQ_ANY};
    struct pawl_append_result res;
    if (pawl_append(s, &ev, 1, &res) != 0) { /* PAWL_ECONFLICT, PAWL_EINDOUBT, ... */
        fprintf(stderr, "append: %s\n", res.message);
        pawl_store_free(s);
        return 1;
    }

    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    int64_t pos = 0, found = 0;
    while (!found && pawl_follow(s, pos, 1000, &b, -1) == 0) /* blocks until new indexes */
        for (size_t i = 0; i < b.count; i++) {
            const struct pawl_event *e = &b.events[i]; /* handle it */
            pos = e->index;
            if (strcmp(e->stream_id, "order-17") == 0 && e->stream_seq == res.first_seq)
                found = e->index;
        }
    printf("order-17#%lld is event %lld\n", (long long)res.first_seq, (long long)found);
    pawl_read_batch_fini(&b);
    pawl_store_free(s);
    return found ? 0 : 1;
}
