/*
 * pool_submit.c — submitting tasks: pawl_pool_submit, pawl_pool_submit_batch and pawl__pool_yield,
 * and the producer side of the queues they feed. A worker of the pool pushes onto its own deque
 * and checks for sleepers without a fence where membarrier(2) allows (notify_own); a thread
 * outside the pool queues single tasks on a producer ring of its own (registered on its first
 * submission, kept in thread-local storage and given back when the thread exits), batches on the
 * injection ring, and whatever does not fit on the list (pool_internal.h's inject_chain). The
 * consumer side of these queues is pool_worker.c's. The submit functions may be called from any
 * thread, by any number at once, while the pool is alive; pawl__pool_live_add,
 * pawl__pool_live_remove and pawl__pool_spsc_in_flight are for pawl_pool_new and pawl_pool_free.
 */
#include "pool_internal.h"

#define SPSC_TLS 4 /* pools a thread keeps its rings of at hand (more: see spsc_mine) */

/*
 * A worker has pushed onto its own deque. The full check (notify: a fence, then the read of
 * sleepers) is dear on this path: the fence waits for the push's stores, and thieves keep reading
 * the deque's bottom, so the store of bottom misses on a line another core holds (most of
 * submit's time in a fan-out). Where the pool registered for membarrier(2)
 * (pool->asym), the fence moves to the rare side of the hand-shake: a worker that parks while
 * another worker may be running issues MEMBARRIER_CMD_PRIVATE_EXPEDITED after announcing itself,
 * which makes every running thread of the process pass a full barrier before the parker
 * re-checks the queues. So either our push came before that barrier in our program order, and
 * the re-check sees it, or our read of sleepers came after it, and sees the sleeper (whose
 * increment preceded the membarrier call). Only the compiler must keep the store before the load.
 * Without membarrier (an old kernel, a seccomp profile that refuses it) we fence as every other
 * submitter does.
 *
 * (Skipping the fence when nothing is on the parking side loses wake-ups: a
 * worker announcing its sleep at the instant of our push re-checks without seeing it and sleeps,
 * and the child waits for as long as our task runs: for ever, if our task waits for the child;
 * test_busy_parent_child_taken.)
 */
static void notify_own(struct worker *w)
{
    struct pawl_pool *pool = w->pool;
    /* Relaxed: written once, before the workers start (pawl_pool_new). */
    if (!atomic_load_explicit(PAWL_ATOMIC_OF(&pool->asym), memory_order_relaxed)) {
        notify(pool);
        return;
    }
    /* Compiler barrier only: the push's stores stay before the load below in program order;
     * park()'s membarrier supplies the hardware barrier when it matters (see above). */
    atomic_signal_fence(memory_order_seq_cst);
    /* Relaxed: ordered against park() by its membarrier, as explained above. */
    if (atomic_load_explicit(PAWL_ATOMIC_OF(&pool->sleepers), memory_order_relaxed) > 0)
        wake_one(pool);
}

