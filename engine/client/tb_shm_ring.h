/*
 * tbrdma host engine, client side: a single-producer, single-consumer ring of records
 * (tb_wire_erec_t and payload) in memory shared by two processes, a rank and
 * its host's engine.
 *
 * A record is read where it lies: its header's stamp, stored last, says it
 * is complete, so a small record costs the consumer one cache line and no
 * separate head.  A stamp is the record's position in the ring's stream plus
 * one, xor a nonce the ring's creator drew: stale bytes from an earlier lap,
 * a record's or a payload's, never pass for a new record by accident.
 *
 * Each side treats the other as untrusted: the consumer trusts a record's
 * header only after checking that it fits the ring, the producer the tail
 * only between the last tail seen and its head, so a corrupt or hostile
 * peer makes the ring report an error, never makes this side read or write
 * outside it.  A record never wraps: one that does not fit before the end
 * is preceded by a PAD record.
 *
 * The consumer may hand out several records before releasing them
 * (tb_shm_ring_next advances a private cursor; tb_shm_ring_release_to frees
 * everything up to a position), so it can keep records in place while they
 * are in use.
 *
 * The waiting flag is the consumer's: set before it sleeps, it asks the
 * producer for a doorbell after the next commit (tb_shm_ring_commit says
 * so).  That handshake costs the producer a full fence per commit; a ring
 * whose consumer never sleeps is told so (tb_shm_ring_consumer_spins) and
 * commits with a plain release store.
 */
#ifndef TB_SHM_RING_H
#define TB_SHM_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "tb_eproto.h"

/* The control block of both rings of a rank, at the start of its segment. */
#define TB_SHM_RING_CTRL 4096u
#define TB_SHM_RING_MIN (64u * 1024u)
#define TB_SHM_RING_MAX (256u * 1024u * 1024u)

typedef struct tb_shm_ring_ctrl {
    uint64_t nonce; /* written by the creator before sharing the segment */
    char pad0[56];
    _Atomic uint64_t tail; /* written by the consumer */
    char pad1[56];
    _Atomic uint32_t waiting; /* written by the consumer */
    char pad2[60];
} tb_shm_ring_ctrl_t;

typedef struct tb_shm_ring {
    tb_shm_ring_ctrl_t *ctrl;
    uint8_t *data;
    uint64_t size;    /* a power of two */
    uint64_t nonce;   /* read once at attach */
    uint64_t cursor;  /* consumer: the next record to read */
    uint64_t expect;  /* consumer: the stamp of a complete record at cursor */
    uint64_t head;    /* producer: the head being written */
    uint64_t tail;    /* producer: the last tail seen; consumer: released up to here */
    uint64_t pending; /* producer: bytes reserved and not committed (0: none) */
    bool fence;       /* producer: the consumer may sleep (a full fence per commit) */
    bool broken;      /* the other side broke the ring's rules */
} tb_shm_ring_t;

/* Bytes of one segment holding the control block and two rings of size. */
size_t tb_shm_ring_segment_size(uint64_t size);

/* true if size is usable (a power of two in [TB_SHM_RING_MIN, _MAX]). */
bool tb_shm_ring_size_ok(uint64_t size);

/* Ring index (0 or 1) of a segment at base (mapped for size); init resets
 * the control block and draws the nonce (the creator, before sharing it). */
void tb_shm_ring_attach(tb_shm_ring_t *r, void *base, uint64_t size, unsigned index, bool init);
/* Producer: this ring's consumer never sleeps (never sets waiting), so
 * commits need no full fence and never ask for a doorbell. */
void tb_shm_ring_consumer_spins(tb_shm_ring_t *r);

/* The largest payload of one record. */
static inline uint64_t tb_shm_ring_max_record(const tb_shm_ring_t *r)
{
    return r->size / 4 - sizeof(tb_wire_erec_t);
}

/* Producer: room for a record of len payload bytes, or NULL (ring full, len
 * too large, or the consumer broke the ring).  Fill the header's fields
 * other than len, and the payload, then commit.  One reservation at a time. */
tb_wire_erec_t *tb_shm_ring_reserve(tb_shm_ring_t *r, size_t len);
/* Publish the reserved record; true when the consumer asked for a doorbell. */
bool tb_shm_ring_commit(tb_shm_ring_t *r);
/* Forget the reservation. */
void tb_shm_ring_cancel(tb_shm_ring_t *r);
/* Reserve, fill and commit one record whose payload is iov's bytes: 1 when
 * the consumer asked for a doorbell, 0 when not, -1 when it does not fit
 * (r->broken says whether the ring is broken). */
int tb_shm_ring_put(tb_shm_ring_t *r, uint8_t type, uint8_t tag, uint16_t link, uint32_t vpid,
                    uint32_t pid, const struct iovec *iov, int iovcnt);
/* Producer: nothing written is still unconsumed. */
bool tb_shm_ring_drained(tb_shm_ring_t *r);

/* Consumer: the next record (a snapshot of its header in *hdr, its payload
 * at the returned pointer, its end position in *end), or NULL when there is
 * none or the ring is broken (r->broken).  PAD records are skipped. */
const void *tb_shm_ring_next(tb_shm_ring_t *r, tb_wire_erec_t *hdr, uint64_t *end);
/* Consumer: something (a record or a PAD) waits at the cursor.  One load of
 * its stamp, for loops over many rings that are mostly idle; the record is
 * checked, and ordered, by tb_shm_ring_next. */
static inline bool tb_shm_ring_ready(const tb_shm_ring_t *r)
{
    return atomic_load_explicit((_Atomic uint64_t *) (void *) (r->data + (r->cursor & (r->size - 1))),
                                memory_order_relaxed)
           == r->expect;
}
/* Consumer: step the cursor back to pos (a record's start) to read it again. */
void tb_shm_ring_rewind(tb_shm_ring_t *r, uint64_t pos);
/* Consumer: free everything before end (a position from tb_shm_ring_next). */
void tb_shm_ring_release_to(tb_shm_ring_t *r, uint64_t end);
/* Consumer: the producer's tail as this side last saw it, clamped (for the
 * producer side of an untrusted consumer: how far it has consumed). */
uint64_t tb_shm_ring_consumed(tb_shm_ring_t *r);
/* Consumer: true if records wait. */
bool tb_shm_ring_readable(tb_shm_ring_t *r);
void tb_shm_ring_set_waiting(tb_shm_ring_t *r, bool waiting);

#endif /* TB_SHM_RING_H */
