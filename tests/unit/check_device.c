/*
 * Unit tests of the device layer: name filters, GID helpers, Apple limits,
 * and discovery through a stand-in verbs library (fake_verbs.c); and of
 * tbrdma_devinfo's advice (tools/tbrdma_devcheck.h): the device that lists
 * but makes no UC queue pair (the stand-in's "open" device, like a
 * Thunderbolt 4 port), interfaces with and without an address, and macOS's
 * bridge listing.  A bridged port and a port without an address are checked
 * in the virtual cluster (tests/vcluster/guest-check-build).
 */
#include "tb_config.h"
#include "tb_device.h"
#include "tb_log.h"
#include "tb_namefilter.h"
#include "tbrdma_devcheck.h"

#include <check.h>
#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

static char err[512];

START_TEST(filter_empty_accepts_all)
{
    tb_namefilter_t f;
    ck_assert_int_eq(tb_namefilter_parse(&f, NULL, "", err, sizeof(err)), 0);
    ck_assert_int_eq(f.count, 0);
    ck_assert(tb_namefilter_accepts(&f, "rdma_en3"));
}
END_TEST

START_TEST(filter_include_patterns)
{
    tb_namefilter_t f;
    ck_assert_int_eq(tb_namefilter_parse(&f, " rdma_en*, mlx5_0 ", NULL, err, sizeof(err)), 0);
    ck_assert_int_eq(f.count, 2);
    ck_assert_str_eq(f.patterns[0], "rdma_en*");
    ck_assert_str_eq(f.patterns[1], "mlx5_0");
    ck_assert(tb_namefilter_accepts(&f, "rdma_en5"));
    ck_assert(tb_namefilter_accepts(&f, "mlx5_0"));
    ck_assert(!tb_namefilter_accepts(&f, "mlx5_1"));
    ck_assert(!tb_namefilter_accepts(&f, "rxe0"));
}
END_TEST

START_TEST(filter_exclude_patterns)
{
    tb_namefilter_t f;
    ck_assert_int_eq(tb_namefilter_parse(&f, "", "rxe?", err, sizeof(err)), 0);
    ck_assert(f.exclude);
    ck_assert(!tb_namefilter_accepts(&f, "rxe0"));
    ck_assert(tb_namefilter_accepts(&f, "rxe10"));
    ck_assert(tb_namefilter_accepts(&f, "rdma_en0"));
}
END_TEST

START_TEST(filter_rejects_bad_lists)
{
    tb_namefilter_t f;
    char longname[100];

    ck_assert_int_eq(tb_namefilter_parse(&f, "a", "b", err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "set only one"));
    ck_assert_int_eq(tb_namefilter_parse(&f, "a,,b", NULL, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "empty entry"));
    ck_assert_int_eq(tb_namefilter_parse(&f, "a,", NULL, err, sizeof(err)), -1);
    ck_assert_int_eq(tb_namefilter_parse(&f, "rdma en0", NULL, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "space"));
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    ck_assert_int_eq(tb_namefilter_parse(&f, longname, NULL, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "longer than"));
}
END_TEST

START_TEST(gid_helpers)
{
    union ibv_gid gid;
    char buf[64];

    memset(&gid, 0, sizeof(gid));
    ck_assert(!tb_gid_is_ipv4_mapped(&gid));
    gid.raw[10] = gid.raw[11] = 0xff;
    gid.raw[12] = 10;
    gid.raw[13] = 0;
    gid.raw[14] = 1;
    gid.raw[15] = 2;
    ck_assert(tb_gid_is_ipv4_mapped(&gid));
    tb_gid_to_string(&gid, buf, sizeof(buf));
    ck_assert_str_eq(buf, "::ffff:10.0.1.2");
    gid.raw[0] = 0xfe;
    ck_assert(!tb_gid_is_ipv4_mapped(&gid));
}
END_TEST

