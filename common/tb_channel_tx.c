/*
 * tbrdma common layer: the reliable channel's transmission (see tb_channel.c):
 * credits, posting, fragmentation, resends, acks, and the send calls.
 */
#include "tb_channel_int.h"

/* Requests are recycled (up to REQ_CACHE per channel): a malloc and free per
 * small message were a tenth of the channel's CPU time per message. */
void tb_ch_req_free(tb_channel_t *ch, tb_send_req_t *req)
{
    if (req->iov != &req->iov_one) {
        free(req->iov);
    }
    free(req->own);
    if (ch->nreq_cache < REQ_CACHE) {
        req->next = ch->req_cache;
        ch->req_cache = req;
        ch->nreq_cache++;
        return;
    }
    free(req);
}

static tb_send_req_t *tb_ch_req_alloc(tb_channel_t *ch)
{
    tb_send_req_t *req = ch->req_cache;

    if (!req) {
        return calloc(1, sizeof(*req));
    }
    ch->req_cache = req->next;
    ch->nreq_cache--;
    memset(req, 0, sizeof(*req));
    return req;
}

/* ------------------------------------------------------------------ */
/* Transmission                                                        */

static uint32_t tb_ch_rx_limit(tb_channel_t *ch, unsigned l)
{
    tb_rx_lane_t *r = &ch->rx[l];
    uint32_t lim = r->h_tsn + r->posted;
    return tb_seq_lt(lim, r->adv_limit) ? r->adv_limit : lim;
}

static int tb_ch_tx_credit_ok(tb_channel_t *ch, unsigned lane, int is_ctrl)
{
    const tb_tx_lane_t *t = &ch->tx[lane];
    int32_t reserve = (lane == 0 && !is_ctrl) ? CTRL_RESERVE : 0;
    /* Credits left: peer_limit - next_tsn + 1 > reserve, written without
     * the + 1 that could overflow. */
    return tb_seq_diff(t->peer_limit, t->next_tsn) >= reserve;
}

/* The selective-ack bitmap of lane l: bit i is seq expected + 1 + i held. */
static uint32_t rx_sack(const tb_channel_t *ch, unsigned l)
{
    const tb_rx_lane_t *r = &ch->rx[l];
    unsigned depth = ch->p.recv_depth[l];
    uint32_t sack = 0;

    for (unsigned i = 0; r->nheld > 0 && i < 32 && i + 1 < depth; i++) {
        if (r->held[(r->expected + 1 + i) % depth]) {
            sack |= 1u << i;
        }
    }
    return sack;
}

/* Stamp the per-transmission fields (tsn, acks, credits) and post. */
int tb_ch_tx_post(tb_channel_t *ch, tb_tx_frame_t *f, uint8_t flags)
{
    tb_wire_frame_hdr_t *h = f->buf;
    tb_tx_lane_t *t = &ch->tx[f->lane];
    int rc;

    for (unsigned l = 0; l < TB_WIRE_MAX_LANES; l++) {
        if (l >= ch->p.nlanes) {
            h->ack[l] = 0;
            h->credit[l] = 0;
            h->echo_tsn[l] = 0;
            continue;
        }
        tb_rx_lane_t *r = &ch->rx[l];
        uint32_t lim = tb_ch_rx_limit(ch, l);
        h->ack[l] = tb_wire_le32(r->expected - 1);
        h->credit[l] = tb_wire_le32(lim);
        h->echo_tsn[l] = tb_wire_le16((uint16_t) r->h_tsn);
        r->adv_limit = lim;
        r->unacked = 0;
        if (r->nak_pending && h->type == TB_FRAME_ACK) {
            uint32_t sack = tb_wire_le32(rx_sack(ch, l));
            flags |= l == 0 ? TB_FRAME_F_NAK0 : TB_FRAME_F_NAK1;
            if (l == 0) {
                h->msg_len = sack;
            } else {
                h->frag_offset = sack;
            }
            r->nak_pending = 0;
            ch->cnt.naks_sent++;
        }
    }
    ch->ack_now = 0;
    h->flags = flags;
    h->src_epoch = tb_wire_le64(ch->p.epoch);
    h->dst_epoch = tb_wire_le64(ch->peer_epoch);
    f->tsn = t->next_tsn++;
    h->tsn = tb_wire_le32(f->tsn);
    h->hdr_crc = tb_wire_le32(tb_crc32c(0, h, TB_WIRE_HDR_SIZE - 4));

    rc = ch->link->ops->post_send(ch->link, f->lane, f->buf, f->len, f);
    if (rc != 0) {
        tb_ch_fail(ch, TB_CHAN_ELINK, "posting a send on lane %u failed (%d)", f->lane, rc);
        return rc;
    }
    f->posted = 1;
    ch->cnt.frames_sent++;
    ch->last_tx_ns = ch->now;
    return 0;
}

