/*
 * A deterministic in-process link pair for testing the reliable channel.
 *
 * Two sides, each a tb_link_t, joined by a simulated wire with a virtual
 * clock and a seeded PRNG: loss, duplication, corruption (one bit flip),
 * delay and reordering per frame.  Receives behave like UC queue pairs: a
 * frame that arrives when no receive is posted on its lane is dropped
 * silently, and one whose 4 KiB frame count differs from the posted
 * receive's is counted as a frame-rule violation (the engine must never
 * cause one).  A side can be declared dead (its channel is no longer
 * polled or progressed; the wire still fills its posted receives).
 */
#ifndef TB_LOSSY_LINK_H
#define TB_LOSSY_LINK_H

#include <stdint.h>

#include "tb_channel.h"
#include "tb_link.h"

typedef struct tb_lossy_cfg {
    uint64_t seed;
    double loss;       /* probability a frame vanishes */
    double lane_loss[TB_WIRE_MAX_LANES]; /* and, besides, a frame of that lane */
    double dup;        /* probability a frame arrives twice */
    double corrupt;    /* probability one bit of a frame flips */
    double reorder;    /* probability a frame is held back by reorder_ns */
    uint64_t delay_ns; /* one-way delay */
    uint64_t reorder_ns;
    unsigned nlanes;
    uint32_t frame_size[TB_WIRE_MAX_LANES];
    unsigned send_slots[TB_WIRE_MAX_LANES]; /* per side */
    unsigned recv_slots[TB_WIRE_MAX_LANES]; /* per side */
    unsigned poll_budget;                   /* completions per side per step */
} tb_lossy_cfg_t;

typedef struct tb_lossy_stats {
    uint64_t posted;
    uint64_t lost;
    uint64_t duplicated;
    uint64_t corrupted;
    uint64_t reordered;
    uint64_t delivered;
    uint64_t no_recv_drops;   /* arrived with no receive posted (UC: silent loss) */
    uint64_t frame_mismatch;  /* frame-count rule violations: must stay 0 */
    uint64_t bad_posts;       /* posts longer than a slot: must stay 0 */
    uint64_t bad_puts;        /* buffers given back that are NULL, not of the pool or
                               * already free (ignored): must stay 0 */
} tb_lossy_stats_t;

typedef struct tb_lossy_net tb_lossy_net_t;

/* Fills cfg with a perfect wire matching tb_channel_params_default(). */
void tb_lossy_cfg_default(tb_lossy_cfg_t *cfg);

tb_lossy_net_t *tb_lossy_net_create(const tb_lossy_cfg_t *cfg);
void tb_lossy_net_destroy(tb_lossy_net_t *net);

/* Change the wire's behaviour (e.g. loss) from now on. */
void tb_lossy_set_cfg(tb_lossy_net_t *net, const tb_lossy_cfg_t *cfg);

tb_link_t *tb_lossy_link(tb_lossy_net_t *net, int side);
void tb_lossy_attach(tb_lossy_net_t *net, int side, tb_channel_t *ch);
void tb_lossy_set_dead(tb_lossy_net_t *net, int side, int dead);

/* The next send side posts completes with an error status and never reaches
 * the wire (as a work request failed by the device). */
void tb_lossy_fail_next_send(tb_lossy_net_t *net, int side);

/* Forget a side's posted receives and pending completions, as destroying
 * its QPs would (call before destroying its channel). */
void tb_lossy_reset_side(tb_lossy_net_t *net, int side);

/* Advance the clock to now: deliver due frames, report completions to the
 * live sides' channels (bounded) and progress them. */
void tb_lossy_step(tb_lossy_net_t *net, uint64_t now);

/* 1 when no frame is on the wire and no completion waits to be reported. */
int tb_lossy_idle(const tb_lossy_net_t *net);

/* Slots of a side currently outside its pools (held by its channel). */
unsigned tb_lossy_slots_out(const tb_lossy_net_t *net, int side);

const tb_lossy_stats_t *tb_lossy_stats(const tb_lossy_net_t *net);

/* Raw injection: deliver len bytes as a frame arriving at side on lane. */
void tb_lossy_inject(tb_lossy_net_t *net, int side, unsigned lane, const void *data,
                     size_t len);

#endif /* TB_LOSSY_LINK_H */
