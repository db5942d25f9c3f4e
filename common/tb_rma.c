/*
 * tbrdma common layer: memory this process exposes to its peers' put/get.
 */
#include "tb_rma.h"
#include "tb_random.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define TB_RMA_MIN_CAPACITY 64

/* A key no peer can guess from the keys it has seen: a PRF of a counter
 * under this process's secret.  Never 0 (a free slot). */
static uint64_t next_key(tb_rma_table_t *t)
{
    uint8_t mac[TB_SHA256_SIZE];
    uint64_t z;

    do {
        tb_hmac_t h;
        uint8_t ctr[8];
        uint64_t c = t->counter++;
        for (unsigned i = 0; i < 8; i++) {
            ctr[i] = (uint8_t) (c >> (8 * i));
        }
        tb_hmac_init(&h, t->secret, sizeof(t->secret));
        tb_hmac_update(&h, ctr, sizeof(ctr));
        tb_hmac_final(&h, mac);
        memcpy(&z, mac, sizeof(z));
    } while (0 == z);
    return z;
}

static size_t slot_of(const tb_rma_table_t *t, uint64_t key)
{
    return (size_t) (key * 0x9e3779b97f4a7c15ull >> 7) & (t->capacity - 1);
}

int tb_rma_table_init(tb_rma_table_t *t, uint64_t seed)
{
    memset(t, 0, sizeof(*t));
    t->capacity = TB_RMA_MIN_CAPACITY;
    t->slots = calloc(t->capacity, sizeof(*t->slots));
    if (NULL == t->slots) {
        return -1;
    }
    if (seed) {
        tb_sha256_t s;
        tb_sha256_init(&s);
        tb_sha256_update(&s, &seed, sizeof(seed));
        tb_sha256_final(&s, t->secret);
    } else if (tb_random_bytes(t->secret, sizeof(t->secret)) != 0) {
        free(t->slots);
        t->slots = NULL;
        return -1;
    }
    return 0;
}

void tb_rma_table_fini(tb_rma_table_t *t)
{
    free(t->slots);
    memset(t, 0, sizeof(*t));
}

static void insert(tb_rma_table_t *t, const tb_rma_region_t *r)
{
    size_t i = slot_of(t, r->key);

    while (t->slots[i].key) {
        i = (i + 1) & (t->capacity - 1);
    }
    t->slots[i] = *r;
}

/* Keep the load at most one half so probes stay short. */
static int grow(tb_rma_table_t *t)
{
    tb_rma_region_t *old = t->slots;
    size_t old_cap = t->capacity, i;

    t->slots = calloc(old_cap * 2, sizeof(*t->slots));
    if (NULL == t->slots) {
        t->slots = old;
        return -1;
    }
    t->capacity = old_cap * 2;
    for (i = 0; i < old_cap; ++i) {
        if (old[i].key) {
            insert(t, &old[i]);
        }
    }
    free(old);
    return 0;
}

static tb_rma_region_t *find(const tb_rma_table_t *t, uint64_t key)
{
    size_t i;

    if (0 == key) {
        return NULL;
    }
    for (i = slot_of(t, key); t->slots[i].key; i = (i + 1) & (t->capacity - 1)) {
        if (t->slots[i].key == key) {
            return &t->slots[i];
        }
    }
    return NULL;
}

int tb_rma_register(tb_rma_table_t *t, const void *base, size_t len, uint32_t access,
                    uint64_t *key)
{
    tb_rma_region_t r;

    if (0 == len || (uintptr_t) base + len < (uintptr_t) base) {
        return -1;
    }
    if ((t->count + 1) * 2 > t->capacity && 0 != grow(t)) {
        return -1;
    }
    do {
        r.key = next_key(t);
    } while (find(t, r.key));
    r.base = (uint64_t) (uintptr_t) base;
    r.len = len;
    r.access = access;
    insert(t, &r);
    t->count++;
    *key = r.key;
    return 0;
}