static void tb_ch_hdr_init(tb_wire_frame_hdr_t *h, uint8_t type, unsigned lane)
{
    memset(h, 0, TB_WIRE_HDR_SIZE);
    h->magic = tb_wire_le32(TB_WIRE_FRAME_MAGIC);
    h->version = TB_WIRE_VERSION;
    h->type = type;
    h->lane = (uint8_t) lane;
}

/* Send a header-only frame on lane 0.  A HELLO ignores credits (nothing is
 * known about the peer's receives yet, and a lost HELLO is resent), and so
 * does a credit probe (see tx_credit_probe). */
int tb_ch_tx_ctrl(tb_channel_t *ch, uint8_t type, uint8_t flags, int ignore_credit)
{
    tb_tx_frame_t *f = ch->ctrl_free;

    if (!f || (!ignore_credit && !tb_ch_tx_credit_ok(ch, 0, 1))) {
        return -1;
    }
    f->buf = ch->link->ops->send_buf_get(ch->link, 0);
    if (!f->buf) {
        return -1;
    }
    ch->ctrl_free = f->next_free;
    tb_ch_hdr_init(f->buf, type, 0);
    f->len = TB_WIRE_HDR_SIZE;
    if (tb_ch_tx_post(ch, f, flags) != 0) {
        return -1;
    }
    ch->cnt.ctrl_frames_sent++;
    if (flags & TB_FRAME_F_KEEPALIVE) {
        ch->cnt.keepalives_sent++;
        ch->last_ka_ns = ch->now;
        ch->ka_unanswered = 1;
    }
    return 0;
}

/* Copy the next fragment of req into buf. */
static uint32_t frag_fill(tb_channel_t *ch, tb_send_req_t *req, unsigned lane, unsigned char *buf)
{
    uint32_t plen = req->len - req->sent;
    uint32_t left;
    unsigned char *dst = buf;

    (void) ch;
    (void) lane;
    if (plen > req->frag_size) {
        plen = req->frag_size;
    }
    left = plen;
    while (left > 0) {
        const struct iovec *v = &req->iov[req->iov_idx];
        size_t n = v->iov_len - req->iov_off;
        if (n > left) {
            n = left;
        }
        memcpy(dst, (const unsigned char *) v->iov_base + req->iov_off, n);
        dst += n;
        left -= (uint32_t) n;
        req->iov_off += n;
        if (req->iov_off == v->iov_len) {
            req->iov_idx++;
            req->iov_off = 0;
        }
    }
    return plen;
}

/* A new data frame f, its header filled but for seq, msg_id and flags, of
 * plen payload bytes, goes out on lane t as the next seq: the fields every
 * transmission stamps are tb_ch_tx_post's. */
