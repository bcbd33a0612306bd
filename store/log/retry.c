/*
 * retry.c — delayed retries: the pawl-retry thread. It submits again the appends that must wait
 * before their next try (a stream's lock timeout, a lost connection of an append with ids:
 * append_op.c puts them here with pawl__log_retry_delay, off the I/O thread that must not sleep),
 * and it fires the group linger (grp_linger_due, set by group.c, which wakes the thread with
 * pawl__log_retry_wake). retry_mu guards the delayed list (unsorted, linked through next_free)
 * and retry_stop; retry_cond wakes the thread. A delayed op belongs to this thread until it is
 * submitted again. pawl__log_retry_delay and pawl__log_retry_wake may be called from any thread
 * (the I/O threads included: they only take retry_mu); start and stop belong to the store's
 * life cycle (store.c).
 */
#include "log_internal.h"

#include "timers.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* Queue op for a retry at due_ns on the retry thread (never on the I/O thread). */
void pawl__log_retry_delay(struct pawl_store *s, struct append_op *op, int64_t due_ns)
{
    op->due_ns = due_ns;
    pthread_mutex_lock(&s->retry_mu);
    op->next_free = s->delayed;
    s->delayed = op;
    pthread_cond_signal(&s->retry_cond);
    pthread_mutex_unlock(&s->retry_mu);
}

/* A group linger was armed (grp_linger_due, group.c): let the thread see its deadline. */
void pawl__log_retry_wake(struct pawl_store *s)
{
    pthread_mutex_lock(&s->retry_mu);
    pthread_cond_signal(&s->retry_cond);
    pthread_mutex_unlock(&s->retry_mu);
}

static void *retry_main(void *arg)
{
    struct pawl_store *s = arg;
    pthread_mutex_lock(&s->retry_mu);
    for (;;) {
        int64_t now = pawl_now_ns(), next = 0;
        struct append_op *due = NULL, **pp = &s->delayed;
        while (*pp) {
            struct append_op *op = *pp;
            if (op->due_ns <= now) {
                *pp = op->next_free;
                op->next_free = due;
                due = op;
            } else {
                if (next == 0 || op->due_ns < next)
                    next = op->due_ns;
                pp = &op->next_free;
            }
        }
        if (due) {
            pthread_mutex_unlock(&s->retry_mu);
            while (due) {
                struct append_op *op = due;
                due = op->next_free;
                op->next_free = NULL;
                if (pawl__log_op_submit(s, op) != 0) {
                    struct pawl_append_result res;
                    memset(&res, 0, sizeof res);
                    res.rc = PAWL_ESHUTDOWN;
                    snprintf(res.message, sizeof res.message, "not appended: store closing");
                    pawl__log_op_finish(op, &res);
                }
            }
            pthread_mutex_lock(&s->retry_mu);
            continue;
        }
        /* relaxed: set under grp_mu and signalled under retry_mu, which we hold. */
        int64_t ldue = atomic_load_explicit(&s->grp_linger_due, memory_order_relaxed);
        if (ldue != 0 && ldue <= now) {
            pthread_mutex_unlock(&s->retry_mu);
            pawl__log_group_linger_fire(s);
            pthread_mutex_lock(&s->retry_mu);
            continue;
        }
        if (ldue != 0 && (next == 0 || ldue < next))
            next = ldue;
        if (s->retry_stop)
            break;
        if (next == 0) {
            pthread_cond_wait(&s->retry_cond, &s->retry_mu);
        } else {
            pawl__timed_wait(s->timers, &s->retry_mu, &s->retry_cond, CLOCK_MONOTONIC, next - now);
        }
    }
    pthread_mutex_unlock(&s->retry_mu);
    return NULL;
}

/* Start the retry thread (pawl_store_new). 0, or PAWL_ESYS. */
int pawl__log_retry_start(struct pawl_store *s)
{
    if (pthread_create(&s->retry_thread, NULL, retry_main, s) != 0)
        return PAWL_ESYS;
    pthread_setname_np(s->retry_thread, "pawl-retry");
    s->retry_started = 1;
    return 0;
}

/* Stop the retry thread and join it (pawl_store_free, after pawl_store_drain: nothing is
 * delayed any more; or a failed pawl_store_new). A no-op when it was not started. */
void pawl__log_retry_stop(struct pawl_store *s)
{
    if (!s->retry_started)
        return;
    pthread_mutex_lock(&s->retry_mu);
    PAWL_ASSERT(s->delayed == NULL); /* after pawl_store_drain, or before any append */
    s->retry_stop = 1;
    pthread_cond_signal(&s->retry_cond);
    pthread_mutex_unlock(&s->retry_mu);
    pthread_join(s->retry_thread, NULL);
    s->retry_started = 0;
}
