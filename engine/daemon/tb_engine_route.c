/*
 * tbrdma host engine, daemon: routes to hosts no cable of this host reaches,
 * and relaying for other hosts.
 *
 * The ranks give their engine the job's table of hosts (TB_EREC_HOSTS, from
 * the modex, alike on every host); common/tb_topology.h turns it into the
 * cabling and its shortest routes, the same on every engine.  A rank that
 * sends to a host no cable reaches names that host's engine in a routed
 * route: the engine makes a routed peer, an eng_peer_t with no channel of its
 * own, whose messages go over the channel to the next host on the route
 * behind a relay header (TB_ETAG_RELAY).  Everything else about a peer
 * (credit per destination rank, GONE, notices) holds end to end between the
 * two engines, so order between two ranks holds as on one channel: one route,
 * each hop in order.
 *
 * A relay forwards what is not for it to the next hop, copied into that
 * channel, or held in order while the channel has no room.  It never refuses
 * and never waits on anyone to take a message, so relays cannot wait on each
 * other round a ring (no cycle of buffers): what it can be asked to hold is
 * bounded at the source, where a routed peer keeps at most a share of the
 * credit window in flight (ENG_ROUTED_WINDOW_SHARE), and enforced here per
 * neighbour, for the pairs of hosts whose route comes through it
 * (ENG_RELAY_HOLD).
 *
 * Who sent a relayed message: its neighbour is authenticated by the
 * channel, and a message naming source host s is taken only from the
 * neighbour that s's route reaches this engine through.  A relay is trusted
 * with what it carries, as a router is, and can pass for no host whose route
 * does not run through it.
 *
 * When a relay loses the next hop, it tells the sources of what it carried
 * that way (TB_ETAG_UNREACH), and their ranks fail the endpoints concerned,
 * as for a cable of their own: no rank waits for a message that cannot come.
 */
#include "tb_engine_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "tb_ehosts.h"
#include "tb_log.h"

/* ---- the job's table ----------------------------------------------------- */

static bool came_by_route(const tb_engine_t *e, unsigned src, unsigned dst, int nh, int mydev);

/* Each pair's route walked once (at most 64 x 64 routes of at most 64 hops),
 * when the table comes: where it reaches this engine from (arrive_from,
 * arrive_dev), and for each neighbour how many pairs it may pass to this
 * engine to be forwarded, which bounds what this engine holds for it (the
 * ways round failed cables add theirs: tb_eng_detours_index). */
static void index_routes(tb_engine_t *e)
{
    const tb_topo_t *t = e->topo;

    memset(e->relay_pairs_from, 0, sizeof(e->relay_pairs_from));
    memset(e->arrive_pairs_from, 0, sizeof(e->arrive_pairs_from));
    memset(e->arrive_from, 0, sizeof(e->arrive_from));
    memset(e->arrive_dev, 0, sizeof(e->arrive_dev));
    for (unsigned s = 0; s < t->nhosts; ++s) {
        for (unsigned d = 0; d < t->nhosts; ++d) {
            unsigned at = s, prev = s, dev = 0, last_dev = 0;
            int next;
            if (s == d || s == e->me) {
                continue;
            }
            while (at != e->me && at != d) {
                if ((next = tb_topo_next_hop(t, at, d, &dev)) < 0) {
                    break;
                }
                prev = at;
                last_dev = dev;
                at = (unsigned) next;
            }
            if (at != e->me) {
                continue;
            }
            e->arrive_from[s][d] = (uint8_t) (prev + 1);
            e->arrive_dev[s][d] = t->peer_dev[prev][last_dev];
            e->arrive_pairs_from[prev]++;
            if (d != e->me) {
                e->relay_pairs_from[prev]++;
            }
        }
    }
}

static void log_routes(tb_engine_t *e)
{
    const tb_topo_t *t = e->topo;

    TB_INFO("the job's cabling: %u hosts; this engine is host %u", t->nhosts, e->me);
    for (unsigned h = 0; h < t->nhosts; ++h) {
        unsigned dev;
        int next = h == e->me ? -1 : tb_topo_next_hop(t, e->me, h, &dev);
        if (h == e->me) {
            continue;
        }
        if (next < 0) {
            TB_INFO("host %u (engine %02x%02x%02x%02x): no route", h, t->host[h].id[0],
                    t->host[h].id[1], t->host[h].id[2], t->host[h].id[3]);
        } else {
            TB_INFO("host %u (engine %02x%02x%02x%02x): %u hop%s, first to host %d over %s", h,
                    t->host[h].id[0], t->host[h].id[1], t->host[h].id[2], t->host[h].id[3],
                    t->dist[e->me][h], t->dist[e->me][h] == 1 ? "" : "s", next,
                    e->devs[dev].dev->name);
        }
    }
}

/* The table describes this engine's devices as they are. */
static bool table_has_me(const tb_engine_t *e, const tb_topo_t *t, int me)
{
    if (me < 0 || t->host[me].ndev != e->ndev) {
        return false;
    }
    for (unsigned d = 0; d < e->ndev; ++d) {
        if (t->host[me].dev[d].ipv4 != e->devs[d].dev->ipv4.s_addr
            || t->host[me].dev[d].netmask != e->devs[d].dev->netmask.s_addr) {
            return false;
        }
    }
    return true;
}