static int tx_first_post(tb_channel_t *ch, tb_tx_lane_t *t, tb_tx_frame_t *f, uint32_t plen)
{
    tb_wire_frame_hdr_t *h = f->buf;
    uint8_t flags = 0;

    h->seq = tb_wire_le32(t->next_seq);
    h->msg_id = tb_wire_le32(f->msg_id);
    /* Ask for an ack once half the window is out, so the peer can coalesce
     * the rest of its acks (or piggyback them) without stalling us. */
    if (t->next_seq - t->una + 1 == (t->window + 1) / 2) {
        flags |= TB_FRAME_F_ACK_REQ;
    }
    if (ch->p.payload_crc) {
        flags |= TB_FRAME_F_PAYLOAD_CRC;
        h->payload_crc = tb_wire_le32(tb_crc32c(0, h + 1, plen));
    }
    h->flags = flags;
    f->acked = f->posted = f->retx = f->sacked = f->let_go = 0;
    f->sent_ns = f->first_ns = ch->now;
    f->len = TB_WIRE_HDR_SIZE + plen;
    if (f->len < t->post_min) {
        f->len = t->post_min; /* the receive has the lane's frame count */
    }
    if (t->una == t->next_seq) {
        t->timer_start = ch->now;
        t->ack_progress_ns = ch->now;
    }
    t->next_seq++;
    ch->cnt.data_frames_sent++;
    return tb_ch_tx_post(ch, f, flags);
}

static int tx_new_frame(tb_channel_t *ch, unsigned lane)
{
    tb_tx_lane_t *t = &ch->tx[lane];
    tb_send_req_t *req = t->q_cur;
    tb_tx_frame_t *f = &t->ring[t->next_seq % t->window];
    tb_wire_frame_hdr_t *h;
    uint32_t off = req->sent, plen;
    void *buf;

    buf = ch->link->ops->send_buf_get(ch->link, lane);
    if (!buf) {
        return -1;
    }
    h = buf;
    tb_ch_hdr_init(h, TB_FRAME_DATA, lane);
    plen = frag_fill(ch, req, lane, (unsigned char *) buf + TB_WIRE_HDR_SIZE);
    h->msg_len = tb_wire_le32(req->len);
    h->frag_offset = tb_wire_le32(off);
    h->payload_len = tb_wire_le32(plen);
    h->tag = req->tag;
    f->buf = buf;
    f->msg_id = req->msg_id;
    f->lane = (uint8_t) lane;
    /* Kept whole only for an owner that takes messages back (unsent).  A
     * message of more frames than the window never could be: its frames go
     * as they are acked, and a failed channel cannot hand it back. */
    f->whole = NULL != ch->cb.unsent && req->frags_total <= t->window;
    req->sent += plen;
    if (++req->frags_sent == req->frags_total) {
        t->q_cur = req->next;
    }
    return tx_first_post(ch, t, f, plen);
}

/* The lane of a message of len bytes.  Bulk frames are padded to the full
 * frame count, so the bulk lane pays off only from about half a bulk frame
 * (measured on the virtual cluster with 4 and 64 KiB frames: 16 KiB is faster
 * as small frames, 48 KiB as one bulk frame, 32 KiB is even). */
static unsigned tb_ch_msg_lane(const tb_channel_t *ch, uint64_t len)
{
    return ch->p.nlanes > 1 && len > ch->tx[0].frag_cap && len >= ch->p.frame_size[1] / 2;
}

static void tx_stall(tb_channel_t *ch, tb_tx_lane_t *t)
{
    if (!t->stalled) {
        t->stalled = 1;
        t->stall_since = ch->now;
        ch->cnt.credit_stalls++;
    }
}

/* The oldest message lane t has not had wholly acked: its oldest unacked
 * frame's, else the next one it will send; false when it has none. */
static int lane_oldest_unacked(const tb_tx_lane_t *t, uint32_t *msg_id)
{
    if (t->una != t->next_seq) {
        *msg_id = t->ring[t->una % t->window].msg_id;
    } else if (t->q_cur) {
        *msg_id = t->q_cur->msg_id;
    } else {
        return 0;
    }
    return 1;
}

/* Whether message msg_id may start on lane l: less than TB_CHAN_MAX_AHEAD
 * past the oldest unacked message of every other lane.  Every message below
 * those is acked, hence accepted (an acked frame is never dropped), and so are
 * the earlier ones of lane l (a lane is in order): all are delivered by the
 * time msg_id starts, which keeps it within the receiver's window. */
