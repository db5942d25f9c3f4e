/*
 * Fuzz target: the reliable channel's receive path (tb_channel.h).
 *
 * A channel over an in-memory link (fakelink.c) connects to a fixed peer
 * blob with a few sends queued; the input is then a stream of frames, each
 * handed to tb_channel_recv_done() in a posted receive, with progress calls
 * on an advancing clock.  A per-frame flag makes the harness seal the
 * header (magic, version, epochs, checksums) so that the protocol logic
 * behind the checksums is reached, and another makes sequence numbers
 * relative to the ones the channel expects.
 *
 * Input: cfg byte, then frames of
 *   len (2 bytes, little-endian; capped at the lane's frame size)
 *   lane (1 byte: bit 0)
 *   flags (1 byte: F_* below)
 *   len bytes (the frame as received; padded with zeros to a header when
 *              F_SEAL is set)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "fakelink.h"
#include "tb_channel.h"

enum {
    CFG_TWO_LANES = 0x01,
    CFG_PAYLOAD_CRC = 0x02,
    CFG_RECV_BUF = 0x04,  /* give the channel caller buffers for large messages */
    CFG_SENDS_SHIFT = 3,  /* bits 3-4: sends queued before connect */
    CFG_HOLD_SENDS = 0x20, /* complete sends only when a frame asks */
    CFG_HAND_BACK = 0x40,  /* take back what a failed channel did not deliver */
};

enum {
    F_SEAL = 0x01,     /* fix magic, version, epochs, type, lane, length; recompute hdr_crc */
    F_REL = 0x02,      /* tsn, seq, acks, credits, msg_id relative to the expected ones */
    F_PCRC = 0x04,     /* set TB_FRAME_F_PAYLOAD_CRC with the right payload_crc */
    F_COMPLETE = 0x08, /* report the sends posted so far before this frame */
    F_SLOW = 0x10,     /* 30 ms pass before this frame (else 5 us) */
    F_ERROR = 0x20,    /* report the receive as failed */
    F_SEND = 0x40,     /* queue one more send (size from the next byte) */
    F_CLOSE = 0x80,    /* close the channel after this frame */
};

#define OUR_EPOCH 0x1111111111111111ull
#define PEER_EPOCH 0x2222222222222222ull
#define MAX_SENDS 16

static const uint32_t our_seq[TB_WIRE_MAX_LANES] = {0xfffffff8u, 0x7ffffffeu};
static const uint32_t peer_psn[TB_WIRE_MAX_LANES] = {0xfffffffcu, 5u};
static const uint32_t frame_size[TB_WIRE_MAX_LANES] = {4096, 8192};
static const unsigned recv_depth[TB_WIRE_MAX_LANES] = {8, 6};
static const unsigned send_slots[TB_WIRE_MAX_LANES] = {20, 10};
static const uint32_t send_sizes[8] = {0, 1, 100, 4016, 4017, 9000, 20000, 65536};
static uint8_t send_data[65536];

typedef struct state {
    int sends_done[MAX_SENDS]; /* how often each send completed */
    int sends_queued[MAX_SENDS];
    unsigned nsends;
    void *bufs[8]; /* caller buffers handed out through recv_buf */
    size_t buf_len[8];
    unsigned nerrors;
    uint32_t max_msg;
} state_t;

static void on_recv(void *ctx, uint8_t tag, const void *data, size_t len)
{
    state_t *st = ctx;
    const volatile uint8_t *p = data;
    uint8_t sum = tag;

    FUZZ_ASSERT(len <= st->max_msg, "a message of %zu bytes delivered (max %u)", len,
                st->max_msg);
    for (size_t i = 0; i < len; i++) {
        sum ^= p[i];
    }
    (void) sum;
    for (unsigned i = 0; i < 8; i++) {
        if (st->bufs[i] && (const uint8_t *) data >= (uint8_t *) st->bufs[i]
            && (const uint8_t *) data < (uint8_t *) st->bufs[i] + st->buf_len[i]) {
            FUZZ_ASSERT(data == st->bufs[i] && len == st->buf_len[i],
                        "a message delivered in part of a caller buffer");
            free(st->bufs[i]);
            st->bufs[i] = NULL;
        }
    }
}

