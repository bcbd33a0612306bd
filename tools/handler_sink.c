/*
 * handler_sink.c — see handler_sink.h for the contract. Inside:
 *
 * A chan is the sink's state for one claim of one segment. Its worker side (the line buffer) is
 * touched only by the segment's steps, which never overlap; the processor finds it again through
 * a small hash table under s->mu (by segment id and mask: one claim of a segment at a time). At
 * release the chan leaves the table and its last shipment (with `close`) hands it to the I/O
 * thread for good, which frees it once the shipment is done (and, for exec, the child has exited).
 *
 * A ship is one checkpoint's output: the lines buffered since the last one (possibly none), the
 * token to report, and the future to complete. Ships pass from the workers to the I/O thread
 * through s->q (under s->mu, woken by an eventfd) and are completed in the order they were queued
 * per chan: an empty ship completes once every ship before it on its chan has, so a reported
 * token never covers a line that is not out yet.
 *
 * The I/O thread: print writes every queued ship to the output in queue order, fsyncs once for
 * all of them when asked, then completes them (a group commit). exec keeps each chan's child:
 * non-blocking pipes in one epoll set, a send queue and an ack queue per chan, a deadline for
 * the oldest unacknowledged ship, and a kill-and-fail path for every way a child can go wrong.
 */
#include "handler_sink.h"

#include "jsonl.h"
#include "tool.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define MOD "handler"
#define NBUCKETS 256

struct ship {
    struct ship *next;
    struct chan *ch;
    char *data; /* owned; NULL when empty */
    size_t len;
    int64_t last;   /* the last line's event index; 0 when empty */
    int64_t report; /* the token the future completes with */
    int64_t deadline_ns;
    struct pawl_future *f; /* one reference, the sink's */
    int close;             /* the release's ship: the chan ends after it */
    int64_t *idx;          /* exec: the lines' event indexes, in order (owned) */
    size_t nidx;
    int letters;   /* exec: dead letters being retried (their indexes lie below the live ones, so
                    * the command acknowledges them line by line, not by the live high-water) */
    size_t lacked; /* letters: lines acknowledged so far */
};

struct lineidx {
    int64_t index;
    size_t off;
    int letter; /* a dead letter being retried */
};

/* An event whose delivery to the command failed: its next line says "attempt": failed + 1. */
struct redelivery {
    int64_t index;
    struct pawl_segment seg;
    uint32_t failed;
};
#define REDELIVERY_MAX 65536

struct chan {
    struct pawl_segment seg;
    struct chan *hnext; /* hash chain, under s->mu */
    /* Worker side: the lines not shipped yet. */
    char *buf;
    size_t len, cap;
    struct lineidx *lines;
    size_t nlines, lcap;
    /* I/O thread side. */
    struct chan *io_next;
    int io_listed;
    pid_t pid;
    int in_fd, out_fd;
    struct ship *sq, **sq_tail; /* to send; the head is sent from sent_off on */
    size_t sent_off;
    struct ship *aq, **aq_tail; /* sent, waiting for their ack */
    int64_t sent_max, acked;
    char rbuf[512];
    size_t rlen;
    int closing; /* the close ship is done: stdin closed, waiting for the child to exit */
    int64_t close_deadline_ns;
    /* The highest live index the command has handled in this claim (acknowledged, or before an
     * event it failed). Written by the I/O thread, read by the worker, which never hands such an
     * event to the command again: a batch handled again after a failed event is delivered
     * again to the processor's other handlers only. */
    _Atomic int64_t handled;
};

struct tool_sink {
    struct tool_sink_opts o;
    char node[PAWL_OWNER_MAX + 1];
    int out_regular;
    pthread_mutex_t mu;
    struct chan *table[NBUCKETS];
    struct ship *q, **q_tail; /* ships for the I/O thread, under mu */
    int stop;                 /* under mu */
    int efd, epfd;
    pthread_t thr;
    int thr_started;
    struct chan *io_chans;       /* I/O thread only */
    struct pawl_processor *proc; /* exec: told which event the command failed; set before start */
    /* exec: deliveries that failed, by event index (under amu; nredeliv is also read without
     * it, as a hint that the table is empty). */
    pthread_mutex_t amu;
    struct redelivery *redeliv;
    _Atomic size_t nredeliv;
    size_t redeliv_cap;
    /* Relaxed counters: statistics only. */
    _Atomic uint64_t events, replays, lines_out, batches_ok, failures, starts;
    /* exec: the running children (under kmu): one entry per child from its spawn until just
     * before it is reaped, so a pid here is never one the system has handed out again; while
     * stopping, the I/O thread also keeps what each one is waited for in it (tool_sink_waits). */
    pthread_mutex_t kmu;
    struct tool_sink_wait *kids;
    size_t nkids, kids_cap;
    _Atomic int stopping; /* tool_sink_stopping was called (relaxed: a flag for messages) */
};

static const struct pawl_checkpointing sink_ckpt;

/* ---------------------------------------------------------------------------------------------
 * Worker side
 * ------------------------------------------------------------------------------------------ */

static unsigned bucket(struct pawl_segment seg)
{
    return (seg.id * 2654435761u ^ seg.mask) % NBUCKETS;
}

static struct chan *chan_find(struct tool_sink *s, struct pawl_segment seg)
{
    pthread_mutex_lock(&s->mu);
    struct chan *c = s->table[bucket(seg)];
    while (c && (c->seg.id != seg.id || c->seg.mask != seg.mask))
        c = c->hnext;
    pthread_mutex_unlock(&s->mu);
    return c;
}

static int reserve(struct chan *c, size_t more)
{
    if (c->len + more <= c->cap)
        return 0;
    size_t cap = c->cap ? c->cap : 4096;
    while (cap < c->len + more)
        cap *= 2;
    char *p = realloc(c->buf, cap);
    if (p == NULL)
        return PAWL_ENOMEM;
    c->buf = p;
    c->cap = cap;
    return 0;
}

/* The attempt the next line of event index is (1: its first delivery by this process). */
static uint32_t redeliv_attempt(struct tool_sink *s, int64_t index)
{
    /* Relaxed: a hint; a failure being recorded right now concerns a ship already out. */
    if (atomic_load_explicit(&s->nredeliv, memory_order_relaxed) == 0)
        return 1;
    uint32_t n = 1;
    pthread_mutex_lock(&s->amu);
    size_t k = atomic_load_explicit(&s->nredeliv, memory_order_relaxed);
    for (size_t i = 0; i < k; i++)
        if (s->redeliv[i].index == index) {
            n += s->redeliv[i].failed;
            break;
        }
    pthread_mutex_unlock(&s->amu);
    return n;
}

