/*
 * bench_runtime.c — micro-benchmarks of the runtime, each next to a baseline measured in the
 * same run:
 *   submit_run  task submit + run throughput, 2 workers: from an outside thread (injection
 *               path), one task at a time and in batches of IBATCH (pawl_pool_submit_batch), and
 *               from inside the pool (a task fanning out children: deque + stealing).
 *               Baseline: one mutex + condvar queue served by 2 threads, same shapes; its batch
 *               takes the lock once and makes one wake-up call.
 *   steal_latency  a worker pushes a child and stays busy; time until another worker runs it
 *               (includes waking a parked worker). Baseline: mutex + condvar hand-off latency.
 *   future      complete -> continuation: throughput (B futures with pool continuations,
 *               completed from an outside thread) and one-at-a-time latency across threads.
 *               Baseline: a mutex-protected future whose continuations go to the mutex queue.
 *   timer_arm_fire  arm B timers at delay 0 and wait until all callbacks ran; io_uring, epoll.
 *               A deadline already past never reaches the kernel on io_uring (the timers thread
 *               expires it itself), so this row measures the runtime's queueing, not io_uring.
 *   timer_delay  arm B timers with a real delay (1 ms, and 1..16 ms spread) and wait until all
 *               fired: every timer is one kernel timeout on io_uring, a heap entry behind one
 *               timerfd on epoll. Reports the process's CPU per timer (cpu_ns_per_timer), and
 *               how late callbacks ran after their deadline (late_us_mean, late_us_max).
 *   structure   the runtime's rings and MPSC list beside ConcurrencyKit's ck_ring and ck_fifo,
 *               one producer thread to one consumer (see bm_structure).
 * The throughput shapes count completed tasks per executor thread (struct done, below), the
 * same way on both sides; the pool shapes also report steals, parks and futex wake-ups.
 * Run: build/bin/bench_runtime [--benchmark_filter=...] (see the README for the figures).
 */
#include "gbench_shim.h"

#include "common.h"
#include "mpsc.h"

#include "pawl.h"

#include <ck_fifo.h>
#include <ck_ring.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define WORKERS 2
#define BATCH 10000

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void wait_count(uint64_t *c, uint64_t want)
{
    while (atomic_load_explicit(PAWL_ATOMIC_OF(c), memory_order_acquire) < want)
        sched_yield();
}

/*
 * Completion counting for the throughput shapes (submit_run inject, inject_batch and spawn, and
 * future throughput): each task reports that it ran, and the waiting thread sums the reports.
 * One counter per executor thread, each on its own cache line and written only by that thread,
 * the same code on both sides: the slot is the thread's index in its executor (a pool worker's
 * index, a mutex-queue thread's index); any other thread shares one atomic slot. Until
 * 2026-11-30 the tasks of both sides added to one shared counter instead; then every task paid a
 * transfer of that line between the two worker threads, which belongs to neither executor and,
 * on two cores, cost about as much as an executor's own per-task work, pulling both sides'
 * figures towards the counter's speed. The waiter reads the lines between sched_yield calls.
 */
struct done_slot {
    uint64_t n;
    char pad[64 - sizeof(uint64_t)];
};

struct done {
    struct done_slot slot[WORKERS + 1];
} __attribute__((aligned(64)));

static _Thread_local int mq_index = -1; /* a mutex-queue thread's index, set by mq_main */
static _Thread_local int done_index = -1;

static void done_add(struct done *d)
{
    if (done_index < 0) {
        int i = pawl_pool_current_worker();
        if (i < 0)
            i = mq_index;
        done_index = i >= 0 && i < WORKERS ? i : WORKERS;
    }
    if (done_index == WORKERS) {
        /* Acq_rel: shared by the other threads; the waiter's acquire sees the task's effects. */
        atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&d->slot[WORKERS].n), 1, memory_order_acq_rel);
        return;
    }
    /* Relaxed load, release store: this thread is the slot's only writer; the waiter's
     * acquire load sees the task's effects. */
    uint64_t *n = &d->slot[done_index].n;
    atomic_store_explicit(PAWL_ATOMIC_OF(n),
                          atomic_load_explicit(PAWL_ATOMIC_OF(n), memory_order_relaxed) + 1,
                          memory_order_release);
}

static uint64_t done_total(struct done *d)
{
    uint64_t sum = 0;
    for (int i = 0; i <= WORKERS; i++)
        sum += atomic_load_explicit(PAWL_ATOMIC_OF(&d->slot[i].n), memory_order_acquire);
    return sum;
}

static void wait_done(struct done *d, uint64_t want)
{
    while (done_total(d) < want)
        sched_yield();
}

/* ---- the baseline: one mutex + condvar FIFO served by WORKERS threads ---- */

struct mq {
    pthread_mutex_t m;
    pthread_cond_t c;
    struct pawl_task *head, *tail;
    int waiters;
    int stop;
    pthread_t th[WORKERS];
    int started; /* threads that took their index */
};

static void mq_submit(struct mq *q, struct pawl_task *t)
{
    t->_next = NULL;
    pthread_mutex_lock(&q->m);
    if (q->tail)
        q->tail->_next = t;
    else
        q->head = t;
    q->tail = t;
    if (q->waiters)
        pthread_cond_signal(&q->c);
    pthread_mutex_unlock(&q->m);
}

/* A batch: link the tasks, append the chain under one lock, make one wake-up call: a broadcast
 * when more than one task came (pawl's woken worker likewise wakes the next one). Signalling a
 * single waiter instead was slower for the baseline in our runs, so this is the fairer one. */
