/*
 * future.c — one-shot futures of a token or an error.
 *
 * State: one word, `head`, holds the continuation stack (a Treiber stack of records, newest
 * first) with three flags in the low bits that a record's alignment leaves free:
 *   CLAIMED  a completer has won; set by an atomic OR, so exactly one completer sees it clear
 *            (the others get PAWL_EALREADY);
 *   DONE     the outcome is published; set together with emptying the stack, by one exchange;
 *   WAITERS  a blocking waiter may be asleep on `wake`.
 * Completion is two read-modify-writes of head: fetch_or(CLAIMED) (the claim; relaxed would do,
 * acquire keeps the winner after earlier users), then, once the outcome is written,
 * exchange(head, CLAIMED|DONE) (acq_rel: release publishes the outcome to every acquire reader
 * that sees DONE; acquire takes the records pushed so far, and their contents, whole). The
 * completer then dispatches every record it took, oldest first. Registration pushes a record with
 * a CAS that keeps the flags as they are (release: the completer that takes the stack sees the
 * record's fields); a registrant that reads DONE (acquire: the outcome is visible to it)
 * dispatches its record itself. Every record is therefore dispatched exactly once and only after
 * the outcome is visible. The stack is only ever pushed and then taken whole, so there is no ABA
 * problem, and nothing on the path waits for another thread: it is lock-free.
 *
 * Dispatching pushes the record's task onto its executor: a serial executor's MPSC queue or the
 * pool (the completing worker's deque or the lock-free injection queue). User callbacks therefore
 * never run on the completing thread. Inline records (future.h) are the runtime's own.
 *
 * Blocking waiters (threads outside the pool) set WAITERS with an atomic OR on head and sleep on
 * `wake`, a separate 32-bit futex word, while it is 0. The completer's exchange returns the flag
 * if any waiter's OR came before it in head's modification order (only that exchange clears it);
 * it then stores 1 to `wake` (release) and wakes all. A waiter whose OR came after the exchange
 * reads DONE from the OR itself and does not sleep; one whose OR came before is either woken or
 * finds `wake` already 1 (the kernel compares it atomically with the sleep). No wake-up is lost.
 *
 * Lifetime: reference counted. A registered continuation holds no reference (so a future that
 * everybody drops without completing is freed, its records with it); once dispatched, the queued
 * task holds one until its callback returns. A completing or registering thread must hold one for
 * the duration of the call (the dispatch and the futex wake touch the future after the outcome is
 * published); pawl_future_complete_unref and _fail_unref consume that reference, handing it to
 * the continuation task queued last when there is one (see finish()); when theirs is the last
 * reference they complete without a read-modify-write (see sole_owner). Freed objects go to a
 * per-thread cache and are handed out again by pawl_future_new (see "the object cache" below: its
 * depot takes a mutex once per 64 objects, on allocation and on the last unref, never on the
 * completion path).
 */
#include "future.h"

#include "common.h"
#include "futex.h"
#include "mpsc.h"
#include "pawl/event.h"
#include "pool.h"
#include "timers.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Flags in the low bits of pawl_future.head (records are at least 8-byte aligned). */
#define F_CLAIMED ((uintptr_t)1)
#define F_DONE ((uintptr_t)2)
#define F_WAITERS ((uintptr_t)4)
#define F_FLAGS (F_CLAIMED | F_DONE | F_WAITERS)
enum { KIND_POOL, KIND_SERIAL, KIND_INLINE };

struct cont {
    struct pawl_task task; /* must stay first: dispatch submits &task */
    pawl_future_cb cb;     /* task, cb, arg, f: what a worker reads to run the record */
    void *arg;
    struct pawl_future *f;
    struct cont *next; /* the rest is written by the registrant and read by the dispatcher */
    int kind;
    struct pawl_serial *ex;
    struct pawl_pool *pool;
};

_Static_assert(_Alignof(struct cont) >= 8,
               "the flags need three free low bits in a record's address");

static inline struct cont *head_stack(uintptr_t h)
{
    return (struct cont *)(h & ~F_FLAGS); /* NOLINT(performance-no-int-to-ptr): tagged */
}

/*
 * The first 64 bytes hold what a pool worker touches to run a continuation whose record is the
 * embedded one and to drop the last reference: head, refs, the outcome and the record's task,
 * cb, arg and f. Those are the lines that move from the completing core to the worker: one or
 * two (depending on where the allocator placed the object) instead of the whole object.
 */
