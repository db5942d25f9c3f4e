/*
 * Unit tests of the job's cabling graph and its routes (tb_topology.h): which
 * ends make a cable, shortest paths, ties broken alike everywhere, and tables
 * refused.
 */
#include "tb_config.h"
#include "tb_topology.h"

#include <arpa/inet.h>
#include <check.h>
#include <stdlib.h>
#include <string.h>

static tb_topo_host_t hosts[TB_TOPO_MAX_HOSTS];
static tb_topo_t topo;

static void setup(void)
{
    memset(hosts, 0, sizeof(hosts));
    for (unsigned i = 0; i < TB_TOPO_MAX_HOSTS; ++i) {
        hosts[i].id[0] = (uint8_t) i; /* sorted by index */
    }
}

/* A cable between hosts a and b on subnet 10.<net>.0.0/30. */
static void cable(unsigned a, unsigned b, unsigned net)
{
    tb_topo_dev_t *da = &hosts[a].dev[hosts[a].ndev++];
    tb_topo_dev_t *db = &hosts[b].dev[hosts[b].ndev++];

    da->ipv4 = htonl(0x0a000001u | (net << 16));
    db->ipv4 = htonl(0x0a000002u | (net << 16));
    da->netmask = db->netmask = htonl(0xfffffffcu);
}

static void build(unsigned n)
{
    const char *why = NULL;

    ck_assert_msg(0 == tb_topo_build(&topo, hosts, n, &why), "refused: %s", why ? why : "");
}

static unsigned hop(unsigned a, unsigned b, unsigned *dev)
{
    int n = tb_topo_next_hop(&topo, a, b, dev);

    ck_assert_int_ge(n, 0);
    return (unsigned) n;
}

START_TEST(ring_of_four)
{
    unsigned dev;

    cable(0, 1, 1);
    cable(1, 2, 2);
    cable(2, 3, 3);
    cable(3, 0, 4);
    build(4);
    ck_assert_uint_eq(topo.dist[0][2], 2);
    ck_assert_uint_eq(topo.dist[1][3], 2);
    ck_assert_uint_eq(topo.dist[0][1], 1);
    /* Two shortest paths: the lower neighbour, from either end. */
    ck_assert_uint_eq(hop(0, 2, &dev), 1);
    ck_assert_uint_eq(dev, 0);
    ck_assert_uint_eq(hop(2, 0, &dev), 1);
    ck_assert_uint_eq(hop(1, 3, &dev), 0);
    ck_assert_uint_eq(hop(3, 1, &dev), 0);
    ck_assert_uint_eq(dev, 1); /* host 3's second cable goes to host 0 */
    ck_assert_uint_eq(hop(0, 3, &dev), 3);
    ck_assert_int_eq(tb_topo_last_hop(&topo, 0, 2), 1);
    ck_assert_int_eq(tb_topo_last_hop(&topo, 3, 1), 0);
    ck_assert_int_eq(tb_topo_last_hop(&topo, 0, 1), 0);
}
END_TEST

START_TEST(detours)
{
    uint8_t path[TB_TOPO_MAX_HOSTS];

    /* A ring of 5 (h0-h1-h2-h3-h4-h0) with a second cable h2=h3, and h5
     * hanging off h4: the way round h0-h1 goes the long way, named alike
     * from either end, low end first. */
    cable(0, 1, 1);
    cable(1, 2, 2);
    cable(2, 3, 3);
    cable(3, 4, 4);
    cable(4, 0, 5);
    cable(2, 3, 6);
    cable(4, 5, 7);
    build(6);
    ck_assert_uint_eq(tb_topo_detour(&topo, 0, 0, path), 5);
    ck_assert_mem_eq(path, ((uint8_t[]){0, 4, 3, 2, 1}), 5);
    ck_assert_uint_eq(tb_topo_detour(&topo, 1, 0, path), 5);
    ck_assert_mem_eq(path, ((uint8_t[]){0, 4, 3, 2, 1}), 5);
    /* Two cables between h2 and h3: the way round one is the other. */
    ck_assert_uint_eq(tb_topo_detour(&topo, 3, 0, path), 2);
    ck_assert_mem_eq(path, ((uint8_t[]){2, 3}), 2);
    ck_assert_uint_eq(tb_topo_detour(&topo, 2, 2, path), 2);
    ck_assert_mem_eq(path, ((uint8_t[]){2, 3}), 2);
    /* h4-h0 from h4 (its second cable): round through h3, h2, h1. */
    ck_assert_uint_eq(tb_topo_detour(&topo, 4, 1, path), 5);
    ck_assert_mem_eq(path, ((uint8_t[]){0, 1, 2, 3, 4}), 5);
    /* A cable nothing else joins: no way round; no cable: none either. */
    ck_assert_uint_eq(tb_topo_detour(&topo, 5, 0, path), 0);
    ck_assert_uint_eq(tb_topo_detour(&topo, 5, 1, path), 0);
    ck_assert_uint_eq(tb_topo_detour(&topo, 9, 0, path), 0);
}
END_TEST

