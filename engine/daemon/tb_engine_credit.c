/*
 * tbrdma host engine, daemon: credit toward the ranks behind a peer engine
 * (a table of destinations per peer, of a fixed size whatever vpids the
 * ranks name), and the messages that wait for it: left in the sending
 * rank's ring, copied out only when the rank pins more than its share and
 * their destination's credit has stopped (ENG_UNPIN_AFTER_NS), and sent in
 * order per destination once credit comes.
 */
#include "tb_engine_int.h"

#include <stdlib.h>
#include <string.h>

static unsigned dst_hash(uint32_t vpid)
{
    return (unsigned) ((vpid * 2654435761u) >> 16) % ENG_DST_HASH;
}

/* Enter dst[i] in the hash (it has twice the slots of entries: one is free). */
static void dst_place(eng_peer_t *p, unsigned i)
{
    unsigned h = dst_hash(p->dst[i].vpid);

    while (p->dst_slot[h]) {
        h = (h + 1) % ENG_DST_HASH;
    }
    p->dst_slot[h] = (uint8_t) (i + 1);
}

/* Forget the destinations with nothing in flight or waiting (their credit
 * is all back): true if any went. */
static bool dst_reclaim(eng_peer_t *p)
{
    unsigned n = 0;

    for (unsigned i = 0; i < p->ndst; ++i) {
        if (p->dst[i].used || p->dst[i].nwait) {
            p->dst[n++] = p->dst[i];
        }
    }
    if (n == p->ndst) {
        return false;
    }
    p->ndst = n;
    memset(p->dst_slot, 0, sizeof(p->dst_slot));
    for (unsigned i = 0; i < n; ++i) {
        dst_place(p, i);
    }
    return true;
}

/* Rank vpid behind p; with adder >= 0 (the slot of the rank that sends to
 * it), added if it is not there yet.  NULL if it is not there, or cannot be
 * added: that rank named ENG_MAX_RANKS others already (no engine serves
 * more), or the table is full of destinations with credit out. */
eng_dst_t *tb_eng_dst_of(eng_peer_t *p, uint32_t vpid, int adder)
{
    unsigned h = dst_hash(vpid), mine = 0;
    eng_dst_t *d;

    for (unsigned k = 0; k < ENG_DST_HASH && p->dst_slot[h]; ++k, h = (h + 1) % ENG_DST_HASH) {
        d = &p->dst[p->dst_slot[h] - 1];
        if (d->vpid == vpid) {
            return d;
        }
    }
    if (adder < 0) {
        return NULL;
    }
    for (unsigned i = 0; i < p->ndst; ++i) {
        mine += p->dst[i].adder == (unsigned) adder;
    }
    if (mine >= ENG_MAX_RANKS || (ENG_DST_MAX == p->ndst && !dst_reclaim(p))) {
        return NULL;
    }
    d = &p->dst[p->ndst];
    memset(d, 0, sizeof(*d));
    d->vpid = vpid;
    d->adder = (uint8_t) adder;
    dst_place(p, p->ndst++);
    return d;
}

/* One message may always be in flight, whatever its size.  Credit counts
 * what a message costs the receiver (tb_ecredit_cost).  A routed peer's
 * destinations share a total too: it bounds what relays hold. */
bool tb_eng_credit_ok(const eng_peer_t *p, const eng_dst_t *d, size_t len)
{
    uint64_t cost = tb_ecredit_cost(len);

    if (tb_eng_peer_relayed(p) && 0 != p->used_total
        && p->used_total + cost > p->e->p.credit_window / ENG_ROUTED_WINDOW_SHARE) {
        return false;
    }
    return 0 == d->used || d->used + cost <= p->e->p.credit_window;
}

/* The rank whose ring holds m's payload (m->ref set). */
static eng_rank_t *r_of(const eng_msg_t *m)
{
    return m->ref->rank;
}

/* A waiting message goes: its ring space (if it was left there) is free. */
static void unhold(eng_msg_t *m)
{
    if (m->ref) {
        m->ref->rank->npinned--;
        tb_eng_tx_done(m->ref);
    }
    free(m);
}

/* The process a message waiting for credit is for (its header leads it). */
static uint32_t waiting_dst_pid(const eng_msg_t *m)
{
    tb_wire_emsg_t h;

    memcpy(&h, m->data, sizeof(h));
    return tb_wire_le32(h.dst_pid);
}

