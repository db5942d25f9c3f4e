/*
 * tbrdma host engine, daemon: going round a failed cable.
 *
 * When the channel over a cable fails because the cable broke or went dark,
 * the cable's own flow goes another way: over another cable to the same
 * host, else along the cable's way round through other hosts, the same on
 * every engine (tb_topo_detour); what the channel handed back goes first
 * (tb_engine_route.c carries it in relay headers naming the cable, and takes
 * it at the far end; every host on the way checks it came from the one
 * before).  What the cable carried for other hosts moves with it: to the
 * other cable, or round the same way behind the flow's header.  When the way
 * round is cut too, the engines beside the cut tell the ends on their side
 * (tb_eng_detour_lost), and those pairs end.
 */
#include "tb_engine_int.h"

#include <stdio.h>
#include <stdlib.h>
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

/* ---- the ways round the job's cables ------------------------------------- */

static const eng_detour_t *detour_of(const tb_engine_t *e, unsigned h, unsigned k)
{
    const eng_detour_t *w;

    if (NULL == e->detours || h >= e->topo->nhosts || k >= TB_TOPO_MAX_DEVS) {
        return NULL;
    }
    w = &e->detours[h * TB_TOPO_MAX_DEVS + k];
    return w->len ? w : NULL;
}

static int detour_pos(const eng_detour_t *w, unsigned host)
{
    for (unsigned i = 0; i < w->len; ++i) {
        if (w->host[i] == host) {
            return (int) i;
        }
    }
    return -1;
}

/* +1 when way w goes from its low end toward to, -1 the other way. */
static int detour_dir(const eng_detour_t *w, unsigned to)
{
    return w->host[w->len - 1] == to ? 1 : -1;
}

int tb_eng_detour_next(const tb_engine_t *e, unsigned h, unsigned k, unsigned at, unsigned to)
{
    const eng_detour_t *w = detour_of(e, h, k);
    int i = w ? detour_pos(w, at) : -1;

    if (i < 0 || at == to || (w->host[0] != to && w->host[w->len - 1] != to)) {
        return -1;
    }
    return w->host[i + detour_dir(w, to)];
}

int tb_eng_detours_index(tb_engine_t *e)
{
    const tb_topo_t *t = e->topo;
    uint32_t (*over)[TB_TOPO_MAX_DEVS];

    e->detours = calloc((size_t) TB_TOPO_MAX_HOSTS * TB_TOPO_MAX_DEVS, sizeof(*e->detours));
    over = calloc(TB_TOPO_MAX_HOSTS, sizeof(*over));
    if (NULL == e->detours || NULL == over) {
        free(over);
        free(e->detours);
        e->detours = NULL;
        return -1;
    }
    /* How many pairs' routes take each cable, by its host and device. */
    for (unsigned s = 0; s < t->nhosts; ++s) {
        for (unsigned d = 0; d < t->nhosts; ++d) {
            unsigned at = s, dev;
            int next;
            while (s != d && at != d && (next = tb_topo_next_hop(t, at, d, &dev)) >= 0) {
                over[at][dev]++;
                at = (unsigned) next;
            }
        }
    }
    memset(e->detour_pairs_from, 0, sizeof(e->detour_pairs_from));
    /* Each cable of a neighbour nh to a host d cabled to this one too may
     * fail and go round through here in two hops (ENG_ROUND_SHORT). */
    for (unsigned nh = 0; nh < t->nhosts; ++nh) {
        for (unsigned k = 0; nh != e->me && 1 == t->dist[e->me][nh] && k < t->host[nh].ndev;
             ++k) {
            unsigned d = t->peer[nh][k];
            if (TB_TOPO_NONE != d && d != e->me && 1 == t->dist[e->me][d]) {
                e->detour_pairs_from[nh]++;
                e->relay_pairs_from[nh] += over[nh][k];
            }
        }
    }
    for (unsigned h = 0; h < t->nhosts; ++h) {
        for (unsigned k = 0; k < t->host[h].ndev; ++k) {
            eng_detour_t *w = &e->detours[h * TB_TOPO_MAX_DEVS + k];
            int i, prev;
            w->len = (uint8_t) tb_topo_detour(t, h, k, w->host);
            i = w->len ? detour_pos(w, e->me) : -1;
            if (i <= 0 || i >= w->len - 1) {
                continue;
            }
            /* Through here, h's flow over it and what it carries for others
             * come from the host before this one on the way from h. */
            prev = w->host[i - detour_dir(w, t->peer[h][k])];
            e->detour_pairs_from[prev]++;
            e->relay_pairs_from[prev] += over[h][k];
        }
    }
    free(over);
    return 0;
}

