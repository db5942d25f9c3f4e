/*
 * tbrdma common layer: the verbs link under a reliable channel (see
 * tb_qplink.h).
 */
#include "tb_qplink.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tb_clock.h"
#include "tb_log.h"

enum { DIR_SEND = 0, DIR_RECV = 1 };

/* The slots of one lane in one direction: a contiguous run of the chunk. */
typedef struct slot_pool {
    unsigned char *base;
    uint32_t size;  /* the lane's frame size */
    uint32_t first; /* index of the first slot in the link's numbering */
    uint32_t count;
    uint32_t *free; /* stack of free slot numbers, relative to first */
    uint32_t nfree;
} slot_pool_t;

struct tb_qplink {
    tb_link_t link; /* first: the channel sees this */
    tb_qplink_cfg_t cfg;
    unsigned nlanes;
    struct ibv_qp *qp[TB_WIRE_MAX_LANES];
    slot_pool_t pool[TB_WIRE_MAX_LANES][2];
    unsigned char *chunk;
    size_t chunk_len;
    struct ibv_mr *mr;
    uint32_t nslots;
    void **cookie; /* per slot: the channel's cookie of the send posted from it */
    uint32_t psn[TB_WIRE_MAX_LANES]; /* our first PSN per lane (the channel's initial seq) */
    enum ibv_mtu mtu;
};

unsigned tb_qplink_send_slots(const tb_channel_params_t *params, unsigned lane)
{
    return params->send_window[lane] + (lane == 0 ? TB_QPLINK_CTRL_SLOTS : 0);
}

static const char *verbs_err(int rc)
{
    /* Verbs calls return a positive errno, or -1 with errno set. */
    return strerror(rc > 0 ? rc : (rc < 0 && errno ? errno : EIO));
}

static enum ibv_mtu mtu_enum(uint32_t bytes)
{
    if (bytes >= 4096) {
        return IBV_MTU_4096;
    }
    if (bytes >= 2048) {
        return IBV_MTU_2048;
    }
    if (bytes >= 1024) {
        return IBV_MTU_1024;
    }
    return bytes >= 512 ? IBV_MTU_512 : IBV_MTU_256;
}

/* ------------------------------------------------------------------ */
/* Slots                                                               */

static slot_pool_t *pool_of(tb_qplink_t *ql, unsigned lane, int dir)
{
    return &ql->pool[lane][dir];
}

static void *slot_get(slot_pool_t *p)
{
    return p->nfree ? p->base + (size_t) p->free[--p->nfree] * p->size : NULL;
}

static uint32_t slot_rel(const slot_pool_t *p, const void *buf)
{
    return (uint32_t) (((const unsigned char *) buf - p->base) / p->size);
}

/* Ignore, loudly, what cannot be one of the pool's slots out (NULL, another
 * pool's memory, a put with every slot already free): pushing it would hand
 * out a bogus slot later or write past the stack. */
static void slot_put(slot_pool_t *p, void *buf)
{
    uintptr_t off = (uintptr_t) buf - (uintptr_t) p->base; /* wraps when below base */

    if (!buf || off >= (uintptr_t) p->count * p->size || off % p->size != 0
        || p->nfree >= p->count) {
        TB_ERROR("verbs link: ignoring the return of %p, not a slot out of the pool (%u of %u "
                 "slots free)", buf, p->nfree, p->count);
        return;
    }
    p->free[p->nfree++] = slot_rel(p, buf);
}

/* ------------------------------------------------------------------ */
/* Link operations                                                     */

/* A control call that holds the caller for long holds every channel of the
 * process (the engine's loop polls nothing meanwhile): say which one, so a
 * peer's timeout that follows can be traced to it. */
#define SLOW_CALL_NS 1000000000ull

