/*
 * Fuzz target: the peer's address blob (tb_wire_addr_t, 64 bytes) as
 * tb_channel_connect() validates it, and what a channel connected with it
 * does next (the peer's first sequence numbers set every lane's window).
 *
 * Input: flags byte, then the blob (zero-filled if short), then frames as in
 * fuzz_frame (sealed only: 2-byte length, lane byte, then bytes).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "fakelink.h"
#include "tb_channel.h"

enum {
    A_SEAL = 0x01,     /* fix magic and version, recompute the crc */
    A_SHAPE = 0x02,    /* fix nlanes and the frame sizes to this side's */
    A_TWO_LANES = 0x04,
    A_FAIL_LINK = 0x08, /* the link's connect fails */
    A_FAIL_POSTS = 0x10, /* posting receives fails */
    A_SEND = 0x20,     /* a send queued before connect */
};

#define OUR_EPOCH 0x3333333333333333ull

static const uint32_t frame_size[TB_WIRE_MAX_LANES] = {4096, 8192};
static const unsigned recv_depth[TB_WIRE_MAX_LANES] = {6, 4};
static const unsigned send_slots[TB_WIRE_MAX_LANES] = {16, 8};
static uint8_t send_data[12000];
static int send_status;

static void on_recv(void *ctx, uint8_t tag, const void *data, size_t len)
{
    const volatile uint8_t *p = data;
    for (size_t i = 0; i < len; i++) {
        (void) p[i];
    }
}

static void on_send_done(void *ctx, void *cookie, int status)
{
    int *done = cookie;
    FUZZ_ASSERT(*done == 0, "a send completed twice");
    *done = 1;
    send_status = status;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    tb_channel_params_t p;
    tb_channel_callbacks_t cb;
    tb_wire_addr_t peer;
    fuzz_link_t *fl;
    tb_channel_t *ch;
    fuzz_in_t in;
    uint8_t flags;
    uint64_t now = 5000000000ull;
    int rc, sent = 0, queued = 0;

    if (!init) {
        fuzz_quiet();
        init = 1;
    }
    fuzz_in_init(&in, data, size);
    flags = fuzz_u8(&in);
    fuzz_bytes(&in, &peer, sizeof(peer));

    tb_channel_params_default(&p);
    p.nlanes = (flags & A_TWO_LANES) ? 2 : 1;
    for (unsigned l = 0; l < TB_WIRE_MAX_LANES; l++) {
        p.frame_size[l] = frame_size[l];
        p.recv_depth[l] = recv_depth[l];
        p.send_window[l] = 4;
        p.initial_seq[l] = 0x80000000u - l;
    }
    p.epoch = OUR_EPOCH;
    p.max_msg_size = 65536;
    p.rto_initial_ns = 1000000;
    p.rto_max_ns = 8000000;
    p.keepalive_ns = 10000000;
    p.peer_timeout_ns = 100000000;
    memset(&cb, 0, sizeof(cb));
    cb.recv = on_recv;
    cb.send_done = on_send_done;

    if (flags & A_SHAPE) {
        peer.nlanes = (uint8_t) p.nlanes;
        for (unsigned l = 0; l < p.nlanes; l++) {
            peer.frame_size[l] = tb_wire_le32(frame_size[l]);
        }
    }
    if (flags & A_SEAL) {
        peer.magic = tb_wire_le32(TB_WIRE_ADDR_MAGIC);
        peer.version = TB_WIRE_VERSION;
        fuzz_addr_seal(&peer);
    }

    fl = fuzz_link_create(p.nlanes, frame_size, send_slots, recv_depth);
    FUZZ_ASSERT(fl, "out of memory");
    FUZZ_ASSERT(tb_channel_create(&p, fuzz_link_base(fl), &cb, &ch) == 0, "create failed");
    if (flags & A_SEND) {
        queued = tb_channel_send(ch, 0x20, send_data, sizeof(send_data), &sent) == 0;
    }
    if (flags & A_FAIL_LINK) {
        fuzz_link_fail_connect(fl, -5);
    }
    if (flags & A_FAIL_POSTS) {
        fuzz_link_fail_posts(fl, -12);
    }
    rc = tb_channel_connect(ch, &peer, now);
    if (rc == 0) {
        FUZZ_ASSERT(tb_wire_le32(peer.magic) == TB_WIRE_ADDR_MAGIC
                        && tb_crc32c(0, &peer, TB_WIRE_ADDR_SIZE - 4) == tb_wire_le32(peer.crc)
                        && peer.nlanes == p.nlanes && peer.epoch != 0,
                    "tb_channel_connect accepted a blob that fails its own checks");
        FUZZ_ASSERT(!(flags & A_FAIL_LINK), "connected although the link failed");
        FUZZ_ASSERT(tb_channel_connect(ch, &peer, now) == TB_CHAN_ESTATE,
                    "a second connect was not refused");
    }
    /* A few frames at the peer's sequence numbers, whatever they are. */
    while (in.left >= 3) {
        size_t len = fuzz_u16(&in);
        unsigned lane = (fuzz_u8(&in) & 1u) % p.nlanes;
        uint8_t *buf = fuzz_link_take_recv(fl, lane);
        tb_wire_frame_hdr_t *h;

        now += 100000;
        if (!buf) {
            break;
        }
        if (len > frame_size[lane]) {
            len = frame_size[lane];
        }
        if (len < TB_WIRE_HDR_SIZE) {
            len = TB_WIRE_HDR_SIZE;
        }
        fuzz_bytes(&in, buf, len);
        h = (tb_wire_frame_hdr_t *) buf;
        h->magic = tb_wire_le32(TB_WIRE_FRAME_MAGIC);
        h->version = TB_WIRE_VERSION;
        h->lane = (uint8_t) lane;
        h->src_epoch = peer.epoch;
        h->dst_epoch = tb_wire_le64(OUR_EPOCH);
        h->flags &= (uint8_t) ~TB_FRAME_F_PAYLOAD_CRC;
        h->hdr_crc = tb_wire_le32(tb_crc32c(0, h, TB_WIRE_HDR_SIZE - 4));
        fuzz_link_complete_sends(fl, ch);
        tb_channel_recv_done(ch, lane, buf, len, 0);
        tb_channel_progress(ch, now);
    }
    for (unsigned i = 0; i < 4; i++) {
        now += 20000000;
        fuzz_link_complete_sends(fl, ch);
        tb_channel_progress(ch, now);
    }
    fuzz_link_reset(fl);
    tb_channel_destroy(ch);
    FUZZ_ASSERT(sent == queued, "a send queued %d, completed %d", queued, sent);
    fuzz_link_destroy(fl);
    return 0;
}