/* I/O thread: the deliveries of idx[0..n) failed; they come again. */
static void redeliv_failed(struct tool_sink *s, struct pawl_segment seg, const int64_t *idx,
                           size_t n)
{
    pthread_mutex_lock(&s->amu);
    size_t k = atomic_load_explicit(&s->nredeliv, memory_order_relaxed);
    for (size_t j = 0; j < n; j++) {
        size_t i = 0;
        while (i < k && s->redeliv[i].index != idx[j])
            i++;
        if (i < k) {
            s->redeliv[i].failed++;
            continue;
        }
        if (k == REDELIVERY_MAX) {
            /* Forget the oldest half (events parked, or handled by another node). */
            memmove(s->redeliv, s->redeliv + k / 2, (k - k / 2) * sizeof *s->redeliv);
            k -= k / 2;
        }
        if (k == s->redeliv_cap) {
            size_t cap = s->redeliv_cap ? s->redeliv_cap * 2 : 64;
            struct redelivery *r = realloc(s->redeliv, cap * sizeof *r);
            if (r == NULL)
                break; /* the count is informational */
            s->redeliv = r;
            s->redeliv_cap = cap;
        }
        s->redeliv[k++] = (struct redelivery){idx[j], seg, 1};
    }
    atomic_store_explicit(&s->nredeliv, k, memory_order_relaxed);
    pthread_mutex_unlock(&s->amu);
}

/* I/O thread: sh was acknowledged; its events, and for live lines every earlier event of its
 * segment (handled, parked or skipped), are done. */
static void redeliv_done(struct tool_sink *s, const struct ship *sh)
{
    if (atomic_load_explicit(&s->nredeliv, memory_order_relaxed) == 0 || sh->nidx == 0)
        return;
    pthread_mutex_lock(&s->amu);
    size_t k = atomic_load_explicit(&s->nredeliv, memory_order_relaxed);
    struct pawl_segment seg = sh->ch->seg;
    for (size_t i = 0; i < k;) {
        const struct redelivery *r = &s->redeliv[i];
        int done =
            !sh->letters && r->seg.id == seg.id && r->seg.mask == seg.mask && r->index <= sh->last;
        for (size_t j = 0; j < sh->nidx && !done; j++)
            done = sh->idx[j] == r->index;
        if (done)
            s->redeliv[i] = s->redeliv[--k];
        else
            i++;
    }
    atomic_store_explicit(&s->nredeliv, k, memory_order_relaxed);
    pthread_mutex_unlock(&s->amu);
}

static int sink_handle(void *self, struct pawl_event_ctx *ctx)
{
    struct tool_sink *s = self;
    struct pawl_segment seg = pawl_ctx_segment(ctx);
    struct chan *c = chan_find(s, seg);
    if (c == NULL)
        return PAWL_EINVAL; /* a delivery outside a claim: cannot happen */
    const struct pawl_event *e = pawl_ctx_event(ctx);
    int replay = pawl_ctx_is_replay(ctx);
    int letter = pawl_ctx_is_dead_letter(ctx);
    /* Acquire: pairs with the I/O thread's store after the command's word on these events. */
    if (s->o.kind == TOOL_SINK_EXEC && !letter &&
        e->index <= atomic_load_explicit(&c->handled, memory_order_acquire))
        return 0; /* the command has handled it in this claim (a batch handled again) */
    /* Lines buffered at or after this event, or of the other kind (live or dead letter), are
     * from a try that was rolled back before its checkpoint: the processor hands them again. */
    while (c->nlines > 0 && (c->lines[c->nlines - 1].index >= e->index ||
                             c->lines[c->nlines - 1].letter != letter)) {
        c->nlines--;
        c->len = c->lines[c->nlines].off;
    }
    json_t *o = tool_jsonl_object(e);
    if (o == NULL)
        return PAWL_ENOMEM;
    if (s->o.kind == TOOL_SINK_EXEC) {
        json_object_set_new(o, "segment", json_integer(seg.id));
        json_object_set_new(o, "replay", json_boolean(replay));
        json_object_set_new(o, "attempt", json_integer(redeliv_attempt(s, e->index)));
        if (letter)
            json_object_set_new(o, "dead_letter", json_true());
    } else if (replay) {
        json_object_set_new(o, "replay", json_true());
    }
    size_t need = json_dumpb(o, NULL, 0, JSON_COMPACT | JSON_PRESERVE_ORDER);
    int rc = need == 0 ? PAWL_ENOMEM : reserve(c, need + 1);
    if (rc == 0 && c->nlines == c->lcap) {
        size_t n = c->lcap ? c->lcap * 2 : 256;
        struct lineidx *l = realloc(c->lines, n * sizeof *l);
        if (l == NULL)
            rc = PAWL_ENOMEM;
        else {
            c->lines = l;
            c->lcap = n;
        }
    }
    if (rc == 0) {
        c->lines[c->nlines++] = (struct lineidx){e->index, c->len, letter};
        json_dumpb(o, c->buf + c->len, need, JSON_COMPACT | JSON_PRESERVE_ORDER);
        c->len += need;
        c->buf[c->len++] = '\n';
    }
    json_decref(o);
    if (rc)
        return rc;
    /* Relaxed: statistics. */
    atomic_fetch_add_explicit(&s->events, 1, memory_order_relaxed);
    if (replay)
        atomic_fetch_add_explicit(&s->replays, 1, memory_order_relaxed);
    return 0;
}

static void queue_ship(struct tool_sink *s, struct ship *sh)
{
    pthread_mutex_lock(&s->mu);
    *s->q_tail = sh;
    s->q_tail = &sh->next;
    pthread_mutex_unlock(&s->mu);
    uint64_t one = 1;
    ssize_t w = write(s->efd, &one, sizeof one);
    (void)w; /* an eventfd write fails only when its counter is full, and then it is woken */
}

/*
 * Hand the lines with index <= upto (all of them when upto is INT64_MAX) to the I/O thread and
 * drop the rest; the future completes with report once they are out.
 */
static struct pawl_future *ship_lines(struct tool_sink *s, struct chan *c, int64_t upto,
                                      int64_t report, int close)
{
    size_t keep = 0;
    while (keep < c->nlines && c->lines[keep].index <= upto)
        keep++;
    size_t len = keep == 0 ? 0 : keep < c->nlines ? c->lines[keep].off : c->len;
    struct ship *sh = calloc(1, sizeof *sh);
    struct pawl_future *f = pawl_future_new();
    if (sh == NULL || f == NULL) {
        free(sh);
        if (f)
            pawl_future_fail(f, PAWL_ENOMEM, NULL);
        return f;
    }
    if (len > 0) {
        sh->data = malloc(len);
        if (sh->data == NULL) {
            free(sh);
            pawl_future_fail(f, PAWL_ENOMEM, NULL);
            return f;
        }
        memcpy(sh->data, c->buf, len);
        sh->len = len;
        sh->last = c->lines[keep - 1].index;
        if (s->o.kind == TOOL_SINK_EXEC) {
            sh->idx = malloc(keep * sizeof *sh->idx);
            if (sh->idx == NULL) {
                free(sh->data);
                free(sh);
                pawl_future_fail(f, PAWL_ENOMEM, NULL);
                return f;
            }
            for (size_t i = 0; i < keep; i++)
                sh->idx[i] = c->lines[i].index;
            sh->nidx = keep;
            sh->letters = c->lines[keep - 1].letter;
            /* Mark the batch's last line: the child acknowledges it. The line ends in "}\n". */
            static const char tail[] = ",\"batch_end\":true}\n";
            char *d = realloc(sh->data, len - 2 + sizeof tail - 1);
            if (d == NULL) {
                free(sh->idx);
                free(sh->data);
                free(sh);
                pawl_future_fail(f, PAWL_ENOMEM, NULL);
                return f;
            }
            memcpy(d + len - 2, tail, sizeof tail - 1);
            sh->data = d;
            sh->len = len - 2 + sizeof tail - 1;
        }
    }
    /* Everything buffered is shipped or dropped (lines above upto belong to a batch that was
     * rolled back; they are delivered again). */
    c->len = 0;
    c->nlines = 0;
    sh->ch = c;
    sh->report = report;
    sh->close = close;
    sh->f = pawl_future_ref(f);
    queue_ship(s, sh);
    return f;
}