static int tb_ch_tx_order_ok(const tb_channel_t *ch, unsigned l, uint32_t msg_id)
{
    for (unsigned l2 = 0; l2 < ch->p.nlanes; l2++) {
        uint32_t oldest;
        if (l2 == l || !lane_oldest_unacked(&ch->tx[l2], &oldest)) {
            continue;
        }
        if (tb_seq_diff(msg_id, oldest) >= (int32_t) TB_CHAN_MAX_AHEAD) {
            return 0;
        }
    }
    return 1;
}

void tb_ch_tx_push(tb_channel_t *ch)
{
    unsigned budget = ch->p.max_frames_per_progress;

    if (ch->state != CH_ESTABLISHED) {
        return;
    }
    for (unsigned l = 0; l < ch->p.nlanes && ch->state == CH_ESTABLISHED; l++) {
        tb_tx_lane_t *t = &ch->tx[l];

        while (t->retx_next != t->retx_end && budget > 0) {
            tb_tx_frame_t *f = &t->ring[t->retx_next % t->window];
            uint8_t flags;
            if (f->posted) {
                break; /* the previous post still reads the slot */
            }
            if (f->sacked) {
                t->retx_next++;
                continue;
            }
            if (!tb_ch_tx_credit_ok(ch, l, 0)) {
                tx_stall(ch, t);
                break;
            }
            t->stalled = 0;
            flags = (((tb_wire_frame_hdr_t *) f->buf)->flags & TB_FRAME_F_PAYLOAD_CRC)
                    | TB_FRAME_F_RETX;
            if (t->retx_next == t->una) {
                flags |= TB_FRAME_F_ACK_REQ;
            }
            t->retx_next++;
            budget--;
            f->retx = 1;
            f->sent_ns = ch->now;
            ch->cnt.retransmits++;
            if (tb_ch_tx_post(ch, f, flags) != 0) {
                return;
            }
        }
        if (t->retx_next != t->retx_end) {
            continue;
        }
        while (t->q_cur && budget > 0) {
            tb_tx_frame_t *f = &t->ring[t->next_seq % t->window];
            if (t->next_seq - t->una >= t->window || f->buf) {
                break;
            }
            if (t->q_cur->frags_sent == 0 && !tb_ch_tx_order_ok(ch, l, t->q_cur->msg_id)) {
                if (!t->order_stalled) {
                    t->order_stalled = 1;
                    ch->cnt.order_stalls++;
                }
                break;
            }
            t->order_stalled = 0;
            if (!tb_ch_tx_credit_ok(ch, l, 0)) {
                tx_stall(ch, t);
                break;
            }
            t->stalled = 0;
            if (tx_new_frame(ch, l) != 0) {
                break;
            }
            budget--;
        }
        if (!t->q_cur && t->retx_next == t->retx_end) {
            t->stalled = 0;
        }
    }
}

/* Resend from the oldest unacked frame up to (not including) end, or to the
 * end of a resend already under way. */
void tb_ch_tx_goback(tb_channel_t *ch, tb_tx_lane_t *t, uint32_t end)
{
    if (t->retx_next == t->retx_end || tb_seq_lt(t->retx_end, end)) {
        t->retx_end = end;
    }
    t->retx_next = t->una;
    t->repair_end = t->retx_end;
    t->timer_start = ch->now;
    t->last_goback_ns = ch->now;
    t->last_goback_una = t->una;
}

/* A NAK on lane t for the gap at `gap` (the frame's ack + 1), with the
 * peer's bitmap (0 from a peer that sends none): resend every gap below the
 * highest held frame.  Gaps already resent within a round trip were NAKed
 * before that resend could arrive: only gaps above them are new. */
