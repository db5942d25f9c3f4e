/*
 * tbrdma host engine, client side: records in shared memory (see tb_shm_ring.h).
 */
#include "tb_shm_ring.h"

#include <string.h>
#include <time.h>

#include "tb_random.h"

#define REC_HDR sizeof(tb_wire_erec_t)

static uint64_t rec_bytes(uint64_t len)
{
    return (REC_HDR + len + TB_WIRE_EREC_ALIGN - 1) & ~(uint64_t) (TB_WIRE_EREC_ALIGN - 1);
}

/* The stamp word of the record at stream position pos. */
static _Atomic uint64_t *stamp_at(const tb_shm_ring_t *r, uint64_t pos)
{
    return (_Atomic uint64_t *) (void *) (r->data + (pos & (r->size - 1)));
}

static uint64_t stamp_of(const tb_shm_ring_t *r, uint64_t pos)
{
    return tb_wire_le64((pos + 1) ^ r->nonce);
}

static void set_cursor(tb_shm_ring_t *r, uint64_t pos)
{
    r->cursor = pos;
    r->expect = stamp_of(r, pos);
}

bool tb_shm_ring_size_ok(uint64_t size)
{
    return size >= TB_SHM_RING_MIN && size <= TB_SHM_RING_MAX && 0 == (size & (size - 1));
}

size_t tb_shm_ring_segment_size(uint64_t size)
{
    return TB_SHM_RING_CTRL + 2 * (size_t) size;
}

void tb_shm_ring_attach(tb_shm_ring_t *r, void *base, uint64_t size, unsigned index, bool init)
{
    _Static_assert(2 * sizeof(tb_shm_ring_ctrl_t) <= TB_SHM_RING_CTRL, "ring control blocks");
    _Static_assert(0 == TB_WIRE_EREC_ALIGN % sizeof(uint64_t), "stamps are aligned");
    _Static_assert(REC_HDR <= TB_WIRE_EREC_ALIGN, "a PAD fits wherever a record may start");
    memset(r, 0, sizeof(*r));
    r->ctrl = (tb_shm_ring_ctrl_t *) base + index;
    r->data = (uint8_t *) base + TB_SHM_RING_CTRL + (size_t) index * size;
    r->size = size;
    r->fence = true;
    if (init) {
        uint64_t nonce;
        if (0 != tb_random_bytes(&nonce, sizeof(nonce))) {
            /* Only accidental matches matter, and this differs per ring. */
            nonce = (uint64_t) (uintptr_t) r->data ^ ((uint64_t) time(NULL) << 32)
                    ^ 0x9e3779b97f4a7c15ull;
        }
        r->ctrl->nonce = nonce;
        atomic_store(&r->ctrl->tail, 0);
        atomic_store(&r->ctrl->waiting, 0);
    }
    r->nonce = r->ctrl->nonce;
    set_cursor(r, 0);
}

void tb_shm_ring_consumer_spins(tb_shm_ring_t *r)
{
    r->fence = false;
}

/* The consumer's tail, trusted only between the last tail seen and head. */
static bool refresh_tail(tb_shm_ring_t *r)
{
    uint64_t t = atomic_load_explicit(&r->ctrl->tail, memory_order_acquire);

    if (t - r->tail > r->head - r->tail) {
        r->broken = true;
        return false;
    }
    r->tail = t;
    return true;
}

tb_wire_erec_t *tb_shm_ring_reserve(tb_shm_ring_t *r, size_t len)
{
    uint64_t need = rec_bytes(len), off, room_to_end, pad = 0;
    tb_wire_erec_t *rec;

    if (r->broken || len > tb_shm_ring_max_record(r)) {
        return NULL;
    }
    off = r->head & (r->size - 1);
    room_to_end = r->size - off;
    if (need > room_to_end) {
        pad = room_to_end;
    }
    if (r->head + pad + need - r->tail > r->size) {
        if (!refresh_tail(r) || r->head + pad + need - r->tail > r->size) {
            return NULL;
        }
    }
    if (pad) {
        /* Complete at once: the consumer may skip to the start meanwhile. */
        rec = (tb_wire_erec_t *) (r->data + off);
        memset((uint8_t *) rec + sizeof(rec->stamp), 0, REC_HDR - sizeof(rec->stamp));
        rec->len = tb_wire_le32((uint32_t) (pad - REC_HDR));
        rec->type = TB_EREC_PAD;
        atomic_store_explicit(stamp_at(r, r->head), stamp_of(r, r->head), memory_order_release);
        r->head += pad;
        off = 0;
    }
    /* The stamp is left as it is (stale) until the commit. */
    rec = (tb_wire_erec_t *) (r->data + off);
    memset((uint8_t *) rec + sizeof(rec->stamp), 0, REC_HDR - sizeof(rec->stamp));
    rec->len = tb_wire_le32((uint32_t) len);
    r->pending = need;
    return rec;
}

