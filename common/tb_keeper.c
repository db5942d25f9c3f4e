/*
 * tbrdma common layer: the keeper (tb_keeper.h).
 *
 * The gate between the owner and the keeper is Dekker's: the owner raises
 * `inside` then reads `busy`, the keeper raises `busy` then reads `inside`;
 * whoever sees the other's flag backs off.  That needs each side's store
 * ordered before its load.  The keeper gets it from a full fence; the owner,
 * which enters on every send and progress call, gets it from the keeper's
 * membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which runs a full barrier on
 * every thread of the process before it returns: an owner store before that
 * barrier is seen by the keeper, and an owner load after it sees `busy`.
 * Without membarrier the owner fences (sequentially consistent accesses).
 */
#include "tb_keeper.h"

#include "tb_clock.h"
#include "tb_log.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#    include <linux/membarrier.h>
#    include <sys/syscall.h>
#    include <unistd.h>
#endif

struct tb_keeper {
    _Atomic int inside;     /* the owner is in (the outermost enter) */
    _Atomic int busy;       /* the keeper works or is about to */
    unsigned depth;         /* the owner's nesting, the owner's own */
    _Atomic uintptr_t keeper_tid; /* the keeper's thread: it holds the gate in its work */
    int fenced;             /* the owner fences its entries (no membarrier) */
    int away;               /* the keeper's work runs, the keeper's own */
    pthread_t thread;
    uint64_t period_ns;
    tb_keeper_work_fn work;
    void *ctx;
    _Atomic uint64_t touched_ns; /* the owner's latest progress */
    _Atomic int stop;
    _Atomic uint64_t runs;
};

static int membarrier_register(void)
{
#if defined(__linux__) && defined(SYS_membarrier)
    return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 ? 0
                                                                                        : -errno;
#else
    return -ENOSYS;
#endif
}

static void membarrier_all(void)
{
#if defined(__linux__) && defined(SYS_membarrier)
    (void) syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
#endif
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t) (ns / 1000000000ull),
                          .tv_nsec = (long) (ns % 1000000000ull)};

    while (0 != nanosleep(&ts, &ts) && EINTR == errno) {
    }
}

/* Signed: a stamp read on another core may be a little ahead of now. */
static int owner_away(tb_keeper_t *k, uint64_t now)
{
    int64_t since = (int64_t) (now - atomic_load_explicit(&k->touched_ns, memory_order_relaxed));

    return since >= (int64_t) k->period_ns;
}

/* The keeper's side of the gate: 1 with the owner kept out, 0 if it is in. */
static int keeper_close_gate(tb_keeper_t *k)
{
    atomic_store_explicit(&k->busy, 1, memory_order_seq_cst);
    if (!k->fenced) {
        membarrier_all();
    }
    if (atomic_load_explicit(&k->inside, memory_order_seq_cst)) {
        atomic_store_explicit(&k->busy, 0, memory_order_release);
        return 0;
    }
    return 1;
}

static void *keeper_main(void *arg)
{
    tb_keeper_t *k = arg;
    sigset_t all;

    /* The application's signals are for its own threads. */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    atomic_store_explicit(&k->keeper_tid, (uintptr_t) pthread_self(), memory_order_relaxed);
    while (!atomic_load_explicit(&k->stop, memory_order_acquire)) {
        uint64_t now;

        sleep_ns(k->period_ns);
        now = tb_now_ns();
        if (!owner_away(k, now) || !keeper_close_gate(k)) {
            continue;
        }
        /* The owner may have come and gone while this thread waited. */
        now = tb_now_ns();
        if (owner_away(k, now) && !atomic_load_explicit(&k->stop, memory_order_relaxed)) {
            k->away = 1;
            k->work(k->ctx, now);
            k->away = 0;
            atomic_fetch_add_explicit(&k->runs, 1, memory_order_relaxed);
        }
        atomic_store_explicit(&k->busy, 0, memory_order_release);
    }
    return NULL;
}

