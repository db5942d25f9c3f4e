/*
 * Unit tests of the exposed-memory table: a peer's put/get may touch only
 * memory registered for it, inside the region, with the right access.
 */
#include "tb_rma.h"

#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static tb_rma_table_t t;

static void setup(void)
{
    ck_assert_int_eq(tb_rma_table_init(&t, 12345), 0);
}

static void teardown(void)
{
    tb_rma_table_fini(&t);
}

START_TEST(inside_is_allowed)
{
    static char buf[4096];
    uint64_t key;
    void *local;

    ck_assert_int_eq(tb_rma_register(&t, buf, sizeof(buf), TB_RMA_ACCESS_READ, &key), 0);
    ck_assert_uint_ne(key, 0);
    ck_assert_int_eq(tb_rma_check(&t, key, (uintptr_t) buf, sizeof(buf), TB_RMA_ACCESS_READ,
                                  &local),
                     TB_RMA_OK);
    ck_assert_ptr_eq(local, buf);
    ck_assert_int_eq(tb_rma_check(&t, key, (uintptr_t) (buf + 100), 10, TB_RMA_ACCESS_READ,
                                  &local),
                     TB_RMA_OK);
    ck_assert_ptr_eq(local, buf + 100);
    ck_assert_int_eq(tb_rma_check(&t, key, (uintptr_t) (buf + 4096), 0, TB_RMA_ACCESS_READ,
                                  &local),
                     TB_RMA_OK);
}
END_TEST

START_TEST(outside_is_refused)
{
    static char buf[4096];
    uint64_t key;
    void *local = buf;

    ck_assert_int_eq(tb_rma_register(&t, buf + 1024, 1024, TB_RMA_ACCESS_WRITE, &key), 0);
    ck_assert_int_eq(tb_rma_check(&t, key, (uintptr_t) (buf + 1023), 1, TB_RMA_ACCESS_WRITE,
                                  &local),
                     TB_RMA_ERANGE);
    ck_assert_ptr_null(local);
    ck_assert_int_eq(tb_rma_check(&t, key, (uintptr_t) (buf + 2047), 2, TB_RMA_ACCESS_WRITE,
                                  &local),
                     TB_RMA_ERANGE);
    ck_assert_int_eq(tb_rma_check(&t, key, (uintptr_t) (buf + 2048), 1, TB_RMA_ACCESS_WRITE,
                                  &local),
                     TB_RMA_ERANGE);
    /* A length that would wrap the address space around. */
    ck_assert_int_eq(tb_rma_check(&t, key, (uintptr_t) (buf + 1100), UINT64_MAX - 50,
                                  TB_RMA_ACCESS_WRITE, &local),
                     TB_RMA_ERANGE);
    ck_assert_int_eq(tb_rma_check(&t, key, UINT64_MAX, 2, TB_RMA_ACCESS_WRITE, &local),
                     TB_RMA_ERANGE);
}
END_TEST

START_TEST(wrong_key_or_access_is_refused)
{
    static char buf[64];
    uint64_t key;
    void *local;

    ck_assert_int_eq(tb_rma_register(&t, buf, sizeof(buf), TB_RMA_ACCESS_READ, &key), 0);
    ck_assert_int_eq(tb_rma_check(&t, key ^ 1, (uintptr_t) buf, 8, TB_RMA_ACCESS_READ, &local),
                     TB_RMA_ENOKEY);
    ck_assert_int_eq(tb_rma_check(&t, 0, (uintptr_t) buf, 8, TB_RMA_ACCESS_READ, &local),
                     TB_RMA_ENOKEY);
    ck_assert_int_eq(tb_rma_check(&t, key, (uintptr_t) buf, 8, TB_RMA_ACCESS_WRITE, &local),
                     TB_RMA_EACCES);
    ck_assert_int_eq(tb_rma_check(&t, key, (uintptr_t) buf, 8,
                                  TB_RMA_ACCESS_READ | TB_RMA_ACCESS_WRITE, &local),
                     TB_RMA_EACCES);
    ck_assert_int_eq(tb_rma_deregister(&t, key), 0);
    ck_assert_int_eq(tb_rma_check(&t, key, (uintptr_t) buf, 8, TB_RMA_ACCESS_READ, &local),
                     TB_RMA_ENOKEY);
    ck_assert_int_eq(tb_rma_deregister(&t, key), -1);
    ck_assert_str_eq(tb_rma_status_string(TB_RMA_ENOKEY), "no memory is registered under that key");
}
END_TEST

