/*
 * tbrdma common layer: a device's transport resources and the connections
 * over them (see tb_domain.h).
 *
 * Completions of destroyed connections: a connection occupies a slot of the
 * domain's table, and its work request ids carry the slot index and the
 * slot's generation.  Destroying the connection bumps the generation before
 * anything is freed, so a completion still queued in the shared CQ for it
 * (a CQ keeps the entries of a destroyed QP) no longer matches and is
 * dropped without touching the freed connection.
 */
#include "tb_domain.h"
#include "tb_random.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "tb_log.h"
#include "tb_qplink.h"

#define TAG_INDEX_BITS 8
#define TAG_INDEX_MASK ((1u << TAG_INDEX_BITS) - 1)
#define MAX_POLL_BATCH 64

typedef struct conn_slot {
    tb_conn_t *conn;
    uint32_t gen;
} conn_slot_t;

struct tb_domain {
    tb_verbs_t *verbs;
    const tb_device_t *dev;
    tb_domain_params_t p;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_comp_channel *events; /* NULL: no completion events */
    unsigned unacked_events;
    int cq_entries;
    conn_slot_t *slots; /* qp_budget entries: a connection takes at least one QP */
    int qps_used;
    int mrs_used;
    uint64_t stale;
    uint64_t last_poll_error_ns;
};

struct tb_conn {
    tb_domain_t *d;
    unsigned index;
    unsigned nlanes;
    tb_qplink_t *ql;
    tb_channel_t *ch;
};

static const char *verbs_err(int rc)
{
    return strerror(rc > 0 ? rc : (errno ? errno : EIO));
}


void tb_domain_params_default(tb_domain_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->qp_budget = TB_APPLE_MAX_QP;
    p->max_wr_per_qp = 128;
    p->poll_batch = 32;
    p->poll_rounds = 4;
    p->max_mtu = 4096;
}

int tb_domain_create(tb_verbs_t *verbs, const tb_device_t *dev, const tb_domain_params_t *params,
                     tb_domain_t **out)
{
    tb_domain_t *d;
    long cqe;
    int rc = -ENOMEM;

    if (!dev->usable || !dev->context) {
        TB_ERROR("device %s is not usable: %s", dev->name, dev->reason);
        return -ENODEV;
    }
    if (params->qp_budget < 1 || params->qp_budget > (int) TAG_INDEX_MASK + 1
        || params->max_wr_per_qp < 2 || params->poll_batch < 1
        || params->poll_batch > MAX_POLL_BATCH || params->poll_rounds < 1) {
        TB_ERROR("device %s: bad domain parameters (qp budget %d: 1..%u; work requests per QP "
                 "%u: at least 2; poll batch %u: 1..%d; poll rounds %u: at least 1)",
                 dev->name, params->qp_budget, TAG_INDEX_MASK + 1, params->max_wr_per_qp,
                 params->poll_batch, MAX_POLL_BATCH, params->poll_rounds);
        return -EINVAL;
    }
    d = calloc(1, sizeof(*d));
    if (!d) {
        return -ENOMEM;
    }
    d->verbs = verbs;
    d->dev = dev;
    d->p = *params;
    d->slots = calloc((size_t) params->qp_budget, sizeof(*d->slots));
    if (!d->slots) {
        goto fail;
    }
    d->pd = verbs->alloc_pd(dev->context);
    if (!d->pd) {
        rc = -(errno ? errno : EIO);
        TB_ERROR("device %s: ibv_alloc_pd failed: %s; check the device with tbrdma_devinfo",
                 dev->name, strerror(-rc));
        goto fail;
    }
    /* Room for every work request every QP of the budget may have
     * outstanding: the CQ can never overflow, whatever the traffic. */
    cqe = (long) params->qp_budget * params->max_wr_per_qp;
    if (dev->limits.max_cqe > 0 && cqe > dev->limits.max_cqe) {
        cqe = dev->limits.max_cqe;
        d->p.max_wr_per_qp = (unsigned) (cqe / params->qp_budget);
    }
    if (params->events && verbs->create_comp_channel) {
        d->events = verbs->create_comp_channel(dev->context);
        if (d->events) {
            (void) fcntl(d->events->fd, F_SETFL, fcntl(d->events->fd, F_GETFL) | O_NONBLOCK);
        } else {
            TB_INFO("device %s: no completion events (ibv_create_comp_channel: %s); polling",
                    dev->name, strerror(errno));
        }
    }
    d->cq = verbs->create_cq(dev->context, (int) cqe, NULL, d->events, 0);
    if (!d->cq) {
        rc = -(errno ? errno : EIO);
        TB_ERROR("device %s: ibv_create_cq(%ld entries) failed: %s; lower "
                 "btl_tbrdma_qps_per_device",
                 dev->name, cqe, strerror(-rc));
        goto fail;
    }
    d->cq_entries = (int) cqe;
    TB_DEBUG("device %s: domain open, QP budget %d, CQ of %ld entries", dev->name,
             params->qp_budget, cqe);
    *out = d;
    return 0;

fail:
    if (d->events) {
        verbs->destroy_comp_channel(d->events);
    }
    if (d->pd) {
        verbs->dealloc_pd(d->pd);
    }
    free(d->slots);
    free(d);
    return rc;
}