START_TEST(mtu_and_netdev_names)
{
    char nd[IF_NAMESIZE];

    ck_assert_uint_eq(tb_mtu_to_bytes(IBV_MTU_1024), 1024);
    ck_assert_uint_eq(tb_mtu_to_bytes(IBV_MTU_4096), 4096);
    ck_assert_uint_eq(tb_mtu_to_bytes((enum ibv_mtu) 99), 0);
    tb_device_guess_netdev("rdma_en3", nd, sizeof(nd));
    ck_assert_str_eq(nd, "en3");
    tb_device_guess_netdev("mlx5_0", nd, sizeof(nd));
    ck_assert_str_eq(nd, "");
}
END_TEST

START_TEST(limits_clamped_to_apple)
{
    tb_device_limits_t hw = {.max_qp = 1000, .max_mr = 5000, .max_qp_wr = 16384, .max_sge = 30,
                             .max_cqe = 4096, .max_msg = 1u << 31, .mtu = 1024};
    tb_device_limits_t small = {.max_qp = 4, .max_mr = 50, .max_qp_wr = 16, .max_sge = 1,
                                .max_cqe = 64, .max_msg = 65536, .mtu = 4096};
    tb_device_limits_t out;

    tb_device_limits_clamp(&hw, &out);
    ck_assert_int_eq(out.max_qp, TB_APPLE_MAX_QP);
    ck_assert_int_eq(out.max_mr, TB_APPLE_MAX_MR);
    ck_assert_int_eq(out.max_qp_wr, TB_APPLE_MAX_RECV_DEPTH);
    ck_assert_int_eq(out.max_sge, 1);
    ck_assert_uint_eq(out.max_msg, TB_APPLE_MAX_MSG_SIZE);
    ck_assert_int_eq(out.max_cqe, 4096);
    tb_device_limits_clamp(&small, &out);
    ck_assert_int_eq(out.max_qp, 4);
    ck_assert_int_eq(out.max_mr, 50);
    ck_assert_int_eq(out.max_qp_wr, 16);
    ck_assert_uint_eq(out.max_msg, 65536);
}
END_TEST

static const tb_device_t *find(const tb_device_list_t *l, const char *name)
{
    int i;
    for (i = 0; i < l->count; ++i) {
        if (0 == strcmp(l->devices[i].name, name)) {
            return &l->devices[i];
        }
    }
    return NULL;
}

START_TEST(discovery_reports_each_case)
{
    tb_device_list_t l;
    const tb_device_t *d;

    setenv("TB_FAKE_VERBS",
           "rdma_en0:active:127.0.0.1;rdma_en1:down:127.0.0.1;mlx5_0:active:none;"
           "rdma_en2:active:192.0.2.77",
           1);
    ck_assert_int_eq(tb_device_list_open(&l, FAKE_VERBS_PATH, NULL, err, sizeof(err)), 0);
    ck_assert_int_eq(l.count, 4);
    ck_assert_int_eq(tb_device_list_usable_count(&l), 1);

    d = find(&l, "rdma_en0");
    ck_assert_ptr_nonnull(d);
    ck_assert(d->usable);
    ck_assert_int_eq(d->gid_index, 1);
    ck_assert_str_eq(d->netdev, "lo");
    ck_assert_uint_eq(ntohl(d->ipv4.s_addr), 0x7f000001u);
    ck_assert_uint_eq(ntohl(d->netmask.s_addr), 0xff000000u);
    ck_assert_int_eq(d->limits.max_qp, TB_APPLE_MAX_QP);
    ck_assert_int_eq(d->hw.max_qp, 1024);
    ck_assert_uint_eq(d->hw.mtu, 1024);
    ck_assert_ptr_nonnull(d->context);

    d = find(&l, "rdma_en1");
    ck_assert(!d->usable);
    ck_assert_ptr_nonnull(strstr(d->reason, "not active"));
    ck_assert_ptr_null(d->context);

    d = find(&l, "mlx5_0");
    ck_assert(!d->usable);
    ck_assert_ptr_nonnull(strstr(d->reason, "no IPv4-mapped GID"));

    d = find(&l, "rdma_en2");
    ck_assert(!d->usable);
    ck_assert_ptr_nonnull(strstr(d->reason, "192.0.2.77 is on no interface"));
    /* Only usable devices count: rdma_en0 (127.0.0.1/8) holds 127.1.2.3. */
    ck_assert_int_eq(tb_device_list_count_subnet(&l, htonl(0x7f010203u)), 1);
    ck_assert_int_eq(tb_device_list_count_subnet(&l, htonl(0xc0000201u)), 0);
    tb_device_list_close(&l);
    ck_assert_int_eq(l.count, 0);
}
END_TEST

