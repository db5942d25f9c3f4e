/*
 * tbrdma common layer: memory this process exposes to its peers' put/get.
 *
 * Apple's RDMA has no RDMA WRITE/READ, so a peer's put or get is a request
 * message that this process serves by copying (tb_wire.h, RMA section).  The
 * table is the only authority on what a request may touch: a region is
 * found by its unguessable 64-bit key and the request must lie entirely
 * inside it with the right access, or nothing is read or written.
 */
#ifndef TB_RMA_H
#define TB_RMA_H

#include <stddef.h>
#include <stdint.h>

#include "tb_sha256.h"
#include "tb_wire.h"

enum {
    TB_RMA_ACCESS_READ = 0x1,  /* peers may get from the region */
    TB_RMA_ACCESS_WRITE = 0x2, /* peers may put into the region */
    TB_RMA_ACCESS_ATOMIC = 0x4, /* peers may run atomics on the region */
};

typedef struct tb_rma_region {
    uint64_t key; /* 0: free slot */
    uint64_t base;
    uint64_t len;
    uint32_t access;
} tb_rma_region_t;

typedef struct tb_rma_table {
    tb_rma_region_t *slots; /* open addressing, capacity a power of two */
    size_t capacity;
    size_t count;
    /* Keys are HMAC-SHA256(secret, counter): unpredictable from any number of
     * keys seen, where a mix of a counter (splitmix64, say) can be inverted. */
    uint8_t secret[TB_SHA256_SIZE];
    uint64_t counter;
} tb_rma_table_t;

/* seed 0: a secret from the OS's random source (fails without one); any
 * other seed: a fixed secret derived from it, for tests.  0 or -1. */
int tb_rma_table_init(tb_rma_table_t *t, uint64_t seed);
void tb_rma_table_fini(tb_rma_table_t *t);

/* Expose [base, base+len) with the given access; *key receives its key.
 * Returns 0, or -1 when out of memory or len is 0. */
int tb_rma_register(tb_rma_table_t *t, const void *base, size_t len, uint32_t access,
                    uint64_t *key);

/* Stop exposing the region; 0, or -1 if no region has that key. */
int tb_rma_deregister(tb_rma_table_t *t, uint64_t key);

/* Check a peer's request.  TB_RMA_OK with *local set to the bytes to read or
 * write, or the status to answer with. */
tb_rma_status_t tb_rma_check(const tb_rma_table_t *t, uint64_t key, uint64_t addr, uint64_t len,
                             uint32_t access, void **local);

const char *tb_rma_status_string(int status);

/* Run an atomic on local (width 4 or 8 bytes) with the CPU's atomic
 * instructions, so it is atomic with this host's own atomics on the same
 * memory; *old receives the value before.  TB_RMA_OK, or TB_RMA_EALIGN when
 * local is not a multiple of width (nothing is touched). */
tb_rma_status_t tb_rma_atomic(void *local, unsigned width, unsigned op, uint64_t operand,
                              uint64_t compare, uint64_t *old);

/* A peer's RMA message, parsed: header fields in host order, the payload
 * (PUT data, GET_RESP data, ATOMIC_RESP's old value) after the header. */
typedef struct tb_rma_msg {
    uint8_t tag;
    uint8_t status;
    uint64_t req_id;
    uint64_t key;
    uint64_t addr;
    uint64_t len;
    const void *payload;
    size_t payload_len;
    /* ATOMIC only */
    uint8_t aop;
    uint64_t operand;
    uint64_t compare;
} tb_rma_msg_t;

/* Parse the RMA message data[0..len) that arrived with tag.  Every field is
 * checked: version, reserved zero, tag known, len at most max_len, and the
 * payload as long as the header says (PUT: len bytes; GET_RESP: len bytes,
 * none if refused; GET_REQ and PUT_ACK: none; ATOMIC: len 4 or 8, a known
 * operation, compare zero unless CSWAP; ATOMIC_RESP: len 4 or 8, 8 bytes,
 * none if refused).  TB_RMA_OK, or TB_RMA_EPROTO with *m unusable. */
tb_rma_status_t tb_rma_parse(uint8_t tag, const void *data, size_t len, uint64_t max_len,
                             tb_rma_msg_t *m);

/* The same from the first head_len bytes of a message of msg_len bytes whose
 * payload goes elsewhere (placed by the channel): m->payload stays NULL. */
tb_rma_status_t tb_rma_parse_head(uint8_t tag, const void *head, size_t head_len,
                                  size_t msg_len, uint64_t max_len, tb_rma_msg_t *m);

/* 1 for a peer's put, get or atomic request (served by the target), 0 for
 * an answer or anything else. */
static inline int tb_rma_is_request(uint8_t tag)
{
    return TB_TAG_RMA_PUT == tag || TB_TAG_RMA_GET_REQ == tag || TB_TAG_RMA_ATOMIC == tag;
}

/* The requester's deadline for answers (the direct path).  Answers come in
 * the order of the requests, each behind whatever the peer sends before it,
 * so the time they take is not bounded on a slow or lossy link.  What is
 * bounded is the time without progress toward the oldest answer: they are
 * overdue when, for timeout_ns, no answer came (waiting_since: the latest
 * answer, or the first request after none waited) and the channel to the
 * peer moved nothing (channel_progress: tb_channel_progress_ns, our requests
 * acknowledged or data arriving).  So a correct peer on any link that keeps
 * delivering never trips it, and a peer that acknowledges requests but never
 * answers trips it timeout_ns after its last progress.  Stamps later than
 * now (a request started from a callback) count as now. */
static inline int tb_rma_answers_overdue(uint64_t now, uint64_t waiting_since,
                                         uint64_t channel_progress, uint64_t timeout_ns)
{
    uint64_t since = (int64_t) (channel_progress - waiting_since) > 0 ? channel_progress
                                                                       : waiting_since;
    return (int64_t) (now - since) >= (int64_t) timeout_ns;
}

#endif /* TB_RMA_H */
