/*
 * tbrdma common layer: the reliable channel.
 *
 * A channel turns one link (a UC connection with one or two lanes: no
 * acknowledgement, silent loss, a send lost when no receive waits for it) into
 * a reliable, ordered, flow-controlled message pipe to one peer:
 *  - messages are fragmented into frames of their lane's size and delivered
 *    once, in send order across both lanes, intact;
 *  - credits: no frame is sent unless the peer has advertised a receive for it;
 *  - cumulative and selective acks; selective retransmission on a NAK or on
 *    timeout (an adaptive timeout from measured round trips, exponential
 *    backoff); duplicate suppression;
 *  - CRC32C on every header (and payloads, unless switched off);
 *  - keepalives, peer-death and peer-restart detection;
 *  - bounds: on the send queue (TB_CHAN_EAGAIN) and on the messages a
 *    receiver holds for reordering (TB_CHAN_MAX_AHEAD).
 *
 * Not thread safe: the caller serialises all calls on one channel.  Time is
 * whatever the caller passes to tb_channel_progress() (ns, monotonic).
 * Callbacks may call tb_channel_send*() (the frames then go out at the next
 * progress call), tb_channel_send_detach(), tb_channel_close() and
 * tb_channel_abort(), never tb_channel_destroy().
 */
#ifndef TB_CHANNEL_H
#define TB_CHANNEL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "tb_link.h"
#include "tb_wire.h"

/* Status codes: 0 or negative. */
enum {
    TB_CHAN_OK = 0,
    TB_CHAN_EINVAL = -1,    /* bad parameter or argument */
    TB_CHAN_ENOMEM = -2,    /* out of memory or out of link buffers at setup */
    TB_CHAN_EMSGSIZE = -3,  /* message larger than max_msg_size */
    TB_CHAN_EPROTO = -4,    /* incompatible or corrupt peer address blob */
    TB_CHAN_ESTATE = -5,    /* call not valid in the channel's state */
    TB_CHAN_EPEERDEAD = -6, /* the peer stopped answering within peer_timeout */
    TB_CHAN_ERESTARTED = -7, /* the peer is a new incarnation */
    TB_CHAN_ECLOSED = -8,   /* the peer closed the channel */
    TB_CHAN_ECANCELED = -9, /* closed or destroyed locally before completion */
    TB_CHAN_ELINK = -10,    /* the link failed to post or reported an error */
    TB_CHAN_EAGAIN = -11,   /* the send queue is full (max_queued_msgs/bytes): retry later */
};

/* Reassembly window: a receiver accepts the start of message msg_id only
 * while msg_id - (the next message it will deliver) < TB_CHAN_MAX_AHEAD, and
 * fails the channel otherwise (a peer could make it hold messages without
 * bound).  Senders keep within it by starting a message only while it is less
 * than TB_CHAN_MAX_AHEAD past the oldest unacknowledged message of every other
 * lane.  Both peers must use the same value. */
#define TB_CHAN_MAX_AHEAD 64u

/* The most bytes of a placed message the channel keeps for recv_placed. */
#define TB_CHAN_PLACE_HEAD 64u

const char *tb_channel_strerror(int status);

typedef struct tb_channel tb_channel_t;

