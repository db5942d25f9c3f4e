/*
 * tbrdma common layer: the reliable channel's reception (see tb_channel.c):
 * checks, selective repeat, reassembly and in-order delivery.
 */
#include "tb_channel_int.h"

/* ------------------------------------------------------------------ */
/* Reception                                                           */

static void rx_drop(tb_channel_t *ch, uint64_t *counter, const char *what, unsigned lane)
{
    (*counter)++;
    tb_log_limited(&ch->warn_limit, ch->now, TB_LOG_WARN,
                   "channel to peer epoch %016llx: dropped a %s frame on lane %u",
                   (unsigned long long) ch->peer_epoch, what, lane);
}

int tb_ch_rx_repost(tb_channel_t *ch, unsigned lane, void *buf)
{
    int rc = ch->link->ops->post_recv(ch->link, lane, buf);
    if (rc != 0) {
        tb_ch_fail(ch, TB_CHAN_ELINK, "posting a receive on lane %u failed (%d)", lane, rc);
        return rc;
    }
    ch->rx[lane].posted++;
    return 0;
}

static void rx_deliver(tb_channel_t *ch, uint8_t tag, const void *data, uint32_t len)
{
    ch->next_deliver++;
    ch->cnt.msgs_received++;
    ch->cnt.bytes_received += len;
    ch->in_callback++;
    ch->cb.recv(ch->cb.ctx, tag, data, len);
    ch->in_callback--;
}

/* Deliver waiting messages whose turn has come. */
static void rx_deliver_ready(tb_channel_t *ch)
{
    int progress = 1;

    while (progress && tb_ch_usable(ch)) {
        progress = 0;
        for (unsigned l = 0; l < ch->p.nlanes && tb_ch_usable(ch); l++) {
            tb_rx_lane_t *r = &ch->rx[l];
            tb_rx_msg_t *m = r->wait_head;
            if (!m || m->msg_id != ch->next_deliver) {
                continue;
            }
            r->wait_head = m->next;
            if (!r->wait_head) {
                r->wait_tail = NULL;
            }
            if (m->placed) {
                ch->next_deliver++;
                ch->cnt.msgs_received++;
                ch->cnt.bytes_received += m->len;
                ch->in_callback++;
                ch->cb.recv_placed(ch->cb.ctx, m->tag, m->head, m->skip, m->len);
                ch->in_callback--;
            } else {
                rx_deliver(ch, m->tag, m->data, m->len);
            }
            if (m->slot) {
                r->nwaiting--;
                if (tb_ch_usable(ch)) {
                    tb_ch_rx_repost(ch, m->lane, m->slot);
                }
            } else if (!m->caller_buf && !m->placed) {
                free(m->data);
            }
            free(m);
            progress = 1;
        }
    }
}

static void rx_wait(tb_rx_lane_t *r, tb_rx_msg_t *m)
{
    m->next = NULL;
    if (r->wait_tail) {
        r->wait_tail->next = m;
    } else {
        r->wait_head = m;
    }
    r->wait_tail = m;
}

/* Whether holding one more receive slot on the lane would leave fewer than
 * HOLD_SPARE posted: frames after a gap and messages waiting for one on the
 * other lane must never take the receives that the frames they wait for
 * need, or two lanes (or two peers) could wait for each other forever. */
static int rx_slots_low(const tb_channel_t *ch, unsigned lane)
{
    const tb_rx_lane_t *r = &ch->rx[lane];
    return r->nheld + r->nwaiting + HOLD_SPARE >= ch->p.recv_depth[lane];
}

/* An in-sequence DATA frame that cannot be accepted: the peer broke the
 * protocol (its header checksum and epochs were right).  Dropping it would
 * stall the lane for good, as the peer would resend the same frame (or, if we
 * had acked it selectively, nothing at all). */
__attribute__((format(printf, 3, 4))) static void rx_violation(tb_channel_t *ch, unsigned lane,
                                                               const char *fmt, ...)
{
    char what[200];
    va_list ap;

    ch->cnt.malformed++;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    tb_ch_fail(ch, TB_CHAN_EPROTO, "the peer broke the protocol on lane %u: %s", lane, what);
}