struct pawl_future {
    uintptr_t head; /* the continuation stack's top | F_* flags: see the file's comment */
    uint32_t refs;
    int code;
    int64_t token;
    struct cont first;   /* the first continuation's record: no allocation in the common case */
    char *msg;           /* set only by pawl_future_fail (then code != 0) */
    uint32_t wake;       /* futex word of blocking waiters: 0, then 1 once a waiter must wake */
    uint32_t first_used; /* 1 once `first` has been handed to a registration */
};

_Static_assert(offsetof(struct pawl_future, first.f) + sizeof(void *) <= 64,
               "the worker's fields share the first cache line");

static void cont_release(struct cont *c)
{
    if (c != &c->f->first)
        pawl_free(c);
}

/* ---- the object cache ----
 *
 * Futures are typically created on one thread and freed on another (the last reference is
 * usually dropped by the continuation task, on a pool worker). Handing each object back to the
 * general allocator then costs a remote free on the consumer and a refill on the producer, both
 * under the allocator's locks. This cache recycles whole future objects instead, in the style of
 * Bonwick's magazines:
 *
 *  - Each thread keeps two intrusive lists of free objects, `cur` (0..MAG_SIZE objects) and
 *    `spare` (empty or exactly MAG_SIZE), in thread-local storage: allocating and freeing touch
 *    only these, with no atomic operation. A free into a full `cur` makes it the spare (handing
 *    the old full spare, if any, to the depot); an allocation from an empty `cur` takes the full
 *    spare, or else a magazine from the depot, or else falls back to the allocator.
 *  - The depot is a stack of magazines (each a list, its first object holding the count and the
 *    link to the next magazine) behind one mutex, taken once per MAG_SIZE objects: a consumer's
 *    frees reach the producer's allocations in O(1) per magazine. A lock-free stack would need
 *    ABA protection on pop for no measurable gain at that rate.
 *  - The depot holds at most DEPOT_MAX objects (about 0.5 MiB); magazines beyond that go back to
 *    the allocator. A thread holds at most 2 * MAG_SIZE objects; when it exits, a pthread key's
 *    destructor hands them to the depot (so they are not stranded with the thread).
 *
 * Allocator hooks: the cache is used only while the hooks are the defaults (libc's calloc and
 * free); it therefore only ever holds objects from calloc, and drains them with free(). With
 * custom hooks (pawl_set_allocator), every future is allocated and freed through them as before,
 * and a thread that finds objects cached from before the change gives them back to free().
 *
 * AddressSanitizer: recycled objects would hide a use-after-free of a future from ASan (the
 * memory is never freed to it), so the cache is compiled out under ASan; build with
 * -DPAWL_FUTURE_CACHE=0 to compile it out elsewhere too.
 */
#ifndef PAWL_FUTURE_CACHE
#if defined(__SANITIZE_ADDRESS__)
#define PAWL_FUTURE_CACHE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PAWL_FUTURE_CACHE 0
#endif
#endif
#endif
#ifndef PAWL_FUTURE_CACHE
#define PAWL_FUTURE_CACHE 1
#endif

#define MAG_SIZE 64
#define DEPOT_MAX 4096
#define AHEAD 8

#if PAWL_FUTURE_CACHE

/* A free object's memory while it is in the cache. */
struct cached {
    struct cached *next;     /* the next object of the same magazine */
    struct cached *next_mag; /* in the depot, first object only: the next magazine */
    uint32_t n;              /* in the depot, first object only: objects in this magazine */
    struct cached *ahead;    /* NULL, or the object AHEAD places below this one in its list */
};

_Static_assert(sizeof(struct cached) <= sizeof(struct pawl_future), "a future holds a link");

static _Thread_local struct {
    struct cached *cur;   /* objects to allocate from and free to */
    struct cached *spare; /* NULL or a full magazine */
    uint32_t ncur;
    uint32_t run;                 /* frees pushed onto cur since the last pop or swap */
    struct cached *pushed[AHEAD]; /* the last AHEAD of them, by run % AHEAD */
    bool registered;              /* the exit destructor is armed for this thread */
} tc;

static pthread_mutex_t depot_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cached *depot; /* stack of magazines; under depot_lock */
static uint32_t depot_objs;  /* objects in the depot; written under depot_lock */
static pthread_key_t tc_key;
static pthread_once_t tc_once = PTHREAD_ONCE_INIT;
static bool tc_key_ok;

/* True while the allocator hooks are libc's: only then may objects be recycled. */
static inline bool cache_usable(void)
{
    return pawl__alloc.calloc == calloc && pawl__alloc.free == free;
}

static void free_list(struct cached *o)
{
    while (o) {
        struct cached *n = o->next;
        free(o); /* the cache holds only objects from calloc (see above) */
        o = n;
    }
}