START_TEST(ring_of_four_detour_ties)
{
    uint8_t path[TB_TOPO_MAX_HOSTS];

    /* h0-h1-h2-h3-h0 plus h1-h3: round h0-h1 through h3 (h2 is not cabled
     * to h0); round h1-h2 through h3 (h0 is not cabled to h2). */
    cable(0, 1, 1);
    cable(1, 2, 2);
    cable(2, 3, 3);
    cable(3, 0, 4);
    cable(1, 3, 5);
    build(4);
    ck_assert_uint_eq(tb_topo_detour(&topo, 0, 0, path), 3);
    ck_assert_mem_eq(path, ((uint8_t[]){0, 3, 1}), 3);
    ck_assert_uint_eq(tb_topo_detour(&topo, 2, 0, path), 3);
    ck_assert_mem_eq(path, ((uint8_t[]){1, 3, 2}), 3);
    /* Round h1-h3: h0 and h2 both one hop from h3 and cabled to h1: h0. */
    ck_assert_uint_eq(tb_topo_detour(&topo, 3, 2, path), 3);
    ck_assert_mem_eq(path, ((uint8_t[]){1, 0, 3}), 3);
}
END_TEST

START_TEST(detour_tie_after_first_step)
{
    uint8_t path[TB_TOPO_MAX_HOSTS];

    /* Round h0-h1: h0-h2, then h3 or h4 (both cabled to h1): the lower. */
    cable(0, 1, 1);
    cable(0, 2, 2);
    cable(2, 4, 3);
    cable(2, 3, 4);
    cable(4, 1, 5);
    cable(3, 1, 6);
    build(5);
    ck_assert_uint_eq(tb_topo_detour(&topo, 1, 0, path), 4);
    ck_assert_mem_eq(path, ((uint8_t[]){0, 2, 3, 1}), 4);
}
END_TEST

START_TEST(line_and_two_cables)
{
    unsigned dev;

    /* h0 =2= h1 -- h2: the lowest of h0's two cables carries the route. */
    cable(0, 1, 1);
    cable(0, 1, 2);
    cable(1, 2, 3);
    build(3);
    ck_assert_uint_eq(topo.peer[0][0], 1);
    ck_assert_uint_eq(topo.peer[0][1], 1);
    ck_assert_uint_eq(topo.peer_dev[1][1], 1);
    ck_assert_uint_eq(hop(0, 2, &dev), 1);
    ck_assert_uint_eq(dev, 0);
    ck_assert_uint_eq(hop(2, 0, &dev), 1);
    ck_assert_uint_eq(dev, 0);
    ck_assert_uint_eq(hop(1, 0, &dev), 0);
    ck_assert_uint_eq(dev, 0);
    ck_assert_int_eq(tb_topo_last_hop(&topo, 2, 0), 1);
}
END_TEST

