/*
 * tbrdma host engine, daemon: a rank's rings, as the engine reads and writes
 * them: records to the rank (and what waits when its ring is full), records
 * from it (sends, routes, the job key), and the credit it returns.
 */
#include "tb_engine_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tb_log.h"

/* ---- records to a rank --------------------------------------------------- */

/* Write a record into the rank's ring now, or false if it has no room. */
static bool rx_write(eng_rank_t *r, uint8_t type, uint8_t tag, uint16_t link, uint32_t vpid,
                     uint32_t pid, const void *a, size_t alen, const void *b, size_t blen)
{
    const struct iovec iov[2] = {{(void *) a, alen}, {(void *) b, blen}};

    return tb_shm_ring_put(&r->rx, type, tag, link, vpid, pid, iov, 2) >= 0;
}

/* Keep the rank's credit accounting: a RECV of bytes from peer ends at the
 * ring's head.  Credit goes back to peer links only; a rank of this host
 * holds back instead (tb_eng_send_local), and other records carry none. */
static int rxq_push(eng_rank_t *r, uint8_t type, uint16_t peer, uint32_t bytes)
{
    if (TB_EREC_RECV != type || peer >= TB_ELINK_LOCAL) {
        return 0;
    }
    peer &= (uint16_t) ~TB_ELINK_HOST;
    if (r->rxq_len == r->rxq_cap) {
        unsigned cap = r->rxq_cap ? 2 * r->rxq_cap : 256;
        eng_rxrec_t *q = malloc((size_t) cap * sizeof(*q));
        unsigned i;
        if (NULL == q) {
            return -1;
        }
        for (i = 0; i < r->rxq_len; ++i) {
            q[i] = r->rxq[(r->rxq_first + i) % r->rxq_cap];
        }
        free(r->rxq);
        r->rxq = q;
        r->rxq_cap = cap;
        r->rxq_first = 0;
    }
    r->rxq[(r->rxq_first + r->rxq_len) % r->rxq_cap] =
        (eng_rxrec_t){.end = r->rx.head, .peer = peer, .bytes = (uint32_t) tb_ecredit_cost(bytes)};
    r->rxq_len++;
    return 0;
}

eng_msg_t *tb_eng_msg_new(uint8_t type, uint8_t tag, uint16_t link, uint32_t vpid, const void *a,
                          size_t alen, const void *b, size_t blen)
{
    eng_msg_t *m = malloc(sizeof(*m) + alen + blen);

    if (NULL == m) {
        return NULL;
    }
    memset(m, 0, sizeof(*m));
    m->kind = ENG_COOKIE_MSG;
    m->type = type;
    m->tag = tag;
    m->link = link;
    m->vpid = vpid;
    m->len = alen + blen;
    /* A NULL a or b leaves room for the caller to fill. */
    if (alen && a) {
        memcpy(m->data, a, alen);
    }
    if (blen && b) {
        memcpy(m->data + alen, b, blen);
    }
    return m;
}

/* Move what waited into the ring, in order. */
int tb_eng_rank_flush_overflow(eng_rank_t *r)
{
    int n = 0;

    while (r->ovf_head && NULL == r->placing) {
        eng_msg_t *m = r->ovf_head;
        if (!rx_write(r, m->type, m->tag, m->link, m->vpid, m->pid, m->data, m->len, NULL, 0)) {
            break;
        }
        if (0 != rxq_push(r, m->type, m->link, (uint32_t) m->len)) {
            tb_eng_rank_fail(r, "out of memory");
            return n;
        }
        if (TB_EREC_RECV == m->type && m->link < TB_ELINK_LOCAL) {
            r->e->rx_copied += m->len;
        }
        r->ovf_head = m->next;
        if (NULL == r->ovf_head) {
            r->ovf_tail = NULL;
        }
        r->ovf_bytes -= ENG_MSG_COST(m->len);
        free(m);
        ++n;
    }
    return n;
}

