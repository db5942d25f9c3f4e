/*
 * Fuzz target: the host engine driven by hostile ranks and peer engines, on
 * an engine assembled in memory (engine_harness.h).  Each step is one of:
 * a rank writes a record (SEND, ROUTE, BYE, or an unknown type) into its
 * ring, a peer engine sends a message (any tag, header and payload), a peer
 * engine's message is placed in a rank's ring as its channel would (begun,
 * another peer's message meanwhile, then finished or its channel gone), a
 * rank reads what the engine wrote it, a peer's cable fails (what its channel
 * hands back, then the way round it, or the peer fails), or the engine makes
 * a pass.  The job's table is a line of three or a ring of four (where failed
 * cables go round through other hosts).  After every
 * step the bounds on what the engine holds are checked (eh_check): the
 * sanitizers find memory faults, the check finds memory that grows.
 *
 * Input: a byte choosing the table, then steps, each an opcode byte and its
 * operands (see below).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine_harness.h"
#include "fuzz_common.h"

#define PEERS 2

/* The peers a step may pick: peers 1 and 2 over device 0 on the line; on
 * the ring, this engine's two neighbours, peers 1 and 3. */
static eng_peer_t *peers[PEERS];
static bool ring;

static void rank_writes(eng_harness_t *h, fuzz_in_t *in)
{
    static const uint8_t types[] = {TB_EREC_SEND, TB_EREC_ROUTE, TB_EREC_BYE, TB_EREC_HOSTS, 0x7f};
    unsigned i = fuzz_u8(in) % EH_RANKS;
    uint8_t type = types[fuzz_u8(in) % sizeof(types)];
    uint8_t tag = fuzz_u8(in);
    uint16_t link = fuzz_u16(in) % 8;
    uint32_t vpid = fuzz_u8(in);
    bool right_pid = 0 != (fuzz_u8(in) & 7); /* mostly, so messages flow */
    uint8_t buf[512];
    size_t len = fuzz_u16(in) % sizeof(buf);

    if (TB_EREC_ROUTE == type) {
        tb_wire_eroute_t rt;
        /* A route to a rank of this host, to a peer of the harness, or to
         * an engine nobody knows. */
        len = fuzz_bytes(in, &rt, sizeof(rt)) == sizeof(rt) ? sizeof(rt) : len;
        switch (rt.reserved3 % 3) {
        case 0:
            memcpy(rt.engine_id, h->e->id, sizeof(rt.engine_id));
            break;
        case 1:
            memcpy(rt.engine_id, peers[rt.reserved2 % PEERS]->id, sizeof(rt.engine_id));
            break;
        default:
            break;
        }
        rt.reserved3 = 0;
        rt.reserved2 = 0;
        rt.dev %= 2;
        memcpy(buf, &rt, sizeof(rt));
    } else if (TB_EREC_HOSTS == type && (fuzz_u8(in) & 1)) {
        /* Mostly the job's true table, so that routes and relaying run. */
        if (ring) {
            eh_ring_table(h);
            len = sizeof(h->ring_table);
            memcpy(buf, h->ring_table, len);
        } else {
            eh_relay_table(h);
            len = sizeof(h->relay_table);
            memcpy(buf, h->relay_table, len);
        }
    } else {
        (void) fuzz_bytes(in, buf, len);
    }
    (void) eh_rank_write(h, i, type, tag, link, vpid, right_pid, buf, len);
}

/* A peer's message as it comes off a cable: tag, then header and payload in
 * buf; its length. */
static size_t peer_message(fuzz_in_t *in, const eng_peer_t *p, uint8_t *tag_out, uint8_t *buf)
{
    uint8_t tag = fuzz_u8(in) % (TB_ETAG_BACK_OK + 1);
    tb_wire_emsg_t m;
    size_t len = fuzz_u16(in) % 512;

    (void) fuzz_bytes(in, &m, sizeof(m));
    /* Mostly well-formed, so the checks behind the parser are reached. */
    if (fuzz_u8(in) & 1) {
        memset(m.reserved, 0, sizeof(m.reserved));
        m.flags &= TB_EMSG_F_HOST;
        m.dst = tb_wire_le32(tb_wire_le32(m.dst) % (EH_RANKS + 1));
        if (TB_ETAG_CREDIT != tag) {
            m.credit = 0;
        }
        m.src_pid = TB_ETAG_CREDIT == tag ? 0 : tb_wire_le32(EH_PID(tb_wire_le32(m.src)));
        m.dst_pid = TB_ETAG_DATA == tag ? tb_wire_le32(EH_PID(tb_wire_le32(m.dst))) : 0;
        m.reserved2 = 0;
        /* Its flow's next number, now and then one it had already. */
        m.seq = tb_wire_le32(p->rx_seq - (0 == (fuzz_u8(in) & 7)));
        if (TB_ETAG_BACK == tag || TB_ETAG_BACK_OK == tag) {
            /* src and dst: its try, as they came. */
            m.src_pid = m.dst_pid = 0;
            m.tag = 0;
            m.flags = 0;
        }
    }
    memcpy(buf, &m, sizeof(m));
    len = TB_ETAG_CREDIT == tag || TB_ETAG_BACK == tag || TB_ETAG_BACK_OK == tag ? 0 : len;
    (void) fuzz_bytes(in, buf + sizeof(m), len);
    *tag_out = tag;
    if (TB_ETAG_RELAY == tag && (fuzz_u8(in) & 1)) {
        /* A relay header with the table's digest and hosts in it, often a
         * failed cable's flow, in front of the message, so that the checks
         * on routes and ways round are reached. */
        tb_wire_erelay_t rh;
        size_t total = sizeof(m) + len;
        memset(&rh, 0, sizeof(rh));
        rh.digest = tb_wire_le32(p->e->topo ? p->e->topo->digest : 0);
        rh.src_host = tb_wire_le16(fuzz_u8(in) % 5);
        rh.dst_host = tb_wire_le16(fuzz_u8(in) % 5);
        rh.tag = (uint8_t) (TB_ETAG_DATA + fuzz_u8(in) % TB_ETAG_BACK);
        rh.hops_left = fuzz_u8(in) % 5;
        rh.flow = fuzz_u8(in) % 3;
        total = total + sizeof(rh) > sizeof(tb_wire_emsg_t) + 512 ? total - sizeof(rh) : total;
        memmove(buf + sizeof(rh), buf, total);
        memcpy(buf, &rh, sizeof(rh));
        return total + sizeof(rh);
    }
    return sizeof(m) + len;
}