static int sink_claimed(void *self, struct pawl_segment seg, struct pawl_trigger *trigger)
{
    (void)trigger; /* reached through the event context */
    struct tool_sink *s = self;
    struct chan *c = calloc(1, sizeof *c);
    if (c == NULL)
        return PAWL_ENOMEM;
    c->seg = seg;
    c->in_fd = c->out_fd = -1;
    c->sq_tail = &c->sq;
    c->aq_tail = &c->aq;
    pthread_mutex_lock(&s->mu);
    unsigned b = bucket(seg);
    c->hnext = s->table[b];
    s->table[b] = c;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static struct pawl_future *sink_advanced(void *self, struct pawl_segment seg, int64_t requested)
{
    struct tool_sink *s = self;
    struct chan *c = chan_find(s, seg);
    if (c == NULL)
        return NULL;
    return ship_lines(s, c, INT64_MAX, requested, 0);
}

static struct pawl_future *sink_released(void *self, struct pawl_segment seg, int64_t up_to)
{
    struct tool_sink *s = self;
    pthread_mutex_lock(&s->mu);
    struct chan **pp = &s->table[bucket(seg)];
    while (*pp && ((*pp)->seg.id != seg.id || (*pp)->seg.mask != seg.mask))
        pp = &(*pp)->hnext;
    struct chan *c = *pp;
    if (c)
        *pp = c->hnext;
    pthread_mutex_unlock(&s->mu);
    if (c == NULL)
        return NULL;
    /* From here on the chan is the I/O thread's. */
    return ship_lines(s, c, up_to, up_to, 1);
}

static const struct pawl_checkpointing sink_ckpt = {
    .on_segment_claimed = sink_claimed,
    .on_checkpoint_advanced = sink_advanced,
    .on_segment_released = sink_released,
};

/* ---------------------------------------------------------------------------------------------
 * I/O thread: shared parts
 * ------------------------------------------------------------------------------------------ */

static void ship_done(struct tool_sink *s, struct ship *sh, int rc, const char *msg)
{
    if (rc == 0) {
        atomic_fetch_add_explicit(&s->batches_ok, 1, memory_order_relaxed);
        redeliv_done(s, sh);
        pawl_future_complete_unref(sh->f, sh->report);
    } else {
        atomic_fetch_add_explicit(&s->failures, 1, memory_order_relaxed);
        pawl_future_fail_unref(sh->f, rc, msg);
    }
    free(sh->idx);
    free(sh->data);
    free(sh);
}

static void chan_free(struct chan *c)
{
    free(c->buf);
    free(c->lines);
    free(c);
}

static int64_t mono_ns(void)
{
    return pawl_now_ns();
}

static size_t count_lines(const char *p, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += p[i] == '\n';
    return k;
}

/* ---------------------------------------------------------------------------------------------
 * print
 * ------------------------------------------------------------------------------------------ */

static int write_all(int fd, const char *p, size_t n, char *msg, size_t msglen)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
            continue;
        }
        if (w <= 0) {
            snprintf(msg, msglen, "writing the output failed: %s", strerror(errno));
            return PAWL_ESYS;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void print_round(struct tool_sink *s, struct ship *list)
{
    char msg[256] = "";
    int rc = 0;
    size_t wrote = 0;
    for (struct ship *sh = list; sh && rc == 0; sh = sh->next) {
        if (sh->len == 0)
            continue;
        rc = write_all(s->o.fd, sh->data, sh->len, msg, sizeof msg);
        if (rc == 0)
            atomic_fetch_add_explicit(&s->lines_out, count_lines(sh->data, sh->len),
                                      memory_order_relaxed);
        wrote += sh->len;
    }
    if (rc == 0 && wrote > 0 && s->o.fsync && s->out_regular && fsync(s->o.fd) != 0) {
        snprintf(msg, sizeof msg, "fsync of the output failed: %s", strerror(errno));
        rc = PAWL_ESYS;
    }
    if (rc)
        pawl_log(PAWL_LOG_WARN, MOD, "print: %s; the batches are rolled back and delivered again",
                 msg);
    while (list) {
        struct ship *next = list->next;
        struct chan *c = list->close ? list->ch : NULL;
        ship_done(s, list, rc, msg);
        if (c)
            chan_free(c);
        list = next;
    }
}

/* ---------------------------------------------------------------------------------------------
 * exec
 * ------------------------------------------------------------------------------------------ */

static void epoll_set(struct tool_sink *s, int fd, uint32_t events, struct chan *c, int op)
{
    struct epoll_event ev = {.events = events, .data.ptr = c};
    epoll_ctl(s->epfd, op, fd, &ev);
}

/* Tag in epoll data: out_fd events carry the chan, in_fd events the chan with the low bit set. */
#define IN_TAG(c) ((struct chan *)((uintptr_t)(c) | 1u))

int tool_sink_env_secret(const char *entry)
{
    const char *eq = strchr(entry, '=');
    size_t n = eq ? (size_t)(eq - entry) : strlen(entry);
    if (n == 10 && memcmp(entry, "PGPASSWORD", 10) == 0)
        return 1;
    return n >= 8 && memcmp(entry, "PAWL_", 5) == 0 && memcmp(entry + n - 3, "DSN", 3) == 0;
}

/* The children's table (tool_sink_waits, tool_sink_abandon): add a child just spawned. */
static void kid_add(struct tool_sink *s, struct chan *c)
{
    pthread_mutex_lock(&s->kmu);
    if (s->nkids == s->kids_cap) {
        size_t cap = s->kids_cap ? s->kids_cap * 2 : 16;
        struct tool_sink_wait *k = realloc(s->kids, cap * sizeof *k);
        if (k) {
            s->kids = k;
            s->kids_cap = cap;
        }
    }
    if (s->nkids < s->kids_cap) /* else it is not listed: its stop report is the poorer */
        s->kids[s->nkids++] = (struct tool_sink_wait){.seg = c->seg, .pid = (int)c->pid};
    pthread_mutex_unlock(&s->kmu);
}

/* Take pid out of the children's table before it is reaped (after that the system may give
 * the pid to another process, which tool_sink_abandon must never signal). */
static void kid_remove(struct tool_sink *s, pid_t pid)
{
    pthread_mutex_lock(&s->kmu);
    for (size_t i = 0; i < s->nkids; i++)
        if (s->kids[i].pid == (int)pid) {
            s->kids[i] = s->kids[--s->nkids];
            break;
        }
    pthread_mutex_unlock(&s->kmu);
}

static int spawn_child(struct tool_sink *s, struct chan *c, char *msg, size_t msglen)
{
    int inp[2] = {-1, -1}, outp[2] = {-1, -1};
    if (pipe2(inp, O_CLOEXEC) != 0 || pipe2(outp, O_CLOEXEC) != 0) {
        snprintf(msg, msglen, "cannot create pipes: %s", strerror(errno));
        goto fail;
    }
    /* The environment: ours, with the segment's variables set and, unless asked to pass them,
     * without the connection secrets (the command is not the database's client). */
    size_t n = 0;
    while (environ[n])
        n++;
    char **envp = calloc(n + 5, sizeof *envp);
    char vproc[128], vseg[48], vmask[48], vnode[96];
    snprintf(vproc, sizeof vproc, "PAWL_PROCESSOR=%s", s->o.processor ? s->o.processor : "");
    snprintf(vseg, sizeof vseg, "PAWL_SEGMENT=%u", c->seg.id);
    snprintf(vmask, sizeof vmask, "PAWL_SEGMENT_MASK=%u", c->seg.mask);
    snprintf(vnode, sizeof vnode, "PAWL_NODE=%s", s->node);
    if (envp == NULL) {
        snprintf(msg, msglen, "out of memory");
        goto fail;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "PAWL_PROCESSOR=", 15) != 0 &&
            strncmp(environ[i], "PAWL_SEGMENT=", 13) != 0 &&
            strncmp(environ[i], "PAWL_SEGMENT_MASK=", 18) != 0 &&
            strncmp(environ[i], "PAWL_NODE=", 10) != 0 &&
            (s->o.pass_secrets || !tool_sink_env_secret(environ[i])))
            envp[k++] = environ[i];
    envp[k++] = vproc;
    envp[k++] = vseg;
    envp[k++] = vmask;
    envp[k++] = vnode;
    envp[k] = NULL;

    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, inp[0], 0);
    posix_spawn_file_actions_adddup2(&fa, outp[1], 1);
    posix_spawnattr_init(&at);
    /* The tool ignores SIGPIPE and blocks nothing; the child gets the defaults back, and a
     * process group of its own (Ctrl-C on the terminal stops pawl, which then closes it). */
    sigset_t def, none;
    sigemptyset(&def);
    sigaddset(&def, SIGPIPE);
    sigemptyset(&none);
    posix_spawnattr_setsigdefault(&at, &def);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setpgroup(&at, 0);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETPGROUP);
    pid_t pid;
    int rc = posix_spawnp(&pid, s->o.argv[0], &fa, &at, (char *const *)s->o.argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    free(envp);
    if (rc != 0) {
        snprintf(msg, msglen, "cannot run %s: %s", s->o.argv[0], strerror(rc));
        goto fail;
    }
    close(inp[0]);
    close(outp[1]);
    c->pid = pid;
    c->in_fd = inp[1];
    c->out_fd = outp[0];
    fcntl(c->in_fd, F_SETFL, fcntl(c->in_fd, F_GETFL) | O_NONBLOCK);
    fcntl(c->out_fd, F_SETFL, fcntl(c->out_fd, F_GETFL) | O_NONBLOCK);
    epoll_set(s, c->out_fd, EPOLLIN, c, EPOLL_CTL_ADD);
    epoll_set(s, c->in_fd, 0, IN_TAG(c), EPOLL_CTL_ADD);
    c->sent_max = 0;
    c->acked = 0;
    c->rlen = 0;
    kid_add(s, c);
    atomic_fetch_add_explicit(&s->starts, 1, memory_order_relaxed);
    pawl_log(PAWL_LOG_INFO, MOD, "exec: segment %u: started %s (pid %d)", c->seg.id, s->o.argv[0],
             (int)pid);
    return 0;
fail:
    for (int i = 0; i < 2; i++) {
        if (inp[i] >= 0)
            close(inp[i]);
        if (outp[i] >= 0)
            close(outp[i]);
    }
    return PAWL_ESYS;
}