void tb_ch_tx_nak(tb_channel_t *ch, tb_tx_lane_t *t, uint32_t gap, uint32_t sack)
{
    uint32_t end = gap + 1;

    if (gap != t->una || t->una == t->next_seq) {
        return; /* an older frame, overtaken by acks since */
    }
    for (unsigned i = 0; i < 32 && sack; i++, sack >>= 1) {
        uint32_t seq = gap + 1 + i;
        if (!(sack & 1) || !tb_seq_lt(seq, t->next_seq)) {
            continue;
        }
        t->ring[seq % t->window].sacked = 1;
        end = seq + 1;
    }
    if (t->last_goback_una != t->una
        || ch->now - t->last_goback_ns >= (t->srtt ? t->srtt : t->rto)) {
        tb_ch_tx_goback(ch, t, end);
    } else if (tb_seq_lt(t->repair_end, end)) {
        if (t->retx_next == t->retx_end) {
            t->retx_next = t->repair_end;
        }
        t->retx_end = end;
        t->repair_end = end;
    }
}

/* ------------------------------------------------------------------ */
/* Acks                                                                */

/* A send is complete once its last fragment is in a send slot: the caller's
 * memory is not read again (a resend resends the slot), and a peer that never
 * acknowledges fails the channel, which is fatal for the job anyway.  Waiting
 * for the ack instead held every buffer a round trip longer.  Called from
 * progress only, never inside tb_channel_sendv (a caller's send must not
 * complete before it returns). */
void tb_ch_tx_complete_reqs(tb_channel_t *ch, tb_tx_lane_t *t)
{
    while (tb_ch_usable(ch) && t->q_head && t->q_head != t->q_cur
           && t->q_head->frags_sent == t->q_head->frags_total) {
        tb_send_req_t *req = t->q_head;
        t->q_head = req->next;
        if (!t->q_head) {
            t->q_tail = NULL;
        }
        ch->pending--;
        ch->pending_bytes -= req->len;
        ch->cnt.msgs_sent++;
        ch->cnt.bytes_sent += req->len;
        if (ch->cb.send_done) {
            ch->in_callback++;
            ch->cb.send_done(ch->cb.ctx, req->cookie, TB_CHAN_OK);
            ch->in_callback--;
        }
        tb_ch_req_free(ch, req);
    }
}

/* The oldest message not wholly acked, over every lane. */
static uint32_t tx_oldest_unacked(const tb_channel_t *ch)
{
    uint32_t oldest = ch->next_msg_id;

    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        uint32_t m;
        if (lane_oldest_unacked(&ch->tx[l], &m) && tb_seq_lt(m, oldest)) {
            oldest = m;
        }
    }
    return oldest;
}

/* Acked frames go back to the link once their message and every earlier one
 * are wholly acked: the peer then has delivered them all (it delivers in
 * order, as soon as it can), and a channel that fails still holds every
 * message it may not have (tb_ch_tx_hand_back).  The oldest message can
 * always complete (a whole one fits the window), so nothing waits for ever.
 * A frame still posted goes at its completion. */
void tb_ch_tx_release(tb_channel_t *ch)
{
    ch->release_msg = tx_oldest_unacked(ch);
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        tb_tx_lane_t *t = &ch->tx[l];
        while (t->keep != t->una) {
            tb_tx_frame_t *f = &t->ring[t->keep % t->window];
            if (f->whole && !tb_seq_lt(f->msg_id, ch->release_msg)) {
                break;
            }
            if (!f->posted) {
                tb_ch_release_tx_frame(ch, f);
            } else {
                f->let_go = 1; /* at its completion */
            }
            t->keep++;
        }
    }
}

/* The channel failed: every message from the oldest not wholly acked on,
 * whole, in send order, to the unsent callback (which copies what it keeps).
 * Some frames of it may be in send slots, the rest still in the caller's
 * memory (a request not yet all sent). */
