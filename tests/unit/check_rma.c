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
    m[0] = 2;
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_PUT_ACK, m, TB_WIRE_RMA_HDR_SIZE, 1024, &r),
                     TB_RMA_EPROTO);
    hdr(m, 0, 0);
    m[2] = 1;
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_PUT_ACK, m, TB_WIRE_RMA_HDR_SIZE, 1024, &r),
                     TB_RMA_EPROTO);
    hdr(m, 0, 0);
    ck_assert_int_eq(tb_rma_parse(0x05, m, TB_WIRE_RMA_HDR_SIZE, 1024, &r), TB_RMA_EPROTO);
    ck_assert_int_eq(tb_rma_parse(TB_TAG_RMA_PUT_ACK, m, TB_WIRE_RMA_HDR_SIZE - 1, 1024, &r),
                     TB_RMA_EPROTO);
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
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
