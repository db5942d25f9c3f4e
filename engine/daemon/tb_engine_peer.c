/*
 * tbrdma host engine, daemon: its links to other engines (see tb_engine.h):
 * one reliable channel per pair of hosts per cable (set up in
 * tb_engine_dial.c), what goes over it, and the per-destination credit that
 * keeps one slow rank from holding back everyone else's traffic.
 */
#include "tb_engine_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tb_emsg.h"
#include "tb_log.h"
#include "tb_sha256.h"

/* ---- peers --------------------------------------------------------------- */

static void chan_recv(void *ctx, uint8_t tag, const void *data, size_t len);
static void chan_send_done(void *ctx, void *cookie, int status);
static void chan_error(void *ctx, int status, const char *why);
static void chan_unsent(void *ctx, uint8_t tag, const struct iovec *iov, int iovcnt, size_t len);
static void *chan_recv_place(void *ctx, uint8_t tag, size_t len, const void *head,
                             size_t head_len, size_t *skip);
static void chan_recv_placed(void *ctx, uint8_t tag, const void *head, size_t skip, size_t len);

eng_peer_t *tb_eng_peer_for(tb_engine_t *e, unsigned dev, const uint8_t *id, bool add)
{
    eng_peer_t *p;

    for (unsigned i = 0; i < e->npeers; ++i) {
        p = e->peers[i];
        if (!p->routed && p->dev == dev && 0 == memcmp(p->id, id, sizeof(p->id))) {
            return p;
        }
    }
    if (!add || e->npeers == ENG_MAX_PEERS) {
        return NULL;
    }
    p = calloc(1, sizeof(*p));
    if (NULL == p) {
        return NULL;
    }
    p->e = e;
    p->idx = e->npeers;
    p->dev = dev;
    memcpy(p->id, id, sizeof(p->id));
    e->peers[e->npeers++] = p;
    return p;
}

void tb_eng_peer_learn(eng_peer_t *p, const tb_wire_eroute_t *rt)
{
    if (p->known) {
        return;
    }
    p->known = true;
    p->ipv4 = rt->ipv4;
    p->port = tb_wire_le16(rt->cm_port);
    memcpy(p->gid, rt->gid, sizeof(p->gid));
}

static void peer_addr(const eng_peer_t *p, char *buf, size_t len)
{
    char ip[INET_ADDRSTRLEN];
    struct in_addr a = {.s_addr = p->ipv4};

    inet_ntop(AF_INET, &a, ip, sizeof(ip));
    snprintf(buf, len, "%s (%s) to %s", p->e->devs[p->dev].dev->name,
             p->e->devs[p->dev].dev->netdev, p->known ? ip : "a peer engine");
}

static void drop_resends(eng_peer_t *p)
{
    p->nresend = 0;
    tb_eng_msg_free_all(&p->resend_head, &p->resend_tail);
    tb_eng_relay_unsent_drop(p);
}

static void drop_notices(eng_peer_t *p)
{
    p->nnotices = 0;
    tb_eng_msg_free_all(&p->notice_head, &p->notice_tail);
}

/* The lanes of p's channel, to the log. */
static void log_channel_state(const eng_peer_t *p)
{
    char state[1200];

    tb_channel_describe(tb_conn_channel(p->conn), state, sizeof(state));
    TB_WARN("channel to engine %02x%02x%02x%02x over %s: %s", p->id[0], p->id[1], p->id[2],
            p->id[3], p->e->devs[p->dev].dev->name, state);
}

/* What the channel saw, for the log of a failure. */
static void log_counters(const eng_peer_t *p)
{
    const tb_channel_counters_t *c;

    if (NULL == p->conn) {
        return;
    }
    c = tb_channel_counters(tb_conn_channel(p->conn));
    TB_WARN("its channel: frames sent %llu received %llu, messages sent %llu received %llu, "
            "timeouts %llu, probes %llu, retransmits %llu, naks %llu/%llu (sent/received), "
            "out of order %llu, duplicates %llu, stale %llu, malformed %llu, bad checksum %llu, "
            "credit stalls %llu, credit probes %llu, unacked %zu",
            (unsigned long long) c->frames_sent, (unsigned long long) c->frames_received,
            (unsigned long long) c->msgs_sent, (unsigned long long) c->msgs_received,
            (unsigned long long) c->timeouts, (unsigned long long) c->probes,
            (unsigned long long) c->retransmits, (unsigned long long) c->naks_sent,
            (unsigned long long) c->naks_received, (unsigned long long) c->out_of_order,
            (unsigned long long) c->duplicates, (unsigned long long) c->stale,
            (unsigned long long) c->malformed, (unsigned long long) c->bad_checksum,
            (unsigned long long) c->credit_stalls, (unsigned long long) c->credit_probes,
            tb_channel_unacked(tb_conn_channel(p->conn)));
    log_channel_state(p);
}