/* Check an in-sequence DATA frame against the message under way (m, or a new
 * one).  0 if it fits, else the channel has failed. */
static int rx_check(tb_channel_t *ch, unsigned lane, const tb_wire_frame_hdr_t *h,
                    const tb_rx_msg_t *m)
{
    const tb_rx_lane_t *r = &ch->rx[lane];
    uint32_t msg_id = tb_wire_le32(h->msg_id);
    uint32_t msg_len = tb_wire_le32(h->msg_len);
    uint32_t off = tb_wire_le32(h->frag_offset);
    uint32_t plen = tb_wire_le32(h->payload_len);

    if (msg_len > ch->p.max_msg_size) {
        rx_violation(ch, lane, "message %u has %u bytes; this side accepts at most %u "
                     "(max_msg_size)", msg_id, msg_len, ch->p.max_msg_size);
    } else if ((uint64_t) off + plen > msg_len) {
        rx_violation(ch, lane, "a fragment of message %u (%u bytes at offset %u) runs past its "
                     "%u bytes", msg_id, plen, off, msg_len);
    } else if (m && (msg_id != m->msg_id || off != m->got || msg_len != m->len
                     || h->tag != m->tag || plen == 0)) {
        rx_violation(ch, lane, "a fragment of message %u (%u bytes at offset %u) does not "
                     "continue message %u (%u of %u bytes received)", msg_id, plen, off,
                     m->msg_id, m->got, m->len);
    } else if (!m && (off != 0 || (plen == 0 && msg_len != 0))) {
        rx_violation(ch, lane, "message %u starts at offset %u with %u of its %u bytes", msg_id,
                     off, plen, msg_len);
    } else if (!m && (tb_seq_lt(msg_id, ch->next_deliver)
                      || (r->have_msg && !tb_seq_lt(r->last_msg_id, msg_id)))) {
        rx_violation(ch, lane, "message %u comes out of order (next due %u, last on the lane "
                     "%u)", msg_id, ch->next_deliver, r->have_msg ? r->last_msg_id : 0);
    } else if (!m && msg_id - ch->next_deliver >= TB_CHAN_MAX_AHEAD) {
        rx_violation(ch, lane, "message %u starts %u or more beyond the next one due (%u)",
                     msg_id, TB_CHAN_MAX_AHEAD, ch->next_deliver);
    } else {
        return 0;
    }
    return -1;
}

/* The in-sequence DATA frame.  Returns 1 if the slot is now held.  A frame
 * that cannot be accepted fails the channel: it may have been acked
 * selectively, and then it is never resent. */