typedef struct tb_channel_params {
    unsigned nlanes;                             /* 1 or 2 */
    uint32_t frame_size[TB_WIRE_MAX_LANES];      /* multiple of 4096, <= 16773120 */
    unsigned recv_depth[TB_WIRE_MAX_LANES];      /* receives posted per lane */
    unsigned recv_depth_max;                     /* hard cap per QP (hardware: 32) */
    unsigned send_window[TB_WIRE_MAX_LANES];     /* unacked data frames per lane */
    uint64_t epoch;                              /* this incarnation; random, non-zero */
    uint32_t initial_seq[TB_WIRE_MAX_LANES];     /* first tsn/seq per lane (random) */
    int payload_crc;                             /* also checksum payloads */
    uint32_t max_msg_size;                       /* largest message sent or accepted; a
                                                  * larger one from the peer fails the
                                                  * channel.  It bounds what one message
                                                  * makes this side allocate, so set what
                                                  * the peers agreed to receive, the same
                                                  * on every node (the BTL: the default) */
    uint64_t ack_delay_ns;                       /* coalesce acks for at most this */
    uint64_t rto_min_ns;                         /* floor of the retransmit timeout */
    uint64_t rto_initial_ns;                     /* timeout and HELLO interval before the
                                                  * first round-trip sample (clamped to
                                                  * [rto_min_ns, rto_max_ns]) */
    uint64_t rto_max_ns;                         /* ceiling, also of the backoff */
    uint64_t keepalive_ns;                       /* idle time before a keepalive (one
                                                  * per silence of the peer: see
                                                  * tb_channel.c) */
    uint64_t peer_timeout_ns;                    /* silence before the peer is dead */
    uint64_t stall_timeout_ns;                   /* a peer that answers but acknowledges
                                                  * none of our data for this long is failed
                                                  * (0: peer_timeout_ns).  Longer than the
                                                  * silence deadline: on a lossy link a large
                                                  * frame may need many resends, while a dead
                                                  * peer or a cut cable is silence */
    unsigned max_frames_per_progress;            /* bound on posts per progress call */
    uint64_t max_queued_bytes;                   /* bytes of sends not yet completed, and */
    unsigned max_queued_msgs;                    /* their number, beyond which a send gets
                                                  * TB_CHAN_EAGAIN (see tb_channel_sendv) */
} tb_channel_params_t;

/* Defaults: 2 lanes (4 KiB and 64 KiB), depth 32, window 32, payload CRC on,
 * 64 MiB messages, ack delay 500 us, RTO 2 ms..128 ms (10 ms before the
 * first round-trip sample), keepalive 100 ms, peer timeout 5 s, 64 frames per
 * progress, a send queue of at most 4096 messages and 256 MiB (four of the
 * largest messages).  epoch and initial_seq are left 0: the caller must set a
 * random, non-zero epoch. */
void tb_channel_params_default(tb_channel_params_t *params);

/* 0 if params are usable, else TB_CHAN_EINVAL with a sentence naming the
 * violated limit in why (if why is not NULL). */
int tb_channel_params_check(const tb_channel_params_t *params, char *why, size_t why_len);

typedef struct tb_channel_callbacks {
    void *ctx;
    /* A whole message, in order.  data is valid only during the call unless
     * it is a buffer the caller supplied through recv_buf. */
    void (*recv)(void *ctx, uint8_t tag, const void *data, size_t len);
    /* Optional: a message of len bytes (more than one frame) begins; return
     * where to assemble it (len bytes, the caller's memory) or NULL to let
     * the channel allocate.  Lets large messages take one copy in total. */
    void *(*recv_buf)(void *ctx, uint8_t tag, size_t len);
    /* Required with recv_buf: a buffer from recv_buf will not be delivered
     * (channel failed or destroyed); the caller may reuse it. */
    void (*recv_buf_drop)(void *ctx, void *buf);
    /* Optional, tried before recv_buf: a message of len bytes (more than one
     * frame) begins, head_len bytes of it at head.  Return where its bytes
     * from *skip on go (len - *skip bytes of the caller's memory, *skip at
     * most head_len and TB_CHAN_PLACE_HEAD), or NULL.  The channel writes
     * each fragment straight there, and delivers the message through
     * recv_placed with its first *skip bytes: one copy fewer than recv.  If
     * the channel fails first, the destination may hold part of it.  Asked
     * only of the message due next (every earlier one delivered), so at most
     * one message is placed at a time and none passes an earlier one. */
    void *(*recv_place)(void *ctx, uint8_t tag, size_t len, const void *head, size_t head_len,
                        size_t *skip);
    /* Required with recv_place: a placed message is complete, in order. */
    void (*recv_placed)(void *ctx, uint8_t tag, const void *head, size_t skip, size_t len);
    /* A send finished: TB_CHAN_OK once every byte is in the channel's send
     * slots (the caller's memory is free again; the channel resends from its
     * slots until the peer acknowledges, or fails), or the error that ended
     * the channel.  Reported from tb_channel_progress, never from inside
     * tb_channel_send. */
    void (*send_done)(void *ctx, void *cookie, int status);
    /* Optional: the channel failed (not for tb_channel_abort).  Called just
     * before error, once for every message the peer may not have delivered,
     * whole, in send order: every message from the oldest one not wholly
     * acknowledged on, including those still queued.  Every earlier message
     * the peer delivered (frames are let go in message order).  The bytes
     * (len in all, in iovcnt pieces) are valid only during the call; the
     * sends still complete with the error afterwards.  A message of more
     * frames than the lane's send window cannot be kept whole: it comes with
     * iov NULL once part of it was let go.  Keeping messages whole holds
     * acked frames a little longer (behind an older message on the other
     * lane), so a channel without this callback does not. */
    void (*unsent)(void *ctx, uint8_t tag, const struct iovec *iov, int iovcnt, size_t len);
    /* The channel failed (status, and a sentence for the user); called once,
     * not for tb_channel_abort.  Pending sends then complete with status;
     * later sends fail at once. */
    void (*error)(void *ctx, int status, const char *why);
} tb_channel_callbacks_t;