void tb_eng_peers_log_state(tb_engine_t *e)
{
    for (unsigned i = 0; i < e->npeers; ++i) {
        eng_peer_t *p = e->peers[i];
        if (ENG_PEER_CONNECTED == p->state && p->conn) {
            log_channel_state(p);
        }
    }
}

/* The channel to p is gone: tell every rank, drop what waited. */
void tb_eng_peer_fail(eng_peer_t *p, int status, const char *why)
{
    tb_engine_t *e = p->e;
    bool closed = TB_CHAN_ECLOSED == status;
    char text[240], where[160];

    if (ENG_PEER_FAILED == p->state || ENG_PEER_CLOSED == p->state) {
        return;
    }
    p->state = closed ? ENG_PEER_CLOSED : ENG_PEER_FAILED;
    peer_addr(p, where, sizeof(where));
    snprintf(text, sizeof(text), "%s over %s", why, where);
    if (!closed) {
        TB_WARN("lost the engine at the other end of %s: %s", where, why);
        e->faults++;
        log_counters(p);
        tb_eng_log_loop(e);
    }
    for (unsigned i = 0; i < ENG_MAX_RANKS; ++i) {
        eng_rank_t *r = &e->ranks[i];
        if (ENG_RANK_ATTACHED == r->state) {
            tb_eng_rank_announce(r, p);
            tb_eng_rank_post(r, TB_EREC_DOWN, closed ? 1 : 0, (uint16_t) p->idx, 0, 0, text,
                             strlen(text), NULL, 0);
        }
    }
    tb_eng_drop_waiting(p, NULL, 0);
    drop_notices(p);
    drop_resends(p);
    tb_eng_round_drop(p);
    if (!p->routed && (NULL == p->via || p->tunnel)) {
        p->tunnel = false;
        tb_eng_relay_lost(p, text);
    }
    p->destroy = NULL != p->conn;
}

void tb_eng_peer_drop_conn(eng_peer_t *p)
{
    const tb_channel_counters_t *k = tb_channel_counters(tb_conn_channel(p->conn));

    p->e->rx_copied += k->bytes_assembled + k->bytes_placed;
    tb_eng_place_release(p);
    tb_conn_destroy(p->conn);
    p->conn = NULL;
}

int tb_eng_peer_new_conn(eng_peer_t *p)
{
    tb_channel_callbacks_t cb = {.ctx = p,
                                 .recv = chan_recv,
                                 .recv_place = chan_recv_place,
                                 .recv_placed = chan_recv_placed,
                                 .send_done = chan_send_done,
                                 .unsent = chan_unsent,
                                 .error = chan_error};
    tb_channel_params_t params;
    int rc;

    tb_tunables_channel_params(&p->e->p.tunables, &params);
    /* Two relay headers: a routed peer's behind a failed cable's round it. */
    params.max_msg_size = TB_ENGINE_MAX_MSG + sizeof(tb_wire_emsg_t) + 2 * sizeof(tb_wire_erelay_t);
    /* An engine always polls: a tenth of the peer timeout between keepalives
     * leaves ten chances, and an idle engine is not woken ten times a second
     * by its own and its peers' keepalives. */
    if (params.peer_timeout_ns / 10 > params.keepalive_ns) {
        params.keepalive_ns = params.peer_timeout_ns / 10;
    }
    rc = tb_conn_create(p->e->devs[p->dev].dom, &params, &cb, &p->conn);
    if (0 != rc) {
        p->conn = NULL;
    }
    return rc;
}

int tb_eng_peer_make_conn(eng_peer_t *p)
{
    int rc = tb_eng_peer_new_conn(p);

    if (0 != rc) {
        tb_eng_peer_fail(p, TB_CHAN_ENOMEM,
                  -EBUSY == rc ? "the device's queue pairs are used up" : strerror(-rc));
        return -1;
    }
    p->state = ENG_PEER_CONNECTING;
    p->credit_changed = true;
    return 0;
}

