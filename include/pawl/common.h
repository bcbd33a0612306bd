/*
 * pawl/common.h — error codes, allocator hooks and logging shared by every pawl module.
 *
 * Every pawl function that can fail returns int: 0 on success, a negative PAWL_E* code on
 * failure. "Would block, try again" is PAWL_EAGAIN, a result rather than an error. Detailed text
 * (a server's message, a SQLSTATE) stays on the object that failed and is read from there.
 *
 * The allocator hooks and the log sink are process-wide. Set them before creating any pawl
 * object; they are read without synchronisation afterwards.
 */
#ifndef PAWL_COMMON_H
#define PAWL_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/*
 * PAWL_API marks the public functions: the library is built with hidden visibility by default,
 * so libpawl.so exports exactly the declarations carrying this mark (a test compares its dynamic
 * symbol table with the headers). A function without it is internal to the library.
 */
#ifndef PAWL_API
#if defined(__GNUC__) || defined(__clang__)
#define PAWL_API __attribute__((visibility("default")))
#else
#define PAWL_API
#endif
#endif

/*
 * The choices of an ENUM tunable in the tunable lists (PAWL_STORE_TUNABLES,
 * PAWL_PROCESSOR_TUNABLES): a NULL-terminated array of names, in the order of the field's values.
 */
#define PAWL_CHOICES(...) ((const char *const[]){__VA_ARGS__, NULL})

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The error table: X(name, value, text). Add new codes at the end of the list; values never
 * change once released because embedders may persist or compare them.
 *
 * Bad options and arguments, everywhere in the library:
 *   PAWL_ERANGE  a number outside its documented range, including a range bounded by another
 *                option (backoff_max_ms at least backoff_min_ms, reconnect_max_ms at least
 *                reconnect_min_ms);
 *   PAWL_EINVAL  anything malformed (a NULL that is required, a name with a forbidden
 *                character, a DSN that does not parse, an unknown enum value passed as an
 *                argument) or options that contradict each other (a read DSN equal to the
 *                primary DSN).
 */
#define PAWL_ERRORS(X)                                                                             \
    X(PAWL_OK, 0, "success")                                                                       \
    X(PAWL_EINVAL, -1, "invalid argument")                                                         \
    X(PAWL_ENOMEM, -2, "out of memory")                                                            \
    X(PAWL_EAGAIN, -3, "would block, try again")                                                   \
    X(PAWL_EALREADY, -4, "already completed")                                                      \
    X(PAWL_ECANCELED, -5, "canceled")                                                              \
    X(PAWL_ETIMEDOUT, -6, "timed out")                                                             \
    X(PAWL_ESHUTDOWN, -7, "shut down")                                                             \
    X(PAWL_ESYS, -8, "system call failed")                                                         \
    X(PAWL_ENOTSUP, -9, "not supported here")                                                      \
    X(PAWL_ECONN, -10, "cannot connect to the database, or the connection was lost")               \
    X(PAWL_ESQL, -11, "the database reported an error")                                            \
    X(PAWL_ECONFLICT, -12, "stream sequence conflict")                                             \
    X(PAWL_ETOOBIG, -13, "too big")                                                                \
    X(PAWL_EINDOUBT, -14, "connection lost during commit: outcome unknown")                        \
    X(PAWL_ESCHEMA, -15, "database schema is newer than this pawl or missing")                     \
    X(PAWL_ECLAIM, -16, "segment claim lost or not held")                                          \
    X(PAWL_EHANDLER, -17, "event handler failed")                                                  \
    X(PAWL_ECHECKPOINT, -18, "checkpoint failed")                                                  \
    X(PAWL_ENOTFOUND, -19, "not found")                                                            \
    X(PAWL_EBUSY, -20, "busy")                                                                     \
    X(PAWL_ERANGE, -21, "value out of range")                                                      \
    X(PAWL_EPERM, -22, "permission denied")                                                        \
    X(PAWL_ETRUNCATED, -23, "retention dropped these events (below the low-watermark)")            \
    X(PAWL_EPOISON, -24, "the event can never be handled (poison)")                                \
    X(PAWL_EIDUSED, -25, "an event id is already in the log for other events")                     \
    X(PAWL_EFILTER, -26, "the processor was created with another filter")

enum pawl_error {
#define PAWL_ERROR_ENUM_(name, value, text) name = value,
    PAWL_ERRORS(PAWL_ERROR_ENUM_)
#undef PAWL_ERROR_ENUM_
};

/*
 * Error text. A failing call returns its code, and pawl_strerror(code) gives the code's fixed
 * text. The detail of a failure (which option, the server's SQLSTATE and message, the owners of
 * a busy segment) comes back one way, by what failed:
 *   - a call on an object: pawl_<object>_errmsg(obj, buf, len) copies the text of the last
 *     failure on obj into buf ("" when none) and returns buf: pawl_store_errmsg,
 *     pawl_source_errmsg, pawl_tokens_errmsg. Copied, because objects are shared by threads;
 *   - a call that has no object yet (a constructor, the schema functions): its `err, errlen`
 *     parameters, filled the same way;
 *   - an asynchronous result (struct pawl_append_result): its `message` field, since the
 *     object's last failure may by then be another call's.
 * The log sink (pawl_log_set_sink) is for operators: no caller needs it to learn why a call
 * failed. A handler hands its reason the other way, with pawl_ctx_error.
 */