typedef struct tb_channel_counters {
    uint64_t frames_sent;      /* every post, retransmissions included */
    uint64_t frames_received;  /* every receive completion */
    uint64_t data_frames_sent; /* first transmissions of data frames */
    uint64_t ctrl_frames_sent; /* HELLO, ACK, keepalive, CLOSE */
    uint64_t retransmits;
    uint64_t timeouts;         /* retransmit timer expiries */
    uint64_t probes;           /* ACK_REQ probes sent on an expiry instead of resending */
    uint64_t probe_repairs;    /* probe answers that showed frames lost (then resent) */
    uint64_t spurious_retransmits; /* resends whose original was acked (tsn echo) */
    uint64_t naks_sent;
    uint64_t naks_received;
    uint64_t keepalives_sent;
    uint64_t duplicates;       /* data frames already received */
    uint64_t out_of_order;     /* data frames after a gap, dropped */
    uint64_t bad_checksum;
    uint64_t malformed;        /* bad magic/version/type/lane/length/offset */
    uint64_t stale;            /* frames of another incarnation */
    uint64_t credit_stalls;    /* times data waited for peer credit */
    uint64_t order_stalls;     /* times a lane's next message waited for an older one on
                                * the other lane to be acked (TB_CHAN_MAX_AHEAD) */
    uint64_t credit_probes;    /* frames sent beyond the peer's limit after a lane stayed
                                * without credit for a retransmit timeout */
    uint64_t msgs_sent;        /* sends completed OK */
    uint64_t msgs_received;    /* messages delivered */
    uint64_t bytes_sent;
    uint64_t bytes_received;
    uint64_t bytes_assembled;  /* of messages of several frames, copied from the receive slots
                                * into memory of the channel's own or recv_buf's */
    uint64_t bytes_placed;     /* the same, copied straight to where recv_place said */
    uint64_t rtt_samples;      /* round trips measured (Karn's rule: see tb_channel.c) */
    /* Gauges, per lane: the smoothed round trip (0 before the first sample)
     * and the current retransmit timeout. */
    uint64_t srtt_ns[TB_WIRE_MAX_LANES];
    uint64_t rto_ns[TB_WIRE_MAX_LANES];
} tb_channel_counters_t;

/* Create a channel over link (which must outlive it).  On TB_CHAN_EINVAL the
 * reason is logged. */
int tb_channel_create(const tb_channel_params_t *params, tb_link_t *link,
                      const tb_channel_callbacks_t *cb, tb_channel_t **out);

/* Return every buffer held to the link and free the channel.  Pending sends
 * complete with TB_CHAN_ECANCELED.  Call only when the link will report no
 * more completions for this channel (verbs: after its QPs are destroyed). */
void tb_channel_destroy(tb_channel_t *ch);

/* The local address blob to send to the peer. */
void tb_channel_local_addr(tb_channel_t *ch, tb_wire_addr_t *addr);

/* Connect to the peer's blob at time now: connects the link, posts the
 * receives and starts the HELLO exchange.  Sends may be queued before. */
int tb_channel_connect(tb_channel_t *ch, const tb_wire_addr_t *peer, uint64_t now);

/* Queue a message (0..max_msg_size bytes) with an 8-bit tag.  The caller's
 * memory must stay valid until send_done(cookie) (or tb_channel_send_detach):
 * fragments are copied into link slots as credits allow.  Returns 0, or an
 * error without a callback: TB_CHAN_EMSGSIZE, TB_CHAN_ENOMEM, the channel's
 * failure status, or TB_CHAN_EAGAIN when the sends not yet completed would
 * exceed max_queued_msgs or max_queued_bytes with this one (a message alone
 * larger than max_queued_bytes is accepted when nothing else is queued). */