/* ---- control messages ---------------------------------------------------- */

/* An engine-owned message m (tag and bytes) to p; m is the cookie. */
static int peer_send(eng_peer_t *p, tb_channel_t *ch, eng_msg_t *m)
{
    struct iovec iov = {.iov_base = m->data, .iov_len = m->len};

    return tb_eng_peer_sendv(p, ch, m->tag, &iov, 1, m);
}

tb_channel_t *tb_eng_peer_channel(eng_peer_t *p)
{
    if (p->via) {
        /* A routed peer's messages go over its first hop's channel, or when
         * that hop's own cable failed, round it with what the cable carried
         * for other hosts (tunnel), after what was moved there from a failed
         * cable before them (fwd_hold).  A flow that sent BACK waits for its
         * cable (tb_engine_back.c). */
        const eng_peer_t *v = p->via;
        return ENG_PEER_CONNECTED == v->state && (NULL == v->via || (p->routed && v->tunnel))
                           && 0 == v->fwd_hold && !(p->back && p->back_sent)
                   ? tb_eng_peer_channel(p->via)
                   : NULL;
    }
    return p->conn ? tb_conn_channel(p->conn) : NULL;
}

/* A control message (CREDIT, GONE, BACK): true once queued.  With keep, one the
 * channel has no room for, or that comes before the channel is connected
 * (an idle or connecting peer's ranks must hear of a death too), is not
 * lost: it waits in the peer's notice list (send_notices), and so does any
 * sent while that list is not empty, so notices keep their order. */
bool tb_eng_send_ctrl(eng_peer_t *p, uint8_t tag, uint32_t src, uint32_t src_pid, uint32_t dst,
                      uint32_t credit, const char *text, bool keep)
{
    tb_channel_t *ch = tb_eng_peer_channel(p);
    tb_wire_emsg_t h;
    size_t tlen = text ? strlen(text) : 0;
    bool behind = keep && NULL != p->notice_head;
    eng_msg_t *m;
    void *slot;

    if (ENG_PEER_FAILED == p->state || ENG_PEER_CLOSED == p->state) {
        return true;
    }
    if (ENG_PEER_CONNECTED != p->state || NULL == ch || NULL != p->resend_head) {
        if (!keep) {
            return false; /* later: see tb_eng_send */
        }
        behind = true;
    }
    memset(&h, 0, sizeof(h));
    h.src = tb_wire_le32(src);
    h.src_pid = tb_wire_le32(src_pid);
    h.dst = tb_wire_le32(dst);
    h.credit = tb_wire_le32(credit);
    tb_eng_seq_put(p, &h);
    slot = behind ? NULL : tb_eng_peer_send_begin(p, ch, tag, sizeof(h) + tlen);
    if (slot) {
        memcpy(slot, &h, sizeof(h));
        if (tlen) {
            memcpy((uint8_t *) slot + sizeof(h), text, tlen);
        }
        (void) tb_channel_send_commit(ch);
        tb_eng_seq_sent(p);
        return true;
    }
    m = tb_eng_msg_new(0, tag, 0, dst, &h, sizeof(h), text, tlen);
    if (NULL == m) {
        if (keep) {
            tb_eng_peer_fail(p, TB_CHAN_ENOMEM, "out of memory for a notice");
        }
        return false;
    }
    if (!behind && TB_CHAN_OK == peer_send(p, ch, m)) {
        tb_eng_seq_sent(p);
        return true;
    }
    if (!keep) {
        free(m);
        return false;
    }
    /* One per rank of this host that died: more comes only from processes
     * attaching and dying again and again, and is not kept. */
    if (p->nnotices >= 2 * ENG_MAX_RANKS) {
        if (!p->notices_full) {
            TB_WARN("more than %d ranks of this host died while the engine at %s was not "
                    "connected: the rest are not told to it", 2 * ENG_MAX_RANKS,
                    p->e->devs[p->dev].dev->name);
            p->notices_full = true;
        }
        free(m);
        return true;
    }
    tb_eng_msg_append(&p->notice_head, &p->notice_tail, m);
    p->nnotices++;
    return true;
}

/* ---- sending --------------------------------------------------------------- */

