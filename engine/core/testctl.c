/*
 * testctl.c — pawl__test_control: the single door for tests into fault hooks, and the fault
 * switches it sets (see testctl.h).
 *
 * The switches are a small table under one mutex: an armed switch lets its first `skip` calls of
 * pawl__fault_sim pass and fails the `fail` calls after them, then frees its entry. `armed` counts
 * the live entries so that the modules' calls cost one load while no test armed anything (the
 * only case outside tests). Handlers are function pointers installed by the modules; core knows
 * them only by operation number.
 */
#include "testctl.h"

#include <pthread.h>
#include <stdatomic.h>

#include "common.h"

struct pawl_source; /* the processor layer's, used here as keys only */
struct pawl_tokens;

#define FAULT_SLOTS 32 /* switches armed at once; a test arms a handful */

struct fault_switch {
    const void *obj; /* NULL: a free entry */
    enum pawl_fault f;
    int skip; /* calls still to pass before failing */
    int fail; /* calls still to fail after them */
};

static pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fault_switch faults[FAULT_SLOTS]; /* under fault_mu */
/* Entries in use. Written under fault_mu; read without it as a hint (see pawl__fault_sim). */
static atomic_int armed;

/* Relaxed: a test sets it before creating the timers object that reads it, on the same thread. */
static atomic_int uring_errno;

static _Atomic(pawl_testctl_fn) handlers[PAWL_TESTCTL_OP_END];

int pawl__testctl_uring_errno(void)
{
    return atomic_load_explicit(&uring_errno, memory_order_relaxed);
}

/* Under fault_mu: the entry of (f, obj), or NULL. */
static struct fault_switch *fault_find(enum pawl_fault f, const void *obj)
{
    for (int i = 0; i < FAULT_SLOTS; i++)
        if (faults[i].obj == obj && faults[i].f == f)
            return &faults[i];
    return NULL;
}

/* Under fault_mu: free entry e. */
static void fault_clear(struct fault_switch *e)
{
    e->obj = NULL;
    e->f = 0;
    /* Relaxed: the count is a hint; the table itself is read under the mutex. */
    atomic_fetch_sub_explicit(&armed, 1, memory_order_relaxed);
}

/* Arm (replace) the switch of (f, obj): pass skip calls, then fail the next fail calls; fail 0
 * disarms it. PAWL_ENOMEM when the table is full. */
static int fault_arm(enum pawl_fault f, const void *obj, int skip, int fail)
{
    int rc = 0;
    pthread_mutex_lock(&fault_mu);
    struct fault_switch *e = fault_find(f, obj);
    if (fail <= 0) {
        if (e != NULL)
            fault_clear(e);
    } else {
        if (e == NULL && (e = fault_find(0, NULL)) != NULL) {
            e->obj = obj;
            e->f = f;
            /* Relaxed: see fault_clear. */
            atomic_fetch_add_explicit(&armed, 1, memory_order_relaxed);
        }
        if (e != NULL) {
            e->skip = skip;
            e->fail = fail;
        } else {
            rc = PAWL_ENOMEM;
        }
    }
    pthread_mutex_unlock(&fault_mu);
    return rc;
}

bool pawl__fault_sim(enum pawl_fault f, const void *obj)
{
    /* Relaxed: a switch is armed by the test before the work it should fail begins, and that
     * hand-over (a thread start, a queue, a lock) orders the count's increment before this
     * load; a call racing with the arming may miss it, as it may run first. */
    if (atomic_load_explicit(&armed, memory_order_relaxed) == 0)
        return false;
    bool fire = false;
    pthread_mutex_lock(&fault_mu);
    struct fault_switch *e = fault_find(f, obj);
    if (e != NULL) {
        if (e->skip > 0) {
            e->skip--;
        } else {
            fire = true;
            if (--e->fail == 0)
                fault_clear(e);
        }
    }
    pthread_mutex_unlock(&fault_mu);
    return fire;
}

void pawl__fault_forget(const void *obj)
{
    /* Relaxed: as in pawl__fault_sim; no test arms a switch for an object being freed. */
    if (obj == NULL || atomic_load_explicit(&armed, memory_order_relaxed) == 0)
        return;
    pthread_mutex_lock(&fault_mu);
    for (int i = 0; i < FAULT_SLOTS; i++)
        if (faults[i].obj == obj)
            fault_clear(&faults[i]);
    pthread_mutex_unlock(&fault_mu);
}

void pawl__testctl_install(int op, pawl_testctl_fn fn)
{
    PAWL_ASSERT(op > 0 && op < PAWL_TESTCTL_OP_END);
    /* Release: what the module set up before installing is visible to the caller of fn. */
    atomic_store_explicit(&handlers[op], fn, memory_order_release);
}

int pawl__test_control(int op, ...)
{
    va_list ap;
    int rc = 0;
    va_start(ap, op);
    switch (op) {
    case PAWL_TESTCTL_URING_ERRNO:
        atomic_store_explicit(&uring_errno, va_arg(ap, int), memory_order_relaxed);
        break;
    case PAWL_TESTCTL_SOURCE_MEM_FAIL_READS: {
        /* The module's objects, known here by address only. */
        struct pawl_source *s = va_arg(ap, struct pawl_source *);
        int n = va_arg(ap, int);
        rc = s == NULL ? PAWL_EINVAL : fault_arm(PAWL_FAULT_SOURCE_MEM_READ, s, 0, n);
        break;
    }
    case PAWL_TESTCTL_TOKENS_MEM_FAIL_COMMIT: {
        struct pawl_tokens *t = va_arg(ap, struct pawl_tokens *);
        int nth = va_arg(ap, int);
        rc = t == NULL ? PAWL_EINVAL
                       : fault_arm(PAWL_FAULT_TOKENS_MEM_COMMIT, t, nth - 1, nth > 0 ? 1 : 0);
        break;
    }
    default: {
        /* Acquire: pairs with pawl__testctl_install. */
        pawl_testctl_fn fn = op > 0 && op < PAWL_TESTCTL_OP_END
                                 ? atomic_load_explicit(&handlers[op], memory_order_acquire)
                                 : NULL;
        rc = fn != NULL ? fn(ap) : PAWL_EINVAL;
        break;
    }
    }
    va_end(ap);
    return rc;
}
