/*
 * Fuzz target: the RMA request and reply handlers (tb_rma.h).  A peer's
 * message is parsed with tb_rma_parse(); a PUT, GET_REQ or ATOMIC that
 * parses is checked with tb_rma_check() against a table of regions
 * registered on harness-owned buffers, and when the check passes the harness
 * does exactly what the BTL does (PUT: the payload into the region; GET: the
 * region into a reply buffer; ATOMIC: tb_rma_atomic on the region), so ASan
 * proves that a request that passes touches nothing outside a registered
 * region; the harness also checks the bounds, the access and the alignment
 * itself.
 *
 * Input: tag byte (low 3 bits; 0 and 7 are unknown tags), flags byte,
 * then the message.  R_SEAL fixes version and reserved fields; R_KEY makes
 * the key that of region (addr_lo & 7), R_REL makes addr relative to that
 * region's base, R_FIT makes a PUT's len its payload's.
 *
 * With bit 7 of the tag byte set, the input is instead a sequence of
 * register / deregister operations on a table (growth, deletion with
 * backward shift), checked against a model after every step.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "tb_rma.h"

enum {
    R_SEAL = 0x01,
    R_KEY = 0x02,
    R_REL = 0x04,
    R_FIT = 0x08,
};

#define MAX_LEN 65536u
#define NREG 6

/* Sizes and access of the regions; the last is registered, then freed and
 * deregistered: its key must be refused. */
static const struct {
    size_t len;
    uint32_t access;
} reg_spec[NREG] = {
    {1, TB_RMA_ACCESS_READ | TB_RMA_ACCESS_WRITE},
    {100, TB_RMA_ACCESS_READ},
    {4096, TB_RMA_ACCESS_WRITE},
    {5000, TB_RMA_ACCESS_READ | TB_RMA_ACCESS_WRITE | TB_RMA_ACCESS_ATOMIC},
    {MAX_LEN + 10, TB_RMA_ACCESS_READ | TB_RMA_ACCESS_WRITE | TB_RMA_ACCESS_ATOMIC},
    {64, TB_RMA_ACCESS_READ | TB_RMA_ACCESS_WRITE},
};

static uint8_t scratch[MAX_LEN];

#define MODEL_MAX 80 /* the table grows past 32 regions */

/* Table operations: each byte registers (bit 0 clear: length and access
 * from the byte) or deregisters (bit 0 set: the live region byte>>1 modulo
 * their number, or a dead key); every live region must then be found with
 * its bounds and access, and every dead key refused. */
