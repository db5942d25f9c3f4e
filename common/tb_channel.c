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
#include "tb_channel.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tb_crc32c.h"
#include "tb_log.h"

#define CTRL_RESERVE 2   /* lane-0 credits only control frames may use */
#define CTRL_FRAMES 8    /* control frames in flight at once */
/* Receives a lane never spends on frames held after a gap: the resend that
 * fills the gap needs one, and lane-0 data needs more than CTRL_RESERVE. */
#define HOLD_SPARE (CTRL_RESERVE + 2)
#define WARN_INTERVAL_NS 1000000000ull
#define REQ_CACHE 64
#define KA_RETRY_DIV 4   /* an unanswered keepalive is repeated after peer timeout / 4 */

typedef enum {
    CH_IDLE,       /* created, not connected */
    CH_CONNECTING, /* HELLO sent, nothing heard yet */
    CH_ESTABLISHED,
    CH_FAILED,
    CH_CLOSED,
} ch_state_t;

typedef struct tb_send_req {
    struct tb_send_req *next;
    void *cookie;
    uint32_t msg_id;
    uint32_t len;
    uint32_t sent; /* bytes already fragmented */
    uint32_t frags_total;
    uint32_t frags_sent;
    uint32_t frag_size; /* payload per frame: the message split evenly */
    uint8_t tag;
    int iovcnt;
    int iov_idx;
    size_t iov_off;
    struct iovec *iov;
    struct iovec iov_one;
    unsigned char *own; /* the unsent bytes, copied by tb_channel_send_detach */
} tb_send_req_t;

/* One posted or postable frame.  Data frames live in their lane's ring at
 * index seq % window and keep their slot until acked and locally complete:
 * a retransmission resends the same slot, so the caller's memory is read
 * only once (and a send completes once its last fragment is in a slot). */
typedef struct tb_tx_frame {
    void *buf;
    struct tb_tx_frame *next_free;
    uint32_t len;
    uint32_t msg_id;
    uint32_t tsn;     /* of the latest transmission */
    uint64_t first_ns; /* first transmission */
    uint8_t lane;
    uint8_t posted;
    uint8_t acked;
    uint8_t is_ctrl;
    uint8_t retx;     /* retransmitted: its ack gives no round-trip sample */
    uint8_t sacked;   /* the peer holds it: never resend */
    uint64_t sent_ns; /* latest transmission */
} tb_tx_frame_t;

typedef struct tb_tx_lane {
    tb_tx_frame_t *ring;
    unsigned window;
    uint32_t frag_cap;  /* payload bytes per frame */
    uint32_t post_min;  /* shortest post with the lane's frame count */
    uint32_t una;       /* oldest unacked seq */
    uint32_t next_seq;  /* seq of the next new frame */
    uint32_t retx_next; /* retransmit seqs [retx_next, retx_end): */
    uint32_t retx_end;  /* equal when nothing is to be resent */
    uint32_t next_tsn;
    uint32_t peer_limit; /* may transmit tsn <= peer_limit */
    uint32_t peer_depth; /* receives the peer posts on the lane (its blob) */
    uint64_t srtt;       /* smoothed round trip; 0 before the first sample */
    uint64_t rttvar;
    uint64_t rto;        /* current timeout, backoff included */
    uint64_t timer_start;
    uint64_t ack_progress_ns;
    uint64_t last_goback_ns;
    uint32_t last_goback_una;
    uint32_t repair_end; /* gaps below it were resent since the last go-back */
    int stalled;
    uint64_t stall_since;
    uint64_t dry_since;  /* when the lane ran out of credit; 0 while it has some */
    uint64_t last_probe_ns;
    int order_stalled;   /* q_cur waits for the other lane (see tx_order_ok) */
    /* The retransmit timer expired and a probe asked the peer what arrived
     * (see progress_timers): probe_tsn is the probe's lane-0 tsn, probe_end
     * the lane's next seq when it went out. */
    int probing;
    uint32_t probe_tsn;
    uint32_t probe_end;
    tb_send_req_t *q_head; /* requests in send order, oldest not yet complete first */
    tb_send_req_t *q_tail;
    tb_send_req_t *q_cur;  /* first request with unsent fragments */
} tb_tx_lane_t;