int tb_eng_topo_set(tb_engine_t *e, const void *payload, size_t len)
{
    size_t n = len / sizeof(tb_wire_ehost_t);
    tb_topo_t *t = NULL;
    const char *why = NULL;
    eng_msg_t *m;
    int me, built, rc = -1;

    if (0 == len || 0 != len % sizeof(tb_wire_ehost_t)
        || n > (size_t) TB_TOPO_MAX_HOSTS * TB_TOPO_MAX_DEVS) {
        return -1;
    }
    if (e->topo) {
        /* Every rank gives it; the first is kept. */
        if (n != e->nhost_entries || 0 != memcmp(e->hosts, payload, len)) {
            tb_log_limited(&e->topo_warn, tb_now_ns(), TB_LOG_WARN,
                           "a rank gave another table of the job's hosts than the first rank "
                           "did; keeping the first");
        }
        return 0;
    }
    t = calloc(1, sizeof(*t));
    built = NULL == t ? -ENOMEM : tb_ehosts_topo(payload, n, t, &why);
    if (-ENOMEM == built) {
        TB_WARN("out of memory for the job's table of hosts: no routes through other hosts");
        rc = 0;
        goto out;
    }
    if (0 != built) {
        TB_WARN("a rank gave a table of the job's hosts that makes no routes (%s): the rank is "
                "dropped", why ? why : "malformed");
        goto out;
    }
    me = tb_topo_find(t, e->id);
    if (!table_has_me(e, t, me)) {
        tb_log_limited(&e->topo_warn, tb_now_ns(), TB_LOG_WARN,
                       "a rank gave a table of the job's hosts that does not show this engine's "
                       "devices as they are; ignored");
        rc = 0;
        goto out;
    }
    e->hosts = malloc(len);
    if (NULL == e->hosts) {
        rc = 0;
        goto out;
    }
    memcpy(e->hosts, payload, len);
    e->nhost_entries = n;
    e->topo = t;
    e->me = (unsigned) me;
    t = NULL;
    index_routes(e);
    if (0 != tb_eng_detours_index(e)) {
        TB_WARN("out of memory for the ways round the job's cables: a failed cable's traffic "
                "goes round it only over another cable to the same host");
    }
    log_routes(e);
    /* Every cable's far engine, dialled now: when a cable fails, the way
     * round it is then ready (set up only then, it took seconds on a busy
     * host, with the traffic standing still), and so is the restored cable's
     * dialing (its address).  One channel per cable, which the job's own
     * traffic would mostly open anyway. */
    for (unsigned dev = 0; dev < e->ndev; ++dev) {
        if (TB_TOPO_NONE != e->topo->peer[e->me][dev]) {
            (void) tb_eng_neighbour(e, e->topo->peer[e->me][dev], dev);
        }
    }
    /* What was relayed to this engine before it knew the routes, in order. */
    while ((m = tb_eng_msg_pop(&e->early_head, &e->early_tail))) {
        e->early_bytes -= ENG_MSG_COST(m->len);
        tb_eng_relay_recv(e->peers[m->link], m->data, m->len);
        free(m);
    }
    rc = 0;
out:
    free(t);
    return rc;
}

/* ---- peers along routes -------------------------------------------------- */

/* The neighbour engine of host h over this engine's device dev, made and
 * dialled if need be (its address from the table). */
eng_peer_t *tb_eng_neighbour(tb_engine_t *e, unsigned h, unsigned dev)
{
    const tb_topo_t *t = e->topo;
    eng_peer_t *q = tb_eng_peer_for(e, dev, t->host[h].id, true);
    unsigned far = t->peer_dev[e->me][dev];

    if (NULL == q) {
        return NULL;
    }
    if (!q->known) {
        for (size_t i = 0; i < e->nhost_entries; ++i) {
            const tb_wire_ehost_t *x = &e->hosts[i];
            if (0 == memcmp(x->engine_id, t->host[h].id, TB_TOPO_ID_SIZE) && x->dev == far) {
                tb_wire_eroute_t rt;
                memset(&rt, 0, sizeof(rt));
                rt.ipv4 = x->ipv4;
                rt.cm_port = x->cm_port;
                memcpy(rt.gid, x->gid, sizeof(rt.gid));
                tb_eng_peer_learn(q, &rt);
                break;
            }
        }
    }
    tb_eng_peer_dial(q);
    return q;
}

static eng_peer_t *routed_find(tb_engine_t *e, unsigned h)
{
    for (unsigned i = 0; i < e->npeers; ++i) {
        if (e->peers[i]->routed && e->peers[i]->host == h) {
            return e->peers[i];
        }
    }
    return NULL;
}