/* How child_end ends the child. */
enum {
    END_WAIT = 0,  /* wait for it to exit */
    END_KILL = 1,  /* SIGKILL it unless it has exited already */
    END_GRACE = 2, /* give it 100 ms to exit on its own (it closed its output), then as KILL */
};

/* Close the pipes and reap the child, ended as `how` says. Returns 1 when pawl's SIGKILL ended
 * it (a child that had exited by itself is reported by *status as it ended). */
static int child_end(struct tool_sink *s, struct chan *c, int how, int *status)
{
    if (c->in_fd >= 0) {
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->in_fd, NULL);
        close(c->in_fd);
        c->in_fd = -1;
    }
    if (c->out_fd >= 0) {
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->out_fd, NULL);
        close(c->out_fd);
        c->out_fd = -1;
    }
    int killed = 0;
    if (c->pid > 0) {
        kid_remove(s, c->pid);
        int st = 0;
        pid_t r = 0;
        for (int i = 0; how != END_WAIT && i < (how == END_GRACE ? 10 : 1); i++) {
            if (i > 0) {
                struct timespec ts = {0, 10 * 1000000L};
                nanosleep(&ts, NULL);
            }
            if ((r = waitpid(c->pid, &st, WNOHANG)) != 0)
                break;
        }
        if (r <= 0 && how != END_WAIT) {
            kill(c->pid, SIGKILL);
            killed = 1;
        }
        if (r <= 0)
            while (waitpid(c->pid, &st, 0) < 0 && errno == EINTR) {
            }
        if (status)
            *status = st;
        c->pid = 0;
    }
    return killed;
}

static void unlist(struct tool_sink *s, struct chan *c)
{
    for (struct chan **pp = &s->io_chans; *pp; pp = &(*pp)->io_next)
        if (*pp == c) {
            *pp = c->io_next;
            break;
        }
}

static void describe_exit(int st, char *buf, size_t n);

/* Everything went wrong for c's child: kill it, fail every ship of c (freeing c after its close
 * ship). The next ship with lines starts a new child. */
