/*
 * Fuzz target: a ring in shared memory (tb_shm_ring.h) written by a hostile
 * peer.  As consumer (the engine reading a rank, or a rank reading the
 * engine): every record handed out must lie inside the ring, whatever the
 * peer put in the records and their stamps.  As producer: reservations must
 * stay inside the ring whatever the peer put in its tail.
 *
 * Input: the ring's nonce (8 bytes), the peer's tail (8 bytes), then the
 * ring's bytes (the rest zero).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "tb_shm_ring.h"

#define RING (64u * 1024u)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t *seg;
    tb_shm_ring_t r;
    uint64_t nonce, tail, end;
    tb_wire_erec_t h;
    const uint8_t *p;
    int n;

    if (size < 16) {
        return 0;
    }
    if (NULL == seg) {
        seg = aligned_alloc(4096, tb_shm_ring_segment_size(RING));
    }
    memcpy(&nonce, data, 8);
    memcpy(&tail, data + 8, 8);
    data += 16;
    size -= 16;
    memset(seg, 0, tb_shm_ring_segment_size(RING));
    memcpy(seg + TB_SHM_RING_CTRL, data, size < RING ? size : RING);

    ((tb_shm_ring_ctrl_t *) seg)->nonce = nonce;
    tb_shm_ring_attach(&r, seg, RING, 0, false);
    for (n = 0; n < 100000 && NULL != (p = tb_shm_ring_next(&r, &h, &end)); ++n) {
        if (p < seg + TB_SHM_RING_CTRL || p + h.len > seg + TB_SHM_RING_CTRL + RING) {
            abort();
        }
        tb_shm_ring_release_to(&r, end);
    }

    tb_shm_ring_attach(&r, seg, RING, 0, true);
    for (n = 0; n < 64; ++n) {
        size_t len = (size_t) (size ? data[n % size] : n) * 97u;
        tb_wire_erec_t *rec;
        if (n == 8) {
            atomic_store(&r.ctrl->tail, tail);
        }
        rec = tb_shm_ring_reserve(&r, len);
        if (NULL == rec) {
            continue;
        }
        if ((uint8_t *) rec < seg + TB_SHM_RING_CTRL
            || (uint8_t *) (rec + 1) + len > seg + TB_SHM_RING_CTRL + RING) {
            abort();
        }
        memset(rec + 1, 0xa5, len);
        (void) tb_shm_ring_commit(&r);
    }
    return 0;
}
