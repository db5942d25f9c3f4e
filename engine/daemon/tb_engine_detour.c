/*
 * tbrdma host engine, daemon: going round a failed cable.
 *
 * When the channel over a cable fails because the cable broke or went dark,
 * the cable's own flow goes another way: over another cable to the same
 * host, else through the host of lowest index cabled to both ends; what the
 * channel handed back goes first (tb_engine_route.c carries it in relay
 * headers naming the cable, and takes it at the far end).  What the cable
 * carried for other hosts moves with it when the way round is another cable
 * to the same host, and ends otherwise (tb_eng_relay_lost).
 */
#include "tb_engine_int.h"

#include <stdio.h>
#include <string.h>
#include <sys/uio.h>

#include "tb_log.h"

void tb_eng_relay_unsent(eng_peer_t *q, const struct iovec *iov, int iovcnt, size_t len)
{
    eng_msg_t *m;
    size_t off = 0;

    if (NULL == iov || q->relay_unsent_lost
        || NULL == (m = tb_eng_msg_new(0, TB_ETAG_RELAY, 0, 0, NULL, 0, NULL, len))) {
        q->relay_unsent_lost = true;
        return;
    }
    for (int i = 0; i < iovcnt; ++i) {
        memcpy(m->data + off, iov[i].iov_base, iov[i].iov_len);
        off += iov[i].iov_len;
    }
    /* Held by no neighbour's count: at most what q's channel held. */
    m->kind = ENG_COOKIE_RELAY;
    m->link = ENG_MAX_PEERS;
    tb_eng_msg_append(&q->unsent_relay_head, &q->unsent_relay_tail, m);
}

void tb_eng_relay_unsent_drop(eng_peer_t *q)
{
    tb_eng_msg_free_all(&q->unsent_relay_head, &q->unsent_relay_tail);
    q->relay_unsent_lost = false;
}

/* p's cable failed and its own flow goes over another cable to the same
 * host, q: so does everything else that went over p, for the rest of the
 * job, to q or to where q's own moved before (which keeps each pair on one
 * cable at a time: moving to a cable restored meanwhile could overtake what
 * is still on its way).  What p's channel handed back goes first, then what
 * waited for it; the routed peers and detoured flows that went through p go
 * through the new cable, and send again only after those (fwd_hold).  The
 * ends drop by number what they had already (each message is numbered in
 * its own flow, end to end), and each keeps its order: one way in, one way
 * out.  False when p's channel could not hand back everything, or the new
 * cable is down: then what went over p ends (tb_eng_relay_lost, which sends
 * later traffic over a cable that stands, if one does). */
static bool relay_move(eng_peer_t *p, eng_peer_t *q, unsigned *moved)
{
    tb_engine_t *e = p->e;
    eng_peer_t *to = tb_eng_relay_end(q, p);
    unsigned n = 0;
    eng_msg_t *m;

    *moved = 0;
    if (p->relay_unsent_lost || to->via || ENG_PEER_FAILED == to->state
        || ENG_PEER_CLOSED == to->state) {
        return false;
    }
    tb_eng_relay_redirect(p, to);
    while ((m = tb_eng_msg_pop(&p->unsent_relay_head, &p->unsent_relay_tail))) {
        tb_eng_msg_append(&to->fwd_head, &to->fwd_tail, m);
        ++*moved;
    }
    while ((m = tb_eng_msg_pop(&p->fwd_head, &p->fwd_tail))) {
        tb_eng_msg_append(&to->fwd_head, &to->fwd_tail, m);
        ++*moved;
    }
    p->fwd_hold = 0;
    for (m = to->fwd_head; m; m = m->next) {
        ++n;
    }
    to->fwd_hold = n;
    for (unsigned i = 0; i < e->npeers; ++i) {
        eng_peer_t *x = e->peers[i];
        if (x != p && x->via == p) {
            x->via = to;
        }
    }
    (void) tb_eng_fwd_drain(to);
    return true;
}

/* The way round p's failed cable to host h: another cable to h, else one to
 * the lowest host cabled to both (its lowest cable), made and dialled if need
 * be; NULL when there is none. */