/* Park a magazine of n objects in the depot, or free it if the depot is full. */
static void depot_put(struct cached *mag, uint32_t n)
{
    if (mag == NULL)
        return;
    pthread_mutex_lock(&depot_lock);
    if (depot_objs + n <= DEPOT_MAX) {
        mag->next_mag = depot;
        mag->n = n;
        depot = mag;
        /* Relaxed: the lock orders it; lock-free readers take it as a hint only. */
        atomic_store_explicit(PAWL_ATOMIC_OF(&depot_objs), depot_objs + n, memory_order_relaxed);
        mag = NULL;
    }
    pthread_mutex_unlock(&depot_lock);
    free_list(mag);
}

static struct cached *depot_take(uint32_t *n)
{
    /* Relaxed: a hint that saves the lock when the depot is empty; the lock decides. */
    if (atomic_load_explicit(PAWL_ATOMIC_OF(&depot_objs), memory_order_relaxed) == 0)
        return NULL;
    pthread_mutex_lock(&depot_lock);
    struct cached *mag = depot;
    if (mag) {
        depot = mag->next_mag;
        *n = mag->n;
        /* Relaxed: as in depot_put. */
        atomic_store_explicit(PAWL_ATOMIC_OF(&depot_objs), depot_objs - mag->n,
                              memory_order_relaxed);
    }
    pthread_mutex_unlock(&depot_lock);
    return mag;
}

/* Thread exit: hand this thread's objects to the depot. */
static void tc_exit(void *unused)
{
    (void)unused;
    depot_put(tc.cur, tc.ncur);
    depot_put(tc.spare, MAG_SIZE);
    tc.cur = tc.spare = NULL;
    tc.ncur = 0;
    tc.run = 0;
    tc.registered = false; /* a later free in this thread (another destructor) re-arms it */
}

static void tc_key_init(void)
{
    tc_key_ok = pthread_key_create(&tc_key, tc_exit) == 0;
}

/* Arm the exit destructor before this thread first holds objects; false if that fails. */
static bool tc_register(void)
{
    pthread_once(&tc_once, tc_key_init);
    if (!tc_key_ok || pthread_setspecific(tc_key, &tc) != 0)
        return false;
    tc.registered = true;
    return true;
}

/* The hooks are not libc's: give back whatever was cached before they changed. */
static void cache_drain(void)
{
    if (PAWL_UNLIKELY(tc.cur != NULL || tc.spare != NULL)) {
        free_list(tc.cur);
        free_list(tc.spare);
        tc.cur = tc.spare = NULL;
        tc.ncur = 0;
        tc.run = 0;
    }
    uint32_t n;
    struct cached *mag;
    while ((mag = depot_take(&n)) != NULL)
        free_list(mag);
}

static __attribute__((noinline)) struct cached *cache_refill(void)
{
    tc.run = 0;
    if (tc.spare) {
        tc.cur = tc.spare;
        tc.ncur = MAG_SIZE;
        tc.spare = NULL;
        return tc.cur;
    }
    if (!tc.registered && !tc_register())
        return NULL;
    uint32_t n = 0;
    struct cached *mag = depot_take(&n);
    tc.cur = mag;
    tc.ncur = mag ? n : 0;
    return mag;
}

static struct pawl_future *future_alloc(void)
{
    if (PAWL_LIKELY(cache_usable())) {
        struct cached *o = tc.cur;
        if (PAWL_UNLIKELY(o == NULL))
            o = cache_refill();
        if (PAWL_LIKELY(o != NULL)) {
            struct cached *next = o->next;
            struct cached *ahead = o->ahead;
            tc.cur = next;
            tc.ncur--;
            tc.run = 0; /* pushed[] no longer matches the depths below the top */
            /* Most of our objects were freed by another thread, whose frees pushed them here
             * in this order: fetch the lines of the one AHEAD allocations away, for writing,
             * so that up to AHEAD objects' misses are in flight at once instead of one after
             * the other (the locked operations of registration wait for the stores of this
             * initialisation, and so for the misses). A list is a stack: everything below an
             * object stays in place while it is in the list, so ahead is still right here. */
            if (ahead) {
                pawl_prefetch_w(ahead);
                pawl_prefetch_w((char *)ahead + sizeof(struct pawl_future) - 1);
            }
            /* The next object was most likely freed on another core: start fetching its lines
             * for writing now, so the next allocation does not wait for them. */
            if (next) {
                pawl_prefetch_w(next);
                pawl_prefetch_w((char *)next + sizeof(struct pawl_future) - 1);
            }
            struct pawl_future *f = (struct pawl_future *)o;
            /* Reset the fields that are read before they are written (refs: the caller); the
             * record `first` is filled by the registration that takes it. Field stores rather
             * than a memset of the object: no `rep stos` start-up. */
            f->head = 0;
            f->code = 0;
            f->token = 0;
            f->msg = NULL;
            f->wake = 0;
            f->first_used = 0;
            return f;
        }
    } else {
        cache_drain();
    }
    return pawl_calloc(1, sizeof(struct pawl_future));
}