static void mq_submit_batch(struct mq *q, struct pawl_task *const *ts, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++)
        ts[i]->_next = ts[i + 1];
    ts[n - 1]->_next = NULL;
    pthread_mutex_lock(&q->m);
    if (q->tail)
        q->tail->_next = ts[0];
    else
        q->head = ts[0];
    q->tail = ts[n - 1];
    if (q->waiters) {
        if (n > 1)
            pthread_cond_broadcast(&q->c);
        else
            pthread_cond_signal(&q->c);
    }
    pthread_mutex_unlock(&q->m);
}

static _Thread_local struct mq *mq_current;

static void *mq_main(void *arg)
{
    struct mq *q = arg;
    mq_current = q;
    pthread_mutex_lock(&q->m);
    mq_index = q->started++;
    for (;;) {
        while (q->head == NULL && !q->stop) {
            q->waiters++;
            pthread_cond_wait(&q->c, &q->m);
            q->waiters--;
        }
        if (q->head == NULL)
            break;
        struct pawl_task *t = q->head;
        q->head = t->_next;
        if (q->head == NULL)
            q->tail = NULL;
        pthread_mutex_unlock(&q->m);
        t->fn(t, 0);
        pthread_mutex_lock(&q->m);
    }
    pthread_mutex_unlock(&q->m);
    return NULL;
}

static struct mq *mq_new(void)
{
    struct mq *q = calloc(1, sizeof(*q));
    pthread_mutex_init(&q->m, NULL);
    pthread_cond_init(&q->c, NULL);
    for (int i = 0; i < WORKERS; i++)
        pthread_create(&q->th[i], NULL, mq_main, q);
    return q;
}

static void mq_free(struct mq *q)
{
    pthread_mutex_lock(&q->m);
    q->stop = 1;
    pthread_cond_broadcast(&q->c);
    pthread_mutex_unlock(&q->m);
    for (int i = 0; i < WORKERS; i++)
        pthread_join(q->th[i], NULL);
    free(q);
}

/* One executor interface over both, so every benchmark body is shared. */
struct exec {
    struct pawl_pool *pool;
    struct mq *mq;
};

static void ex_submit(struct exec *e, struct pawl_task *t)
{
    if (e->pool)
        pawl_pool_submit(e->pool, t);
    else
        mq_submit(e->mq, t);
}

static void ex_submit_batch(struct exec *e, struct pawl_task *const *ts, size_t n)
{
    if (e->pool)
        pawl_pool_submit_batch(e->pool, ts, n);
    else
        mq_submit_batch(e->mq, ts, n);
}

static struct exec ex_new(int baseline)
{
    struct exec e = {0};
    if (baseline) {
        e.mq = mq_new();
    } else {
        struct pawl_pool_opts o = {.workers = WORKERS};
        pawl_pool_new(&e.pool, &o);
    }
    return e;
}

/* Report the pool's steals, parks and futex wake-ups per iteration (pawl side only). */
static void ex_counters(pawl_bench_state *st, struct exec *e)
{
    struct pawl_pool_stats ps;
    if (e->pool == NULL)
        return;
    pawl_pool_stats(e->pool, &ps);
    pawl_bench_counter(st, "steals", (double)ps.steals, PAWL_BENCH_COUNTER_AVG);
    pawl_bench_counter(st, "parks", (double)ps.parks, PAWL_BENCH_COUNTER_AVG);
    pawl_bench_counter(st, "wakeups", (double)ps.wakeups, PAWL_BENCH_COUNTER_AVG);
}

static void ex_free(struct exec *e)
{
    if (e->pool)
        pawl_pool_free(e->pool);
    else
        mq_free(e->mq);
}

/* ---- submit + run throughput ---- */

struct unit {
    struct pawl_task task;
    struct done *done;
};

static void unit_fn(struct pawl_task *t, int status)
{
    struct unit *u = (struct unit *)t;
    done_add(u->done);
}

/*
 * Submit+run from an outside thread: BATCH tasks per iteration, one at a time (ibatch 0) or in
 * batches of ibatch tasks (the last one shorter).
 */
static void run_inject(pawl_bench_state *st, int baseline, int ibatch)
{
    struct exec e = ex_new(baseline);
    struct unit *u = calloc(BATCH, sizeof(*u));
    struct pawl_task **ts = calloc(BATCH, sizeof(*ts));
    struct done done = {0};
    uint64_t want = 0;
    for (int i = 0; i < BATCH; i++) {
        u[i] = (struct unit){{unit_fn, NULL}, &done};
        ts[i] = &u[i].task;
    }
    while (pawl_bench_keep_running(st)) {
        if (ibatch == 0)
            for (int i = 0; i < BATCH; i++)
                ex_submit(&e, ts[i]);
        else
            for (int i = 0; i < BATCH; i += ibatch)
                ex_submit_batch(&e, ts + i, (size_t)(BATCH - i < ibatch ? BATCH - i : ibatch));
        want += BATCH;
        wait_done(&done, want);
    }
    pawl_bench_set_items_processed(st, pawl_bench_iterations(st) * BATCH);
    ex_counters(st, &e);
    ex_free(&e);
    free(ts);
    free(u);
}

static void bm_inject(pawl_bench_state *st, void *arg)
{
    run_inject(st, arg != NULL, 0);
}