int tb_eng_send(eng_rank_t *r, const tb_wire_erec_t *h, const void *payload, uint64_t start,
                uint64_t end)
{
    tb_engine_t *e = r->e;
    int16_t pi = r->routes[h->link];
    bool host = 0 != (r->route_host[h->link / 8] & (1u << (h->link % 8)));
    eng_txrec_t *t;
    eng_peer_t *p;
    eng_dst_t *d;
    tb_channel_t *ch;
    tb_wire_emsg_t em;
    struct iovec iov[2];
    void *slot;
    int rc;

    (void) start;
    if (pi <= ENG_ROUTE_LOCAL(0)) {
        return tb_eng_send_local(r, h, payload, end,
                                 (uint16_t) (TB_ELINK_LOCAL + ENG_ROUTE_LOCAL_DEV(pi)
                                             + (host ? TB_ELINK_HOST : 0)));
    }
    if (pi < 0) {
        return -1;
    }
    p = e->peers[pi];
    if (ENG_PEER_FAILED == p->state || ENG_PEER_CLOSED == p->state) {
        /* Dropped: the rank was told the peer is gone. */
        tb_eng_tx_consumed(r, end);
        return 1;
    }
    d = tb_eng_dst_of(p, h->vpid, (int) r->slot);
    if (NULL == d) {
        tb_eng_rank_fail(r, "it sends to more ranks behind one engine than an engine serves");
        return 1;
    }
    memset(&em, 0, sizeof(em));
    em.src = tb_wire_le32(r->vpid);
    em.src_pid = tb_wire_le32((uint32_t) r->pid);
    em.dst = tb_wire_le32(h->vpid);
    em.dst_pid = tb_wire_le32(h->pid);
    em.tag = h->tag;
    em.flags = host ? TB_EMSG_F_HOST : 0;
    /* Nothing goes into a channel before it is set up: a setup that is
     * tried again starts with a new channel, and the old one's sends would
     * be lost. */
    if (d->nwait || !tb_eng_credit_ok(p, d, h->len) || ENG_PEER_CONNECTED != p->state
        || NULL != p->resend_head || NULL == (ch = tb_eng_peer_channel(p))) {
        if (!tb_eng_hold(p, d, r, &em, payload, h->len, end)) {
            tb_eng_tx_consumed(r, end);
        }
        return 1;
    }
    tb_eng_seq_put(p, &em);
    slot = tb_eng_peer_send_begin(p, ch, TB_ETAG_DATA, sizeof(em) + h->len);
    if (slot) {
        memcpy(slot, &em, sizeof(em));
        memcpy((uint8_t *) slot + sizeof(em), payload, h->len);
        /* Numbered, and its credit taken, even if the commit failed the
         * channel: it was handed back then (tb_channel.h's unsent), and goes
         * again another way, or the peer fails. */
        (void) tb_channel_send_commit(ch);
        tb_eng_seq_sent(p);
        tb_eng_credit_take(p, d, h->len);
        e->tx_bytes += h->len;
        e->tx_copied += h->len;
        tb_eng_tx_consumed(r, end);
        return 1;
    }
    t = tb_eng_txq_push(r, end);
    t->hdr = em;
    iov[0].iov_base = &t->hdr;
    iov[0].iov_len = sizeof(t->hdr);
    iov[1].iov_base = (void *) payload;
    iov[1].iov_len = h->len;
    rc = tb_eng_peer_sendv(p, ch, TB_ETAG_DATA, iov, 2, t);
    if (TB_CHAN_EAGAIN == rc || TB_CHAN_ENOMEM == rc) {
        tb_eng_txq_pop_last(r);
        return 0;
    }
    if (TB_CHAN_OK != rc) {
        tb_eng_tx_done(t);
        return 1;
    }
    tb_eng_seq_sent(p);
    tb_eng_credit_take(p, d, h->len);
    /* The channel copies it into its send slots. */
    e->tx_bytes += h->len;
    e->tx_copied += h->len;
    return 1;
}

/* To a rank of this host: straight into its ring (or held in order behind
 * what it has not read).  A destination that holds held_max bytes already
 * holds back the sender (0: retry later), as credit does between engines. */
