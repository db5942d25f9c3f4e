/*
 * Unit tests of the rings between a rank and its host engine
 * (engine/client/tb_shm_ring.h): order across wraps, a full ring, a
 * consumer that sleeps (no lost doorbell), a producer killed at any point
 * (no partial record is ever read), stale bytes of earlier laps (never
 * taken for a record), and a peer that breaks the rules.
 */
#include "tb_config.h"

#include <check.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tb_clock.h"
#include "tb_shm_ring.h"

#define RING (64u * 1024u)

static void *segment(void)
{
    void *seg = mmap(NULL, tb_shm_ring_segment_size(RING), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert(MAP_FAILED != seg);
    return seg;
}

static void segment_free(void *seg)
{
    munmap(seg, tb_shm_ring_segment_size(RING));
}

/* Record number seq: its length and its bytes. */
static size_t rec_len(uint32_t seq)
{
    return 4 + (seq * 7919u) % 3000u;
}

/* Writes record number seq: -1 when it does not fit, else whether the
 * commit asked for a doorbell (1) or not (0). */
static int put_seq(tb_shm_ring_t *prod, uint32_t seq)
{
    size_t len = rec_len(seq);
    tb_wire_erec_t *rec = tb_shm_ring_reserve(prod, len);

    if (NULL == rec) {
        return -1;
    }
    rec->type = TB_EREC_SEND;
    rec->vpid = tb_wire_le32(seq);
    memcpy(rec + 1, &seq, 4);
    memset((uint8_t *) (rec + 1) + 4, (int) (seq & 0xff), len - 4);
    return tb_shm_ring_commit(prod) ? 1 : 0;
}

/* The next record must be number seq, whole. */
static bool get_seq(tb_shm_ring_t *cons, uint32_t seq)
{
    tb_wire_erec_t h;
    uint64_t end;
    const uint8_t *p = tb_shm_ring_next(cons, &h, &end);
    uint32_t got;

    if (NULL == p) {
        return false;
    }
    ck_assert_int_eq(h.type, TB_EREC_SEND);
    ck_assert_uint_eq(h.vpid, seq);
    ck_assert_uint_eq(h.len, rec_len(seq));
    memcpy(&got, p, 4);
    ck_assert_uint_eq(got, seq);
    for (size_t k = 4; k < h.len; ++k) {
        if (p[k] != (seq & 0xff)) {
            ck_abort_msg("record %u: byte %zu is %u", (unsigned) seq, k, (unsigned) p[k]);
        }
    }
    tb_shm_ring_release_to(cons, end);
    return true;
}

/* Records of every size go through in order, across many wraps. */
START_TEST(ring_order_and_wrap)
{
    void *seg = segment();
    tb_shm_ring_t prod, cons;
    uint32_t sent = 0, got = 0;

    tb_shm_ring_attach(&prod, seg, RING, 0, true);
    tb_shm_ring_attach(&cons, seg, RING, 0, false);
    while (got < 5000) {
        if (sent < 5000 && put_seq(&prod, sent) >= 0) {
            sent++;
            continue;
        }
        /* Full (or done sending): consume a few. */
        for (int i = 0; i < 3 && get_seq(&cons, got); ++i) {
            got++;
        }
    }
    ck_assert(!prod.broken && !cons.broken);
    ck_assert(tb_shm_ring_drained(&prod));
    segment_free(seg);
}
END_TEST

/* A record larger than a quarter ring is refused; a full ring says so and
 * takes records again once the consumer frees room. */
START_TEST(ring_full)
{
    void *seg = segment();
    tb_shm_ring_t prod, cons;
    tb_wire_erec_t h, *rec;
    uint64_t end;
    int n = 0;

    tb_shm_ring_attach(&prod, seg, RING, 0, true);
    tb_shm_ring_attach(&cons, seg, RING, 0, false);
    ck_assert_ptr_null(tb_shm_ring_reserve(&prod, tb_shm_ring_max_record(&prod) + 1));
    while (NULL != (rec = tb_shm_ring_reserve(&prod, 1000))) {
        rec->type = TB_EREC_SEND;
        (void) tb_shm_ring_commit(&prod);
        n++;
    }
    ck_assert_int_eq(n, RING / 1024);
    ck_assert(!prod.broken);
    ck_assert_ptr_nonnull(tb_shm_ring_next(&cons, &h, &end));
    ck_assert_ptr_null(tb_shm_ring_reserve(&prod, 1000)); /* not released yet */
    tb_shm_ring_release_to(&cons, end);
    ck_assert_ptr_nonnull(rec = tb_shm_ring_reserve(&prod, 1000));
    rec->type = TB_EREC_SEND;
    (void) tb_shm_ring_commit(&prod);
    ck_assert(!prod.broken && !cons.broken);
    segment_free(seg);
}
END_TEST

/* A record read twice (rewind) is the same record. */
START_TEST(ring_rewind)
{
    void *seg = segment();
    tb_shm_ring_t prod, cons;
    tb_wire_erec_t h;
    uint64_t end;

    tb_shm_ring_attach(&prod, seg, RING, 0, true);
    tb_shm_ring_attach(&cons, seg, RING, 0, false);
    ck_assert(put_seq(&prod, 7) >= 0 && put_seq(&prod, 8) >= 0);
    ck_assert_ptr_nonnull(tb_shm_ring_next(&cons, &h, &end));
    tb_shm_ring_rewind(&cons, 0);
    ck_assert(get_seq(&cons, 7) && get_seq(&cons, 8));
    ck_assert_ptr_null(tb_shm_ring_next(&cons, &h, &end));
    segment_free(seg);
}
END_TEST

/* The one-load check of idle rings says what the full check says, at every
 * record and PAD across wraps, after a rewind, and with a stale lap behind. */
START_TEST(ring_ready)
{
    void *seg = segment();
    tb_shm_ring_t prod, cons;
    tb_wire_erec_t h;
    uint64_t end;
    uint32_t sent = 0, got = 0;

    tb_shm_ring_attach(&prod, seg, RING, 0, true);
    tb_shm_ring_attach(&cons, seg, RING, 0, false);
    ck_assert(!tb_shm_ring_ready(&cons));
    while (got < 3000) {
        if (sent < 3000 && sent - got < 4 && put_seq(&prod, sent) >= 0) {
            sent++;
            continue;
        }
        ck_assert_int_eq(tb_shm_ring_ready(&cons), tb_shm_ring_readable(&cons));
        ck_assert(tb_shm_ring_ready(&cons));
        ck_assert(get_seq(&cons, got));
        got++;
        ck_assert_int_eq(tb_shm_ring_ready(&cons), got < sent);
    }
    ck_assert(put_seq(&prod, sent) >= 0);
    ck_assert_ptr_nonnull(tb_shm_ring_next(&cons, &h, &end));
    ck_assert(!tb_shm_ring_ready(&cons));
    tb_shm_ring_rewind(&cons, end - ((sizeof(h) + h.len + TB_WIRE_EREC_ALIGN - 1)
                                     & ~(uint64_t) (TB_WIRE_EREC_ALIGN - 1)));
    ck_assert(tb_shm_ring_ready(&cons));
    ck_assert(get_seq(&cons, sent));
    ck_assert(!tb_shm_ring_ready(&cons) && !tb_shm_ring_readable(&cons));
    segment_free(seg);
}
END_TEST

/* What earlier laps left in the ring, records or payloads, is never read as
 * a new record, even payloads full of what a position-only stamp would be. */
START_TEST(ring_stale_bytes)
{
    void *seg = segment();
    tb_shm_ring_t prod, cons;
    tb_wire_erec_t h, *rec;
    uint64_t end, written = 0;

    tb_shm_ring_attach(&prod, seg, RING, 0, true);
    tb_shm_ring_attach(&cons, seg, RING, 0, false);
    for (unsigned i = 0; i < 20000; ++i) {
        /* Sizes that shift where records start from lap to lap. */
        size_t len = (i * 2654435761u) % 1500u;
        uint64_t start;
        ck_assert_ptr_null(tb_shm_ring_next(&cons, &h, &end));
        ck_assert(!tb_shm_ring_readable(&cons));
        rec = tb_shm_ring_reserve(&prod, len);
        ck_assert_ptr_nonnull(rec);
        start = prod.head;
        rec->type = TB_EREC_SEND;
        for (size_t w = 0; w + 8 <= len; w += 8) {
            /* Stream position of this word, one to four laps on, plus 1. */
            uint64_t pos = start + sizeof(*rec) + w, v = pos + (1 + i % 4) * RING + 1;
            memcpy((uint8_t *) (rec + 1) + w, &v, 8);
        }
        /* Not yet committed: nothing to read. */
        ck_assert_ptr_null(tb_shm_ring_next(&cons, &h, &end));
        (void) tb_shm_ring_commit(&prod);
        ck_assert_ptr_nonnull(tb_shm_ring_next(&cons, &h, &end));
        ck_assert_uint_eq(h.len, len);
        tb_shm_ring_release_to(&cons, end);
        written += len;
    }
    ck_assert(written > 8 * RING);
    ck_assert(!prod.broken && !cons.broken);
    segment_free(seg);
}
END_TEST

/* The waiting flag: a commit asks for a doorbell only while the consumer
 * waits, and never on a ring whose consumer spins. */
START_TEST(ring_waiting_flag)
{
    void *seg = segment();
    tb_shm_ring_t prod, cons;

    tb_shm_ring_attach(&prod, seg, RING, 0, true);
    tb_shm_ring_attach(&cons, seg, RING, 0, false);
    ck_assert_ptr_nonnull(tb_shm_ring_reserve(&prod, 8));
    ck_assert(!tb_shm_ring_commit(&prod));
    tb_shm_ring_set_waiting(&cons, true);
    ck_assert_ptr_nonnull(tb_shm_ring_reserve(&prod, 8));
    ck_assert(tb_shm_ring_commit(&prod));
    tb_shm_ring_consumer_spins(&prod);
    ck_assert_ptr_nonnull(tb_shm_ring_reserve(&prod, 8));
    ck_assert(!tb_shm_ring_commit(&prod));
    tb_shm_ring_set_waiting(&cons, false);
    segment_free(seg);
}
END_TEST

/* A consumer that sleeps when the ring is empty, woken by a doorbell the
 * producer sends when a commit says so, as the engine does: no record is
 * ever left unread while it sleeps (a lost wake-up hangs the test). */
typedef struct sleeper {
    tb_shm_ring_t prod, cons;
    int bell[2];
    uint32_t n;
    unsigned sleeps;
} sleeper_t;

static void *sleeper_consumer(void *arg)
{
    sleeper_t *s = arg;
    uint32_t got = 0;

    while (got < s->n) {
        char b[64];
        if (get_seq(&s->cons, got)) {
            got++;
            continue;
        }
        tb_shm_ring_set_waiting(&s->cons, true);
        if (!tb_shm_ring_readable(&s->cons)) {
            struct pollfd p = {.fd = s->bell[0], .events = POLLIN};
            ck_assert_msg(poll(&p, 1, 10000) == 1, "asleep 10 s with record %u unread",
                          (unsigned) got);
            (void) read(s->bell[0], b, sizeof(b));
            s->sleeps++;
        }
        tb_shm_ring_set_waiting(&s->cons, false);
    }
    return NULL;
}

START_TEST(ring_consumer_asleep)
{
    void *seg = segment();
    sleeper_t s;
    pthread_t th;

    memset(&s, 0, sizeof(s));
    s.n = 50000;
    ck_assert_int_eq(pipe(s.bell), 0);
    tb_shm_ring_attach(&s.prod, seg, RING, 0, true);
    tb_shm_ring_attach(&s.cons, seg, RING, 0, false);
    ck_assert_int_eq(pthread_create(&th, NULL, sleeper_consumer, &s), 0);
    for (uint32_t i = 0; i < s.n;) {
        int rc = put_seq(&s.prod, i);
        if (rc < 0) {
            sched_yield();
            continue;
        }
        if (rc > 0) {
            ck_assert_int_eq(write(s.bell[1], "", 1), 1);
        }
        /* Pauses now and then, so that the consumer falls asleep. */
        if (0 == ++i % 500) {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
    }
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_uint_gt(s.sleeps, 0);
    ck_assert(!s.prod.broken && !s.cons.broken);
    close(s.bell[0]);
    close(s.bell[1]);
    segment_free(seg);
}
END_TEST

/* A producer killed at any point, mid-record included (a rank that dies):
 * the consumer reads every record it committed, whole and in order, and
 * nothing of the one it was writing; the ring is not broken. */
START_TEST(ring_producer_killed)
{
    srand(12345);
    for (int round = 0; round < 20; ++round) {
        void *seg = segment();
        tb_shm_ring_t cons;
        uint32_t got = 0;
        pid_t child;
        int status;
        struct timespec ts = {0, (long) (rand() % 3000) * 1000L};

        tb_shm_ring_attach(&cons, seg, RING, 0, true);
        child = fork();
        ck_assert_int_ge(child, 0);
        if (0 == child) {
            tb_shm_ring_t prod;
            tb_shm_ring_attach(&prod, seg, RING, 0, false);
            for (uint32_t i = 0;;) {
                i += put_seq(&prod, i) >= 0 ? 1 : 0;
            }
        }
        /* Read while it writes, then kill it wherever it is. A child that
         * starts slowly (ThreadSanitizer, a busy host) is waited for until
         * its first record, so every round kills a producer at work. */
        for (uint64_t t0 = tb_now_ns(); got < 100;) {
            uint64_t spent = tb_now_ns() - t0;
            if ((got > 0 && spent > 1000000000ULL) || spent > 10000000000ULL) {
                break;
            }
            got += get_seq(&cons, got) ? 1 : 0;
        }
        nanosleep(&ts, NULL);
        kill(child, SIGKILL);
        ck_assert_int_eq(waitpid(child, &status, 0), child);
        while (get_seq(&cons, got)) {
            got++;
        }
        ck_assert(!cons.broken);
        ck_assert(!tb_shm_ring_readable(&cons));
        ck_assert_uint_gt(got, 0);
        segment_free(seg);
    }
}
END_TEST

/* A producer that lies about a record's length, or writes a PAD short of
 * the ring's end, breaks the ring for the consumer, which reads nothing
 * outside it. */
START_TEST(ring_hostile_producer)
{
    void *seg = segment();
    tb_shm_ring_t prod, cons;
    tb_wire_erec_t h, *rec;
    uint64_t end;

    tb_shm_ring_attach(&prod, seg, RING, 0, true);
    tb_shm_ring_attach(&cons, seg, RING, 0, false);
    rec = tb_shm_ring_reserve(&prod, 16);
    (void) tb_shm_ring_commit(&prod);
    rec->len = RING; /* after the commit: the consumer reads it once */
    ck_assert_ptr_null(tb_shm_ring_next(&cons, &h, &end));
    ck_assert(cons.broken);

    /* Longer than a quarter ring, though it would fit before the end. */
    tb_shm_ring_attach(&prod, seg, RING, 0, true);
    tb_shm_ring_attach(&cons, seg, RING, 0, false);
    rec = tb_shm_ring_reserve(&prod, 16);
    (void) tb_shm_ring_commit(&prod);
    rec->len = tb_wire_le32((uint32_t) tb_shm_ring_max_record(&prod) + 1);
    ck_assert_ptr_null(tb_shm_ring_next(&cons, &h, &end));
    ck_assert(cons.broken);

    /* A PAD that does not reach the ring's end. */
    tb_shm_ring_attach(&prod, seg, RING, 0, true);
    tb_shm_ring_attach(&cons, seg, RING, 0, false);
    rec = tb_shm_ring_reserve(&prod, 16);
    rec->type = TB_EREC_PAD;
    (void) tb_shm_ring_commit(&prod);
    ck_assert_ptr_null(tb_shm_ring_next(&cons, &h, &end));
    ck_assert(cons.broken);
    segment_free(seg);
}
END_TEST

/* A consumer that moves its tail past the head breaks the ring for the
 * producer, which then writes nothing. */
START_TEST(ring_hostile_consumer)
{
    void *seg = segment();
    tb_shm_ring_t prod;

    tb_shm_ring_attach(&prod, seg, RING, 0, true);
    while (tb_shm_ring_reserve(&prod, 0)) {
        (void) tb_shm_ring_commit(&prod);
    }
    atomic_store(&prod.ctrl->tail, prod.head + 4096);
    ck_assert_ptr_null(tb_shm_ring_reserve(&prod, 16));
    ck_assert(prod.broken);
    segment_free(seg);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("shm_ring");
    TCase *tc = tcase_create("shm_ring");
    SRunner *sr;
    int failed;

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, ring_order_and_wrap);
    tcase_add_test(tc, ring_full);
    tcase_add_test(tc, ring_rewind);
    tcase_add_test(tc, ring_ready);
    tcase_add_test(tc, ring_stale_bytes);
    tcase_add_test(tc, ring_waiting_flag);
    tcase_add_test(tc, ring_consumer_asleep);
    tcase_add_test(tc, ring_producer_killed);
    tcase_add_test(tc, ring_hostile_producer);
    tcase_add_test(tc, ring_hostile_consumer);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