void tb_eng_rank_post(eng_rank_t *r, uint8_t type, uint8_t tag, uint16_t link, uint32_t vpid,
                      uint32_t pid, const void *a, size_t alen, const void *b, size_t blen)
{
    eng_msg_t *m;

    if (ENG_RANK_ATTACHED != r->state) {
        return;
    }
    if (TB_EREC_RECV == type && link < TB_ELINK_LOCAL) {
        r->e->rx_copied += alen + blen; /* into the ring, or the overflow and then the ring */
    }
    if (NULL == r->ovf_head && NULL == r->placing
        && rx_write(r, type, tag, link, vpid, pid, a, alen, b, blen)) {
        if (0 != rxq_push(r, type, link, (uint32_t) (alen + blen))) {
            tb_eng_rank_fail(r, "out of memory");
        }
        return;
    }
    /* The ring is full (or a peer's message is being written into it): hold
     * it in order.  Data is bounded by the credit
     * window per peer, and by held_max from this host's ranks (both count
     * what a message costs, not only its payload); notices by the number of
     * peers and ranks, and those a rank's own sends cause (a pid that is
     * not there) by held_max. */
    m = tb_eng_msg_new(type, tag, link, vpid, a, alen, b, blen);
    if (NULL == m) {
        tb_eng_rank_fail(r, "out of memory holding a message for it");
        return;
    }
    m->pid = pid;
    tb_eng_msg_append(&r->ovf_head, &r->ovf_tail, m);
    r->ovf_bytes += ENG_MSG_COST(m->len);
}

void tb_eng_rank_received(eng_rank_t *r, uint16_t link, size_t len)
{
    if (0 != rxq_push(r, TB_EREC_RECV, link, (uint32_t) len)) {
        tb_eng_rank_fail(r, "out of memory");
    }
}

void tb_eng_rank_announce(eng_rank_t *r, eng_peer_t *p)
{
    tb_wire_epeer_t ann;

    if (r->announced[p->idx / 8] & (1u << (p->idx % 8))) {
        return;
    }
    r->announced[p->idx / 8] |= (uint8_t) (1u << (p->idx % 8));
    memset(&ann, 0, sizeof(ann));
    ann.dev = (uint8_t) p->dev;
    memcpy(ann.engine_id, p->id, sizeof(ann.engine_id));
    tb_eng_rank_post(r, TB_EREC_PEER, 0, (uint16_t) p->idx, 0, 0, &ann, sizeof(ann), NULL, 0);
}

eng_rank_t *tb_eng_find_rank(tb_engine_t *e, uint32_t vpid)
{
    for (unsigned i = 0; i < e->rank_hwm; ++i) {
        if (ENG_RANK_ATTACHED == e->ranks[i].state && e->ranks[i].vpid == vpid) {
            return &e->ranks[i];
        }
    }
    return NULL;
}

bool tb_eng_rank_is(const eng_rank_t *r, uint32_t pid)
{
    return (uint32_t) r->pid == pid;
}

/* ---- records from a rank ------------------------------------------------- */

static void txq_release(eng_rank_t *r)
{
    while (r->txq_len && r->txq[r->txq_first].done) {
        tb_shm_ring_release_to(&r->tx, r->txq[r->txq_first].end);
        r->txq_first = (r->txq_first + 1) % ENG_TXQ;
        r->txq_len--;
    }
}

void tb_eng_tx_done(eng_txrec_t *t)
{
    t->done = true;
    txq_release(t->rank);
}

static eng_txrec_t *txq_push(eng_rank_t *r, uint64_t end, bool done)
{
    eng_txrec_t *t = &r->txq[(r->txq_first + r->txq_len) % ENG_TXQ];

    t->kind = ENG_COOKIE_TX;
    t->rank = r;
    t->end = end;
    t->done = done;
    r->txq_len++;
    return t;
}