int tb_eng_send_local(eng_rank_t *r, const tb_wire_erec_t *h, const void *payload, uint64_t end,
                      uint16_t link)
{
    eng_rank_t *dst = tb_eng_find_rank(r->e, h->vpid);

    if (NULL == dst || dst == r) {
        /* Finalized or dead (the sender heard it), or a rank routing to
         * itself, which its own loopback serves: dropped. */
        tb_eng_tx_consumed(r, end);
        return 1;
    }
    if (!tb_eng_rank_is(dst, h->pid)) {
        /* The sender alone hears it (its word on the pid is only its own),
         * on every device as of a death.  A sender that holds more than
         * held_max unread waits to hear it, as for a full destination: a
         * refusal is never lost, and one that never reads cannot grow them. */
        char why[200];
        if (r->ovf_bytes > r->e->p.held_max) {
            return 0;
        }
        snprintf(why, sizeof(why), "rank %u on this host is pid %d, not the pid %u the job "
                 "published for it: another process attached in its name",
                 (unsigned) dst->vpid, (int) dst->pid, (unsigned) h->pid);
        for (unsigned d = 0; d < r->e->ndev; ++d) {
            tb_eng_rank_post(r, TB_EREC_GONE, 0, (uint16_t) (TB_ELINK_LOCAL + d), h->vpid,
                             h->pid, why, strlen(why), NULL, 0);
        }
        tb_eng_tx_consumed(r, end);
        return 1;
    }
    if (dst->ovf_bytes > r->e->p.held_max) {
        return 0;
    }
    tb_eng_rank_post(dst, TB_EREC_RECV, h->tag, link, r->vpid, (uint32_t) r->pid, payload, h->len,
                     NULL, 0);
    tb_eng_tx_consumed(r, end);
    return 1;
}

/* The list head..tail (*count long) to p in order, as far as the channel
 * takes it, numbered in p's flow unless it was already (number false).  Each
 * goes off the list before the channel has it: a send that fails the peer at
 * once drops the list, and must not free it under the channel; the channel
 * frees it at its completion. */
static int send_list(eng_peer_t *p, eng_msg_t **head, eng_msg_t **tail, unsigned *count,
                     bool number)
{
    tb_channel_t *ch = tb_eng_peer_channel(p);
    eng_msg_t *m;
    int n = 0;

    while (NULL != ch && ENG_PEER_CONNECTED == p->state
           && NULL != (m = tb_eng_msg_pop(head, tail))) {
        (*count)--;
        if (number) {
            tb_eng_seq_put(p, m->data);
        }
        if (TB_CHAN_OK != peer_send(p, ch, m)) {
            if (ENG_PEER_CONNECTED != p->state) {
                free(m);
                break;
            }
            tb_eng_msg_push_front(head, tail, m);
            (*count)++;
            break;
        }
        if (number) {
            tb_eng_seq_sent(p);
        }
        ++n;
    }
    return n;
}

/* Notices that waited for room in the channel, in order, after what a
 * failed channel handed back. */
static int send_notices(eng_peer_t *p)
{
    return NULL == p->resend_head
               ? send_list(p, &p->notice_head, &p->notice_tail, &p->nnotices, true)
               : 0;
}

/* What p's failed channel handed back, in order, before anything else, as
 * fast as the new way takes it.  Not held to the routed share of the window:
 * its DATA is in flight already (under credit), and its CREDIT messages, in
 * the same order, are what the far end waits for to send its own (each end
 * would wait for the other's). */
static int send_resends(eng_peer_t *p)
{
    return send_list(p, &p->resend_head, &p->resend_tail, &p->nresend, false);
}

/* Credit owed to the sending engine for what local ranks consumed: sent
 * when a quarter window has gathered, or when the rank has read everything. */
static int return_credit(eng_peer_t *p)
{
    tb_engine_t *e = p->e;
    bool still = false;
    int n = 0;

    if (!p->ret_pending) {
        return 0;
    }
    for (unsigned s = 0; s < ENG_MAX_RANKS; ++s) {
        eng_rank_t *r = &e->ranks[s];
        if (0 == p->ret[s]) {
            continue;
        }
        if (ENG_RANK_ATTACHED != r->state) {
            p->ret[s] = 0;
            continue;
        }
        if (p->ret[s] < e->p.credit_window / 4 && 0 != r->rxq_len) {
            still = true;
            continue;
        }
        if (tb_eng_send_ctrl(p, TB_ETAG_CREDIT, 0, 0, r->vpid, (uint32_t) p->ret[s], NULL, false)) {
            p->delivered[s] -= p->ret[s] < p->delivered[s] ? p->ret[s] : p->delivered[s];
            p->ret[s] = 0;
            ++n;
        } else {
            still = true;
        }
    }
    p->ret_pending = still;
    return n;
}

