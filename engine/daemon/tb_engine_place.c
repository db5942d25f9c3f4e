/*
 * tbrdma host engine, daemon: a peer engine's message written straight into
 * the destination rank's ring.
 *
 * A message of more than one frame would otherwise be assembled by the
 * channel in memory of its own and copied again into the ring: two copies of
 * every byte on the receiving side.  Placed, the channel copies each
 * fragment from its receive slot into a record reserved in the rank's ring,
 * and the record is published once the message is whole: one copy.
 *
 * While a record is reserved nothing else may be written to that ring (it
 * takes one reservation at a time, and records are read in order), so what
 * else arrives for the rank meanwhile waits in its overflow, in order, as
 * for a full ring.  That keeps each peer's order because the channel asks
 * to place only the message due next from it (tb_channel.h): one further
 * along would be published before an earlier one that went to the overflow.
 * A message is placed only when it would be delivered as
 * it is (a rank of this host that is the process the sender named, within
 * the credit window) and the ring has room; anything else takes the
 * ordinary path (tb_eng_peer_recv), which reports or drops it.  The
 * reservation outlives a failure of the peer until its channel is
 * destroyed (the channel may write until then), and the rank's memory
 * outlives the reservation (tb_engine.c frees a rank only once it is gone).
 */
#include "tb_engine_int.h"

#include <string.h>

#include "tb_emsg.h"

void *tb_eng_peer_recv_place(eng_peer_t *p, uint8_t tag, size_t len, const void *head,
                             size_t head_len, size_t *skip)
{
    tb_engine_t *e = p->e;
    tb_wire_emsg_t h;
    tb_wire_erec_t *rec;
    const char *fault;
    eng_rank_t *r;
    size_t plen;

    /* Only its flow's next message (a duplicate, or one out of sequence,
     * takes the ordinary path, which drops or reports it). */
    if (TB_ETAG_DATA != tag || head_len < sizeof(h) ||
        0 != tb_emsg_parse(tag, head, len, &h, &fault) || tb_wire_le32(h.seq) != p->rx_seq) {
        return NULL;
    }
    plen = len - sizeof(h);
    r = tb_eng_find_rank(e, tb_wire_le32(h.dst));
    if (NULL == r || NULL != r->placing || !tb_eng_rank_is(r, tb_wire_le32(h.dst_pid)) ||
        !tb_eng_window_ok(p, r, plen)) {
        return NULL;
    }
    /* Its PEER record first, as for a message delivered whole. */
    tb_eng_rank_announce(r, p);
    if (NULL != r->ovf_head || ENG_RANK_ATTACHED != r->state ||
        NULL == (rec = tb_shm_ring_reserve(&r->rx, plen))) {
        return NULL;
    }
    rec->type = TB_EREC_RECV;
    rec->tag = h.tag;
    rec->link = tb_wire_le16(tb_eng_recv_link(p, &h));
    rec->vpid = h.src;
    rec->pid = h.src_pid;
    r->placing = p;
    *skip = sizeof(h);
    return rec + 1;
}

/* The rank whose ring holds p's message to vpid, if it is still placing one. */
static eng_rank_t *placing_rank(eng_peer_t *p, uint32_t vpid)
{
    tb_engine_t *e = p->e;

    for (unsigned i = 0; i < e->rank_hwm; ++i) {
        eng_rank_t *r = &e->ranks[i];
        if (r->placing == p && r->vpid == vpid) {
            return r;
        }
    }
    return NULL;
}

void tb_eng_peer_recv_placed(eng_peer_t *p, uint8_t tag, const void *head, size_t skip, size_t len)
{
    tb_engine_t *e = p->e;
    size_t plen = len - sizeof(tb_wire_emsg_t);
    tb_wire_emsg_t h;
    eng_rank_t *r;

    /* Only what tb_eng_peer_recv_place accepted comes here, with its header. */
    (void) tag;
    if (skip != sizeof(h)) {
        return;
    }
    memcpy(&h, head, sizeof(h));
    r = placing_rank(p, tb_wire_le32(h.dst));
    if (NULL == r) {
        /* Released: its channel is going, and it is not delivered (its
         * sender sends it again another way, or fails). */
        return;
    }
    r->placing = NULL;
    if (tb_wire_le32(h.seq) != p->rx_seq) {
        /* It came meanwhile another way (its sender went round a cable it
         * thought failed): this copy goes. */
        p->dups++;
        tb_shm_ring_cancel(&r->rx);
        return;
    }
    p->rx_seq++;
    e->rx_msgs++;
    if (ENG_RANK_ATTACHED != r->state) {
        /* It left or died meanwhile; its senders learn it from GONE. */
        tb_shm_ring_cancel(&r->rx);
        return;
    }
    p->delivered[r->slot] += tb_ecredit_cost(plen);
    e->rx_bytes += plen; /* its one copy is the channel's (bytes_placed) */
    (void) tb_shm_ring_commit(&r->rx);
    tb_eng_rank_received(r, (uint16_t) p->idx, plen);
}

void tb_eng_place_release(eng_peer_t *p)
{
    tb_engine_t *e = p->e;

    for (unsigned i = 0; i < e->rank_hwm; ++i) {
        eng_rank_t *r = &e->ranks[i];
        if (r->placing == p) {
            tb_shm_ring_cancel(&r->rx);
            r->placing = NULL;
        }
    }
}