START_TEST(bad_registrations)
{
    uint64_t key = 7;

    ck_assert_int_eq(tb_rma_register(&t, (void *) 0x1000, 0, TB_RMA_ACCESS_READ, &key), -1);
    ck_assert_int_eq(tb_rma_register(&t, (void *) (UINTPTR_MAX - 10), 100, TB_RMA_ACCESS_READ,
                                     &key),
                     -1);
    ck_assert_uint_eq(key, 7);
    ck_assert_uint_eq(t.count, 0);
}
END_TEST

/* Many registrations and deregistrations in random order, checked against a
 * plain list: the hash table must find exactly the live ones. */
START_TEST(churn_matches_reference)
{
    enum { N = 2000 };
    static char mem[N];
    static uint64_t keys[N];
    static int live[N];
    unsigned rng = 99;
    int i, round;
    void *local;

    for (round = 0; round < 20000; ++round) {
        rng = rng * 1103515245u + 12345u;
        i = (int) ((rng >> 8) % N);
        if (live[i]) {
            ck_assert_int_eq(tb_rma_deregister(&t, keys[i]), 0);
            live[i] = 0;
        } else {
            ck_assert_int_eq(tb_rma_register(&t, &mem[i], 1, TB_RMA_ACCESS_READ, &keys[i]), 0);
            live[i] = 1;
        }
    }
    for (i = 0; i < N; ++i) {
        tb_rma_status_t st = tb_rma_check(&t, keys[i], (uintptr_t) &mem[i], 1,
                                          TB_RMA_ACCESS_READ, &local);
        if (live[i]) {
            ck_assert_int_eq(st, TB_RMA_OK);
            ck_assert_ptr_eq(local, &mem[i]);
        } else if (keys[i]) {
            ck_assert_int_eq(st, TB_RMA_ENOKEY);
        }
    }
}
END_TEST

START_TEST(keys_differ_across_tables)
{
    tb_rma_table_t a, b;
    uint64_t ka, kb;
    static char buf[8];

    ck_assert_int_eq(tb_rma_table_init(&a, 0), 0);
    ck_assert_int_eq(tb_rma_table_init(&b, 0), 0);
    ck_assert_int_eq(tb_rma_register(&a, buf, 8, TB_RMA_ACCESS_READ, &ka), 0);
    ck_assert_int_eq(tb_rma_register(&b, buf, 8, TB_RMA_ACCESS_READ, &kb), 0);
    ck_assert_uint_ne(ka, kb);
    tb_rma_table_fini(&a);
    tb_rma_table_fini(&b);
}
END_TEST

/* splitmix64's finalizer and its inverse: the old key generator was this
 * mix of a counter, so one key gave away the generator's state. */
static uint64_t unmix(uint64_t z)
{
    z ^= z >> 31 ^ z >> 62;
    z *= 0x319642b2d24d8ec3ull;
    z ^= z >> 27 ^ z >> 54;
    z *= 0x96de1b173f119089ull;
    z ^= z >> 30 ^ z >> 60;
    return z;
}

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Regression: a peer that saw one key could compute every other key of the
 * process (invert the mix, step the counter).  Keys now come from a keyed
 * PRF: neither the next nor the previous key follows from one seen. */
START_TEST(keys_are_not_predictable)
{
    static char buf[64];
    uint64_t keys[4], state;

    ck_assert_uint_eq(unmix(mix(0x0123456789abcdefull)), 0x0123456789abcdefull);
    for (unsigned i = 0; i < 4; i++) {
        ck_assert_int_eq(tb_rma_register(&t, buf + i, 8, TB_RMA_ACCESS_READ, &keys[i]), 0);
    }
    state = unmix(keys[1]);
    ck_assert_uint_ne(mix(state + 0x9e3779b97f4a7c15ull), keys[2]);
    ck_assert_uint_ne(mix(state - 0x9e3779b97f4a7c15ull), keys[0]);
    for (unsigned i = 0; i < 4; i++) {
        for (unsigned j = i + 1; j < 4; j++) {
            ck_assert_uint_ne(keys[i], keys[j]);
        }
    }
}
END_TEST