/*
 * The injection ring: RING_SIZE task pointers, reserved by submitters with one CAS on ring_tail
 * and taken in order by the consumer role (ring_head). It carries outside batches while it has
 * room; the linked queue above takes what does not fit, and single tasks. For a batch it saves
 * the submitter a write to every task (the links) and the consumer a dependent cache miss per
 * task: it reads pointers from consecutive slots (eight per line) instead of following a link
 * stored in each task (batches of 64 from outside: about +40% in alternating runs). Single
 * tasks measured no better or worse through it (one submission at a time, the consumer keeps
 * pace and each submission moves the tail's and a slot's line, as the list moves the count's
 * and a link's), so they stay on the list. The slot protocol:
 *   - slot i holds the task of index i with lap(i) = (i / RING_SIZE) & 1 in its low bit (a task
 *     is at least 8-byte aligned), so the consumer tells a task written this lap from the one
 *     left there a lap ago (or the NULL of a slot never used) without anyone clearing slots: the
 *     consumer only reads them, and a submitter's next store to the line does not have to take
 *     it back from the consumer's write. A submitter reserves slots [t, t + n) only if
 *     t + n - head <= RING_SIZE for a head it read with acquire: the consumer read every slot
 *     below head before publishing head (release), so the reserved slots are free and no one
 *     else writes them. head only grows, so an old head only makes the check stricter.
 *   - the submitter then wakes (the CAS, a seq_cst read-modify-write, is the publication that
 *     parking workers look for, as the add to inject_in is for the list) and stores the
 *     pointers (release), its last access to the pool: pawl_pool_free frees only after taking
 *     every reserved slot, which it can only do once the pointer is there.
 *   - the consumer reads a slot with acquire (the task's fields are visible) and publishes its
 *     new head with release. A reserved slot that still holds last lap's value (its submitter is
 *     between the CAS and the store) stops the consumer there; the count still says work is
 *     queued, so no worker parks on it.
 * Order: the ring and the list are each FIFO; between them a task may overtake another, which
 * the pool never promised. The consumer looks at the list first every LIST_TURN-th time, so a
 * busy ring cannot starve it.
 */
/* A head of the pool with that id this thread read (acquire): a lower bound of its head, which
 * spares a submission the read of the consumer's line while the ring has room. By id, not
 * address: a new pool may be allocated where a freed one was. */
static _Thread_local struct {
    uint64_t id;
    int64_t head;
} ring_seen;

static bool ring_push_mp(struct pawl_pool *pool, struct pawl_task *const *ts, int64_t n)
{
    /* Relaxed: a first guess; the CAS validates it. */
    int64_t t = atomic_load_explicit(PAWL_ATOMIC_OF(&pool->ring_tail), memory_order_relaxed);
    for (;;) {
        int64_t h = ring_seen.id == pool->id ? ring_seen.head : INT64_MIN / 2;
        if (t + n - h > RING_SIZE) {
            /* Acquire: the consumer's reads of the slots below head are done (see above). */
            h = atomic_load_explicit(PAWL_ATOMIC_OF(&pool->ring_head), memory_order_acquire);
            ring_seen.id = pool->id;
            ring_seen.head = h;
            if (t + n - h > RING_SIZE)
                return false;
        }
        /* Seq_cst: the publication, ordered before wake_one()'s load of sleepers. On failure t
         * is the current tail; the room is checked again. */
        if (atomic_compare_exchange_weak_explicit(PAWL_ATOMIC_OF(&pool->ring_tail), &t, t + n,
                                                  memory_order_seq_cst, memory_order_relaxed))
            break;
    }
    wake_one(pool);
    for (int64_t i = 0; i < n; i++) {
        /* Release: the consumer that reads the pointer (acquire) sees the task's fields. */
        atomic_store_explicit(PAWL_ATOMIC_OF(&pool->ring[(t + i) & (RING_SIZE - 1)]),
                              ring_tag(ts[i], t + i), memory_order_release);
    }
    return true;
}

/* Queue tasks from outside the pool (or a deque that cannot take them): the ring if they fit,
 * else one chain on the list. */
static void inject_tasks(struct pawl_pool *pool, struct pawl_task *const *ts, int64_t n)
{
    if (ring_push_mp(pool, ts, n))
        return;
    for (int64_t i = 0; i + 1 < n; i++) {
        /* Relaxed: the chain is published by pawl__mpsc_push_chain_mp's release operations. */
        atomic_store_explicit(PAWL_ATOMIC_OF(&ts[i]->_next), (void *)&ts[i + 1]->_next,
                              memory_order_relaxed);
    }
    inject_chain(pool, ts[0], ts[n - 1], n);
}