static void *on_recv_buf(void *ctx, uint8_t tag, size_t len)
{
    state_t *st = ctx;
    (void) tag;
    FUZZ_ASSERT(len <= st->max_msg, "recv_buf asked for %zu bytes (max %u)", len, st->max_msg);
    for (unsigned i = 0; i < 8; i++) {
        if (!st->bufs[i]) {
            st->bufs[i] = malloc(len ? len : 1);
            st->buf_len[i] = len;
            return st->bufs[i];
        }
    }
    return NULL;
}

static void on_recv_buf_drop(void *ctx, void *buf)
{
    state_t *st = ctx;
    for (unsigned i = 0; i < 8; i++) {
        if (st->bufs[i] == buf) {
            free(buf);
            st->bufs[i] = NULL;
            return;
        }
    }
    FUZZ_ASSERT(0, "recv_buf_drop of %p, not a buffer handed out", buf);
}

static void on_send_done(void *ctx, void *cookie, int status)
{
    state_t *st = ctx;
    int *done = cookie;
    (void) status;
    FUZZ_ASSERT(done >= st->sends_done && done < st->sends_done + st->nsends,
                "send_done with a foreign cookie");
    FUZZ_ASSERT(st->sends_queued[done - st->sends_done], "send_done for a send never queued");
    FUZZ_ASSERT(*done == 0, "send %d completed twice", (int) (done - st->sends_done));
    (*done)++;
}

static void on_error(void *ctx, int status, const char *why)
{
    state_t *st = ctx;
    FUZZ_ASSERT(status < 0 && why && strlen(why) > 0, "error callback with status %d", status);
    st->nerrors++;
    FUZZ_ASSERT(st->nerrors == 1, "error callback called twice");
}

/* Whole messages, each no larger than the largest send, before the error. */
static void on_unsent(void *ctx, uint8_t tag, const struct iovec *iov, int iovcnt, size_t len)
{
    state_t *st = ctx;
    size_t total = 0;

    (void) tag;
    FUZZ_ASSERT(0 == st->nerrors, "messages handed back after the error callback");
    FUZZ_ASSERT(len <= st->max_msg, "a message of %zu bytes handed back", len);
    for (int i = 0; iov && i < iovcnt; i++) {
        total += iov[i].iov_len;
    }
    FUZZ_ASSERT(NULL == iov || total == len, "%zu of %zu bytes handed back", total, len);
}

static void queue_send(tb_channel_t *ch, state_t *st, uint8_t pick)
{
    unsigned i;
    int rc;

    if (st->nsends >= MAX_SENDS) {
        return;
    }
    i = st->nsends++;
    rc = tb_channel_send(ch, (uint8_t) (0x10 + (pick >> 3)), send_data, send_sizes[pick & 7],
                         &st->sends_done[i]);
    st->sends_queued[i] = rc == 0;
}