static int rx_accept(tb_channel_t *ch, unsigned lane, unsigned char *buf,
                     const tb_wire_frame_hdr_t *h)
{
    tb_rx_lane_t *r = &ch->rx[lane];
    uint32_t msg_id = tb_wire_le32(h->msg_id);
    uint32_t msg_len = tb_wire_le32(h->msg_len);
    uint32_t off = tb_wire_le32(h->frag_offset);
    uint32_t plen = tb_wire_le32(h->payload_len);
    unsigned char *payload = buf + TB_WIRE_HDR_SIZE;
    tb_rx_msg_t *m = r->assembling;
    int single;

    if (rx_check(ch, lane, h, m) != 0) {
        return 0;
    }
    single = !m && plen == msg_len;
    if (!single && !m) {
        m = calloc(1, sizeof(*m));
        /* Placed only when due next: the caller may publish it in the order
         * it reserved its space, so nothing before it may still be coming. */
        if (m && ch->cb.recv_place && msg_id == ch->next_deliver) {
            size_t skip = 0;
            m->data = ch->cb.recv_place(ch->cb.ctx, h->tag, msg_len, payload, plen, &skip);
            if (m->data && (skip > plen || skip > TB_CHAN_PLACE_HEAD)) {
                m->data = NULL; /* a caller's mistake: fall back to a copy */
            }
            m->placed = m->data != NULL;
            m->skip = (uint8_t) skip;
        }
        if (m && !m->data && ch->cb.recv_buf) {
            m->data = ch->cb.recv_buf(ch->cb.ctx, h->tag, msg_len);
            m->caller_buf = m->data != NULL;
        }
        if (!m || (!m->data && !(m->data = malloc(msg_len)))) {
            free(m);
            tb_ch_fail(ch, TB_CHAN_ENOMEM, "out of memory for message %u (%u bytes) on lane %u",
                       msg_id, msg_len, lane);
            return 0;
        }
        m->msg_id = msg_id;
        m->len = msg_len;
        m->tag = h->tag;
        m->lane = (uint8_t) lane;
    } else if (single && msg_id != ch->next_deliver) {
        /* It waits for a message on the other lane: once this lane runs
         * low on receives, wait in a copy (see rx_slots_low). */
        m = calloc(1, sizeof(*m));
        if (!m || (rx_slots_low(ch, lane) && !(m->data = malloc(plen ? plen : 1)))) {
            free(m);
            tb_ch_fail(ch, TB_CHAN_ENOMEM, "out of memory for message %u (%u bytes) on lane %u",
                       msg_id, plen, lane);
            return 0;
        }
    }

    r->expected++;
    ch->progress_ns = ch->now;
    r->ooo_since_nak = 0;
    if (r->unacked++ == 0) {
        r->ack_since = ch->now;
    }
    if (r->unacked >= r->ack_every) {
        ch->ack_now = 1;
    }

    if (single) {
        r->have_msg = 1;
        r->last_msg_id = msg_id;
        if (!m) {
            rx_deliver(ch, h->tag, payload, plen);
            rx_deliver_ready(ch);
            return 0;
        }
        m->msg_id = msg_id;
        m->len = plen;
        m->tag = h->tag;
        m->lane = (uint8_t) lane;
        if (m->data) {
            memcpy(m->data, payload, plen);
            ch->cnt.bytes_assembled += plen;
            rx_wait(r, m);
            return 0;
        }
        m->slot = buf;
        m->data = payload;
        r->nwaiting++;
        rx_wait(r, m);
        return 1;
    }

    if (!r->assembling) {
        r->assembling = m;
        r->have_msg = 1;
        r->last_msg_id = msg_id;
    }
    if (m->placed) {
        uint32_t in_head = off < m->skip ? m->skip - off : 0;
        if (in_head > plen) {
            in_head = plen;
        }
        if (in_head > 0) {
            memcpy(m->head + off, payload, in_head);
        }
        if (plen > in_head) { /* then off + in_head >= skip: skip <= the first fragment */
            memcpy(m->data + (off + in_head - m->skip), payload + in_head, plen - in_head);
        }
        ch->cnt.bytes_placed += plen;
    } else {
        memcpy(m->data + off, payload, plen);
        ch->cnt.bytes_assembled += plen;
    }
    m->got += plen;
    if (m->got < m->len) {
        return 0;
    }
    r->assembling = NULL;
    rx_wait(r, m);
    rx_deliver_ready(ch);
    return 0;
}

static void rx_nak(tb_channel_t *ch, tb_rx_lane_t *r)
{
    r->nak_pending = 1;
    r->ooo_since_nak = 0;
    ch->ack_now = 1;
}

/* Accept the held frames that are now in sequence; NAK the next gap at once
 * if frames wait behind it. */
static void rx_drain(tb_channel_t *ch, unsigned lane)
{
    tb_rx_lane_t *r = &ch->rx[lane];

    while (r->nheld > 0 && tb_ch_usable(ch)) {
        unsigned i = r->expected % ch->p.recv_depth[lane];
        unsigned char *buf = r->held[i];
        if (!buf) {
            rx_nak(ch, r);
            return;
        }
        r->held[i] = NULL;
        r->nheld--;
        if (rx_accept(ch, lane, buf, (const tb_wire_frame_hdr_t *) buf) == 0 && tb_ch_usable(ch)) {
            tb_ch_rx_repost(ch, lane, buf);
        }
    }
}