static void chan_fail(struct tool_sink *s, struct chan *c, const char *why)
{
    int st = 0;
    pid_t pid = c->pid;
    int killed = child_end(s, c, END_KILL, &st);
    char msg[384], ended[160] = "";
    snprintf(msg, sizeof msg, "exec: segment %u: %s", c->seg.id, why);
    if (pid > 0 && killed) {
        snprintf(ended, sizeof ended, "; killed %s (pid %d)", s->o.argv[0], (int)pid);
    } else if (pid > 0) {
        char how[96];
        describe_exit(st, how, sizeof how);
        snprintf(ended, sizeof ended, "; %s (pid %d) %s", s->o.argv[0], (int)pid, how);
    }
    /* Stopping, the segment goes to whichever node claims it next: no back-off here. */
    pawl_log(PAWL_LOG_WARN, MOD, "%s%s; the batch is rolled back and delivered again %s", msg,
             ended,
             atomic_load_explicit(&s->stopping, memory_order_relaxed)
                 ? "by the segment's next owner"
                 : "to a new process after the back-off");
    int closed = 0;
    struct ship *lists[2] = {c->aq, c->sq};
    c->aq = c->sq = NULL;
    c->aq_tail = &c->aq;
    c->sq_tail = &c->sq;
    c->sent_off = 0;
    for (int i = 0; i < 2; i++)
        for (struct ship *sh = lists[i], *next; sh; sh = next) {
            next = sh->next;
            closed |= sh->close;
            redeliv_failed(s, c->seg, sh->idx, sh->nidx);
            ship_done(s, sh, PAWL_EHANDLER, msg);
        }
    if (closed || c->closing) {
        unlist(s, c);
        chan_free(c);
    }
}

/* The command has acknowledged every line of sh (an empty ship has none). */
static int ship_acked(const struct chan *c, const struct ship *sh)
{
    if (sh->len == 0)
        return 1;
    return sh->letters ? sh->lacked == sh->nidx : sh->last <= c->acked;
}

/* Complete the acknowledged (and empty) ships at the head of c's ack queue. Returns 1 when
 * that freed c (the close ship of a chan without a running child), else 0. */
static int ack_progress(struct tool_sink *s, struct chan *c)
{
    while (c->aq && ship_acked(c, c->aq)) {
        struct ship *sh = c->aq;
        c->aq = sh->next;
        if (c->aq == NULL)
            c->aq_tail = &c->aq;
        int is_close = sh->close;
        ship_done(s, sh, 0, NULL);
        if (is_close) {
            /* Orderly end: EOF on stdin, then the child has ack_timeout_ms to exit. */
            if (c->pid > 0) {
                if (c->in_fd >= 0) {
                    epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->in_fd, NULL);
                    close(c->in_fd);
                    c->in_fd = -1;
                }
                c->closing = 1;
                c->close_deadline_ns = mono_ns() + s->o.ack_timeout_ms * 1000000;
            } else {
                unlist(s, c);
                chan_free(c);
                return 1;
            }
            return 0;
        }
    }
    return 0;
}

/* Move empty ships at the head of the send queue to the ack queue; arm EPOLLOUT when needed. */
static void send_progress(struct tool_sink *s, struct chan *c)
{
    while (c->sq) {
        struct ship *sh = c->sq;
        if (sh->deadline_ns == 0)
            sh->deadline_ns = mono_ns() + s->o.ack_timeout_ms * 1000000;
        if (sh->len > 0 && c->sent_off < sh->len) {
            ssize_t w = write(c->in_fd, sh->data + c->sent_off, sh->len - c->sent_off);
            if (w < 0 && (errno == EAGAIN || errno == EINTR))
                break;
            if (w < 0) {
                char why[128];
                snprintf(why, sizeof why, "writing to the command failed: %s", strerror(errno));
                chan_fail(s, c, why);
                return;
            }
            c->sent_off += (size_t)w;
            if (c->sent_off < sh->len)
                break;
        }
        if (sh->len > 0) {
            atomic_fetch_add_explicit(&s->lines_out, count_lines(sh->data, sh->len),
                                      memory_order_relaxed);
            if (!sh->letters)
                c->sent_max = sh->last; /* dead letters are acknowledged line by line */
        }
        c->sent_off = 0;
        c->sq = sh->next;
        if (c->sq == NULL)
            c->sq_tail = &c->sq;
        sh->next = NULL;
        *c->aq_tail = sh;
        c->aq_tail = &sh->next;
    }
    if (c->in_fd >= 0)
        epoll_set(s, c->in_fd, c->sq ? EPOLLOUT : 0, IN_TAG(c), EPOLL_CTL_MOD);
    (void)ack_progress(s, c); /* the last use of c here */
}

/* A ship arrives from a worker. */
static void exec_take(struct tool_sink *s, struct ship *sh)
{
    struct chan *c = sh->ch;
    if (!c->io_listed) {
        c->io_listed = 1;
        c->io_next = s->io_chans;
        s->io_chans = c;
    }
    if (sh->len > 0 && c->pid == 0) {
        char msg[256];
        if (spawn_child(s, c, msg, sizeof msg) != 0) {
            sh->next = NULL;
            *c->sq_tail = sh;
            c->sq_tail = &sh->next;
            chan_fail(s, c, msg);
            return;
        }
    }
    sh->next = NULL;
    *c->sq_tail = sh;
    c->sq_tail = &sh->next;
    if (c->pid > 0 && c->in_fd < 0 && !c->closing) {
        /* Cannot happen: stdin is closed only by the close ship, which is last. */
        chan_fail(s, c, "internal error: no pipe to the command");
        return;
    }
    send_progress(s, c);
}

/*
 * The command answered `fail INDEX REASON` (poison 0) or `poison INDEX REASON`: it handled the
 * lines before event INDEX, failed that one, and skips the rest of its batch. The processor is
 * told which event failed (it counts an attempt, or parks it), then the batch's future fails.
 * When the batch was sent whole and nothing else of this chan is in flight, the command is in
 * step with us and keeps running; otherwise it is killed as for any failure. Returns 0, or 1
 * when c is gone.
 */
