/*
 * Unit tests of the keeper (tb_keeper.h): it works only while the owner is
 * away and outside, never at once with it, and stops when told; in both
 * gate modes (membarrier, and fenced entries).  The test command also runs
 * them under ThreadSanitizer, which checks that every access the keeper and
 * the owner share is ordered by the gate.
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
 * keeper's gate only (the owner threads serialise among themselves with
 * their own mutex, as the BTL does with Open MPI's). */
typedef struct shared {
    tb_keeper_t *k;
    uint64_t counter;
    uint64_t work_calls;
    int inside;        /* a work call or an owner section is running */
    int overlaps;      /* times one found the other inside */
    int away_wrong;    /* tb_keeper_away said the wrong thing */
    uint64_t last_now; /* the work's clock never runs backwards */
    int relock;        /* the work and the owner enter again (nested) */
    unsigned work_sleep_ms;
    unsigned flags;    /* tb_keeper_create's */
    pthread_mutex_t owners;
} shared_t;

static unsigned gate_flags;

static void work(void *ctx, uint64_t now)
{
    shared_t *s = ctx;

    if (s->relock) {
        /* The keeper calling back into owner code that enters. */
        tb_keeper_enter(s->k);
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
        tb_keeper_leave(s->k);
    }
}

static void owner_in(shared_t *s)
{
    pthread_mutex_lock(&s->owners);
    tb_keeper_enter(s->k);
}

static void owner_out(shared_t *s)
{
    tb_keeper_leave(s->k);
    pthread_mutex_unlock(&s->owners);
}

static uint64_t calls_locked(shared_t *s)
{
    uint64_t n;

    owner_in(s);
    n = s->work_calls;
    owner_out(s);
    return n;
}

static void start(shared_t *s, uint64_t period_ns)
{
    pthread_mutex_init(&s->owners, NULL);
    ck_assert_int_eq(tb_keeper_create(period_ns, work, s, gate_flags, &s->k), 0);
    if (gate_flags & TB_KEEPER_FENCED) {
        ck_assert_int_eq(tb_keeper_fenced(s->k), 1);
    }
}

static void stop(shared_t *s)
{
    tb_keeper_destroy(s->k);
    pthread_mutex_destroy(&s->owners);
}

START_TEST(bad_arguments)
{
    tb_keeper_t *k = (tb_keeper_t *) 1;

    ck_assert_int_eq(tb_keeper_create(MS - 1, work, NULL, 0, &k), -EINVAL);
    ck_assert_ptr_null(k);
    ck_assert_int_eq(tb_keeper_create(MS, NULL, NULL, 0, &k), -EINVAL);
    tb_keeper_destroy(NULL);
}
END_TEST

START_TEST(works_while_the_owner_is_away)
{
    shared_t s = {0};
    uint64_t end = tb_now_ns() + 20000 * MS;

    start(&s, 5 * MS);
    while (calls_locked(&s) < 3 && tb_now_ns() < end) {
        sleep_ms(5);
    }
    owner_in(&s);
    ck_assert_uint_ge(s.work_calls, 3);
    ck_assert_int_eq(s.away_wrong, 0);
    /* The owner inside is not the keeper. */
    ck_assert_int_eq(tb_keeper_away(s.k), 0);
    /* Both counts read inside: outside, a run may come between the reads. */
    ck_assert_uint_eq(tb_keeper_runs(s.k), s.work_calls);
    owner_out(&s);
    stop(&s);
}
END_TEST

/* A stamp from the owner keeps the keeper out for a period from it: one
 * far ahead keeps it out for good, whatever the scheduler does. */
START_TEST(a_touch_keeps_it_out)
{
    shared_t s = {0};
    uint64_t end = tb_now_ns() + 20000 * MS;

    start(&s, 2 * MS);
    tb_keeper_touch(s.k, tb_now_ns() + 3600000 * MS);
    owner_in(&s);
    s.counter = 0;
    s.work_calls = 0;
    owner_out(&s);
    sleep_ms(200);
    ck_assert_uint_eq(calls_locked(&s), 0);
    /* The owner leaves (its last progress long ago): the keeper comes in. */
    tb_keeper_touch(s.k, tb_now_ns() - 3600000 * MS);
    while (calls_locked(&s) == 0 && tb_now_ns() < end) {
        sleep_ms(2);
    }
    ck_assert_uint_gt(calls_locked(&s), 0);
    stop(&s);
}
END_TEST

/* An owner that stays inside keeps the keeper out, however long ago it
 * last progressed. */
START_TEST(an_owner_inside_keeps_it_out)
{
    shared_t s = {0};

    start(&s, MS);
    owner_in(&s);
    tb_keeper_touch(s.k, tb_now_ns() - 3600000 * MS);
    s.work_calls = 0;
    sleep_ms(100);
    ck_assert_uint_eq(s.work_calls, 0);
    owner_out(&s);
    stop(&s);
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
        owner_in(a->s);
        if (a->s->relock) {
            tb_keeper_enter(a->s->k);
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
            tb_keeper_leave(a->s->k);
        }
        owner_out(a->s);
        if (0 == i % 64) {
            sleep_ms(1); /* away now and then: lets the keeper in */
        }
    }
    return NULL;
}

/* The owners and the keeper never run at once, with plain (not atomic)
 * shared fields; ThreadSanitizer reports any access the gate does not
 * order. */
static void run_race(int relock)
{
    shared_t s = {0};
    owner_arg_t a = {.s = &s, .iterations = 20000};
    pthread_t owners[2];

    s.relock = relock;
    start(&s, MS);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(pthread_create(&owners[i], NULL, owner_main, &a), 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(owners[i], NULL);
    }
    stop(&s);
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

START_TEST(entries_nest)
{
    run_race(1);
}
END_TEST

/* Stopping waits for a work call in progress, and none starts after. */
START_TEST(destroy_stops_the_work)
{
    shared_t s = {.work_sleep_ms = 20};
    uint64_t end = tb_now_ns() + 20000 * MS, after;

    start(&s, MS);
    while (calls_locked(&s) == 0 && tb_now_ns() < end) {
        sleep_ms(1);
    }
    tb_keeper_destroy(s.k);
    pthread_mutex_destroy(&s.owners);
    after = s.work_calls;
    ck_assert_int_eq(s.inside, 0);
    sleep_ms(50);
    ck_assert_uint_eq(s.work_calls, after);
}
END_TEST

static void add_tests(TCase *tc)
{
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, bad_arguments);
    tcase_add_test(tc, works_while_the_owner_is_away);
    tcase_add_test(tc, a_touch_keeps_it_out);
    tcase_add_test(tc, an_owner_inside_keeps_it_out);
    tcase_add_test(tc, owner_and_keeper_exclude_each_other);
    tcase_add_test(tc, entries_nest);
    tcase_add_test(tc, destroy_stops_the_work);
}

int main(void)
{
    int failed = 0;

    /* The gate as the system gives it (membarrier on Linux where allowed),
     * then with fenced entries, as on macOS. */
    for (int fenced = 0; fenced < 2; fenced++) {
        Suite *s = suite_create(fenced ? "keeper, fenced entries" : "keeper");
        TCase *tc = tcase_create("keeper");
        SRunner *sr;

        gate_flags = fenced ? TB_KEEPER_FENCED : 0;
        add_tests(tc);
        suite_add_tcase(s, tc);
        sr = srunner_create(s);
        srunner_run_all(sr, CK_NORMAL);
        failed += srunner_ntests_failed(sr);
        srunner_free(sr);
    }
    return failed ? 1 : 0;
}