int tb_shm_ring_put(tb_shm_ring_t *r, uint8_t type, uint8_t tag, uint16_t link, uint32_t vpid,
                    uint32_t pid, const struct iovec *iov, int iovcnt)
{
    tb_wire_erec_t *rec;
    uint8_t *dst;
    size_t len = 0;

    for (int i = 0; i < iovcnt; ++i) {
        len += iov[i].iov_len;
    }
    rec = tb_shm_ring_reserve(r, len);
    if (NULL == rec) {
        return -1;
    }
    rec->type = type;
    rec->tag = tag;
    rec->link = tb_wire_le16(link);
    rec->vpid = tb_wire_le32(vpid);
    rec->pid = tb_wire_le32(pid);
    dst = (uint8_t *) (rec + 1);
    for (int i = 0; i < iovcnt; ++i) {
        if (iov[i].iov_len) {
            memcpy(dst, iov[i].iov_base, iov[i].iov_len);
            dst += iov[i].iov_len;
        }
    }
    return tb_shm_ring_commit(r) ? 1 : 0;
}

bool tb_shm_ring_commit(tb_shm_ring_t *r)
{
    uint64_t pos = r->head;

    /* A reservation is never empty: its header alone takes bytes. */
    if (0 == r->pending) {
        return false;
    }
    r->head += r->pending;
    r->pending = 0;
    /* seq_cst where the consumer may sleep: the stamp before the load of
     * waiting (Dekker with a consumer that sets waiting and then looks at
     * the stamp before it sleeps). */
    atomic_store_explicit(stamp_at(r, pos), stamp_of(r, pos),
                          r->fence ? memory_order_seq_cst : memory_order_release);
    return r->fence && 0 != atomic_load_explicit(&r->ctrl->waiting, memory_order_seq_cst);
}

void tb_shm_ring_cancel(tb_shm_ring_t *r)
{
    /* A PAD already written stays: it is complete, and head is past it. */
    r->pending = 0;
}

bool tb_shm_ring_drained(tb_shm_ring_t *r)
{
    return refresh_tail(r) && r->tail == r->head;
}

bool tb_shm_ring_readable(tb_shm_ring_t *r)
{
    /* seq_cst: after the consumer's store of waiting, this load must not be
     * satisfied early (Dekker with the producer's commit). */
    return !r->broken
           && atomic_load_explicit(stamp_at(r, r->cursor), memory_order_seq_cst) == r->expect;
}

void tb_shm_ring_set_waiting(tb_shm_ring_t *r, bool waiting)
{
    atomic_store_explicit(&r->ctrl->waiting, waiting ? 1u : 0u, memory_order_seq_cst);
}

const void *tb_shm_ring_next(tb_shm_ring_t *r, tb_wire_erec_t *hdr, uint64_t *end)
{
    for (;;) {
        uint64_t off, total;

        if (r->broken) {
            return NULL;
        }
        if (atomic_load_explicit(stamp_at(r, r->cursor), memory_order_acquire) != r->expect) {
            return NULL;
        }
        off = r->cursor & (r->size - 1);
        /* One read of the header: the producer cannot change what is checked. */
        memcpy(hdr, r->data + off, REC_HDR);
        hdr->len = tb_wire_le32(hdr->len);
        total = rec_bytes(hdr->len);
        /* It fits before the ring's end, and does not reach records this
         * side has not released (a quarter ring at most, or a PAD). */
        if (total > r->size - off
            || (TB_EREC_PAD != hdr->type && hdr->len > tb_shm_ring_max_record(r))
            || r->cursor + total - r->tail > r->size) {
            r->broken = true;
            return NULL;
        }
        set_cursor(r, r->cursor + total);
        if (TB_EREC_PAD == hdr->type) {
            if (off + total != r->size) {
                r->broken = true;
                return NULL;
            }
            if (r->tail == r->cursor - total) {
                tb_shm_ring_release_to(r, r->cursor);
            }
            continue;
        }
        hdr->vpid = tb_wire_le32(hdr->vpid);
        hdr->pid = tb_wire_le32(hdr->pid);
        hdr->link = tb_wire_le16(hdr->link);
        *end = r->cursor;
        return r->data + off + REC_HDR;
    }
}

void tb_shm_ring_rewind(tb_shm_ring_t *r, uint64_t pos)
{
    set_cursor(r, pos);
}

void tb_shm_ring_release_to(tb_shm_ring_t *r, uint64_t end)
{
    if (end - r->tail <= r->cursor - r->tail) {
        r->tail = end;
        atomic_store_explicit(&r->ctrl->tail, end, memory_order_release);
    }
}

uint64_t tb_shm_ring_consumed(tb_shm_ring_t *r)
{
    (void) refresh_tail(r);
    return r->tail;
}
