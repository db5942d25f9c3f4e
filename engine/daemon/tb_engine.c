/*
 * tbrdma host engine, daemon: the host engine's main loop, attach and ranks (see
 * tb_engine.h).  The engine's links to other engines are in
 * tb_engine_peer.c; what both share is in tb_engine_int.h.
 */
#include "tb_engine_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tb_jobdir.h"
#include "tb_log.h"
#include "tb_random.h"
#include "tb_shm_segment.h"
#include "tb_usock.h"

void tb_engine_params_default(tb_engine_params_t *p)
{
    memset(p, 0, sizeof(*p));
    tb_tunables_defaults(&p->tunables);
    p->tunables.peer_timeout_ms = 5000;
    p->credit_window = 4u << 20;
    p->held_max = 8u << 20;
    p->idle_exit_ns = 60000000000ull;
    p->spin_ns = 1000000ull;
    p->sleep_ns = 1000000ull;
    p->events = 1;
}

/* ---- records to a rank --------------------------------------------------- */

/* Write a record into the rank's ring now, or false if it has no room. */
static bool rx_write(eng_rank_t *r, uint8_t type, uint8_t tag, uint16_t link, uint32_t vpid,
                     const void *a, size_t alen, const void *b, size_t blen)
{
    tb_wire_erec_t *rec = tb_shm_ring_reserve(&r->rx, alen + blen);

    if (NULL == rec) {
        return false;
    }
    rec->type = type;
    rec->tag = tag;
    rec->link = tb_wire_le16(link);
    rec->vpid = tb_wire_le32(vpid);
    if (alen) {
        memcpy(rec + 1, a, alen);
    }
    if (blen) {
        memcpy((uint8_t *) (rec + 1) + alen, b, blen);
    }
    (void) tb_shm_ring_commit(&r->rx);
    return true;
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
        (eng_rxrec_t){.end = r->rx.head, .peer = peer, .bytes = bytes};
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
    if (alen) {
        memcpy(m->data, a, alen);
    }
    if (blen) {
        memcpy(m->data + alen, b, blen);
    }
    return m;
}

/* Move what waited into the ring, in order. */
static int rank_flush_overflow(eng_rank_t *r)
{
    int n = 0;

    while (r->ovf_head) {
        eng_msg_t *m = r->ovf_head;
        if (!rx_write(r, m->type, m->tag, m->link, m->vpid, m->data, m->len, NULL, 0)) {
            break;
        }
        if (0 != rxq_push(r, m->type, m->link, (uint32_t) m->len)) {
            tb_eng_rank_fail(r, "out of memory");
            return n;
        }
        r->ovf_head = m->next;
        if (NULL == r->ovf_head) {
            r->ovf_tail = NULL;
        }
        r->ovf_bytes -= m->len;
        free(m);
        ++n;
    }
    return n;
}