static int exec_event_failed(struct tool_sink *s, struct chan *c, int64_t index, int poison,
                             const char *reason, const char *shown)
{
    char why[480], rs[300];
    pawl_printable_str(reason[0] ? reason : "(no reason given)", rs, sizeof rs);
    /* The batch the event is in: the oldest one waiting for its acknowledgement, or the one
     * being written. */
    struct ship *h = NULL;
    size_t j = 0;
    for (int q = 0; q < 2 && h == NULL; q++) {
        struct ship *sh = q == 0 ? c->aq : c->sq;
        if (sh == NULL || (q == 1 && c->sent_off == 0))
            continue;
        for (size_t i = sh->letters ? sh->lacked : 0; i < sh->nidx; i++)
            if (sh->idx[i] == index && (sh->letters || index > c->acked)) {
                h = sh;
                j = i;
                break;
            }
    }
    if (h == NULL) {
        snprintf(why, sizeof why,
                 "the command named event %" PRId64 " in \"%s\", which is not in the batch "
                 "waiting for its acknowledgement",
                 index, shown);
        chan_fail(s, c, why);
        return 1;
    }
    if (!h->letters && j > 0 && h->idx[j - 1] > c->acked) {
        c->acked = h->idx[j - 1];
        /* Release: the worker that reads it skips these events if the batch comes again. */
        atomic_store_explicit(&c->handled, c->acked, memory_order_release);
    }
    int code = poison ? PAWL_EPOISON : PAWL_EHANDLER;
    char blame[320];
    snprintf(blame, sizeof blame, "exec: %s", rs);
    if (s->proc)
        pawl_processor_event_failed(s->proc, c->seg, index, code, blame);
    snprintf(why, sizeof why, "the command reported %s event %" PRId64 ": %s",
             poison ? "a poison" : "a failed", index, rs);
    int in_step = h == c->aq && !h->close && c->sent_off == 0;
    for (struct ship *sh = h->next; sh && in_step; sh = sh->next)
        in_step = sh->len == 0;
    if (!in_step) {
        chan_fail(s, c, why);
        return 1;
    }
    redeliv_failed(s, c->seg, h->idx + j, h->nidx - j);
    char msg[512];
    snprintf(msg, sizeof msg, "exec: segment %u: %s", c->seg.id, why);
    pawl_log(PAWL_LOG_INFO, MOD, "%s; the command goes on with the next batch", msg);
    c->aq = h->next;
    if (c->aq == NULL)
        c->aq_tail = &c->aq;
    /* Nothing of the live flow is outstanding now: an acknowledgement before the next batch is
     * out is a protocol error, not a late word on this one. */
    if (!h->letters)
        c->sent_max = c->acked;
    ship_done(s, h, code, msg);
    return ack_progress(s, c);
}

/* Parse the complete lines the child wrote. Returns 0, or 1 when c is gone (failed or freed). */
static int exec_lines(struct tool_sink *s, struct chan *c)
{
    char *nl;
    while ((nl = memchr(c->rbuf, '\n', c->rlen)) != NULL) {
        size_t n = (size_t)(nl - c->rbuf);
        char line[sizeof c->rbuf];
        memcpy(line, c->rbuf, n);
        line[n] = '\0';
        if (n > 0 && line[n - 1] == '\r')
            line[n - 1] = '\0';
        memmove(c->rbuf, nl + 1, c->rlen - n - 1);
        c->rlen -= n + 1;
        /* The command's text goes into log lines escaped: it may echo an event's bytes. */
        char why[400], shown[104];
        pawl_printable_str(line, shown, sizeof shown);
        if (strncmp(line, "ok ", 3) == 0) {
            char *end;
            errno = 0;
            long long v = strtoll(line + 3, &end, 10);
            if (errno || end == line + 3 || *end != '\0') {
                snprintf(why, sizeof why,
                         "malformed acknowledgement \"%s\" (expected \"ok INDEX\")", shown);
                chan_fail(s, c, why);
                return 1;
            }
            struct ship *h = c->aq;
            if (h && h->letters) {
                /* Dead letters: the next of their lines acknowledged, or a later one. */
                size_t j = h->lacked;
                while (j < h->nidx && h->idx[j] != v)
                    j++;
                if (j == h->nidx) {
                    snprintf(why, sizeof why,
                             "acknowledgement \"%s\" names no dead letter of the batch being "
                             "retried",
                             shown);
                    chan_fail(s, c, why);
                    return 1;
                }
                h->lacked = j + 1;
                if (ack_progress(s, c))
                    return 1;
                continue;
            }
            if (v > c->sent_max || v < c->acked) {
                snprintf(why, sizeof why,
                         "acknowledgement \"%s\" outside what was sent (acknowledged %" PRId64
                         ", last sent %" PRId64 ")",
                         shown, c->acked, c->sent_max);
                chan_fail(s, c, why);
                return 1;
            }
            c->acked = v;
            /* Release: pairs with the worker's acquire in sink_handle. */
            atomic_store_explicit(&c->handled, v, memory_order_release);
            if (ack_progress(s, c))
                return 1; /* c is gone */
        } else if ((strncmp(line, "fail", 4) == 0 && (line[4] == '\0' || line[4] == ' ')) ||
                   (strncmp(line, "poison", 6) == 0 && (line[6] == '\0' || line[6] == ' '))) {
            int poison = line[0] == 'p';
            const char *arg = line + (poison ? 6 : 4);
            arg += *arg == ' ';
            const char *d = arg;
            while (*d >= '0' && *d <= '9')
                d++;
            if (d > arg && d - arg < 19 && (*d == '\0' || *d == ' ')) {
                /* `fail INDEX REASON` / `poison INDEX REASON`: one event failed. */
                int64_t index = strtoll(arg, NULL, 10);
                if (exec_event_failed(s, c, index, poison, *d ? d + 1 : "", shown))
                    return 1;
                continue;
            }
            if (poison) {
                snprintf(why, sizeof why,
                         "malformed line from the command: \"%s\" (expected \"poison INDEX "
                         "REASON\")",
                         shown);
                chan_fail(s, c, why);
                return 1;
            }
            char reason[300];
            pawl_printable_str(line[4] ? line + 5 : "(no reason given)", reason, sizeof reason);
            snprintf(why, sizeof why, "the command reported a failure: %s", reason);
            chan_fail(s, c, why);
            return 1;
        } else {
            snprintf(why, sizeof why,
                     "malformed line from the command: \"%s\" (expected \"ok INDEX\", \"fail "
                     "INDEX REASON\", \"poison INDEX REASON\" or \"fail REASON\"; write logs "
                     "to stderr)",
                     shown);
            chan_fail(s, c, why);
            return 1;
        }
    }
    if (c->rlen == sizeof c->rbuf) {
        chan_fail(s, c, "a line from the command is too long (expected \"ok INDEX\")");
        return 1;
    }
    return 0;
}

/* The usual name of signal sig ("SIGKILL"), or NULL. */
static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGHUP:
        return "SIGHUP";
    case SIGINT:
        return "SIGINT";
    case SIGQUIT:
        return "SIGQUIT";
    case SIGILL:
        return "SIGILL";
    case SIGTRAP:
        return "SIGTRAP";
    case SIGABRT:
        return "SIGABRT";
    case SIGBUS:
        return "SIGBUS";
    case SIGFPE:
        return "SIGFPE";
    case SIGKILL:
        return "SIGKILL";
    case SIGUSR1:
        return "SIGUSR1";
    case SIGSEGV:
        return "SIGSEGV";
    case SIGUSR2:
        return "SIGUSR2";
    case SIGPIPE:
        return "SIGPIPE";
    case SIGALRM:
        return "SIGALRM";
    case SIGTERM:
        return "SIGTERM";
    case SIGXCPU:
        return "SIGXCPU";
    case SIGXFSZ:
        return "SIGXFSZ";
    case SIGSYS:
        return "SIGSYS";
    default:
        return NULL;
    }
}