static eng_peer_t *routed_make(tb_engine_t *e, unsigned h, const char **why)
{
    const tb_topo_t *t = e->topo;
    eng_peer_t *p = routed_find(e, h), *via;
    unsigned dev;
    int next;

    if (p) {
        return p;
    }
    next = tb_topo_next_hop(t, e->me, h, &dev);
    if (next < 0) {
        *why = "the job's cabling has no route to it";
        return NULL;
    }
    via = tb_eng_neighbour(e, (unsigned) next, dev);
    if (via) {
        via = tb_eng_relay_end(via, NULL); /* the route's cable failed: its traffic moved */
    }
    if (NULL == via || e->npeers == ENG_MAX_PEERS || NULL == (p = calloc(1, sizeof(*p)))) {
        *why = "too many engines to talk to";
        return NULL;
    }
    p->e = e;
    p->idx = e->npeers;
    p->dev = dev;
    memcpy(p->id, t->host[h].id, sizeof(p->id));
    p->routed = true;
    p->via = via;
    p->host = h;
    p->state = ENG_PEER_CONNECTING;
    for (unsigned tag = TB_ETAG_DATA; tag <= TB_ETAG_UNREACH; ++tag) {
        p->relay[tag].digest = tb_wire_le32(t->digest);
        p->relay[tag].src_host = tb_wire_le16((uint16_t) e->me);
        p->relay[tag].dst_host = tb_wire_le16((uint16_t) h);
        p->relay[tag].tag = (uint8_t) tag;
        p->relay[tag].hops_left = (uint8_t) t->nhosts;
    }
    e->peers[e->npeers++] = p;
    TB_INFO("routed to engine %02x%02x%02x%02x (host %u): %u hops, through engine "
            "%02x%02x%02x%02x over %s",
            p->id[0], p->id[1], p->id[2], p->id[3], h, t->dist[e->me][h], via->id[0], via->id[1],
            via->id[2], via->id[3], e->devs[dev].dev->name);
    return p;
}

eng_peer_t *tb_eng_routed_peer(tb_engine_t *e, const uint8_t *id, const char **why)
{
    int h;

    if (NULL == e->topo) {
        *why = "no rank gave the job's table of hosts";
        return NULL;
    }
    h = tb_topo_find(e->topo, id);
    if (h < 0 || (unsigned) h == e->me) {
        *why = h < 0 ? "that engine is not in the job's table of hosts" : "it is this engine";
        return NULL;
    }
    return routed_make(e, (unsigned) h, why);
}

/* ---- sending to a routed peer --------------------------------------------- */

/* A routed peer whose first hop's cable failed goes round it behind that
 * cable's flow header too (tunnel). */
static const tb_wire_erelay_t *outer_header(const eng_peer_t *p)
{
    return p->routed && p->via->via ? &p->via->relay[TB_ETAG_RELAY] : NULL;
}

void *tb_eng_peer_send_begin(eng_peer_t *p, tb_channel_t *ch, uint8_t tag, size_t len)
{
    const tb_wire_erelay_t *outer;
    size_t hlen;
    uint8_t *slot;

    if (NULL == p->via) {
        return tb_channel_send_begin(ch, tag, len);
    }
    outer = outer_header(p);
    hlen = (outer ? 2 : 1) * sizeof(tb_wire_erelay_t);
    slot = tb_channel_send_begin(ch, TB_ETAG_RELAY, hlen + len);
    if (NULL == slot) {
        return NULL;
    }
    if (outer) {
        memcpy(slot, outer, sizeof(tb_wire_erelay_t));
    }
    memcpy(slot + hlen - sizeof(tb_wire_erelay_t), &p->relay[tag], sizeof(tb_wire_erelay_t));
    return slot + hlen;
}

int tb_eng_peer_sendv(eng_peer_t *p, tb_channel_t *ch, uint8_t tag, const struct iovec *iov,
                      int iovcnt, void *cookie)
{
    const tb_wire_erelay_t *outer;
    struct iovec v[5];
    int n = 0;

    if (NULL == p->via) {
        return tb_channel_sendv(ch, tag, iov, iovcnt, cookie);
    }
    if (iovcnt < 0 || iovcnt > 3) {
        return TB_CHAN_EINVAL;
    }
    /* The headers live as long as the peers, so as long as the send. */
    if (NULL != (outer = outer_header(p))) {
        v[n].iov_base = (void *) outer;
        v[n++].iov_len = sizeof(tb_wire_erelay_t);
    }
    v[n].iov_base = &p->relay[tag];
    v[n++].iov_len = sizeof(tb_wire_erelay_t);
    memcpy(&v[n], iov, (size_t) iovcnt * sizeof(*iov));
    return tb_channel_sendv(ch, TB_ETAG_RELAY, v, iovcnt + n, cookie);
}

/* ---- relaying -------------------------------------------------------------- */

static void relay_violation(eng_peer_t *n, const char *fault, const char *why)
{
    if (n->conn) {
        tb_channel_abort(tb_conn_channel(n->conn), TB_CHAN_EPROTO, fault);
    }
    tb_eng_peer_fail(n, TB_CHAN_EPROTO, why);
}

static void fwd_drop(eng_peer_t *q)
{
    eng_msg_t *m;

    while ((m = tb_eng_msg_pop(&q->fwd_head, &q->fwd_tail))) {
        tb_eng_relay_done(q->e, m);
    }
    q->fwd_hold = 0;
}

void tb_eng_relay_done(tb_engine_t *e, eng_msg_t *m)
{
    if (m->link < e->npeers) {
        eng_peer_t *from = e->peers[m->link];
        from->relay_held -= ENG_MSG_COST(m->len) < from->relay_held ? ENG_MSG_COST(m->len)
                                                                     : from->relay_held;
    }
    free(m);
}

/* What was moved onto q's cable went: the peers that go through q send
 * again (what waited, and credit owed). */