int tb_rma_deregister(tb_rma_table_t *t, uint64_t key)
{
    tb_rma_region_t *r = find(t, key);
    size_t hole, i;

    if (NULL == r) {
        return -1;
    }
    /* Backward-shift deletion keeps every probe chain unbroken. */
    hole = (size_t) (r - t->slots);
    t->slots[hole].key = 0;
    for (i = (hole + 1) & (t->capacity - 1); t->slots[i].key; i = (i + 1) & (t->capacity - 1)) {
        size_t home = slot_of(t, t->slots[i].key);
        if (((i - home) & (t->capacity - 1)) >= ((i - hole) & (t->capacity - 1))) {
            t->slots[hole] = t->slots[i];
            t->slots[i].key = 0;
            hole = i;
        }
    }
    t->count--;
    return 0;
}

tb_rma_status_t tb_rma_check(const tb_rma_table_t *t, uint64_t key, uint64_t addr, uint64_t len,
                             uint32_t access, void **local)
{
    const tb_rma_region_t *r = find(t, key);

    *local = NULL;
    if (NULL == r) {
        return TB_RMA_ENOKEY;
    }
    if ((r->access & access) != access) {
        return TB_RMA_EACCES;
    }
    /* Written so that no sum can overflow. */
    if (addr < r->base || addr - r->base > r->len || len > r->len - (addr - r->base)) {
        return TB_RMA_ERANGE;
    }
    *local = (void *) (uintptr_t) addr;
    return TB_RMA_OK;
}

const char *tb_rma_status_string(int status)
{
    switch (status) {
    case TB_RMA_OK:
        return "success";
    case TB_RMA_ENOKEY:
        return "no memory is registered under that key";
    case TB_RMA_ERANGE:
        return "the range is outside the registered memory";
    case TB_RMA_EACCES:
        return "the registered memory does not allow that access";
    case TB_RMA_EPROTO:
        return "malformed request";
    case TB_RMA_EALIGN:
        return "the atomic's address is not aligned to its width";
    default:
        return "unknown status";
    }
}

tb_rma_status_t tb_rma_parse_head(uint8_t tag, const void *head, size_t head_len,
                                  size_t msg_len, uint64_t max_len, tb_rma_msg_t *m)
{
    tb_wire_rma_hdr_t h;
    size_t want;

    memset(m, 0, sizeof(*m));
    if (head_len < sizeof(h) || msg_len < sizeof(h)) {
        return TB_RMA_EPROTO;
    }
    memcpy(&h, head, sizeof(h));
    m->tag = tag;
    m->status = h.status;
    m->req_id = tb_wire_le64(h.req_id);
    m->key = tb_wire_le64(h.key);
    m->addr = tb_wire_le64(h.addr);
    m->len = tb_wire_le64(h.len);
    m->payload_len = msg_len - sizeof(h);
    if (TB_WIRE_RMA_VERSION != h.version || 0 != h.reserved || 0 != h.reserved2
        || m->len > max_len) {
        return TB_RMA_EPROTO;
    }
    switch (tag) {
    case TB_TAG_RMA_PUT:
        want = (size_t) m->len;
        break;
    case TB_TAG_RMA_GET_RESP:
        want = TB_RMA_OK == m->status ? (size_t) m->len : 0;
        break;
    case TB_TAG_RMA_GET_REQ:
    case TB_TAG_RMA_PUT_ACK:
        want = 0;
        break;
    case TB_TAG_RMA_ATOMIC:
        want = TB_WIRE_RMA_ATOMIC_SIZE;
        break;
    case TB_TAG_RMA_ATOMIC_RESP:
        want = TB_RMA_OK == m->status ? 8 : 0;
        break;
    default:
        return TB_RMA_EPROTO;
    }
    if (m->payload_len != want || m->status > TB_RMA_STATUS_MAX
        || ((TB_TAG_RMA_PUT == tag || TB_TAG_RMA_GET_REQ == tag || TB_TAG_RMA_ATOMIC == tag)
            && 0 != m->status)) {
        return TB_RMA_EPROTO;
    }
    if (TB_TAG_RMA_ATOMIC == tag || TB_TAG_RMA_ATOMIC_RESP == tag) {
        if (4 != m->len && 8 != m->len) {
            return TB_RMA_EPROTO;
        }
    }
    if (TB_TAG_RMA_ATOMIC == tag) {
        tb_wire_rma_atomic_t a;
        if (head_len < sizeof(h) + sizeof(a)) {
            return TB_RMA_EPROTO;
        }
        memcpy(&a, (const unsigned char *) head + sizeof(h), sizeof(a));
        m->aop = a.op;
        m->operand = tb_wire_le64(a.operand);
        m->compare = tb_wire_le64(a.compare);
        if (0 == a.op || a.op > TB_RMA_AOP_LAST || 0 != a.reserved || 0 != a.reserved2
            || 0 != a.reserved3 || (TB_RMA_AOP_CSWAP != a.op && 0 != m->compare)) {
            return TB_RMA_EPROTO;
        }
    }
    return TB_RMA_OK;
}

