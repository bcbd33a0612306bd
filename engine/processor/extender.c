/*
 * extender.c — the claim extender thread (pawl__extender_main, started by pawl_processor_start,
 * ended by pawl_processor_stop through p->stopped under emu): every claim_extend_interval_ms it
 * refreshes this node's claims in the token store, and marks a package whose claim another node
 * has taken as lost (its next step then ends it). It has a thread of its own rather than a
 * runtime timer, whose callbacks run as pool tasks: a pool busy with slow handlers must never let
 * a claim expire. Everything here runs on that thread; it snapshots the package list under p->mu
 * and calls the token store without the lock.
 */
#include "processor_int.h"

#include "timers.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define MOD "processor"

void *pawl__extender_main(void *arg)
{
    struct pawl_processor *p = arg;
    uint32_t *ids = NULL;
    uint64_t *gens = NULL;
    unsigned char *held = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&p->emu);
    while (!p->stopped) {
        pthread_mutex_unlock(&p->emu);
        /* Snapshot (segment, claim generation) under p->mu; the store call runs without it. */
        pthread_mutex_lock(&p->mu);
        size_t n = 0;
        for (struct pkg *k = p->pkgs; k; k = k->next)
            n++;
        if (n > cap) {
            size_t c = n * 2;
            uint32_t *ni = pawl_realloc(ids, c * sizeof *ni);
            if (ni)
                ids = ni;
            uint64_t *ng = pawl_realloc(gens, c * sizeof *ng);
            if (ng)
                gens = ng;
            unsigned char *nh = pawl_realloc(held, c);
            if (nh)
                held = nh;
            if (ni && ng && nh)
                cap = c;
        }
        n = 0;
        for (struct pkg *k = p->pkgs; k && n < cap; k = k->next) {
            ids[n] = k->seg.id;
            gens[n++] = k->gen;
        }
        pthread_mutex_unlock(&p->mu);

        int rc = p->tok->ops->extend(p->tok, p->name, p->node, ids, n, held);
        if (rc == 0) {
            pthread_mutex_lock(&p->mu);
            for (size_t i = 0; i < n; i++) {
                if (held[i])
                    continue;
                /* Only the claim we asked about: a newer package of the same id is not lost. */
                struct pkg *k = pawl_pkg_find(p, ids[i]);
                if (k && k->gen == gens[i] &&
                    !atomic_load_explicit(&k->release_req, memory_order_relaxed) &&
                    !atomic_exchange_explicit(&k->lost, 1, memory_order_relaxed)) {
                    PAWL_WARN(MOD, "%s: segment %u: claim taken over by another node", p->name,
                              k->seg.id);
                    pawl__pkg_schedule(k);
                }
            }
            pthread_mutex_unlock(&p->mu);
        } else {
            /* While stopping, a failed extension is retried until the stop ends; the stop's
             * own report says what it waits for, so this is no warning then. */
            pthread_mutex_lock(&p->mu);
            int stopping = p->stopping;
            pthread_mutex_unlock(&p->mu);
            pawl_log(stopping ? PAWL_LOG_DEBUG : PAWL_LOG_WARN, MOD,
                     "%s: extending claims failed: %s", p->name, p->tok->ops->errmsg(p->tok));
        }

        pthread_mutex_lock(&p->emu);
        if (p->stopped)
            break;
        pawl__timed_wait(p->timers, &p->emu, &p->ecv, CLOCK_REALTIME,
                         (int64_t)p->extend_ms * 1000000);
    }
    pthread_mutex_unlock(&p->emu);
    pawl_free(ids);
    pawl_free(gens);
    pawl_free(held);
    return NULL;
}