static void release_held(eng_peer_t *q)
{
    for (unsigned i = 0; i < q->e->npeers; ++i) {
        eng_peer_t *x = q->e->peers[i];
        if (x->via == q) {
            x->credit_changed = true;
            x->ret_pending = true;
        }
    }
}

/* Send the queue of neighbour q as far as its channel takes it. */
int tb_eng_fwd_drain(eng_peer_t *q)
{
    tb_channel_t *ch = tb_eng_peer_channel(q);
    eng_msg_t *m;
    size_t taken = 0;
    int n = 0;

    while (NULL != ch && ENG_PEER_CONNECTED == q->state && (NULL == q->via || q->tunnel)
           && taken < ENG_TX_SHARE && NULL != (m = tb_eng_msg_pop(&q->fwd_head, &q->fwd_tail))) {
        size_t len = m->len; /* a send that fails the channel at once frees m */
        /* Round a failed cable, behind its flow's header. */
        struct iovec v[2] = {{.iov_base = &q->relay[TB_ETAG_RELAY],
                              .iov_len = sizeof(tb_wire_erelay_t)},
                             {.iov_base = m->data, .iov_len = m->len}};
        /* Off the queue before the channel has it: a send that fails q at
         * once (fwd_drop) must not free it under the channel. */
        if (TB_CHAN_OK
            != (q->via ? tb_channel_sendv(ch, TB_ETAG_RELAY, v, 2, m)
                       : tb_channel_send(ch, TB_ETAG_RELAY, m->data, m->len, m))) {
            if (ENG_PEER_CONNECTED != q->state) {
                tb_eng_relay_done(q->e, m);
            } else if (q->relay_to) {
                /* q failed in that send and its queue moved: m goes first. */
                tb_eng_msg_push_front(&q->relay_to->fwd_head, &q->relay_to->fwd_tail, m);
                q->relay_to->fwd_hold++;
            } else {
                tb_eng_msg_push_front(&q->fwd_head, &q->fwd_tail, m);
            }
            break;
        }
        taken += len;
        ++n;
        if (q->fwd_hold && 0 == --q->fwd_hold) {
            release_held(q);
        }
    }
    return n;
}

static void send_unreach(tb_engine_t *e, unsigned to, unsigned lost, const char *why);

/* The next host for a relayed message to dst, and this engine's device to
 * it: along the table's route, or for a failed cable's traffic (flow) along
 * that cable's way round. */
static int relay_next(const tb_engine_t *e, const tb_wire_erelay_t *rh, unsigned dst,
                      unsigned *dev)
{
    int next, d;

    if (0 == rh->flow) {
        return tb_topo_next_hop(e->topo, e->me, dst, dev);
    }
    /* A host cabled to the far end is the last on the way (a shortest one),
     * or took it from the source in two hops (ENG_ROUND_SHORT). */
    next = 1 == e->topo->dist[e->me][dst]
               ? (int) dst
               : tb_eng_detour_next(e, tb_wire_le16(rh->src_host), rh->flow - 1u, e->me, dst);
    if (next < 0 || (d = tb_topo_cable_to(e->topo, e->me, (unsigned) next)) < 0) {
        return -1;
    }
    *dev = (unsigned) d;
    return next;
}

void tb_eng_relay_out(tb_engine_t *e, unsigned dst, const tb_wire_erelay_t *rh,
                      const void *body, size_t blen, eng_peer_t *from)
{
    unsigned dev;
    int next = relay_next(e, rh, dst, &dev);
    eng_peer_t *q = next < 0 ? NULL : tb_eng_neighbour(e, (unsigned) next, dev);
    size_t outer;
    tb_channel_t *ch;
    uint8_t *slot;
    eng_msg_t *m;

    if (q) {
        q = tb_eng_relay_end(q, NULL); /* the route's cable failed: its traffic moved */
    }
    ch = q ? tb_eng_peer_channel(q) : NULL;

    /* The way on is gone, or its cable is and what it carried for other
     * hosts does not go round with it (one detour at a time: a failed
     * cable's traffic does not go round another). */
    if (NULL == q || ENG_PEER_FAILED == q->state || ENG_PEER_CLOSED == q->state
        || (q->via && (!q->tunnel || rh->flow))) {
        /* The source hears it (once per pair), not only the pairs that
         * were under way when it went. */
        unsigned src = tb_wire_le16(rh->src_host);
        const char *why = NULL == q ? "no way on from a relay" : "the way on is lost";
        if (from && TB_ETAG_UNREACH != rh->tag && rh->flow) {
            tb_eng_detour_cut(e, src, rh->flow - 1u, why);
        } else if (from && TB_ETAG_UNREACH != rh->tag && src < TB_TOPO_MAX_HOSTS
                   && !(e->unreach_told[src] & (1ull << dst))) {
            e->unreach_told[src] |= 1ull << dst;
            send_unreach(e, src, dst, why);
        }
        return;
    }
    outer = q->via ? sizeof(*rh) : 0;
    if (NULL == q->fwd_head && ENG_PEER_CONNECTED == q->state && ch
        && NULL
               != (slot = tb_channel_send_begin(ch, TB_ETAG_RELAY, outer + sizeof(*rh) + blen))) {
        memcpy(slot, &q->relay[TB_ETAG_RELAY], outer);
        memcpy(slot + outer, rh, sizeof(*rh));
        memcpy(slot + outer + sizeof(*rh), body, blen);
        (void) tb_channel_send_commit(ch);
        return;
    }
    m = tb_eng_msg_new(0, TB_ETAG_RELAY, 0, 0, rh, sizeof(*rh), body, blen);
    if (NULL == m) {
        TB_WARN("out of memory relaying a message: the route through this host fails");
        tb_eng_peer_fail(q, TB_CHAN_ENOMEM, "out of memory relaying a message");
        return;
    }
    m->kind = ENG_COOKIE_RELAY;
    m->link = (uint16_t) (from ? from->idx : ENG_MAX_PEERS);
    if (from) {
        from->relay_held += ENG_MSG_COST(m->len);
    }
    tb_eng_msg_append(&q->fwd_head, &q->fwd_tail, m);
    (void) tb_eng_fwd_drain(q);
}