static int rank_route(eng_rank_t *r, const tb_wire_erec_t *h, const void *p)
{
    tb_engine_t *e = r->e;
    tb_wire_eroute_t rt;
    eng_peer_t *peer;

    if (sizeof(rt) != h->len || h->link >= ENG_MAX_ROUTES) {
        return -1;
    }
    memcpy(&rt, p, sizeof(rt));
    if (rt.dev >= e->ndev || 0 != (rt.flags & ~(TB_EROUTE_F_HOST | TB_EROUTE_F_ROUTED))
        || rt.reserved[0] || rt.reserved[1]) {
        return -1;
    }
    if (rt.flags & TB_EROUTE_F_HOST) {
        r->route_host[h->link / 8] |= (uint8_t) (1u << (h->link % 8));
    } else {
        r->route_host[h->link / 8] &= (uint8_t) ~(1u << (h->link % 8));
    }
    if (0 == memcmp(rt.engine_id, e->id, sizeof(e->id))) {
        /* A rank of this host: its messages go from ring to ring. */
        r->routes[h->link] = ENG_ROUTE_LOCAL(rt.dev);
        return 0;
    }
    if (rt.flags & TB_EROUTE_F_ROUTED) {
        const char *why = NULL;
        if (rt.ipv4 || rt.cm_port) {
            return -1;
        }
        peer = r->nnamed < ENG_RANK_MAX_PEERS ? tb_eng_routed_peer(e, rt.engine_id, &why) : NULL;
        if (NULL == peer) {
            char text[200];
            snprintf(text, sizeof(text), "it routes through other hosts to an engine it cannot "
                     "reach: %s", why ? why : "it named more engines than one rank may");
            tb_eng_rank_fail(r, text);
            return 0;
        }
    } else if (0 == rt.ipv4 || 0 == rt.cm_port) {
        return -1;
    } else {
        peer = tb_eng_peer_for(e, rt.dev, rt.engine_id, r->nnamed < ENG_RANK_MAX_PEERS);
    }
    if (NULL == peer) {
        tb_eng_rank_fail(r, r->nnamed < ENG_RANK_MAX_PEERS
                                ? "too many engines to talk to"
                                : "it named more engines than one rank may (ENG_RANK_MAX_PEERS)");
        return 0;
    }
    if (!(r->named[peer->idx / 8] & (1u << (peer->idx % 8)))) {
        /* Counted whoever made the peer (another rank, or the engine at
         * the other end dialling first). */
        if (r->nnamed >= ENG_RANK_MAX_PEERS) {
            tb_eng_rank_fail(r, "it named more engines than one rank may (ENG_RANK_MAX_PEERS)");
            return 0;
        }
        r->named[peer->idx / 8] |= (uint8_t) (1u << (peer->idx % 8));
        r->nnamed++;
    }
    r->routes[h->link] = (int16_t) peer->idx;
    if (!peer->routed) {
        tb_eng_peer_learn(peer, &rt);
        tb_eng_peer_dial(peer);
    }
    return 0;
}

static void set_job_key(eng_rank_t *r, const void *key)
{
    tb_engine_t *e = r->e;

    if (e->have_key) {
        if (0 != memcmp(e->job_key, key, sizeof(e->job_key))) {
            /* A rank may send this record as often as it likes. */
            tb_log_limited(&e->key_warn, tb_now_ns(), TB_LOG_WARN,
                           "rank %u gave another job key than the first rank did; keeping "
                           "the first",
                           (unsigned) r->vpid);
        }
        return;
    }
    memcpy(e->job_key, key, sizeof(e->job_key));
    e->have_key = true;
    tb_eng_peers_dial_waiting(e);
}

/* One record from the rank.  1: consumed; 0: retry later (left in the ring);
 * -1: the rank broke the protocol. */
