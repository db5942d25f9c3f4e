/*
 * tbrdma common layer: the keeper, a thread that keeps a process's channels
 * alive while their owner is away.
 *
 * A process that owns its queue pairs (the BTL's direct path) moves its
 * channels only when it calls progress, that is from inside MPI.  A rank that
 * computes for minutes would stop answering keepalives, acknowledging data
 * and reposting receives, and its peers would declare it dead.  The keeper
 * wakes every period; when the owner has not progressed for a period and is
 * not inside (tb_keeper_enter), it runs the owner's work function (acks,
 * keepalives, resends, receives), which must hold back whatever has to reach
 * the application on its own threads.
 *
 * The owner brackets every use of the state the work touches with
 * tb_keeper_enter and tb_keeper_leave.  They exclude the keeper, not other
 * owner threads (the owner serialises its own threads as before), and nest.
 * The owner pays no atomic read-modify-write and no fence for them: on Linux
 * the keeper, the rare side, forces the barrier on the owner's threads with
 * membarrier(2) (the asymmetric fence of userspace RCU); elsewhere, or where
 * membarrier is refused, the owner pays one full fence per entry.
 */
#ifndef TB_KEEPER_H
#define TB_KEEPER_H

#include <stdint.h>

typedef struct tb_keeper tb_keeper_t;

/* Called by the keeper's thread, the owner outside, at now_ns (monotonic). */
typedef void (*tb_keeper_work_fn)(void *ctx, uint64_t now_ns);

enum {
    TB_KEEPER_FENCED = 1, /* the owner fences each entry even where membarrier works */
};

/* Start a keeper that runs work(ctx, now) when the owner has not called
 * tb_keeper_touch for period_ns (at least 1 ms) and is not inside.  *out is
 * set before the thread starts (its work may use it).  flags: TB_KEEPER_*.
 * 0, or a negative errno (logged with the call that failed). */
int tb_keeper_create(uint64_t period_ns, tb_keeper_work_fn work, void *ctx, unsigned flags,
                     tb_keeper_t **out);

/* Stop the thread (it finishes a work call in progress), then free.  Call
 * from outside. */
void tb_keeper_destroy(tb_keeper_t *k);

/* The owner comes in (waiting while the keeper works) and goes out.  They
 * nest; one owner thread at a time.  Called from the work function (owner
 * code the keeper runs), they do nothing: the keeper holds the gate. */
void tb_keeper_enter(tb_keeper_t *k);
void tb_keeper_leave(tb_keeper_t *k);

/* The owner progressed at now_ns: the keeper stays out for another period. */
void tb_keeper_touch(tb_keeper_t *k, uint64_t now_ns);

/* 1 on the keeper's thread inside its work function, else 0 (for the owner,
 * inside, always 0). */
int tb_keeper_away(const tb_keeper_t *k);

/* How many times the work function ran; whether entries are fenced. */
uint64_t tb_keeper_runs(tb_keeper_t *k);
int tb_keeper_fenced(const tb_keeper_t *k);

#endif /* TB_KEEPER_H */
