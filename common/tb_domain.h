/*
 * tbrdma common layer: a device's transport resources, and the connections
 * over them.
 *
 * A domain is one usable device (tb_device_t) opened for traffic: one
 * protection domain, one completion queue shared by every connection on the
 * device, and the accounting that keeps this process within Apple's limits:
 *  - a queue-pair budget (default 10, the device's whole limit; lower it when
 *    several processes of a host share a cable): a connection takes one QP
 *    per lane and is refused, with a message naming the parameters, when the
 *    budget would be exceeded;
 *  - one memory registration per connection (tb_qplink: one chunk holds all
 *    of its frame slots), so the QP budget also bounds the MRs: at most 5
 *    with 2 lanes, 10 with 1, against a device limit of about 100.
 *
 * A connection (tb_conn_t) is a reliable channel (tb_channel.h) over a verbs
 * link (tb_qplink.h) on a domain.  Life cycle for the BTL:
 *   tb_conn_create()      QPs, registered slots, channel (not connected)
 *   tb_conn_local_addr()  the blob to give the peer (modex or tb_cm)
 *   tb_conn_connect()     with the peer's blob: QPs to RTS, receives posted
 *   tb_channel_send...()  on tb_conn_channel(); completions and received
 *                         messages arrive through the channel callbacks
 *                         during tb_domain_progress()
 *   tb_conn_destroy()     QPs first (never through ERR), channel, then MR
 *
 * Not thread safe: the caller serialises every call on a domain and its
 * connections.  Channel callbacks run inside tb_domain_progress(); they must
 * not destroy a connection (defer it to after the progress call).
 */
#ifndef TB_DOMAIN_H
#define TB_DOMAIN_H

#include <stddef.h>
#include <stdint.h>

#include "tb_channel.h"
#include "tb_device.h"
#include "tb_verbs.h"

typedef struct tb_domain tb_domain_t;
typedef struct tb_conn tb_conn_t;

typedef struct tb_domain_params {
    int qp_budget;          /* QPs this process may hold on the device (btl_tbrdma_qps_per_device) */
    unsigned max_wr_per_qp; /* sends + receives outstanding per QP: sizes the shared CQ */
    unsigned poll_batch;    /* completions taken per ibv_poll_cq call */
    unsigned poll_rounds;   /* ibv_poll_cq calls per progress call, at most */
    uint32_t max_mtu;       /* cap on the path MTU in bytes */
    int events;             /* ask for completion events (tb_domain_event_fd) */
} tb_domain_params_t;

/* Budget 10 (Apple's per-device QP limit), 128 work requests per QP,
 * batches of 32 completions, 4 rounds, MTU cap 4096. */
void tb_domain_params_default(tb_domain_params_t *params);

/* Open dev (usable, context open; both must outlive the domain) for traffic.
 * 0, or a negative errno with the failing call and what to do logged. */
int tb_domain_create(tb_verbs_t *verbs, const tb_device_t *dev, const tb_domain_params_t *params,
                     tb_domain_t **out);

/* Destroy every remaining connection, then the CQ and the PD. */
void tb_domain_destroy(tb_domain_t *d);

/* Poll the CQ (at most poll_rounds batches), report each completion to its
 * connection's channel (completions of destroyed connections are dropped),
 * then progress every channel of the domain at now_ns (monotonic).  Never
 * blocks.  Returns the completions handled, or a negative errno if polling
 * failed. */
int tb_domain_progress(tb_domain_t *d, uint64_t now_ns);

const tb_device_t *tb_domain_device(const tb_domain_t *d);

/* With params.events and a device that has completion events: a descriptor
 * that becomes readable when a completion arrives after tb_domain_arm();
 * else -1 (poll instead). */
int tb_domain_event_fd(const tb_domain_t *d);
/* Ask for an event at the next completion.  Then look at the CQ once more
 * (tb_domain_progress) before sleeping: one may have come in between. */
int tb_domain_arm(tb_domain_t *d);
/* After the descriptor turned readable: consume its events. */
void tb_domain_event_drain(tb_domain_t *d);
int tb_domain_qps_used(const tb_domain_t *d);
int tb_domain_mrs_used(const tb_domain_t *d);
/* Completions dropped because their connection no longer exists. */
uint64_t tb_domain_stale_completions(const tb_domain_t *d);

/* Create a connection with channel params (tb_channel_params_t; epoch and
 * initial_seq are filled with random values when 0) and callbacks.  Fails
 * with -EBUSY when the QP budget would be exceeded (the message names the
 * budget and the lane count), -EINVAL for params the domain cannot hold,
 * or the verbs error. */
int tb_conn_create(tb_domain_t *d, const tb_channel_params_t *params,
                   const tb_channel_callbacks_t *cb, tb_conn_t **out);

/* The local address blob (64 bytes, tb_wire_addr_t) for the peer. */
void tb_conn_local_addr(tb_conn_t *c, tb_wire_addr_t *addr);

/* Connect to the peer's blob at now_ns.  A TB_CHAN_* status. */
int tb_conn_connect(tb_conn_t *c, const tb_wire_addr_t *peer, uint64_t now_ns);

tb_channel_t *tb_conn_channel(tb_conn_t *c);

/* Destroy: QPs, then the channel (pending sends complete with
 * TB_CHAN_ECANCELED), then the registered chunk.  Not from a callback. */
void tb_conn_destroy(tb_conn_t *c);


#endif /* TB_DOMAIN_H */