/* A DATA frame.  Returns 1 if the slot is now held. */
static int rx_data(tb_channel_t *ch, unsigned lane, unsigned char *buf,
                   const tb_wire_frame_hdr_t *h)
{
    tb_rx_lane_t *r = &ch->rx[lane];
    uint32_t seq = tb_wire_le32(h->seq);
    unsigned depth = ch->p.recv_depth[lane];
    int held;

    if (tb_seq_lt(seq, r->expected)) {
        ch->cnt.duplicates++;
        ch->ack_now = 1; /* our ack was probably lost */
        return 0;
    }
    if (seq != r->expected) {
        unsigned i = seq % depth;
        ch->cnt.out_of_order++;
        /* NAK a new gap at once; while it stays open, again now and then in
         * case the resend was lost too (the sender ignores NAKs that come
         * sooner than its resend could have arrived). */
        if (r->nheld == 0 || ++r->ooo_since_nak >= r->ack_every) {
            rx_nak(ch, r);
        }
        if (seq - r->expected >= depth || rx_slots_low(ch, lane)) {
            return 0; /* no room: it will be resent */
        }
        if (r->held[i]) {
            ch->cnt.duplicates++;
            return 0;
        }
        r->held[i] = buf;
        r->nheld++;
        return 1;
    }
    held = rx_accept(ch, lane, buf, h);
    rx_drain(ch, lane);
    return held;
}