/* What waits for credit: all of it (dst NULL), or what is for the process
 * pid as rank *dst. */
void tb_eng_drop_waiting(eng_peer_t *p, const uint32_t *dst, uint32_t pid)
{
    eng_msg_t **pp = &p->wait_head, *m;

    p->wait_tail = NULL;
    while ((m = *pp)) {
        if (dst && (m->vpid != *dst || pid != waiting_dst_pid(m))) {
            p->wait_tail = m;
            pp = &m->next;
            continue;
        }
        *pp = m->next;
        if (m->src_slot >= 0) {
            p->e->ranks[m->src_slot].held_bytes -= ENG_MSG_COST(m->len);
        }
        /* Held only once its destination had its place (tb_eng_send). */
        tb_eng_dst_of(p, m->vpid, -1)->nwait--;
        unhold(m);
    }
}

/* Pinned beyond the shares of its ring and txq (ENG_REF_*). */
static bool over_share(const eng_rank_t *r)
{
    return r->txq_len >= ENG_REF_TXQ || r->tx.cursor - r->tx.tail >= r->tx.size / ENG_REF_RING_SHARE;
}

/* A message that must wait for credit (or its channel): left in the rank's
 * ring unless the rank pins beyond its share and d is starved (ENG_REF_*),
 * else copied out.  The record ending at end is consumed either way: 1 when
 * it stays pinned by a txq entry, 0 when the caller must mark it consumed. */
int tb_eng_hold(eng_peer_t *p, eng_dst_t *d, eng_rank_t *r, const tb_wire_emsg_t *h,
                const void *payload, size_t len, uint64_t end)
{
    uint32_t dst = tb_wire_le32(h->dst);
    uint64_t now = tb_now_ns();
    bool by_ref = !over_share(r) || !tb_eng_dst_starved(d, now);
    eng_msg_t *m = by_ref ? tb_eng_msg_new(0, h->tag, 0, dst, h, sizeof(*h), NULL, 0)
                          : tb_eng_msg_new(0, h->tag, 0, dst, h, sizeof(*h), payload, len);

    if (NULL == m) {
        tb_eng_rank_fail(r, "out of memory holding its message");
        return 0;
    }
    m->src_slot = (int) r->slot;
    if (by_ref) {
        m->ref = tb_eng_txq_push(r, end);
        m->payload = payload;
        m->len = sizeof(*h) + len;
        r->npinned++;
    } else {
        r->e->tx_copied += len;
    }
    tb_eng_msg_append(&p->wait_head, &p->wait_tail, m);
    if (0 == d->nwait) {
        d->moved_ns = now;
    }
    d->nwait++;
    p->credit_changed = true;
    r->held_bytes += ENG_MSG_COST(m->len);
    return by_ref;
}

/* Copies out r's pinned messages: all, or those whose destination is
 * starved at now. */
static void unpin(tb_engine_t *e, eng_rank_t *r, bool all, uint64_t now)
{
    for (unsigned i = 0; i < e->npeers && r->npinned; ++i) {
        eng_peer_t *p = e->peers[i];
        eng_msg_t **pp = &p->wait_head, *m, *c;

        while ((m = *pp)) {
            size_t len = m->len - sizeof(tb_wire_emsg_t);
            if (NULL == m->ref || m->ref->rank != r
                || (!all && !tb_eng_dst_starved(tb_eng_dst_of(p, m->vpid, -1), now))) {
                pp = &m->next;
                continue;
            }
            c = tb_eng_msg_new(0, m->tag, 0, m->vpid, m->data, sizeof(tb_wire_emsg_t), m->payload,
                               len);
            if (NULL == c) {
                /* Dropped, and the rank with it: its ring may be going. */
                *pp = m->next;
                if (p->wait_tail == m) {
                    p->wait_tail = NULL;
                    for (eng_msg_t *t = p->wait_head; t; t = t->next) {
                        p->wait_tail = t;
                    }
                }
                tb_eng_dst_of(p, m->vpid, -1)->nwait--;
                if (m->src_slot >= 0) {
                    e->ranks[m->src_slot].held_bytes -= ENG_MSG_COST(m->len);
                }
                unhold(m);
                tb_eng_rank_fail(r, "out of memory holding its message");
                continue;
            }
            c->src_slot = m->src_slot;
            c->next = m->next;
            *pp = c;
            if (p->wait_tail == m) {
                p->wait_tail = c;
            }
            e->tx_copied += len;
            unhold(m);
            pp = &c->next;
        }
    }
}