static eng_peer_t *way_round(tb_engine_t *e, eng_peer_t *p, unsigned h)
{
    const tb_topo_t *t = e->topo;

    for (int pass = 0; pass < 2; ++pass) {
        for (unsigned n = 0; n < t->nhosts; ++n) {
            if (n == e->me || (0 == pass) != (n == h) || (1 == pass && 1 != t->dist[n][h])) {
                continue;
            }
            for (unsigned dev = 0; dev < e->ndev; ++dev) {
                eng_peer_t *q;
                if (t->peer[e->me][dev] != n || (n == h && dev == p->dev)) {
                    continue;
                }
                q = tb_eng_peer_for(e, dev, t->host[n].id, false);
                if (q && (q->via || ENG_PEER_FAILED == q->state || ENG_PEER_CLOSED == q->state)) {
                    continue;
                }
                if (NULL != (q = tb_eng_neighbour(e, n, dev))
                    && ENG_PEER_FAILED != q->state && ENG_PEER_CLOSED != q->state) {
                    return q;
                }
            }
        }
    }
    return NULL;
}

bool tb_eng_peer_detour(eng_peer_t *p, int status, const char *why)
{
    tb_engine_t *e = p->e;
    const tb_topo_t *t = e->topo;
    char text[240];
    eng_peer_t *q;
    bool same_host;
    unsigned moved;
    int h;

    /* Only a cable that went dark or broke: a peer that closed, restarted or
     * broke the protocol is not helped by another way. */
    if (p->routed || p->via || p->lost_unsent || ENG_PEER_CONNECTED != p->state
        || (TB_CHAN_EPEERDEAD != status && TB_CHAN_ELINK != status) || NULL == t
        || (h = tb_topo_find(t, p->id)) < 0 || (unsigned) h == e->me
        || NULL == (q = way_round(e, p, (unsigned) h))) {
        return false;
    }
    p->via = q;
    p->host = (unsigned) h;
    for (unsigned tag = TB_ETAG_DATA; tag <= TB_ETAG_BACK; ++tag) {
        memset(&p->relay[tag], 0, sizeof(p->relay[tag]));
        p->relay[tag].digest = tb_wire_le32(t->digest);
        p->relay[tag].src_host = tb_wire_le16((uint16_t) e->me);
        p->relay[tag].dst_host = tb_wire_le16((uint16_t) h);
        p->relay[tag].tag = (uint8_t) tag;
        p->relay[tag].hops_left = (uint8_t) t->nhosts;
        p->relay[tag].flow = (uint8_t) (p->dev + 1);
    }
    same_host = 0 == memcmp(q->id, p->id, sizeof(p->id));
    TB_WARN("the cable %s (%s) to engine %02x%02x%02x%02x (host %d) failed: %s; its traffic "
            "goes round it from now on, %s engine %02x%02x%02x%02x over %s, %u message%s "
            "sent again",
            e->devs[p->dev].dev->name, e->devs[p->dev].dev->netdev, p->id[0], p->id[1], p->id[2],
            p->id[3], h, why, same_host ? "over another cable to" : "through",
            q->id[0], q->id[1], q->id[2], q->id[3], e->devs[q->dev].dev->name,
            p->nresend, 1 == p->nresend ? " is" : "s are");
    e->faults++;
    snprintf(text, sizeof(text), "%s over %s", why, e->devs[p->dev].dev->name);
    /* What went over it for other hosts moves to another cable to the same
     * host; it cannot go round through a third host (its routes would). */
    if (same_host && relay_move(p, q, &moved)) {
        TB_WARN("what the cable %s carried for other hosts goes over %s from now on, %u "
                "message%s sent again",
                e->devs[p->dev].dev->name, e->devs[p->relay_to->dev].dev->name, moved,
                1 == moved ? " is" : "s are");
    } else {
        tb_eng_relay_unsent_drop(p);
        tb_eng_relay_lost(p, text);
    }
    p->destroy = NULL != p->conn;
    p->credit_changed = true;
    p->ret_pending = true;
    tb_eng_back_arm(p, tb_now_ns());
    tb_eng_round_take(p);
    return true;
}
