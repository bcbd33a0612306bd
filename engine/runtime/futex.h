/*
 * futex.h — the two Linux futex operations the runtime parks on (worker parking in the pool,
 * blocking waits on futures). Private-futex flavour: every word lives in this process.
 *
 * A futex gives no memory ordering of its own: callers read and write the word with C11 atomic
 * operations that carry the ordering, and always re-check their condition after waking
 * (spurious wake-ups and EINTR are normal).
 */
#ifndef PAWL_ENGINE_FUTEX_H
#define PAWL_ENGINE_FUTEX_H

#include <stdint.h>

/* Sleep while *word == expected, at most timeout_ns (< 0: no limit). Returns 0 when woken or
 * the word differed, PAWL_ETIMEDOUT on timeout. Any thread. */
int pawl__futex_wait(uint32_t *word, uint32_t expected, int64_t timeout_ns);

/* Wake up to n sleepers on word; returns how many were woken. Any thread. */
int pawl__futex_wake(uint32_t *word, int n);

#endif
