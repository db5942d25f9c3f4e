/*
 * Unit tests of the host engine's handling of what peer engines send, on an
 * engine assembled in memory (tests/fuzz/engine_harness.h): every byte from
 * a cable is untrusted, and what a peer can make the engine hold is bounded.
 */
#include "tb_config.h"

#include <arpa/inet.h>
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "engine_harness.h"
#include "tb_cm.h"
#include "tb_ehosts.h"
#include "tb_log.h"
#include "tb_sha256.h"
#include "tb_x25519.h"

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

static void peer_send_pids(eng_peer_t *p, uint8_t tag, uint32_t src, uint32_t src_pid,
                           uint32_t dst, uint32_t dst_pid, uint32_t credit, const void *payload,
                           size_t len)
{
    uint8_t buf[sizeof(tb_wire_emsg_t) + 256];
    tb_wire_emsg_t h;

    ck_assert_uint_le(len, 256);
    memset(&h, 0, sizeof(h));
    h.src = tb_wire_le32(src);
    h.dst = tb_wire_le32(dst);
    h.credit = tb_wire_le32(credit);
    h.src_pid = tb_wire_le32(src_pid);
    h.dst_pid = tb_wire_le32(dst_pid);
    h.seq = tb_wire_le32(p->rx_seq); /* its flow's next */
    memcpy(buf, &h, sizeof(h));
    if (len) {
        memcpy(buf + sizeof(h), payload, len);
    }
    tb_eng_peer_recv(p, tag, buf, sizeof(h) + len);
}