int tb_channel_send(tb_channel_t *ch, uint8_t tag, const void *buf, size_t len, void *cookie);
int tb_channel_sendv(tb_channel_t *ch, uint8_t tag, const struct iovec *iov, int iovcnt,
                     void *cookie);

/* The fast path for a message of len bytes that fits one frame: when it can
 * go at once (nothing queued before it, a free slot, credit and window; not
 * inside a callback), returns where to write its len bytes in a send slot,
 * else NULL (use tb_channel_send).  Then tb_channel_send_commit posts it; it
 * is complete at once (no send_done), and the channel resends it from the
 * slot if needed.  Or tb_channel_send_cancel gives the slot back.  Nothing
 * else may be sent on the channel in between. */
void *tb_channel_send_begin(tb_channel_t *ch, uint8_t tag, size_t len);
/* 0, or the channel's failure status (the post failed). */
int tb_channel_send_commit(tb_channel_t *ch);
void tb_channel_send_cancel(tb_channel_t *ch);

/* Stop referencing the caller's memory of every pending send queued with
 * cookie (e.g. before deregistering it): the bytes not yet copied into link
 * slots are copied into memory the channel owns until the send completes.
 * Returns 0 when no pending send with cookie references caller memory any
 * more (copied now, or nothing was left to copy), 1 when no pending send has
 * that cookie (it completed already, or was never queued), or TB_CHAN_ENOMEM
 * if a copy could not be allocated (the sends not copied yet still reference
 * the caller's memory; calling again retries them). */
int tb_channel_send_detach(tb_channel_t *ch, void *cookie);

/* Close: tell the peer (best effort) and cancel pending sends. */
void tb_channel_close(tb_channel_t *ch);

/* Fail the channel at once with status (a negative TB_CHAN_* code; 0 becomes
 * TB_CHAN_ECANCELED), for a caller that gave up on it, e.g. when connection
 * setup failed before the channel ever connected.  Valid in any state (a
 * no-op once failed or closed); why is logged.  Every pending send completes
 * with status before this returns, later sends fail with it at once.  The
 * error callback is not called (the caller knows), and the peer is not told
 * (tb_channel_close does that).  May be called from callbacks. */
void tb_channel_abort(tb_channel_t *ch, int status, const char *why);

/* Link completions (from the caller's poll of the link). */
void tb_channel_send_done(tb_channel_t *ch, void *cookie, int status);
void tb_channel_recv_done(tb_channel_t *ch, unsigned lane, void *buf, size_t len, int status);

/* The time (ns, monotonic) before reporting a batch of completions: acks in
 * them are then timed at the poll rather than at the previous progress call,
 * which keeps round-trip samples from coming out short when polls are far
 * apart.  Optional; progress advances the clock too. */
void tb_channel_clock(tb_channel_t *ch, uint64_t now);

/* Timers, retransmissions, acks, credits, queued sends.  Bounded work, never
 * blocks.  Call after reporting a batch of completions and periodically. */
void tb_channel_progress(tb_channel_t *ch, uint64_t now);

/* 1 once the peer has answered the HELLO exchange. */
int tb_channel_is_connected(const tb_channel_t *ch);
/* The state of every lane, one line for a log: what a stall report needs. */
void tb_channel_describe(const tb_channel_t *ch, char *buf, size_t len);
/* 0 while usable, else the status that ended it. */
int tb_channel_status(const tb_channel_t *ch);
/* Sends not yet complete (their data not all in send slots yet). */
size_t tb_channel_pending_sends(const tb_channel_t *ch);
/* Sends not complete plus data frames the peer has not acknowledged: 0 once
 * everything sent has arrived. */
size_t tb_channel_unacked(const tb_channel_t *ch);
const tb_channel_counters_t *tb_channel_counters(const tb_channel_t *ch);
/* The latest time (as passed to the channel) it made progress: the peer
 * acknowledged data not acknowledged before, or a data frame arrived in
 * sequence; the connection's time until then.  However slow or lossy the link,
 * this moves while data crosses it: a caller waiting for an answer from the
 * peer can tell a slow peer from one that takes requests but never answers. */
uint64_t tb_channel_progress_ns(const tb_channel_t *ch);

#endif /* TB_CHANNEL_H */