void tb_eng_peers_unpin(tb_engine_t *e, eng_rank_t *r)
{
    unpin(e, r, true, 0);
}

/* Looked for at most every quarter of ENG_UNPIN_AFTER_NS: the walk is of
 * every peer's waiting list. */
void tb_eng_peers_unpin_starved(tb_engine_t *e, eng_rank_t *r)
{
    uint64_t now;

    if (0 == r->npinned || !over_share(r) || (now = tb_now_ns()) < r->unpin_check_ns) {
        return;
    }
    r->unpin_check_ns = now + ENG_UNPIN_AFTER_NS / 4;
    unpin(e, r, false, now);
}

/* What waited for credit, in order per destination. */
int tb_eng_send_waiting(eng_peer_t *p)
{
    tb_channel_t *ch = tb_eng_peer_channel(p);
    eng_msg_t **pp = &p->wait_head, *m, *prev = NULL;
    size_t taken = 0;
    int n = 0, rc, src;

    if (NULL == ch || NULL == p->wait_head || !p->credit_changed ||
        ENG_PEER_CONNECTED != p->state || NULL != p->resend_head) {
        return 0;
    }
    p->credit_changed = false;
    p->scan_gen++;
    while ((m = *pp)) {
        eng_dst_t *d = tb_eng_dst_of(p, m->vpid, -1);
        size_t len = m->len - sizeof(tb_wire_emsg_t);
        /* m is the send's cookie unless it is from the ring: a send that
         * fails the channel at once frees it, so what is read after comes
         * from here. */
        bool from_ring = NULL != m->ref;
        eng_rank_t *ring_rank = from_ring ? r_of(m) : NULL;
        if (taken >= ENG_TX_SHARE) {
            /* The rest in the next pass (see rank_tx_progress). */
            p->credit_changed = true;
            break;
        }
        if (d->blocked == p->scan_gen || !tb_eng_credit_ok(p, d, len)) {
            d->blocked = p->scan_gen;
            prev = m;
            pp = &m->next;
            continue;
        }
        /* Out of the list before the send: a send that fails the channel
         * drops whatever is still listed. */
        *pp = m->next;
        if (p->wait_tail == m) {
            p->wait_tail = prev;
        }
        d->nwait--;
        src = m->src_slot;
        if (src >= 0) {
            p->e->ranks[src].held_bytes -= ENG_MSG_COST(m->len);
        }
        m->src_slot = -1;
        if (from_ring) {
            /* From the ring: the header where the channel reads it until
             * the send completes (the ring entry's), the payload in place. */
            struct iovec iov[2] = {{&m->ref->hdr, sizeof(tb_wire_emsg_t)},
                                   {(void *) m->payload, len}};
            memcpy(&m->ref->hdr, m->data, sizeof(tb_wire_emsg_t));
            tb_eng_seq_put(p, &m->ref->hdr);
            rc = tb_eng_peer_sendv(p, ch, TB_ETAG_DATA, iov, 2, m->ref);
        } else {
            struct iovec iov = {m->data, m->len};
            tb_eng_seq_put(p, m->data);
            rc = tb_eng_peer_sendv(p, ch, TB_ETAG_DATA, &iov, 1, m);
        }
        if (TB_CHAN_OK == rc) {
            tb_eng_seq_sent(p);
        }
        if (ENG_PEER_CONNECTED != p->state) {
            /* Failed meanwhile: the list is gone; m is the channel's if it
             * took it (freed at its completion), else ours. */
            if (TB_CHAN_OK != rc) {
                unhold(m);
            } else if (from_ring) {
                ring_rank->npinned--;
                free(m);
            }
            return n;
        }
        if (TB_CHAN_OK != rc) {
            /* The channel is full: back in its place, try again later. */
            m->next = *pp;
            *pp = m;
            if (NULL == m->next) {
                p->wait_tail = m;
            }
            d->nwait++;
            m->src_slot = src;
            if (src >= 0) {
                p->e->ranks[src].held_bytes += ENG_MSG_COST(m->len);
            }
            p->credit_changed = true;
            break;
        }
        tb_eng_credit_take(p, d, len);
        p->e->tx_bytes += len;
        p->e->tx_copied += len;
        if (from_ring) {
            ring_rank->npinned--;
            free(m); /* the channel has the ring entry as its cookie */
        }
        taken += len;
        ++n;
    }
    return n;
}
