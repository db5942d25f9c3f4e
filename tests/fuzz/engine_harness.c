/*
 * A host engine assembled in memory (engine_harness.h).
 */
#include "engine_harness.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

int eh_init(eng_harness_t *h)
{
    tb_engine_t *e = calloc(1, sizeof(*e));

    memset(h, 0, sizeof(*h));
    if (NULL == e) {
        return -1;
    }
    h->e = e;
    tb_engine_params_default(&e->p);
    e->listen_fd = -1;
    for (unsigned i = 0; i < ENG_MAX_PENDING; ++i) {
        e->pending_fd[i] = -1;
    }
    for (unsigned i = 0; i < ENG_MAX_RANKS; ++i) {
        e->ranks[i].e = e;
        e->ranks[i].slot = i;
        e->ranks[i].fd = -1;
    }
    memcpy(e->id, "harness-engine", 14);
    e->max_record = TB_ENGINE_MAX_MSG;
    strcpy(h->dev.name, "fake0");
    strcpy(h->dev.netdev, "fake0");
    e->ndev = 1;
    e->devs[0].e = e;
    e->devs[0].dev = &h->dev;
    for (unsigned i = 0; i < EH_RANKS; ++i) {
        eng_rank_t *r = &e->ranks[i];
        h->seg[i] = aligned_alloc(4096, tb_shm_ring_segment_size(EH_RING));
        r->routes = malloc(ENG_MAX_ROUTES * sizeof(*r->routes));
        if (NULL == h->seg[i] || NULL == r->routes) {
            return -1;
        }
        for (unsigned k = 0; k < ENG_MAX_ROUTES; ++k) {
            r->routes[k] = -1;
        }
        tb_shm_ring_attach(&h->to_engine[i], h->seg[i], EH_RING, 0, true);
        tb_shm_ring_attach(&h->from_engine[i], h->seg[i], EH_RING, 1, true);
        tb_shm_ring_attach(&r->tx, h->seg[i], EH_RING, 0, false);
        tb_shm_ring_attach(&r->rx, h->seg[i], EH_RING, 1, false);
        r->vpid = i;
        r->pid = (pid_t) EH_PID(i);
        r->state = ENG_RANK_ATTACHED;
        e->nranks++;
        e->rank_hwm = i + 1;
    }
    e->ever_attached = true;
    return 0;
}

void eh_fini(eng_harness_t *h)
{
    tb_engine_t *e = h->e;

    if (NULL == e) {
        return;
    }
    for (unsigned i = 0; i < e->rank_hwm; ++i) {
        if (ENG_RANK_FREE != e->ranks[i].state) {
            e->ranks[i].txq_len = 0;
            tb_eng_rank_free(&e->ranks[i]);
        }
    }
    tb_eng_peers_destroy(e);
    for (unsigned i = 0; i < EH_RANKS; ++i) {
        free(h->seg[i]);
    }
    free(e);
    h->e = NULL;
}

eng_peer_t *eh_peer(eng_harness_t *h, unsigned n)
{
    return eh_peer_on(h, n, 0);
}

eng_peer_t *eh_peer_on(eng_harness_t *h, unsigned n, unsigned dev)
{
    uint8_t id[TB_WIRE_ENGINE_ID_SIZE] = {'p', 'e', 'e', 'r'};
    eng_peer_t *p;

    memcpy(id + 8, &n, sizeof(n));
    p = tb_eng_peer_for(h->e, dev, id, true);
    if (p && ENG_PEER_IDLE == p->state) {
        p->known = true;
        p->ipv4 = 0x0100007f;
        p->state = ENG_PEER_CONNECTED;
    }
    return p;
}

/* n entries of a job's table: entry i is host[i]'s device dev[i] at
 * addr[i] (each /30 a cable), the hosts named by ids[host]. */
static void fill_table(tb_wire_ehost_t *ent, unsigned n, const uint8_t *const *ids,
                       const unsigned *host, const unsigned *dev, const uint32_t *addr)
{
    memset(ent, 0, n * sizeof(*ent));
    for (unsigned i = 0; i < n; ++i) {
        memcpy(ent[i].engine_id, ids[host[i]], sizeof(ent[i].engine_id));
        ent[i].ipv4 = htonl(addr[i]);
        ent[i].netmask = htonl(0xfffffffcu);
        ent[i].cm_port = tb_wire_le16(4000);
        ent[i].dev = (uint8_t) dev[i];
    }
}