static void note_slow(const tb_device_t *dev, const char *call, int lane, uint64_t t0)
{
    uint64_t ns = tb_now_ns() - t0;
    unsigned long long ms = ns / 1000000;

    if (ns > SLOW_CALL_NS) {
        if (lane < 0) {
            TB_WARN("device %s: %s took %llu ms", dev->name, call, ms);
        } else {
            TB_WARN("device %s: %s of lane %d took %llu ms", dev->name, call, lane, ms);
        }
    }
}

static void op_local_addr(tb_link_t *link, tb_wire_addr_t *addr)
{
    tb_qplink_t *ql = (tb_qplink_t *) link;

    memcpy(addr->gid, ql->cfg.device->gid.raw, sizeof(addr->gid));
    for (unsigned l = 0; l < ql->nlanes; l++) {
        addr->qpn[l] = tb_wire_le32(ql->qp[l]->qp_num);
    }
    addr->mtu = tb_wire_le16((uint16_t) tb_mtu_to_bytes(ql->mtu));
}

static int qp_to_rts(tb_qplink_t *ql, unsigned l, const tb_wire_addr_t *peer, enum ibv_mtu mtu)
{
    const tb_device_t *dev = ql->cfg.device;
    struct ibv_qp_attr attr;
    const char *step;
    uint64_t t0;
    int rc;

    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = dev->port;
    attr.qp_access_flags = 0; /* SEND/recv only: no remote access to our memory */
    step = "INIT";
    t0 = tb_now_ns();
    rc = ql->cfg.verbs->modify_qp(ql->qp[l], &attr,
                                  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT
                                      | IBV_QP_ACCESS_FLAGS);
    note_slow(dev, "ibv_modify_qp(INIT)", (int) l, t0);
    if (rc != 0) {
        goto fail;
    }

    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = mtu;
    attr.dest_qp_num = tb_wire_le32(peer->qpn[l]) & 0xffffff;
    attr.rq_psn = tb_wire_le32(peer->psn[l]) & 0xffffff;
    attr.ah_attr.is_global = 1;
    memcpy(attr.ah_attr.grh.dgid.raw, peer->gid, sizeof(peer->gid));
    attr.ah_attr.grh.sgid_index = (uint8_t) dev->gid_index;
    /* One cable, no router: the frame must not be forwarded anywhere. */
    attr.ah_attr.grh.hop_limit = 1;
    attr.ah_attr.port_num = dev->port;
    step = "RTR";
    t0 = tb_now_ns();
    rc = ql->cfg.verbs->modify_qp(ql->qp[l], &attr,
                                  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN
                                      | IBV_QP_RQ_PSN);
    note_slow(dev, "ibv_modify_qp(RTR)", (int) l, t0);
    if (rc != 0) {
        goto fail;
    }

    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = ql->psn[l] & 0xffffff;
    step = "RTS";
    t0 = tb_now_ns();
    rc = ql->cfg.verbs->modify_qp(ql->qp[l], &attr, IBV_QP_STATE | IBV_QP_SQ_PSN);
    note_slow(dev, "ibv_modify_qp(RTS)", (int) l, t0);
    if (rc != 0) {
        goto fail;
    }
    return 0;

fail:
    TB_ERROR("device %s: ibv_modify_qp(lane %u QP %u to %s) failed: %s; check that the peer's "
             "address belongs to the host at the other end of this cable and that both ends "
             "run the same tbrdma version",
             dev->name, l, ql->qp[l]->qp_num, step, verbs_err(rc));
    return rc > 0 ? -rc : -EIO;
}

