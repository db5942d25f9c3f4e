/*
 * A deterministic in-process link pair for testing the reliable channel
 * (see tb_lossy_link.h).
 */
#include "tb_lossy_link.h"

#include <stdlib.h>
#include <string.h>

typedef struct packet {
    struct packet *next;
    uint64_t due;
    int dst;
    unsigned lane;
    size_t len;
    unsigned char data[];
} packet_t;

typedef struct event {
    struct event *next;
    int is_recv;
    unsigned lane;
    void *buf;
    size_t len;
    void *cookie;
    int status;
} event_t;

typedef struct pool {
    void **all;
    void **free;
    unsigned n;
    unsigned nfree;
} pool_t;

typedef struct lane_state {
    pool_t send;
    pool_t recv;
    void **posted; /* FIFO of posted receives */
    unsigned posted_head;
    unsigned posted_count;
} lane_state_t;

typedef struct side {
    tb_link_t link; /* first: the channel sees this */
    tb_lossy_net_t *net;
    int index;
    int dead;
    int fail_next_send;
    tb_channel_t *ch;
    lane_state_t lanes[TB_WIRE_MAX_LANES];
    event_t *cq_head;
    event_t *cq_tail;
} side_t;

struct tb_lossy_net {
    tb_lossy_cfg_t cfg;
    uint64_t rng;
    uint64_t now;
    side_t sides[2];
    packet_t *wire; /* sorted by due, stable */
    tb_lossy_stats_t stats;
};

