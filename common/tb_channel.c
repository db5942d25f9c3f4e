/*
 * tbrdma common layer: the reliable channel (see tb_channel.h).
 *
 * Per lane, two sequence spaces:
 *  - tsn counts transmissions.  The receiver advertises an absolute limit,
 *    "highest tsn seen + receives posted now": every transmission up to the
 *    limit finds a receive, because a lost frame consumed none and a frame
 *    that landed is counted once it is polled.  A later advertisement always
 *    supersedes an earlier one, so lost or duplicated updates heal by
 *    themselves.  The sender keeps CTRL_RESERVE lane-0 credits for control
 *    frames, so acks and credit updates always get through and two
 *    saturated peers cannot deadlock.
 *  - seq numbers data frames; the receiver acks cumulatively.  On UC a QP
 *    does not reorder, so a gap means loss.  Selective repeat: a frame after
 *    a gap is held while there is room (all but HOLD_SPARE of the lane's
 *    receives, so that the missing frame and control frames still find
 *    receives) and the gap is NAKed at once, and again now and then while
 *    it stays open.  A NAK rides only on an ACK frame, whose msg_len and
 *    frag_offset (message fields, unused in an ACK) then carry a bitmap per
 *    lane: bit i set means seq ack[l] + 2 + i is held.  The sender resends
 *    every gap below the highest held frame (a peer that sends no bitmap
 *    gets the first gap only) and, on a timeout, every unacked frame the
 *    peer does not hold (a receiver never drops a frame it holds).  On a
 *    lossy link, resending a whole window per loss, as go-back-N does, costs
 *    many times the loss.
 * Messages carry a channel-wide msg_id so that messages on the two lanes are
 * delivered in send order.
 *
 * Retransmit timeout, per lane (RFC 6298): every data frame remembers when it
 * was last posted; an ack gives a round-trip sample from the newest frame it
 * covers if that was never resent (Karn's rule: whose ack is it?) and no
 * frame it covers was resent later (see tx_ack), smoothed into SRTT and
 * RTTVAR; RTO = SRTT + 4 RTTVAR clamped to [rto_min, rto_max].  An expiry
 * doubles the RTO, and the doubled value stays until a new sample: that is
 * what lets a link slower than the estimate produce a clean sample again.
 * The HELLO exchange seeds the estimate when it can (one HELLO sent and
 * answered), and HELLO retries back off the same way from rto_initial.
 */
#include "tb_channel_int.h"

const char *tb_channel_strerror(int status)
{
    switch (status) {
    case TB_CHAN_OK: return "success";
    case TB_CHAN_EINVAL: return "invalid parameter";
    case TB_CHAN_ENOMEM: return "out of memory or link buffers";
    case TB_CHAN_EMSGSIZE: return "message too large";
    case TB_CHAN_EPROTO: return "incompatible or corrupt peer address";
    case TB_CHAN_ESTATE: return "operation not valid in the channel's state";
    case TB_CHAN_EPEERDEAD: return "peer stopped answering";
    case TB_CHAN_ERESTARTED: return "peer restarted";
    case TB_CHAN_ECLOSED: return "peer closed the channel";
    case TB_CHAN_ECANCELED: return "canceled by local close";
    case TB_CHAN_ELINK: return "link error";
    case TB_CHAN_EAGAIN: return "send queue full, try again later";
    default: return "unknown error";
    }
}

void tb_channel_params_default(tb_channel_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->nlanes = 2;
    p->frame_size[0] = TB_WIRE_HW_FRAME;
    p->frame_size[1] = 16 * TB_WIRE_HW_FRAME;
    p->recv_depth_max = 32;
    for (unsigned l = 0; l < TB_WIRE_MAX_LANES; l++) {
        p->recv_depth[l] = 32;
        p->send_window[l] = 32;
    }
    p->payload_crc = 1;
    p->max_msg_size = 64u << 20;
    p->ack_delay_ns = 500000;
    p->rto_min_ns = 2000000;
    p->rto_initial_ns = 10000000;
    p->rto_max_ns = 128000000;
    p->keepalive_ns = 100000000;
    p->peer_timeout_ns = 5000000000ull;
    p->max_frames_per_progress = 64;
    p->max_queued_bytes = 256ull << 20;
    p->max_queued_msgs = 4096;
}

#define CHECK(cond, ...)                          \
    do {                                          \
        if (!(cond)) {                            \
            if (why) {                            \
                snprintf(why, why_len, __VA_ARGS__); \
            }                                     \
            return TB_CHAN_EINVAL;                \
        }                                         \
    } while (0)