static void future_release(struct pawl_future *f)
{
    if (PAWL_LIKELY(cache_usable())) {
        if (PAWL_UNLIKELY(tc.ncur == MAG_SIZE)) {
            depot_put(tc.spare, MAG_SIZE);
            tc.spare = tc.cur;
            tc.cur = NULL;
            tc.ncur = 0;
            tc.run = 0;
        }
        if (PAWL_LIKELY(tc.registered) || tc_register()) {
            struct cached *o = (struct cached *)f;
            o->next = tc.cur;
            /* The object pushed AHEAD frees ago is AHEAD places below o, if no pop or swap
             * came in between (run counts the pushes since). */
            o->ahead = tc.run >= AHEAD ? tc.pushed[tc.run % AHEAD] : NULL;
            tc.pushed[tc.run % AHEAD] = o;
            tc.run++;
            tc.cur = o;
            tc.ncur++;
            return;
        }
    } else {
        cache_drain();
    }
    pawl_free(f);
}

void pawl__future_cache_stats(struct pawl__future_cache_stats *st)
{
    st->enabled = cache_usable();
    st->thread_objs = tc.ncur + (tc.spare ? MAG_SIZE : 0);
    /* Relaxed: a snapshot for tests. */
    st->depot_objs = atomic_load_explicit(PAWL_ATOMIC_OF(&depot_objs), memory_order_relaxed);
    st->magazine = MAG_SIZE;
    st->depot_max = DEPOT_MAX;
}

#else /* !PAWL_FUTURE_CACHE */

static struct pawl_future *future_alloc(void)
{
    return pawl_calloc(1, sizeof(struct pawl_future));
}

static void future_release(struct pawl_future *f)
{
    pawl_free(f);
}

void pawl__future_cache_stats(struct pawl__future_cache_stats *st)
{
    memset(st, 0, sizeof(*st));
}

#endif

struct pawl_future *pawl_future_new(void)
{
    struct pawl_future *f = future_alloc();
    if (f)
        f->refs = 1;
    return f;
}

struct pawl_future *pawl_future_ref(struct pawl_future *f)
{
    /* Relaxed: taking a reference needs no ordering; the caller already holds one. */
    if (f) {
        PAWL_ASSERT(atomic_load_explicit(PAWL_ATOMIC_OF(&f->refs), memory_order_relaxed) >
                    0); /* the caller holds one */
        atomic_fetch_add_explicit(PAWL_ATOMIC_OF(&f->refs), 1, memory_order_relaxed);
    }
    return f;
}

void pawl_future_unref(struct pawl_future *f)
{
    if (f == NULL)
        return;
    /* A count of 1 is ours alone: nobody else can drop a reference, nor take one (taking one
     * needs one), so we are the last owner without a read-modify-write. That is the common end
     * of a continuation task (run_cont), whose completer has usually let go already. Acquire:
     * pairs with the release half of every earlier owner's decrement, as the RMW's would.
     * Otherwise acq_rel: release our writes; the last owner acquires everyone's before freeing. */
    /* Relaxed: a check that the caller holds a reference (an unref too many reads 0 here, or
     * garbage after a free that ASan reports). */
    PAWL_ASSERT(atomic_load_explicit(PAWL_ATOMIC_OF(&f->refs), memory_order_relaxed) > 0);
    if (atomic_load_explicit(PAWL_ATOMIC_OF(&f->refs), memory_order_acquire) != 1 &&
        (atomic_fetch_sub_explicit(PAWL_ATOMIC_OF(&f->refs), 1, memory_order_acq_rel) - 1) != 0)
        return;
    /* Nobody can complete f any more. Records still registered (f never completed) are
     * discarded: user continuations are not called; the runtime's inline ones are, so that
     * combinators settle (they see f still pending and treat it as abandoned). */
    /* Relaxed: we are the last owner and acquired every earlier owner's writes above. */
    struct cont *c =
        head_stack(atomic_load_explicit(PAWL_ATOMIC_OF(&f->head), memory_order_relaxed));
    while (c != NULL) {
        struct cont *n = c->next;
        if (c->kind == KIND_INLINE)
            c->cb(c->arg, f);
        cont_release(c);
        c = n;
    }
    if (f->code != 0) /* msg is set only on failure: leave its line alone otherwise */
        pawl_free(f->msg);
    future_release(f);
}