START_TEST(discovery_applies_filter)
{
    tb_device_list_t l;
    tb_namefilter_t f;

    setenv("TB_FAKE_VERBS", "rdma_en0:active:127.0.0.1;rdma_en1:active:127.0.0.1;rxe0:active:127.0.0.1",
           1);
    ck_assert_int_eq(tb_namefilter_parse(&f, NULL, "rdma_en1", err, sizeof(err)), 0);
    ck_assert_int_eq(tb_device_list_open(&l, FAKE_VERBS_PATH, &f, err, sizeof(err)), 0);
    ck_assert_int_eq(l.count, 2);
    ck_assert_ptr_nonnull(find(&l, "rdma_en0"));
    ck_assert_ptr_null(find(&l, "rdma_en1"));
    ck_assert_ptr_nonnull(find(&l, "rxe0"));
    tb_device_list_close(&l);
}
END_TEST

START_TEST(discovery_no_device_is_not_an_error)
{
    tb_device_list_t l;

    setenv("TB_FAKE_VERBS", "", 1);
    ck_assert_int_eq(tb_device_list_open(&l, FAKE_VERBS_PATH, NULL, err, sizeof(err)), 0);
    ck_assert_int_eq(l.count, 0);
    ck_assert_int_eq(tb_device_list_usable_count(&l), 0);
    tb_device_list_close(&l);
}
END_TEST

START_TEST(missing_or_wrong_library_explains)
{
    tb_device_list_t l;

    ck_assert_int_eq(tb_device_list_open(&l, "/nonexistent/libibverbs.so.1", NULL, err,
                                         sizeof(err)),
                     -1);
    ck_assert_ptr_nonnull(strstr(err, "cannot load the verbs library /nonexistent"));
    ck_assert_ptr_nonnull(strstr(err, "btl_tbrdma_verbs_library"));
    ck_assert_ptr_null(l.verbs.handle);

    ck_assert_int_eq(tb_device_list_open(&l, "libm.so.6", NULL, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "has no ibv_get_device_list"));
    ck_assert_ptr_null(l.verbs.handle);
}
END_TEST

START_TEST(uc_qp_refused_is_said)
{
    tb_device_list_t l;
    const tb_device_t *d;
    char why[512] = "";

    setenv("TB_FAKE_VERBS", "rdma_en0:open:127.0.0.1;rdma_en1:active:127.0.0.1", 1);
    ck_assert_int_eq(tb_device_list_open(&l, FAKE_VERBS_PATH, NULL, err, sizeof(err)), 0);
    d = find(&l, "rdma_en0");
    ck_assert(d && d->usable);
    ck_assert_int_eq(tb_devcheck_uc_qp(&l.verbs, d, why, sizeof(why)), -1);
    ck_assert_msg(NULL != strstr(why, "ibv_create_qp(UC) failed") &&
                      NULL != strstr(why, "Thunderbolt 4"),
                  "why: %s", why);
    d = find(&l, "rdma_en1");
    ck_assert(d && d->usable);
    ck_assert_int_eq(tb_devcheck_uc_qp(&l.verbs, d, why, sizeof(why)), -1);
    ck_assert_msg(NULL != strstr(why, "ibv_alloc_pd failed"), "why: %s", why);
    tb_device_list_close(&l);
}
END_TEST