void tb_ch_tx_hand_back(tb_channel_t *ch)
{
    uint32_t seq[TB_WIRE_MAX_LANES];
    tb_send_req_t *req[TB_WIRE_MAX_LANES];

    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        seq[l] = ch->tx[l].keep;
        req[l] = ch->tx[l].q_cur;
    }
    for (;;) {
        int lane = -1;
        uint32_t best = 0, m = 0, len = 0;
        uint8_t tag = 0;
        int whole;
        unsigned n = 0, cap;
        size_t total = 0;
        struct iovec *iov;
        tb_tx_lane_t *t;

        for (unsigned l = 0; l < ch->p.nlanes; l++) {
            const tb_tx_lane_t *u = &ch->tx[l];
            if (seq[l] != u->next_seq) {
                m = u->ring[seq[l] % u->window].msg_id;
            } else if (req[l]) {
                m = req[l]->msg_id;
            } else {
                continue;
            }
            if (lane < 0 || tb_seq_lt(m, best)) {
                lane = (int) l;
                best = m;
            }
        }
        if (lane < 0) {
            return;
        }
        t = &ch->tx[lane];
        cap = (seq[lane] != t->next_seq ? t->next_seq - seq[lane] : 0)
              + (req[lane] && req[lane]->msg_id == best ? (unsigned) req[lane]->iovcnt : 0);
        iov = calloc(cap ? cap : 1, sizeof(*iov));
        if (!iov) {
            TB_WARN("out of memory handing back the unacknowledged messages of a failed "
                    "channel: the rest are lost");
            return;
        }
        while (seq[lane] != t->next_seq && t->ring[seq[lane] % t->window].msg_id == best) {
            const tb_wire_frame_hdr_t *h = t->ring[seq[lane] % t->window].buf;
            iov[n].iov_base = (unsigned char *) t->ring[seq[lane] % t->window].buf
                              + TB_WIRE_HDR_SIZE;
            iov[n++].iov_len = tb_wire_le32(h->payload_len);
            total += tb_wire_le32(h->payload_len);
            tag = h->tag;
            len = tb_wire_le32(h->msg_len);
            seq[lane]++;
        }
        if (req[lane] && req[lane]->msg_id == best) {
            tb_send_req_t *r = req[lane];
            for (int i = r->iov_idx; i < r->iovcnt; i++) {
                size_t skip = i == r->iov_idx ? r->iov_off : 0;
                iov[n].iov_base = (unsigned char *) r->iov[i].iov_base + skip;
                iov[n++].iov_len = r->iov[i].iov_len - skip;
                total += r->iov[i].iov_len - skip;
            }
            tag = r->tag;
            len = r->len;
            req[lane] = r->next;
        }
        /* Short when it is larger than the window: its first frames went as
         * they were acked. */
        whole = total == len;
        ch->in_callback++;
        ch->cb.unsent(ch->cb.ctx, tag, whole ? iov : NULL, whole ? (int) n : 0, len);
        ch->in_callback--;
        free(iov);
    }
}

void tb_ch_tx_ack(tb_channel_t *ch, unsigned lane, uint32_t new_una, uint16_t echo)
{
    tb_tx_lane_t *t = &ch->tx[lane];
    tb_tx_frame_t *newest;
    uint64_t sent_ns, resent_ns = 0, orig_ns = 0;

    if (!tb_seq_lt(t->una, new_una)) {
        return;
    }
    /* The newest frame this ack covers waited least for it (acks are
     * coalesced): the best sample, unless it was resent (Karn: whose ack is
     * it?) or an older frame it covers was resent after it went out (then
     * it waited behind a gap and measures the repair, not the round trip;
     * sent after the repair, it arrived after it: a QP does not reorder). */
    newest = &t->ring[(new_una - 1) % t->window];
    sent_ns = newest->retx ? 0 : newest->sent_ns;
    while (t->una != new_una) {
        tb_tx_frame_t *f = &t->ring[t->una % t->window];
        if (f->retx && f->sent_ns > resent_ns) {
            resent_ns = f->sent_ns;
        }
        /* Acked by a frame that left the peer before our resend reached it:
         * the original had arrived, the resend was not needed, and the ack
         * times the original (Eifel, RFC 3522). */
        if (f->retx && tb_seq16_diff(echo, (uint16_t) f->tsn) < 0) {
            ch->cnt.spurious_retransmits++;
            orig_ns = f->first_ns;
        }
        f->acked = 1;
        t->una++;
    }
    tb_ch_tx_release(ch);
    t->probing = 0;
    if (sent_ns != 0 && sent_ns >= resent_ns) {
        tb_ch_rtt_sample(ch, lane, ch->now - sent_ns);
    } else if (orig_ns != 0) {
        /* The timeout was too short for the wire: learn its round trip,
         * which also ends the backoff. */
        tb_ch_rtt_sample(ch, lane, ch->now - orig_ns);
    }
    if (tb_seq_lt(t->retx_next, t->una)) {
        t->retx_next = t->una;
    }
    if (tb_seq_lt(t->retx_end, t->una)) {
        t->retx_end = t->una;
    }
    t->timer_start = ch->now;
    t->ack_progress_ns = ch->now;
    ch->progress_ns = ch->now;
}