static void run_cont(struct pawl_task *task, int status)
{
    struct cont *c = (struct cont *)task;
    (void)status; /* cancelled at pool shutdown: still call cb so it can release resources */
    struct pawl_future *f = c->f;
    c->cb(c->arg, f);
    cont_release(c);      /* before the unref: an embedded record dies with f */
    pawl_future_unref(f); /* the reference dispatch() took */
}

/* The caller holds a reference to c->f (the completer, or the registrant). A record queued to an
 * executor takes a reference of its own for its task, unless own_ref hands it the caller's. */
static void dispatch(struct cont *c, bool own_ref)
{
    switch (c->kind) {
    case KIND_INLINE:
        c->cb(c->arg, c->f);
        cont_release(c);
        break;
    case KIND_SERIAL:
        if (!own_ref)
            pawl_future_ref(c->f); /* held while the task is queued */
        pawl_serial_submit(c->ex, &c->task);
        break;
    default:
        if (!own_ref)
            pawl_future_ref(c->f);
        pawl_pool_submit(c->pool, &c->task);
        break;
    }
}

/*
 * Publish the outcome and dispatch every record taken. give_ref: the caller's reference is
 * consumed. If the record dispatched last is queued to an executor, the reference passes to its
 * task, which would otherwise take one of its own (saving two atomic read-modify-writes: that
 * increment and the caller's decrement); otherwise it is dropped at the end. Nothing touches f
 * once that record is queued (its task may run and free f at once, the embedded record with
 * it): the waiters are woken first, and the loop reads each record's link before dispatching it.
 */
static void finish(struct pawl_future *f, bool give_ref, bool alone)
{
    uintptr_t old;
    if (alone) {
        /* The caller gives up the last reference (see sole_owner): nobody can push a record,
         * set WAITERS or complete meanwhile. Release: a reader that sees DONE (a continuation, or
         * a thread we hand a reference to) also sees the outcome. */
        old = atomic_load_explicit(PAWL_ATOMIC_OF(&f->head), memory_order_relaxed);
        atomic_store_explicit(PAWL_ATOMIC_OF(&f->head), F_CLAIMED | F_DONE, memory_order_release);
    } else {
        /* Acq_rel: release publishes token/code/msg to every acquire reader that sees DONE
         * (registrants, pawl_future_done, waiters); acquire takes every record pushed so far
         * and their contents. The stack is emptied in the same step, so later registrants see
         * DONE. */
        old = atomic_exchange_explicit(PAWL_ATOMIC_OF(&f->head), F_CLAIMED | F_DONE,
                                       memory_order_acq_rel);
    }
    /* The state machine: pending -> claimed (by exactly one completer) -> done, once. Alone, the
     * claim and the publication are the one store above. */
    PAWL_ASSERT(!(old & F_DONE) && (alone || (old & F_CLAIMED)));
    if (old & F_WAITERS) {
        /* Release: a waiter that reads 1 here (acquire) also sees the outcome. */
        atomic_store_explicit(PAWL_ATOMIC_OF(&f->wake), 1, memory_order_release);
        pawl__futex_wake(&f->wake, 0x7fffffff);
    }
    /* The stack is newest-first; dispatch in registration order. */
    struct cont *list = head_stack(old), *rev = NULL;
    /* The newest record is dispatched last: it takes the caller's reference if it is queued (an
     * inline record runs here and needs none). */
    struct cont *heir = give_ref && list != NULL && list->kind != KIND_INLINE ? list : NULL;
    while (list) {
        struct cont *n = list->next;
        list->next = rev;
        rev = list;
        list = n;
    }
    while (rev) {
        struct cont *n = rev->next;
        dispatch(rev, rev == heir);
        rev = n;
    }
    if (give_ref && heir == NULL)
        pawl_future_unref(f);
}

/*
 * The last owner's fast path. pawl_future_complete_unref and _fail_unref consume the caller's
 * reference. When the count reads 1 there, that reference is the last one: the continuation task
 * that inherits it may free the future as soon as it is queued, so no other thread can be using
 * the future during the call, whatever reference discipline it follows (one that were would be
 * racing with that free). Claiming and publishing then need no read-modify-write: a load of head
 * and a release store of CLAIMED|DONE do. That is the usual end of a future handed to an I/O
 * thread: the user registers, hands its reference to the completer (or drops its own) and the
 * completer finishes as the last owner. In bench_runtime's outside-completer shape it takes two
 * of the five locked instructions off each future (its completing phase fell from ~65 to ~24 ns
 * per future); the registration's two and the pool submission's fence remain.
 * Registration and the plain complete/fail keep their read-modify-writes: their caller keeps the
 * future alive after the call, and code that lets several threads use one reference (the stress
 * test test_completers_race races two completers and a registrant on a single reference) must
 * still get exactly-once completion and every continuation.
 * Acquire: pairs with the release half of the decrement that left the count at 1, so the other
 * owners' writes (records pushed, WAITERS) are visible to us.
 */
