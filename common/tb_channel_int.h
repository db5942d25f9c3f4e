/*
 * tbrdma common layer: the reliable channel's internals, shared by
 * tb_channel.c (parameters, failure, round trips, timers, life cycle),
 * tb_channel_tx.c (transmission, acks, the send calls) and tb_channel_rx.c
 * (reception).  Not for users of the channel: see tb_channel.h.
 */
#ifndef TB_CHANNEL_INT_H
#define TB_CHANNEL_INT_H

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
    uint8_t whole;    /* its message fits the window: kept till it is let go whole */
    uint8_t let_go;   /* passed by keep while still posted: released at its completion */
    uint64_t sent_ns; /* latest transmission */
} tb_tx_frame_t;

typedef struct tb_tx_lane {
    tb_tx_frame_t *ring;
    unsigned window;
    uint32_t frag_cap;  /* payload bytes per frame */
    uint32_t post_min;  /* shortest post with the lane's frame count */
    uint32_t una;       /* oldest unacked seq */
    /* Oldest frame still held: acked frames are let go only in message order,
     * once every earlier message is wholly acked too (tb_ch_tx_release), so
     * what a failed channel hands back is whole (tb_ch_tx_hand_back). */
    uint32_t keep;
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
    int order_stalled;   /* q_cur waits for the other lane (see tb_ch_tx_order_ok) */
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
    uint64_t progress_ns; /* the latest data the peer acknowledged or delivered to us */
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
    uint32_t release_msg; /* every message before it is wholly acked */
    uint32_t next_deliver;
    int ack_now;
    int in_callback;
    size_t pending;
    uint64_t pending_bytes;
    tb_log_limit_t warn_limit; /* drops, which a peer causes at will */
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

static inline int tb_ch_usable(const tb_channel_t *ch)
{
    return ch->state == CH_CONNECTING || ch->state == CH_ESTABLISHED;
}

/* Shared between the three files (each defined with its comment). */
void tb_ch_req_free(tb_channel_t *ch, tb_send_req_t *req);
void tb_ch_release_tx_frame(tb_channel_t *ch, tb_tx_frame_t *f);
__attribute__((format(printf, 3, 4))) void tb_ch_fail(tb_channel_t *ch, int status,
                                                      const char *fmt, ...);
void tb_ch_rtt_sample(tb_channel_t *ch, unsigned lane, uint64_t r);
void tb_ch_hello_done(tb_channel_t *ch, uint8_t type);
int tb_ch_tx_post(tb_channel_t *ch, tb_tx_frame_t *f, uint8_t flags);
int tb_ch_tx_ctrl(tb_channel_t *ch, uint8_t type, uint8_t flags, int ignore_credit);
void tb_ch_tx_push(tb_channel_t *ch);
void tb_ch_tx_goback(tb_channel_t *ch, tb_tx_lane_t *t, uint32_t end);
void tb_ch_tx_nak(tb_channel_t *ch, tb_tx_lane_t *t, uint32_t gap, uint32_t sack);
void tb_ch_tx_complete_reqs(tb_channel_t *ch, tb_tx_lane_t *t);
void tb_ch_tx_ack(tb_channel_t *ch, unsigned lane, uint32_t new_una, uint16_t echo);
void tb_ch_tx_release(tb_channel_t *ch);
void tb_ch_tx_hand_back(tb_channel_t *ch);
int tb_ch_rx_repost(tb_channel_t *ch, unsigned lane, void *buf);

#endif /* TB_CHANNEL_INT_H */