void tb_channel_send_done(tb_channel_t *ch, void *cookie, int status)
{
    ch->dirty = 1;
    tb_tx_frame_t *f = cookie;

    f->posted = 0;
    if (status != 0) {
        /* Releases every frame not posted, this one included. */
        tb_ch_fail(ch, TB_CHAN_ELINK, "send completion error %d on lane %u", status, f->lane);
    }
    if (f->is_ctrl || f->let_go || !tb_ch_usable(ch)) {
        tb_ch_release_tx_frame(ch, f);
    }
}

int tb_channel_sendv(tb_channel_t *ch, uint8_t tag, const struct iovec *iov, int iovcnt,
                     void *cookie)
{
    tb_send_req_t *req;
    uint64_t len = 0;
    unsigned lane = 0;

    if (ch->state == CH_FAILED || ch->state == CH_CLOSED) {
        return ch->status;
    }
    if (ch->begun) {
        return TB_CHAN_ESTATE; /* a fast-path message must be committed first */
    }
    if (iovcnt < 0 || (iovcnt > 0 && !iov)) {
        return TB_CHAN_EINVAL;
    }
    for (int i = 0; i < iovcnt; i++) {
        len += iov[i].iov_len;
    }
    if (len > ch->p.max_msg_size) {
        return TB_CHAN_EMSGSIZE;
    }
    /* Backpressure; a message larger than the byte limit still goes alone. */
    if (ch->pending > 0 && (ch->pending >= ch->p.max_queued_msgs
                            || ch->pending_bytes + len > ch->p.max_queued_bytes)) {
        return TB_CHAN_EAGAIN;
    }
    req = tb_ch_req_alloc(ch);
    if (!req) {
        return TB_CHAN_ENOMEM;
    }
    if (iovcnt <= 1) {
        req->iov = &req->iov_one;
        if (iovcnt == 1) {
            req->iov_one = iov[0];
        }
    } else {
        req->iov = malloc((size_t) iovcnt * sizeof(*iov));
        if (!req->iov) {
            req->iov = &req->iov_one;
            tb_ch_req_free(ch, req);
            return TB_CHAN_ENOMEM;
        }
        memcpy(req->iov, iov, (size_t) iovcnt * sizeof(*iov));
    }
    lane = tb_ch_msg_lane(ch, len);
    req->cookie = cookie;
    req->tag = tag;
    req->len = (uint32_t) len;
    req->iovcnt = iovcnt;
    req->msg_id = ch->next_msg_id++;
    req->frags_total = len == 0 ? 1
                                : (uint32_t) ((len + ch->tx[lane].frag_cap - 1)
                                              / ch->tx[lane].frag_cap);
    /* Split evenly: a message of n frames then has no nearly empty tail frame
     * padded to the lane's full frame count (the frame rule), and from about
     * 16 bulk frames on, no frame needs padding at all. */
    req->frag_size = (uint32_t) ((len + req->frags_total - 1) / req->frags_total);
    {
        tb_tx_lane_t *t = &ch->tx[lane];
        if (t->q_tail) {
            t->q_tail->next = req;
        } else {
            t->q_head = req;
        }
        t->q_tail = req;
        if (!t->q_cur) {
            t->q_cur = req;
        }
    }
    ch->pending++;
    ch->dirty = 1;
    ch->pending_bytes += len;
    if (!ch->in_callback) {
        tb_ch_tx_push(ch);
    }
    return TB_CHAN_OK;
}

/* The fast path: a message that fits one frame and may go at once (its lane
 * idle, a slot, credit and window free) is written by the caller straight
 * into its send slot and posted.  Not from inside a callback: a failing post
 * would fail the channel under the frame being handled. */