static void hdr(unsigned char *m, uint8_t status, uint64_t len)
{
    tb_wire_rma_hdr_t h;
    memset(&h, 0, sizeof(h));
    h.version = TB_WIRE_RMA_VERSION;
    h.status = status;
    h.req_id = tb_wire_le64(7);
    h.key = tb_wire_le64(0x1234);
    h.addr = tb_wire_le64(0x1000);
    h.len = tb_wire_le64(len);
    memcpy(m, &h, sizeof(h));
}

/* Every message from a peer is checked whole before any field is used. */
START_TEST(parse_checks_every_field)
{
    unsigned char m[TB_WIRE_RMA_HDR_SIZE + 16];
    tb_rma_msg_t r;

    hdr(m, 0, 16);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_PUT, m, sizeof(m), 1024, &r), TB_RMA_OK);
    ck_assert_uint_eq(r.req_id, 7);
    ck_assert_uint_eq(r.key, 0x1234);
    ck_assert_uint_eq(r.len, 16);
    ck_assert_uint_eq(r.payload_len, 16);
    ck_assert_ptr_eq(r.payload, m + TB_WIRE_RMA_HDR_SIZE);
    /* payload shorter or longer than len */
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_PUT, m, sizeof(m) - 1, 1024, &r), TB_RMA_EPROTO);
    hdr(m, 0, 15);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_PUT, m, sizeof(m), 1024, &r), TB_RMA_EPROTO);
    /* len above what this side serves */
    hdr(m, 0, 16);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_PUT, m, sizeof(m), 8, &r), TB_RMA_EPROTO);
    /* a get request carries no data; a refused get response neither */
    hdr(m, 0, 16);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_GET_REQ, m, TB_WIRE_RMA_HDR_SIZE, 1024, &r),
                     TB_RMA_OK);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_GET_REQ, m, sizeof(m), 1024, &r), TB_RMA_EPROTO);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_GET_RESP, m, sizeof(m), 1024, &r), TB_RMA_OK);
    hdr(m, TB_RMA_ERANGE, 16);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_GET_RESP, m, TB_WIRE_RMA_HDR_SIZE, 1024, &r),
                     TB_RMA_OK);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_GET_RESP, m, sizeof(m), 1024, &r), TB_RMA_EPROTO);
    /* a request with a status, an unknown status, version, reserved bits, tag */
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_GET_REQ, m, TB_WIRE_RMA_HDR_SIZE, 1024, &r),
                     TB_RMA_EPROTO);
    hdr(m, 9, 0);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_PUT_ACK, m, TB_WIRE_RMA_HDR_SIZE, 1024, &r),
                     TB_RMA_EPROTO);
    hdr(m, 0, 0);
    m[0] = TB_WIRE_RMA_VERSION + 1;
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_PUT_ACK, m, TB_WIRE_RMA_HDR_SIZE, 1024, &r),
                     TB_RMA_EPROTO);
    hdr(m, 0, 0);
    m[2] = 1;
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_PUT_ACK, m, TB_WIRE_RMA_HDR_SIZE, 1024, &r),
                     TB_RMA_EPROTO);
    hdr(m, 0, 0);
    ck_assert_int_eq(tb_rma_parse(0x07, m, TB_WIRE_RMA_HDR_SIZE, 1024, &r), TB_RMA_EPROTO);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_PUT_ACK, m, TB_WIRE_RMA_HDR_SIZE - 1, 1024, &r),
                     TB_RMA_EPROTO);
}
END_TEST

