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
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