int tb_channel_params_check(const tb_channel_params_t *p, char *why, size_t why_len)
{
    CHECK(p->nlanes >= 1 && p->nlanes <= TB_WIRE_MAX_LANES, "nlanes is %u; it must be 1 or 2",
          p->nlanes);
    CHECK(p->recv_depth_max >= 1 && p->recv_depth_max <= 4095,
          "recv_depth_max is %u; the hardware queue holds at most 4095 frames",
          p->recv_depth_max);
    for (unsigned l = 0; l < p->nlanes; l++) {
        uint32_t fs = p->frame_size[l];
        unsigned min_depth = l == 0 ? CTRL_RESERVE + 2 : 2;
        CHECK(fs >= TB_WIRE_HW_FRAME && fs % TB_WIRE_HW_FRAME == 0 && fs <= TB_WIRE_HW_MAX_MSG,
              "frame_size[%u] is %u; it must be a multiple of 4096 between 4096 and 16773120", l,
              fs);
        CHECK(p->recv_depth[l] >= min_depth && p->recv_depth[l] <= p->recv_depth_max,
              "recv_depth[%u] is %u; it must be between %u and recv_depth_max (%u)", l,
              p->recv_depth[l], min_depth, p->recv_depth_max);
        CHECK((uint64_t) p->recv_depth[l] * (fs / TB_WIRE_HW_FRAME) <= 4095,
              "recv_depth[%u] x frame_size[%u] is %llu frames; a queue holds at most 4095", l,
              l, (unsigned long long) p->recv_depth[l] * (fs / TB_WIRE_HW_FRAME));
        CHECK(p->send_window[l] >= 1 && p->send_window[l] <= 4096,
              "send_window[%u] is %u; it must be between 1 and 4096", l, p->send_window[l]);
    }
    CHECK(p->epoch != 0, "epoch is 0; it must be a random non-zero value per incarnation");
    CHECK(p->rto_min_ns > 0 && p->rto_max_ns >= p->rto_min_ns,
          "rto_min_ns (%llu) must be non-zero and at most rto_max_ns (%llu)",
          (unsigned long long) p->rto_min_ns, (unsigned long long) p->rto_max_ns);
    CHECK(p->keepalive_ns > 0 && p->peer_timeout_ns > p->keepalive_ns
              && p->peer_timeout_ns > p->rto_min_ns,
          "peer_timeout_ns (%llu) must exceed keepalive_ns (%llu) and rto_min_ns",
          (unsigned long long) p->peer_timeout_ns, (unsigned long long) p->keepalive_ns);
    CHECK(p->max_frames_per_progress >= 1, "max_frames_per_progress must be at least 1");
    CHECK(p->max_queued_msgs >= 1, "max_queued_msgs must be at least 1");
    CHECK(p->max_queued_bytes >= 1, "max_queued_bytes must be at least 1");
    return TB_CHAN_OK;
}

#undef CHECK

/* ------------------------------------------------------------------ */
/* Failure and cancellation                                            */

/* Give the frame's slot back.  A no-op for a frame without one: a failure
 * releases every frame not posted, including the one whose completion
 * reported it. */
void tb_ch_release_tx_frame(tb_channel_t *ch, tb_tx_frame_t *f)
{
    if (!f->buf) {
        return;
    }
    ch->link->ops->send_buf_put(ch->link, f->lane, f->buf);
    f->buf = NULL;
    if (f->is_ctrl) {
        f->next_free = ch->ctrl_free;
        ch->ctrl_free = f;
    }
}

static void tb_ch_rx_msg_free(tb_channel_t *ch, tb_rx_msg_t *m)
{
    if (m->placed) {
        /* The caller's destination: nothing of ours. */
    } else if (m->caller_buf) {
        ch->cb.recv_buf_drop(ch->cb.ctx, m->data);
    } else if (!m->slot) {
        free(m->data);
    }
    free(m);
}

/* Drop all queued work; pending sends complete with status. */
static void tb_ch_cancel_all(tb_channel_t *ch, int status)
{
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        tb_tx_lane_t *t = &ch->tx[l];
        tb_rx_lane_t *r = &ch->rx[l];

        for (unsigned i = 0; i < t->window; i++) {
            tb_tx_frame_t *f = &t->ring[i];
            if (f->buf && !f->posted) {
                tb_ch_release_tx_frame(ch, f);
            }
        }
        if (r->assembling) {
            tb_ch_rx_msg_free(ch, r->assembling);
            r->assembling = NULL;
        }
        while (r->wait_head) {
            tb_rx_msg_t *m = r->wait_head;
            r->wait_head = m->next;
            tb_ch_rx_msg_free(ch, m);
        }
        r->wait_tail = NULL;
    }
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        tb_tx_lane_t *t = &ch->tx[l];
        while (t->q_head) {
            tb_send_req_t *req = t->q_head;
            t->q_head = req->next;
            ch->pending--;
            ch->pending_bytes -= req->len;
            if (ch->cb.send_done) {
                ch->cb.send_done(ch->cb.ctx, req->cookie, status);
            }
            tb_ch_req_free(ch, req);
        }
        t->q_tail = t->q_cur = NULL;
    }
}