/*
 * Producer rings: each thread outside the pool that submits single tasks gets a ring of its own
 * (registered with the pool on its first submission), so that a submission writes only lines of
 * its own and the consumer reads task pointers from consecutive slots, up to INJECT_BATCH at
 * once, prefetching the tasks, instead of following one link per task through the list (each a
 * miss on a line the submitter just wrote, one after the other). The ring is ConcurrencyKit's
 * ck_ring (through ckring.h, which tells ThreadSanitizer about its hand-off). The protocol:
 *   - the owning thread pushes with ck_ring_enqueue_spsc: it writes the slot, then p_tail after
 *     a store fence; no read-modify-write. It reads the consumer's c_head on each push (the full
 *     check) and writes a slot only after the consumer stored a c_head past it.
 *   - then a seq_cst fence and wake_one(): the submitter half of the Dekker pattern with park(),
 *     whose re-check reads every ring's p_tail (spsc_estimate). The fence is what the seq_cst
 *     read-modify-write on inject_in gave the list's submitters.
 *   - then a release store of done = p_tail, the submitter's last access to the pool's state:
 *     pawl_pool_free waits until done == p_tail on every ring, so it cannot free the pool under
 *     a submitter still checking for sleepers.
 *   - the consumer role pops with ck_ring_dequeue_spsc: it reads p_tail, then (after a load
 *     fence) the slot, then stores c_head after a store fence.
 * A full ring, or no ring (the registry is full, or this thread cannot register a thread-exit
 * hook), sends the task to the list. The ring is the pool's (drained and freed by pawl_pool_free)
 * and lent to the thread: a thread that exits (or keeps rings of more than SPSC_TLS pools) gives
 * its ring back if the pool is still alive (owned = 0, release: its pushes happen before) and
 * another outside thread adopts it with whatever it still holds.
 * FIFO holds per ring, as on the list; a task that takes the list may overtake one on a ring.
 */
static _Thread_local struct spsc_tls {
    struct {
        struct pawl_pool *pool; /* compared by address and id: a freed pool's address is reused */
        uint64_t id;
        struct spsc_ring *ring; /* NULL: no ring for this pool (registry full); use the list */
    } e[SPSC_TLS];
    uint32_t evict; /* the entry to give up next when all are used */
    int keyed;      /* the thread-exit hook is registered */
} spsc_tls;
static pthread_key_t spsc_key;
static int spsc_key_ok;
static pthread_once_t spsc_key_once = PTHREAD_ONCE_INIT;

/*
 * The pools alive in the process, so that a thread giving its ring back (at exit, when the pool
 * may already be gone) touches the ring only while its pool is alive: pawl_pool_free unlinks the
 * pool under the same lock before it frees the rings. Taken once per thread and pool at most.
 */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pawl_pool *live_pools;

/* Link pool into the live pools (pawl_pool_new, once its workers run). */
void pawl__pool_live_add(struct pawl_pool *pool)
{
    pthread_mutex_lock(&live_lock);
    pool->live_next = live_pools;
    if (live_pools != NULL)
        live_pools->live_prev = pool;
    live_pools = pool;
    pthread_mutex_unlock(&live_lock);
}

/* Unlink pool (pawl_pool_free, before it frees the producer rings). */
void pawl__pool_live_remove(struct pawl_pool *pool)
{
    pthread_mutex_lock(&live_lock);
    if (pool->live_prev != NULL)
        pool->live_prev->live_next = pool->live_next;
    else
        live_pools = pool->live_next;
    if (pool->live_next != NULL)
        pool->live_next->live_prev = pool->live_prev;
    pthread_mutex_unlock(&live_lock);
}

/* The owning thread gives its ring r of the pool at that address and with that id back, if the
 * pool is still alive: another thread may adopt it (see spsc_register). */
