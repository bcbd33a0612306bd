/*
 * position.h — one way to say where to start, for every command that takes a position in the
 * log: `tail --from`, `run --initial-token`, `reset --to` and `retention --before`.
 *
 * A position is a point between two events, given as the index of the event before it (a
 * token: reading "after" it, a processor at it). Every such flag accepts the same text:
 *
 *   start                 before the first event: pawl_api.first_index() - 1 (0 unless retention
 *                         moved the log's start)
 *   end                   after the last finalized event: pawl_api.last_index()
 *   N                     the index N itself (digits, N >= 0)
 *   -N                    N events before the end: last_index - N, never before start
 *   -15m, -2h, -1d12h     a time ago: a duration with a unit (ms, s, m, h, and d for days), before
 *                         the database server's clock (the clock appended_at comes from)
 *   2026-12-05T10:00:00Z  an RFC 3339 time, with Z or an offset (+01:00); a space may stand for
 *                         the T, fractions of a second are kept to the microsecond
 *
 * -15 is an offset (fifteen events), -15m a time (fifteen minutes). A time means the position
 * just before the first event appended at or after it, end when there is none: it is found by
 * a binary search over the log's indexes, reading one event's appended_at per step through
 * pawl_api.read (about log2(events) reads; pawl_api is all a reader role may use). appended_at
 * is when the appending transaction began, and indexes are given after commit, so appended_at
 * rises with the index except where appending transactions overlap: the position is exact when
 * no append was running at the time given; otherwise the events of the appends running then,
 * and events appended while they ran, may fall on either side of it (a transaction that began
 * at 09:59 and committed at 10:01 gets its index after events appended at 10:00; the search
 * may stop before or after either).
 *
 * Parsing needs no database (commands refuse a bad value, exit 2, before connecting);
 * resolving asks it.
 */
#ifndef PAWL_TOOL_POSITION_H
#define PAWL_TOOL_POSITION_H

#include <stddef.h>
#include <stdint.h>

enum tool_pos_kind {
    TOOL_POS_START = 0, /* before the first event */
    TOOL_POS_END,       /* after the last finalized event */
    TOOL_POS_INDEX,     /* value: the index */
    TOOL_POS_OFFSET,    /* value: N of -N, events before the end */
    TOOL_POS_AGO,       /* value: microseconds before the server's now */
    TOOL_POS_TIME,      /* value: microseconds since 1970-01-01T00:00:00Z */
};

struct tool_pos {
    enum tool_pos_kind kind;
    int64_t value;
};

/* The forms, for help texts and messages. */
#define TOOL_POS_FORMS                                                                             \
    "start, end, an index N, -N (N events before the end), a time ago with a unit (-15m, -2h, "    \
    "-1d) or an RFC 3339 time (2026-12-05T10:00:00Z)"

/*
 * Parse text as a position. flag names it in messages ("--from", or "PAWL_INITIAL_TOKEN
 * (--initial-token)"). 0, or PAWL_EINVAL / PAWL_ERANGE with a message naming the flag, the
 * value and the accepted forms.
 */
int tool_pos_parse(const char *flag, const char *text, struct tool_pos *out, char *err,
                   size_t errlen);

/* An RFC 3339 time (see above) in microseconds since the epoch; PAWL_EINVAL if it is not one. */
int tool_pos_parse_time(const char *text, int64_t *us);

/* The log as a resolution sees it. */
struct tool_pos_span {
    int64_t first;  /* pawl_api.first_index(): the lowest index held (1 unless retention) */
    int64_t last;   /* pawl_api.last_index(): the highest final index (0: empty) */
    int64_t now_us; /* the server's clock */
};

/* The time a TOOL_POS_AGO or TOOL_POS_TIME position means, in microseconds since the epoch. */
int64_t tool_pos_time_us(const struct tool_pos *p, const struct tool_pos_span *span);

/*
 * The index of a position of any kind but a time (START, END, INDEX, OFFSET) within span:
 * start is first - 1, end last, -N max(last - N, first - 1); an index is itself (the commands
 * decide what to do with one outside the log). PAWL_EINVAL for a time.
 */
int tool_pos_at(const struct tool_pos *p, const struct tool_pos_span *span, int64_t *pos);

/*
 * The binary search behind a time: the position just before the first index in
 * [first, last] whose appended_at (at(arg, index, &us)) is >= t_us, assuming appended_at does
 * not fall as the index rises; first - 1 when every event qualifies, last when none does.
 * *probes (optional) counts the calls of at. An error of at is returned as it is.
 */
int tool_pos_search(int64_t first, int64_t last, int64_t t_us,
                    int (*at)(void *arg, int64_t index, int64_t *us), void *arg, int64_t *pos,
                    int *probes);

/*
 * Resolve p against the log at dsn (one connection, closed before returning): *pos gets the
 * position; span (optional) the log's bounds and clock. An index needs no database unless
 * span is asked for. PAWL_ECONN when the database cannot be reached, PAWL_ESCHEMA when it
 * has no pawl schema, PAWL_ETRUNCATED or PAWL_ESQL for a query the server refused; err says
 * what, naming flag.
 */
int tool_pos_resolve(const char *dsn, const char *flag, const struct tool_pos *p, int64_t *pos,
                     struct tool_pos_span *span, char *err, size_t errlen);

/* For messages: "2026-12-05T10:00:00.250000Z" (UTC) of us, into out; returns out. */
const char *tool_pos_format_time(int64_t us, char *out, size_t outlen);

#endif