/* Make the frame pass the checks in front of the protocol logic. */
static size_t seal(uint8_t *buf, size_t len, unsigned lane, uint8_t flags, unsigned nlanes,
                   size_t cap)
{
    tb_wire_frame_hdr_t *h = (tb_wire_frame_hdr_t *) buf;
    uint32_t plen;

    if (len < TB_WIRE_HDR_SIZE) {
        memset(buf + len, 0, TB_WIRE_HDR_SIZE - len);
        len = TB_WIRE_HDR_SIZE;
    }
    if (flags & F_REL) {
        h->tsn = tb_wire_le32(tb_wire_le32(h->tsn) + peer_psn[lane]);
        h->seq = tb_wire_le32(tb_wire_le32(h->seq) + peer_psn[lane]);
        h->msg_id = tb_wire_le32(tb_wire_le32(h->msg_id) + peer_psn[0]);
        for (unsigned l = 0; l < nlanes; l++) {
            h->ack[l] = tb_wire_le32(tb_wire_le32(h->ack[l]) + our_seq[l] - 1);
            h->credit[l] = tb_wire_le32(tb_wire_le32(h->credit[l]) + our_seq[l] - 1);
        }
    }
    if (!(flags & F_SEAL)) {
        return len;
    }
    h->magic = tb_wire_le32(TB_WIRE_FRAME_MAGIC);
    h->version = TB_WIRE_VERSION;
    h->type = (uint8_t) (TB_FRAME_HELLO + (h->type & 3));
    h->lane = (uint8_t) lane;
    h->src_epoch = tb_wire_le64(PEER_EPOCH);
    h->dst_epoch = tb_wire_le64(OUR_EPOCH);
    plen = tb_wire_le32(h->payload_len);
    if (h->type != TB_FRAME_DATA) {
        plen = 0;
    } else if (plen > len - TB_WIRE_HDR_SIZE) {
        plen = (uint32_t) (len - TB_WIRE_HDR_SIZE);
    }
    h->payload_len = tb_wire_le32(plen);
    if (flags & F_PCRC) {
        h->flags |= TB_FRAME_F_PAYLOAD_CRC;
        h->payload_crc = tb_wire_le32(tb_crc32c(0, buf + TB_WIRE_HDR_SIZE, plen));
    }
    h->hdr_crc = tb_wire_le32(tb_crc32c(0, h, TB_WIRE_HDR_SIZE - 4));
    (void) cap;
    return len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    tb_channel_params_t p;
    tb_channel_callbacks_t cb;
    tb_wire_addr_t peer, local;
    state_t st;
    fuzz_link_t *fl;
    tb_channel_t *ch;
    fuzz_in_t in;
    uint64_t now = 1000000000ull;
    uint8_t cfg;
    unsigned nframes = 0;

    if (!init) {
        fuzz_quiet();
        for (size_t i = 0; i < sizeof(send_data); i++) {
            send_data[i] = (uint8_t) (i * 7);
        }
        init = 1;
    }
    fuzz_in_init(&in, data, size);
    cfg = fuzz_u8(&in);
    memset(&st, 0, sizeof(st));

    tb_channel_params_default(&p);
    p.nlanes = (cfg & CFG_TWO_LANES) ? 2 : 1;
    for (unsigned l = 0; l < TB_WIRE_MAX_LANES; l++) {
        p.frame_size[l] = frame_size[l];
        p.recv_depth[l] = recv_depth[l];
        p.send_window[l] = 8;
        p.initial_seq[l] = our_seq[l];
    }
    p.epoch = OUR_EPOCH;
    p.payload_crc = (cfg & CFG_PAYLOAD_CRC) != 0;
    p.max_msg_size = st.max_msg = 65536;
    p.rto_initial_ns = 1000000;
    p.rto_max_ns = 16000000;
    p.keepalive_ns = 20000000;
    p.peer_timeout_ns = 300000000;
    p.max_frames_per_progress = 16;
    p.max_queued_bytes = 1u << 20;
    p.max_queued_msgs = 12;

    memset(&cb, 0, sizeof(cb));
    cb.ctx = &st;
    cb.recv = on_recv;
    if (cfg & CFG_RECV_BUF) {
        cb.recv_buf = on_recv_buf;
        cb.recv_buf_drop = on_recv_buf_drop;
    }
    cb.send_done = on_send_done;
    cb.error = on_error;
    if (cfg & CFG_HAND_BACK) {
        cb.unsent = on_unsent;
    }

    fl = fuzz_link_create(p.nlanes, frame_size, send_slots, recv_depth);
    FUZZ_ASSERT(fl, "out of memory");
    FUZZ_ASSERT(tb_channel_create(&p, fuzz_link_base(fl), &cb, &ch) == 0, "create failed");
    tb_channel_local_addr(ch, &local);
    FUZZ_ASSERT(tb_crc32c(0, &local, TB_WIRE_ADDR_SIZE - 4) == tb_wire_le32(local.crc),
                "the local blob's crc is wrong");

    for (unsigned i = 0; i < ((cfg >> CFG_SENDS_SHIFT) & 3); i++) {
        queue_send(ch, &st, (uint8_t) (i * 3 + 2));
    }

    memset(&peer, 0, sizeof(peer));
    peer.magic = tb_wire_le32(TB_WIRE_ADDR_MAGIC);
    peer.version = TB_WIRE_VERSION;
    peer.nlanes = (uint8_t) p.nlanes;
    peer.mtu = tb_wire_le16(4096);
    peer.epoch = tb_wire_le64(PEER_EPOCH);
    for (unsigned l = 0; l < p.nlanes; l++) {
        peer.qpn[l] = tb_wire_le32(0x200 + l);
        peer.psn[l] = tb_wire_le32(peer_psn[l]);
        peer.frame_size[l] = tb_wire_le32(frame_size[l]);
        peer.recv_depth[l] = tb_wire_le16((uint16_t) recv_depth[l]);
    }
    fuzz_addr_seal(&peer);
    FUZZ_ASSERT(tb_channel_connect(ch, &peer, now) == 0, "connect to a good blob failed");
    tb_channel_progress(ch, now);

    while (in.left >= 4 && nframes++ < 256) {
        size_t len = fuzz_u16(&in);
        unsigned lane = fuzz_u8(&in) & 1u;
        uint8_t flags = fuzz_u8(&in);
        uint8_t *buf;

        if (lane >= p.nlanes) {
            lane = 0;
        }
        if (len > frame_size[lane]) {
            len = frame_size[lane];
        }
        if (flags & F_SEND) {
            queue_send(ch, &st, fuzz_u8(&in));
        }
        now += (flags & F_SLOW) ? 30000000ull : 5000ull;
        if ((flags & F_COMPLETE) || !(cfg & CFG_HOLD_SENDS)) {
            tb_channel_clock(ch, now);
            fuzz_link_complete_sends(fl, ch);
        }
        buf = fuzz_link_take_recv(fl, lane);
        if (buf) {
            len = fuzz_bytes(&in, buf, len);
            len = seal(buf, len, lane, flags, p.nlanes, frame_size[lane]);
            tb_channel_clock(ch, now);
            tb_channel_recv_done(ch, lane, buf, len, (flags & F_ERROR) ? -5 : 0);
        } else {
            /* No receive posted: on UC the frame is lost. */
            in.p += len < in.left ? len : in.left;
            in.left -= len < in.left ? len : in.left;
        }
        tb_channel_progress(ch, now);
        if (flags & F_CLOSE) {
            tb_channel_close(ch);
            tb_channel_progress(ch, now);
        }
        (void) tb_channel_is_connected(ch);
        (void) tb_channel_pending_sends(ch);
    }
    /* Let the timers run: retransmits, keepalives, peer death. */
    for (unsigned i = 0; i < 8; i++) {
        now += 50000000ull;
        if (!(cfg & CFG_HOLD_SENDS)) {
            fuzz_link_complete_sends(fl, ch);
        }
        tb_channel_progress(ch, now);
    }
    (void) tb_channel_counters(ch);

    fuzz_link_reset(fl);
    tb_channel_destroy(ch);
    for (unsigned i = 0; i < st.nsends; i++) {
        FUZZ_ASSERT(st.sends_done[i] == st.sends_queued[i],
                    "send %u: queued %d, completed %d times", i, st.sends_queued[i],
                    st.sends_done[i]);
    }
    for (unsigned i = 0; i < 8; i++) {
        FUZZ_ASSERT(!st.bufs[i], "a caller buffer was neither delivered nor dropped");
    }
    fuzz_link_destroy(fl);
    return 0;
}