/* The same in batches of IBATCH tasks. */
#define IBATCH 64

static void bm_inject_batch(pawl_bench_state *st, void *arg)
{
    run_inject(st, arg != NULL, IBATCH);
}

struct fan {
    struct pawl_task task;
    struct exec *e;
    struct unit *children;
};

static void fan_fn(struct pawl_task *t, int status)
{
    struct fan *f = (struct fan *)t;
    for (int i = 0; i < BATCH; i++)
        ex_submit(f->e, &f->children[i].task);
}

static void bm_spawn(pawl_bench_state *st, void *arg)
{
    int baseline = arg != NULL;
    struct exec e = ex_new(baseline);
    struct unit *u = calloc(BATCH, sizeof(*u));
    struct done done = {0};
    uint64_t want = 0;
    for (int i = 0; i < BATCH; i++)
        u[i] = (struct unit){{unit_fn, NULL}, &done};
    struct fan f = {{fan_fn, NULL}, &e, u};
    while (pawl_bench_keep_running(st)) {
        ex_submit(&e, &f.task);
        want += BATCH;
        wait_done(&done, want);
    }
    pawl_bench_set_items_processed(st, pawl_bench_iterations(st) * BATCH);
    ex_counters(st, &e);
    ex_free(&e);
    free(u);
}

/* Steady-state scheduling: CHAINS tasks, each resubmitting itself STEPS times from inside the
 * executor (the pattern of segment steps re-queueing themselves). */
#define CHAINS 64
#define STEPS 200

struct chain {
    struct pawl_task task;
    struct exec *e;
    int left;
    uint64_t *done;
};

static void chain_fn(struct pawl_task *t, int status)
{
    struct chain *c = (struct chain *)t;
    if (--c->left > 0)
        ex_submit(c->e, &c->task);
    else
        atomic_fetch_add_explicit(PAWL_ATOMIC_OF(c->done), 1, memory_order_acq_rel);
}

static void bm_chain(pawl_bench_state *st, void *arg)
{
    int baseline = arg != NULL;
    struct exec e = ex_new(baseline);
    struct chain c[CHAINS];
    uint64_t done = 0, want = 0;
    while (pawl_bench_keep_running(st)) {
        for (int i = 0; i < CHAINS; i++) {
            c[i] = (struct chain){{chain_fn, NULL}, &e, STEPS, &done};
            ex_submit(&e, &c[i].task);
        }
        want += CHAINS;
        wait_count(&done, want);
    }
    pawl_bench_set_items_processed(st, pawl_bench_iterations(st) * CHAINS * STEPS);
    ex_counters(st, &e);
    ex_free(&e);
}

/* ---- steal latency (pool) and hand-off latency (baseline) ---- */

struct steal_probe {
    struct pawl_task parent;
    struct pawl_task child;
    struct exec *e;
    uint64_t seq;         /* this round */
    uint64_t child_seq;   /* the round whose child ran */
    uint64_t parent_done; /* the round whose parent returned */
    int64_t pushed_ns;
    int64_t started_ns;
};

static void probe_child(struct pawl_task *t, int status)
{
    struct steal_probe *p = (struct steal_probe *)((char *)t - offsetof(struct steal_probe, child));
    p->started_ns = now_ns();
    atomic_store_explicit(PAWL_ATOMIC_OF(&p->child_seq), p->seq, memory_order_release);
}

static void probe_parent(struct pawl_task *t, int status)
{
    struct steal_probe *p = (struct steal_probe *)t;
    uint64_t seq = p->seq;
    p->pushed_ns = now_ns();
    ex_submit(p->e, &p->child);
    /* Stay busy until another thread took the child: it must be stolen (or handed off). */
    while (atomic_load_explicit(PAWL_ATOMIC_OF(&p->child_seq), memory_order_acquire) != seq)
        ;
    atomic_store_explicit(PAWL_ATOMIC_OF(&p->parent_done), seq, memory_order_release);
}

static void bm_steal_latency(pawl_bench_state *st, void *arg)
{
    int baseline = arg != NULL;
    struct exec e = ex_new(baseline);
    struct steal_probe p = {{probe_parent, NULL}, {probe_child, NULL}, &e, 0, 0, 0, 0, 0};
    double total = 0;
    int64_t n = 0;
    while (pawl_bench_keep_running(st)) {
        p.seq++;
        ex_submit(&e, &p.parent);
        wait_count(&p.parent_done, p.seq);
        total += (double)(p.started_ns - p.pushed_ns);
        n++;
    }
    pawl_bench_counter(st, "push_to_run_ns", n ? total / (double)n : 0, PAWL_BENCH_COUNTER_PLAIN);
    ex_free(&e);
}

/* ---- futures: pawl futures vs a mutex-protected future feeding the mutex queue ---- */

struct bfut {
    pthread_mutex_t m;
    int done;
    int64_t token;
    struct bcont *conts;
};

struct bcont {
    struct pawl_task task;
    struct bcont *next;
    struct bfut *f;
    struct mq *q;
    struct done *counter;
};

static void bcont_run(struct pawl_task *t, int status)
{
    struct bcont *c = (struct bcont *)t;
    done_add(c->counter);
    free(c);
}

static void bfut_on_complete(struct bfut *f, struct mq *q, struct done *counter)
{
    struct bcont *c = malloc(sizeof(*c));
    *c = (struct bcont){{bcont_run, NULL}, NULL, f, q, counter};
    pthread_mutex_lock(&f->m);
    if (!f->done) {
        c->next = f->conts;
        f->conts = c;
        c = NULL;
    }
    pthread_mutex_unlock(&f->m);
    if (c)
        mq_submit(q, &c->task);
}

