/*
 * cmd_retention.c — `pawl retention`: show the log's partitions, close the open one (--rotate),
 * and move the log's start to a low-watermark (--before INDEX), dropping the partitions that
 * lie wholly below it. A preview unless --execute. With --archive FILE the events below the
 * watermark are first written to FILE as JSON lines (the `pawl tail --json` format, which
 * `pawl append` loads into another log in index order, so every stream keeps its order), and
 * fsynced, before anything is dropped. Refused (exit 4) while a processor's token is below the
 * watermark - 1, unless --force. Every action comes from the command line only.
 */
#include "jsonl.h"
#include "pgq.h"
#include "position.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void print_parts(const struct tool_part_row *rows, size_t n, int64_t w)
{
    printf("%-12s %-12s %-12s %-25s %10s %12s  %s\n", "partition", "xid from", "xid to", "indexes",
           "events", "bytes", w > 0 ? "at this watermark" : "state");
    for (size_t i = 0; i < n; i++) {
        const struct tool_part_row *p = &rows[i];
        char idx[64] = "-";
        if (p->events > 0)
            snprintf(idx, sizeof idx, "%" PRId64 " .. %" PRId64, p->min_index, p->max_index);
        const char *what = p->hi[0] == '\0' ? "open (receives new appends)"
                           : !p->finalized  ? "closed, not all finalized yet"
                           : w <= 0         ? "closed"
                           : p->drops       ? "dropped"
                                            : "kept (holds indexes at or above it)";
        printf("%-12s %-12s %-12s %-25s %10" PRId64 " %12" PRId64 "  %s\n", p->name,
               p->lo[0] ? p->lo : "-", p->hi[0] ? p->hi : "-", idx, p->events, p->bytes, what);
    }
}

/* Write the events [from, w) to path (created, never overwritten) and fsync it. */
static int write_archive(struct tool_config *cfg, const char *dsn, const char *path, int64_t from,
                         int64_t w, int64_t *written)
{
    *written = 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
    if (fd < 0) {
        tool_err("retention: cannot create the archive %s: %s%s; nothing dropped", path,
                 strerror(errno), errno == EEXIST ? " (it must not exist)" : "");
        return TOOL_FAILED;
    }
    FILE *f = fdopen(fd, "w");
    if (f == NULL) {
        close(fd);
        tool_err("retention: %s: %s; nothing dropped", path, strerror(errno));
        return TOOL_FAILED;
    }
    struct pawl_store *s = NULL;
    char err[512] = "";
    int rc = pawl_store_new(&s, dsn, &cfg->lib.store, err, sizeof err);
    if (rc != 0) {
        fclose(f);
        unlink(path);
        tool_err("retention: cannot open the event log: %s; nothing dropped",
                 err[0] ? err : pawl_strerror(rc));
        return tool_exit_for(rc);
    }
    struct pawl_read_batch b;
    pawl_read_batch_init(&b);
    int64_t after = from - 1;
    int ex = TOOL_OK;
    while (after < w - 1 && ex == TOOL_OK) {
        size_t want = (size_t)TOOL_MIN((int64_t)1000, w - 1 - after);
        rc = pawl_read(s, after, want, &b);
        if (rc == 0 && b.count == 0)
            rc = PAWL_ENOTFOUND;
        if (rc != 0) {
            pawl_store_errmsg(s, err, sizeof err);
            tool_err("retention: reading after index %" PRId64 " for the archive: %s (%s); "
                     "nothing dropped",
                     after, pawl_strerror(rc), err);
            ex = TOOL_FAILED;
            break;
        }
        for (size_t i = 0; i < b.count; i++) {
            if (tool_jsonl_write(f, &b.events[i]) != 0) {
                tool_err("retention: writing %s: %s; nothing dropped", path, strerror(errno));
                ex = TOOL_FAILED;
                break;
            }
            after = b.events[i].index;
            (*written)++;
        }
    }
    pawl_read_batch_fini(&b);
    pawl_store_free(s);
    if (ex == TOOL_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0)) {
        tool_err("retention: flushing %s: %s; nothing dropped", path, strerror(errno));
        ex = TOOL_FAILED;
    }
    if (fclose(f) != 0 && ex == TOOL_OK) {
        tool_err("retention: closing %s: %s; nothing dropped", path, strerror(errno));
        ex = TOOL_FAILED;
    }
    if (ex != TOOL_OK)
        unlink(path);
    return ex;
}

