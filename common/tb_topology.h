/*
 * tbrdma transport: the job's cabling as a graph of hosts, and the routes
 * over it.
 *
 * Every host engine (and every rank, to know whom it can reach) builds the
 * same graph from the same facts, the job's published entries: each host's
 * id and the address and netmask of each of its cables' ends.  Two ends are
 * one cable when they are the only two ends in the job on their subnet (a
 * subnet per cable, as a /30 per port pair makes it).  Routes are shortest
 * paths, ties broken by the lowest host index (hosts sorted by id), so two
 * engines that agree on the graph agree on every route, and forwarding hop by
 * hop cannot loop.
 */
#ifndef TB_TOPOLOGY_H
#define TB_TOPOLOGY_H

#include <stdbool.h>
#include <stdint.h>

#define TB_TOPO_ID_SIZE 32
#define TB_TOPO_MAX_HOSTS 64
#define TB_TOPO_MAX_DEVS 16
#define TB_TOPO_NONE 0xffu

typedef struct tb_topo_dev {
    uint32_t ipv4; /* network byte order */
    uint32_t netmask;
} tb_topo_dev_t;

typedef struct tb_topo_host {
    uint8_t id[TB_TOPO_ID_SIZE];
    unsigned ndev;
    tb_topo_dev_t dev[TB_TOPO_MAX_DEVS];
} tb_topo_host_t;

typedef struct tb_topo {
    unsigned nhosts;
    tb_topo_host_t host[TB_TOPO_MAX_HOSTS];
    /* Host h's device d is a cable to host peer[h][d] (its device
     * peer_dev[h][d]), or TB_TOPO_NONE. */
    uint8_t peer[TB_TOPO_MAX_HOSTS][TB_TOPO_MAX_DEVS];
    uint8_t peer_dev[TB_TOPO_MAX_HOSTS][TB_TOPO_MAX_DEVS];
    /* Hops from a to b, TB_TOPO_NONE when no path joins them. */
    uint8_t dist[TB_TOPO_MAX_HOSTS][TB_TOPO_MAX_HOSTS];
    /* A digest of the hosts and their devices: two ends that route by host
     * index check they hold the same table. */
    uint32_t digest;
} tb_topo_t;

/* Build t from n hosts, sorted by id with no id twice (0), or -1 with *why:
 * too many hosts or devices, unsorted, or an address that is 0. */
int tb_topo_build(tb_topo_t *t, const tb_topo_host_t *hosts, unsigned n, const char **why);

/* The index of the host with id, or -1. */
int tb_topo_find(const tb_topo_t *t, const uint8_t *id);

/* Host a's lowest device whose cable leads to host b, or -1. */
int tb_topo_cable_to(const tb_topo_t *t, unsigned a, unsigned b);

/* The next host on the route from host a to host b (a != b), and in *dev the
 * device of a that leads there: the lowest of a's cables up to it.  -1 when
 * no route. */
int tb_topo_next_hop(const tb_topo_t *t, unsigned a, unsigned b, unsigned *dev);

/* The host from which traffic from a reaches b (the last hop of a's route to
 * b): a itself for neighbours; -1 when no route. */
int tb_topo_last_hop(const tb_topo_t *t, unsigned a, unsigned b);

/* The way round the cable of host x's device k when it fails: the shortest
 * path between its two hosts without it, from the one of lower index to the
 * other, each step to the lowest host one hop nearer (so every host computes
 * the same, and each direction takes the same hosts).  Its hosts in path
 * (room for TB_TOPO_MAX_HOSTS), their number returned: 2 when another cable
 * joins the two, 0 when no way is left. */
unsigned tb_topo_detour(const tb_topo_t *t, unsigned x, unsigned k, uint8_t *path);

#endif /* TB_TOPOLOGY_H */