static void atomic_msg(unsigned char *m, uint64_t width, uint8_t op, uint64_t operand,
                       uint64_t compare)
{
    tb_wire_rma_atomic_t a;

    hdr(m, 0, width);
    memset(&a, 0, sizeof(a));
    a.op = op;
    a.operand = tb_wire_le64(operand);
    a.compare = tb_wire_le64(compare);
    memcpy(m + TB_WIRE_RMA_HDR_SIZE, &a, sizeof(a));
}

/* An atomic request and its answer are checked like every other message:
 * width, operation, reserved bytes, a compare only where it means something. */
START_TEST(parse_checks_atomics)
{
    unsigned char m[TB_WIRE_RMA_HDR_SIZE + TB_WIRE_RMA_ATOMIC_SIZE];
    const size_t n = sizeof(m);
    tb_rma_msg_t r;

    atomic_msg(m, 8, TB_RMA_AOP_ADD, 5, 0);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_ATOMIC, m, n, 1024, &r), TB_RMA_OK);
    ck_assert_uint_eq(r.aop, TB_RMA_AOP_ADD);
    ck_assert_uint_eq(r.operand, 5);
    ck_assert_uint_eq(r.len, 8);
    atomic_msg(m, 4, TB_RMA_AOP_CSWAP, 5, 9);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_ATOMIC, m, n, 1024, &r), TB_RMA_OK);
    ck_assert_uint_eq(r.compare, 9);
    /* width, operation, compare outside CSWAP, reserved, length, status */
    atomic_msg(m, 2, TB_RMA_AOP_ADD, 5, 0);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_ATOMIC, m, n, 1024, &r), TB_RMA_EPROTO);
    atomic_msg(m, 16, TB_RMA_AOP_ADD, 5, 0);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_ATOMIC, m, n, 1024, &r), TB_RMA_EPROTO);
    atomic_msg(m, 8, 0, 5, 0);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_ATOMIC, m, n, 1024, &r), TB_RMA_EPROTO);
    atomic_msg(m, 8, TB_RMA_AOP_LAST + 1, 5, 0);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_ATOMIC, m, n, 1024, &r), TB_RMA_EPROTO);
    atomic_msg(m, 8, TB_RMA_AOP_ADD, 5, 1);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_ATOMIC, m, n, 1024, &r), TB_RMA_EPROTO);
    atomic_msg(m, 8, TB_RMA_AOP_ADD, 5, 0);
    m[TB_WIRE_RMA_HDR_SIZE + 1] = 1;
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_ATOMIC, m, n, 1024, &r), TB_RMA_EPROTO);
    atomic_msg(m, 8, TB_RMA_AOP_ADD, 5, 0);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_ATOMIC, m, n - 1, 1024, &r), TB_RMA_EPROTO);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_ATOMIC, m, TB_WIRE_RMA_HDR_SIZE, 1024, &r),
                     TB_RMA_EPROTO);
    m[1] = TB_RMA_EACCES;
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_ATOMIC, m, n, 1024, &r), TB_RMA_EPROTO);
    /* the answer: 8 bytes of old value, none when refused */
    hdr(m, 0, 8);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_ATOMIC_RESP, m, TB_WIRE_RMA_HDR_SIZE + 8, 1024, &r),
                     TB_RMA_OK);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_ATOMIC_RESP, m, TB_WIRE_RMA_HDR_SIZE, 1024, &r),
                     TB_RMA_EPROTO);
    hdr(m, 0, 3);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_ATOMIC_RESP, m, TB_WIRE_RMA_HDR_SIZE + 8, 1024, &r),
                     TB_RMA_EPROTO);
    hdr(m, TB_RMA_EALIGN, 8);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_ATOMIC_RESP, m, TB_WIRE_RMA_HDR_SIZE, 1024, &r),
                     TB_RMA_OK);
    hdr(m, TB_RMA_STATUS_MAX + 1, 8);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_ATOMIC_RESP, m, TB_WIRE_RMA_HDR_SIZE, 1024, &r),
                     TB_RMA_EPROTO);
}
END_TEST

