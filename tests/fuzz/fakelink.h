/*
 * An in-memory link for the channel fuzz targets: slot pools of the lane
 * frame sizes, receives kept in a FIFO per lane until the harness fills one,
 * sends recorded until the harness completes them.  Every call the channel
 * makes is checked against the rules of tb_link.h (a violation aborts).
 */
#ifndef TB_FUZZ_FAKELINK_H
#define TB_FUZZ_FAKELINK_H

#include <stddef.h>
#include <stdint.h>

#include "tb_channel.h"
#include "tb_link.h"

typedef struct fuzz_link fuzz_link_t;

fuzz_link_t *fuzz_link_create(unsigned nlanes, const uint32_t *frame_size,
                              const unsigned *send_slots, const unsigned *recv_slots);
/* Every slot must be back in its pool (after tb_channel_destroy). */
void fuzz_link_destroy(fuzz_link_t *fl);
tb_link_t *fuzz_link_base(fuzz_link_t *fl);

/* The oldest posted receive of lane, taken off the FIFO, or NULL. */
void *fuzz_link_take_recv(fuzz_link_t *fl, unsigned lane);
unsigned fuzz_link_posted_recvs(const fuzz_link_t *fl, unsigned lane);

/* Report every recorded send's completion to ch (status 0). */
void fuzz_link_complete_sends(fuzz_link_t *fl, tb_channel_t *ch);
/* Forget recorded sends and posted receives, as destroying QPs would. */
void fuzz_link_reset(fuzz_link_t *fl);

/* When non-zero, post_send / post_recv (or connect) fail with this
 * (negative errno). */
void fuzz_link_fail_posts(fuzz_link_t *fl, int rc);
void fuzz_link_fail_connect(fuzz_link_t *fl, int rc);

#endif /* TB_FUZZ_FAKELINK_H */
