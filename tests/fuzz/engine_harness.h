/*
 * A host engine assembled in memory for tests and fuzzing: the real daemon
 * code (engine/daemon) with one device that has no queue pairs, a few ranks
 * whose rings are plain memory, and peer engines without a channel.  What a
 * rank writes is taken by tb_eng_rank_tx_progress, what a peer engine sends
 * is handed to tb_eng_peer_recv, and the invariants that bound the engine's
 * memory are checked by eh_check.
 */
#ifndef ENGINE_HARNESS_H
#define ENGINE_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "tb_engine_int.h"

#define EH_RANKS 3
/* The pid the harness gives rank vpid (as its socket would say). */
#define EH_PID(vpid) (1000u + (uint32_t) (vpid))
#define EH_RING (64u * 1024u)

typedef struct eng_harness {
    tb_engine_t *e;
    tb_device_t dev;
    tb_device_t dev2; /* a second device (eh_second_device) */
    void *seg[EH_RANKS];
    tb_shm_ring_t to_engine[EH_RANKS];   /* the ranks' side of their rings */
    tb_shm_ring_t from_engine[EH_RANKS];
    uint32_t last_pid; /* of the last record eh_rank_read counted */
    tb_wire_ehost_t relay_table[4]; /* a job's table of hosts, for tests of relaying */
    tb_wire_ehost_t ring_table[8];  /* a ring of four (eh_ring_table) */
} eng_harness_t;

/* An engine with default parameters and ranks of vpids 0..EH_RANKS-1
 * attached; 0 or -1. */
int eh_init(eng_harness_t *h);
void eh_fini(eng_harness_t *h);

/* Peer engine n over the device, connected as far as the engine knows. */
eng_peer_t *eh_peer(eng_harness_t *h, unsigned n);
/* The same over the engine's device dev. */
eng_peer_t *eh_peer_on(eng_harness_t *h, unsigned n, unsigned dev);

/* The job's table of hosts for a line of three, this engine - peer 1 -
 * peer 2 (this engine is host 0, peer 1 host 1, peer 2 host 2), in
 * h->relay_table; the harness's device gets its address on it. */
void eh_relay_table(eng_harness_t *h);

/* The job's table of hosts for a ring of four, this engine (host 0) - peer 1
 * - peer 2 - peer 3 - this engine, one cable per pair (10.0.1.0/30 to
 * 10.0.4.0/30 in that order), in h->ring_table: peer 1 on device 0, peer 3
 * on a second device the engine gains (eh_second_device); both devices get
 * their addresses on it. */
void eh_ring_table(eng_harness_t *h);

/* The engine gets a second device (fake1, its index 1), with no address yet. */
void eh_second_device(eng_harness_t *h);

/* The job's table of hosts for a line of three with this engine in the
 * middle: peer 1 (host 0) on its device 0, peer 2 (host 2) on a second
 * device it gains (h->dev2); this engine takes an id between theirs, as the
 * table is sorted by id.  Returns the peers in *first and *last. */
void eh_relay_middle(eng_harness_t *h, eng_peer_t **first, eng_peer_t **last);

/* Rank i writes a record (0, or -1 when its ring is full); a SEND names the
 * pid the harness gave its destination, or another one unless right_pid. */
int eh_rank_write(eng_harness_t *h, unsigned i, uint8_t type, uint8_t tag, uint16_t link,
                  uint32_t vpid, bool right_pid, const void *data, size_t len);

/* Rank i reads what the engine wrote it, at most max records: the number
 * read, and of those the number of type (if counted is not NULL). */
unsigned eh_rank_read(eng_harness_t *h, unsigned i, unsigned max, uint8_t type,
                      unsigned *counted);

/* One pass of the engine over its ranks and peers. */
void eh_progress(eng_harness_t *h);

/* NULL, or which bound on held memory is broken. */
const char *eh_check(const eng_harness_t *h);

#endif /* ENGINE_HARNESS_H */