static int rank_record(eng_rank_t *r, const tb_wire_erec_t *h, const void *p, uint64_t start,
                       uint64_t end)
{
    int rc;

    switch (h->type) {
    case TB_EREC_SEND:
        if (h->link >= ENG_MAX_ROUTES || h->len > r->e->max_record) {
            return -1;
        }
        rc = tb_eng_send(r, h, p, start, end);
        return rc;
    case TB_EREC_ROUTE:
        rc = rank_route(r, h, p);
        break;
    case TB_EREC_JOBKEY:
        if (TB_WIRE_SECRET_SIZE != h->len) {
            return -1;
        }
        set_job_key(r, p);
        rc = 0;
        break;
    case TB_EREC_HOSTS:
        rc = tb_eng_topo_set(r->e, p, h->len);
        break;
    case TB_EREC_BYE:
        r->bye = true;
        rc = 0;
        break;
    default:
        return -1;
    }
    if (rc < 0) {
        return -1;
    }
    if (0 == r->txq_len) {
        tb_shm_ring_release_to(&r->tx, end);
    } else {
        (void) txq_push(r, end, true);
    }
    return 1;
}

eng_txrec_t *tb_eng_txq_push(eng_rank_t *r, uint64_t end)
{
    return txq_push(r, end, false);
}

void tb_eng_txq_pop_last(eng_rank_t *r)
{
    r->txq_len--;
}

void tb_eng_tx_consumed(eng_rank_t *r, uint64_t end)
{
    if (0 == r->txq_len) {
        tb_shm_ring_release_to(&r->tx, end);
    } else {
        (void) txq_push(r, end, true);
    }
}

int tb_eng_rank_tx_progress(eng_rank_t *r)
{
    tb_wire_erec_t h;
    const void *p;
    uint64_t start, end, taken = 0;
    int n = 0, rc;

    r->blocked = false;
    /* A share at a time: the devices are polled between shares, however
     * fast the rank writes (a long pass starves the links' receives). */
    while (ENG_RANK_ATTACHED == r->state && taken < ENG_TX_SHARE) {
        tb_eng_peers_unpin_starved(r->e, r);
        if (r->txq_len >= ENG_TXQ - 1 || r->held_bytes > r->e->p.held_max) {
            r->blocked = true;
            break;
        }
        start = r->tx.cursor;
        p = tb_shm_ring_next(&r->tx, &h, &end);
        if (NULL == p) {
            if (r->tx.broken) {
                tb_eng_rank_fail(r, "its ring to the engine is corrupt");
            }
            break;
        }
        /* A PAD skipped before the record moved the start. */
        start = end - ((sizeof(h) + h.len + TB_WIRE_EREC_ALIGN - 1)
                       & ~(uint64_t) (TB_WIRE_EREC_ALIGN - 1));
        rc = rank_record(r, &h, p, start, end);
        if (rc < 0) {
            tb_eng_rank_fail(r, "it sent a malformed record");
            break;
        }
        if (0 == rc) {
            tb_shm_ring_rewind(&r->tx, start);
            r->blocked = true;
            break;
        }
        taken += sizeof(h) + h.len;
        ++n;
    }
    return n;
}

/* Return credit for what the rank consumed of its ring. */
int tb_eng_rank_credit_progress(eng_rank_t *r)
{
    tb_engine_t *e = r->e;
    uint64_t consumed;
    int n = 0;

    if (0 == r->rxq_len) {
        return 0;
    }
    consumed = tb_shm_ring_consumed(&r->rx);
    if (r->rx.broken) {
        tb_eng_rank_fail(r, "it corrupted its ring from the engine");
        return 0;
    }
    while (r->rxq_len && (int64_t) (consumed - r->rxq[r->rxq_first].end) >= 0) {
        eng_rxrec_t *q = &r->rxq[r->rxq_first];
        eng_peer_t *p = e->peers[q->peer];
        if (p) {
            p->ret[r->slot] += q->bytes;
            p->ret_pending = true;
        }
        r->rxq_first = (r->rxq_first + 1) % r->rxq_cap;
        r->rxq_len--;
        ++n;
    }
    return n;
}