typedef struct tb_rx_msg {
    struct tb_rx_msg *next;
    void *slot; /* held receive slot (single-frame message) */
    unsigned char *data;
    uint32_t msg_id;
    uint32_t len;
    uint32_t got;
    uint8_t tag;
    uint8_t lane;
    uint8_t caller_buf;
    uint8_t placed; /* data is the caller's destination for bytes skip.. (recv_place) */
    uint8_t skip;
    unsigned char head[TB_CHAN_PLACE_HEAD]; /* a placed message's first skip bytes */
} tb_rx_msg_t;

typedef struct tb_rx_lane {
    void **bufs; /* every receive slot the channel holds */
    unsigned nbufs;
    unsigned posted;
    unsigned ack_every;
    uint32_t expected; /* next seq accepted */
    uint32_t h_tsn;    /* highest tsn seen */
    uint32_t adv_limit;
    uint32_t last_msg_id;
    int have_msg;
    int nak_pending;
    unsigned ooo_since_nak; /* frames after the current gap since its last NAK */
    void **held;            /* frames after a gap, at seq % recv_depth */
    unsigned nheld;
    unsigned nwaiting;      /* slots of whole messages waiting for their turn */
    unsigned unacked;
    uint64_t ack_since;
    tb_rx_msg_t *assembling;
    tb_rx_msg_t *wait_head; /* complete, waiting for an earlier msg_id */
    tb_rx_msg_t *wait_tail;
} tb_rx_lane_t;

struct tb_channel {
    tb_channel_params_t p;
    tb_link_t *link;
    tb_channel_callbacks_t cb;
    ch_state_t state;
    int status;
    uint64_t now;
    uint64_t connect_ns;
    uint64_t last_rx_ns;
    uint64_t last_tx_ns;
    uint64_t last_hello_ns;
    uint64_t last_ka_ns;  /* the latest keepalive */
    uint64_t last_probe_at; /* when the latest timer probe went out (tx_probe) */
    uint32_t probe_tsn;
    int ka_unanswered;    /* nothing received from the peer since it */
    uint64_t hello_ivl;
    unsigned hellos_sent;
    uint64_t peer_epoch;
    uint32_t next_msg_id;
    uint32_t next_deliver;
    int ack_now;
    int in_callback;
    size_t pending;
    uint64_t pending_bytes;
    uint64_t last_warn_ns;
    uint64_t warn_suppressed;
    tb_tx_lane_t tx[TB_WIRE_MAX_LANES];
    tb_rx_lane_t rx[TB_WIRE_MAX_LANES];
    tb_tx_frame_t ctrl[CTRL_FRAMES];
    tb_tx_frame_t *ctrl_free;
    tb_send_req_t *req_cache;
    unsigned nreq_cache;
    tb_tx_frame_t *begun; /* tb_channel_send_begin's frame, until commit or cancel */
    int dirty;            /* something happened: the next progress does a full pass */
    uint64_t last_full_ns;
    uint64_t tick_ns;
    tb_channel_counters_t cnt;
};

static void tx_push(tb_channel_t *ch);

/* Requests are recycled (up to REQ_CACHE per channel): a malloc and free per
 * small message were a tenth of the channel's CPU time per message. */
static void req_free(tb_channel_t *ch, tb_send_req_t *req)
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

static tb_send_req_t *req_alloc(tb_channel_t *ch)
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
static void release_tx_frame(tb_channel_t *ch, tb_tx_frame_t *f)
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

static void rx_msg_free(tb_channel_t *ch, tb_rx_msg_t *m)
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
static void cancel_all(tb_channel_t *ch, int status)
{
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        tb_tx_lane_t *t = &ch->tx[l];
        tb_rx_lane_t *r = &ch->rx[l];

        for (unsigned i = 0; i < t->window; i++) {
            tb_tx_frame_t *f = &t->ring[i];
            if (f->buf && !f->posted) {
                release_tx_frame(ch, f);
            }
        }
        if (r->assembling) {
            rx_msg_free(ch, r->assembling);
            r->assembling = NULL;
        }
        while (r->wait_head) {
            tb_rx_msg_t *m = r->wait_head;
            r->wait_head = m->next;
            rx_msg_free(ch, m);
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
            req_free(ch, req);
        }
        t->q_tail = t->q_cur = NULL;
    }
}