void tb_domain_destroy(tb_domain_t *d)
{
    int rc;

    if (!d) {
        return;
    }
    for (int i = 0; i < d->p.qp_budget; i++) {
        if (d->slots[i].conn) {
            tb_conn_destroy(d->slots[i].conn);
        }
    }
    if (d->unacked_events) {
        d->verbs->ack_cq_events(d->cq, d->unacked_events);
    }
    rc = d->verbs->destroy_cq(d->cq);
    if (rc != 0) {
        TB_WARN("device %s: ibv_destroy_cq failed: %s", d->dev->name, verbs_err(rc));
    }
    if (d->events) {
        d->verbs->destroy_comp_channel(d->events);
    }
    rc = d->verbs->dealloc_pd(d->pd);
    if (rc != 0) {
        TB_WARN("device %s: ibv_dealloc_pd failed: %s", d->dev->name, verbs_err(rc));
    }
    free(d->slots);
    free(d);
}

int tb_domain_event_fd(const tb_domain_t *d)
{
    return d->events ? d->events->fd : -1;
}

int tb_domain_arm(tb_domain_t *d)
{
    int rc;

    if (!d->events) {
        return -ENOTSUP;
    }
    rc = ibv_req_notify_cq(d->cq, 0);
    if (rc != 0) {
        TB_WARN("device %s: ibv_req_notify_cq failed: %s", d->dev->name, verbs_err(rc));
        return -EIO;
    }
    return 0;
}

void tb_domain_event_drain(tb_domain_t *d)
{
    struct ibv_cq *cq;
    void *ctx;

    if (!d->events) {
        return;
    }
    while (0 == d->verbs->get_cq_event(d->events, &cq, &ctx)) {
        /* Acked in batches: each ack takes a lock in the library. */
        if (++d->unacked_events >= 64) {
            d->verbs->ack_cq_events(d->cq, d->unacked_events);
            d->unacked_events = 0;
        }
    }
}

int tb_domain_progress(tb_domain_t *d, uint64_t now_ns)
{
    struct ibv_wc wc[MAX_POLL_BATCH];
    int total = 0;

    for (unsigned round = 0; round < d->p.poll_rounds; round++) {
        int n = ibv_poll_cq(d->cq, (int) d->p.poll_batch, wc);
        if (n < 0) {
            if (now_ns - d->last_poll_error_ns >= 1000000000ull || !d->last_poll_error_ns) {
                TB_ERROR("device %s: ibv_poll_cq failed (%d); the device may have been "
                         "removed: check it with tbrdma_devinfo", d->dev->name, n);
                d->last_poll_error_ns = now_ns ? now_ns : 1;
            }
            return -EIO;
        }
        for (int i = 0; i < n; i++) {
            uint32_t tag = tb_qplink_tag_of(wc[i].wr_id);
            uint32_t index = tag & TAG_INDEX_MASK;
            conn_slot_t *s = index < (uint32_t) d->p.qp_budget ? &d->slots[index] : NULL;
            if (s && s->conn && s->gen == tag >> TAG_INDEX_BITS) {
                /* Acks in it are timed at this poll, not at the last progress. */
                tb_channel_clock(s->conn->ch, now_ns);
                tb_qplink_dispatch(s->conn->ql, s->conn->ch, &wc[i]);
            } else {
                d->stale++;
            }
        }
        total += n;
        if (n < (int) d->p.poll_batch) {
            break;
        }
    }
    for (int i = 0; i < d->p.qp_budget; i++) {
        if (d->slots[i].conn) {
            tb_channel_progress(d->slots[i].conn->ch, now_ns);
        }
    }
    return total;
}

const tb_device_t *tb_domain_device(const tb_domain_t *d)
{
    return d->dev;
}

int tb_domain_qps_used(const tb_domain_t *d)
{
    return d->qps_used;
}

int tb_domain_mrs_used(const tb_domain_t *d)
{
    return d->mrs_used;
}

uint64_t tb_domain_stale_completions(const tb_domain_t *d)
{
    return d->stale;
}

/* ------------------------------------------------------------------ */
/* Connections                                                         */