/* Enter FAILED (once), telling the error callback if notify. */
static void tb_ch_fail_why(tb_channel_t *ch, int status, int notify, const char *why)
{
    if (ch->state == CH_FAILED || ch->state == CH_CLOSED) {
        return;
    }
    ch->state = CH_FAILED;
    ch->status = status;
    TB_WARN("channel to peer epoch %016llx failed: %s", (unsigned long long) ch->peer_epoch, why);
    if (notify && ch->cb.unsent) {
        tb_ch_tx_hand_back(ch);
    }
    if (notify && ch->cb.error) {
        ch->cb.error(ch->cb.ctx, status, why);
    }
    tb_ch_cancel_all(ch, status);
}

__attribute__((format(printf, 3, 0))) static void tb_ch_failv(tb_channel_t *ch, int status,
                                                              const char *fmt, va_list ap)
{
    char why[256];

    vsnprintf(why, sizeof(why), fmt, ap);
    tb_ch_fail_why(ch, status, 1, why);
}

__attribute__((format(printf, 3, 4))) void tb_ch_fail(tb_channel_t *ch, int status,
                                                      const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    tb_ch_failv(ch, status, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ */
/* Round-trip estimate                                                 */

static uint64_t tb_ch_rto_clamp(const tb_channel_t *ch, uint64_t rto)
{
    if (rto < ch->p.rto_min_ns) {
        return ch->p.rto_min_ns;
    }
    return rto > ch->p.rto_max_ns ? ch->p.rto_max_ns : rto;
}

static void tb_ch_rto_set(tb_channel_t *ch, unsigned lane, uint64_t rto)
{
    ch->tx[lane].rto = rto;
    ch->cnt.rto_ns[lane] = rto;
}

/* RFC 6298 section 2 with alpha 1/8, beta 1/4, K 4.  A sample also ends any
 * backoff: it proves the timeout it was measured under was long enough. */
void tb_ch_rtt_sample(tb_channel_t *ch, unsigned lane, uint64_t r)
{
    tb_tx_lane_t *t = &ch->tx[lane];

    if (r == 0) {
        r = 1; /* srtt 0 means "no sample yet" */
    }
    if (t->srtt == 0) {
        t->srtt = r;
        t->rttvar = r / 2;
    } else {
        uint64_t err = r > t->srtt ? r - t->srtt : t->srtt - r;
        t->rttvar = (3 * t->rttvar + err) / 4;
        t->srtt = (7 * t->srtt + r) / 8;
        if (t->srtt == 0) {
            t->srtt = 1;
        }
    }
    ch->cnt.rtt_samples++;
    ch->cnt.srtt_ns[lane] = t->srtt;
    tb_ch_rto_set(ch, lane, tb_ch_rto_clamp(ch, t->srtt + 4 * t->rttvar));
}

/* The HELLO exchange is over at ch->now, `waited` after our first HELLO.  If
 * exactly one HELLO went out and this frame answers it (a HELLO would be the
 * peer's own, sent without having seen ours), the wait was one round trip:
 * it seeds lane 0.  Otherwise the wait says little (Karn: an answer to which
 * HELLO?  And a peer HELLO that crossed ours took only one way), so, like TCP
 * after SYN retries (RFC 6298, 5.7), data starts with a conservative timeout:
 * four times the wait, at least the initial one.  The bulk lane's frames
 * take longer than a header-only frame, so it keeps that until its own first
 * sample. */
void tb_ch_hello_done(tb_channel_t *ch, uint8_t type)
{
    uint64_t waited = ch->now - ch->connect_ns;
    uint64_t rto = tb_ch_rto_clamp(ch, 4 * waited);

    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        if (rto > ch->tx[l].rto) {
            tb_ch_rto_set(ch, l, rto);
        }
    }
    if (ch->hellos_sent == 1 && type != TB_FRAME_HELLO) {
        tb_ch_rtt_sample(ch, 0, ch->now - ch->last_hello_ns);
    }
}

/* ------------------------------------------------------------------ */
/* Timers                                                              */

static int credit_update_due(tb_channel_t *ch)
{
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        tb_rx_lane_t *r = &ch->rx[l];
        uint32_t lim = r->h_tsn + r->posted;
        int32_t gain = tb_seq_diff(lim, r->adv_limit);
        int32_t left = tb_seq_diff(r->adv_limit, r->h_tsn);
        if (gain > 0
            && (gain >= (int32_t) ch->p.recv_depth[l] / 2
                || left <= (int32_t) ch->p.recv_depth[l] / 4)) {
            return 1;
        }
    }
    return 0;
}