/* The job's table of a line of three, host 0 - host 1 - host 2, four
 * entries (fill_table). */
static void fill_line_table(eng_harness_t *h, const uint8_t *const ids[3],
                            const uint32_t addr[4])
{
    static const unsigned host[4] = {0, 1, 1, 2}, dev[4] = {0, 0, 1, 0};

    fill_table(h->relay_table, 4, ids, host, dev, addr);
}

void eh_relay_table(eng_harness_t *h)
{
    /* 10.0.2.0/30 joins this engine and peer 1, 10.0.1.0/30 peer 1 and
     * peer 2 */
    static const uint32_t addr[4] = {0x0a000202, 0x0a000201, 0x0a000102, 0x0a000101};
    const uint8_t *ids[3] = {h->e->id, eh_peer(h, 1)->id, eh_peer(h, 2)->id};

    fill_line_table(h, ids, addr);
    h->dev.ipv4.s_addr = htonl(addr[0]);
    h->dev.netmask.s_addr = htonl(0xfffffffcu);
}

static int ring_entry_cmp(const void *a, const void *b)
{
    const tb_wire_ehost_t *x = a, *y = b;
    int c = memcmp(x->engine_id, y->engine_id, sizeof(x->engine_id));

    return c ? c : (int) x->dev - (int) y->dev;
}

void eh_ring_table(eng_harness_t *h)
{
    /* Host n's device 0 is the cable to host n - 1's device 1, except this
     * engine's: its device 0 leads to peer 1, 1 to peer 3 (ids sort this
     * engine first, then peers 1, 2, 3). */
    static const unsigned host[8] = {0, 0, 1, 1, 2, 2, 3, 3}, dev[8] = {0, 1, 0, 1, 0, 1, 0, 1};
    static const uint32_t addr[8] = {0x0a000101, 0x0a000402, 0x0a000102, 0x0a000201,
                                     0x0a000202, 0x0a000301, 0x0a000302, 0x0a000401};
    const uint8_t *ids[4];

    if (h->e->ndev < 2) {
        eh_second_device(h);
    }
    ids[0] = h->e->id;
    ids[1] = eh_peer_on(h, 1, 0)->id;
    ids[2] = eh_peer_on(h, 2, 0)->id;
    ids[3] = eh_peer_on(h, 3, 1)->id;
    fill_table(h->ring_table, 8, ids, host, dev, addr);
    qsort(h->ring_table, 8, sizeof(h->ring_table[0]), ring_entry_cmp);
    h->dev.ipv4.s_addr = htonl(addr[0]);
    h->dev.netmask.s_addr = htonl(0xfffffffcu);
    h->dev2.ipv4.s_addr = htonl(addr[1]);
    h->dev2.netmask.s_addr = htonl(0xfffffffcu);
}

void eh_second_device(eng_harness_t *h)
{
    tb_engine_t *e = h->e;

    strcpy(h->dev2.name, "fake1");
    strcpy(h->dev2.netdev, "fake1");
    e->devs[1].e = e;
    e->devs[1].idx = 1;
    e->devs[1].dev = &h->dev2;
    e->ndev = 2;
}

void eh_relay_middle(eng_harness_t *h, eng_peer_t **first, eng_peer_t **last)
{
    /* 10.0.1.0/30 joins peer 1 and this engine's device 0, 10.0.2.0/30 its
     * device 1 and peer 2 */
    static const uint32_t addr[4] = {0x0a000101, 0x0a000102, 0x0a000201, 0x0a000202};
    tb_engine_t *e = h->e;
    const uint8_t *ids[3];

    eh_second_device(h);
    *first = eh_peer(h, 1);
    memcpy(e->id, (*first)->id, sizeof(e->id));
    e->id[12] = 'm'; /* after peer 1's id, before peer 2's */
    *last = eh_peer_on(h, 2, 1);
    ids[0] = (*first)->id;
    ids[1] = e->id;
    ids[2] = (*last)->id;
    fill_line_table(h, ids, addr);
    h->dev.ipv4.s_addr = htonl(addr[1]);
    h->dev.netmask.s_addr = htonl(0xfffffffcu);
    h->dev2.ipv4.s_addr = htonl(addr[2]);
    h->dev2.netmask.s_addr = htonl(0xfffffffcu);
}