/* Validate and process one received frame.  Returns 1 if the slot is held. */
static int tb_ch_rx_frame(tb_channel_t *ch, unsigned lane, unsigned char *buf, size_t len)
{
    const tb_wire_frame_hdr_t *h = (const tb_wire_frame_hdr_t *) buf;
    uint32_t plen, tsn;
    uint32_t new_una[TB_WIRE_MAX_LANES];

    if (len < TB_WIRE_HDR_SIZE || len > ch->p.frame_size[lane]) {
        rx_drop(ch, &ch->cnt.malformed, "short or oversized", lane);
        return 0;
    }
    if (tb_wire_le32(h->magic) != TB_WIRE_FRAME_MAGIC || h->version != TB_WIRE_VERSION) {
        rx_drop(ch, &ch->cnt.malformed, "bad magic or version", lane);
        return 0;
    }
    if (tb_crc32c(0, h, TB_WIRE_HDR_SIZE - 4) != tb_wire_le32(h->hdr_crc)) {
        rx_drop(ch, &ch->cnt.bad_checksum, "bad header checksum", lane);
        return 0;
    }
    plen = tb_wire_le32(h->payload_len);
    if (h->lane != lane || h->type < TB_FRAME_HELLO || h->type > TB_FRAME_CLOSE
        || plen > len - TB_WIRE_HDR_SIZE || (h->type != TB_FRAME_DATA && plen != 0)) {
        rx_drop(ch, &ch->cnt.malformed, "bad lane, type or length", lane);
        return 0;
    }
    if ((h->flags & TB_FRAME_F_PAYLOAD_CRC)
        && tb_crc32c(0, buf + TB_WIRE_HDR_SIZE, plen) != tb_wire_le32(h->payload_crc)) {
        rx_drop(ch, &ch->cnt.bad_checksum, "bad payload checksum", lane);
        return 0;
    }
    if (tb_wire_le64(h->dst_epoch) != ch->p.epoch) {
        ch->cnt.stale++;
        return 0;
    }
    if (tb_wire_le64(h->src_epoch) != ch->peer_epoch) {
        if (h->type == TB_FRAME_HELLO) {
            tb_ch_fail(ch, TB_CHAN_ERESTARTED,
                       "peer restarted (incarnation %016llx, expected %016llx)",
                       (unsigned long long) tb_wire_le64(h->src_epoch),
                       (unsigned long long) ch->peer_epoch);
        } else {
            ch->cnt.stale++;
        }
        return 0;
    }
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        new_una[l] = tb_wire_le32(h->ack[l]) + 1;
        if (tb_seq_lt(ch->tx[l].next_seq, new_una[l])) {
            rx_drop(ch, &ch->cnt.malformed, "ack beyond what was sent", lane);
            return 0;
        }
    }

    /* From here on the frame is trusted. */
    tsn = tb_wire_le32(h->tsn);
    if (tb_seq_lt(ch->rx[lane].h_tsn, tsn)) {
        ch->rx[lane].h_tsn = tsn;
    }
    ch->last_rx_ns = ch->now;
    ch->ka_unanswered = 0;
    if (ch->state == CH_CONNECTING) {
        ch->state = CH_ESTABLISHED;
        tb_ch_hello_done(ch, h->type);
    }
    for (unsigned l = 0; l < ch->p.nlanes && tb_ch_usable(ch); l++) {
        tb_tx_lane_t *t = &ch->tx[l];
        uint32_t lim = tb_wire_le32(h->credit[l]);
        /* The peer cannot have posted more receives than its depth beyond
         * the last tsn it can have seen; a larger limit is a lie. */
        uint32_t most = t->next_tsn - 1 + t->peer_depth;
        if (tb_seq_lt(most, lim)) {
            lim = most;
        }
        /* The answer to our probe (it echoes the probe's tsn, or a later
         * one): whatever the lane sent before the probe and is still unacked
         * did not arrive. */
        int answered = t->probing
                       && tb_seq16_diff(tb_wire_le16(h->echo_tsn[0]), (uint16_t) t->probe_tsn) >= 0;
        if (tb_seq_lt(t->peer_limit, lim)) {
            t->peer_limit = lim;
        }
        tb_ch_tx_ack(ch, l, new_una[l], tb_wire_le16(h->echo_tsn[l]));
        if (h->flags & (l == 0 ? TB_FRAME_F_NAK0 : TB_FRAME_F_NAK1)) {
            ch->cnt.naks_received++;
            tb_ch_tx_nak(ch, t, new_una[l],
                         h->type != TB_FRAME_ACK ? 0
                         : tb_wire_le32(l == 0 ? h->msg_len : h->frag_offset));
        }
        if (answered) {
            /* Answered by the probe itself (its exact tsn): a clean lane-0
             * round trip, the probe being sent once. */
            if (l == 0 && tb_wire_le16(h->echo_tsn[0]) == (uint16_t) t->probe_tsn
                && h->type == TB_FRAME_ACK) {
                tb_ch_rtt_sample(ch, 0, ch->now - ch->last_probe_at);
            }
            t->probing = 0;
            /* Lane 0 is the probe's own queue pair: what went before it and
             * is still unacked is lost.  The bulk lane is another queue pair,
             * which the probe may have overtaken: resend only its oldest
             * unacked frame, asking for an ack; the answer's bitmap then
             * shows exactly what is missing (tx_nak). */
            if (tb_seq_lt(t->una, t->probe_end)) {
                ch->cnt.probe_repairs++;
                tb_ch_tx_goback(ch, t, l == 0 ? t->probe_end : t->una + 1);
            }
        }
    }
    if (!tb_ch_usable(ch)) {
        return 0;
    }
    if (h->flags & TB_FRAME_F_ACK_REQ) {
        ch->ack_now = 1;
    }
    switch (h->type) {
    case TB_FRAME_HELLO:
        ch->ack_now = 1;
        return 0;
    case TB_FRAME_DATA:
        return rx_data(ch, lane, buf, h);
    case TB_FRAME_CLOSE:
        tb_ch_fail(ch, TB_CHAN_ECLOSED, "peer closed the channel");
        return 0;
    default:
        return 0;
    }
}

void tb_channel_recv_done(tb_channel_t *ch, unsigned lane, void *buf, size_t len, int status)
{
    ch->dirty = 1;
    if (lane >= ch->p.nlanes) {
        TB_ERROR("link reported a receive on lane %u; the channel has %u", lane, ch->p.nlanes);
        return;
    }
    ch->rx[lane].posted--;
    ch->cnt.frames_received++;
    if (status != 0) {
        tb_ch_fail(ch, TB_CHAN_ELINK, "receive completion error %d on lane %u", status, lane);
        return;
    }
    if (!tb_ch_usable(ch)) {
        return;
    }
    if (tb_ch_rx_frame(ch, lane, buf, len) == 0 && tb_ch_usable(ch)) {
        tb_ch_rx_repost(ch, lane, buf);
    }
}

