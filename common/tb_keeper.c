/*
 * tbrdma common layer: the keeper (tb_keeper.h).
 */
#include "tb_keeper.h"

#include "tb_clock.h"
#include "tb_log.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct tb_keeper {
    pthread_mutex_t lock;
    pthread_t thread;
    uint64_t period_ns;
    tb_keeper_work_fn work;
    void *ctx;
    _Atomic uint64_t touched_ns; /* the owner's latest progress */
    _Atomic int stop;
    _Atomic uint64_t runs;
    int away; /* under lock */
};

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

static void *keeper_main(void *arg)
{
    tb_keeper_t *k = arg;

    while (!atomic_load_explicit(&k->stop, memory_order_acquire)) {
        uint64_t now;

        sleep_ns(k->period_ns);
        now = tb_now_ns();
        if (!owner_away(k, now)) {
            continue;
        }
        pthread_mutex_lock(&k->lock);
        if (!atomic_load_explicit(&k->stop, memory_order_relaxed)) {
            /* The owner may have come back while this thread waited. */
            now = tb_now_ns();
            if (owner_away(k, now)) {
                k->away = 1;
                k->work(k->ctx, now);
                k->away = 0;
                atomic_fetch_add_explicit(&k->runs, 1, memory_order_relaxed);
            }
        }
        pthread_mutex_unlock(&k->lock);
    }
    return NULL;
}

int tb_keeper_create(uint64_t period_ns, tb_keeper_work_fn work, void *ctx, tb_keeper_t **out)
{
    pthread_mutexattr_t attr;
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
    atomic_init(&k->touched_ns, tb_now_ns());
    atomic_init(&k->stop, 0);
    atomic_init(&k->runs, 0);
    rc = pthread_mutexattr_init(&attr);
    if (0 == rc) {
        rc = pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
        if (0 == rc) {
            rc = pthread_mutex_init(&k->lock, &attr);
        }
        pthread_mutexattr_destroy(&attr);
    }
    if (0 != rc) {
        tb_log(TB_LOG_ERROR, "keeper: pthread_mutex_init: %s", strerror(rc));
        goto free;
    }
    /* Before the thread starts: its first work call may already use it. */
    *out = k;
    rc = pthread_create(&k->thread, NULL, keeper_main, k);
    if (0 != rc) {
        *out = NULL;
        tb_log(TB_LOG_ERROR, "keeper: pthread_create: %s (too many threads for this user? "
                             "ulimit -u)", strerror(rc));
        goto mutex;
    }
    return 0;

mutex:
    pthread_mutex_destroy(&k->lock);
free:
    free(k);
    return -rc;
}

void tb_keeper_destroy(tb_keeper_t *k)
{
    if (NULL == k) {
        return;
    }
    atomic_store_explicit(&k->stop, 1, memory_order_release);
    pthread_join(k->thread, NULL);
    pthread_mutex_destroy(&k->lock);
    free(k);
}

void tb_keeper_lock(tb_keeper_t *k)
{
    pthread_mutex_lock(&k->lock);
}

void tb_keeper_unlock(tb_keeper_t *k)
{
    pthread_mutex_unlock(&k->lock);
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