static uint64_t rng_next(tb_lossy_net_t *net)
{
    uint64_t z = (net->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int chance(tb_lossy_net_t *net, double p)
{
    return p > 0 && (double) (rng_next(net) >> 11) * (1.0 / 9007199254740992.0) < p;
}

void tb_lossy_cfg_default(tb_lossy_cfg_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->seed = 1;
    cfg->delay_ns = 5000;
    cfg->reorder_ns = 20000;
    cfg->nlanes = 2;
    cfg->frame_size[0] = 4096;
    cfg->frame_size[1] = 65536;
    for (unsigned l = 0; l < TB_WIRE_MAX_LANES; l++) {
        cfg->send_slots[l] = 64;
        cfg->recv_slots[l] = 32;
    }
    cfg->poll_budget = 64;
}

static int pool_init(pool_t *p, unsigned n, size_t size)
{
    p->all = calloc(n, sizeof(void *));
    p->free = calloc(n, sizeof(void *));
    if (!p->all || !p->free) {
        return -1;
    }
    for (unsigned i = 0; i < n; i++) {
        p->all[i] = malloc(size);
        if (!p->all[i]) {
            return -1;
        }
        memset(p->all[i], 0xa5, size);
        p->free[p->nfree++] = p->all[i];
        p->n++;
    }
    return 0;
}

static void pool_fini(pool_t *p)
{
    for (unsigned i = 0; i < p->n; i++) {
        free(p->all[i]);
    }
    free(p->all);
    free(p->free);
}

static void *pool_get(pool_t *p)
{
    return p->nfree ? p->free[--p->nfree] : NULL;
}

static int has(void *const *v, unsigned n, const void *buf)
{
    for (unsigned i = 0; i < n; i++) {
        if (v[i] == buf) {
            return 1;
        }
    }
    return 0;
}

/* A put of NULL, of another pool's memory or of a slot already free is
 * counted and ignored (the engine must never make one). */
static void pool_put(tb_lossy_net_t *net, pool_t *p, void *buf)
{
    if (!buf || !has(p->all, p->n, buf) || has(p->free, p->nfree, buf)) {
        net->stats.bad_puts++;
        return;
    }
    p->free[p->nfree++] = buf;
}

static void cq_push(side_t *s, event_t *e)
{
    e->next = NULL;
    if (s->cq_tail) {
        s->cq_tail->next = e;
    } else {
        s->cq_head = e;
    }
    s->cq_tail = e;
}

static void wire_insert(tb_lossy_net_t *net, packet_t *p)
{
    packet_t **pp = &net->wire;
    while (*pp && (*pp)->due <= p->due) {
        pp = &(*pp)->next;
    }
    p->next = *pp;
    *pp = p;
}

static packet_t *packet_new(int dst, unsigned lane, const void *data, size_t len, uint64_t due)
{
    packet_t *p = malloc(sizeof(*p) + len);
    if (p) {
        p->dst = dst;
        p->lane = lane;
        p->len = len;
        p->due = due;
        memcpy(p->data, data, len);
    }
    return p;
}

/* --- link operations ------------------------------------------------ */

static void op_local_addr(tb_link_t *link, tb_wire_addr_t *addr)
{
    side_t *s = (side_t *) link;
    memset(addr->gid, 0, sizeof(addr->gid));
    addr->gid[15] = (uint8_t) (s->index + 1);
    for (unsigned l = 0; l < s->net->cfg.nlanes; l++) {
        addr->qpn[l] = tb_wire_le32((uint32_t) (0x100 * (s->index + 1) + l));
    }
    addr->mtu = tb_wire_le16(4096);
}

static int op_connect(tb_link_t *link, const tb_wire_addr_t *peer)
{
    (void) link;
    (void) peer;
    return 0;
}

static void *op_send_buf_get(tb_link_t *link, unsigned lane)
{
    return pool_get(&((side_t *) link)->lanes[lane].send);
}

static void op_send_buf_put(tb_link_t *link, unsigned lane, void *buf)
{
    side_t *s = (side_t *) link;
    pool_put(s->net, &s->lanes[lane].send, buf);
}

static void *op_recv_buf_get(tb_link_t *link, unsigned lane)
{
    return pool_get(&((side_t *) link)->lanes[lane].recv);
}

static void op_recv_buf_put(tb_link_t *link, unsigned lane, void *buf)
{
    side_t *s = (side_t *) link;
    pool_put(s->net, &s->lanes[lane].recv, buf);
}

static int op_post_send(tb_link_t *link, unsigned lane, void *buf, size_t len, void *cookie)
{
    side_t *s = (side_t *) link;
    tb_lossy_net_t *net = s->net;
    event_t *e = malloc(sizeof(*e));
    int copies = 1;

    if (!e) {
        return -1;
    }
    e->is_recv = 0;
    e->lane = lane;
    e->buf = buf;
    e->len = len;
    e->cookie = cookie;
    e->status = 0;
    cq_push(s, e);
    net->stats.posted++;
    if (s->fail_next_send) {
        s->fail_next_send = 0;
        e->status = -5; /* as a flushed or failed work request: nothing goes out */
        return 0;
    }
    if (len > net->cfg.frame_size[lane]) {
        net->stats.bad_posts++;
        return 0;
    }
    /* The lane's draw only when it has a loss of its own: seeded runs of
     * other tests keep their sequence. */
    if (chance(net, net->cfg.loss)
        || (net->cfg.lane_loss[lane] > 0 && chance(net, net->cfg.lane_loss[lane]))) {
        net->stats.lost++;
        return 0;
    }
    if (chance(net, net->cfg.dup)) {
        net->stats.duplicated++;
        copies = 2;
    }
    for (int c = 0; c < copies; c++) {
        uint64_t due = net->now + net->cfg.delay_ns + (uint64_t) c;
        packet_t *p;
        if (chance(net, net->cfg.reorder)) {
            net->stats.reordered++;
            due += net->cfg.reorder_ns;
        }
        p = packet_new(1 - s->index, lane, buf, len, due);
        if (!p) {
            return -1;
        }
        if (len > 0 && chance(net, net->cfg.corrupt)) {
            uint64_t bit = rng_next(net) % (len * 8);
            p->data[bit / 8] ^= (unsigned char) (1u << (bit % 8));
            net->stats.corrupted++;
        }
        wire_insert(net, p);
    }
    return 0;
}

static int op_post_recv(tb_link_t *link, unsigned lane, void *buf)
{
    side_t *s = (side_t *) link;
    lane_state_t *ls = &s->lanes[lane];
    unsigned cap = s->net->cfg.recv_slots[lane];

    if (ls->posted_count == cap) {
        return -1;
    }
    ls->posted[(ls->posted_head + ls->posted_count++) % cap] = buf;
    return 0;
}

static const tb_link_ops_t lossy_ops = {
    .local_addr = op_local_addr,
    .connect = op_connect,
    .send_buf_get = op_send_buf_get,
    .send_buf_put = op_send_buf_put,
    .recv_buf_get = op_recv_buf_get,
    .recv_buf_put = op_recv_buf_put,
    .post_send = op_post_send,
    .post_recv = op_post_recv,
};

/* --- the network ---------------------------------------------------- */

tb_lossy_net_t *tb_lossy_net_create(const tb_lossy_cfg_t *cfg)
{
    tb_lossy_net_t *net = calloc(1, sizeof(*net));

    if (!net) {
        return NULL;
    }
    net->cfg = *cfg;
    net->rng = cfg->seed;
    for (int i = 0; i < 2; i++) {
        side_t *s = &net->sides[i];
        s->link.ops = &lossy_ops;
        s->net = net;
        s->index = i;
        for (unsigned l = 0; l < cfg->nlanes; l++) {
            lane_state_t *ls = &s->lanes[l];
            ls->posted = calloc(cfg->recv_slots[l], sizeof(void *));
            if (!ls->posted || pool_init(&ls->send, cfg->send_slots[l], cfg->frame_size[l]) != 0
                || pool_init(&ls->recv, cfg->recv_slots[l], cfg->frame_size[l]) != 0) {
                tb_lossy_net_destroy(net);
                return NULL;
            }
        }
    }
    return net;
}

void tb_lossy_reset_side(tb_lossy_net_t *net, int side)
{
    side_t *s = &net->sides[side];

    while (s->cq_head) {
        event_t *e = s->cq_head;
        s->cq_head = e->next;
        free(e);
    }
    s->cq_tail = NULL;
    for (unsigned l = 0; l < net->cfg.nlanes; l++) {
        s->lanes[l].posted_count = 0;
        s->lanes[l].posted_head = 0;
    }
}

void tb_lossy_net_destroy(tb_lossy_net_t *net)
{
    if (!net) {
        return;
    }
    while (net->wire) {
        packet_t *p = net->wire;
        net->wire = p->next;
        free(p);
    }
    for (int i = 0; i < 2; i++) {
        tb_lossy_reset_side(net, i);
        for (unsigned l = 0; l < net->cfg.nlanes; l++) {
            pool_fini(&net->sides[i].lanes[l].send);
            pool_fini(&net->sides[i].lanes[l].recv);
            free(net->sides[i].lanes[l].posted);
        }
    }
    free(net);
}

void tb_lossy_set_cfg(tb_lossy_net_t *net, const tb_lossy_cfg_t *cfg)
{
    net->cfg.loss = cfg->loss;
    memcpy(net->cfg.lane_loss, cfg->lane_loss, sizeof(net->cfg.lane_loss));
    net->cfg.dup = cfg->dup;
    net->cfg.corrupt = cfg->corrupt;
    net->cfg.reorder = cfg->reorder;
    net->cfg.delay_ns = cfg->delay_ns;
    net->cfg.reorder_ns = cfg->reorder_ns;
    net->cfg.poll_budget = cfg->poll_budget;
}

tb_link_t *tb_lossy_link(tb_lossy_net_t *net, int side)
{
    return &net->sides[side].link;
}

void tb_lossy_attach(tb_lossy_net_t *net, int side, tb_channel_t *ch)
{
    net->sides[side].ch = ch;
}

void tb_lossy_set_dead(tb_lossy_net_t *net, int side, int dead)
{
    net->sides[side].dead = dead;
}

void tb_lossy_fail_next_send(tb_lossy_net_t *net, int side)
{
    net->sides[side].fail_next_send = 1;
}

/* A frame reaches side's lane: it lands in the oldest posted receive. */
static void arrive(tb_lossy_net_t *net, int side, unsigned lane, const unsigned char *data,
                   size_t len)
{
    side_t *s = &net->sides[side];
    lane_state_t *ls = &s->lanes[lane];
    unsigned cap = net->cfg.recv_slots[lane];
    event_t *e;
    void *buf;

    if (ls->posted_count == 0) {
        net->stats.no_recv_drops++;
        return;
    }
    if (tb_wire_hw_frames(len) != net->cfg.frame_size[lane] / TB_WIRE_HW_FRAME) {
        net->stats.frame_mismatch++;
        return;
    }
    buf = ls->posted[ls->posted_head];
    ls->posted_head = (ls->posted_head + 1) % cap;
    ls->posted_count--;
    memcpy(buf, data, len);
    e = malloc(sizeof(*e));
    if (!e) {
        abort();
    }
    e->is_recv = 1;
    e->lane = lane;
    e->buf = buf;
    e->len = len;
    e->cookie = NULL;
    e->status = 0;
    cq_push(s, e);
    net->stats.delivered++;
}

void tb_lossy_inject(tb_lossy_net_t *net, int side, unsigned lane, const void *data,
                     size_t len)
{
    arrive(net, side, lane, data, len);
}

void tb_lossy_step(tb_lossy_net_t *net, uint64_t now)
{
    net->now = now;
    while (net->wire && net->wire->due <= now) {
        packet_t *p = net->wire;
        net->wire = p->next;
        arrive(net, p->dst, p->lane, p->data, p->len);
        free(p);
    }
    for (int i = 0; i < 2; i++) {
        side_t *s = &net->sides[i];
        if (s->dead || !s->ch) {
            continue;
        }
        for (unsigned n = 0; n < net->cfg.poll_budget && s->cq_head; n++) {
            event_t *e = s->cq_head;
            s->cq_head = e->next;
            if (!s->cq_head) {
                s->cq_tail = NULL;
            }
            if (e->is_recv) {
                tb_channel_recv_done(s->ch, e->lane, e->buf, e->len, 0);
            } else {
                tb_channel_send_done(s->ch, e->cookie, e->status);
            }
            free(e);
        }
        tb_channel_progress(s->ch, now);
    }
}

int tb_lossy_idle(const tb_lossy_net_t *net)
{
    for (int i = 0; i < 2; i++) {
        if (net->sides[i].cq_head && !net->sides[i].dead && net->sides[i].ch) {
            return 0;
        }
    }
    return !net->wire;
}

unsigned tb_lossy_slots_out(const tb_lossy_net_t *net, int side)
{
    unsigned out = 0;
    for (unsigned l = 0; l < net->cfg.nlanes; l++) {
        const lane_state_t *ls = &net->sides[side].lanes[l];
        out += ls->send.n - ls->send.nfree + ls->recv.n - ls->recv.nfree;
    }
    return out;
}

const tb_lossy_stats_t *tb_lossy_stats(const tb_lossy_net_t *net)
{
    return &net->stats;
}