/* A lane without any credit waits for the peer's limit to move, and the
 * limit moves only when the peer sees a higher tsn or reposts a receive.  If
 * the last frames sent up to the limit were all lost, it sees none, and if
 * everything it could repost waits for a resend (held frames, messages
 * waiting for the other lane), neither happens: both sides would wait until
 * the peer timeout.  So a lane dry for a retransmit timeout sends one frame
 * beyond the limit (the oldest unacked frame, else an ACK asking for an
 * answer): a receive freed by the lost frames takes it and the peer's next
 * limit counts it; with no receive posted it is lost like any frame. */
static void tx_credit_probe(tb_channel_t *ch, unsigned l)
{
    tb_tx_lane_t *t = &ch->tx[l];
    tb_tx_frame_t *f = &t->ring[t->una % t->window];

    if (tb_seq_diff(t->peer_limit, t->next_tsn) >= 0) {
        t->dry_since = 0;
        return;
    }
    if (t->dry_since == 0) {
        t->dry_since = ch->now ? ch->now : 1;
        return;
    }
    if (ch->now - t->dry_since < t->rto) {
        return;
    }
    t->dry_since = ch->now;
    if (t->una != t->next_seq) {
        if (f->posted || f->sacked) {
            return;
        }
        f->retx = 1;
        f->sent_ns = ch->now;
        ch->cnt.retransmits++;
        ch->cnt.credit_probes++;
        tb_ch_tx_post(ch, f, (((tb_wire_frame_hdr_t *) f->buf)->flags & TB_FRAME_F_PAYLOAD_CRC)
                      | TB_FRAME_F_RETX | TB_FRAME_F_ACK_REQ);
    } else if (l == 0 && tb_ch_tx_ctrl(ch, TB_FRAME_ACK, TB_FRAME_F_ACK_REQ, 1) == 0) {
        ch->cnt.credit_probes++;
    }
}

/* A lane's retransmit timer expired.  On a UC queue pair frames do not
 * overtake each other, so a resend of a frame that is merely late can never
 * arrive first: it is pure waste (and a 64 KiB one on the bulk lane).  So
 * first ask: a header-only ACK_REQ on lane 0, whose answer echoes its tsn and
 * says what arrived (tb_ch_rx_frame then resends what did not).  One probe serves
 * every lane whose timer expires in the same call.  1 if a probe is out. */
static int tx_probe(tb_channel_t *ch, tb_tx_lane_t *t)
{
    if (ch->cnt.probes == 0 || ch->last_probe_at != ch->now) {
        if (tb_ch_tx_ctrl(ch, TB_FRAME_ACK, TB_FRAME_F_ACK_REQ | TB_FRAME_F_PROBE, 0) != 0) {
            return 0;
        }
        ch->cnt.probes++;
        ch->last_probe_at = ch->now;
        ch->probe_tsn = ch->tx[0].next_tsn - 1;
    }
    t->probing = 1;
    t->probe_tsn = ch->probe_tsn;
    t->probe_end = t->next_seq;
    t->timer_start = ch->now;
    return 1;
}

static uint64_t tb_ch_stall_timeout(const tb_channel_params_t *p)
{
    return p->stall_timeout_ns > p->peer_timeout_ns ? p->stall_timeout_ns : p->peer_timeout_ns;
}

/* Logged when the peer goes silent: whether its frames came and were
 * refused, or none came, and whether this side still had receives posted
 * for them (a silent peer and a deaf channel look alike otherwise). */
static void report_silence(const tb_channel_t *ch)
{
    char state[700];

    tb_channel_describe(ch, state, sizeof(state));
    TB_WARN("the peer went silent: %llu frames received in all, of which %llu of another "
            "incarnation, %llu malformed, %llu with a bad checksum; %llu keepalives sent; %s",
            (unsigned long long) ch->cnt.frames_received, (unsigned long long) ch->cnt.stale,
            (unsigned long long) ch->cnt.malformed, (unsigned long long) ch->cnt.bad_checksum,
            (unsigned long long) ch->cnt.keepalives_sent, state);
}