void *tb_channel_send_begin(tb_channel_t *ch, uint8_t tag, size_t len)
{
    unsigned lane;
    tb_tx_lane_t *t;
    tb_tx_frame_t *f;
    tb_wire_frame_hdr_t *h;

    if (ch->state != CH_ESTABLISHED || ch->in_callback || ch->begun || len > ch->p.max_msg_size) {
        return NULL;
    }
    lane = tb_ch_msg_lane(ch, len);
    t = &ch->tx[lane];
    f = &t->ring[t->next_seq % t->window];
    if (len > t->frag_cap || t->q_cur || t->retx_next != t->retx_end
        || t->next_seq - t->una >= t->window || f->buf || !tb_ch_tx_credit_ok(ch, lane, 0)
        || !tb_ch_tx_order_ok(ch, lane, ch->next_msg_id)) {
        return NULL;
    }
    f->buf = ch->link->ops->send_buf_get(ch->link, lane);
    if (!f->buf) {
        return NULL;
    }
    h = f->buf;
    tb_ch_hdr_init(h, TB_FRAME_DATA, lane);
    h->msg_len = h->payload_len = tb_wire_le32((uint32_t) len);
    h->tag = tag;
    ch->begun = f;
    return (unsigned char *) f->buf + TB_WIRE_HDR_SIZE;
}

int tb_channel_send_commit(tb_channel_t *ch)
{
    tb_tx_frame_t *f = ch->begun;
    uint32_t len;

    if (!f) {
        return TB_CHAN_ESTATE;
    }
    ch->begun = NULL;
    len = tb_wire_le32(((tb_wire_frame_hdr_t *) f->buf)->payload_len);
    f->msg_id = ch->next_msg_id++;
    f->whole = NULL != ch->cb.unsent;
    ch->cnt.msgs_sent++;
    ch->cnt.bytes_sent += len;
    return tx_first_post(ch, &ch->tx[f->lane], f, len) == 0 ? TB_CHAN_OK : ch->status;
}

void tb_channel_send_cancel(tb_channel_t *ch)
{
    if (ch->begun) {
        tb_ch_release_tx_frame(ch, ch->begun);
        ch->begun = NULL;
    }
}

int tb_channel_send(tb_channel_t *ch, uint8_t tag, const void *buf, size_t len, void *cookie)
{
    struct iovec iov = {.iov_base = (void *) buf, .iov_len = len};
    return tb_channel_sendv(ch, tag, &iov, 1, cookie);
}

/* Copy what is left of req's message into memory of its own. */
static int req_detach(tb_send_req_t *req)
{
    uint32_t left = req->len - req->sent;
    unsigned char *own;
    size_t done = 0;

    if (left == 0 || req->own) {
        return 0;
    }
    own = malloc(left);
    if (!own) {
        return TB_CHAN_ENOMEM;
    }
    for (int i = req->iov_idx; done < left; i++) {
        size_t skip = i == req->iov_idx ? req->iov_off : 0;
        size_t n = req->iov[i].iov_len - skip;
        if (n > left - done) {
            n = left - done;
        }
        memcpy(own + done, (const unsigned char *) req->iov[i].iov_base + skip, n);
        done += n;
    }
    if (req->iov != &req->iov_one) {
        free(req->iov);
    }
    req->own = own;
    req->iov = &req->iov_one;
    req->iov_one.iov_base = own;
    req->iov_one.iov_len = left;
    req->iovcnt = 1;
    req->iov_idx = 0;
    req->iov_off = 0;
    return 0;
}

int tb_channel_send_detach(tb_channel_t *ch, void *cookie)
{
    int found = 0;

    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        for (tb_send_req_t *req = ch->tx[l].q_head; req; req = req->next) {
            if (req->cookie != cookie) {
                continue;
            }
            found = 1;
            if (req_detach(req) != 0) {
                return TB_CHAN_ENOMEM;
            }
        }
    }
    return found ? TB_CHAN_OK : 1;
}

