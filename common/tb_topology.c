/*
 * tbrdma transport: the job's cabling and its routes (tb_topology.h).
 */
#include "tb_topology.h"

#include <string.h>

static uint32_t subnet(const tb_topo_dev_t *d)
{
    return d->ipv4 & d->netmask;
}

/* The only other end on d's subnet in the whole job, or none: a subnet with
 * three ends or more names no cable. */
static void find_cable(tb_topo_t *t, unsigned h, unsigned d)
{
    const tb_topo_dev_t *me = &t->host[h].dev[d];
    unsigned found = 0, ph = 0, pd = 0;

    for (unsigned g = 0; g < t->nhosts; ++g) {
        for (unsigned k = 0; k < t->host[g].ndev; ++k) {
            const tb_topo_dev_t *o = &t->host[g].dev[k];
            if ((g == h && k == d) || o->netmask != me->netmask || subnet(o) != subnet(me)) {
                continue;
            }
            ++found;
            ph = g;
            pd = k;
        }
    }
    if (1 == found && ph != h) {
        t->peer[h][d] = (uint8_t) ph;
        t->peer_dev[h][d] = (uint8_t) pd;
    }
}

/* Breadth-first from every host (at most 64: a few thousand steps). */
static void compute_dist(tb_topo_t *t)
{
    uint8_t queue[TB_TOPO_MAX_HOSTS];

    memset(t->dist, TB_TOPO_NONE, sizeof(t->dist));
    for (unsigned s = 0; s < t->nhosts; ++s) {
        unsigned head = 0, tail = 0;
        t->dist[s][s] = 0;
        queue[tail++] = (uint8_t) s;
        while (head < tail) {
            unsigned u = queue[head++];
            for (unsigned d = 0; d < t->host[u].ndev; ++d) {
                unsigned v = t->peer[u][d];
                if (TB_TOPO_NONE != v && TB_TOPO_NONE == t->dist[s][v]) {
                    t->dist[s][v] = (uint8_t) (t->dist[s][u] + 1);
                    queue[tail++] = (uint8_t) v;
                }
            }
        }
    }
}

/* FNV-1a over what the routes depend on. */
static uint32_t digest(const tb_topo_t *t)
{
    uint32_t h = 2166136261u;
    const uint8_t *b;

    for (unsigned i = 0; i < t->nhosts; ++i) {
        const tb_topo_host_t *x = &t->host[i];
        for (unsigned k = 0; k < sizeof(x->id); ++k) {
            h = (h ^ x->id[k]) * 16777619u;
        }
        for (unsigned d = 0; d < x->ndev; ++d) {
            b = (const uint8_t *) &x->dev[d];
            for (unsigned k = 0; k < sizeof(x->dev[d]); ++k) {
                h = (h ^ b[k]) * 16777619u;
            }
        }
        h = (h ^ 0xffu) * 16777619u;
    }
    return h;
}

int tb_topo_build(tb_topo_t *t, const tb_topo_host_t *hosts, unsigned n, const char **why)
{
    memset(t, 0, sizeof(*t));
    if (0 == n || n > TB_TOPO_MAX_HOSTS) {
        *why = "no host, or more hosts than routes are kept for";
        return -1;
    }
    for (unsigned i = 0; i < n; ++i) {
        if (hosts[i].ndev > TB_TOPO_MAX_DEVS) {
            *why = "a host with more devices than a host may have";
            return -1;
        }
        if (i && memcmp(hosts[i - 1].id, hosts[i].id, TB_TOPO_ID_SIZE) >= 0) {
            *why = "hosts not sorted by id, or one host twice";
            return -1;
        }
        for (unsigned d = 0; d < hosts[i].ndev; ++d) {
            if (0 == hosts[i].dev[d].ipv4) {
                *why = "a device without an address";
                return -1;
            }
        }
    }
    t->nhosts = n;
    memcpy(t->host, hosts, n * sizeof(*hosts));
    memset(t->peer, TB_TOPO_NONE, sizeof(t->peer));
    memset(t->peer_dev, TB_TOPO_NONE, sizeof(t->peer_dev));
    for (unsigned h = 0; h < n; ++h) {
        for (unsigned d = 0; d < t->host[h].ndev; ++d) {
            find_cable(t, h, d);
        }
    }
    compute_dist(t);
    t->digest = digest(t);
    return 0;
}