int tb_eng_peers_progress(tb_engine_t *e, uint64_t now)
{
    int n = tb_eng_routes_progress(e);

    for (unsigned i = 0; i < e->npeers; ++i) {
        eng_peer_t *p = e->peers[i];
        if (p->redial_at && now >= p->redial_at) {
            tb_eng_peer_dial(p);
        }
        if (p->destroy) {
            /* Outside the channel's callbacks: the channel may go now. */
            p->destroy = false;
            tb_eng_peer_drop_conn(p);
            ++n;
            continue;
        }
        n += send_resends(p);
        n += tb_eng_back_progress(p, now);
        n += send_notices(p);
        n += tb_eng_send_waiting(p);
        n += return_credit(p);
    }
    return n;
}

/* ---- receiving ------------------------------------------------------------- */

/* The peer broke the protocol: its channel ends (a test's peer has none). */
static void peer_violation(eng_peer_t *p, const char *fault, const char *why)
{
    if (p->conn) {
        tb_channel_abort(tb_conn_channel(p->conn), TB_CHAN_EPROTO, fault);
    }
    tb_eng_peer_fail(p, TB_CHAN_EPROTO, why);
}

static void chan_recv(void *ctx, uint8_t tag, const void *data, size_t len)
{
    tb_eng_peer_recv(ctx, tag, data, len);
}

void tb_eng_peer_recv(eng_peer_t *p, uint8_t tag, const void *data, size_t len)
{
    tb_engine_t *e = p->e;
    tb_wire_emsg_t h;
    const uint8_t *payload = (const uint8_t *) data + sizeof(h);
    size_t plen = len - sizeof(h);
    const char *fault;
    char why[201];
    eng_rank_t *r;
    eng_dst_t *d;
    uint32_t src, dst;

    /* Relayed messages count too: an engine that only relays must keep the
     * pace of traffic (spin, short sleeps), or every hop waits its sleep. */
    e->rx_msgs++;
    if (TB_ETAG_RELAY == tag && !p->routed) {
        tb_eng_relay_recv(p, data, len);
        return;
    }
    if (0 != tb_emsg_parse(tag, data, len, &h, &fault)) {
        snprintf(why, sizeof(why), "it sent %s", fault);
        peer_violation(p, fault, why);
        return;
    }
    if (TB_ETAG_BACK_OK == tag) {
        /* Not in the flow: an answer over the cable's new channel. */
        tb_eng_back_ok(p, tb_eng_back_id_of(&h), tb_wire_le32(h.seq));
        return;
    }
    /* Its flow's next message, or one it had already (sent again round a
     * failed cable): nothing else can come, each way being in order. */
    if ((int32_t) (tb_wire_le32(h.seq) - p->rx_seq) < 0) {
        p->dups++;
        return;
    }
    if (tb_wire_le32(h.seq) != p->rx_seq) {
        peer_violation(p, "message out of sequence",
                       "it sent a message out of sequence (one before it never came)");
        return;
    }
    p->rx_seq++;
    src = tb_wire_le32(h.src);
    dst = tb_wire_le32(h.dst);
    switch (tag) {
    case TB_ETAG_DATA:
        r = tb_eng_find_rank(e, dst);
        if (NULL == r) {
            /* The rank left or died; its senders learn it from GONE. */
            return;
        }
        if (!tb_eng_window_ok(p, r, plen)) {
            snprintf(why, sizeof(why),
                     "it sent rank %u %llu bytes beyond the credit window (%llu bytes; "
                     "btl_tbrdma_engine_credit_window must be the same on every host)",
                     (unsigned) dst,
                     (unsigned long long) (p->delivered[r->slot] + tb_ecredit_cost(plen)
                                           - e->p.credit_window),
                     (unsigned long long) e->p.credit_window);
            peer_violation(p, "credit exceeded", why);
            return;
        }
        p->delivered[r->slot] += tb_ecredit_cost(plen);
        if (!tb_eng_rank_is(r, tb_wire_le32(h.dst_pid))) {
            /* Not the process the sender's job published: never delivered,
             * but its credit comes back as if read, so one sender naming a
             * wrong pid holds up nobody else's traffic to the rank.  No GONE
             * back: that would end every sender's traffic to the rank on
             * one sender's word. */
            tb_log_limited(&e->pid_warn, tb_now_ns(), TB_LOG_WARN,
                           "dropped a message for rank %u: it is pid %d here, the sender "
                           "expected pid %u (another process attached in its name?)",
                           (unsigned) dst, (int) r->pid, (unsigned) tb_wire_le32(h.dst_pid));
            p->ret[r->slot] += tb_ecredit_cost(plen);
            p->ret_pending = true;
            return;
        }
        tb_eng_rank_announce(r, p);
        e->rx_bytes += plen;
        tb_eng_rank_post(r, TB_EREC_RECV, h.tag, tb_eng_recv_link(p, &h), src,
                         tb_wire_le32(h.src_pid), payload, plen, NULL, 0);
        return;
    case TB_ETAG_BACK:
        tb_eng_back_came(p, tb_eng_back_id_of(&h), tb_wire_le32(h.seq));
        return;
    case TB_ETAG_CREDIT:
        if (NULL != (d = tb_eng_dst_of(p, dst, -1))) {
            tb_eng_credit_give(p, d, tb_wire_le32(h.credit));
        }
        return;
    case TB_ETAG_GONE:
        /* Every GONE is copied to every rank, once per process (rank and
         * pid).  An engine tells of at most as many as one engine serves:
         * more takes processes attaching in dead ranks' names, which share
         * the user and could end the job anyway. */
        for (unsigned i = 0; i < p->ngone; ++i) {
            if (p->gone[i].vpid == src && p->gone[i].pid == tb_wire_le32(h.src_pid)) {
                return;
            }
        }
        if (p->ngone == ENG_MAX_RANKS) {
            peer_violation(p, "too many processes gone",
                           "it said more processes are gone than one engine serves");
            return;
        }
        p->gone[p->ngone].vpid = src;
        p->gone[p->ngone++].pid = tb_wire_le32(h.src_pid);
        snprintf(why, sizeof(why), "%.*s", (int) (plen < 200 ? plen : 200), (const char *) payload);
        tb_eng_drop_waiting(p, &src, tb_wire_le32(h.src_pid));
        /* What was in flight to it never comes back as credit: a routed
         * peer's share of the window, which its host's other ranks share,
         * would shrink for good. */
        if (NULL != (d = tb_eng_dst_of(p, src, -1))) {
            tb_eng_credit_give(p, d, d->used);
        }
        for (unsigned i = 0; i < ENG_MAX_RANKS; ++i) {
            r = &e->ranks[i];
            if (ENG_RANK_ATTACHED == r->state) {
                tb_eng_rank_announce(r, p);
                tb_eng_rank_post(r, TB_EREC_GONE, 0, (uint16_t) p->idx, src,
                                 tb_wire_le32(h.src_pid), why, strlen(why), NULL, 0);
            }
        }
        return;
    }
}