static void table_ops(const uint8_t *data, size_t size)
{
    static struct {
        uint64_t key, base, len;
        uint32_t access;
        int live;
    } model[MODEL_MAX];
    tb_rma_table_t t;
    unsigned n = 0;

    FUZZ_ASSERT(tb_rma_table_init(&t, 7) == 0, "table init failed");
    for (size_t i = 0; i < size && i < 4 * MODEL_MAX && n < MODEL_MAX; i++) {
        uint8_t b = data[i];
        if (!(b & 1)) {
            uint64_t key;
            uint64_t base = 0x100000ull * (n + 1) + (b >> 3);
            uint64_t len = (uint64_t) (b >> 1) * 33 + 1;
            uint32_t access = 1 + (b >> 1) % 3;
            FUZZ_ASSERT(tb_rma_register(&t, (void *) (uintptr_t) base, len, access, &key) == 0,
                        "register failed");
            for (unsigned k = 0; k < n; k++) {
                FUZZ_ASSERT(!model[k].live || model[k].key != key, "a key handed out twice");
            }
            model[n].key = key;
            model[n].base = base;
            model[n].len = len;
            model[n].access = access;
            model[n].live = 1;
            n++;
        } else if (n > 0) {
            unsigned k = (unsigned) (b >> 1) % n;
            FUZZ_ASSERT(tb_rma_deregister(&t, model[k].key) == (model[k].live ? 0 : -1),
                        "deregister of a %s key", model[k].live ? "live" : "dead");
            model[k].live = 0;
        }
        for (unsigned k = 0; k < n; k++) {
            void *local;
            tb_rma_status_t st = tb_rma_check(&t, model[k].key, model[k].base, model[k].len,
                                              model[k].access, &local);
            if (model[k].live) {
                FUZZ_ASSERT(st == TB_RMA_OK && (uintptr_t) local == model[k].base,
                            "a live region not found (%d)", st);
                FUZZ_ASSERT(tb_rma_check(&t, model[k].key, model[k].base, model[k].len + 1,
                                         model[k].access, &local) == TB_RMA_ERANGE,
                            "a request one byte too long passed");
            } else {
                FUZZ_ASSERT(st == TB_RMA_ENOKEY, "a dead key answered %d", st);
            }
        }
    }
    {
        size_t live = 0;
        for (unsigned k = 0; k < n; k++) {
            live += model[k].live;
        }
        FUZZ_ASSERT(t.count == live, "the table counts %zu regions, %zu live", t.count, live);
    }
    tb_rma_table_fini(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int init;
    tb_rma_table_t t;
    uint8_t *bufs[NREG];
    uint64_t keys[NREG];
    tb_rma_msg_t m;
    uint8_t tag, flags, *msg;
    size_t len;
    tb_rma_status_t st;

    if (!init) {
        fuzz_quiet();
        init = 1;
    }
    if (size < 2) {
        return 0;
    }
    if (data[0] & 0x80) {
        table_ops(data + 1, size - 1);
        return 0;
    }
    tag = data[0] & 7;
    flags = data[1];
    data += 2;
    size -= 2;

    FUZZ_ASSERT(tb_rma_table_init(&t, 42) == 0, "table init failed");
    for (unsigned i = 0; i < NREG; i++) {
        bufs[i] = malloc(reg_spec[i].len);
        FUZZ_ASSERT(bufs[i], "out of memory");
        memset(bufs[i], (int) i, reg_spec[i].len);
        FUZZ_ASSERT(tb_rma_register(&t, bufs[i], reg_spec[i].len, reg_spec[i].access, &keys[i])
                        == 0,
                    "register failed");
    }
    FUZZ_ASSERT(tb_rma_deregister(&t, keys[NREG - 1]) == 0, "deregister failed");
    FUZZ_ASSERT(tb_rma_deregister(&t, keys[NREG - 1]) != 0, "deregistered twice");
    free(bufs[NREG - 1]);
    bufs[NREG - 1] = NULL;

    /* The message in a heap block of its exact size. */
    len = size;
    msg = malloc(len ? len : 1);
    FUZZ_ASSERT(msg, "out of memory");
    memcpy(msg, data, len);
    if (len >= TB_WIRE_RMA_HDR_SIZE) {
        tb_wire_rma_hdr_t h;
        memcpy(&h, msg, sizeof(h));
        if (flags & R_SEAL) {
            h.version = TB_WIRE_RMA_VERSION;
            h.reserved = 0;
            h.reserved2 = 0;
        }
        if (flags & (R_KEY | R_REL)) {
            unsigned r = (unsigned) (tb_wire_le64(h.addr) & 0xff) % NREG;
            if (flags & R_KEY) {
                h.key = tb_wire_le64(keys[r]);
            }
            if (flags & R_REL) {
                uintptr_t base = r < NREG - 1 ? (uintptr_t) bufs[r] : 0x1000;
                h.addr = tb_wire_le64((uint64_t) base + (tb_wire_le64(h.addr) >> 8));
            }
        }
        if (flags & R_FIT) {
            h.len = tb_wire_le64(len - sizeof(h));
        }
        memcpy(msg, &h, sizeof(h));
    }

    st = tb_rma_parse(tag, msg, len, MAX_LEN, &m);
    if (st == TB_RMA_OK) {
        const volatile uint8_t *p = m.payload;
        FUZZ_ASSERT(m.tag == tag && m.len <= MAX_LEN, "parse passed len %llu",
                    (unsigned long long) m.len);
        FUZZ_ASSERT((const uint8_t *) m.payload >= msg
                        && m.payload_len <= len
                        && (const uint8_t *) m.payload + m.payload_len == msg + len,
                    "the payload is not the message's tail");
        for (size_t i = 0; i < m.payload_len; i++) {
            (void) p[i];
        }
        if (tag == TB_TAG_RMA_PUT || tag == TB_TAG_RMA_GET_REQ || tag == TB_TAG_RMA_ATOMIC) {
            uint32_t access = tag == TB_TAG_RMA_PUT      ? TB_RMA_ACCESS_WRITE
                              : tag == TB_TAG_RMA_GET_REQ ? TB_RMA_ACCESS_READ
                                                          : TB_RMA_ACCESS_ATOMIC;
            void *local = (void *) 1;
            tb_rma_status_t cs = tb_rma_check(&t, m.key, m.addr, m.len, access, &local);
            FUZZ_ASSERT(cs <= TB_RMA_STATUS_MAX && (cs == TB_RMA_OK) == (local != NULL),
                        "check returned %d with local %p", cs, local);
            (void) tb_rma_status_string(cs);
            if (cs == TB_RMA_OK) {
                unsigned r;
                for (r = 0; r < NREG - 1; r++) {
                    if (m.key == keys[r]) {
                        break;
                    }
                }
                FUZZ_ASSERT(r < NREG - 1, "a request with an unknown key passed");
                FUZZ_ASSERT((reg_spec[r].access & access) == access,
                            "a request passed without the access");
                FUZZ_ASSERT((uint8_t *) local >= bufs[r]
                                && (uint8_t *) local + m.len <= bufs[r] + reg_spec[r].len,
                            "a request passed outside its region");
                if (tag == TB_TAG_RMA_PUT) {
                    FUZZ_ASSERT(m.payload_len == m.len, "a PUT passed without its data");
                    memcpy(local, m.payload, m.len);
                } else if (tag == TB_TAG_RMA_ATOMIC) {
                    uint64_t old;
                    tb_rma_status_t as = tb_rma_atomic(local, (unsigned) m.len, m.aop,
                                                       m.operand, m.compare, &old);
                    FUZZ_ASSERT((as == TB_RMA_EALIGN) == (0 != (uintptr_t) local % m.len),
                                "atomic at %p, width %llu: %d", local,
                                (unsigned long long) m.len, as);
                    FUZZ_ASSERT(m.aop >= TB_RMA_AOP_ADD && m.aop <= TB_RMA_AOP_LAST,
                                "atomic op %u passed", m.aop);
                } else {
                    memcpy(scratch, local, m.len);
                }
            }
        }
    } else {
        FUZZ_ASSERT(st == TB_RMA_EPROTO, "parse failed with %d", st);
    }

    tb_rma_table_fini(&t);
    for (unsigned i = 0; i < NREG; i++) {
        free(bufs[i]);
    }
    free(msg);
    return 0;
}