START_TEST(long_line_routes_agree)
{
    /* Along a line of 8 every host's next hop toward the end is its right
     * neighbour, and forwarding from any host reaches it. */
    for (unsigned i = 0; i + 1 < 8; ++i) {
        cable(i, i + 1, i + 1);
    }
    build(8);
    ck_assert_uint_eq(topo.dist[0][7], 7);
    for (unsigned a = 0; a < 7; ++a) {
        unsigned at = a, steps = 0, dev;
        while (at != 7) {
            unsigned next = hop(at, 7, &dev);
            ck_assert_uint_eq(next, at + 1);
            at = next;
            ck_assert_uint_le(++steps, 7);
        }
    }
    ck_assert_int_eq(tb_topo_last_hop(&topo, 0, 7), 6);
}
END_TEST

START_TEST(shared_subnet_is_no_cable)
{
    /* Three ends on one /24: nobody can tell which two a cable joins. */
    for (unsigned i = 0; i < 3; ++i) {
        hosts[i].ndev = 1;
        hosts[i].dev[0].ipv4 = htonl(0xc0a80001u + i);
        hosts[i].dev[0].netmask = htonl(0xffffff00u);
    }
    build(3);
    ck_assert_uint_eq(topo.peer[0][0], TB_TOPO_NONE);
    ck_assert_uint_eq(topo.dist[0][1], TB_TOPO_NONE);
    ck_assert_int_eq(tb_topo_next_hop(&topo, 0, 1, &(unsigned){0}), -1);
    ck_assert_int_eq(tb_topo_last_hop(&topo, 0, 1), -1);
}
END_TEST

START_TEST(islands_and_lookups)
{
    uint8_t id[TB_TOPO_ID_SIZE] = {2};

    cable(0, 1, 1);
    cable(2, 3, 2);
    build(4);
    ck_assert_uint_eq(topo.dist[0][2], TB_TOPO_NONE);
    ck_assert_int_eq(tb_topo_next_hop(&topo, 0, 3, &(unsigned){0}), -1);
    ck_assert_int_eq(tb_topo_next_hop(&topo, 0, 0, &(unsigned){0}), -1);
    ck_assert_int_eq(tb_topo_next_hop(&topo, 0, 9, &(unsigned){0}), -1);
    ck_assert_int_eq(tb_topo_find(&topo, id), 2);
    id[0] = 7;
    ck_assert_int_eq(tb_topo_find(&topo, id), -1);
}
END_TEST

START_TEST(bad_tables_refused)
{
    const char *why = NULL;
    uint32_t d1, d2;

    cable(0, 1, 1);
    hosts[1].id[0] = 0; /* the same id twice */
    ck_assert_int_eq(tb_topo_build(&topo, hosts, 2, &why), -1);
    ck_assert_ptr_nonnull(strstr(why, "sorted"));
    setup();
    hosts[0].ndev = TB_TOPO_MAX_DEVS + 1;
    ck_assert_int_eq(tb_topo_build(&topo, hosts, 1, &why), -1);
    setup();
    ck_assert_int_eq(tb_topo_build(&topo, hosts, TB_TOPO_MAX_HOSTS + 1, &why), -1);
    ck_assert_int_eq(tb_topo_build(&topo, hosts, 0, &why), -1);
    hosts[0].ndev = 1;
    ck_assert_int_eq(tb_topo_build(&topo, hosts, 1, &why), -1);
    ck_assert_ptr_nonnull(strstr(why, "address"));
    /* The digest tells two tables apart. */
    setup();
    cable(0, 1, 1);
    build(2);
    d1 = topo.digest;
    hosts[1].dev[0].ipv4 ^= htonl(1u << 8);
    build(2);
    d2 = topo.digest;
    ck_assert_uint_ne(d1, d2);
}
END_TEST

static Suite *topology_suite(void)
{
    Suite *s = suite_create("topology");
    TCase *tc = tcase_create("routes");

    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, ring_of_four);
    tcase_add_test(tc, detours);
    tcase_add_test(tc, ring_of_four_detour_ties);
    tcase_add_test(tc, detour_tie_after_first_step);
    tcase_add_test(tc, line_and_two_cables);
    tcase_add_test(tc, long_line_routes_agree);
    tcase_add_test(tc, shared_subnet_is_no_cable);
    tcase_add_test(tc, islands_and_lookups);
    tcase_add_test(tc, bad_tables_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(topology_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