int eh_rank_write(eng_harness_t *h, unsigned i, uint8_t type, uint8_t tag, uint16_t link,
                  uint32_t vpid, bool right_pid, const void *data, size_t len)
{
    const struct iovec iov = {(void *) data, len};
    uint32_t pid = TB_EREC_SEND == type ? EH_PID(vpid) + (right_pid ? 0 : 77) : 0;

    return tb_shm_ring_put(&h->to_engine[i], type, tag, link, vpid, pid, &iov, 1) < 0 ? -1 : 0;
}

unsigned eh_rank_read(eng_harness_t *h, unsigned i, unsigned max, uint8_t type,
                      unsigned *counted)
{
    tb_shm_ring_t *r = &h->from_engine[i];
    unsigned n = 0;

    if (counted) {
        *counted = 0;
    }
    while (n < max) {
        tb_wire_erec_t hdr;
        uint64_t end;
        if (NULL == tb_shm_ring_next(r, &hdr, &end)) {
            break;
        }
        if (counted && hdr.type == type) {
            (*counted)++;
            h->last_pid = hdr.pid;
        }
        tb_shm_ring_release_to(r, end);
        n++;
    }
    return n;
}

void eh_progress(eng_harness_t *h)
{
    tb_engine_t *e = h->e;

    for (unsigned i = 0; i < e->rank_hwm; ++i) {
        eng_rank_t *r = &e->ranks[i];
        if (ENG_RANK_ATTACHED == r->state) {
            (void) tb_eng_rank_tx_progress(r);
            (void) tb_eng_rank_flush_overflow(r);
            (void) tb_eng_rank_credit_progress(r);
        }
    }
    (void) tb_eng_peers_progress(e, tb_now_ns());
}

const char *eh_check(const eng_harness_t *h)
{
    const tb_engine_t *e = h->e;
    /* A bound is checked before a message is taken, so one message (at
     * most a record) may go past it. */
    const uint64_t slack = ENG_MSG_COST(TB_ENGINE_MAX_MSG + sizeof(tb_wire_emsg_t));

    for (unsigned i = 0; i < e->rank_hwm; ++i) {
        const eng_rank_t *r = &e->ranks[i];
        uint64_t ovf = 0;
        if (ENG_RANK_ATTACHED != r->state) {
            continue;
        }
        for (const eng_msg_t *m = r->ovf_head; m; m = m->next) {
            ovf += ENG_MSG_COST(m->len);
        }
        if (ovf != r->ovf_bytes) {
            return "a rank's held records are not what it counts";
        }
        if (r->held_bytes > e->p.held_max + slack) {
            return "a rank's messages waiting for credit exceed held_max";
        }
        /* Held for it: from this host's ranks up to held_max, from each peer
         * engine up to its credit window, and notices (one per rank or peer
         * gone, of at most 256 bytes). */
        if (r->ovf_bytes > e->p.held_max + slack + e->npeers * (e->p.credit_window + slack)
                               + (e->npeers + 1) * ENG_MAX_RANKS * ENG_MSG_COST(256)) {
            return "what the engine holds for a rank exceeds its bounds";
        }
    }
    for (unsigned i = 0; i < e->npeers; ++i) {
        const eng_peer_t *p = e->peers[i];
        uint64_t notices = 0;
        if (p->ndst > ENG_DST_MAX || p->ngone > ENG_MAX_RANKS) {
            return "a peer's tables grew past what one engine serves";
        }
        for (unsigned s = 0; s < ENG_MAX_RANKS; ++s) {
            if (p->delivered[s] > e->p.credit_window + slack) {
                return "a peer delivered past the credit window";
            }
        }
        for (const eng_msg_t *m = p->notice_head; m; m = m->next) {
            notices++;
        }
        if (notices != p->nnotices || notices > 2 * ENG_MAX_RANKS) {
            return "a peer holds more notices than there are ranks";
        }
    }
    return NULL;
}