START_TEST(interface_found_and_addressed)
{
    tb_device_list_t l;
    char ifname[32], bridge[32];

    setenv("TB_FAKE_VERBS", "rdma_en0:active:127.0.0.1;mlx5_0:active:none;rdma_en9:active:none", 1);
    ck_assert_int_eq(tb_device_list_open(&l, FAKE_VERBS_PATH, NULL, err, sizeof(err)), 0);
    tb_devcheck_netdev(find(&l, "rdma_en0"), ifname, sizeof(ifname));
    ck_assert_str_eq(ifname, "lo");
    ck_assert_int_eq(tb_devcheck_has_ipv4(ifname), 1);
    ck_assert(!tb_devcheck_bridged(ifname, bridge, sizeof(bridge)));
    /* Neither a name that says nor a GID that Linux pairs with one. */
    tb_devcheck_netdev(find(&l, "mlx5_0"), ifname, sizeof(ifname));
    ck_assert_str_eq(ifname, "");
    tb_devcheck_netdev(find(&l, "rdma_en9"), ifname, sizeof(ifname));
    ck_assert_str_eq(ifname, "en9");
    ck_assert_int_eq(tb_devcheck_has_ipv4("tbrdma-none0"), -1);
    tb_device_list_close(&l);
}
END_TEST

/* What macOS's ifconfig prints for the Thunderbolt Bridge. */
START_TEST(macos_bridge_members)
{
    static const char text[] =
        "bridge0: flags=8863<UP,BROADCAST,SMART,RUNNING,SIMPLEX,MULTICAST> mtu 1500\n"
        "\toptions=63<RXCSUM,TXCSUM,TSO4,TSO6>\n"
        "\tether 36:a1:b2:c3:d4:e5\n"
        "\tConfiguration:\n"
        "\t\tid 0:0:0:0:0:0 priority 0 hellotime 0 fwddelay 0\n"
        "\tmember: en1 flags=3<LEARNING,DISCOVER>\n"
        "\t        ifmaxaddr 0 port 9 priority 0 path cost 0\n"
        "\tmember: en12 flags=3<LEARNING,DISCOVER>\n"
        "\t        ifmaxaddr 0 port 10 priority 0 path cost 0\n"
        "\tstatus: inactive\n";

    ck_assert(tb_devcheck_ifconfig_lists_member(text, "en1"));
    ck_assert(tb_devcheck_ifconfig_lists_member(text, "en12"));
    ck_assert(!tb_devcheck_ifconfig_lists_member(text, "en2"));
    ck_assert(!tb_devcheck_ifconfig_lists_member(text, "en"));
    ck_assert(!tb_devcheck_ifconfig_lists_member(text, "bridge0"));
    ck_assert(!tb_devcheck_ifconfig_lists_member(text, ""));
    ck_assert(tb_devcheck_ifconfig_lists_member("member:\ten3", "en3"));
}
END_TEST

START_TEST(no_device_says_what_to_do)
{
    ck_assert_ptr_nonnull(strstr(tb_devcheck_no_device_hint(), "rdma link add"));
}
END_TEST

static Suite *device_suite(void)
{
    Suite *s = suite_create("device");
    TCase *tc = tcase_create("filter");

    tcase_add_test(tc, filter_empty_accepts_all);
    tcase_add_test(tc, filter_include_patterns);
    tcase_add_test(tc, filter_exclude_patterns);
    tcase_add_test(tc, filter_rejects_bad_lists);
    suite_add_tcase(s, tc);

    tc = tcase_create("helpers");
    tcase_add_test(tc, gid_helpers);
    tcase_add_test(tc, mtu_and_netdev_names);
    tcase_add_test(tc, limits_clamped_to_apple);
    suite_add_tcase(s, tc);

    tc = tcase_create("discovery");
    tcase_add_test(tc, discovery_reports_each_case);
    tcase_add_test(tc, discovery_applies_filter);
    tcase_add_test(tc, discovery_no_device_is_not_an_error);
    tcase_add_test(tc, missing_or_wrong_library_explains);
    suite_add_tcase(s, tc);

    tc = tcase_create("devinfo advice");
    tcase_add_test(tc, uc_qp_refused_is_said);
    tcase_add_test(tc, interface_found_and_addressed);
    tcase_add_test(tc, macos_bridge_members);
    tcase_add_test(tc, no_device_says_what_to_do);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(device_suite());
    int failed;

    tb_log_set_sink(NULL, NULL, TB_LOG_ERROR);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