int tb_eng_detour_ok(const tb_engine_t *e, const tb_wire_erelay_t *rh, int nh)
{
    const tb_topo_t *t = e->topo;
    unsigned src = tb_wire_le16(rh->src_host), dst = tb_wire_le16(rh->dst_host);
    unsigned cable = rh->flow - 1u;
    const eng_detour_t *w;
    int i, j;

    if (src >= t->nhosts || dst >= t->nhosts || cable >= t->host[src].ndev
        || t->peer[src][cable] != dst || nh < 0) {
        return 0;
    }
    if (NULL != (w = detour_of(e, src, cable))) {
        i = detour_pos(w, e->me);
        j = detour_pos(w, (unsigned) nh);
        if (i >= 0 && j >= 0 && j + detour_dir(w, dst) == i) {
            return ENG_ROUND_WAY;
        }
    }
    if (dst == e->me ? (unsigned) nh != src && 1 == t->dist[src][nh]
                     : (unsigned) nh == src && 1 == t->dist[e->me][dst]) {
        return ENG_ROUND_SHORT;
    }
    return 0;
}

bool tb_eng_detour_other_cable(const tb_engine_t *e, unsigned h, unsigned k)
{
    const eng_detour_t *w = detour_of(e, h, k);

    return w && 2 == w->len;
}

/* Tell host to, an end of the cable of host s's device k, that its way
 * round is cut here: in the flow of the cable's other end toward it. */
static void detour_tell(tb_engine_t *e, unsigned s, unsigned k, unsigned to, const char *why)
{
    const tb_topo_t *t = e->topo;
    unsigned other = to == s ? t->peer[s][k] : s;
    unsigned other_dev = to == s ? t->peer_dev[s][k] : k;

    tb_eng_notice_send(e, other, to, other_dev + 1, e->me, why);
}

void tb_eng_detour_cut(tb_engine_t *e, unsigned s, unsigned k, const char *why)
{
    if (s >= e->topo->nhosts || k >= TB_TOPO_MAX_DEVS || e->detour_told[s][k]) {
        return;
    }
    e->detour_told[s][k] = 1;
    detour_tell(e, s, k, s, why);
}

void tb_eng_detour_lost(tb_engine_t *e, unsigned qh, const char *why)
{
    const tb_topo_t *t = e->topo;

    for (unsigned s = 0; s < t->nhosts; ++s) {
        for (unsigned k = 0; k < t->host[s].ndev; ++k) {
            const eng_detour_t *w = e->detour_seen[s][k] ? detour_of(e, s, k) : NULL;
            unsigned d = t->peer[s][k];
            int i = w ? detour_pos(w, e->me) : -1, dir;
            if (i <= 0 || i >= w->len - 1) {
                continue;
            }
            /* The end on this side of the lost hop hears it; the other
             * end hears it from the engine on its side. */
            dir = detour_dir(w, d);
            if (w->host[i + dir] == qh) {
                e->detour_seen[s][k] = 0;
                tb_eng_detour_cut(e, s, k, why);
            } else if (w->host[i - dir] == qh) {
                e->detour_seen[s][k] = 0;
                detour_tell(e, s, k, d, why);
            }
        }
    }
}

/* m, a relayed message, is another failed cable's traffic going round it:
 * it does not go round a second one. */
static bool round_traffic(const eng_msg_t *m)
{
    tb_wire_erelay_t rh;

    if (m->len < sizeof(rh)) {
        return true;
    }
    memcpy(&rh, m->data, sizeof(rh));
    return 0 != rh.flow;
}

static void tunnel_take(eng_peer_t *p, eng_msg_t *m, eng_msg_t **head, eng_msg_t **tail,
                        unsigned *moved)
{
    if (round_traffic(m)) {
        tb_eng_relay_done(p->e, m);
        return;
    }
    tb_eng_msg_append(head, tail, m);
    ++*moved;
}