static void spsc_let_go(struct pawl_pool *pool, uint64_t id, struct spsc_ring *r)
{
    pthread_mutex_lock(&live_lock);
    for (struct pawl_pool *p = live_pools; p != NULL; p = p->live_next) {
        if (p == pool && p->id == id) {
            /* Release: our slots, p_tail and done happen before the adopter's acquire. */
            atomic_store_explicit(PAWL_ATOMIC_OF(&r->owned), 0, memory_order_release);
            break;
        }
    }
    pthread_mutex_unlock(&live_lock);
}

/* Thread exit: give back every ring this thread holds. */
static void spsc_thread_exit(void *arg)
{
    struct spsc_tls *tls = arg;
    for (int i = 0; i < SPSC_TLS; i++) {
        if (tls->e[i].ring != NULL)
            spsc_let_go(tls->e[i].pool, tls->e[i].id, tls->e[i].ring);
        tls->e[i].pool = NULL;
        tls->e[i].ring = NULL;
    }
    /* Another key's destructor may still submit: register the hook again then (glibc runs the
     * destructors of values set meanwhile once more). */
    tls->keyed = 0;
}

static void spsc_key_create(void)
{
    spsc_key_ok = pthread_key_create(&spsc_key, spsc_thread_exit) == 0;
}

/* Registration, once per thread and pool: adopt a ring given back, or add one; NULL if the
 * registry is full or memory is short (the list takes the tasks). Under spsc_lock. */
static struct spsc_ring *spsc_register(struct pawl_pool *pool)
{
    struct spsc_ring *r = NULL;
    pthread_mutex_lock(&pool->spsc_lock);
    uint32_t n = pool->nspsc; /* only written under the lock */
    for (uint32_t i = 0; i < n && r == NULL; i++) {
        /* Acquire: pairs with spsc_let_go; the former owner's producer state is ours now. */
        if (atomic_load_explicit(PAWL_ATOMIC_OF(&pool->spsc[i]->owned), memory_order_acquire) ==
            0) {
            r = pool->spsc[i];
            /* Relaxed: adopters are serialised by the lock. */
            atomic_store_explicit(PAWL_ATOMIC_OF(&r->owned), 1, memory_order_relaxed);
        }
    }
    if (r == NULL && n < SPSC_MAX) {
        void *raw;
        r = calloc_lines(sizeof(*r), &raw);
        if (r != NULL) {
            ck_ring_init(&r->ck, SPSC_SIZE);
            r->raw = raw;
            r->owned = 1;
            pool->spsc[n] = r;
            /* Release: workers that read the new count (acquire) see the ring's fields. */
            atomic_store_explicit(PAWL_ATOMIC_OF(&pool->nspsc), n + 1, memory_order_release);
        }
    }
    pthread_mutex_unlock(&pool->spsc_lock);
    return r;
}

/* The calling thread's ring for pool, registering one on first use; NULL: use the list. */
static struct spsc_ring *spsc_mine(struct pawl_pool *pool)
{
    struct spsc_tls *tls = &spsc_tls;
    for (int i = 0; i < SPSC_TLS; i++)
        if (tls->e[i].pool == pool && tls->e[i].id == pool->id)
            return tls->e[i].ring;
    if (!tls->keyed) {
        pthread_once(&spsc_key_once, spsc_key_create);
        /* Without the exit hook our ring could never be given back: stay on the list. */
        if (!spsc_key_ok || pthread_setspecific(spsc_key, tls) != 0)
            return NULL;
        tls->keyed = 1;
    }
    /* A free entry, else the next in turn (its ring is given back; its pool may be gone, and
     * if it is alive another thread, or we later, adopt the ring). */
    int slot = -1;
    for (int i = 0; i < SPSC_TLS && slot < 0; i++)
        if (tls->e[i].pool == NULL)
            slot = i;
    if (slot < 0) {
        slot = (int)(tls->evict++ % SPSC_TLS);
        if (tls->e[slot].ring != NULL)
            spsc_let_go(tls->e[slot].pool, tls->e[slot].id, tls->e[slot].ring);
    }
    tls->e[slot].pool = pool;
    tls->e[slot].id = pool->id;
    tls->e[slot].ring = spsc_register(pool);
    return tls->e[slot].ring;
}