int cmd_retention(struct tool_config *cfg, int argc, const char *const *argv)
{
    if (argc > 0) {
        tool_err("retention: unexpected argument '%s' (the watermark is --before INDEX)", argv[0]);
        return TOOL_USAGE;
    }
    const char *dsn = tool_dsn(cfg);
    if (dsn == NULL)
        return TOOL_NODB;
    const struct tool_opts *o = &cfg->tool;
    const char *archive = o->archive && o->archive[0] ? o->archive : NULL;
    char err[1024] = "";
    int rc;
    /* --before: an index is the new start itself (0: none); another position (position.h) is
     * where the kept events begin after, so the new start is the index just past it. */
    struct tool_pos before = {.kind = TOOL_POS_INDEX, .value = 0};
    if (o->before && o->before[0] &&
        tool_pos_parse("--before", o->before, &before, err, sizeof err) != 0) {
        tool_err("retention: %s", err);
        return TOOL_USAGE;
    }
    int has_before = !(before.kind == TOOL_POS_INDEX && before.value == 0);
    if (archive && !has_before) {
        tool_err("retention: --archive needs --before (what to archive and drop)");
        return TOOL_USAGE;
    }
    if (o->rotate) {
        if (!o->execute) {
            printf("would close the open partition at the oldest running transaction (appends "
                   "and reads wait while it does)\n");
        } else {
            char part[64];
            if ((rc = tool_pgq_rotate(dsn, part, sizeof part, err, sizeof err)) != 0) {
                tool_err("retention: rotate failed: %s", err);
                return tool_exit_for(rc);
            }
            if (part[0])
                printf("rotated: new appends go to partition %s\n", part);
            else
                printf("not rotated: a transaction older than the open partition is still "
                       "running; try again when it has ended\n");
        }
    }
    struct tool_part_row *rows = NULL;
    size_t n = 0;
    int64_t first = 0, last = 0;
    char slow[1024] = "";
    int64_t w = before.value;
    if (before.kind != TOOL_POS_INDEX) {
        int64_t pos = 0;
        if ((rc = tool_pos_resolve(dsn, "--before", &before, &pos, NULL, err, sizeof err)) != 0) {
            tool_err("retention: %s; nothing changed", err);
            return tool_exit_for(rc) == TOOL_USAGE ? TOOL_FAILED : tool_exit_for(rc);
        }
        w = pos + 1;
        printf("--before %s: the new start is index %" PRId64 "\n", o->before, w);
    }
    rc = tool_pgq_retention_plan(dsn, w, &rows, &n, &first, &last, slow, sizeof slow, err,
                                 sizeof err);
    if (rc != 0) {
        tool_err("retention: %s", err);
        return tool_exit_for(rc);
    }
    int ex = TOOL_OK;
    if (w <= 0) {
        printf("the log holds indexes %" PRId64 " .. %" PRId64 "\n", first, last);
        print_parts(rows, n, 0);
        goto out;
    }
    if (w < first || w > last + 1) {
        tool_err("retention: --before %s is outside %" PRId64 " .. %" PRId64
                 " (the log starts at %" PRId64 " and ends at %" PRId64 "); nothing changed",
                 o->before, first, last + 1, first, last);
        ex = TOOL_USAGE;
        goto out;
    }
    int64_t parts = 0, bytes = 0;
    for (size_t i = 0; i < n; i++)
        if (rows[i].drops) {
            parts++;
            bytes += rows[i].bytes;
        }
    printf("%s the log's start from %" PRId64 " to %" PRId64 " (%" PRId64
           " events below it become unreadable); %s %" PRId64 " partitions, %" PRId64 " bytes\n",
           o->execute ? "moving" : "would move", first, w, w - first,
           o->execute ? "dropping" : "would drop", parts, bytes);
    print_parts(rows, n, w);
    if (slow[0]) {
        char shown[1100];
        if (!o->force) {
            tool_err("retention refused: processors below the new start would lose events: %s; "
                     "let them catch up, reset or delete them, or add --force; nothing changed",
                     tool_printable(slow, shown, sizeof shown));
            ex = TOOL_REFUSED;
            goto out;
        }
        tool_note("--force: processors below the new start will fail to read: %s",
                  tool_printable(slow, shown, sizeof shown));
    }
    if (!o->execute) {
        printf("nothing changed: add --execute to apply%s\n",
               archive ? " (the archive is written first)" : "");
        goto out;
    }
    if (archive && w > first) {
        int64_t written = 0;
        if ((ex = write_archive(cfg, dsn, archive, first, w, &written)) != TOOL_OK)
            goto out;
        printf("archived %" PRId64 " events (%" PRId64 " .. %" PRId64 ") to %s\n", written, first,
               w - 1, archive);
    }
    rc = tool_pgq_retention_drop(dsn, w, o->force, &parts, &bytes, err, sizeof err);
    if (rc == PAWL_EBUSY) {
        tool_err("retention refused: %s; nothing changed", err);
        ex = TOOL_REFUSED;
        goto out;
    }
    if (rc != 0) {
        tool_err("retention failed: %s; nothing changed", err);
        ex = tool_exit_for(rc);
        goto out;
    }
    printf("the log starts at %" PRId64 ": dropped %" PRId64 " partitions, %" PRId64 " bytes\n", w,
           parts, bytes);
out:
    free(rows);
    return ex;
}