static void progress_timers(tb_channel_t *ch)
{
    uint64_t now = ch->now;
    const tb_channel_params_t *p = &ch->p;

    if (ch->state == CH_CONNECTING) {
        if (now - ch->connect_ns >= p->peer_timeout_ns) {
            tb_ch_fail(ch, TB_CHAN_EPEERDEAD, "peer did not answer within %llu ms of connecting",
                       (unsigned long long) (p->peer_timeout_ns / 1000000));
            return;
        }
        if (now - ch->last_hello_ns >= ch->hello_ivl && tb_ch_tx_ctrl(ch, TB_FRAME_HELLO,
                                                                      TB_FRAME_F_ACK_REQ, 1) == 0) {
            ch->last_hello_ns = now;
            ch->hellos_sent++;
            ch->hello_ivl = tb_ch_rto_clamp(ch, ch->hello_ivl * 2);
        }
        return;
    }
    if (now - ch->last_rx_ns >= p->peer_timeout_ns) {
        report_silence(ch);
        tb_ch_fail(ch, TB_CHAN_EPEERDEAD, "no frame from the peer for %llu ms",
                   (unsigned long long) ((now - ch->last_rx_ns) / 1000000));
        return;
    }
    for (unsigned l = 0; l < p->nlanes && tb_ch_usable(ch); l++) {
        tb_tx_lane_t *t = &ch->tx[l];
        tx_credit_probe(ch, l);
        if (t->una == t->next_seq || !tb_ch_usable(ch)) {
            continue;
        }
        if (now - t->ack_progress_ns >= tb_ch_stall_timeout(p)) {
            tb_ch_fail(ch, TB_CHAN_EPEERDEAD,
                       "the peer acknowledged nothing on lane %u for %llu ms", l,
                       (unsigned long long) ((now - t->ack_progress_ns) / 1000000));
            return;
        }
        if (now - t->timer_start >= t->rto) {
            ch->cnt.timeouts++;
            if (!t->probing && tx_probe(ch, t)) {
                continue;
            }
            /* The probe went unanswered too: resend, and back off. */
            t->probing = 0;
            tb_ch_tx_goback(ch, t, t->next_seq);
            tb_ch_rto_set(ch, l, tb_ch_rto_clamp(ch, t->rto * 2));
        }
    }
}

/* Every frame takes one of the peer's receives until it polls again, so a
 * peer that is busy computing, not polling, gets one keepalive, not one per
 * interval: the next waits until something arrives from it.  But the
 * keepalives of both sides can be lost at once, and then each side would wait
 * for the other until the peer timeout: so an unanswered keepalive is
 * repeated after KA_RETRY_DIV-th of the peer timeout (a silent peer then costs
 * at most KA_RETRY_DIV receives before it is declared dead). */
static int keepalive_due(const tb_channel_t *ch)
{
    return !ch->ka_unanswered || ch->now - ch->last_ka_ns >= ch->p.peer_timeout_ns / KA_RETRY_DIV;
}

static void progress_ctrl(tb_channel_t *ch)
{
    uint64_t now = ch->now;
    int need = ch->ack_now || credit_update_due(ch);
    uint8_t flags = 0;

    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        tb_tx_lane_t *t = &ch->tx[l];
        tb_rx_lane_t *r = &ch->rx[l];
        if (r->nak_pending || (r->unacked > 0 && now - r->ack_since >= ch->p.ack_delay_ns)) {
            need = 1;
        }
        /* Data is waiting for credit: ask the peer to restate its limit, in
         * case the update that would have freed us was lost. */
        if (t->stalled && now - t->stall_since >= ch->p.rto_min_ns
            && now - t->last_probe_ns >= t->rto) {
            t->last_probe_ns = now;
            flags |= TB_FRAME_F_ACK_REQ;
            need = 1;
        }
    }
    if (!need && now - ch->last_tx_ns >= ch->p.keepalive_ns && keepalive_due(ch)) {
        flags |= TB_FRAME_F_KEEPALIVE;
        need = 1;
    }
    if (need) {
        tb_ch_tx_ctrl(ch, TB_FRAME_ACK, flags, 0);
    }
}

/* Callers read their clock at different moments (a connect made inside a
 * connection manager's callback can be stamped later than the progress call
 * around it), so the channel's clock never goes backwards: every stored time
 * stays at or before ch->now and no elapsed time can wrap around. */