static void *chan_recv_place(void *ctx, uint8_t tag, size_t len, const void *head,
                             size_t head_len, size_t *skip)
{
    return tb_eng_peer_recv_place(ctx, tag, len, head, head_len, skip);
}

static void chan_recv_placed(void *ctx, uint8_t tag, const void *head, size_t skip, size_t len)
{
    tb_eng_peer_recv_placed(ctx, tag, head, skip, len);
}

static void chan_send_done(void *ctx, void *cookie, int status)
{
    int kind = *(int *) cookie;

    (void) status;
    if (ENG_COOKIE_TX == kind) {
        tb_eng_tx_done(cookie);
    } else if (ENG_COOKIE_RELAY == kind) {
        tb_eng_relay_done(((eng_peer_t *) ctx)->e, cookie);
    } else {
        free(cookie);
    }
}

/* The channel failed: a message it may not have delivered, to send again
 * round the failed cable (tb_eng_peer_detour).  p's own flow, and what went
 * over the cable for other hosts (RELAY: it goes with the flow, over another
 * cable to the same host or round it; tb_engine_detour.c). */
static void chan_unsent(void *ctx, uint8_t tag, const struct iovec *iov, int iovcnt, size_t len)
{
    eng_peer_t *p = ctx;
    eng_msg_t *m;
    size_t off = 0;

    if (TB_ETAG_RELAY == tag) {
        tb_eng_relay_unsent(p, iov, iovcnt, len);
        return;
    }
    if (TB_ETAG_DATA != tag && TB_ETAG_CREDIT != tag && TB_ETAG_GONE != tag) {
        return;
    }
    if (NULL == iov || p->lost_unsent
        || NULL == (m = tb_eng_msg_new(0, tag, 0, 0, NULL, 0, NULL, len))) {
        p->lost_unsent = true;
        return;
    }
    for (int i = 0; i < iovcnt; ++i) {
        memcpy(m->data + off, iov[i].iov_base, iov[i].iov_len);
        off += iov[i].iov_len;
    }
    m->kind = ENG_COOKIE_MSG;
    tb_eng_msg_append(&p->resend_head, &p->resend_tail, m);
    p->nresend++;
}