/* A static string describing code; never NULL ("unknown error" for codes not in the table). */
PAWL_API const char *pawl_strerror(int code);

/* The symbolic name of code ("PAWL_ECONFLICT"); never NULL. */
PAWL_API const char *pawl_errname(int code);

/*
 * Allocator hooks. The library allocates only through these; by default they are the C
 * library's. Tools and benchmarks link jemalloc instead (which replaces malloc itself). Any hook
 * left NULL keeps the current one. Call before creating any pawl object.
 */
struct pawl_allocator {
    void *(*malloc)(size_t size);
    void *(*calloc)(size_t n, size_t size);
    void *(*realloc)(void *p, size_t size);
    void (*free)(void *p);
};
PAWL_API void pawl_set_allocator(const struct pawl_allocator *a);

/* Logging. Levels in increasing severity. */
enum pawl_log_level {
    PAWL_LOG_DEBUG = 0,
    PAWL_LOG_INFO = 1,
    PAWL_LOG_WARN = 2,
    PAWL_LOG_ERROR = 3,
    PAWL_LOG_OFF = 4,
};

enum pawl_log_format {
    PAWL_LOG_TEXT = 0, /* "2026-11-30T06:54:52.123Z WARN  finalizer: message" */
    PAWL_LOG_JSON = 1, /* {"ts":"...","level":"warn","module":"finalizer","msg":"..."} */
};

/*
 * A log sink. Called on whichever thread logs, possibly several at once; msg is borrowed for the
 * duration of the call. The default sink writes one line to stderr.
 *
 * The level is process-wide and starts at PAWL_LOG_WARN: an embedding program hears only of
 * warnings and errors until it asks for more, with pawl_log_set_level or pawl_config_apply_log
 * (a struct pawl_config's log-level defaults to info, as in the pawl tool).
 */
typedef void (*pawl_log_fn)(void *ud, enum pawl_log_level level, const char *module,
                            const char *msg);

PAWL_API void pawl_log_set_sink(pawl_log_fn fn, void *ud); /* NULL restores the stderr sink */
PAWL_API void pawl_log_set_level(enum pawl_log_level level);
PAWL_API void pawl_log_set_format(enum pawl_log_format format);
PAWL_API enum pawl_log_format pawl_log_get_format(void);
PAWL_API enum pawl_log_level pawl_log_get_level(void);

/* Log a formatted message; messages below the current level cost one relaxed load. */
PAWL_API void pawl_log(enum pawl_log_level level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
PAWL_API void pawl_logv(enum pawl_log_level level, const char *module, const char *fmt, va_list ap);

/* Parse "debug", "info", "warn", "error", "off"; PAWL_EINVAL otherwise. */
PAWL_API int pawl_log_level_parse(const char *s, enum pawl_log_level *out);

/*
 * The default sink: one line on stderr in the current format, as the library writes it when no
 * sink is set. For a sink of the caller's that leaves some lines out and passes the rest on as
 * they would have been written. Any thread; a line is written whole (stderr is locked for it).
 */
PAWL_API void pawl_log_stderr(enum pawl_log_level level, const char *module, const char *msg);

/*
 * Untrusted text for terminals and log lines. Event fields (stream ids, types, ids, payloads)
 * and handlers' messages are whatever their writers sent; printed as they are, they could move
 * the cursor, retitle the window (OSC) or forge a line (CR, LF). pawl_printable writes the n
 * bytes at s (no NUL needed; NULL as "") into out as text that a terminal shows as it is: C0
 * controls and DEL as \xNN, the C1 controls in their UTF-8 form as \u00NN, a backslash doubled,
 * anything else unchanged. Cut with "..." to fit outlen (out is the caller's);
 * PAWL_PRINTABLE_SIZE(n) always fits n bytes. Returns out (NUL-terminated when outlen > 0).
 * The library's own log lines quote such text this way.
 */
#define PAWL_PRINTABLE_SIZE(n) (4 * (size_t)(n) + 4)
PAWL_API const char *pawl_printable(const void *s, size_t n, char *out, size_t outlen);
/* The same for a NUL-terminated string (NULL as ""). */
PAWL_API const char *pawl_printable_str(const char *s, char *out, size_t outlen);

/* Monotonic clock in nanoseconds (CLOCK_MONOTONIC). */
PAWL_API int64_t pawl_now_ns(void);
/* Wall clock in microseconds since the Unix epoch (CLOCK_REALTIME). */
PAWL_API int64_t pawl_wall_us(void);

#ifdef __cplusplus
}
#endif
#endif