/* Every operation at both widths, against the arithmetic it names. */
START_TEST(atomics_compute)
{
    static const struct {
        unsigned op;
        int64_t old, operand, compare, want;
    } cases[] = {
        {TB_RMA_AOP_ADD, 40, 2, 0, 42},   {TB_RMA_AOP_ADD, -1, 1, 0, 0},
        {TB_RMA_AOP_AND, 12, 10, 0, 8},   {TB_RMA_AOP_OR, 12, 3, 0, 15},
        {TB_RMA_AOP_XOR, 12, 10, 0, 6},   {TB_RMA_AOP_LAND, 7, 0, 0, 0},
        {TB_RMA_AOP_LAND, 7, 9, 0, 1},    {TB_RMA_AOP_LOR, 0, 0, 0, 0},
        {TB_RMA_AOP_LOR, 0, 5, 0, 1},     {TB_RMA_AOP_LXOR, 3, 5, 0, 0},
        {TB_RMA_AOP_LXOR, 0, 5, 0, 1},    {TB_RMA_AOP_SWAP, 3, 77, 0, 77},
        {TB_RMA_AOP_MIN, -5, 3, 0, -5},   {TB_RMA_AOP_MIN, 5, -3, 0, -3},
        {TB_RMA_AOP_MAX, -5, 3, 0, 3},    {TB_RMA_AOP_MAX, 5, -3, 0, 5},
        {TB_RMA_AOP_CSWAP, 9, 4, 9, 4},   {TB_RMA_AOP_CSWAP, 9, 4, 8, 9},
    };
    uint64_t buf[2], old;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        int32_t *w = (int32_t *) &buf[1];
        buf[0] = (uint64_t) cases[i].old;
        buf[1] = 0x5555555555555555ull;
        w[0] = (int32_t) cases[i].old;
        ck_assert_int_eq(tb_rma_atomic(&buf[0], 8, cases[i].op, (uint64_t) cases[i].operand,
                                       (uint64_t) cases[i].compare, &old),
                         TB_RMA_OK);
        ck_assert_msg((int64_t) buf[0] == cases[i].want && (int64_t) old == cases[i].old,
                      "64-bit case %zu: %lld (old %lld)", i, (long long) buf[0], (long long) old);
        ck_assert_int_eq(tb_rma_atomic(w, 4, cases[i].op, (uint64_t) cases[i].operand,
                                       (uint64_t) cases[i].compare, &old),
                         TB_RMA_OK);
        ck_assert_msg(w[0] == (int32_t) cases[i].want && (int32_t) old == (int32_t) cases[i].old,
                      "32-bit case %zu: %d (old %d)", i, w[0], (int) (int32_t) old);
        /* the neighbouring word is untouched */
        ck_assert_int_eq(w[1], 0x55555555);
    }
    /* a 4-byte atomic reads only the low half of its operand */
    {
        uint32_t w32 = 7;
        ck_assert_int_eq(tb_rma_atomic(&w32, 4, TB_RMA_AOP_LAND, 1ull << 32, 0, &old), TB_RMA_OK);
        ck_assert_uint_eq(w32, 0);
        ck_assert_uint_eq(old, 7);
    }
    /* misaligned: refused, nothing written */
    buf[0] = 1;
    ck_assert_int_eq(tb_rma_atomic((char *) buf + 4, 8, TB_RMA_AOP_ADD, 1, 0, &old),
                     TB_RMA_EALIGN);
    ck_assert_int_eq(tb_rma_atomic((char *) buf + 2, 4, TB_RMA_AOP_ADD, 1, 0, &old),
                     TB_RMA_EALIGN);
    ck_assert_uint_eq(buf[0], 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("rma");
    TCase *tc = tcase_create("table");
    SRunner *sr;
    int failed;

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, inside_is_allowed);
    tcase_add_test(tc, outside_is_refused);
    tcase_add_test(tc, wrong_key_or_access_is_refused);
    tcase_add_test(tc, bad_registrations);
    tcase_add_test(tc, churn_matches_reference);
    tcase_add_test(tc, keys_differ_across_tables);
    tcase_add_test(tc, keys_are_not_predictable);
    tcase_add_test(tc, parse_checks_every_field);
    tcase_add_test(tc, parse_checks_atomics);
    tcase_add_test(tc, atomics_compute);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