void tb_eng_notice_send(tb_engine_t *e, unsigned src, unsigned to, unsigned flow, unsigned named,
                        const char *why)
{
    struct {
        tb_wire_eunreach_t u;
        char why[160];
    } __attribute__((packed)) body;
    size_t wlen = strlen(why) < sizeof(body.why) ? strlen(why) : sizeof(body.why);
    tb_wire_erelay_t rh;

    memset(&rh, 0, sizeof(rh));
    memset(&body, 0, sizeof(body));
    rh.digest = tb_wire_le32(e->topo->digest);
    rh.src_host = tb_wire_le16((uint16_t) src);
    rh.dst_host = tb_wire_le16((uint16_t) to);
    rh.tag = TB_ETAG_UNREACH;
    rh.hops_left = (uint8_t) e->topo->nhosts;
    rh.flow = (uint8_t) flow;
    body.u.host = tb_wire_le16((uint16_t) named);
    memcpy(body.why, why, wlen);
    tb_eng_relay_out(e, to, &rh, &body, sizeof(body.u) + wlen, NULL);
}

/* Tell host to that this engine cannot reach host lost, once per pair. */
static void send_unreach(tb_engine_t *e, unsigned to, unsigned lost, const char *why)
{
    tb_eng_notice_send(e, e->me, to, 0, lost, why);
}

eng_peer_t *tb_eng_relay_end(eng_peer_t *w, const eng_peer_t *p)
{
    return w->relay_to && w->relay_to != p ? w->relay_to : w;
}

void tb_eng_relay_redirect(eng_peer_t *from, eng_peer_t *to)
{
    tb_engine_t *e = from->e;

    if (to->relay_to == from) {
        to->relay_to = NULL; /* its traffic had moved to from: it comes back */
    }
    for (unsigned i = 0; i < e->npeers; ++i) {
        if (e->peers[i]->relay_to == from) {
            e->peers[i]->relay_to = to;
        }
    }
    from->relay_to = to;
}

/* What goes to host h over this engine's device dev goes over q: dev is q's
 * cable, or one whose traffic moved to q (relay_move). */
static bool carried_by(tb_engine_t *e, unsigned h, unsigned dev, const eng_peer_t *q)
{
    eng_peer_t *w = tb_eng_peer_for(e, dev, e->topo->host[h].id, false);

    return w == q || (w && w->relay_to == q);
}

/* Another cable than q's that joins this host to host h and carries
 * traffic (where what moved off it went, if it did), or NULL. */
static eng_peer_t *other_cable_up(tb_engine_t *e, const eng_peer_t *q, unsigned h)
{
    for (unsigned dev = 0; dev < e->ndev && dev < e->topo->host[e->me].ndev; ++dev) {
        eng_peer_t *w;
        if (dev == q->dev || e->topo->peer[e->me][dev] != h) {
            continue;
        }
        w = tb_eng_peer_for(e, dev, e->topo->host[h].id, false);
        w = w ? tb_eng_relay_end(w, q) : NULL;
        if (w && w != q && ENG_PEER_CONNECTED == w->state && NULL == w->via) {
            return w;
        }
    }
    return NULL;
}

void tb_eng_relay_lost(eng_peer_t *q, const char *why)
{
    tb_engine_t *e = q->e;
    uint64_t tell_src[TB_TOPO_MAX_HOSTS] = {0}, tell_dst[TB_TOPO_MAX_HOSTS] = {0};
    eng_peer_t *w;
    int qh;

    fwd_drop(q);
    if (NULL == e->topo || (qh = tb_topo_find(e->topo, q->id)) < 0) {
        return;
    }
    /* Every pair this engine carried over q's cable, told at the end this
     * side of it: the source when q was the way on (its route's cable, or
     * one whose traffic moved to q), the destination when q was the way in.
     * Each end waits for the other otherwise; an end behind q hears it from
     * its own side of the cable, or not at all if it is gone.  While another
     * cable to q's host stands (w), the far end may not know that what was
     * lost here is lost: both ends are told, over w, and later traffic that
     * way takes w. */
    w = other_cable_up(e, q, (unsigned) qh);
    for (unsigned s = 0; s < e->topo->nhosts; ++s) {
        for (unsigned d = 0; d < e->topo->nhosts; ++d) {
            unsigned dev;
            bool on, in;
            if (!(e->relayed_pairs[s] & (1ull << d))) {
                continue;
            }
            on = tb_topo_next_hop(e->topo, e->me, d, &dev) == qh && carried_by(e, qh, dev, q);
            in = came_by_route(e, s, d, qh, w ? -1 : (int) q->dev);
            if (on || in) {
                e->relayed_pairs[s] &= ~(1ull << d);
                tell_src[s] |= on || w ? 1ull << d : 0;
                tell_dst[d] |= in || w ? 1ull << s : 0;
            }
        }
    }
    if (w) {
        tb_eng_relay_redirect(q, w);
    } else {
        tb_eng_detour_lost(e, (unsigned) qh, why);
    }
    for (unsigned s = 0; s < e->topo->nhosts; ++s) {
        for (unsigned d = 0; d < e->topo->nhosts; ++d) {
            if (tell_src[s] & (1ull << d)) {
                send_unreach(e, s, d, why);
            }
            if (tell_dst[d] & (1ull << s)) {
                send_unreach(e, d, s, why);
            }
        }
    }
}

