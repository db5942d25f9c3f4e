/*
 * An in-memory link for the channel fuzz targets (see fuzz_link.h).
 */
#include "fakelink.h"

#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

#define MAX_SLOTS 64

typedef struct pool {
    void *all[MAX_SLOTS];
    uint8_t is_free[MAX_SLOTS];
    unsigned n;
} pool_t;

typedef struct sent {
    void *cookie;
} sent_t;

typedef struct lane {
    uint32_t frame_size;
    pool_t send;
    pool_t recv;
    void *posted[MAX_SLOTS]; /* FIFO of posted receives */
    unsigned head, count;
} lane_t;

struct fuzz_link {
    tb_link_t base; /* first: the channel sees this */
    unsigned nlanes;
    lane_t lanes[TB_WIRE_MAX_LANES];
    sent_t sent[4 * MAX_SLOTS];
    unsigned nsent;
    int fail_posts;
    int fail_connect;
    int connected;
};

static int slot_index(const pool_t *p, const void *buf)
{
    for (unsigned i = 0; i < p->n; i++) {
        if (p->all[i] == buf) {
            return (int) i;
        }
    }
    return -1;
}

static void *pool_get(pool_t *p)
{
    for (unsigned i = 0; i < p->n; i++) {
        if (p->is_free[i]) {
            p->is_free[i] = 0;
            return p->all[i];
        }
    }
    return NULL;
}

static void pool_put(pool_t *p, void *buf, const char *what, unsigned lane)
{
    int i = slot_index(p, buf);
    FUZZ_ASSERT(i >= 0, "the channel gave back %p, not a %s slot of lane %u", buf, what, lane);
    FUZZ_ASSERT(!p->is_free[i], "the channel gave back %s slot %d of lane %u twice", what, i,
                lane);
    p->is_free[i] = 1;
}

static int pool_init(pool_t *p, unsigned n, size_t size)
{
    FUZZ_ASSERT(n <= MAX_SLOTS, "too many slots");
    for (unsigned i = 0; i < n; i++) {
        p->all[i] = malloc(size);
        if (!p->all[i]) {
            return -1;
        }
        memset(p->all[i], 0xa5, size);
        p->is_free[i] = 1;
        p->n++;
    }
    return 0;
}

static void pool_fini(pool_t *p, const char *what, unsigned lane, int check)
{
    for (unsigned i = 0; i < p->n; i++) {
        FUZZ_ASSERT(!check || p->is_free[i], "%s slot %u of lane %u never given back", what, i,
                    lane);
        free(p->all[i]);
    }
}

static lane_t *lane_of(fuzz_link_t *fl, unsigned lane)
{
    FUZZ_ASSERT(lane < fl->nlanes, "the channel used lane %u of a %u-lane link", lane,
                fl->nlanes);
    return &fl->lanes[lane];
}

/* --- link operations ------------------------------------------------ */

static void op_local_addr(tb_link_t *link, tb_wire_addr_t *addr)
{
    fuzz_link_t *fl = (fuzz_link_t *) link;
    memset(addr->gid, 0, sizeof(addr->gid));
    addr->gid[15] = 1;
    for (unsigned l = 0; l < fl->nlanes; l++) {
        addr->qpn[l] = tb_wire_le32(0x100 + l);
    }
    addr->mtu = tb_wire_le16(4096);
}

static int op_connect(tb_link_t *link, const tb_wire_addr_t *peer)
{
    fuzz_link_t *fl = (fuzz_link_t *) link;
    (void) peer;
    FUZZ_ASSERT(!fl->connected, "the channel connected its link twice");
    if (fl->fail_connect) {
        return fl->fail_connect;
    }
    fl->connected = 1;
    return 0;
}

static void *op_send_buf_get(tb_link_t *link, unsigned lane)
{
    return pool_get(&lane_of((fuzz_link_t *) link, lane)->send);
}

static void op_send_buf_put(tb_link_t *link, unsigned lane, void *buf)
{
    pool_put(&lane_of((fuzz_link_t *) link, lane)->send, buf, "send", lane);
}

static void *op_recv_buf_get(tb_link_t *link, unsigned lane)
{
    return pool_get(&lane_of((fuzz_link_t *) link, lane)->recv);
}

static void op_recv_buf_put(tb_link_t *link, unsigned lane, void *buf)
{
    lane_t *ln = lane_of((fuzz_link_t *) link, lane);
    for (unsigned i = 0; i < ln->count; i++) {
        FUZZ_ASSERT(ln->posted[(ln->head + i) % MAX_SLOTS] != buf,
                    "the channel gave back a receive slot of lane %u that is still posted",
                    lane);
    }
    pool_put(&ln->recv, buf, "receive", lane);
}