static int op_connect(tb_link_t *link, const tb_wire_addr_t *peer)
{
    tb_qplink_t *ql = (tb_qplink_t *) link;
    uint32_t peer_mtu = tb_wire_le16(peer->mtu);
    uint32_t cap = ql->cfg.max_mtu ? ql->cfg.max_mtu : 4096;
    uint32_t mtu = tb_mtu_to_bytes(ql->mtu);
    int rc;

    if (peer_mtu < mtu) {
        mtu = peer_mtu;
    }
    if (cap < mtu) {
        mtu = cap;
    }
    for (unsigned l = 0; l < ql->nlanes; l++) {
        rc = qp_to_rts(ql, l, peer, mtu_enum(mtu));
        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

static void *op_send_buf_get(tb_link_t *link, unsigned lane)
{
    return slot_get(pool_of((tb_qplink_t *) link, lane, DIR_SEND));
}

static void op_send_buf_put(tb_link_t *link, unsigned lane, void *buf)
{
    slot_put(pool_of((tb_qplink_t *) link, lane, DIR_SEND), buf);
}

static void *op_recv_buf_get(tb_link_t *link, unsigned lane)
{
    return slot_get(pool_of((tb_qplink_t *) link, lane, DIR_RECV));
}

static void op_recv_buf_put(tb_link_t *link, unsigned lane, void *buf)
{
    slot_put(pool_of((tb_qplink_t *) link, lane, DIR_RECV), buf);
}

static int op_post_send(tb_link_t *link, unsigned lane, void *buf, size_t len, void *cookie)
{
    tb_qplink_t *ql = (tb_qplink_t *) link;
    slot_pool_t *p = pool_of(ql, lane, DIR_SEND);
    uint32_t slot = p->first + slot_rel(p, buf);
    struct ibv_sge sge = {
        .addr = (uintptr_t) buf,
        .length = (uint32_t) len,
        .lkey = ql->mr->lkey,
    };
    struct ibv_send_wr wr, *bad = NULL;
    int rc;

    memset(&wr, 0, sizeof(wr));
    wr.wr_id = (uint64_t) ql->cfg.wr_tag << 32 | slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    /* Every send is signaled: its completion is what frees the slot. */
    wr.send_flags = IBV_SEND_SIGNALED;
    ql->cookie[slot] = cookie;
    rc = ibv_post_send(ql->qp[lane], &wr, &bad);
    if (rc != 0) {
        TB_ERROR("device %s: ibv_post_send(lane %u QP %u, %zu bytes) failed: %s; the "
                 "connection is closed (if this repeats, lower btl_tbrdma_recv_depth or the "
                 "number of connections per device)",
                 ql->cfg.device->name, lane, ql->qp[lane]->qp_num, len, verbs_err(rc));
        return rc > 0 ? -rc : -EIO;
    }
    return 0;
}

static int op_post_recv(tb_link_t *link, unsigned lane, void *buf)
{
    tb_qplink_t *ql = (tb_qplink_t *) link;
    slot_pool_t *p = pool_of(ql, lane, DIR_RECV);
    struct ibv_sge sge = {
        .addr = (uintptr_t) buf,
        .length = p->size, /* the whole slot: its 4 KiB frame count must match the send's */
        .lkey = ql->mr->lkey,
    };
    struct ibv_recv_wr wr, *bad = NULL;
    int rc;

    memset(&wr, 0, sizeof(wr));
    wr.wr_id = (uint64_t) ql->cfg.wr_tag << 32 | (p->first + slot_rel(p, buf));
    wr.sg_list = &sge;
    wr.num_sge = 1;
    rc = ibv_post_recv(ql->qp[lane], &wr, &bad);
    if (rc != 0) {
        TB_ERROR("device %s: ibv_post_recv(lane %u QP %u) failed: %s; the connection is "
                 "closed (the device may hold fewer outstanding receives: lower "
                 "btl_tbrdma_recv_depth)",
                 ql->cfg.device->name, lane, ql->qp[lane]->qp_num, verbs_err(rc));
        return rc > 0 ? -rc : -EIO;
    }
    return 0;
}

static const tb_link_ops_t qplink_ops = {
    .local_addr = op_local_addr,
    .connect = op_connect,
    .send_buf_get = op_send_buf_get,
    .send_buf_put = op_send_buf_put,
    .recv_buf_get = op_recv_buf_get,
    .recv_buf_put = op_recv_buf_put,
    .post_send = op_post_send,
    .post_recv = op_post_recv,
};

/* ------------------------------------------------------------------ */
/* Completions                                                         */

void tb_qplink_dispatch(tb_qplink_t *ql, tb_channel_t *ch, const struct ibv_wc *wc)
{
    uint32_t slot = (uint32_t) wc->wr_id;
    int status = wc->status == IBV_WC_SUCCESS ? 0 : -EIO;

    if (status != 0) {
        TB_WARN("device %s: work completion error (status %d, vendor error 0x%x) on QP %u",
                ql->cfg.device->name, (int) wc->status, wc->vendor_err, wc->qp_num);
    }
    for (unsigned l = 0; l < ql->nlanes; l++) {
        slot_pool_t *s = &ql->pool[l][DIR_SEND], *r = &ql->pool[l][DIR_RECV];
        if (slot - s->first < s->count) {
            tb_channel_send_done(ch, ql->cookie[slot], status);
            return;
        }
        if (slot - r->first < r->count) {
            tb_channel_recv_done(ch, l, r->base + (size_t) (slot - r->first) * r->size,
                                 wc->byte_len, status);
            return;
        }
    }
    TB_ERROR("device %s: completion for unknown slot %u on QP %u ignored", ql->cfg.device->name,
             slot, wc->qp_num);
}

/* ------------------------------------------------------------------ */
/* Life cycle                                                          */

tb_link_t *tb_qplink_link(tb_qplink_t *ql)
{
    return &ql->link;
}

static int create_qp(tb_qplink_t *ql, unsigned l, const tb_channel_params_t *params)
{
    const tb_device_t *dev = ql->cfg.device;
    struct ibv_qp_init_attr init;
    uint64_t t0;

    memset(&init, 0, sizeof(init));
    init.send_cq = ql->cfg.cq;
    init.recv_cq = ql->cfg.cq;
    init.qp_type = IBV_QPT_UC;
    init.cap.max_send_wr = tb_qplink_send_slots(params, l);
    init.cap.max_recv_wr = params->recv_depth[l];
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = 0;
    init.sq_sig_all = 0;
    t0 = tb_now_ns();
    ql->qp[l] = ql->cfg.verbs->create_qp(ql->cfg.pd, &init);
    note_slow(dev, "ibv_create_qp", (int) l, t0);
    if (ql->qp[l] == NULL) {
        int err = errno ? errno : EIO;
        TB_ERROR("device %s: ibv_create_qp(UC, lane %u, %u sends, %u receives) failed: %s; %s",
                 dev->name, l, init.cap.max_send_wr, init.cap.max_recv_wr, strerror(err),
                 err == EBUSY || err == ENOMEM
                     ? "the device's queue pairs (about 10 per device, all processes of the "
                       "host together) are used up: run fewer processes per host or lower "
                       "btl_tbrdma_qps_per_device"
                     : "check the device with tbrdma_devinfo");
        return -err;
    }
    return 0;
}

int tb_qplink_create(const tb_qplink_cfg_t *cfg, const tb_channel_params_t *params,
                     tb_qplink_t **out)
{
    const tb_device_t *dev = cfg->device;
    long page = sysconf(_SC_PAGESIZE);
    tb_qplink_t *ql;
    size_t off = 0;
    uint32_t index = 0;
    uint64_t t0;
    int rc = -ENOMEM;

    ql = calloc(1, sizeof(*ql));
    if (!ql) {
        return -ENOMEM;
    }
    ql->link.ops = &qplink_ops;
    ql->cfg = *cfg;
    ql->nlanes = params->nlanes;
    ql->mtu = mtu_enum(dev->limits.mtu ? dev->limits.mtu : 1024);

    for (unsigned l = 0; l < ql->nlanes; l++) {
        ql->psn[l] = params->initial_seq[l];
        for (int d = DIR_SEND; d <= DIR_RECV; d++) {
            slot_pool_t *p = &ql->pool[l][d];
            p->size = params->frame_size[l];
            p->count = d == DIR_SEND ? tb_qplink_send_slots(params, l) : params->recv_depth[l];
            p->first = index;
            index += p->count;
            off += (size_t) p->count * p->size;
            p->free = calloc(p->count, sizeof(*p->free));
            if (!p->free) {
                goto fail;
            }
        }
    }
    ql->nslots = index;
    ql->chunk_len = off;
    ql->cookie = calloc(ql->nslots, sizeof(*ql->cookie));
    if (!ql->cookie) {
        goto fail;
    }
    /* Page-aligned, so every slot (a multiple of 4 KiB) is frame-aligned. */
    if (posix_memalign((void **) &ql->chunk, page > 4096 ? (size_t) page : 4096,
                       ql->chunk_len) != 0) {
        ql->chunk = NULL;
        TB_ERROR("device %s: cannot allocate %zu bytes of frame buffers for a connection; "
                 "lower btl_tbrdma_bulk_frame_size or btl_tbrdma_recv_depth",
                 dev->name, ql->chunk_len);
        goto fail;
    }
    off = 0;
    for (unsigned l = 0; l < ql->nlanes; l++) {
        for (int d = DIR_SEND; d <= DIR_RECV; d++) {
            slot_pool_t *p = &ql->pool[l][d];
            p->base = ql->chunk + off;
            off += (size_t) p->count * p->size;
            for (uint32_t i = 0; i < p->count; i++) {
                p->free[p->nfree++] = p->count - 1 - i;
            }
        }
    }
    /* Apple's provider rejects LOCAL_WRITE alone (llama.cpp, jaccl). */
    t0 = tb_now_ns();
    ql->mr = cfg->verbs->reg_mr(cfg->pd, ql->chunk, ql->chunk_len,
                                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ
                                    | IBV_ACCESS_REMOTE_WRITE);
    note_slow(dev, "ibv_reg_mr", -1, t0);
    if (!ql->mr) {
        int err = errno ? errno : EIO;
        TB_ERROR("device %s: ibv_reg_mr(%zu bytes) failed: %s; %s", dev->name, ql->chunk_len,
                 strerror(err),
                 err == ENOMEM || err == EAGAIN || err == EPERM
                     ? "raise the locked-memory limit (ulimit -l unlimited) or lower "
                       "btl_tbrdma_bulk_frame_size / btl_tbrdma_recv_depth"
                     : "check the device with tbrdma_devinfo");
        rc = -err;
        goto fail;
    }
    for (unsigned l = 0; l < ql->nlanes; l++) {
        rc = create_qp(ql, l, params);
        if (rc != 0) {
            goto fail;
        }
    }
    *out = ql;
    return 0;

fail:
    tb_qplink_destroy_qps(ql);
    tb_qplink_destroy(ql);
    return rc;
}

void tb_qplink_destroy_qps(tb_qplink_t *ql)
{
    for (unsigned l = 0; l < ql->nlanes; l++) {
        if (ql->qp[l]) {
            int rc = ql->cfg.verbs->destroy_qp(ql->qp[l]);
            if (rc != 0) {
                TB_WARN("device %s: ibv_destroy_qp(lane %u) failed: %s; the queue pair may "
                        "stay allocated until the process exits",
                        ql->cfg.device->name, l, verbs_err(rc));
            }
            ql->qp[l] = NULL;
        }
    }
}

void tb_qplink_destroy(tb_qplink_t *ql)
{
    if (!ql) {
        return;
    }
    if (ql->mr) {
        int rc = ql->cfg.verbs->dereg_mr(ql->mr);
        if (rc != 0) {
            TB_WARN("device %s: ibv_dereg_mr failed: %s; the registration may stay until the "
                    "process exits", ql->cfg.device->name, verbs_err(rc));
        }
    }
    free(ql->chunk);
    free(ql->cookie);
    for (unsigned l = 0; l < ql->nlanes; l++) {
        free(ql->pool[l][DIR_SEND].free);
        free(ql->pool[l][DIR_RECV].free);
    }
    free(ql);
}