static void describe_exit(int st, char *buf, size_t n)
{
    if (WIFEXITED(st)) {
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(st));
    } else if (WIFSIGNALED(st)) {
        const char *name = signal_name(WTERMSIG(st));
        snprintf(buf, n, "was killed by signal %d%s%s%s%s", WTERMSIG(st), name ? " (" : "",
                 name ? name : "", name ? ")" : "", WCOREDUMP(st) ? ", core dumped" : "");
    } else {
        snprintf(buf, n, "ended");
    }
}

static void exec_readable(struct tool_sink *s, struct chan *c)
{
    for (;;) {
        ssize_t r = read(c->out_fd, c->rbuf + c->rlen, sizeof c->rbuf - c->rlen);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return;
        if (r > 0) {
            c->rlen += (size_t)r;
            if (exec_lines(s, c))
                return;
            continue;
        }
        /* EOF (or a read error): the child closed its stdout, most likely by exiting. */
        if (c->closing) {
            int st = 0;
            pid_t pid = c->pid;
            child_end(s, c, END_WAIT, &st);
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                char how[64];
                describe_exit(st, how, sizeof how);
                pawl_log(PAWL_LOG_WARN, MOD,
                         "exec: segment %u: %s (pid %d) %s after its input ended", c->seg.id,
                         s->o.argv[0], (int)pid, how);
            }
            unlist(s, c);
            chan_free(c);
            return;
        }
        int st = 0;
        pid_t pid = c->pid;
        char how[96], why[200];
        if (child_end(s, c, END_GRACE, &st))
            snprintf(how, sizeof how, "closed its output but did not exit; killed");
        else
            describe_exit(st, how, sizeof how);
        snprintf(why, sizeof why, "the command (pid %d) %s", (int)pid, how);
        if (c->sq || c->aq)
            chan_fail(s, c, why);
        else
            pawl_log(PAWL_LOG_WARN, MOD,
                     "exec: segment %u: %s between batches; a new one starts with the next",
                     c->seg.id, why);
        return;
    }
}

/* While stopping: note in the children's table what each running command is waited for. */
static void publish_waits(struct tool_sink *s)
{
    pthread_mutex_lock(&s->kmu);
    for (struct chan *c = s->io_chans; c; c = c->io_next) {
        if (c->pid <= 0)
            continue;
        for (size_t i = 0; i < s->nkids; i++) {
            struct tool_sink_wait *w = &s->kids[i];
            if (w->pid != (int)c->pid)
                continue;
            const struct ship *head = c->aq ? c->aq : c->sq;
            w->closing = c->closing;
            w->upto = !c->closing && head ? head->last : 0;
            w->deadline_ns = c->closing ? c->close_deadline_ns : head ? head->deadline_ns : 0;
            break;
        }
    }
    pthread_mutex_unlock(&s->kmu);
}

/* Time-outs: a ship not acknowledged in time, a closing child that does not exit. */
static int64_t exec_deadlines(struct tool_sink *s)
{
    int64_t now = mono_ns(), next = INT64_MAX;
    for (struct chan *c = s->io_chans, *nextc; c; c = nextc) {
        nextc = c->io_next;
        if (c->closing) {
            if (now >= c->close_deadline_ns) {
                pawl_log(PAWL_LOG_WARN, MOD,
                         "exec: segment %u: %s (pid %d) did not exit within %" PRId64
                         " ms after its input ended; killed",
                         c->seg.id, s->o.argv[0], (int)c->pid, s->o.ack_timeout_ms);
                child_end(s, c, END_KILL, NULL);
                unlist(s, c);
                chan_free(c);
                continue;
            }
            next = TOOL_MIN(next, c->close_deadline_ns);
            continue;
        }
        struct ship *head = c->aq ? c->aq : c->sq;
        if (head == NULL || head->deadline_ns == 0)
            continue;
        if (now >= head->deadline_ns) {
            char why[160];
            snprintf(why, sizeof why,
                     "no acknowledgement of the batch ending at %" PRId64 " within %" PRId64
                     " ms (--exec-ack-timeout)",
                     head->last, s->o.ack_timeout_ms);
            chan_fail(s, c, why);
            continue;
        }
        next = TOOL_MIN(next, head->deadline_ns);
    }
    return next;
}

/* ---------------------------------------------------------------------------------------------
 * The thread
 * ------------------------------------------------------------------------------------------ */

static struct ship *take_queue(struct tool_sink *s, int *stop)
{
    pthread_mutex_lock(&s->mu);
    struct ship *list = s->q;
    s->q = NULL;
    s->q_tail = &s->q;
    *stop = s->stop;
    pthread_mutex_unlock(&s->mu);
    return list;
}