/* A message from src toward dst came from neighbour host nh over this
 * engine's device mydev (-1: any): the last hop of src's route toward dst,
 * over the cable that route takes. */
static bool came_by_route(const tb_engine_t *e, unsigned src, unsigned dst, int nh, int mydev)
{
    unsigned from = e->arrive_from[src][dst];

    return 0 != from && (int) from - 1 == nh && (mydev < 0 || e->arrive_dev[src][dst] == mydev);
}

/* What this engine holds of what host h's engine relays through it, over
 * every cable that joins them (any of them may bring it: cabled_to). */
static uint64_t host_relay_held(const tb_engine_t *e, unsigned h)
{
    uint64_t held = 0;

    for (unsigned i = 0; i < e->npeers; ++i) {
        const eng_peer_t *x = e->peers[i];
        if (!x->routed && x->dev < e->topo->host[e->me].ndev
            && e->topo->peer[e->me][x->dev] == h) {
            held += x->relay_held;
        }
    }
    return held;
}

/* This engine's device dev is a cable to host h (any of them carries what
 * comes from h: one that failed moves its traffic to another, relay_move). */
static bool cabled_to(const tb_engine_t *e, unsigned dev, int h)
{
    return h >= 0 && dev < e->topo->host[e->me].ndev && e->topo->peer[e->me][dev] == h;
}

/* Host via lies on this engine's route to host to, between them. */
static bool on_my_route(const tb_engine_t *e, unsigned to, unsigned via)
{
    unsigned at = e->me, dev;
    int next;

    while (at != to) {
        next = tb_topo_next_hop(e->topo, at, to, &dev);
        if (next < 0) {
            return false;
        }
        at = (unsigned) next;
        if (at == via && at != to) {
            return true;
        }
    }
    return false;
}

/* p's own channel over its cable is gone, or failing, or a new one is not
 * yet carrying both ways (tb_engine_back.c). */
static bool cable_gone(const eng_peer_t *p)
{
    return NULL != p->via || p->back || NULL == p->conn
           || 0 != tb_channel_status(tb_conn_channel(p->conn));
}

/* A message of p's flow come round its cable through neighbour n (by_src: n
 * is its source, over another cable): one that skips a number is the relay's
 * fault when it is not the source. */
static void round_in(eng_peer_t *p, eng_peer_t *n, bool by_src, uint8_t tag, const uint8_t *body,
                     size_t blen)
{
    tb_wire_erelay_t inner;
    tb_wire_emsg_t h;

    if (TB_ETAG_RELAY == tag) {
        /* What the cable carried for other hosts, taken as come over it:
         * never another failed cable's traffic (that does not go round a
         * second one, and would let the far end pass for hosts on no way
         * through it). */
        if (blen >= sizeof(inner)) {
            memcpy(&inner, body, sizeof(inner));
        }
        if (blen < sizeof(inner) || inner.flow) {
            tb_eng_peer_fail(p, TB_CHAN_EPROTO, "a message round its failed cable carried "
                                                "another failed cable's traffic");
            return;
        }
    }
    if (!by_src && TB_ETAG_RELAY != tag && blen >= sizeof(h)) {
        memcpy(&h, body, sizeof(h));
        if ((int32_t) (tb_wire_le32(h.seq) - p->rx_seq) > 0) {
            relay_violation(n, "detour out of sequence",
                            "it brought round a failed cable a message out of sequence");
            return;
        }
    }
    tb_eng_peer_recv(p, tag, body, blen);
}

void tb_eng_round_take(eng_peer_t *p)
{
    eng_msg_t *m;

    /* Held only when a relay brought it. */
    while ((m = tb_eng_msg_pop(&p->round_head, &p->round_tail))) {
        p->round_cost -= ENG_MSG_COST(m->len);
        if (m->link < p->e->npeers && ENG_PEER_CONNECTED == p->state) {
            round_in(p, p->e->peers[m->link], false, m->tag, m->data, m->len);
        }
        free(m);
    }
}

void tb_eng_round_drop(eng_peer_t *p)
{
    tb_eng_msg_free_all(&p->round_head, &p->round_tail);
    p->round_cost = 0;
}