/* As the harness's ranks and a correct peer name them. */
static void peer_send(eng_peer_t *p, uint8_t tag, uint32_t src, uint32_t dst, uint32_t credit,
                      const void *payload, size_t len)
{
    peer_send_pids(p, tag, src, TB_ETAG_CREDIT == tag ? 0 : EH_PID(src), dst,
                   TB_ETAG_DATA == tag ? EH_PID(dst) : 0, credit, payload, len);
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

/* A peer streams 200000 small messages to rank 1 naming dst_pid; every
 * 256 the rank reads, all the engine took is owed back to the peer, and the
 * peer learns it (as CREDIT would say).  The peer stays connected; the
 * messages rank 1 received. */
static unsigned stream_to_rank1(eng_harness_t *h, eng_peer_t *p, uint32_t dst_pid)
{
    unsigned got = 0, total = 0;

    for (int i = 0; i < 200000; ++i) {
        peer_send_pids(p, TB_ETAG_DATA, 7000, EH_PID(7000), 1, dst_pid, 0, "data", 4);
        if (0 == i % 256) {
            eh_progress(h);
            (void) eh_rank_read(h, 1, 100000, TB_EREC_RECV, &got);
            total += got;
            eh_progress(h);
            ck_assert_uint_gt(p->ret[1], 0);
            ck_assert_uint_eq(p->ret[1], p->delivered[1]);
            p->delivered[1] = 0;
            p->ret[1] = 0;
        }
        ck_assert_int_eq(p->state, ENG_PEER_CONNECTED);
    }
    ck_assert_ptr_null(eh_check(h));
    return total;
}

/* Credit the rank returns by reading lets a correct peer go on for ever. */
START_TEST(peer_data_with_reader)
{
    eng_harness_t h;
    eng_peer_t *p = setup(&h);

    ck_assert_uint_gt(stream_to_rank1(&h, p, EH_PID(1)), 190000);
    eh_fini(&h);
}
END_TEST

/* Messages for rank 1 naming a pid that is not rank 1's (a process the
 * sender's job did not publish for it) are never delivered, and their
 * credit comes back as if read: one sender naming a wrong pid cannot use up
 * the window every sender to that rank shares (it once could: its credit
 * never came back). */
START_TEST(peer_data_wrong_pid)
{
    eng_harness_t h;
    eng_peer_t *p = setup(&h);

    ck_assert_uint_eq(stream_to_rank1(&h, p, EH_PID(1) + 5), 0);
    eh_fini(&h);
}
END_TEST

/* A death is a process's: rank 7000's, and then another process's that had
 * attached as rank 7000, both reach the host's ranks with their pids (the
 * first once hid the second, and its held messages went with it). */
START_TEST(peer_gone_per_process)
{
    eng_harness_t h;
    eng_peer_t *p;
    unsigned gone = 0;

    p = setup(&h);
    peer_send_pids(p, TB_ETAG_GONE, 7000, 4242, 0, 0, 0, "impostor died", 13);
    peer_send_pids(p, TB_ETAG_GONE, 7000, 4242, 0, 0, 0, "impostor died", 13);
    eh_progress(&h);
    (void) eh_rank_read(&h, 0, 1000, TB_EREC_GONE, &gone);
    ck_assert_uint_eq(gone, 1);
    ck_assert_uint_eq(h.last_pid, 4242);
    peer_send(p, TB_ETAG_GONE, 7000, 0, 0, "killed", 6);
    eh_progress(&h);
    (void) eh_rank_read(&h, 0, 1000, TB_EREC_GONE, &gone);
    ck_assert_uint_eq(gone, 1);
    ck_assert_uint_eq(h.last_pid, EH_PID(7000));
    ck_assert_ptr_null(eh_check(&h));
    eh_fini(&h);
}
END_TEST

/* Callers with identities no rank named cost the engine a Diffie-Hellman
 * each before they prove anything: a burst of ENG_DH_BURST, then one every
 * ENG_DH_EVERY_NS, whatever they send. */
START_TEST(dh_budget)
{
    eng_harness_t h;
    uint64_t now = tb_now_ns();
    unsigned n = 0;

    (void) setup(&h);
    h.e->dh_tokens = ENG_DH_BURST;
    h.e->dh_refill_ns = now;
    while (n < 10 * ENG_DH_BURST && tb_eng_dh_allowed(h.e, now)) {
        n++;
    }
    ck_assert_uint_eq(n, ENG_DH_BURST);
    ck_assert(!tb_eng_dh_allowed(h.e, now + ENG_DH_EVERY_NS - 1));
    ck_assert(tb_eng_dh_allowed(h.e, now + ENG_DH_EVERY_NS));
    ck_assert(!tb_eng_dh_allowed(h.e, now + ENG_DH_EVERY_NS));
    n = 0;
    while (n < 10 * ENG_DH_BURST && tb_eng_dh_allowed(h.e, now + 1000 * ENG_DH_EVERY_NS)) {
        n++;
    }
    ck_assert_uint_eq(n, ENG_DH_BURST);
    /* What is earned between two asks stays earned: refilled at 1.5
     * intervals, the next is due at 2 (it once slid to 2.5). */
    now += 2000 * ENG_DH_EVERY_NS;
    while (tb_eng_dh_allowed(h.e, now)) {
    }
    ck_assert(tb_eng_dh_allowed(h.e, now + ENG_DH_EVERY_NS * 3 / 2));
    ck_assert(!tb_eng_dh_allowed(h.e, now + ENG_DH_EVERY_NS * 3 / 2));
    ck_assert(tb_eng_dh_allowed(h.e, now + ENG_DH_EVERY_NS * 11 / 5));
    ck_assert(!tb_eng_dh_allowed(h.e, now + ENG_DH_EVERY_NS * 23 / 10));
    eh_fini(&h);
}
END_TEST

/* The pair secret is the two engines': one named by a rank over any cable
 * costs no Diffie-Hellman from the budget on another cable (the cache was
 * per cable, so a known engine calling on its second cable was refused
 * while the budget was spent), and both ends compute the same.  Callers
 * nobody named are refused as busy, not as strangers, when it is spent. */
START_TEST(pair_secret_any_cable)
{
    static const char label[] = "tbrdma engine pair key";
    uint8_t b_pub[TB_X25519_SIZE], b_priv[TB_X25519_SIZE], c_pub[TB_X25519_SIZE];
    uint8_t c_priv[TB_X25519_SIZE], z[TB_X25519_SIZE], want[TB_WIRE_SECRET_SIZE];
    uint8_t got[TB_WIRE_SECRET_SIZE];
    eng_harness_t h;
    tb_hmac_t mac;
    tb_engine_t *e;

    (void) setup(&h);
    e = h.e;
    ck_assert_int_eq(tb_x25519_keypair(e->id, e->id_priv), 0);
    ck_assert_int_eq(tb_x25519_keypair(b_pub, b_priv), 0);
    ck_assert_int_eq(tb_x25519_keypair(c_pub, c_priv), 0);
    memset(e->job_key, 0x5a, sizeof(e->job_key));
    e->have_key = true;
    e->devs[1] = e->devs[0];
    e->devs[1].idx = 1;
    e->ndev = 2;
    e->dh_tokens = 0;
    e->dh_refill_ns = tb_now_ns() + 3600ull * 1000000000ull;
    ck_assert_int_eq(tb_eng_cm_peer_secret(&e->devs[1], b_pub, sizeof(b_pub), got),
                     TB_CM_SECRET_BUSY);
    ck_assert_ptr_nonnull(tb_eng_peer_for(e, 0, b_pub, true));
    ck_assert_int_eq(tb_eng_cm_peer_secret(&e->devs[1], b_pub, sizeof(b_pub), got), 0);
    ck_assert_int_eq(tb_x25519_shared(z, b_priv, e->id), 0);
    tb_hmac_init(&mac, e->job_key, sizeof(e->job_key));
    tb_hmac_update(&mac, label, sizeof(label));
    tb_hmac_update(&mac, z, sizeof(z));
    tb_hmac_final(&mac, want);
    ck_assert_mem_eq(got, want, sizeof(want));
    memset(got, 0, sizeof(got));
    ck_assert_int_eq(tb_eng_cm_peer_secret(&e->devs[0], b_pub, sizeof(b_pub), got), 0);
    ck_assert_mem_eq(got, want, sizeof(want));
    ck_assert_uint_eq(e->dh_tokens, 0);
    ck_assert_int_eq(tb_eng_cm_peer_secret(&e->devs[0], c_pub, sizeof(c_pub), got),
                     TB_CM_SECRET_BUSY);
    eh_fini(&h);
}
END_TEST

/* A rank that names the wrong pid for a rank of its own host hears why,
 * even while it holds more than held_max unread: its send waits until it
 * reads (the refusal was dropped, and that rank could wait for ever). */
START_TEST(local_refusal_kept)
{
    static char buf[1024];
    eng_harness_t h;
    unsigned gone = 0, total = 0, n = 0;
    tb_engine_t *e;

    (void) setup(&h);
    e = h.e;
    e->p.held_max = 16384;
    e->ranks[0].routes[0] = ENG_ROUTE_LOCAL(0);
    e->ranks[1].routes[0] = ENG_ROUTE_LOCAL(0);
    while (e->ranks[0].ovf_bytes <= e->p.held_max && n++ < 10000) {
        ck_assert_int_eq(eh_rank_write(&h, 1, TB_EREC_SEND, 0, 0, 0, true, buf, sizeof(buf)), 0);
        eh_progress(&h);
    }
    ck_assert_uint_gt(e->ranks[0].ovf_bytes, e->p.held_max);
    ck_assert_int_eq(eh_rank_write(&h, 0, TB_EREC_SEND, 0, 0, 1, false, "x", 1), 0);
    for (int i = 0; i < 1000; ++i) {
        eh_progress(&h);
        if (i > 10) {
            (void) eh_rank_read(&h, 0, 1000000, TB_EREC_GONE, &gone);
            total += gone;
        }
        ck_assert_ptr_null(eh_check(&h));
    }
    ck_assert_uint_eq(total, e->ndev);
    ck_assert_uint_eq(h.last_pid, EH_PID(1) + 77);
    eh_fini(&h);
}
END_TEST

/* ---- messages placed straight into a rank's ring ---------------------------- */

#define PLACED_LEN 10000u

/* The header of a DATA message from rank src to rank 1, as a correct peer
 * names them. */
static tb_wire_emsg_t data_hdr(uint32_t src, uint32_t dst_pid)
{
    tb_wire_emsg_t m;

    memset(&m, 0, sizeof(m));
    m.src = tb_wire_le32(src);
    m.dst = tb_wire_le32(1);
    m.tag = 9;
    m.src_pid = tb_wire_le32(EH_PID(src));
    m.dst_pid = tb_wire_le32(dst_pid);
    return m;
}

/* Begin placing a message of PLACED_LEN payload bytes from src to rank 1:
 * where the channel would write them (NULL: the ordinary path). */
static uint8_t *place_begin(eng_peer_t *p, uint32_t src, uint32_t dst_pid)
{
    tb_wire_emsg_t m = data_hdr(src, dst_pid);
    uint8_t head[64] = {0};
    size_t skip = 0;
    uint8_t *at;

    m.seq = tb_wire_le32(p->rx_seq);
    memcpy(head, &m, sizeof(m));
    at = tb_eng_peer_recv_place(p, TB_ETAG_DATA, sizeof(m) + PLACED_LEN, head, sizeof(head),
                                &skip);
    if (at) {
        ck_assert_uint_eq(skip, sizeof(m));
    }
    return at;
}

static void place_end(eng_peer_t *p, uint32_t src)
{
    tb_wire_emsg_t m = data_hdr(src, EH_PID(1));

    m.seq = tb_wire_le32(p->rx_seq);
    tb_eng_peer_recv_placed(p, TB_ETAG_DATA, &m, sizeof(m), sizeof(m) + PLACED_LEN);
}

/* Rank 1's next RECV record (other records skipped): its source and length,
 * its payload in out (up to cap bytes); false when there is none. */
static bool next_recv(eng_harness_t *h, uint32_t *src, size_t *len, uint8_t *out, size_t cap)
{
    tb_wire_erec_t hdr;
    uint64_t end;
    const void *payload;

    while (NULL != (payload = tb_shm_ring_next(&h->from_engine[1], &hdr, &end))) {
        tb_shm_ring_release_to(&h->from_engine[1], end);
        if (TB_EREC_RECV == hdr.type) {
            *src = tb_wire_le32(hdr.vpid);
            *len = tb_wire_le32(hdr.len);
            memcpy(out, payload, *len < cap ? *len : cap);
            return true;
        }
    }
    return false;
}

/* A message of several frames goes into its record where the channel writes
 * it (one copy), published once whole; what arrives for the rank meanwhile
 * waits behind it, in order, and credit is counted as for a message handed
 * over whole. */
START_TEST(placed_in_ring)
{
    eng_harness_t h;
    eng_peer_t *p = setup(&h), *q = eh_peer(&h, 2);
    static uint8_t got[PLACED_LEN];
    uint8_t *at, small[5] = {1, 2, 3, 4, 5};
    uint32_t src;
    size_t len;

    at = place_begin(p, 7, EH_PID(1));
    ck_assert_ptr_nonnull(at);
    for (unsigned i = 0; i < PLACED_LEN; ++i) {
        at[i] = (uint8_t) (i * 7 + 3);
    }
    /* Another engine's message for rank 1 arrives meanwhile. */
    peer_send(q, TB_ETAG_DATA, 8, 1, 0, small, sizeof(small));
    eh_progress(&h);
    ck_assert(!next_recv(&h, &src, &len, got, sizeof(got)));
    place_end(p, 7);
    ck_assert_ptr_null(h.e->ranks[1].placing);
    eh_progress(&h);
    ck_assert(next_recv(&h, &src, &len, got, sizeof(got)));
    ck_assert_uint_eq(src, 7);
    ck_assert_uint_eq(len, PLACED_LEN);
    for (unsigned i = 0; i < PLACED_LEN; ++i) {
        ck_assert_uint_eq(got[i], (uint8_t) (i * 7 + 3));
    }
    ck_assert(next_recv(&h, &src, &len, got, sizeof(got)));
    ck_assert_uint_eq(src, 8);
    ck_assert_uint_eq(len, sizeof(small));
    ck_assert_uint_eq(p->delivered[1], tb_ecredit_cost(PLACED_LEN));
    /* The engine copied only the small one, twice (into the overflow, then
     * the ring); the placed one's copy is its channel's. */
    ck_assert_uint_eq(h.e->rx_bytes, PLACED_LEN + sizeof(small));
    ck_assert_uint_eq(h.e->rx_copied, 2 * sizeof(small));
    ck_assert_ptr_null(eh_check(&h));
    eh_fini(&h);
}
END_TEST

/* Only what would be delivered as it is is placed: no second placement into
 * one ring, no process other than the one the sender named, no rank that is
 * not here, nothing beyond the credit window, no other kind of message. */
START_TEST(place_refused)
{
    eng_harness_t h;
    eng_peer_t *p = setup(&h), *q = eh_peer(&h, 2);
    tb_wire_emsg_t m = data_hdr(7, EH_PID(1));
    uint8_t head[64] = {0};
    size_t skip = 0;

    ck_assert_ptr_null(place_begin(p, 7, EH_PID(1) + 5));
    m.dst = tb_wire_le32(9999);
    memcpy(head, &m, sizeof(m));
    ck_assert_ptr_null(tb_eng_peer_recv_place(p, TB_ETAG_DATA, sizeof(m) + PLACED_LEN, head,
                                              sizeof(head), &skip));
    m = data_hdr(7, EH_PID(1));
    memcpy(head, &m, sizeof(m));
    ck_assert_ptr_null(tb_eng_peer_recv_place(p, TB_ETAG_GONE, sizeof(m) + PLACED_LEN, head,
                                              sizeof(head), &skip));
    ck_assert_ptr_null(tb_eng_peer_recv_place(p, TB_ETAG_DATA, sizeof(m) + PLACED_LEN, head,
                                              sizeof(m) - 1, &skip));
    p->delivered[1] = h.e->p.credit_window;
    ck_assert_ptr_null(place_begin(p, 7, EH_PID(1)));
    p->delivered[1] = 0;
    ck_assert_ptr_nonnull(place_begin(p, 7, EH_PID(1)));
    ck_assert_ptr_null(place_begin(q, 8, EH_PID(1)));
    place_end(p, 7);
    ck_assert_ptr_nonnull(place_begin(q, 8, EH_PID(1)));
    place_end(q, 8);
    ck_assert_ptr_null(eh_check(&h));
    eh_fini(&h);
}
END_TEST

/* A peer's channel that goes mid-message leaves nothing of it in the ring,
 * which then takes what waited and what comes; a rank gone mid-message gets
 * nothing of it either. */
START_TEST(placed_released)
{
    eng_harness_t h;
    eng_peer_t *p = setup(&h), *q = eh_peer(&h, 2);
    static uint8_t got[PLACED_LEN];
    uint8_t small[3] = {9, 9, 9};
    uint32_t src;
    size_t len;

    ck_assert_ptr_nonnull(place_begin(p, 7, EH_PID(1)));
    peer_send(q, TB_ETAG_DATA, 8, 1, 0, small, sizeof(small));
    tb_eng_place_release(p);
    ck_assert_ptr_null(h.e->ranks[1].placing);
    place_end(p, 7); /* a late completion finds no placement */
    eh_progress(&h);
    ck_assert(next_recv(&h, &src, &len, got, sizeof(got)));
    ck_assert_uint_eq(src, 8);
    ck_assert(!next_recv(&h, &src, &len, got, sizeof(got)));
    peer_send(p, TB_ETAG_DATA, 7, 1, 0, small, sizeof(small));
    eh_progress(&h);
    ck_assert(next_recv(&h, &src, &len, got, sizeof(got)));
    ck_assert_uint_eq(src, 7);

    ck_assert_ptr_nonnull(place_begin(p, 7, EH_PID(1)));
    h.e->ranks[1].state = ENG_RANK_DEAD;
    place_end(p, 7);
    ck_assert_ptr_null(h.e->ranks[1].placing);
    ck_assert_uint_eq(h.e->ranks[1].rx.pending, 0);
    h.e->ranks[1].state = ENG_RANK_ATTACHED;
    ck_assert(!next_recv(&h, &src, &len, got, sizeof(got)));
    eh_fini(&h);
}
END_TEST

/* ---- messages waiting for credit ------------------------------------------ */

/* Rank 0 routes link 0 to peer p (a peer without a channel: whatever it is
 * sent waits, as for credit). */
static void route_to(eng_harness_t *h, eng_peer_t *p)
{
    tb_wire_eroute_t rt;

    memset(&rt, 0, sizeof(rt));
    rt.ipv4 = 0x0100007f;
    rt.cm_port = tb_wire_le16(9);
    memcpy(rt.engine_id, p->id, sizeof(rt.engine_id));
    ck_assert_int_eq(eh_rank_write(h, 0, TB_EREC_ROUTE, 0, 0, 0, true, &rt, sizeof(rt)), 0);
    eh_progress(h);
}

/* The payloads of what waits for p, concatenated into out; their number. */
static unsigned waiting_payloads(eng_peer_t *p, uint8_t *out, size_t cap)
{
    unsigned n = 0;
    size_t at = 0;

    for (eng_msg_t *m = p->wait_head; m; m = m->next, ++n) {
        size_t len = m->len - sizeof(tb_wire_emsg_t);
        const uint8_t *src = m->ref ? m->payload : m->data + sizeof(tb_wire_emsg_t);
        ck_assert_uint_le(at + len, cap);
        memcpy(out + at, src, len);
        at += len;
    }
    return n;
}

/* A message that waits for credit stays in its rank's ring, not copied, while
 * the rank pins less than its share or its destination's credit moves (in a
 * stream, copying what waits would copy most bytes twice); beyond its share,
 * what waits for a starved destination is copied out, intact, and the ring
 * moves on; so is everything when the rank is gone. */
START_TEST(held_in_ring)
{
    eng_harness_t h;
    eng_peer_t *p = setup(&h);
    eng_rank_t *r = &h.e->ranks[0];
    static uint8_t msg[4000], got[64 * 4000];
    unsigned sent = 0, n;

    route_to(&h, p);
    memset(msg, 1, sizeof(msg));
    ck_assert_int_eq(eh_rank_write(&h, 0, TB_EREC_SEND, 3, 0, 2, true, msg, sizeof(msg)), 0);
    eh_progress(&h);
    ck_assert_ptr_nonnull(p->wait_head);
    ck_assert_ptr_nonnull(p->wait_head->ref);
    ck_assert_uint_eq(h.e->tx_copied, 0);
    ck_assert_uint_eq(r->npinned, 1);
    ck_assert_uint_eq(r->txq_len, 1);
    /* More than half the ring pinned, for a destination whose credit has not
     * been stuck for long: still in the ring. */
    for (sent = 1; sent < 12; ++sent) {
        memset(msg, (int) (sent + 1), sizeof(msg));
        ck_assert_int_eq(eh_rank_write(&h, 0, TB_EREC_SEND, 3, 0, 2, true, msg, sizeof(msg)), 0);
        eh_progress(&h);
        ck_assert_ptr_null(eh_check(&h));
    }
    ck_assert_uint_eq(h.e->tx_copied, 0);
    ck_assert_uint_eq(r->npinned, sent);
    ck_assert_uint_gt(r->tx.cursor - r->tx.tail, r->tx.size / ENG_REF_RING_SHARE);
    /* Its credit stuck for ENG_UNPIN_AFTER_NS: copied out. */
    tb_eng_dst_of(p, 2, -1)->moved_ns -= ENG_UNPIN_AFTER_NS;
    r->unpin_check_ns = 0;
    eh_progress(&h);
    ck_assert_uint_eq(h.e->tx_copied, sent * sizeof(msg));
    ck_assert_uint_eq(r->npinned, 0);
    ck_assert_uint_eq(r->tx.cursor - r->tx.tail, 0);
    /* Under its share again: pinned. */
    for (; sent < 14; ++sent) {
        memset(msg, (int) (sent + 1), sizeof(msg));
        ck_assert_int_eq(eh_rank_write(&h, 0, TB_EREC_SEND, 3, 0, 2, true, msg, sizeof(msg)), 0);
        eh_progress(&h);
    }
    ck_assert_uint_eq(r->npinned, 2);
    n = waiting_payloads(p, got, sizeof(got));
    ck_assert_uint_eq(n, sent);
    for (unsigned i = 0; i < n; ++i) {
        ck_assert_uint_eq(got[i * sizeof(msg)], i + 1);
        ck_assert_uint_eq(got[i * sizeof(msg) + sizeof(msg) - 1], i + 1);
    }
    /* Gone: everything is copied out and the ring released. */
    tb_eng_peers_unpin(h.e, r);
    ck_assert_uint_eq(r->npinned, 0);
    ck_assert_uint_eq(r->txq_len, 0);
    ck_assert_uint_eq(waiting_payloads(p, got, sizeof(got)), sent);
    for (unsigned i = 0; i < n; ++i) {
        ck_assert_uint_eq(got[i * sizeof(msg) + 7], i + 1);
    }
    ck_assert_ptr_null(eh_check(&h));
    eh_fini(&h);
}
END_TEST

/* An engine in memory at one end of the harness's line of three (eh_relay_table):
 * its topology in t, and in *b peer 1, this engine's neighbour. */
static void line_of_three(eng_harness_t *h, eng_peer_t **b, tb_topo_t *t)
{
    const char *why = NULL;

    (void) setup(h);
    eh_relay_table(h);
    ck_assert_int_eq(tb_ehosts_topo(h->relay_table, 4, t, &why), 0);
    ck_assert_uint_eq(t->nhosts, 3);
    *b = eh_peer(h, 1);
}

/* A relayed DATA message from host src to this engine (host 0) for rank 0,
 * as b forwards it. */
/* Each source's flow to this engine (a test is a process; a test that
 * makes a new engine starts them again). */
static uint32_t relay_seq[3];

static void relay_from(eng_peer_t *b, unsigned src, uint32_t digest)
{
    uint32_t *seq = relay_seq;
    uint8_t buf[sizeof(tb_wire_erelay_t) + sizeof(tb_wire_emsg_t) + 2];
    tb_wire_erelay_t rh;
    tb_wire_emsg_t m;

    memset(&rh, 0, sizeof(rh));
    rh.digest = tb_wire_le32(digest);
    rh.src_host = tb_wire_le16((uint16_t) src);
    rh.dst_host = tb_wire_le16(0);
    rh.tag = TB_ETAG_DATA;
    rh.hops_left = 3;
    memset(&m, 0, sizeof(m));
    m.src = tb_wire_le32(100);
    m.src_pid = tb_wire_le32(5000);
    m.dst = tb_wire_le32(0);
    m.dst_pid = tb_wire_le32(EH_PID(0));
    m.tag = 9;
    m.seq = tb_wire_le32(seq[src % 3]++);
    memcpy(buf, &rh, sizeof(rh));
    memcpy(buf + sizeof(rh), &m, sizeof(m));
    memcpy(buf + sizeof(rh) + sizeof(m), "hi", 2);
    tb_eng_peer_recv(b, TB_ETAG_RELAY, buf, sizeof(buf));
}

/* Relayed messages reach the rank through a routed peer, those that came
 * before the table once it comes; one that names another table cuts its
 * neighbour off, and so does one claiming to come from this very host. */
START_TEST(relayed_to_rank)
{
    eng_harness_t h;
    eng_peer_t *b, *a = NULL;
    tb_topo_t t;
    unsigned recv = 0;

    line_of_three(&h, &b, &t);
    relay_from(b, 2, t.digest);
    eh_progress(&h);
    ck_assert_uint_eq(eh_rank_read(&h, 0, 10, TB_EREC_RECV, &recv), 0);
    ck_assert_int_eq(tb_eng_topo_set(h.e, h.relay_table, sizeof(h.relay_table)), 0);
    ck_assert_ptr_nonnull(h.e->topo);
    ck_assert_uint_eq(h.e->me, 0);
    relay_from(b, 2, t.digest);
    eh_progress(&h);
    (void) eh_rank_read(&h, 0, 10, TB_EREC_RECV, &recv);
    ck_assert_uint_eq(recv, 2);
    for (unsigned i = 0; i < h.e->npeers; ++i) {
        if (h.e->peers[i]->via == b) {
            a = h.e->peers[i];
        }
    }
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq(a->host, 2);
    ck_assert_ptr_null(eh_check(&h));
    /* A second table that differs is ignored. */
    h.relay_table[0].ipv4 ^= htonl(1);
    ck_assert_int_eq(tb_eng_topo_set(h.e, h.relay_table, sizeof(h.relay_table)), 0);
    ck_assert_uint_eq(h.e->topo->digest, t.digest);
    relay_from(b, 0, t.digest);
    ck_assert_int_eq(b->state, ENG_PEER_FAILED);
    eh_fini(&h);
}
END_TEST

START_TEST(relay_other_table)
{
    eng_harness_t h;
    eng_peer_t *b;
    tb_topo_t t;

    line_of_three(&h, &b, &t);
    ck_assert_int_eq(tb_eng_topo_set(h.e, h.relay_table, sizeof(h.relay_table)), 0);
    relay_from(b, 2, t.digest ^ 1);
    ck_assert_int_eq(b->state, ENG_PEER_FAILED);
    eh_fini(&h);
}
END_TEST

/* A malformed table is refused (a short entry, a device out of order,
 * reserved bytes set); one that does not show this engine's device as it
 * is, ignored. */
START_TEST(relay_table_checked)
{
    eng_harness_t h;
    eng_peer_t *b;
    tb_topo_t t;

    line_of_three(&h, &b, &t);
    ck_assert_int_eq(tb_eng_topo_set(h.e, h.relay_table, sizeof(h.relay_table) - 1), -1);
    h.relay_table[0].dev = 1; /* its only device numbered 1 */
    ck_assert_int_eq(tb_eng_topo_set(h.e, h.relay_table, sizeof(h.relay_table)), -1);
    h.relay_table[0].dev = 0;
    h.relay_table[1].reserved[2] = 1;
    ck_assert_int_eq(tb_eng_topo_set(h.e, h.relay_table, sizeof(h.relay_table)), -1);
    h.relay_table[1].reserved[2] = 0;
    h.dev.ipv4.s_addr ^= htonl(1);
    ck_assert_int_eq(tb_eng_topo_set(h.e, h.relay_table, sizeof(h.relay_table)), 0);
    ck_assert_ptr_null(h.e->topo);
    eh_fini(&h);
}
END_TEST

/* A relay from host src toward host dst, as the neighbour b passes it on:
 * hops_left hops to go and len bytes of body, all fill. */
static void relay_through(eng_peer_t *b, const tb_topo_t *t, unsigned src, unsigned dst,
                          uint8_t hops_left, uint8_t fill, size_t len)
{
    static uint8_t buf[sizeof(tb_wire_erelay_t) + (64u << 10)];
    tb_wire_erelay_t rh;

    ck_assert_uint_le(len, sizeof(buf) - sizeof(rh));
    memset(&rh, 0, sizeof(rh));
    rh.digest = tb_wire_le32(t->digest);
    rh.src_host = tb_wire_le16((uint16_t) src);
    rh.dst_host = tb_wire_le16((uint16_t) dst);
    rh.tag = TB_ETAG_DATA;
    rh.hops_left = hops_left;
    memcpy(buf, &rh, sizeof(rh));
    memset(buf + sizeof(rh), fill, len);
    tb_eng_peer_recv(b, TB_ETAG_RELAY, buf, sizeof(rh) + len);
}

static void middle_of_three(eng_harness_t *h, eng_peer_t **a, eng_peer_t **c, tb_topo_t *t)
{
    (void) setup(h);
    eh_relay_middle(h, a, c);
    ck_assert_int_eq(tb_eng_topo_set(h->e, h->relay_table, sizeof(h->relay_table)), 0);
    ck_assert_ptr_nonnull(h->e->topo);
    ck_assert_uint_eq(h->e->me, 1);
    *t = *h->e->topo;
}

/* The middle of a line forwards what is not for it toward its destination,
 * in order, holding what the next hop cannot take yet; when that hop is lost
 * it drops what it held for it and tells the source (UNREACH). */
START_TEST(relay_forwarded_in_order)
{
    eng_harness_t h;
    eng_peer_t *a, *c;
    const eng_msg_t *m;
    tb_wire_erelay_t rh;
    tb_topo_t t;
    unsigned n = 0;

    middle_of_three(&h, &a, &c, &t);
    for (uint8_t k = 0; k < 3; ++k) {
        relay_through(a, &t, 0, 2, 2, (uint8_t) ('a' + k), 100);
    }
    ck_assert_int_eq(a->state, ENG_PEER_CONNECTED);
    ck_assert_uint_eq(h.e->relayed_msgs, 3);
    /* Traffic for the engine's loop (it keeps pace), though no rank of its own
     * is in it. */
    ck_assert_uint_eq(h.e->rx_msgs, 3);
    ck_assert_uint_eq(h.e->relayed_bytes, 300);
    for (m = c->fwd_head; m; m = m->next, ++n) {
        ck_assert_uint_eq(m->len, sizeof(rh) + 100);
        memcpy(&rh, m->data, sizeof(rh));
        ck_assert_uint_eq(rh.hops_left, 1);
        ck_assert_uint_eq(tb_wire_le16(rh.dst_host), 2);
        ck_assert_uint_eq(m->data[sizeof(rh)], 'a' + n);
    }
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_gt(a->relay_held, 300);
    ck_assert_ptr_null(a->fwd_head);
    ck_assert_ptr_null(eh_check(&h));
    tb_eng_peer_fail(c, TB_CHAN_EPEERDEAD, "test: the cable to host 2 is cut");
    ck_assert_ptr_null(c->fwd_head);
    ck_assert_uint_eq(a->relay_held, 0);
    ck_assert_ptr_nonnull(a->fwd_head);
    memcpy(&rh, a->fwd_head->data, sizeof(rh));
    ck_assert_uint_eq(rh.tag, TB_ETAG_UNREACH);
    ck_assert_uint_eq(tb_wire_le16(rh.src_host), 1);
    ck_assert_uint_eq(tb_wire_le16(rh.dst_host), 0);
    eh_fini(&h);
}
END_TEST

/* A neighbour that makes this engine hold more for it than the routed
 * credit allows is cut, and what it cost stays within the bound. */
START_TEST(relay_bound)
{
    eng_harness_t h;
    eng_peer_t *a, *c;
    tb_topo_t t;
    unsigned k;

    middle_of_three(&h, &a, &c, &t);
    /* Only 0 -> 2 comes through host 0 to go on, only 2 -> 0 through host 2. */
    ck_assert_uint_eq(h.e->relay_pairs_from[0], 1);
    ck_assert_uint_eq(h.e->relay_pairs_from[2], 1);
    for (k = 0; k < 100000 && ENG_PEER_CONNECTED == a->state; ++k) {
        ck_assert_uint_le(a->relay_held, ENG_RELAY_HOLD(h.e, 0));
        relay_through(a, &t, 0, 2, 2, (uint8_t) k, 64u << 10);
    }
    ck_assert_int_eq(a->state, ENG_PEER_FAILED);
    ck_assert_uint_le(h.e->relayed_bytes, ENG_RELAY_HOLD(h.e, 0));
    ck_assert_uint_ge((uint64_t) k * (64u << 10), ENG_RELAY_HOLD(h.e, 0) / 2);
    eh_fini(&h);
}
END_TEST

/* What a relay refuses: a message with no hops left, one that claims a
 * source whose route does not come through the neighbour that sent it, one
 * for a host that is not in the table, and one from the right neighbour
 * over a cable the route does not take. */
START_TEST(relay_refused)
{
    eng_harness_t h;
    eng_peer_t *a, *b, *c;
    tb_topo_t t;

    middle_of_three(&h, &a, &c, &t);
    relay_through(a, &t, 0, 2, 0, 'x', 8);
    ck_assert_int_eq(a->state, ENG_PEER_FAILED);
    eh_fini(&h);

    middle_of_three(&h, &a, &c, &t);
    relay_through(c, &t, 0, 2, 2, 'x', 8); /* host 0's route to 2 does not come from 2 */
    ck_assert_int_eq(c->state, ENG_PEER_FAILED);
    ck_assert_int_eq(a->state, ENG_PEER_CONNECTED);
    eh_fini(&h);

    middle_of_three(&h, &a, &c, &t);
    relay_through(a, &t, 0, 3, 2, 'x', 8);
    ck_assert_int_eq(a->state, ENG_PEER_FAILED);
    ck_assert_uint_eq(h.e->relayed_msgs, 0);
    eh_fini(&h);

    /* Host 0's engine, but over the cable that leads to host 2. */
    middle_of_three(&h, &a, &c, &t);
    b = eh_peer_on(&h, 1, 1);
    relay_through(b, &t, 0, 2, 2, 'x', 8);
    ck_assert_int_eq(b->state, ENG_PEER_FAILED);
    ck_assert_int_eq(a->state, ENG_PEER_CONNECTED);
    eh_fini(&h);
}
END_TEST

/* The relay header of the message queued last toward neighbour q, and in
 * *host the host an UNREACH there names. */
static tb_wire_erelay_t queued_last(const eng_peer_t *q, unsigned *host)
{
    tb_wire_erelay_t rh;
    tb_wire_eunreach_t u;

    ck_assert_ptr_nonnull(q->fwd_tail);
    memcpy(&rh, q->fwd_tail->data, sizeof(rh));
    if (TB_ETAG_UNREACH == rh.tag) {
        memcpy(&u, q->fwd_tail->data + sizeof(rh), sizeof(u));
        *host = tb_wire_le16(u.host);
    }
    return rh;
}

static unsigned queued(const eng_peer_t *q)
{
    unsigned n = 0;

    for (const eng_msg_t *m = q->fwd_head; m; m = m->next) {
        ++n;
    }
    return n;
}

/* The last message queued for q is a notice that a way round is cut at host
 * at, in the flow of src's cable (flow) toward dst. */
static void check_notice(const eng_peer_t *q, unsigned src, unsigned dst, unsigned flow,
                         unsigned at)
{
    unsigned host = 99;
    tb_wire_erelay_t rh = queued_last(q, &host);

    ck_assert_uint_eq(rh.tag, TB_ETAG_UNREACH);
    ck_assert_uint_eq(rh.flow, flow);
    ck_assert_uint_eq(tb_wire_le16(rh.src_host), src);
    ck_assert_uint_eq(tb_wire_le16(rh.dst_host), dst);
    ck_assert_uint_eq(host, at);
}

/* Messages that come for a way on already lost are not dropped in silence:
 * their source hears, once per pair. */
START_TEST(relay_way_on_gone)
{
    eng_harness_t h;
    eng_peer_t *a, *c;
    tb_wire_erelay_t rh;
    tb_topo_t t;
    unsigned host = 99;

    middle_of_three(&h, &a, &c, &t);
    tb_eng_peer_fail(c, TB_CHAN_EPEERDEAD, "test: the cable to host 2 is cut");
    relay_through(a, &t, 0, 2, 2, 'x', 8);
    ck_assert_uint_eq(queued(a), 1);
    rh = queued_last(a, &host);
    ck_assert_uint_eq(rh.tag, TB_ETAG_UNREACH);
    ck_assert_uint_eq(tb_wire_le16(rh.dst_host), 0);
    ck_assert_uint_eq(host, 2);
    relay_through(a, &t, 0, 2, 2, 'y', 8);
    ck_assert_uint_eq(queued(a), 1);
    ck_assert_int_eq(a->state, ENG_PEER_CONNECTED);
    eh_fini(&h);
}
END_TEST

/* A lost cable is told to the end on this side of each pair it carried:
 * here the destination (host 0) of what came in over it from host 2. */
START_TEST(relay_lost_tells_destination)
{
    eng_harness_t h;
    eng_peer_t *a, *c;
    tb_wire_erelay_t rh;
    tb_topo_t t;
    unsigned host = 99;

    middle_of_three(&h, &a, &c, &t);
    relay_through(c, &t, 2, 0, 2, 'x', 8);
    ck_assert_uint_eq(queued(a), 1);
    tb_eng_peer_fail(c, TB_CHAN_EPEERDEAD, "test: the cable to host 2 is cut");
    ck_assert_uint_eq(queued(a), 2);
    rh = queued_last(a, &host);
    ck_assert_uint_eq(rh.tag, TB_ETAG_UNREACH);
    ck_assert_uint_eq(tb_wire_le16(rh.src_host), 1);
    ck_assert_uint_eq(tb_wire_le16(rh.dst_host), 0);
    ck_assert_uint_eq(host, 2);
    eh_fini(&h);
}
END_TEST

/* At the end of a line of three (line_of_three), the routed peer to host 2
 * that a message relayed from there makes. */
static eng_peer_t *routed_to_far_end(eng_harness_t *h, eng_peer_t **b, tb_topo_t *t)
{
    eng_peer_t *a = NULL;

    line_of_three(h, b, t);
    ck_assert_int_eq(tb_eng_topo_set(h->e, h->relay_table, sizeof(h->relay_table)), 0);
    relay_from(*b, 2, t->digest);
    eh_progress(h);
    for (unsigned i = 0; i < h->e->npeers; ++i) {
        a = h->e->peers[i]->via == *b ? h->e->peers[i] : a;
    }
    ck_assert_ptr_nonnull(a);
    return a;
}

/* An UNREACH relayed from host src naming host lost, as neighbour b passes it. */
static void unreach_from(eng_peer_t *b, const tb_topo_t *t, unsigned src, unsigned lost)
{
    uint8_t buf[sizeof(tb_wire_erelay_t) + sizeof(tb_wire_eunreach_t)];
    tb_wire_erelay_t rh;
    tb_wire_eunreach_t u;

    memset(&rh, 0, sizeof(rh));
    rh.digest = tb_wire_le32(t->digest);
    rh.src_host = tb_wire_le16((uint16_t) src);
    rh.dst_host = tb_wire_le16(0);
    rh.tag = TB_ETAG_UNREACH;
    rh.hops_left = 3;
    memset(&u, 0, sizeof(u));
    u.host = tb_wire_le16((uint16_t) lost);
    memcpy(buf, &rh, sizeof(rh));
    memcpy(buf + sizeof(rh), &u, sizeof(u));
    tb_eng_peer_recv(b, TB_ETAG_RELAY, buf, sizeof(buf));
}

/* That the way to a host is cut is believed only from a host on the way:
 * host 2 itself cannot say it (it would end the traffic of every rank here to
 * it on its word alone, through a route it is not on). */
START_TEST(relay_unreach_from_route_only)
{
    eng_harness_t h;
    eng_peer_t *b, *a;
    tb_topo_t t;

    a = routed_to_far_end(&h, &b, &t);
    ck_assert_int_eq(a->state, ENG_PEER_CONNECTED);
    unreach_from(b, &t, 2, 2);
    ck_assert_int_eq(a->state, ENG_PEER_CONNECTED);
    ck_assert_int_eq(b->state, ENG_PEER_CONNECTED);
    unreach_from(b, &t, 1, 2);
    ck_assert_int_eq(a->state, ENG_PEER_FAILED);
    eh_fini(&h);
}
END_TEST

/* A rank that dies gives its routed peer back the credit it had in flight:
 * the routed share of the window is its host's other ranks' too. */
START_TEST(relay_gone_releases_credit)
{
    eng_harness_t h;
    eng_peer_t *b, *a;
    uint8_t buf[sizeof(tb_wire_erelay_t) + sizeof(tb_wire_emsg_t) + 4];
    tb_wire_erelay_t rh;
    tb_wire_emsg_t m;
    eng_dst_t *d;
    tb_topo_t t;

    a = routed_to_far_end(&h, &b, &t);
    d = tb_eng_dst_of(a, 100, 0);
    ck_assert_ptr_nonnull(d);
    d->used = 300000;
    a->used_total = 300000;
    memset(&rh, 0, sizeof(rh));
    rh.digest = tb_wire_le32(t.digest);
    rh.src_host = tb_wire_le16(2);
    rh.dst_host = tb_wire_le16(0);
    rh.tag = TB_ETAG_GONE;
    rh.hops_left = 3;
    memset(&m, 0, sizeof(m));
    m.src = tb_wire_le32(100);
    m.src_pid = tb_wire_le32(5000);
    m.seq = tb_wire_le32(a->rx_seq);
    memcpy(buf, &rh, sizeof(rh));
    memcpy(buf + sizeof(rh), &m, sizeof(m));
    memcpy(buf + sizeof(rh) + sizeof(m), "dead", 4);
    tb_eng_peer_recv(b, TB_ETAG_RELAY, buf, sizeof(buf));
    ck_assert_uint_eq(d->used, 0);
    ck_assert_uint_eq(a->used_total, 0);
    eh_fini(&h);
}
END_TEST

/* ---- a failed cable's traffic going round it -------------------------------- */

/* Each flow's messages are numbered: one already delivered (sent again round
 * a cable its sender thought failed) is dropped, and one that skips a number
 * (a message lost) cuts the peer off. */
START_TEST(flow_numbered)
{
    eng_harness_t h;
    eng_peer_t *p = setup(&h);
    uint8_t buf[sizeof(tb_wire_emsg_t) + 1];
    tb_wire_emsg_t m;
    unsigned recv = 0;

    peer_send(p, TB_ETAG_DATA, 7, 1, 0, "a", 1);
    peer_send(p, TB_ETAG_DATA, 7, 1, 0, "b", 1);
    ck_assert_uint_eq(p->rx_seq, 2);
    memset(&m, 0, sizeof(m));
    m.src = tb_wire_le32(7);
    m.dst = tb_wire_le32(1);
    m.src_pid = tb_wire_le32(EH_PID(7));
    m.dst_pid = tb_wire_le32(EH_PID(1));
    m.seq = tb_wire_le32(1);
    memcpy(buf, &m, sizeof(m));
    buf[sizeof(m)] = 'c';
    tb_eng_peer_recv(p, TB_ETAG_DATA, buf, sizeof(buf));
    ck_assert_uint_eq(p->dups, 1);
    eh_progress(&h);
    (void) eh_rank_read(&h, 1, 10, TB_EREC_RECV, &recv);
    ck_assert_uint_eq(recv, 2);
    ck_assert_int_eq(p->state, ENG_PEER_CONNECTED);
    m.seq = tb_wire_le32(3);
    memcpy(buf, &m, sizeof(m));
    tb_eng_peer_recv(p, TB_ETAG_DATA, buf, sizeof(buf));
    ck_assert_int_eq(p->state, ENG_PEER_FAILED);
    eh_fini(&h);
}
END_TEST

static int ehost_cmp(const void *a, const void *b)
{
    const tb_wire_ehost_t *x = a, *y = b;
    int c = memcmp(x->engine_id, y->engine_id, sizeof(x->engine_id));

    return c ? c : (int) x->dev - (int) y->dev;
}

/* n cable ends (six for give_table), end i on device dev[i] of host ids[i]
 * at addr[i] (each /30 a cable), given to h's engine as the job's table:
 * the engine's own two devices are the first two.  Its topology in t. */
static void give_table_n(eng_harness_t *h, unsigned n, const uint8_t *const *ids,
                         const uint32_t *addr, const uint8_t *dev, tb_topo_t *t)
{
    tb_wire_ehost_t table[10];
    const char *why = NULL;

    ck_assert_uint_le(n, 10);
    memset(table, 0, sizeof(table));
    for (unsigned i = 0; i < n; ++i) {
        memcpy(table[i].engine_id, ids[i], sizeof(table[i].engine_id));
        table[i].ipv4 = htonl(addr[i]);
        table[i].netmask = htonl(0xfffffffcu);
        table[i].cm_port = tb_wire_le16(4000);
        table[i].dev = dev[i];
    }
    qsort(table, n, sizeof(table[0]), ehost_cmp);
    h->dev.ipv4.s_addr = htonl(addr[0]);
    h->dev.netmask.s_addr = htonl(0xfffffffcu);
    h->dev2.ipv4.s_addr = htonl(addr[1]);
    h->dev2.netmask.s_addr = htonl(0xfffffffcu);
    ck_assert_int_eq(tb_eng_topo_set(h->e, table, n * sizeof(table[0])), 0);
    ck_assert_ptr_nonnull(h->e->topo);
    ck_assert_int_eq(tb_ehosts_topo(table, n, t, &why), 0);
}

static void give_table(eng_harness_t *h, const uint8_t *const ids[6], const uint32_t addr[6],
                       const uint8_t dev[6], tb_topo_t *t)
{
    give_table_n(h, 6, ids, addr, dev, t);
}

/* The triangle's table given to the engine, peers 1 and 2 being the engines
 * idb and idc; t, *hb and *hc as triangle's. */
static void triangle_table(eng_harness_t *h, const uint8_t *idb, const uint8_t *idc, tb_topo_t *t,
                           unsigned *hb, unsigned *hc)
{
    static const uint32_t addr[6] = {0x0a000101, 0x0a000201, 0x0a000102,
                                     0x0a000301, 0x0a000202, 0x0a000302};
    static const uint8_t dev[6] = {0, 1, 0, 1, 0, 1};
    const uint8_t *const ids[6] = {h->e->id, h->e->id, idb, idb, idc, idc};

    give_table(h, ids, addr, dev, t);
    *hb = (unsigned) tb_topo_find(t, idb);
    *hc = (unsigned) tb_topo_find(t, idc);
}

/* A triangle: this engine's device 0 to peer 1's device 0 (10.0.1.0/30), its
 * device 1 to peer 2's device 0 (10.0.2.0/30), peer 1's device 1 to peer 2's
 * device 1 (10.0.3.0/30); *b and *c the peers over devices 0 and 1, and in
 * hb, hc and *me the hosts' indices. */
static void triangle(eng_harness_t *h, eng_peer_t **b, eng_peer_t **c, tb_topo_t *t,
                     unsigned *hb, unsigned *hc)
{
    (void) setup(h);
    eh_second_device(h);
    *b = eh_peer_on(h, 1, 0);
    *c = eh_peer_on(h, 2, 1);
    triangle_table(h, (*b)->id, (*c)->id, t, hb, hc);
}

/* Every cable's far engine is dialled once the table comes, whether or not
 * a rank named it: a way round a cable that fails is then ready (set up
 * only then, it kept traffic standing still for seconds on a busy host). */
START_TEST(neighbours_dialled)
{
    eng_harness_t h;
    eng_peer_t *b, *other, *c;
    tb_topo_t t;
    unsigned hb, hc;

    (void) setup(&h);
    eh_second_device(&h);
    b = eh_peer_on(&h, 1, 0);
    other = eh_peer_on(&h, 2, 0); /* peer 2's identity, over a cable that is not its */
    ck_assert_ptr_null(tb_eng_peer_for(h.e, 1, other->id, false));
    triangle_table(&h, b->id, other->id, &t, &hb, &hc);
    c = tb_eng_peer_for(h.e, 1, other->id, false);
    ck_assert_ptr_nonnull(c);
    ck_assert(c->known);
    ck_assert_uint_eq(c->ipv4, htonl(0x0a000202));
    eh_fini(&h);
}
END_TEST

/* A message of flow `flow` (0: none) from host src to host dst, numbered
 * seq, as neighbour n passes it on: DATA for rank 1 (one byte), or BACK of
 * try id. */
/* A relay header by t's table: src to dst, tag, flow. */
static tb_wire_erelay_t relay_hdr(const tb_topo_t *t, unsigned src, unsigned dst, uint8_t tag,
                                  unsigned flow)
{
    tb_wire_erelay_t rh;

    memset(&rh, 0, sizeof(rh));
    rh.digest = tb_wire_le32(t->digest);
    rh.src_host = tb_wire_le16((uint16_t) src);
    rh.dst_host = tb_wire_le16((uint16_t) dst);
    rh.tag = tag;
    rh.hops_left = 4;
    rh.flow = (uint8_t) flow;
    return rh;
}

static void detour_msg(eng_peer_t *n, const tb_topo_t *t, unsigned src, unsigned dst,
                       unsigned flow, uint8_t tag, uint32_t seq, uint64_t id)
{
    uint8_t buf[sizeof(tb_wire_erelay_t) + sizeof(tb_wire_emsg_t) + 1];
    tb_wire_erelay_t rh;
    tb_wire_emsg_t m;
    bool data = TB_ETAG_DATA == tag;

    rh = relay_hdr(t, src, dst, tag, flow);
    memset(&m, 0, sizeof(m));
    if (data) {
        m.src = tb_wire_le32(7);
        m.dst = tb_wire_le32(1);
        m.src_pid = tb_wire_le32(EH_PID(7));
        m.dst_pid = tb_wire_le32(EH_PID(1));
    } else {
        m.src = tb_wire_le32((uint32_t) id);
        m.dst = tb_wire_le32((uint32_t) (id >> 32));
    }
    m.seq = tb_wire_le32(seq);
    memcpy(buf, &rh, sizeof(rh));
    memcpy(buf + sizeof(rh), &m, sizeof(m));
    buf[sizeof(rh) + sizeof(m)] = 'x';
    tb_eng_peer_recv(n, TB_ETAG_RELAY, buf, sizeof(buf) - !data);
}

static void detour_from(eng_peer_t *n, const tb_topo_t *t, unsigned src, unsigned dst,
                        unsigned flow, uint32_t seq)
{
    detour_msg(n, t, src, dst, flow, TB_ETAG_DATA, seq, 0);
}

/* BACK_OK for BACK number seq of try id, over p's cable. */
static void back_ok_from(eng_peer_t *p, uint64_t id, uint32_t seq)
{
    tb_wire_emsg_t m;

    memset(&m, 0, sizeof(m));
    m.src = tb_wire_le32((uint32_t) id);
    m.dst = tb_wire_le32((uint32_t) (id >> 32));
    m.seq = tb_wire_le32(seq);
    tb_eng_peer_recv(p, TB_ETAG_BACK_OK, &m, sizeof(m));
}

/* The traffic of peer 1's failed cable to this engine comes round it through
 * peer 2: it joins the same flow (numbers, credit, the rank's link), and a
 * copy the cable had delivered already is dropped.  Peer 2 may not pass off
 * any other cable's traffic as such. */
START_TEST(detour_received)
{
    eng_harness_t h;
    eng_peer_t *b, *c;
    tb_topo_t t;
    unsigned hb, hc, recv = 0;

    triangle(&h, &b, &c, &t, &hb, &hc);
    peer_send(b, TB_ETAG_DATA, 7, 1, 0, "a", 1);
    detour_from(c, &t, hb, h.e->me, 1, 1);
    detour_from(c, &t, hb, h.e->me, 1, 0);
    ck_assert_uint_eq(b->rx_seq, 2);
    ck_assert_uint_eq(b->dups, 1);
    ck_assert_uint_eq(b->delivered[1], 2 * tb_ecredit_cost(1));
    eh_progress(&h);
    (void) eh_rank_read(&h, 1, 10, TB_EREC_RECV, &recv);
    ck_assert_uint_eq(recv, 2);
    ck_assert_int_eq(c->state, ENG_PEER_CONNECTED);
    /* Peer 1's cable to peer 2 does not end here. */
    detour_from(c, &t, hb, h.e->me, 2, 2);
    ck_assert_int_eq(c->state, ENG_PEER_FAILED);
    ck_assert_uint_eq(b->rx_seq, 2);
    eh_fini(&h);

    /* A relay that skips a number is cut, not the flow it claims. */
    triangle(&h, &b, &c, &t, &hb, &hc);
    detour_from(c, &t, hb, h.e->me, 1, 1);
    ck_assert_int_eq(c->state, ENG_PEER_FAILED);
    ck_assert_int_eq(b->state, ENG_PEER_CONNECTED);
    ck_assert_uint_eq(b->rx_seq, 0);
    eh_fini(&h);
}
END_TEST

/* A neighbour's failed cable to another neighbour goes round through here:
 * forwarded (counted as relayed), and only its own cable's traffic. */
START_TEST(detour_forwarded)
{
    eng_harness_t h;
    eng_peer_t *b, *c;
    tb_topo_t t;
    unsigned hb, hc;

    triangle(&h, &b, &c, &t, &hb, &hc);
    detour_from(b, &t, hb, hc, 2, 0);
    detour_from(b, &t, hb, hc, 2, 1);
    ck_assert_uint_eq(queued(c), 2);
    ck_assert_uint_eq(h.e->relayed_msgs, 2);
    ck_assert_int_eq(b->state, ENG_PEER_CONNECTED);
    /* Its cable to this engine does not lead to peer 2. */
    detour_from(b, &t, hb, hc, 1, 2);
    ck_assert_int_eq(b->state, ENG_PEER_FAILED);
    /* The way round b's cable to c is cut here: c, the end on this side,
     * is told in b's flow (tb_eng_detour_lost), naming this engine. */
    ck_assert_uint_eq(queued(c), 3);
    check_notice(c, hb, hc, 2, h.e->me);
    eh_fini(&h);
}
END_TEST

/* A cable that goes dark or breaks is gone round through the host cabled to
 * both ends, with the flow's own relay headers; one whose peer broke the
 * protocol or closed is not, and neither is a cable with no way round it. */
START_TEST(detour_taken)
{
    eng_harness_t h, h2;
    eng_peer_t *b, *c, *x;
    tb_topo_t t, t2;
    unsigned hb, hc;

    triangle(&h, &b, &c, &t, &hb, &hc);
    ck_assert(!tb_eng_peer_detour(c, TB_CHAN_EPROTO, "test: a broken peer"));
    ck_assert(!tb_eng_peer_detour(c, TB_CHAN_ECLOSED, "test: closed"));
    ck_assert(tb_eng_peer_detour(b, TB_CHAN_EPEERDEAD, "test: the cable went dark"));
    ck_assert_ptr_eq(b->via, c);
    ck_assert(!b->routed);
    ck_assert_int_eq(b->state, ENG_PEER_CONNECTED);
    ck_assert_uint_eq(b->host, hb);
    ck_assert_uint_eq(b->relay[TB_ETAG_DATA].flow, 1);
    ck_assert_uint_eq(tb_wire_le16(b->relay[TB_ETAG_DATA].src_host), h.e->me);
    ck_assert_uint_eq(tb_wire_le16(b->relay[TB_ETAG_DATA].dst_host), hb);
    ck_assert(tb_eng_peer_relayed(b));
    ck_assert(!tb_eng_peer_detour(b, TB_CHAN_EPEERDEAD, "test: again"));
    /* Through a detoured cable nobody else goes round: c's would need b's. */
    ck_assert(!tb_eng_peer_detour(c, TB_CHAN_EPEERDEAD, "test: the other cable too"));
    eh_fini(&h);

    line_of_three(&h2, &x, &t2);
    ck_assert_int_eq(tb_eng_topo_set(h2.e, h2.relay_table, sizeof(h2.relay_table)), 0);
    ck_assert(!tb_eng_peer_detour(x, TB_CHAN_EPEERDEAD, "test: the only cable"));
    eh_fini(&h2);
}
END_TEST

/* Two cables from this engine to peer 1 (devices 0 and 1: 10.0.1.0/30 and
 * 10.0.2.0/30), and peer 1's third to peer 2 (10.0.3.0/30): a line of three
 * whose first pair has two cables.  *b0 and *b1 are peer 1 over devices 0
 * and 1, *r the routed peer to peer 2 that a message relayed from there
 * makes (through *b0: the route takes the lowest cable). */
static void double_line(eng_harness_t *h, eng_peer_t **b0, eng_peer_t **b1, eng_peer_t **r,
                        tb_topo_t *t)
{
    static const uint32_t addr[6] = {0x0a000101, 0x0a000201, 0x0a000102,
                                     0x0a000202, 0x0a000301, 0x0a000302};
    static const uint8_t dev[6] = {0, 1, 0, 1, 2, 0};
    uint8_t idc[TB_WIRE_ENGINE_ID_SIZE] = {'p', 'e', 'e', 'r'};
    const uint8_t *ids[6];
    unsigned two = 2;

    (void) setup(h);
    eh_second_device(h);
    *b0 = eh_peer_on(h, 1, 0);
    *b1 = eh_peer_on(h, 1, 1);
    memcpy(idc + 8, &two, sizeof(two));
    ids[0] = ids[1] = h->e->id;
    ids[2] = ids[3] = ids[4] = (*b0)->id;
    ids[5] = idc;
    give_table(h, ids, addr, dev, t);
    ck_assert_uint_eq(t->nhosts, 3);
    ck_assert_uint_eq(h->e->me, 0);
    memset(relay_seq, 0, sizeof(relay_seq));
    relay_from(*b0, 2, t->digest);
    eh_progress(h);
    *r = NULL;
    for (unsigned i = 0; i < h->e->npeers; ++i) {
        *r = h->e->peers[i]->routed ? h->e->peers[i] : *r;
    }
    ck_assert_ptr_nonnull(*r);
    ck_assert_ptr_eq((*r)->via, *b0);
    ck_assert_int_eq((*r)->state, ENG_PEER_CONNECTED);
}

/* A relayed message as a channel hands it back: a relay header from this
 * engine (host 0) to host 2, then a byte that tells it apart. */
static void hand_back(eng_peer_t *p, const tb_topo_t *t, char mark)
{
    uint8_t buf[sizeof(tb_wire_erelay_t) + 1];
    tb_wire_erelay_t rh;
    struct iovec iov[2] = {{.iov_base = buf, .iov_len = sizeof(rh)},
                           {.iov_base = buf + sizeof(rh), .iov_len = 1}};

    memset(&rh, 0, sizeof(rh));
    rh.digest = tb_wire_le32(t->digest);
    rh.src_host = tb_wire_le16(0);
    rh.dst_host = tb_wire_le16(2);
    rh.tag = TB_ETAG_DATA;
    rh.hops_left = 3;
    memcpy(buf, &rh, sizeof(rh));
    buf[sizeof(rh)] = (uint8_t) mark;
    tb_eng_relay_unsent(p, iov, 2, sizeof(buf));
}

/* A cable that fails while another joins the same two hosts: what it
 * carried for other hosts moves to the other cable with its own flow, what
 * its channel handed back first and in order, and the routed peer that went
 * through it goes through the other, after those; the far end's relayed
 * messages are taken over either cable.  A channel that could not hand back
 * everything ends those routes instead (the routed peer fails), and only
 * later traffic takes the other cable.  When the other cable fails in turn
 * after the first carries its flow again, everything moves back to the
 * first, which then sends nowhere else (no cable hands its traffic on to
 * one that hands it back). */
START_TEST(relay_moves_with_cable)
{
    eng_harness_t h;
    eng_peer_t *b0, *b1, *r;
    tb_topo_t t;

    double_line(&h, &b0, &b1, &r, &t);
    relay_from(b1, 2, t.digest); /* over the other cable: taken */
    ck_assert_int_eq(b1->state, ENG_PEER_CONNECTED);
    hand_back(b0, &t, 'a');
    hand_back(b0, &t, 'b');
    ck_assert(tb_eng_peer_detour(b0, TB_CHAN_ELINK, "test: link down"));
    ck_assert_ptr_eq(b0->via, b1);
    ck_assert_ptr_eq(b0->relay_to, b1);
    ck_assert_ptr_eq(r->via, b1);
    ck_assert_uint_eq(queued(b1), 2);
    ck_assert_uint_eq(b1->fwd_hold, 2);
    ck_assert_int_eq(b1->fwd_head->data[sizeof(tb_wire_erelay_t)], 'a');
    ck_assert_int_eq(b1->fwd_tail->data[sizeof(tb_wire_erelay_t)], 'b');
    ck_assert_ptr_null(b0->unsent_relay_head);
    eh_progress(&h);
    ck_assert_int_eq(r->state, ENG_PEER_CONNECTED);
    relay_from(b1, 2, t.digest);
    ck_assert_int_eq(b1->state, ENG_PEER_CONNECTED);
    ck_assert_ptr_null(eh_check(&h));
    /* Cable 0 carries its own flow again (as tb_engine_back.c leaves it);
     * then cable 1 fails: everything comes back to cable 0, which no longer
     * sends anywhere else. */
    b0->via = NULL;
    hand_back(b1, &t, 'c');
    ck_assert(tb_eng_peer_detour(b1, TB_CHAN_EPEERDEAD, "test: dark"));
    ck_assert_ptr_eq(b1->via, b0);
    ck_assert_ptr_null(b0->relay_to);
    ck_assert_ptr_eq(b1->relay_to, b0);
    ck_assert_ptr_eq(r->via, b0);
    ck_assert_uint_eq(queued(b0), 3); /* what the channel had is older than what waited */
    ck_assert_int_eq(b0->fwd_head->data[sizeof(tb_wire_erelay_t)], 'c');
    ck_assert_int_eq(b0->fwd_tail->data[sizeof(tb_wire_erelay_t)], 'b');
    eh_progress(&h);
    ck_assert_int_eq(r->state, ENG_PEER_CONNECTED);
    eh_fini(&h);

    double_line(&h, &b0, &b1, &r, &t);
    hand_back(b0, &t, 'a');
    tb_eng_relay_unsent(b0, NULL, 0, 4 << 20); /* one it could not hand back whole */
    ck_assert(tb_eng_peer_detour(b0, TB_CHAN_ELINK, "test: link down"));
    ck_assert_ptr_eq(b0->relay_to, b1);
    ck_assert_ptr_eq(r->via, b0);
    ck_assert_ptr_null(b0->unsent_relay_head);
    ck_assert_uint_eq(queued(b1), 0);
    ck_assert_uint_eq(b1->fwd_hold, 0);
    eh_progress(&h);
    ck_assert_int_eq(r->state, ENG_PEER_FAILED);
    eh_fini(&h);
}
END_TEST

/* A ring of four: this engine (host 0) - peer 1 - peer 2 - peer 3 - this
 * engine, one cable per pair (10.0.1.0/30, .2, .3, .4); *b is peer 1 over
 * device 0, *c peer 3 over device 1. */
static void ring_of_four(eng_harness_t *h, eng_peer_t **b, eng_peer_t **c, tb_topo_t *t)
{
    const char *why = NULL;

    (void) setup(h);
    eh_ring_table(h);
    *b = eh_peer_on(h, 1, 0);
    *c = eh_peer_on(h, 3, 1);
    ck_assert_int_eq(tb_eng_topo_set(h->e, h->ring_table, sizeof(h->ring_table)), 0);
    ck_assert_ptr_nonnull(h->e->topo);
    ck_assert_int_eq(tb_ehosts_topo(h->ring_table, 8, t, &why), 0);
    ck_assert_uint_eq(t->nhosts, 4);
    ck_assert_uint_eq(h->e->me, 0);
    ck_assert_uint_eq(t->peer[1][1], 2);
    ck_assert_uint_eq(t->peer[3][1], 0);
}


/* A relay header (src, dst, tag, flow) then body, as neighbour n sends it. */
static void round_msg(eng_peer_t *n, const tb_topo_t *t, unsigned src, unsigned dst,
                      unsigned flow, uint8_t tag, const void *body, size_t blen)
{
    uint8_t buf[sizeof(tb_wire_erelay_t) + 256];
    tb_wire_erelay_t rh = relay_hdr(t, src, dst, tag, flow);

    ck_assert_uint_le(blen, 256);
    memcpy(buf, &rh, sizeof(rh));
    memcpy(buf + sizeof(rh), body, blen);
    tb_eng_peer_recv(n, TB_ETAG_RELAY, buf, sizeof(rh) + blen);
}

/* On a ring of four, the cable to peer 1 fails: its way round goes through
 * peers 3 and 2, and so does what it carried for other hosts: what its
 * channel handed back first, in order (another failed cable's flow among
 * it is dropped: it does not go round a second), then what comes for it;
 * the routed peer to host 2 that went through it stays up, held until those
 * went.  Another failed cable's flow that would go round it tells its
 * source.  What comes round it from peer 1 for other hosts is taken as come
 * over the cable and sent on.  A notice that the way round is cut, from a
 * host on it, ends the flow and the routed peer. */
START_TEST(ring_cable_goes_round)
{
    eng_harness_t h;
    eng_peer_t *b, *c, *r = NULL;
    tb_topo_t t;
    uint8_t inner[sizeof(tb_wire_erelay_t) + 1];
    tb_wire_erelay_t ih;
    tb_wire_eunreach_t u;

    ring_of_four(&h, &b, &c, &t);
    memset(relay_seq, 0, sizeof(relay_seq));
    relay_from(b, 2, t.digest);
    eh_progress(&h);
    for (unsigned i = 0; i < h.e->npeers; ++i) {
        r = h.e->peers[i]->routed ? h.e->peers[i] : r;
    }
    ck_assert_ptr_nonnull(r);
    ck_assert_ptr_eq(r->via, b);
    hand_back(b, &t, 'a');
    hand_back(b, &t, 'b');
    {
        /* Peer 2's cable to peer 3 had failed, its flow coming round
         * through here toward peer 1: handed back last, it is dropped
         * without leaving the queue pointing at it. */
        uint8_t buf[sizeof(tb_wire_erelay_t) + 1] = {0};
        struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
        tb_wire_erelay_t rh = relay_hdr(&t, 2, 3, TB_ETAG_DATA, 2);
        memcpy(buf, &rh, sizeof(rh));
        tb_eng_relay_unsent(b, &iov, 1, sizeof(buf));
    }
    ck_assert(tb_eng_peer_detour(b, TB_CHAN_ELINK, "test: link down"));
    ck_assert_ptr_eq(b->via, c);
    ck_assert(b->tunnel);
    ck_assert_ptr_null(b->relay_to);
    ck_assert_uint_eq(queued(b), 2);
    ck_assert_uint_eq(b->fwd_hold, 2);
    ck_assert_int_eq(b->fwd_head->data[sizeof(tb_wire_erelay_t)], 'a');
    ck_assert_int_eq(b->fwd_tail->data[sizeof(tb_wire_erelay_t)], 'b');
    ck_assert_ptr_null(b->fwd_tail->next);
    ck_assert_uint_eq(b->relay[TB_ETAG_RELAY].flow, 1);
    ck_assert_uint_eq(b->relay[TB_ETAG_RELAY].tag, TB_ETAG_RELAY);
    eh_progress(&h);
    ck_assert_int_eq(r->state, ENG_PEER_CONNECTED);

    /* Host 3's message for host 1 comes through here: it goes round too. */
    relay_through(c, &t, 3, 1, 3, 'z', 8);
    ck_assert_int_eq(c->state, ENG_PEER_CONNECTED);
    ck_assert_uint_eq(queued(b), 3);
    ck_assert_int_eq(b->fwd_tail->data[sizeof(tb_wire_erelay_t)], 'z');

    /* Peer 3's cable to peer 2 failed, its flow coming round (2, 1, here,
     * 3) from peer 3: its way on goes round b's, which it cannot: peer 3
     * is told, in peer 2's flow toward it, naming this engine. */
    ck_assert_int_eq(tb_eng_detour_next(h.e, 3, 0, 0, 2), 1);
    detour_msg(c, &t, 3, 2, 1, TB_ETAG_DATA, 0, 0);
    ck_assert_int_eq(c->state, ENG_PEER_CONNECTED);
    ck_assert_uint_eq(queued(b), 3);
    ck_assert_uint_eq(queued(c), 1);
    check_notice(c, 2, 3, 2, 0);

    /* Round b's cable from peer 1 (through 2 and 3): host 1's message for
     * host 3, taken as come over the cable and sent on. */
    ih = relay_hdr(&t, 1, 3, TB_ETAG_DATA, 0);
    memcpy(inner, &ih, sizeof(ih));
    inner[sizeof(ih)] = 'q';
    round_msg(c, &t, 1, 0, 1, TB_ETAG_RELAY, inner, sizeof(inner));
    ck_assert_int_eq(c->state, ENG_PEER_CONNECTED);
    ck_assert_int_eq(b->state, ENG_PEER_CONNECTED);
    ck_assert_uint_eq(queued(c), 2);
    ck_assert_int_eq(c->fwd_tail->data[sizeof(tb_wire_erelay_t)], 'q');

    /* A notice naming a host not on the way round, or this end, changes
     * nothing; one from host 2, on it, ends b's flow and the routed peer
     * behind it. */
    memset(&u, 0, sizeof(u));
    u.host = tb_wire_le16(7);
    round_msg(c, &t, 1, 0, 1, TB_ETAG_UNREACH, &u, sizeof(u));
    u.host = tb_wire_le16(0);
    round_msg(c, &t, 1, 0, 1, TB_ETAG_UNREACH, &u, sizeof(u));
    ck_assert_int_eq(b->state, ENG_PEER_CONNECTED);
    u.host = tb_wire_le16(2);
    round_msg(c, &t, 1, 0, 1, TB_ETAG_UNREACH, &u, sizeof(u));
    ck_assert_int_eq(b->state, ENG_PEER_FAILED);
    ck_assert_int_eq(c->state, ENG_PEER_CONNECTED);
    eh_progress(&h);
    ck_assert_int_eq(r->state, ENG_PEER_FAILED);
    eh_fini(&h);
}
END_TEST

/* What comes round a failed cable for other hosts never carries another
 * failed cable's traffic (the far end could pass it off for hosts on no way
 * through it, or nest it without end): the flow fails.  And it comes round
 * only through other hosts: the source sending it over another cable to the
 * same host is cut. */
START_TEST(round_carries_no_round)
{
    eng_harness_t h;
    eng_peer_t *b, *c, *b0, *b1, *r;
    tb_topo_t t;
    tb_wire_erelay_t ih;

    ring_of_four(&h, &b, &c, &t);
    ck_assert(tb_eng_peer_detour(b, TB_CHAN_ELINK, "test: link down"));
    /* Host 2's cable to host 3, whose way round (2, 1, here, 3) comes from
     * host 1: it would pass for it. */
    ih = relay_hdr(&t, 2, 3, TB_ETAG_DATA, 2);
    round_msg(c, &t, 1, 0, 1, TB_ETAG_RELAY, &ih, sizeof(ih));
    ck_assert_int_eq(b->state, ENG_PEER_FAILED);
    ck_assert_int_eq(c->state, ENG_PEER_CONNECTED);
    ck_assert_uint_eq(queued(c), 0);
    eh_fini(&h);

    double_line(&h, &b0, &b1, &r, &t);
    ih = relay_hdr(&t, 1, 2, TB_ETAG_DATA, 0);
    round_msg(b1, &t, 1, 0, 1, TB_ETAG_RELAY, &ih, sizeof(ih));
    ck_assert_int_eq(b1->state, ENG_PEER_FAILED);
    eh_fini(&h);
}
END_TEST

/* A diamond: peer 1 (host 0) cabled to peer 2 (host 1), peer 3 (host 2) and
 * this engine's device 0, which sorts last (host 3); peer 3 and this
 * engine's device 1 cabled to peer 2.  Peer 1's cable to peer 2 goes round
 * through peer 3; when that host's cables are down too, its end goes
 * through this one, in two hops (ENG_ROUND_SHORT): taken from the source
 * and passed to the far end, noted as a pair it carries; the same from the
 * far end's side, not from its source, cuts it. */
START_TEST(detour_short_fallback)
{
    static const uint32_t addr[10] = {0x0a000402, 0x0a000501, 0x0a000101, 0x0a000201,
                                      0x0a000401, 0x0a000102, 0x0a000302, 0x0a000502,
                                      0x0a000202, 0x0a000301};
    static const uint8_t dev[10] = {0, 1, 0, 1, 2, 0, 1, 2, 0, 1};
    const uint8_t *ids[10];
    eng_harness_t h;
    eng_peer_t *a, *b;
    tb_topo_t t;
    uint8_t path[TB_TOPO_MAX_HOSTS];

    (void) setup(&h);
    eh_second_device(&h);
    h.e->id[0] = 'z';
    a = eh_peer_on(&h, 1, 0);
    b = eh_peer_on(&h, 2, 1);
    ids[0] = ids[1] = h.e->id;
    ids[2] = ids[3] = ids[4] = a->id;
    ids[5] = ids[6] = ids[7] = b->id;
    ids[8] = ids[9] = eh_peer_on(&h, 3, 0)->id;
    give_table_n(&h, 10, ids, addr, dev, &t);
    ck_assert_uint_eq(h.e->me, 3);
    ck_assert_uint_eq(t.peer[0][0], 1);
    ck_assert_uint_eq(tb_topo_detour(&t, 0, 0, path), 3);
    ck_assert_uint_eq(path[1], 2);
    detour_from(a, &t, 0, 1, 1, 0);
    ck_assert_int_eq(a->state, ENG_PEER_CONNECTED);
    ck_assert_uint_eq(queued(b), 1);
    ck_assert(h.e->relayed_pairs[0] & (1ull << 1));
    detour_from(b, &t, 1, 0, 1, 0); /* the far end's own flow the other way */
    ck_assert_int_eq(b->state, ENG_PEER_CONNECTED);
    ck_assert_uint_eq(queued(a), 1);
    detour_from(b, &t, 0, 1, 1, 1);
    ck_assert_int_eq(b->state, ENG_PEER_FAILED);
    eh_fini(&h);
}
END_TEST

/* In the middle of a way round of three hops (peer 1's cable to peer 2
 * goes round by 1, here, 3, 2): its flow is taken from the host before
 * this one and passed on to the next; the same from the other side cuts
 * that neighbour, and the source, on this side, is told its way is cut
 * here. */
START_TEST(ring_detour_middle)
{
    eng_harness_t h;
    eng_peer_t *b, *c;
    tb_topo_t t;

    ring_of_four(&h, &b, &c, &t);
    detour_from(b, &t, 1, 2, 2, 0);
    ck_assert_int_eq(b->state, ENG_PEER_CONNECTED);
    ck_assert_uint_eq(queued(c), 1);
    ck_assert_uint_eq(h.e->relayed_msgs, 1);
    detour_from(b, &t, 1, 2, 2, 1);
    ck_assert_uint_eq(queued(c), 2);
    detour_from(c, &t, 1, 2, 2, 2);
    ck_assert_int_eq(c->state, ENG_PEER_FAILED);
    ck_assert_int_eq(b->state, ENG_PEER_CONNECTED);
    ck_assert_uint_eq(queued(b), 1);
    check_notice(b, 2, 1, 1, 0);
    eh_fini(&h);
}
END_TEST

/* A failed cable that works again: the end with the lower engine id dials
 * it; the far end's BACK of this try, come round in its flow's order, is
 * answered (BACK_OK owed), one of an earlier try is not, and what follows
 * still comes round until this end moves too; BACK_OK for this end's BACK
 * of this try, and only for it, moves the flow back onto the cable.  A new
 * channel that fails first leaves the flow going round, unless the far
 * engine closed it.  (The harness's peers have no channel: the channel's
 * own part, and what comes round a sound cable being held, are the virtual
 * cluster's to show.) */
START_TEST(back_moves_flow)
{
    eng_harness_t h;
    eng_peer_t *b, *c;
    tb_topo_t t;
    unsigned hb, hc, recv = 0;
    bool lower;
    const uint64_t try_id = 0x1122334455667788ull;

    triangle(&h, &b, &c, &t, &hb, &hc);
    lower = memcmp(h.e->id, b->id, sizeof(b->id)) < 0;
    ck_assert(tb_eng_peer_detour(b, TB_CHAN_ELINK, "test: link down"));
    ck_assert_uint_eq(0 != b->back_at, lower);
    ck_assert(!b->back);
    /* Not while a channel over the cable is still being dropped. */
    b->destroy = true;
    ck_assert(!tb_eng_back_accept(b));
    b->destroy = false;

    /* This end's new channel is up (try try_id); the far end's BACK of an
     * earlier try comes round first, late: it moves nothing. */
    b->back = b->back_up = true;
    b->back_id = try_id;
    detour_from(c, &t, hb, h.e->me, 1, 0);
    detour_msg(c, &t, hb, h.e->me, 1, TB_ETAG_BACK, 1, try_id - 1);
    ck_assert_int_eq(c->state, ENG_PEER_CONNECTED);
    ck_assert_uint_eq(b->rx_seq, 2);
    ck_assert(!b->back_rx && !b->back_ok_due);
    /* What follows it still comes round; then this try's BACK. */
    detour_from(c, &t, hb, h.e->me, 1, 2);
    detour_msg(c, &t, hb, h.e->me, 1, TB_ETAG_BACK, 3, try_id);
    ck_assert_uint_eq(b->rx_seq, 4);
    ck_assert(b->back_rx && b->back_ok_due);
    ck_assert_uint_eq(b->back_ok_seq, 3);
    /* A duplicate changes nothing. */
    b->back_ok_due = false;
    detour_msg(c, &t, hb, h.e->me, 1, TB_ETAG_BACK, 3, try_id);
    ck_assert(!b->back_ok_due);

    /* This end sent BACK number 4: only the BACK_OK naming 4 and this try
     * moves its flow. */
    b->back_sent = true;
    b->back_seq = 4;
    back_ok_from(b, try_id, 3);
    back_ok_from(b, try_id - 1, 4);
    ck_assert_ptr_eq(b->via, c);
    back_ok_from(b, try_id, 4);
    ck_assert_ptr_null(b->via);
    ck_assert(!b->back_sent);
    ck_assert(!tb_eng_peer_relayed(b));
    ck_assert_int_eq(b->state, ENG_PEER_CONNECTED);
    eh_progress(&h);
    (void) eh_rank_read(&h, 1, 10, TB_EREC_RECV, &recv);
    ck_assert_uint_eq(recv, 2);
    /* BACK_OK cannot come round: it is the cable's own. */
    {
        uint8_t buf[sizeof(tb_wire_erelay_t) + sizeof(tb_wire_emsg_t)];
        tb_wire_erelay_t rh;
        memset(buf, 0, sizeof(buf));
        memset(&rh, 0, sizeof(rh));
        rh.digest = tb_wire_le32(t.digest);
        rh.src_host = tb_wire_le16((uint16_t) hb);
        rh.dst_host = tb_wire_le16((uint16_t) h.e->me);
        rh.tag = TB_ETAG_BACK_OK;
        rh.hops_left = 3;
        rh.flow = 1;
        memcpy(buf, &rh, sizeof(rh));
        tb_eng_peer_recv(c, TB_ETAG_RELAY, buf, sizeof(buf));
        ck_assert_int_eq(c->state, ENG_PEER_FAILED);
    }
    eh_fini(&h);

    /* A new channel that fails before the flow moved: dropped, the flow
     * goes on round, the cable is tried again; closed by the far engine, or
     * after the flow moved, the usual failure. */
    triangle(&h, &b, &c, &t, &hb, &hc);
    ck_assert(tb_eng_peer_detour(b, TB_CHAN_EPEERDEAD, "test: dark"));
    ck_assert(!tb_eng_back_failed(b, TB_CHAN_EPEERDEAD, "test: not trying"));
    b->back = b->back_up = b->back_sent = true;
    ck_assert(!tb_eng_back_failed(b, TB_CHAN_ECLOSED, "test: the far engine left"));
    ck_assert(tb_eng_back_failed(b, TB_CHAN_ELINK, "test: failed again"));
    ck_assert_ptr_eq(b->via, c);
    ck_assert(!b->back && !b->back_sent);
    ck_assert(b->destroy);
    ck_assert_int_eq(b->state, ENG_PEER_CONNECTED);
    b->destroy = false;
    b->via = NULL;
    b->back = true;
    ck_assert(!tb_eng_back_failed(b, TB_CHAN_ELINK, "test: moved already"));
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
    tcase_add_test(tc, peer_data_wrong_pid);
    tcase_add_test(tc, peer_gone_per_process);
    tcase_add_test(tc, dh_budget);
    tcase_add_test(tc, pair_secret_any_cable);
    tcase_add_test(tc, local_refusal_kept);
    tcase_add_test(tc, peer_empty_data_bounded);
    tcase_add_test(tc, peer_data_with_reader);
    tcase_add_test(tc, placed_in_ring);
    tcase_add_test(tc, place_refused);
    tcase_add_test(tc, placed_released);
    tcase_add_test(tc, held_in_ring);
    tcase_add_test(tc, relayed_to_rank);
    tcase_add_test(tc, relay_other_table);
    tcase_add_test(tc, relay_table_checked);
    tcase_add_test(tc, relay_forwarded_in_order);
    tcase_add_test(tc, relay_bound);
    tcase_add_test(tc, relay_refused);
    tcase_add_test(tc, relay_way_on_gone);
    tcase_add_test(tc, relay_lost_tells_destination);
    tcase_add_test(tc, relay_unreach_from_route_only);
    tcase_add_test(tc, relay_gone_releases_credit);
    tcase_add_test(tc, flow_numbered);
    tcase_add_test(tc, detour_received);
    tcase_add_test(tc, detour_forwarded);
    tcase_add_test(tc, detour_taken);
    tcase_add_test(tc, relay_moves_with_cable);
    tcase_add_test(tc, ring_cable_goes_round);
    tcase_add_test(tc, ring_detour_middle);
    tcase_add_test(tc, round_carries_no_round);
    tcase_add_test(tc, detour_short_fallback);
    tcase_add_test(tc, back_moves_flow);
    tcase_add_test(tc, neighbours_dialled);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
