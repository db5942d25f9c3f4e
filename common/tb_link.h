/*
 * tbrdma common layer: the link interface under a reliable channel.
 *
 * A link is one peer connection's set of lanes (one UC QP per lane in the
 * verbs implementation; an in-process simulator in the unit tests).  The
 * channel engine (tb_channel.h) holds all protocol state and calls these
 * operations to get buffers and post work; it never touches verbs.
 *
 * Buffers: every frame lives in a slot of a pre-registered pool owned by the
 * link.  A slot of lane L is exactly the lane's frame size.  A buffer handed
 * out by send_buf_get/recv_buf_get belongs to the channel until the channel
 * gives it back with send_buf_put/recv_buf_put, including while it is posted;
 * the channel gives back everything in tb_channel_destroy().
 *
 * Completions flow the other way: the caller's progress loop polls the link
 * (the CQ) and reports each completion with tb_channel_send_done() and
 * tb_channel_recv_done(), then calls tb_channel_progress().
 */
#ifndef TB_LINK_H
#define TB_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "tb_wire.h"

typedef struct tb_link tb_link_t;

typedef struct tb_link_ops {
    /* Fill the link's part of the local address blob (gid, qpn, mtu). */
    void (*local_addr)(tb_link_t *link, tb_wire_addr_t *addr);
    /* Make the lanes able to send to and receive from the peer described by
     * addr (verbs: QPs to RTR and RTS).  0 or a negative errno. */
    int (*connect)(tb_link_t *link, const tb_wire_addr_t *peer);
    /* A free slot of the lane's send pool, or NULL when the pool is empty. */
    void *(*send_buf_get)(tb_link_t *link, unsigned lane);
    void (*send_buf_put)(tb_link_t *link, unsigned lane, void *buf);
    /* A free slot of the lane's receive pool, or NULL when the pool is empty. */
    void *(*recv_buf_get)(tb_link_t *link, unsigned lane);
    void (*recv_buf_put)(tb_link_t *link, unsigned lane, void *buf);
    /* Post len bytes of buf (len <= the lane's frame size) as one send on the
     * lane.  The link reports its completion with tb_channel_send_done(...,
     * cookie, ...).  0 or a negative errno (the channel treats an error as
     * fatal for the connection). */
    int (*post_send)(tb_link_t *link, unsigned lane, void *buf, size_t len, void *cookie);
    /* Post buf as a receive on the lane; the link reports the frame that
     * lands in it with tb_channel_recv_done().  0 or a negative errno. */
    int (*post_recv)(tb_link_t *link, unsigned lane, void *buf);
} tb_link_ops_t;

/* Link implementations embed this as their first member. */
struct tb_link {
    const tb_link_ops_t *ops;
};

#endif /* TB_LINK_H */