static void bfut_complete(struct bfut *f, int64_t token)
{
    pthread_mutex_lock(&f->m);
    f->done = 1;
    f->token = token;
    struct bcont *list = f->conts;
    f->conts = NULL;
    pthread_mutex_unlock(&f->m);
    while (list) {
        struct bcont *n = list->next;
        mq_submit(list->q, &list->task);
        list = n;
    }
}

static struct done fut_done;

static void count_cont(void *arg, struct pawl_future *f)
{
    done_add(&fut_done);
}

#define FBATCH 2000

/* Time spent per phase of the throughput shape, summed over iterations (see below). */
struct phases {
    int64_t reg, complete, drain;
};

/* One iteration's phase boundaries: register [t0, t1), complete [t1, t2), drain [t2, t3). */
static void phases_add(struct phases *ph, int64_t t0, int64_t t1, int64_t t2, int64_t t3)
{
    ph->reg += t1 - t0;
    ph->complete += t2 - t1;
    ph->drain += t3 - t2;
}

static void bm_future_throughput(pawl_bench_state *st, void *arg)
{
    int baseline = arg != NULL;
    struct exec e = ex_new(baseline);
    uint64_t want = 0;
    /* Where the time goes, per future: registering (the completing thread, before any
     * completion), completing (the completing thread, while the executor starts running
     * continuations) and draining (the executor's rest, the completing thread waiting). */
    struct phases ph = {0, 0, 0};
    memset(&fut_done, 0, sizeof fut_done);
    if (!baseline) {
        struct pawl_future *fs[FBATCH];
        while (pawl_bench_keep_running(st)) {
            int64_t t0 = now_ns();
            for (int i = 0; i < FBATCH; i++) {
                fs[i] = pawl_future_new();
                pawl_future_on_complete(fs[i], NULL, e.pool, count_cont, NULL);
            }
            int64_t t1 = now_ns();
            for (int i = 0; i < FBATCH; i++)
                pawl_future_complete_unref(fs[i], i);
            int64_t t2 = now_ns();
            want += FBATCH;
            wait_done(&fut_done, want);
            phases_add(&ph, t0, t1, t2, now_ns());
        }
    } else {
        struct bfut *fs = calloc(FBATCH, sizeof(*fs));
        while (pawl_bench_keep_running(st)) {
            int64_t t0 = now_ns();
            for (int i = 0; i < FBATCH; i++) {
                pthread_mutex_init(&fs[i].m, NULL);
                fs[i].done = 0;
                fs[i].conts = NULL;
                bfut_on_complete(&fs[i], e.mq, &fut_done);
            }
            int64_t t1 = now_ns();
            for (int i = 0; i < FBATCH; i++)
                bfut_complete(&fs[i], i);
            int64_t t2 = now_ns();
            want += FBATCH;
            wait_done(&fut_done, want);
            phases_add(&ph, t0, t1, t2, now_ns());
            for (int i = 0; i < FBATCH; i++)
                pthread_mutex_destroy(&fs[i].m);
        }
        free(fs);
    }
    double n = (double)pawl_bench_iterations(st) * FBATCH;
    if (n > 0) {
        pawl_bench_counter(st, "register_ns", (double)ph.reg / n, PAWL_BENCH_COUNTER_PLAIN);
        pawl_bench_counter(st, "complete_ns", (double)ph.complete / n, PAWL_BENCH_COUNTER_PLAIN);
        pawl_bench_counter(st, "drain_ns", (double)ph.drain / n, PAWL_BENCH_COUNTER_PLAIN);
    }
    pawl_bench_set_items_processed(st, pawl_bench_iterations(st) * FBATCH);
    ex_counters(st, &e);
    ex_free(&e);
}

/* Future chains: a continuation running on the executor creates the next future, registers
 * the next continuation and completes it — completion on a worker, continuation queued to the
 * executor, as when a segment's step completes another segment's future. */
struct fchain {
    struct exec *e;
    int left;
    uint64_t *done;
};

static void fchain_step(struct fchain *c);

static void fchain_cont(void *arg, struct pawl_future *f)
{
    fchain_step(arg);
}

static void bchain_run(struct pawl_task *t, int status);

struct bstep {
    struct bcont c;
    struct fchain *ch;
};

static void fchain_step(struct fchain *c)
{
    if (c->left-- == 0) {
        atomic_fetch_add_explicit(PAWL_ATOMIC_OF(c->done), 1, memory_order_acq_rel);
        return;
    }
    if (c->e->pool) {
        struct pawl_future *f = pawl_future_new();
        pawl_future_on_complete(f, NULL, c->e->pool, fchain_cont, c);
        pawl_future_complete_unref(f, c->left);
    } else {
        struct bfut *f = malloc(sizeof(*f));
        pthread_mutex_init(&f->m, NULL);
        f->done = 0;
        f->conts = NULL;
        struct bstep *s = malloc(sizeof(*s));
        s->c = (struct bcont){{bchain_run, NULL}, NULL, f, c->e->mq, NULL};
        s->ch = c;
        pthread_mutex_lock(&f->m);
        s->c.next = f->conts;
        f->conts = &s->c;
        pthread_mutex_unlock(&f->m);
        bfut_complete(f, c->left);
    }
}