static inline bool sole_owner(const struct pawl_future *f)
{
    return atomic_load_explicit(PAWL_ATOMIC_OF(&f->refs), memory_order_acquire) == 1;
}

/* True if another completer got there first; then a reference handed over (give_ref) is
 * dropped here, since nothing will be dispatched to take it. *alone: the caller hands over the
 * last reference (see sole_owner), for finish(). */
static bool claimed_already(struct pawl_future *f, bool give_ref, bool *alone)
{
    *alone = give_ref && sole_owner(f);
    /* Alone: nobody can be completing concurrently; the CLAIMED bit is set by finish()'s
     * store, and nobody can observe the state in between. Otherwise: acquire, nothing to
     * acquire really, but keeps the winner ordered after earlier users. The OR is totally
     * ordered with every other completer's: exactly one sees CLAIMED clear. (Tested this way
     * round, GCC emits `lock bts`, not a CAS loop.) */
    uintptr_t h = *alone ? atomic_load_explicit(PAWL_ATOMIC_OF(&f->head), memory_order_relaxed)
                         : atomic_fetch_or_explicit(PAWL_ATOMIC_OF(&f->head), F_CLAIMED,
                                                    memory_order_acquire);
    if ((h & F_CLAIMED) == 0)
        return false;
    if (give_ref)
        pawl_future_unref(f);
    return true;
}

static int complete(struct pawl_future *f, int64_t token, bool give_ref)
{
    if (f == NULL)
        return PAWL_EINVAL;
    bool alone;
    if (claimed_already(f, give_ref, &alone))
        return PAWL_EALREADY;
    f->token = token;
    f->code = 0;
    finish(f, give_ref, alone);
    return 0;
}

static int fail(struct pawl_future *f, int code, const char *msg, bool give_ref)
{
    if (f == NULL)
        return PAWL_EINVAL;
    bool alone;
    if (claimed_already(f, give_ref, &alone))
        return PAWL_EALREADY;
    f->code = code < 0 ? code : PAWL_EINVAL;
    f->msg = pawl__strdup(msg ? msg : pawl_strerror(f->code)); /* NULL if out of memory: poll
                                                                 falls back to pawl_strerror */
    finish(f, give_ref, alone);
    return 0;
}

int pawl_future_complete(struct pawl_future *f, int64_t token)
{
    return complete(f, token, false);
}

int pawl_future_fail(struct pawl_future *f, int code, const char *msg)
{
    return fail(f, code, msg, false);
}

int pawl_future_complete_unref(struct pawl_future *f, int64_t token)
{
    return complete(f, token, true);
}

int pawl_future_fail_unref(struct pawl_future *f, int code, const char *msg)
{
    return fail(f, code, msg, true);
}

int pawl_future_done(const struct pawl_future *f)
{
    /* Acquire: pairs with finish(); the outcome is visible after a 1. */
    return (atomic_load_explicit(PAWL_ATOMIC_OF(&f->head), memory_order_acquire) & F_DONE) != 0;
}

int pawl_future_poll(const struct pawl_future *f, int64_t *token, int *code, const char **msg)
{
    if (f == NULL)
        return PAWL_EINVAL;
    if (!pawl_future_done(f))
        return PAWL_EAGAIN;
    if (token)
        *token = f->code == 0 ? f->token : 0;
    if (code)
        *code = f->code;
    if (msg)
        *msg = f->code == 0 ? NULL : (f->msg ? f->msg : pawl_strerror(f->code));
    return 0;
}