int tb_keeper_create(uint64_t period_ns, tb_keeper_work_fn work, void *ctx, unsigned flags,
                     tb_keeper_t **out)
{
    tb_keeper_t *k;
    int rc;

    *out = NULL;
    if (period_ns < 1000000ull || NULL == work) {
        return -EINVAL;
    }
    k = calloc(1, sizeof(*k));
    if (NULL == k) {
        return -ENOMEM;
    }
    k->period_ns = period_ns;
    k->work = work;
    k->ctx = ctx;
    atomic_init(&k->inside, 0);
    atomic_init(&k->busy, 0);
    atomic_init(&k->touched_ns, tb_now_ns());
    atomic_init(&k->stop, 0);
    atomic_init(&k->runs, 0);
    atomic_init(&k->keeper_tid, 0);
    k->fenced = (flags & TB_KEEPER_FENCED) || 0 != membarrier_register();
    /* Before the thread starts: its first work call may already use it. */
    *out = k;
    rc = pthread_create(&k->thread, NULL, keeper_main, k);
    if (0 != rc) {
        *out = NULL;
        tb_log(TB_LOG_ERROR, "keeper: pthread_create: %s (too many threads for this user? "
                             "ulimit -u)", strerror(rc));
        free(k);
        return -rc;
    }
    return 0;
}

void tb_keeper_destroy(tb_keeper_t *k)
{
    if (NULL == k) {
        return;
    }
    atomic_store_explicit(&k->stop, 1, memory_order_release);
    pthread_join(k->thread, NULL);
    free(k);
}

/* The keeper's work calling back into owner code: it holds the gate. */
static int on_keeper(tb_keeper_t *k)
{
    return atomic_load_explicit(&k->keeper_tid, memory_order_relaxed) == (uintptr_t) pthread_self();
}

/* depth is written only by an owner past the gate, so the keeper, which
 * never changes it, reads 0 there while it works: an owner's nested entry is
 * depth > 0, and an entry at depth 0 is an owner's first or the keeper's. */
void tb_keeper_enter(tb_keeper_t *k)
{
    if (k->depth) {
        k->depth++;
        return;
    }
    if (on_keeper(k)) {
        return;
    }
    for (unsigned spins = 0;; ++spins) {
        if (k->fenced) {
            atomic_store_explicit(&k->inside, 1, memory_order_seq_cst);
            if (!atomic_load_explicit(&k->busy, memory_order_seq_cst)) {
                break;
            }
        } else {
            atomic_store_explicit(&k->inside, 1, memory_order_relaxed);
            atomic_signal_fence(memory_order_seq_cst);
            if (!atomic_load_explicit(&k->busy, memory_order_acquire)) {
                break;
            }
        }
        /* The keeper works: wait outside until it is done. */
        atomic_store_explicit(&k->inside, 0, memory_order_release);
        while (atomic_load_explicit(&k->busy, memory_order_acquire)) {
            if (spins++ >= 64) {
                sched_yield();
            }
        }
    }
    k->depth = 1;
}

void tb_keeper_leave(tb_keeper_t *k)
{
    if (0 == k->depth) {
        return; /* the keeper's (see tb_keeper_enter) */
    }
    if (0 == --k->depth) {
        atomic_store_explicit(&k->inside, 0, memory_order_release);
    }
}

void tb_keeper_touch(tb_keeper_t *k, uint64_t now_ns)
{
    atomic_store_explicit(&k->touched_ns, now_ns, memory_order_relaxed);
}

int tb_keeper_away(const tb_keeper_t *k)
{
    return k->away;
}

uint64_t tb_keeper_runs(tb_keeper_t *k)
{
    return atomic_load_explicit(&k->runs, memory_order_relaxed);
}

int tb_keeper_fenced(const tb_keeper_t *k)
{
    return k->fenced;
}