static int op_post_send(tb_link_t *link, unsigned lane, void *buf, size_t len, void *cookie)
{
    fuzz_link_t *fl = (fuzz_link_t *) link;
    lane_t *ln = lane_of(fl, lane);
    const tb_wire_frame_hdr_t *h = buf;
    int i = slot_index(&ln->send, buf);

    FUZZ_ASSERT(fl->connected, "a send posted before the link was connected");
    FUZZ_ASSERT(i >= 0 && !ln->send.is_free[i], "a send posted from %p, not a held send slot "
                "of lane %u", buf, lane);
    FUZZ_ASSERT(len >= TB_WIRE_HDR_SIZE && len <= ln->frame_size,
                "a send of %zu bytes on lane %u (frame size %u)", len, lane, ln->frame_size);
    /* Apple's rule: a send lands only in a receive of the same frame count. */
    FUZZ_ASSERT(tb_wire_hw_frames(len) == ln->frame_size / TB_WIRE_HW_FRAME,
                "a send of %zu bytes on lane %u takes %u hardware frames, its receives %u", len,
                lane, tb_wire_hw_frames(len), ln->frame_size / TB_WIRE_HW_FRAME);
    FUZZ_ASSERT(tb_wire_le32(h->magic) == TB_WIRE_FRAME_MAGIC && h->lane == lane
                    && tb_crc32c(0, h, TB_WIRE_HDR_SIZE - 4) == tb_wire_le32(h->hdr_crc)
                    && tb_wire_le32(h->payload_len) <= len - TB_WIRE_HDR_SIZE,
                "the channel sent a malformed frame on lane %u", lane);
    if (fl->fail_posts) {
        return fl->fail_posts;
    }
    FUZZ_ASSERT(fl->nsent < sizeof(fl->sent) / sizeof(fl->sent[0]),
                "more sends in flight than slots");
    fl->sent[fl->nsent++].cookie = cookie;
    return 0;
}

static int op_post_recv(tb_link_t *link, unsigned lane, void *buf)
{
    fuzz_link_t *fl = (fuzz_link_t *) link;
    lane_t *ln = lane_of(fl, lane);
    int i = slot_index(&ln->recv, buf);

    FUZZ_ASSERT(i >= 0 && !ln->recv.is_free[i], "a receive posted into %p, not a held receive "
                "slot of lane %u", buf, lane);
    for (unsigned k = 0; k < ln->count; k++) {
        FUZZ_ASSERT(ln->posted[(ln->head + k) % MAX_SLOTS] != buf,
                    "a receive slot of lane %u posted twice", lane);
    }
    if (fl->fail_posts) {
        return fl->fail_posts;
    }
    ln->posted[(ln->head + ln->count++) % MAX_SLOTS] = buf;
    return 0;
}

static const tb_link_ops_t fuzz_link_ops = {
    .local_addr = op_local_addr,
    .connect = op_connect,
    .send_buf_get = op_send_buf_get,
    .send_buf_put = op_send_buf_put,
    .recv_buf_get = op_recv_buf_get,
    .recv_buf_put = op_recv_buf_put,
    .post_send = op_post_send,
    .post_recv = op_post_recv,
};

/* --- harness side ---------------------------------------------------- */

fuzz_link_t *fuzz_link_create(unsigned nlanes, const uint32_t *frame_size,
                              const unsigned *send_slots, const unsigned *recv_slots)
{
    fuzz_link_t *fl = calloc(1, sizeof(*fl));

    if (!fl) {
        return NULL;
    }
    fl->base.ops = &fuzz_link_ops;
    fl->nlanes = nlanes;
    for (unsigned l = 0; l < nlanes; l++) {
        fl->lanes[l].frame_size = frame_size[l];
        if (pool_init(&fl->lanes[l].send, send_slots[l], frame_size[l]) != 0
            || pool_init(&fl->lanes[l].recv, recv_slots[l], frame_size[l]) != 0) {
            fuzz_link_reset(fl);
            for (unsigned k = 0; k <= l; k++) {
                pool_fini(&fl->lanes[k].send, "send", k, 0);
                pool_fini(&fl->lanes[k].recv, "receive", k, 0);
            }
            free(fl);
            return NULL;
        }
    }
    return fl;
}

void fuzz_link_destroy(fuzz_link_t *fl)
{
    for (unsigned l = 0; l < fl->nlanes; l++) {
        pool_fini(&fl->lanes[l].send, "send", l, 1);
        pool_fini(&fl->lanes[l].recv, "receive", l, 1);
    }
    free(fl);
}

tb_link_t *fuzz_link_base(fuzz_link_t *fl)
{
    return &fl->base;
}

void *fuzz_link_take_recv(fuzz_link_t *fl, unsigned lane)
{
    lane_t *ln = lane_of(fl, lane);
    void *buf;

    if (ln->count == 0) {
        return NULL;
    }
    buf = ln->posted[ln->head];
    ln->head = (ln->head + 1) % MAX_SLOTS;
    ln->count--;
    return buf;
}

unsigned fuzz_link_posted_recvs(const fuzz_link_t *fl, unsigned lane)
{
    return lane < fl->nlanes ? fl->lanes[lane].count : 0;
}

void fuzz_link_complete_sends(fuzz_link_t *fl, tb_channel_t *ch)
{
    /* A completion may make the channel post more: report a snapshot. */
    sent_t batch[sizeof(fl->sent) / sizeof(fl->sent[0])];
    unsigned n = fl->nsent;

    memcpy(batch, fl->sent, n * sizeof(batch[0]));
    fl->nsent = 0;
    for (unsigned i = 0; i < n; i++) {
        tb_channel_send_done(ch, batch[i].cookie, 0);
    }
}

void fuzz_link_reset(fuzz_link_t *fl)
{
    fl->nsent = 0;
    for (unsigned l = 0; l < fl->nlanes; l++) {
        fl->lanes[l].head = fl->lanes[l].count = 0;
    }
}

void fuzz_link_fail_posts(fuzz_link_t *fl, int rc)
{
    fl->fail_posts = rc;
}

void fuzz_link_fail_connect(fuzz_link_t *fl, int rc)
{
    fl->fail_connect = rc;
}
