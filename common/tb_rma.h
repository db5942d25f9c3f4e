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

#include "tb_wire.h"

enum {
    TB_RMA_ACCESS_READ = 0x1,  /* peers may get from the region */
    TB_RMA_ACCESS_WRITE = 0x2, /* peers may put into the region */
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
    uint64_t rng; /* key generator state */
} tb_rma_table_t;

/* seed 0: seeded from the OS's random source and the clock. */
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

#endif /* TB_RMA_H */