/* Enter FAILED (once), telling the error callback if notify. */
static void ch_fail_why(tb_channel_t *ch, int status, int notify, const char *why)
{
    if (ch->state == CH_FAILED || ch->state == CH_CLOSED) {
        return;
    }
    ch->state = CH_FAILED;
    ch->status = status;
    TB_WARN("channel to peer epoch %016llx failed: %s", (unsigned long long) ch->peer_epoch, why);
    if (notify && ch->cb.error) {
        ch->cb.error(ch->cb.ctx, status, why);
    }
    cancel_all(ch, status);
}

__attribute__((format(printf, 3, 0))) static void ch_failv(tb_channel_t *ch, int status,
                                                           const char *fmt, va_list ap)
{
    char why[256];

    vsnprintf(why, sizeof(why), fmt, ap);
    ch_fail_why(ch, status, 1, why);
}

__attribute__((format(printf, 3, 4))) static void ch_fail(tb_channel_t *ch, int status,
                                                          const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    ch_failv(ch, status, fmt, ap);
    va_end(ap);
}

static int ch_usable(const tb_channel_t *ch)
{
    return ch->state == CH_CONNECTING || ch->state == CH_ESTABLISHED;
}

/* ------------------------------------------------------------------ */
/* Round-trip estimate                                                 */

static uint64_t rto_clamp(const tb_channel_t *ch, uint64_t rto)
{
    if (rto < ch->p.rto_min_ns) {
        return ch->p.rto_min_ns;
    }
    return rto > ch->p.rto_max_ns ? ch->p.rto_max_ns : rto;
}

static void rto_set(tb_channel_t *ch, unsigned lane, uint64_t rto)
{
    ch->tx[lane].rto = rto;
    ch->cnt.rto_ns[lane] = rto;
}

/* RFC 6298 section 2 with alpha 1/8, beta 1/4, K 4.  A sample also ends any
 * backoff: it proves the timeout it was measured under was long enough. */
static void rtt_sample(tb_channel_t *ch, unsigned lane, uint64_t r)
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
    rto_set(ch, lane, rto_clamp(ch, t->srtt + 4 * t->rttvar));
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
static void hello_done(tb_channel_t *ch, uint8_t type)
{
    uint64_t waited = ch->now - ch->connect_ns;
    uint64_t rto = rto_clamp(ch, 4 * waited);

    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        if (rto > ch->tx[l].rto) {
            rto_set(ch, l, rto);
        }
    }
    if (ch->hellos_sent == 1 && type != TB_FRAME_HELLO) {
        rtt_sample(ch, 0, ch->now - ch->last_hello_ns);
    }
}

/* ------------------------------------------------------------------ */
/* Transmission                                                        */

static uint32_t rx_limit(tb_channel_t *ch, unsigned l)
{
    tb_rx_lane_t *r = &ch->rx[l];
    uint32_t lim = r->h_tsn + r->posted;
    return tb_seq_lt(lim, r->adv_limit) ? r->adv_limit : lim;
}

static int tx_credit_ok(tb_channel_t *ch, unsigned lane, int is_ctrl)
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
static int tx_post(tb_channel_t *ch, tb_tx_frame_t *f, uint8_t flags)
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
        uint32_t lim = rx_limit(ch, l);
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
        ch_fail(ch, TB_CHAN_ELINK, "posting a send on lane %u failed (%d)", f->lane, rc);
        return rc;
    }
    f->posted = 1;
    ch->cnt.frames_sent++;
    ch->last_tx_ns = ch->now;
    return 0;
}