static void bchain_run(struct pawl_task *t, int status)
{
    struct bstep *s = (struct bstep *)t;
    struct fchain *ch = s->ch;
    pthread_mutex_destroy(&s->c.f->m);
    free(s->c.f);
    free(s);
    fchain_step(ch);
}

static void bm_future_chain(pawl_bench_state *st, void *arg)
{
    int baseline = arg != NULL;
    struct exec e = ex_new(baseline);
    struct fchain c[CHAINS];
    uint64_t done = 0, want = 0;
    while (pawl_bench_keep_running(st)) {
        for (int i = 0; i < CHAINS; i++) {
            c[i] = (struct fchain){&e, STEPS, &done};
            fchain_step(&c[i]); /* the first completion is from outside; the rest inside */
        }
        want += CHAINS;
        wait_count(&done, want);
    }
    pawl_bench_set_items_processed(st, pawl_bench_iterations(st) * CHAINS * STEPS);
    ex_counters(st, &e);
    ex_free(&e);
}

static void bm_future_latency(pawl_bench_state *st, void *arg)
{
    int baseline = arg != NULL;
    struct exec e = ex_new(baseline);
    uint64_t want = 0;
    memset(&fut_done, 0, sizeof fut_done);
    while (pawl_bench_keep_running(st)) {
        if (!baseline) {
            struct pawl_future *f = pawl_future_new();
            pawl_future_on_complete(f, NULL, e.pool, count_cont, NULL);
            pawl_future_complete_unref(f, 1);
        } else {
            struct bfut f = {.done = 0};
            pthread_mutex_init(&f.m, NULL);
            bfut_on_complete(&f, e.mq, &fut_done);
            bfut_complete(&f, 1);
            pthread_mutex_destroy(&f.m); /* the continuation does not touch f */
        }
        want++;
        while (done_total(&fut_done) < want)
            ; /* spin: measure the hand-off, not the scheduler */
    }
    ex_free(&e);
}

/* ---- timers ---- */

#define TBATCH 1000

static uint64_t timer_fired;

static void timer_cb(struct pawl_timer *t, void *arg, int status)
{
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&timer_fired), 1, memory_order_acq_rel);
}

static void bm_timer_arm_fire(pawl_bench_state *st, void *arg)
{
    struct exec e = ex_new(0);
    struct pawl_timers_opts o;
    pawl_timers_opts_defaults(&o);
    o.backend = arg ? PAWL_TIMER_BACKEND_EPOLL : PAWL_TIMER_BACKEND_IO_URING;
    struct pawl_timers *tm;
    if (pawl_timers_new(&tm, e.pool, &o) != 0) {
        pawl_bench_skip_with_error(st, "backend unavailable here");
        ex_free(&e);
        return;
    }
    struct pawl_timer *t = calloc(TBATCH, sizeof(*t));
    for (int i = 0; i < TBATCH; i++)
        pawl_timer_init(&t[i], timer_cb, NULL);
    uint64_t want = 0;
    timer_fired = 0;
    while (pawl_bench_keep_running(st)) {
        for (int i = 0; i < TBATCH; i++)
            pawl_timer_start(tm, &t[i], 0, 0);
        want += TBATCH;
        wait_count(&timer_fired, want);
        for (int i = 0; i < TBATCH; i++)
            while (pawl_timer_busy(&t[i]))
                sched_yield();
    }
    pawl_bench_set_items_processed(st, pawl_bench_iterations(st) * TBATCH);
    pawl_timers_free(tm);
    free(t);
    ex_free(&e);
}

struct tlate {
    struct pawl_timer t;
    int64_t due_ns;
};

static int64_t late_sum_ns, late_max_ns;

static void tlate_cb(struct pawl_timer *t, void *arg, int status)
{
    struct tlate *x = arg;
    int64_t late = now_ns() - x->due_ns;
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&late_sum_ns), late, memory_order_relaxed);
    int64_t m = atomic_load_explicit(PAWL_ATOMIC_OF(&late_max_ns), memory_order_relaxed);
    while (late > m &&
           !atomic_compare_exchange_strong_explicit(PAWL_ATOMIC_OF(&late_max_ns), &m, late,
                                                    memory_order_relaxed, memory_order_relaxed))
        ;
    atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&timer_fired), 1, memory_order_acq_rel);
}