/* The owning thread: queue t on its ring r of pool and wake a worker if one sleeps; false if
 * the ring is full (nothing done). */
static bool spsc_push_sp(struct pawl_pool *pool, struct spsc_ring *r, struct pawl_task *t)
{
    /* ck_ring's store fence orders the slot (and the task) before its store of p_tail. */
    if (!pawl_ckring_push_sp(&r->ck, r->slot, t))
        return false;
    /* Seq_cst fence: orders the p_tail store before wake_one()'s load of sleepers (the
     * submitter half of the Dekker pattern with park(), whose re-check reads our p_tail). */
    pawl_fence_seq_cst();
    wake_one(pool);
    /* Release: everything we did to the pool happens before pawl_pool_free's acquire of done.
     * Only we write p_tail, so the plain ck_pr load reads our own push. */
    atomic_store_explicit(PAWL_ATOMIC_OF(&r->done), pawl_ckring_tail(&r->ck), memory_order_release);
    return true;
}

/* pawl_pool_free, once the workers are gone: is a submitter still publishing on (tasks not taken
 * yet) or checking for sleepers after publishing on one of the producer rings? */
bool pawl__pool_spsc_in_flight(struct pawl_pool *pool)
{
    /* Acquire: as in spsc_estimate (pool_worker.c). */
    uint32_t n = atomic_load_explicit(PAWL_ATOMIC_OF(&pool->nspsc), memory_order_acquire);
    for (uint32_t i = 0; i < n; i++) {
        struct spsc_ring *r = pool->spsc[i];
        /* Acquire: pairs with the release store of done; what the submitter did to the pool
         * before it happens before our free. Then p_tail and c_head (ck_pr loads; c_head is
         * ours now). */
        unsigned done = atomic_load_explicit(PAWL_ATOMIC_OF(&r->done), memory_order_acquire);
        unsigned tail = pawl_ckring_tail(&r->ck);
        if (done != tail || tail != pawl_ckring_head(&r->ck))
            return true;
    }
    return false;
}

int pawl_pool_submit(struct pawl_pool *pool, struct pawl_task *t)
{
    if (PAWL_UNLIKELY(pool == NULL || t == NULL || t->fn == NULL))
        return PAWL_EINVAL;
    struct worker *w = pawl__pool_tls_worker;
    if (w != NULL && w->pool == pool) {
        if (pawl__deque_push_owner(&w->dq, t) == 0)
            notify_own(w);
        else
            inject_push(pool, t); /* our deque is full and cannot grow */
        return 0;
    }
    struct spsc_ring *r = spsc_mine(pool);
    if (r == NULL || !spsc_push_sp(pool, r, t))
        inject_push(pool, t); /* no ring, or it is full: the list */
    return 0;
}

int pawl_pool_submit_batch(struct pawl_pool *pool, struct pawl_task *const *tasks, size_t n)
{
    if (PAWL_UNLIKELY(pool == NULL || tasks == NULL || n == 0 || n > (size_t)INT64_MAX))
        return PAWL_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (PAWL_UNLIKELY(tasks[i] == NULL || tasks[i]->fn == NULL))
            return PAWL_EINVAL;
    struct worker *w = pawl__pool_tls_worker;
    if (w != NULL && w->pool == pool && pawl__deque_push_n_owner(&w->dq, tasks, (int64_t)n) == 0) {
        /* One wake-up check for all of them: a worker we wake finds more left after its
         * first steal and wakes the next (worker_main, steal_any). */
        notify_own(w);
        return 0;
    }
    inject_tasks(pool, tasks, (int64_t)n);
    return 0;
}

int pawl__pool_yield(struct pawl_pool *pool, struct pawl_task *t)
{
    inject_push(pool, t);
    return 0;
}