int tb_topo_find(const tb_topo_t *t, const uint8_t *id)
{
    unsigned lo = 0, hi = t->nhosts;

    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        int c = memcmp(t->host[mid].id, id, TB_TOPO_ID_SIZE);
        if (0 == c) {
            return (int) mid;
        }
        if (c < 0) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return -1;
}

int tb_topo_cable_to(const tb_topo_t *t, unsigned a, unsigned b)
{
    for (unsigned d = 0; a < t->nhosts && d < t->host[a].ndev; ++d) {
        if (t->peer[a][d] == b) {
            return (int) d;
        }
    }
    return -1;
}

int tb_topo_next_hop(const tb_topo_t *t, unsigned a, unsigned b, unsigned *dev)
{
    unsigned want;

    if (a >= t->nhosts || b >= t->nhosts || a == b || TB_TOPO_NONE == t->dist[a][b]) {
        return -1;
    }
    want = t->dist[a][b] - 1u;
    /* The lowest neighbour one hop nearer, then a's lowest cable to it. */
    for (unsigned n = 0; n < t->nhosts; ++n) {
        int d = t->dist[n][b] == want ? tb_topo_cable_to(t, a, n) : -1;
        if (d >= 0) {
            *dev = (unsigned) d;
            return (int) n;
        }
    }
    return -1;
}

int tb_topo_last_hop(const tb_topo_t *t, unsigned a, unsigned b)
{
    unsigned at = a, prev = a, dev;
    int next;

    if (a >= t->nhosts || b >= t->nhosts || a == b) {
        return -1;
    }
    while (at != b) {
        next = tb_topo_next_hop(t, at, b, &dev);
        if (next < 0) {
            return -1;
        }
        prev = at;
        at = (unsigned) next;
    }
    return (int) prev;
}

/* Hops from every host to b with the cable of host x's device k taken out
 * (another cable between its two hosts still joins them). */
static void dist_without(const tb_topo_t *t, unsigned b, unsigned x, unsigned k, uint8_t *dist)
{
    unsigned y = t->peer[x][k], yk = t->peer_dev[x][k];
    uint8_t queue[TB_TOPO_MAX_HOSTS];
    unsigned head = 0, tail = 0;

    memset(dist, TB_TOPO_NONE, TB_TOPO_MAX_HOSTS);
    dist[b] = 0;
    queue[tail++] = (uint8_t) b;
    while (head < tail) {
        unsigned u = queue[head++];
        for (unsigned d = 0; d < t->host[u].ndev; ++d) {
            unsigned v = t->peer[u][d];
            if (TB_TOPO_NONE == v || TB_TOPO_NONE != dist[v] || (u == x && d == k)
                || (u == y && d == yk)) {
                continue;
            }
            dist[v] = (uint8_t) (dist[u] + 1);
            queue[tail++] = (uint8_t) v;
        }
    }
}

unsigned tb_topo_detour(const tb_topo_t *t, unsigned x, unsigned k, uint8_t *path)
{
    uint8_t dist[TB_TOPO_MAX_HOSTS];
    unsigned a, b, at, n = 0;

    if (x >= t->nhosts || k >= t->host[x].ndev || TB_TOPO_NONE == t->peer[x][k]) {
        return 0;
    }
    a = x < t->peer[x][k] ? x : t->peer[x][k];
    b = x < t->peer[x][k] ? t->peer[x][k] : x;
    dist_without(t, b, x, k, dist);
    if (TB_TOPO_NONE == dist[a]) {
        return 0;
    }
    /* From the lower end, each step to the lowest host one hop nearer over
     * any cable but the failed one. */
    path[n++] = (uint8_t) a;
    for (at = a; at != b;) {
        unsigned next = TB_TOPO_NONE;
        for (unsigned d = 0; d < t->host[at].ndev; ++d) {
            unsigned v = t->peer[at][d];
            if (TB_TOPO_NONE != v && !(at == x && d == k)
                && !(at == t->peer[x][k] && d == t->peer_dev[x][k])
                && dist[v] + 1u == dist[at] && v < next) {
                next = v;
            }
        }
        at = next;
        path[n++] = (uint8_t) at;
    }
    return n;
}