int tb_conn_create(tb_domain_t *d, const tb_channel_params_t *params,
                   const tb_channel_callbacks_t *cb, tb_conn_t **out)
{
    tb_channel_params_t p = *params;
    tb_qplink_cfg_t cfg;
    tb_conn_t *c;
    char why[200];
    int index = -1, rc;

    if (p.epoch == 0) {
        p.epoch = tb_random64();
    }
    for (unsigned l = 0; l < p.nlanes && l < TB_WIRE_MAX_LANES; l++) {
        if (p.initial_seq[l] == 0) {
            p.initial_seq[l] = (uint32_t) tb_random64();
        }
    }
    if (tb_channel_params_check(&p, why, sizeof(why)) != 0) {
        TB_ERROR("device %s: connection parameters: %s", d->dev->name, why);
        return -EINVAL;
    }
    if (d->qps_used + (int) p.nlanes > d->p.qp_budget) {
        TB_ERROR("device %s: queue-pair budget of %d reached (btl_tbrdma_qps_per_device); a "
                 "connection needs %u (btl_tbrdma_lanes)",
                 d->dev->name, d->p.qp_budget, p.nlanes);
        return -EBUSY;
    }
    for (unsigned l = 0; l < p.nlanes; l++) {
        unsigned sends = tb_qplink_send_slots(&p, l);
        /* Apple's limit on outstanding work requests (limits.max_qp_wr) is
         * about receives; sends are bounded by what the device reports. */
        if (sends + p.recv_depth[l] > d->p.max_wr_per_qp || (int) sends > d->dev->hw.max_qp_wr
            || (int) p.recv_depth[l] > d->dev->limits.max_qp_wr) {
            TB_ERROR("device %s: lane %u needs %u sends (window %u + control) and %u receives; "
                     "the domain holds %u work requests per QP, the device %d sends and %d "
                     "receives: lower the send window or btl_tbrdma_recv_depth",
                     d->dev->name, l, sends, p.send_window[l], p.recv_depth[l],
                     d->p.max_wr_per_qp, d->dev->hw.max_qp_wr, d->dev->limits.max_qp_wr);
            return -EINVAL;
        }
    }
    if (d->mrs_used + 1 > d->dev->limits.max_mr) {
        TB_ERROR("device %s: memory-registration limit of %d reached", d->dev->name,
                 d->dev->limits.max_mr);
        return -EBUSY;
    }
    for (int i = 0; i < d->p.qp_budget; i++) {
        if (!d->slots[i].conn) {
            index = i;
            break;
        }
    }
    c = calloc(1, sizeof(*c));
    if (!c) {
        return -ENOMEM;
    }
    c->d = d;
    c->index = (unsigned) index;
    c->nlanes = p.nlanes;
    memset(&cfg, 0, sizeof(cfg));
    cfg.verbs = d->verbs;
    cfg.device = d->dev;
    cfg.pd = d->pd;
    cfg.cq = d->cq;
    cfg.max_mtu = d->p.max_mtu;
    cfg.wr_tag = d->slots[index].gen << TAG_INDEX_BITS | (uint32_t) index;
    rc = tb_qplink_create(&cfg, &p, &c->ql);
    if (rc != 0) {
        goto fail;
    }
    rc = tb_channel_create(&p, tb_qplink_link(c->ql), cb, &c->ch);
    if (rc != 0) {
        rc = rc == TB_CHAN_ENOMEM ? -ENOMEM : -EINVAL;
        goto fail_link;
    }
    d->slots[index].conn = c;
    d->qps_used += (int) p.nlanes;
    d->mrs_used++;
    *out = c;
    return 0;

fail_link:
    tb_qplink_destroy_qps(c->ql);
    tb_qplink_destroy(c->ql);
fail:
    free(c);
    return rc;
}

void tb_conn_local_addr(tb_conn_t *c, tb_wire_addr_t *addr)
{
    tb_channel_local_addr(c->ch, addr);
}

int tb_conn_connect(tb_conn_t *c, const tb_wire_addr_t *peer, uint64_t now_ns)
{
    return tb_channel_connect(c->ch, peer, now_ns);
}

tb_channel_t *tb_conn_channel(tb_conn_t *c)
{
    return c->ch;
}

void tb_conn_destroy(tb_conn_t *c)
{
    tb_domain_t *d;
    conn_slot_t *s;

    if (!c) {
        return;
    }
    d = c->d;
    s = &d->slots[c->index];
    /* The QPs go first: afterwards the hardware writes nothing more into the
     * slots, and the generation bump orphans their queued completions. */
    tb_qplink_destroy_qps(c->ql);
    s->conn = NULL;
    s->gen = (s->gen + 1) & (UINT32_MAX >> TAG_INDEX_BITS);
    tb_channel_destroy(c->ch);
    tb_qplink_destroy(c->ql);
    d->qps_used -= (int) c->nlanes;
    d->mrs_used--;
    free(c);
}