/* p's cable failed and its way round goes through other hosts: what it
 * carried for them goes round it too, in its flow's relay headers (fwd,
 * drained by tb_eng_fwd_drain), what its channel handed back first; the
 * routed peers that went through it send again after those (fwd_hold).  The
 * far end takes them as come over the cable (tb_eng_round_take).  False
 * when the channel could not hand back everything. */
static bool tunnel_start(eng_peer_t *p, unsigned h, const char *why, unsigned *moved)
{
    eng_msg_t *head = NULL, *tail = NULL, *m;

    *moved = 0;
    if (p->relay_unsent_lost) {
        return false;
    }
    while ((m = tb_eng_msg_pop(&p->unsent_relay_head, &p->unsent_relay_tail))) {
        tunnel_take(p, m, &head, &tail, moved);
    }
    while ((m = tb_eng_msg_pop(&p->fwd_head, &p->fwd_tail))) {
        tunnel_take(p, m, &head, &tail, moved);
    }
    /* Other failed cables' flows that came round through here over p's
     * cable: their ends hear it (those on this side, from here). */
    tb_eng_detour_lost(p->e, h, why);
    p->fwd_head = head;
    p->fwd_tail = tail;
    p->fwd_hold = *moved;
    p->tunnel = true;
    (void) tb_eng_fwd_drain(p);
    return true;
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

/* The way round p's failed cable to host h: another cable to h, else the
 * first hop of the cable's way round through other hosts (tb_topo_detour,
 * which every engine on it follows), else (that hop's cables are down too)
 * the lowest host cabled to both ends, in two hops; over this engine's
 * lowest cable there that works, made and dialled if need be; NULL when
 * there is none.  Its hops in *hops. */
static eng_peer_t *way_round(tb_engine_t *e, eng_peer_t *p, unsigned h, unsigned *hops)
{
    const tb_topo_t *t = e->topo;
    const eng_detour_t *w = detour_of(e, e->me, p->dev);
    int first = tb_eng_detour_next(e, e->me, p->dev, e->me, h);

    for (int pass = 0; pass < 3; ++pass) {
        *hops = 0 == pass ? 1 : 1 == pass && w ? w->len - 1u : 2;
        for (unsigned n = 0; n < t->nhosts; ++n) {
            if (n == e->me || (0 == pass) != (n == h) || (1 == pass && (int) n != first)
                || (2 == pass && 1 != t->dist[n][h])) {
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
    unsigned moved, hops;
    int h;

    /* Only a cable that went dark or broke: a peer that closed, restarted or
     * broke the protocol is not helped by another way. */
    if (p->routed || p->via || p->lost_unsent || ENG_PEER_CONNECTED != p->state
        || (TB_CHAN_EPEERDEAD != status && TB_CHAN_ELINK != status) || NULL == t
        || (h = tb_topo_find(t, p->id)) < 0 || (unsigned) h == e->me
        || NULL == (q = way_round(e, p, (unsigned) h, &hops))) {
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
            "goes round it from now on, %s engine %02x%02x%02x%02x over %s (%u hop%s), %u "
            "message%s sent again",
            e->devs[p->dev].dev->name, e->devs[p->dev].dev->netdev, p->id[0], p->id[1], p->id[2],
            p->id[3], h, why, same_host ? "over another cable to" : "through",
            q->id[0], q->id[1], q->id[2], q->id[3], e->devs[q->dev].dev->name,
            hops, 1 == hops ? "" : "s", p->nresend,
            1 == p->nresend ? " is" : "s are");
    e->faults++;
    snprintf(text, sizeof(text), "%s over %s", why, e->devs[p->dev].dev->name);
    /* What went over it for other hosts moves to another cable to the same
     * host, or goes round with its flow. */
    if (same_host && relay_move(p, q, &moved)) {
        TB_WARN("what the cable %s carried for other hosts goes over %s from now on, %u "
                "message%s sent again",
                e->devs[p->dev].dev->name, e->devs[p->relay_to->dev].dev->name, moved,
                1 == moved ? " is" : "s are");
    } else if (!same_host && tunnel_start(p, (unsigned) h, text, &moved)) {
        TB_WARN("what the cable %s carried for other hosts follows its flow round it, %u "
                "message%s sent again",
                e->devs[p->dev].dev->name, moved, 1 == moved ? " is" : "s are");
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