static void clock_advance(tb_channel_t *ch, uint64_t now)
{
    if (now > ch->now) {
        ch->now = now;
    }
}

void tb_channel_clock(tb_channel_t *ch, uint64_t now)
{
    clock_advance(ch, now);
}

/* Work for the next progress call beyond its timers: sends queued or to
 * resend, sends to complete, an ack owed now. */
static int work_pending(const tb_channel_t *ch)
{
    if (ch->ack_now) {
        return 1;
    }
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        const tb_tx_lane_t *t = &ch->tx[l];
        if (t->q_head || t->retx_next != t->retx_end) {
            return 1;
        }
    }
    return 0;
}

void tb_channel_progress(tb_channel_t *ch, uint64_t now)
{
    clock_advance(ch, now);
    if (!tb_ch_usable(ch)) {
        return;
    }
    /* The data path calls this between every two messages.  With nothing to
     * do and nothing new since the last full pass, the timers alone are due
     * at most every tick (a quarter of the shortest of the ack delay and the
     * retransmit floor): they fire at most that late. */
    if (!ch->dirty && now - ch->last_full_ns < ch->tick_ns) {
        return;
    }
    ch->dirty = 0;
    ch->last_full_ns = ch->now;
    progress_timers(ch);
    if (ch->state != CH_ESTABLISHED) {
        return;
    }
    tb_ch_tx_push(ch);
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        tb_ch_tx_complete_reqs(ch, &ch->tx[l]);
    }
    if (ch->state == CH_ESTABLISHED) {
        progress_ctrl(ch);
    }
    ch->dirty |= work_pending(ch);
}

/* ------------------------------------------------------------------ */
/* Public calls                                                        */

int tb_channel_create(const tb_channel_params_t *params, tb_link_t *link,
                      const tb_channel_callbacks_t *cb, tb_channel_t **out)
{
    char why[200];
    tb_channel_t *ch;

    if (tb_channel_params_check(params, why, sizeof(why)) != 0) {
        TB_ERROR("reliable channel: %s", why);
        return TB_CHAN_EINVAL;
    }
    if (!link || !cb || !cb->recv || (cb->recv_buf && !cb->recv_buf_drop)
        || (cb->recv_place && !cb->recv_placed)) {
        TB_ERROR("reliable channel: a link and the recv callback are required (and "
                 "recv_buf_drop with recv_buf)");
        return TB_CHAN_EINVAL;
    }
    ch = calloc(1, sizeof(*ch));
    if (!ch) {
        return TB_CHAN_ENOMEM;
    }
    ch->p = *params;
    ch->link = link;
    ch->cb = *cb;
    ch->state = CH_IDLE;
    ch->dirty = 1;
    ch->tick_ns = ch->p.ack_delay_ns < ch->p.rto_min_ns ? ch->p.ack_delay_ns : ch->p.rto_min_ns;
    ch->tick_ns /= 4;
    if (ch->tick_ns == 0) {
        ch->tick_ns = 1;
    }
    ch->next_msg_id = ch->p.initial_seq[0];
    ch->release_msg = ch->next_msg_id;
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        tb_tx_lane_t *t = &ch->tx[l];
        tb_rx_lane_t *r = &ch->rx[l];
        uint32_t frames = ch->p.frame_size[l] / TB_WIRE_HW_FRAME;

        t->window = ch->p.send_window[l];
        t->ring = calloc(t->window, sizeof(*t->ring));
        r->bufs = calloc(ch->p.recv_depth[l], sizeof(*r->bufs));
        r->held = calloc(ch->p.recv_depth[l], sizeof(*r->held));
        if (!t->ring || !r->bufs || !r->held) {
            goto fail;
        }
        for (unsigned i = 0; i < t->window; i++) {
            t->ring[i].lane = (uint8_t) l;
        }
        t->frag_cap = ch->p.frame_size[l] - TB_WIRE_HDR_SIZE;
        t->post_min = (frames - 1) * TB_WIRE_HW_FRAME + 1;
        t->una = t->next_seq = t->retx_next = t->retx_end = ch->p.initial_seq[l];
        t->keep = t->una;
        t->next_tsn = ch->p.initial_seq[l];
        t->peer_limit = ch->p.initial_seq[l] - 1;
        /* Coalesce acks over half the receives; the sender asks for one
         * itself when half its window is out. */
        r->ack_every = ch->p.recv_depth[l] / 2 ? ch->p.recv_depth[l] / 2 : 1;
    }
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        tb_ch_rto_set(ch, l, tb_ch_rto_clamp(ch, ch->p.rto_initial_ns));
    }
    for (unsigned i = 0; i < CTRL_FRAMES; i++) {
        ch->ctrl[i].is_ctrl = 1;
        ch->ctrl[i].next_free = ch->ctrl_free;
        ch->ctrl_free = &ch->ctrl[i];
    }
    *out = ch;
    return TB_CHAN_OK;