/* A message for this engine, from host src, through neighbour n (host nh). */
static void relay_arrived(eng_peer_t *n, int nh, const tb_wire_erelay_t *rh, const uint8_t *body,
                          size_t blen)
{
    tb_engine_t *e = n->e;
    unsigned src = tb_wire_le16(rh->src_host);
    const char *why = NULL;
    tb_wire_eunreach_t u;
    eng_peer_t *p;
    char text[200];

    if (TB_ETAG_UNREACH == rh->tag) {
        if (blen < sizeof(u)) {
            relay_violation(n, "malformed relay notice", "it relayed a malformed notice");
            return;
        }
        memcpy(&u, body, sizeof(u));
        if (rh->flow) {
            /* The way round this end's failed cable is cut, at a host on
             * it (tb_eng_detour_lost): src is the cable's other end. */
            snprintf(text, sizeof(text), "its cable had failed, and the way round it is cut at "
                     "host %u: %.*s", tb_wire_le16(u.host),
                     (int) (blen - sizeof(u) < 150 ? blen - sizeof(u) : 150),
                     (const char *) body + sizeof(u));
            p = tb_eng_peer_for(e, e->topo->peer_dev[src][rh->flow - 1], e->topo->host[src].id,
                                false);
            if (p && !p->routed && p->via
                && tb_eng_detour_next(e, src, rh->flow - 1u, tb_wire_le16(u.host), e->me) >= 0) {
                tb_eng_peer_fail(p, TB_CHAN_ELINK, text);
            }
            return;
        }
        snprintf(text, sizeof(text), "the route to it is cut at host %u: %.*s", src,
                 (int) (blen - sizeof(u) < 150 ? blen - sizeof(u) : 150),
                 (const char *) body + sizeof(u));
        /* Only a host on the way there can say the way is cut: one on the
         * table's route, or the one a failed cable's traffic goes round
         * through in two hops (ENG_ROUND_SHORT; on the cable's way round,
         * notices come in the flow, above). */
        p = tb_wire_le16(u.host) < e->topo->nhosts && on_my_route(e, tb_wire_le16(u.host), src)
                ? routed_find(e, tb_wire_le16(u.host))
                : NULL;
        if (p) {
            tb_eng_peer_fail(p, TB_CHAN_ELINK, text);
        }
        for (unsigned i = 0; i < e->npeers; ++i) {
            p = e->peers[i];
            if (!p->routed && p->via && p->host == tb_wire_le16(u.host)
                && tb_topo_find(e->topo, p->via->id) == (int) src) {
                tb_eng_peer_fail(p, TB_CHAN_ELINK, text);
            }
        }
        return;
    }
    if (rh->flow) {
        /* A failed cable's traffic, come round it (checked by relay_recv):
         * its own flow goes on, numbers and credit as before.  From its
         * source over another cable it is the source's word; through a relay,
         * believed once this end's channel over the cable failed too. */
        const tb_topo_t *t = e->topo;
        eng_msg_t *m;
        p = tb_eng_peer_for(e, t->peer_dev[src][rh->flow - 1], t->host[src].id, false);
        if (NULL == p || p->routed || ENG_PEER_FAILED == p->state
            || ENG_PEER_CLOSED == p->state) {
            return; /* never used, or failed here too: its ranks were told */
        }
        if (TB_ETAG_RELAY == rh->tag && nh == (int) src) {
            /* Over another cable to the same host it comes as relayed. */
            relay_violation(n, "relay detour",
                            "it sent what its failed cable carried for other hosts round it "
                            "over another cable");
            return;
        }
        if (nh == (int) src || cable_gone(p)) {
            round_in(p, n, nh == (int) src, rh->tag, body, blen);
            return;
        }
        if (p->round_cost + ENG_MSG_COST(blen)
                > (tb_eng_detour_other_cable(e, src, rh->flow - 1u) ? ENG_DETOUR_HOLD(e)
                                                                    : ENG_ROUND_HOLD(e, src))
            || NULL == (m = tb_eng_msg_new(0, rh->tag, (uint16_t) n->idx, 0, body, blen, NULL,
                                           0))) {
            relay_violation(n, "detour bound",
                            "it brought round a cable that had not failed here more than one "
                            "credit window");
            return;
        }
        p->round_cost += ENG_MSG_COST(blen);
        tb_eng_msg_append(&p->round_head, &p->round_tail, m);
        return;
    }
    p = routed_make(e, src, &why);
    if (NULL == p) {
        tb_log_limited(&e->topo_warn, tb_now_ns(), TB_LOG_WARN,
                       "dropped a message relayed from host %u: %s", src, why);
        return;
    }
    tb_eng_peer_recv(p, rh->tag, body, blen);
}

