/*
 * Unit tests of the host engine's handling of what peer engines send, on an
 * engine assembled in memory (tests/fuzz/engine_harness.h): every byte from
 * a cable is untrusted, and what a peer can make the engine hold is bounded.
 */
#include "tb_config.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "engine_harness.h"
#include "tb_log.h"

static void log_quiet(tb_log_level_t level, const char *msg, void *ctx)
{
    (void) level;
    (void) msg;
    (void) ctx;
}

/* An engine in memory, quiet, and one peer engine connected to it. */
static eng_peer_t *setup(eng_harness_t *h)
{
    tb_log_set_sink(log_quiet, NULL, TB_LOG_ERROR);
    ck_assert_int_eq(eh_init(h), 0);
    return eh_peer(h, 1);
}

static void peer_send(eng_peer_t *p, uint8_t tag, uint32_t src, uint32_t dst, uint32_t credit,
                      const void *payload, size_t len)
{
    uint8_t buf[sizeof(tb_wire_emsg_t) + 256];
    tb_wire_emsg_t h;

    ck_assert_uint_le(len, 256);
    memset(&h, 0, sizeof(h));
    h.src = tb_wire_le32(src);
    h.dst = tb_wire_le32(dst);
    h.credit = tb_wire_le32(credit);
    h.src_pid = TB_ETAG_CREDIT == tag ? 0 : tb_wire_le32(EH_PID(src));
    h.dst_pid = TB_ETAG_DATA == tag ? tb_wire_le32(EH_PID(dst)) : 0;
    memcpy(buf, &h, sizeof(h));
    if (len) {
        memcpy(buf + sizeof(h), payload, len);
    }
    tb_eng_peer_recv(p, tag, buf, sizeof(h) + len);
}

/* A rank's death said again and again reaches the host's ranks once; a peer
 * that says more ranks died than one engine serves is cut off (every GONE
 * was copied to every rank: 2M of them made a 484 MiB heap). */
START_TEST(peer_gone_once)
{
    eng_harness_t h;
    eng_peer_t *p;
    unsigned gone = 0;

    p = setup(&h);
    for (int i = 0; i < 100000; ++i) {
        peer_send(p, TB_ETAG_GONE, 7000, 0, 0, "killed", 6);
        ck_assert_ptr_null(eh_check(&h));
    }
    eh_progress(&h);
    (void) eh_rank_read(&h, 0, 1000000, TB_EREC_GONE, &gone);
    ck_assert_uint_eq(gone, 1);
    for (uint32_t v = 1; v < ENG_MAX_RANKS; ++v) {
        peer_send(p, TB_ETAG_GONE, 7000 + v, 0, 0, "killed", 6);
    }
    ck_assert_int_eq(p->state, ENG_PEER_CONNECTED);
    peer_send(p, TB_ETAG_GONE, 9999, 0, 0, "killed", 6);
    ck_assert_int_eq(p->state, ENG_PEER_FAILED);
    ck_assert_ptr_null(eh_check(&h));
    eh_fini(&h);
}
END_TEST

/* A peer that sends a rank that does not read empty messages: credit counts
 * what each costs, so the peer is cut off once past the window (it counted
 * payload bytes, and empty messages passed for ever). */
START_TEST(peer_empty_data_bounded)
{
    eng_harness_t h;
    eng_peer_t *p;
    uint64_t n = 0;

    p = setup(&h);
    while (ENG_PEER_CONNECTED == p->state && n < 10000000) {
        peer_send(p, TB_ETAG_DATA, 7000, 0, 0, NULL, 0);
        n++;
        if (0 == n % 1024) {
            eh_progress(&h);
            ck_assert_ptr_null(eh_check(&h));
        }
    }
    ck_assert_int_eq(p->state, ENG_PEER_FAILED);
    ck_assert_uint_le(n, h.e->p.credit_window / TB_WIRE_ECREDIT_OVERHEAD + 1);
    ck_assert_ptr_null(eh_check(&h));
    eh_fini(&h);
}
END_TEST

/* Credit the rank returns by reading lets a correct peer go on for ever. */
START_TEST(peer_data_with_reader)
{
    eng_harness_t h;
    eng_peer_t *p;
    unsigned got = 0, total = 0;
    uint32_t credit = 0;

    p = setup(&h);
    for (int i = 0; i < 200000; ++i) {
        peer_send(p, TB_ETAG_DATA, 7000, 1, 0, "data", 4);
        credit += (uint32_t) tb_ecredit_cost(4);
        if (0 == i % 256) {
            eh_progress(&h);
            (void) eh_rank_read(&h, 1, 100000, TB_EREC_RECV, &got);
            total += got;
            /* What the sender learns from CREDIT: as consumed. */
            eh_progress(&h);
            p->delivered[1] -= p->ret[1] < p->delivered[1] ? p->ret[1] : p->delivered[1];
            p->ret[1] = 0;
        }
        ck_assert_int_eq(p->state, ENG_PEER_CONNECTED);
    }
    ck_assert_uint_gt(total, 190000);
    ck_assert_ptr_null(eh_check(&h));
    eh_fini(&h);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("engine_peer");
    TCase *tc = tcase_create("engine_peer");
    SRunner *sr;
    int failed;

    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, peer_gone_once);
    tcase_add_test(tc, peer_empty_data_bounded);
    tcase_add_test(tc, peer_data_with_reader);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