static void peer_sends(eng_harness_t *h, fuzz_in_t *in)
{
    eng_peer_t *p = peers[fuzz_u8(in) % PEERS];
    uint8_t buf[sizeof(tb_wire_emsg_t) + 512], tag;
    size_t len = peer_message(in, p, &tag, buf);

    if (ENG_PEER_CONNECTED == p->state) {
        tb_eng_peer_recv(p, tag, buf, len);
    }
}

static void peer_places(eng_harness_t *h, fuzz_in_t *in)
{
    unsigned n = fuzz_u8(in) % PEERS;
    eng_peer_t *p = peers[n], *other = peers[(n + 1) % PEERS];
    uint8_t buf[sizeof(tb_wire_emsg_t) + 512], tag, *at;
    size_t len = peer_message(in, p, &tag, buf), skip = 0;
    uint8_t head[TB_CHAN_PLACE_HEAD];
    size_t head_len = len < sizeof(head) ? len : sizeof(head);

    if (ENG_PEER_CONNECTED != p->state) {
        return;
    }
    memcpy(head, buf, head_len);
    at = tb_eng_peer_recv_place(p, tag, len, head, head_len, &skip);
    if (NULL == at) {
        tb_eng_peer_recv(p, tag, buf, len);
        return;
    }
    FUZZ_ASSERT(skip <= head_len, "skip %zu beyond the head's %zu bytes", skip, head_len);
    memcpy(at, buf + skip, len - skip);
    if (ENG_PEER_CONNECTED == other->state && (fuzz_u8(in) & 1)) {
        uint8_t obuf[sizeof(tb_wire_emsg_t) + 512], otag;
        size_t olen = peer_message(in, other, &otag, obuf);
        tb_eng_peer_recv(other, otag, obuf, olen);
    }
    if (fuzz_u8(in) & 3) {
        tb_eng_peer_recv_placed(p, tag, head, skip, len);
    } else {
        tb_eng_place_release(p);
    }
}

/* A peer's cable fails as its channel says: it hands back messages the far
 * end may not have (relayed ones, as the engine sent them on), then the
 * engine goes round the cable or fails the peer. */
static void cable_fails(fuzz_in_t *in)
{
    eng_peer_t *p = peers[fuzz_u8(in) % PEERS];
    unsigned n = fuzz_u8(in) % 4;
    uint8_t buf[sizeof(tb_wire_emsg_t) + 512 + sizeof(tb_wire_erelay_t)], tag;

    if (ENG_PEER_CONNECTED != p->state) {
        return;
    }
    while (n--) {
        struct iovec iov = {.iov_base = buf};
        iov.iov_len = peer_message(in, p, &tag, buf);
        tb_eng_relay_unsent(p, &iov, 1, iov.iov_len);
    }
    if (!tb_eng_peer_detour(p, fuzz_u8(in) & 1 ? TB_CHAN_ELINK : TB_CHAN_EPEERDEAD, "fuzz")) {
        tb_eng_peer_fail(p, TB_CHAN_ELINK, "fuzz: the cable failed");
    }
    tb_eng_relay_unsent_drop(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    eng_harness_t h;
    fuzz_in_t in;
    const char *broken;

    if (!quiet) {
        tb_log_set_sink(fuzz_log_sink, NULL, TB_LOG_TRACE);
        quiet = 1;
    }
    FUZZ_ASSERT(0 == eh_init(&h), "the harness could not be set up");
    fuzz_in_init(&in, data, size);
    ring = fuzz_u8(&in) & 1;
    if (ring) {
        eh_ring_table(&h);
        peers[0] = eh_peer_on(&h, 1, 0);
        peers[1] = eh_peer_on(&h, 3, 1);
    } else {
        peers[0] = eh_peer(&h, 1);
        peers[1] = eh_peer(&h, 2);
    }
    for (unsigned step = 0; in.left > 0 && step < 2000; ++step) {
        uint8_t op = fuzz_u8(&in);
        unsigned n;
        switch (op % 6) {
        case 0:
            rank_writes(&h, &in);
            break;
        case 1:
            peer_sends(&h, &in);
            break;
        case 4:
            peer_places(&h, &in);
            break;
        case 5:
            cable_fails(&in);
            break;
        case 2:
            n = fuzz_u8(&in);
            (void) eh_rank_read(&h, n % EH_RANKS, 1 + n / EH_RANKS, 0, NULL);
            break;
        default:
            n = 1 + fuzz_u8(&in) % 4;
            while (n--) {
                eh_progress(&h);
            }
            break;
        }
        broken = eh_check(&h);
        FUZZ_ASSERT(NULL == broken, "%s", broken);
    }
    eh_fini(&h);
    return 0;
}