void tb_eng_relay_recv(eng_peer_t *n, const void *data, size_t len)
{
    tb_engine_t *e = n->e;
    tb_wire_erelay_t rh;
    unsigned src, dst;
    int nh, way;

    if (len < sizeof(rh)) {
        relay_violation(n, "short relay", "it relayed a message shorter than its header");
        return;
    }
    memcpy(&rh, data, sizeof(rh));
    if (NULL == e->topo) {
        /* This host's ranks have not given the table yet (they are still
         * starting): the message waits for it. */
        eng_msg_t *m;
        if (e->early_bytes + ENG_MSG_COST(len) > ENG_RELAY_EARLY
            || NULL == (m = tb_eng_msg_new(0, TB_ETAG_RELAY, (uint16_t) n->idx, 0, data, len,
                                           NULL, 0))) {
            relay_violation(n, "relayed too early",
                            "it relayed more than this engine holds before its ranks give the "
                            "job's table of hosts");
            return;
        }
        e->early_bytes += ENG_MSG_COST(len);
        tb_eng_msg_append(&e->early_head, &e->early_tail, m);
        return;
    }
    src = tb_wire_le16(rh.src_host);
    dst = tb_wire_le16(rh.dst_host);
    nh = tb_topo_find(e->topo, n->id);
    for (unsigned k = 0; k < sizeof(rh.reserved); ++k) {
        if (rh.reserved[k]) {
            relay_violation(n, "relay reserved", "it relayed a header with reserved bytes set");
            return;
        }
    }
    way = rh.flow ? tb_eng_detour_ok(e, &rh, nh) : 0;
    if (rh.flow && 0 == way) {
        relay_violation(n, "relay detour",
                        "it sent a failed cable's traffic a way that cable's ends do not take");
        return;
    }
    if (tb_wire_le32(rh.digest) != e->topo->digest) {
        relay_violation(n, "relay table",
                        "it relays by another table of the job's hosts (btl_tbrdma "
                        "parameters or devices differ between hosts?)");
        return;
    }
    if (src >= e->topo->nhosts || dst >= e->topo->nhosts || src == dst
        || rh.tag < TB_ETAG_DATA || rh.tag > (rh.flow ? TB_ETAG_BACK : TB_ETAG_UNREACH)
        || (TB_ETAG_RELAY == rh.tag && 0 == rh.flow)
        || (0 == rh.flow && !(came_by_route(e, src, dst, nh, -1) && cabled_to(e, n->dev, nh)))) {
        relay_violation(n, "relay route",
                        "it relayed a message whose route does not come through it");
        return;
    }
    if (dst == e->me) {
        relay_arrived(n, nh, &rh, (const uint8_t *) data + sizeof(rh), len - sizeof(rh));
        return;
    }
    if (0 == rh.hops_left) {
        relay_violation(n, "relay loop", "it relayed a message that went round too many hosts");
        return;
    }
    if (host_relay_held(e, (unsigned) nh) + ENG_MSG_COST(len) > ENG_RELAY_HOLD(e, nh)) {
        relay_violation(n, "relay bound",
                        "it relayed more through this engine than the routed credit allows");
        return;
    }
    e->relayed_msgs++;
    e->relayed_bytes += len - sizeof(rh);
    if (ENG_ROUND_WAY == way) {
        /* Told when the way is cut here (tb_eng_detour_lost), again after a
         * restore and a new failure. */
        e->detour_seen[src][rh.flow - 1] = 1;
        e->detour_told[src][rh.flow - 1] = 0;
    } else {
        /* A pair, or two hops of a failed cable's flow: this engine is
         * cabled to the far end, told as a pair's next hop. */
        e->relayed_pairs[src] |= 1ull << dst;
    }
    rh.hops_left--;
    tb_eng_relay_out(e, dst, &rh, (const uint8_t *) data + sizeof(rh), len - sizeof(rh), n);
}

int tb_eng_routes_progress(tb_engine_t *e)
{
    int n = 0;

    for (unsigned i = 0; i < e->npeers; ++i) {
        eng_peer_t *p = e->peers[i], *via = p->via;
        /* A routed peer may go round its first hop's failed cable with what
         * that cable carried for other hosts (tunnel), not round two. */
        bool round_ok = via && (NULL == via->via || (p->routed && via->tunnel));
        char why[160];
        if (NULL == via || p->tunnel) {
            n += p->fwd_head ? tb_eng_fwd_drain(p) : 0;
        }
        if (NULL == via) {
            continue;
        }
        if (ENG_PEER_CONNECTING == p->state && ENG_PEER_CONNECTED == via->state && round_ok) {
            p->state = ENG_PEER_CONNECTED;
            p->credit_changed = true;
            p->ret_pending = true;
            ++n;
        } else if ((ENG_PEER_FAILED == via->state || ENG_PEER_CLOSED == via->state || !round_ok)
                   && (ENG_PEER_CONNECTING == p->state || ENG_PEER_CONNECTED == p->state)) {
            snprintf(why, sizeof(why), "%s, engine %02x%02x%02x%02x over %s, failed",
                     p->routed ? "its route's first hop" : "its cable had failed, and the way "
                     "round it", via->id[0], via->id[1], via->id[2], via->id[3],
                     e->devs[via->dev].dev->name);
            tb_eng_peer_fail(p, ENG_PEER_CLOSED == via->state ? TB_CHAN_ECLOSED : TB_CHAN_ELINK,
                             why);
            ++n;
        }
    }
    return n;
}

void tb_eng_routes_destroy(tb_engine_t *e)
{
    for (unsigned i = 0; i < e->npeers; ++i) {
        fwd_drop(e->peers[i]);
    }
    tb_eng_msg_free_all(&e->early_head, &e->early_tail);
    free(e->detours);
    e->detours = NULL;
    free(e->topo);
    free(e->hosts);
    e->topo = NULL;
    e->hosts = NULL;
}