static void *sink_thread(void *arg)
{
    struct tool_sink *s = arg;
    struct epoll_event evs[32];
    for (;;) {
        int64_t next = s->o.kind == TOOL_SINK_EXEC ? exec_deadlines(s) : INT64_MAX;
        if (s->o.kind == TOOL_SINK_EXEC && atomic_load_explicit(&s->stopping, memory_order_relaxed))
            publish_waits(s);
        int timeout = -1;
        if (next != INT64_MAX) {
            int64_t ms = (next - mono_ns()) / 1000000 + 1;
            timeout = (int)TOOL_MAX(0, TOOL_MIN(ms, 1000));
        }
        int n = epoll_wait(s->epfd, evs, 32, timeout);
        int stop = 0;
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == s) {
                uint64_t v;
                ssize_t r = read(s->efd, &v, sizeof v);
                (void)r;
                continue;
            }
            /* An event of a chan that an earlier event in this round ended is skipped by looking
             * the chan up in the list first. */
            uintptr_t tag = (uintptr_t)evs[i].data.ptr;
            struct chan *c = (struct chan *)(tag & ~(uintptr_t)1);
            int listed = 0;
            for (struct chan *x = s->io_chans; x; x = x->io_next)
                listed |= x == c;
            if (!listed)
                continue;
            if (tag & 1) {
                /* The read end closed: a pending write fails at once (EPIPE) and fails the
                 * chan; with nothing to send, stop watching (epoll reports it level-triggered)
                 * and let the next write or the EOF on stdout tell. */
                if (c->in_fd >= 0 && !c->sq && (evs[i].events & (EPOLLERR | EPOLLHUP)))
                    epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->in_fd, NULL);
                else if (c->in_fd >= 0)
                    send_progress(s, c);
            } else if (c->out_fd >= 0) {
                exec_readable(s, c);
            }
        }
        struct ship *list = take_queue(s, &stop);
        if (s->o.kind == TOOL_SINK_PRINT) {
            if (list)
                print_round(s, list);
        } else {
            while (list) {
                struct ship *next = list->next;
                exec_take(s, list);
                list = next;
            }
        }
        if (stop) {
            /* The processor has released every segment, so every chan is closing (its child
             * has until its deadline to exit) or done; anything else is given up. */
            for (struct chan *c = s->io_chans, *next; c; c = next) {
                next = c->io_next;
                if (c->closing)
                    continue;
                if (c->sq || c->aq)
                    chan_fail(s, c, "pawl is stopping");
                else
                    child_end(s, c, END_KILL, NULL);
                /* c may be gone now (chan_fail frees a chan after its close ship). */
            }
            struct chan *left = NULL;
            for (struct chan *c = s->io_chans; c; c = c->io_next)
                if (!c->closing)
                    left = c;
            while (left) {
                unlist(s, left);
                chan_free(left);
                left = NULL;
                for (struct chan *c = s->io_chans; c; c = c->io_next)
                    if (!c->closing)
                        left = c;
            }
            if (s->io_chans == NULL)
                break;
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Life cycle
 * ------------------------------------------------------------------------------------------ */

int tool_sink_new(struct tool_sink **out, const struct tool_sink_opts *o, char *err, size_t errlen)
{
    *out = NULL;
    if (o->kind == TOOL_SINK_EXEC && (o->argv == NULL || o->argv[0] == NULL)) {
        snprintf(err, errlen,
                 "the exec handler needs a command: pawl run --handler exec -- CMD "
                 "[ARGS...]");
        return PAWL_EINVAL;
    }
    struct tool_sink *s = calloc(1, sizeof *s);
    if (s == NULL)
        return PAWL_ENOMEM;
    s->o = *o;
    if (s->o.ack_timeout_ms <= 0)
        s->o.ack_timeout_ms = 30000;
    s->q_tail = &s->q;
    s->efd = s->epfd = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->amu, NULL);
    pthread_mutex_init(&s->kmu, NULL);
    struct stat st;
    s->out_regular = o->kind == TOOL_SINK_PRINT && fstat(o->fd, &st) == 0 && S_ISREG(st.st_mode);
    s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (s->efd < 0 || s->epfd < 0) {
        snprintf(err, errlen, "cannot create the handler's event descriptors: %s", strerror(errno));
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = s};
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->efd, &ev) != 0 ||
        pthread_create(&s->thr, NULL, sink_thread, s) != 0) {
        snprintf(err, errlen, "cannot start the handler's thread: %s", strerror(errno));
        goto fail;
    }
    s->thr_started = 1;
    if (o->kind == TOOL_SINK_EXEC && !o->pass_secrets) {
        /* Say what the command will not see, so a command that needs it is not left guessing. */
        char names[256] = "";
        size_t used = 0;
        for (size_t i = 0; environ[i] && used < sizeof names; i++) {
            if (!tool_sink_env_secret(environ[i]))
                continue;
            const char *eq = strchr(environ[i], '=');
            int len = eq ? (int)(eq - environ[i]) : (int)strlen(environ[i]);
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%.*s", used ? ", " : "",
                                     len, environ[i]);
        }
        if (names[0])
            pawl_log(PAWL_LOG_INFO, MOD,
                     "exec: %s not passed on to %s (connection secrets; --exec-pass-secrets "
                     "passes them)",
                     names, o->argv[0]);
    }
    *out = s;
    return 0;
fail:
    tool_sink_free(s);
    return PAWL_ESYS;
}

struct pawl_handler tool_sink_handler(struct tool_sink *s, const char *name)
{
    return (struct pawl_handler){
        .name = name, .self = s, .handle = sink_handle, .ckpt = &sink_ckpt};
}

void tool_sink_set_node(struct tool_sink *s, const char *node)
{
    snprintf(s->node, sizeof s->node, "%s", node ? node : "");
}

void tool_sink_set_processor(struct tool_sink *s, struct pawl_processor *p)
{
    s->proc = p;
}

void tool_sink_stats(struct tool_sink *s, struct tool_sink_stats *out)
{
    out->events = atomic_load_explicit(&s->events, memory_order_relaxed);
    out->replays = atomic_load_explicit(&s->replays, memory_order_relaxed);
    out->lines_out = atomic_load_explicit(&s->lines_out, memory_order_relaxed);
    out->batches_ok = atomic_load_explicit(&s->batches_ok, memory_order_relaxed);
    out->failures = atomic_load_explicit(&s->failures, memory_order_relaxed);
    out->starts = atomic_load_explicit(&s->starts, memory_order_relaxed);
}

void tool_sink_stopping(struct tool_sink *s)
{
    if (s == NULL)
        return;
    atomic_store_explicit(&s->stopping, 1, memory_order_relaxed);
    uint64_t one = 1;
    ssize_t w = write(s->efd, &one, sizeof one); /* a round, to note the waits */
    (void)w;
}

size_t tool_sink_waits(struct tool_sink *s, struct tool_sink_wait *out, size_t max)
{
    if (s == NULL)
        return 0;
    pthread_mutex_lock(&s->kmu);
    size_t n = s->nkids;
    for (size_t i = 0; i < n && i < max; i++)
        out[i] = s->kids[i];
    pthread_mutex_unlock(&s->kmu);
    return n;
}

size_t tool_sink_abandon(struct tool_sink *s, char *pids, size_t len)
{
    size_t n = 0, used = 0;
    if (len)
        pids[0] = '\0';
    if (s == NULL)
        return 0;
    /* Under kmu no listed child is reaped, so each pid is still that child's (see kid_remove). */
    pthread_mutex_lock(&s->kmu);
    for (size_t i = 0; i < s->nkids; i++) {
        pid_t pid = (pid_t)s->kids[i].pid;
        /* Its process group (its own, see spawn_child), as a terminal's Ctrl-C would have. */
        if (kill(-pid, SIGTERM) != 0)
            kill(pid, SIGTERM);
        n++;
        if (used < len)
            used += (size_t)snprintf(pids + used, len - used, "%s%d (segment %u)", i ? ", " : "",
                                     (int)pid, s->kids[i].seg.id);
    }
    pthread_mutex_unlock(&s->kmu);
    return n;
}

void tool_sink_free(struct tool_sink *s)
{
    if (s == NULL)
        return;
    if (s->thr_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_mutex_unlock(&s->mu);
        uint64_t one = 1;
        ssize_t w = write(s->efd, &one, sizeof one);
        (void)w;
        pthread_join(s->thr, NULL);
    }
    /* Ships queued after the thread's last look (none once the processor has stopped). */
    int stop;
    for (struct ship *sh = take_queue(s, &stop), *next; sh; sh = next) {
        next = sh->next;
        struct chan *c = sh->close ? sh->ch : NULL;
        ship_done(s, sh, PAWL_ESHUTDOWN, NULL);
        if (c)
            chan_free(c);
    }
    for (unsigned b = 0; b < NBUCKETS; b++)
        for (struct chan *c = s->table[b], *next; c; c = next) {
            next = c->hnext;
            chan_free(c);
        }
    if (s->efd >= 0)
        close(s->efd);
    if (s->epfd >= 0)
        close(s->epfd);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->amu);
    pthread_mutex_destroy(&s->kmu);
    free(s->kids);
    free(s->redeliv);
    free(s);
}
