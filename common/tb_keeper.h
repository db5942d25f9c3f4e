/*
 * tbrdma common layer: the keeper, a thread that keeps a process's channels
 * alive while their owner is away.
 *
 * A process that owns its queue pairs (the BTL's direct path) moves its
 * channels only when it calls progress, that is from inside MPI.  A rank that
 * computes for minutes would stop answering keepalives, acknowledging data
 * and reposting receives, and its peers would declare it dead.  The keeper
 * wakes every period; when the owner has not progressed for a period it takes
 * the owner's lock and runs the owner's work function (acks, keepalives,
 * retransmissions, receives), which must hold back whatever has to reach the
 * application on its own threads.  While the owner progresses, the keeper
 * only looks at a time stamp and sleeps again: the owner's fast path pays
 * for one uncontended lock and one relaxed store.
 *
 * The lock is recursive (callbacks into the owner may take it again).
 */
#ifndef TB_KEEPER_H
#define TB_KEEPER_H

#include <stdint.h>

typedef struct tb_keeper tb_keeper_t;

/* Called by the keeper's thread with the lock held, at now_ns (monotonic). */
typedef void (*tb_keeper_work_fn)(void *ctx, uint64_t now_ns);

/* Start a keeper that runs work(ctx, now) when the owner has not called
 * tb_keeper_touch for period_ns (at least 1 ms).  *out is set before the
 * thread starts (its work may use it).  0, or a negative errno
 * (logged with the call that failed). */
int tb_keeper_create(uint64_t period_ns, tb_keeper_work_fn work, void *ctx, tb_keeper_t **out);

/* Stop the thread (it finishes a work call in progress), then free.  Call
 * without holding the lock. */
void tb_keeper_destroy(tb_keeper_t *k);

void tb_keeper_lock(tb_keeper_t *k);
void tb_keeper_unlock(tb_keeper_t *k);

/* The owner progressed at now_ns: the keeper stays out for another period. */
void tb_keeper_touch(tb_keeper_t *k, uint64_t now_ns);

/* 1 while the keeper's work function runs (then the caller holds the lock:
 * ask only with the lock held), else 0. */
int tb_keeper_away(const tb_keeper_t *k);

/* How many times the work function ran. */
uint64_t tb_keeper_runs(tb_keeper_t *k);

#endif /* TB_KEEPER_H */