static int64_t cpu_ns(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ((int64_t)ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000 +
           ((int64_t)ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000;
}

/* range(0) = backend * 100 + spread: backend 0 io_uring, 1 epoll; spread 1 = every timer 1 ms,
 * 16 = delays spread over 1..16 ms. */
static void bm_timer_delay(pawl_bench_state *st, void *arg)
{
    (void)arg;
    int epoll = (int)pawl_bench_range(st, 0) / 100;
    int spread = (int)pawl_bench_range(st, 0) % 100;
    struct exec e = ex_new(0);
    struct pawl_timers_opts o;
    pawl_timers_opts_defaults(&o);
    o.backend = epoll ? PAWL_TIMER_BACKEND_EPOLL : PAWL_TIMER_BACKEND_IO_URING;
    struct pawl_timers *tm;
    if (pawl_timers_new(&tm, e.pool, &o) != 0) {
        pawl_bench_skip_with_error(st, "backend unavailable here");
        ex_free(&e);
        return;
    }
    struct tlate *t = calloc(TBATCH, sizeof(*t));
    for (int i = 0; i < TBATCH; i++)
        pawl_timer_init(&t[i].t, tlate_cb, &t[i]);
    uint64_t want = 0;
    timer_fired = 0;
    late_sum_ns = late_max_ns = 0;
    int64_t cpu0 = cpu_ns();
    while (pawl_bench_keep_running(st)) {
        for (int i = 0; i < TBATCH; i++) {
            int64_t d = 1 + (spread > 1 ? i % spread : 0);
            t[i].due_ns = now_ns() + d * 1000000;
            pawl_timer_start(tm, &t[i].t, d, 0);
        }
        want += TBATCH;
        /* Sleep, do not spin: the CPU counted is the timers' and the callbacks'. */
        while (atomic_load_explicit(PAWL_ATOMIC_OF(&timer_fired), memory_order_acquire) < want)
            nanosleep(&(struct timespec){0, 200000}, NULL);
        for (int i = 0; i < TBATCH; i++)
            while (pawl_timer_busy(&t[i].t))
                nanosleep(&(struct timespec){0, 50000}, NULL);
    }
    int64_t cpu = cpu_ns() - cpu0;
    int64_t n = pawl_bench_iterations(st) * TBATCH;
    pawl_bench_set_items_processed(st, n);
    pawl_bench_counter(st, "cpu_ns_per_timer", (double)cpu / (double)(n ? n : 1),
                       PAWL_BENCH_COUNTER_PLAIN);
    pawl_bench_counter(st, "late_us_mean", (double)late_sum_ns / 1000.0 / (double)(n ? n : 1),
                       PAWL_BENCH_COUNTER_PLAIN);
    pawl_bench_counter(st, "late_us_max", (double)late_max_ns / 1000.0, PAWL_BENCH_COUNTER_PLAIN);
    pawl_timers_free(tm);
    free(t);
    ex_free(&e);
}

/*
 * Structures, pawl's beside ConcurrencyKit's, in the pool's shape: XFER pointers are produced
 * and consumed (the consumer reads each item, as a worker reads its task, and checks their
 * order). /1thread: the benchmark thread puts XROUND items and takes them back, so the row is
 * the instruction cost of a put plus a take, without cache-line traffic; /2threads: a producer
 * thread beside the consuming benchmark thread (on a loaded machine this measures scheduling
 * as much as the structure). The rings are 16384 slots, as the pool's. A full or empty ring spins
 * briefly, then yields (both sides, all rows alike). Rows:
 *   ring_spsc/pawl      pawl's own protocol for the pool's producer rings, before they became
 *                       ck_ring (kept as the baseline): the producer reads the consumer's head
 *                       only when the ring looks full; the consumer takes up to 32 slots per
 *                       acquire of tail and release of head.
 *   ring_spsc/ck_ring   ck_ring_enqueue_spsc / ck_ring_dequeue_spsc, what the pool's producer
 *                       rings now are (pool_submit.c and pool_worker.c, through ckring.h, without
 *                       its wake-up hand-shake).
 *   ring_mp/pawl        the pool's injection ring (ring_push_mp in pool_submit.c, ring_take_sc in
 *                       pool_worker.c),
 *                       copied: one CAS reserves the slot, the slot is published tagged with its
 *                       lap, so producers never wait for each other.
 *   ring_mp/ck_ring     ck_ring_enqueue_mpsc / ck_ring_dequeue_spsc (a producer that reserved a
 *                       slot waits until the producers before it have published theirs).
 *   list_mpsc/pawl      the runtime's intrusive MPSC list itself (mpsc.c).
 *   list_mpsc/ck_fifo   ck_fifo_mpmc (Michael-Scott, double-width CAS), entries preallocated.
 */
#define XFER (1 << 20)
#define XRING 16384
#define XTAKE 32
#define XROUND 1024 /* one-thread rows: items put before they are taken back */

struct xitem {
    uint64_t seq;
    void *link; /* list_mpsc/pawl: the intrusive link */
};

struct xfer;
typedef void (*xfer_produce_fn)(struct xfer *x, struct xitem *it);

struct xfer {
    int kind;
    struct xitem *items;
    /* pawl_spsc */
    int64_t tail;
    char pad0[PAWL_CACHELINE - sizeof(int64_t)];
    int64_t head_seen;
    char pad1[PAWL_CACHELINE - sizeof(int64_t)];
    int64_t head;
    char pad2[PAWL_CACHELINE - sizeof(int64_t)];
    struct xitem **slot;
    /* ck_ring */
    ck_ring_t ring;
    ck_ring_buffer_t *buf;
    /* pawl mpsc list, ck_fifo */
    struct pawl_mpsc_ list;
    ck_fifo_mpmc_t fifo;
    ck_fifo_mpmc_entry_t *entries;
};

enum { X_SPSC_PAWL, X_SPSC_CK, X_MP_PAWL, X_MP_CK, X_LIST_PAWL, X_LIST_CK };

static void xwait(int *spins)
{
    if (++*spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    } else {
        *spins = 0;
        sched_yield();
    }
}

static uintptr_t xlap(int64_t i)
{
    return (uintptr_t)((i & XRING) != 0);
}

/* Queue item i (the producer's side). */
static void xfer_put(struct xfer *x, int64_t i, int *spins)
{
    struct xitem *it = &x->items[i];
    it->seq = (uint64_t)i;
    {
        switch (x->kind) {
        case X_SPSC_PAWL: {
            int64_t t = atomic_load_explicit(PAWL_ATOMIC_OF(&x->tail), memory_order_relaxed);
            while (t - x->head_seen >= XRING) {
                x->head_seen = atomic_load_explicit(PAWL_ATOMIC_OF(&x->head), memory_order_acquire);
                if (t - x->head_seen >= XRING)
                    xwait(spins);
            }
            atomic_store_explicit(PAWL_ATOMIC_OF(&x->slot[t & (XRING - 1)]), it,
                                  memory_order_relaxed);
            atomic_store_explicit(PAWL_ATOMIC_OF(&x->tail), t + 1, memory_order_release);
            break;
        }
        case X_SPSC_CK:
            while (!ck_ring_enqueue_spsc(&x->ring, x->buf, it))
                xwait(spins);
            break;
        case X_MP_PAWL: {
            int64_t t = atomic_load_explicit(PAWL_ATOMIC_OF(&x->tail), memory_order_relaxed);
            for (;;) {
                if (t + 1 - x->head_seen > XRING) {
                    x->head_seen =
                        atomic_load_explicit(PAWL_ATOMIC_OF(&x->head), memory_order_acquire);
                    if (t + 1 - x->head_seen > XRING) {
                        xwait(spins);
                        continue;
                    }
                }
                if (atomic_compare_exchange_weak_explicit(PAWL_ATOMIC_OF(&x->tail), &t, t + 1,
                                                          memory_order_seq_cst,
                                                          memory_order_relaxed))
                    break;
            }
            atomic_store_explicit(PAWL_ATOMIC_OF(&x->slot[t & (XRING - 1)]),
                                  (struct xitem *)((uintptr_t)it | xlap(t)), memory_order_release);
            break;
        }
        case X_MP_CK:
            while (!ck_ring_enqueue_mpsc(&x->ring, x->buf, it))
                xwait(spins);
            break;
        case X_LIST_PAWL:
            pawl__mpsc_push_mp(&x->list, &it->link);
            break;
        case X_LIST_CK:
            ck_fifo_mpmc_enqueue(&x->fifo, &x->entries[i], it);
            break;
        }
    }
}

static void *xfer_producer(void *arg)
{
    struct xfer *x = arg;
    int spins = 0;
    for (int64_t i = 0; i < XFER; i++)
        xfer_put(x, i, &spins);
    return NULL;
}

/* The consumer's next up to want items; 0 when none is visible yet. */
static int64_t xfer_take(struct xfer *x, struct xitem **out, int64_t want)
{
    switch (x->kind) {
    case X_SPSC_PAWL: {
        int64_t h = atomic_load_explicit(PAWL_ATOMIC_OF(&x->head), memory_order_relaxed);
        int64_t t = atomic_load_explicit(PAWL_ATOMIC_OF(&x->tail), memory_order_acquire);
        int64_t n = PAWL_MIN(t - h, want);
        for (int64_t i = 0; i < n; i++)
            out[i] = atomic_load_explicit(PAWL_ATOMIC_OF(&x->slot[(h + i) & (XRING - 1)]),
                                          memory_order_relaxed);
        if (n > 0)
            atomic_store_explicit(PAWL_ATOMIC_OF(&x->head), h + n, memory_order_release);
        return n > 0 ? n : 0;
    }
    case X_MP_PAWL: {
        int64_t h = atomic_load_explicit(PAWL_ATOMIC_OF(&x->head), memory_order_relaxed);
        int64_t avail = atomic_load_explicit(PAWL_ATOMIC_OF(&x->tail), memory_order_acquire) - h;
        int64_t got = 0;
        while (got < want && got < avail) {
            int64_t i = h + got;
            struct xitem *v = atomic_load_explicit(PAWL_ATOMIC_OF(&x->slot[i & (XRING - 1)]),
                                                   memory_order_acquire);
            if (((uintptr_t)v & 1) != xlap(i) || ((uintptr_t)v & ~(uintptr_t)1) == 0)
                break;
            out[got++] = (struct xitem *)((uintptr_t)v & ~(uintptr_t)1);
        }
        if (got > 0)
            atomic_store_explicit(PAWL_ATOMIC_OF(&x->head), h + got, memory_order_release);
        return got;
    }
    case X_SPSC_CK:
    case X_MP_CK: {
        int64_t got = 0;
        while (got < want && ck_ring_dequeue_spsc(&x->ring, x->buf, &out[got]))
            got++;
        return got;
    }
    case X_LIST_PAWL: {
        void **link = pawl__mpsc_pop_sc(&x->list);
        if (link == NULL || link == PAWL_MPSC_BUSY)
            return 0;
        out[0] = PAWL_CONTAINER_OF(link, struct xitem, link);
        return 1;
    }
    default: {
        ck_fifo_mpmc_entry_t *garbage;
        return ck_fifo_mpmc_dequeue(&x->fifo, &out[0], &garbage) ? 1 : 0;
    }
    }
}

static void bm_structure(pawl_bench_state *st, void *arg)
{
    struct xfer *x = aligned_alloc(PAWL_CACHELINE, sizeof(*x));
    memset(x, 0, sizeof(*x));
    x->kind = (int)((intptr_t)arg % 8);
    int two = (intptr_t)arg >= 8;
    x->items = calloc(XFER, sizeof(*x->items));
    x->slot = calloc(XRING, sizeof(*x->slot));
    x->buf = calloc(XRING, sizeof(*x->buf));
    x->entries = calloc(XFER + 1, sizeof(*x->entries));
    if (x->items == NULL || x->slot == NULL || x->buf == NULL || x->entries == NULL) {
        pawl_bench_skip_with_error(st, "out of memory");
        goto out;
    }
    int64_t total = 0;
    int ok = 1;
    while (pawl_bench_keep_running(st)) {
        x->tail = x->head = x->head_seen = 0;
        memset(x->slot, 0, XRING * sizeof(*x->slot));
        ck_ring_init(&x->ring, XRING);
        pawl__mpsc_init(&x->list);
        ck_fifo_mpmc_init(&x->fifo, &x->entries[XFER]);
        pthread_t th;
        if (two)
            pthread_create(&th, NULL, xfer_producer, x);
        struct xitem *out[XTAKE];
        int spins = 0;
        for (int64_t got = 0, put = 0; got < XFER;) {
            /* One thread: put XROUND items, then take them back. */
            for (; !two && put < got + XROUND && put < XFER; put++)
                xfer_put(x, put, &spins);
            int64_t n = xfer_take(x, out, XTAKE);
            if (n == 0)
                xwait(&spins);
            for (int64_t i = 0; i < n; i++)
                ok &= out[i]->seq == (uint64_t)(got + i);
            got += n;
        }
        if (two)
            pthread_join(th, NULL);
        total += XFER;
    }
    if (!ok)
        pawl_bench_skip_with_error(st, "items arrived out of order");
    pawl_bench_set_items_processed(st, total);
out:
    free(x->items);
    free(x->slot);
    free(x->buf);
    free(x->entries);
    free(x);
}

int main(int argc, char **argv)
{
    void *BASE = (void *)1;
    pawl_bench_use_real_time(pawl_bench_register("submit_run/inject/pawl_pool", bm_inject, NULL));
    pawl_bench_use_real_time(pawl_bench_register("submit_run/inject/mutex_queue", bm_inject, BASE));
    pawl_bench_use_real_time(
        pawl_bench_register("submit_run/inject_batch/pawl_pool", bm_inject_batch, NULL));
    pawl_bench_use_real_time(
        pawl_bench_register("submit_run/inject_batch/mutex_queue", bm_inject_batch, BASE));
    pawl_bench_use_real_time(pawl_bench_register("submit_run/spawn/pawl_pool", bm_spawn, NULL));
    pawl_bench_use_real_time(pawl_bench_register("submit_run/spawn/mutex_queue", bm_spawn, BASE));
    pawl_bench_use_real_time(pawl_bench_register("submit_run/chain/pawl_pool", bm_chain, NULL));
    pawl_bench_use_real_time(pawl_bench_register("submit_run/chain/mutex_queue", bm_chain, BASE));
    pawl_bench_unit_ns(pawl_bench_use_real_time(
        pawl_bench_register("steal_latency/pawl_pool", bm_steal_latency, NULL)));
    pawl_bench_unit_ns(pawl_bench_use_real_time(
        pawl_bench_register("steal_latency/mutex_condvar_handoff", bm_steal_latency, BASE)));
    pawl_bench_use_real_time(pawl_bench_register("future_complete_to_continuation/throughput/pawl",
                                                 bm_future_throughput, NULL));
    pawl_bench_use_real_time(pawl_bench_register(
        "future_complete_to_continuation/throughput/mutex_condvar", bm_future_throughput, BASE));
    pawl_bench_use_real_time(
        pawl_bench_register("future_complete_to_continuation/chain/pawl", bm_future_chain, NULL));
    pawl_bench_use_real_time(pawl_bench_register(
        "future_complete_to_continuation/chain/mutex_condvar", bm_future_chain, BASE));
    pawl_bench_unit_ns(pawl_bench_use_real_time(pawl_bench_register(
        "future_complete_to_continuation/latency/pawl", bm_future_latency, NULL)));
    pawl_bench_unit_ns(pawl_bench_use_real_time(pawl_bench_register(
        "future_complete_to_continuation/latency/mutex_condvar", bm_future_latency, BASE)));
    pawl_bench_use_real_time(
        pawl_bench_register("timer_arm_fire/io_uring", bm_timer_arm_fire, NULL));
    pawl_bench_use_real_time(pawl_bench_register("timer_arm_fire/epoll", bm_timer_arm_fire, BASE));
    const char *tnames[] = {"timer_delay/io_uring/1ms", "timer_delay/epoll/1ms",
                            "timer_delay/io_uring/1-16ms", "timer_delay/epoll/1-16ms"};
    for (int i = 0; i < 4; i++) {
        pawl_bench *b = pawl_bench_register(tnames[i], bm_timer_delay, NULL);
        pawl_bench_arg(b, (i % 2) * 100 + (i < 2 ? 1 : 16));
        pawl_bench_use_real_time(b);
    }
    const char *snames[] = {"structure/ring_spsc/pawl", "structure/ring_spsc/ck_ring",
                            "structure/ring_mp/pawl",   "structure/ring_mp/ck_ring",
                            "structure/list_mpsc/pawl", "structure/list_mpsc/ck_fifo"};
    for (int i = 0; i < 12; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s/%s", snames[i % 6], i < 6 ? "1thread" : "2threads");
        pawl_bench *b =
            pawl_bench_register(name, bm_structure, (void *)(intptr_t)(i % 6 + (i < 6 ? 0 : 8)));
        if (i >= 6) /* /1thread: the thread's CPU time, robust to a loaded machine */
            pawl_bench_use_real_time(b);
    }
    return pawl_bench_main(argc, argv);
}
