/*
 * Unit tests of the keeper (tb_keeper.h): it works only while the owner is
 * away, always under the owner's lock, and stops when told.  The test
 * command also runs them under ThreadSanitizer, which checks that every
 * access the keeper and the owner share is ordered by the lock.
 */
#include "tb_clock.h"
#include "tb_keeper.h"

#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#define MS 1000000ull

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long) (ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
}

/* What the work function and the owner share: plain fields, guarded by the
 * keeper's lock only. */
typedef struct shared {
    tb_keeper_t *k;
    uint64_t counter;
    uint64_t work_calls;
    int inside;        /* a work call or an owner section is running */
    int overlaps;      /* times one found the other inside */
    int away_wrong;    /* tb_keeper_away said the wrong thing */
    uint64_t last_now; /* the work's clock never runs backwards */
    int relock;        /* the work takes the lock again (recursive) */
    unsigned work_sleep_ms;
} shared_t;

static void work(void *ctx, uint64_t now)
{
    shared_t *s = ctx;

    if (s->relock) {
        tb_keeper_lock(s->k);
    }
    if (s->inside) {
        s->overlaps++;
    }
    s->inside = 1;
    if (!tb_keeper_away(s->k)) {
        s->away_wrong++;
    }
    if (now < s->last_now) {
        s->away_wrong++;
    }
    s->last_now = now;
    s->counter++;
    s->work_calls++;
    if (s->work_sleep_ms) {
        sleep_ms(s->work_sleep_ms);
    }
    s->inside = 0;
    if (s->relock) {
        tb_keeper_unlock(s->k);
    }
}

static uint64_t calls_locked(shared_t *s)
{
    uint64_t n;

    tb_keeper_lock(s->k);
    n = s->work_calls;
    tb_keeper_unlock(s->k);
    return n;
}

START_TEST(bad_arguments)
{
    tb_keeper_t *k = (tb_keeper_t *) 1;

    ck_assert_int_eq(tb_keeper_create(MS - 1, work, NULL, &k), -EINVAL);
    ck_assert_ptr_null(k);
    ck_assert_int_eq(tb_keeper_create(MS, NULL, NULL, &k), -EINVAL);
    tb_keeper_destroy(NULL);
}
END_TEST

START_TEST(works_while_the_owner_is_away)
{
    shared_t s = {0};
    uint64_t end = tb_now_ns() + 20000 * MS;

    ck_assert_int_eq(tb_keeper_create(5 * MS, work, &s, &s.k), 0);
    while (calls_locked(&s) < 3 && tb_now_ns() < end) {
        sleep_ms(5);
    }
    tb_keeper_lock(s.k);
    ck_assert_uint_ge(s.work_calls, 3);
    ck_assert_int_eq(s.away_wrong, 0);
    /* The owner holding the lock is not the keeper. */
    ck_assert_int_eq(tb_keeper_away(s.k), 0);
    tb_keeper_unlock(s.k);
    ck_assert_uint_eq(tb_keeper_runs(s.k), calls_locked(&s));
    tb_keeper_destroy(s.k);
}
END_TEST

/* A stamp from the owner keeps the keeper out for a period from it: one
 * far ahead keeps it out for good, whatever the scheduler does. */
START_TEST(a_touch_keeps_it_out)
{
    shared_t s = {0};
    uint64_t end = tb_now_ns() + 20000 * MS;

    ck_assert_int_eq(tb_keeper_create(2 * MS, work, &s, &s.k), 0);
    tb_keeper_touch(s.k, tb_now_ns() + 3600000 * MS);
    tb_keeper_lock(s.k);
    s.counter = 0;
    s.work_calls = 0;
    tb_keeper_unlock(s.k);
    sleep_ms(200);
    ck_assert_uint_eq(calls_locked(&s), 0);
    /* The owner leaves (its last progress long ago): the keeper comes in. */
    tb_keeper_touch(s.k, tb_now_ns() - 3600000 * MS);
    while (calls_locked(&s) == 0 && tb_now_ns() < end) {
        sleep_ms(2);
    }
    ck_assert_uint_gt(calls_locked(&s), 0);
    tb_keeper_destroy(s.k);
}
END_TEST

typedef struct owner_arg {
    shared_t *s;
    unsigned iterations;
} owner_arg_t;

static void *owner_main(void *p)
{
    owner_arg_t *a = p;

    for (unsigned i = 0; i < a->iterations; i++) {
        tb_keeper_lock(a->s->k);
        if (a->s->relock) {
            tb_keeper_lock(a->s->k);
        }
        if (a->s->inside) {
            a->s->overlaps++;
        }
        a->s->inside = 1;
        if (tb_keeper_away(a->s->k)) {
            a->s->away_wrong++;
        }
        a->s->counter++;
        a->s->inside = 0;
        if (a->s->relock) {
            tb_keeper_unlock(a->s->k);
        }
        tb_keeper_unlock(a->s->k);
        if (0 == i % 64) {
            sleep_ms(1); /* away now and then: lets the keeper in */
        }
    }
    return NULL;
}

/* The owner and the keeper never run at once, with plain (not atomic)
 * shared fields; ThreadSanitizer reports any access the lock does not
 * order. */
static void run_race(int relock)
{
    shared_t s = {0};
    owner_arg_t a = {.s = &s, .iterations = 20000};
    pthread_t owners[2];

    s.relock = relock;
    ck_assert_int_eq(tb_keeper_create(MS, work, &s, &s.k), 0);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(pthread_create(&owners[i], NULL, owner_main, &a), 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(owners[i], NULL);
    }
    tb_keeper_destroy(s.k);
    ck_assert_int_eq(s.overlaps, 0);
    ck_assert_int_eq(s.away_wrong, 0);
    ck_assert_uint_eq(s.counter, 2ull * a.iterations + s.work_calls);
    ck_assert_uint_gt(s.work_calls, 0);
}

START_TEST(owner_and_keeper_exclude_each_other)
{
    run_race(0);
}
END_TEST

START_TEST(the_lock_is_recursive)
{
    run_race(1);
}
END_TEST

/* Stopping waits for a work call in progress, and none starts after. */
START_TEST(destroy_stops_the_work)
{
    shared_t s = {.work_sleep_ms = 20};
    uint64_t end = tb_now_ns() + 20000 * MS, after;

    ck_assert_int_eq(tb_keeper_create(MS, work, &s, &s.k), 0);
    while (calls_locked(&s) == 0 && tb_now_ns() < end) {
        sleep_ms(1);
    }
    tb_keeper_destroy(s.k);
    after = s.work_calls;
    ck_assert_int_eq(s.inside, 0);
    sleep_ms(50);
    ck_assert_uint_eq(s.work_calls, after);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("keeper");
    TCase *tc = tcase_create("keeper");
    SRunner *sr;
    int failed;

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, bad_arguments);
    tcase_add_test(tc, works_while_the_owner_is_away);
    tcase_add_test(tc, a_touch_keeps_it_out);
    tcase_add_test(tc, owner_and_keeper_exclude_each_other);
    tcase_add_test(tc, the_lock_is_recursive);
    tcase_add_test(tc, destroy_stops_the_work);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
