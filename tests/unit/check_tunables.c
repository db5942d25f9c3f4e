/*
 * Unit tests of parameter validation: every bad value is refused with a
 * message naming the parameter.
 */
#include "tb_config.h"
#include "tb_channel.h"
#include "tb_device.h"
#include "tb_tunables.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

static char err[512];
static tb_tunables_t t;

static void setup(void)
{
    tb_tunables_defaults(&t);
    err[0] = '\0';
}

static void expect_refused(const char *needle)
{
    ck_assert_int_eq(tb_tunables_validate(&t, "btl_tbrdma_", err, sizeof(err)), -1);
    ck_assert_msg(NULL != strstr(err, needle), "message \"%s\" lacks \"%s\"", err, needle);
}

START_TEST(defaults_are_valid)
{
    ck_assert_int_eq(tb_tunables_validate(&t, "btl_tbrdma_", err, sizeof(err)), 0);
    ck_assert_int_eq(t.recv_depth, TB_APPLE_MAX_RECV_DEPTH);
    ck_assert_int_eq(t.qps_per_device, TB_APPLE_MAX_QP);
    ck_assert_uint_eq(t.small_frame_size % TB_FRAME_SIZE, 0);
    ck_assert_uint_eq(t.bulk_frame_size % TB_FRAME_SIZE, 0);
}
END_TEST

START_TEST(frame_sizes)
{
    t.small_frame_size = 1000;
    expect_refused("btl_tbrdma_small_frame_size = 1000: must be a multiple of 4096");
    setup();
    t.bulk_frame_size = 0;
    expect_refused("btl_tbrdma_bulk_frame_size = 0");
    setup();
    t.bulk_frame_size = TB_APPLE_MAX_MSG_SIZE + TB_FRAME_SIZE;
    expect_refused("btl_tbrdma_bulk_frame_size");
    setup();
    t.bulk_frame_size = TB_APPLE_MAX_MSG_SIZE;
    ck_assert_int_eq(tb_tunables_validate(&t, "btl_tbrdma_", err, sizeof(err)), 0);
    t.bulk_frame_size = t.small_frame_size;
    expect_refused("must be larger than btl_tbrdma_small_frame_size");
    t.lanes = 1;
    ck_assert_int_eq(tb_tunables_validate(&t, "btl_tbrdma_", err, sizeof(err)), 0);
}
END_TEST

START_TEST(ranges)
{
    t.recv_depth = 33;
    expect_refused("btl_tbrdma_recv_depth = 33: must be between 2 and 32");
    setup();
    t.recv_depth = 0;
    expect_refused("btl_tbrdma_recv_depth = 0");
    setup();
    t.qps_per_device = 11;
    expect_refused("btl_tbrdma_qps_per_device = 11: must be between 2 and 10");
    setup();
    t.lanes = 3;
    expect_refused("btl_tbrdma_lanes = 3");
    setup();
    t.lanes = 1;
    t.qps_per_device = 1;
    ck_assert_int_eq(tb_tunables_validate(&t, "btl_tbrdma_", err, sizeof(err)), 0);
    setup();
    t.peer_timeout_ms = 10;
    expect_refused("btl_tbrdma_peer_timeout = 10");
    setup();
    t.rto_min_us = 0;
    expect_refused("btl_tbrdma_rto_min = 0");
    setup();
    t.peer_timeout_ms = 100;
    t.rto_min_us = 200000;
    expect_refused("must be shorter than btl_tbrdma_peer_timeout");
    setup();
    t.stall_timeout_ms = 99;
    expect_refused("btl_tbrdma_stall_timeout = 99");
}
END_TEST

/* Silence is a dead peer within seconds; data left unacknowledged while the
 * peer answers gets longer (resends on a lossy cable), never less than the
 * silence deadline, and both reach the channel. */
START_TEST(timeouts)
{
    tb_channel_params_t p;

    ck_assert_uint_le(t.peer_timeout_ms, 10000);
    ck_assert_uint_gt(t.stall_timeout_ms, t.peer_timeout_ms);
    tb_tunables_channel_params(&t, &p);
    ck_assert_uint_eq(p.peer_timeout_ns, (uint64_t) t.peer_timeout_ms * 1000000u);
    ck_assert_uint_eq(p.stall_timeout_ns, (uint64_t) t.stall_timeout_ms * 1000000u);
    ck_assert_uint_eq(tb_tunables_stall_timeout_ns(&t), p.stall_timeout_ns);
    t.peer_timeout_ms = 60000;
    ck_assert_uint_eq(tb_tunables_stall_timeout_ns(&t), 60000ull * 1000000u);
    ck_assert_int_eq(tb_tunables_validate(&t, "btl_tbrdma_", err, sizeof(err)), 0);
}
END_TEST

START_TEST(device_lists_and_checksum)
{
    t.if_include = "rdma_en*";
    t.if_exclude = "rdma_en1";
    expect_refused("set only one");
    setup();
    t.if_include = "rdma_en0,,rdma_en1";
    expect_refused("btl_tbrdma_if_include/btl_tbrdma_if_exclude: device include list");
    setup();
    t.checksum = 7;
    expect_refused("btl_tbrdma_checksum = 7");
    ck_assert_int_eq(tb_checksum_mode_parse("full"), TB_CHECKSUM_FULL);
    ck_assert_int_eq(tb_checksum_mode_parse("header"), TB_CHECKSUM_HEADER);
    ck_assert_int_eq(tb_checksum_mode_parse("crc"), -1);
    ck_assert_str_eq(tb_checksum_mode_name(TB_CHECKSUM_HEADER), "header");
    ck_assert_ptr_null(tb_checksum_mode_name(-1));
}
END_TEST

static Suite *tunables_suite(void)
{
    Suite *s = suite_create("tunables");
    TCase *tc = tcase_create("validate");

    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, defaults_are_valid);
    tcase_add_test(tc, frame_sizes);
    tcase_add_test(tc, ranges);
    tcase_add_test(tc, device_lists_and_checksum);
    tcase_add_test(tc, timeouts);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(tunables_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