fail:
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        free(ch->tx[l].ring);
        free(ch->rx[l].bufs);
        free(ch->rx[l].held);
    }
    free(ch);
    return TB_CHAN_ENOMEM;
}

void tb_channel_destroy(tb_channel_t *ch)
{
    if (!ch) {
        return;
    }
    if (tb_ch_usable(ch) || ch->state == CH_IDLE) {
        ch->state = CH_CLOSED;
        ch->status = TB_CHAN_ECANCELED;
        tb_ch_cancel_all(ch, TB_CHAN_ECANCELED);
    }
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        tb_tx_lane_t *t = &ch->tx[l];
        tb_rx_lane_t *r = &ch->rx[l];
        for (unsigned i = 0; i < t->window; i++) {
            if (t->ring[i].buf) {
                ch->link->ops->send_buf_put(ch->link, l, t->ring[i].buf);
            }
        }
        for (unsigned i = 0; i < r->nbufs; i++) {
            ch->link->ops->recv_buf_put(ch->link, l, r->bufs[i]);
        }
        free(t->ring);
        free(r->bufs);
        free(r->held);
    }
    for (unsigned i = 0; i < CTRL_FRAMES; i++) {
        if (ch->ctrl[i].buf) {
            ch->link->ops->send_buf_put(ch->link, 0, ch->ctrl[i].buf);
        }
    }
    while (ch->req_cache) {
        tb_send_req_t *req = ch->req_cache;
        ch->req_cache = req->next;
        free(req);
    }
    free(ch);
}

void tb_channel_local_addr(tb_channel_t *ch, tb_wire_addr_t *addr)
{
    memset(addr, 0, sizeof(*addr));
    addr->magic = tb_wire_le32(TB_WIRE_ADDR_MAGIC);
    addr->version = TB_WIRE_VERSION;
    addr->nlanes = (uint8_t) ch->p.nlanes;
    addr->epoch = tb_wire_le64(ch->p.epoch);
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        addr->psn[l] = tb_wire_le32(ch->p.initial_seq[l]);
        addr->frame_size[l] = tb_wire_le32(ch->p.frame_size[l]);
        addr->recv_depth[l] = tb_wire_le16((uint16_t) ch->p.recv_depth[l]);
    }
    ch->link->ops->local_addr(ch->link, addr);
    addr->crc = tb_wire_le32(tb_crc32c(0, addr, TB_WIRE_ADDR_SIZE - 4));
}

int tb_channel_connect(tb_channel_t *ch, const tb_wire_addr_t *peer, uint64_t now)
{
    int rc;

    if (ch->state != CH_IDLE) {
        return TB_CHAN_ESTATE;
    }
    if (tb_wire_le32(peer->magic) != TB_WIRE_ADDR_MAGIC || peer->version != TB_WIRE_VERSION
        || tb_crc32c(0, peer, TB_WIRE_ADDR_SIZE - 4) != tb_wire_le32(peer->crc)) {
        TB_ERROR("reliable channel: the peer's address is corrupt or of another version "
                 "(version %u, this is %u)", peer->version, TB_WIRE_VERSION);
        return TB_CHAN_EPROTO;
    }
    if (peer->nlanes != ch->p.nlanes || peer->epoch == 0) {
        TB_ERROR("reliable channel: the peer uses %u lanes, this side %u; set the same lane "
                 "count on every node", peer->nlanes, ch->p.nlanes);
        return TB_CHAN_EPROTO;
    }
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        uint16_t depth = tb_wire_le16(peer->recv_depth[l]);
        if (depth < 1 || depth > 4095) {
            TB_ERROR("reliable channel: the peer's lane %u receive depth is %u; it must be "
                     "between 1 and 4095", l, (unsigned) depth);
            return TB_CHAN_EPROTO;
        }
        ch->tx[l].peer_depth = depth;
        if (tb_wire_le32(peer->frame_size[l]) != ch->p.frame_size[l]) {
            TB_ERROR("reliable channel: the peer's lane %u frame size is %u, this side's %u; "
                     "set the same frame sizes on every node", l,
                     tb_wire_le32(peer->frame_size[l]), ch->p.frame_size[l]);
            return TB_CHAN_EPROTO;
        }
    }
    rc = ch->link->ops->connect(ch->link, peer);
    if (rc != 0) {
        TB_ERROR("reliable channel: connecting the link failed (%d)", rc);
        return TB_CHAN_ELINK;
    }
    ch->peer_epoch = tb_wire_le64(peer->epoch);
    ch->next_deliver = tb_wire_le32(peer->psn[0]);
    clock_advance(ch, now);
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        tb_rx_lane_t *r = &ch->rx[l];
        uint32_t psn = tb_wire_le32(peer->psn[l]);
        r->expected = psn;
        r->h_tsn = psn - 1;
        r->adv_limit = psn - 1;
    }
    ch->state = CH_CONNECTING;
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        tb_rx_lane_t *r = &ch->rx[l];
        while (r->nbufs < ch->p.recv_depth[l]) {
            void *buf = ch->link->ops->recv_buf_get(ch->link, l);
            if (!buf) {
                tb_ch_fail(ch, TB_CHAN_ENOMEM, "the link has fewer than %u receive buffers on "
                           "lane %u", ch->p.recv_depth[l], l);
                return TB_CHAN_ENOMEM;
            }
            r->bufs[r->nbufs++] = buf;
            if (tb_ch_rx_repost(ch, l, buf) != 0) {
                return TB_CHAN_ELINK;
            }
        }
    }
    ch->connect_ns = ch->now;
    ch->last_rx_ns = ch->now;
    ch->progress_ns = ch->now;
    ch->last_hello_ns = ch->now;
    ch->hello_ivl = tb_ch_rto_clamp(ch, ch->p.rto_initial_ns);
    if (tb_ch_tx_ctrl(ch, TB_FRAME_HELLO, TB_FRAME_F_ACK_REQ, 1) == 0) {
        ch->hellos_sent = 1;
    } else if (!tb_ch_usable(ch)) {
        return ch->status;
    }
    return TB_CHAN_OK;
}