static int add_cont(struct pawl_future *f, int kind, struct pawl_serial *ex, struct pawl_pool *pool,
                    pawl_future_cb cb, void *arg)
{
    struct cont *c;
    /* Relaxed check, then an exchange that hands the embedded record to one registrant. */
    if (atomic_load_explicit(PAWL_ATOMIC_OF(&f->first_used), memory_order_relaxed) == 0 &&
        atomic_exchange_explicit(PAWL_ATOMIC_OF(&f->first_used), 1, memory_order_relaxed) == 0)
        c = &f->first;
    else if ((c = pawl_malloc(sizeof(*c))) == NULL)
        return PAWL_ENOMEM;
    c->task.fn = run_cont;
    c->task._next = NULL;
    c->kind = kind;
    c->ex = ex;
    c->pool = pool;
    c->cb = cb;
    c->arg = arg;
    c->f = f; /* no reference while registered: see pawl_future_unref */
    /* Acquire: if this reads DONE, finish() has published the outcome to us. */
    uintptr_t head = atomic_load_explicit(PAWL_ATOMIC_OF(&f->head), memory_order_acquire);
    for (;;) {
        if (head & F_DONE) {
            dispatch(c, false);
            return 0;
        }
        c->next = head_stack(head);
        /* Release: the completer that takes the stack sees the record's fields; the flags are
         * kept as they are. Acquire on failure: a DONE we read orders the outcome before our
         * dispatch. */
        if (atomic_compare_exchange_weak_explicit(PAWL_ATOMIC_OF(&f->head), &head,
                                                  (uintptr_t)c | (head & F_FLAGS),
                                                  memory_order_release, memory_order_acquire))
            return 0;
    }
}

int pawl_future_on_complete(struct pawl_future *f, struct pawl_serial *ex, struct pawl_pool *pool,
                            pawl_future_cb cb, void *arg)
{
    if (f == NULL || cb == NULL || (ex == NULL && pool == NULL))
        return PAWL_EINVAL;
    return add_cont(f, ex ? KIND_SERIAL : KIND_POOL, ex, pool, cb, arg);
}

int pawl__future_on_complete_inline(struct pawl_future *f, pawl_future_cb cb, void *arg)
{
    return add_cont(f, KIND_INLINE, NULL, NULL, cb, arg);
}

int pawl_future_wait(struct pawl_future *f, int64_t timeout_ms)
{
    if (f == NULL || pawl__pool_current() != NULL)
        return PAWL_EINVAL;
    int64_t deadline = timeout_ms >= 0 ? pawl_now_ns() + timeout_ms * 1000000 : -1;
    /* Acquire: pairs with finish()'s exchange; the outcome is visible once DONE is. */
    uintptr_t h = atomic_load_explicit(PAWL_ATOMIC_OF(&f->head), memory_order_acquire);
    if (h & F_DONE)
        return 0;
    /* Acquire: announce a sleeper. The OR is ordered with finish()'s exchange on head: before
     * it, the completer sees WAITERS and will wake us; after it, we read DONE here. */
    if ((atomic_fetch_or_explicit(PAWL_ATOMIC_OF(&f->head), F_WAITERS, memory_order_acquire) &
         F_DONE) != 0)
        return 0;
    for (;;) {
        int64_t left = -1;
        if (deadline >= 0) {
            left = deadline - pawl_now_ns();
            if (left <= 0)
                return pawl_future_done(f) ? 0 : PAWL_ETIMEDOUT;
        }
        pawl__futex_wait(&f->wake, 0, left);
        /* Acquire: pairs with finish()'s release store of 1 (stored after DONE was published). */
        if (atomic_load_explicit(PAWL_ATOMIC_OF(&f->wake), memory_order_acquire) != 0 ||
            pawl_future_done(f))
            return 0;
    }
}

/* ---- all-of ---- */

struct all_state {
    uint32_t refs;      /* one per input callback still to come */
    uint32_t remaining; /* inputs not yet completed successfully or failed */
    int64_t min;        /* lowest token so far */
    struct pawl_future *out;
};

static void all_release(struct all_state *st)
{
    /* Acq_rel: the last input callback frees the shared state. */
    if ((atomic_fetch_sub_explicit(PAWL_ATOMIC_OF(&st->refs), 1, memory_order_acq_rel) - 1) == 0) {
        pawl_future_unref(st->out);
        pawl_free(st);
    }
}

static void all_input_done(void *arg, struct pawl_future *in)
{
    struct all_state *st = arg;
    int64_t token = 0;
    int code = 0;
    const char *msg = NULL;
    if (pawl_future_poll(in, &token, &code, &msg) != 0) {
        code = PAWL_ECANCELED;
        msg = "all-of: an input future was released without being completed";
    }
    if (code != 0) {
        pawl_future_fail(st->out, code, msg); /* the first error wins; later ones EALREADY */
    } else {
        /* Relaxed CAS loop: the running minimum; ordered before the final completion by the
         * acq_rel decrement of remaining below. */
        int64_t cur = atomic_load_explicit(PAWL_ATOMIC_OF(&st->min), memory_order_relaxed);
        while (token < cur &&
               !atomic_compare_exchange_weak_explicit(PAWL_ATOMIC_OF(&st->min), &cur, token,
                                                      memory_order_relaxed, memory_order_relaxed))
            ;
    }
    /* Acq_rel: the input that completes last sees every other input's minimum update. */
    if ((atomic_fetch_sub_explicit(PAWL_ATOMIC_OF(&st->remaining), 1, memory_order_acq_rel) - 1) ==
        0)
        pawl_future_complete(st->out,
                             atomic_load_explicit(PAWL_ATOMIC_OF(&st->min), memory_order_relaxed));
    all_release(st);
}