/* The new value of one non-CSWAP operation; signed where it compares. */
static uint64_t apply(unsigned op, unsigned width, uint64_t old, uint64_t v)
{
    int64_t so = 4 == width ? (int64_t) (int32_t) old : (int64_t) old;
    int64_t sv = 4 == width ? (int64_t) (int32_t) v : (int64_t) v;

    switch (op) {
    case TB_RMA_AOP_ADD:
        return old + v;
    case TB_RMA_AOP_AND:
        return old & v;
    case TB_RMA_AOP_OR:
        return old | v;
    case TB_RMA_AOP_XOR:
        return old ^ v;
    case TB_RMA_AOP_LAND:
        return (0 != old) && (0 != v);
    case TB_RMA_AOP_LOR:
        return (0 != old) || (0 != v);
    case TB_RMA_AOP_LXOR:
        return (0 != old) != (0 != v);
    case TB_RMA_AOP_MIN:
        return sv < so ? v : old;
    case TB_RMA_AOP_MAX:
        return sv > so ? v : old;
    default: /* TB_RMA_AOP_SWAP */
        return v;
    }
}

tb_rma_status_t tb_rma_atomic(void *local, unsigned width, unsigned op, uint64_t operand,
                              uint64_t compare, uint64_t *old)
{
    if ((4 != width && 8 != width) || 0 != (uintptr_t) local % width) {
        return TB_RMA_EALIGN;
    }
    /* One compare-and-swap loop for every operation: the same instruction
     * the host's own atomics use, so both see one order. */
    if (8 == width) {
        uint64_t *p = local, cur = __atomic_load_n(p, __ATOMIC_RELAXED), next;
        do {
            if (TB_RMA_AOP_CSWAP == op) {
                if (cur != compare) {
                    break;
                }
                next = operand;
            } else {
                next = apply(op, 8, cur, operand);
            }
        } while (!__atomic_compare_exchange_n(p, &cur, next, false, __ATOMIC_SEQ_CST,
                                              __ATOMIC_RELAXED));
        *old = cur;
    } else {
        uint32_t *p = local, cur = __atomic_load_n(p, __ATOMIC_RELAXED), next;

        /* A 4-byte atomic's operands are the low halves (tb_wire.h). */
        operand = (uint32_t) operand;
        do {
            if (TB_RMA_AOP_CSWAP == op) {
                if (cur != (uint32_t) compare) {
                    break;
                }
                next = (uint32_t) operand;
            } else {
                next = (uint32_t) apply(op, 4, cur, operand);
            }
        } while (!__atomic_compare_exchange_n(p, &cur, next, false, __ATOMIC_SEQ_CST,
                                              __ATOMIC_RELAXED));
        *old = cur;
    }
    return TB_RMA_OK;
}

tb_rma_status_t tb_rma_parse(uint8_t tag, const void *data, size_t len, uint64_t max_len,
                             tb_rma_msg_t *m)
{
    tb_rma_status_t st = tb_rma_parse_head(tag, data, len, len, max_len, m);

    if (len >= sizeof(tb_wire_rma_hdr_t)) {
        m->payload = (const unsigned char *) data + sizeof(tb_wire_rma_hdr_t);
    }
    return st;
}
