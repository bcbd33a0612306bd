/*
 * handler_sink.h — the handlers of `pawl run` that write outside the database: print (JSON lines
 * on stdout) and exec (JSON lines to a command that acknowledges them).
 *
 * Both are checkpointing units (pawl/checkpoint.h), so a segment's token is stored only once the
 * output of every event up to it has left the process: for print, written to stdout (and fsynced
 * with --output-fsync when stdout is a regular file); for exec, acknowledged by the command.
 * `pawl run` pairs the unit with its plain counting handler, which puts the processor in auto
 * mode: every batch (and an idle segment's periodic advance) asks the unit to cover its end.
 * handle() only formats the event into the segment's buffer; on_checkpoint_advanced hands the
 * buffer to the sink's own I/O thread and returns a future that thread completes once the
 * output is written or acknowledged. No pool worker ever waits for stdout or the command.
 *
 * exec protocol. One long-lived child per claimed segment (the segment's events stay in order
 * and a slow or failing command stalls only its segment), started on the segment's first batch
 * with PAWL_PROCESSOR, PAWL_SEGMENT, PAWL_SEGMENT_MASK and PAWL_NODE in its environment, in a
 * process group of its own (a terminal's Ctrl-C reaches pawl, which then stops the children in
 * order). Unless pass_secrets, the connection secrets are not in its environment (PGPASSWORD
 * and every PAWL_*DSN variable: tool_sink_env_secret; the rest of pawl's environment is).
 * Its stdin gets one JSON line per event: the `pawl tail --json` object plus "segment",
 * "replay", "attempt" (1, or the how-manieth time this process hands the event to a command
 * after deliveries that failed), "dead_letter": true on a dead letter being retried, and, on the
 * last line of a batch, "batch_end": true. For each batch_end line the child prints `ok INDEX`
 * (that line's index) on stdout once the batch is handled; `ok N` earlier is allowed (progress;
 * a retry's dead letters, whose indexes lie below the live ones, are acknowledged by their own
 * indexes, in order). `fail INDEX REASON` or `poison INDEX REASON` says that the events before
 * INDEX in the batch are handled and event INDEX is not (the child then skips the batch's other
 * lines up to batch_end): the processor is told (pawl_processor_event_failed: an attempt of that
 * event, or poison) and the batch's future fails; the child keeps running when the batch was
 * sent whole, and within the claim events it has handled are not sent to it again. Anything
 * else on its stdout — `fail REASON` without an index, a malformed line, an ack or an INDEX
 * outside what is waiting — an exit, or no ack within --exec-ack-timeout fails the batch: the
 * child is killed, the batch rolls back, and the segment is delivered again after the
 * processor's back-off to a new child. At release (stop, rebalancing) the child's stdin is
 * closed and it is given --exec-ack-timeout to exit before it is killed.
 *
 * Threads: the handler and callbacks run on the processor's workers; the sink's thread does all
 * I/O. tool_sink_new / _free from the controlling thread; free only after pawl_processor_stop.
 */
#ifndef PAWL_TOOL_HANDLER_SINK_H
#define PAWL_TOOL_HANDLER_SINK_H

#include "pawl.h"

#include <stdint.h>

enum tool_sink_kind {
    TOOL_SINK_PRINT = 0,
    TOOL_SINK_EXEC = 1,
};

struct tool_sink_opts {
    enum tool_sink_kind kind;
    int fd;                  /* print: where lines go (1) */
    int fsync;               /* print: fsync fd before a token is stored (regular files) */
    const char *const *argv; /* exec: the command, NULL-terminated; borrowed until free */
    int64_t ack_timeout_ms;  /* exec: longest wait for a batch's ack, and for an exit */
    const char *processor;   /* exec: PAWL_PROCESSOR for the child; borrowed */
    int pass_secrets;        /* exec: keep PGPASSWORD and PAWL_*DSN in the child's environment */
};

struct tool_sink_stats {
    uint64_t events;     /* handled (formatted) */
    uint64_t replays;    /* of those, replays */
    uint64_t lines_out;  /* lines written (print) or sent (exec) */
    uint64_t batches_ok; /* shipments written / acknowledged */
    uint64_t failures;   /* shipments failed (write error, exit, nack, malformed, time-out) */
    uint64_t starts;     /* exec: children started */
};

struct tool_sink;

/* Start the sink's thread. PAWL_EINVAL (with err) for bad options, PAWL_ESYS, PAWL_ENOMEM. */
int tool_sink_new(struct tool_sink **out, const struct tool_sink_opts *o, char *err, size_t errlen);
/* The handler to give the processor (borrows s). */
struct pawl_handler tool_sink_handler(struct tool_sink *s, const char *name);
/* The node id children see as PAWL_NODE (copied); set before the processor starts. */
void tool_sink_set_node(struct tool_sink *s, const char *node);
/* exec: the processor to tell which event the command failed (pawl_processor_event_failed);
 * borrowed, set before it starts; it must outlive the sink's last shipment (stop it first). */
void tool_sink_set_processor(struct tool_sink *s, struct pawl_processor *p);
void tool_sink_stats(struct tool_sink *s, struct tool_sink_stats *out);
/* 1 when the environment entry "NAME=value" (or a bare NAME) is a connection secret the exec
 * child does not get without pass_secrets: PGPASSWORD, or PAWL_*DSN (PAWL_DSN, PAWL_READ_DSN,
 * ...: a DSN may carry a password). PGPASSFILE and PGSERVICEFILE name files and stay. */
int tool_sink_env_secret(const char *entry);

/*
 * Stopping (`pawl run`, from the controlling thread). tool_sink_stopping says the node is
 * stopping: a batch that fails from then on is not "delivered again after the back-off" in the
 * log (the next owner of its segment gets it), and the sink's thread keeps, for tool_sink_waits,
 * what each running command is doing. tool_sink_waits copies that into out[0..max) and returns
 * how many commands run (a snapshot of the thread's last round). tool_sink_abandon sends SIGTERM
 * to every command still running (to its process group), for a stop given up: it writes their
 * pids and segments into pids ("1234 (segment 0), ...") and returns how many.
 */
struct tool_sink_wait {
    struct pawl_segment seg;
    int pid;
    int closing;         /* its input ended: waiting for it to exit */
    int64_t upto;        /* waiting for its ack of the batch ending at this index (0: none) */
    int64_t deadline_ns; /* pawl_now_ns() when that wait fails (--exec-ack-timeout); 0: none */
};
void tool_sink_stopping(struct tool_sink *s);
size_t tool_sink_waits(struct tool_sink *s, struct tool_sink_wait *out, size_t max);
size_t tool_sink_abandon(struct tool_sink *s, char *pids, size_t len);

/* Stops the thread (children still running are killed), frees. NULL is a no-op. */
void tool_sink_free(struct tool_sink *s);

#endif