static void chan_error(void *ctx, int status, const char *why)
{
    eng_peer_t *p = ctx;

    if (!tb_eng_back_failed(p, status, why) && !tb_eng_peer_detour(p, status, why)) {
        tb_eng_peer_fail(p, status, why);
    }
    /* What was handed back and not moved is of this failure only. */
    tb_eng_relay_unsent_drop(p);
}

/* ---- ranks coming and going ---------------------------------------------- */

void tb_eng_peers_forget_rank(tb_engine_t *e, eng_rank_t *r)
{
    /* Its ring goes: nothing may wait in it any more. */
    tb_eng_peers_unpin(e, r);
    for (unsigned i = 0; i < e->npeers; ++i) {
        eng_peer_t *p = e->peers[i];
        p->ret[r->slot] = 0;
        p->delivered[r->slot] = 0;
        for (unsigned k = 0; k < p->ndst; ++k) {
            if (p->dst[k].adder == r->slot) {
                p->dst[k].adder = ENG_DST_NOBODY;
            }
        }
        for (eng_msg_t *m = p->wait_head; m; m = m->next) {
            if (m->src_slot == (int) r->slot) {
                m->src_slot = -1;
            }
        }
    }
    r->held_bytes = 0;
}

void tb_eng_peers_rank_gone(tb_engine_t *e, uint32_t vpid, uint32_t pid, const char *why)
{
    /* Kept when the channel is full of data: the peer's ranks would wait for
     * the dead one until something else ended the job. */
    for (unsigned i = 0; i < e->npeers; ++i) {
        (void) tb_eng_send_ctrl(e->peers[i], TB_ETAG_GONE, vpid, pid, 0, 0, why, true);
    }
}

size_t tb_eng_peers_unacked(tb_engine_t *e)
{
    size_t n = 0;

    for (unsigned i = 0; i < e->npeers; ++i) {
        eng_peer_t *p = e->peers[i];
        if (ENG_PEER_FAILED == p->state || ENG_PEER_CLOSED == p->state) {
            continue;
        }
        n += p->wait_head ? 1 : 0;
        n += p->resend_head ? 1 : 0;
        n += p->fwd_head ? 1 : 0; /* relayed for others: a relay drains it too */
        if (p->conn && 0 == tb_channel_status(tb_conn_channel(p->conn))) {
            n += tb_channel_unacked(tb_conn_channel(p->conn));
        }
    }
    return n;
}

unsigned tb_eng_peers_open(tb_engine_t *e)
{
    unsigned n = 0;

    for (unsigned i = 0; i < e->npeers; ++i) {
        n += NULL != e->peers[i]->conn;
    }
    return n;
}

void tb_eng_peers_close(tb_engine_t *e)
{
    uint64_t end;

    for (unsigned i = 0; i < e->npeers; ++i) {
        eng_peer_t *p = e->peers[i];
        if (p->conn && ENG_PEER_CONNECTED == p->state) {
            p->state = ENG_PEER_CLOSED;
            tb_channel_close(tb_conn_channel(p->conn));
        }
    }
    /* Long enough for the CLOSE frames to leave. */
    end = tb_now_ns() + 20000000ull;
    while (tb_now_ns() < end) {
        (void) tb_eng_devices_progress(e, tb_now_ns());
    }
}

void tb_eng_peers_destroy(tb_engine_t *e)
{
    /* Every channel first: what they cancel may name any peer (relayed). */
    for (unsigned i = 0; i < e->npeers; ++i) {
        if (e->peers[i]->conn) {
            tb_eng_peer_drop_conn(e->peers[i]);
        }
    }
    tb_eng_routes_destroy(e);
    for (unsigned i = 0; i < e->npeers; ++i) {
        eng_peer_t *p = e->peers[i];
        tb_eng_drop_waiting(p, NULL, 0);
        drop_notices(p);
        drop_resends(p);
        tb_eng_round_drop(p);
        tb_mem_wipe(p->pair_secret, sizeof(p->pair_secret));
        free(p);
        e->peers[i] = NULL;
    }
    e->npeers = 0;
}