void tb_eng_rank_post(eng_rank_t *r, uint8_t type, uint8_t tag, uint16_t link, uint32_t vpid,
                      const void *a, size_t alen, const void *b, size_t blen)
{
    eng_msg_t *m;

    if (ENG_RANK_ATTACHED != r->state) {
        return;
    }
    if (NULL == r->ovf_head && rx_write(r, type, tag, link, vpid, a, alen, b, blen)) {
        if (0 != rxq_push(r, type, link, (uint32_t) (alen + blen))) {
            tb_eng_rank_fail(r, "out of memory");
        }
        return;
    }
    /* The ring is full: hold it in order.  Data is bounded by the credit
     * window per peer, and by held_max from this host's ranks; notices by
     * the number of peers and ranks. */
    m = tb_eng_msg_new(type, tag, link, vpid, a, alen, b, blen);
    if (NULL == m) {
        tb_eng_rank_fail(r, "out of memory holding a message for it");
        return;
    }
    tb_eng_msg_append(&r->ovf_head, &r->ovf_tail, m);
    r->ovf_bytes += m->len;
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
    tb_eng_rank_post(r, TB_EREC_PEER, 0, (uint16_t) p->idx, 0, &ann, sizeof(ann), NULL, 0);
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
    if (rt.dev >= e->ndev || 0 != (rt.flags & ~TB_EROUTE_F_HOST) || rt.reserved[0]
        || rt.reserved[1]) {
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
    if (0 == rt.ipv4 || 0 == rt.cm_port) {
        return -1;
    }
    peer = tb_eng_peer_for(e, rt.dev, rt.engine_id);
    if (NULL == peer) {
        tb_eng_rank_fail(r, "too many engines to talk to");
        return 0;
    }
    tb_eng_peer_learn(peer, &rt);
    r->routes[h->link] = (int16_t) peer->idx;
    tb_eng_peer_dial(peer);
    return 0;
}

static void set_job_key(tb_engine_t *e, const void *key)
{
    if (e->have_key) {
        if (0 != memcmp(e->job_key, key, sizeof(e->job_key))) {
            TB_WARN("ranks of this job gave different job keys; keeping the first");
        }
        return;
    }
    memcpy(e->job_key, key, sizeof(e->job_key));
    e->have_key = true;
    for (unsigned d = 0; d < e->ndev; ++d) {
        tb_cm_set_secret(e->devs[d].cm, e->job_key);
    }
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
        set_job_key(r->e, p);
        rc = 0;
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

static int rank_tx_progress(eng_rank_t *r)
{
    tb_wire_erec_t h;
    const void *p;
    uint64_t start, end, taken = 0;
    int n = 0, rc;

    r->blocked = false;
    /* A share at a time: the devices are polled between shares, however
     * fast the rank writes (a long pass starves the links' receives). */
    while (ENG_RANK_ATTACHED == r->state && taken < ENG_TX_SHARE) {
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
static int rank_credit_progress(eng_rank_t *r)
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

/* ---- attach, detach, death ----------------------------------------------- */

static void rank_free(eng_rank_t *r)
{
    tb_engine_t *e = r->e;
    eng_msg_t *m, *next;

    tb_eng_peers_forget_rank(e, r);
    for (m = r->ovf_head; m; m = next) {
        next = m->next;
        free(m);
    }
    if (r->seg) {
        munmap(r->seg, r->seg_len);
    }
    if (r->fd >= 0) {
        close(r->fd);
    }
    free(r->rxq);
    free(r->routes);
    memset(r, 0, sizeof(*r));
    r->fd = -1;
    r->state = ENG_RANK_FREE;
    r->e = e;
    r->slot = (unsigned) (r - e->ranks);
    e->nranks--;
    while (e->rank_hwm > 0 && ENG_RANK_FREE == e->ranks[e->rank_hwm - 1].state) {
        e->rank_hwm--;
    }
    e->last_detach_ns = tb_now_ns();
}

/* The host's other ranks may hold routes to r on any device: each hears it
 * on every device's local link. */
static void local_rank_gone(eng_rank_t *r, const char *why)
{
    tb_engine_t *e = r->e;

    for (unsigned i = 0; i < e->rank_hwm; ++i) {
        eng_rank_t *o = &e->ranks[i];
        if (o == r || ENG_RANK_ATTACHED != o->state) {
            continue;
        }
        for (unsigned d = 0; d < e->ndev; ++d) {
            tb_eng_rank_post(o, TB_EREC_GONE, 0, (uint16_t) (TB_ELINK_LOCAL + d), r->vpid, why,
                             strlen(why), NULL, 0);
        }
    }
}

void tb_eng_rank_fail(eng_rank_t *r, const char *why)
{
    char text[200];

    if (ENG_RANK_ATTACHED != r->state) {
        return;
    }
    r->state = ENG_RANK_DEAD;
    if (0 == r->e->faults++) {
        /* What the links held when the job started to fail. */
        tb_eng_peers_log_state(r->e);
        tb_eng_log_loop(r->e);
    }
    if (r->fd >= 0) {
        /* It learns at once that the engine dropped it. */
        close(r->fd);
        r->fd = -1;
    }
    if (!r->bye) {
        snprintf(text, sizeof(text), "rank %u (pid %d) on the engine's host %s", (unsigned) r->vpid,
                 (int) r->pid, why);
        TB_WARN("%s", text);
        tb_eng_peers_rank_gone(r->e, r->vpid, text);
        local_rank_gone(r, text);
    }
}

static void reply_attach(tb_engine_t *e, int fd, uint8_t status, const char *why)
{
    tb_wire_eattach_reply_t rep;

    memset(&rep, 0, sizeof(rep));
    rep.magic = tb_wire_le32(TB_WIRE_ENGINE_MAGIC);
    rep.version = TB_WIRE_ENGINE_VERSION;
    rep.status = status;
    rep.engine_pid = tb_wire_le32((uint32_t) getpid());
    rep.max_record = tb_wire_le32(e->max_record);
    memcpy(rep.engine_id, e->id, sizeof(rep.engine_id));
    snprintf(rep.why, sizeof(rep.why), "%s", why ? why : "");
    if (TB_EATTACH_OK == status) {
        rep.ndevices = (uint8_t) e->ndev;
        for (unsigned d = 0; d < e->ndev; ++d) {
            const tb_device_t *dev = e->devs[d].dev;
            tb_wire_edev_t *o = &rep.devices[d];
            snprintf(o->name, sizeof(o->name), "%s", dev->name);
            snprintf(o->netdev, sizeof(o->netdev), "%s", dev->netdev);
            o->ipv4 = dev->ipv4.s_addr;
            o->netmask = dev->netmask.s_addr;
            memcpy(o->gid, dev->gid.raw, sizeof(o->gid));
            o->cm_port = tb_wire_le16(e->devs[d].port);
        }
    }
    (void) tb_usock_send(fd, &rep, sizeof(rep), -1);
}

static bool key_equal(const uint8_t *a, const uint8_t *b)
{
    uint8_t d = 0;

    for (unsigned i = 0; i < TB_WIRE_SECRET_SIZE; ++i) {
        d |= (uint8_t) (a[i] ^ b[i]);
    }
    return 0 == d;
}

/* A new connection waits among the pending ones until its request arrives
 * (attach_rank); when they are all taken, the oldest gives way. */
static void accept_conn(tb_engine_t *e, uint64_t now)
{
    unsigned i, slot = 0;
    uid_t uid;
    pid_t pid;
    int fd = accept(e->listen_fd, NULL, NULL);

    if (fd < 0) {
        return;
    }
    /* Only this user's processes: anyone else is closed on unheard. */
    if (0 != tb_usock_peer(fd, &uid, &pid) || uid != getuid()) {
        TB_WARN("refused a process of uid %d on the engine's socket", (int) uid);
        close(fd);
        return;
    }
    for (i = 0; i < ENG_MAX_PENDING; ++i) {
        if (e->pending_fd[i] < 0) {
            slot = i;
            break;
        }
        if (e->pending_since[i] < e->pending_since[slot]) {
            slot = i;
        }
    }
    if (e->pending_fd[slot] >= 0) {
        TB_WARN("more than %d processes connected without asking to attach: "
                "dropped the oldest", ENG_MAX_PENDING);
        close(e->pending_fd[slot]);
    }
    e->pending_fd[slot] = fd;
    e->pending_since[slot] = now;
}

/* Connections that said nothing for too long are dropped. */
static void expire_pending(tb_engine_t *e, uint64_t now)
{
    for (unsigned i = 0; i < ENG_MAX_PENDING; ++i) {
        if (e->pending_fd[i] >= 0 && now - e->pending_since[i] > ENG_PENDING_NS) {
            TB_WARN("a process connected and did not ask to attach within %llu s: dropped",
                    (unsigned long long) (ENG_PENDING_NS / 1000000000ull));
            close(e->pending_fd[i]);
            e->pending_fd[i] = -1;
        }
    }
}

/* The request has arrived on fd (poll said so): it is read at once, never
 * waited for. */
static void attach_rank(tb_engine_t *e, int fd)
{
    tb_wire_eattach_t req;
    eng_rank_t *r = NULL;
    uid_t uid;
    pid_t pid;
    const char *why;
    int shm = -1;
    unsigned i;
    void *seg;
    size_t seg_len;

    if (0 != tb_usock_peer(fd, &uid, &pid)
        || 0 != tb_usock_recv(fd, &req, sizeof(req), &shm, 0)) {
        close(fd);
        return;
    }
    if (TB_WIRE_ENGINE_MAGIC != tb_wire_le32(req.magic) || TB_WIRE_ENGINE_VERSION != req.version) {
        reply_attach(e, fd, TB_EATTACH_REFUSED, "another tbrdma version's engine runs for this "
                                                "job (mixed installations?)");
        goto refuse;
    }
    if (!key_equal(req.key, e->key)) {
        reply_attach(e, fd, TB_EATTACH_REFUSED, "wrong job key");
        goto refuse;
    }
    if (e->ndev == 0) {
        reply_attach(e, fd, TB_EATTACH_NODEV, e->nodev_why);
        /* Kept open so the engine lives while ranks may still ask. */
    }
    for (i = 0; i < ENG_MAX_RANKS; ++i) {
        if (ENG_RANK_FREE == e->ranks[i].state) {
            r = &e->ranks[i];
            break;
        }
    }
    if (NULL == r) {
        if (e->ndev) {
            reply_attach(e, fd, TB_EATTACH_FULL, "the engine serves at most 64 ranks per host");
        }
        goto refuse;
    }
    seg_len = tb_shm_ring_segment_size(tb_wire_le64(req.ring_size));
    if (e->ndev && (!tb_shm_ring_size_ok(tb_wire_le64(req.ring_size))
                    || tb_wire_le64(req.ring_size) < TB_ENGINE_MIN_RING)) {
        reply_attach(e, fd, TB_EATTACH_REFUSED, "bad ring size");
        goto refuse;
    }
    /* A segment the rank could still shrink would fault the engine's accesses. */
    if (e->ndev && NULL != (why = tb_shm_segment_check(shm, seg_len))) {
        reply_attach(e, fd, TB_EATTACH_REFUSED, why);
        goto refuse;
    }
    memset(r, 0, sizeof(*r));
    r->e = e;
    r->slot = i;
    if (i + 1 > e->rank_hwm) {
        e->rank_hwm = i + 1;
    }
    r->fd = fd;
    r->vpid = tb_wire_le32(req.vpid);
    r->pid = pid;
    r->state = ENG_RANK_ATTACHED;
    e->nranks++;
    e->ever_attached = true;
    if (0 == e->ndev) {
        r->state = ENG_RANK_NODEV;
        if (shm >= 0) {
            close(shm);
        }
        return;
    }
    seg = mmap(NULL, seg_len, PROT_READ | PROT_WRITE, MAP_SHARED, shm, 0);
    close(shm);
    shm = -1;
    r->routes = malloc(ENG_MAX_ROUTES * sizeof(*r->routes));
    if (MAP_FAILED == seg || NULL == r->routes) {
        r->seg = NULL;
        reply_attach(e, fd, TB_EATTACH_REFUSED, "the engine cannot map the rings");
        r->state = ENG_RANK_DEAD;
        if (MAP_FAILED != seg) {
            munmap(seg, seg_len);
        }
        return;
    }
    for (i = 0; i < ENG_MAX_ROUTES; ++i) {
        r->routes[i] = -1;
    }
    memset(r->route_host, 0, sizeof(r->route_host));
    r->seg = seg;
    r->seg_len = seg_len;
    /* The rank reset both rings before sharing them. */
    tb_shm_ring_attach(&r->tx, seg, tb_wire_le64(req.ring_size), 0, false);
    tb_shm_ring_attach(&r->rx, seg, tb_wire_le64(req.ring_size), 1, false);
    reply_attach(e, fd, TB_EATTACH_OK, NULL);
    TB_INFO("rank %u (pid %d) attached", (unsigned) r->vpid, (int) pid);
    return;

refuse:
    if (shm >= 0) {
        close(shm);
    }
    close(fd);
}

/* ---- the loop ------------------------------------------------------------ */

/* Sockets: new ranks, doorbells, closed ranks.  Sleeps up to timeout_ms. */
static int poll_sockets(tb_engine_t *e, int timeout_ms)
{
    struct pollfd fds[TB_WIRE_ENGINE_MAX_DEVICES + 1 + ENG_MAX_PENDING + ENG_MAX_RANKS];
    /* Per socket polled: the rank, or NULL with the pending slot (-1: listening). */
    eng_rank_t *who[1 + ENG_MAX_PENDING + ENG_MAX_RANKS];
    int pend[1 + ENG_MAX_PENDING + ENG_MAX_RANKS];
    unsigned n = 0, i, nev = 0;
    int rc, work = 0;

    /* Completion events of the devices first, then the sockets. */
    for (i = 0; i < e->ndev; ++i) {
        int fd = tb_domain_event_fd(e->devs[i].dom);
        if (fd >= 0) {
            fds[nev].fd = fd;
            fds[nev++].events = POLLIN;
        }
    }
    n = nev;
    /* The pending connections before the listening socket: a connection
     * accepted in this round may reuse a number closed in it. */
    expire_pending(e, tb_now_ns());
    for (i = 0; i < ENG_MAX_PENDING; ++i) {
        if (e->pending_fd[i] >= 0) {
            fds[n].fd = e->pending_fd[i];
            fds[n].events = POLLIN;
            who[n - nev] = NULL;
            pend[n++ - nev] = (int) i;
        }
    }
    if (e->listen_fd >= 0) {
        fds[n].fd = e->listen_fd;
        fds[n].events = POLLIN;
        who[n - nev] = NULL;
        pend[n++ - nev] = -1;
    }
    for (i = 0; i < e->rank_hwm; ++i) {
        eng_rank_t *r = &e->ranks[i];
        if (ENG_RANK_FREE != r->state && r->fd >= 0) {
            fds[n].fd = r->fd;
            fds[n].events = POLLIN;
            who[n++ - nev] = r;
        }
    }
    rc = poll(fds, n, timeout_ms);
    if (rc <= 0) {
        return 0;
    }
    for (i = 0; i < nev; ++i) {
        if (fds[i].revents) {
            ++work;
        }
    }
    if (work) {
        for (i = 0; i < e->ndev; ++i) {
            tb_domain_event_drain(e->devs[i].dom);
        }
    }
    for (i = nev; i < n; ++i) {
        eng_rank_t *r = who[i - nev];
        char buf[4096];
        ssize_t got;
        if (0 == fds[i].revents) {
            continue;
        }
        ++work;
        if (NULL == r && pend[i - nev] < 0) {
            accept_conn(e, tb_now_ns());
            continue;
        }
        if (NULL == r) {
            e->pending_fd[pend[i - nev]] = -1;
            attach_rank(e, fds[i].fd);
            continue;
        }
        /* Everything the socket holds: a rank that rang thousands of
         * doorbells and died is seen dead only behind the last of them. */
        do {
            got = recv(fds[i].fd, buf, sizeof(buf), MSG_DONTWAIT);
            if (got > 0 && NULL != memchr(buf, TB_EDOORBELL_BYE, (size_t) got)) {
                r->leaving = true;
            }
        } while (got == (ssize_t) sizeof(buf));
        if (got == 0 || (got < 0 && EAGAIN != errno && EWOULDBLOCK != errno && EINTR != errno)) {
            /* The rank is gone; what it left in its ring is still read
             * (ranks_progress), and tells whether it said BYE first. */
            close(r->fd);
            r->fd = -1;
        }
    }
    return work;
}

static int ranks_progress(tb_engine_t *e)
{
    int n = 0;

    for (unsigned i = 0; i < e->rank_hwm; ++i) {
        eng_rank_t *r = &e->ranks[i];
        switch (r->state) {
        case ENG_RANK_ATTACHED:
            n += rank_tx_progress(r);
            n += rank_flush_overflow(r);
            n += rank_credit_progress(r);
            /* Gone: one that said it finalizes leaves once its ring is
             * read; any other died, and its peers hear it now. */
            if (r->fd < 0 && ENG_RANK_ATTACHED == r->state
                && (!(r->leaving || r->bye) || !tb_shm_ring_readable(&r->tx))) {
                if (!r->bye && !r->leaving) {
                    tb_eng_rank_fail(r, "exited without finalizing (killed, or it crashed)");
                }
                r->state = ENG_RANK_DEAD;
            }
            break;
        case ENG_RANK_DEAD:
        case ENG_RANK_NODEV:
            /* Free once the socket is closed and the channels hold no
             * reference to its ring. */
            if (r->fd < 0 && 0 == r->txq_len) {
                rank_free(r);
                ++n;
            }
            break;
        default:
            break;
        }
    }
    return n;
}

static void set_waiting(tb_engine_t *e, bool waiting)
{
    for (unsigned i = 0; i < e->rank_hwm; ++i) {
        if (ENG_RANK_ATTACHED == e->ranks[i].state) {
            tb_shm_ring_set_waiting(&e->ranks[i].tx, waiting);
        }
    }
}

/* A ring with records the engine can take now (a blocked one waits for
 * the engine's own work, which the sleep bound covers). */
static bool rings_readable(tb_engine_t *e)
{
    for (unsigned i = 0; i < e->rank_hwm; ++i) {
        eng_rank_t *r = &e->ranks[i];
        if (ENG_RANK_ATTACHED == r->state && !r->blocked && tb_shm_ring_readable(&r->tx)) {
            return true;
        }
    }
    return false;
}

/* Work that waits on a rank reading its ring (which rings no doorbell) or
 * on the engine's own queues. */
static bool ranks_pending(tb_engine_t *e)
{
    for (unsigned i = 0; i < e->rank_hwm; ++i) {
        eng_rank_t *r = &e->ranks[i];
        if (ENG_RANK_ATTACHED == r->state && (r->blocked || r->ovf_head || r->rxq_len)) {
            return true;
        }
    }
    return false;
}

/* Arm every device's completion events; true when all have them (or there
 * is none), false when one must be polled. */
static bool arm_devices(tb_engine_t *e)
{
    bool all = true;

    for (unsigned d = 0; d < e->ndev; ++d) {
        if (tb_domain_event_fd(e->devs[d].dom) < 0 || 0 != tb_domain_arm(e->devs[d].dom)) {
            all = false;
        }
    }
    e->events = all;
    return true;
}

/* How long the engine may sleep: with completion events, until the next
 * timer that can matter (a retransmission while data is unacknowledged, or
 * a keepalive); without, briefly, since only polling sees incoming frames. */
static int sleep_ms(tb_engine_t *e)
{
    if (0 == e->npeers && 0 == e->nranks) {
        return 100;
    }
    if (ranks_pending(e)) {
        return 1;
    }
    if (!e->events) {
        return (int) ((e->p.sleep_ns + 999999u) / 1000000u);
    }
    if (0 != tb_eng_peers_unacked(e)) {
        return 1;
    }
    /* While traffic flows the channels' timers (delayed acks, keepalives)
     * want it back soon; after a second of silence only keepalives do, a
     * tenth of the peer timeout apart (and arrivals wake it anyway). */
    return tb_now_ns() - e->last_traffic_ns < 1000000000ull ? 20 : 250;
}

#define ENG_SLOW_PASS_NS 1000000000ull

static const char *const phase_name[ENG_PH_SLEEP] = {[ENG_PH_DEVICES] = "devices",
                                                     [ENG_PH_RANKS] = "ranks",
                                                     [ENG_PH_PEERS] = "peers",
                                                     [ENG_PH_SOCKETS] = "sockets"};

static uint64_t phase_end(tb_engine_t *e, int phase, uint64_t start)
{
    uint64_t now = tb_now_ns();

    if (now - start > e->max_ns[phase]) {
        e->max_ns[phase] = now - start;
    }
    /* Peers give up after engine_peer_timeout without an acknowledgement:
     * a pass this long is said when it happens, not only at the end. */
    if (now - start > ENG_SLOW_PASS_NS && phase != ENG_PH_SLEEP) {
        TB_WARN("one pass of the engine's %s phase took %llu ms", phase_name[phase],
                (unsigned long long) ((now - start) / 1000000));
    }
    return now;
}

void tb_eng_log_loop(const tb_engine_t *e)
{
    TB_WARN("the engine's longest loop phases (ms): devices %.1f, ranks %.1f, peers %.1f, "
            "sockets %.1f, sleep %.1f; longest gap between device polls %.1f",
            e->max_ns[ENG_PH_DEVICES] / 1e6, e->max_ns[ENG_PH_RANKS] / 1e6,
            e->max_ns[ENG_PH_PEERS] / 1e6, e->max_ns[ENG_PH_SOCKETS] / 1e6,
            e->max_ns[ENG_PH_SLEEP] / 1e6, e->max_ns[ENG_PH_GAP] / 1e6);
}

int tb_engine_run(tb_engine_t *e)
{
    uint64_t now = tb_now_ns(), last_work = now, last_sockets = 0, drain_end = 0;
    uint64_t started = now, polled = now, rx_seen = 0, t;

    for (;;) {
        int work = 0, w, from_ranks;

        now = tb_now_ns();
        if (now - polled > e->max_ns[ENG_PH_GAP]) {
            e->max_ns[ENG_PH_GAP] = now - polled;
        }
        if (now - polled > ENG_SLOW_PASS_NS) {
            TB_WARN("the engine polled no device for %llu ms",
                    (unsigned long long) ((now - polled) / 1000000));
        }
        polled = now;
        /* A phase is timed only when it did something: an idle pass, which
         * decides how soon a message is seen, reads the clock once. */
        t = now;
        w = tb_eng_devices_progress(e, now);
        t = w ? phase_end(e, ENG_PH_DEVICES, t) : t;
        work += w;
        w = from_ranks = ranks_progress(e);
        t = w ? phase_end(e, ENG_PH_RANKS, t) : t;
        work += w;
        w = tb_eng_peers_progress(e, now);
        t = w ? phase_end(e, ENG_PH_PEERS, t) : t;
        work += w;
        if (now - last_sockets >= 1000000ull) {
            last_sockets = now;
            work += poll_sockets(e, 0);
            (void) phase_end(e, ENG_PH_SOCKETS, t);
        }
        if (work) {
            last_work = now;
        }
        /* The channels' keepalives and acks must not hold the engine in its
         * short sleeps: they made an idle engine wake 60 times a second. */
        if (from_ranks || e->rx_msgs != rx_seen) {
            rx_seen = e->rx_msgs;
            e->last_traffic_ns = now;
        }
        if (0 == e->nranks) {
            if (!e->ever_attached && now - started > e->p.idle_exit_ns) {
                TB_INFO("no rank attached for %llu s: exiting",
                        (unsigned long long) (e->p.idle_exit_ns / 1000000000ull));
                return 0;
            }
            if (e->ever_attached) {
                /* Every rank left: no new one is taken (a rank of the job
                 * arriving now starts the next engine); give the channels a
                 * moment to deliver what they still hold, then say goodbye. */
                if (0 == drain_end) {
                    drain_end = now + 2000000000ull;
                    close(e->listen_fd);
                    e->listen_fd = -1;
                    (void) unlink(e->sock_path);
                }
                if (0 == tb_eng_peers_unacked(e) || now > drain_end) {
                    tb_eng_peers_close(e);
                    e->finished = true;
                    return 0;
                }
            }
        } else {
            drain_end = 0;
        }
        if (now - last_work < e->p.spin_ns) {
            continue;
        }
        /* Idle: sleep until a rank rings, a socket changes, a completion
         * comes (where the devices have events), or a timer may be due.  The
         * flag and the events first, then one more look, so what came in
         * between is not missed. */
        set_waiting(e, true);
        if (!rings_readable(e) && arm_devices(e) && 0 == tb_eng_devices_progress(e, tb_now_ns())) {
            int ms = sleep_ms(e);
            t = tb_now_ns();
            if (poll_sockets(e, ms)) {
                last_work = tb_now_ns();
            }
            (void) phase_end(e, ENG_PH_SLEEP, t);
            last_sockets = tb_now_ns();
        } else {
            last_work = tb_now_ns();
        }
        set_waiting(e, false);
    }
}

/* ---- create and destroy -------------------------------------------------- */

int tb_engine_create(const tb_engine_params_t *p, tb_engine_t **out, char *err, size_t errlen)
{
    tb_engine_t *e = calloc(1, sizeof(*e));
    char path[512];
    FILE *f;
    unsigned i;

    if (NULL == e) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    e->p = *p;
    e->listen_fd = -1;
    for (i = 0; i < ENG_MAX_PENDING; ++i) {
        e->pending_fd[i] = -1;
    }
    for (i = 0; i < ENG_MAX_RANKS; ++i) {
        e->ranks[i].e = e;
        e->ranks[i].slot = i;
        e->ranks[i].fd = -1;
    }
    /* The largest record a rank's ring takes bounds every message. */
    e->max_record = TB_ENGINE_MAX_MSG;
    if (0 != tb_random_bytes(e->id, sizeof(e->id))) {
        snprintf(err, errlen, "no random source for the engine's identity: %s", strerror(errno));
        goto fail;
    }
    snprintf(path, sizeof(path), "%s/%s", p->dir, TB_ENGINE_KEY);
    f = fopen(path, "rb");
    if (NULL == f || 1 != fread(e->key, sizeof(e->key), 1, f)) {
        snprintf(err, errlen, "cannot read the job key %s: %s", path,
                 f ? "too short" : strerror(errno));
        if (f) {
            fclose(f);
        }
        goto fail;
    }
    fclose(f);
    /* Who runs the directory: ranks tell a live engine from a dead one by it. */
    snprintf(path, sizeof(path), "%s/%s", p->dir, TB_ENGINE_PIDFILE);
    f = fopen(path, "w");
    if (NULL == f || fprintf(f, "%d\n", (int) getpid()) < 0 || 0 != fclose(f)) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        goto fail;
    }
    if (0 != tb_eng_devices_open(e, e->nodev_why, sizeof(e->nodev_why))) {
        TB_INFO("no device: %s", e->nodev_why);
    }
    snprintf(e->sock_path, sizeof(e->sock_path), "%s/%s", p->dir, TB_ENGINE_SOCKET);
    snprintf(path, sizeof(path), "%s/%s.%d", p->dir, TB_ENGINE_SOCKET, (int) getpid());
    (void) unlink(path);
    e->listen_fd = tb_usock_listen(path);
    /* Listening before the name appears: a rank that can connect can attach. */
    if (e->listen_fd < 0 || 0 != rename(path, e->sock_path)) {
        snprintf(err, errlen, "cannot listen at %s: %s", e->sock_path, strerror(errno));
        (void) unlink(path);
        goto fail;
    }
    *out = e;
    return 0;

fail:
    tb_engine_destroy(e);
    return -1;
}

void tb_engine_destroy(tb_engine_t *e)
{
    if (NULL == e) {
        return;
    }
    for (unsigned i = 0; i < ENG_MAX_RANKS; ++i) {
        eng_rank_t *r = &e->ranks[i];
        if (ENG_RANK_FREE != r->state) {
            r->state = ENG_RANK_DEAD;
        }
    }
    tb_eng_cms_close(e);
    tb_eng_peers_destroy(e);
    for (unsigned i = 0; i < ENG_MAX_RANKS; ++i) {
        if (ENG_RANK_FREE != e->ranks[i].state) {
            rank_free(&e->ranks[i]);
        }
    }
    tb_eng_devices_close(e);
    for (unsigned i = 0; i < ENG_MAX_PENDING; ++i) {
        if (e->pending_fd[i] >= 0) {
            close(e->pending_fd[i]);
        }
    }
    if (e->listen_fd >= 0) {
        close(e->listen_fd);
        (void) unlink(e->sock_path);
    }
    if (e->finished && tb_jobdir_engine_pid(e->p.dir) == getpid()) {
        /* The job is over on this host: leave nothing behind, unless a rank
         * holds the lock to start the next engine (a late rank of the job).
         * After a fault the log (and the lock) stay, for the user the ranks'
         * messages send there; later jobs sweep them (tb_eclient.c). */
        static const char *const files[] = {TB_ENGINE_KEY, TB_ENGINE_PIDFILE,
                                            /* kept after a fault: */ TB_ENGINE_LOCK,
                                            "engine.log"};
        const size_t nfiles = e->faults ? 2 : sizeof(files) / sizeof(files[0]);
        char path[600];
        int lock;
        snprintf(path, sizeof(path), "%s/%s", e->p.dir, TB_ENGINE_LOCK);
        lock = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
        if (lock >= 0 && 0 == flock(lock, LOCK_EX | LOCK_NB)) {
            if (e->faults) {
                TB_INFO("%u fault%s in this job: keeping this log", e->faults,
                        1 == e->faults ? "" : "s");
            }
            for (size_t i = 0; i < nfiles; ++i) {
                snprintf(path, sizeof(path), "%s/%s", e->p.dir, files[i]);
                (void) unlink(path);
            }
            (void) rmdir(e->p.dir);
        }
        if (lock >= 0) {
            close(lock);
        }
    }
    free(e);
}