void tb_channel_abort(tb_channel_t *ch, int status, const char *why)
{
    tb_ch_fail_why(ch, status < 0 ? status : TB_CHAN_ECANCELED, 0,
                   why ? why : "aborted by the caller");
}

void tb_channel_close(tb_channel_t *ch)
{
    if (!tb_ch_usable(ch)) {
        return;
    }
    if (ch->state == CH_ESTABLISHED) {
        tb_ch_tx_ctrl(ch, TB_FRAME_CLOSE, 0, 0);
    }
    if (tb_ch_usable(ch)) {
        ch->state = CH_CLOSED;
        ch->status = TB_CHAN_ECANCELED;
        tb_ch_cancel_all(ch, TB_CHAN_ECANCELED);
    }
}

void tb_channel_describe(const tb_channel_t *ch, char *buf, size_t len)
{
    size_t n = 0;

    n += (size_t) snprintf(buf, len, "state %d, msg ids next %u deliver %u", (int) ch->state,
                           ch->next_msg_id, ch->next_deliver);
    for (unsigned l = 0; l < ch->p.nlanes && n < len; l++) {
        const tb_tx_lane_t *t = &ch->tx[l];
        const tb_rx_lane_t *r = &ch->rx[l];
        n += (size_t) snprintf(buf + n, len - n,
                               "; lane %u tx: una %u next %u tsn %u limit %u stalled %d dry %d "
                               "order %d probing %d queued %d rto %llu us; rx: expected %u "
                               "h_tsn %u posted %u/%u adv %u held %u waiting %u assembling %d",
                               l, t->una, t->next_seq, t->next_tsn, t->peer_limit, t->stalled,
                               t->dry_since != 0, t->order_stalled, t->probing, NULL != t->q_cur,
                               (unsigned long long) (t->rto / 1000), r->expected, r->h_tsn,
                               r->posted, ch->p.recv_depth[l], r->adv_limit, r->nheld,
                               r->nwaiting, NULL != r->assembling);
    }
}

int tb_channel_is_connected(const tb_channel_t *ch)
{
    return ch->state == CH_ESTABLISHED;
}

int tb_channel_status(const tb_channel_t *ch)
{
    return ch->status;
}

size_t tb_channel_pending_sends(const tb_channel_t *ch)
{
    return ch->pending;
}

size_t tb_channel_unacked(const tb_channel_t *ch)
{
    size_t n = ch->pending;

    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        n += ch->tx[l].next_seq - ch->tx[l].una;
    }
    return n;
}

const tb_channel_counters_t *tb_channel_counters(const tb_channel_t *ch)
{
    return &ch->cnt;
}

uint64_t tb_channel_progress_ns(const tb_channel_t *ch)
{
    return ch->progress_ns;
}