static void hdr_init(tb_wire_frame_hdr_t *h, uint8_t type, unsigned lane)
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
static int tx_ctrl(tb_channel_t *ch, uint8_t type, uint8_t flags, int ignore_credit)
{
    tb_tx_frame_t *f = ch->ctrl_free;

    if (!f || (!ignore_credit && !tx_credit_ok(ch, 0, 1))) {
        return -1;
    }
    f->buf = ch->link->ops->send_buf_get(ch->link, 0);
    if (!f->buf) {
        return -1;
    }
    ch->ctrl_free = f->next_free;
    hdr_init(f->buf, type, 0);
    f->len = TB_WIRE_HDR_SIZE;
    if (tx_post(ch, f, flags) != 0) {
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

static int tx_new_frame(tb_channel_t *ch, unsigned lane)
{
    tb_tx_lane_t *t = &ch->tx[lane];
    tb_send_req_t *req = t->q_cur;
    tb_tx_frame_t *f = &t->ring[t->next_seq % t->window];
    tb_wire_frame_hdr_t *h;
    uint32_t off = req->sent, plen;
    uint8_t flags = 0;
    void *buf;

    buf = ch->link->ops->send_buf_get(ch->link, lane);
    if (!buf) {
        return -1;
    }
    h = buf;
    hdr_init(h, TB_FRAME_DATA, lane);
    plen = frag_fill(ch, req, lane, (unsigned char *) buf + TB_WIRE_HDR_SIZE);
    h->seq = tb_wire_le32(t->next_seq);
    h->msg_id = tb_wire_le32(req->msg_id);
    h->msg_len = tb_wire_le32(req->len);
    h->frag_offset = tb_wire_le32(off);
    h->payload_len = tb_wire_le32(plen);
    h->tag = req->tag;
    /* Ask for an ack once half the window is out, so the peer can coalesce
     * the rest of its acks (or piggyback them) without stalling us. */
    if (t->next_seq - t->una + 1 == (t->window + 1) / 2) {
        flags |= TB_FRAME_F_ACK_REQ;
    }
    if (ch->p.payload_crc) {
        flags |= TB_FRAME_F_PAYLOAD_CRC;
        h->payload_crc = tb_wire_le32(tb_crc32c(0, (unsigned char *) buf + TB_WIRE_HDR_SIZE,
                                                plen));
    }
    h->flags = flags;

    f->buf = buf;
    f->msg_id = req->msg_id;
    f->lane = (uint8_t) lane;
    f->acked = 0;
    f->posted = 0;
    f->retx = 0;
    f->sacked = 0;
    f->sent_ns = ch->now;
    f->first_ns = ch->now;
    f->len = TB_WIRE_HDR_SIZE + plen;
    if (f->len < t->post_min) {
        f->len = t->post_min; /* the receive has the lane's frame count */
    }
    req->sent += plen;
    if (++req->frags_sent == req->frags_total) {
        t->q_cur = req->next;
    }
    if (t->una == t->next_seq) {
        t->timer_start = ch->now;
        t->ack_progress_ns = ch->now;
    }
    t->next_seq++;
    ch->cnt.data_frames_sent++;
    return tx_post(ch, f, flags);
}

/* The lane of a message of len bytes.  Bulk frames are padded to the full
 * frame count, so the bulk lane pays off only from about half a bulk frame
 * (measured on the virtual cluster with 4 and 64 KiB frames: 16 KiB is faster
 * as small frames, 48 KiB as one bulk frame, 32 KiB is even). */
static unsigned msg_lane(const tb_channel_t *ch, uint64_t len)
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

/* Whether message msg_id may start on lane l: less than TB_CHAN_MAX_AHEAD
 * past the oldest unacked message of every other lane.  Every message below
 * those is acked, hence accepted (an acked frame is never dropped), and so are
 * the earlier ones of lane l (a lane is in order): all are delivered by the
 * time msg_id starts, which keeps it within the receiver's window. */
static int tx_order_ok(const tb_channel_t *ch, unsigned l, uint32_t msg_id)
{
    for (unsigned l2 = 0; l2 < ch->p.nlanes; l2++) {
        const tb_tx_lane_t *t = &ch->tx[l2];
        uint32_t oldest;
        if (l2 == l) {
            continue;
        }
        /* The oldest unacked message of lane l2: its oldest unacked frame's,
         * else the next one it will send. */
        if (t->una != t->next_seq) {
            oldest = t->ring[t->una % t->window].msg_id;
        } else if (t->q_cur) {
            oldest = t->q_cur->msg_id;
        } else {
            continue;
        }
        if (tb_seq_diff(msg_id, oldest) >= (int32_t) TB_CHAN_MAX_AHEAD) {
            return 0;
        }
    }
    return 1;
}

static void tx_push(tb_channel_t *ch)
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
            if (!tx_credit_ok(ch, l, 0)) {
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
            if (tx_post(ch, f, flags) != 0) {
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
            if (t->q_cur->frags_sent == 0 && !tx_order_ok(ch, l, t->q_cur->msg_id)) {
                if (!t->order_stalled) {
                    t->order_stalled = 1;
                    ch->cnt.order_stalls++;
                }
                break;
            }
            t->order_stalled = 0;
            if (!tx_credit_ok(ch, l, 0)) {
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
static void tx_goback(tb_channel_t *ch, tb_tx_lane_t *t, uint32_t end)
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
static void tx_nak(tb_channel_t *ch, tb_tx_lane_t *t, uint32_t gap, uint32_t sack)
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
        tx_goback(ch, t, end);
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
static void tx_complete_reqs(tb_channel_t *ch, tb_tx_lane_t *t)
{
    while (ch_usable(ch) && t->q_head && t->q_head != t->q_cur
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
        req_free(ch, req);
    }
}

static void tx_ack(tb_channel_t *ch, unsigned lane, uint32_t new_una, uint16_t echo)
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
        if (!f->posted) {
            release_tx_frame(ch, f);
        }
        t->una++;
    }
    t->probing = 0;
    if (sent_ns != 0 && sent_ns >= resent_ns) {
        rtt_sample(ch, lane, ch->now - sent_ns);
    } else if (orig_ns != 0) {
        /* The timeout was too short for the wire: learn its round trip,
         * which also ends the backoff. */
        rtt_sample(ch, lane, ch->now - orig_ns);
    }
    if (tb_seq_lt(t->retx_next, t->una)) {
        t->retx_next = t->una;
    }
    if (tb_seq_lt(t->retx_end, t->una)) {
        t->retx_end = t->una;
    }
    t->timer_start = ch->now;
    t->ack_progress_ns = ch->now;
}

/* ------------------------------------------------------------------ */
/* Reception                                                           */

static void rx_drop(tb_channel_t *ch, uint64_t *counter, const char *what, unsigned lane)
{
    (*counter)++;
    if (ch->last_warn_ns == 0 || ch->now - ch->last_warn_ns >= WARN_INTERVAL_NS) {
        TB_WARN("channel to peer epoch %016llx: dropped a %s frame on lane %u (%llu similar "
                "drops not reported)",
                (unsigned long long) ch->peer_epoch, what, lane,
                (unsigned long long) ch->warn_suppressed);
        ch->last_warn_ns = ch->now ? ch->now : 1;
        ch->warn_suppressed = 0;
    } else {
        ch->warn_suppressed++;
    }
}

static int rx_repost(tb_channel_t *ch, unsigned lane, void *buf)
{
    int rc = ch->link->ops->post_recv(ch->link, lane, buf);
    if (rc != 0) {
        ch_fail(ch, TB_CHAN_ELINK, "posting a receive on lane %u failed (%d)", lane, rc);
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

    while (progress && ch_usable(ch)) {
        progress = 0;
        for (unsigned l = 0; l < ch->p.nlanes && ch_usable(ch); l++) {
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
                if (ch_usable(ch)) {
                    rx_repost(ch, m->lane, m->slot);
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
    ch_fail(ch, TB_CHAN_EPROTO, "the peer broke the protocol on lane %u: %s", lane, what);
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
        if (m && ch->cb.recv_place) {
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
            ch_fail(ch, TB_CHAN_ENOMEM, "out of memory for message %u (%u bytes) on lane %u",
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
            ch_fail(ch, TB_CHAN_ENOMEM, "out of memory for message %u (%u bytes) on lane %u",
                    msg_id, plen, lane);
            return 0;
        }
    }

    r->expected++;
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
        memcpy(m->head + off, payload, in_head);
        memcpy(m->data + (off + in_head - m->skip), payload + in_head, plen - in_head);
    } else {
        memcpy(m->data + off, payload, plen);
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

    while (r->nheld > 0 && ch_usable(ch)) {
        unsigned i = r->expected % ch->p.recv_depth[lane];
        unsigned char *buf = r->held[i];
        if (!buf) {
            rx_nak(ch, r);
            return;
        }
        r->held[i] = NULL;
        r->nheld--;
        if (rx_accept(ch, lane, buf, (const tb_wire_frame_hdr_t *) buf) == 0 && ch_usable(ch)) {
            rx_repost(ch, lane, buf);
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
static int rx_frame(tb_channel_t *ch, unsigned lane, unsigned char *buf, size_t len)
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
            ch_fail(ch, TB_CHAN_ERESTARTED,
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
        hello_done(ch, h->type);
    }
    for (unsigned l = 0; l < ch->p.nlanes && ch_usable(ch); l++) {
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
        tx_ack(ch, l, new_una[l], tb_wire_le16(h->echo_tsn[l]));
        if (h->flags & (l == 0 ? TB_FRAME_F_NAK0 : TB_FRAME_F_NAK1)) {
            ch->cnt.naks_received++;
            tx_nak(ch, t, new_una[l],
                   h->type != TB_FRAME_ACK ? 0
                                           : tb_wire_le32(l == 0 ? h->msg_len : h->frag_offset));
        }
        if (answered) {
            /* Answered by the probe itself (its exact tsn): a clean lane-0
             * round trip, the probe being sent once. */
            if (l == 0 && tb_wire_le16(h->echo_tsn[0]) == (uint16_t) t->probe_tsn
                && h->type == TB_FRAME_ACK) {
                rtt_sample(ch, 0, ch->now - ch->last_probe_at);
            }
            t->probing = 0;
            if (tb_seq_lt(t->una, t->probe_end)) {
                ch->cnt.probe_repairs++;
                tx_goback(ch, t, t->probe_end);
            }
        }
    }
    if (!ch_usable(ch)) {
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
        ch_fail(ch, TB_CHAN_ECLOSED, "peer closed the channel");
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
        ch_fail(ch, TB_CHAN_ELINK, "receive completion error %d on lane %u", status, lane);
        return;
    }
    if (!ch_usable(ch)) {
        return;
    }
    if (rx_frame(ch, lane, buf, len) == 0 && ch_usable(ch)) {
        rx_repost(ch, lane, buf);
    }
}

void tb_channel_send_done(tb_channel_t *ch, void *cookie, int status)
{
    ch->dirty = 1;
    tb_tx_frame_t *f = cookie;

    f->posted = 0;
    if (status != 0) {
        /* Releases every frame not posted, this one included. */
        ch_fail(ch, TB_CHAN_ELINK, "send completion error %d on lane %u", status, f->lane);
    }
    if (f->is_ctrl || f->acked || !ch_usable(ch)) {
        release_tx_frame(ch, f);
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
        tx_post(ch, f, (((tb_wire_frame_hdr_t *) f->buf)->flags & TB_FRAME_F_PAYLOAD_CRC)
                           | TB_FRAME_F_RETX | TB_FRAME_F_ACK_REQ);
    } else if (l == 0 && tx_ctrl(ch, TB_FRAME_ACK, TB_FRAME_F_ACK_REQ, 1) == 0) {
        ch->cnt.credit_probes++;
    }
}

/* A lane's retransmit timer expired.  On a UC queue pair frames do not
 * overtake each other, so a resend of a frame that is merely late can never
 * arrive first: it is pure waste (and a 64 KiB one on the bulk lane).  So
 * first ask: a header-only ACK_REQ on lane 0, whose answer echoes its tsn and
 * says what arrived (rx_frame then resends what did not).  One probe serves
 * every lane whose timer expires in the same call.  1 if a probe is out. */
static int tx_probe(tb_channel_t *ch, tb_tx_lane_t *t)
{
    if (ch->cnt.probes == 0 || ch->last_probe_at != ch->now) {
        if (tx_ctrl(ch, TB_FRAME_ACK, TB_FRAME_F_ACK_REQ | TB_FRAME_F_PROBE, 0) != 0) {
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

static void progress_timers(tb_channel_t *ch)
{
    uint64_t now = ch->now;
    const tb_channel_params_t *p = &ch->p;

    if (ch->state == CH_CONNECTING) {
        if (now - ch->connect_ns >= p->peer_timeout_ns) {
            ch_fail(ch, TB_CHAN_EPEERDEAD, "peer did not answer within %llu ms of connecting",
                    (unsigned long long) (p->peer_timeout_ns / 1000000));
            return;
        }
        if (now - ch->last_hello_ns >= ch->hello_ivl && tx_ctrl(ch, TB_FRAME_HELLO,
                                                                TB_FRAME_F_ACK_REQ, 1) == 0) {
            ch->last_hello_ns = now;
            ch->hellos_sent++;
            ch->hello_ivl = rto_clamp(ch, ch->hello_ivl * 2);
        }
        return;
    }
    if (now - ch->last_rx_ns >= p->peer_timeout_ns) {
        ch_fail(ch, TB_CHAN_EPEERDEAD, "no frame from the peer for %llu ms",
                (unsigned long long) ((now - ch->last_rx_ns) / 1000000));
        return;
    }
    for (unsigned l = 0; l < p->nlanes && ch_usable(ch); l++) {
        tb_tx_lane_t *t = &ch->tx[l];
        tx_credit_probe(ch, l);
        if (t->una == t->next_seq || !ch_usable(ch)) {
            continue;
        }
        if (now - t->ack_progress_ns >= p->peer_timeout_ns) {
            ch_fail(ch, TB_CHAN_EPEERDEAD, "the peer acknowledged nothing on lane %u for %llu ms",
                    l, (unsigned long long) ((now - t->ack_progress_ns) / 1000000));
            return;
        }
        if (now - t->timer_start >= t->rto) {
            ch->cnt.timeouts++;
            if (!t->probing && tx_probe(ch, t)) {
                continue;
            }
            /* The probe went unanswered too: resend, and back off. */
            t->probing = 0;
            tx_goback(ch, t, t->next_seq);
            rto_set(ch, l, rto_clamp(ch, t->rto * 2));
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
        tx_ctrl(ch, TB_FRAME_ACK, flags, 0);
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
    if (!ch_usable(ch)) {
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
    tx_push(ch);
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        tx_complete_reqs(ch, &ch->tx[l]);
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
    ch->tick_ns = (ch->p.ack_delay_ns < ch->p.rto_min_ns ? ch->p.ack_delay_ns : ch->p.rto_min_ns) / 4;
    if (ch->tick_ns == 0) {
        ch->tick_ns = 1;
    }
    ch->next_msg_id = ch->p.initial_seq[0];
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
        t->next_tsn = ch->p.initial_seq[l];
        t->peer_limit = ch->p.initial_seq[l] - 1;
        /* Coalesce acks over half the receives; the sender asks for one
         * itself when half its window is out. */
        r->ack_every = ch->p.recv_depth[l] / 2 ? ch->p.recv_depth[l] / 2 : 1;
    }
    for (unsigned l = 0; l < ch->p.nlanes; l++) {
        rto_set(ch, l, rto_clamp(ch, ch->p.rto_initial_ns));
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
    if (ch_usable(ch) || ch->state == CH_IDLE) {
        ch->state = CH_CLOSED;
        ch->status = TB_CHAN_ECANCELED;
        cancel_all(ch, TB_CHAN_ECANCELED);
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
                ch_fail(ch, TB_CHAN_ENOMEM, "the link has fewer than %u receive buffers on "
                        "lane %u", ch->p.recv_depth[l], l);
                return TB_CHAN_ENOMEM;
            }
            r->bufs[r->nbufs++] = buf;
            if (rx_repost(ch, l, buf) != 0) {
                return TB_CHAN_ELINK;
            }
        }
    }
    ch->connect_ns = ch->now;
    ch->last_rx_ns = ch->now;
    ch->last_hello_ns = ch->now;
    ch->hello_ivl = rto_clamp(ch, ch->p.rto_initial_ns);
    if (tx_ctrl(ch, TB_FRAME_HELLO, TB_FRAME_F_ACK_REQ, 1) == 0) {
        ch->hellos_sent = 1;
    } else if (!ch_usable(ch)) {
        return ch->status;
    }
    return TB_CHAN_OK;
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
    req = req_alloc(ch);
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
            req_free(ch, req);
            return TB_CHAN_ENOMEM;
        }
        memcpy(req->iov, iov, (size_t) iovcnt * sizeof(*iov));
    }
    lane = msg_lane(ch, len);
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
        tx_push(ch);
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
    lane = msg_lane(ch, len);
    t = &ch->tx[lane];
    f = &t->ring[t->next_seq % t->window];
    if (len > t->frag_cap || t->q_cur || t->retx_next != t->retx_end
        || t->next_seq - t->una >= t->window || f->buf || !tx_credit_ok(ch, lane, 0)
        || !tx_order_ok(ch, lane, ch->next_msg_id)) {
        return NULL;
    }
    f->buf = ch->link->ops->send_buf_get(ch->link, lane);
    if (!f->buf) {
        return NULL;
    }
    h = f->buf;
    hdr_init(h, TB_FRAME_DATA, lane);
    h->msg_len = h->payload_len = tb_wire_le32((uint32_t) len);
    h->tag = tag;
    ch->begun = f;
    return (unsigned char *) f->buf + TB_WIRE_HDR_SIZE;
}

int tb_channel_send_commit(tb_channel_t *ch)
{
    tb_tx_frame_t *f = ch->begun;
    tb_tx_lane_t *t;
    tb_wire_frame_hdr_t *h;
    uint32_t len;
    uint8_t flags = 0;

    if (!f) {
        return TB_CHAN_ESTATE;
    }
    ch->begun = NULL;
    t = &ch->tx[f->lane];
    h = f->buf;
    len = tb_wire_le32(h->payload_len);
    f->msg_id = ch->next_msg_id++;
    h->seq = tb_wire_le32(t->next_seq);
    h->msg_id = tb_wire_le32(f->msg_id);
    if (t->next_seq - t->una + 1 == (t->window + 1) / 2) {
        flags |= TB_FRAME_F_ACK_REQ;
    }
    if (ch->p.payload_crc) {
        flags |= TB_FRAME_F_PAYLOAD_CRC;
        h->payload_crc = tb_wire_le32(tb_crc32c(0, h + 1, len));
    }
    h->flags = flags;
    f->acked = f->posted = f->retx = f->sacked = 0;
    f->sent_ns = f->first_ns = ch->now;
    f->len = TB_WIRE_HDR_SIZE + len;
    if (f->len < t->post_min) {
        f->len = t->post_min;
    }
    if (t->una == t->next_seq) {
        t->timer_start = ch->now;
        t->ack_progress_ns = ch->now;
    }
    t->next_seq++;
    ch->cnt.data_frames_sent++;
    ch->cnt.msgs_sent++;
    ch->cnt.bytes_sent += len;
    return tx_post(ch, f, flags) == 0 ? TB_CHAN_OK : ch->status;
}

void tb_channel_send_cancel(tb_channel_t *ch)
{
    if (ch->begun) {
        release_tx_frame(ch, ch->begun);
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

void tb_channel_abort(tb_channel_t *ch, int status, const char *why)
{
    ch_fail_why(ch, status < 0 ? status : TB_CHAN_ECANCELED, 0,
                why ? why : "aborted by the caller");
}

void tb_channel_close(tb_channel_t *ch)
{
    if (!ch_usable(ch)) {
        return;
    }
    if (ch->state == CH_ESTABLISHED) {
        tx_ctrl(ch, TB_FRAME_CLOSE, 0, 0);
    }
    if (ch_usable(ch)) {
        ch->state = CH_CLOSED;
        ch->status = TB_CHAN_ECANCELED;
        cancel_all(ch, TB_CHAN_ECANCELED);
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
