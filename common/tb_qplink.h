/*
 * tbrdma common layer: the verbs link under a reliable channel.
 *
 * One UC queue pair per lane, on a protection domain and a completion queue
 * the caller owns (tb_domain: shared by every connection of a device).  All
 * frame slots of the link (every lane's send and receive slots) are carved
 * from one page-aligned chunk with a single memory registration, so a
 * connection costs one MR whatever its depth and frame sizes.
 *
 * Work request ids: the caller gives a 32-bit tag (its connection slot and
 * generation); wr_id = tag << 32 | slot index.  tb_qplink_tag_of() recovers
 * the tag from a completion, so the caller can tell which connection it
 * belongs to, and whether that connection still exists, before touching it.
 */
#ifndef TB_QPLINK_H
#define TB_QPLINK_H

#include <stddef.h>
#include <stdint.h>

#include "tb_channel.h"
#include "tb_device.h"
#include "tb_link.h"
#include "tb_verbs.h"

/* Control frames tb_channel.c may have posted at once on lane 0 (its
 * CTRL_FRAMES): lane 0 gets this many send slots beyond its window. */
#define TB_QPLINK_CTRL_SLOTS 8u

typedef struct tb_qplink tb_qplink_t;

typedef struct tb_qplink_cfg {
    tb_verbs_t *verbs;
    const tb_device_t *device;
    struct ibv_pd *pd;
    struct ibv_cq *cq;       /* send and receive completions of every lane */
    uint32_t max_mtu;        /* cap on the path MTU in bytes (0: 4096) */
    uint32_t wr_tag;         /* high half of every wr_id */
} tb_qplink_cfg_t;

/* Send work requests one lane's QP may have outstanding under params. */
unsigned tb_qplink_send_slots(const tb_channel_params_t *params, unsigned lane);

/* Create the QPs (state RESET) and the registered chunk sized for params.
 * 0, or a negative errno with the failing call, its error and what to do
 * logged. */
int tb_qplink_create(const tb_qplink_cfg_t *cfg, const tb_channel_params_t *params,
                     tb_qplink_t **out);

/* Destroy the QPs (straight from their current state: never through ERR),
 * then deregister and free the chunk.  The channel must already have given
 * back every slot, i.e. been destroyed after tb_qplink_destroy_qps(). */
void tb_qplink_destroy_qps(tb_qplink_t *ql);
void tb_qplink_destroy(tb_qplink_t *ql);

tb_link_t *tb_qplink_link(tb_qplink_t *ql);

/* The connection tag carried by a completion's wr_id. */
static inline uint32_t tb_qplink_tag_of(uint64_t wr_id)
{
    return (uint32_t) (wr_id >> 32);
}

/* Report one completion of this link to its channel. */
void tb_qplink_dispatch(tb_qplink_t *ql, tb_channel_t *ch, const struct ibv_wc *wc);

#endif /* TB_QPLINK_H */