struct pawl_future *pawl_future_all(struct pawl_future *const *fs, size_t n)
{
    if (n > 0 && fs == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (fs[i] == NULL)
            return NULL;
    struct pawl_future *out = pawl_future_new();
    if (out == NULL)
        return NULL;
    if (n == 0) {
        pawl_future_complete(out, PAWL_TOKEN_START);
        return out;
    }
    struct all_state *st = pawl_malloc(sizeof(*st));
    if (st == NULL) {
        pawl_future_unref(out);
        return NULL;
    }
    st->refs = (uint32_t)n;
    st->remaining = (uint32_t)n;
    st->min = INT64_MAX;
    st->out = pawl_future_ref(out);
    for (size_t i = 0; i < n; i++) {
        if (pawl__future_on_complete_inline(fs[i], all_input_done, st) != 0) {
            /* Out of memory half-way: fail the result; the inputs not registered release their
             * share of the state now. */
            pawl_future_fail(out, PAWL_ENOMEM, "all-of: out of memory registering inputs");
            for (size_t j = i; j < n; j++) {
                atomic_fetch_sub_explicit(PAWL_ATOMIC_OF(&st->remaining), 1, memory_order_acq_rel);
                all_release(st);
            }
            break;
        }
    }
    return out;
}

/* ---- or-timeout ----
 *
 * The state (with its timer) is freed by the timer's idle hook, which the timers module calls
 * once the timer's busy count drops to zero. The input side keeps one busy hold of its own from
 * creation until its callback has finished with the timer (cancel included), so the count can
 * reach zero only once: after both the input callback and every timer activity are over.
 */

struct timeout_state {
    int64_t ms;
    struct pawl_future *out;
    struct pawl_timers *tm;
    struct pawl_timer timer;
};

static void timeout_input_done(void *arg, struct pawl_future *in)
{
    struct timeout_state *st = arg;
    int64_t token = 0;
    int code = 0;
    const char *msg = NULL;
    if (pawl_future_poll(in, &token, &code, &msg) != 0) {
        code = PAWL_ECANCELED;
        msg = "or-timeout: the input future was released without being completed";
    }
    if (code == 0)
        pawl_future_complete(st->out, token);
    else
        pawl_future_fail(st->out, code, msg);
    pawl_timer_cancel(st->tm, &st->timer); /* 0 or PAWL_EALREADY: either way we are done */
    pawl__timer_unhold(&st->timer);        /* may free st */
}

static void timeout_fired(struct pawl_timer *t, void *arg, int status)
{
    struct timeout_state *st = arg;
    char msg[64];
    if (status == 0) {
        snprintf(msg, sizeof msg, "timed out after %lld ms", (long long)st->ms);
        pawl_future_fail(st->out, PAWL_ETIMEDOUT, msg);
    } else {
        pawl_future_fail(st->out, PAWL_ECANCELED, "timer cancelled: the pool is shutting down");
    }
}

static void timeout_timer_idle(struct pawl_timer *t)
{
    struct timeout_state *st = PAWL_CONTAINER_OF(t, struct timeout_state, timer);
    pawl_future_unref(st->out);
    pawl_free(st);
}

struct pawl_future *pawl_future_or_timeout(struct pawl_future *f, struct pawl_timers *tm,
                                           int64_t ms)
{
    if (f == NULL || tm == NULL || ms < 0)
        return NULL;
    struct pawl_future *out = pawl_future_new();
    struct timeout_state *st = pawl_calloc(1, sizeof(*st));
    if (out == NULL || st == NULL)
        goto fail;
    st->ms = ms;
    st->tm = tm;
    st->out = pawl_future_ref(out);
    pawl_timer_init(&st->timer, timeout_fired, st);
    st->timer._idle_fn = timeout_timer_idle;
    pawl__timer_hold(&st->timer); /* the input side's hold, dropped in timeout_input_done */
    if (pawl_timer_start(tm, &st->timer, ms, 0) != 0) {
        /* Nothing reached the timers thread; our hold kept the hook from running. */
        pawl_future_unref(st->out);
        goto fail;
    }
    /* From here the idle hook owns st. */
    if (pawl__future_on_complete_inline(f, timeout_input_done, st) != 0)
        pawl__timer_unhold(&st->timer); /* out of memory: the timer alone decides */
    return out;
fail:
    pawl_free(st);
    pawl_future_unref(out);
    return NULL;
}
